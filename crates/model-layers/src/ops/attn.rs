//! `attn` module: paged attention over one layer's KV cache region.

use solder_gpu_runtime::LaunchConfig;

use super::{Args, Buf, Launch};

/// Query rows a `paged_causal` block shares its K/V tile loads across.
const CAUSAL_ROWS_PER_BLOCK: u32 = 4;
/// Keys per K/V tile of `paged_causal`.
const CAUSAL_TILE_KEYS: u32 = 64;

/// One query row per sequence: q bf16[rows·heads·head_dim], block_tables i32[rows·max_blocks],
/// seq_lens i32[rows] → out bf16[rows·heads·head_dim]. One block of 4 warps per (head, row).
#[allow(clippy::too_many_arguments)]
pub fn paged_decode(
    q: Buf,
    cache: Buf,
    block_tables: Buf,
    seq_lens: Buf,
    out: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks: u32,
    num_pages: u32,
    scale: f32,
) -> Launch {
    let config = LaunchConfig {
        grid: [heads.max(1), rows.max(1), 1],
        block: [128, 1, 1],
        shared_bytes: 0,
    };
    args(
        q,
        cache,
        block_tables,
        seq_lens,
        out,
        [
            rows, heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
        ],
        scale,
    )
    .launch("attn::paged_decode", config)
}

/// Same arguments and results as `paged_decode` (row r attends to its sequence's first
/// seq_lens[r] tokens); on the GPU one block per (kv head, group of rows) shares K/V tiles.
#[allow(clippy::too_many_arguments)]
pub fn paged_causal(
    q: Buf,
    cache: Buf,
    block_tables: Buf,
    seq_lens: Buf,
    out: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks: u32,
    num_pages: u32,
    scale: f32,
) -> Launch {
    let tile_bytes = 2 * CAUSAL_TILE_KEYS * head_dim.min(1024) * 2;
    let config = LaunchConfig {
        grid: [
            kv_heads.max(1),
            rows.div_ceil(CAUSAL_ROWS_PER_BLOCK).max(1),
            1,
        ],
        block: [256, 1, 1],
        shared_bytes: tile_bytes,
    };
    args(
        q,
        cache,
        block_tables,
        seq_lens,
        out,
        [
            rows, heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
        ],
        scale,
    )
    .launch("attn::paged_causal", config)
}

#[allow(clippy::too_many_arguments)]
fn args(
    q: Buf,
    cache: Buf,
    block_tables: Buf,
    seq_lens: Buf,
    out: Buf,
    dims: [u32; 7],
    scale: f32,
) -> Args {
    let mut args = Args::new()
        .read(q)
        .read(cache)
        .read(block_tables)
        .read(seq_lens)
        .write(out);
    for d in dims {
        args = args.u32(d);
    }
    args.f32(scale)
}
