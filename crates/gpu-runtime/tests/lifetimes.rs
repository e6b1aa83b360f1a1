//! The CPU backend's identities and handle lifetimes: each backend has its own
//! `instance_id`; destroyed streams and events are refused afterwards (stream 0 cannot be
//! destroyed); `fail_call` fails the chosen call once, having done nothing.

mod common;

use common::*;
use solder_gpu_runtime::{CpuBackend, GpuBackend, GpuError, StreamId};

#[test]
fn every_backend_has_its_own_instance_id() {
    let (a, b) = (CpuBackend::new(), CpuBackend::with_threads(1));
    assert_ne!(a.instance_id(), b.instance_id());
    assert_eq!(a.instance_id(), a.instance_id());
}

#[test]
fn destroyed_streams_and_events_are_refused_afterwards() {
    let mut gpu = backend();
    let side = gpu.create_stream().unwrap();
    let event = gpu.create_event().unwrap();
    assert_eq!((gpu.live_streams(), gpu.live_events()), (2, 1));
    gpu.record_event(event, side).unwrap();
    gpu.destroy_event(event).unwrap();
    gpu.destroy_stream(side).unwrap();
    assert_eq!((gpu.live_streams(), gpu.live_events()), (1, 0));
    for refused in [
        gpu.record_event(event, StreamId(0)),
        gpu.wait_event(StreamId(0), event),
        gpu.destroy_event(event),
        gpu.destroy_stream(side),
        gpu.synchronize().and_then(|()| gpu.begin_capture(side)),
    ] {
        assert!(
            matches!(refused, Err(GpuError::UnknownHandle { .. })),
            "{refused:?}"
        );
    }
    match gpu.destroy_stream(StreamId(0)) {
        Err(e) => assert!(e.to_string().contains("stream 0"), "{e}"),
        Ok(()) => panic!("stream 0 was destroyed"),
    }
    // Ids are not reused.
    assert_ne!(gpu.create_stream().unwrap(), side);
    assert_ne!(gpu.create_event().unwrap(), event);
}

#[test]
fn an_injected_failure_fires_once_on_the_chosen_call_and_changes_nothing() {
    let mut gpu = backend();
    let ptr = gpu.alloc(16).unwrap();
    gpu.fail_call("copy_h2d", 1);
    gpu.copy_h2d(ptr, &[1; 16]).unwrap();
    gpu.memset(ptr, 2, 16).unwrap();
    match gpu.copy_h2d(ptr, &[3; 16]) {
        Err(GpuError::Driver { call, message }) => {
            assert_eq!(call, "copy_h2d");
            assert!(message.contains("injected"), "{message}");
        }
        other => panic!("expected the injected failure, got {other:?}"),
    }
    let mut raw = [0u8; 16];
    gpu.copy_d2h(ptr, &mut raw).unwrap();
    assert_eq!(raw, [2; 16], "the failed copy wrote nothing");
    gpu.copy_h2d(ptr, &[4; 16]).unwrap();
}
