//! Speculative sampling's accept/resample rule over one verify step (Leviathan et al. 2023,
//! "Fast Inference from Transformers via Speculative Decoding", Algorithm 1; Chen et al.
//! 2023, "Accelerating LLM Decoding with Speculative Sampling"): the draft's token x at
//! position i, drawn from q_i, is kept with probability min(1, p_i(x) / q_i(x)); the first
//! one refused is replaced by a token drawn from norm(max(0, p_i − q_i)); when all k are kept
//! the bonus token is drawn from p_k. The tokens emitted then have exactly the target's
//! distribution p, whatever q is. `accept_greedy` is the temperature-0 case: keep while the
//! draft equals the target's arg-max, then emit the target's arg-max.
//!
//! Invariant: every input is checked before the first random draw, so a refused step leaves
//! the generator where it was; draws happen in a fixed order (one uniform per position
//! examined, then one for the replacement or bonus token).

use super::rng::Rng;
use super::transform::{draw, greedy, greedy_probs, sum_in_order};
use super::SamplingError;

/// How far the draft's proposal was accepted, and the token the target emits after it: the
/// step emits `draft_tokens[..accepted]` then `next_token`, `accepted + 1` tokens in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acceptance {
    /// Leading draft tokens kept, 0..=k.
    pub accepted: usize,
    /// The replacement of the first refused token, or the bonus token when all k were kept.
    pub next_token: u32,
}

/// How far two row sums may stray from 1 and still be read as a distribution.
const SUM_TOLERANCE: f64 = 1e-6;

/// The sampled rule over one verify step: `target_probs` are the target's distributions at
/// the k + 1 verified positions, `draft_probs` the k distributions the draft drew
/// `draft_tokens` from, all over the same vocabulary and all after the same transforms
/// (`Sampler::probs`). The rows must be distributions (finite, non-negative, summing to 1
/// within 1e-6) and each draft token must have positive draft probability.
pub fn accept<T: AsRef<[f64]>, D: AsRef<[f64]>>(
    target_probs: &[T],
    draft_probs: &[D],
    draft_tokens: &[u32],
    rng: &mut Rng,
) -> Result<Acceptance, SamplingError> {
    let k = draft_tokens.len();
    let vocab = check_shapes(target_probs.len(), draft_probs.len(), draft_tokens, || {
        target_probs.first().map(|row| row.as_ref().len())
    })?;
    for (row, probs) in target_probs.iter().enumerate() {
        check_distribution("target", row, probs.as_ref(), vocab)?;
    }
    for (row, probs) in draft_probs.iter().enumerate() {
        check_distribution("draft", row, probs.as_ref(), vocab)?;
    }
    for (position, &token) in draft_tokens.iter().enumerate() {
        if draft_probs[position].as_ref()[token as usize] <= 0.0 {
            return Err(SamplingError::DraftTokenImpossible { position, token });
        }
    }

    for (position, &token) in draft_tokens.iter().enumerate() {
        let (p, q) = (
            target_probs[position].as_ref(),
            draft_probs[position].as_ref(),
        );
        let x = token as usize;
        // u < p(x) / q(x), without the division; u < 1 keeps every token with p(x) ≥ q(x).
        if rng.uniform() * q[x] < p[x] {
            continue;
        }
        let residual: Vec<f64> = p.iter().zip(q).map(|(pi, qi)| (pi - qi).max(0.0)).collect();
        // A refusal implies p(x) < q(x), so the residual has mass unless rounding made p ≤ q
        // everywhere (p and q then equal within rounding): p itself is the limit.
        let next_token = if sum_in_order(&residual) > 0.0 {
            draw(&residual, rng)
        } else {
            draw(p, rng)
        };
        return Ok(Acceptance {
            accepted: position,
            next_token,
        });
    }
    Ok(Acceptance {
        accepted: k,
        next_token: draw(target_probs[k].as_ref(), rng),
    })
}

/// The greedy rule: keep draft tokens while each equals `greedy` of the target's logits at
/// its position, then emit the target's arg-max at the first difference (or the bonus
/// position). No randomness; rows with nothing but -inf and NaN are refused, as sampling
/// refuses them.
pub fn accept_greedy<T: AsRef<[f32]>>(
    target_logits: &[T],
    draft_tokens: &[u32],
) -> Result<Acceptance, SamplingError> {
    let k = draft_tokens.len();
    let vocab = check_shapes(target_logits.len(), k, draft_tokens, || {
        target_logits.first().map(|row| row.as_ref().len())
    })?;
    for (row, logits) in target_logits.iter().enumerate() {
        let logits = logits.as_ref();
        check_length("target", row, logits.len(), vocab)?;
        greedy_probs(logits).map_err(|e| in_row("target", row, e))?;
    }
    for (position, &token) in draft_tokens.iter().enumerate() {
        let best = greedy(target_logits[position].as_ref());
        if token != best {
            return Ok(Acceptance {
                accepted: position,
                next_token: best,
            });
        }
    }
    Ok(Acceptance {
        accepted: k,
        next_token: greedy(target_logits[k].as_ref()),
    })
}

/// Checks k + 1 target rows, k draft rows and every draft token inside the vocabulary (the
/// first target row's length); returns the vocabulary size.
pub(crate) fn check_shapes(
    target_rows: usize,
    draft_rows: usize,
    draft_tokens: &[u32],
    first_row_len: impl FnOnce() -> Option<usize>,
) -> Result<usize, SamplingError> {
    let k = draft_tokens.len();
    if target_rows != k + 1 {
        return Err(SamplingError::Rows {
            which: "target",
            found: target_rows,
            expected: k + 1,
            k,
        });
    }
    if draft_rows != k {
        return Err(SamplingError::Rows {
            which: "draft",
            found: draft_rows,
            expected: k,
            k,
        });
    }
    let vocab = first_row_len().unwrap_or(0);
    if vocab == 0 {
        return Err(in_row("target", 0, SamplingError::EmptyVocabulary));
    }
    for (position, &token) in draft_tokens.iter().enumerate() {
        if token as usize >= vocab {
            return Err(SamplingError::TokenOutOfRange {
                position,
                token,
                vocab,
            });
        }
    }
    Ok(vocab)
}

pub(crate) fn check_length(
    which: &'static str,
    row: usize,
    found: usize,
    vocab: usize,
) -> Result<(), SamplingError> {
    if found == vocab {
        Ok(())
    } else {
        Err(SamplingError::RowLength {
            which,
            row,
            found,
            expected: vocab,
        })
    }
}

fn check_distribution(
    which: &'static str,
    row: usize,
    probs: &[f64],
    vocab: usize,
) -> Result<(), SamplingError> {
    check_length(which, row, probs.len(), vocab)?;
    let not = |reason: String| SamplingError::NotADistribution { which, row, reason };
    if let Some((token, value)) = probs
        .iter()
        .enumerate()
        .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
    {
        return Err(not(format!(
            "token {token} has probability {value}, expected a finite number >= 0"
        )));
    }
    let sum = sum_in_order(probs);
    if (sum - 1.0).abs() > SUM_TOLERANCE {
        return Err(not(format!(
            "it sums to {sum}, expected 1 (within {SUM_TOLERANCE})"
        )));
    }
    Ok(())
}

/// An error of one row's transforms, named by its row.
pub(crate) fn in_row(which: &'static str, row: usize, error: SamplingError) -> SamplingError {
    SamplingError::InRow {
        which,
        row,
        source: Box::new(error),
    }
}
