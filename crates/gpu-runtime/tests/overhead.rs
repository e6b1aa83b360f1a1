//! Cost of the launch checks (run with `--release -- --ignored --nocapture`).

mod common;

use std::time::Instant;

use common::*;
use solder_gpu_runtime::{
    CpuBackend, GpuBackend, GpuError, KernelArg, ModuleImage, StreamId, TwinCtx,
};

fn six_args(_: &TwinCtx<'_>) -> Result<(), GpuError> {
    Ok(())
}

/// Launches `steps` decode-like steps of 300 launches with 5 buffer arguments each; with
/// `fork_join`, every third launch runs on stream 1 and the streams join each step.
fn ns_per_launch(gpu: &mut CpuBackend, extra_stream: bool, fork_join: bool) -> f64 {
    gpu.register_twin("bench::six", six_args).unwrap();
    gpu.load_module(&ModuleImage {
        name: "bench",
        ptx: None,
        cubin: None,
    })
    .unwrap();
    let kernel = gpu.kernel("bench::six").unwrap();
    let arena = gpu.alloc(1 << 20).unwrap();
    let weights = gpu.alloc(1 << 20).unwrap();
    let s1 = if extra_stream {
        gpu.create_stream().unwrap()
    } else {
        StreamId(0)
    };
    let (fork, join) = (gpu.create_event().unwrap(), gpu.create_event().unwrap());
    let (steps, launches_per_step) = (100, 300);
    let start = Instant::now();
    for _ in 0..steps {
        for i in 0..launches_per_step {
            let stream = if fork_join && i % 3 == 0 {
                s1
            } else {
                StreamId(0)
            };
            let slot = (i % 50) * 4096;
            let side = if stream == s1 { 512 * 1024 } else { 0 };
            let args = [
                KernelArg::read(weights.offset(slot), 4096),
                KernelArg::read(weights.offset(slot + 8192), 4096),
                KernelArg::read(arena.offset(side + slot), 1024),
                KernelArg::read(arena.offset(side + slot + 1024), 1024),
                KernelArg::write(arena.offset(side + slot + 2048), 1024),
                KernelArg::U32(7),
            ];
            gpu.launch(stream, kernel, &cfg(), &args).unwrap();
        }
        if fork_join {
            gpu.record_event(join, s1).unwrap();
            gpu.wait_event(StreamId(0), join).unwrap();
            gpu.record_event(fork, StreamId(0)).unwrap();
            gpu.wait_event(s1, fork).unwrap();
        }
    }
    start.elapsed().as_nanos() as f64 / (steps * launches_per_step) as f64
}

#[test]
#[ignore = "measurement, not a check"]
fn launch_overhead() {
    for (what, extra_stream, fork_join) in [
        ("one stream", false, false),
        ("one busy, one idle stream", true, false),
        ("fork/join", true, true),
    ] {
        let mut gpu = backend();
        let ns = ns_per_launch(&mut gpu, extra_stream, fork_join);
        eprintln!(
            "{what}: {ns:.0} ns per launch, {} accesses held",
            gpu.pending_accesses()
        );
    }
}
