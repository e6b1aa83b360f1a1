//! Who owns what (issue 9, classes 5 and 9): sessions on one exec never share a page or a
//! slot; an exec refuses a backend other than the one it was built on, naming both; a build
//! that fails late gives back every allocation, stream and event; `free` destroys the exec's
//! streams and events.

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{CircuitExec, ExecError, Session, SessionError, WeightSource};

#[test]
fn two_sessions_on_one_exec_never_share_pages_or_slots() {
    let mut backend = backend();
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let (pa, pb) = (prompt(31, 128, 9), prompt(32, 128, 9));
    let (alone_a, alone_b) = (
        decode_alone(&mut backend, &exec, &pa),
        decode_alone(&mut backend, &exec, &pb),
    );
    let mut first = Session::new(&exec);
    let mut second = Session::new(&exec);
    let (a, b) = (first.add_sequence(), second.add_sequence());
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    // Interleaved: each step of one session runs between two of the other's.
    for (&ta, &tb) in pa.iter().zip(&pb) {
        got_a.extend(first.decode(&mut backend, a, ta).expect("first session"));
        got_b.extend(second.decode(&mut backend, b, tb).expect("second session"));
    }
    assert_same_bytes(&got_a, &alone_a, "first session's sequence");
    assert_same_bytes(&got_b, &alone_b, "second session's sequence");
    assert_eq!(
        first.free_page_count(),
        second.free_page_count(),
        "one pool"
    );
}

#[test]
fn a_dropped_session_gives_its_pages_and_slots_back() {
    let mut backend = backend();
    let mut small = kv(5, 4, 16);
    small.max_sequences = 1;
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), small);
    let free = Session::new(&exec).free_page_count();
    {
        let mut holder = Session::new(&exec);
        let id = holder.add_sequence();
        holder
            .prefill(&mut backend, id, &[1, 2, 3, 4, 5])
            .expect("prefill");
        let mut other = Session::new(&exec);
        let id = other.add_sequence();
        // The only slot is held by the first session's sequence.
        match other.decode(&mut backend, id, 1) {
            Err(SessionError::SlotsExhausted { needed: 1, free: 0 }) => {}
            other => panic!("expected SlotsExhausted, got {other:?}"),
        }
        assert_eq!(other.free_page_count(), free - 2);
    }
    let mut later = Session::new(&exec);
    assert_eq!(later.free_page_count(), free);
    let id = later.add_sequence();
    later
        .decode(&mut backend, id, 1)
        .expect("the slot came back");
}

fn wrong_backend(e: &ExecError) -> bool {
    matches!(e, ExecError::WrongBackend { built_on, given }
        if built_on.contains("cpu backend #") && given.contains("cpu backend #") && built_on != given)
}

#[test]
fn an_exec_refuses_another_backend_naming_both() {
    let mut backend = backend();
    let mut exec = build_llama(&mut backend, roomy_kv());
    let mut stranger = exec_support::backend();
    let decode = exec.decode_program().expect("decode").clone();
    match exec.run(&mut stranger, &decode) {
        Err(e) => assert!(wrong_backend(&e), "{e}"),
        Ok(()) => panic!("ran on another backend's memory"),
    }
    match exec.capture(&mut stranger, solder_circuit::Mode::Decode, 1) {
        Err(e) => assert!(wrong_backend(&e), "{e}"),
        Ok(_) => panic!("captured on another backend"),
    }
    {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        for result in [
            session.decode(&mut stranger, id, 1).map(drop),
            session.prefill(&mut stranger, id, &[1, 2]).map(drop),
            session.multi_seq_step(&mut stranger, &[(id, 1)]).map(drop),
        ] {
            match result {
                Err(SessionError::Exec(e)) => assert!(wrong_backend(&e), "{e}"),
                other => panic!("expected WrongBackend, got {other:?}"),
            }
        }
        assert_eq!(session.seq_len(id).expect("seq"), 0);
        session
            .decode(&mut backend, id, 1)
            .expect("its own backend");
    }
    match exec.free(&mut stranger) {
        Err(e) => assert!(wrong_backend(&e), "{e}"),
        Ok(()) => panic!("freed on another backend"),
    }
    exec.free(&mut backend).expect("free on its own backend");
}

/// What a backend holds, to compare before a build and after it failed or was freed.
fn held(backend: &CpuBackend) -> (usize, usize, usize, usize) {
    (
        backend.live_allocations(),
        backend.live_bytes(),
        backend.live_streams(),
        backend.live_events(),
    )
}

#[test]
fn a_build_that_fails_late_gives_everything_back() {
    let mut backend = backend();
    let before = held(&backend);
    // Each call fails in turn, from the first allocation to the last event.
    let calls: [(&'static str, usize); 6] = [
        ("alloc", 2),
        ("memset", 0),
        ("copy_h2d", 5),
        ("copy_h2d", 0),
        ("create_stream", 0),
        ("create_event", 1),
    ];
    for (call, skip) in calls {
        backend.fail_call(call, skip);
        let result = CircuitExec::build(
            &mut backend,
            boot(
                config(TINY_NEXT),
                Policy::default(),
                WeightSource::Random { seed: 3 },
                roomy_kv(),
            ),
        );
        match result {
            Err(ExecError::Gpu(e)) => assert!(e.to_string().contains(call), "{call}: {e}"),
            Err(e) => panic!("{call}: expected the injected failure, got {e}"),
            Ok(_) => panic!("{call} #{skip} did not fail the build"),
        }
        assert_eq!(held(&backend), before, "{call} #{skip} failed the build");
    }
    // The backend is still whole: a build then succeeds.
    let mut exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    exec.free(&mut backend).expect("free");
}

#[test]
fn free_destroys_the_streams_and_events() {
    let mut backend = backend();
    let before = held(&backend);
    let mut exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    assert!(
        backend.live_streams() > 1 && backend.live_events() > 0,
        "the shared expert runs on a side stream, joined by events"
    );
    exec.free(&mut backend).expect("free");
    assert_eq!(held(&backend), before);
    // Nothing is left to give back: a second free is refused by name (issue 19 item 7).
    assert!(matches!(exec.free(&mut backend), Err(ExecError::Freed)));
    assert_eq!(held(&backend), before);
}
