//! Launch shapes several kernel modules share.

use solder_gpu_runtime::LaunchConfig;

/// Threads of a row-wise block (norms, embedding, rope, KV write).
pub(crate) const ROW_THREADS: u32 = 256;

/// One block per row.
pub(crate) fn per_row(rows: u32) -> LaunchConfig {
    LaunchConfig::linear(rows, ROW_THREADS)
}

/// Elementwise kernels: 256 threads, 4 elements each.
pub(crate) fn elementwise(elements: u64) -> LaunchConfig {
    let blocks = elements.div_ceil(4 * 256).min(u32::MAX as u64) as u32;
    LaunchConfig::linear(blocks, 256)
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
