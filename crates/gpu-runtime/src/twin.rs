//! CPU twins: the host implementation of a kernel, registered under its `module::func` name,
//! and [`TwinCtx`], the typed view of a launch's arguments a twin reads and writes through.
//!
//! Invariant (soundness of `TwinCtx`): a backend builds a `TwinCtx` only after checking that
//! every buffer argument lies inside one live allocation, is aligned for its element type's
//! use, and that no writable buffer overlaps any other buffer argument of the launch; each
//! writable argument is handed out mutably at most once.

use half::bf16;

use crate::error::GpuError;
use crate::types::{Access, LaunchConfig};

/// An element type a twin may view a buffer as: every bit pattern is a valid value, so any
/// live, aligned, whole byte range can be read as a slice of it.
pub trait Element: Copy + sealed::Sealed {
    /// The element's name as the kernels' declarations and CUDA sources spell it.
    const NAME: &'static str;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
    impl Sealed for u8 {}
}

impl Element for bf16 {
    const NAME: &'static str = "bf16";
}
impl Element for f32 {
    const NAME: &'static str = "f32";
}
impl Element for i32 {
    const NAME: &'static str = "i32";
}
impl Element for u32 {
    const NAME: &'static str = "u32";
}
/// Bytes: a quantized weight blob (`solder_circuit::format`).
impl Element for u8 {
    const NAME: &'static str = "u8";
}

/// A twin: reads its inputs and writes its outputs through the context.
pub type TwinFn = fn(&TwinCtx<'_>) -> Result<(), GpuError>;

/// An argument resolved to host memory.
#[derive(Debug, Clone, Copy)]
pub enum HostArg {
    Buffer {
        ptr: *mut u8,
        bytes: usize,
        access: Access,
    },
    Null,
    I32(i32),
    U32(u32),
    F32(f32),
}

pub struct TwinCtx<'a> {
    kernel: &'a str,
    config: &'a LaunchConfig,
    args: Vec<HostArg>,
    /// Writable arguments already handed out, by index.
    taken: std::cell::RefCell<Vec<bool>>,
    threads: usize,
    _memory: std::marker::PhantomData<&'a mut [u8]>,
}

impl<'a> TwinCtx<'a> {
    /// # Safety
    /// The caller upholds the module invariant: buffers live for `'a`, inside allocations,
    /// and writable buffers overlap no other buffer argument.
    pub unsafe fn new(
        kernel: &'a str,
        config: &'a LaunchConfig,
        args: Vec<HostArg>,
        threads: usize,
    ) -> TwinCtx<'a> {
        TwinCtx {
            kernel,
            config,
            args,
            taken: std::cell::RefCell::new(Vec::new()),
            threads: threads.max(1),
            _memory: Default::default(),
        }
    }

    pub fn kernel(&self) -> &str {
        self.kernel
    }

    pub fn config(&self) -> &LaunchConfig {
        self.config
    }

    /// Host threads the twin may use (the result must not depend on it).
    pub fn threads(&self) -> usize {
        self.threads
    }

    pub fn arg_count(&self) -> usize {
        self.args.len()
    }

    /// An error about argument `index`, naming the kernel.
    pub fn bad(&self, index: usize, message: impl Into<String>) -> GpuError {
        GpuError::BadArgument {
            kernel: self.kernel.to_string(),
            index,
            message: message.into(),
        }
    }

    /// A failure of the kernel itself (e.g. an out-of-range token id), naming it.
    pub fn fail(&self, message: impl Into<String>) -> GpuError {
        GpuError::Kernel {
            kernel: self.kernel.to_string(),
            message: message.into(),
        }
    }

    fn arg(&self, index: usize) -> Result<HostArg, GpuError> {
        self.args.get(index).copied().ok_or_else(|| {
            self.bad(
                index,
                format!("missing (launch has {} arguments)", self.args.len()),
            )
        })
    }

    pub fn u32(&self, index: usize) -> Result<u32, GpuError> {
        match self.arg(index)? {
            HostArg::U32(v) => Ok(v),
            other => Err(self.bad(index, format!("expected u32, got {other:?}"))),
        }
    }

    pub fn i32(&self, index: usize) -> Result<i32, GpuError> {
        match self.arg(index)? {
            HostArg::I32(v) => Ok(v),
            other => Err(self.bad(index, format!("expected i32, got {other:?}"))),
        }
    }

    pub fn f32(&self, index: usize) -> Result<f32, GpuError> {
        match self.arg(index)? {
            HostArg::F32(v) => Ok(v),
            other => Err(self.bad(index, format!("expected f32, got {other:?}"))),
        }
    }

    pub fn is_null(&self, index: usize) -> Result<bool, GpuError> {
        Ok(matches!(self.arg(index)?, HostArg::Null))
    }

    /// A read-only buffer as `[T]`; `None` when the argument is `Null`.
    pub fn slice_opt<T: Element>(&self, index: usize) -> Result<Option<&'a [T]>, GpuError> {
        match self.arg(index)? {
            HostArg::Null => Ok(None),
            HostArg::Buffer {
                access: Access::Read,
                ptr,
                bytes,
            } => {
                let len = self.check_layout::<T>(index, ptr, bytes)?;
                // SAFETY: module invariant; nothing writes this range during the launch.
                Ok(Some(unsafe {
                    std::slice::from_raw_parts(ptr as *const T, len)
                }))
            }
            HostArg::Buffer { .. } => Err(self.bad(
                index,
                "declared writable; read it through the _mut accessor",
            )),
            other => Err(self.bad(index, format!("expected a buffer, got {other:?}"))),
        }
    }

    /// A writable buffer as `[T]`, once per argument; `None` when the argument is `Null`.
    pub fn slice_mut_opt<T: Element>(&self, index: usize) -> Result<Option<&'a mut [T]>, GpuError> {
        match self.arg(index)? {
            HostArg::Null => Ok(None),
            HostArg::Buffer { access, ptr, bytes } if access.writes() => {
                let len = self.check_layout::<T>(index, ptr, bytes)?;
                let mut taken = self.taken.borrow_mut();
                if taken.len() <= index {
                    taken.resize(index + 1, false);
                }
                if std::mem::replace(&mut taken[index], true) {
                    return Err(self.bad(index, "taken mutably twice"));
                }
                // SAFETY: module invariant (no overlap with any other argument) and the
                // once-only check above.
                Ok(Some(unsafe {
                    std::slice::from_raw_parts_mut(ptr as *mut T, len)
                }))
            }
            HostArg::Buffer { .. } => Err(self.bad(index, "declared read-only but written")),
            other => Err(self.bad(index, format!("expected a buffer, got {other:?}"))),
        }
    }

    fn check_layout<T>(&self, index: usize, ptr: *mut u8, bytes: usize) -> Result<usize, GpuError> {
        let size = std::mem::size_of::<T>();
        if !bytes.is_multiple_of(size) || !(ptr as usize).is_multiple_of(std::mem::align_of::<T>())
        {
            return Err(self.bad(index, format!("{bytes} bytes at {ptr:p} is not a whole, aligned array of {size}-byte elements")));
        }
        Ok(bytes / size)
    }

    fn required<T>(&self, index: usize, v: Option<T>) -> Result<T, GpuError> {
        v.ok_or_else(|| self.bad(index, "required buffer is null"))
    }

    pub fn bf16s(&self, index: usize) -> Result<&'a [bf16], GpuError> {
        let v = self.slice_opt(index)?;
        self.required(index, v)
    }

    pub fn bf16s_opt(&self, index: usize) -> Result<Option<&'a [bf16]>, GpuError> {
        self.slice_opt(index)
    }

    pub fn f32s(&self, index: usize) -> Result<&'a [f32], GpuError> {
        let v = self.slice_opt(index)?;
        self.required(index, v)
    }

    pub fn i32s(&self, index: usize) -> Result<&'a [i32], GpuError> {
        let v = self.slice_opt(index)?;
        self.required(index, v)
    }

    pub fn bf16s_mut(&self, index: usize) -> Result<&'a mut [bf16], GpuError> {
        let v = self.slice_mut_opt(index)?;
        self.required(index, v)
    }

    pub fn bf16s_mut_opt(&self, index: usize) -> Result<Option<&'a mut [bf16]>, GpuError> {
        self.slice_mut_opt(index)
    }

    pub fn f32s_mut(&self, index: usize) -> Result<&'a mut [f32], GpuError> {
        let v = self.slice_mut_opt(index)?;
        self.required(index, v)
    }

    pub fn f32s_mut_opt(&self, index: usize) -> Result<Option<&'a mut [f32]>, GpuError> {
        self.slice_mut_opt(index)
    }

    pub fn i32s_mut(&self, index: usize) -> Result<&'a mut [i32], GpuError> {
        let v = self.slice_mut_opt(index)?;
        self.required(index, v)
    }
}

/// Runs `f(chunk_index, chunk)` over `out` split into chunks of `chunk` elements, on up to
/// `threads` scoped threads. Each element is written by exactly one call, so a twin whose
/// per-element arithmetic is fixed gives the same bytes for any thread count.
pub fn par_chunks_mut<T: Send>(
    out: &mut [T],
    chunk: usize,
    threads: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let chunk = chunk.max(1);
    let chunks = out.len().div_ceil(chunk);
    let threads = threads.clamp(1, chunks.max(1));
    if threads == 1 {
        for (i, c) in out.chunks_mut(chunk).enumerate() {
            f(i, c);
        }
        return;
    }
    let per_thread = chunks.div_ceil(threads);
    std::thread::scope(|scope| {
        for (t, part) in out.chunks_mut(per_thread * chunk).enumerate() {
            let f = &f;
            scope.spawn(move || {
                for (i, c) in part.chunks_mut(chunk).enumerate() {
                    f(t * per_thread + i, c);
                }
            });
        }
    });
}
