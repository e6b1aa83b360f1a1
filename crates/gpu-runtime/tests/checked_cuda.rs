//! `Checked<CudaBackend>` on a real device: a correct two-stream sequence passes with the
//! device's results, and an unordered cross-stream read is refused before it is launched.
//! Every test is `#[ignore]`d with the reason, so `cargo test` lists and counts it as not run;
//! the device bundle's run.sh runs them with `--ignored`, where a driver that does not load
//! fails them.
#![cfg(feature = "cuda")]

use std::sync::{Mutex, MutexGuard};

use solder_gpu_runtime::cuda::driver_library_loads;
use solder_gpu_runtime::{
    Checked, CudaBackend, DevicePtr, GpuBackend, GpuError, KernelArg, LaunchConfig, ModuleImage,
    StreamId,
};

const ARITH_PTX: &str = include_str!("cuda_ptx/arith.ptx");
const N: usize = 1000;

/// One device test at a time: they share the device's primary context.
static DEVICE: Mutex<()> = Mutex::new(());

fn device() -> (MutexGuard<'static, ()>, Checked<CudaBackend>) {
    assert!(
        driver_library_loads(),
        "no CUDA driver loads here: this test needs a device"
    );
    let guard = DEVICE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let backend = CudaBackend::new(0).unwrap_or_else(|e| panic!("CudaBackend::new(0): {e}"));
    let mut gpu = Checked::new(backend);
    gpu.load_module(&ModuleImage {
        name: "arith",
        ptx: Some(ARITH_PTX),
        cubin: None,
    })
    .expect("load arith");
    (guard, gpu)
}

fn upload(gpu: &mut Checked<CudaBackend>, values: &[f32]) -> DevicePtr {
    let ptr = gpu.alloc(values.len() * 4).expect("alloc");
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    gpu.copy_h2d(ptr, &raw).expect("copy_h2d");
    ptr
}

fn download(gpu: &mut Checked<CudaBackend>, ptr: DevicePtr) -> Vec<f32> {
    let mut raw = vec![0u8; N * 4];
    gpu.copy_d2h(ptr, &mut raw).expect("copy_d2h");
    raw.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `out = a + b` on `stream`.
fn add(
    gpu: &mut Checked<CudaBackend>,
    stream: StreamId,
    [a, b, out]: [DevicePtr; 3],
) -> Result<(), GpuError> {
    let kernel = gpu.kernel("arith::add_f32").expect("add_f32");
    let args = [
        KernelArg::read(a, N * 4),
        KernelArg::read(b, N * 4),
        KernelArg::write(out, N * 4),
        KernelArg::U32(N as u32),
    ];
    let config = LaunchConfig::linear((N as u32).div_ceil(256), 256);
    gpu.launch(stream, kernel, &config, &args)
}

#[test]
#[ignore = "needs a CUDA device: the device bundle (cargo xtask gpu-check, run.sh) runs it with --ignored"]
fn checked_cuda_runs_an_ordered_sequence_and_refuses_a_race() {
    let (_guard, mut gpu) = device();
    let s0 = gpu.default_stream();
    let s1 = gpu.create_stream().expect("create_stream");
    let event = gpu.create_event().expect("create_event");
    let a = upload(&mut gpu, &(0..N).map(|i| i as f32).collect::<Vec<_>>());
    let b = upload(&mut gpu, &[1.0; N]);
    let mid = gpu.alloc(N * 4).expect("alloc");
    let out = gpu.alloc(N * 4).expect("alloc");

    add(&mut gpu, s1, [a, b, mid]).expect("add on stream 1");
    // Unordered: stream 0 reads what stream 1 wrote.
    let err = add(&mut gpu, s0, [mid, b, out]).unwrap_err();
    assert!(matches!(err, GpuError::Race { .. }), "{err}");
    gpu.record_event(event, s1).expect("record");
    gpu.wait_event(s0, event).expect("wait");
    add(&mut gpu, s0, [mid, b, out]).expect("ordered add");
    let expected: Vec<f32> = (0..N).map(|i| i as f32 + 2.0).collect();
    assert_eq!(download(&mut gpu, out), expected);

    let err = add(&mut gpu, s0, [a, b, a]).unwrap_err();
    assert!(matches!(err, GpuError::Aliasing { .. }), "{err}");
    for ptr in [a, b, mid, out] {
        gpu.free(ptr).expect("free");
    }
    let err = gpu.free(a).unwrap_err();
    assert!(matches!(err, GpuError::NotAnAllocation { .. }), "{err}");
    gpu.destroy_event(event).expect("destroy_event");
    gpu.destroy_stream(s1).expect("destroy_stream");
}
