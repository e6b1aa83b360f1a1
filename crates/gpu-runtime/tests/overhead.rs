//! Cost of the launch checks: what the race tracker holds stays bounded however long a run
//! goes (a history that grew with the steps would make every launch's check slower and slower),
//! and the time per launch is printed (run with `--release -- --nocapture` to read it; it is a
//! figure, not asserted on).

mod common;

use std::time::Instant;

use common::*;
use solder_gpu_runtime::{
    CpuBackend, GpuBackend, GpuError, KernelArg, ModuleImage, StreamId, TwinCtx,
};

/// Launches per decode-like step.
const LAUNCHES_PER_STEP: usize = 300;

fn six_args(_: &TwinCtx<'_>) -> Result<(), GpuError> {
    Ok(())
}

/// Launches `steps` decode-like steps of 300 launches with 5 buffer arguments each; with
/// `fork_join`, every third launch runs on stream 1 and the streams join each step.
fn ns_per_launch(gpu: &mut CpuBackend, steps: usize, extra_stream: bool, fork_join: bool) -> f64 {
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
    let start = Instant::now();
    for _ in 0..steps {
        for i in 0..LAUNCHES_PER_STEP {
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
    start.elapsed().as_nanos() as f64 / (steps * LAUNCHES_PER_STEP) as f64
}

#[test]
fn the_checks_hold_a_bounded_history_however_many_steps_run() {
    for (what, extra_stream, fork_join) in [
        ("one stream", false, false),
        ("one busy, one idle stream", true, false),
        ("fork/join", true, true),
    ] {
        let held: Vec<usize> = [4, 12, 36]
            .into_iter()
            .map(|steps| {
                let mut gpu = backend();
                let ns = ns_per_launch(&mut gpu, steps, extra_stream, fork_join);
                eprintln!(
                    "{what}, {steps} steps: {ns:.0} ns per launch, {} accesses held",
                    gpu.pending_accesses()
                );
                gpu.pending_accesses()
            })
            .collect();
        // A history kept whole would hold up to 36 steps' 10,800 launches; a pruned one about
        // a step's worth whatever the count.
        assert!(
            held.iter().all(|&n| n <= 3 * LAUNCHES_PER_STEP),
            "{what}: the race tracker's history grows with the steps: {held:?} accesses held \
             after 4, 12 and 36 steps of {LAUNCHES_PER_STEP} launches"
        );
        if !extra_stream {
            assert_eq!(held[0], 0, "{what}: one stream needs no history");
        }
    }
}
