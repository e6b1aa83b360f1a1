//! The CUDA backend on a real device. Every test is `#[ignore]`d with the reason, so `cargo
//! test` lists and counts it as not run; the device bundle's run.sh runs them with
//! `--ignored`, where a driver that does not load fails them.
#![cfg(feature = "cuda")]

use std::sync::{Mutex, MutexGuard};

use solder_gpu_runtime::cuda::driver_library_loads;
use solder_gpu_runtime::{
    CudaBackend, DevicePtr, EventId, GpuBackend, GpuError, KernelArg, KernelId, LaunchConfig,
    ModuleImage, StreamId,
};

const ARITH_PTX: &str = include_str!("cuda_ptx/arith.ptx");
const THREADS: u32 = 256;

/// One device test at a time: they share the device's primary context.
static DEVICE: Mutex<()> = Mutex::new(());

fn device() -> (MutexGuard<'static, ()>, CudaBackend) {
    assert!(
        driver_library_loads(),
        "no CUDA driver loads here: this test needs a device"
    );
    let guard = DEVICE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let backend = CudaBackend::new(0).unwrap_or_else(|e| panic!("CudaBackend::new(0): {e}"));
    (guard, backend)
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn read_f32s(backend: &mut CudaBackend, src: DevicePtr, len: usize) -> Vec<f32> {
    let mut raw = vec![0u8; len * 4];
    backend.copy_d2h(src, &mut raw).expect("copy_d2h");
    raw.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn upload(backend: &mut CudaBackend, values: &[f32]) -> DevicePtr {
    let ptr = backend.alloc(values.len() * 4).expect("alloc");
    backend.copy_h2d(ptr, &f32_bytes(values)).expect("copy_h2d");
    ptr
}

struct Arith {
    add: KernelId,
    axpb: KernelId,
}

fn load_arith(backend: &mut CudaBackend) -> Arith {
    backend
        .load_module(&ModuleImage {
            name: "arith",
            ptx: Some(ARITH_PTX),
            cubin: None,
        })
        .expect("load arith");
    Arith {
        add: backend.kernel("arith::add_f32").expect("add_f32"),
        axpb: backend.kernel("arith::axpb_f32").expect("axpb_f32"),
    }
}

fn grid(n: usize) -> LaunchConfig {
    LaunchConfig::linear((n as u32).div_ceil(THREADS), THREADS)
}

/// `out = a + b` on `stream`.
fn add(
    backend: &mut CudaBackend,
    k: &Arith,
    stream: StreamId,
    [a, b, out]: [DevicePtr; 3],
    n: usize,
) {
    let bytes = n * 4;
    let args = [
        KernelArg::read(a, bytes),
        KernelArg::read(b, bytes),
        KernelArg::write(out, bytes),
        KernelArg::U32(n as u32),
    ];
    backend
        .launch(stream, k.add, &grid(n), &args)
        .expect("launch add_f32");
}

/// `x = x * scale + offset` on `stream`.
fn axpb(
    backend: &mut CudaBackend,
    k: &Arith,
    stream: StreamId,
    x: DevicePtr,
    n: usize,
    scale: f32,
    offset: i32,
) {
    let args = [
        KernelArg::read_write(x, n * 4),
        KernelArg::F32(scale),
        KernelArg::I32(offset),
        KernelArg::U32(n as u32),
    ];
    backend
        .launch(stream, k.axpb, &grid(n), &args)
        .expect("launch axpb_f32");
}

#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn facts_describe_the_device() {
    let (_guard, backend) = device();
    let facts = backend.facts();
    println!("{facts:?}");
    assert_eq!(facts.backend, "cuda");
    assert!(!facts.name.is_empty());
    assert!(facts.memory_bytes > 0);
    assert!(facts.multiprocessors > 0);
    assert!(facts
        .compute_capability
        .is_some_and(|(major, _)| major >= 5));
}

#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn alloc_copy_round_trip() {
    let (_guard, mut backend) = device();
    let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    let a = backend.alloc(bytes.len()).expect("alloc");
    let b = backend.alloc(bytes.len()).expect("alloc");
    assert_eq!(a.0 % 256, 0, "allocations are 256-byte aligned");
    backend.copy_h2d(a, &bytes).expect("copy_h2d");
    let mut back = vec![0u8; bytes.len()];
    backend.copy_d2h(a, &mut back).expect("copy_d2h");
    assert_eq!(back, bytes);

    backend.copy_d2d(b, a, bytes.len()).expect("copy_d2d");
    backend.memset(a.offset(256), 0x5A, 100).expect("memset");
    backend.copy_d2h(b, &mut back).expect("copy_d2h");
    assert_eq!(back, bytes, "d2d copy");
    backend.copy_d2h(a, &mut back).expect("copy_d2h");
    assert!(back[256..356].iter().all(|x| *x == 0x5A));
    assert_eq!(back[..256], bytes[..256]);
    assert_eq!(back[356..], bytes[356..]);

    // The source of an async copy may be reused as soon as the call returns.
    let mut source = vec![0x11u8; 4096];
    backend
        .copy_h2d_async(StreamId(0), b, &source[..1000])
        .expect("copy_h2d_async");
    source.fill(0x22);
    backend
        .copy_h2d_async(StreamId(0), b.offset(512), &source[..8])
        .expect("copy_h2d_async");
    backend.synchronize().expect("synchronize");
    backend.copy_d2h(b, &mut back).expect("copy_d2h");
    assert!(back[..512].iter().all(|x| *x == 0x11));
    assert!(back[512..520].iter().all(|x| *x == 0x22));
    assert!(back[520..].iter().all(|x| *x == 0x11));

    // A readback waits for its own copy only, and holds the bytes of its point in the stream.
    let first = backend
        .copy_d2h_async(StreamId(0), b, 600)
        .expect("copy_d2h_async");
    backend.memset(b, 0x33, 600).expect("memset");
    let second = backend
        .copy_d2h_async(StreamId(0), b.offset(500), 8)
        .expect("copy_d2h_async");
    let released = backend
        .copy_d2h_async(StreamId(0), b, 1000)
        .expect("copy_d2h_async");
    backend
        .release_readback(released)
        .expect("release_readback");
    let mut got = vec![0u8; 600];
    backend
        .take_readback(first, &mut got)
        .expect("take_readback");
    assert!(got[..512].iter().all(|x| *x == 0x11));
    assert!(got[512..520].iter().all(|x| *x == 0x22));
    let mut got = [0u8; 8];
    backend
        .take_readback(second, &mut got)
        .expect("take_readback");
    assert_eq!(got, [0x33; 8]);
    assert!(backend.readback_ready(second).is_err(), "taken once");

    // A queued device copy runs in stream order: after the memset before it, before the one
    // after it.
    backend.memset(a, 0x44, 1000).expect("memset");
    backend
        .copy_d2d_async(StreamId(0), b, a, 600)
        .expect("copy_d2d_async");
    let queued = backend
        .copy_d2h_async(StreamId(0), b, 1000)
        .expect("copy_d2h_async");
    let mut got = vec![0u8; 1000];
    backend
        .take_readback(queued, &mut got)
        .expect("take_readback");
    assert!(got[..600].iter().all(|x| *x == 0x44));
    assert!(got[600..].iter().all(|x| *x == 0x33 || *x == 0x11));

    assert_eq!(backend.live_allocations(), 2);
    backend.free(a).expect("free");
    backend.free(b).expect("free");
    assert_eq!(backend.live_allocations(), 0);
    assert!(matches!(
        backend.free(a),
        Err(GpuError::NotAnAllocation { .. })
    ));
    let empty = backend.alloc(0).expect("a zero-byte allocation");
    backend.free(empty).expect("free");
}

#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn ptx_kernels_launch_with_every_argument_kind() {
    let (_guard, mut backend) = device();
    let k = load_arith(&mut backend);
    assert_eq!(
        backend.kernel_names(),
        ["arith::add_f32", "arith::axpb_f32"]
    );
    assert!(matches!(
        backend.kernel("arith::missing"),
        Err(GpuError::UnknownKernel(_))
    ));
    // Loading it again changes nothing.
    let again = load_arith(&mut backend);
    assert_eq!((again.add, again.axpb), (k.add, k.axpb));

    let n = 1000; // not a multiple of the block: the bound check matters
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| 0.5 * i as f32 + 1.0).collect();
    let (da, db) = (upload(&mut backend, &a), upload(&mut backend, &b));
    let out = backend.alloc(n * 4 + 4).expect("alloc");
    backend.memset(out, 0, n * 4 + 4).expect("memset");
    add(&mut backend, &k, StreamId(0), [da, db, out], n);
    axpb(&mut backend, &k, StreamId(0), out, n, 2.0, -3);
    backend.synchronize().expect("synchronize");
    let got = read_f32s(&mut backend, out, n + 1);
    for i in 0..n {
        assert_eq!(got[i], (a[i] + b[i]) * 2.0 - 3.0, "element {i}");
    }
    assert_eq!(got[n], 0.0, "the kernel wrote past n");

    let bad = ModuleImage {
        name: "broken",
        ptx: Some(".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k(\n{\n"),
        cubin: None,
    };
    match backend.load_module(&bad) {
        Err(GpuError::Driver { call, message }) => {
            println!("{call}: {message}");
            assert_eq!(call, "cuModuleLoadDataEx");
            assert!(message.contains("broken"), "{message}");
        }
        other => panic!("broken PTX loaded: {other:?}"),
    }
}

#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn a_captured_graph_replays_with_the_inputs_of_the_moment() {
    let (_guard, mut backend) = device();
    let k = load_arith(&mut backend);
    let n = 300;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b = vec![1.0f32; n];
    let (da, db) = (upload(&mut backend, &a), upload(&mut backend, &b));
    let out = backend.alloc(n * 4).expect("alloc");
    backend.memset(out, 0, n * 4).expect("memset");

    let s0 = backend.default_stream();
    backend.begin_capture(s0).expect("begin_capture");
    add(&mut backend, &k, s0, [da, db, out], n);
    axpb(&mut backend, &k, s0, out, n, 3.0, 1);
    // Refused, not a broken capture.
    assert!(matches!(
        backend.copy_h2d(da, &f32_bytes(&a)),
        Err(GpuError::Capture(_))
    ));
    assert!(matches!(backend.synchronize(), Err(GpuError::Capture(_))));
    let graph = backend.end_capture(s0).expect("end_capture");
    let exec = backend.instantiate(graph).expect("instantiate");
    backend.synchronize().expect("synchronize");
    assert_eq!(
        read_f32s(&mut backend, out, n),
        vec![0.0; n],
        "captured work ran"
    );

    for round in 0..3 {
        let a_now: Vec<f32> = a.iter().map(|x| x + round as f32 * 10.0).collect();
        backend.copy_h2d(da, &f32_bytes(&a_now)).expect("copy_h2d");
        backend.launch_graph(exec, s0).expect("launch_graph");
        backend.synchronize().expect("synchronize");
        let got = read_f32s(&mut backend, out, n);
        for i in 0..n {
            assert_eq!(
                got[i],
                (a_now[i] + 1.0) * 3.0 + 1.0,
                "round {round}, element {i}"
            );
        }
    }
    backend.destroy_graph_exec(exec).expect("destroy exec");
    backend.destroy_graph(graph).expect("destroy graph");
    assert!(matches!(
        backend.destroy_graph(graph),
        Err(GpuError::UnknownHandle { .. })
    ));
}

/// x = a + b (s0); fork to s1: y = x + b; meanwhile z = a + a (s0); join: w = y + z (s0).
fn fork_join(
    backend: &mut CudaBackend,
    k: &Arith,
    (s0, s1): (StreamId, StreamId),
    (fork, join): (EventId, EventId),
    [a, b, x, y, z, w]: [DevicePtr; 6],
    n: usize,
) {
    add(backend, k, s0, [a, b, x], n);
    backend.record_event(fork, s0).expect("record fork");
    backend.wait_event(s1, fork).expect("wait fork");
    add(backend, k, s1, [x, b, y], n);
    add(backend, k, s0, [a, a, z], n);
    backend.record_event(join, s1).expect("record join");
    backend.wait_event(s0, join).expect("wait join");
    add(backend, k, s0, [y, z, w], n);
}

#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn events_fork_and_join_two_streams_eagerly_and_in_a_graph() {
    let (_guard, mut backend) = device();
    let k = load_arith(&mut backend);
    let n = 1 << 16;
    let a: Vec<f32> = (0..n).map(|i| (i % 97) as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 13) as f32).collect();
    let expected: Vec<f32> = (0..n)
        .map(|i| (a[i] + b[i] + b[i]) + (a[i] + a[i]))
        .collect();
    let (da, db) = (upload(&mut backend, &a), upload(&mut backend, &b));
    let [x, y, z, w] = [0; 4].map(|_| backend.alloc(n * 4).expect("alloc"));
    let s0 = backend.default_stream();
    let s1 = backend.create_stream().expect("create_stream");
    let events = (
        backend.create_event().expect("event"),
        backend.create_event().expect("event"),
    );
    let buffers = [da, db, x, y, z, w];

    fork_join(&mut backend, &k, (s0, s1), events, buffers, n);
    backend.synchronize().expect("synchronize");
    assert_eq!(read_f32s(&mut backend, w, n), expected, "eager");

    backend.memset(w, 0, n * 4).expect("memset");
    backend.begin_capture(s0).expect("begin_capture");
    fork_join(&mut backend, &k, (s0, s1), events, buffers, n);
    let graph = backend.end_capture(s0).expect("end_capture");
    let exec = backend.instantiate(graph).expect("instantiate");
    backend.launch_graph(exec, s0).expect("launch_graph");
    backend.synchronize().expect("synchronize");
    assert_eq!(read_f32s(&mut backend, w, n), expected, "replayed");
    backend.destroy_graph_exec(exec).expect("destroy exec");
    backend.destroy_graph(graph).expect("destroy graph");
}

#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn a_capture_with_an_unjoined_stream_is_refused() {
    let (_guard, mut backend) = device();
    let k = load_arith(&mut backend);
    let n = 256;
    let da = upload(&mut backend, &vec![1.0; n]);
    let out = backend.alloc(n * 4).expect("alloc");
    let s0 = backend.default_stream();
    let s1 = backend.create_stream().expect("create_stream");
    let fork = backend.create_event().expect("event");
    backend.begin_capture(s0).expect("begin_capture");
    add(&mut backend, &k, s0, [da, da, out], n);
    backend.record_event(fork, s0).expect("record");
    backend.wait_event(s1, fork).expect("wait");
    add(&mut backend, &k, s1, [da, da, out], n);
    match backend.end_capture(s0) {
        Err(GpuError::Capture(message)) => println!("{message}"),
        other => panic!("an unjoined capture ended with {other:?}"),
    }
    // Both streams are usable again.
    add(&mut backend, &k, s1, [da, da, out], n);
    add(&mut backend, &k, s0, [da, da, out], n);
    backend
        .synchronize()
        .expect("synchronize after a refused capture");
    assert_eq!(read_f32s(&mut backend, out, n), vec![2.0; n]);
}

/// A cubin the driver refuses (not an ELF image, or an ELF of no use) falls back to the
/// module's PTX, which then runs; the origin says which image loaded.
#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn a_refused_cubin_falls_back_to_the_ptx() {
    use solder_gpu_runtime::cuda::ModuleOrigin;
    let (_guard, mut backend) = device();
    for (name, cubin) in [
        ("arith_text", &b"not a cubin"[..]),
        ("arith_elf", &b"\x7fELF\x02\x01\x01\0 truncated"[..]),
    ] {
        backend
            .load_module(&ModuleImage {
                name,
                ptx: Some(ARITH_PTX),
                cubin: Some(cubin),
            })
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        backend
            .kernel(&format!("{name}::add_f32"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let origins = backend.module_origins();
    assert_eq!(
        origins,
        vec![
            ("arith_text".to_string(), ModuleOrigin::PtxAfterCubinRefused),
            ("arith_elf".to_string(), ModuleOrigin::PtxAfterCubinRefused),
        ]
    );
}

const STAGE_PTX: &str = include_str!("cuda_ptx/stage.ptx");

/// `stage::stage_reverse` over `words` words of dynamic shared memory, one block of `THREADS`,
/// on `stream`.
fn stage_reverse(
    backend: &mut CudaBackend,
    kernel: KernelId,
    stream: StreamId,
    out: DevicePtr,
    words: u32,
) -> Result<(), GpuError> {
    let config = LaunchConfig {
        grid: [1, 1, 1],
        block: [THREADS, 1, 1],
        shared_bytes: words * 4,
    };
    let args = [
        KernelArg::write(out, words as usize * 4),
        KernelArg::U32(words),
    ];
    backend.launch(stream, kernel, &config, &args)
}

/// A launch past the dynamic shared memory a kernel gets without opting in (48 KB a block, static
/// and dynamic together; this kernel has no static) (as gemm's
/// `_large` qk-norm entries take, up to 91 KB a block): the backend opts in, eagerly and
/// first under a stream capture, the block sees the whole array, and a size no block may have
/// is an error naming the kernel, not a failed launch.
#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn dynamic_shared_memory_past_48_kb_is_opted_in() {
    let (_guard, mut backend) = device();
    backend
        .load_module(&ModuleImage {
            name: "stage",
            ptx: Some(STAGE_PTX),
            cubin: None,
        })
        .expect("load stage");
    let kernel = backend
        .kernel("stage::stage_reverse")
        .expect("stage_reverse");
    let s0 = backend.default_stream();
    let read = |backend: &mut CudaBackend, out: DevicePtr, words: u32| {
        let mut raw = vec![0u8; words as usize * 4];
        backend.copy_d2h(out, &mut raw).expect("copy_d2h");
        raw.chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect::<Vec<u32>>()
    };
    let want = |words: u32| {
        (0..words)
            .map(|i| 3 * (words - 1 - i) + 1)
            .collect::<Vec<u32>>()
    };

    // 40 KB needs no opt-in; 80 KB does (the first launch past 48 KB opts in).
    for words in [10 * 1024, 20 * 1024] {
        let out = backend.alloc(words as usize * 4).expect("alloc");
        stage_reverse(&mut backend, kernel, s0, out, words).expect("launch");
        backend.synchronize().expect("synchronize");
        assert_eq!(read(&mut backend, out, words), want(words), "{words} words");
        backend.free(out).expect("free");
    }

    // 96 KB, opted in for the first time inside a capture, then replayed.
    let words = 24 * 1024;
    let out = backend.alloc(words as usize * 4).expect("alloc");
    backend.memset(out, 0, words as usize * 4).expect("memset");
    backend.begin_capture(s0).expect("begin_capture");
    stage_reverse(&mut backend, kernel, s0, out, words).expect("launch under capture");
    let graph = backend.end_capture(s0).expect("end_capture");
    let exec = backend.instantiate(graph).expect("instantiate");
    backend.launch_graph(exec, s0).expect("launch_graph");
    backend.synchronize().expect("synchronize");
    assert_eq!(read(&mut backend, out, words), want(words), "captured");
    backend.destroy_graph_exec(exec).expect("destroy exec");
    backend.destroy_graph(graph).expect("destroy graph");

    // 1 MB: more than any block may have.
    let big = backend.alloc(1 << 20).expect("alloc");
    match stage_reverse(&mut backend, kernel, s0, big, 256 * 1024) {
        Err(GpuError::Driver { call, message }) => {
            println!("{call}: {message}");
            assert_eq!(call, "cuFuncSetAttribute");
            assert!(message.contains("stage::stage_reverse"), "{message}");
            assert!(message.contains("1048576 bytes"), "{message}");
        }
        other => panic!("1 MB of dynamic shared memory: {other:?}"),
    }
    // The refusal left the kernel as it was.
    stage_reverse(&mut backend, kernel, s0, out, words).expect("launch after the refusal");
    backend.synchronize().expect("synchronize");
    assert_eq!(
        read(&mut backend, out, words),
        want(words),
        "after the refusal"
    );
}
