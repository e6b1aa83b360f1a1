//! `--speculative`: generation by `Session::speculative_step`, drafted by the checkpoint's
//! MTP head (`MtpDrafter`) or a draft model (`ModelDrafter` over a second exec). Greedy
//! output is plain greedy decoding's exactly; with sampling on, the sequence's sampler
//! (`Session::set_sampling`) runs speculative sampling's accept/resample rule over drafts
//! the drafter itself sampled (`MtpDrafter::sampled`, `ModelDrafter::sampled`), so the
//! output keeps the target's distribution — a greedy drafter under a sampled target would
//! not, and is never built.

use std::time::Instant;

use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{
    CircuitExec, Drafter, ModelDrafter, MtpDrafter, Sampler, Sampling, SamplingParams, Session,
};
use solder_text::StopReason;

use super::output::{Output, Timings};

/// The drafter of a run.
pub enum SpecDrafter<'e> {
    Mtp(MtpDrafter<'e>),
    Model(ModelDrafter<'e>),
}

/// Verify steps, drafts proposed and accepted.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpecCounts {
    pub steps: usize,
    pub proposed: usize,
    pub accepted: usize,
}

/// Three generators from one `--seed`: the first token's, the target's accept rule's and
/// the drafter's, so no two draw the same stream.
fn reseeded(sampling: Sampling, stream: u64) -> Sampling {
    match sampling {
        Sampling::Greedy => Sampling::Greedy,
        Sampling::Sampled(params) => Sampling::Sampled(SamplingParams {
            seed: params.seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            ..params
        }),
    }
}

impl<'e> SpecDrafter<'e> {
    /// The MTP head of `target` (refused by name when it has none).
    pub fn mtp(target: &'e CircuitExec, sampling: Sampling) -> Result<SpecDrafter<'e>, String> {
        MtpDrafter::sampled(target, reseeded(sampling, 2))
            .map(SpecDrafter::Mtp)
            .map_err(|e| format!("--speculative mtp: {e}"))
    }

    /// A draft model on `draft`, whose vocabulary must be the target's.
    pub fn model(
        target: &CircuitExec,
        draft: &'e CircuitExec,
        sampling: Sampling,
    ) -> Result<SpecDrafter<'e>, String> {
        let (ours, theirs) = (target.config.vocab_size, draft.config.vocab_size);
        if ours != theirs {
            return Err(format!(
                "--speculative: the draft model's vocabulary has {theirs} tokens, the target's \
                 {ours}: they must be the same"
            ));
        }
        ModelDrafter::sampled(draft, reseeded(sampling, 2))
            .map(SpecDrafter::Model)
            .map_err(|e| format!("--speculative: {e}"))
    }

    fn drafter(&mut self) -> &mut dyn Drafter {
        match self {
            SpecDrafter::Mtp(d) => d,
            SpecDrafter::Model(d) => d,
        }
    }
}

/// Generates after `prompt` with `k` drafts per verify step until `output` says stop.
pub fn run(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    (k, sampling): (usize, Sampling),
    drafter: &mut SpecDrafter<'_>,
    output: &mut Output<'_>,
) -> Result<(StopReason, Timings, SpecCounts), String> {
    let err = |e: solder_model_layers::SessionError| e.to_string();
    let vocab = session.exec().config.vocab_size;
    let id = session.add_sequence();
    session
        .set_sampling(id, reseeded(sampling, 1))
        .map_err(err)?;
    let mut first = Sampler::new(sampling).map_err(|e| e.to_string())?;
    let mut timings = Timings::default();
    let started = Instant::now();
    // The MTP head needs the target's hidden rows of every prompt position.
    let logits = match drafter {
        SpecDrafter::Mtp(head) => head.prefill(backend, session, id, prompt),
        SpecDrafter::Model(_) => session.prefill(backend, id, prompt),
    }
    .map_err(err)?;
    let last = logits
        .len()
        .checked_sub(vocab)
        .ok_or("prefill returned no logits")?;
    let mut pending = first.sample(&logits[last..]).map_err(|e| e.to_string())?;
    timings.prefill = started.elapsed();
    let mut counts = SpecCounts::default();
    let mut reason = output.take(pending)?;
    let reason = loop {
        if let Some(reason) = reason {
            break reason;
        }
        let started = Instant::now();
        let step = session
            .speculative_step(backend, id, pending, k, drafter.drafter())
            .map_err(|e| format!("speculative step {}: {e}", counts.steps))?;
        timings.decode += started.elapsed();
        counts.steps += 1;
        counts.proposed += step.proposed;
        counts.accepted += step.accepted;
        for &token in &step.tokens {
            reason = output.take(token)?;
            if reason.is_some() {
                break;
            }
        }
        pending = *step
            .tokens
            .last()
            .ok_or("a speculative step emitted no token")?;
    };
    // Tokens decided past the limit or a stop are not counted.
    timings.decode_tokens = output.ids.len() - 1;
    drafter.drafter().forget(id);
    session.end_sequence(id).map_err(err)?;
    Ok((reason, timings, counts))
}
