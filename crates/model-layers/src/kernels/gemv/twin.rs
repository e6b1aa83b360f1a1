//! CPU twins of the `gemv` kernels. Each fused twin runs the reference twins' steps in order on
//! the same primitives: residual add (`residual_row`) → RMSNorm (`rms_norm_row`) → projections
//! (`dot_bf16` + `linear_value`) → epilogue (`silu_mul_value`, `residual_value`), keeping
//! intermediates in local buffers where the reference routing would have stored them.

use half::bf16;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::matvec::{for_each_dot, Widened};
use super::twin_split::{check_head_split, check_split};
use super::{
    AddNormGateUpSiluArgs, AddNormLmHeadArgs, AddNormQkvArgs, GateUpSiluArgs,
    GatedNormLinearResidualAddArgs, LinearArgs, LinearPairArgs, LinearResidualAddArgs, LmHeadArgs,
    NormGateUpSiluArgs, NormLinearArgs, NormQkvArgs, QkvArgs, QkvRopeKvArgs, HEAD_DIM_MAX,
};
use crate::kernels::args::{macs, size, threads_for, In, InOpt, Out};
use crate::kernels::gdn::{gated_norm_values, GatedNormIn};
use crate::kernels::heads::{with_rope, CacheArgs, HeadPass};
use crate::kernels::norm::{add_rows, norm_rows};
use crate::kernels::want::on_wanted_rows;
use crate::numerics::{linear_value, residual_value, silu_mul_value};

/// One projection's weights `[n]\[k\]` and optional bias `\[n\]`.
#[derive(Clone, Copy)]
pub(super) struct Proj<'a> {
    w: &'a [bf16],
    bias: Option<&'a [bf16]>,
    n: usize,
}

impl<'a> Proj<'a> {
    /// Weights `[n]\[k\]` already read (a dequantised matrix) and the optional bias.
    pub(super) fn new(w: &'a [bf16], bias: Option<&'a [bf16]>, n: usize) -> Proj<'a> {
        Proj { w, bias, n }
    }

    /// Weights `[n]\[k\]` and the optional bias `\[n\]`.
    fn read(
        ctx: &TwinCtx<'_>,
        w: In<'a, bf16>,
        bias: InOpt<'a, bf16>,
        n: usize,
        k: usize,
    ) -> Result<Proj<'a>, GpuError> {
        let w = w.len(size(ctx, &[n, k])?)?;
        let bias = bias.len(n)?;
        Ok(Proj { w, bias, n })
    }

    /// Weight row `o`.
    #[inline]
    fn row(&self, o: usize, k: usize) -> &[bf16] {
        &self.w[o * k..(o + 1) * k]
    }

    /// bf16(dot + bias\[o\]): what `linear` stores for feature `o`.
    #[inline]
    fn finish(&self, o: usize, dot: f32) -> bf16 {
        linear_value(dot, self.bias.map(|b| b[o]))
    }
}

/// The linear projection of every row of `x` (`[rows]\[k\]`) into `y` (`[rows]\[p.n\]`).
pub(super) fn project(
    ctx: &TwinCtx<'_>,
    x: &[bf16],
    rows: usize,
    k: usize,
    p: Proj<'_>,
    y: &mut [bf16],
) {
    let threads = threads_for(ctx, macs(&[rows, k, p.n]));
    let xs = Widened::new(x, k);
    for_each_dot(
        threads,
        &xs,
        p.n,
        |o| p.row(o, k),
        |_, o, d| p.finish(o, d),
        y,
    );
}

/// q, k and v projections of the same rows, in one pass over the three weight matrices.
fn project_qkv(
    ctx: &TwinCtx<'_>,
    x: &[bf16],
    rows: usize,
    k: usize,
    p: [Proj<'_>; 3],
    out: [&mut [bf16]; 3],
) {
    let cols = p[0].n + p[1].n + p[2].n;
    let threads = threads_for(ctx, macs(&[rows, k, cols]));
    let which = |c: usize| {
        if c < p[0].n {
            (&p[0], c)
        } else if c < p[0].n + p[1].n {
            (&p[1], c - p[0].n)
        } else {
            (&p[2], c - p[0].n - p[1].n)
        }
    };
    let xs = Widened::new(x, k);
    let mut all = vec![bf16::ZERO; rows * cols];
    for_each_dot(
        threads,
        &xs,
        cols,
        |c| {
            let (proj, o) = which(c);
            proj.row(o, k)
        },
        |_, c, d| {
            let (proj, o) = which(c);
            proj.finish(o, d)
        },
        &mut all,
    );
    let mut first = 0;
    for (proj, y) in p.iter().zip(out) {
        for r in 0..rows {
            y[r * proj.n..(r + 1) * proj.n]
                .copy_from_slice(&all[r * cols + first..r * cols + first + proj.n]);
        }
        first += proj.n;
    }
}

/// Gate and up projections (no bias) then silu(gate) · up, each stored bf16 on the way.
fn gate_up(
    ctx: &TwinCtx<'_>,
    x: &[bf16],
    rows: usize,
    k: usize,
    (wg, wu): (&[bf16], &[bf16]),
    inter: usize,
    act: &mut [bf16],
) {
    let threads = threads_for(ctx, macs(&[2, rows, k, inter]));
    let (g, u) = (
        Proj {
            w: wg,
            bias: None,
            n: inter,
        },
        Proj {
            w: wu,
            bias: None,
            n: inter,
        },
    );
    let xs = Widened::new(x, k);
    // Gate and up as one projection of 2·inter features, each stored bf16 as the reference does.
    let mut both = vec![bf16::ZERO; rows * 2 * inter];
    let pick = |c: usize| if c < inter { (&g, c) } else { (&u, c - inter) };
    for_each_dot(
        threads,
        &xs,
        2 * inter,
        |c| {
            let (proj, o) = pick(c);
            proj.row(o, k)
        },
        |_, c, d| {
            let (proj, o) = pick(c);
            proj.finish(o, d)
        },
        &mut both,
    );
    for r in 0..rows {
        let row = &both[r * 2 * inter..(r + 1) * 2 * inter];
        for i in 0..inter {
            act[r * inter + i] = silu_mul_value(row[i], row[inter + i]);
        }
    }
}

/// logits\[r\]\[o\] = dot(x\[r\], w\[o\]).
pub(super) fn logits(
    ctx: &TwinCtx<'_>,
    x: &[bf16],
    rows: usize,
    k: usize,
    w: &[bf16],
    vocab: usize,
    out: &mut [f32],
) {
    let threads = threads_for(ctx, macs(&[rows, k, vocab]));
    let xs = Widened::new(x, k);
    for_each_dot(
        threads,
        &xs,
        vocab,
        |o| &w[o * k..(o + 1) * k],
        |_, _, d| d,
        out,
    );
}

/// RMSNorm of `h` (`[rows]\[k\]`) into a local bf16 buffer, as `norm::rms_norm` would store it.
fn normed(h: &[f32], wn: &[bf16], k: usize, eps: f32) -> Vec<bf16> {
    let mut x = vec![bf16::ZERO; h.len()];
    norm_rows(h, wn, k, eps, &mut x);
    x
}

pub(super) fn linear(a: LinearArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    check_split(ctx, a.scratch, n, rows, k, 1)?;
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let p = Proj::read(ctx, a.w, a.bias, n, k)?;
    let y = a.y.len(size(ctx, &[rows, n])?)?;
    project(ctx, x, rows, k, p, y);
    Ok(())
}

pub(super) fn lm_head(a: LmHeadArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, vocab) = (a.rows.count(), a.k.dim()?, a.vocab.dim()?);
    check_split(ctx, a.scratch, vocab, rows, k, 1)?;
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let w = a.w.len(size(ctx, &[vocab, k])?)?;
    let out = a.logits.len(size(ctx, &[rows, vocab])?)?;
    let want = a.want.len(rows)?;
    on_wanted_rows(want, (x, k), (out, vocab), rows, |x, rows, out| {
        logits(ctx, x, rows, k, w, vocab, out);
        Ok(())
    })
}

/// rms_norm → linear.
pub(super) fn norm_linear(a: NormLinearArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n, eps) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?, a.eps);
    check_split(ctx, a.scratch, n, rows, k, 1)?;
    let h = a.h.len(size(ctx, &[rows, k])?)?;
    let wn = a.wn.len(k)?;
    let p = Proj::read(ctx, a.w, a.bias, n, k)?;
    let y = a.y.len(size(ctx, &[rows, n])?)?;
    project(ctx, &normed(h, wn, k, eps), rows, k, p, y);
    Ok(())
}

/// The q, k and v projections' weights and biases.
type QkvWeights<'a> = [(In<'a, bf16>, InOpt<'a, bf16>); 3];

fn qkv_weights<'a>(
    ctx: &TwinCtx<'_>,
    [(wq, bq), (wk, bk), (wv, bv)]: QkvWeights<'a>,
    k: usize,
    nq: usize,
    nkv: usize,
) -> Result<[Proj<'a>; 3], GpuError> {
    Ok([
        Proj::read(ctx, wq, bq, nq, k)?,
        Proj::read(ctx, wk, bk, nkv, k)?,
        Proj::read(ctx, wv, bv, nkv, k)?,
    ])
}

/// The q, k and v outputs.
fn qkv_outputs<'a>(
    ctx: &TwinCtx<'_>,
    [q, k, v]: [Out<'a, bf16>; 3],
    rows: usize,
    nq: usize,
    nkv: usize,
) -> Result<[&'a mut [bf16]; 3], GpuError> {
    Ok([
        q.len(size(ctx, &[rows, nq])?)?,
        k.len(size(ctx, &[rows, nkv])?)?,
        v.len(size(ctx, &[rows, nkv])?)?,
    ])
}

/// linear ×3.
pub(super) fn qkv(a: QkvArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, nq, nkv) = (a.rows.count(), a.k.dim()?, a.nq.dim()?, a.nkv.dim()?);
    check_split(ctx, a.scratch, nq + 2 * nkv, rows, k, 1)?;
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let weights = [(a.wq, a.bq), (a.wk, a.bk), (a.wv, a.bv)];
    let p = qkv_weights(ctx, weights, k, nq, nkv)?;
    let out = qkv_outputs(ctx, [a.q, a.k_out, a.v], rows, nq, nkv)?;
    project_qkv(ctx, x, rows, k, p, out);
    Ok(())
}

/// linear ×2 over one input: each projection as `linear` computes it.
pub(super) fn linear_pair(a: LinearPairArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n1, n2) = (a.rows.count(), a.k.dim()?, a.n1.dim()?, a.n2.dim()?);
    check_split(ctx, a.scratch, n1 + n2, rows, k, 1)?;
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let (p1, p2) = (
        Proj::read(ctx, a.w1, a.b1, n1, k)?,
        Proj::read(ctx, a.w2, a.b2, n2, k)?,
    );
    let (y1, y2) = (
        a.y1.len(size(ctx, &[rows, n1])?)?,
        a.y2.len(size(ctx, &[rows, n2])?)?,
    );
    project(ctx, x, rows, k, p1, y1);
    project(ctx, x, rows, k, p2, y2);
    Ok(())
}

/// rms_norm → linear ×3.
pub(super) fn norm_qkv(a: NormQkvArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, nq, nkv, eps) = (a.rows.count(), a.k.dim()?, a.nq.dim()?, a.nkv.dim()?, a.eps);
    check_split(ctx, a.scratch, nq + 2 * nkv, rows, k, 1)?;
    let h = a.h.len(size(ctx, &[rows, k])?)?;
    let wn = a.wn.len(k)?;
    let weights = [(a.wq, a.bq), (a.wk, a.bk), (a.wv, a.bv)];
    let p = qkv_weights(ctx, weights, k, nq, nkv)?;
    let out = qkv_outputs(ctx, [a.q, a.k_out, a.v], rows, nq, nkv)?;
    project_qkv(ctx, &normed(h, wn, k, eps), rows, k, p, out);
    Ok(())
}

/// residual_add → rms_norm → linear ×3.
pub(super) fn add_norm_qkv(a: AddNormQkvArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, nq, nkv, eps) = (a.rows.count(), a.k.dim()?, a.nq.dim()?, a.nkv.dim()?, a.eps);
    check_split(ctx, a.scratch, nq + 2 * nkv, rows, k, 1)?;
    let n = size(ctx, &[rows, k])?;
    let h = a.h.len(n)?;
    let d = a.d.len(n)?;
    let wn = a.wn.len(k)?;
    let weights = [(a.wq, a.bq), (a.wk, a.bk), (a.wv, a.bv)];
    let p = qkv_weights(ctx, weights, k, nq, nkv)?;
    let h_out = a.h_out.len(n)?;
    let out = qkv_outputs(ctx, [a.q, a.k_out, a.v], rows, nq, nkv)?;
    let mut local = Vec::new();
    let sum = add_rows(h, d, h_out, &mut local);
    project_qkv(ctx, &normed(sum, wn, k, eps), rows, k, p, out);
    Ok(())
}

/// Gate and up weights `[inter]\[k\]` each.
fn gate_up_weights<'a>(
    ctx: &TwinCtx<'_>,
    wg: In<'a, bf16>,
    wu: In<'a, bf16>,
    inter: usize,
    k: usize,
) -> Result<(&'a [bf16], &'a [bf16]), GpuError> {
    let n = size(ctx, &[inter, k])?;
    Ok((wg.len(n)?, wu.len(n)?))
}

/// linear ×2 → silu_mul.
pub(super) fn gate_up_silu(a: GateUpSiluArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, inter) = (a.rows.count(), a.k.dim()?, a.inter.dim()?);
    check_split(ctx, a.scratch, inter, rows, k, 2)?;
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let (wg, wu) = gate_up_weights(ctx, a.wg, a.wu, inter, k)?;
    let act = a.act.len(size(ctx, &[rows, inter])?)?;
    gate_up(ctx, x, rows, k, (wg, wu), inter, act);
    Ok(())
}

/// rms_norm → linear ×2 → silu_mul.
pub(super) fn norm_gate_up_silu(a: NormGateUpSiluArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, inter, eps) = (a.rows.count(), a.k.dim()?, a.inter.dim()?, a.eps);
    check_split(ctx, a.scratch, inter, rows, k, 2)?;
    let h = a.h.len(size(ctx, &[rows, k])?)?;
    let wn = a.wn.len(k)?;
    let (wg, wu) = gate_up_weights(ctx, a.wg, a.wu, inter, k)?;
    let act = a.act.len(size(ctx, &[rows, inter])?)?;
    gate_up(ctx, &normed(h, wn, k, eps), rows, k, (wg, wu), inter, act);
    Ok(())
}

/// residual_add → rms_norm → linear ×2 → silu_mul.
pub(super) fn add_norm_gate_up_silu(a: AddNormGateUpSiluArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, inter, eps) = (a.rows.count(), a.k.dim()?, a.inter.dim()?, a.eps);
    check_split(ctx, a.scratch, inter, rows, k, 2)?;
    let n = size(ctx, &[rows, k])?;
    let h = a.h.len(n)?;
    let o = a.o.len(n)?;
    let wn = a.wn.len(k)?;
    let (wg, wu) = gate_up_weights(ctx, a.wg, a.wu, inter, k)?;
    let h_out = a.h_out.len(n)?;
    let act = a.act.len(size(ctx, &[rows, inter])?)?;
    let mut local = Vec::new();
    let sum = add_rows(h, o, h_out, &mut local);
    gate_up(ctx, &normed(sum, wn, k, eps), rows, k, (wg, wu), inter, act);
    Ok(())
}

/// linear → residual_add.
pub(super) fn linear_residual_add(a: LinearResidualAddArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    check_split(ctx, a.scratch, n, rows, k, 1)?;
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let p = Proj::read(ctx, a.w, a.bias, n, k)?;
    residual_project(ctx, x, rows, k, p, (a.h, a.h_out))
}

/// gdn::gated_norm → linear → residual_add: the gated norm's values (its twin's), then
/// `linear_residual_add`'s.
pub(super) fn gated_norm_linear_residual_add(
    a: GatedNormLinearResidualAddArgs<'_>,
) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    check_split(ctx, a.scratch, n, rows, k, 1)?;
    let g = GatedNormIn {
        core: a.core,
        qkvz: a.qkvz,
        w: a.wn,
        dims: [a.nk, a.dk, a.nv, a.dv],
        eps: a.eps,
    };
    let x = gated_norm_values(ctx, g, rows)?;
    if x.len() != rows * k {
        return Err(a.k.bad(format!(
            "k = {k}, expected nv·dv = {} (the gated norm's row)",
            x.len() / rows.max(1)
        )));
    }
    let p = Proj::read(ctx, a.w, a.bias, n, k)?;
    residual_project(ctx, &x, rows, k, p, (a.h, a.h_out))
}

/// h_out\[r\]\[o\] = h\[r\]\[o\] + bf16(x\[r\] · w\[o\] + bias\[o\]).
fn residual_project(
    ctx: &TwinCtx<'_>,
    x: &[bf16],
    rows: usize,
    k: usize,
    p: Proj<'_>,
    (h, h_out): (In<'_, f32>, Out<'_, f32>),
) -> Result<(), GpuError> {
    let n = p.n;
    let h = h.len(size(ctx, &[rows, n])?)?;
    let h_out = h_out.len(size(ctx, &[rows, n])?)?;
    let threads = threads_for(ctx, macs(&[rows, k, n]));
    let xs = Widened::new(x, k);
    for_each_dot(
        threads,
        &xs,
        n,
        |o| p.row(o, k),
        |r, o, d| residual_value(h[r * n + o], p.finish(o, d)),
        h_out,
    );
    Ok(())
}

/// residual_add → rms_norm → lm_head.
pub(super) fn add_norm_lm_head(a: AddNormLmHeadArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, vocab, eps) = (a.rows.count(), a.k.dim()?, a.vocab.dim()?, a.eps);
    check_split(ctx, a.scratch, vocab, rows, k, 1)?;
    let n = size(ctx, &[rows, k])?;
    let h = a.h.len(n)?;
    let d = a.d.len(n)?;
    let wn = a.wn.len(k)?;
    let w = a.w.len(size(ctx, &[vocab, k])?)?;
    let out = a.logits.len(size(ctx, &[rows, vocab])?)?;
    let want = a.want.len(rows)?;
    let mut local = Vec::new();
    let sum = add_rows(h, d, None, &mut local);
    let x = normed(sum, wn, k, eps);
    on_wanted_rows(want, (&x, k), (out, vocab), rows, |x, rows, out| {
        logits(ctx, x, rows, k, w, vocab, out);
        Ok(())
    })
}

/// (residual_add →) rms_norm → linear ×3 → (qk_norm →) rope → kv_write: q, k and v rounded
/// to bf16 as `linear` stores them, then the head pass of `rope::rope_kv_write` (or
/// `qk_norm_rope_kv_write`) over them.
pub(super) fn qkv_rope_kv(a: QkvRopeKvArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, eps) = (a.rows.count(), a.k.dim()?, a.eps);
    let (heads, kv_heads, head_dim) = (a.heads.dim()?, a.kv_heads.dim()?, a.head_dim.dim()?);
    check_head_split(ctx, a.scratch, rows, heads + 2 * kv_heads, head_dim)?;
    if head_dim > HEAD_DIM_MAX as usize {
        return Err(a.head_dim.bad(format!(
            "head_dim {head_dim} is wider than the {HEAD_DIM_MAX} a block stages"
        )));
    }
    let (nq, nkv) = (
        size(ctx, &[heads, head_dim])?,
        size(ctx, &[kv_heads, head_dim])?,
    );
    let n = size(ctx, &[rows, k])?;
    let h = a.h.len(n)?;
    let d = a.d.len(n)?;
    let wn = a.wn.len(k)?;
    let weights = [(a.wq, a.bq), (a.wk, a.bk), (a.wv, a.bv)];
    let p = qkv_weights(ctx, weights, k, nq, nkv)?;
    let qk_norm = match (a.qwn.len(head_dim)?, a.kwn.len(head_dim)?) {
        (Some(wq), Some(wk)) => Some((wq, wk)),
        (None, None) => None,
        _ => return Err(ctx.fail("qk-norm needs both `qwn` and `kwn`, or neither")),
    };
    let h_out = a.h_out.len(n)?;
    let mut local = Vec::new();
    let sum: &[f32] = match d {
        Some(d) => add_rows(h, d, h_out, &mut local),
        None => match h_out {
            // No residual add: the kernel's sum is h itself.
            Some(out) => {
                out.copy_from_slice(h);
                out
            }
            None => h,
        },
    };
    let (mut q, mut kr, mut v) = (
        vec![bf16::ZERO; size(ctx, &[rows, nq])?],
        vec![bf16::ZERO; size(ctx, &[rows, nkv])?],
        vec![bf16::ZERO; size(ctx, &[rows, nkv])?],
    );
    let x = normed(sum, wn, k, eps);
    project_qkv(ctx, &x, rows, k, p, [&mut q, &mut kr, &mut v]);
    let pass = HeadPass::over(ctx, &q, &kr, [rows, heads, kv_heads, head_dim]);
    let pass = match qk_norm {
        Some((wq, wk)) => pass.normed_by(wq, wk, a.qk_eps),
        None => pass,
    };
    let pass = with_rope(pass, a.positions, a.inv_freq, a.rotary_dim)?;
    let cache = CacheArgs {
        slot_mapping: a.slot_mapping,
        cache: a.cache,
        block_size: a.block_size,
        num_pages: a.num_pages,
    };
    pass.into_cache_from(&v, a.q_out, cache)
}
