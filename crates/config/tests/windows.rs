//! Sliding windows per layer, as transformers 5 assigns them (Mistral, Qwen2/Qwen3 through
//! `use_sliding_window`, `max_window_layers` and `layer_types`), and the windows refused.

mod common;

use common::{parse_edited, qwen3_with, refusal};
use serde_json::{json, Value};
use solder_config::{ConfigError, ModelConfig};

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
fn mistral_window_is_in_every_layer() {
    // golden-llama-gqa: 4 layers, max_position_embeddings 2048.
    let config = mistral_with_window(Some(json!(1024))).expect("loads");
    assert_eq!(config.layer_windows, vec![Some(1024); 4]);
    assert_eq!(config.kv_window(), Some(1024));
    let config = mistral_with_window(Some(json!(2048))).expect("loads");
    assert_eq!(config.layer_windows, vec![Some(2048); 4]);
    let config = mistral_with_window(Some(Value::Null)).expect("loads");
    assert_eq!(config.layer_windows, vec![None; 4]);
    assert_eq!(config.kv_window(), None);
}

#[test]
fn mistral_absent_window_is_transformers_default() {
    // Absent means MistralConfig's 4096: no window over a 2048-token context...
    let config = mistral_with_window(None).expect("loads");
    assert_eq!(config.layer_windows, vec![None; 4]);
    // ...and a real one over a longer context.
    let long = parse_edited("golden-llama-gqa.json", |m| {
        m.insert("model_type".into(), json!("mistral"));
        m.insert("architectures".into(), json!(["MistralForCausalLM"]));
        m.remove("mlp_bias");
        m.remove("pretraining_tp");
        m.remove("sliding_window");
        m.insert("max_position_embeddings".into(), json!(32768));
    })
    .expect("loads");
    assert_eq!(long.layer_windows, vec![Some(4096); 4]);
}

#[test]
fn a_window_past_the_positions_or_of_zero_is_refused() {
    refusal(
        mistral_with_window(Some(json!(4096))),
        &[
            "`sliding_window`",
            "4096",
            "at most max_position_embeddings (2048)",
        ],
    );
    refusal(
        mistral_with_window(Some(json!(0))),
        &["`sliding_window`", "a positive window"],
    );
    // Not in use (use_sliding_window false): a long window is no error.
    let config = qwen3_with(|m| drop(m.insert("sliding_window".into(), json!(1 << 20))));
    assert_eq!(config.expect("loads").layer_windows, vec![None; 3]);
    refusal(
        qwen3_with(|m| {
            m.insert("use_sliding_window".into(), json!(true));
            m.insert("sliding_window".into(), json!(1 << 20));
            m.remove("layer_types");
            m.insert("max_window_layers".into(), json!(1));
        }),
        &["`sliding_window`", "at most max_position_embeddings"],
    );
}

#[test]
fn qwen_layers_at_or_past_max_window_layers_are_windowed() {
    // golden-qwen3-dense: 3 layers; layer_types removed so transformers derives them.
    let config = qwen3_with(|m| {
        m.insert("use_sliding_window".into(), json!(true));
        m.insert("sliding_window".into(), json!(64));
        m.insert("max_window_layers".into(), json!(1));
        m.remove("layer_types");
    })
    .expect("loads");
    assert_eq!(config.layer_windows, vec![None, Some(64), Some(64)]);
    assert_eq!(config.kv_window(), None, "layer 0 attends over everything");
    // max_window_layers at or past the layer count: no layer is windowed.
    let config = qwen3_with(|m| {
        m.insert("use_sliding_window".into(), json!(true));
        m.insert("sliding_window".into(), json!(64));
        m.insert("max_window_layers".into(), json!(3));
        m.remove("layer_types");
    })
    .expect("loads");
    assert_eq!(config.layer_windows, vec![None; 3]);
    // Window absent: transformers' default 4096 (within the fixture's 32768 positions).
    let config = qwen3_with(|m| {
        m.insert("use_sliding_window".into(), json!(true));
        m.remove("sliding_window");
        m.insert("max_window_layers".into(), json!(0));
        m.remove("layer_types");
    })
    .expect("loads");
    assert_eq!(config.layer_windows, vec![Some(4096); 3]);
    assert_eq!(config.kv_window(), Some(4096));
}

#[test]
fn explicit_layer_types_decide_over_max_window_layers() {
    let config = qwen3_with(|m| {
        m.insert("use_sliding_window".into(), json!(true));
        m.insert("sliding_window".into(), json!(32));
        m.insert(
            "layer_types".into(),
            json!(["sliding_attention", "full_attention", "sliding_attention"]),
        );
    })
    .expect("loads");
    assert_eq!(config.layer_windows, vec![Some(32), None, Some(32)]);
    // A sliding layer without a window in use: transformers cannot build its mask.
    refusal(
        qwen3_with(|m| {
            m.insert(
                "layer_types".into(),
                json!(["full_attention", "sliding_attention", "full_attention"]),
            );
        }),
        &["`layer_types`", "use_sliding_window true"],
    );
    refusal(
        qwen3_with(|m| {
            m.insert(
                "layer_types".into(),
                json!(["full_attention", "chunked_attention", "full_attention"]),
            );
        }),
        &["`layer_types`", "`chunked_attention` is not yet modelled"],
    );
    refusal(
        qwen3_with(|m| drop(m.insert("layer_types".into(), json!(["full_attention"])))),
        &["`layer_types`", "one entry per layer"],
    );
}

#[test]
fn a_hand_built_window_is_checked() {
    let mut config = mistral_with_window(Some(json!(64))).expect("loads");
    config.check_bounds().expect("as loaded");
    config.layer_windows[1] = Some(0);
    assert!(config.check_bounds().is_err());
    config.layer_windows[1] = Some(4096);
    let err = config.check_bounds().unwrap_err().to_string();
    assert!(err.contains("sliding_window"), "{err}");
    config.layer_windows.pop();
    assert!(config.check_bounds().is_err());
}

#[test]
fn mistral_7b_v0_1_windows_every_layer_at_4096() {
    let config = parse_edited("mistral-7b-v0.1.json", |_| {}).expect("loads");
    assert_eq!(config.layer_windows, vec![Some(4096); 32]);
    assert_eq!(config.kv_window(), Some(4096));
    assert_eq!(config.max_position_embeddings, 32768);
}
