//! Sliding-window attention: which layers attend over only their last W positions, following
//! transformers 5 exactly. A windowed layer's query at position i sees the keys j with
//! `i - W < j <= i` (`masking_utils.sliding_window_overlay`: the last W positions, itself
//! included); a layer without a window sees every `j <= i`.
//!
//! - Mistral: `sliding_window` in every layer (`MistralModel` picks the sliding mask whenever
//!   it is not null); absent means `MistralConfig`'s default 4096, `null` none.
//! - Qwen2 and Qwen3: `sliding_window` counts only with `use_sliding_window` (else it is
//!   `None`); `layer_types`, when absent, is derived as transformers does: layer i is
//!   `sliding_attention` when the window is in use and `i >= max_window_layers` (default 28),
//!   else `full_attention`. A `sliding_attention` layer without a window in use is refused
//!   (transformers raises building its mask).
//! - Qwen3-MoE: `use_sliding_window` puts `sliding_window` in every layer (its model never
//!   reads `layer_types` or `max_window_layers`); `layer_types`, if given, must be all full.
//! - Llama and Qwen3-Next have no window.
//!
//! Invariant: one entry per layer; every window is at least 1 and, when any layer uses it, at
//! most `max_position_embeddings` (a longer one given in the file is refused naming the key;
//! Mistral's absent default 4096 over a shorter context masks nothing and is no window).

use serde_json::Value;

use crate::fields::Fields;
use crate::{ConfigError, Family};

/// The transformers default `sliding_window` of Mistral, Qwen2, Qwen3 and Qwen3-MoE.
const DEFAULT_SLIDING_WINDOW: usize = 4096;

/// The transformers default `max_window_layers` of Qwen2 and Qwen3.
const DEFAULT_MAX_WINDOW_LAYERS: usize = 28;

/// The window of each layer (`None`: full causal attention).
pub(crate) fn parse_windows(
    fields: &Fields<'_>,
    family: Family,
    num_hidden_layers: usize,
    max_position_embeddings: usize,
) -> Result<Vec<Option<usize>>, ConfigError> {
    let none = vec![None; num_hidden_layers];
    let windows = match family {
        Family::Llama | Family::Qwen3Next => return Ok(none),
        Family::Mistral => match window_key(fields)? {
            // MistralConfig's default, when the file does not name the key: a context no
            // longer than it is never masked, so it is no window there.
            None if max_position_embeddings <= DEFAULT_SLIDING_WINDOW => return Ok(none),
            None => vec![Some(DEFAULT_SLIDING_WINDOW); num_hidden_layers],
            Some(window) => vec![window; num_hidden_layers],
        },
        Family::Qwen2 | Family::Qwen3 => qwen_layer_windows(fields, num_hidden_layers)?,
        Family::Qwen3Moe => {
            check_all_full(fields, num_hidden_layers)?;
            vec![qwen_window(fields)?; num_hidden_layers]
        }
    };
    if let Some(window) = windows.iter().flatten().next() {
        if *window == 0 {
            return Err(fields.invalid(
                "sliding_window",
                0,
                "a positive window (0 would mask every key)",
            ));
        }
        if *window > max_position_embeddings {
            return Err(fields.invalid(
                "sliding_window",
                *window,
                format!(
                    "a window of at most max_position_embeddings ({max_position_embeddings}) \
                     when a layer uses it"
                ),
            ));
        }
    }
    Ok(windows)
}

/// `sliding_window` as the file gives it: `None` when absent, `Some(None)` for `null`.
fn window_key(fields: &Fields<'_>) -> Result<Option<Option<usize>>, ConfigError> {
    match fields.opt_usize("sliding_window")? {
        Some(window) => Ok(Some(Some(window))),
        None if fields.keys().any(|key| key == "sliding_window") => Ok(Some(None)),
        None => Ok(None),
    }
}

/// The Qwen window in use: `sliding_window` (default 4096) when `use_sliding_window`, else
/// none (transformers sets it to `None`).
fn qwen_window(fields: &Fields<'_>) -> Result<Option<usize>, ConfigError> {
    if fields.opt_bool("use_sliding_window")? != Some(true) {
        return Ok(None);
    }
    Ok(window_key(fields)?.unwrap_or(Some(DEFAULT_SLIDING_WINDOW)))
}

/// Qwen2/Qwen3: the window of each layer from `layer_types`, or from `max_window_layers` when
/// `layer_types` is absent.
fn qwen_layer_windows(
    fields: &Fields<'_>,
    num_hidden_layers: usize,
) -> Result<Vec<Option<usize>>, ConfigError> {
    let window = qwen_window(fields)?;
    let Some(names) = layer_types(fields, num_hidden_layers)? else {
        let max_window_layers = fields
            .opt_usize("max_window_layers")?
            .unwrap_or(DEFAULT_MAX_WINDOW_LAYERS);
        return Ok((0..num_hidden_layers)
            .map(|layer| window.filter(|_| layer >= max_window_layers))
            .collect());
    };
    names
        .iter()
        .map(|name| match (*name, window) {
            ("full_attention", _) => Ok(None),
            ("sliding_attention", Some(window)) => Ok(Some(window)),
            ("sliding_attention", None) => Err(fields.invalid(
                "layer_types",
                "\"sliding_attention\"",
                "sliding_attention layers only with use_sliding_window true and a \
                 sliding_window (transformers cannot build their mask otherwise)",
            )),
            (other, _) => Err(fields.unsupported(
                "layer_types",
                &Value::from(other),
                format!("layer type `{other}` is not yet modelled"),
            )),
        })
        .collect()
}

/// `layer_types`, checked to have one entry per layer.
fn layer_types<'a>(
    fields: &Fields<'a>,
    num_hidden_layers: usize,
) -> Result<Option<Vec<&'a str>>, ConfigError> {
    let Some(names) = fields.opt_str_array("layer_types")? else {
        return Ok(None);
    };
    if names.len() != num_hidden_layers {
        return Err(fields.invalid(
            "layer_types",
            format!("an array of {}", names.len()),
            format!("one entry per layer (num_hidden_layers = {num_hidden_layers})"),
        ));
    }
    Ok(Some(names))
}

/// Qwen3-MoE never reads `layer_types`: anything but full attention there is refused rather
/// than silently differing from what the file says.
fn check_all_full(fields: &Fields<'_>, num_hidden_layers: usize) -> Result<(), ConfigError> {
    let Some(names) = layer_types(fields, num_hidden_layers)? else {
        return Ok(());
    };
    match names.iter().find(|kind| **kind != "full_attention") {
        None => Ok(()),
        Some(other) => Err(fields.unsupported(
            "layer_types",
            &Value::from(*other),
            format!(
                "layer type `{other}` is not modelled for qwen3_moe (transformers' Qwen3-MoE \
                 windows every layer through use_sliding_window)"
            ),
        )),
    }
}
