//! One checkpoint tensor as every format's reader (`read`, `fp8`, `int4`) takes it: its
//! refusals, naming the tensor and its file; its shape; its values as bf16 (a float weight) or
//! f32 (a scale).
//!
//! Invariant: a value is converted exactly where the target holds it (a scale's BF16 or F16 in
//! f32) and rounded to nearest even otherwise (F16 and F32 weights to bf16).

use half::{bf16, f16};
use safetensors::Dtype as StDtype;

use crate::checkpoint::TensorRef;
use crate::error::WeightsError;

/// A refusal naming `t` and its file.
pub(crate) fn refuse(t: &TensorRef<'_>, message: String) -> WeightsError {
    WeightsError::Quantized {
        tensor: t.name.to_string(),
        file: t.file.to_path_buf(),
        message,
    }
}

/// `t` has `shape`, else the shape refusal naming it.
pub(crate) fn shape_is(t: &TensorRef<'_>, shape: &[usize]) -> Result<(), WeightsError> {
    if t.shape == shape {
        return Ok(());
    }
    Err(WeightsError::Shape {
        tensor: t.name.to_string(),
        file: t.file.to_path_buf(),
        found: t.shape.clone(),
        expected: shape.to_vec(),
    })
}

/// A float tensor's values in bf16 (BF16 as is, F16 and F32 rounded to nearest even).
pub(crate) fn float_values(t: &TensorRef<'_>) -> Result<Vec<bf16>, WeightsError> {
    Ok(match t.dtype {
        StDtype::BF16 => t
            .data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]))
            .collect(),
        StDtype::F16 => t
            .data
            .chunks_exact(2)
            .map(|b| bf16::from_f32(f16::from_le_bytes([b[0], b[1]]).to_f32()))
            .collect(),
        StDtype::F32 => t
            .data
            .chunks_exact(4)
            .map(|b| bf16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        other => {
            return Err(WeightsError::Dtype {
                tensor: t.name.to_string(),
                file: t.file.to_path_buf(),
                found: format!("{other:?}"),
            })
        }
    })
}

/// f32 values of a float scale tensor (BF16, F16 or F32: each exact in f32).
pub(crate) fn scale_values(t: &TensorRef<'_>) -> Result<Vec<f32>, WeightsError> {
    Ok(match t.dtype {
        StDtype::F32 => crate::bytes::f32s_from_bytes(t.data),
        StDtype::BF16 => t
            .data
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        StDtype::F16 => t
            .data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(refuse(
                t,
                format!("a scale tensor stored as {other:?}, expected BF16, F16 or F32"),
            ))
        }
    })
}
