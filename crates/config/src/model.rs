//! [`ModelConfig`]: the dims, rope, attention features, experts and layer kinds of a model, parsed
//! from a Hugging Face `config.json`. Invariant: a `ModelConfig` built by
//! [`from_json_str`](ModelConfig::from_json_str) has every dim non-zero, `num_key_value_heads`
//! dividing `num_attention_heads`, an even `head_dim` and rotary dim, `q_dim`/`kv_dim` that fit in
//! `usize`, every dim within [`DIM_BOUNDS`](crate::DIM_BOUNDS), `rms_norm_eps` a normal f32, one
//! `layer_types` entry per layer, one `layer_windows` entry per layer with every window in
//! `1..=max_position_embeddings`, `moe` exactly for Qwen3-MoE and Qwen3-Next, and `linear_attn`
//! exactly for Qwen3-Next.

use std::path::Path;

use serde_json::Value;

use crate::family::{check_architectures, family_of};
use crate::features::check_features;
use crate::fields::{describe, Fields};
use crate::hybrid::{parse_layer_types, parse_linear_attn, LayerType, LinearAttnConfig};
use crate::keys::{classify, KeyReport};
use crate::moe::{parse_moe, MoeConfig};
use crate::quant::{parse_quantization, Quantization};
use crate::rope::{parse_rope, Rope};
use crate::window::parse_windows;
use crate::{ConfigError, Family};

/// What solder needs to know about a model to build its decode step.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    /// The path it was loaded from, or the name given to `from_json_str`.
    pub source: String,
    pub hidden_size: usize,
    /// Width of the dense MLP; in the MoE families, of the layers that are not sparse.
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// `num_attention_heads` when absent or null, as transformers.
    pub num_key_value_heads: usize,
    /// Explicit `head_dim`, or `hidden_size / num_attention_heads` (256 for Qwen3-Next, as
    /// transformers' `Qwen3NextConfig`).
    pub head_dim: usize,
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (always for qwen2).
    pub attention_bias: bool,
    /// Per-head RMS norm on q and k before rope (qwen3, qwen3_moe, qwen3_next).
    pub qk_norm: bool,
    pub rope: Rope,
    /// The routed experts (qwen3_moe, qwen3_next); `None` for a dense MLP in every layer.
    pub moe: Option<MoeConfig>,
    /// The Gated DeltaNet dims of the linear-attention layers (qwen3_next).
    pub linear_attn: Option<LinearAttnConfig>,
    /// The token mixer of each layer, one per layer; all `FullAttention` but for qwen3_next.
    pub layer_types: Vec<LayerType>,
    /// The sliding window of each layer's attention, one per layer (`None`: full causal
    /// attention; always `None` for a linear-attention layer). A window W lets the query at
    /// position i see the keys j with `i - W < j <= i`, the last W positions (`window`).
    pub layer_windows: Vec<Option<usize>>,
    /// Every `Qwen3NextRMSNorm` (layer norms, final norm, q/k norms) scales by `1 + weight`
    /// (qwen3_next); the Gated DeltaNet's own gated norm does not.
    pub zero_centred_norms: bool,
    /// q_proj yields `2 * q_dim()`: per head, the query then a gate whose sigmoid scales the
    /// attention output before o_proj (qwen3_next).
    pub attn_output_gate: bool,
    /// The checkpoint's `quantization_config`, when it stores weights quantized.
    pub quantization: Option<Quantization>,
    /// Every top-level key of the file with its classification, sorted by key.
    pub keys: Vec<KeyReport>,
    /// Every key inside `quantization_config` (dotted, `quantization_config.bits`, nested
    /// groups included) with its classification, sorted by key; empty without one.
    pub quantization_keys: Vec<KeyReport>,
}

/// The largest `config.json` read (real ones are a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

impl ModelConfig {
    /// Reads and parses `path`, which must be a regular file of at most `MAX_CONFIG_BYTES`
    /// (a device or a pipe such as `/dev/zero` is refused before anything is read); errors
    /// name the path.
    pub fn from_file(path: &Path) -> Result<ModelConfig, ConfigError> {
        use crate::file_guard::{read_capped, FileRefusal};
        let source = path.display().to_string();
        let bytes = read_capped(path, MAX_CONFIG_BYTES).map_err(|refusal| match refusal {
            FileRefusal::Io(err) => ConfigError::Read {
                file: source.clone(),
                source: err,
            },
            other => ConfigError::NotAConfigFile {
                file: source.clone(),
                problem: other.to_string(),
            },
        })?;
        let text = String::from_utf8(bytes).map_err(|err| ConfigError::Read {
            file: source.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, err),
        })?;
        Self::from_json_str(&text, &source)
    }

    /// Parses the text of a `config.json`; `source` names it in errors and in `self.source`.
    pub fn from_json_str(text: &str, source: &str) -> Result<ModelConfig, ConfigError> {
        // serde_json keeps the last of two equal keys: refused first, naming the key.
        crate::json_keys::first_duplicate(text.as_bytes())
            .map_err(|err| json_error(source, &err))?;
        let value: Value = serde_json::from_str(text).map_err(|err| json_error(source, &err))?;
        let Value::Object(map) = &value else {
            return Err(ConfigError::NotAnObject {
                file: source.to_string(),
                found: describe(&value),
            });
        };
        let fields = Fields::new(source, "", map);
        let family = family_of(&fields)?;
        let keys = classify(family, &fields)?;
        check_architectures(&fields, family)?;
        parse_model(&fields, family, keys)
    }

    /// Width of the k (or v) projection: `num_key_value_heads * head_dim`. Saturates rather
    /// than wraps on a hand-built config outside `DIM_BOUNDS` (`check_bounds` refuses it).
    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads.saturating_mul(self.head_dim)
    }

    /// Width of the queries: `num_attention_heads * head_dim` (q_proj yields twice this with
    /// `attn_output_gate`). Saturates as `kv_dim`.
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads.saturating_mul(self.head_dim)
    }

    /// The window every attention layer's keys lie within, when each has one: the widest
    /// window. `None` when any attention layer attends over the whole context (then no KV page
    /// of a sequence ever falls out of use). Linear-attention layers hold no KV and do not count.
    pub fn kv_window(&self) -> Option<usize> {
        let mut widest = None;
        for (kind, window) in self.layer_types.iter().zip(&self.layer_windows) {
            if *kind == LayerType::FullAttention {
                widest = Some(widest.unwrap_or(0).max((*window)?));
            }
        }
        widest
    }
}

/// serde_json's message ends with its own " at line L column C"; the error states them once.
fn json_error(source: &str, err: &serde_json::Error) -> ConfigError {
    let text = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    ConfigError::Json {
        file: source.to_string(),
        line: err.line(),
        column: err.column(),
        message: text.strip_suffix(&suffix).unwrap_or(&text).to_string(),
    }
}

/// `head_dim` of Qwen3-Next when the key is absent (transformers' `Qwen3NextConfig`).
const QWEN3_NEXT_DEFAULT_HEAD_DIM: usize = 256;

/// The rotary share when the file gives none: `Qwen3NextConfig` sets 0.25 for compatibility
/// with the published checkpoints; every other family rotates the whole head.
fn default_partial_rotary_factor(family: Family) -> f64 {
    match family {
        Family::Qwen3Next => 0.25,
        _ => 1.0,
    }
}

fn positive(fields: &Fields<'_>, key: &str) -> Result<usize, ConfigError> {
    match fields.req_usize(key)? {
        0 => Err(fields.invalid(key, 0, "a positive integer")),
        value => Ok(value),
    }
}

fn parse_model(
    fields: &Fields<'_>,
    family: Family,
    keys: Vec<KeyReport>,
) -> Result<ModelConfig, ConfigError> {
    let hidden_size = positive(fields, "hidden_size")?;
    let intermediate_size = positive(fields, "intermediate_size")?;
    // Bounded (`DIM_BOUNDS`) as it is read: per-layer tables are allocated from this count.
    let num_hidden_layers = positive(fields, "num_hidden_layers")?;
    let num_attention_heads = positive(fields, "num_attention_heads")?;
    let vocab_size = positive(fields, "vocab_size")?;
    let max_position_embeddings = positive(fields, "max_position_embeddings")?;

    let (num_key_value_heads, head_dim) =
        parse_heads(fields, family, hidden_size, num_attention_heads)?;
    let rms_norm_eps = fields.positive_f32("rms_norm_eps", fields.req_f64("rms_norm_eps")?)?;

    let rope = parse_checked_rope(fields, family, head_dim)?;
    let attention_bias = check_features(fields, family)?;
    let layer_windows = parse_windows(fields, family, num_hidden_layers, max_position_embeddings)?;
    // Every family solder models defaults to an untied LM head in transformers.
    let tie_word_embeddings = fields.opt_bool("tie_word_embeddings")?.unwrap_or(false);
    let moe = parse_moe(fields, family, num_hidden_layers)?;
    let linear_attn = parse_linear_attn(fields, family)?;
    let layer_types = parse_layer_types(fields, family, num_hidden_layers)?;
    let qwen3_next = family == Family::Qwen3Next;
    let (quantization, quantization_keys) = parse_quantization(fields)?;

    Ok(ModelConfig {
        family,
        source: fields.file().to_string(),
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size,
        max_position_embeddings,
        rms_norm_eps,
        tie_word_embeddings,
        attention_bias,
        qk_norm: matches!(family, Family::Qwen3 | Family::Qwen3Moe | Family::Qwen3Next),
        rope,
        moe,
        linear_attn,
        layer_types,
        layer_windows,
        zero_centred_norms: qwen3_next,
        attn_output_gate: qwen3_next,
        quantization,
        keys,
        quantization_keys,
    })
}

/// `(num_key_value_heads, head_dim)`: kv heads default to the heads and divide them; head_dim
/// defaults per family or from the hidden size, is even, and its product with the heads fits.
fn parse_heads(
    fields: &Fields<'_>,
    family: Family,
    hidden_size: usize,
    num_attention_heads: usize,
) -> Result<(usize, usize), ConfigError> {
    let num_key_value_heads = match fields.opt_usize("num_key_value_heads")? {
        None => num_attention_heads,
        Some(kv) if kv == 0 || !num_attention_heads.is_multiple_of(kv) => {
            return Err(fields.invalid(
                "num_key_value_heads",
                kv,
                format!("a positive divisor of num_attention_heads ({num_attention_heads})"),
            ))
        }
        Some(kv) => kv,
    };
    let head_dim = match fields.opt_usize("head_dim")? {
        Some(head_dim) => head_dim,
        // Qwen3NextConfig declares `head_dim: int = 256`, so transformers never derives it.
        None if family == Family::Qwen3Next => QWEN3_NEXT_DEFAULT_HEAD_DIM,
        None if hidden_size.is_multiple_of(num_attention_heads) => {
            hidden_size / num_attention_heads
        }
        None => {
            return Err(fields.invalid(
                "hidden_size",
                hidden_size,
                format!(
                "a multiple of num_attention_heads ({num_attention_heads}) when head_dim is absent"
            ),
            ))
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(fields.invalid(
            "head_dim",
            head_dim,
            "an even positive integer (rope rotates channel pairs)",
        ));
    }
    if num_attention_heads.checked_mul(head_dim).is_none() {
        return Err(fields.invalid(
            "head_dim",
            head_dim,
            "num_attention_heads * head_dim to fit in memory sizes",
        ));
    }
    Ok((num_key_value_heads, head_dim))
}

/// The rope settings, checked to give an even positive rotary dim of `head_dim`.
fn parse_checked_rope(
    fields: &Fields<'_>,
    family: Family,
    head_dim: usize,
) -> Result<Rope, ConfigError> {
    let rope = parse_rope(fields, default_partial_rotary_factor(family))?;
    let rotary_dim = rope.rotary_dim(head_dim);
    if rotary_dim == 0 || rotary_dim % 2 != 0 {
        return Err(fields.invalid(
            "partial_rotary_factor",
            rope.partial_rotary_factor,
            format!("a factor giving an even positive rotary dim of head_dim {head_dim} (got {rotary_dim})"),
        ));
    }
    Ok(rope)
}
