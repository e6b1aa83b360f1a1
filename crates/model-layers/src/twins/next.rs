//! Twins of the Qwen3-Next kernels outside `gdn`: the zero-centred norms
//! `norm::rms_norm_zc`, `norm::add_rms_norm_zc`, `norm::qk_norm_zc` (weight applied as 1 + w),
//! the gated attention's `attn::gate_split` and `act::sigmoid_mul`, and the shared expert's
//! `moe::combine_shared`.
//!
//! The zero-centred norms reduce exactly as `norm::rms_norm` / `norm::qk_norm` do
//! (`sum_squares_*`, `inv_rms`); `add_rms_norm_zc` adds through `basic::add_rows`, so its bytes
//! equal `add::residual_add` followed by `rms_norm_zc`.

use half::bf16;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::args::{bf16_in, bf16_out, dim, f32_in, f32_out_opt, rows, size};
use super::basic::add_rows;
use crate::numerics::{inv_rms, sum_squares_bf16, sum_squares_f32, to_bf16, to_f32};

/// 1 / (1 + exp(−x)), in f32.
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Zero-centred RMSNorm of an f32 row: out[i] = bf16((x[i] · inv) · (1 + w[i])).
fn rms_norm_zc_row(x: &[f32], w: &[bf16], eps: f32, out: &mut [bf16]) {
    let inv = inv_rms(sum_squares_f32(x), x.len(), eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = to_bf16((*v * inv) * (1.0 + to_f32(*g)));
    }
}

/// Zero-centred RMSNorm of a bf16 head.
fn rms_norm_zc_head(x: &[bf16], w: &[bf16], eps: f32, out: &mut [bf16]) {
    let inv = inv_rms(sum_squares_bf16(x), x.len(), eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = to_bf16((to_f32(*v) * inv) * (1.0 + to_f32(*g)));
    }
}

fn norm_zc_rows(x: &[f32], w: &[bf16], hidden: usize, eps: f32, out: &mut [bf16]) {
    for (x, o) in x.chunks_exact(hidden).zip(out.chunks_exact_mut(hidden)) {
        rms_norm_zc_row(x, w, eps, o);
    }
}

/// `norm::rms_norm_zc(x, w, out, rows, hidden, eps)`.
pub(crate) fn rms_norm_zc(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, hidden, eps) = (rows(ctx, 3)?, dim(ctx, 4)?, ctx.f32(5)?);
    let n = size(ctx, &[rows, hidden])?;
    let x = f32_in(ctx, 0, n)?;
    let w = bf16_in(ctx, 1, hidden)?;
    let out = bf16_out(ctx, 2, n)?;
    norm_zc_rows(x, w, hidden, eps, out);
    Ok(())
}

/// `norm::add_rms_norm_zc(h, x, w, h_out?, out, rows, hidden, eps)` = residual_add →
/// rms_norm_zc.
pub(crate) fn add_rms_norm_zc(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, hidden, eps) = (rows(ctx, 5)?, dim(ctx, 6)?, ctx.f32(7)?);
    let n = size(ctx, &[rows, hidden])?;
    let h = f32_in(ctx, 0, n)?;
    let x = bf16_in(ctx, 1, n)?;
    let w = bf16_in(ctx, 2, hidden)?;
    let h_out = f32_out_opt(ctx, 3, n)?;
    let out = bf16_out(ctx, 4, n)?;
    let mut local = Vec::new();
    let sum = add_rows(h, x, h_out, &mut local);
    norm_zc_rows(sum, w, hidden, eps, out);
    Ok(())
}

/// `norm::qk_norm_zc(q, k, wq, wk, q_out, k_out, rows, heads, kv_heads, head_dim, eps)`.
pub(crate) fn qk_norm_zc(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, heads, kv_heads, head_dim) =
        (rows(ctx, 6)?, dim(ctx, 7)?, dim(ctx, 8)?, dim(ctx, 9)?);
    let eps = ctx.f32(10)?;
    let q = bf16_in(ctx, 0, size(ctx, &[rows, heads, head_dim])?)?;
    let k = bf16_in(ctx, 1, size(ctx, &[rows, kv_heads, head_dim])?)?;
    let wq = bf16_in(ctx, 2, head_dim)?;
    let wk = bf16_in(ctx, 3, head_dim)?;
    let q_out = bf16_out(ctx, 4, q.len())?;
    let k_out = bf16_out(ctx, 5, k.len())?;
    for (x, o) in q
        .chunks_exact(head_dim)
        .zip(q_out.chunks_exact_mut(head_dim))
    {
        rms_norm_zc_head(x, wq, eps, o);
    }
    for (x, o) in k
        .chunks_exact(head_dim)
        .zip(k_out.chunks_exact_mut(head_dim))
    {
        rms_norm_zc_head(x, wk, eps, o);
    }
    Ok(())
}

/// `attn::gate_split(q2, q, gate, rows, heads, head_dim)`: each head of q2 is `[q | gate]`.
pub(crate) fn gate_split(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, heads, head_dim) = (rows(ctx, 3)?, dim(ctx, 4)?, dim(ctx, 5)?);
    let n = size(ctx, &[rows, heads, head_dim])?;
    let q2 = bf16_in(ctx, 0, size(ctx, &[n, 2])?)?;
    let q = bf16_out(ctx, 1, n)?;
    let gate = bf16_out(ctx, 2, n)?;
    for ((pair, q), g) in q2
        .chunks_exact(2 * head_dim)
        .zip(q.chunks_exact_mut(head_dim))
        .zip(gate.chunks_exact_mut(head_dim))
    {
        q.copy_from_slice(&pair[..head_dim]);
        g.copy_from_slice(&pair[head_dim..]);
    }
    Ok(())
}

/// `act::sigmoid_mul(x, gate, out, rows, width)`: out = bf16(x · sigmoid(gate)).
pub(crate) fn sigmoid_mul(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let n = size(ctx, &[rows(ctx, 3)?, dim(ctx, 4)?])?;
    let x = bf16_in(ctx, 0, n)?;
    let gate = bf16_in(ctx, 1, n)?;
    let out = bf16_out(ctx, 2, n)?;
    for ((o, x), g) in out.iter_mut().zip(x).zip(gate) {
        *o = to_bf16(to_f32(*x) * sigmoid(to_f32(*g)));
    }
    Ok(())
}

/// `moe::combine_shared(routed, shared, gate, out, rows, hidden)`: out = bf16(routed +
/// sigmoid(gate[r]) · shared).
pub(crate) fn combine_shared(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, hidden) = (rows(ctx, 4)?, dim(ctx, 5)?);
    let n = size(ctx, &[rows, hidden])?;
    let routed = bf16_in(ctx, 0, n)?;
    let shared = bf16_in(ctx, 1, n)?;
    let gate = bf16_in(ctx, 2, rows)?;
    let out = bf16_out(ctx, 3, n)?;
    for (((o, a), b), g) in out
        .chunks_exact_mut(hidden)
        .zip(routed.chunks_exact(hidden))
        .zip(shared.chunks_exact(hidden))
        .zip(gate)
    {
        let s = sigmoid(to_f32(*g));
        for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
            *o = to_bf16(to_f32(*a) + s * to_f32(*b));
        }
    }
    Ok(())
}
