//! Pass 3, streams: which stream runs each group, the event syncs that order cross-stream
//! uses, and the happens-before relation as vector clocks.
//!
//! Invariants: a group runs on the stream of its branch hint, clamped to `max_streams`
//! (branch 0 = the model's stream, 0); every read of a tensor written on another stream is
//! preceded by a sync; side streams fork from and join back into stream 0 within the step, so
//! the step can be captured into one graph.

use crate::fuser::{FusionPlan, GroupId};
use crate::ir::Circuit;

/// Record an event after `producer` (None: at the start of the step, on stream 0) and wait
/// for it before `consumer` (None: at the end of the step, on stream 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sync {
    pub producer: Option<GroupId>,
    pub consumer: Option<GroupId>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPlan {
    pub stream_of: Vec<u8>,
    pub num_streams: usize,
    pub syncs: Vec<Sync>,
    /// Vector clock of each group (one entry per stream) at its launch.
    pub clocks: Vec<Vec<u32>>,
}

impl StreamPlan {
    /// `a` finishes before `b` starts, on every backend.
    pub fn happens_before(&self, a: GroupId, b: GroupId) -> bool {
        happens_before(&self.clocks, &self.stream_of, a, b)
    }
}

/// Strict happens-before from vector clocks.
pub fn happens_before(clocks: &[Vec<u32>], stream_of: &[u8], a: GroupId, b: GroupId) -> bool {
    let s = stream_of[a.0 as usize] as usize;
    a != b && clocks[a.0 as usize][s] <= clocks[b.0 as usize][s]
}

pub fn assign_streams(
    circuit: &Circuit,
    fusion: &FusionPlan,
    order: &[GroupId],
    max_streams: usize,
) -> StreamPlan {
    let cap = max_streams.max(1) - 1;
    let hinted: Vec<usize> = fusion
        .groups
        .iter()
        .map(|g| (g.branch as usize).min(cap))
        .collect();
    // Number the streams in use densely, keeping 0 for the model's stream.
    let mut used: Vec<usize> = hinted.clone();
    used.push(0);
    used.sort_unstable();
    used.dedup();
    let stream_of: Vec<u8> = hinted
        .iter()
        .map(|s| used.iter().position(|u| u == s).unwrap_or(0) as u8)
        .collect();
    let num_streams = used.len();

    let mut position = vec![0usize; fusion.groups.len()];
    for (pos, g) in order.iter().enumerate() {
        position[g.0 as usize] = pos;
    }
    let mut now = vec![vec![0u32; num_streams]; num_streams];
    let mut clocks = vec![Vec::new(); fusion.groups.len()];
    let mut syncs = Vec::new();
    let mut started = vec![false; num_streams];
    for &g in order {
        let s = stream_of[g.0 as usize] as usize;
        let group = fusion.group(g);
        let mut producers: Vec<GroupId> = group
            .inputs
            .iter()
            .filter_map(|&t| circuit.producer(t))
            .map(|n| fusion.group_of[n.0 as usize])
            .collect();
        producers.sort();
        producers.dedup();
        // Latest first: one wait on a stream's last producer orders its earlier ones too.
        producers.sort_by_key(|p| std::cmp::Reverse(position[p.0 as usize]));
        for p in producers {
            let ps = stream_of[p.0 as usize] as usize;
            if ps != s && now[s][ps] < clocks[p.0 as usize][ps] {
                syncs.push(Sync {
                    producer: Some(p),
                    consumer: Some(g),
                });
                let theirs = clocks[p.0 as usize].clone();
                merge(&mut now[s], &theirs);
            }
        }
        if s != 0 && !started[s] && !syncs.iter().any(|y| y.consumer == Some(g)) {
            // A side stream joins the step (and a capture) by waiting on stream 0.
            syncs.push(Sync {
                producer: None,
                consumer: Some(g),
            });
        }
        started[s] = true;
        now[s][s] += 1;
        clocks[g.0 as usize] = now[s].clone();
    }
    for s in 1..num_streams {
        if now[0][s] < now[s][s] {
            let last = order
                .iter()
                .rev()
                .find(|g| stream_of[g.0 as usize] as usize == s);
            syncs.push(Sync {
                producer: last.copied(),
                consumer: None,
            });
            let theirs = now[s].clone();
            merge(&mut now[0], &theirs);
        }
    }
    StreamPlan {
        stream_of,
        num_streams,
        syncs,
        clocks,
    }
}

fn merge(into: &mut [u32], from: &[u32]) {
    for (a, b) in into.iter_mut().zip(from) {
        *a = (*a).max(*b);
    }
}
