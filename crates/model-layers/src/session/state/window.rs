//! Sliding windows in the Session: KV pages that fall wholly outside every layer's window go
//! back to the pool, so a windowed model's memory per sequence stays bounded however long
//! the sequence grows.
//!
//! When every attention layer has a window (`ModelConfig::kv_window`, the widest, W), a
//! sequence of length L keeps the pages covering positions `L - (W + R)..L`, where R is the
//! widest verify width the exec compiled: a later rollback of up to R tokens (speculative
//! decoding rejecting a draft) still finds every position its next step's window reads (the
//! first row of that step, at position `L - R`, reads from `L - R + 1 - W`). Pages wholly
//! before that are recycled after each step (`state::step`, once the sequences advanced) and
//! after a whole prefill (never between its chunks: a failed prefill rolls back to where it
//! started, which may be further back than R; so a prefill holds the pages of its whole
//! prompt until it ends). A recycled block's entry in the block table
//! becomes the scratch page (`PagePool::recycle`): positions are kept and the kernels, which
//! read only the window, never read it. No page is recycled when any attention layer attends
//! over the whole context.
//!
//! Invariant: after a step, a sequence of length L holds a real page for every block that
//! covers a position at or after `L - (W + R)`.

use solder_circuit::Mode;

use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::meta::SCRATCH_PAGE;
use crate::session::{SeqId, Session};

/// `Session::kv_keep`: positions kept before a sequence's length, the widest window plus the
/// widest verify width (see the module doc); `None` when pages are never recycled (a layer
/// attends over the whole context).
pub(crate) fn kv_keep(exec: &CircuitExec) -> Option<usize> {
    let window = exec.config.kv_window()?;
    let shapes = exec.instance.program_shapes();
    let rollback = shapes.widest(Mode::Verify).unwrap_or(1);
    Some(window.saturating_add(rollback))
}

impl Session<'_> {
    /// Refuses to take sequence `id` back to `len` tokens when a page its next step's window
    /// reads (a block covering a position at or after `len + 1 - W`) was recycled: the kernels
    /// would read the scratch page in its place. A take-back of at most the widest verify
    /// width always passes (the module's invariant); each further one is checked again.
    pub(crate) fn check_window_kept(&self, id: SeqId, len: usize) -> Result<(), SessionError> {
        if self.kv_keep().is_none() {
            return Ok(());
        }
        let Some(window) = self.exec.config.kv_window() else {
            return Ok(());
        };
        // The next step's first row, at position `len`, reads positions `len + 1 - W..=len`.
        let needed_from = len.saturating_add(1).saturating_sub(window);
        let Some(seq) = self.seqs.get(&id) else {
            return Err(SessionError::UnknownSequence(id));
        };
        let block_size = self.exec.layout.kv_block_size;
        let first = needed_from / block_size;
        let last = len.div_ceil(block_size).min(seq.pages.len());
        if let Some(block) = (first..last).find(|&b| seq.pages.get(b) == Some(&SCRATCH_PAGE)) {
            return Err(SessionError::Rewind(format!(
                "sequence {id}: taking it back to {len} tokens needs the KV of positions from {}, \
                 but block {block} (positions {}..{}) went back to the pool when the sliding \
                 window moved past it",
                needed_from,
                block * block_size,
                (block + 1) * block_size
            )));
        }
        Ok(())
    }

    /// Gives back the pages of `ids` that lie wholly before `kv_keep` positions from their
    /// ends; nothing when the model has a full-attention layer.
    pub(crate) fn recycle_out_of_window(&mut self, ids: impl IntoIterator<Item = SeqId>) {
        let Some(keep) = self.kv_keep() else {
            return;
        };
        let block_size = self.exec.layout.kv_block_size;
        let mut pools = self.exec.pools();
        for id in ids {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            let before = seq.len.saturating_sub(keep) / block_size;
            let freed = pools.pages.recycle(&mut seq.pages, before);
            if freed > 0 {
                tracing::trace!(
                    seq = id,
                    len = seq.len,
                    freed,
                    "KV pages out of the window recycled"
                );
            }
        }
    }
}
