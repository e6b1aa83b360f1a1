//! `gemv` module (`crates/kernels/cuda/gemv.cu`): projections (weights `\[out\]\[in\]` bf16, f32
//! accumulation) and their fusions with the residual add, RMSNorm, SiLU·mul and the residual
//! epilogue.
//!
//! Files: this one declares the kernels (each `kernel!` with its classic `grid` and its
//! `shape`), `shape` works out every launch shape, `emit` holds the emitters (which launch the
//! declared shape), `quant` the quantized weights' entries and the two emitters that pick a
//! slot's entry by its format, `twin` and `twin_split` the CPU twins, `matvec` the twins' dot
//! driver, `stream` the streaming entries, `split` split-K, `reset` the counters reset, `table`
//! the docs' split-K tables.
//!
//! Two launch shapes per projection kernel, the same arguments, twin and bytes; its declared
//! `shape` picks one per launch (`stream::entry`), rules and plans name only the kernel:
//! - streaming entries (default): `gemv::<kernel>_r1` (decode), `_r2`, `_r4`, `_r8` (up to 2,
//!   4, 8 rows per block), variants of the kernel (`kernels::variants`), each a PTX entry with
//!   its own register budget. `stream_config`: 256 threads; `grid.x` = row groups of the
//!   tile's rows, `grid.y` = feature blocks of 8, capped at `STREAM_BLOCKS` (1056) blocks in
//!   all when k fits the block's stage (16384 elements over the tile's rows), else one block
//!   per 8 features. A block stages its rows' x (and its norm, once) and each warp loops over
//!   its features with the next weight tile in flight.
//! - classic entries (`gemv_classic` lever, for A/B timing): one block of 256 threads (8
//!   warps) per 8 output features (`grid.y`, at most 65535: the kernel strides over the rest)
//!   and per group of 8 input rows (`grid.x`, the fastest index, so the row groups sharing a
//!   weight tile run side by side and read it from L2). Each warp streams one feature's weight
//!   row once per block with 16-byte loads against every row of its group; fused norms
//!   recompute their rows' 1/rms per block.
//!
//! Every projection kernel's last argument, `scratch`, is the split-K scratch (`split`): a
//! streaming launch with few blocks splits each dot's k into grid.z ranges and merges their
//! segment sums in order through it (the unsplit bits); null when unsplit (the classic entry
//! never splits).
//!
//! Static shared memory only (32 KiB of staged x rows). `qkv_rope_kv` has only the classic
//! shape and gives each block one whole head (q, k or v; `grid.y` = heads + 2·kv_heads) so its
//! epilogue can apply qk-norm and rope to the head and write k and v into the paged cache.

mod emit;
pub(crate) use emit::{gate_up, projections, sibling_pair, GateUp, SiblingPair};
pub(crate) mod matvec;
pub mod quant;
#[cfg(test)]
mod quant_emit_tests;
mod reset;
pub mod shape;
pub mod split;
mod table;
#[macro_use]
mod stream;
mod twin;
mod twin_split;

use half::bf16;

use super::decl::{kernel, Name};
use emit::*;
use quant::{emit_linear, emit_lm_head};
use shape::{gemv_config, qkv_features, qkv_heads_config, Dims};

pub use quant::{
    LinearFp8, LinearInt4, LmHeadFp8, LmHeadInt4, FORMAT_ENTRIES, LINEAR_FP8, LINEAR_INT4,
    LM_HEAD_FP8, LM_HEAD_INT4,
};
pub use reset::{counters_reset_launch, CountersReset, ScratchRegions, COUNTERS_RESET};
pub use split::{GEMV_UNSPLIT, SPLIT_TWO_WAVES};
pub use stream::{entry, stage_elems, stages_whole, stream_config, Entry, RowTile, GEMV_CLASSIC};
pub use table::split_table;

kernel! {
    /// x bf16\[rows·k\], w bf16\[n_out·k\], bias bf16\[n_out\]? → y bf16\[rows·n_out\].
    pub struct Linear / LinearArgs {
        x: In<bf16>,
        w: In<bf16>,
        bias: InOpt<bf16>,
        y: Out<bf16>,
        rows: U32,
        k: U32,
        n_out: U32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.n_out as u64, a.rows),
        shape(levers) = shape::projection(LINEAR, a.config(), &LINEAR_STREAM, Dims {
            features: a.n_out as u64, rows: a.rows, k: a.k, nw: 1,
        }, levers);
    LINEAR = "gemv::linear" => twin twin::linear, emit emit_linear;
}

kernel! {
    /// x bf16\[rows·k\], w bf16\[vocab·k\] → logits f32\[rows·vocab\] (also an MoE router's
    /// logits: the same f32-output projection). A row whose `want` flag (i32\[rows\],
    /// optional: every row without it; the step's `MetaField::WantLogits`) is 0 is skipped,
    /// its logits row left as it was.
    pub struct LmHead / LmHeadArgs {
        x: In<bf16>,
        w: In<bf16>,
        logits: Out<f32>,
        want: InOpt<i32>,
        rows: U32,
        k: U32,
        vocab: U32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.vocab as u64, a.rows),
        shape(levers) = shape::projection(LM_HEAD, a.config(), &LM_HEAD_STREAM, Dims {
            features: a.vocab as u64, rows: a.rows, k: a.k, nw: 1,
        }, levers);
    LM_HEAD = "gemv::lm_head" => twin twin::lm_head, emit emit_lm_head;
}

kernel! {
    /// RMSNorm of h f32\[rows·k\] (weight wn bf16\[k\]) then `linear`.
    pub struct NormLinear / NormLinearArgs {
        h: In<f32>,
        wn: In<bf16>,
        w: In<bf16>,
        bias: InOpt<bf16>,
        y: Out<bf16>,
        rows: U32,
        k: U32,
        n_out: U32,
        eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.n_out as u64, a.rows),
        shape(levers) = shape::projection(NORM_LINEAR, a.config(), &NORM_LINEAR_STREAM, Dims {
            features: a.n_out as u64, rows: a.rows, k: a.k, nw: 1,
        }, levers);
    NORM_LINEAR = "gemv::norm_linear" => twin twin::norm_linear, emit emit_norm_linear;
}

kernel! {
    /// The q, k and v projections of one row set: x bf16\[rows·k\] → q bf16\[rows·nq\],
    /// k_out bf16\[rows·nkv\], v bf16\[rows·nkv\].
    pub struct Qkv / QkvArgs {
        x: In<bf16>,
        wq: In<bf16>,
        bq: InOpt<bf16>,
        wk: In<bf16>,
        bk: InOpt<bf16>,
        wv: In<bf16>,
        bv: InOpt<bf16>,
        q: Out<bf16>,
        k_out: Out<bf16>,
        v: Out<bf16>,
        rows: U32,
        k: U32,
        nq: U32,
        nkv: U32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(qkv_features(a.nq, a.nkv), a.rows),
        shape(levers) = shape::projection(QKV, a.config(), &QKV_STREAM, Dims {
            features: qkv_features(a.nq, a.nkv), rows: a.rows, k: a.k, nw: 1,
        }, levers);
    QKV = "gemv::qkv" => twin twin::qkv, emit emit_qkv;
}

kernel! {
    /// Two sibling projections of one row set, of unrelated widths (Gated DeltaNet's
    /// in_proj_qkvz and in_proj_ba): x bf16\[rows·k\] → y1 bf16\[rows·n1\] (w1, b1?), y2
    /// bf16\[rows·n2\] (w2, b2?); each feature's dot, bias and rounding those of `linear`, so
    /// the bytes of two `linear` launches.
    pub struct LinearPair / LinearPairArgs {
        x: In<bf16>,
        w1: In<bf16>,
        b1: InOpt<bf16>,
        w2: In<bf16>,
        b2: InOpt<bf16>,
        y1: Out<bf16>,
        y2: Out<bf16>,
        rows: U32,
        k: U32,
        n1: U32,
        n2: U32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.n1 as u64 + a.n2 as u64, a.rows),
        shape(levers) = shape::projection(LINEAR_PAIR, a.config(), &LINEAR_PAIR_STREAM, Dims {
            features: a.n1 as u64 + a.n2 as u64, rows: a.rows, k: a.k, nw: 1,
        }, levers);
    LINEAR_PAIR = "gemv::linear_pair" => twin twin::linear_pair, emit emit_linear_pair;
}

kernel! {
    /// RMSNorm of h f32\[rows·k\] (weight wn) then `qkv`.
    pub struct NormQkv / NormQkvArgs {
        h: In<f32>,
        wn: In<bf16>,
        wq: In<bf16>,
        bq: InOpt<bf16>,
        wk: In<bf16>,
        bk: InOpt<bf16>,
        wv: In<bf16>,
        bv: InOpt<bf16>,
        q: Out<bf16>,
        k_out: Out<bf16>,
        v: Out<bf16>,
        rows: U32,
        k: U32,
        nq: U32,
        nkv: U32,
        eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(qkv_features(a.nq, a.nkv), a.rows),
        shape(levers) = shape::projection(NORM_QKV, a.config(), &NORM_QKV_STREAM, Dims {
            features: qkv_features(a.nq, a.nkv), rows: a.rows, k: a.k, nw: 1,
        }, levers);
    NORM_QKV = "gemv::norm_qkv" => twin twin::norm_qkv, emit emit_norm_qkv;
}

kernel! {
    /// h f32 + d bf16 (→ h_out f32, optional), RMSNorm (weight wn), then `qkv`.
    pub struct AddNormQkv / AddNormQkvArgs {
        h: In<f32>,
        d: In<bf16>,
        wn: In<bf16>,
        wq: In<bf16>,
        bq: InOpt<bf16>,
        wk: In<bf16>,
        bk: InOpt<bf16>,
        wv: In<bf16>,
        bv: InOpt<bf16>,
        h_out: OutOpt<f32>,
        q: Out<bf16>,
        k_out: Out<bf16>,
        v: Out<bf16>,
        rows: U32,
        k: U32,
        nq: U32,
        nkv: U32,
        eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(qkv_features(a.nq, a.nkv), a.rows),
        shape(levers) = shape::projection(ADD_NORM_QKV, a.config(), &ADD_NORM_QKV_STREAM, Dims {
            features: qkv_features(a.nq, a.nkv), rows: a.rows, k: a.k, nw: 1,
        }, levers);
    ADD_NORM_QKV = "gemv::add_norm_qkv" => twin twin::add_norm_qkv, emit emit_add_norm_qkv;
}

kernel! {
    /// Gate and up projections (wg, wu bf16\[inter·k\]) of x bf16\[rows·k\], then
    /// act bf16\[rows·inter\] = silu(gate) · up.
    pub struct GateUpSilu / GateUpSiluArgs {
        x: In<bf16>,
        wg: In<bf16>,
        wu: In<bf16>,
        act: Out<bf16>,
        rows: U32,
        k: U32,
        inter: U32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.inter as u64, a.rows),
        shape(levers) = shape::projection(GATE_UP_SILU, a.config(), &GATE_UP_SILU_STREAM, Dims {
            features: a.inter as u64, rows: a.rows, k: a.k, nw: 2,
        }, levers);
    GATE_UP_SILU = "gemv::gate_up_silu" => twin twin::gate_up_silu, emit emit_gate_up_silu;
}

kernel! {
    /// RMSNorm of h f32\[rows·k\] (weight wn) then `gate_up_silu`.
    pub struct NormGateUpSilu / NormGateUpSiluArgs {
        h: In<f32>,
        wn: In<bf16>,
        wg: In<bf16>,
        wu: In<bf16>,
        act: Out<bf16>,
        rows: U32,
        k: U32,
        inter: U32,
        eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.inter as u64, a.rows),
        shape(levers) = shape::projection(NORM_GATE_UP_SILU, a.config(), &NORM_GATE_UP_SILU_STREAM, Dims {
            features: a.inter as u64, rows: a.rows, k: a.k, nw: 2,
        }, levers);
    NORM_GATE_UP_SILU = "gemv::norm_gate_up_silu" =>
        twin twin::norm_gate_up_silu, emit emit_norm_gate_up_silu;
}

kernel! {
    /// h f32 + o bf16 (→ h_out f32, optional), RMSNorm (weight wn), then `gate_up_silu`.
    pub struct AddNormGateUpSilu / AddNormGateUpSiluArgs {
        h: In<f32>,
        o: In<bf16>,
        wn: In<bf16>,
        wg: In<bf16>,
        wu: In<bf16>,
        h_out: OutOpt<f32>,
        act: Out<bf16>,
        rows: U32,
        k: U32,
        inter: U32,
        eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.inter as u64, a.rows),
        shape(levers) = shape::projection(ADD_NORM_GATE_UP_SILU, a.config(), &ADD_NORM_GATE_UP_SILU_STREAM, Dims {
            features: a.inter as u64, rows: a.rows, k: a.k, nw: 2,
        }, levers);
    ADD_NORM_GATE_UP_SILU = "gemv::add_norm_gate_up_silu" =>
        twin twin::add_norm_gate_up_silu, emit emit_add_norm_gate_up_silu;
}

kernel! {
    /// `linear` of x bf16\[rows·k\], then h_out f32\[rows·n_out\] = h f32 + the bf16 projection.
    pub struct LinearResidualAdd / LinearResidualAddArgs {
        x: In<bf16>,
        w: In<bf16>,
        bias: InOpt<bf16>,
        h: In<f32>,
        h_out: Out<f32>,
        rows: U32,
        k: U32,
        n_out: U32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.n_out as u64, a.rows),
        shape(levers) = shape::projection(LINEAR_RESIDUAL_ADD, a.config(), &LINEAR_RESIDUAL_ADD_STREAM, Dims {
            features: a.n_out as u64, rows: a.rows, k: a.k, nw: 1,
        }, levers);
    LINEAR_RESIDUAL_ADD = "gemv::linear_residual_add" =>
        twin twin::linear_residual_add, emit emit_linear_residual_add;
}

kernel! {
    /// Gated DeltaNet's `gdn::gated_norm` (each v head of core bf16\[rows·nv·dv\] RMS-normed
    /// with wn bf16\[dv\], times silu(z) from qkvz bf16\[rows·nk·G\]) staged as x, then
    /// `linear_residual_add` over k = nv·dv: the bytes of `gdn::gated_norm` then
    /// `gemv::linear_residual_add`. At most 128 v heads (gemv.cu `GEMV_GATED_HEADS`).
    pub struct GatedNormLinearResidualAdd / GatedNormLinearResidualAddArgs {
        core: In<bf16>,
        qkvz: In<bf16>,
        wn: In<bf16>,
        w: In<bf16>,
        bias: InOpt<bf16>,
        h: In<f32>,
        h_out: Out<f32>,
        rows: U32,
        nk: U32,
        dk: U32,
        nv: U32,
        dv: U32,
        k: U32,
        n_out: U32,
        eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.n_out as u64, a.rows),
        shape(levers) = shape::projection(GATED_NORM_LINEAR_RESIDUAL_ADD, a.config(), &GATED_NORM_LINEAR_RESIDUAL_ADD_STREAM, Dims {
            features: a.n_out as u64, rows: a.rows, k: a.k, nw: 1,
        }, levers);
    GATED_NORM_LINEAR_RESIDUAL_ADD = "gemv::gated_norm_linear_residual_add" =>
        twin twin::gated_norm_linear_residual_add, emit emit_gated_norm_linear_residual_add;
}

/// The most v heads `gemv::gated_norm_linear_residual_add` normalises (`GEMV_GATED_HEADS`).
pub const GATED_HEADS_MAX: u32 = 128;

kernel! {
    /// h f32 + d bf16, RMSNorm (weight wn bf16\[k\]), then `lm_head` → logits f32\[rows·vocab\]
    /// (its `want` flags too).
    pub struct AddNormLmHead / AddNormLmHeadArgs {
        h: In<f32>,
        d: In<bf16>,
        wn: In<bf16>,
        w: In<bf16>,
        logits: Out<f32>,
        want: InOpt<i32>,
        rows: U32,
        k: U32,
        vocab: U32,
        eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.vocab as u64, a.rows),
        shape(levers) = shape::projection(ADD_NORM_LM_HEAD, a.config(), &ADD_NORM_LM_HEAD_STREAM, Dims {
            features: a.vocab as u64, rows: a.rows, k: a.k, nw: 1,
        }, levers);
    ADD_NORM_LM_HEAD = "gemv::add_norm_lm_head" =>
        twin twin::add_norm_lm_head, emit emit_add_norm_lm_head;
}

/// The widest head `gemv::qkv_rope_kv` stages (`GEMV_HEAD_DIM_MAX` in gemv.cu).
pub(crate) const HEAD_DIM_MAX: u32 = 256;

kernel! {
    /// (h f32 + d bf16 when d is present → h_out f32, optional), RMSNorm (weight wn), the q/k/v
    /// projections, then per head rope (after qk-norm with qwn, kwn when present) at each row's
    /// position: q into q_out, k and v into their slots of the paged cache, as
    /// `rope::rope_kv_write` / `rope::qk_norm_rope_kv_write` store them.
    pub struct QkvRopeKv / QkvRopeKvArgs {
        h: In<f32>,
        d: InOpt<bf16>,
        wn: In<bf16>,
        wq: In<bf16>,
        bq: InOpt<bf16>,
        wk: In<bf16>,
        bk: InOpt<bf16>,
        wv: In<bf16>,
        bv: InOpt<bf16>,
        qwn: InOpt<bf16>,
        kwn: InOpt<bf16>,
        positions: In<i32>,
        inv_freq: In<f32>,
        slot_mapping: In<i32>,
        h_out: OutOpt<f32>,
        q_out: Out<bf16>,
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
        qk_eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = qkv_heads_config(a.rows, a.heads, a.kv_heads),
        shape(levers) = shape::heads(a, levers);
    QKV_ROPE_KV = "gemv::qkv_rope_kv" => twin twin::qkv_rope_kv, emit emit_qkv_rope_kv;
}

streaming! {
    LINEAR_STREAM: Linear = "gemv::linear";
    LM_HEAD_STREAM: LmHead = "gemv::lm_head";
    NORM_LINEAR_STREAM: NormLinear = "gemv::norm_linear";
    QKV_STREAM: Qkv = "gemv::qkv";
    LINEAR_PAIR_STREAM: LinearPair = "gemv::linear_pair";
    NORM_QKV_STREAM: NormQkv = "gemv::norm_qkv";
    ADD_NORM_QKV_STREAM: AddNormQkv = "gemv::add_norm_qkv";
    GATE_UP_SILU_STREAM: GateUpSilu = "gemv::gate_up_silu";
    NORM_GATE_UP_SILU_STREAM: NormGateUpSilu = "gemv::norm_gate_up_silu";
    ADD_NORM_GATE_UP_SILU_STREAM: AddNormGateUpSilu = "gemv::add_norm_gate_up_silu";
    LINEAR_RESIDUAL_ADD_STREAM: LinearResidualAdd = "gemv::linear_residual_add";
    GATED_NORM_LINEAR_RESIDUAL_ADD_STREAM: GatedNormLinearResidualAdd =
        "gemv::gated_norm_linear_residual_add";
    ADD_NORM_LM_HEAD_STREAM: AddNormLmHead = "gemv::add_norm_lm_head";
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[
    Linear::DECLS,
    LmHead::DECLS,
    NormLinear::DECLS,
    Qkv::DECLS,
    LinearPair::DECLS,
    NormQkv::DECLS,
    AddNormQkv::DECLS,
    GateUpSilu::DECLS,
    NormGateUpSilu::DECLS,
    AddNormGateUpSilu::DECLS,
    LinearResidualAdd::DECLS,
    GatedNormLinearResidualAdd::DECLS,
    AddNormLmHead::DECLS,
    QkvRopeKv::DECLS,
    quant::LinearFp8::DECLS,
    quant::LinearInt4::DECLS,
    quant::LmHeadFp8::DECLS,
    quant::LmHeadInt4::DECLS,
    reset::CountersReset::DECLS,
];

/// The lever that launches `qkv_rope_kv` as its `_ahead` entry (A/B timing; the same bytes).
pub const QKV_NORM_AHEAD: &str = "qkv_norm_ahead";

/// `qkv_rope_kv` with its block's weight rows asked of L2 before `pdl_wait` and the rows'
/// 1/rms from one pass of independent loads into shared memory (gemv.cu `qkv_rope_kv_body`,
/// AHEAD), where the classic entry walks the row with one dependent load per 32 elements
/// before any weight is in flight: the same arguments, twin and bytes (`row_inv_rms`'s order).
pub const QKV_ROPE_KV_AHEAD: Name<QkvRopeKv> = Name::new("gemv::qkv_rope_kv_ahead");

/// Entries of `qkv_rope_kv` besides its own, with the kernel they are variants of.
pub(super) const HEAD_VARIANTS: &[(&str, &str)] =
    &[(QKV_ROPE_KV_AHEAD.as_str(), QKV_ROPE_KV.as_str())];
