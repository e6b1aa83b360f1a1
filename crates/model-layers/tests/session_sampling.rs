//! Sampling inside the `Session`, every step kind: `prefill_next` and `next_tokens` draw each
//! sequence's next token by its own sampler from its own logits row (greedy by default), so
//! a sequence's tokens are the same alone or at any row of a batch; and a sampled target's
//! speculative step with a greedy drafter is sampled (the exact rule with a one-hot draft
//! distribution), never silently greedy; a greedy batch's tokens, taken on the device and read
//! back alone, are the host's arg-max of its logits. The distributions themselves are proven at the
//! rule level in `tests/sampling.rs` (chi-square tests, the one-hot case included).

mod exec_support;

use exec_support::*;
use solder_circuit::Policy;
use solder_gpu_runtime::CpuBackend;
use solder_model_layers::{
    greedy, CircuitExec, ModelDrafter, Sampler, Sampling, SamplingParams, SeqId, Session,
};

const VOCAB: usize = 128;

fn sampled(seed: u64) -> Sampling {
    Sampling::Sampled(SamplingParams {
        temperature: 1.5,
        top_k: 0,
        top_p: 1.0,
        seed,
    })
}

/// Prefills `prompt` and samples `steps` tokens for each `(seed, prompt)`, all sequences in
/// one batch (multi-seq steps), with `seeds[i]` = None for greedy.
fn run_batch(
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    seqs: &[(Option<u64>, Vec<u32>)],
    steps: usize,
) -> Vec<Vec<u32>> {
    let mut session = Session::new(exec);
    let mut live: Vec<(SeqId, u32)> = Vec::new();
    let mut out = vec![Vec::new(); seqs.len()];
    for (i, (seed, prompt)) in seqs.iter().enumerate() {
        let id = session.add_sequence();
        if let Some(seed) = seed {
            session.set_sampling(id, sampled(*seed)).expect("sampling");
        }
        let next = session.prefill_next(backend, id, prompt).expect("prefill");
        out[i].push(next);
        live.push((id, next));
    }
    for _ in 0..steps {
        let next = session.next_tokens(backend, &live).expect("step");
        for (i, token) in next.into_iter().enumerate() {
            out[i].push(token);
            live[i].1 = token;
        }
    }
    out
}

#[test]
fn prefill_next_and_next_tokens_are_the_samplers_draws_from_the_logits() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let p = prompt(3, VOCAB, 6);
    for sampling in [Sampling::Greedy, sampled(5)] {
        // By logits, the sampler on the host.
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let mut sampler = Sampler::new(sampling).expect("sampler");
        let logits = session.prefill(&mut backend, id, &p).expect("prefill");
        let mut expected = vec![sampler.sample(&logits[(p.len() - 1) * VOCAB..]).unwrap()];
        for _ in 0..5 {
            let last = *expected.last().unwrap();
            let row = session.decode(&mut backend, id, last).expect("decode");
            expected.push(sampler.sample(&row).unwrap());
        }
        drop(session);
        // By tokens, the session's sampler.
        let seed = match sampling {
            Sampling::Sampled(params) => Some(params.seed),
            Sampling::Greedy => None,
        };
        let got = run_batch(&mut backend, &exec, &[(seed, p.clone())], 5);
        assert_eq!(got[0], expected, "{sampling:?}");
    }
    // Greedy is the arg-max of the prompt's last row.
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let logits = session.prefill(&mut backend, id, &p).expect("prefill");
    let got = run_batch(&mut backend, &exec, &[(None, p.clone())], 0);
    assert_eq!(got[0][0], greedy(&logits[(p.len() - 1) * VOCAB..]));
}

#[test]
fn greedy_next_tokens_are_the_host_arg_max_of_each_rows_logits() {
    // next_tokens takes a greedy batch's tokens on the device (pick::argmax) and reads back
    // only them: the tokens multi_seq_step's logits give on the host, for one sequence
    // (decode) and three (a multi-seq width with a padding row).
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    for count in [1u64, 3] {
        let prompts: Vec<Vec<u32>> = (0..count)
            .map(|i| prompt(30 + i, VOCAB, 4 + i as usize))
            .collect();
        let mut session = Session::new(&exec);
        let mut live: Vec<(SeqId, u32)> = Vec::new();
        let mut expected = vec![Vec::new(); prompts.len()];
        for (i, p) in prompts.iter().enumerate() {
            let id = session.add_sequence();
            let next = session.prefill_next(&mut backend, id, p).expect("prefill");
            expected[i].push(next);
            live.push((id, next));
        }
        for _ in 0..4 {
            let rows = session.multi_seq_step(&mut backend, &live).expect("step");
            for (i, row) in rows.iter().enumerate() {
                let token = greedy(row);
                expected[i].push(token);
                live[i].1 = token;
            }
        }
        drop(session);
        let seqs: Vec<(Option<u64>, Vec<u32>)> = prompts.into_iter().map(|p| (None, p)).collect();
        assert_eq!(
            run_batch(&mut backend, &exec, &seqs, 4),
            expected,
            "{count} sequences"
        );
    }
}

#[test]
fn a_sequences_sampled_tokens_do_not_depend_on_its_batch_or_row() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let mine = (Some(77), prompt(1, VOCAB, 5));
    let alone = run_batch(&mut backend, &exec, std::slice::from_ref(&mine), 6);
    let others: Vec<(Option<u64>, Vec<u32>)> = (0..3)
        .map(|i| (Some(i), prompt(10 + i, VOCAB, 3 + i as usize)))
        .collect();
    // Row 3 of a batch of 4, beside other sampled sequences; then row 0 of 3 beside a greedy one.
    let mut batch = others.clone();
    batch.push(mine.clone());
    let in_batch = run_batch(&mut backend, &exec, &batch, 6);
    assert_eq!(in_batch[3], alone[0], "row 3 of 4");
    let batch = vec![
        mine.clone(),
        (None, prompt(20, VOCAB, 4)),
        others[1].clone(),
    ];
    let in_batch = run_batch(&mut backend, &exec, &batch, 6);
    assert_eq!(in_batch[0], alone[0], "row 0 of 3");
    // And the seed matters: another seed, another stream (temperature 1.5 over 128 tokens).
    let reseeded = run_batch(&mut backend, &exec, &[(Some(78), mine.1.clone())], 6);
    assert_ne!(reseeded[0], alone[0]);
}

#[test]
fn a_sampled_target_with_a_greedy_drafter_samples() {
    // Before: a greedy drafter (no probabilities) made every sampled speculative step accept
    // greedily, so every seed gave the greedy output. Now each seed gives its own tokens,
    // and a seed gives the same tokens on every run.
    let mut backend = backend();
    let target = build(&mut backend, TINY_LLAMA, Policy::default(), roomy_kv());
    let draft = build(&mut backend, TINY_LLAMA, Policy::default(), roomy_kv());
    let run = |backend: &mut CpuBackend, seed: Option<u64>| {
        let mut drafter = ModelDrafter::new(&draft);
        let mut session = Session::new(&target);
        let id = session.add_sequence();
        if let Some(seed) = seed {
            session.set_sampling(id, sampled(seed)).expect("sampling");
        }
        let mut pending = session
            .prefill_next(backend, id, &prompt(4, VOCAB, 5))
            .expect("prefill");
        let mut out = vec![pending];
        for _ in 0..4 {
            let step = session
                .speculative_step(backend, id, pending, 3, &mut drafter)
                .expect("step");
            out.extend(&step.tokens);
            pending = *step.tokens.last().expect("token");
        }
        out.truncate(12);
        out
    };
    let greedy_run = run(&mut backend, None);
    let runs: Vec<Vec<u32>> = (0..4).map(|s| run(&mut backend, Some(s))).collect();
    assert!(
        runs.iter().any(|r| *r != greedy_run),
        "sampled runs all greedy: {runs:?}"
    );
    assert!(runs.windows(2).any(|w| w[0] != w[1]), "seeds all agree");
    assert_eq!(
        run(&mut backend, Some(2)),
        runs[2],
        "a seed is reproducible"
    );
}

/// A prompt fed in chunks (`prefill_chunk`, then `prefill_next` for the last) leaves the cache
/// and the next token a whole prefill gives, greedy and sampled: chunk boundaries move rows
/// between programs, never bytes.
#[test]
fn a_prompt_prefilled_in_chunks_gives_the_whole_prefills_tokens() {
    let mut backend = backend();
    let exec = build_llama(&mut backend, roomy_kv());
    let p = prompt(9, VOCAB, 23);
    for seed in [None, Some(11)] {
        let whole = run_batch(&mut backend, &exec, &[(seed, p.clone())], 6);
        for chunk in [1, 5, 8, 13] {
            let mut session = Session::new(&exec);
            let id = session.add_sequence();
            if let Some(seed) = seed {
                session.set_sampling(id, sampled(seed)).expect("sampling");
            }
            let (head, last) = p.split_at(p.len() - p.len().min(chunk));
            for piece in head.chunks(chunk) {
                session
                    .prefill_chunk(&mut backend, id, piece)
                    .expect("chunk");
            }
            let mut tokens = vec![session.prefill_next(&mut backend, id, last).expect("last")];
            for _ in 0..6 {
                let last = *tokens.last().unwrap();
                tokens.extend(
                    session
                        .next_tokens(&mut backend, &[(id, last)])
                        .expect("step"),
                );
            }
            assert_eq!(tokens, whole[0], "chunks of {chunk}, seed {seed:?}");
            assert_eq!(session.tokens(id).unwrap().len(), p.len() + 6);
        }
    }
}
