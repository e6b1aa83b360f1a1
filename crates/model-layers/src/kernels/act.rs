//! `act` module (`crates/kernels/cuda/act.cu`): activations — SiLU·mul of the MLP and the
//! sigmoid gate of Qwen3-Next's gated attention, which take the same arguments.

use half::bf16;
use solder_circuit::OpKind;
use solder_gpu_runtime::GpuError;

use super::args::size;
use super::decl::{kernel, Name};
use super::grid::elementwise;
use crate::kernels::emit_view::{View, R};
use crate::numerics::{silu_mul_value, to_bf16, to_f32};

kernel! {
    /// `silu_mul`: out bf16[rows·width] = silu(a) · b; `sigmoid_mul`: out = a · sigmoid(b)
    /// (the gated attention output of Qwen3-Next).
    pub struct Gated / GatedArgs {
        a: In<bf16>,
        b: In<bf16>,
        out: Out<bf16>,
        rows: U32,
        width: U32,
    }
    grid(a) = elementwise(a.rows as u64 * a.width as u64);
    SILU_MUL = "act::silu_mul" => twin silu_mul, emit emit_silu_mul;
    SIGMOID_MUL = "act::sigmoid_mul" => twin sigmoid_mul, emit emit_sigmoid_mul;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[Gated::DECLS];

/// 1 / (1 + exp(−x)), in f32.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// bf16(x · sigmoid(gate)): Qwen3-Next's gated attention output, as `sigmoid_mul` stores it
/// (and the attention kernels that store their output gated).
#[inline(always)]
pub(crate) fn sigmoid_gated(x: bf16, gate: bf16) -> bf16 {
    to_bf16(to_f32(x) * sigmoid(to_f32(gate)))
}

/// `out[i] = sigmoid_gated(out[i], gate[i])`: attention's stored output gated in place.
pub(crate) fn gate_in_place(out: &mut [bf16], gate: &[bf16]) {
    for (o, g) in out.iter_mut().zip(gate) {
        *o = sigmoid_gated(*o, *g);
    }
}

fn each(g: GatedArgs<'_>, f: impl Fn(bf16, bf16) -> bf16) -> Result<(), GpuError> {
    let n = size(g.ctx, &[g.rows.count(), g.width.dim()?])?;
    let a = g.a.len(n)?;
    let b = g.b.len(n)?;
    let out = g.out.len(n)?;
    for ((o, a), b) in out.iter_mut().zip(a).zip(b) {
        *o = f(*a, *b);
    }
    Ok(())
}

fn silu_mul(g: GatedArgs<'_>) -> Result<(), GpuError> {
    each(g, silu_mul_value)
}

fn sigmoid_mul(g: GatedArgs<'_>) -> Result<(), GpuError> {
    each(g, sigmoid_gated)
}

fn emit_silu_mul(v: &View<'_>) -> R {
    gated_of(v, OpKind::SiluMul, SILU_MUL)
}

fn emit_sigmoid_mul(v: &View<'_>) -> R {
    gated_of(v, OpKind::SigmoidMul, SIGMOID_MUL)
}

fn gated_of(v: &View<'_>, kind: OpKind, kernel: Name<Gated>) -> R {
    let s = v.op(kind, None)?;
    Ok(vec![Gated {
        a: v.input(s, 0)?,
        b: v.input(s, 1)?,
        out: v.output(s, 0)?,
        rows: v.rows(),
        width: v.u32(s, "width")?,
    }
    .launch(kernel)])
}
