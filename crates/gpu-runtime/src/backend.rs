//! The [`GpuBackend`] trait: the whole surface solder needs from a device.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::GpuError;
use crate::types::{
    DeviceFacts, DevicePtr, EventId, GraphExecId, GraphId, KernelArg, KernelId, LaunchConfig,
    LaunchOrder, ModuleImage, ReadbackId, StreamId,
};

/// A device: memory, copies, modules and kernels, launches, streams, events and graphs.
///
/// Stream 0 (`default_stream`) is the model's stream and exists from the start. Work on one
/// stream runs in submission order; across streams only events order it.
pub trait GpuBackend {
    fn facts(&self) -> DeviceFacts;

    /// This backend's identity, unique among the backends of the process
    /// (`fresh_instance_id`): device pointers, streams and events are only meaningful to the
    /// backend whose id they were made under, so an owner of such handles records it.
    fn instance_id(&self) -> u64;

    /// Allocates `bytes` (256-byte aligned). New memory holds no meaningful value (the CPU
    /// backend fills it with a poison pattern: 0xFF, NaN as bf16 and f32).
    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr, GpuError>;
    fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError>;

    /// Synchronous copies (they wait for all work first).
    fn copy_h2d(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), GpuError>;
    fn copy_d2h(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), GpuError>;
    fn copy_d2d(&mut self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), GpuError>;
    /// Copies `bytes` device bytes from `src` to `dst` (ranges that do not overlap), ordered on
    /// `stream` like a launch that reads `src` and writes `dst`; nothing waits (refused while
    /// `stream` captures). The default is the synchronous [`copy_d2d`](Self::copy_d2d), which
    /// waits for all work and so is ordered after `stream`'s too: a backend that does not queue
    /// copies stays correct, and each copy costs the host a wait. Every backend in this tree
    /// queues it.
    fn copy_d2d_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let _ = stream;
        self.copy_d2d(dst, src, bytes)
    }
    /// Sets `bytes` device bytes at `dst` to `value`, ordered on `stream` like a launch that
    /// writes them; nothing waits (refused while `stream` captures). The default is the
    /// synchronous [`memset`](Self::memset), as `copy_d2d_async`'s is.
    fn memset_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let _ = stream;
        self.memset(dst, value, bytes)
    }
    /// Ordered on `stream` like a launch; `src` is copied before the call returns.
    fn copy_h2d_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: &[u8],
    ) -> Result<(), GpuError>;
    /// Queues a copy of `bytes` device bytes at `src` into host memory the backend holds,
    /// ordered on `stream` like a launch that reads them (refused while `stream` captures).
    /// Nothing waits: the bytes are the caller's through `take_readback`, once the copy ran.
    fn copy_d2h_async(
        &mut self,
        stream: StreamId,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<ReadbackId, GpuError>;
    /// Whether `readback`'s copy has completed (never waits).
    fn readback_ready(&mut self, readback: ReadbackId) -> Result<bool, GpuError>;
    /// Waits for `readback`'s copy (that copy and the work before it on its stream, not the
    /// whole device) and moves its bytes into `dst`, whose length must be the copy's. Ends
    /// the readback.
    fn take_readback(&mut self, readback: ReadbackId, dst: &mut [u8]) -> Result<(), GpuError>;
    /// Ends `readback` without its bytes and without waiting: its host memory is reused once
    /// the copy completed.
    fn release_readback(&mut self, readback: ReadbackId) -> Result<(), GpuError>;
    fn memset(&mut self, dst: DevicePtr, value: u8, bytes: usize) -> Result<(), GpuError>;

    /// Loads a module; its kernels become visible to `kernel` and `kernel_names`.
    fn load_module(&mut self, module: &ModuleImage<'_>) -> Result<(), GpuError>;
    /// A kernel by `module::func`.
    fn kernel(&self, name: &str) -> Result<KernelId, GpuError>;
    /// Every kernel of the loaded modules (what the fuser may use).
    fn kernel_names(&self) -> Vec<String>;
    /// Bytes of device memory free now, where the backend can say (a KV pool sized as a
    /// fraction of it); `None` by default and on the CPU backend, whose memory is the host's.
    fn free_memory(&self) -> Option<usize> {
        None
    }
    fn launch(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError>;
    /// `launch` ordered as `order` says. `LaunchOrder::Programmatic` lets the launch overlap
    /// the kernel before it on its stream (a programmatic edge when captured); a backend that
    /// cannot overlap launches runs it as `launch` does (the default), which gives the same
    /// results because a programmatic launch's kernel waits for its predecessor anyway.
    fn launch_ordered(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
        order: LaunchOrder,
    ) -> Result<(), GpuError> {
        // A serial launch is a valid schedule of either order.
        let _ = order;
        self.launch(stream, kernel, config, args)
    }

    fn default_stream(&self) -> StreamId {
        StreamId(0)
    }
    fn create_stream(&mut self) -> Result<StreamId, GpuError>;
    fn create_event(&mut self) -> Result<EventId, GpuError>;
    /// Destroys a stream `create_stream` made (stream 0 lives as long as the backend); work
    /// already submitted to it still completes. Refused while it captures.
    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), GpuError>;
    /// Destroys an event `create_event` made; later records and waits on it are refused.
    fn destroy_event(&mut self, event: EventId) -> Result<(), GpuError>;
    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), GpuError>;
    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), GpuError>;
    /// Waits for all work on all streams.
    fn synchronize(&mut self) -> Result<(), GpuError>;

    /// Starts capturing work submitted to `stream` (and to streams forked from it by events).
    fn begin_capture(&mut self, stream: StreamId) -> Result<(), GpuError>;
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, GpuError>;
    fn instantiate(&mut self, graph: GraphId) -> Result<GraphExecId, GpuError>;
    fn launch_graph(&mut self, exec: GraphExecId, stream: StreamId) -> Result<(), GpuError>;
    fn destroy_graph(&mut self, graph: GraphId) -> Result<(), GpuError>;
    fn destroy_graph_exec(&mut self, exec: GraphExecId) -> Result<(), GpuError>;
}

/// A new backend identity, never handed out before in this process (`instance_id`).
pub fn fresh_instance_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
