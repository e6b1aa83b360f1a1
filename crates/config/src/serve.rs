//! [`ServeShape`]: the widths a build compiles programs for. Invariant after
//! [`validate`](ServeShape::validate): `max_batch` lies in `1..=MAX_BATCH`, every multi-seq width
//! in `2..=max_batch` (one sequence runs the decode program), every verify width in
//! `2..=MAX_VERIFY_WIDTH`, every batched-verify width in `2..=min(max_batch · MAX_VERIFY_WIDTH,
//! MAX_ROWS)`, every
//! list is strictly increasing, no width is zero, and `speculative_rows` is at most `MAX_ROWS`.

use crate::ConfigError;

/// Padded multi-sequence widths, cut at the serve's widest batch.
pub const DEFAULT_MULTI_SEQ_LADDER: [usize; 11] = [2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128];

/// Widest verify window (tokens of one sequence in one step): a speculative verify window, or
/// a prefill chunk (a prompt runs through the widest verify program it fills, so a chunk of
/// 512 tokens is `verify_widths` ending in 512).
pub const MAX_VERIFY_WIDTH: usize = 512;

/// Widest batch: 32x the 128 of the default shape.
pub const MAX_BATCH: usize = 4096;

/// The most rows one program may have (2^18: 4,096 sequences of 64 tokens, or 512 of 512):
/// small enough that every activation's bytes stay far below `u64::MAX` at the dims
/// `DIM_BOUNDS` allows.
pub const MAX_ROWS: usize = 1 << 18;

/// Rows one speculative step verifies at most, by default: the widest default batched verify
/// (and four times the widest default verify), so the default shape's every verify program may
/// speculate.
pub const DEFAULT_SPECULATIVE_ROWS: usize = 32;

/// The (mode, rows) a build compiles programs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeShape {
    pub max_batch: usize,
    pub multi_seq_ladder: Vec<usize>,
    pub verify_widths: Vec<usize>,
    /// Total rows of the batched-verify programs (several sequences, k_i tokens each, padded
    /// to the narrowest width that holds Σ k_i).
    pub verify_batch_widths: Vec<usize>,
    pub draft_widths: Vec<usize>,
    /// The most rows one speculative step verifies (k + 1 for one sequence, Σ (k_i + 1) over a
    /// batch): the verify and batched-verify programs up to this width keep the recurrent
    /// state's per-row snapshots a speculative step rolls back to, and the layout keeps slots
    /// for them (one recurrent state per row); a wider verify program serves prompt chunks
    /// only. 0: no speculative step, no snapshot slots.
    pub speculative_rows: usize,
}

impl Default for ServeShape {
    fn default() -> Self {
        ServeShape {
            max_batch: 128,
            multi_seq_ladder: ladder_up_to(128),
            verify_widths: default_verify_widths(),
            verify_batch_widths: default_verify_batch_widths(128),
            draft_widths: Vec::new(),
            speculative_rows: DEFAULT_SPECULATIVE_ROWS,
        }
    }
}

fn ladder_up_to(max_batch: usize) -> Vec<usize> {
    DEFAULT_MULTI_SEQ_LADDER
        .into_iter()
        .filter(|width| *width <= max_batch)
        .collect()
}

fn default_verify_widths() -> Vec<usize> {
    (2..=8).collect()
}

/// Batched verify over 4..32 rows (several sequences of a few draft tokens), cut at the
/// serve's widest batch so it never widens the workspace past the multi-seq programs.
fn default_verify_batch_widths(max_batch: usize) -> Vec<usize> {
    [4, 8, 16, 32]
        .into_iter()
        .filter(|w| *w <= max_batch)
        .collect()
}

impl ServeShape {
    /// The default shape with the ladder cut at `max_batch`, which must lie in
    /// `1..=MAX_BATCH`.
    pub fn with_max_batch(max_batch: usize) -> Result<ServeShape, ConfigError> {
        check_max_batch(max_batch)?;
        Ok(ServeShape {
            max_batch,
            multi_seq_ladder: ladder_up_to(max_batch),
            verify_widths: default_verify_widths(),
            verify_batch_widths: default_verify_batch_widths(max_batch),
            draft_widths: Vec::new(),
            speculative_rows: DEFAULT_SPECULATIVE_ROWS,
        })
    }

    /// Checks the invariants above; the error names the field and the offending width.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_max_batch(self.max_batch)?;
        check_widths(
            "multi_seq_ladder",
            &self.multi_seq_ladder,
            2,
            self.max_batch,
        )?;
        check_widths("verify_widths", &self.verify_widths, 2, MAX_VERIFY_WIDTH)?;
        check_widths(
            "verify_batch_widths",
            &self.verify_batch_widths,
            2,
            (self.max_batch * MAX_VERIFY_WIDTH).min(MAX_ROWS),
        )?;
        check_widths("draft_widths", &self.draft_widths, 1, self.max_batch)?;
        if self.speculative_rows > MAX_ROWS {
            return Err(ConfigError::ServeShape {
                field: "speculative_rows",
                problem: format!("is {}: expected 0..={MAX_ROWS}", self.speculative_rows),
            });
        }
        Ok(())
    }
}

fn check_max_batch(max_batch: usize) -> Result<(), ConfigError> {
    if !(1..=MAX_BATCH).contains(&max_batch) {
        return Err(ConfigError::ServeShape {
            field: "max_batch",
            problem: format!("is {max_batch}: expected 1..={MAX_BATCH}"),
        });
    }
    Ok(())
}

fn check_widths(
    field: &'static str,
    widths: &[usize],
    min: usize,
    max: usize,
) -> Result<(), ConfigError> {
    if let Some(width) = widths.iter().find(|w| !(min..=max).contains(*w)) {
        return Err(ConfigError::ServeShape {
            field,
            problem: format!("has width {width}: expected every width in {min}..={max}"),
        });
    }
    if let Some(pair) = widths.windows(2).find(|pair| pair[0] >= pair[1]) {
        return Err(ConfigError::ServeShape {
            field,
            problem: format!(
                "has {} before {}: expected strictly increasing widths",
                pair[0], pair[1]
            ),
        });
    }
    Ok(())
}
