//! Circuits of the model families solder models, built from a [`ModelConfig`].

/// Every role the families' circuits give their ops (what a rule's `role` may name; a test
/// builds every shipped config and checks both ways).
pub const ROLES: &[&str] = &[
    "attention",
    "attn_gate",
    "attn_residual",
    "conv",
    "down_proj",
    "embed_tokens",
    "experts",
    "final_norm",
    "gate_proj",
    "gate_split",
    "gated_norm",
    "gates",
    "in_proj_ba",
    "in_proj_qkvz",
    "input_layernorm",
    "k_proj",
    "kv_write",
    "lm_head",
    "mlp_residual",
    "moe_combine",
    "mtp_fc",
    "mtp_pre_fc",
    "o_proj",
    "out_proj",
    "post_attention_layernorm",
    "q_proj",
    "qk_norm",
    "recurrence",
    "rope",
    "router",
    "shared_down_proj",
    "shared_expert_gate",
    "shared_gate_proj",
    "shared_silu_mul",
    "shared_up_proj",
    "silu_mul",
    "topk",
    "up_proj",
    "v_proj",
];

mod attention;
mod dense;
mod moe;
mod mtp;
mod next;
mod parts;

pub use mtp::{build_draft, MTP_PREFIX};

use solder_config::{Family, ModelConfig};

use crate::error::CircuitError;
use crate::ir::Circuit;

/// Tokens per KV page at most: 64x the default 16, and a page's bytes stay small.
pub const MAX_KV_BLOCK_SIZE: usize = 1024;

/// A width computed with checked arithmetic (`None` on overflow), refused by name.
pub(super) fn width(what: &str, value: Option<usize>) -> Result<usize, CircuitError> {
    value.ok_or_else(|| CircuitError::TooLarge {
        what: "width".to_string(),
        name: what.to_string(),
        shape: "overflows usize".to_string(),
        max: crate::ir::MAX_TENSOR_BYTES,
    })
}

/// Options of a family build that are not in the model's config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitOptions {
    /// Tokens per KV page.
    pub kv_block_size: usize,
}

impl Default for CircuitOptions {
    fn default() -> Self {
        CircuitOptions { kv_block_size: 16 }
    }
}

/// The step circuit of `config`'s family, named `name`.
pub fn build_circuit(
    config: &ModelConfig,
    name: &str,
    options: CircuitOptions,
) -> Result<Circuit, CircuitError> {
    build(config, name, options, false)
}

fn build(
    config: &ModelConfig,
    name: &str,
    options: CircuitOptions,
    keep_hidden: bool,
) -> Result<Circuit, CircuitError> {
    if !(1..=MAX_KV_BLOCK_SIZE).contains(&options.kv_block_size) {
        return Err(CircuitError::Build(format!(
            "kv_block_size is {}: expected 1..={MAX_KV_BLOCK_SIZE}",
            options.kv_block_size
        )));
    }
    // A hand-built config (public fields) meets the bounds a parsed one does, so no width
    // computed below overflows.
    config.check_bounds()?;
    match config.family {
        // qwen3_moe is the qwen3 decoder with MoE blocks where the config says so.
        // One decoder builder: MoE blocks, gated attention, zero-centred norms and Gated
        // DeltaNet layers switch on where the config has them.
        Family::Llama
        | Family::Mistral
        | Family::Qwen2
        | Family::Qwen3
        | Family::Qwen3Moe
        | Family::Qwen3Next => dense::build(config, name, options, keep_hidden),
    }
}

/// `build_circuit` for a target an MTP draft head reads: the final norm's output is kept as
/// the model output `Hidden` (bf16 `[n, hidden]`), so every program of the target leaves it
/// where the draft program finds it. The logits are computed exactly as without it.
pub fn build_target_with_hidden(
    config: &ModelConfig,
    name: &str,
    options: CircuitOptions,
) -> Result<Circuit, CircuitError> {
    build(config, name, options, true)
}

/// The checkpoint prefix of decoder layer `l`'s weights: `model.layers.{l}.` for the model's
/// own layers, `mtp.layers.{l - num_hidden_layers}.` for the draft head's (which the circuit
/// numbers after them, so its ops and KV state have names of their own).
pub(super) fn layer_prefix(cfg: &ModelConfig, l: u32) -> String {
    let n = cfg.num_hidden_layers as u32;
    if l >= n {
        format!("{MTP_PREFIX}layers.{}.", l - n)
    } else {
        format!("model.layers.{l}.")
    }
}

/// The index a layer's MLP kind is decided by (`MoeConfig::is_sparse_layer`): the layer's own,
/// or, for a draft-head layer, its index among the head's layers (vLLM's
/// `Qwen3NextDecoderLayer` takes it from the `mtp.layers.{i}` prefix).
pub(super) fn mlp_index(cfg: &ModelConfig, l: u32) -> usize {
    let (l, n) = (l as usize, cfg.num_hidden_layers);
    if l >= n {
        l - n
    } else {
        l
    }
}

/// A readable model name from a config path: the file stem, or the folder's name for a
/// checkpoint's `config.json`.
pub fn model_name(source: &str) -> String {
    let path = std::path::Path::new(source);
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    if stem == "config" {
        if let Some(dir) = path
            .parent()
            .and_then(|p| p.file_name())
            .and_then(|s| s.to_str())
        {
            return dir.to_string();
        }
    }
    stem.to_string()
}
