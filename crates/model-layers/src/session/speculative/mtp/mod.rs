//! `MtpDrafter`: Qwen3-Next's multi-token-prediction head as a `Drafter`, on the target's own
//! exec (`MtpDrafter::new`). The head's step is its own program (circuit's `Mode::Draft`,
//! `families::build_draft`, run by `Session::mtp_step`): the pair (target hidden\[p\], token\[p+1\]) at position p predicts
//! token p+2, and the head's own output row (`HiddenRows::Draft`) stands in for the target's
//! hidden state at the next draft position, so the k steps of a draft chain (vLLM's MTP proposer does
//! the same with `num_speculative_tokens > num_nextn_predict_layers`).
//!
//! Where the target's hidden rows come from: every target program leaves its final-norm rows
//! in the workspace's hidden region (a serve with `draft_widths` keeps them); the drafter copies the rows
//! of each target step of a sequence before another step overwrites them — the verify rows it
//! kept at `settle`, and the rows of plain steps through `MtpDrafter::prefill`/`decode` (or
//! `observe`, after any other single target step). A `draft` needs every committed position's
//! hidden row: one never observed is refused by name (the head cannot be caught up without
//! it).
//!
//! The head's KV cache: the head's layer (`kv.{num_hidden_layers}`) lives on pages of the
//! drafter's own sequence (one per target sequence, from the exec's shared pool), position p
//! holding the pair at p. Positions paired with a target hidden row stay; the positions of
//! the draft past the target's kept tokens are taken back at `settle` (KV only: the head
//! keeps no recurrent state, and its sequences take no state slot).
//!
//! It is written on public API alone: `Session::mtp_step_many` and `truncate_to` on its own
//! session, `CircuitExec::{read_hidden_at, write_hidden, chain_hidden}` for the hidden rows,
//! and `Verdict::row` to find a sequence's kept rows in the verify program that ran (so it
//! needs nothing of the order sequences were drafted in). Parts: this file (the drafter, its
//! observations, the `Drafter` protocol), `head` (running the head over one sequence:
//! catch-up), `drafts` (drafting several sequences in one head program per draft step).
//!
//! Invariant: after `settle`, a head sequence holds exactly the positions whose pair is final
//! (a target hidden row and the token the target kept after it), and the rows still to pair
//! continue it without a gap.

use std::collections::BTreeMap;

use half::bf16;
use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use super::{Draft, Drafter, Verdict};
use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::exec::HiddenRows;
use crate::sampling::{Sampler, Sampling};
use crate::session::{SeqId, Session};

mod drafts;
mod head;

/// The head's state for one target sequence.
#[derive(Debug)]
struct HeadSeq {
    /// The drafter's own sequence: its length is the positions whose head KV is written.
    id: SeqId,
    /// Target hidden rows (`hidden` bf16 values each) for the positions after the head
    /// sequence's final ones, observed and not yet paired with their next token.
    rows: Vec<bf16>,
    /// The last `draft`: the head length before it (positions kept final after it), and the
    /// hidden row it paired with `pending` (put back if the target keeps nothing).
    drafted_from: Option<(usize, Vec<bf16>)>,
    /// How this sequence's drafts are drawn from the head's logits.
    sampler: Sampler,
}

/// The MTP head as a drafter: greedy by default, or sampling under `Sampling`.
pub struct MtpDrafter<'e> {
    exec: &'e CircuitExec,
    /// The head's sequences: their pages hold the head layer's KV.
    session: Session<'e>,
    seqs: BTreeMap<SeqId, HeadSeq>,
    sampling: Sampling,
}

impl<'e> MtpDrafter<'e> {
    /// The MTP head of `exec` as a greedy drafter for sessions on it; refused for an
    /// exec that serves no MTP head programs.
    pub fn new(exec: &'e CircuitExec) -> Result<MtpDrafter<'e>, SessionError> {
        if !exec.has_draft_head() {
            return Err(SessionError::DraftHead(format!(
                "{} has no MTP draft head: build it with draft_widths (qwen3_next checkpoints \
                 with `mtp.*` tensors only)",
                exec.instance.circuit.name
            )));
        }
        Ok(MtpDrafter {
            exec,
            session: Session::new(exec),
            seqs: BTreeMap::new(),
            sampling: Sampling::Greedy,
        })
    }

    /// A drafter sampling its drafts under `sampling` (each sequence's generator seeded from
    /// it), handing their distributions to speculative sampling's accept/resample rule.
    pub fn sampled(
        exec: &'e CircuitExec,
        sampling: Sampling,
    ) -> Result<MtpDrafter<'e>, SessionError> {
        Sampler::new(sampling)?;
        Ok(MtpDrafter {
            sampling,
            ..MtpDrafter::new(exec)?
        })
    }

    /// The head's own session (its sequences' block tables hold the head layer's KV).
    pub fn session(&self) -> &Session<'e> {
        &self.session
    }

    /// The head's sequence for target sequence `seq` (in `session()`).
    pub fn head_sequence(&self, seq: SeqId) -> Option<SeqId> {
        self.seqs.get(&seq).map(|h| h.id)
    }

    /// Positions of target sequence `seq` whose head KV is final, and rows observed past them.
    pub fn paired(&self, seq: SeqId) -> Option<(usize, usize)> {
        let head = self.seqs.get(&seq)?;
        let len = self.session.seq_len(head.id).ok()?;
        Some((len, head.rows.len() / self.exec.config.hidden_size))
    }

    /// Refuses a target session on another exec (the head reads this exec's hidden rows).
    fn check_target(&self, target: &Session<'_>) -> Result<(), SessionError> {
        if std::ptr::eq(target.exec(), self.exec) {
            return Ok(());
        }
        Err(SessionError::DraftHead(
            "the target session runs on another exec than the draft head's: the head reads the \
             hidden rows of its own exec's target programs"
                .into(),
        ))
    }

    fn head(&mut self, seq: SeqId) -> &mut HeadSeq {
        let (session, sampling) = (&mut self.session, self.sampling);
        self.seqs.entry(seq).or_insert_with(|| HeadSeq {
            id: session.add_sequence(),
            rows: Vec::new(),
            drafted_from: None,
            // Checked when the drafter was made.
            sampler: Sampler::new(sampling).unwrap_or_else(|_| Sampler::greedy()),
        })
    }

    /// Records the first `rows` target hidden rows now in the workspace as those of target
    /// sequence `seq`'s positions `first..first + rows`: call it right after a target step of
    /// `seq` that fed them (the next target step overwrites them). They must continue what the
    /// drafter holds for `seq` without a gap.
    pub fn observe(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        first: usize,
        rows: usize,
    ) -> Result<(), SessionError> {
        self.observe_at(backend, seq, first, 0, rows)
    }

    /// `observe` for a step whose rows of `seq` start at program row `row` (its place in a
    /// multi-seq or batched-verify step).
    pub fn observe_at(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        first: usize,
        row: usize,
        rows: usize,
    ) -> Result<(), SessionError> {
        let values = self
            .exec
            .read_hidden_at(backend, HiddenRows::Target, row, rows)?;
        self.observe_rows(seq, first, values)
    }

    /// `observe` with the rows given (bf16 `\[n, hidden\]`: e.g. another engine's final hidden
    /// rows of the same model), for positions `first..first + n`.
    pub fn observe_rows(
        &mut self,
        seq: SeqId,
        first: usize,
        values: Vec<bf16>,
    ) -> Result<(), SessionError> {
        let hidden = self.exec.config.hidden_size;
        if !values.len().is_multiple_of(hidden) {
            return Err(SessionError::DraftHead(format!(
                "sequence {seq}: {} hidden values are not whole rows of {hidden}",
                values.len()
            )));
        }
        let rows = values.len() / hidden;
        // Checked before `head` makes an entry: a refused call leaves the drafter as it was.
        let (len, held) = match self.seqs.get(&seq) {
            Some(head) => (self.session.seq_len(head.id)?, head.rows.len() / hidden),
            None => (0, 0),
        };
        let limit = self
            .exec
            .config
            .max_position_embeddings
            .min(self.exec.layout.max_seq_len);
        if first.checked_add(rows).is_none_or(|end| end > limit) {
            return Err(SessionError::Argument {
                field: "first",
                message: format!(
                    "sequence {seq}: {rows} hidden row(s) from position {first} reach past the \
                     position limit {limit}"
                ),
            });
        }
        if Some(first) != len.checked_add(held) {
            return Err(SessionError::DraftHead(format!(
                "sequence {seq}: hidden rows observed for positions {first}..{} but the head \
                 holds positions up to {} (every target step of the sequence must be observed, \
                 in order)",
                // Checked against the position limit above: no wrap.
                first + rows,
                len.saturating_add(held)
            )));
        }
        self.head(seq).rows.extend(values);
        Ok(())
    }

    /// Prefills target sequence `seq` of `target` with `tokens`, one target program at a time
    /// (the widest verify width the rest fills, a last single token by decode, as
    /// `Session::prefill` chunks), observing each program's hidden rows. Returns the logits.
    /// Each chunk is its own all-or-nothing prefill: a failure keeps the chunks before it.
    pub fn prefill(
        &mut self,
        backend: &mut dyn GpuBackend,
        target: &mut Session<'_>,
        seq: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        self.check_target(target)?;
        if tokens.is_empty() {
            return Err(SessionError::Empty("prefill of no tokens"));
        }
        let shapes = self.exec.instance.program_shapes();
        let mut logits = Vec::new();
        let mut at = 0;
        while at < tokens.len() {
            let width = shapes
                .widest_within(Mode::Verify, tokens.len() - at)
                .unwrap_or(1);
            let first = target.seq_len(seq)?;
            logits.extend(target.prefill(backend, seq, &tokens[at..at + width])?);
            self.observe(backend, seq, first, width)?;
            at += width;
        }
        Ok(logits)
    }

    /// One plain decode step of target sequence `seq`, observed.
    pub fn decode(
        &mut self,
        backend: &mut dyn GpuBackend,
        target: &mut Session<'_>,
        seq: SeqId,
        token: u32,
    ) -> Result<Vec<f32>, SessionError> {
        self.check_target(target)?;
        let first = target.seq_len(seq)?;
        let logits = target.decode(backend, seq, token)?;
        self.observe(backend, seq, first, 1)?;
        Ok(logits)
    }
}

impl Drafter for MtpDrafter<'_> {
    fn vocab_size(&self) -> usize {
        self.exec.config.vocab_size
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

    /// Every sequence's draft step in one head program (see `drafts`).
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
        let Verdict { kept, row } = verdict;
        let Some((before, last_row)) = self.seqs.get_mut(&seq).and_then(|h| h.drafted_from.take())
        else {
            return Ok(());
        };
        let id = self.head(seq).id;
        if kept == 0 {
            // Nothing kept: the pair with `pending` is not final; its hidden row is pending again.
            self.session.truncate_to(id, before)?;
            self.head(seq).rows = last_row;
            return Ok(());
        }
        // `pending` was kept: its pair (at the last committed position) is final; the draft
        // positions after it used the head's own rows and go. The verify's first `kept` rows
        // are the target's hidden rows of the positions it kept, from `row` on.
        let len = before + 1;
        self.session.truncate_to(id, len)?;
        self.observe_at(backend, seq, len, row, kept)
    }

    fn forget(&mut self, seq: SeqId) {
        if let Some(head) = self.seqs.remove(&seq) {
            let _ = self.session.end_sequence(head.id);
        }
    }
}
