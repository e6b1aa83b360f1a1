//! One width's interleaved timing and its logits checks.

use std::time::Instant;

use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{CapturedGraph, CircuitExec};

use super::{fail, mode_of, program, Bytes, Variant, MIN_ROUNDS, WARMUP};

/// A live variant at one width: its exec and that width's graph.
pub(super) struct Lane<'a> {
    pub v: usize,
    pub exec: &'a CircuitExec,
    pub graph: &'a CapturedGraph,
}

/// One width's timing parameters.
pub(super) struct Width {
    pub width: usize,
    pub rounds: usize,
    pub runs: usize,
    pub max_seconds: f64,
}

/// One lane's timed seconds: eager runs, graph replays.
pub(super) type Samples = (Vec<f64>, Vec<f64>);

/// The samples of each lane — a warm-up, then interleaved rounds — or `None` for a lane whose
/// run failed (marked in `failed`).
pub(super) fn time_width(
    backend: &mut dyn GpuBackend,
    lanes: &[Lane<'_>],
    variants: &[Variant],
    at: &Width,
    failed: &mut [Option<String>],
) -> Result<Vec<Option<Samples>>, String> {
    let n = lanes.len();
    let eager = |backend: &mut dyn GpuBackend, lane: &Lane<'_>| -> Result<(), String> {
        let program = program(lane.exec, at.width)?;
        lane.exec.run(backend, program).map_err(|e| e.to_string())
    };
    let replay = |backend: &mut dyn GpuBackend, lane: &Lane<'_>| -> Result<(), String> {
        lane.exec
            .replay(backend, lane.graph)
            .map_err(|e| e.to_string())
    };
    let mut samples: Vec<Option<Samples>> = vec![Some((Vec::new(), Vec::new())); n];
    let mut drop_lane = |samples: &mut [Option<_>], i: usize, e: String| {
        samples[i] = None;
        let why = format!("{}:{}: {e}", mode_of(at.width), at.width);
        fail(failed, variants, lanes[i].v, why)
    };
    for (i, lane) in lanes.iter().enumerate() {
        let warm = (0..WARMUP).try_for_each(|_| {
            eager(backend, lane)?;
            replay(backend, lane)
        });
        if let Err(e) = warm {
            drop_lane(&mut samples, i, e)?;
        }
    }
    let started = Instant::now();
    for round in 0..at.rounds {
        if round >= MIN_ROUNDS && started.elapsed().as_secs_f64() > at.max_seconds {
            break;
        }
        for k in 0..n {
            let i = (k + round) % n;
            if samples[i].is_none() {
                continue;
            }
            let lane = &lanes[i];
            let timed_pair = timed(backend, at.runs, |b| eager(b, lane))
                .and_then(|e| timed(backend, at.runs, |b| replay(b, lane)).map(|r| (e, r)));
            match timed_pair {
                Ok((e, r)) => {
                    if let Some((eager_s, replay_s)) = samples[i].as_mut() {
                        eager_s.extend(e);
                        replay_s.extend(r);
                    }
                }
                Err(e) => drop_lane(&mut samples, i, e)?,
            }
        }
    }
    Ok(samples)
}

/// Seconds of each of `runs` calls of `step`, each followed by a synchronize.
fn timed(
    backend: &mut dyn GpuBackend,
    runs: usize,
    mut step: impl FnMut(&mut dyn GpuBackend) -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let sync = |backend: &mut dyn GpuBackend| backend.synchronize().map_err(|e| e.to_string());
    sync(backend)?;
    let mut seconds = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        step(backend)?;
        sync(backend)?;
        seconds.push(t.elapsed().as_secs_f64());
    }
    Ok(seconds)
}

/// A lane's eager and replayed logits against its session step's, and (bit-identical
/// variants) against the baseline's session step.
pub(super) fn check_bytes(
    backend: &mut dyn GpuBackend,
    lane: &Lane<'_>,
    stepped: &[Option<Vec<f32>>],
    variant: &Variant,
) -> Result<Bytes, String> {
    let (exec, width) = (lane.exec, lane.graph.rows);
    exec.run(backend, program(exec, width)?)
        .map_err(|e| e.to_string())?;
    let eager_logits = read_logits(backend, exec, width)?;
    exec.replay(backend, lane.graph)
        .map_err(|e| e.to_string())?;
    let replay_logits = read_logits(backend, exec, width)?;
    let own = stepped[lane.v]
        .as_ref()
        .ok_or("no session step to compare with")?;
    for (what, logits) in [("eager", &eager_logits), ("graph replay", &replay_logits)] {
        if let Err(e) = crate::gpu::step::same_bytes(own, logits) {
            return Ok(Bytes::Differ(format!("{what} vs its session step: {e}")));
        }
    }
    let Some(reference) = variant.same_as else {
        return Ok(Bytes::OwnOnly);
    };
    let theirs = stepped[reference]
        .as_ref()
        .ok_or("no step of the variant it keeps the bytes of to compare with")?;
    match crate::gpu::step::same_bytes(theirs, own) {
        Ok(()) => Ok(Bytes::Same),
        Err(e) => Ok(Bytes::Differ(format!("vs variant {reference}: {e}"))),
    }
}

/// The first `rows` rows of the exec's logits region.
fn read_logits(
    backend: &mut dyn GpuBackend,
    exec: &CircuitExec,
    rows: usize,
) -> Result<Vec<f32>, String> {
    let mut raw = vec![0u8; rows * exec.config.vocab_size * 4];
    backend
        .copy_d2h(exec.workspace().offset(exec.layout.logits_offset), &mut raw)
        .map_err(|e| format!("reading logits: {e}"))?;
    Ok(raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
