//! A key given twice in one object of a `config.json` is refused, naming the key, the file
//! and where (issue 19 item 7: serde_json kept the last value without a word).

use std::path::PathBuf;

use solder_config::{ConfigError, ModelConfig};

fn llama_text() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/configs/llama-3.2-1b.json");
    std::fs::read_to_string(path).expect("fixture")
}

#[test]
fn a_top_level_key_given_twice_is_refused_by_name() {
    let text = llama_text();
    ModelConfig::from_json_str(&text, "dup/config.json").expect("the fixture loads");
    // A second `vocab_size` after the first: last-wins would load a vocabulary of 7.
    let doubled = text.replacen('{', "{\n  \"vocab_size\": 7,", 1);
    match ModelConfig::from_json_str(&doubled, "dup/config.json") {
        Err(err @ ConfigError::Json { .. }) => {
            let message = err.to_string();
            assert!(message.contains("`vocab_size`"), "{message}");
            assert!(message.contains("dup/config.json"), "{message}");
            assert!(message.contains("line"), "{message}");
        }
        other => panic!("expected a refusal naming vocab_size, got {other:?}"),
    }
}

#[test]
fn a_nested_key_given_twice_is_refused_by_name() {
    let text = llama_text();
    let doubled = text.replacen(
        "\"rope_scaling\": {",
        "\"rope_scaling\": {\n    \"factor\": 1.0,",
        1,
    );
    assert_ne!(doubled, text, "the fixture has rope_scaling");
    let message = ModelConfig::from_json_str(&doubled, "dup/config.json")
        .unwrap_err()
        .to_string();
    assert!(message.contains("`factor`"), "{message}");
}
