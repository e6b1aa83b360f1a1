//! The LM head's want-logits flags (the step's `MetaField::WantLogits`) through the host
//! emulation of the CUDA sources. Every LM head entry — gemv's classic and streaming bodies, its
//! fused add-norm head, its fp8 and int4 entries, and the tensor cores' bf16, fp8 and int4
//! entries — stores each flagged row exactly as a launch without flags does, leaves every
//! other row's bytes as they were, and equals its twin (shadow mode). Among the flag patterns:
//! row groups and 64-row blocks with no flagged row (the blocks that return early), none at
//! all, and every row.

use solder_circuit::WeightFormat;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::kernels::gemm::{
    LmHeadMma, LmHeadMmaFp8, LmHeadMmaInt4, LM_HEAD_MMA, LM_HEAD_MMA_FP8, LM_HEAD_MMA_INT4,
};
use solder_model_layers::kernels::gemv::{
    stream_config, AddNormLmHead, LmHead, LmHeadFp8, LmHeadInt4, RowTile, ADD_NORM_LM_HEAD,
    ADD_NORM_LM_HEAD_STREAM, LM_HEAD, LM_HEAD_FP8, LM_HEAD_INT4, LM_HEAD_STREAM,
};
use solder_model_layers::kernels::{Buf, Launch};
use solder_model_layers::numerics::dequant::quantize_matrix;

use super::tests::{download, emulated, f32_values, run, upload};
use super::tests_mutation::values;
use super::tests_quant::matrix;

/// What a row the LM head skips must still hold afterwards.
const SENTINEL: u8 = 0xa5;

/// An output buffer of `bytes`, every byte `SENTINEL`.
fn sentinel(backend: &mut CpuBackend, bytes: usize) -> Buf {
    upload(backend, &vec![SENTINEL; bytes])
}

/// The flag patterns tried over `rows` rows (each row's i32 flag).
fn patterns(rows: usize) -> Vec<Vec<i32>> {
    let only = |r: usize| (0..rows).map(|i| i32::from(i == r)).collect::<Vec<_>>();
    vec![
        only(0),
        only(rows - 1),
        // Every third row: some row groups keep one row, some none.
        (0..rows).map(|i| i32::from(i % 3 == 1)).collect(),
        vec![0; rows],
        vec![1; rows],
    ]
}

/// `make(out, want)` launches an LM head of `rows` rows and `n` features into `out`: with no
/// flags once, then under each pattern into a buffer of sentinels; each flagged row must hold
/// the unflagged launch's bytes, each other row its sentinels.
fn check(
    backend: &mut CpuBackend,
    (rows, n): (u32, u32),
    what: &str,
    make: impl Fn(Buf, Option<Buf>) -> Launch,
) -> u64 {
    let row_bytes = n as usize * 4;
    let bytes = rows as usize * row_bytes;
    let out = sentinel(backend, bytes);
    let launch = make(out, None);
    run(backend, &launch);
    let full = download(backend, out.ptr, bytes);
    assert!(
        full.chunks_exact(row_bytes)
            .all(|row| row.iter().any(|b| *b != SENTINEL)),
        "{what}: the unflagged launch left a row unwritten"
    );
    let mut launches = 1;
    for flags in patterns(rows as usize) {
        let want = upload(
            backend,
            &flags
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let out = sentinel(backend, bytes);
        let launch = make(out, Some(want));
        run(backend, &launch);
        launches += 1;
        let got = download(backend, out.ptr, bytes);
        for (r, flag) in flags.iter().enumerate() {
            let row = &got[r * row_bytes..(r + 1) * row_bytes];
            if *flag != 0 {
                assert_eq!(
                    row,
                    &full[r * row_bytes..(r + 1) * row_bytes],
                    "{what}: {flags:?} row {r}"
                );
            } else {
                assert!(
                    row.iter().all(|b| *b == SENTINEL),
                    "{what}: {flags:?} row {r} was written"
                );
            }
        }
    }
    launches
}

#[test]
fn every_lm_head_entry_stores_the_flagged_rows_alone() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // k = 300: partial chunks; n = 37: a partial feature block. gemv: 11 rows (two row groups
    // of 8) and 3 rows (three groups of one in the streaming R1 body); the tensor cores: 70
    // rows (two 64-row blocks).
    let (k, n) = (300u32, 37u32);
    let mut launches = 0;
    for rows in [11u32, 3] {
        let x = upload(&mut backend, &values(rows * k, 0x51 + rows as u64));
        let w = upload(&mut backend, &values(n * k, 0x52));
        let head = move |logits, want| LmHead {
            x,
            w,
            logits,
            want,
            rows,
            k,
            vocab: n,
            scratch: None,
        };
        launches += check(&mut backend, (rows, n), "lm_head", |o, want| {
            head(o, want).launch(LM_HEAD)
        });
        let tile = if rows == 3 { RowTile::R1 } else { RowTile::R8 };
        let config = stream_config(n as u64, rows, k, tile);
        launches += check(&mut backend, (rows, n), "lm_head streaming", |o, want| {
            head(o, want).launch_with(LM_HEAD_STREAM[tile.index()], config)
        });
        let h = upload(&mut backend, &f32_values(rows * k, 0.3));
        let d = upload(&mut backend, &values(rows * k, 0x53));
        let wn = upload(&mut backend, &values(k, 0x54));
        let add_norm = move |logits, want| AddNormLmHead {
            h,
            d,
            wn,
            w,
            logits,
            want,
            rows,
            k,
            vocab: n,
            eps: 1e-5,
            scratch: None,
        };
        launches += check(&mut backend, (rows, n), "add_norm_lm_head", |o, want| {
            add_norm(o, want).launch(ADD_NORM_LM_HEAD)
        });
        launches += check(
            &mut backend,
            (rows, n),
            "add_norm_lm_head streaming",
            |o, want| add_norm(o, want).launch_with(ADD_NORM_LM_HEAD_STREAM[tile.index()], config),
        );
    }
    let fp8 = WeightFormat::Fp8 {
        block_n: 3,
        block_k: 40,
    };
    let int4 = WeightFormat::Int4 { group: 25 };
    let quantized = |backend: &mut CpuBackend, format| {
        let blob = quantize_matrix(
            format,
            &matrix(n as usize, k as usize, 0x61),
            n as usize,
            k as usize,
        );
        upload(backend, &blob)
    };
    let (w8, w4) = (quantized(&mut backend, fp8), quantized(&mut backend, int4));
    let rows = 11u32;
    let x = upload(&mut backend, &values(rows * k, 0x62));
    launches += check(&mut backend, (rows, n), "lm_head_fp8", |logits, want| {
        LmHeadFp8 {
            x,
            w: w8,
            logits,
            want,
            rows,
            k,
            vocab: n,
            block_n: 3,
            block_k: 40,
        }
        .launch(LM_HEAD_FP8)
    });
    launches += check(&mut backend, (rows, n), "lm_head_int4", |logits, want| {
        LmHeadInt4 {
            x,
            w: w4,
            logits,
            want,
            rows,
            k,
            vocab: n,
            group: 25,
        }
        .launch(LM_HEAD_INT4)
    });
    let rows = 70u32;
    let x = upload(&mut backend, &values(rows * k, 0x63));
    let w = upload(&mut backend, &values(n * k, 0x64));
    launches += check(&mut backend, (rows, n), "lm_head_mma", |logits, want| {
        LmHeadMma {
            x,
            w,
            logits,
            want,
            rows,
            k,
            vocab: n,
        }
        .launch(LM_HEAD_MMA)
    });
    launches += check(
        &mut backend,
        (rows, n),
        "lm_head_mma_fp8",
        |logits, want| {
            LmHeadMmaFp8 {
                x,
                w: w8,
                logits,
                want,
                rows,
                k,
                vocab: n,
                block_n: 3,
                block_k: 40,
            }
            .launch(LM_HEAD_MMA_FP8)
        },
    );
    launches += check(
        &mut backend,
        (rows, n),
        "lm_head_mma_int4",
        |logits, want| {
            LmHeadMmaInt4 {
                x,
                w: w4,
                logits,
                want,
                rows,
                k,
                vocab: n,
                group: 25,
            }
            .launch(LM_HEAD_MMA_INT4)
        },
    );
    // The emulated CUDA sources wrote what the twins wrote, every launch.
    let report = backend.emulation().unwrap().report();
    let mut seen = 0;
    for (entry, parity) in report.iter() {
        assert_eq!(parity.launches, parity.identical, "{entry}: {parity:?}");
        seen += parity.launches;
    }
    assert_eq!(seen, launches);
}
