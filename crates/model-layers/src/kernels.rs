//! Loading solder's kernels into a backend: the CPU twins, or (feature `cuda`) the PTX of
//! every module, embedded in the binary so that a run needs no files and no CUDA toolkit.
//!
//! Invariant: `MODULES` names exactly the files `kernels/ptx/<module>.ptx`; with `cuda`, each
//! is embedded under the same name (a missing file is a build error, never a run-time one).

use solder_gpu_runtime::{CpuBackend, GpuBackend, GpuError, ModuleImage};

/// The kernel modules, one per `kernels/<module>.cu`.
pub const MODULES: &[&str] = &[
    "act", "add", "attn", "embed", "gdn", "gemv", "kv", "moe", "norm", "rope",
];

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

    /// Embeds `kernels/ptx/<module>.ptx` (paths relative to this file's crate).
    macro_rules! embedded {
        ($($module:literal),* $(,)?) => {
            &[$(($module, include_str!(concat!("../../../kernels/ptx/", $module, ".ptx")))),*]
        };
    }

    /// Every module's PTX, by module name, in `MODULES` order.
    pub const PTX: &[(&str, &str)] =
        embedded!("act", "add", "attn", "embed", "gdn", "gemv", "kv", "moe", "norm", "rope",);

    /// The embedded PTX of `module`.
    pub fn module_ptx(module: &str) -> Option<&'static str> {
        PTX.iter().find(|(m, _)| *m == module).map(|(_, ptx)| *ptx)
    }

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

    #[cfg(test)]
    mod tests {
        #[test]
        fn every_module_is_embedded_once() {
            let names: Vec<&str> = super::PTX.iter().map(|(m, _)| *m).collect();
            assert_eq!(names, super::super::MODULES);
            for (module, ptx) in super::PTX {
                assert!(ptx.contains(".entry"), "{module}.ptx defines no kernel");
            }
        }
    }
}
