//! The ops every family's circuit is made of: norms, projections and residual adds, named
//! and bound as the families name them (`l{layer}.{role}`, outputs in the arena unless bound).

use solder_config::ModelConfig;

use crate::builder::{CircuitBuilder, OpSpec, OutSpec};
use crate::error::CircuitError;
use crate::ir::{Attr, Binding, Dtype, LayerKind, TensorId};
use crate::ops::OpKind;

pub(super) const ATTN: LayerKind = LayerKind::FullAttention;

pub(super) fn int(v: usize) -> Attr {
    Attr::Int(v as i64)
}

pub(super) fn rms_norm(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    layer: Option<u32>,
    role: &str,
    weight: &str,
    x: TensorId,
) -> Result<TensorId, CircuitError> {
    rms_norm_to(b, cfg, (layer, role), weight, x, Binding::Arena)
}

/// `rms_norm` with its output bound to `binding`.
pub(super) fn rms_norm_to(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    (layer, role): (Option<u32>, &str),
    weight: &str,
    x: TensorId,
    binding: Binding,
) -> Result<TensorId, CircuitError> {
    let w = b.weight(weight, &[cfg.hidden_size])?;
    let kind = if cfg.zero_centred_norms {
        OpKind::RmsNormZc
    } else {
        OpKind::RmsNorm
    };
    let mut spec = OpSpec::new(kind, op_name(layer, role), role)
        .inputs(&[x])
        .weights(&[w])
        .attr("eps", Attr::Float(cfg.rms_norm_eps))
        .attr("hidden", int(cfg.hidden_size));
    if let Some(l) = layer {
        spec = spec.layer(l, ATTN);
    }
    b.op1(
        spec,
        OutSpec::rows(
            format!("{}.out", op_name(layer, role)),
            Dtype::Bf16,
            cfg.hidden_size,
        )
        .bound(binding),
    )
}

/// A projection `[in_dim, out_dim]` of `x`, with a bias when `bias`.
pub(super) fn linear(
    b: &mut CircuitBuilder,
    l: u32,
    role: &str,
    prefix: &str,
    x: TensorId,
    [in_dim, out_dim]: [usize; 2],
    bias: bool,
) -> Result<TensorId, CircuitError> {
    let mut weights = vec![b.weight(&format!("{prefix}.weight"), &[out_dim, in_dim])?];
    if bias {
        weights.push(b.weight(&format!("{prefix}.bias"), &[out_dim])?);
    }
    b.op1(
        OpSpec::new(OpKind::Linear, format!("l{l}.{role}"), role)
            .layer(l, ATTN)
            .inputs(&[x])
            .weights(&weights)
            .attr("in", int(in_dim))
            .attr("out", int(out_dim))
            .attr("bias", int(bias as usize)),
        OutSpec::rows(format!("l{l}.{role}.out"), Dtype::Bf16, out_dim),
    )
}

pub(super) fn residual_add(
    b: &mut CircuitBuilder,
    l: u32,
    role: &str,
    h: TensorId,
    x: TensorId,
    hidden: usize,
) -> Result<TensorId, CircuitError> {
    b.op1(
        OpSpec::new(OpKind::ResidualAdd, format!("l{l}.{role}"), role)
            .layer(l, ATTN)
            .inputs(&[h, x])
            .attr("hidden", int(hidden)),
        OutSpec::rows(
            format!("l{l}.h_{}", role.trim_end_matches("_residual")),
            Dtype::F32,
            hidden,
        ),
    )
}

fn op_name(layer: Option<u32>, role: &str) -> String {
    match layer {
        Some(l) => format!("l{l}.{role}"),
        None => role.to_string(),
    }
}
