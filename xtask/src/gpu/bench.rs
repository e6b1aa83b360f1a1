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

const HELP: &str = "usage: cargo xtask gpu-bench [--synth NAME | --model DIR] [options]
  (needs an xtask built with `--features cuda`; the bundle's `target/gpu-check/solder` is one)

  --synth NAME       random weights in the full shape of tests/fixtures/configs/NAME.json
                     (default llama-3.2-1b)
  --model DIR        a Hugging Face checkpoint folder instead
  --context T        tokens each sequence holds before the timed step, 0..=65536 and
                     within the model's max_position_embeddings (default 32)
  --runs N           timed eager runs and graph replays per width, each, 1..=100000
                     (default 100)
  --max-seconds S    stop one width's eager or graph timing after S seconds, 0.001..=3600
                     (default 2; at
                     least 5 runs)
  --widths LIST      rows to time, comma-separated, 1 = decode (default: 1 and every
                     multi-seq width of the default serve ladder)
  --copy-mib M       buffer copied device-to-device for the bandwidth, 1..=16384
                     (default 1024)
  --json PATH        also write the figures as JSON
  --rules FILE       fusion rules (default fusions/FUSIONS.toml)
  --backend B        cuda (default; an xtask built with `--features cuda`), or cpu: a dry run
                     of the harness on the CPU backend (for tests; its figures mean nothing)";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &[
            "synth",
            "model",
            "context",
            "runs",
            "max-seconds",
            "widths",
            "copy-mib",
            "json",
            "rules",
            "backend",
        ],
        &["help"],
    )?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    timing::run(&args)
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
        })
    }
}

mod timing;

#[cfg(test)]
mod tests {
    use super::*;

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
            programs_captured: 19,
            capture_all_ms: 12.5,
            build_s: 1.0,
        };
        let table = figures.table();
        let last = table.lines().last().unwrap();
        let fields: Vec<&str> = last.split_whitespace().collect();
        assert_eq!(
            fields,
            ["decode", "1", "98", "2000.00", "500.0", "1000.0", "750.0", "50%", "67%", "1333"]
        );
        assert!(table.starts_with(
            "gpu-bench m: weights 2000.0 MB, copy bandwidth 4000 GB/s (read + write), floor 500.0 us"
        ));
        assert_eq!(figures.json()["widths"][0]["floor_percent_of_eager"], 50.0);
    }
}
