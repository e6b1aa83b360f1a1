use super::*;

/// The 4×4 tile from every build of `blocked_tile` this CPU runs, and the dispatch.
fn every_build(x: [Blocked<'_>; 4], w: [Blocked<'_>; 4]) -> Vec<(&'static str, [[f32; 4]; 4])> {
    let mut got = vec![("portable", blocked_tile(x, w))];
    #[cfg(target_arch = "x86_64")]
    {
        if avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked).
            got.push(("avx2", unsafe { blocked_tile_avx2(x, w) }));
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked).
            got.push(("avx512", unsafe { blocked_tile_avx512(x, w) }));
        }
    }
    got.push(("dispatch", dot_blocked(x, w)));
    got
}

/// Every build of `blocked_tile` this CPU runs (portable, AVX2, AVX-512) gives
/// `dot_blocked_lanes`' bits, 4×4 and 1×4 and 4×1, at lengths with a partial segment, a
/// whole 64-element block past the last 128-element one (576, 1000), and no whole block.
#[test]
fn every_build_of_the_blocked_tile_gives_the_definitions_bits() {
    let mut seed = 0x9e37_79b9u32;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        to_f32(bf16::from_f32((seed % 2001) as f32 / 1000.0 - 1.0))
    };
    for len in [5, 64, 100, 128, 192, 576, 1000, 1024, 1100, 2048, 2600] {
        let rows: Vec<Vec<f32>> = (0..8)
            .map(|_| {
                let wide: Vec<f32> = (0..len).map(|_| next()).collect();
                let mut out = vec![f32::NAN; blocked_len(len)];
                transpose_blocks(&wide, &mut out);
                out
            })
            .collect();
        let x = [0, 1, 2, 3].map(|r| Blocked::new(&rows[r], len));
        let w = [4, 5, 6, 7].map(|r| Blocked::new(&rows[r], len));
        let want = dot_blocked_lanes(x, w);
        let got = every_build(x, w);
        let one_by_four = dot_blocked([x[2]], w)[0];
        let four_by_one = dot_blocked(x, [w[1]]);
        for (path, d) in got {
            for r in 0..4 {
                for c in 0..4 {
                    let bits = want[r][c].to_bits();
                    assert_eq!(d[r][c].to_bits(), bits, "{path} len {len} ({r}, {c})");
                }
            }
        }
        for c in 0..4 {
            assert_eq!(
                one_by_four[c].to_bits(),
                want[2][c].to_bits(),
                "1x4 len {len}"
            );
        }
        for r in 0..4 {
            assert_eq!(
                four_by_one[r][0].to_bits(),
                want[r][1].to_bits(),
                "4x1 len {len}"
            );
        }
    }
}

/// Products too small for f32 leave every lane at −0; a lane with no chunk in the row's
/// last, partial block keeps its −0 (the kernel skips that chunk), so the dot is −0 on
/// every build, as the definition's. At 320 the second half of the first half warp's
/// lanes has no chunk in the partial block at 256.
#[test]
fn a_lane_with_no_chunk_in_the_partial_block_keeps_its_negative_zero() {
    for len in [320, 1024 + 320, 264] {
        let wide = |v: f32| vec![to_f32(bf16::from_f32(v)); len];
        let blocked = |row: Vec<f32>| {
            let mut out = vec![f32::NAN; blocked_len(len)];
            transpose_blocks(&row, &mut out);
            out
        };
        let (xr, wr) = (blocked(wide(-1e-30)), blocked(wide(1e-30)));
        let (x, w) = ([Blocked::new(&xr, len); 4], [Blocked::new(&wr, len); 4]);
        let want = dot_blocked_lanes(x, w)[0][0];
        assert_eq!(
            want.to_bits(),
            (-0.0f32).to_bits(),
            "len {len}: the definition"
        );
        let got = every_build(x, w);
        for (path, d) in got {
            assert_eq!(d[3][2].to_bits(), want.to_bits(), "{path} len {len}");
        }
    }
}
