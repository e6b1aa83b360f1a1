//! `gpu-check`: builds, on this machine, the folder a GPU machine runs: `target/gpu-check/`
//! with `bundle.tgz` (`solder`: this xtask in release with `--features cuda`, its debug info
//! stripped; `cubin/`: the embedded PTX assembled for sm_90, loaded before any JIT), `run.sh`
//! (from `run.sh` beside this file; it unpacks the archive into a scratch folder) and `BUILD`
//! (what it was built from). The golden folders and configs the script reads are in the working
//! tree, which the device tool copies.
//!
//! Invariants: the bundle embeds every module of `MODULES` (a missing PTX stops the build);
//! what travels (the working tree plus the bundle) stays under `bundle::BUDGET_BYTES`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::bundle;
use crate::args::Args;

/// The script, copied into the bundle.
const SCRIPT: &str = include_str!("run.sh");
/// The device call's limit: run.sh's stage limits (480 s in all) and a margin, inside a
/// lease of about 10 minutes of run time.
const TIMEOUT_S: u32 = 520;

const HELP: &str = "usage: cargo xtask gpu-check

  builds target/gpu-check/{bundle.tgz, run.sh, BUILD}: bundle.tgz packs `solder` (cargo build
  --release -p xtask --features cuda, into the workspace's target/, debug info stripped) and
  cubin/ (the embedded PTX assembled for sm_90 by the pinned ptxas, with its MANIFEST); fails
  when the working tree plus the bundle weigh more than 48 MiB; prints the device call:
  bash target/gpu-check/run.sh, from the repository root, carrying target/gpu-check";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(argv, &[], &["help"])?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    let root = crate::workspace_root();
    for module in solder_model_layers::kernels::MODULES {
        let ptx = root.join(format!("{}/{module}.ptx", solder_kernels::PTX_DIR));
        if !ptx.is_file() {
            return Err(format!(
                "{} is missing: the bundle embeds every kernel module (`cargo xtask ptx` writes it)",
                ptx.display()
            ));
        }
    }
    let target = root.join("target");
    eprintln!("building the cuda xtask (cargo build --release -p xtask --features cuda)");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "-p", "xtask", "--features", "cuda"])
        .current_dir(&root)
        // The workspace's own target dir, whatever the caller's environment says.
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .map_err(|e| format!("cargo: {e}"))?;
    if !status.success() {
        return Err("cargo build --release -p xtask --features cuda failed".into());
    }

    let staging = bundle::fresh_folder(&target.join("gpu-check-staging"))?;
    let binary_bytes = bundle::stage_executable(&target.join("release/xtask"), &staging, "solder")?;
    eprintln!("assembling the embedded PTX for sm_90 (ptxas from the pinned nvcc wheel)");
    crate::ptx::assemble_cubins(&staging.join("cubin"))?;
    let unpacked = bundle::folder_bytes(&staging)?;
    let out = bundle::fresh_folder(&target.join("gpu-check"))?;
    bundle::pack(&staging, &["solder", "cubin"], &out)?;
    write_file(&out.join("run.sh"), SCRIPT)?;
    write_file(&out.join("BUILD"), &build_facts(&root))?;
    std::fs::remove_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;

    println!("target/gpu-check/:");
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&out)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!(
            "  {:<10} {:>12} bytes",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
            bytes
        );
    }
    let weights = bundle::Weights {
        tree: bundle::tree_bytes(&root)?,
        bundle: bundle::folder_bytes(&out)?,
        binary: binary_bytes,
        unpacked,
    };
    println!("{}", weights.describe());
    weights.check()?;
    println!(
        "device call: run with command `bash target/gpu-check/run.sh`, carry [\"target/gpu-check\"], timeout_s {TIMEOUT_S}"
    );
    println!(
        "(each stage's limit is at the top of run.sh and can be set in the command, e.g. `LIMIT_BENCH=120 bash target/gpu-check/run.sh`)"
    );
    Ok(())
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    crate::files::write_output(path, text.as_bytes(), &crate::files::Inputs::default())
}

/// What the bundle was built from: commit, local changes, toolchain, PTX modules.
fn build_facts(root: &Path) -> String {
    let run = |program: &str, args: &[&str]| -> String {
        Command::new(program)
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    };
    let changed = run("git", &["status", "--porcelain"]).lines().count();
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "solder bundle: commit {} with {changed} changed paths, built at unix time {seconds}\n\
         toolchain: {}\nfeatures: cuda; modules: {}\n",
        run("git", &["rev-parse", "--short=12", "HEAD"]),
        run("rustc", &["-V"]),
        solder_model_layers::kernels::MODULES.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `LIMIT_*=${LIMIT_*:-N}` defaults of run.sh.
    fn limits() -> Vec<(String, u32)> {
        SCRIPT
            .lines()
            .filter(|l| l.starts_with("LIMIT_"))
            .filter_map(|l| {
                let (name, rest) = l.split_once('=')?;
                let n = rest.split(":-").nth(1)?.split('}').next()?.parse().ok()?;
                Some((name.to_string(), n))
            })
            .collect()
    }

    #[test]
    fn every_stage_is_time_boxed_well_inside_the_device_call() {
        let limits = limits();
        assert!(limits.len() >= 10, "{limits:?}");
        // Every limit is used by a stage.
        for (name, _) in &limits {
            assert!(
                SCRIPT.contains(&format!("\"${name}\"")),
                "{name} is never used"
            );
        }
        // memcheck runs three models; the rest once.
        let total: u32 = limits
            .iter()
            .map(|(name, n)| if name == "LIMIT_MEMCHECK" { 3 * n } else { *n })
            .sum();
        assert!(
            total + 40 <= TIMEOUT_S,
            "{total} s of stages in a {TIMEOUT_S} s call"
        );
        const { assert!(TIMEOUT_S <= 540, "the call must end well under 9 minutes") };
        assert!(
            SCRIPT.contains(&format!("{total} s in all")),
            "run.sh's comment says another total"
        );
    }

    #[test]
    fn results_go_to_at_most_eight_files() {
        let mut files: Vec<&str> = SCRIPT
            .split("$LOG/")
            .skip(1)
            .filter_map(|rest| rest.split(['"', ' ', ')']).next())
            .filter(|name| !name.is_empty())
            .collect();
        files.sort();
        files.dedup();
        assert!(files.len() <= 8, "{files:?}");
        assert!(
            files.contains(&"ncu.csv") && files.contains(&"checks.log"),
            "{files:?}"
        );
    }

    #[test]
    fn the_script_parses_and_lints_clean() {
        let dir = std::env::temp_dir().join(format!("solder-run-sh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.sh");
        std::fs::write(&path, SCRIPT).unwrap();
        let status = Command::new("bash").arg("-n").arg(&path).status();
        if let Ok(status) = status {
            assert!(status.success(), "bash -n run.sh failed");
        }
        // shellcheck where it is installed (CI images may lack it).
        if let Ok(out) = Command::new("shellcheck").arg(&path).output() {
            assert!(
                out.status.success(),
                "shellcheck run.sh:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
