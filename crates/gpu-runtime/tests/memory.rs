//! The CPU backend's memory: addresses, poison, range checks on copies and launches.

mod common;

use common::*;
use solder_gpu_runtime::{DevicePtr, GpuBackend, GpuError, KernelArg, StreamId};

const S0: StreamId = StreamId(0);

#[test]
fn addresses_are_aligned_nonzero_unique_and_gapped() {
    let mut gpu = backend();
    let mut previous_end = 0u64;
    let mut seen = Vec::new();
    for bytes in [0usize, 1, 255, 256, 1000, 0, 4096] {
        let ptr = gpu.alloc(bytes).unwrap();
        assert!(!ptr.is_null());
        assert_eq!(ptr.0 % 256, 0, "{ptr:?} not 256-aligned");
        assert!(ptr.0 > previous_end, "no gap after the previous allocation");
        previous_end = ptr.0 + bytes as u64;
        seen.push(ptr);
    }
    // Freed addresses are never handed out again.
    for ptr in &seen {
        gpu.free(*ptr).unwrap();
    }
    let again = gpu.alloc(256).unwrap();
    assert!(!seen.contains(&again));
    assert_eq!(gpu.live_allocations(), 1);
}

#[test]
fn fresh_memory_is_poisoned() {
    let mut gpu = backend();
    let ptr = gpu.alloc(64).unwrap();
    let mut raw = vec![0u8; 64];
    gpu.copy_d2h(ptr, &mut raw).unwrap();
    assert!(raw.iter().all(|b| *b == 0xFF));
    assert!(download(&mut gpu, ptr, 16).iter().all(|x| x.is_nan()));
}

#[test]
fn copying_an_unwritten_buffer_yields_nan() {
    let mut gpu = backend();
    let unwritten = gpu.alloc(bytes(8)).unwrap();
    let out = upload(&mut gpu, &[0.0; 8]);
    copy_on(&mut gpu, S0, unwritten, out, 8).unwrap();
    assert!(download(&mut gpu, out, 8).iter().all(|x| x.is_nan()));
}

#[test]
fn free_only_at_the_start_of_a_live_allocation() {
    let mut gpu = backend();
    let ptr = gpu.alloc(512).unwrap();
    assert!(matches!(
        gpu.free(ptr.offset(4)),
        Err(GpuError::NotAnAllocation { call: "free", .. })
    ));
    gpu.free(ptr).unwrap();
    assert!(matches!(
        gpu.free(ptr),
        Err(GpuError::NotAnAllocation { .. })
    ));
    assert!(matches!(
        gpu.free(DevicePtr::NULL),
        Err(GpuError::NotAnAllocation { .. })
    ));
}

#[test]
fn copies_and_memset_are_range_checked() {
    let mut gpu = backend();
    let ptr = gpu.alloc(16).unwrap();
    let err = gpu.copy_h2d(ptr, &[0u8; 17]).unwrap_err();
    assert!(
        matches!(&err, GpuError::OutOfRange { what, .. } if what == "copy_h2d"),
        "{err}"
    );
    let mut out = [0u8; 8];
    assert!(matches!(
        gpu.copy_d2h(ptr.offset(9), &mut out),
        Err(GpuError::OutOfRange { .. })
    ));
    assert!(matches!(
        gpu.memset(ptr, 0, 17),
        Err(GpuError::OutOfRange { .. })
    ));
    assert!(matches!(
        gpu.copy_d2d(ptr, ptr.offset(8), 9),
        Err(GpuError::OutOfRange { .. })
    ));
    assert!(matches!(
        gpu.copy_h2d_async(S0, ptr.offset(16), &[1]),
        Err(GpuError::OutOfRange { .. })
    ));
    // In range they work, and memset/d2d move the right bytes.
    gpu.memset(ptr, 7, 16).unwrap();
    gpu.copy_h2d(ptr, &[1, 2, 3, 4]).unwrap();
    gpu.copy_d2d(ptr.offset(8), ptr, 4).unwrap();
    let mut all = [0u8; 16];
    gpu.copy_d2h(ptr, &mut all).unwrap();
    assert_eq!(all, [1, 2, 3, 4, 7, 7, 7, 7, 1, 2, 3, 4, 7, 7, 7, 7]);
}

#[test]
fn launch_one_byte_past_the_end_is_refused() {
    let mut gpu = backend();
    let out = gpu.alloc(bytes(4)).unwrap();
    let kernel = k(&gpu, "fill");
    let err = gpu
        .launch(
            S0,
            kernel,
            &cfg(),
            &[
                KernelArg::write(out.offset(4), bytes(3) + 1),
                KernelArg::U32(1),
            ],
        )
        .unwrap_err();
    match &err {
        GpuError::OutOfRange { what, .. } => assert_eq!(what, "kernel `test::fill` arg 0"),
        other => panic!("expected OutOfRange, got {other}"),
    }
    // The last valid range runs.
    fill_on(&mut gpu, S0, out, 4, 3).unwrap();
}

#[test]
fn launch_on_a_freed_allocation_is_refused() {
    let mut gpu = backend();
    let out = gpu.alloc(bytes(4)).unwrap();
    gpu.free(out).unwrap();
    assert!(matches!(
        fill_on(&mut gpu, S0, out, 4, 1),
        Err(GpuError::OutOfRange { .. })
    ));
}

#[test]
fn launch_into_the_gap_between_allocations_is_refused() {
    let mut gpu = backend();
    let first = gpu.alloc(bytes(4)).unwrap();
    let _second = gpu.alloc(bytes(4)).unwrap();
    let in_gap = first.offset(bytes(4) + 16);
    assert!(matches!(
        fill_on(&mut gpu, S0, in_gap, 1, 1),
        Err(GpuError::OutOfRange { .. })
    ));
    assert!(matches!(
        fill_on(&mut gpu, S0, DevicePtr::NULL, 1, 1),
        Err(GpuError::OutOfRange { .. })
    ));
}

#[test]
fn zero_byte_buffers_may_point_anywhere_inside() {
    let mut gpu = backend();
    let empty = gpu.alloc(0).unwrap();
    let out = gpu.alloc(bytes(4)).unwrap();
    fill_on(&mut gpu, S0, empty, 0, 1).unwrap();
    fill_on(&mut gpu, S0, out.offset(bytes(4)), 0, 1).unwrap();
    // A zero-byte read inside a written range does not alias it.
    let kernel = k(&gpu, "copy");
    gpu.launch(
        S0,
        kernel,
        &cfg(),
        &[
            KernelArg::read(out.offset(4), 0),
            KernelArg::write(empty, 0),
        ],
    )
    .unwrap();
}

#[test]
fn async_readbacks_are_checked_and_end_once() {
    let mut gpu = backend();
    let buf = upload(&mut gpu, &[1.0, 2.0, 3.0, 4.0]);
    let readback = gpu.copy_d2h_async(S0, buf.offset(4), 8).unwrap();
    assert!(gpu.readback_ready(readback).unwrap());
    // The destination must be the copy's length; a refused take keeps the readback.
    let mut short = [0u8; 4];
    assert!(matches!(
        gpu.take_readback(readback, &mut short),
        Err(GpuError::ReadbackLength {
            asked: 4,
            holds: 8,
            ..
        })
    ));
    let mut got = [0u8; 8];
    gpu.take_readback(readback, &mut got).unwrap();
    assert_eq!(
        got[..],
        [2.0f32.to_le_bytes(), 3.0f32.to_le_bytes()].concat()[..]
    );
    // Taken once: the id is gone, as is a released one's.
    assert!(matches!(
        gpu.take_readback(readback, &mut got),
        Err(GpuError::UnknownHandle {
            what: "readback",
            ..
        })
    ));
    let released = gpu.copy_d2h_async(S0, buf, 16).unwrap();
    assert_ne!(released, readback, "ids are not reused");
    assert_eq!(gpu.live_readbacks(), 1);
    gpu.release_readback(released).unwrap();
    assert_eq!(gpu.live_readbacks(), 0);
    assert!(gpu.readback_ready(released).is_err());
    // Outside an allocation, nothing is queued.
    assert!(matches!(
        gpu.copy_d2h_async(S0, buf.offset(8), 16),
        Err(GpuError::OutOfRange { .. })
    ));
    assert!(matches!(
        gpu.copy_d2h_async(StreamId(7), buf, 4),
        Err(GpuError::UnknownHandle { what: "stream", .. })
    ));
    assert_eq!(gpu.live_readbacks(), 0);
}
