//! Which model family a config describes: `model_type` decides, `architectures` must agree.

use crate::fields::Fields;
use crate::ConfigError;

/// A decoder family solder models: the dense ones, Qwen3-MoE, and the Qwen3-Next hybrid
/// (Gated DeltaNet + gated attention + MoE with a shared expert).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    Qwen3Next,
}

const ALL: [Family; 6] = [
    Family::Llama,
    Family::Mistral,
    Family::Qwen2,
    Family::Qwen3,
    Family::Qwen3Moe,
    Family::Qwen3Next,
];

/// `model_type`s that are known families solder does not model yet; refused by name.
const NOT_YET_MODELLED: &[&str] = &[];

impl Family {
    /// The `model_type` string of the family.
    pub fn as_str(&self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Mistral => "mistral",
            Family::Qwen2 => "qwen2",
            Family::Qwen3 => "qwen3",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Qwen3Next => "qwen3_next",
        }
    }

    /// The transformers class a causal-LM checkpoint of this family names in `architectures`.
    fn causal_lm_class(&self) -> &'static str {
        match self {
            Family::Llama => "LlamaForCausalLM",
            Family::Mistral => "MistralForCausalLM",
            Family::Qwen2 => "Qwen2ForCausalLM",
            Family::Qwen3 => "Qwen3ForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Qwen3Next => "Qwen3NextForCausalLM",
        }
    }

    fn from_model_type(model_type: &str) -> Option<Family> {
        ALL.into_iter().find(|family| family.as_str() == model_type)
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The family named by `model_type`; known-but-unmodelled families and unknown ones are refused.
pub(crate) fn family_of(fields: &Fields<'_>) -> Result<Family, ConfigError> {
    let model_type = fields.req_str("model_type")?;
    if let Some(family) = Family::from_model_type(model_type) {
        return Ok(family);
    }
    let file = fields.file().to_string();
    let model_type = model_type.to_string();
    if NOT_YET_MODELLED.contains(&model_type.as_str()) {
        Err(ConfigError::FamilyNotModelled { file, model_type })
    } else {
        Err(ConfigError::UnknownModelType { file, model_type })
    }
}

/// `architectures`, when given, must name the family's causal-LM class: another head (a
/// classifier) or another family's class means the weights are not what `model_type` says.
pub(crate) fn check_architectures(fields: &Fields<'_>, family: Family) -> Result<(), ConfigError> {
    let Some(classes) = fields.opt_str_array("architectures")? else {
        return Ok(());
    };
    let expected = family.causal_lm_class();
    match classes.iter().find(|class| **class != expected) {
        None => Ok(()),
        Some(other) => Err(fields.invalid(
            "architectures",
            format!("\"{other}\""),
            format!("{expected}, the causal LM of model_type \"{family}\""),
        )),
    }
}
