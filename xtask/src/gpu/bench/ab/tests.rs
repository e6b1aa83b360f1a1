//! The A/B loop's tests: variants, bit-identity from the rules, the loop on the CPU backend.

use super::*;

fn rules() -> RuleSet {
    RuleSet::from_file(&crate::paths::workspace_root().join("fusions/FUSIONS.toml")).unwrap()
}

#[test]
fn variants_are_the_baseline_each_lever_and_all_together() {
    let rules = rules();
    let names = |list: &str| -> Vec<String> {
        variants(list, &rules)
            .unwrap()
            .into_iter()
            .map(|v| v.name)
            .collect()
    };
    assert_eq!(names("pdl"), ["baseline", "pdl"]);
    assert_eq!(
        names("pdl, split_rope_kv"),
        ["baseline", "pdl", "split_rope_kv", "pdl+split_rope_kv"]
    );
    let all = variants("pdl,split_rope_kv", &rules).unwrap();
    assert!(all.iter().all(|v| v.bit_identical), "{all:?}");
    assert_eq!(all[3].levers, ["pdl", "split_rope_kv"]);
    // An item of several levers is one variant; no "all together" when an item holds them all.
    assert_eq!(
        names("tensor_cores,tensor_cores+mma_narrow"),
        ["baseline", "tensor_cores", "tensor_cores+mma_narrow"]
    );
    assert_eq!(
        names("pdl,tensor_cores+mma_narrow"),
        [
            "baseline",
            "pdl",
            "tensor_cores+mma_narrow",
            "pdl+tensor_cores+mma_narrow"
        ]
    );
    let tc = variants("tensor_cores,tensor_cores+mma_narrow", &rules).unwrap();
    assert!(!tc[2].bit_identical, "{tc:?}");
    // tensor_cores+mma_narrow keeps tensor_cores' bytes; tensor_cores keeps no one's.
    let same: Vec<Option<usize>> = tc.iter().map(|v| v.same_as).collect();
    assert_eq!(same, [Some(0), None, Some(1)]);
    assert!(all.iter().all(|v| v.same_as == Some(0)), "{all:?}");
}

#[test]
fn unknown_empty_and_repeated_levers_are_refused_by_name() {
    let rules = rules();
    let err = variants("pdl,gemv_classicc", &rules).unwrap_err();
    assert!(
        err.contains("`gemv_classicc`") && err.contains("known levers"),
        "{err}"
    );
    assert!(variants("pdl,,split_rope_kv", &rules)
        .unwrap_err()
        .contains("empty lever name"));
    assert!(variants("pdl,pdl", &rules)
        .unwrap_err()
        .contains("`pdl` is named twice"));
    assert!(variants("pdl+pdl", &rules)
        .unwrap_err()
        .contains("`pdl` is named twice in `pdl+pdl`"));
    assert!(variants("pdl+", &rules)
        .unwrap_err()
        .contains("empty lever name"));
}

#[test]
fn a_lever_a_differs_rule_names_is_not_bit_identical() {
    let text = std::fs::read_to_string(crate::paths::workspace_root().join("fusions/FUSIONS.toml"))
        .unwrap()
        + r#"
[[rule]]
id = "zz_fast_exp_test"
pattern = [{ op = "silu_mul" }]
kernel = "act::silu_mul"
numerics = { differs = "fast_exp", tolerance = 0.01 }
priority = 1
"#;
    let rules = RuleSet::from_toml_str(&text, "test").unwrap();
    let all = variants("fast_exp,pdl", &rules).unwrap();
    let identical: Vec<(&str, bool)> = all
        .iter()
        .map(|v| (v.name.as_str(), v.bit_identical))
        .collect();
    assert_eq!(
        identical,
        [
            ("baseline", true),
            ("fast_exp", false),
            ("pdl", true),
            ("fast_exp+pdl", false)
        ]
    );
}

fn tiny_setup(rules: RuleSet) -> Setup {
    let builtin = crate::parity::builtin_named("tiny-llama").unwrap();
    let widths = vec![1, 2];
    Setup {
        name: "tiny-llama".into(),
        config: builtin.config().unwrap(),
        weights: WeightSource::Random { seed: builtin.seed },
        rules,
        serve: ServeShape::default(),
        kv: super::super::timing::kv_shape((8, 0), &widths),
        context: 8,
        widths,
        rounds: 3,
        runs: 2,
        max_seconds: 60.0,
        copy_bytes_per_s: 1e9,
    }
}

/// The whole A/B loop on the CPU backend with a tiny model: every variant at every width,
/// timed in both modes, logits the baseline's bytes.
#[test]
fn the_ab_loop_runs_on_the_cpu_backend() {
    let rules = rules();
    let all = variants("pdl,split_rope_kv", &rules).unwrap();
    let mut backend = solder_model_layers::kernels::cpu_backend(None).unwrap();
    let figures = measure(&mut backend, tiny_setup(rules), &all).unwrap();
    assert!(figures.problems().is_empty(), "{:?}", figures.problems());
    assert_eq!(figures.rows.len(), 8);
    for row in &figures.rows {
        assert_eq!(row.bytes, Bytes::Same, "{row:?}");
        assert_eq!((row.eager_runs, row.graph_runs), (6, 6), "{row:?}");
        assert!(row.graph_us > 0.0 && row.floor_us > 0.0, "{row:?}");
    }
    // split_rope_kv's layers launch once more each.
    let launches = |v: usize| {
        figures
            .rows
            .iter()
            .find(|r| r.variant == v)
            .unwrap()
            .launches
    };
    assert_eq!(launches(0), launches(1));
    assert!(launches(2) > launches(0));
    assert!(figures.table().contains("pdl+split_rope_kv"));
    assert_eq!(backend.live_allocations(), 0);
}

/// A variant that cannot build is reported and left out; the others are still measured.
#[test]
fn a_failing_variant_is_reported_and_the_others_still_run() {
    let text = std::fs::read_to_string(crate::paths::workspace_root().join("fusions/FUSIONS.toml"))
        .unwrap()
        + r#"
[[rule]]
id = "zz_missing_kernel_under_pdl"
pattern = [{ op = "residual_add" }]
kernel = "add::no_such_kernel"
numerics = "bit_identical"
when = { pdl = true }
priority = 10000
"#;
    let rules = RuleSet::from_toml_str(&text, "test").unwrap();
    let all = variants("pdl,split_rope_kv", &rules).unwrap();
    let mut backend = solder_model_layers::kernels::cpu_backend(None).unwrap();
    let figures = measure(&mut backend, tiny_setup(rules), &all).unwrap();
    let failed: Vec<usize> = figures.failures.iter().map(|(v, _)| *v).collect();
    assert_eq!(failed, [1, 3], "{:?}", figures.failures);
    assert!(
        figures.failures[0].1.contains("no_such_kernel"),
        "{:?}",
        figures.failures
    );
    let measured: Vec<usize> = figures.rows.iter().map(|r| r.variant).collect();
    assert_eq!(measured, [0, 2, 0, 2]);
    assert_eq!(figures.problems().len(), 2);
    let table = figures.table();
    assert!(table.contains("FAILED pdl: build:"), "{table}");
    assert!(table.contains("failed pdl, pdl+split_rope_kv"), "{table}");
    assert_eq!(backend.live_allocations(), 0);
}
