//! Graphs in the serving path (issue 10, items 1-2): every `Session` step replays its
//! program's graph by default, giving the eager run's bytes in every mode and width; a failed
//! capture turns graphs off once (`Auto`) or is the step's error (`Always`), leaving every
//! sequence as it was; `capture_all` captures the ladder ahead; `resize_kv` destroys every
//! graph, which is recaptured at its next use; `free` destroys the cached graphs.

mod exec_support;

use exec_support::*;
use solder_circuit::{Mode, Policy};
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{
    CircuitExec, EagerReason, ExecError, GraphPolicy, Session, SessionError, StepRun,
};

/// Logits of a fixed workload touching every mode: a prefill (verify 8 then 3), decodes,
/// multi-seq steps at widths 2 and 4 (3 sequences pad to 4), and a verify of 2.
fn workload(backend: &mut CpuBackend, exec: &CircuitExec) -> (Vec<Vec<f32>>, Vec<StepRun>) {
    let vocab = exec.config.vocab_size as u32;
    let mut session = Session::new(exec);
    let mut out = Vec::new();
    let mut runs = Vec::new();
    let a = session.add_sequence();
    let b = session.add_sequence();
    let c = session.add_sequence();
    out.push(
        session
            .prefill(backend, a, &prompt(1, vocab as usize, 11))
            .expect("prefill"),
    );
    runs.push(session.last_run().expect("ran"));
    for t in 0..3 {
        out.push(
            session
                .decode(backend, b, (t * 7 + 3) % vocab)
                .expect("decode"),
        );
        runs.push(session.last_run().expect("ran"));
    }
    for t in 0..3 {
        let two = [(a, (t * 5 + 1) % vocab), (b, (t * 3 + 2) % vocab)];
        out.extend(session.multi_seq_step(backend, &two).expect("width 2"));
        runs.push(session.last_run().expect("ran"));
        let three = [(a, t % vocab), (b, (t + 9) % vocab), (c, (t + 4) % vocab)];
        out.extend(session.multi_seq_step(backend, &three).expect("width 4"));
        runs.push(session.last_run().expect("ran"));
    }
    out.push(session.verify(backend, c, &[5, 6]).expect("verify 2"));
    runs.push(session.last_run().expect("ran"));
    (out, runs)
}

fn exec_with(backend: &mut CpuBackend, json: &str, graphs: GraphPolicy) -> CircuitExec {
    let exec = build(backend, json, Policy::default(), roomy_kv());
    exec.set_graph_policy(graphs);
    exec
}

#[test]
fn replayed_steps_give_the_eager_bytes_in_every_mode_and_width() {
    for json in [TINY_LLAMA, TINY_NEXT] {
        let mut backend = backend();
        let eager = exec_with(&mut backend, json, GraphPolicy::Never);
        let (expected, runs) = workload(&mut backend, &eager);
        assert!(runs
            .iter()
            .all(|r| *r == StepRun::Eager(EagerReason::PolicyNever)));
        let counters = eager.graph_counters();
        assert_eq!(counters.graph_launches, 0);
        assert_eq!(
            counters.eager_steps(),
            runs.len() as u64 + 1,
            "prefill runs two chunks"
        );

        // The default policy: graphs, captured on first use.
        let graphs = build(&mut backend, json, Policy::default(), roomy_kv());
        assert_eq!(graphs.graph_policy(), GraphPolicy::Auto);
        let (got, runs) = workload(&mut backend, &graphs);
        assert_eq!(expected.len(), got.len());
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_same_bytes(g, e, &format!("step {i} replayed vs eager"));
        }
        assert!(runs
            .iter()
            .all(|r| matches!(r, StepRun::Captured | StepRun::Replayed)));
        let counters = graphs.graph_counters();
        assert_eq!(counters.eager_steps(), 0, "{counters}");
        assert_eq!(
            counters.graph_launches,
            runs.len() as u64 + 1,
            "prefill runs two chunks"
        );
        // One capture per distinct program the workload ran; never one more.
        let captured = runs.iter().filter(|r| **r == StepRun::Captured).count() as u64;
        assert!(
            counters.captures >= captured && counters.captures <= 6,
            "{counters}"
        );
        assert_eq!(counters.failed_captures, 0);

        // A second identical workload only replays.
        let (again, runs) = workload(&mut backend, &graphs);
        assert!(runs.iter().all(|r| *r == StepRun::Replayed), "{runs:?}");
        for (g, e) in again.iter().zip(&expected) {
            assert_same_bytes(g, e, "second workload");
        }
    }
}

#[test]
fn capture_all_captures_every_program_and_arm_once() {
    let mut backend = backend();
    let exec = exec_with(&mut backend, TINY_NEXT, GraphPolicy::Always);
    let all = exec.programs().len() + exec.arms().len();
    let report = exec.capture_all(&mut backend).expect("capture the ladder");
    assert_eq!((report.captured, report.already), (all, 0));
    let launches: usize = exec
        .programs()
        .iter()
        .chain(exec.arms())
        .map(|p| p.launches())
        .sum();
    assert_eq!(report.launches, launches);
    assert_eq!(backend.live_graphs(), (all, all));
    let (_, runs) = workload(&mut backend, &exec);
    assert!(runs.iter().all(|r| *r == StepRun::Replayed), "{runs:?}");
    let again = exec
        .capture_all(&mut backend)
        .expect("nothing left to capture");
    assert_eq!((again.captured, again.already), (0, all));
    assert_eq!(exec.graph_counters().captures, all as u64);
}

#[test]
fn a_failed_capture_under_auto_turns_graphs_off_once_and_steps_run_eagerly() {
    for call in ["begin_capture", "instantiate", "launch"] {
        let mut backend = backend();
        let eager = exec_with(&mut backend, TINY_NEXT, GraphPolicy::Never);
        let (expected, _) = workload(&mut backend, &eager);
        let exec = exec_with(&mut backend, TINY_NEXT, GraphPolicy::Auto);
        // The third program captured fails (the prefill captures verify 8 and verify 3).
        let skip = if call == "launch" {
            let verify8 = exec.verify_program(8).expect("verify 8").launches();
            let verify3 = exec.verify_program(3).expect("verify 3").launches();
            // The launches captured into the first two graphs (replays launch none), then
            // half of decode's.
            verify8 + verify3 + exec.decode_program().expect("decode").launches() / 2
        } else {
            2
        };
        backend.fail_call(call, skip);
        let (got, runs) = workload(&mut backend, &exec);
        for (g, e) in got.iter().zip(&expected) {
            assert_same_bytes(g, e, &format!("after a failed {call}"));
        }
        let counters = exec.graph_counters();
        assert_eq!(
            counters.failed_captures, 1,
            "{call}: no retry storm: {counters}"
        );
        let reason = counters.off_reason.clone().expect("the reason is kept");
        assert!(
            reason.contains("decode:1") && reason.contains("injected"),
            "{reason}"
        );
        assert_eq!(runs[0], StepRun::Captured);
        assert!(
            runs[1..]
                .iter()
                .all(|r| *r == StepRun::Eager(EagerReason::GraphsOff)),
            "{runs:?}"
        );
        // Nothing half-made is left: the two graphs captured before the failure, no more.
        assert_eq!(backend.live_graphs(), (2, 2), "{call}");
        // capture_all says why it will not capture; setting the policy again retries.
        let err = exec.capture_all(&mut backend).unwrap_err().to_string();
        assert!(
            err.contains("graphs are off") && err.contains("decode:1"),
            "{err}"
        );
        exec.set_graph_policy(GraphPolicy::Auto);
        exec.capture_all(&mut backend).expect("graphs again");
    }
}

#[test]
fn a_failed_capture_under_always_fails_the_step_and_leaves_the_sequence_as_it_was() {
    let mut backend = backend();
    let exec = exec_with(&mut backend, TINY_NEXT, GraphPolicy::Always);
    let tokens = prompt(7, 128, 5);
    let expected = decode_alone(&mut backend, &exec, &tokens);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let mut got = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        if i == 2 {
            // The decode graph is released, so this step captures it again: that fails.
            exec.release_graphs(&mut backend).expect("release");
            backend.fail_call("begin_capture", 0);
            match session.decode(&mut backend, id, t) {
                Err(SessionError::Exec(ExecError::Gpu(e))) => {
                    assert!(e.to_string().contains("injected"), "{e}")
                }
                other => panic!("expected the failed capture, got {other:?}"),
            }
            assert_eq!(session.seq_len(id).expect("seq"), 2);
        }
        got.extend(session.decode(&mut backend, id, t).expect("decode"));
    }
    assert_same_bytes(&got, &expected, "after a failed capture");
    let counters = exec.graph_counters();
    assert_eq!(counters.failed_captures, 1);
    assert_eq!(counters.off_reason, None, "Always keeps graphs on");
}

#[test]
fn resize_kv_destroys_every_graph_and_the_next_steps_recapture() {
    let mut backend = backend();
    let mut eager = exec_with(&mut backend, TINY_NEXT, GraphPolicy::Never);
    let (expected, _) = workload(&mut backend, &eager);
    eager.free(&mut backend).expect("free");
    let mut exec = exec_with(&mut backend, TINY_NEXT, GraphPolicy::Auto);
    let pages = exec.layout.kv_pages;
    exec.capture_all(&mut backend).expect("capture");
    let cached = exec.graph_counters().cached;
    let before = backend.live_bytes();
    exec.resize_kv(&mut backend, pages * 2)
        .expect("grow the pool");
    assert_eq!(exec.layout.kv_pages, pages * 2);
    assert!(backend.live_bytes() > before, "a bigger state allocation");
    let counters = exec.graph_counters();
    assert_eq!((counters.cached, counters.invalidated), (0, cached as u64));
    assert_eq!(
        backend.live_graphs(),
        (0, 0),
        "stale graphs are destroyed, never replayed"
    );
    let (got, runs) = workload(&mut backend, &exec);
    for (g, e) in got.iter().zip(&expected) {
        assert_same_bytes(g, e, "after resize_kv");
    }
    assert_eq!(runs[0], StepRun::Captured);
    let counters = exec.graph_counters();
    assert!(counters.recaptures >= 1 && counters.recaptures == counters.captures - cached as u64);
    // Every page of the bigger pool can be lent.
    let session = Session::new(&exec);
    assert_eq!(session.free_page_count(), pages * 2 - 1);
    drop(session);
    exec.free(&mut backend)
        .expect("free destroys the cached graphs");
    assert_eq!(backend.live_graphs(), (0, 0));
    assert_eq!(backend.live_allocations(), 0);
}

#[test]
fn resize_kv_refuses_while_pages_are_lent() {
    let mut backend = backend();
    let mut exec = exec_with(&mut backend, TINY_LLAMA, GraphPolicy::Auto);
    let pages = exec.layout.kv_pages;
    {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        session.decode(&mut backend, id, 1).expect("decode");
        // A session forgotten without being dropped keeps its page lent.
        std::mem::forget(session);
    }
    let err = exec
        .resize_kv(&mut backend, pages + 4)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("1 KV page(s)") && err.contains("lent"),
        "{err}"
    );
    assert_eq!(exec.layout.kv_pages, pages, "nothing changed");
}

#[test]
fn resize_kv_refuses_a_live_graph_handle_and_survives_a_failed_allocation() {
    let mut backend = backend();
    let mut exec = exec_with(&mut backend, TINY_LLAMA, GraphPolicy::Auto);
    let pages = exec.layout.kv_pages;
    let graph = exec
        .capture(&mut backend, Mode::Decode, 1)
        .expect("capture");
    assert!(matches!(
        exec.resize_kv(&mut backend, pages + 4),
        Err(ExecError::GraphsAlive { live: 1 })
    ));
    assert!(
        exec.resize_kv(&mut backend, 1).is_err(),
        "one page is only the scratch page"
    );
    exec.release(&mut backend, graph).expect("release");
    // A failed allocation leaves the exec as it was, its graphs recapturable.
    backend.fail_call("alloc", 0);
    assert!(exec.resize_kv(&mut backend, pages + 4).is_err());
    assert_eq!(exec.layout.kv_pages, pages);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    session
        .decode(&mut backend, id, 1)
        .expect("the exec still runs");
}

#[test]
fn a_capture_during_another_capture_is_refused_by_name() {
    let mut backend = backend();
    let mut exec = exec_with(&mut backend, TINY_LLAMA, GraphPolicy::Always);
    let stream = exec.default_stream();
    solder_gpu_runtime::GpuBackend::begin_capture(&mut backend, stream).expect("begin");
    let err = exec
        .capture(&mut backend, Mode::Decode, 1)
        .unwrap_err()
        .to_string();
    assert!(err.contains("captur"), "{err}");
    let err = exec.capture_all(&mut backend).unwrap_err().to_string();
    assert!(err.contains("captur"), "{err}");
    let graph = solder_gpu_runtime::GpuBackend::end_capture(&mut backend, stream).expect("end");
    solder_gpu_runtime::GpuBackend::destroy_graph(&mut backend, graph).expect("destroy");
    // Then everything works as before.
    let report = exec.capture_all(&mut backend).expect("capture");
    assert_eq!(report.captured, exec.programs().len());
}
