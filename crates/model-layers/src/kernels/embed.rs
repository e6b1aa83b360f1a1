//! `embed` module (`crates/kernels/cuda/embed.cu`): gathers embedding rows into the f32
//! residual stream.

use half::bf16;
use solder_circuit::OpKind;
use solder_gpu_runtime::GpuError;

use super::args::size;
use super::decl::kernel;
use super::grid::per_row;
use crate::kernels::emit_view::{View, R};
use crate::numerics::to_f32;

kernel! {
    /// tokens i32\[rows\], table bf16\[vocab·hidden\] → out f32\[rows·hidden\].
    pub struct Embedding / EmbeddingArgs {
        tokens: In<i32>,
        table: In<bf16>,
        out: Out<f32>,
        rows: U32,
        hidden: U32,
        vocab: U32,
    }
    grid(a) = per_row(a.rows);
    EMBEDDING = "embed::embedding" => twin embedding, emit emit_embedding;
}

pub(super) const DECLS: &[&[super::KernelDecl]] = &[Embedding::DECLS];

fn embedding(a: EmbeddingArgs<'_>) -> Result<(), GpuError> {
    let (rows, hidden, vocab) = (a.rows.count(), a.hidden.dim()?, a.vocab.dim()?);
    let tokens = a.tokens.len(rows)?;
    let table = a.table.len(size(a.ctx, &[vocab, hidden])?)?;
    let out = a.out.len(size(a.ctx, &[rows, hidden])?)?;
    for (r, t) in tokens.iter().enumerate() {
        if *t < 0 || *t as usize >= vocab {
            return Err(a.ctx.fail(format!(
                "row {r}: token id {t} outside the vocabulary of {vocab}"
            )));
        }
    }
    for (t, o) in tokens.iter().zip(out.chunks_exact_mut(hidden)) {
        let row = &table[*t as usize * hidden..][..hidden];
        for (o, v) in o.iter_mut().zip(row) {
            *o = to_f32(*v);
        }
    }
    Ok(())
}

fn emit_embedding(v: &View<'_>) -> R {
    let e = v.op(OpKind::Embedding, None)?;
    Ok(vec![Embedding {
        tokens: v.input(e, 0)?,
        table: v.weight(e, 0)?,
        out: v.output(e, 0)?,
        rows: v.rows(),
        hidden: v.u32(e, "hidden")?,
        vocab: v.u32(e, "vocab")?,
    }
    .launch(EMBEDDING)])
}
