//! [`Checked<B>`](Checked): the CPU backend's checks as a layer over any backend.
//!
//! Every call is forwarded to the inner backend. Before a launch, copy or memset is forwarded, the
//! layer checks what [`CpuBackend`](crate::CpuBackend) checks: every buffer lies inside one live
//! allocation made through this layer ([`memory`]), no writable buffer overlaps another argument
//! ([`launch`]), cross-stream accesses to overlapping bytes are ordered by events (the CPU
//! backend's happens-before tracker, [`cpu::hb`](crate::cpu::hb)), and memory an active capture, a
//! live graph or a live graph exec references cannot be freed ([`graph`]).
//!
//! Invariants: a refused call is not forwarded; the layer's state changes only after the
//! inner backend accepted the call; it never alters what the inner backend returns.

mod graph;
mod launch;
mod memory;

use std::collections::HashMap;

use graph::Graphs;
use memory::Allocations;

use crate::backend::GpuBackend;
use crate::cpu::hb::Tracker;
use crate::error::GpuError;
use crate::types::{
    DeviceFacts, DevicePtr, EventId, GraphExecId, GraphId, KernelArg, KernelId, LaunchConfig,
    LaunchOrder, ModuleImage, ReadbackId, StreamId,
};

/// A backend whose every launch, copy, memset and free is checked before it is forwarded.
pub struct Checked<B: GpuBackend> {
    inner: B,
    memory: Allocations,
    tracker: Tracker,
    /// The tracker lane of each live stream.
    lanes: HashMap<StreamId, u32>,
    /// The stream of each tracker lane (kept after a stream is destroyed).
    lane_streams: Vec<StreamId>,
    graphs: Graphs,
}

impl<B: GpuBackend> Checked<B> {
    /// Wraps `inner`. Memory, streams and events made before wrapping are unknown to the
    /// layer: launches and frees that name them are refused.
    pub fn new(inner: B) -> Checked<B> {
        let default_stream = inner.default_stream();
        Checked {
            inner,
            memory: Allocations::default(),
            tracker: Tracker::new(),
            lanes: HashMap::from([(default_stream, 0)]),
            lane_streams: vec![default_stream],
            graphs: Graphs::default(),
        }
    }

    /// The wrapped backend, read-only (mutating it directly would bypass the checks).
    pub fn inner(&self) -> &B {
        &self.inner
    }

    pub fn into_inner(self) -> B {
        self.inner
    }

    /// Allocations made through the layer and not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.memory.live()
    }

    fn lane(&self, stream: StreamId) -> Result<u32, GpuError> {
        self.lanes
            .get(&stream)
            .copied()
            .ok_or(GpuError::UnknownHandle {
                what: "stream",
                id: stream.0,
            })
    }
}

impl<B: GpuBackend> GpuBackend for Checked<B> {
    fn facts(&self) -> DeviceFacts {
        self.inner.facts()
    }

    fn instance_id(&self) -> u64 {
        self.inner.instance_id()
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr, GpuError> {
        let ptr = self.inner.alloc(bytes)?;
        self.memory.insert(ptr.0, bytes);
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        if !self.memory.is_base(ptr.0) {
            return Err(GpuError::NotAnAllocation {
                call: "free",
                ptr: ptr.0,
            });
        }
        if self.graphs.references(ptr.0) {
            return Err(GpuError::CapturedByLiveGraph { ptr: ptr.0 });
        }
        self.inner.free(ptr)?;
        self.memory.remove(ptr.0);
        self.tracker.forget_allocation(ptr.0);
        Ok(())
    }

    fn copy_h2d(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), GpuError> {
        self.check_sync("copy_h2d", &[(dst, src.len())])?;
        self.inner.copy_h2d(dst, src)?;
        self.tracker.clear();
        Ok(())
    }

    fn copy_d2h(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.check_sync("copy_d2h", &[(src, dst.len())])?;
        self.inner.copy_d2h(src, dst)?;
        self.tracker.clear();
        Ok(())
    }

    fn copy_d2d(&mut self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), GpuError> {
        self.check_sync("copy_d2d (source)", &[(src, bytes)])?;
        self.check_sync("copy_d2d (destination)", &[(dst, bytes)])?;
        self.inner.copy_d2d(dst, src, bytes)?;
        self.tracker.clear();
        Ok(())
    }

    fn copy_d2d_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let lane = self.lane(stream)?;
        self.graphs
            .refuse_copy_while_capturing("copy_d2d_async", stream)?;
        let read = self.call_touch("copy_d2d_async (source)", src, bytes, false)?;
        let write = self.call_touch("copy_d2d_async (destination)", dst, bytes, true)?;
        self.checked_forward(lane, &[read, write], |inner| {
            inner.copy_d2d_async(stream, dst, src, bytes)
        })
    }

    fn memset_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        let lane = self.lane(stream)?;
        self.graphs
            .refuse_copy_while_capturing("memset_async", stream)?;
        let touch = self.call_touch("memset_async", dst, bytes, true)?;
        self.checked_forward(lane, &[touch], |inner| {
            inner.memset_async(stream, dst, value, bytes)
        })
    }

    fn copy_h2d_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: &[u8],
    ) -> Result<(), GpuError> {
        let lane = self.lane(stream)?;
        self.graphs
            .refuse_copy_while_capturing("copy_h2d_async", stream)?;
        let touch = self.call_touch("copy_h2d_async", dst, src.len(), true)?;
        self.checked_forward(lane, &[touch], |inner| {
            inner.copy_h2d_async(stream, dst, src)
        })
    }

    fn copy_d2h_async(
        &mut self,
        stream: StreamId,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<ReadbackId, GpuError> {
        let lane = self.lane(stream)?;
        self.graphs
            .refuse_copy_while_capturing("copy_d2h_async", stream)?;
        let touch = self.call_touch("copy_d2h_async", src, bytes, false)?;
        let mut readback = None;
        self.checked_forward(lane, &[touch], |inner| {
            readback = Some(inner.copy_d2h_async(stream, src, bytes)?);
            Ok(())
        })?;
        Ok(readback.expect("forwarded"))
    }

    fn readback_ready(&mut self, readback: ReadbackId) -> Result<bool, GpuError> {
        self.inner.readback_ready(readback)
    }

    fn take_readback(&mut self, readback: ReadbackId, dst: &mut [u8]) -> Result<(), GpuError> {
        self.inner.take_readback(readback, dst)
    }

    fn release_readback(&mut self, readback: ReadbackId) -> Result<(), GpuError> {
        self.inner.release_readback(readback)
    }

    fn memset(&mut self, dst: DevicePtr, value: u8, bytes: usize) -> Result<(), GpuError> {
        self.check_sync("memset", &[(dst, bytes)])?;
        self.inner.memset(dst, value, bytes)?;
        self.tracker.clear();
        Ok(())
    }

    fn load_module(&mut self, module: &ModuleImage<'_>) -> Result<(), GpuError> {
        self.inner.load_module(module)
    }

    fn kernel(&self, name: &str) -> Result<KernelId, GpuError> {
        self.inner.kernel(name)
    }

    fn kernel_names(&self) -> Vec<String> {
        self.inner.kernel_names()
    }

    fn free_memory(&self) -> Option<usize> {
        self.inner.free_memory()
    }

    fn launch(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        self.launch_ordered(stream, kernel, config, args, LaunchOrder::Serial)
    }

    /// Checked as a serial launch: a programmatic one's kernel waits for its predecessor
    /// (`griddepcontrol.wait`, which `ptx --check` holds every kernel to), so stream order
    /// still orders its accesses.
    fn launch_ordered(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
        order: LaunchOrder,
    ) -> Result<(), GpuError> {
        let lane = self.lane(stream)?;
        let touches = self.check_args(kernel, args)?;
        if let Some(capture) = self.graphs.capturing(stream) {
            self.inner
                .launch_ordered(stream, kernel, config, args, order)?;
            self.graphs.capture_launch(capture, lane, &touches);
            return Ok(());
        }
        self.checked_forward(lane, &touches, |inner| {
            inner.launch_ordered(stream, kernel, config, args, order)
        })
    }

    fn default_stream(&self) -> StreamId {
        self.inner.default_stream()
    }

    fn create_stream(&mut self) -> Result<StreamId, GpuError> {
        let stream = self.inner.create_stream()?;
        let lane = self.tracker.add_stream();
        self.lanes.insert(stream, lane);
        self.lane_streams.push(stream);
        Ok(stream)
    }

    fn create_event(&mut self) -> Result<EventId, GpuError> {
        let event = self.inner.create_event()?;
        self.graphs.add_event(event);
        Ok(event)
    }

    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), GpuError> {
        self.lane(stream)?;
        self.inner.destroy_stream(stream)?;
        // Its lane stays in the tracker: work it ran still orders (or races with) later work.
        self.lanes.remove(&stream);
        Ok(())
    }

    fn destroy_event(&mut self, event: EventId) -> Result<(), GpuError> {
        self.graphs.check_event(event)?;
        self.inner.destroy_event(event)?;
        self.graphs.remove_event(event);
        Ok(())
    }

    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), GpuError> {
        let lane = self.lane(stream)?;
        self.graphs.check_event(event)?;
        self.inner.record_event(event, stream)?;
        let clock = self.tracker.clock(lane).to_vec();
        self.graphs.record(event, stream, lane, clock);
        Ok(())
    }

    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), GpuError> {
        let lane = self.lane(stream)?;
        self.graphs.check_event(event)?;
        self.inner.wait_event(stream, event)?;
        if let Some(clock) = self.graphs.wait(stream, lane, event) {
            self.tracker.merge(lane, &clock);
        }
        Ok(())
    }

    fn synchronize(&mut self) -> Result<(), GpuError> {
        self.inner.synchronize()?;
        self.tracker.clear();
        Ok(())
    }

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), GpuError> {
        let lane = self.lane(stream)?;
        self.inner.begin_capture(stream)?;
        self.graphs.begin(stream, lane);
        Ok(())
    }

    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, GpuError> {
        self.lane(stream)?;
        let result = self.inner.end_capture(stream);
        self.graphs.end(stream, result.as_ref().ok().copied());
        result
    }

    fn instantiate(&mut self, graph: GraphId) -> Result<GraphExecId, GpuError> {
        let body = self.graphs.graph(graph)?;
        let exec = self.inner.instantiate(graph)?;
        self.graphs.add_exec(exec, body);
        Ok(exec)
    }

    fn launch_graph(&mut self, exec: GraphExecId, stream: StreamId) -> Result<(), GpuError> {
        let lane = self.lane(stream)?;
        let body = self.graphs.exec(exec)?;
        if let Some(busy) = self.graphs.capturing(stream) {
            return Err(GpuError::Capture(format!(
                "launch_graph on stream {} while capture {busy} is active (graphs are not nested)",
                stream.0
            )));
        }
        let mut tracker = self.tracker.clone();
        graph::replay(&mut tracker, &body, lane).map_err(|(at, c)| self.race_error(at, c))?;
        self.inner.launch_graph(exec, stream)?;
        self.tracker = tracker;
        Ok(())
    }

    fn destroy_graph(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.graphs.graph(graph)?;
        self.inner.destroy_graph(graph)?;
        self.graphs.remove_graph(graph);
        Ok(())
    }

    fn destroy_graph_exec(&mut self, exec: GraphExecId) -> Result<(), GpuError> {
        self.graphs.exec(exec)?;
        self.inner.destroy_graph_exec(exec)?;
        self.graphs.remove_exec(exec);
        Ok(())
    }
}
