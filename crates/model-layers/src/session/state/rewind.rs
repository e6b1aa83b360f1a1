//! Taking a sequence back to an earlier length, the mechanisms behind the one rollback story
//! (`speculative`'s module doc): rewind points (`RewindPoint`: the length and a host copy of
//! the recurrent state, for any sequence), `truncate_to` (a sequence holding no recurrent
//! state: the KV cells past the new length are simply never read again), and, inside a
//! speculative step only, the roll-back of a verify step to one of its rows from the per-row
//! snapshots the chained recurrence kernels write (`keep_verify_rows`).
//!
//! Invariant: after any of them the sequence's KV length, block table, token history and
//! recurrent state are exactly those a sequence fed only the kept tokens would have.

use solder_gpu_runtime::GpuBackend;

use super::Spares;
use crate::error::SessionError;
use crate::session::{SeqId, Session};

/// A sequence's length and recurrent state at one moment, to go back to. It names the exec,
/// session and sequence it was taken from and the sequence's history generation then: any
/// other sequence refuses it, and so does its own once its history was cut below the point
/// (a rewind or truncation to fewer tokens, even if tokens were fed again since).
#[derive(Debug, Clone)]
pub struct RewindPoint {
    exec: u64,
    session: u64,
    seq: SeqId,
    generation: u64,
    len: usize,
    /// Per recurrent state region, the slot's bytes (empty without recurrent state or before
    /// the sequence took a slot).
    state: Vec<Vec<u8>>,
}

impl RewindPoint {
    /// The sequence it was taken from.
    pub fn seq(&self) -> SeqId {
        self.seq
    }

    /// The sequence's length when it was taken.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it was taken before the sequence's first token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The recurrent state it holds: one slot's bytes per recurrent state region, in layout
    /// order (empty without recurrent state).
    pub fn state_bytes(&self) -> &[Vec<u8>] {
        &self.state
    }
}

/// The cuts a sequence's history took (truncations to fewer tokens), so a rewind point knows
/// whether the tokens before it are still the ones it saw.
///
/// Invariant: `stack` holds (generation after the cut, length cut to) with both rising, and
/// the shortest cut made after any generation is the first entry after it (a cut pops every
/// entry at least as long, which it makes redundant).
#[derive(Debug, Clone, Default)]
pub(crate) struct Cuts {
    generation: u64,
    stack: Vec<(u64, usize)>,
}

impl Cuts {
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Records a cut of the history to `len` tokens.
    pub(crate) fn cut(&mut self, len: usize) {
        self.generation = self.generation.wrapping_add(1);
        while self.stack.last().is_some_and(|&(_, cut)| cut >= len) {
            self.stack.pop();
        }
        self.stack.push((self.generation, len));
    }

    /// The fewest tokens the history was cut to after `generation` (None: no cut since).
    fn shortest_since(&self, generation: u64) -> Option<usize> {
        self.stack
            .iter()
            .find(|&&(g, _)| g > generation)
            .map(|&(_, len)| len)
    }
}

/// `Session::truncate_to`: refused for a sequence holding recurrent state (its slot on a
/// model that keeps some), which a truncation cannot take back.
pub(crate) fn truncate_to(
    session: &mut Session<'_>,
    id: SeqId,
    len: usize,
) -> Result<(), SessionError> {
    let current = session.seq_len(id)?;
    if len > current {
        return Err(SessionError::Rewind(format!(
            "sequence {id} holds {current} tokens: it cannot be truncated to {len}"
        )));
    }
    if session.recurrent() && session.seq(id)?.slot.is_some() {
        return Err(SessionError::Rewind(format!(
            "sequence {id}: the model keeps recurrent state, which a truncation cannot take \
             back; take a rewind point before the tokens to drop"
        )));
    }
    session.check_window_kept(id, len)?;
    let pages = session.exec.layout.kv_block_size;
    check_cut_unshared(session, id, len)?;
    session.truncate(id, len, len.div_ceil(pages));
    Ok(())
}

/// `Session::rewind_point`.
pub(crate) fn point(
    session: &Session<'_>,
    backend: &mut dyn GpuBackend,
    id: SeqId,
) -> Result<RewindPoint, SessionError> {
    let exec = session.exec;
    exec.check_usable(backend)?;
    let seq = session.seq(id)?;
    let mut state = Vec::new();
    if let Some(slot) = seq.slot {
        let states = exec.kv_cache();
        for region in exec.layout.states.iter().filter(|r| r.slot_bytes > 0) {
            let mut bytes = vec![0u8; region.slot_bytes];
            let at = states.offset(region.offset + slot as usize * region.slot_bytes);
            backend.copy_d2h(at, &mut bytes)?;
            state.push(bytes);
        }
    }
    Ok(RewindPoint {
        exec: exec.id(),
        session: session.id,
        seq: id,
        generation: seq.cuts.generation(),
        len: seq.len,
        state,
    })
}

/// Refuses a cut to `len` that leaves a page a fork shares partly filled: the next step
/// would write into it, and copy-on-write after a cut is not built.
fn check_cut_unshared(session: &Session<'_>, id: SeqId, len: usize) -> Result<(), SessionError> {
    let block = session.exec.layout.kv_block_size;
    if len.is_multiple_of(block) {
        return Ok(());
    }
    let page = session.seq(id)?.pages.get(len / block).copied();
    if page.is_some_and(|page| session.exec.pools().pages.is_shared(page)) {
        return Err(SessionError::Rewind(format!(
            "sequence {id}: a cut to {len} leaves a KV page a fork shares partly filled, and \
             copy-on-write after a cut is not built; cut at a multiple of {block}"
        )));
    }
    Ok(())
}

/// `Session::rewind`: every refusal checked before the state is touched.
pub(crate) fn rewind(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    point: &RewindPoint,
) -> Result<(), SessionError> {
    session.exec.check_usable(backend)?;
    check_point(session, point)?;
    check_cut_unshared(session, point.seq, point.len)?;
    restore_point_state(session, backend, point)?;
    let block = session.exec.layout.kv_block_size;
    session.truncate(point.seq, point.len, point.len.div_ceil(block));
    Ok(())
}

/// Refuses a point another exec, session or sequence took, one the sequence's history was cut
/// below since, one past its length, one whose pages left the window, and one whose state
/// regions do not match the layout's.
fn check_point(session: &Session<'_>, point: &RewindPoint) -> Result<(), SessionError> {
    let exec = session.exec;
    let id = point.seq;
    let refuse = |why: String| {
        Err(SessionError::Rewind(format!(
            "a rewind point of sequence {id} at {} tokens: {why}",
            point.len
        )))
    };
    if point.exec != exec.id() {
        return refuse(format!(
            "it was taken on exec {}, not on this session's exec {}",
            point.exec,
            exec.id()
        ));
    }
    if point.session != session.id {
        return refuse(format!(
            "it was taken in session {}, not in this one ({}): a point only serves the \
             sequence it was taken from",
            point.session, session.id
        ));
    }
    let seq = session.seq(id)?;
    if point.generation > seq.cuts.generation() {
        return refuse(format!(
            "its generation {} is past the sequence's {}",
            point.generation,
            seq.cuts.generation()
        ));
    }
    if let Some(cut) = seq
        .cuts
        .shortest_since(point.generation)
        .filter(|&cut| cut < point.len)
    {
        return refuse(format!(
            "the sequence was taken back to {cut} tokens after it was taken, so the tokens \
             before the point are no longer the ones it saw"
        ));
    }
    if point.len > seq.len {
        return refuse(format!("the sequence holds only {} tokens", seq.len));
    }
    session.check_window_kept(id, point.len)?;
    let regions = exec.layout.states.iter().filter(|r| r.slot_bytes > 0);
    if let Some((region, bytes)) = regions
        .zip(&point.state)
        .find(|(region, bytes)| bytes.len() != region.slot_bytes)
    {
        return refuse(format!(
            "it holds {} bytes of a state region whose slot is {} bytes",
            bytes.len(),
            region.slot_bytes
        ));
    }
    Ok(())
}

/// Copies the point's state into a spare slot the sequence then takes (or zeroes its slot, for
/// a point taken before the first step); a copy that fails part-way changes nothing.
fn restore_point_state(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    point: &RewindPoint,
) -> Result<(), SessionError> {
    let exec = session.exec;
    let id = point.seq;
    let regions: Vec<_> = exec
        .layout
        .states
        .iter()
        .filter(|r| r.slot_bytes > 0)
        .collect();
    match session.seq(id)?.slot {
        Some(_) if point.state.len() == regions.len() => {
            // Into a spare the sequence takes once every region's copy landed: a copy that
            // fails part-way leaves the slot it holds as it was (the spare goes back).
            let spares = Spares::lend(exec, &[id])?;
            let spare = spares.of(id).ok_or_else(|| {
                SessionError::Rewind(format!("sequence {id}: no spare slot to restore into"))
            })?;
            let states = exec.kv_cache();
            for (region, bytes) in regions.iter().zip(&point.state) {
                let at = states.offset(region.offset + spare as usize * region.slot_bytes);
                backend.copy_h2d(at, bytes)?;
            }
            spares.keep(session);
        }
        Some(_) if point.state.is_empty() && point.len == 0 => {
            // The point was taken before the sequence's first step: a fresh state.
            session.zero_state(backend, id)?;
        }
        None if point.state.is_empty() => {}
        _ if regions.is_empty() => {}
        _ => {
            return Err(SessionError::Rewind(format!(
                "sequence {id}: the rewind point holds {} state region(s), the model {}",
                point.state.len(),
                regions.len()
            )))
        }
    }
    Ok(())
}

impl Session<'_> {
    /// Puts a sequence back to `len` tokens and `pages` pages (the rest return to the pool).
    pub(crate) fn truncate(&mut self, id: SeqId, len: usize, pages: usize) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            if len < seq.len {
                seq.cuts.cut(len);
            }
            seq.len = len;
            seq.tokens.truncate(len);
            self.exec.pools().pages.shrink(&mut seq.pages, pages);
        }
    }

    /// Zeroes the recurrent state of the slot `id` holds (a fresh sequence's state), by memsets
    /// queued on the exec's default stream, before the next step (the host does not wait).
    pub(crate) fn zero_state(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
    ) -> Result<(), SessionError> {
        let Some(slot) = self.seqs.get(&id).and_then(|s| s.slot) else {
            return Ok(());
        };
        let states = self.exec.kv_cache();
        for region in self.exec.layout.states.iter().filter(|r| r.slot_bytes > 0) {
            let at = states.offset(region.offset + slot as usize * region.slot_bytes);
            backend.memset_async(self.exec.default_stream(), at, 0, region.slot_bytes)?;
        }
        Ok(())
    }

    /// Keeps the first `row + 1` of the `rows` rows the sequence ran from row `first` of the
    /// (batched-)verify step just run: its recurrent state becomes the snapshot the chained
    /// kernels wrote after row `first + row` (a row that asked for it: `Row::snapshot`, which
    /// only a speculative step's rows set), and its length drops by the rows after it.
    pub(crate) fn keep_verify_rows(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        first: usize,
        rows: usize,
        row: usize,
    ) -> Result<(), SessionError> {
        let seq = self
            .seqs
            .get(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        if row + 1 >= rows {
            return Ok(());
        }
        let len = seq.len - (rows - row - 1);
        if let Some(slot) = seq.slot {
            // Queued on the exec's stream, after the step that wrote the snapshots and before
            // the next: the host does not wait for the copies.
            let (states, stream) = (self.exec.kv_cache(), self.exec.default_stream());
            for region in self.exec.layout.states.iter().filter(|r| r.slot_bytes > 0) {
                let live = states.offset(region.offset + slot as usize * region.slot_bytes);
                let snapshot =
                    states.offset(region.snapshot_offset + (first + row) * region.slot_bytes);
                backend.copy_d2d_async(stream, live, snapshot, region.slot_bytes)?;
            }
        }
        let block = self.exec.layout.kv_block_size;
        self.truncate(id, len, len.div_ceil(block));
        Ok(())
    }
}
