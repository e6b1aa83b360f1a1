//! Twins of the `gemv` kernels. Each fused twin runs the reference twins' steps in order on
//! the same primitives: residual add (`residual_row`) → RMSNorm (`rms_norm_row`) → projections
//! (`dot_bf16` + `linear_value`) → epilogue (`silu_mul_value`, `residual_value`), keeping
//! intermediates in local buffers where the reference routing would have stored them.

use half::bf16;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::args::{
    bf16_in, bf16_in_opt, bf16_out, dim, f32_in, f32_out, f32_out_opt, macs, rows, size,
    threads_for,
};
use super::basic::{add_rows, norm_rows};
use super::matvec::{for_each_dot, Widened};
use crate::numerics::{linear_value, residual_value, silu_mul_value};

/// One projection's weights `[n][k]` and optional bias `[n]`.
#[derive(Clone, Copy)]
struct Proj<'a> {
    w: &'a [bf16],
    bias: Option<&'a [bf16]>,
    n: usize,
}

impl Proj<'_> {
    /// Reads weights at `w_index` and the optional bias at `w_index + 1` (when `biased`).
    fn read<'a>(
        ctx: &TwinCtx<'a>,
        w_index: usize,
        biased: bool,
        n: usize,
        k: usize,
    ) -> Result<Proj<'a>, GpuError> {
        let w = bf16_in(ctx, w_index, size(ctx, &[n, k])?)?;
        let bias = if biased {
            bf16_in_opt(ctx, w_index + 1, n)?
        } else {
            None
        };
        Ok(Proj { w, bias, n })
    }

    /// Weight row `o`.
    #[inline]
    fn row(&self, o: usize, k: usize) -> &[bf16] {
        &self.w[o * k..(o + 1) * k]
    }

    /// bf16(dot + bias[o]): what `linear` stores for feature `o`.
    #[inline]
    fn finish(&self, o: usize, dot: f32) -> bf16 {
        linear_value(dot, self.bias.map(|b| b[o]))
    }
}

/// The linear projection of every row of `x` (`[rows][k]`) into `y` (`[rows][p.n]`).
fn project(ctx: &TwinCtx<'_>, x: &[bf16], rows: usize, k: usize, p: Proj<'_>, y: &mut [bf16]) {
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
#[allow(clippy::too_many_arguments)]
fn gate_up(
    ctx: &TwinCtx<'_>,
    x: &[bf16],
    rows: usize,
    k: usize,
    wg: &[bf16],
    wu: &[bf16],
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

/// logits[r][o] = dot(x[r], w[o]).
fn logits(
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

/// RMSNorm of `h` (`[rows][k]`) into a local bf16 buffer, as `norm::rms_norm` would store it.
fn normed(h: &[f32], wn: &[bf16], k: usize, eps: f32) -> Vec<bf16> {
    let mut x = vec![bf16::ZERO; h.len()];
    norm_rows(h, wn, k, eps, &mut x);
    x
}

/// `gemv::linear(x, w, bias?, y, rows, k, n_out)`.
pub(crate) fn linear(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, n) = (rows(ctx, 4)?, dim(ctx, 5)?, dim(ctx, 6)?);
    let x = bf16_in(ctx, 0, size(ctx, &[rows, k])?)?;
    let p = Proj::read(ctx, 1, true, n, k)?;
    let y = bf16_out(ctx, 3, size(ctx, &[rows, n])?)?;
    project(ctx, x, rows, k, p, y);
    Ok(())
}

/// `gemv::lm_head(x, w, logits, rows, k, vocab)`.
pub(crate) fn lm_head(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, vocab) = (rows(ctx, 3)?, dim(ctx, 4)?, dim(ctx, 5)?);
    let x = bf16_in(ctx, 0, size(ctx, &[rows, k])?)?;
    let w = bf16_in(ctx, 1, size(ctx, &[vocab, k])?)?;
    let out = f32_out(ctx, 2, size(ctx, &[rows, vocab])?)?;
    logits(ctx, x, rows, k, w, vocab, out);
    Ok(())
}

/// `gemv::norm_linear(h, wn, w, bias?, y, rows, k, n_out, eps)` = rms_norm → linear.
pub(crate) fn norm_linear(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, n, eps) = (rows(ctx, 5)?, dim(ctx, 6)?, dim(ctx, 7)?, ctx.f32(8)?);
    let h = f32_in(ctx, 0, size(ctx, &[rows, k])?)?;
    let wn = bf16_in(ctx, 1, k)?;
    let p = Proj::read(ctx, 2, true, n, k)?;
    let y = bf16_out(ctx, 4, size(ctx, &[rows, n])?)?;
    project(ctx, &normed(h, wn, k, eps), rows, k, p, y);
    Ok(())
}

/// Reads q/k/v weights and biases starting at `first` (wq, bq, wk, bk, wv, bv).
fn qkv_weights<'a>(
    ctx: &TwinCtx<'a>,
    first: usize,
    k: usize,
    nq: usize,
    nkv: usize,
) -> Result<[Proj<'a>; 3], GpuError> {
    Ok([
        Proj::read(ctx, first, true, nq, k)?,
        Proj::read(ctx, first + 2, true, nkv, k)?,
        Proj::read(ctx, first + 4, true, nkv, k)?,
    ])
}

/// Writable q, k, v outputs starting at `first`.
fn qkv_outputs<'a>(
    ctx: &TwinCtx<'a>,
    first: usize,
    rows: usize,
    nq: usize,
    nkv: usize,
) -> Result<[&'a mut [bf16]; 3], GpuError> {
    Ok([
        bf16_out(ctx, first, size(ctx, &[rows, nq])?)?,
        bf16_out(ctx, first + 1, size(ctx, &[rows, nkv])?)?,
        bf16_out(ctx, first + 2, size(ctx, &[rows, nkv])?)?,
    ])
}

/// `gemv::qkv(x, wq, bq?, wk, bk?, wv, bv?, q, k, v, rows, k, nq, nkv)` = linear ×3.
pub(crate) fn qkv(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, nq, nkv) = (rows(ctx, 10)?, dim(ctx, 11)?, dim(ctx, 12)?, dim(ctx, 13)?);
    let x = bf16_in(ctx, 0, size(ctx, &[rows, k])?)?;
    let p = qkv_weights(ctx, 1, k, nq, nkv)?;
    let out = qkv_outputs(ctx, 7, rows, nq, nkv)?;
    project_qkv(ctx, x, rows, k, p, out);
    Ok(())
}

/// `gemv::norm_qkv(h, wn, wq, bq?, wk, bk?, wv, bv?, q, k, v, rows, k, nq, nkv, eps)`.
pub(crate) fn norm_qkv(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, nq, nkv, eps) = (
        rows(ctx, 11)?,
        dim(ctx, 12)?,
        dim(ctx, 13)?,
        dim(ctx, 14)?,
        ctx.f32(15)?,
    );
    let h = f32_in(ctx, 0, size(ctx, &[rows, k])?)?;
    let wn = bf16_in(ctx, 1, k)?;
    let p = qkv_weights(ctx, 2, k, nq, nkv)?;
    let out = qkv_outputs(ctx, 8, rows, nq, nkv)?;
    project_qkv(ctx, &normed(h, wn, k, eps), rows, k, p, out);
    Ok(())
}

/// `gemv::add_norm_qkv(h, d, wn, wq, bq?, wk, bk?, wv, bv?, h_out?, q, k, v, rows, k, nq,
/// nkv, eps)` = residual_add → rms_norm → linear ×3.
pub(crate) fn add_norm_qkv(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, nq, nkv, eps) = (
        rows(ctx, 13)?,
        dim(ctx, 14)?,
        dim(ctx, 15)?,
        dim(ctx, 16)?,
        ctx.f32(17)?,
    );
    let n = size(ctx, &[rows, k])?;
    let h = f32_in(ctx, 0, n)?;
    let d = bf16_in(ctx, 1, n)?;
    let wn = bf16_in(ctx, 2, k)?;
    let p = qkv_weights(ctx, 3, k, nq, nkv)?;
    let h_out = f32_out_opt(ctx, 9, n)?;
    let out = qkv_outputs(ctx, 10, rows, nq, nkv)?;
    let mut local = Vec::new();
    let sum = add_rows(h, d, h_out, &mut local);
    project_qkv(ctx, &normed(sum, wn, k, eps), rows, k, p, out);
    Ok(())
}

/// `gemv::gate_up_silu(x, wg, wu, act, rows, k, inter)` = linear ×2 → silu_mul.
pub(crate) fn gate_up_silu(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, inter) = (rows(ctx, 4)?, dim(ctx, 5)?, dim(ctx, 6)?);
    let x = bf16_in(ctx, 0, size(ctx, &[rows, k])?)?;
    let wg = bf16_in(ctx, 1, size(ctx, &[inter, k])?)?;
    let wu = bf16_in(ctx, 2, size(ctx, &[inter, k])?)?;
    let act = bf16_out(ctx, 3, size(ctx, &[rows, inter])?)?;
    gate_up(ctx, x, rows, k, wg, wu, inter, act);
    Ok(())
}

/// `gemv::norm_gate_up_silu(h, wn, wg, wu, act, rows, k, inter, eps)`.
pub(crate) fn norm_gate_up_silu(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, inter, eps) = (rows(ctx, 5)?, dim(ctx, 6)?, dim(ctx, 7)?, ctx.f32(8)?);
    let h = f32_in(ctx, 0, size(ctx, &[rows, k])?)?;
    let wn = bf16_in(ctx, 1, k)?;
    let wg = bf16_in(ctx, 2, size(ctx, &[inter, k])?)?;
    let wu = bf16_in(ctx, 3, size(ctx, &[inter, k])?)?;
    let act = bf16_out(ctx, 4, size(ctx, &[rows, inter])?)?;
    gate_up(ctx, &normed(h, wn, k, eps), rows, k, wg, wu, inter, act);
    Ok(())
}

/// `gemv::add_norm_gate_up_silu(h, o, wn, wg, wu, h_out?, act, rows, k, inter, eps)`.
pub(crate) fn add_norm_gate_up_silu(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, inter, eps) = (rows(ctx, 7)?, dim(ctx, 8)?, dim(ctx, 9)?, ctx.f32(10)?);
    let n = size(ctx, &[rows, k])?;
    let h = f32_in(ctx, 0, n)?;
    let o = bf16_in(ctx, 1, n)?;
    let wn = bf16_in(ctx, 2, k)?;
    let wg = bf16_in(ctx, 3, size(ctx, &[inter, k])?)?;
    let wu = bf16_in(ctx, 4, size(ctx, &[inter, k])?)?;
    let h_out = f32_out_opt(ctx, 5, n)?;
    let act = bf16_out(ctx, 6, size(ctx, &[rows, inter])?)?;
    let mut local = Vec::new();
    let sum = add_rows(h, o, h_out, &mut local);
    gate_up(ctx, &normed(sum, wn, k, eps), rows, k, wg, wu, inter, act);
    Ok(())
}

/// `gemv::linear_residual_add(x, w, bias?, h, h_out, rows, k, n_out)` = linear → residual_add.
pub(crate) fn linear_residual_add(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, n) = (rows(ctx, 5)?, dim(ctx, 6)?, dim(ctx, 7)?);
    let x = bf16_in(ctx, 0, size(ctx, &[rows, k])?)?;
    let p = Proj::read(ctx, 1, true, n, k)?;
    let h = f32_in(ctx, 3, size(ctx, &[rows, n])?)?;
    let h_out = f32_out(ctx, 4, size(ctx, &[rows, n])?)?;
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

/// `gemv::add_norm_lm_head(h, d, wn, w, logits, rows, k, vocab, eps)` = residual_add →
/// rms_norm → lm_head.
pub(crate) fn add_norm_lm_head(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, k, vocab, eps) = (rows(ctx, 5)?, dim(ctx, 6)?, dim(ctx, 7)?, ctx.f32(8)?);
    let n = size(ctx, &[rows, k])?;
    let h = f32_in(ctx, 0, n)?;
    let d = bf16_in(ctx, 1, n)?;
    let wn = bf16_in(ctx, 2, k)?;
    let w = bf16_in(ctx, 3, size(ctx, &[vocab, k])?)?;
    let out = f32_out(ctx, 4, size(ctx, &[rows, vocab])?)?;
    let mut local = Vec::new();
    let sum = add_rows(h, d, None, &mut local);
    logits(ctx, &normed(sum, wn, k, eps), rows, k, w, vocab, out);
    Ok(())
}
