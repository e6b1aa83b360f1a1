//! Emitters of qwen3_next's kernels: zero-centred norms, gated attention, Gated DeltaNet.

use solder_circuit::ir::{MetaField, Op};
use solder_circuit::OpKind;

use super::super::View;
use super::R;
use crate::error::ExecError;
use crate::ops::{act, attn, gdn, norm, Buf};

pub(super) fn rms_norm_zc(v: &View<'_>) -> R {
    super::dense::rms_norm_of(v, OpKind::RmsNormZc, norm::rms_norm_zc)
}

pub(super) fn add_rms_norm_zc(v: &View<'_>) -> R {
    super::dense::add_rms_norm_of(v, OpKind::RmsNormZc, norm::add_rms_norm_zc)
}

pub(super) fn qk_norm_zc(v: &View<'_>) -> R {
    super::dense::qk_norm_of(v, OpKind::QkNormZc, norm::qk_norm_zc)
}

pub(super) fn gate_split(v: &View<'_>) -> R {
    let g = v.op(OpKind::AttnGateSplit, None)?;
    Ok(vec![attn::gate_split(
        v.input(g, 0)?,
        v.output(g, 0)?,
        v.output(g, 1)?,
        v.rows(),
        v.u32(g, "heads")?,
        v.u32(g, "head_dim")?,
    )])
}

pub(super) fn sigmoid_mul(v: &View<'_>) -> R {
    let s = v.op(OpKind::SigmoidMul, None)?;
    Ok(vec![act::sigmoid_mul(
        v.input(s, 0)?,
        v.input(s, 1)?,
        v.output(s, 0)?,
        v.rows(),
        v.u32(s, "width")?,
    )])
}

/// Gated DeltaNet dims: key heads, key dim, value heads, value dim.
pub(super) fn gdn_dims(v: &View<'_>, op: &Op) -> Result<(u32, u32, u32, u32), ExecError> {
    Ok((
        v.u32(op, "key_heads")?,
        v.u32(op, "key_dim")?,
        v.u32(op, "value_heads")?,
        v.u32(op, "value_dim")?,
    ))
}

/// A recurrent op's state region, and its per-row snapshots when rows chain (verify).
pub(super) fn gdn_state(v: &View<'_>, op: &Op) -> Result<(Buf, Option<Buf>), ExecError> {
    let edge = *op
        .outputs
        .get(1)
        .ok_or_else(|| v.err(format!("`{}` has no state edge", op.name)))?;
    let snapshots = if v.chained() {
        Some(v.snapshots_of(edge)?)
    } else {
        None
    };
    Ok((v.state_of(edge)?, snapshots))
}

pub(super) fn gdn_conv(v: &View<'_>) -> R {
    let c = v.op(OpKind::GdnConv, None)?;
    let (nk, dk, nv, dv) = gdn_dims(v, c)?;
    let (state, snapshots) = gdn_state(v, c)?;
    Ok(vec![gdn::conv(
        v.input(c, 0)?,
        v.weight(c, 0)?,
        state,
        v.meta(MetaField::StateSlots),
        v.output(c, 0)?,
        snapshots,
        v.rows(),
        nk,
        dk,
        nv,
        dv,
        v.u32(c, "kernel")?,
        v.state_slots(),
        v.chained() as u32,
    )])
}

pub(super) fn gdn_gates(v: &View<'_>) -> R {
    let g = v.op(OpKind::GdnGates, None)?;
    let (nk, _, nv, _) = gdn_dims(v, g)?;
    Ok(vec![gdn::gates(
        v.input(g, 0)?,
        v.weight(g, 0)?,
        v.weight(g, 1)?,
        v.output(g, 0)?,
        v.output(g, 1)?,
        v.rows(),
        nk,
        nv,
    )])
}

pub(super) fn gdn_recurrence(v: &View<'_>) -> R {
    let r = v.op(OpKind::GdnRecurrence, None)?;
    let (nk, dk, nv, dv) = gdn_dims(v, r)?;
    let (state, snapshots) = gdn_state(v, r)?;
    Ok(vec![gdn::recurrence(
        v.input(r, 0)?,
        v.input(r, 1)?,
        v.input(r, 2)?,
        state,
        v.meta(MetaField::StateSlots),
        v.output(r, 0)?,
        snapshots,
        v.rows(),
        nk,
        dk,
        nv,
        dv,
        v.state_slots(),
        v.chained() as u32,
    )])
}

pub(super) fn gdn_gated_norm(v: &View<'_>) -> R {
    let n = v.op(OpKind::GdnGatedNorm, None)?;
    let (nk, dk, nv, dv) = gdn_dims(v, n)?;
    Ok(vec![gdn::gated_norm(
        v.input(n, 0)?,
        v.input(n, 1)?,
        v.weight(n, 0)?,
        v.output(n, 0)?,
        v.rows(),
        nk,
        dk,
        nv,
        dv,
        v.f32(n, "eps")?,
    )])
}

pub(super) fn gdn_recurrence_pitched(v: &View<'_>) -> R {
    let r = v.op(OpKind::GdnRecurrence, None)?;
    let (nk, dk, nv, dv) = gdn_dims(v, r)?;
    if v.chained() {
        return Err(v.err("the pitched route runs independent rows, not a verify chain".into()));
    }
    let (state, _) = gdn_state(v, r)?;
    Ok(vec![gdn::recurrence_pitched(
        v.input(r, 0)?,
        v.input(r, 1)?,
        v.input(r, 2)?,
        state,
        v.meta(MetaField::StateSlots),
        v.output(r, 0)?,
        v.rows(),
        nk,
        dk,
        nv,
        dv,
        v.state_slots(),
    )])
}
