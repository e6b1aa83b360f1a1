//! The fused tensor-core kernels' quantized entries: `qkv_mma_fp8`, `qkv_mma_int4`,
//! `gate_up_silu_mma_fp8`, `gate_up_silu_mma_int4`. Format entries of `gemm::qkv_mma` and
//! `gemm::gate_up_silu_mma`, as `quant`'s are of the single projections: the emitter launches
//! the entry for the weights' format.
//!
//! Every weight a launch reads is of one kind (the fuser gives a fused rule no chain that
//! mixes kinds), each with its own parameters: q's fp8 blocks need not be k's (a per-tensor
//! scale is one block of the whole matrix, and q's matrix is wider).
//!
//! Invariant: a twin here dequantises each matrix with `numerics::dequant` and runs the bf16
//! twin's arithmetic on it, so its bytes equal `qkv_mma`'s / `gate_up_silu_mma`'s on the
//! dequantised matrices, and those of the `linear_mma_fp8`/`_int4` launches it replaces.

use half::bf16;
use solder_circuit::WeightFormat;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::{emit_gate_up_silu_mma, emit_qkv_mma, gate_up_act, qkv_grid};
use crate::kernels::args::{dequantised, size, Dim, In, InOpt, Out};
use crate::kernels::decl::{kernel, Name};
use crate::kernels::gemm::linear_dots;

kernel! {
    /// `qkv_mma` on fp8 blobs wq \[nq·k\], wk and wv \[nkv·k\], each with its f32 scales of
    /// `block_n × block_k` blocks.
    pub struct QkvMmaFp8 / QkvMmaFp8Args {
        x: In<bf16>,
        wq: In<u8>,
        bq: InOpt<bf16>,
        wk: In<u8>,
        bk: InOpt<bf16>,
        wv: In<u8>,
        bv: InOpt<bf16>,
        q: Out<bf16>,
        k_out: Out<bf16>,
        v: Out<bf16>,
        rows: U32,
        k: U32,
        nq: U32,
        nkv: U32,
        q_block_n: U32,
        q_block_k: U32,
        k_block_n: U32,
        k_block_k: U32,
        v_block_n: U32,
        v_block_k: U32,
    }
    grid(a) = qkv_grid(a.nq, a.nkv, a.rows);
    QKV_MMA_FP8 = "gemm::qkv_mma_fp8" => twin qkv_mma_fp8, emit emit_qkv_mma;
}

kernel! {
    /// `qkv_mma` on int4 blobs wq \[nq·k\], wk and wv \[nkv·k\], each with its f32 scales and
    /// u8 zero points per `group`.
    pub struct QkvMmaInt4 / QkvMmaInt4Args {
        x: In<bf16>,
        wq: In<u8>,
        bq: InOpt<bf16>,
        wk: In<u8>,
        bk: InOpt<bf16>,
        wv: In<u8>,
        bv: InOpt<bf16>,
        q: Out<bf16>,
        k_out: Out<bf16>,
        v: Out<bf16>,
        rows: U32,
        k: U32,
        nq: U32,
        nkv: U32,
        q_group: U32,
        k_group: U32,
        v_group: U32,
    }
    grid(a) = qkv_grid(a.nq, a.nkv, a.rows);
    QKV_MMA_INT4 = "gemm::qkv_mma_int4" => twin qkv_mma_int4, emit emit_qkv_mma;
}

kernel! {
    /// `gate_up_silu_mma` on fp8 blobs wg and wu \[inter·k\], each with its f32 scales of
    /// `block_n × block_k` blocks.
    pub struct GateUpSiluMmaFp8 / GateUpSiluMmaFp8Args {
        x: In<bf16>,
        wg: In<u8>,
        wu: In<u8>,
        act: Out<bf16>,
        rows: U32,
        k: U32,
        inter: U32,
        g_block_n: U32,
        g_block_k: U32,
        u_block_n: U32,
        u_block_k: U32,
    }
    grid(a) = crate::kernels::gemm::gemm_grid(a.inter, a.rows);
    GATE_UP_SILU_MMA_FP8 = "gemm::gate_up_silu_mma_fp8" => twin gate_up_silu_mma_fp8, emit emit_gate_up_silu_mma;
}

kernel! {
    /// `gate_up_silu_mma` on int4 blobs wg and wu \[inter·k\], each with its f32 scales and u8
    /// zero points per `group`.
    pub struct GateUpSiluMmaInt4 / GateUpSiluMmaInt4Args {
        x: In<bf16>,
        wg: In<u8>,
        wu: In<u8>,
        act: Out<bf16>,
        rows: U32,
        k: U32,
        inter: U32,
        g_group: U32,
        u_group: U32,
    }
    grid(a) = crate::kernels::gemm::gemm_grid(a.inter, a.rows);
    GATE_UP_SILU_MMA_INT4 = "gemm::gate_up_silu_mma_int4" => twin gate_up_silu_mma_int4, emit emit_gate_up_silu_mma;
}

/// `qkv_mma_fp8` and `_int4` through gemm.cu's `gemm_large` (lever `mma_large`, prefill
/// widths): the same arguments, twins and bytes, in `gemm::large_grid_of` q's, k's and v's
/// features.
pub const QKV_MMA_FP8_LARGE: Name<QkvMmaFp8> = Name::new("gemm::qkv_mma_fp8_large");
pub const QKV_MMA_INT4_LARGE: Name<QkvMmaInt4> = Name::new("gemm::qkv_mma_int4_large");

/// Each quantized entry: (entry, the kernel it serves, the format kind it reads).
pub const FORMAT_ENTRIES: &[(&str, &str, &str)] = &[
    (QKV_MMA_FP8.as_str(), super::QKV_MMA.as_str(), "fp8"),
    (QKV_MMA_INT4.as_str(), super::QKV_MMA.as_str(), "int4"),
    (
        GATE_UP_SILU_MMA_FP8.as_str(),
        super::GATE_UP_SILU_MMA.as_str(),
        "fp8",
    ),
    (
        GATE_UP_SILU_MMA_INT4.as_str(),
        super::GATE_UP_SILU_MMA.as_str(),
        "int4",
    ),
];

/// The fp8 format of an entry's `block_n`, `block_k` arguments.
pub(super) fn fp8(block_n: Dim<'_>, block_k: Dim<'_>) -> WeightFormat {
    WeightFormat::Fp8 {
        block_n: block_n.get(),
        block_k: block_k.get(),
    }
}

/// The int4 format of an entry's `group` argument.
pub(super) fn int4(group: Dim<'_>) -> WeightFormat {
    WeightFormat::Int4 { group: group.get() }
}

/// One quantized projection of a `qkv` launch: its blob, format, bias, output and width.
type Projection<'a> = (
    In<'a, u8>,
    WeightFormat,
    InOpt<'a, bf16>,
    Out<'a, bf16>,
    Dim<'a>,
);

/// `qkv_mma`'s twin on the dequantised matrices: each projection's dots and stores as
/// `linear_mma_fp8`'s / `linear_mma_int4`'s.
fn qkv_quant(
    ctx: &TwinCtx<'_>,
    x: In<'_, bf16>,
    (rows, k): (usize, usize),
    projections: [Projection<'_>; 3],
) -> Result<(), GpuError> {
    let x = x.len(size(ctx, &[rows, k])?)?;
    for (w, format, bias, y, n) in projections {
        let n = n.dim()?;
        let matrix = dequantised(ctx, w, format, n, k)?;
        let bias = bias.len(n)?;
        let y = y.len(size(ctx, &[rows, n])?)?;
        linear_dots(ctx, x, &matrix, bias, [rows, k, n], y);
    }
    Ok(())
}

fn qkv_mma_fp8(a: QkvMmaFp8Args<'_>) -> Result<(), GpuError> {
    let (rows, k) = (a.rows.count(), a.k.dim()?);
    qkv_quant(
        a.ctx,
        a.x,
        (rows, k),
        [
            (a.wq, fp8(a.q_block_n, a.q_block_k), a.bq, a.q, a.nq),
            (a.wk, fp8(a.k_block_n, a.k_block_k), a.bk, a.k_out, a.nkv),
            (a.wv, fp8(a.v_block_n, a.v_block_k), a.bv, a.v, a.nkv),
        ],
    )
}

fn qkv_mma_int4(a: QkvMmaInt4Args<'_>) -> Result<(), GpuError> {
    let (rows, k) = (a.rows.count(), a.k.dim()?);
    qkv_quant(
        a.ctx,
        a.x,
        (rows, k),
        [
            (a.wq, int4(a.q_group), a.bq, a.q, a.nq),
            (a.wk, int4(a.k_group), a.bk, a.k_out, a.nkv),
            (a.wv, int4(a.v_group), a.bv, a.v, a.nkv),
        ],
    )
}

/// `gate_up_silu_mma`'s twin on the dequantised gate and up matrices.
fn gate_up_quant(
    ctx: &TwinCtx<'_>,
    (x, act): (In<'_, bf16>, Out<'_, bf16>),
    (rows, k, inter): (usize, usize, usize),
    (wg, wu): ((In<'_, u8>, WeightFormat), (In<'_, u8>, WeightFormat)),
) -> Result<(), GpuError> {
    let x = x.len(size(ctx, &[rows, k])?)?;
    let gate = dequantised(ctx, wg.0, wg.1, inter, k)?;
    let up = dequantised(ctx, wu.0, wu.1, inter, k)?;
    let act = act.len(size(ctx, &[rows, inter])?)?;
    gate_up_act(ctx, x, (&gate, &up), [rows, k, inter], act);
    Ok(())
}

fn gate_up_silu_mma_fp8(a: GateUpSiluMmaFp8Args<'_>) -> Result<(), GpuError> {
    let shape = (a.rows.count(), a.k.dim()?, a.inter.dim()?);
    gate_up_quant(
        a.ctx,
        (a.x, a.act),
        shape,
        (
            (a.wg, fp8(a.g_block_n, a.g_block_k)),
            (a.wu, fp8(a.u_block_n, a.u_block_k)),
        ),
    )
}

fn gate_up_silu_mma_int4(a: GateUpSiluMmaInt4Args<'_>) -> Result<(), GpuError> {
    let shape = (a.rows.count(), a.k.dim()?, a.inter.dim()?);
    gate_up_quant(
        a.ctx,
        (a.x, a.act),
        shape,
        ((a.wg, int4(a.g_group)), (a.wu, int4(a.u_group))),
    )
}
