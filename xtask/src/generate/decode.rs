//! Plain generation: prefill, then one decode step per token, each token chosen by
//! `next_token` — the one function that reads logits on the host, so switching to
//! `Session::prefill_next` / `Session::next_tokens` (sampling inside the session) is one
//! edit.

use std::time::Instant;

use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{Sampler, SeqId, Session};
use solder_text::StopReason;

use super::output::{Output, Timings};

/// What a step feeds: the prompt (prefill) or the last token (decode).
pub enum Feed<'a> {
    Prompt(&'a [u32]),
    Token(u32),
}

/// The next token of sequence `id` after feeding `feed`, drawn by `sampler` from the last
/// row's logits. (To become `session.prefill_next(backend, id, prompt)` and
/// `session.next_tokens(backend, &[(id, token)])[0]` with `set_sampling` once they land.)
pub fn next_token(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    id: SeqId,
    feed: Feed<'_>,
    sampler: &mut Sampler,
) -> Result<u32, String> {
    let vocab = session.exec().config.vocab_size;
    let logits = match feed {
        Feed::Prompt(prompt) => session.prefill(backend, id, prompt),
        Feed::Token(token) => session.decode(backend, id, token),
    }
    .map_err(|e| e.to_string())?;
    let last = logits
        .len()
        .checked_sub(vocab)
        .ok_or("a step returned no logits")?;
    sampler.sample(&logits[last..]).map_err(|e| e.to_string())
}

/// Generates after `prompt` until `output` says stop.
pub fn run(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    sampler: &mut Sampler,
    output: &mut Output<'_>,
) -> Result<(StopReason, Timings), String> {
    let id = session.add_sequence();
    let mut timings = Timings::default();
    let started = Instant::now();
    let mut token = next_token(session, backend, id, Feed::Prompt(prompt), sampler)?;
    timings.prefill = started.elapsed();
    let reason = loop {
        if let Some(reason) = output.take(token)? {
            break reason;
        }
        let started = Instant::now();
        token = next_token(session, backend, id, Feed::Token(token), sampler)?;
        timings.decode += started.elapsed();
        timings.decode_tokens += 1;
    };
    session.end_sequence(id).map_err(|e| e.to_string())?;
    Ok((reason, timings))
}
