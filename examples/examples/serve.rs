//! Serve: continuous batching over a queue of prompts, as an engine's scheduler loop runs it.
//!
//!     cargo run --release -p solder-examples --example serve -- [CHECKPOINT]
//!         [--prompts FILE] [--requests N] [--max-tokens N] [--concurrency N] [--chunk N]
//!         [--pages N | --kv-bytes B] [--levers LIST] [--no-check] [--cuda]
//!
//! Every step: requests join when the pool has pages for their first prompt chunk (first
//! come, first served), prompt chunks up to `--chunk` tokens in all are prefilled, every decoding request gets one token
//! in a single multi-sequence step (a lone chunk that is not its prompt's last shares that step,
//! `Session::mixed_step`, when a batched-verify width holds them all), finished requests leave and give their pages back; when
//! a decode step needs more pages than are free, the newest request is preempted and later
//! recomputed (the policy is `solder_examples::scheduler`, vLLM's). `--prompts FILE` reads
//! one prompt per line: text when the checkpoint has a `tokenizer.json`, else token ids
//! separated by spaces; without it, `--requests` prompts of 4 to 32 ids are made up. By
//! default the pool holds half of what `--concurrency` requests at full length need, so
//! preemption happens; `--pages` sets it in pages, `--kv-bytes` as a byte budget
//! (`Boot::with_kv_budget`, the pages that fit at the model's bytes per page). `--levers`
//! turns on build levers (`solder_config::KNOWN_LEVERS`), comma-separated: on a GPU,
//! `--cuda --levers tensor_cores,mma_large` runs the projections of prompt chunks and wide
//! decode steps as tensor-core GEMMs (128-row tiles from 128 rows where the grid fills the
//! device). It prints throughput; the check: every request's tokens equal the same prompt
//! decoded alone (with the levers too: a sequence's bytes do not depend on the step's width),
//! and every page is back at the end.

use std::path::{Path, PathBuf};
use std::time::Instant;

use solder_config::{Levers, ServeShape};
use solder_examples::scheduler::{Plan, Request, Scheduler};
use solder_examples::{backend, boot, check, greedy_reference, kv_shape, prompt};
use solder_examples::{tiny_llama_json, write_tiny, Result};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{CircuitExec, KvBudget, SeqId, Session, SessionError};

const USAGE: &str = "serve [CHECKPOINT] [--prompts FILE] [--requests N] [--max-tokens N] \
                     [--concurrency N] [--chunk N] [--pages N | --kv-bytes B] [--levers LIST] \
                     [--no-check] [--cuda]";

struct Options {
    checkpoint: Option<PathBuf>,
    prompts: Option<PathBuf>,
    requests: usize,
    max_tokens: usize,
    concurrency: usize,
    chunk: usize,
    pages: Option<usize>,
    kv_bytes: Option<usize>,
    levers: Levers,
    check: bool,
    cuda: bool,
}

fn main() -> Result<()> {
    let options = parse()?;
    let tiny = match &options.checkpoint {
        Some(_) => None,
        None => Some(write_tiny("tiny-llama", &tiny_llama_json(2), 7)?),
    };
    let dir = options
        .checkpoint
        .as_deref()
        .unwrap_or_else(|| &tiny.as_ref().unwrap().0);
    let mut backend = backend(options.cuda)?;
    let backend = &mut *backend;
    // The build's inputs first (the config read once); the KV shape once the prompts are known.
    let serve = ServeShape::with_max_batch(options.concurrency)?;
    let mut boot = boot(dir, serve, kv_shape(options.concurrency, 1))?;
    // Levers are part of the build's policy: each one changes which kernels the programs launch
    // (and, for a `differs` one such as `tensor_cores`, their numerics), never the API.
    boot.policy.levers = options.levers.clone();
    let vocab = boot.config.vocab_size;
    let prompts = match &options.prompts {
        Some(file) => read_prompts(file, dir, vocab)?,
        None => (0..options.requests)
            .map(|i| prompt(i as u32, 4 + (i * 7) % 29, vocab))
            .collect(),
    };

    // The KV pool: half of what every running request at full length needs, or `--pages`.
    let longest = prompts.iter().map(Vec::len).max().ok_or("no prompts")?;
    let max_len = longest + options.max_tokens + 1;
    let mut kv = kv_shape(options.concurrency, max_len);
    let per_request = max_len.div_ceil(kv.block_size);
    kv.pages = 1 + options.pages.unwrap_or(
        (options.concurrency * per_request)
            .div_ceil(2)
            .max(per_request),
    );
    boot.kv = kv;
    if let Some(bytes) = options.kv_bytes {
        boot = boot.with_kv_budget(KvBudget::Bytes(bytes), backend)?;
    }
    let kv = boot.kv;
    let exec = CircuitExec::build(backend, boot)?;

    let mut scheduler = Scheduler::new(
        exec.layout.kv_block_size,
        options.chunk,
        options.concurrency,
        kv.pages - 1,
    );
    for p in &prompts {
        scheduler.submit(Request {
            prompt: p.clone(),
            max_tokens: options.max_tokens,
        })?;
    }
    let mut session = Session::new(&exec);
    let free_at_start = session.free_page_count();
    let mut seqs: Vec<Option<SeqId>> = vec![None; prompts.len()];
    let mut totals = Totals::default();
    let started = Instant::now();
    while !scheduler.finished() {
        let plan = scheduler.plan(session.free_page_count())?;
        if plan.is_empty() {
            return Err(format!("step {}: nothing can run", totals.steps).into());
        }
        let mixed = run(backend, &mut session, &mut scheduler, &mut seqs, &plan)?;
        totals.count(&plan);
        totals.mixed += usize::from(mixed);
        // Finished requests leave; their pages go back to the pool.
        for (req, seq) in seqs.iter_mut().enumerate() {
            if scheduler.done(req) {
                if let Some(seq) = seq.take() {
                    session.end_sequence(seq)?;
                }
            }
        }
    }
    let took = started.elapsed().as_secs_f64();
    let generated = prompts.len() * options.max_tokens;
    let levers: Vec<&str> = options.levers.enabled().collect();
    println!(
        "{} requests, concurrency {}, pool {} pages, levers [{}]: {generated} tokens in \
         {:.2} s, {:.1} tokens/s ({} steps, mean decode width {:.1}, {} prefill chunks ({} \
         beside decode rows), {} preemptions)",
        prompts.len(),
        options.concurrency,
        kv.pages - 1,
        levers.join(","),
        took,
        generated as f64 / took,
        totals.steps,
        totals.decode_rows as f64 / totals.decode_steps.max(1) as f64,
        totals.chunks,
        totals.mixed,
        totals.preemptions,
    );
    check(
        session.free_page_count() == free_at_start,
        "every page is back in the pool",
    )?;
    if options.check {
        // Each request alone, in a fresh session: the same tokens, preempted or not.
        for (req, p) in prompts.iter().enumerate() {
            let alone = greedy_reference(backend, &exec, p, options.max_tokens - 1)?;
            if scheduler.output(req) != alone {
                return Err(format!(
                    "check FAILED: request {req} (preempted {} times) gave {:?}, alone {alone:?}",
                    scheduler.preemptions(req),
                    scheduler.output(req)
                )
                .into());
            }
        }
        check(true, "every request's tokens equal its solo decode")?;
        let default_pool = options.pages.is_none() && options.kv_bytes.is_none();
        if default_pool && options.concurrency > 1 && prompts.len() > 1 {
            check(
                totals.preemptions > 0,
                "the default half-size pool preempted",
            )?;
        }
    }
    Ok(())
}

/// Runs one planned step on the session and reports what each request now holds; true when
/// its prompt chunk shared the decode rows' step (`Session::mixed_step`).
fn run(
    backend: &mut dyn GpuBackend,
    session: &mut Session<'_>,
    scheduler: &mut Scheduler,
    seqs: &mut [Option<SeqId>],
    plan: &Plan,
) -> Result<bool> {
    let seq = |seqs: &[Option<SeqId>], req: usize| -> Result<SeqId> {
        Ok(seqs[req].ok_or(format!("request {req} has no sequence"))?)
    };
    // Preempted requests give their pages back (recomputed when admitted again).
    for &req in &plan.preempted {
        session.end_sequence(seq(seqs, req)?)?;
        seqs[req] = None;
    }
    for &req in &plan.admitted {
        seqs[req] = Some(session.add_sequence());
    }
    let batch = plan
        .decode
        .iter()
        .map(|&(req, token)| Ok((seq(seqs, req)?, token)))
        .collect::<Result<Vec<_>>>()?;
    // A lone prompt chunk that is not its prompt's last shares the decode rows' step (one
    // batched-verify program, vLLM's chunked prefill) when a compiled width holds them all.
    if let ([chunk], false) = (&plan.prefill[..], batch.is_empty()) {
        if !chunk.last {
            let id = seq(seqs, chunk.req)?;
            let tokens = scheduler.tokens(chunk.req)[chunk.from..chunk.to].to_vec();
            match session.mixed_step(backend, &batch, (id, &tokens)) {
                Ok(next) => {
                    scheduler.prefilled(chunk, session.held_pages(id)?, None);
                    decoded(session, scheduler, plan, &batch, next)?;
                    return Ok(true);
                }
                // Too many rows for one program: one step after the other, below.
                Err(SessionError::TooWide { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    for chunk in &plan.prefill {
        let id = seq(seqs, chunk.req)?;
        let tokens = scheduler.tokens(chunk.req)[chunk.from..chunk.to].to_vec();
        let next = if chunk.last {
            Some(session.prefill_next(backend, id, &tokens)?)
        } else {
            session.prefill_chunk(backend, id, &tokens)?;
            None
        };
        scheduler.prefilled(chunk, session.held_pages(id)?, next);
    }
    if !batch.is_empty() {
        let next = session.next_tokens(backend, &batch)?;
        decoded(session, scheduler, plan, &batch, next)?;
    }
    Ok(false)
}

/// Tells the scheduler each decoding request's new token and the pages it now holds.
fn decoded(
    session: &Session<'_>,
    scheduler: &mut Scheduler,
    plan: &Plan,
    batch: &[(SeqId, u32)],
    next: Vec<u32>,
) -> Result<()> {
    for (&(req, _), (&(id, _), token)) in plan.decode.iter().zip(batch.iter().zip(next)) {
        scheduler.decoded(req, session.held_pages(id)?, token);
    }
    Ok(())
}

/// What the loop did, for the summary line.
#[derive(Default)]
struct Totals {
    steps: usize,
    /// Steps whose prompt chunk ran beside the decode rows.
    mixed: usize,
    decode_steps: usize,
    decode_rows: usize,
    chunks: usize,
    preemptions: usize,
}

impl Totals {
    fn count(&mut self, plan: &Plan) {
        self.steps += 1;
        self.decode_steps += usize::from(!plan.decode.is_empty());
        self.decode_rows += plan.decode.len();
        self.chunks += plan.prefill.len();
        self.preemptions += plan.preempted.len();
    }
}

/// One prompt per non-empty line: text through the checkpoint's tokenizer, or token ids.
fn read_prompts(file: &Path, dir: &Path, vocab: usize) -> Result<Vec<Vec<u32>>> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let tokenizer = match dir.join("tokenizer.json").exists() {
        true => Some(solder_text::Tokenizer::from_dir(dir)?),
        false => None,
    };
    let mut prompts = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let ids = match &tokenizer {
            Some(tokenizer) => tokenizer.encode(line, true)?,
            None => line
                .split_whitespace()
                .map(|id| id.parse::<u32>().ok().filter(|&id| (id as usize) < vocab))
                .collect::<Option<Vec<u32>>>()
                .ok_or(format!(
                    "{} line {}: token ids below {vocab} expected (no tokenizer.json in {})",
                    file.display(),
                    n + 1,
                    dir.display()
                ))?,
        };
        prompts.push(ids);
    }
    Ok(prompts)
}

fn parse() -> Result<Options> {
    let mut options = Options {
        checkpoint: None,
        prompts: None,
        requests: 24,
        max_tokens: 12,
        concurrency: 8,
        chunk: 64,
        pages: None,
        kv_bytes: None,
        levers: Levers::default(),
        check: true,
        cuda: false,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(arg) = argv.next() {
        let mut value = |flag: &str| argv.next().ok_or(format!("{flag} needs a value"));
        let mut number = |flag: &str| -> Result<usize> {
            let v = value(flag)?;
            Ok(v.parse().map_err(|e| format!("{flag} {v}: {e}"))?)
        };
        match arg.as_str() {
            "--prompts" => options.prompts = Some(PathBuf::from(value("--prompts")?)),
            "--requests" => options.requests = number("--requests")?,
            "--max-tokens" => options.max_tokens = number("--max-tokens")?,
            "--concurrency" => options.concurrency = number("--concurrency")?,
            "--chunk" => options.chunk = number("--chunk")?,
            "--pages" => options.pages = Some(number("--pages")?),
            "--kv-bytes" => options.kv_bytes = Some(number("--kv-bytes")?),
            "--levers" => {
                // An unknown name is refused with the list of known ones.
                for name in value("--levers")?.split(',').filter(|n| !n.is_empty()) {
                    options.levers.set(name.trim(), true)?;
                }
            }
            "--no-check" => options.check = false,
            "--cuda" => options.cuda = true,
            "-h" | "--help" => {
                println!("usage: {USAGE}");
                std::process::exit(0);
            }
            flag if flag.starts_with('-') => return Err(format!("unknown flag {flag}").into()),
            path => options.checkpoint = Some(PathBuf::from(path)),
        }
    }
    if options.pages.is_some() && options.kv_bytes.is_some() {
        return Err("--pages and --kv-bytes both size the pool: give one".into());
    }
    for (flag, v) in [
        ("--requests", options.requests),
        ("--max-tokens", options.max_tokens),
        ("--concurrency", options.concurrency),
        ("--chunk", options.chunk),
    ] {
        if v == 0 {
            return Err(format!("{flag} 0: at least 1").into());
        }
    }
    Ok(options)
}
