//! Rotary position embedding: its parameters from either config format (legacy `rope_theta` +
//! `rope_scaling`, or transformers-5 `rope_parameters`) and the inverse frequencies, computed
//! op for op as transformers computes them in f32 so that cos/sin tables match its bytes.

use serde_json::Value;

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
    /// YaRN, as transformers' `_compute_yarn_parameters`: a ramp between the interpolated
    /// (`/ factor`) and the original frequencies over the dims between `beta_fast` and
    /// `beta_slow` rotations in the original context, and cos/sin scaled by
    /// `attention_factor`.
    Yarn {
        factor: f64,
        /// The block's, or `max_position_embeddings` when absent (transformers' default).
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        /// The block's `attention_factor`, or the one `get_mscale` derives from `factor`,
        /// `mscale` and `mscale_all_dim`.
        attention_factor: f64,
        /// Whether the correction range is rounded outwards to whole dims.
        truncate: bool,
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

/// The keys transformers reads from a `yarn` block (`_validate_yarn_rope_parameters`).
const YARN_KEYS: &[&str] = &[
    "factor",
    "original_max_position_embeddings",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
    "truncate",
];

impl Rope {
    /// Rotated channels per head: `int(head_dim * partial_rotary_factor)`, as transformers.
    pub fn rotary_dim(&self, head_dim: usize) -> usize {
        (head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// The table the rope kernels read: the inverse frequencies, then the attention scaling
    /// (`rotary_dim / 2 + 1` f32).
    pub fn kernel_table(&self, head_dim: usize) -> Vec<f32> {
        let mut table = self.inv_freq(head_dim);
        table.push(self.attention_scaling());
        table
    }

    /// Inverse frequencies, `rotary_dim / 2` of them, in f32 exactly as transformers'
    /// `_compute_default_rope_parameters`, `_compute_llama3_parameters` and
    /// `_compute_yarn_parameters`.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        let dim = self.rotary_dim(head_dim);
        // torch: base ** (arange(0, dim, 2).float() / dim), every op in f32.
        let base = self.theta as f32;
        let pos_freq = move |i: usize| base.powf((2 * i) as f32 / dim as f32);
        let default = (0..dim / 2).map(|i| 1.0f32 / pos_freq(i));
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
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                let (low, high) = yarn_correction_range(
                    [*beta_fast, *beta_slow],
                    dim,
                    self.theta,
                    *original_max_position_embeddings,
                    *truncate,
                );
                // linear_ramp_factor: Python numbers, each cast to f32 where it meets the tensor.
                let high = if low == high { high + 0.001 } else { high };
                let (low_f32, span) = (low as f32, (high - low) as f32);
                let factor = *factor as f32;
                (0..dim / 2)
                    .map(|i| {
                        let pos_freq = pos_freq(i);
                        let extrapolation = 1.0f32 / pos_freq;
                        let interpolation = 1.0f32 / (factor * pos_freq);
                        let ramp = ((i as f32 - low_f32) / span).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0f32 - ramp;
                        interpolation * (1.0f32 - extrapolation_factor)
                            + extrapolation * extrapolation_factor
                    })
                    .collect()
            }
        }
    }

    /// Factor applied to cos and sin (transformers: `emb.cos() * attention_scaling` in f32);
    /// 1.0 but for YaRN.
    pub fn attention_scaling(&self) -> f32 {
        match &self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            } => *attention_factor as f32,
            RopeScaling::Default | RopeScaling::Llama3 { .. } => 1.0,
        }
    }
}

/// transformers' `find_correction_range` in Python floats: the dims whose wavelength makes
/// `beta_fast` and `beta_slow` rotations over the original context, rounded outwards when
/// `truncate`, clamped to `[0, dim - 1]`.
fn yarn_correction_range(
    [beta_fast, beta_slow]: [f64; 2],
    dim: usize,
    base: f64,
    original_max_position_embeddings: usize,
    truncate: bool,
) -> (f64, f64) {
    let correction_dim = |rotations: f64| {
        (dim as f64
            * (original_max_position_embeddings as f64 / (rotations * 2.0 * std::f64::consts::PI))
                .ln())
            / (2.0 * base.ln())
    };
    let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    (low.max(0.0), high.min((dim - 1) as f64))
}

/// transformers' `get_mscale`: 1 for a factor up to 1, else `0.1 · mscale · ln(factor) + 1`.
fn get_mscale(factor: f64, mscale: f64) -> f64 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * mscale * factor.ln() + 1.0
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
        Some(block) => parse_block(top, block, legacy)?,
    };

    let theta = agree(top, "rope_theta", top_theta, block_theta)?.unwrap_or(DEFAULT_THETA);
    // `inv_freq` raises `theta as f32`: 1e39 would be infinite, 1e-50 zero.
    let theta = top.positive_f32("rope_theta", theta)?;
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
    top: &Fields<'_>,
    block: &Fields<'_>,
    legacy: bool,
) -> Result<(RopeScaling, Option<f64>, Option<f64>), ConfigError> {
    let rope_type = rope_type(block, legacy)?;
    let type_keys: &[&str] = match rope_type {
        "default" => &[],
        "llama3" => LLAMA3_KEYS,
        "yarn" => YARN_KEYS,
        other => {
            let type_key = if block.value("rope_type").is_some() {
                "rope_type"
            } else {
                "type"
            };
            return Err(block.unsupported(
                type_key,
                &Value::String(other.to_string()),
                refusal_reason(other),
            ));
        }
    };
    for key in block.keys() {
        let known = key == "rope_type"
            || (legacy && key == "type")
            || (!legacy && (key == "rope_theta" || key == "partial_rotary_factor"))
            || type_keys.contains(&key);
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
        if !known {
            return Err(ConfigError::UnknownKey {
                file: block.file().to_string(),
                key: block.key_name(key),
                family: format!("rope type `{rope_type}`"),
            });
        }
    }
    let scaling = match rope_type {
        "llama3" => parse_llama3(block)?,
        "yarn" => parse_yarn(top, block)?,
        _ => RopeScaling::Default,
    };
    Ok((
        scaling,
        block.opt_f64("rope_theta")?,
        block.opt_f64("partial_rotary_factor")?,
    ))
}

/// Why a rope type is refused.
fn refusal_reason(rope_type: &str) -> String {
    match rope_type {
        // transformers recomputes inv_freq from the longest position in the batch at each
        // forward once it passes max_position_embeddings: a key's rotation then depends on the
        // step that cached it and on the other sequences of its batch, which one inv_freq per
        // model cannot reproduce (it would take per-row tables keyed by that history).
        "dynamic" => "rope type `dynamic` (dynamic NTK) is not modelled: transformers \
                      recomputes inv_freq from the batch's longest sequence at each step, so a \
                      cached key's rotation depends on the step and batch that cached it, which \
                      solder's one inv_freq table cannot reproduce"
            .to_string(),
        other => format!("rope type `{other}` is not yet modelled"),
    }
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
    let positive = |key: &str| block.positive_f32(key, block.req_f64(key)?);
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

/// A `yarn` block as `_compute_yarn_parameters` reads it, its defaults and fallbacks
/// included; `top` gives `max_position_embeddings` for them.
fn parse_yarn(top: &Fields<'_>, block: &Fields<'_>) -> Result<RopeScaling, ConfigError> {
    let original_max_position_embeddings =
        match block.opt_usize("original_max_position_embeddings")? {
            Some(value) => value,
            // transformers' standardize_rope_params: setdefault(max_position_embeddings).
            None => top.req_usize("max_position_embeddings")?,
        };
    if original_max_position_embeddings == 0 {
        return Err(block.invalid("original_max_position_embeddings", 0, "a positive integer"));
    }
    let factor = match block.value("factor") {
        Some(_) => block.req_f64("factor")?,
        // `factor: null`: transformers takes max_position_embeddings / original (DeepSeek-V3).
        None if block.keys().any(|key| key == "factor") => {
            top.req_usize("max_position_embeddings")? as f64
                / original_max_position_embeddings as f64
        }
        None => return Err(block.missing("factor")),
    };
    let factor = block.positive_f32("factor", factor)?;
    // Python's `x or default`: absent, null and 0 all take the default.
    let or = |key: &str, default: f64| -> Result<f64, ConfigError> {
        Ok(block.opt_f64(key)?.filter(|v| *v != 0.0).unwrap_or(default))
    };
    let beta_fast = or("beta_fast", 32.0)?;
    let beta_slow = or("beta_slow", 1.0)?;
    for (key, beta) in [("beta_fast", beta_fast), ("beta_slow", beta_slow)] {
        if !(beta.is_finite() && beta > 0.0) {
            // find_correction_dim takes the log of original / (beta · 2π).
            return Err(block.invalid(key, beta, "a finite positive number"));
        }
    }
    let attention_factor = match block.opt_f64("attention_factor")? {
        Some(value) => value,
        None => match (or("mscale", 0.0)?, or("mscale_all_dim", 0.0)?) {
            (mscale, all_dim) if mscale != 0.0 && all_dim != 0.0 => {
                get_mscale(factor, mscale) / get_mscale(factor, all_dim)
            }
            _ => get_mscale(factor, 1.0),
        },
    };
    let attention_factor = block.positive_f32("attention_factor", attention_factor)?;
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        beta_fast,
        beta_slow,
        attention_factor,
        truncate: block.opt_bool("truncate")?.unwrap_or(true),
    })
}
