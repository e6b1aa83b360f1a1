//! `cargo xtask fuzz`: the fuzz suite, on stable Rust. Structure-aware mutations of the shipped
//! configs, rules and a tiny model's checkpoint (header and bytes), plus arbitrary bytes, fed
//! to the parsers and one stage beyond (`targets`). A case fails when it panics, asks for one
//! allocation above `alloc::CAP_BYTES` (the process aborts, naming the case), or is refused by
//! an error that does not name the input. Cases are numbered and seeded: `--seed S --cases N`
//! reproduces a run, and a finding prints its case and writes its input under
//! `target/fuzz/findings/`.
//!
//! The `api` target (`api`) drives the library itself: sequences of session and exec calls
//! with hostile arguments on the CPU backend, each refused call checked to leave every
//! sequence byte for byte as it was.
//!
//! CI runs a bounded number of cases per target (`cargo xtask ci`); `--seconds N` runs longer.

pub mod alloc;
mod api;
mod mutate;
mod targets;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::args::Args;
use mutate::Rng;
use targets::{Corpus, Outcome};

const USAGE: &str = "usage: cargo xtask fuzz [--cases N | --seconds N] [--target T] [--seed S]

  --cases N     cases per target (default 2000; at most 10000000)
  --seconds N   run each target for N seconds instead (at most 86400)
  --target T    config, rules, checkpoint, api or all (default all)
  --seed S      the run's seed (default 1); case i of a target is seeded from (S, target, i)";

const TARGETS: &[&str] = &["config", "rules", "checkpoint", "api"];

/// How long or how many.
#[derive(Clone, Copy)]
enum Budget {
    Cases(u64),
    Time(Duration),
}

/// What one target's run found.
#[derive(Debug, Default)]
struct Tally {
    cases: u64,
    accepted: u64,
    refused: u64,
    findings: Vec<String>,
    largest_allocation: usize,
    /// The slowest case and its time.
    slowest: (u64, Duration),
}

pub fn run(argv: Vec<String>) -> Result<(), String> {
    if argv.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let args = Args::parse(argv, &["cases", "seconds", "target", "seed"], &[])?;
    let cases = args.number_in("cases", 1..=10_000_000)?;
    let seconds = args.number_in("seconds", 1..=86_400)?;
    let budget = match (cases, seconds) {
        (Some(_), Some(_)) => return Err("give `--cases` or `--seconds`, not both".into()),
        (_, Some(s)) => Budget::Time(Duration::from_secs(s as u64)),
        (Some(n), None) => Budget::Cases(n as u64),
        (None, None) => Budget::Cases(2000),
    };
    let seed = args.number_in("seed", 0..=usize::MAX)?.unwrap_or(1) as u64;
    let chosen: Vec<&str> = match args.value("target").unwrap_or("all") {
        "all" => TARGETS.to_vec(),
        t if TARGETS.contains(&t) => vec![t],
        other => {
            return Err(format!(
                "unknown target `{other}` (expected config, rules, checkpoint, api or all)"
            ))
        }
    };
    let root = crate::paths::workspace_root();
    let scratch = root.join("target/fuzz");
    let findings = fuzz(&root, &scratch, &chosen, budget, seed)?;
    if findings > 0 {
        return Err(format!(
            "{findings} findings (inputs in {})",
            scratch.join("findings").display()
        ));
    }
    Ok(())
}

/// Runs every chosen target; returns the number of findings.
fn fuzz(
    root: &Path,
    scratch: &Path,
    chosen: &[&str],
    budget: Budget,
    seed: u64,
) -> Result<usize, String> {
    std::fs::create_dir_all(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let corpus = Corpus::load(root, scratch)?;
    let case_dir = scratch.join(format!("case-{}", std::process::id()));
    std::fs::create_dir_all(&case_dir).map_err(|e| format!("{}: {e}", case_dir.display()))?;
    // Panics are findings, reported once each by the tally; the default hook's backtraces
    // would drown the report.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut total = 0;
    for (t, target) in chosen.iter().enumerate() {
        let tally = run_target(&corpus, target, t as u64, budget, seed, &case_dir, scratch);
        println!(
            "fuzz {target:<10} {:>8} cases  {:>8} accepted  {:>8} refused by name  {} findings  \
             largest allocation {} KiB  slowest case {} ({:.1} ms)",
            tally.cases,
            tally.accepted,
            tally.refused,
            tally.findings.len(),
            tally.largest_allocation / 1024,
            tally.slowest.0,
            tally.slowest.1.as_secs_f64() * 1e3
        );
        for f in &tally.findings {
            println!("  finding: {f}");
        }
        total += tally.findings.len();
    }
    std::panic::set_hook(hook);
    let _ = std::fs::remove_dir_all(&case_dir);
    println!(
        "{} findings; cap per allocation {} MiB",
        total,
        alloc::CAP_BYTES >> 20
    );
    Ok(total)
}

fn run_target(
    corpus: &Corpus,
    target: &str,
    index: u64,
    budget: Budget,
    seed: u64,
    case_dir: &Path,
    scratch: &Path,
) -> Tally {
    let mut tally = Tally::default();
    // The api target's execs are built once, before any case is armed.
    let mut api = match target {
        "api" => match api::Api::build(corpus.shipped_rules()) {
            Ok(api) => Some(api),
            Err(e) => {
                tally
                    .findings
                    .push(format!("the api target's execs did not build: {e}"));
                return tally;
            }
        },
        _ => None,
    };
    // SOLDER_FUZZ_TRACE=1 names each case before it runs (to find a hang).
    let trace = std::env::var_os("SOLDER_FUZZ_TRACE").is_some();
    let start = Instant::now();
    let mut case = 0u64;
    loop {
        let more = match budget {
            Budget::Cases(n) => case < n,
            Budget::Time(d) => start.elapsed() < d,
        };
        if !more {
            break;
        }
        let mut rng = Rng::new(seed.wrapping_mul(0x100_0000_01B3) ^ (index << 56) ^ case);
        if trace {
            eprintln!("fuzz {target}: case {case}");
        }
        alloc::arm(case);
        let began = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| match (target, api.as_mut()) {
            ("config", _) => targets::config_case(corpus, &mut rng),
            ("rules", _) => targets::rules_case(corpus, &mut rng),
            ("api", Some(api)) => api::api_case(api, &mut rng),
            _ => targets::checkpoint_case(corpus, &mut rng, case_dir),
        }));
        tally.largest_allocation = tally.largest_allocation.max(alloc::disarm());
        let took = began.elapsed();
        if took > tally.slowest.1 {
            tally.slowest = (case, took);
        }
        let finding = match result {
            Ok((_, Outcome::Accepted)) => {
                tally.accepted += 1;
                None
            }
            Ok((_, Outcome::Refused)) => {
                tally.refused += 1;
                None
            }
            Ok((input, Outcome::Unnamed(message))) => Some((
                input,
                format!("case {case}: refused without naming the input: {message}"),
            )),
            Ok((input, Outcome::Broken(message))) => {
                Some((input, format!("case {case}: {message}")))
            }
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                // Regenerate the input (the closure's was lost with the panic).
                let mut rng = Rng::new(seed.wrapping_mul(0x100_0000_01B3) ^ (index << 56) ^ case);
                let input = regenerate(corpus, target, &mut rng, case_dir);
                Some((input, format!("case {case}: panic: {message}")))
            }
        };
        if let Some((input, what)) = finding {
            let dir = scratch.join("findings");
            let path = dir.join(format!("{target}-seed{seed}-case{case}"));
            let _ = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, &input));
            if tally.findings.len() < 20 {
                tally.findings.push(what);
            } else if tally.findings.len() == 20 {
                tally
                    .findings
                    .push("(more findings not listed)".to_string());
            }
        }
        case += 1;
        tally.cases = case;
    }
    tally
}

/// The input of a case whose run panicked: the same generator without the checks.
fn regenerate(corpus: &Corpus, target: &str, rng: &mut Rng, case_dir: &Path) -> Vec<u8> {
    let hook_safe = catch_unwind(AssertUnwindSafe(|| match target {
        "config" => targets::config_case(corpus, rng).0,
        "rules" => targets::rules_case(corpus, rng).0,
        // Its execs may be what the panic broke: the seed and case number reproduce it.
        "api" => b"api case: rerun with the same --seed and --cases to reproduce".to_vec(),
        _ => targets::checkpoint_case(corpus, rng, case_dir).0,
    }));
    hook_safe.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::mutate::{mutate_bytes, mutate_json, Rng};

    #[test]
    fn mutations_are_reproducible_from_the_seed() {
        let doc: serde_json::Value = serde_json::json!({"a": 1, "b": [1, 2, {"c": "x"}]});
        let (mut r1, mut r2) = (Rng::new(42), Rng::new(42));
        for _ in 0..50 {
            assert_eq!(mutate_json(&doc, &mut r1), mutate_json(&doc, &mut r2));
            assert_eq!(
                mutate_bytes(b"hello", &mut r1),
                mutate_bytes(b"hello", &mut r2)
            );
        }
    }

    #[test]
    fn mutations_change_the_input() {
        let doc: serde_json::Value = serde_json::json!({"hidden_size": 64, "vocab_size": 256});
        let mut rng = Rng::new(7);
        let changed = (0..100)
            .filter(|_| mutate_json(&doc, &mut rng) != doc)
            .count();
        assert!(
            changed > 50,
            "only {changed} of 100 mutations changed the document"
        );
    }
}
