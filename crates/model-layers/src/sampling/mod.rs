//! Sampling: how a sequence picks its next token from the logits, and how speculative decoding
//! keeps the target's distribution. `Sampling` says what a sequence wants (`Greedy`, the
//! default, or `Sampled(SamplingParams)`); a `Sampler` is one sequence's checked rule and
//! its own generator.
//!
//! Parts: `rng` (`Rng`: xoshiro256** seeded by SplitMix64), `transform` (temperature, then
//! top-k, then top-p, then softmax — vLLM's and Hugging Face's order; `greedy`, the arg-max),
//! `accept` (speculative sampling's accept rule over a verify step: `accept`, the
//! accept/resample rule, and `accept_greedy`, its temperature-0 case).
//!
//! Parameters: temperature is finite and ≥ 0, and 0 is greedy (top-k and top-p then change
//! nothing: the arg-max is always kept); `top_k` 0 turns top-k off, and a `top_k` at or above
//! the vocabulary keeps everything; `top_p` is in (0, 1] and 1 turns it off. Top-k keeps
//! ties at the k-th logit (so it may keep more than k tokens), top-p keeps the smallest set
//! of heaviest tokens reaching `top_p` of the mass, ties lowest index first.
//!
//! Invariants: a sequence's tokens are a function of its seed, its parameters and the logits
//! it is given, on every platform (see `rng` and `transform`); a call that is refused draws
//! nothing from the generator; NaN is never sampled; greedy is `greedy(logits)`.

mod accept;
mod rng;
mod transform;

pub use crate::error::SamplingError;
pub use accept::{accept, accept_greedy, Acceptance};
pub use rng::{splitmix64, Rng};
pub use transform::greedy;

use accept::{check_length, check_shapes, in_row};
use transform::Transforms;

/// What a sampled sequence asks for. `Default`: temperature 1, top-k and top-p off, seed 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; finite and ≥ 0, 0 for greedy.
    pub temperature: f64,
    /// Keep the k most likely tokens (ties at the k-th included); 0 for off.
    pub top_k: u32,
    /// Keep the smallest set of most likely tokens with this much of the mass; (0, 1], 1 for
    /// off.
    pub top_p: f64,
    /// Seeds the sequence's `Rng`: the same seed, parameters and logits give the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Refuses a negative, NaN or infinite temperature and a top_p outside (0, 1].
    pub fn check(&self) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        Ok(())
    }
}

/// How a sequence picks its tokens: greedy (the default) or sampled.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Sampling {
    #[default]
    Greedy,
    Sampled(SamplingParams),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    Greedy,
    Sampled(Transforms),
}

/// One sequence's sampling rule and generator. Greedy never draws from the generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    rule: Rule,
    rng: Rng,
}

impl Sampler {
    /// The sampler of `sampling`, parameters checked; temperature 0 is greedy.
    pub fn new(sampling: Sampling) -> Result<Sampler, SamplingError> {
        let params = match sampling {
            Sampling::Greedy => return Ok(Sampler::greedy()),
            Sampling::Sampled(params) => params,
        };
        params.check()?;
        let rule = if params.temperature == 0.0 {
            Rule::Greedy
        } else {
            Rule::Sampled(Transforms {
                temperature: params.temperature,
                top_k: params.top_k as usize,
                top_p: params.top_p,
            })
        };
        Ok(Sampler {
            rule,
            rng: Rng::seeded(params.seed),
        })
    }

    /// The greedy sampler.
    pub fn greedy() -> Sampler {
        Sampler {
            rule: Rule::Greedy,
            rng: Rng::seeded(0),
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.rule == Rule::Greedy
    }

    /// The sampler's generator (to save its state, or to drive `accept` directly).
    pub fn rng_mut(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// The distribution a token is drawn from after the transforms, summing to 1 within
    /// rounding; greedy's puts all the mass on `greedy(logits)`. What speculative sampling
    /// needs of the target (p) and of the draft (q).
    pub fn probs(&self, logits: &[f32]) -> Result<Vec<f64>, SamplingError> {
        match &self.rule {
            Rule::Greedy => transform::greedy_probs(logits),
            Rule::Sampled(t) => Ok(transform::normalise(transform::weights(logits, t)?)),
        }
    }

    /// The next token: `greedy(logits)`, or one draw from the transformed distribution (the
    /// same draw `sample_with_probs` makes).
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        match &self.rule {
            Rule::Greedy => transform::greedy_probs(logits).map(|_| greedy(logits)),
            Rule::Sampled(_) => self.sample_with_probs(logits).map(|(token, _)| token),
        }
    }

    /// The next token and the distribution it was drawn from (a draft step's q).
    pub fn sample_with_probs(&mut self, logits: &[f32]) -> Result<(u32, Vec<f64>), SamplingError> {
        let probs = self.probs(logits)?;
        let token = match &self.rule {
            Rule::Greedy => greedy(logits),
            Rule::Sampled(_) => transform::draw(&probs, &mut self.rng),
        };
        Ok((token, probs))
    }

    /// Speculative sampling's accept rule over one verify step, under this sampler's rule:
    /// the target's logits at the k + 1 verified positions, the k distributions the drafter
    /// drew `draft_tokens` from (what its `sample_with_probs` returned), and the tokens. Greedy is `accept_greedy` and reads
    /// nothing of `draft_probs` but their count; sampled is `accept` on this sampler's
    /// transforms of the target's logits and its generator.
    pub fn accept<T: AsRef<[f32]>, D: AsRef<[f64]>>(
        &mut self,
        target_logits: &[T],
        draft_probs: &[D],
        draft_tokens: &[u32],
    ) -> Result<Acceptance, SamplingError> {
        check_shapes(target_logits.len(), draft_probs.len(), draft_tokens, || {
            target_logits.first().map(|row| row.as_ref().len())
        })?;
        if self.is_greedy() {
            return accept_greedy(target_logits, draft_tokens);
        }
        let vocab = target_logits[0].as_ref().len();
        let mut target_probs = Vec::with_capacity(target_logits.len());
        for (row, logits) in target_logits.iter().enumerate() {
            check_length("target", row, logits.as_ref().len(), vocab)?;
            target_probs.push(
                self.probs(logits.as_ref())
                    .map_err(|e| in_row("target", row, e))?,
            );
        }
        accept(&target_probs, draft_probs, draft_tokens, &mut self.rng)
    }
}
