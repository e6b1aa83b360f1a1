//! qwen3_next's own parts: the Gated DeltaNet token mixer (in_proj_qkvz / in_proj_ba, causal
//! conv1d over a per-sequence conv state with SiLU, the gates from A_log and dt_bias, the
//! gated delta rule over a per-sequence f32 recurrent state, the gated RMSNorm with z,
//! out_proj) and the MoE's sigmoid-gated shared expert, on a side stream (branch 1).
//! The gated attention layers and zero-centred norms are `dense`'s, switched by the config.
//!
//! Invariant: recurrent state lives in per-sequence slots named by the `state_slots`
//! metadata; the ops' state edges order each step's writes and carry no bytes.

use solder_config::{LinearAttnConfig, ModelConfig};

use super::parts::int;
use crate::builder::{CircuitBuilder, OpSpec, OutSpec};
use crate::error::CircuitError;
use crate::ir::{Attr, Binding, Dtype, LayerKind, MetaField, Shape, StateKind, TensorId};
use crate::ops::OpKind;

const LINEAR: LayerKind = LayerKind::LinearAttention;

/// A projection `[in_dim, out_dim]` with an explicit layer kind and branch.
fn projection(
    b: &mut CircuitBuilder,
    l: u32,
    (kind, branch): (LayerKind, u8),
    role: &str,
    weight: &str,
    x: TensorId,
    [in_dim, out_dim]: [usize; 2],
) -> Result<TensorId, CircuitError> {
    let w = b.weight(weight, &[out_dim, in_dim])?;
    b.op1(
        OpSpec::new(OpKind::Linear, format!("l{l}.{role}"), role)
            .layer(l, kind)
            .branch(branch)
            .inputs(&[x])
            .weights(&[w])
            .attr("in", int(in_dim))
            .attr("out", int(out_dim))
            .attr("bias", int(0)),
        OutSpec::rows(format!("l{l}.{role}.out"), Dtype::Bf16, out_dim),
    )
}

/// One Gated DeltaNet layer's token mixer on the normalised rows `x`.
pub(super) fn gdn_block(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    x: TensorId,
) -> Result<TensorId, CircuitError> {
    let la = cfg.linear_attn.as_ref().ok_or_else(|| {
        CircuitError::Build(format!(
            "layer {l} is linear attention but the config has no linear_* dims"
        ))
    })?;
    let p = format!("model.layers.{l}.linear_attn.");
    let hidden = cfg.hidden_size;
    let (key_dim, value_dim) = (la.key_dim(), la.value_dim());

    let qkvz_width = super::width(
        &format!("l{l}.in_proj_qkvz"),
        key_dim
            .checked_add(value_dim)
            .and_then(|sum| sum.checked_mul(2)),
    )?;
    let ba_width = super::width(
        &format!("l{l}.in_proj_ba"),
        la.num_value_heads.checked_mul(2),
    )?;
    let history = super::width(&format!("l{l}.conv history"), la.conv_kernel.checked_sub(1))?;
    let qkvz = projection(
        b,
        l,
        (LINEAR, 0),
        "in_proj_qkvz",
        &format!("{p}in_proj_qkvz.weight"),
        x,
        [hidden, qkvz_width],
    )?;
    let ba = projection(
        b,
        l,
        (LINEAR, 0),
        "in_proj_ba",
        &format!("{p}in_proj_ba.weight"),
        x,
        [hidden, ba_width],
    )?;
    let mixed = gdn_conv(b, la, l, &p, qkvz, history)?;
    let (beta, g) = gdn_gates(b, la, l, &p, ba)?;
    let core = gdn_recurrence(b, la, l, [mixed, beta, g])?;
    let norm_w = b.weight(&format!("{p}norm.weight"), &[la.value_head_dim])?;
    let normed = b.op1(
        gdn_dims(
            OpSpec::new(
                OpKind::GdnGatedNorm,
                format!("l{l}.gated_norm"),
                "gated_norm",
            ),
            la,
            l,
        )
        .inputs(&[core, qkvz])
        .weights(&[norm_w])
        .attr("eps", Attr::Float(cfg.rms_norm_eps)),
        OutSpec::rows(format!("l{l}.gdn_out"), Dtype::Bf16, value_dim),
    )?;
    projection(
        b,
        l,
        (LINEAR, 0),
        "out_proj",
        &format!("{p}out_proj.weight"),
        normed,
        [value_dim, hidden],
    )
}

/// A Gated DeltaNet op spec with its layer and the head counts and dims every GDN op carries.
fn gdn_dims(spec: OpSpec, la: &LinearAttnConfig, l: u32) -> OpSpec {
    spec.layer(l, LINEAR)
        .attr("key_heads", int(la.num_key_heads))
        .attr("key_dim", int(la.key_head_dim))
        .attr("value_heads", int(la.num_value_heads))
        .attr("value_dim", int(la.value_head_dim))
}

/// The causal conv1d (with SiLU) over the layer's conv state; returns the mixed rows.
fn gdn_conv(
    b: &mut CircuitBuilder,
    la: &LinearAttnConfig,
    l: u32,
    p: &str,
    qkvz: TensorId,
    history: usize,
) -> Result<TensorId, CircuitError> {
    let (conv_dim, kernel) = (la.conv_dim(), la.conv_kernel);
    let conv_state = b.state(
        format!("gdn_conv.{l}"),
        StateKind::GdnConv {
            layer: l,
            channels: conv_dim,
            history,
        },
    );
    let conv_w = b.weight(&format!("{p}conv1d.weight"), &[conv_dim, 1, kernel])?;
    let conv = b.op(
        gdn_dims(
            OpSpec::new(OpKind::GdnConv, format!("l{l}.conv"), "conv"),
            la,
            l,
        )
        .inputs(&[qkvz])
        .weights(&[conv_w])
        .meta(&[
            MetaField::StateSlots,
            MetaField::StateSlotsOut,
            MetaField::KeepSnapshots,
        ])
        .attr("kernel", int(kernel)),
        &[
            OutSpec::rows(format!("l{l}.mixed"), Dtype::Bf16, conv_dim),
            OutSpec {
                name: format!("l{l}.conv_state"),
                dtype: Dtype::Bf16,
                shape: Shape::rows(&[conv_dim]),
                binding: Binding::State(conv_state),
            },
        ],
    )?;
    Ok(conv[0])
}

/// The gates `(beta, g)` from `ba`, A_log and dt_bias.
fn gdn_gates(
    b: &mut CircuitBuilder,
    la: &LinearAttnConfig,
    l: u32,
    p: &str,
    ba: TensorId,
) -> Result<(TensorId, TensorId), CircuitError> {
    let nv = la.num_value_heads;
    let a_log = b.weight(&format!("{p}A_log"), &[nv])?;
    let dt_bias = b.weight(&format!("{p}dt_bias"), &[nv])?;
    let gates = b.op(
        gdn_dims(
            OpSpec::new(OpKind::GdnGates, format!("l{l}.gates"), "gates"),
            la,
            l,
        )
        .inputs(&[ba])
        .weights(&[a_log, dt_bias]),
        &[
            OutSpec::rows(format!("l{l}.beta"), Dtype::F32, nv),
            OutSpec::rows(format!("l{l}.g"), Dtype::F32, nv),
        ],
    )?;
    Ok((gates[0], gates[1]))
}

/// The gated delta rule over the layer's f32 recurrent state; returns the core output rows.
fn gdn_recurrence(
    b: &mut CircuitBuilder,
    la: &LinearAttnConfig,
    l: u32,
    [mixed, beta, g]: [TensorId; 3],
) -> Result<TensorId, CircuitError> {
    let value_dim = la.value_dim();
    let rec_state = b.state(
        format!("gdn_rec.{l}"),
        StateKind::GdnRecurrent {
            layer: l,
            heads: la.num_value_heads,
            key_dim: la.key_head_dim,
            value_dim: la.value_head_dim,
        },
    );
    let rec = b.op(
        gdn_dims(
            OpSpec::new(
                OpKind::GdnRecurrence,
                format!("l{l}.recurrence"),
                "recurrence",
            ),
            la,
            l,
        )
        .inputs(&[mixed, beta, g])
        .meta(&[
            MetaField::StateSlots,
            MetaField::StateSlotsOut,
            MetaField::KeepSnapshots,
        ]),
        &[
            OutSpec::rows(format!("l{l}.core"), Dtype::Bf16, value_dim),
            OutSpec {
                name: format!("l{l}.rec_state"),
                dtype: Dtype::F32,
                shape: Shape::rows(&[value_dim]),
                binding: Binding::State(rec_state),
            },
        ],
    )?;
    Ok(rec[0])
}

/// The routed experts' output plus the shared expert gated by sigmoid(shared_expert_gate(x)).
/// The shared expert and its gate run on branch 1 (a side stream beside the routed experts).
pub(super) fn with_shared_expert(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    x: TensorId,
    routed: TensorId,
    size: usize,
) -> Result<TensorId, CircuitError> {
    let p = format!("{}mlp.", super::layer_prefix(cfg, l));
    let hidden = cfg.hidden_size;
    let kind = match cfg.layer_types.get(l as usize) {
        Some(solder_config::LayerType::LinearAttention) => LINEAR,
        _ => LayerKind::FullAttention,
    };
    let gate = projection(
        b,
        l,
        (kind, 1),
        "shared_gate_proj",
        &format!("{p}shared_expert.gate_proj.weight"),
        x,
        [hidden, size],
    )?;
    let up = projection(
        b,
        l,
        (kind, 1),
        "shared_up_proj",
        &format!("{p}shared_expert.up_proj.weight"),
        x,
        [hidden, size],
    )?;
    let act = b.op1(
        OpSpec::new(
            OpKind::SiluMul,
            format!("l{l}.shared_silu_mul"),
            "shared_silu_mul",
        )
        .layer(l, kind)
        .branch(1)
        .inputs(&[gate, up])
        .attr("width", int(size)),
        OutSpec::rows(format!("l{l}.shared_act"), Dtype::Bf16, size),
    )?;
    let shared = projection(
        b,
        l,
        (kind, 1),
        "shared_down_proj",
        &format!("{p}shared_expert.down_proj.weight"),
        act,
        [size, hidden],
    )?;
    let shared_gate = projection(
        b,
        l,
        (kind, 1),
        "shared_expert_gate",
        &format!("{p}shared_expert_gate.weight"),
        x,
        [hidden, 1],
    )?;
    b.op1(
        OpSpec::new(
            OpKind::MoeCombine,
            format!("l{l}.moe_combine"),
            "moe_combine",
        )
        .layer(l, kind)
        .inputs(&[routed, shared, shared_gate])
        .attr("hidden", int(hidden)),
        OutSpec::rows(format!("l{l}.moe_out"), Dtype::Bf16, hidden),
    )
}
