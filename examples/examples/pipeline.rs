//! Pipeline: the serving loop with the device never waiting for the host. Greedy steps stay
//! queued while the host handles each step's tokens (streams them, checks stop conditions);
//! a step's ids come back on their own stream, 4 bytes a sequence.
//!
//!     cargo run -p solder-examples --example pipeline -- [CHECKPOINT] [--tokens N] [--cuda]
//!
//! Three sequences decode in one pipeline. When one reaches its token budget (a stop string,
//! in a real server) the pipeline stops, which takes back the steps queued past what the host
//! saw, and the others go on in a new one. The check: every sequence's tokens equal its solo
//! greedy decode, and every page is back in the pool at the end.

use solder_config::ServeShape;
use solder_examples::{backend, build, check, greedy_reference, kv_shape, prompt};
use solder_examples::{tiny_llama_json, write_tiny, Args, Result};
use solder_model_layers::{SeqId, Session};

/// Steps queued behind the one the host waits for: one keeps the device busy while the host
/// works; two leave slack for a slow host.
const AHEAD: usize = 2;

fn main() -> Result<()> {
    let args = Args::parse("pipeline [CHECKPOINT] [--tokens N] [--cuda]", 12, 0)?;
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
    let lengths = [5, 9, 7];
    // Each sequence wants a different number of tokens, so they leave at different steps.
    let wants: Vec<usize> = (0..lengths.len()).map(|i| args.tokens + 3 * i).collect();
    let max_len = 9 + wants.iter().max().unwrap() + AHEAD + 1;
    let exec = build(
        backend,
        dir,
        ServeShape::with_max_batch(8)?,
        kv_shape(lengths.len() + 1, max_len),
    )?;
    let vocab = exec.config.vocab_size;
    let prompts: Vec<Vec<u32>> = (0..lengths.len())
        .map(|i| prompt(i as u32, lengths[i], vocab))
        .collect();

    let mut session = Session::new(&exec);
    let free_at_start = session.free_page_count();
    // Each running sequence: its id, its tokens so far (the last one is fed next), its budget.
    let mut running: Vec<(SeqId, Vec<u32>, usize)> = Vec::new();
    for (p, &want) in prompts.iter().zip(&wants) {
        let seq = session.add_sequence();
        let first = session.prefill_next(backend, seq, p)?;
        running.push((seq, vec![first], want));
    }
    let mut done: Vec<(SeqId, Vec<u32>)> = Vec::new();
    while !running.is_empty() {
        // One pipeline for the batch as it stands: the first step fed each last token.
        let batch: Vec<(SeqId, u32)> = running
            .iter()
            .map(|(id, tokens, _)| (*id, *tokens.last().unwrap()))
            .collect();
        session.start_pipeline(backend, &batch, AHEAD)?;
        loop {
            // The oldest queued step's tokens; one more step is queued before the wait.
            let next = session.pipeline_next(backend)?;
            for ((_, tokens, _), token) in running.iter_mut().zip(next) {
                tokens.push(token);
            }
            if running
                .iter()
                .any(|(_, tokens, want)| tokens.len() >= *want)
            {
                break;
            }
        }
        // Stopping takes back the steps queued past the tokens just returned: each sequence
        // holds what the host saw, its last token pending, as after `next_tokens`.
        session.stop_pipeline(backend)?;
        let (finished, still): (Vec<_>, Vec<_>) = running
            .into_iter()
            .partition(|(_, tokens, want)| tokens.len() >= *want);
        for (id, tokens, _) in finished {
            println!("sequence {id}: {} tokens {tokens:?}", tokens.len());
            session.end_sequence(id)?;
            done.push((id, tokens));
        }
        running = still;
    }

    // The check: each sequence's tokens are its solo greedy decode's.
    done.sort_by_key(|(id, _)| *id);
    for ((id, tokens), p) in done.iter().zip(&prompts) {
        let alone = greedy_reference(backend, &exec, p, tokens.len() - 1)?;
        check(
            *tokens == alone,
            &format!("sequence {id} equals its solo decode"),
        )?;
    }
    check(
        session.free_page_count() == free_at_start,
        "every page back in the pool",
    )
}
