//! Graph capture and replay on the CPU backend.

mod common;

use common::*;
use solder_gpu_runtime::{CpuBackend, DevicePtr, GpuBackend, GpuError, KernelArg, StreamId};

const S0: StreamId = StreamId(0);

/// out = (a + b) * 2, then c = out + a.
fn program(
    gpu: &mut CpuBackend,
    stream: StreamId,
    a: DevicePtr,
    b: DevicePtr,
    out: DevicePtr,
    c: DevicePtr,
) {
    add_on(gpu, stream, a, b, out, 4).unwrap();
    let scale = k(gpu, "scale");
    gpu.launch(
        stream,
        scale,
        &cfg(),
        &[KernelArg::read_write(out, bytes(4)), KernelArg::F32(2.0)],
    )
    .unwrap();
    add_on(gpu, stream, out, a, c, 4).unwrap();
}

#[test]
fn replay_gives_the_eager_results() {
    let mut gpu = backend();
    let a = upload(&mut gpu, &[1.0, 2.0, 3.0, 4.0]);
    let b = upload(&mut gpu, &[10.0, 20.0, 30.0, 40.0]);
    let (out, c) = (gpu.alloc(bytes(4)).unwrap(), gpu.alloc(bytes(4)).unwrap());
    program(&mut gpu, S0, a, b, out, c);
    let eager = (download(&mut gpu, out, 4), download(&mut gpu, c, 4));

    let (out2, c2) = (gpu.alloc(bytes(4)).unwrap(), gpu.alloc(bytes(4)).unwrap());
    gpu.begin_capture(S0).unwrap();
    program(&mut gpu, S0, a, b, out2, c2);
    let graph = gpu.end_capture(S0).unwrap();
    // Capture records; nothing ran.
    assert!(download(&mut gpu, c2, 4).iter().all(|x| x.is_nan()));
    let exec = gpu.instantiate(graph).unwrap();
    gpu.launch_graph(exec, S0).unwrap();
    assert_eq!(
        (download(&mut gpu, out2, 4), download(&mut gpu, c2, 4)),
        eager
    );
    // A second replay sees new inputs.
    let new_a = [0.5f32; 4]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect::<Vec<_>>();
    gpu.copy_h2d(a, &new_a).unwrap();
    gpu.launch_graph(exec, S0).unwrap();
    assert_eq!(download(&mut gpu, c2, 4), vec![21.5, 41.5, 61.5, 81.5]);
}

#[test]
fn fork_join_capture_records_both_streams_and_replays() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let (fork, join) = (gpu.create_event().unwrap(), gpu.create_event().unwrap());
    let a = upload(&mut gpu, &[1.0; 4]);
    let (left, right, sum) = (
        gpu.alloc(bytes(4)).unwrap(),
        gpu.alloc(bytes(4)).unwrap(),
        gpu.alloc(bytes(4)).unwrap(),
    );

    gpu.begin_capture(S0).unwrap();
    gpu.record_event(fork, S0).unwrap();
    gpu.wait_event(s1, fork).unwrap();
    fill_on(&mut gpu, s1, right, 4, 7).unwrap();
    copy_on(&mut gpu, S0, a, left, 4).unwrap();
    gpu.record_event(join, s1).unwrap();
    gpu.wait_event(S0, join).unwrap();
    add_on(&mut gpu, S0, left, right, sum, 4).unwrap();
    let graph = gpu.end_capture(S0).unwrap();
    assert!(
        download(&mut gpu, right, 4).iter().all(|x| x.is_nan()),
        "stream 1's launch ran during capture"
    );

    let exec = gpu.instantiate(graph).unwrap();
    gpu.launch_graph(exec, S0).unwrap();
    assert_eq!(download(&mut gpu, sum, 4), vec![8.0; 4]);
    // After capture stream 1 runs eagerly again.
    fill_on(&mut gpu, s1, right, 4, 1).unwrap();
    assert_eq!(download(&mut gpu, right, 4), vec![1.0; 4]);
}

#[test]
fn replay_checks_races_against_eager_work() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let (src, dst) = (upload(&mut gpu, &[1.0; 4]), gpu.alloc(bytes(4)).unwrap());
    gpu.begin_capture(S0).unwrap();
    copy_on(&mut gpu, S0, src, dst, 4).unwrap();
    let exec = gpu
        .end_capture(S0)
        .and_then(|graph| gpu.instantiate(graph))
        .unwrap();
    fill_on(&mut gpu, s1, src, 4, 3).unwrap();
    assert!(matches!(
        gpu.launch_graph(exec, S0),
        Err(GpuError::Race { .. })
    ));
}

#[test]
fn unjoined_stream_at_end_capture_is_refused() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let fork = gpu.create_event().unwrap();
    let out = gpu.alloc(bytes(4)).unwrap();
    gpu.begin_capture(S0).unwrap();
    gpu.record_event(fork, S0).unwrap();
    gpu.wait_event(s1, fork).unwrap();
    fill_on(&mut gpu, s1, out, 4, 1).unwrap();
    let err = gpu.end_capture(S0).unwrap_err();
    assert!(
        matches!(&err, GpuError::Capture(message) if message.contains("unjoined stream 1")),
        "{err}"
    );
    // The capture is over either way: both streams run eagerly again.
    fill_on(&mut gpu, s1, out, 4, 2).unwrap();
    assert!(gpu.end_capture(S0).is_err());
}

#[test]
fn copy_or_synchronize_during_capture_is_refused() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let buf = gpu.alloc(16).unwrap();
    gpu.begin_capture(S0).unwrap();
    assert!(matches!(
        gpu.copy_h2d(buf, &[0; 4]),
        Err(GpuError::Capture(_))
    ));
    let mut host = [0u8; 4];
    assert!(matches!(
        gpu.copy_d2h(buf, &mut host),
        Err(GpuError::Capture(_))
    ));
    assert!(matches!(gpu.memset(buf, 0, 4), Err(GpuError::Capture(_))));
    assert!(matches!(
        gpu.copy_h2d_async(S0, buf, &[0; 4]),
        Err(GpuError::Capture(_))
    ));
    assert!(matches!(
        gpu.copy_d2h_async(S0, buf, 4),
        Err(GpuError::Capture(_))
    ));
    assert!(matches!(gpu.synchronize(), Err(GpuError::Capture(_))));
    // Another stream, not in the capture, may still copy asynchronously.
    gpu.copy_h2d_async(s1, buf, &[0; 4]).unwrap();
    gpu.end_capture(S0).unwrap();
}

#[test]
fn capture_state_errors() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    assert!(matches!(gpu.end_capture(S0), Err(GpuError::Capture(_))));
    gpu.begin_capture(S0).unwrap();
    assert!(matches!(gpu.begin_capture(S0), Err(GpuError::Capture(_))));
    // An event recorded outside the capture cannot order captured work.
    let outside = gpu.create_event().unwrap();
    gpu.record_event(outside, s1).unwrap();
    assert!(matches!(
        gpu.wait_event(S0, outside),
        Err(GpuError::Capture(_))
    ));
    gpu.end_capture(S0).unwrap();
}

#[test]
fn memory_captured_by_a_live_graph_cannot_be_freed() {
    let mut gpu = backend();
    let out = gpu.alloc(bytes(4)).unwrap();
    let other = gpu.alloc(bytes(4)).unwrap();
    gpu.begin_capture(S0).unwrap();
    fill_on(&mut gpu, S0, out, 4, 1).unwrap();
    assert!(
        matches!(gpu.free(out), Err(GpuError::CapturedByLiveGraph { .. })),
        "freed during capture"
    );
    let graph = gpu.end_capture(S0).unwrap();
    let exec = gpu.instantiate(graph).unwrap();
    assert!(matches!(gpu.free(out), Err(GpuError::CapturedByLiveGraph { ptr }) if ptr == out.0));
    gpu.free(other).unwrap();
    gpu.destroy_graph(graph).unwrap();
    // The exec keeps it alive on its own.
    assert!(matches!(
        gpu.free(out),
        Err(GpuError::CapturedByLiveGraph { .. })
    ));
    gpu.launch_graph(exec, S0).unwrap();
    assert_eq!(download(&mut gpu, out, 4), vec![1.0; 4]);
    gpu.destroy_graph_exec(exec).unwrap();
    gpu.free(out).unwrap();
    assert!(matches!(
        gpu.destroy_graph(graph),
        Err(GpuError::UnknownHandle { .. })
    ));
}

#[test]
fn replay_reports_an_unordered_access_inside_the_graph() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let (fork, join) = (gpu.create_event().unwrap(), gpu.create_event().unwrap());
    let (shared, out) = (gpu.alloc(bytes(4)).unwrap(), gpu.alloc(bytes(4)).unwrap());
    gpu.begin_capture(S0).unwrap();
    gpu.record_event(fork, S0).unwrap();
    gpu.wait_event(s1, fork).unwrap();
    fill_on(&mut gpu, s1, shared, 4, 1).unwrap();
    // Reads what stream 1 writes before the join orders it.
    copy_on(&mut gpu, S0, shared, out, 4).unwrap();
    gpu.record_event(join, s1).unwrap();
    gpu.wait_event(S0, join).unwrap();
    let exec = gpu
        .end_capture(S0)
        .and_then(|graph| gpu.instantiate(graph))
        .unwrap();
    let err = gpu.launch_graph(exec, S0).unwrap_err();
    assert!(
        matches!(
            err,
            GpuError::Race {
                stream: 0,
                previous_stream: 1,
                ..
            }
        ),
        "{err}"
    );
}
