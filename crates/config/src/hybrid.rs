//! Qwen3-Next's hybrid stack: which layers are full (gated) attention and which are Gated
//! DeltaNet linear attention, and the linear attention's dims. Invariant: `layer_types` has
//! one entry per layer, and a [`LinearAttnConfig`] built here has every dim non-zero,
//! `num_value_heads` a multiple of `num_key_heads`, and a `conv_dim` that fits in `usize`.

use serde_json::Value;

use crate::fields::Fields;
use crate::{ConfigError, Family};

/// The token mixer of one layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Softmax attention over the KV cache (`"full_attention"`).
    FullAttention,
    /// Gated DeltaNet with its recurrent and conv state (`"linear_attention"`).
    LinearAttention,
}

/// The Gated DeltaNet dims of Qwen3-Next's linear-attention layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearAttnConfig {
    /// `linear_num_key_heads` (q and k heads).
    pub num_key_heads: usize,
    /// `linear_num_value_heads`, a multiple of `num_key_heads`.
    pub num_value_heads: usize,
    /// `linear_key_head_dim` (q and k).
    pub key_head_dim: usize,
    /// `linear_value_head_dim`.
    pub value_head_dim: usize,
    /// `linear_conv_kernel_dim`: taps of the causal depthwise conv over q, k and v.
    pub conv_kernel: usize,
}

impl LinearAttnConfig {
    /// Width of q (and of k): `num_key_heads * key_head_dim`. The widths saturate rather
    /// than wrap on hand-built dims outside `DIM_BOUNDS` (`ModelConfig::check_bounds`).
    pub fn key_dim(&self) -> usize {
        self.num_key_heads.saturating_mul(self.key_head_dim)
    }

    /// Width of v (and of the gate z): `num_value_heads * value_head_dim`.
    pub fn value_dim(&self) -> usize {
        self.num_value_heads.saturating_mul(self.value_head_dim)
    }

    /// Channels of the conv over the concatenated q, k, v: `2 * key_dim + value_dim`.
    pub fn conv_dim(&self) -> usize {
        self.key_dim()
            .saturating_mul(2)
            .saturating_add(self.value_dim())
    }
}

/// transformers' `full_attention_interval` when neither it nor `layer_types` is given.
const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

/// One entry per layer: all full attention except for Qwen3-Next, where `layer_types` or
/// `full_attention_interval` decides (both given must agree).
pub(crate) fn parse_layer_types(
    fields: &Fields<'_>,
    family: Family,
    num_hidden_layers: usize,
) -> Result<Vec<LayerType>, ConfigError> {
    if family != Family::Qwen3Next {
        // The dense families' and Qwen3-MoE's `layer_types` are checked by `features`.
        return Ok(vec![LayerType::FullAttention; num_hidden_layers]);
    }
    let interval = fields.opt_usize("full_attention_interval")?;
    if interval == Some(0) {
        return Err(fields.invalid("full_attention_interval", 0, "a positive integer"));
    }
    let from_interval = |interval: usize| -> Vec<LayerType> {
        (0..num_hidden_layers)
            .map(|layer| match (layer + 1) % interval {
                0 => LayerType::FullAttention,
                _ => LayerType::LinearAttention,
            })
            .collect()
    };
    let Some(names) = fields.opt_str_array("layer_types")? else {
        return Ok(from_interval(
            interval.unwrap_or(DEFAULT_FULL_ATTENTION_INTERVAL),
        ));
    };
    if names.len() != num_hidden_layers {
        return Err(fields.invalid(
            "layer_types",
            format!("an array of {}", names.len()),
            format!("one entry per layer (num_hidden_layers = {num_hidden_layers})"),
        ));
    }
    let layer_types = names
        .iter()
        .map(|name| match *name {
            "full_attention" => Ok(LayerType::FullAttention),
            "linear_attention" => Ok(LayerType::LinearAttention),
            other => Err(fields.unsupported(
                "layer_types",
                &Value::from(other),
                format!(
                    "layer type `{other}` is not modelled for qwen3_next \
                     (full_attention or linear_attention)"
                ),
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(interval) = interval {
        let expected = from_interval(interval);
        if let Some(layer) = (0..num_hidden_layers).find(|l| expected[*l] != layer_types[*l]) {
            return Err(fields.invalid(
                "full_attention_interval",
                interval,
                format!(
                    "an interval that agrees with layer_types (layer {layer} is \"{}\")",
                    names[layer]
                ),
            ));
        }
    }
    Ok(layer_types)
}

/// Qwen3-Next's Gated DeltaNet dims, `None` for every other family. The dims are required,
/// as `hidden_size` is: they set the shapes of the checkpoint's tensors.
pub(crate) fn parse_linear_attn(
    fields: &Fields<'_>,
    family: Family,
) -> Result<Option<LinearAttnConfig>, ConfigError> {
    if family != Family::Qwen3Next {
        return Ok(None);
    }
    let positive = |key: &str| -> Result<usize, ConfigError> {
        match fields.req_usize(key)? {
            0 => Err(fields.invalid(key, 0, "a positive integer")),
            value => Ok(value),
        }
    };
    let config = LinearAttnConfig {
        num_key_heads: positive("linear_num_key_heads")?,
        num_value_heads: positive("linear_num_value_heads")?,
        key_head_dim: positive("linear_key_head_dim")?,
        value_head_dim: positive("linear_value_head_dim")?,
        conv_kernel: positive("linear_conv_kernel_dim")?,
    };
    if !config.num_value_heads.is_multiple_of(config.num_key_heads) {
        return Err(fields.invalid(
            "linear_num_value_heads",
            config.num_value_heads,
            format!(
                "a multiple of linear_num_key_heads ({}): each key head serves a group of \
                 value heads",
                config.num_key_heads
            ),
        ));
    }
    let conv_dim = config
        .num_key_heads
        .checked_mul(config.key_head_dim)
        .and_then(|key_dim| key_dim.checked_mul(2))
        .zip(config.num_value_heads.checked_mul(config.value_head_dim))
        .and_then(|(keys, values)| keys.checked_add(values));
    if conv_dim.is_none() {
        return Err(fields.invalid(
            "linear_value_head_dim",
            config.value_head_dim,
            "linear attention widths that fit in memory sizes",
        ));
    }
    Ok(Some(config))
}
