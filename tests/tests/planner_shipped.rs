//! The planner on every shipped dense config at every (mode, rows) its serve shape asks for:
//! the pool within 2% of the bound, five launches per layer (six with `split_rope_kv`, four with
//! `fold_o_proj`), verified,
//! deterministic.

use solder_circuit::verify::verify_plan;
use solder_circuit::{
    plans_digest, Available, BuildOptions, CircuitError, ExecutionPlan, Instance, Mode, Policy,
    RuleSet, StepKind,
};
use solder_tests::{load_instance, load_rules, DENSE_CONFIGS};

fn instance(model: &str) -> Instance {
    load_instance(model).unwrap_or_else(|e| panic!("{model}: {e}"))
}

fn rules() -> RuleSet {
    load_rules().expect("shipped rules")
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
    .unwrap_or_else(|e| panic!("{} {mode} rows={rows}: {e}", instance.circuit.name))
}

fn ladder(instance: &Instance, rules: &RuleSet, policy: &Policy) -> Vec<ExecutionPlan> {
    instance
        .shapes()
        .into_iter()
        .map(|(mode, rows)| build(instance, rules, policy, mode, rows))
        .collect()
}

#[test]
fn every_shipped_plan_is_verified_tight_and_fused() {
    let rules = rules();
    let available = Available::all_kernels(&rules);
    for model in DENSE_CONFIGS {
        let instance = instance(model);
        let shapes = instance.shapes();
        assert!(
            shapes.len() >= 3 && shapes[0] == (Mode::Decode, 1),
            "{model}: {shapes:?}"
        );
        for plan in ladder(&instance, &rules, &Policy::default()) {
            let at = format!("{model} {} rows={}", plan.mode, plan.rows);
            assert!(
                plan.pool_bytes as f64 <= 1.02 * plan.live_lower_bound as f64,
                "{at}: pool_bytes {} above 1.02 x live_lower_bound {}",
                plan.pool_bytes,
                plan.live_lower_bound
            );
            assert!(
                plan.pool_bytes >= plan.live_lower_bound && plan.live_lower_bound > 0,
                "{at}"
            );
            assert!(
                plan.launches_per_layer <= 5 && plan.launches_per_layer > 0,
                "{at}: {} per layer",
                plan.launches_per_layer
            );
            assert!(
                plan.kernel_count_fused < plan.kernel_count_original,
                "{at}: nothing fused"
            );
            // A prefill plan's circuit is the model's without its logits (fewer ops).
            let circuit = instance.circuit_for(plan.mode).expect("a circuit");
            assert_eq!(plan.kernel_count_original, circuit.ops.len(), "{at}");
            verify_plan(circuit, &plan, &available).unwrap_or_else(|e| panic!("{at}: {e}"));
        }
    }
}

/// The q/k/v-with-rope rules fold rope (and qk-norm) and the KV write into the projection:
/// five launches per dense layer at every (mode, rows); the `split_rope_kv` lever (the A/B arm a
/// device run times) brings back the six-launch layer, with a rope+KV-write launch per layer.
#[test]
fn dense_layers_launch_five_times_and_six_with_split_rope_kv() {
    let rules = rules();
    let mut split = Policy::default();
    split
        .levers
        .set("split_rope_kv", true)
        .expect("a known lever");
    for model in DENSE_CONFIGS {
        let instance = instance(model);
        let layers = instance.circuit.num_layers as usize;
        for (fused, unfused) in ladder(&instance, &rules, &Policy::default())
            .iter()
            .zip(ladder(&instance, &rules, &split))
        {
            let at = format!("{model} {} rows={}", fused.mode, fused.rows);
            assert_eq!(fused.launches_per_layer, 5, "{at}: fused");
            assert_eq!(unfused.launches_per_layer, 6, "{at}: split_rope_kv");
            let rope_launches = |plan: &ExecutionPlan| {
                plan.fusion
                    .groups
                    .iter()
                    .filter(|g| g.kernels.iter().any(|k| k.starts_with("rope::")))
                    .count()
            };
            let epilogue = |plan: &ExecutionPlan| {
                plan.fusion
                    .groups
                    .iter()
                    .filter(|g| g.kernels.iter().any(|k| k == "gemv::qkv_rope_kv"))
                    .count()
            };
            assert_eq!((rope_launches(fused), epilogue(fused)), (0, layers), "{at}");
            assert_eq!(
                (rope_launches(&unfused), epilogue(&unfused)),
                (layers, 0),
                "{at}"
            );
        }
    }
}

/// The `fold_o_proj` lever (a `differs` rule, off by default) folds the o projection and the
/// attention residual add into attention: four launches per dense layer at every (mode, rows),
/// one o-fold launch per layer (`paged_decode_o`, or `paged_causal_o` in verify modes) and no
/// o projection of its own; with `split_rope_kv` too, five.
#[test]
fn dense_layers_launch_four_times_with_fold_o_proj() {
    let rules = rules();
    let mut fold = Policy::default();
    fold.levers.set("fold_o_proj", true).expect("a known lever");
    let mut fold_split = fold.clone();
    fold_split
        .levers
        .set("split_rope_kv", true)
        .expect("a known lever");
    for model in DENSE_CONFIGS {
        let instance = instance(model);
        let layers = instance.circuit.num_layers as usize;
        for (folded, split) in
            ladder(&instance, &rules, &fold)
                .iter()
                .zip(ladder(&instance, &rules, &fold_split))
        {
            let at = format!("{model} {} rows={}", folded.mode, folded.rows);
            assert_eq!(folded.launches_per_layer, 4, "{at}: fold_o_proj");
            assert_eq!(
                split.launches_per_layer, 5,
                "{at}: fold_o_proj + split_rope_kv"
            );
            let kernel = match folded.mode.rows_as() {
                Mode::Verify | Mode::VerifyBatch => "attn::paged_causal_o",
                _ => "attn::paged_decode_o",
            };
            let count = |plan: &ExecutionPlan, name: &str| {
                plan.fusion
                    .groups
                    .iter()
                    .filter(|g| g.kernels.iter().any(|k| k == name))
                    .count()
            };
            // A prefill program has no attention output in its last layer (only its KV write).
            let circuit = instance.circuit_for(folded.mode).expect("a circuit");
            let attending = match folded.mode {
                Mode::Prefill => layers - 1,
                _ => layers,
            };
            assert_eq!(count(folded, kernel), attending, "{at}");
            let o_proj_alone = folded
                .fusion
                .groups
                .iter()
                .filter(|g| g.kernels.iter().any(|k| k.starts_with("gemv::")))
                .filter(|g| g.nodes.iter().any(|n| circuit.op(*n).role == "o_proj"))
                .count();
            assert_eq!(o_proj_alone, 0, "{at}: an o projection launched by a gemv");
        }
    }
}

#[test]
fn reference_only_plans_launch_once_per_op() {
    let rules = rules();
    for model in DENSE_CONFIGS {
        let instance = instance(model);
        let ops = instance.circuit.ops.len();
        for (mode, rows) in [(Mode::Decode, 1), (Mode::MultiSeq, 8), (Mode::Verify, 4)] {
            let plan = build(&instance, &rules, &Policy::reference_only(), mode, rows);
            assert_eq!(plan.compute_steps(), ops, "{model} {mode} {rows}");
            assert_eq!(
                plan.kernel_count_fused, plan.kernel_count_original,
                "{model} {mode} {rows}"
            );
            assert!(plan
                .fusion
                .groups
                .iter()
                .all(|g| g.nodes.len() == 1 && g.fused.is_empty()));
            let all = build(&instance, &rules, &Policy::default(), mode, rows);
            assert_ne!(
                plan.digest, all.digest,
                "{model}: reference-only and all-rules plans"
            );
        }
    }
}

#[test]
fn digests_are_equal_across_two_builds() {
    for model in ["llama-3.2-1b", "qwen3-0.6b", "golden-qwen3-dense"] {
        let (a, b) = (instance(model), instance(model));
        let (ra, rb) = (rules(), rules());
        let plans_a = ladder(&a, &ra, &Policy::default());
        let plans_b = ladder(&b, &rb, &Policy::default());
        for (x, y) in plans_a.iter().zip(&plans_b) {
            assert_eq!(x.digest, y.digest, "{model} {} rows={}", x.mode, x.rows);
            assert_eq!(x, y, "{model} {} rows={}: the whole plan", x.mode, x.rows);
        }
        assert_eq!(plans_digest(&plans_a), plans_digest(&plans_b), "{model}");
        let distinct: std::collections::HashSet<&str> =
            plans_a.iter().map(|p| p.digest.as_str()).collect();
        assert_eq!(
            distinct.len(),
            plans_a.len(),
            "{model}: every (mode, rows) has its own digest"
        );
    }
}

#[test]
fn plans_digest_changes_when_one_plan_changes() {
    let rules = rules();
    let instance = instance("llama-3.2-1b");
    let plans = ladder(&instance, &rules, &Policy::default());
    let whole = plans_digest(&plans);
    assert_eq!(whole.len(), 64);
    let mut changed = plans.clone();
    changed[3] = build(
        &instance,
        &rules,
        &Policy::reference_only(),
        changed[3].mode,
        changed[3].rows,
    );
    assert_ne!(
        whole,
        plans_digest(&changed),
        "one plan rebuilt reference-only"
    );
    assert_ne!(
        whole,
        plans_digest(&plans[..plans.len() - 1]),
        "one plan fewer"
    );
    let mut swapped = plans.clone();
    swapped.swap(0, 1);
    assert_ne!(whole, plans_digest(&swapped), "order of the ladder");
}

#[test]
fn steps_on_total_steps_and_compute_steps_agree() {
    let rules = rules();
    for model in DENSE_CONFIGS {
        let instance = instance(model);
        for plan in ladder(&instance, &rules, &Policy::default()) {
            let at = format!("{model} {} rows={}", plan.mode, plan.rows);
            let on: usize = (0..plan.num_streams as u8)
                .map(|s| plan.steps_on(s).count())
                .sum();
            assert_eq!(on, plan.total_steps(), "{at}");
            assert_eq!(plan.steps_on(plan.num_streams as u8).count(), 0, "{at}");
            let launches = plan
                .steps
                .iter()
                .filter(|s| matches!(s.kind, StepKind::Launch(_)))
                .count();
            assert_eq!(launches, plan.order.len(), "{at}");
            assert_eq!(launches, plan.fusion.groups.len(), "{at}");
            let kernels: usize = plan.fusion.groups.iter().map(|g| g.kernels.len()).sum();
            assert_eq!(plan.compute_steps(), kernels, "{at}");
            assert_eq!(plan.compute_steps(), plan.kernel_count_fused, "{at}");
            let records = plan
                .steps
                .iter()
                .filter(|s| matches!(s.kind, StepKind::Record(_)))
                .count();
            assert_eq!(records, plan.event_count, "{at}");
            assert_eq!(plan.total_steps(), plan.steps.len(), "{at}");
        }
    }
}

#[test]
fn dot_mentions_every_group_and_display_leads_with_the_pool() {
    let rules = rules();
    for model in ["llama-3.2-1b", "qwen3-0.6b"] {
        let instance = instance(model);
        let plan = build(&instance, &rules, &Policy::default(), Mode::MultiSeq, 8);
        let dot = plan.to_dot(&instance.circuit);
        assert!(dot.starts_with("digraph "), "{model}");
        for (gi, g) in plan.fusion.groups.iter().enumerate() {
            let label = format!("  g{gi} [label=");
            assert_eq!(
                dot.matches(&label).count(),
                1,
                "{model}: group {gi} in the DOT"
            );
            let first_op = &instance.circuit.op(g.nodes[0]).name;
            assert!(
                dot.contains(first_op.as_str()),
                "{model}: `{first_op}` in the DOT"
            );
        }
        let text = plan.display(&instance.circuit).to_string();
        let head: Vec<&str> = text.lines().take(5).collect();
        assert_eq!(head[0], format!("plan {model} multi_seq rows=8"));
        let pool = format!(
            "pool_bytes {} live_lower_bound {}",
            plan.pool_bytes, plan.live_lower_bound
        );
        assert!(head.iter().any(|l| l.contains(&pool)), "{model}: {head:#?}");
    }
}

#[test]
fn decode_with_two_rows_is_an_error() {
    let rules = rules();
    let instance = instance("llama-3.2-1b");
    let available = Available::all_kernels(&rules);
    let err = ExecutionPlan::build(
        &instance,
        &rules,
        &available,
        &Policy::default(),
        Mode::Decode,
        2,
    )
    .expect_err("decode runs one row");
    assert!(
        matches!(err, CircuitError::BadRows { ref mode, rows: 2, .. } if mode == "decode"),
        "{err:?}"
    );
}

#[test]
fn tied_embeddings_share_the_embedding_slot() {
    for (model, tied) in [
        ("qwen3-0.6b", true),
        ("llama-3.1-8b", false),
        ("llama-3.2-1b", true),
    ] {
        let c = instance(model).circuit;
        let named = |n: &str| c.weights.iter().filter(|w| w.name == n).count();
        assert_eq!(named("model.embed_tokens.weight"), 1, "{model}");
        assert_eq!(named("lm_head.weight"), usize::from(!tied), "{model}");
        let head = c
            .ops
            .iter()
            .find(|o| o.name == "lm_head")
            .expect("lm_head op");
        let slot = &c.weights[head.weights[0].0 as usize].name;
        let want = if tied {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        assert_eq!(slot, want, "{model}");
    }
}

#[test]
fn renaming_a_rule_changes_the_rules_digest_but_no_plan_digest() {
    let text = std::fs::read_to_string(solder_tests::rules_path()).expect("shipped rules");
    let renamed = text.replace(
        "id = \"add_norm_qkv_qk_norm_rope_kv\"",
        "id = \"fold_add_norm_into_qkv\"",
    );
    assert_ne!(
        text, renamed,
        "the shipped rules name add_norm_qkv_qk_norm_rope_kv"
    );
    let a = RuleSet::from_toml_str(&text, "FUSIONS.toml").unwrap();
    let b = RuleSet::from_toml_str(&renamed, "FUSIONS.toml").unwrap();
    assert_ne!(a.digest, b.digest);
    let instance = instance("qwen3-8b");
    for (mode, rows) in [(Mode::Decode, 1), (Mode::MultiSeq, 32)] {
        let (pa, pb) = (
            build(&instance, &a, &Policy::default(), mode, rows),
            build(&instance, &b, &Policy::default(), mode, rows),
        );
        assert!(pb
            .fusion
            .groups
            .iter()
            .any(|g| g.rule == "fold_add_norm_into_qkv"));
        assert_eq!(pa.digest, pb.digest, "{mode} {rows}");
        assert_ne!(pa.rules_digest, pb.rules_digest);
    }
}

#[test]
fn every_moe_plan_is_verified_and_tight() {
    let rules = solder_tests::load_rules().expect("rules");
    let available = solder_circuit::Available::all_kernels(&rules);
    for name in solder_tests::MOE_CONFIGS {
        let instance = solder_tests::load_instance(name).expect("moe config loads and builds");
        for (mode, rows) in instance.shapes() {
            let plan = solder_circuit::ExecutionPlan::build_with(
                &instance,
                &rules,
                &available,
                &solder_circuit::Policy::default(),
                mode,
                rows,
                solder_circuit::BuildOptions { verify: true },
            )
            .unwrap_or_else(|e| panic!("{name} {mode} {rows}: {e}"));
            assert!(
                plan.pool_bytes as f64 <= 1.02 * plan.live_lower_bound as f64,
                "{name} {mode} {rows}: pool {} vs bound {}",
                plan.pool_bytes,
                plan.live_lower_bound
            );
            assert!(
                plan.kernel_count_fused < plan.kernel_count_original,
                "{name}: nothing fused"
            );
            // Router and top-k always fuse; the experts stay two launches.
            let groups: Vec<&str> = plan
                .fusion
                .groups
                .iter()
                .map(|g| g.kernels[0].as_str())
                .collect();
            assert!(
                groups.contains(&"moe::router_topk"),
                "{name} {mode} {rows}: {groups:?}"
            );
        }
    }
}

/// The shipped config files: every `tests/fixtures/configs/*.json`, by name, sorted.
fn shipped_configs() -> Vec<String> {
    let dir = solder_tests::workspace_root().join("tests/fixtures/configs");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|entry| {
            let path = entry.expect("a directory entry").path();
            let is_json = path.extension().is_some_and(|x| x == "json");
            is_json.then(|| path.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    names.sort();
    names
}

/// Issue 18: every program a shipped config serves keeps its arena within 2% of the live lower
/// bound. Every config file under `tests/fixtures/configs`, every (mode, rows) of the default
/// serve shape, under all rules and reference-only rules. qwen3-30b-a3b's MoE layer was 32 KiB
/// against 28 KiB at decode (1.1429) while first-fit placed every layer alike; the memory
/// pass's search reaches the bound.
#[test]
fn every_shipped_program_pools_within_2_percent_of_its_bound() {
    let rules = rules();
    let available = Available::all_kernels(&rules);
    let policies = [
        ("all rules", Policy::default()),
        ("reference-only", Policy::reference_only()),
    ];
    let configs = shipped_configs();
    assert!(configs.len() >= 11, "{configs:?}");
    // Every program of the default serve shape, and the MTP head's draft programs where a
    // config has the head (its plans run beside the shared expert's side stream).
    let mut served: Vec<(String, Instance, bool)> = Vec::new();
    for model in &configs {
        served.push((model.clone(), instance(model), false));
        if let Ok(with_draft) = solder_tests::load_instance_with_draft(model, &[1, 2, 4, 8]) {
            served.push((format!("{model} (draft)"), with_draft, true));
        }
    }
    assert!(
        served.iter().any(|(_, _, draft)| *draft),
        "no shipped config has an MTP head: the draft programs went untested"
    );
    let (mut failures, mut plans, mut worst) = (Vec::new(), 0usize, (0.0f64, String::new()));
    for (model, instance, draft_only) in &served {
        for (policy_name, policy) in &policies {
            for (mode, rows) in instance.shapes() {
                if *draft_only && mode != Mode::Draft {
                    continue;
                }
                let at = format!("{model} [{policy_name}] {mode} rows={rows}");
                let plan = ExecutionPlan::build_with(
                    instance,
                    &rules,
                    &available,
                    policy,
                    mode,
                    rows,
                    BuildOptions { verify: false },
                )
                .unwrap_or_else(|e| panic!("{at}: {e}"));
                plans += 1;
                let ratio = plan.pool_bytes as f64 / plan.live_lower_bound.max(1) as f64;
                if ratio > worst.0 {
                    worst = (ratio, at.clone());
                }
                if plan.pool_bytes as f64 > 1.02 * plan.live_lower_bound as f64 {
                    failures.push(format!(
                        "{at}: pool_bytes {} above 1.02 x live_lower_bound {} (ratio {ratio:.4}, {})",
                        plan.pool_bytes, plan.live_lower_bound, plan.placement
                    ));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {plans} plans above 1.02 x their bound:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "{plans} plans; worst pool/bound {:.4} at {}",
        worst.0, worst.1
    );
}
