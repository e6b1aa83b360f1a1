//! Events, graph capture and replay.
//!
//! Capture follows CUDA: work on the capturing stream, and on any stream that waited on an
//! event recorded in the capture (forked into it), is recorded instead of run. A
//! capture-local vector clock per member stream tells, at `end_capture`, whether every forked
//! stream's work was joined back to the origin. Replay runs the recorded ops through the same
//! checks as eager work, on their recorded streams, ordered after the launching stream.
//!
//! Invariants: a stream belongs to at most one capture; an allocation touched by an active
//! capture, a live graph or a live graph exec cannot be freed (`graph_refs` counts the
//! latter two); replay never touches the user's events (it keeps its own).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::hb::Touch;
use super::CpuBackend;
use crate::error::GpuError;
use crate::types::{EventId, GraphExecId, GraphId, KernelArg, KernelId, LaunchConfig, StreamId};

#[derive(Debug, Clone)]
enum CapturedOp {
    Launch {
        stream: StreamId,
        kernel: KernelId,
        config: LaunchConfig,
        args: Vec<KernelArg>,
    },
    Record {
        stream: StreamId,
        event: EventId,
    },
    Wait {
        stream: StreamId,
        event: EventId,
    },
}

/// What a captured graph holds; shared by the graph and its execs.
#[derive(Debug)]
struct GraphBody {
    ops: Vec<CapturedOp>,
    /// Origin first, then forked streams in the order they joined.
    streams: Vec<StreamId>,
    allocations: Vec<u64>,
}

struct Capture {
    origin: StreamId,
    ops: Vec<CapturedOp>,
    streams: Vec<StreamId>,
    allocations: BTreeSet<u64>,
    /// Capture-local vector clocks, advanced by captured launches only.
    clocks: HashMap<u32, Vec<u32>>,
}

#[derive(Debug, Default)]
pub(super) struct Event {
    /// The clock of its last eager record.
    clock: Option<Vec<u32>>,
    /// Set when last recorded inside an active capture: (capture, capture-local clock).
    captured: Option<(u32, Vec<u32>)>,
}

#[derive(Default)]
pub(super) struct GraphState {
    /// The capture each stream belongs to, indexed by stream.
    pub(super) stream_capture: Vec<Option<u32>>,
    pub(super) events: Vec<Event>,
    captures: HashMap<u32, Capture>,
    next_capture: u32,
    graphs: HashMap<u32, Arc<GraphBody>>,
    execs: HashMap<u32, Arc<GraphBody>>,
    next_graph: u32,
    next_exec: u32,
}

impl GraphState {
    /// Graphs and graph execs created and not destroyed.
    pub(super) fn live(&self) -> (usize, usize) {
        (self.graphs.len(), self.execs.len())
    }
}

fn clock_get(clock: &[u32], stream: StreamId) -> u32 {
    clock.get(stream.0 as usize).copied().unwrap_or(0)
}

fn clock_merge(into: &mut Vec<u32>, from: &[u32]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (mine, theirs) in into.iter_mut().zip(from) {
        *mine = (*mine).max(*theirs);
    }
}

impl GraphState {
    /// The state of a backend with only stream 0.
    pub(super) fn new() -> GraphState {
        GraphState {
            stream_capture: vec![None],
            ..GraphState::default()
        }
    }

    pub(super) fn capturing(&self, stream: StreamId) -> Option<u32> {
        self.stream_capture
            .get(stream.0 as usize)
            .copied()
            .flatten()
    }

    /// A `Capture` error for a copy queued on `stream` while it captures (graphs hold launches
    /// only).
    pub(super) fn refuse_copy_while_capturing(
        &self,
        call: &str,
        stream: StreamId,
    ) -> Result<(), GpuError> {
        (self.capturing(stream)).map_or(Ok(()), |_| {
            Err(GpuError::queued_while_capturing(call, stream.0))
        })
    }

    /// A `Capture` error for a call CUDA forbids while any stream captures.
    pub(super) fn refuse_during_capture(&self, call: &str) -> Result<(), GpuError> {
        match self.captures.values().map(|capture| capture.origin).min() {
            Some(origin) => Err(GpuError::Capture(format!(
                "{call} is not allowed while stream {} is capturing",
                origin.0
            ))),
            None => Ok(()),
        }
    }

    /// Refuses to free an allocation an active capture touches.
    pub(super) fn refuse_free(&self, base: u64) -> Result<(), GpuError> {
        if self
            .captures
            .values()
            .any(|capture| capture.allocations.contains(&base))
        {
            return Err(GpuError::CapturedByLiveGraph { ptr: base });
        }
        Ok(())
    }
}

impl CpuBackend {
    pub(super) fn capture_launch(
        &mut self,
        capture: u32,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
        touches: &[Touch],
    ) {
        let capture = self
            .graphs
            .captures
            .get_mut(&capture)
            .expect("stream_capture names a live capture");
        capture
            .allocations
            .extend(touches.iter().map(|touch| touch.alloc));
        let clock = capture.clocks.entry(stream.0).or_default();
        if clock.len() <= stream.0 as usize {
            clock.resize(stream.0 as usize + 1, 0);
        }
        clock[stream.0 as usize] += 1;
        capture.ops.push(CapturedOp::Launch {
            stream,
            kernel,
            config: *config,
            args: args.to_vec(),
        });
    }

    pub(super) fn record_event_impl(
        &mut self,
        event: EventId,
        stream: StreamId,
    ) -> Result<(), GpuError> {
        match self.graphs.capturing(stream) {
            Some(id) => {
                let capture = self.graphs.captures.get_mut(&id).expect("live capture");
                let clock = capture.clocks.get(&stream.0).cloned().unwrap_or_default();
                capture.ops.push(CapturedOp::Record { stream, event });
                self.graphs.events[event.0 as usize].captured = Some((id, clock));
            }
            None => {
                let state = &mut self.graphs.events[event.0 as usize];
                state.clock = Some(self.tracker.clock(stream.0).to_vec());
                state.captured = None;
            }
        }
        Ok(())
    }

    pub(super) fn wait_event_impl(
        &mut self,
        stream: StreamId,
        event: EventId,
    ) -> Result<(), GpuError> {
        let state = &self.graphs.events[event.0 as usize];
        let (captured, recorded) = (state.captured.clone(), state.clock.clone());
        let mine = self.graphs.capturing(stream);
        match captured {
            Some((theirs, _)) if mine.is_some_and(|mine| mine != theirs) => {
                Err(GpuError::Capture(format!(
                    "stream {} waits on event {} recorded in another capture",
                    stream.0, event.0
                )))
            }
            Some((id, event_clock)) => {
                let capture = self.graphs.captures.get_mut(&id).expect("live capture");
                if mine.is_none() {
                    // A fork: the stream joins the capture.
                    tracing::debug!(
                        stream = stream.0,
                        origin = capture.origin.0,
                        "stream forked into capture"
                    );
                    capture.streams.push(stream);
                    self.graphs.stream_capture[stream.0 as usize] = Some(id);
                }
                clock_merge(capture.clocks.entry(stream.0).or_default(), &event_clock);
                capture.ops.push(CapturedOp::Wait { stream, event });
                Ok(())
            }
            None if mine.is_some() && recorded.is_some() => Err(GpuError::Capture(format!(
                "stream {} waits on event {} recorded outside the capture",
                stream.0, event.0
            ))),
            None => {
                // Never recorded: a no-op, as in CUDA.
                if let (None, Some(clock)) = (mine, recorded) {
                    self.tracker.merge(stream.0, &clock);
                }
                Ok(())
            }
        }
    }

    pub(super) fn begin_capture_impl(&mut self, stream: StreamId) -> Result<(), GpuError> {
        if self.graphs.capturing(stream).is_some() {
            return Err(GpuError::Capture(format!(
                "stream {} is already capturing",
                stream.0
            )));
        }
        let id = self.graphs.next_capture;
        self.graphs.next_capture += 1;
        self.graphs.captures.insert(
            id,
            Capture {
                origin: stream,
                ops: Vec::new(),
                streams: vec![stream],
                allocations: BTreeSet::new(),
                clocks: HashMap::from([(stream.0, Vec::new())]),
            },
        );
        self.graphs.stream_capture[stream.0 as usize] = Some(id);
        tracing::debug!(stream = stream.0, "begin capture");
        Ok(())
    }

    pub(super) fn end_capture_impl(&mut self, stream: StreamId) -> Result<GraphId, GpuError> {
        let Some(id) = self.graphs.capturing(stream) else {
            return Err(GpuError::Capture(format!(
                "end_capture: stream {} is not capturing",
                stream.0
            )));
        };
        let origin = self.graphs.captures[&id].origin;
        if origin != stream {
            return Err(GpuError::Capture(format!(
                "end_capture: stream {} was forked into the capture of stream {}; end it there",
                stream.0, origin.0
            )));
        }
        // The capture ends here whether or not it is valid, as in CUDA.
        let capture = self.graphs.captures.remove(&id).expect("live capture");
        for member in &capture.streams {
            self.graphs.stream_capture[member.0 as usize] = None;
        }
        for event in &mut self.graphs.events {
            if event
                .captured
                .as_ref()
                .is_some_and(|(capture_id, _)| *capture_id == id)
            {
                event.captured = None;
            }
        }
        let empty = Vec::new();
        let origin_clock = capture.clocks.get(&origin.0).unwrap_or(&empty);
        for member in capture.streams.iter().filter(|member| **member != origin) {
            let own = capture
                .clocks
                .get(&member.0)
                .map_or(0, |clock| clock_get(clock, *member));
            if clock_get(origin_clock, *member) < own {
                return Err(GpuError::Capture(format!(
                    "unjoined stream {}: its captured work is not joined back to stream {} \
                     by an event the origin waits on",
                    member.0, origin.0
                )));
            }
        }
        let body = GraphBody {
            ops: capture.ops,
            streams: capture.streams,
            allocations: capture.allocations.into_iter().collect(),
        };
        self.add_graph_refs(&body.allocations);
        let graph = self.graphs.next_graph;
        self.graphs.next_graph += 1;
        tracing::debug!(
            graph,
            stream = stream.0,
            ops = body.ops.len(),
            streams = body.streams.len(),
            "end capture"
        );
        self.graphs.graphs.insert(graph, Arc::new(body));
        Ok(GraphId(graph))
    }

    fn add_graph_refs(&mut self, allocations: &[u64]) {
        for base in allocations {
            if let Some(allocation) = self.memory.get_mut(*base) {
                allocation.graph_refs += 1;
            }
        }
    }

    fn drop_graph_refs(&mut self, allocations: &[u64]) {
        for base in allocations {
            if let Some(allocation) = self.memory.get_mut(*base) {
                allocation.graph_refs -= 1;
            }
        }
    }

    pub(super) fn instantiate_impl(&mut self, graph: GraphId) -> Result<GraphExecId, GpuError> {
        let body = self
            .graphs
            .graphs
            .get(&graph.0)
            .cloned()
            .ok_or(GpuError::UnknownHandle {
                what: "graph",
                id: graph.0,
            })?;
        for op in &body.ops {
            if let CapturedOp::Launch { kernel, .. } = op {
                self.registry.get(*kernel)?;
            }
        }
        self.add_graph_refs(&body.allocations);
        let exec = self.graphs.next_exec;
        self.graphs.next_exec += 1;
        tracing::debug!(graph = graph.0, exec, "instantiate");
        self.graphs.execs.insert(exec, body);
        Ok(GraphExecId(exec))
    }

    pub(super) fn launch_graph_impl(
        &mut self,
        exec: GraphExecId,
        stream: StreamId,
    ) -> Result<(), GpuError> {
        let body = self
            .graphs
            .execs
            .get(&exec.0)
            .cloned()
            .ok_or(GpuError::UnknownHandle {
                what: "graph exec",
                id: exec.0,
            })?;
        if let Some(busy) = std::iter::once(&stream)
            .chain(&body.streams)
            .find(|s| self.graphs.capturing(**s).is_some())
        {
            return Err(GpuError::Capture(format!(
                "launch_graph: stream {} is capturing (graphs are not nested)",
                busy.0
            )));
        }
        for member in &body.streams {
            self.tracker.merge_streams(member.0, stream.0);
        }
        // Replay keeps its own events: the captured ones only order work inside the graph.
        let mut events: HashMap<u32, Vec<u32>> = HashMap::new();
        for op in &body.ops {
            match op {
                CapturedOp::Launch {
                    stream,
                    kernel,
                    config,
                    args,
                } => {
                    self.injected("graph_node")?;
                    let touches = self.check_args(*kernel, args)?;
                    self.execute_launch(*stream, *kernel, config, args, &touches)?;
                }
                CapturedOp::Record { stream, event } => {
                    events.insert(event.0, self.tracker.clock(stream.0).to_vec());
                }
                CapturedOp::Wait { stream, event } => {
                    if let Some(clock) = events.get(&event.0) {
                        self.tracker.merge(stream.0, clock);
                    }
                }
            }
        }
        for member in &body.streams {
            self.tracker.merge_streams(stream.0, member.0);
        }
        Ok(())
    }

    pub(super) fn destroy_graph_impl(&mut self, graph: GraphId) -> Result<(), GpuError> {
        let body = self
            .graphs
            .graphs
            .remove(&graph.0)
            .ok_or(GpuError::UnknownHandle {
                what: "graph",
                id: graph.0,
            })?;
        self.drop_graph_refs(&body.allocations);
        tracing::debug!(graph = graph.0, "destroy graph");
        Ok(())
    }

    pub(super) fn destroy_graph_exec_impl(&mut self, exec: GraphExecId) -> Result<(), GpuError> {
        let body = self
            .graphs
            .execs
            .remove(&exec.0)
            .ok_or(GpuError::UnknownHandle {
                what: "graph exec",
                id: exec.0,
            })?;
        self.drop_graph_refs(&body.allocations);
        tracing::debug!(exec = exec.0, "destroy graph exec");
        Ok(())
    }
}
