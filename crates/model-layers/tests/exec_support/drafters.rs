//! Test drafters, written once: `Bent` (a drafter's proposals bent so they agree always,
//! never, or at random), `Oracle` (a drafter's proposals replaced by the target's known
//! greedy continuation) and `Fixed` (fixed tokens, no device work). Used by the session and
//! MTP tests and by `cargo xtask parity` (which includes this file by path); public API only.
#![allow(dead_code)]

use std::collections::BTreeMap;

use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{Draft, Drafter, SeqId, SessionError, Verdict};

/// How `Bent` bends its inner drafter's proposals.
#[derive(Clone, Copy, Debug)]
pub enum Bend {
    /// As the inner drafter drafts (the target drafting for itself: always agrees).
    None,
    /// Every token moved by one: never the target's choice when the model is the target.
    Always,
    /// Each token moved with probability 1/2 (a fixed-seed generator).
    Random(u64),
}

/// A drafter whose proposals are bent as `bend` says (moved by one, modulo the vocabulary).
pub struct Bent<D> {
    pub inner: D,
    pub bend: Bend,
}

impl<D: Drafter> Drafter for Bent<D> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn draft(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
        pending: u32,
        k: usize,
    ) -> Result<Draft, SessionError> {
        let vocab = self.vocab_size() as u32;
        let mut draft = self.inner.draft(backend, seq, committed, pending, k)?;
        for t in &mut draft.tokens {
            let moved = match &mut self.bend {
                Bend::None => false,
                Bend::Always => true,
                Bend::Random(state) => {
                    *state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (*state >> 62) & 1 == 1
                }
            };
            if moved {
                *t = (*t + 1) % vocab;
            }
        }
        Ok(draft)
    }

    fn settle(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        verdict: Verdict,
    ) -> Result<(), SessionError> {
        self.inner.settle(backend, seq, verdict)
    }

    fn forget(&mut self, seq: SeqId) {
        self.inner.forget(seq)
    }
}

/// A drafter whose proposals are replaced by each target sequence's greedy continuation
/// (`futures[seq]`, the tokens after its prompt of `prompt_len`), so every draft is accepted;
/// the inner drafter still drafts (and settles), so its own state is exercised.
pub struct Oracle<D> {
    pub inner: D,
    pub futures: BTreeMap<SeqId, Vec<u32>>,
    pub prompt_len: usize,
}

impl<D: Drafter> Drafter for Oracle<D> {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn draft(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
        pending: u32,
        k: usize,
    ) -> Result<Draft, SessionError> {
        let mut draft = self.inner.draft(backend, seq, committed, pending, k)?;
        // `pending` is future[committed - prompt]; the drafts follow it.
        let at = committed.len() - self.prompt_len + 1;
        draft.tokens = self.futures[&seq][at..at + k].to_vec();
        Ok(draft)
    }

    fn settle(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        verdict: Verdict,
    ) -> Result<(), SessionError> {
        self.inner.settle(backend, seq, verdict)
    }

    fn forget(&mut self, seq: SeqId) {
        self.inner.forget(seq)
    }
}

/// Proposes fixed tokens (cycled to k) over a vocabulary of 128 and touches no device (so an
/// injected failure hits the verify step).
pub struct Fixed(pub Vec<u32>);

impl Drafter for Fixed {
    fn vocab_size(&self) -> usize {
        128
    }

    fn draft(
        &mut self,
        _: &mut dyn GpuBackend,
        _: SeqId,
        _: &[u32],
        _: u32,
        k: usize,
    ) -> Result<Draft, SessionError> {
        Ok(Draft {
            tokens: self.0.iter().copied().cycle().take(k).collect(),
            probs: None,
        })
    }

    fn settle(&mut self, _: &mut dyn GpuBackend, _: SeqId, _: Verdict) -> Result<(), SessionError> {
        Ok(())
    }

    fn forget(&mut self, _: SeqId) {}
}
