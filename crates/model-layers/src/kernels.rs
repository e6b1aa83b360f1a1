//! Loading solder's kernels into a backend.

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
