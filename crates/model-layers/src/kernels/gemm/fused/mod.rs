//! The fused tensor-core kernels (`gemm::qkv_mma`, `gemm::linear_pair_mma`,
//! `gemm::gate_up_silu_mma`): one launch where the single projections took three (q, k, v), two
//! (two sibling projections) or three (gate, up, SiLU·mul). `quant` holds
//! their fp8 and int4 entries; the emitters here launch the entry of the weights' format.
//!
//! Numerics: every output's dot is `linear_mma`'s (the same `mma.sync` sequence from +0 in k
//! order, the same zero padding), stored as `linear_mma` stores it; the SiLU·mul epilogue takes
//! gate and up rounded to bf16, as `act::silu_mul` reads them. So each fused kernel writes the
//! bytes of the launches it replaces, on the device as on the host: the rules are `differs`
//! only against gemv's reference, as `linear_tensor_cores` is (a session test holds the fused
//! and unfused tensor-core programs to the same bytes).

use half::bf16;
use solder_circuit::{OpKind, WeightFormat};
use solder_gpu_runtime::{GpuError, LaunchConfig};

use super::{each_dot, linear_dots, GEMM_FEATURES};
use crate::kernels::args::size;
use crate::kernels::decl::{kernel, Name};
use crate::kernels::emit_view::{View, R};
use crate::kernels::gemv::{gate_up, projections, sibling_pair, GateUp, SiblingPair};
use crate::numerics::{linear_value, silu_mul_value};

mod quant;
mod rope;

/// Each quantized entry of the fused kernels: (entry, the kernel it serves, the format kind).
pub fn format_entries() -> impl Iterator<Item = (&'static str, &'static str, &'static str)> {
    quant::FORMAT_ENTRIES
        .iter()
        .chain(rope::FORMAT_ENTRIES)
        .copied()
}
pub use quant::{
    GateUpSiluMmaFp8, GateUpSiluMmaInt4, QkvMmaFp8, QkvMmaInt4, GATE_UP_SILU_MMA_FP8,
    GATE_UP_SILU_MMA_INT4, QKV_MMA_FP8, QKV_MMA_FP8_LARGE, QKV_MMA_INT4, QKV_MMA_INT4_LARGE,
};
pub use rope::{
    qkv_rope_kv_grid, QkvRopeKvMma, QkvRopeKvMmaArgs, QkvRopeKvMmaFp8, QkvRopeKvMmaInt4,
    QkvRopeKvParts, QKV_GATED_NORM_ZC_ROPE_KV_MMA, QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4, QKV_NORM_ROPE_KV_MMA, QKV_NORM_ROPE_KV_MMA_FP8,
    QKV_NORM_ROPE_KV_MMA_INT4, QKV_ROPE_KV_MMA, QKV_ROPE_KV_MMA_FP8, QKV_ROPE_KV_MMA_INT4,
    VARIANTS,
};
pub use rope::{
    qkv_rope_kv_large_grid, QkvTile, LARGE_NORM_STAGE_ROWS, LARGE_VARIANTS as QKV_LARGE_VARIANTS,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_LARGE, QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_LARGE,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_LARGE, QKV_NORM_ROPE_KV_MMA_FP8_LARGE,
    QKV_NORM_ROPE_KV_MMA_INT4_LARGE, QKV_NORM_ROPE_KV_MMA_LARGE, QKV_ROPE_KV_MMA_FP8_LARGE,
    QKV_ROPE_KV_MMA_INT4_LARGE, QKV_ROPE_KV_MMA_LARGE,
};
pub use rope::{
    NARROW_VARIANTS as QKV_NARROW_VARIANTS, QKV_GATED_NORM_ZC_ROPE_KV_MMA_FP8_NARROW,
    QKV_GATED_NORM_ZC_ROPE_KV_MMA_INT4_NARROW, QKV_GATED_NORM_ZC_ROPE_KV_MMA_NARROW,
    QKV_NORM_ROPE_KV_MMA_FP8_NARROW, QKV_NORM_ROPE_KV_MMA_INT4_NARROW, QKV_NORM_ROPE_KV_MMA_NARROW,
    QKV_ROPE_KV_MMA_FP8_NARROW, QKV_ROPE_KV_MMA_INT4_NARROW, QKV_ROPE_KV_MMA_NARROW,
};

kernel! {
    /// The q, k and v projections of x bf16\[rows·k\] on the tensor cores: q bf16\[rows·nq\],
    /// k_out and v bf16\[rows·nkv\] (biases optional).
    pub struct QkvMma / QkvMmaArgs {
        x: In<bf16>,
        wq: In<bf16>,
        bq: InOpt<bf16>,
        wk: In<bf16>,
        bk: InOpt<bf16>,
        wv: In<bf16>,
        bv: InOpt<bf16>,
        q: Out<bf16>,
        k_out: Out<bf16>,
        v: Out<bf16>,
        rows: U32,
        k: U32,
        nq: U32,
        nkv: U32,
    }
    grid(a) = qkv_grid(a.nq, a.nkv, a.rows);
    QKV_MMA = "gemm::qkv_mma" => twin qkv_mma, emit emit_qkv_mma;
}

kernel! {
    /// Two sibling projections of x bf16\[rows·k\] on the tensor cores (Gated DeltaNet's
    /// in_proj_qkvz and in_proj_ba): y1 bf16\[rows·n1\], y2 bf16\[rows·n2\] (biases optional),
    /// each as `linear_mma` stores it.
    pub struct LinearPairMma / LinearPairMmaArgs {
        x: In<bf16>,
        w1: In<bf16>,
        b1: InOpt<bf16>,
        w2: In<bf16>,
        b2: InOpt<bf16>,
        y1: Out<bf16>,
        y2: Out<bf16>,
        rows: U32,
        k: U32,
        n1: U32,
        n2: U32,
    }
    grid(a) = pair_grid(a.n1, a.n2, a.rows);
    LINEAR_PAIR_MMA = "gemm::linear_pair_mma" => twin linear_pair_mma, emit emit_linear_pair_mma;
}

kernel! {
    /// Gate and up projections (wg, wu bf16\[inter·k\]) of x bf16\[rows·k\] on the tensor
    /// cores, then act bf16\[rows·inter\] = silu(gate) · up.
    pub struct GateUpSiluMma / GateUpSiluMmaArgs {
        x: In<bf16>,
        wg: In<bf16>,
        wu: In<bf16>,
        act: Out<bf16>,
        rows: U32,
        k: U32,
        inter: U32,
    }
    grid(a) = super::gemm_grid(a.inter, a.rows);
    GATE_UP_SILU_MMA = "gemm::gate_up_silu_mma" => twin gate_up_silu_mma, emit emit_gate_up_silu_mma;
}

/// `gate_up_silu_mma` through gemm.cu's `gemm_narrow` (lever `mma_narrow`, decode widths): the
/// same arguments, grid, twin and bytes.
pub const GATE_UP_SILU_MMA_NARROW: Name<GateUpSiluMma> = Name::new("gemm::gate_up_silu_mma_narrow");
/// `gate_up_silu_mma` through gemm.cu's `gemm_large` (lever `mma_large`, prefill widths): the
/// same arguments, twin and bytes, in `gemm::large_grid`.
pub const GATE_UP_SILU_MMA_LARGE: Name<GateUpSiluMma> = Name::new("gemm::gate_up_silu_mma_large");

/// `gate_up_silu_mma` through gemm.cu's `gemm_pipe` (lever `mma_pipe`, with `mma_large`): the
/// same arguments, twin, grid and bytes as `_large`, three cp.async stages of shared memory.
pub const GATE_UP_SILU_MMA_PIPE: Name<GateUpSiluMma> = Name::new("gemm::gate_up_silu_mma_pipe");

/// `gate_up_silu_mma_fp8` and `_int4` through `gemm_large`.
pub const GATE_UP_SILU_MMA_FP8_LARGE: Name<GateUpSiluMmaFp8> =
    Name::new("gemm::gate_up_silu_mma_fp8_large");
pub const GATE_UP_SILU_MMA_INT4_LARGE: Name<GateUpSiluMmaInt4> =
    Name::new("gemm::gate_up_silu_mma_int4_large");

/// `gate_up_silu_mma_fp8` and `_int4` through `gemm_narrow` (a stage of 128 k).
pub const GATE_UP_SILU_MMA_FP8_NARROW: Name<GateUpSiluMmaFp8> =
    Name::new("gemm::gate_up_silu_mma_fp8_narrow");
pub const GATE_UP_SILU_MMA_INT4_NARROW: Name<GateUpSiluMmaInt4> =
    Name::new("gemm::gate_up_silu_mma_int4_narrow");
/// `linear_pair_mma` through `gemm_narrow`.
pub const LINEAR_PAIR_MMA_NARROW: Name<LinearPairMma> = Name::new("gemm::linear_pair_mma_narrow");
/// `linear_pair_mma` through `gemm_large`, in `gemm::large_grid_of` both matrices' features.
pub const LINEAR_PAIR_MMA_LARGE: Name<LinearPairMma> = Name::new("gemm::linear_pair_mma_large");
/// `qkv_mma` through `gemm_large`, in `gemm::large_grid_of` q's, k's and v's features.
pub const QKV_MMA_LARGE: Name<QkvMma> = Name::new("gemm::qkv_mma_large");
/// `qkv_mma` and `linear_pair_mma` through `gemm_pipe` (lever `mma_pipe`): their `_large`
/// entries' grids and bytes, three cp.async stages of shared memory.
pub const QKV_MMA_PIPE: Name<QkvMma> = Name::new("gemm::qkv_mma_pipe");
pub const LINEAR_PAIR_MMA_PIPE: Name<LinearPairMma> = Name::new("gemm::linear_pair_mma_pipe");

/// q's feature blocks of 32, then k's, then v's; one block per 64 rows.
pub fn qkv_grid(nq: u32, nkv: u32, rows: u32) -> LaunchConfig {
    blocks_of(&[nq, nkv, nkv], rows)
}

/// The first matrix's feature blocks of 32, then the second's; one block per 64 rows.
fn pair_grid(n1: u32, n2: u32, rows: u32) -> LaunchConfig {
    blocks_of(&[n1, n2], rows)
}

/// Each matrix's feature blocks of 32 in turn, each over every 64 rows (`tile_grid`).
fn blocks_of(features: &[u32], rows: u32) -> LaunchConfig {
    let blocks: u32 = features.iter().map(|n| n.div_ceil(GEMM_FEATURES)).sum();
    super::tile_grid(blocks, rows, 0)
}

fn qkv_mma(a: QkvMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, nq, nkv) = (a.rows.count(), a.k.dim()?, a.nq.dim()?, a.nkv.dim()?);
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let projections = [
        (a.wq, a.bq, a.q, nq),
        (a.wk, a.bk, a.k_out, nkv),
        (a.wv, a.bv, a.v, nkv),
    ];
    for (w, bias, y, n) in projections {
        let w = w.len(size(ctx, &[n, k])?)?;
        let bias = bias.len(n)?;
        let y = y.len(size(ctx, &[rows, n])?)?;
        linear_dots(ctx, x, w, bias, [rows, k, n], y);
    }
    Ok(())
}

fn linear_pair_mma(a: LinearPairMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k) = (a.rows.count(), a.k.dim()?);
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let projections = [
        (a.w1, a.b1, a.y1, a.n1.dim()?),
        (a.w2, a.b2, a.y2, a.n2.dim()?),
    ];
    for (w, bias, y, n) in projections {
        let w = w.len(size(ctx, &[n, k])?)?;
        let bias = bias.len(n)?;
        let y = y.len(size(ctx, &[rows, n])?)?;
        linear_dots(ctx, x, w, bias, [rows, k, n], y);
    }
    Ok(())
}

/// Both projections bf16 (the rule lists bf16 only: a quantized pair is left to
/// `linear_tensor_cores`, one launch each).
fn emit_linear_pair_mma(v: &View<'_>) -> R {
    let SiblingPair {
        x,
        w: [w1, w2],
        bias: [b1, b2],
        y: [y1, y2],
        k,
        n: [n1, n2],
    } = sibling_pair(v)?;
    let launch = LinearPairMma {
        x,
        w1,
        b1,
        w2,
        b2,
        y1,
        y2,
        rows: v.rows(),
        k,
        n1,
        n2,
    };
    Ok(vec![super::tiled!(
        v,
        launch,
        [n1, n2],
        LINEAR_PAIR_MMA,
        LINEAR_PAIR_MMA_NARROW,
        LINEAR_PAIR_MMA_LARGE
    )])
}

fn gate_up_silu_mma(a: GateUpSiluMmaArgs<'_>) -> Result<(), GpuError> {
    let ctx = a.ctx;
    let (rows, k, inter) = (a.rows.count(), a.k.dim()?, a.inter.dim()?);
    let x = a.x.len(size(ctx, &[rows, k])?)?;
    let weights = size(ctx, &[inter, k])?;
    let (wg, wu) = (a.wg.len(weights)?, a.wu.len(weights)?);
    let act = a.act.len(size(ctx, &[rows, inter])?)?;
    gate_up_act(ctx, x, (wg, wu), [rows, k, inter], act);
    Ok(())
}

/// act\[r\]\[f\] = silu(gate) · up for x's rows against one gate and up matrix `[inter][k]`:
/// gate and up as linear_mma stores them (bf16), then act::silu_mul's arithmetic.
pub(super) fn gate_up_act(
    ctx: &solder_gpu_runtime::TwinCtx<'_>,
    x: &[bf16],
    (wg, wu): (&[bf16], &[bf16]),
    shape: [usize; 3],
    act: &mut [bf16],
) {
    let mut gate = vec![bf16::ZERO; act.len()];
    let mut up = vec![bf16::ZERO; act.len()];
    let stored = |_: usize, d: f32| linear_value(d, None);
    each_dot(ctx, x, wg, shape, stored, &mut gate);
    each_dot(ctx, x, wu, shape, stored, &mut up);
    for (out, (g, u)) in act.iter_mut().zip(gate.iter().zip(&up)) {
        *out = silu_mul_value(*g, *u);
    }
}

/// The error for weights of a fused kernel in more than one format kind (the fuser never
/// gives a fused rule such a chain: `solder_circuit::fuser`'s one-format check).
pub(super) fn mixed_formats(
    v: &View<'_>,
    kernel: &str,
    formats: &[WeightFormat],
) -> crate::ExecError {
    let listed: Vec<String> = formats.iter().map(ToString::to_string).collect();
    v.err(format!(
        "`{kernel}`'s weights are stored as {}: its entries read one format kind",
        listed.join(", ")
    ))
}

/// `qkv_mma`, or its entry for the weights' format (`qkv_mma_fp8`, `qkv_mma_int4`).
fn emit_qkv_mma(v: &View<'_>) -> R {
    let p = projections(v)?;
    let ([wq, wk, wv], [bq, bk, bv], [q, k_out, vo]) = (p.w, p.bias, p.outputs(v)?);
    let (x, rows, k, nq, nkv) = (v.input(p.q_op, 0)?, v.rows(), p.k, p.nq, p.nkv);
    let formats = p.ops.map(|op| v.weight_format(op, 0));
    use WeightFormat::{Bf16, Fp8, Int4};
    // No `_narrow` entries: at decode widths the wide ones.
    let launch = match formats {
        [Bf16, Bf16, Bf16] => super::tiled!(
            v,
            QkvMma {
                x,
                wq,
                bq,
                wk,
                bk,
                wv,
                bv,
                q,
                k_out,
                v: vo,
                rows,
                k,
                nq,
                nkv,
            },
            [nq, nkv, nkv],
            QKV_MMA,
            QKV_MMA,
            QKV_MMA_LARGE
        ),
        [Fp8 {
            block_n: q_block_n,
            block_k: q_block_k,
        }, Fp8 {
            block_n: k_block_n,
            block_k: k_block_k,
        }, Fp8 {
            block_n: v_block_n,
            block_k: v_block_k,
        }] => super::tiled!(
            v,
            QkvMmaFp8 {
                x,
                wq,
                bq,
                wk,
                bk,
                wv,
                bv,
                q,
                k_out,
                v: vo,
                rows,
                k,
                nq,
                nkv,
                q_block_n,
                q_block_k,
                k_block_n,
                k_block_k,
                v_block_n,
                v_block_k,
            },
            [nq, nkv, nkv],
            QKV_MMA_FP8,
            QKV_MMA_FP8,
            QKV_MMA_FP8_LARGE
        ),
        [Int4 { group: q_group }, Int4 { group: k_group }, Int4 { group: v_group }] => {
            super::tiled!(
                v,
                QkvMmaInt4 {
                    x,
                    wq,
                    bq,
                    wk,
                    bk,
                    wv,
                    bv,
                    q,
                    k_out,
                    v: vo,
                    rows,
                    k,
                    nq,
                    nkv,
                    q_group,
                    k_group,
                    v_group,
                },
                [nq, nkv, nkv],
                QKV_MMA_INT4,
                QKV_MMA_INT4,
                QKV_MMA_INT4_LARGE
            )
        }
        _ => return Err(mixed_formats(v, QKV_MMA.as_str(), &formats)),
    };
    Ok(vec![launch])
}

/// `gate_up_silu_mma`, or its entry for the weights' format.
fn emit_gate_up_silu_mma(v: &View<'_>) -> R {
    let GateUp {
        gate,
        wg,
        wu,
        act,
        k,
        inter,
    } = gate_up(v)?;
    let up = v.producer_in_group(v.op(OpKind::SiluMul, None)?, 1)?;
    let (x, rows) = (v.input(gate, 0)?, v.rows());
    let formats = [v.weight_format(gate, 0), v.weight_format(up, 0)];
    use WeightFormat::{Bf16, Fp8, Int4};
    let launch = match formats {
        [Bf16, Bf16] => super::tiled!(
            v,
            GateUpSiluMma {
                x,
                wg,
                wu,
                act,
                rows,
                k,
                inter,
            },
            inter,
            GATE_UP_SILU_MMA,
            GATE_UP_SILU_MMA_NARROW,
            GATE_UP_SILU_MMA_LARGE
        ),
        [Fp8 {
            block_n: g_block_n,
            block_k: g_block_k,
        }, Fp8 {
            block_n: u_block_n,
            block_k: u_block_k,
        }] => super::tiled!(
            v,
            GateUpSiluMmaFp8 {
                x,
                wg,
                wu,
                act,
                rows,
                k,
                inter,
                g_block_n,
                g_block_k,
                u_block_n,
                u_block_k,
            },
            inter,
            GATE_UP_SILU_MMA_FP8,
            GATE_UP_SILU_MMA_FP8_NARROW,
            GATE_UP_SILU_MMA_FP8_LARGE
        ),
        [Int4 { group: g_group }, Int4 { group: u_group }] => super::tiled!(
            v,
            GateUpSiluMmaInt4 {
                x,
                wg,
                wu,
                act,
                rows,
                k,
                inter,
                g_group,
                u_group,
            },
            inter,
            GATE_UP_SILU_MMA_INT4,
            GATE_UP_SILU_MMA_INT4_NARROW,
            GATE_UP_SILU_MMA_INT4_LARGE
        ),
        _ => return Err(mixed_formats(v, GATE_UP_SILU_MMA.as_str(), &formats)),
    };
    Ok(vec![launch])
}
