//! Events, captures, graphs and graph execs as the layer sees them, and graph replay through
//! the race tracker.
//!
//! Capture follows CUDA (and `cpu::graph`): launches on the capturing stream, and on any
//! stream that waited on an event recorded in the capture, are recorded instead of tracked.
//! A graph's launches are race-checked when an exec of it is launched, on their recorded
//! streams, ordered after the launching stream.
//!
//! Invariants: an allocation an active capture, a live graph or a live graph exec touches is
//! `referenced` (so it cannot be freed); replay never touches the user's events.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::cpu::hb::{Conflict, Touch, Tracker};
use crate::error::GpuError;
use crate::types::{EventId, GraphExecId, GraphId, StreamId};

/// One captured operation, on a tracker lane.
#[derive(Debug, Clone)]
enum Op {
    Launch { lane: u32, touches: Vec<Touch> },
    Record { lane: u32, event: EventId },
    Wait { lane: u32, event: EventId },
}

/// What a graph holds; shared by the graph and its execs.
#[derive(Debug)]
pub(super) struct Body {
    ops: Vec<Op>,
    /// Origin first, then forked streams in the order they joined.
    lanes: Vec<u32>,
    allocations: BTreeSet<u64>,
}

struct Capture {
    origin: StreamId,
    members: Vec<StreamId>,
    body: Body,
}

#[derive(Debug, Default)]
struct Event {
    /// The clock of its last eager record.
    clock: Option<Vec<u32>>,
    /// The capture it was last recorded in, while that capture is active.
    captured: Option<u32>,
}

#[derive(Default)]
pub(super) struct Graphs {
    events: HashMap<EventId, Event>,
    stream_capture: HashMap<StreamId, u32>,
    captures: HashMap<u32, Capture>,
    next_capture: u32,
    graphs: HashMap<GraphId, Arc<Body>>,
    execs: HashMap<GraphExecId, Arc<Body>>,
}

impl Graphs {
    pub(super) fn capturing(&self, stream: StreamId) -> Option<u32> {
        self.stream_capture.get(&stream).copied()
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

    /// Whether an active capture, a live graph or a live graph exec touches allocation `base`.
    pub(super) fn references(&self, base: u64) -> bool {
        let captured = self.captures.values().map(|capture| &capture.body);
        let live = self
            .graphs
            .values()
            .chain(self.execs.values())
            .map(|b| &**b);
        captured
            .chain(live)
            .any(|body| body.allocations.contains(&base))
    }

    pub(super) fn add_event(&mut self, event: EventId) {
        self.events.insert(event, Event::default());
    }

    pub(super) fn remove_event(&mut self, event: EventId) {
        self.events.remove(&event);
    }

    pub(super) fn check_event(&self, event: EventId) -> Result<(), GpuError> {
        match self.events.contains_key(&event) {
            true => Ok(()),
            false => Err(GpuError::UnknownHandle {
                what: "event",
                id: event.0,
            }),
        }
    }

    /// A record of `event` on `stream` (whose tracker clock is `clock`), accepted by the
    /// inner backend.
    pub(super) fn record(&mut self, event: EventId, stream: StreamId, lane: u32, clock: Vec<u32>) {
        let capture = self.capturing(stream);
        let Some(state) = self.events.get_mut(&event) else {
            return;
        };
        match capture.and_then(|id| self.captures.get_mut(&id).map(|c| (id, c))) {
            Some((id, capture)) => {
                capture.body.ops.push(Op::Record { lane, event });
                state.captured = Some(id);
            }
            None => {
                state.clock = Some(clock);
                state.captured = None;
            }
        }
    }

    /// A wait of `stream` on `event`, accepted by the inner backend; returns the clock the
    /// stream's lane must merge (an eager wait on an eagerly recorded event).
    pub(super) fn wait(&mut self, stream: StreamId, lane: u32, event: EventId) -> Option<Vec<u32>> {
        let state = self.events.get(&event)?;
        let mine = self.capturing(stream);
        match state.captured {
            Some(theirs) if mine.is_none_or(|mine| mine == theirs) => {
                let capture = self.captures.get_mut(&theirs)?;
                if mine.is_none() {
                    // A fork: the stream joins the capture.
                    capture.members.push(stream);
                    capture.body.lanes.push(lane);
                    self.stream_capture.insert(stream, theirs);
                }
                capture.body.ops.push(Op::Wait { lane, event });
                None
            }
            Some(_) => None,
            None if mine.is_some() => None,
            None => state.clock.clone(),
        }
    }

    pub(super) fn begin(&mut self, stream: StreamId, lane: u32) {
        let id = self.next_capture;
        self.next_capture += 1;
        self.captures.insert(
            id,
            Capture {
                origin: stream,
                members: vec![stream],
                body: Body {
                    ops: Vec::new(),
                    lanes: vec![lane],
                    allocations: BTreeSet::new(),
                },
            },
        );
        self.stream_capture.insert(stream, id);
    }

    pub(super) fn capture_launch(&mut self, capture: u32, lane: u32, touches: &[Touch]) {
        if let Some(capture) = self.captures.get_mut(&capture) {
            let body = &mut capture.body;
            body.allocations.extend(touches.iter().map(|t| t.alloc));
            body.ops.push(Op::Launch {
                lane,
                touches: touches.to_vec(),
            });
        }
    }

    /// `end_capture` on `stream` returned `graph` (`None`: it failed). A capture ends at its
    /// origin whether or not it was valid, as in CUDA.
    pub(super) fn end(&mut self, stream: StreamId, graph: Option<GraphId>) {
        let Some(id) = self.capturing(stream) else {
            return;
        };
        if self.captures[&id].origin != stream {
            return;
        }
        let capture = self.captures.remove(&id).expect("live capture");
        for member in &capture.members {
            self.stream_capture.remove(member);
        }
        for event in self.events.values_mut() {
            if event.captured == Some(id) {
                event.captured = None;
            }
        }
        if let Some(graph) = graph {
            self.graphs.insert(graph, Arc::new(capture.body));
        }
    }

    pub(super) fn graph(&self, graph: GraphId) -> Result<Arc<Body>, GpuError> {
        self.graphs
            .get(&graph)
            .cloned()
            .ok_or(GpuError::UnknownHandle {
                what: "graph",
                id: graph.0,
            })
    }

    pub(super) fn exec(&self, exec: GraphExecId) -> Result<Arc<Body>, GpuError> {
        self.execs
            .get(&exec)
            .cloned()
            .ok_or(GpuError::UnknownHandle {
                what: "graph exec",
                id: exec.0,
            })
    }

    pub(super) fn add_exec(&mut self, exec: GraphExecId, body: Arc<Body>) {
        self.execs.insert(exec, body);
    }

    pub(super) fn remove_graph(&mut self, graph: GraphId) {
        self.graphs.remove(&graph);
    }

    pub(super) fn remove_exec(&mut self, exec: GraphExecId) {
        self.execs.remove(&exec);
    }
}

/// Race-checks and records a graph's launches on `tracker`, as launched on `lane`; on a
/// race, returns the lane of the racing launch and the conflict.
pub(super) fn replay(tracker: &mut Tracker, body: &Body, lane: u32) -> Result<(), (u32, Conflict)> {
    for member in &body.lanes {
        tracker.merge_streams(*member, lane);
    }
    // Replay keeps its own events: the captured ones only order work inside the graph.
    let mut events: HashMap<EventId, Vec<u32>> = HashMap::new();
    for op in &body.ops {
        match op {
            Op::Launch { lane, touches } => {
                tracker.check(*lane, touches).map_err(|c| (*lane, c))?;
                let epoch = tracker.tick(*lane);
                tracker.record(*lane, epoch, touches);
            }
            Op::Record { lane, event } => {
                events.insert(*event, tracker.clock(*lane).to_vec());
            }
            Op::Wait { lane, event } => {
                if let Some(clock) = events.get(event) {
                    tracker.merge(*lane, clock);
                }
            }
        }
    }
    for member in &body.lanes {
        tracker.merge_streams(lane, *member);
    }
    Ok(())
}
