//! `rope` module: rotary embedding of q and k, alone or fused with qk-norm and the KV write.

use super::norm::per_head_block;
use super::{Args, Buf, Launch};

/// q bf16[rows·heads·head_dim], k bf16[rows·kv_heads·head_dim], positions i32[rows],
/// inv_freq f32[rotary_dim/2] → q_out, k_out.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    q: Buf,
    k: Buf,
    positions: Buf,
    inv_freq: Buf,
    q_out: Buf,
    k_out: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rotary_dim: u32,
) -> Launch {
    Args::new()
        .read(q)
        .read(k)
        .read(positions)
        .read(inv_freq)
        .write(q_out)
        .write(k_out)
        .u32(rows)
        .u32(heads)
        .u32(kv_heads)
        .u32(head_dim)
        .u32(rotary_dim)
        .launch("rope::rope", per_head_block(rows, heads, kv_heads))
}

/// qk-norm (weights wq, wk bf16[head_dim]) then rope.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope(
    q: Buf,
    k: Buf,
    wq: Buf,
    wk: Buf,
    positions: Buf,
    inv_freq: Buf,
    q_out: Buf,
    k_out: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rotary_dim: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(q)
        .read(k)
        .read(wq)
        .read(wk)
        .read(positions)
        .read(inv_freq)
        .write(q_out)
        .write(k_out)
        .u32(rows)
        .u32(heads)
        .u32(kv_heads)
        .u32(head_dim)
        .u32(rotary_dim)
        .f32(eps)
        .launch("rope::qk_norm_rope", per_head_block(rows, heads, kv_heads))
}

/// rope of q (→ q_out) and k, then the roped k and v stored in their slots of the cache.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write(
    q: Buf,
    k: Buf,
    v: Buf,
    positions: Buf,
    inv_freq: Buf,
    slot_mapping: Buf,
    q_out: Buf,
    cache: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rotary_dim: u32,
    block_size: u32,
    num_pages: u32,
) -> Launch {
    Args::new()
        .read(q)
        .read(k)
        .read(v)
        .read(positions)
        .read(inv_freq)
        .read(slot_mapping)
        .write(q_out)
        .read_write(cache)
        .u32(rows)
        .u32(heads)
        .u32(kv_heads)
        .u32(head_dim)
        .u32(rotary_dim)
        .u32(block_size)
        .u32(num_pages)
        .launch("rope::rope_kv_write", per_head_block(rows, heads, kv_heads))
}

/// qk-norm, rope of q (→ q_out) and k, then the roped k and v stored in the cache.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_rope_kv_write(
    q: Buf,
    k: Buf,
    v: Buf,
    wq: Buf,
    wk: Buf,
    positions: Buf,
    inv_freq: Buf,
    slot_mapping: Buf,
    q_out: Buf,
    cache: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rotary_dim: u32,
    block_size: u32,
    num_pages: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(q)
        .read(k)
        .read(v)
        .read(wq)
        .read(wk)
        .read(positions)
        .read(inv_freq)
        .read(slot_mapping)
        .write(q_out)
        .read_write(cache)
        .u32(rows)
        .u32(heads)
        .u32(kv_heads)
        .u32(head_dim)
        .u32(rotary_dim)
        .u32(block_size)
        .u32(num_pages)
        .f32(eps)
        .launch(
            "rope::qk_norm_rope_kv_write",
            per_head_block(rows, heads, kv_heads),
        )
}
