//! Greedy steps enqueued ahead (`Session::next_tokens_ahead`): steps that do not wait for the
//! host. Each step after the first takes its tokens from the step before on the device:
//! `pick::argmax` over that step's logits, launched once this step's metadata is uploaded
//! (stream order), writes them into the metadata's token field and into an ids slot
//! (`Layout::ids_offset`). So the host enqueues all the steps back to back (metadata uploads
//! are asynchronous, nothing is read back between them) and reads every step's tokens in one
//! copy at the end: one wait for `steps` steps instead of one a step.
//!
//! Bookkeeping: a fed token is known on the host only once read back, so each step records its
//! rows' tokens as 0 and the real ones are written in after the read. A row with no finite
//! logit (argmax's -1) at step i: the steps after it ran on token -1 (the device embeds a zero
//! row; the CPU twin refuses the step), so the sequences are truncated back to their length
//! after step i and the error names the sequence, as `next_tokens` names it.
//!
//! Falls back to `next_tokens` step by step (the host in the loop) when a sequence samples
//! (its sampler needs the logits) or the model keeps recurrent state (a truncation cannot take
//! it back).

use solder_gpu_runtime::GpuBackend;

use super::{decode, SeqId, Session};
use crate::error::SessionError;
use crate::layout::IDS_SLOTS;
use crate::sampling::{Sampler, SamplingError};

/// `Session::next_tokens_ahead`.
pub(super) fn next_tokens_ahead(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, u32)],
    steps: usize,
) -> Result<Vec<Vec<u32>>, SessionError> {
    if steps == 0 || steps > IDS_SLOTS {
        return Err(SessionError::Argument {
            field: "steps",
            message: format!("{steps}: 1 to {IDS_SLOTS} steps are enqueued ahead"),
        });
    }
    if !session.all_greedy(batch) || session.recurrent() {
        return step_by_step(session, backend, batch, steps);
    }
    let start = batch
        .iter()
        .map(|&(id, _)| session.seq_len(id))
        .collect::<Result<Vec<_>, _>>()?;
    let fed: Vec<(SeqId, u32)> = batch.iter().map(|&(id, _)| (id, 0)).collect();
    let (mut ran, mut failed) = (0, None);
    for i in 0..steps {
        // Step i > 0 takes step i - 1's tokens (into slot i - 1) once its metadata is up.
        session.feed = i.checked_sub(1);
        let step = decode::greedy_step(session, backend, if i == 0 { batch } else { &fed });
        let took = session.feed.take().is_none();
        match step {
            Ok(()) => ran += 1,
            Err(e) => {
                // The slot of the step before holds its tokens only if this step took them.
                failed = Some((e, took));
                break;
            }
        }
    }
    let slots = match &failed {
        None => {
            session.take_greedy(backend, batch.len(), ran - 1, false)?;
            ran
        }
        Some((_, took)) => ran.saturating_sub(usize::from(!took)),
    };
    let ids = session.read_ids(backend, slots, batch.len())?;
    // The tokens each step after the first was fed, now known.
    for (i, step_ids) in ids.iter().enumerate().take(ran.saturating_sub(1)) {
        for ((id, _), (token, at)) in batch.iter().zip(step_ids.iter().zip(&start)) {
            if let Some(seq) = session.seqs.get_mut(id) {
                if let Some(slot) = seq.tokens.get_mut(at + i + 1) {
                    *slot = token.unwrap_or(0);
                }
            }
        }
    }
    // The first step whose row had nothing finite: the steps after it are taken back.
    if let Some((i, row)) = ids
        .iter()
        .enumerate()
        .find_map(|(i, step)| step.iter().position(Option::is_none).map(|row| (i, row)))
    {
        for (&(id, _), at) in batch.iter().zip(&start) {
            if session.seq_len(id)? > at + i + 1 {
                session.truncate_to(id, at + i + 1)?;
            }
        }
        return Err(SessionError::SampledAt {
            seq: batch[row].0,
            source: SamplingError::NoFiniteLogit {
                vocab: session.exec.config.vocab_size,
            },
        });
    }
    if let Some((e, _)) = failed {
        return Err(e);
    }
    for &(id, _) in batch {
        if let Some(seq) = session.seqs.get_mut(&id) {
            seq.sampler.get_or_insert_with(Sampler::greedy);
        }
    }
    // Per sequence, its token after each step.
    Ok((0..batch.len())
        .map(|row| ids.iter().map(|step| step[row].unwrap_or(0)).collect())
        .collect())
}

/// `steps` calls of `next_tokens`, each fed the tokens of the one before.
fn step_by_step(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, u32)],
    steps: usize,
) -> Result<Vec<Vec<u32>>, SessionError> {
    let mut feed = batch.to_vec();
    let mut out = vec![Vec::with_capacity(steps); batch.len()];
    for _ in 0..steps {
        let next = session.next_tokens(backend, &feed)?;
        for ((row, slot), token) in out.iter_mut().zip(feed.iter_mut()).zip(next) {
            row.push(token);
            slot.1 = token;
        }
    }
    Ok(out)
}
