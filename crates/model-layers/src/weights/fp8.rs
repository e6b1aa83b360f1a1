//! FP8 e4m3 weights: the e4m3fn code (encode, round to nearest even, and decode), and the two
//! checkpoint layouts read into `circuit::format`'s `Fp8` matrix: `quant_method: fp8`'s
//! `weight` + `weight_scale_inv` (block scales, as Qwen's and DeepSeek's FP8 checkpoints and
//! vLLM's `Fp8LinearMethod`) and compressed-tensors' `weight` + `weight_scale` (per channel or
//! per tensor, as vLLM's `CompressedTensorsW8A16Fp8`).
//!
//! Invariant: a scale is converted to f32 exactly (bf16 and f16 are subsets of f32), and the
//! e4m3 bytes are copied unchanged: the blob holds what the checkpoint holds.

use safetensors::Dtype as StDtype;
use solder_circuit::WeightFormat;

use super::blob::QuantMatrix;
use super::tensor::{refuse, scale_values, shape_is};
use crate::checkpoint::TensorRef;
use crate::error::WeightsError;

/// The largest finite e4m3fn magnitude.
pub const E4M3_MAX: f32 = 448.0;

pub use crate::numerics::dequant::{e4m3_to_f32, f32_to_e4m3};

/// Checks an FP8 weight and its scale tensor against `[n, k]` and `format` (header only): the
/// weight F8_E4M3 `[n, k]`, the scales `[ceil(n / block_n), ceil(k / block_k)]` — or, for a
/// per-channel or per-tensor format, the shapes compressed-tensors writes (`[n, 1]`; `[]` or
/// `[1]`).
pub(crate) fn check(
    weight: &TensorRef<'_>,
    scales: &TensorRef<'_>,
    format: WeightFormat,
    n: usize,
    k: usize,
) -> Result<(), WeightsError> {
    if weight.dtype != StDtype::F8_E4M3 {
        return Err(refuse(
            weight,
            format!("stored as {:?}, expected F8_E4M3", weight.dtype),
        ));
    }
    shape_is(weight, &[n, k])?;
    if !matches!(scales.dtype, StDtype::F32 | StDtype::BF16 | StDtype::F16) {
        return Err(refuse(
            scales,
            format!(
                "a scale tensor stored as {:?}, expected BF16, F16 or F32",
                scales.dtype
            ),
        ));
    }
    let WeightFormat::Fp8 { block_n, block_k } = format else {
        return Err(refuse(weight, format!("read as fp8 for a {format} slot")));
    };
    let (rows, cols) = (
        n.div_ceil(block_n.max(1) as usize),
        k.div_ceil(block_k.max(1) as usize),
    );
    let fits = scales.shape == [rows, cols]
        || (rows * cols == 1 && (scales.shape.is_empty() || scales.shape == [1]))
        || (cols == 1 && scales.shape == [rows]);
    if !fits {
        return Err(refuse(
            scales,
            format!(
                "shape {:?}, expected [{rows}, {cols}] scales for {format} over [{n}, {k}]",
                scales.shape
            ),
        ));
    }
    Ok(())
}

/// The FP8 matrix of a weight and its scales `check` accepted.
pub(crate) fn read(
    weight: &TensorRef<'_>,
    scales: &TensorRef<'_>,
    format: WeightFormat,
    n: usize,
    k: usize,
) -> Result<QuantMatrix, WeightsError> {
    check(weight, scales, format, n, k)?;
    Ok(QuantMatrix {
        format,
        n,
        k,
        values: weight.data.to_vec(),
        scales: scale_values(scales)?,
        zeros: Vec::new(),
    })
}

/// Quantizes an `n × k` row-major matrix to `format` (`Fp8`): each block's scale is its
/// largest magnitude over 448 (1 for an all-zero block), each value `e4m3(w / scale)`.
pub(crate) fn quantize(values: &[f32], n: usize, k: usize, format: WeightFormat) -> QuantMatrix {
    let WeightFormat::Fp8 { block_n, block_k } = format else {
        unreachable!("fp8::quantize of a {format} slot");
    };
    let (bn, bk) = (block_n as usize, block_k as usize);
    let cols = k.div_ceil(bk);
    let mut scales = vec![0.0f32; n.div_ceil(bn) * cols];
    for (f, row) in values.chunks_exact(k).enumerate() {
        for (i, &w) in row.iter().enumerate() {
            let s = &mut scales[(f / bn) * cols + i / bk];
            *s = s.max(w.abs());
        }
    }
    for s in &mut scales {
        *s = if *s > 0.0 { *s / E4M3_MAX } else { 1.0 };
    }
    let codes = values
        .chunks_exact(k)
        .enumerate()
        .flat_map(|(f, row)| {
            let scales = &scales;
            row.iter()
                .enumerate()
                .map(move |(i, &w)| f32_to_e4m3(w / scales[(f / bn) * cols + i / bk]))
        })
        .collect();
    QuantMatrix {
        format,
        n,
        k,
        values: codes,
        scales,
        zeros: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_code_round_trips() {
        for byte in 0..=255u8 {
            let v = e4m3_to_f32(byte);
            if v.is_nan() {
                assert_eq!(byte & 0x7f, 0x7f);
                continue;
            }
            let back = f32_to_e4m3(v);
            // +0 and -0 keep their sign bit.
            assert_eq!(back, byte, "code {byte:#04x} = {v}");
        }
    }

    #[test]
    fn encoding_rounds_to_nearest_even_and_saturates() {
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0x01), (2.0f32).powi(-9));
        // 1.0625 lies halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1): even wins.
        assert_eq!(f32_to_e4m3(1.0625), f32_to_e4m3(1.0));
        assert_eq!(f32_to_e4m3(1.1875), f32_to_e4m3(1.25));
        // Halfway between the two smallest subnormals' steps.
        assert_eq!(f32_to_e4m3(1.5 * (2.0f32).powi(-9)), 0x02);
        assert_eq!(f32_to_e4m3(460.0), 0x7e);
        assert_eq!(f32_to_e4m3(1.0e6), 0x7e);
        assert_eq!(f32_to_e4m3(-1.0e6), 0xfe);
        // Just under 2^-6 rounds up into the first normal.
        assert_eq!(e4m3_to_f32(f32_to_e4m3(0.0155)), (2.0f32).powi(-6));
    }

    #[test]
    fn quantize_takes_a_scale_per_block_with_partial_edges() {
        let format = WeightFormat::Fp8 {
            block_n: 2,
            block_k: 2,
        };
        let values: Vec<f32> = (0..9).map(|v| v as f32 - 4.0).collect();
        let m = quantize(&values, 3, 3, format);
        assert_eq!(m.scales.len(), 4);
        assert_eq!(m.scales[0], 4.0 / 448.0);
        // The bottom-right edge block holds only 4.0.
        assert_eq!(m.scales[3], 4.0 / 448.0);
        assert_eq!(m.values[8], f32_to_e4m3(448.0));
    }
}
