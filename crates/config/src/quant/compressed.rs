//! `quant_method: "compressed-tensors"` (llm-compressor's format) → `Fp8Compressed`: one config
//! group of 8-bit float weights with channel or tensor scales. Activation quantization must be
//! dynamic or absent (solder is weight-only: activations stay bf16), and the KV cache
//! unquantized. Every key of the block, of the group and of its argument objects is
//! classified; an unknown one is refused by name.

use serde_json::json;

use super::pattern::Pattern;
use super::rules::{classify, must_be, must_be_unset, one_of, Rule};
use super::{Fp8Strategy, Quantization};
use crate::fields::Fields;
use crate::{ConfigError, KeyReport};

const METHOD: &str = "compressed-tensors";
const FORMATS: &[&str] = &["float-quantized", "naive-quantized"];
const FORMAT_REASON: &str =
    "formats other than float-quantized or naive-quantized fp8 are not yet modelled (packed \
     int, sparse and nvfp4 formats among them)";
const SAVE_DETAIL: &str = "a statistic or version of the save; the stored weights say the rest";
const OBSERVER: &str = "the calibration observer; the stored scales say the rest";
const ACTIVATIONS: &str = "activation quantization solder does not apply: weight-only, \
                           activations stay bf16 (dynamic scales need nothing stored)";

const BLOCK: &[(&str, Rule)] = &[
    ("quant_method", Rule::Used),
    ("config_groups", Rule::Used),
    ("format", Rule::Used),
    ("ignore", Rule::Used),
    ("kv_cache_scheme", Rule::Used),
    ("sparsity_config", Rule::Used),
    ("transform_config", Rule::Used),
    (
        "quantization_status",
        Rule::Ignored("the save's stage; format and the weight dtypes say what is stored"),
    ),
    ("global_compression_ratio", Rule::Ignored(SAVE_DETAIL)),
    ("version", Rule::Ignored(SAVE_DETAIL)),
];

const GROUP: &[(&str, Rule)] = &[
    ("targets", Rule::Used),
    ("weights", Rule::Used),
    ("input_activations", Rule::Used),
    ("output_activations", Rule::Used),
    ("format", Rule::Used),
];

const WEIGHTS: &[(&str, Rule)] = &[
    ("num_bits", Rule::Used),
    ("type", Rule::Used),
    ("strategy", Rule::Used),
    ("symmetric", Rule::Used),
    ("dynamic", Rule::Used),
    ("group_size", Rule::Used),
    ("block_structure", Rule::Used),
    ("actorder", Rule::Used),
    ("observer", Rule::Ignored(OBSERVER)),
    ("observer_kwargs", Rule::Ignored(OBSERVER)),
    (
        "scale_dtype",
        Rule::Ignored("the scale tensor's dtype is read from the checkpoint"),
    ),
    (
        "zp_dtype",
        Rule::Ignored("a symmetric fp8 weight stores no zero point"),
    ),
];

/// `input_activations`: `dynamic` is checked, the rest describes what solder does not apply.
const INPUT_ACTIVATIONS: &[(&str, Rule)] = &[
    ("dynamic", Rule::Used),
    ("num_bits", Rule::Ignored(ACTIVATIONS)),
    ("type", Rule::Ignored(ACTIVATIONS)),
    ("strategy", Rule::Ignored(ACTIVATIONS)),
    ("symmetric", Rule::Ignored(ACTIVATIONS)),
    ("group_size", Rule::Ignored(ACTIVATIONS)),
    ("block_structure", Rule::Ignored(ACTIVATIONS)),
    ("actorder", Rule::Ignored(ACTIVATIONS)),
    ("observer", Rule::Ignored(ACTIVATIONS)),
    ("observer_kwargs", Rule::Ignored(ACTIVATIONS)),
    ("scale_dtype", Rule::Ignored(ACTIVATIONS)),
    ("zp_dtype", Rule::Ignored(ACTIVATIONS)),
];

pub(super) fn parse(
    block: &Fields<'_>,
    reports: &mut Vec<KeyReport>,
) -> Result<Quantization, ConfigError> {
    classify(block, BLOCK, METHOD, reports)?;
    // compressed-tensors reads an absent format as "dense" (unquantized storage): required.
    block.req_str("format")?;
    let top_format = one_of(block, "format", "dense", FORMATS, FORMAT_REASON)?;
    must_be_unset(
        block,
        "kv_cache_scheme",
        "a quantized KV cache is not yet modelled (solder keeps the cache in bf16)",
    )?;
    must_be_unset(
        block,
        "sparsity_config",
        "sparse compressed weights are not yet modelled",
    )?;
    must_be_unset(
        block,
        "transform_config",
        "rotated (transformed) weights are not yet modelled",
    )?;

    let groups = block
        .opt_object("config_groups")?
        .ok_or_else(|| block.missing("config_groups"))?;
    let names: Vec<&str> = groups.keys().collect();
    let [name] = names.as_slice() else {
        return Err(block.unsupported(
            "config_groups",
            &json!(names),
            "more than one config group is not yet modelled (exactly one scheme for every quantized linear)",
        ));
    };
    let group = groups
        .opt_object(name)?
        .ok_or_else(|| groups.wrong_type(name, "an object", &serde_json::Value::Null))?;
    classify(&group, GROUP, METHOD, reports)?;
    if group.value("format").is_some() {
        let format = one_of(&group, "format", top_format, FORMATS, FORMAT_REASON)?;
        if format != top_format {
            return Err(group.invalid(
                "format",
                json!(format),
                format!("the block's format (\"{top_format}\")"),
            ));
        }
    }
    must_be_unset(
        &group,
        "output_activations",
        "output activation quantization is not yet modelled",
    )?;
    if let Some(inputs) = group.opt_object("input_activations")? {
        classify(&inputs, INPUT_ACTIVATIONS, METHOD, reports)?;
        // `dynamic` may also be "local" (nvfp4's); only true needs nothing stored.
        match inputs.value("dynamic") {
            Some(serde_json::Value::Bool(true)) => {}
            other => {
                return Err(inputs.unsupported(
                    "dynamic",
                    other.unwrap_or(&serde_json::Value::Null),
                    "static input scales are not yet modelled: solder is weight-only (activations \
                     stay bf16)",
                ))
            }
        }
    }
    let strategy = parse_weights(&group, reports)?;
    let targets = group
        .opt_str_array("targets")?
        .ok_or_else(|| group.missing("targets"))?;
    if targets != ["Linear"] {
        return Err(group.unsupported(
            "targets",
            &json!(targets),
            "targets other than [\"Linear\"] are not yet modelled (every linear not in `ignore` \
             is read quantized)",
        ));
    }
    let ignore = block.opt_str_array("ignore")?.unwrap_or_default();
    for entry in &ignore {
        if let Some(pattern) = entry.strip_prefix("re:") {
            if let Err(syntax) = Pattern::parse(pattern) {
                return Err(block.unsupported(
                    "ignore",
                    &json!(entry),
                    format!(
                        "the ignore pattern uses {syntax}, which is not yet modelled (only `.*`, \
                         `.`, escaped characters and a final `$` are)"
                    ),
                ));
            }
        }
    }
    Ok(Quantization::Fp8Compressed {
        strategy,
        targets: targets.into_iter().map(str::to_string).collect(),
        ignore: ignore.into_iter().map(str::to_string).collect(),
    })
}

/// The group's `weights`: static symmetric 8-bit float, per channel or per tensor.
fn parse_weights(
    group: &Fields<'_>,
    reports: &mut Vec<KeyReport>,
) -> Result<Fp8Strategy, ConfigError> {
    let weights = group.opt_object("weights")?.ok_or_else(|| {
        group.unsupported(
            "weights",
            &serde_json::Value::Null,
            "a group without quantized weights is not yet modelled",
        )
    })?;
    classify(&weights, WEIGHTS, METHOD, reports)?;
    let num_bits = weights
        .opt_usize("num_bits")?
        .ok_or_else(|| weights.missing("num_bits"))?;
    if num_bits != 8 {
        return Err(weights.unsupported(
            "num_bits",
            &json!(num_bits),
            "compressed-tensors weights of other than 8 bits are not yet modelled",
        ));
    }
    weights.req_str("type")?;
    one_of(
        &weights,
        "type",
        "float",
        &["float"],
        "compressed-tensors weights other than 8-bit float (fp8 e4m3) are not yet modelled",
    )?;
    let strategy = match weights.req_str("strategy")? {
        "channel" => Fp8Strategy::Channel,
        "tensor" => Fp8Strategy::Tensor,
        other => {
            return Err(weights.unsupported(
                "strategy",
                &json!(other),
                "fp8 weight scales other than per channel or per tensor are not yet modelled",
            ))
        }
    };
    must_be(
        &weights,
        "symmetric",
        true,
        "asymmetric fp8 weights (zero points) are not yet modelled",
    )?;
    must_be(
        &weights,
        "dynamic",
        false,
        "dynamic weight scales (none stored) are not yet modelled",
    )?;
    for key in ["group_size", "block_structure", "actorder"] {
        must_be_unset(
            &weights,
            key,
            "fp8 weight groups, blocks and act order are not yet modelled",
        )?;
    }
    Ok(strategy)
}
