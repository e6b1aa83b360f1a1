//! Device memory, copies and memset.
//!
//! Synchronous copies and memset first wait for every stream of the backend, then run on
//! stream 0 and wait for it: stream 0 is non-blocking, so work on the legacy stream (where
//! CUDA's own synchronous copies go) would not be ordered with it.

use std::ffi::c_void;

use cudarc::driver::result;
use cudarc::driver::sys::{self, CUresult};

use super::driver::driver;
use super::CudaBackend;
use crate::error::GpuError;
use crate::types::{DevicePtr, StreamId};

impl CudaBackend {
    pub(super) fn alloc_impl(&mut self, bytes: usize) -> Result<DevicePtr, GpuError> {
        self.graphs.refuse_during_capture("alloc")?;
        self.bind()?;
        // cuMemAlloc refuses 0 bytes; a zero-byte allocation still gets a real pointer, as on
        // the CPU backend. CUDA aligns every allocation to at least 256 bytes.
        // SAFETY: a plain allocation; its bytes are undefined until written.
        let base = unsafe { result::malloc_sync(bytes.max(1)) }.map_err(|error| {
            if error.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                GpuError::OutOfMemory { bytes }
            } else {
                driver("cuMemAlloc", error)
            }
        })?;
        self.allocations.insert(base, bytes);
        Ok(DevicePtr(base))
    }

    pub(super) fn free_impl(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        if !self.allocations.contains_key(&ptr.0) {
            return Err(GpuError::NotAnAllocation {
                call: "free",
                ptr: ptr.0,
            });
        }
        // Wait for work that may still use it: cuMemFree does not promise to.
        self.full_sync("free")?;
        // SAFETY: a live allocation of this backend; no work on it is pending.
        unsafe { result::free_sync(ptr.0) }.map_err(|e| driver("cuMemFree", e))?;
        self.allocations.remove(&ptr.0);
        Ok(())
    }

    pub(super) fn copy_h2d_impl(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), GpuError> {
        self.full_sync("copy_h2d")?;
        let stream0 = self.stream(StreamId(0))?.cu_stream();
        // SAFETY: `src` is borrowed until the stream is synchronised below.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst.0, src.as_ptr().cast(), src.len(), stream0) }
            .result()
            .map_err(|e| driver("cuMemcpyHtoDAsync (copy_h2d)", e))?;
        self.wait_stream0("copy_h2d")
    }

    pub(super) fn copy_d2h_impl(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.full_sync("copy_d2h")?;
        let stream0 = self.stream(StreamId(0))?.cu_stream();
        // SAFETY: `dst` is borrowed mutably until the stream is synchronised below.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast::<c_void>(), src.0, dst.len(), stream0)
        }
        .result()
        .map_err(|e| driver("cuMemcpyDtoHAsync (copy_d2h)", e))?;
        self.wait_stream0("copy_d2h")
    }

    pub(super) fn copy_d2d_impl(
        &mut self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.full_sync("copy_d2d")?;
        let stream0 = self.stream(StreamId(0))?.cu_stream();
        // SAFETY: device addresses only; the driver checks them.
        unsafe { result::memcpy_dtod_async(dst.0, src.0, bytes, stream0) }
            .map_err(|e| driver("cuMemcpyDtoDAsync (copy_d2d)", e))?;
        self.wait_stream0("copy_d2d")
    }

    pub(super) fn memset_impl(
        &mut self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.full_sync("memset")?;
        let stream0 = self.stream(StreamId(0))?.cu_stream();
        // SAFETY: device addresses only; the driver checks them.
        unsafe { result::memset_d8_async(dst.0, value, bytes, stream0) }
            .map_err(|e| driver("cuMemsetD8Async (memset)", e))?;
        self.wait_stream0("memset")
    }

    /// Ordered on `stream`; `src` is staged in pinned memory before the call returns, so the
    /// caller may reuse it at once (`staging`).
    pub(super) fn copy_d2d_async_impl(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        // Graphs hold launches only; a copy between device ranges is ordered on the stream.
        self.graphs.refuse_during_capture("copy_d2d_async")?;
        self.bind()?;
        let target = self.stream(stream)?.cu_stream();
        // SAFETY: device addresses only; the driver checks them.
        unsafe { result::memcpy_dtod_async(dst.0, src.0, bytes, target) }
            .map_err(|e| driver("cuMemcpyDtoDAsync (copy_d2d_async)", e))
    }

    pub(super) fn memset_async_impl(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.graphs.refuse_during_capture("memset_async")?;
        self.bind()?;
        let target = self.stream(stream)?.cu_stream();
        // SAFETY: device addresses only; the driver checks them.
        unsafe { result::memset_d8_async(dst.0, value, bytes, target) }
            .map_err(|e| driver("cuMemsetD8Async (memset_async)", e))
    }

    pub(super) fn copy_h2d_async_impl(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: &[u8],
    ) -> Result<(), GpuError> {
        // A captured copy would read host memory at every replay: graphs hold launches only.
        self.graphs.refuse_during_capture("copy_h2d_async")?;
        let target = self.stream(stream)?.clone();
        self.staging.copy(&self.ctx, &target, dst.0, src)
    }

    fn wait_stream0(&self, call: &'static str) -> Result<(), GpuError> {
        self.stream(StreamId(0))?
            .synchronize()
            .map_err(|e| GpuError::Driver {
                call: "cuStreamSynchronize",
                message: format!("after {call}: {}", super::driver::describe(e)),
            })
    }
}
