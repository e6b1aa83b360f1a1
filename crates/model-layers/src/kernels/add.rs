//! `add` module (`crates/kernels/cuda/add.cu`): the residual add.

use half::bf16;
use solder_circuit::OpKind;
use solder_gpu_runtime::GpuError;

use super::args::size;
use super::decl::kernel;
use super::grid::elementwise;
use crate::kernels::emit_view::{View, R};
use crate::numerics::residual_row;

kernel! {
    /// out f32[rows·hidden] = h f32 + x bf16.
    pub struct ResidualAdd / ResidualAddArgs {
        h: In<f32>,
        x: In<bf16>,
        out: Out<f32>,
        rows: U32,
        hidden: U32,
    }
    grid(a) = elementwise(a.rows as u64 * a.hidden as u64);
    RESIDUAL_ADD = "add::residual_add" => twin residual_add, emit emit_residual_add;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[ResidualAdd::DECLS];

fn residual_add(a: ResidualAddArgs<'_>) -> Result<(), GpuError> {
    let n = size(a.ctx, &[a.rows.count(), a.hidden.dim()?])?;
    let h = a.h.len(n)?;
    let x = a.x.len(n)?;
    let out = a.out.len(n)?;
    residual_row(h, x, out);
    Ok(())
}

fn emit_residual_add(v: &View<'_>) -> R {
    let a = v.op(OpKind::ResidualAdd, None)?;
    Ok(vec![ResidualAdd {
        h: v.input(a, 0)?,
        x: v.input(a, 1)?,
        out: v.output(a, 0)?,
        rows: v.rows(),
        hidden: v.u32(a, "hidden")?,
    }
    .launch(RESIDUAL_ADD)])
}
