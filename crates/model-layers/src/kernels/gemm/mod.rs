//! `gemm` module (`crates/kernels/cuda/gemm.cu`): projections on the tensor cores
//! (`mma.sync` m16n8k16, bf16 in, f32 accumulate), launched by the `differs` rules of the
//! `tensor_cores` lever in place of gemv's CUDA-core dots.
//!
//! Files: this one declares the single projections (`linear_mma`, `lm_head_mma`) and the launch
//! grid; `tiles` the narrow, large and pipelined tiles and what picks them; `twin` their twins
//! and the twins' dot driver (`each_dot`); `emit` their emitters; `quant` their fp8/int4
//! entries; `fused` the q/k/v and gate/up+SiLU·mul kernels (and their fp8/int4 entries), whose
//! dots are these kernels' bytes (the same `mma.sync` sequence per output); `experts` the routed
//! experts' gate/up+SiLU·mul and down projections, picks grouped by expert.
//!
//! Launch shape: blocks of 128 threads (four warps) over tiles of 64 rows × 32 output
//! features, k in steps of 64 (the next step's loads in flight while one runs); `grid` =
//! (⌈rows/64⌉, ⌈features/32⌉). Variants of the same bytes, picked by the emitters (`tiled!`):
//! at decode widths with `mma_narrow` the `_narrow` entries (the same grid), at 128 rows and
//! more with `mma_large` the `_large` entries (256 threads over 128 × 64 tiles, `large_grid`,
//! `large_grid_of`, `qkv_rope_kv_large_grid`), and with `mma_pipe` too the bf16 single and
//! several-matrix ones' `_pipe` entries (`PIPES`: the same grid, three k tiles in flight through
//! cp.async in dynamic shared memory).
//!
//! Numerics: the twins do the host model of `mma.sync` the emulation runs (`cuda_emu.hpp`,
//! `numerics::MmaPanel`): each output's accumulator starts at +0 and takes `x[r][i]·w[o][i]`
//! with one fused multiply-add per `i` in order, then one `0·0` per element of zero padding up
//! to the next multiple of 64 (the kernel's last k tile; a zero product leaves an accumulator
//! that is never -0 as it was, so the tile's width does not change a byte). So a row's bytes do not depend on the program's
//! width or the row's place in it. A device's tensor cores sum each group of 16 products in an
//! undocumented order, so the device's bytes differ from the twins' in the last bits, as the
//! twins' differ from gemv's segmented dots: `differs`, never `bit_identical`.

use half::bf16;
use solder_circuit::{OpKind, WeightFormat};
use solder_gpu_runtime::{par_chunks_mut, GpuError, LaunchConfig};

use super::args::{macs, size, threads_for};
use super::decl::{kernel, Name};
use crate::kernels::emit_view::{View, R};
use crate::kernels::want::on_wanted_rows;
use crate::numerics::{linear_value, stream_dots, to_f32, MmaPanel, MMA_BLOCK, MMA_ROWS};

/// Threads of a block: four warps.
pub const GEMM_THREADS: u32 = 128;
/// Rows (tokens) of a block's tile.
pub const GEMM_ROWS: u32 = 64;
/// Output features of a block's tile.
pub const GEMM_FEATURES: u32 = 32;
/// k of one staged tile: the accumulation is padded with zero products to a multiple of it.
pub const GEMM_K_TILE: usize = crate::numerics::MMA_K_TILE;

kernel! {
    /// x bf16\[rows·k\], w bf16\[n_out·k\], bias bf16\[n_out\]? → y bf16\[rows·n_out\], on the
    /// tensor cores.
    pub struct LinearMma / LinearMmaArgs {
        x: In<bf16>,
        w: In<bf16>,
        bias: InOpt<bf16>,
        y: Out<bf16>,
        rows: U32,
        k: U32,
        n_out: U32,
    }
    grid(a) = gemm_grid(a.n_out, a.rows);
    LINEAR_MMA = "gemm::linear_mma" => twin linear_mma, emit emit_linear_mma;
}

kernel! {
    /// x bf16\[rows·k\], w bf16\[vocab·k\] → logits f32\[rows·vocab\] (the LM head or an MoE
    /// router), on the tensor cores; `want` as `gemv::lm_head`'s (a block of 64 rows none of
    /// which is wanted streams no weight).
    pub struct LmHeadMma / LmHeadMmaArgs {
        x: In<bf16>,
        w: In<bf16>,
        logits: Out<f32>,
        want: InOpt<i32>,
        rows: U32,
        k: U32,
        vocab: U32,
    }
    grid(a) = gemm_grid(a.vocab, a.rows);
    LM_HEAD_MMA = "gemm::lm_head_mma" => twin lm_head_mma, emit emit_lm_head_mma;
}

mod emit;
mod experts;
mod fused;
mod quant;
mod tiles;
mod twin;

use emit::{emit_linear_mma, emit_lm_head_mma};
pub use experts::FORMAT_ENTRIES as EXPERTS_FORMAT_ENTRIES;
pub use experts::{
    down_scratch_bytes, ExpertsDownMma, ExpertsDownMmaArgs, ExpertsDownMmaFp8, ExpertsDownMmaInt4,
    ExpertsGateUpSiluMma, ExpertsGateUpSiluMmaArgs, ExpertsGateUpSiluMmaFp8,
    ExpertsGateUpSiluMmaInt4, EXPERTS_DOWN_MMA, EXPERTS_DOWN_MMA_FP8, EXPERTS_DOWN_MMA_INT4,
    EXPERTS_GATE_UP_SILU_MMA, EXPERTS_GATE_UP_SILU_MMA_FP8, EXPERTS_GATE_UP_SILU_MMA_INT4,
};
pub use fused::format_entries as fused_format_entries;
pub use fused::{
    qkv_rope_kv_grid, qkv_rope_kv_large_grid, GateUpSiluMma, GateUpSiluMmaArgs, GateUpSiluMmaFp8,
    GateUpSiluMmaInt4, LinearPairMma, LinearPairMmaArgs, QkvMma, QkvMmaArgs, QkvMmaFp8, QkvMmaInt4,
    QkvRopeKvMma, QkvRopeKvMmaArgs, QkvRopeKvMmaFp8, QkvRopeKvMmaInt4, QkvRopeKvParts, QkvTile,
    GATE_UP_SILU_MMA, GATE_UP_SILU_MMA_FP8, GATE_UP_SILU_MMA_INT4, LINEAR_PAIR_MMA,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA, QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4, QKV_MMA, QKV_MMA_FP8, QKV_MMA_INT4, QKV_NORM_ROPE_KV_MMA,
    QKV_NORM_ROPE_KV_MMA_FP8, QKV_NORM_ROPE_KV_MMA_INT4, QKV_ROPE_KV_MMA, QKV_ROPE_KV_MMA_FP8,
    QKV_ROPE_KV_MMA_FP8_LARGE, QKV_ROPE_KV_MMA_INT4, QKV_ROPE_KV_MMA_INT4_LARGE,
    QKV_ROPE_KV_MMA_LARGE, VARIANTS,
};
pub use fused::{
    GATE_UP_SILU_MMA_FP8_LARGE, GATE_UP_SILU_MMA_FP8_NARROW, GATE_UP_SILU_MMA_INT4_LARGE,
    GATE_UP_SILU_MMA_INT4_NARROW, GATE_UP_SILU_MMA_LARGE, GATE_UP_SILU_MMA_NARROW,
    GATE_UP_SILU_MMA_PIPE, LARGE_NORM_STAGE_ROWS, LINEAR_PAIR_MMA_LARGE, LINEAR_PAIR_MMA_NARROW,
    LINEAR_PAIR_MMA_PIPE, QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_LARGE,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_NARROW, QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_LARGE,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_NARROW, QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_NARROW, QKV_MMA_FP8_LARGE, QKV_MMA_INT4_LARGE, QKV_MMA_LARGE,
    QKV_MMA_PIPE, QKV_NORM_ROPE_KV_MMA_FP8_LARGE, QKV_NORM_ROPE_KV_MMA_FP8_NARROW,
    QKV_NORM_ROPE_KV_MMA_INT4_LARGE, QKV_NORM_ROPE_KV_MMA_INT4_NARROW, QKV_NORM_ROPE_KV_MMA_LARGE,
    QKV_NORM_ROPE_KV_MMA_NARROW, QKV_ROPE_KV_MMA_FP8_NARROW, QKV_ROPE_KV_MMA_INT4_NARROW,
    QKV_ROPE_KV_MMA_NARROW,
};
pub use quant::{
    LinearMmaFp8, LinearMmaInt4, LmHeadMmaFp8, LmHeadMmaInt4, FORMAT_ENTRIES, LINEAR_MMA_FP8,
    LINEAR_MMA_FP8_LARGE, LINEAR_MMA_FP8_NARROW, LINEAR_MMA_INT4, LINEAR_MMA_INT4_LARGE,
    LINEAR_MMA_INT4_NARROW, LM_HEAD_MMA_FP8, LM_HEAD_MMA_FP8_LARGE, LM_HEAD_MMA_FP8_NARROW,
    LM_HEAD_MMA_INT4, LM_HEAD_MMA_INT4_LARGE, LM_HEAD_MMA_INT4_NARROW,
};
pub(super) use tiles::tiled;
pub use tiles::*;
use twin::{each_dot, linear_dots, linear_mma, lm_head_mma};

pub(super) const DECLS: &[&[super::KernelDecl]] = &[
    LinearMma::DECLS,
    LmHeadMma::DECLS,
    LinearMmaFp8::DECLS,
    LinearMmaInt4::DECLS,
    LmHeadMmaFp8::DECLS,
    LmHeadMmaInt4::DECLS,
    QkvMma::DECLS,
    LinearPairMma::DECLS,
    GateUpSiluMma::DECLS,
    QkvRopeKvMma::DECLS,
    QkvRopeKvMmaFp8::DECLS,
    QkvRopeKvMmaInt4::DECLS,
    QkvMmaFp8::DECLS,
    QkvMmaInt4::DECLS,
    GateUpSiluMmaFp8::DECLS,
    GateUpSiluMmaInt4::DECLS,
    ExpertsGateUpSiluMma::DECLS,
    ExpertsDownMma::DECLS,
    experts::ExpertsGateUpSiluMmaFp8::DECLS,
    experts::ExpertsGateUpSiluMmaInt4::DECLS,
    experts::ExpertsDownMmaFp8::DECLS,
    experts::ExpertsDownMmaInt4::DECLS,
];

/// The experts' down-dots region a workspace needs (`Layout::moe_scratch_offset`): at the
/// widest of `plans` that launches `gemm::experts_down_mma`, for the circuit's largest MoE
/// (picks k, hidden); zero when no plan does.
pub fn experts_down_scratch_max(
    circuit: &solder_circuit::ir::Circuit,
    plans: &[&solder_circuit::ExecutionPlan],
) -> usize {
    let rows = plans
        .iter()
        .filter(|p| {
            p.fusion.groups.iter().any(|g| {
                g.kernels
                    .iter()
                    .any(|k| experts::DOWN_KERNELS.contains(&k.as_str()))
            })
        })
        .map(|p| p.rows)
        .max();
    let Some(rows) = rows else {
        return 0;
    };
    let k = super::attrs::widest(circuit, OpKind::MoeDown, None, "k");
    let hidden = super::attrs::widest(circuit, OpKind::MoeDown, None, "hidden");
    down_scratch_bytes(rows, k, hidden)
}

/// One block per tile of 64 rows × 32 features.
pub fn gemm_grid(features: u32, rows: u32) -> LaunchConfig {
    tile_grid(features.div_ceil(GEMM_FEATURES), rows, 0)
}

/// A projection's grid (gemm.cu's `gemm_block`): x the ⌈rows/64⌉ row blocks, y
/// `feature_blocks`. Blocks are issued x fastest, so the blocks that share a weight tile run
/// side by side and read it from DRAM once. y holds at most 65535 (`emit_group` refuses more).
pub(super) fn tile_grid(feature_blocks: u32, rows: u32, shared_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid: [rows.div_ceil(GEMM_ROWS).max(1), feature_blocks.max(1), 1],
        block: [GEMM_THREADS, 1, 1],
        shared_bytes,
    }
}
