//! `gdn` module (`crates/kernels/cuda/gdn.cu`): the gated DeltaNet (linear attention) layers
//! of Qwen3-Next — the causal depthwise conv over the q/k/v channels, the per-head gates, the
//! gated delta rule recurrence (and its runtime route for evenly pitched slots) and the gated
//! RMSNorm of its output.
//!
//! Geometry: `nk` key heads of `dk`, `nv` value heads of `dv` (`nv` a multiple of `nk`, r =
//! nv / nk), a qkvz row of `nk` groups `[q dk | k dk | v r·dv | z r·dv]` (HF's
//! `in_proj_qkvz` before `fix_query_key_value_ordering`), a conv channel row `[q kd | k kd |
//! v vd]` (kd = nk·dk, vd = nv·dv).
//!
//! State lives in per-sequence slots (`slots i32\[rows\]`, the slots read; `out_slots
//! i32\[rows\]`, the slots the advanced state is written to, each a row's own slot to advance it
//! in place): the conv history bf16
//! `[num_slots][C][kernel − 1]` (oldest first) and the recurrent state f32
//! `[num_slots][nv]\[dk\]\[dv\]`. `chain` = 0: each row is its own sequence on `slots\[r\]`;
//! `chain` = 1: the rows are consecutive tokens of one sequence on `slots\[0\]`; `chain` = 2
//! (verify_batch): runs of consecutive rows on one slot, each run one sequence's consecutive
//! tokens (a slot in two runs is refused by the twin; on the GPU the later run is dead). The optional
//! `snapshots` receive row r's slot state after row r (in either mode; with `chain` = 1 they
//! let the session roll back rejected draft tokens), for the rows whose optional `keep` flag
//! (the step's `MetaField::KeepSnapshots`) is not 0: a verify program keeps them only in a
//! speculative step, not for a prompt's chunk.
//!
//! Files: this one declares the kernels and their grids; `emit` their emitters; `twin` (and its
//! folder: `chunked`, `slots`) their CPU twins.

mod emit;
mod twin;
pub(crate) use emit::gdn_dims;
use emit::{
    emit_chunked, emit_chunked_mma, emit_conv, emit_gated_norm, emit_gates, emit_gates_chunked,
    emit_gates_chunked_mma, emit_gates_recurrence, emit_gates_recurrence_pitched, emit_recurrence,
    emit_recurrence_pitched,
};
pub(crate) use twin::{gated_norm_values, GatedNormIn};

use half::bf16;
use solder_circuit::ir::{MetaField, Op};
use solder_circuit::OpKind;
use solder_gpu_runtime::LaunchConfig;

use super::decl::kernel;
use super::grid::elementwise;
use super::Buf;
use crate::error::ExecError;
use crate::kernels::emit_view::{View, R};

/// Channels per conv block (one thread each).
const CONV_THREADS: u32 = 256;
/// State columns of a recurrence block, one warp: lane t owns column 32·tile + t of one head
/// (`crates/kernels/cuda/gdn.cu` `GDN_COLUMNS`).
pub const GDN_COLUMNS: u32 = 32;
/// Heads per gated-norm block (one warp each).
const NORM_WARPS: u32 = 8;

/// The largest key head dim the recurrence kernels take (`crates/kernels/cuda/gdn.cu`
/// `GDN_MAX_DK`).
pub const GDN_MAX_DK: u32 = 256;

/// Blocks over rows, one per row (chain 2: the block of a run's first row walks the run), or
/// one walking them all with chain 1; grid.y is capped at CUDA's 65535 (the kernels walk
/// further rows grid-stride).
fn row_blocks(rows: u32, chain: u32) -> u32 {
    if chain == 1 {
        1
    } else {
        rows.clamp(1, 65_535)
    }
}

/// Rows per block row of a chained conv (`conv_chain`: a chain's rows split over block rows).
const CONV_CHAIN_ROWS: u32 = 16;

/// The conv: blocks over (channel tiles, rows); with `chain` 1 over (channel tiles, blocks of
/// `CONV_CHAIN_ROWS` rows): the conv reads inputs, not outputs, of the rows before, so a
/// chain's rows run in parallel.
fn conv_config(a: &Conv) -> LaunchConfig {
    let channels = 2 * a.nk as u64 * a.dk as u64 + a.nv as u64 * a.dv as u64;
    let tiles = channels
        .div_ceil(CONV_THREADS as u64)
        .clamp(1, u32::MAX as u64) as u32;
    let rows = match a.chain {
        1 => a.rows.div_ceil(CONV_CHAIN_ROWS).clamp(1, 65_535),
        chain => row_blocks(a.rows, chain),
    };
    LaunchConfig {
        grid: [tiles, rows, 1],
        block: [CONV_THREADS, 1, 1],
        shared_bytes: 0,
    }
}

/// One warp per (v head, 32 state columns, row); with `chain` 1 one per (v head, 32 columns),
/// walking the rows.
fn recurrence_grid(rows: u32, nv: u32, dv: u32, chain: u32) -> LaunchConfig {
    let tiles = dv.max(1).div_ceil(GDN_COLUMNS) as u64;
    let blocks = (nv.max(1) as u64 * tiles).clamp(1, u32::MAX as u64) as u32;
    LaunchConfig {
        grid: [blocks, row_blocks(rows, chain), 1],
        block: [GDN_COLUMNS, 1, 1],
        shared_bytes: 0,
    }
}

/// Rows per chunk of the chunked recurrence (`crates/kernels/cuda/gdn.cu` `GDN_CHUNK`).
pub const GDN_CHUNK: u32 = solder_circuit::chain::GDN_CHUNK as u32;
/// Threads of a chunked block (`GDN_CHUNK_THREADS`).
const CHUNK_THREADS: u32 = 256;

/// State columns of a chunked block (`gdn_chunk_columns`): fewer for wide key heads, so q, k
/// and the state tile fit 48 KB of shared memory.
fn chunk_columns(dk: u32) -> u32 {
    if dk <= 128 {
        32
    } else {
        8
    }
}

/// A chunked block's dynamic shared memory (`GdnChunkSmem`): q and k `[GDN_CHUNK][dk + 1]`,
/// the state tile `[dk][jc]`, A and P `[GDN_CHUNK]²`, three `[GDN_CHUNK][jc]` and four
/// `[GDN_CHUNK]` f32 arrays. Under 48 KB up to `GDN_MAX_DK`.
pub fn chunk_shared_bytes(dk: u32) -> u32 {
    let (c, jc, dk) = (GDN_CHUNK, chunk_columns(dk), dk.min(GDN_MAX_DK));
    4 * (2 * c * (dk + 1) + dk * jc + 2 * c * c + 3 * c * jc + 4 * c)
}

/// A tensor-core chunked block's dynamic shared memory (`GdnChunkMmaSmem`), kp = dk padded
/// to 16, sp = jc | 8: q and k `[GDN_CHUNK][kp + 4]`, the state tile `[kp][sp]`, P and A
/// `[GDN_CHUNK][20]`, three `[GDN_CHUNK][sp]` and four `[GDN_CHUNK]` f32 arrays. Under 48 KB
/// up to `GDN_MAX_DK` (47,872 bytes at dk 128).
pub fn chunk_mma_shared_bytes(dk: u32) -> u32 {
    let (c, jc) = (GDN_CHUNK, chunk_columns(dk));
    let kp = dk.min(GDN_MAX_DK).next_multiple_of(16);
    let sp = jc | 8;
    4 * (2 * c * (kp + 4) + kp * sp + 2 * c * 20 + 3 * c * sp + 4 * c)
}

/// One block of `CHUNK_THREADS` per (v head, tile of `chunk_columns(dk)` state columns, row
/// block as the recurrence's).
fn chunked_grid(rows: u32, dk: u32, nv: u32, dv: u32, chain: u32) -> LaunchConfig {
    let tiles = dv.max(1).div_ceil(chunk_columns(dk)) as u64;
    let blocks = (nv.max(1) as u64 * tiles).clamp(1, u32::MAX as u64) as u32;
    LaunchConfig {
        grid: [blocks, row_blocks(rows, chain), 1],
        block: [CHUNK_THREADS, 1, 1],
        shared_bytes: chunk_shared_bytes(dk),
    }
}

/// The launch of `gdn::chunked_mma` and `gdn::gates_chunked_mma`: `chunked`'s grid and
/// threads, their own shared memory.
pub fn chunked_mma_config(rows: u32, dk: u32, nv: u32, dv: u32, chain: u32) -> LaunchConfig {
    LaunchConfig {
        shared_bytes: chunk_mma_shared_bytes(dk),
        ..chunked_grid(rows, dk, nv, dv, chain)
    }
}

/// One warp per (row, v head).
fn gated_norm_config(a: &GatedNorm) -> LaunchConfig {
    let heads = a.rows as u64 * a.nv as u64;
    let blocks = heads.div_ceil(NORM_WARPS as u64).clamp(1, u32::MAX as u64) as u32;
    LaunchConfig::linear(blocks, 32 * NORM_WARPS)
}

kernel! {
    /// Depthwise causal conv (width `kernel`) + SiLU of each row's q/k/v channels, gathered
    /// from qkvz bf16\[rows·nk·G\]; w bf16\[C·kernel\] (`kernel` ≥ 2); state bf16 (read-write);
    /// out bf16\[rows·C\]; snapshots bf16[rows·C·(kernel − 1)] (optional), written for the
    /// rows whose `keep` flag (i32\[rows\], optional: every row without it) is not 0.
    pub struct Conv / ConvArgs {
        qkvz: In<bf16>,
        w: In<bf16>,
        state: InOut<bf16>,
        slots: In<i32>,
        out_slots: In<i32>,
        out: Out<bf16>,
        snapshots: OutOpt<bf16>,
        keep: InOpt<i32>,
        rows: U32,
        nk: U32,
        dk: U32,
        nv: U32,
        dv: U32,
        kernel: U32,
        num_slots: U32,
        chain: U32,
    }
    grid(a) = conv_config(a);
    CONV = "gdn::conv" => twin twin::conv, emit emit_conv;
}

kernel! {
    /// ba bf16\[rows·2·nv\] (HF's `in_proj_ba`), a_log, dt_bias bf16\[nv\] → beta = sigmoid(b)
    /// and g = −exp(a_log) · softplus(a + dt_bias), both f32\[rows·nv\]. Elementwise.
    pub struct Gates / GatesArgs {
        ba: In<bf16>,
        a_log: In<bf16>,
        dt_bias: In<bf16>,
        beta: Out<f32>,
        g: Out<f32>,
        rows: U32,
        nk: U32,
        nv: U32,
    }
    grid(a) = elementwise(a.rows as u64 * a.nv as u64);
    GATES = "gdn::gates" => twin twin::gates, emit emit_gates;
}

kernel! {
    /// The gated delta rule with l2-normalised q and k: mixed bf16\[rows·C\] (the conv output),
    /// beta, g f32\[rows·nv\], state f32 (read-write), out bf16\[rows·nv·dv\], snapshots
    /// f32\[rows·nv·dk·dv\] (optional), written for the rows whose `keep` flag (i32\[rows\],
    /// optional: every row without it) is not 0. `recurrence_pitched` is the runtime route for evenly
    /// pitched slots: the same arguments (`chain` 0, no snapshots); row r's state is
    /// `slots\[0\] + r * (slots\[1\] - slots\[0\])`, a strided batch.
    pub struct Recurrence / RecurrenceArgs {
        mixed: In<bf16>,
        beta: In<f32>,
        g: In<f32>,
        state: InOut<f32>,
        slots: In<i32>,
        out_slots: In<i32>,
        out: Out<bf16>,
        snapshots: OutOpt<f32>,
        keep: InOpt<i32>,
        rows: U32,
        nk: U32,
        dk: U32,
        nv: U32,
        dv: U32,
        num_slots: U32,
        chain: U32,
    }
    grid(a) = recurrence_grid(a.rows, a.nv, a.dv, a.chain);
    RECURRENCE = "gdn::recurrence" => twin twin::recurrence, emit emit_recurrence;
    RECURRENCE_PITCHED = "gdn::recurrence_pitched" =>
        twin twin::recurrence_pitched, emit emit_recurrence_pitched;
}

kernel! {
    /// `gates` folded into `recurrence`: ba bf16\[rows·2·nv\], a_log, dt_bias bf16\[nv\] in
    /// place of beta and g, each row's gates computed where the recurrence reads them (the
    /// values `gates` stores, so the bytes of `gates` then `recurrence`); otherwise the
    /// recurrence's arguments, launch and arithmetic. `gates_recurrence_pitched`: the same on
    /// evenly pitched slots (`recurrence_pitched`).
    pub struct GatesRecurrence / GatesRecurrenceArgs {
        mixed: In<bf16>,
        ba: In<bf16>,
        a_log: In<bf16>,
        dt_bias: In<bf16>,
        state: InOut<f32>,
        slots: In<i32>,
        out_slots: In<i32>,
        out: Out<bf16>,
        snapshots: OutOpt<f32>,
        keep: InOpt<i32>,
        rows: U32,
        nk: U32,
        dk: U32,
        nv: U32,
        dv: U32,
        num_slots: U32,
        chain: U32,
    }
    grid(a) = recurrence_grid(a.rows, a.nv, a.dv, a.chain);
    GATES_RECURRENCE = "gdn::gates_recurrence" =>
        twin twin::gates_recurrence, emit emit_gates_recurrence;
    GATES_RECURRENCE_PITCHED = "gdn::gates_recurrence_pitched" =>
        twin twin::gates_recurrence_pitched, emit emit_gates_recurrence_pitched;
}

kernel! {
    /// The gated delta rule in chunks of `GDN_CHUNK` rows (Gated DeltaNet's chunked form, the
    /// `gdn_chunked` lever): the recurrence's arguments without snapshots, its values up to
    /// rounding (`differs`). Chunks start at each unit's first row (all rows with `chain` 1, a
    /// run with `chain` 2, a row with `chain` 0). `gdn::chunked_mma` runs the chunks' matrix
    /// products on the tensor cores (TF32; with `tensor_cores` too), launched in
    /// [`chunked_mma_config`].
    pub struct Chunked / ChunkedArgs {
        mixed: In<bf16>,
        beta: In<f32>,
        g: In<f32>,
        state: InOut<f32>,
        slots: In<i32>,
        out_slots: In<i32>,
        out: Out<bf16>,
        rows: U32,
        nk: U32,
        dk: U32,
        nv: U32,
        dv: U32,
        num_slots: U32,
        chain: U32,
    }
    grid(a) = chunked_grid(a.rows, a.dk, a.nv, a.dv, a.chain);
    CHUNKED = "gdn::chunked" => twin twin::chunked, emit emit_chunked;
    CHUNKED_MMA = "gdn::chunked_mma" => twin twin::chunked_mma, emit emit_chunked_mma;
}

kernel! {
    /// `gates` folded into `chunked` (as into `gates_recurrence`): ba, a_log, dt_bias in place
    /// of beta and g.
    pub struct GatesChunked / GatesChunkedArgs {
        mixed: In<bf16>,
        ba: In<bf16>,
        a_log: In<bf16>,
        dt_bias: In<bf16>,
        state: InOut<f32>,
        slots: In<i32>,
        out_slots: In<i32>,
        out: Out<bf16>,
        rows: U32,
        nk: U32,
        dk: U32,
        nv: U32,
        dv: U32,
        num_slots: U32,
        chain: U32,
    }
    grid(a) = chunked_grid(a.rows, a.dk, a.nv, a.dv, a.chain);
    GATES_CHUNKED = "gdn::gates_chunked" => twin twin::gates_chunked, emit emit_gates_chunked;
    GATES_CHUNKED_MMA = "gdn::gates_chunked_mma" =>
        twin twin::gates_chunked_mma, emit emit_gates_chunked_mma;
}

kernel! {
    /// RMSNorm of each v head of core bf16\[rows·nv·dv\] (weight w bf16\[dv\]) times silu(z), z
    /// from qkvz bf16\[rows·nk·G\] → out bf16\[rows·nv·dv\]. One warp per (row, v head).
    pub struct GatedNorm / GatedNormArgs {
        core: In<bf16>,
        qkvz: In<bf16>,
        w: In<bf16>,
        out: Out<bf16>,
        rows: U32,
        nk: U32,
        dk: U32,
        nv: U32,
        dv: U32,
        eps: F32,
    }
    grid(a) = gated_norm_config(a);
    GATED_NORM = "gdn::gated_norm" => twin twin::gated_norm, emit emit_gated_norm;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[
    Conv::DECLS,
    Gates::DECLS,
    Recurrence::DECLS,
    GatesRecurrence::DECLS,
    Chunked::DECLS,
    GatesChunked::DECLS,
    GatedNorm::DECLS,
];
