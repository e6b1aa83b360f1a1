//! Host copies of a circuit's weight slots, in the served format (bf16): from a checkpoint
//! (bf16, f16 and f32 converted at load) or generated from a seed (built-in models, benches).
//!
//! Invariant: `HostWeights::slots[i]` holds exactly the elements of `circuit.weights[i]`'s
//! shape; every slot was found by name with that shape, and every checkpoint tensor is used
//! by some slot or is tolerated by name (`Unused`: a `rotary_emb.inv_freq` at a name
//! transformers writes, qwen3_next's `mtp.*`, a tied head that is a copy of the embedding).

use std::collections::HashSet;

use half::{bf16, f16};
use safetensors::Dtype as StDtype;
use solder_circuit::ir::Circuit;
use solder_circuit::OpKind;

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
        let used: HashSet<&str> = circuit
            .weights
            .iter()
            .flat_map(|w| std::iter::once(&w.name).chain(&w.parts))
            .map(String::as_str)
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
                if head.data == embed.data && head.shape == embed.shape && head.dtype == embed.dtype
                {
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

pub struct HostWeights {
    pub slots: Vec<Vec<bf16>>,
}

impl HostWeights {
    pub fn total_bytes(&self) -> usize {
        self.slots.iter().map(|s| s.len() * 2).sum()
    }

    /// Loads every weight slot of `circuit` from `checkpoint`.
    pub fn load(circuit: &Circuit, checkpoint: &Checkpoint) -> Result<HostWeights, WeightsError> {
        let unused = Unused::of(circuit, checkpoint)?;
        if unused.mtp > 0 {
            tracing::info!(
                tensors = unused.mtp,
                dir = %checkpoint.dir.display(),
                "ignoring {MTP_FAMILY}'s multi-token-prediction tensors ({MTP_PREFIX}*), as transformers does"
            );
        }
        let mut slots = Vec::with_capacity(circuit.weights.len());
        for slot in &circuit.weights {
            let values = if slot.parts.is_empty() {
                read_bf16(checkpoint, &slot.name, &slot.shape)?
            } else {
                // Stacked at load: one checkpoint tensor per part (e.g. per expert).
                let part_shape = slot.shape.get(1..).unwrap_or_default();
                let mut values = Vec::with_capacity(slot.shape.iter().product());
                for part in &slot.parts {
                    values.extend(read_bf16(checkpoint, part, part_shape)?);
                }
                values
            };
            slots.push(values);
        }
        tracing::info!(slots = slots.len(), dir = %checkpoint.dir.display(), "loaded weights");
        Ok(HostWeights { slots })
    }

    /// Every slot holds exactly the elements its declared shape needs (checked before an
    /// upload: a longer slot would overwrite its neighbour). The slot count is the caller's.
    pub fn check_lengths(&self, circuit: &Circuit) -> Result<(), WeightsError> {
        for (slot, values) in circuit.weights.iter().zip(&self.slots) {
            // A shape whose product overflows matches no length.
            let expected = slot
                .shape
                .iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .unwrap_or(usize::MAX);
            if values.len() != expected {
                return Err(WeightsError::SlotLength {
                    tensor: slot.name.clone(),
                    shape: slot.shape.clone(),
                    found: values.len(),
                    expected,
                });
            }
        }
        Ok(())
    }

    /// Random weights from `seed`: norm weights near 1, biases small, matrices scaled by
    /// 1/sqrt(fan-in) so activations stay in range through many layers.
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
                (0..n)
                    .map(|_| bf16::from_f32(center + half_width * rng.uniform()))
                    .collect()
            })
            .collect();
        HostWeights { slots }
    }
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

/// A checkpoint tensor of `shape`, converted to bf16.
fn read_bf16(
    checkpoint: &Checkpoint,
    name: &str,
    shape: &[usize],
) -> Result<Vec<bf16>, WeightsError> {
    let t = checkpoint.tensor(name)?;
    if t.shape != shape {
        return Err(WeightsError::Shape {
            tensor: name.to_string(),
            file: t.file.to_path_buf(),
            found: t.shape.clone(),
            expected: shape.to_vec(),
        });
    }
    Ok(match t.dtype {
        StDtype::BF16 => t
            .data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]))
            .collect(),
        StDtype::F16 => t
            .data
            .chunks_exact(2)
            .map(|b| bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32()))
            .collect(),
        StDtype::F32 => t
            .data
            .chunks_exact(4)
            .map(|b| bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        other => {
            return Err(WeightsError::Dtype {
                tensor: name.to_string(),
                file: t.file.to_path_buf(),
                found: format!("{other:?}"),
            })
        }
    })
}

/// One bf16 tensor for `safetensors::serialize_to_file`.
struct Bf16View<'a> {
    shape: &'a [usize],
    values: &'a [bf16],
}

impl safetensors::View for Bf16View<'_> {
    fn dtype(&self) -> StDtype {
        StDtype::BF16
    }

    fn shape(&self) -> &[usize] {
        self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(crate::bytes::bf16_bytes(self.values))
    }

    fn data_len(&self) -> usize {
        self.values.len() * 2
    }
}

impl HostWeights {
    /// Writes the weights as a single-file checkpoint (`model.safetensors`, bf16), written
    /// beside and renamed into place so a failure leaves no half-written file.
    pub fn save(&self, circuit: &Circuit, path: &std::path::Path) -> Result<(), WeightsError> {
        // A stacked slot is written back as its parts, one tensor each, as checkpoints hold it.
        let tensors: Vec<(String, Bf16View<'_>)> = circuit
            .weights
            .iter()
            .zip(&self.slots)
            .flat_map(|(slot, values)| {
                if slot.parts.is_empty() {
                    vec![(
                        slot.name.clone(),
                        Bf16View {
                            shape: &slot.shape,
                            values,
                        },
                    )]
                } else {
                    let part_shape = slot.shape.get(1..).unwrap_or_default();
                    let per = part_shape.iter().product::<usize>();
                    slot.parts
                        .iter()
                        .zip(values.chunks(per.max(1)))
                        .map(|(name, part)| {
                            (
                                name.clone(),
                                Bf16View {
                                    shape: part_shape,
                                    values: part,
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
