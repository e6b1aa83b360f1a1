//! Speculative decoding with the MTP head: Qwen3-Next checkpoints carry a multi-token-
//! prediction head (`mtp.*`) that drafts from the target's own final hidden state, so there
//! is no second model: the head's draft programs are compiled into the target's exec.
//!
//!     cargo run -p solder-examples --example mtp -- [CHECKPOINT] [--tokens N] [--k K] [--cuda]
//!
//! CHECKPOINT is a qwen3_next folder with its `mtp.*` tensors; without one a tiny one is
//! written whose head is set up to agree with the target about half the time (a random head
//! would almost never; `write_tiny_mtp` says how), so steps both keep drafts and roll back.
//! The check: the tokens equal plain greedy decoding's on the same exec.

use std::time::Instant;

use solder_config::ServeShape;
use solder_examples::{backend, build, check, greedy_reference, kv_shape, prompt};
use solder_examples::{write_tiny_mtp, Args, Result, TINY_QWEN3_NEXT};
use solder_model_layers::{greedy, MtpDrafter, Session};

const PROMPT_LEN: usize = 10;

fn main() -> Result<()> {
    let args = Args::parse("mtp [CHECKPOINT] [--tokens N] [--k K] [--cuda]", 24, 3)?;
    let tiny = match args.checkpoints.first() {
        Some(_) => None,
        None => Some(write_tiny_mtp("tiny-qwen3-next", TINY_QWEN3_NEXT, 5)?),
    };
    let dir = args
        .checkpoints
        .first()
        .unwrap_or_else(|| &tiny.as_ref().unwrap().0);
    let mut backend = backend(args.cuda)?;
    let backend = &mut *backend;

    // `draft_widths` asks for the head's draft programs (one row, and 4 rows for catching
    // up after a prefill); the build refuses a checkpoint without `mtp.*` tensors.
    let serve = ServeShape {
        draft_widths: vec![4],
        ..ServeShape::with_max_batch(8)?
    };
    // Three sequences: the reference, the speculative run, and the head's own (its KV).
    let max_len = PROMPT_LEN + args.tokens + args.k + 1;
    let exec = build(backend, dir, serve, kv_shape(3, max_len))?;
    let vocab = exec.config.vocab_size;
    let prompt = prompt(5, PROMPT_LEN, vocab);

    let started = Instant::now();
    let want = greedy_reference(backend, &exec, &prompt, args.tokens - 1)?;
    let plain = started.elapsed();

    // The head drafts from the target's hidden rows, so it must see every target step of the
    // sequence: prefill (and plain decode steps) go through the drafter, which runs them on
    // the target session and keeps their rows; speculative steps hand it their kept rows.
    let mut drafter = MtpDrafter::new(&exec)?;
    let mut session = Session::new(&exec);
    let seq = session.add_sequence();
    let logits = drafter.prefill(backend, &mut session, seq, &prompt)?;
    let mut pending = greedy(&logits[(PROMPT_LEN - 1) * vocab..]);
    let mut tokens = vec![pending];
    let (started, mut steps) = (Instant::now(), 0);
    while tokens.len() < args.tokens {
        let step = session.speculative_step(backend, seq, pending, args.k, &mut drafter)?;
        println!(
            "step {steps:>2}: accepted {}/{} -> {:?}",
            step.accepted, step.proposed, step.tokens
        );
        tokens.extend(&step.tokens);
        pending = *step.tokens.last().unwrap();
        steps += 1;
    }
    let speculative = started.elapsed();
    tokens.truncate(args.tokens);

    let seen = session.acceptances(seq)?;
    println!("generated {tokens:?}");
    println!(
        "acceptance {}/{} drafts ({:.0}%); {} target steps instead of {}",
        seen.accepted,
        seen.proposed,
        100.0 * seen.accepted as f64 / seen.proposed.max(1) as f64,
        steps,
        args.tokens - 1
    );
    println!("plain greedy {plain:.2?}, with the MTP head {speculative:.2?}");
    check(
        tokens == want,
        "MTP speculative output equals plain greedy decoding",
    )
}
