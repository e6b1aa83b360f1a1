//! A circuit's weight slots on the host, each in its slot's `WeightFormat` layout
//! (`circuit::format`): from a checkpoint (bf16, f16 and f32 converted at load; FP8 and
//! AWQ / GPTQ int4 read by `fp8` and `int4`, `read` choosing by what the checkpoint holds,
//! `tensor` one tensor's values and refusals), generated from a seed (built-in models, benches), or streamed to the device slot by slot
//! (`stream`, used by `CircuitExec::build`).
//!
//! Invariant: `HostWeights::slots[i]` holds exactly `read::slot_bytes(circuit.weights[i])`
//! bytes; every slot was found by name with its shape and format, and every checkpoint tensor
//! is used by some slot (a quantized linear's companions — scales, zeros, `g_idx` — with it)
//! or is tolerated by name (`Unused`: a `rotary_emb.inv_freq` at a name transformers writes,
//! qwen3_next's `mtp.*`, a tied head that is a copy of the embedding).

mod blob;
pub mod fp8;
pub mod int4;
mod read;
pub(crate) mod stream;
mod tensor;

use std::collections::HashSet;

use half::bf16;
use safetensors::Dtype as StDtype;
use solder_circuit::ir::{Circuit, WeightSlot};
use solder_circuit::{OpKind, WeightFormat};
use solder_config::Quantization;

use crate::bytes::bf16_bytes;
use crate::checkpoint::Checkpoint;
use crate::error::WeightsError;

const TIED_HEAD: &str = "lm_head.weight";
const TIED_EMBEDDING: &str = "model.embed_tokens.weight";

/// The model-level rotary buffer transformers may save (not a weight).
const MODEL_INV_FREQ: &str = "model.rotary_emb.inv_freq";
/// Per layer, older transformers save `model.layers.{i}.self_attn.rotary_emb.inv_freq`.
const LAYER_INV_FREQ: (&str, &str) = ("model.layers.", ".self_attn.rotary_emb.inv_freq");

/// Qwen3-Next checkpoints carry a multi-token-prediction head that transformers ignores
/// (`_keys_to_ignore_on_load_unexpected = [r"^mtp.*"]`); so does solder unless the serve asks
/// for draft programs, whose circuit (`families::build_draft`) names them as slots.
const MTP_FAMILY: &str = "qwen3_next";
const MTP_PREFIX: &str = "mtp.";

/// The circuit's LM head reads the embedding table (tied embeddings).
fn tied_head(circuit: &Circuit) -> bool {
    circuit
        .ops
        .iter()
        .filter(|op| op.kind == OpKind::LmHead)
        .any(|op| {
            op.weights.iter().any(|w| {
                circuit
                    .weights
                    .get(w.0 as usize)
                    .is_some_and(|slot| slot.name == TIED_EMBEDDING)
            })
        })
}

/// A rotary `inv_freq` buffer at a name transformers writes: the model's, or a layer's
/// (`i` written as transformers writes it, below `num_layers`).
fn is_derived(name: &str, num_layers: u32) -> bool {
    if name == MODEL_INV_FREQ {
        return true;
    }
    let (prefix, suffix) = LAYER_INV_FREQ;
    let Some(layer) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(suffix))
    else {
        return false;
    };
    layer
        .parse::<u32>()
        .is_ok_and(|i| i < num_layers && i.to_string() == layer)
}

/// Checkpoint tensors no weight slot reads that loading tolerates, by kind.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unused {
    /// `rotary_emb.inv_freq` buffers at the names transformers writes.
    pub derived: usize,
    /// qwen3_next's multi-token-prediction tensors (`mtp.*`) no slot reads (all of them
    /// without draft programs), ignored as transformers does.
    pub mtp: usize,
    /// A tied head saved as a copy of the embedding.
    pub tied_head_copy: bool,
}

impl Unused {
    /// Classifies every checkpoint tensor no slot of `circuit` reads; any other is refused
    /// by name (`WeightsError::Unexpected`).
    pub fn of(circuit: &Circuit, checkpoint: &Checkpoint) -> Result<Unused, WeightsError> {
        let names: Vec<&str> = circuit
            .weights
            .iter()
            .flat_map(|w| std::iter::once(&w.name).chain(&w.parts))
            .map(String::as_str)
            .collect();
        // A quantized linear `X.weight` comes with its companions (`X.weight_scale_inv`,
        // `X.qzeros`, ...): used with it (an `X.input_scale` is refused when the slot loads).
        let companions: Vec<String> = names
            .iter()
            .filter_map(|name| name.strip_suffix(".weight"))
            .flat_map(|prefix| {
                read::COMPANIONS
                    .iter()
                    .map(move |c| format!("{prefix}.{c}"))
            })
            .collect();
        let used: HashSet<&str> = names
            .iter()
            .copied()
            .chain(companions.iter().map(String::as_str))
            .collect();
        let mtp_ignored = circuit.family == MTP_FAMILY;
        let mut unused = Unused::default();
        for name in checkpoint.names() {
            if used.contains(name) {
                continue;
            }
            if is_derived(name, circuit.num_layers) {
                unused.derived += 1;
                continue;
            }
            if mtp_ignored && name.starts_with(MTP_PREFIX) {
                unused.mtp += 1;
                continue;
            }
            if name == TIED_HEAD && tied_head(circuit) {
                // Some exporters keep the tied head as a copy: fine only if it is one.
                let (head, embed) = (
                    checkpoint.tensor(TIED_HEAD)?,
                    checkpoint.tensor(TIED_EMBEDDING)?,
                );
                let copy = head.data == embed.data
                    && head.shape == embed.shape
                    && head.dtype == embed.dtype;
                // Compared once; a streaming load never reads the copy again.
                checkpoint.release(TIED_HEAD);
                if copy {
                    tracing::debug!("ignoring {TIED_HEAD}: a copy of the tied embedding");
                    unused.tied_head_copy = true;
                    continue;
                }
                return Err(WeightsError::Format {
                    path: head.file.to_path_buf(),
                    message: format!("`{TIED_HEAD}` differs from `{TIED_EMBEDDING}` but the config ties them (tie_word_embeddings)"),
                });
            }
            let file = checkpoint
                .file_of(name)
                .unwrap_or(&checkpoint.dir)
                .to_path_buf();
            return Err(WeightsError::Unexpected {
                tensor: name.to_string(),
                file,
            });
        }
        Ok(unused)
    }
}

/// Each weight slot's bytes on the host, in its slot's `WeightFormat` layout
/// (`circuit::format`): bf16 values as the device stores them, or a quantized blob.
pub struct HostWeights {
    pub slots: Vec<Vec<u8>>,
}

impl HostWeights {
    pub fn total_bytes(&self) -> usize {
        self.slots.iter().map(Vec::len).sum()
    }

    /// Host weights from bf16 values, one vector per slot (every slot bf16).
    pub fn from_bf16(slots: Vec<Vec<bf16>>) -> HostWeights {
        HostWeights {
            slots: slots.iter().map(|s| bf16_bytes(s).to_vec()).collect(),
        }
    }

    /// Slot `index`'s bytes read as bf16 values (meaningful for a bf16 slot).
    pub fn bf16_values(&self, index: usize) -> Vec<bf16> {
        self.slots
            .get(index)
            .map_or_else(Vec::new, |s| bf16_from_bytes(s))
    }

    /// Loads every weight slot of `circuit` from an unquantized `checkpoint`.
    pub fn load(circuit: &Circuit, checkpoint: &Checkpoint) -> Result<HostWeights, WeightsError> {
        HostWeights::load_quantized(circuit, checkpoint, None)
    }

    /// Loads every weight slot of `circuit` from `checkpoint`, whose `quantization_config` is
    /// `quant`: each slot in its own format (a quantized tensor whose slot is bf16 is
    /// dequantised).
    pub fn load_quantized(
        circuit: &Circuit,
        checkpoint: &Checkpoint,
        quant: Option<&Quantization>,
    ) -> Result<HostWeights, WeightsError> {
        check_checkpoint(circuit, checkpoint, quant)?;
        let mut slots = Vec::with_capacity(circuit.weights.len());
        for slot in &circuit.weights {
            let mut bytes = vec![0u8; read::slot_bytes(slot)];
            for (name, offset, shape) in read::parts(slot) {
                let part = read::resolve(checkpoint, quant, name, shape, slot.format)?;
                part.write(&mut bytes[offset..offset + part.bytes()])?;
            }
            slots.push(bytes);
        }
        tracing::info!(slots = slots.len(), dir = %checkpoint.dir.display(), "loaded weights");
        Ok(HostWeights { slots })
    }

    /// Every slot holds exactly the bytes its declared shape and format need (checked before
    /// an upload: a longer slot would overwrite its neighbour). The slot count is the caller's.
    pub fn check_lengths(&self, circuit: &Circuit) -> Result<(), WeightsError> {
        for (slot, values) in circuit.weights.iter().zip(&self.slots) {
            let expected = read::slot_bytes(slot);
            if values.len() != expected {
                return Err(WeightsError::SlotLength {
                    tensor: slot.name.clone(),
                    shape: slot.shape.clone(),
                    format: slot.format.to_string(),
                    found: values.len(),
                    expected,
                });
            }
        }
        Ok(())
    }

    /// Random weights from `seed`: norm weights near 1, biases small, matrices scaled by
    /// 1/sqrt(fan-in) so activations stay in range through many layers. A quantized slot holds
    /// the same random matrix quantized to its format (fp8 e4m3 with a block's max / 448 as
    /// its scale; int4 with a group's range / 15 and its zero point).
    pub fn random(circuit: &Circuit, seed: u64) -> HostWeights {
        let mut norm_slots = vec![false; circuit.weights.len()];
        for op in &circuit.ops {
            if matches!(op.kind, OpKind::RmsNorm | OpKind::QkNorm) {
                for w in &op.weights {
                    norm_slots[w.0 as usize] = true;
                }
            }
        }
        let slots = circuit
            .weights
            .iter()
            .enumerate()
            .map(|(i, slot)| {
                let mut rng = SplitMix64(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                let n: usize = slot.shape.iter().product();
                let (center, half_width) = match slot.shape.as_slice() {
                    _ if norm_slots[i] => (1.0, 0.2),
                    [_] => (0.0, 0.05),
                    [_, fan_in] => (0.0, (3.0 / *fan_in as f32).sqrt()),
                    _ => (0.0, 0.05),
                };
                let mut draw = || center + half_width * rng.uniform();
                match (slot.format, slot.shape.as_slice()) {
                    (WeightFormat::Bf16, _) | (_, [] | [_]) => {
                        let values: Vec<bf16> = (0..n).map(|_| bf16::from_f32(draw())).collect();
                        bf16_bytes(&values).to_vec()
                    }
                    (format, [.., rows, cols]) => {
                        let mut bytes = vec![0u8; read::slot_bytes(slot)];
                        for offset in stacked_offsets(slot) {
                            let values: Vec<f32> = (0..rows * cols).map(|_| draw()).collect();
                            let matrix = quantize(&values, *rows, *cols, format);
                            matrix.write_blob(&mut bytes[offset..]);
                        }
                        bytes
                    }
                }
            })
            .collect();
        HostWeights { slots }
    }
}

/// Each matrix of a quantized slot, at its offset (the format's stride apart).
fn stacked_offsets(slot: &WeightSlot) -> Vec<usize> {
    let (stack, n, k) = match slot.shape.as_slice() {
        [stack @ .., n, k] => (stack.iter().product::<usize>(), *n, *k),
        _ => return Vec::new(),
    };
    let stride = slot.format.layout(n, k).map_or(0, |l| l.stride);
    (0..stack).map(|e| e * stride).collect()
}

/// An `n × k` f32 matrix quantized to `format` (not bf16).
fn quantize(values: &[f32], n: usize, k: usize, format: WeightFormat) -> blob::QuantMatrix {
    match format {
        WeightFormat::Int4 { group } => int4::quantize(values, n, k, group as usize),
        _ => fp8::quantize(values, n, k, format),
    }
}

/// The checks a load makes before reading any tensor data: every checkpoint tensor is used or
/// tolerated (`Unused`), and every slot's tensors are found with the dtypes and shapes its
/// format needs (headers only).
pub(crate) fn check_checkpoint(
    circuit: &Circuit,
    checkpoint: &Checkpoint,
    quant: Option<&Quantization>,
) -> Result<Unused, WeightsError> {
    let unused = Unused::of(circuit, checkpoint)?;
    if unused.mtp > 0 {
        tracing::info!(
            tensors = unused.mtp,
            dir = %checkpoint.dir.display(),
            "ignoring {MTP_FAMILY}'s multi-token-prediction tensors ({MTP_PREFIX}*), as transformers does"
        );
    }
    for slot in &circuit.weights {
        if let [.., n, k] = slot.shape.as_slice() {
            if slot.format != WeightFormat::Bf16 {
                slot.format
                    .check(*n, *k)
                    .map_err(|message| WeightsError::SlotFormat {
                        tensor: slot.name.clone(),
                        message,
                    })?;
            }
        }
        for (name, _, shape) in read::parts(slot) {
            read::resolve(checkpoint, quant, name, shape, slot.format)?;
        }
    }
    Ok(unused)
}

/// bf16 values from little-endian bytes (a trailing odd byte is dropped).
pub fn bf16_from_bytes(bytes: &[u8]) -> Vec<bf16> {
    bytes
        .chunks_exact(2)
        .map(|b| bf16::from_le_bytes([b[0], b[1]]))
        .collect()
}

/// A small, fast, seedable generator (SplitMix64): the same seed gives the same weights on
/// every machine.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// One bf16 tensor for `safetensors::serialize_to_file`.
struct Bf16View<'a> {
    shape: &'a [usize],
    bytes: &'a [u8],
}

impl safetensors::View for Bf16View<'_> {
    fn dtype(&self) -> StDtype {
        StDtype::BF16
    }

    fn shape(&self) -> &[usize] {
        self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(self.bytes)
    }

    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

impl HostWeights {
    /// Writes the weights as a single-file checkpoint (`model.safetensors`, bf16), written
    /// beside and renamed into place so a failure leaves no half-written file. A quantized
    /// slot is refused by name: solder writes no quantized checkpoint format.
    pub fn save(&self, circuit: &Circuit, path: &std::path::Path) -> Result<(), WeightsError> {
        if let Some(slot) = circuit
            .weights
            .iter()
            .find(|s| s.format != WeightFormat::Bf16)
        {
            return Err(WeightsError::SlotFormat {
                tensor: slot.name.clone(),
                message: format!(
                    "stored as {}: saving writes bf16 checkpoints only",
                    slot.format
                ),
            });
        }
        // A stacked slot is written back as its parts, one tensor each, as checkpoints hold it.
        let tensors: Vec<(String, Bf16View<'_>)> = circuit
            .weights
            .iter()
            .zip(&self.slots)
            .flat_map(|(slot, bytes)| {
                if slot.parts.is_empty() {
                    vec![(
                        slot.name.clone(),
                        Bf16View {
                            shape: &slot.shape,
                            bytes,
                        },
                    )]
                } else {
                    let part_shape = slot.shape.get(1..).unwrap_or_default();
                    let per = part_shape.iter().product::<usize>() * 2;
                    slot.parts
                        .iter()
                        .zip(bytes.chunks(per.max(1)))
                        .map(|(name, part)| {
                            (
                                name.clone(),
                                Bf16View {
                                    shape: part_shape,
                                    bytes: part,
                                },
                            )
                        })
                        .collect()
                }
            })
            .collect();
        let tmp = path.with_extension("safetensors.tmp");
        safetensors::serialize_to_file(tensors, None, &tmp).map_err(|e| WeightsError::Io {
            path: tmp.clone(),
            message: e.to_string(),
        })?;
        std::fs::rename(&tmp, path).map_err(|e| WeightsError::Io {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
    }
}
