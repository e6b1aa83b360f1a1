//! `cargo xtask`: the project's automation, in Rust so it runs wherever cargo does.
//!
//! `plan` builds and prints execution plans; `ptx` regenerates and checks the CUDA PTX;
//! `gpu-check` is the next issue's command and says so when asked for.

mod args;
mod bench;
mod golden;
mod parity;
mod peer;
mod plan;
mod ptx;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command> [options]

commands:
  plan       build and print execution plans (cargo xtask plan --help)
  parity     reference-vs-fused and golden parity (cargo xtask parity --help)
  bench      decode benchmark (cargo xtask bench --help)
  ptx        regenerate and check the CUDA PTX (cargo xtask ptx --help)
  gpu-check  build the device-check bundle (not yet built: issue 4)";

fn main() -> ExitCode {
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
        "parity" => parity::run(argv),
        "bench" => bench::run(argv),
        "ptx" => ptx::run(argv),
        "gpu-check" => Err(format!(
            "`cargo xtask {command}` is not built yet: it is part of issue 4 (the CUDA backend)"
        )),
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

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}
