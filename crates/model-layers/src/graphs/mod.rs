//! The graphs of a `CircuitExec`'s steps: which programs replay as a captured graph
//! (`policy`), their cache (`cache`), their lifecycle on a backend — capture, replay,
//! release, invalidation (`lifecycle`) — the handles `CircuitExec::capture` gives out
//! (`captured`) and the counters an engine reads (`counters`).
//!
//! A step (`CircuitExec::run_step`) replays the graph of its program — primary or route arm,
//! keyed by (mode, rows, arm) — capturing it on first use; `CircuitExec::capture_all` captures
//! the whole ladder ahead. `GraphPolicy` chooses: `Auto` (the default) replays graphs and, if
//! a capture fails, turns graphs off for the exec, keeps and logs the reason once and runs
//! every later step eagerly; `Always` replays graphs and returns a failed capture as the
//! step's error; `Never` runs every step eagerly.
//!
//! Lifecycle: a graph bakes the exec's device pointers and launch arguments. Whatever changes
//! one of them (today `CircuitExec::resize_kv`, which moves the state allocation and changes
//! every program's page count) bumps the exec's binding epoch and destroys the graphs captured
//! at an older one before the memory they name is given back; each is recaptured at its next
//! use (counted as a recapture), so no graph is ever replayed stale.
//!
//! Invariants: the cache holds at most one graph per program key, each captured at the epoch
//! it records; after a failed capture under `Auto` nothing is captured again until the policy
//! is set anew (no retry storm). Nothing here imports `exec`: the exec hands the lifecycle its
//! programs and lanes. This file re-exports only the plain types (`policy`, `counters`,
//! `captured`), so `program` and `error` can name them without reaching the lifecycle.

mod cache;
pub(crate) mod captured;
mod counters;
pub(crate) mod lifecycle;
mod policy;

pub use captured::CapturedGraph;
pub use counters::{CaptureReport, GraphCounters};
pub use policy::{EagerReason, GraphPolicy, StepRun};
