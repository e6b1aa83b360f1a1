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

mod twin;

use half::bf16;
use solder_circuit::{OpKind, WeightFormat};
use solder_gpu_runtime::LaunchConfig;

use super::{GEMM_FEATURES, GEMM_THREADS};
use crate::kernels::decl::kernel;
use crate::kernels::emit_view::{View, R};
use crate::kernels::moe::{expert_dims, expert_format, DownCombine, DOWN_COMBINE};
use twin::{
    experts_down_mma, experts_down_mma_fp8, experts_down_mma_int4, experts_gate_up_silu_mma,
    experts_gate_up_silu_mma_fp8, experts_gate_up_silu_mma_int4,
};

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

kernel! {
    /// `experts_gate_up_silu_mma` on fp8 experts: wg, wu the stacked blobs (32-bit words) of
    /// `[experts]\[inter\]\[hidden\]` in `Fp8 { block_n, block_k }`.
    pub struct ExpertsGateUpSiluMmaFp8 / ExpertsGateUpSiluMmaFp8Args {
        x: In<bf16>,
        ids: In<i32>,
        wg: In<u32>,
        wu: In<u32>,
        act: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
        block_n: U32,
        block_k: U32,
    }
    grid(a) = experts_grid(a.inter, a.experts);
    EXPERTS_GATE_UP_SILU_MMA_FP8 = "gemm::experts_gate_up_silu_mma_fp8" =>
        twin experts_gate_up_silu_mma_fp8, emit emit_experts_gate_up_silu_mma;
}

kernel! {
    /// `experts_gate_up_silu_mma` on int4 experts (`Int4 { group }`, hidden even).
    pub struct ExpertsGateUpSiluMmaInt4 / ExpertsGateUpSiluMmaInt4Args {
        x: In<bf16>,
        ids: In<i32>,
        wg: In<u32>,
        wu: In<u32>,
        act: Out<bf16>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
        group: U32,
    }
    grid(a) = experts_grid(a.inter, a.experts);
    EXPERTS_GATE_UP_SILU_MMA_INT4 = "gemm::experts_gate_up_silu_mma_int4" =>
        twin experts_gate_up_silu_mma_int4, emit emit_experts_gate_up_silu_mma;
}

kernel! {
    /// `experts_down_mma` on fp8 experts: wd the stacked blob (32-bit words) of
    /// `[experts]\[hidden\]\[inter\]` in `Fp8 { block_n, block_k }`.
    pub struct ExpertsDownMmaFp8 / ExpertsDownMmaFp8Args {
        act: In<bf16>,
        ids: In<i32>,
        wd: In<u32>,
        dots: Out<f32>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
        block_n: U32,
        block_k: U32,
    }
    grid(a) = experts_grid(a.hidden, a.experts);
    EXPERTS_DOWN_MMA_FP8 = "gemm::experts_down_mma_fp8" =>
        twin experts_down_mma_fp8, emit emit_experts_down_mma;
}

kernel! {
    /// `experts_down_mma` on int4 experts (`Int4 { group }`, inter even).
    pub struct ExpertsDownMmaInt4 / ExpertsDownMmaInt4Args {
        act: In<bf16>,
        ids: In<i32>,
        wd: In<u32>,
        dots: Out<f32>,
        rows: U32,
        hidden: U32,
        inter: U32,
        experts: U32,
        k: U32,
        group: U32,
    }
    grid(a) = experts_grid(a.hidden, a.experts);
    EXPERTS_DOWN_MMA_INT4 = "gemm::experts_down_mma_int4" =>
        twin experts_down_mma_int4, emit emit_experts_down_mma;
}

/// The experts kernels' quantized entries: (entry, the kernel it serves, the format kind).
pub const FORMAT_ENTRIES: &[(&str, &str, &str)] = &[
    (
        EXPERTS_GATE_UP_SILU_MMA_FP8.as_str(),
        EXPERTS_GATE_UP_SILU_MMA.as_str(),
        "fp8",
    ),
    (
        EXPERTS_GATE_UP_SILU_MMA_INT4.as_str(),
        EXPERTS_GATE_UP_SILU_MMA.as_str(),
        "int4",
    ),
    (
        EXPERTS_DOWN_MMA_FP8.as_str(),
        EXPERTS_DOWN_MMA.as_str(),
        "fp8",
    ),
    (
        EXPERTS_DOWN_MMA_INT4.as_str(),
        EXPERTS_DOWN_MMA.as_str(),
        "int4",
    ),
];

/// The formats the experts kernels read (one entry each).
const FORMATS: &[&str] = &["bf16", "fp8", "int4"];

/// The kernel (and its entries) whose plans need the experts' down-dots region.
pub const DOWN_KERNELS: [&str; 3] = [
    EXPERTS_DOWN_MMA.as_str(),
    EXPERTS_DOWN_MMA_FP8.as_str(),
    EXPERTS_DOWN_MMA_INT4.as_str(),
];

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

/// `experts_gate_up_silu_mma`, or its entry for the experts' format.
fn emit_experts_gate_up_silu_mma(v: &View<'_>) -> R {
    let g = v.op(OpKind::MoeGateUp, None)?;
    let (hidden, inter, experts, k) = expert_dims(v, g)?;
    let kernel = EXPERTS_GATE_UP_SILU_MMA.as_str();
    let format = expert_format(v, g, &[0, 1], kernel, FORMATS)?;
    let (x, ids, wg, wu) = (
        v.input(g, 0)?,
        v.input(g, 1)?,
        v.weight(g, 0)?,
        v.weight(g, 1)?,
    );
    let (act, rows) = (v.output(g, 0)?, v.rows());
    let launch = match format {
        WeightFormat::Bf16 => ExpertsGateUpSiluMma {
            x,
            ids,
            wg,
            wu,
            act,
            rows,
            hidden,
            inter,
            experts,
            k,
        }
        .launch(EXPERTS_GATE_UP_SILU_MMA),
        WeightFormat::Fp8 { block_n, block_k } => ExpertsGateUpSiluMmaFp8 {
            x,
            ids,
            wg,
            wu,
            act,
            rows,
            hidden,
            inter,
            experts,
            k,
            block_n,
            block_k,
        }
        .launch(EXPERTS_GATE_UP_SILU_MMA_FP8),
        WeightFormat::Int4 { group } => ExpertsGateUpSiluMmaInt4 {
            x,
            ids,
            wg,
            wu,
            act,
            rows,
            hidden,
            inter,
            experts,
            k,
            group,
        }
        .launch(EXPERTS_GATE_UP_SILU_MMA_INT4),
    };
    Ok(vec![launch])
}

/// The picks' dots into the workspace's region (`experts_down_mma` or its entry for the
/// experts' format), then `moe::down_combine`.
fn emit_experts_down_mma(v: &View<'_>) -> R {
    let d = v.op(OpKind::MoeDown, None)?;
    let (hidden, inter, experts, k) = expert_dims(v, d)?;
    let format = expert_format(v, d, &[0], EXPERTS_DOWN_MMA.as_str(), FORMATS)?;
    let rows = v.rows();
    let dots = v.moe_scratch(down_scratch_bytes(
        rows as usize,
        k as usize,
        hidden as usize,
    ))?;
    let (act, ids, wd) = (v.input(d, 0)?, v.input(d, 1)?, v.weight(d, 0)?);
    let down = match format {
        WeightFormat::Bf16 => ExpertsDownMma {
            act,
            ids,
            wd,
            dots,
            rows,
            hidden,
            inter,
            experts,
            k,
        }
        .launch(EXPERTS_DOWN_MMA),
        WeightFormat::Fp8 { block_n, block_k } => ExpertsDownMmaFp8 {
            act,
            ids,
            wd,
            dots,
            rows,
            hidden,
            inter,
            experts,
            k,
            block_n,
            block_k,
        }
        .launch(EXPERTS_DOWN_MMA_FP8),
        WeightFormat::Int4 { group } => ExpertsDownMmaInt4 {
            act,
            ids,
            wd,
            dots,
            rows,
            hidden,
            inter,
            experts,
            k,
            group,
        }
        .launch(EXPERTS_DOWN_MMA_INT4),
    };
    Ok(vec![
        down,
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
