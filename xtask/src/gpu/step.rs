//! `gpu-step` (hidden): builds one model's all-rules exec and runs a few steps of every kind
//! the session has (a prefill through verify programs, decode, a multi-seq step with a
//! padding row, graph replays), so that `compute-sanitizer` and `ncu` can wrap a short run
//! that still reaches every kernel the model uses; it runs on the CPU backend too, so CI
//! drives the same code path.
//!
//! With `--compare`: the last decode step and the multi-seq step are run again from the state
//! before them, eagerly and as a graph replay, and their logits must equal the session's
//! byte for byte; then a second session repeats the whole schedule and every logits vector
//! must equal the first's byte for byte. `--cpu-twin` runs the schedule on the CPU backend
//! too and bounds `max |device - cpu| / max |cpu|` by `cross::TOLERANCE`. `--profile` brackets
//! the last decode step and the multi-seq step with cuProfilerStart/Stop (for
//! `ncu --profile-from-start off`). Fails on non-finite logits or any difference.

use std::path::PathBuf;

use crate::args::Args;

mod schedule;

const HELP: &str = "usage: target/gpu-check/solder gpu-step [--model DIR | --builtin NAME | --synth NAME] [options]

  --model DIR      a Hugging Face checkpoint folder
  --builtin NAME   one of parity's built-in tiny models (default tiny-llama); random weights,
                   so its max_position_embeddings is raised to what --context needs
  --synth NAME     random weights in the full shape of tests/fixtures/configs/NAME.json
  --context T      prompt tokens prefilled before the decode steps, 1..=65536 (default 3)
  --steps K        decode steps after the prefill, 1..=4096 (default 1)
  --width W        rows of the multi-seq step (W - 1 live sequences, one padding row),
                   2..=128 (default 4)
  --compare        eager and graph replay of the last decode and the multi-seq step against
                   the session's logits, and a second identical run, all byte for byte
  --cpu-twin       run the same schedule on the CPU backend and compare (tolerance 2e-2 of
                   the largest |logit|)
  --profile        cuProfilerStart/Stop around the last decode step and the multi-seq step
  --rules FILE     fusion rules (default fusions/FUSIONS.toml)
  --backend B      cuda (default), or cpu: the same run on the CPU backend (for tests and CI)";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &[
            "model", "builtin", "synth", "context", "steps", "width", "rules", "backend",
        ],
        &["compare", "cpu-twin", "profile", "help"],
    )?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    schedule::run(&args)
}

/// The rules file: `--rules`, else the workspace's.
pub fn rules_path(args: &Args) -> PathBuf {
    args.value("rules")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("fusions/FUSIONS.toml"))
}

/// Whether two logits vectors are the same bytes; else where they first differ.
pub fn same_bytes(a: &[f32], b: &[f32]) -> Result<(), String> {
    if a.len() != b.len() {
        return Err(format!("{} logits against {}", a.len(), b.len()));
    }
    match a
        .iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "logit {i} differs: {:e} (0x{:08x}) against {:e} (0x{:08x})",
            a[i],
            a[i].to_bits(),
            b[i],
            b[i].to_bits()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn bytes_compare_names_the_first_difference() {
        assert!(same_bytes(&[1.0, -0.0], &[1.0, -0.0]).is_ok());
        // -0.0 == 0.0 as numbers, not as bytes.
        let e = same_bytes(&[1.0, -0.0], &[1.0, 0.0]).unwrap_err();
        assert!(e.contains("logit 1 differs"), "{e}");
        assert!(same_bytes(&[f32::NAN], &[f32::NAN]).is_ok());
        assert!(same_bytes(&[1.0], &[1.0, 2.0]).is_err());
    }

    #[test]
    // Past 4,096 tokens with the CPU twin: CI's `gpu-step --backend cpu` step (release).
    fn the_cpu_run_compares_replays_and_repeats() {
        run(argv(&[
            "--backend",
            "cpu",
            "--builtin",
            "tiny-llama",
            "--context",
            "520",
            "--compare",
            "--width",
            "4",
        ]))
        .unwrap();
    }

    #[test]
    fn the_cpu_run_of_a_recurrent_model_compares_too() {
        run(argv(&[
            "--backend",
            "cpu",
            "--builtin",
            "tiny-qwen3-next",
            "--context",
            "20",
            "--steps",
            "2",
            "--compare",
        ]))
        .unwrap();
    }

    #[test]
    fn out_of_range_and_conflicting_flags_are_refused() {
        let e = run(argv(&["--backend", "cpu", "--width", "1"])).unwrap_err();
        assert!(e.contains("--width"), "{e}");
        let e = run(argv(&[
            "--backend",
            "cpu",
            "--builtin",
            "tiny-llama",
            "--synth",
            "x",
        ]))
        .unwrap_err();
        assert!(e.contains("one of"), "{e}");
    }
}
