//! The tiled dots the projections use give the bits of `dot_bf16`, for every length (tails
//! included) and on whichever path (AVX2+FMA or portable) this machine takes; and the dots and
//! sums of squares are the CUDA kernels' order (common.cuh `warp_dot`, `warp_sum_squares`),
//! checked against that order written out lane by lane.

use half::bf16;
use solder_model_layers::numerics::blocked_len;
use solder_model_layers::numerics::{
    dot_1x4, dot_4x1, dot_bf16, dot_bf16_lanes, dot_blocked, dot_blocked_1x4, dot_blocked_lanes,
    dot_f32_bf16, sum_squares_bf16, sum_squares_f32, sum_squares_f32_lanes, to_f32,
    transpose_blocks, Blocked,
};
use solder_model_layers::weights::SplitMix64;

fn random(rng: &mut SplitMix64, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| bf16::from_f32(rng.uniform() * 3.0))
        .collect()
}

#[test]
fn tiled_dots_equal_dot_bf16_bit_for_bit() {
    let mut rng = SplitMix64(42);
    for len in [
        1, 7, 15, 16, 17, 31, 32, 33, 64, 100, 255, 256, 1000, 1025, 2048, 2600,
    ] {
        let xs: Vec<Vec<bf16>> = (0..4).map(|_| random(&mut rng, len)).collect();
        let ws: Vec<Vec<bf16>> = (0..4).map(|_| random(&mut rng, len)).collect();
        let xf: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| x.iter().map(|v| to_f32(*v)).collect())
            .collect();
        let one = dot_1x4(&xf[0], [&ws[0], &ws[1], &ws[2], &ws[3]]);
        for c in 0..4 {
            assert_eq!(
                one[c].to_bits(),
                dot_bf16(&xs[0], &ws[c]).to_bits(),
                "1x4 len {len} col {c}"
            );
        }
        let four = dot_4x1([&xf[0], &xf[1], &xf[2], &xf[3]], &ws[0]);
        for r in 0..4 {
            assert_eq!(
                four[r].to_bits(),
                dot_bf16(&xs[r], &ws[0]).to_bits(),
                "4x1 len {len} row {r}"
            );
        }
    }
}

/// Rows stored a 128-element block at a time, transposed, the last padded with +0, give
/// `dot_bf16`'s bits, on the path this CPU takes and the portable one, at every length (a
/// partial last block, a whole 64-element half in it, several segments, a segment's partial
/// last block), 4×1 and 4×4; `Blocked::get` reads the row as it was.
#[test]
fn blocked_rows_dot_as_the_rows_they_were_made_from() {
    let mut rng = SplitMix64(7);
    for len in [
        1, 63, 64, 65, 100, 128, 192, 256, 576, 1000, 1024, 1100, 2048, 2600,
    ] {
        let xs: Vec<Vec<bf16>> = (0..4).map(|_| random(&mut rng, len)).collect();
        let w = random(&mut rng, len);
        let blocked = |v: &[bf16]| {
            let wide: Vec<f32> = v.iter().map(|b| to_f32(*b)).collect();
            let mut out = vec![f32::NAN; blocked_len(len)];
            transpose_blocks(&wide, &mut out);
            (wide, out)
        };
        let (xw, xt): (Vec<Vec<f32>>, Vec<Vec<f32>>) = xs.iter().map(|x| blocked(x)).unzip();
        let (ww, wt) = blocked(&w);
        for (i, v) in ww.iter().enumerate() {
            assert_eq!(
                Blocked::new(&wt, len).get(i).to_bits(),
                v.to_bits(),
                "len {len} get {i}"
            );
        }
        for (p, v) in wt.iter().enumerate() {
            // Stored at p: lane p % 16 of its block, element p / 16 % 8 of the lane's chunk.
            let i = p / 128 * 128 + p % 16 * 8 + p / 16 % 8;
            if i >= len {
                assert_eq!(v.to_bits(), 0, "len {len}: the padding at {p} is +0");
            }
        }
        if len >= 128 {
            assert_ne!(
                wt[..128],
                ww[..128],
                "len {len}: the first block stays as it was"
            );
        }
        let ws: Vec<Vec<bf16>> = (0..4).map(|_| random(&mut rng, len)).collect();
        let one = dot_blocked_1x4(Blocked::new(&xt[0], len), [&ws[0], &ws[1], &ws[2], &ws[3]]);
        for c in 0..4 {
            let want = dot_bf16(&xs[0], &ws[c]).to_bits();
            assert_eq!(one[c].to_bits(), want, "1x4 len {len} col {c}");
        }
        let x = [&xt[0][..], &xt[1], &xt[2], &xt[3]].map(|row| Blocked::new(row, len));
        // The input rows as weight rows too: a 4×4 tile of x against itself.
        let square = dot_blocked(x, x);
        for r in 0..4 {
            for c in 0..4 {
                let want = dot_bf16(&xs[r], &xs[c]).to_bits();
                assert_eq!(square[r][c].to_bits(), want, "4x4 len {len} ({r}, {c})");
            }
        }
        let fast = dot_blocked(x, [Blocked::new(&wt, len)]);
        let portable = dot_blocked_lanes(x, [Blocked::new(&wt, len)]);
        for r in 0..4 {
            let want = dot_bf16(&xs[r], &w).to_bits();
            assert_eq!(fast[r][0].to_bits(), want, "len {len} row {r}");
            assert_eq!(portable[r][0].to_bits(), want, "len {len} row {r} portable");
            assert_eq!(dot_f32_bf16(&xw[r], &w).to_bits(), want);
        }
    }
}

/// common.cuh `warp_dot` written out as the kernel runs it: 32 lanes, each a `dot8` per chunk
/// (8 fmas, zeros past k), then the butterfly (lane i adds lane i^m), segment sums folded.
fn warp_dot_model(x: &[bf16], w: &[bf16]) -> f32 {
    let k = x.len();
    let at = |v: &[bf16], i: usize| if i < k { to_f32(v[i]) } else { 0.0 };
    let mut total = 0.0f32;
    let mut seg = 0;
    while seg * 1024 < k {
        let mut lanes = [0.0f32; 32];
        for (lane, acc) in lanes.iter_mut().enumerate() {
            for j in 0..4 {
                let i0 = seg * 1024 + (j * 32 + lane) * 8;
                if i0 < k {
                    for i in i0..i0 + 8 {
                        *acc = at(x, i).mul_add(at(w, i), *acc);
                    }
                }
            }
        }
        for m in [16, 8, 4, 2, 1] {
            let old = lanes;
            for (l, v) in lanes.iter_mut().enumerate() {
                *v = old[l] + old[l ^ m];
            }
        }
        total = if seg == 0 { lanes[0] } else { total + lanes[0] };
        seg += 1;
    }
    total
}

/// common.cuh `warp_sum_squares`: lane l takes i = l, l + 32, ... with fma, then the butterfly.
fn warp_sum_squares_model(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 32];
    for (i, v) in x.iter().enumerate() {
        lanes[i % 32] = v.mul_add(*v, lanes[i % 32]);
    }
    for m in [16, 8, 4, 2, 1] {
        let old = lanes;
        for (l, v) in lanes.iter_mut().enumerate() {
            *v = old[l] + old[l ^ m];
        }
    }
    lanes[0]
}

const LENGTHS: [usize; 18] = [
    0, 1, 7, 8, 9, 63, 64, 65, 255, 256, 257, 1000, 1023, 1024, 1025, 2048, 2600, 4100,
];

#[test]
fn dots_are_the_cuda_warp_dot_order_on_every_path() {
    let mut rng = SplitMix64(7);
    for len in LENGTHS {
        let (x, w) = (random(&mut rng, len), random(&mut rng, len));
        let xf: Vec<f32> = x.iter().map(|v| to_f32(*v)).collect();
        let want = warp_dot_model(&x, &w).to_bits();
        assert_eq!(
            dot_bf16_lanes(&x, &w).to_bits(),
            want,
            "portable, len {len}"
        );
        assert_eq!(dot_bf16(&x, &w).to_bits(), want, "dispatched, len {len}");
        assert_eq!(dot_f32_bf16(&xf, &w).to_bits(), want, "f32 row, len {len}");
    }
}

#[test]
fn a_dot_of_negative_zero_products_ends_as_the_kernel_pads_it() {
    // -1 · +0 = -0 in every term: the fma chain stays -0 until a padded chunk adds +0.
    for len in [8, 16, 9, 3, 1024, 1027] {
        let x = vec![bf16::from_f32(-1.0); len];
        let w = vec![bf16::ZERO; len];
        let want = warp_dot_model(&x, &w).to_bits();
        assert_eq!(
            dot_bf16_lanes(&x, &w).to_bits(),
            want,
            "portable, len {len}"
        );
        assert_eq!(dot_bf16(&x, &w).to_bits(), want, "dispatched, len {len}");
    }
}

#[test]
fn sums_of_squares_are_the_cuda_order_on_every_path() {
    let mut rng = SplitMix64(9);
    for len in LENGTHS {
        let x = random(&mut rng, len);
        let xf: Vec<f32> = x.iter().map(|v| to_f32(*v) * 1.37).collect();
        let want = warp_sum_squares_model(&xf).to_bits();
        assert_eq!(
            sum_squares_f32_lanes(&xf).to_bits(),
            want,
            "portable, len {len}"
        );
        assert_eq!(
            sum_squares_f32(&xf).to_bits(),
            want,
            "dispatched, len {len}"
        );
        let widened: Vec<f32> = x.iter().map(|v| to_f32(*v)).collect();
        assert_eq!(
            sum_squares_bf16(&x).to_bits(),
            warp_sum_squares_model(&widened).to_bits(),
            "bf16, len {len}"
        );
    }
}

#[test]
fn the_order_shows_in_the_bits() {
    // A plain sequential sum rounds some of these otherwise: the tests above could not pass
    // with a different order by accident.
    let mut rng = SplitMix64(11);
    let differs = (0..64).any(|_| {
        let (x, w) = (random(&mut rng, 2600), random(&mut rng, 2600));
        let sequential = x
            .iter()
            .zip(&w)
            .fold(0.0f32, |acc, (a, b)| to_f32(*a).mul_add(to_f32(*b), acc));
        sequential.to_bits() != dot_bf16(&x, &w).to_bits()
    });
    assert!(differs);
}

/// Products too small for f32 leave every lane at −0; a lane with no chunk in a row's last,
/// partial block keeps its −0, as the kernel's lane skips that chunk, so every tiled dot is −0
/// as the definition is (at 264 lanes 1-7 of the first 8 have no chunk in the block at 256).
#[test]
fn lanes_past_the_row_keep_a_negative_zero() {
    for len in [264, 320, 1024 + 264] {
        let x = vec![bf16::from_f32(-1e-30); len];
        let w = vec![bf16::from_f32(1e-30); len];
        let want = dot_bf16_lanes(&x, &w);
        assert_eq!(
            want.to_bits(),
            (-0.0f32).to_bits(),
            "len {len}: the definition"
        );
        let xf: Vec<f32> = x.iter().map(|v| to_f32(*v)).collect();
        let mut xt = vec![f32::NAN; blocked_len(len)];
        transpose_blocks(&xf, &mut xt);
        let got = [
            ("dot_bf16", dot_bf16(&x, &w)),
            ("dot_f32_bf16", dot_f32_bf16(&xf, &w)),
            ("dot_1x4", dot_1x4(&xf, [&w; 4])[3]),
            ("dot_4x1", dot_4x1([&xf; 4], &w)[2]),
            (
                "dot_blocked_1x4",
                dot_blocked_1x4(Blocked::new(&xt, len), [&w; 4])[1],
            ),
        ];
        for (path, d) in got {
            assert_eq!(d.to_bits(), want.to_bits(), "{path} len {len}");
        }
    }
}
