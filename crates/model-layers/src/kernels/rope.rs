//! `rope` module (`crates/kernels/cuda/rope.cu`): rotary embedding of q and k, alone or fused
//! with qk-norm and the KV write. Twins run the shared per-head pass (`heads`).

use half::bf16;
use solder_circuit::ir::{MetaField, Op};
use solder_circuit::OpKind;
use solder_gpu_runtime::GpuError;

use super::args::size;
use super::decl::kernel;
use super::grid::per_head_block;
use super::heads::{geometry, split_gated, with_norm, with_rope, CacheArgs, HeadPass};
use crate::error::ExecError;
use crate::kernels::emit_view::{View, R};

kernel! {
    /// q bf16\[rows·heads·head_dim\], k bf16\[rows·kv_heads·head_dim\], positions i32\[rows\],
    /// inv_freq f32\[rotary_dim/2 + 1\] (inverse frequencies, then the attention scaling) →
    /// q_out, k_out.
    pub struct Rope / RopeArgs {
        q: In<bf16>,
        k: In<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        q_out: Out<bf16>,
        k_out: Out<bf16>,
        rows: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
    }
    grid(a) = per_head_block(a.rows, a.heads, a.kv_heads);
    ROPE = "rope::rope" => twin rope, emit emit_rope;
}

kernel! {
    /// qk-norm (weights wq, wk bf16\[head_dim\]) then rope.
    pub struct QkNormRope / QkNormRopeArgs {
        q: In<bf16>,
        k: In<bf16>,
        wq: In<bf16>,
        wk: In<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        q_out: Out<bf16>,
        k_out: Out<bf16>,
        rows: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
        eps: F32,
    }
    grid(a) = per_head_block(a.rows, a.heads, a.kv_heads);
    QK_NORM_ROPE = "rope::qk_norm_rope" => twin qk_norm_rope, emit emit_qk_norm_rope;
}

kernel! {
    /// rope of q (→ q_out) and k, then the roped k and v stored in their slots of the cache.
    pub struct RopeKvWrite / RopeKvWriteArgs {
        q: In<bf16>,
        k: In<bf16>,
        v: In<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        slot_mapping: In<i32>,
        q_out: Out<bf16>,
        cache: InOut<bf16>,
        rows: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
        block_size: U32,
        num_pages: U32,
    }
    grid(a) = per_head_block(a.rows, a.heads, a.kv_heads);
    ROPE_KV_WRITE = "rope::rope_kv_write" => twin rope_kv_write, emit emit_rope_kv_write;
}

kernel! {
    /// qk-norm, rope of q (→ q_out) and k, then the roped k and v stored in the cache.
    pub struct QkNormRopeKvWrite / QkNormRopeKvWriteArgs {
        q: In<bf16>,
        k: In<bf16>,
        v: In<bf16>,
        wq: In<bf16>,
        wk: In<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        slot_mapping: In<i32>,
        q_out: Out<bf16>,
        cache: InOut<bf16>,
        rows: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
        block_size: U32,
        num_pages: U32,
        eps: F32,
    }
    grid(a) = per_head_block(a.rows, a.heads, a.kv_heads);
    QK_NORM_ROPE_KV_WRITE = "rope::qk_norm_rope_kv_write" =>
        twin qk_norm_rope_kv_write, emit emit_qk_norm_rope_kv_write;
}

kernel! {
    /// Qwen3-Next's gated attention: q2 bf16\[rows·heads·2·head_dim\] (each head
    /// `[q | gate]`); the gate halves → gate_out, then zero-centred qk-norm, rope of q (→ q_out)
    /// and k, and the roped k and v stored in the cache.
    pub struct GatedQkNormZcRopeKvWrite / GatedQkNormZcRopeKvWriteArgs {
        q2: In<bf16>,
        k: In<bf16>,
        v: In<bf16>,
        wq: In<bf16>,
        wk: In<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        slot_mapping: In<i32>,
        q_out: Out<bf16>,
        gate_out: Out<bf16>,
        cache: InOut<bf16>,
        rows: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
        block_size: U32,
        num_pages: U32,
        eps: F32,
    }
    grid(a) = per_head_block(a.rows, a.heads, a.kv_heads);
    GATED_QK_NORM_ZC_ROPE_KV_WRITE = "rope::gated_qk_norm_zc_rope_kv_write" =>
        twin gated_qk_norm_zc_rope_kv_write, emit emit_gated_qk_norm_zc_rope_kv_write;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[
    Rope::DECLS,
    QkNormRope::DECLS,
    RopeKvWrite::DECLS,
    QkNormRopeKvWrite::DECLS,
    GatedQkNormZcRopeKvWrite::DECLS,
];

// ---- twins ---------------------------------------------------------------------------------

fn rope(a: RopeArgs<'_>) -> Result<(), GpuError> {
    let pass = geometry(a.ctx, a.q, a.k, a.rows, a.heads, a.kv_heads, a.head_dim)?;
    let pass = with_rope(pass, a.positions, a.inv_freq, a.rotary_dim)?;
    pass.into_outputs(a.q_out, a.k_out)
}

/// qk_norm → rope.
fn qk_norm_rope(a: QkNormRopeArgs<'_>) -> Result<(), GpuError> {
    let pass = geometry(a.ctx, a.q, a.k, a.rows, a.heads, a.kv_heads, a.head_dim)?;
    let pass = with_norm(pass, a.wq, a.wk, a.eps)?;
    let pass = with_rope(pass, a.positions, a.inv_freq, a.rotary_dim)?;
    pass.into_outputs(a.q_out, a.k_out)
}

/// rope → kv_write.
fn rope_kv_write(a: RopeKvWriteArgs<'_>) -> Result<(), GpuError> {
    let pass = geometry(a.ctx, a.q, a.k, a.rows, a.heads, a.kv_heads, a.head_dim)?;
    let pass = with_rope(pass, a.positions, a.inv_freq, a.rotary_dim)?;
    let cache = CacheArgs {
        slot_mapping: a.slot_mapping,
        cache: a.cache,
        block_size: a.block_size,
        num_pages: a.num_pages,
    };
    pass.into_cache(a.v, a.q_out, cache)
}

/// qk_norm → rope → kv_write.
fn qk_norm_rope_kv_write(a: QkNormRopeKvWriteArgs<'_>) -> Result<(), GpuError> {
    let pass = geometry(a.ctx, a.q, a.k, a.rows, a.heads, a.kv_heads, a.head_dim)?;
    let pass = with_norm(pass, a.wq, a.wk, a.eps)?;
    let pass = with_rope(pass, a.positions, a.inv_freq, a.rotary_dim)?;
    let cache = CacheArgs {
        slot_mapping: a.slot_mapping,
        cache: a.cache,
        block_size: a.block_size,
        num_pages: a.num_pages,
    };
    pass.into_cache(a.v, a.q_out, cache)
}

/// gate_split → qk_norm_zc → rope → kv_write.
fn gated_qk_norm_zc_rope_kv_write(a: GatedQkNormZcRopeKvWriteArgs<'_>) -> Result<(), GpuError> {
    let (rows, heads, kv_heads, head_dim) = (
        a.rows.count(),
        a.heads.dim()?,
        a.kv_heads.dim()?,
        a.head_dim.dim()?,
    );
    let n = size(a.ctx, &[rows, heads, head_dim])?;
    let q2 = a.q2.len(size(a.ctx, &[n, 2])?)?;
    let k = a.k.len(size(a.ctx, &[rows, kv_heads, head_dim])?)?;
    let gate = a.gate_out.len(n)?;
    let mut q = vec![bf16::ZERO; n];
    split_gated(q2, head_dim, &mut q, gate);
    let pass = HeadPass::over(a.ctx, &q, k, [rows, heads, kv_heads, head_dim]);
    let pass = with_norm(pass, a.wq, a.wk, a.eps)?.zero_centred();
    let pass = with_rope(pass, a.positions, a.inv_freq, a.rotary_dim)?;
    let cache = CacheArgs {
        slot_mapping: a.slot_mapping,
        cache: a.cache,
        block_size: a.block_size,
        num_pages: a.num_pages,
    };
    pass.into_cache(a.v, a.q_out, cache)
}

// ---- emitters ------------------------------------------------------------------------------

/// What every rope kernel takes from the group: the rope op's heads, kv heads, head dim and
/// rotary dim, and the rows' positions and inv_freq.
struct RopeInputs<'a> {
    op: &'a Op,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    rotary_dim: u32,
}

fn rope_inputs<'a>(v: &View<'a>) -> Result<RopeInputs<'a>, ExecError> {
    let op = v.op(OpKind::Rope, None)?;
    Ok(RopeInputs {
        op,
        heads: v.u32(op, "heads")?,
        kv_heads: v.u32(op, "kv_heads")?,
        head_dim: v.u32(op, "head_dim")?,
        rotary_dim: v.u32(op, "rotary_dim")?,
    })
}

fn emit_rope(v: &View<'_>) -> R {
    let r = rope_inputs(v)?;
    Ok(vec![Rope {
        q: v.input(r.op, 0)?,
        k: v.input(r.op, 1)?,
        positions: v.meta(MetaField::Positions),
        inv_freq: v.inv_freq(),
        q_out: v.output(r.op, 0)?,
        k_out: v.output(r.op, 1)?,
        rows: v.rows(),
        heads: r.heads,
        kv_heads: r.kv_heads,
        head_dim: r.head_dim,
        rotary_dim: r.rotary_dim,
    }
    .launch(ROPE)])
}

fn emit_qk_norm_rope(v: &View<'_>) -> R {
    let (r, n) = (rope_inputs(v)?, v.op(OpKind::QkNorm, None)?);
    Ok(vec![QkNormRope {
        q: v.input(n, 0)?,
        k: v.input(n, 1)?,
        wq: v.weight(n, 0)?,
        wk: v.weight(n, 1)?,
        positions: v.meta(MetaField::Positions),
        inv_freq: v.inv_freq(),
        q_out: v.output(r.op, 0)?,
        k_out: v.output(r.op, 1)?,
        rows: v.rows(),
        heads: r.heads,
        kv_heads: r.kv_heads,
        head_dim: r.head_dim,
        rotary_dim: r.rotary_dim,
        eps: v.f32(n, "eps")?,
    }
    .launch(QK_NORM_ROPE)])
}

fn emit_rope_kv_write(v: &View<'_>) -> R {
    let (r, w) = (rope_inputs(v)?, v.op(OpKind::KvWrite, None)?);
    Ok(vec![RopeKvWrite {
        q: v.input(r.op, 0)?,
        k: v.input(r.op, 1)?,
        v: v.input(w, 1)?,
        positions: v.meta(MetaField::Positions),
        inv_freq: v.inv_freq(),
        slot_mapping: v.meta(MetaField::SlotMapping),
        q_out: v.output(r.op, 0)?,
        cache: v.state_of(w.outputs[0])?,
        rows: v.rows(),
        heads: r.heads,
        kv_heads: r.kv_heads,
        head_dim: r.head_dim,
        rotary_dim: r.rotary_dim,
        block_size: v.kv_block_size(),
        num_pages: v.kv_pages(),
    }
    .launch(ROPE_KV_WRITE)])
}

fn emit_qk_norm_rope_kv_write(v: &View<'_>) -> R {
    let (r, w) = (rope_inputs(v)?, v.op(OpKind::KvWrite, None)?);
    let n = v.op(OpKind::QkNorm, None)?;
    Ok(vec![QkNormRopeKvWrite {
        q: v.input(n, 0)?,
        k: v.input(n, 1)?,
        v: v.input(w, 1)?,
        wq: v.weight(n, 0)?,
        wk: v.weight(n, 1)?,
        positions: v.meta(MetaField::Positions),
        inv_freq: v.inv_freq(),
        slot_mapping: v.meta(MetaField::SlotMapping),
        q_out: v.output(r.op, 0)?,
        cache: v.state_of(w.outputs[0])?,
        rows: v.rows(),
        heads: r.heads,
        kv_heads: r.kv_heads,
        head_dim: r.head_dim,
        rotary_dim: r.rotary_dim,
        block_size: v.kv_block_size(),
        num_pages: v.kv_pages(),
        eps: v.f32(n, "eps")?,
    }
    .launch(QK_NORM_ROPE_KV_WRITE)])
}

fn emit_gated_qk_norm_zc_rope_kv_write(v: &View<'_>) -> R {
    let (r, w) = (rope_inputs(v)?, v.op(OpKind::KvWrite, None)?);
    let (g, n) = (
        v.op(OpKind::AttnGateSplit, None)?,
        v.op(OpKind::QkNormZc, None)?,
    );
    Ok(vec![GatedQkNormZcRopeKvWrite {
        q2: v.input(g, 0)?,
        k: v.input(n, 1)?,
        v: v.input(w, 1)?,
        wq: v.weight(n, 0)?,
        wk: v.weight(n, 1)?,
        positions: v.meta(MetaField::Positions),
        inv_freq: v.inv_freq(),
        slot_mapping: v.meta(MetaField::SlotMapping),
        q_out: v.output(r.op, 0)?,
        gate_out: v.output(g, 1)?,
        cache: v.state_of(w.outputs[0])?,
        rows: v.rows(),
        heads: r.heads,
        kv_heads: r.kv_heads,
        head_dim: r.head_dim,
        rotary_dim: r.rotary_dim,
        block_size: v.kv_block_size(),
        num_pages: v.kv_pages(),
        eps: v.f32(n, "eps")?,
    }
    .launch(GATED_QK_NORM_ZC_ROPE_KV_WRITE)])
}
