//! What decides and reports how a step runs: `GraphPolicy` (graphs or eager), `ProgramKey`
//! (the program a graph is cached under), `StepRun` (how a step ran) and `EagerReason`.
//! Plain types: this file imports nothing from the crate.

use std::fmt;

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
