//! Every published and golden config in `fixtures/` loads with the right dims, or, for the
//! families solder does not model yet, is refused by name.

use std::path::PathBuf;

use solder_config::{ConfigError, Family, KeyClass, ModelConfig, RopeScaling};

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

fn assert_not_modelled(name: &str, model_type: &str) {
    let path = fixture(name);
    let err = ModelConfig::from_file(&path).expect_err("an unmodelled family must be refused");
    assert!(
        matches!(err, ConfigError::FamilyNotModelled { .. }),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(message.contains("family not yet modelled"), "{message}");
    assert!(message.contains(model_type), "{message}");
    assert!(message.contains(name), "{message}");
}

#[test]
fn qwen3_moe_is_refused_as_not_modelled() {
    assert_not_modelled("qwen3-30b-a3b.json", "qwen3_moe");
    assert_not_modelled("golden-qwen3-moe.json", "qwen3_moe");
}

#[test]
fn qwen3_next_is_refused_as_not_modelled() {
    assert_not_modelled("qwen3-next-80b-a3b.json", "qwen3_next");
    assert_not_modelled("golden-qwen3-next.json", "qwen3_next");
}
