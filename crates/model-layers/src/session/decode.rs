//! Plain decoding: how each of `Session`'s plain entry points lays out its rows and picks its
//! program — prefill in chunks (the widest verify width the rest fills, a last single token
//! through decode; a chunk whose logits nobody reads runs the prefill program of its width,
//! which has no LM head and writes the same KV pages and state; when only the last position is
//! read, a wide last chunk too, its last token then recomputed by decode), verify and decode (one
//! sequence), multi-seq steps (one token each of several sequences) and batched verify
//! (several sequences' consecutive tokens) — before one `state::step` runs it.
//!
//! Invariant: a prefill is all or nothing over all its chunks: on failure the sequence's
//! length, pages, token history and recurrent state are as they were before it (a sequence
//! that held state had its chunks write a spare slot, which it takes only once the last
//! succeeded).

use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use super::state::{Reads, Row, SaveState, Spares};
use super::{SeqId, Session};
use crate::error::SessionError;
use crate::program::Program;

/// A prompt's last chunk at least this wide runs headless too when only its last position's
/// logits are read. Through its verify program the LM head would take the last row alone (the
/// want-logits flags), but the last layer's attention and MLP would still run over every row,
/// which the prefill program drops (`prune`); on the CPU backend that costs more than the one
/// decode step that then recomputes the last position (not timed on a device, where the decode
/// step's weight reads may cost more). A model with recurrent state always takes the verify
/// program, its LM head on the last row alone.
pub(crate) const HEADLESS_LAST_MIN_ROWS: usize = 16;

/// `Session::prefill` (every position's logits) and `Session::prefill_next` (`last_only`:
/// the last position's logits alone, `[vocab]`; earlier chunks copy nothing back).
///
/// With `Reads::Last`, a last chunk of at least `HEADLESS_LAST_MIN_ROWS` rows runs its
/// headless prefill program as well, the sequence is cut back by its last token, and that token
/// runs again through decode for the logits: the same bytes (a row's KV and logits do not
/// depend on its program's width: parity's batch invariance), without the LM head over the
/// chunk's other rows. Not for a model that keeps recurrent state (the last token would advance
/// it twice), nor where the cut would fall in a KV page the sequence held before this prefill
/// (a fork may share it).
pub(super) fn prefill(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    id: SeqId,
    tokens: &[u32],
    reads: Reads,
) -> Result<Vec<f32>, SessionError> {
    // All-or-nothing: check the whole prompt first, and undo earlier chunks on failure.
    let (start, pages_before, slot_before) = check_prefill(session, backend, id, tokens)?;
    let exec = session.exec;
    // A sequence holding state: its chunks write a spare (the first reads its slot, the rest
    // the spare) it takes once the last succeeded, so a failed chunk leaves the slot as it
    // was. A sequence new to state advances the slot its first chunk lends, in place: it goes
    // back if a chunk fails.
    let spares = match slot_before {
        Some(_) => Some(Spares::lend(exec, &[id])?),
        None => None,
    };
    let shapes = exec.instance.program_shapes();
    // The chunks: the widest verify program the rest fills; a last single token runs decode.
    let mut widths = Vec::new();
    let mut left = tokens.len();
    while left > 0 {
        let width = shapes.widest_within(Mode::Verify, left).unwrap_or(1);
        widths.push(width);
        left -= width;
    }
    let last_width = widths.last().copied().unwrap_or(1);
    let block = exec.layout.kv_block_size;
    let headless_last = reads == Reads::Last
        && last_width >= HEADLESS_LAST_MIN_ROWS
        && shapes.contains(Mode::Prefill, last_width)
        && !session.recurrent()
        && (start + tokens.len() - 1) / block >= pages_before;
    let chunks = Chunks {
        reads,
        widths: &widths,
        headless_last,
        spares: spares.as_ref(),
    };
    match run_chunks(session, backend, id, tokens, chunks) {
        Ok(logits) => {
            if let Some(spares) = spares {
                spares.keep(session);
            }
            session.recycle_out_of_window([id]);
            Ok(logits)
        }
        // The spares go back when dropped, after the undo.
        Err(e) => Err(undo_prefill(
            session,
            id,
            (start, pages_before, slot_before),
            e,
        )),
    }
}

/// How `prefill` runs a prompt's chunks: the logits read, each chunk's width, whether the last
/// runs headless (its last token again through decode), and the spare a sequence holding state
/// writes.
struct Chunks<'c> {
    reads: Reads,
    widths: &'c [usize],
    headless_last: bool,
    spares: Option<&'c Spares<'c>>,
}

/// The chunks of `prefill`, in order; the first error stops them (the caller undoes them all).
fn run_chunks(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    id: SeqId,
    tokens: &[u32],
    chunks: Chunks<'_>,
) -> Result<Vec<f32>, SessionError> {
    let Chunks {
        reads,
        widths,
        headless_last,
        spares,
    } = chunks;
    // The first chunk reads the slot held and writes the spare; later ones advance the spare.
    let save = |first: bool| match spares {
        Some(spares) if first => SaveState::IntoSpares(spares),
        Some(spares) => SaveState::OnSpares(spares),
        None => SaveState::InPlace,
    };
    let rows_read = match reads {
        Reads::Live => tokens.len(),
        Reads::Last => 1,
        Reads::Nothing => 0,
        Reads::First(n) => n.min(tokens.len()),
    };
    let mut logits = Vec::with_capacity(rows_read * session.exec.config.vocab_size);
    let mut at = 0;
    for (i, &width) in widths.iter().enumerate() {
        let last = i + 1 == widths.len();
        // Every row's logits, the last chunk's last row's only, or none.
        let chunk_reads = match (reads, last) {
            (Reads::Last, false) => Reads::Nothing,
            (Reads::Last, true) if headless_last => Reads::Nothing,
            (reads, _) => reads,
        };
        let chunk = &tokens[at..at + width];
        logits.extend(verify(
            session,
            backend,
            id,
            chunk,
            save(i == 0),
            chunk_reads,
        )?);
        at += width;
    }
    if headless_last {
        // The last position again, through decode: the cut frees nothing another sequence
        // holds (its page is this prefill's), and the decode step rewrites the same KV bytes.
        let end = session.seq_len(id)? - 1;
        let block = session.exec.layout.kv_block_size;
        session.truncate(id, end, end.div_ceil(block));
        let last = &tokens[tokens.len() - 1..];
        logits.extend(verify(
            session,
            backend,
            id,
            last,
            save(false),
            Reads::Last,
        )?);
    }
    Ok(logits)
}

/// Undoes a failed prefill, given the sequence's length, page count and slot before it: its
/// length and pages cut back, a slot this prefill took given back (re-zeroed when next
/// taken); returns the error to report. A slot it already had was never written (its chunks
/// wrote a spare, which goes back when the caller drops it).
fn undo_prefill(
    session: &mut Session<'_>,
    id: SeqId,
    (start, pages_before, slot_before): (usize, usize, Option<u32>),
    e: SessionError,
) -> SessionError {
    let exec = session.exec;
    session.truncate(id, start, pages_before);
    if slot_before.is_none() {
        if let Some(slot) = session.seqs.get_mut(&id).and_then(|s| s.slot.take()) {
            exec.pools().slots.give_back(slot);
        }
    }
    e
}

/// Everything a prefill can be refused for before its first chunk; returns the sequence's
/// length, page count and slot before it.
fn check_prefill(
    session: &Session<'_>,
    backend: &dyn GpuBackend,
    id: SeqId,
    tokens: &[u32],
) -> Result<(usize, usize, Option<u32>), SessionError> {
    if tokens.is_empty() {
        return Err(SessionError::Empty("prefill of no tokens"));
    }
    let vocab = session.exec.config.vocab_size;
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
    session.exec.check_usable(backend)?;
    let (start, pages_before, slot_before) = {
        let seq = session.seq(id)?;
        (seq.len, seq.pages.len(), seq.slot)
    };
    let limit = session.position_limit();
    if start + tokens.len() > limit {
        return Err(SessionError::PositionPastLimit {
            seq: id,
            position: start + tokens.len() - 1,
            limit,
        });
    }
    let pools = session.exec.pools();
    pools
        .pages
        .check(pools.pages.needed(start + tokens.len(), pages_before))?;
    Ok((start, pages_before, slot_before))
}

/// `Session::verify`, with the recurrent state saved by the step or already by the caller;
/// with `Reads::Nothing` (a prefill chunk nobody reads the logits of), through the prefill
/// program of its width when there is one.
pub(super) fn verify(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    id: SeqId,
    tokens: &[u32],
    save: SaveState,
    reads: Reads,
) -> Result<Vec<f32>, SessionError> {
    let start = session.seq_len(id)?;
    let n = tokens.len();
    // The LM head computes the rows `reads` copies back, no other (`Row::logits`).
    let rows: Vec<Row> = tokens
        .iter()
        .enumerate()
        .map(|(i, &token)| Row {
            logits: reads.wants(i, n),
            ..Row::live(id, token, start + i)
        })
        .collect();
    let exec = session.exec;
    let headless =
        |k| reads == Reads::Nothing && exec.instance.program_shapes().contains(Mode::Prefill, k);
    let program = match tokens.len() {
        0 => return Err(SessionError::Empty("verify of no tokens")),
        1 => exec.decode_program(),
        // Nobody reads this chunk's logits: the program without the LM head.
        k if headless(k) => exec.program(Mode::Prefill, k),
        k => exec.verify_program(k),
    }?;
    session.step(backend, program, &rows, &[(id, tokens.len())], save, reads)
}

/// `Session::multi_seq_step`.
pub(super) fn multi_seq_step(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, u32)],
) -> Result<Vec<Vec<f32>>, SessionError> {
    let step = multi_seq_rows(session, batch)?;
    let logits = run_rows(session, backend, step, Reads::Live)?;
    let vocab = session.exec.config.vocab_size;
    Ok(logits
        .chunks(vocab)
        .take(batch.len())
        .map(<[f32]>::to_vec)
        .collect())
}

/// `Session::next_tokens` when every sequence samples greedily: `multi_seq_step`'s step
/// (decode for one sequence) reading nothing back, then its greedy tokens taken on the device
/// (`pick::argmax`), 4 bytes a sequence read back instead of its logits row; `None` for a row
/// with no logit but -inf and NaN.
pub(super) fn next_greedy(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, u32)],
) -> Result<Vec<Option<u32>>, SessionError> {
    greedy_step(session, backend, batch)?;
    session.greedy_ids(backend, batch.len())
}

/// `multi_seq_step`'s step (decode for one sequence), reading nothing back.
pub(super) fn greedy_step(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, u32)],
) -> Result<(), SessionError> {
    let step = multi_seq_rows(session, batch)?;
    run_rows(session, backend, step, Reads::Nothing).map(drop)
}

/// A step's program, its rows (padded) and how far each sequence advances.
type StepRows<'e> = (&'e Program, Vec<Row>, Vec<(SeqId, usize)>);

/// Runs a step laid out by `multi_seq_rows` or `verify_batch_rows` (its own saved state),
/// returning the logits `reads` asks for.
fn run_rows(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    (program, rows, advance): StepRows<'_>,
    reads: Reads,
) -> Result<Vec<f32>, SessionError> {
    session.step(backend, program, &rows, &advance, SaveState::PerStep, reads)
}

/// The program, rows (padded) and advances of one token for each of `batch`'s sequences.
fn multi_seq_rows<'e>(
    session: &Session<'e>,
    batch: &[(SeqId, u32)],
) -> Result<StepRows<'e>, SessionError> {
    let n = batch.len();
    if n == 0 {
        return Err(SessionError::Empty("multi-seq step of no sequences"));
    }
    for (i, (id, _)) in batch.iter().enumerate() {
        if batch[..i].iter().any(|(other, _)| other == id) {
            return Err(SessionError::DuplicateSequence(*id));
        }
    }
    let exec = session.exec;
    let shapes = exec.instance.program_shapes();
    let program = if n == 1 {
        exec.decode_program()?
    } else {
        let width = shapes
            .narrowest(Mode::MultiSeq, n)
            .ok_or(SessionError::TooWide {
                asked: n,
                widest: shapes.widest(Mode::MultiSeq).unwrap_or(1),
            })?;
        exec.multi_seq_program(width)?
    };
    let mut rows = Vec::with_capacity(program.rows);
    for &(id, token) in batch {
        rows.push(Row::live(id, token, session.seq_len(id)?));
    }
    rows.resize(program.rows, Row::PADDING);
    let advance: Vec<(SeqId, usize)> = batch.iter().map(|&(id, _)| (id, 1)).collect();
    Ok((program, rows, advance))
}

/// `Session::mixed_step`: `decode`'s rows first (one token each), then `chunk`'s tokens, in
/// the narrowest batched-verify program that holds them; returns the decode rows' greedy ids
/// (read back alone) when `ids`, else their logits rows.
pub(super) fn mixed_step(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    decode: &[(SeqId, u32)],
    chunk: (SeqId, &[u32]),
    ids: bool,
) -> Result<Mixed, SessionError> {
    let batch: Vec<(SeqId, &[u32])> = decode
        .iter()
        .map(|(id, token)| (*id, std::slice::from_ref(token)))
        .chain(std::iter::once(chunk))
        .collect();
    let (program, mut rows, advance) = verify_batch_rows(session, &batch)?;
    // Nobody reads the chunk's logits: the LM head skips its rows.
    for row in &mut rows[decode.len()..] {
        row.logits = false;
    }
    let step = (program, rows, advance);
    let reads = if ids {
        Reads::Nothing
    } else {
        Reads::First(decode.len())
    };
    let logits = run_rows(session, backend, step, reads)?;
    Ok(match ids {
        true => Mixed::Ids(session.greedy_ids(backend, decode.len())?),
        false => Mixed::Logits(logits),
    })
}

/// What a mixed step read back for its decode rows.
pub(super) enum Mixed {
    /// Each row's greedy token (`None`: nothing finite to pick).
    Ids(Vec<Option<u32>>),
    /// Their logits, `[rows * vocab]`.
    Logits(Vec<f32>),
}

/// `Session::verify_batch`.
pub(super) fn verify_batch(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, &[u32])],
) -> Result<Vec<Vec<f32>>, SessionError> {
    let step = verify_batch_rows(session, batch)?;
    let logits = run_rows(session, backend, step, Reads::Live)?;
    let vocab = session.exec.config.vocab_size;
    let mut out = Vec::with_capacity(batch.len());
    let mut at = 0;
    for (_, tokens) in batch {
        out.push(logits[at * vocab..(at + tokens.len()) * vocab].to_vec());
        at += tokens.len();
    }
    Ok(out)
}

/// The program, rows (each sequence's tokens in order, padded) and advances of a batched
/// verify over `batch` (`verify_batch`, `mixed_step`).
fn verify_batch_rows<'e>(
    session: &Session<'e>,
    batch: &[(SeqId, &[u32])],
) -> Result<StepRows<'e>, SessionError> {
    if batch.is_empty() || batch.iter().any(|(_, t)| t.is_empty()) {
        return Err(SessionError::Empty("verify_batch of no tokens"));
    }
    for (i, (id, _)) in batch.iter().enumerate() {
        if batch[..i].iter().any(|(other, _)| other == id) {
            return Err(SessionError::DuplicateSequence(*id));
        }
    }
    let exec = session.exec;
    let total: usize = batch.iter().map(|(_, t)| t.len()).sum();
    let shapes = exec.instance.program_shapes();
    let width = shapes
        .narrowest(Mode::VerifyBatch, total)
        .ok_or(SessionError::TooWide {
            asked: total,
            widest: shapes.widest(Mode::VerifyBatch).unwrap_or(0),
        })?;
    let program = exec.program(Mode::VerifyBatch, width)?;
    let mut rows = Vec::with_capacity(width);
    for &(id, tokens) in batch {
        let start = session.seq_len(id)?;
        rows.extend((tokens.iter().enumerate()).map(|(i, &token)| Row::live(id, token, start + i)));
    }
    rows.resize(width, Row::PADDING);
    let advance = batch.iter().map(|&(id, t)| (id, t.len())).collect();
    Ok((program, rows, advance))
}
