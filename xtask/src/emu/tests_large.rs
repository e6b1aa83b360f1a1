//! The `_large` entries of the tensor-core projections (gemm.cu `gemm_large`, lever
//! `mma_large`: tiles of 128 rows × 64 features, eight warps of 32 × 32) through the host
//! emulation of their CUDA source: the bf16 ones equal to their twins, and to the entries they
//! stand in for, byte for byte, in their own grid (`gemm::large_grid`), with one row block and
//! several (the last partial), k under one tile, off every tile and off 8 (the scalar staging),
//! feature blocks cut short, a bias, and an LM head whose `want` flags skip rows (a block of
//! none of them stages nothing). `enlarged` gives a launch through its `_large` entry, which
//! the quantized tests (`tests_quant`, `tests_fused_quant`) run beside each wide launch.

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::LaunchConfig;
use solder_model_layers::kernels::gemm::{
    large_grid, GateUpSiluMma, LinearMma, LmHeadMma, GATE_UP_SILU_MMA, GATE_UP_SILU_MMA_LARGE,
    GEMM_LARGE_THREADS, LARGE_VARIANTS, LINEAR_MMA, LINEAR_MMA_LARGE, LM_HEAD_MMA,
    LM_HEAD_MMA_LARGE,
};
use solder_model_layers::kernels::Launch;

use super::tests::{download, emulated, run, upload};
use super::tests_mutation::{build_mutant, shadow, values};

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
    let (mutant, original) = shadow(&dir, "gemm", &mut backend, &l);
    assert_eq!((mutant.launches, mutant.identical), (1, 0), "{mutant:?}");
    assert_eq!(
        (original.launches, original.identical),
        (1, 1),
        "{original:?}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
