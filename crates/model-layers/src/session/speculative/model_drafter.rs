//! `ModelDrafter`: a draft model — a second `CircuitExec` with the same vocabulary (e.g.
//! qwen3-0.6b drafting qwen3-8b) and its own session, KV pages and state — proposing drafts
//! by decoding, greedily or sampling, and following the target's verdicts. It is written on
//! `Session`'s public API alone: catch up with `prefill`, draft with `decode`, take back with
//! `rewind` to a `RewindPoint` taken before the draft (recurrent models) or `truncate_to`
//! (KV-only models).
//!
//! Invariant: after `settle`, its sequence holds a prefix of the target's committed tokens,
//! with the KV and recurrent state a sequence fed only that prefix has.

use std::collections::BTreeMap;

use solder_gpu_runtime::GpuBackend;

use super::{Draft, Drafter, Verdict};
use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::sampling::{Sampler, Sampling};
use crate::session::{RewindPoint, SeqId, Session};

/// One target sequence's state in the draft model.
#[derive(Debug)]
struct DraftSeq {
    /// The drafter's own sequence.
    id: SeqId,
    /// Committed target tokens the draft model's cache holds (a prefix of the target's).
    fed: usize,
    /// The tokens the last `draft` fed past `fed` (pending and all drafts but the last), and
    /// the rewind point before them (models with recurrent state only).
    drafted: Vec<u32>,
    before: Option<RewindPoint>,
    sampler: Sampler,
}

/// A draft model: a second `CircuitExec` (same vocabulary) decoding greedily, or sampling
/// under `Sampling`, with its own session.
pub struct ModelDrafter<'d> {
    session: Session<'d>,
    seqs: BTreeMap<SeqId, DraftSeq>,
    sampling: Sampling,
}

impl<'d> ModelDrafter<'d> {
    /// A greedy drafter on `exec`.
    pub fn new(exec: &'d CircuitExec) -> ModelDrafter<'d> {
        ModelDrafter {
            session: Session::new(exec),
            seqs: BTreeMap::new(),
            sampling: Sampling::Greedy,
        }
    }

    /// A drafter sampling under `sampling` (each sequence's generator seeded from it).
    pub fn sampled(
        exec: &'d CircuitExec,
        sampling: Sampling,
    ) -> Result<ModelDrafter<'d>, SessionError> {
        Sampler::new(sampling)?;
        Ok(ModelDrafter {
            sampling,
            ..ModelDrafter::new(exec)
        })
    }

    /// Tokens the drafter's own sequence for target `seq` holds.
    pub fn cached_len(&self, seq: SeqId) -> Option<usize> {
        self.seqs
            .get(&seq)
            .and_then(|d| self.session.seq_len(d.id).ok())
    }

    /// The drafter's own session (its sequences follow the target's).
    pub fn session(&self) -> &Session<'d> {
        &self.session
    }

    fn seq(&mut self, seq: SeqId) -> Result<&mut DraftSeq, SessionError> {
        if !self.seqs.contains_key(&seq) {
            let id = self.session.add_sequence();
            let sampler = Sampler::new(self.sampling)?;
            self.seqs.insert(
                seq,
                DraftSeq {
                    id,
                    fed: 0,
                    drafted: Vec::new(),
                    before: None,
                    sampler,
                },
            );
        }
        self.seqs
            .get_mut(&seq)
            .ok_or(SessionError::UnknownSequence(seq))
    }
}

impl Drafter for ModelDrafter<'_> {
    fn vocab_size(&self) -> usize {
        self.session.exec().config.vocab_size
    }

    fn draft(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
        pending: u32,
        k: usize,
    ) -> Result<Draft, SessionError> {
        let recurrent = self.session.recurrent();
        let (id, fed) = {
            let d = self.seq(seq)?;
            (d.id, d.fed)
        };
        // The draft holds a prefix of the target's tokens: checked at its last token (not the
        // whole history, which would cost O(length) every step).
        let ours = self.session.tokens(id)?;
        if fed > committed.len() || (fed > 0 && ours[fed - 1] != committed[fed - 1]) {
            return Err(SessionError::Rewind(format!(
                "draft sequence for {seq} holds tokens the target no longer has: end and restart it"
            )));
        }
        // Catch up on what the target committed since (a prefill, plain steps, kept drafts).
        if fed < committed.len() {
            self.session.prefill(backend, id, &committed[fed..])?;
        }
        let before = if recurrent {
            Some(self.session.rewind_point(backend, id)?)
        } else {
            None
        };
        let mut tokens = Vec::with_capacity(k);
        let mut probs = Vec::with_capacity(k);
        let mut drafted = Vec::with_capacity(k);
        let mut next = pending;
        let vocab = self.vocab_size();
        for _ in 0..k {
            let logits = match self.session.decode(backend, id, next) {
                Ok(logits) => logits,
                Err(e) => {
                    // Nothing of this draft stays: back to the committed tokens.
                    self.take_back(backend, seq, committed.len(), &before, 0)?;
                    return Err(e);
                }
            };
            drafted.push(next);
            let d = self
                .seqs
                .get_mut(&seq)
                .ok_or(SessionError::UnknownSequence(seq))?;
            let (token, p) = d.sampler.sample_with_probs(&logits[..vocab])?;
            tokens.push(token);
            probs.push(p);
            next = token;
        }
        let d = self.seq(seq)?;
        d.fed = committed.len();
        d.drafted = drafted;
        d.before = before;
        let greedy = d.sampler.is_greedy();
        Ok(Draft {
            tokens,
            probs: (!greedy).then_some(probs),
        })
    }

    fn settle(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        verdict: Verdict,
    ) -> Result<(), SessionError> {
        let d = self.seq(seq)?;
        let (fed, before) = (d.fed, d.before.take());
        let drafted = std::mem::take(&mut d.drafted);
        // The draft fed `[pending, d1 … d(k−1)]`; the target kept `kept` of `[pending, d1 … dk]`.
        let keep = verdict.kept.min(drafted.len());
        self.take_back(backend, seq, fed, &before, keep)?;
        Ok(())
    }

    fn forget(&mut self, seq: SeqId) {
        if let Some(d) = self.seqs.remove(&seq) {
            let _ = self.session.end_sequence(d.id);
        }
    }
}

impl ModelDrafter<'_> {
    /// Leaves the draft model's sequence of `seq` holding its `fed` committed tokens plus the first
    /// `keep` tokens it drafted past them: truncated (KV only) or rewound to the point before
    /// the draft, the kept tokens to be fed again at the next catch-up.
    fn take_back(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        fed: usize,
        before: &Option<RewindPoint>,
        keep: usize,
    ) -> Result<(), SessionError> {
        let id = self.seq(seq)?.id;
        match before {
            Some(point) => {
                self.session.rewind(backend, point)?;
                self.seq(seq)?.fed = point.len();
            }
            None => {
                self.session.truncate_to(id, fed + keep)?;
                self.seq(seq)?.fed = fed + keep;
            }
        }
        Ok(())
    }
}
