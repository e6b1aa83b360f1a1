//! `moe` module: Mixture-of-Experts routing (softmax → top-k, optionally fused with the router
//! projection) and the routed expert MLP (gate·up·SiLU, then down with the weighted sum).
//!
//! Expert weights are stacked row-major: gate and up `[experts][inter][hidden]`, down
//! `[experts][hidden][inter]`. Picks are `ids i32[rows·k]` and `weights f32[rows·k]`.
//!
//! Grid: routing runs one block of 256 threads per row and keeps the row's probabilities in
//! dynamic shared memory; the expert projections run blocks of 256 threads (one warp per
//! output feature) over (pick, 8 output features) for gate·up and (row, 8 output features)
//! for down, whose warp sums its row's picks in order. Picks and rows are `grid.x` (no 65535
//! limit); feature tiles past 65535 are walked grid-stride by the kernels.

use solder_gpu_runtime::LaunchConfig;

use super::{Args, Buf, Launch};

/// Threads of a routing block (one row).
const ROUTE_THREADS: u32 = 256;

/// Output features per expert-projection block (as in `gemv`).
const FEATURES_PER_BLOCK: u32 = 8;

fn route_config(rows: u32, experts: u32) -> LaunchConfig {
    LaunchConfig {
        shared_bytes: experts.saturating_mul(4),
        ..LaunchConfig::linear(rows, ROUTE_THREADS)
    }
}

/// Blocks over (`slices`, 8-feature tiles); grid.y is capped at CUDA's 65535 (the kernels
/// walk further tiles grid-stride).
fn expert_config(features: u32, slices: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [
            slices.max(1),
            features.div_ceil(FEATURES_PER_BLOCK).clamp(1, 65_535),
            1,
        ],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

/// logits f32[rows·experts] → softmax → the `k` largest probabilities per row (descending,
/// ties to the lower expert id): ids i32[rows·k], weights f32[rows·k], renormalised to sum 1
/// when `norm_topk` != 0.
pub fn topk_softmax(
    logits: Buf,
    ids: Buf,
    weights: Buf,
    rows: u32,
    experts: u32,
    k: u32,
    norm_topk: u32,
) -> Launch {
    Args::new()
        .read(logits)
        .write(ids)
        .write(weights)
        .u32(rows)
        .u32(experts)
        .u32(k)
        .u32(norm_topk)
        .launch("moe::topk_softmax", route_config(rows, experts))
}

/// The router projection of x bf16[rows·hidden] (w bf16[experts·hidden], f32 logits kept
/// on chip) then `topk_softmax`.
#[allow(clippy::too_many_arguments)]
pub fn router_topk(
    x: Buf,
    w: Buf,
    ids: Buf,
    weights: Buf,
    rows: u32,
    hidden: u32,
    experts: u32,
    k: u32,
    norm_topk: u32,
) -> Launch {
    Args::new()
        .read(x)
        .read(w)
        .write(ids)
        .write(weights)
        .u32(rows)
        .u32(hidden)
        .u32(experts)
        .u32(k)
        .u32(norm_topk)
        .launch("moe::router_topk", route_config(rows, experts))
}

/// For each row and pick j (expert ids[r·k + j]): act bf16[(r·k + j)·inter ..] =
/// silu(x_r · wg[e]ᵀ) · (x_r · wu[e]ᵀ), each projection stored bf16 first.
#[allow(clippy::too_many_arguments)]
pub fn gate_up_silu(
    x: Buf,
    ids: Buf,
    wg: Buf,
    wu: Buf,
    act: Buf,
    rows: u32,
    hidden: u32,
    inter: u32,
    experts: u32,
    k: u32,
) -> Launch {
    Args::new()
        .read(x)
        .read(ids)
        .read(wg)
        .read(wu)
        .write(act)
        .u32(rows)
        .u32(hidden)
        .u32(inter)
        .u32(experts)
        .u32(k)
        .launch(
            "moe::gate_up_silu",
            expert_config(inter, rows.saturating_mul(k)),
        )
}

/// out bf16[rows·hidden] = Σ_j weights[r·k + j] · (act[r·k + j] · wd[ids[r·k + j]]ᵀ), summed in
/// f32 over the picks in order, stored bf16 once.
#[allow(clippy::too_many_arguments)]
pub fn down(
    act: Buf,
    ids: Buf,
    weights: Buf,
    wd: Buf,
    out: Buf,
    rows: u32,
    hidden: u32,
    inter: u32,
    experts: u32,
    k: u32,
) -> Launch {
    Args::new()
        .read(act)
        .read(ids)
        .read(weights)
        .read(wd)
        .write(out)
        .u32(rows)
        .u32(hidden)
        .u32(inter)
        .u32(experts)
        .u32(k)
        .launch("moe::down", expert_config(hidden, rows))
}

/// out bf16[rows·hidden] = routed + sigmoid(gate[r]) · shared, in f32, stored bf16 once: the
/// shared expert's gated contribution (gate bf16[rows], the shared-expert gate projection).
pub fn combine_shared(
    routed: Buf,
    shared: Buf,
    gate: Buf,
    out: Buf,
    rows: u32,
    hidden: u32,
) -> Launch {
    Args::new()
        .read(routed)
        .read(shared)
        .read(gate)
        .write(out)
        .u32(rows)
        .u32(hidden)
        .launch(
            "moe::combine_shared",
            super::elementwise(rows as u64 * hidden as u64),
        )
}
