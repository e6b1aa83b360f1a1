//! `norm` module (`crates/kernels/cuda/norm.cu`): RMSNorm of the residual stream, its fusion
//! with the residual add, and the per-head qk-norm; each also zero-centred (`*_zc`, weight
//! applied as 1 + w: Qwen3-Next), taking the same arguments as its plain counterpart; and the
//! MTP draft head's pair of pre-fc norms (`mtp_pre_fc_zc`).
//!
//! Twins: a row is normalised by `rms_norm_row` (or its zero-centred form, which reduces the
//! same way: `sum_squares_*`, `inv_rms`); `add_rms_norm*` adds through `add_rows`, so its bytes
//! equal `add::residual_add` followed by the norm.

use half::bf16;
use solder_circuit::OpKind;
use solder_gpu_runtime::GpuError;

use super::args::size;
use super::decl::{kernel, Name};
use super::grid::{per_head_block, per_warp_row};
use super::heads::{geometry, with_norm};
use crate::kernels::emit_view::{View, R};
use crate::numerics::{inv_rms, residual_row, rms_norm_row, sum_squares_f32, to_bf16, to_f32};

kernel! {
    /// x f32\[rows·hidden\], w bf16\[hidden\] → out bf16\[rows·hidden\].
    pub struct RmsNorm / RmsNormArgs {
        x: In<f32>,
        w: In<bf16>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
        eps: F32,
    }
    grid(a) = per_warp_row(a.rows);
    RMS_NORM = "norm::rms_norm" => twin rms_norm, emit emit_rms_norm;
    RMS_NORM_ZC = "norm::rms_norm_zc" => twin rms_norm_zc, emit emit_rms_norm_zc;
}

kernel! {
    /// h f32 + x bf16 → h_out f32 (optional), then RMSNorm → out bf16.
    pub struct AddRmsNorm / AddRmsNormArgs {
        h: In<f32>,
        x: In<bf16>,
        w: In<bf16>,
        h_out: OutOpt<f32>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
        eps: F32,
    }
    grid(a) = per_warp_row(a.rows);
    ADD_RMS_NORM = "norm::add_rms_norm" => twin add_rms_norm, emit emit_add_rms_norm;
    ADD_RMS_NORM_ZC = "norm::add_rms_norm_zc" => twin add_rms_norm_zc, emit emit_add_rms_norm_zc;
}

kernel! {
    /// Per-head RMSNorm of q bf16\[rows·heads·head_dim\] and k bf16\[rows·kv_heads·head_dim\] with
    /// weights wq, wk bf16\[head_dim\]; one block per row, one warp per head.
    pub struct QkNorm / QkNormArgs {
        q: In<bf16>,
        k: In<bf16>,
        wq: In<bf16>,
        wk: In<bf16>,
        q_out: Out<bf16>,
        k_out: Out<bf16>,
        rows: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        eps: F32,
    }
    grid(a) = per_head_block(a.rows, a.heads, a.kv_heads);
    QK_NORM = "norm::qk_norm" => twin qk_norm, emit emit_qk_norm;
    QK_NORM_ZC = "norm::qk_norm_zc" => twin qk_norm_zc, emit emit_qk_norm_zc;
}

kernel! {
    /// The MTP draft head's input (Qwen3-Next): per row, the zero-centred RMSNorm of the
    /// token's embedding e f32\[rows·hidden\] (weight we) and of the target's hidden row
    /// x bf16\[rows·hidden\] (weight wh), side by side: out bf16\[rows·2·hidden\], embedding first.
    pub struct MtpPreFc / MtpPreFcArgs {
        e: In<f32>,
        x: In<bf16>,
        we: In<bf16>,
        wh: In<bf16>,
        out: Out<bf16>,
        rows: U32,
        hidden: U32,
        eps: F32,
    }
    grid(a) = per_warp_row(a.rows);
    MTP_PRE_FC_ZC = "norm::mtp_pre_fc_zc" => twin mtp_pre_fc_zc, emit emit_mtp_pre_fc_zc;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[
    RmsNorm::DECLS,
    AddRmsNorm::DECLS,
    QkNorm::DECLS,
    MtpPreFc::DECLS,
];

// ---- twins ---------------------------------------------------------------------------------

/// A row normaliser: f32 row, weight, eps → bf16 row.
type RowNorm = fn(&[f32], &[bf16], f32, &mut [bf16]);

/// RMSNorm of every row of `x` into `out`.
pub(crate) fn norm_rows(x: &[f32], w: &[bf16], hidden: usize, eps: f32, out: &mut [bf16]) {
    each_row(rms_norm_row, x, w, hidden, eps, out);
}

fn each_row(f: RowNorm, x: &[f32], w: &[bf16], hidden: usize, eps: f32, out: &mut [bf16]) {
    for (x, o) in x.chunks_exact(hidden).zip(out.chunks_exact_mut(hidden)) {
        f(x, w, eps, o);
    }
}

/// Zero-centred RMSNorm of an f32 row: out\[i\] = bf16((x\[i\] · inv) · (1 + w\[i\])).
fn rms_norm_zc_row(x: &[f32], w: &[bf16], eps: f32, out: &mut [bf16]) {
    let inv = inv_rms(sum_squares_f32(x), x.len(), eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = to_bf16((*v * inv) * (1.0 + to_f32(*g)));
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

fn rms_norm_with(a: RmsNormArgs<'_>, f: RowNorm) -> Result<(), GpuError> {
    let (rows, hidden, eps) = (a.rows.count(), a.hidden.dim()?, a.eps);
    let n = size(a.ctx, &[rows, hidden])?;
    let x = a.x.len(n)?;
    let w = a.w.len(hidden)?;
    let out = a.out.len(n)?;
    each_row(f, x, w, hidden, eps, out);
    Ok(())
}

fn rms_norm(a: RmsNormArgs<'_>) -> Result<(), GpuError> {
    rms_norm_with(a, rms_norm_row)
}

fn rms_norm_zc(a: RmsNormArgs<'_>) -> Result<(), GpuError> {
    rms_norm_with(a, rms_norm_zc_row)
}

/// residual_add → the norm `f`.
fn add_rms_norm_with(a: AddRmsNormArgs<'_>, f: RowNorm) -> Result<(), GpuError> {
    let (rows, hidden, eps) = (a.rows.count(), a.hidden.dim()?, a.eps);
    let n = size(a.ctx, &[rows, hidden])?;
    let h = a.h.len(n)?;
    let x = a.x.len(n)?;
    let w = a.w.len(hidden)?;
    let h_out = a.h_out.len(n)?;
    let out = a.out.len(n)?;
    let mut local = Vec::new();
    let sum = add_rows(h, x, h_out, &mut local);
    each_row(f, sum, w, hidden, eps, out);
    Ok(())
}

fn add_rms_norm(a: AddRmsNormArgs<'_>) -> Result<(), GpuError> {
    add_rms_norm_with(a, rms_norm_row)
}

fn add_rms_norm_zc(a: AddRmsNormArgs<'_>) -> Result<(), GpuError> {
    add_rms_norm_with(a, rms_norm_zc_row)
}

/// Each row: `rms_norm_zc_row` of the embedding into the first half, then of the hidden row
/// widened to f32 (so its sum of squares is `sum_squares_bf16`'s) into the second.
fn mtp_pre_fc_zc(a: MtpPreFcArgs<'_>) -> Result<(), GpuError> {
    let (rows, hidden, eps) = (a.rows.count(), a.hidden.dim()?, a.eps);
    let n = size(a.ctx, &[rows, hidden])?;
    let e = a.e.len(n)?;
    let x = a.x.len(n)?;
    let we = a.we.len(hidden)?;
    let wh = a.wh.len(hidden)?;
    let out = a.out.len(size(a.ctx, &[rows, 2, hidden])?)?;
    let mut widened = vec![0.0f32; hidden];
    for ((e, x), o) in e
        .chunks_exact(hidden)
        .zip(x.chunks_exact(hidden))
        .zip(out.chunks_exact_mut(2 * hidden))
    {
        let (oe, ox) = o.split_at_mut(hidden);
        rms_norm_zc_row(e, we, eps, oe);
        for (w, v) in widened.iter_mut().zip(x) {
            *w = to_f32(*v);
        }
        rms_norm_zc_row(&widened, wh, eps, ox);
    }
    Ok(())
}

fn qk_norm(a: QkNormArgs<'_>) -> Result<(), GpuError> {
    let pass = geometry(a.ctx, a.q, a.k, a.rows, a.heads, a.kv_heads, a.head_dim)?;
    let pass = with_norm(pass, a.wq, a.wk, a.eps)?;
    pass.into_outputs(a.q_out, a.k_out)
}

fn qk_norm_zc(a: QkNormArgs<'_>) -> Result<(), GpuError> {
    let pass = geometry(a.ctx, a.q, a.k, a.rows, a.heads, a.kv_heads, a.head_dim)?;
    let pass = with_norm(pass, a.wq, a.wk, a.eps)?.zero_centred();
    pass.into_outputs(a.q_out, a.k_out)
}

// ---- emitters ------------------------------------------------------------------------------

fn emit_rms_norm(v: &View<'_>) -> R {
    rms_norm_of(v, OpKind::RmsNorm, RMS_NORM)
}

fn emit_rms_norm_zc(v: &View<'_>) -> R {
    rms_norm_of(v, OpKind::RmsNormZc, RMS_NORM_ZC)
}

fn emit_mtp_pre_fc_zc(v: &View<'_>) -> R {
    let n = v.op(OpKind::MtpPreFc, None)?;
    Ok(vec![MtpPreFc {
        e: v.input(n, 0)?,
        x: v.input(n, 1)?,
        we: v.weight(n, 0)?,
        wh: v.weight(n, 1)?,
        out: v.output(n, 0)?,
        rows: v.rows(),
        hidden: v.u32(n, "hidden")?,
        eps: v.f32(n, "eps")?,
    }
    .launch(MTP_PRE_FC_ZC)])
}

/// The launch of the norm op of `kind` as `kernel`.
fn rms_norm_of(v: &View<'_>, kind: OpKind, kernel: Name<RmsNorm>) -> R {
    let n = v.op(kind, None)?;
    Ok(vec![RmsNorm {
        x: v.input(n, 0)?,
        w: v.weight(n, 0)?,
        out: v.output(n, 0)?,
        rows: v.rows(),
        hidden: v.u32(n, "hidden")?,
        eps: v.f32(n, "eps")?,
    }
    .launch(kernel)])
}

fn emit_add_rms_norm(v: &View<'_>) -> R {
    add_rms_norm_of(v, OpKind::RmsNorm, ADD_RMS_NORM)
}

fn emit_add_rms_norm_zc(v: &View<'_>) -> R {
    add_rms_norm_of(v, OpKind::RmsNormZc, ADD_RMS_NORM_ZC)
}

fn add_rms_norm_of(v: &View<'_>, kind: OpKind, kernel: Name<AddRmsNorm>) -> R {
    let (a, n) = (v.op(OpKind::ResidualAdd, None)?, v.op(kind, None)?);
    Ok(vec![AddRmsNorm {
        h: v.input(a, 0)?,
        x: v.input(a, 1)?,
        w: v.weight(n, 0)?,
        h_out: v.output_opt(a, 0)?,
        out: v.output(n, 0)?,
        rows: v.rows(),
        hidden: v.u32(n, "hidden")?,
        eps: v.f32(n, "eps")?,
    }
    .launch(kernel)])
}

fn emit_qk_norm(v: &View<'_>) -> R {
    qk_norm_of(v, OpKind::QkNorm, QK_NORM)
}

fn emit_qk_norm_zc(v: &View<'_>) -> R {
    qk_norm_of(v, OpKind::QkNormZc, QK_NORM_ZC)
}

fn qk_norm_of(v: &View<'_>, kind: OpKind, kernel: Name<QkNorm>) -> R {
    let q = v.op(kind, None)?;
    Ok(vec![QkNorm {
        q: v.input(q, 0)?,
        k: v.input(q, 1)?,
        wq: v.weight(q, 0)?,
        wk: v.weight(q, 1)?,
        q_out: v.output(q, 0)?,
        k_out: v.output(q, 1)?,
        rows: v.rows(),
        heads: v.u32(q, "heads")?,
        kv_heads: v.u32(q, "kv_heads")?,
        head_dim: v.u32(q, "head_dim")?,
        eps: v.f32(q, "eps")?,
    }
    .launch(kernel)])
}
