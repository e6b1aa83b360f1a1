//! One step of a `Session`, all or nothing: check every row (token ids, positions, pages and
//! slots enough, the exec's backend), lend the slots and pages the step needs and a spare slot
//! for each sequence that already holds one (its kernels write the advanced state there, so
//! the slot it read keeps the state before the step), pick the route its slots
//! allow, upload its metadata (`meta::StepMeta`), run (`CircuitExec::run_step`: its graph or
//! its launches), and read the live rows' logits; sequences advance only when all of that
//! succeeded, and then give back the KV pages that left every layer's sliding window
//! (`window`).
//!
//! The MTP head's step (`mtp_step_many`) is the same, smaller: no state slot (the head keeps no
//! recurrent state), no route, no spares; the pages it grows go back if it fails.
//!
//! Invariant: a step that fails — at any point — gives back every page and slot it lent,
//! leaves every slot a sequence held as it was and advances no sequence, so every sequence is as it
//! was before the step (KV cells it wrote lie past every sequence's length: never read).

use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use super::Spares;
use crate::bytes::f32s_from_bytes;
use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::exec::Fill;
use crate::kernels::pick::{Argmax, ARGMAX};
use crate::kernels::Buf;
use crate::meta::{MetaRow, StepMeta, SCRATCH_SLOT};
use crate::program::Program;
use crate::session::{SeqId, Session};

/// One row of a step: which sequence (None for padding), its token and position, whether
/// a verify program keeps the recurrent state after it (`snapshot`: a speculative row the step
/// may roll back to; a prompt's chunk and a mixed step keep none, `MetaField::KeepSnapshots`),
/// and whether the step reads its logits (`logits`: copied back or picked on the device; the LM
/// head skips a row without, `MetaField::WantLogits`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    pub seq: Option<SeqId>,
    pub token: u32,
    pub position: usize,
    pub snapshot: bool,
    pub logits: bool,
}

impl Row {
    /// A row that fills a program wider than the step.
    pub const PADDING: Row = Row {
        seq: None,
        token: 0,
        position: 0,
        snapshot: false,
        logits: false,
    };

    /// Sequence `id`'s `token` at `position`, keeping no snapshot, its logits read.
    pub fn live(id: SeqId, token: u32, position: usize) -> Row {
        Row {
            seq: Some(id),
            token,
            position,
            snapshot: false,
            logits: true,
        }
    }
}

/// Which slot a step's kernels write each advancing sequence's new recurrent state into, and
/// who puts the state back if the step fails.
#[derive(Clone, Copy)]
pub(crate) enum SaveState<'s> {
    /// A spare the step lends (`Spares`), which the sequence takes on success; on failure the
    /// slot it read is as it was.
    PerStep,
    /// The slot it reads, in place: a prompt's chunks for a sequence new to them (a slot the
    /// first chunk lends goes back, with the state, if any chunk fails).
    InPlace,
    /// The spare the caller lent it (a speculative verify, which keeps them only once its
    /// acceptance succeeded; a prompt's first chunk): the step neither keeps it nor gives it
    /// back.
    IntoSpares(&'s Spares<'s>),
    /// The spare the caller lent it, read and written in place (a prompt's later chunks,
    /// continuing from what the first wrote there).
    OnSpares(&'s Spares<'s>),
}

/// Which rows' logits a step copies back to the host: never a padding row's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Every live row's, `[live rows * vocab]`.
    Live,
    /// The last live row's only, `[vocab]` (a prefill chunk's next token).
    Last,
    /// None (a prefill chunk before the last, when only the next token is asked for).
    Nothing,
    /// The first n live rows', `[n * vocab]` (a mixed step's decode rows, before its chunk).
    First(usize),
}

impl Reads {
    /// Whether these reads copy back live row `row` of `live` (a step whose logits are only
    /// copied back wants no other row's: `Row::logits`).
    pub(crate) fn wants(self, row: usize, live: usize) -> bool {
        match self {
            Reads::Live => row < live,
            Reads::Last => row + 1 == live,
            Reads::Nothing => false,
            Reads::First(n) => row < n.min(live),
        }
    }
}

/// What a step lent, given back if it fails: sequences that took a slot, each advancing
/// sequence's page count before the step, and (`SaveState::PerStep`) the spare slot each
/// advancing sequence's state is written to (taken by the sequence if the step succeeds).
#[derive(Default)]
struct Lent<'e> {
    slots: Vec<SeqId>,
    pages: Vec<(SeqId, usize)>,
    spares: Option<Spares<'e>>,
}

impl<'e> Session<'e> {
    /// Positions a sequence may reach: the model's limit and the KV shape's.
    pub(crate) fn position_limit(&self) -> usize {
        self.exec
            .config
            .max_position_embeddings
            .min(self.exec.layout.max_seq_len)
    }

    /// Runs `program` over `rows`, then advances each `(sequence, tokens)` of `advance`;
    /// returns the logits `reads` asks for (the live rows', `[live rows * vocab]`, for
    /// `Reads::Live`).
    pub(crate) fn step(
        &mut self,
        backend: &mut dyn GpuBackend,
        program: &Program,
        rows: &[Row],
        advance: &[(SeqId, usize)],
        save: SaveState,
        reads: Reads,
    ) -> Result<Vec<f32>, SessionError> {
        // A prefill program has no logits to read.
        debug_assert!(program.mode != Mode::Prefill || reads == Reads::Nothing);
        self.exec.check_usable(backend)?;
        self.refuse_piped("a step")?;
        let new_slots = self.check_step(rows, advance)?;
        let mut lent = Lent::default();
        let ran = self.lend_and_run(
            backend,
            program,
            (rows, advance, save),
            &new_slots,
            &mut lent,
        );
        match ran.and_then(|()| self.read_logits(backend, rows, reads)) {
            Ok(logits) => {
                // Each sequence written to a spare takes it; the slot it read is free.
                if let Some(spares) = lent.spares.take() {
                    spares.keep(self);
                }
                for &(id, count) in advance {
                    if let Some(seq) = self.seqs.get_mut(&id) {
                        seq.len += count;
                        let fed = rows.iter().filter(|r| r.seq == Some(id)).map(|r| r.token);
                        seq.tokens.extend(fed.take(count));
                    }
                }
                // A prefill recycles once all its chunks ran (it may roll back past them).
                if matches!(save, SaveState::PerStep) {
                    self.recycle_out_of_window(advance.iter().map(|&(id, _)| id));
                }
                Ok(logits)
            }
            Err(e) => self.give_back(lent, e),
        }
    }

    /// Everything a step can be refused for before it lends anything; returns the advancing
    /// sequences that need a recurrent-state slot.
    fn check_step(
        &self,
        rows: &[Row],
        advance: &[(SeqId, usize)],
    ) -> Result<Vec<SeqId>, SessionError> {
        let vocab = self.exec.config.vocab_size;
        for (index, row) in rows.iter().enumerate().filter(|(_, r)| r.seq.is_some()) {
            if row.token as usize >= vocab {
                return Err(SessionError::TokenOutOfRange {
                    token: row.token,
                    index,
                    vocab,
                });
            }
        }
        let limit = self.position_limit();
        let mut needed = 0;
        let pools = self.exec.pools();
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
            needed += pools.pages.needed(new_len, seq.pages.len());
        }
        pools.pages.check(needed)?;
        let new_slots: Vec<SeqId> = if pools.slots.recurrent() {
            advance
                .iter()
                .map(|&(id, _)| id)
                .filter(|id| self.seqs.get(id).is_some_and(|s| s.slot.is_none()))
                .collect()
        } else {
            Vec::new()
        };
        pools.slots.check(new_slots.len())?;
        Ok(new_slots)
    }

    /// Lends slots, pages and (`SaveState::PerStep`) a spare per advancing sequence,
    /// recording them in `lent`, uploads the metadata and runs.
    fn lend_and_run(
        &mut self,
        backend: &mut dyn GpuBackend,
        program: &Program,
        (rows, advance, save): (&[Row], &[(SeqId, usize)], SaveState<'_>),
        new_slots: &[SeqId],
        lent: &mut Lent<'e>,
    ) -> Result<(), SessionError> {
        let exec = self.exec;
        let mut pools = exec.pools();
        for &id in new_slots {
            let slot = pools
                .slots
                .take(backend, exec.default_stream(), Fill::Zero)?;
            let Some(seq) = self.seqs.get_mut(&id) else {
                pools.slots.give_back(slot);
                return Err(SessionError::UnknownSequence(id));
            };
            seq.slot = Some(slot);
            lent.slots.push(id);
        }
        for &(id, count) in advance {
            let seq = self
                .seqs
                .get_mut(&id)
                .ok_or(SessionError::UnknownSequence(id))?;
            let before = seq.pages.len();
            pools.pages.grow(&mut seq.pages, seq.len + count)?;
            lent.pages.push((id, before));
        }
        drop(pools);
        // Every advancing sequence's spare (a new one's too, so that the slots written form
        // one evenly pitched run when they can: the runtime route tests both).
        if matches!(save, SaveState::PerStep) {
            let ids: Vec<SeqId> = advance.iter().map(|&(id, _)| id).collect();
            lent.spares = Some(Spares::lend(exec, &ids)?);
        }
        let spares = match save {
            SaveState::IntoSpares(spares) | SaveState::OnSpares(spares) => Some(spares),
            SaveState::PerStep | SaveState::InPlace => lent.spares.as_ref(),
        };
        let spare = |id: SeqId| spares.and_then(|spares| spares.of(id));
        // The slot each row's kernels read: its spare when it is read in place, else the slot
        // its sequence holds.
        let slots: Vec<u32> = rows
            .iter()
            .map(|r| {
                r.seq
                    .and_then(|id| {
                        match save {
                            SaveState::OnSpares(_) => spare(id),
                            _ => None,
                        }
                        .or_else(|| self.seqs.get(&id).and_then(|s| s.slot))
                    })
                    .unwrap_or(SCRATCH_SLOT)
            })
            .collect();
        // The slot each row's kernels write: its spare, else the slot it reads (in place).
        let outs: Vec<u32> = rows
            .iter()
            .zip(&slots)
            .map(|(r, &slot)| r.seq.and_then(spare).unwrap_or(slot))
            .collect();
        // A runtime route: the arm whose condition both the slots read and written meet, else
        // the primary.
        let program = if self.routes && program.mode == Mode::MultiSeq {
            match self.exec.multi_seq_step(program.rows, &slots) {
                Ok(arm) if arm.arm.is_none_or(|c| c.holds(&outs)) => arm,
                _ => program,
            }
        } else {
            program
        };
        self.last_program = Some((program.mode, program.rows, program.arm));
        self.upload_meta(backend, rows, (&slots, &outs))?;
        // Steps fed on the device (`next_tokens_ahead`): the step before's greedy tokens, taken
        // now, after this step's metadata (stream order), into its token field and a slot.
        // An open pipeline copies them back once taken, overlapping this step.
        if let Some(slot) = self.feed.take() {
            let live = rows.iter().take_while(|r| r.seq.is_some()).count();
            let model = self.exec.default_stream();
            if let Some(pipe) = &self.pipeline {
                pipe.before_ids(backend, model, slot)?;
            }
            self.take_greedy(backend, live, slot, true)?;
            if let Some(pipe) = self.pipeline.as_mut() {
                let layout = &self.exec.layout;
                let ids =
                    (self.exec.workspace()).offset(layout.ids_offset + slot * layout.max_rows * 4);
                pipe.read_ids(backend, model, (ids, slot, live))?;
            }
        }
        // The program's graph (captured on first use) or its launches, as the exec's policy says.
        self.last_run = Some(self.exec.run_step(backend, program)?);

        Ok(())
    }

    /// Copies back the logits rows `reads` names; live rows come first in every step's
    /// layout (padding rows after them), so the copy is one contiguous range.
    fn read_logits(
        &self,
        backend: &mut dyn GpuBackend,
        rows: &[Row],
        reads: Reads,
    ) -> Result<Vec<f32>, SessionError> {
        let vocab = self.exec.config.vocab_size;
        let live = rows.iter().take_while(|r| r.seq.is_some()).count();
        debug_assert!(rows[live..].iter().all(|r| r.seq.is_none()));
        let (first, count) = match reads {
            Reads::Live => (0, live),
            Reads::Last => (live.saturating_sub(1), live.min(1)),
            Reads::Nothing => return Ok(Vec::new()),
            Reads::First(n) => (0, n.min(live)),
        };
        let mut raw = vec![0u8; count * vocab * 4];
        let at = self.exec.layout.logits_offset + first * vocab * 4;
        backend.copy_d2h(self.exec.workspace().offset(at), &mut raw)?;
        Ok(f32s_from_bytes(&raw))
    }

    /// The greedy tokens of the step that just ran, for its first `live` rows: `pick::argmax`
    /// over their logits on the device, then 4 bytes a row read back (not `vocab` f32);
    /// `None` for a row with no logit but -inf and NaN.
    pub(crate) fn greedy_ids(
        &self,
        backend: &mut dyn GpuBackend,
        live: usize,
    ) -> Result<Vec<Option<u32>>, SessionError> {
        self.take_greedy(backend, live, 0, false)?;
        Ok(self.read_ids(backend, 1, live)?.concat())
    }

    /// Launches `pick::argmax` over the first `live` logits rows into ids slot `slot` (and,
    /// with `feed`, into the token field of the step metadata now uploaded: the step about to
    /// run takes them as its tokens). Nothing is read back.
    pub(crate) fn take_greedy(
        &self,
        backend: &mut dyn GpuBackend,
        live: usize,
        slot: usize,
        feed: bool,
    ) -> Result<(), SessionError> {
        let vocab = self.exec.config.vocab_size;
        let (workspace, layout) = (self.exec.workspace(), &self.exec.layout);
        let ids_at = layout.ids_offset + slot * layout.max_rows * 4;
        let launch = Argmax {
            logits: Buf::new(workspace.offset(layout.logits_offset), live * vocab * 4),
            ids: Buf::new(workspace.offset(ids_at), live * 4),
            tokens: feed.then(|| Buf::new(workspace.offset(layout.meta.tokens), live * 4)),
            rows: live as u32,
            vocab: vocab as u32,
        }
        .launch(ARGMAX);
        let kernel = backend.kernel(launch.kernel)?;
        backend.launch(
            self.exec.default_stream(),
            kernel,
            &launch.config,
            &launch.args,
        )?;
        Ok(())
    }

    /// The ids of slots `0..slots`, `live` rows each (one copy), `None` where a row had
    /// nothing finite to pick.
    pub(crate) fn read_ids(
        &self,
        backend: &mut dyn GpuBackend,
        slots: usize,
        live: usize,
    ) -> Result<Vec<Vec<Option<u32>>>, SessionError> {
        let layout = &self.exec.layout;
        let stride = layout.max_rows * 4;
        let mut raw = vec![0u8; slots * stride];
        backend.copy_d2h(self.exec.workspace().offset(layout.ids_offset), &mut raw)?;
        Ok(raw
            .chunks_exact(stride)
            .map(|slot| {
                slot[..live * 4]
                    .chunks_exact(4)
                    .map(|b| u32::try_from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok())
                    .collect()
            })
            .collect())
    }

    /// Uploads the step's metadata: each row's token, position, block table and state slot.
    fn upload_meta(
        &self,
        backend: &mut dyn GpuBackend,
        rows: &[Row],
        (slots, outs): (&[u32], &[u32]),
    ) -> Result<(), SessionError> {
        let meta_rows = rows
            .iter()
            .zip(slots.iter().zip(outs))
            .map(|(row, (&state_slot, &state_slot_out))| match row.seq {
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
                        state_slot,
                        state_slot_out,
                        snapshot: row.snapshot,
                        logits: row.logits,
                    })
                }
            })
            .collect::<Result<Vec<_>, SessionError>>()?;
        let meta = StepMeta::new(&self.exec.layout.meta, &meta_rows)?;
        meta.upload(backend, self.exec.default_stream(), self.exec.workspace())?;
        Ok(())
    }

    /// Gives back what a failed step lent, last lent first, so the pools are as they were
    /// (the spares too: the slots read hold the state as it was); returns the step's error.
    fn give_back(&mut self, lent: Lent, error: SessionError) -> Result<Vec<f32>, SessionError> {
        {
            let mut pools = self.exec.pools();
            for (id, before) in lent.pages.into_iter().rev() {
                if let Some(seq) = self.seqs.get_mut(&id) {
                    pools.pages.shrink(&mut seq.pages, before);
                }
            }
            for id in lent.slots.into_iter().rev() {
                if let Some(slot) = self.seqs.get_mut(&id).and_then(|s| s.slot.take()) {
                    pools.slots.give_back(slot);
                }
            }
        }
        // Its spares (dropped after the pool is unlocked: they lock it to go back).
        drop(lent.spares);
        Err(error)
    }
}

/// `Session::mtp_step_many`: one MTP head program step over every `(sequence, tokens)` of
/// `batch` (its rows in batch order, each sequence's tokens at its next positions; the hidden
/// rows already written), their pages grown as needed and given back on failure.
pub(crate) fn mtp_step_many(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, &[u32])],
) -> Result<Vec<f32>, SessionError> {
    session.refuse_piped("mtp step")?;
    let exec = session.exec;
    let fed: Vec<u32> = batch.iter().flat_map(|(_, t)| t.iter().copied()).collect();
    let (program, width) = mtp_program(exec, &fed)?;
    let limit = session.position_limit();
    let mut needed = 0;
    for (i, &(id, tokens)) in batch.iter().enumerate() {
        if batch[..i].iter().any(|(other, _)| *other == id) {
            return Err(SessionError::DuplicateSequence(id));
        }
        let seq = session
            .seqs
            .get(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        let end = seq.len + tokens.len();
        if end > limit {
            return Err(SessionError::PositionPastLimit {
                seq: id,
                position: end - 1,
                limit,
            });
        }
        needed += exec.pools().pages.needed(end, seq.pages.len());
    }
    exec.pools().pages.check(needed)?;
    // Pages grown so far, `(sequence, pages before)`, given back if anything fails.
    let mut grown: Vec<(SeqId, usize)> = Vec::with_capacity(batch.len());
    let outcome = grow_and_run(session, backend, (program, width), batch, &mut grown);
    match outcome {
        Ok(logits) => {
            for &(id, tokens) in batch {
                if let Some(seq) = session.seqs.get_mut(&id) {
                    seq.len += tokens.len();
                    seq.tokens.extend_from_slice(tokens);
                }
            }
            session.last_program = Some((Mode::Draft, width, None));
            Ok(logits)
        }
        Err(e) => {
            let mut pools = exec.pools();
            for (id, before) in grown.into_iter().rev() {
                if let Some(seq) = session.seqs.get_mut(&id) {
                    pools.pages.shrink(&mut seq.pages, before);
                }
            }
            Err(e)
        }
    }
}

/// Grows each sequence's pages for its tokens (recorded in `grown`), then runs the head.
fn grow_and_run(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    program: (&Program, usize),
    batch: &[(SeqId, &[u32])],
    grown: &mut Vec<(SeqId, usize)>,
) -> Result<Vec<f32>, SessionError> {
    let exec = session.exec;
    for &(id, tokens) in batch {
        let seq = session
            .seqs
            .get_mut(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        let before = seq.pages.len();
        exec.pools()
            .pages
            .grow(&mut seq.pages, seq.len + tokens.len())?;
        grown.push((id, before));
    }
    let mut rows = Vec::with_capacity(program.1);
    for &(id, tokens) in batch {
        let seq = session
            .seqs
            .get(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        rows.extend(tokens.iter().enumerate().map(|(i, &token)| MetaRow::Live {
            token,
            position: seq.len + i,
            pages: &seq.pages,
            state_slot: SCRATCH_SLOT,
            state_slot_out: SCRATCH_SLOT,
            snapshot: false,
            logits: true,
        }));
    }
    run_mtp(exec, backend, program, rows)
}

/// The narrowest MTP head program that holds `tokens` (each in the vocabulary), and its width.
fn mtp_program<'x>(
    exec: &'x CircuitExec,
    tokens: &[u32],
) -> Result<(&'x Program, usize), SessionError> {
    let vocab = exec.config.vocab_size;
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
    let n = tokens.len();
    let shapes = exec.instance.program_shapes();
    let width = shapes
        .narrowest(Mode::Draft, n)
        .ok_or(SessionError::TooWide {
            asked: n,
            widest: shapes.widest(Mode::Draft).unwrap_or(0),
        })?;
    Ok((exec.program(Mode::Draft, width)?, width))
}

/// Uploads the MTP step's metadata (the live `rows`, padding to the program's width, no
/// state slot), runs it and reads the live rows' logits.
fn run_mtp(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    (program, width): (&Program, usize),
    mut rows: Vec<MetaRow<'_>>,
) -> Result<Vec<f32>, SessionError> {
    let live = rows.len();
    rows.resize_with(width, || MetaRow::Padding);
    let meta = StepMeta::new(&exec.layout.meta, &rows)?;
    meta.upload(backend, exec.default_stream(), exec.workspace())?;
    exec.run_step(backend, program)?;
    let mut raw = vec![0u8; live * exec.config.vocab_size * 4];
    backend.copy_d2h(exec.workspace().offset(exec.layout.logits_offset), &mut raw)?;
    Ok(f32s_from_bytes(&raw))
}
