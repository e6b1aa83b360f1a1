//! `Session` decoding: prefill (every position's logits, or through prefill programs the last
//! position's alone) and verify equal token-by-token decode, sequences joining and
//! leaving multi-seq steps keep their own logits, padding rows change nothing, pages come
//! back, and greedy sampling.

mod exec_support;

use std::collections::BTreeMap;

use exec_support::{assert_same_bytes, backend, bits, build_llama, prompt, roomy_kv};
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{greedy, Boot, CircuitExec, SeqId, Session, WeightSource};

const VOCAB: usize = 128;

/// `tokens` decoded alone, one per step, in a fresh session: `[T * V]`.
fn alone(exec: &CircuitExec, backend: &mut CpuBackend, tokens: &[u32]) -> Vec<f32> {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let mut logits = Vec::new();
    for &t in tokens {
        logits.extend(session.decode(backend, id, t).unwrap());
    }
    logits
}

#[test]
fn prefill_equals_token_by_token_decode() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    // 13 tokens: a verify-8 chunk and a verify-5 chunk, over page boundaries (pages of 4).
    let tokens = prompt(1, VOCAB, 13);
    let want = alone(&exec, &mut backend, &tokens);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let got = session.prefill(&mut backend, id, &tokens).unwrap();
    assert_eq!(got.len(), tokens.len() * VOCAB);
    assert_same_bytes(&got, &want, "prefill vs decode");
    assert_eq!(session.seq_len(id).unwrap(), 13);
    // Decoding on after the prefill continues the same sequence.
    let next = session.decode(&mut backend, id, 9).unwrap();
    let mut longer = tokens.clone();
    longer.push(9);
    assert_same_bytes(
        &next,
        &alone(&exec, &mut backend, &longer)[13 * VOCAB..],
        "decode after prefill",
    );
    // A one-token prefill runs decode.
    let single = session.add_sequence();
    assert_same_bytes(
        &session.prefill(&mut backend, single, &tokens[..1]).unwrap(),
        &want[..VOCAB],
        "one-token prefill",
    );
}

#[test]
fn verify_at_every_width_equals_decode() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let tokens = prompt(2, VOCAB, 11);
    let want = alone(&exec, &mut backend, &tokens);
    for k in 2..=8 {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let mut got = Vec::new();
        for chunk in tokens.chunks(k) {
            got.extend(if chunk.len() == k {
                session.verify(&mut backend, id, chunk).unwrap()
            } else {
                session.prefill(&mut backend, id, chunk).unwrap()
            });
        }
        assert_same_bytes(&got, &want, &format!("verify at K={k}"));
    }
}

/// Runs a schedule of multi-seq steps; each step lists (sequence name, token). Returns each
/// sequence's logits, concatenated over its steps.
struct Schedule<'e> {
    session: Session<'e>,
    ids: BTreeMap<char, SeqId>,
    fed: BTreeMap<char, Vec<u32>>,
    logits: BTreeMap<char, Vec<f32>>,
}

impl<'e> Schedule<'e> {
    fn new(exec: &'e CircuitExec) -> Schedule<'e> {
        Schedule {
            session: Session::new(exec),
            ids: BTreeMap::new(),
            fed: BTreeMap::new(),
            logits: BTreeMap::new(),
        }
    }

    fn join(&mut self, name: char) {
        let id = self.session.add_sequence();
        self.ids.insert(name, id);
    }

    fn leave(&mut self, name: char) {
        let id = self.ids.remove(&name).unwrap();
        self.session.end_sequence(id).unwrap();
    }

    fn step(&mut self, backend: &mut CpuBackend, batch: &[(char, u32)]) {
        let rows: Vec<(SeqId, u32)> = batch.iter().map(|&(n, t)| (self.ids[&n], t)).collect();
        let out = self.session.multi_seq_step(backend, &rows).unwrap();
        assert_eq!(out.len(), batch.len());
        for (&(name, token), logits) in batch.iter().zip(out) {
            assert_eq!(logits.len(), VOCAB);
            self.fed.entry(name).or_default().push(token);
            self.logits.entry(name).or_default().extend(logits);
        }
    }
}

#[test]
fn sequences_join_and_leave_between_multi_seq_steps() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut s = Schedule::new(&exec);
    for name in ['a', 'b', 'c'] {
        s.join(name);
    }
    s.step(&mut backend, &[('a', 1), ('b', 2), ('c', 3)]); // width 4, one padding row
    s.step(&mut backend, &[('a', 11), ('b', 12), ('c', 13)]);
    s.join('d');
    s.step(&mut backend, &[('a', 21), ('b', 22), ('c', 23), ('d', 24)]); // width 4, full
    s.leave('b');
    s.step(&mut backend, &[('c', 33), ('a', 31), ('d', 34)]); // rows reordered
    s.step(&mut backend, &[('d', 44)]); // one sequence: the decode program
    s.step(&mut backend, &[('a', 51), ('d', 54)]); // width 2
    for name in ['e', 'f', 'g'] {
        s.join(name);
    }
    s.step(
        &mut backend,
        &[
            ('a', 61),
            ('c', 63),
            ('d', 64),
            ('e', 65),
            ('f', 66),
            ('g', 67),
        ],
    ); // width 8, two padding rows
    for (name, tokens) in &s.fed {
        assert_same_bytes(
            &s.logits[name],
            &alone(&exec, &mut backend, tokens),
            &format!("sequence {name} vs decoded alone"),
        );
    }
}

#[test]
fn padding_rows_do_not_change_live_rows() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let run = |backend: &mut CpuBackend, live: usize| -> Vec<Vec<f32>> {
        let mut session = Session::new(&exec);
        let ids: Vec<_> = (0..live).map(|_| session.add_sequence()).collect();
        let mut logits = vec![Vec::new(); live];
        for step in 0..5u32 {
            let batch: Vec<_> = ids
                .iter()
                .enumerate()
                .map(|(i, &id)| (id, (17 * i as u32 + 5 * step + 3) % VOCAB as u32))
                .collect();
            for (out, l) in logits
                .iter_mut()
                .zip(session.multi_seq_step(backend, &batch).unwrap())
            {
                out.extend(l);
            }
        }
        logits
    };
    let padded = run(&mut backend, 3); // width 4: one padding row
    let full = run(&mut backend, 4); // width 4: none
    let wider = run(&mut backend, 5); // width 8: three padding rows
    for row in 0..3 {
        assert_same_bytes(&padded[row], &full[row], &format!("row {row}, 3 vs 4 live"));
        assert_same_bytes(
            &padded[row],
            &wider[row],
            &format!("row {row}, 3 vs 5 live"),
        );
    }
}

#[test]
fn end_sequence_returns_its_pages() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mut session = Session::new(&exec);
    let start = session.free_page_count();
    assert_eq!(start, roomy_kv().pages - 1, "page 0 is the scratch page");
    let a = session.add_sequence();
    let b = session.add_sequence();
    let tokens = prompt(8, VOCAB, 9);
    session.prefill(&mut backend, a, &tokens).unwrap();
    assert_eq!(
        session.free_page_count(),
        start - 3,
        "9 tokens in pages of 4"
    );
    session.decode(&mut backend, b, 4).unwrap();
    assert_eq!(session.free_page_count(), start - 4);
    session.end_sequence(a).unwrap();
    assert_eq!(session.free_page_count(), start - 1);
    session.end_sequence(b).unwrap();
    assert_eq!(session.free_page_count(), start);
    assert!(session.seq_len(a).is_err());
    assert!(session.end_sequence(a).is_err(), "ending twice");

    // Reused pages hold the previous sequence's KV; a new sequence must not see it.
    let c = session.add_sequence();
    let other = prompt(9, VOCAB, 6);
    let mut got = Vec::new();
    for &t in &other {
        got.extend(session.decode(&mut backend, c, t).unwrap());
    }
    assert_same_bytes(&got, &alone(&exec, &mut backend, &other), "on reused pages");
}

#[test]
fn greedy_picks_the_first_maximum_and_never_nan() {
    assert_eq!(greedy(&[0.5, 2.0, -1.0, 2.0]), 1);
    assert_eq!(greedy(&[3.0, 3.0]), 0);
    assert_eq!(greedy(&[f32::NAN, 1.0, 2.0]), 2);
    assert_eq!(greedy(&[1.0, f32::NAN, 3.0, 3.0]), 2);
    assert_eq!(greedy(&[2.0, f32::NAN, 1.0]), 0);
    assert_eq!(greedy(&[f32::NAN, f32::NAN, -5.0]), 2);
    assert_eq!(greedy(&[f32::NEG_INFINITY, -1e30]), 1);
    assert_eq!(greedy(&[f32::NEG_INFINITY, f32::NAN]), 0);
    assert_eq!(greedy(&[-0.0, 0.0]), 0, "equal values: the first");
    assert_eq!(greedy(&[1.0, f32::INFINITY, f32::NAN, f32::INFINITY]), 1);
    // Against a plain reference over random vectors with NaNs sprinkled in.
    let mut rng = solder_model_layers::weights::SplitMix64(77);
    for _ in 0..200 {
        let v: Vec<f32> = (0..33)
            .map(|_| {
                let r = rng.uniform();
                if r > 0.8 {
                    f32::NAN
                } else {
                    (r * 8.0).round() // ties are common
                }
            })
            .collect();
        let pick = greedy(&v) as usize;
        let best = v
            .iter()
            .copied()
            .filter(|x| !x.is_nan())
            .fold(f32::NAN, f32::max);
        if best.is_nan() {
            continue;
        }
        let first = v.iter().position(|&x| x == best).unwrap();
        assert_eq!(pick, first, "{v:?}");
    }
}

#[test]
fn greedy_of_real_logits_is_their_argmax() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let logits = alone(&exec, &mut backend, &[5]);
    let pick = greedy(&logits) as usize;
    assert!(logits.iter().all(|&v| v <= logits[pick]));
    assert_eq!(bits(&logits).len(), VOCAB);
}

/// An exec of the tiny llama whose verify programs include one of `chunk` rows (the prefill
/// chunk), under `policy`.
fn build_chunked(backend: &mut CpuBackend, chunk: usize, policy: Policy) -> CircuitExec {
    let mut serve = exec_support::serve();
    serve.verify_widths.push(chunk);
    let boot = Boot {
        serve,
        ..exec_support::boot(
            exec_support::config(exec_support::TINY_LLAMA),
            policy,
            WeightSource::Random { seed: 0x5eed },
            exec_support::kv(2 * 80 + 2, 4, 320),
        )
    };
    CircuitExec::build(backend, boot).expect("build")
}

#[test]
fn a_prompt_prefilled_in_256_token_chunks_equals_token_by_token_decode() {
    // 300 tokens: one 256-row verify program, then 8-row ones and a 4-row one. Under the
    // default rules (gemv) and with the tensor cores on (gemm's differs rules: each row's bytes
    // still do not depend on the program's width).
    let mut backend = backend();
    let tokens = prompt(3, VOCAB, 300);
    let mut policies = vec![Policy::default()];
    let mut tensor_cores = Policy::default();
    tensor_cores.levers.set("tensor_cores", true).unwrap();
    policies.push(tensor_cores);
    for policy in policies {
        let mut exec = build_chunked(&mut backend, 256, policy);
        let want = alone(&exec, &mut backend, &tokens);
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let got = session.prefill(&mut backend, id, &tokens).unwrap();
        assert_same_bytes(&got, &want, "256-token chunks vs decode");
        // The same prompt with nobody reading the chunks' logits: the first 256 tokens
        // through the prefill program (no LM head), the rest with the last position's logits.
        let headless = session.add_sequence();
        session
            .prefill_chunk(&mut backend, headless, &tokens[..256])
            .unwrap();
        assert_eq!(
            session.last_program().map(|(mode, rows, _)| (mode, rows)),
            Some((solder_circuit::Mode::Prefill, 256))
        );
        let last = session
            .prefill_last(&mut backend, headless, &tokens[256..])
            .unwrap();
        assert_same_bytes(&last, &want[299 * VOCAB..], "prefill_last vs decode");
        // Decoding on reads every KV page the prefill programs wrote.
        let (a, b) = (
            session.decode(&mut backend, id, 7).unwrap(),
            session.decode(&mut backend, headless, 7).unwrap(),
        );
        assert_same_bytes(&b, &a, "decode after a headless prefill");
        drop(session);
        assert!(exec.plan(solder_circuit::Mode::Verify, 256).is_some());
        exec.free(&mut backend).unwrap();
    }
}

#[test]
fn a_last_chunk_read_for_its_last_row_runs_headless_and_the_last_token_through_decode() {
    // A 32-row chunk program: 64 tokens (from the start, or after 5 already held: a cut inside
    // a page this prefill took) are 32 + 32 rows, the last chunk wide enough
    // (HEADLESS_LAST_MIN_ROWS) to run without its LM head and its last token again through
    // decode; 59 tokens are 32 + 8 + 8 + 8 + 3, the last chunk a 3-row verify program with its
    // head, as before. The logits and every later step are the bytes of plain prefill, under
    // the default rules and with the tensor cores on.
    let mut backend = backend();
    let tokens = prompt(11, VOCAB, 69);
    let mut tensor_cores = Policy::default();
    tensor_cores.levers.set("tensor_cores", true).unwrap();
    for policy in [Policy::default(), tensor_cores] {
        let mut exec = build_chunked(&mut backend, 32, policy);
        let want = alone(&exec, &mut backend, &tokens);
        let mut session = Session::new(&exec);
        let (decode, verify3) = (
            (solder_circuit::Mode::Decode, 1),
            (solder_circuit::Mode::Verify, 3),
        );
        for (held, len, ran_last) in [(0, 64, decode), (5, 69, decode), (5, 64, verify3)] {
            let plain = session.add_sequence();
            let headless = session.add_sequence();
            for id in [plain, headless] {
                if held > 0 {
                    session
                        .prefill_chunk(&mut backend, id, &tokens[..held])
                        .unwrap();
                }
            }
            let all = session
                .prefill(&mut backend, plain, &tokens[held..len])
                .unwrap();
            assert_same_bytes(
                &all,
                &want[held * VOCAB..len * VOCAB],
                "chunked prefill vs decode",
            );
            let last = session
                .prefill_last(&mut backend, headless, &tokens[held..len])
                .unwrap();
            let what = format!("prefill_last of {} tokens after {held}", len - held);
            assert_same_bytes(&last, &want[(len - 1) * VOCAB..len * VOCAB], &what);
            assert_eq!(session.seq_len(headless).unwrap(), len, "{what}");
            // The last program a step ran: decode after headless 32-row chunks, else the last
            // chunk's verify program.
            assert_eq!(
                session.last_program().map(|(mode, rows, _)| (mode, rows)),
                Some(ran_last),
                "{what}"
            );
            // Decoding on reads every KV page both prefills wrote.
            for token in [7, 9] {
                let (a, b) = (
                    session.decode(&mut backend, plain, token).unwrap(),
                    session.decode(&mut backend, headless, token).unwrap(),
                );
                assert_same_bytes(&b, &a, &format!("decode after {what}"));
            }
            session.end_sequence(plain).unwrap();
            session.end_sequence(headless).unwrap();
        }
        drop(session);
        exec.free(&mut backend).unwrap();
    }
}

#[test]
fn a_headless_last_chunk_whose_decode_fails_takes_the_whole_prompt_back() {
    // 64 tokens after 5 held: two headless 32-row chunks, then the last token's decode, which
    // fails mid-step. The sequence is back at 5 tokens with its pages, and the same prompt
    // then gives plain prefill's last logits.
    let mut backend = backend();
    let mut exec = build_chunked(&mut backend, 32, Policy::default());
    exec.set_graph_policy(solder_model_layers::GraphPolicy::Never);
    let tokens = prompt(13, VOCAB, 69);
    let want = alone(&exec, &mut backend, &tokens);
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    session
        .prefill_chunk(&mut backend, id, &tokens[..5])
        .unwrap();
    let free = session.free_page_count();
    let chunk = exec
        .program(solder_circuit::Mode::Prefill, 32)
        .unwrap()
        .launches();
    let decode = exec.decode_program().unwrap().launches();
    backend.fail_call("launch", 2 * chunk + decode / 2);
    assert!(session
        .prefill_last(&mut backend, id, &tokens[5..])
        .is_err());
    assert_eq!(session.seq_len(id).unwrap(), 5);
    assert_eq!(session.free_page_count(), free);
    let last = session
        .prefill_last(&mut backend, id, &tokens[5..])
        .unwrap();
    assert_same_bytes(
        &last,
        &want[68 * VOCAB..],
        "prefill_last after a failed one",
    );
    drop(session);
    exec.free(&mut backend).unwrap();
}
