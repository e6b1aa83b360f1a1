//! Batch: several sequences of different lengths decoded together, one token each per
//! multi-sequence step, joining and leaving between steps (continuous batching).
//!
//!     cargo run -p solder-examples --example batch -- [CHECKPOINT] [--tokens N] [--cuda]
//!
//! Each request arrives at a step, prefills its prompt alone, joins the running batch, and
//! leaves (giving its KV pages back) once it has its tokens. The check: every sequence's
//! tokens equal its solo greedy decode, and every page is back in the pool at the end.

use std::time::Instant;

use solder_config::ServeShape;
use solder_examples::{backend, build, check, greedy_reference, kv_shape, prompt};
use solder_examples::{tiny_llama_json, write_tiny, Args, Result};
use solder_model_layers::{greedy, SeqId, Session};

/// A request: the step it arrives at, its prompt's length, the tokens it wants.
struct Request {
    arrives: usize,
    prompt: Vec<u32>,
    wants: usize,
    /// While running: its sequence; its tokens so far (the last one is fed next).
    seq: Option<SeqId>,
    tokens: Vec<u32>,
}

fn main() -> Result<()> {
    let args = Args::parse("batch [CHECKPOINT] [--tokens N] [--cuda]", 8, 0)?;
    let tiny = match args.checkpoints.first() {
        Some(_) => None,
        None => Some(write_tiny("tiny-llama", &tiny_llama_json(2), 7)?),
    };
    let dir = args
        .checkpoints
        .first()
        .unwrap_or_else(|| &tiny.as_ref().unwrap().0);
    let mut backend = backend(args.cuda)?;
    let backend = &mut *backend;
    // Multi-seq programs at widths 2, 4 and 8: a step of n sequences runs on the narrowest
    // that holds them, the other rows padding.
    let (lengths, arrivals) = ([3, 11, 6, 14, 5, 9], [0, 0, 1, 3, 4, 4]);
    let max_len = 14 + args.tokens + 3;
    let exec = build(
        backend,
        dir,
        ServeShape::with_max_batch(8)?,
        kv_shape(8, max_len),
    )?;
    let vocab = exec.config.vocab_size;
    let mut requests: Vec<Request> = (0..lengths.len())
        .map(|i| Request {
            arrives: arrivals[i],
            prompt: prompt(i as u32, lengths[i], vocab),
            wants: args.tokens + i % 3, // different lengths: they leave at different steps
            seq: None,
            tokens: Vec::new(),
        })
        .collect();

    let mut session = Session::new(&exec);
    let free_at_start = session.free_page_count();
    let started = Instant::now();
    let (mut step, mut rows) = (0, 0);
    while requests.iter().any(|r| r.tokens.len() < r.wants) {
        // Arrivals join: a prefill of their own, whose last position gives the first token.
        for r in requests.iter_mut().filter(|r| r.arrives == step) {
            let seq = session.add_sequence();
            let logits = session.prefill_last(backend, seq, &r.prompt)?;
            r.tokens.push(greedy(&logits));
            r.seq = Some(seq);
        }
        // One multi-seq step: every running sequence feeds its last token.
        let running: Vec<usize> = (0..requests.len())
            .filter(|&i| requests[i].seq.is_some())
            .collect();
        let batch: Vec<(SeqId, u32)> = running
            .iter()
            .map(|&i| {
                (
                    requests[i].seq.unwrap(),
                    *requests[i].tokens.last().unwrap(),
                )
            })
            .collect();
        if !batch.is_empty() {
            let logits = session.multi_seq_step(backend, &batch)?;
            for (&i, row) in running.iter().zip(&logits) {
                requests[i].tokens.push(greedy(row));
            }
            let (mode, width, _) = session.last_program().unwrap();
            println!("step {step:>2}: sequences {running:?} on {mode:?} width {width}");
            rows += batch.len();
        }
        // Sequences with all their tokens leave; their pages go back to the pool.
        for r in requests.iter_mut().filter(|r| r.tokens.len() == r.wants) {
            if let Some(seq) = r.seq.take() {
                session.end_sequence(seq)?;
            }
        }
        step += 1;
    }
    let took = started.elapsed();
    println!(
        "{} sequences, {rows} batched tokens in {step} steps, {took:.2?} ({:.1} tokens/s)",
        requests.len(),
        rows as f64 / took.as_secs_f64()
    );

    // The check: each sequence alone (a fresh session each) gives the same tokens.
    for (i, r) in requests.iter().enumerate() {
        let alone = greedy_reference(backend, &exec, &r.prompt, r.wants - 1)?;
        println!("sequence {i}: {:?}", r.tokens);
        check(
            r.tokens == alone,
            &format!("sequence {i} equals its solo decode"),
        )?;
    }
    check(
        session.free_page_count() == free_at_start,
        "every page is back in the pool",
    )
}
