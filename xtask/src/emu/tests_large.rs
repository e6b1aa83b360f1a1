//! The `_large` entries of the tensor-core projections (gemm.cu `gemm_large`, lever
//! `mma_large`: tiles of 128 rows × 64 features, eight warps of 32 × 32) through the host
//! emulation of their CUDA source: the bf16 ones equal to their twins, and to the entries they
//! stand in for, byte for byte, in their own grid (`gemm::large_grid`), with one row block and
//! several (the last partial), k under one tile, off every tile and off 8 (the scalar staging),
//! feature blocks cut short, a bias, and an LM head whose `want` flags skip rows (a block of
//! none of them stages nothing); the launches of several matrices (`qkv_mma_large`,
//! `linear_pair_mma_large`) with each matrix ending mid-block, and their `_pipe` entries (lever
//! `mma_pipe`; the single projections' are `tests_pipe`'s). `enlarged` (`enlarged_over` for
//! several matrices) gives a launch through its `_large` entry, which the quantized tests
//! (`tests_quant`, `tests_fused_quant`) run beside each wide launch.

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::LaunchConfig;
use solder_model_layers::kernels::gemm::{
    large_grid, large_grid_of, pipe_of, GateUpSiluMma, LinearMma, LinearPairMma, LmHeadMma, QkvMma,
    GATE_UP_SILU_MMA, GATE_UP_SILU_MMA_LARGE, GEMM_LARGE_THREADS, LARGE_VARIANTS, LINEAR_MMA,
    LINEAR_MMA_LARGE, LINEAR_PAIR_MMA, LINEAR_PAIR_MMA_LARGE, LINEAR_PAIR_MMA_PIPE, LM_HEAD_MMA,
    LM_HEAD_MMA_LARGE, QKV_MMA, QKV_MMA_LARGE, QKV_MMA_PIPE,
};
use solder_model_layers::kernels::{Buf, Launch};

use super::tests::{download, emulated, run, upload};
use super::tests_mutation::{assert_caught, build_mutant, values};

/// `wide` through its `_large` entry (`gemm::LARGE_VARIANTS` pairs it with its kernel): the
/// same arguments, in the large grid, which halves each of the wide grid's dimensions (rows in
/// blocks of 128 for 64, features of 64 for 32), rounding up.
pub(super) fn enlarged(wide: &Launch) -> Launch {
    let (entry, _) = LARGE_VARIANTS
        .iter()
        .find(|(_, kernel)| *kernel == wide.kernel)
        .unwrap_or_else(|| panic!("{} has no _large entry", wide.kernel));
    let [rows, features, _] = wide.config.grid;
    Launch {
        kernel: entry,
        config: LaunchConfig {
            grid: [rows.div_ceil(2), features.div_ceil(2), 1],
            block: [GEMM_LARGE_THREADS, 1, 1],
            shared_bytes: 0,
        },
        args: wide.args.clone(),
    }
}

/// `enlarged` for a launch over several matrices of `features` outputs each (q, k and v's, or a
/// pair's): its large grid lays each matrix's blocks of 64 after the previous one's
/// (`gemm::large_grid_of`), which halving the wide grid does not give.
pub(super) fn enlarged_over(wide: &Launch, features: &[u32]) -> Launch {
    let mut large = enlarged(wide);
    large.config.grid[1] = large_grid_of(features, 1).grid[1];
    large
}

#[test]
fn large_entries_write_the_bytes_of_the_wide_ones() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // (rows, k, n): one row (a block of 127 absent rows), one 64-k tile; k off 8 and under two
    // tiles, n off 64, two row blocks (the second of two rows); one whole block; three row
    // blocks (the last partial), k ending mid-tile, three feature blocks (the last of two).
    let shapes = [
        (1u32, 64u32, 32u32),
        (130, 100, 70),
        (128, 192, 64),
        (300, 530, 130),
    ];
    let mut pairs = 0;
    for (i, (rows, k, n)) in shapes.into_iter().enumerate() {
        let seed = 0x4242 + i as u64;
        let x = upload(&mut backend, &values(rows * k, seed));
        let w = upload(&mut backend, &values(n * k, seed ^ 0x11));
        let w2 = upload(&mut backend, &values(n * k, seed ^ 0x22));
        let bias = upload(&mut backend, &values(n, seed ^ 0x33));
        let fresh = |backend: &mut _| upload(backend, &vec![0x5a; (rows * n * 2) as usize]);
        let [y, y_large, a, a_large] = [0; 4].map(|_| fresh(&mut backend));
        let linear = |y| LinearMma {
            x,
            w,
            bias: Some(bias),
            y,
            rows,
            k,
            n_out: n,
        };
        let gate_up = |act| GateUpSiluMma {
            x,
            wg: w,
            wu: w2,
            act,
            rows,
            k,
            inter: n,
        };
        // Logits f32, so twice the bytes; rows 1 and 2 of every 3 wanted, and none of the
        // second row block's of the 300-row shape (it returns before staging anything).
        let [l, l_large] =
            [0; 2].map(|_| upload(&mut backend, &vec![0x5a; (rows * n * 4) as usize]));
        let want: Vec<u8> = (0..rows)
            .flat_map(|r| i32::from(r % 3 != 0 && !(128..256).contains(&r)).to_le_bytes())
            .collect();
        let want = upload(&mut backend, &want);
        let head = |logits| LmHeadMma {
            x,
            w,
            logits,
            want: Some(want),
            rows,
            k,
            vocab: n,
        };
        let config = large_grid(n, rows);
        assert_eq!(enlarged(&linear(y).launch(LINEAR_MMA)).config, config);
        for (wide, large, [p, q]) in [
            (
                linear(y).launch(LINEAR_MMA),
                linear(y_large).launch_with(LINEAR_MMA_LARGE, config),
                [y, y_large],
            ),
            (
                gate_up(a).launch(GATE_UP_SILU_MMA),
                gate_up(a_large).launch_with(GATE_UP_SILU_MMA_LARGE, config),
                [a, a_large],
            ),
            (
                head(l).launch(LM_HEAD_MMA),
                head(l_large).launch_with(LM_HEAD_MMA_LARGE, config),
                [l, l_large],
            ),
        ] {
            run(&mut backend, &wide);
            run(&mut backend, &large);
            let (p, q) = (
                download(&mut backend, p.ptr, p.bytes),
                download(&mut backend, q.ptr, q.bytes),
            );
            // Every output written (a bf16, or an f32 logit), but the logits of rows not
            // wanted (left as they were).
            let head = large.kernel == LM_HEAD_MMA_LARGE.as_str();
            let size = if head { 4 } else { 2 };
            let written = (q.chunks_exact(size))
                .filter(|c| c.iter().any(|&b| b != 0x5a))
                .count();
            let wanted = (0..rows)
                .filter(|r| r % 3 != 0 && !(128..256).contains(r))
                .count();
            let expected = if head { wanted } else { rows as usize } * n as usize;
            assert_eq!(written, expected, "({rows}, {k}, {n}) {}", large.kernel);
            assert!(
                p == q,
                "({rows}, {k}, {n}): {} and {}",
                wide.kernel,
                large.kernel
            );
            pairs += 1;
        }
    }
    assert_eq!(pairs, 3 * shapes.len());
    let report = backend.emulation().unwrap().report();
    for entry in [
        LINEAR_MMA_LARGE.as_str(),
        GATE_UP_SILU_MMA_LARGE.as_str(),
        LM_HEAD_MMA_LARGE.as_str(),
    ] {
        let parity = &report[entry];
        assert_eq!(parity.launches, shapes.len() as u64, "{entry}: {parity:?}");
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
    }
}

#[test]
fn a_large_tile_whose_warps_overlap_their_columns_differs_from_the_twin() {
    // The second four warps start at column 16, not 32: they compute features 16-47 of the
    // block and store them as 32-63.
    let dir = build_mutant(
        "gemm",
        &[(
            "const unsigned wc = (warp / 4u) * 32u; // its first column",
            "const unsigned wc = (warp / 4u) * 16u; // its first column",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let (rows, k, n) = (130u32, 64u32, 64u32);
    let x = upload(&mut backend, &values(rows * k, 5));
    let w = upload(&mut backend, &values(n * k, 6));
    let y = upload(&mut backend, &vec![0u8; (rows * n * 2) as usize]);
    let l = LinearMma {
        x,
        w,
        bias: None,
        y,
        rows,
        k,
        n_out: n,
    }
    .launch_with(LINEAR_MMA_LARGE, large_grid(n, rows));
    assert_caught(&dir, "gemm", &mut backend, &l);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn large_and_pipe_entries_of_several_matrices_write_the_bytes_of_the_wide_ones() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // (rows, k, [nq, nkv] or [n1, n2]): every matrix ends mid-block of 64, so a block holds
    // features of one matrix only and the next matrix's blocks start on their own; one row, a
    // second row block of two rows, a third partial one; k under a tile, off 8, off a tile.
    let shapes = [
        (1u32, 64u32, [96u32, 40u32]),
        (130, 100, [70, 8]),
        (300, 530, [200, 33]),
    ];
    for (i, (rows, k, [n1, n2])) in shapes.into_iter().enumerate() {
        let seed = 0x7a11 + i as u64;
        let x = upload(&mut backend, &values(rows * k, seed));
        // q, k, v, then the pair's two: each its own values.
        let w = [(n1, 1u64), (n2, 2), (n2, 3), (n1, 4), (n2, 5)]
            .map(|(n, j)| upload(&mut backend, &values(n * k, seed ^ j << 12)));
        let b = [n1, n2].map(|n| upload(&mut backend, &values(n, seed ^ 0xb1a5 ^ u64::from(n))));
        let mut fresh = |n: u32| upload(&mut backend, &vec![0x5a; (rows * n * 2) as usize]);
        let qkv = |[q, k_out, v]: [Buf; 3]| QkvMma {
            x,
            wq: w[0],
            bq: Some(b[0]),
            wk: w[1],
            bk: None,
            wv: w[2],
            bv: Some(b[1]),
            q,
            k_out,
            v,
            rows,
            k,
            nq: n1,
            nkv: n2,
        };
        let pair = |[y1, y2]: [Buf; 2]| LinearPairMma {
            x,
            w1: w[3],
            b1: None,
            w2: w[4],
            b2: Some(b[1]),
            y1,
            y2,
            rows,
            k,
            n1,
            n2,
        };
        // The wide launch's outputs, the `_large` one's and (lever `mma_pipe`) its `_pipe`
        // entry's.
        let outs = [[n1, n2, n2]; 3].map(|ns| ns.map(&mut fresh));
        let pairs = [[n1, n2]; 3].map(|ns| ns.map(&mut fresh));
        let qkv_grid = large_grid_of(&[n1, n2, n2], rows);
        let pair_grid = large_grid_of(&[n1, n2], rows);
        let wide_qkv = qkv(outs[0]).launch(QKV_MMA);
        assert_eq!(enlarged_over(&wide_qkv, &[n1, n2, n2]).config, qkv_grid);
        let (qkv_pipe, qkv_pipe_grid) = pipe_of(QKV_MMA_LARGE, qkv_grid).unwrap();
        let (pair_pipe, pair_pipe_grid) = pipe_of(LINEAR_PAIR_MMA_LARGE, pair_grid).unwrap();
        for (launches, written) in [
            (
                [
                    wide_qkv,
                    qkv(outs[1]).launch_with(QKV_MMA_LARGE, qkv_grid),
                    qkv(outs[2]).launch_with(qkv_pipe, qkv_pipe_grid),
                ],
                outs.map(|o| o.to_vec()),
            ),
            (
                [
                    pair(pairs[0]).launch(LINEAR_PAIR_MMA),
                    pair(pairs[1]).launch_with(LINEAR_PAIR_MMA_LARGE, pair_grid),
                    pair(pairs[2]).launch_with(pair_pipe, pair_pipe_grid),
                ],
                pairs.map(|o| o.to_vec()),
            ),
        ] {
            for l in &launches {
                run(&mut backend, l);
            }
            for (tile, outputs) in launches.iter().zip(&written).skip(1) {
                for (p, q) in written[0].iter().zip(outputs) {
                    let (p, q) = (
                        download(&mut backend, p.ptr, p.bytes),
                        download(&mut backend, q.ptr, q.bytes),
                    );
                    let untouched = q.chunks_exact(2).filter(|c| c == &[0x5a, 0x5a]).count();
                    assert_eq!(untouched, 0, "({rows}, {k}, {n1}, {n2}) {}", tile.kernel);
                    assert!(
                        p == q,
                        "({rows}, {k}, {n1}, {n2}): {} and {}",
                        launches[0].kernel,
                        tile.kernel
                    );
                }
            }
        }
    }
    let report = backend.emulation().unwrap().report();
    for entry in [
        QKV_MMA_LARGE.as_str(),
        LINEAR_PAIR_MMA_LARGE.as_str(),
        QKV_MMA_PIPE.as_str(),
        LINEAR_PAIR_MMA_PIPE.as_str(),
    ] {
        let parity = &report[entry];
        assert_eq!(parity.launches, shapes.len() as u64, "{entry}: {parity:?}");
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
    }
}

#[test]
fn a_large_pair_whose_blocks_are_counted_in_32s_differs_from_the_twin() {
    // The first matrix's blocks counted in 32s, as the 64 × 32 tiles count them: the grid's
    // last block (the second matrix's) takes features 128-191 of the first, past its end, so
    // the second matrix is never written.
    let dir = build_mutant(
        "gemm",
        &[(
            "constexpr unsigned bn = LARGE ? GEMM_LARGE_BN : GEMM_BN;",
            "constexpr unsigned bn = GEMM_BN;",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    let (rows, k, n1, n2) = (130u32, 64u32, 128u32, 64u32);
    let x = upload(&mut backend, &values(rows * k, 7));
    let w1 = upload(&mut backend, &values(n1 * k, 8));
    let w2 = upload(&mut backend, &values(n2 * k, 9));
    let y1 = upload(&mut backend, &vec![0u8; (rows * n1 * 2) as usize]);
    let y2 = upload(&mut backend, &vec![0u8; (rows * n2 * 2) as usize]);
    let l = LinearPairMma {
        x,
        w1,
        b1: None,
        w2,
        b2: None,
        y1,
        y2,
        rows,
        k,
        n1,
        n2,
    }
    .launch_with(LINEAR_PAIR_MMA_LARGE, large_grid_of(&[n1, n2], rows));
    assert_caught(&dir, "gemm", &mut backend, &l);
    std::fs::remove_dir_all(&dir).ok();
}
