//! The quantized configs of `tests/fixtures/configs/quantized/` (see its README for what each
//! is made of) load with the right method, fields and key classes, and real blocks solder does
//! not model are refused naming the key.

mod common;

use std::path::PathBuf;

use serde_json::json;
use solder_config::{Family, Fp8Strategy, KeyClass, ModelConfig, Quantization};

fn load(name: &str) -> ModelConfig {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/configs/quantized")
        .join(name);
    ModelConfig::from_file(&path).unwrap_or_else(|err| panic!("{name} should load: {err}"))
}

fn class(config: &ModelConfig, key: &str) -> Option<KeyClass> {
    config
        .quantization_keys
        .iter()
        .find(|report| report.key == key)
        .map(|report| report.class)
}

#[test]
fn fp8_block_configs_of_the_three_qwen3_families_load() {
    for (name, family) in [
        ("qwen3-8b-fp8.json", Family::Qwen3),
        ("qwen3-30b-a3b-fp8.json", Family::Qwen3Moe),
        ("qwen3-next-80b-a3b-fp8.json", Family::Qwen3Next),
    ] {
        let config = load(name);
        assert_eq!(config.family, family, "{name}");
        let quantization = config.quantization.as_ref().expect("quantized");
        assert_eq!(
            *quantization,
            Quantization::Fp8Block {
                block: [128, 128],
                not_converted: vec![],
            },
            "{name}"
        );
        assert_eq!(quantization.method(), "fp8");
        let keys: Vec<&str> = config
            .quantization_keys
            .iter()
            .map(|r| r.key.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "quantization_config.activation_scheme",
                "quantization_config.fmt",
                "quantization_config.quant_method",
                "quantization_config.weight_block_size",
            ],
            "{name}"
        );
        let top = config
            .keys
            .iter()
            .find(|r| r.key == "quantization_config")
            .expect("reported");
        assert_eq!(top.class, KeyClass::Used);
    }
}

#[test]
fn qwen_gptq_int4_block_loads_with_its_calibration_keys_ignored() {
    let config = load("qwen2.5-7b-gptq-int4.json");
    assert_eq!(config.family, Family::Qwen2);
    assert_eq!(
        config.quantization,
        Some(Quantization::Gptq {
            group_size: 128,
            sym: true,
            v2: false,
            not_converted: vec![],
        })
    );
    assert_eq!(config.quantization_keys.len(), 20);
    assert_eq!(
        class(&config, "quantization_config.desc_act"),
        Some(KeyClass::Used)
    );
    for key in [
        "damp_percent",
        "true_sequential",
        "dataset",
        "use_exllama",
        "exllama_config",
    ] {
        assert!(
            matches!(
                class(&config, &format!("quantization_config.{key}")),
                Some(KeyClass::Ignored(_))
            ),
            "{key}"
        );
    }
    // Nothing skipped by name: every linear is read quantized (lm_head is not a GPTQ linear).
    assert!(!config
        .quantization
        .unwrap()
        .skips("model.layers.0.mlp.down_proj"));
}

#[test]
fn gptqmodel_v2_config_loads_as_v2() {
    let config = load("llama-3-8b-gptq-v2-gptqmodel.json");
    assert_eq!(config.family, Family::Llama);
    assert_eq!(
        config.quantization,
        Some(Quantization::Gptq {
            group_size: 128,
            sym: true,
            v2: true,
            not_converted: vec![],
        })
    );
    for key in ["act_group_aware", "backend", "meta"] {
        assert!(
            matches!(
                class(&config, &format!("quantization_config.{key}")),
                Some(KeyClass::Ignored(_))
            ),
            "{key}"
        );
    }
}

#[test]
fn awq_gemm_block_loads() {
    let config = load("zephyr-7b-alpha-awq.json");
    assert_eq!(config.family, Family::Mistral);
    assert_eq!(
        config.quantization,
        Some(Quantization::Awq {
            group_size: 128,
            zero_point: true,
            not_converted: vec![],
        })
    );
    assert_eq!(config.quantization_keys.len(), 5);
}

/// RedHatAI/Qwen3-Coder-Next-NVFP4's block (as another project transcribed it, its ignore list
/// cut): a qwen3_next compressed-tensors release solder does not read, refused by its format.
#[test]
fn nvfp4_compressed_tensors_release_is_refused_by_format() {
    let block = json!({
        "config_groups": {"group_0": {
            "format": "nvfp4-pack-quantized",
            "input_activations": {"actorder": null, "block_structure": null, "dynamic": "local",
                "group_size": 16, "num_bits": 4, "observer": "static_minmax", "observer_kwargs": {},
                "scale_dtype": "torch.float8_e4m3fn", "strategy": "tensor_group", "symmetric": true,
                "type": "float", "zp_dtype": null},
            "output_activations": null, "targets": ["Linear"],
            "weights": {"actorder": null, "block_structure": null, "dynamic": false,
                "group_size": 16, "num_bits": 4, "observer": "mse", "observer_kwargs": {},
                "scale_dtype": "torch.float8_e4m3fn", "strategy": "tensor_group", "symmetric": true,
                "type": "float", "zp_dtype": null}}},
        "format": "nvfp4-pack-quantized", "global_compression_ratio": null,
        "ignore": ["model.layers.0.linear_attn.in_proj_qkvz", "model.layers.0.linear_attn.in_proj_ba",
                   "model.layers.0.linear_attn.out_proj", "model.layers.0.mlp.gate",
                   "model.layers.0.mlp.shared_expert_gate", "lm_head"],
        "kv_cache_scheme": null, "quant_method": "compressed-tensors",
        "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {},
        "version": "0.13.1.dev47+gcfc24ef"
    });
    common::refusal(
        common::next_with(|m| drop(m.insert("quantization_config".into(), block.clone()))),
        &["`quantization_config.format` = \"nvfp4-pack-quantized\""],
    );
    // The same release as fp8 channel weights with dynamic activations would load.
    let mut fp8 = block;
    fp8["format"] = json!("float-quantized");
    let group = &mut fp8["config_groups"]["group_0"];
    group["format"] = json!("float-quantized");
    group["input_activations"]["dynamic"] = json!(true);
    group["weights"]["num_bits"] = json!(8);
    group["weights"]["group_size"] = json!(null);
    group["weights"]["strategy"] = json!("channel");
    let config = common::next_with(|m| drop(m.insert("quantization_config".into(), fp8)))
        .expect("an fp8 channel block loads");
    let quantization = config.quantization.expect("quantized");
    assert!(matches!(
        quantization,
        Quantization::Fp8Compressed {
            strategy: Fp8Strategy::Channel,
            ..
        }
    ));
    assert!(quantization.skips("model.layers.0.mlp.shared_expert_gate"));
    assert!(!quantization.skips("model.layers.1.mlp.shared_expert_gate"));
}

#[test]
fn hand_built_quantization_is_checked_like_a_parsed_one() {
    let mut config = load("qwen3-8b-fp8.json");
    config.check_bounds().expect("as parsed");
    config.quantization = Some(Quantization::Fp8Block {
        block: [0, 128],
        not_converted: vec![],
    });
    let err = config.check_bounds().expect_err("a zero block");
    assert!(
        err.to_string()
            .contains("`quantization_config.weight_block_size` = 0"),
        "{err}"
    );
    config.quantization = Some(Quantization::Awq {
        group_size: 1 << 40,
        zero_point: true,
        not_converted: vec![],
    });
    let err = config.check_bounds().expect_err("a huge group");
    assert!(
        err.to_string().contains("`quantization_config.group_size`"),
        "{err}"
    );
    config.quantization = Some(Quantization::Fp8Compressed {
        strategy: Fp8Strategy::Tensor,
        targets: vec!["Linear".into()],
        ignore: vec!["re:(a|b)".into()],
    });
    let err = config.check_bounds().expect_err("a regex group");
    assert!(
        err.to_string().contains("`quantization_config.ignore`"),
        "{err}"
    );
    config.quantization = Some(Quantization::Gptq {
        group_size: 0,
        sym: true,
        v2: false,
        not_converted: vec![],
    });
    config.check_bounds().expect("GPTQ's one group per row");
}
