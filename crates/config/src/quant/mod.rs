//! A checkpoint's `quantization_config`: which weights are stored quantized, in which format.
//! Only weight-only formats whose arithmetic solder models are accepted; every other method,
//! bit width or activation scheme refuses the load naming the key (`parse`, `compressed`, each
//! key checked through `rules`), and `pattern` holds the `re:` module patterns of
//! compressed-tensors' `ignore`.

mod compressed;
mod parse;
mod pattern;
mod rules;

pub(crate) use parse::parse_quantization;
use pattern::Pattern;

use crate::fields::Fields;
use crate::ConfigError;

/// How a quantized checkpoint stores its linear weights.
#[derive(Debug, Clone, PartialEq)]
pub enum Quantization {
    /// `quant_method: "fp8"` (Qwen's and DeepSeek's FP8 checkpoints): each quantized linear's
    /// `weight` in F8_E4M3 with `weight_scale_inv` `[ceil(out / block[0]), ceil(in / block[1])]`
    /// (BF16, F16 or F32); `w = weight * weight_scale_inv`. Dynamic activation scheme only (the
    /// activations stay bf16 in solder: weight-only).
    Fp8Block {
        /// `weight_block_size`: `[out, in]`.
        block: [usize; 2],
        /// `modules_to_not_convert`: module-name patterns kept unquantized.
        not_converted: Vec<String>,
    },
    /// `quant_method: "compressed-tensors"` with one `float` 8-bit weight scheme (most FP8
    /// Llama checkpoints): `weight` in F8_E4M3 with `weight_scale` per output channel
    /// (`[out, 1]`) or per tensor (one value); `w = weight * weight_scale`.
    Fp8Compressed {
        strategy: Fp8Strategy,
        /// The config group's `targets` (e.g. `["Linear"]`).
        targets: Vec<String>,
        /// `ignore`: module names or `re:` patterns kept unquantized (e.g. `lm_head`).
        ignore: Vec<String>,
    },
    /// `quant_method: "awq"`, `version: "gemm"`, 4 bits: `qweight` I32 `[in, out / 8]` (AWQ's
    /// interleaved nibble order), `qzeros` I32 `[in / group, out / 8]`, `scales` F16
    /// `[in / group, out]`; `w = (q - z) * s`.
    Awq {
        group_size: usize,
        /// `zero_point`: false stores no zeros (symmetric, z = 8).
        zero_point: bool,
        /// `modules_to_not_convert`.
        not_converted: Vec<String>,
    },
    /// `quant_method: "gptq"`, 4 bits, `desc_act: false`: `qweight` I32 `[in / 8, out]`,
    /// `qzeros` I32 `[in / group, out / 8]` (stored minus one in the GPTQ v1 checkpoint format:
    /// z = stored + 1), `scales` F16 `[in / group, out]`, `g_idx` I32 `[in]` (must be `i / group`);
    /// `w = (q - z) * s`.
    Gptq {
        /// 0 for GPTQ's `group_size: -1` (one group per row).
        group_size: usize,
        sym: bool,
        /// `checkpoint_format`: `gptq` (v1, zeros stored minus one, the default) or `gptq_v2`.
        v2: bool,
        /// `modules_to_not_convert` (Optimum's `modules_in_block_to_quantize` inverted is not
        /// modelled: a listed block is refused).
        not_converted: Vec<String>,
    },
}

/// The scale granularity of a compressed-tensors FP8 weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Strategy {
    /// `weight_scale` `[out, 1]`.
    Channel,
    /// `weight_scale` one value.
    Tensor,
}

impl Quantization {
    /// Checks a hand-built value as parsing checks a file's: group and block sizes positive
    /// (GPTQ's 0 = one group per row aside) and within `DIM_BOUNDS`, every `re:` ignore
    /// pattern in the modelled syntax.
    pub(crate) fn check(&self, fields: &Fields<'_>) -> Result<(), ConfigError> {
        let empty = serde_json::Map::new();
        let block = Fields::new(fields.file(), "quantization_config.", &empty);
        let sizes: Vec<(&str, usize)> = match self {
            Quantization::Fp8Block { block, .. } => {
                vec![
                    ("weight_block_size", block[0]),
                    ("weight_block_size", block[1]),
                ]
            }
            Quantization::Awq { group_size, .. } => vec![("group_size", *group_size)],
            Quantization::Gptq { group_size, .. } if *group_size > 0 => {
                vec![("group_size", *group_size)]
            }
            Quantization::Gptq { .. } => Vec::new(),
            Quantization::Fp8Compressed { ignore, .. } => {
                for entry in ignore {
                    if let Some(Err(syntax)) = entry.strip_prefix("re:").map(Pattern::parse) {
                        return Err(block.invalid(
                            "ignore",
                            entry,
                            format!("a pattern in the modelled syntax, not {syntax}"),
                        ));
                    }
                }
                Vec::new()
            }
        };
        for (name, size) in sizes {
            if size == 0 {
                return Err(block.invalid(name, 0, "a positive integer"));
            }
            block.bounded(name, size)?;
        }
        Ok(())
    }

    /// The `quant_method` the variant was parsed from.
    pub fn method(&self) -> &'static str {
        match self {
            Quantization::Fp8Block { .. } => "fp8",
            Quantization::Fp8Compressed { .. } => "compressed-tensors",
            Quantization::Awq { .. } => "awq",
            Quantization::Gptq { .. } => "gptq",
        }
    }

    /// Whether the checkpoint keeps module `module` (a dotted path such as
    /// `model.layers.0.mlp.gate`, or `lm_head`) unquantized by its own lists:
    /// `modules_to_not_convert` entries match as substrings of the path (transformers' and
    /// vLLM's `is_layer_skipped` for these methods); compressed-tensors `ignore` entries match
    /// the whole path, or, with a `re:` prefix, as vLLM's `re.match` (anchored at the start,
    /// at the end only with a final `$`; see `pattern`). A `re:` entry outside the syntax
    /// `pattern` models matches nothing here: parsing and [`check_bounds`] refuse it.
    ///
    /// [`check_bounds`]: crate::ModelConfig::check_bounds
    pub fn skips(&self, module: &str) -> bool {
        match self {
            Quantization::Fp8Block { not_converted, .. }
            | Quantization::Awq { not_converted, .. }
            | Quantization::Gptq { not_converted, .. } => not_converted
                .iter()
                .any(|m| !m.is_empty() && module.contains(m.as_str())),
            Quantization::Fp8Compressed { ignore, .. } => {
                ignore.iter().any(|entry| match entry.strip_prefix("re:") {
                    Some(pattern) => Pattern::parse(pattern).is_ok_and(|p| p.matches(module)),
                    None => entry == module,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_converted_matches_substrings_and_ignore_whole_paths() {
        let fp8 = Quantization::Fp8Block {
            block: [128, 128],
            not_converted: vec!["lm_head".into()],
        };
        assert!(fp8.skips("lm_head"));
        assert!(!fp8.skips("model.layers.0.mlp.down_proj"));
        let ct = Quantization::Fp8Compressed {
            strategy: Fp8Strategy::Channel,
            targets: vec!["Linear".into()],
            ignore: vec!["lm_head".into()],
        };
        assert!(ct.skips("lm_head"));
        assert!(!ct.skips("model.lm_head"));
        let gate = Quantization::Fp8Compressed {
            strategy: Fp8Strategy::Channel,
            targets: vec!["Linear".into()],
            ignore: vec!["re:.*mlp\\.gate$".into(), "re:[bad".into()],
        };
        assert!(gate.skips("model.layers.3.mlp.gate"));
        assert!(!gate.skips("model.layers.3.mlp.gate_proj"));
    }
}
