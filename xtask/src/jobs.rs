//! Independent jobs side by side (ptxas over the kernel modules, g++ over the emulation's):
//! each worker takes the next job not yet taken, the heaviest first, and the results come back
//! in the jobs' order, so what a caller prints or reports does not depend on which finished
//! first.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// `run(job)` for every job, on as many threads as the host has (at most one a job), the jobs
/// started in decreasing `weight` (the longest first shortens the run when one job dominates:
/// gemm's PTX alone is about half of ptxas' time); returns the results in `jobs`' order.
pub fn side_by_side<J: Sync, R: Send>(
    jobs: &[J],
    weight: impl Fn(&J) -> u64,
    run: impl Fn(&J) -> R + Sync,
) -> Vec<R> {
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(weight(&jobs[i])));
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<R>>> = Mutex::new(jobs.iter().map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let result = run(&jobs[i]);
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        // Every index is taken by one worker, which stores its result (a panic in `run`
        // propagates out of the scope before this).
        .map(|r| r.expect("every job ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_the_jobs_order_whatever_runs_first() {
        let jobs: Vec<u64> = (0..23).collect();
        let ran = Mutex::new(Vec::new());
        let out = side_by_side(
            &jobs,
            |j| *j % 5,
            |j| {
                ran.lock().unwrap().push(*j);
                j * 10
            },
        );
        assert_eq!(out, jobs.iter().map(|j| j * 10).collect::<Vec<_>>());
        let mut ran = ran.into_inner().unwrap();
        ran.sort();
        assert_eq!(ran, jobs, "each job runs once");
        assert!(side_by_side(&[] as &[u64], |_| 0, |j| *j).is_empty());
    }
}
