//! The precision policy (`solder_circuit::precision`) and weight formats through the fuser and
//! the plan: which slots a quantized checkpoint's native policy quantizes, the bf16 tier, the
//! per-tensor table and its refusals, rule `formats`, and plan digests and bytes.

use std::path::PathBuf;

use solder_circuit::{
    Available, BuildOptions, CircuitOptions, ExecutionPlan, Instance, Mode, OpKind, Policy,
    PrecisionSpec, RuleSet, Tier, WeightFormat,
};
use solder_config::{Fp8Strategy, ModelConfig, Quantization, ServeShape};

const FP8: WeightFormat = WeightFormat::Fp8 {
    block_n: 128,
    block_k: 128,
};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rules() -> RuleSet {
    RuleSet::from_file(&root().join("fusions/FUSIONS.toml")).expect("shipped rules")
}

fn config(name: &str, quantization: Option<Quantization>) -> ModelConfig {
    let path = root().join(format!("tests/fixtures/configs/{name}.json"));
    let mut config = ModelConfig::from_file(&path).expect("config");
    config.quantization = quantization;
    config
}

fn fp8_block() -> Quantization {
    Quantization::Fp8Block {
        block: [128, 128],
        not_converted: Vec::new(),
    }
}

fn instance_with(config: &ModelConfig, spec: &PrecisionSpec, rules: &RuleSet) -> Instance {
    Instance::from_config_precision(
        config,
        ServeShape::default(),
        CircuitOptions::default(),
        spec,
        rules,
    )
    .expect("instance")
}

fn format_of(instance: &Instance, name: &str) -> WeightFormat {
    instance
        .storage()
        .weights
        .iter()
        .find(|w| w.name == name)
        .unwrap_or_else(|| panic!("no slot {name}"))
        .format
}

fn plan(instance: &Instance, rules: &RuleSet, policy: &Policy) -> ExecutionPlan {
    ExecutionPlan::build_with(
        instance,
        rules,
        &Available::all_kernels(rules),
        policy,
        Mode::Decode,
        1,
        BuildOptions { verify: true },
    )
    .expect("plan")
}

#[test]
fn native_fp8_quantizes_the_projections_and_keeps_the_rest_bf16() {
    let rules = rules();
    let moe = instance_with(
        &config("golden-qwen3-next", Some(fp8_block())),
        &PrecisionSpec::default(),
        &rules,
    );
    for name in [
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.o_proj.weight",
        "model.layers.0.linear_attn.in_proj_qkvz.weight",
        "model.layers.0.linear_attn.out_proj.weight",
        "model.layers.0.mlp.experts.*.gate_proj.weight",
        "model.layers.0.mlp.experts.*.down_proj.weight",
        "model.layers.0.mlp.shared_expert.up_proj.weight",
    ] {
        assert_eq!(format_of(&moe, name), FP8, "{name}");
    }
    for name in [
        "model.embed_tokens.weight",
        "lm_head.weight",
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.mlp.gate.weight",
        "model.layers.0.mlp.shared_expert_gate.weight",
        "model.layers.0.linear_attn.conv1d.weight",
        "model.layers.0.linear_attn.A_log",
    ] {
        assert_eq!(format_of(&moe, name), WeightFormat::Bf16, "{name}");
    }
    // Every op that reads an fp8 slot is a projection.
    for op in &moe.circuit.ops {
        if op
            .weights
            .iter()
            .any(|w| moe.circuit.weights[w.0 as usize].format != WeightFormat::Bf16)
        {
            assert!(
                matches!(
                    op.kind,
                    OpKind::Linear | OpKind::MoeGateUp | OpKind::MoeDown
                ),
                "{} ({:?}) reads an fp8 weight",
                op.name,
                op.kind
            );
        }
    }
    // The prefill programs' circuit serves every slot in the same format.
    let prefill = moe.circuit_for(Mode::Prefill).expect("a prefill circuit");
    assert_eq!(prefill.weights, moe.circuit.weights);
}

#[test]
fn the_checkpoint_lists_and_the_method_decide_lm_head_and_skipped_modules() {
    let rules = rules();
    let skipping = Quantization::Fp8Block {
        block: [128, 128],
        not_converted: vec!["model.layers.1.mlp".to_string()],
    };
    let i = instance_with(
        &config("golden-qwen3-moe", Some(skipping)),
        &PrecisionSpec::default(),
        &rules,
    );
    assert_eq!(
        format_of(&i, "model.layers.1.mlp.experts.*.up_proj.weight"),
        WeightFormat::Bf16
    );
    assert_eq!(
        format_of(&i, "model.layers.0.mlp.experts.*.up_proj.weight"),
        FP8
    );
    // compressed-tensors quantizes lm_head where `ignore` does not name it; channel scales.
    let ct = |ignore: Vec<String>| Quantization::Fp8Compressed {
        strategy: Fp8Strategy::Channel,
        targets: vec!["Linear".to_string()],
        ignore,
    };
    let llama = |q| {
        instance_with(
            &config("golden-llama-gqa", Some(q)),
            &PrecisionSpec::default(),
            &rules,
        )
    };
    let head = llama(ct(Vec::new()));
    let hidden = head
        .circuit
        .weights
        .iter()
        .find(|w| w.name == "lm_head.weight")
        .unwrap()
        .shape[1];
    assert_eq!(
        format_of(&head, "lm_head.weight"),
        WeightFormat::Fp8 {
            block_n: 1,
            block_k: hidden as u32
        }
    );
    let ignored = llama(ct(vec!["lm_head".to_string()]));
    assert_eq!(format_of(&ignored, "lm_head.weight"), WeightFormat::Bf16);
    // AWQ never quantizes the head; int4 with its group.
    let awq = llama(Quantization::Awq {
        group_size: 32,
        zero_point: true,
        not_converted: Vec::new(),
    });
    assert_eq!(format_of(&awq, "lm_head.weight"), WeightFormat::Bf16);
    assert_eq!(
        format_of(&awq, "model.layers.0.mlp.down_proj.weight"),
        WeightFormat::Int4 { group: 32 }
    );
    // A tied head is the embedding table: never quantized.
    let tied = instance_with(
        &config("golden-qwen3-dense", Some(fp8_block())),
        &PrecisionSpec::default(),
        &rules,
    );
    assert_eq!(
        format_of(&tied, "model.embed_tokens.weight"),
        WeightFormat::Bf16
    );
}

#[test]
fn the_bf16_tier_serves_every_weight_bf16_and_remembers_the_checkpoint() {
    let rules = rules();
    let i = instance_with(
        &config("golden-qwen3-moe", Some(fp8_block())),
        &PrecisionSpec::Policy(Tier::Bf16),
        &rules,
    );
    assert!(i
        .storage()
        .weights
        .iter()
        .all(|w| w.format == WeightFormat::Bf16));
    assert!(i.precision.checkpoint_formats.contains(&FP8));
    let bf16 = Instance::from_config(&config("golden-qwen3-moe", None), ServeShape::default())
        .expect("instance");
    let (a, b) = (
        plan(&i, &rules, &Policy::default()),
        plan(&bf16, &rules, &Policy::default()),
    );
    assert_eq!(
        a.digest, b.digest,
        "the bf16 tier plans as a bf16 checkpoint"
    );
}

#[test]
fn a_table_overrides_and_refuses_by_name() {
    let rules = rules();
    let cfg = config("golden-qwen3-moe", Some(fp8_block()));
    let q = "model.layers.0.self_attn.q_proj.weight";
    let table = PrecisionSpec::Table(vec![(q.to_string(), WeightFormat::Bf16)]);
    let i = instance_with(&cfg, &table, &rules);
    assert_eq!(format_of(&i, q), WeightFormat::Bf16);
    assert_eq!(format_of(&i, "model.layers.0.self_attn.k_proj.weight"), FP8);

    let refused = |entries: Vec<(&str, WeightFormat)>, rules: &RuleSet| {
        let spec = PrecisionSpec::Table(
            entries
                .into_iter()
                .map(|(n, f)| (n.to_string(), f))
                .collect(),
        );
        Instance::from_config_precision(
            &cfg,
            ServeShape::default(),
            CircuitOptions::default(),
            &spec,
            rules,
        )
        .expect_err("refused")
        .to_string()
    };
    let e = refused(vec![("model.layers.0.q_proj.weight", FP8)], &rules);
    assert!(
        e.contains("model.layers.0.q_proj.weight") && e.contains("names no weight slot"),
        "{e}"
    );
    // lm_head is bf16 in the checkpoint: quantizing it at load is not supported.
    let e = refused(vec![("lm_head.weight", FP8)], &rules);
    assert!(
        e.contains("lm_head.weight")
            && e.contains("fp8[128x128]")
            && e.contains("quantizing at load"),
        "{e}"
    );
    // A format the checkpoint does not store the tensor in.
    let e = refused(vec![(q, WeightFormat::Int4 { group: 128 })], &rules);
    assert!(
        e.contains(q) && e.contains("int4[g128]") && e.contains("stores it as fp8[128x128]"),
        "{e}"
    );
    // A format no reference kernel reads for the op: the rule and kernel are named.
    let bf16_only = RuleSet::from_toml_str(
        &std::fs::read_to_string(root().join("fusions/FUSIONS.toml"))
            .unwrap()
            .replace("formats = [\"bf16\", \"fp8\", \"int4\"]\n", ""),
        "bf16-only",
    )
    .unwrap();
    let e = refused(vec![(q, FP8)], &bf16_only);
    assert!(
        e.contains(q)
            && e.contains("fp8[128x128]")
            && e.contains("rule `linear` (gemv::linear) reads bf16"),
        "{e}"
    );
    // The native policy serves such a tensor bf16 instead.
    let native = instance_with(&cfg, &PrecisionSpec::default(), &bf16_only);
    assert_eq!(format_of(&native, q), WeightFormat::Bf16);
}

#[test]
fn fused_rules_never_take_an_fp8_weight_and_the_digest_names_formats() {
    let rules = rules();
    let bf16 = Instance::from_config(&config("golden-llama-gqa", None), ServeShape::default())
        .expect("instance");
    let fp8 = instance_with(
        &config("golden-llama-gqa", Some(fp8_block())),
        &PrecisionSpec::default(),
        &rules,
    );
    let (pb, pq) = (
        plan(&bf16, &rules, &Policy::default()),
        plan(&fp8, &rules, &Policy::default()),
    );
    assert_ne!(pb.digest, pq.digest, "fp8 weights change the plan digest");
    assert!(!pb.fusion.canonical_text(&bf16.circuit).contains("weight="));
    assert!(pq
        .fusion
        .canonical_text(&fp8.circuit)
        .contains(":fp8[128x128]"));
    for g in &pq.fusion.groups {
        let reads_fp8 = g.nodes.iter().any(|n| {
            fp8.circuit
                .op(*n)
                .weights
                .iter()
                .any(|w| fp8.circuit.weights[w.0 as usize].format == FP8)
        });
        if reads_fp8 {
            let rule = rules.get(&g.rule).unwrap();
            assert!(rule.reads(FP8), "rule {} took an fp8 weight", g.rule);
            assert_eq!(g.nodes.len(), 1, "fused rule {} took an fp8 weight", g.rule);
        }
    }
    // Bytes per format: the projections' fp8 bytes are about half their bf16 bytes.
    assert!(!pb.has_quantized_weights() && pq.has_quantized_weights());
    let text = pq.display(&fp8.circuit).to_string();
    assert!(
        text.contains("  weights bf16 ") && text.contains("fp8[128x128]"),
        "{text}"
    );
    assert!(!pb.display(&bf16.circuit).to_string().contains("  weights "));
    let total = |p: &ExecutionPlan| p.weight_bytes.iter().map(|w| w.bytes).sum::<u64>();
    assert!(total(&pq) < total(&pb), "{} < {}", total(&pq), total(&pb));
}

#[test]
fn a_node_no_rule_reads_is_refused_naming_tensor_format_and_kernels() {
    let rules = rules();
    let fp8 = Instance::from_config(
        &config("golden-llama-gqa", Some(fp8_block())),
        ServeShape::default(),
    )
    .expect("instance");
    let bf16_only = RuleSet::from_toml_str(
        &std::fs::read_to_string(root().join("fusions/FUSIONS.toml"))
            .unwrap()
            .replace("formats = [\"bf16\", \"fp8\", \"int4\"]\n", ""),
        "bf16-only",
    )
    .unwrap();
    let e = ExecutionPlan::build_with(
        &fp8,
        &bf16_only,
        &Available::all_kernels(&bf16_only),
        &Policy::default(),
        Mode::Decode,
        1,
        BuildOptions { verify: true },
    )
    .expect_err("refused")
    .to_string();
    assert!(e.contains(".weight` stored as fp8[128x128]"), "{e}");
    assert!(e.contains("rule `linear` (gemv::linear) reads bf16"), "{e}");
    assert!(e.contains("(linear in mode decode at 1 rows)"), "{e}");
    // With the shipped rules it plans, and only reference rules read the projections.
    plan(&fp8, &rules, &Policy::reference_only());
}

#[test]
fn rule_formats_parse_default_and_refuse_unknown_kinds() {
    let rule = |formats: &str| {
        format!(
            "schema = 1\n[[rule]]\nid = \"linear\"\npattern = [{{ op = \"linear\" }}]\n\
             kernel = \"gemv::linear\"\nnumerics = \"reference\"\n{formats}"
        )
    };
    let default = RuleSet::from_toml_str(&rule(""), "t").unwrap();
    assert_eq!(default.rules[0].formats, ["bf16"]);
    let listed = RuleSet::from_toml_str(&rule("formats = [\"int4\", \"bf16\"]\n"), "t").unwrap();
    assert_eq!(listed.rules[0].formats, ["bf16", "int4"]);
    assert_ne!(default.digest, listed.digest);
    let only_bf16 = RuleSet::from_toml_str(&rule("formats = [\"bf16\"]\n"), "t").unwrap();
    assert_eq!(
        default.digest, only_bf16.digest,
        "bf16 is the default, not in the digest"
    );
    for (bad, says) in [
        ("formats = [\"fp4\"]\n", "unknown weight format `fp4`"),
        ("formats = []\n", "`formats` is empty"),
        ("formats = [\"fp8\", \"fp8\"]\n", "lists `fp8` twice"),
    ] {
        let e = RuleSet::from_toml_str(&rule(bad), "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("rule `linear`") && e.contains(says), "{e}");
    }
}

#[test]
fn traffic_counts_quantized_weights_in_their_format() {
    let rules = rules();
    let moe = instance_with(
        &config("golden-qwen3-moe", Some(fp8_block())),
        &PrecisionSpec::default(),
        &rules,
    );
    let p = plan(&moe, &rules, &Policy::reference_only());
    let t = solder_circuit::plan_traffic(&moe.circuit, &p, 0);
    let by_format = t.weights_read_by_format();
    assert_eq!(by_format[0].0, WeightFormat::Bf16);
    assert_eq!(
        by_format.iter().map(|(_, b)| *b).sum::<u64>(),
        t.weights_read()
    );
    // One row reads its k experts' matrices, each a whole stride of the stacked slot.
    let slot = moe
        .circuit
        .weights
        .iter()
        .find(|w| w.name == "model.layers.0.mlp.experts.*.down_proj.weight")
        .unwrap();
    let (n, k) = (slot.shape[1], slot.shape[2]);
    let stride = FP8.layout(n, k).unwrap().stride as u64;
    let down = t
        .launches
        .iter()
        .find(|l| l.kernels == ["moe::down"] && l.layer == Some(0))
        .unwrap();
    let experts_per_token = 2;
    assert_eq!(down.weights_read, experts_per_token * stride);
    assert_eq!(down.weights_by_format, [(FP8, experts_per_token * stride)]);
    // A dense projection reads its whole blob: values, then scales at the next 256 bytes.
    let q = moe
        .circuit
        .weights
        .iter()
        .find(|w| w.name == "model.layers.0.self_attn.q_proj.weight")
        .unwrap();
    assert_eq!(q.bytes(), FP8.layout(q.shape[0], q.shape[1]).unwrap().bytes);
    assert!(q.bytes() < q.shape[0] * q.shape[1] * 2);
}

/// Under `tensor_cores`, the fused q/k/v (with rope and the KV write) and gate/up rules take
/// quantized projections of one kind (their fp8/int4 entries read one), and leave a chain that
/// mixes kinds (here k_proj kept bf16 by the checkpoint) to the single projections' rule.
#[test]
fn fused_tensor_core_rules_take_one_quantized_kind_and_leave_mixed_chains_alone() {
    let rules = rules();
    let mut policy = Policy::default();
    policy
        .levers
        .set("tensor_cores", true)
        .expect("a known lever");
    let groups_of = |instance: &Instance| {
        let p = ExecutionPlan::build_with(
            instance,
            &rules,
            &Available::all_kernels(&rules),
            &policy,
            Mode::MultiSeq,
            32,
            BuildOptions { verify: true },
        )
        .expect("plan");
        p.fusion
            .groups
            .iter()
            .map(|g| {
                let names: Vec<String> = g
                    .nodes
                    .iter()
                    .map(|n| instance.circuit.op(*n).name.clone())
                    .collect();
                (g.rule.clone(), names)
            })
            .collect::<Vec<_>>()
    };
    let layer0 = |groups: &[(String, Vec<String>)], rule: &str| {
        groups
            .iter()
            .filter(|(r, names)| r == rule && names.iter().any(|n| n.starts_with("l0.")))
            .count()
    };
    for q in [
        fp8_block(),
        Quantization::Awq {
            group_size: 32,
            zero_point: true,
            not_converted: Vec::new(),
        },
    ] {
        let one = instance_with(
            &config("golden-llama-gqa", Some(q)),
            &PrecisionSpec::default(),
            &rules,
        );
        assert_ne!(
            format_of(&one, "model.layers.0.self_attn.k_proj.weight"),
            WeightFormat::Bf16
        );
        let groups = groups_of(&one);
        // llama has no qk-norm: q/k/v with rope and the KV write in one group.
        assert_eq!(layer0(&groups, "qkv_rope_kv_tensor_cores"), 1, "{groups:?}");
        assert_eq!(
            layer0(&groups, "gate_up_silu_tensor_cores"),
            1,
            "{groups:?}"
        );
    }
    let mixed = instance_with(
        &config(
            "golden-llama-gqa",
            Some(Quantization::Fp8Block {
                block: [128, 128],
                not_converted: vec!["model.layers.0.self_attn.k_proj".to_string()],
            }),
        ),
        &PrecisionSpec::default(),
        &rules,
    );
    assert_eq!(
        format_of(&mixed, "model.layers.0.self_attn.k_proj.weight"),
        WeightFormat::Bf16
    );
    assert_eq!(
        format_of(&mixed, "model.layers.0.self_attn.q_proj.weight"),
        FP8
    );
    let groups = groups_of(&mixed);
    assert_eq!(layer0(&groups, "qkv_rope_kv_tensor_cores"), 0, "{groups:?}");
    assert_eq!(layer0(&groups, "qkv_tensor_cores"), 0, "{groups:?}");
    // q, k and v each on their own, in their own formats; gate/up (both fp8) still fused.
    assert_eq!(layer0(&groups, "linear_tensor_cores"), 5, "{groups:?}");
    assert_eq!(
        layer0(&groups, "gate_up_silu_tensor_cores"),
        1,
        "{groups:?}"
    );
}
