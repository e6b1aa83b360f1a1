//! `quantization_config` → [`Quantization`]: the method's keys read, every other key of the
//! block classified (used, or ignored with a reason) and an unknown one refused by name, as the
//! top-level keys are (`keys`). What each method accepts follows vLLM's and transformers'
//! readers of the same key; anything else refuses the load naming `quantization_config.<key>`.

use serde_json::{json, Value};

use super::rules::{classify, must_be, must_be_unset, one_of, Rule};
use super::{compressed, Quantization};
use crate::fields::Fields;
use crate::{ConfigError, KeyReport};

const CALIBRATION: &str = "a calibration setting of the quantizer; the stored weights say the rest";
const KERNEL: &str = "which kernel transformers or vLLM would run; solder picks its own";
const FUSING: &str = "transformers' module fusing at load; the stored weights do not change";

const FP8: &[(&str, Rule)] = &[
    ("quant_method", Rule::Used),
    ("fmt", Rule::Used),
    ("activation_scheme", Rule::Used),
    ("weight_block_size", Rule::Used),
    ("modules_to_not_convert", Rule::Used),
    // vLLM's name for the same list (transformers maps it to modules_to_not_convert).
    ("ignored_layers", Rule::Used),
];

const AWQ: &[(&str, Rule)] = &[
    ("quant_method", Rule::Used),
    ("bits", Rule::Used),
    ("group_size", Rule::Used),
    ("zero_point", Rule::Used),
    ("version", Rule::Used),
    ("backend", Rule::Used),
    ("modules_to_not_convert", Rule::Used),
    ("do_fuse", Rule::Ignored(FUSING)),
    ("fuse_max_seq_len", Rule::Ignored(FUSING)),
    ("modules_to_fuse", Rule::Ignored(FUSING)),
    ("exllama_config", Rule::Ignored(KERNEL)),
];

const GPTQ: &[(&str, Rule)] = &[
    ("quant_method", Rule::Used),
    ("bits", Rule::Used),
    ("group_size", Rule::Used),
    ("desc_act", Rule::Used),
    ("sym", Rule::Used),
    ("checkpoint_format", Rule::Used),
    // GPTQModel writes the checkpoint format under this name too.
    ("format", Rule::Used),
    ("modules_to_not_convert", Rule::Used),
    ("modules_in_block_to_quantize", Rule::Used),
    ("lm_head", Rule::Used),
    ("damp_percent", Rule::Ignored(CALIBRATION)),
    ("damp_auto_increment", Rule::Ignored(CALIBRATION)),
    ("true_sequential", Rule::Ignored(CALIBRATION)),
    ("static_groups", Rule::Ignored(CALIBRATION)),
    (
        "act_group_aware",
        Rule::Ignored("a calibration order; g_idx is checked against i / group_size at load"),
    ),
    ("dataset", Rule::Ignored(CALIBRATION)),
    ("tokenizer", Rule::Ignored(CALIBRATION)),
    ("batch_size", Rule::Ignored(CALIBRATION)),
    ("model_seqlen", Rule::Ignored(CALIBRATION)),
    ("max_input_length", Rule::Ignored(CALIBRATION)),
    ("pad_token_id", Rule::Ignored(CALIBRATION)),
    ("cache_block_outputs", Rule::Ignored(CALIBRATION)),
    (
        "block_name_to_quantize",
        Rule::Ignored("where optimum found the decoder blocks; solder knows each family's paths"),
    ),
    (
        "module_name_preceding_first_block",
        Rule::Ignored("where optimum found the decoder blocks; solder knows each family's paths"),
    ),
    ("use_cuda_fp16", Rule::Ignored(KERNEL)),
    ("use_exllama", Rule::Ignored(KERNEL)),
    ("disable_exllama", Rule::Ignored(KERNEL)),
    ("exllama_config", Rule::Ignored(KERNEL)),
    ("backend", Rule::Ignored(KERNEL)),
    ("meta", Rule::Ignored("the quantizer's name and version")),
    (
        "model_file_base_name",
        Rule::Ignored("AutoGPTQ's weights file name; solder reads the safetensors index"),
    ),
    (
        "model_name_or_path",
        Rule::Ignored("the model AutoGPTQ quantized; informational"),
    ),
];

/// The parsed `quantization_config` (`None` when absent or null) and the report of each key
/// inside it, sorted by key.
pub(crate) fn parse_quantization(
    top: &Fields<'_>,
) -> Result<(Option<Quantization>, Vec<KeyReport>), ConfigError> {
    let Some(block) = top.opt_object("quantization_config")? else {
        return Ok((None, Vec::new()));
    };
    let mut reports = Vec::new();
    let quantization = match block.req_str("quant_method")? {
        "fp8" => {
            classify(&block, FP8, "fp8", &mut reports)?;
            parse_fp8(&block)?
        }
        "awq" => {
            classify(&block, AWQ, "awq", &mut reports)?;
            parse_awq(&block)?
        }
        "gptq" => {
            classify(&block, GPTQ, "gptq", &mut reports)?;
            parse_gptq(&block)?
        }
        "compressed-tensors" => compressed::parse(&block, &mut reports)?,
        other => {
            return Err(block.unsupported(
                "quant_method",
                &json!(other),
                format!(
                    "quant_method `{other}` is not yet modelled (solder reads `fp8` block-scaled, \
                     `compressed-tensors` fp8, `awq` gemm and `gptq` 4-bit weights)"
                ),
            ))
        }
    };
    reports.sort_by(|a, b| a.key.cmp(&b.key));
    Ok((Some(quantization), reports))
}

/// `bits`, which must be 4 (`default` when absent).
fn four_bits(block: &Fields<'_>, method: &str, default: Option<usize>) -> Result<(), ConfigError> {
    let bits = match (block.opt_usize("bits")?, default) {
        (Some(bits), _) | (None, Some(bits)) => bits,
        (None, None) => return Err(block.missing("bits")),
    };
    if bits != 4 {
        return Err(block.unsupported(
            "bits",
            &json!(bits),
            format!("{method} weights of other than 4 bits are not yet modelled"),
        ));
    }
    Ok(())
}

/// The module-name lists kept unquantized (each may be absent or null).
fn string_lists(block: &Fields<'_>, keys: &[&str]) -> Result<Vec<String>, ConfigError> {
    let mut names = Vec::new();
    for key in keys {
        if let Some(list) = block.opt_str_array(key)? {
            names.extend(list.into_iter().map(str::to_string));
        }
    }
    Ok(names)
}

/// A group or block size: positive and within its `DIM_BOUNDS` entry.
fn positive_size(block: &Fields<'_>, key: &str, value: u64) -> Result<usize, ConfigError> {
    let size = usize::try_from(value)
        .ok()
        .filter(|size| *size > 0)
        .ok_or_else(|| block.invalid(key, value, "a positive integer"))?;
    block.bounded(key, size)
}

/// `quant_method: "fp8"`: e4m3 weights, dynamic activations, `[out, in]` blocks.
fn parse_fp8(block: &Fields<'_>) -> Result<Quantization, ConfigError> {
    // transformers' FineGrainedFP8Config has no `fmt` and means e4m3; DeepSeek and Qwen write it.
    one_of(
        block,
        "fmt",
        "e4m3",
        &["e4m3"],
        "fp8 weights other than e4m3 are not yet modelled",
    )?;
    one_of(
        block,
        "activation_scheme",
        "dynamic",
        &["dynamic"],
        "activation schemes other than dynamic are not yet modelled: solder is weight-only (activations \
         stay bf16), and static input scales would be dropped",
    )?;
    let key = "weight_block_size";
    const EXPECTED: &str = "two positive integers [out, in]";
    let sizes = match block.value(key) {
        None => {
            return Err(block.unsupported(
                key,
                &Value::Null,
                "fp8 without weight_block_size (per-tensor scales) is not yet modelled",
            ))
        }
        Some(Value::Array(items)) if items.len() == 2 => items,
        Some(other) => return Err(block.invalid(key, other, EXPECTED)),
    };
    let mut sizes_read = [0usize; 2];
    for (slot, item) in sizes_read.iter_mut().zip(sizes) {
        let value = item
            .as_u64()
            .ok_or_else(|| block.invalid(key, json!(sizes), EXPECTED))?;
        *slot = positive_size(block, key, value)?;
    }
    Ok(Quantization::Fp8Block {
        block: sizes_read,
        not_converted: string_lists(block, &["modules_to_not_convert", "ignored_layers"])?,
    })
}

/// `quant_method: "awq"` (transformers' `AwqConfig` defaults where a key is absent).
fn parse_awq(block: &Fields<'_>) -> Result<Quantization, ConfigError> {
    four_bits(block, "awq", Some(4))?;
    let group_size = match block.value("group_size") {
        None => 128,
        Some(value) => match value.as_u64() {
            Some(size) => positive_size(block, "group_size", size)?,
            None => return Err(block.invalid("group_size", value, "a positive integer")),
        },
    };
    // AutoAWQ writes "gemm"; transformers reads the version case-insensitively.
    let version = block.opt_str("version")?.unwrap_or("gemm");
    if !version.eq_ignore_ascii_case("gemm") {
        return Err(block.unsupported(
            "version",
            &json!(version),
            "AWQ packings other than GEMM are not yet modelled (gemv, gemv_fast, exllama and ipex pack \
             differently)",
        ));
    }
    one_of(
        block,
        "backend",
        "autoawq",
        &["autoawq"],
        "AWQ backends other than AutoAWQ's are not yet modelled (llm-awq orders the nibbles differently)",
    )?;
    Ok(Quantization::Awq {
        group_size,
        zero_point: block.opt_bool("zero_point")?.unwrap_or(true),
        not_converted: string_lists(block, &["modules_to_not_convert"])?,
    })
}

/// `quant_method: "gptq"` (optimum's / GPTQModel's keys; transformers' `GPTQConfig` defaults).
fn parse_gptq(block: &Fields<'_>) -> Result<Quantization, ConfigError> {
    four_bits(block, "gptq", None)?;
    let group_size = match block.value("group_size") {
        None => 128,
        Some(value) if value.as_i64() == Some(-1) => 0,
        Some(value) => match value.as_u64() {
            Some(size) => positive_size(block, "group_size", size)?,
            None => {
                return Err(block.invalid("group_size", value, "a positive integer or -1"));
            }
        },
    };
    must_be(
        block,
        "desc_act",
        false,
        "act-order g_idx is not yet modelled",
    )?;
    must_be(
        block,
        "lm_head",
        false,
        "a quantized lm_head is not yet modelled",
    )?;
    must_be_unset(
        block,
        "modules_in_block_to_quantize",
        "a partial list of quantized modules per block is not yet modelled (every linear of a \
         block is read quantized)",
    )?;
    const FORMATS: &[&str] = &["gptq", "gptq_v2"];
    const FORMAT_REASON: &str =
        "checkpoint formats other than gptq (v1) and gptq_v2 are not yet modelled";
    let checkpoint_format = one_of(block, "checkpoint_format", "gptq", FORMATS, FORMAT_REASON)?;
    if let Some(format) = block.opt_str("format")? {
        if !FORMATS.contains(&format) {
            return Err(block.unsupported("format", &json!(format), FORMAT_REASON));
        }
        if block.value("checkpoint_format").is_some() && format != checkpoint_format {
            return Err(block.invalid(
                "format",
                json!(format),
                format!("the same format as checkpoint_format (\"{checkpoint_format}\")"),
            ));
        }
        return gptq(block, group_size, format == "gptq_v2");
    }
    gptq(block, group_size, checkpoint_format == "gptq_v2")
}

fn gptq(block: &Fields<'_>, group_size: usize, v2: bool) -> Result<Quantization, ConfigError> {
    Ok(Quantization::Gptq {
        group_size,
        sym: block.opt_bool("sym")?.unwrap_or(true),
        v2,
        not_converted: string_lists(block, &["modules_to_not_convert"])?,
    })
}
