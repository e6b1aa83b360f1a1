//! `cargo xtask plan`: build one plan or a model's whole ladder and print it.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;
use solder_circuit::{
    plans_digest, Available, BuildOptions, ExecutionPlan, Fusions, Instance, Mode, Policy, RuleSet,
};
use solder_config::ServeShape;

use crate::args::Args;

const HELP: &str = "usage: cargo xtask plan --config FILE [--mode M --rows R | --all] [options]

  --config FILE       a Hugging Face config.json
  --mode M            decode | multi_seq | verify | verify_batch | draft (default decode)
  --rows R            rows of the plan, 1..=4096 (default 1)
  --all               every (mode, rows) of the serve shape: decode, multi_seq over the
                      ladder, verify 2..8; one line per plan and the total build time
  --max-batch N       widest batch of the serve shape, 1..=4096 (default 128)
  --json              per plan: mode, rows, digests, kernel counts, launches_per_layer,
                      streams, events, pool_bytes, live_lower_bound
  --dot               Graphviz DOT of the plan (one plan only)
  --rules FILE        fusion rules (default fusions/FUSIONS.toml)
  --reference-only    apply only `reference` rules
  --max-streams N     streams a plan may use, 1..=8 (default 2)
  --repeat N          with --all: build the ladder N times, 1..=1000; report the median
  --verify            run the plan verifier after every pass (on in debug builds)
  --bless             rewrite the golden printed plans in tests/golden/plans/";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &[
            "config",
            "mode",
            "rows",
            "rules",
            "max-streams",
            "max-batch",
            "repeat",
        ],
        &[
            "all",
            "json",
            "dot",
            "bless",
            "reference-only",
            "verify",
            "help",
        ],
    )?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    if args.flag("bless") {
        return crate::golden::bless();
    }
    let config_path = args
        .value("config")
        .ok_or("`--config FILE` is required (see --help)")?;
    let rules_path = args
        .value("rules")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("fusions/FUSIONS.toml"));
    let serve = match args.number_in("max-batch", 1..=4096)? {
        Some(n) => ServeShape::with_max_batch(n).map_err(|e| e.to_string())?,
        None => ServeShape::default(),
    };
    let mut policy = Policy::default();
    if args.flag("reference-only") {
        policy.fusions = Fusions::ReferenceOnly;
    }
    if let Some(n) = args.number_in("max-streams", 1..=8)? {
        policy.max_streams = n;
    }
    let options = BuildOptions {
        verify: args.flag("verify") || cfg!(debug_assertions),
    };

    let started = Instant::now();
    let config = crate::files::model_config(std::path::Path::new(config_path))?;
    let rules = RuleSet::from_file(&rules_path).map_err(|e| e.to_string())?;
    let instance = Instance::from_config(&config, serve).map_err(|e| e.to_string())?;
    let available = Available::all_kernels(&rules);
    let shapes = if args.flag("all") {
        instance.shapes()
    } else {
        let mode: Mode = args
            .value("mode")
            .unwrap_or("decode")
            .parse()
            .map_err(|e: solder_circuit::CircuitError| e.to_string())?;
        vec![(mode, args.number_in("rows", 1..=4096)?.unwrap_or(1))]
    };
    let build_all = || -> Result<Vec<ExecutionPlan>, String> {
        shapes
            .iter()
            .map(|&(mode, rows)| {
                ExecutionPlan::build_with(
                    &instance, &rules, &available, &policy, mode, rows, options,
                )
                .map_err(|e| e.to_string())
            })
            .collect()
    };
    let plans = build_all()?;
    let first_ms = started.elapsed().as_secs_f64() * 1e3;

    if args.flag("dot") {
        if plans.len() != 1 {
            return Err("`--dot` draws one plan: give --mode and --rows, not --all".into());
        }
        print!("{}", plans[0].to_dot(&instance.circuit));
        return Ok(());
    }
    if args.flag("json") {
        let rows: Vec<_> = plans.iter().map(plan_json).collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    if plans.len() == 1 && !args.flag("all") {
        print!("{}", plans[0].display(&instance.circuit));
        return Ok(());
    }
    for p in &plans {
        println!(
            "{:<10} rows={:<4} launches={:<4} per_layer={} streams={} events={} pool_bytes={:<10} \
             live_lower_bound={:<10} ratio={:.4} digest={}",
            p.mode.as_str(),
            p.rows,
            p.compute_steps(),
            p.launches_per_layer,
            p.num_streams,
            p.event_count,
            p.pool_bytes,
            p.live_lower_bound,
            ratio(p),
            &p.digest[..16]
        );
    }
    let worst = plans.iter().map(ratio).fold(1.0f64, f64::max);
    println!("plans_digest {}", plans_digest(&plans));
    println!(
        "worst pool_bytes/live_lower_bound {worst:.4} (target <= 1.02: {})",
        if worst <= 1.02 { "met" } else { "MISSED" }
    );
    let repeat = args.number_in("repeat", 1..=1000)?.unwrap_or(1);
    if repeat == 1 {
        println!(
            "built {} plans for {} in {first_ms:.2} ms (config, rules, circuit and plans)",
            plans.len(),
            instance.circuit.name
        );
        return Ok(());
    }
    let mut times = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let t = Instant::now();
        let config = crate::files::model_config(std::path::Path::new(config_path))?;
        let _ = Instance::from_config(&config, ServeShape::default()).map_err(|e| e.to_string())?;
        build_all()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "built {} plans for {}: median {:.2} ms over {repeat} runs (min {:.2}, max {:.2}; config, circuit and plans)",
        plans.len(),
        instance.circuit.name,
        times[repeat / 2],
        times[0],
        times[repeat - 1]
    );
    Ok(())
}

fn ratio(p: &ExecutionPlan) -> f64 {
    if p.live_lower_bound == 0 {
        1.0
    } else {
        p.pool_bytes as f64 / p.live_lower_bound as f64
    }
}

fn plan_json(p: &ExecutionPlan) -> serde_json::Value {
    json!({
        "mode": p.mode.as_str(),
        "rows": p.rows,
        "plan_digest": p.digest,
        "rules_digest": p.rules_digest,
        "kernel_count_original": p.kernel_count_original,
        "kernel_count_fused": p.kernel_count_fused,
        "launches_per_layer": p.launches_per_layer,
        "num_streams": p.num_streams,
        "event_count": p.event_count,
        "pool_bytes": p.pool_bytes,
        "live_lower_bound": p.live_lower_bound,
    })
}
