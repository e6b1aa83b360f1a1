//! The dense decoder family (llama, mistral, qwen2, qwen3): embedding; per layer input norm,
//! q/k/v projections (bias where the config has it), qk-norm (qwen3), rope, KV write,
//! paged attention, o projection, residual add, post-attention norm, gate/up, SiLU·mul,
//! down, residual add; final norm; LM head (tied or not).
//!
//! Invariant: weight slot names are the checkpoint's tensor names; the residual stream is
//! f32, activations bf16, logits f32.

use solder_config::{LayerType, ModelConfig};

use super::parts::{int, linear, residual_add, rms_norm, rms_norm_to, ATTN};
use super::CircuitOptions;
use crate::builder::{CircuitBuilder, OpSpec, OutSpec};
use crate::error::CircuitError;
use crate::ir::{Binding, Circuit, Dtype, MetaField, ModelInput, ModelOutput, Shape, TensorId};
use crate::ops::OpKind;

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
