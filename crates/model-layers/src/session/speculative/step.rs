//! The speculative step behind `Session::speculative_step` (one sequence, a verify program of
//! k + 1 rows) and `Session::speculative_step_many` (several, one batched-verify program):
//! check everything, draft every sequence, run one verify step, accept, keep each accepted
//! prefix, settle the drafter.
//!
//! Invariants: a kept token's logits are the bytes a plain decode step feeding it returns (the
//! verify program's rows are byte-identical to decode: parity); after a step, each sequence is
//! exactly as plain decoding of its kept tokens leaves it; a step refused or failed leaves
//! every sequence as it was and tells the drafter `Verdict::NOTHING` for every sequence it
//! drafted.

use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use super::{Acceptances, Draft, Drafter, SpeculativeStep, Verdict};
use crate::error::SessionError;
use crate::program::Program;
use crate::sampling::{Acceptance, Sampler};
use crate::session::state::{Reads, Row, SaveState, Spares};
use crate::session::{SeqId, Session};

/// One sequence of a speculative step: `(sequence, pending, k)`.
type Entry = (SeqId, u32, usize);

/// Checks, drafts, verifies (one verify program for one sequence unless `batched`, else one
/// batched-verify program) and keeps the accepted prefixes.
pub(crate) fn step(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[Entry],
    drafter: &mut dyn Drafter,
    batched: bool,
) -> Result<Vec<SpeculativeStep>, SessionError> {
    let (starts, width) = check(session, backend, batch, drafter, batched)?;
    // Drafts, all before the verify, in one call (a drafter may batch them); a failure
    // leaves nothing drafted.
    let requests = batch
        .iter()
        .map(|&(id, pending, k)| Ok((id, session.tokens(id)?, pending, k)))
        .collect::<Result<Vec<_>, SessionError>>()?;
    let drafts = drafter.draft_many(backend, &requests)?;
    drop(requests);
    let wrong = if drafts.len() != batch.len() {
        Some(format!(
            "{} drafts for {} sequences",
            drafts.len(),
            batch.len()
        ))
    } else {
        let mut pairs = batch.iter().zip(&drafts);
        pairs
            .find(|((_, _, k), d)| d.tokens.len() != *k)
            .map(|(&(id, _, k), d)| {
                format!("{} tokens for sequence {id}, asked for {k}", d.tokens.len())
            })
    };
    if let Some(what) = wrong {
        settle_all(backend, drafter, batch, None);
        return Err(SessionError::Rewind(format!("the drafter proposed {what}")));
    }
    match verify_drafts(session, backend, batch, &starts, &drafts, width, batched) {
        Ok(steps) => {
            let kept: Vec<usize> = steps.iter().map(|s| s.accepted + 1).collect();
            settle_all(backend, drafter, batch, Some(&kept));
            Ok(steps)
        }
        Err(e) => {
            settle_all(backend, drafter, batch, None);
            Err(e)
        }
    }
}

/// Everything a speculative step can be refused for before it drafts; returns each
/// sequence's length and the verify program's width.
fn check(
    session: &Session<'_>,
    backend: &dyn GpuBackend,
    batch: &[Entry],
    drafter: &dyn Drafter,
    batched: bool,
) -> Result<(Vec<usize>, usize), SessionError> {
    let exec = session.exec;
    exec.check_usable(backend)?;
    if batch.is_empty() {
        return Err(SessionError::Empty("speculative step of no sequences"));
    }
    let vocab = exec.config.vocab_size;
    let shapes = exec.instance.program_shapes();
    // Only a program that keeps its recurrent snapshots can be rolled back: the verify
    // programs up to the serve's `speculative_rows`.
    let widest = shapes.widest_speculative(Mode::Verify).unwrap_or(1);
    if drafter.vocab_size() != vocab {
        return Err(SessionError::DraftVocab {
            draft: drafter.vocab_size(),
            target: vocab,
        });
    }
    let limit = session.position_limit();
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
        let seq = session.seq(id)?;
        if seq.len + k + 1 > limit {
            return Err(SessionError::PositionPastLimit {
                seq: id,
                position: seq.len + k,
                limit,
            });
        }
        pages_needed += exec.pools().pages.needed(seq.len + k + 1, seq.pages.len());
        starts.push(seq.len);
    }
    exec.pools().pages.check(pages_needed)?;
    let total: usize = batch.iter().map(|&(_, _, k)| k + 1).sum();
    let width = if batched {
        shapes
            .narrowest(Mode::VerifyBatch, total)
            .filter(|&width| shapes.keeps_snapshots(Mode::VerifyBatch, width))
            .ok_or(SessionError::TooWide {
                asked: total,
                widest: shapes.widest_speculative(Mode::VerifyBatch).unwrap_or(0),
            })?
    } else {
        total
    };
    Ok((starts, width))
}

/// Tells the drafter what each sequence kept and where its rows lay (None: nothing, the step
/// failed).
fn settle_all(
    backend: &mut dyn GpuBackend,
    drafter: &mut dyn Drafter,
    batch: &[Entry],
    kept: Option<&[usize]>,
) {
    let mut row = 0;
    for (i, &(id, _, k)) in batch.iter().enumerate() {
        let verdict = kept.map_or(Verdict::NOTHING, |kept| Verdict { kept: kept[i], row });
        row += k + 1;
        if let Err(e) = drafter.settle(backend, id, verdict) {
            let kept = verdict.kept;
            tracing::warn!(error = %e, seq = id, kept, "the drafter could not settle a speculative step");
        }
    }
}

/// Verifies every sequence's `[pending, drafts…]` in one program of `width` rows and keeps
/// each accepted prefix.
fn verify_drafts(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[Entry],
    starts: &[usize],
    drafts: &[Draft],
    width: usize,
    batched: bool,
) -> Result<Vec<SpeculativeStep>, SessionError> {
    let exec = session.exec;
    let rows = verify_rows(session, batch, starts, drafts, width)?;
    let program: &Program = if batched {
        exec.program(Mode::VerifyBatch, width)?
    } else {
        exec.verify_program(width)?
    };
    // Each sequence's new state goes into a spare it takes only once every acceptance
    // succeeded: a step or an acceptance that fails leaves every slot as it was, no copy.
    let ids: Vec<SeqId> = batch.iter().map(|&(id, _, _)| id).collect();
    let spares = Spares::lend(exec, &ids)?;
    let advance: Vec<(SeqId, usize)> = batch.iter().map(|&(id, _, k)| (id, k + 1)).collect();
    let logits = session.step(
        backend,
        program,
        &rows,
        &advance,
        SaveState::IntoSpares(&spares),
        Reads::Live,
    )?;
    // Acceptance for every sequence first, so a refusal keeps nothing of the step.
    let acceptances = match accept_all(session, batch, drafts, &logits) {
        Ok(acceptances) => acceptances,
        Err(e) => {
            // Nothing of the step stays: back to before `pending` (a sequence new to the
            // step keeps the zeroed slot it read; its spare goes back).
            let block = exec.layout.kv_block_size;
            for (&(id, _, _), &start) in batch.iter().zip(starts) {
                session.truncate(id, start, start.div_ceil(block));
            }
            return Err(e);
        }
    };
    spares.keep(session);
    let steps = keep_accepted(session, backend, batch, drafts, &acceptances, &logits)?;
    // The step itself (its state saved by this caller) left recycling to here.
    session.recycle_out_of_window(ids.iter().copied());
    Ok(steps)
}

/// The verify program's rows: each sequence's `[pending, drafts…]` at its next positions, in
/// batch order, padded to `width`; a draft token outside the vocabulary is refused.
fn verify_rows(
    session: &Session<'_>,
    batch: &[Entry],
    starts: &[usize],
    drafts: &[Draft],
    width: usize,
) -> Result<Vec<Row>, SessionError> {
    let vocab = session.exec.config.vocab_size;
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
        // Every row keeps its recurrent snapshot: the step rolls back to the last accepted.
        let fed = std::iter::once(pending).chain(draft.tokens.iter().copied());
        rows.extend(fed.enumerate().map(|(i, token)| Row {
            snapshot: true,
            ..Row::live(id, token, start + i)
        }));
    }
    rows.resize(width, Row::PADDING);
    Ok(rows)
}

/// Each sequence's acceptance of its draft under its sampler (greedy unless set; a sampled
/// sequence's draft from a greedy drafter is accepted as drawn from a one-hot q).
fn accept_all(
    session: &mut Session<'_>,
    batch: &[Entry],
    drafts: &[Draft],
    logits: &[f32],
) -> Result<Vec<Acceptance>, SessionError> {
    let vocab = session.exec.config.vocab_size;
    let mut acceptances = Vec::with_capacity(batch.len());
    let mut at = 0;
    for (&(id, _, k), draft) in batch.iter().zip(drafts) {
        let target: Vec<&[f32]> = logits[at * vocab..(at + k + 1) * vocab]
            .chunks(vocab)
            .collect();
        at += k + 1;
        let seq = session
            .seqs
            .get_mut(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        let sampler = seq.sampler.get_or_insert_with(Sampler::greedy);
        let acceptance = match &draft.probs {
            _ if sampler.is_greedy() => crate::sampling::accept_greedy(&target, &draft.tokens),
            Some(probs) => sampler.accept(&target, probs, &draft.tokens),
            // A greedy drafter drew each token from a one-hot distribution: the exact rule
            // with that q (accept with probability p(x), else resample from p without x)
            // keeps the target's distribution — never a silent greedy acceptance.
            None => sampler.accept(&target, &one_hot(&draft.tokens, vocab), &draft.tokens),
        };
        acceptances.push(acceptance?);
    }
    Ok(acceptances)
}

/// The one-hot distributions a greedy drafter drew `tokens` from.
fn one_hot(tokens: &[u32], vocab: usize) -> Vec<Vec<f64>> {
    tokens
        .iter()
        .map(|&t| {
            let mut q = vec![0.0; vocab];
            if let Some(p) = q.get_mut(t as usize) {
                *p = 1.0;
            }
            q
        })
        .collect()
}

/// Keeps each sequence's accepted prefix (its state from the kernels' snapshot after the last
/// kept row), records its acceptance and says what the step did.
fn keep_accepted(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[Entry],
    drafts: &[Draft],
    acceptances: &[Acceptance],
    logits: &[f32],
) -> Result<Vec<SpeculativeStep>, SessionError> {
    let vocab = session.exec.config.vocab_size;
    let mut steps = Vec::with_capacity(batch.len());
    let mut first = 0;
    for ((&(id, _, k), draft), acceptance) in batch.iter().zip(drafts).zip(acceptances) {
        let n = acceptance.accepted;
        session.keep_verify_rows(backend, id, first, k + 1, n)?;
        if let Some(seq) = session.seqs.get_mut(&id) {
            Acceptances::record(&mut seq.acceptances, k, n);
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
    Ok(steps)
}
