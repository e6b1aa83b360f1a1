//! The cases of a parity run on the CPU backend, several at a time: one worker thread per
//! CPU backend, each taking the next case not yet taken, the tables printed in the cases'
//! order as each is ready.
//!
//! Invariant: a case's report does not depend on which worker ran it or with how many host
//! threads (every twin writes the same bytes whatever the thread count, and each worker owns
//! its backend and, under `emu`, its emulation), so the table is the one a serial run prints.
//! A worker that meets an error takes no further case, nor does any other; the error of the
//! earliest case that failed is returned once every worker has stopped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use solder_circuit::RuleSet;
use solder_gpu_runtime::cpu::CpuBackend;

use super::case::Case;
use super::report;
use super::run::{run_case, CaseReport};

/// How a run shares the host: `workers` backends, each running whole cases on `threads`
/// host threads. The tiny models' kernels are mostly too small to split across threads, so
/// cases run side by side first; one case alone keeps every thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Shape {
    pub workers: usize,
    pub threads: usize,
}

/// `cases` cases on `threads` host threads (`--threads`; `None`: every available one, at
/// most `CpuBackend::new`'s).
pub(super) fn shape(cases: usize, threads: Option<usize>) -> Shape {
    let host = threads.unwrap_or_else(|| {
        let available = std::thread::available_parallelism().map_or(1, |n| n.get());
        available.min(solder_gpu_runtime::cpu::MAX_HOST_THREADS)
    });
    let workers = cases.min(host).max(1);
    Shape {
        workers,
        threads: (host / workers).max(1),
    }
}

/// Runs every case on one of `backends` (one worker each), printing each case's table in
/// the cases' order; the reports come back in that order, with the backends.
pub(super) fn run_all(
    cases: &[Case],
    rules: &RuleSet,
    backends: Vec<CpuBackend>,
) -> (Result<Vec<CaseReport>, String>, Vec<CpuBackend>) {
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (sent, received) = mpsc::channel::<(usize, Result<CaseReport, String>, f64)>();
    std::thread::scope(|scope| {
        let workers: Vec<_> = backends
            .into_iter()
            .map(|mut backend| {
                let sent = sent.clone();
                let (next, stop) = (&next, &stop);
                scope.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(case) = cases.get(i) else { break };
                        let t = Instant::now();
                        let ran = run_case(case, rules, &mut backend);
                        if ran.is_err() {
                            stop.store(true, Ordering::Relaxed);
                        }
                        // The receiver outlives every worker (it is this scope's).
                        let _ = sent.send((i, ran, t.elapsed().as_secs_f64()));
                    }
                    backend
                })
            })
            .collect();
        // Only the workers' senders remain: the loop below ends when the last one stops.
        drop(sent);
        let reports = in_order(received, cases.len());
        let backends = workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect();
        (reports, backends)
    })
}

/// The workers' results as they come, each case's table printed once every earlier case's
/// has been; the reports in case order, or the error of the earliest case that failed.
fn in_order(
    received: mpsc::Receiver<(usize, Result<CaseReport, String>, f64)>,
    cases: usize,
) -> Result<Vec<CaseReport>, String> {
    let mut waiting: BTreeMap<usize, (Result<CaseReport, String>, f64)> = BTreeMap::new();
    let mut reports = Vec::with_capacity(cases);
    let mut failed: Option<(usize, String)> = None;
    for (i, ran, seconds) in received {
        waiting.insert(i, (ran, seconds));
        // Print what is now next in order; past a failure nothing more is printed.
        while failed.is_none() {
            let Some((ran, seconds)) = waiting.remove(&reports.len()) else {
                break;
            };
            match ran {
                Ok(report) => {
                    report::print_case(&report, seconds);
                    reports.push(report);
                }
                Err(e) => failed = Some((reports.len(), e)),
            }
        }
    }
    // A case after the first printed failure may have failed first in time; the earliest
    // by case order is the one reported.
    let earliest = waiting
        .into_iter()
        .filter_map(|(i, (ran, _))| ran.err().map(|e| (i, e)))
        .chain(failed)
        .min_by_key(|(i, _)| *i);
    match earliest {
        Some((_, e)) => Err(e),
        None if reports.len() == cases => Ok(reports),
        None => Err(format!(
            "parity: {} of {cases} cases never reported (a worker stopped early)",
            cases - reports.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_run_side_by_side_before_a_case_takes_several_threads() {
        let shape_of = |cases, threads| {
            let s = shape(cases, Some(threads));
            (s.workers, s.threads)
        };
        assert_eq!(shape_of(12, 2), (2, 1));
        assert_eq!(shape_of(1, 8), (1, 8));
        assert_eq!(shape_of(3, 8), (3, 2));
        assert_eq!(shape_of(0, 4), (1, 4));
    }

    /// Two tiny models on two workers: the same reports, in the same order, as one worker
    /// running both (the logits byte for byte).
    #[test]
    fn two_workers_report_what_one_does_in_the_cases_order() {
        let rules =
            RuleSet::from_file(&crate::paths::workspace_root().join("fusions/FUSIONS.toml"))
                .unwrap();
        let cases: Vec<Case> =
            super::super::builtin_cases(Some(&["tiny-qwen3", "tiny-llama"]), Some(2), 2, Some(1))
                .unwrap();
        let backend = || solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
        let (one, _) = run_all(&cases, &rules, vec![backend()]);
        let (two, backends) = run_all(&cases, &rules, vec![backend(), backend()]);
        assert_eq!(backends.len(), 2);
        let (one, two) = (one.unwrap(), two.unwrap());
        let names = |r: &[CaseReport]| r.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&two), ["tiny-llama", "tiny-qwen3"]);
        assert_eq!(names(&one), names(&two));
        for (a, b) in one.iter().zip(&two) {
            assert!(a.decode_logits == b.decode_logits, "{}", a.name);
        }
    }

    /// A failing case stops the run with its own error, whichever worker met it.
    #[test]
    fn the_earliest_failing_case_is_the_error() {
        let (sent, received) = mpsc::channel();
        sent.send((2, Err("case 2".to_string()), 0.0)).unwrap();
        sent.send((1, Err("case 1".to_string()), 0.0)).unwrap();
        drop(sent);
        assert_eq!(in_order(received, 4).err().unwrap(), "case 1");
        let (sent, received) = mpsc::channel::<(usize, Result<CaseReport, String>, f64)>();
        drop(sent);
        let e = in_order(received, 2).err().unwrap();
        assert!(e.contains("2 of 2 cases never reported"), "{e}");
    }
}
