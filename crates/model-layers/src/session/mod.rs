//! `Session`: decoding over a `CircuitExec` — live sequences with their block tables and
//! state slots, prefill through verify programs in chunks, decode, multi-sequence steps on the
//! narrowest compiled width, and greedy sampling.
//!
//! Parts: `pages` (the KV page pool; page 0 is the scratch page), `slots` (the recurrent-state
//! slot pool; a slot is zeroed when taken), `backup` (the recurrent state of a step's
//! sequences, saved before it runs and restored if it fails), `step` (one all-or-nothing
//! step: check, save the state, take pages and slots, pick the route, upload the step's
//! `meta::StepMeta`, run its program's graph or launches, read the logits), `window` (sliding
//! windows: after each step, and after a whole prefill, the KV pages wholly outside every
//! layer's window, with a margin for rollback, go back to the pool; their block-table entries
//! become the scratch page), `draft`, `speculative` and `rewind` (speculative steps and the
//! roll-back of rejected tokens).
//!
//! Sharing: the pools belong to the `CircuitExec` (`Pools`, one per exec, behind a lock), not
//! to a session. Several sessions may run on one exec, one step at a time (each step takes
//! the one backend mutably); they share its pages and slots, never the same one, and a
//! session gives back everything its sequences hold when it is dropped.
//!
//! Invariants: per-step values reach a program only through the workspace's metadata region,
//! uploaded before the run; a step — and a whole prefill — that fails validation (token id,
//! position, pages, slots, backend) or fails to run leaves every sequence as it was, its
//! recurrent state included; every page and slot a session's sequences hold is held by no
//! other sequence of any session (the scratch page a block table names in place of a
//! recycled page is no page held: it is never read through that entry, never given back).

mod backup;
pub mod draft;
pub mod mtp;
mod rewind;
pub mod speculative;
mod step;
mod window;

use std::collections::BTreeMap;

use solder_circuit::{Mode, RouteCondition};
use solder_gpu_runtime::GpuBackend;

use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::graphs::StepRun;
use backup::StateBackup;
pub use draft::{Draft, Drafter, ModelDrafter};
pub use mtp::MtpDrafter;
pub use rewind::RewindPoint;
pub use speculative::{Acceptances, SpecPolicy, SpeculativeStep};
use step::{Row, SaveState};

pub type SeqId = u64;

#[derive(Debug, Clone, Default)]
struct Sequence {
    /// Tokens in the cache.
    len: usize,
    /// The tokens in the cache, in order (`len` of them): what a drafter catches up on.
    tokens: Vec<u32>,
    /// The sequence's block table: the pages holding its tokens, in order.
    pages: Vec<u32>,
    /// Recurrent-state slot (models with recurrent layers), taken at the first step.
    slot: Option<u32>,
    /// How speculative steps accept drafts (None: greedy).
    sampler: Option<crate::sampling::Sampler>,
    /// Speculative steps' acceptance history.
    acceptances: speculative::Acceptances,
    /// The cuts its history took: which rewind points still describe it.
    cuts: rewind::Cuts,
}

pub struct Session<'e> {
    exec: &'e CircuitExec,
    /// Unique in the process: what a `RewindPoint` names its session by.
    id: u64,
    seqs: BTreeMap<SeqId, Sequence>,
    next_id: SeqId,
    /// Whether steps may take runtime routes (arms); on by default.
    routes: bool,
    /// The (mode, rows, arm) of the last step's program.
    last_program: Option<(Mode, usize, Option<RouteCondition>)>,
    /// How the last step ran: a graph replayed, captured, or eager launches.
    last_run: Option<StepRun>,
}

impl<'e> Session<'e> {
    /// A session on `exec`, lending pages and slots from the exec's pools (shared with every
    /// other session on it).
    pub fn new(exec: &'e CircuitExec) -> Session<'e> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Session {
            exec,
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            seqs: BTreeMap::new(),
            next_id: 1,
            routes: true,
            last_program: None,
            last_run: None,
        }
    }

    /// Lets steps take runtime routes (the default) or keeps them on primary programs.
    pub fn set_routes(&mut self, on: bool) {
        self.routes = on;
    }

    /// The (mode, rows, arm condition) of the program the last step ran.
    pub fn last_program(&self) -> Option<(Mode, usize, Option<RouteCondition>)> {
        self.last_program
    }

    /// How the last step that reached its run ran (graph replayed, captured, or eager).
    pub fn last_run(&self) -> Option<StepRun> {
        self.last_run
    }

    pub fn add_sequence(&mut self) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.insert(id, Sequence::default());
        id
    }

    /// Ends a sequence and returns its pages and slot to the pools.
    pub fn end_sequence(&mut self, id: SeqId) -> Result<(), SessionError> {
        let mut seq = self
            .seqs
            .remove(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        let mut pools = self.exec.pools();
        pools.pages.shrink(&mut seq.pages, 0);
        if let Some(slot) = seq.slot {
            pools.slots.give_back(slot);
        }
        Ok(())
    }

    /// The tokens a sequence's cache holds, in order.
    pub fn tokens(&self, id: SeqId) -> Result<&[u32], SessionError> {
        self.seqs
            .get(&id)
            .map(|s| s.tokens.as_slice())
            .ok_or(SessionError::UnknownSequence(id))
    }

    pub fn seq_len(&self, id: SeqId) -> Result<usize, SessionError> {
        self.seqs
            .get(&id)
            .map(|s| s.len)
            .ok_or(SessionError::UnknownSequence(id))
    }

    /// Pages free in the exec's pool (shared with every session on the exec).
    pub fn free_page_count(&self) -> usize {
        self.exec.pools().pages.free_count()
    }

    /// Feeds a prompt through verify programs in chunks (the widest compiled width that fits,
    /// then narrower; a last single token through decode); returns the logits of every
    /// prompt position, `[tokens.len() * vocab]`.
    pub fn prefill(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        if tokens.is_empty() {
            return Err(SessionError::Empty("prefill of no tokens"));
        }
        // All-or-nothing: check the whole prompt first, and undo earlier chunks on failure.
        let vocab = self.exec.config.vocab_size;
        if let Some((index, &token)) = tokens
            .iter()
            .enumerate()
            .find(|(_, t)| **t as usize >= vocab)
        {
            return Err(SessionError::TokenOutOfRange {
                token,
                index,
                vocab,
            });
        }
        self.exec.check_usable(backend)?;
        let (start, pages_before, slot_before) = {
            let seq = self
                .seqs
                .get(&id)
                .ok_or(SessionError::UnknownSequence(id))?;
            (seq.len, seq.pages.len(), seq.slot)
        };
        let limit = self.position_limit();
        if start + tokens.len() > limit {
            return Err(SessionError::PositionPastLimit {
                seq: id,
                position: start + tokens.len() - 1,
                limit,
            });
        }
        {
            let pools = self.exec.pools();
            pools
                .pages
                .check(pools.pages.needed(start + tokens.len(), pages_before))?;
        }
        // A slot the sequence holds advances with every chunk: saved once, for all of them.
        let backup = match slot_before {
            Some(slot) => Some(StateBackup::save(self.exec, backend, &[slot])?),
            None => None,
        };
        let shapes = self.exec.instance.program_shapes();
        let mut logits = Vec::with_capacity(tokens.len() * vocab);
        let mut at = 0;
        while at < tokens.len() {
            let left = tokens.len() - at;
            // The widest verify program the rest fills; a last single token runs decode.
            let width = shapes.widest_within(Mode::Verify, left).unwrap_or(1);
            // The prefill saved the slot it had, or the slot is new and goes back on failure.
            let save = SaveState::SavedByCaller;
            match self.verify_saving(backend, id, &tokens[at..at + width], save) {
                Ok(chunk) => logits.extend(chunk),
                Err(e) => {
                    self.truncate(id, start, pages_before);
                    // A slot taken by this prefill goes back (re-zeroed when next taken); a
                    // slot the sequence already had is restored to its state before.
                    if slot_before.is_none() {
                        if let Some(slot) = self.seqs.get_mut(&id).and_then(|s| s.slot.take()) {
                            self.exec.pools().slots.give_back(slot);
                        }
                    }
                    if let Some(backup) = &backup {
                        if let Err(restore) = backup.restore(self.exec, backend) {
                            return Err(SessionError::StateLost {
                                step: Box::new(e),
                                seqs: vec![id],
                                restore,
                            });
                        }
                    }
                    return Err(e);
                }
            }
            at += width;
        }
        self.recycle_out_of_window([id]);
        Ok(logits)
    }

    /// Puts a sequence back to `len` tokens and `pages` pages (the rest return to the pool).
    fn truncate(&mut self, id: SeqId, len: usize, pages: usize) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            if len < seq.len {
                seq.cuts.cut(len);
            }
            seq.len = len;
            seq.tokens.truncate(len);
            self.exec.pools().pages.shrink(&mut seq.pages, pages);
        }
    }

    /// Positions a sequence may reach: the model's limit and the KV shape's.
    fn position_limit(&self) -> usize {
        self.exec
            .config
            .max_position_embeddings
            .min(self.exec.layout.max_seq_len)
    }

    /// K consecutive tokens of one sequence in one verify step (K = 1 runs decode).
    pub fn verify(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        self.verify_saving(backend, id, tokens, SaveState::PerStep)
    }

    /// `verify`, with the recurrent state saved by the step or already by the caller.
    fn verify_saving(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
        save: SaveState,
    ) -> Result<Vec<f32>, SessionError> {
        let start = self.seq_len(id)?;
        let rows: Vec<Row> = tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| Row {
                seq: Some(id),
                token,
                position: start + i,
            })
            .collect();
        let program = match tokens.len() {
            0 => return Err(SessionError::Empty("verify of no tokens")),
            1 => self.exec.decode_program(),
            k => self.exec.verify_program(k),
        }?;
        self.step(backend, program, &rows, &[(id, tokens.len())], save)
    }

    /// One token of one sequence.
    pub fn decode(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        token: u32,
    ) -> Result<Vec<f32>, SessionError> {
        self.verify(backend, id, &[token])
    }

    /// One token for each of several sequences, on the narrowest multi-seq width that holds
    /// them (padding rows run on the scratch page); returns each sequence's logits in order.
    pub fn multi_seq_step(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32)],
    ) -> Result<Vec<Vec<f32>>, SessionError> {
        let n = batch.len();
        if n == 0 {
            return Err(SessionError::Empty("multi-seq step of no sequences"));
        }
        for (i, (id, _)) in batch.iter().enumerate() {
            if batch[..i].iter().any(|(other, _)| other == id) {
                return Err(SessionError::DuplicateSequence(*id));
            }
        }
        let shapes = self.exec.instance.program_shapes();
        let program = if n == 1 {
            self.exec.decode_program()?
        } else {
            let width = shapes
                .narrowest(Mode::MultiSeq, n)
                .ok_or(SessionError::TooWide {
                    asked: n,
                    widest: shapes.widest(Mode::MultiSeq).unwrap_or(1),
                })?;
            self.exec.multi_seq_program(width)?
        };
        let mut rows = Vec::with_capacity(program.rows);
        for &(id, token) in batch {
            rows.push(Row {
                seq: Some(id),
                token,
                position: self.seq_len(id)?,
            });
        }
        rows.resize(program.rows, Row::PADDING);
        let advance: Vec<(SeqId, usize)> = batch.iter().map(|&(id, _)| (id, 1)).collect();
        let logits = self.step(backend, program, &rows, &advance, SaveState::PerStep)?;
        let vocab = self.exec.config.vocab_size;
        Ok(logits.chunks(vocab).take(n).map(<[f32]>::to_vec).collect())
    }

    /// Several sequences' consecutive tokens in one batched-verify step (the narrowest
    /// compiled width that holds them all, padded); returns each sequence's logits,
    /// `[tokens_i * vocab]`, the bytes verifying it alone gives.
    pub fn verify_batch(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32])],
    ) -> Result<Vec<Vec<f32>>, SessionError> {
        if batch.is_empty() || batch.iter().any(|(_, t)| t.is_empty()) {
            return Err(SessionError::Empty("verify_batch of no tokens"));
        }
        for (i, (id, _)) in batch.iter().enumerate() {
            if batch[..i].iter().any(|(other, _)| other == id) {
                return Err(SessionError::DuplicateSequence(*id));
            }
        }
        let total: usize = batch.iter().map(|(_, t)| t.len()).sum();
        let shapes = self.exec.instance.program_shapes();
        let width = shapes
            .narrowest(Mode::VerifyBatch, total)
            .ok_or(SessionError::TooWide {
                asked: total,
                widest: shapes.widest(Mode::VerifyBatch).unwrap_or(0),
            })?;
        let program = self.exec.program(Mode::VerifyBatch, width)?;
        let mut rows = Vec::with_capacity(width);
        for &(id, tokens) in batch {
            let start = self.seq_len(id)?;
            rows.extend(tokens.iter().enumerate().map(|(i, &token)| Row {
                seq: Some(id),
                token,
                position: start + i,
            }));
        }
        rows.resize(width, Row::PADDING);
        let advance: Vec<(SeqId, usize)> = batch.iter().map(|&(id, t)| (id, t.len())).collect();
        let logits = self.step(backend, program, &rows, &advance, SaveState::PerStep)?;
        let vocab = self.exec.config.vocab_size;
        let mut out = Vec::with_capacity(batch.len());
        let mut at = 0;
        for (_, tokens) in batch {
            out.push(logits[at * vocab..(at + tokens.len()) * vocab].to_vec());
            at += tokens.len();
        }
        Ok(out)
    }

    /// The mode a step of `n` sequences runs in.
    pub fn mode_for(n: usize) -> Mode {
        if n == 1 {
            Mode::Decode
        } else {
            Mode::MultiSeq
        }
    }
}

impl Drop for Session<'_> {
    /// Gives every page and slot the session's sequences hold back to the exec's pools.
    fn drop(&mut self) {
        let mut pools = self.exec.pools();
        for seq in self.seqs.values_mut() {
            pools.pages.shrink(&mut seq.pages, 0);
            if let Some(slot) = seq.slot.take() {
                pools.slots.give_back(slot);
            }
        }
    }
}

/// The arg-max token (the lowest index among equal maxima; NaN never wins):
/// `sampling::greedy`, the greedy case of `sampling::Sampler`.
pub fn greedy(logits: &[f32]) -> u32 {
    crate::sampling::greedy(logits)
}
