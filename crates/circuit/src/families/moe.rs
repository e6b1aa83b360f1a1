//! The sparse MoE block (qwen3_moe, qwen3_next): router linear, softmax and top-k (with
//! optional renormalisation), the chosen experts' gate/up + SiLU·mul, their down projections
//! weighted and summed.
//!
//! Invariant: expert weights are slots stacked at load from the checkpoint's one tensor per
//! expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`), so a missing expert is refused by
//! its tensor name.

use solder_config::{ModelConfig, MoeConfig};

use super::parts::{int, ATTN};
use crate::builder::{CircuitBuilder, OpSpec, OutSpec};
use crate::error::CircuitError;
use crate::ir::{Dtype, TensorId};
use crate::ops::OpKind;

/// The routed experts' output for the normalised rows `x` (bf16 `[n, hidden]`).
pub(super) fn moe_block(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    moe: &MoeConfig,
    l: u32,
    x: TensorId,
) -> Result<TensorId, CircuitError> {
    let p = format!("{}mlp.", super::layer_prefix(cfg, l));
    let (hidden, inter) = (cfg.hidden_size, moe.moe_intermediate_size);
    let (experts, k) = (moe.num_experts, moe.experts_per_token);
    let router_w = b.weight(&format!("{p}gate.weight"), &[experts, hidden])?;
    let logits = b.op1(
        OpSpec::new(OpKind::Router, format!("l{l}.router"), "router")
            .layer(l, ATTN)
            .inputs(&[x])
            .weights(&[router_w])
            .attr("hidden", int(hidden))
            .attr("experts", int(experts)),
        OutSpec::rows(format!("l{l}.router_logits"), Dtype::F32, experts),
    )?;
    let routed = b.op(
        OpSpec::new(OpKind::TopkSoftmax, format!("l{l}.topk"), "topk")
            .layer(l, ATTN)
            .inputs(&[logits])
            .attr("experts", int(experts))
            .attr("k", int(k))
            .attr("norm_topk", int(moe.norm_topk_prob as usize)),
        &[
            OutSpec::rows(format!("l{l}.expert_ids"), Dtype::I32, k),
            OutSpec::rows(format!("l{l}.expert_weights"), Dtype::F32, k),
        ],
    )?;
    let stacked = |b: &mut CircuitBuilder, proj: &str, shape: &[usize]| {
        let parts = (0..experts)
            .map(|e| format!("{p}experts.{e}.{proj}.weight"))
            .collect();
        b.weight_stacked(&format!("{p}experts.*.{proj}.weight"), parts, shape)
    };
    let gate_w = stacked(b, "gate_proj", &[inter, hidden])?;
    let up_w = stacked(b, "up_proj", &[inter, hidden])?;
    let down_w = stacked(b, "down_proj", &[hidden, inter])?;
    let dims = |spec: OpSpec| {
        spec.layer(l, ATTN)
            .attr("hidden", int(hidden))
            .attr("inter", int(inter))
            .attr("experts", int(experts))
            .attr("k", int(k))
    };
    let act = b.op1(
        dims(OpSpec::new(
            OpKind::MoeGateUp,
            format!("l{l}.experts_gate_up"),
            "experts",
        ))
        .inputs(&[x, routed[0]])
        .weights(&[gate_w, up_w]),
        OutSpec::rows(
            format!("l{l}.experts_act"),
            Dtype::Bf16,
            super::width(&format!("l{l}.experts_act"), k.checked_mul(inter))?,
        ),
    )?;
    b.op1(
        dims(OpSpec::new(
            OpKind::MoeDown,
            format!("l{l}.experts_down"),
            "experts",
        ))
        .inputs(&[act, routed[0], routed[1]])
        .weights(&[down_w]),
        OutSpec::rows(format!("l{l}.experts_out"), Dtype::Bf16, hidden),
    )
}
