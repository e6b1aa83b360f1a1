//! `LaunchOrder::Programmatic` on the CPU backend and through `Checked`: accepted, counted,
//! run in stream order with the serial launch's bytes, and checked like any launch.

mod common;

use common::{backend, bytes, cfg, download, k, upload};
use solder_gpu_runtime::{Checked, GpuBackend, GpuError, KernelArg, LaunchOrder, StreamId};

const S0: StreamId = StreamId(0);

/// fill(a, 3) → copy(a → b) → add(a, b → c), each launched with `order`; returns c.
fn chain<G: GpuBackend>(
    gpu: &mut G,
    kernels: [solder_gpu_runtime::KernelId; 3],
    order: LaunchOrder,
    bufs: [solder_gpu_runtime::DevicePtr; 3],
) -> Result<(), GpuError> {
    let [fill, copy, add] = kernels;
    let [a, b, c] = bufs;
    let n = bytes(8);
    gpu.launch_ordered(
        S0,
        fill,
        &cfg(),
        &[KernelArg::write(a, n), KernelArg::U32(3)],
        order,
    )?;
    gpu.launch_ordered(
        S0,
        copy,
        &cfg(),
        &[KernelArg::read(a, n), KernelArg::write(b, n)],
        order,
    )?;
    gpu.launch_ordered(
        S0,
        add,
        &cfg(),
        &[
            KernelArg::read(a, n),
            KernelArg::read(b, n),
            KernelArg::write(c, n),
        ],
        order,
    )
}

#[test]
fn programmatic_launches_run_in_stream_order_with_the_serial_bytes() {
    let mut gpu = backend();
    let kernels = [k(&gpu, "fill"), k(&gpu, "copy"), k(&gpu, "add")];
    let serial = [0; 3].map(|_| upload(&mut gpu, &[0.0; 8]));
    let programmatic = [0; 3].map(|_| upload(&mut gpu, &[0.0; 8]));
    chain(&mut gpu, kernels, LaunchOrder::Serial, serial).unwrap();
    assert_eq!(gpu.programmatic_launches(), 0);
    chain(&mut gpu, kernels, LaunchOrder::Programmatic, programmatic).unwrap();
    assert_eq!(gpu.programmatic_launches(), 3);
    assert_eq!(download(&mut gpu, programmatic[2], 8), vec![6.0; 8]);
    assert_eq!(
        download(&mut gpu, serial[2], 8),
        download(&mut gpu, programmatic[2], 8)
    );

    // Captured: counted when submitted, replayed in order.
    let out = programmatic;
    gpu.memset(out[2], 0, bytes(8)).unwrap();
    gpu.begin_capture(S0).unwrap();
    chain(&mut gpu, kernels, LaunchOrder::Programmatic, out).unwrap();
    let graph = gpu.end_capture(S0).unwrap();
    assert_eq!(gpu.programmatic_launches(), 6);
    let exec = gpu.instantiate(graph).unwrap();
    gpu.launch_graph(exec, S0).unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(download(&mut gpu, out[2], 8), vec![6.0; 8]);
    gpu.destroy_graph_exec(exec).unwrap();
    gpu.destroy_graph(graph).unwrap();
}

#[test]
fn checked_forwards_the_order_and_checks_a_programmatic_launch_like_any() {
    let mut gpu = Checked::new(backend());
    let fill = gpu.kernel("test::fill").unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    let args = [KernelArg::write(buf, bytes(4)), KernelArg::U32(1)];
    gpu.launch_ordered(S0, fill, &cfg(), &args, LaunchOrder::Programmatic)
        .unwrap();
    assert_eq!(gpu.inner().programmatic_launches(), 1);
    let past = [KernelArg::write(buf, bytes(5)), KernelArg::U32(1)];
    match gpu.launch_ordered(S0, fill, &cfg(), &past, LaunchOrder::Programmatic) {
        Err(GpuError::OutOfRange { what, .. }) => assert_eq!(what, "kernel `test::fill` arg 0"),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    // The refused launch never reached the inner backend.
    assert_eq!(gpu.inner().programmatic_launches(), 1);
    gpu.launch(S0, fill, &cfg(), &args).unwrap();
    assert_eq!(gpu.inner().programmatic_launches(), 1);
}
