//! `gemm::qkv_rope_kv_mma`: q, k and v on the tensor cores with rope and the KV write in the
//! epilogue, one launch where `qkv_mma` and `rope::rope_kv_write` took two (the tensor cores'
//! counterpart of gemv's `qkv_rope_kv`, for models without qk-norm).
//!
//! Launch shape: 64-row tiles as every gemm kernel; per q or k head, ⌈half/16⌉ rope blocks
//! (16 features of the first rotary half and their 16 partners, so each lane holds both values
//! of a pair) and ⌈(head_dim − 2·half)/32⌉ pass-through blocks, then v's 32-feature blocks
//! (half = rotary_dim / 2).
//!
//! Invariant: every projection is rounded as `linear_mma` stores it, then roped and stored as
//! `rope::rope_kv_write` does from the bf16 projections, so the launch writes the bytes of
//! `qkv_mma` then `rope_kv_write` (the twin runs exactly those two twins' arithmetic).

use half::bf16;
use solder_circuit::ir::MetaField;
use solder_circuit::{OpKind, WeightFormat};
use solder_gpu_runtime::{GpuError, LaunchConfig};

use super::super::{each_dot, GEMM_FEATURES, GEMM_ROWS, GEMM_THREADS};
use crate::kernels::args::size;
use crate::kernels::decl::kernel;
use crate::kernels::emit_view::{View, R};
use crate::kernels::gemv::projections;
use crate::kernels::heads::{with_rope, CacheArgs, HeadPass};
use crate::numerics::linear_value;

kernel! {
    /// x bf16\[rows·k\] → q, k, v (weights bf16\[n·k\], biases optional); q roped into q_out
    /// bf16\[rows·heads·head_dim\], the roped k and v into each row's slot of the paged cache.
    pub struct QkvRopeKvMma / QkvRopeKvMmaArgs {
        x: In<bf16>,
        wq: In<bf16>,
        bq: InOpt<bf16>,
        wk: In<bf16>,
        bk: InOpt<bf16>,
        wv: In<bf16>,
        bv: InOpt<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        slot_mapping: In<i32>,
        q_out: Out<bf16>,
        cache: InOut<bf16>,
        rows: U32,
        k: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
        block_size: U32,
        num_pages: U32,
    }
    grid(a) = qkv_rope_kv_grid([a.heads, a.kv_heads, a.head_dim, a.rotary_dim], a.rows);
    QKV_ROPE_KV_MMA = "gemm::qkv_rope_kv_mma" => twin qkv_rope_kv_mma, emit emit_qkv_rope_kv_mma;
}

/// Per q or k head ⌈half/16⌉ rope blocks and ⌈(head_dim − 2·half)/32⌉ pass-through blocks
/// (half = min(rotary_dim, head_dim) / 2), then ⌈kv_heads·head_dim/32⌉ v blocks; one block per
/// 64 rows.
pub fn qkv_rope_kv_grid(
    [heads, kv_heads, head_dim, rotary_dim]: [u32; 4],
    rows: u32,
) -> LaunchConfig {
    let half = rotary_dim.min(head_dim) / 2;
    let per_head = half.div_ceil(16) + (head_dim - 2 * half).div_ceil(GEMM_FEATURES);
    let v_blocks = (kv_heads * head_dim).div_ceil(GEMM_FEATURES);
    LaunchConfig {
        grid: [
            ((heads + kv_heads) * per_head + v_blocks).max(1),
            rows.div_ceil(GEMM_ROWS).max(1),
            1,
        ],
        block: [GEMM_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

fn qkv_rope_kv_mma(a: QkvRopeKvMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k) = (a.rows.count(), a.k.dim()?);
    let (heads, kv_heads, head_dim) = (a.heads.dim()?, a.kv_heads.dim()?, a.head_dim.dim()?);
    let (nq, nkv) = (
        size(ctx, &[heads, head_dim])?,
        size(ctx, &[kv_heads, head_dim])?,
    );
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let mut q = vec![bf16::ZERO; size(ctx, &[rows, nq])?];
    let mut kr = vec![bf16::ZERO; size(ctx, &[rows, nkv])?];
    let mut v = vec![bf16::ZERO; size(ctx, &[rows, nkv])?];
    let projections = [
        (a.wq, a.bq, &mut q, nq),
        (a.wk, a.bk, &mut kr, nkv),
        (a.wv, a.bv, &mut v, nkv),
    ];
    for (w, bias, y, n) in projections {
        let w = w.len(size(ctx, &[n, k])?)?;
        let bias = bias.len(n)?;
        each_dot(
            ctx,
            x,
            w,
            [rows, k, n],
            |o, d| linear_value(d, bias.map(|b| b[o])),
            y,
        );
    }
    let pass = HeadPass::over(ctx, &q, &kr, [rows, heads, kv_heads, head_dim]);
    let pass = with_rope(pass, a.positions, a.inv_freq, a.rotary_dim)?;
    let cache = CacheArgs {
        slot_mapping: a.slot_mapping,
        cache: a.cache,
        block_size: a.block_size,
        num_pages: a.num_pages,
    };
    pass.into_cache_from(&v, a.q_out, cache)
}

fn emit_qkv_rope_kv_mma(v: &View<'_>) -> R {
    let p = projections(v)?;
    if let Some(slot) = v.weight_slots().find(|s| s.format != WeightFormat::Bf16) {
        return Err(v.err(format!(
            "weight `{}` is stored as {}, but `{}` reads only bf16",
            slot.name,
            slot.format,
            QKV_ROPE_KV_MMA.as_str()
        )));
    }
    let ([wq, wk, wv], [bq, bk, bv]) = (p.w, p.bias);
    let rope = v.op(OpKind::Rope, None)?;
    let write = v.op(OpKind::KvWrite, None)?;
    Ok(vec![QkvRopeKvMma {
        x: v.input(p.q_op, 0)?,
        wq,
        bq,
        wk,
        bk,
        wv,
        bv,
        positions: v.meta(MetaField::Positions),
        inv_freq: v.inv_freq(),
        slot_mapping: v.meta(MetaField::SlotMapping),
        q_out: v.output(rope, 0)?,
        cache: v.state_of(write.outputs[0])?,
        rows: v.rows(),
        k: p.k,
        heads: v.u32(rope, "heads")?,
        kv_heads: v.u32(rope, "kv_heads")?,
        head_dim: v.u32(rope, "head_dim")?,
        rotary_dim: v.u32(rope, "rotary_dim")?,
        block_size: v.kv_block_size(),
        num_pages: v.kv_pages(),
    }
    .launch(QKV_ROPE_KV_MMA)])
}
