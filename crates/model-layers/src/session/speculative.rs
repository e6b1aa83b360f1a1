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

use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use super::backup::StateBackup;
use super::draft::{Draft, Drafter};
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
    /// Never panics: an `Adaptive` policy with `min > max` gives `max` (`check` refuses it).
    pub fn k(&self, mean_accepted: Option<f64>) -> usize {
        match *self {
            SpecPolicy::Fixed(k) => k,
            SpecPolicy::Adaptive { min, max } => match mean_accepted {
                None => max,
                // `as` saturates (NaN gives 0); the clamp is written so it cannot panic.
                Some(mean) => (mean.round() as usize).saturating_add(1).max(min).min(max),
            },
        }
    }

    /// Refuses a policy no step could follow, by field: k 0, `min` 0 or above `max`, or a k
    /// past `widest_k` (the most drafts the widest verify program holds).
    pub fn check(&self, widest_k: usize) -> Result<(), SessionError> {
        let refuse =
            |field: &'static str, message: String| Err(SessionError::Argument { field, message });
        match *self {
            SpecPolicy::Fixed(k) if k == 0 || k > widest_k => refuse(
                "SpecPolicy::Fixed",
                format!(
                    "k = {k}: it must be 1..={widest_k} (k + 1 rows fit the widest verify program)"
                ),
            ),
            SpecPolicy::Adaptive { min: 0, .. } => refuse(
                "SpecPolicy::Adaptive::min",
                "0: a speculative step drafts at least one token".into(),
            ),
            SpecPolicy::Adaptive { min, max } if min > max => refuse(
                "SpecPolicy::Adaptive::min",
                format!("{min} is above max {max}"),
            ),
            SpecPolicy::Adaptive { max, .. } if max > widest_k => refuse(
                "SpecPolicy::Adaptive::max",
                format!("{max}: at most {widest_k} (k + 1 rows fit the widest verify program)"),
            ),
            _ => Ok(()),
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
        let widest = self.exec.instance.program_shapes().widest(Mode::Verify);
        policy.check(widest.unwrap_or(1).saturating_sub(1))?;
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
        let mut steps = self.speculate_rows(backend, &[(id, pending, k)], drafter, false)?;
        steps
            .pop()
            .ok_or(SessionError::Empty("speculative step of no sequences"))
    }

    /// One speculative step of several sequences, each `(sequence, pending, k)` with its own
    /// k, verified together in one batched-verify program (the narrowest width that holds
    /// Σ (k + 1) rows, padded); each sequence ends exactly as `speculative_step` would leave
    /// it. All or nothing: a refusal or failure leaves every sequence as it was.
    pub fn speculative_step_many(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32, usize)],
        drafter: &mut dyn Drafter,
    ) -> Result<Vec<SpeculativeStep>, SessionError> {
        self.speculate_rows(backend, batch, drafter, true)
    }

    /// Checks, drafts, verifies (one verify program for one sequence unless `batched`, else
    /// one batched-verify program) and keeps the accepted prefixes.
    fn speculate_rows(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32, usize)],
        drafter: &mut dyn Drafter,
        batched: bool,
    ) -> Result<Vec<SpeculativeStep>, SessionError> {
        self.exec.check_usable(backend)?;
        if batch.is_empty() {
            return Err(SessionError::Empty("speculative step of no sequences"));
        }
        let vocab = self.exec.config.vocab_size;
        let shapes = self.exec.instance.program_shapes();
        let widest = shapes.widest(Mode::Verify).unwrap_or(1);
        if drafter.vocab_size() != vocab {
            return Err(SessionError::DraftVocab {
                draft: drafter.vocab_size(),
                target: vocab,
            });
        }
        let limit = self.position_limit();
        let mut pages_needed = 0;
        let mut starts = Vec::with_capacity(batch.len());
        for (i, &(id, pending, k)) in batch.iter().enumerate() {
            if batch[..i].iter().any(|(other, _, _)| *other == id) {
                return Err(SessionError::DuplicateSequence(id));
            }
            // `k >= widest`, not `k + 1 > widest`: k = usize::MAX must not wrap.
            if k == 0 || k >= widest {
                return Err(SessionError::DraftLength {
                    k,
                    widest: widest.saturating_sub(1),
                });
            }
            if pending as usize >= vocab {
                return Err(SessionError::TokenOutOfRange {
                    token: pending,
                    index: 0,
                    vocab,
                });
            }
            let seq = self
                .seqs
                .get(&id)
                .ok_or(SessionError::UnknownSequence(id))?;
            if seq.len + k + 1 > limit {
                return Err(SessionError::PositionPastLimit {
                    seq: id,
                    position: seq.len + k,
                    limit,
                });
            }
            pages_needed += self
                .exec
                .pools()
                .pages
                .needed(seq.len + k + 1, seq.pages.len());
            starts.push(seq.len);
        }
        self.exec.pools().pages.check(pages_needed)?;
        let total: usize = batch.iter().map(|&(_, _, k)| k + 1).sum();
        let width = if batched {
            shapes
                .narrowest(Mode::VerifyBatch, total)
                .ok_or(SessionError::TooWide {
                    asked: total,
                    widest: shapes.widest(Mode::VerifyBatch).unwrap_or(0),
                })?
        } else {
            total
        };

        // Drafts, all before the verify; a failure takes back the ones made.
        let mut drafts = Vec::with_capacity(batch.len());
        for &(id, pending, k) in batch {
            match drafter.draft(backend, id, self.tokens(id)?, pending, k) {
                Ok(draft) if draft.tokens.len() == k => drafts.push(draft),
                outcome => {
                    self.settle_all(backend, drafter, &batch[..drafts.len()], None);
                    return Err(match outcome {
                        Err(e) => e,
                        Ok(draft) => SessionError::Rewind(format!(
                            "the drafter proposed {} tokens for sequence {id}, asked for {k}",
                            draft.tokens.len()
                        )),
                    });
                }
            }
        }
        match self.verify_drafts(backend, batch, &starts, &drafts, width, batched) {
            Ok(steps) => {
                let kept: Vec<usize> = steps.iter().map(|s| s.accepted + 1).collect();
                self.settle_all(backend, drafter, batch, Some(&kept));
                Ok(steps)
            }
            Err(e) => {
                self.settle_all(backend, drafter, batch, None);
                Err(e)
            }
        }
    }

    /// Tells the drafter what each sequence kept (None: nothing, the step failed).
    fn settle_all(
        &mut self,
        backend: &mut dyn GpuBackend,
        drafter: &mut dyn Drafter,
        batch: &[(SeqId, u32, usize)],
        kept: Option<&[usize]>,
    ) {
        for (i, &(id, _, _)) in batch.iter().enumerate() {
            let kept = kept.map_or(0, |k| k[i]);
            if let Err(e) = drafter.settle(backend, id, kept) {
                tracing::warn!(error = %e, seq = id, kept, "the drafter could not settle a speculative step");
            }
        }
    }

    /// Verifies every sequence's `[pending, drafts…]` in one program of `width` rows and keeps
    /// each accepted prefix.
    fn verify_drafts(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32, usize)],
        starts: &[usize],
        drafts: &[Draft],
        width: usize,
        batched: bool,
    ) -> Result<Vec<SpeculativeStep>, SessionError> {
        let vocab = self.exec.config.vocab_size;
        let mut rows = Vec::with_capacity(width);
        for ((&(id, pending, _), &start), draft) in batch.iter().zip(starts).zip(drafts) {
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
            let fed = std::iter::once(pending).chain(draft.tokens.iter().copied());
            rows.extend(fed.enumerate().map(|(i, token)| Row {
                seq: Some(id),
                token,
                position: start + i,
            }));
        }
        rows.resize(width, Row::PADDING);
        let program = if batched {
            self.exec.program(Mode::VerifyBatch, width)?
        } else {
            self.exec.verify_program(width)?
        };
        // Saved here, not by the step: an acceptance that fails after the step ran puts the
        // state back too.
        let held: Vec<(SeqId, u32)> = batch
            .iter()
            .filter_map(|&(id, _, _)| self.seqs.get(&id).and_then(|s| s.slot).map(|s| (id, s)))
            .collect();
        let slots: Vec<u32> = held.iter().map(|&(_, s)| s).collect();
        let backup = if slots.is_empty() {
            None
        } else {
            Some(StateBackup::save(self.exec, backend, &slots)?)
        };
        let advance: Vec<(SeqId, usize)> = batch.iter().map(|&(id, _, k)| (id, k + 1)).collect();
        let ids: Vec<SeqId> = batch.iter().map(|&(id, _, _)| id).collect();
        let logits = match self.step(backend, program, &rows, &advance, SaveState::SavedByCaller) {
            Ok(logits) => logits,
            Err(e) => return Err(self.restore_state(backend, &ids, backup.as_ref(), e)),
        };
        // Acceptance for every sequence first, so a refusal keeps nothing of the step.
        let mut acceptances = Vec::with_capacity(batch.len());
        let mut at = 0;
        for (&(id, _, k), draft) in batch.iter().zip(drafts) {
            let target: Vec<&[f32]> = logits[at * vocab..(at + k + 1) * vocab]
                .chunks(vocab)
                .collect();
            at += k + 1;
            let seq = self
                .seqs
                .get_mut(&id)
                .ok_or(SessionError::UnknownSequence(id))?;
            let sampler = seq.sampler.get_or_insert_with(Sampler::greedy);
            let acceptance = match &draft.probs {
                Some(probs) if !sampler.is_greedy() => {
                    sampler.verify(&target, probs, &draft.tokens)
                }
                _ => crate::sampling::accept_greedy(&target, &draft.tokens),
            };
            match acceptance {
                Ok(a) => acceptances.push(a),
                Err(e) => {
                    // Nothing of the step stays: back to before `pending`, state included.
                    let block = self.exec.layout.kv_block_size;
                    for (&(id, _, _), &start) in batch.iter().zip(starts) {
                        self.truncate(id, start, start.div_ceil(block));
                        if !held.iter().any(|&(h, _)| h == id) {
                            self.zero_state(backend, id)?;
                        }
                    }
                    return Err(self.restore_state(backend, &ids, backup.as_ref(), e.into()));
                }
            }
        }
        let mut steps = Vec::with_capacity(batch.len());
        let mut first = 0;
        for ((&(id, _, k), draft), acceptance) in batch.iter().zip(drafts).zip(acceptances) {
            let n = acceptance.accepted;
            self.keep_verify_rows(backend, id, first, k + 1, n)?;
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.acceptances.record(k, n);
            }
            let mut tokens = draft.tokens[..n].to_vec();
            tokens.push(acceptance.next_token);
            steps.push(SpeculativeStep {
                tokens,
                proposed: k,
                accepted: n,
                logits: logits[first * vocab..(first + n + 1) * vocab].to_vec(),
            });
            first += k + 1;
        }
        // The step itself (its state saved by this caller) left recycling to here.
        self.recycle_out_of_window(ids.iter().copied());
        Ok(steps)
    }

    /// Puts back the state `backup` saved (if any) and returns `error`, or the error saying
    /// the state is lost.
    fn restore_state(
        &mut self,
        backend: &mut dyn GpuBackend,
        ids: &[SeqId],
        backup: Option<&StateBackup>,
        error: SessionError,
    ) -> SessionError {
        match backup.map(|b| b.restore(self.exec, backend)) {
            Some(Err(restore)) => SessionError::StateLost {
                step: Box::new(error),
                seqs: ids.to_vec(),
                restore,
            },
            _ => error,
        }
    }
}
