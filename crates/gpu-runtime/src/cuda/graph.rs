//! Captured graphs and their instantiations, by handle.
//!
//! Capture uses `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`: work on the capturing stream, and on
//! streams that waited on an event recorded in the capture, is recorded into one graph with
//! its parallel branches; other threads' CUDA calls are unaffected.
//!
//! Invariants: `capturing` holds the origin stream of every capture this backend began and
//! has not ended; each graph and exec handle is destroyed exactly once.

use std::collections::HashMap;

use cudarc::driver::result::graph as cugraph;
use cudarc::driver::sys::{self, CUgraph, CUgraphExec};

use super::driver::{capture_or_driver, describe, driver_about};
use super::CudaBackend;
use crate::error::GpuError;
use crate::types::{GraphExecId, GraphId, StreamId};

#[derive(Default)]
pub(super) struct Graphs {
    pub(super) capturing: Vec<StreamId>,
    graphs: HashMap<u32, CUgraph>,
    execs: HashMap<u32, CUgraphExec>,
    next_graph: u32,
    next_exec: u32,
}

// SAFETY: graph handles are only used through `&mut CudaBackend`, so never concurrently, with
// the backend's context bound on the calling thread.
unsafe impl Send for Graphs {}

impl Graphs {
    /// A `Capture` error for a call CUDA forbids while a stream captures.
    pub(super) fn refuse_during_capture(&self, call: &str) -> Result<(), GpuError> {
        match self.capturing.first() {
            Some(origin) => Err(GpuError::Capture(format!(
                "{call} is not allowed while stream {} is capturing",
                origin.0
            ))),
            None => Ok(()),
        }
    }

    /// Destroys every exec and graph. The backend's context must be current.
    pub(super) fn destroy_all(&mut self) {
        for (_, exec) in self.execs.drain() {
            // SAFETY: instantiated by `instantiate`, destroyed once.
            if let Err(error) = unsafe { cugraph::exec_destroy(exec) } {
                tracing::warn!(error = %describe(error), "cuGraphExecDestroy");
            }
        }
        for (_, graph) in self.graphs.drain() {
            // SAFETY: created by `end_capture`, destroyed once.
            if let Err(error) = unsafe { cugraph::destroy(graph) } {
                tracing::warn!(error = %describe(error), "cuGraphDestroy");
            }
        }
    }
}

fn stream_label(stream: StreamId) -> String {
    format!("stream {}", stream.0)
}

impl CudaBackend {
    pub(super) fn begin_capture_impl(&mut self, stream: StreamId) -> Result<(), GpuError> {
        let cu_stream = self.stream(stream)?.cu_stream();
        // SAFETY: a live stream of this backend's context, which `stream` bound.
        unsafe {
            cudarc::driver::result::stream::begin_capture(
                cu_stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| capture_or_driver("cuStreamBeginCapture", &stream_label(stream), e))?;
        self.graphs.capturing.push(stream);
        tracing::debug!(stream = stream.0, "begin capture");
        Ok(())
    }

    pub(super) fn end_capture_impl(&mut self, stream: StreamId) -> Result<GraphId, GpuError> {
        let cu_stream = self.stream(stream)?.cu_stream();
        // SAFETY: a live stream of this backend's context, which `stream` bound.
        let ended = unsafe { cudarc::driver::result::stream::end_capture(cu_stream) };
        // The capture is over whether or not it was valid: CUDA ends it either way.
        self.graphs.capturing.retain(|origin| *origin != stream);
        let graph =
            ended.map_err(|e| capture_or_driver("cuStreamEndCapture", &stream_label(stream), e))?;
        if graph.is_null() {
            return Err(GpuError::Capture(format!(
                "cuStreamEndCapture ({}): the driver returned no graph",
                stream_label(stream)
            )));
        }
        let id = self.graphs.next_graph;
        self.graphs.next_graph += 1;
        self.graphs.graphs.insert(id, graph);
        tracing::debug!(graph = id, stream = stream.0, "end capture");
        Ok(GraphId(id))
    }

    pub(super) fn instantiate_impl(&mut self, graph: GraphId) -> Result<GraphExecId, GpuError> {
        let raw = *self
            .graphs
            .graphs
            .get(&graph.0)
            .ok_or(GpuError::UnknownHandle {
                what: "graph",
                id: graph.0,
            })?;
        self.bind()?;
        // SAFETY: a live graph of this backend.
        let exec = unsafe { cugraph::instantiate(raw, sys::CUgraphInstantiate_flags(0)) }.map_err(
            |e| {
                driver_about(
                    "cuGraphInstantiateWithFlags",
                    &format!("graph {}", graph.0),
                    e,
                )
            },
        )?;
        let id = self.graphs.next_exec;
        self.graphs.next_exec += 1;
        self.graphs.execs.insert(id, exec);
        tracing::debug!(graph = graph.0, exec = id, "instantiate");
        Ok(GraphExecId(id))
    }

    pub(super) fn launch_graph_impl(
        &mut self,
        exec: GraphExecId,
        stream: StreamId,
    ) -> Result<(), GpuError> {
        let raw = *self
            .graphs
            .execs
            .get(&exec.0)
            .ok_or(GpuError::UnknownHandle {
                what: "graph exec",
                id: exec.0,
            })?;
        let cu_stream = self.stream(stream)?.cu_stream();
        // SAFETY: a live exec and a live stream of this backend's context, which `stream` bound.
        unsafe { cugraph::launch(raw, cu_stream) }.map_err(|e| {
            capture_or_driver(
                "cuGraphLaunch",
                &format!("graph exec {} on {}", exec.0, stream_label(stream)),
                e,
            )
        })
    }

    pub(super) fn destroy_graph_impl(&mut self, graph: GraphId) -> Result<(), GpuError> {
        let raw = self
            .graphs
            .graphs
            .remove(&graph.0)
            .ok_or(GpuError::UnknownHandle {
                what: "graph",
                id: graph.0,
            })?;
        self.bind()?;
        // SAFETY: removed from the table above, so destroyed once; execs do not need it.
        unsafe { cugraph::destroy(raw) }
            .map_err(|e| driver_about("cuGraphDestroy", &format!("graph {}", graph.0), e))
    }

    pub(super) fn destroy_graph_exec_impl(&mut self, exec: GraphExecId) -> Result<(), GpuError> {
        let raw = self
            .graphs
            .execs
            .remove(&exec.0)
            .ok_or(GpuError::UnknownHandle {
                what: "graph exec",
                id: exec.0,
            })?;
        self.bind()?;
        // SAFETY: removed from the table above, so destroyed once. CUDA lets a launched exec
        // finish before releasing it.
        unsafe { cugraph::exec_destroy(raw) }
            .map_err(|e| driver_about("cuGraphExecDestroy", &format!("graph exec {}", exec.0), e))
    }
}
