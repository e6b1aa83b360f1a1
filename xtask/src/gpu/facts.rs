//! `gpu-facts` (hidden): what the binary carries (its kernel modules' PTX) and what the driver
//! makes of it (device facts, the time to load and JIT-compile every module, kernels found).

pub fn run(argv: Vec<String>) -> Result<(), String> {
    if !argv.is_empty() {
        return Err("usage: solder gpu-facts".into());
    }
    #[cfg(feature = "cuda")]
    {
        use solder_gpu_runtime::GpuBackend;

        let mut total = 0;
        for (module, ptx) in solder_model_layers::kernels::ptx_modules() {
            let entries = solder_gpu_runtime::cuda::ptx_entries(ptx).len();
            total += ptx.len();
            println!(
                "embedded {module}.ptx: {} bytes, {entries} kernels",
                ptx.len()
            );
        }
        println!(
            "embedded PTX: {} modules, {total} bytes; cuda driver library loads: {}",
            solder_model_layers::kernels::ptx_modules().len(),
            solder_gpu_runtime::cuda::driver_library_loads()
        );
        let started = std::time::Instant::now();
        let backend = super::cuda_backend()?;
        println!("{}", super::describe(&backend.facts()));
        let origins = backend.module_origins();
        for (module, origin) in &origins {
            println!("module {module}: {}", origin.as_str());
        }
        let from_cubin = origins
            .iter()
            .filter(|(_, o)| *o == solder_gpu_runtime::cuda::ModuleOrigin::Cubin)
            .count();
        println!(
            "modules loaded ({from_cubin} of {} from cubins, the rest JIT-compiled): {} kernels in {:.2} s",
            origins.len(),
            backend.kernel_names().len(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    {
        super::needs_cuda("gpu-facts")
    }
}
