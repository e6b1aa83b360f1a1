//! `gpu-check`: builds, on this machine, the folder a GPU machine runs: `target/gpu-check/`
//! with `bundle.tgz` (`solder`: this xtask in release with `--features cuda`, its debug info
//! and symbols stripped; `cuda_device` and `checked_cuda` (`DEVICE_TESTS`): the test binaries of
//! `solder-gpu-runtime` whose tests need a device, built with `--no-run`, stripped, run by
//! run.sh with `--ignored`; `cubin/`: the embedded PTX assembled for sm_90, loaded
//! before any JIT), `run.sh` (from `run.sh` beside this file; it unpacks the archive into a
//! scratch folder) and `BUILD` (what it was built from); then prints the two device calls
//! (run.sh's part 1, then part 2; part 3 in a later lease). The golden folders and configs the script reads are in the
//! working tree, which the device tool copies.
//!
//! Invariants: the bundle embeds every module of `MODULES` (a missing PTX stops the build);
//! every `#[ignore]`d test of the workspace is a device test of `DEVICE_TESTS`, which run.sh
//! runs with `--ignored` (a test ignored elsewhere would run nowhere);
//! what travels (the working tree plus the bundle) stays under `bundle::BUDGET_BYTES`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::bundle;
use crate::args::Args;

/// The test targets of `solder-gpu-runtime` whose tests need a CUDA device: `cargo test` lists
/// them as ignored (with the reason), and run.sh runs each binary with `--ignored`.
pub const DEVICE_TESTS: &[&str] = &["cuda_device", "checked_cuda"];

/// The script, copied into the bundle.
const SCRIPT: &str = include_str!("run.sh");
/// The first device call's limit: run.sh's part 1 stage limits (395 s in all) and a margin.
/// A lease is 15 minutes of device time, each machine start included: part 1 and part 2 fit
/// one lease when part 2 follows while the machine is still warm (the first device run took
/// 126 s for part 1 and about 200 s for part 2, after a start of about 35 s).
const TIMEOUT_S: u32 = 435;
/// The second device call's limit: part 2's stage limits (365 s in all) and a margin.
const TIMEOUT_PART2_S: u32 = 405;
/// The third device call's limit (a later lease): part 3's stage limits (500 s) and a margin.
const TIMEOUT_PART3_S: u32 = 540;
/// Every part with its device call's limit.
const PARTS: [(u32, u32); 3] = [(1, TIMEOUT_S), (2, TIMEOUT_PART2_S), (3, TIMEOUT_PART3_S)];

const HELP: &str = "usage: cargo xtask gpu-check

  builds target/gpu-check/{bundle.tgz, run.sh, BUILD}: bundle.tgz packs `solder` (cargo build
  --release -p xtask --features cuda, into the workspace's target/, stripped), the
  device test binaries (cuda_device, checked_cuda: run.sh runs their ignored tests) and
  cubin/ (the embedded PTX assembled for sm_90 by the pinned ptxas, with its MANIFEST); fails
  when the working tree plus the bundle weigh more than 56 MiB; prints the device calls:
  bash target/gpu-check/run.sh 1 (then 2, 3), from the repository root, carrying
  target/gpu-check";

pub fn run(argv: Vec<String>) -> Result<(), String> {
    let args = Args::parse(argv, &[], &["help"])?;
    if args.flag("help") {
        println!("{HELP}");
        return Ok(());
    }
    let root = crate::paths::workspace_root();
    for module in solder_model_layers::kernels::MODULES {
        let ptx = root.join(format!(
            "{}/{}",
            solder_kernels::PTX_DIR,
            solder_kernels::packed_ptx_file(module)
        ));
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
    for (name, executable) in build_device_tests(&root, &target)? {
        bundle::stage_executable(Path::new(&executable), &staging, name)?;
    }
    eprintln!("assembling the embedded PTX for sm_90 (ptxas from the pinned nvcc wheel)");
    crate::ptx::assemble_cubins(&staging.join("cubin"))?;
    let unpacked = bundle::folder_bytes(&staging)?;
    let out = bundle::fresh_folder(&target.join("gpu-check"))?;
    let entries: Vec<&str> = ["solder", "cubin"]
        .into_iter()
        .chain(DEVICE_TESTS.iter().copied())
        .collect();
    bundle::pack(&staging, &entries, &out)?;
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
    for (part, timeout) in PARTS {
        println!(
            "device call {part}: run with command `bash target/gpu-check/run.sh {part}`, carry [\"target/gpu-check\"], timeout_s {timeout}"
        );
    }
    println!(
        "(a 15-minute lease holds calls 1 and 2 when call 2 follows while the machine is warm; call 3 is for a later lease)"
    );
    println!(
        "(each stage's row is appended to summary.txt under $OUT as it ends, so a cut keeps the finished rows)"
    );
    println!(
        "(each stage's limit is at the top of run.sh and can be set in the command, e.g. `LIMIT_BENCH=120 bash target/gpu-check/run.sh`)"
    );
    Ok(())
}

/// `cargo test --release -p solder-gpu-runtime --features cuda --test NAME... --no-run` for
/// every `DEVICE_TESTS` target: builds the device tests without running them; returns each
/// target's executable.
fn build_device_tests(root: &Path, target: &Path) -> Result<Vec<(&'static str, String)>, String> {
    let tests: Vec<String> = DEVICE_TESTS.iter().map(|t| format!("--test {t}")).collect();
    let command = format!(
        "cargo test --release -p solder-gpu-runtime --features cuda {} --no-run",
        tests.join(" ")
    );
    eprintln!("building the device tests ({command})");
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "test",
            "--release",
            "-p",
            "solder-gpu-runtime",
            "--features",
            "cuda",
        ])
        .args(DEVICE_TESTS.iter().flat_map(|t| ["--test", t]))
        .args(["--no-run", "--message-format=json"])
        .current_dir(root)
        .env("CARGO_TARGET_DIR", target)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("{command} failed"));
    }
    let messages = String::from_utf8_lossy(&out.stdout);
    DEVICE_TESTS
        .iter()
        .map(|&name| {
            test_executable(&messages, name)
                .map(|executable| (name, executable))
                .ok_or_else(|| format!("{command} named no executable for `{name}`"))
        })
        .collect()
}

/// The executable of the test target `name` among cargo's JSON messages.
fn test_executable(messages: &str, name: &str) -> Option<String> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(str::to_string))
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

    /// The `LIMIT_*=${LIMIT_*:-N}` defaults of run.sh, each with its part (the `# Part N:`
    /// comment above it).
    fn limits() -> Vec<(u32, String, u32)> {
        let mut part = 0;
        let mut out = Vec::new();
        for line in SCRIPT.lines() {
            if let Some(rest) = line.strip_prefix("# Part ") {
                part = rest
                    .split(':')
                    .next()
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
            let Some((name, rest)) = line.split_once('=').filter(|_| line.starts_with("LIMIT_"))
            else {
                continue;
            };
            let n = rest.split(":-").nth(1).and_then(|r| r.split('}').next());
            if let Some(n) = n.and_then(|n| n.parse().ok()) {
                out.push((part, name.to_string(), n));
            }
        }
        out
    }

    /// The body of run.sh's function `name`, through its closing brace.
    fn function(name: &str) -> &'static str {
        let start = SCRIPT.find(&format!("\n{name}() {{\n")).expect(name);
        let body = &SCRIPT[start + 1..];
        &body[..body.find("\n}\n").expect("closing brace")]
    }

    #[test]
    fn every_stage_is_time_boxed_well_inside_its_device_call() {
        let limits = limits();
        assert!(limits.len() >= 20, "{limits:?}");
        for (_, name, _) in &limits {
            assert!(
                SCRIPT.contains(&format!("\"${name}\"")),
                "{name} is never used"
            );
        }
        for (part, timeout) in PARTS {
            // The model memcheck runs over two checkpoints, the tensor-core sanitizing twice,
            // the bf16 and fp8 prefills three times; the rest once.
            let repeats = [
                ("LIMIT_MEMCHECK_MODEL", 2),
                ("LIMIT_PREFILL", 3),
                ("LIMIT_TC_SANITIZE", 2),
                ("LIMIT_PREFILL_FP8", 3),
            ];
            let total: u32 = limits
                .iter()
                .filter(|(p, _, _)| *p == part)
                .map(|(_, name, n)| {
                    let times = repeats
                        .iter()
                        .find(|(r, _)| r == name)
                        .map_or(1, |(_, t)| *t);
                    times * n
                })
                .sum();
            assert!(total > 0, "no limits in part {part}");
            assert!(
                total + 40 <= timeout,
                "part {part}: {total} s of stages in a {timeout} s call"
            );
            assert!(
                SCRIPT.contains(&format!("# Part {part}: {total} s in all")),
                "run.sh's comment on part {part} says another total than {total} s"
            );
        }
        assert!(
            limits
                .iter()
                .all(|(part, _, _)| PARTS.iter().any(|(p, _)| p == part)),
            "a limit outside the parts: {limits:?}"
        );
        // A 15-minute lease (900 s): one machine start (35 s measured) and part 2 following
        // while the machine is warm.
        const {
            assert!(
                TIMEOUT_S + TIMEOUT_PART2_S <= 900 - 60,
                "calls 1 and 2 fit one lease"
            )
        };
        const {
            assert!(
                TIMEOUT_PART3_S <= 540,
                "a call must end well under 9 minutes"
            )
        };
    }

    #[test]
    fn part_one_runs_its_stages_in_the_order_of_their_value() {
        let part1 = function("part1");
        let order = [
            "\"decode w1 graph/eager\"",
            "\"parity split k/heads\"",
            "--levers tensor_cores --only",
            "prefill \"prefill 2048 gemv\" \"\"",
            "prefill \"prefill 2048 tensor cores\" tensor_cores",
            "prefill \"prefill 2048 tensor cores large\" tensor_cores,mma_large",
            "same_bytes \"large tiles: bytes\"",
            "--ab tensor_cores",
            "\"ncu profile\"",
            "\"ncu tensor cores\"",
            "\"ncu prefill\"",
            "device_tests cuda_device",
            "device_tests checked_cuda",
            "\"memcheck split\"",
            "stage goldens",
        ];
        let mut at = 0;
        for stage in order {
            let found = part1[at..]
                .find(stage)
                .unwrap_or_else(|| panic!("{stage} is missing from part 1, or out of order"));
            at += found + stage.len();
        }
        let part2 = function("part2");
        for stage in [
            "\"parity (built-in)\"",
            "\"step twin ctx 4200\"",
            "\"gpu-bench A/B\"",
            "\"racecheck split\"",
            "\"width sweep\"",
            "\"decode ctx 1024\"",
            "\"decode ctx 8192\"",
            "\"memcheck moe tc\"",
            "\"racecheck moe tc\"",
            "qwen3_moe",
            "qwen3_next",
        ] {
            assert!(part2.contains(stage), "part 2 lacks {stage}");
        }
        assert!(part2.contains("--replays \"$STRESS_REPLAYS\""));
        assert!(SCRIPT.contains("STRESS_REPLAYS=${STRESS_REPLAYS:-1000}"));
        let part3 = function("part3");
        for stage in [
            "\"gdn kernels\"",
            "\"gemm kernels\"",
            "\"gemm tiles\"",
            "\"qkv kernels\"",
            "same_bytes \"fp8 narrow tiles: bytes\"",
            "SOLDER_CUBINS=",
            "initcheck",
            "synccheck",
            "\"racecheck gemm tiles\"",
            "--levers pdl",
            "\"decode ctx 131069\"",
        ] {
            assert!(part3.contains(stage), "part 3 lacks {stage}");
        }
    }

    /// Every `.rs` file under `dir`, recursively, skipping build output and hidden folders.
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().to_string();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    rust_files(&path, out);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }

    /// Issue 21: an `#[ignore]`d test ran nowhere (and one asserted nothing). Every ignored
    /// test is a device test that gives its reason, in a `DEVICE_TESTS` target that run.sh runs
    /// with `--ignored`.
    #[test]
    fn every_ignored_test_is_a_device_test_that_run_sh_runs() {
        let root = crate::paths::workspace_root();
        let mut files = Vec::new();
        for dir in ["crates", "xtask", "tests"] {
            if root.join(dir).is_dir() {
                rust_files(&root.join(dir), &mut files);
            }
        }
        let mut ignored_in = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap();
            let shown = file.strip_prefix(&root).unwrap().display().to_string();
            for line in text
                .lines()
                .map(str::trim)
                .filter(|l| l.starts_with("#[ignore"))
            {
                assert!(
                    line.starts_with("#[ignore = \"needs a CUDA device"),
                    "{shown}: `{line}`: an ignored test must be a device test saying so"
                );
                let stem = file.file_stem().unwrap().to_string_lossy().to_string();
                assert!(
                    shown == format!("crates/gpu-runtime/tests/{stem}.rs")
                        && DEVICE_TESTS.contains(&stem.as_str()),
                    "{shown}: ignored, but not a DEVICE_TESTS target run.sh runs with --ignored"
                );
                ignored_in.push(stem);
            }
        }
        ignored_in.dedup();
        assert_eq!(ignored_in.len(), DEVICE_TESTS.len(), "{ignored_in:?}");
        let part1 = function("part1");
        for name in DEVICE_TESTS {
            assert!(
                part1.contains(&format!("device_tests {name} ")),
                "run.sh's part 1 does not run {name}"
            );
        }
        assert!(function("device_tests").contains("--ignored"));
    }

    #[test]
    fn results_come_back_in_at_most_eight_files_with_the_data_packed() {
        let names = |folder: &str| {
            let mut names: Vec<&str> = SCRIPT
                .split(folder)
                .skip(1)
                .filter_map(|rest| rest.split(['"', ' ', ')', ',']).next())
                .filter(|name| !name.is_empty())
                .collect();
            names.sort();
            names.dedup();
            names
        };
        // The device tool brings back eight files at most, from both parts run as one (`all`).
        let files = names("$LOG/");
        assert!(files.len() <= 8, "{files:?}");
        for needed in ["data.tar", "checks.log", "summary.txt"] {
            assert!(files.contains(&needed), "{files:?}");
        }
        let data = names("$DATA/");
        for needed in [
            "ncu.csv",
            "ncu-tc.csv",
            "parity.json",
            "ab.json",
            "ab-tc.json",
        ] {
            assert!(data.contains(&needed), "{data:?}");
        }
        // Packed with every summary row, so a cut keeps what the finished stages wrote.
        let record = &SCRIPT[SCRIPT.find("record() {").unwrap()..];
        let record = &record[..record.find("\n}").unwrap()];
        assert!(record.lines().any(|line| line.trim() == "pack"), "{record}");
    }

    #[test]
    fn the_test_executable_is_found_among_cargos_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"solder_gpu_runtime"},"executable":null}
not json
{"reason":"compiler-artifact","target":{"name":"checked_cuda"},"executable":"/t/release/deps/checked_cuda-1a2b"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            test_executable(messages, "checked_cuda").as_deref(),
            Some("/t/release/deps/checked_cuda-1a2b")
        );
        assert_eq!(test_executable(messages, "other"), None);
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

    /// run.sh in a scratch repository with a stand-in `solder` that prints a table line and
    /// exits 0 (after `sleep_on`'s command sleeps); returns the summary file and the status.
    fn run_script(part: &str, sleep_on: &str, cut_after_s: u32) -> (String, Option<i32>) {
        let dir = std::env::temp_dir().join(format!("solder-run-sh-{}-{part}", std::process::id()));
        let bundle = dir.join("target/gpu-check");
        std::fs::create_dir_all(&bundle).unwrap();
        std::fs::write(bundle.join("run.sh"), SCRIPT).unwrap();
        let fake = bundle.join("solder");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/sh\necho 'decode     1    98  2000.00  500.0  1000.0  750.0  50%  67%  1333'\n\
                 case \"$*\" in *'{sleep_on}'*) exec sleep 60 >/dev/null 2>&1 ;; esac\nexit 0\n"
            ),
        )
        .unwrap();
        let log = dir.join("out");
        let status = Command::new("timeout")
            .arg(cut_after_s.to_string())
            .arg("bash")
            .arg(bundle.join("run.sh"))
            .arg(part)
            .env("OUT", &log)
            .env("BIN", &fake)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        let summary = std::fs::read_to_string(log.join("summary.txt")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        (summary, status.code())
    }

    #[test]
    fn a_cut_keeps_every_finished_row_and_the_other_parts_run_to_their_end() {
        if Command::new("timeout").arg("--version").output().is_err() {
            return; // no coreutils timeout: run.sh cannot run here either
        }
        // The tensor-core A/B hangs and the call is cut: the rows before it are already in
        // the file.
        let (summary, status) = run_script("1", "--ab", 6);
        assert_eq!(status, Some(124), "{summary}");
        for row in [
            "facts ",
            "decode w1 graph/eager",
            "parity split",
            "parity tensor cores",
            "prefill 2048 gemv",
            "prefill 2048 tensor cores",
            "prefill 2048 tensor cores large",
        ] {
            assert!(summary.contains(row), "{row} missing:\n{summary}");
        }
        assert!(
            summary.contains("graph 750.0 us, eager 1000.0 us"),
            "{summary}"
        );
        assert!(!summary.contains("tensor cores rows"), "{summary}");
        // Parts 2 and 3 to their ends: no device tools here, so the sanitizer stages are SKIP
        // rows.
        let (summary, status) = run_script("2", "no-such-argument", 60);
        assert_eq!(status, Some(0), "{summary}");
        assert!(summary.contains("part 2"), "{summary}");
        assert!(summary.contains("stress replays"), "{summary}");
        let (summary, status) = run_script("3", "no-such-argument", 60);
        assert_eq!(status, Some(0), "{summary}");
        assert!(summary.contains("decode ctx 131069"), "{summary}");
        let (_, status) = run_script("4", "", 10);
        assert_eq!(status, Some(2));
    }
}
