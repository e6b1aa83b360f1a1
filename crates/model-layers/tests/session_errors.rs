//! `Session` refusals: each names what is wrong and leaves every sequence's state (length,
//! pages, KV cache) as it was, so the next valid step gives the logits it would have given.

mod exec_support;

use exec_support::{assert_same_bytes, backend, build_llama, kv, prompt, roomy_kv};
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{CircuitExec, SeqId, Session, SessionError};

const VOCAB: usize = 128;

/// `tokens` decoded alone in a fresh session; the last token's logits.
fn last_logits(exec: &CircuitExec, backend: &mut CpuBackend, tokens: &[u32]) -> Vec<f32> {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let mut last = Vec::new();
    for &t in tokens {
        last = session.decode(backend, id, t).unwrap();
    }
    last
}

/// A session with one sequence fed `tokens`.
fn fed<'e>(
    exec: &'e CircuitExec,
    backend: &mut CpuBackend,
    tokens: &[u32],
) -> (Session<'e>, SeqId) {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    for &t in tokens {
        session.decode(backend, id, t).unwrap();
    }
    (session, id)
}

/// Asserts the sequence is where it was and that decoding `next` gives the logits of the
/// history `tokens + [next]` decoded cleanly.
fn assert_untouched(
    session: &mut Session<'_>,
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    id: SeqId,
    tokens: &[u32],
    free_pages: usize,
) {
    assert_eq!(session.seq_len(id).unwrap(), tokens.len(), "seq_len moved");
    assert_eq!(session.free_page_count(), free_pages, "pages moved");
    let next = 42;
    let got = session.decode(backend, id, next).unwrap();
    let mut history = tokens.to_vec();
    history.push(next);
    assert_same_bytes(
        &got,
        &last_logits(exec, backend, &history),
        "the step after the refusal",
    );
}

#[test]
fn out_of_range_token_changes_nothing() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    // Four tokens fill the first page: the refused token would have taken a new one.
    let tokens = prompt(1, VOCAB, 4);
    let (mut session, id) = fed(&exec, &mut backend, &tokens);
    let free = session.free_page_count();
    match session.decode(&mut backend, id, VOCAB as u32) {
        Err(SessionError::TokenOutOfRange {
            token,
            index,
            vocab,
        }) => assert_eq!((token, index, vocab), (VOCAB as u32, 0, VOCAB)),
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    assert_untouched(&mut session, &mut backend, &exec, id, &tokens, free);
}

#[test]
fn out_of_range_token_in_a_multi_seq_step_advances_no_sequence() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut session = Session::new(&exec);
    let a = session.add_sequence();
    let b = session.add_sequence();
    session
        .multi_seq_step(&mut backend, &[(a, 1), (b, 2)])
        .unwrap();
    let free = session.free_page_count();
    match session.multi_seq_step(&mut backend, &[(a, 3), (b, u32::MAX)]) {
        Err(SessionError::TokenOutOfRange { token, index, .. }) => {
            assert_eq!((token, index), (u32::MAX, 1))
        }
        other => panic!("expected TokenOutOfRange, got {other:?}"),
    }
    assert_eq!(session.seq_len(a).unwrap(), 1);
    assert_eq!(session.seq_len(b).unwrap(), 1);
    assert_eq!(session.free_page_count(), free);
    let out = session
        .multi_seq_step(&mut backend, &[(a, 3), (b, 4)])
        .unwrap();
    assert_same_bytes(&out[0], &last_logits(&exec, &mut backend, &[1, 3]), "a");
    assert_same_bytes(&out[1], &last_logits(&exec, &mut backend, &[2, 4]), "b");
}

#[test]

fn a_refused_prefill_changes_nothing() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let free = session.free_page_count();
    let mut tokens = prompt(2, VOCAB, 10); // a verify-8 chunk, then a verify-2 chunk
    tokens[9] = VOCAB as u32;
    assert!(matches!(
        session.prefill(&mut backend, id, &tokens),
        Err(SessionError::TokenOutOfRange { .. })
    ));
    assert_untouched(&mut session, &mut backend, &exec, id, &[], free);
}

#[test]
fn position_past_the_limit_is_refused() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, kv(16, 4, 8));
    let tokens = prompt(3, VOCAB, 8);
    let (mut session, id) = fed(&exec, &mut backend, &tokens);
    let free = session.free_page_count();
    match session.decode(&mut backend, id, 1) {
        Err(SessionError::PositionPastLimit {
            seq,
            position,
            limit,
        }) => assert_eq!((seq, position, limit), (id, 8, 8)),
        other => panic!("expected PositionPastLimit, got {other:?}"),
    }
    assert_eq!(session.seq_len(id).unwrap(), 8);
    assert_eq!(session.free_page_count(), free);

    // A verify that would cross the limit is refused whole.
    let (mut session, id) = fed(&exec, &mut backend, &tokens[..6]);
    let free = session.free_page_count();
    match session.verify(&mut backend, id, &[1, 2, 3]) {
        Err(SessionError::PositionPastLimit { position, .. }) => assert_eq!(position, 8),
        other => panic!("expected PositionPastLimit, got {other:?}"),
    }
    assert_untouched(&mut session, &mut backend, &exec, id, &tokens[..6], free);
}

#[test]

fn limit_is_max_seq_len_not_whole_pages() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, kv(16, 4, 6));
    let (mut session, id) = fed(&exec, &mut backend, &prompt(4, VOCAB, 6));
    match session.decode(&mut backend, id, 1) {
        Err(SessionError::PositionPastLimit {
            position, limit, ..
        }) => {
            assert_eq!((position, limit), (6, 6))
        }
        other => panic!(
            "a 7th token with max_seq_len 6: {:?}",
            other.map(|logits| logits.len())
        ),
    }
}

#[test]
fn exhausted_pages_are_refused() {
    let mut backend = backend();
    // Two usable pages of 4 tokens.
    let exec = build_llama(&mut backend, kv(3, 4, 32));
    let tokens = prompt(5, VOCAB, 8);
    let (mut session, a) = fed(&exec, &mut backend, &tokens);
    assert_eq!(session.free_page_count(), 0);
    let b = session.add_sequence();
    match session.decode(&mut backend, b, 7) {
        Err(SessionError::PagesExhausted { needed, free }) => assert_eq!((needed, free), (1, 0)),
        other => panic!("expected PagesExhausted, got {other:?}"),
    }
    assert_eq!(session.seq_len(b).unwrap(), 0);
    match session.multi_seq_step(&mut backend, &[(a, 1), (b, 7)]) {
        Err(SessionError::PagesExhausted { needed, free }) => assert_eq!((needed, free), (2, 0)),
        other => panic!("expected PagesExhausted, got {other:?}"),
    }
    assert_eq!(session.seq_len(a).unwrap(), 8);
    assert_eq!(session.seq_len(b).unwrap(), 0);
    session.end_sequence(a).unwrap();
    assert_eq!(session.free_page_count(), 2);
    assert_untouched(&mut session, &mut backend, &exec, b, &[], 2);
}

#[test]
fn unknown_sequence_is_refused() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let (mut session, a) = fed(&exec, &mut backend, &[3, 4]);
    let free = session.free_page_count();
    assert!(matches!(
        session.decode(&mut backend, 999, 1),
        Err(SessionError::UnknownSequence(999))
    ));
    assert!(matches!(
        session.multi_seq_step(&mut backend, &[(a, 5), (999, 1)]),
        Err(SessionError::UnknownSequence(999))
    ));
    assert!(matches!(
        session.prefill(&mut backend, 999, &[1, 2, 3]),
        Err(SessionError::UnknownSequence(999))
    ));
    assert!(matches!(
        session.end_sequence(999),
        Err(SessionError::UnknownSequence(999))
    ));
    assert_untouched(&mut session, &mut backend, &exec, a, &[3, 4], free);
}

#[test]
fn a_sequence_twice_in_one_step_is_refused() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let (mut session, a) = fed(&exec, &mut backend, &[3]);
    let b = session.add_sequence();
    let free = session.free_page_count();
    match session.multi_seq_step(&mut backend, &[(a, 1), (b, 2), (a, 3)]) {
        Err(e @ SessionError::DuplicateSequence(_)) => {
            assert!(matches!(e, SessionError::DuplicateSequence(id) if id == a));
            assert!(e.to_string().contains(&a.to_string()), "{e}");
        }
        other => panic!("expected DuplicateSequence, got {other:?}"),
    }
    assert_eq!(session.seq_len(b).unwrap(), 0);
    assert_untouched(&mut session, &mut backend, &exec, a, &[3], free);
}

#[test]
fn a_step_wider_than_the_widest_program_is_refused() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut session = Session::new(&exec);
    let ids: Vec<_> = (0..9).map(|_| session.add_sequence()).collect();
    let free = session.free_page_count();
    let batch: Vec<_> = ids.iter().map(|&id| (id, 1)).collect();
    match session.multi_seq_step(&mut backend, &batch) {
        Err(SessionError::TooWide { asked, widest }) => assert_eq!((asked, widest), (9, 8)),
        other => panic!("expected TooWide, got {other:?}"),
    }
    assert_eq!(session.free_page_count(), free);
    assert!(ids.iter().all(|&id| session.seq_len(id).unwrap() == 0));
    session.multi_seq_step(&mut backend, &batch[..8]).unwrap();
}

#[test]
fn empty_inputs_are_refused() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let (mut session, a) = fed(&exec, &mut backend, &[3]);
    let free = session.free_page_count();
    assert!(matches!(
        session.prefill(&mut backend, a, &[]),
        Err(SessionError::Empty(_))
    ));
    assert!(matches!(
        session.verify(&mut backend, a, &[]),
        Err(SessionError::Empty(_))
    ));
    assert!(matches!(
        session.multi_seq_step(&mut backend, &[]),
        Err(SessionError::Empty(_))
    ));
    assert_untouched(&mut session, &mut backend, &exec, a, &[3], free);
}

#[test]
fn a_verify_width_without_a_program_is_refused() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let (mut session, a) = fed(&exec, &mut backend, &[3]);
    let free = session.free_page_count();
    assert!(matches!(
        session.verify(&mut backend, a, &[1; 9]),
        Err(SessionError::Exec(_))
    ));
    assert_untouched(&mut session, &mut backend, &exec, a, &[3], free);
}

#[test]
fn a_failed_run_gives_its_pages_back() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let tokens = prompt(6, VOCAB, 4); // the next token needs a new page
    let (mut session, a) = fed(&exec, &mut backend, &tokens);
    let free = session.free_page_count();
    // A backend that does not hold the exec's workspace: the upload fails.
    let mut stranger = exec_support::backend();
    assert!(matches!(
        session.decode(&mut stranger, a, 1),
        Err(SessionError::Exec(_))
    ));
    assert_untouched(&mut session, &mut backend, &exec, a, &tokens, free);
}
