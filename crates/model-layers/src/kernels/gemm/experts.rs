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

use half::bf16;
use solder_circuit::OpKind;
use solder_gpu_runtime::{GpuError, LaunchConfig};

use super::fused::gate_up_act;
use super::{bf16_only, GEMM_FEATURES, GEMM_THREADS};
use crate::kernels::args::size;
use crate::kernels::decl::kernel;
use crate::kernels::emit_view::{View, R};
use crate::kernels::moe::{expert_dims, expert_ids};

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
    for e in 0..experts {
        let picks: Vec<usize> = (0..chosen.len()).filter(|&s| chosen[s] == e).collect();
        if picks.is_empty() {
            continue;
        }
        let xs: Vec<bf16> = picks
            .iter()
            .flat_map(|s| &x[(s / k) * hidden..(s / k + 1) * hidden])
            .copied()
            .collect();
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
