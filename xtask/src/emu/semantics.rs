//! The emulator's barrier and warp semantics on kernels written for the purpose (compiled
//! here with the same compiler and flags as the modules): threads that exit leave the block
//! barrier; `__syncthreads_or` sees every live thread's predicate; a shuffle returns its
//! source lane's value; a shuffle from an exited lane and a barrier split between a warp
//! exchange and `__syncthreads` fail the launch with a message instead of hanging.

use std::path::Path;
use std::process::Command;

use solder_gpu_runtime::cpu::emu::{library_path, EmuMode, Emulation};
use solder_gpu_runtime::{CpuBackend, GpuBackend, KernelArg, LaunchConfig, ModuleImage};

const KERNELS: &str = r#"
#include "cuda_emu.hpp"
#include "common.cuh"
// out[t] = (sum over the 64 live threads of t) + any-odd flag, after half the block exits.
extern "C" __global__ void early_exit(const int* in, int* out) {
    __shared__ int sums[128];
    if (threadIdx.x >= 64) return;
    sums[threadIdx.x] = in[threadIdx.x];
    __syncthreads();
    int total = 0;
    for (int i = 0; i < 64; ++i) total += sums[i];
    const int odd = __syncthreads_or(in[threadIdx.x] & 1);
    out[threadIdx.x] = total * 2 + odd;
}
// out[t] = warp_sum of (t + 1) over its warp, then the value of lane (t + 1) % 32.
extern "C" __global__ void shuffles(float* out) {
    const float s = warp_sum((float)(threadIdx.x + 1));
    const float next = __shfl_sync(SOLDER_FULL_MASK, s + (float)threadIdx.x, (threadIdx.x + 1) & 31);
    out[threadIdx.x] = next;
}
extern "C" __global__ void shuffle_from_exited(float* out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = warp_sum(1.0f);
}
extern "C" __global__ void split_barrier(float* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        out[threadIdx.x] = warp_sum(1.0f);
    }
}
EMU_TRAMPOLINE(t, early_exit)
EMU_TRAMPOLINE(t, shuffles)
EMU_TRAMPOLINE(t, shuffle_from_exited)
EMU_TRAMPOLINE(t, split_barrier)
"#;

fn build(dir: &Path) {
    let root = crate::paths::workspace_root();
    let source = dir.join("t.cpp");
    std::fs::write(&source, KERNELS).unwrap();
    let output = Command::new(super::CXX)
        .args(super::CXX_FLAGS)
        .arg("-I")
        .arg(root.join(super::generate::EMU_DIR))
        .arg("-I")
        .arg(root.join(solder_kernels::CUDA_DIR))
        .arg(&source)
        .arg("-o")
        .arg(library_path(dir, "t"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn backend(dir: &Path) -> CpuBackend {
    let mut backend = CpuBackend::with_threads(1);
    for name in [
        "early_exit",
        "shuffles",
        "shuffle_from_exited",
        "split_barrier",
    ] {
        // The twins are never run (EmuMode::Run); the registry only makes the names kernels.
        backend
            .register_twin(&format!("t::{name}"), |_| Ok(()))
            .unwrap();
    }
    backend
        .load_module(&ModuleImage {
            name: "t",
            ptx: None,
            cubin: None,
        })
        .unwrap();
    backend.set_emulation(Some(Emulation::open(dir, &["t"], EmuMode::Run).unwrap()));
    backend
}

fn launch(
    backend: &mut CpuBackend,
    name: &str,
    threads: u32,
    args: &[KernelArg],
) -> Result<(), String> {
    let kernel = backend.kernel(&format!("t::{name}")).unwrap();
    let stream = backend.default_stream();
    backend
        .launch(stream, kernel, &LaunchConfig::linear(1, threads), args)
        .map_err(|e| e.to_string())
}

#[test]
fn barriers_and_shuffles_behave_as_on_sm_70_and_later() {
    let dir = std::env::temp_dir().join(format!("solder-emu-semantics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    build(&dir);
    let mut backend = backend(&dir);

    let input: Vec<i32> = (0..64).map(|i| 2 * i + i32::from(i == 40)).collect();
    let in_bytes: Vec<u8> = input.iter().flat_map(|v| v.to_le_bytes()).collect();
    let inp = backend.alloc(in_bytes.len()).unwrap();
    backend.copy_h2d(inp, &in_bytes).unwrap();
    let out = backend.alloc(128 * 4).unwrap();
    backend.memset(out, 0, 128 * 4).unwrap();
    let args = [KernelArg::read(inp, 64 * 4), KernelArg::write(out, 128 * 4)];
    launch(&mut backend, "early_exit", 128, &args).unwrap();
    let mut bytes = vec![0u8; 128 * 4];
    backend.copy_d2h(out, &mut bytes).unwrap();
    let got: Vec<i32> = bytes
        .chunks(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let total: i32 = input.iter().sum();
    assert!(got[..64].iter().all(|&v| v == total * 2 + 1), "{got:?}");
    assert!(
        got[64..].iter().all(|&v| v == 0),
        "exited threads wrote: {got:?}"
    );

    launch(
        &mut backend,
        "shuffles",
        64,
        &[KernelArg::write(out, 64 * 4)],
    )
    .unwrap();
    backend.copy_d2h(out, &mut bytes[..64 * 4]).unwrap();
    let got: Vec<f32> = bytes[..256]
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    for (t, &value) in got.iter().enumerate() {
        let warp = t / 32 * 32;
        let sum: usize = (warp + 1..=warp + 32).sum();
        let src = warp + (t + 1) % 32;
        assert_eq!(value, (sum + src) as f32, "thread {t}");
    }

    let e = launch(
        &mut backend,
        "shuffle_from_exited",
        32,
        &[KernelArg::write(out, 32 * 4)],
    )
    .unwrap_err();
    assert!(
        e.contains("t::shuffle_from_exited") && e.contains("reads lane 5") && e.contains("exited"),
        "{e}"
    );
    let e = launch(
        &mut backend,
        "split_barrier",
        32,
        &[KernelArg::write(out, 32 * 4)],
    )
    .unwrap_err();
    assert!(
        e.contains("t::split_barrier") && e.contains("deadlock") && e.contains("warp 0"),
        "{e}"
    );
    drop(backend);
    std::fs::remove_dir_all(&dir).ok();
}
