//! Kernel launches, and the events that order streams.
//!
//! Kernel arguments become CUDA kernel parameters in order: a buffer its device address (a
//! 64-bit pointer), `Null` a null pointer, `U32` an `unsigned int`, `I32` an `int`, `F32` a
//! `float`.

use std::ffi::c_void;

use cudarc::driver::{result, sys, DriverError};

use super::driver::capture_or_driver;
use super::CudaBackend;
use crate::error::GpuError;
use crate::types::{EventId, KernelArg, KernelId, LaunchConfig, LaunchOrder, StreamId};

/// One parameter's value; `cuLaunchKernel` reads each through a pointer to it.
enum Param {
    Pointer(u64),
    I32(i32),
    U32(u32),
    F32(f32),
}

impl Param {
    fn of(arg: &KernelArg) -> Param {
        match *arg {
            KernelArg::Buffer { ptr, .. } => Param::Pointer(ptr.0),
            KernelArg::Null => Param::Pointer(0),
            KernelArg::I32(value) => Param::I32(value),
            KernelArg::U32(value) => Param::U32(value),
            KernelArg::F32(value) => Param::F32(value),
        }
    }

    /// A pointer to the value, as `kernelParams` holds it.
    fn address(&self) -> *mut c_void {
        match self {
            Param::Pointer(value) => value as *const u64 as *mut c_void,
            Param::I32(value) => value as *const i32 as *mut c_void,
            Param::U32(value) => value as *const u32 as *mut c_void,
            Param::F32(value) => value as *const f32 as *mut c_void,
        }
    }
}

impl CudaBackend {
    pub(super) fn launch_impl(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
        order: LaunchOrder,
    ) -> Result<(), GpuError> {
        let cu_stream = self.stream(stream)?.cu_stream();
        self.modules.allow_shared(kernel, config.shared_bytes)?;
        let kernel = self.modules.get(kernel)?;
        let params: Vec<Param> = args.iter().map(Param::of).collect();
        let mut addresses: Vec<*mut c_void> = params.iter().map(Param::address).collect();
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        let what = || format!("kernel `{}`", kernel.name);
        if order == LaunchOrder::Programmatic {
            return programmatic(kernel.function, config, cu_stream, &mut addresses)
                .map_err(|e| capture_or_driver("cuLaunchKernelEx", &what(), e));
        }
        // SAFETY: `kernel.function` belongs to a loaded module of this context; `addresses`
        // point into `params`, which outlives the call (the driver copies the values before
        // returning). Argument types and count are the caller's contract with the kernel.
        unsafe {
            result::launch_kernel(
                kernel.function,
                (gx, gy, gz),
                (bx, by, bz),
                config.shared_bytes,
                cu_stream,
                &mut addresses,
            )
        }
        .map_err(|e| capture_or_driver("cuLaunchKernel", &what(), e))
    }

    pub(super) fn record_event_impl(
        &mut self,
        event: EventId,
        stream: StreamId,
    ) -> Result<(), GpuError> {
        let target = self.stream(stream)?;
        self.event(event)?.record(target).map_err(|e| {
            capture_or_driver(
                "cuEventRecord",
                &format!("event {} on stream {}", event.0, stream.0),
                e,
            )
        })
    }

    pub(super) fn wait_event_impl(
        &mut self,
        stream: StreamId,
        event: EventId,
    ) -> Result<(), GpuError> {
        let waiter = self.stream(stream)?;
        waiter.wait(self.event(event)?).map_err(|e| {
            capture_or_driver(
                "cuStreamWaitEvent",
                &format!("stream {} on event {}", stream.0, event.0),
                e,
            )
        })
    }
}

/// `cuLaunchKernelEx` with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` = 1: the
/// launch may start while the kernel before it on `stream` drains (under stream capture, a
/// programmatic edge between the two kernel nodes; CUDA 12.3 and later).
fn programmatic(
    function: sys::CUfunction,
    config: &LaunchConfig,
    stream: sys::CUstream,
    addresses: &mut [*mut c_void],
) -> Result<(), DriverError> {
    // SAFETY: a zeroed attribute value is a valid bit pattern of the C union; only the
    // `programmaticStreamSerializationAllowed` member is set and read for this id.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    let mut attribute = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    };
    let [gx, gy, gz] = config.grid;
    let [bx, by, bz] = config.block;
    let launch = sys::CUlaunchConfig {
        gridDimX: gx,
        gridDimY: gy,
        gridDimZ: gz,
        blockDimX: bx,
        blockDimY: by,
        blockDimZ: bz,
        sharedMemBytes: config.shared_bytes,
        hStream: stream,
        attrs: &mut attribute,
        numAttrs: 1,
    };
    // SAFETY: `function` belongs to a loaded module of the current context; `launch` and the
    // attribute it points to live across the call; `addresses` point at the parameter values,
    // which the caller keeps alive across it (the driver copies them before returning);
    // `extra` is null. Argument types and count are the caller's contract with the kernel.
    unsafe {
        sys::cuLaunchKernelEx(
            &launch,
            function,
            addresses.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
}
