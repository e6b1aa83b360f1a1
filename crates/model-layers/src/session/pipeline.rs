//! Greedy decoding with steps in flight (`Session::start_pipeline`, `pipeline_next`,
//! `stop_pipeline`): the loop a server runs, where the device never waits for the host. Each
//! call of `pipeline_next` enqueues one more step, then waits for the oldest step not yet
//! returned, that step's ids alone, so `ahead` steps stay queued behind the one waited for
//! while the host detokenises, checks stop strings and streams text.
//!
//! How a step's tokens travel: step j + 1 takes step j's tokens on the device, as
//! `next_tokens_ahead` does (`pick::argmax` over step j's logits, launched once step j + 1's
//! metadata is uploaded, into its token field and ids slot `j % IDS_SLOTS`). Right after that
//! argmax the pipeline's own stream copies the slot into pinned host memory
//! (`GpuBackend::copy_d2h_async`), ordered after the argmax by an event and overlapping step
//! j + 1's kernels. Before an argmax writes a slot again, the model stream waits for the copy
//! that last read it (one event a slot), so a slot is never rewritten under a pending read.
//!
//! Bookkeeping: as in `next_tokens_ahead`, a step fed on the device records its rows' tokens
//! as 0, and `pipeline_next` writes the real ones in once read. The sequences advance as the
//! steps are enqueued; `stop_pipeline` (and any error) takes back the steps whose tokens were
//! not returned, so a sequence holds exactly the tokens fed in the steps returned, the last
//! returned token pending (as after `next_tokens`). A row with no finite logit ends the
//! pipeline with its step kept, as `next_tokens` keeps it, and the error names the sequence.
//!
//! While a pipeline is open the session refuses every other step and every change to a
//! sequence (`SessionError::PipelineOpen`): the device holds steps the host has not seen.
//! Greedy sequences only, on a model without recurrent state (a take-back cannot restore it);
//! for a windowed model `ahead` is at most the rollback the window keeps (`Session::kv_keep`).

use std::collections::VecDeque;

use solder_circuit::Mode;
use solder_gpu_runtime::{DevicePtr, EventId, GpuBackend, ReadbackId, StreamId};

use super::{decode, SeqId, Session};
use crate::error::SessionError;
use crate::layout::IDS_SLOTS;
use crate::sampling::{Sampler, SamplingError};

/// An open pipeline's state, owned by its session.
pub(super) struct Pipeline {
    batch: Vec<SeqId>,
    /// Each sequence's length before the pipeline's first step.
    start: Vec<usize>,
    /// Steps enqueued (step i fed from step i - 1 on the device, i > 0).
    enqueued: usize,
    /// Steps whose tokens `pipeline_next` returned.
    returned: usize,
    /// The readbacks queued, oldest first: step index and its copy.
    reads: VecDeque<(usize, ReadbackId)>,
    /// The stream the copies run on, and the events that order them.
    handles: Handles,
    /// Per ids slot, whether its `Handles::read` event was recorded (a copy read the slot).
    read: Vec<bool>,
    /// Set while the pipeline runs one of its own steps (the session refuses others).
    pub(super) stepping: bool,
}

/// `Session::start_pipeline`.
pub(super) fn start(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, u32)],
    ahead: usize,
) -> Result<(), SessionError> {
    session.refuse_piped("start_pipeline")?;
    check(session, batch, ahead)?;
    let start = batch
        .iter()
        .map(|&(id, _)| session.seq_len(id))
        .collect::<Result<Vec<_>, _>>()?;
    let handles = Handles::make(backend)?;
    session.pipeline = Some(Pipeline {
        batch: batch.iter().map(|&(id, _)| id).collect(),
        start,
        enqueued: 0,
        returned: 0,
        reads: VecDeque::new(),
        handles,
        read: vec![false; IDS_SLOTS],
        stepping: false,
    });
    // Step 0 takes the caller's tokens, steps 1.. the step before's on the device.
    let mut result = enqueue(session, backend, Some(batch));
    for _ in 1..ahead {
        if result.is_err() {
            break;
        }
        result = enqueue(session, backend, None);
    }
    match result {
        Ok(()) => Ok(()),
        Err(e) => fail(session, backend, e),
    }
}

/// `Session::pipeline_next`.
pub(super) fn next(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
) -> Result<Vec<u32>, SessionError> {
    if session.pipeline.is_none() {
        return Err(SessionError::NoPipeline);
    }
    if let Err(e) = enqueue(session, backend, None) {
        return fail(session, backend, e);
    }
    let pipe = session.pipeline.as_mut().expect("checked above");
    let (step, readback) = pipe
        .reads
        .pop_front()
        .expect("the step just enqueued read one");
    debug_assert_eq!(step, pipe.returned);
    let mut raw = vec![0u8; pipe.batch.len() * 4];
    if let Err(e) = backend.take_readback(readback, &mut raw) {
        return fail(session, backend, e.into());
    }
    let ids: Vec<Option<u32>> = raw
        .chunks_exact(4)
        .map(|b| u32::try_from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok())
        .collect();
    pipe.returned += 1;
    if let Some(row) = ids.iter().position(Option::is_none) {
        // The step ran, so its token stays (as `next_tokens` keeps it); the steps after it ran
        // on token -1 and are taken back.
        let failed = SessionError::SampledAt {
            seq: pipe.batch[row],
            source: SamplingError::NoFiniteLogit {
                vocab: session.exec.config.vocab_size,
            },
        };
        return fail(session, backend, failed);
    }
    let tokens: Vec<u32> = ids.into_iter().flatten().collect();
    // Each token was fed to the step after: the placeholder it left is filled in.
    let at = pipe.returned;
    for ((id, start), token) in pipe.batch.iter().zip(&pipe.start).zip(&tokens) {
        if let Some(slot) = session
            .seqs
            .get_mut(id)
            .and_then(|seq| seq.tokens.get_mut(start + at))
        {
            *slot = *token;
        }
    }
    Ok(tokens)
}

/// `Session::stop_pipeline`.
pub(super) fn stop(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
) -> Result<(), SessionError> {
    match session.pipeline.is_some() {
        true => end(session, backend),
        false => Ok(()),
    }
}

/// The refusals of `start_pipeline`: nothing has run.
fn check(session: &Session<'_>, batch: &[(SeqId, u32)], ahead: usize) -> Result<(), SessionError> {
    let argument = |field, message: String| Err(SessionError::Argument { field, message });
    if !(1..IDS_SLOTS).contains(&ahead) {
        return argument(
            "ahead",
            format!("{ahead}: 1 to {} steps are queued ahead", IDS_SLOTS - 1),
        );
    }
    let rollback = session.exec.instance.program_shapes().widest(Mode::Verify);
    if let (Some(_), Some(widest)) = (session.kv_keep(), rollback) {
        if ahead > widest {
            return argument(
                "ahead",
                format!(
                    "{ahead}: a windowed model keeps pages for a take-back of {widest} tokens \
                     (its widest verify width), and stopping takes back `ahead`"
                ),
            );
        }
    }
    if batch.is_empty() {
        return Err(SessionError::Empty("start_pipeline: no sequences"));
    }
    if session.recurrent() {
        return argument(
            "start_pipeline",
            "the model keeps recurrent state, which stopping a pipeline could not take back; \
             use next_tokens"
                .into(),
        );
    }
    for &(id, _) in batch {
        session.seq(id)?;
        if !session.all_greedy(&[(id, 0)]) {
            return argument(
                "start_pipeline",
                format!("sequence {id} samples: its sampler needs its logits; use next_tokens"),
            );
        }
    }
    Ok(())
}

/// Enqueues the pipeline's next step: fed `batch`'s tokens (step 0) or the step before's on
/// the device, whose ids are then copied back. All or nothing, as every step.
fn enqueue(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: Option<&[(SeqId, u32)]>,
) -> Result<(), SessionError> {
    let pipe = session.pipeline.as_mut().expect("an open pipeline");
    let step = pipe.enqueued;
    let fed: Vec<(SeqId, u32)> = match batch {
        Some(batch) => batch.to_vec(),
        None => pipe.batch.iter().map(|&id| (id, 0)).collect(),
    };
    pipe.stepping = true;
    session.feed = step.checked_sub(1).map(|before| before % IDS_SLOTS);
    let ran = decode::greedy_step(session, backend, &fed);
    session.feed = None;
    let pipe = session.pipeline.as_mut().expect("an open pipeline");
    pipe.stepping = false;
    ran?;
    pipe.enqueued += 1;
    Ok(())
}

impl Pipeline {
    /// Before `pick::argmax` writes ids slot `slot` on `model`: waits for the copy that last
    /// read it.
    pub(super) fn before_ids(
        &self,
        backend: &mut dyn GpuBackend,
        model: StreamId,
        slot: usize,
    ) -> Result<(), SessionError> {
        if self.read[slot] {
            backend.wait_event(model, self.handles.read(slot))?;
        }
        Ok(())
    }

    /// After `pick::argmax` wrote `live` ids at `ids` (slot `slot`) on `model`: copies them
    /// back on the pipeline's stream, queued for the step before the one now running.
    pub(super) fn read_ids(
        &mut self,
        backend: &mut dyn GpuBackend,
        model: StreamId,
        (ids, slot, live): (DevicePtr, usize, usize),
    ) -> Result<(), SessionError> {
        let (copies, computed) = (self.handles.copies, self.handles.computed());
        backend.record_event(computed, model)?;
        backend.wait_event(copies, computed)?;
        let readback = backend.copy_d2h_async(copies, ids, live * 4)?;
        self.reads.push_back((self.enqueued - 1, readback));
        let recorded = backend.record_event(self.handles.read(slot), copies);
        self.read[slot] |= recorded.is_ok();
        recorded?;
        Ok(())
    }
}

/// Closes the pipeline after `error`, which it returns (a failure to close is logged).
fn fail<T>(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    error: SessionError,
) -> Result<T, SessionError> {
    if let Err(closing) = end(session, backend) {
        tracing::warn!(%closing, "closing the pipeline after an error");
    }
    Err(error)
}

/// Closes the pipeline: releases its readbacks, orders its stream's copies before the model
/// stream's later work, destroys its stream and events, and takes back every step whose tokens
/// were not returned. Each part is tried; the first failure is returned.
fn end(session: &mut Session<'_>, backend: &mut dyn GpuBackend) -> Result<(), SessionError> {
    let Some(pipe) = session.pipeline.take() else {
        return Err(SessionError::NoPipeline);
    };
    let model = session.exec.default_stream();
    let mut first: Option<SessionError> = None;
    let mut keep = |result: Result<(), SessionError>| {
        if let Err(e) = result {
            first.get_or_insert(e);
        }
    };
    for (_, readback) in &pipe.reads {
        keep(backend.release_readback(*readback).map_err(Into::into));
    }
    // Later work on the model stream (an argmax into a slot) waits for every copy.
    let (copies, computed) = (pipe.handles.copies, pipe.handles.computed());
    keep(
        backend
            .record_event(computed, copies)
            .and_then(|()| backend.wait_event(model, computed))
            .map_err(Into::into),
    );
    pipe.handles.destroy(backend);
    for (&id, &start) in pipe.batch.iter().zip(&pipe.start) {
        let len = start + pipe.returned;
        if session.seq_len(id).is_ok_and(|now| now > len) {
            keep(session.truncate_to(id, len));
        }
        if let Some(seq) = session.seqs.get_mut(&id) {
            seq.sampler.get_or_insert_with(Sampler::greedy);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Closes the pipeline without a backend (`Session::park`): the steps not returned are taken
/// back; its stream and events stay with the backend, which frees them when it drops.
pub(super) fn abandon(session: &mut Session<'_>) {
    let Some(pipe) = session.pipeline.take() else {
        return;
    };
    tracing::warn!(
        steps = pipe.enqueued - pipe.returned,
        "a pipeline left open is closed without its backend: its stream and events are kept"
    );
    for (&id, &start) in pipe.batch.iter().zip(&pipe.start) {
        let len = start + pipe.returned;
        if session.seq_len(id).is_ok_and(|now| now > len) {
            if let Err(error) = session.truncate_to(id, len) {
                tracing::warn!(%error, seq = id, "closing a pipeline");
            }
        }
    }
}

/// The copy stream and the events a pipeline makes: `events[0]` is recorded on the model
/// stream after each argmax (the copy stream waits for it), `events[1 + slot]` on the copy
/// stream after the copy that read ids slot `slot`.
struct Handles {
    copies: StreamId,
    events: Vec<EventId>,
}

impl Handles {
    /// All of them, or none: what was made is destroyed if making the rest fails.
    fn make(backend: &mut dyn GpuBackend) -> Result<Handles, SessionError> {
        let mut handles = Handles {
            copies: backend.create_stream()?,
            events: Vec::with_capacity(IDS_SLOTS + 1),
        };
        while handles.events.len() <= IDS_SLOTS {
            match backend.create_event() {
                Ok(event) => handles.events.push(event),
                Err(e) => {
                    handles.destroy(backend);
                    return Err(e.into());
                }
            }
        }
        Ok(handles)
    }

    fn computed(&self) -> EventId {
        self.events[0]
    }

    fn read(&self, slot: usize) -> EventId {
        self.events[1 + slot]
    }

    /// Destroys them; a failure is logged (work already queued still completes).
    fn destroy(self, backend: &mut dyn GpuBackend) {
        for event in self.events {
            if let Err(error) = backend.destroy_event(event) {
                tracing::warn!(%error, "pipeline: destroy_event");
            }
        }
        if let Err(error) = backend.destroy_stream(self.copies) {
            tracing::warn!(%error, "pipeline: destroy_stream");
        }
    }
}
