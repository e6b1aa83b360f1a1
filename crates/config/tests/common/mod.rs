//! Helpers shared by the refusal tests: edit a fixture, parse it under a fixed name, and
//! check that the error names the file and the key.
#![allow(dead_code)] // each test crate uses a different subset

use std::path::PathBuf;

use serde_json::Value;
use solder_config::{ConfigError, ModelConfig};

pub const FILE: &str = "bad/config.json";

pub fn fixture_value(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/configs")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// The golden llama config with `edit` applied, parsed under the name `FILE`.
pub fn llama_with(
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> Result<ModelConfig, ConfigError> {
    parse_edited("golden-llama-gqa.json", edit)
}

pub fn qwen3_with(
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> Result<ModelConfig, ConfigError> {
    parse_edited("golden-qwen3-dense.json", edit)
}

pub fn parse_edited(
    name: &str,
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> Result<ModelConfig, ConfigError> {
    let mut value = fixture_value(name);
    edit(value.as_object_mut().expect("fixture is an object"));
    ModelConfig::from_json_str(&value.to_string(), FILE)
}

/// The error's message, which must name the file and every one of `needles`.
pub fn refusal(result: Result<ModelConfig, ConfigError>, needles: &[&str]) -> ConfigError {
    let err = match result {
        Ok(config) => panic!("expected a refusal, loaded {config:?}"),
        Err(err) => err,
    };
    let message = err.to_string();
    assert!(
        message.contains(FILE),
        "message does not name the file: {message}"
    );
    for needle in needles {
        assert!(
            message.contains(needle),
            "message lacks `{needle}`: {message}"
        );
    }
    err
}

/// The golden Qwen3-MoE config (written by transformers 5.24, `num_local_experts`) edited.
pub fn moe_with(
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> Result<ModelConfig, ConfigError> {
    parse_edited("golden-qwen3-moe.json", edit)
}

/// The golden Qwen3-Next config (both `layer_types` and `full_attention_interval`) edited.
pub fn next_with(
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> Result<ModelConfig, ConfigError> {
    parse_edited("golden-qwen3-next.json", edit)
}
