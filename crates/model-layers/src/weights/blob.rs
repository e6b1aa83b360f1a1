//! A quantized matrix on the host (`QuantMatrix`: values, f32 scales, u8 zeros) and its two
//! ways onto the device: the blob of `circuit::format` (regions at `MatrixLayout`'s offsets,
//! padding zeroed), or dequantised to bf16 for a slot the policy keeps bf16.
//!
//! Invariant: `values`, `scales` and `zeros` hold exactly the counts `format.layout(n, k)`
//! names (the readers and quantizers build them so).

use half::bf16;
use solder_circuit::WeightFormat;

use crate::numerics::dequant::dequant_row;

/// One `n × k` matrix in a quantized format.
pub(crate) struct QuantMatrix {
    pub format: WeightFormat,
    pub n: usize,
    pub k: usize,
    /// e4m3 bytes `[n, k]`, or int4 pairs `[n, k / 2]` (low nibble first).
    pub values: Vec<u8>,
    pub scales: Vec<f32>,
    /// int4 zero points `[n, groups]`; empty for fp8.
    pub zeros: Vec<u8>,
}

impl QuantMatrix {
    /// Writes the matrix's blob at the start of `out` (which holds `layout.bytes`; the padding
    /// between regions is left as `out` had it: zeros, from the caller).
    pub fn write_blob(&self, out: &mut [u8]) {
        let layout = self
            .format
            .layout(self.n, self.k)
            .expect("a format checked against this matrix");
        out[..layout.values].copy_from_slice(&self.values);
        let scales = &mut out[layout.scales_offset..layout.scales_offset + layout.scales * 4];
        for (dst, s) in scales.chunks_exact_mut(4).zip(&self.scales) {
            dst.copy_from_slice(&s.to_le_bytes());
        }
        if layout.zeros > 0 {
            out[layout.zeros_offset..layout.zeros_offset + layout.zeros]
                .copy_from_slice(&self.zeros);
        }
    }

    /// The matrix dequantised to bf16, row-major, as `circuit::format` defines it (row by
    /// row through `numerics::dequant::dequant_row`, the kernels' twins' own arithmetic).
    pub fn dequant_bf16(&self) -> Vec<bf16> {
        let (n, k) = (self.n, self.k);
        let layout = self
            .format
            .layout(n, k)
            .expect("a format checked against this matrix");
        let mut blob = vec![0u8; layout.bytes];
        self.write_blob(&mut blob);
        let mut out = vec![bf16::ZERO; n * k];
        if k > 0 {
            for (f, row) in out.chunks_exact_mut(k).enumerate() {
                dequant_row(self.format, &blob, n, k, f, row);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::{fp8, int4};

    #[test]
    fn blob_regions_lie_where_the_layout_says() {
        let format = WeightFormat::Int4 { group: 4 };
        let values: Vec<f32> = (0..16).map(|v| v as f32 * 0.25 - 2.0).collect();
        let m = int4::quantize(&values, 2, 8, 4);
        let layout = format.layout(2, 8).unwrap();
        let mut blob = vec![0u8; layout.bytes];
        m.write_blob(&mut blob);
        assert_eq!(&blob[..8], &m.values[..]);
        let first_scale = f32::from_le_bytes(blob[256..260].try_into().unwrap());
        assert_eq!(first_scale, m.scales[0]);
        assert_eq!(&blob[512..516], &m.zeros[..]);
    }

    #[test]
    fn dequantised_values_are_close_to_the_quantized_matrix() {
        let values: Vec<f32> = (0..64)
            .map(|v| ((v * 37 % 64) as f32 - 32.0) / 64.0)
            .collect();
        let format = WeightFormat::Fp8 {
            block_n: 2,
            block_k: 4,
        };
        let fp8 = fp8::quantize(&values, 8, 8, format).dequant_bf16();
        let int4 = int4::quantize(&values, 8, 8, 4).dequant_bf16();
        for ((w, a), b) in values.iter().zip(&fp8).zip(&int4) {
            assert!(
                (w - a.to_f32()).abs() <= 0.5 / 16.0 + 1e-3,
                "fp8 {w} -> {a}"
            );
            assert!(
                (w - b.to_f32()).abs() <= 1.0 / 15.0 + 1e-2,
                "int4 {w} -> {b}"
            );
        }
    }
}
