//! The fused tensor-core kernels' quantized entries (`gemm::qkv_mma_fp8`, `_int4`,
//! `gemm::gate_up_silu_mma_fp8`, `_int4`) under the host emulation: each CUDA kernel writes its
//! twin's bytes (shadow mode) with every weight in its own blocks or group (q's fp8 blocks not
//! k's, a per-tensor block, int4 groups off the k tile), at one row, a partial row tile and two
//! row tiles, features off the 32-feature tiles; and a kernel that reads one projection with
//! another's parameters differs from the twin (the check can fail). The twins run the bf16
//! twins on the dequantised matrices, which are `linear_mma_fp8`'s and `linear_mma_int4`'s
//! bytes (crates/model-layers/src/kernels/gemm/fused/quant.rs).

use solder_circuit::{MatrixLayout, WeightFormat};
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::kernels::gemm::{
    GateUpSiluMmaFp8, GateUpSiluMmaInt4, QkvMmaFp8, QkvMmaInt4, GATE_UP_SILU_MMA_FP8,
    GATE_UP_SILU_MMA_FP8_LARGE, GATE_UP_SILU_MMA_FP8_NARROW, GATE_UP_SILU_MMA_INT4,
    GATE_UP_SILU_MMA_INT4_LARGE, GATE_UP_SILU_MMA_INT4_NARROW, QKV_MMA_FP8, QKV_MMA_FP8_LARGE,
    QKV_MMA_INT4, QKV_MMA_INT4_LARGE,
};
use solder_model_layers::kernels::{Buf, Launch};
use solder_model_layers::numerics::dequant::quantize_matrix;

use super::tests::{arg_buf, bf16_nans, emulated, run, upload};
use super::tests_large::{enlarged, enlarged_over};
use super::tests_mutation::{build_mutant, shadow, values};
use super::tests_nan::{bf16_bytes, rows_of};
use super::tests_narrow::narrowed;
use super::tests_quant::matrix;

/// k off the 64-wide k tile and off 8-element chunks of the blocks and groups; q's features over
/// three 32-feature tiles (the last partial), k's and v's over two.
const K: u32 = 300;
const NQ: u32 = 70;
const NKV: u32 = 37;

/// A quantized `n × k` matrix of seeded values, uploaded.
fn weight(backend: &mut CpuBackend, format: WeightFormat, (n, k): (u32, u32), seed: u64) -> Buf {
    let values = matrix(n as usize, k as usize, seed);
    upload(
        backend,
        &quantize_matrix(format, &values, n as usize, k as usize),
    )
}

fn output(backend: &mut CpuBackend, elements: u32) -> Buf {
    let bytes = elements as usize * 2;
    Buf::new(backend.alloc(bytes).unwrap(), bytes)
}

/// The fp8 blocks of q, k and v: 128 × 128, 3 × 40 and one block of the whole matrix
/// (compressed-tensors' per-tensor scale).
fn fp8_formats() -> [WeightFormat; 3] {
    let fp8 = |block_n, block_k| WeightFormat::Fp8 { block_n, block_k };
    [fp8(128, 128), fp8(3, 40), fp8(NKV, K)]
}

fn int4_formats() -> [WeightFormat; 3] {
    [128, 25, 32].map(|group| WeightFormat::Int4 { group })
}

/// The qkv entry of `formats` (one kind) over `rows` seeded rows, biases on q and v only.
fn qkv_launch(
    backend: &mut CpuBackend,
    formats: [WeightFormat; 3],
    rows: u32,
    seed: u64,
) -> Launch {
    let x = upload(backend, &values(rows * K, seed));
    let w = [(0, NQ), (1, NKV), (2, NKV)]
        .map(|(i, n)| weight(backend, formats[i], (n, K), seed ^ (i as u64 + 1) << 8));
    qkv_launch_on(backend, formats, (x, w), rows, seed)
}

/// The qkv entry of `formats` on x (`rows` × K) and the blobs `w` of q, k and v.
fn qkv_launch_on(
    backend: &mut CpuBackend,
    formats: [WeightFormat; 3],
    (x, [wq, wk, wv]): (Buf, [Buf; 3]),
    rows: u32,
    seed: u64,
) -> Launch {
    let bq = Some(upload(backend, &values(NQ, seed ^ 0xb0)));
    let bv = Some(upload(backend, &values(NKV, seed ^ 0xb2)));
    let (q, k_out, v) = (
        output(backend, rows * NQ),
        output(backend, rows * NKV),
        output(backend, rows * NKV),
    );
    match formats {
        [WeightFormat::Fp8 {
            block_n: q_block_n,
            block_k: q_block_k,
        }, WeightFormat::Fp8 {
            block_n: k_block_n,
            block_k: k_block_k,
        }, WeightFormat::Fp8 {
            block_n: v_block_n,
            block_k: v_block_k,
        }] => QkvMmaFp8 {
            x,
            wq,
            bq,
            wk,
            bk: None,
            wv,
            bv,
            q,
            k_out,
            v,
            rows,
            k: K,
            nq: NQ,
            nkv: NKV,
            q_block_n,
            q_block_k,
            k_block_n,
            k_block_k,
            v_block_n,
            v_block_k,
        }
        .launch(QKV_MMA_FP8),
        [WeightFormat::Int4 { group: q_group }, WeightFormat::Int4 { group: k_group }, WeightFormat::Int4 { group: v_group }] => {
            QkvMmaInt4 {
                x,
                wq,
                bq,
                wk,
                bk: None,
                wv,
                bv,
                q,
                k_out,
                v,
                rows,
                k: K,
                nq: NQ,
                nkv: NKV,
                q_group,
                k_group,
                v_group,
            }
            .launch(QKV_MMA_INT4)
        }
        other => panic!("one quantized kind, not {other:?}"),
    }
}

/// The gate/up entry of `formats` (one kind) over `rows` seeded rows, `inter` = NKV.
fn gate_up_launch(
    backend: &mut CpuBackend,
    formats: [WeightFormat; 2],
    rows: u32,
    seed: u64,
) -> Launch {
    let x = upload(backend, &values(rows * K, seed));
    let w = [0, 1].map(|i| weight(backend, formats[i], (NKV, K), seed ^ (i as u64 + 1) << 8));
    gate_up_launch_on(backend, formats, (x, w), rows)
}

/// The gate/up entry of `formats` on x (`rows` × K) and the blobs `w` of gate and up.
fn gate_up_launch_on(
    backend: &mut CpuBackend,
    formats: [WeightFormat; 2],
    (x, [wg, wu]): (Buf, [Buf; 2]),
    rows: u32,
) -> Launch {
    let act = output(backend, rows * NKV);
    match formats {
        [WeightFormat::Fp8 {
            block_n: g_block_n,
            block_k: g_block_k,
        }, WeightFormat::Fp8 {
            block_n: u_block_n,
            block_k: u_block_k,
        }] => GateUpSiluMmaFp8 {
            x,
            wg,
            wu,
            act,
            rows,
            k: K,
            inter: NKV,
            g_block_n,
            g_block_k,
            u_block_n,
            u_block_k,
        }
        .launch(GATE_UP_SILU_MMA_FP8),
        [WeightFormat::Int4 { group: g_group }, WeightFormat::Int4 { group: u_group }] => {
            GateUpSiluMmaInt4 {
                x,
                wg,
                wu,
                act,
                rows,
                k: K,
                inter: NKV,
                g_group,
                u_group,
            }
            .launch(GATE_UP_SILU_MMA_INT4)
        }
        other => panic!("one quantized kind, not {other:?}"),
    }
}

#[test]
fn fused_quantized_mma_entries_equal_their_twins_across_tiles() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let [f0, f1, f2] = fp8_formats();
    let [i0, i1, _] = int4_formats();
    let mut launches = 0u64;
    for rows in [1u32, 5, 17, 70] {
        let seed = 0x51ed_2701 ^ (rows as u64) << 20;
        // Each also through its `_large` entry (q's 70 features two blocks of 64, k's and v's
        // 37 one each).
        for formats in [fp8_formats(), int4_formats()] {
            let l = qkv_launch(&mut backend, formats, rows, seed);
            run(&mut backend, &l);
            run(&mut backend, &enlarged_over(&l, &[NQ, NKV, NKV]));
            launches += 2;
        }
        // Gate and up in other blocks or groups of their own: a channel scale (1 × k) beside a
        // per-tensor one, and two int4 groups.
        let channel = WeightFormat::Fp8 {
            block_n: 1,
            block_k: K,
        };
        // Each also through its `_narrow` entry (lever `mma_narrow`: passes of 16 rows, stages
        // of 128 k, so K's 300 in three, the last partial) and its `_large` one (lever
        // `mma_large`: one 128-row tile).
        for formats in [[f0, f1], [channel, f2], [i0, i1]] {
            let l = gate_up_launch(&mut backend, formats, rows, seed);
            run(&mut backend, &l);
            run(&mut backend, &narrowed(&l));
            run(&mut backend, &enlarged(&l));
            launches += 3;
        }
    }
    let report = backend.emulation().unwrap().report();
    let mut seen = 0u64;
    for entry in [
        QKV_MMA_FP8.as_str(),
        QKV_MMA_INT4.as_str(),
        GATE_UP_SILU_MMA_FP8.as_str(),
        GATE_UP_SILU_MMA_INT4.as_str(),
        GATE_UP_SILU_MMA_FP8_NARROW.as_str(),
        GATE_UP_SILU_MMA_INT4_NARROW.as_str(),
        GATE_UP_SILU_MMA_FP8_LARGE.as_str(),
        GATE_UP_SILU_MMA_INT4_LARGE.as_str(),
        QKV_MMA_FP8_LARGE.as_str(),
        QKV_MMA_INT4_LARGE.as_str(),
    ] {
        let parity = &report[entry];
        assert!(parity.launches > 0, "{entry} not run");
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
        seen += parity.launches;
    }
    assert_eq!(seen, launches);
}

#[test]
fn a_fused_quantized_kernel_reading_another_projections_blocks_differs_from_the_twin() {
    // v read with k's fp8 blocks, up with gate's int4 group: each projection's own parameters
    // must reach its tiles.
    let edits = [
        (
            "{WFp8{wv, nkv, v_block_n, v_block_k}}};\n    const bf16* const bias[3] = {bq, bk, bv};\n    bf16* const out[3]",
            "{WFp8{wv, nkv, k_block_n, k_block_k}}};\n    const bf16* const bias[3] = {bq, bk, bv};\n    bf16* const out[3]",
        ),
        ("{WInt4{wu, inter, u_group}}", "{WInt4{wu, inter, g_group}}"),
    ];
    let dir = build_mutant("gemm", &edits);
    let launches: [fn(&mut CpuBackend) -> Launch; 2] = [
        |b| qkv_launch(b, fp8_formats(), 5, 91),
        |b| {
            let [gate, up, _] = int4_formats();
            gate_up_launch(b, [gate, up], 5, 92)
        },
    ];
    for make in launches {
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
        let l = make(&mut backend);
        let (mutant, original) = shadow(&dir, "gemm", &mut backend, &l);
        assert_eq!(
            (mutant.launches, mutant.identical),
            (1, 0),
            "{}: {mutant:?}",
            l.kernel
        );
        assert_eq!(
            (original.launches, original.identical),
            (1, 1),
            "{}: {original:?}",
            l.kernel
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// x's row 1 poisoned (NaN, ±inf); in the weights, fp8 NaN codes (0x7f) in q's feature row 3
/// and gate's row 2, an infinite scale over v's first block (int4: k's and up's first group of
/// feature row 5, whose q − z of 0 makes 0·inf a NaN). Every entry writes its twin's bytes, and
/// each output holds NaN and finite values both (the check is not vacuous).
#[test]
fn fused_quantized_entries_carry_nan_and_inf_as_their_twins() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let rows = 3u32;
    let x = upload(
        &mut backend,
        &bf16_bytes(&rows_of(rows as usize, K as usize, 1.0, &[1])),
    );
    let blob = |format: WeightFormat, n: u32, seed: f32| {
        let clean = rows_of(n as usize, K as usize, seed, &[]);
        let blob = quantize_matrix(format, &clean, n as usize, K as usize);
        let layout = format.check(n as usize, K as usize).unwrap();
        (blob, layout)
    };
    let nan_codes = |(mut b, l): (Vec<u8>, MatrixLayout), row: usize| {
        for i in [0usize, 7, 299] {
            b[row * K as usize + i] = 0x7f;
        }
        (b, l)
    };
    let inf_scale = |(mut b, l): (Vec<u8>, MatrixLayout), scale: usize| {
        let at = l.scales_offset + scale * 4;
        b[at..at + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
        (b, l)
    };
    let mut up = |(b, _): (Vec<u8>, MatrixLayout)| upload(&mut backend, &b);
    let [f0, f1, f2] = fp8_formats();
    let [i0, i1, i2] = int4_formats();
    // int4 feature row 5's first group: index 5 · ⌈K / group⌉.
    let row5 = |group: u32| 5 * K.div_ceil(group) as usize;
    let fp8_qkv = [
        up(nan_codes(blob(f0, NQ, 2.0), 3)),
        up(blob(f1, NKV, 3.0)),
        up(inf_scale(blob(f2, NKV, 4.0), 0)),
    ];
    let int4_qkv = [
        up(blob(i0, NQ, 2.0)),
        up(inf_scale(blob(i1, NKV, 3.0), row5(25))),
        up(blob(i2, NKV, 4.0)),
    ];
    let fp8_gate_up = [up(nan_codes(blob(f0, NKV, 5.0), 2)), up(blob(f1, NKV, 6.0))];
    let int4_gate_up = [
        up(blob(i0, NKV, 5.0)),
        up(inf_scale(blob(i1, NKV, 6.0), row5(25))),
    ];
    let mut outputs: Vec<(&str, Buf)> = Vec::new();
    for (formats, w) in [(fp8_formats(), fp8_qkv), (int4_formats(), int4_qkv)] {
        let l = qkv_launch_on(&mut backend, formats, (x, w), rows, 7);
        run(&mut backend, &l);
        // q, k_out and v: the launch's outputs (arguments 7, 8 and 9).
        for arg in &l.args[7..10] {
            outputs.push((l.kernel, arg_buf(arg)));
        }
    }
    for (formats, w) in [([f0, f1], fp8_gate_up), ([i0, i1], int4_gate_up)] {
        let l = gate_up_launch_on(&mut backend, formats, (x, w), rows);
        run(&mut backend, &l);
        outputs.push((l.kernel, arg_buf(&l.args[3])));
    }
    for (kernel, buf) in outputs {
        let (nan, all) = bf16_nans(&mut backend, buf);
        assert!(
            nan > 0,
            "{kernel}: no NaN in an output, the test is vacuous"
        );
        assert!(
            nan < all,
            "{kernel}: every output is NaN, the clean rows are not"
        );
    }
    let report = backend.emulation().unwrap().report();
    for entry in [
        QKV_MMA_FP8.as_str(),
        QKV_MMA_INT4.as_str(),
        GATE_UP_SILU_MMA_FP8.as_str(),
        GATE_UP_SILU_MMA_INT4.as_str(),
    ] {
        let parity = &report[entry];
        assert_eq!(
            (parity.launches, parity.identical),
            (1, 1),
            "{entry}: {parity:?}"
        );
    }
}
