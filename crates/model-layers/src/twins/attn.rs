//! Twins of `attn::paged_decode` and `attn::paged_causal`: the same arithmetic (`attend`),
//! row r over its sequence's first seq_lens[r] tokens; causality comes from the lengths. The
//! GPU's cross-block scratch is checked for its length and otherwise left alone: the twin
//! attends in one pass.

use solder_gpu_runtime::{par_chunks_mut, GpuError, TwinCtx};

use super::args::{bf16_in, bf16_out, dim, f32_out, i32_in, macs, rows, size, threads_for};
use crate::numerics::attend;
use crate::ops::attn::ATTN_SPLITS;

/// `attn::paged_decode` / `attn::paged_causal(q, cache, block_tables, seq_lens, out, scratch,
/// rows, heads, kv_heads, head_dim, block_size, max_blocks, num_pages, scale)`.
pub(crate) fn paged_attention(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let rows = rows(ctx, 6)?;
    let (heads, kv_heads, head_dim) = (dim(ctx, 7)?, dim(ctx, 8)?, dim(ctx, 9)?);
    // The CUDA kernel keeps a head's accumulators on chip: refuse what it could not run.
    if head_dim > crate::ops::attn::ATTN_MAX_HEAD_DIM as usize {
        return Err(ctx.bad(
            9,
            format!(
                "head_dim {head_dim} above the kernels' {}",
                crate::ops::attn::ATTN_MAX_HEAD_DIM
            ),
        ));
    }
    let (block_size, max_blocks, num_pages) = (dim(ctx, 10)?, dim(ctx, 11)?, dim(ctx, 12)?);
    let scale = ctx.f32(13)?;
    if heads % kv_heads != 0 {
        return Err(ctx.bad(
            8,
            format!("kv_heads {kv_heads} does not divide heads {heads}"),
        ));
    }
    let q = bf16_in(ctx, 0, size(ctx, &[rows, heads, head_dim])?)?;
    let row_elems = kv_heads * head_dim;
    let cache = bf16_in(ctx, 1, size(ctx, &[num_pages, 2, block_size, row_elems])?)?;
    let block_tables = i32_in(ctx, 2, size(ctx, &[rows, max_blocks])?)?;
    let seq_lens = i32_in(ctx, 3, rows)?;
    let out = bf16_out(ctx, 4, q.len())?;
    // Per (head, row): a u32 counter, then ATTN_SPLITS partials of head_dim + 2 f32.
    let slot_words = size(ctx, &[ATTN_SPLITS as usize, head_dim + 2])? + 1;
    f32_out(ctx, 5, size(ctx, &[rows, heads, slot_words])?)?;

    let capacity = size(ctx, &[max_blocks, block_size])?;
    let mut work = 0usize;
    for (r, len) in seq_lens.iter().enumerate() {
        if *len < 1 || *len as usize > capacity {
            return Err(ctx.fail(format!("row {r}: seq_len {len} outside 1..={capacity}")));
        }
        let blocks = &block_tables[r * max_blocks..][..(*len as usize).div_ceil(block_size)];
        if let Some((b, page)) = blocks
            .iter()
            .enumerate()
            .find(|(_, p)| **p < 0 || **p as usize >= num_pages)
        {
            return Err(ctx.fail(format!(
                "row {r}: block {b} names page {page}, the cache has {num_pages}"
            )));
        }
        work = work.saturating_add(macs(&[2, *len as usize, heads, head_dim]));
    }

    let group = heads / kv_heads;
    let threads = threads_for(ctx, work);
    // Where token j of row r keeps its k (part 0) or v (part 1) for kv head `kvh`.
    let at = move |r: usize, j: usize, part: usize, kvh: usize| {
        let page = block_tables[r * max_blocks + j / block_size] as usize;
        let start = ((page * 2 + part) * block_size + j % block_size) * row_elems + kvh * head_dim;
        &cache[start..start + head_dim]
    };
    par_chunks_mut(out, head_dim, threads, |index, out_head| {
        let (r, h) = (index / heads, index % heads);
        let kvh = h / group;
        let q_head = &q[index * head_dim..(index + 1) * head_dim];
        let (mut scores, mut acc) = (Vec::new(), Vec::new());
        let len = seq_lens[r] as usize;
        attend(
            q_head,
            len,
            scale,
            |j| at(r, j, 0, kvh),
            |j| at(r, j, 1, kvh),
            &mut scores,
            &mut acc,
            out_head,
        );
    });
    Ok(())
}
