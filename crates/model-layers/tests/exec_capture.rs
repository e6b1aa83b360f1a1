//! Graph capture over a `CircuitExec`: a replay gives the eager run's logits bytes, and the
//! workspace is not freed while a captured graph lives.

mod exec_support;

use exec_support::{assert_same_bytes, backend, build_llama, prompt, roomy_kv};
use solder_circuit::Mode;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::{CircuitExec, ExecError, Session};

/// The first `rows` rows of logits in the workspace's logits region.
fn read_logits(exec: &CircuitExec, backend: &mut CpuBackend, rows: usize) -> Vec<f32> {
    let vocab = exec.config.vocab_size;
    let mut raw = vec![0u8; rows * vocab * 4];
    backend
        .copy_d2h(exec.workspace().offset(exec.layout.logits_offset), &mut raw)
        .unwrap();
    raw.chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Wipes the logits region so a run that writes nothing cannot pass.
fn wipe_logits(exec: &CircuitExec, backend: &mut CpuBackend, rows: usize) {
    let bytes = rows * exec.config.vocab_size * 4;
    backend
        .memset(
            exec.workspace().offset(exec.layout.logits_offset),
            0xff,
            bytes,
        )
        .unwrap();
}

#[test]
fn replay_gives_the_eager_logits_bytes() {
    let mut backend = backend();
    let mut exec = build_llama(&mut backend, roomy_kv());
    let tokens = prompt(21, 128, 3);
    // Session steps upload the metadata; the last step's stays in the workspace.
    let eager_decode = {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let mut last = Vec::new();
        for &t in &tokens {
            last = session.decode(&mut backend, id, t).unwrap();
        }
        last
    };
    assert_same_bytes(
        &read_logits(&exec, &mut backend, 1),
        &eager_decode,
        "session logits vs the workspace",
    );
    let graph = exec.capture(&mut backend, Mode::Decode, 1).unwrap();
    assert_eq!((graph.mode, graph.rows), (Mode::Decode, 1));
    wipe_logits(&exec, &mut backend, 1);
    exec.replay(&mut backend, &graph).unwrap();
    assert_same_bytes(
        &read_logits(&exec, &mut backend, 1),
        &eager_decode,
        "replay vs eager decode",
    );
    // Eager again over the same metadata, and a second replay: still the same bytes.
    wipe_logits(&exec, &mut backend, 1);
    let decode = exec.decode_program().unwrap().clone();
    exec.run(&mut backend, &decode).unwrap();
    assert_same_bytes(
        &read_logits(&exec, &mut backend, 1),
        &eager_decode,
        "eager rerun",
    );
    wipe_logits(&exec, &mut backend, 1);
    exec.replay(&mut backend, &graph).unwrap();
    assert_same_bytes(
        &read_logits(&exec, &mut backend, 1),
        &eager_decode,
        "second replay",
    );
    exec.release(&mut backend, graph).unwrap();
    exec.free(&mut backend).unwrap();
}

#[test]
fn multi_seq_replay_gives_the_eager_logits_bytes() {
    let mut backend = backend();
    let mut exec = build_llama(&mut backend, roomy_kv());
    let eager: Vec<f32> = {
        let mut session = Session::new(&exec);
        let ids: Vec<_> = (0..3).map(|_| session.add_sequence()).collect();
        let mut last = Vec::new();
        for step in 0..2u32 {
            let batch: Vec<_> = ids
                .iter()
                .enumerate()
                .map(|(i, &id)| (id, 7 * i as u32 + step))
                .collect();
            last = session.multi_seq_step(&mut backend, &batch).unwrap();
        }
        last.concat()
    };
    // Three live rows ran at width 4.
    let live = read_logits(&exec, &mut backend, 3);
    assert_same_bytes(&live, &eager, "session vs workspace");
    let all_rows = read_logits(&exec, &mut backend, 4);
    let graph = exec.capture(&mut backend, Mode::MultiSeq, 4).unwrap();
    wipe_logits(&exec, &mut backend, 4);
    exec.replay(&mut backend, &graph).unwrap();
    assert_same_bytes(
        &read_logits(&exec, &mut backend, 4),
        &all_rows,
        "multi_seq replay vs eager",
    );
    exec.release(&mut backend, graph).unwrap();
}

#[test]
fn free_is_refused_while_a_graph_lives() {
    let mut backend = backend();
    let allocations = backend.live_allocations();
    let mut exec = build_llama(&mut backend, roomy_kv());
    {
        // Metadata for the replay below.
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        session.decode(&mut backend, id, 5).unwrap();
    }
    let decode = exec.capture(&mut backend, Mode::Decode, 1).unwrap();
    let verify = exec.capture(&mut backend, Mode::Verify, 3).unwrap();
    match exec.free(&mut backend) {
        Err(ExecError::GraphsAlive { live }) => assert_eq!(live, 2),
        other => panic!("expected GraphsAlive, got {other:?}"),
    }
    // Still usable after the refusal.
    exec.replay(&mut backend, &decode).unwrap();
    exec.release(&mut backend, decode).unwrap();
    match exec.free(&mut backend) {
        Err(ExecError::GraphsAlive { live }) => assert_eq!(live, 1),
        other => panic!("expected GraphsAlive, got {other:?}"),
    }
    exec.release(&mut backend, verify).unwrap();
    exec.free(&mut backend).unwrap();
    assert_eq!(backend.live_allocations(), allocations);
}

#[test]
fn a_failed_capture_leaves_the_stream_usable() {
    let mut backend = backend();
    let mut exec = build_llama(&mut backend, roomy_kv());
    match exec.capture(&mut backend, Mode::MultiSeq, 3) {
        Err(ExecError::NoProgram { rows, .. }) => assert_eq!(rows, 3),
        other => panic!("expected NoProgram, got {other:?}"),
    }
    let graph = exec.capture(&mut backend, Mode::Decode, 1).unwrap();
    exec.release(&mut backend, graph).unwrap();
    exec.free(&mut backend).unwrap();
}

/// On the CPU backend the launches' range checks refuse it; `capture` itself does not look at
/// whether the exec was freed (a CUDA capture would record dangling pointers).
#[test]
fn capture_after_free_is_refused() {
    let mut backend = backend();
    let mut exec = build_llama(&mut backend, roomy_kv());
    exec.free(&mut backend).unwrap();
    assert!(exec.capture(&mut backend, Mode::Decode, 1).is_err());
}

#[test]
fn a_graph_replays_and_releases_only_on_the_exec_that_captured_it() {
    let mut backend = backend();
    let mut a = build_llama(&mut backend, roomy_kv());
    let mut b = build_llama(&mut backend, roomy_kv());
    let graph = a.capture(&mut backend, Mode::Decode, 1).unwrap();
    assert!(a.owns(&graph) && !b.owns(&graph));
    let err = b.replay(&mut backend, &graph).unwrap_err();
    assert!(
        matches!(err, ExecError::ForeignGraph { .. }) && err.to_string().contains("decode:1"),
        "{err}"
    );
    // Released on the wrong exec: refused, and the graph comes back to its owner.
    let graph = match b.release(&mut backend, graph) {
        Err(ExecError::ForeignGraph {
            graph: Some(graph), ..
        }) => *graph,
        other => panic!("expected the graph back, got {other:?}"),
    };
    assert!(matches!(
        a.free(&mut backend),
        Err(ExecError::GraphsAlive { live: 1 })
    ));
    a.release(&mut backend, graph).unwrap();
    // `release` consumed the handle: a second release does not compile, and `a` frees now.
    a.free(&mut backend).unwrap();
    b.free(&mut backend).unwrap();
}

/// The `pdl` lever: every launch programmatic, eagerly and when captured; the same plans
/// (digests) and the same logits bytes as the serial exec, replayed or eager.
#[test]
fn the_pdl_lever_launches_programmatically_with_the_same_plans_and_bytes() {
    use exec_support::{build, TINY_LLAMA};
    use solder_circuit::Policy;
    use solder_gpu_runtime::LaunchOrder;

    let mut backend = backend();
    let mut serial = build_llama(&mut backend, roomy_kv());
    let mut policy = Policy::default();
    policy
        .levers
        .set(solder_model_layers::PDL_LEVER, true)
        .unwrap();
    let mut pdl = build(&mut backend, TINY_LLAMA, policy, roomy_kv());
    assert_eq!(serial.launch_order(), LaunchOrder::Serial);
    assert_eq!(pdl.launch_order(), LaunchOrder::Programmatic);
    assert_eq!(serial.plans_digest(), pdl.plans_digest());
    assert!(pdl
        .programs()
        .iter()
        .all(|p| p.launch_order == LaunchOrder::Programmatic));

    let tokens = prompt(23, 128, 4);
    let decode = |exec: &CircuitExec, backend: &mut CpuBackend| {
        let mut session = Session::new(exec);
        let id = session.add_sequence();
        let mut last = Vec::new();
        for &t in &tokens {
            last = session.decode(backend, id, t).unwrap();
        }
        last
    };
    let expected = decode(&serial, &mut backend);
    let before = backend.programmatic_launches();
    let got = decode(&pdl, &mut backend);
    assert_same_bytes(&got, &expected, "pdl session vs serial session");
    // Each decode step either ran eagerly or captured its graph: programmatic launches.
    assert!(backend.programmatic_launches() > before);

    let launches = pdl.decode_program().unwrap().launches() as u64;
    let before = backend.programmatic_launches();
    let graph = pdl.capture(&mut backend, Mode::Decode, 1).unwrap();
    assert_eq!(backend.programmatic_launches(), before + launches);
    wipe_logits(&pdl, &mut backend, 1);
    pdl.replay(&mut backend, &graph).unwrap();
    assert_same_bytes(&read_logits(&pdl, &mut backend, 1), &expected, "pdl replay");
    let program = pdl.decode_program().unwrap().clone();
    wipe_logits(&pdl, &mut backend, 1);
    pdl.run(&mut backend, &program).unwrap();
    assert_eq!(backend.programmatic_launches(), before + 2 * launches);
    assert_same_bytes(&read_logits(&pdl, &mut backend, 1), &expected, "pdl eager");
    pdl.release(&mut backend, graph).unwrap();
    pdl.free(&mut backend).unwrap();
    serial.free(&mut backend).unwrap();
}
