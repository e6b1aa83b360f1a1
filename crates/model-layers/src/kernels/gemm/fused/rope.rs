//! `gemm::qkv_rope_kv_mma`: q, k and v on the tensor cores with rope and the KV write in the
//! epilogue, one launch where `qkv_mma` and `rope::rope_kv_write` took two (the tensor cores'
//! counterpart of gemv's `qkv_rope_kv`); `gemm::qkv_norm_rope_kv_mma` does the same with
//! qk-norm first, where `qkv_mma` and `rope::qk_norm_rope_kv_write` took two, and
//! `gemm::qkv_gated_norm_zc_rope_kv_mma` Qwen3-Next's gated attention (q's weight holds per head
//! `[q | gate]`, zero-centred qk-norm), where `qkv_mma` and
//! `rope::gated_qk_norm_zc_rope_kv_write` took two.
//!
//! Launch shape: 64-row tiles as every gemm kernel; per q or k head, ⌈half/16⌉ rope blocks
//! (16 features of the first rotary half and their 16 partners, so each lane holds both values
//! of a pair) and ⌈(head_dim − 2·half)/32⌉ pass-through blocks, then v's 32-feature blocks
//! (half = rotary_dim / 2). With qk-norm, which needs a head's whole sum of squares, a q or k
//! head is one block: it runs the head's 32-feature tiles one after another into shared memory
//! (64 rows × head_dim, up to 256), then each warp norms and ropes its rows' staged heads. A
//! gated q head's block runs 2·head_dim features, its gate half straight to `gate_out`.
//!
//! Invariant: every projection is rounded as `linear_mma` stores it, then (normed and) roped
//! and stored as `rope::rope_kv_write` (`qk_norm_rope_kv_write`) does from the bf16
//! projections, so the launch writes the bytes of `qkv_mma` then that kernel (the twin runs
//! exactly those two twins' arithmetic). The fp8
//! and int4 entries (`qkv_rope_kv_mma_fp8`, `_int4`: one kind, each weight with its own blocks
//! or group) dequantise as `qkv_mma_fp8`/`_int4` do; their twins run the bf16 twin on the
//! dequantised matrices.

use half::bf16;
use solder_circuit::ir::MetaField;
use solder_circuit::{OpKind, WeightFormat};
use solder_gpu_runtime::{GpuError, LaunchConfig};

use super::super::{linear_dots, GEMM_FEATURES, GEMM_LARGE_FEATURES, GEMM_ROWS};
use super::quant::{fp8, int4};
use crate::kernels::args::{dequantised, size, Dim, In, InOpt, Out, OutOpt};
use crate::kernels::decl::{kernel, Name};
use crate::kernels::emit_view::{View, R};
use crate::kernels::gemv::projections;
use crate::kernels::heads::{split_gated, with_rope, CacheArgs, HeadPass};
use crate::kernels::{Buf, Launch};

kernel! {
    /// x bf16\[rows·k\] → q, k, v (weights bf16\[n·k\], biases optional); q roped into q_out
    /// bf16\[rows·heads·head_dim\], the roped k and v into each row's slot of the paged cache;
    /// with qk-norm weights wqn, wkn bf16\[head_dim\] (both or neither), q and k normed first;
    /// gate_out bf16\[rows·heads·head_dim\] only for the gated entries.
    pub struct QkvRopeKvMma / QkvRopeKvMmaArgs {
        x: In<bf16>,
        wq: In<bf16>,
        bq: InOpt<bf16>,
        wk: In<bf16>,
        bk: InOpt<bf16>,
        wv: In<bf16>,
        bv: InOpt<bf16>,
        wqn: InOpt<bf16>,
        wkn: InOpt<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        slot_mapping: In<i32>,
        q_out: Out<bf16>,
        gate_out: OutOpt<bf16>,
        cache: InOut<bf16>,
        rows: U32,
        k: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
        block_size: U32,
        num_pages: U32,
        eps: F32,
    }
    grid(a) = qkv_rope_kv_grid([a.heads, a.kv_heads, a.head_dim, a.rotary_dim], a.rows, a.wqn.is_some() || a.wkn.is_some());
    QKV_ROPE_KV_MMA = "gemm::qkv_rope_kv_mma" => twin qkv_rope_kv_mma, emit emit_qkv_rope_kv_mma;
}

kernel! {
    /// `qkv_rope_kv_mma` on fp8 blobs wq \[heads·head_dim·k\], wk and wv
    /// \[kv_heads·head_dim·k\], each with its f32 scales of `block_n × block_k` blocks.
    pub struct QkvRopeKvMmaFp8 / QkvRopeKvMmaFp8Args {
        x: In<bf16>,
        wq: In<u8>,
        bq: InOpt<bf16>,
        wk: In<u8>,
        bk: InOpt<bf16>,
        wv: In<u8>,
        bv: InOpt<bf16>,
        wqn: InOpt<bf16>,
        wkn: InOpt<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        slot_mapping: In<i32>,
        q_out: Out<bf16>,
        gate_out: OutOpt<bf16>,
        cache: InOut<bf16>,
        rows: U32,
        k: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
        block_size: U32,
        num_pages: U32,
        eps: F32,
        q_block_n: U32,
        q_block_k: U32,
        k_block_n: U32,
        k_block_k: U32,
        v_block_n: U32,
        v_block_k: U32,
    }
    grid(a) = qkv_rope_kv_grid([a.heads, a.kv_heads, a.head_dim, a.rotary_dim], a.rows, a.wqn.is_some() || a.wkn.is_some());
    QKV_ROPE_KV_MMA_FP8 = "gemm::qkv_rope_kv_mma_fp8" => twin qkv_rope_kv_mma_fp8, emit emit_qkv_rope_kv_mma;
}

kernel! {
    /// `qkv_rope_kv_mma` on int4 blobs wq \[heads·head_dim·k\], wk and wv
    /// \[kv_heads·head_dim·k\], each with its f32 scales and u8 zero points per `group`.
    pub struct QkvRopeKvMmaInt4 / QkvRopeKvMmaInt4Args {
        x: In<bf16>,
        wq: In<u8>,
        bq: InOpt<bf16>,
        wk: In<u8>,
        bk: InOpt<bf16>,
        wv: In<u8>,
        bv: InOpt<bf16>,
        wqn: InOpt<bf16>,
        wkn: InOpt<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        slot_mapping: In<i32>,
        q_out: Out<bf16>,
        gate_out: OutOpt<bf16>,
        cache: InOut<bf16>,
        rows: U32,
        k: U32,
        heads: U32,
        kv_heads: U32,
        head_dim: U32,
        rotary_dim: U32,
        block_size: U32,
        num_pages: U32,
        eps: F32,
        q_group: U32,
        k_group: U32,
        v_group: U32,
    }
    grid(a) = qkv_rope_kv_grid([a.heads, a.kv_heads, a.head_dim, a.rotary_dim], a.rows, a.wqn.is_some() || a.wkn.is_some());
    QKV_ROPE_KV_MMA_INT4 = "gemm::qkv_rope_kv_mma_int4" => twin qkv_rope_kv_mma_int4, emit emit_qkv_rope_kv_mma;
}

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
fn wide_entry(entry: &str) -> &str {
    entry
        .strip_suffix("_narrow")
        .or_else(|| entry.strip_suffix("_large"))
        .unwrap_or(entry)
}

/// Whether `entry` is a gated entry, in any tile.
fn gated(entry: &str) -> bool {
    GATED.contains(&wide_entry(entry))
}

/// Whether `entry` is a qk-norm entry (the gated ones too), in any tile.
fn normed(entry: &str) -> bool {
    VARIANTS.iter().any(|(e, _)| *e == wide_entry(entry))
}

/// A `_narrow` entry's launch configuration: the kernel's grid, with a qk-norm layout's dynamic
/// shared memory for 16 rows of a head (gemm.cu's `GEMM_NM`) rather than 64. 16 rows of a
/// 256-wide head (8 KB) beside the narrow tile's 27 KB of static shared memory stay under the
/// 48 KB a launch gets without opting in; 64 rows (32 KB) would not.
pub fn narrow_config(wide: LaunchConfig) -> LaunchConfig {
    LaunchConfig {
        shared_bytes: wide.shared_bytes / (GEMM_ROWS / super::super::NARROW_ROWS),
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

/// The widest head the qk-norm layout stages (64 rows of it in shared memory).
pub const NORM_HEAD_DIM_MAX: u32 = 256;

/// Per q or k head ⌈half/16⌉ rope blocks and ⌈(head_dim − 2·half)/32⌉ pass-through blocks
/// (half = min(rotary_dim, head_dim) / 2), or with qk-norm (`norm`) one block holding the
/// whole head (its 64 rows staged in dynamic shared memory); then ⌈kv_heads·head_dim/32⌉ v
/// blocks; one block per 64 rows.
pub fn qkv_rope_kv_grid(
    [heads, kv_heads, head_dim, rotary_dim]: [u32; 4],
    rows: u32,
    norm: bool,
) -> LaunchConfig {
    let half = rotary_dim.min(head_dim) / 2;
    let per_head = match norm {
        true => 1,
        false => half.div_ceil(16) + (head_dim - 2 * half).div_ceil(GEMM_FEATURES),
    };
    let v_blocks = (kv_heads * head_dim).div_ceil(GEMM_FEATURES);
    let shared_bytes = match norm {
        true => GEMM_ROWS * head_dim.min(NORM_HEAD_DIM_MAX) * 2,
        false => 0,
    };
    super::super::tile_grid((heads + kv_heads) * per_head + v_blocks, rows, shared_bytes)
}

/// The `_large` entries' grid: per q or k head ⌈half/32⌉ rope blocks and ⌈(head_dim −
/// 2·half)/64⌉ pass-through blocks, or with qk-norm (`norm`) one block holding the whole head
/// (its 128 rows staged in dynamic shared memory: [`LARGE_NORM_STAGE_ROWS`]); then
/// ⌈kv_heads·head_dim/64⌉ v blocks; one block per 128 rows, 256 threads (`gemm::large_grid`'s).
pub fn qkv_rope_kv_large_grid(
    [heads, kv_heads, head_dim, rotary_dim]: [u32; 4],
    rows: u32,
    norm: bool,
) -> LaunchConfig {
    let half = rotary_dim.min(head_dim) / 2;
    let per_head = match norm {
        true => 1,
        false => {
            half.div_ceil(GEMM_LARGE_FEATURES / 2)
                + (head_dim - 2 * half).div_ceil(GEMM_LARGE_FEATURES)
        }
    };
    let v_blocks = (kv_heads * head_dim).div_ceil(GEMM_LARGE_FEATURES);
    let mut config = super::super::large_grid(1, rows);
    config.grid[1] = ((heads + kv_heads) * per_head + v_blocks).max(1);
    if norm {
        config.shared_bytes = LARGE_NORM_STAGE_ROWS * head_dim.min(NORM_HEAD_DIM_MAX) * 2;
    }
    config
}

/// The rows of a head a `_large` qk-norm block stages (gemm.cu's `GEMM_LARGE_BM`): 128 rows of
/// a 256-wide head are 64 KB of dynamic shared memory, beside the large tile's 27 KB of static;
/// past 48 KB a launch opts in (the CUDA backend does, up to the device's limit: 227 KB on
/// sm_90, 99 KB on sm_86 and sm_89).
pub const LARGE_NORM_STAGE_ROWS: u32 = 128;

/// Every entry's arguments but the weights (the same names in each).
struct RopeKv<'a> {
    ctx: &'a solder_gpu_runtime::TwinCtx<'a>,
    x: In<'a, bf16>,
    biases: [InOpt<'a, bf16>; 3],
    /// qk-norm's weights (both or neither) and epsilon.
    norm: (InOpt<'a, bf16>, InOpt<'a, bf16>, f32),
    positions: In<'a, i32>,
    inv_freq: In<'a, f32>,
    slot_mapping: In<'a, i32>,
    q_out: Out<'a, bf16>,
    /// The gated entries' gate halves.
    gate_out: OutOpt<'a, bf16>,
    cache: Out<'a, bf16>,
    /// rows, k, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages.
    dims: [Dim<'a>; 8],
}

macro_rules! rope_kv {
    ($a:ident) => {
        RopeKv {
            ctx: $a.ctx,
            x: $a.x,
            biases: [$a.bq, $a.bk, $a.bv],
            norm: ($a.wqn, $a.wkn, $a.eps),
            positions: $a.positions,
            inv_freq: $a.inv_freq,
            slot_mapping: $a.slot_mapping,
            q_out: $a.q_out,
            gate_out: $a.gate_out,
            cache: $a.cache,
            dims: [
                $a.rows,
                $a.k,
                $a.heads,
                $a.kv_heads,
                $a.head_dim,
                $a.rotary_dim,
                $a.block_size,
                $a.num_pages,
            ],
        }
    };
}

impl RopeKv<'_> {
    /// This entry is a gated one (q's weight holds each head's `[q | gate]`).
    fn gated(&self) -> bool {
        gated(self.ctx.kernel())
    }

    /// (k, q's weight rows (each head's q and, gated, its gate), k's and v's width).
    fn widths(&self) -> Result<(usize, usize, usize), GpuError> {
        let [_, k, heads, kv_heads, head_dim, ..] = self.dims;
        let head_dim = head_dim.dim()?;
        let q_parts = if self.gated() { 2 } else { 1 };
        Ok((
            k.dim()?,
            size(self.ctx, &[heads.dim()?, q_parts, head_dim])?,
            size(self.ctx, &[kv_heads.dim()?, head_dim])?,
        ))
    }

    /// The projections against the bf16 matrices `w` (q, k, v) as `qkv_mma` stores them, then
    /// `rope_kv_write`'s pass (`qk_norm_rope_kv_write`'s with qk-norm, and gated
    /// `gated_qk_norm_zc_rope_kv_write`'s) into q_out (gate_out) and the cache.
    fn run(self, w: [&[bf16]; 3]) -> Result<(), GpuError> {
        let ctx = self.ctx;
        let gated = self.gated();
        let [rows, _, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages] = self.dims;
        let rows = rows.count();
        let (k, nq, nkv) = self.widths()?;
        let x = self.x.len(size(ctx, &[rows, k])?)?;
        let mut q = vec![bf16::ZERO; size(ctx, &[rows, nq])?];
        let mut kr = vec![bf16::ZERO; size(ctx, &[rows, nkv])?];
        let mut v = vec![bf16::ZERO; size(ctx, &[rows, nkv])?];
        let outputs = [(&mut q, nq), (&mut kr, nkv), (&mut v, nkv)];
        for ((y, n), (w, bias)) in outputs.into_iter().zip(w.into_iter().zip(self.biases)) {
            let w = w.get(..size(ctx, &[n, k])?).ok_or_else(|| {
                ctx.fail(format!("a weight holds {} elements, want {n}·{k}", w.len()))
            })?;
            let bias = bias.len(n)?;
            linear_dots(ctx, x, w, bias, [rows, k, n], y);
        }
        let dims = [rows, heads.dim()?, kv_heads.dim()?, head_dim.dim()?];
        let hd = dims[3];
        // A gated entry splits each head's [q | gate] as attn::gate_split does.
        let q = match (gated, self.gate_out.len(size(ctx, &[rows, dims[1], hd])?)?) {
            (true, Some(gate)) => {
                let mut q_half = vec![bf16::ZERO; gate.len()];
                split_gated(&q, hd, &mut q_half, gate);
                q_half
            }
            (false, None) => q,
            (true, None) => return Err(ctx.fail("a gated entry takes gate_out")),
            (false, Some(_)) => {
                return Err(ctx
                    .fail("gate_out is the gated entries' (gemm::qkv_gated_norm_zc_rope_kv_mma)"))
            }
        };
        let mut pass = HeadPass::over(ctx, &q, &kr, dims);
        let (wqn, wkn, eps) = self.norm;
        // The qk-norm entries take both weights, the plain ones neither.
        let normed = normed(ctx.kernel());
        match (wqn.len(hd)?, wkn.len(hd)?) {
            (Some(_), Some(_)) if normed && hd > NORM_HEAD_DIM_MAX as usize => {
                return Err(ctx.fail(format!(
                    "head_dim {hd} is wider than the {NORM_HEAD_DIM_MAX} a qk-norm block stages"
                )))
            }
            (Some(wqn), Some(wkn)) if normed => {
                pass = pass.normed_by(wqn, wkn, eps);
                if gated {
                    pass = pass.zero_centred();
                }
            }
            (None, None) if !normed => {}
            _ => {
                return Err(ctx.fail(match normed {
                    true => "a qk-norm entry takes both wqn and wkn",
                    false => "wqn and wkn are the qk-norm entries' (gemm::qkv_norm_rope_kv_mma)",
                }))
            }
        }
        let pass = with_rope(pass, self.positions, self.inv_freq, rotary_dim)?;
        let cache = CacheArgs {
            slot_mapping: self.slot_mapping,
            cache: self.cache,
            block_size,
            num_pages,
        };
        pass.into_cache_from(&v, self.q_out, cache)
    }
}

fn qkv_rope_kv_mma(a: QkvRopeKvMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (wq, wk, wv) = (a.wq, a.wk, a.wv);
    let c = rope_kv!(a);
    let (k, nq, nkv) = c.widths()?;
    let (wq, wk, wv) = (
        wq.len(size(ctx, &[nq, k])?)?,
        wk.len(size(ctx, &[nkv, k])?)?,
        wv.len(size(ctx, &[nkv, k])?)?,
    );
    c.run([wq, wk, wv])
}

/// The twin of a quantized entry: the bf16 twin on the matrices `numerics::dequant` gives.
fn quant_run(c: RopeKv<'_>, w: [(In<'_, u8>, WeightFormat); 3]) -> Result<(), GpuError> {
    let (k, nq, nkv) = c.widths()?;
    let [(wq, fq), (wk, fk), (wv, fv)] = w;
    let (wq, wk, wv) = (
        dequantised(c.ctx, wq, fq, nq, k)?,
        dequantised(c.ctx, wk, fk, nkv, k)?,
        dequantised(c.ctx, wv, fv, nkv, k)?,
    );
    c.run([&wq, &wk, &wv])
}

fn qkv_rope_kv_mma_fp8(a: QkvRopeKvMmaFp8Args<'_>) -> Result<(), GpuError> {
    let w = [
        (a.wq, fp8(a.q_block_n, a.q_block_k)),
        (a.wk, fp8(a.k_block_n, a.k_block_k)),
        (a.wv, fp8(a.v_block_n, a.v_block_k)),
    ];
    quant_run(rope_kv!(a), w)
}

fn qkv_rope_kv_mma_int4(a: QkvRopeKvMmaInt4Args<'_>) -> Result<(), GpuError> {
    let w = [
        (a.wq, int4(a.q_group)),
        (a.wk, int4(a.k_group)),
        (a.wv, int4(a.v_group)),
    ];
    quant_run(rope_kv!(a), w)
}

/// `launch_in_layout` for each format's arguments: the entry of `layout` (plain, qk-norm,
/// gated) among `entries[0]`, its `_narrow` variant among `entries[1]` in `narrow_config` for
/// `QkvTile::Narrow`, or its `_large` one among `entries[2]` in `qkv_rope_kv_large_grid` for
/// `QkvTile::Large`.
macro_rules! layout_launch {
    ($($args:ty),+) => {
        $(
            impl $args {
                fn launch_in_layout(
                    self,
                    entries: [[Name<$args>; 3]; 3],
                    layout: usize,
                    tile: QkvTile,
                ) -> Launch {
                    match tile {
                        QkvTile::Large => {
                            let dims = [self.heads, self.kv_heads, self.head_dim, self.rotary_dim];
                            let config = qkv_rope_kv_large_grid(dims, self.rows, layout != 0);
                            self.launch_with(entries[2][layout], config)
                        }
                        QkvTile::Narrow => {
                            let config = narrow_config(self.config());
                            self.launch_with(entries[1][layout], config)
                        }
                        QkvTile::Wide => self.launch_with(entries[0][layout], self.config()),
                    }
                }
            }
        )+
    };
}
layout_launch!(QkvRopeKvMma, QkvRopeKvMmaFp8, QkvRopeKvMmaInt4);

/// The bf16 entry of `layout` (plain, qk-norm, gated) in `tile`.
fn bf16_launch(a: QkvRopeKvMma, layout: usize, tile: QkvTile) -> Launch {
    a.launch_in_layout(
        [
            [
                QKV_ROPE_KV_MMA,
                QKV_NORM_ROPE_KV_MMA,
                QKV_GATED_NORM_ZC_ROPE_KV_MMA,
            ],
            [
                QKV_ROPE_KV_MMA_NARROW,
                QKV_NORM_ROPE_KV_MMA_NARROW,
                QKV_GATED_NORM_ZC_ROPE_KV_MMA_NARROW,
            ],
            [
                QKV_ROPE_KV_MMA_LARGE,
                QKV_NORM_ROPE_KV_MMA_LARGE,
                QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE,
            ],
        ],
        layout,
        tile,
    )
}

/// `qkv_rope_kv_mma`, or its entry for the weights' format.
fn emit_qkv_rope_kv_mma(v: &View<'_>) -> R {
    let p = projections(v)?;
    let ([wq, wk, wv], [bq, bk, bv]) = (p.w, p.bias);
    let rope = v.op(OpKind::Rope, None)?;
    let write = v.op(OpKind::KvWrite, None)?;
    let (x, rows, k) = (v.input(p.q_op, 0)?, v.rows(), p.k);
    let (positions, inv_freq) = (v.meta(MetaField::Positions), v.inv_freq());
    let slot_mapping = v.meta(MetaField::SlotMapping);
    let (q_out, cache) = (v.output(rope, 0)?, v.state_of(write.outputs[0])?);
    let (heads, kv_heads) = (v.u32(rope, "heads")?, v.u32(rope, "kv_heads")?);
    let (head_dim, rotary_dim) = (v.u32(rope, "head_dim")?, v.u32(rope, "rotary_dim")?);
    let (block_size, num_pages) = (v.kv_block_size(), v.kv_pages());
    // qk-norm models: q and k normed in the same launch (one block per head); Qwen3-Next's
    // gated attention with its zero-centred qk-norm in the gated entry.
    let norm_op = [OpKind::QkNorm, OpKind::QkNormZc]
        .into_iter()
        .find(|kind| v.has(*kind));
    let norm = match norm_op {
        Some(_) if head_dim > NORM_HEAD_DIM_MAX => {
            return Err(v.err(format!(
                "head_dim {head_dim} is wider than the {NORM_HEAD_DIM_MAX} a qk-norm block stages"
            )))
        }
        Some(kind) => {
            let n = v.op(kind, None)?;
            Some((v.weight(n, 0)?, v.weight(n, 1)?, v.f32(n, "eps")?))
        }
        None => None,
    };
    let gate = match v.has(OpKind::AttnGateSplit) {
        true => Some(v.output(v.op(OpKind::AttnGateSplit, None)?, 1)?),
        false => None,
    };
    // The gated entry's norm is zero-centred, the qk-norm entry's plain.
    if gate.is_some() != (norm_op == Some(OpKind::QkNormZc)) {
        return Err(v.err(
            "gemm::qkv_rope_kv_mma takes a gate split only with the zero-centred qk-norm \
             (qwen3_next), and that norm only with the gate split"
                .to_string(),
        ));
    }
    let parts = QkvRopeKvParts {
        x,
        w: [wq, wk, wv],
        bias: [bq, bk, bv],
        norm,
        gate,
        positions,
        inv_freq,
        slot_mapping,
        q_out,
        cache,
        dims: [
            rows, k, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages,
        ],
    };
    let formats = p.ops.map(|op| v.weight_format(op, 0));
    let dims = [heads, kv_heads, head_dim, rotary_dim];
    let large = qkv_rope_kv_large_grid(dims, rows, norm.is_some());
    let tile = match super::super::large_config(v, large) {
        Some(_) => QkvTile::Large,
        None if super::super::narrow(v) => QkvTile::Narrow,
        None => QkvTile::Wide,
    };
    match parts.launch_tile(formats, tile) {
        Some(launch) => Ok(vec![launch]),
        None => Err(super::mixed_formats(v, QKV_ROPE_KV_MMA.as_str(), &formats)),
    }
}

/// Every `qkv_rope_kv_mma` entry's arguments but the quantized weights' parameters (which
/// `launch` takes from their formats): what the emitter and the tests build a launch from.
#[derive(Debug, Clone, Copy)]
pub struct QkvRopeKvParts {
    pub x: Buf,
    /// q, k and v (bf16, or blobs of one quantized kind).
    pub w: [Buf; 3],
    pub bias: [Option<Buf>; 3],
    /// qk-norm's weights (q, k) and epsilon: the qk-norm entry.
    pub norm: Option<(Buf, Buf, f32)>,
    /// The gate halves' destination: the gated entry (with `norm`, its weights zero-centred).
    pub gate: Option<Buf>,
    pub positions: Buf,
    pub inv_freq: Buf,
    pub slot_mapping: Buf,
    pub q_out: Buf,
    pub cache: Buf,
    /// rows, k, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages.
    pub dims: [u32; 8],
}

impl QkvRopeKvParts {
    /// The launch of the entry for `formats` (all bf16, or one quantized kind), its qk-norm
    /// variant with `norm`, its gated one with `gate`; `None` when the formats mix kinds.
    pub fn launch(self, formats: [WeightFormat; 3]) -> Option<Launch> {
        self.launch_narrow(formats, false)
    }

    /// `launch`, through the layout's `_narrow` entry in the weights' format when `narrow`.
    pub fn launch_narrow(self, formats: [WeightFormat; 3], narrow: bool) -> Option<Launch> {
        let tile = if narrow {
            QkvTile::Narrow
        } else {
            QkvTile::Wide
        };
        self.launch_tile(formats, tile)
    }

    /// `launch` in `tile`.
    pub fn launch_tile(self, formats: [WeightFormat; 3], tile: QkvTile) -> Option<Launch> {
        let Self {
            x,
            w: [wq, wk, wv],
            bias: [bq, bk, bv],
            norm,
            gate,
            positions,
            inv_freq,
            slot_mapping,
            q_out,
            cache,
            dims: [rows, k, heads, kv_heads, head_dim, rotary_dim, block_size, num_pages],
        } = self;
        let gate_out = gate;
        let (wqn, wkn, eps) = match norm {
            Some((wqn, wkn, eps)) => (Some(wqn), Some(wkn), eps),
            None => (None, None, 0.0),
        };
        // The layout: plain, qk-norm, or gated with (zero-centred) qk-norm.
        let layout = match (norm.is_some(), gate.is_some()) {
            (_, true) => 2,
            (true, false) => 1,
            (false, false) => 0,
        };
        use WeightFormat::{Bf16, Fp8, Int4};
        Some(match formats {
            [Bf16, Bf16, Bf16] => bf16_launch(
                QkvRopeKvMma {
                    x,
                    wq,
                    bq,
                    wk,
                    bk,
                    wv,
                    bv,
                    wqn,
                    wkn,
                    positions,
                    inv_freq,
                    slot_mapping,
                    q_out,
                    gate_out,
                    cache,
                    rows,
                    k,
                    heads,
                    kv_heads,
                    head_dim,
                    rotary_dim,
                    block_size,
                    num_pages,
                    eps,
                },
                layout,
                tile,
            ),
            [Fp8 {
                block_n: q_block_n,
                block_k: q_block_k,
            }, Fp8 {
                block_n: k_block_n,
                block_k: k_block_k,
            }, Fp8 {
                block_n: v_block_n,
                block_k: v_block_k,
            }] => QkvRopeKvMmaFp8 {
                x,
                wq,
                bq,
                wk,
                bk,
                wv,
                bv,
                wqn,
                wkn,
                positions,
                inv_freq,
                slot_mapping,
                q_out,
                gate_out,
                cache,
                rows,
                k,
                heads,
                kv_heads,
                head_dim,
                rotary_dim,
                block_size,
                num_pages,
                eps,
                q_block_n,
                q_block_k,
                k_block_n,
                k_block_k,
                v_block_n,
                v_block_k,
            }
            .launch_in_layout(
                [
                    [
                        QKV_ROPE_KV_MMA_FP8,
                        QKV_NORM_ROPE_KV_MMA_FP8,
                        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8,
                    ],
                    [
                        QKV_ROPE_KV_MMA_FP8_NARROW,
                        QKV_NORM_ROPE_KV_MMA_FP8_NARROW,
                        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_NARROW,
                    ],
                    [
                        QKV_ROPE_KV_MMA_FP8_LARGE,
                        QKV_NORM_ROPE_KV_MMA_FP8_LARGE,
                        QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_LARGE,
                    ],
                ],
                layout,
                tile,
            ),
            [Int4 { group: q_group }, Int4 { group: k_group }, Int4 { group: v_group }] => {
                QkvRopeKvMmaInt4 {
                    x,
                    wq,
                    bq,
                    wk,
                    bk,
                    wv,
                    bv,
                    wqn,
                    wkn,
                    positions,
                    inv_freq,
                    slot_mapping,
                    q_out,
                    gate_out,
                    cache,
                    rows,
                    k,
                    heads,
                    kv_heads,
                    head_dim,
                    rotary_dim,
                    block_size,
                    num_pages,
                    eps,
                    q_group,
                    k_group,
                    v_group,
                }
                .launch_in_layout(
                    [
                        [
                            QKV_ROPE_KV_MMA_INT4,
                            QKV_NORM_ROPE_KV_MMA_INT4,
                            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4,
                        ],
                        [
                            QKV_ROPE_KV_MMA_INT4_NARROW,
                            QKV_NORM_ROPE_KV_MMA_INT4_NARROW,
                            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_NARROW,
                        ],
                        [
                            QKV_ROPE_KV_MMA_INT4_LARGE,
                            QKV_NORM_ROPE_KV_MMA_INT4_LARGE,
                            QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_LARGE,
                        ],
                    ],
                    layout,
                    tile,
                )
            }
            _ => return None,
        })
    }
}
