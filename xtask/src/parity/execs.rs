//! The execs a parity case runs on and the runs it makes on them: the serve shape and KV
//! pages parity compiles for, building an exec, and decode, multi-seq, verify, prefill and
//! batched verify runs that log the programs they launch.
//!
//! Invariant: every run goes through a [`Routing`] and logs its steps in a [`RouteLog`], so
//! the rows can name the programs each ran.

use solder_circuit::{Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{Boot, CircuitExec, KvShape, Session, WeightSource};

use super::case::{err, spec_gen, spec_prefix, Case, RouteLog, Routing, Weights, R};

/// Prompts longer than this run a narrower serve shape (`serve_for`).
pub const LONG_PROMPT: usize = 256;

/// The widest multi-seq width of a long prompt's serve shape: every width of the default
/// ladder over a prompt past 1,024 tokens would take parity minutes on the CPU backend.
pub const LONG_PROMPT_MAX_BATCH: usize = 4;

/// The serve shape parity compiles for a prompt of `tokens`: the default one, or for a prompt
/// longer than `LONG_PROMPT` the default cut at `LONG_PROMPT_MAX_BATCH` sequences (every
/// verify width kept).
pub fn serve_for(tokens: usize) -> ServeShape {
    if tokens > LONG_PROMPT {
        ServeShape::with_max_batch(LONG_PROMPT_MAX_BATCH).unwrap_or_default()
    } else {
        ServeShape::default()
    }
}

/// The serve shape parity runs `case` at: `serve_for` its prompt, cut at the case's
/// `max_batch` when it has one.
pub fn serve_of(case: &Case) -> ServeShape {
    let serve = serve_for(case.prompt.len());
    match case.max_batch {
        Some(n) if n < serve.max_batch => ServeShape::with_max_batch(n).unwrap_or(serve),
        _ => serve,
    }
}

/// KV pages one sequence of `tokens` holds at most: all of them, or with a sliding window in
/// every attention layer only those the Session keeps (`Session::kv_keep`: the widest window
/// plus the widest verify width `rollback`) and those a step of up to `rollback` tokens adds
/// before it recycles, so a windowed case runs on a pool smaller than its sequences (a
/// Session that failed to recycle runs out of pages).
pub fn pages_per_sequence(
    config: &ModelConfig,
    tokens: usize,
    block_size: usize,
    rollback: usize,
) -> usize {
    let all = tokens.div_ceil(block_size);
    match config.kv_window() {
        Some(window) => all.min((window + 2 * rollback).div_ceil(block_size) + 1),
        None => all,
    }
}

/// The exec of `case` under `policy` on `backend`: the serve shape `serve_for` its prompt,
/// and a KV cache for every prompt of the widest multi-seq width.
pub fn build_exec(
    case: &Case,
    rules: &RuleSet,
    backend: &mut dyn GpuBackend,
    policy: Policy,
) -> R<CircuitExec> {
    build_exec_with(case, rules, backend, policy, serve_of(case))
}

/// `build_exec` at `serve` (the KV cache sized from its widest multi-seq width).
pub fn build_exec_with(
    case: &Case,
    rules: &RuleSet,
    backend: &mut dyn GpuBackend,
    policy: Policy,
    serve: ServeShape,
) -> R<CircuitExec> {
    let prompt = case.prompt.len();
    let widest = serve.multi_seq_ladder.last().copied().unwrap_or(1);
    let rollback = serve.verify_widths.last().copied().unwrap_or(1);
    // Room for the speculative check too: its prefix, the tokens it generates and one
    // verify step past them.
    let tokens = prompt.max(spec_prefix(prompt) + spec_gen(prompt) + rollback);
    let block_size = 16;
    let per_sequence = pages_per_sequence(&case.config, tokens, block_size, rollback);
    let kv = KvShape {
        pages: (widest + 2) * per_sequence + 2,
        block_size,
        max_seq_len: tokens.next_multiple_of(block_size),
        max_sequences: widest + 2,
    };
    let weights = match &case.weights {
        Weights::Random { seed } => WeightSource::Random { seed: *seed },
        Weights::Checkpoint(dir) => WeightSource::Checkpoint(dir.clone()),
    };
    let boot = Boot {
        config: case.config.clone(),
        serve,
        rules: rules.clone(),
        policy,
        weights,
        kv,
        precision: Default::default(),
    };
    CircuitExec::build(backend, boot).map_err(|e| format!("{}: {e}", case.name))
}

/// Teacher-forced decode of `prompt`, one token per step: logits `[T * V]`.
pub fn decode_all(exec: &CircuitExec, backend: &mut dyn GpuBackend, prompt: &[u32]) -> R<Vec<f32>> {
    let routing = Routing { exec, fusions: "" };
    decode_logged(routing, backend, prompt, &mut RouteLog::default())
}

/// `decode_all`, counting the steps that ran on route arms.
pub(super) fn decode_logged(
    routing: Routing,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    routes: &mut RouteLog,
) -> R<Vec<f32>> {
    let mut session = Session::new(routing.exec);
    let id = session.add_sequence();
    let mut logits = Vec::with_capacity(prompt.len() * routing.exec.config.vocab_size);
    for &token in prompt {
        logits.extend(session.decode(backend, id, token).map_err(err)?);
        routes.record(routing.fusions, &session);
    }
    session.end_sequence(id).map_err(err)?;
    Ok(logits)
}

/// Every prompt in its own row, one token per step: each sequence's logits.
pub(super) fn multi_seq(
    routing: Routing,
    backend: &mut dyn GpuBackend,
    prompts: &[Vec<u32>],
    routes: &mut RouteLog,
) -> R<Vec<Vec<f32>>> {
    let mut session = Session::new(routing.exec);
    let ids: Vec<_> = prompts.iter().map(|_| session.add_sequence()).collect();
    let mut logits = vec![Vec::new(); prompts.len()];
    for t in 0..prompts[0].len() {
        let batch: Vec<_> = ids.iter().zip(prompts).map(|(&id, p)| (id, p[t])).collect();
        let step = session.multi_seq_step(backend, &batch).map_err(err)?;
        routes.record(routing.fusions, &session);
        for (out, l) in logits.iter_mut().zip(step) {
            out.extend(l);
        }
    }
    for id in ids {
        session.end_sequence(id).map_err(err)?;
    }
    Ok(logits)
}

/// Every prompt (of one length) fed `k` tokens per step, all of them in one batched-verify
/// step (the last step with the remainder): each sequence's logits.
pub(super) fn verify_batched(
    routing: Routing,
    backend: &mut dyn GpuBackend,
    prompts: &[Vec<u32>],
    k: usize,
    routes: &mut RouteLog,
) -> R<Vec<Vec<f32>>> {
    let mut session = Session::new(routing.exec);
    let ids: Vec<_> = prompts.iter().map(|_| session.add_sequence()).collect();
    let mut logits = vec![Vec::new(); prompts.len()];
    let len = prompts[0].len();
    for at in (0..len).step_by(k.max(1)) {
        let end = (at + k).min(len);
        let batch: Vec<(u64, &[u32])> = ids
            .iter()
            .zip(prompts)
            .map(|(&id, p)| (id, &p[at..end]))
            .collect();
        let step = session.verify_batch(backend, &batch).map_err(err)?;
        routes.record(routing.fusions, &session);
        for (out, l) in logits.iter_mut().zip(step) {
            out.extend(l);
        }
    }
    for id in ids {
        session.end_sequence(id).map_err(err)?;
    }
    Ok(logits)
}

/// `prompt` in verify steps of `k` tokens (the remainder through narrower programs).
pub(super) fn verify_chunks(
    routing: Routing,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    k: usize,
    routes: &mut RouteLog,
) -> R<Vec<f32>> {
    let mut session = Session::new(routing.exec);
    let id = session.add_sequence();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(k) {
        let out = if chunk.len() == k {
            session.verify(backend, id, chunk)
        } else {
            session.prefill(backend, id, chunk)
        };
        logits.extend(out.map_err(err)?);
        routes.record(routing.fusions, &session);
    }
    session.end_sequence(id).map_err(err)?;
    Ok(logits)
}

/// `prompt` as prompt chunks of up to `k` tokens through `Session::prefill_chunk` (prefill
/// programs: no LM head, no logits), each followed by one decoded token: the logits of the
/// decoded positions (`prefill_positions`), which read every KV page and state the chunks
/// wrote.
pub(super) fn prefill_chunks(
    routing: Routing,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    k: usize,
    routes: &mut RouteLog,
) -> R<Vec<f32>> {
    let mut session = Session::new(routing.exec);
    let id = session.add_sequence();
    let mut logits = Vec::new();
    let mut at = 0;
    for position in prefill_positions(prompt.len(), k) {
        if position > at {
            session
                .prefill_chunk(backend, id, &prompt[at..position])
                .map_err(err)?;
            routes.record(routing.fusions, &session);
        }
        logits.extend(session.decode(backend, id, prompt[position]).map_err(err)?);
        routes.record(routing.fusions, &session);
        at = position + 1;
    }
    session.end_sequence(id).map_err(err)?;
    Ok(logits)
}

/// The positions `prefill_chunks` decodes for a prompt of `len` tokens in chunks of `k`:
/// every `k + 1`-th, and the last.
pub(super) fn prefill_positions(len: usize, k: usize) -> Vec<usize> {
    let mut positions: Vec<usize> = (k..len).step_by(k + 1).collect();
    if len > 0 && positions.last() != Some(&(len - 1)) {
        positions.push(len - 1);
    }
    positions
}
