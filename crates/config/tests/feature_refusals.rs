//! Features solder does not model (rope types, activations, biases, quantization formats and
//! settings) are refused by value, naming the file and the key; the quantization formats it
//! does model load.

mod common;

use common::{llama_with, qwen3_with, refusal};
use serde_json::json;
use solder_config::KeyClass;

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

/// The golden llama config with `quantization_config` set to `block`.
fn quantized(
    block: serde_json::Value,
) -> Result<solder_config::ModelConfig, solder_config::ConfigError> {
    llama_with(|m| drop(m.insert("quantization_config".into(), block)))
}

/// One compressed-tensors fp8 block (FP8_DYNAMIC's shape) with `edit` applied.
fn compressed(edit: impl FnOnce(&mut serde_json::Value)) -> serde_json::Value {
    let mut block = json!({
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "kv_cache_scheme": null,
        "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": true,
                        "dynamic": false, "group_size": null, "observer": "minmax"},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "symmetric": true, "dynamic": true, "observer": null},
            "output_activations": null
        }}
    });
    edit(&mut block);
    block
}

#[test]
fn quantization_configs_of_each_modelled_method_load() {
    use solder_config::{Fp8Strategy, Quantization};
    let load = |block| quantized(block).expect("loads").quantization;
    assert_eq!(load(json!(null)), None);
    assert_eq!(
        load(
            json!({"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": false,
                    "sym": false, "checkpoint_format": "gptq_v2", "modules_to_not_convert": null})
        ),
        Some(Quantization::Gptq {
            group_size: 0,
            sym: false,
            v2: true,
            not_converted: vec![]
        })
    );
    // transformers' AwqConfig defaults: 4 bits, group 128, zero point, GEMM.
    assert_eq!(
        load(
            json!({"quant_method": "awq", "version": "GEMM", "modules_to_not_convert": ["visual"]})
        ),
        Some(Quantization::Awq {
            group_size: 128,
            zero_point: true,
            not_converted: vec!["visual".into()]
        })
    );
    assert_eq!(
        load(
            json!({"quant_method": "fp8", "weight_block_size": [128, 64],
                    "modules_to_not_convert": ["lm_head"], "ignored_layers": ["mlp.gate"]})
        ),
        Some(Quantization::Fp8Block {
            block: [128, 64],
            not_converted: vec!["lm_head".into(), "mlp.gate".into()],
        })
    );
    assert_eq!(
        load(compressed(|b| {
            b["ignore"] = json!(["lm_head", "re:.*mlp\\.gate$"]);
            b["config_groups"]["group_0"]["weights"]["strategy"] = json!("tensor");
            b["config_groups"]["group_0"]["input_activations"] = json!(null);
        })),
        Some(Quantization::Fp8Compressed {
            strategy: Fp8Strategy::Tensor,
            targets: vec!["Linear".into()],
            ignore: vec!["lm_head".into(), "re:.*mlp\\.gate$".into()],
        })
    );
}

#[test]
fn other_quant_methods_are_refused_by_name() {
    for method in [
        "bitsandbytes",
        "gguf",
        "marlin",
        "exllama",
        "hqq",
        "mxfp4",
        "modelopt",
        "fbgemm_fp8",
        "auto-round",
    ] {
        refusal(
            quantized(json!({"quant_method": method, "bits": 4})),
            &[
                &format!("`quantization_config.quant_method` = \"{method}\""),
                "is not yet modelled",
            ],
        );
    }
    refusal(
        quantized(json!({"bits": 4})),
        &["missing required key `quantization_config.quant_method`"],
    );
    refusal(
        quantized(json!("awq")),
        &["`quantization_config` must be an object"],
    );
}

#[test]
fn int4_settings_solder_does_not_model_are_refused() {
    let cases = [
        (
            json!({"quant_method": "awq", "bits": 8}),
            "`quantization_config.bits` = 8",
        ),
        (
            json!({"quant_method": "gptq", "bits": 3}),
            "`quantization_config.bits` = 3",
        ),
        (
            json!({"quant_method": "gptq"}),
            "missing required key `quantization_config.bits`",
        ),
        (
            json!({"quant_method": "awq", "version": "gemv"}),
            "`quantization_config.version` = \"gemv\"",
        ),
        (
            json!({"quant_method": "awq", "backend": "llm-awq"}),
            "`quantization_config.backend`",
        ),
        (
            json!({"quant_method": "awq", "group_size": 0}),
            "`quantization_config.group_size` = 0",
        ),
        (
            json!({"quant_method": "gptq", "bits": 4, "desc_act": true}),
            "act-order g_idx is not yet modelled",
        ),
        (
            json!({"quant_method": "gptq", "bits": 4, "group_size": -2}),
            "`quantization_config.group_size` = -2",
        ),
        (
            json!({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"}),
            "`quantization_config.checkpoint_format` = \"marlin\"",
        ),
        (
            json!({"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq", "format": "gptq_v2"}),
            "`quantization_config.format`",
        ),
        (
            json!({"quant_method": "gptq", "bits": 4, "lm_head": true}),
            "a quantized lm_head is not yet modelled",
        ),
        (
            json!({"quant_method": "gptq", "bits": 4, "modules_in_block_to_quantize": [["self_attn.q_proj"]]}),
            "`quantization_config.modules_in_block_to_quantize`",
        ),
    ];
    for (block, needle) in cases {
        refusal(quantized(block), &[needle]);
    }
}

#[test]
fn fp8_settings_solder_does_not_model_are_refused() {
    let fp8 = |extra: serde_json::Value| {
        let mut block = json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                               "weight_block_size": [128, 128]});
        for (key, value) in extra.as_object().unwrap() {
            block[key] = value.clone();
        }
        quantized(block)
    };
    refusal(
        fp8(json!({"fmt": "e5m2"})),
        &["`quantization_config.fmt` = \"e5m2\"", "e4m3"],
    );
    refusal(
        fp8(json!({"activation_scheme": "static"})),
        &[
            "`quantization_config.activation_scheme` = \"static\"",
            "weight-only",
        ],
    );
    refusal(
        fp8(json!({"weight_block_size": null})),
        &["`quantization_config.weight_block_size` = null"],
    );
    for bad in [
        json!([128]),
        json!([128, 128, 1]),
        json!([128, "x"]),
        json!([-1, 128]),
        json!(128),
    ] {
        refusal(
            fp8(json!({"weight_block_size": bad})),
            &[
                "`quantization_config.weight_block_size`",
                "two positive integers",
            ],
        );
    }
    refusal(
        fp8(json!({"weight_block_size": [0, 128]})),
        &["`quantization_config.weight_block_size` = 0"],
    );
    // DeepSeek-V3.1's power-of-two scales: a key this block does not know.
    refusal(
        fp8(json!({"scale_fmt": "ue8m0"})),
        &[
            "unknown key `quantization_config.scale_fmt`",
            "quant_method `fp8`",
        ],
    );
}

#[test]
fn compressed_tensors_settings_solder_does_not_model_are_refused() {
    let group = |b: &mut serde_json::Value| b["config_groups"]["group_0"].clone();
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (
            compressed(|b| {
                let g = group(b);
                b["config_groups"]["group_1"] = g;
            }),
            "more than one config group is not yet modelled",
        ),
        (
            compressed(|b| b["config_groups"]["group_0"]["weights"]["num_bits"] = json!(4)),
            "`quantization_config.config_groups.group_0.weights.num_bits` = 4",
        ),
        (
            compressed(|b| b["config_groups"]["group_0"]["weights"]["type"] = json!("int")),
            "`quantization_config.config_groups.group_0.weights.type` = \"int\"",
        ),
        (
            compressed(|b| b["config_groups"]["group_0"]["weights"]["strategy"] = json!("block")),
            "`quantization_config.config_groups.group_0.weights.strategy` = \"block\"",
        ),
        (
            compressed(|b| b["config_groups"]["group_0"]["weights"]["strategy"] = json!("group")),
            "per channel or per tensor are not yet modelled",
        ),
        (
            compressed(|b| b["config_groups"]["group_0"]["weights"]["dynamic"] = json!(true)),
            "`quantization_config.config_groups.group_0.weights.dynamic` = true",
        ),
        (
            compressed(|b| {
                b["config_groups"]["group_0"]["input_activations"]["dynamic"] = json!(false)
            }),
            "`quantization_config.config_groups.group_0.input_activations.dynamic` = false",
        ),
        (
            compressed(|b| {
                b["config_groups"]["group_0"]["output_activations"] = json!({"num_bits": 8})
            }),
            "`quantization_config.config_groups.group_0.output_activations`",
        ),
        (
            compressed(|b| b["format"] = json!("pack-quantized")),
            "`quantization_config.format` = \"pack-quantized\"",
        ),
        (
            compressed(|b| b["kv_cache_scheme"] = json!({"num_bits": 8, "type": "float"})),
            "`quantization_config.kv_cache_scheme`",
        ),
        (
            compressed(|b| b["sparsity_config"] = json!({"format": "sparse-bitmask"})),
            "`quantization_config.sparsity_config`",
        ),
        (
            compressed(|b| b["ignore"] = json!(["lm_head", "re:model\\.layers\\.[0-2]\\..*"])),
            "\"re:model\\\\.layers\\\\.[0-2]\\\\..*\"",
        ),
        (
            compressed(|b| b["config_groups"]["group_0"]["weights"]["bogus"] = json!(1)),
            "unknown key `quantization_config.config_groups.group_0.weights.bogus`",
        ),
        (
            compressed(|b| b["provider"] = json!("x")),
            "unknown key `quantization_config.provider`",
        ),
        (
            compressed(|b| drop(b.as_object_mut().unwrap().remove("format"))),
            "missing required key `quantization_config.format`",
        ),
        (
            compressed(|b| b["config_groups"]["group_0"]["targets"] = json!(["re:.*mlp.*"])),
            "`quantization_config.config_groups.group_0.targets`",
        ),
    ];
    for (block, needle) in cases {
        refusal(quantized(block), &[needle]);
    }
}

#[test]
fn keys_inside_quantization_config_are_classified() {
    let config = quantized(
        json!({"quant_method": "gptq", "bits": 4, "damp_percent": 0.01,
                                  "true_sequential": true, "desc_act": false}),
    )
    .expect("loads");
    let class = |key: &str| {
        config
            .quantization_keys
            .iter()
            .find(|r| r.key == key)
            .map(|r| r.class)
    };
    assert_eq!(class("quantization_config.bits"), Some(KeyClass::Used));
    assert!(
        matches!(class("quantization_config.damp_percent"), Some(KeyClass::Ignored(why)) if why.contains("calibration"))
    );
    assert_eq!(config.quantization_keys.len(), 5);
    refusal(
        quantized(json!({"quant_method": "awq", "w_bit": 4})),
        &[
            "unknown key `quantization_config.w_bit`",
            "quant_method `awq`",
        ],
    );
}

/// No value of any key of any modelled block panics the parser: each loads or is refused.
#[test]
fn odd_values_inside_quantization_config_never_panic() {
    let odd = [
        json!(null),
        json!(true),
        json!(-1),
        json!(0),
        json!(u64::MAX),
        json!(1.5),
        json!("x"),
        json!("re:(a"),
        json!([]),
        json!({}),
        json!([0, u64::MAX]),
        json!(["re:.*\\"]),
        json!({"group_0": null}),
    ];
    let bases = [
        json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
               "weight_block_size": [128, 128], "modules_to_not_convert": ["lm_head"]}),
        json!({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true,
               "version": "gemm", "modules_to_not_convert": null}),
        json!({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": false,
               "sym": true, "checkpoint_format": "gptq", "lm_head": false}),
        compressed(|_| {}),
    ];
    let mut loaded = 0;
    for base in &bases {
        let mut paths: Vec<Vec<String>> = Vec::new();
        collect_paths(base, &mut Vec::new(), &mut paths);
        for path in &paths {
            for value in &odd {
                let mut block = base.clone();
                let mut slot = &mut block;
                for key in path {
                    slot = &mut slot[key.as_str()];
                }
                *slot = value.clone();
                loaded += usize::from(quantized(block).is_ok());
            }
        }
    }
    // Some odd values are fine (a null list, a false flag): not everything is refused.
    assert!(loaded > 0);
}

/// Every key path of a JSON object, nested objects included.
fn collect_paths(value: &serde_json::Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Some(map) = value.as_object() {
        for (key, inner) in map {
            prefix.push(key.clone());
            out.push(prefix.clone());
            collect_paths(inner, prefix, out);
            prefix.pop();
        }
    }
}
