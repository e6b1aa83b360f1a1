//! A config checked however it was made: [`check_bounds`](crate::ModelConfig::check_bounds)
//! runs on a hand-built config (its fields are public) the checks the parser runs key by key as
//! it reads a file (every dim within `DIM_BOUNDS`, every float a normal positive f32) and the
//! structure the dimensions must have beyond their bounds, before a compiler computes any size
//! from it, so a config the parser would refuse is refused by the same key.
//!
//! Invariant: a config that passes has every dimension positive, kv heads dividing heads, an
//! even head_dim with an even positive rotary dim, top-k within the experts, linear value
//! heads a multiple of linear key heads, and one layer type and one window per layer.

use crate::error::ConfigError;
use crate::fields::Fields;
use crate::hybrid::LinearAttnConfig;
use crate::model::ModelConfig;
use crate::moe::MoeConfig;
use crate::rope::RopeScaling;

impl ModelConfig {
    /// Checks a config built by hand (its fields are public) as `from_json_str` checks a
    /// file's: every dim within `DIM_BOUNDS`, every float a normal positive f32, and the
    /// structure (`shape`: positive dims, divisibility, top-k within the experts). Compilers
    /// call it before computing any size from the config.
    pub fn check_bounds(&self) -> Result<(), ConfigError> {
        let empty = serde_json::Map::new();
        let fields = Fields::new(&self.source, "", &empty);
        let mut dims = vec![
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("num_hidden_layers", self.layer_types.len()),
        ];
        if let Some(moe) = &self.moe {
            dims.extend([
                ("num_experts", moe.num_experts),
                ("num_experts_per_tok", moe.experts_per_token),
                ("moe_intermediate_size", moe.moe_intermediate_size),
                (
                    "shared_expert_intermediate_size",
                    moe.shared_expert_intermediate_size.unwrap_or(0),
                ),
            ]);
        }
        if let Some(la) = &self.linear_attn {
            dims.extend([
                ("linear_num_key_heads", la.num_key_heads),
                ("linear_num_value_heads", la.num_value_heads),
                ("linear_key_head_dim", la.key_head_dim),
                ("linear_value_head_dim", la.value_head_dim),
                ("linear_conv_kernel_dim", la.conv_kernel),
            ]);
        }
        if let RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } = &self.rope.scaling
        {
            dims.push((
                "original_max_position_embeddings",
                *original_max_position_embeddings,
            ));
            fields.positive_f32("rope_scaling.factor", *factor)?;
            fields.positive_f32("rope_scaling.low_freq_factor", *low_freq_factor)?;
            fields.positive_f32("rope_scaling.high_freq_factor", *high_freq_factor)?;
        }
        if let RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            attention_factor,
            ..
        } = &self.rope.scaling
        {
            dims.push((
                "original_max_position_embeddings",
                *original_max_position_embeddings,
            ));
            fields.positive_f32("rope_scaling.factor", *factor)?;
            fields.positive_f32("rope_scaling.attention_factor", *attention_factor)?;
        }
        if let Some(quantization) = &self.quantization {
            quantization.check(&fields)?;
        }
        for (key, value) in dims {
            fields.bounded(key, value)?;
        }
        if self.layer_windows.len() != self.num_hidden_layers {
            return Err(fields.invalid(
                "layer_windows",
                format!("{} entries", self.layer_windows.len()),
                format!(
                    "one per layer (num_hidden_layers = {})",
                    self.num_hidden_layers
                ),
            ));
        }
        if let Some(window) = self
            .layer_windows
            .iter()
            .flatten()
            .find(|w| **w == 0 || **w > self.max_position_embeddings)
        {
            return Err(fields.invalid(
                "sliding_window",
                *window,
                format!(
                    "a window in 1..=max_position_embeddings ({})",
                    self.max_position_embeddings
                ),
            ));
        }
        fields.positive_f32("rms_norm_eps", self.rms_norm_eps)?;
        fields.positive_f32("rope_theta", self.rope.theta)?;
        // The structure the parser checks key by key (positive dims, kv heads dividing heads,
        // an even head_dim, top-k within the experts, ...): a hand-built config passes the
        // same rules, refused by the same key, at build instead of at a twin's first step.
        check_shape(self, &fields)
    }
}

/// Every rule of the config's structure: the decoder's, then the MoE's and the linear
/// attention's where the config has them.
fn check_shape(config: &ModelConfig, fields: &Fields<'_>) -> Result<(), ConfigError> {
    check_decoder(config, fields)?;
    if let Some(moe) = &config.moe {
        check_moe(moe, config.num_hidden_layers, fields)?;
    }
    if let Some(la) = &config.linear_attn {
        check_linear_attn(la, fields)?;
    }
    Ok(())
}

/// Positive dimensions, kv heads dividing heads, an even head_dim with an even positive rotary
/// dim, and one layer type per layer.
fn check_decoder(config: &ModelConfig, fields: &Fields<'_>) -> Result<(), ConfigError> {
    let positive = [
        ("hidden_size", config.hidden_size),
        ("intermediate_size", config.intermediate_size),
        ("num_hidden_layers", config.num_hidden_layers),
        ("num_attention_heads", config.num_attention_heads),
        ("num_key_value_heads", config.num_key_value_heads),
        ("head_dim", config.head_dim),
        ("vocab_size", config.vocab_size),
        ("max_position_embeddings", config.max_position_embeddings),
    ];
    for (key, value) in positive {
        if value == 0 {
            return Err(fields.invalid(key, 0, "a positive integer"));
        }
    }
    if !config
        .num_attention_heads
        .is_multiple_of(config.num_key_value_heads)
    {
        return Err(fields.invalid(
            "num_key_value_heads",
            config.num_key_value_heads,
            format!(
                "a positive divisor of num_attention_heads ({})",
                config.num_attention_heads
            ),
        ));
    }
    if !config.head_dim.is_multiple_of(2) {
        return Err(fields.invalid(
            "head_dim",
            config.head_dim,
            "an even positive integer (rope rotates channel pairs)",
        ));
    }
    let rotary_dim = config.rope.rotary_dim(config.head_dim);
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > config.head_dim {
        return Err(fields.invalid(
            "partial_rotary_factor",
            config.rope.partial_rotary_factor,
            format!(
                "a factor giving an even positive rotary dim of at most head_dim {} (got {rotary_dim})",
                config.head_dim
            ),
        ));
    }
    if config.layer_types.len() != config.num_hidden_layers {
        return Err(fields.invalid(
            "layer_types",
            format!("{} entries", config.layer_types.len()),
            format!(
                "one per layer (num_hidden_layers = {})",
                config.num_hidden_layers
            ),
        ));
    }
    Ok(())
}

/// Positive expert counts and sizes, top-k within the experts, MLP-only layers that exist.
fn check_moe(
    moe: &MoeConfig,
    num_hidden_layers: usize,
    fields: &Fields<'_>,
) -> Result<(), ConfigError> {
    if moe.num_experts == 0 {
        return Err(fields.invalid("num_experts", 0, "a positive integer"));
    }
    if moe.experts_per_token == 0 || moe.experts_per_token > moe.num_experts {
        return Err(fields.invalid(
            "num_experts_per_tok",
            moe.experts_per_token,
            format!("between 1 and num_experts ({})", moe.num_experts),
        ));
    }
    if moe.moe_intermediate_size == 0 {
        return Err(fields.invalid("moe_intermediate_size", 0, "a positive integer"));
    }
    if moe.decoder_sparse_step == 0 {
        return Err(fields.invalid("decoder_sparse_step", 0, "a positive integer"));
    }
    if moe.shared_expert_intermediate_size == Some(0) {
        return Err(fields.invalid(
            "shared_expert_intermediate_size",
            0,
            "a positive integer (None: no shared expert)",
        ));
    }
    if let Some(layer) = moe
        .mlp_only_layers
        .iter()
        .find(|l| **l >= num_hidden_layers)
    {
        return Err(fields.invalid(
            "mlp_only_layers",
            format!("entry {layer}"),
            format!("layer indices below num_hidden_layers ({num_hidden_layers})"),
        ));
    }
    Ok(())
}

/// Positive linear-attention dims, value heads a multiple of key heads.
fn check_linear_attn(la: &LinearAttnConfig, fields: &Fields<'_>) -> Result<(), ConfigError> {
    let positive = [
        ("linear_num_key_heads", la.num_key_heads),
        ("linear_num_value_heads", la.num_value_heads),
        ("linear_key_head_dim", la.key_head_dim),
        ("linear_value_head_dim", la.value_head_dim),
        ("linear_conv_kernel_dim", la.conv_kernel),
    ];
    for (key, value) in positive {
        if value == 0 {
            return Err(fields.invalid(key, 0, "a positive integer"));
        }
    }
    if !la.num_value_heads.is_multiple_of(la.num_key_heads) {
        return Err(fields.invalid(
            "linear_num_value_heads",
            la.num_value_heads,
            format!(
                "a multiple of linear_num_key_heads ({}): each key head serves a group of \
                 value heads",
                la.num_key_heads
            ),
        ));
    }
    Ok(())
}
