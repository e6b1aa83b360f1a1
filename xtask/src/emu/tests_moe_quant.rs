//! The quantized expert entries (`moe::gate_up_silu_fp8`, `_int4`, `moe::down_fp8`, `_int4`)
//! under the host emulation: each CUDA kernel writes its twin's bytes (shadow mode) over fp8
//! block, channel and odd-block scales and int4 groups, at several row counts and top-k
//! routings, with k not a multiple of 128; and a kernel reading the wrong expert stride or the
//! wrong group's scale differs from the twin (the check can fail). The same for the tensor
//! cores' quantized expert entries (`gemm::experts_gate_up_silu_mma_fp8`, ...), whose picks
//! span several 64-pick tiles. The twins equal the bf16
//! twins on the dequantised experts (crates/model-layers/tests/twins_moe_quant.rs), so these
//! kernels give the bf16 kernels' bytes on the dequantised experts.

use half::bf16;
use solder_circuit::WeightFormat;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::gemm::{
    ExpertsDownMmaFp8, ExpertsDownMmaInt4, ExpertsGateUpSiluMmaFp8, ExpertsGateUpSiluMmaInt4,
    EXPERTS_DOWN_MMA_FP8, EXPERTS_DOWN_MMA_INT4, EXPERTS_GATE_UP_SILU_MMA_FP8,
    EXPERTS_GATE_UP_SILU_MMA_INT4,
};
use solder_model_layers::kernels::moe::{
    DownFp8, DownInt4, GateUpSiluFp8, GateUpSiluInt4, DOWN_FP8, DOWN_INT4, GATE_UP_SILU_FP8,
    GATE_UP_SILU_INT4,
};
use solder_model_layers::kernels::{Buf, Launch};

use super::tests::{emulated, run, upload};
use super::tests_mutation::{assert_caught, build_mutant, shadow};

/// Builds the emulation of the `moe` module with each `from` (which must occur exactly once, in
/// the unit or else in common.cuh) replaced by its `to`, into a fresh folder; returns the folder. (moe's unit carries its
/// source inline, rewritten for its dynamic shared memory, so the edits apply to the unit.)
fn build_moe_mutant(edits: &[(&str, &str)]) -> std::path::PathBuf {
    let root = crate::paths::workspace_root();
    let mut text = super::generate::unit(&root, "moe").unwrap().text;
    // An edit not in the unit applies to common.cuh, copied beside the unit (its `#include
    // "common.cuh"` finds the copy first).
    let mut common =
        std::fs::read_to_string(root.join(solder_kernels::CUDA_DIR).join("common.cuh")).unwrap();
    let mut common_edited = false;
    for (from, to) in edits {
        if text.matches(from).count() == 1 {
            text = text.replace(from, to);
        } else {
            assert_eq!(
                (text.matches(from).count(), common.matches(from).count()),
                (0, 1),
                "moe: `{from}` is once in neither moe's unit nor common.cuh"
            );
            common = common.replace(from, to);
            common_edited = true;
        }
    }
    let dir = std::env::temp_dir().join(format!("solder-emu-mutant-moeq-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    if common_edited {
        std::fs::write(dir.join("common.cuh"), common).unwrap();
    }
    let cpp = dir.join("moe.cpp");
    std::fs::write(&cpp, text).unwrap();
    let output = std::process::Command::new(super::CXX)
        .args(super::CXX_FLAGS)
        .arg("-I")
        .arg(root.join(super::generate::EMU_DIR))
        .arg("-I")
        .arg(root.join(solder_kernels::CUDA_DIR))
        .arg(&cpp)
        .arg("-o")
        .arg(solder_gpu_runtime::cpu::emu::library_path(&dir, "moe"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    dir
}

const EXPERTS: usize = 4;
const HIDDEN: usize = 200; // not a multiple of 128: partial blocks and groups
const INTER: usize = 72;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Blocks and groups that are multiples of 8 take the kernels' fast path (a chunk of 8 whole in
/// one block: one load, one scale); those of 20 and 36 the per-element path.
fn formats() -> [WeightFormat; 7] {
    [
        WeightFormat::Fp8 {
            block_n: 128,
            block_k: 128,
        },
        WeightFormat::Fp8 {
            block_n: 1,
            block_k: HIDDEN.max(INTER) as u32,
        },
        WeightFormat::Fp8 {
            block_n: 48,
            block_k: 24,
        },
        WeightFormat::Int4 { group: 128 },
        WeightFormat::Int4 { group: 32 },
        WeightFormat::Fp8 {
            block_n: 16,
            block_k: 20,
        },
        WeightFormat::Int4 { group: 36 },
    ]
}

/// A stack of random `[n, k]` matrices in `format` (any e4m3 but NaN; scales near 2^-6 with a
/// full mantissa; zeros 0..=15), padding 0xa5.
fn blob(rng: &mut Rng, format: WeightFormat, n: usize, k: usize) -> Vec<u8> {
    let layout = format.check(n, k).unwrap();
    let bytes = format.slot_bytes(&[EXPERTS, n, k]).unwrap();
    let mut blob = vec![0xa5u8; bytes.next_multiple_of(4)];
    for e in 0..EXPERTS {
        let m = &mut blob[e * layout.stride..e * layout.stride + layout.bytes];
        for v in &mut m[..layout.values] {
            let b = rng.below(256) as u8;
            *v = if b & 0x7f == 0x7f { 0x01 } else { b };
        }
        for s in 0..layout.scales {
            let scale = (1.5 + rng.unit() * 0.5) / 64.0;
            let at = layout.scales_offset + 4 * s;
            m[at..at + 4].copy_from_slice(&scale.to_le_bytes());
        }
        for z in 0..layout.zeros {
            m[layout.zeros_offset + z] = rng.below(16) as u8;
        }
    }
    blob
}

fn bf16s(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|_| bf16::from_f32(rng.unit()).to_le_bytes())
        .collect()
}

/// `k` distinct expert ids per row.
fn ids(rng: &mut Rng, rows: usize, k: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rows {
        let mut pool: Vec<i32> = (0..EXPERTS as i32).collect();
        for _ in 0..k {
            out.extend(pool.remove(rng.below(pool.len())).to_le_bytes());
        }
    }
    out
}

fn zeros(backend: &mut CpuBackend, bytes: usize) -> Buf {
    upload(backend, &vec![0u8; bytes])
}

/// The gate_up and down launches of `format` at (rows, k) on `backend`'s buffers.
fn launches(
    backend: &mut CpuBackend,
    seed: u64,
    format: WeightFormat,
    rows: usize,
    k: usize,
) -> [Launch; 2] {
    let mut rng = Rng(seed | 1);
    let x = upload(backend, &bf16s(&mut rng, rows * HIDDEN));
    let ids = upload(backend, &ids(&mut rng, rows, k));
    let weights: Vec<u8> = (0..rows * k)
        .flat_map(|_| rng.unit().to_le_bytes())
        .collect();
    let weights = upload(backend, &weights);
    let wg = upload(backend, &blob(&mut rng, format, INTER, HIDDEN));
    let wu = upload(backend, &blob(&mut rng, format, INTER, HIDDEN));
    let wd = upload(backend, &blob(&mut rng, format, HIDDEN, INTER));
    let act_in = upload(backend, &bf16s(&mut rng, rows * k * INTER));
    let act = zeros(backend, rows * k * INTER * 2);
    let out = zeros(backend, rows * HIDDEN * 2);
    let (r, h, i, e, kk) = (
        rows as u32,
        HIDDEN as u32,
        INTER as u32,
        EXPERTS as u32,
        k as u32,
    );
    match format {
        WeightFormat::Fp8 { block_n, block_k } => [
            GateUpSiluFp8 {
                x,
                ids,
                wg,
                wu,
                act,
                rows: r,
                hidden: h,
                inter: i,
                experts: e,
                k: kk,
                block_n,
                block_k,
            }
            .launch(GATE_UP_SILU_FP8),
            DownFp8 {
                act: act_in,
                ids,
                weights,
                wd,
                out,
                rows: r,
                hidden: h,
                inter: i,
                experts: e,
                k: kk,
                block_n,
                block_k,
            }
            .launch(DOWN_FP8),
        ],
        WeightFormat::Int4 { group } => [
            GateUpSiluInt4 {
                x,
                ids,
                wg,
                wu,
                act,
                rows: r,
                hidden: h,
                inter: i,
                experts: e,
                k: kk,
                group,
            }
            .launch(GATE_UP_SILU_INT4),
            DownInt4 {
                act: act_in,
                ids,
                weights,
                wd,
                out,
                rows: r,
                hidden: h,
                inter: i,
                experts: e,
                k: kk,
                group,
            }
            .launch(DOWN_INT4),
        ],
        WeightFormat::Bf16 => unreachable!(),
    }
}

/// The tensor cores' gate_up and down entries of `format` at (rows, k): act and the picks'
/// f32 dots.
fn mma_launches(
    backend: &mut CpuBackend,
    seed: u64,
    format: WeightFormat,
    rows: usize,
    k: usize,
) -> [(Launch, Buf); 2] {
    let mut rng = Rng(seed | 1);
    let x = upload(backend, &bf16s(&mut rng, rows * HIDDEN));
    let ids = upload(backend, &ids(&mut rng, rows, k));
    let wg = upload(backend, &blob(&mut rng, format, INTER, HIDDEN));
    let wu = upload(backend, &blob(&mut rng, format, INTER, HIDDEN));
    let wd = upload(backend, &blob(&mut rng, format, HIDDEN, INTER));
    let act_in = upload(backend, &bf16s(&mut rng, rows * k * INTER));
    mma_pair(backend, format, [x, ids, wg, wu, wd, act_in], rows, k)
}

/// The tensor cores' gate_up and down entries of `format` on x, ids, wg, wu, wd and the down's
/// act (`bufs`), at (rows, k), each with the output it writes (act, the picks' f32 dots).
fn mma_pair(
    backend: &mut CpuBackend,
    format: WeightFormat,
    bufs: [Buf; 6],
    rows: usize,
    k: usize,
) -> [(Launch, Buf); 2] {
    let [x, ids, wg, wu, wd, act_in] = bufs;
    let act = zeros(backend, rows * k * INTER * 2);
    let dots = zeros(backend, rows * k * HIDDEN * 4);
    let (rows, hidden, inter, experts, k) = (
        rows as u32,
        HIDDEN as u32,
        INTER as u32,
        EXPERTS as u32,
        k as u32,
    );
    let (gate_up, down) = match format {
        WeightFormat::Fp8 { block_n, block_k } => (
            ExpertsGateUpSiluMmaFp8 {
                x,
                ids,
                wg,
                wu,
                act,
                rows,
                hidden,
                inter,
                experts,
                k,
                block_n,
                block_k,
            }
            .launch(EXPERTS_GATE_UP_SILU_MMA_FP8),
            ExpertsDownMmaFp8 {
                act: act_in,
                ids,
                wd,
                dots,
                rows,
                hidden,
                inter,
                experts,
                k,
                block_n,
                block_k,
            }
            .launch(EXPERTS_DOWN_MMA_FP8),
        ),
        WeightFormat::Int4 { group } => (
            ExpertsGateUpSiluMmaInt4 {
                x,
                ids,
                wg,
                wu,
                act,
                rows,
                hidden,
                inter,
                experts,
                k,
                group,
            }
            .launch(EXPERTS_GATE_UP_SILU_MMA_INT4),
            ExpertsDownMmaInt4 {
                act: act_in,
                ids,
                wd,
                dots,
                rows,
                hidden,
                inter,
                experts,
                k,
                group,
            }
            .launch(EXPERTS_DOWN_MMA_INT4),
        ),
        WeightFormat::Bf16 => unreachable!(),
    };
    [(gate_up, act), (down, dots)]
}

/// Rows 70 with 4 picks each over 4 experts: 70 picks an expert, two 64-pick tiles; 96 and 128
/// rows of 2 random picks: more than 64 of an expert's picks still waiting at the last window
/// of ids (the gather once dropped those past the first tile).
#[test]
fn quantized_expert_mma_entries_equal_their_twins_across_tiles() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let mut launched = 0;
    for (fi, format) in formats().into_iter().enumerate() {
        for (rows, k) in [(1, 1), (70, 4), (96, 2), (128, 2)] {
            for (launch, _) in mma_launches(&mut backend, 90 + fi as u64, format, rows, k) {
                run(&mut backend, &launch);
                launched += 1;
            }
        }
    }
    let report = backend.emulation().unwrap().report();
    let mut seen = 0;
    for name in [
        EXPERTS_GATE_UP_SILU_MMA_FP8.as_str(),
        EXPERTS_GATE_UP_SILU_MMA_INT4.as_str(),
        EXPERTS_DOWN_MMA_FP8.as_str(),
        EXPERTS_DOWN_MMA_INT4.as_str(),
    ] {
        let k = &report[name];
        assert!(k.launches > 0, "{name}: never launched");
        assert_eq!(k.identical, k.launches, "{name}: {k:?}");
        seen += k.launches;
    }
    assert_eq!(seen, launched);
}

/// The tensor cores' entries read the expert stride through common.cuh's MoeFp8Matrix: read
/// 256 bytes early, the emulation check catches it.
#[test]
fn a_wrong_expert_stride_in_the_tensor_core_entries_differs_from_the_twin() {
    let dir = build_mutant(
        "gemm",
        &[(
            "(unsigned long long)e * stride(n, k_, block_n_, block_k_);",
            "(unsigned long long)e * (stride(n, k_, block_n_, block_k_) - 256ull);",
        )],
    );
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    for (launch, _) in mma_launches(&mut backend, 9, formats()[0], 3, 2) {
        assert_caught(&dir, "gemm", &mut backend, &launch);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn quantized_expert_entries_equal_their_twins_byte_for_byte() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let mut launched = 0;
    for (fi, format) in formats().into_iter().enumerate() {
        for (rows, k) in [(1, 1), (3, 2), (5, 4)] {
            for launch in launches(
                &mut backend,
                40 + fi as u64 * 7 + rows as u64,
                format,
                rows,
                k,
            ) {
                run(&mut backend, &launch);
                launched += 1;
            }
        }
    }
    let report = backend.emulation().unwrap().report();
    let mut seen = 0;
    for name in [
        "moe::gate_up_silu_fp8",
        "moe::gate_up_silu_int4",
        "moe::down_fp8",
        "moe::down_int4",
    ] {
        let k = report
            .get(name)
            .unwrap_or_else(|| panic!("{name}: never launched"));
        assert!(k.launches > 0, "{name}: never launched");
        assert_eq!(k.identical, k.launches, "{name}: {k:?}");
        seen += k.launches;
    }
    assert_eq!(seen, launched);
}

#[test]
fn a_wrong_expert_stride_or_group_scale_differs_from_the_twin() {
    // fp8: expert e read 256 bytes early; int4: the scale and zero of the group of i + 1 (per
    // element), of the chunk after it (a chunk whole in its group).
    let dir = build_moe_mutant(&[
        (
            "(unsigned long long)e * stride(n, k_, block_n_, block_k_);",
            "(unsigned long long)e * (stride(n, k_, block_n_, block_k_) - 256ull);",
        ),
        (
            "(unsigned long long)f * groups + i / group;",
            "(unsigned long long)f * groups + (i + 1u) / group;",
        ),
        (
            "(unsigned long long)f * groups + i0 / group;",
            "(unsigned long long)f * groups + (i0 + 8u) / group;",
        ),
    ]);
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    for format in [formats()[0], formats()[4], formats()[6]] {
        // Expert ids 1.. in every row: a wrong stride shows.
        let [gate_up, down] = launches(&mut backend, 9, format, 3, 2);
        for launch in [gate_up, down] {
            let (mutant, original) = shadow(&dir, "moe", &mut backend, &launch);
            assert_eq!(
                (mutant.launches, mutant.identical),
                (1, 0),
                "{}: {mutant:?}",
                launch.kernel
            );
            assert_eq!(
                (original.launches, original.identical),
                (1, 1),
                "{}: {original:?}",
                launch.kernel
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn quantized_experts_carry_nan_and_inf_as_their_twins() {
    // A NaN in x row 0 (gate_up), an e4m3 NaN code in expert 2's gate matrix, a +inf scale in
    // expert 1's down matrix, an inf pick weight: NaN and finite outputs both, the twin's bytes.
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let (rows, k) = (3usize, 2usize);
    for format in [formats()[0], formats()[3]] {
        let mut rng = Rng(77);
        let mut x = bf16s(&mut rng, rows * HIDDEN);
        x[2 * 5..2 * 6].copy_from_slice(&bf16::NAN.to_le_bytes());
        let x = upload(&mut backend, &x);
        let id_values: [i32; 6] = [0, 1, 2, 3, 1, 0];
        let ids: Vec<u8> = id_values.iter().flat_map(|i| i.to_le_bytes()).collect();
        let ids = upload(&mut backend, &ids);
        let weights: Vec<u8> = [0.5f32, 0.5, f32::INFINITY, 0.25, 0.6, 0.4]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let weights = upload(&mut backend, &weights);
        let gate_layout = format.check(INTER, HIDDEN).unwrap();
        let mut wg = blob(&mut rng, format, INTER, HIDDEN);
        if let WeightFormat::Fp8 { .. } = format {
            wg[2 * gate_layout.stride + 7 * HIDDEN + 3] = 0x7f;
        }
        let wg = upload(&mut backend, &wg);
        let wu = upload(&mut backend, &blob(&mut rng, format, INTER, HIDDEN));
        let down_layout = format.check(HIDDEN, INTER).unwrap();
        let mut wd = blob(&mut rng, format, HIDDEN, INTER);
        let at = down_layout.stride + down_layout.scales_offset;
        wd[at..at + 4].copy_from_slice(&f32::INFINITY.to_le_bytes());
        let wd = upload(&mut backend, &wd);
        let act_in = upload(&mut backend, &bf16s(&mut rng, rows * k * INTER));
        let act = zeros(&mut backend, rows * k * INTER * 2);
        let out = zeros(&mut backend, rows * HIDDEN * 2);
        let (r, h, i, e, kk) = (3u32, HIDDEN as u32, INTER as u32, EXPERTS as u32, 2u32);
        let pair = match format {
            WeightFormat::Fp8 { block_n, block_k } => [
                GateUpSiluFp8 {
                    x,
                    ids,
                    wg,
                    wu,
                    act,
                    rows: r,
                    hidden: h,
                    inter: i,
                    experts: e,
                    k: kk,
                    block_n,
                    block_k,
                }
                .launch(GATE_UP_SILU_FP8),
                DownFp8 {
                    act: act_in,
                    ids,
                    weights,
                    wd,
                    out,
                    rows: r,
                    hidden: h,
                    inter: i,
                    experts: e,
                    k: kk,
                    block_n,
                    block_k,
                }
                .launch(DOWN_FP8),
            ],
            WeightFormat::Int4 { group } => [
                GateUpSiluInt4 {
                    x,
                    ids,
                    wg,
                    wu,
                    act,
                    rows: r,
                    hidden: h,
                    inter: i,
                    experts: e,
                    k: kk,
                    group,
                }
                .launch(GATE_UP_SILU_INT4),
                DownInt4 {
                    act: act_in,
                    ids,
                    weights,
                    wd,
                    out,
                    rows: r,
                    hidden: h,
                    inter: i,
                    experts: e,
                    k: kk,
                    group,
                }
                .launch(DOWN_INT4),
            ],
            WeightFormat::Bf16 => unreachable!(),
        };
        for (launch, buf) in pair.iter().zip([act, out]) {
            run(&mut backend, launch);
            let bytes = super::tests::download(&mut backend, buf.ptr, buf.bytes);
            let nans = bytes
                .chunks_exact(2)
                .filter(|b| bf16::from_le_bytes([b[0], b[1]]).is_nan())
                .count();
            assert!(
                nans > 0 && nans < bytes.len() / 2,
                "{}: {nans} NaN of {}",
                launch.kernel,
                bytes.len() / 2
            );
        }
        // The tensor cores' entries on the same experts: act, and the picks' f32 dots (the
        // +inf scale makes expert 1's dots ±inf or NaN).
        let mma = mma_pair(&mut backend, format, [x, ids, wg, wu, wd, act_in], rows, k);
        for ((launch, buf), elem) in mma.iter().zip([2usize, 4]) {
            run(&mut backend, launch);
            let bytes = super::tests::download(&mut backend, buf.ptr, buf.bytes);
            let values: Vec<f32> = bytes
                .chunks_exact(elem)
                .map(|b| match elem {
                    2 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                    _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                })
                .collect();
            let odd = values.iter().filter(|v| !v.is_finite()).count();
            assert!(
                odd > 0 && odd < values.len(),
                "{}: {odd} not finite of {}",
                launch.kernel,
                values.len()
            );
        }
    }
    let report = backend.emulation().unwrap().report();
    for name in [
        "moe::gate_up_silu_fp8",
        "moe::gate_up_silu_int4",
        "moe::down_fp8",
        "moe::down_int4",
        EXPERTS_GATE_UP_SILU_MMA_FP8.as_str(),
        EXPERTS_GATE_UP_SILU_MMA_INT4.as_str(),
        EXPERTS_DOWN_MMA_FP8.as_str(),
        EXPERTS_DOWN_MMA_INT4.as_str(),
    ] {
        let k = &report[name];
        assert!(k.launches > 0 && k.identical == k.launches, "{name}: {k:?}");
    }
}
