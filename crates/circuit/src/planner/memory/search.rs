//! The memory pass's second try, for plans first-fit leaves above the live lower bound: a
//! depth-first search for offsets that keep every buffer under a given capacity.
//!
//! Why: every first-fit ordering places a repeated layer the same way each time, and some
//! layers pack to the bound only when consecutive layers mirror each other (the MoE layer
//! whose q/k/v launch writes h_mlp and q_rot while h_attn and experts_out are still read:
//! 28 KiB live, 32 KiB by any one-layer pattern at qwen3-30b-a3b decode). A search that may
//! put a buffer at the top of a gap as well as at its bottom finds that layout.
//!
//! Invariants: a returned placement keeps conflicting buffers disjoint, every offset a
//! multiple of `ALIGN` and every end at or under the capacity; the work is bounded by a
//! node budget (a node is one buffer given one offset), so a capacity no placement reaches
//! costs a bounded time and answers `None`.

use super::{align_up, ALIGN};
use crate::planner::liveness::Lifetime;

/// Placements tried per buffer before a capacity is given up on. The shipped plans that need
/// the search take under ten per buffer (qwen3-30b-a3b decode: about 4,000 for 432 buffers).
const NODES_PER_BUFFER: usize = 64;

/// The budget of one capacity: at least this many nodes, so small circuits search fully...
const MIN_NODES: usize = 1 << 12;

/// ...and at most this many, so a huge circuit whose capacity cannot be reached gives up
/// after about half a second per capacity in a release build (some 0.3 µs a node; 4,096
/// repeated MoE layers, 36,864 buffers, reach their bound in 0.1 s).
const MAX_NODES: usize = 1 << 21;

/// Capacities tried: the bound first, then halving the interval up to the greedy pool.
const PROBES: usize = 4;

/// The smallest pool the search reaches in `[lower, upper)`, with its offsets: `lower`
/// first (the floor under any placement, reached by every shipped plan that searches), then
/// a bisection of what remains. `None` when no capacity under `upper` was reached within the budget.
pub fn tightest(
    lifetimes: &[Lifetime],
    adjacency: &[Vec<usize>],
    lower: usize,
    upper: usize,
) -> Option<(Vec<usize>, usize)> {
    let budget = lifetimes
        .len()
        .saturating_mul(NODES_PER_BUFFER)
        .clamp(MIN_NODES, MAX_NODES);
    // Capacities below `lowest_left` are given up on; `reached` is the smallest pool found.
    let (mut lowest_left, mut reached, mut best) = (lower, upper, None);
    let mut capacity = lower;
    for _ in 0..PROBES {
        if capacity >= reached {
            break;
        }
        match fit(lifetimes, adjacency, capacity, budget) {
            Some(offsets) => {
                reached = pool_of(lifetimes, &offsets);
                best = Some((offsets, reached));
            }
            None => lowest_left = capacity.saturating_add(ALIGN),
        }
        if lowest_left >= reached {
            break;
        }
        capacity = lowest_left + (reached - lowest_left) / 2 / ALIGN * ALIGN;
    }
    best
}

/// The bytes of the heaviest clique of the conflict graph found greedily from each buffer
/// (its neighbours largest first, each kept if it conflicts with every one kept): buffers
/// that pairwise may be live together, so no placement is smaller. On side streams it can
/// exceed the live lower bound, which is taken in linear order; where first-fit reaches it,
/// no search can do better.
pub fn clique_bound(lifetimes: &[Lifetime], adjacency: &[Vec<usize>]) -> usize {
    let size = |i: usize| align_up(lifetimes[i].bytes);
    let mut heaviest = 0usize;
    let (mut neighbours, mut members) = (Vec::new(), Vec::new());
    for (i, adjacent) in adjacency.iter().enumerate() {
        neighbours.clear();
        neighbours.extend_from_slice(adjacent);
        neighbours.sort_by_key(|&j| (usize::MAX - size(j), j));
        members.clear();
        members.push(i);
        let mut bytes = size(i);
        for &j in &neighbours {
            // `adjacency` lists are ascending.
            if members
                .iter()
                .all(|&m| adjacency[j].binary_search(&m).is_ok())
            {
                members.push(j);
                bytes = bytes.saturating_add(size(j));
            }
        }
        heaviest = heaviest.max(bytes);
    }
    heaviest
}

fn pool_of(lifetimes: &[Lifetime], offsets: &[usize]) -> usize {
    lifetimes
        .iter()
        .zip(offsets)
        .map(|(l, &o)| o.saturating_add(align_up(l.bytes)))
        .max()
        .unwrap_or(0)
}

/// Offsets with every buffer's end at or under `capacity`, or `None` when the search spends
/// `budget` nodes first (or proves there is none).
///
/// Buffers are placed in order of their first position (larger first at a tie). A buffer's
/// choices, given the conflicting buffers already placed, are each free gap it fits in, at
/// the gap's bottom, then at its top; a buffer with no choice left sends the search back to
/// the previous buffer's next choice.
pub fn fit(
    lifetimes: &[Lifetime],
    adjacency: &[Vec<usize>],
    capacity: usize,
    budget: usize,
) -> Option<Vec<usize>> {
    let size = |i: usize| align_up(lifetimes[i].bytes);
    let mut order: Vec<usize> = (0..lifetimes.len()).collect();
    order.sort_by_key(|&i| (lifetimes[i].first, usize::MAX - size(i), i));

    let mut offsets: Vec<Option<usize>> = vec![None; lifetimes.len()];
    // One frame per buffer from the first to the one being placed: its choices and how many
    // of them were tried; the buffers of frames that chose hold offsets.
    let mut choices: Vec<Vec<usize>> = Vec::with_capacity(order.len());
    let mut tried: Vec<usize> = Vec::with_capacity(order.len());
    let mut taken: Vec<(usize, usize)> = Vec::new();
    let mut nodes = 0usize;
    while choices.len() < order.len() {
        let i = order[choices.len()];
        taken.clear();
        taken.extend(
            adjacency[i]
                .iter()
                .filter_map(|&j| offsets[j].map(|o| (o, o + size(j)))),
        );
        choices.push(gap_ends(&mut taken, size(i), capacity));
        tried.push(0);
        // The deepest frame with a choice left takes it; exhausted frames step back.
        loop {
            let depth = choices.len() - 1;
            if let Some(&offset) = choices[depth].get(tried[depth]) {
                tried[depth] += 1;
                offsets[order[depth]] = Some(offset);
                nodes += 1;
                if nodes > budget {
                    return None;
                }
                break;
            }
            choices.pop();
            tried.pop();
            if depth == 0 {
                return None;
            }
            offsets[order[depth - 1]] = None;
        }
    }
    Some(offsets.into_iter().map(|o| o.unwrap_or(0)).collect())
}

/// The offsets where a buffer of `size` bytes may go under `capacity`, given the byte ranges
/// `taken` by conflicting buffers already placed (sorted here): each free gap it fits in, at
/// the gap's bottom, then at its top when that differs.
fn gap_ends(taken: &mut [(usize, usize)], size: usize, capacity: usize) -> Vec<usize> {
    taken.sort_unstable();
    let mut ends = Vec::new();
    let mut free_from = 0usize;
    for &(start, end) in taken.iter().chain(std::iter::once(&(capacity, capacity))) {
        if start >= free_from.saturating_add(size) {
            ends.push(free_from);
            if start - size != free_from {
                ends.push(start - size);
            }
        }
        free_from = free_from.max(end);
    }
    ends
}
