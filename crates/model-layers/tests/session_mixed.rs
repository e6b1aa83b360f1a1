//! `Session::mixed_step`: decode rows and a prompt chunk in one batched-verify step (chunked
//! prefill sharing a step with decode). Each sequence gets the bytes of its own steps: the
//! decode sequences the tokens `next_tokens` gives them, greedy (taken on the device) or
//! sampled (drawn on the host from the rows read back), and the chunked prompt the next token
//! `prefill_chunk` + `prefill_next` give it; refused: a sequence twice, an empty chunk, more
//! rows than the widest batched-verify program.

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{CircuitExec, Sampling, SamplingParams, SeqId, Session, SessionError};

const VOCAB: usize = 128;

/// Two decoding sequences (the second sampled when `sampled`) and a third prompt fed in
/// chunks of 3 while they decode, then its last token: the decoding sequences' tokens and the
/// third's last logits, by separate steps (`next_tokens`, `prefill_chunk`) or by mixed steps.
fn run(
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    sampled: bool,
    mixed: bool,
) -> (Vec<Vec<u32>>, Vec<u32>) {
    let mut session = Session::new(exec);
    let mut live: Vec<(SeqId, u32)> = Vec::new();
    let mut out = vec![Vec::new(); 2];
    for i in 0..2u64 {
        let id = session.add_sequence();
        if sampled && i == 1 {
            let params = SamplingParams {
                temperature: 1.5,
                top_k: 0,
                top_p: 1.0,
                seed: 9,
            };
            session.set_sampling(id, Sampling::Sampled(params)).unwrap();
        }
        let next = session
            .prefill_next(backend, id, &prompt(40 + i, VOCAB, 5 + i as usize))
            .unwrap();
        out[i as usize].push(next);
        live.push((id, next));
    }
    let late = session.add_sequence();
    let late_prompt = prompt(50, VOCAB, 10);
    for chunk in late_prompt[..9].chunks(3) {
        let next = if mixed {
            session.mixed_step(backend, &live, (late, chunk)).unwrap()
        } else {
            session.prefill_chunk(backend, late, chunk).unwrap();
            session.next_tokens(backend, &live).unwrap()
        };
        for (i, token) in next.into_iter().enumerate() {
            out[i].push(token);
            live[i].1 = token;
        }
    }
    let logits = session
        .prefill_last(backend, late, &late_prompt[9..])
        .unwrap();
    (out, logits.iter().map(|v| v.to_bits()).collect())
}

#[test]
fn a_mixed_step_gives_every_sequence_the_bytes_of_its_own_steps() {
    // With the tensor cores too: their attention takes one sequence's rows a block in a
    // prefill program and one row a block in a batched verify, the same bytes either way.
    let mut backend = backend();
    let mut tensor_cores = Policy::default();
    tensor_cores.levers.set("tensor_cores", true).unwrap();
    for policy in [Policy::default(), tensor_cores] {
        let exec = build(&mut backend, TINY_LLAMA, policy, roomy_kv());
        for sampled in [false, true] {
            let separate = run(&mut backend, &exec, sampled, false);
            let mixed = run(&mut backend, &exec, sampled, true);
            assert_eq!(mixed, separate, "sampled {sampled}");
            assert_eq!(separate.0[0].len(), 4);
        }
    }
}

#[test]
fn a_mixed_step_refuses_a_sequence_twice_an_empty_chunk_and_too_many_rows() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut session = Session::new(&exec);
    let a = session.add_sequence();
    let b = session.add_sequence();
    let next = session.prefill_next(&mut backend, a, &[1, 2, 3]).unwrap();
    let twice = session.mixed_step(&mut backend, &[(a, next)], (a, &[4, 5]));
    assert!(matches!(twice, Err(SessionError::DuplicateSequence(id)) if id == a));
    let empty = session.mixed_step(&mut backend, &[(a, next)], (b, &[]));
    assert!(matches!(empty, Err(SessionError::Empty(_))));
    let long = vec![7u32; 4096];
    let wide = session.mixed_step(&mut backend, &[(a, next)], (b, &long));
    assert!(
        matches!(wide, Err(SessionError::TooWide { .. })),
        "{wide:?}"
    );
    // Nothing moved: the sequences step on as before.
    assert_eq!(session.seq_len(a).unwrap(), 3);
    assert_eq!(session.seq_len(b).unwrap(), 0);
    session
        .mixed_step(&mut backend, &[(a, next)], (b, &[4, 5]))
        .unwrap();
    assert_eq!(
        (session.seq_len(a).unwrap(), session.seq_len(b).unwrap()),
        (4, 2)
    );
}
