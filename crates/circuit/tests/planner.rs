//! The planner on inline configs and small hand-built circuits: family details (bias,
//! tied embeddings), streams and events, the renderings, and a verifier that catches
//! broken plans. The shipped configs are planned in `tests/tests/planner_shipped.rs`.

use std::path::Path;

use solder_circuit::builder::{CircuitBuilder, OpSpec, OutSpec};
use solder_circuit::ir::{Binding, Circuit, Dtype, ModelInput, TensorId};
use solder_circuit::planner::memory::align_up;
use solder_circuit::verify::verify_plan;
use solder_circuit::{
    build_circuit, Available, BuildOptions, CircuitError, CircuitOptions, ExecutionPlan, Instance,
    Mode, OpKind, Policy, RuleSet, StepKind,
};
use solder_config::{ModelConfig, ServeShape};

fn shipped_rules() -> RuleSet {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fusions/FUSIONS.toml");
    RuleSet::from_file(&path).expect("shipped rules")
}

fn config(model_type: &str, extra: &str) -> ModelConfig {
    let text = format!(
        r#"{{"model_type": "{model_type}", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 300, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "hidden_act": "silu"{extra}}}"#
    );
    ModelConfig::from_json_str(&text, &format!("{model_type}-tiny.json")).expect("a tiny config")
}

fn build(
    instance: &Instance,
    rules: &RuleSet,
    policy: &Policy,
    mode: Mode,
    rows: usize,
) -> ExecutionPlan {
    let available = Available::all_kernels(rules);
    ExecutionPlan::build_with(
        instance,
        rules,
        &available,
        policy,
        mode,
        rows,
        BuildOptions { verify: true },
    )
    .unwrap_or_else(|e| panic!("{} {mode} {rows}: {e}", instance.circuit.name))
}

fn slot_names(c: &Circuit) -> Vec<&str> {
    c.weights.iter().map(|w| w.name.as_str()).collect()
}

#[test]
fn qwen2_attention_bias_builds_q_k_v_bias_slots() {
    let cfg = config("qwen2", "");
    assert!(cfg.attention_bias, "qwen2 always has q/k/v bias");
    let c = build_circuit(&cfg, "qwen2-tiny", CircuitOptions::default()).expect("circuit");
    let names = slot_names(&c);
    for l in 0..3 {
        for proj in ["q_proj", "k_proj", "v_proj"] {
            let bias = format!("model.layers.{l}.self_attn.{proj}.bias");
            assert!(names.contains(&bias.as_str()), "missing `{bias}`");
            let op = c
                .ops
                .iter()
                .find(|o| o.name == format!("l{l}.{proj}"))
                .expect("op");
            let ws: Vec<&str> = op
                .weights
                .iter()
                .map(|w| c.weights[w.0 as usize].name.as_str())
                .collect();
            assert_eq!(
                ws,
                [format!("model.layers.{l}.self_attn.{proj}.weight"), bias]
            );
        }
        assert!(!names.contains(&format!("model.layers.{l}.self_attn.o_proj.bias").as_str()));
    }
    let llama = build_circuit(
        &config("llama", ""),
        "llama-tiny",
        CircuitOptions::default(),
    )
    .unwrap();
    assert!(
        slot_names(&llama).iter().all(|n| !n.ends_with(".bias")),
        "control: llama has no bias"
    );
    let instance = Instance::new(c, ServeShape::default()).unwrap();
    let rules = shipped_rules();
    for (mode, rows) in [(Mode::Decode, 1), (Mode::MultiSeq, 4), (Mode::Verify, 3)] {
        build(&instance, &rules, &Policy::default(), mode, rows);
    }
}

#[test]
fn tied_embeddings_give_the_lm_head_the_embedding_slot() {
    let c = build_circuit(
        &config("llama", r#", "tie_word_embeddings": true"#),
        "tied",
        CircuitOptions::default(),
    )
    .unwrap();
    let names = slot_names(&c);
    assert_eq!(
        names
            .iter()
            .filter(|n| **n == "model.embed_tokens.weight")
            .count(),
        1
    );
    assert!(!names.contains(&"lm_head.weight"), "{names:?}");
    let weight_of = |kind: OpKind| c.ops.iter().find(|o| o.kind == kind).expect("op").weights[0];
    assert_eq!(weight_of(OpKind::LmHead), weight_of(OpKind::Embedding));
    // Control: untied, the head has its own slot.
    let c = build_circuit(&config("llama", ""), "untied", CircuitOptions::default()).unwrap();
    assert!(slot_names(&c).contains(&"lm_head.weight"));
    let weight_of = |kind: OpKind| c.ops.iter().find(|o| o.kind == kind).expect("op").weights[0];
    assert_ne!(weight_of(OpKind::LmHead), weight_of(OpKind::Embedding));
}

#[test]
fn decode_with_two_rows_is_an_error() {
    let instance = Instance::new(
        build_circuit(&config("llama", ""), "t", CircuitOptions::default()).unwrap(),
        ServeShape::default(),
    )
    .unwrap();
    let rules = shipped_rules();
    let err = ExecutionPlan::build(
        &instance,
        &rules,
        &Available::all_kernels(&rules),
        &Policy::default(),
        Mode::Decode,
        2,
    )
    .expect_err("decode runs one row");
    assert!(
        matches!(err, CircuitError::BadRows { rows: 2, .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("decode") && err.to_string().contains('2'),
        "{err}"
    );
    for (mode, rows) in [(Mode::MultiSeq, 1), (Mode::Verify, 0)] {
        assert!(ExecutionPlan::build(
            &instance,
            &rules,
            &Available::all_kernels(&rules),
            &Policy::default(),
            mode,
            rows
        )
        .is_err());
    }
}

/// x -> n; n -> a (branch 0), n -> b (branch `side`), n -> d (branch `side`); add(a, b) -> add2(., d).
fn forked(side: u8) -> Instance {
    let mut b = CircuitBuilder::new("forked", "test", 1);
    let x = b.input(OutSpec::rows("x", Dtype::F32, 64).bound(Binding::Input(ModelInput::Tokens)));
    let mut op = |kind: OpKind, name: &str, inputs: &[TensorId], branch: u8, width: usize| {
        let spec = OpSpec::new(kind, name, name).inputs(inputs).branch(branch);
        b.op1(
            spec,
            OutSpec::rows(format!("{name}.out"), Dtype::Bf16, width),
        )
        .unwrap()
    };
    let n = op(OpKind::RmsNorm, "n", &[x], 0, 64);
    let a = op(OpKind::Linear, "a", &[n], 0, 512);
    let bb = op(OpKind::Linear, "b", &[n], side, 300);
    let d = op(OpKind::Linear, "d", &[n], side, 1000);
    let s = op(OpKind::ResidualAdd, "s", &[a, bb], 0, 64);
    op(OpKind::ResidualAdd, "t", &[s, d], 0, 64);
    Instance::new(b.finish().unwrap(), ServeShape::default()).unwrap()
}

fn count(plan: &ExecutionPlan, want: fn(&StepKind) -> bool) -> usize {
    plan.steps.iter().filter(|s| want(&s.kind)).count()
}

#[test]
fn side_branches_get_a_stream_and_events_and_steps_add_up() {
    let rules = shipped_rules();
    let instance = forked(1);
    let policy = |max_streams| Policy {
        max_streams,
        ..Policy::default()
    };
    let one = build(&instance, &rules, &policy(1), Mode::MultiSeq, 4);
    assert_eq!((one.num_streams, one.event_count), (1, 0));
    assert_eq!(
        one.total_steps(),
        one.order.len(),
        "one stream: launches only"
    );
    let two = build(&instance, &rules, &policy(2), Mode::MultiSeq, 4);
    assert_eq!(two.num_streams, 2);
    assert!(two.event_count > 0);
    for plan in [&one, &two] {
        let per_stream: usize = (0..plan.num_streams as u8)
            .map(|s| plan.steps_on(s).count())
            .sum();
        assert_eq!(per_stream, plan.total_steps());
        assert_eq!(
            count(plan, |k| matches!(k, StepKind::Launch(_))),
            plan.order.len()
        );
        assert_eq!(
            count(plan, |k| matches!(k, StepKind::Record(_))),
            plan.event_count
        );
        assert!(count(plan, |k| matches!(k, StepKind::Wait(_))) >= plan.event_count);
        let kernels: usize = plan.fusion.groups.iter().map(|g| g.kernels.len()).sum();
        assert_eq!(plan.compute_steps(), kernels);
        verify_plan(&instance.circuit, plan, &Available::all_kernels(&rules)).expect("verified");
    }
    // The side stream holds b and d, and joins back into stream 0 before the step ends.
    let b_group = two.fusion.group_of[2];
    assert_eq!(two.stream_of[b_group.0 as usize], 1);
    assert!(matches!(
        two.steps.last().map(|s| (s.stream, s.kind)),
        Some((0, StepKind::Launch(_) | StepKind::Wait(_)))
    ));
    assert_ne!(one.digest, two.digest);
}

#[test]
fn verify_rejects_broken_plans() {
    let rules = shipped_rules();
    let available = Available::all_kernels(&rules);
    let instance = forked(1);
    let c = &instance.circuit;
    let plan = build(&instance, &rules, &Policy::default(), Mode::MultiSeq, 8);
    verify_plan(c, &plan, &available).expect("control: the built plan verifies");

    let mut no_waits = plan.clone();
    no_waits
        .steps
        .retain(|s| !matches!(s.kind, StepKind::Wait(_)));
    assert!(matches!(
        verify_plan(c, &no_waits, &available),
        Err(CircuitError::Verify { .. })
    ));

    let mut missing = available.clone();
    missing.kernels.remove("gemv::linear");
    assert!(
        verify_plan(c, &plan, &missing).is_err(),
        "a kernel the modules lack"
    );

    // Put a buffer on top of another that is live at the same time.
    let mut clash = plan.clone();
    let (i, j) = pair_live_together(&clash).expect("two buffers live together");
    clash.buffers[j].offset = clash.buffers[i].offset;
    clash.pool_bytes = clash
        .pool_bytes
        .max(clash.buffers[j].offset + align_up(clash.buffers[j].bytes));
    assert!(
        verify_plan(c, &clash, &available).is_err(),
        "overlapping live buffers"
    );

    let mut reordered = plan.clone();
    let last = reordered.order.len() - 1;
    reordered.order.swap(0, last);
    assert!(
        verify_plan(c, &reordered, &available).is_err(),
        "order against data flow"
    );
}

fn pair_live_together(plan: &ExecutionPlan) -> Option<(usize, usize)> {
    let bufs = &plan.buffers;
    (0..bufs.len())
        .flat_map(|i| (0..bufs.len()).map(move |j| (i, j)))
        .find(|&(i, j)| i != j && bufs[i].first <= bufs[j].last && bufs[j].first <= bufs[i].last)
}

#[test]
fn dot_and_display_name_every_group_and_the_pool() {
    let rules = shipped_rules();
    let instance = Instance::new(
        build_circuit(
            &config("qwen3", ""),
            "qwen3-tiny",
            CircuitOptions::default(),
        )
        .unwrap(),
        ServeShape::default(),
    )
    .unwrap();
    let plan = build(&instance, &rules, &Policy::default(), Mode::Verify, 4);
    let dot = plan.to_dot(&instance.circuit);
    assert!(dot.starts_with("digraph") && dot.ends_with("}\n"), "{dot}");
    for (gi, g) in plan.fusion.groups.iter().enumerate() {
        assert!(
            dot.contains(&format!("  g{gi} [label=")),
            "group {gi} missing from the DOT"
        );
        assert!(dot.contains(&g.kernels.join(" + ")));
    }
    let text = plan.display(&instance.circuit).to_string();
    let head: Vec<&str> = text.lines().take(6).collect();
    assert_eq!(head[0], "plan qwen3-tiny verify rows=4");
    let pool = format!(
        "pool_bytes {} live_lower_bound {}",
        plan.pool_bytes, plan.live_lower_bound
    );
    assert!(head.iter().any(|l| l.contains(&pool)), "{head:#?}");
    assert!(head.iter().any(|l| l.contains(&plan.digest)), "{head:#?}");
    assert!(plan.pool_bytes >= plan.live_lower_bound && plan.live_lower_bound > 0);
    // The golden files' form drops the rules digest line and nothing else.
    let rules_line = format!("  rules_digest {}\n", plan.rules_digest);
    assert!(text.contains(&rules_line), "{head:#?}");
    let golden_form = plan
        .display(&instance.circuit)
        .without_rules_digest()
        .to_string();
    assert_eq!(golden_form, text.replacen(&rules_line, "", 1));
}

#[test]
fn a_window_reaches_the_attention_op_the_printout_and_the_digest() {
    let rules = shipped_rules();
    let plan_of = |cfg: &ModelConfig| {
        let circuit = build_circuit(cfg, "qwen2-tiny", CircuitOptions::default()).unwrap();
        let instance = Instance::new(circuit, ServeShape::default()).unwrap();
        let plan = build(&instance, &rules, &Policy::default(), Mode::Decode, 1);
        let text = plan.display(&instance.circuit).to_string();
        (instance, plan, text)
    };
    // Layer 0 full attention, layers 1 and 2 a window of 32.
    let windowed = config(
        "qwen2",
        r#", "use_sliding_window": true, "sliding_window": 32, "max_window_layers": 1"#,
    );
    assert_eq!(windowed.layer_windows, vec![None, Some(32), Some(32)]);
    let (instance, plan, text) = plan_of(&windowed);
    let windows: Vec<Option<String>> = instance
        .circuit
        .ops
        .iter()
        .filter(|op| op.kind == OpKind::Attention)
        .map(|op| {
            op.attrs
                .iter()
                .find(|(key, _)| key == "window")
                .map(|(_, v)| v.to_string())
        })
        .collect();
    assert_eq!(windows, [None, Some("32".into()), Some("32".into())]);
    let attention_lines: Vec<&str> = text.lines().filter(|l| l.contains(".attention]")).collect();
    assert_eq!(attention_lines.len(), 3, "{text}");
    assert!(
        !attention_lines[0].contains("window="),
        "{}",
        attention_lines[0]
    );
    for line in &attention_lines[1..] {
        assert!(line.ends_with(" window=32"), "{line}");
    }
    // The same model without a window plans the same launches under another digest.
    let (_, full_plan, full_text) = plan_of(&config("qwen2", ""));
    assert!(!full_text.contains("window="));
    assert_eq!(full_plan.steps.len(), plan.steps.len());
    assert_ne!(full_plan.digest, plan.digest);
}
