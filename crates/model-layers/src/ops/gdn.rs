//! `gdn` module: the gated DeltaNet (linear attention) layers of Qwen3-Next — the causal
//! depthwise conv over the q/k/v channels, the per-head gates, the gated delta rule recurrence
//! and the gated RMSNorm of its output.
//!
//! Geometry: `nk` key heads of `dk`, `nv` value heads of `dv` (`nv` a multiple of `nk`, r =
//! nv / nk), a qkvz row of `nk` groups `[q dk | k dk | v r·dv | z r·dv]` (HF's
//! `in_proj_qkvz` before `fix_query_key_value_ordering`), a conv channel row `[q kd | k kd |
//! v vd]` (kd = nk·dk, vd = nv·dv).
//!
//! State lives in per-sequence slots (`slots i32[rows]`): the conv history bf16
//! `[num_slots][C][kernel − 1]` (oldest first) and the recurrent state f32
//! `[num_slots][nv][dk][dv]`. `chain` = 0: each row is its own sequence on `slots[r]`;
//! `chain` = 1: the rows are consecutive tokens of one sequence on `slots[0]`. The optional
//! `snapshots` receive row r's slot state after row r (in either mode; with `chain` = 1 they
//! let the session roll back rejected draft tokens).

use solder_gpu_runtime::LaunchConfig;

use super::{elementwise, Args, Buf, Launch};

/// Channels per conv block (one thread each).
const CONV_THREADS: u32 = 256;
/// Threads of a recurrence block: each owns state columns j of one head.
const RECURRENCE_THREADS: u32 = 128;
/// Heads per gated-norm block (one warp each).
const NORM_WARPS: u32 = 8;

/// The conv: blocks over (channel tiles, rows); with `chain` one block row walks the rows.
/// grid.y is capped at CUDA's 65535 (the kernel walks further rows grid-stride).
fn conv_config(channels: u64, rows: u32, chain: u32) -> LaunchConfig {
    let tiles = channels
        .div_ceil(CONV_THREADS as u64)
        .clamp(1, u32::MAX as u64) as u32;
    let row_blocks = if chain != 0 { 1 } else { rows.clamp(1, 65_535) };
    LaunchConfig {
        grid: [tiles, row_blocks, 1],
        block: [CONV_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

/// Depthwise causal conv (width `kernel`) + SiLU of each row's q/k/v channels, gathered from
/// qkvz bf16[rows·nk·G]; w bf16[C·kernel] (`kernel` ≥ 2); state bf16 (read-write); out
/// bf16[rows·C]; snapshots bf16[rows·C·(kernel − 1)] (optional).
#[allow(clippy::too_many_arguments)]
pub fn conv(
    qkvz: Buf,
    w: Buf,
    state: Buf,
    slots: Buf,
    out: Buf,
    snapshots: Option<Buf>,
    rows: u32,
    nk: u32,
    dk: u32,
    nv: u32,
    dv: u32,
    kernel: u32,
    num_slots: u32,
    chain: u32,
) -> Launch {
    let channels = 2 * nk as u64 * dk as u64 + nv as u64 * dv as u64;
    Args::new()
        .read(qkvz)
        .read(w)
        .read_write(state)
        .read(slots)
        .write(out)
        .write_opt(snapshots)
        .u32(rows)
        .u32(nk)
        .u32(dk)
        .u32(nv)
        .u32(dv)
        .u32(kernel)
        .u32(num_slots)
        .u32(chain)
        .launch("gdn::conv", conv_config(channels, rows, chain))
}

/// ba bf16[rows·2·nv] (HF's `in_proj_ba`), a_log, dt_bias bf16[nv] → beta = sigmoid(b) and
/// g = −exp(a_log) · softplus(a + dt_bias), both f32[rows·nv]. Elementwise.
#[allow(clippy::too_many_arguments)]
pub fn gates(
    ba: Buf,
    a_log: Buf,
    dt_bias: Buf,
    beta: Buf,
    g: Buf,
    rows: u32,
    nk: u32,
    nv: u32,
) -> Launch {
    Args::new()
        .read(ba)
        .read(a_log)
        .read(dt_bias)
        .write(beta)
        .write(g)
        .u32(rows)
        .u32(nk)
        .u32(nv)
        .launch("gdn::gates", elementwise(rows as u64 * nv as u64))
}

/// The gated delta rule with l2-normalised q and k: mixed bf16[rows·C] (the conv output),
/// beta, g f32[rows·nv], state f32 (read-write), out bf16[rows·nv·dv], snapshots
/// f32[rows·nv·dk·dv] (optional). One block per (v head, row); with `chain` one per v head,
/// walking the rows.
#[allow(clippy::too_many_arguments)]
pub fn recurrence(
    mixed: Buf,
    beta: Buf,
    g: Buf,
    state: Buf,
    slots: Buf,
    out: Buf,
    snapshots: Option<Buf>,
    rows: u32,
    nk: u32,
    dk: u32,
    nv: u32,
    dv: u32,
    num_slots: u32,
    chain: u32,
) -> Launch {
    // grid.y is capped at CUDA's 65535; the kernel walks further rows grid-stride.
    let row_blocks = if chain != 0 { 1 } else { rows.clamp(1, 65_535) };
    let config = LaunchConfig {
        grid: [nv.max(1), row_blocks, 1],
        block: [RECURRENCE_THREADS, 1, 1],
        shared_bytes: 0,
    };
    Args::new()
        .read(mixed)
        .read(beta)
        .read(g)
        .read_write(state)
        .read(slots)
        .write(out)
        .write_opt(snapshots)
        .u32(rows)
        .u32(nk)
        .u32(dk)
        .u32(nv)
        .u32(dv)
        .u32(num_slots)
        .u32(chain)
        .launch("gdn::recurrence", config)
}

/// RMSNorm of each v head of core bf16[rows·nv·dv] (weight w bf16[dv]) times silu(z), z from
/// qkvz bf16[rows·nk·G] → out bf16[rows·nv·dv]. One warp per (row, v head).
#[allow(clippy::too_many_arguments)]
pub fn gated_norm(
    core: Buf,
    qkvz: Buf,
    w: Buf,
    out: Buf,
    rows: u32,
    nk: u32,
    dk: u32,
    nv: u32,
    dv: u32,
    eps: f32,
) -> Launch {
    let heads = rows as u64 * nv as u64;
    let blocks = heads.div_ceil(NORM_WARPS as u64).clamp(1, u32::MAX as u64) as u32;
    Args::new()
        .read(core)
        .read(qkvz)
        .read(w)
        .write(out)
        .u32(rows)
        .u32(nk)
        .u32(dk)
        .u32(nv)
        .u32(dv)
        .f32(eps)
        .launch(
            "gdn::gated_norm",
            LaunchConfig::linear(blocks, 32 * NORM_WARPS),
        )
}

/// The runtime route of `recurrence` for evenly pitched slots: the same arguments (`chain`
/// 0); row r's state is `slots[0] + r * (slots[1] - slots[0])`, a strided batch.
#[allow(clippy::too_many_arguments)]
pub fn recurrence_pitched(
    mixed: Buf,
    beta: Buf,
    g: Buf,
    state: Buf,
    slots: Buf,
    out: Buf,
    rows: u32,
    nk: u32,
    dk: u32,
    nv: u32,
    dv: u32,
    num_slots: u32,
) -> Launch {
    let mut launch = recurrence(
        mixed, beta, g, state, slots, out, None, rows, nk, dk, nv, dv, num_slots, 0,
    );
    launch.kernel = "gdn::recurrence_pitched";
    launch
}

/// The largest key head dim the recurrence kernels take (kernels/gdn.cu `GDN_MAX_DK`).
pub const GDN_MAX_DK: u32 = 256;
