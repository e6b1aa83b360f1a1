//! The o projection folded into attention (`attn::paged_decode_o`, `attn::paged_causal_o`,
//! behind the `fold_o_proj` lever): attention → (sigmoid gate →) o projection → residual add
//! in one launch, so a dense layer is four launches.
//!
//! The twin does the kernel's steps: each (row, head)'s attention output rounded to bf16 as
//! `paged_decode` stores it (`Attention::run`), times sigmoid(gate) rounded again when gated
//! (`act::sigmoid_mul`'s arithmetic); then per row and output feature f, each head's partial
//! dot p_h = dot(out\[r\]\[h\], wo\[f\]\[h·head_dim..(h + 1)·head_dim\]) (`numerics::dot_head`, the
//! kernel's order: 8-element chunks with fma and a butterfly per head), summed in head order h = 0..heads-1 from +0, the bias added and rounded to bf16
//! (`linear_value`), added to the residual (`residual_value`). `gemv::linear` takes one dot over
//! all heads·head_dim inputs instead, so the bits differ from the reference routing in the last
//! places: the rule is `differs`. The order is fixed, so results never depend on the thread count,
//! the row count or which block finishes last.
//!
//! Invariant: `o_scratch` holds `o_scratch_bytes(rows, heads, n_out)`: per row, at slot r of
//! `O_SCRATCH_HEADER_WORDS + heads · n_out` words, a u32 arrival counter (zero between
//! launches: the workspace's scratch is zeroed at build and the last head's block resets it),
//! then the heads' partials. The slot's address depends only on r, so every plan of an exec
//! shares the region.

use half::bf16;
use solder_circuit::ir::{Circuit, MetaField};
use solder_circuit::{ExecutionPlan, OpKind};
use solder_gpu_runtime::{par_chunks_mut, GpuError};

use super::{attn_config, attn_dims, gate_of, kv_cache_of, window_of, Attention};
use crate::kernels::act::gate_in_place;
use crate::kernels::args::{macs, size, threads_for};
use crate::kernels::attrs::widest;
use crate::kernels::decl::{kernel, Name};
use crate::kernels::emit_view::{View, R};
use crate::numerics::{dot_head, linear_value, residual_value};

/// Words before a row's partials in its `o_scratch` slot: the u32 counter and padding that
/// keeps the partials 16-byte aligned (`OFOLD_HEADER_WORDS` in `crates/kernels/cuda/attn.cu`).
pub const O_SCRATCH_HEADER_WORDS: usize = 4;

/// The kernels of this module, by name (what `o_scratch_max` looks for in a plan).
pub const KERNELS: [&str; 2] = ["attn::paged_decode_o", "attn::paged_causal_o"];

/// Bytes of the o-fold scratch for `rows` rows of `heads` heads and `n_out` output features:
/// per row a header (`O_SCRATCH_HEADER_WORDS`, the first a u32 counter), then `heads` partials
/// of `n_out` f32.
pub fn o_scratch_bytes(rows: usize, heads: usize, n_out: usize) -> usize {
    rows * (O_SCRATCH_HEADER_WORDS + heads * n_out) * 4
}

/// The o-fold scratch a workspace needs: `o_scratch_bytes` at the widest of `plans` that
/// launches an o-fold kernel, for the circuit's largest attention heads and o projection
/// width (every attention layer of a circuit has the same ones); zero when no plan folds.
pub fn o_scratch_max(circuit: &Circuit, plans: &[&ExecutionPlan]) -> usize {
    let rows = plans
        .iter()
        .filter(|p| {
            p.fusion
                .groups
                .iter()
                .any(|g| g.kernels.iter().any(|k| KERNELS.contains(&k.as_str())))
        })
        .map(|p| p.rows)
        .max();
    let Some(rows) = rows else {
        return 0;
    };
    let heads = widest(circuit, OpKind::Attention, None, "heads");
    let n_out = widest(circuit, OpKind::Linear, Some("o_proj"), "out");
    o_scratch_bytes(rows, heads, n_out)
}

kernel! {
    /// Paged attention (as `PagedAttention`: q, cache, block tables, seq_lens, `scratch`),
    /// then the o projection of the heads' outputs — gated first by sigmoid(gate) when `gate`
    /// (bf16\[rows·heads·head_dim\]) is given — through wo bf16\[n_out\]\[heads·head_dim\] and the
    /// optional bias bf16\[n_out\], added to the residual h f32\[rows·n_out\] → h_out. Per-head
    /// partial dots go through `o_scratch` (`o_scratch_bytes`, counters zero before the launch
    /// and left zero after it). The launch of `PagedAttention`.
    pub struct PagedAttentionO / PagedAttentionOArgs {
        q: In<bf16>,
        cache: In<bf16>,
        block_tables: In<i32>,
        seq_lens: In<i32>,
        gate: InOpt<bf16>,
        wo: In<bf16>,
        bias: InOpt<bf16>,
        h: In<f32>,
        h_out: Out<f32>,
        scratch: InOut<f32>,
        o_scratch: InOut<f32>,
        rows: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        block_size: U32,
        max_blocks: U32,
        num_pages: U32,
        window: U32,
        scale: F32,
        n_out: U32,
    }
    grid(a) = attn_config(a.rows, a.heads);
    PAGED_DECODE_O = "attn::paged_decode_o" => twin paged_attention_o, emit emit_paged_decode_o;
    PAGED_CAUSAL_O = "attn::paged_causal_o" => twin paged_attention_o, emit emit_paged_causal_o;
}

// ---- twin ----------------------------------------------------------------------------------

fn paged_attention_o(a: PagedAttentionOArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let dims = attn_dims!(a);
    let attention = Attention::check(ctx, [a.q, a.cache], [a.block_tables, a.seq_lens], dims)?;
    let (rows, heads, head_dim) = (attention.rows, attention.heads, attention.head_dim);
    let n_out = a.n_out.dim()?;
    let in_features = size(ctx, &[heads, head_dim])?;
    let gate = a.gate.len(attention.out_len())?;
    let wo = a.wo.len(size(ctx, &[n_out, in_features])?)?;
    let bias = a.bias.len(n_out)?;
    let h = a.h.len(size(ctx, &[rows, n_out])?)?;
    let h_out = a.h_out.len(size(ctx, &[rows, n_out])?)?;
    attention.check_scratch(a.scratch)?;
    let slot_words = size(ctx, &[heads, n_out])? + O_SCRATCH_HEADER_WORDS;
    a.o_scratch.len(size(ctx, &[rows, slot_words])?)?;

    // The heads' outputs as attention stores them (then gated as sigmoid_mul stores them).
    let mut out = vec![bf16::ZERO; attention.out_len()];
    attention.run(a.scale, &mut out)?;
    if let Some(gate) = gate {
        gate_in_place(&mut out, gate);
    }

    let threads = threads_for(ctx, macs(&[rows, in_features, n_out]));
    let per_chunk = h_out.len().div_ceil(threads).max(1);
    par_chunks_mut(h_out, per_chunk, threads, |ci, chunk| {
        for (i, slot) in chunk.iter_mut().enumerate() {
            let (r, f) = ((ci * per_chunk + i) / n_out, (ci * per_chunk + i) % n_out);
            let row_out = &out[r * in_features..(r + 1) * in_features];
            let w = &wo[f * in_features..(f + 1) * in_features];
            let acc = (0..heads).fold(0.0f32, |acc, hh| {
                let span = hh * head_dim..(hh + 1) * head_dim;
                acc + dot_head(&row_out[span.clone()], &w[span])
            });
            *slot = residual_value(h[r * n_out + f], linear_value(acc, bias.map(|b| b[f])));
        }
    });
    Ok(())
}

// ---- emitters ------------------------------------------------------------------------------

fn emit_paged_decode_o(v: &View<'_>) -> R {
    fold_of(v, PAGED_DECODE_O)
}

fn emit_paged_causal_o(v: &View<'_>) -> R {
    fold_of(v, PAGED_CAUSAL_O)
}

/// attention → (sigmoid_mul →) linear (o_proj) → residual_add.
fn fold_of(v: &View<'_>, kernel: Name<PagedAttentionO>) -> R {
    let a = v.op(OpKind::Attention, None)?;
    let o = v.op(OpKind::Linear, Some("o_proj"))?;
    let add = v.op(OpKind::ResidualAdd, None)?;
    let (heads, head_dim) = (v.u32(a, "heads")?, v.u32(a, "head_dim")?);
    let n_out = v.u32(o, "out")?;
    if v.u32(o, "in")? as u64 != heads as u64 * head_dim as u64 {
        return Err(v.err(format!(
            "`{}` reads {} features, attention gives heads {heads} x head_dim {head_dim}",
            o.name,
            v.u32(o, "in")?
        )));
    }
    // The residual stream is the add's input 0; input 1 is the projection inside the group.
    if v.producer_in_group(add, 1)?.name != o.name {
        return Err(v.err(format!("`{}` does not add `{}`'s output", add.name, o.name)));
    }
    let gate = gate_of(v, a)?.map(|(gate, _)| gate);
    Ok(vec![PagedAttentionO {
        q: v.input(a, 0)?,
        cache: kv_cache_of(v, a)?,
        block_tables: v.meta(MetaField::BlockTables),
        seq_lens: v.meta(MetaField::SeqLens),
        gate,
        wo: v.weight(o, 0)?,
        bias: v.weight_opt(o, 1),
        h: v.input(add, 0)?,
        h_out: v.output(add, 0)?,
        scratch: v.attn_scratch(heads as usize, head_dim as usize),
        o_scratch: v.o_scratch(heads as usize, n_out as usize),
        rows: v.rows(),
        heads,
        kv_heads: v.u32(a, "kv_heads")?,
        head_dim,
        block_size: v.kv_block_size(),
        max_blocks: v.max_blocks(),
        num_pages: v.kv_pages(),
        window: window_of(v, a)?,
        scale: v.f32(a, "scale")?,
        n_out,
    }
    .launch(kernel)])
}
