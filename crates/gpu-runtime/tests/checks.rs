//! Launch checks: aliasing, kernel lookup, twin registration, `TwinCtx` refusals, errors.

mod common;

use common::*;
use solder_gpu_runtime::{
    CpuBackend, EventId, GpuBackend, GpuError, GraphExecId, KernelArg, ModuleImage, StreamId,
    TwinCtx,
};

const S0: StreamId = StreamId(0);

fn noop(_: &TwinCtx<'_>) -> Result<(), GpuError> {
    Ok(())
}

#[test]
fn writable_buffer_overlapping_a_read_is_aliasing() {
    let mut gpu = backend();
    let buf = upload(&mut gpu, &[1.0; 8]);
    // Read 0..4, write 3..7: one element shared.
    let err = copy_on(&mut gpu, S0, buf, buf.offset(bytes(3)), 4).unwrap_err();
    assert!(
        matches!(&err, GpuError::Aliasing { kernel, a: 1, b: 0 } if kernel == "test::copy"),
        "{err}"
    );
    // The refused launch wrote nothing.
    assert_eq!(download(&mut gpu, buf, 8), vec![1.0; 8]);
    // Adjacent ranges do not alias.
    copy_on(&mut gpu, S0, buf, buf.offset(bytes(4)), 4).unwrap();
}

#[test]
fn two_reads_of_the_same_bytes_are_not_aliasing() {
    let mut gpu = backend();
    let a = upload(&mut gpu, &[1.0, 2.0]);
    let out = gpu.alloc(bytes(2)).unwrap();
    add_on(&mut gpu, S0, a, a, out, 2).unwrap();
    assert_eq!(download(&mut gpu, out, 2), vec![2.0, 4.0]);
}

#[test]
fn unknown_kernel_is_refused() {
    let gpu = backend();
    let err = gpu.kernel("test::nope").unwrap_err();
    assert!(
        matches!(&err, GpuError::UnknownKernel(name) if name == "test::nope"),
        "{err}"
    );
    // A registered twin of a module never loaded is no kernel either.
    let mut gpu = CpuBackend::with_threads(1);
    gpu.register_twin("norm::rms_norm", noop).unwrap();
    assert!(matches!(
        gpu.kernel("norm::rms_norm"),
        Err(GpuError::UnknownKernel(_))
    ));
    gpu.load_module(&ModuleImage {
        name: "norm",
        ptx: Some("ignored"),
        cubin: None,
    })
    .unwrap();
    assert!(gpu.kernel("norm::rms_norm").is_ok());
}

#[test]
fn module_with_no_twins_is_unknown() {
    let mut gpu = backend();
    let err = gpu
        .load_module(&ModuleImage {
            name: "tes",
            ptx: None,
            cubin: None,
        })
        .unwrap_err();
    assert!(
        matches!(&err, GpuError::UnknownModule(name) if name == "tes"),
        "{err}"
    );
}

#[test]
fn kernel_names_are_sorted_and_only_of_loaded_modules() {
    let mut gpu = CpuBackend::with_threads(1);
    gpu.register_twins(&[
        ("b::z", noop),
        ("b::a", noop),
        ("a::m", noop),
        ("c::x", noop),
    ])
    .unwrap();
    gpu.load_module(&ModuleImage {
        name: "b",
        ptx: None,
        cubin: None,
    })
    .unwrap();
    gpu.load_module(&ModuleImage {
        name: "a",
        ptx: None,
        cubin: None,
    })
    .unwrap();
    gpu.load_module(&ModuleImage {
        name: "a",
        ptx: None,
        cubin: None,
    })
    .unwrap();
    assert_eq!(gpu.kernel_names(), vec!["a::m", "b::a", "b::z"]);
}

#[test]
fn duplicate_or_malformed_twin_names_are_refused() {
    let mut gpu = CpuBackend::with_threads(1);
    gpu.register_twin("norm::rms_norm", noop).unwrap();
    assert!(matches!(
        gpu.register_twin("norm::rms_norm", noop),
        Err(GpuError::Driver { .. })
    ));
    for bad in ["rms_norm", "::f", "m::", "a::b::c", "a b::c"] {
        assert!(gpu.register_twin(bad, noop).is_err(), "`{bad}` accepted");
    }
}

#[test]
fn twin_error_propagates() {
    let mut gpu = backend();
    let kernel = k(&gpu, "fail");
    let err = gpu.launch(S0, kernel, &cfg(), &[]).unwrap_err();
    assert!(
        matches!(&err, GpuError::Kernel { kernel, message }
            if kernel == "test::fail" && message.contains("99")),
        "{err}"
    );
}

#[test]
fn twin_cannot_read_a_write_argument() {
    let mut gpu = backend();
    let out = gpu.alloc(bytes(4)).unwrap();
    let kernel = k(&gpu, "read_output");
    let err = gpu
        .launch(S0, kernel, &cfg(), &[KernelArg::write(out, bytes(4))])
        .unwrap_err();
    assert!(
        matches!(err, GpuError::BadArgument { index: 0, .. }),
        "{err}"
    );
}

#[test]
fn twin_cannot_take_a_writable_argument_twice() {
    let mut gpu = backend();
    let out = gpu.alloc(bytes(4)).unwrap();
    let kernel = k(&gpu, "take_twice");
    let err = gpu
        .launch(S0, kernel, &cfg(), &[KernelArg::write(out, bytes(4))])
        .unwrap_err();
    assert!(
        matches!(&err, GpuError::BadArgument { index: 0, message, .. }
            if message.contains("twice")),
        "{err}"
    );
}

#[test]
fn unknown_handles_are_refused() {
    let mut gpu = backend();
    let out = gpu.alloc(bytes(1)).unwrap();
    assert!(matches!(
        fill_on(&mut gpu, StreamId(5), out, 1, 1),
        Err(GpuError::UnknownHandle {
            what: "stream",
            id: 5
        })
    ));
    assert!(matches!(
        gpu.record_event(EventId(0), S0),
        Err(GpuError::UnknownHandle { what: "event", .. })
    ));
    assert!(matches!(
        gpu.launch_graph(GraphExecId(3), S0),
        Err(GpuError::UnknownHandle { .. })
    ));
    let stream = gpu.create_stream().unwrap();
    fill_on(&mut gpu, stream, out, 1, 1).unwrap();
}

#[test]
fn facts_describe_the_host() {
    let facts = CpuBackend::with_threads(3).facts();
    assert_eq!(facts.backend, "cpu");
    assert_eq!(facts.name, "host (3 threads)");
    assert_eq!(facts.host_threads, 3);
    assert_eq!(facts.compute_capability, None);
    let threads = CpuBackend::new().facts().host_threads;
    assert!((1..=16).contains(&threads));
}
