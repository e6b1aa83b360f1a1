//! [`CpuBackend`]: the reference executor and the checker.
//!
//! Everything runs on the host at submission time, in submission order; streams and events
//! only feed the checks. Every kernel is a twin registered under its `module::func` name
//! (`registry`). Memory lives in a virtual address space with poisoned fresh bytes and gaps
//! between allocations (`memory`). Every launch's buffers must lie inside one live allocation
//! and no writable buffer may overlap another (`launch`). A happens-before tracker refuses
//! unordered cross-stream accesses to overlapping bytes (`hb`). Graph capture records and
//! replays through the same checks (`graph`).
//!
//! A test hook ([`fail_call`](CpuBackend::fail_call)) makes the n-th next call of a given name fail
//! before it does anything, so callers' recovery from a device failure can be tested.
//!
//! Invariant: a refused operation has no effect on memory; a twin only runs after every
//! check of its launch passed.

pub mod emu;
mod graph;
pub(crate) mod hb;
mod launch;
mod memory;
mod registry;

use std::collections::{BTreeMap, BTreeSet};
use std::ptr;

use graph::{Event, GraphState};
use hb::{Label, Touch};
use memory::Memory;
use registry::Registry;

use crate::backend::{fresh_instance_id, GpuBackend};
use crate::error::GpuError;
use crate::twin::TwinFn;
use crate::types::{
    DeviceFacts, DevicePtr, EventId, GraphExecId, GraphId, KernelArg, KernelId, LaunchConfig,
    LaunchOrder, ModuleImage, ReadbackId, StreamId,
};

pub use memory::POISON;

/// Most host threads `CpuBackend::new` hands its twins.
pub const MAX_HOST_THREADS: usize = 16;

pub struct CpuBackend {
    instance_id: u64,
    threads: usize,
    memory: Memory,
    registry: Registry,
    tracker: hb::Tracker,
    graphs: GraphState,
    /// Streams and events destroyed (their ids are never reused).
    destroyed_streams: BTreeSet<u32>,
    destroyed_events: BTreeSet<u32>,
    /// The failure `fail_call` armed.
    injected: Option<InjectedFailure>,
    /// Launches accepted with `LaunchOrder::Programmatic` (`programmatic_launches`).
    programmatic_launches: u64,
    /// With an emulation, launches run the host-compiled CUDA kernels (`emu`).
    emulation: Option<emu::Emulation>,
    /// `copy_d2h_async`'s bytes (copied at submission, as every operation runs then), by
    /// readback id, until taken or released.
    readbacks: BTreeMap<u32, Vec<u8>>,
    /// Readback ids handed out.
    next_readback: u32,
}

/// A failure armed by `CpuBackend::fail_call`: the call named `call` fails once `skip` more
/// of them have succeeded.
#[derive(Debug, Clone, Copy)]
struct InjectedFailure {
    call: &'static str,
    skip: usize,
}

impl Default for CpuBackend {
    fn default() -> Self {
        CpuBackend::new()
    }
}

impl CpuBackend {
    /// A backend whose twins may use every available host thread (at most 16).
    pub fn new() -> CpuBackend {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        CpuBackend::with_threads(threads.min(MAX_HOST_THREADS))
    }

    pub fn with_threads(threads: usize) -> CpuBackend {
        CpuBackend {
            instance_id: fresh_instance_id(),
            threads: threads.max(1),
            memory: Memory::new(),
            registry: Registry::default(),
            tracker: hb::Tracker::new(),
            graphs: GraphState::new(),
            destroyed_streams: BTreeSet::new(),
            destroyed_events: BTreeSet::new(),
            injected: None,
            programmatic_launches: 0,
            emulation: None,
            readbacks: BTreeMap::new(),
            next_readback: 0,
        }
    }

    /// Runs launches through the host emulation of the CUDA kernels from now on (`None`:
    /// the twins again). Every check of a launch still comes first.
    pub fn set_emulation(&mut self, emulation: Option<emu::Emulation>) {
        self.emulation = emulation;
    }

    /// The emulation launches run through, if any (its shadow-mode report).
    pub fn emulation(&self) -> Option<&emu::Emulation> {
        self.emulation.as_ref()
    }

    /// Registers the twin of kernel `name` (`module::func`); it becomes a kernel once its
    /// module is loaded.
    pub fn register_twin(&mut self, name: &str, f: TwinFn) -> Result<(), GpuError> {
        self.registry.register(name, f)
    }

    /// Registers several twins, stopping at the first refused.
    pub fn register_twins(&mut self, twins: &[(&str, TwinFn)]) -> Result<(), GpuError> {
        twins
            .iter()
            .try_for_each(|(name, f)| self.register_twin(name, *f))
    }

    /// Host threads the twins may use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Launches accepted with `LaunchOrder::Programmatic`, eagerly or into a capture (not
    /// counted again when a graph replays). They run as serial launches: a programmatic
    /// launch's kernel waits for its predecessor, so serial order gives its results.
    pub fn programmatic_launches(&self) -> u64 {
        self.programmatic_launches
    }

    /// Allocations not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.memory.live_allocations()
    }

    /// Bytes of the allocations not yet freed.
    pub fn live_bytes(&self) -> usize {
        self.memory.live_bytes()
    }

    /// Streams alive, stream 0 included.
    pub fn live_streams(&self) -> usize {
        self.tracker.streams() - self.destroyed_streams.len()
    }

    /// Graphs and graph execs created and not destroyed.
    pub fn live_graphs(&self) -> (usize, usize) {
        self.graphs.live()
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> usize {
        self.graphs.events.len() - self.destroyed_events.len()
    }

    /// Test hook: the call named `call` (`alloc`, `copy_h2d`, `copy_d2h`, `copy_d2d`,
    /// `copy_d2d_async`, `copy_d2h_async`, `memset`, `memset_async`, `launch`, `create_stream`, `create_event`, `begin_capture`, `instantiate` or
    /// `launch_graph`) fails with a `Driver` error, having done nothing, once `skip` more of
    /// them have succeeded. `graph_node` names each launch a graph replays: one failing stops
    /// the replay there, the nodes before it having run (a kernel fault part-way through a
    /// graph). One failure at a time: a
    /// new call replaces one armed before; it disarms once it fired.
    pub fn fail_call(&mut self, call: &'static str, skip: usize) {
        self.injected = Some(InjectedFailure { call, skip });
    }

    /// Fails `call` if the armed failure is due.
    pub(super) fn injected(&mut self, call: &'static str) -> Result<(), GpuError> {
        match &mut self.injected {
            Some(armed) if armed.call == call => {
                if armed.skip == 0 {
                    self.injected = None;
                    return Err(GpuError::Driver {
                        call,
                        message: "failure injected by CpuBackend::fail_call".into(),
                    });
                }
                armed.skip -= 1;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Accesses the race tracker still holds (zero while only one stream exists).
    pub fn pending_accesses(&self) -> usize {
        self.tracker.pending()
    }

    fn check_stream(&self, stream: StreamId) -> Result<(), GpuError> {
        if (stream.0 as usize) < self.tracker.streams()
            && !self.destroyed_streams.contains(&stream.0)
        {
            Ok(())
        } else {
            Err(GpuError::UnknownHandle {
                what: "stream",
                id: stream.0,
            })
        }
    }

    fn check_event(&self, event: EventId) -> Result<(), GpuError> {
        if (event.0 as usize) < self.graphs.events.len()
            && !self.destroyed_events.contains(&event.0)
        {
            Ok(())
        } else {
            Err(GpuError::UnknownHandle {
                what: "event",
                id: event.0,
            })
        }
    }

    /// Readbacks queued and not yet taken or released.
    pub fn live_readbacks(&self) -> usize {
        self.readbacks.len()
    }

    /// The bytes of a readback not yet ended, ending it.
    fn readback(&mut self, readback: ReadbackId) -> Result<Vec<u8>, GpuError> {
        self.readbacks
            .remove(&readback.0)
            .ok_or(GpuError::UnknownHandle {
                what: "readback",
                id: readback.0,
            })
    }

    /// Waits for all work (a no-op here: it already ran) so nothing recorded can race.
    fn full_sync(&mut self, call: &str) -> Result<(), GpuError> {
        self.graphs.refuse_during_capture(call)?;
        self.tracker.clear();
        Ok(())
    }
}

fn total_host_memory() -> u64 {
    let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") else {
        return 0;
    };
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

impl GpuBackend for CpuBackend {
    fn facts(&self) -> DeviceFacts {
        DeviceFacts {
            backend: "cpu",
            name: format!("host ({} threads)", self.threads),
            memory_bytes: total_host_memory(),
            compute_capability: None,
            multiprocessors: 0,
            host_threads: self.threads,
        }
    }

    fn instance_id(&self) -> u64 {
        self.instance_id
    }

    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr, GpuError> {
        self.injected("alloc")?;
        self.memory.alloc(bytes)
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        self.graphs.refuse_free(ptr.0)?;
        self.memory.free(ptr)?;
        self.tracker.forget_allocation(ptr.0);
        Ok(())
    }

    fn copy_h2d(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), GpuError> {
        self.injected("copy_h2d")?;
        self.full_sync("copy_h2d")?;
        let to = self.memory.host_range("copy_h2d", dst, src.len())?;
        // SAFETY: `to..to + len` lies inside a live allocation; `src` is a distinct host slice.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), to, src.len()) };
        Ok(())
    }

    fn copy_d2h(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.injected("copy_d2h")?;
        self.full_sync("copy_d2h")?;
        let from = self.memory.host_range("copy_d2h", src, dst.len())?;
        // SAFETY: `from..from + len` lies inside a live allocation; `dst` is a distinct slice.
        unsafe { ptr::copy_nonoverlapping(from, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn copy_d2d(&mut self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), GpuError> {
        self.injected("copy_d2d")?;
        self.full_sync("copy_d2d")?;
        let from = self.memory.host_range("copy_d2d (source)", src, bytes)?;
        let to = self
            .memory
            .host_range("copy_d2d (destination)", dst, bytes)?;
        // SAFETY: both ranges lie inside live allocations; `copy` allows them to overlap.
        unsafe { ptr::copy(from, to, bytes) };
        Ok(())
    }

    fn copy_d2d_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.injected("copy_d2d_async")?;
        self.check_stream(stream)?;
        self.graphs
            .refuse_copy_while_capturing("copy_d2d_async", stream)?;
        let (from_end, to_end) = (src.0 + bytes as u64, dst.0 + bytes as u64);
        if bytes > 0 && src.0 < to_end && dst.0 < from_end {
            return Err(GpuError::OutOfRange {
                what: "copy_d2d_async (overlapping source and destination)".into(),
                start: dst.0,
                end: to_end,
            });
        }
        let source = self.memory.range("copy_d2d_async (source)", src, bytes)?;
        let destination = self
            .memory
            .range("copy_d2d_async (destination)", dst, bytes)?;
        let touches = [
            Touch {
                alloc: source.base,
                start: src.0,
                end: from_end,
                write: false,
                label: Label::Call("copy_d2d_async"),
            },
            Touch {
                alloc: destination.base,
                start: dst.0,
                end: to_end,
                write: true,
                label: Label::Call("copy_d2d_async"),
            },
        ];
        self.track(stream, &touches)?;
        let from = self
            .memory
            .host_range("copy_d2d_async (source)", src, bytes)?;
        let to = (self.memory).host_range("copy_d2d_async (destination)", dst, bytes)?;
        // SAFETY: both ranges lie inside live allocations and do not overlap (checked above).
        unsafe { ptr::copy_nonoverlapping(from, to, bytes) };
        Ok(())
    }

    fn memset_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
    ) -> Result<(), GpuError> {
        self.injected("memset_async")?;
        self.check_stream(stream)?;
        self.graphs
            .refuse_copy_while_capturing("memset_async", stream)?;
        let allocation = self.memory.range("memset_async", dst, bytes)?;
        let touch = Touch {
            alloc: allocation.base,
            start: dst.0,
            end: dst.0 + bytes as u64,
            write: true,
            label: Label::Call("memset_async"),
        };
        self.track(stream, &[touch])?;
        let to = self.memory.host_range("memset_async", dst, bytes)?;
        // SAFETY: `to..to + bytes` lies inside a live allocation (checked above).
        unsafe { to.write_bytes(value, bytes) };
        Ok(())
    }

    fn copy_h2d_async(
        &mut self,
        stream: StreamId,
        dst: DevicePtr,
        src: &[u8],
    ) -> Result<(), GpuError> {
        self.check_stream(stream)?;
        self.graphs
            .refuse_copy_while_capturing("copy_h2d_async", stream)?;
        let allocation = self.memory.range("copy_h2d_async", dst, src.len())?;
        let touch = Touch {
            alloc: allocation.base,
            start: dst.0,
            end: dst.0 + src.len() as u64,
            write: true,
            label: Label::Call("copy_h2d_async"),
        };
        self.track(stream, &[touch])?;
        let to = self.memory.host_range("copy_h2d_async", dst, src.len())?;
        // SAFETY: checked above to lie inside a live allocation.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), to, src.len()) };
        Ok(())
    }

    fn copy_d2h_async(
        &mut self,
        stream: StreamId,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<ReadbackId, GpuError> {
        self.injected("copy_d2h_async")?;
        self.check_stream(stream)?;
        self.graphs
            .refuse_copy_while_capturing("copy_d2h_async", stream)?;
        let allocation = self.memory.range("copy_d2h_async", src, bytes)?;
        let touch = Touch {
            alloc: allocation.base,
            start: src.0,
            end: src.0 + bytes as u64,
            write: false,
            label: Label::Call("copy_d2h_async"),
        };
        self.track(stream, &[touch])?;
        let from = self.memory.host_range("copy_d2h_async", src, bytes)?;
        let mut copy = vec![0u8; bytes];
        // SAFETY: checked above to lie inside a live allocation; `copy` is a distinct buffer.
        unsafe { ptr::copy_nonoverlapping(from, copy.as_mut_ptr(), bytes) };
        let id = self.next_readback;
        self.next_readback = id.checked_add(1).ok_or(GpuError::Driver {
            call: "copy_d2h_async",
            message: "readback ids exhausted".into(),
        })?;
        self.readbacks.insert(id, copy);
        Ok(ReadbackId(id))
    }

    fn readback_ready(&mut self, readback: ReadbackId) -> Result<bool, GpuError> {
        // Every copy ran at submission.
        match self.readbacks.contains_key(&readback.0) {
            true => Ok(true),
            false => Err(GpuError::UnknownHandle {
                what: "readback",
                id: readback.0,
            }),
        }
    }

    fn take_readback(&mut self, readback: ReadbackId, dst: &mut [u8]) -> Result<(), GpuError> {
        let Some(bytes) = self.readbacks.get(&readback.0) else {
            return Err(GpuError::UnknownHandle {
                what: "readback",
                id: readback.0,
            });
        };
        if bytes.len() != dst.len() {
            return Err(GpuError::ReadbackLength {
                readback: readback.0,
                asked: dst.len(),
                holds: bytes.len(),
            });
        }
        dst.copy_from_slice(&self.readback(readback)?);
        Ok(())
    }

    fn release_readback(&mut self, readback: ReadbackId) -> Result<(), GpuError> {
        self.readback(readback).map(drop)
    }

    fn memset(&mut self, dst: DevicePtr, value: u8, bytes: usize) -> Result<(), GpuError> {
        self.injected("memset")?;
        self.full_sync("memset")?;
        let to = self.memory.host_range("memset", dst, bytes)?;
        // SAFETY: `to..to + bytes` lies inside a live allocation.
        unsafe { to.write_bytes(value, bytes) };
        Ok(())
    }

    fn load_module(&mut self, module: &ModuleImage<'_>) -> Result<(), GpuError> {
        self.registry.load_module(module.name)?;
        tracing::debug!(module = module.name, "cpu module loaded");
        Ok(())
    }

    fn kernel(&self, name: &str) -> Result<KernelId, GpuError> {
        self.registry.kernel(name)
    }

    fn kernel_names(&self) -> Vec<String> {
        self.registry.names()
    }

    fn launch(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        self.injected("launch")?;
        self.check_stream(stream)?;
        let touches = self.check_args(kernel, args)?;
        match self.graphs.capturing(stream) {
            Some(capture) => {
                self.capture_launch(capture, stream, kernel, config, args, &touches);
                Ok(())
            }
            None => self.execute_launch(stream, kernel, config, args, &touches),
        }
    }

    fn launch_ordered(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
        order: LaunchOrder,
    ) -> Result<(), GpuError> {
        self.launch(stream, kernel, config, args)?;
        if order == LaunchOrder::Programmatic {
            self.programmatic_launches += 1;
        }
        Ok(())
    }

    fn create_stream(&mut self) -> Result<StreamId, GpuError> {
        self.injected("create_stream")?;
        let id = self.tracker.add_stream();
        self.graphs.stream_capture.push(None);
        Ok(StreamId(id))
    }

    fn create_event(&mut self) -> Result<EventId, GpuError> {
        self.injected("create_event")?;
        self.graphs.events.push(Event::default());
        Ok(EventId(self.graphs.events.len() as u32 - 1))
    }

    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), GpuError> {
        self.check_stream(stream)?;
        if stream == self.default_stream() {
            return Err(GpuError::UnknownHandle {
                what: "destroyable stream (stream 0 lives as long as the backend)",
                id: stream.0,
            });
        }
        if self.graphs.capturing(stream).is_some() {
            return Err(GpuError::Capture(format!(
                "destroy_stream of stream {} while it is capturing",
                stream.0
            )));
        }
        // Its clock stays in the tracker: work it ran still orders (or races with) later work.
        self.destroyed_streams.insert(stream.0);
        Ok(())
    }

    fn destroy_event(&mut self, event: EventId) -> Result<(), GpuError> {
        self.check_event(event)?;
        self.destroyed_events.insert(event.0);
        Ok(())
    }

    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), GpuError> {
        self.check_event(event)?;
        self.check_stream(stream)?;
        self.record_event_impl(event, stream)
    }

    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), GpuError> {
        self.check_stream(stream)?;
        self.check_event(event)?;
        self.wait_event_impl(stream, event)
    }

    fn synchronize(&mut self) -> Result<(), GpuError> {
        self.full_sync("synchronize")
    }

    fn begin_capture(&mut self, stream: StreamId) -> Result<(), GpuError> {
        self.injected("begin_capture")?;
        self.check_stream(stream)?;
        self.begin_capture_impl(stream)
    }

    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, GpuError> {
        self.check_stream(stream)?;
        self.end_capture_impl(stream)
    }

    fn instantiate(&mut self, graph: GraphId) -> Result<GraphExecId, GpuError> {
        self.injected("instantiate")?;
        self.instantiate_impl(graph)
    }

    fn launch_graph(&mut self, exec: GraphExecId, stream: StreamId) -> Result<(), GpuError> {
        self.injected("launch_graph")?;
        self.check_stream(stream)?;
        self.launch_graph_impl(exec, stream)
    }

    fn destroy_graph(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.destroy_graph_impl(graph)
    }

    fn destroy_graph_exec(&mut self, exec: GraphExecId) -> Result<(), GpuError> {
        self.destroy_graph_exec_impl(exec)
    }
}
