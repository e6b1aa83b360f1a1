//! Pass 5, linearise: the submission order of launches and event steps, per stream.
//!
//! Invariants: every group is launched once, in the topo order; an event is recorded once,
//! right after its producer (or at the step's start), before any wait on it; waits come
//! right before their consumer (or at the step's end, on stream 0).

use std::collections::{HashMap, HashSet};

use super::streams::StreamPlan;
use crate::fuser::GroupId;
use crate::plan::{EventId, Step, StepKind};

/// Returns the steps and the number of events. Linear in groups and syncs: the syncs are
/// indexed by producer and consumer once (a scan of every sync per group was quadratic in
/// layers).
pub fn linearise(order: &[GroupId], streams: &StreamPlan) -> (Vec<Step>, usize) {
    // Event i is recorded after producer `events[i]` (None: the step's start).
    let mut events: Vec<Option<GroupId>> = Vec::new();
    let producers: HashSet<Option<GroupId>> = streams.syncs.iter().map(|y| y.producer).collect();
    let needed = |p: Option<GroupId>| producers.contains(&p);
    // Each consumer's syncs, in the order of `syncs`.
    let mut waits_of: HashMap<Option<GroupId>, Vec<Option<GroupId>>> = HashMap::new();
    for sync in &streams.syncs {
        waits_of
            .entry(sync.consumer)
            .or_default()
            .push(sync.producer);
    }
    // The event recorded after each producer so far (one per producer: it is recorded once).
    let mut event_index: HashMap<Option<GroupId>, EventId> = HashMap::new();
    let mut steps = Vec::new();
    if needed(None) {
        events.push(None);
        event_index.insert(None, EventId(0));
        steps.push(Step {
            stream: 0,
            kind: StepKind::Record(EventId(0)),
        });
    }
    for &g in order {
        let stream = streams.stream_of[g.0 as usize];
        for producer in waits_of.get(&Some(g)).into_iter().flatten() {
            if let Some(&e) = event_index.get(producer) {
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
            event_index.entry(Some(g)).or_insert(e);
            steps.push(Step {
                stream,
                kind: StepKind::Record(e),
            });
        }
    }
    for producer in waits_of.get(&None).into_iter().flatten() {
        if let Some(&e) = event_index.get(producer) {
            steps.push(Step {
                stream: 0,
                kind: StepKind::Wait(e),
            });
        }
    }
    (steps, events.len())
}
