//! The dense decoder family (llama, mistral, qwen2, qwen3): embedding; per layer input norm,
//! q/k/v projections (bias where the config has it), qk-norm (qwen3), rope, KV write,
//! paged attention, o projection, residual add, post-attention norm, gate/up, SiLU·mul,
//! down, residual add; final norm; LM head (tied or not).
//!
//! Invariant: weight slot names are the checkpoint's tensor names; the residual stream is
//! f32, activations bf16, logits f32.

use solder_config::{LayerType, ModelConfig};

use super::CircuitOptions;
use crate::builder::{CircuitBuilder, OpSpec, OutSpec};
use crate::error::CircuitError;
use crate::ir::{
    Attr, Binding, Circuit, Dtype, LayerKind, MetaField, ModelInput, ModelOutput, Shape, TensorId,
};
use crate::ops::OpKind;

pub(super) const ATTN: LayerKind = LayerKind::FullAttention;

pub(super) fn int(v: usize) -> Attr {
    Attr::Int(v as i64)
}

/// The decoder's step circuit; with `keep_hidden` the final norm's output is kept as the model
/// output `Hidden` (what an MTP draft head reads), else it stays an arena edge.
pub(super) fn build(
    cfg: &ModelConfig,
    name: &str,
    options: CircuitOptions,
    keep_hidden: bool,
) -> Result<Circuit, CircuitError> {
    let (hidden, vocab) = (cfg.hidden_size, cfg.vocab_size);
    let layers = cfg.num_hidden_layers as u32;
    let mut b = CircuitBuilder::new(name, cfg.family.as_str(), layers);

    let tokens = b.input(OutSpec {
        name: "tokens".into(),
        dtype: Dtype::I32,
        shape: Shape::rows(&[]),
        binding: Binding::Input(ModelInput::Tokens),
    });
    let embed_w = b.weight("model.embed_tokens.weight", &[vocab, hidden])?;
    let mut h = b.op1(
        OpSpec::new(OpKind::Embedding, "embed", "embed_tokens")
            .inputs(&[tokens])
            .weights(&[embed_w])
            .attr("vocab", int(vocab))
            .attr("hidden", int(hidden)),
        OutSpec::rows("h.embed", Dtype::F32, hidden),
    )?;

    for l in 0..layers {
        h = layer(&mut b, cfg, l, h, options)?;
    }

    let x = rms_norm_to(
        &mut b,
        cfg,
        (None, "final_norm"),
        "model.norm.weight",
        h,
        if keep_hidden {
            Binding::Output(ModelOutput::Hidden)
        } else {
            Binding::Arena
        },
    )?;
    lm_head(&mut b, cfg, x)?;
    b.finish()
}

/// The LM head over `x` (the final norm's output): the model's logits, through
/// `lm_head.weight`, or the embedding when tied.
pub(super) fn lm_head(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    x: TensorId,
) -> Result<(), CircuitError> {
    let (vocab, hidden) = (cfg.vocab_size, cfg.hidden_size);
    let head_name = if cfg.tie_word_embeddings {
        "model.embed_tokens.weight"
    } else {
        "lm_head.weight"
    };
    let head_w = b.weight(head_name, &[vocab, hidden])?;
    b.op1(
        OpSpec::new(OpKind::LmHead, "lm_head", "lm_head")
            .inputs(&[x])
            .weights(&[head_w])
            .meta(&[MetaField::WantLogits])
            .attr("vocab", int(vocab))
            .attr("hidden", int(hidden)),
        OutSpec::rows("logits", Dtype::F32, vocab).bound(Binding::Output(ModelOutput::Logits)),
    )?;
    Ok(())
}

/// One decoder layer: op names and state `l`, weights under `super::layer_prefix(cfg, l)`.
pub(super) fn layer(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    h: TensorId,
    options: CircuitOptions,
) -> Result<TensorId, CircuitError> {
    let p = super::layer_prefix(cfg, l);
    let hidden = cfg.hidden_size;

    let x = rms_norm(
        b,
        cfg,
        Some(l),
        "input_layernorm",
        &format!("{p}input_layernorm.weight"),
        h,
    )?;
    let o = match cfg.layer_types.get(l as usize) {
        Some(LayerType::LinearAttention) => super::next::gdn_block(b, cfg, l, x)?,
        _ => super::attention::attention(b, cfg, l, x, options)?,
    };
    let h = residual_add(b, l, "attn_residual", h, o, hidden)?;

    let x = rms_norm(
        b,
        cfg,
        Some(l),
        "post_attention_layernorm",
        &format!("{p}post_attention_layernorm.weight"),
        h,
    )?;
    let down = match &cfg.moe {
        Some(moe) if moe.is_sparse_layer(super::mlp_index(cfg, l)) => {
            let routed = super::moe::moe_block(b, cfg, moe, l, x)?;
            match moe.shared_expert_intermediate_size {
                Some(size) => super::next::with_shared_expert(b, cfg, l, x, routed, size)?,
                None => routed,
            }
        }
        _ => dense_mlp(b, cfg, l, x)?,
    };
    residual_add(b, l, "mlp_residual", h, down, hidden)
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

/// gate/up projections, SiLU·mul, down projection.
pub(super) fn dense_mlp(
    b: &mut CircuitBuilder,
    cfg: &ModelConfig,
    l: u32,
    x: TensorId,
) -> Result<TensorId, CircuitError> {
    let p = super::layer_prefix(cfg, l);
    let (hidden, inter) = (cfg.hidden_size, cfg.intermediate_size);
    let gate = linear(
        b,
        l,
        "gate_proj",
        &format!("{p}mlp.gate_proj"),
        x,
        [hidden, inter],
        false,
    )?;
    let up = linear(
        b,
        l,
        "up_proj",
        &format!("{p}mlp.up_proj"),
        x,
        [hidden, inter],
        false,
    )?;
    let act = b.op1(
        OpSpec::new(OpKind::SiluMul, format!("l{l}.silu_mul"), "silu_mul")
            .layer(l, ATTN)
            .inputs(&[gate, up])
            .attr("width", int(inter)),
        OutSpec::rows(format!("l{l}.act"), Dtype::Bf16, inter),
    )?;
    linear(
        b,
        l,
        "down_proj",
        &format!("{p}mlp.down_proj"),
        act,
        [inter, hidden],
        false,
    )
}
