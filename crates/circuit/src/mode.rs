//! Step modes: what a program's rows mean (see DESIGN.md, "Modes and rows").

use std::fmt;
use std::str::FromStr;

use crate::error::CircuitError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// One sequence, one new token.
    Decode,
    /// n sequences, one token each, n a padded width of the ladder.
    MultiSeq,
    /// One sequence, K consecutive tokens with causal attention among them.
    Verify,
    /// A prompt chunk whose logits nobody reads: verify's rows through the model's circuit
    /// without its LM head ([`crate::prune::without_logits`]), so it writes exactly the KV
    /// pages and recurrent state a verify program of the same width writes.
    Prefill,
    /// Several sequences, k_i consecutive tokens each.
    VerifyBatch,
    /// The MTP draft head's step.
    Draft,
}

impl Mode {
    pub const ALL: &'static [Mode] = &[
        Mode::Decode,
        Mode::MultiSeq,
        Mode::Verify,
        Mode::Prefill,
        Mode::VerifyBatch,
        Mode::Draft,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Decode => "decode",
            Mode::MultiSeq => "multi_seq",
            Mode::Verify => "verify",
            Mode::Prefill => "prefill",
            Mode::VerifyBatch => "verify_batch",
            Mode::Draft => "draft",
        }
    }

    /// The mode whose row layout this one shares: verify for prefill (one sequence's
    /// consecutive tokens), else the mode itself. Rules, recurrent kernels and traffic read a
    /// prefill program's rows as a verify program's.
    pub fn rows_as(self) -> Mode {
        match self {
            Mode::Prefill => Mode::Verify,
            mode => mode,
        }
    }

    /// Whether a program of this mode keeps its recurrent state's per-row snapshots (the state
    /// after each row): verify and batched verify, whose rows a speculative step may roll back
    /// to. A prefill chunk chains its rows too, but nothing rolls it back, so it keeps none.
    /// Such a program writes a row's snapshot only where the step's `MetaField::KeepSnapshots`
    /// flag asks (a speculative step's rows), not for a prompt's chunk run through it; and
    /// only up to the serve's `speculative_rows` (`ProgramShapes::keeps_snapshots`).
    pub fn keeps_snapshots(self) -> bool {
        matches!(self, Mode::Verify | Mode::VerifyBatch)
    }

    /// Checks that `rows` makes sense for this mode.
    pub fn check_rows(self, rows: usize) -> Result<(), CircuitError> {
        let why = match self {
            _ if rows == 0 => Some("a plan needs at least one row"),
            // Every byte count of a built circuit fits at up to MAX_ROWS rows.
            _ if rows > crate::ir::MAX_ROWS => {
                Some("more rows than MAX_ROWS (2^18: 4096 sequences of 64 tokens, 512 of 512)")
            }
            Mode::Decode if rows != 1 => Some("decode runs exactly one row"),
            Mode::MultiSeq | Mode::Verify | Mode::Prefill | Mode::VerifyBatch if rows < 2 => {
                Some("needs at least two rows")
            }
            _ => None,
        };
        match why {
            Some(why) => Err(CircuitError::BadRows {
                mode: self.as_str().to_string(),
                rows,
                why: why.to_string(),
            }),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = CircuitError;

    fn from_str(s: &str) -> Result<Mode, CircuitError> {
        Mode::ALL
            .iter()
            .copied()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| CircuitError::UnknownMode(s.to_string()))
    }
}
