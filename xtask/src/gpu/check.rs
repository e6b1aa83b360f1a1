//! `gpu-check`: builds, on this machine, the folder a GPU machine runs: `target/gpu-check/`
//! with `solder` (this xtask in release with `--features cuda`, its debug info stripped),
//! `run.sh` (from `run.sh` beside this file) and `BUILD` (what it was built from). The golden
//! folders and configs the script reads are in the working tree, which the device tool copies.
//!
//! Invariants: the bundle embeds every module of `MODULES` (a missing PTX stops the build);
//! what travels (the working tree plus the bundle) stays under the device tool's 64 MiB.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::args::Args;

/// The script, copied into the bundle.
const SCRIPT: &str = include_str!("run.sh");
/// What the device tool carries at most: the working tree plus carried paths.
const CARRY_LIMIT: u64 = 64 << 20;
/// The device call's limit: run.sh's stage limits (480 s in all) and a margin, inside a
/// lease of about 10 minutes of run time.
const TIMEOUT_S: u32 = 520;

const HELP: &str = "usage: cargo xtask gpu-check

  builds target/gpu-check/{solder, run.sh, BUILD} (cargo build --release -p xtask --features
  cuda, into the workspace's target/) and prints the device call that runs it:
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

    let bundle = target.join("gpu-check");
    if bundle.exists() {
        std::fs::remove_dir_all(&bundle).map_err(|e| format!("{}: {e}", bundle.display()))?;
    }
    std::fs::create_dir_all(&bundle).map_err(|e| format!("{}: {e}", bundle.display()))?;
    let binary = bundle.join("solder");
    let built = target.join("release/xtask");
    std::fs::copy(&built, &binary).map_err(|e| format!("{}: {e}", built.display()))?;
    // Symbols stay (names in backtraces); the line tables go.
    match Command::new("strip")
        .arg("--strip-debug")
        .arg(&binary)
        .status()
    {
        Ok(s) if s.success() => {}
        _ => eprintln!("warning: `strip --strip-debug` failed: the bundle keeps its debug info"),
    }
    write_file(&bundle.join("run.sh"), SCRIPT)?;
    write_file(&bundle.join("BUILD"), &build_facts(&root))?;

    let bundle_bytes = folder_bytes(&bundle)?;
    let tree_bytes = tree_bytes(&root)?;
    println!("target/gpu-check/:");
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&bundle)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for path in entries {
        let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!(
            "  {:<8} {:>12} bytes",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("?"),
            bytes
        );
    }
    let travels = bundle_bytes + tree_bytes;
    println!(
        "bundle {:.1} MiB + working tree {:.1} MiB = {:.1} MiB to carry (limit 64 MiB)",
        mib(bundle_bytes),
        mib(tree_bytes),
        mib(travels)
    );
    if travels > CARRY_LIMIT {
        return Err(format!(
            "{:.1} MiB would travel, over the device tool's 64 MiB",
            mib(travels)
        ));
    }
    println!(
        "device call: run with command `bash target/gpu-check/run.sh`, carry [\"target/gpu-check\"], timeout_s {TIMEOUT_S}"
    );
    println!(
        "(each stage's limit is at the top of run.sh and can be set in the command, e.g. `LIMIT_BENCH=120 bash target/gpu-check/run.sh`)"
    );
    Ok(())
}

fn write_file(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
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

fn folder_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let entry = entry.map_err(|e| e.to_string())?;
        total += entry.metadata().map(|m| m.len()).unwrap_or(0);
    }
    Ok(total)
}

/// Bytes of what the device tool sends besides carried paths: tracked files and untracked
/// files git does not ignore.
fn tree_bytes(root: &Path) -> Result<u64, String> {
    let out = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output()
        .map_err(|e| format!("git ls-files: {e}"))?;
    if !out.status.success() {
        return Err("git ls-files failed".into());
    }
    Ok(out
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .filter_map(|p| std::fs::metadata(root.join(String::from_utf8_lossy(p).as_ref())).ok())
        .map(|m| m.len())
        .sum())
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
