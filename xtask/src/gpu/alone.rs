//! A kernel launched and timed alone, for `gpu-kernels`' families (`gpu::kernels`,
//! `gpu::tiles`): deterministic fills, the buffers of one case freed together, one launch
//! waited for, and the median of launches timed one by one.

use solder_gpu_runtime::{DevicePtr, GpuBackend};
use solder_model_layers::kernels::{Buf, Launch};

use super::median;

/// A deterministic fill in about ±1 for `n` elements.
pub(super) fn wave(n: usize, seed: f32) -> impl Iterator<Item = f32> {
    (0..n).map(move |i| ((i as f32 + seed) * 0.618_034).sin())
}

/// The buffers of one case (a width, a shape), freed together.
pub(super) struct Buffers<'b> {
    backend: &'b mut dyn GpuBackend,
    held: Vec<DevicePtr>,
}

impl<'b> Buffers<'b> {
    pub(super) fn new(backend: &'b mut dyn GpuBackend) -> Self {
        Buffers {
            backend,
            held: Vec::new(),
        }
    }

    pub(super) fn backend(&mut self) -> &mut dyn GpuBackend {
        &mut *self.backend
    }

    pub(super) fn upload(&mut self, bytes: &[u8]) -> Result<Buf, String> {
        let ptr = self.backend.alloc(bytes.len()).map_err(|e| e.to_string())?;
        self.held.push(ptr);
        self.backend
            .copy_h2d(ptr, bytes)
            .map_err(|e| e.to_string())?;
        Ok(Buf::new(ptr, bytes.len()))
    }

    pub(super) fn free(self) -> Result<(), String> {
        for ptr in self.held {
            self.backend.free(ptr).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

pub(super) fn bf16_bytes(values: impl Iterator<Item = f32>) -> Vec<u8> {
    values
        .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
        .collect()
}

pub(super) fn download_bf16(backend: &mut dyn GpuBackend, buf: Buf) -> Result<Vec<f32>, String> {
    let mut raw = vec![0u8; buf.bytes];
    backend
        .copy_d2h(buf.ptr, &mut raw)
        .map_err(|e| e.to_string())?;
    Ok(raw
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect())
}

/// Launches `launch` alone and waits for it.
pub(super) fn launch_once(backend: &mut dyn GpuBackend, launch: &Launch) -> Result<(), String> {
    let kernel = backend.kernel(launch.kernel).map_err(|e| e.to_string())?;
    let stream = backend.default_stream();
    (backend.launch(stream, kernel, &launch.config, &launch.args)).map_err(|e| e.to_string())?;
    backend.synchronize().map_err(|e| e.to_string())
}

/// Launches `launch` alone `runs` times after one warm-up; the median microseconds.
pub(super) fn time(
    backend: &mut dyn GpuBackend,
    launch: &Launch,
    runs: usize,
) -> Result<f64, String> {
    let mut samples = Vec::with_capacity(runs);
    for run in 0..=runs {
        backend.synchronize().map_err(|e| e.to_string())?;
        let started = std::time::Instant::now();
        launch_once(backend, launch)?;
        if run > 0 {
            samples.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    Ok(median(&mut samples))
}
