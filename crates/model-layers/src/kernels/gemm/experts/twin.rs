//! The twins of the experts' tensor-core kernels, every weight format: each chosen expert's
//! matrices (dequantised to bf16 first when quantized, `moe::dequant_chosen`), then its picks'
//! dots in the `mma.sync` model's order (`gemm::each_dot`, `fused::gate_up_act`).

use half::bf16;
use solder_circuit::WeightFormat;
use solder_gpu_runtime::{GpuError, TwinCtx};

use super::super::each_dot;
use super::super::fused::gate_up_act;
use super::{
    ExpertsDownMmaArgs, ExpertsDownMmaFp8Args, ExpertsDownMmaInt4Args, ExpertsGateUpSiluMmaArgs,
    ExpertsGateUpSiluMmaFp8Args, ExpertsGateUpSiluMmaInt4Args,
};
use crate::kernels::args::{size, Dim, In, Out};
use crate::kernels::moe::{dequant_chosen, expert_ids};

/// Each expert with picks: the expert, its picks s (= r·k + j) in order, and the rows of
/// `src` (`width` elements each) they read, `row(s)`, gathered in that order.
fn by_expert<'a>(
    chosen: &'a [usize],
    experts: usize,
    (src, width): (&'a [bf16], usize),
    row: impl Fn(usize) -> usize + 'a,
) -> impl Iterator<Item = (usize, Vec<usize>, Vec<bf16>)> + 'a {
    (0..experts).filter_map(move |e| {
        let picks: Vec<usize> = (0..chosen.len()).filter(|&s| chosen[s] == e).collect();
        let xs: Vec<bf16> = picks
            .iter()
            .flat_map(|&s| &src[row(s) * width..(row(s) + 1) * width])
            .copied()
            .collect();
        (!picks.is_empty()).then_some((e, picks, xs))
    })
}

pub(super) fn experts_gate_up_silu_mma(a: ExpertsGateUpSiluMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, hidden, inter) = (a.rows.count(), a.hidden.dim()?, a.inter.dim()?);
    let (experts, k) = (a.experts.dim()?, a.k.dim()?);
    let x = a.x.len(size(ctx, &[rows, hidden])?)?;
    let ids = a.ids.len(size(ctx, &[rows, k])?)?;
    let matrix = size(ctx, &[inter, hidden])?;
    let wg = a.wg.len(size(ctx, &[experts, inter, hidden])?)?;
    let wu = a.wu.len(size(ctx, &[experts, inter, hidden])?)?;
    let act = a.act.len(size(ctx, &[rows, k, inter])?)?;
    let chosen = expert_ids(ctx, ids, k, experts)?;
    let weights = |e: usize| {
        (
            &wg[e * matrix..(e + 1) * matrix],
            &wu[e * matrix..(e + 1) * matrix],
        )
    };
    gate_up_picks(ctx, x, &chosen, [experts, hidden, inter, k], weights, act);
    Ok(())
}

/// Each expert's picks through `gate_up_act` against its (gate, up) matrices `weights(e)`,
/// into act `[rows·k][inter]`: the twin of the gate/up kernels whatever the weights' format.
fn gate_up_picks<'w>(
    ctx: &TwinCtx<'_>,
    x: &[bf16],
    chosen: &[usize],
    [experts, hidden, inter, k]: [usize; 4],
    weights: impl Fn(usize) -> (&'w [bf16], &'w [bf16]),
    act: &mut [bf16],
) {
    for (e, picks, xs) in by_expert(chosen, experts, (x, hidden), |s| s / k) {
        let mut rows_act = vec![bf16::ZERO; picks.len() * inter];
        gate_up_act(
            ctx,
            &xs,
            weights(e),
            [picks.len(), hidden, inter],
            &mut rows_act,
        );
        for (s, row) in picks.iter().zip(rows_act.chunks_exact(inter)) {
            act[s * inter..(s + 1) * inter].copy_from_slice(row);
        }
    }
}

pub(super) fn experts_down_mma(a: ExpertsDownMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, hidden, inter) = (a.rows.count(), a.hidden.dim()?, a.inter.dim()?);
    let (experts, k) = (a.experts.dim()?, a.k.dim()?);
    let act = a.act.len(size(ctx, &[rows, k, inter])?)?;
    let ids = a.ids.len(size(ctx, &[rows, k])?)?;
    let matrix = size(ctx, &[hidden, inter])?;
    let wd = a.wd.len(size(ctx, &[experts, hidden, inter])?)?;
    let dots = a.dots.len(size(ctx, &[rows, k, hidden])?)?;
    let chosen = expert_ids(ctx, ids, k, experts)?;
    let weights = |e: usize| &wd[e * matrix..(e + 1) * matrix];
    down_picks(ctx, act, &chosen, [experts, hidden, inter], weights, dots);
    Ok(())
}

/// Each expert's picks' dots against its down matrix `weights(e)`, into dots
/// `[rows·k][hidden]`: the twin of the down kernels whatever the weights' format.
fn down_picks<'w>(
    ctx: &TwinCtx<'_>,
    act: &[bf16],
    chosen: &[usize],
    [experts, hidden, inter]: [usize; 3],
    weights: impl Fn(usize) -> &'w [bf16],
    dots: &mut [f32],
) {
    for (e, picks, xs) in by_expert(chosen, experts, (act, inter), |s| s) {
        let mut rows_dots = vec![0.0f32; picks.len() * hidden];
        each_dot(
            ctx,
            &xs,
            weights(e),
            [picks.len(), inter, hidden],
            |_, d| d,
            &mut rows_dots,
        );
        for (s, row) in picks.iter().zip(rows_dots.chunks_exact(hidden)) {
            dots[s * hidden..(s + 1) * hidden].copy_from_slice(row);
        }
    }
}

/// The dims every experts kernel takes: rows, hidden, inter, experts, k.
type ExpertDims<'a> = [Dim<'a>; 5];

/// The gate/up twin on quantized experts: each chosen expert's gate and up matrices
/// dequantised, then `experts_gate_up_silu_mma`'s arithmetic.
fn gate_up_quant(
    ctx: &TwinCtx<'_>,
    format: WeightFormat,
    (x, ids, wg, wu): (In<'_, bf16>, In<'_, i32>, In<'_, u32>, In<'_, u32>),
    act: Out<'_, bf16>,
    dims: ExpertDims<'_>,
) -> Result<(), GpuError> {
    let [rows, hidden, inter, experts, k] = dims;
    let (rows, hidden, inter) = (rows.count(), hidden.dim()?, inter.dim()?);
    let (experts, k) = (experts.dim()?, k.dim()?);
    let x = x.len(size(ctx, &[rows, hidden])?)?;
    let ids = ids.len(size(ctx, &[rows, k])?)?;
    let chosen = expert_ids(ctx, ids, k, experts)?;
    let g = dequant_chosen(wg, format, [experts, inter, hidden], &chosen)?;
    let u = dequant_chosen(wu, format, [experts, inter, hidden], &chosen)?;
    let act = act.len(size(ctx, &[rows, k, inter])?)?;
    let weights = |e: usize| (g[e].as_slice(), u[e].as_slice());
    gate_up_picks(ctx, x, &chosen, [experts, hidden, inter, k], weights, act);
    Ok(())
}

pub(super) fn experts_gate_up_silu_mma_fp8(
    a: ExpertsGateUpSiluMmaFp8Args<'_>,
) -> Result<(), GpuError> {
    let format = WeightFormat::Fp8 {
        block_n: a.block_n.get(),
        block_k: a.block_k.get(),
    };
    let dims = [a.rows, a.hidden, a.inter, a.experts, a.k];
    gate_up_quant(a.ctx, format, (a.x, a.ids, a.wg, a.wu), a.act, dims)
}

pub(super) fn experts_gate_up_silu_mma_int4(
    a: ExpertsGateUpSiluMmaInt4Args<'_>,
) -> Result<(), GpuError> {
    let format = WeightFormat::Int4 {
        group: a.group.get(),
    };
    let dims = [a.rows, a.hidden, a.inter, a.experts, a.k];
    gate_up_quant(a.ctx, format, (a.x, a.ids, a.wg, a.wu), a.act, dims)
}

/// The down twin on quantized experts: each chosen expert's matrix dequantised, then
/// `experts_down_mma`'s arithmetic.
fn down_quant(
    ctx: &TwinCtx<'_>,
    format: WeightFormat,
    (act, ids, wd): (In<'_, bf16>, In<'_, i32>, In<'_, u32>),
    dots: Out<'_, f32>,
    dims: ExpertDims<'_>,
) -> Result<(), GpuError> {
    let [rows, hidden, inter, experts, k] = dims;
    let (rows, hidden, inter) = (rows.count(), hidden.dim()?, inter.dim()?);
    let (experts, k) = (experts.dim()?, k.dim()?);
    let act = act.len(size(ctx, &[rows, k, inter])?)?;
    let ids = ids.len(size(ctx, &[rows, k])?)?;
    let chosen = expert_ids(ctx, ids, k, experts)?;
    let m = dequant_chosen(wd, format, [experts, hidden, inter], &chosen)?;
    let dots = dots.len(size(ctx, &[rows, k, hidden])?)?;
    down_picks(
        ctx,
        act,
        &chosen,
        [experts, hidden, inter],
        |e| m[e].as_slice(),
        dots,
    );
    Ok(())
}

pub(super) fn experts_down_mma_fp8(a: ExpertsDownMmaFp8Args<'_>) -> Result<(), GpuError> {
    let format = WeightFormat::Fp8 {
        block_n: a.block_n.get(),
        block_k: a.block_k.get(),
    };
    let dims = [a.rows, a.hidden, a.inter, a.experts, a.k];
    down_quant(a.ctx, format, (a.act, a.ids, a.wd), a.dots, dims)
}

pub(super) fn experts_down_mma_int4(a: ExpertsDownMmaInt4Args<'_>) -> Result<(), GpuError> {
    let format = WeightFormat::Int4 {
        group: a.group.get(),
    };
    let dims = [a.rows, a.hidden, a.inter, a.experts, a.k];
    down_quant(a.ctx, format, (a.act, a.ids, a.wd), a.dots, dims)
}
