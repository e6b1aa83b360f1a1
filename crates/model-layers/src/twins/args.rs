//! Reading and checking a launch's arguments: every dimension, every buffer length, before a
//! twin writes anything. Errors name the kernel (through `TwinCtx`) and the argument.

use half::bf16;
use solder_gpu_runtime::{par_chunks_mut, GpuError, TwinCtx};

/// Multiply-accumulates below which a twin runs on one thread (a spawn costs ~20 µs).
pub(crate) const PAR_MIN_WORK: usize = 1 << 20;

/// Host threads for `work` multiply-accumulates.
pub(crate) fn threads_for(ctx: &TwinCtx<'_>, work: usize) -> usize {
    if work < PAR_MIN_WORK {
        1
    } else {
        ctx.threads()
    }
}

/// The work of a launch in multiply-accumulates (saturating: it only picks a thread count).
pub(crate) fn macs(dims: &[usize]) -> usize {
    dims.iter().fold(1usize, |acc, d| acc.saturating_mul(*d))
}

/// A row count (zero rows is an empty launch).
pub(crate) fn rows(ctx: &TwinCtx<'_>, index: usize) -> Result<usize, GpuError> {
    Ok(ctx.u32(index)? as usize)
}

/// A dimension that must be at least 1.
pub(crate) fn dim(ctx: &TwinCtx<'_>, index: usize) -> Result<usize, GpuError> {
    match ctx.u32(index)? {
        0 => Err(ctx.bad(index, "dimension must be at least 1")),
        v => Ok(v as usize),
    }
}

/// The product of `dims`, refusing an overflow.
pub(crate) fn size(ctx: &TwinCtx<'_>, dims: &[usize]) -> Result<usize, GpuError> {
    dims.iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d))
        .ok_or_else(|| ctx.fail(format!("dimensions {dims:?} overflow the address space")))
}

fn check_len(ctx: &TwinCtx<'_>, index: usize, got: usize, want: usize) -> Result<(), GpuError> {
    if got == want {
        Ok(())
    } else {
        Err(ctx.bad(
            index,
            format!("buffer holds {got} elements, expected {want}"),
        ))
    }
}

pub(crate) fn bf16_in<'a>(
    ctx: &TwinCtx<'a>,
    index: usize,
    len: usize,
) -> Result<&'a [bf16], GpuError> {
    let s = ctx.bf16s(index)?;
    check_len(ctx, index, s.len(), len)?;
    Ok(s)
}

pub(crate) fn bf16_in_opt<'a>(
    ctx: &TwinCtx<'a>,
    index: usize,
    len: usize,
) -> Result<Option<&'a [bf16]>, GpuError> {
    let s = ctx.bf16s_opt(index)?;
    if let Some(s) = s {
        check_len(ctx, index, s.len(), len)?;
    }
    Ok(s)
}

pub(crate) fn f32_in<'a>(
    ctx: &TwinCtx<'a>,
    index: usize,
    len: usize,
) -> Result<&'a [f32], GpuError> {
    let s = ctx.f32s(index)?;
    check_len(ctx, index, s.len(), len)?;
    Ok(s)
}

pub(crate) fn i32_in<'a>(
    ctx: &TwinCtx<'a>,
    index: usize,
    len: usize,
) -> Result<&'a [i32], GpuError> {
    let s = ctx.i32s(index)?;
    check_len(ctx, index, s.len(), len)?;
    Ok(s)
}

/// A written (or read-written) bf16 buffer.
pub(crate) fn bf16_out<'a>(
    ctx: &TwinCtx<'a>,
    index: usize,
    len: usize,
) -> Result<&'a mut [bf16], GpuError> {
    let s = ctx.bf16s_mut(index)?;
    check_len(ctx, index, s.len(), len)?;
    Ok(s)
}

pub(crate) fn f32_out<'a>(
    ctx: &TwinCtx<'a>,
    index: usize,
    len: usize,
) -> Result<&'a mut [f32], GpuError> {
    let s = ctx.f32s_mut(index)?;
    check_len(ctx, index, s.len(), len)?;
    Ok(s)
}

pub(crate) fn f32_out_opt<'a>(
    ctx: &TwinCtx<'a>,
    index: usize,
    len: usize,
) -> Result<Option<&'a mut [f32]>, GpuError> {
    let s = ctx.f32s_mut_opt(index)?;
    if let Some(s) = &s {
        check_len(ctx, index, s.len(), len)?;
    }
    Ok(s)
}

/// Column-major `[cols][rows]` values of `f(col, values)` (see `columns_into`).
pub(crate) fn columns<T: Copy + Default + Send>(
    rows: usize,
    cols: usize,
    threads: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) -> Vec<T> {
    let mut by_column = vec![T::default(); rows * cols];
    if rows == 0 || cols == 0 {
        return by_column;
    }
    let per_chunk = cols.div_ceil(threads * 4).max(1);
    par_chunks_mut(&mut by_column, per_chunk * rows, threads, |ci, chunk| {
        for (j, values) in chunk.chunks_mut(rows).enumerate() {
            f(ci * per_chunk + j, values);
        }
    });
    by_column
}

/// Copies columns `first_col..first_col + out_cols` of a column-major `[cols][rows]` array
/// into the row-major `out` (`[rows][out_cols]`).
pub(crate) fn scatter<T: Copy>(
    by_column: &[T],
    rows: usize,
    first_col: usize,
    out: &mut [T],
    out_cols: usize,
) {
    for r in 0..rows {
        for c in 0..out_cols {
            out[r * out_cols + c] = by_column[(first_col + c) * rows + r];
        }
    }
}
