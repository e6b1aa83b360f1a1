//! `cargo xtask plan`: build one plan or a model's whole ladder and print it.

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;
use solder_circuit::{
    plans_digest, Available, BuildOptions, CircuitOptions, ExecutionPlan, Fusions, Instance, Mode,
    Policy, PrecisionSpec, RuleSet, Tier,
};
use solder_config::{Fp8Strategy, Quantization, ServeShape};

use crate::args::Args;
use crate::traffic::Rates;

const HELP: &str = "usage: cargo xtask plan --config FILE [--mode M --rows R | --all] [options]

  --config FILE       a Hugging Face config.json
  --quant Q           serve the model as a quantized checkpoint of it would store it (in place
                      of the config's own quantization_config): fp8 (block 128x128, Qwen's and
                      DeepSeek's), fp8-channel or fp8-tensor (compressed-tensors), int4 (AWQ,
                      group 128), int4-channel (GPTQ, one group per row)
  --precision P       native (default: the checkpoint's formats where a reference kernel reads
                      them) or bf16 (every weight bf16, dequantised at load)
  --mode M            decode | multi_seq | verify | verify_batch | draft (default decode)
  --rows R            rows of the plan, 1..=4096 (default 1)
  --all               every (mode, rows) of the serve shape: decode, multi_seq over the
                      ladder, verify 2..8; one line per plan and the total build time
  --max-batch N       widest batch of the serve shape, 1..=4096 (default 128)
  --draft-widths W,.. draft programs (the MTP head's, qwen3_next) at 1 row and these widths;
                      --mode draft asks for them at --rows when not given
  --verify-widths W,.. the serve's verify (and prefill chunk) widths, 2..=512 ascending
                      (default 2..8): `2,4,8,512` for chunks of 512
  --speculative-rows N the widest program a speculative step runs (default 32): verify
                      programs up to it keep recurrent snapshots
  --state N           with --all: the recurrent state allocation for N sequences (sequence,
                      spare and snapshot slots, bytes each), as a build's layout sizes it
  --json              per plan: mode, rows, digests, kernel counts, launches_per_layer,
                      streams, events, pool_bytes, live_lower_bound, weight bytes per format,
                      the step's bytes (weights per format) and its floor at --tbps (default
                      4.8 TB/s) and --context (and `traffic` per launch with --bytes)
  --bytes             per plan, the bytes each launch must move (weights, activations,
                      KV and recurrent state, metadata) and the step's bandwidth floor
  --tbps T            the bandwidth of --bytes' floor, TB/s, 0.001..=1000 (default 4.8, H200)
  --tflops F          the arithmetic rate of --bytes' roofline (each launch at the slower of
                      its bytes and its FLOPs), TFLOPS, 0.001..=100000 (default 990: the
                      H200's dense bf16 tensor cores)
  --context N         tokens each sequence holds before the step, for the KV bytes of
                      --bytes, 0..=1048576 (default 0)
  --dot               Graphviz DOT of the plan (one plan only)
  --rules FILE        fusion rules (default fusions/FUSIONS.toml)
  --reference-only    apply only `reference` rules
  --levers A,B        turn levers on (`solder_config::KNOWN_LEVERS`), e.g. `split_rope_kv`:
                      rope and the KV write in their own launch (the six-launch layer, A/B)
  --max-streams N     streams a plan may use, 1..=8 (default 2)
  --repeat N          with --all: build the ladder N times, 1..=1000; report the median
  --verify            run the plan verifier after every pass (on in debug builds)
  --no-ptx-check      skip the check that every kernel the plans launch is defined in the
                      embedded PTX (crates/kernels/ptx/*.ptx, what a device loads)
  --bless             rewrite the golden printed plans in tests/golden/plans/";

/// The options `plan` takes a value for.
const OPTIONS: &[&str] = &[
    "config",
    "quant",
    "precision",
    "mode",
    "rows",
    "rules",
    "max-streams",
    "max-batch",
    "repeat",
    "draft-widths",
    "verify-widths",
    "speculative-rows",
    "state",
    "tbps",
    "tflops",
    "context",
    "levers",
];

/// The options `plan` takes as bare flags.
const FLAGS: &[&str] = &[
    "all",
    "bytes",
    "json",
    "dot",
    "bless",
    "reference-only",
    "verify",
    "no-ptx-check",
    "help",
];

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(argv, OPTIONS, FLAGS)?;
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
        .unwrap_or_else(|| crate::paths::workspace_root().join("fusions/FUSIONS.toml"));
    let serve = serve_of(&args)?;
    let policy = policy_of(&args)?;
    let state = args.number_in("state", 1..=1 << 20)?;
    if state.is_some() && !args.flag("all") {
        return Err("`--state` sizes a serve's every program: give --all".into());
    }
    let options = BuildOptions {
        verify: args.flag("verify") || cfg!(debug_assertions),
    };

    let started = Instant::now();
    let mut config = crate::files::model_config(std::path::Path::new(config_path))?;
    if let Some(quant) = args.value("quant") {
        config.quantization = Some(quantization_of(quant)?);
    }
    let spec = match args.value("precision").unwrap_or("native") {
        "native" => PrecisionSpec::Policy(Tier::Native),
        "bf16" => PrecisionSpec::Policy(Tier::Bf16),
        other => return Err(format!("--precision: `{other}` (expected native or bf16)")),
    };
    let rules = RuleSet::from_file(&rules_path).map_err(|e| e.to_string())?;
    let instance =
        Instance::from_config_precision(&config, serve, CircuitOptions::default(), &spec, &rules)
            .map_err(|e| e.to_string())?;
    let available = Available::all_kernels(&rules);
    let shapes = shapes_of(&args, &instance)?;
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
    let ptx_kernels = if args.flag("no-ptx-check") {
        None
    } else {
        Some(check_kernels_in_ptx(
            &plans,
            &crate::ptx::embedded_entries(),
        )?)
    };

    if let Some(sequences) = state {
        print_state(&instance, &plans, sequences);
    }
    if args.flag("dot") {
        if plans.len() != 1 {
            return Err("`--dot` draws one plan: give --mode and --rows, not --all".into());
        }
        let circuit = instance
            .circuit_for(plans[0].mode)
            .map_err(|e| e.to_string())?;
        print!("{}", plans[0].to_dot(circuit));
        return Ok(());
    }
    let bytes = bytes_of(&args)?;
    if args.flag("json") {
        return print_json(&instance, &plans, &args, bytes);
    }
    if let Some((rates, context)) = bytes {
        return print_traffic(&instance, &plans, rates, context);
    }
    if plans.len() == 1 && !args.flag("all") {
        let circuit = instance
            .circuit_for(plans[0].mode)
            .map_err(|e| e.to_string())?;
        print!("{}", plans[0].display(circuit));
        return Ok(());
    }
    print_ladder(&plans, ptx_kernels);
    let repeat = args.number_in("repeat", 1..=1000)?.unwrap_or(1);
    if repeat == 1 {
        println!(
            "built {} plans for {} in {first_ms:.2} ms (config, rules, circuit and plans)",
            plans.len(),
            instance.circuit.name
        );
        return Ok(());
    }
    let times = repeat_times(config_path, repeat, &build_all)?;
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

/// Milliseconds, sorted, of `repeat` runs of reading the config, building the instance and
/// `build_all`.
fn repeat_times(
    config_path: &str,
    repeat: usize,
    build_all: &dyn Fn() -> Result<Vec<ExecutionPlan>, String>,
) -> Result<Vec<f64>, String> {
    let mut times = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        let t = Instant::now();
        let config = crate::files::model_config(std::path::Path::new(config_path))?;
        let _ = Instance::from_config(&config, ServeShape::default()).map_err(|e| e.to_string())?;
        build_all()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times)
}

/// The `quantization_config` a quantized checkpoint of the model would have, by `--quant`'s
/// name, every projection quantized (none skipped).
pub(crate) fn quantization_of(name: &str) -> Result<Quantization, String> {
    let fp8 = |strategy| Quantization::Fp8Compressed {
        strategy,
        targets: vec!["Linear".to_string()],
        ignore: vec!["lm_head".to_string()],
    };
    Ok(match name {
        "fp8" => Quantization::Fp8Block {
            block: [128, 128],
            not_converted: Vec::new(),
        },
        "fp8-channel" => fp8(Fp8Strategy::Channel),
        "fp8-tensor" => fp8(Fp8Strategy::Tensor),
        "int4" => Quantization::Awq {
            group_size: 128,
            zero_point: true,
            not_converted: Vec::new(),
        },
        "int4-channel" => Quantization::Gptq {
            group_size: 0,
            sym: true,
            v2: false,
            not_converted: Vec::new(),
        },
        other => {
            return Err(format!(
                "--quant: `{other}` (expected fp8, fp8-channel, fp8-tensor, int4, int4-channel)"
            ))
        }
    })
}

/// The serve shape to compile: `--max-batch`, and `--draft-widths` (or, for `--mode draft`,
/// `--rows`) as its draft widths.
fn serve_of(args: &Args) -> Result<ServeShape, String> {
    let mut serve = match args.number_in("max-batch", 1..=4096)? {
        Some(n) => ServeShape::with_max_batch(n).map_err(|e| e.to_string())?,
        None => ServeShape::default(),
    };
    if let Some(list) = args.value("draft-widths") {
        serve.draft_widths = widths("draft-widths", list)?;
    } else if args.value("mode") == Some("draft") {
        serve.draft_widths = vec![args.number_in("rows", 1..=4096)?.unwrap_or(1)];
    }
    if let Some(list) = args.value("verify-widths") {
        serve.verify_widths = widths("verify-widths", list)?;
    }
    if let Some(rows) = args.number_in("speculative-rows", 0..=solder_config::MAX_ROWS)? {
        serve.speculative_rows = rows;
    }
    serve.validate().map_err(|e| e.to_string())?;
    Ok(serve)
}

/// A comma-separated list of widths, `--option` named in the error.
fn widths(option: &str, list: &str) -> Result<Vec<usize>, String> {
    list.split(',')
        .map(|w| {
            (w.trim().parse::<usize>()).map_err(|_| format!("--{option}: `{w}` is not a width"))
        })
        .collect()
}

/// `--state N`: the recurrent state allocation a build of `plans` (every program of the
/// serve) lays out for N sequences: its sequence slots (and the scratch slot), the snapshot
/// slots of the widest program that keeps them, and the spare slots a step writes, as
/// `solder_model_layers::Layout` sizes them (KV pages aside).
fn print_state(instance: &Instance, plans: &[ExecutionPlan], sequences: usize) {
    let served: Vec<&ExecutionPlan> = plans.iter().collect();
    let circuit = &instance.circuit;
    let layout = solder_model_layers::Layout::new(circuit, &served, 1, 0, 2, 1, sequences);
    let recurrent: Vec<_> = layout.states.iter().filter(|r| r.slot_bytes > 0).collect();
    if recurrent.is_empty() {
        println!("{} keeps no recurrent state", circuit.name);
        return;
    }
    let slot: usize = recurrent.iter().map(|r| r.slot_bytes).sum();
    let part = |bytes: &dyn Fn(&solder_model_layers::StateRegion) -> usize| -> usize {
        recurrent.iter().map(|r| bytes(r)).sum()
    };
    let rows = layout.state_rows;
    let slots = part(&|r| r.snapshot_offset - r.offset);
    let spares = slots / layout.state_slots * rows.spares;
    let sequence = slots - spares;
    let snapshots = part(&|r| r.offset + r.bytes - r.snapshot_offset);
    let gb = |bytes: usize| bytes as f64 / 1e9;
    println!(
        "recurrent state of {} for {sequences} sequences: {slot} B a slot; {} sequence slots \
         {:.2} GB, {} snapshot slots {:.2} GB, {} spare slots {:.2} GB; {:.2} GB in all (KV \
         pages aside)",
        circuit.name,
        layout.state_slots - rows.spares,
        gb(sequence),
        rows.snapshots,
        gb(snapshots),
        rows.spares,
        gb(spares),
        gb(sequence + snapshots + spares),
    );
}

/// The policy: `--levers`, `--reference-only`, `--max-streams`.
fn policy_of(args: &Args) -> Result<Policy, String> {
    let mut policy = Policy {
        levers: args.levers()?,
        ..Policy::default()
    };
    if args.flag("reference-only") {
        policy.fusions = Fusions::ReferenceOnly;
    }
    if let Some(n) = args.number_in("max-streams", 1..=8)? {
        policy.max_streams = n;
    }
    Ok(policy)
}

/// The (mode, rows) programs to build: every one of the instance with `--all`, else
/// `--mode` (default decode) at `--rows` (default 1).
fn shapes_of(args: &Args, instance: &Instance) -> Result<Vec<(Mode, usize)>, String> {
    Ok(if args.flag("all") {
        instance.shapes()
    } else {
        let mode: Mode = args
            .value("mode")
            .unwrap_or("decode")
            .parse()
            .map_err(|e: solder_circuit::CircuitError| e.to_string())?;
        vec![(mode, args.number_in("rows", 1..=4096)?.unwrap_or(1))]
    })
}

/// `(rates, context)` with `--bytes`; `--tbps`, `--tflops` or `--context` without it (or
/// `--json`) is an error.
fn bytes_of(args: &Args) -> Result<Option<(Rates, usize)>, String> {
    Ok(if args.flag("bytes") {
        Some((
            rates_of(args)?,
            args.number_in("context", 0..=1 << 20)?.unwrap_or(0),
        ))
    } else if ["tbps", "tflops", "context"]
        .iter()
        .any(|o| args.value(o).is_some())
        && !args.flag("json")
    {
        return Err("`--tbps`, `--tflops` and `--context` go with `--bytes` or `--json`".into());
    } else {
        None
    })
}

/// `--tbps` and `--tflops`, the H200's by default.
fn rates_of(args: &Args) -> Result<Rates, String> {
    Ok(Rates {
        tbps: args
            .real_in("tbps", 0.001..=1000.0)?
            .unwrap_or(Rates::H200.tbps),
        tflops: args
            .real_in("tflops", 0.001..=100000.0)?
            .unwrap_or(Rates::H200.tflops),
    })
}

/// `--json`: one JSON row per plan with its step's bytes and floor at `--tbps` (4.8 TB/s by
/// default) and `--context` (0), and each launch's traffic with `--bytes`.
fn print_json(
    instance: &Instance,
    plans: &[ExecutionPlan],
    args: &Args,
    bytes: Option<(Rates, usize)>,
) -> Result<(), String> {
    let (rates, context) = match bytes {
        Some(b) => b,
        None => (
            rates_of(args)?,
            args.number_in("context", 0..=1 << 20)?.unwrap_or(0),
        ),
    };
    let mut rows = Vec::with_capacity(plans.len());
    let mut traffic = Vec::new();
    for plan in plans {
        let circuit = instance.circuit_for(plan.mode).map_err(|e| e.to_string())?;
        let t = solder_circuit::plan_traffic(circuit, plan, context);
        let mut row = plan_json(plan);
        row["step"] = step_json(&t, rates);
        if bytes.is_some() {
            row["traffic"] = crate::traffic::json(&t, rates);
        }
        rows.push(row);
        traffic.push(t);
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
    );
    overflow_check(&traffic)
}

/// `--bytes`: each plan's traffic table at `tbps` and `context`, and a summary per plan when
/// there are several.
fn print_traffic(
    instance: &Instance,
    plans: &[ExecutionPlan],
    rates: Rates,
    context: usize,
) -> Result<(), String> {
    let mut traffic = Vec::with_capacity(plans.len());
    for p in plans {
        let circuit = instance.circuit_for(p.mode).map_err(|e| e.to_string())?;
        let t = solder_circuit::plan_traffic(circuit, p, context);
        print!("{}", crate::traffic::table(circuit, &t, rates));
        traffic.push(t);
    }
    if traffic.len() > 1 {
        for t in &traffic {
            println!("{}", crate::traffic::summary(t, rates));
        }
    }
    overflow_check(&traffic)
}

/// One line per plan of the ladder, the plans' digest, the PTX check's count and the worst
/// pool-to-lower-bound ratio.
fn print_ladder(plans: &[ExecutionPlan], ptx_kernels: Option<usize>) {
    for p in plans {
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
    println!("plans_digest {}", plans_digest(plans));
    if let Some(p) = plans.iter().find(|p| p.has_quantized_weights()) {
        let formats: Vec<String> = p
            .weight_bytes
            .iter()
            .map(|w| format!("{} {} B ({} slots)", w.format, w.bytes, w.slots))
            .collect();
        println!("weights ({} plan) {}", p.mode.as_str(), formats.join(", "));
    }
    if let Some(kernels) = ptx_kernels {
        println!(
            "ptx: the {kernels} kernels these plans launch are all defined in the embedded PTX"
        );
    }
    println!(
        "worst pool_bytes/live_lower_bound {worst:.4} (target <= 1.02: {})",
        if worst <= 1.02 { "met" } else { "MISSED" }
    );
}

/// Every kernel a group of `plans` launches must be an `.entry` of `entries` (`module::func`);
/// otherwise the error names each missing kernel, the rule that launches it and a plan where.
/// Returns how many distinct kernels the plans launch.
pub fn check_kernels_in_ptx(
    plans: &[ExecutionPlan],
    entries: &std::collections::BTreeSet<String>,
) -> Result<usize, String> {
    let mut launched = std::collections::BTreeSet::new();
    let mut missing = std::collections::BTreeMap::new();
    for plan in plans {
        for &group in &plan.order {
            let group = plan.group(group);
            for kernel in &group.kernels {
                launched.insert(kernel.as_str());
                if !entries.contains(kernel) {
                    missing
                        .entry((kernel.as_str(), group.rule.as_str()))
                        .or_insert_with(|| format!("{} rows={}", plan.mode.as_str(), plan.rows));
                }
            }
        }
    }
    if missing.is_empty() {
        return Ok(launched.len());
    }
    let lines: Vec<String> = missing
        .iter()
        .map(|((kernel, rule), at)| {
            format!("kernel `{kernel}` of rule `{rule}` (first in the {at} plan)")
        })
        .collect();
    Err(format!(
        "the plans launch kernels no embedded PTX (crates/kernels/ptx/*.ptx) defines:\n  {}\n\
         (run `cargo xtask ptx` after adding the kernel, or --no-ptx-check)",
        lines.join("\n  ")
    ))
}

fn ratio(p: &ExecutionPlan) -> f64 {
    if p.live_lower_bound == 0 {
        1.0
    } else {
        p.pool_bytes as f64 / p.live_lower_bound as f64
    }
}

/// The step's bytes (its weights by storage format), its floor and its roofline at `rates`.
fn step_json(t: &solder_circuit::traffic::PlanTraffic, rates: Rates) -> serde_json::Value {
    let (bytes_per_s, flops_per_s) = (rates.tbps * 1e12, rates.tflops * 1e12);
    let weights: serde_json::Map<String, serde_json::Value> = t
        .weights_read_by_format()
        .into_iter()
        .map(|(format, bytes)| (format.to_string(), json!(bytes)))
        .collect();
    json!({
        "context": t.context,
        "tbps": rates.tbps,
        "tflops": rates.tflops,
        "weights_read_by_format": weights,
        "weights_read": t.weights_read(),
        "total_bytes": t.total(),
        "floor_us": t.floor_us(bytes_per_s),
        "flops": t.flops(),
        "roofline_us": t.roofline_us(bytes_per_s, flops_per_s),
    })
}

fn plan_json(p: &ExecutionPlan) -> serde_json::Value {
    let weight_bytes: serde_json::Map<String, serde_json::Value> = p
        .weight_bytes
        .iter()
        .map(|w| {
            (
                w.format.to_string(),
                json!({ "slots": w.slots, "bytes": w.bytes }),
            )
        })
        .collect();
    json!({
        "weight_bytes": weight_bytes,
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

/// `--bytes` fails when a count overflowed u64 (printed as `overflow`, never as a figure),
/// naming the plan and the counts.
fn overflow_check(traffic: &[solder_circuit::traffic::PlanTraffic]) -> Result<(), String> {
    let over: Vec<String> = traffic
        .iter()
        .filter_map(|t| {
            let names = crate::traffic::overflowed(t);
            (!names.is_empty()).then(|| {
                format!(
                    "{} rows {} context {}: {}",
                    t.mode.as_str(),
                    t.rows,
                    t.context,
                    names.join(", ")
                )
            })
        })
        .collect();
    if over.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "--bytes: counts past u64::MAX bytes, printed as `{}`: {}",
            crate::traffic::OVERFLOW,
            over.join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder() -> Vec<ExecutionPlan> {
        let root = crate::paths::workspace_root();
        let config =
            crate::files::model_config(&root.join("tests/fixtures/configs/llama-3.2-1b.json"))
                .unwrap();
        let rules = RuleSet::from_file(&root.join("fusions/FUSIONS.toml")).unwrap();
        let instance = Instance::from_config(&config, ServeShape::default()).unwrap();
        let available = Available::all_kernels(&rules);
        [(Mode::Decode, 1), (Mode::MultiSeq, 4), (Mode::Verify, 4)]
            .into_iter()
            .map(|(mode, rows)| {
                ExecutionPlan::build_with(
                    &instance,
                    &rules,
                    &available,
                    &Policy::default(),
                    mode,
                    rows,
                    BuildOptions::default(),
                )
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn the_shipped_plans_launch_only_kernels_of_the_embedded_ptx() {
        let kernels = check_kernels_in_ptx(&ladder(), &crate::ptx::embedded_entries()).unwrap();
        assert!(kernels > 5, "{kernels}");
    }

    #[test]
    fn a_kernel_missing_from_the_ptx_is_named_with_its_rule() {
        let plans = ladder();
        let group = plans[0].group(plans[0].order[0]);
        let (kernel, rule) = (group.kernels[0].clone(), group.rule.clone());
        let mut entries = crate::ptx::embedded_entries();
        assert!(entries.remove(&kernel), "{kernel} is in the PTX");
        let e = check_kernels_in_ptx(&plans, &entries).unwrap_err();
        assert!(
            e.contains(&format!("kernel `{kernel}` of rule `{rule}`")),
            "{e}"
        );
        assert!(e.contains("decode rows=1"), "{e}");
    }

    #[test]
    fn quant_names_give_the_checkpoint_formats_and_unknown_ones_are_refused() {
        let root = crate::paths::workspace_root();
        let rules = RuleSet::from_file(&root.join("fusions/FUSIONS.toml")).unwrap();
        let mut config =
            crate::files::model_config(&root.join("tests/fixtures/configs/llama-3.2-1b.json"))
                .unwrap();
        for (name, kind) in [
            ("fp8", "fp8"),
            ("fp8-channel", "fp8"),
            ("fp8-tensor", "fp8"),
            ("int4", "int4"),
            ("int4-channel", "int4"),
        ] {
            config.quantization = Some(quantization_of(name).unwrap());
            let instance = Instance::from_config_precision(
                &config,
                ServeShape::default(),
                CircuitOptions::default(),
                &PrecisionSpec::default(),
                &rules,
            )
            .unwrap();
            let q = instance
                .circuit
                .weights
                .iter()
                .find(|w| w.name == "model.layers.0.self_attn.q_proj.weight")
                .unwrap();
            assert_eq!(q.format.kind(), kind, "{name}");
        }
        let e = quantization_of("nf4").unwrap_err();
        assert!(e.contains("nf4") && e.contains("fp8-channel"), "{e}");
    }

    #[test]
    fn plan_refuses_a_device_as_config_and_out_of_range_counts() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let e = run(argv(&["--config", "/dev/zero"])).unwrap_err();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file"),
            "{e}"
        );
        let config =
            crate::paths::workspace_root().join("tests/fixtures/configs/llama-3.2-1b.json");
        let config = config.display().to_string();
        let e = run(argv(&[
            "--config",
            &config,
            "--rows",
            "18446744073709551615",
        ]))
        .unwrap_err();
        assert!(e.contains("--rows"), "{e}");
        let e = run(argv(&["--config", &config, "--rules", "/dev/zero"])).unwrap_err();
        assert!(e.contains("/dev/zero"), "{e}");
        // The serve's widths are checked as a build checks them, and --state sizes a whole serve.
        let e = run(argv(&["--config", &config, "--verify-widths", "2,4,1024"])).unwrap_err();
        assert!(e.contains("verify_widths") && e.contains("1024"), "{e}");
        let e = run(argv(&["--config", &config, "--verify-widths", "2,x"])).unwrap_err();
        assert!(e.contains("--verify-widths") && e.contains("`x`"), "{e}");
        let e = run(argv(&["--config", &config, "--state", "4"])).unwrap_err();
        assert!(e.contains("--all"), "{e}");
    }
}
