//! Attention and MLP features a config may ask for, checked against what solder models:
//! activation, biases, dropout, tensor-parallel split. Anything that would change the step's
//! maths and is not modelled is refused by value. Sliding windows and the dense families'
//! `layer_types` are read by [`window`](crate::window).

use serde_json::Value;

use crate::fields::Fields;
use crate::{ConfigError, Family};

/// Whether q/k/v carry a bias, after refusing every unmodelled feature of the family.
pub(crate) fn check_features(fields: &Fields<'_>, family: Family) -> Result<bool, ConfigError> {
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
            Ok(false)
        }
        // Qwen2's q/k/v projections always carry a bias.
        Family::Qwen2 => Ok(true),
        Family::Qwen3 | Family::Qwen3Moe | Family::Qwen3Next => {
            Ok(fields.opt_bool("attention_bias")?.unwrap_or(false))
        }
    }
}

/// An error naming the key's value as found in the file.
fn refuse(fields: &Fields<'_>, key: &str, reason: &str) -> ConfigError {
    let value = fields.value(key).cloned().unwrap_or(Value::Null);
    fields.unsupported(key, &value, reason)
}
