//! Pass 4, memory: offsets for every arena buffer in one arena, and the lower bound. First-fit
//! under several orderings, then, where none reaches the bound, `search`.
//!
//! Invariants: offsets are multiples of [`ALIGN`]; two buffers that may be live at the same
//! time (neither's uses all happen before the other's writer) never share a byte;
//! `pool_bytes` is at least `live_lower_bound`, the peak over steps of the live aligned bytes,
//! and at least `lower_bound`, which adds the heaviest set of buffers found that may all be
//! live at once (side streams can make that heavier than any one step's live bytes). Sizes
//! saturate, never wrap: `usize::MAX` marks an arena too large, which the driver refuses.

mod search;

use std::collections::BTreeSet;

use super::liveness::Lifetime;
use super::streams::StreamPlan;
use crate::fuser::GroupId;

/// Every buffer starts on a 256-byte boundary (vector loads, TMA and cp.async want it).
pub const ALIGN: usize = 256;

/// `bytes` rounded up to `ALIGN`; saturates rather than wrap (the driver refuses a buffer
/// above `MAX_TENSOR_BYTES` before placing anything).
pub fn align_up(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN).saturating_mul(ALIGN)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub offsets: Vec<usize>,
    pub pool_bytes: usize,
    /// Which ordering won, or `gap-search` (for the plan's display).
    pub strategy: &'static str,
}

/// Which buffers may be live together, as adjacency lists over lifetime indices, each list
/// ascending: `a` and `b` conflict unless every use of one happens before the other's writer.
///
/// A sweep in linear order, near-linear in the buffers plus the conflicts found (the pairwise
/// test took 4,096 layers quadratic time). Buffers whose [first, last] positions overlap
/// always conflict: a use at or after a writer's launch cannot happen before it. A buffer
/// that ended before `b`'s writer conflicts with it only through a use on another stream that
/// `b`'s writer has not synced with: one whose own-stream clock is above the writer's entry
/// for that stream. Per stream, ended buffers are kept by that clock, so the query is a range.
pub fn conflicts(lifetimes: &[Lifetime], streams: &StreamPlan) -> Vec<Vec<usize>> {
    let clock = |g: GroupId, s: usize| streams.clocks[g.0 as usize][s];
    let stream = |g: GroupId| streams.stream_of[g.0 as usize] as usize;
    let mut by_first: Vec<usize> = (0..lifetimes.len()).collect();
    by_first.sort_by_key(|&i| (lifetimes[i].first, i));
    let mut by_last: Vec<usize> = by_first.clone();
    by_last.sort_by_key(|&i| (lifetimes[i].last, i));

    let mut adjacency = vec![Vec::new(); lifetimes.len()];
    // Buffers begun and not yet ended at the sweep's position, and, per stream, the ended
    // ones by the latest own-stream clock of their uses on that stream.
    let mut active: BTreeSet<usize> = BTreeSet::new();
    let mut ended: Vec<BTreeSet<(u32, usize)>> = vec![BTreeSet::new(); streams.num_streams];
    let mut next_end = 0;
    let mut seen = vec![usize::MAX; lifetimes.len()];
    for &b in &by_first {
        let lb = &lifetimes[b];
        while next_end < by_last.len() && lifetimes[by_last[next_end]].last < lb.first {
            let a = by_last[next_end];
            next_end += 1;
            active.remove(&a);
            for &u in uses(&lifetimes[a]) {
                let s = stream(u);
                ended[s].insert((clock(u, s), a));
            }
        }
        for &a in &active {
            adjacency[a].push(b);
            adjacency[b].push(a);
        }
        for (s, by_clock) in ended.iter().enumerate() {
            if s == stream(lb.writer) {
                // Every earlier use on the writer's own stream precedes it.
                continue;
            }
            let synced = clock(lb.writer, s);
            for &(_, a) in by_clock.range((synced + 1, 0)..) {
                if seen[a] != b {
                    seen[a] = b;
                    adjacency[a].push(b);
                    adjacency[b].push(a);
                }
            }
        }
        active.insert(b);
    }
    for list in &mut adjacency {
        list.sort_unstable();
    }
    adjacency
}

/// The groups that use a buffer: its readers, or its writer alone when nothing reads it.
fn uses(l: &Lifetime) -> &[GroupId] {
    if l.readers.is_empty() {
        std::slice::from_ref(&l.writer)
    } else {
        &l.readers
    }
}

/// The pairwise definition `conflicts` computes, quadratic: kept as its specification and
/// checked against it in tests.
pub fn conflicts_pairwise(
    lifetimes: &[Lifetime],
    happens_before: impl Fn(GroupId, GroupId) -> bool,
) -> Vec<Vec<usize>> {
    let done_before =
        |a: &Lifetime, b: &Lifetime| uses(a).iter().all(|&u| happens_before(u, b.writer));
    let mut adjacency = vec![Vec::new(); lifetimes.len()];
    for i in 0..lifetimes.len() {
        for j in i + 1..lifetimes.len() {
            let (a, b) = (&lifetimes[i], &lifetimes[j]);
            if !done_before(a, b) && !done_before(b, a) {
                adjacency[i].push(j);
                adjacency[j].push(i);
            }
        }
    }
    adjacency
}

/// Peak over positions of the sum of aligned bytes live there (linear order).
pub fn live_lower_bound(lifetimes: &[Lifetime], positions: usize) -> usize {
    // i128: the sums of usize sizes neither wrap nor change sign.
    let mut delta = vec![0i128; positions + 1];
    for l in lifetimes {
        delta[l.first] += align_up(l.bytes) as i128;
        delta[l.last + 1] -= align_up(l.bytes) as i128;
    }
    let mut live = 0i128;
    let mut peak = 0i128;
    for d in delta {
        live += d;
        peak = peak.max(live);
    }
    usize::try_from(peak).unwrap_or(usize::MAX)
}

/// The plan's lower bound: `live_lower_bound` (linear order), raised, where `pool_bytes` misses
/// it, to the heaviest conflict clique found (`search::clique_bound`: buffers that pairwise
/// may be live together, so no placement is smaller). Where the pool reaches the linear bound
/// the clique is not looked for: it cannot be heavier than a placement.
pub fn lower_bound(
    lifetimes: &[Lifetime],
    adjacency: &[Vec<usize>],
    live_lower_bound: usize,
    pool_bytes: usize,
) -> usize {
    if pool_bytes <= live_lower_bound {
        return live_lower_bound;
    }
    live_lower_bound.max(search::clique_bound(lifetimes, adjacency))
}

/// Greedy first-fit under several orderings, keeping the smallest arena (ties keep the
/// earlier ordering). Largest-first is the classic; the others repair its fragmentation on
/// circuits whose buffer sizes are close to one another. When none reaches
/// `live_lower_bound` nor the heaviest conflict clique found (`search::clique_bound`, which
/// side streams can lift above the linear bound), a bounded search (`search::tightest`)
/// tries that floor and capacities between it and the greedy pool, and wins if it packs
/// tighter: first-fit places every repetition of a layer alike, and some layers pack to the
/// bound only when consecutive ones differ.
pub fn place(
    lifetimes: &[Lifetime],
    adjacency: &[Vec<usize>],
    live_lower_bound: usize,
) -> Placement {
    let size = |i: usize| align_up(lifetimes[i].bytes);
    let span = |i: usize| lifetimes[i].last - lifetimes[i].first + 1;
    type Key<'a> = Box<dyn Fn(usize) -> (usize, usize, usize) + 'a>;
    let orderings: [(&'static str, Key); 5] = [
        (
            "greedy-by-size",
            Box::new(move |i| (usize::MAX - size(i), lifetimes[i].first, i)),
        ),
        (
            "greedy-by-start",
            Box::new(move |i| (lifetimes[i].first, usize::MAX - size(i), i)),
        ),
        (
            "greedy-by-area",
            Box::new(move |i| (usize::MAX - size(i) * span(i), lifetimes[i].first, i)),
        ),
        (
            "greedy-by-span",
            Box::new(move |i| (usize::MAX - span(i), usize::MAX - size(i), i)),
        ),
        (
            "greedy-by-conflicts",
            Box::new(move |i| (usize::MAX - adjacency[i].len(), usize::MAX - size(i), i)),
        ),
    ];
    let mut best: Option<Placement> = None;
    for (strategy, key) in orderings {
        let mut order: Vec<usize> = (0..lifetimes.len()).collect();
        order.sort_by_key(|&i| key(i));
        let candidate = first_fit(lifetimes, adjacency, &order, strategy);
        if best
            .as_ref()
            .is_none_or(|b| candidate.pool_bytes < b.pool_bytes)
        {
            best = Some(candidate);
        }
    }
    let greedy = best.unwrap_or(Placement {
        offsets: Vec::new(),
        pool_bytes: 0,
        strategy: "empty",
    });
    if greedy.pool_bytes <= live_lower_bound {
        return greedy;
    }
    let floor = live_lower_bound.max(search::clique_bound(lifetimes, adjacency));
    if greedy.pool_bytes <= floor {
        return greedy;
    }
    match search::tightest(lifetimes, adjacency, floor, greedy.pool_bytes) {
        Some((offsets, pool_bytes)) => Placement {
            offsets,
            pool_bytes,
            strategy: "gap-search",
        },
        None => greedy,
    }
}

fn first_fit(
    lifetimes: &[Lifetime],
    adjacency: &[Vec<usize>],
    order: &[usize],
    strategy: &'static str,
) -> Placement {
    let mut offsets: Vec<Option<usize>> = vec![None; lifetimes.len()];
    let mut pool_bytes = 0;
    let mut taken: Vec<(usize, usize)> = Vec::new();
    for &i in order {
        let size = align_up(lifetimes[i].bytes);
        taken.clear();
        taken.extend(adjacency[i].iter().filter_map(|&j| {
            offsets[j].map(|o| (o, o.saturating_add(align_up(lifetimes[j].bytes))))
        }));
        taken.sort_unstable();
        let mut offset: usize = 0;
        for &(start, end) in &taken {
            if start >= offset.saturating_add(size) {
                break;
            }
            offset = offset.max(end);
        }
        offsets[i] = Some(offset);
        pool_bytes = pool_bytes.max(offset.saturating_add(size));
    }
    Placement {
        offsets: offsets.into_iter().map(|o| o.unwrap_or(0)).collect(),
        pool_bytes,
        strategy,
    }
}
