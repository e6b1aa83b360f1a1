//! Reading one checkpoint tensor (a slot, or one part of a stacked slot) into the bytes its
//! slot's `WeightFormat` stores: what the checkpoint holds is found first from the headers
//! (`resolve`: a float tensor, an FP8 weight and its scales, or AWQ / GPTQ int4 tensors), then
//! converted (`PartRead::write`). A float tensor for a quantized slot, a quantized tensor in
//! another format than its slot's, or quantized tensors without a matching
//! `quantization_config` are refused by name.
//!
//! Invariant: the bytes written for a part are exactly `part_bytes`: bf16 `[n, k]` (today's
//! bytes, from BF16, F16 or F32, or dequantised) or the format's blob.

use safetensors::Dtype as StDtype;
use solder_circuit::ir::WeightSlot;
use solder_circuit::WeightFormat;
use solder_config::{Fp8Strategy, Quantization};

use super::int4::{Int4Tensors, Packing};
use super::tensor::{float_values, refuse, shape_is};
use super::{fp8, int4};
use crate::checkpoint::{Checkpoint, TensorRef};
use crate::error::WeightsError;

/// Bytes of a slot on the device: bf16 elements for a bf16 slot (stacked parts contiguous,
/// as today), the format's `slot_bytes` for a quantized one; `usize::MAX` on overflow (no
/// length matches it).
pub(crate) fn slot_bytes(slot: &WeightSlot) -> usize {
    let bytes = match slot.format {
        WeightFormat::Bf16 => slot.shape.iter().try_fold(2usize, |n, &d| n.checked_mul(d)),
        format => format.slot_bytes(&slot.shape),
    };
    bytes.unwrap_or(usize::MAX)
}

/// Each checkpoint tensor a slot is made of, with its offset in the slot's bytes and its
/// shape: the slot's own name, or its parts (one matrix each, at the format's stride).
pub(crate) fn parts(slot: &WeightSlot) -> Vec<(&str, usize, &[usize])> {
    if slot.parts.is_empty() {
        return vec![(slot.name.as_str(), 0, slot.shape.as_slice())];
    }
    let shape = slot.shape.get(1..).unwrap_or_default();
    let stride = match (slot.format, shape) {
        (WeightFormat::Bf16, _) | (_, [] | [_]) => shape.iter().product::<usize>() * 2,
        (format, [.., n, k]) => format.layout(*n, *k).map_or(0, |l| l.stride),
    };
    slot.parts
        .iter()
        .enumerate()
        .map(|(e, name)| (name.as_str(), e * stride, shape))
        .collect()
}

/// Bytes one part of `shape` takes in `format`.
pub(crate) fn part_bytes(format: WeightFormat, shape: &[usize]) -> usize {
    match (format, shape) {
        (WeightFormat::Bf16, _) | (_, [] | [_]) => shape.iter().product::<usize>() * 2,
        (format, [.., n, k]) => format.layout(*n, *k).map_or(usize::MAX, |l| l.bytes),
    }
}

/// The companion tensors of a linear weight `X.weight` a quantized checkpoint may hold.
pub(crate) const COMPANIONS: [&str; 7] = [
    "weight_scale_inv",
    "weight_scale",
    "input_scale",
    "qweight",
    "qzeros",
    "scales",
    "g_idx",
];

/// What the checkpoint holds for one part.
enum Stored<'c> {
    Float(TensorRef<'c>),
    Fp8 {
        weight: TensorRef<'c>,
        scales: TensorRef<'c>,
        format: WeightFormat,
    },
    Int4 {
        tensors: Int4Tensors<'c>,
        packing: Packing,
        group: usize,
    },
}

/// One part, resolved against the checkpoint's headers: ready to convert.
pub(crate) struct PartRead<'c> {
    stored: Stored<'c>,
    target: WeightFormat,
    shape: Vec<usize>,
}

/// `name`'s checkpoint tensors for a part of `shape` stored as `target` (headers only: no
/// tensor data is read).
pub(crate) fn resolve<'c>(
    checkpoint: &'c Checkpoint,
    quant: Option<&Quantization>,
    name: &str,
    shape: &[usize],
    target: WeightFormat,
) -> Result<PartRead<'c>, WeightsError> {
    let matrix = match shape {
        [n, k] => Some((*n, *k)),
        _ => None,
    };
    let prefix = name.strip_suffix(".weight");
    let companion = |suffix: &str| prefix.map(|p| format!("{p}.{suffix}"));
    if let Some(qweight) = companion("qweight").filter(|q| checkpoint.contains(q)) {
        let qweight = checkpoint.tensor(&qweight)?;
        let (packing, group_size) = match quant {
            Some(Quantization::Awq {
                group_size,
                zero_point,
                ..
            }) => (
                Packing::Awq {
                    zero_point: *zero_point,
                },
                *group_size,
            ),
            Some(Quantization::Gptq { group_size, v2, .. }) => {
                (Packing::Gptq { v2: *v2 }, *group_size)
            }
            other => return Err(refuse(&qweight, no_config("int4 (awq or gptq)", other))),
        };
        let Some((n, k)) = matrix else {
            return Err(refuse(
                &qweight,
                format!("packed int4 for a slot of shape {shape:?} (a matrix expected)"),
            ));
        };
        let group = if group_size == 0 { k } else { group_size };
        let optional = |suffix: &str| -> Result<Option<TensorRef<'c>>, WeightsError> {
            match companion(suffix).filter(|c| checkpoint.contains(c)) {
                Some(c) => checkpoint.tensor(&c).map(Some),
                None => Ok(None),
            }
        };
        let qzeros = optional("qzeros")?;
        let needs_zeros = !matches!(packing, Packing::Awq { zero_point: false });
        if qzeros.is_none() && needs_zeros {
            checkpoint.tensor(&companion("qzeros").unwrap_or_default())?;
        }
        let scales = checkpoint.tensor(&companion("scales").unwrap_or_default())?;
        let g_idx = optional("g_idx")?;
        let tensors = Int4Tensors {
            qweight,
            qzeros,
            scales,
            g_idx,
        };
        int4::check(&tensors, packing, group, n, k)?;
        let found = WeightFormat::Int4 {
            group: group as u32,
        };
        check_target(&tensors.qweight, found, target, n, k)?;
        return Ok(PartRead {
            stored: Stored::Int4 {
                tensors,
                packing,
                group,
            },
            target,
            shape: shape.to_vec(),
        });
    }
    let weight = checkpoint.tensor(name)?;
    match weight.dtype {
        StDtype::F8_E4M3 => {}
        StDtype::BF16 | StDtype::F16 | StDtype::F32 => {
            shape_is(&weight, shape)?;
            // A float weight beside scales or zeros: the checkpoint is not what it seems.
            if let Some(orphan) = COMPANIONS
                .iter()
                .filter_map(|c| companion(c))
                .find(|c| checkpoint.contains(c))
            {
                let message = format!(
                    "stored as {:?} beside `{orphan}`, a quantized weight's companion:                      expected a quantized weight",
                    weight.dtype
                );
                return Err(refuse(&weight, message));
            }
            if target != WeightFormat::Bf16 {
                let message = format!(
                    "stored as {:?}, but its slot expects {target} (quantized): the \
                     checkpoint does not quantize this weight",
                    weight.dtype
                );
                return Err(refuse(&weight, message));
            }
            return Ok(PartRead {
                stored: Stored::Float(weight),
                target,
                shape: shape.to_vec(),
            });
        }
        other => {
            return Err(WeightsError::Dtype {
                tensor: name.to_string(),
                file: weight.file.to_path_buf(),
                found: format!("{other:?}"),
            })
        }
    }
    let Some((n, k)) = matrix else {
        return Err(refuse(
            &weight,
            format!("F8_E4M3 for a slot of shape {shape:?} (a matrix expected)"),
        ));
    };
    if let Some(input_scale) = companion("input_scale").filter(|c| checkpoint.contains(c)) {
        let t = checkpoint.tensor(&input_scale)?;
        return Err(refuse(
            &t,
            "a static activation scale: solder quantizes weights only (dynamic or no \
             activation scales)"
                .to_string(),
        ));
    }
    let (scale_name, format) = match quant {
        Some(Quantization::Fp8Block { block, .. }) => (
            "weight_scale_inv",
            WeightFormat::Fp8 {
                block_n: block[0] as u32,
                block_k: block[1] as u32,
            },
        ),
        Some(Quantization::Fp8Compressed { strategy, .. }) => (
            "weight_scale",
            match strategy {
                Fp8Strategy::Channel => WeightFormat::Fp8 {
                    block_n: 1,
                    block_k: k as u32,
                },
                Fp8Strategy::Tensor => WeightFormat::Fp8 {
                    block_n: n as u32,
                    block_k: k as u32,
                },
            },
        ),
        other => return Err(refuse(&weight, no_config("F8_E4M3 (fp8)", other))),
    };
    let scales = checkpoint.tensor(&companion(scale_name).unwrap_or_default())?;
    fp8::check(&weight, &scales, format, n, k)?;
    check_target(&weight, format, target, n, k)?;
    Ok(PartRead {
        stored: Stored::Fp8 {
            weight,
            scales,
            format,
        },
        target,
        shape: shape.to_vec(),
    })
}

fn no_config(stored: &str, quant: Option<&Quantization>) -> String {
    match quant {
        None => format!("stored as {stored}, but config.json has no quantization_config"),
        Some(q) => format!(
            "stored as {stored}, but the quantization_config's method is `{}`",
            q.method()
        ),
    }
}

/// A part stored as `found` can fill a slot of `target`: the same format, or bf16
/// (dequantised at load).
fn check_target(
    t: &TensorRef<'_>,
    found: WeightFormat,
    target: WeightFormat,
    n: usize,
    k: usize,
) -> Result<(), WeightsError> {
    if target == WeightFormat::Bf16 || target == found {
        return found.check(n, k).map(|_| ()).map_err(|e| refuse(t, e));
    }
    Err(refuse(
        t,
        format!("the checkpoint stores {found}, but its slot expects {target}"),
    ))
}

impl PartRead<'_> {
    /// Bytes the part takes in its slot.
    pub fn bytes(&self) -> usize {
        part_bytes(self.target, &self.shape)
    }

    /// The part's bytes straight from the mapping, when they are the slot's already: a bf16
    /// slot's BF16 tensor.
    pub fn borrowed(&self) -> Option<&[u8]> {
        match &self.stored {
            Stored::Float(t) if t.dtype == StDtype::BF16 => Some(t.data),
            _ => None,
        }
    }

    /// The checkpoint tensors the part reads.
    pub fn tensors(&self) -> Vec<&str> {
        match &self.stored {
            Stored::Float(t) => vec![t.name],
            Stored::Fp8 { weight, scales, .. } => vec![weight.name, scales.name],
            Stored::Int4 { tensors, .. } => [
                Some(&tensors.qweight),
                tensors.qzeros.as_ref(),
                Some(&tensors.scales),
                tensors.g_idx.as_ref(),
            ]
            .into_iter()
            .flatten()
            .map(|t| t.name)
            .collect(),
        }
    }

    /// Converts the part into `out` (exactly `bytes()` long, zeroed by the caller).
    pub fn write(&self, out: &mut [u8]) -> Result<(), WeightsError> {
        debug_assert_eq!(out.len(), self.bytes());
        let matrix = match &self.stored {
            Stored::Float(t) => {
                let values = float_values(t)?;
                out.copy_from_slice(crate::bytes::bf16_bytes(&values));
                return Ok(());
            }
            Stored::Fp8 {
                weight,
                scales,
                format,
            } => fp8::read(weight, scales, *format, self.shape[0], self.shape[1])?,
            Stored::Int4 {
                tensors,
                packing,
                group,
            } => int4::read(tensors, *packing, *group, self.shape[0], self.shape[1])?,
        };
        if self.target == WeightFormat::Bf16 {
            out.copy_from_slice(crate::bytes::bf16_bytes(&matrix.dequant_bf16()));
        } else {
            matrix.write_blob(out);
        }
        Ok(())
    }
}
