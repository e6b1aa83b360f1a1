//! The graphs of a `CircuitExec`'s steps: which programs replay as a captured graph, their
//! cache, their lifecycle and their counters.
//!
//! A step (`CircuitExec::run_step`) replays the graph of its program — primary or route arm,
//! keyed by (mode, rows, arm) — capturing it on first use; `CircuitExec::capture_all` captures
//! the whole ladder ahead. `GraphPolicy` chooses: `Auto` (the default) replays graphs and, if
//! a capture fails, turns graphs off for the exec, keeps and logs the reason once and runs
//! every later step eagerly; `Always` replays graphs and returns a failed capture as the
//! step's error; `Never` runs every step eagerly.
//!
//! Lifecycle: a graph bakes the exec's device pointers and launch arguments. Whatever changes
//! one of them (today `CircuitExec::grow_kv`, which moves the state allocation and changes
//! every program's page count) bumps the exec's binding epoch and destroys the graphs captured
//! at an older one before the memory they name is given back; each is recaptured at its next
//! use (counted as a recapture), so no graph is ever replayed stale.
//!
//! Invariants: the cache holds at most one graph per program key, each captured at the epoch
//! it records; after a failed capture under `Auto` nothing is captured again until the policy
//! is set anew (no retry storm).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use solder_circuit::{Mode, RouteCondition};
use solder_gpu_runtime::{GraphExecId, GraphId};

/// Whether steps replay captured graphs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GraphPolicy {
    /// Graphs; a failed capture turns them off for the exec and steps run eagerly.
    #[default]
    Auto,
    /// Graphs; a failed capture is the step's error.
    Always,
    /// Every step eagerly.
    Never,
}

impl fmt::Display for GraphPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GraphPolicy::Auto => "auto",
            GraphPolicy::Always => "always",
            GraphPolicy::Never => "never",
        })
    }
}

impl std::str::FromStr for GraphPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(GraphPolicy::Auto),
            "always" => Ok(GraphPolicy::Always),
            "never" => Ok(GraphPolicy::Never),
            other => Err(format!(
                "graph policy `{other}`: expected auto, always or never"
            )),
        }
    }
}

/// The program a graph was captured from: its mode, rows and route arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramKey {
    pub mode: Mode,
    pub rows: usize,
    pub arm: Option<RouteCondition>,
}

impl fmt::Display for ProgramKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.mode, self.rows)?;
        if let Some(arm) = self.arm {
            write!(f, " (arm {})", arm.capability())?;
        }
        Ok(())
    }
}

/// How a step ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepRun {
    /// Replayed a graph captured by an earlier step (or `capture_all`).
    Replayed,
    /// Captured its program's graph (first use, or after it went stale), then replayed it.
    Captured,
    /// Ran the program's launches one by one.
    Eager(EagerReason),
}

/// Why a step ran eagerly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EagerReason {
    /// `GraphPolicy::Never`.
    PolicyNever,
    /// A capture failed under `GraphPolicy::Auto`: graphs are off for this exec
    /// (`GraphCounters::off_reason` says why).
    GraphsOff,
}

impl fmt::Display for EagerReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EagerReason::PolicyNever => "policy never",
            EagerReason::GraphsOff => "graphs off after a failed capture",
        })
    }
}

/// What an engine reads and logs about an exec's graphs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphCounters {
    /// Steps that launched a graph (captured or replayed).
    pub graph_launches: u64,
    /// Steps run eagerly, by reason.
    pub eager: BTreeMap<EagerReason, u64>,
    /// Graphs captured (recaptures included).
    pub captures: u64,
    /// Captures of a program whose earlier graph went stale.
    pub recaptures: u64,
    /// Graphs destroyed because something they baked changed.
    pub invalidated: u64,
    /// Captures that failed.
    pub failed_captures: u64,
    /// Time spent capturing and instantiating, in total.
    pub capture_time: Duration,
    /// Graphs the cache holds now.
    pub cached: usize,
    /// Why graphs are off, after a failed capture under `Auto`.
    pub off_reason: Option<String>,
}

impl GraphCounters {
    /// Steps run eagerly, all reasons.
    pub fn eager_steps(&self) -> u64 {
        self.eager.values().sum()
    }
}

impl fmt::Display for GraphCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "graph launches {}, eager steps {}",
            self.graph_launches,
            self.eager_steps()
        )?;
        for (reason, n) in &self.eager {
            write!(f, " ({n} {reason})")?;
        }
        write!(
            f,
            ", captures {} (recaptures {}, failed {}), invalidated {}, capture time {:.3} ms, cached {}",
            self.captures,
            self.recaptures,
            self.failed_captures,
            self.invalidated,
            self.capture_time.as_secs_f64() * 1e3,
            self.cached
        )?;
        if let Some(reason) = &self.off_reason {
            write!(f, "; graphs off: {reason}")?;
        }
        Ok(())
    }
}

/// The ladder captured by `CircuitExec::capture_all`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureReport {
    /// Graphs captured by this call.
    pub captured: usize,
    /// Graphs that were already cached and current.
    pub already: usize,
    /// Launches in the graphs captured by this call.
    pub launches: usize,
    /// Wall time of this call's captures.
    pub time: Duration,
}

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
