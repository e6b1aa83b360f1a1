//! Issue 9, integer overflow: every dimension has an upper bound so every byte count fits, and
//! every float the kernels read as f32 is finite and neither 0 nor infinite there. Each
//! refusal names the file, the key, the value and the bound; none panics.

mod common;

use common::{llama_with, moe_with, next_with, parse_edited, refusal};
use serde_json::{json, Map, Value};
use solder_config::{dim_bound, ConfigError, ModelConfig, ServeShape, DIM_BOUNDS, MAX_BATCH};

fn set(key: &'static str, value: Value) -> impl FnOnce(&mut Map<String, Value>) {
    move |m| drop(m.insert(key.to_string(), value))
}

/// The fixture that reads `key` (the MoE and linear-attention keys are read only there).
fn with_key(
    key: &str,
    edit: impl FnOnce(&mut Map<String, Value>),
) -> Result<ModelConfig, ConfigError> {
    match key {
        k if k.starts_with("linear_") || k == "shared_expert_intermediate_size" => next_with(edit),
        "num_experts" | "num_local_experts" | "num_experts_per_tok" | "moe_intermediate_size" => {
            moe_with(edit)
        }
        // Read inside quantization_config only: an AWQ group, an fp8 block edge.
        "group_size" | "weight_block_size" => llama_with(|m| {
            let mut inner = Map::new();
            edit(&mut inner);
            let value = inner.remove(key).expect("edited");
            let quantization = if key == "group_size" {
                json!({"quant_method": "awq", "bits": 4, "group_size": value})
            } else {
                json!({"quant_method": "fp8", "weight_block_size": [128, value]})
            };
            m.insert("quantization_config".into(), quantization);
        }),
        "original_max_position_embeddings" => parse_edited("llama-3.1-8b.json", |m| {
            let mut inner = Map::new();
            edit(&mut inner);
            let value = inner.remove(key).expect("edited");
            m["rope_scaling"][key] = value;
        }),
        _ => llama_with(edit),
    }
}

fn out_of_bounds(result: Result<ModelConfig, ConfigError>, key: &str, value: u64) {
    let max = dim_bound(key).expect("a bounded key").max;
    let err = refusal(
        result,
        &[&format!("{key}` = {value}"), &format!("bound {max}")],
    );
    assert!(matches!(err, ConfigError::OutOfBounds { .. }), "{err:?}");
}

#[test]
fn huge_dims_of_the_issue_are_refused_by_name() {
    let cases: [(&str, u64); 6] = [
        ("hidden_size", 1 << 63),
        ("vocab_size", 1 << 40),
        ("num_experts", 1 << 40),
        ("num_local_experts", 1 << 40),
        ("num_hidden_layers", 65536),
        ("head_dim", 1 << 62),
    ];
    for (key, value) in cases {
        out_of_bounds(with_key(key, set(key, json!(value))), key, value);
    }
}

#[test]
fn absurd_layer_count_is_refused() {
    out_of_bounds(
        llama_with(set("num_hidden_layers", json!(u64::MAX))),
        "num_hidden_layers",
        u64::MAX,
    );
}

#[test]
fn every_bounded_key_is_refused_one_above_its_bound() {
    for bound in DIM_BOUNDS {
        let value = bound.max as u64 + 1;
        let key = bound.key;
        out_of_bounds(with_key(key, set(key, json!(value))), key, value);
    }
}

#[test]
fn nested_bound_names_the_full_key() {
    let err = refusal(
        with_key(
            "original_max_position_embeddings",
            set("original_max_position_embeddings", json!(1u64 << 40)),
        ),
        &["`rope_scaling.original_max_position_embeddings`"],
    );
    assert!(matches!(err, ConfigError::OutOfBounds { .. }), "{err:?}");
}

/// Every dim at its bound (layers too) loads: the bounds refuse nothing they allow.
fn at_the_bounds(m: &mut Map<String, Value>) {
    for key in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "vocab_size",
        "max_position_embeddings",
        "num_attention_heads",
        "num_key_value_heads",
    ] {
        m.insert(key.into(), json!(dim_bound(key).unwrap().max));
    }
    m.insert("head_dim".into(), json!(dim_bound("head_dim").unwrap().max));
}

#[test]
fn a_config_at_the_bounds_loads() {
    let config = llama_with(at_the_bounds).expect("at the bounds");
    assert_eq!(config.num_hidden_layers, 4096);
    assert_eq!(config.hidden_size, 1 << 16);
    let moe = moe_with(|m| {
        m.insert("num_local_experts".into(), json!(1 << 12));
        m.insert("num_experts_per_tok".into(), json!(1 << 8));
        m.insert("moe_intermediate_size".into(), json!(1 << 16));
    })
    .expect("moe at the bounds");
    assert_eq!(moe.moe.expect("moe").num_experts, 1 << 12);
}

#[test]
fn eps_that_rounds_to_zero_in_f32_is_refused() {
    for eps in [1e-50, 1e-40] {
        refusal(
            llama_with(set("rms_norm_eps", json!(eps))),
            &["`rms_norm_eps`", "f32"],
        );
    }
    for eps in [0.0, -1e-6] {
        refusal(
            llama_with(set("rms_norm_eps", json!(eps))),
            &["`rms_norm_eps`", "finite positive"],
        );
    }
}

#[test]
fn theta_that_is_infinite_or_zero_in_f32_is_refused() {
    refusal(
        llama_with(set("rope_theta", json!(1e39))),
        &["`rope_theta`", "rounds to inf"],
    );
    refusal(
        llama_with(set("rope_theta", json!(1e-50))),
        &["`rope_theta`", "rounds to 0"],
    );
    refusal(
        llama_with(set("rope_theta", json!(-10000.0))),
        &["`rope_theta`", "finite positive"],
    );
    refusal(
        next_with(|m| m["rope_parameters"]["rope_theta"] = json!(1e39)),
        &["`rope_theta`"],
    );
}

#[test]
fn llama3_factors_out_of_f32_range_are_refused() {
    for key in ["factor", "low_freq_factor", "high_freq_factor"] {
        for value in [json!(1e39), json!(1e-50), json!(-1.0)] {
            refusal(
                parse_edited("llama-3.1-8b.json", |m| m["rope_scaling"][key] = value),
                &[&format!("`rope_scaling.{key}`")],
            );
        }
    }
}

#[test]
fn nan_and_infinite_numbers_are_refused_without_panic() {
    // JSON has no NaN or infinity: the text is refused as JSON, or the number as out of range.
    for literal in ["NaN", "Infinity", "-Infinity", "1e400"] {
        let mut value = common::fixture_value("golden-llama-gqa.json");
        value["rms_norm_eps"] = json!("@eps@");
        let text = value.to_string().replace("\"@eps@\"", literal);
        assert!(text.contains(literal), "fixture edited: {text}");
        let err = ModelConfig::from_json_str(&text, common::FILE).expect_err(literal);
        assert!(err.to_string().contains(common::FILE), "{err}");
    }
}

#[test]
fn max_batch_is_bounded() {
    for batch in [MAX_BATCH + 1, 1 << 62, usize::MAX] {
        let err = ServeShape::with_max_batch(batch).expect_err("too wide");
        assert!(err.to_string().contains("`max_batch`"), "{err}");
        let shape = ServeShape {
            max_batch: batch,
            ..ServeShape::default()
        };
        let err = shape.validate().expect_err("too wide");
        assert!(err.to_string().contains(&format!("is {batch}")), "{err}");
    }
    let widest = ServeShape::with_max_batch(MAX_BATCH).expect("at the bound");
    widest.validate().expect("valid");
}
