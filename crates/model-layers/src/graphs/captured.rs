//! `CapturedGraph`: a graph handed out by `CircuitExec::capture`. A plain handle that imports
//! nothing from the crate, so `error` can carry one back without naming the exec.

use solder_circuit::Mode;
use solder_gpu_runtime::{GraphExecId, GraphId};

/// A graph captured from one of the exec's programs. Not `Clone`: `release` consumes it, so a
/// graph cannot be released twice, and it remembers the exec that captured it, which alone
/// may replay or release it.
#[derive(Debug, PartialEq, Eq)]
pub struct CapturedGraph {
    pub mode: Mode,
    pub rows: usize,
    pub(super) graph: GraphId,
    pub(super) exec: GraphExecId,
    /// `CircuitExec::id` of the exec that captured it.
    pub(super) owner: u64,
}
