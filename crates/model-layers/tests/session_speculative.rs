//! Speculative decoding (issue 12, item 4): greedy speculative steps give exactly the tokens
//! and logits bytes of plain greedy decoding for every k, with drafters that always agree,
//! never agree, agree at random, and a different model; after any rejection the KV cells and
//! recurrent state equal those of a fresh sequence fed the kept tokens; bad input is refused
//! with the sequence unchanged.

mod exec_support;

use exec_support::drafters::{Bend, Bent, Fixed};
use exec_support::*;
use solder_circuit::Policy;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::{
    greedy, CircuitExec, Drafter, ExecError, ModelDrafter, Sampling, SamplingParams, SeqId,
    Session, SessionError, SpecPolicy, WeightSource,
};

const GEN: usize = 14;

/// Plain greedy: prefill, then decode GEN tokens; the emitted tokens and each decode's logits.
fn plain(backend: &mut CpuBackend, exec: &CircuitExec, prompt: &[u32]) -> (Vec<u32>, Vec<f32>) {
    let vocab = exec.config.vocab_size;
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let logits = session.prefill(backend, id, prompt).expect("prefill");
    let mut token = greedy(&logits[(prompt.len() - 1) * vocab..]);
    let mut tokens = vec![token];
    let mut all = Vec::new();
    for _ in 0..GEN {
        let logits = session.decode(backend, id, token).expect("decode");
        token = greedy(&logits);
        tokens.push(token);
        all.extend(logits);
    }
    (tokens, all)
}

/// Greedy speculative steps of `k` until GEN tokens were fed; the same figures as `plain`,
/// and the drafts accepted.
fn speculative(
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    drafter: &mut dyn Drafter,
    prompt: &[u32],
    k: usize,
) -> (Vec<u32>, Vec<f32>, usize) {
    let vocab = exec.config.vocab_size;
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let logits = session.prefill(backend, id, prompt).expect("prefill");
    let mut pending = greedy(&logits[(prompt.len() - 1) * vocab..]);
    let mut tokens = vec![pending];
    let mut all = Vec::new();
    let mut accepted = 0;
    while all.len() < GEN * vocab {
        let step = session
            .speculative_step(backend, id, pending, k, drafter)
            .expect("speculative step");
        assert_eq!(step.tokens.len(), step.accepted + 1);
        assert_eq!(step.logits.len(), (step.accepted + 1) * vocab);
        accepted += step.accepted;
        tokens.extend(&step.tokens);
        all.extend(&step.logits);
        pending = *step.tokens.last().expect("a token");
        assert_eq!(
            session.seq_len(id).expect("seq"),
            prompt.len() + all.len() / vocab
        );
    }
    all.truncate(GEN * vocab);
    tokens.truncate(GEN + 1);
    drafter.forget(id);
    (tokens, all, accepted)
}

#[test]
fn greedy_speculative_decoding_is_lossless_for_every_k_and_drafter() {
    for json in [TINY_LLAMA, TINY_NEXT] {
        let mut backend = backend();
        let target = build(&mut backend, json, Policy::default(), roomy_kv());
        // The same model (same weights) drafts: it always agrees, unless bent.
        let same = build(&mut backend, json, Policy::default(), roomy_kv());
        let other = {
            let boot = boot(
                config(json),
                Policy::default(),
                WeightSource::Random { seed: 99 },
                roomy_kv(),
            );
            CircuitExec::build(&mut backend, boot).expect("draft model")
        };
        let prompt = prompt(3, 128, 9);
        let (want_tokens, want_logits) = plain(&mut backend, &target, &prompt);
        for k in 1..=7 {
            for bend in [Bend::None, Bend::Always, Bend::Random(k as u64)] {
                let mut drafter = Bent {
                    inner: ModelDrafter::new(&same),
                    bend,
                };
                let (tokens, logits, accepted) =
                    speculative(&mut backend, &target, &mut drafter, &prompt, k);
                let what = format!("k {k}, drafter {bend:?}");
                assert_eq!(tokens, want_tokens, "{what}: tokens");
                assert_same_bytes(&logits, &want_logits, &format!("{what}: logits"));
                match bend {
                    Bend::None => {
                        assert!(accepted >= GEN - GEN / (k + 1) - 1, "{what}: {accepted}")
                    }
                    Bend::Always => assert_eq!(accepted, 0, "{what}"),
                    Bend::Random(_) => {}
                }
            }
            let mut drafter = ModelDrafter::new(&other);
            let (tokens, logits, _) = speculative(&mut backend, &target, &mut drafter, &prompt, k);
            assert_eq!(tokens, want_tokens, "k {k}, another model: tokens");
            assert_same_bytes(
                &logits,
                &want_logits,
                &format!("k {k}, another model: logits"),
            );
        }
    }
}

/// Every KV cell a sequence holds (per layer, positions 0..len, K then V) and its recurrent
/// state, as bytes.
fn state_bytes(
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    session: &Session,
    id: SeqId,
) -> Vec<u8> {
    let len = session.seq_len(id).expect("seq");
    let table = session.block_table(id).expect("table").to_vec();
    let c = &exec.config;
    let row = c.num_key_value_heads * c.head_dim * 2;
    let block = exec.layout.kv_block_size;
    let mut out = Vec::new();
    for region in exec.layout.states.iter().filter(|r| r.slot_bytes == 0) {
        for p in 0..len {
            let page = table[p / block] as usize;
            for kv in 0..2 {
                let at = region.offset + ((page * 2 + kv) * block + p % block) * row;
                let mut cell = vec![0u8; row];
                backend
                    .copy_d2h(exec.kv_cache().offset(at), &mut cell)
                    .expect("read");
                out.extend(cell);
            }
        }
    }
    let point = session.rewind_point(backend, id).expect("point");
    for bytes in point.state_bytes() {
        out.extend(bytes);
    }
    out
}

#[test]
fn after_a_rejection_the_state_equals_a_fresh_sequence_fed_the_kept_tokens() {
    for json in [TINY_LLAMA, TINY_NEXT] {
        let mut backend = backend();
        let target = build(&mut backend, json, Policy::default(), roomy_kv());
        let same = build(&mut backend, json, Policy::default(), roomy_kv());
        let prompt = prompt(5, 128, 6);
        for seed in 0..4u64 {
            let mut drafter = Bent {
                inner: ModelDrafter::new(&same),
                bend: Bend::Random(seed),
            };
            let mut session = Session::new(&target);
            let id = session.add_sequence();
            let logits = session.prefill(&mut backend, id, &prompt).expect("prefill");
            let mut pending = greedy(&logits[(prompt.len() - 1) * 128..]);
            for _ in 0..3 {
                let step = session
                    .speculative_step(&mut backend, id, pending, 5, &mut drafter)
                    .expect("step");
                pending = *step.tokens.last().expect("token");
            }
            let kept = session.tokens(id).expect("tokens").to_vec();
            let mut fresh = Session::new(&target);
            let f = fresh.add_sequence();
            fresh.prefill(&mut backend, f, &kept).expect("fresh");
            let got = state_bytes(&mut backend, &target, &session, id);
            let want = state_bytes(&mut backend, &target, &fresh, f);
            assert_eq!(got.len(), want.len());
            assert!(
                got == want,
                "{json:.40}: seed {seed}: state after rollback differs"
            );
            // The drafter's sequence follows: a prefix of the target's tokens.
            let draft_len = drafter.inner.cached_len(id).expect("draft seq");
            assert!(draft_len <= kept.len());
        }
    }
}

#[test]
fn bad_speculative_input_is_refused_and_the_sequence_is_unchanged() {
    let mut backend = backend();
    let target = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let same = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let wide = TINY_LLAMA.replace("\"vocab_size\": 128", "\"vocab_size\": 256");
    let llama = build(&mut backend, &wide, Policy::default(), roomy_kv());
    let mut session = Session::new(&target);
    let id = session.add_sequence();
    session
        .prefill(&mut backend, id, &prompt(8, 128, 5))
        .expect("prefill");
    let before = state_bytes(&mut backend, &target, &session, id);
    let mut drafter = ModelDrafter::new(&same);
    for k in [0, 8, 100] {
        match session.speculative_step(&mut backend, id, 1, k, &mut drafter) {
            Err(SessionError::DraftLength { k: got, widest: 7 }) => assert_eq!(got, k),
            other => panic!("k {k}: {other:?}"),
        }
    }
    // A draft model of another vocabulary.
    let mut wrong = ModelDrafter::new(&llama);
    match session.speculative_step(&mut backend, id, 1, 2, &mut wrong) {
        Err(SessionError::DraftVocab {
            draft: 256,
            target: 128,
        }) => {}
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        session.speculative_step(&mut backend, id, 128, 2, &mut drafter),
        Err(SessionError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        session.speculative_step(&mut backend, 77, 1, 2, &mut drafter),
        Err(SessionError::UnknownSequence(77))
    ));
    // A verify step that fails on the device (reading its logits): the sequence unchanged.
    let mut fixed = Fixed(vec![4, 5, 6]);
    for call in ["copy_d2h", "graph_node"] {
        backend.fail_call(call, 0);
        match session.speculative_step(&mut backend, id, 1, 3, &mut fixed) {
            Err(SessionError::Exec(ExecError::Gpu(e))) => {
                assert!(e.to_string().contains("injected"))
            }
            other => panic!("{call}: {other:?}"),
        }
        assert_eq!(session.seq_len(id).expect("seq"), 5);
        assert_eq!(
            state_bytes(&mut backend, &target, &session, id),
            before,
            "{call}"
        );
    }
    // Then steps work, with either drafter.
    let step = session
        .speculative_step(&mut backend, id, 1, 3, &mut fixed)
        .expect("step");
    assert_eq!(session.seq_len(id).expect("seq"), 5 + step.accepted + 1);
    let step = session
        .speculative_step(&mut backend, id, 1, 3, &mut drafter)
        .expect("step");
    assert!(step.accepted <= 3);
}

/// A verify step writes each sequence's new state into a spare slot the sequence takes once
/// its acceptance succeeded: a step whose drafts are all accepted copies no recurrent state
/// (an armed copy would fail it), and gives the tokens and bytes of plain decoding.
#[test]
fn a_fully_accepted_speculative_step_copies_no_state() {
    let mut backend = backend();
    let target = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    assert!(target.layout.states.iter().any(|r| r.slot_bytes > 0));
    let prompt = prompt(12, 128, 6);
    let (want_tokens, want_logits) = plain(&mut backend, &target, &prompt);
    let vocab = target.config.vocab_size;
    let k = 4;
    for call in ["copy_d2d_async", "copy_d2d"] {
        let mut session = Session::new(&target);
        let id = session.add_sequence();
        session.prefill(&mut backend, id, &prompt).expect("prefill");
        // The greedy continuation after the pending token: every draft accepted.
        let mut drafter = Fixed(want_tokens[1..=k].to_vec());
        backend.fail_call(call, 0);
        let step = session
            .speculative_step(&mut backend, id, want_tokens[0], k, &mut drafter)
            .unwrap_or_else(|e| panic!("{call} armed: {e}"));
        assert_eq!(step.accepted, k, "{call} armed");
        assert_eq!(step.tokens, want_tokens[1..=k + 1], "{call} armed");
        assert_same_bytes(
            &step.logits,
            &want_logits[..(k + 1) * vocab],
            &format!("{call} armed"),
        );
        // Not fired: disarmed by arming a call no step makes.
        backend.fail_call("create_stream", usize::MAX);
        // The next step continues from the state the spare holds.
        let logits = session
            .decode(&mut backend, id, want_tokens[k + 1])
            .expect("decode");
        assert_same_bytes(
            &logits,
            &want_logits[(k + 1) * vocab..(k + 2) * vocab],
            &format!("{call}: the decode after"),
        );
    }
}

#[test]
fn sampled_speculative_decoding_is_reproducible() {
    let mut backend = backend();
    let target = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let draft = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 20,
        top_p: 0.95,
        seed: 11,
    };
    let run = |backend: &mut CpuBackend| {
        let mut drafter = ModelDrafter::sampled(
            &draft,
            Sampling::Sampled(SamplingParams { seed: 12, ..params }),
        )
        .expect("drafter");
        let mut session = Session::new(&target);
        let id = session.add_sequence();
        session
            .set_sampling(id, Sampling::Sampled(params))
            .expect("sampling");
        session
            .prefill(backend, id, &prompt(4, 128, 5))
            .expect("prefill");
        let mut pending = 7;
        let mut out: Vec<u32> = Vec::new();
        let mut accepted = 0;
        for _ in 0..4 {
            let step = session
                .speculative_step(backend, id, pending, 4, &mut drafter)
                .expect("step");
            accepted += step.accepted;
            out.extend(&step.tokens);
            pending = *step.tokens.last().expect("token");
        }
        (out, accepted)
    };
    let (first, accepted) = run(&mut backend);
    let (second, _) = run(&mut backend);
    assert_eq!(first, second, "same seeds, same tokens");
    assert!(
        accepted > 0,
        "a drafter equal to the target is accepted (often) when sampling too"
    );
}

#[test]
fn drafting_past_the_position_limit_or_the_pages_is_refused() {
    let mut backend = backend();
    // 5 pages of 16 (one scratch): 64 tokens of cache; max_seq_len 48.
    let target = build(&mut backend, TINY_LLAMA, Policy::default(), kv(5, 16, 48));
    let same = build(&mut backend, TINY_LLAMA, Policy::default(), roomy_kv());
    let mut drafter = ModelDrafter::new(&same);
    let mut session = Session::new(&target);
    let id = session.add_sequence();
    session
        .prefill(&mut backend, id, &prompt(9, 128, 44))
        .expect("prefill");
    match session.speculative_step(&mut backend, id, 1, 5, &mut drafter) {
        Err(SessionError::PositionPastLimit { limit: 48, .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(session.seq_len(id).expect("seq"), 44);
    let other = session.add_sequence();
    session
        .prefill(&mut backend, other, &prompt(10, 128, 16))
        .expect("one page left");
    match session.speculative_step(&mut backend, other, 1, 2, &mut drafter) {
        Err(SessionError::PagesExhausted { .. }) => {}
        e => panic!("{e:?}"),
    }
    assert_eq!(session.seq_len(other).expect("seq"), 16);
}

#[test]
fn the_adaptive_policy_follows_acceptance() {
    let p = SpecPolicy::Adaptive { min: 1, max: 6 };
    assert_eq!(p.k(None), 6);
    assert_eq!(p.k(Some(0.0)), 1);
    assert_eq!(p.k(Some(2.4)), 3);
    assert_eq!(p.k(Some(9.0)), 6);
    assert_eq!(SpecPolicy::Fixed(4).k(Some(0.0)), 4);
    let mut backend = backend();
    let target = build(&mut backend, TINY_LLAMA, Policy::default(), roomy_kv());
    let same = build(&mut backend, TINY_LLAMA, Policy::default(), roomy_kv());
    let mut drafter = ModelDrafter::new(&same);
    let mut session = Session::new(&target);
    let id = session.add_sequence();
    session
        .prefill(&mut backend, id, &prompt(2, 128, 4))
        .expect("prefill");
    let mut pending = 3;
    for _ in 0..4 {
        let k = session.next_k(id, p).expect("k");
        let step = session
            .speculative_step(&mut backend, id, pending, k, &mut drafter)
            .expect("step");
        pending = *step.tokens.last().expect("token");
    }
    let history = session.acceptances(id).expect("history");
    assert_eq!(history.steps, 4);
    assert_eq!(
        history.accepted, history.proposed,
        "the same model always agrees"
    );
}

#[test]
fn verify_batch_gives_each_sequence_the_bytes_of_verifying_it_alone() {
    for json in [TINY_LLAMA, TINY_NEXT] {
        let mut backend = backend();
        let exec = build(&mut backend, json, Policy::default(), roomy_kv());
        let heads: Vec<Vec<u32>> = (0..4)
            .map(|s| prompt(20 + s, 128, 2 + s as usize))
            .collect();
        // 1 + 2 + 3 + 1 = 7 rows: the batched program of 8, one padding row.
        let tails: Vec<Vec<u32>> = (0..4)
            .map(|s| prompt(30 + s, 128, 1 + s as usize % 3))
            .collect();
        // Alone: each head, then its tail in one verify (or decode).
        let mut alone = Vec::new();
        for (head, tail) in heads.iter().zip(&tails) {
            let mut session = Session::new(&exec);
            let id = session.add_sequence();
            session.prefill(&mut backend, id, head).expect("head");
            alone.push(session.verify(&mut backend, id, tail).expect("tail"));
        }
        // Together: the heads, then every tail in one batched verify (padded).
        let mut session = Session::new(&exec);
        let ids: Vec<SeqId> = heads
            .iter()
            .map(|head| {
                let id = session.add_sequence();
                session.prefill(&mut backend, id, head).expect("head");
                id
            })
            .collect();
        let batch: Vec<(SeqId, &[u32])> = ids
            .iter()
            .zip(&tails)
            .map(|(&id, t)| (id, t.as_slice()))
            .collect();
        let got = session
            .verify_batch(&mut backend, &batch)
            .expect("verify_batch");
        let (mode, rows, _) = session.last_program().expect("ran");
        assert_eq!(mode, solder_circuit::Mode::VerifyBatch);
        assert!(rows >= tails.iter().map(Vec::len).sum::<usize>());
        for (s, (g, a)) in got.iter().zip(&alone).enumerate() {
            assert_same_bytes(g, a, &format!("{json:.30}: sequence {s} batched vs alone"));
        }
        // And the state after it: each sequence decodes on as it would alone.
        let next: Vec<Vec<f32>> = ids
            .iter()
            .map(|&id| session.decode(&mut backend, id, 3).expect("decode"))
            .collect();
        for (s, (head, tail)) in heads.iter().zip(&tails).enumerate() {
            let mut alone = Session::new(&exec);
            let id = alone.add_sequence();
            alone.prefill(&mut backend, id, head).expect("head");
            alone.verify(&mut backend, id, tail).expect("tail");
            let want = alone.decode(&mut backend, id, 3).expect("decode");
            assert_same_bytes(&next[s], &want, &format!("sequence {s} after the batch"));
        }
    }
}

#[test]
fn batched_speculative_steps_equal_each_sequence_alone() {
    for json in [TINY_LLAMA, TINY_NEXT] {
        let mut backend = backend();
        let target = build(&mut backend, json, Policy::default(), roomy_kv());
        let same = build(&mut backend, json, Policy::default(), roomy_kv());
        let prompts: Vec<Vec<u32>> = (0..3)
            .map(|s| prompt(40 + s, 128, 4 + s as usize))
            .collect();
        // 2 + 3 + 3 = 8 rows: the widest batched program.
        let ks = [1usize, 2, 2];
        let plains: Vec<(Vec<u32>, Vec<f32>)> = prompts
            .iter()
            .map(|p| plain(&mut backend, &target, p))
            .collect();
        let mut drafter = Bent {
            inner: ModelDrafter::new(&same),
            bend: Bend::Random(3),
        };
        let mut session = Session::new(&target);
        let mut pendings = Vec::new();
        let ids: Vec<SeqId> = prompts
            .iter()
            .map(|p| {
                let id = session.add_sequence();
                let logits = session.prefill(&mut backend, id, p).expect("prefill");
                pendings.push(greedy(&logits[(p.len() - 1) * 128..]));
                id
            })
            .collect();
        let mut tokens: Vec<Vec<u32>> = pendings.iter().map(|&t| vec![t]).collect();
        let mut logits: Vec<Vec<f32>> = vec![Vec::new(); 3];
        for _ in 0..4 {
            let batch: Vec<(SeqId, u32, usize)> =
                (0..3).map(|s| (ids[s], pendings[s], ks[s])).collect();
            let steps = session
                .speculative_step_many(&mut backend, &batch, &mut drafter)
                .expect("batched step");
            for (s, step) in steps.into_iter().enumerate() {
                tokens[s].extend(&step.tokens);
                logits[s].extend(&step.logits);
                pendings[s] = *step.tokens.last().expect("token");
            }
        }
        for s in 0..3 {
            let n = logits[s].len() / 128;
            assert_eq!(
                tokens[s][..n + 1],
                plains[s].0[..n + 1],
                "sequence {s}: tokens"
            );
            assert_same_bytes(
                &logits[s],
                &plains[s].1[..n * 128],
                &format!("sequence {s}: logits"),
            );
        }
    }
}

/// The recurrent kernels write their per-row snapshots only where a step may roll back to
/// one: a prompt's chunks (verify programs whose logits are read) and a batched verify (the
/// program a mixed step runs) leave the snapshot slots as they were; a speculative step writes
/// them. Speculation stays lossless (above), so the skipped writes were never read.
#[test]
fn only_a_speculative_step_writes_recurrent_snapshots() {
    let mut backend = backend();
    let target = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let same = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let regions: Vec<(usize, usize)> = (target.layout.states.iter())
        .filter(|r| r.slot_bytes > 0)
        .map(|r| (r.snapshot_offset, r.offset + r.bytes - r.snapshot_offset))
        .collect();
    assert!(regions.iter().all(|&(_, bytes)| bytes > 0), "{regions:?}");
    let snapshots = |backend: &mut CpuBackend| -> Vec<u8> {
        let mut out = Vec::new();
        for &(at, bytes) in &regions {
            let mut region = vec![0u8; bytes];
            backend
                .copy_d2h(target.kv_cache().offset(at), &mut region)
                .expect("read");
            out.extend(region);
        }
        out
    };
    for &(at, bytes) in &regions {
        (backend.memset(target.kv_cache().offset(at), 0x5a, bytes)).expect("memset");
    }
    let untouched = snapshots(&mut backend);
    let mut session = Session::new(&target);
    let (a, b) = (session.add_sequence(), session.add_sequence());
    let logits = session
        .prefill(&mut backend, a, &prompt(7, 128, 6))
        .expect("prefill");
    session
        .prefill(&mut backend, b, &prompt(8, 128, 3))
        .expect("prefill");
    assert!(
        snapshots(&mut backend) == untouched,
        "a prompt's chunks wrote snapshots"
    );
    let pending = greedy(&logits[5 * 128..]);
    (session.verify_batch(&mut backend, &[(a, &[pending][..]), (b, &[1, 2, 3][..])]))
        .expect("batched verify");
    assert!(
        snapshots(&mut backend) == untouched,
        "a batched verify wrote snapshots"
    );
    let mut drafter = ModelDrafter::new(&same);
    (session.speculative_step(&mut backend, a, 4, 3, &mut drafter)).expect("speculative step");
    assert!(
        snapshots(&mut backend) != untouched,
        "a speculative step wrote no snapshots"
    );
}
