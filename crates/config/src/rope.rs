//! Rotary position embedding: its parameters from either config format (legacy `rope_theta` +
//! `rope_scaling`, or transformers-5 `rope_parameters`) and the inverse frequencies, computed
//! op for op as transformers computes them in f32 so that cos/sin tables match its bytes.

use serde_json::Value;

use crate::bounds::positive_f32;
use crate::fields::Fields;
use crate::ConfigError;

/// Rotary embedding parameters of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
    /// Share of `head_dim` that rotates; 1.0 for the dense families, 0.25 by default for
    /// Qwen3-Next.
    pub partial_rotary_factor: f64,
}

/// The rope type: how the default inverse frequencies are rescaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

const DEFAULT_THETA: f64 = 10000.0;

/// Keys a rope block may hold, whatever its type; the type then decides which are required.
const LLAMA3_KEYS: &[&str] = &[
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
];

impl Rope {
    /// Rotated channels per head: `int(head_dim * partial_rotary_factor)`, as transformers.
    pub fn rotary_dim(&self, head_dim: usize) -> usize {
        (head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// Inverse frequencies, `rotary_dim / 2` of them, in f32 exactly as transformers'
    /// `_compute_default_rope_parameters` and `_compute_llama3_parameters`.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        let dim = self.rotary_dim(head_dim);
        // torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), every op in f32.
        let base = self.theta as f32;
        let default = (0..dim / 2).map(|i| 1.0f32 / base.powf((2 * i) as f32 / dim as f32));
        match &self.scaling {
            RopeScaling::Default => default.collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let llama3 = Llama3 {
                    factor: *factor,
                    low_freq_factor: *low_freq_factor,
                    high_freq_factor: *high_freq_factor,
                    old_context_len: *original_max_position_embeddings,
                };
                default.map(|inv_freq| llama3.rescale(inv_freq)).collect()
            }
        }
    }

    /// Factor applied to cos and sin; 1.0 for the default and llama3 types.
    pub fn attention_scaling(&self) -> f32 {
        1.0
    }
}

struct Llama3 {
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    old_context_len: usize,
}

impl Llama3 {
    /// One entry of `_compute_llama3_parameters`. Python scalars meet f32 tensors, so each is
    /// cast to f32 at the op that uses it; `scalar / tensor` is torch's `reciprocal() * scalar`.
    #[allow(clippy::neg_cmp_op_on_partial_ord)] // mirrors torch's `~(a < b)`, NaN included
    fn rescale(&self, inv_freq: f32) -> f32 {
        let factor = self.factor as f32;
        let old_context_len = self.old_context_len as f32;
        // Python float divisions, cast to f32 where they meet the tensor.
        let low_freq_wavelen = (self.old_context_len as f64 / self.low_freq_factor) as f32;
        let high_freq_wavelen = (self.old_context_len as f64 / self.high_freq_factor) as f32;
        let factor_span = (self.high_freq_factor - self.low_freq_factor) as f32;

        let wavelen = (1.0f32 / inv_freq) * (2.0 * std::f64::consts::PI) as f32;
        let inv_freq_llama = if wavelen > low_freq_wavelen {
            inv_freq / factor
        } else {
            inv_freq
        };
        let smooth_factor =
            ((1.0f32 / wavelen) * old_context_len - self.low_freq_factor as f32) / factor_span;
        let smoothed =
            (1.0f32 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama;
        let is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        if is_medium_freq {
            smoothed
        } else {
            inv_freq_llama
        }
    }
}

/// Reads the rope from the top level of a config: `rope_theta`, `partial_rotary_factor`, and
/// one of `rope_scaling` (legacy) or `rope_parameters` (transformers 5).
/// `default_partial_rotary_factor` applies when neither place gives one (1.0, or 0.25 for
/// Qwen3-Next, whose transformers config sets that default).
pub(crate) fn parse_rope(
    top: &Fields<'_>,
    default_partial_rotary_factor: f64,
) -> Result<Rope, ConfigError> {
    let scaling_block = top.opt_object("rope_scaling")?;
    let parameters_block = top.opt_object("rope_parameters")?;
    let top_theta = top.opt_f64("rope_theta")?;
    let top_partial = top.opt_f64("partial_rotary_factor")?;

    let (block, legacy) = match (scaling_block, parameters_block) {
        (Some(_), Some(_)) => {
            return Err(top.invalid(
                "rope_scaling",
                "an object",
                "null when rope_parameters is given (one rope description, not two)",
            ))
        }
        (Some(block), None) => (Some(block), true),
        (None, Some(block)) => (Some(block), false),
        (None, None) => (None, true),
    };

    let (scaling, block_theta, block_partial) = match &block {
        None => (RopeScaling::Default, None, None),
        Some(block) => parse_block(block, legacy)?,
    };

    let theta = agree(top, "rope_theta", top_theta, block_theta)?.unwrap_or(DEFAULT_THETA);
    // `inv_freq` raises `theta as f32`: 1e39 would be infinite, 1e-50 zero.
    let theta = positive_f32(top, "rope_theta", theta)?;
    let partial_rotary_factor = agree(top, "partial_rotary_factor", top_partial, block_partial)?
        .unwrap_or(default_partial_rotary_factor);
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
        return Err(top.invalid(
            "partial_rotary_factor",
            partial_rotary_factor,
            "a number in (0, 1]",
        ));
    }
    Ok(Rope {
        theta,
        scaling,
        partial_rotary_factor,
    })
}

/// A value given both at the top level and inside `rope_parameters` must be the same.
fn agree(
    top: &Fields<'_>,
    key: &str,
    top_value: Option<f64>,
    block_value: Option<f64>,
) -> Result<Option<f64>, ConfigError> {
    match (top_value, block_value) {
        (Some(a), Some(b)) if a != b => Err(top.invalid(
            key,
            a,
            format!("the same value as rope_parameters.{key} ({b})"),
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// One rope block: its type, its type's parameters, and (in `rope_parameters` only) theta and
/// the partial rotary factor.
fn parse_block(
    block: &Fields<'_>,
    legacy: bool,
) -> Result<(RopeScaling, Option<f64>, Option<f64>), ConfigError> {
    let rope_type = rope_type(block, legacy)?;
    match rope_type {
        "default" | "llama3" => {}
        other => {
            return Err(block.unsupported(
                if block.value("rope_type").is_some() {
                    "rope_type"
                } else {
                    "type"
                },
                &Value::String(other.to_string()),
                format!("rope type `{other}` is not yet modelled"),
            ))
        }
    }
    for key in block.keys() {
        let known = key == "rope_type"
            || (legacy && key == "type")
            || (!legacy && (key == "rope_theta" || key == "partial_rotary_factor"))
            || LLAMA3_KEYS.contains(&key);
        if !known {
            return Err(ConfigError::UnknownKey {
                file: block.file().to_string(),
                key: block.key_name(key),
                family: format!("rope type `{rope_type}`"),
            });
        }
        if let (true, Some(value)) = (rope_type == "default", block.value(key)) {
            if LLAMA3_KEYS.contains(&key) {
                // transformers would ignore it; a scaling the file asks for but never gets is
                // more likely a wrong rope_type than a harmless extra.
                return Err(block.unsupported(
                    key,
                    value,
                    format!("rope type `default` takes no `{key}`"),
                ));
            }
        }
    }
    let scaling = if rope_type == "llama3" {
        parse_llama3(block)?
    } else {
        RopeScaling::Default
    };
    Ok((
        scaling,
        block.opt_f64("rope_theta")?,
        block.opt_f64("partial_rotary_factor")?,
    ))
}

/// `rope_type`, or in legacy `rope_scaling` the older `type` key; both given must agree.
fn rope_type<'a>(block: &Fields<'a>, legacy: bool) -> Result<&'a str, ConfigError> {
    let new = block.opt_str("rope_type")?;
    let old = if legacy { block.opt_str("type")? } else { None };
    match (new, old) {
        (Some(new), Some(old)) if new != old => Err(block.invalid(
            "type",
            format!("\"{old}\""),
            format!("the same type as rope_type (\"{new}\")"),
        )),
        (Some(name), _) | (None, Some(name)) => Ok(name),
        (None, None) => Err(block.missing("rope_type")),
    }
}

fn parse_llama3(block: &Fields<'_>) -> Result<RopeScaling, ConfigError> {
    // Each is cast to f32 where it meets the tensor (`Llama3::rescale`).
    let positive = |key: &str| positive_f32(block, key, block.req_f64(key)?);
    let factor = positive("factor")?;
    let low_freq_factor = positive("low_freq_factor")?;
    let high_freq_factor = positive("high_freq_factor")?;
    if high_freq_factor <= low_freq_factor {
        // The smoothing divides by their difference.
        return Err(block.invalid(
            "high_freq_factor",
            high_freq_factor,
            format!("a number greater than low_freq_factor ({low_freq_factor})"),
        ));
    }
    let original_max_position_embeddings = block.req_usize("original_max_position_embeddings")?;
    if original_max_position_embeddings == 0 {
        return Err(block.invalid("original_max_position_embeddings", 0, "a positive integer"));
    }
    Ok(RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    })
}
