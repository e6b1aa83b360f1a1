//! `ServeShape`: the widths a build compiles programs for. Invariant after `validate`: every
//! multi-seq width lies in `2..=max_batch` (one sequence runs the decode program), every list
//! is strictly increasing, and no width is zero.

use crate::ConfigError;

/// Padded multi-sequence widths, cut at the serve's widest batch.
pub const DEFAULT_MULTI_SEQ_LADDER: [usize; 11] = [2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128];

/// Widest verify window (tokens of one sequence checked in one step).
const MAX_VERIFY_WIDTH: usize = 64;

/// The (mode, rows) a build compiles programs for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeShape {
    pub max_batch: usize,
    pub multi_seq_ladder: Vec<usize>,
    pub verify_widths: Vec<usize>,
    pub draft_widths: Vec<usize>,
}

impl Default for ServeShape {
    fn default() -> Self {
        ServeShape {
            max_batch: 128,
            multi_seq_ladder: ladder_up_to(128),
            verify_widths: default_verify_widths(),
            draft_widths: Vec::new(),
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

impl ServeShape {
    /// The default shape with the ladder cut at `max_batch`, which must be at least 1.
    pub fn with_max_batch(max_batch: usize) -> Result<ServeShape, ConfigError> {
        if max_batch == 0 {
            return Err(ConfigError::ServeShape {
                field: "max_batch",
                problem: "is 0: expected at least 1".to_string(),
            });
        }
        Ok(ServeShape {
            max_batch,
            multi_seq_ladder: ladder_up_to(max_batch),
            verify_widths: default_verify_widths(),
            draft_widths: Vec::new(),
        })
    }

    /// Checks the invariants above; the error names the field and the offending width.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_batch == 0 {
            return Err(ConfigError::ServeShape {
                field: "max_batch",
                problem: "is 0: expected at least 1".to_string(),
            });
        }
        check_widths(
            "multi_seq_ladder",
            &self.multi_seq_ladder,
            2,
            self.max_batch,
        )?;
        check_widths("verify_widths", &self.verify_widths, 2, MAX_VERIFY_WIDTH)?;
        check_widths("draft_widths", &self.draft_widths, 1, self.max_batch)
    }
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
