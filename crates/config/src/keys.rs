//! The classification of every top-level key per family: used, ignored with a reason, or
//! refused. A key in no table refuses the load, so nothing in a config is silently dropped.

use crate::fields::Fields;
use crate::{ConfigError, Family};

/// How a key of `config.json` was treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyClass {
    /// Read into `ModelConfig` or checked against what solder models.
    Used,
    /// Present but not needed to run the step, with the one-line reason.
    Ignored(&'static str),
}

/// One top-level key of the file and its classification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyReport {
    pub key: String,
    pub class: KeyClass,
}

#[derive(Clone, Copy)]
enum Rule {
    Used,
    Ignored(&'static str),
}

const TOKENIZER: &str = "tokenizer's business, not the step's";
const TRAINING: &str = "training only";

/// Keys every family shares.
const COMMON: &[(&str, Rule)] = &[
    ("model_type", Rule::Used),
    ("architectures", Rule::Used),
    ("hidden_size", Rule::Used),
    ("intermediate_size", Rule::Used),
    ("num_hidden_layers", Rule::Used),
    ("num_attention_heads", Rule::Used),
    ("num_key_value_heads", Rule::Used),
    ("head_dim", Rule::Used),
    ("vocab_size", Rule::Used),
    ("max_position_embeddings", Rule::Used),
    ("rms_norm_eps", Rule::Used),
    ("hidden_act", Rule::Used),
    ("tie_word_embeddings", Rule::Used),
    ("rope_theta", Rule::Used),
    ("rope_scaling", Rule::Used),
    ("rope_parameters", Rule::Used),
    ("partial_rotary_factor", Rule::Used),
    ("attention_dropout", Rule::Used),
    (
        "torch_dtype",
        Rule::Ignored("solder serves bf16 weights whatever the checkpoint dtype"),
    ),
    (
        "dtype",
        Rule::Ignored("solder serves bf16 weights whatever the checkpoint dtype"),
    ),
    (
        "transformers_version",
        Rule::Ignored("version of the library that wrote the file"),
    ),
    (
        "_name_or_path",
        Rule::Ignored("where the checkpoint came from"),
    ),
    // Hub checkpoints exported for the browser (SmolLM2's instruct models) carry it.
    (
        "transformers.js_config",
        Rule::Ignored("settings of transformers.js, the browser runtime"),
    ),
    ("bos_token_id", Rule::Ignored(TOKENIZER)),
    ("eos_token_id", Rule::Ignored(TOKENIZER)),
    ("pad_token_id", Rule::Ignored(TOKENIZER)),
    // Written by transformers' GGUF conversion and by some exporters.
    ("unk_token_id", Rule::Ignored(TOKENIZER)),
    (
        "use_cache",
        Rule::Ignored("solder always decodes with a KV cache"),
    ),
    ("initializer_range", Rule::Ignored(TRAINING)),
    (
        "output_router_logits",
        Rule::Ignored("router loss for training; a dense model has no router"),
    ),
    (
        "output_attentions",
        Rule::Ignored("debug output of the transformers forward"),
    ),
    (
        "output_hidden_states",
        Rule::Ignored("debug output of the transformers forward"),
    ),
    (
        "return_dict",
        Rule::Ignored("output format of the transformers forward"),
    ),
    // Read by `quant`, which classifies each key inside it.
    ("quantization_config", Rule::Used),
];

const LLAMA: &[(&str, Rule)] = &[
    ("attention_bias", Rule::Used),
    ("mlp_bias", Rule::Used),
    ("pretraining_tp", Rule::Used),
    // nanotron's keys, in SmolLM2's published configs; transformers' Llama reads neither.
    (
        "is_llama_config",
        Rule::Ignored("nanotron's marker; transformers' Llama never reads it"),
    ),
    (
        "rope_interleaved",
        Rule::Ignored(
            "nanotron's rope layout; transformers' Llama never reads it and always rotates halves",
        ),
    ),
];

const MISTRAL: &[(&str, Rule)] = &[
    ("attention_bias", Rule::Used),
    ("sliding_window", Rule::Used),
];

/// Qwen2 and Qwen3 share the sliding-window keys (read by `window`).
const QWEN_WINDOW: &[(&str, Rule)] = &[
    ("use_sliding_window", Rule::Used),
    ("layer_types", Rule::Used),
    ("sliding_window", Rule::Used),
    ("max_window_layers", Rule::Used),
];

/// Qwen3-MoE windows every layer through `use_sliding_window`; its model never reads
/// `max_window_layers` (found before `QWEN_WINDOW`).
const QWEN3_MOE: &[(&str, Rule)] = &[(
    "max_window_layers",
    Rule::Ignored("transformers' Qwen3-MoE never reads it: use_sliding_window windows every layer"),
)];

const QWEN3: &[(&str, Rule)] = &[("attention_bias", Rule::Used)];

/// The routed-expert keys Qwen3-MoE and Qwen3-Next share; found before `COMMON`, so the
/// router's training keys get their MoE reason here.
const MOE: &[(&str, Rule)] = &[
    ("num_experts", Rule::Used),
    // transformers 5 writes `num_experts` under this name (Qwen3MoeConfig.attribute_map).
    ("num_local_experts", Rule::Used),
    ("num_experts_per_tok", Rule::Used),
    ("moe_intermediate_size", Rule::Used),
    ("norm_topk_prob", Rule::Used),
    ("decoder_sparse_step", Rule::Used),
    ("mlp_only_layers", Rule::Used),
    ("router_aux_loss_coef", Rule::Ignored(TRAINING)),
    ("output_router_logits", Rule::Ignored(TRAINING)),
];

const NO_WINDOW: &str = "transformers' Qwen3-Next never reads it: the family has no sliding window";

/// Qwen3-Next: the shared expert, the per-layer attention kind and the Gated DeltaNet dims.
const QWEN3_NEXT: &[(&str, Rule)] = &[
    ("shared_expert_intermediate_size", Rule::Used),
    ("layer_types", Rule::Used),
    ("full_attention_interval", Rule::Used),
    ("linear_conv_kernel_dim", Rule::Used),
    ("linear_key_head_dim", Rule::Used),
    ("linear_value_head_dim", Rule::Used),
    ("linear_num_key_heads", Rule::Used),
    ("linear_num_value_heads", Rule::Used),
    ("use_sliding_window", Rule::Ignored(NO_WINDOW)),
    ("sliding_window", Rule::Ignored(NO_WINDOW)),
    ("max_window_layers", Rule::Ignored(NO_WINDOW)),
];

fn rule(family: Family, key: &str) -> Option<Rule> {
    let family_tables: &[&[(&str, Rule)]] = match family {
        Family::Llama => &[LLAMA],
        Family::Mistral => &[MISTRAL],
        Family::Qwen2 => &[QWEN_WINDOW],
        Family::Qwen3 => &[QWEN_WINDOW, QWEN3],
        Family::Qwen3Moe => &[MOE, QWEN3_MOE, QWEN_WINDOW, QWEN3],
        Family::Qwen3Next => &[MOE, QWEN3_NEXT, QWEN3],
    };
    // The family's own tables first: a family may give a shared key its own reason.
    family_tables
        .iter()
        .copied()
        .chain(std::iter::once(COMMON))
        .flat_map(|table| table.iter())
        .find(|(name, _)| *name == key)
        .map(|(_, rule)| *rule)
}

/// Classifies every top-level key, sorted by key; the first unknown or refused key (in key
/// order, so the message is the same run after run) refuses the load.
pub(crate) fn classify(family: Family, fields: &Fields<'_>) -> Result<Vec<KeyReport>, ConfigError> {
    let mut keys: Vec<&str> = fields.keys().collect();
    // serde_json may preserve file order (feature `preserve_order`); reports are by key.
    keys.sort_unstable();
    keys.into_iter()
        .map(|key| {
            let class = match rule(family, key) {
                None => {
                    return Err(ConfigError::UnknownKey {
                        file: fields.file().to_string(),
                        key: key.to_string(),
                        family: family.as_str().to_string(),
                    })
                }
                Some(Rule::Used) => KeyClass::Used,
                Some(Rule::Ignored(reason)) => KeyClass::Ignored(reason),
            };
            Ok(KeyReport {
                key: key.to_string(),
                class,
            })
        })
        .collect()
}
