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
//! too and bounds `max |device - cpu| / max |cpu|` by `cross::TOLERANCE` (on the CPU backend
//! itself a smoke test of that path, labelled so, held to byte identity). `--profile` brackets
//! the last decode step and the multi-seq step with cuProfilerStart/Stop (for
//! `ncu --profile-from-start off`). `--replays N` replays each compared step's graph N times
//! from the same state, comparing bytes every time (run.sh's stress stage); `--levers` builds
//! with levers on (the sanitizer stages with `pdl`). Fails on non-finite logits or any
//! difference. `--context` reaches the model's `max_position_embeddings`, refused past it.

use std::path::PathBuf;

use crate::args::Args;

mod schedule;

const HELP: &str = "usage: target/gpu-check/solder gpu-step [--model DIR | --builtin NAME | --synth NAME] [options]

  --model DIR      a Hugging Face checkpoint folder
  --builtin NAME   one of parity's built-in tiny models (default tiny-llama); random weights,
                   so its max_position_embeddings is raised to what --context needs
  --synth NAME     random weights in the full shape of tests/fixtures/configs/NAME.json
  --context T      prompt tokens prefilled before the decode steps (default 3); with the
                   steps, within the model's max_position_embeddings
  --steps K        decode steps after the prefill, 1..=4096 (default 1)
  --width W        rows of the multi-seq step (W - 1 live sequences, one padding row),
                   a width of the multi-seq ladder from 4 to 128 (default 4)
  --compare        eager and graph replay of the last decode and the multi-seq step against
                   the session's logits, and a second identical run, all byte for byte
  --cpu-twin       run the same schedule on the CPU backend and compare (tolerance 2e-2 of
                   the largest |logit|); with --backend cpu a smoke test of that path (the
                   CPU against itself, byte for byte), said so in its line
  --replays N      with --compare (implied): replay each compared step's graph N times,
                   each from the same state, comparing the logits bytes every time; the
                   first difference fails with its replay's index (default 1)
  --levers A,B     turn levers on (`solder_config::KNOWN_LEVERS`), e.g. pdl
  --profile        cuProfilerStart/Stop around the last decode step and the multi-seq step
  --rules FILE     fusion rules (default fusions/FUSIONS.toml)
  --backend B      cuda (default), or cpu: the same run on the CPU backend (for tests and CI)";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(
        argv,
        &[
            "model", "builtin", "synth", "context", "steps", "width", "rules", "backend",
            "replays", "levers",
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
        .unwrap_or_else(|| crate::paths::workspace_root().join("fusions/FUSIONS.toml"))
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
    // run.sh's stress stage in small (CI's `gpu-step stress cpu` step runs it on the wide
    // model that splits k, in release): levers on, each compared graph replayed three times.
    fn the_cpu_run_replays_each_compared_step_with_levers() {
        run(argv(&[
            "--backend",
            "cpu",
            "--builtin",
            "tiny-llama",
            "--context",
            "20",
            "--replays",
            "3",
            "--levers",
            "pdl",
        ]))
        .unwrap();
    }

    #[test]
    fn contexts_reach_the_models_limit_and_stop_there() {
        // Qwen3-Next serves 262,144 positions: 262,131 tokens, one step and the twelve after it
        // fit exactly (the check comes before anything is built).
        let config = crate::files::model_config(
            &crate::paths::workspace_root().join("tests/fixtures/configs/qwen3-next-80b-a3b.json"),
        )
        .unwrap();
        assert_eq!(config.max_position_embeddings, 262_144);
        schedule::check_positions("next", &config, 262_131, 1).unwrap();
        let e = schedule::check_positions("next", &config, 262_132, 1).unwrap_err();
        assert!(e.contains("max_position_embeddings 262144"), "{e}");
        // Past the old 65,536 cap, refused by the model's limit, not by the flag's range.
        let e = run(argv(&[
            "--backend",
            "cpu",
            "--synth",
            "llama-3.2-1b",
            "--context",
            "131072",
        ]))
        .unwrap_err();
        assert!(e.contains("max_position_embeddings 131072"), "{e}");
        let e = run(argv(&["--backend", "cpu", "--replays", "0"])).unwrap_err();
        assert!(e.contains("--replays"), "{e}");
        let e = run(argv(&["--backend", "cpu", "--levers", "turbo"])).unwrap_err();
        assert!(e.contains("turbo"), "{e}");
    }

    #[test]
    fn out_of_range_and_conflicting_flags_are_refused() {
        // At 2 the one live row would run the decode program, not the compared multi-seq one;
        // 3 rows pad to 4, 5 is no width of the ladder.
        for width in ["1", "2", "3", "5"] {
            let e = run(argv(&["--backend", "cpu", "--width", width])).unwrap_err();
            assert!(e.contains("--width"), "{e}");
        }
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
