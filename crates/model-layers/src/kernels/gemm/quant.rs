//! The tensor-core entries that read a quantized weight (`solder_circuit::format`):
//! `linear_mma_fp8`, `linear_mma_int4`, `lm_head_mma_fp8`, `lm_head_mma_int4`. Format entries
//! of `gemm::linear_mma` and `gemm::lm_head_mma`, as gemv's are of its kernels: the emitter
//! launches the entry for the slot's format, and rules name only the kernel (with the formats
//! it reads).
//!
//! Each CUDA entry dequantises a weight tile chunk by chunk on its way to shared memory
//! (`gemm.cu`'s `GemmQuant`), so the tile holds the dequantised bf16 matrix and the `mma.sync`
//! sequence is the bf16 kernel's.
//!
//! Invariant: a twin here dequantises the matrix with `numerics::dequant` (the one definition
//! of a quantized weight's bf16 value) and runs the bf16 twin's `each_dot` on it, so its bytes
//! equal `linear_mma`'s / `lm_head_mma`'s on the dequantised matrix.

use half::bf16;
use solder_circuit::WeightFormat;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::{each_dot, emit_linear_mma, emit_lm_head_mma, gemm_grid, linear_dots};
use crate::kernels::args::{dequantised, size, In, InOpt};
use crate::kernels::decl::{kernel, Name};
use crate::kernels::want::on_wanted_rows;

kernel! {
    /// x bf16\[rows·k\], w an fp8 blob \[n_out·k\] (f32 scales of `block_n × block_k` blocks),
    /// bias bf16\[n_out\]? → y bf16\[rows·n_out\], on the tensor cores.
    pub struct LinearMmaFp8 / LinearMmaFp8Args {
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
    grid(a) = gemm_grid(a.n_out, a.rows);
    LINEAR_MMA_FP8 = "gemm::linear_mma_fp8" => twin linear_mma_fp8, emit emit_linear_mma;
}

kernel! {
    /// x bf16\[rows·k\], w an int4 blob \[n_out·k\] (f32 scales and u8 zero points per
    /// `group`), bias bf16\[n_out\]? → y bf16\[rows·n_out\], on the tensor cores.
    pub struct LinearMmaInt4 / LinearMmaInt4Args {
        x: In<bf16>,
        w: In<u8>,
        bias: InOpt<bf16>,
        y: Out<bf16>,
        rows: U32,
        k: U32,
        n_out: U32,
        group: U32,
    }
    grid(a) = gemm_grid(a.n_out, a.rows);
    LINEAR_MMA_INT4 = "gemm::linear_mma_int4" => twin linear_mma_int4, emit emit_linear_mma;
}

kernel! {
    /// x bf16\[rows·k\], w an fp8 blob \[vocab·k\] → logits f32\[rows·vocab\], on the tensor
    /// cores (`want` as `lm_head_mma`'s).
    pub struct LmHeadMmaFp8 / LmHeadMmaFp8Args {
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
    grid(a) = gemm_grid(a.vocab, a.rows);
    LM_HEAD_MMA_FP8 = "gemm::lm_head_mma_fp8" => twin lm_head_mma_fp8, emit emit_lm_head_mma;
}

kernel! {
    /// x bf16\[rows·k\], w an int4 blob \[vocab·k\] → logits f32\[rows·vocab\], on the tensor
    /// cores (`want` as `lm_head_mma`'s).
    pub struct LmHeadMmaInt4 / LmHeadMmaInt4Args {
        x: In<bf16>,
        w: In<u8>,
        logits: Out<f32>,
        want: InOpt<i32>,
        rows: U32,
        k: U32,
        vocab: U32,
        group: U32,
    }
    grid(a) = gemm_grid(a.vocab, a.rows);
    LM_HEAD_MMA_INT4 = "gemm::lm_head_mma_int4" => twin lm_head_mma_int4, emit emit_lm_head_mma;
}

/// The four entries through gemm.cu's `gemm_narrow` (lever `mma_narrow`, decode widths; a
/// stage of 128 k, dequantised as it is fetched): the same arguments, grid, twin and bytes.
pub const LINEAR_MMA_FP8_NARROW: Name<LinearMmaFp8> = Name::new("gemm::linear_mma_fp8_narrow");
pub const LINEAR_MMA_INT4_NARROW: Name<LinearMmaInt4> = Name::new("gemm::linear_mma_int4_narrow");
pub const LM_HEAD_MMA_FP8_NARROW: Name<LmHeadMmaFp8> = Name::new("gemm::lm_head_mma_fp8_narrow");
pub const LM_HEAD_MMA_INT4_NARROW: Name<LmHeadMmaInt4> = Name::new("gemm::lm_head_mma_int4_narrow");

/// The four entries through gemm.cu's `gemm_large` (lever `mma_large`, prefill widths; each
/// 128-row block dequantises a weight tile once): the same arguments, twin and bytes, in
/// `gemm::large_grid`.
pub const LINEAR_MMA_FP8_LARGE: Name<LinearMmaFp8> = Name::new("gemm::linear_mma_fp8_large");
pub const LINEAR_MMA_INT4_LARGE: Name<LinearMmaInt4> = Name::new("gemm::linear_mma_int4_large");
pub const LM_HEAD_MMA_FP8_LARGE: Name<LmHeadMmaFp8> = Name::new("gemm::lm_head_mma_fp8_large");
pub const LM_HEAD_MMA_INT4_LARGE: Name<LmHeadMmaInt4> = Name::new("gemm::lm_head_mma_int4_large");

/// The `_narrow` entries, with the quantized entry each is a variant of.
pub const NARROW_VARIANTS: [(&str, &str); 4] = [
    (LINEAR_MMA_FP8_NARROW.as_str(), LINEAR_MMA_FP8.as_str()),
    (LINEAR_MMA_INT4_NARROW.as_str(), LINEAR_MMA_INT4.as_str()),
    (LM_HEAD_MMA_FP8_NARROW.as_str(), LM_HEAD_MMA_FP8.as_str()),
    (LM_HEAD_MMA_INT4_NARROW.as_str(), LM_HEAD_MMA_INT4.as_str()),
];

/// Each quantized entry: (entry, the kernel it serves, the format kind it reads).
pub const FORMAT_ENTRIES: &[(&str, &str, &str)] = &[
    (LINEAR_MMA_FP8.as_str(), super::LINEAR_MMA.as_str(), "fp8"),
    (LINEAR_MMA_INT4.as_str(), super::LINEAR_MMA.as_str(), "int4"),
    (LM_HEAD_MMA_FP8.as_str(), super::LM_HEAD_MMA.as_str(), "fp8"),
    (
        LM_HEAD_MMA_INT4.as_str(),
        super::LM_HEAD_MMA.as_str(),
        "int4",
    ),
];

/// `linear_mma`'s twin on the dequantised matrix.
fn linear_quant(
    ctx: &TwinCtx<'_>,
    (rows, k, n): (usize, usize, usize),
    (x, w): (In<'_, bf16>, In<'_, u8>),
    bias: Option<&[bf16]>,
    y: &mut [bf16],
    format: WeightFormat,
) -> Result<(), GpuError> {
    let x = x.len(size(ctx, &[rows, k])?)?;
    let matrix = dequantised(ctx, w, format, n, k)?;
    linear_dots(ctx, x, &matrix, bias, [rows, k, n], y);
    Ok(())
}

fn linear_mma_fp8(a: LinearMmaFp8Args<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    let format = WeightFormat::Fp8 {
        block_n: a.block_n.get(),
        block_k: a.block_k.get(),
    };
    let bias = a.bias.len(n)?;
    let y = a.y.len(size(ctx, &[rows, n])?)?;
    linear_quant(ctx, (rows, k, n), (a.x, a.w), bias, y, format)
}

fn linear_mma_int4(a: LinearMmaInt4Args<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    let format = WeightFormat::Int4 {
        group: a.group.get(),
    };
    let bias = a.bias.len(n)?;
    let y = a.y.len(size(ctx, &[rows, n])?)?;
    linear_quant(ctx, (rows, k, n), (a.x, a.w), bias, y, format)
}

/// `lm_head_mma`'s twin on the dequantised matrix, for the rows `want` flags (no dequantising
/// when none is).
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
        each_dot(ctx, x, &matrix, [rows, k, vocab], |_, d| d, out);
        Ok(())
    })
}

fn lm_head_mma_fp8(a: LmHeadMmaFp8Args<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, vocab) = (a.rows.count(), a.k.dim()?, a.vocab.dim()?);
    let format = WeightFormat::Fp8 {
        block_n: a.block_n.get(),
        block_k: a.block_k.get(),
    };
    let out = a.logits.len(size(ctx, &[rows, vocab])?)?;
    lm_head_quant(ctx, (rows, k, vocab), (a.x, a.w, a.want), out, format)
}

fn lm_head_mma_int4(a: LmHeadMmaInt4Args<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, vocab) = (a.rows.count(), a.k.dim()?, a.vocab.dim()?);
    let format = WeightFormat::Int4 {
        group: a.group.get(),
    };
    let out = a.logits.len(size(ctx, &[rows, vocab])?)?;
    lm_head_quant(ctx, (rows, k, vocab), (a.x, a.w, a.want), out, format)
}
