//! The MTP draft head on the CPU: draft programs compiled beside the target's, the target's
//! final hidden rows left where the draft program reads them, the draft step's logits equal to
//! a reference computed here from the same weights (the composition of vLLM's
//! `qwen3_next_mtp.py`), one-row chaining equal to an n-row step, the head as a `Drafter`
//! (`MtpDrafter::new`) giving exactly plain greedy decoding's tokens and logits bytes
//! for every k, and the refusals (a family without a head, draft programs without
//! `draft_widths`, a draft whose target rows were never observed).

mod exec_support;

use exec_support::drafters::Oracle;
use exec_support::*;
use half::bf16;
use solder_circuit::{Mode, Policy};
use solder_config::ServeShape;
use solder_gpu_runtime::{CpuBackend, GpuBackend};
use solder_model_layers::meta::{MetaRow, StepMeta};
use solder_model_layers::{
    greedy, Boot, CircuitExec, Drafter, ExecError, HiddenRows, HostWeights, MtpDrafter, Sampling,
    SamplingParams, SeqId, Session, SessionError, Verdict, WeightSource,
};

const SEED: u64 = 0x3a7;

fn draft_serve(widths: &[usize]) -> ServeShape {
    ServeShape {
        draft_widths: widths.to_vec(),
        ..serve()
    }
}

fn build_draft(backend: &mut CpuBackend, widths: &[usize]) -> Result<CircuitExec, ExecError> {
    CircuitExec::build(
        backend,
        Boot {
            config: config(TINY_NEXT),
            serve: draft_serve(widths),
            rules: rules(),
            policy: Policy::default(),
            weights: WeightSource::Random { seed: SEED },
            kv: roomy_kv(),
            precision: Default::default(),
        },
    )
}

/// Zeroes state slot 1 of every recurrent state (what lending it does in a session).
fn zero_slot(backend: &mut CpuBackend, exec: &CircuitExec) {
    for region in &exec.layout.states {
        if region.slot_bytes > 0 {
            backend
                .memset(
                    exec.kv_cache().offset(region.offset + region.slot_bytes),
                    0,
                    region.slot_bytes,
                )
                .expect("zero slot 1");
        }
    }
}

fn meta(exec: &CircuitExec, rows: &[(u32, usize)], pages: &[u32]) -> StepMeta {
    let rows: Vec<MetaRow<'_>> = rows
        .iter()
        .map(|&(token, position)| MetaRow::Live {
            token,
            position,
            pages,
            state_slot: 1,
            state_slot_out: 1,
            snapshot: false,
            logits: true,
        })
        .collect();
    StepMeta::new(&exec.layout.meta, &rows).expect("meta")
}

// ---- the reference: f32 arithmetic over the bf16 weights, bf16 where the kernels store ----

fn r(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

struct Weights<'a> {
    exec: &'a CircuitExec,
    host: HostWeights,
}

impl Weights<'_> {
    fn get(&self, name: &str) -> Vec<f32> {
        let circuit = self.exec.instance.storage();
        let (i, slot) = circuit
            .weights
            .iter()
            .enumerate()
            .find(|(_, w)| w.name == name || w.parts.iter().any(|p| p == name))
            .unwrap_or_else(|| panic!("no slot {name}"));
        let all = self.host.bf16_values(i);
        let values = match slot.parts.iter().position(|p| p == name) {
            // A stacked slot: the part's own tensor.
            Some(j) => {
                let part: usize = slot.shape[1..].iter().product();
                &all[j * part..][..part]
            }
            None => &all[..],
        };
        values.iter().map(|v| v.to_f32()).collect()
    }
}

/// y[o] = Σ_i w[o, i] x[i] (f32).
fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn zc_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + eps).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, g)| r(v * inv * (1.0 + g)))
        .collect()
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The draft head's logits at positions 0..pairs.len() for the pairs (hidden[p], token[p+1]).
fn reference(w: &Weights<'_>, pairs: &[(Vec<f32>, u32)]) -> Vec<Vec<f32>> {
    let cfg = &w.exec.config;
    let (hidden, eps) = (cfg.hidden_size, cfg.rms_norm_eps as f32);
    let (heads, kv_heads, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let p = "mtp.layers.0.";
    let embed = w.get("model.embed_tokens.weight");
    let fc = w.get("mtp.fc.weight");
    let (we, wh) = (
        w.get("mtp.pre_fc_norm_embedding.weight"),
        w.get("mtp.pre_fc_norm_hidden.weight"),
    );
    let inv_freq = cfg.rope.inv_freq(hd);
    let half = inv_freq.len();
    let mut keys: Vec<Vec<f32>> = Vec::new();
    let mut values: Vec<Vec<f32>> = Vec::new();
    let mut out = Vec::new();
    for (pos, (h, token)) in pairs.iter().enumerate() {
        let e = &embed[*token as usize * hidden..][..hidden];
        let mut cat = zc_norm(e, &we, eps);
        cat.extend(zc_norm(h, &wh, eps));
        let mut resid = matvec(&fc, &cat); // f32: the head's residual stream starts here
        let x = zc_norm(&resid, &w.get(&format!("{p}input_layernorm.weight")), eps);
        let q2: Vec<f32> = matvec(&w.get(&format!("{p}self_attn.q_proj.weight")), &x)
            .into_iter()
            .map(r)
            .collect();
        let k: Vec<f32> = matvec(&w.get(&format!("{p}self_attn.k_proj.weight")), &x)
            .into_iter()
            .map(r)
            .collect();
        let v: Vec<f32> = matvec(&w.get(&format!("{p}self_attn.v_proj.weight")), &x)
            .into_iter()
            .map(r)
            .collect();
        // q_proj gives, per head, [q | gate].
        let (mut q, mut gate) = (Vec::new(), Vec::new());
        for head in q2.chunks_exact(2 * hd) {
            q.extend_from_slice(&head[..hd]);
            gate.extend_from_slice(&head[hd..]);
        }
        let (qn, kn) = (
            w.get(&format!("{p}self_attn.q_norm.weight")),
            w.get(&format!("{p}self_attn.k_norm.weight")),
        );
        let rope = |x: &[f32], norm: &[f32]| -> Vec<f32> {
            let mut y = zc_norm(x, norm, eps);
            for i in 0..half {
                let angle = pos as f32 * inv_freq[i];
                let (s, c) = angle.sin_cos();
                let (a, b) = (y[i], y[i + half]);
                y[i] = r(a * c - b * s);
                y[i + half] = r(b * c + a * s);
            }
            y
        };
        let q: Vec<f32> = q.chunks_exact(hd).flat_map(|h| rope(h, &qn)).collect();
        let k: Vec<f32> = k.chunks_exact(hd).flat_map(|h| rope(h, &kn)).collect();
        keys.push(k);
        values.push(v);
        let scale = 1.0 / (hd as f32).sqrt();
        let mut attn = vec![0.0f32; heads * hd];
        for hh in 0..heads {
            let kvh = hh / (heads / kv_heads);
            let qh = &q[hh * hd..][..hd];
            let scores: Vec<f32> = keys
                .iter()
                .map(|k| {
                    qh.iter()
                        .zip(&k[kvh * hd..][..hd])
                        .map(|(a, b)| a * b)
                        .sum::<f32>()
                        * scale
                })
                .collect();
            let max = scores.iter().cloned().fold(f32::MIN, f32::max);
            let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = exps.iter().sum();
            for (e, v) in exps.iter().zip(&values) {
                for d in 0..hd {
                    attn[hh * hd + d] += e / total * v[kvh * hd + d];
                }
            }
        }
        let gated: Vec<f32> = attn
            .iter()
            .zip(&gate)
            .map(|(a, g)| r(r(*a) * sigmoid(*g)))
            .collect();
        let o = matvec(&w.get(&format!("{p}self_attn.o_proj.weight")), &gated);
        for (h, o) in resid.iter_mut().zip(&o) {
            *h += r(*o);
        }
        let x = zc_norm(
            &resid,
            &w.get(&format!("{p}post_attention_layernorm.weight")),
            eps,
        );
        // MoE: softmax over experts, top-k, renormalised; plus the gated shared expert.
        let moe = cfg.moe.as_ref().expect("moe");
        let router = matvec(&w.get(&format!("{p}mlp.gate.weight")), &x);
        let max = router.iter().cloned().fold(f32::MIN, f32::max);
        let probs: Vec<f32> = router.iter().map(|l| (l - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].partial_cmp(&probs[a]).unwrap().then(a.cmp(&b)));
        let chosen = &order[..moe.experts_per_token];
        let norm: f32 = chosen.iter().map(|&e| probs[e] / total).sum();
        let mlp = |prefix: &str, x: &[f32]| -> Vec<f32> {
            let g = matvec(&w.get(&format!("{prefix}gate_proj.weight")), x);
            let u = matvec(&w.get(&format!("{prefix}up_proj.weight")), x);
            let act: Vec<f32> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| r(silu(r(*g)) * r(*u)))
                .collect();
            matvec(&w.get(&format!("{prefix}down_proj.weight")), &act)
        };
        let mut routed = vec![0.0f32; hidden];
        for &e in chosen {
            let weight = probs[e] / total / norm;
            for (acc, y) in routed
                .iter_mut()
                .zip(mlp(&format!("{p}mlp.experts.{e}."), &x))
            {
                *acc += weight * r(y);
            }
        }
        let shared = mlp(&format!("{p}mlp.shared_expert."), &x);
        let sg = sigmoid(matvec(&w.get(&format!("{p}mlp.shared_expert_gate.weight")), &x)[0]);
        for ((h, a), s) in resid.iter_mut().zip(&routed).zip(&shared) {
            *h += r(r(*a) + r(*s) * sg);
        }
        let normed = zc_norm(&resid, &w.get("mtp.norm.weight"), eps);
        out.push(matvec(&w.get("lm_head.weight"), &normed));
    }
    out
}

/// max |a - b| over max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().map(|v| v.abs()).fold(0.0, f32::max);
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}

#[test]
fn draft_programs_are_compiled_in_the_same_workspace() {
    let mut backend = backend();
    let exec = build_draft(&mut backend, &[4]).expect("build");
    let draft: Vec<usize> = exec
        .programs()
        .iter()
        .filter(|p| p.mode == Mode::Draft)
        .map(|p| p.rows)
        .collect();
    assert_eq!(draft, [1, 4], "draft at one row and at each draft width");
    // The canonical order: draft programs after every verify program.
    let modes: Vec<Mode> = exec.plans.iter().map(|p| p.mode).collect();
    let first_draft = modes.iter().position(|m| *m == Mode::Draft).unwrap();
    assert!(modes[first_draft..].iter().all(|m| *m == Mode::Draft));
    assert!(exec.layout.hidden_bytes >= exec.layout.max_rows * 64 * 2);
}

#[test]
fn draft_logits_match_the_reference_and_chain_like_a_wide_step() {
    let mut backend = backend();
    let exec = build_draft(&mut backend, &[4]).expect("build");
    zero_slot(&mut backend, &exec);
    let pages = [1u32, 2, 3, 4];
    let tokens = prompt(9, 128, 6);
    // The target decodes token by token; each step leaves its final hidden row.
    let mut hidden = Vec::new();
    for (p, &t) in tokens.iter().enumerate() {
        exec.step_with_meta(&mut backend, Mode::Decode, &meta(&exec, &[(t, p)], &pages))
            .expect("decode");
        hidden.push(
            exec.read_hidden(&mut backend, HiddenRows::Target, 1)
                .expect("hidden"),
        );
    }
    let pairs = tokens.len() - 1;
    // One-row draft steps over (hidden[p], token[p+1]) at position p.
    let mut one_row = Vec::new();
    for p in 0..pairs {
        exec.write_hidden(&mut backend, &hidden[p]).expect("write");
        one_row.push(
            exec.step_with_meta(
                &mut backend,
                Mode::Draft,
                &meta(&exec, &[(tokens[p + 1], p)], &pages),
            )
            .expect("draft"),
        );
    }
    let weights = Weights {
        exec: &exec,
        host: HostWeights::random(exec.instance.storage(), SEED),
    };
    let want = reference(
        &weights,
        &(0..pairs)
            .map(|p| {
                (
                    hidden[p].iter().map(|v| v.to_f32()).collect(),
                    tokens[p + 1],
                )
            })
            .collect::<Vec<_>>(),
    );
    for (p, (got, want)) in one_row.iter().zip(&want).enumerate() {
        let err = rel_err(got, want);
        assert!(
            err < 5e-3,
            "draft logits at position {p}: relative error {err}"
        );
    }
    // The four-row program over the first four pairs gives each row the one-row bytes.
    let rows: Vec<bf16> = hidden[..4].concat();
    exec.write_hidden(&mut backend, &rows).expect("write");
    let wide = exec
        .step_with_meta(
            &mut backend,
            Mode::Draft,
            &meta(
                &exec,
                &(0..4).map(|p| (tokens[p + 1], p)).collect::<Vec<_>>(),
                &pages,
            ),
        )
        .expect("wide draft");
    for p in 0..4 {
        assert_same_bytes(&wide[p * 128..][..128], &one_row[p], &format!("row {p}"));
    }
    // A drafter fed the same tokens through a session pairs them to the same bytes.
    let mut drafter = MtpDrafter::new(&exec).expect("head");
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    for &t in &tokens {
        drafter
            .decode(&mut backend, &mut session, id, t)
            .expect("observed decode");
    }
    let caught_up = drafter
        .catch_up(&mut backend, id, &tokens)
        .expect("catch up");
    assert_same_bytes(&caught_up, &one_row.concat(), "catch_up vs one-row steps");
    assert_eq!(drafter.paired(id), Some((pairs, 1)));
    drafter.forget(id);
    drop(session);
    // Chaining: the last row's own hidden output feeds the next one-row step.
    let out = exec
        .read_hidden(&mut backend, HiddenRows::Draft, 4)
        .expect("draft hidden");
    exec.chain_hidden(&mut backend, 3, 0).expect("chain");
    let chained = exec
        .read_hidden(&mut backend, HiddenRows::Target, 1)
        .expect("hidden");
    assert_eq!(chained, out[3 * 64..][..64].to_vec());
}

#[test]
fn draft_programs_are_refused_where_there_is_no_head() {
    let mut backend = backend();
    let err = CircuitExec::build(
        &mut backend,
        Boot {
            config: config(TINY_LLAMA),
            serve: draft_serve(&[2]),
            rules: rules(),
            policy: Policy::default(),
            weights: WeightSource::Random { seed: 1 },
            kv: roomy_kv(),
            precision: Default::default(),
        },
    )
    .err()
    .expect("llama has no MTP head");
    assert!(err.to_string().contains("MTP draft head"), "{err}");
    // A build without draft widths has no draft program and no hidden regions.
    let exec = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    assert!(!exec.has_draft_head());
    assert_eq!(exec.layout.hidden_bytes, 0);
    assert!(exec.program(Mode::Draft, 1).is_err());
    let err = exec
        .read_hidden(&mut backend, HiddenRows::Target, 1)
        .unwrap_err();
    assert!(err.to_string().contains("no draft programs"), "{err}");
}

const GEN: usize = 12;

#[test]
fn the_mtp_drafter_is_lossless_for_every_k() {
    let mut backend = backend();
    let exec = build_draft(&mut backend, &[4]).expect("build");
    let vocab = exec.config.vocab_size;
    let prompt = prompt(3, 128, 11);
    // Plain greedy decoding.
    let (want_tokens, want_logits) = {
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let logits = session.prefill(&mut backend, id, &prompt).expect("prefill");
        let mut token = greedy(&logits[(prompt.len() - 1) * vocab..]);
        let (mut tokens, mut all) = (vec![token], Vec::new());
        for _ in 0..GEN {
            let logits = session.decode(&mut backend, id, token).expect("decode");
            token = greedy(&logits);
            tokens.push(token);
            all.extend(logits);
        }
        (tokens, all)
    };
    let sampled = Sampling::Sampled(SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 11,
    });
    // Greedy drafts, and drafts sampled from the head (their distributions handed over; the
    // greedy target keeps only its own arg-max either way).
    for (k, sampling) in [1, 2, 3, 5, 7]
        .map(|k| (k, Sampling::Greedy))
        .into_iter()
        .chain([(3, sampled)])
    {
        let mut drafter = MtpDrafter::sampled(&exec, sampling).expect("a draft head");
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        let logits = drafter
            .prefill(&mut backend, &mut session, id, &prompt)
            .expect("observed prefill");
        let mut pending = greedy(&logits[(prompt.len() - 1) * vocab..]);
        let (mut tokens, mut all) = (vec![pending], Vec::new());
        while all.len() < GEN * vocab {
            let step = session
                .speculative_step(&mut backend, id, pending, k, &mut drafter)
                .expect("speculative step");
            tokens.extend(&step.tokens);
            all.extend(&step.logits);
            pending = *step.tokens.last().unwrap();
            // The head's final positions follow the target's, one behind its pending token.
            let (paired, rows) = drafter.paired(id).expect("head");
            assert_eq!(paired + rows, session.seq_len(id).unwrap(), "k {k}");
        }
        let n = GEN * vocab;
        assert_eq!(tokens[..=GEN], want_tokens[..], "k {k}: tokens");
        assert_same_bytes(&all[..n], &want_logits, &format!("k {k}: logits"));
        drafter.forget(id);
    }
}

#[test]
fn a_draft_needs_every_target_row_observed_and_a_head() {
    let mut backend = backend();
    let exec = build_draft(&mut backend, &[4]).expect("build");
    let vocab = exec.config.vocab_size;
    let mut drafter = MtpDrafter::new(&exec).expect("a draft head");
    let mut session = Session::new(&exec);
    let id = session.add_sequence();
    let prompt = prompt(5, 128, 9);
    // Prefilled behind the drafter's back: the rows of the earlier chunks are gone.
    let logits = session.prefill(&mut backend, id, &prompt).expect("prefill");
    let pending = greedy(&logits[(prompt.len() - 1) * vocab..]);
    let err = session
        .speculative_step(&mut backend, id, pending, 2, &mut drafter)
        .unwrap_err();
    assert!(matches!(err, SessionError::DraftHead(_)), "{err}");
    assert!(err.to_string().contains("observe"), "{err}");
    assert_eq!(session.seq_len(id).unwrap(), prompt.len(), "unchanged");
    // Rows observed out of order are refused by position.
    let err = drafter.observe(&mut backend, id, 3, 1).unwrap_err();
    assert!(err.to_string().contains("positions 3..4"), "{err}");

    // No head: no drafter.
    let plain = build(&mut backend, TINY_NEXT, Policy::default(), roomy_kv());
    let err = MtpDrafter::new(&plain).err().expect("no head");
    assert!(err.to_string().contains("no MTP draft head"), "{err}");
}

/// The head layer's K and V bytes at the first `positions` positions of head sequence `id`.
fn head_kv(
    backend: &mut CpuBackend,
    exec: &CircuitExec,
    drafter: &MtpDrafter<'_>,
    seq: SeqId,
    positions: usize,
) -> Vec<u8> {
    let id = drafter.head_sequence(seq).expect("head sequence");
    let table = drafter.session().block_table(id).expect("table").to_vec();
    // The head's KV state is the draft circuit's last state declaration.
    let region = *exec.layout.states.last().unwrap();
    let (block, cell) = (exec.layout.kv_block_size, 32 * 2); // kv_heads 1 · head_dim 32 · bf16
    let page_bytes = 2 * block * cell;
    let mut out = Vec::new();
    for p in 0..positions {
        let page = region.offset + table[p / block] as usize * page_bytes;
        for half in 0..2 {
            let at = page + half * block * cell + (p % block) * cell;
            let mut bytes = vec![0u8; cell];
            backend
                .copy_d2h(exec.kv_cache().offset(at), &mut bytes)
                .expect("read kv");
            out.extend(bytes);
        }
    }
    out
}

#[test]
fn accepted_drafts_leave_the_head_as_a_head_fed_the_kept_pairs() {
    let mut backend = backend();
    let exec = build_draft(&mut backend, &[4]).expect("build");
    let vocab = exec.config.vocab_size;
    let prompt = prompt(7, 128, 6);
    // The target's greedy continuation, fed through an observing drafter step by step: its
    // head, caught up in one draft at the end, is the reference.
    let mut reference = MtpDrafter::new(&exec).expect("head");
    let mut plain = Session::new(&exec);
    let rid = plain.add_sequence();
    let logits = reference
        .prefill(&mut backend, &mut plain, rid, &prompt)
        .expect("prefill");
    let mut future = vec![greedy(&logits[(prompt.len() - 1) * vocab..])];
    for _ in 0..GEN {
        let t = *future.last().unwrap();
        let logits = reference
            .decode(&mut backend, &mut plain, rid, t)
            .expect("decode");
        future.push(greedy(&logits));
    }
    let committed = plain.tokens(rid).expect("tokens").to_vec();
    reference
        .draft(&mut backend, rid, &committed, future[GEN], 1)
        .expect("catch-up");
    reference
        .settle(&mut backend, rid, Verdict { kept: 1, row: 0 })
        .expect("settle");
    let final_positions = committed.len();
    assert_eq!(reference.paired(rid), Some((final_positions, 1)));

    for k in [2, 3, 4] {
        let mut oracle = Oracle {
            inner: MtpDrafter::new(&exec).expect("head"),
            futures: Default::default(),
            prompt_len: prompt.len(),
        };
        let mut session = Session::new(&exec);
        let id = session.add_sequence();
        oracle
            .inner
            .prefill(&mut backend, &mut session, id, &prompt)
            .expect("prefill");
        oracle.futures.insert(id, future.clone());
        let mut pending = future[0];
        while session.seq_len(id).unwrap() + k < final_positions {
            let step = session
                .speculative_step(&mut backend, id, pending, k, &mut oracle)
                .expect("step");
            assert_eq!(step.accepted, k, "the oracle's drafts are all accepted");
            pending = *step.tokens.last().unwrap();
        }
        let (paired, rows) = oracle.inner.paired(id).expect("head");
        assert_eq!(paired + rows, session.seq_len(id).unwrap());
        assert!(rows > k, "k {k}: the last settle observed every kept row");
        assert_eq!(
            head_kv(&mut backend, &exec, &oracle.inner, id, paired),
            head_kv(&mut backend, &exec, &reference, rid, paired),
            "k {k}: the head's KV at its final positions"
        );
        oracle.forget(id);
    }
}

#[test]
fn batched_verify_with_the_head_keeps_each_sequence_as_alone() {
    let mut backend = backend();
    let exec = build_draft(&mut backend, &[4]).expect("build");
    let vocab = exec.config.vocab_size;
    let prompts: Vec<Vec<u32>> = (0..3).map(|s| prompt(20 + s, 128, 5)).collect();
    // Each sequence alone: its greedy future and its head, caught up over it (the reference).
    let mut references = Vec::new();
    for p in &prompts {
        let mut drafter = MtpDrafter::new(&exec).expect("head");
        let mut plain = Session::new(&exec);
        let rid = plain.add_sequence();
        let logits = drafter
            .prefill(&mut backend, &mut plain, rid, p)
            .expect("prefill");
        let mut future = vec![greedy(&logits[(p.len() - 1) * vocab..])];
        for _ in 0..8 {
            let t = *future.last().unwrap();
            future.push(greedy(
                &drafter
                    .decode(&mut backend, &mut plain, rid, t)
                    .expect("decode"),
            ));
        }
        let committed = plain.tokens(rid).unwrap().to_vec();
        drafter
            .catch_up(&mut backend, rid, &committed)
            .expect("catch up");
        references.push((drafter, plain, rid, future));
    }
    // All three in batched speculative steps, each with its own k, every draft accepted.
    let mut oracles = Oracle {
        inner: MtpDrafter::new(&exec).expect("head"),
        futures: Default::default(),
        prompt_len: 5,
    };
    let mut session = Session::new(&exec);
    let ids: Vec<SeqId> = prompts.iter().map(|_| session.add_sequence()).collect();
    for ((&id, p), r) in ids.iter().zip(&prompts).zip(&references) {
        oracles
            .inner
            .prefill(&mut backend, &mut session, id, p)
            .expect("prefill");
        oracles.futures.insert(id, r.3.clone());
    }
    let ks = [1, 2, 2]; // 8 rows: the widest batched-verify program
    let mut pending: Vec<u32> = references.iter().map(|r| r.3[0]).collect();
    for _ in 0..2 {
        let batch: Vec<(SeqId, u32, usize)> = ids
            .iter()
            .zip(&pending)
            .zip(ks)
            .map(|((&id, &p), k)| (id, p, k))
            .collect();
        let steps = session
            .speculative_step_many(&mut backend, &batch, &mut oracles)
            .expect("batched step");
        for (i, step) in steps.iter().enumerate() {
            assert_eq!(step.accepted, ks[i]);
            pending[i] = *step.tokens.last().unwrap();
        }
    }
    for (i, &id) in ids.iter().enumerate() {
        let (paired, rows) = oracles.inner.paired(id).expect("head");
        assert_eq!(paired + rows, session.seq_len(id).unwrap(), "sequence {i}");
        let (reference, _, rid, _) = &references[i];
        assert_eq!(
            head_kv(&mut backend, &exec, &oracles.inner, id, paired),
            head_kv(&mut backend, &exec, reference, *rid, paired),
            "sequence {i}: the head's KV after batched verify steps"
        );
    }
}
