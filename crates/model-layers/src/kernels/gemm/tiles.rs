//! The tiles a projection's launch may take beside the 64 × 32 one, each the same bytes: the
//! `_narrow` entries (lever `mma_narrow`), the `_large` entries (lever `mma_large`) and their
//! `_pipe` forms (lever `mma_pipe`), with the grids and the fit that pick them (`tiled!`).

use super::*;

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
pub(in crate::kernels) fn narrow(v: &View<'_>) -> bool {
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
pub(crate) use tiled;

/// The large grid ([`large_grid_of`]) of a projection of `features` outputs (one count per
/// matrix of the launch) in this program, when the build turned `mma_large` on and it fits
/// ([`large_fits_grid`]); `None`: the launch keeps its 64 × 32 tiles.
pub(in crate::kernels) fn large(v: &View<'_>, features: &[u32]) -> Option<LaunchConfig> {
    large_config(v, large_grid_of(features, v.rows()))
}

/// `config` (a `_large` entry's grid) when the build turned `mma_large` on and it fits this
/// program ([`large_fits_grid`]).
pub(in crate::kernels) fn large_config(v: &View<'_>, config: LaunchConfig) -> Option<LaunchConfig> {
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

#[cfg(test)]
mod tests {
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
