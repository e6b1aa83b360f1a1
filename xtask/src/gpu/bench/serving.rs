//! `gpu-bench --loop STEPS`: the serving loop's cost per step at each width, the host in the
//! loop (`Session::next_tokens`: each step's ids read back before the next is enqueued)
//! against a pipeline (`Session::start_pipeline` with `PIPELINE_AHEAD` steps queued: the next
//! step runs while the host waits for the one before's ids). Variants alternate in rounds, each
//! from the same sequences (taken back after each run, the device drained before the next);
//! a figure is the median over rounds of the run's wall time over its steps.

use std::time::Instant;

use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{SeqId, Session};

use super::LoopFigures;
use crate::gpu::median;

/// Steps a pipeline keeps queued behind the one the host waits for.
pub(super) const PIPELINE_AHEAD: usize = 2;
/// Rounds per width (each runs both variants).
const ROUNDS: usize = 3;

/// Tokens a sequence takes beyond the timed steps (the pipeline's steps queued ahead).
pub(super) fn extra_positions(steps: usize) -> usize {
    steps + PIPELINE_AHEAD + 1
}

/// The loop timed at each width over the first `width` of `seqs`.
pub(super) fn time_loops(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    seqs: &[SeqId],
    widths: &[usize],
    steps: usize,
) -> Result<Vec<LoopFigures>, String> {
    let mut figures = Vec::new();
    for &width in widths {
        let batch: Vec<(SeqId, u32)> = seqs[..width].iter().map(|&id| (id, 1)).collect();
        let lens = batch
            .iter()
            .map(|&(id, _)| session.seq_len(id))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let (mut waited, mut piped) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let host = timed(session, backend, &batch, steps, false)?;
            take_back(session, backend, &batch, &lens)?;
            let pipe = timed(session, backend, &batch, steps, true)?;
            take_back(session, backend, &batch, &lens)?;
            if host.1 != pipe.1 {
                return Err(format!(
                    "serving loop {width}: the pipeline's tokens are not next_tokens' ({:?} against {:?})",
                    pipe.1, host.1
                ));
            }
            waited.push(host.0);
            piped.push(pipe.0);
        }
        let row = LoopFigures {
            rows: width,
            steps,
            rounds: ROUNDS,
            waited_us: median(&mut waited),
            piped_us: median(&mut piped),
        };
        println!(
            "serving loop {width}: next_tokens {:.1} us/step, pipeline ({PIPELINE_AHEAD} ahead) {:.1} us/step, ratio {:.3} ({steps} steps, median of {ROUNDS} rounds)",
            row.waited_us,
            row.piped_us,
            row.piped_us / row.waited_us
        );
        figures.push(row);
    }
    Ok(figures)
}

/// One run of `steps` steps: microseconds a step, and the last step's tokens.
fn timed(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, u32)],
    steps: usize,
    pipeline: bool,
) -> Result<(f64, Vec<u32>), String> {
    let err = |e: solder_model_layers::SessionError| format!("serving loop: {e}");
    let mut feed = batch.to_vec();
    let mut last = Vec::new();
    let t = Instant::now();
    if pipeline {
        session
            .start_pipeline(backend, batch, PIPELINE_AHEAD)
            .map_err(err)?;
    }
    for _ in 0..steps {
        last = match pipeline {
            true => session.pipeline_next(backend).map_err(err)?,
            false => session.next_tokens(backend, &feed).map_err(err)?,
        };
        for (slot, &token) in feed.iter_mut().zip(&last) {
            slot.1 = token;
        }
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / steps as f64;
    session.stop_pipeline(backend).map_err(err)?;
    Ok((us, last))
}

/// Every sequence back to its length before the run, the device drained.
fn take_back(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    batch: &[(SeqId, u32)],
    lens: &[usize],
) -> Result<(), String> {
    backend.synchronize().map_err(|e| e.to_string())?;
    for (&(id, _), &len) in batch.iter().zip(lens) {
        session
            .truncate_to(id, len)
            .map_err(|e| format!("serving loop: {e}"))?;
    }
    Ok(())
}
