//! How a speculative step is sized and how it went: `SpecPolicy` chooses k (the draft
//! length) per step, fixed or from the sequence's acceptance history (`Acceptances`);
//! `SpeculativeStep` is what one step did.

use crate::error::SessionError;

/// What one speculative step did.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeculativeStep {
    /// The tokens it emits: the accepted drafts, then the target's own next token (the
    /// sequence's next pending token). `accepted + 1` of them.
    pub tokens: Vec<u32>,
    /// Drafts proposed (k) and accepted.
    pub proposed: usize,
    pub accepted: usize,
    /// The target's logits at the kept rows, `[(accepted + 1) * vocab]`: row i is what a plain
    /// decode step feeding the i-th kept token (`pending`, then the accepted drafts) returns.
    pub logits: Vec<f32>,
}

/// How many tokens a speculative step drafts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SpecPolicy {
    /// Always k.
    Fixed(usize),
    /// From the sequence's acceptance history: one more than the recent mean number of
    /// accepted drafts (an exponential average with weight 1/4 on the last step), between
    /// `min` and `max`; `max` until there is history.
    Adaptive { min: usize, max: usize },
}

impl SpecPolicy {
    /// The k of the next step, given the sequence's average accepted drafts (None: no history).
    /// Never panics: an `Adaptive` policy with `min > max` gives `max` (`check` refuses it).
    pub fn k(&self, mean_accepted: Option<f64>) -> usize {
        match *self {
            SpecPolicy::Fixed(k) => k,
            SpecPolicy::Adaptive { min, max } => match mean_accepted {
                None => max,
                // `as` saturates (NaN gives 0); the clamp is written so it cannot panic.
                Some(mean) => (mean.round() as usize).saturating_add(1).max(min).min(max),
            },
        }
    }

    /// Refuses a policy no step could follow, by field: k 0, `min` 0 or above `max`, or a k
    /// past `widest_k` (the most drafts the widest verify program holds).
    pub fn check(&self, widest_k: usize) -> Result<(), SessionError> {
        let refuse =
            |field: &'static str, message: String| Err(SessionError::Argument { field, message });
        match *self {
            SpecPolicy::Fixed(k) if k == 0 || k > widest_k => refuse(
                "SpecPolicy::Fixed",
                format!(
                    "k = {k}: it must be 1..={widest_k} (k + 1 rows fit the widest verify program)"
                ),
            ),
            SpecPolicy::Adaptive { min: 0, .. } => refuse(
                "SpecPolicy::Adaptive::min",
                "0: a speculative step drafts at least one token".into(),
            ),
            SpecPolicy::Adaptive { min, max } if min > max => refuse(
                "SpecPolicy::Adaptive::min",
                format!("{min} is above max {max}"),
            ),
            SpecPolicy::Adaptive { max, .. } if max > widest_k => refuse(
                "SpecPolicy::Adaptive::max",
                format!("{max}: at most {widest_k} (k + 1 rows fit the widest verify program)"),
            ),
            _ => Ok(()),
        }
    }
}

/// A sequence's acceptance history.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Acceptances {
    /// Speculative steps taken, drafts proposed and accepted in all.
    pub steps: u64,
    pub proposed: u64,
    pub accepted: u64,
    /// Exponential average of accepted drafts per step (None before the first step).
    pub mean: Option<f64>,
}

impl Acceptances {
    pub(crate) fn record(&mut self, proposed: usize, accepted: usize) {
        self.steps += 1;
        self.proposed += proposed as u64;
        self.accepted += accepted as u64;
        let a = accepted as f64;
        self.mean = Some(self.mean.map_or(a, |m| 0.75 * m + 0.25 * a));
    }
}
