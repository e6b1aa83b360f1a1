//! Speculative steps: a drafter proposes k tokens, one verify program of k + 1 rows checks
//! them, the longest agreeing prefix plus the target's own next token is kept, and the rest
//! is rolled back — the KV length, pages and token history, and the recurrent state, restored
//! from the snapshot the chained kernels wrote after the last kept row.
//!
//! Acceptance: greedy by default (keep while a draft equals the target's arg-max), or the
//! sequence's `Sampler` (`Session::set_sampling`): speculative sampling's accept/resample
//! rule, so sampled output has exactly the target's distribution. `SpecPolicy` chooses k per
//! step (fixed, or from the sequence's acceptance history).
//!
//! Invariants: a kept token's logits are the bytes a plain decode step feeding it returns (the
//! verify program's rows are byte-identical to decode: parity); after a step, the sequence is
//! exactly as plain decoding of the kept tokens leaves it; a step refused or failed leaves the
//! sequence (and the drafter, told `settle(0)`) as it was.

use solder_gpu_runtime::GpuBackend;

use super::backup::StateBackup;
use super::draft::Drafter;
use super::step::{Row, SaveState};
use super::{SeqId, Session};
use crate::error::SessionError;
use crate::sampling::{Sampler, Sampling};

/// What one speculative step did.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeStep {
    /// The tokens it emits: the accepted drafts, then the target's own next token (the
    /// sequence's next pending token). `accepted + 1` of them.
    pub tokens: Vec<u32>,
    /// Drafts proposed (k) and accepted.
    pub proposed: usize,
    pub accepted: usize,
    /// The target's logits at the kept rows, `[(accepted + 1) * vocab]`: row i is what a plain
    /// decode step feeding the i-th kept token (`pending`, then the accepted drafts) returns.
    pub logits: Vec<f32>,
}

/// How many tokens a speculative step drafts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SpecPolicy {
    /// Always k.
    Fixed(usize),
    /// From the sequence's acceptance history: one more than the recent mean number of
    /// accepted drafts (an exponential average with weight 1/4 on the last step), between
    /// `min` and `max`; `max` until there is history.
    Adaptive { min: usize, max: usize },
}

impl SpecPolicy {
    /// The k of the next step, given the sequence's average accepted drafts (None: no history).
    pub fn k(&self, mean_accepted: Option<f64>) -> usize {
        match *self {
            SpecPolicy::Fixed(k) => k,
            SpecPolicy::Adaptive { min, max } => match mean_accepted {
                None => max,
                Some(mean) => ((mean.round() as usize) + 1).clamp(min, max),
            },
        }
    }
}

/// A sequence's acceptance history.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Acceptances {
    /// Speculative steps taken, drafts proposed and accepted in all.
    pub steps: u64,
    pub proposed: u64,
    pub accepted: u64,
    /// Exponential average of accepted drafts per step (None before the first step).
    pub mean: Option<f64>,
}

impl Acceptances {
    fn record(&mut self, proposed: usize, accepted: usize) {
        self.steps += 1;
        self.proposed += proposed as u64;
        self.accepted += accepted as u64;
        let a = accepted as f64;
        self.mean = Some(self.mean.map_or(a, |m| 0.75 * m + 0.25 * a));
    }
}

impl Session<'_> {
    /// Sets how sequence `id`'s speculative steps accept drafts (greedy by default).
    pub fn set_sampling(&mut self, id: SeqId, sampling: Sampling) -> Result<(), SessionError> {
        let sampler = Sampler::new(sampling)?;
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        seq.sampler = Some(sampler);
        Ok(())
    }

    /// The acceptance history of sequence `id`.
    pub fn acceptances(&self, id: SeqId) -> Result<Acceptances, SessionError> {
        self.seqs
            .get(&id)
            .map(|s| s.acceptances)
            .ok_or(SessionError::UnknownSequence(id))
    }

    /// `speculative_step` with k from `policy` and the sequence's history.
    pub fn speculate(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        pending: u32,
        drafter: &mut dyn Drafter,
        policy: SpecPolicy,
    ) -> Result<SpeculativeStep, SessionError> {
        let k = policy.k(self.acceptances(id)?.mean);
        self.speculative_step(backend, id, pending, k, drafter)
    }

    /// One speculative step of sequence `id`: `drafter` proposes `k` tokens to follow
    /// `pending` (the token the sequence feeds next), the verify program of k + 1 rows feeds
    /// `[pending, drafts…]`, and the sequence keeps `pending` plus the accepted drafts. The
    /// returned `tokens` end with the target's own next token: the next step's `pending`.
    pub fn speculative_step(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        pending: u32,
        k: usize,
        drafter: &mut dyn Drafter,
    ) -> Result<SpeculativeStep, SessionError> {
        self.exec.check_backend(backend)?;
        let vocab = self.exec.config.vocab_size;
        let shapes = self.exec.instance.program_shapes();
        let widest = shapes.widest(solder_circuit::Mode::Verify).unwrap_or(1);
        if k == 0 || k + 1 > widest {
            return Err(SessionError::DraftLength {
                k,
                widest: widest.saturating_sub(1),
            });
        }
        if drafter.vocab_size() != vocab {
            return Err(SessionError::DraftVocab {
                draft: drafter.vocab_size(),
                target: vocab,
            });
        }
        if pending as usize >= vocab {
            return Err(SessionError::TokenOutOfRange {
                token: pending,
                index: 0,
                vocab,
            });
        }
        let (start, committed) = {
            let seq = self
                .seqs
                .get(&id)
                .ok_or(SessionError::UnknownSequence(id))?;
            (seq.len, seq.tokens.clone())
        };
        let limit = self.position_limit();
        if start + k + 1 > limit {
            return Err(SessionError::PositionPastLimit {
                seq: id,
                position: start + k,
                limit,
            });
        }
        {
            let pools = self.exec.pools();
            let held = self.seqs.get(&id).map_or(0, |s| s.pages.len());
            pools.pages.check(pools.pages.needed(start + k + 1, held))?;
        }
        let draft = drafter.draft(backend, id, &committed, pending, k)?;
        match self.verify_draft(backend, id, pending, start, &draft) {
            Ok(step) => {
                drafter.settle(backend, id, step.accepted + 1)?;
                Ok(step)
            }
            Err(e) => {
                if let Err(settle) = drafter.settle(backend, id, 0) {
                    tracing::warn!(error = %settle, seq = id, "the drafter could not take back a failed step's draft");
                }
                Err(e)
            }
        }
    }

    /// Verifies `draft` after `pending` and keeps the accepted prefix.
    fn verify_draft(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        pending: u32,
        start: usize,
        draft: &super::draft::Draft,
    ) -> Result<SpeculativeStep, SessionError> {
        let k = draft.tokens.len();
        let vocab = self.exec.config.vocab_size;
        if let Some((index, &token)) = draft
            .tokens
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= vocab)
        {
            return Err(SessionError::TokenOutOfRange {
                token,
                index: index + 1,
                vocab,
            });
        }
        let fed: Vec<u32> = std::iter::once(pending)
            .chain(draft.tokens.iter().copied())
            .collect();
        let rows: Vec<Row> = fed
            .iter()
            .enumerate()
            .map(|(i, &token)| Row {
                seq: Some(id),
                token,
                position: start + i,
            })
            .collect();
        let program = self.exec.verify_program(k + 1)?;
        // Saved here, not by the step: an acceptance that fails after the step ran puts the
        // state back too.
        let slot = self.seqs.get(&id).and_then(|s| s.slot);
        let backup = match slot {
            Some(slot) => Some(StateBackup::save(self.exec, backend, &[slot])?),
            None => None,
        };
        let logits = match self.step(
            backend,
            program,
            &rows,
            &[(id, k + 1)],
            SaveState::SavedByCaller,
        ) {
            Ok(logits) => logits,
            Err(e) => return Err(self.restore_state(backend, id, backup.as_ref(), e)),
        };
        let target: Vec<&[f32]> = logits.chunks(vocab).collect();
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        let sampler = seq.sampler.get_or_insert_with(Sampler::greedy);
        let acceptance = match &draft.probs {
            Some(probs) if !sampler.is_greedy() => sampler.verify(&target, probs, &draft.tokens),
            _ => crate::sampling::accept_greedy(&target, &draft.tokens),
        };
        let acceptance = match acceptance {
            Ok(a) => a,
            Err(e) => {
                // Nothing of the step stays: back to before `pending`, state included.
                let block = self.exec.layout.kv_block_size;
                self.truncate(id, start, start.div_ceil(block));
                if backup.is_none() {
                    self.zero_state(backend, id)?;
                }
                return Err(self.restore_state(backend, id, backup.as_ref(), e.into()));
            }
        };
        let n = acceptance.accepted;
        self.keep_verify_rows(backend, id, k + 1, n)?;
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.acceptances.record(k, n);
        }
        let mut tokens = draft.tokens[..n].to_vec();
        tokens.push(acceptance.next_token);
        Ok(SpeculativeStep {
            tokens,
            proposed: k,
            accepted: n,
            logits: logits[..(n + 1) * vocab].to_vec(),
        })
    }

    /// Puts back the state `backup` saved (if any) and returns `error`, or the error saying
    /// the state is lost.
    fn restore_state(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        backup: Option<&StateBackup>,
        error: SessionError,
    ) -> SessionError {
        match backup.map(|b| b.restore(self.exec, backend)) {
            Some(Err(restore)) => SessionError::StateLost {
                step: Box::new(error),
                seqs: vec![id],
                restore,
            },
            _ => error,
        }
    }

    /// Zeroes the recurrent state of the slot `id` holds (a fresh sequence's state).
    fn zero_state(&mut self, backend: &mut dyn GpuBackend, id: SeqId) -> Result<(), SessionError> {
        let Some(slot) = self.seqs.get(&id).and_then(|s| s.slot) else {
            return Ok(());
        };
        let states = self.exec.kv_cache();
        for region in self.exec.layout.states.iter().filter(|r| r.slot_bytes > 0) {
            let at = states.offset(region.offset + slot as usize * region.slot_bytes);
            backend.memset(at, 0, region.slot_bytes)?;
        }
        Ok(())
    }
}
