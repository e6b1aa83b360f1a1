//! `gpu-bench`: a model's decode and multi-seq programs on a GPU, each timed eagerly and as a
//! graph replay, against the weights' bandwidth floor.
//!
//! Per width: one real session step uploads that width's metadata; then warm-up runs, then up
//! to `--runs` eager runs and as many graph replays, each followed by a synchronize before
//! the clock is read (so a figure is one step's latency, launch gaps included); the median.
//! Each width's floor is the bytes its step must move (`solder_circuit::traffic` over the
//! width's plan at `--context`: weights, activations, KV, metadata; what `plan --bytes`
//! prints) over the device-to-device copy bandwidth measured here (bytes read plus bytes
//! written per second, the median of several copies of a `--copy-mib` buffer); its share is
//! floor / measured time (100% = at the floor). Last, every program of the ladder is captured once (the sum is the
//! capture cost an engine pays at start), and a short table is printed.

use crate::args::Args;

const HELP: &str =
    "usage: cargo xtask gpu-bench [--synth NAME | --model DIR | --builtin NAME] [options]
  (needs an xtask built with `--features cuda`; the bundle's `target/gpu-check/solder` is one)

  --synth NAME       random weights in the full shape of tests/fixtures/configs/NAME.json
                     (default llama-3.2-1b)
  --model DIR        a Hugging Face checkpoint folder instead
  --builtin NAME     one of parity's built-in tiny models instead (random weights)
  --context T        tokens each sequence holds before the timed step, within the model's
                     max_position_embeddings (default 32)
  --runs N           timed eager runs and graph replays per width, each, 1..=100000
                     (default 100; with --ab per variant per round, default 10)
  --max-seconds S    stop one width's eager or graph timing after S seconds, 0.001..=3600
                     (default 2; at least 5 runs; with --ab, one width's rounds, at least 2)
  --widths LIST      rows to time, comma-separated, 1 = decode (default: 1 and every
                     multi-seq width of the default serve ladder; with --ab 1,8,32,128)
  --ab LEVERS        A/B: build the model once per lever set (none, each of LEVERS alone, all
                     together: `solder_config::KNOWN_LEVERS`, an unknown one refused by name;
                     an item `a+b` is one set of both levers),
                     time them interleaved at each width, graph and eager, print one table
                     (time, ratio to the baseline, share of the floor) and check the logits:
                     each variant's eager, replayed and session bytes agree, and a variant
                     whose levers no `differs` rule names gives the baseline's bytes
                     (a difference fails the run)
  --rounds R         with --ab: interleaved rounds per width, 1..=1000 (default 6)
  --loop STEPS       also time the serving loop at each width, 1..=4096 steps a run: greedy
                     steps with the host waiting for each step's ids (next_tokens) against a
                     pipeline (start_pipeline, 2 steps queued ahead), alternated over 3 rounds,
                     medians of us per step; the two must give the same tokens
  --copy-mib M       buffer copied device-to-device for the bandwidth, 1..=16384
                     (default 1024)
  --json PATH        also write the figures as JSON (with --ab: under the key `ab`, merged
                     into PATH when it already holds a JSON object)
  --rules FILE       fusion rules (default fusions/FUSIONS.toml)
  --backend B        cuda (default; an xtask built with `--features cuda`), or cpu: a dry run
                     of the harness on the CPU backend (for tests; its figures mean nothing)";

/// `--ab`'s widths unless `--widths` says.
const AB_WIDTHS: [usize; 4] = [1, 8, 32, 128];

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &[
            "synth",
            "model",
            "builtin",
            "context",
            "runs",
            "max-seconds",
            "widths",
            "ab",
            "rounds",
            "copy-mib",
            "json",
            "rules",
            "backend",
            "loop",
        ],
        &["help"],
    )?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    match args.value("ab") {
        Some(_) if args.value("loop").is_some() => Err("`--loop` does not go with `--ab`".into()),
        Some(list) => run_ab(&args, list),
        None if args.value("rounds").is_some() => Err("`--rounds` goes with `--ab`".into()),
        None => timing::run(&args),
    }
}

/// `gpu-bench --ab LEVERS`.
fn run_ab(args: &Args, list: &str) -> Result<(), String> {
    let json = timing::json_output(args)?;
    let (name, config, weights) = timing::model(args)?;
    let context = args
        .number_in("context", 0..=crate::gpu::MAX_CONTEXT)?
        .unwrap_or(32);
    let serve = solder_config::ServeShape::default();
    let default_widths = AB_WIDTHS
        .into_iter()
        .filter(|&w| w == 1 || serve.multi_seq_ladder.contains(&w))
        .collect();
    let mut widths = timing::widths(args, &serve, default_widths)?;
    let mut seen = std::collections::BTreeSet::new();
    widths.retain(|w| seen.insert(*w));
    timing::check_positions(&name, &config, (context, 0), &widths)?;
    // Programs for the timed widths only (and verify, which prefill runs): each variant's
    // build plans half of what the default ladder would.
    let serve = solder_config::ServeShape {
        max_batch: seen.last().copied().unwrap_or(1),
        multi_seq_ladder: seen.iter().copied().filter(|&w| w > 1).collect(),
        verify_batch_widths: Vec::new(),
        ..serve
    };
    serve.validate().map_err(|e| format!("`--widths`: {e}"))?;
    let rules = timing::rules(args)?;
    // Every lever checked before a byte is allocated.
    let variants = ab::variants(list, &rules)?;
    let rounds = args.number_in("rounds", 1..=1000)?.unwrap_or(6);
    let runs = args.number_in("runs", 1..=100_000)?.unwrap_or(10);
    let max_seconds = args.real_in("max-seconds", 0.001..=3600.0)?.unwrap_or(2.0);
    let copy_bytes = args.number_in("copy-mib", 1..=16384)?.unwrap_or(1024) << 20;
    let mut boxed = timing::backend(args)?;
    let backend = boxed.as_mut();
    println!("{}", crate::gpu::describe(&backend.facts()));
    let copy_bytes_per_s = timing::copy_bandwidth(backend, copy_bytes)?;
    let setup = ab::Setup {
        name,
        config,
        weights,
        rules,
        serve,
        kv: timing::kv_shape((context, 0), &widths),
        context,
        widths,
        rounds,
        runs,
        max_seconds,
        copy_bytes_per_s,
    };
    let figures = ab::measure(backend, setup, &variants)?;
    if let Some((path, inputs)) = json {
        write_merged(&path, &inputs, "ab", figures.json())?;
    }
    print!("{}", figures.table());
    let problems = figures.problems();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("A/B: {}", problems.join("; ")))
    }
}

/// Writes `value` under `key` into the JSON object at `path` (kept when the file holds one,
/// else a new object).
fn write_merged(
    path: &std::path::Path,
    inputs: &crate::files::Inputs,
    key: &str,
    value: serde_json::Value,
) -> Result<(), String> {
    let mut object = match crate::files::read_text(path) {
        Ok(text) => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        },
        Err(_) => serde_json::Map::new(),
    };
    object.insert(key.to_string(), value);
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(object))
        .map_err(|e| e.to_string())?;
    crate::files::write_output(path, text.as_bytes(), inputs)
}

/// One width's figures.
#[derive(Debug, Clone)]
pub struct WidthFigures {
    pub mode: &'static str,
    pub rows: usize,
    pub launches: usize,
    /// Bytes the step must move (`solder_circuit::traffic`).
    pub bytes: u64,
    /// `bytes` over the measured copy bandwidth.
    pub floor_us: f64,
    pub eager_us: f64,
    pub eager_runs: usize,
    pub graph_us: f64,
    pub graph_runs: usize,
}

/// One width's serving loop (`--loop`).
#[derive(Debug, Clone)]
pub struct LoopFigures {
    pub rows: usize,
    /// Steps a run.
    pub steps: usize,
    pub rounds: usize,
    /// Median us a step with the host waiting for each step's ids (`next_tokens`).
    pub waited_us: f64,
    /// Median us a step through a pipeline.
    pub piped_us: f64,
}

/// The whole run's figures.
#[derive(Debug, Clone)]
pub struct BenchFigures {
    pub model: String,
    pub device: String,
    pub weights_bytes: usize,
    pub copy_bytes_per_s: f64,
    /// Tokens each sequence held before the timed steps.
    pub context: usize,
    pub widths: Vec<WidthFigures>,
    /// The serving loop per width (empty without `--loop`).
    pub loops: Vec<LoopFigures>,
    pub programs_captured: usize,
    pub capture_all_ms: f64,
    pub build_s: f64,
}

impl BenchFigures {
    /// The table printed last.
    pub fn table(&self) -> String {
        let decode_floor = self.widths.first().map_or(0.0, |w| w.floor_us);
        let mut out = format!(
            "gpu-bench {}: weights {:.1} MB, copy bandwidth {:.0} GB/s (read + write), floor {:.1} us (first width, context {}); capture of all {} programs {:.1} ms\n",
            self.model,
            self.weights_bytes as f64 / 1e6,
            self.copy_bytes_per_s / 1e9,
            decode_floor,
            self.context,
            self.programs_captured,
            self.capture_all_ms
        );
        out += &format!(
            "{:<10} {:>5} {:>8} {:>10} {:>9} {:>10} {:>10} {:>9} {:>9} {:>12}\n",
            "mode",
            "rows",
            "launches",
            "MB/step",
            "floor_us",
            "eager_us",
            "graph_us",
            "fl/eager",
            "fl/graph",
            "tok/s graph"
        );
        for w in &self.widths {
            let share = |us: f64| format!("{:.0}%", 100.0 * w.floor_us / us);
            out += &format!(
                "{:<10} {:>5} {:>8} {:>10.2} {:>9.1} {:>10.1} {:>10.1} {:>9} {:>9} {:>12.0}\n",
                w.mode,
                w.rows,
                w.launches,
                w.bytes as f64 / 1e6,
                w.floor_us,
                w.eager_us,
                w.graph_us,
                share(w.eager_us),
                share(w.graph_us),
                w.rows as f64 * 1e6 / w.graph_us
            );
        }
        for l in &self.loops {
            out += &format!(
                "serving loop {}: next_tokens {:.1} us/step, pipeline {:.1} us/step, ratio {:.3}\n",
                l.rows,
                l.waited_us,
                l.piped_us,
                l.piped_us / l.waited_us
            );
        }
        out
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "device": self.device,
            "weights_bytes": self.weights_bytes,
            "copy_bytes_per_s": self.copy_bytes_per_s,
            "context": self.context,
            "build_s": self.build_s,
            "programs_captured": self.programs_captured,
            "capture_all_ms": self.capture_all_ms,
            "widths": self.widths.iter().map(|w| serde_json::json!({
                "mode": w.mode,
                "rows": w.rows,
                "launches_per_step": w.launches,
                "bytes_per_step": w.bytes,
                "floor_us": w.floor_us,
                "eager_us_median": w.eager_us,
                "eager_runs": w.eager_runs,
                "graph_us_median": w.graph_us,
                "graph_runs": w.graph_runs,
                "floor_percent_of_graph": 100.0 * w.floor_us / w.graph_us,
                "floor_percent_of_eager": 100.0 * w.floor_us / w.eager_us,
            })).collect::<Vec<_>>(),
            "serving_loop": self.loops.iter().map(|l| serde_json::json!({
                "rows": l.rows,
                "steps": l.steps,
                "rounds": l.rounds,
                "next_tokens_us_per_step_median": l.waited_us,
                "pipeline_us_per_step_median": l.piped_us,
                "pipeline_over_next_tokens": l.piped_us / l.waited_us,
            })).collect::<Vec<_>>(),
        })
    }
}

pub mod ab;
mod serving;
mod timing;

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// `gpu-bench --ab` end to end on the CPU backend: the A/B figures merged into an existing
    /// JSON object; an unknown lever refused by name before anything is built.
    #[test]
    fn ab_runs_on_the_cpu_backend_and_merges_its_json() {
        let dir = std::env::temp_dir().join(format!("solder-ab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("bench.json");
        std::fs::write(&json, r#"{"model": "earlier stage"}"#).unwrap();
        let common = [
            "--backend",
            "cpu",
            "--builtin",
            "tiny-llama",
            "--widths",
            "1,2",
            "--rounds",
            "2",
            "--runs",
            "1",
            "--copy-mib",
            "1",
            "--context",
            "4",
        ];
        let mut args = argv(&common);
        args.extend(argv(&["--ab", "pdl", "--json", json.to_str().unwrap()]));
        run(args).unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(written["model"], "earlier stage");
        assert_eq!(written["ab"]["variants"][1]["name"], "pdl");
        assert_eq!(written["ab"]["rows"].as_array().unwrap().len(), 4);
        assert_eq!(written["ab"]["rows"][3]["bytes"], "same");

        let mut args = argv(&common);
        args.extend(argv(&["--ab", "pdl,turbo"]));
        let err = run(args).unwrap_err();
        assert!(err.contains("unknown lever `turbo`"), "{err}");
        assert!(run(argv(&["--backend", "cpu", "--rounds", "2"]))
            .unwrap_err()
            .contains("`--rounds` goes with `--ab`"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn contexts_past_the_models_positions_are_refused_naming_them() {
        // 131,072 tokens are past the old 65,536 cap; Llama-3.2-1B's limit is what refuses
        // them (with the step's own positions), before anything is allocated.
        for ab in [&[][..], &["--ab", "pdl"][..]] {
            let mut args = argv(&[
                "--backend",
                "cpu",
                "--synth",
                "llama-3.2-1b",
                "--widths",
                "1",
                "--context",
                "131072",
            ]);
            args.extend(argv(ab));
            let err = run(args).unwrap_err();
            assert!(err.contains("max_position_embeddings 131072"), "{err}");
        }
        // run.sh's longest timing: 131,069 tokens and the step's own positions fit exactly.
        let config = crate::files::model_config(
            &crate::paths::workspace_root().join("tests/fixtures/configs/llama-3.2-1b.json"),
        )
        .unwrap();
        timing::check_positions("1b", &config, (131_069, 0), &[1]).unwrap();
        assert!(timing::check_positions("1b", &config, (131_070, 0), &[1]).is_err());
        assert!(timing::check_positions("1b", &config, (131_060, 10), &[1]).is_err());
    }

    #[test]
    fn table_relates_each_width_to_the_floor() {
        let figures = BenchFigures {
            model: "m".into(),
            device: "d".into(),
            weights_bytes: 2_000_000_000,
            copy_bytes_per_s: 4e12,
            context: 32,
            widths: vec![WidthFigures {
                mode: "decode",
                rows: 1,
                launches: 98,
                bytes: 2_000_000_000,
                floor_us: 500.0,
                eager_us: 1000.0,
                eager_runs: 100,
                graph_us: 750.0,
                graph_runs: 100,
            }],
            loops: vec![LoopFigures {
                rows: 32,
                steps: 16,
                rounds: 3,
                waited_us: 2000.0,
                piped_us: 1500.0,
            }],
            programs_captured: 19,
            capture_all_ms: 12.5,
            build_s: 1.0,
        };
        let table = figures.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[lines.len() - 1],
            "serving loop 32: next_tokens 2000.0 us/step, pipeline 1500.0 us/step, ratio 0.750"
        );
        let fields: Vec<&str> = lines[lines.len() - 2].split_whitespace().collect();
        assert_eq!(
            fields,
            ["decode", "1", "98", "2000.00", "500.0", "1000.0", "750.0", "50%", "67%", "1333"]
        );
        assert!(table.starts_with(
            "gpu-bench m: weights 2000.0 MB, copy bandwidth 4000 GB/s (read + write), floor 500.0 us"
        ));
        assert_eq!(figures.json()["widths"][0]["floor_percent_of_eager"], 50.0);
        assert_eq!(
            figures.json()["serving_loop"][0]["pipeline_over_next_tokens"],
            0.75
        );
    }

    /// `gpu-bench --loop` end to end on the CPU backend: one serving-loop row per width in the
    /// JSON (the pipeline's tokens checked against next_tokens' on the way); refused with
    /// `--ab`.
    #[test]
    fn the_serving_loop_runs_on_the_cpu_backend() {
        let dir = std::env::temp_dir().join(format!("solder-loop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("bench.json");
        let common = argv(&[
            "--backend",
            "cpu",
            "--builtin",
            "tiny-llama",
            "--widths",
            "1,2",
            "--runs",
            "1",
            "--copy-mib",
            "1",
            "--context",
            "4",
            "--loop",
            "3",
        ]);
        let mut args = common.clone();
        args.extend(argv(&["--json", json.to_str().unwrap()]));
        run(args).unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let loops = written["serving_loop"].as_array().unwrap();
        assert_eq!(loops.len(), 2);
        assert_eq!(
            (loops[1]["rows"].as_u64(), loops[1]["steps"].as_u64()),
            (Some(2), Some(3))
        );
        let mut args = common;
        args.extend(argv(&["--ab", "pdl"]));
        assert!(run(args)
            .unwrap_err()
            .contains("`--loop` does not go with `--ab`"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
