//! The happens-before race tracker: cross-stream accesses must be ordered by events.

mod common;

use common::*;
use solder_gpu_runtime::{GpuBackend, GpuError, StreamId};

const S0: StreamId = StreamId(0);

#[test]
fn write_then_read_on_another_stream_without_event_is_a_race() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    let out = upload(&mut gpu, &[5.0; 4]);
    fill_on(&mut gpu, s1, buf, 4, 1).unwrap();
    let err = copy_on(&mut gpu, S0, buf, out, 4).unwrap_err();
    match &err {
        GpuError::Race {
            current,
            stream: 0,
            previous,
            previous_stream: 1,
            start,
            end,
        } => {
            assert_eq!(current, "kernel test::copy arg 0");
            assert_eq!(previous, "kernel test::fill arg 0");
            assert_eq!((*start, *end), (buf.0, buf.0 + 16));
        }
        other => panic!("expected a race, got {other}"),
    }
    // The racing launch did not run.
    assert_eq!(download(&mut gpu, out, 4), vec![5.0; 4]);
}

#[test]
fn write_then_read_ordered_by_an_event_is_fine() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let event = gpu.create_event().unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    let out = gpu.alloc(bytes(4)).unwrap();
    fill_on(&mut gpu, s1, buf, 4, 2).unwrap();
    gpu.record_event(event, s1).unwrap();
    gpu.wait_event(S0, event).unwrap();
    copy_on(&mut gpu, S0, buf, out, 4).unwrap();
    assert_eq!(download(&mut gpu, out, 4), vec![2.0; 4]);
}

#[test]
fn an_event_recorded_before_the_write_does_not_order_it() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let event = gpu.create_event().unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    let out = gpu.alloc(bytes(4)).unwrap();
    gpu.record_event(event, s1).unwrap();
    fill_on(&mut gpu, s1, buf, 4, 2).unwrap();
    gpu.wait_event(S0, event).unwrap();
    assert!(matches!(
        copy_on(&mut gpu, S0, buf, out, 4),
        Err(GpuError::Race { .. })
    ));
}

#[test]
fn two_reads_on_different_streams_are_fine() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let src = upload(&mut gpu, &[3.0; 4]);
    let (a, b) = (gpu.alloc(bytes(4)).unwrap(), gpu.alloc(bytes(4)).unwrap());
    copy_on(&mut gpu, s1, src, a, 4).unwrap();
    copy_on(&mut gpu, S0, src, b, 4).unwrap();
    assert_eq!(download(&mut gpu, b, 4), vec![3.0; 4]);
}

#[test]
fn read_then_write_on_another_stream_is_a_race() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let src = upload(&mut gpu, &[3.0; 4]);
    let out = gpu.alloc(bytes(4)).unwrap();
    copy_on(&mut gpu, S0, src, out, 4).unwrap();
    assert!(matches!(
        fill_on(&mut gpu, s1, src, 4, 1),
        Err(GpuError::Race {
            stream: 1,
            previous_stream: 0,
            ..
        })
    ));
    // Disjoint bytes of the same allocation do not race.
    fill_on(&mut gpu, s1, src.offset(bytes(4)), 0, 1).unwrap();
}

#[test]
fn disjoint_ranges_of_one_allocation_do_not_race() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let arena = gpu.alloc(bytes(8)).unwrap();
    fill_on(&mut gpu, s1, arena, 4, 1).unwrap();
    fill_on(&mut gpu, S0, arena.offset(bytes(4)), 4, 2).unwrap();
    let err = fill_on(&mut gpu, S0, arena.offset(bytes(3)), 1, 2).unwrap_err();
    assert!(matches!(err, GpuError::Race { .. }), "{err}");
}

#[test]
fn synchronize_orders_everything() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    let out = gpu.alloc(bytes(4)).unwrap();
    fill_on(&mut gpu, s1, buf, 4, 4).unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(gpu.pending_accesses(), 0);
    copy_on(&mut gpu, S0, buf, out, 4).unwrap();
}

#[test]
fn async_copy_is_a_write_on_its_stream() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let buf = gpu.alloc(bytes(1)).unwrap();
    let out = gpu.alloc(bytes(1)).unwrap();
    gpu.copy_h2d_async(s1, buf, &1.5f32.to_le_bytes()).unwrap();
    let err = copy_on(&mut gpu, S0, buf, out, 1).unwrap_err();
    assert!(
        matches!(&err, GpuError::Race { previous, .. } if previous == "copy_h2d_async"),
        "{err}"
    );
    // Ordered on its own stream, it is fine.
    copy_on(&mut gpu, s1, buf, out, 1).unwrap();
    assert_eq!(download(&mut gpu, out, 1), vec![1.5]);
}

/// A device-to-device copy queued on a stream reads its source and writes its destination
/// there: unordered against another stream's writer it is a race and copies nothing; ordered on
/// the writer's stream it copies; overlapping ranges and a capturing stream are refused.
#[test]
fn async_device_copy_reads_and_writes_on_its_stream() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let src = upload(&mut gpu, &[2.5; 4]);
    let dst = upload(&mut gpu, &[0.0; 4]);
    fill_on(&mut gpu, s1, src, 4, 7).unwrap();
    let err = gpu.copy_d2d_async(S0, dst, src, bytes(4)).unwrap_err();
    assert!(
        matches!(&err, GpuError::Race { current, .. } if current == "copy_d2d_async"),
        "{err}"
    );
    assert_eq!(download(&mut gpu, dst, 4), vec![0.0; 4]);
    gpu.copy_d2d_async(s1, dst, src, bytes(4)).unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(download(&mut gpu, dst, 4), vec![7.0; 4]);
    // Overlapping halves of one buffer.
    let half = solder_gpu_runtime::DevicePtr(src.0 + bytes(2) as u64);
    let err = gpu.copy_d2d_async(S0, half, src, bytes(4)).unwrap_err();
    assert!(matches!(err, GpuError::OutOfRange { .. }), "{err}");
    gpu.begin_capture(s1).unwrap();
    let err = gpu.copy_d2d_async(s1, dst, src, bytes(4)).unwrap_err();
    assert!(matches!(err, GpuError::Capture(_)), "{err}");
}

/// A memset queued on a stream writes there: unordered against another stream's reader of the
/// range it is a race and writes nothing; ordered, it writes.
#[test]
fn async_memset_writes_on_its_stream() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let src = upload(&mut gpu, &[2.5; 4]);
    let out = gpu.alloc(bytes(4)).unwrap();
    copy_on(&mut gpu, s1, src, out, 4).unwrap();
    let err = gpu.memset_async(S0, src, 0, bytes(4)).unwrap_err();
    assert!(
        matches!(&err, GpuError::Race { current, .. } if current == "memset_async"),
        "{err}"
    );
    assert_eq!(download(&mut gpu, src, 4), vec![2.5; 4]);
    gpu.memset_async(s1, src, 0, bytes(4)).unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(download(&mut gpu, src, 4), vec![0.0; 4]);
    assert_eq!(download(&mut gpu, out, 4), vec![2.5; 4]);
}

#[test]
fn a_single_stream_keeps_no_history() {
    let mut gpu = backend();
    let a = upload(&mut gpu, &[1.0; 16]);
    let b = upload(&mut gpu, &[2.0; 16]);
    let out = gpu.alloc(bytes(16)).unwrap();
    for _ in 0..100 {
        add_on(&mut gpu, S0, a, b, out, 16).unwrap();
    }
    assert_eq!(gpu.pending_accesses(), 0);
}

#[test]
fn history_seen_by_every_stream_is_pruned() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let (to_s1, to_s0) = (gpu.create_event().unwrap(), gpu.create_event().unwrap());
    let a = upload(&mut gpu, &[1.0; 16]);
    let out = gpu.alloc(bytes(16)).unwrap();
    let side = gpu.alloc(bytes(16)).unwrap();
    for _ in 0..50 {
        gpu.record_event(to_s1, S0).unwrap();
        gpu.wait_event(s1, to_s1).unwrap();
        copy_on(&mut gpu, s1, a, side, 16).unwrap();
        gpu.record_event(to_s0, s1).unwrap();
        gpu.wait_event(S0, to_s0).unwrap();
        add_on(&mut gpu, S0, a, side, out, 16).unwrap();
    }
    assert!(
        gpu.pending_accesses() <= 8,
        "{} accesses kept",
        gpu.pending_accesses()
    );
}

#[test]
fn async_readback_is_a_read_on_its_stream() {
    let mut gpu = backend();
    let s1 = gpu.create_stream().unwrap();
    let buf = gpu.alloc(bytes(4)).unwrap();
    fill_on(&mut gpu, S0, buf, 4, 2).unwrap();
    // Reading what stream 0 wrote, unordered, is a race; after an event it is not.
    let err = gpu.copy_d2h_async(s1, buf, 16).unwrap_err();
    assert!(
        matches!(err, GpuError::Race { ref current, stream: 1, .. } if current == "copy_d2h_async"),
        "{err}"
    );
    let written = gpu.create_event().unwrap();
    gpu.record_event(written, S0).unwrap();
    gpu.wait_event(s1, written).unwrap();
    let readback = gpu.copy_d2h_async(s1, buf, 16).unwrap();
    // Stream 0 writing the bytes again before the read is ordered is the other race.
    let err = fill_on(&mut gpu, S0, buf, 4, 3).unwrap_err();
    assert!(matches!(err, GpuError::Race { stream: 0, .. }), "{err}");
    let read = gpu.create_event().unwrap();
    gpu.record_event(read, s1).unwrap();
    gpu.wait_event(S0, read).unwrap();
    fill_on(&mut gpu, S0, buf, 4, 3).unwrap();
    // The readback holds the bytes at its point in stream order.
    let mut got = [0u8; 16];
    gpu.take_readback(readback, &mut got).unwrap();
    assert_eq!(got[..], [2.0f32.to_le_bytes(); 4].concat()[..]);
}
