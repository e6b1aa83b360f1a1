//! Self-attention of one decoder layer, as named steps that add their ops in the circuit's
//! order: q (and the qwen3_next gate split), k, v, qk-norm, rope, KV write, paged attention,
//! output gate, o projection.
//!
//! Invariant: the steps run in that order; the op order defines the plans.

use solder_config::ModelConfig;

use super::parts::{int, linear, ATTN};
use super::CircuitOptions;
use crate::builder::{CircuitBuilder, OpSpec, OutSpec};
use crate::error::CircuitError;
use crate::ir::{Attr, Binding, Dtype, MetaField, Shape, StateKind, TensorId};
use crate::ops::OpKind;

/// Self-attention of one layer: q/k/v (+ bias), qk-norm, rope, KV write, paged attention, the
/// optional sigmoid output gate, o projection.
pub(super) fn attention(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    x: TensorId,
    options: CircuitOptions,
) -> Result<TensorId, CircuitError> {
    let p = super::layer_prefix(cfg, l);
    let (hidden, kv_dim) = (cfg.hidden_size, cfg.kv_dim());
    let bias = cfg.attention_bias;
    let (q, gate) = query(b, cfg, l, x)?;
    let k = linear(
        b,
        l,
        "k_proj",
        &format!("{p}self_attn.k_proj"),
        x,
        [hidden, kv_dim],
        bias,
    )?;
    let v = linear(
        b,
        l,
        "v_proj",
        &format!("{p}self_attn.v_proj"),
        x,
        [hidden, kv_dim],
        bias,
    )?;
    let (q, k) = if cfg.qk_norm {
        qk_norm(b, cfg, l, q, k)?
    } else {
        (q, k)
    };
    let (q, k) = rope(b, cfg, l, q, k)?;
    let attn = paged_attention(b, cfg, l, q, k, v, options)?;
    let attn = match gate {
        Some(gate) => output_gate(b, cfg, l, attn, gate)?,
        None => attn,
    };
    linear(
        b,
        l,
        "o_proj",
        &format!("{p}self_attn.o_proj"),
        attn,
        [cfg.q_dim(), hidden],
        false,
    )
}

/// The q projection; with an output gate (qwen3_next) also split off the gate's logits.
fn query(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    x: TensorId,
) -> Result<(TensorId, Option<TensorId>), CircuitError> {
    let p = super::layer_prefix(cfg, l);
    let q_dim = cfg.q_dim();
    // With an output gate (qwen3_next) q_proj also yields, per head, the gate's logits.
    let q_out = if cfg.attn_output_gate {
        super::width(&format!("l{l}.q_proj"), q_dim.checked_mul(2))?
    } else {
        q_dim
    };
    let q = linear(
        b,
        l,
        "q_proj",
        &format!("{p}self_attn.q_proj"),
        x,
        [cfg.hidden_size, q_out],
        cfg.attention_bias,
    )?;
    if !cfg.attn_output_gate {
        return Ok((q, None));
    }
    let split = b.op(
        OpSpec::new(
            OpKind::AttnGateSplit,
            format!("l{l}.gate_split"),
            "gate_split",
        )
        .layer(l, ATTN)
        .inputs(&[q])
        .attr("heads", int(cfg.num_attention_heads))
        .attr("head_dim", int(cfg.head_dim)),
        &[
            OutSpec::rows(format!("l{l}.q"), Dtype::Bf16, q_dim),
            OutSpec::rows(format!("l{l}.attn_gate"), Dtype::Bf16, q_dim),
        ],
    )?;
    Ok((split[0], Some(split[1])))
}

/// Per-head RMS norm of q and k (qwen3), zero-centred where the config says so.
fn qk_norm(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    q: TensorId,
    k: TensorId,
) -> Result<(TensorId, TensorId), CircuitError> {
    let p = super::layer_prefix(cfg, l);
    let hd = cfg.head_dim;
    let qn = b.weight(&format!("{p}self_attn.q_norm.weight"), &[hd])?;
    let kn = b.weight(&format!("{p}self_attn.k_norm.weight"), &[hd])?;
    let out = b.op(
        OpSpec::new(
            if cfg.zero_centred_norms {
                OpKind::QkNormZc
            } else {
                OpKind::QkNorm
            },
            format!("l{l}.qk_norm"),
            "qk_norm",
        )
        .layer(l, ATTN)
        .inputs(&[q, k])
        .weights(&[qn, kn])
        .attr("eps", Attr::Float(cfg.rms_norm_eps))
        .attr("head_dim", int(hd))
        .attr("heads", int(cfg.num_attention_heads))
        .attr("kv_heads", int(cfg.num_key_value_heads)),
        &[
            OutSpec::rows(format!("l{l}.q_normed"), Dtype::Bf16, cfg.q_dim()),
            OutSpec::rows(format!("l{l}.k_normed"), Dtype::Bf16, cfg.kv_dim()),
        ],
    )?;
    Ok((out[0], out[1]))
}

/// Rotary position embedding of q and k.
fn rope(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    q: TensorId,
    k: TensorId,
) -> Result<(TensorId, TensorId), CircuitError> {
    let hd = cfg.head_dim;
    let roped = b.op(
        OpSpec::new(OpKind::Rope, format!("l{l}.rope"), "rope")
            .layer(l, ATTN)
            .inputs(&[q, k])
            .meta(&[MetaField::Positions])
            .attr("head_dim", int(hd))
            .attr("rotary_dim", int(cfg.rope.rotary_dim(hd)))
            .attr("theta", Attr::Float(cfg.rope.theta))
            .attr("heads", int(cfg.num_attention_heads))
            .attr("kv_heads", int(cfg.num_key_value_heads)),
        &[
            OutSpec::rows(format!("l{l}.q_rot"), Dtype::Bf16, cfg.q_dim()),
            OutSpec::rows(format!("l{l}.k_rot"), Dtype::Bf16, cfg.kv_dim()),
        ],
    )?;
    Ok((roped[0], roped[1]))
}

/// The layer's KV pages, the KV write of `k`/`v` into them, and paged attention of `q` over
/// them (windowed where the layer has a sliding window).
fn paged_attention(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    q: TensorId,
    k: TensorId,
    v: TensorId,
    options: CircuitOptions,
) -> Result<TensorId, CircuitError> {
    let (hd, heads, kv_heads) = (
        cfg.head_dim,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
    );
    let kv_state = b.state(
        format!("kv.{l}"),
        StateKind::KvPages {
            layer: l,
            block_size: options.kv_block_size,
            num_kv_heads: kv_heads,
            head_dim: hd,
            dtype: Dtype::Bf16,
        },
    );
    let kv = b.op1(
        OpSpec::new(OpKind::KvWrite, format!("l{l}.kv_write"), "kv_write")
            .layer(l, ATTN)
            .inputs(&[k, v])
            .meta(&[MetaField::SlotMapping])
            .attr("kv_heads", int(kv_heads))
            .attr("head_dim", int(hd))
            .attr("block_size", int(options.kv_block_size)),
        OutSpec {
            name: format!("l{l}.kv"),
            dtype: Dtype::Bf16,
            shape: Shape::rows(&[2, cfg.kv_dim()]),
            binding: Binding::State(kv_state),
        },
    )?;
    let mut attention = OpSpec::new(OpKind::Attention, format!("l{l}.attention"), "attention")
        .layer(l, ATTN)
        .inputs(&[q, kv])
        .meta(&[
            MetaField::Positions,
            MetaField::SeqLens,
            MetaField::BlockTables,
        ])
        .attr("heads", int(heads))
        .attr("kv_heads", int(kv_heads))
        .attr("head_dim", int(hd))
        .attr("scale", Attr::Float(1.0 / (hd as f64).sqrt()))
        .attr("block_size", int(options.kv_block_size));
    // A sliding window (the last W positions) only where the layer has one: full-attention
    // ops carry no `window` attribute (the kernels read 0, none).
    if let Some(window) = cfg.layer_windows.get(l as usize).copied().flatten() {
        attention = attention.attr("window", int(window));
    }
    b.op1(
        attention,
        OutSpec::rows(format!("l{l}.attn"), Dtype::Bf16, cfg.q_dim()),
    )
}

/// The sigmoid output gate (qwen3_next): `attn * sigmoid(gate)`.
fn output_gate(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    attn: TensorId,
    gate: TensorId,
) -> Result<TensorId, CircuitError> {
    let q_dim = cfg.q_dim();
    b.op1(
        OpSpec::new(
            OpKind::SigmoidMul,
            format!("l{l}.attn_gate_mul"),
            "attn_gate",
        )
        .layer(l, ATTN)
        .inputs(&[attn, gate])
        .attr("width", int(q_dim)),
        OutSpec::rows(format!("l{l}.attn_gated"), Dtype::Bf16, q_dim),
    )
}
