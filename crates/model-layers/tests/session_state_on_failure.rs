//! A backend failure in the middle of a step leaves a recurrent sequence's state as it was
//! (issue 9, class 8): the sequence's next logits equal those of a run that never took the
//! failed step. Failures are injected with `CpuBackend::fail_call`, on both paths a step may
//! take: eager launches (`GraphPolicy::Never`, a failing `launch`) and a replayed graph
//! (`GraphPolicy::Always`, a failing `graph_node` part-way through the replay).

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{CircuitExec, GraphPolicy, Session, SessionError};

fn next_exec(backend: &mut CpuBackend, graphs: GraphPolicy) -> CircuitExec {
    let exec = build(backend, TINY_NEXT, Policy::default(), roomy_kv());
    exec.set_graph_policy(graphs);
    exec
}

const PATHS: [GraphPolicy; 2] = [GraphPolicy::Never, GraphPolicy::Always];

/// Where a step fails: part-way through its launches, at its last launch (every state
/// written), or reading the logits after the whole program ran. A launch is `launch` when
/// the step runs eagerly and `graph_node` when it replays a graph.
fn failures(launches: usize, graphs: GraphPolicy) -> Vec<(&'static str, usize)> {
    let launch = match graphs {
        GraphPolicy::Never => "launch",
        _ => "graph_node",
    };
    vec![
        (launch, launches / 2),
        (launch, launches - 1),
        ("copy_d2h", 0),
    ]
}

#[test]
fn a_decode_that_fails_mid_step_leaves_the_state_as_it_was() {
    for graphs in PATHS {
        decode_fails_mid_step(graphs);
    }
}

fn decode_fails_mid_step(graphs: GraphPolicy) {
    let mut backend = backend();
    let exec = next_exec(&mut backend, graphs);
    let tokens = prompt(41, 128, 6);
    let expected = decode_alone(&mut backend, &exec, &tokens);
    let launches = exec.decode_program().expect("decode").launches();
    for (call, skip) in failures(launches, graphs) {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let mut got = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            if i == 3 {
                backend.fail_call(call, skip);
                match session.decode(&mut backend, id, t) {
                    Err(SessionError::Exec(_)) => {}
                    other => panic!("{call} #{skip}: expected the injected failure, got {other:?}"),
                }
                assert_eq!(session.seq_len(id).expect("seq"), 3);
            }
            got.extend(session.decode(&mut backend, id, t).expect("decode"));
        }
        assert_same_bytes(&got, &expected, &format!("after a failed {call} #{skip}"));
    }
}

#[test]
fn a_multi_seq_step_that_fails_mid_step_leaves_every_state_as_it_was() {
    for graphs in PATHS {
        multi_seq_fails_mid_step(graphs);
    }
}

fn multi_seq_fails_mid_step(graphs: GraphPolicy) {
    let mut backend = backend();
    let exec = next_exec(&mut backend, graphs);
    let prompts: Vec<Vec<u32>> = (0..3).map(|s| prompt(50 + s, 128, 5)).collect();
    let expected: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| decode_alone(&mut backend, &exec, p))
        .collect();
    let launches = exec.multi_seq_program(4).expect("width 4").launches();
    for (call, skip) in failures(launches, graphs) {
        let mut session = Session::new(&exec);
        let ids: Vec<_> = prompts.iter().map(|_| session.add_sequence()).collect();
        let mut got = vec![Vec::new(); prompts.len()];
        for t in 0..5 {
            let batch: Vec<_> = ids
                .iter()
                .zip(&prompts)
                .map(|(&id, p)| (id, p[t]))
                .collect();
            if t == 2 {
                backend.fail_call(call, skip);
                assert!(
                    session.multi_seq_step(&mut backend, &batch).is_err(),
                    "{call} #{skip} did not fail the step"
                );
            }
            let step = session.multi_seq_step(&mut backend, &batch).expect("step");
            for (g, l) in got.iter_mut().zip(step) {
                g.extend(l);
            }
        }
        for (s, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_same_bytes(g, e, &format!("sequence {s} after a failed {call} #{skip}"));
        }
    }
}

#[test]
fn a_prefill_that_fails_in_a_later_chunk_leaves_the_state_as_it_was() {
    for graphs in PATHS {
        prefill_fails_in_a_later_chunk(graphs);
    }
}

fn prefill_fails_in_a_later_chunk(graphs: GraphPolicy) {
    let mut backend = backend();
    let exec = next_exec(&mut backend, graphs);
    // Both chunks' graphs exist before the failing prefill, so it counts replayed nodes only.
    if graphs != GraphPolicy::Never {
        exec.capture_all(&mut backend).expect("capture the ladder");
    }
    let head = prompt(61, 128, 3);
    let tail = prompt(62, 128, 11); // verify 8, then verify 3: two chunks
    let next = 9;
    let expected = {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        session.prefill(&mut backend, id, &head).expect("head");
        session.decode(&mut backend, id, next).expect("next")
    };
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    session.prefill(&mut backend, id, &head).expect("head");
    // The first chunk (8 rows) runs whole; the second fails at its last launch.
    let first_chunk = exec.verify_program(8).expect("verify 8").launches();
    let second_chunk = exec.verify_program(3).expect("verify 3").launches();
    let launch = failures(1, graphs)[0].0;
    backend.fail_call(launch, first_chunk + second_chunk - 1);
    assert!(session.prefill(&mut backend, id, &tail).is_err());
    assert_eq!(session.seq_len(id).expect("seq"), head.len());
    let got = session.decode(&mut backend, id, next).expect("next");
    assert_same_bytes(&got, &expected, "the sequence after a failed prefill");
}

/// A prompt continuing a sequence that holds state copies none aside: its chunks write a spare
/// slot the sequence takes once the last succeeded (failures armed at the first copy of either
/// kind never fire), and the sequence then decodes the bytes of decoding every token alone.
#[test]
fn a_prompt_continuing_a_sequence_copies_no_state() {
    let mut backend = backend();
    let exec = next_exec(&mut backend, GraphPolicy::Never);
    let head = prompt(63, 128, 3);
    let tail = prompt(64, 128, 11); // verify 8, then verify 3: two chunks
    let next = 9;
    let all: Vec<u32> = head.iter().chain(&tail).copied().chain([next]).collect();
    let vocab = exec.config.vocab_size;
    let alone = decode_alone(&mut backend, &exec, &all);
    for call in ["copy_d2d_async", "copy_d2d"] {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        session.prefill(&mut backend, id, &head).expect("head");
        backend.fail_call(call, 0);
        let logits = session
            .prefill(&mut backend, id, &tail)
            .unwrap_or_else(|e| panic!("{call} armed: {e}"));
        backend.fail_call("alloc", usize::MAX);
        let from = head.len() * vocab;
        assert_same_bytes(
            &logits,
            &alone[from..from + tail.len() * vocab],
            &format!("{call} armed: the tail's logits"),
        );
        let got = session.decode(&mut backend, id, next).expect("next");
        assert_same_bytes(&got, &alone[alone.len() - vocab..], "the decode after");
    }
}

/// A step waits for no device work before its program and copies no state: the slots it
/// lends are zeroed by queued memsets (a failure armed at the first synchronous memset leaves
/// the first step running), and each sequence's kernels write its advanced state into a spare
/// slot, so no state copy runs at all (failures armed at the first copy of either kind leave
/// every step running). A step that fails after its program ran (its logits' read back) leaves
/// each sequence's state in the slot it read: the step run again gives the bytes of decoding
/// alone.
#[test]
fn a_step_copies_no_state_and_a_failed_one_leaves_the_state_it_read() {
    let mut backend = backend();
    let exec = next_exec(&mut backend, GraphPolicy::Never);
    assert!(exec.layout.states.iter().any(|r| r.slot_bytes > 0));
    let prompts: Vec<Vec<u32>> = (0..3).map(|s| prompt(70 + s, 128, 4)).collect();
    // Each prompt's logits by a prefill, which advances its slot in place (no spares): the
    // bytes of decoding it (a row's bytes do not depend on its program).
    let expected: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| {
            let mut alone = Session::new(&exec);
            let id = alone.add_sequence();
            alone.prefill(&mut backend, id, p).expect("prefill")
        })
        .collect();
    let mut session = Session::new(&exec);
    let ids: Vec<_> = prompts.iter().map(|_| session.add_sequence()).collect();
    let batch = |t: usize| -> Vec<_> {
        ids.iter()
            .zip(&prompts)
            .map(|(&id, p)| (id, p[t]))
            .collect()
    };
    let mut got = vec![Vec::new(); prompts.len()];
    for t in 0..4 {
        if t == 1 || t == 3 {
            // The program runs, then the logits' read back fails.
            backend.fail_call("copy_d2h", 0);
            let failed = session.multi_seq_step(&mut backend, &batch(t));
            assert!(failed.is_err(), "step {t}: the read back did not fail it");
        }
        match t {
            0 => backend.fail_call("memset", 0),
            1 => backend.fail_call("copy_d2d_async", 0),
            2 => backend.fail_call("copy_d2d", 0),
            _ => {}
        }
        let step = session
            .multi_seq_step(&mut backend, &batch(t))
            .expect("step");
        for (g, l) in got.iter_mut().zip(step) {
            g.extend(l);
        }
    }
    // Disarm what a state copy would have hit.
    backend.fail_call("alloc", usize::MAX);
    for (s, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_same_bytes(g, e, &format!("sequence {s}"));
    }
}
