//! Decode: load a checkpoint, compile its programs, prefill a prompt of token ids, then
//! greedy-decode one token per step.
//!
//!     cargo run -p solder-examples --example decode -- [CHECKPOINT] [--tokens N] [--cuda]
//!
//! CHECKPOINT is a Hugging Face folder (`config.json` and safetensors); without one a tiny
//! random llama is written to a temporary folder. The check: the same prompt fed one decode
//! step at a time gives the same tokens (prefill's verify programs compute what decode does).

use std::time::Instant;

use solder_config::ServeShape;
use solder_examples::{backend, build, check, kv_shape, prompt, tiny_llama_json, write_tiny};
use solder_examples::{Args, Result};
use solder_model_layers::{greedy, Session};

const PROMPT_LEN: usize = 12;

fn main() -> Result<()> {
    let args = Args::parse("decode [CHECKPOINT] [--tokens N] [--cuda]", 24, 0)?;
    // The tiny checkpoint's folder lives until the end of `main`.
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

    // One build compiles every program the serve shape asks for (decode, multi-seq widths
    // 2/4/8, verify widths 2..=8) into one workspace and uploads the weights. The KV cache
    // holds two sequences: the run below and the check's.
    let started = Instant::now();
    let max_len = PROMPT_LEN + args.tokens;
    let exec = build(
        backend,
        dir,
        ServeShape::with_max_batch(8)?,
        kv_shape(2, max_len),
    )?;
    println!(
        "built {} ({} programs) from {} in {:.2?}",
        exec.instance.circuit.name,
        exec.programs().len(),
        dir.display(),
        started.elapsed()
    );

    // A session holds sequences: their KV pages and recurrent-state slots, lent by the exec.
    let vocab = exec.config.vocab_size;
    let prompt = prompt(1, PROMPT_LEN, vocab);
    let mut session = Session::new(&exec);
    let seq = session.add_sequence();

    // `prefill_last` returns the last prompt position's logits, `[vocab]`: the first generated
    // token. Every chunk before the last runs a prefill program, which skips the LM head
    // (`prefill` returns every position's logits instead, `[len * vocab]`).
    let started = Instant::now();
    let logits = session.prefill_last(backend, seq, &prompt)?;
    let prefill = started.elapsed();
    let mut tokens = vec![greedy(&logits)];

    // Each decode step feeds the last token and returns the next position's logits.
    let started = Instant::now();
    while tokens.len() < args.tokens {
        let logits = session.decode(backend, seq, *tokens.last().unwrap())?;
        tokens.push(greedy(&logits));
    }
    let decode = started.elapsed();
    println!("prompt    {prompt:?}");
    println!("generated {tokens:?}");
    println!(
        "prefill {PROMPT_LEN} tokens in {prefill:.2?}; decode {} steps in {decode:.2?} ({:.1} tokens/s)",
        tokens.len() - 1,
        (tokens.len() - 1) as f64 / decode.as_secs_f64()
    );

    // The check: a second sequence fed the prompt token by token through decode alone.
    let alone = session.add_sequence();
    let mut fed = prompt.clone();
    let mut again = Vec::new();
    for at in 0..PROMPT_LEN + args.tokens - 1 {
        let logits = session.decode(backend, alone, fed[at])?;
        if at + 1 >= PROMPT_LEN {
            again.push(greedy(&logits));
            fed.push(greedy(&logits));
        }
    }
    check(again == tokens, "prefill + decode equals decode alone")
}
