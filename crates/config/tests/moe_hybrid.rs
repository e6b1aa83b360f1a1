//! Qwen3-MoE and Qwen3-Next: the experts' and the hybrid stack's keys, their transformers
//! defaults, and every refusal naming the file and the key.

mod common;

use common::{fixture_value, moe_with, next_with, refusal, FILE};
use serde_json::json;
use solder_config::{ConfigError, LayerType, ModelConfig};

fn set(
    key: &str,
    value: serde_json::Value,
) -> impl FnOnce(&mut serde_json::Map<String, serde_json::Value>) {
    let key = key.to_string();
    move |m| drop(m.insert(key, value))
}

#[test]
fn unknown_key_in_a_moe_config_is_refused() {
    let err = refusal(
        moe_with(set("num_shared_experts", json!(2))),
        &["num_shared_experts", "qwen3_moe"],
    );
    assert!(matches!(err, ConfigError::UnknownKey { .. }), "{err:?}");
    // A Qwen3-Next key is not a Qwen3-MoE key.
    refusal(
        moe_with(set("shared_expert_intermediate_size", json!(64))),
        &["unknown key", "shared_expert_intermediate_size"],
    );
    let err = refusal(
        next_with(set("expert_bias", json!(true))),
        &["expert_bias", "qwen3_next"],
    );
    assert!(matches!(err, ConfigError::UnknownKey { .. }), "{err:?}");
}

#[test]
fn experts_per_token_beyond_the_experts_is_refused() {
    refusal(
        moe_with(set("num_experts_per_tok", json!(9))),
        &[
            "`num_experts_per_tok`",
            "9",
            "between 1 and num_experts (8)",
        ],
    );
    refusal(
        next_with(set("num_experts_per_tok", json!(0))),
        &["`num_experts_per_tok`", "between 1 and num_experts (8)"],
    );
}

#[test]
fn disagreeing_num_local_experts_is_refused() {
    let err = refusal(
        moe_with(set("num_experts", json!(16))),
        &["`num_local_experts`", "8", "num_experts (16)"],
    );
    assert!(matches!(err, ConfigError::InvalidValue { .. }), "{err:?}");
    // Both present and equal is fine; either alone is fine.
    let config = moe_with(set("num_experts", json!(8))).expect("agreeing alias loads");
    assert_eq!(config.moe.expect("experts").num_experts, 8);
}

#[test]
fn missing_or_zero_experts_are_refused() {
    refusal(
        moe_with(|m| drop(m.remove("num_local_experts"))),
        &["missing required key `num_experts`"],
    );
    refusal(
        next_with(set("num_experts", json!(0))),
        &["`num_experts`", "a positive integer"],
    );
    refusal(
        moe_with(|m| drop(m.remove("moe_intermediate_size"))),
        &["`moe_intermediate_size`"],
    );
}

#[test]
fn mlp_only_layers_out_of_range_are_refused() {
    refusal(
        moe_with(set("mlp_only_layers", json!([0, 2]))),
        &[
            "`mlp_only_layers`",
            "entry 2",
            "below num_hidden_layers (2)",
        ],
    );
    refusal(
        moe_with(set("mlp_only_layers", json!([-1]))),
        &["`mlp_only_layers`", "an array of non-negative integers"],
    );
}

#[test]
fn zero_decoder_sparse_step_is_refused() {
    refusal(
        moe_with(set("decoder_sparse_step", json!(0))),
        &["`decoder_sparse_step`", "a positive integer"],
    );
}

#[test]
fn sparse_layers_follow_mlp_only_layers_and_the_step() {
    let config = parse_fixture_edited("qwen3-30b-a3b.json", |m| {
        m.insert("decoder_sparse_step".into(), json!(2));
        m.insert("mlp_only_layers".into(), json!([3, 47]));
    });
    let moe = config.moe.expect("experts");
    let sparse: Vec<usize> = (0..config.num_hidden_layers)
        .filter(|layer| moe.is_sparse_layer(*layer))
        .collect();
    // Odd layers (i + 1 even), less 3 and 47.
    let expected: Vec<usize> = (0..48)
        .filter(|l| l % 2 == 1 && *l != 3 && *l != 47)
        .collect();
    assert_eq!(sparse, expected);
}

fn parse_fixture_edited(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) -> ModelConfig {
    common::parse_edited(name, edit).unwrap_or_else(|err| panic!("{name} edited: {err}"))
}

#[test]
fn norm_topk_prob_defaults_per_family() {
    let moe = moe_with(|m| drop(m.remove("norm_topk_prob"))).expect("loads");
    assert!(
        !moe.moe.expect("experts").norm_topk_prob,
        "Qwen3MoeConfig: False"
    );
    let next = next_with(|m| drop(m.remove("norm_topk_prob"))).expect("loads");
    assert!(
        next.moe.expect("experts").norm_topk_prob,
        "Qwen3NextConfig: True"
    );
}

#[test]
fn layer_types_of_the_wrong_length_are_refused() {
    refusal(
        next_with(set(
            "layer_types",
            json!(["linear_attention", "full_attention"]),
        )),
        &["`layer_types`", "an array of 2", "num_hidden_layers = 4"],
    );
}

#[test]
fn layer_types_disagreeing_with_the_interval_are_refused() {
    refusal(
        next_with(set("full_attention_interval", json!(4))),
        &[
            "`full_attention_interval`",
            "4",
            "agrees with layer_types",
            "layer 1",
        ],
    );
    refusal(
        next_with(set("full_attention_interval", json!(0))),
        &["`full_attention_interval`", "a positive integer"],
    );
}

#[test]
fn unknown_layer_type_is_refused() {
    refusal(
        next_with(set(
            "layer_types",
            json!([
                "linear_attention",
                "sliding_attention",
                "linear_attention",
                "full_attention"
            ]),
        )),
        &["`layer_types`", "sliding_attention", "not modelled"],
    );
}

#[test]
fn layer_types_default_to_the_interval() {
    let config = next_with(|m| drop(m.remove("layer_types"))).expect("interval alone");
    use LayerType::{FullAttention as F, LinearAttention as L};
    assert_eq!(config.layer_types, vec![L, F, L, F]);
    // Neither key: transformers' interval of 4.
    let config = next_with(|m| {
        m.remove("layer_types");
        m.remove("full_attention_interval");
    })
    .expect("defaults");
    assert_eq!(config.layer_types, vec![L, L, L, F]);
    // layer_types alone decides.
    let config = next_with(|m| {
        m.remove("full_attention_interval");
        m.insert("layer_types".into(), json!(vec!["full_attention"; 4]));
    })
    .expect("layer_types alone");
    assert_eq!(config.layer_types, vec![F; 4]);
}

#[test]
fn value_heads_not_a_multiple_of_key_heads_are_refused() {
    refusal(
        next_with(set("linear_num_value_heads", json!(3))),
        &[
            "`linear_num_value_heads`",
            "3",
            "a multiple of linear_num_key_heads (2)",
        ],
    );
}

#[test]
fn zero_or_missing_linear_dims_are_refused() {
    for key in [
        "linear_conv_kernel_dim",
        "linear_key_head_dim",
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_value_head_dim",
    ] {
        refusal(
            next_with(set(key, json!(0))),
            &[&format!("`{key}`"), "a positive integer"],
        );
        refusal(
            next_with(|m| drop(m.remove(key))),
            &[&format!("missing required key `{key}`")],
        );
    }
}

#[test]
fn shared_expert_size_zero_is_none_and_absent_is_refused() {
    let config = next_with(set("shared_expert_intermediate_size", json!(0))).expect("loads");
    assert_eq!(
        config.moe.expect("experts").shared_expert_intermediate_size,
        None
    );
    refusal(
        next_with(|m| drop(m.remove("shared_expert_intermediate_size"))),
        &["missing required key `shared_expert_intermediate_size`"],
    );
}

#[test]
fn qwen3_next_rope_and_head_dim_defaults_follow_transformers() {
    let config = next_with(|m| {
        m.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 10000.0}),
        );
        m.remove("head_dim");
    })
    .expect("defaults");
    assert_eq!(config.rope.partial_rotary_factor, 0.25);
    assert_eq!(config.head_dim, 256);
    assert_eq!(config.rope.rotary_dim(config.head_dim), 64);
    // Top-level partial_rotary_factor, as the published checkpoint writes it.
    let config = next_with(|m| {
        m.insert(
            "rope_parameters".into(),
            json!({"rope_type": "default", "rope_theta": 10000.0}),
        );
        m.insert("partial_rotary_factor".into(), json!(0.5));
    })
    .expect("top level");
    assert_eq!(config.rope.rotary_dim(config.head_dim), 16);
    // Qwen3-MoE rotates the whole head.
    let moe = moe_with(|_| {}).expect("loads");
    assert_eq!(moe.rope.partial_rotary_factor, 1.0);
}

#[test]
fn disagreeing_partial_rotary_factor_is_refused() {
    refusal(
        next_with(set("partial_rotary_factor", json!(0.5))),
        &[
            "`partial_rotary_factor`",
            "rope_parameters.partial_rotary_factor (0.25)",
        ],
    );
}

#[test]
fn moe_sliding_window_is_every_layer_and_wrong_architecture_is_refused() {
    // transformers' Qwen3-MoE windows every layer; it never reads max_window_layers.
    let windowed = moe_with(|m| {
        m.insert("use_sliding_window".into(), json!(true));
        m.insert("sliding_window".into(), json!(512));
    })
    .expect("loads");
    assert!(windowed.layer_windows.iter().all(|w| *w == Some(512)));
    assert_eq!(windowed.kv_window(), Some(512));
    refusal(
        moe_with(set("architectures", json!(["Qwen3ForCausalLM"]))),
        &["`architectures`", "Qwen3MoeForCausalLM"],
    );
    refusal(
        next_with(set("architectures", json!(["Qwen3MoeForCausalLM"]))),
        &["`architectures`", "Qwen3NextForCausalLM"],
    );
}

#[test]
fn no_value_of_any_type_panics_in_moe_configs() {
    let junk = [
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(1.5),
        json!(1e300),
        json!(u64::MAX),
        json!("x"),
        json!([]),
        json!([1]),
        json!([u64::MAX]),
        json!({}),
    ];
    for name in [
        "golden-qwen3-moe.json",
        "golden-qwen3-next.json",
        "qwen3-next-80b-a3b.json",
    ] {
        let base = fixture_value(name);
        let keys: Vec<String> = base.as_object().expect("object").keys().cloned().collect();
        for key in keys {
            for value in &junk {
                let mut edited = base.clone();
                edited
                    .as_object_mut()
                    .expect("object")
                    .insert(key.clone(), value.clone());
                // Ok or Err are both fine; a panic fails the test.
                if let Ok(config) = ModelConfig::from_json_str(&edited.to_string(), FILE) {
                    if let Some(moe) = &config.moe {
                        let _ = (0..config.num_hidden_layers)
                            .filter(|l| moe.is_sparse_layer(*l))
                            .count();
                    }
                    if let Some(linear) = &config.linear_attn {
                        let _ = linear.conv_dim();
                    }
                }
            }
        }
    }
}
