//! Loading solder's kernels into a backend: the CPU twins, or (feature `cuda`) the PTX of
//! every module, embedded in the binary so that a run needs no files and no CUDA toolkit.
//!
//! The sources and PTX live in the `solder-kernels` crate, which embeds them by module name.

use solder_gpu_runtime::{CpuBackend, GpuBackend, GpuError, ModuleImage};

/// The kernel modules, one per `crates/kernels/cuda/<module>.cu`.
pub use solder_kernels::MODULES;

/// A CPU backend with every twin registered and every module loaded.
pub fn cpu_backend(threads: Option<usize>) -> Result<CpuBackend, GpuError> {
    let mut backend = match threads {
        Some(n) => CpuBackend::with_threads(n),
        None => CpuBackend::new(),
    };
    crate::twins::register_all(&mut backend)?;
    for module in MODULES {
        backend.load_module(&ModuleImage {
            name: module,
            ptx: None,
        })?;
    }
    Ok(backend)
}

#[cfg(feature = "cuda")]
pub use cuda::{cuda_backend, module_ptx, PTX};

#[cfg(feature = "cuda")]
mod cuda {
    use solder_gpu_runtime::{CudaBackend, GpuBackend, GpuError, ModuleImage};

    pub use solder_kernels::{ptx as module_ptx, PTX};

    /// A CUDA backend on device `device` with every module loaded (the driver JIT-compiles
    /// the PTX for the device). `GpuError::NoDriver` where no CUDA driver is installed.
    pub fn cuda_backend(device: usize) -> Result<CudaBackend, GpuError> {
        let mut backend = CudaBackend::new(device)?;
        for module in super::MODULES {
            let ptx = module_ptx(module).ok_or_else(|| GpuError::Driver {
                call: "load_module",
                message: format!("module `{module}` has no embedded PTX"),
            })?;
            backend.load_module(&ModuleImage {
                name: module,
                ptx: Some(ptx),
            })?;
        }
        Ok(backend)
    }
}
