//! The routed experts' gate and up projections on the tensor cores, grouped by expert
//! (`gemm::experts_gate_up_silu_mma`): each block gathers one expert's picks, 64 at a time,
//! against one 32-feature tile of its gate and up matrices, in place of `moe::gate_up_silu`'s
//! one warp per (pick, feature).
//!
//! Numerics: every pick's gate and up dots are `linear_mma`'s on its expert's matrices (the
//! same `mma.sync` sequence whatever tile the pick lands in), stored bf16, then
//! `act::silu_mul`'s arithmetic: `gemm::gate_up_silu_mma`'s bytes for that expert. So `differs`
//! against `moe::gate_up_silu`'s segmented dots, like every rule of the `tensor_cores` lever.
//! Layout and picks as `moe` (weights `[experts][inter][hidden]`, act `[rows·k][inter]`).
//!
//! The down projections (`gemm::experts_down_mma`, then `moe::down_combine`): each pick's dots
//! against its expert's `[hidden][inter]` matrix, `linear_mma`'s, into the workspace's f32
//! region (`Layout::moe_scratch_offset`), then each row's sum over its picks in order, as
//! `moe::down` sums them: `differs` against `moe::down` by the dots alone.

use half::bf16;
use solder_circuit::OpKind;
use solder_gpu_runtime::{GpuError, LaunchConfig};

use super::fused::gate_up_act;
use super::{bf16_only, each_dot, GEMM_FEATURES, GEMM_THREADS};
use crate::kernels::args::size;
use crate::kernels::decl::kernel;
use crate::kernels::emit_view::{View, R};
use crate::kernels::moe::{expert_dims, expert_ids, DownCombine, DOWN_COMBINE};

kernel! {
    /// For each row and pick j (expert ids\[r·k + j\]): act bf16\[(r·k + j)·inter ..\] =
    /// silu(x_r · wg\[e\]ᵀ) · (x_r · wu\[e\]ᵀ) on the tensor cores, picks grouped by expert.
    pub struct ExpertsGateUpSiluMma / ExpertsGateUpSiluMmaArgs {
        x: In<bf16>,
        ids: In<i32>,
        wg: In<bf16>,
        wu: In<bf16>,
        act: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
    }
    grid(a) = experts_grid(a.inter, a.experts);
    EXPERTS_GATE_UP_SILU_MMA = "gemm::experts_gate_up_silu_mma" =>
        twin experts_gate_up_silu_mma, emit emit_experts_gate_up_silu_mma;
}

kernel! {
    /// For each row and pick s = r·k + j (expert ids\[s\]): dots f32\[s·hidden + f\] = act_s ·
    /// wd\[e\]\[f\] on the tensor cores, picks grouped by expert.
    pub struct ExpertsDownMma / ExpertsDownMmaArgs {
        act: In<bf16>,
        ids: In<i32>,
        wd: In<bf16>,
        dots: Out<f32>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
    }
    grid(a) = experts_grid(a.hidden, a.experts);
    EXPERTS_DOWN_MMA = "gemm::experts_down_mma" => twin experts_down_mma, emit emit_experts_down_mma;
}

/// The kernel whose plans need the experts' down-dots region.
pub const DOWN_KERNELS: [&str; 1] = [EXPERTS_DOWN_MMA.as_str()];

/// One block per (32-feature tile, expert).
pub fn experts_grid(inter: u32, experts: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [
            inter.div_ceil(GEMM_FEATURES).max(1),
            experts.clamp(1, 65_535),
            1,
        ],
        block: [GEMM_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

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

fn experts_gate_up_silu_mma(a: ExpertsGateUpSiluMmaArgs<'_>) -> Result<(), GpuError> {
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
    for (e, picks, xs) in by_expert(&chosen, experts, (x, hidden), |s| s / k) {
        let weights = (
            &wg[e * matrix..(e + 1) * matrix],
            &wu[e * matrix..(e + 1) * matrix],
        );
        let mut rows_act = vec![bf16::ZERO; picks.len() * inter];
        gate_up_act(
            ctx,
            &xs,
            weights,
            [picks.len(), hidden, inter],
            &mut rows_act,
        );
        for (s, row) in picks.iter().zip(rows_act.chunks_exact(inter)) {
            act[s * inter..(s + 1) * inter].copy_from_slice(row);
        }
    }
    Ok(())
}

fn emit_experts_gate_up_silu_mma(v: &View<'_>) -> R {
    bf16_only(v, EXPERTS_GATE_UP_SILU_MMA.as_str())?;
    let g = v.op(OpKind::MoeGateUp, None)?;
    let (hidden, inter, experts, k) = expert_dims(v, g)?;
    Ok(vec![ExpertsGateUpSiluMma {
        x: v.input(g, 0)?,
        ids: v.input(g, 1)?,
        wg: v.weight(g, 0)?,
        wu: v.weight(g, 1)?,
        act: v.output(g, 0)?,
        rows: v.rows(),
        hidden,
        inter,
        experts,
        k,
    }
    .launch(EXPERTS_GATE_UP_SILU_MMA)])
}

fn experts_down_mma(a: ExpertsDownMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, hidden, inter) = (a.rows.count(), a.hidden.dim()?, a.inter.dim()?);
    let (experts, k) = (a.experts.dim()?, a.k.dim()?);
    let act = a.act.len(size(ctx, &[rows, k, inter])?)?;
    let ids = a.ids.len(size(ctx, &[rows, k])?)?;
    let matrix = size(ctx, &[hidden, inter])?;
    let wd = a.wd.len(size(ctx, &[experts, hidden, inter])?)?;
    let dots = a.dots.len(size(ctx, &[rows, k, hidden])?)?;
    let chosen = expert_ids(ctx, ids, k, experts)?;
    for (e, picks, xs) in by_expert(&chosen, experts, (act, inter), |s| s) {
        let mut rows_dots = vec![0.0f32; picks.len() * hidden];
        each_dot(
            ctx,
            &xs,
            &wd[e * matrix..(e + 1) * matrix],
            [picks.len(), inter, hidden],
            |_, d| d,
            &mut rows_dots,
        );
        for (s, row) in picks.iter().zip(rows_dots.chunks_exact(hidden)) {
            dots[s * hidden..(s + 1) * hidden].copy_from_slice(row);
        }
    }
    Ok(())
}

/// The picks' dots into the workspace's region, then `moe::down_combine`.
fn emit_experts_down_mma(v: &View<'_>) -> R {
    bf16_only(v, EXPERTS_DOWN_MMA.as_str())?;
    let d = v.op(OpKind::MoeDown, None)?;
    let (hidden, inter, experts, k) = expert_dims(v, d)?;
    let rows = v.rows();
    let dots = v.moe_scratch(down_scratch_bytes(
        rows as usize,
        k as usize,
        hidden as usize,
    ))?;
    let ids = v.input(d, 1)?;
    Ok(vec![
        ExpertsDownMma {
            act: v.input(d, 0)?,
            ids,
            wd: v.weight(d, 0)?,
            dots,
            rows,
            hidden,
            inter,
            experts,
            k,
        }
        .launch(EXPERTS_DOWN_MMA),
        DownCombine {
            dots,
            ids,
            weights: v.input(d, 2)?,
            out: v.output(d, 0)?,
            rows,
            hidden,
            experts,
            k,
        }
        .launch(DOWN_COMBINE),
    ])
}

/// Bytes of the experts' down dots for `rows` rows of `k` picks and `hidden` features.
pub fn down_scratch_bytes(rows: usize, k: usize, hidden: usize) -> usize {
    rows.saturating_mul(k)
        .saturating_mul(hidden)
        .saturating_mul(4)
}
