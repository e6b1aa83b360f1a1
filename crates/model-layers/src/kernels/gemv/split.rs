//! gemv's split-K (`gemv_stream` in gemv.cu, "split-K"): how many k ranges a streaming launch
//! splits each dot into (`splits`), and the scratch it then needs (`scratch_words`).
//!
//! A dot is a sum of `DOT_SEG`-element segment sums added in segment order (common.cuh
//! `warp_dot`), in every entry. A split launch (grid.z = splits) gives each grid.z index a
//! contiguous range of segments; its warps store every segment sum in the scratch's partials
//! and the last split to finish a feature folds them in segment order: the unsplit bits, so the
//! choice is the launch shape's alone (no rule, no plan change), and lever `gemv_unsplit` turns
//! it off for A/B timing. `gemv::qkv_rope_kv`, whose blocks own whole heads, splits each head's
//! features over several blocks instead (`head_parts`): each stores its values, and the last
//! of a head's blocks gathers them and runs the head epilogue.
//!
//! The scratch of one stream's launches is one slot (the workspace holds one per stream,
//! `Layout::gemv_scratch_offset`, each of `slot_bytes`: a bound on what a projection launch
//! could use, at most `SLOT_BYTES`): `COUNTERS` u32 arrival counters \[row group\]\[feature\]
//! (zero between launches: the merging warp sets its counter back), then the partials f32
//! \[segment\]\[weight row\]\[row\]\[feature\]. A launch whose counters or partials would pass
//! `COUNTERS` or `PARTIAL_WORDS` is not split (its declared shape says so); one whose shape
//! asks for more than its stream's slot holds is an error at build (`View::gemv_scratch`).

use solder_circuit::ir::Circuit;

use crate::kernels::attrs::positive as attr;
use solder_circuit::{ExecutionPlan, OpKind};

/// The lever that keeps every streaming launch unsplit (A/B timing; the same bytes).
pub const GEMV_UNSPLIT: &str = "gemv_unsplit";

/// Elements per dot segment (`DOT_SEG` in common.cuh).
pub const DOT_SEG: u32 = 1024;

/// Arrival counters at the start of a slot (`GEMV_SPLIT_COUNTERS` in gemv.cu): the most
/// row groups × features a split launch has (`SPLIT_TARGET_BLOCKS` · 8 = 4224, rounded up).
pub const COUNTERS: usize = 4352;

/// Words a slot holds after its counters: 1 MiB. Llama-3-8B's down projection at decode needs
/// 57,344 (14 segments × 4096 features), the 8-row q/k/v of a 1B model 49,152 (2 × 8 × 3072),
/// and a 1B model's split heads at 64 rows 196,608 (64 × 3072).
pub const PARTIAL_WORDS: usize = 262_144;

/// The most bytes of one stream's slot.
pub const SLOT_BYTES: usize = (COUNTERS + PARTIAL_WORDS) * 4;

/// Under `split_two_waves`, a launch with fewer blocks than this (4 per SM of a 132-SM H200)
/// splits k until it has at least as many, or has one segment per split.
const SPLIT_TARGET_BLOCKS: u64 = 528;

/// The lever that sizes splits to `SPLIT_TARGET_BLOCKS` (`Sizing::TwoWaves`, the sizing before
/// the device measured one wave faster) instead of the resident slots (A/B timing; the same
/// bytes).
pub const SPLIT_TWO_WAVES: &str = "split_two_waves";

/// SMs of the device the sizing is for (an H200; an H100 SXM has as many).
pub const SMS: u64 = 132;

/// Blocks of 256 threads one SM holds at once for every streaming gemv entry (`_r1` … `_r8`,
/// `__launch_bounds__(256, 2)`) and for `qkv_rope_kv`: ptxas gives them 92–128 registers, so
/// 65,536 / (256 · registers) = 2. `cargo xtask ptx --check` refuses PTX where that no longer
/// holds.
pub const RESIDENT_BLOCKS_PER_SM: u64 = 2;

/// Blocks an H200 runs at once for these entries: one wave.
pub const RESIDENT_SLOTS: u64 = SMS * RESIDENT_BLOCKS_PER_SM;

/// How many blocks a split launch aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizing {
    /// The default: as many blocks as fit `RESIDENT_SLOTS` (264) in one wave, no more: a launch
    /// already over half the slots stays unsplit. On the H200 (2026-12-04, Llama-3.2-1B's
    /// shape) a decode step took 0.804x the time of `TwoWaves` at one row, 0.860x at 8.
    Resident,
    /// Lever `split_two_waves`: at least `SPLIT_TARGET_BLOCKS` (528, four blocks per SM, which
    /// ptxas's registers do not allow: two waves of 264 resident blocks).
    TwoWaves,
}

impl Sizing {
    /// The sizing a build's levers ask for.
    pub fn of(two_waves: bool) -> Sizing {
        if two_waves {
            Sizing::TwoWaves
        } else {
            Sizing::Resident
        }
    }

    /// Whether a launch of `blocks` already has enough.
    fn full(self, blocks: u64) -> bool {
        match self {
            Sizing::TwoWaves => blocks >= SPLIT_TARGET_BLOCKS,
            Sizing::Resident => blocks * 2 > RESIDENT_SLOTS,
        }
    }

    /// The parts (splits) a launch of `blocks` wants, before the caller's bounds.
    fn wanted(self, blocks: u64) -> u64 {
        match self {
            Sizing::TwoWaves => SPLIT_TARGET_BLOCKS.div_ceil(blocks),
            Sizing::Resident => (RESIDENT_SLOTS / blocks).max(1),
        }
    }
}

/// The parts (blocks) each head of a `gemv::qkv_rope_kv` launch of `grid` (one block per
/// row group and head) is split into: 1 when the grid already fills `sizing`'s target (over
/// half the resident slots; `SPLIT_TARGET_BLOCKS` under `Sizing::TwoWaves`) or the scratch slot
/// cannot hold the launch, else as many parts as keep the launch within one wave of resident
/// slots (`TwoWaves`: enough to reach its target), at most one part per 8 of a head's features
/// (one feature per warp).
pub fn head_parts(grid: [u32; 3], rows: u32, features: u64, head_dim: u32, sizing: Sizing) -> u32 {
    let blocks = grid[0] as u64 * grid[1] as u64;
    if blocks == 0 || sizing.full(blocks) || head_scratch_words(grid, rows, features).is_none() {
        return 1;
    }
    sizing
        .wanted(blocks)
        .min(head_dim.div_ceil(8) as u64)
        .max(1) as u32
}

/// The scratch words a split-head `gemv::qkv_rope_kv` launch uses (grid.x row groups,
/// grid.y heads before the split): the counters region (\[row group\]\[head\], within
/// `COUNTERS`), then one word per row and q/k/v feature.
pub fn head_scratch_words(grid: [u32; 3], rows: u32, features: u64) -> Option<usize> {
    let counters = (grid[0] as u64).checked_mul(grid[1] as u64)?;
    let values = (rows as u64).checked_mul(features)?;
    if counters > COUNTERS as u64 || values > PARTIAL_WORDS as u64 {
        return None;
    }
    Some(COUNTERS + values as usize)
}

/// The dot segments of a k-element dot.
pub fn segments(k: u32) -> u32 {
    k.div_ceil(DOT_SEG)
}

/// The scratch words a split launch of `grid` uses: the counters region, then
/// `segments · nw · rows · features` partials (the kernel finds its partials after
/// `COUNTERS` words whatever the launch).
pub fn scratch_words(grid: [u32; 3], features: u64, rows: u32, k: u32, nw: u32) -> Option<usize> {
    let counters = (grid[0] as u64).checked_mul(features)?;
    let partials = (segments(k) as u64)
        .checked_mul(nw as u64)?
        .checked_mul(rows as u64)?
        .checked_mul(features)?;
    if counters > COUNTERS as u64 || partials > PARTIAL_WORDS as u64 {
        return None;
    }
    Some(COUNTERS + partials as usize)
}

/// The splits (grid.z) of a streaming launch of `grid` (from `stream_config`) over a
/// k-element dot with `nw` weight rows per feature, whose blocks stage `stage` elements of a
/// row at a time (`GEMV_STREAM_STAGE` over the row tile): 1 (unsplit) when the grid already
/// fills `sizing`'s target, when k has one segment, or when the scratch slot cannot hold the
/// launch; else the most splits that keep the launch within one wave of `RESIDENT_SLOTS`
/// (`Sizing::TwoWaves`: the fewest that reach `SPLIT_TARGET_BLOCKS`), at least as many as give
/// each split a range its blocks stage whole (k staged in spans otherwise: once per span per
/// block), each a non-empty range of ⌈segments / splits⌉ segments.
pub fn splits(
    grid: [u32; 3],
    features: u64,
    rows: u32,
    k: u32,
    nw: u32,
    stage: u32,
    sizing: Sizing,
) -> u32 {
    let blocks = grid[0] as u64 * grid[1] as u64;
    let segs = segments(k);
    if segs < 2 || blocks == 0 || sizing.full(blocks) {
        return 1;
    }
    if scratch_words(grid, features, rows, k, nw).is_none() {
        return 1;
    }
    let to_stage = segs.div_ceil((stage / DOT_SEG).max(1)) as u64;
    let wanted = sizing.wanted(blocks).max(to_stage).min(segs as u64) as u32;
    // Only non-empty ranges: the live splits of ⌈segments / wanted⌉ segments each.
    let per = segs.div_ceil(wanted);
    segs.div_ceil(per)
}

/// Bytes of one stream's slot for `plans` of `circuit`'s projections: a bound on the scratch
/// any projection launch could split with — the longest dot's segments × the widest plan's rows
/// × the most features one launch has (three projections' outputs for q/k/v, two for gate/up,
/// the vocabulary, the experts), which also holds a split head's values (one word per row and
/// feature) — at most `SLOT_BYTES`; zero without projections. Bounded from the circuit's ops, not from the plans' groups: plans of
/// other circuits (a draft head's) share the workspace; a launch whose declared shape needs
/// more than the slot is refused at build, naming the kernel and both sizes.
pub fn slot_bytes(circuit: &Circuit, plans: &[&ExecutionPlan]) -> usize {
    let (mut k, mut features) = (0u64, 0u64);
    for op in &circuit.ops {
        let (depth, width) = match op.kind {
            OpKind::Linear => (attr(op, "in"), attr(op, "out").map(|w| 3 * w)),
            OpKind::LmHead => (attr(op, "hidden"), attr(op, "vocab")),
            OpKind::Router => (attr(op, "hidden"), attr(op, "experts")),
            _ => continue,
        };
        k = k.max(depth.unwrap_or(0));
        features = features.max(width.unwrap_or(0));
    }
    let rows = plans.iter().map(|p| p.rows as u64).max().unwrap_or(0);
    let segs = k.div_ceil(DOT_SEG as u64);
    if rows == 0 || features == 0 {
        return 0;
    }
    // Split heads need one word per row and feature even when no dot has two segments.
    let need = COUNTERS as u64 + segs.max(1).saturating_mul(rows).saturating_mul(features);
    need.min((COUNTERS + PARTIAL_WORDS) as u64) as usize * 4
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Sizing = Sizing::TwoWaves;
    const R: Sizing = Sizing::Resident;

    #[test]
    fn llama_1b_decode_splits_its_tall_projections_and_not_the_wide_ones() {
        // Down projection (k = 8192, 2048 features): 256 blocks → 3 splits of 3, 3, 2 segments.
        assert_eq!(splits([1, 256, 1], 2048, 1, 8192, 1, 16_384, T), 3);
        // o projection (k = 2048): 2 segments, 2 splits.
        assert_eq!(splits([1, 256, 1], 2048, 1, 2048, 1, 16_384, T), 2);
        // q/k/v (3072 features): 384 blocks → 2 splits.
        assert_eq!(splits([1, 384, 1], 3072, 1, 2048, 1, 16_384, T), 2);
        // gate/up (8192 features, 1024 blocks) and the LM head (capped at 1056): unsplit.
        assert_eq!(splits([1, 1024, 1], 8192, 1, 2048, 2, 16_384, T), 1);
        assert_eq!(splits([1, 1056, 1], 128_256, 1, 2048, 1, 16_384, T), 1);
    }

    #[test]
    fn no_split_without_segments_or_room_and_ranges_the_blocks_stage_whole() {
        assert_eq!(splits([1, 16, 1], 128, 1, 1024, 1, 16_384, T), 1);
        // The down projection at 8 rows: k (8192) is 4 times the r8 stage (2048 per row), so 4
        // splits, each range staged whole.
        assert_eq!(splits([1, 256, 1], 2048, 8, 8192, 1, 2048, T), 4);
        // At 4 rows (a 4096 stage): the target's 3 splits of at most 3 segments fit it.
        assert_eq!(splits([1, 256, 1], 2048, 4, 8192, 1, 4096, T), 3);
        // 5000 features need more counters than a slot has.
        assert_eq!(splits([1, 300, 1], 5000, 1, 4096, 1, 16_384, T), 1);
        assert_eq!(scratch_words([1, 300, 1], 5000, 1, 4096, 1), None);
        // 3 segments at a target of many splits: 3 live splits of one segment each.
        assert_eq!(splits([1, 1, 1], 8, 1, 3000, 1, 16_384, T), 3);
        // 5 segments, 4 wanted: ⌈5/4⌉ = 2 per split, so 3 live splits.
        assert_eq!(splits([1, 132, 1], 1056, 1, 5 * 1024, 1, 16_384, T), 3);
    }

    #[test]
    fn qkv_rope_kv_splits_each_head_into_parts_of_at_least_8_features() {
        // Llama-3.2-1B at decode: 32 + 2·8 heads, 48 blocks → 8 parts of 8 features each.
        assert_eq!(head_parts([1, 48, 1], 1, 3072, 64, T), 8);
        // 8 row groups of 48 heads: 384 blocks → 2 parts.
        assert_eq!(head_parts([8, 48, 1], 64, 3072, 64, T), 2);
        // 4 row groups: 192 blocks → 3 parts (of 22, 22 and 20 features).
        assert_eq!(head_parts([4, 48, 1], 32, 3072, 64, T), 3);
        // 88 rows' values would not fit the slot: one part.
        assert_eq!(head_parts([11, 48, 1], 88, 3072, 64, T), 1);
        // Already wide enough, or a head of 8 features: one part.
        assert_eq!(head_parts([16, 48, 1], 128, 3072, 64, T), 1);
        assert_eq!(head_parts([1, 6, 1], 1, 48, 8, T), 1);
        assert_eq!(
            head_scratch_words([1, 48, 1], 1, 3072),
            Some(COUNTERS + 3072)
        );
        assert_eq!(head_scratch_words([1, 48, 1], 88, 3072), None);
    }

    #[test]
    fn the_scratch_is_the_counters_then_every_segment_sum() {
        assert_eq!(
            scratch_words([1, 256, 3], 2048, 1, 8192, 1),
            Some(COUNTERS + 8 * 2048)
        );
        assert_eq!(
            scratch_words([1, 64, 2], 512, 3, 2048, 2),
            Some(COUNTERS + 2 * 2 * 3 * 512)
        );
    }

    #[test]
    fn resident_sizing_keeps_a_launch_within_one_wave_of_264_blocks() {
        assert_eq!(RESIDENT_SLOTS, 264);
        // Llama-3.2-1B at decode: o and down projections (256 blocks) already fill the wave.
        assert_eq!(splits([1, 256, 1], 2048, 1, 2048, 1, 16_384, R), 1);
        assert_eq!(splits([1, 256, 1], 2048, 1, 8192, 1, 16_384, R), 1);
        // The down projection at 8 rows fills the wave too: unsplit, k staged in spans.
        assert_eq!(splits([1, 256, 1], 2048, 8, 8192, 1, 2048, R), 1);
        // 64 blocks of a 4-segment dot: 4 splits, 256 blocks.
        assert_eq!(splits([1, 64, 1], 512, 1, 4096, 1, 16_384, R), 4);
        // 100 blocks: 2 splits (200 blocks), not 3 (300, a second wave).
        assert_eq!(splits([1, 100, 1], 800, 1, 4096, 1, 16_384, R), 2);
        // qkv_rope_kv at 1B decode: 48 heads → 5 parts, 240 blocks (not 8 parts, 384).
        assert_eq!(head_parts([1, 48, 1], 1, 3072, 64, R), 5);
        // 4 row groups (32 rows): 192 blocks, over half the slots: one part.
        assert_eq!(head_parts([4, 48, 1], 32, 3072, 64, R), 1);
        // A tiny model's heads: bounded by one part per 8 features.
        assert_eq!(head_parts([1, 19, 1], 1, 1216, 64, R), 8);
    }
}
