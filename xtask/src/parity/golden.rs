//! Golden files (`../shared/golden/README.md`): `input_ids` (I64 \[T\]), `logits` (F32 \[T, V\],
//! transformers' fp32 forward over the bf16 weights) and `logits_bf16` (transformers' bf16
//! forward); for a model with an MTP draft head, optionally `mtp_logits` and
//! `mtp_logits_bf16` (F32 \[T-1, V\]: the head's logits at the pairs (hidden\[p\], input_ids\[p+1\]),
//! `tests/fixtures/golden/generate.py`'s `mtp_reference`).
//!
//! Each golden names the weight format of its checkpoint (`checkpoint_format`, from
//! `config.json`'s `quantization_config`): `bf16` (none), `fp8-block`, `fp8-channel`,
//! `fp8-tensor`, `awq` or `gptq` (`tests/fixtures/golden/generate_quant.py`'s cases); the
//! parity table and its JSON carry it beside the figures.

use std::path::Path;

use safetensors::{Dtype, SafeTensors};

#[derive(Debug)]
pub struct Golden {
    pub input_ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub logits_bf16: Vec<f32>,
    pub vocab: usize,
    /// The MTP draft head's logits `\[T-1, V\]`, fp32 then bf16 (both or neither).
    pub mtp: Option<(Vec<f32>, Vec<f32>)>,
    /// The head alone: transformers' fp32 final hidden rows rounded to bf16 (`\[T, H\]`), and the
    /// head's logits over them `\[T-1, V\]`, fp32 then bf16.
    pub mtp_head: Option<MtpHeadGolden>,
    /// The weight format of the checkpoint the golden was made from (`checkpoint_format`);
    /// `bf16` until `for_checkpoint` reads it.
    pub format: &'static str,
}

#[derive(Debug)]
pub struct MtpHeadGolden {
    pub hidden: Vec<f32>,
    pub hidden_size: usize,
    pub logits: Vec<f32>,
    pub logits_bf16: Vec<f32>,
}

impl Golden {
    pub fn load(path: &Path) -> Result<Golden, String> {
        let bytes = crate::files::read_capped(path, crate::files::GOLDEN_CAP)?;
        let file = GoldenFile {
            file: SafeTensors::deserialize(&bytes)
                .map_err(|e| format!("{}: not a safetensors file: {e}", path.display()))?,
            path,
        };
        let (ids_shape, ids) = file.get("input_ids", Dtype::I64)?;
        let (logits_shape, logits) = file.get("logits", Dtype::F32)?;
        let (bf16_shape, logits_bf16) = file.get("logits_bf16", Dtype::F32)?;
        let tokens = *ids_shape
            .first()
            .ok_or_else(|| format!("{}: `input_ids` has no length", path.display()))?;
        if ids_shape.len() != 1
            || logits_shape.len() != 2
            || logits_shape[0] != tokens
            || bf16_shape != logits_shape
        {
            return Err(format!(
                "{}: shapes input_ids {ids_shape:?}, logits {logits_shape:?}, logits_bf16 {bf16_shape:?} do not fit [T], [T, V], [T, V]",
                path.display()
            ));
        }
        let vocab = logits_shape[1];
        if tokens == 0 || vocab == 0 {
            return Err(format!(
                "{}: an empty golden (input_ids {ids_shape:?}, logits {logits_shape:?})",
                path.display()
            ));
        }
        let input_ids = ids
            .chunks_exact(8)
            .map(|b| {
                let v = i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                u32::try_from(v)
                    .map_err(|_| format!("{}: token id {v} out of range", path.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mtp = file.mtp_logits(tokens, vocab)?;
        let mtp_head = file.mtp_head(tokens, vocab)?;
        let golden = Golden {
            input_ids,
            logits: floats(logits),
            logits_bf16: floats(logits_bf16),
            vocab,
            mtp,
            mtp_head,
            format: "bf16",
        };
        golden
            .validate()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(golden)
    }

    /// The golden of the checkpoint in `dir`: its format read from `dir/config.json`.
    pub fn for_checkpoint(mut self, dir: &Path) -> Result<Golden, String> {
        self.format = checkpoint_format(&dir.join("config.json"))?;
        Ok(self)
    }

    /// Refuses a golden that cannot judge anything: a non-finite value in either tensor, or
    /// an `e_hf` that is zero (`logits_bf16` is not a bf16 run) or implausible: larger than
    /// the largest |logit| (`E_HF_PLAUSIBLE`), which a `logits_bf16` shifted or scaled by
    /// anything like its own size is.
    fn validate(&self) -> Result<(), String> {
        validate_pair(
            ("logits", &self.logits),
            ("logits_bf16", &self.logits_bf16),
            self.vocab,
        )?;
        if let Some((mtp, mtp_bf16)) = &self.mtp {
            validate_pair(
                ("mtp_logits", mtp),
                ("mtp_logits_bf16", mtp_bf16),
                self.vocab,
            )?;
        }
        if let Some(h) = &self.mtp_head {
            let (head, head_bf16) = (&h.logits, &h.logits_bf16);
            validate_pair(
                ("mtp_head_logits", head),
                ("mtp_head_logits_bf16", head_bf16),
                self.vocab,
            )?;
            if let Some(at) = non_finite(&h.hidden, h.hidden_size) {
                return Err(format!("`mtp_hidden` {at}"));
            }
        }
        Ok(())
    }

    /// The head-alone figures against `mtp_head_logits` (`ours` `\[(T-1) * V\]`).
    pub fn compare_mtp_head(&self, ours: &[f32]) -> Option<Result<GoldenFigures, String>> {
        let h = self.mtp_head.as_ref()?;
        Some(figures(
            ours,
            &h.logits,
            &h.logits_bf16,
            self.vocab,
            self.format,
        ))
    }

    /// The MTP head's figures against `mtp_logits` (`ours` `\[(T-1) * V\]`); None without them.
    pub fn compare_mtp(&self, ours: &[f32]) -> Option<Result<GoldenFigures, String>> {
        let (mtp, mtp_bf16) = self.mtp.as_ref()?;
        Some(figures(ours, mtp, mtp_bf16, self.vocab, self.format))
    }

    /// `e`, `e_hf`, and the share of positions whose argmax matches the reference; `ours`
    /// must be `\[T * V\]` like the golden.
    pub fn compare(&self, ours: &[f32]) -> Result<GoldenFigures, String> {
        figures(
            ours,
            &self.logits,
            &self.logits_bf16,
            self.vocab,
            self.format,
        )
    }
}

/// The weight format a checkpoint's `config.json` declares, by its `quantization_config`:
/// `bf16` without one (or with `null`); `fp8-block` for `quant_method: "fp8"`; for
/// `compressed-tensors`, `fp8-channel` or `fp8-tensor` by its weight scheme's `strategy`;
/// `awq`; `gptq`. Any other method, or a block that does not say, is an error naming it:
/// the table never guesses a format.
pub fn checkpoint_format(config: &Path) -> Result<&'static str, String> {
    let text = crate::files::read_text(config)?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", config.display()))?;
    quantization_format(doc.get("quantization_config"))
        .map_err(|e| format!("{}: `quantization_config`: {e}", config.display()))
}

fn quantization_format(block: Option<&serde_json::Value>) -> Result<&'static str, String> {
    let block = match block {
        None | Some(serde_json::Value::Null) => return Ok("bf16"),
        Some(b) => b,
    };
    let method = block
        .get("quant_method")
        .and_then(|m| m.as_str())
        .ok_or("no `quant_method`")?;
    Ok(match method {
        "fp8" => "fp8-block",
        "awq" => "awq",
        "gptq" => "gptq",
        "compressed-tensors" => {
            let groups = block
                .get("config_groups")
                .and_then(|g| g.as_object())
                .ok_or("compressed-tensors without `config_groups`")?;
            let strategies: Vec<&str> = groups
                .values()
                .map(|g| {
                    let w = &g["weights"];
                    match (w["type"].as_str(), w["num_bits"].as_u64(), w["strategy"].as_str()) {
                        (Some("float"), Some(8), Some("channel")) => Ok("fp8-channel"),
                        (Some("float"), Some(8), Some("tensor")) => Ok("fp8-tensor"),
                        _ => Err(format!("compressed-tensors weights {w} are not an fp8 channel or tensor scheme")),
                    }
                })
                .collect::<Result<_, String>>()?;
            match strategies.as_slice() {
                [one, rest @ ..] if rest.iter().all(|s| s == one) => one,
                [] => return Err("compressed-tensors with no config group".into()),
                _ => {
                    return Err(format!(
                        "compressed-tensors groups of mixed schemes {strategies:?}"
                    ))
                }
            }
        }
        other => {
            return Err(format!(
                "quant_method `{other}` is not a format solder names"
            ))
        }
    })
}

/// Refuses a reference/bf16 pair that cannot judge anything: a non-finite value in either,
/// or an `e_hf` that is zero (the bf16 tensor is not a bf16 run) or implausible: larger than
/// the largest |logit| (`E_HF_PLAUSIBLE`).
fn validate_pair(
    (name, reference): (&str, &[f32]),
    (bf16_name, bf16): (&str, &[f32]),
    vocab: usize,
) -> Result<(), String> {
    {
        for (name, values) in [(name, reference), (bf16_name, bf16)] {
            if let Some(at) = non_finite(values, vocab) {
                return Err(format!("`{name}` {at}"));
            }
        }
        let (logits, logits_bf16) = (reference, bf16);
        let scale = logits.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        if scale <= 0.0 {
            return Err(format!("`{name}` are all zero"));
        }
        let e_hf = max_abs_diff(logits_bf16, logits);
        if e_hf.is_nan() || e_hf <= 0.0 {
            return Err(format!(
                "e_hf = max |{bf16_name} - {name}| is {e_hf}: `{bf16_name}` must be a bf16 run, \
                 not a copy of `{name}`"
            ));
        }
        if e_hf > E_HF_PLAUSIBLE * scale {
            return Err(format!(
                "e_hf = max |{bf16_name} - {name}| is {e_hf:.4e}, more than {E_HF_PLAUSIBLE} x the \
                 largest |logit| ({scale:.4e}): `{bf16_name}` is not a bf16 run of this model"
            ));
        }
        Ok(())
    }
}

/// `e`, `e_hf`, and the share of positions whose argmax matches `reference` (`[positions *
/// vocab]`, as `ours` must be).
fn figures(
    ours: &[f32],
    reference: &[f32],
    bf16: &[f32],
    vocab: usize,
    format: &'static str,
) -> Result<GoldenFigures, String> {
    let positions = reference.len() / vocab.max(1);
    if ours.len() != reference.len() {
        return Err(format!(
            "{} logits to compare with a golden of {} ({positions} positions x vocab {vocab})",
            ours.len(),
            reference.len(),
        ));
    }
    let e = max_abs_diff(ours, reference);
    let e_hf = max_abs_diff(bf16, reference);
    let top1 = (0..positions)
        .filter(|&t| {
            let row = |v: &[f32]| crate::parity::argmax(&v[t * vocab..(t + 1) * vocab]);
            row(ours) == row(reference)
        })
        .count() as f64
        / positions.max(1) as f64;
    Ok(GoldenFigures {
        e,
        e_hf,
        // NaN when either is NaN or e_hf is zero; `passes` refuses those by name.
        ratio: e / e_hf,
        top1,
        format,
    })
}

/// How far transformers' bf16 forward may drift, relative to the largest |logit|, before a
/// golden is refused. The shipped goldens lie between 0.008 (qwen2) and 0.26
/// (shared-qwen3-next, whose random prompt lets its gated delta net drift most in bf16).
pub const E_HF_PLAUSIBLE: f32 = 1.0;

/// `max |a - b|`, NaN if any difference is NaN (a NaN is never dropped by `max`).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    let mut max = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        let d = (x - y).abs();
        if d.is_nan() {
            return f32::NAN;
        }
        max = max.max(d);
    }
    max
}

/// "at position P, vocab index I: VALUE" of the first non-finite value of `\[T * V\]` logits.
pub fn non_finite(values: &[f32], vocab: usize) -> Option<String> {
    let i = values.iter().position(|x| !x.is_finite())?;
    Some(format!(
        "at position {}, vocab index {}: {}",
        i / vocab.max(1),
        i % vocab.max(1),
        values[i]
    ))
}

/// The MTP draft head's logits, fp32 then bf16.
type MtpLogits = (Vec<f32>, Vec<f32>);

/// A golden safetensors file with its path, for messages.
struct GoldenFile<'a> {
    file: SafeTensors<'a>,
    path: &'a Path,
}

impl GoldenFile<'_> {
    /// Tensor `name`'s shape and bytes, which must be of `dtype`.
    fn get(&self, name: &str, dtype: Dtype) -> Result<(Vec<usize>, Vec<u8>), String> {
        let t = self
            .file
            .tensor(name)
            .map_err(|_| format!("{}: no tensor `{name}`", self.path.display()))?;
        if t.dtype() != dtype {
            return Err(format!(
                "{}: `{name}` is {:?}, expected {dtype:?}",
                self.path.display(),
                t.dtype()
            ));
        }
        Ok((t.shape().to_vec(), t.data().to_vec()))
    }

    /// The optional `mtp_logits` and `mtp_logits_bf16` (together or neither), each [T-1, V].
    fn mtp_logits(&self, tokens: usize, vocab: usize) -> Result<Option<MtpLogits>, String> {
        Ok(
            match (
                self.file.tensor("mtp_logits").is_ok(),
                self.file.tensor("mtp_logits_bf16").is_ok(),
            ) {
                (false, false) => None,
                (true, true) => {
                    let (shape, mtp) = self.get("mtp_logits", Dtype::F32)?;
                    let (shape_bf16, mtp_bf16) = self.get("mtp_logits_bf16", Dtype::F32)?;
                    if shape != [tokens - 1, vocab] || shape_bf16 != shape {
                        return Err(format!(
                    "{}: shapes mtp_logits {shape:?}, mtp_logits_bf16 {shape_bf16:?} do not fit [T-1, V] = [{}, {vocab}]",
                    self.path.display(),
                    tokens - 1
                ));
                    }
                    Some((floats(mtp), floats(mtp_bf16)))
                }
                _ => {
                    return Err(format!(
                        "{}: `mtp_logits` and `mtp_logits_bf16` come together",
                        self.path.display()
                    ))
                }
            },
        )
    }

    /// The optional MTP head golden: `mtp_hidden` [T, H] with `mtp_head_logits` and
    /// `mtp_head_logits_bf16` [T-1, V], all three or none.
    fn mtp_head(&self, tokens: usize, vocab: usize) -> Result<Option<MtpHeadGolden>, String> {
        let names = ["mtp_hidden", "mtp_head_logits", "mtp_head_logits_bf16"];
        Ok(match names.map(|n| self.file.tensor(n).is_ok()) {
            [false, false, false] => None,
            [true, true, true] => {
                let (hidden_shape, hidden) = self.get("mtp_hidden", Dtype::F32)?;
                let (shape, head) = self.get("mtp_head_logits", Dtype::F32)?;
                let (shape_bf16, head_bf16) = self.get("mtp_head_logits_bf16", Dtype::F32)?;
                if hidden_shape.len() != 2
                    || hidden_shape[0] != tokens
                    || shape != [tokens - 1, vocab]
                    || shape_bf16 != shape
                {
                    return Err(format!(
                    "{}: shapes mtp_hidden {hidden_shape:?}, mtp_head_logits {shape:?}, mtp_head_logits_bf16 {shape_bf16:?} do not fit [T, H], [T-1, V], [T-1, V]",
                    self.path.display()
                ));
                }
                Some(MtpHeadGolden {
                    hidden: floats(hidden),
                    hidden_size: hidden_shape[1],
                    logits: floats(head),
                    logits_bf16: floats(head_bf16),
                })
            }
            _ => {
                return Err(format!(
                    "{}: {} come together",
                    self.path.display(),
                    names.map(|n| format!("`{n}`")).join(", ")
                ))
            }
        })
    }
}

/// Little-endian f32 bytes as floats.
fn floats(b: Vec<u8>) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[derive(Debug, Clone, Copy)]
pub struct GoldenFigures {
    pub e: f32,
    pub e_hf: f32,
    pub ratio: f32,
    pub top1: f64,
    /// The checkpoint's weight format (`checkpoint_format`).
    pub format: &'static str,
}

impl GoldenFigures {
    /// Within `1.5 * e_hf`, with both finite and `e_hf` positive: a NaN fails here by name,
    /// never through a comparison that happens to hold.
    pub fn passes(&self) -> bool {
        self.e.is_finite() && self.e_hf.is_finite() && self.e_hf > 0.0 && self.e <= 1.5 * self.e_hf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use std::path::PathBuf;

    const T: usize = 3;
    const V: usize = 4;

    /// Plausible logits (largest |logit| 2.0) and a bf16 run 0.01 from them.
    fn logits() -> (Vec<f32>, Vec<f32>) {
        let reference: Vec<f32> = (0..T * V).map(|i| (i as f32 - 5.0) * 0.3).collect();
        let bf16 = reference.iter().map(|x| x + 0.01).collect();
        (reference, bf16)
    }

    fn write(name: &str, ids: &[i64], logits: &[f32], logits_bf16: &[f32]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-golden-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.safetensors"));
        let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let ids_bytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
        let (l, b) = (bytes(logits), bytes(logits_bf16));
        let tensors = [
            (
                "input_ids",
                TensorView::new(Dtype::I64, vec![ids.len()], &ids_bytes).unwrap(),
            ),
            (
                "logits",
                TensorView::new(Dtype::F32, vec![logits.len() / V, V], &l).unwrap(),
            ),
            (
                "logits_bf16",
                TensorView::new(Dtype::F32, vec![logits_bf16.len() / V, V], &b).unwrap(),
            ),
        ];
        safetensors::serialize_to_file(tensors, None, &path).unwrap();
        path
    }

    fn load_with(name: &str, logits: &[f32], logits_bf16: &[f32]) -> Result<Golden, String> {
        Golden::load(&write(name, &[1, 2, 3], logits, logits_bf16))
    }

    #[test]
    fn a_good_golden_loads_and_its_own_logits_pass() {
        let (reference, bf16) = logits();
        let golden = load_with("good", &reference, &bf16).unwrap();
        let figures = golden.compare(&reference).unwrap();
        assert_eq!(figures.e, 0.0);
        assert!(figures.passes(), "{figures:?}");
    }

    #[test]
    fn a_nan_in_logits_is_refused_at_load_by_position_and_index() {
        let (mut reference, bf16) = logits();
        reference[V + 2] = f32::NAN;
        let e = load_with("nan-logits", &reference, &bf16).unwrap_err();
        assert!(e.contains("nan-logits.safetensors"), "{e}");
        assert!(
            e.contains("`logits` at position 1, vocab index 2: NaN"),
            "{e}"
        );
    }

    #[test]
    fn nan_or_infinity_in_logits_bf16_is_refused() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let (reference, mut bf16) = logits();
            bf16[2 * V] = bad;
            let e = load_with("bad-bf16", &reference, &bf16).unwrap_err();
            assert!(
                e.contains("`logits_bf16` at position 2, vocab index 0"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_logits_bf16_equal_to_logits_is_refused() {
        let (reference, _) = logits();
        let e = load_with("copy", &reference, &reference).unwrap_err();
        assert!(e.contains("e_hf") && e.contains("not a copy"), "{e}");
    }

    #[test]
    fn a_logits_bf16_off_by_1000_is_refused() {
        let (reference, _) = logits();
        let off: Vec<f32> = reference.iter().map(|x| x + 1000.0).collect();
        let e = load_with("off", &reference, &off).unwrap_err();
        assert!(e.contains("e_hf") && e.contains("not a bf16 run"), "{e}");
    }

    #[test]
    fn a_shape_mismatch_is_refused() {
        let (reference, bf16) = logits();
        let e = load_with("short", &reference, &bf16[..2 * V]).unwrap_err();
        assert!(e.contains("do not fit"), "{e}");
    }

    #[test]
    fn a_nan_in_ours_fails_by_name_not_by_ordering() {
        let (reference, bf16) = logits();
        let golden = load_with("ours-nan", &reference, &bf16).unwrap();
        let mut ours = reference.clone();
        ours[5] = f32::NAN;
        let figures = golden.compare(&ours).unwrap();
        assert!(figures.e.is_nan() && figures.ratio.is_nan(), "{figures:?}");
        assert!(!figures.passes());
        ours[5] = f32::INFINITY;
        assert!(!golden.compare(&ours).unwrap().passes());
        assert!(golden.compare(&ours[..V]).is_err());
    }

    #[test]
    fn a_golden_file_must_be_a_regular_file() {
        let e = Golden::load(Path::new("/dev/zero")).unwrap_err();
        assert!(
            e.contains("/dev/zero") && e.contains("not a regular file"),
            "{e}"
        );
    }

    /// Every shipped golden names its format from its own config: the bf16 cases `bf16`, the
    /// quantized cases theirs (`generate_quant.py`).
    #[test]
    fn each_shipped_golden_names_its_checkpoint_format() {
        let root = crate::paths::workspace_root().join("tests/fixtures/golden");
        assert_eq!(
            checkpoint_format(&root.join("llama/config.json")),
            Ok("bf16")
        );
        for (case, format) in [
            ("llama_fp8", "fp8-block"),
            ("qwen3_fp8", "fp8-block"),
            ("qwen3_moe_fp8", "fp8-block"),
            ("qwen3_next_fp8", "fp8-block"),
            ("llama_fp8_channel", "fp8-channel"),
            ("llama_awq", "awq"),
            ("mistral_gptq", "gptq"),
            ("qwen2_gptq_asym", "gptq"),
        ] {
            let dir = root.join(case);
            assert_eq!(
                checkpoint_format(&dir.join("config.json")),
                Ok(format),
                "{case}"
            );
            let golden = Golden::load(&dir.join("golden.safetensors"))
                .unwrap()
                .for_checkpoint(&dir)
                .unwrap();
            let own = golden.compare(&golden.logits).unwrap();
            assert_eq!((own.format, own.e), (format, 0.0), "{case}");
        }
    }

    #[test]
    fn an_unnamed_quantization_is_an_error_not_a_guess() {
        let format = |v: serde_json::Value| quantization_format(Some(&v));
        assert_eq!(format(serde_json::Value::Null), Ok("bf16"));
        let e = format(serde_json::json!({ "quant_method": "bitsandbytes" })).unwrap_err();
        assert!(e.contains("`bitsandbytes`"), "{e}");
        assert!(format(serde_json::json!({ "bits": 4 }))
            .unwrap_err()
            .contains("quant_method"));
        let int8 = serde_json::json!({ "quant_method": "compressed-tensors", "config_groups": {
            "group_0": { "weights": { "type": "int", "num_bits": 8, "strategy": "channel" } } } });
        assert!(format(int8).unwrap_err().contains("not an fp8"));
        let tensor = serde_json::json!({ "quant_method": "compressed-tensors", "config_groups": {
            "group_0": { "weights": { "type": "float", "num_bits": 8, "strategy": "tensor" } } } });
        assert_eq!(format(tensor), Ok("fp8-tensor"));
    }

    #[test]
    fn non_finite_names_position_and_index() {
        assert_eq!(non_finite(&[0.0, 1.0, 2.0], 2), None);
        assert_eq!(
            non_finite(&[0.0, 1.0, f32::NEG_INFINITY], 2).as_deref(),
            Some("at position 1, vocab index 0: -inf")
        );
        assert!(max_abs_diff(&[1.0, f32::NAN], &[1.0, 0.0]).is_nan());
        assert!(max_abs_diff(&[f32::NAN, 9.0], &[0.0, 0.0]).is_nan());
    }
}
