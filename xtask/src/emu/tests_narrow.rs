//! The `_narrow` entries of the bf16 tensor-core projections (gemm.cu `gemm_narrow`, lever
//! `mma_narrow`: 16 rows a pass, a warp per 8 features, k 256 a stage) through the host
//! emulation of their CUDA source: equal to their twins, and to the wide entries they stand in
//! for, byte for byte, at decode widths and past them (rows in several passes), with k under
//! one stage, past one stage and off every tile (the last stage ends mid-stage; k % 8 != 0, so
//! the scalar staging), feature blocks cut short, a bias, and an LM head whose `want` flags
//! skip rows. `narrowed` gives a launch through its `_narrow` entry, which the quantized tests
//! (`tests_quant`, `tests_fused_quant`; stages of 128 k) run beside each wide launch.

use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::gemm::{
    GateUpSiluMma, LinearMma, LinearPairMma, LmHeadMma, GATE_UP_SILU_MMA, GATE_UP_SILU_MMA_NARROW,
    LINEAR_MMA, LINEAR_MMA_NARROW, LINEAR_PAIR_MMA, LINEAR_PAIR_MMA_NARROW, LM_HEAD_MMA,
    LM_HEAD_MMA_NARROW,
};
use solder_model_layers::kernels::{Buf, Launch};

use super::tests::{download, emulated, run, upload};
use super::tests_mutation::values;

/// `wide` through its `_narrow` entry (the variant `gemm::narrow_variants` pairs with its kernel;
/// one of a kernel without qk-norm layouts): the same arguments and configuration.
pub(super) fn narrowed(wide: &Launch) -> Launch {
    let (entry, _) = solder_model_layers::kernels::gemm::narrow_variants()
        .find(|(_, kernel)| *kernel == wide.kernel)
        .unwrap_or_else(|| panic!("{} has no _narrow entry", wide.kernel));
    Launch {
        kernel: entry,
        ..wide.clone()
    }
}

/// A fresh output of `bytes`, filled with a marker (so an unwritten byte shows).
fn fresh(backend: &mut CpuBackend, bytes: u32) -> Buf {
    upload(backend, &vec![0x5a; bytes as usize])
}

/// The four kernels at (rows, k, n): each as (wide launch, narrow launch, their outputs).
fn launches(
    backend: &mut CpuBackend,
    (rows, k, n): (u32, u32, u32),
    seed: u64,
) -> Vec<(Launch, Launch, [Buf; 2])> {
    let x = upload(backend, &values(rows * k, seed));
    let w = upload(backend, &values(n * k, seed ^ 0x11));
    let w2 = upload(backend, &values((n + 9) * k, seed ^ 0x22));
    let w3 = upload(backend, &values(n * k, seed ^ 0x44));
    let bias = upload(backend, &values(n, seed ^ 0x33));
    let want: Vec<u8> = (0..rows)
        .flat_map(|r| i32::from(r % 3 != 1).to_le_bytes())
        .collect();
    let want = upload(backend, &want);
    let mut out = Vec::new();

    let [y_wide, y_narrow] = [0; 2].map(|_| fresh(backend, rows * n * 2));
    let linear = |y| LinearMma {
        x,
        w,
        bias: Some(bias),
        y,
        rows,
        k,
        n_out: n,
    };
    out.push((
        linear(y_wide).launch(LINEAR_MMA),
        linear(y_narrow).launch(LINEAR_MMA_NARROW),
        [y_wide, y_narrow],
    ));

    let [l_wide, l_narrow] = [0; 2].map(|_| fresh(backend, rows * n * 4));
    let head = |logits| LmHeadMma {
        x,
        w,
        logits,
        want: Some(want),
        rows,
        k,
        vocab: n,
    };
    out.push((
        head(l_wide).launch(LM_HEAD_MMA),
        head(l_narrow).launch(LM_HEAD_MMA_NARROW),
        [l_wide, l_narrow],
    ));

    let [a_wide, a_narrow] = [0; 2].map(|_| fresh(backend, rows * n * 2));
    let gate_up = |act| GateUpSiluMma {
        x,
        wg: w,
        wu: w3,
        act,
        rows,
        k,
        inter: n,
    };
    out.push((
        gate_up(a_wide).launch(GATE_UP_SILU_MMA),
        gate_up(a_narrow).launch(GATE_UP_SILU_MMA_NARROW),
        [a_wide, a_narrow],
    ));

    // The pair's outputs side by side in one buffer each: y1 (n) then y2 (n + 9).
    let pair_bytes = rows * (2 * n + 9) * 2;
    let [p_wide, p_narrow] = [0; 2].map(|_| fresh(backend, pair_bytes));
    let pair = |p: Buf| {
        let split = (rows * n * 2) as usize;
        LinearPairMma {
            x,
            w1: w,
            b1: Some(bias),
            w2,
            b2: None,
            y1: Buf::new(p.ptr, split),
            y2: Buf::new(p.ptr.offset(split), p.bytes - split),
            rows,
            k,
            n1: n,
            n2: n + 9,
        }
    };
    out.push((
        pair(p_wide).launch(LINEAR_PAIR_MMA),
        pair(p_narrow).launch(LINEAR_PAIR_MMA_NARROW),
        [p_wide, p_narrow],
    ));
    out
}

#[test]
fn narrow_entries_write_the_bytes_of_the_wide_ones() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // (rows, k, n): one row, one 64-k tile; k under one stage, off 8 (scalar staging), n off
    // 32; a full 16-row pass with k past one stage ending mid-tile; 17 rows (a second pass of
    // one row) over two whole stages; 40 rows (three passes, the last partial), k ending in
    // the last stage's first tile.
    let shapes = [
        (1u32, 64u32, 32u32),
        (3, 100, 45),
        (16, 300, 64),
        (17, 512, 33),
        (40, 530, 40),
    ];
    let mut pairs = 0;
    for (i, shape) in shapes.into_iter().enumerate() {
        for (wide, narrow, [a, b]) in launches(&mut backend, shape, 0x7777 + i as u64) {
            run(&mut backend, &wide);
            run(&mut backend, &narrow);
            let (a, b) = (
                download(&mut backend, a.ptr, a.bytes),
                download(&mut backend, b.ptr, b.bytes),
            );
            assert!(
                a.chunks_exact(2).any(|c| c != [0x5a; 2]),
                "{shape:?} {}: nothing written",
                wide.kernel
            );
            assert!(a == b, "{shape:?}: {} and {}", wide.kernel, narrow.kernel);
            pairs += 1;
        }
    }
    assert_eq!(pairs, 4 * shapes.len());
    let report = backend.emulation().unwrap().report();
    for entry in [
        LINEAR_MMA_NARROW.as_str(),
        LM_HEAD_MMA_NARROW.as_str(),
        GATE_UP_SILU_MMA_NARROW.as_str(),
        LINEAR_PAIR_MMA_NARROW.as_str(),
    ] {
        let parity = &report[entry];
        assert_eq!(parity.launches, shapes.len() as u64, "{entry}: {parity:?}");
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
    }
}
