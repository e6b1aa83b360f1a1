//! Small twins and helpers shared by the CPU backend's tests.
#![allow(dead_code)]

use solder_gpu_runtime::{
    par_chunks_mut, CpuBackend, DevicePtr, GpuBackend, GpuError, KernelArg, KernelId, LaunchConfig,
    ModuleImage, StreamId, TwinCtx,
};

/// `test::fill(out: write f32, value: u32)`: every element becomes `value as f32`.
fn fill(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let value = ctx.u32(1)? as f32;
    ctx.f32s_mut(0)?.iter_mut().for_each(|x| *x = value);
    Ok(())
}

/// `test::copy(src: read f32, dst: write f32)`.
fn copy(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let src = ctx.f32s(0)?;
    let dst = ctx.f32s_mut(1)?;
    if src.len() != dst.len() {
        return Err(ctx.bad(
            1,
            format!("{} elements, source has {}", dst.len(), src.len()),
        ));
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// `test::add(a: read f32, b: read f32, out: write f32)`.
fn add(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let (a, b, out) = (ctx.f32s(0)?, ctx.f32s(1)?, ctx.f32s_mut(2)?);
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
    Ok(())
}

/// `test::scale(x: read-write f32, factor: f32)`.
fn scale(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let factor = ctx.f32(1)?;
    ctx.f32s_mut(0)?.iter_mut().for_each(|x| *x *= factor);
    Ok(())
}

/// `test::poly(out: write f32)`: a per-element formula over `par_chunks_mut` (chunks of 5).
fn poly(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let out = ctx.f32s_mut(0)?;
    par_chunks_mut(out, 5, ctx.threads(), |chunk_index, chunk| {
        for (i, x) in chunk.iter_mut().enumerate() {
            let n = (chunk_index * 5 + i) as f32;
            *x = (n * 0.37).sin() * n.sqrt() + 1.0 / (n + 1.0);
        }
    });
    Ok(())
}

/// `test::fail()`: always fails.
fn fail(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    Err(ctx.fail("token id 99 is out of range"))
}

/// `test::read_output(out: write f32)`: wrongly reads its output through `f32s`.
fn read_output(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    ctx.f32s(0).map(|_| ())
}

/// `test::take_twice(out: write f32)`: takes its output mutably twice.
fn take_twice(ctx: &TwinCtx<'_>) -> Result<(), GpuError> {
    let _first = ctx.f32s_mut(0)?;
    let _second = ctx.f32s_mut(0)?;
    Ok(())
}

/// A backend with the `test` module's twins registered and loaded.
pub fn backend() -> CpuBackend {
    backend_with_threads(2)
}

pub fn backend_with_threads(threads: usize) -> CpuBackend {
    let mut gpu = CpuBackend::with_threads(threads);
    gpu.register_twins(&[
        ("test::fill", fill),
        ("test::copy", copy),
        ("test::add", add),
        ("test::scale", scale),
        ("test::poly", poly),
        ("test::fail", fail),
        ("test::read_output", read_output),
        ("test::take_twice", take_twice),
    ])
    .unwrap();
    gpu.load_module(&ModuleImage {
        name: "test",
        ptx: None,
        cubin: None,
    })
    .unwrap();
    gpu
}

pub fn k(gpu: &CpuBackend, name: &str) -> KernelId {
    gpu.kernel(&format!("test::{name}")).unwrap()
}

pub fn cfg() -> LaunchConfig {
    LaunchConfig::linear(1, 32)
}

pub fn bytes(elements: usize) -> usize {
    elements * 4
}

pub fn upload(gpu: &mut CpuBackend, values: &[f32]) -> DevicePtr {
    let ptr = gpu.alloc(bytes(values.len())).unwrap();
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    gpu.copy_h2d(ptr, &raw).unwrap();
    ptr
}

pub fn download(gpu: &mut CpuBackend, ptr: DevicePtr, elements: usize) -> Vec<f32> {
    let mut raw = vec![0u8; bytes(elements)];
    gpu.copy_d2h(ptr, &mut raw).unwrap();
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn fill_on(
    gpu: &mut CpuBackend,
    stream: StreamId,
    out: DevicePtr,
    elements: usize,
    value: u32,
) -> Result<(), GpuError> {
    let kernel = k(gpu, "fill");
    gpu.launch(
        stream,
        kernel,
        &cfg(),
        &[
            KernelArg::write(out, bytes(elements)),
            KernelArg::U32(value),
        ],
    )
}

pub fn copy_on(
    gpu: &mut CpuBackend,
    stream: StreamId,
    src: DevicePtr,
    dst: DevicePtr,
    elements: usize,
) -> Result<(), GpuError> {
    let kernel = k(gpu, "copy");
    gpu.launch(
        stream,
        kernel,
        &cfg(),
        &[
            KernelArg::read(src, bytes(elements)),
            KernelArg::write(dst, bytes(elements)),
        ],
    )
}

pub fn add_on(
    gpu: &mut CpuBackend,
    stream: StreamId,
    a: DevicePtr,
    b: DevicePtr,
    out: DevicePtr,
    elements: usize,
) -> Result<(), GpuError> {
    let kernel = k(gpu, "add");
    let n = bytes(elements);
    gpu.launch(
        stream,
        kernel,
        &cfg(),
        &[
            KernelArg::read(a, n),
            KernelArg::read(b, n),
            KernelArg::write(out, n),
        ],
    )
}
