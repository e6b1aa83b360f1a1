//! The emitters of `linear_mma` and `lm_head_mma`: the entry of the weight's format, in the
//! tile the program takes (`tiled!`).

use super::*;

/// `linear_mma`, or its entry for the weight's format (`linear_mma_fp8`, `linear_mma_int4`).
pub(super) fn emit_linear_mma(v: &View<'_>) -> R {
    let l = v.op(OpKind::Linear, None)?;
    let (x, w, bias, y) = (
        v.input(l, 0)?,
        v.weight(l, 0)?,
        v.weight_opt(l, 1),
        v.output(l, 0)?,
    );
    let (rows, k, n_out) = (v.rows(), v.u32(l, "in")?, v.u32(l, "out")?);
    let launch = match v.weight_format(l, 0) {
        WeightFormat::Bf16 => tiled!(
            v,
            LinearMma {
                x,
                w,
                bias,
                y,
                rows,
                k,
                n_out,
            },
            n_out,
            LINEAR_MMA,
            LINEAR_MMA_NARROW,
            LINEAR_MMA_LARGE
        ),
        WeightFormat::Fp8 { block_n, block_k } => tiled!(
            v,
            LinearMmaFp8 {
                x,
                w,
                bias,
                y,
                rows,
                k,
                n_out,
                block_n,
                block_k,
            },
            n_out,
            LINEAR_MMA_FP8,
            LINEAR_MMA_FP8_NARROW,
            LINEAR_MMA_FP8_LARGE
        ),
        WeightFormat::Int4 { group } => tiled!(
            v,
            LinearMmaInt4 {
                x,
                w,
                bias,
                y,
                rows,
                k,
                n_out,
                group,
            },
            n_out,
            LINEAR_MMA_INT4,
            LINEAR_MMA_INT4_NARROW,
            LINEAR_MMA_INT4_LARGE
        ),
    };
    Ok(vec![launch])
}

/// `lm_head_mma`, or its entry for the weight's format.
pub(super) fn emit_lm_head_mma(v: &View<'_>) -> R {
    // The LM head and an MoE router are the same f32-output projection.
    let (h, vocab) = match v.op(OpKind::LmHead, None) {
        Ok(h) => (h, v.u32(h, "vocab")?),
        Err(_) => {
            let r = v.op(OpKind::Router, None)?;
            (r, v.u32(r, "experts")?)
        }
    };
    let (x, w, logits) = (v.input(h, 0)?, v.weight(h, 0)?, v.output(h, 0)?);
    let (rows, k, want) = (v.rows(), v.u32(h, "hidden")?, v.want_logits(h));
    let launch = match v.weight_format(h, 0) {
        WeightFormat::Bf16 => tiled!(
            v,
            LmHeadMma {
                x,
                w,
                logits,
                want,
                rows,
                k,
                vocab,
            },
            vocab,
            LM_HEAD_MMA,
            LM_HEAD_MMA_NARROW,
            LM_HEAD_MMA_LARGE
        ),
        WeightFormat::Fp8 { block_n, block_k } => tiled!(
            v,
            LmHeadMmaFp8 {
                x,
                w,
                logits,
                want,
                rows,
                k,
                vocab,
                block_n,
                block_k,
            },
            vocab,
            LM_HEAD_MMA_FP8,
            LM_HEAD_MMA_FP8_NARROW,
            LM_HEAD_MMA_FP8_LARGE
        ),
        WeightFormat::Int4 { group } => tiled!(
            v,
            LmHeadMmaInt4 {
                x,
                w,
                logits,
                want,
                rows,
                k,
                vocab,
                group,
            },
            vocab,
            LM_HEAD_MMA_INT4,
            LM_HEAD_MMA_INT4_NARROW,
            LM_HEAD_MMA_INT4_LARGE
        ),
    };
    Ok(vec![launch])
}
