//! gemv's emitters: a plan group → its one launch, in the shape its declaration answers
//! (`shape`), with the stream's split-K scratch slot when the shape splits (a slot too small
//! for it is an error naming the kernel and both sizes, never an unsplit launch).

use solder_circuit::ir::{MetaField, Op, WeightSlot};
use solder_circuit::{OpKind, WeightFormat};
use solder_config::Levers;

use super::*;
use crate::error::ExecError;
use crate::kernels::decl::Shape;
use crate::kernels::emit_view::{View, R};
use crate::kernels::{Buf, Launch};

/// A gemv kernel's arguments: their declared shape, and where the split scratch goes.
pub(super) trait Split: Sized {
    fn shape(&self, levers: &Levers) -> Shape<Self>;
    fn set_scratch(&mut self, scratch: Buf);
    fn launch_in(self, shape: Shape<Self>) -> Launch;
}

macro_rules! split_args {
    ($($kind:ident),+ $(,)?) => {$(
        impl Split for $kind {
            fn shape(&self, levers: &Levers) -> Shape<Self> {
                $kind::shape(self, levers)
            }

            fn set_scratch(&mut self, scratch: Buf) {
                self.scratch = Some(scratch);
            }

            fn launch_in(self, shape: Shape<Self>) -> Launch {
                $kind::launch_in(self, shape)
            }
        }
    )+};
}

split_args!(
    Linear,
    LmHead,
    NormLinear,
    Qkv,
    LinearPair,
    NormQkv,
    AddNormQkv,
    GateUpSilu,
    NormGateUpSilu,
    AddNormGateUpSilu,
    LinearResidualAdd,
    GatedNormLinearResidualAdd,
    AddNormLmHead,
    QkvRopeKv,
);

/// The launch of `args` in the shape their declaration answers under the build's levers; an
/// error when a weight of the group is not bf16 (these entries read bf16 only).
pub(super) fn launch<K: Split>(v: &View<'_>, mut args: K) -> Result<Launch, ExecError> {
    let shape = args.shape(v.levers());
    if let Some(slot) = v.weight_slots().find(|s| s.format != WeightFormat::Bf16) {
        return Err(no_entry(v, shape.entry.as_str(), slot));
    }
    if shape.scratch_bytes > 0 {
        let entry = shape.entry.as_str();
        args.set_scratch(v.gemv_scratch(entry, shape.splits, shape.scratch_bytes)?);
    }
    Ok(args.launch_in(shape))
}

/// The error of a kernel (`entry`) launched on a weight slot whose format it has no entry for:
/// never a bf16 read of quantized bytes.
fn no_entry(v: &View<'_>, entry: &str, slot: &WeightSlot) -> ExecError {
    let kernel = crate::kernels::variant_of(entry).unwrap_or(entry);
    v.err(format!(
        "weight `{}` is stored as {} ({}), but `{kernel}` reads only {}",
        slot.name,
        slot.format,
        slot.format.kind(),
        crate::kernels::formats_read(kernel).join(", ")
    ))
}

pub(super) fn emit_norm_linear(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, args)?])
}

/// The q/k/v projections of a group (`q_proj`, `k_proj`, `v_proj` linears): the arguments
/// every qkv kernel takes after its input.
pub(crate) struct Projections<'a> {
    pub(crate) q_op: &'a Op,
    pub(crate) w: [Buf; 3],
    pub(crate) bias: [Option<Buf>; 3],
    pub(crate) ops: [&'a Op; 3],
    pub(crate) k: u32,
    pub(crate) nq: u32,
    pub(crate) nkv: u32,
}

pub(crate) fn projections<'a>(v: &View<'a>) -> Result<Projections<'a>, ExecError> {
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
    pub(crate) fn outputs(&self, v: &View<'_>) -> Result<[Buf; 3], ExecError> {
        let [q, k, vp] = self.ops;
        Ok([v.output(q, 0)?, v.output(k, 0)?, v.output(vp, 0)?])
    }
}

pub(super) fn emit_qkv(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, a)?])
}

/// The group's two sibling projections (`gdn_in_proj`'s and its tensor-core rule's): two
/// `linear` ops, in group order, reading one input of width `k`; their weights, biases and
/// outputs side by side.
pub(crate) struct SiblingPair {
    pub x: Buf,
    pub w: [Buf; 2],
    pub bias: [Option<Buf>; 2],
    pub y: [Buf; 2],
    pub k: u32,
    pub n: [u32; 2],
}

pub(crate) fn sibling_pair(v: &View<'_>) -> Result<SiblingPair, ExecError> {
    let [first, second] = match v.ops(OpKind::Linear)[..] {
        [a, b] => [a, b],
        _ => return Err(v.err("expected exactly two `linear` ops".into())),
    };
    if first.inputs.first() != second.inputs.first() {
        return Err(v.err(format!(
            "`{}` and `{}` do not read the same input",
            first.name, second.name
        )));
    }
    let k = v.u32(first, "in")?;
    if v.u32(second, "in")? != k {
        return Err(v.err(format!(
            "`{}` and `{}` project inputs of different widths",
            first.name, second.name
        )));
    }
    Ok(SiblingPair {
        x: v.input(first, 0)?,
        w: [v.weight(first, 0)?, v.weight(second, 0)?],
        bias: [v.weight_opt(first, 1), v.weight_opt(second, 1)],
        y: [v.output(first, 0)?, v.output(second, 0)?],
        k,
        n: [v.u32(first, "out")?, v.u32(second, "out")?],
    })
}

pub(super) fn emit_linear_pair(v: &View<'_>) -> R {
    let SiblingPair {
        x,
        w: [w1, w2],
        bias: [b1, b2],
        y: [y1, y2],
        k,
        n: [n1, n2],
    } = sibling_pair(v)?;
    let a = LinearPair {
        x,
        w1,
        b1,
        w2,
        b2,
        y1,
        y2,
        rows: v.rows(),
        k,
        n1,
        n2,
        scratch: None,
    };
    Ok(vec![launch(v, a)?])
}

pub(super) fn emit_norm_qkv(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, a)?])
}

pub(super) fn emit_add_norm_qkv(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, args)?])
}

/// Gate and up are the projections feeding SiLU·mul's first and second input: their weights,
/// the activation output, the input width and the intermediate width.
pub(crate) struct GateUp<'a> {
    pub(crate) gate: &'a Op,
    pub(crate) wg: Buf,
    pub(crate) wu: Buf,
    pub(crate) act: Buf,
    pub(crate) k: u32,
    pub(crate) inter: u32,
}

pub(crate) fn gate_up<'a>(v: &View<'a>) -> Result<GateUp<'a>, ExecError> {
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

pub(super) fn emit_gate_up_silu(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, a)?])
}

pub(super) fn emit_norm_gate_up_silu(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, a)?])
}

pub(super) fn emit_add_norm_gate_up_silu(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, args)?])
}

pub(super) fn emit_linear_residual_add(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, args)?])
}

pub(super) fn emit_gated_norm_linear_residual_add(v: &View<'_>) -> R {
    let (n, l, a) = (
        v.op(OpKind::GdnGatedNorm, None)?,
        v.op(OpKind::Linear, None)?,
        v.op(OpKind::ResidualAdd, None)?,
    );
    let [nk, dk, nv, dv] = crate::kernels::gdn::gdn_dims(v, n)?;
    if nv > GATED_HEADS_MAX {
        return Err(v.err(format!(
            "op `{}` has {nv} value heads; the kernel normalises at most {GATED_HEADS_MAX}",
            n.name
        )));
    }
    let args = GatedNormLinearResidualAdd {
        core: v.input(n, 0)?,
        qkvz: v.input(n, 1)?,
        wn: v.weight(n, 0)?,
        w: v.weight(l, 0)?,
        bias: v.weight_opt(l, 1),
        h: v.input(a, 0)?,
        h_out: v.output(a, 0)?,
        rows: v.rows(),
        nk,
        dk,
        nv,
        dv,
        k: v.u32(l, "in")?,
        n_out: v.u32(l, "out")?,
        eps: v.f32(n, "eps")?,
        scratch: None,
    };
    Ok(vec![launch(v, args)?])
}

pub(super) fn emit_add_norm_lm_head(v: &View<'_>) -> R {
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
        want: v.want_logits(h),
        rows: v.rows(),
        k: v.u32(h, "hidden")?,
        vocab: v.u32(h, "vocab")?,
        eps: v.f32(n, "eps")?,
        scratch: None,
    };
    Ok(vec![launch(v, args)?])
}

/// Every variant of the q/k/v-with-rope rules: the residual add when the group has one, the
/// input norm, the projections, qk-norm when the group has one, rope and the KV write.
pub(super) fn emit_qkv_rope_kv(v: &View<'_>) -> R {
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
    Ok(vec![launch(v, args)?])
}
