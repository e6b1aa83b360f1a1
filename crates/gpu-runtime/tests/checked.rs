//! `Checked<B>` over the CPU backend: each check fires before the call reaches the inner
//! backend, and a correct program gives the bare backend's bytes.

mod common;

use common::backend;
use solder_gpu_runtime::{
    Checked, CpuBackend, DeviceFacts, DevicePtr, EventId, GpuBackend, GpuError, GraphExecId,
    GraphId, KernelArg, KernelId, LaunchConfig, ModuleImage, ReadbackId, StreamId,
};

const S0: StreamId = StreamId(0);

/// Forwards every call to the CPU backend, counting the launches, copies, memsets and frees
/// that reach it (so a test can tell the layer refused a call rather than the backend). It
/// leaves `copy_d2d_async` and `memset_async` to the trait's defaults, as a backend written
/// before them would.
struct Counting {
    inner: CpuBackend,
    forwarded: usize,
}

impl Counting {
    fn count<T>(&mut self, result: Result<T, GpuError>) -> Result<T, GpuError> {
        self.forwarded += 1;
        result
    }
}

impl GpuBackend for Counting {
    fn facts(&self) -> DeviceFacts {
        self.inner.facts()
    }
    fn instance_id(&self) -> u64 {
        self.inner.instance_id()
    }
    fn alloc(&mut self, bytes: usize) -> Result<DevicePtr, GpuError> {
        self.inner.alloc(bytes)
    }
    fn free(&mut self, ptr: DevicePtr) -> Result<(), GpuError> {
        let result = self.inner.free(ptr);
        self.count(result)
    }
    fn copy_h2d(&mut self, dst: DevicePtr, src: &[u8]) -> Result<(), GpuError> {
        let result = self.inner.copy_h2d(dst, src);
        self.count(result)
    }
    fn copy_d2h(&mut self, src: DevicePtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.inner.copy_d2h(src, dst)
    }
    fn copy_d2d(&mut self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<(), GpuError> {
        let result = self.inner.copy_d2d(dst, src, bytes);
        self.count(result)
    }
    // copy_d2d_async and memset_async: the trait's defaults (the synchronous calls).
    fn copy_h2d_async(&mut self, s: StreamId, dst: DevicePtr, src: &[u8]) -> Result<(), GpuError> {
        let result = self.inner.copy_h2d_async(s, dst, src);
        self.count(result)
    }
    fn copy_d2h_async(
        &mut self,
        s: StreamId,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<ReadbackId, GpuError> {
        let result = self.inner.copy_d2h_async(s, src, bytes);
        self.count(result)
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
        let result = self.inner.memset(dst, value, bytes);
        self.count(result)
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
    fn launch(
        &mut self,
        stream: StreamId,
        kernel: KernelId,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> Result<(), GpuError> {
        let result = self.inner.launch(stream, kernel, config, args);
        self.count(result)
    }
    fn create_stream(&mut self) -> Result<StreamId, GpuError> {
        self.inner.create_stream()
    }
    fn create_event(&mut self) -> Result<EventId, GpuError> {
        self.inner.create_event()
    }
    fn destroy_stream(&mut self, stream: StreamId) -> Result<(), GpuError> {
        self.inner.destroy_stream(stream)
    }
    fn destroy_event(&mut self, event: EventId) -> Result<(), GpuError> {
        self.inner.destroy_event(event)
    }
    fn record_event(&mut self, event: EventId, stream: StreamId) -> Result<(), GpuError> {
        self.inner.record_event(event, stream)
    }
    fn wait_event(&mut self, stream: StreamId, event: EventId) -> Result<(), GpuError> {
        self.inner.wait_event(stream, event)
    }
    fn synchronize(&mut self) -> Result<(), GpuError> {
        self.inner.synchronize()
    }
    fn begin_capture(&mut self, stream: StreamId) -> Result<(), GpuError> {
        self.inner.begin_capture(stream)
    }
    fn end_capture(&mut self, stream: StreamId) -> Result<GraphId, GpuError> {
        self.inner.end_capture(stream)
    }
    fn instantiate(&mut self, graph: GraphId) -> Result<GraphExecId, GpuError> {
        self.inner.instantiate(graph)
    }
    fn launch_graph(&mut self, exec: GraphExecId, stream: StreamId) -> Result<(), GpuError> {
        let result = self.inner.launch_graph(exec, stream);
        self.count(result)
    }
    fn destroy_graph(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.inner.destroy_graph(graph)
    }
    fn destroy_graph_exec(&mut self, exec: GraphExecId) -> Result<(), GpuError> {
        self.inner.destroy_graph_exec(exec)
    }
}

fn checked() -> Checked<Counting> {
    Checked::new(Counting {
        inner: backend(),
        forwarded: 0,
    })
}

fn forwarded(gpu: &Checked<Counting>) -> usize {
    gpu.inner().forwarded
}

fn bytes(elements: usize) -> usize {
    elements * 4
}

fn fill_on<G: GpuBackend>(
    gpu: &mut G,
    s: StreamId,
    out: DevicePtr,
    n: usize,
    v: u32,
) -> Result<(), GpuError> {
    let kernel = gpu.kernel("test::fill").unwrap();
    let args = [KernelArg::write(out, bytes(n)), KernelArg::U32(v)];
    gpu.launch(s, kernel, &LaunchConfig::linear(1, 32), &args)
}

fn copy_on<G: GpuBackend>(
    gpu: &mut G,
    s: StreamId,
    src: DevicePtr,
    dst: DevicePtr,
    n: usize,
) -> Result<(), GpuError> {
    let kernel = gpu.kernel("test::copy").unwrap();
    let args = [
        KernelArg::read(src, bytes(n)),
        KernelArg::write(dst, bytes(n)),
    ];
    gpu.launch(s, kernel, &LaunchConfig::linear(1, 32), &args)
}

fn add_on<G: GpuBackend>(
    gpu: &mut G,
    s: StreamId,
    a: DevicePtr,
    b: DevicePtr,
    out: DevicePtr,
    n: usize,
) -> Result<(), GpuError> {
    let kernel = gpu.kernel("test::add").unwrap();
    let args = [
        KernelArg::read(a, bytes(n)),
        KernelArg::read(b, bytes(n)),
        KernelArg::write(out, bytes(n)),
    ];
    gpu.launch(s, kernel, &LaunchConfig::linear(1, 32), &args)
}

fn download<G: GpuBackend>(gpu: &mut G, ptr: DevicePtr, n: usize) -> Vec<f32> {
    let mut raw = vec![0u8; bytes(n)];
    gpu.copy_d2h(ptr, &mut raw).unwrap();
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn a_buffer_past_its_allocation_is_refused_before_the_backend_sees_it() {
    let mut gpu = checked();
    let buf = gpu.alloc(bytes(4)).unwrap();
    let err = fill_on(&mut gpu, S0, buf, 5, 1).unwrap_err();
    match &err {
        GpuError::OutOfRange { what, start, end } => {
            assert_eq!(what, "kernel `test::fill` arg 0");
            assert_eq!((*start, *end), (buf.0, buf.0 + 20));
        }
        other => panic!("expected OutOfRange, got {other}"),
    }
    let err = gpu.copy_h2d(buf.offset(8), &[0; 16]).unwrap_err();
    assert!(matches!(err, GpuError::OutOfRange { ref what, .. } if what == "copy_h2d"));
    let err = gpu.memset(buf, 0, bytes(5)).unwrap_err();
    assert!(matches!(err, GpuError::OutOfRange { ref what, .. } if what == "memset"));
    assert_eq!(forwarded(&gpu), 0);
}

#[test]
fn memory_not_allocated_through_the_layer_is_refused() {
    let mut inner = backend();
    let outside = inner.alloc(bytes(4)).unwrap();
    let mut gpu = Checked::new(Counting {
        inner,
        forwarded: 0,
    });
    // The inner backend would run this launch; the layer does not know the allocation.
    let err = fill_on(&mut gpu, S0, outside, 4, 1).unwrap_err();
    assert!(matches!(err, GpuError::OutOfRange { .. }), "{err}");
    let err = gpu.free(outside).unwrap_err();
    assert!(matches!(err, GpuError::NotAnAllocation { .. }), "{err}");
    assert_eq!(forwarded(&gpu), 0);
}

#[test]
fn a_writable_buffer_overlapping_another_argument_is_refused() {
    let mut gpu = checked();
    let buf = gpu.alloc(bytes(8)).unwrap();
    let err = copy_on(&mut gpu, S0, buf, buf.offset(8), 4).unwrap_err();
    match &err {
        GpuError::Aliasing { kernel, a, b } => {
            assert_eq!(kernel, "test::copy");
            assert_eq!((*a, *b), (1, 0));
        }
        other => panic!("expected Aliasing, got {other}"),
    }
    // Adjacent, not overlapping: fine.
    copy_on(&mut gpu, S0, buf, buf.offset(16), 4).unwrap();
    assert_eq!(forwarded(&gpu), 1);
}

#[test]
fn an_unordered_cross_stream_access_is_a_race_and_is_not_forwarded() {
    let mut gpu = checked();
    let s1 = gpu.create_stream().unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    let out = gpu.alloc(bytes(4)).unwrap();
    fill_on(&mut gpu, s1, buf, 4, 1).unwrap();
    let err = copy_on(&mut gpu, S0, buf, out, 4).unwrap_err();
    match &err {
        GpuError::Race {
            current,
            stream,
            previous,
            previous_stream,
            start,
            end,
        } => {
            assert_eq!(current, "kernel test::copy arg 0");
            assert_eq!(previous, "kernel test::fill arg 0");
            assert_eq!((*stream, *previous_stream), (0, s1.0));
            assert_eq!((*start, *end), (buf.0, buf.0 + 16));
        }
        other => panic!("expected a race, got {other}"),
    }
    let err = gpu.copy_h2d_async(S0, buf, &[0; 4]).unwrap_err();
    assert!(matches!(err, GpuError::Race { ref current, .. } if current == "copy_h2d_async"));
    let err = gpu.copy_d2h_async(S0, buf, 16).unwrap_err();
    assert!(matches!(err, GpuError::Race { ref current, .. } if current == "copy_d2h_async"));
    assert_eq!(forwarded(&gpu), 1);

    // Ordered by an event, the same read passes.
    let event = gpu.create_event().unwrap();
    gpu.record_event(event, s1).unwrap();
    gpu.wait_event(S0, event).unwrap();
    copy_on(&mut gpu, S0, buf, out, 4).unwrap();
    let readback = gpu.copy_d2h_async(S0, buf, 16).unwrap();
    let mut got = [0u8; 16];
    gpu.take_readback(readback, &mut got).unwrap();
    assert_eq!(got, [1.0f32.to_le_bytes(); 4].concat()[..]);
    assert_eq!(download(&mut gpu, out, 4), vec![1.0; 4]);
}

#[test]
fn a_graph_replay_racing_eager_work_is_refused() {
    let mut gpu = checked();
    let s1 = gpu.create_stream().unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    gpu.begin_capture(s1).unwrap();
    fill_on(&mut gpu, s1, buf, 4, 3).unwrap();
    let graph = gpu.end_capture(s1).unwrap();
    let exec = gpu.instantiate(graph).unwrap();
    fill_on(&mut gpu, S0, buf, 4, 4).unwrap();
    let before = forwarded(&gpu);
    let err = gpu.launch_graph(exec, s1).unwrap_err();
    assert!(
        matches!(err, GpuError::Race { stream, .. } if stream == s1.0),
        "{err}"
    );
    assert_eq!(forwarded(&gpu), before);
}

#[test]
fn memory_a_live_graph_captured_cannot_be_freed() {
    let mut gpu = checked();
    let buf = gpu.alloc(bytes(4)).unwrap();
    gpu.begin_capture(S0).unwrap();
    fill_on(&mut gpu, S0, buf, 4, 7).unwrap();
    let during = gpu.free(buf).unwrap_err();
    assert!(
        matches!(during, GpuError::CapturedByLiveGraph { .. }),
        "{during}"
    );
    let graph = gpu.end_capture(S0).unwrap();
    let exec = gpu.instantiate(graph).unwrap();
    gpu.destroy_graph(graph).unwrap();
    let before = forwarded(&gpu);
    match gpu.free(buf).unwrap_err() {
        GpuError::CapturedByLiveGraph { ptr } => assert_eq!(ptr, buf.0),
        other => panic!("expected CapturedByLiveGraph, got {other}"),
    }
    assert_eq!(forwarded(&gpu), before);
    gpu.launch_graph(exec, S0).unwrap();
    assert_eq!(download(&mut gpu, buf, 4), vec![7.0; 4]);
    gpu.destroy_graph_exec(exec).unwrap();
    gpu.free(buf).unwrap();
    assert_eq!(gpu.live_allocations(), 0);
    assert_eq!(gpu.inner().inner.live_allocations(), 0);
}

#[test]
fn frees_of_unknown_pointers_are_refused() {
    let mut gpu = checked();
    let buf = gpu.alloc(bytes(4)).unwrap();
    for ptr in [DevicePtr(0x1234), buf.offset(4)] {
        match gpu.free(ptr).unwrap_err() {
            GpuError::NotAnAllocation { call, ptr: at } => assert_eq!((call, at), ("free", ptr.0)),
            other => panic!("expected NotAnAllocation, got {other}"),
        }
    }
    gpu.free(buf).unwrap();
    let twice = gpu.free(buf).unwrap_err();
    assert!(matches!(twice, GpuError::NotAnAllocation { .. }), "{twice}");
    assert_eq!(forwarded(&gpu), 1);
}

/// Two streams joined by events, a captured graph replayed twice, copies and a memset: every
/// result byte.
fn program<G: GpuBackend>(gpu: &mut G) -> Vec<u8> {
    let s1 = gpu.create_stream().unwrap();
    let (forked, joined) = (gpu.create_event().unwrap(), gpu.create_event().unwrap());
    let a = gpu.alloc(bytes(8)).unwrap();
    let b = gpu.alloc(bytes(8)).unwrap();
    let sum = gpu.alloc(bytes(8)).unwrap();
    let raw: Vec<u8> = (0..8u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
    gpu.copy_h2d(a, &raw).unwrap();
    gpu.memset(sum, 0, bytes(8)).unwrap();
    gpu.record_event(forked, S0).unwrap();
    gpu.wait_event(s1, forked).unwrap();
    fill_on(gpu, s1, b, 8, 5).unwrap();
    gpu.record_event(joined, s1).unwrap();
    gpu.wait_event(S0, joined).unwrap();
    add_on(gpu, S0, a, b, sum, 8).unwrap();

    gpu.begin_capture(S0).unwrap();
    gpu.record_event(forked, S0).unwrap();
    gpu.wait_event(s1, forked).unwrap();
    copy_on(gpu, s1, sum, b, 8).unwrap();
    gpu.record_event(joined, s1).unwrap();
    gpu.wait_event(S0, joined).unwrap();
    add_on(gpu, S0, a, b, sum, 8).unwrap();
    let graph = gpu.end_capture(S0).unwrap();
    let exec = gpu.instantiate(graph).unwrap();
    gpu.launch_graph(exec, S0).unwrap();
    gpu.launch_graph(exec, S0).unwrap();
    let mut out = vec![0u8; bytes(8)];
    gpu.copy_d2h(sum, &mut out).unwrap();
    gpu.destroy_graph_exec(exec).unwrap();
    gpu.destroy_graph(graph).unwrap();
    for ptr in [a, b, sum] {
        gpu.free(ptr).unwrap();
    }
    out
}

#[test]
fn a_correct_program_passes_and_gives_the_bare_backends_bytes() {
    let bare = program(&mut backend());
    let mut gpu = Checked::new(backend());
    let checked = program(&mut gpu);
    assert_eq!(checked, bare);
    // sum = a + 5, then twice sum = a + sum.
    let expected: Vec<u8> = (0..8u32)
        .flat_map(|i| (3.0 * i as f32 + 5.0).to_le_bytes())
        .collect();
    assert_eq!(checked, expected);
    assert_eq!(gpu.live_allocations(), 0);
    assert_eq!(gpu.inner().live_allocations(), 0);
}

#[test]
fn a_capture_the_backend_refuses_to_end_still_ends_in_the_layer() {
    let mut gpu = checked();
    let s1 = gpu.create_stream().unwrap();
    let forked = gpu.create_event().unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    gpu.begin_capture(S0).unwrap();
    gpu.record_event(forked, S0).unwrap();
    gpu.wait_event(s1, forked).unwrap();
    fill_on(&mut gpu, s1, buf, 4, 1).unwrap();
    // Stream 1 never joins back: the backend refuses the graph, and the capture is over.
    let err = gpu.end_capture(S0).unwrap_err();
    assert!(matches!(err, GpuError::Capture(_)), "{err}");
    gpu.memset(buf, 0, bytes(4)).unwrap();
    gpu.free(buf).unwrap();
    let unknown = gpu.launch_graph(GraphExecId(0), S0).unwrap_err();
    assert!(
        matches!(unknown, GpuError::UnknownHandle { .. }),
        "{unknown}"
    );
    gpu.destroy_stream(s1).unwrap();
    let gone = fill_on(&mut gpu, s1, buf, 4, 1).unwrap_err();
    assert!(
        matches!(gone, GpuError::UnknownHandle { what: "stream", .. }),
        "{gone}"
    );
}

/// A backend that leaves `copy_d2d_async` and `memset_async` to the trait's defaults runs them
/// as the synchronous `copy_d2d` and `memset`: the bytes land, each call reaching the backend
/// once, ordered after the stream's earlier work.
#[test]
fn the_default_queued_copy_and_memset_are_the_synchronous_calls() {
    let mut gpu = Counting {
        inner: backend(),
        forwarded: 0,
    };
    let (src, dst) = (gpu.alloc(bytes(8)).unwrap(), gpu.alloc(bytes(8)).unwrap());
    fill_on(&mut gpu, S0, src, 8, 7).unwrap();
    let before = gpu.forwarded;
    gpu.copy_d2d_async(S0, dst, src, bytes(8)).unwrap();
    assert_eq!(download(&mut gpu, dst, 8), vec![7.0; 8]);
    gpu.memset_async(S0, src, 0, bytes(8)).unwrap();
    assert_eq!(download(&mut gpu, src, 8), vec![0.0; 8]);
    assert_eq!(gpu.forwarded - before, 2, "one copy_d2d and one memset");
}
