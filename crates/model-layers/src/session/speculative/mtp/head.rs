//! Running the MTP head for `MtpDrafter` over one sequence: pairing observed target hidden
//! rows with the tokens after them (`catch_up`), and the checks every draft starts with
//! (`take_rows`); drafting itself is `drafts`. A failure puts the head sequence back to its
//! length and rows before the call.

use half::bf16;
use solder_circuit::Mode;
use solder_gpu_runtime::GpuBackend;

use super::MtpDrafter;
use crate::error::SessionError;
use crate::session::SeqId;

impl MtpDrafter<'_> {
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
            logits.extend(self.session.mtp_step(backend, id, &tokens[at..at + n])?);
            last = n - 1;
            at += n;
        }
        Ok((logits, last))
    }

    /// Checks that the head of `seq` can pair with `committed` (every position's hidden row
    /// observed, its paired tokens still the target's); returns the head sequence, its length
    /// and the rows taken out of it (put back by the caller on failure).
    pub(super) fn take_rows(
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
        self.session.truncate_to(id, len)?;
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
}
