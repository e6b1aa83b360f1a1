//! The launch shape of every gemv kernel, the one place it is worked out: which entry
//! (classic, or the streaming entry of the rows' tile), the grid, the split and the split
//! scratch, from the launch's arguments and the levers (`gemv_classic`, `gemv_unsplit`,
//! `split_two_waves`, `qkv_norm_ahead`). Each `kernel!` declaration's `shape(a, levers)` calls
//! `projection` or `heads`; the emitters launch what it answers, and the split-K table
//! (`split::table`) prints it.

use solder_config::Levers;
use solder_gpu_runtime::LaunchConfig;

use super::split::{self, Sizing, GEMV_UNSPLIT, SPLIT_TWO_WAVES};
use super::stream::{
    entry, stage_elems, stream_config, Entry, FEATURES_PER_BLOCK, GEMV_CLASSIC, MAX_GRID_Y,
    ROWS_PER_BLOCK,
};
use super::{QkvRopeKv, QKV_NORM_AHEAD, QKV_ROPE_KV, QKV_ROPE_KV_AHEAD};
use crate::kernels::decl::{Name, Shape};

/// The classic entries' grid: one block per 8 features (`grid.y`) and 8 rows (`grid.x`).
pub fn gemv_config(features: u64, rows: u32) -> LaunchConfig {
    let feature_blocks = features
        .div_ceil(FEATURES_PER_BLOCK as u64)
        .clamp(1, MAX_GRID_Y) as u32;
    LaunchConfig {
        grid: [rows.div_ceil(ROWS_PER_BLOCK).max(1), feature_blocks, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

/// Output features of the q, k and v projections together.
pub(super) fn qkv_features(nq: u32, nkv: u32) -> u64 {
    nq as u64 + 2 * nkv as u64
}

/// What a projection's launch shape depends on: its output features, rows, dot length and
/// weight rows per feature (2 for gate/up).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub features: u64,
    pub rows: u32,
    pub k: u32,
    pub nw: u32,
}

/// A projection kernel's shape: `classic` in `classic_config` (its declared `grid`) under
/// `gemv_classic`; else the streaming entry of
/// the rows' tile (`stream[tile]`, `stream_config`), split over k (`split::splits`) unless
/// `gemv_unsplit` is on.
pub fn projection<K>(
    classic: Name<K>,
    classic_config: LaunchConfig,
    stream: &[Name<K>; 4],
    dims: Dims,
    levers: &Levers,
) -> Shape<K> {
    let Dims {
        features,
        rows,
        k,
        nw,
    } = dims;
    let tile = match entry(levers.is_on(GEMV_CLASSIC), rows) {
        Entry::Classic => return Shape::plain(classic, classic_config),
        Entry::Stream(tile) => tile,
    };
    let mut shape = Shape::plain(stream[tile.index()], stream_config(features, rows, k, tile));
    if levers.is_on(GEMV_UNSPLIT) {
        return shape;
    }
    let sizing = Sizing::of(levers.is_on(SPLIT_TWO_WAVES));
    let grid = shape.config.grid;
    let z = split::splits(grid, features, rows, k, nw, stage_elems(tile), sizing);
    if let (true, Some(words)) = (z > 1, split::scratch_words(grid, features, rows, k, nw)) {
        shape.config.grid[2] = z;
        shape.splits = z;
        shape.scratch_bytes = words * 4;
    }
    shape
}

/// One block per group of 8 rows (`grid.x`) and per head (`grid.y`: q heads, then k heads, then
/// v heads), each owning the whole head.
pub(super) fn qkv_heads_config(rows: u32, heads: u32, kv_heads: u32) -> LaunchConfig {
    let blocks = (heads as u64 + 2 * kv_heads as u64).clamp(1, MAX_GRID_Y) as u32;
    LaunchConfig {
        grid: [rows.div_ceil(ROWS_PER_BLOCK).max(1), blocks, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

/// `qkv_rope_kv`'s shape: its `_ahead` entry under `qkv_norm_ahead`; one block per row group
/// and head (`qkv_heads_config`), each head split into `split::head_parts` blocks through the
/// stream's scratch slot unless `gemv_unsplit` is on.
pub fn heads(a: &QkvRopeKv, levers: &Levers) -> Shape<QkvRopeKv> {
    heads_of(a.rows, a.heads, a.kv_heads, a.head_dim, levers)
}

/// `heads` of a launch of `rows` rows, `heads` q heads and `kv_heads` k and v heads of
/// `head_dim` features.
pub fn heads_of(
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    levers: &Levers,
) -> Shape<QkvRopeKv> {
    let entry = if levers.is_on(QKV_NORM_AHEAD) {
        QKV_ROPE_KV_AHEAD
    } else {
        QKV_ROPE_KV
    };
    let mut shape = Shape::plain(entry, qkv_heads_config(rows, heads, kv_heads));
    if levers.is_on(GEMV_UNSPLIT) {
        return shape;
    }
    let features = qkv_features(heads, kv_heads) * head_dim as u64;
    let sizing = Sizing::of(levers.is_on(SPLIT_TWO_WAVES));
    let grid = shape.config.grid;
    let parts = split::head_parts(grid, rows, features, head_dim, sizing);
    if let (true, Some(words)) = (parts > 1, split::head_scratch_words(grid, rows, features)) {
        shape.config.grid[1] *= parts;
        shape.splits = parts;
        shape.scratch_bytes = words * 4;
    }
    shape
}
