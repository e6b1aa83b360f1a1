//! Plain generation: `Session::prefill_next`, then `Session::next_tokens` once per token —
//! the sequence's sampler (`set_sampling`) draws each token inside the session, which copies
//! back only the row it needs.

use std::time::Instant;

use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{Sampling, Session};
use solder_text::StopReason;

use super::output::{Output, Timings};

/// Generates after `prompt` until `output` says stop.
pub fn run(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    sampling: Sampling,
    output: &mut Output<'_>,
) -> Result<(StopReason, Timings), String> {
    let id = session.add_sequence();
    session
        .set_sampling(id, sampling)
        .map_err(|e| e.to_string())?;
    let mut timings = Timings::default();
    let started = Instant::now();
    let mut token = session
        .prefill_next(backend, id, prompt)
        .map_err(|e| e.to_string())?;
    timings.prefill = started.elapsed();
    let reason = loop {
        if let Some(reason) = output.take(token)? {
            break reason;
        }
        let started = Instant::now();
        token = session
            .next_tokens(backend, &[(id, token)])
            .map_err(|e| e.to_string())?[0];
        timings.decode += started.elapsed();
        timings.decode_tokens += 1;
    };
    session.end_sequence(id).map_err(|e| e.to_string())?;
    Ok((reason, timings))
}
