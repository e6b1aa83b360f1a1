//! Attention and MLP features a config may ask for, checked against what solder models:
//! activation, biases, dropout, tensor-parallel split, sliding windows, per-layer types.
//! Anything that would change the step's maths and is not modelled is refused by value.

use serde_json::Value;

use crate::fields::Fields;
use crate::{ConfigError, Family};

/// The transformers default sliding window of `MistralConfig` when the key is absent.
const MISTRAL_DEFAULT_SLIDING_WINDOW: usize = 4096;

const WINDOW_NOT_MODELLED: &str = "sliding window attention is not yet modelled";

/// Whether q/k/v carry a bias, after refusing every unmodelled feature of the family.
pub(crate) fn check_features(
    fields: &Fields<'_>,
    family: Family,
    num_hidden_layers: usize,
    max_position_embeddings: usize,
) -> Result<bool, ConfigError> {
    if let Some(act) = fields.opt_str("hidden_act")? {
        if act != "silu" {
            return Err(refuse(
                fields,
                "hidden_act",
                "only the silu activation is modelled",
            ));
        }
    }
    if let Some(dropout) = fields.opt_f64("attention_dropout")? {
        if dropout != 0.0 {
            return Err(refuse(
                fields,
                "attention_dropout",
                "only 0.0 is accepted: dropout is training only",
            ));
        }
    }
    match family {
        Family::Llama => {
            if fields.opt_bool("mlp_bias")? == Some(true) {
                return Err(refuse(
                    fields,
                    "mlp_bias",
                    "bias on the MLP projections is not yet modelled",
                ));
            }
            if let Some(tp) = fields.opt_usize("pretraining_tp")? {
                if tp != 1 {
                    return Err(refuse(
                        fields,
                        "pretraining_tp",
                        "only 1 is accepted: transformers splits the matmuls otherwise",
                    ));
                }
            }
            Ok(fields.opt_bool("attention_bias")?.unwrap_or(false))
        }
        Family::Mistral => {
            // MistralAttention builds its projections without bias whatever the config says.
            if fields.opt_bool("attention_bias")? == Some(true) {
                return Err(refuse(
                    fields,
                    "attention_bias",
                    "transformers' Mistral has no attention bias",
                ));
            }
            check_mistral_window(fields, max_position_embeddings)?;
            Ok(false)
        }
        Family::Qwen2 => {
            check_qwen_window(fields, num_hidden_layers)?;
            // Qwen2's q/k/v projections always carry a bias.
            Ok(true)
        }
        Family::Qwen3 | Family::Qwen3Moe => {
            check_qwen_window(fields, num_hidden_layers)?;
            Ok(fields.opt_bool("attention_bias")?.unwrap_or(false))
        }
        // No sliding window; `layer_types` is read by `hybrid`.
        Family::Qwen3Next => Ok(fields.opt_bool("attention_bias")?.unwrap_or(false)),
    }
}

/// An error naming the key's value as found in the file.
fn refuse(fields: &Fields<'_>, key: &str, reason: &str) -> ConfigError {
    let value = fields.value(key).cloned().unwrap_or(Value::Null);
    fields.unsupported(key, &value, reason)
}

/// Mistral: a window at least as long as the context never masks anything; a shorter one is
/// real and refused. Absent means transformers' default of 4096; `null` means none.
fn check_mistral_window(
    fields: &Fields<'_>,
    max_position_embeddings: usize,
) -> Result<(), ConfigError> {
    let window = match fields.opt_usize("sliding_window")? {
        Some(window) => Some(window),
        None if fields.keys().any(|key| key == "sliding_window") => None,
        None => Some(MISTRAL_DEFAULT_SLIDING_WINDOW),
    };
    match window {
        Some(window) if window < max_position_embeddings => Err(fields.unsupported(
            "sliding_window",
            &Value::from(window),
            format!(
                "{WINDOW_NOT_MODELLED} (a window shorter than max_position_embeddings \
                 {max_position_embeddings}; absent means transformers' default 4096)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Qwen2/Qwen3/Qwen3-MoE: the window is used only when `use_sliding_window` is true, which is refused;
/// transformers-5 `layer_types` must then be all full attention.
fn check_qwen_window(fields: &Fields<'_>, num_hidden_layers: usize) -> Result<(), ConfigError> {
    if fields.opt_bool("use_sliding_window")? == Some(true) {
        return Err(refuse(fields, "use_sliding_window", WINDOW_NOT_MODELLED));
    }
    let Some(layer_types) = fields.opt_str_array("layer_types")? else {
        return Ok(());
    };
    if layer_types.len() != num_hidden_layers {
        return Err(fields.invalid(
            "layer_types",
            format!("an array of {}", layer_types.len()),
            format!("one entry per layer (num_hidden_layers = {num_hidden_layers})"),
        ));
    }
    match layer_types.iter().find(|kind| **kind != "full_attention") {
        None => Ok(()),
        Some(&"sliding_attention") => Err(fields.unsupported(
            "layer_types",
            &Value::from("sliding_attention"),
            WINDOW_NOT_MODELLED,
        )),
        Some(other) => Err(fields.unsupported(
            "layer_types",
            &Value::from(*other),
            format!("layer type `{other}` is not yet modelled"),
        )),
    }
}
