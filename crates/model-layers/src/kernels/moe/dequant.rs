//! Dequantisation of one expert matrix of a stacked quantized slot to bf16, the arithmetic of
//! `solder_circuit::format` (and of moe.cu's `MoeFp8Matrix` / `MoeInt4Matrix`):
//! - fp8: `w = bf16_rn(f32(e4m3(q)) * scale)`, the scale of block `(f / block_n, i / block_k)`;
//! - int4: `w = bf16_rn(f32(q - z) * scale)`, `q` the low nibble of byte `f * k / 2 + i / 2`
//!   for even `i` (the high one for odd `i`), scale and zero of group `(f, i / group)`.
//!
//! The kernels receive a blob as 32-bit words (the device's bytes, little endian); matrix `e`
//! of a stack starts at byte `e * MatrixLayout::stride`.

//!
//! Rows are dequantised by `numerics::dequant::dequant_row` (the one definition of the
//! arithmetic, shared with the gemv twins and the loader).

use half::bf16;
use solder_circuit::{MatrixLayout, WeightFormat};

use crate::numerics::dequant;

/// Bytes of a stack of `experts` matrices `[n, k]` in `format`, with the layout of one matrix;
/// an error naming the format when it cannot store them.
pub fn stack_layout(
    format: WeightFormat,
    experts: usize,
    n: usize,
    k: usize,
) -> Result<(MatrixLayout, usize), String> {
    let layout = format.check(n, k)?;
    let bytes = format
        .slot_bytes(&[experts, n, k])
        .ok_or_else(|| format!("{format}: {experts} matrices [{n}, {k}] overflow"))?;
    Ok((layout, bytes))
}

/// The bytes of matrix `e` (`layout.bytes` of them) of a stack passed as words.
pub fn matrix_bytes(words: &[u32], layout: &MatrixLayout, e: usize) -> Vec<u8> {
    let start = e * layout.stride;
    let mut bytes: Vec<u8> = words[start / 4..(start + layout.bytes).div_ceil(4)]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    bytes.truncate(layout.bytes);
    bytes
}

/// The whole `[n, k]` matrix of a blob, dequantised to bf16, row-major.
pub fn dequant_matrix(
    format: WeightFormat,
    layout: &MatrixLayout,
    blob: &[u8],
    n: usize,
    k: usize,
) -> Vec<bf16> {
    let mut out = vec![bf16::ZERO; n * k];
    dequant::dequant_matrix(format, &blob[..layout.bytes], (n, k), &mut out, 1);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::{dequant::e4m3_to_f32, to_bf16};

    #[test]
    fn e4m3_decodes_every_class() {
        assert_eq!(e4m3_to_f32(0x00), 0.0);
        assert_eq!(e4m3_to_f32(0x80).to_bits(), (-0.0f32).to_bits());
        // 0.0001.000 = 2^-6; 0.0000.001 = 2^-9 (the smallest subnormal); 0.0000.111 = 7·2^-9.
        assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_to_f32(0x07), 7.0 * 2f32.powi(-9));
        // 0.0111.000 = 1; 0.1111.110 = 448 (the largest); 1.0111.100 = -1.5.
        assert_eq!(e4m3_to_f32(0x38), 1.0);
        assert_eq!(e4m3_to_f32(0x7e), 448.0);
        assert_eq!(e4m3_to_f32(0xbc), -1.5);
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
    }

    #[test]
    fn fp8_rows_take_their_block_scale_and_round_once() {
        // [3, 5] in blocks [2, 2]: scale grid [2, 3].
        let format = WeightFormat::Fp8 {
            block_n: 2,
            block_k: 2,
        };
        let layout = format.check(3, 5).unwrap();
        let mut blob = vec![0u8; layout.bytes];
        blob[..15].fill(0x38); // every value 1.0
        for (b, s) in [1.0f32, 2.0, 3.0, 4.0, 5.0, 1.0 / 3.0].iter().enumerate() {
            let at = layout.scales_offset + 4 * b;
            blob[at..at + 4].copy_from_slice(&s.to_le_bytes());
        }
        let m = dequant_matrix(format, &layout, &blob, 3, 5);
        let f: Vec<f32> = m.iter().map(|w| w.to_f32()).collect();
        assert_eq!(&f[..5], &[1.0, 1.0, 2.0, 2.0, 3.0]);
        assert_eq!(&f[5..10], &[1.0, 1.0, 2.0, 2.0, 3.0]);
        assert_eq!(&f[10..12], &[4.0, 4.0]);
        assert_eq!(m[14], to_bf16(1.0 / 3.0));
    }

    #[test]
    fn int4_rows_take_nibbles_zeros_and_group_scales() {
        // [2, 6] in groups of 4: 2 groups per row.
        let format = WeightFormat::Int4 { group: 4 };
        let layout = format.check(2, 6).unwrap();
        let mut blob = vec![0u8; layout.bytes];
        // Row 0: q = 0, 1, 2, ..., 5 (low nibble first); row 1: q = 15 everywhere.
        blob[..3].copy_from_slice(&[0x10, 0x32, 0x54]);
        blob[3..6].fill(0xff);
        for (g, (s, z)) in [(1.0f32, 8u8), (0.5, 0), (2.0, 15), (0.25, 8)]
            .iter()
            .enumerate()
        {
            let at = layout.scales_offset + 4 * g;
            blob[at..at + 4].copy_from_slice(&s.to_le_bytes());
            blob[layout.zeros_offset + g] = *z;
        }
        let f: Vec<f32> = dequant_matrix(format, &layout, &blob, 2, 6)
            .iter()
            .map(|w| w.to_f32())
            .collect();
        assert_eq!(&f[..6], &[-8.0, -7.0, -6.0, -5.0, 2.0, 2.5]);
        assert_eq!(&f[6..], &[0.0, 0.0, 0.0, 0.0, 1.75, 1.75]);
    }

    #[test]
    fn matrix_bytes_start_at_the_stride() {
        let format = WeightFormat::Fp8 {
            block_n: 1,
            block_k: 3,
        };
        let (layout, bytes) = stack_layout(format, 2, 2, 3).unwrap();
        assert_eq!(bytes, 2 * layout.stride);
        let words: Vec<u32> = (0..bytes / 4).map(|w| w as u32).collect();
        let second = matrix_bytes(&words, &layout, 1);
        assert_eq!(second.len(), layout.bytes);
        assert_eq!(second[..4], ((layout.stride / 4) as u32).to_le_bytes());
    }
}
