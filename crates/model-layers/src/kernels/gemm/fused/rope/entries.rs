//! The entries of `qkv_rope_kv_mma` beside the plain one: its qk-norm and gated layouts, the
//! `_narrow` and `_large` tiles of each, and the quantized formats, with the tables the
//! registry reads (`VARIANTS`, `NARROW_VARIANTS`, `LARGE_VARIANTS`, `FORMAT_ENTRIES`).

use super::*;

/// `qkv_rope_kv_mma` with qk-norm (qwen3 and its family): each q or k head one block, its
/// tiles staged and normed as `rope::qk_norm_rope_kv_write` norms them. The same arguments and
/// twin; the entry takes `wqn` and `wkn`, the plain ones neither.
pub const QKV_NORM_ROPE_KV_MMA: Name<QkvRopeKvMma> = Name::new("gemm::qkv_norm_rope_kv_mma");
pub const QKV_NORM_ROPE_KV_MMA_FP8: Name<QkvRopeKvMmaFp8> =
    Name::new("gemm::qkv_norm_rope_kv_mma_fp8");
pub const QKV_NORM_ROPE_KV_MMA_INT4: Name<QkvRopeKvMmaInt4> =
    Name::new("gemm::qkv_norm_rope_kv_mma_int4");

/// The qk-norm entry for Qwen3-Next's gated attention: wq holds per head `[q | gate]`
/// (\[heads·2·head_dim·k\]), the gate half goes to `gate_out`, and the qk-norm's weights are
/// zero-centred (`1 + w`). The same arguments and twin; only these entries take `gate_out`.
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA: Name<QkvRopeKvMma> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma");
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8: Name<QkvRopeKvMmaFp8> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma_fp8");
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4: Name<QkvRopeKvMmaInt4> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma_int4");

/// The three bf16 layouts through gemm.cu's `gemm_narrow` (lever `mma_narrow`, decode widths):
/// the same arguments, twin and bytes; a qk-norm layout's launch stages a pass's 16 rows of a
/// head, so it asks for a quarter of the dynamic shared memory (`narrow_config`).
pub const QKV_ROPE_KV_MMA_NARROW: Name<QkvRopeKvMma> = Name::new("gemm::qkv_rope_kv_mma_narrow");
pub const QKV_NORM_ROPE_KV_MMA_NARROW: Name<QkvRopeKvMma> =
    Name::new("gemm::qkv_norm_rope_kv_mma_narrow");
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA_NARROW: Name<QkvRopeKvMma> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma_narrow");

/// The six quantized layouts through `gemm_narrow` (a stage of 128 k): as the bf16 ones.
pub const QKV_ROPE_KV_MMA_FP8_NARROW: Name<QkvRopeKvMmaFp8> =
    Name::new("gemm::qkv_rope_kv_mma_fp8_narrow");
pub const QKV_NORM_ROPE_KV_MMA_FP8_NARROW: Name<QkvRopeKvMmaFp8> =
    Name::new("gemm::qkv_norm_rope_kv_mma_fp8_narrow");
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_NARROW: Name<QkvRopeKvMmaFp8> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma_fp8_narrow");
pub const QKV_ROPE_KV_MMA_INT4_NARROW: Name<QkvRopeKvMmaInt4> =
    Name::new("gemm::qkv_rope_kv_mma_int4_narrow");
pub const QKV_NORM_ROPE_KV_MMA_INT4_NARROW: Name<QkvRopeKvMmaInt4> =
    Name::new("gemm::qkv_norm_rope_kv_mma_int4_narrow");
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_NARROW: Name<QkvRopeKvMmaInt4> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma_int4_narrow");

/// The `_narrow` entries, with the entry each is a variant of (a quantized one of the plain
/// entry in its format, as the quantized qk-norm entries are).
pub const NARROW_VARIANTS: [(&str, &str); 9] = [
    (QKV_ROPE_KV_MMA_NARROW.as_str(), QKV_ROPE_KV_MMA.as_str()),
    (
        QKV_NORM_ROPE_KV_MMA_NARROW.as_str(),
        QKV_ROPE_KV_MMA.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_NARROW.as_str(),
        QKV_ROPE_KV_MMA.as_str(),
    ),
    (
        QKV_ROPE_KV_MMA_FP8_NARROW.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
    ),
    (
        QKV_NORM_ROPE_KV_MMA_FP8_NARROW.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_NARROW.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
    ),
    (
        QKV_ROPE_KV_MMA_INT4_NARROW.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
    ),
    (
        QKV_NORM_ROPE_KV_MMA_INT4_NARROW.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_NARROW.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
    ),
];

/// The three layouts' entries through gemm.cu's `gemm_large` (lever `mma_large`, prefill
/// widths): the same arguments, twins and bytes, in [`qkv_rope_kv_large_grid`] (128 rows × 64
/// tile columns a block: 32 rotary pairs, or 64 pass-through or v features; with qk-norm a
/// whole head, its 128 rows staged in `128·head_dim·2` bytes of dynamic shared memory, which
/// passes, beside the tile's 27 KB, the 48 KB a launch gets without opting in for a head wider than 84: the CUDA backend
/// opts in).
pub const QKV_ROPE_KV_MMA_LARGE: Name<QkvRopeKvMma> = Name::new("gemm::qkv_rope_kv_mma_large");
pub const QKV_NORM_ROPE_KV_MMA_LARGE: Name<QkvRopeKvMma> =
    Name::new("gemm::qkv_norm_rope_kv_mma_large");
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE: Name<QkvRopeKvMma> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma_large");
pub const QKV_ROPE_KV_MMA_FP8_LARGE: Name<QkvRopeKvMmaFp8> =
    Name::new("gemm::qkv_rope_kv_mma_fp8_large");
pub const QKV_NORM_ROPE_KV_MMA_FP8_LARGE: Name<QkvRopeKvMmaFp8> =
    Name::new("gemm::qkv_norm_rope_kv_mma_fp8_large");
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_LARGE: Name<QkvRopeKvMmaFp8> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma_fp8_large");
pub const QKV_ROPE_KV_MMA_INT4_LARGE: Name<QkvRopeKvMmaInt4> =
    Name::new("gemm::qkv_rope_kv_mma_int4_large");
pub const QKV_NORM_ROPE_KV_MMA_INT4_LARGE: Name<QkvRopeKvMmaInt4> =
    Name::new("gemm::qkv_norm_rope_kv_mma_int4_large");
pub const QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_LARGE: Name<QkvRopeKvMmaInt4> =
    Name::new("gemm::qkv_gated_norm_zc_rope_kv_mma_int4_large");

/// The `_large` entries, with the entry each is a variant of (as `NARROW_VARIANTS` pairs them).
pub const LARGE_VARIANTS: [(&str, &str); 9] = [
    (QKV_ROPE_KV_MMA_LARGE.as_str(), QKV_ROPE_KV_MMA.as_str()),
    (
        QKV_NORM_ROPE_KV_MMA_LARGE.as_str(),
        QKV_ROPE_KV_MMA.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE.as_str(),
        QKV_ROPE_KV_MMA.as_str(),
    ),
    (
        QKV_ROPE_KV_MMA_FP8_LARGE.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
    ),
    (
        QKV_NORM_ROPE_KV_MMA_FP8_LARGE.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_LARGE.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
    ),
    (
        QKV_ROPE_KV_MMA_INT4_LARGE.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
    ),
    (
        QKV_NORM_ROPE_KV_MMA_INT4_LARGE.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_LARGE.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
    ),
];

/// Which tile a `qkv_rope_kv_mma` launch runs: the 64 × 32 one, gemm_narrow's passes of 16 rows
/// (the `_narrow` entries, lever `mma_narrow`) or gemm_large's 128 × 64 (the `_large` entries,
/// lever `mma_large`). The same bytes in each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvTile {
    Wide,
    Narrow,
    Large,
}

/// The wide gated entries (each a qk-norm entry too).
const GATED: [&str; 3] = [
    QKV_GATED_NORM_ZC_ROPE_KV_MMA.as_str(),
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8.as_str(),
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4.as_str(),
];

/// The wide entry `entry` stands for in its tile: itself, or the entry its `_narrow` or
/// `_large` name extends (the tests hold every tile's entry to that name).
pub(super) fn wide_entry(entry: &str) -> &str {
    entry
        .strip_suffix("_narrow")
        .or_else(|| entry.strip_suffix("_large"))
        .unwrap_or(entry)
}

/// Whether `entry` is a gated entry, in any tile.
pub(super) fn gated(entry: &str) -> bool {
    GATED.contains(&wide_entry(entry))
}

/// Whether `entry` is a qk-norm entry (the gated ones too), in any tile.
pub(super) fn normed(entry: &str) -> bool {
    VARIANTS.iter().any(|(e, _)| *e == wide_entry(entry))
}

/// A `_narrow` entry's launch configuration: the kernel's grid, with a qk-norm layout's dynamic
/// shared memory for 16 rows of a head (gemm.cu's `GEMM_NM`) rather than 64. 16 rows of a
/// 256-wide head (8 KB) beside the narrow tile's 27 KB of static shared memory stay under the
/// 48 KB a launch gets without opting in; 64 rows (32 KB) would not.
pub fn narrow_config(wide: LaunchConfig) -> LaunchConfig {
    LaunchConfig {
        shared_bytes: wide.shared_bytes / (GEMM_ROWS / super::super::super::NARROW_ROWS),
        ..wide
    }
}

/// The qk-norm entries (the gated ones too), with the entry each is a variant of (the quantized
/// ones are variants of the quantized plain entries, so each stands for `qkv_rope_kv_mma` in
/// its format).
pub const VARIANTS: &[(&str, &str)] = &[
    (QKV_NORM_ROPE_KV_MMA.as_str(), QKV_ROPE_KV_MMA.as_str()),
    (
        QKV_NORM_ROPE_KV_MMA_FP8.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
    ),
    (
        QKV_NORM_ROPE_KV_MMA_INT4.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA.as_str(),
        QKV_ROPE_KV_MMA.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8.as_str(),
        QKV_ROPE_KV_MMA_FP8.as_str(),
    ),
    (
        QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4.as_str(),
        QKV_ROPE_KV_MMA_INT4.as_str(),
    ),
];

/// Each quantized entry: (entry, the kernel it serves, the format kind it reads).
pub const FORMAT_ENTRIES: &[(&str, &str, &str)] = &[
    (
        QKV_ROPE_KV_MMA_FP8.as_str(),
        QKV_ROPE_KV_MMA.as_str(),
        "fp8",
    ),
    (
        QKV_ROPE_KV_MMA_INT4.as_str(),
        QKV_ROPE_KV_MMA.as_str(),
        "int4",
    ),
];
