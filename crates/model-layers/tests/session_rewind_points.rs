//! A `RewindPoint` names the exec, session, sequence and history generation it was taken at
//! (issue 19 item 4): another session's sequence of the same id, another exec's session, and
//! its own sequence after its history was cut below the point all refuse it with an error
//! and every sequence left byte for byte as it was; a point whose prefix is intact still
//! serves, however often it is used.

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{CircuitExec, SeqId, Session, SessionError};

/// A sequence's length, tokens and recurrent state (as a fresh point holds it).
fn snapshot(
    session: &Session<'_>,
    backend: &mut CpuBackend,
    id: SeqId,
) -> (usize, Vec<u32>, Vec<Vec<u8>>) {
    let point = session.rewind_point(backend, id).expect("point");
    (
        session.seq_len(id).unwrap(),
        session.tokens(id).unwrap().to_vec(),
        point.state_bytes().to_vec(),
    )
}

fn feed(
    session: &mut Session<'_>,
    backend: &mut CpuBackend,
    id: SeqId,
    tokens: &[u32],
) -> Vec<f32> {
    let mut last = Vec::new();
    for &t in tokens {
        last = session.decode(backend, id, t).expect("decode");
    }
    last
}

fn next_exec(backend: &mut CpuBackend) -> CircuitExec {
    build(backend, TINY_NEXT, Policy::default(), roomy_kv())
}

fn assert_rewind_refused(err: SessionError, words: &str) {
    let message = err.to_string();
    assert!(matches!(err, SessionError::Rewind(_)), "{message}");
    assert!(message.contains(words), "{message}");
}

#[test]
fn another_sessions_sequence_of_the_same_id_refuses_the_point() {
    let mut backend = backend();
    let exec = next_exec(&mut backend);
    let mut a = Session::new(&exec);
    let mut b = Session::new(&exec);
    let (ida, idb) = (a.add_sequence(), b.add_sequence());
    assert_eq!(
        ida, idb,
        "the test needs the same sequence id in both sessions"
    );
    feed(&mut a, &mut backend, ida, &[1, 2, 3]);
    feed(&mut b, &mut backend, idb, &[7, 8, 9, 10]);
    let point = a.rewind_point(&mut backend, ida).unwrap();
    let before = snapshot(&b, &mut backend, idb);
    let err = b.rewind(&mut backend, &point).unwrap_err();
    assert_rewind_refused(err, "session");
    assert_eq!(
        snapshot(&b, &mut backend, idb),
        before,
        "session B's sequence moved"
    );
    // A still takes its own point.
    a.rewind(&mut backend, &point).expect("its own session");
}

#[test]
fn another_execs_session_refuses_the_point() {
    let mut backend = backend();
    let one = next_exec(&mut backend);
    let two = next_exec(&mut backend);
    let mut a = Session::new(&one);
    let mut b = Session::new(&two);
    let (ida, idb) = (a.add_sequence(), b.add_sequence());
    feed(&mut a, &mut backend, ida, &[1, 2]);
    feed(&mut b, &mut backend, idb, &[3, 4, 5]);
    let point = a.rewind_point(&mut backend, ida).unwrap();
    let before = snapshot(&b, &mut backend, idb);
    let err = b.rewind(&mut backend, &point).unwrap_err();
    assert_rewind_refused(err, "exec");
    assert_eq!(snapshot(&b, &mut backend, idb), before);
}

#[test]
fn a_point_taken_before_an_earlier_rewind_is_refused_after_new_tokens() {
    let mut backend = backend();
    let exec = next_exec(&mut backend);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    feed(&mut session, &mut backend, id, &[1, 2]);
    let early = session.rewind_point(&mut backend, id).unwrap();
    feed(&mut session, &mut backend, id, &[3, 4]);
    let late = session.rewind_point(&mut backend, id).unwrap();
    session
        .rewind(&mut backend, &early)
        .expect("back to 2 tokens");
    // Other tokens fed: the sequence is longer than `late` again, with another history.
    feed(&mut session, &mut backend, id, &[9, 9, 9]);
    let before = snapshot(&session, &mut backend, id);
    let err = session.rewind(&mut backend, &late).unwrap_err();
    assert_rewind_refused(err, "taken back to 2 tokens");
    assert_eq!(
        snapshot(&session, &mut backend, id),
        before,
        "the refused rewind moved it"
    );
    // The same holds after a truncation by a failed or partial use: `early` still serves.
    session
        .rewind(&mut backend, &early)
        .expect("early still serves");
}

#[test]
fn a_point_below_every_cut_keeps_serving_and_gives_the_same_state() {
    let mut backend = backend();
    let exec = next_exec(&mut backend);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    feed(&mut session, &mut backend, id, &[5, 6, 7]);
    let p3 = session.rewind_point(&mut backend, id).unwrap();
    let at3 = snapshot(&session, &mut backend, id);
    feed(&mut session, &mut backend, id, &[8, 9]);
    let p5 = session.rewind_point(&mut backend, id).unwrap();
    let after = feed(&mut session, &mut backend, id, &[10, 11]);
    session.rewind(&mut backend, &p5).expect("to 5");
    let again = feed(&mut session, &mut backend, id, &[10, 11]);
    assert_same_bytes(&again, &after, "fed again after the rewind to 5");
    // Cuts to 5 and 7 lie above p3: it still describes the sequence's prefix.
    session.rewind(&mut backend, &p3).expect("to 3");
    assert_eq!(snapshot(&session, &mut backend, id), at3);
    session.rewind(&mut backend, &p3).expect("to 3 again");
    assert_eq!(snapshot(&session, &mut backend, id), at3);
    // p5 was taken after p3 and the history was cut to 3 since: refused.
    feed(&mut session, &mut backend, id, &[8, 9, 1]);
    assert_rewind_refused(
        session.rewind(&mut backend, &p5).unwrap_err(),
        "taken back to 3",
    );
}

#[test]
fn a_kv_only_model_checks_the_same_names() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut a = Session::new(&exec);
    let mut b = Session::new(&exec);
    let (ida, idb) = (a.add_sequence(), b.add_sequence());
    feed(&mut a, &mut backend, ida, &[1, 2, 3]);
    feed(&mut b, &mut backend, idb, &[1, 2, 3, 4]);
    let point = a.rewind_point(&mut backend, ida).unwrap();
    assert_rewind_refused(b.rewind(&mut backend, &point).unwrap_err(), "session");
    assert_eq!(b.seq_len(idb).unwrap(), 4);
    a.truncate_to(ida, 1).unwrap();
    feed(&mut a, &mut backend, ida, &[4, 4, 4]);
    assert_rewind_refused(
        a.rewind(&mut backend, &point).unwrap_err(),
        "taken back to 1",
    );
    assert_eq!(a.tokens(ida).unwrap(), &[1, 4, 4, 4]);
}

/// A 2-layer Mistral with a window of 8 in every layer (pages out of it are recycled).
const MISTRAL_WINDOW_8: &str = r#"{
    "architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
    "vocab_size": 128, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": false, "rope_theta": 10000.0, "sliding_window": 8,
    "hidden_act": "silu"
}"#;

#[test]
fn a_take_back_past_a_recycled_window_page_is_refused() {
    let mut backend = backend();
    let exec = build(
        &mut backend,
        MISTRAL_WINDOW_8,
        Policy::default(),
        kv(12, 4, 64),
    );
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let early = session.rewind_point(&mut backend, id).unwrap();
    feed(&mut session, &mut backend, id, &prompt(3, 128, 5));
    let p5 = session.rewind_point(&mut backend, id).unwrap();
    feed(&mut session, &mut backend, id, &prompt(4, 128, 35));
    // Window 8 + widest verify 8 keep positions 24..40; the pages before went to the pool.
    let held = (
        session.seq_len(id).unwrap(),
        session.held_pages(id).unwrap(),
    );
    let tokens = session.tokens(id).unwrap().to_vec();
    for err in [
        session.truncate_to(id, 10).unwrap_err(),
        session.rewind(&mut backend, &p5).unwrap_err(),
    ] {
        assert_rewind_refused(err, "sliding window");
        assert_eq!(
            (
                session.seq_len(id).unwrap(),
                session.held_pages(id).unwrap()
            ),
            held
        );
        assert_eq!(session.tokens(id).unwrap(), tokens.as_slice());
    }
    // Within the kept margin it still works, and so does going back to the empty sequence
    // (its next step reads nothing before it).
    session
        .truncate_to(id, 32)
        .expect("back by the widest verify width");
    // Positions 24..32 are the window of a step at 32; 20..24 went back to the pool.
    session
        .truncate_to(id, 31)
        .expect("window 24..=31: block 5 is not read");
    assert_rewind_refused(session.truncate_to(id, 30).unwrap_err(), "sliding window");
    session
        .rewind(&mut backend, &early)
        .expect("back to no tokens");
    assert_eq!(session.held_pages(id).unwrap(), 0);
    feed(&mut session, &mut backend, id, &[1, 2, 3]);
}

#[test]
fn a_rewind_whose_state_copy_fails_part_way_leaves_the_sequence_as_it_was() {
    let mut backend = backend();
    let exec = next_exec(&mut backend);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    feed(&mut session, &mut backend, id, &[3, 1, 4]);
    let point = session.rewind_point(&mut backend, id).unwrap();
    assert!(
        point.state_bytes().len() > 1,
        "the test needs two state regions"
    );
    feed(&mut session, &mut backend, id, &[1, 5]);
    let before = snapshot(&session, &mut backend, id);
    // The second region's copy fails, after the first was written.
    backend.fail_call("copy_h2d", 1);
    session.rewind(&mut backend, &point).unwrap_err();
    assert_eq!(
        snapshot(&session, &mut backend, id),
        before,
        "a failed rewind moved it"
    );
    session
        .rewind(&mut backend, &point)
        .expect("the rewind then succeeds");
}

#[test]
fn a_truncation_is_refused_only_for_a_sequence_holding_recurrent_state() {
    let mut backend = backend();
    let exec = next_exec(&mut backend);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    // No step yet: no state slot, so nothing a truncation could fail to take back.
    session
        .truncate_to(id, 0)
        .expect("a sequence holding no state");
    feed(&mut session, &mut backend, id, &[3, 1, 4]);
    let before = snapshot(&session, &mut backend, id);
    assert_rewind_refused(
        session.truncate_to(id, 1).unwrap_err(),
        "keeps recurrent state",
    );
    assert_eq!(snapshot(&session, &mut backend, id), before);
}
