//! Test harness for the CPU twins: runs an `ops::` launch whose buffers point at host `Vec`s
//! through the kernel's twin, without a backend, and a seeded xorshift for inputs.
#![allow(dead_code)]

use half::bf16;
use solder_gpu_runtime::twin::HostArg;
use solder_gpu_runtime::{DevicePtr, GpuError, KernelArg, TwinCtx};
use solder_model_layers::kernels;
use solder_model_layers::kernels::{Buf, Launch};

/// A read-only buffer over `v`.
pub fn rd<T>(v: &[T]) -> Buf {
    Buf {
        ptr: DevicePtr(v.as_ptr() as u64),
        bytes: std::mem::size_of_val(v),
    }
}

/// A writable buffer over `v`.
pub fn wr<T>(v: &mut [T]) -> Buf {
    Buf {
        ptr: DevicePtr(v.as_mut_ptr() as u64),
        bytes: std::mem::size_of_val(v),
    }
}

/// Runs `launch` through its twin on `threads` host threads. The launch's buffers must point
/// at live host memory (built with `rd`/`wr`), writable ones overlapping nothing else.
pub fn run_threads(launch: &Launch, threads: usize) -> Result<(), GpuError> {
    let args = launch
        .args
        .iter()
        .map(|a| match *a {
            KernelArg::Buffer { ptr, bytes, access } => HostArg::Buffer {
                ptr: ptr.0 as *mut u8,
                bytes,
                access,
            },
            KernelArg::Null => HostArg::Null,
            KernelArg::I32(v) => HostArg::I32(v),
            KernelArg::U32(v) => HostArg::U32(v),
            KernelArg::F32(v) => HostArg::F32(v),
        })
        .collect();
    let twin =
        kernels::twin(launch.kernel).unwrap_or_else(|| panic!("no twin for {}", launch.kernel));
    // SAFETY: the tests build every buffer from a live Vec and never alias a written one.
    let ctx = unsafe { TwinCtx::new(launch.kernel, &launch.config, args, threads) };
    twin(&ctx)
}

/// Runs `launch` on one thread and expects success.
pub fn run(launch: Launch) {
    run_threads(&launch, 1).unwrap_or_else(|e| panic!("{}: {e}", launch.kernel));
}

/// Seeded xorshift64*.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub fn f32s(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.unit() * scale).collect()
    }

    pub fn bf16s(&mut self, n: usize, scale: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(self.unit() * scale))
            .collect()
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Poisoned outputs, so a value a twin forgets to write shows up.
pub fn poison_bf16(n: usize) -> Vec<bf16> {
    vec![bf16::NAN; n]
}

/// The attention kernels' cross-block scratch (`ops::attn::scratch_bytes`; the twins only
/// check its length).
pub fn attn_scratch(rows: u32, heads: u32, head_dim: u32) -> Vec<f32> {
    let bytes = solder_model_layers::kernels::attn::scratch_bytes(
        rows as usize,
        heads as usize,
        head_dim as usize,
    );
    vec![0.0; bytes / 4]
}

pub fn poison_f32(n: usize) -> Vec<f32> {
    vec![f32::NAN; n]
}

/// Byte-identical comparison (NaN-safe).
pub fn bits_bf16(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub fn bits_f32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

pub fn f64s(v: &[bf16]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}
