//! The emitter of each kernel: which buffers, weights, metadata and attributes of the group's
//! ops go to which argument of its `ops::` function.

use solder_circuit::ir::{MetaField, Op};
use solder_circuit::OpKind;

use super::View;
use crate::error::ExecError;
use crate::ops::{act, add, attn, embed, gdn, gemv, kv, moe, norm, rope, Buf, Launch};

type R = Result<Vec<Launch>, ExecError>;

pub(super) fn emit(v: &View<'_>, emitter: &str) -> R {
    match emitter {
        "embed::embedding" => embedding(v),
        "norm::rms_norm" => rms_norm(v),
        "norm::add_rms_norm" => add_rms_norm(v),
        "norm::qk_norm" => qk_norm(v),
        "gemv::linear" => linear(v),
        "gemv::lm_head" => lm_head(v),
        "gemv::norm_linear" => norm_linear(v),
        "gemv::qkv" | "gemv::norm_qkv" | "gemv::add_norm_qkv" => qkv(v, emitter),
        "gemv::gate_up_silu" | "gemv::norm_gate_up_silu" | "gemv::add_norm_gate_up_silu" => {
            gate_up(v, emitter)
        }
        "gemv::linear_residual_add" => linear_residual_add(v),
        "gemv::add_norm_lm_head" => add_norm_lm_head(v),
        "rope::rope" | "rope::qk_norm_rope" => rope_only(v, emitter),
        "rope::rope_kv_write" | "rope::qk_norm_rope_kv_write" => rope_kv_write(v, emitter),
        "kv::kv_write" => kv_write(v),
        "attn::paged_decode" | "attn::paged_causal" => attention(v, emitter),
        "add::residual_add" => residual_add(v),
        "act::silu_mul" => silu_mul(v),
        "moe::topk_softmax" => topk_softmax(v),
        "moe::router_topk" => router_topk(v),
        "moe::gate_up_silu" => moe_gate_up(v),
        "moe::down" => moe_down(v),
        "norm::rms_norm_zc" => rms_norm_zc(v),
        "norm::add_rms_norm_zc" => add_rms_norm_zc(v),
        "norm::qk_norm_zc" => qk_norm_zc(v),
        "attn::gate_split" => gate_split(v),
        "act::sigmoid_mul" => sigmoid_mul(v),
        "moe::combine_shared" => combine_shared(v),
        "gdn::conv" => gdn_conv(v),
        "gdn::gates" => gdn_gates(v),
        "gdn::recurrence" => gdn_recurrence(v),
        "gdn::recurrence_pitched" => gdn_recurrence_pitched(v),
        "gdn::gated_norm" => gdn_gated_norm(v),
        other => Err(v.err(format!("no emitter for `{other}`"))),
    }
}

fn embedding(v: &View<'_>) -> R {
    let e = v.op(OpKind::Embedding, None)?;
    Ok(vec![embed::embedding(
        v.input(e, 0)?,
        v.weight(e, 0)?,
        v.output(e, 0)?,
        v.rows(),
        v.u32(e, "hidden")?,
        v.u32(e, "vocab")?,
    )])
}

fn rms_norm(v: &View<'_>) -> R {
    let n = v.op(OpKind::RmsNorm, None)?;
    Ok(vec![norm::rms_norm(
        v.input(n, 0)?,
        v.weight(n, 0)?,
        v.output(n, 0)?,
        v.rows(),
        v.u32(n, "hidden")?,
        v.f32(n, "eps")?,
    )])
}

fn add_rms_norm(v: &View<'_>) -> R {
    let (a, n) = (
        v.op(OpKind::ResidualAdd, None)?,
        v.op(OpKind::RmsNorm, None)?,
    );
    Ok(vec![norm::add_rms_norm(
        v.input(a, 0)?,
        v.input(a, 1)?,
        v.weight(n, 0)?,
        v.output_opt(a, 0)?,
        v.output(n, 0)?,
        v.rows(),
        v.u32(n, "hidden")?,
        v.f32(n, "eps")?,
    )])
}

fn qk_norm(v: &View<'_>) -> R {
    let q = v.op(OpKind::QkNorm, None)?;
    Ok(vec![norm::qk_norm(
        v.input(q, 0)?,
        v.input(q, 1)?,
        v.weight(q, 0)?,
        v.weight(q, 1)?,
        v.output(q, 0)?,
        v.output(q, 1)?,
        v.rows(),
        v.u32(q, "heads")?,
        v.u32(q, "kv_heads")?,
        v.u32(q, "head_dim")?,
        v.f32(q, "eps")?,
    )])
}

fn linear(v: &View<'_>) -> R {
    let l = v.op(OpKind::Linear, None)?;
    Ok(vec![gemv::linear(
        v.input(l, 0)?,
        v.weight(l, 0)?,
        v.weight_opt(l, 1),
        v.output(l, 0)?,
        v.rows(),
        v.u32(l, "in")?,
        v.u32(l, "out")?,
    )])
}

fn lm_head(v: &View<'_>) -> R {
    // The LM head and an MoE router are the same f32-output projection.
    let (h, width) = match v.op(OpKind::LmHead, None) {
        Ok(h) => (h, v.u32(h, "vocab")?),
        Err(_) => {
            let r = v.op(OpKind::Router, None)?;
            (r, v.u32(r, "experts")?)
        }
    };
    Ok(vec![gemv::lm_head(
        v.input(h, 0)?,
        v.weight(h, 0)?,
        v.output(h, 0)?,
        v.rows(),
        v.u32(h, "hidden")?,
        width,
    )])
}

fn norm_linear(v: &View<'_>) -> R {
    let (n, l) = (v.op(OpKind::RmsNorm, None)?, v.op(OpKind::Linear, None)?);
    Ok(vec![gemv::norm_linear(
        v.input(n, 0)?,
        v.weight(n, 0)?,
        v.weight(l, 0)?,
        v.weight_opt(l, 1),
        v.output(l, 0)?,
        v.rows(),
        v.u32(l, "in")?,
        v.u32(l, "out")?,
        v.f32(n, "eps")?,
    )])
}

/// The three projections of q/k/v: weight, bias, output.
fn projections<'a>(v: &View<'a>) -> Result<[(&'a Op, Buf, Option<Buf>, Buf); 3], ExecError> {
    let mut out = Vec::with_capacity(3);
    for role in ["q_proj", "k_proj", "v_proj"] {
        let l = v.op(OpKind::Linear, Some(role))?;
        out.push((l, v.weight(l, 0)?, v.weight_opt(l, 1), v.output(l, 0)?));
    }
    let [q, k, w] = <[_; 3]>::try_from(out).map_err(|_| v.err("q/k/v".to_string()))?;
    Ok([q, k, w])
}

fn qkv(v: &View<'_>, emitter: &str) -> R {
    let [(q, wq, bq, oq), (k, wk, bk, ok), (_, wv, bv, ov)] = projections(v)?;
    let (rows, kin, nq, nkv) = (
        v.rows(),
        v.u32(q, "in")?,
        v.u32(q, "out")?,
        v.u32(k, "out")?,
    );
    Ok(vec![match emitter {
        "gemv::qkv" => gemv::qkv(
            v.input(q, 0)?,
            wq,
            bq,
            wk,
            bk,
            wv,
            bv,
            oq,
            ok,
            ov,
            rows,
            kin,
            nq,
            nkv,
        ),
        "gemv::norm_qkv" => {
            let n = v.op(OpKind::RmsNorm, None)?;
            gemv::norm_qkv(
                v.input(n, 0)?,
                v.weight(n, 0)?,
                wq,
                bq,
                wk,
                bk,
                wv,
                bv,
                oq,
                ok,
                ov,
                rows,
                kin,
                nq,
                nkv,
                v.f32(n, "eps")?,
            )
        }
        _ => {
            let (a, n) = (
                v.op(OpKind::ResidualAdd, None)?,
                v.op(OpKind::RmsNorm, None)?,
            );
            gemv::add_norm_qkv(
                v.input(a, 0)?,
                v.input(a, 1)?,
                v.weight(n, 0)?,
                wq,
                bq,
                wk,
                bk,
                wv,
                bv,
                v.output_opt(a, 0)?,
                oq,
                ok,
                ov,
                rows,
                kin,
                nq,
                nkv,
                v.f32(n, "eps")?,
            )
        }
    }])
}

fn gate_up(v: &View<'_>, emitter: &str) -> R {
    let s = v.op(OpKind::SiluMul, None)?;
    // Gate and up are the projections feeding SiLU·mul's first and second input.
    let (g, u) = (v.producer_in_group(s, 0)?, v.producer_in_group(s, 1)?);
    let (rows, kin, inter) = (v.rows(), v.u32(g, "in")?, v.u32(g, "out")?);
    let (wg, wu, act) = (v.weight(g, 0)?, v.weight(u, 0)?, v.output(s, 0)?);
    Ok(vec![match emitter {
        "gemv::gate_up_silu" => gemv::gate_up_silu(v.input(g, 0)?, wg, wu, act, rows, kin, inter),
        "gemv::norm_gate_up_silu" => {
            let n = v.op(OpKind::RmsNorm, None)?;
            gemv::norm_gate_up_silu(
                v.input(n, 0)?,
                v.weight(n, 0)?,
                wg,
                wu,
                act,
                rows,
                kin,
                inter,
                v.f32(n, "eps")?,
            )
        }
        _ => {
            let (a, n) = (
                v.op(OpKind::ResidualAdd, None)?,
                v.op(OpKind::RmsNorm, None)?,
            );
            gemv::add_norm_gate_up_silu(
                v.input(a, 0)?,
                v.input(a, 1)?,
                v.weight(n, 0)?,
                wg,
                wu,
                v.output_opt(a, 0)?,
                act,
                rows,
                kin,
                inter,
                v.f32(n, "eps")?,
            )
        }
    }])
}

fn linear_residual_add(v: &View<'_>) -> R {
    let (l, a) = (
        v.op(OpKind::Linear, None)?,
        v.op(OpKind::ResidualAdd, None)?,
    );
    Ok(vec![gemv::linear_residual_add(
        v.input(l, 0)?,
        v.weight(l, 0)?,
        v.weight_opt(l, 1),
        v.input(a, 0)?,
        v.output(a, 0)?,
        v.rows(),
        v.u32(l, "in")?,
        v.u32(l, "out")?,
    )])
}

fn add_norm_lm_head(v: &View<'_>) -> R {
    let (a, n, h) = (
        v.op(OpKind::ResidualAdd, None)?,
        v.op(OpKind::RmsNorm, None)?,
        v.op(OpKind::LmHead, None)?,
    );
    Ok(vec![gemv::add_norm_lm_head(
        v.input(a, 0)?,
        v.input(a, 1)?,
        v.weight(n, 0)?,
        v.weight(h, 0)?,
        v.output(h, 0)?,
        v.rows(),
        v.u32(h, "hidden")?,
        v.u32(h, "vocab")?,
        v.f32(n, "eps")?,
    )])
}

/// Rope's dims: heads, kv heads, head dim, rotary dim.
fn rope_dims(v: &View<'_>, r: &Op) -> Result<(u32, u32, u32, u32), ExecError> {
    Ok((
        v.u32(r, "heads")?,
        v.u32(r, "kv_heads")?,
        v.u32(r, "head_dim")?,
        v.u32(r, "rotary_dim")?,
    ))
}

fn rope_only(v: &View<'_>, emitter: &str) -> R {
    let r = v.op(OpKind::Rope, None)?;
    let (heads, kvh, hd, rot) = rope_dims(v, r)?;
    let (pos, inv) = (v.meta(MetaField::Positions), v.inv_freq());
    let (oq, ok) = (v.output(r, 0)?, v.output(r, 1)?);
    Ok(vec![if emitter == "rope::rope" {
        rope::rope(
            v.input(r, 0)?,
            v.input(r, 1)?,
            pos,
            inv,
            oq,
            ok,
            v.rows(),
            heads,
            kvh,
            hd,
            rot,
        )
    } else {
        let n = v.op(OpKind::QkNorm, None)?;
        rope::qk_norm_rope(
            v.input(n, 0)?,
            v.input(n, 1)?,
            v.weight(n, 0)?,
            v.weight(n, 1)?,
            pos,
            inv,
            oq,
            ok,
            v.rows(),
            heads,
            kvh,
            hd,
            rot,
            v.f32(n, "eps")?,
        )
    }])
}

fn rope_kv_write(v: &View<'_>, emitter: &str) -> R {
    let (r, w) = (v.op(OpKind::Rope, None)?, v.op(OpKind::KvWrite, None)?);
    let (heads, kvh, hd, rot) = rope_dims(v, r)?;
    let (pos, inv, slots) = (
        v.meta(MetaField::Positions),
        v.inv_freq(),
        v.meta(MetaField::SlotMapping),
    );
    let (oq, cache, val) = (v.output(r, 0)?, v.state_of(w.outputs[0])?, v.input(w, 1)?);
    let (bs, pages) = (v.kv_block_size(), v.kv_pages());
    Ok(vec![if emitter == "rope::rope_kv_write" {
        rope::rope_kv_write(
            v.input(r, 0)?,
            v.input(r, 1)?,
            val,
            pos,
            inv,
            slots,
            oq,
            cache,
            v.rows(),
            heads,
            kvh,
            hd,
            rot,
            bs,
            pages,
        )
    } else {
        let n = v.op(OpKind::QkNorm, None)?;
        rope::qk_norm_rope_kv_write(
            v.input(n, 0)?,
            v.input(n, 1)?,
            val,
            v.weight(n, 0)?,
            v.weight(n, 1)?,
            pos,
            inv,
            slots,
            oq,
            cache,
            v.rows(),
            heads,
            kvh,
            hd,
            rot,
            bs,
            pages,
            v.f32(n, "eps")?,
        )
    }])
}

fn kv_write(v: &View<'_>) -> R {
    let w = v.op(OpKind::KvWrite, None)?;
    Ok(vec![kv::kv_write(
        v.input(w, 0)?,
        v.input(w, 1)?,
        v.meta(MetaField::SlotMapping),
        v.state_of(w.outputs[0])?,
        v.rows(),
        v.u32(w, "kv_heads")?,
        v.u32(w, "head_dim")?,
        v.kv_block_size(),
        v.kv_pages(),
    )])
}

fn attention(v: &View<'_>, emitter: &str) -> R {
    let a = v.op(OpKind::Attention, None)?;
    let kv_edge = *a
        .inputs
        .get(1)
        .ok_or_else(|| v.err(format!("`{}` reads no KV state", a.name)))?;
    let args = (
        v.input(a, 0)?,
        v.state_of(kv_edge)?,
        v.meta(MetaField::BlockTables),
        v.meta(MetaField::SeqLens),
        v.output(a, 0)?,
    );
    let dims = (
        v.rows(),
        v.u32(a, "heads")?,
        v.u32(a, "kv_heads")?,
        v.u32(a, "head_dim")?,
    );
    let (bs, blocks, pages, scale) = (
        v.kv_block_size(),
        v.max_blocks(),
        v.kv_pages(),
        v.f32(a, "scale")?,
    );
    let f = if emitter == "attn::paged_decode" {
        attn::paged_decode
    } else {
        attn::paged_causal
    };
    Ok(vec![f(
        args.0, args.1, args.2, args.3, args.4, dims.0, dims.1, dims.2, dims.3, bs, blocks, pages,
        scale,
    )])
}

fn residual_add(v: &View<'_>) -> R {
    let a = v.op(OpKind::ResidualAdd, None)?;
    Ok(vec![add::residual_add(
        v.input(a, 0)?,
        v.input(a, 1)?,
        v.output(a, 0)?,
        v.rows(),
        v.u32(a, "hidden")?,
    )])
}

fn silu_mul(v: &View<'_>) -> R {
    let s = v.op(OpKind::SiluMul, None)?;
    Ok(vec![act::silu_mul(
        v.input(s, 0)?,
        v.input(s, 1)?,
        v.output(s, 0)?,
        v.rows(),
        v.u32(s, "width")?,
    )])
}

/// Top-k dims: experts, k, renormalise.
fn topk_dims(v: &View<'_>, t: &Op) -> Result<(u32, u32, u32), ExecError> {
    Ok((v.u32(t, "experts")?, v.u32(t, "k")?, v.u32(t, "norm_topk")?))
}

fn topk_softmax(v: &View<'_>) -> R {
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

fn router_topk(v: &View<'_>) -> R {
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
fn expert_dims(v: &View<'_>, op: &Op) -> Result<(u32, u32, u32, u32), ExecError> {
    Ok((
        v.u32(op, "hidden")?,
        v.u32(op, "inter")?,
        v.u32(op, "experts")?,
        v.u32(op, "k")?,
    ))
}

fn moe_gate_up(v: &View<'_>) -> R {
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

fn moe_down(v: &View<'_>) -> R {
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

fn rms_norm_zc(v: &View<'_>) -> R {
    let n = v.op(OpKind::RmsNormZc, None)?;
    Ok(vec![norm::rms_norm_zc(
        v.input(n, 0)?,
        v.weight(n, 0)?,
        v.output(n, 0)?,
        v.rows(),
        v.u32(n, "hidden")?,
        v.f32(n, "eps")?,
    )])
}

fn add_rms_norm_zc(v: &View<'_>) -> R {
    let (a, n) = (
        v.op(OpKind::ResidualAdd, None)?,
        v.op(OpKind::RmsNormZc, None)?,
    );
    Ok(vec![norm::add_rms_norm_zc(
        v.input(a, 0)?,
        v.input(a, 1)?,
        v.weight(n, 0)?,
        v.output_opt(a, 0)?,
        v.output(n, 0)?,
        v.rows(),
        v.u32(n, "hidden")?,
        v.f32(n, "eps")?,
    )])
}

fn qk_norm_zc(v: &View<'_>) -> R {
    let q = v.op(OpKind::QkNormZc, None)?;
    Ok(vec![norm::qk_norm_zc(
        v.input(q, 0)?,
        v.input(q, 1)?,
        v.weight(q, 0)?,
        v.weight(q, 1)?,
        v.output(q, 0)?,
        v.output(q, 1)?,
        v.rows(),
        v.u32(q, "heads")?,
        v.u32(q, "kv_heads")?,
        v.u32(q, "head_dim")?,
        v.f32(q, "eps")?,
    )])
}

fn gate_split(v: &View<'_>) -> R {
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

fn sigmoid_mul(v: &View<'_>) -> R {
    let s = v.op(OpKind::SigmoidMul, None)?;
    Ok(vec![act::sigmoid_mul(
        v.input(s, 0)?,
        v.input(s, 1)?,
        v.output(s, 0)?,
        v.rows(),
        v.u32(s, "width")?,
    )])
}

fn combine_shared(v: &View<'_>) -> R {
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

/// Gated DeltaNet dims: key heads, key dim, value heads, value dim.
fn gdn_dims(v: &View<'_>, op: &Op) -> Result<(u32, u32, u32, u32), ExecError> {
    Ok((
        v.u32(op, "key_heads")?,
        v.u32(op, "key_dim")?,
        v.u32(op, "value_heads")?,
        v.u32(op, "value_dim")?,
    ))
}

/// A recurrent op's state region, and its per-row snapshots when rows chain (verify).
fn gdn_state(v: &View<'_>, op: &Op) -> Result<(Buf, Option<Buf>), ExecError> {
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

fn gdn_conv(v: &View<'_>) -> R {
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

fn gdn_gates(v: &View<'_>) -> R {
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

fn gdn_recurrence(v: &View<'_>) -> R {
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

fn gdn_gated_norm(v: &View<'_>) -> R {
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

fn gdn_recurrence_pitched(v: &View<'_>) -> R {
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
