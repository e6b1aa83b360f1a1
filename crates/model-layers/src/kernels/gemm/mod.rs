//! `gemm` module (`crates/kernels/cuda/gemm.cu`): projections on the tensor cores
//! (`mma.sync` m16n8k16, bf16 in, f32 accumulate), launched by the `differs` rules of the
//! `tensor_cores` lever in place of gemv's CUDA-core dots.
//!
//! Files: this one declares the single projections (`linear_mma`, `lm_head_mma`), the launch
//! grid and the twins' dot driver (`each_dot`); `quant` their fp8/int4 entries; `fused` the
//! q/k/v and gate/up+SiLU·mul kernels (and their fp8/int4 entries), whose dots are these
//! kernels' bytes (the same `mma.sync` sequence per output); `experts` the routed experts'
//! gate/up+SiLU·mul and down projections, picks grouped by expert.
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

/// The lever that launches the tensor-core projections of programs of at most [`NARROW_ROWS`]
/// rows through their `_narrow` entries (gemm.cu `gemm_narrow`: 16 rows a pass, a warp per 8
/// features, k 256 a stage for bf16 weights and 128 for quantized ones): A/B timing of decode
/// widths; the same plans, the same bytes. The MoE experts' kernels have none.
pub const MMA_NARROW: &str = "mma_narrow";

/// The widest program whose projections `mma_narrow` takes through the `_narrow` entries (one
/// pass of 16 rows; the entries take any width, wider ones in passes).
pub const NARROW_ROWS: u32 = 16;

/// `linear_mma` through gemm.cu's `gemm_narrow`: the same arguments, grid, twin and bytes.
pub const LINEAR_MMA_NARROW: Name<LinearMma> = Name::new("gemm::linear_mma_narrow");
/// `lm_head_mma` through `gemm_narrow`.
pub const LM_HEAD_MMA_NARROW: Name<LmHeadMma> = Name::new("gemm::lm_head_mma_narrow");

/// The bf16 single and pair entries' and gate/up's `_narrow` variants, with the kernel each is a
/// variant of (the q/k/v layouts' are `fused::QKV_NARROW_VARIANTS`, the quantized single ones'
/// `quant::NARROW_VARIANTS`; `narrow_variants` gives them all).
const NARROW_VARIANTS: &[(&str, &str)] = &[
    (LINEAR_MMA_NARROW.as_str(), LINEAR_MMA.as_str()),
    (LM_HEAD_MMA_NARROW.as_str(), LM_HEAD_MMA.as_str()),
    (
        fused::GATE_UP_SILU_MMA_NARROW.as_str(),
        GATE_UP_SILU_MMA.as_str(),
    ),
    (
        fused::LINEAR_PAIR_MMA_NARROW.as_str(),
        LINEAR_PAIR_MMA.as_str(),
    ),
    (
        fused::GATE_UP_SILU_MMA_FP8_NARROW.as_str(),
        fused::GATE_UP_SILU_MMA_FP8.as_str(),
    ),
    (
        fused::GATE_UP_SILU_MMA_INT4_NARROW.as_str(),
        fused::GATE_UP_SILU_MMA_INT4.as_str(),
    ),
];

/// Every `_narrow` entry (lever `mma_narrow`), with the kernel or quantized entry it is a
/// variant of.
pub fn narrow_variants() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    NARROW_VARIANTS
        .iter()
        .chain(&fused::QKV_NARROW_VARIANTS)
        .chain(&quant::NARROW_VARIANTS)
}

/// `narrow` when the build turned `mma_narrow` on and the program is at most [`NARROW_ROWS`]
/// rows wide, else `wide`.
pub(super) fn narrow_or<K>(v: &View<'_>, wide: Name<K>, narrow: Name<K>) -> Name<K> {
    if self::narrow(v) {
        narrow
    } else {
        wide
    }
}

/// Whether the build turned `mma_narrow` on and the program is at most [`NARROW_ROWS`] rows
/// wide.
pub(super) fn narrow(v: &View<'_>) -> bool {
    v.lever(MMA_NARROW) && v.rows() <= NARROW_ROWS
}

/// The lever that launches the tensor-core projections `linear_mma`, `lm_head_mma`,
/// `gate_up_silu_mma`, `qkv_mma`, `qkv_rope_kv_mma` and its qk-norm layouts (bf16, fp8 and
/// int4 weights) and `linear_pair_mma` of programs of at least [`LARGE_ROWS`] rows through their
/// `_large` entries where they fit ([`large_fits_grid`]): gemm.cu's `gemm_large`,
/// tiles of 128 rows × 64 features in blocks of eight warps, twice the arithmetic per staged
/// byte of the 64 × 32 tile. A/B timing of prefill chunks and wide batches; the same plans, the
/// same bytes.
pub const MMA_LARGE: &str = "mma_large";

/// The narrowest program `mma_large` takes through the `_large` entries: one row block of theirs
/// (and only a launch whose large grid has a block for every SM, [`large_fits`]).
pub const LARGE_ROWS: u32 = 128;
/// Threads of a `_large` entry's block: eight warps.
pub const GEMM_LARGE_THREADS: u32 = 256;
/// Rows of a `_large` entry's tile.
pub const GEMM_LARGE_ROWS: u32 = 128;
/// Output features of a `_large` entry's tile.
pub const GEMM_LARGE_FEATURES: u32 = 64;

/// `linear_mma` through gemm.cu's `gemm_large`: the same arguments, twin and bytes, in
/// [`large_grid`].
pub const LINEAR_MMA_LARGE: Name<LinearMma> = Name::new("gemm::linear_mma_large");
/// `lm_head_mma` through `gemm_large`.
pub const LM_HEAD_MMA_LARGE: Name<LmHeadMma> = Name::new("gemm::lm_head_mma_large");

/// The `_large` entries of the single projections, gate/up, q/k/v and the pair, with the kernel
/// or quantized entry each is a variant of ([`large_variants`] adds the rope layout's).
pub const LARGE_VARIANTS: &[(&str, &str)] = &[
    (LINEAR_MMA_LARGE.as_str(), LINEAR_MMA.as_str()),
    (LM_HEAD_MMA_LARGE.as_str(), LM_HEAD_MMA.as_str()),
    (
        fused::GATE_UP_SILU_MMA_LARGE.as_str(),
        GATE_UP_SILU_MMA.as_str(),
    ),
    (
        quant::LINEAR_MMA_FP8_LARGE.as_str(),
        quant::LINEAR_MMA_FP8.as_str(),
    ),
    (
        quant::LINEAR_MMA_INT4_LARGE.as_str(),
        quant::LINEAR_MMA_INT4.as_str(),
    ),
    (
        quant::LM_HEAD_MMA_FP8_LARGE.as_str(),
        quant::LM_HEAD_MMA_FP8.as_str(),
    ),
    (
        quant::LM_HEAD_MMA_INT4_LARGE.as_str(),
        quant::LM_HEAD_MMA_INT4.as_str(),
    ),
    (
        fused::GATE_UP_SILU_MMA_FP8_LARGE.as_str(),
        fused::GATE_UP_SILU_MMA_FP8.as_str(),
    ),
    (
        fused::GATE_UP_SILU_MMA_INT4_LARGE.as_str(),
        fused::GATE_UP_SILU_MMA_INT4.as_str(),
    ),
    (fused::QKV_MMA_LARGE.as_str(), QKV_MMA.as_str()),
    (fused::QKV_MMA_FP8_LARGE.as_str(), QKV_MMA_FP8.as_str()),
    (fused::QKV_MMA_INT4_LARGE.as_str(), QKV_MMA_INT4.as_str()),
    (
        fused::LINEAR_PAIR_MMA_LARGE.as_str(),
        LINEAR_PAIR_MMA.as_str(),
    ),
];

/// The lever that launches the bf16 `_large` entries of `linear_mma`, `gate_up_silu_mma`,
/// `lm_head_mma`, `qkv_mma` and `linear_pair_mma` through their `_pipe` entries instead (with
/// `mma_large`, wherever it takes the `_large` one): gemm.cu's `gemm_pipe`, the same tiles, warps
/// and bytes, with three 64-k tiles in flight a block in dynamic shared memory, filled by
/// cp.async, where `gemm_large` stages one through registers. A/B timing of prefill chunks; the
/// same plans, the same bytes.
pub const MMA_PIPE: &str = "mma_pipe";

/// k tiles a `_pipe` entry keeps in shared memory (gemm.cu's `GEMM_PIPE_STAGES`).
pub const PIPE_STAGES: u32 = 3;

/// Dynamic shared memory of a `_pipe` entry over `weights` weights (1, or gate and up's 2):
/// [`PIPE_STAGES`] stages, each a 64-k tile of x's 128 rows and of each weight's 64, rows padded
/// to 72 bf16 (gemm.cu's `GemmPipeStage`).
pub const fn pipe_shared_bytes(weights: u32) -> u32 {
    let pitch = (GEMM_K_TILE as u32 + 8) * 2;
    PIPE_STAGES * (GEMM_LARGE_ROWS + weights * GEMM_LARGE_FEATURES) * pitch
}

/// `linear_mma` through gemm.cu's `gemm_pipe`: `_large`'s arguments, twin, grid and bytes.
pub const LINEAR_MMA_PIPE: Name<LinearMma> = Name::new("gemm::linear_mma_pipe");
/// `lm_head_mma` through `gemm_pipe`.
pub const LM_HEAD_MMA_PIPE: Name<LmHeadMma> = Name::new("gemm::lm_head_mma_pipe");

/// Each `_pipe` entry (lever `mma_pipe`): the `_large` entry it stands in for, the kernel both
/// are variants of, and its weights ([`pipe_shared_bytes`]).
pub const PIPES: [(&str, &str, &str, u32); 5] = [
    (
        LINEAR_MMA_PIPE.as_str(),
        LINEAR_MMA_LARGE.as_str(),
        LINEAR_MMA.as_str(),
        1,
    ),
    (
        LM_HEAD_MMA_PIPE.as_str(),
        LM_HEAD_MMA_LARGE.as_str(),
        LM_HEAD_MMA.as_str(),
        1,
    ),
    (
        fused::GATE_UP_SILU_MMA_PIPE.as_str(),
        fused::GATE_UP_SILU_MMA_LARGE.as_str(),
        GATE_UP_SILU_MMA.as_str(),
        2,
    ),
    (
        fused::QKV_MMA_PIPE.as_str(),
        fused::QKV_MMA_LARGE.as_str(),
        QKV_MMA.as_str(),
        1,
    ),
    (
        fused::LINEAR_PAIR_MMA_PIPE.as_str(),
        fused::LINEAR_PAIR_MMA_LARGE.as_str(),
        LINEAR_PAIR_MMA.as_str(),
        1,
    ),
];

/// Every `_pipe` entry, with the kernel it is a variant of.
pub fn pipe_variants() -> impl Iterator<Item = (&'static str, &'static str)> {
    PIPES.iter().map(|&(pipe, _, kernel, _)| (pipe, kernel))
}

/// The `_pipe` entry of `large` in its launch `config` (the large grid with the stages'
/// dynamic shared memory), when `large` has one.
pub fn pipe_of<K>(large: Name<K>, config: LaunchConfig) -> Option<(Name<K>, LaunchConfig)> {
    PIPES
        .iter()
        .find(|p| p.1 == large.as_str())
        .map(|&(pipe, _, _, weights)| {
            let config = LaunchConfig {
                shared_bytes: pipe_shared_bytes(weights),
                ..config
            };
            (Name::new(pipe), config)
        })
}

/// `large` in `config`, or its `_pipe` entry ([`pipe_of`]) when the build turned `mma_pipe` on.
pub(super) fn piped<K>(
    v: &View<'_>,
    large: Name<K>,
    config: LaunchConfig,
) -> (Name<K>, LaunchConfig) {
    v.lever(MMA_PIPE)
        .then(|| pipe_of(large, config))
        .flatten()
        .unwrap_or((large, config))
}

/// Every `_large` entry (lever `mma_large`), with the kernel or entry it is a variant of (the
/// q/k/v rope layouts' are `fused::QKV_LARGE_VARIANTS`).
pub fn large_variants() -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    LARGE_VARIANTS.iter().chain(&fused::QKV_LARGE_VARIANTS)
}

/// A `_large` entry's grid: x the ⌈rows/128⌉ row blocks (issued fastest, as `tile_grid`'s), y
/// the ⌈features/64⌉ feature blocks, 256 threads.
pub fn large_grid(features: u32, rows: u32) -> LaunchConfig {
    large_grid_of(&[features], rows)
}

/// [`large_grid`] of a launch over several matrices (`qkv_mma_large`'s q, k and v,
/// `linear_pair_mma_large`'s two): y each matrix's ⌈features/64⌉ blocks after the previous
/// matrix's.
pub fn large_grid_of(features: &[u32], rows: u32) -> LaunchConfig {
    let blocks: u32 = features
        .iter()
        .map(|n| n.div_ceil(GEMM_LARGE_FEATURES))
        .sum();
    LaunchConfig {
        grid: [rows.div_ceil(GEMM_LARGE_ROWS).max(1), blocks.max(1), 1],
        block: [GEMM_LARGE_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

/// `$args` launched through `$large` (or its `_pipe` entry, [`piped`]) in
/// [`large_grid`]`($features, rows)` when the launch is large ([`large`]), else through `$wide`,
/// or its `_narrow` entry `$narrow` ([`narrow_or`]).
/// `$features` is one matrix's output count, or a slice of each matrix's ([`large_grid_of`]).
macro_rules! tiled {
    ($v:expr, $args:expr, [$($features:expr),+], $wide:expr, $narrow:expr, $large:expr) => {{
        let (v, args) = ($v, $args);
        match $crate::kernels::gemm::large(v, &[$($features),+]) {
            Some(config) => {
                let (large, config) = $crate::kernels::gemm::piped(v, $large, config);
                args.launch_with(large, config)
            }
            None => args.launch($crate::kernels::gemm::narrow_or(v, $wide, $narrow)),
        }
    }};
    ($v:expr, $args:expr, $features:expr, $wide:expr, $narrow:expr, $large:expr) => {
        $crate::kernels::gemm::tiled!($v, $args, [$features], $wide, $narrow, $large)
    };
}
pub(super) use tiled;

/// The large grid ([`large_grid_of`]) of a projection of `features` outputs (one count per
/// matrix of the launch) in this program, when the build turned `mma_large` on and it fits
/// ([`large_fits_grid`]); `None`: the launch keeps its 64 × 32 tiles.
pub(super) fn large(v: &View<'_>, features: &[u32]) -> Option<LaunchConfig> {
    large_config(v, large_grid_of(features, v.rows()))
}

/// `config` (a `_large` entry's grid) when the build turned `mma_large` on and it fits this
/// program ([`large_fits_grid`]).
pub(super) fn large_config(v: &View<'_>, config: LaunchConfig) -> Option<LaunchConfig> {
    (v.lever(MMA_LARGE) && large_fits_grid(v.rows(), &config)).then_some(config)
}

/// Whether a projection of `features` outputs over `rows` rows suits the large tile: at least
/// [`LARGE_ROWS`] rows, and a block of [`large_grid`] for every SM of the device the plans are
/// sized for (`gemv::split::SMS`, 132). With fewer, the 64 × 32 tiles' four times as many blocks
/// keep more SMs busy: Llama-3.1-8B's o projection (4,096 features) at 128 rows would get 64
/// large blocks. Either way the bytes are the same, so the choice may follow the shape.
pub fn large_fits(rows: u32, features: u32) -> bool {
    large_fits_grid(rows, &large_grid(features, rows))
}

/// [`large_fits`] for a launch of `rows` rows in its large grid `config` (of one matrix or
/// several, [`large_grid_of`]).
pub fn large_fits_grid(rows: u32, config: &LaunchConfig) -> bool {
    let [x, y, _] = config.grid;
    rows >= LARGE_ROWS && u64::from(x) * u64::from(y) >= crate::kernels::gemv::split::SMS
}

mod experts;
mod fused;
mod quant;
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

/// `out[r][o] = f(o, dot)` for every row and feature, each dot in the `mma.sync` model's order
/// (`numerics::MmaPanel`): panels of features on the context's threads. From four rows, each
/// panel is widened once and taken against every row while it is in cache: four rows at a time
/// against panels of 16 features (32 with AVX-512; eight chains of fused multiply-adds side by
/// side). Under
/// four rows (decode), each weight is used once per row, so it is widened as it is read
/// (`numerics::stream_dots`, panels of 8): a widened panel in memory would only add its
/// writes, its allocation and its cache misses.
pub(super) fn each_dot<T: Copy + Send>(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    x: &[bf16],
    w: &[bf16],
    shape: [usize; 3],
    f: impl Fn(usize, f32) -> T,
    out: &mut [T],
) {
    let [rows, k, n] = shape;
    if rows == 0 || n == 0 {
        return;
    }
    if rows >= MMA_ROWS && wide_panels() {
        panel_each_dot::<4, T>(ctx, (x, w), shape, f, out);
    } else if rows >= MMA_ROWS {
        panel_each_dot::<2, T>(ctx, (x, w), shape, f, out);
    } else {
        panel_dots(ctx, x, shape, MMA_BLOCK, f, out, |first, x_rows, dots| {
            let m = (n - first).min(MMA_BLOCK);
            let w_rows: [&[bf16]; MMA_BLOCK] = std::array::from_fn(|j| {
                if j < m {
                    &w[(first + j) * k..][..k]
                } else {
                    &[]
                }
            });
            let w_rows = &w_rows[..m];
            let got: &[[f32; MMA_BLOCK]] = match *x_rows {
                [a] => &stream_dots(w_rows, [a], k),
                [a, b] => &stream_dots(w_rows, [a, b], k),
                [a, b, c] => &stream_dots(w_rows, [a, b, c], k),
                _ => unreachable!("streamed dots take one to three rows"),
            };
            dots.copy_from_slice(got.as_flattened());
        });
    }
}

/// Whether the panels are 32 features wide (AVX-512: four rows against two registers of 16
/// features, eight chains side by side) rather than 16 (AVX2: against two of 8).
fn wide_panels() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `each_dot` over panels of `8·B` features (`panel_rows`).
fn panel_each_dot<const B: usize, T: Copy + Send>(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    (x, w): (&[bf16], &[bf16]),
    shape: [usize; 3],
    f: impl Fn(usize, f32) -> T,
    out: &mut [T],
) {
    let [_, k, n] = shape;
    let width = MmaPanel::<B>::FEATURES;
    panel_dots(ctx, x, shape, width, f, out, |first, x_rows, dots| {
        panel_rows::<B>(w, (n, k), first, x_rows, dots)
    });
}

/// The dots of every row of x with the `8·B` features from `first` (`panel_dots`' `dots`):
/// the panel widened once, four rows at a time against it, then any last rows one by one.
fn panel_rows<const B: usize>(
    w: &[bf16],
    (n, k): (usize, usize),
    first: usize,
    x_rows: &[&[f32]],
    dots: &mut [f32],
) {
    let width = MmaPanel::<B>::FEATURES;
    let w_rows: Vec<&[bf16]> = (first..(first + width).min(n))
        .map(|o| &w[o * k..(o + 1) * k])
        .collect();
    let panel = MmaPanel::<B>::new(&w_rows, k);
    let mut r = 0;
    while r < x_rows.len() {
        let take = if x_rows.len() - r >= MMA_ROWS {
            MMA_ROWS
        } else {
            1
        };
        let mut put = |i: usize, d: &[[f32; MMA_BLOCK]; B]| {
            dots[(r + i) * width..(r + i + 1) * width].copy_from_slice(d.as_flattened());
        };
        if take == MMA_ROWS {
            let got = panel.dots::<MMA_ROWS>(std::array::from_fn(|i| x_rows[r + i]));
            got.iter().enumerate().for_each(|(i, d)| put(i, d));
        } else {
            put(0, &panel.dots([x_rows[r]])[0]);
        }
        r += take;
    }
}

/// `y[r][o]` = `linear_value` of row r's dot with weight row o plus `bias[o]`, each dot in
/// `each_dot`'s order: what `linear_mma` and every tensor-core projection storing bf16 store.
pub(super) fn linear_dots(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    x: &[bf16],
    w: &[bf16],
    bias: Option<&[bf16]>,
    shape: [usize; 3],
    y: &mut [bf16],
) {
    each_dot(
        ctx,
        x,
        w,
        shape,
        |o, d| linear_value(d, bias.map(|b| b[o])),
        y,
    );
}

/// `each_dot`'s driver over panels of `width` features: x widened once, the panels shared out
/// to the context's threads, `dots(first, x_rows, out)` filling `out[r·width + j]` with row r's
/// dot with feature `first + j` (features past n ignored), then `f` over every dot.
fn panel_dots<T: Copy + Send>(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    x: &[bf16],
    [rows, k, n]: [usize; 3],
    width: usize,
    f: impl Fn(usize, f32) -> T,
    out: &mut [T],
    dots: impl Fn(usize, &[&[f32]], &mut [f32]) + Sync,
) {
    let threads = threads_for(ctx, macs(&[rows, k, n]));
    let xs: Vec<f32> = x.iter().map(|v| to_f32(*v)).collect();
    let x_rows: Vec<&[f32]> = (0..rows).map(|r| &xs[r * k..(r + 1) * k]).collect();
    // by_panel[p][r][j]: feature width·p + j of row r.
    let panels = n.div_ceil(width);
    let mut by_panel = vec![0.0f32; panels * rows * width];
    let per = panels.div_ceil(threads.max(1) * 4).max(1);
    par_chunks_mut(&mut by_panel, per * rows * width, threads, |ci, chunk| {
        for (pi, panel) in chunk.chunks_mut(rows * width).enumerate() {
            dots((ci * per + pi) * width, &x_rows, panel);
        }
    });
    for (r, row) in out.chunks_exact_mut(n).enumerate() {
        for (o, v) in row.iter_mut().enumerate() {
            let (p, j) = (o / width, o % width);
            *v = f(o, by_panel[(p * rows + r) * width + j]);
        }
    }
}

fn linear_mma(a: LinearMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, n) = (a.rows.count(), a.k.dim()?, a.n_out.dim()?);
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let w = a.w.len(size(ctx, &[n, k])?)?;
    let bias = a.bias.len(n)?;
    let y = a.y.len(size(ctx, &[rows, n])?)?;
    linear_dots(ctx, x, w, bias, [rows, k, n], y);
    Ok(())
}

fn lm_head_mma(a: LmHeadMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, vocab) = (a.rows.count(), a.k.dim()?, a.vocab.dim()?);
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let w = a.w.len(size(ctx, &[vocab, k])?)?;
    let out = a.logits.len(size(ctx, &[rows, vocab])?)?;
    let want = a.want.len(rows)?;
    on_wanted_rows(want, (x, k), (out, vocab), rows, |x, rows, out| {
        each_dot(ctx, x, w, [rows, k, vocab], |_, d| d, out);
        Ok(())
    })
}

/// `linear_mma`, or its entry for the weight's format (`linear_mma_fp8`, `linear_mma_int4`).
fn emit_linear_mma(v: &View<'_>) -> R {
    let l = v.op(OpKind::Linear, None)?;
    let (x, w, bias, y) = (
        v.input(l, 0)?,
        v.weight(l, 0)?,
        v.weight_opt(l, 1),
        v.output(l, 0)?,
    );
    let (rows, k, n_out) = (v.rows(), v.u32(l, "in")?, v.u32(l, "out")?);
    let launch = match v.weight_format(l, 0) {
        WeightFormat::Bf16 => tiled!(
            v,
            LinearMma {
                x,
                w,
                bias,
                y,
                rows,
                k,
                n_out,
            },
            n_out,
            LINEAR_MMA,
            LINEAR_MMA_NARROW,
            LINEAR_MMA_LARGE
        ),
        WeightFormat::Fp8 { block_n, block_k } => tiled!(
            v,
            LinearMmaFp8 {
                x,
                w,
                bias,
                y,
                rows,
                k,
                n_out,
                block_n,
                block_k,
            },
            n_out,
            LINEAR_MMA_FP8,
            LINEAR_MMA_FP8_NARROW,
            LINEAR_MMA_FP8_LARGE
        ),
        WeightFormat::Int4 { group } => tiled!(
            v,
            LinearMmaInt4 {
                x,
                w,
                bias,
                y,
                rows,
                k,
                n_out,
                group,
            },
            n_out,
            LINEAR_MMA_INT4,
            LINEAR_MMA_INT4_NARROW,
            LINEAR_MMA_INT4_LARGE
        ),
    };
    Ok(vec![launch])
}

/// `lm_head_mma`, or its entry for the weight's format.
fn emit_lm_head_mma(v: &View<'_>) -> R {
    // The LM head and an MoE router are the same f32-output projection.
    let (h, vocab) = match v.op(OpKind::LmHead, None) {
        Ok(h) => (h, v.u32(h, "vocab")?),
        Err(_) => {
            let r = v.op(OpKind::Router, None)?;
            (r, v.u32(r, "experts")?)
        }
    };
    let (x, w, logits) = (v.input(h, 0)?, v.weight(h, 0)?, v.output(h, 0)?);
    let (rows, k, want) = (v.rows(), v.u32(h, "hidden")?, v.want_logits(h));
    let launch = match v.weight_format(h, 0) {
        WeightFormat::Bf16 => tiled!(
            v,
            LmHeadMma {
                x,
                w,
                logits,
                want,
                rows,
                k,
                vocab,
            },
            vocab,
            LM_HEAD_MMA,
            LM_HEAD_MMA_NARROW,
            LM_HEAD_MMA_LARGE
        ),
        WeightFormat::Fp8 { block_n, block_k } => tiled!(
            v,
            LmHeadMmaFp8 {
                x,
                w,
                logits,
                want,
                rows,
                k,
                vocab,
                block_n,
                block_k,
            },
            vocab,
            LM_HEAD_MMA_FP8,
            LM_HEAD_MMA_FP8_NARROW,
            LM_HEAD_MMA_FP8_LARGE
        ),
        WeightFormat::Int4 { group } => tiled!(
            v,
            LmHeadMmaInt4 {
                x,
                w,
                logits,
                want,
                rows,
                k,
                vocab,
                group,
            },
            vocab,
            LM_HEAD_MMA_INT4,
            LM_HEAD_MMA_INT4_NARROW,
            LM_HEAD_MMA_INT4_LARGE
        ),
    };
    Ok(vec![launch])
}

#[cfg(test)]
mod large_tests {
    use super::*;

    /// The large tile takes a launch from 128 rows, where its grid has a block for each of the
    /// 132 SMs: Llama-3.1-8B's gate/up (14,336 features) from 128 rows, its o projection (4,096)
    /// from 384 rows (3 × 64 = 192 blocks; 256 rows give 2 × 64 = 128), Llama-3.2-1B's o (2,048)
    /// from 640 rows (5 × 32 = 160).
    #[test]
    fn the_large_tile_takes_wide_programs_with_a_block_for_every_sm() {
        assert!(!large_fits(127, 1 << 20));
        assert!(large_fits(128, 14336));
        assert!(!large_fits(128, 4096));
        assert!(!large_fits(256, 4096));
        assert!(large_fits(384, 4096));
        assert!(!large_fits(512, 2048));
        assert!(large_fits(640, 2048));
        // 132 blocks exactly: one row block of 8,448 features.
        assert!(large_fits(128, 8448));
        assert!(!large_fits(128, 8447 - 63));
        assert_eq!(large_grid(8448, 128).grid, [1, 132, 1]);
        assert_eq!(large_grid(0, 0).grid, [1, 1, 1]);
    }
}
