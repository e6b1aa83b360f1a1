//! Emitters of the dense decoder's kernels: embedding, norms, projections, rope, KV write,
//! attention, residual add, SiLU·mul.

use solder_circuit::ir::{MetaField, Op};
use solder_circuit::OpKind;

use super::super::View;
use super::R;
use crate::error::ExecError;
use crate::ops::{act, add, attn, embed, gemv, kv, norm, rope, Buf, Launch};

pub(super) fn embedding(v: &View<'_>) -> R {
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

pub(super) fn rms_norm(v: &View<'_>) -> R {
    rms_norm_of(v, OpKind::RmsNorm, norm::rms_norm)
}

/// The launch of a norm op of `kind` through `build`, an `ops::norm` function of
/// `rms_norm`'s arguments (the zero-centred kernel takes the same ones).
pub(super) fn rms_norm_of(
    v: &View<'_>,
    kind: OpKind,
    build: fn(Buf, Buf, Buf, u32, u32, f32) -> Launch,
) -> R {
    let n = v.op(kind, None)?;
    Ok(vec![build(
        v.input(n, 0)?,
        v.weight(n, 0)?,
        v.output(n, 0)?,
        v.rows(),
        v.u32(n, "hidden")?,
        v.f32(n, "eps")?,
    )])
}

pub(super) fn add_rms_norm(v: &View<'_>) -> R {
    add_rms_norm_of(v, OpKind::RmsNorm, norm::add_rms_norm)
}

type AddNorm = fn(Buf, Buf, Buf, Option<Buf>, Buf, u32, u32, f32) -> Launch;

pub(super) fn add_rms_norm_of(v: &View<'_>, kind: OpKind, build: AddNorm) -> R {
    let (a, n) = (v.op(OpKind::ResidualAdd, None)?, v.op(kind, None)?);
    Ok(vec![build(
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

pub(super) fn qk_norm(v: &View<'_>) -> R {
    qk_norm_of(v, OpKind::QkNorm, norm::qk_norm)
}

type QkNorm = fn(Buf, Buf, Buf, Buf, Buf, Buf, u32, u32, u32, u32, f32) -> Launch;

pub(super) fn qk_norm_of(v: &View<'_>, kind: OpKind, build: QkNorm) -> R {
    let q = v.op(kind, None)?;
    Ok(vec![build(
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

pub(super) fn linear(v: &View<'_>) -> R {
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

pub(super) fn lm_head(v: &View<'_>) -> R {
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

pub(super) fn norm_linear(v: &View<'_>) -> R {
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
/// One projection of a group: its op, weight, optional bias and output.
type Projection<'a> = (&'a Op, Buf, Option<Buf>, Buf);

pub(super) fn projections<'a>(v: &View<'a>) -> Result<[Projection<'a>; 3], ExecError> {
    let mut out = Vec::with_capacity(3);
    for role in ["q_proj", "k_proj", "v_proj"] {
        let l = v.op(OpKind::Linear, Some(role))?;
        out.push((l, v.weight(l, 0)?, v.weight_opt(l, 1), v.output(l, 0)?));
    }
    let [q, k, w] = <[_; 3]>::try_from(out).map_err(|_| v.err("q/k/v".to_string()))?;
    Ok([q, k, w])
}

pub(super) fn qkv(v: &View<'_>, emitter: &str) -> R {
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

pub(super) fn gate_up(v: &View<'_>, emitter: &str) -> R {
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

pub(super) fn linear_residual_add(v: &View<'_>) -> R {
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

pub(super) fn add_norm_lm_head(v: &View<'_>) -> R {
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
pub(super) fn rope_dims(v: &View<'_>, r: &Op) -> Result<(u32, u32, u32, u32), ExecError> {
    Ok((
        v.u32(r, "heads")?,
        v.u32(r, "kv_heads")?,
        v.u32(r, "head_dim")?,
        v.u32(r, "rotary_dim")?,
    ))
}

pub(super) fn rope_only(v: &View<'_>, emitter: &str) -> R {
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

pub(super) fn rope_kv_write(v: &View<'_>, emitter: &str) -> R {
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

pub(super) fn kv_write(v: &View<'_>) -> R {
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

pub(super) fn attention(v: &View<'_>, emitter: &str) -> R {
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
    let scratch = v.bind.attn_scratch(dims.1 as usize, dims.3 as usize);
    let f = if emitter == "attn::paged_decode" {
        attn::paged_decode
    } else {
        attn::paged_causal
    };
    Ok(vec![f(
        args.0, args.1, args.2, args.3, args.4, scratch, dims.0, dims.1, dims.2, dims.3, bs,
        blocks, pages, scale,
    )])
}

pub(super) fn residual_add(v: &View<'_>) -> R {
    let a = v.op(OpKind::ResidualAdd, None)?;
    Ok(vec![add::residual_add(
        v.input(a, 0)?,
        v.input(a, 1)?,
        v.output(a, 0)?,
        v.rows(),
        v.u32(a, "hidden")?,
    )])
}

pub(super) fn silu_mul(v: &View<'_>) -> R {
    let s = v.op(OpKind::SiluMul, None)?;
    Ok(vec![act::silu_mul(
        v.input(s, 0)?,
        v.input(s, 1)?,
        v.output(s, 0)?,
        v.rows(),
        v.u32(s, "width")?,
    )])
}
