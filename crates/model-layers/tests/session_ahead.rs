//! `Session::next_tokens_ahead`: greedy steps enqueued back to back, each fed the step before's
//! tokens on the device, read back once. The tokens, and the sequences after them, are those of
//! `next_tokens` step by step: for one sequence (decode) and three (a multi-seq width with a
//! padding row), with and without the tensor cores, at 1 and at `IDS_SLOTS` steps; a sampled
//! sequence or a model with recurrent state runs step by step; `steps` outside 1..=IDS_SLOTS
//! is refused, naming the argument.

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{
    CircuitExec, Sampling, SamplingParams, SeqId, Session, SessionError, IDS_SLOTS,
};

const VOCAB: usize = 128;

/// `count` sequences prefilled (sequence 1 sampled when `sampled`), then `steps` tokens each
/// ahead or step by step, then one more `next_tokens` step: every sequence's tokens as the
/// session holds them, and the tokens of that last step.
fn run(
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    (count, steps, sampled): (u64, usize, bool),
    ahead: bool,
) -> (Vec<Vec<u32>>, Vec<Vec<u32>>, Vec<u32>) {
    let mut session = Session::new(exec);
    let mut batch: Vec<(SeqId, u32)> = Vec::new();
    for i in 0..count {
        let id = session.add_sequence();
        if sampled && i == 1 {
            let params = SamplingParams {
                temperature: 1.3,
                top_k: 0,
                top_p: 1.0,
                seed: 3,
            };
            session.set_sampling(id, Sampling::Sampled(params)).unwrap();
        }
        let next = session
            .prefill_next(backend, id, &prompt(60 + i, VOCAB, 3 + i as usize))
            .unwrap();
        batch.push((id, next));
    }
    let tokens = if ahead {
        session.next_tokens_ahead(backend, &batch, steps).unwrap()
    } else {
        let mut out = vec![Vec::new(); batch.len()];
        let mut feed = batch.clone();
        for _ in 0..steps {
            let next = session.next_tokens(backend, &feed).unwrap();
            for (i, t) in next.into_iter().enumerate() {
                out[i].push(t);
                feed[i].1 = t;
            }
        }
        out
    };
    let feed: Vec<(SeqId, u32)> = batch
        .iter()
        .zip(&tokens)
        .map(|(&(id, _), t)| (id, *t.last().unwrap()))
        .collect();
    let held = batch
        .iter()
        .map(|&(id, _)| session.tokens(id).unwrap().to_vec())
        .collect();
    let after = session.next_tokens(backend, &feed).unwrap();
    (tokens, held, after)
}

#[test]
fn steps_ahead_give_the_tokens_and_sequences_of_steps_one_by_one() {
    let mut backend = backend();
    let mut tensor_cores = Policy::default();
    tensor_cores.levers.set("tensor_cores", true).unwrap();
    for policy in [Policy::default(), tensor_cores] {
        let exec = build(&mut backend, TINY_LLAMA, policy, roomy_kv());
        for shape in [
            (1, IDS_SLOTS, false),
            (3, 5, false),
            (3, 1, false),
            (3, 4, true),
        ] {
            let one_by_one = run(&mut backend, &exec, shape, false);
            let ahead = run(&mut backend, &exec, shape, true);
            assert_eq!(ahead, one_by_one, "{shape:?}");
            assert!(ahead.0.iter().all(|t| t.len() == shape.1));
        }
    }
}

#[test]
fn a_model_with_recurrent_state_runs_its_steps_one_by_one() {
    let mut backend = backend();
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let shape = (2, 3, false);
    assert_eq!(
        run(&mut backend, &exec, shape, true),
        run(&mut backend, &exec, shape, false)
    );
}

#[test]
fn steps_outside_one_to_the_slots_are_refused_by_name() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let next = session.prefill_next(&mut backend, id, &[1, 2, 3]).unwrap();
    for steps in [0, IDS_SLOTS + 1] {
        let e = session
            .next_tokens_ahead(&mut backend, &[(id, next)], steps)
            .unwrap_err();
        assert!(
            matches!(e, SessionError::Argument { field: "steps", .. }),
            "{steps}: {e}"
        );
    }
    assert_eq!(session.seq_len(id).unwrap(), 3, "nothing ran");
}
