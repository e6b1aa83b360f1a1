//! Forks and growth of the KV pool: a fork decodes the bytes a fresh sequence fed the same
//! tokens decodes, its parent undisturbed; four forks of one prompt step together in one
//! multi-seq step, each as alone; every page comes back when every sequence ends; a pool grown
//! mid-decode (`Session::park`, `CircuitExec::grow_kv`, `ParkedSession::resume`) decodes what
//! a pool big from the start decodes.

mod exec_support;

use exec_support::{assert_same_bytes, backend, build, kv, prompt, TINY_LLAMA, TINY_NEXT};
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{CircuitExec, Session};

const VOCAB: usize = 128;

/// A 2-layer Mistral attending over the last 8 positions in every layer.
const TINY_MISTRAL_WINDOW: &str = r#"{
    "architectures": ["MistralForCausalLM"], "model_type": "mistral",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
    "vocab_size": 128, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": false, "rope_theta": 10000.0, "sliding_window": 8,
    "hidden_act": "silu"
}"#;

fn families() -> [(&'static str, &'static str); 3] {
    [
        ("llama", TINY_LLAMA),
        ("mistral windowed", TINY_MISTRAL_WINDOW),
        ("qwen3_next", TINY_NEXT),
    ]
}

/// Pages of 4 tokens, sequences up to 32.
fn exec(backend: &mut CpuBackend, json: &str, pages: usize) -> CircuitExec {
    build(backend, json, Policy::default(), kv(pages, 4, 32))
}

/// Every position's logits of `tokens` decoded one by one in a fresh sequence.
fn alone(exec: &CircuitExec, backend: &mut CpuBackend, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    tokens
        .iter()
        .map(|&t| session.decode(backend, id, t).unwrap())
        .collect()
}

#[test]
fn a_fork_decodes_what_a_fresh_sequence_decodes_and_leaves_its_parent() {
    for (family, json) in families() {
        let mut backend = backend();
        let exec = exec(&mut backend, json, 40);
        // 10 tokens: two full pages shared, the partial third copied.
        let shared = prompt(1, VOCAB, 10);
        let (tail_a, tail_b) = (prompt(2, VOCAB, 9), prompt(3, VOCAB, 9));
        let expect_a = alone(
            &exec,
            &mut backend,
            &[shared.clone(), tail_a.clone()].concat(),
        );
        let expect_b = alone(
            &exec,
            &mut backend,
            &[shared.clone(), tail_b.clone()].concat(),
        );
        let mut session = Session::new(&exec);
        let parent = session.add_sequence();
        for &t in &shared {
            session.decode(&mut backend, parent, t).unwrap();
        }
        let child = session.fork(&mut backend, parent).unwrap();
        if family != "qwen3_next" {
            // Cutting the parent into a page its fork shares is refused, not corrupting.
            let refused = session.truncate_to(parent, 6).unwrap_err().to_string();
            assert!(refused.contains("shares"), "{family}: {refused}");
        }
        for i in 0..tail_a.len() {
            let a = session.decode(&mut backend, parent, tail_a[i]).unwrap();
            let b = session.decode(&mut backend, child, tail_b[i]).unwrap();
            let at = shared.len() + i;
            assert_same_bytes(&a, &expect_a[at], &format!("{family}: parent at {at}"));
            assert_same_bytes(&b, &expect_b[at], &format!("{family}: fork at {at}"));
        }
        session.end_sequence(parent).unwrap();
        session.end_sequence(child).unwrap();
        // Parking returns nothing to the pools: `resize_kv` needs every page back, so it
        // proves the ends gave back every shared page once its last holder let go.
        let parked = session.park();
        let mut exec = exec;
        exec.resize_kv(&mut backend, 40)
            .unwrap_or_else(|e| panic!("{family}: pages still lent after every end: {e}"));
        drop(parked);
    }
}

#[test]
fn four_forks_step_together_each_as_alone() {
    for (family, json) in families() {
        let mut backend = backend();
        let exec = exec(&mut backend, json, 40);
        let shared = prompt(5, VOCAB, 6);
        let tails: Vec<Vec<u32>> = (0..4).map(|i| prompt(10 + i, VOCAB, 5)).collect();
        let expected: Vec<_> = tails
            .iter()
            .map(|tail| {
                alone(
                    &exec,
                    &mut backend,
                    &[shared.clone(), tail.clone()].concat(),
                )
            })
            .collect();
        let mut session = Session::new(&exec);
        let parent = session.add_sequence();
        for &t in &shared {
            session.decode(&mut backend, parent, t).unwrap();
        }
        let forks: Vec<_> = (0..4)
            .map(|_| session.fork(&mut backend, parent).unwrap())
            .collect();
        session.end_sequence(parent).unwrap();
        for step in 0..5 {
            let batch: Vec<_> = forks
                .iter()
                .zip(&tails)
                .map(|(&id, t)| (id, t[step]))
                .collect();
            let logits = session.multi_seq_step(&mut backend, &batch).unwrap();
            for (i, row) in logits.iter().enumerate() {
                let at = shared.len() + step;
                assert_same_bytes(
                    row,
                    &expected[i][at],
                    &format!("{family}: fork {i} at {at}"),
                );
            }
        }
    }
}

#[test]
fn a_pool_grown_mid_decode_decodes_what_a_big_pool_decodes() {
    for (family, json) in families() {
        let mut backend = backend();
        let big = exec(&mut backend, json, 40);
        let tokens: Vec<Vec<u32>> = (0..2).map(|i| prompt(20 + i, VOCAB, 24)).collect();
        let expected: Vec<_> = tokens
            .iter()
            .map(|t| alone(&big, &mut backend, t))
            .collect();
        // 2 sequences of 12 tokens fill 6 pages of the 8 lendable; the next 12 need 6 more.
        let mut small = exec(&mut backend, json, 9);
        let mut session = Session::new(&small);
        let ids = [session.add_sequence(), session.add_sequence()];
        #[allow(clippy::needless_range_loop)] // the steps interleave the two sequences
        for step in 0..12 {
            for (i, &id) in ids.iter().enumerate() {
                session.decode(&mut backend, id, tokens[i][step]).unwrap();
            }
        }
        let parked = session.park();
        small.grow_kv(&mut backend, 40).unwrap();
        let mut session = parked.resume(&small).unwrap();
        for step in 12..24 {
            for (i, &id) in ids.iter().enumerate() {
                let logits = session.decode(&mut backend, id, tokens[i][step]).unwrap();
                assert_same_bytes(
                    &logits,
                    &expected[i][step],
                    &format!("{family}: seq {i} at {step}"),
                );
            }
        }
    }
}
