//! The `Drafter` trait: what proposes the tokens a speculative step verifies. The built-in
//! drafters (`ModelDrafter`, `MtpDrafter`) implement it on `Session`'s public API alone, so an
//! engine's own drafter can do whatever they do.
//!
//! The protocol, per target sequence and speculative step: `draft(committed, pending, k)`
//! proposes k tokens to follow `pending` (the token the target will feed next), given every
//! token the target's cache holds (`committed`, so a drafter catches up on tokens fed by plain
//! steps or a prefill); then, once the step is over, `settle(verdict)` says how many of
//! `[pending, drafts…]` the target kept (0 when the step failed or was refused) and where its
//! rows lay in the verify program that ran, and the drafter takes back what it fed past
//! them. Each `draft` is followed by exactly one `settle` for the same sequence before the
//! next `draft` for it; `settle` needs nothing of the order in which sequences were drafted.
//! `draft_many` drafts several sequences at once (a batched speculative step asks through it):
//! each draft it returns counts as that sequence's `draft`; when it fails, no sequence of it
//! stays drafted (nothing to settle).

use solder_gpu_runtime::GpuBackend;

use crate::error::SessionError;
use crate::session::SeqId;

/// A draft: the k tokens a drafter proposes to follow `pending` for one speculative step, and
/// (sampled drafting) the distribution each was drawn from, for speculative sampling's
/// accept/resample rule (`sampling::accept`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// One distribution over the vocabulary per token; None for greedy drafting.
    pub probs: Option<Vec<Vec<f64>>>,
}

/// What the target made of one sequence's draft, told to its drafter when the step is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// How many of `[pending, drafts…]` the target kept: `accepted + 1`, or 0 when the step
    /// failed or was refused (nothing of it stays).
    pub kept: usize,
    /// The verify program row that fed `pending` (the sequence's rows follow it): where the
    /// target's hidden rows of the kept tokens lie in the exec's workspace until the next
    /// step runs (`CircuitExec::read_hidden_at`). Meaningless when `kept` is 0.
    pub row: usize,
}

impl Verdict {
    /// Nothing kept: the step failed or was refused.
    pub const NOTHING: Verdict = Verdict { kept: 0, row: 0 };
}

/// What proposes drafts for a target sequence (see the module doc for the protocol).
pub trait Drafter {
    /// The vocabulary the drafter's tokens index (must equal the target's).
    fn vocab_size(&self) -> usize;

    /// Proposes `k` tokens to follow `pending` for target sequence `seq`, whose cache holds
    /// `committed`, in order.
    fn draft(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
        pending: u32,
        k: usize,
    ) -> Result<Draft, SessionError>;

    /// Drafts every `(seq, committed, pending, k)` of `batch` (distinct sequences), as `draft`
    /// one by one would: each sequence's draft is the one `draft` gives it alone. A drafter
    /// that can run several sequences in one program does it here; by default, one `draft`
    /// per sequence, the ones drafted settled with `Verdict::NOTHING` if a later one fails.
    fn draft_many(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
    ) -> Result<Vec<Draft>, SessionError> {
        let mut drafts = Vec::with_capacity(batch.len());
        for &(seq, committed, pending, k) in batch {
            match self.draft(backend, seq, committed, pending, k) {
                Ok(draft) => drafts.push(draft),
                Err(e) => {
                    for &(drafted, ..) in &batch[..drafts.len()] {
                        if let Err(settle) = self.settle(backend, drafted, Verdict::NOTHING) {
                            tracing::warn!(error = %settle, seq = drafted, "the drafter could not take back a draft");
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(drafts)
    }

    /// The step that verified the last `draft` for `seq` is over: the target kept
    /// `verdict.kept` tokens of `[pending, drafts…]`; take back what was fed past them.
    fn settle(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        verdict: Verdict,
    ) -> Result<(), SessionError>;

    /// The target sequence ended: give back what the drafter holds for it.
    fn forget(&mut self, seq: SeqId);
}
