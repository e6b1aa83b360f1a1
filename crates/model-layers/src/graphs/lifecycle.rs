//! The graphs of one exec on its backend: the step graphs `run_step` captures, replays and
//! destroys (through the cache), and the handles `capture` gives out, `replay` launches and
//! `release` destroys.
//!
//! Invariants: a capture that fails ends the capture and destroys what it made; a graph is
//! destroyed (its exec, then the graph) before the memory it names is given back; a handle
//! is replayed or released only by the exec that captured it (`owner`); `handles_out` counts
//! the handles given out and not yet released, and the exec's memory is not freed while it is
//! above zero. The exec checks it is live and bound to the backend before calling in here.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use solder_circuit::Mode;
use solder_gpu_runtime::{EventId, GpuBackend, GraphExecId, GraphId, StreamId};

use super::cache::{Cached, Decision, GraphCache};
use super::captured::CapturedGraph;
use super::counters::{CaptureReport, GraphCounters};
use super::policy::{EagerReason, GraphPolicy, StepRun};
use crate::error::ExecError;
use crate::program::Program;
use crate::program::ProgramKey;
use crate::progress::{Progress, Unit};

/// The exec's streams and events, which its programs run on (stream 0 is the one graphs are
/// captured on and launched on).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lanes<'a> {
    pub streams: &'a [StreamId],
    pub events: &'a [EventId],
}

impl Lanes<'_> {
    fn run(&self, backend: &mut dyn GpuBackend, program: &Program) -> Result<(), ExecError> {
        program.run(backend, self.streams, self.events)
    }
}

/// One exec's graphs: the step-graph cache (behind a lock: steps run on `&CircuitExec`) and
/// the handles given out by `capture`.
#[derive(Debug)]
pub(crate) struct Graphs {
    cache: Mutex<GraphCache>,
    /// Handles given out by `capture` and not yet released.
    handles_out: usize,
    /// The exec's id, which every handle records.
    owner: u64,
}

impl Graphs {
    pub(crate) fn new(owner: u64) -> Graphs {
        Graphs {
            cache: Mutex::new(GraphCache::default()),
            handles_out: 0,
            owner,
        }
    }

    /// The graph cache, locked (every cache operation leaves it consistent).
    fn cache(&self) -> MutexGuard<'_, GraphCache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Handles given out by `capture` and not yet released.
    pub(crate) fn handles_out(&self) -> usize {
        self.handles_out
    }

    pub(crate) fn counters(&self) -> GraphCounters {
        self.cache().counters.clone()
    }

    pub(crate) fn policy(&self) -> GraphPolicy {
        self.cache().policy
    }

    pub(crate) fn set_policy(&self, policy: GraphPolicy) {
        self.cache().set_policy(policy);
    }

    /// Runs one step of `program` as the policy says (`CircuitExec::run_step`).
    pub(crate) fn run_step(
        &self,
        backend: &mut dyn GpuBackend,
        program: &Program,
        lanes: Lanes<'_>,
    ) -> Result<StepRun, ExecError> {
        let key = program.key();
        let mut cache = self.cache();
        let exec = match cache.decide(&key) {
            Decision::Eager(reason) => {
                lanes.run(backend, program)?;
                cache.count_eager(reason);
                return Ok(StepRun::Eager(reason));
            }
            Decision::Replay(exec) => {
                backend.launch_graph(exec, lanes.streams[0])?;
                cache.counters.graph_launches += 1;
                return Ok(StepRun::Replayed);
            }
            Decision::Capture => match capture_into(backend, &mut cache, program, lanes) {
                Ok(exec) => exec,
                Err(e) if cache.policy == GraphPolicy::Auto => {
                    tracing::debug!(program = %key, error = %e, "capture failed; the step runs eagerly");
                    lanes.run(backend, program)?;
                    cache.count_eager(EagerReason::GraphsOff);
                    return Ok(StepRun::Eager(EagerReason::GraphsOff));
                }
                Err(e) => return Err(e),
            },
        };
        backend.launch_graph(exec, lanes.streams[0])?;
        cache.counters.graph_launches += 1;
        Ok(StepRun::Captured)
    }

    /// Captures every program of `programs` that has no current graph yet
    /// (`CircuitExec::capture_all`), its progress shown (`crate::progress`); `model` names the
    /// exec in the log.
    pub(crate) fn capture_all<'p>(
        &self,
        backend: &mut dyn GpuBackend,
        programs: impl Iterator<Item = &'p Program>,
        lanes: Lanes<'_>,
        model: &str,
    ) -> Result<CaptureReport, ExecError> {
        let mut cache = self.cache();
        if cache.policy == GraphPolicy::Never {
            return Err(ExecError::Graphs(
                "capture_all under GraphPolicy::Never: set the policy to auto or always first"
                    .into(),
            ));
        }
        if let Some(reason) = &cache.off {
            return Err(ExecError::Graphs(format!(
                "graphs are off for this exec after a failed capture ({reason}); set the policy again to retry"
            )));
        }
        let started = Instant::now();
        let mut report = CaptureReport {
            captured: 0,
            already: 0,
            launches: 0,
            time: Duration::ZERO,
        };
        let programs: Vec<&Program> = programs.collect();
        let mut progress = Progress::new("capturing graphs", Unit::Items("graphs"), programs.len());
        for program in programs {
            if matches!(cache.decide(&program.key()), Decision::Replay(_)) {
                report.already += 1;
            } else {
                capture_into(backend, &mut cache, program, lanes)?;
                report.captured += 1;
                report.launches += program.launches();
            }
            progress.advance(1);
        }
        progress.finish();
        report.time = started.elapsed();
        tracing::info!(
            model = %model, captured = report.captured, already = report.already,
            launches = report.launches, ms = report.time.as_secs_f64() * 1e3, "captured the ladder"
        );
        Ok(report)
    }

    /// Destroys every cached step graph; returns the first failure, keeping the graphs it
    /// could not destroy.
    pub(crate) fn release_cached(&self, backend: &mut dyn GpuBackend) -> Result<(), ExecError> {
        let mut cache = self.cache();
        let all = cache.take_all();
        let (kept, first) = destroy_all(backend, all);
        cache.put_back(kept);
        first.map_or(Ok(()), Err)
    }

    /// Bumps the binding epoch and destroys every cached graph (they baked what is about to
    /// move); on a failure keeps the graphs it could not destroy and returns the first.
    pub(crate) fn invalidate(&self, backend: &mut dyn GpuBackend) -> Result<(), ExecError> {
        let mut cache = self.cache();
        let stale = cache.invalidate();
        let (kept, first) = destroy_all(backend, stale);
        match first {
            Some(e) => {
                cache.put_back(kept);
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Captures `program` into a handle the caller replays and releases
    /// (`CircuitExec::capture`).
    pub(crate) fn capture(
        &mut self,
        backend: &mut dyn GpuBackend,
        program: &Program,
        lanes: Lanes<'_>,
    ) -> Result<CapturedGraph, ExecError> {
        let (graph, exec) = capture_program(backend, program, lanes)?;
        self.handles_out += 1;
        Ok(CapturedGraph {
            mode: program.mode,
            rows: program.rows,
            graph,
            exec,
            owner: self.owner,
        })
    }

    /// Launches `graph` on stream 0 (`CircuitExec::replay`).
    pub(crate) fn replay(
        &self,
        backend: &mut dyn GpuBackend,
        graph: &CapturedGraph,
        lanes: Lanes<'_>,
    ) -> Result<(), ExecError> {
        if !self.owns(graph) {
            return Err(self.foreign((graph.mode, graph.rows, graph.owner), None));
        }
        Ok(backend.launch_graph(graph.exec, lanes.streams[0])?)
    }

    /// Whether this exec captured `graph`.
    pub(crate) fn owns(&self, graph: &CapturedGraph) -> bool {
        graph.owner == self.owner
    }

    /// Destroys a handle this exec captured; another's comes back inside the error.
    pub(crate) fn release(
        &mut self,
        backend: &mut dyn GpuBackend,
        graph: CapturedGraph,
    ) -> Result<(), ExecError> {
        if !self.owns(&graph) {
            // Handed back inside the error: its owner can still release it.
            let what = (graph.mode, graph.rows, graph.owner);
            return Err(self.foreign(what, Some(graph)));
        }
        backend.destroy_graph_exec(graph.exec)?;
        backend.destroy_graph(graph.graph)?;
        self.handles_out = self.handles_out.saturating_sub(1);
        Ok(())
    }

    fn foreign(
        &self,
        (mode, rows, owner): (Mode, usize, u64),
        graph: Option<CapturedGraph>,
    ) -> ExecError {
        ExecError::ForeignGraph {
            mode: mode.to_string(),
            rows,
            owner,
            this: self.owner,
            graph: graph.map(Box::new),
        }
    }
}

/// Captures `program` into the cache (destroying a stale graph of its key first); records
/// a failure in the cache (turning graphs off under `Auto`).
fn capture_into(
    backend: &mut dyn GpuBackend,
    cache: &mut GraphCache,
    program: &Program,
    lanes: Lanes<'_>,
) -> Result<GraphExecId, ExecError> {
    let key = program.key();
    if let Some(old) = cache.graphs.remove(&key) {
        // Captured at an older epoch: never replayed again.
        cache.stale.insert(key);
        cache.counters.invalidated += 1;
        destroy(backend, old.graph, old.exec)?;
    }
    let started = Instant::now();
    match capture_program(backend, program, lanes) {
        Ok((graph, exec)) => {
            let took = started.elapsed();
            tracing::debug!(program = %key, launches = program.launches(), us = took.as_micros() as u64, "captured a step graph");
            cache.captured(key, graph, exec, took);
            Ok(exec)
        }
        Err(e) => {
            cache.capture_failed(&key, &e.to_string());
            Err(e)
        }
    }
}

/// Captures `program` on stream 0 and instantiates it; on failure ends the capture and
/// destroys what it made. A launch that fails mid-capture is the error returned, even when
/// ending the capture then fails too (a side stream forked and not yet joined back, as CUDA's
/// `cudaErrorStreamCaptureUnjoined`): that second error is only logged.
fn capture_program(
    backend: &mut dyn GpuBackend,
    program: &Program,
    lanes: Lanes<'_>,
) -> Result<(GraphId, GraphExecId), ExecError> {
    let stream = lanes.streams[0];
    backend.begin_capture(stream)?;
    let ran = lanes.run(backend, program);
    let ended = backend.end_capture(stream);
    if let Err(e) = ran {
        // The capture ended; its graph, if any, holds nothing worth keeping.
        match ended {
            Ok(graph) => {
                let _ = backend.destroy_graph(graph);
            }
            Err(end) => tracing::debug!(error = %end, "ending a failed capture failed too"),
        }
        return Err(e);
    }
    let graph = ended?;
    match backend.instantiate(graph) {
        Ok(exec) => Ok((graph, exec)),
        Err(e) => {
            let _ = backend.destroy_graph(graph);
            Err(e.into())
        }
    }
}

/// Destroys a graph's exec, then the graph.
fn destroy(
    backend: &mut dyn GpuBackend,
    graph: GraphId,
    exec: GraphExecId,
) -> Result<(), ExecError> {
    backend.destroy_graph_exec(exec)?;
    backend.destroy_graph(graph)?;
    Ok(())
}

/// Destroys every graph of `all`; returns those it could not destroy and the first failure.
fn destroy_all(
    backend: &mut dyn GpuBackend,
    all: Vec<(ProgramKey, Cached)>,
) -> (Vec<(ProgramKey, Cached)>, Option<ExecError>) {
    let mut kept = Vec::new();
    let mut first = None;
    for (key, cached) in all {
        if let Err(e) = destroy(backend, cached.graph, cached.exec) {
            tracing::warn!(program = %key, error = %e, "could not destroy a step graph");
            first.get_or_insert(e);
            kept.push((key, cached));
        }
    }
    (kept, first)
}
