//! The GPU side of xtask: choosing a backend (`--backend cpu|cuda`), the GPU-vs-CPU check of
//! `parity --backend cuda` (`cross`), `gpu-bench` (`bench`), the hidden `gpu-step` that
//! compute-sanitizer and ncu wrap (`step`), the hidden `gpu-ncu-table` that reads ncu's CSV
//! (`ncu`), the hidden `gpu-facts` (`facts`), the hidden `gpu-kernels` (`kernels`: single kernels
//! timed alone at a real model's shape), and `gpu-check`, which builds the bundle a GPU machine
//! runs (`check`, with its script `run.sh`).
//!
//! Invariant: everything here builds without the `cuda` feature; what needs a device then
//! fails with `BUILD_HINT`, never at compile time.

pub mod alone;
pub mod bench;
pub mod bundle;
pub mod check;
pub mod cross;
pub mod facts;
pub mod kernels;
pub mod ncu;
pub mod qkv;
pub mod step;
pub mod tiles;

use solder_gpu_runtime::DeviceFacts;

/// How to get a build that can reach a GPU.
pub const BUILD_HINT: &str = "this xtask was built without the `cuda` feature; build it with \
`cargo build --release -p xtask --features cuda` and run `target/release/xtask <command> ...` \
(or `cargo run --release -p xtask --features cuda -- <command> ...`), or use the bundle \
`target/gpu-check/solder` that `cargo xtask gpu-check` builds";

/// The most tokens `--context` takes (gpu-step, gpu-bench) before the model's own
/// `max_position_embeddings` is asked: positions travel as i32 in the metadata region.
pub const MAX_CONTEXT: usize = i32::MAX as usize / 2;

/// The backend a command runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    /// `--backend`'s value (default `cpu`); `cuda` only in a build with the feature.
    pub fn parse(value: Option<&str>) -> Result<BackendKind, String> {
        match value.unwrap_or("cpu") {
            "cpu" => Ok(BackendKind::Cpu),
            "cuda" if cfg!(feature = "cuda") => Ok(BackendKind::Cuda),
            "cuda" => Err(format!("`--backend cuda`: {BUILD_HINT}")),
            other => Err(format!("unknown backend `{other}` (known: cpu, cuda)")),
        }
    }
}

/// The variable naming a folder of cubins (`cargo xtask gpu-check` assembles them into the
/// bundle's `cubin/`; run.sh sets it): modules load from them without JIT where they match the
/// embedded PTX.
#[cfg(feature = "cuda")]
pub const CUBINS_VAR: &str = "SOLDER_CUBINS";

/// A CUDA backend on device 0 with every kernel module loaded, from the cubins `SOLDER_CUBINS`
/// names where they match, else from the embedded PTX.
#[cfg(feature = "cuda")]
pub fn cuda_backend() -> Result<solder_gpu_runtime::CudaBackend, String> {
    use solder_model_layers::kernels::cubins::Cubins;
    let cubins = match std::env::var_os(CUBINS_VAR) {
        Some(dir) if !dir.is_empty() => Some(
            Cubins::open(std::path::Path::new(&dir)).map_err(|e| format!("{CUBINS_VAR}: {e}"))?,
        ),
        _ => None,
    };
    solder_model_layers::kernels::cuda_backend(0, cubins.as_ref())
        .map_err(|e| format!("cuda backend: {e}"))
}

/// Refuses a device-only command in a build without the feature.
#[cfg(not(feature = "cuda"))]
pub fn needs_cuda<T>(command: &str) -> Result<T, String> {
    Err(format!("`{command}` runs on a GPU: {BUILD_HINT}"))
}

/// One line naming the device.
pub fn describe(facts: &DeviceFacts) -> String {
    let capability = facts
        .compute_capability
        .map_or(String::new(), |(major, minor)| {
            format!(", sm_{major}{minor}")
        });
    format!(
        "{} backend: {}, {:.1} GiB{capability}, {} multiprocessors",
        facts.backend,
        facts.name,
        facts.memory_bytes as f64 / (1u64 << 30) as f64,
        facts.multiprocessors
    )
}

/// The median of `samples` (sorted in place); 0 for none.
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The device backend `kind` asks for (`None` for the CPU), its modules loaded.
pub fn device_backend(
    kind: BackendKind,
) -> Result<Option<Box<dyn solder_gpu_runtime::GpuBackend>>, String> {
    match kind {
        BackendKind::Cpu => Ok(None),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Ok(Some(Box::new(cuda_backend()?))),
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => needs_cuda("--backend cuda"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names() {
        assert_eq!(BackendKind::parse(None), Ok(BackendKind::Cpu));
        assert_eq!(BackendKind::parse(Some("cpu")), Ok(BackendKind::Cpu));
        assert!(BackendKind::parse(Some("metal"))
            .unwrap_err()
            .contains("unknown backend `metal`"));
        match BackendKind::parse(Some("cuda")) {
            Ok(kind) => assert!(cfg!(feature = "cuda") && kind == BackendKind::Cuda),
            Err(e) => assert!(!cfg!(feature = "cuda") && e.contains("--features cuda")),
        }
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 3.0);
        assert_eq!(median(&mut []), 0.0);
    }
}
