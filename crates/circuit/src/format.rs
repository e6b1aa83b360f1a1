//! [`WeightFormat`]: how a weight slot's bytes are stored on the device, and the byte layout of
//! each format. This layout is the contract between the loader (which writes it:
//! `solder_model_layers::weights`), the kernels (which read it and dequantize in registers) and
//! the planner (which counts its bytes).
//!
//! A slot of shape `[..., n, k]` is a stack of `n × k` matrices (one per expert for a stacked
//! slot, one for a plain linear weight). Each matrix is one blob of [`MatrixLayout::bytes`]
//! bytes; matrix `e` starts at `e * MatrixLayout::stride` (256-byte aligned for a quantized
//! format; bf16 matrices are packed end to end, as they always were). A 1-D slot (a
//! norm weight, a bias) is always [`WeightFormat::Bf16`].
//!
//! Dequantisation (the CPU twins define it; the CUDA kernels do the same arithmetic):
//! - `Fp8`: `w = bf16_rn(f32(e4m3(q)) * scale)`, the product rounded once to f32 (exact for
//!   e4m3 times a scale of fewer than 20 significant bits, always an f32 product), then to bf16
//!   round-to-nearest-even. `scale` is the f32 scale of the block holding `(f, i)`.
//! - `Int4`: `w = bf16_rn(f32(q - z) * scale)`, `q` and `z` in `0..=15`, `scale` the f32 scale
//!   of the group holding `(f, i)`.
//!
//! Invariants: every offset is 256-byte aligned; a layout's sizes never overflow for a matrix
//! [`check`](WeightFormat::check) accepted.

use std::fmt;

/// Alignment of every region of a quantized blob and of the stride between matrices.
pub const ALIGN: usize = 256;

/// A weight slot's stored format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// bf16 `[n, k]`, row-major.
    #[default]
    Bf16,
    /// FP8 e4m3 `[n, k]` bytes, row-major; then, at the next 256-byte boundary, f32 scales
    /// `[ceil(n / block_n), ceil(k / block_k)]`, row-major. Per-channel scales are blocks
    /// `[1, k]`, a per-tensor scale one block `[n, k]`.
    Fp8 { block_n: u32, block_k: u32 },
    /// Unsigned 4-bit values `[n, k / 2]` bytes (element `i` of row `f` in byte
    /// `f * k / 2 + i / 2`, the low nibble for even `i`); then f32 scales `[n, ceil(k / group)]`
    /// and u8 zero points `[n, ceil(k / group)]` (8 for a symmetric checkpoint), each at the
    /// next 256-byte boundary. `k` is even.
    Int4 { group: u32 },
}

/// Where the regions of one `n × k` matrix lie in its blob, in bytes from the blob's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatrixLayout {
    /// Bytes of the values (`n * k * 2` for bf16, `n * k` for fp8, `n * k / 2` for int4).
    pub values: usize,
    /// Offset of the f32 scales (0 and unused for bf16).
    pub scales_offset: usize,
    /// Number of f32 scales.
    pub scales: usize,
    /// Offset of the u8 zero points (0 and unused but for int4).
    pub zeros_offset: usize,
    /// Number of zero points.
    pub zeros: usize,
    /// Bytes of the whole blob (the end of its last region).
    pub bytes: usize,
    /// Distance between consecutive matrices of a stacked slot: `bytes` rounded up to 256 for
    /// a quantized format; `bytes` for bf16 (stacked bf16 matrices are packed end to end).
    pub stride: usize,
}

fn align(x: usize) -> Option<usize> {
    x.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

impl WeightFormat {
    /// The name rules use in `formats`: `bf16`, `fp8` or `int4`.
    pub fn kind(self) -> &'static str {
        match self {
            WeightFormat::Bf16 => "bf16",
            WeightFormat::Fp8 { .. } => "fp8",
            WeightFormat::Int4 { .. } => "int4",
        }
    }

    /// Every kind name, in the order rules list them.
    pub const KINDS: [&'static str; 3] = ["bf16", "fp8", "int4"];

    /// Refuses a format that cannot store an `n × k` matrix: a zero block or group, an odd `k`
    /// for int4, or sizes that overflow.
    pub fn check(self, n: usize, k: usize) -> Result<MatrixLayout, String> {
        match self {
            WeightFormat::Fp8 { block_n, block_k } if block_n == 0 || block_k == 0 => {
                return Err(format!("{self}: a block dimension is 0"));
            }
            WeightFormat::Int4 { group: 0 } => return Err(format!("{self}: the group is 0")),
            WeightFormat::Int4 { .. } if !k.is_multiple_of(2) => {
                return Err(format!("{self}: k = {k} is odd (two values per byte)"));
            }
            _ => {}
        }
        self.layout(n, k)
            .ok_or_else(|| format!("{self}: a [{n}, {k}] matrix overflows"))
    }

    /// The layout of one `n × k` matrix, `None` on overflow. Callers hold a format `check`
    /// accepted for these dimensions.
    pub fn layout(self, n: usize, k: usize) -> Option<MatrixLayout> {
        let nk = n.checked_mul(k)?;
        let (values, scales, zeros) = match self {
            WeightFormat::Bf16 => (nk.checked_mul(2)?, 0, 0),
            WeightFormat::Fp8 { block_n, block_k } => {
                let rows = n.div_ceil(block_n.max(1) as usize);
                let cols = k.div_ceil(block_k.max(1) as usize);
                (nk, rows.checked_mul(cols)?, 0)
            }
            WeightFormat::Int4 { group } => {
                let groups = n.checked_mul(k.div_ceil(group.max(1) as usize))?;
                (nk / 2, groups, groups)
            }
        };
        let (scales_offset, after_scales) = if scales > 0 {
            let at = align(values)?;
            (at, at.checked_add(scales.checked_mul(4)?)?)
        } else {
            (0, values)
        };
        let (zeros_offset, bytes) = if zeros > 0 {
            let at = align(after_scales)?;
            (at, at.checked_add(zeros)?)
        } else {
            (0, after_scales)
        };
        Some(MatrixLayout {
            values,
            scales_offset,
            scales,
            zeros_offset,
            zeros,
            bytes,
            stride: if self == WeightFormat::Bf16 {
                bytes
            } else {
                align(bytes)?
            },
        })
    }

    /// Bytes of a slot of `shape` in this format: the stacked matrices at their stride (a
    /// single matrix takes `bytes`, not the stride); bf16 elements for a 1-D slot. `None` on
    /// overflow.
    pub fn slot_bytes(self, shape: &[usize]) -> Option<usize> {
        match shape {
            [] => Some(0),
            [len] => len.checked_mul(2),
            [stack @ .., n, k] => {
                let layout = self.layout(*n, *k)?;
                let matrices = stack
                    .iter()
                    .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
                if matrices == 1 {
                    Some(layout.bytes)
                } else {
                    layout.stride.checked_mul(matrices)
                }
            }
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightFormat::Bf16 => write!(f, "bf16"),
            WeightFormat::Fp8 { block_n, block_k } => write!(f, "fp8[{block_n}x{block_k}]"),
            WeightFormat::Int4 { group } => write!(f, "int4[g{group}]"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_block_layout_has_partial_edge_blocks() {
        let layout = WeightFormat::Fp8 {
            block_n: 128,
            block_k: 128,
        }
        .check(300, 200)
        .unwrap();
        assert_eq!(layout.values, 60_000);
        assert_eq!(layout.scales, 3 * 2);
        assert_eq!(layout.scales_offset, 60_160);
        assert_eq!(layout.bytes, 60_160 + 24);
        assert_eq!(layout.stride % ALIGN, 0);
    }

    #[test]
    fn int4_layout_packs_two_per_byte_with_scales_and_zeros() {
        let layout = WeightFormat::Int4 { group: 128 }.check(4, 256).unwrap();
        assert_eq!(layout.values, 512);
        assert_eq!((layout.scales, layout.zeros), (8, 8));
        assert_eq!(layout.scales_offset, 512);
        assert_eq!(layout.zeros_offset, 768);
        assert_eq!(layout.bytes, 776);
        assert!(WeightFormat::Int4 { group: 128 }.check(4, 255).is_err());
    }

    #[test]
    fn stacked_slots_take_whole_strides() {
        let f = WeightFormat::Fp8 {
            block_n: 1,
            block_k: 64,
        };
        let one = f.layout(8, 64).unwrap();
        assert_eq!(f.slot_bytes(&[8, 64]), Some(one.bytes));
        assert_eq!(f.slot_bytes(&[3, 8, 64]), Some(3 * one.stride));
        assert_eq!(WeightFormat::Bf16.slot_bytes(&[5]), Some(10));
        assert_eq!(
            WeightFormat::Bf16.slot_bytes(&[3, 5, 7]),
            Some(3 * 5 * 7 * 2)
        );
    }
}
