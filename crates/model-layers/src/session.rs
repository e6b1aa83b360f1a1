//! `Session`: decoding over a `CircuitExec` — a paged KV cache with block tables per
//! sequence, prefill through verify programs in chunks, decode, multi-sequence steps with
//! padding rows on a scratch page, and greedy sampling.
//!
//! Invariants: per-step values reach a program only through the workspace's metadata region,
//! uploaded before the run; page 0 is the scratch page padding rows write to and no sequence
//! owns it; a step that fails validation (token id, position, pages) or fails to run leaves
//! every sequence's state as it was.

use std::collections::BTreeMap;

use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::meta::{MetaRow, StepMeta, SCRATCH_PAGE, SCRATCH_SLOT};
use crate::program::Program;

pub type SeqId = u64;

#[derive(Debug, Clone, Default)]
struct Sequence {
    /// Tokens in the cache.
    len: usize,
    pages: Vec<u32>,
    /// Recurrent-state slot (models with recurrent layers), taken at the first step.
    slot: Option<u32>,
}

/// One row of a step: which sequence (None for padding) and its token.
#[derive(Debug, Clone, Copy)]
struct Row {
    seq: Option<SeqId>,
    token: u32,
    position: usize,
}

pub struct Session<'e> {
    exec: &'e CircuitExec,
    free_pages: Vec<u32>,
    /// Free recurrent-state slots (slot 0 is the scratch slot of padding rows).
    free_slots: Vec<u32>,
    seqs: BTreeMap<SeqId, Sequence>,
    next_id: SeqId,
    /// Whether steps may take runtime routes (arms); on by default.
    routes: bool,
    /// The (mode, rows, arm) of the last step's program.
    last_program: Option<(Mode, usize, Option<solder_circuit::RouteCondition>)>,
}

impl<'e> Session<'e> {
    pub fn new(exec: &'e CircuitExec) -> Session<'e> {
        // Pop from the end: low pages first.
        let free_pages = (1..exec.layout.kv_pages as u32).rev().collect();
        let free_slots = if recurrent(exec) {
            (1..exec.layout.state_slots as u32).rev().collect()
        } else {
            Vec::new()
        };
        Session {
            exec,
            free_pages,
            free_slots,
            seqs: BTreeMap::new(),
            next_id: 1,
            routes: true,
            last_program: None,
        }
    }

    /// Lets steps take runtime routes (the default) or keeps them on primary programs.
    pub fn set_routes(&mut self, on: bool) {
        self.routes = on;
    }

    /// The (mode, rows, arm condition) of the program the last step ran.
    pub fn last_program(&self) -> Option<(Mode, usize, Option<solder_circuit::RouteCondition>)> {
        self.last_program
    }

    pub fn add_sequence(&mut self) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.insert(id, Sequence::default());
        id
    }

    /// Ends a sequence and returns its pages to the pool.
    pub fn end_sequence(&mut self, id: SeqId) -> Result<(), SessionError> {
        let seq = self
            .seqs
            .remove(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        self.free_pages.extend(seq.pages.into_iter().rev());
        self.free_slots.extend(seq.slot);
        Ok(())
    }

    pub fn seq_len(&self, id: SeqId) -> Result<usize, SessionError> {
        self.seqs
            .get(&id)
            .map(|s| s.len)
            .ok_or(SessionError::UnknownSequence(id))
    }

    pub fn free_page_count(&self) -> usize {
        self.free_pages.len()
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
        let (start, pages_before, had_slot) = {
            let seq = self
                .seqs
                .get(&id)
                .ok_or(SessionError::UnknownSequence(id))?;
            (seq.len, seq.pages.len(), seq.slot.is_some())
        };
        let limit = self.position_limit();
        if start + tokens.len() > limit {
            return Err(SessionError::PositionPastLimit {
                seq: id,
                position: start + tokens.len() - 1,
                limit,
            });
        }
        let needed = (start + tokens.len())
            .div_ceil(self.exec.layout.kv_block_size)
            .saturating_sub(pages_before);
        if needed > self.free_pages.len() {
            return Err(SessionError::PagesExhausted {
                needed,
                free: self.free_pages.len(),
            });
        }
        let shapes = self.exec.instance.program_shapes();
        let mut logits = Vec::with_capacity(tokens.len() * vocab);
        let mut at = 0;
        while at < tokens.len() {
            let left = tokens.len() - at;
            // The widest verify program the rest fills; a last single token runs decode.
            let width = shapes.widest_within(Mode::Verify, left).unwrap_or(1);
            match self.verify(backend, id, &tokens[at..at + width]) {
                Ok(chunk) => logits.extend(chunk),
                Err(e) => {
                    self.truncate(id, start, pages_before);
                    // A slot taken by this prefill goes back (re-zeroed when next taken); a
                    // slot the sequence already had may have advanced with earlier chunks.
                    if !had_slot {
                        if let Some(slot) = self.seqs.get_mut(&id).and_then(|s| s.slot.take()) {
                            self.free_slots.push(slot);
                        }
                    }
                    return Err(e);
                }
            }
            at += width;
        }
        Ok(logits)
    }

    /// Puts a sequence back to `len` tokens and `pages` pages (the rest return to the pool).
    fn truncate(&mut self, id: SeqId, len: usize, pages: usize) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.len = len;
            while seq.pages.len() > pages {
                if let Some(page) = seq.pages.pop() {
                    self.free_pages.push(page);
                }
            }
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
        self.step(backend, program, &rows, &[(id, tokens.len())])
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
        rows.resize(
            program.rows,
            Row {
                seq: None,
                token: 0,
                position: 0,
            },
        );
        let advance: Vec<(SeqId, usize)> = batch.iter().map(|&(id, _)| (id, 1)).collect();
        let logits = self.step(backend, program, &rows, &advance)?;
        let vocab = self.exec.config.vocab_size;
        Ok(logits.chunks(vocab).take(n).map(<[f32]>::to_vec).collect())
    }

    /// Validates, takes pages, uploads the metadata, runs, reads the logits of the live rows;
    /// on any failure gives the pages back and leaves lengths as they were.
    fn step(
        &mut self,
        backend: &mut dyn GpuBackend,
        program: &Program,
        rows: &[Row],
        advance: &[(SeqId, usize)],
    ) -> Result<Vec<f32>, SessionError> {
        let vocab = self.exec.config.vocab_size;
        let bs = self.exec.layout.kv_block_size;
        let limit = self.position_limit();
        for (index, row) in rows.iter().enumerate().filter(|(_, r)| r.seq.is_some()) {
            if row.token as usize >= vocab {
                return Err(SessionError::TokenOutOfRange {
                    token: row.token,
                    index,
                    vocab,
                });
            }
        }
        let mut needed = 0;
        for &(id, count) in advance {
            let seq = self
                .seqs
                .get(&id)
                .ok_or(SessionError::UnknownSequence(id))?;
            let new_len = seq.len + count;
            if new_len > limit {
                return Err(SessionError::PositionPastLimit {
                    seq: id,
                    position: new_len - 1,
                    limit,
                });
            }
            needed += new_len.div_ceil(bs).saturating_sub(seq.pages.len());
        }
        if needed > self.free_pages.len() {
            return Err(SessionError::PagesExhausted {
                needed,
                free: self.free_pages.len(),
            });
        }
        let new_slots: Vec<SeqId> = if recurrent(self.exec) {
            advance
                .iter()
                .map(|(id, _)| *id)
                .filter(|id| self.seqs.get(id).is_some_and(|s| s.slot.is_none()))
                .collect()
        } else {
            Vec::new()
        };
        if new_slots.len() > self.free_slots.len() {
            return Err(SessionError::SlotsExhausted {
                needed: new_slots.len(),
                free: self.free_slots.len(),
            });
        }
        for id in &new_slots {
            let slot = self.free_slots.pop().unwrap_or(0);
            if let Err(e) = self.zero_slot(backend, slot) {
                self.free_slots.push(slot);
                return Err(e);
            }
            if let Some(seq) = self.seqs.get_mut(id) {
                seq.slot = Some(slot);
            }
        }
        let mut taken: Vec<(SeqId, usize)> = Vec::new();
        for &(id, count) in advance {
            let seq = self
                .seqs
                .get_mut(&id)
                .ok_or(SessionError::UnknownSequence(id))?;
            let want = (seq.len + count).div_ceil(bs);
            let before = seq.pages.len();
            while seq.pages.len() < want {
                seq.pages
                    .push(self.free_pages.pop().unwrap_or(SCRATCH_PAGE));
            }
            taken.push((id, seq.pages.len() - before));
        }
        // A runtime route: the arm whose condition this step's state meets, else the primary.
        let program = if self.routes && program.mode == Mode::MultiSeq {
            let slots: Vec<u32> = rows
                .iter()
                .map(|r| {
                    r.seq
                        .and_then(|id| self.seqs.get(&id))
                        .and_then(|s| s.slot)
                        .unwrap_or(0)
                })
                .collect();
            self.exec
                .multi_seq_step(program.rows, &slots)
                .unwrap_or(program)
        } else {
            program
        };
        self.last_program = Some((program.mode, program.rows, program.arm));
        let result = self.upload_and_run(backend, program, rows);
        match result {
            Ok(logits) => {
                for &(id, count) in advance {
                    if let Some(seq) = self.seqs.get_mut(&id) {
                        seq.len += count;
                    }
                }
                let live = rows.iter().filter(|r| r.seq.is_some()).count();
                Ok(logits[..live.min(rows.len()) * vocab].to_vec())
            }
            Err(e) => {
                for id in new_slots {
                    if let Some(slot) = self.seqs.get_mut(&id).and_then(|s| s.slot.take()) {
                        self.free_slots.push(slot);
                    }
                }
                for (id, count) in taken {
                    if let Some(seq) = self.seqs.get_mut(&id) {
                        for _ in 0..count {
                            if let Some(page) = seq.pages.pop() {
                                self.free_pages.push(page);
                            }
                        }
                    }
                }
                Err(e)
            }
        }
    }

    fn upload_and_run(
        &self,
        backend: &mut dyn GpuBackend,
        program: &Program,
        rows: &[Row],
    ) -> Result<Vec<f32>, SessionError> {
        let meta_rows = rows
            .iter()
            .map(|row| match row.seq {
                None => Ok(MetaRow::Padding),
                Some(id) => {
                    let seq = self
                        .seqs
                        .get(&id)
                        .ok_or(SessionError::UnknownSequence(id))?;
                    Ok(MetaRow::Live {
                        token: row.token,
                        position: row.position,
                        pages: &seq.pages,
                        state_slot: seq.slot.unwrap_or(SCRATCH_SLOT),
                    })
                }
            })
            .collect::<Result<Vec<_>, SessionError>>()?;
        let meta = StepMeta::new(&self.exec.layout.meta, &meta_rows)?;
        meta.upload(backend, self.exec.default_stream(), self.exec.workspace())?;
        self.exec.run(backend, program)?;
        let vocab = self.exec.config.vocab_size;
        let mut raw = vec![0u8; rows.len() * vocab * 4];
        backend.copy_d2h(
            self.exec.workspace().offset(self.exec.layout.logits_offset),
            &mut raw,
        )?;
        Ok(crate::bytes::f32s_from_bytes(&raw))
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

/// The model has recurrent state kept in per-sequence slots.
fn recurrent(exec: &CircuitExec) -> bool {
    exec.layout.states.iter().any(|r| r.slot_bytes > 0)
}

impl Session<'_> {
    /// Zeroes a slot in every recurrent state region (a new sequence starts from zeros).
    fn zero_slot(&self, backend: &mut dyn GpuBackend, slot: u32) -> Result<(), SessionError> {
        for r in self.exec.layout.states.iter().filter(|r| r.slot_bytes > 0) {
            let at = self
                .exec
                .kv_cache()
                .offset(r.offset + slot as usize * r.slot_bytes);
            backend.memset(at, 0, r.slot_bytes)?;
        }
        Ok(())
    }
}

/// The arg-max token (the lowest index among equal maxima; NaN never wins).
pub fn greedy(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] || logits[best].is_nan() && !v.is_nan() {
            best = i;
        }
    }
    best as u32
}
