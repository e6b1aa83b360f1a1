//! Sliding-window attention through the Session: a windowed layer's keys are the last W
//! positions only (tokens further back change nothing), a window as long as the context is
//! full attention, KV pages that leave every layer's window go back to the pool (memory per
//! sequence bounded), and a step that finds too few pages is refused with nothing lost.

mod exec_support;

use exec_support::{assert_same_bytes, backend, build, kv, prompt};
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{CircuitExec, Session, SessionError};

const VOCAB: usize = 128;

/// A 2-layer Mistral with `window` (a JSON value) in every layer.
fn mistral(window: &str) -> String {
    format!(
        r#"{{
        "architectures": ["MistralForCausalLM"], "model_type": "mistral",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
        "vocab_size": {VOCAB}, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false, "rope_theta": 10000.0, "sliding_window": {window},
        "hidden_act": "silu"
    }}"#
    )
}

/// A 2-layer Qwen2 whose layer 0 attends over everything and layer 1 over the last 8.
const QWEN2_MIXED: &str = r#"{
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
    "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
    "rope_theta": 10000.0, "use_sliding_window": true, "sliding_window": 8,
    "max_window_layers": 1, "hidden_act": "silu"
}"#;

/// Pages of 4 tokens, sequences up to 64 tokens.
fn exec(backend: &mut CpuBackend, json: &str, pages: usize) -> CircuitExec {
    build(backend, json, Policy::default(), kv(pages, 4, 64))
}

/// `tokens` decoded one by one: every position's logits.
fn decode_all(exec: &CircuitExec, backend: &mut CpuBackend, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    tokens
        .iter()
        .map(|&t| session.decode(backend, id, t).unwrap())
        .collect()
}

#[test]
fn a_windowed_model_forgets_what_left_every_window() {
    let mut backend = backend();
    let windowed = exec(&mut backend, &mistral("8"), 40);
    let full = exec(&mut backend, &mistral("null"), 40);
    let a = prompt(1, VOCAB, 40);
    let mut b = a.clone();
    b[0] = (b[0] + 1) % VOCAB as u32;
    let (wa, wb) = (
        decode_all(&windowed, &mut backend, &a),
        decode_all(&windowed, &mut backend, &b),
    );
    // Token 0 reaches position p through two windowed layers while p - 0 <= 2 * (8 - 1).
    assert_ne!(wa[0], wb[0]);
    assert_ne!(
        wa[14], wb[14],
        "position 14 still sees token 0 through both layers"
    );
    for p in 15..40 {
        assert_same_bytes(&wa[p], &wb[p], &format!("windowed position {p}"));
    }
    let (fa, fb) = (
        decode_all(&full, &mut backend, &a),
        decode_all(&full, &mut backend, &b),
    );
    assert_ne!(fa[39], fb[39], "full attention still sees token 0 at 39");
}

#[test]
fn a_window_as_long_as_the_context_is_full_attention() {
    let mut backend = backend();
    let tokens = prompt(2, VOCAB, 24);
    let long = exec(&mut backend, &mistral("512"), 40);
    let none = exec(&mut backend, &mistral("null"), 40);
    let w24 = exec(&mut backend, &mistral("24"), 40);
    let (l, n, w) = (
        decode_all(&long, &mut backend, &tokens),
        decode_all(&none, &mut backend, &tokens),
        decode_all(&w24, &mut backend, &tokens),
    );
    for p in 0..24 {
        assert_same_bytes(&l[p], &n[p], &format!("window 512, position {p}"));
        assert_same_bytes(&w[p], &n[p], &format!("window 24, position {p}"));
    }
}

#[test]
fn pages_out_of_every_window_are_recycled() {
    let mut backend = backend();
    // Window 8 plus the widest verify width 8: the last 16 positions kept, in at most 5 pages
    // of 4 (6 while a step adds its token, before it recycles).
    let exec = exec(&mut backend, &mistral("8"), 8);
    let mut session = Session::new(&exec);
    assert_eq!(session.kv_keep(), Some(16));
    let id = session.add_sequence();
    for (i, &t) in prompt(3, VOCAB, 64).iter().enumerate() {
        session.decode(&mut backend, id, t).unwrap();
        let len = i + 1;
        let held = session.held_pages(id).unwrap();
        let kept_from = len.saturating_sub(16) / 4;
        assert_eq!(held, len.div_ceil(4) - kept_from, "at length {len}");
        assert!(held <= 5, "{held} pages at length {len}");
    }
    assert_eq!(session.held_pages(id).unwrap(), 4, "positions 48..64");
    assert_eq!(
        session.free_page_count(),
        3,
        "the rest are back in the pool"
    );
    session.end_sequence(id).unwrap();
    assert_eq!(
        session.free_page_count(),
        7,
        "every page back, the scratch page never"
    );
}

#[test]
fn recycled_decode_gives_the_bytes_of_a_roomy_pool() {
    let mut backend = backend();
    let tight = exec(&mut backend, &mistral("8"), 8);
    let roomy = exec(&mut backend, &mistral("8"), 40);
    let tokens = prompt(4, VOCAB, 64);
    let (t, r) = (
        decode_all(&tight, &mut backend, &tokens),
        decode_all(&roomy, &mut backend, &tokens),
    );
    for p in 0..64 {
        assert_same_bytes(&t[p], &r[p], &format!("position {p}"));
    }
    // A prefill (all or nothing: it holds its whole prompt's pages until it ends) recycles
    // once done, verify steps after each step; the same bytes.
    let mut session = Session::new(&tight);
    let id = session.add_sequence();
    let mut got = session.prefill(&mut backend, id, &tokens[..20]).unwrap();
    assert_eq!(session.held_pages(id).unwrap(), 4, "positions 4..20");
    for chunk in tokens[20..].chunks(8) {
        got.extend(session.verify(&mut backend, id, chunk).unwrap());
        assert!(session.held_pages(id).unwrap() <= 5);
    }
    assert_same_bytes(&got, &r.concat(), "prefill and verify on the tight pool");
}

#[test]
fn with_the_tensor_cores_chunks_on_a_recycling_pool_give_decodes_bytes() {
    // The tensor cores' attention (flash::paged_mma) takes a verify chunk's rows a block at a
    // time through one row's block table, windows starting in different tiles, pages before
    // them recycled: every position's logits are still the bytes decoding it one token at a
    // time gives (its own batch invariance), and recycling changes nothing.
    let mut backend = backend();
    let mut policy = Policy::default();
    policy.levers.set("tensor_cores", true).unwrap();
    let tight = build(&mut backend, &mistral("8"), policy.clone(), kv(8, 4, 64));
    let roomy = build(&mut backend, &mistral("8"), policy, kv(40, 4, 64));
    let tokens = prompt(5, VOCAB, 64);
    let decoded = decode_all(&roomy, &mut backend, &tokens);
    let mut session = Session::new(&tight);
    let id = session.add_sequence();
    let mut got = session.prefill(&mut backend, id, &tokens[..20]).unwrap();
    for chunk in tokens[20..].chunks(8) {
        got.extend(session.verify(&mut backend, id, chunk).unwrap());
    }
    assert_same_bytes(
        &got,
        &decoded.concat(),
        "chunks on the tight pool against decode",
    );
}

#[test]
fn a_full_attention_layer_keeps_every_page() {
    let mut backend = backend();
    let exec = exec(&mut backend, QWEN2_MIXED, 40);
    let mut session = Session::new(&exec);
    assert_eq!(session.kv_keep(), None);
    let id = session.add_sequence();
    for &t in &prompt(5, VOCAB, 40) {
        session.decode(&mut backend, id, t).unwrap();
    }
    assert_eq!(session.held_pages(id).unwrap(), 10);
}

#[test]
fn pages_exhausted_mid_window_are_refused_with_nothing_lost() {
    let mut backend = backend();
    // 6 pages to lend: one windowed sequence holds at most 5 between steps.
    let exec = exec(&mut backend, &mistral("8"), 7);
    let roomy = exec_roomy(&mut backend);
    let tokens = prompt(6, VOCAB, 40);
    let mut session = Session::new(&exec);
    let a = session.add_sequence();
    for &t in &tokens[..32] {
        session.decode(&mut backend, a, t).unwrap();
    }
    assert_eq!(session.held_pages(a).unwrap(), 4, "positions 16..32");
    let b = session.add_sequence();
    for &t in &tokens[..8] {
        session.decode(&mut backend, b, t).unwrap();
    }
    // b holds 2, a 4: nothing free; a verify of 8 on a needs 2 more pages.
    assert_eq!(session.free_page_count(), 0);
    let before = (session.seq_len(a).unwrap(), session.held_pages(a).unwrap());
    match session.verify(&mut backend, a, &tokens[32..40]) {
        Err(SessionError::PagesExhausted { needed, free }) => assert_eq!((needed, free), (2, 0)),
        other => panic!("expected PagesExhausted, got {other:?}"),
    }
    assert_eq!(
        (session.seq_len(a).unwrap(), session.held_pages(a).unwrap()),
        before,
        "nothing moved"
    );
    // Once b ends, a goes on as if the refused step never happened.
    session.end_sequence(b).unwrap();
    let got = session.verify(&mut backend, a, &tokens[32..40]).unwrap();
    let want = decode_all(&roomy, &mut backend, &tokens)[32..].concat();
    assert_same_bytes(&got, &want, "the verify after the refusal");
}

fn exec_roomy(backend: &mut CpuBackend) -> CircuitExec {
    exec(backend, &mistral("8"), 40)
}
