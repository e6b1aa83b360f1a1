//! Bad input in keys, types, dims and files: each refusal names the file and the key.

mod common;

use std::path::PathBuf;

use common::{fixture_value, llama_with, refusal, FILE};
use serde_json::json;
use solder_config::{ConfigError, ModelConfig};

#[test]
fn unknown_key_is_refused() {
    let err = refusal(
        llama_with(|m| drop(m.insert("rope_thetta".into(), json!(1)))),
        &["unknown key `rope_thetta`"],
    );
    assert!(matches!(err, ConfigError::UnknownKey { .. }));
}

#[test]
fn missing_hidden_size_is_refused() {
    let err = refusal(
        llama_with(|m| drop(m.remove("hidden_size"))),
        &["missing required key `hidden_size`"],
    );
    assert!(matches!(err, ConfigError::MissingKey { .. }));
}

#[test]
fn string_layer_count_is_a_type_error() {
    let err = refusal(
        llama_with(|m| drop(m.insert("num_hidden_layers".into(), json!("32")))),
        &[
            "`num_hidden_layers`",
            "a non-negative integer",
            "string \"32\"",
        ],
    );
    assert!(matches!(err, ConfigError::WrongType { .. }));
}

#[test]
fn negative_and_fractional_dims_are_type_errors() {
    refusal(
        llama_with(|m| drop(m.insert("vocab_size".into(), json!(-1)))),
        &["`vocab_size`", "non-negative integer"],
    );
    refusal(
        llama_with(|m| drop(m.insert("hidden_size".into(), json!(256.5)))),
        &["`hidden_size`", "non-negative integer"],
    );
}

#[test]
fn invalid_json_names_line_and_column() {
    let text = "{\n  \"model_type\": \"llama\",\n  oops\n}";
    let err = ModelConfig::from_json_str(text, FILE).expect_err("invalid JSON");
    assert!(
        matches!(
            err,
            ConfigError::Json {
                line: 3,
                column: 3,
                ..
            }
        ),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(FILE) && message.contains("line 3, column 3"),
        "{message}"
    );
}

#[test]
fn top_level_array_is_refused() {
    let err = ModelConfig::from_json_str("[1, 2]", FILE).expect_err("not an object");
    assert!(err.to_string().contains("an array"), "{err}");
}

#[test]
fn unknown_model_type_is_refused() {
    let err = refusal(
        llama_with(|m| drop(m.insert("model_type".into(), json!("gemma2")))),
        &["`model_type`", "gemma2"],
    );
    assert!(matches!(err, ConfigError::UnknownModelType { .. }));
}

#[test]
fn mismatched_architectures_are_refused() {
    refusal(
        llama_with(|m| drop(m.insert("architectures".into(), json!(["Qwen3ForCausalLM"])))),
        &["`architectures`", "Qwen3ForCausalLM", "LlamaForCausalLM"],
    );
}

#[test]
fn kv_heads_not_dividing_heads_are_refused() {
    refusal(
        llama_with(|m| drop(m.insert("num_key_value_heads".into(), json!(3)))),
        &["`num_key_value_heads` = 3"],
    );
    refusal(
        llama_with(|m| drop(m.insert("num_key_value_heads".into(), json!(0)))),
        &["`num_key_value_heads` = 0"],
    );
}

#[test]
fn zero_dims_are_refused() {
    refusal(
        llama_with(|m| drop(m.insert("hidden_size".into(), json!(0)))),
        &["`hidden_size` = 0"],
    );
    refusal(
        llama_with(|m| drop(m.insert("num_attention_heads".into(), json!(0)))),
        &["`num_attention_heads` = 0"],
    );
}

#[test]
fn odd_head_dim_is_refused() {
    refusal(
        llama_with(|m| drop(m.insert("head_dim".into(), json!(33)))),
        &["`head_dim` = 33", "even"],
    );
}

#[test]
fn indivisible_hidden_size_without_head_dim_is_refused() {
    refusal(
        llama_with(|m| {
            m.remove("head_dim");
            m.insert("hidden_size".into(), json!(260));
        }),
        &["`hidden_size` = 260", "num_attention_heads"],
    );
}

#[test]
fn missing_file_is_refused_naming_it() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/no-such-config.json");
    let err = ModelConfig::from_file(&path).expect_err("missing file");
    assert!(matches!(err, ConfigError::Read { .. }));
    assert!(err.to_string().contains("no-such-config.json"), "{err}");
}

#[test]
fn no_value_of_any_type_panics() {
    let junk = [
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(1.5),
        json!(1e300),
        json!("x"),
        json!([]),
        json!([1]),
        json!({}),
        json!({"rope_type": 7}),
    ];
    for name in [
        "golden-llama-gqa.json",
        "golden-qwen3-dense.json",
        "llama-3.2-1b.json",
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
                let _ = ModelConfig::from_json_str(&edited.to_string(), FILE);
            }
        }
    }
}

#[test]
fn only_regular_files_under_the_cap_are_read() {
    use solder_config::ModelConfig;
    // A device that never ends is refused before anything is read.
    let err = ModelConfig::from_file(std::path::Path::new("/dev/zero")).unwrap_err();
    assert!(
        err.to_string().contains("/dev/zero") && err.to_string().contains("not a regular file"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("solder-config-cap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = ModelConfig::from_file(&dir).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    let big = dir.join("config.json");
    let padding = " ".repeat(solder_config::MAX_CONFIG_BYTES as usize + 1);
    std::fs::write(&big, format!("{{}}{padding}")).unwrap();
    let err = ModelConfig::from_file(&big).unwrap_err();
    assert!(err.to_string().contains("larger than"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
