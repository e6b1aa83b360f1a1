//! The routed experts of Qwen3-MoE and Qwen3-Next: how many, how many per token, their width,
//! which layers are sparse, and Qwen3-Next's shared expert. Invariant: a [`MoeConfig`] built
//! here has `1 <= experts_per_token <= num_experts`, a non-zero `moe_intermediate_size` and
//! `decoder_sparse_step`, and every `mlp_only_layers` entry below `num_hidden_layers`.

use crate::fields::Fields;
use crate::{ConfigError, Family};

/// The mixture-of-experts MLP of a family that has one.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per sparse layer (`num_experts`, or transformers 5's alias
    /// `num_local_experts`).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub experts_per_token: usize,
    /// Intermediate width of one routed expert.
    pub moe_intermediate_size: usize,
    /// Renormalise the top-k routing weights to sum to one (after the softmax over all
    /// experts).
    pub norm_topk_prob: bool,
    /// Layer `i` is sparse only where `(i + 1) % decoder_sparse_step == 0`; at least 1.
    pub decoder_sparse_step: usize,
    /// Layers that run the dense MLP of width `ModelConfig::intermediate_size` instead.
    pub mlp_only_layers: Vec<usize>,
    /// Qwen3-Next's shared expert beside the routed ones (sigmoid-gated), `None` where there
    /// is none (Qwen3-MoE, or a size of 0). Only sparse layers have it.
    pub shared_expert_intermediate_size: Option<usize>,
}

impl MoeConfig {
    /// Whether `layer` runs the routed experts (else the dense MLP), as transformers decides:
    /// not in `mlp_only_layers`, some experts, and `(layer + 1)` a multiple of the step.
    pub fn is_sparse_layer(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && self.num_experts > 0
            // checked: a hand-built config with a step of 0 must not panic.
            && (layer + 1).checked_rem(self.decoder_sparse_step) == Some(0)
    }
}

/// The family's `MoeConfig`, `None` for the dense families.
pub(crate) fn parse_moe(
    fields: &Fields<'_>,
    family: Family,
    num_hidden_layers: usize,
) -> Result<Option<MoeConfig>, ConfigError> {
    // transformers' defaults where a key is absent: Qwen3MoeConfig and Qwen3NextConfig differ.
    let norm_topk_default = match family {
        Family::Qwen3Moe => false,
        Family::Qwen3Next => true,
        Family::Llama | Family::Mistral | Family::Qwen2 | Family::Qwen3 => return Ok(None),
    };
    let num_experts = num_experts(fields)?;
    let experts_per_token = fields.req_usize("num_experts_per_tok")?;
    if experts_per_token == 0 || experts_per_token > num_experts {
        return Err(fields.invalid(
            "num_experts_per_tok",
            experts_per_token,
            format!("between 1 and num_experts ({num_experts})"),
        ));
    }
    let moe_intermediate_size = fields.req_usize("moe_intermediate_size")?;
    if moe_intermediate_size == 0 {
        return Err(fields.invalid("moe_intermediate_size", 0, "a positive integer"));
    }
    let norm_topk_prob = fields
        .opt_bool("norm_topk_prob")?
        .unwrap_or(norm_topk_default);
    let decoder_sparse_step = fields.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if decoder_sparse_step == 0 {
        // transformers takes `(i + 1) % 0` and fails; a step of 0 means nothing.
        return Err(fields.invalid("decoder_sparse_step", 0, "a positive integer"));
    }
    let mlp_only_layers = fields
        .opt_usize_array("mlp_only_layers")?
        .unwrap_or_default();
    if let Some(layer) = mlp_only_layers.iter().find(|l| **l >= num_hidden_layers) {
        return Err(fields.invalid(
            "mlp_only_layers",
            format!("{mlp_only_layers:?} (entry {layer})"),
            format!("layer indices below num_hidden_layers ({num_hidden_layers})"),
        ));
    }
    let shared_expert_intermediate_size = match family {
        // Required: transformers would build a 512-wide shared expert were it absent, and a
        // checkpoint's shared-expert tensors must not be guessed at.
        Family::Qwen3Next => match fields.req_usize("shared_expert_intermediate_size")? {
            0 => None,
            size => Some(size),
        },
        _ => None,
    };
    Ok(Some(MoeConfig {
        num_experts,
        experts_per_token,
        moe_intermediate_size,
        norm_topk_prob,
        decoder_sparse_step,
        mlp_only_layers,
        shared_expert_intermediate_size,
    }))
}

/// `num_experts`, or the alias `num_local_experts` that transformers 5 writes; both given
/// must agree. At least one expert: a router over none has nothing to pick.
fn num_experts(fields: &Fields<'_>) -> Result<usize, ConfigError> {
    let name = fields.opt_usize("num_experts")?;
    let alias = fields.opt_usize("num_local_experts")?;
    let (key, value) = match (name, alias) {
        (Some(a), Some(b)) if a != b => {
            return Err(fields.invalid(
                "num_local_experts",
                b,
                format!("the same value as num_experts ({a}), of which it is an alias"),
            ))
        }
        (Some(value), _) => ("num_experts", value),
        (None, Some(value)) => ("num_local_experts", value),
        (None, None) => return Err(fields.missing("num_experts")),
    };
    if value == 0 {
        return Err(fields.invalid(key, 0, "a positive integer"));
    }
    Ok(value)
}
