//! Pass 5, linearise: the submission order of launches and event steps, per stream.
//!
//! Invariants: every group is launched once, in the topo order; an event is recorded once,
//! right after its producer (or at the step's start), before any wait on it; waits come
//! right before their consumer (or at the step's end, on stream 0).

use super::streams::StreamPlan;
use crate::fuser::GroupId;
use crate::plan::{EventId, Step, StepKind};

/// Returns the steps and the number of events.
pub fn linearise(order: &[GroupId], streams: &StreamPlan) -> (Vec<Step>, usize) {
    // Event i is recorded after producer `events[i]` (None: the step's start).
    let mut events: Vec<Option<GroupId>> = Vec::new();
    let needed = |p: Option<GroupId>| streams.syncs.iter().any(|y| y.producer == p);
    let event_of = |events: &[Option<GroupId>], p: Option<GroupId>| {
        events
            .iter()
            .position(|q| *q == p)
            .map(|i| EventId(i as u32))
    };
    let mut steps = Vec::new();
    if needed(None) {
        events.push(None);
        steps.push(Step {
            stream: 0,
            kind: StepKind::Record(EventId(0)),
        });
    }
    for &g in order {
        let stream = streams.stream_of[g.0 as usize];
        for sync in streams.syncs.iter().filter(|y| y.consumer == Some(g)) {
            if let Some(e) = event_of(&events, sync.producer) {
                steps.push(Step {
                    stream,
                    kind: StepKind::Wait(e),
                });
            }
        }
        steps.push(Step {
            stream,
            kind: StepKind::Launch(g),
        });
        if needed(Some(g)) {
            let e = EventId(events.len() as u32);
            events.push(Some(g));
            steps.push(Step {
                stream,
                kind: StepKind::Record(e),
            });
        }
    }
    for sync in streams.syncs.iter().filter(|y| y.consumer.is_none()) {
        if let Some(e) = event_of(&events, sync.producer) {
            steps.push(Step {
                stream: 0,
                kind: StepKind::Wait(e),
            });
        }
    }
    (steps, events.len())
}
