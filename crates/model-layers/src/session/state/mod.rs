//! The mechanisms every `Session` step relies on, below its features:
//! - `step`: one all-or-nothing step (check, lend pages, slots and spare slots, pick the
//!   route, upload the metadata, run, read the logits), and the MTP head's step;
//! - `spares`: spare slots a step's kernels (or a rewind's copies) write a sequence's new
//!   recurrent state into, which it takes on success (`Spares`): no state is ever copied
//!   aside to be put back;
//! - `window`: sliding windows, the KV pages that left every layer's window going back to
//!   the pool;
//! - `rewind`: taking a sequence back to an earlier length (`RewindPoint`, `truncate_to`, and
//!   the roll-back of a verify step's rejected rows from the kernels' per-row snapshots).
//!
//! Invariant: nothing here is public API; `Session`'s façade (`session/mod.rs`) and the
//! speculative step are its only callers.

pub(crate) mod rewind;
mod spares;
pub(crate) mod step;
pub(crate) mod window;

pub(crate) use rewind::Cuts;
pub use rewind::RewindPoint;
pub(crate) use spares::Spares;
pub(crate) use step::{Reads, Row, SaveState};
