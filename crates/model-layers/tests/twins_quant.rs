//! The quantized gemv entries' twins (`gemv::linear_fp8`, `linear_int4`, `lm_head_fp8`,
//! `lm_head_int4`) give the bytes of the bf16 twin run on the dequantised matrix, at every row
//! tile and at shapes whose k and n are not multiples of a block or group.

mod twins_support;

use half::bf16;
use solder_circuit::WeightFormat;
use solder_model_layers::kernels::gemv::{
    Linear, LinearFp8, LinearInt4, LmHead, LmHeadFp8, LmHeadInt4, LINEAR, LINEAR_FP8, LINEAR_INT4,
    LM_HEAD, LM_HEAD_FP8, LM_HEAD_INT4,
};
use solder_model_layers::kernels::Launch;
use solder_model_layers::numerics::dequant::{dequant_row, quantize_matrix};
use twins_support::{rd, run, run_threads, wr, Rng};

/// The formats each shape is tried in: block-wise, per-channel and per-tensor fp8 (blocks that
/// do not divide n or k), int4 with groups that do not divide k, one of them odd.
fn formats(n: usize, k: usize) -> Vec<WeightFormat> {
    vec![
        WeightFormat::Fp8 {
            block_n: 128,
            block_k: 128,
        },
        WeightFormat::Fp8 {
            block_n: 4,
            block_k: 48,
        },
        WeightFormat::Fp8 {
            block_n: 1,
            block_k: k as u32,
        },
        WeightFormat::Fp8 {
            block_n: n as u32,
            block_k: k as u32,
        },
        WeightFormat::Int4 { group: 128 },
        WeightFormat::Int4 { group: 32 },
        WeightFormat::Int4 { group: 25 },
    ]
}

/// (k, n): k not a multiple of 128 (a partial 8-chunk too), n not a multiple of 8 or a block,
/// and one k over a 1024-element dot segment.
const SHAPES: [(usize, usize); 3] = [(300, 37), (130, 9), (1100, 6)];
const ROWS: [u32; 6] = [1, 2, 3, 4, 8, 11];

/// A seeded weight matrix with values from a few hundredths to a few units.
fn weights(rng: &mut Rng, n: usize, k: usize) -> Vec<f32> {
    (0..n * k)
        .map(|i| rng.unit() * if i % 7 == 0 { 3.0 } else { 0.05 })
        .collect()
}

/// The blob's matrix dequantised to bf16, as the twin under test must read it.
fn dequantised(format: WeightFormat, blob: &[u8], n: usize, k: usize) -> Vec<bf16> {
    let mut matrix = vec![bf16::ZERO; n * k];
    for (f, row) in matrix.chunks_exact_mut(k).enumerate() {
        dequant_row(format, blob, n, k, f, row);
    }
    matrix
}

fn bits<T: Copy + Into<f32>>(v: &[T]) -> Vec<u32> {
    v.iter().map(|x| (*x).into().to_bits()).collect()
}

/// The quantized `linear` entry of `format` over these buffers.
fn linear_quant(
    format: WeightFormat,
    (x, blob, bias): (&[bf16], &[u8], Option<&[bf16]>),
    y: &mut [bf16],
    (rows, k, n_out): (u32, u32, u32),
) -> Launch {
    let (x, w, bias, y) = (rd(x), rd(blob), bias.map(rd), wr(y));
    match format {
        WeightFormat::Fp8 { block_n, block_k } => LinearFp8 {
            x,
            w,
            bias,
            y,
            rows,
            k,
            n_out,
            block_n,
            block_k,
        }
        .launch(LINEAR_FP8),
        WeightFormat::Int4 { group } => LinearInt4 {
            x,
            w,
            bias,
            y,
            rows,
            k,
            n_out,
            group,
        }
        .launch(LINEAR_INT4),
        WeightFormat::Bf16 => unreachable!("a quantized format"),
    }
}

fn lm_head_quant(
    format: WeightFormat,
    (x, blob): (&[bf16], &[u8]),
    logits: &mut [f32],
    (rows, k, vocab): (u32, u32, u32),
) -> Launch {
    let (x, w, logits) = (rd(x), rd(blob), wr(logits));
    match format {
        WeightFormat::Fp8 { block_n, block_k } => LmHeadFp8 {
            x,
            w,
            logits,
            want: None,
            rows,
            k,
            vocab,
            block_n,
            block_k,
        }
        .launch(LM_HEAD_FP8),
        WeightFormat::Int4 { group } => LmHeadInt4 {
            x,
            w,
            logits,
            want: None,
            rows,
            k,
            vocab,
            group,
        }
        .launch(LM_HEAD_INT4),
        WeightFormat::Bf16 => unreachable!("a quantized format"),
    }
}

#[test]
fn quantized_linear_is_the_bf16_linear_of_the_dequantised_matrix() {
    let mut rng = Rng::new(22);
    for (k, n) in SHAPES {
        let w = weights(&mut rng, n, k);
        let bias = rng.bf16s(n, 0.5);
        for format in formats(n, k) {
            let blob = quantize_matrix(format, &w, n, k);
            let matrix = dequantised(format, &blob, n, k);
            for rows in ROWS {
                let x = rng.bf16s(rows as usize * k, 1.0);
                for bias in [Some(&bias[..]), None] {
                    let dims = (rows, k as u32, n as u32);
                    let mut want = vec![bf16::ZERO; rows as usize * n];
                    run(Linear {
                        x: rd(&x),
                        w: rd(&matrix),
                        bias: bias.map(rd),
                        y: wr(&mut want),
                        rows,
                        k: k as u32,
                        n_out: n as u32,
                        scratch: None,
                    }
                    .launch(LINEAR));
                    let mut got = vec![bf16::from_bits(0x7fc1); rows as usize * n];
                    run(linear_quant(format, (&x, &blob, bias), &mut got, dims));
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{format} rows {rows} k {k} n {n} bias {}",
                        bias.is_some()
                    );
                }
            }
        }
    }
}

#[test]
fn quantized_lm_head_is_the_bf16_lm_head_of_the_dequantised_matrix() {
    let mut rng = Rng::new(23);
    for (k, vocab) in SHAPES {
        let w = weights(&mut rng, vocab, k);
        for format in formats(vocab, k) {
            let blob = quantize_matrix(format, &w, vocab, k);
            let matrix = dequantised(format, &blob, vocab, k);
            for rows in ROWS {
                let x = rng.bf16s(rows as usize * k, 1.0);
                let mut want = vec![0f32; rows as usize * vocab];
                run(LmHead {
                    x: rd(&x),
                    w: rd(&matrix),
                    logits: wr(&mut want),
                    want: None,
                    rows,
                    k: k as u32,
                    vocab: vocab as u32,
                    scratch: None,
                }
                .launch(LM_HEAD));
                let mut got = vec![f32::NAN; rows as usize * vocab];
                let dims = (rows, k as u32, vocab as u32);
                run(lm_head_quant(format, (&x, &blob), &mut got, dims));
                assert_eq!(bits(&got), bits(&want), "{format} rows {rows} k {k}");
            }
        }
    }
}

#[test]
fn quantized_twins_do_not_depend_on_the_thread_count() {
    let mut rng = Rng::new(24);
    let (rows, k, n) = (8u32, 300usize, 37usize);
    let w = weights(&mut rng, n, k);
    let x = rng.bf16s(rows as usize * k, 1.0);
    for format in formats(n, k) {
        let blob = quantize_matrix(format, &w, n, k);
        let dims = (rows, k as u32, n as u32);
        let mut one = vec![bf16::ZERO; rows as usize * n];
        run_threads(&linear_quant(format, (&x, &blob, None), &mut one, dims), 1).unwrap();
        let mut four = vec![bf16::ZERO; rows as usize * n];
        run_threads(&linear_quant(format, (&x, &blob, None), &mut four, dims), 4).unwrap();
        assert_eq!(bits(&one), bits(&four), "{format}");
    }
}

#[test]
fn a_blob_of_the_wrong_size_or_a_zero_block_is_refused_naming_the_weight() {
    let mut rng = Rng::new(25);
    let (rows, k, n) = (1u32, 64usize, 4usize);
    let x = rng.bf16s(k, 1.0);
    let format = WeightFormat::Int4 { group: 32 };
    let blob = quantize_matrix(format, &weights(&mut rng, n, k), n, k);
    let mut y = vec![bf16::ZERO; n];
    let dims = (rows, k as u32, n as u32);
    let short = &blob[..blob.len() - 1];
    let err = run_threads(&linear_quant(format, (&x, short, None), &mut y, dims), 1).unwrap_err();
    assert!(err.to_string().contains("`w`"), "{err}");
    let zero = WeightFormat::Fp8 {
        block_n: 0,
        block_k: 32,
    };
    let err = run_threads(&linear_quant(zero, (&x, &blob, None), &mut y, dims), 1).unwrap_err();
    assert!(err.to_string().contains("block dimension is 0"), "{err}");
}
