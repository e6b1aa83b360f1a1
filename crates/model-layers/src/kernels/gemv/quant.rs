//! The gemv entries that read a quantized weight (`solder_circuit::format`): `linear_fp8`,
//! `linear_int4`, `lm_head_fp8`, `lm_head_int4`, each the bf16 kernel on the dequantised
//! matrix, and the emitters of `gemv::linear` and `gemv::lm_head` (`emit_linear`,
//! `emit_lm_head`), which launch the entry of the weight slot's format. Format entries of their
//! kernel, not rules' kernels (`FORMAT_ENTRIES`); every other gemv kernel's emitter refuses a
//! quantized slot with an error naming kernel, tensor and format (`emit::launch`).
//!
//! The weight argument is the slot's blob (one pointer), the format's parameters scalar
//! arguments after the dimensions. Classic shape only (one block per 8 features and 8 rows,
//! `gemv_config`): the streaming and split-K entries stay bf16-only, so `shape` never picks
//! them for a quantized slot.
//!
//! Invariant: a twin here dequantises each weight row with `numerics::dequant::dequant_row`
//! and runs the bf16 twin's arithmetic (`twin::project`, `twin::logits`) on the result, so its
//! bytes equal the bf16 kernel's on the dequantised matrix.

use half::bf16;
use solder_circuit::{OpKind, WeightFormat};
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::emit::launch;
use super::shape::gemv_config;
use super::twin::{logits, project, Proj};
use super::{Linear, LmHead};
use crate::kernels::args::{dequantised, size, In, InOpt};
use crate::kernels::decl::kernel;
use crate::kernels::emit_view::{View, R};
use crate::kernels::want::on_wanted_rows;

kernel! {
    /// x bf16\[rows·k\], w an fp8 blob \[n_out·k\] (f32 scales of `block_n × block_k` blocks),
    /// bias bf16\[n_out\]? → y bf16\[rows·n_out\].
    pub struct LinearFp8 / LinearFp8Args {
        x: In<bf16>,
        w: In<u8>,
        bias: InOpt<bf16>,
        y: Out<bf16>,
        rows: U32,
        k: U32,
        n_out: U32,
        block_n: U32,
        block_k: U32,
    }
    grid(a) = gemv_config(a.n_out as u64, a.rows);
    LINEAR_FP8 = "gemv::linear_fp8" => twin linear_fp8, emit emit_linear;
}

kernel! {
    /// x bf16\[rows·k\], w an int4 blob \[n_out·k\] (f32 scales and u8 zero points per
    /// `group`), bias bf16\[n_out\]? → y bf16\[rows·n_out\].
    pub struct LinearInt4 / LinearInt4Args {
        x: In<bf16>,
        w: In<u8>,
        bias: InOpt<bf16>,
        y: Out<bf16>,
        rows: U32,
        k: U32,
        n_out: U32,
        group: U32,
    }
    grid(a) = gemv_config(a.n_out as u64, a.rows);
    LINEAR_INT4 = "gemv::linear_int4" => twin linear_int4, emit emit_linear;
}

kernel! {
    /// x bf16\[rows·k\], w an fp8 blob \[vocab·k\] → logits f32\[rows·vocab\] (`want` as
    /// `lm_head`'s).
    pub struct LmHeadFp8 / LmHeadFp8Args {
        x: In<bf16>,
        w: In<u8>,
        logits: Out<f32>,
        want: InOpt<i32>,
        rows: U32,
        k: U32,
        vocab: U32,
        block_n: U32,
        block_k: U32,
    }
    grid(a) = gemv_config(a.vocab as u64, a.rows);
    LM_HEAD_FP8 = "gemv::lm_head_fp8" => twin lm_head_fp8, emit emit_lm_head;
}

kernel! {
    /// x bf16\[rows·k\], w an int4 blob \[vocab·k\] → logits f32\[rows·vocab\] (`want` as
    /// `lm_head`'s).
    pub struct LmHeadInt4 / LmHeadInt4Args {
        x: In<bf16>,
        w: In<u8>,
        logits: Out<f32>,
        want: InOpt<i32>,
        rows: U32,
        k: U32,
        vocab: U32,
        group: U32,
    }
    grid(a) = gemv_config(a.vocab as u64, a.rows);
    LM_HEAD_INT4 = "gemv::lm_head_int4" => twin lm_head_int4, emit emit_lm_head;
}

/// Each quantized entry: (entry, the kernel it serves, the format kind it reads).
pub const FORMAT_ENTRIES: &[(&str, &str, &str)] = &[
    (LINEAR_FP8.as_str(), super::LINEAR.as_str(), "fp8"),
    (LINEAR_INT4.as_str(), super::LINEAR.as_str(), "int4"),
    (LM_HEAD_FP8.as_str(), super::LM_HEAD.as_str(), "fp8"),
    (LM_HEAD_INT4.as_str(), super::LM_HEAD.as_str(), "int4"),
];

fn linear_quant(
    ctx: &TwinCtx<'_>,
    (rows, k, n): (usize, usize, usize),
    x: In<'_, bf16>,
    w: In<'_, u8>,
    bias: Option<&[bf16]>,
    y: &mut [bf16],
    format: WeightFormat,
) -> Result<(), GpuError> {
    let x = x.len(size(ctx, &[rows, k])?)?;
    let matrix = dequantised(ctx, w, format, n, k)?;
    project(ctx, x, rows, k, Proj::new(&matrix, bias, n), y);
    Ok(())
}

fn linear_fp8(a: LinearFp8Args<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    let format = WeightFormat::Fp8 {
        block_n: a.block_n.get(),
        block_k: a.block_k.get(),
    };
    let bias = a.bias.len(n)?;
    let y = a.y.len(size(ctx, &[rows, n])?)?;
    linear_quant(ctx, (rows, k, n), a.x, a.w, bias, y, format)
}

fn linear_int4(a: LinearInt4Args<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    let format = WeightFormat::Int4 {
        group: a.group.get(),
    };
    let bias = a.bias.len(n)?;
    let y = a.y.len(size(ctx, &[rows, n])?)?;
    linear_quant(ctx, (rows, k, n), a.x, a.w, bias, y, format)
}

/// `lm_head`'s twin on the dequantised matrix, for the rows `want` flags (no dequantising when
/// none is).
fn lm_head_quant(
    ctx: &TwinCtx<'_>,
    (rows, k, vocab): (usize, usize, usize),
    (x, w, want): (In<'_, bf16>, In<'_, u8>, InOpt<'_, i32>),
    out: &mut [f32],
    format: WeightFormat,
) -> Result<(), GpuError> {
    let x = x.len(size(ctx, &[rows, k])?)?;
    let want = want.len(rows)?;
    on_wanted_rows(want, (x, k), (out, vocab), rows, |x, rows, out| {
        let matrix = dequantised(ctx, w, format, vocab, k)?;
        logits(ctx, x, rows, k, &matrix, vocab, out);
        Ok(())
    })
}

fn lm_head_fp8(a: LmHeadFp8Args<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, vocab) = (a.rows.count(), a.k.dim()?, a.vocab.dim()?);
    let format = WeightFormat::Fp8 {
        block_n: a.block_n.get(),
        block_k: a.block_k.get(),
    };
    let out = a.logits.len(size(ctx, &[rows, vocab])?)?;
    lm_head_quant(ctx, (rows, k, vocab), (a.x, a.w, a.want), out, format)
}

fn lm_head_int4(a: LmHeadInt4Args<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, vocab) = (a.rows.count(), a.k.dim()?, a.vocab.dim()?);
    let format = WeightFormat::Int4 {
        group: a.group.get(),
    };
    let out = a.logits.len(size(ctx, &[rows, vocab])?)?;
    lm_head_quant(ctx, (rows, k, vocab), (a.x, a.w, a.want), out, format)
}

/// `linear`, or its entry for the weight's format (`linear_fp8`, `linear_int4`).
pub(super) fn emit_linear(v: &View<'_>) -> R {
    let l = v.op(OpKind::Linear, None)?;
    let (x, w, bias, y) = (
        v.input(l, 0)?,
        v.weight(l, 0)?,
        v.weight_opt(l, 1),
        v.output(l, 0)?,
    );
    let (rows, k, n_out) = (v.rows(), v.u32(l, "in")?, v.u32(l, "out")?);
    let launch = match v.weight_format(l, 0) {
        WeightFormat::Bf16 => {
            let scratch = None;
            launch(
                v,
                Linear {
                    x,
                    w,
                    bias,
                    y,
                    rows,
                    k,
                    n_out,
                    scratch,
                },
            )?
        }
        WeightFormat::Fp8 { block_n, block_k } => LinearFp8 {
            x,
            w,
            bias,
            y,
            rows,
            k,
            n_out,
            block_n,
            block_k,
        }
        .launch(LINEAR_FP8),
        WeightFormat::Int4 { group } => LinearInt4 {
            x,
            w,
            bias,
            y,
            rows,
            k,
            n_out,
            group,
        }
        .launch(LINEAR_INT4),
    };
    Ok(vec![launch])
}

pub(super) fn emit_lm_head(v: &View<'_>) -> R {
    // The LM head and an MoE router are the same f32-output projection.
    let (h, vocab) = match v.op(OpKind::LmHead, None) {
        Ok(h) => (h, v.u32(h, "vocab")?),
        Err(_) => {
            let r = v.op(OpKind::Router, None)?;
            (r, v.u32(r, "experts")?)
        }
    };
    let (x, w, logits) = (v.input(h, 0)?, v.weight(h, 0)?, v.output(h, 0)?);
    let (rows, k, want) = (v.rows(), v.u32(h, "hidden")?, v.want_logits(h));
    let launch = match v.weight_format(h, 0) {
        WeightFormat::Bf16 => {
            let scratch = None;
            launch(
                v,
                LmHead {
                    x,
                    w,
                    logits,
                    want,
                    rows,
                    k,
                    vocab,
                    scratch,
                },
            )?
        }
        WeightFormat::Fp8 { block_n, block_k } => {
            let args = LmHeadFp8 {
                x,
                w,
                logits,
                want,
                rows,
                k,
                vocab,
                block_n,
                block_k,
            };
            args.launch(LM_HEAD_FP8)
        }
        WeightFormat::Int4 { group } => LmHeadInt4 {
            x,
            w,
            logits,
            want,
            rows,
            k,
            vocab,
            group,
        }
        .launch(LM_HEAD_INT4),
    };
    Ok(vec![launch])
}
