//! The precision policy: which format ([`WeightFormat`]) each weight slot is stored in, from
//! the checkpoint's `quantization_config` ([`Quantization`]), a tier or a per-tensor table
//! ([`PrecisionSpec`]), and the formats the rules' kernels read.
//!
//! What a checkpoint quantizes (as vLLM loads these methods): the weight matrices of linear
//! projections — attention q/k/v/o, MLP gate/up/down, MoE experts, Gated DeltaNet in/out
//! projections, the MTP head's `fc` — unless its own lists skip the module
//! ([`Quantization::skips`]); never embeddings, norms, biases, convolutions, the MoE router or
//! the shared-expert gate. `lm_head` only where the method quantizes heads: `fp8`, `awq` and
//! `gptq` never do (vLLM's `ParallelLMHead` takes no quantization from them); a
//! compressed-tensors checkpoint does where `Linear` is a target and `ignore` does not name it.
//!
//! Invariants: a slot is given a quantized format only when the checkpoint stores it in that
//! format (quantizing a bf16 tensor at load is not supported); with rules, only when every op
//! reading it has a `reference` rule whose kernel reads that format; a stacked slot's parts
//! agree; every format given passed [`WeightFormat::check`] for the slot's matrices.

use solder_config::{Fp8Strategy, Quantization};

use crate::error::CircuitError;
use crate::format::WeightFormat;
use crate::ir::{Circuit, Op, WeightSlot};
use crate::ops::OpKind;
use crate::rules::{Numerics, Rule, RuleSet};

/// The tiers a [`PrecisionSpec::Policy`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tier {
    /// The checkpoint's own formats, where a `reference` rule's kernel reads that format for
    /// every op reading the slot; else bf16 (dequantised at load, logged naming the tensor).
    #[default]
    Native,
    /// Every weight bf16: quantized tensors are dequantised at load.
    Bf16,
}

/// How a served model's weight formats are chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrecisionSpec {
    Policy(Tier),
    /// Per-tensor overrides (slot name, format) on top of [`Tier::Native`], e.g.
    /// `("lm_head.weight", Bf16)`. An entry naming no slot, a format the checkpoint does not
    /// store the tensor in (other than bf16), or a format no `reference` kernel reads for an op
    /// reading the tensor is refused by name.
    Table(Vec<(String, WeightFormat)>),
}

impl Default for PrecisionSpec {
    fn default() -> Self {
        PrecisionSpec::Policy(Tier::Native)
    }
}

/// The formats of every slot of a model's storage circuit, by `WeightId`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What the checkpoint stores each slot as.
    pub checkpoint: Vec<WeightFormat>,
    /// What each slot is served as (the spec applied).
    pub served: Vec<WeightFormat>,
}

/// Resolves `spec` for the weights of `storage` (the draft circuit when there is one, whose
/// slots extend the model's), read by the ops of `circuits`. Without `rules`, the checkpoint's
/// formats are taken as they are and the fuser refuses a format no rule reads, by name.
pub fn resolve(
    spec: &PrecisionSpec,
    quantization: Option<&Quantization>,
    storage: &Circuit,
    circuits: &[&Circuit],
    rules: Option<&RuleSet>,
) -> Result<Resolved, CircuitError> {
    // The ops reading each slot, by `WeightId`, over every circuit.
    let mut reading: Vec<Vec<&Op>> = vec![Vec::new(); storage.weights.len()];
    for op in circuits.iter().flat_map(|c| c.ops.iter()) {
        for w in &op.weights {
            if let Some(ops) = reading.get_mut(w.0 as usize) {
                ops.push(op);
            }
        }
    }
    let readers = |index: usize| reading[index].as_slice();
    let checkpoint = storage
        .weights
        .iter()
        .enumerate()
        .map(|(i, slot)| checkpoint_format(quantization, slot, readers(i)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut served = checkpoint.clone();
    if *spec == PrecisionSpec::Policy(Tier::Bf16) {
        served.fill(WeightFormat::Bf16);
    }
    if let Some(rules) = rules {
        for (i, format) in served.iter_mut().enumerate() {
            if *format != WeightFormat::Bf16 {
                if let Err(unread) = kernels_read(rules, readers(i), *format) {
                    tracing::info!(
                        tensor = %storage.weights[i].name, format = %format, %unread,
                        "served bf16 (dequantised at load): no reference kernel reads its format"
                    );
                    *format = WeightFormat::Bf16;
                }
            }
        }
    }
    if let PrecisionSpec::Table(entries) = spec {
        for (name, format) in entries {
            let (i, slot) = storage
                .weights
                .iter()
                .enumerate()
                .find(|(_, s)| s.name == *name)
                .ok_or_else(|| refuse(name, *format, "names no weight slot of the model"))?;
            if *format != WeightFormat::Bf16 && *format != checkpoint[i] {
                let why = if checkpoint[i] == WeightFormat::Bf16 {
                    "the checkpoint stores it bf16, and quantizing at load is not supported"
                        .to_string()
                } else {
                    format!(
                        "the checkpoint stores it as {}: keep that or dequantise to bf16",
                        checkpoint[i]
                    )
                };
                return Err(refuse(&slot.name, *format, &why));
            }
            if let Some(rules) = rules {
                kernels_read(rules, readers(i), *format)
                    .map_err(|unread| refuse(&slot.name, *format, &unread))?;
            }
            served[i] = *format;
        }
    }
    Ok(Resolved { checkpoint, served })
}

/// Sets every slot's format in `circuit` from `formats` (by `WeightId`; a circuit whose slots
/// are a prefix of the storage circuit's takes the prefix).
pub fn apply(formats: &[WeightFormat], circuit: &mut Circuit) {
    for (slot, format) in circuit.weights.iter_mut().zip(formats) {
        slot.format = *format;
    }
}

fn refuse(tensor: &str, format: WeightFormat, why: &str) -> CircuitError {
    CircuitError::Precision {
        tensor: tensor.to_string(),
        format: format.to_string(),
        message: why.to_string(),
    }
}

/// `Ok` when every op of `readers` has a `reference` rule whose kernel reads `format`; else
/// the first op that has none, with the reference rules that cover it and what they read.
fn kernels_read(rules: &RuleSet, readers: &[&Op], format: WeightFormat) -> Result<(), String> {
    let reference = |op: &Op| -> Vec<&Rule> {
        rules
            .rules
            .iter()
            .filter(|r| r.numerics == Numerics::Reference && r.pattern[0].matches(op))
            .collect()
    };
    for op in readers {
        let covering = reference(op);
        if !covering.iter().any(|r| r.reads(format)) {
            let kernels: Vec<String> = covering
                .iter()
                .map(|r| {
                    format!(
                        "rule `{}` ({}) reads {}",
                        r.id,
                        r.kernels.join("+"),
                        r.formats.join("/")
                    )
                })
                .collect();
            return Err(format!(
                "no reference kernel reads {} for op `{}` ({}): {}",
                format.kind(),
                op.name,
                op.kind.as_str(),
                if kernels.is_empty() {
                    "no reference rule covers it".to_string()
                } else {
                    kernels.join("; ")
                }
            ));
        }
    }
    Ok(())
}

/// Whether `op` is a linear projection whose weight a checkpoint may quantize, and whether it
/// is the model's output head.
fn projection(op: &Op) -> Option<bool> {
    match op.kind {
        OpKind::Linear if op.role != "shared_expert_gate" => Some(false),
        OpKind::MoeGateUp | OpKind::MoeDown => Some(false),
        OpKind::LmHead => Some(op.role == "lm_head"),
        _ => None,
    }
}

/// The format the checkpoint (`quantization`, none for a bf16 one) stores `slot` in, given
/// the ops that read it.
pub fn checkpoint_format(
    quantization: Option<&Quantization>,
    slot: &WeightSlot,
    readers: &[&Op],
) -> Result<WeightFormat, CircuitError> {
    let Some(q) = quantization else {
        return Ok(WeightFormat::Bf16);
    };
    let kinds: Option<Vec<bool>> = readers.iter().map(|op| projection(op)).collect();
    let head = match kinds {
        Some(kinds) if !kinds.is_empty() && slot.shape.len() >= 2 => kinds.contains(&true),
        _ => return Ok(WeightFormat::Bf16),
    };
    let names: Vec<&str> = if slot.parts.is_empty() {
        vec![slot.name.as_str()]
    } else {
        slot.parts.iter().map(String::as_str).collect()
    };
    let modules: Option<Vec<&str>> = names.iter().map(|n| n.strip_suffix(".weight")).collect();
    let Some(modules) = modules else {
        return Ok(WeightFormat::Bf16);
    };
    let quantized: Vec<bool> = modules.iter().map(|m| quantizes(q, m, head)).collect();
    if quantized.iter().any(|&b| b != quantized[0]) {
        return Err(CircuitError::Precision {
            tensor: slot.name.clone(),
            format: "mixed".to_string(),
            message: format!(
                "the checkpoint's {} quantization keeps some of the stacked tensors \
                 unquantized (e.g. `{}`), and a stacked slot holds one format",
                q.method(),
                names[quantized.iter().position(|&b| !b).unwrap_or(0)]
            ),
        });
    }
    if !quantized[0] {
        return Ok(WeightFormat::Bf16);
    }
    let (n, k) = match slot.shape[..] {
        [.., n, k] => (n, k),
        _ => return Ok(WeightFormat::Bf16),
    };
    let dim = |what: &str, v: usize| {
        u32::try_from(v).map_err(|_| CircuitError::Precision {
            tensor: slot.name.clone(),
            format: q.method().to_string(),
            message: format!("{what} {v} does not fit a u32"),
        })
    };
    let format = match q {
        Quantization::Fp8Block { block, .. } => WeightFormat::Fp8 {
            block_n: dim("weight_block_size[0]", block[0])?,
            block_k: dim("weight_block_size[1]", block[1])?,
        },
        Quantization::Fp8Compressed { strategy, .. } => match strategy {
            Fp8Strategy::Channel => WeightFormat::Fp8 {
                block_n: 1,
                block_k: dim("in features", k)?,
            },
            Fp8Strategy::Tensor => WeightFormat::Fp8 {
                block_n: dim("out features", n)?,
                block_k: dim("in features", k)?,
            },
        },
        Quantization::Awq { group_size, .. } | Quantization::Gptq { group_size, .. } => {
            let group = if *group_size == 0 { k } else { *group_size };
            WeightFormat::Int4 {
                group: dim("group_size", group)?,
            }
        }
    };
    format.check(n, k).map_err(|why| CircuitError::Precision {
        tensor: slot.name.clone(),
        format: format.to_string(),
        message: why,
    })?;
    Ok(format)
}

/// Whether checkpoint `q` stores module `module` (a projection; `head` for `lm_head`)
/// quantized.
fn quantizes(q: &Quantization, module: &str, head: bool) -> bool {
    if q.skips(module) {
        return false;
    }
    match q {
        Quantization::Fp8Block { .. } | Quantization::Awq { .. } | Quantization::Gptq { .. } => {
            !head
        }
        Quantization::Fp8Compressed { targets, .. } => targets.iter().any(|t| {
            t == "Linear"
                || t == module
                || t.strip_prefix("re:").is_some_and(|p| wildcard(p, module))
        }),
    }
}

/// `pattern` matches all of `text`, `.*` standing for any run of characters (the form
/// compressed-tensors `targets` patterns take, as `Quantization::skips` reads `ignore`).
fn wildcard(pattern: &str, text: &str) -> bool {
    let mut pieces = pattern.split(".*");
    let first = pieces.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = pieces.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}
