//! Speculative decoding with a draft model: a smaller model of the same vocabulary drafts k
//! tokens, the target checks them all in one verify step, keeps the agreeing prefix plus its
//! own next token, and rolls the rest back.
//!
//!     cargo run -p solder-examples --example speculative -- [TARGET [DRAFT]] [--tokens N] [--k K] [--cuda]
//!
//! Without checkpoints a tiny random llama is written, with a layer-skip draft (its first
//! layer, the target's own weights); with TARGET alone, the target drafts for itself. The
//! check: the tokens equal plain greedy decoding's (greedy acceptance is lossless).

use std::time::Instant;

use solder_config::ServeShape;
use solder_examples::{backend, build, check, greedy_reference, kv_shape, prompt};
use solder_examples::{tiny_llama_json, write_layer_skip_draft, write_tiny, Args, Result};
use solder_model_layers::{greedy, ModelDrafter, Session, SpecPolicy};

const PROMPT_LEN: usize = 10;

fn main() -> Result<()> {
    let usage = "speculative [TARGET [DRAFT]] [--tokens N] [--k K] [--cuda]";
    let args = Args::parse(usage, 32, 3)?;
    let mut tiny = Vec::new(); // the built-in checkpoints' folders, removed at the end
    let (target_dir, draft_dir) = match args.checkpoints.as_slice() {
        [] => {
            // A 4-layer target and a 2-layer draft made of its first two layers.
            let (big, small) = (tiny_llama_json(4), tiny_llama_json(2));
            let target = write_tiny("tiny-llama", &big, 11)?;
            let draft = write_layer_skip_draft(&target.0, &big, &small)?;
            let dirs = (target.0.clone(), draft.0.clone());
            tiny.extend([target, draft]);
            dirs
        }
        [target] => (target.clone(), target.clone()),
        [target, draft, ..] => (target.clone(), draft.clone()),
    };
    let mut backend = backend(args.cuda)?;
    let backend = &mut *backend;

    // Verify programs of widths 2..=8 check up to 7 drafts at once. Both models serve three
    // sequences (the reference, the speculative run, and the drafter's own).
    let max_len = PROMPT_LEN + args.tokens + args.k + 1;
    let serve = ServeShape::with_max_batch(8)?;
    let target = build(backend, &target_dir, serve.clone(), kv_shape(3, max_len))?;
    let draft = build(backend, &draft_dir, serve, kv_shape(3, max_len))?;
    let vocab = target.config.vocab_size;
    let prompt = prompt(3, PROMPT_LEN, vocab);

    // The reference: plain greedy decoding, one target step per token.
    let started = Instant::now();
    let want = greedy_reference(backend, &target, &prompt, args.tokens - 1)?;
    let plain = started.elapsed();

    // The drafter keeps its own session on the draft exec, one sequence per target sequence,
    // and catches up on whatever the target committed (the prompt, kept tokens).
    let mut drafter = ModelDrafter::new(&draft);
    let mut session = Session::new(&target);
    let seq = session.add_sequence();
    let logits = session.prefill(backend, seq, &prompt)?;
    // `pending`: the token the sequence feeds next (generated, not yet in its cache).
    let mut pending = greedy(&logits[(PROMPT_LEN - 1) * vocab..]);
    let mut tokens = vec![pending];
    let (started, mut steps) = (Instant::now(), 0);
    while tokens.len() < args.tokens {
        // One step: k drafts, one verify of k + 1 rows; `step.tokens` are the accepted drafts
        // then the target's own next token (the new pending one).
        let k = session.next_k(seq, SpecPolicy::Fixed(args.k))?;
        let step = session.speculative_step(backend, seq, pending, k, &mut drafter)?;
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
    println!("plain greedy {plain:.2?} (prefill included), speculative {speculative:.2?} (drafting included)");
    check(
        tokens == want,
        "speculative output equals plain greedy decoding",
    )
}
