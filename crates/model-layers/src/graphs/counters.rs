//! What an engine reads about an exec's graphs: `GraphCounters` (a snapshot of launches,
//! eager steps, captures and their time) and `CaptureReport` (what `capture_all` did).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::policy::EagerReason;

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
