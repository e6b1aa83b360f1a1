//! `gpu-ncu-table` (hidden): Nsight Compute's CSV of a profiled run (`ncu --csv --metrics
//! gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum`) turned into a table of
//! each kernel's time, DRAM bytes, achieved bandwidth, share of the peak, and share of the
//! floor its launch's compulsory bytes (`solder_circuit::traffic`) give at that peak.
//!
//! The CSV is either ncu's default `details` page (one line per kernel and metric: columns
//! `ID`, `Kernel Name`, `Metric Name`, `Metric Unit`, `Metric Value`) or `--page raw` (one
//! line per kernel, a column per metric, units on the second line); lines before the header
//! (the application's output, `==PROF==` notes) are skipped; values may carry thousands
//! separators; units are ncu's (`byte`, `Kbyte` = 1000 bytes, ..., `Kibyte` = 1024 bytes,
//! `nsecond`, `usecond`, `msecond`, `second`). The profiled kernels, in ID order, must be the
//! named programs' launches, program after program (`--programs decode:1,multi_seq:16`, what
//! `gpu-step --profile` brackets); a kernel that is not the plan's names both.

use std::collections::BTreeMap;

use crate::args::Args;

mod csv;
mod table;

pub use csv::{parse, Profiled};
pub use table::match_programs;

const HELP: &str = "usage: solder gpu-ncu-table --csv FILE --programs LIST [options]

  --csv FILE         ncu's CSV (ncu --csv --metrics gpu__time_duration.sum,
                     dram__bytes_read.sum,dram__bytes_write.sum; details or raw page)
  --programs LIST    the profiled programs in order, MODE:ROWS comma-separated
                     (e.g. decode:1,multi_seq:16)
  --synth NAME       the model: tests/fixtures/configs/NAME.json (default llama-3.2-1b)
  --config FILE      or a config.json
  --context N        tokens each sequence held before the profiled steps, 0..=1048576
                     (default 0; the KV bytes of the floor)
  --peak-tbps T      the device's DRAM bandwidth, TB/s, 0.001..=1000 (default 4.8, H200)
  --launches         also a line per launch (default: per kernel and per program)
  --rules FILE       fusion rules (default fusions/FUSIONS.toml)";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &[
            "csv",
            "programs",
            "synth",
            "config",
            "context",
            "peak-tbps",
            "rules",
        ],
        &["launches", "help"],
    )?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    let csv_path = args.value("csv").ok_or("`--csv FILE` is required")?;
    let programs = args
        .value("programs")
        .ok_or("`--programs LIST` is required (e.g. decode:1,multi_seq:16)")?;
    let context = args.number_in("context", 0..=1 << 20)?.unwrap_or(0);
    let peak = args
        .real_in("peak-tbps", 0.001..=1000.0)?
        .unwrap_or(crate::traffic::H200_TBPS);
    let root = crate::paths::workspace_root();
    let config_path = match (args.value("config"), args.value("synth")) {
        (Some(_), Some(_)) => return Err("give --config or --synth, not both".into()),
        (Some(path), None) => path.into(),
        (None, synth) => root.join(format!(
            "tests/fixtures/configs/{}.json",
            synth.unwrap_or("llama-3.2-1b")
        )),
    };
    let text = crate::files::read_text(std::path::Path::new(csv_path))?;
    // Every program's first launch, `gemv::counters_reset`, is no plan step: not matched.
    let profiled: Vec<_> = parse(&text)
        .map_err(|e| format!("{csv_path}: {e}"))?
        .into_iter()
        .filter(|k| k.name != "counters_reset")
        .collect();
    let config = crate::files::model_config(&config_path)?;
    let rules = solder_circuit::RuleSet::from_file(&super::step::rules_path(&args))
        .map_err(|e| e.to_string())?;
    let expected = table::expected(&config, &rules, programs, context)?;
    let matched = match_programs(&profiled, &expected).map_err(|e| format!("{csv_path}: {e}"))?;
    print!("{}", table::render(&matched, peak, args.flag("launches")));
    Ok(())
}

/// Sums by key, in first-seen order of the keys.
pub(crate) fn group_by<K: Ord + Clone, V>(
    items: impl IntoIterator<Item = (K, V)>,
    mut add: impl FnMut(&mut V, V),
) -> Vec<(K, V)> {
    let mut order: Vec<K> = Vec::new();
    let mut sums: BTreeMap<K, V> = BTreeMap::new();
    for (k, v) in items {
        match sums.get_mut(&k) {
            Some(sum) => add(sum, v),
            None => {
                order.push(k.clone());
                sums.insert(k, v);
            }
        }
    }
    order
        .into_iter()
        .filter_map(|k| sums.remove(&k).map(|v| (k, v)))
        .collect()
}
