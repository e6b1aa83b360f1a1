//! `attn` module: paged attention over one layer's KV cache region.

use solder_gpu_runtime::LaunchConfig;

use super::{Args, Buf, Launch};

/// Threads of an attention block: 8 warps split one block's share of a (head, row)'s context
/// and merge in shared memory (static, about 9 KiB).
const ATTN_THREADS: u32 = 256;

/// Blocks per (head, row) (flash-decoding): a long context is cut into at most this many
/// chunks, one per block, whose partials the last block to finish merges. Must equal
/// `ATTN_SPLITS` in `kernels/attn.cu`.
pub const ATTN_SPLITS: u32 = 16;

/// The largest head_dim the attention kernels take (kernels/attn.cu `ATTN_MAX_HEAD_DIM`).
pub const ATTN_MAX_HEAD_DIM: u32 = 256;

/// Bytes of the attention scratch for `rows · heads` (head, row) pairs: per pair, in
/// `(r · heads + h)` order, one u32 arrival counter, then `ATTN_SPLITS` partials of
/// `head_dim + 2` f32 (max, sum, acc[head_dim]). The counter sits inside its pair's slot so
/// its address does not depend on the row count: every plan of an exec shares the region and
/// no plan's partials ever cover another plan's counter.
pub fn scratch_bytes(rows: usize, heads: usize, head_dim: usize) -> usize {
    rows * heads * (1 + ATTN_SPLITS as usize * (head_dim + 2)) * 4
}

/// `ATTN_SPLITS` blocks per (head, row); the kernels read `head_dim <= 256`.
fn attn_config(rows: u32, heads: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [heads.max(1), rows.max(1), ATTN_SPLITS],
        block: [ATTN_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

/// One query row per sequence: q bf16[rows·heads·head_dim], block_tables i32[rows·max_blocks],
/// seq_lens i32[rows] → out bf16[rows·heads·head_dim], through `scratch` (`scratch_bytes`,
/// counters zero before the launch and left zero after it). `ATTN_SPLITS` blocks of 8 warps per
/// (head, row).
#[allow(clippy::too_many_arguments)]
pub fn paged_decode(
    q: Buf,
    cache: Buf,
    block_tables: Buf,
    seq_lens: Buf,
    out: Buf,
    scratch: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks: u32,
    num_pages: u32,
    scale: f32,
) -> Launch {
    let config = attn_config(rows, heads);
    args(
        q,
        cache,
        block_tables,
        seq_lens,
        out,
        scratch,
        [
            rows, heads, kv_heads, head_dim, block_size, max_blocks, num_pages,
        ],
        scale,
    )
    .launch("attn::paged_decode", config)
}

/// Same arguments and results as `paged_decode` (row r attends to its sequence's first
/// seq_lens[r] tokens); the same launch and arithmetic as `paged_decode` for now (sharing K/V
/// tiles across a kv head's query rows is the follow-up).
#[allow(clippy::too_many_arguments)]
pub fn paged_causal(
    q: Buf,
    cache: Buf,
    block_tables: Buf,
    seq_lens: Buf,
    out: Buf,
    scratch: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    max_blocks: u32,
    num_pages: u32,
    scale: f32,
) -> Launch {
    let mut launch = paged_decode(
        q,
        cache,
        block_tables,
        seq_lens,
        out,
        scratch,
        rows,
        heads,
        kv_heads,
        head_dim,
        block_size,
        max_blocks,
        num_pages,
        scale,
    );
    launch.kernel = "attn::paged_causal";
    launch
}

#[allow(clippy::too_many_arguments)]
fn args(
    q: Buf,
    cache: Buf,
    block_tables: Buf,
    seq_lens: Buf,
    out: Buf,
    scratch: Buf,
    dims: [u32; 7],
    scale: f32,
) -> Args {
    let mut args = Args::new()
        .read(q)
        .read(cache)
        .read(block_tables)
        .read(seq_lens)
        .write(out)
        .read_write(scratch);
    for d in dims {
        args = args.u32(d);
    }
    args.f32(scale)
}

/// Splits a gated q projection (Qwen3-Next): q2 bf16[rows·heads·2·head_dim], each head
/// `[q | gate]` → q, gate bf16[rows·heads·head_dim]. Elementwise.
pub fn gate_split(q2: Buf, q: Buf, gate: Buf, rows: u32, heads: u32, head_dim: u32) -> Launch {
    Args::new()
        .read(q2)
        .write(q)
        .write(gate)
        .u32(rows)
        .u32(heads)
        .u32(head_dim)
        .launch(
            "attn::gate_split",
            super::elementwise(rows as u64 * heads as u64 * head_dim as u64),
        )
}
