//! Golden files (`../shared/golden/README.md`): `input_ids` (I64 [T]), `logits` (F32 [T, V],
//! transformers' fp32 forward over the bf16 weights) and `logits_bf16` (transformers' bf16
//! forward).

use std::path::Path;

use safetensors::{Dtype, SafeTensors};

pub struct Golden {
    pub input_ids: Vec<u32>,
    pub logits: Vec<f32>,
    pub logits_bf16: Vec<f32>,
    pub vocab: usize,
}

impl Golden {
    pub fn load(path: &Path) -> Result<Golden, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = SafeTensors::deserialize(&bytes)
            .map_err(|e| format!("{}: not a safetensors file: {e}", path.display()))?;
        let get = |name: &str, dtype: Dtype| -> Result<(Vec<usize>, Vec<u8>), String> {
            let t = file
                .tensor(name)
                .map_err(|_| format!("{}: no tensor `{name}`", path.display()))?;
            if t.dtype() != dtype {
                return Err(format!(
                    "{}: `{name}` is {:?}, expected {dtype:?}",
                    path.display(),
                    t.dtype()
                ));
            }
            Ok((t.shape().to_vec(), t.data().to_vec()))
        };
        let (ids_shape, ids) = get("input_ids", Dtype::I64)?;
        let (logits_shape, logits) = get("logits", Dtype::F32)?;
        let (bf16_shape, logits_bf16) = get("logits_bf16", Dtype::F32)?;
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
        let input_ids = ids
            .chunks_exact(8)
            .map(|b| {
                let v = i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                u32::try_from(v)
                    .map_err(|_| format!("{}: token id {v} out of range", path.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let floats = |b: Vec<u8>| {
            b.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect::<Vec<_>>()
        };
        Ok(Golden {
            input_ids,
            logits: floats(logits),
            logits_bf16: floats(logits_bf16),
            vocab: logits_shape[1],
        })
    }

    /// `e`, `e_hf`, and the share of positions whose argmax matches the reference.
    pub fn compare(&self, ours: &[f32]) -> GoldenFigures {
        let max_abs = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(
                    0.0f32,
                    |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
                )
        };
        let e = max_abs(ours, &self.logits);
        let e_hf = max_abs(&self.logits_bf16, &self.logits);
        let positions = self.input_ids.len();
        let top1 = (0..positions)
            .filter(|&t| {
                let row =
                    |v: &[f32]| crate::parity::argmax(&v[t * self.vocab..(t + 1) * self.vocab]);
                row(ours) == row(&self.logits)
            })
            .count() as f64
            / positions.max(1) as f64;
        GoldenFigures {
            e,
            e_hf,
            ratio: if e_hf > 0.0 { e / e_hf } else { f32::INFINITY },
            top1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct GoldenFigures {
    pub e: f32,
    pub e_hf: f32,
    pub ratio: f32,
    pub top1: f64,
}

impl GoldenFigures {
    pub fn passes(&self) -> bool {
        self.e <= 1.5 * self.e_hf
    }
}
