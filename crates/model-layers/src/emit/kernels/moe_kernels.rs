//! Emitters of the mixture-of-experts kernels.

use solder_circuit::ir::Op;
use solder_circuit::OpKind;

use super::super::View;
use super::R;
use crate::error::ExecError;
use crate::ops::moe;

/// Top-k dims: experts, k, renormalise.
pub(super) fn topk_dims(v: &View<'_>, t: &Op) -> Result<(u32, u32, u32), ExecError> {
    Ok((v.u32(t, "experts")?, v.u32(t, "k")?, v.u32(t, "norm_topk")?))
}

pub(super) fn topk_softmax(v: &View<'_>) -> R {
    let t = v.op(OpKind::TopkSoftmax, None)?;
    let (experts, k, norm) = topk_dims(v, t)?;
    Ok(vec![moe::topk_softmax(
        v.input(t, 0)?,
        v.output(t, 0)?,
        v.output(t, 1)?,
        v.rows(),
        experts,
        k,
        norm,
    )])
}

pub(super) fn router_topk(v: &View<'_>) -> R {
    let (r, t) = (
        v.op(OpKind::Router, None)?,
        v.op(OpKind::TopkSoftmax, None)?,
    );
    let (experts, k, norm) = topk_dims(v, t)?;
    Ok(vec![moe::router_topk(
        v.input(r, 0)?,
        v.weight(r, 0)?,
        v.output(t, 0)?,
        v.output(t, 1)?,
        v.rows(),
        v.u32(r, "hidden")?,
        experts,
        k,
        norm,
    )])
}

/// Expert dims: hidden, intermediate, experts, k.
pub(super) fn expert_dims(v: &View<'_>, op: &Op) -> Result<(u32, u32, u32, u32), ExecError> {
    Ok((
        v.u32(op, "hidden")?,
        v.u32(op, "inter")?,
        v.u32(op, "experts")?,
        v.u32(op, "k")?,
    ))
}

pub(super) fn moe_gate_up(v: &View<'_>) -> R {
    let g = v.op(OpKind::MoeGateUp, None)?;
    let (hidden, inter, experts, k) = expert_dims(v, g)?;
    Ok(vec![moe::gate_up_silu(
        v.input(g, 0)?,
        v.input(g, 1)?,
        v.weight(g, 0)?,
        v.weight(g, 1)?,
        v.output(g, 0)?,
        v.rows(),
        hidden,
        inter,
        experts,
        k,
    )])
}

pub(super) fn moe_down(v: &View<'_>) -> R {
    let d = v.op(OpKind::MoeDown, None)?;
    let (hidden, inter, experts, k) = expert_dims(v, d)?;
    Ok(vec![moe::down(
        v.input(d, 0)?,
        v.input(d, 1)?,
        v.input(d, 2)?,
        v.weight(d, 0)?,
        v.output(d, 0)?,
        v.rows(),
        hidden,
        inter,
        experts,
        k,
    )])
}

pub(super) fn combine_shared(v: &View<'_>) -> R {
    let c = v.op(OpKind::MoeCombine, None)?;
    Ok(vec![moe::combine_shared(
        v.input(c, 0)?,
        v.input(c, 1)?,
        v.input(c, 2)?,
        v.output(c, 0)?,
        v.rows(),
        v.u32(c, "hidden")?,
    )])
}
