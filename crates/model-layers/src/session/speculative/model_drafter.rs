//! `ModelDrafter`: a draft model — a second `CircuitExec` with the same vocabulary (e.g.
//! qwen3-0.6b drafting qwen3-8b) and its own session, KV pages and state — proposing drafts
//! by decoding, greedily or sampling, and following the target's verdicts. It is written on
//! `Session`'s public API alone: catch up with `prefill`, draft with `multi_seq_step` (every
//! sequence of a batch in one step per draft position; decode for one), take back with
//! `rewind` to a `RewindPoint` taken before the draft (recurrent models) or `truncate_to`
//! (KV-only models).
//!
//! Invariant: after `settle`, its sequence holds a prefix of the target's committed tokens,
//! with the KV and recurrent state a sequence fed only that prefix has.

use std::collections::BTreeMap;

use solder_circuit::Mode;
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
        let mut drafts = self.draft_batch(backend, &[(seq, committed, pending, k)])?;
        drafts
            .pop()
            .ok_or(SessionError::Empty("speculative step of no sequences"))
    }

    /// Every sequence caught up on its own, then each draft step of all of them in one
    /// multi-seq step (in chunks of the draft exec's widest; decode for one).
    fn draft_many(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
    ) -> Result<Vec<Draft>, SessionError> {
        self.draft_batch(backend, batch)
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
    /// Drafts every `(seq, committed, pending, k)` of `batch`; a failure takes every sequence
    /// back to its committed tokens.
    fn draft_batch(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
    ) -> Result<Vec<Draft>, SessionError> {
        for (i, &(seq, ..)) in batch.iter().enumerate() {
            if batch[..i].iter().any(|other| other.0 == seq) {
                return Err(SessionError::DuplicateSequence(seq));
            }
        }
        let mut befores = Vec::with_capacity(batch.len());
        for &(seq, committed, ..) in batch {
            match self.catch_up(backend, seq, committed) {
                Ok(before) => befores.push(before),
                Err(e) => return self.take_back_all(backend, &batch[..befores.len()], &befores, e),
            }
        }
        let drafted = match self.decode_drafts(backend, batch) {
            Ok(drafted) => drafted,
            Err(e) => return self.take_back_all(backend, batch, &befores, e),
        };
        let mut drafts = Vec::with_capacity(batch.len());
        for ((&(seq, committed, ..), before), (fed, draft)) in
            batch.iter().zip(befores).zip(drafted)
        {
            let d = self.seq(seq)?;
            d.fed = committed.len();
            d.drafted = fed;
            d.before = before;
            drafts.push(draft);
        }
        Ok(drafts)
    }

    /// Catches the draft sequence of `seq` up on the target's `committed` tokens (a prefill
    /// of what it lacks) and returns its rewind point (models with recurrent state).
    fn catch_up(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
    ) -> Result<Option<RewindPoint>, SessionError> {
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
        if self.session.recurrent() {
            Ok(Some(self.session.rewind_point(backend, id)?))
        } else {
            Ok(None)
        }
    }

    /// The k decode steps of every sequence of `batch` (caught up), all sequences still
    /// drafting in one multi-seq step per draft position; returns, per sequence, the tokens
    /// it fed (`[pending, d1 … d(k−1)]`) and its draft.
    fn decode_drafts(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
    ) -> Result<Vec<(Vec<u32>, Draft)>, SessionError> {
        let vocab = self.vocab_size();
        let shapes = self.session.exec().instance.program_shapes();
        let widest = shapes.widest(Mode::MultiSeq).unwrap_or(1);
        let mut ids = Vec::with_capacity(batch.len());
        for &(seq, ..) in batch {
            ids.push(self.seq(seq)?.id);
        }
        let mut out: Vec<(Vec<u32>, Draft)> = batch
            .iter()
            .map(|&(_, _, _, k)| (Vec::with_capacity(k), Draft::default()))
            .collect();
        let mut next: Vec<u32> = batch.iter().map(|&(_, _, pending, _)| pending).collect();
        let longest = batch.iter().map(|&(.., k)| k).max().unwrap_or(0);
        for position in 0..longest {
            let drafting: Vec<usize> = (0..batch.len())
                .filter(|&i| batch[i].3 > position)
                .collect();
            for chunk in drafting.chunks(widest) {
                let rows: Vec<(SeqId, u32)> = chunk.iter().map(|&i| (ids[i], next[i])).collect();
                let logits = self.session.multi_seq_step(backend, &rows)?;
                for (&i, logits) in chunk.iter().zip(logits) {
                    let sampler = &mut self
                        .seqs
                        .get_mut(&batch[i].0)
                        .ok_or(SessionError::UnknownSequence(batch[i].0))?
                        .sampler;
                    let (token, p) = sampler.sample_with_probs(&logits[..vocab])?;
                    let (fed, draft) = &mut out[i];
                    fed.push(next[i]);
                    draft.tokens.push(token);
                    draft.probs.get_or_insert_with(Vec::new).push(p);
                    next[i] = token;
                }
            }
        }
        for (&(seq, ..), (_, draft)) in batch.iter().zip(&mut out) {
            if self.seqs.get(&seq).is_some_and(|d| d.sampler.is_greedy()) {
                draft.probs = None;
            }
        }
        Ok(out)
    }

    /// Takes every sequence of `batch` back to its committed tokens after a failure (`befores`:
    /// the rewind points of the ones caught up); returns `e`.
    fn take_back_all<T>(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
        befores: &[Option<RewindPoint>],
        e: SessionError,
    ) -> Result<T, SessionError> {
        for (&(seq, committed, ..), before) in batch.iter().zip(befores) {
            if let Err(back) = self.take_back(backend, seq, committed.len(), before, 0) {
                tracing::warn!(error = %back, seq, "the draft model could not take back a draft");
            }
        }
        Err(e)
    }

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
