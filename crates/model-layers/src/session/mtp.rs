//! `MtpDrafter`: Qwen3-Next's multi-token-prediction head as a `Drafter`, on the target's own
//! exec (`CircuitExec::draft_runner`). The head's step is the draft program (`Mode::Draft`,
//! `families::build_draft`): the pair (target hidden[p], token[p+1]) at position p predicts
//! token p+2, and the head's own output row (`HiddenRows::Draft`) stands in for the target's
//! hidden state at the next draft position, so k draft steps chain (vLLM's MTP proposer does
//! the same with `num_speculative_tokens > num_nextn_predict_layers`).
//!
//! Where the target's hidden rows come from: every target program leaves its final-norm rows
//! in the workspace's hidden region (the draft serve keeps them); the drafter copies the rows
//! of each target step of a sequence before another step overwrites them — the verify rows it
//! kept at `settle`, and the rows of plain steps through `MtpDrafter::prefill`/`decode` (or
//! `observe`, after any other single target step). A `draft` needs every committed position's
//! hidden row: one never observed is refused by name (the head cannot be caught up without
//! it).
//!
//! The head's KV cache: the head's layer (`kv.{num_hidden_layers}`) lives on pages of the
//! drafter's own sequence (one per target sequence, from the exec's shared pool), position p
//! holding the pair at p. Positions paired with a target hidden row stay; the draft positions
//! past the target's kept tokens are taken back at `settle` (KV only: the head keeps no
//! recurrent state, and its sequences take no state slot).
//!
//! Invariant: after `settle`, a head sequence holds exactly the positions whose pair is final
//! (a target hidden row and the token the target kept after it), and the rows still to pair
//! continue it without a gap.

use std::collections::BTreeMap;

use half::bf16;
use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use super::draft::{Draft, Drafter};
use super::{SeqId, Session};
use crate::bytes::f32s_from_bytes;
use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::hidden::HiddenRows;
use crate::meta::{MetaRow, StepMeta, SCRATCH_SLOT};
use crate::sampling::{Sampler, Sampling};

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

/// The drafts of one speculative step, in draft order (the order of the verify program's
/// rows): each sequence, its verify rows (k + 1), and whether it was settled.
#[derive(Debug, Default)]
struct Round(Vec<(SeqId, usize, bool)>);

impl Round {
    /// A draft for `seq` of `rows` verify rows; a new round once every earlier one settled.
    fn drafted(&mut self, seq: SeqId, rows: usize) {
        if self.0.iter().all(|&(_, _, settled)| settled) {
            self.0.clear();
        }
        self.0.retain(|&(s, _, _)| s != seq);
        self.0.push((seq, rows, false));
    }

    /// The first verify row of `seq`'s rows (the rows of the sequences drafted before it), and
    /// marks it settled; None when `seq` has no unsettled draft in the round.
    fn settle(&mut self, seq: SeqId) -> Option<usize> {
        let at = self
            .0
            .iter()
            .position(|&(s, _, settled)| s == seq && !settled)?;
        self.0[at].2 = true;
        Some(self.0[..at].iter().map(|&(_, rows, _)| rows).sum())
    }
}

/// The MTP draft head as a drafter: greedy by default, or sampling under `Sampling`.
///
/// A speculative step's verify program lays out its sequences' rows in the order they were
/// drafted (`Session::speculative_step_many` drafts and verifies in batch order), so `settle`
/// finds a sequence's kept rows after the rows of the sequences drafted before it in the same
/// step.
pub struct MtpDrafter<'e> {
    exec: &'e CircuitExec,
    /// The head's sequences: their pages hold the head layer's KV.
    session: Session<'e>,
    seqs: BTreeMap<SeqId, HeadSeq>,
    sampling: Sampling,
    round: Round,
}

impl CircuitExec {
    /// The MTP draft head of this exec as a drafter for sessions on it; refused for an exec
    /// that serves no draft programs.
    pub fn draft_runner(&self) -> Result<MtpDrafter<'_>, SessionError> {
        MtpDrafter::new(self)
    }
}

impl<'e> MtpDrafter<'e> {
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
            round: Round::default(),
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
        if std::ptr::eq(target.exec, self.exec) {
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

    /// `observe` with the rows given (bf16 `[n, hidden]`: e.g. another engine's final hidden
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

    /// Runs the head over `tokens` paired with the hidden `rows` at the head sequence's next
    /// positions, in chunks of the widest draft width; returns every pair's logits
    /// (`[n * vocab]`) and the last pair's row in the last chunk (where the head's own hidden
    /// output lies).
    fn run_pairs(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
        rows: &[bf16],
    ) -> Result<(Vec<f32>, usize), SessionError> {
        let shapes = self.exec.instance.program_shapes();
        let widest = shapes.widest(Mode::Draft).unwrap_or(1);
        let hidden = self.exec.config.hidden_size;
        let mut logits = Vec::with_capacity(tokens.len() * self.exec.config.vocab_size);
        let (mut at, mut last) = (0, 0);
        while at < tokens.len() {
            let n = (tokens.len() - at).min(widest);
            self.exec
                .write_hidden(backend, &rows[at * hidden..(at + n) * hidden])?;
            logits.extend(self.session.head_step(backend, id, &tokens[at..at + n])?);
            last = n - 1;
            at += n;
        }
        Ok((logits, last))
    }

    /// Checks that the head of `seq` can pair with `committed` (every position's hidden row
    /// observed, its paired tokens still the target's); returns the head sequence, its length
    /// and the rows taken out of it (put back by the caller on failure).
    fn take_rows(
        &mut self,
        seq: SeqId,
        committed: &[u32],
    ) -> Result<(SeqId, usize, Vec<bf16>), SessionError> {
        let hidden = self.exec.config.hidden_size;
        let id = self.head(seq).id;
        let len = self.session.seq_len(id)?;
        let held = self.head(seq).rows.len() / hidden;
        let total = committed.len();
        if total == 0 || held == 0 || len + held != total {
            return Err(SessionError::DraftHead(format!(
                "sequence {seq}: the target holds {total} token(s) but the head has hidden rows \
                 for positions 0..{}: feed the target through MtpDrafter::prefill/decode (or \
                 call observe after each plain step) so every position's row is seen",
                len + held
            )));
        }
        if self.session.tokens(id)? != &committed[1..=len] {
            return Err(SessionError::DraftHead(format!(
                "sequence {seq}: the head paired tokens the target no longer holds: forget and \
                 restart it"
            )));
        }
        Ok((id, len, std::mem::take(&mut self.head(seq).rows)))
    }

    /// Puts the head of `seq` back to `len` positions and `rows` after a failure; returns `e`.
    fn put_back<T>(
        &mut self,
        seq: SeqId,
        (id, len, rows): (SeqId, usize, Vec<bf16>),
        e: SessionError,
    ) -> Result<T, SessionError> {
        let block = self.block();
        self.session.truncate(id, len, len.div_ceil(block));
        self.head(seq).rows = rows;
        Err(e)
    }

    /// Teacher-forced catch-up: pairs every observed position of `seq` but the last with the
    /// committed token after it (the target sequence holds `committed`) and returns each new
    /// pair's logits, `[pairs * vocab]`: at position p, the head's prediction of token p + 2.
    /// The last position's row waits for the token after it (the next `draft`'s `pending`).
    pub fn catch_up(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        let hidden = self.exec.config.hidden_size;
        let (id, len, rows) = self.take_rows(seq, committed)?;
        let pairs = committed.len() - 1 - len;
        let tokens = committed[len + 1..].to_vec();
        match self.run_pairs(backend, id, &tokens, &rows[..pairs * hidden]) {
            Ok((logits, _)) => {
                self.head(seq).rows = rows[pairs * hidden..].to_vec();
                Ok(logits)
            }
            Err(e) => self.put_back(seq, (id, len, rows), e),
        }
    }

    fn draft_inner(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        committed: &[u32],
        pending: u32,
        k: usize,
    ) -> Result<Draft, SessionError> {
        let (hidden, vocab) = (self.exec.config.hidden_size, self.exec.config.vocab_size);
        let (id, len, rows) = self.take_rows(seq, committed)?;
        // The pairs still to make: (hidden[p], committed[p + 1]) up to the last committed
        // position, paired with `pending`; its logits give the first draft.
        let tokens: Vec<u32> = committed[len + 1..]
            .iter()
            .copied()
            .chain(std::iter::once(pending))
            .collect();
        let last_row = rows[rows.len() - hidden..].to_vec();
        let (all, mut row) = match self.run_pairs(backend, id, &tokens, &rows) {
            Ok(done) => done,
            Err(e) => return self.put_back(seq, (id, len, rows), e),
        };
        let mut logits = all[all.len() - vocab..].to_vec();
        let mut drafts = Vec::with_capacity(k);
        let mut probs = Vec::with_capacity(k);
        for i in 0..k {
            let (token, p) = match self.head(seq).sampler.sample_with_probs(&logits) {
                Ok(drawn) => drawn,
                Err(e) => return self.put_back(seq, (id, len, rows), e.into()),
            };
            drafts.push(token);
            probs.push(p);
            if i + 1 == k {
                break;
            }
            // The head's own output row stands in for the target's at the next position.
            let step = self
                .exec
                .chain_hidden(backend, row, 0)
                .map_err(SessionError::from)
                .and_then(|()| self.session.head_step(backend, id, &[token]));
            match step {
                Ok(next) => (logits, row) = (next, 0),
                Err(e) => return self.put_back(seq, (id, len, rows), e),
            }
        }
        // Final now: the positions before the last committed one (their tokens are committed);
        // the last one's pair with `pending` is final once the target keeps `pending`.
        self.head(seq).drafted_from = Some((committed.len() - 1, last_row));
        self.round.drafted(seq, k + 1);
        let greedy = self.head(seq).sampler.is_greedy();
        Ok(Draft {
            tokens: drafts,
            probs: (!greedy).then_some(probs),
        })
    }

    fn block(&self) -> usize {
        self.exec.layout.kv_block_size
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
        if k == 0 {
            let shapes = self.exec.instance.program_shapes();
            let widest = shapes.widest(Mode::Verify).unwrap_or(1);
            return Err(SessionError::DraftLength {
                k,
                widest: widest.saturating_sub(1),
            });
        }
        self.draft_inner(backend, seq, committed, pending, k)
    }

    fn settle(
        &mut self,
        backend: &mut dyn GpuBackend,
        seq: SeqId,
        kept: usize,
    ) -> Result<(), SessionError> {
        let block = self.block();
        let row = self.round.settle(seq).unwrap_or(0);
        let Some((before, last_row)) = self.seqs.get_mut(&seq).and_then(|h| h.drafted_from.take())
        else {
            return Ok(());
        };
        let id = self.head(seq).id;
        if kept == 0 {
            // Nothing kept: the pair with `pending` is not final; its hidden row is pending again.
            self.session.truncate(id, before, before.div_ceil(block));
            self.head(seq).rows = last_row;
            return Ok(());
        }
        // `pending` was kept: its pair (at the last committed position) is final; the draft
        // positions after it used the head's own rows and go. The verify's first `kept` rows
        // are the target's hidden rows of the positions it kept (after the rows of the
        // sequences drafted before it in this step).
        let len = before + 1;
        self.session.truncate(id, len, len.div_ceil(block));
        self.observe_at(backend, seq, len, row, kept)
    }

    fn forget(&mut self, seq: SeqId) {
        self.round.0.retain(|&(s, _, _)| s != seq);
        if let Some(head) = self.seqs.remove(&seq) {
            let _ = self.session.end_sequence(head.id);
        }
    }
}

impl Session<'_> {
    /// One draft-program step of head sequence `id` over `tokens` at its next positions (the
    /// hidden rows already written): pages grown as needed (given back on failure), no state
    /// slot (the head keeps no recurrent state). Returns the rows' logits.
    fn head_step(
        &mut self,
        backend: &mut dyn GpuBackend,
        id: SeqId,
        tokens: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        let exec = self.exec;
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
        let width = exec
            .instance
            .program_shapes()
            .narrowest(Mode::Draft, n)
            .ok_or(SessionError::TooWide {
                asked: n,
                widest: exec
                    .instance
                    .program_shapes()
                    .widest(Mode::Draft)
                    .unwrap_or(0),
            })?;
        let program = exec.program(Mode::Draft, width)?;
        let limit = self.position_limit();
        let seq = self
            .seqs
            .get_mut(&id)
            .ok_or(SessionError::UnknownSequence(id))?;
        let start = seq.len;
        if start + n > limit {
            return Err(SessionError::PositionPastLimit {
                seq: id,
                position: start + n - 1,
                limit,
            });
        }
        let pages_before = seq.pages.len();
        {
            let mut pools = exec.pools();
            pools
                .pages
                .check(pools.pages.needed(start + n, pages_before))?;
            pools.pages.grow(&mut seq.pages, start + n)?;
        }
        let ran = (|| -> Result<Vec<f32>, SessionError> {
            let rows: Vec<MetaRow<'_>> = (0..width)
                .map(|i| match tokens.get(i) {
                    Some(&token) => MetaRow::Live {
                        token,
                        position: start + i,
                        pages: &seq.pages,
                        state_slot: SCRATCH_SLOT,
                    },
                    None => MetaRow::Padding,
                })
                .collect();
            let meta = StepMeta::new(&exec.layout.meta, &rows)?;
            meta.upload(backend, exec.default_stream(), exec.workspace())?;
            exec.run_step(backend, program)?;
            let mut raw = vec![0u8; n * vocab * 4];
            backend.copy_d2h(exec.workspace().offset(exec.layout.logits_offset), &mut raw)?;
            Ok(f32s_from_bytes(&raw))
        })();
        match ran {
            Ok(logits) => {
                seq.len += n;
                seq.tokens.extend_from_slice(tokens);
                self.last_program = Some((Mode::Draft, width, None));
                Ok(logits)
            }
            Err(e) => {
                exec.pools().pages.shrink(&mut seq.pages, pages_before);
                Err(e)
            }
        }
    }
}
