//! The step-graph cache of one exec: at most one graph per `ProgramKey`, each stamped with
//! the binding epoch it was captured at, and what a step does under the policy (`decide`).
//! Bookkeeping only: creating and destroying graphs on a backend is `lifecycle`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use solder_gpu_runtime::{GraphExecId, GraphId};

use super::counters::GraphCounters;
use super::policy::{EagerReason, GraphPolicy};
use crate::program::ProgramKey;

/// One cached graph: its handles and the binding epoch it was captured at.
#[derive(Debug)]
pub(crate) struct Cached {
    pub graph: GraphId,
    pub exec: GraphExecId,
    pub epoch: u64,
}

/// What the cache tells a step to do.
#[derive(Debug)]
pub(crate) enum Decision {
    Replay(GraphExecId),
    Capture,
    Eager(EagerReason),
}

/// The graph cache of one exec.
#[derive(Debug, Default)]
pub(crate) struct GraphCache {
    pub policy: GraphPolicy,
    /// Bumped whenever something graphs bake changes.
    pub epoch: u64,
    pub graphs: BTreeMap<ProgramKey, Cached>,
    /// Keys whose graph was destroyed as stale: their next capture is a recapture.
    pub stale: BTreeSet<ProgramKey>,
    /// Why graphs are off (a failed capture under `Auto`).
    pub off: Option<String>,
    pub counters: GraphCounters,
}

impl GraphCache {
    /// What a step of `key` does under the policy and the cache's state.
    pub fn decide(&self, key: &ProgramKey) -> Decision {
        match self.policy {
            GraphPolicy::Never => return Decision::Eager(EagerReason::PolicyNever),
            GraphPolicy::Auto if self.off.is_some() => {
                return Decision::Eager(EagerReason::GraphsOff)
            }
            _ => {}
        }
        match self.graphs.get(key) {
            Some(cached) if cached.epoch == self.epoch => Decision::Replay(cached.exec),
            _ => Decision::Capture,
        }
    }

    pub fn count_eager(&mut self, reason: EagerReason) {
        *self.counters.eager.entry(reason).or_default() += 1;
    }

    /// Records a capture that succeeded.
    pub fn captured(&mut self, key: ProgramKey, graph: GraphId, exec: GraphExecId, took: Duration) {
        self.counters.captures += 1;
        if self.stale.remove(&key) {
            self.counters.recaptures += 1;
        }
        self.counters.capture_time += took;
        self.graphs.insert(
            key,
            Cached {
                graph,
                exec,
                epoch: self.epoch,
            },
        );
        self.counters.cached = self.graphs.len();
    }

    /// Records a capture that failed; under `Auto`, turns graphs off (logged once).
    pub fn capture_failed(&mut self, key: &ProgramKey, reason: &str) {
        self.counters.failed_captures += 1;
        if self.policy == GraphPolicy::Auto && self.off.is_none() {
            let why = format!("capturing {key}: {reason}");
            tracing::warn!(reason = %why, "graph capture failed: graphs are off for this exec, steps run eagerly");
            self.counters.off_reason = Some(why.clone());
            self.off = Some(why);
        }
    }

    /// Sets the policy; setting one clears an earlier `Auto` failure (graphs are tried again).
    pub fn set_policy(&mut self, policy: GraphPolicy) {
        self.policy = policy;
        self.off = None;
        self.counters.off_reason = None;
    }

    /// Bumps the epoch: every cached graph is stale from here on. Returns the stale graphs,
    /// which the caller destroys before the memory they name is given back.
    pub fn invalidate(&mut self) -> Vec<(ProgramKey, Cached)> {
        self.epoch += 1;
        let stale: Vec<(ProgramKey, Cached)> =
            std::mem::take(&mut self.graphs).into_iter().collect();
        self.counters.invalidated += stale.len() as u64;
        self.stale.extend(stale.iter().map(|(key, _)| *key));
        self.counters.cached = 0;
        stale
    }

    /// Takes every cached graph out (to destroy them all: `free`, `release_graphs`).
    pub fn take_all(&mut self) -> Vec<(ProgramKey, Cached)> {
        let all: Vec<(ProgramKey, Cached)> = std::mem::take(&mut self.graphs).into_iter().collect();
        self.counters.cached = 0;
        all
    }

    /// Puts back graphs that could not be destroyed.
    pub fn put_back(&mut self, kept: Vec<(ProgramKey, Cached)>) {
        self.graphs.extend(kept);
        self.counters.cached = self.graphs.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use solder_circuit::Mode;

    fn key(rows: usize) -> ProgramKey {
        ProgramKey {
            mode: Mode::MultiSeq,
            rows,
            arm: None,
        }
    }

    #[test]
    fn decides_by_policy_epoch_and_failure() {
        let mut cache = GraphCache::default();
        assert!(matches!(cache.decide(&key(2)), Decision::Capture));
        cache.captured(key(2), GraphId(1), GraphExecId(1), Duration::from_micros(5));
        assert!(matches!(
            cache.decide(&key(2)),
            Decision::Replay(GraphExecId(1))
        ));
        // Stale after an invalidation: captured again, and counted as a recapture.
        let stale = cache.invalidate();
        assert_eq!(stale.len(), 1);
        assert!(matches!(cache.decide(&key(2)), Decision::Capture));
        cache.captured(key(2), GraphId(2), GraphExecId(2), Duration::from_micros(5));
        assert_eq!(cache.counters.recaptures, 1);
        assert_eq!(cache.counters.captures, 2);
        // A failure under Auto turns graphs off, once; Always keeps trying and reports.
        cache.capture_failed(&key(4), "no");
        assert!(matches!(
            cache.decide(&key(2)),
            Decision::Eager(EagerReason::GraphsOff)
        ));
        assert!(cache
            .counters
            .off_reason
            .as_deref()
            .unwrap()
            .contains("multi_seq:4"));
        cache.set_policy(GraphPolicy::Always);
        cache.capture_failed(&key(4), "no");
        assert!(matches!(cache.decide(&key(2)), Decision::Replay(_)));
        cache.set_policy(GraphPolicy::Never);
        assert!(matches!(
            cache.decide(&key(2)),
            Decision::Eager(EagerReason::PolicyNever)
        ));
        assert_eq!(cache.counters.failed_captures, 2);
    }

    #[test]
    fn policy_parses_and_prints() {
        for policy in [GraphPolicy::Auto, GraphPolicy::Always, GraphPolicy::Never] {
            assert_eq!(policy.to_string().parse::<GraphPolicy>(), Ok(policy));
        }
        assert!("sometimes"
            .parse::<GraphPolicy>()
            .unwrap_err()
            .contains("sometimes"));
    }
}
