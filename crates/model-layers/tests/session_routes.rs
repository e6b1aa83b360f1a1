//! Qwen3-Next on the CPU: the runtime route (evenly pitched state slots take the arm), state
//! slots freed with their sequence and never lent by a failed step, and weights refused by
//! name (a missing expert, a wrong Gated DeltaNet shape).

mod exec_support;

use exec_support::*;
use safetensors::{Dtype, SafeTensors};
use solder_circuit::{Mode, Policy, RouteCondition};
use solder_model_layers::{Checkpoint, HostWeights, Session, WeightsError};

/// Each sequence's logits when it decodes alone.
fn alone(
    backend: &mut solder_gpu_runtime::CpuBackend,
    exec: &solder_model_layers::CircuitExec,
    prompt: &[u32],
) -> Vec<f32> {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let mut out = Vec::new();
    for &t in prompt {
        out.extend(session.decode(backend, id, t).expect("decode"));
    }
    out
}

#[test]
fn evenly_pitched_slots_take_the_arm_and_change_no_byte() {
    let mut backend = backend();
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    assert_eq!(
        exec.gdn_pitch.len(),
        1,
        "one Gated DeltaNet layer, one pitch"
    );
    assert!(exec
        .arms()
        .iter()
        .any(|p| p.mode == Mode::MultiSeq && p.rows == 4));
    let prompts: Vec<Vec<u32>> = (0..4).map(|s| prompt(s + 1, 128, 6)).collect();
    let expected: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| alone(&mut backend, &exec, p))
        .collect();

    for routes in [true, false] {
        let mut session = Session::new(&exec);
        session.set_routes(routes);
        let ids: Vec<_> = prompts.iter().map(|_| session.add_sequence()).collect();
        let mut got = vec![Vec::new(); 4];
        for t in 0..6 {
            let batch: Vec<_> = ids
                .iter()
                .zip(&prompts)
                .map(|(&id, p)| (id, p[t]))
                .collect();
            for (g, l) in got
                .iter_mut()
                .zip(session.multi_seq_step(&mut backend, &batch).expect("step"))
            {
                g.extend(l);
            }
            let arm = session.last_program().and_then(|(_, _, arm)| arm);
            if routes {
                assert_eq!(
                    arm,
                    Some(RouteCondition::GdnEvenPitch),
                    "fresh slots 1..=4 are evenly pitched"
                );
            } else {
                assert_eq!(arm, None);
            }
        }
        for (s, (g, e)) in got.iter().zip(&expected).enumerate() {
            assert_same_bytes(g, e, &format!("sequence {s}, routes {routes}"));
        }
    }
}

#[test]
fn uneven_slots_and_padding_rows_run_the_primary_program() {
    let mut backend = backend();
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let mut session = Session::new(&exec);
    let ids: Vec<_> = (0..4).map(|_| session.add_sequence()).collect();
    let step =
        |session: &mut Session<'_>, backend: &mut solder_gpu_runtime::CpuBackend, ids: &[u64]| {
            let batch: Vec<_> = ids.iter().map(|&id| (id, 7)).collect();
            session.multi_seq_step(backend, &batch).expect("step");
            session.last_program().expect("ran")
        };
    // Three live rows at width 4: the padding row's scratch slot breaks the pitch.
    assert_eq!(
        step(&mut session, &mut backend, &ids[..3]),
        (Mode::MultiSeq, 4, None)
    );
    // Each step writes its sequences' state into a run of spare slots (4, 5, 6), which they
    // then hold; the fourth sequence's fresh slot is the lowest free one, 1: 4, 5, 6, 1 is not
    // evenly pitched, so the primary runs.
    assert_eq!(step(&mut session, &mut backend, &ids).2, None);
    // The four now hold one run (7..=10) and write the next (1..=4): pitched both ways.
    assert_eq!(
        step(&mut session, &mut backend, &ids).2,
        Some(RouteCondition::GdnEvenPitch)
    );
    // Sequence 2 leaves; a newcomer takes its slot: 1, 3, 4, 2 is not evenly pitched.
    session.end_sequence(ids[1]).expect("end");
    let newcomer = session.add_sequence();
    let order = [ids[0], ids[2], ids[3], newcomer];
    assert_eq!(step(&mut session, &mut backend, &order).2, None);
}

#[test]
fn slots_return_with_their_sequences_and_run_out_cleanly() {
    let mut backend = backend();
    let mut small = roomy_kv();
    small.max_sequences = 2;
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), small);
    // Before the session: the exec's two slots are shared by every session on it.
    let c_alone = alone(&mut backend, &exec, &[3]);
    let mut session = Session::new(&exec);
    let (a, b, c) = (
        session.add_sequence(),
        session.add_sequence(),
        session.add_sequence(),
    );
    session.decode(&mut backend, a, 1).expect("a");
    session.decode(&mut backend, b, 2).expect("b");
    match session.decode(&mut backend, c, 3) {
        Err(e) => assert!(e.to_string().contains("slots exhausted"), "{e}"),
        Ok(_) => panic!("a third sequence ran with two slots"),
    }
    assert_eq!(
        session.seq_len(c).expect("c"),
        0,
        "the refused step changed nothing"
    );
    session.end_sequence(a).expect("end a");
    // c reuses a's slot, zeroed: its logits equal c decoded alone in a fresh session.
    let reused = session.decode(&mut backend, c, 3).expect("c after a left");
    assert_same_bytes(&reused, &c_alone, "reused slot starts from zeros");
}

#[test]
fn a_failed_step_lends_no_slot() {
    let mut backend = backend();
    let mut small = roomy_kv();
    small.max_sequences = 2;
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), small);
    let (a_alone, b_alone) = (
        alone(&mut backend, &exec, &[1]),
        alone(&mut backend, &exec, &[2]),
    );
    let mut session = Session::new(&exec);
    let (a, b) = (session.add_sequence(), session.add_sequence());
    let free = session.free_page_count();
    // A backend that does not hold the exec's state: refused before anything is lent.
    let mut stranger = exec_support::backend();
    assert!(session
        .multi_seq_step(&mut stranger, &[(a, 1), (b, 2)])
        .is_err());
    assert_eq!(session.free_page_count(), free);
    assert_eq!(
        (session.seq_len(a).unwrap(), session.seq_len(b).unwrap()),
        (0, 0)
    );
    // Both slots are still free, and each sequence starts from zeros.
    let logits = session
        .multi_seq_step(&mut backend, &[(a, 1), (b, 2)])
        .expect("two slots for two sequences");
    assert_same_bytes(&logits[0], &a_alone, "a");
    assert_same_bytes(&logits[1], &b_alone, "b");
}

/// The tiny model's weights as raw tensors, one per checkpoint name.
fn checkpoint_tensors() -> (solder_circuit::ir::Circuit, Vec<RawTensor>) {
    let dir = TempDir::new("next-save");
    let circuit = instance(&config(TINY_NEXT)).circuit;
    HostWeights::random(&circuit, 9)
        .save(&circuit, &dir.path().join("model.safetensors"))
        .expect("save");
    let bytes = std::fs::read(dir.path().join("model.safetensors")).expect("read");
    let file = SafeTensors::deserialize(&bytes).expect("parse");
    let tensors = file
        .tensors()
        .into_iter()
        .map(|(name, t)| RawTensor {
            name,
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            data: t.data().to_vec(),
        })
        .collect();
    (circuit, tensors)
}

fn load(
    tensors: &[RawTensor],
    circuit: &solder_circuit::ir::Circuit,
) -> Result<HostWeights, WeightsError> {
    let dir = TempDir::new("next-load");
    write_safetensors(&dir.path().join("model.safetensors"), tensors);
    HostWeights::load(circuit, &Checkpoint::open(dir.path())?)
}

#[test]
fn saved_experts_reload_and_a_missing_expert_is_named() {
    let (circuit, mut tensors) = checkpoint_tensors();
    assert!(
        tensors
            .iter()
            .any(|t| t.name == "model.layers.0.mlp.experts.3.up_proj.weight"),
        "one tensor per expert"
    );
    load(&tensors, &circuit).expect("the saved checkpoint loads");
    tensors.retain(|t| t.name != "model.layers.1.mlp.experts.2.gate_proj.weight");
    match load(&tensors, &circuit) {
        Err(WeightsError::Missing { tensor, .. }) => {
            assert_eq!(tensor, "model.layers.1.mlp.experts.2.gate_proj.weight")
        }
        Err(other) => panic!("expected Missing, got {other}"),
        Ok(_) => panic!("loaded without an expert"),
    }
}

#[test]
fn a_wrong_gated_deltanet_shape_is_named() {
    let (circuit, mut tensors) = checkpoint_tensors();
    let conv = tensors
        .iter_mut()
        .find(|t| t.name == "model.layers.0.linear_attn.conv1d.weight")
        .expect("conv weight");
    // A kernel of 3 instead of 4: same channel count, wrong width.
    let channels = conv.shape[0];
    conv.shape = vec![channels, 1, 3];
    conv.data.truncate(channels * 3 * 2);
    assert_eq!(conv.dtype, Dtype::BF16);
    match load(&tensors, &circuit) {
        Err(WeightsError::Shape {
            tensor,
            found,
            expected,
            ..
        }) => {
            assert_eq!(tensor, "model.layers.0.linear_attn.conv1d.weight");
            assert_eq!(
                (found, expected),
                (vec![channels, 1, 3], vec![channels, 1, 4])
            );
        }
        Err(other) => panic!("expected Shape, got {other}"),
        Ok(_) => panic!("loaded a wrong conv shape"),
    }
}

#[test]
fn route_arms_are_planned_against_the_arena_kept_and_digested() {
    let mut backend = backend();
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let arms: Vec<_> = exec.arm_plans().collect();
    assert!(!arms.is_empty(), "tiny qwen3_next has route arms");
    assert_eq!(arms.len(), exec.arms().len(), "every arm's plan is kept");
    for (condition, plan) in &arms {
        assert_eq!(*condition, RouteCondition::GdnEvenPitch);
        assert!(
            plan.pool_bytes <= exec.layout.arena_bytes,
            "arm {} at {} rows needs {} B, the arena has {} B",
            plan.mode,
            plan.rows,
            plan.pool_bytes,
            exec.layout.arena_bytes
        );
        // Printable like any plan.
        let text = plan.display(&exec.instance.circuit).to_string();
        assert!(text.contains("gdn::gates_recurrence_pitched"), "{text}");
    }
    // The digest covers the primaries, then the arms.
    let primaries = solder_circuit::plans_digest(&exec.plans);
    let all = solder_circuit::plans_digest(exec.plans.iter().chain(arms.iter().map(|(_, p)| *p)));
    assert_eq!(exec.plans_digest(), all);
    assert_ne!(exec.plans_digest(), primaries, "the arms change the digest");
}

#[test]
fn the_arena_is_sized_for_the_largest_plan_arms_included() {
    use solder_model_layers::Layout;
    let mut backend = backend();
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let primary = &exec.plans[0];
    let mut bigger = primary.clone();
    bigger.pool_bytes = exec.layout.arena_bytes * 4;
    let layout = Layout::new(
        &exec.instance.circuit,
        &[primary, &bigger],
        128,
        8,
        4,
        64,
        2,
    );
    assert!(
        layout.arena_bytes >= bigger.pool_bytes,
        "{}",
        layout.arena_bytes
    );
}
