//! `norm` module: RMSNorm of the residual stream, its fusion with the residual add, and the
//! per-head qk-norm.

use solder_gpu_runtime::LaunchConfig;

use super::{Args, Buf, Launch, ROW_THREADS};

/// x f32[rows·hidden], w bf16[hidden] → out bf16[rows·hidden].
pub fn rms_norm(x: Buf, w: Buf, out: Buf, rows: u32, hidden: u32, eps: f32) -> Launch {
    Args::new()
        .read(x)
        .read(w)
        .write(out)
        .u32(rows)
        .u32(hidden)
        .f32(eps)
        .launch("norm::rms_norm", per_warp_row(rows))
}

/// h f32 + x bf16 → h_out f32 (optional), then RMSNorm → out bf16.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm(
    h: Buf,
    x: Buf,
    w: Buf,
    h_out: Option<Buf>,
    out: Buf,
    rows: u32,
    hidden: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(h)
        .read(x)
        .read(w)
        .write_opt(h_out)
        .write(out)
        .u32(rows)
        .u32(hidden)
        .f32(eps)
        .launch("norm::add_rms_norm", per_warp_row(rows))
}

/// Per-head RMSNorm of q bf16[rows·heads·head_dim] and k bf16[rows·kv_heads·head_dim] with
/// weights wq, wk bf16[head_dim]; one warp per head, one block per row.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm(
    q: Buf,
    k: Buf,
    wq: Buf,
    wk: Buf,
    q_out: Buf,
    k_out: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    eps: f32,
) -> Launch {
    Args::new()
        .read(q)
        .read(k)
        .read(wq)
        .read(wk)
        .write(q_out)
        .write(k_out)
        .u32(rows)
        .u32(heads)
        .u32(kv_heads)
        .u32(head_dim)
        .f32(eps)
        .launch("norm::qk_norm", per_head_block(rows, heads, kv_heads))
}

/// One warp per row (the fused gemv kernels normalise rows the same way): 8 rows per block.
pub(crate) fn per_warp_row(rows: u32) -> LaunchConfig {
    LaunchConfig::linear(rows.div_ceil(ROW_THREADS / 32), ROW_THREADS)
}

/// One block per row, one warp per head (q and k heads), at most 32 warps.
pub(crate) fn per_head_block(rows: u32, heads: u32, kv_heads: u32) -> LaunchConfig {
    let warps = heads.saturating_add(kv_heads).clamp(1, 32);
    LaunchConfig::linear(rows, 32 * warps)
}

/// The same launch under another kernel's name: the zero-centred kernels take exactly the
/// arguments and shape of their plain counterparts.
fn renamed(mut launch: Launch, kernel: &'static str) -> Launch {
    launch.kernel = kernel;
    launch
}

/// Zero-centred RMSNorm (Qwen3-Next): x f32[rows·hidden], w bf16[hidden] → out
/// bf16[rows·hidden] = bf16((x · inv) · (1 + w)), inv as in `rms_norm`.
pub fn rms_norm_zc(x: Buf, w: Buf, out: Buf, rows: u32, hidden: u32, eps: f32) -> Launch {
    renamed(rms_norm(x, w, out, rows, hidden, eps), "norm::rms_norm_zc")
}

/// h f32 + x bf16 → h_out f32 (optional), then `rms_norm_zc` → out bf16.
#[allow(clippy::too_many_arguments)]
pub fn add_rms_norm_zc(
    h: Buf,
    x: Buf,
    w: Buf,
    h_out: Option<Buf>,
    out: Buf,
    rows: u32,
    hidden: u32,
    eps: f32,
) -> Launch {
    renamed(
        add_rms_norm(h, x, w, h_out, out, rows, hidden, eps),
        "norm::add_rms_norm_zc",
    )
}

/// `qk_norm` with zero-centred weights (1 + w); one block per row, one warp per head.
#[allow(clippy::too_many_arguments)]
pub fn qk_norm_zc(
    q: Buf,
    k: Buf,
    wq: Buf,
    wk: Buf,
    q_out: Buf,
    k_out: Buf,
    rows: u32,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    eps: f32,
) -> Launch {
    renamed(
        qk_norm(
            q, k, wq, wk, q_out, k_out, rows, heads, kv_heads, head_dim, eps,
        ),
        "norm::qk_norm_zc",
    )
}
