//! The host side of every kernel, one module per CUDA module (`crates/kernels/cuda/<m>.cu`,
//! in the `solder-kernels` crate): each kernel is declared once with `kernel!` (`decl`), its
//! typed argument struct beside its CPU twin (reading the struct's typed view, `view`) and its
//! emitter (plan group → launch). `registry()` lists every declaration; from it come the
//! twins a CPU backend registers, the emitter of each rule's kernel, and the kernel names
//! FUSIONS.toml and the PTX are checked against. `variants()` lists the extra PTX entries of a
//! declared kernel (gemv's streaming entries), registered under the kernel's twin. Also: loading a backend (the CPU twins, or
//! with feature `cuda` the embedded PTX of every module).
//!
//! Adding a kernel touches three places: its `.cu` function, its declaration (with twin and
//! emitter) in this module's file for its CUDA module, and its rule in FUSIONS.toml.
//!
//! Invariants (each checked by a test): every declaration's parameters match its CUDA
//! signature in order, type and access; names are unique; every CPU twin is registered under
//! its declaration's name; twins check every dimension, buffer length and index before they
//! write and return an error naming the kernel instead of panicking; a fused twin runs the
//! reference twins' primitives (`crate::numerics`) in the same order, so its bytes equal the
//! reference routing's; results never depend on the number of host threads.

pub mod args;
pub mod attrs;
pub mod cubins;
pub(crate) mod decl;
pub mod emit_view;
mod grid;
mod heads;

pub mod act;
pub mod add;
pub mod attn;
pub mod embed;
pub mod gdn;
pub mod gemv;
pub mod kv;
pub mod moe;
pub mod norm;
pub mod rope;

#[cfg(test)]
mod signature;

use solder_gpu_runtime::{CpuBackend, GpuBackend, GpuError, ModuleImage, TwinFn};

pub use decl::{Buf, EmitFn, KernelDecl, Launch, Name, Param, ParamKind, Shape};

/// Every module's declarations, in `MODULES` order.
const BY_MODULE: &[&[&[KernelDecl]]] = &[
    act::DECLS,
    add::DECLS,
    attn::DECLS,
    embed::DECLS,
    gdn::DECLS,
    gemv::DECLS,
    kv::DECLS,
    moe::DECLS,
    norm::DECLS,
    rope::DECLS,
];

/// Every kernel declaration, by module.
pub fn registry() -> impl Iterator<Item = &'static KernelDecl> {
    BY_MODULE
        .iter()
        .flat_map(|module| module.iter())
        .flat_map(|decls| decls.iter())
}

/// The declaration of `kernel` (`module::func`), if there is one.
pub fn decl(kernel: &str) -> Option<&'static KernelDecl> {
    registry().find(|d| d.name == kernel)
}

/// Every declared kernel's `module::func` name.
pub fn kernel_names() -> Vec<&'static str> {
    registry().map(|d| d.name).collect()
}

/// Variant entries, each with the kernel it is a variant of: another PTX entry taking the
/// same arguments, with the same twin and the same bytes, chosen at emit time by rows and
/// levers (gemv's streaming entries `gemv::linear_r1`, ..., attention's
/// `attn::paged_decode_prefetch`). Rules and plans name only the kernel.
pub fn variants() -> impl Iterator<Item = (&'static str, &'static str)> {
    gemv::VARIANTS
        .iter()
        .chain(gemv::HEAD_VARIANTS)
        .chain(attn::VARIANTS)
        .copied()
}

/// Kernels no rule names, launched by `program::compile` itself (every program's counter reset).
pub const PROGRAM_KERNELS: &[&str] = &[gemv::COUNTERS_RESET.as_str()];

/// The kernel `entry` is a variant of, if it is one.
pub fn variant_of(entry: &str) -> Option<&'static str> {
    variants().find(|(v, _)| *v == entry).map(|(_, base)| base)
}

/// The CPU twin of `kernel` (or of the kernel a variant entry stands for), if there is one.
pub fn twin(kernel: &str) -> Option<TwinFn> {
    decl(variant_of(kernel).unwrap_or(kernel)).map(|d| d.twin)
}

/// Every entry a backend offers with its twin: each declaration, then each variant under its
/// kernel's twin.
pub fn entries() -> Vec<(&'static str, TwinFn)> {
    let variants = variants().filter_map(|(entry, base)| decl(base).map(|d| (entry, d.twin)));
    twins().into_iter().chain(variants).collect()
}

/// Every twin with its kernel name, in registry order.
pub fn twins() -> Vec<(&'static str, TwinFn)> {
    registry().map(|d| (d.name, d.twin)).collect()
}

/// Registers every entry's twin with the CPU backend (`entries`).
pub fn register_twins(backend: &mut CpuBackend) -> Result<(), GpuError> {
    for (name, twin) in entries() {
        backend.register_twin(name, twin)?;
    }
    Ok(())
}

/// The kernel modules, one per `crates/kernels/cuda/<module>.cu`.
pub use solder_kernels::MODULES;

/// A CPU backend with every twin registered and every module loaded.
pub fn cpu_backend(threads: Option<usize>) -> Result<CpuBackend, GpuError> {
    let mut backend = match threads {
        Some(n) => CpuBackend::with_threads(n),
        None => CpuBackend::new(),
    };
    register_twins(&mut backend)?;
    for module in MODULES {
        backend.load_module(&ModuleImage {
            name: module,
            ptx: None,
            cubin: None,
        })?;
    }
    Ok(backend)
}

pub use solder_kernels::{ptx as module_ptx, ptx_modules};

#[cfg(feature = "cuda")]
pub use cuda::cuda_backend;

#[cfg(feature = "cuda")]
mod cuda {
    use solder_gpu_runtime::{CudaBackend, GpuBackend, GpuError, ModuleImage};

    use super::cubins::Cubins;
    use super::module_ptx;

    /// A CUDA backend on device `device` with every module loaded: from `cubins` where the
    /// folder holds a cubin assembled from the embedded PTX for this device's architecture (no
    /// JIT), else the embedded PTX, which the driver JIT-compiles (each such module logged
    /// with the reason). `GpuError::NoDriver` where no CUDA driver is installed.
    pub fn cuda_backend(device: usize, cubins: Option<&Cubins>) -> Result<CudaBackend, GpuError> {
        let mut backend = CudaBackend::new(device)?;
        let capability = backend.facts().compute_capability;
        let cubins = cubins.filter(|cubins| {
            let suits = capability.is_some_and(|c| cubins.suits(c));
            if !suits {
                tracing::warn!(
                    arch = cubins.arch,
                    device = ?capability,
                    "the cubins are for another architecture; JIT-compiling the PTX"
                );
            }
            suits
        });
        for module in super::MODULES {
            let ptx = module_ptx(module).ok_or_else(|| GpuError::Driver {
                call: "load_module",
                message: format!("module `{module}` has no embedded PTX"),
            })?;
            let digest = solder_kernels::ptx_sha256(module).unwrap_or_default();
            let cubin = cubins.and_then(|cubins| match cubins.image(module, digest) {
                Ok(bytes) => Some(bytes),
                Err(why) => {
                    tracing::warn!(module, "{why}; JIT-compiling the embedded PTX");
                    None
                }
            });
            backend.load_module(&ModuleImage {
                name: module,
                ptx: Some(ptx),
                cubin: cubin.as_deref(),
            })?;
        }
        Ok(backend)
    }
}
