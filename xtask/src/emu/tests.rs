//! The emulation end to end on single launches: the libraries build, a launch runs the CUDA
//! source (its bytes are h + x, computed here), shadow mode finds it equal to the twin, and
//! a twin that disagrees is reported with its first differing element.

use half::bf16;
use solder_gpu_runtime::cpu::emu::EmuMode;
use solder_gpu_runtime::{CpuBackend, DevicePtr, GpuBackend, ModuleImage};
use solder_model_layers::kernels::add::{ResidualAdd, RESIDUAL_ADD};
use solder_model_layers::kernels::gemv::{Linear, LINEAR};
use solder_model_layers::kernels::{Buf, Launch};

fn upload(backend: &mut CpuBackend, bytes: &[u8]) -> Buf {
    let ptr = backend.alloc(bytes.len()).unwrap();
    backend.copy_h2d(ptr, bytes).unwrap();
    Buf::new(ptr, bytes.len())
}

fn download(backend: &mut CpuBackend, ptr: DevicePtr, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    backend.copy_d2h(ptr, &mut out).unwrap();
    out
}

fn bf16_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values.flat_map(|v| bf16::from_f32(v).to_le_bytes()).collect()
}

fn run(backend: &mut CpuBackend, launch: &Launch) {
    let kernel = backend.kernel(launch.kernel).unwrap();
    let stream = backend.default_stream();
    backend.launch(stream, kernel, &launch.config, &launch.args).unwrap();
}

fn emulated(mode: EmuMode, backend: &mut CpuBackend) {
    let emulation = super::emulation(&crate::workspace_root(), mode).unwrap();
    backend.set_emulation(Some(emulation));
}

/// residual_add over 3 rows of 70 (not a multiple of the block), emulated.
fn residual_add(backend: &mut CpuBackend) -> (Vec<u8>, Vec<f32>) {
    let (rows, hidden) = (3u32, 70u32);
    let n = (rows * hidden) as usize;
    let h: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
    let h_buf = upload(backend, &h.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    let x_bytes = bf16_bytes(x.iter().copied());
    let x_buf = upload(backend, &x_bytes);
    let out = Buf::new(backend.alloc(n * 4).unwrap(), n * 4);
    let launch = ResidualAdd {
        h: h_buf,
        x: x_buf,
        out,
        rows,
        hidden,
    }
    .launch(RESIDUAL_ADD);
    run(backend, &launch);
    let expected: Vec<f32> = h
        .iter()
        .zip(x_bytes.chunks(2))
        .map(|(h, x)| h + bf16::from_le_bytes([x[0], x[1]]).to_f32())
        .collect();
    (download(backend, out.ptr, n * 4), expected)
}

#[test]
fn residual_add_runs_the_cuda_source_and_equals_its_twin() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Run, &mut backend);
    let (bytes, expected) = residual_add(&mut backend);
    let expected: Vec<u8> = expected.iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(bytes, expected);

    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    residual_add(&mut backend);
    let report = backend.emulation().unwrap().report();
    let add = &report["add::residual_add"];
    assert_eq!((add.launches, add.identical), (1, 1), "{add:?}");
}

#[test]
fn linear_equals_its_twin_with_and_without_bias_across_tiles() {
    let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    // k = 300: a partial last 8-chunk and several segments; 11 rows: more than one row tile.
    let (rows, k, n_out) = (11u32, 300u32, 37u32);
    let x = upload(&mut backend, &bf16_bytes((0..rows * k).map(|i| (i as f32 * 0.7).sin())));
    let w = upload(&mut backend, &bf16_bytes((0..n_out * k).map(|i| (i as f32 * 0.3).cos() * 0.1)));
    let bias = upload(&mut backend, &bf16_bytes((0..n_out).map(|i| i as f32 * 0.01)));
    let bytes = (rows * n_out * 2) as usize;
    let y = Buf::new(backend.alloc(bytes).unwrap(), bytes);
    for bias in [Some(bias), None] {
        let launch = Linear {
            x,
            w,
            bias,
            y,
            rows,
            k,
            n_out,
        }
        .launch(LINEAR);
        run(&mut backend, &launch);
    }
    let report = backend.emulation().unwrap().report();
    let linear = &report["gemv::linear"];
    assert_eq!((linear.launches, linear.identical), (2, 2), "{linear:?}");
}

#[test]
fn a_twin_that_disagrees_is_reported_with_its_first_differing_element() {
    let mut backend = CpuBackend::with_threads(1);
    // A wrong twin: writes +0 everywhere.
    backend
        .register_twin("add::residual_add", |ctx| {
            let out = ctx.f32s_mut(2)?;
            out.fill(0.0);
            Ok(())
        })
        .unwrap();
    backend
        .load_module(&ModuleImage {
            name: "add",
            ptx: None,
        })
        .unwrap();
    emulated(EmuMode::Shadow, &mut backend);
    let (bytes, expected) = residual_add(&mut backend);
    let expected: Vec<u8> = expected.iter().flat_map(|v| v.to_le_bytes()).collect();
    // The emulation's bytes are the ones kept.
    assert_eq!(bytes, expected);
    let add = &backend.emulation().unwrap().report()["add::residual_add"];
    assert_eq!((add.launches, add.identical), (1, 0));
    let text = add.first_mismatch.as_deref().unwrap();
    assert!(text.starts_with("arg 2 element 0: twin 0e0 (0x00000000), emulation 1e0 (0x3f800000)"), "{text}");
}
