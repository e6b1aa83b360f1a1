//! `gemv` module (`crates/kernels/cuda/gemv.cu`): projections (weights `[out][in]` bf16, f32
//! accumulation) and their fusions with the residual add, RMSNorm, SiLU·mul and the residual
//! epilogue.
//!
//! Two launch shapes per projection kernel, the same arguments, twin and bytes; the emitter
//! picks one per launch (`stream::entry`), rules and plans name only the kernel:
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

pub(crate) mod matvec;
mod reset;
pub mod split;
#[macro_use]
mod stream;
mod twin;

use half::bf16;
use solder_circuit::ir::{MetaField, Op};
use solder_circuit::OpKind;
use solder_gpu_runtime::LaunchConfig;

use super::decl::{kernel, Name};
use super::Buf;
use crate::emit::{View, R};
use crate::error::ExecError;

pub use reset::{counters_reset_launch, CountersReset, COUNTERS_RESET};
pub use split::{GEMV_UNSPLIT, SPLIT_RESIDENT};
pub use stream::{entry, stage_elems, stages_whole, stream_config, Entry, RowTile, GEMV_CLASSIC};

/// Output features per block (one warp each).
const FEATURES_PER_BLOCK: u32 = 8;
/// Input rows per block.
const ROWS_PER_BLOCK: u32 = 8;
/// The most blocks `grid.y` may hold.
const MAX_GRID_Y: u64 = 65_535;

fn gemv_config(features: u64, rows: u32) -> LaunchConfig {
    let feature_blocks = features
        .div_ceil(FEATURES_PER_BLOCK as u64)
        .clamp(1, MAX_GRID_Y) as u32;
    LaunchConfig {
        grid: [rows.div_ceil(ROWS_PER_BLOCK).max(1), feature_blocks, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

fn qkv_features(nq: u32, nkv: u32) -> u64 {
    nq as u64 + 2 * nkv as u64
}

kernel! {
    /// x bf16[rows·k], w bf16[n_out·k], bias bf16[n_out]? → y bf16[rows·n_out].
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
    grid(a) = gemv_config(a.n_out as u64, a.rows);
    LINEAR = "gemv::linear" => twin twin::linear, emit emit_linear;
}

kernel! {
    /// x bf16[rows·k], w bf16[vocab·k] → logits f32[rows·vocab] (also an MoE router's
    /// logits: the same f32-output projection).
    pub struct LmHead / LmHeadArgs {
        x: In<bf16>,
        w: In<bf16>,
        logits: Out<f32>,
        rows: U32,
        k: U32,
        vocab: U32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.vocab as u64, a.rows);
    LM_HEAD = "gemv::lm_head" => twin twin::lm_head, emit emit_lm_head;
}

kernel! {
    /// RMSNorm of h f32[rows·k] (weight wn bf16[k]) then `linear`.
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
    grid(a) = gemv_config(a.n_out as u64, a.rows);
    NORM_LINEAR = "gemv::norm_linear" => twin twin::norm_linear, emit emit_norm_linear;
}

kernel! {
    /// The q, k and v projections of one row set: x bf16[rows·k] → q bf16[rows·nq],
    /// k_out bf16[rows·nkv], v bf16[rows·nkv].
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
    grid(a) = gemv_config(qkv_features(a.nq, a.nkv), a.rows);
    QKV = "gemv::qkv" => twin twin::qkv, emit emit_qkv;
}

kernel! {
    /// RMSNorm of h f32[rows·k] (weight wn) then `qkv`.
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
    grid(a) = gemv_config(qkv_features(a.nq, a.nkv), a.rows);
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
    grid(a) = gemv_config(qkv_features(a.nq, a.nkv), a.rows);
    ADD_NORM_QKV = "gemv::add_norm_qkv" => twin twin::add_norm_qkv, emit emit_add_norm_qkv;
}

kernel! {
    /// Gate and up projections (wg, wu bf16[inter·k]) of x bf16[rows·k], then
    /// act bf16[rows·inter] = silu(gate) · up.
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
    grid(a) = gemv_config(a.inter as u64, a.rows);
    GATE_UP_SILU = "gemv::gate_up_silu" => twin twin::gate_up_silu, emit emit_gate_up_silu;
}

kernel! {
    /// RMSNorm of h f32[rows·k] (weight wn) then `gate_up_silu`.
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
    grid(a) = gemv_config(a.inter as u64, a.rows);
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
    grid(a) = gemv_config(a.inter as u64, a.rows);
    ADD_NORM_GATE_UP_SILU = "gemv::add_norm_gate_up_silu" =>
        twin twin::add_norm_gate_up_silu, emit emit_add_norm_gate_up_silu;
}

kernel! {
    /// `linear` of x bf16[rows·k], then h_out f32[rows·n_out] = h f32 + the bf16 projection.
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
    grid(a) = gemv_config(a.n_out as u64, a.rows);
    LINEAR_RESIDUAL_ADD = "gemv::linear_residual_add" =>
        twin twin::linear_residual_add, emit emit_linear_residual_add;
}

kernel! {
    /// h f32 + d bf16, RMSNorm (weight wn bf16[k]), then `lm_head` → logits f32[rows·vocab].
    pub struct AddNormLmHead / AddNormLmHeadArgs {
        h: In<f32>,
        d: In<bf16>,
        wn: In<bf16>,
        w: In<bf16>,
        logits: Out<f32>,
        rows: U32,
        k: U32,
        vocab: U32,
        eps: F32,
        scratch: InOutOpt<f32>,
    }
    grid(a) = gemv_config(a.vocab as u64, a.rows);
    ADD_NORM_LM_HEAD = "gemv::add_norm_lm_head" =>
        twin twin::add_norm_lm_head, emit emit_add_norm_lm_head;
}

/// The widest head `gemv::qkv_rope_kv` stages (`GEMV_HEAD_DIM_MAX` in gemv.cu).
pub(crate) const HEAD_DIM_MAX: u32 = 256;

/// One block per group of 8 rows (`grid.x`) and per head (`grid.y`: q heads, then k heads, then
/// v heads), each owning the whole head.
fn qkv_heads_config(rows: u32, heads: u32, kv_heads: u32) -> LaunchConfig {
    let blocks = (heads as u64 + 2 * kv_heads as u64).clamp(1, MAX_GRID_Y) as u32;
    LaunchConfig {
        grid: [rows.div_ceil(ROWS_PER_BLOCK).max(1), blocks, 1],
        block: [256, 1, 1],
        shared_bytes: 0,
    }
}

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
    grid(a) = qkv_heads_config(a.rows, a.heads, a.kv_heads);
    QKV_ROPE_KV = "gemv::qkv_rope_kv" => twin twin::qkv_rope_kv, emit emit_qkv_rope_kv;
}

streaming! {
    LINEAR_STREAM: Linear = "gemv::linear";
    LM_HEAD_STREAM: LmHead = "gemv::lm_head";
    NORM_LINEAR_STREAM: NormLinear = "gemv::norm_linear";
    QKV_STREAM: Qkv = "gemv::qkv";
    NORM_QKV_STREAM: NormQkv = "gemv::norm_qkv";
    ADD_NORM_QKV_STREAM: AddNormQkv = "gemv::add_norm_qkv";
    GATE_UP_SILU_STREAM: GateUpSilu = "gemv::gate_up_silu";
    NORM_GATE_UP_SILU_STREAM: NormGateUpSilu = "gemv::norm_gate_up_silu";
    ADD_NORM_GATE_UP_SILU_STREAM: AddNormGateUpSilu = "gemv::add_norm_gate_up_silu";
    LINEAR_RESIDUAL_ADD_STREAM: LinearResidualAdd = "gemv::linear_residual_add";
    ADD_NORM_LM_HEAD_STREAM: AddNormLmHead = "gemv::add_norm_lm_head";
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[
    Linear::DECLS,
    LmHead::DECLS,
    NormLinear::DECLS,
    Qkv::DECLS,
    NormQkv::DECLS,
    AddNormQkv::DECLS,
    GateUpSilu::DECLS,
    NormGateUpSilu::DECLS,
    AddNormGateUpSilu::DECLS,
    LinearResidualAdd::DECLS,
    AddNormLmHead::DECLS,
    QkvRopeKv::DECLS,
    reset::CountersReset::DECLS,
];

// ---- emitters ------------------------------------------------------------------------------

fn emit_linear(v: &View<'_>) -> R {
    let l = v.op(OpKind::Linear, None)?;
    let args = Linear {
        x: v.input(l, 0)?,
        w: v.weight(l, 0)?,
        bias: v.weight_opt(l, 1),
        y: v.output(l, 0)?,
        rows: v.rows(),
        k: v.u32(l, "in")?,
        n_out: v.u32(l, "out")?,
        scratch: None,
    };
    Ok(vec![
        gemv_launch!(v, args, LINEAR, LINEAR_STREAM, a => a.n_out as u64),
    ])
}

fn emit_lm_head(v: &View<'_>) -> R {
    // The LM head and an MoE router are the same f32-output projection.
    let (h, vocab) = match v.op(OpKind::LmHead, None) {
        Ok(h) => (h, v.u32(h, "vocab")?),
        Err(_) => {
            let r = v.op(OpKind::Router, None)?;
            (r, v.u32(r, "experts")?)
        }
    };
    let args = LmHead {
        x: v.input(h, 0)?,
        w: v.weight(h, 0)?,
        logits: v.output(h, 0)?,
        rows: v.rows(),
        k: v.u32(h, "hidden")?,
        vocab,
        scratch: None,
    };
    Ok(vec![
        gemv_launch!(v, args, LM_HEAD, LM_HEAD_STREAM, a => a.vocab as u64),
    ])
}

fn emit_norm_linear(v: &View<'_>) -> R {
    let (n, l) = (v.op(OpKind::RmsNorm, None)?, v.op(OpKind::Linear, None)?);
    let args = NormLinear {
        h: v.input(n, 0)?,
        wn: v.weight(n, 0)?,
        w: v.weight(l, 0)?,
        bias: v.weight_opt(l, 1),
        y: v.output(l, 0)?,
        rows: v.rows(),
        k: v.u32(l, "in")?,
        n_out: v.u32(l, "out")?,
        eps: v.f32(n, "eps")?,
        scratch: None,
    };
    Ok(vec![
        gemv_launch!(v, args, NORM_LINEAR, NORM_LINEAR_STREAM, a => a.n_out as u64),
    ])
}

/// The q/k/v projections of a group (`q_proj`, `k_proj`, `v_proj` linears): the arguments
/// every qkv kernel takes after its input.
struct Projections<'a> {
    q_op: &'a Op,
    w: [Buf; 3],
    bias: [Option<Buf>; 3],
    ops: [&'a Op; 3],
    k: u32,
    nq: u32,
    nkv: u32,
}

fn projections<'a>(v: &View<'a>) -> Result<Projections<'a>, ExecError> {
    let mut ops = Vec::with_capacity(3);
    for role in ["q_proj", "k_proj", "v_proj"] {
        ops.push(v.op(OpKind::Linear, Some(role))?);
    }
    let (q, k, vp) = (ops[0], ops[1], ops[2]);
    Ok(Projections {
        q_op: q,
        w: [v.weight(q, 0)?, v.weight(k, 0)?, v.weight(vp, 0)?],
        bias: [v.weight_opt(q, 1), v.weight_opt(k, 1), v.weight_opt(vp, 1)],
        ops: [q, k, vp],
        k: v.u32(q, "in")?,
        nq: v.u32(q, "out")?,
        nkv: v.u32(k, "out")?,
    })
}

impl Projections<'_> {
    /// The q, k and v buffers (the plain qkv kernels store them).
    fn outputs(&self, v: &View<'_>) -> Result<[Buf; 3], ExecError> {
        let [q, k, vp] = self.ops;
        Ok([v.output(q, 0)?, v.output(k, 0)?, v.output(vp, 0)?])
    }
}

fn emit_qkv(v: &View<'_>) -> R {
    let p = projections(v)?;
    let (rows, [wq, wk, wv], [bq, bk, bv], [q, k_out, vo]) = (v.rows(), p.w, p.bias, p.outputs(v)?);
    let x = v.input(p.q_op, 0)?;
    let (k, nq, nkv) = (p.k, p.nq, p.nkv);
    let a = Qkv {
        x,
        wq,
        bq,
        wk,
        bk,
        wv,
        bv,
        q,
        k_out,
        v: vo,
        rows,
        k,
        nq,
        nkv,
        scratch: None,
    };
    Ok(vec![
        gemv_launch!(v, a, QKV, QKV_STREAM, a => qkv_features(a.nq, a.nkv)),
    ])
}

fn emit_norm_qkv(v: &View<'_>) -> R {
    let (p, n) = (projections(v)?, v.op(OpKind::RmsNorm, None)?);
    let (rows, [wq, wk, wv], [bq, bk, bv], [q, k_out, vo]) = (v.rows(), p.w, p.bias, p.outputs(v)?);
    let (h, wn, eps) = (v.input(n, 0)?, v.weight(n, 0)?, v.f32(n, "eps")?);
    let (k, nq, nkv) = (p.k, p.nq, p.nkv);
    let a = NormQkv {
        h,
        wn,
        wq,
        bq,
        wk,
        bk,
        wv,
        bv,
        q,
        k_out,
        v: vo,
        rows,
        k,
        nq,
        nkv,
        eps,
        scratch: None,
    };
    Ok(vec![
        gemv_launch!(v, a, NORM_QKV, NORM_QKV_STREAM, a => qkv_features(a.nq, a.nkv)),
    ])
}

fn emit_add_norm_qkv(v: &View<'_>) -> R {
    let p = projections(v)?;
    let (a, n) = (
        v.op(OpKind::ResidualAdd, None)?,
        v.op(OpKind::RmsNorm, None)?,
    );
    let (rows, [wq, wk, wv], [bq, bk, bv], [q, k_out, vo]) = (v.rows(), p.w, p.bias, p.outputs(v)?);
    let (h, d, h_out) = (v.input(a, 0)?, v.input(a, 1)?, v.output_opt(a, 0)?);
    let (wn, eps) = (v.weight(n, 0)?, v.f32(n, "eps")?);
    let (k, nq, nkv) = (p.k, p.nq, p.nkv);
    let args = AddNormQkv {
        h,
        d,
        wn,
        wq,
        bq,
        wk,
        bk,
        wv,
        bv,
        h_out,
        q,
        k_out,
        v: vo,
        rows,
        k,
        nq,
        nkv,
        eps,
        scratch: None,
    };
    Ok(vec![gemv_launch!(
        v,
        args,
        ADD_NORM_QKV,
        ADD_NORM_QKV_STREAM,
        a => qkv_features(a.nq, a.nkv)
    )])
}

/// Gate and up are the projections feeding SiLU·mul's first and second input: their weights,
/// the activation output, the input width and the intermediate width.
struct GateUp<'a> {
    gate: &'a Op,
    wg: Buf,
    wu: Buf,
    act: Buf,
    k: u32,
    inter: u32,
}

fn gate_up<'a>(v: &View<'a>) -> Result<GateUp<'a>, ExecError> {
    let s = v.op(OpKind::SiluMul, None)?;
    let (g, u) = (v.producer_in_group(s, 0)?, v.producer_in_group(s, 1)?);
    Ok(GateUp {
        gate: g,
        wg: v.weight(g, 0)?,
        wu: v.weight(u, 0)?,
        act: v.output(s, 0)?,
        k: v.u32(g, "in")?,
        inter: v.u32(g, "out")?,
    })
}

fn emit_gate_up_silu(v: &View<'_>) -> R {
    let GateUp {
        gate,
        wg,
        wu,
        act,
        k,
        inter,
    } = gate_up(v)?;
    let x = v.input(gate, 0)?;
    let a = GateUpSilu {
        x,
        wg,
        wu,
        act,
        rows: v.rows(),
        k,
        inter,
        scratch: None,
    };
    Ok(vec![
        gemv_launch!(v, a, GATE_UP_SILU, GATE_UP_SILU_STREAM, a => a.inter as u64, nw 2),
    ])
}

fn emit_norm_gate_up_silu(v: &View<'_>) -> R {
    let (
        GateUp {
            wg,
            wu,
            act,
            k,
            inter,
            ..
        },
        n,
    ) = (gate_up(v)?, v.op(OpKind::RmsNorm, None)?);
    let (h, wn, eps) = (v.input(n, 0)?, v.weight(n, 0)?, v.f32(n, "eps")?);
    let a = NormGateUpSilu {
        h,
        wn,
        wg,
        wu,
        act,
        rows: v.rows(),
        k,
        inter,
        eps,
        scratch: None,
    };
    Ok(vec![gemv_launch!(
        v,
        a,
        NORM_GATE_UP_SILU,
        NORM_GATE_UP_SILU_STREAM,
        a => a.inter as u64,
        nw 2
    )])
}

fn emit_add_norm_gate_up_silu(v: &View<'_>) -> R {
    let GateUp {
        wg,
        wu,
        act,
        k,
        inter,
        ..
    } = gate_up(v)?;
    let (a, n) = (
        v.op(OpKind::ResidualAdd, None)?,
        v.op(OpKind::RmsNorm, None)?,
    );
    let (h, o, h_out) = (v.input(a, 0)?, v.input(a, 1)?, v.output_opt(a, 0)?);
    let (wn, eps) = (v.weight(n, 0)?, v.f32(n, "eps")?);
    let rows = v.rows();
    let args = AddNormGateUpSilu {
        h,
        o,
        wn,
        wg,
        wu,
        h_out,
        act,
        rows,
        k,
        inter,
        eps,
        scratch: None,
    };
    Ok(vec![gemv_launch!(
        v,
        args,
        ADD_NORM_GATE_UP_SILU,
        ADD_NORM_GATE_UP_SILU_STREAM,
        a => a.inter as u64,
        nw 2
    )])
}

fn emit_linear_residual_add(v: &View<'_>) -> R {
    let (l, a) = (
        v.op(OpKind::Linear, None)?,
        v.op(OpKind::ResidualAdd, None)?,
    );
    let args = LinearResidualAdd {
        x: v.input(l, 0)?,
        w: v.weight(l, 0)?,
        bias: v.weight_opt(l, 1),
        h: v.input(a, 0)?,
        h_out: v.output(a, 0)?,
        rows: v.rows(),
        k: v.u32(l, "in")?,
        n_out: v.u32(l, "out")?,
        scratch: None,
    };
    Ok(vec![gemv_launch!(
        v,
        args,
        LINEAR_RESIDUAL_ADD,
        LINEAR_RESIDUAL_ADD_STREAM,
        a => a.n_out as u64
    )])
}

fn emit_add_norm_lm_head(v: &View<'_>) -> R {
    let (a, n, h) = (
        v.op(OpKind::ResidualAdd, None)?,
        v.op(OpKind::RmsNorm, None)?,
        v.op(OpKind::LmHead, None)?,
    );
    let args = AddNormLmHead {
        h: v.input(a, 0)?,
        d: v.input(a, 1)?,
        wn: v.weight(n, 0)?,
        w: v.weight(h, 0)?,
        logits: v.output(h, 0)?,
        rows: v.rows(),
        k: v.u32(h, "hidden")?,
        vocab: v.u32(h, "vocab")?,
        eps: v.f32(n, "eps")?,
        scratch: None,
    };
    Ok(vec![gemv_launch!(
        v,
        args,
        ADD_NORM_LM_HEAD,
        ADD_NORM_LM_HEAD_STREAM,
        a => a.vocab as u64
    )])
}

/// Every variant of the q/k/v-with-rope rules: the residual add when the group has one, the
/// input norm, the projections, qk-norm when the group has one, rope and the KV write.
fn emit_qkv_rope_kv(v: &View<'_>) -> R {
    let p = projections(v)?;
    let n = v.op(OpKind::RmsNorm, None)?;
    let (r, w) = (v.op(OpKind::Rope, None)?, v.op(OpKind::KvWrite, None)?);
    let (h, d, h_out) = if v.has(OpKind::ResidualAdd) {
        let a = v.op(OpKind::ResidualAdd, None)?;
        (v.input(a, 0)?, Some(v.input(a, 1)?), v.output_opt(a, 0)?)
    } else {
        (v.input(n, 0)?, None, None)
    };
    let (qwn, kwn, qk_eps) = if v.has(OpKind::QkNorm) {
        let qn = v.op(OpKind::QkNorm, None)?;
        (
            Some(v.weight(qn, 0)?),
            Some(v.weight(qn, 1)?),
            v.f32(qn, "eps")?,
        )
    } else {
        (None, None, 0.0)
    };
    let head_dim = v.u32(r, "head_dim")?;
    if head_dim > HEAD_DIM_MAX {
        return Err(v.err(format!(
            "head_dim {head_dim} is wider than the {HEAD_DIM_MAX} a block stages"
        )));
    }
    let (rows, [wq, wk, wv], [bq, bk, bv]) = (v.rows(), p.w, p.bias);
    let args = QkvRopeKv {
        h,
        d,
        wn: v.weight(n, 0)?,
        wq,
        bq,
        wk,
        bk,
        wv,
        bv,
        qwn,
        kwn,
        positions: v.meta(MetaField::Positions),
        inv_freq: v.inv_freq(),
        slot_mapping: v.meta(MetaField::SlotMapping),
        h_out,
        q_out: v.output(r, 0)?,
        cache: v.state_of(w.outputs[0])?,
        rows,
        k: p.k,
        heads: v.u32(r, "heads")?,
        kv_heads: v.u32(r, "kv_heads")?,
        head_dim,
        rotary_dim: v.u32(r, "rotary_dim")?,
        block_size: v.kv_block_size(),
        num_pages: v.kv_pages(),
        eps: v.f32(n, "eps")?,
        qk_eps,
        scratch: None,
    };
    Ok(vec![head_split_launch(v, args)])
}

/// `qkv_rope_kv`'s launch: each head split into `split::head_parts` blocks through the group's
/// stream's scratch slot, unless lever `gemv_unsplit` is on or the slot cannot hold it.
fn head_split_launch(v: &View<'_>, mut args: QkvRopeKv) -> super::Launch {
    let mut config = args.config();
    if !v.lever(split::GEMV_UNSPLIT) {
        let features = qkv_features(args.heads, args.kv_heads) * args.head_dim as u64;
        let sizing = split::Sizing::of(v.lever(split::SPLIT_RESIDENT));
        let parts = split::head_parts(config.grid, args.rows, features, args.head_dim, sizing);
        let words = split::head_scratch_words(config.grid, args.rows, features);
        if let (true, Some(words)) = (parts > 1, words) {
            if let Some(scratch) = v.gemv_scratch(words * 4) {
                args.scratch = Some(scratch);
                config.grid[1] *= parts;
            }
        }
    }
    let entry = if v.lever(QKV_NORM_AHEAD) {
        QKV_ROPE_KV_AHEAD
    } else {
        QKV_ROPE_KV
    };
    args.launch_with(entry, config)
}

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
