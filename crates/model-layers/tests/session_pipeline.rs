//! `Session::start_pipeline` / `pipeline_next` / `stop_pipeline`: greedy steps kept in flight,
//! each step's ids copied back on their own stream. The tokens, and the sequences after a stop,
//! are those of `next_tokens` step by step: one sequence and three, `ahead` from 1 to
//! `IDS_SLOTS - 1`, past `IDS_SLOTS` steps (the ids slots go round), with and without the
//! tensor cores, stopped early or late. While open, every other step and change is refused;
//! a failed step closes the pipeline with the sequences at the tokens returned; refused starts
//! run nothing; a stop gives back the stream, events and readbacks it made. The CPU backend's
//! race tracker checks every cross-stream order the pipeline relies on.

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{
    CircuitExec, Sampling, SamplingParams, SeqId, Session, SessionError, IDS_SLOTS,
};

const VOCAB: usize = 128;

/// `count` sequences, each prefilled with its own prompt: the session and each sequence's
/// first fed token.
fn prefilled<'e>(
    backend: &mut CpuBackend,
    exec: &'e CircuitExec,
    count: u64,
) -> (Session<'e>, Vec<(SeqId, u32)>) {
    let mut session = Session::new(exec);
    let mut batch = Vec::new();
    for i in 0..count {
        let id = session.add_sequence();
        let next = session
            .prefill_next(backend, id, &prompt(60 + i, VOCAB, 3 + i as usize))
            .unwrap();
        batch.push((id, next));
    }
    (session, batch)
}

/// What a run leaves: each sequence's tokens per step, the tokens its cache holds, and the
/// tokens of one more `next_tokens` step fed the last ones.
type Outcome = (Vec<Vec<u32>>, Vec<Vec<u32>>, Vec<u32>);

/// `steps` tokens a sequence, through a pipeline (`Some(ahead)`) or `next_tokens`.
fn run(
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    (count, steps): (u64, usize),
    ahead: Option<usize>,
) -> Outcome {
    let (mut session, batch) = prefilled(backend, exec, count);
    let mut out = vec![Vec::new(); batch.len()];
    let mut feed = batch.clone();
    match ahead {
        Some(ahead) => {
            session.start_pipeline(backend, &batch, ahead).unwrap();
            for _ in 0..steps {
                let next = session.pipeline_next(backend).unwrap();
                for (i, t) in next.into_iter().enumerate() {
                    out[i].push(t);
                    feed[i].1 = t;
                }
            }
            assert!(session.pipeline_open());
            session.stop_pipeline(backend).unwrap();
            assert!(!session.pipeline_open());
        }
        None => {
            for _ in 0..steps {
                let next = session.next_tokens(backend, &feed).unwrap();
                for (i, t) in next.into_iter().enumerate() {
                    out[i].push(t);
                    feed[i].1 = t;
                }
            }
        }
    }
    let held = batch
        .iter()
        .map(|&(id, _)| session.tokens(id).unwrap().to_vec())
        .collect();
    let after = session.next_tokens(backend, &feed).unwrap();
    (out, held, after)
}

#[test]
fn a_pipeline_gives_the_tokens_and_sequences_of_steps_one_by_one() {
    let mut backend = backend();
    let mut tensor_cores = Policy::default();
    tensor_cores.levers.set("tensor_cores", true).unwrap();
    for policy in [Policy::default(), tensor_cores] {
        let exec = build(&mut backend, TINY_LLAMA, policy, roomy_kv());
        for (shape, ahead) in [
            ((1, IDS_SLOTS + 3), 1),
            ((3, 2 * IDS_SLOTS + 1), 2),
            ((3, IDS_SLOTS + 2), IDS_SLOTS - 1),
            ((2, 1), 3),
        ] {
            let one_by_one = run(&mut backend, &exec, shape, None);
            let piped = run(&mut backend, &exec, shape, Some(ahead));
            assert_eq!(piped, one_by_one, "{shape:?} ahead {ahead}");
            assert!(piped.0.iter().all(|t| t.len() == shape.1));
        }
        assert_eq!(
            backend.live_streams(),
            1,
            "every pipeline's stream destroyed"
        );
        assert_eq!(backend.live_readbacks(), 0);
    }
}

#[test]
fn stopping_at_once_leaves_the_sequences_as_they_were() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let (mut session, batch) = prefilled(&mut backend, &exec, 2);
    let before: Vec<Vec<u32>> = batch
        .iter()
        .map(|&(id, _)| session.tokens(id).unwrap().to_vec())
        .collect();
    let events = backend.live_events();
    session.start_pipeline(&mut backend, &batch, 4).unwrap();
    assert!(
        session.seq_len(batch[0].0).unwrap() > before[0].len(),
        "steps ran"
    );
    assert_eq!(backend.live_streams(), 2);
    session.stop_pipeline(&mut backend).unwrap();
    for (&(id, _), tokens) in batch.iter().zip(&before) {
        assert_eq!(session.tokens(id).unwrap(), &tokens[..]);
    }
    assert_eq!(backend.live_streams(), 1);
    assert_eq!(backend.live_events(), events);
    assert_eq!(
        backend.live_readbacks(),
        0,
        "the readbacks in flight were released"
    );
    // Stopping again, with none open, is nothing.
    session.stop_pipeline(&mut backend).unwrap();
    assert!(matches!(
        session.pipeline_next(&mut backend),
        Err(SessionError::NoPipeline)
    ));
}

#[test]
fn an_open_pipeline_refuses_every_other_step_and_change() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let (mut session, batch) = prefilled(&mut backend, &exec, 2);
    let other = session.add_sequence();
    session
        .start_pipeline(&mut backend, &batch[..1], 2)
        .unwrap();
    let first = session.pipeline_next(&mut backend).unwrap();
    let (id, _) = batch[0];
    let refused = |e: SessionError, call: &str| {
        assert!(
            matches!(e, SessionError::PipelineOpen { call: c } if c == call),
            "{call}: {e}"
        );
    };
    refused(
        session.next_tokens(&mut backend, &batch[1..]).unwrap_err(),
        "a step",
    );
    refused(
        session
            .prefill_next(&mut backend, other, &[1, 2])
            .unwrap_err(),
        "a step",
    );
    refused(
        session
            .next_tokens_ahead(&mut backend, &batch[1..], 2)
            .unwrap_err(),
        "a step",
    );
    refused(session.end_sequence(id).unwrap_err(), "end_sequence");
    refused(session.truncate_to(id, 1).unwrap_err(), "truncate_to");
    refused(session.fork(&mut backend, id).unwrap_err(), "fork");
    refused(
        session.set_sampling(id, Sampling::Greedy).unwrap_err(),
        "set_sampling",
    );
    refused(
        session
            .start_pipeline(&mut backend, &batch[1..], 1)
            .unwrap_err(),
        "start_pipeline",
    );
    // The pipeline goes on as if nothing was asked.
    let second = session.pipeline_next(&mut backend).unwrap();
    session.stop_pipeline(&mut backend).unwrap();
    let (mut alone, alone_batch) = prefilled(&mut backend, &exec, 1);
    let want_first = alone.next_tokens(&mut backend, &alone_batch).unwrap();
    let want_second = alone
        .next_tokens(&mut backend, &[(alone_batch[0].0, want_first[0])])
        .unwrap();
    assert_eq!((first, second), (want_first, want_second));
    // Closed, everything is allowed again.
    session.end_sequence(id).unwrap();
}

#[test]
fn refused_starts_run_nothing_and_keep_nothing() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let (mut session, batch) = prefilled(&mut backend, &exec, 2);
    let len = session.seq_len(batch[0].0).unwrap();
    let events = backend.live_events();
    for ahead in [0, IDS_SLOTS] {
        let e = session
            .start_pipeline(&mut backend, &batch, ahead)
            .unwrap_err();
        assert!(
            matches!(e, SessionError::Argument { field: "ahead", .. }),
            "{ahead}: {e}"
        );
    }
    assert!(matches!(
        session.start_pipeline(&mut backend, &[], 1),
        Err(SessionError::Empty(_))
    ));
    assert!(matches!(
        session.start_pipeline(&mut backend, &[(99, 1)], 1),
        Err(SessionError::UnknownSequence(99))
    ));
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        seed: 1,
    };
    session
        .set_sampling(batch[1].0, Sampling::Sampled(params))
        .unwrap();
    let e = session.start_pipeline(&mut backend, &batch, 1).unwrap_err();
    assert!(e.to_string().contains("samples"), "{e}");
    // A step refused by the step itself (a token past the vocabulary) closes the pipeline.
    let e = session
        .start_pipeline(&mut backend, &[(batch[0].0, VOCAB as u32)], 2)
        .unwrap_err();
    assert!(matches!(e, SessionError::TokenOutOfRange { .. }), "{e}");
    assert!(!session.pipeline_open());
    // The device refusing the pipeline's third event: the stream and events made go back.
    backend.fail_call("create_event", 2);
    let e = session
        .start_pipeline(&mut backend, &batch[..1], 1)
        .unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert!(!session.pipeline_open());
    assert_eq!(session.seq_len(batch[0].0).unwrap(), len, "nothing ran");
    assert_eq!(backend.live_streams(), 1);
    assert_eq!(backend.live_events(), events);

    let next = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let (mut recurrent, batch) = prefilled(&mut backend, &next, 1);
    let e = recurrent
        .start_pipeline(&mut backend, &batch, 1)
        .unwrap_err();
    assert!(e.to_string().contains("recurrent state"), "{e}");
}

#[test]
fn a_failed_step_closes_the_pipeline_at_the_tokens_returned() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let shape = (3, 9);
    let (one_by_one, _, _) = run(&mut backend, &exec, shape, None);
    let (mut session, batch) = prefilled(&mut backend, &exec, shape.0);
    let start: Vec<usize> = batch
        .iter()
        .map(|&(id, _)| session.seq_len(id).unwrap())
        .collect();
    session.start_pipeline(&mut backend, &batch, 3).unwrap();
    let mut got = vec![Vec::new(); batch.len()];
    for _ in 0..4 {
        for (row, t) in session
            .pipeline_next(&mut backend)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            got[row].push(t);
        }
    }
    // A copy back the device refuses fails the step that queued it, which closes the pipeline
    // the same way a failed launch does (checked below on the launch).
    let (mut other, other_batch) = prefilled(&mut backend, &exec, 1);
    other.start_pipeline(&mut backend, &other_batch, 1).unwrap();
    backend.fail_call("copy_d2h_async", 0);
    assert!(other.pipeline_next(&mut backend).is_err());
    assert!(!other.pipeline_open());
    assert_eq!(
        other.seq_len(other_batch[0].0).unwrap(),
        3,
        "back to its prompt"
    );
    drop(other);
    backend.fail_call("launch", 0);
    let e = session.pipeline_next(&mut backend).unwrap_err();
    assert!(e.to_string().contains("injected"), "{e}");
    assert!(!session.pipeline_open());
    assert_eq!(backend.live_streams(), 1);
    assert_eq!(backend.live_readbacks(), 0);
    // Each sequence holds the tokens fed in the 4 steps returned; the 4th token is pending.
    let mut feed = batch.clone();
    for (row, &(id, token)) in batch.iter().enumerate() {
        assert_eq!(got[row], one_by_one[row][..4]);
        assert_eq!(session.seq_len(id).unwrap(), start[row] + 4);
        let tail = &session.tokens(id).unwrap()[start[row]..];
        assert_eq!(tail[0], token);
        assert_eq!(tail[1..], got[row][..3]);
        feed[row].1 = got[row][3];
    }
    // Decoding goes on from there as if the pipeline had never run.
    let next = session.next_tokens(&mut backend, &feed).unwrap();
    let want: Vec<u32> = one_by_one.iter().map(|t| t[4]).collect();
    assert_eq!(next, want);
}
