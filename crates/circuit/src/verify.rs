//! The plan verifier: checks a plan's invariants between passes and on the finished plan.
//!
//! [`verify_plan`] re-derives happens-before from the steps alone (vector clocks advanced by
//! launches, records and waits), independently of the streams pass, so a wrong pass cannot
//! vouch for itself. Checks: every node covered once by available kernels; order respects
//! data flow; every cross-stream use ordered by an event; side streams join stream 0; every
//! kept arena edge has one aligned buffer inside the pool; no two buffers that may be live at
//! the same time overlap.
//!
//! It reads `plan` and the passes' results, never the driver (`planner::driver`) that calls it.

use std::collections::HashSet;

use crate::error::CircuitError;
use crate::fuser::{FusionPlan, GroupId};
use crate::ir::{Binding, Circuit};
use crate::plan::{Buffer, ExecutionPlan, StepKind};
use crate::planner::liveness::Lifetime;
use crate::planner::memory::{align_up, Placement, ALIGN};
use crate::planner::streams::{happens_before, StreamPlan};
use crate::policy::Available;

fn fail<T>(pass: &'static str, message: String) -> Result<T, CircuitError> {
    Err(CircuitError::Verify { pass, message })
}

/// After fuse: each node in exactly one group, each group's kernels available.
pub fn check_cover(
    circuit: &Circuit,
    fusion: &FusionPlan,
    available: &Available,
) -> Result<(), CircuitError> {
    let mut seen = vec![0usize; circuit.ops.len()];
    for (gi, g) in fusion.groups.iter().enumerate() {
        if g.nodes.is_empty() {
            return fail("fuse", format!("group {gi} ({}) covers no node", g.rule));
        }
        for k in &g.kernels {
            if !available.kernels.contains(k) {
                return fail(
                    "fuse",
                    format!("group {gi} runs kernel `{k}` the modules lack"),
                );
            }
        }
        for n in &g.nodes {
            seen[n.0 as usize] += 1;
            if fusion.group_of[n.0 as usize] != GroupId(gi as u32) {
                return fail(
                    "fuse",
                    format!("op `{}` mapped to the wrong group", circuit.op(*n).name),
                );
            }
        }
    }
    if let Some((n, count)) = seen.iter().enumerate().find(|(_, c)| **c != 1) {
        return fail(
            "fuse",
            format!("op `{}` is covered {count} times", circuit.ops[n].name),
        );
    }
    Ok(())
}

/// After topo: a permutation of the groups in which writers come before readers.
pub fn check_order(
    circuit: &Circuit,
    fusion: &FusionPlan,
    order: &[GroupId],
) -> Result<(), CircuitError> {
    let mut position = vec![usize::MAX; fusion.groups.len()];
    for (pos, g) in order.iter().enumerate() {
        if position[g.0 as usize] != usize::MAX {
            return fail("topo", format!("group {} ordered twice", g.0));
        }
        position[g.0 as usize] = pos;
    }
    if order.len() != fusion.groups.len() {
        return fail(
            "topo",
            format!("{} of {} groups ordered", order.len(), fusion.groups.len()),
        );
    }
    for (gi, g) in fusion.groups.iter().enumerate() {
        for &t in &g.inputs {
            if let Some(p) = circuit.producer(t) {
                let writer = fusion.group_of[p.0 as usize];
                if position[writer.0 as usize] >= position[gi] {
                    return fail(
                        "topo",
                        format!("`{}` is read before it is written", circuit.tensor(t).name),
                    );
                }
            }
        }
    }
    Ok(())
}

/// After liveness: one lifetime per kept arena edge, spanning writer to last reader.
pub fn check_liveness(
    circuit: &Circuit,
    fusion: &FusionPlan,
    order: &[GroupId],
    lifetimes: &[Lifetime],
) -> Result<(), CircuitError> {
    let kept: usize = fusion
        .groups
        .iter()
        .flat_map(|g| &g.outputs)
        .filter(|t| circuit.tensor(**t).binding == Binding::Arena)
        .count();
    if kept != lifetimes.len() {
        return fail(
            "liveness",
            format!("{kept} kept arena edges but {} lifetimes", lifetimes.len()),
        );
    }
    for l in lifetimes {
        let readers_at: Vec<usize> = circuit
            .consumers(l.tensor)
            .iter()
            .map(|n| fusion.group_of[n.0 as usize])
            .filter_map(|g| order.iter().position(|o| *o == g))
            .collect();
        if readers_at.iter().any(|p| *p > l.last || *p < l.first) || order[l.first] != l.writer {
            return fail(
                "liveness",
                format!(
                    "`{}` read outside its lifetime",
                    circuit.tensor(l.tensor).name
                ),
            );
        }
    }
    Ok(())
}

/// After streams: every data edge is ordered by happens-before.
pub fn check_streams(
    circuit: &Circuit,
    fusion: &FusionPlan,
    streams: &StreamPlan,
) -> Result<(), CircuitError> {
    check_edges_ordered(circuit, fusion, "streams", |a, b| {
        streams.happens_before(a, b)
    })
}

fn check_edges_ordered(
    circuit: &Circuit,
    fusion: &FusionPlan,
    pass: &'static str,
    happens_before: impl Fn(GroupId, GroupId) -> bool,
) -> Result<(), CircuitError> {
    for (gi, g) in fusion.groups.iter().enumerate() {
        for &t in &g.inputs {
            if let Some(p) = circuit.producer(t) {
                let writer = fusion.group_of[p.0 as usize];
                if !happens_before(writer, GroupId(gi as u32)) {
                    return fail(
                        pass,
                        format!(
                            "`{}` is read by group {gi} with no event ordering it after its \
                             writer (group {})",
                            circuit.tensor(t).name,
                            writer.0
                        ),
                    );
                }
            }
        }
    }
    Ok(())
}

/// After memory: aligned, inside the pool, conflicting buffers disjoint, pool >= bound.
pub fn check_memory(
    lifetimes: &[Lifetime],
    adjacency: &[Vec<usize>],
    placement: &Placement,
    live_lower_bound: usize,
) -> Result<(), CircuitError> {
    for (i, l) in lifetimes.iter().enumerate() {
        let (start, end) = (
            placement.offsets[i],
            placement.offsets[i].saturating_add(align_up(l.bytes)),
        );
        if start % ALIGN != 0 || end > placement.pool_bytes {
            return fail(
                "memory",
                format!("buffer {i} at {start}..{end} misaligned or outside the pool"),
            );
        }
        for &j in &adjacency[i] {
            let (s2, e2) = (
                placement.offsets[j],
                placement.offsets[j].saturating_add(align_up(lifetimes[j].bytes)),
            );
            if start < e2 && s2 < end {
                return fail(
                    "memory",
                    format!("buffers {i} and {j} may be live together but overlap"),
                );
            }
        }
    }
    if placement.pool_bytes < live_lower_bound {
        return fail(
            "memory",
            format!(
                "pool {} below the lower bound {live_lower_bound}",
                placement.pool_bytes
            ),
        );
    }
    Ok(())
}

/// The whole plan, with happens-before taken from its steps.
pub fn verify_plan(
    circuit: &Circuit,
    plan: &ExecutionPlan,
    available: &Available,
) -> Result<(), CircuitError> {
    const PASS: &str = "linearise";
    let fusion = &plan.fusion;
    check_cover(circuit, fusion, available)?;
    check_order(circuit, fusion, &plan.order)?;
    let clocks = replay_steps(plan, PASS)?;
    let hb = |a: GroupId, b: GroupId| happens_before(&clocks, &plan.stream_of, a, b);
    check_edges_ordered(circuit, fusion, PASS, hb)?;
    check_buffers(circuit, plan, hb)
}

/// Replays the plan's steps with one vector clock per stream: every step on a real stream,
/// each group launched once in order on its own stream, each event recorded once before it is
/// waited on, every stream joined into stream 0 by the end. Returns each group's launch clock.
fn replay_steps(plan: &ExecutionPlan, pass: &'static str) -> Result<Vec<Vec<u32>>, CircuitError> {
    let streams = plan.num_streams;
    let mut now = vec![vec![0u32; streams]; streams];
    let mut events: Vec<Option<Vec<u32>>> = vec![None; plan.event_count];
    let mut clocks: Vec<Vec<u32>> = vec![Vec::new(); plan.fusion.groups.len()];
    let mut launched = Vec::new();
    for (i, step) in plan.steps.iter().enumerate() {
        let s = step.stream as usize;
        if s >= streams {
            return fail(pass, format!("step {i} on stream {s} of {streams}"));
        }
        match step.kind {
            StepKind::Launch(g) => {
                if plan.stream_of.get(g.0 as usize) != Some(&step.stream) {
                    return fail(
                        pass,
                        format!("step {i} launches group {} on the wrong stream", g.0),
                    );
                }
                now[s][s] += 1;
                clocks[g.0 as usize] = now[s].clone();
                launched.push(g);
            }
            StepKind::Record(e) => match events.get_mut(e.0 as usize) {
                Some(slot @ None) => *slot = Some(now[s].clone()),
                _ => {
                    return fail(
                        pass,
                        format!("step {i} records event {} twice or out of range", e.0),
                    )
                }
            },
            StepKind::Wait(e) => match events.get(e.0 as usize) {
                Some(Some(clock)) => {
                    let clock = clock.clone();
                    for (a, b) in now[s].iter_mut().zip(&clock) {
                        *a = (*a).max(*b);
                    }
                }
                _ => {
                    return fail(
                        pass,
                        format!("step {i} waits on event {} before it is recorded", e.0),
                    )
                }
            },
        }
    }
    if launched != plan.order {
        return fail(
            pass,
            "the steps do not launch every group once, in order".to_string(),
        );
    }
    for (s, clock) in now.iter().enumerate().skip(1) {
        if now[0][s] < clock[s] {
            return fail(
                pass,
                format!("stream {s} never joins stream 0 before the step ends"),
            );
        }
    }
    Ok(clocks)
}

/// The kept arena edges and the plan's buffers match one to one, each buffer is aligned inside
/// the pool, buffers that share bytes are ordered by `hb`, and the pool is at least the live
/// lower bound.
fn check_buffers(
    circuit: &Circuit,
    plan: &ExecutionPlan,
    hb: impl Fn(GroupId, GroupId) -> bool,
) -> Result<(), CircuitError> {
    let arena: HashSet<_> = plan
        .fusion
        .groups
        .iter()
        .flat_map(|g| g.outputs.iter().copied())
        .filter(|t| circuit.tensor(*t).binding == Binding::Arena)
        .collect();
    let buffered: HashSet<_> = plan.buffers.iter().map(|b| b.tensor).collect();
    if arena != buffered || buffered.len() != plan.buffers.len() {
        return fail(
            "memory",
            "kept arena edges and buffers do not match one to one".to_string(),
        );
    }
    for (i, a) in plan.buffers.iter().enumerate() {
        let end = a.offset.saturating_add(align_up(a.bytes));
        if a.offset % ALIGN != 0 || end > plan.pool_bytes {
            return fail(
                "memory",
                format!("buffer `{}` misaligned or outside the pool", a.name),
            );
        }
        for b in &plan.buffers[i + 1..] {
            let overlap = a.offset < b.offset.saturating_add(align_up(b.bytes)) && b.offset < end;
            if !overlap {
                // Only buffers that share bytes need ordering; most pairs stop here.
                continue;
            }
            let uses = |x: &Buffer| -> Vec<GroupId> {
                if x.readers.is_empty() {
                    vec![x.writer]
                } else {
                    x.readers.clone()
                }
            };
            let ordered = uses(a).iter().all(|&u| hb(u, b.writer))
                || uses(b).iter().all(|&u| hb(u, a.writer));
            if !ordered {
                return fail(
                    "memory",
                    format!(
                        "`{}` and `{}` may be live together but share bytes",
                        a.name, b.name
                    ),
                );
            }
        }
    }
    if plan.pool_bytes < plan.live_lower_bound {
        return fail("memory", "pool below the live lower bound".to_string());
    }
    Ok(())
}
