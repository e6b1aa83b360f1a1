//! The CPU twin's side of a declaration: typed, named views of a launch's arguments. A view
//! is read once, in declaration order, by `kernel!`'s `read` (kinds and arity checked there);
//! a twin then asks each buffer for the length it expects (`len`) before it writes anything.
//! Errors name the kernel (through `TwinCtx`), the argument's index and its name.

use solder_gpu_runtime::{Element, GpuError, TwinCtx};

/// Multiply-accumulates below which a twin runs on one thread (a spawn costs ~20 µs).
pub(crate) const PAR_MIN_WORK: usize = 1 << 20;

/// Where an argument sits: its launch, index and declared name.
#[derive(Clone, Copy)]
pub struct At<'c> {
    ctx: &'c TwinCtx<'c>,
    index: usize,
    name: &'static str,
}

impl At<'_> {
    /// An error about this argument.
    pub fn bad(&self, message: impl std::fmt::Display) -> GpuError {
        self.ctx
            .bad(self.index, format!("`{}`: {message}", self.name))
    }

    /// A required buffer: present, or an error naming it.
    fn required<T>(&self, data: Option<T>) -> Result<T, GpuError> {
        data.ok_or_else(|| self.bad("required buffer is null"))
    }

    fn check_len(&self, got: usize, want: usize) -> Result<(), GpuError> {
        if got == want {
            Ok(())
        } else {
            Err(self.bad(format!("buffer holds {got} elements, expected {want}")))
        }
    }
}

/// A buffer the kernel reads.
pub struct In<'c, T> {
    pub at: At<'c>,
    data: &'c [T],
}

impl<'c, T: Element> In<'c, T> {
    pub(crate) fn read(
        ctx: &'c TwinCtx<'c>,
        index: usize,
        name: &'static str,
    ) -> Result<Self, GpuError> {
        let at = At { ctx, index, name };
        let data = at.required(ctx.slice_opt::<T>(index)?)?;
        Ok(In { at, data })
    }

    /// The buffer, which must hold exactly `len` elements.
    pub fn len(self, len: usize) -> Result<&'c [T], GpuError> {
        self.at.check_len(self.data.len(), len)?;
        Ok(self.data)
    }
}

/// A buffer the kernel reads when it is present.
pub struct InOpt<'c, T> {
    pub at: At<'c>,
    data: Option<&'c [T]>,
}

impl<'c, T: Element> InOpt<'c, T> {
    pub(crate) fn read(
        ctx: &'c TwinCtx<'c>,
        index: usize,
        name: &'static str,
    ) -> Result<Self, GpuError> {
        let data = ctx.slice_opt::<T>(index)?;
        Ok(InOpt {
            at: At { ctx, index, name },
            data,
        })
    }

    /// The buffer if present, which must then hold exactly `len` elements.
    pub fn len(self, len: usize) -> Result<Option<&'c [T]>, GpuError> {
        if let Some(data) = self.data {
            self.at.check_len(data.len(), len)?;
        }
        Ok(self.data)
    }
}

/// A buffer the kernel writes (or reads and writes).
pub struct Out<'c, T> {
    pub at: At<'c>,
    data: &'c mut [T],
}

impl<'c, T: Element> Out<'c, T> {
    pub(crate) fn read(
        ctx: &'c TwinCtx<'c>,
        index: usize,
        name: &'static str,
    ) -> Result<Self, GpuError> {
        let at = At { ctx, index, name };
        let data = at.required(ctx.slice_mut_opt::<T>(index)?)?;
        Ok(Out { at, data })
    }

    /// The buffer, which must hold exactly `len` elements.
    pub fn len(self, len: usize) -> Result<&'c mut [T], GpuError> {
        self.at.check_len(self.data.len(), len)?;
        Ok(self.data)
    }
}

/// A buffer the kernel writes when it is present.
pub struct OutOpt<'c, T> {
    pub at: At<'c>,
    data: Option<&'c mut [T]>,
}

impl<'c, T: Element> OutOpt<'c, T> {
    pub(crate) fn read(
        ctx: &'c TwinCtx<'c>,
        index: usize,
        name: &'static str,
    ) -> Result<Self, GpuError> {
        let data = ctx.slice_mut_opt::<T>(index)?;
        Ok(OutOpt {
            at: At { ctx, index, name },
            data,
        })
    }

    /// The buffer if present, which must then hold exactly `len` elements.
    pub fn len(self, len: usize) -> Result<Option<&'c mut [T]>, GpuError> {
        if let Some(data) = &self.data {
            self.at.check_len(data.len(), len)?;
        }
        Ok(self.data)
    }
}

/// A `u32` scalar: a count, a dimension or a flag.
#[derive(Clone, Copy)]
pub struct Dim<'c> {
    pub at: At<'c>,
    value: u32,
}

impl<'c> Dim<'c> {
    pub(crate) fn read(
        ctx: &'c TwinCtx<'c>,
        index: usize,
        name: &'static str,
    ) -> Result<Self, GpuError> {
        Ok(Dim {
            value: ctx.u32(index)?,
            at: At { ctx, index, name },
        })
    }

    pub fn get(&self) -> u32 {
        self.value
    }

    /// A count that may be zero (rows: zero rows is an empty launch).
    pub fn count(&self) -> usize {
        self.value as usize
    }

    /// A dimension, which must be at least 1.
    pub fn dim(&self) -> Result<usize, GpuError> {
        match self.value {
            0 => Err(self.at.bad("dimension must be at least 1")),
            v => Ok(v as usize),
        }
    }

    /// An error about this argument.
    pub fn bad(&self, message: impl std::fmt::Display) -> GpuError {
        self.at.bad(message)
    }
}

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

/// The product of `dims`, refusing an overflow.
pub(crate) fn size(ctx: &TwinCtx<'_>, dims: &[usize]) -> Result<usize, GpuError> {
    dims.iter()
        .try_fold(1usize, |acc, d| acc.checked_mul(*d))
        .ok_or_else(|| ctx.fail(format!("dimensions {dims:?} overflow the address space")))
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

/// The `n × k` matrix in blob `w` (stored as `format`), dequantised to bf16 with
/// `numerics::dequant` (the one definition of a quantized weight's value): the twins of the
/// entries that read a quantized weight run their bf16 arithmetic on it.
pub(crate) fn dequantised(
    ctx: &TwinCtx<'_>,
    w: In<'_, u8>,
    format: solder_circuit::WeightFormat,
    n: usize,
    k: usize,
) -> Result<Vec<half::bf16>, GpuError> {
    let layout = format.check(n, k).map_err(|e| w.at.bad(e))?;
    let blob = w.len(layout.bytes)?;
    let mut matrix = vec![half::bf16::ZERO; size(ctx, &[n, k])?];
    crate::numerics::dequant::dequant_matrix(format, blob, (n, k), &mut matrix, ctx.threads());
    Ok(matrix)
}
