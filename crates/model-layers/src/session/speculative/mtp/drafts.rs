//! Drafting for `MtpDrafter`, several sequences at once (`draft_batch`, behind both `draft`
//! and `draft_many`): each draft step runs the head over every sequence's rows in one draft
//! program (the narrowest width that holds them, padding rows on the scratch page), in chunks
//! of the widest draft width when they are more.
//!
//! A draft: the first step pairs each sequence's observed hidden rows with the committed
//! tokens after them and its last one with `pending`; each later step feeds one row per
//! sequence still drafting (its k not reached): its last drafted token, paired with the head's
//! own output row of its previous step.
//!
//! Invariant: a sequence's rows, logits and drafts are the bytes drafting it alone gives (a
//! draft program's rows do not depend on its width or on the other rows); a failure puts
//! every head sequence back to its length and rows before the call.

use half::bf16;
use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use super::MtpDrafter;
use crate::error::SessionError;
use crate::exec::HiddenRows;
use crate::session::{Draft, SeqId};

/// Where a head row's hidden input lies: given from the host, or the head's own output row of
/// the last draft program (still in the workspace's draft hidden region).
#[derive(Debug, Clone)]
enum Hidden {
    Host(Vec<bf16>),
    Device(usize),
}

/// One row of a head program: which sequence of the batch, its token and its hidden input.
#[derive(Debug)]
struct HeadRow {
    entry: usize,
    token: u32,
    hidden: Hidden,
}

/// What the head made of a sequence's last row in a step: that row's logits, and where its
/// output row lies (read back to the host when a later chunk overwrote it).
type Last = (Vec<f32>, Hidden);

/// One sequence's head before its draft: its head sequence, length and the rows taken out.
type Taken = (SeqId, usize, Vec<bf16>);

impl MtpDrafter<'_> {
    /// Drafts every `(seq, committed, pending, k)` of `batch`; a failure puts every head
    /// sequence back as it was.
    pub(super) fn draft_batch(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
    ) -> Result<Vec<Draft>, SessionError> {
        for (i, &(seq, _, _, k)) in batch.iter().enumerate() {
            if batch[..i].iter().any(|other| other.0 == seq) {
                return Err(SessionError::DuplicateSequence(seq));
            }
            if k == 0 {
                let shapes = self.exec.instance.program_shapes();
                let widest = shapes.widest_speculative(Mode::Verify).unwrap_or(1);
                return Err(SessionError::DraftLength {
                    k,
                    widest: widest.saturating_sub(1),
                });
            }
        }
        let mut taken = Vec::with_capacity(batch.len());
        for &(seq, committed, _, _) in batch {
            match self.take_rows(seq, committed) {
                Ok(head) => taken.push(head),
                Err(e) => return self.put_back_all(batch, taken, e),
            }
        }
        let drafts = match self.run_drafts(backend, batch, &taken) {
            Ok(drafts) => drafts,
            Err(e) => return self.put_back_all(batch, taken, e),
        };
        let hidden = self.exec.config.hidden_size;
        for (&(seq, committed, _, _), (_, _, rows)) in batch.iter().zip(&taken) {
            // Final now: the positions before the last committed one (their tokens are
            // committed); the last one's pair with `pending` is final once the target keeps
            // `pending`.
            let last_row = rows[rows.len() - hidden..].to_vec();
            self.head(seq).drafted_from = Some((committed.len() - 1, last_row));
        }
        Ok(drafts)
    }

    /// The draft steps of every sequence of `batch`, its head rows `taken`.
    fn run_drafts(
        &mut self,
        backend: &mut dyn GpuBackend,
        batch: &[(SeqId, &[u32], u32, usize)],
        taken: &[Taken],
    ) -> Result<Vec<Draft>, SessionError> {
        let hidden = self.exec.config.hidden_size;
        // The pairs still to make: (hidden[p], committed[p + 1]) up to the last committed
        // position, paired with `pending`; each sequence's last pair gives its first draft.
        let mut rows = Vec::new();
        for (entry, (&(_, committed, pending, _), (_, len, held))) in
            batch.iter().zip(taken).enumerate()
        {
            let tokens = committed[len + 1..].iter().chain(std::iter::once(&pending));
            let inputs = held.chunks_exact(hidden);
            rows.extend(tokens.zip(inputs).map(|(&token, row)| HeadRow {
                entry,
                token,
                hidden: Hidden::Host(row.to_vec()),
            }));
        }
        let ids: Vec<SeqId> = taken.iter().map(|&(id, _, _)| id).collect();
        let mut last = self.run_head(backend, &ids, rows)?;
        let mut drafts: Vec<Draft> = batch
            .iter()
            .map(|&(_, _, _, k)| Draft {
                tokens: Vec::with_capacity(k),
                probs: Some(Vec::with_capacity(k)),
            })
            .collect();
        let widest_k = batch.iter().map(|&(_, _, _, k)| k).max().unwrap_or(0);
        for step in 0..widest_k {
            let mut rows = Vec::new();
            for (entry, &(seq, _, _, k)) in batch.iter().enumerate() {
                if step >= k {
                    continue;
                }
                let (logits, output) = last[entry].take().ok_or_else(|| {
                    SessionError::DraftHead(format!(
                        "sequence {seq}: the head step left no logits for draft {step}"
                    ))
                })?;
                let (token, p) = self.head(seq).sampler.sample_with_probs(&logits)?;
                let draft = &mut drafts[entry];
                draft.tokens.push(token);
                draft.probs.get_or_insert_with(Vec::new).push(p);
                if step + 1 < k {
                    // The head's own output row stands in for the target's at the next position.
                    rows.push(HeadRow {
                        entry,
                        token,
                        hidden: output,
                    });
                }
            }
            if rows.is_empty() {
                break;
            }
            last = self.run_head(backend, &ids, rows)?;
        }
        for (&(seq, ..), draft) in batch.iter().zip(&mut drafts) {
            if self.head(seq).sampler.is_greedy() {
                draft.probs = None;
            }
        }
        Ok(drafts)
    }

    /// Runs the head over `rows` (each sequence's rows in position order; `ids[entry]` its
    /// head sequence) in programs of at most the widest draft width; returns, per entry, its
    /// last row's logits and where that row's output lies.
    fn run_head(
        &mut self,
        backend: &mut dyn GpuBackend,
        ids: &[SeqId],
        mut rows: Vec<HeadRow>,
    ) -> Result<Vec<Option<Last>>, SessionError> {
        let vocab = self.exec.config.vocab_size;
        let shapes = self.exec.instance.program_shapes();
        let widest = shapes.widest(Mode::Draft).unwrap_or(1);
        if rows.len() > widest {
            // The first chunk overwrites the output rows the later ones read: read them first.
            for row in &mut rows {
                if let Hidden::Device(at) = row.hidden {
                    let values = self
                        .exec
                        .read_hidden_at(backend, HiddenRows::Draft, at, 1)?;
                    row.hidden = Hidden::Host(values);
                }
            }
        }
        // Rows given from the host first (written in one copy), then the chained ones; stable,
        // so each sequence's rows keep their order.
        rows.sort_by_key(|row| matches!(row.hidden, Hidden::Device(_)));
        let mut last_index = vec![None; ids.len()];
        for (i, row) in rows.iter().enumerate() {
            last_index[row.entry] = Some(i);
        }
        let mut last: Vec<Option<Last>> = vec![None; ids.len()];
        let chunks = rows.len().div_ceil(widest);
        for (c, chunk) in rows.chunks(widest).enumerate() {
            let host: Vec<bf16> = chunk
                .iter()
                .filter_map(|row| match &row.hidden {
                    Hidden::Host(values) => Some(values.as_slice()),
                    Hidden::Device(_) => None,
                })
                .flatten()
                .copied()
                .collect();
            if !host.is_empty() {
                self.exec.write_hidden(backend, &host)?;
            }
            for (j, row) in chunk.iter().enumerate() {
                if let Hidden::Device(from) = row.hidden {
                    self.exec.chain_hidden(backend, from, j)?;
                }
            }
            // Consecutive rows of one sequence go as one run of tokens.
            let mut runs: Vec<(SeqId, Vec<u32>)> = Vec::new();
            for row in chunk {
                match runs.last_mut() {
                    Some((id, tokens)) if *id == ids[row.entry] => tokens.push(row.token),
                    _ => runs.push((ids[row.entry], vec![row.token])),
                }
            }
            let batch: Vec<(SeqId, &[u32])> =
                runs.iter().map(|(id, t)| (*id, t.as_slice())).collect();
            let logits = self.session.mtp_step_many(backend, &batch)?;
            for (j, row) in chunk.iter().enumerate() {
                if last_index[row.entry] != Some(c * widest + j) {
                    continue;
                }
                let output = if c + 1 == chunks {
                    Hidden::Device(j)
                } else {
                    // A later chunk overwrites it.
                    let values = self.exec.read_hidden_at(backend, HiddenRows::Draft, j, 1)?;
                    Hidden::Host(values)
                };
                last[row.entry] = Some((logits[j * vocab..(j + 1) * vocab].to_vec(), output));
            }
        }
        Ok(last)
    }

    /// Puts every head sequence of `taken` back to its length and rows after a failure;
    /// returns `e`.
    fn put_back_all<T>(
        &mut self,
        batch: &[(SeqId, &[u32], u32, usize)],
        taken: Vec<Taken>,
        e: SessionError,
    ) -> Result<T, SessionError> {
        for (&(seq, ..), (id, len, rows)) in batch.iter().zip(taken) {
            if let Err(truncate) = self.session.truncate_to(id, len) {
                tracing::warn!(error = %truncate, seq, "the MTP head could not take back a draft");
            }
            self.head(seq).rows = rows;
        }
        Err(e)
    }
}
