//! int4 weights: AWQ (GEMM packing) and GPTQ checkpoints repacked into `circuit::format`'s one
//! `Int4` layout (row `f` = output feature, two k-values per byte, low nibble first, f32
//! scales and u8 zeros `[n, groups]`), as vLLM's Marlin path repacks both into one layout.
//!
//! - AWQ (AutoAWQ's `WQLinear_GEMM`, vLLM's `awq_triton`): `qweight` I32 `[k, n / 8]` holds
//!   output features `8c..8c+8` of input `i` in word `c`, nibble `j` (bits `4j..4j+4`) holding
//!   feature `8c + AWQ_ORDER[j]`, `AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`; `qzeros` I32
//!   `[groups, n / 8]` packed the same way; `scales` `[groups, n]`. `zero_point: false` stores
//!   no zeros: z = 8.
//! - GPTQ (AutoGPTQ / exllama): `qweight` I32 `[k / 8, n]`, input `i` of feature `f` in word
//!   `(i / 8, f)`, nibble `i % 8` (low bits first); `qzeros` I32 `[groups, n / 8]`, feature `f`
//!   in word `f / 8`, nibble `f % 8`, stored as z − 1 by the v1 checkpoint format
//!   (z = (stored + 1) & 15, as exllama reads it) and as z by `gptq_v2`; `scales`
//!   `[groups, n]`; `g_idx` I32 `[k]` must be `i / group` (act-order is refused by name).
//!
//! Invariant: w = (q − z) · s for every element, the same q, z and s the checkpoint holds.

use safetensors::Dtype as StDtype;
use solder_circuit::WeightFormat;

use super::blob::QuantMatrix;
use super::tensor::{refuse, scale_values, shape_is};
use crate::checkpoint::TensorRef;
use crate::error::WeightsError;

/// Where AWQ's packer puts feature `8c + AWQ_ORDER[j]`: nibble `j` of word `c`.
const AWQ_ORDER: [usize; 8] = [0, 2, 4, 6, 1, 3, 5, 7];

/// The zero point of a checkpoint that stores none (symmetric): the middle of `0..=15`.
pub const SYMMETRIC_ZERO: u8 = 8;

/// Which int4 packing a checkpoint uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Packing {
    Awq { zero_point: bool },
    Gptq { v2: bool },
}

/// An int4 linear's checkpoint tensors.
pub(crate) struct Int4Tensors<'c> {
    pub qweight: TensorRef<'c>,
    pub qzeros: Option<TensorRef<'c>>,
    pub scales: TensorRef<'c>,
    pub g_idx: Option<TensorRef<'c>>,
}

fn i32s(t: &TensorRef<'_>) -> Vec<u32> {
    t.data
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn nibble(word: u32, j: usize) -> u8 {
    ((word >> (4 * j)) & 0x0f) as u8
}

/// Checks the tensors' dtypes and shapes against `[n, k]` and `group` (header only).
pub(crate) fn check(
    t: &Int4Tensors<'_>,
    packing: Packing,
    group: usize,
    n: usize,
    k: usize,
) -> Result<(), WeightsError> {
    if !n.is_multiple_of(8) {
        return Err(refuse(
            &t.qweight,
            format!("{n} output features are not a multiple of 8 (eight per packed word)"),
        ));
    }
    let groups = k.div_ceil(group.max(1));
    let packed = match packing {
        Packing::Awq { .. } => [k, n / 8],
        Packing::Gptq { .. } => {
            if !k.is_multiple_of(8) {
                return Err(refuse(
                    &t.qweight,
                    format!("{k} input features are not a multiple of 8 (eight per packed word)"),
                ));
            }
            [k / 8, n]
        }
    };
    let zeros_shape = [groups, n / 8];
    for (tensor, shape) in [(&t.qweight, &packed[..])]
        .into_iter()
        .chain(t.qzeros.as_ref().map(|z| (z, &zeros_shape[..])))
    {
        if tensor.dtype != StDtype::I32 {
            return Err(refuse(
                tensor,
                format!("stored as {:?}, expected I32 (packed int4)", tensor.dtype),
            ));
        }
        shape_is(tensor, shape)?;
    }
    if !matches!(t.scales.dtype, StDtype::F16 | StDtype::BF16 | StDtype::F32) {
        return Err(refuse(
            &t.scales,
            format!(
                "a scale tensor stored as {:?}, expected F16",
                t.scales.dtype
            ),
        ));
    }
    shape_is(&t.scales, &[groups, n])?;
    if let Some(g_idx) = &t.g_idx {
        if g_idx.dtype != StDtype::I32 {
            return Err(refuse(
                g_idx,
                format!("stored as {:?}, expected I32", g_idx.dtype),
            ));
        }
        shape_is(g_idx, &[k])?;
    }
    Ok(())
}

/// The `Int4 { group }` matrix of tensors `check` accepts, repacked.
pub(crate) fn read(
    t: &Int4Tensors<'_>,
    packing: Packing,
    group: usize,
    n: usize,
    k: usize,
) -> Result<QuantMatrix, WeightsError> {
    check(t, packing, group, n, k)?;
    let groups = k.div_ceil(group);
    if let Some(g_idx) = &t.g_idx {
        // act-order (desc_act) permutes groups: the layout has no room for it.
        if let Some(i) = i32s(g_idx)
            .iter()
            .enumerate()
            .position(|(i, &g)| g as usize != i / group)
        {
            return Err(refuse(
                g_idx,
                format!(
                    "g_idx[{i}] is not {i} / {group}: an act-order (desc_act) GPTQ checkpoint, \
                     not supported"
                ),
            ));
        }
    }
    // q[f][i] for every output feature f, input i.
    let words = i32s(&t.qweight);
    let mut q = vec![0u8; n * k];
    match packing {
        Packing::Awq { .. } => {
            for i in 0..k {
                for c in 0..n / 8 {
                    let word = words[i * (n / 8) + c];
                    for (j, &order) in AWQ_ORDER.iter().enumerate() {
                        q[(8 * c + order) * k + i] = nibble(word, j);
                    }
                }
            }
        }
        Packing::Gptq { .. } => {
            for r in 0..k / 8 {
                for f in 0..n {
                    let word = words[r * n + f];
                    for j in 0..8 {
                        q[f * k + 8 * r + j] = nibble(word, j);
                    }
                }
            }
        }
    }
    // z[g][f], as checkpoints lay scales out, transposed below.
    let stored_zeros: Vec<u8> = match &t.qzeros {
        None => vec![SYMMETRIC_ZERO; groups * n],
        Some(qzeros) => {
            let words = i32s(qzeros);
            let mut z = vec![0u8; groups * n];
            for g in 0..groups {
                for c in 0..n / 8 {
                    let word = words[g * (n / 8) + c];
                    for (j, &order) in AWQ_ORDER.iter().enumerate() {
                        let f = match packing {
                            Packing::Awq { .. } => 8 * c + order,
                            Packing::Gptq { .. } => 8 * c + j,
                        };
                        z[g * n + f] = match packing {
                            Packing::Gptq { v2: false } => (nibble(word, j) + 1) & 0x0f,
                            _ => nibble(word, j),
                        };
                    }
                }
            }
            z
        }
    };
    let scales_gn = scale_values(&t.scales)?;
    let mut values = vec![0u8; n * k / 2];
    for (f, row) in q.chunks_exact(k).enumerate() {
        for (b, pair) in row.chunks_exact(2).enumerate() {
            values[f * k / 2 + b] = pair[0] | (pair[1] << 4);
        }
    }
    let mut scales = vec![0.0f32; n * groups];
    let mut zeros = vec![0u8; n * groups];
    for g in 0..groups {
        for f in 0..n {
            scales[f * groups + g] = scales_gn[g * n + f];
            zeros[f * groups + g] = stored_zeros[g * n + f];
        }
    }
    Ok(QuantMatrix {
        format: WeightFormat::Int4 {
            group: group as u32,
        },
        n,
        k,
        values,
        scales,
        zeros,
    })
}

/// Quantizes an `n × k` row-major matrix to `Int4 { group }` asymmetrically: per group of
/// each row, scale = (max − min) / 15 (1 when flat), z = round(−min / scale) in `0..=15`,
/// q = clamp(round(w / scale) + z, 0, 15).
pub(crate) fn quantize(values: &[f32], n: usize, k: usize, group: usize) -> QuantMatrix {
    let groups = k.div_ceil(group);
    let mut scales = vec![1.0f32; n * groups];
    let mut zeros = vec![SYMMETRIC_ZERO; n * groups];
    let mut codes = vec![0u8; n * k];
    for (f, row) in values.chunks_exact(k).enumerate() {
        for (g, chunk) in row.chunks(group).enumerate() {
            let lo = chunk.iter().copied().fold(0.0f32, f32::min);
            let hi = chunk.iter().copied().fold(0.0f32, f32::max);
            let scale = if hi > lo { (hi - lo) / 15.0 } else { 1.0 };
            let zero = (-lo / scale).round().clamp(0.0, 15.0);
            scales[f * groups + g] = scale;
            zeros[f * groups + g] = zero as u8;
            for (i, &w) in chunk.iter().enumerate() {
                codes[f * k + g * group + i] = ((w / scale).round() + zero).clamp(0.0, 15.0) as u8;
            }
        }
    }
    let packed = codes
        .chunks_exact(2)
        .map(|pair| pair[0] | (pair[1] << 4))
        .collect();
    QuantMatrix {
        format: WeightFormat::Int4 {
            group: group as u32,
        },
        n,
        k,
        values: packed,
        scales,
        zeros,
    }
}
