//! `gemv` module: projections (weights `[out][in]` bf16, f32 accumulation) and their fusions
//! with the residual add, RMSNorm, SiLU·mul and the residual epilogue.
//!
//! Grid: one block of 256 threads (8 warps) per 8 output features (`grid.y`, at most 65535:
//! the kernel strides over the rest) and per group of 8 input rows (`grid.x`, the fastest
//! index, so the row groups sharing a weight tile run side by side and read it from L2). Each
//! warp streams one feature's weight row once per block with 16-byte loads against every row of
//! its group; fused norms recompute their rows' 1/rms per block. Static shared memory only
//! (32 KiB of staged x rows).

use solder_gpu_runtime::LaunchConfig;

use super::{Args, Buf, Launch};

/// Output features per block (one warp each).
const FEATURES_PER_BLOCK: u32 = 8;
/// Input rows per block.
const ROWS_PER_BLOCK: u32 = 8;
/// The most blocks `grid.y` may hold.
const MAX_GRID_Y: u64 = 65_535;

fn gemv_config(features: u64, rows: u32) -> LaunchConfig {
    let feature_blocks = features
        .div_ceil(FEATURES_PER_BLOCK as u64)
        .clamp(1, MAX_GRID_Y) as u32;
    LaunchConfig {
        grid: [rows.div_ceil(ROWS_PER_BLOCK).max(1), feature_blocks, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

fn qkv_features(nq: u32, nkv: u32) -> u64 {
    nq as u64 + 2 * nkv as u64
}

/// x bf16[rows·k], w bf16[n_out·k], bias bf16[n_out]? → y bf16[rows·n_out].
#[allow(clippy::too_many_arguments)]
pub fn linear(x: Buf, w: Buf, bias: Option<Buf>, y: Buf, rows: u32, k: u32, n_out: u32) -> Launch {
    Args::new()
        .read(x)
        .read(w)
        .read_opt(bias)
        .write(y)
        .u32(rows)
        .u32(k)
        .u32(n_out)
        .launch("gemv::linear", gemv_config(n_out as u64, rows))
}

/// x bf16[rows·k], w bf16[vocab·k] → logits f32[rows·vocab].
pub fn lm_head(x: Buf, w: Buf, logits: Buf, rows: u32, k: u32, vocab: u32) -> Launch {
    Args::new()
        .read(x)
        .read(w)
        .write(logits)
        .u32(rows)
        .u32(k)
        .u32(vocab)
        .launch("gemv::lm_head", gemv_config(vocab as u64, rows))
}

/// RMSNorm of h f32[rows·k] (weight wn bf16[k]) then `linear`.
#[allow(clippy::too_many_arguments)]
pub fn norm_linear(
    h: Buf,
    wn: Buf,
    w: Buf,
    bias: Option<Buf>,
    y: Buf,
    rows: u32,
    k: u32,
    n_out: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(h)
        .read(wn)
        .read(w)
        .read_opt(bias)
        .write(y)
        .u32(rows)
        .u32(k)
        .u32(n_out)
        .f32(eps)
        .launch("gemv::norm_linear", gemv_config(n_out as u64, rows))
}

/// The q, k and v projections of one row set: x bf16[rows·k] → q bf16[rows·nq],
/// k bf16[rows·nkv], v bf16[rows·nkv].
#[allow(clippy::too_many_arguments)]
pub fn qkv(
    x: Buf,
    wq: Buf,
    bq: Option<Buf>,
    wk: Buf,
    bk: Option<Buf>,
    wv: Buf,
    bv: Option<Buf>,
    q: Buf,
    k_out: Buf,
    v: Buf,
    rows: u32,
    k: u32,
    nq: u32,
    nkv: u32,
) -> Launch {
    Args::new()
        .read(x)
        .read(wq)
        .read_opt(bq)
        .read(wk)
        .read_opt(bk)
        .read(wv)
        .read_opt(bv)
        .write(q)
        .write(k_out)
        .write(v)
        .u32(rows)
        .u32(k)
        .u32(nq)
        .u32(nkv)
        .launch("gemv::qkv", gemv_config(qkv_features(nq, nkv), rows))
}

/// RMSNorm of h f32[rows·k] (weight wn) then `qkv`.
#[allow(clippy::too_many_arguments)]
pub fn norm_qkv(
    h: Buf,
    wn: Buf,
    wq: Buf,
    bq: Option<Buf>,
    wk: Buf,
    bk: Option<Buf>,
    wv: Buf,
    bv: Option<Buf>,
    q: Buf,
    k_out: Buf,
    v: Buf,
    rows: u32,
    k: u32,
    nq: u32,
    nkv: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(h)
        .read(wn)
        .read(wq)
        .read_opt(bq)
        .read(wk)
        .read_opt(bk)
        .read(wv)
        .read_opt(bv)
        .write(q)
        .write(k_out)
        .write(v)
        .u32(rows)
        .u32(k)
        .u32(nq)
        .u32(nkv)
        .f32(eps)
        .launch("gemv::norm_qkv", gemv_config(qkv_features(nq, nkv), rows))
}

/// h f32 + d bf16 (→ h_out f32, optional), RMSNorm (weight wn), then `qkv`.
#[allow(clippy::too_many_arguments)]
pub fn add_norm_qkv(
    h: Buf,
    d: Buf,
    wn: Buf,
    wq: Buf,
    bq: Option<Buf>,
    wk: Buf,
    bk: Option<Buf>,
    wv: Buf,
    bv: Option<Buf>,
    h_out: Option<Buf>,
    q: Buf,
    k_out: Buf,
    v: Buf,
    rows: u32,
    k: u32,
    nq: u32,
    nkv: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(h)
        .read(d)
        .read(wn)
        .read(wq)
        .read_opt(bq)
        .read(wk)
        .read_opt(bk)
        .read(wv)
        .read_opt(bv)
        .write_opt(h_out)
        .write(q)
        .write(k_out)
        .write(v)
        .u32(rows)
        .u32(k)
        .u32(nq)
        .u32(nkv)
        .f32(eps)
        .launch(
            "gemv::add_norm_qkv",
            gemv_config(qkv_features(nq, nkv), rows),
        )
}

/// Gate and up projections (wg, wu bf16[inter·k]) of x bf16[rows·k], then
/// act bf16[rows·inter] = silu(gate) · up.
#[allow(clippy::too_many_arguments)]
pub fn gate_up_silu(x: Buf, wg: Buf, wu: Buf, act: Buf, rows: u32, k: u32, inter: u32) -> Launch {
    Args::new()
        .read(x)
        .read(wg)
        .read(wu)
        .write(act)
        .u32(rows)
        .u32(k)
        .u32(inter)
        .launch("gemv::gate_up_silu", gemv_config(inter as u64, rows))
}

/// RMSNorm of h f32[rows·k] (weight wn) then `gate_up_silu`.
#[allow(clippy::too_many_arguments)]
pub fn norm_gate_up_silu(
    h: Buf,
    wn: Buf,
    wg: Buf,
    wu: Buf,
    act: Buf,
    rows: u32,
    k: u32,
    inter: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(h)
        .read(wn)
        .read(wg)
        .read(wu)
        .write(act)
        .u32(rows)
        .u32(k)
        .u32(inter)
        .f32(eps)
        .launch("gemv::norm_gate_up_silu", gemv_config(inter as u64, rows))
}

/// h f32 + o bf16 (→ h_out f32, optional), RMSNorm (weight wn), then `gate_up_silu`.
#[allow(clippy::too_many_arguments)]
pub fn add_norm_gate_up_silu(
    h: Buf,
    o: Buf,
    wn: Buf,
    wg: Buf,
    wu: Buf,
    h_out: Option<Buf>,
    act: Buf,
    rows: u32,
    k: u32,
    inter: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(h)
        .read(o)
        .read(wn)
        .read(wg)
        .read(wu)
        .write_opt(h_out)
        .write(act)
        .u32(rows)
        .u32(k)
        .u32(inter)
        .f32(eps)
        .launch(
            "gemv::add_norm_gate_up_silu",
            gemv_config(inter as u64, rows),
        )
}

/// `linear` of x bf16[rows·k], then h_out f32[rows·n_out] = h f32 + the bf16 projection.
#[allow(clippy::too_many_arguments)]
pub fn linear_residual_add(
    x: Buf,
    w: Buf,
    bias: Option<Buf>,
    h: Buf,
    h_out: Buf,
    rows: u32,
    k: u32,
    n_out: u32,
) -> Launch {
    Args::new()
        .read(x)
        .read(w)
        .read_opt(bias)
        .read(h)
        .write(h_out)
        .u32(rows)
        .u32(k)
        .u32(n_out)
        .launch("gemv::linear_residual_add", gemv_config(n_out as u64, rows))
}

/// h f32 + d bf16, RMSNorm (weight wn bf16[k]), then `lm_head` → logits f32[rows·vocab].
#[allow(clippy::too_many_arguments)]
pub fn add_norm_lm_head(
    h: Buf,
    d: Buf,
    wn: Buf,
    w: Buf,
    logits: Buf,
    rows: u32,
    k: u32,
    vocab: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(h)
        .read(d)
        .read(wn)
        .read(w)
        .write(logits)
        .u32(rows)
        .u32(k)
        .u32(vocab)
        .f32(eps)
        .launch("gemv::add_norm_lm_head", gemv_config(vocab as u64, rows))
}
