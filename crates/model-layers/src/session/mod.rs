//! `Session`: decoding over a `CircuitExec` — live sequences with their block tables and
//! state slots, prefill through verify programs in chunks, decode, multi-sequence steps on the
//! narrowest compiled width, speculative steps, and taking a sequence back.
//!
//! Where to read: this file is the whole public API — every public method of `Session`, each
//! a few lines that call into the rooms below.
//! - `decode`: plain decoding, how prefill, verify, decode, multi-seq and batched-verify steps
//!   lay out their rows.
//! - `state`: the mechanisms every step relies on — `step` (one all-or-nothing step: check,
//!   take pages, slots and spare slots, pick the route, upload the step's `meta::StepMeta`,
//!   run its program's graph or launches, read the logits), `spares` (the spare slots a step
//!   writes its sequences' new recurrent state into, taken on success), `window` (sliding
//!   windows: KV pages wholly outside every layer's window, with a margin for rollback, go
//!   back to the pool) and `rewind` (taking a sequence back to an earlier length).
//! - `speculative`: speculative decoding — the step, the `Drafter` trait, the built-in
//!   drafters (`ModelDrafter`, `MtpDrafter`), `SpecPolicy` and the rollback story.
//!
//! Sharing: the pools (KV pages, recurrent-state slots) belong to the `CircuitExec`
//! (`exec::Pools`, one per exec, behind a lock), not to a session. Several sessions may run
//! on one exec, one step at a time (each step takes the one backend mutably); they share its
//! pages and slots, never the same one, and a session gives back everything its sequences
//! hold when it is dropped.
//!
//! Invariants: per-step values reach a program only through the workspace's metadata region,
//! uploaded before the run; a step — and a whole prefill — that fails validation (token id,
//! position, pages, slots, backend) or fails to run leaves every sequence as it was, its
//! recurrent state included; every page and slot a session's sequences hold is held by no
//! other sequence of any session (the scratch page a block table names in place of a
//! recycled page is no page held: it is never read through that entry, never given back).

mod ahead;
mod decode;
mod fork;
mod pipeline;
mod speculative;
mod state;

use std::collections::BTreeMap;

use solder_circuit::{Mode, RouteCondition};
use solder_gpu_runtime::GpuBackend;

use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::graphs::StepRun;
use crate::sampling::{Sampler, Sampling, SamplingError};
use state::{Reads, SaveState};

pub use fork::ParkedSession;
pub use speculative::{
    Acceptances, Draft, Drafter, ModelDrafter, MtpDrafter, SpecPolicy, SpeculativeStep, Verdict,
};
pub use state::RewindPoint;

/// A sequence's name in its session.
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
    sampler: Option<Sampler>,
    /// Speculative steps' acceptance history.
    acceptances: Acceptances,
    /// The cuts its history took: which rewind points still describe it.
    cuts: state::Cuts,
}

/// Live sequences decoding over one `CircuitExec`, their pages and slots lent by its pools.
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
    /// Set by `next_tokens_ahead` around a step fed on the device: the ids slot the step
    /// before's greedy tokens go to (they also become this step's tokens).
    feed: Option<usize>,
    /// The open pipeline (`start_pipeline`), if any: every other step and every change to a
    /// sequence is refused while it is open.
    pipeline: Option<pipeline::Pipeline>,
}

/// Sessions and sequences.
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
            feed: None,
            pipeline: None,
            last_program: None,
            last_run: None,
        }
    }

    /// The exec the session runs on (its config, layout and compiled program shapes).
    pub fn exec(&self) -> &'e CircuitExec {
        self.exec
    }

    /// Lets steps take runtime routes (the default) or keeps them on primary programs.
    pub fn set_routes(&mut self, on: bool) {
        self.routes = on;
    }

    /// A new, empty sequence; it takes pages (and a state slot) at its first step.
    pub fn add_sequence(&mut self) -> SeqId {
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.insert(id, Sequence::default());
        id
    }

    /// Ends a sequence and returns its pages and slot to the pools.
    pub fn end_sequence(&mut self, id: SeqId) -> Result<(), SessionError> {
        self.refuse_piped("end_sequence")?;
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
}

/// What a session and its sequences hold now.
impl Session<'_> {
    /// The tokens a sequence's cache holds, in order.
    pub fn tokens(&self, id: SeqId) -> Result<&[u32], SessionError> {
        self.seq(id).map(|s| s.tokens.as_slice())
    }

    /// How many tokens a sequence's cache holds (the position its next token takes).
    pub fn seq_len(&self, id: SeqId) -> Result<usize, SessionError> {
        self.seq(id).map(|s| s.len)
    }

    /// The pages holding a sequence's tokens, in order (its block table).
    pub fn block_table(&self, id: SeqId) -> Result<&[u32], SessionError> {
        self.seq(id).map(|s| s.pages.as_slice())
    }

    /// Pages a sequence holds in the pool (placeholders of recycled pages not counted).
    pub fn held_pages(&self, id: SeqId) -> Result<usize, SessionError> {
        self.seq(id).map(|s| crate::exec::PagePool::live(&s.pages))
    }

    /// Pages free in the exec's pool (shared with every session on the exec).
    pub fn free_page_count(&self) -> usize {
        self.exec.pools().pages.free_count()
    }

    /// Positions kept before a sequence's length under sliding windows: the widest window
    /// plus the widest verify width (see `state::window`); `None` when pages are never
    /// recycled (a layer attends over the whole context).
    pub fn kv_keep(&self) -> Option<usize> {
        state::window::kv_keep(self.exec)
    }

    /// Whether the model keeps recurrent state (so a length alone cannot be rewound).
    pub fn recurrent(&self) -> bool {
        self.exec.layout.states.iter().any(|r| r.slot_bytes > 0)
    }

    /// The (mode, rows, arm condition) of the program the last step ran.
    pub fn last_program(&self) -> Option<(Mode, usize, Option<RouteCondition>)> {
        self.last_program
    }

    /// How the last step that reached its run ran (graph replayed, captured, or eager).
    pub fn last_run(&self) -> Option<StepRun> {
        self.last_run
    }

    /// The mode a step of `n` sequences runs in.
    pub fn mode_for(n: usize) -> Mode {
        if n == 1 {
            Mode::Decode
        } else {
            Mode::MultiSeq
        }
    }

    fn seq(&self, id: SeqId) -> Result<&Sequence, SessionError> {
        self.seqs.get(&id).ok_or(SessionError::UnknownSequence(id))
    }
}

/// Plain decoding: every step all or nothing (see `decode` and `state::step`).
impl Session<'_> {
    /// Feeds a prompt through verify programs in chunks (the widest compiled width that fits,
    /// then narrower; a last single token through decode); returns the logits of every
    /// prompt position, `[tokens.len() * vocab]`. All or nothing: a failed chunk takes back
    /// the chunks before it.
    pub fn prefill(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        decode::prefill(self, backend, id, tokens, Reads::Live)
    }

    /// Feeds a prompt as `prefill` does and returns the last position's logits alone,
    /// `[vocab]`: every chunk but the last runs a prefill program (no LM head) and copies
    /// nothing back (what an engine that samples on its own side wants). A last chunk of 16
    /// rows or more runs headless too, and its last token runs again through decode for the
    /// logits (the same bytes; not on a model with recurrent state, whose state that token
    /// would advance twice).
    pub fn prefill_last(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        decode::prefill(self, backend, id, tokens, Reads::Last)
    }

    /// One token of one sequence; returns its logits, `[vocab]`.
    pub fn decode(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        token: u32,
    ) -> Result<Vec<f32>, SessionError> {
        self.verify(backend, id, &[token])
    }

    /// K consecutive tokens of one sequence in one verify step (K = 1 runs decode); returns
    /// their logits, `[K * vocab]`.
    pub fn verify(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        decode::verify(self, backend, id, tokens, SaveState::PerStep, Reads::Live)
    }

    /// One token for each of several sequences, on the narrowest multi-seq width that holds
    /// them (padding rows run on the scratch page); returns each sequence's logits in order.
    pub fn multi_seq_step(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32)],
    ) -> Result<Vec<Vec<f32>>, SessionError> {
        decode::multi_seq_step(self, backend, batch)
    }

    /// Several sequences' consecutive tokens in one batched-verify step (the narrowest
    /// compiled width that holds them all, padded); returns each sequence's logits,
    /// `[tokens_i * vocab]`, the bytes verifying it alone gives.
    pub fn verify_batch(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32])],
    ) -> Result<Vec<Vec<f32>>, SessionError> {
        decode::verify_batch(self, backend, batch)
    }
}

/// Decoding by tokens: each sequence's next token drawn on the host by its own sampler
/// (`set_sampling`; greedy by default), only the live rows' logits copied back (the last
/// row's alone for a prefill). A sequence's tokens depend only on its seed, its parameters
/// and its own logits — which parity proves are the same in every row of every width — so
/// they are the same whatever batch it runs in. A step that ran and whose logits cannot be
/// sampled (no finite logit) is an error naming the sequence; its fed token stays in the cache.
impl Session<'_> {
    /// Prefills `tokens` (as `prefill_last`) and returns the sequence's next token, drawn
    /// from the last position's logits.
    pub fn prefill_next(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<u32, SessionError> {
        let logits = self.prefill_last(backend, id, tokens)?;
        self.draw(id, &logits)
    }

    /// Prefills `tokens` (as `prefill`) and reads nothing back: a chunk of a prompt before
    /// its last (chunked prefill interleaved with decode steps; `prefill_next` ends it). Its
    /// chunks run prefill programs, which skip the LM head (a single token runs decode).
    pub fn prefill_chunk(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<(), SessionError> {
        decode::prefill(self, backend, id, tokens, Reads::Nothing).map(drop)
    }

    /// One step feeding one token to each sequence (decode for one, else the narrowest
    /// multi-seq width that holds them); returns each sequence's next token, in order. When
    /// every sequence samples greedily (the default), the tokens are taken on the device
    /// (`pick::argmax`) and only they are read back, 4 bytes a sequence instead of its logits
    /// row: the same tokens the host's greedy sampler draws from those logits.
    pub fn next_tokens(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32)],
    ) -> Result<Vec<u32>, SessionError> {
        if self.all_greedy(batch) {
            let ids = decode::next_greedy(self, backend, batch)?;
            return self.take_ids(batch, ids);
        }
        let logits = match batch {
            [(id, token)] => vec![self.decode(backend, *id, *token)?],
            _ => self.multi_seq_step(backend, batch)?,
        };
        batch
            .iter()
            .zip(&logits)
            .map(|(&(id, _), row)| self.draw(id, row))
            .collect()
    }

    /// One step of decode rows beside a prompt chunk (chunked prefill sharing a step with
    /// decode, as vLLM schedules it): each of `decode`'s sequences takes one token and
    /// `chunk`'s sequence takes its tokens, in the narrowest batched-verify program that holds
    /// them all (`ServeShape::verify_batch_widths`). Returns each decode sequence's next token,
    /// drawn as `next_tokens` draws it (on the device when every one is greedy); the chunk's
    /// logits are not read. Every sequence gets the bytes of its own steps: the decode rows
    /// those of `next_tokens`, the chunk those of `prefill_chunk` (batched verify's rows are
    /// each sequence's alone; parity checks it at every width).
    pub fn mixed_step(
        &mut self,
        backend: &mut dyn GpuBackend,
        decode: &[(SeqId, u32)],
        chunk: (SeqId, &[u32]),
    ) -> Result<Vec<u32>, SessionError> {
        let greedy = self.all_greedy(decode);
        match decode::mixed_step(self, backend, decode, chunk, greedy)? {
            decode::Mixed::Ids(ids) => self.take_ids(decode, ids),
            decode::Mixed::Logits(logits) => {
                let vocab = self.exec.config.vocab_size;
                decode
                    .iter()
                    .zip(logits.chunks(vocab))
                    .map(|(&(id, _), row)| self.draw(id, row))
                    .collect()
            }
        }
    }

    /// `steps` greedy steps of `batch` (as `steps` calls of `next_tokens`, each fed the tokens
    /// of the one before), enqueued back to back: each step after the first takes its tokens
    /// from the step before on the device, and every step's tokens are read back in one copy
    /// at the end, so the host waits once, not once a step. Returns each sequence's `steps`
    /// tokens, the same as `next_tokens` step by step gives. `steps` is 1 to
    /// `IDS_SLOTS`; a sampled sequence or a model with recurrent state runs step by step.
    pub fn next_tokens_ahead(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32)],
        steps: usize,
    ) -> Result<Vec<Vec<u32>>, SessionError> {
        ahead::next_tokens_ahead(self, backend, batch, steps)
    }

    /// Greedy decoding of `batch` with steps in flight, for a serving loop: enqueues the first
    /// `ahead` steps (the first fed each sequence's token, each later one the step before's
    /// tokens, taken on the device), reading nothing back. Each `pipeline_next` then enqueues
    /// one more and returns the oldest step's tokens, so the device always has `ahead` steps
    /// queued while the host handles the tokens it got. `ahead` is 1 to `IDS_SLOTS - 1`
    /// (and at most the widest verify width for a windowed model). Greedy sequences only, on
    /// a model without recurrent state; every other step and change to a sequence is refused
    /// until `stop_pipeline`. On any error the pipeline is closed as `stop_pipeline` closes it.
    pub fn start_pipeline(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32)],
        ahead: usize,
    ) -> Result<(), SessionError> {
        pipeline::start(self, backend, batch, ahead)
    }

    /// The open pipeline's next step's tokens, one per sequence in the order `start_pipeline`
    /// was given: the same tokens `next_tokens` step by step gives. Waits for that step's ids
    /// alone, after enqueueing one more step.
    pub fn pipeline_next(
        &mut self,
        backend: &mut dyn GpuBackend,
    ) -> Result<Vec<u32>, SessionError> {
        pipeline::next(self, backend)
    }

    /// Closes the open pipeline (nothing to do without one) without waiting for the device:
    /// the steps whose tokens `pipeline_next` did not return are taken back, so each sequence
    /// holds the tokens fed in the steps returned, its last returned token pending (feed it to
    /// the next step, as after `next_tokens`).
    pub fn stop_pipeline(&mut self, backend: &mut dyn GpuBackend) -> Result<(), SessionError> {
        pipeline::stop(self, backend)
    }

    /// Whether a pipeline is open (`start_pipeline` until `stop_pipeline` or an error).
    pub fn pipeline_open(&self) -> bool {
        self.pipeline.is_some()
    }

    /// Refuses `call` while a pipeline is open, except the pipeline's own steps.
    fn refuse_piped(&self, call: &'static str) -> Result<(), SessionError> {
        match &self.pipeline {
            Some(pipe) if !pipe.stepping => Err(SessionError::PipelineOpen { call }),
            _ => Ok(()),
        }
    }

    /// Whether every sequence of `batch` samples greedily (the default).
    fn all_greedy(&self, batch: &[(SeqId, u32)]) -> bool {
        batch.iter().all(|(id, _)| {
            self.seqs
                .get(id)
                .is_some_and(|s| s.sampler.as_ref().is_none_or(Sampler::is_greedy))
        })
    }

    /// The greedy tokens a step took on the device, as `draw` would give them: a row with no
    /// finite logit is the sampler's error, naming its sequence.
    fn take_ids(
        &mut self,
        batch: &[(SeqId, u32)],
        ids: Vec<Option<u32>>,
    ) -> Result<Vec<u32>, SessionError> {
        let vocab = self.exec.config.vocab_size;
        batch
            .iter()
            .zip(ids)
            .map(|(&(id, _), token)| {
                if let Some(seq) = self.seqs.get_mut(&id) {
                    seq.sampler.get_or_insert_with(Sampler::greedy);
                }
                token.ok_or(SessionError::SampledAt {
                    seq: id,
                    source: SamplingError::NoFiniteLogit { vocab },
                })
            })
            .collect()
    }

    /// Sequence `id`'s next token from its logits row, by its sampler.
    fn draw(&mut self, id: SeqId, logits: &[f32]) -> Result<u32, SessionError> {
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        seq.sampler
            .get_or_insert_with(Sampler::greedy)
            .sample(logits)
            .map_err(|e| SessionError::SampledAt { seq: id, source: e })
    }
}

/// Taking a sequence back: the one rollback story (see `state::rewind` and `speculative`).
impl Session<'_> {
    /// The sequence's length and recurrent state now (the state copied to the host): a point
    /// `rewind` can take it back to.
    pub fn rewind_point(
        &self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
    ) -> Result<RewindPoint, SessionError> {
        state::rewind::point(self, backend, id)
    }

    /// Takes the sequence back to `point`: its length, block table, token history and
    /// recurrent state. Refused, with nothing changed, if the point was taken on another
    /// exec, in another session or from another sequence, if the sequence's history was cut
    /// below the point since it was taken (or it is shorter than the point), if the point's
    /// state does not match the sequence's slot, or if a page the sequence's next step would
    /// read went back to the pool under a sliding window.
    pub fn rewind(
        &mut self,
        backend: &mut dyn GpuBackend,
        point: &RewindPoint,
    ) -> Result<(), SessionError> {
        self.refuse_piped("rewind")?;
        state::rewind::rewind(self, backend, point)
    }

    /// Takes a sequence back to its first `len` tokens: `rewind` without a point, for a
    /// sequence that holds no recurrent state (a model without recurrent layers, or an MTP
    /// head's sequence, which takes no state slot); one that holds some is refused (take a
    /// rewind point before the tokens to drop).
    pub fn truncate_to(&mut self, id: SeqId, len: usize) -> Result<(), SessionError> {
        self.refuse_piped("truncate_to")?;
        state::rewind::truncate_to(self, id, len)
    }
}

/// Speculative decoding (see `speculative`): one entry point for one sequence, one for a batch.
impl Session<'_> {
    /// Sets how sequence `id` picks its tokens in every step kind (greedy by default):
    /// `prefill_next` and `next_tokens` draw from its logits, speculative steps accept drafts
    /// by the exact rule under it (a greedy drafter's draft as a one-hot distribution).
    pub fn set_sampling(&mut self, id: SeqId, sampling: Sampling) -> Result<(), SessionError> {
        self.refuse_piped("set_sampling")?;
        let sampler = Sampler::new(sampling)?;
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        seq.sampler = Some(sampler);
        Ok(())
    }

    /// The acceptance history of sequence `id`.
    pub fn acceptances(&self, id: SeqId) -> Result<Acceptances, SessionError> {
        self.seq(id).map(|s| s.acceptances)
    }

    /// The k (draft length) `policy` gives sequence `id`'s next speculative step, from its
    /// acceptance history; a policy no step could follow is refused by field.
    pub fn next_k(&self, id: SeqId, policy: SpecPolicy) -> Result<usize, SessionError> {
        let shapes = self.exec.instance.program_shapes();
        let widest = shapes.widest_speculative(Mode::Verify);
        policy.check(widest.unwrap_or(1).saturating_sub(1))?;
        Ok(policy.k(self.acceptances(id)?.mean))
    }

    /// One speculative step of sequence `id`: `drafter` proposes `k` tokens to follow
    /// `pending` (the token the sequence feeds next), the verify program of k + 1 rows feeds
    /// `[pending, drafts…]`, and the sequence keeps `pending` plus the accepted drafts. The
    /// returned `tokens` end with the target's own next token: the next step's `pending`.
    /// All or nothing: a refusal or failure leaves the sequence (and the drafter, told
    /// nothing was kept) as it was.
    pub fn speculative_step(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        pending: u32,
        k: usize,
        drafter: &mut dyn Drafter,
    ) -> Result<SpeculativeStep, SessionError> {
        let batch = [(id, pending, k)];
        let mut steps = speculative::step(self, backend, &batch, drafter, false)?;
        steps
            .pop()
            .ok_or(SessionError::Empty("speculative step of no sequences"))
    }

    /// One speculative step of several sequences, each `(sequence, pending, k)` with its own
    /// k, verified together in one batched-verify program (the narrowest width that holds
    /// Σ (k + 1) rows, padded); each sequence ends exactly as `speculative_step` would leave
    /// it. All or nothing: a refusal or failure leaves every sequence as it was.
    pub fn speculative_step_many(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, u32, usize)],
        drafter: &mut dyn Drafter,
    ) -> Result<Vec<SpeculativeStep>, SessionError> {
        speculative::step(self, backend, batch, drafter, true)
    }

    /// A drafter's hook: one step of the exec's MTP head program (circuit's `Mode::Draft`)
    /// for sequence `id` over `tokens` at its next positions, each paired with the hidden row
    /// already written to the head's input (`CircuitExec::write_hidden`/`chain_hidden`);
    /// returns the rows' logits, `[tokens.len() * vocab]`. The sequence's pages hold the head
    /// layer's KV; it takes no state slot (the head keeps no recurrent state), so
    /// `truncate_to` takes it back. All or nothing.
    pub fn mtp_step(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        state::step::mtp_step_many(self, backend, &[(id, tokens)])
    }

    /// `mtp_step` for several sequences in one head program: each `(sequence, tokens)` at its
    /// next positions, rows in batch order (the hidden rows written in that order), padded to
    /// the narrowest draft width; returns the rows' logits, `[Σ tokens.len() * vocab]`. Each
    /// row's bytes are those `mtp_step` gives it alone. All or nothing.
    pub fn mtp_step_many(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32])],
    ) -> Result<Vec<f32>, SessionError> {
        state::step::mtp_step_many(self, backend, batch)
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
