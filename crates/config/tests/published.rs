//! Every published and golden config in `fixtures/` loads with the right dims, experts and
//! layer kinds.

use std::path::PathBuf;

use solder_config::{
    Family, KeyClass, LayerType, LinearAttnConfig, ModelConfig, MoeConfig, RopeScaling,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/configs")
        .join(name)
}

fn load(name: &str) -> ModelConfig {
    match ModelConfig::from_file(&fixture(name)) {
        Ok(config) => config,
        Err(err) => panic!("{name} should load: {err}"),
    }
}

#[test]
fn llama_3_1_8b_loads() {
    let config = load("llama-3.1-8b.json");
    assert_eq!(config.family, Family::Llama);
    assert_eq!(config.hidden_size, 4096);
    assert_eq!(config.intermediate_size, 14336);
    assert_eq!(config.num_hidden_layers, 32);
    assert_eq!(config.num_attention_heads, 32);
    assert_eq!(config.num_key_value_heads, 8);
    assert_eq!(config.head_dim, 128);
    assert_eq!(config.q_dim(), 4096);
    assert_eq!(config.kv_dim(), 1024);
    assert_eq!(config.vocab_size, 128256);
    assert!(!config.tie_word_embeddings);
    assert!(!config.attention_bias);
    assert!(!config.qk_norm);
    assert_eq!(config.rope.theta, 500000.0);
    assert!(matches!(config.rope.scaling, RopeScaling::Llama3 { factor, .. } if factor == 8.0));
}

#[test]
fn llama_3_2_1b_loads_tied_with_llama3_rope() {
    let config = load("llama-3.2-1b.json");
    assert_eq!(config.hidden_size, 2048);
    assert_eq!(config.num_hidden_layers, 16);
    assert_eq!(config.head_dim, 64);
    assert_eq!(config.kv_dim(), 512);
    assert!(config.tie_word_embeddings);
    assert_eq!(config.rms_norm_eps, 1e-5);
    assert_eq!(
        config.rope.scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    );
    assert_eq!(config.rope.rotary_dim(config.head_dim), 64);
    assert_eq!(config.rope.inv_freq(config.head_dim).len(), 32);
}

#[test]
fn qwen3_0_6b_loads_with_integer_theta() {
    let config = load("qwen3-0.6b.json");
    assert_eq!(config.family, Family::Qwen3);
    assert_eq!(config.hidden_size, 1024);
    assert_eq!(config.num_attention_heads, 16);
    assert_eq!(config.num_key_value_heads, 8);
    // head_dim is explicit and differs from hidden / heads = 64.
    assert_eq!(config.head_dim, 128);
    assert_eq!(config.q_dim(), 2048);
    assert_eq!(config.rope.theta, 1_000_000.0);
    assert_eq!(config.rope.scaling, RopeScaling::Default);
    assert!(config.tie_word_embeddings);
    assert!(config.qk_norm);
    assert!(!config.attention_bias);
}

#[test]
fn qwen3_8b_loads() {
    let config = load("qwen3-8b.json");
    assert_eq!(config.hidden_size, 4096);
    assert_eq!(config.intermediate_size, 12288);
    assert_eq!(config.num_hidden_layers, 36);
    assert_eq!(config.head_dim, 128);
    assert_eq!(config.max_position_embeddings, 40960);
    assert!(!config.tie_word_embeddings);
}

#[test]
fn golden_llama_gqa_loads_untied() {
    let config = load("golden-llama-gqa.json");
    assert_eq!(config.family, Family::Llama);
    assert_eq!(config.num_attention_heads, 8);
    assert_eq!(config.num_key_value_heads, 2);
    assert_eq!(config.head_dim, 32);
    assert_eq!(config.vocab_size, 512);
    assert!(!config.tie_word_embeddings);
    assert_eq!(config.rope.theta, 10000.0);
}

#[test]
fn golden_qwen3_dense_loads_rope_parameters() {
    let config = load("golden-qwen3-dense.json");
    assert_eq!(config.family, Family::Qwen3);
    assert_eq!(config.hidden_size, 256);
    assert_eq!(config.num_attention_heads, 4);
    assert_eq!(config.head_dim, 64);
    assert_eq!(config.num_hidden_layers, 3);
    assert_eq!(config.rope.theta, 1e6);
    assert_eq!(config.rope.scaling, RopeScaling::Default);
    assert_eq!(config.rope.partial_rotary_factor, 1.0);
    assert!(config.tie_word_embeddings);
    assert!(config.qk_norm);
}

#[test]
fn every_key_is_reported_sorted() {
    let config = load("golden-qwen3-dense.json");
    let keys: Vec<&str> = config
        .keys
        .iter()
        .map(|report| report.key.as_str())
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(keys, sorted);
    assert_eq!(keys.len(), 27);
    let class = |key: &str| config.keys.iter().find(|r| r.key == key).map(|r| r.class);
    assert_eq!(class("hidden_size"), Some(KeyClass::Used));
    assert_eq!(class("rope_parameters"), Some(KeyClass::Used));
    assert_eq!(
        class("initializer_range"),
        Some(KeyClass::Ignored("training only"))
    );
    assert!(matches!(class("dtype"), Some(KeyClass::Ignored(reason)) if reason.contains("bf16")));
}

#[test]
fn qwen3_30b_a3b_loads_as_moe() {
    let config = load("qwen3-30b-a3b.json");
    assert_eq!(config.family, Family::Qwen3Moe);
    assert_eq!(config.hidden_size, 2048);
    assert_eq!(config.intermediate_size, 6144);
    assert_eq!(config.num_hidden_layers, 48);
    assert_eq!(config.num_attention_heads, 32);
    assert_eq!(config.num_key_value_heads, 4);
    assert_eq!(config.head_dim, 128);
    assert_eq!(config.rope.theta, 1e6);
    assert_eq!(config.rope.rotary_dim(config.head_dim), 128);
    assert!(config.qk_norm);
    assert!(!config.zero_centred_norms);
    assert!(!config.attn_output_gate);
    assert!(config.linear_attn.is_none());
    assert_eq!(config.layer_types, vec![LayerType::FullAttention; 48]);
    let moe = config.moe.as_ref().expect("qwen3_moe has experts");
    assert_eq!(
        *moe,
        MoeConfig {
            num_experts: 128,
            experts_per_token: 8,
            moe_intermediate_size: 768,
            norm_topk_prob: true,
            decoder_sparse_step: 1,
            mlp_only_layers: vec![],
            shared_expert_intermediate_size: None,
        }
    );
    assert!((0..48).all(|layer| moe.is_sparse_layer(layer)));
    let class = |key: &str| config.keys.iter().find(|r| r.key == key).map(|r| r.class);
    assert_eq!(
        class("router_aux_loss_coef"),
        Some(KeyClass::Ignored("training only"))
    );
    assert_eq!(
        class("output_router_logits"),
        Some(KeyClass::Ignored("training only"))
    );
    assert_eq!(class("num_experts"), Some(KeyClass::Used));
}

#[test]
fn golden_qwen3_moe_reads_the_num_local_experts_alias() {
    let config = load("golden-qwen3-moe.json");
    assert_eq!(config.family, Family::Qwen3Moe);
    assert_eq!(config.head_dim, 32);
    assert_eq!(config.intermediate_size, 256);
    let moe = config.moe.expect("experts");
    assert_eq!(moe.num_experts, 8);
    assert_eq!(moe.experts_per_token, 2);
    assert_eq!(moe.moe_intermediate_size, 96);
    assert!(moe.norm_topk_prob);
    assert_eq!(moe.shared_expert_intermediate_size, None);
}

#[test]
fn qwen3_next_80b_a3b_loads_as_hybrid() {
    let config = load("qwen3-next-80b-a3b.json");
    assert_eq!(config.family, Family::Qwen3Next);
    assert_eq!(config.hidden_size, 2048);
    assert_eq!(config.intermediate_size, 5120);
    assert_eq!(config.num_hidden_layers, 48);
    assert_eq!(config.num_attention_heads, 16);
    assert_eq!(config.num_key_value_heads, 2);
    assert_eq!(config.head_dim, 256);
    assert_eq!(config.q_dim(), 4096);
    assert_eq!(config.rope.theta, 1e7);
    assert_eq!(config.rope.partial_rotary_factor, 0.25);
    assert_eq!(config.rope.rotary_dim(config.head_dim), 64);
    assert_eq!(config.rope.inv_freq(config.head_dim).len(), 32);
    assert!(config.qk_norm);
    assert!(config.zero_centred_norms);
    assert!(config.attn_output_gate);
    // full_attention_interval 4: layers 3, 7, ..., 47 are full attention.
    assert_eq!(config.layer_types.len(), 48);
    for (layer, kind) in config.layer_types.iter().enumerate() {
        let expected = if (layer + 1) % 4 == 0 {
            LayerType::FullAttention
        } else {
            LayerType::LinearAttention
        };
        assert_eq!(*kind, expected, "layer {layer}");
    }
    let linear = config.linear_attn.as_ref().expect("gated deltanet dims");
    assert_eq!(
        *linear,
        LinearAttnConfig {
            num_key_heads: 16,
            num_value_heads: 32,
            key_head_dim: 128,
            value_head_dim: 128,
            conv_kernel: 4,
        }
    );
    assert_eq!(linear.key_dim(), 2048);
    assert_eq!(linear.value_dim(), 4096);
    assert_eq!(linear.conv_dim(), 8192);
    let moe = config.moe.as_ref().expect("experts");
    assert_eq!(moe.num_experts, 512);
    assert_eq!(moe.experts_per_token, 10);
    assert_eq!(moe.moe_intermediate_size, 512);
    assert_eq!(moe.shared_expert_intermediate_size, Some(512));
    assert!(moe.norm_topk_prob);
    let class = |key: &str| config.keys.iter().find(|r| r.key == key).map(|r| r.class);
    assert!(matches!(
        class("use_sliding_window"),
        Some(KeyClass::Ignored(reason)) if reason.contains("no sliding window")
    ));
    assert_eq!(class("full_attention_interval"), Some(KeyClass::Used));
}

#[test]
fn golden_qwen3_next_loads_layer_types_and_rope_parameters() {
    let config = load("golden-qwen3-next.json");
    assert_eq!(config.family, Family::Qwen3Next);
    assert_eq!(config.head_dim, 32);
    assert_eq!(config.rope.partial_rotary_factor, 0.25);
    assert_eq!(config.rope.rotary_dim(config.head_dim), 8);
    use LayerType::{FullAttention as F, LinearAttention as L};
    assert_eq!(config.layer_types, vec![L, F, L, F]);
    let linear = config.linear_attn.expect("dims");
    assert_eq!((linear.num_key_heads, linear.num_value_heads), (2, 4));
    assert_eq!(linear.conv_dim(), 2 * 64 + 128);
    let moe = config.moe.expect("experts");
    assert_eq!(moe.shared_expert_intermediate_size, Some(96));
    assert_eq!(moe.moe_intermediate_size, 64);
}

/// The checkpoints of `tests/fixtures/golden/`, whose configs transformers 5.24 wrote.
fn golden_checkpoint(case: &str) -> ModelConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden")
        .join(case)
        .join("config.json");
    ModelConfig::from_file(&path).unwrap_or_else(|err| panic!("{case} should load: {err}"))
}

#[test]
fn golden_checkpoint_qwen3_moe_has_a_dense_layer() {
    let config = golden_checkpoint("qwen3_moe");
    assert_eq!(config.family, Family::Qwen3Moe);
    assert_eq!(config.num_hidden_layers, 2);
    assert_eq!(config.rope.theta, 1e6);
    let moe = config.moe.expect("experts");
    assert_eq!(moe.num_experts, 8);
    assert_eq!(moe.moe_intermediate_size, 64);
    assert_eq!(moe.mlp_only_layers, vec![1]);
    assert!(moe.is_sparse_layer(0));
    assert!(!moe.is_sparse_layer(1), "layer 1 is in mlp_only_layers");
}

#[test]
fn golden_checkpoint_qwen3_next_loads() {
    let config = golden_checkpoint("qwen3_next");
    assert_eq!(config.family, Family::Qwen3Next);
    assert_eq!(config.head_dim, 64);
    assert_eq!(config.num_key_value_heads, 1);
    assert_eq!(config.rope.rotary_dim(config.head_dim), 16);
    use LayerType::{FullAttention as F, LinearAttention as L};
    assert_eq!(config.layer_types, vec![L, L, L, F]);
    let linear = config.linear_attn.expect("dims");
    assert_eq!((linear.key_head_dim, linear.value_head_dim), (16, 24));
    assert_eq!(linear.conv_dim(), 2 * 32 + 96);
    assert_eq!(
        config.moe.expect("experts").shared_expert_intermediate_size,
        Some(128)
    );
}

#[test]
fn dense_families_have_no_experts_and_full_attention_only() {
    for name in [
        "llama-3.2-1b.json",
        "qwen3-8b.json",
        "golden-qwen3-dense.json",
    ] {
        let config = load(name);
        assert_eq!(config.moe, None, "{name}");
        assert_eq!(config.linear_attn, None, "{name}");
        assert_eq!(
            config.layer_types,
            vec![LayerType::FullAttention; config.num_hidden_layers],
            "{name}"
        );
        assert!(
            !config.zero_centred_norms && !config.attn_output_gate,
            "{name}"
        );
    }
}
