//! Twins of the row-wise kernels: `embed::embedding`, `norm::rms_norm`,
//! `norm::add_rms_norm`, `add::residual_add`, `act::silu_mul`.

use half::bf16;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::args::{bf16_in, bf16_out, dim, f32_in, f32_out, f32_out_opt, i32_in, rows, size};
use crate::numerics::{residual_row, rms_norm_row, silu_mul_value, to_f32};

/// `embed::embedding(tokens, table, out, rows, hidden, vocab)`.
pub(crate) fn embedding(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, hidden, vocab) = (rows(ctx, 3)?, dim(ctx, 4)?, dim(ctx, 5)?);
    let tokens = i32_in(ctx, 0, rows)?;
    let table = bf16_in(ctx, 1, size(ctx, &[vocab, hidden])?)?;
    let out = f32_out(ctx, 2, size(ctx, &[rows, hidden])?)?;
    for (r, t) in tokens.iter().enumerate() {
        if *t < 0 || *t as usize >= vocab {
            return Err(ctx.fail(format!(
                "row {r}: token id {t} outside the vocabulary of {vocab}"
            )));
        }
    }
    for (t, o) in tokens.iter().zip(out.chunks_exact_mut(hidden)) {
        let row = &table[*t as usize * hidden..][..hidden];
        for (o, v) in o.iter_mut().zip(row) {
            *o = to_f32(*v);
        }
    }
    Ok(())
}

/// RMSNorm of every row of `x` into `out`.
pub(crate) fn norm_rows(x: &[f32], w: &[bf16], hidden: usize, eps: f32, out: &mut [bf16]) {
    for (x, o) in x.chunks_exact(hidden).zip(out.chunks_exact_mut(hidden)) {
        rms_norm_row(x, w, eps, o);
    }
}

/// `h + x` into `h_out` when present, else into a local buffer; returns the sum.
pub(crate) fn add_rows<'a>(
    h: &[f32],
    x: &[bf16],
    h_out: Option<&'a mut [f32]>,
    local: &'a mut Vec<f32>,
) -> &'a [f32] {
    let out: &'a mut [f32] = match h_out {
        Some(o) => o,
        None => {
            local.resize(h.len(), 0.0);
            local.as_mut_slice()
        }
    };
    residual_row(h, x, out);
    out
}

/// `norm::rms_norm(x, w, out, rows, hidden, eps)`.
pub(crate) fn rms_norm(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, hidden, eps) = (rows(ctx, 3)?, dim(ctx, 4)?, ctx.f32(5)?);
    let n = size(ctx, &[rows, hidden])?;
    let x = f32_in(ctx, 0, n)?;
    let w = bf16_in(ctx, 1, hidden)?;
    let out = bf16_out(ctx, 2, n)?;
    norm_rows(x, w, hidden, eps, out);
    Ok(())
}

/// `norm::add_rms_norm(h, x, w, h_out?, out, rows, hidden, eps)` = residual_add → rms_norm.
pub(crate) fn add_rms_norm(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (rows, hidden, eps) = (rows(ctx, 5)?, dim(ctx, 6)?, ctx.f32(7)?);
    let n = size(ctx, &[rows, hidden])?;
    let h = f32_in(ctx, 0, n)?;
    let x = bf16_in(ctx, 1, n)?;
    let w = bf16_in(ctx, 2, hidden)?;
    let h_out = f32_out_opt(ctx, 3, n)?;
    let out = bf16_out(ctx, 4, n)?;
    let mut local = Vec::new();
    let sum = add_rows(h, x, h_out, &mut local);
    norm_rows(sum, w, hidden, eps, out);
    Ok(())
}

/// `add::residual_add(h, x, out, rows, hidden)`.
pub(crate) fn residual_add(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let n = size(ctx, &[rows(ctx, 3)?, dim(ctx, 4)?])?;
    let h = f32_in(ctx, 0, n)?;
    let x = bf16_in(ctx, 1, n)?;
    let out = f32_out(ctx, 2, n)?;
    residual_row(h, x, out);
    Ok(())
}

/// `act::silu_mul(g, u, out, rows, width)`.
pub(crate) fn silu_mul(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let n = size(ctx, &[rows(ctx, 3)?, dim(ctx, 4)?])?;
    let g = bf16_in(ctx, 0, n)?;
    let u = bf16_in(ctx, 1, n)?;
    let out = bf16_out(ctx, 2, n)?;
    for ((o, g), u) in out.iter_mut().zip(g).zip(u) {
        *o = silu_mul_value(*g, *u);
    }
    Ok(())
}
