//! The quantized gemv entries (`linear_fp8`, `linear_int4`, `lm_head_fp8`, `lm_head_int4`)
//! and their tensor-core counterparts (`gemm::linear_mma_fp8`, ...): the CUDA source,
//! dequantising in registers (gemv) or as a tile is staged (gemm), equals its twin (which
//! dequantises with `numerics::dequant` and runs the bf16 arithmetic) byte for byte, at every
//! row tile, at k and n off the blocks, groups and tiles, and a kernel reading the wrong scale
//! is caught.

use half::bf16;
use solder_circuit::WeightFormat;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::kernels::gemm::{
    LinearMmaFp8, LinearMmaInt4, LmHeadMmaFp8, LmHeadMmaInt4, LINEAR_MMA_FP8, LINEAR_MMA_FP8_LARGE,
    LINEAR_MMA_FP8_NARROW, LINEAR_MMA_INT4, LINEAR_MMA_INT4_LARGE, LINEAR_MMA_INT4_NARROW,
    LM_HEAD_MMA_FP8, LM_HEAD_MMA_FP8_LARGE, LM_HEAD_MMA_FP8_NARROW, LM_HEAD_MMA_INT4,
    LM_HEAD_MMA_INT4_LARGE, LM_HEAD_MMA_INT4_NARROW,
};
use solder_model_layers::kernels::gemv::{
    LinearFp8, LinearInt4, LmHeadFp8, LmHeadInt4, LINEAR_FP8, LINEAR_INT4, LM_HEAD_FP8,
    LM_HEAD_INT4,
};
use solder_model_layers::kernels::{Buf, Launch};
use solder_model_layers::numerics::dequant::{f32_to_e4m3, quantize_matrix};

use super::tests::{emulated, run, upload};
use super::tests_large::enlarged;
use super::tests_mutation::{build_mutant, shadow, values};
use super::tests_narrow::narrowed;

/// Seeded values in [-1, 1), with a spread of magnitudes (so blocks get different scales).
pub(super) fn matrix(n: usize, k: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..n * k)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            v * [0.02, 1.0, 0.3, 4.0][(i / 40) % 4]
        })
        .collect()
}

/// Which kernels a test launches: gemv's quantized entries or the tensor cores'.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Family {
    Gemv,
    Mma,
}

/// The launch of the quantized linear (`logits` false) or LM head entry of `format`.
fn launch(
    format: WeightFormat,
    (x, w, bias, out): (Buf, Buf, Option<Buf>, Buf),
    (rows, k, n): (u32, u32, u32),
    logits: bool,
) -> Launch {
    launch_of(
        Family::Gemv,
        format,
        (x, w, bias, out),
        (rows, k, n),
        logits,
    )
}

/// `launch` of `family`'s entry.
fn launch_of(
    family: Family,
    format: WeightFormat,
    (x, w, bias, out): (Buf, Buf, Option<Buf>, Buf),
    (rows, k, n): (u32, u32, u32),
    logits: bool,
) -> Launch {
    if family == Family::Mma {
        return mma_launch(format, (x, w, bias, out), (rows, k, n), logits);
    }
    match (format, logits) {
        (WeightFormat::Fp8 { block_n, block_k }, false) => LinearFp8 {
            x,
            w,
            bias,
            y: out,
            rows,
            k,
            n_out: n,
            block_n,
            block_k,
        }
        .launch(LINEAR_FP8),
        (WeightFormat::Int4 { group }, false) => LinearInt4 {
            x,
            w,
            bias,
            y: out,
            rows,
            k,
            n_out: n,
            group,
        }
        .launch(LINEAR_INT4),
        (WeightFormat::Fp8 { block_n, block_k }, true) => LmHeadFp8 {
            x,
            w,
            logits: out,
            want: None,
            rows,
            k,
            vocab: n,
            block_n,
            block_k,
        }
        .launch(LM_HEAD_FP8),
        (WeightFormat::Int4 { group }, true) => LmHeadInt4 {
            x,
            w,
            logits: out,
            want: None,
            rows,
            k,
            vocab: n,
            group,
        }
        .launch(LM_HEAD_INT4),
        (WeightFormat::Bf16, _) => unreachable!("a quantized format"),
    }
}

/// The tensor-core entry of `format` (`launch`'s arguments).
fn mma_launch(
    format: WeightFormat,
    (x, w, bias, out): (Buf, Buf, Option<Buf>, Buf),
    (rows, k, n): (u32, u32, u32),
    logits: bool,
) -> Launch {
    match (format, logits) {
        (WeightFormat::Fp8 { block_n, block_k }, false) => LinearMmaFp8 {
            x,
            w,
            bias,
            y: out,
            rows,
            k,
            n_out: n,
            block_n,
            block_k,
        }
        .launch(LINEAR_MMA_FP8),
        (WeightFormat::Int4 { group }, false) => LinearMmaInt4 {
            x,
            w,
            bias,
            y: out,
            rows,
            k,
            n_out: n,
            group,
        }
        .launch(LINEAR_MMA_INT4),
        (WeightFormat::Fp8 { block_n, block_k }, true) => LmHeadMmaFp8 {
            x,
            w,
            logits: out,
            want: None,
            rows,
            k,
            vocab: n,
            block_n,
            block_k,
        }
        .launch(LM_HEAD_MMA_FP8),
        (WeightFormat::Int4 { group }, true) => LmHeadMmaInt4 {
            x,
            w,
            logits: out,
            want: None,
            rows,
            k,
            vocab: n,
            group,
        }
        .launch(LM_HEAD_MMA_INT4),
        (WeightFormat::Bf16, _) => unreachable!("a quantized format"),
    }
}

/// Uploads a quantized `n × k` matrix and `rows` inputs, and launches the entry.
fn quantized_launch(
    backend: &mut CpuBackend,
    format: WeightFormat,
    (rows, k, n): (u32, u32, u32),
    logits: bool,
    seed: u64,
) -> Launch {
    quantized_launch_of(Family::Gemv, backend, format, (rows, k, n), logits, seed)
}

/// `quantized_launch` of `family`'s entry.
fn quantized_launch_of(
    family: Family,
    backend: &mut CpuBackend,
    format: WeightFormat,
    (rows, k, n): (u32, u32, u32),
    logits: bool,
    seed: u64,
) -> Launch {
    let blob = quantize_matrix(
        format,
        &matrix(n as usize, k as usize, seed),
        n as usize,
        k as usize,
    );
    let w = upload(backend, &blob);
    let x = upload(backend, &values(rows * k, seed ^ 0x5555));
    let bias = (!logits).then(|| upload(backend, &values(n, seed ^ 0xaaaa)));
    let bytes = (rows * n) as usize * if logits { 4 } else { 2 };
    let out = Buf::new(backend.alloc(bytes).unwrap(), bytes);
    launch_of(family, format, (x, w, bias, out), (rows, k, n), logits)
}

#[test]
fn quantized_gemv_entries_equal_their_twins_at_every_row_tile() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let formats = [
        WeightFormat::Fp8 {
            block_n: 128,
            block_k: 128,
        },
        WeightFormat::Fp8 {
            block_n: 3,
            block_k: 40,
        },
        WeightFormat::Fp8 {
            block_n: 1,
            block_k: 300,
        },
        WeightFormat::Int4 { group: 128 },
        WeightFormat::Int4 { group: 25 },
    ];
    // k = 300: partial 8-chunks, blocks and groups; 1100: two dot segments. n = 37: a partial
    // feature block. Rows 1, 2, 4, 8 and 11 (two row groups).
    let mut launches = 0u64;
    for (k, n) in [(300u32, 37u32), (1100, 9)] {
        for format in formats {
            let format = match format {
                WeightFormat::Fp8 {
                    block_n: 1,
                    block_k: _,
                } => WeightFormat::Fp8 {
                    block_n: 1,
                    block_k: k,
                },
                other => other,
            };
            for rows in [1u32, 2, 4, 8, 11] {
                for logits in [false, true] {
                    let seed = 0x9e37_79b9 ^ (rows as u64) << 20 ^ k as u64;
                    let l = quantized_launch(&mut backend, format, (rows, k, n), logits, seed);
                    run(&mut backend, &l);
                    launches += 1;
                }
            }
        }
    }
    let report = backend.emulation().unwrap().report();
    let mut seen = 0u64;
    let entries = [
        LINEAR_FP8.as_str(),
        LINEAR_INT4.as_str(),
        LM_HEAD_FP8.as_str(),
        LM_HEAD_INT4.as_str(),
    ];
    for entry in entries {
        let parity = &report[entry];
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
        seen += parity.launches;
    }
    assert_eq!(seen, launches);
}

/// The tensor-core entries: k = 300 (a partial k tile of 64, partial 8-chunks, blocks and
/// groups off the tile; three 128-k stages of a `_narrow` entry, the last partial), n = 37 (a
/// partial 32-feature tile), rows 1, 5, 17 (a narrow entry's second pass of 16) and 70 (a
/// partial and a second 64-row tile), each through the wide entry, its `_narrow` variant
/// (lever `mma_narrow`) and its `_large` one (lever `mma_large`: one partial 128-row tile).
#[test]
fn quantized_mma_entries_equal_their_twins_across_tiles() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let formats = [
        WeightFormat::Fp8 {
            block_n: 128,
            block_k: 128,
        },
        WeightFormat::Fp8 {
            block_n: 3,
            block_k: 40,
        },
        WeightFormat::Int4 { group: 128 },
        WeightFormat::Int4 { group: 25 },
    ];
    let (k, n) = (300u32, 37u32);
    let mut launches = 0u64;
    for format in formats {
        for rows in [1u32, 5, 17, 70] {
            for logits in [false, true] {
                let seed = 0x7f4a_7c15 ^ (rows as u64) << 20;
                let l = quantized_launch_of(
                    Family::Mma,
                    &mut backend,
                    format,
                    (rows, k, n),
                    logits,
                    seed,
                );
                run(&mut backend, &l);
                run(&mut backend, &narrowed(&l));
                run(&mut backend, &enlarged(&l));
                launches += 3;
            }
        }
    }
    let report = backend.emulation().unwrap().report();
    let mut seen = 0u64;
    for entry in [
        LINEAR_MMA_FP8.as_str(),
        LINEAR_MMA_FP8_NARROW.as_str(),
        LINEAR_MMA_INT4.as_str(),
        LINEAR_MMA_INT4_NARROW.as_str(),
        LM_HEAD_MMA_FP8.as_str(),
        LM_HEAD_MMA_FP8_NARROW.as_str(),
        LM_HEAD_MMA_INT4.as_str(),
        LM_HEAD_MMA_INT4_NARROW.as_str(),
        LINEAR_MMA_FP8_LARGE.as_str(),
        LINEAR_MMA_INT4_LARGE.as_str(),
        LM_HEAD_MMA_FP8_LARGE.as_str(),
        LM_HEAD_MMA_INT4_LARGE.as_str(),
    ] {
        let parity = &report[entry];
        assert!(parity.launches > 0, "{entry} not run");
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
        seen += parity.launches;
    }
    assert_eq!(seen, launches);
}

#[test]
fn e4m3_codes_decode_as_the_twin_does_for_every_code() {
    // One row holding every finite e4m3 code (subnormals, ±0, both signs) with scale 1: the
    // kernel's integer decode against the twin's, element by element.
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let codes: Vec<u8> = (0u8..=255).filter(|c| c & 0x7f != 0x7f).collect();
    let k = codes.len() as u32;
    let format = WeightFormat::Fp8 {
        block_n: 1,
        block_k: k,
    };
    let layout = format.check(1, k as usize).unwrap();
    let mut blob = vec![0u8; layout.bytes];
    blob[..codes.len()].copy_from_slice(&codes);
    blob[layout.scales_offset..layout.scales_offset + 4].copy_from_slice(&1f32.to_le_bytes());
    assert_eq!(f32_to_e4m3(1.0), 0x38);
    let w = upload(&mut backend, &blob);
    // One launch per code: x one-hot at it, so the logit is that code's value alone.
    for probe in 0..k {
        let x: Vec<u8> = (0..k)
            .flat_map(|i| bf16::from_f32(if i == probe { 1.0 } else { 0.0 }).to_le_bytes())
            .collect();
        let x = upload(&mut backend, &x);
        let out = Buf::new(backend.alloc(4).unwrap(), 4);
        let l = launch(format, (x, w, None, out), (1, k, 1), true);
        run(&mut backend, &l);
    }
    let parity = &backend.emulation().unwrap().report()[LM_HEAD_FP8.as_str()];
    assert_eq!(
        (parity.launches, parity.identical),
        (k as u64, k as u64),
        "{parity:?}"
    );
}

#[test]
fn a_quantized_kernel_reading_the_next_scale_differs_from_the_twin() {
    // Each weight takes the scale of the element after it (the per-element path), each chunk
    // whole in a block or group the scale of the chunk after it (the fast path): wrong only at
    // a block's (group's) last element or chunk, which the emulation check must catch, in
    // gemv's entries and in the tensor cores' (both dequantise through common.cuh's rows).
    // Blocks and groups of 64 and 32 take the fast path, of 60 and 36 the per-element one.
    let edits = [
        (
            "scales[(i0 + e) / block_k]",
            "scales[(i0 + e + 1u) / block_k]",
        ),
        ("scales[i / group]", "scales[(i + 1u) / group]"),
        ("scales[i0 / block_k]", "scales[(i0 + 8u) / block_k]"),
        (
            "const unsigned g = i0 / group;",
            "const unsigned g = (i0 + 8u) / group;",
        ),
    ];
    for (family, module) in [(Family::Gemv, "gemv"), (Family::Mma, "gemm")] {
        let dir = build_mutant(module, &edits);
        for format in [
            WeightFormat::Fp8 {
                block_n: 2,
                block_k: 64,
            },
            WeightFormat::Fp8 {
                block_n: 2,
                block_k: 60,
            },
            WeightFormat::Int4 { group: 32 },
            WeightFormat::Int4 { group: 36 },
        ] {
            let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
            let l = quantized_launch_of(family, &mut backend, format, (2, 256, 16), false, 77);
            let (mutant, original) = shadow(&dir, module, &mut backend, &l);
            assert_eq!(
                (mutant.launches, mutant.identical),
                (1, 0),
                "{module} {format}: {mutant:?}"
            );
            assert_eq!(
                (original.launches, original.identical),
                (1, 1),
                "{module} {format}: {original:?}"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
