//! [`CudaBackend`]: the [`GpuBackend`] on a CUDA device, through cudarc's driver API with the
//! driver library loaded at run time (so it builds with no CUDA installed).
//!
//! Thin by design: it executes what it is handed and checks nothing the CPU backend checks
//! (ranges, races, frees under live graphs); errors are the driver's, naming the call and,
//! for launches and modules, the kernel or module. Stream 0 is a non-blocking stream the
//! backend creates (never the legacy default stream, so it can be captured). Synchronous
//! copies and memsets wait for every stream of the backend, run on stream 0 and wait for it,
//! so they are ordered with all of its work. `copy_h2d_async` stages the caller's bytes in
//! pinned memory (`staging`); `copy_d2h_async` copies into pinned memory and waits on that
//! copy's event alone (`readback`). Kernels are found by reading the `.entry` lines of each
//! module's PTX (`ptx`).
//!
//! Invariants: no driver call is made before the driver library was found to load
//! (`driver`); the backend's context is bound on the calling thread before every driver call;
//! calls CUDA forbids during stream capture (synchronous copies, memset, alloc, free,
//! synchronize, `copy_h2d_async`, `copy_d2h_async`) are refused with [`GpuError::Capture`] instead of
//! invalidating the capture.

mod driver;
mod graph;
mod launch;
mod memory;
mod module;
mod ptx;
mod readback;
mod staging;

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{result, CudaContext, CudaEvent, CudaStream};

pub use driver::{driver_library_loads, driver_library_names};
pub use module::ModuleOrigin;
pub use ptx::ptx_entries;

use crate::backend::{fresh_instance_id, GpuBackend};
use crate::error::GpuError;
use crate::types::{
    DeviceFacts, DevicePtr, EventId, GraphExecId, GraphId, KernelArg, KernelId, LaunchConfig,
    LaunchOrder, ModuleImage, ReadbackId, StreamId,
};
use driver::{describe, driver, no_driver};

pub struct CudaBackend {
    instance_id: u64,
    facts: DeviceFacts,
    /// Live allocations: base address → bytes.
    allocations: HashMap<u64, usize>,
    staging: staging::Staging,
    readbacks: readback::Readbacks,
    graphs: graph::Graphs,
    modules: module::Modules,
    /// Index = `EventId`; `None` once destroyed (ids are never reused).
    events: Vec<Option<CudaEvent>>,
    /// Index = `StreamId`; stream 0 is created with the backend; `None` once destroyed.
    streams: Vec<Option<Arc<CudaStream>>>,
    /// Dropped last: everything above belongs to it.
    ctx: Arc<CudaContext>,
}

/// Starts (`on`) or stops the profiler's collection (cuProfilerStart/Stop) for the context
/// current on this thread: a backend's, once any call of it has run. Without a profiler
/// attached it does nothing; under `ncu --profile-from-start off` only launches between a
/// start and a stop are profiled.
pub fn set_profiling(on: bool) -> Result<(), GpuError> {
    if !driver_library_loads() {
        return Err(no_driver());
    }
    if on {
        cudarc::driver::profiler_start().map_err(|e| driver("cuProfilerStart", e))
    } else {
        cudarc::driver::profiler_stop().map_err(|e| driver("cuProfilerStop", e))
    }
}

impl CudaBackend {
    /// A backend on device `device_ordinal`, with its stream 0. `GpuError::NoDriver` when the
    /// driver library does not load on this machine.
    pub fn new(device_ordinal: usize) -> Result<CudaBackend, GpuError> {
        if !driver_library_loads() {
            return Err(no_driver());
        }
        result::init().map_err(|e| driver("cuInit", e))?;
        let devices = result::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))?;
        if device_ordinal >= devices.max(0) as usize {
            return Err(GpuError::Driver {
                call: "cuDeviceGet",
                message: format!(
                    "device {device_ordinal} asked for; the driver sees {devices} CUDA device(s)"
                ),
            });
        }
        let ctx = CudaContext::new(device_ordinal)
            .map_err(|e| driver("CudaContext::new (cuDevicePrimaryCtxRetain)", e))?;
        // SAFETY: the backend owns no `CudaSlice`; cross-stream order is the caller's, by events.
        unsafe { ctx.disable_event_tracking() };
        let facts = device_facts(&ctx)?;
        let stream0 = ctx.new_stream().map_err(|e| driver("cuStreamCreate", e))?;
        tracing::debug!(
            device = device_ordinal,
            name = facts.name,
            memory_bytes = facts.memory_bytes,
            "cuda backend ready"
        );
        Ok(CudaBackend {
            instance_id: fresh_instance_id(),
            facts,
            allocations: HashMap::new(),
            staging: staging::Staging::default(),
            readbacks: readback::Readbacks::default(),
            graphs: graph::Graphs::default(),
            modules: module::Modules::default(),
            events: Vec::new(),
            streams: vec![Some(stream0)],
            ctx,
        })
    }

    /// Every loaded module's name and the image it loaded from (cubin or JIT-compiled PTX).
    pub fn module_origins(&self) -> Vec<(String, ModuleOrigin)> {
        self.modules.origins()
    }

    /// Allocations not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.allocations.len()
    }

    /// Bytes of the allocations not yet freed.
    pub fn live_bytes(&self) -> usize {
        self.allocations.values().sum()
    }

    /// Makes the backend's context current on this thread.
    fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(|e| {
            driver(
                "cuCtxSetCurrent (or an error deferred from a destructor)",
                e,
            )
        })
    }

    /// A stream of this backend, its context bound.
    fn stream(&self, stream: StreamId) -> Result<&Arc<CudaStream>, GpuError> {
        let found = self
            .streams
            .get(stream.0 as usize)
            .and_then(Option::as_ref)
            .ok_or(GpuError::UnknownHandle {
                what: "stream",
                id: stream.0,
            })?;
        self.bind()?;
        Ok(found)
    }

    fn event(&self, event: EventId) -> Result<&CudaEvent, GpuError> {
        self.events
            .get(event.0 as usize)
            .and_then(Option::as_ref)
            .ok_or(GpuError::UnknownHandle {
                what: "event",
                id: event.0,
            })
    }

    /// Waits for all work on every stream (refused while a stream captures).
    fn full_sync(&mut self, call: &str) -> Result<(), GpuError> {
        self.graphs.refuse_during_capture(call)?;
        self.bind()?;
        self.wait_streams()?;
        self.staging.all_completed();
        self.readbacks.all_completed();
        Ok(())
    }

    /// Waits for every stream of this backend. Not `cuCtxSynchronize`: the primary context
    /// may be shared with other backends, whose captures a context-wide wait would break.
    fn wait_streams(&self) -> Result<(), GpuError> {
        let live = self.streams.iter().enumerate();
        for (index, stream) in live.filter_map(|(i, s)| s.as_ref().map(|s| (i, s))) {
            stream.synchronize().map_err(|e| GpuError::Driver {
                call: "cuStreamSynchronize",
                message: format!("stream {index}: {}", describe(e)),
            })?;
        }
        Ok(())
    }
}

fn device_facts(ctx: &Arc<CudaContext>) -> Result<DeviceFacts, GpuError> {
    let name = ctx.name().map_err(|e| driver("cuDeviceGetName", e))?;
    let memory_bytes = ctx.total_mem().map_err(|e| driver("cuDeviceTotalMem", e))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(|e| driver("cuDeviceGetAttribute (compute capability)", e))?;
    let multiprocessors = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| driver("cuDeviceGetAttribute (multiprocessor count)", e))?;
    Ok(DeviceFacts {
        backend: "cuda",
        name,
        memory_bytes: memory_bytes as u64,
        compute_capability: Some((major.max(0) as u32, minor.max(0) as u32)),
        multiprocessors: multiprocessors.max(0) as u32,
        // No twins run on the host.
        host_threads: 0,
    })
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        if let Err(error) = self.bind() {
            tracing::warn!(%error, "cuda backend drop: cannot bind the context");
            return;
        }
        // A capture left open would keep its streams busy: end it and drop its graph.
        for origin in std::mem::take(&mut self.graphs.capturing) {
            let Some(Some(stream)) = self.streams.get(origin.0 as usize) else {
                continue;
            };
            let cu_stream = stream.cu_stream();
            // SAFETY: a live stream of this context that was capturing.
            if let Ok(graph) = unsafe { result::stream::end_capture(cu_stream) } {
                if !graph.is_null() {
                    // SAFETY: just returned by the driver, destroyed once.
                    let _ = unsafe { result::graph::destroy(graph) };
                }
            }
        }
        if let Err(error) = self.wait_streams() {
            tracing::warn!(%error, "cuda backend drop");
        }
        self.staging.free_all();
        self.readbacks.free_all();
        self.graphs.destroy_all();
        for (base, _) in self.allocations.drain() {
            // SAFETY: allocated by `alloc`, not freed yet; all work on it has completed.
            if let Err(error) = unsafe { result::free_sync(base) } {
                tracing::warn!(error = %describe(error), "cuda backend drop: cuMemFree");
            }
        }
        self.modules.unload_all();
        // Events, then streams, then the context drop with their fields (cudarc).
    }
}

impl GpuBackend for CudaBackend {
    fn facts(&self) -> DeviceFacts {
        self.facts.clone()
    }

    fn instance_id(&self) -> u64 {
        self.instance_id
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr, GpuError> {
        self.alloc_impl(bytes)
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        self.free_impl(ptr)
    }

    fn copy_h2d(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), GpuError> {
        self.copy_h2d_impl(dst, src)
    }

    fn copy_d2h(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.copy_d2h_impl(src, dst)
    }

    fn copy_d2d(&mut self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), GpuError> {
        self.copy_d2d_impl(dst, src, bytes)
    }

    fn copy_d2d_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.copy_d2d_async_impl(stream, dst, src, bytes)
    }

    fn memset_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.memset_async_impl(stream, dst, value, bytes)
    }

    fn copy_h2d_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: &[u8],
    ) -> Result<(), GpuError> {
        self.copy_h2d_async_impl(stream, dst, src)
    }

    fn copy_d2h_async(
        &mut self,
        stream: StreamId,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<ReadbackId, GpuError> {
        // A captured copy would write host memory at every replay: graphs hold launches only.
        self.graphs.refuse_during_capture("copy_d2h_async")?;
        let target = self.stream(stream)?.clone();
        self.readbacks.copy(&self.ctx, &target, src.0, bytes)
    }

    fn readback_ready(&mut self, readback: ReadbackId) -> Result<bool, GpuError> {
        self.bind()?;
        self.readbacks.ready(readback)
    }

    fn take_readback(&mut self, readback: ReadbackId, dst: &mut [u8]) -> Result<(), GpuError> {
        self.bind()?;
        self.readbacks.take(readback, dst)
    }

    fn release_readback(&mut self, readback: ReadbackId) -> Result<(), GpuError> {
        self.bind()?;
        self.readbacks.release(readback)
    }

    fn memset(&mut self, dst: DevicePtr, value: u8, bytes: usize) -> Result<(), GpuError> {
        self.memset_impl(dst, value, bytes)
    }

    fn load_module(&mut self, module: &ModuleImage<'_>) -> Result<(), GpuError> {
        self.bind()?;
        self.modules.load(module)
    }

    fn kernel(&self, name: &str) -> Result<KernelId, GpuError> {
        self.modules.kernel(name)
    }

    fn kernel_names(&self) -> Vec<String> {
        self.modules.names()
    }

    fn free_memory(&self) -> Option<usize> {
        match self.ctx.mem_get_info() {
            Ok((free, _total)) => Some(free),
            Err(e) => {
                tracing::warn!("cuMemGetInfo failed: {e}; free memory unknown");
                None
            }
        }
    }

    fn launch(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        self.launch_impl(stream, kernel, config, args, LaunchOrder::Serial)
    }

    fn launch_ordered(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
        order: LaunchOrder,
    ) -> Result<(), GpuError> {
        self.launch_impl(stream, kernel, config, args, order)
    }

    fn create_stream(&mut self) -> Result<StreamId, GpuError> {
        self.bind()?;
        let stream = self
            .ctx
            .new_stream()
            .map_err(|e| driver("cuStreamCreate", e))?;
        self.streams.push(Some(stream));
        Ok(StreamId(self.streams.len() as u32 - 1))
    }

    fn create_event(&mut self) -> Result<EventId, GpuError> {
        self.bind()?;
        // `None`: CU_EVENT_DISABLE_TIMING, the cheapest event, all ordering needs.
        let event = self
            .ctx
            .new_event(None)
            .map_err(|e| driver("cuEventCreate", e))?;
        self.events.push(Some(event));
        Ok(EventId(self.events.len() as u32 - 1))
    }

    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), GpuError> {
        self.stream(stream)?;
        if stream.0 == 0 {
            return Err(GpuError::UnknownHandle {
                what: "destroyable stream (stream 0 lives as long as the backend)",
                id: stream.0,
            });
        }
        if self.graphs.capturing.contains(&stream) {
            return Err(GpuError::Capture(format!(
                "destroy_stream of stream {} while it is capturing",
                stream.0
            )));
        }
        // cudarc's drop calls cuStreamDestroy; submitted work still completes.
        self.streams[stream.0 as usize] = None;
        Ok(())
    }

    fn destroy_event(&mut self, event: EventId) -> Result<(), GpuError> {
        self.event(event)?;
        self.bind()?;
        // cudarc's drop calls cuEventDestroy.
        self.events[event.0 as usize] = None;
        Ok(())
    }

    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), GpuError> {
        self.record_event_impl(event, stream)
    }

    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), GpuError> {
        self.wait_event_impl(stream, event)
    }

    fn synchronize(&mut self) -> Result<(), GpuError> {
        self.full_sync("synchronize")
    }

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), GpuError> {
        self.begin_capture_impl(stream)
    }

    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, GpuError> {
        self.end_capture_impl(stream)
    }

    fn instantiate(&mut self, graph: GraphId) -> Result<GraphExecId, GpuError> {
        self.instantiate_impl(graph)
    }

    fn launch_graph(&mut self, exec: GraphExecId, stream: StreamId) -> Result<(), GpuError> {
        self.launch_graph_impl(exec, stream)
    }

    fn destroy_graph(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.destroy_graph_impl(graph)
    }

    fn destroy_graph_exec(&mut self, exec: GraphExecId) -> Result<(), GpuError> {
        self.destroy_graph_exec_impl(exec)
    }
}
