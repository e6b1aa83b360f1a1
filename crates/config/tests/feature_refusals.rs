//! Features solder does not model (rope types, activations, biases,
//! quantization) are refused by value, naming the file and the key.

mod common;

use common::{llama_with, qwen3_with, refusal};
use serde_json::json;

#[test]
fn dynamic_and_longrope_are_refused_by_name() {
    // Dynamic NTK: transformers recomputes inv_freq per step from the batch's longest sequence.
    refusal(
        qwen3_with(|m| {
            m.insert(
                "rope_parameters".into(),
                json!({"rope_type": "dynamic", "rope_theta": 1e6, "factor": 2.0}),
            );
        }),
        &[
            "rope_parameters.rope_type",
            "rope type `dynamic` (dynamic NTK) is not modelled",
            "batch's longest sequence",
        ],
    );
    refusal(
        llama_with(|m| {
            m.insert(
                "rope_scaling".into(),
                json!({"type": "longrope", "short_factor": [1.0], "long_factor": [2.0],
                       "original_max_position_embeddings": 4096}),
            );
        }),
        &[
            "rope_scaling.type",
            "rope type `longrope` is not yet modelled",
        ],
    );
}

#[test]
fn malformed_yarn_is_refused() {
    let yarn =
        |block: serde_json::Value| llama_with(|m| drop(m.insert("rope_scaling".into(), block)));
    refusal(
        yarn(json!({"type": "yarn", "original_max_position_embeddings": 32})),
        &["missing required key `rope_scaling.factor`"],
    );
    refusal(
        yarn(json!({"type": "yarn", "factor": 4.0, "low_freq_factor": 1.0})),
        &[
            "unknown key `rope_scaling.low_freq_factor`",
            "rope type `yarn`",
        ],
    );
    refusal(
        yarn(json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 0})),
        &["rope_scaling.original_max_position_embeddings"],
    );
    refusal(
        yarn(json!({"type": "yarn", "factor": 4.0, "beta_slow": -1.0})),
        &["rope_scaling.beta_slow", "a finite positive number"],
    );
    refusal(
        yarn(json!({"type": "yarn", "factor": 4.0, "attention_factor": 0.0})),
        &["rope_scaling.attention_factor"],
    );
    refusal(
        yarn(json!({"type": "yarn", "factor": 4.0, "truncate": "no"})),
        &["rope_scaling.truncate", "a boolean"],
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
