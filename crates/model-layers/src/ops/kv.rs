//! `kv` module: stores k and v rows in their paged-cache slots.

use super::{per_row, Args, Buf, Launch};

/// k, v bf16[rows·kv_heads·head_dim], slot_mapping i32[rows] → cache (one layer's region,
/// `[num_pages][2][block_size][kv_heads][head_dim]` bf16).
#[allow(clippy::too_many_arguments)]
pub fn kv_write(
    k: Buf,
    v: Buf,
    slot_mapping: Buf,
    cache: Buf,
    rows: u32,
    kv_heads: u32,
    head_dim: u32,
    block_size: u32,
    num_pages: u32,
) -> Launch {
    Args::new()
        .read(k)
        .read(v)
        .read(slot_mapping)
        .read_write(cache)
        .u32(rows)
        .u32(kv_heads)
        .u32(head_dim)
        .u32(block_size)
        .u32(num_pages)
        .launch("kv::kv_write", per_row(rows))
}
