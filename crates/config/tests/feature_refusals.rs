//! Features solder does not model (rope types, sliding windows, activations, biases,
//! quantization) are refused by value, naming the file and the key.

mod common;

use common::{llama_with, parse_edited, qwen3_with, refusal};
use serde_json::{json, Value};
use solder_config::{ConfigError, ModelConfig};

#[test]
fn yarn_rope_is_refused() {
    refusal(
        llama_with(|m| {
            m.insert(
                "rope_scaling".into(),
                json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),
            );
        }),
        &["rope_scaling.type", "rope type `yarn` is not yet modelled"],
    );
    refusal(
        qwen3_with(|m| {
            m.insert(
                "rope_parameters".into(),
                json!({"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0}),
            );
        }),
        &[
            "rope_parameters.rope_type",
            "rope type `dynamic` is not yet modelled",
        ],
    );
}

#[test]
fn unknown_rope_field_is_refused() {
    refusal(
        llama_with(|m| {
            m.insert(
                "rope_scaling".into(),
                json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "beta_fast": 32}),
            );
        }),
        &["unknown key `rope_scaling.beta_fast`"],
    );
    refusal(
        qwen3_with(|m| {
            m.insert(
                "rope_parameters".into(),
                json!({"rope_type": "default", "rope_theta": 1e6, "mscale": 1.0}),
            );
        }),
        &["unknown key `rope_parameters.mscale`"],
    );
}

#[test]
fn llama3_rope_without_factor_is_refused() {
    refusal(
        llama_with(|m| {
            m.insert(
                "rope_scaling".into(),
                json!({"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
            );
        }),
        &["missing required key `rope_scaling.factor`"],
    );
}

#[test]
fn disagreeing_rope_theta_is_refused() {
    refusal(
        qwen3_with(|m| drop(m.insert("rope_theta".into(), json!(10000.0)))),
        &["`rope_theta`", "rope_parameters.rope_theta"],
    );
}

#[test]
fn use_sliding_window_true_is_refused() {
    refusal(
        qwen3_with(|m| drop(m.insert("use_sliding_window".into(), json!(true)))),
        &[
            "`use_sliding_window`",
            "sliding window attention is not yet modelled",
        ],
    );
}

#[test]
fn sliding_attention_layer_type_is_refused() {
    refusal(
        qwen3_with(|m| {
            m.insert(
                "layer_types".into(),
                json!(["full_attention", "sliding_attention", "full_attention"]),
            );
        }),
        &[
            "`layer_types`",
            "sliding window attention is not yet modelled",
        ],
    );
}

fn mistral_with_window(window: Option<Value>) -> Result<ModelConfig, ConfigError> {
    parse_edited("golden-llama-gqa.json", |m| {
        m.insert("model_type".into(), json!("mistral"));
        m.insert("architectures".into(), json!(["MistralForCausalLM"]));
        for llama_only in ["mlp_bias", "pretraining_tp"] {
            m.remove(llama_only);
        }
        match window {
            Some(window) => drop(m.insert("sliding_window".into(), window)),
            None => drop(m.remove("sliding_window")),
        }
    })
}

#[test]
fn mistral_real_sliding_window_is_refused() {
    // max_position_embeddings is 2048.
    assert!(mistral_with_window(Some(Value::Null)).is_ok());
    assert!(mistral_with_window(Some(json!(2048))).is_ok());
    refusal(
        mistral_with_window(Some(json!(1024))),
        &[
            "`sliding_window` = 1024",
            "sliding window attention is not yet modelled",
        ],
    );
}

#[test]
fn mistral_absent_window_is_transformers_default() {
    // Absent means MistralConfig's default 4096, no window over a 2048-token context.
    assert!(mistral_with_window(None).is_ok());
    let result = mistral_with_window(None).map(|c| c.max_position_embeddings);
    assert_eq!(result.ok(), Some(2048));
}

#[test]
fn gelu_activation_is_refused() {
    refusal(
        llama_with(|m| drop(m.insert("hidden_act".into(), json!("gelu")))),
        &["`hidden_act` = \"gelu\""],
    );
}

#[test]
fn mlp_bias_is_refused() {
    refusal(
        llama_with(|m| drop(m.insert("mlp_bias".into(), json!(true)))),
        &["`mlp_bias` = true"],
    );
}

#[test]
fn attention_dropout_and_pretraining_tp_are_refused() {
    refusal(
        llama_with(|m| drop(m.insert("attention_dropout".into(), json!(0.1)))),
        &["`attention_dropout` = 0.1"],
    );
    refusal(
        llama_with(|m| drop(m.insert("pretraining_tp".into(), json!(2)))),
        &["`pretraining_tp` = 2"],
    );
}

#[test]
fn quantization_config_is_refused() {
    refusal(
        llama_with(|m| {
            drop(m.insert(
                "quantization_config".into(),
                json!({"quant_method": "awq", "bits": 4}),
            ))
        }),
        &[
            "`quantization_config`",
            "quantized checkpoints are not yet modelled",
        ],
    );
}
