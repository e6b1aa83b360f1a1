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

mod emit;
mod entries;
mod twin;

use emit::emit_qkv_rope_kv_mma;
pub use emit::QkvRopeKvParts;
pub use entries::*;
use entries::{gated, normed};
use twin::{qkv_rope_kv_mma, qkv_rope_kv_mma_fp8, qkv_rope_kv_mma_int4};

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
