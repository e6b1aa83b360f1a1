//! Mistral and Qwen2 configs written inline (no published fixture of them is shipped).

use solder_config::{Family, KeyClass, ModelConfig, RopeScaling};

/// Mistral-7B-v0.3's config.json.
const MISTRAL_7B_V03: &str = r#"{
  "architectures": ["MistralForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0",
  "use_cache": true,
  "vocab_size": 32768
}"#;

/// Qwen2.5-7B-Instruct's config.json: a window size is given but not used.
const QWEN2_5_7B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "hidden_act": "silu",
  "hidden_size": 3584,
  "initializer_range": 0.02,
  "intermediate_size": 18944,
  "max_position_embeddings": 32768,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 28,
  "num_hidden_layers": 28,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 131072,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 152064
}"#;

#[test]
fn mistral_7b_v03_loads() {
    let config = ModelConfig::from_json_str(MISTRAL_7B_V03, "mistral.json").expect("loads");
    assert_eq!(config.family, Family::Mistral);
    assert_eq!(config.family.as_str(), "mistral");
    assert_eq!(config.source, "mistral.json");
    assert_eq!(config.head_dim, 128);
    assert_eq!(config.kv_dim(), 1024);
    assert_eq!(config.vocab_size, 32768);
    assert!(!config.attention_bias);
    assert!(!config.qk_norm);
    assert_eq!(config.rope.theta, 1e6);
    assert_eq!(config.rope.scaling, RopeScaling::Default);
}

#[test]
fn mistral_window_as_long_as_context_is_no_window() {
    let text = MISTRAL_7B_V03.replace(r#""sliding_window": null"#, r#""sliding_window": 32768"#);
    let config = ModelConfig::from_json_str(&text, "mistral.json").expect("loads");
    assert_eq!(config.max_position_embeddings, 32768);
    // In use (transformers builds the sliding mask), but it masks nothing at these positions.
    assert!(config.layer_windows.iter().all(|w| *w == Some(32768)));
}

#[test]
fn qwen2_5_7b_loads_with_qkv_bias() {
    let config = ModelConfig::from_json_str(QWEN2_5_7B, "qwen2.json").expect("loads");
    assert_eq!(config.family, Family::Qwen2);
    assert!(config.attention_bias);
    assert!(!config.qk_norm);
    assert_eq!(config.num_attention_heads, 28);
    assert_eq!(config.num_key_value_heads, 4);
    assert_eq!(config.head_dim, 128);
    assert_eq!(config.q_dim(), 3584);
    // use_sliding_window is false: the 131072 window is not in use, in no layer.
    let window = config
        .keys
        .iter()
        .find(|r| r.key == "sliding_window")
        .expect("reported");
    assert_eq!(window.class, KeyClass::Used);
    assert!(config.layer_windows.iter().all(Option::is_none));
    assert_eq!(config.kv_window(), None);
}

#[test]
fn absent_optional_keys_take_transformers_defaults() {
    let text = r#"{
      "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": null,
      "vocab_size": 100, "max_position_embeddings": 256, "rms_norm_eps": 1e-6
    }"#;
    let config = ModelConfig::from_json_str(text, "minimal.json").expect("loads");
    assert_eq!(config.num_key_value_heads, 4);
    assert_eq!(config.head_dim, 16);
    assert!(!config.tie_word_embeddings);
    assert!(!config.attention_bias);
    assert_eq!(config.rope.theta, 10000.0);
    assert_eq!(config.rope.partial_rotary_factor, 1.0);
}

#[test]
fn legacy_partial_rotary_factor_is_accepted() {
    let text = r#"{
      "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 32,
      "vocab_size": 100, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
      "partial_rotary_factor": 0.25
    }"#;
    let config = ModelConfig::from_json_str(text, "partial.json").expect("loads");
    assert_eq!(config.rope.rotary_dim(config.head_dim), 8);
    assert_eq!(config.rope.inv_freq(config.head_dim).len(), 4);
}
