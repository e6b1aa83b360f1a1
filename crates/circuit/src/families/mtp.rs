//! Qwen3-Next's multi-token-prediction (MTP) draft head, as the circuit of its own step
//! ([`Mode::Draft`](crate::Mode::Draft)). Composition as vLLM's `qwen3_next_mtp.py`
//! (`Qwen3NextMultiTokenPredictor`, `Qwen3NextMTP`) does it, the reference serving engine for these
//! checkpoints; transformers ignores `mtp.*`:
//!
//! - `e = pre_fc_norm_embedding(embed_tokens(token))`, `h = pre_fc_norm_hidden(hidden)`, both
//!   zero-centred RMSNorms, where `hidden` is the target's final-norm output (what its LM head
//!   reads, [`ModelInput::Hidden`]), and the row's token is the *next* one: the pair
//!   (hidden\[p\], token\[p+1\]) sits at position p and predicts token p+2;
//! - `x = fc([e; h])`, `mtp.fc.weight` `[hidden, 2 * hidden]`, embedding first (vLLM's
//!   `torch.cat([inputs_embeds, hidden_states], dim=-1)`); `x` starts the head's residual
//!   stream (vLLM passes `residual=None`);
//! - one decoder layer of the full-attention kind (`mtp.layers.0.*`, the config's MLP: MoE and
//!   the shared expert for the real models, the sparse/dense choice by the head's own layer
//!   index 0 as vLLM's `extract_layer_index("mtp.layers.0")`), with its own KV cache;
//! - `mtp.norm`, kept as [`ModelOutput::DraftHidden`] (the next draft step's `hidden`), then the
//!   target's LM head (vLLM shares `lm_head` and `embed_tokens` with the target).
//!
//! Differences kept on purpose: the concatenated pre-fc norms are one op (`MtpPreFc`), and `fc`
//! writes f32 (an LM-head-shaped projection, [`OpKind::LmHead`] with role `mtp_fc`) because the
//! head's residual stream is f32 like the target's.
//!
//! Invariant: the draft circuit starts from the target's weight slots and state declarations
//! ([`CircuitBuilder::extending`](crate::builder::CircuitBuilder::extending)), so one weights
//! layout and one state layout serve both, the shared embedding and LM head are the target's own
//! slots, and the head's layer is numbered after the target's (`l{num_hidden_layers}`), its KV
//! state `kv.{num_hidden_layers}` on the same pages and block tables as the target's layers.

use solder_config::{Family, ModelConfig};

use super::dense;
use super::parts::{self, int, ATTN};
use super::CircuitOptions;
use crate::builder::{CircuitBuilder, OpSpec, OutSpec};
use crate::error::CircuitError;
use crate::ir::{Attr, Binding, Circuit, Dtype, ModelInput, ModelOutput, Shape};
use crate::ops::OpKind;

/// Every draft-head tensor's checkpoint name starts with this.
pub const MTP_PREFIX: &str = "mtp.";

/// The draft head's step circuit for `config`, extending `target` (the circuit built with
/// `build_target_with_hidden` for the same config and options). Refused for a family without
/// an MTP head.
pub fn build_draft(
    config: &ModelConfig,
    target: &Circuit,
    options: CircuitOptions,
) -> Result<Circuit, CircuitError> {
    if config.family != Family::Qwen3Next {
        return Err(CircuitError::Unsupported {
            source_name: config.source.clone(),
            message: format!(
                "an MTP draft head (`mtp.*`, draft programs) is qwen3_next's; {} has none: \
                 leave `draft_widths` empty or use a draft model",
                config.family.as_str()
            ),
        });
    }
    let (hidden, vocab) = (config.hidden_size, config.vocab_size);
    let l = config.num_hidden_layers as u32;
    let mut b = CircuitBuilder::extending(target, format!("{}.mtp", target.name));

    let tokens = b.input(OutSpec {
        name: "tokens".into(),
        dtype: Dtype::I32,
        shape: Shape::rows(&[]),
        binding: Binding::Input(ModelInput::Tokens),
    });
    let target_hidden = b.input(
        OutSpec::rows("hidden", Dtype::Bf16, hidden).bound(Binding::Input(ModelInput::Hidden)),
    );
    let embed_w = b.weight("model.embed_tokens.weight", &[vocab, hidden])?;
    let e = b.op1(
        OpSpec::new(OpKind::Embedding, "mtp.embed", "embed_tokens")
            .inputs(&[tokens])
            .weights(&[embed_w])
            .attr("vocab", int(vocab))
            .attr("hidden", int(hidden)),
        OutSpec::rows("mtp.embed.out", Dtype::F32, hidden),
    )?;
    let w_e = b.weight(
        &format!("{MTP_PREFIX}pre_fc_norm_embedding.weight"),
        &[hidden],
    )?;
    let w_h = b.weight(&format!("{MTP_PREFIX}pre_fc_norm_hidden.weight"), &[hidden])?;
    let both = super::width("mtp.pre_fc", hidden.checked_mul(2))?;
    let pre = b.op1(
        OpSpec::new(OpKind::MtpPreFc, "mtp.pre_fc", "mtp_pre_fc")
            .layer(l, ATTN)
            .inputs(&[e, target_hidden])
            .weights(&[w_e, w_h])
            .attr("eps", Attr::Float(config.rms_norm_eps))
            .attr("hidden", int(hidden)),
        OutSpec::rows("mtp.pre_fc.out", Dtype::Bf16, both),
    )?;
    let fc_w = b.weight(&format!("{MTP_PREFIX}fc.weight"), &[hidden, both])?;
    // An f32-output projection (the LM head's op: `vocab` is its output width), so `x` starts
    // the head's f32 residual stream.
    let x = b.op1(
        OpSpec::new(OpKind::LmHead, "mtp.fc", "mtp_fc")
            .layer(l, ATTN)
            .inputs(&[pre])
            .weights(&[fc_w])
            .attr("vocab", int(hidden))
            .attr("hidden", int(both)),
        OutSpec::rows("mtp.x", Dtype::F32, hidden),
    )?;
    let h = dense::layer(&mut b, config, l, x, options)?;
    let out = parts::rms_norm_to(
        &mut b,
        config,
        (None, "final_norm"),
        &format!("{MTP_PREFIX}norm.weight"),
        h,
        Binding::Output(ModelOutput::DraftHidden),
    )?;
    dense::lm_head(&mut b, config, out)?;
    b.finish()
}
