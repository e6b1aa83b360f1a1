//! The timed runs of `gpu-bench`, on any backend (the CPU backend only as a dry run of the
//! harness: its figures mean nothing).

use std::path::{Path, PathBuf};
use std::time::Instant;

use solder_circuit::{Mode, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{
    Boot, CapturedGraph, CircuitExec, KvShape, Program, SeqId, Session, WeightSource,
};

use super::{serving, BenchFigures, LoopFigures, WidthFigures};
use crate::args::Args;
use crate::gpu::median;

/// Untimed runs before each timing (module JIT, caches, clocks).
const WARMUP: usize = 3;
/// Fewest timed runs, whatever `--max-seconds` says.
const MIN_RUNS: usize = 5;
/// Timed copies for the bandwidth.
const COPIES: usize = 8;

struct Limits {
    runs: usize,
    max_seconds: f64,
}

/// The model `--model`, `--synth` or `--builtin` names: its name, config and weights.
pub(super) fn model(args: &Args) -> Result<(String, ModelConfig, WeightSource), String> {
    let root = crate::paths::workspace_root();
    match (
        args.value("model"),
        args.value("synth"),
        args.value("builtin"),
    ) {
        (Some(dir), None, None) => {
            let config = crate::files::model_config(&Path::new(dir).join("config.json"))?;
            Ok((
                dir.to_string(),
                config,
                WeightSource::Checkpoint(dir.into()),
            ))
        }
        (None, None, Some(name)) => {
            let builtin = crate::parity::builtin_named(name)?;
            Ok((
                name.to_string(),
                builtin.config()?,
                WeightSource::Random { seed: builtin.seed },
            ))
        }
        (None, synth, None) => {
            let synth = synth.unwrap_or("llama-3.2-1b");
            let path = root.join(format!("tests/fixtures/configs/{synth}.json"));
            let config = crate::files::model_config(&path)?;
            Ok((synth.to_string(), config, WeightSource::Random { seed: 1 }))
        }
        _ => Err("give one of --model, --synth, --builtin".into()),
    }
}

/// `--widths` (each 1 or a width of `serve`'s ladder), else `default`.
pub(super) fn widths(
    args: &Args,
    serve: &ServeShape,
    default: Vec<usize>,
) -> Result<Vec<usize>, String> {
    let Some(list) = args.value("widths") else {
        return Ok(default);
    };
    list.split(',')
        .map(|w| {
            let w: usize = w
                .trim()
                .parse()
                .map_err(|_| format!("`--widths`: `{w}` is not a number"))?;
            if w == 1 || serve.multi_seq_ladder.contains(&w) {
                Ok(w)
            } else {
                Err(format!(
                    "`--widths`: {w} is neither 1 nor a width of the ladder {:?}",
                    serve.multi_seq_ladder
                ))
            }
        })
        .collect()
}

/// The positions a run of `widths` after `context` tokens needs (and `extra` more: the
/// serving loop's), refused past the model's.
pub(super) fn check_positions(
    name: &str,
    config: &ModelConfig,
    (context, extra): (usize, usize),
    widths: &[usize],
) -> Result<(), String> {
    let positions = context + widths.len() + 2 + extra;
    if positions > config.max_position_embeddings {
        return Err(format!(
            "`--context {context}`: {positions} positions, more than {name}'s \
             max_position_embeddings {}",
            config.max_position_embeddings
        ));
    }
    Ok(())
}

/// Room for `widest` sequences of `context` tokens, one step per width, the warm-up's
/// rewrites and `extra` more tokens (the serving loop's).
pub(super) fn kv_shape((context, extra): (usize, usize), widths: &[usize]) -> KvShape {
    let widest = widths.iter().copied().max().unwrap_or(1);
    let max_seq_len = (context + widths.len() + 2 + extra).next_multiple_of(16);
    KvShape {
        pages: (widest + 1) * (max_seq_len / 16) + 2,
        block_size: 16,
        max_seq_len,
        max_sequences: widest + 1,
    }
}

/// The prompt of sequence `s`: `context` tokens below `vocab`.
pub(super) fn prompt(s: usize, context: usize, vocab: u32) -> Vec<u32> {
    (0..context as u32)
        .map(|i| (i * 7919 + s as u32 * 104_729 + 13) % vocab)
        .collect()
}

pub fn run(args: &Args) -> Result<(), String> {
    let json = json_output(args)?;
    let (name, config, weights) = model(args)?;
    let context = args
        .number_in("context", 0..=crate::gpu::MAX_CONTEXT)?
        .unwrap_or(32);
    let limits = Limits {
        runs: args.number_in("runs", 1..=100_000)?.unwrap_or(100),
        max_seconds: args.real_in("max-seconds", 0.001..=3600.0)?.unwrap_or(2.0),
    };
    let serve = ServeShape::default();
    let ladder = std::iter::once(1)
        .chain(serve.multi_seq_ladder.iter().copied())
        .collect();
    let widths = widths(args, &serve, ladder)?;
    let loop_steps = args.number_in("loop", 1..=4096)?;
    let extra = loop_steps.map_or(0, serving::extra_positions);
    // Before any buffer is allocated: the context must fit the model's positions.
    check_positions(&name, &config, (context, extra), &widths)?;
    let copy_bytes = args.number_in("copy-mib", 1..=16384)?.unwrap_or(1024) << 20;
    let rules = rules(args)?;

    let mut boxed = backend(args)?;
    let backend: &mut dyn GpuBackend = boxed.as_mut();
    let device = crate::gpu::describe(&backend.facts());
    println!("{device}");
    let copy_bytes_per_s = copy_bandwidth(backend, copy_bytes)?;
    println!(
        "device-to-device copy: {:.0} GB/s (bytes read + written, median of {COPIES} copies of {} MiB)",
        copy_bytes_per_s / 1e9,
        copy_bytes >> 20
    );

    let kv = kv_shape((context, extra), &widths);
    let started = Instant::now();
    let mut exec = CircuitExec::build(
        backend,
        Boot {
            config: config.clone(),
            serve,
            rules,
            policy: Policy::default(),
            weights,
            kv,
            precision: Default::default(),
        },
    )
    .map_err(|e| format!("{name}: {e}"))?;
    let build_s = started.elapsed().as_secs_f64();
    let weights_bytes = exec.layout.weights_bytes;
    println!(
        "built {name}: {} programs, {:.1} MB of weights, in {build_s:.1} s",
        exec.programs().len(),
        weights_bytes as f64 / 1e6
    );

    // Every program of the ladder captured first (the session below borrows the exec; a
    // graph reads the metadata region when replayed, not when captured).
    let (graphs, capture_all_ms) = capture_every(&mut exec, backend)?;

    let (rows, loops) = time_ladder(
        &exec,
        backend,
        &graphs,
        (&widths, &limits, loop_steps),
        (&name, context, copy_bytes_per_s),
    )?;
    let graphs_captured = graphs.len();
    for graph in graphs {
        exec.release(backend, graph).map_err(|e| e.to_string())?;
    }
    exec.free(backend).map_err(|e| e.to_string())?;

    let figures = BenchFigures {
        model: name,
        device,
        weights_bytes,
        copy_bytes_per_s,
        context,
        widths: rows,
        loops,
        programs_captured: graphs_captured,
        capture_all_ms,
        build_s,
    };
    if let Some((path, inputs)) = json {
        let text = serde_json::to_string_pretty(&figures.json()).map_err(|e| e.to_string())?;
        crate::files::write_output(&path, text.as_bytes(), &inputs)?;
    }
    print!("{}", figures.table());
    Ok(())
}

/// Captures every program of the ladder (before the session borrows the exec; a graph reads
/// the metadata region when replayed, not when captured): the graphs and the ms it took.
fn capture_every(
    exec: &mut CircuitExec,
    backend: &mut dyn GpuBackend,
) -> Result<(Vec<CapturedGraph>, f64), String> {
    let shapes: Vec<(Mode, usize)> = exec.programs().iter().map(|p| (p.mode, p.rows)).collect();
    let mut graphs = Vec::with_capacity(shapes.len());
    let mut capture_all_ms = 0.0;
    for &(mode, rows) in &shapes {
        let t = Instant::now();
        let graph = exec
            .capture(backend, mode, rows)
            .map_err(|e| format!("capture {mode}:{rows}: {e}"))?;
        capture_all_ms += t.elapsed().as_secs_f64() * 1e3;
        graphs.push(graph);
    }
    println!(
        "captured all {} programs in {capture_all_ms:.1} ms",
        graphs.len()
    );

    Ok((graphs, capture_all_ms))
}

/// One session of `widest` sequences prefilled with `context` tokens, then per width a real
/// step and its program timed eagerly and as a graph replay, with its traffic and floor;
/// then, with `loop_steps`, the serving loop at each width (`serving`).
fn time_ladder(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    graphs: &[CapturedGraph],
    (widths, limits, loop_steps): (&[usize], &Limits, Option<usize>),
    (name, context, copy_bytes_per_s): (&str, usize, f64),
) -> Result<(Vec<WidthFigures>, Vec<LoopFigures>), String> {
    let widest = widths.iter().copied().max().unwrap_or(1);
    let vocab = exec.config.vocab_size as u32;
    let mut rows = Vec::new();
    let mut session = Session::new(exec);
    let seqs: Vec<SeqId> = (0..widest).map(|_| session.add_sequence()).collect();
    let t = Instant::now();
    if context > 0 {
        for (s, &id) in seqs.iter().enumerate() {
            // No logits read: prefill programs, no LM head.
            session
                .prefill_chunk(backend, id, &prompt(s, context, vocab))
                .map_err(|e| format!("{name}: prefill: {e}"))?;
        }
    }
    println!(
        "prefilled {widest} sequences of {context} tokens in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    for (earlier, &width) in widths.iter().enumerate() {
        // A real step leaves this width's metadata in the workspace.
        let batch: Vec<(SeqId, u32)> = seqs[..width].iter().map(|&id| (id, 1 % vocab)).collect();
        let logits = session
            .multi_seq_step(backend, &batch)
            .map_err(|e| format!("{name}: step of {width}: {e}"))?;
        if logits.iter().flatten().any(|v| !v.is_finite()) {
            println!("warning: width {width}: non-finite logits (timing a broken program)");
        }
        let (mode, program) = if width == 1 {
            (Mode::Decode, exec.decode_program())
        } else {
            (Mode::MultiSeq, exec.multi_seq_program(width))
        };
        let program = program.map_err(|e| e.to_string())?;
        let graph = graphs
            .iter()
            .find(|g| g.mode == mode && g.rows == width)
            .ok_or_else(|| format!("no graph of {mode}:{width}"))?;
        let plan = exec
            .plan(mode, width)
            .ok_or_else(|| format!("no plan of {mode}:{width}"))?;
        // The timed runs repeat the step the session just ran: its first sequence holds
        // `context` tokens, one per earlier width's step, and this step's.
        let circuit = exec.instance.circuit_for(mode).map_err(|e| e.to_string())?;
        let traffic = solder_circuit::plan_traffic(circuit, plan, context + earlier);
        let mut row = time_width(exec, backend, program, graph, limits)?;
        row.bytes = traffic.total();
        row.floor_us = traffic.floor_us(copy_bytes_per_s);
        println!(
            "{} {width}: {} launches, {:.2} MB, floor {:.1} us, eager {:.1} us ({} runs), graph {:.1} us ({} replays)",
            row.mode,
            row.launches,
            row.bytes as f64 / 1e6,
            row.floor_us,
            row.eager_us,
            row.eager_runs,
            row.graph_us,
            row.graph_runs
        );
        rows.push(row);
    }
    let loops = match loop_steps {
        Some(steps) => serving::time_loops(&mut session, backend, &seqs, widths, steps)?,
        None => Vec::new(),
    };
    Ok((rows, loops))
}

/// The backend `--backend` names (default cuda), its modules loaded.
pub(super) fn backend(args: &Args) -> Result<Box<dyn GpuBackend>, String> {
    let kind = crate::gpu::BackendKind::parse(Some(args.value("backend").unwrap_or("cuda")))?;
    match crate::gpu::device_backend(kind)? {
        Some(device) => Ok(device),
        None => Ok(Box::new(
            solder_model_layers::kernels::cpu_backend(None).map_err(|e| e.to_string())?,
        )),
    }
}

/// `--rules FILE`, else fusions/FUSIONS.toml.
pub(super) fn rules(args: &Args) -> Result<RuleSet, String> {
    RuleSet::from_file(&rules_path(args)).map_err(|e| e.to_string())
}

fn rules_path(args: &Args) -> PathBuf {
    args.value("rules")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::paths::workspace_root().join("fusions/FUSIONS.toml"))
}

/// `--json PATH`, checked before anything runs: not one of the run's inputs (the rules, the
/// checkpoint's files).
pub(super) fn json_output(args: &Args) -> Result<Option<(PathBuf, crate::files::Inputs)>, String> {
    let Some(path) = args.value("json") else {
        return Ok(None);
    };
    let mut inputs = crate::files::Inputs::default();
    inputs.add(&rules_path(args));
    if let Some(dir) = args.value("model") {
        inputs.add_checkpoint(Path::new(dir));
    }
    let path = PathBuf::from(path);
    inputs.check_output(&path)?;
    Ok(Some((path, inputs)))
}

/// Median bytes read + written per second of a device-to-device copy of `bytes`.
pub(super) fn copy_bandwidth(backend: &mut dyn GpuBackend, bytes: usize) -> Result<f64, String> {
    let err = |e: solder_gpu_runtime::GpuError| format!("copy bandwidth: {e}");
    let src = backend.alloc(bytes).map_err(err)?;
    let dst = backend.alloc(bytes).map_err(err)?;
    // Not zeros: a copy must not get to skip work on a pattern.
    backend.memset(src, 0x5a, bytes).map_err(err)?;
    let mut seconds = Vec::with_capacity(COPIES);
    for i in 0..WARMUP + COPIES {
        backend.synchronize().map_err(err)?;
        let t = Instant::now();
        // Synchronous: returns once the copy has completed.
        backend.copy_d2d(dst, src, bytes).map_err(err)?;
        if i >= WARMUP {
            seconds.push(t.elapsed().as_secs_f64());
        }
    }
    backend.free(src).map_err(err)?;
    backend.free(dst).map_err(err)?;
    Ok(2.0 * bytes as f64 / median(&mut seconds))
}

/// Eager runs, then replays of its graph, of `program` over the metadata already uploaded.
fn time_width(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    program: &Program,
    graph: &CapturedGraph,
    limits: &Limits,
) -> Result<WidthFigures, String> {
    let (mode, width) = (program.mode, program.rows);
    let err = |e: &dyn std::fmt::Display| format!("{mode}:{width}: {e}");
    let mut eager = timed(backend, limits, |backend| {
        exec.run(backend, program).map_err(|e| err(&e))
    })?;
    let mut replays = timed(backend, limits, |backend| {
        exec.replay(backend, graph).map_err(|e| err(&e))
    })?;
    Ok(WidthFigures {
        mode: if mode == Mode::Decode {
            "decode"
        } else {
            "multi_seq"
        },
        rows: width,
        launches: program.launches(),
        bytes: 0,
        floor_us: 0.0,
        eager_runs: eager.len(),
        eager_us: median(&mut eager) * 1e6,
        graph_runs: replays.len(),
        graph_us: median(&mut replays) * 1e6,
    })
}

/// Seconds of each timed call of `step` (each followed by a synchronize), after a warm-up.
fn timed(
    backend: &mut dyn GpuBackend,
    limits: &Limits,
    mut step: impl FnMut(&mut dyn GpuBackend) -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let sync = |backend: &mut dyn GpuBackend| backend.synchronize().map_err(|e| e.to_string());
    for _ in 0..WARMUP {
        step(backend)?;
    }
    sync(backend)?;
    let started = Instant::now();
    let mut seconds = Vec::with_capacity(limits.runs);
    while seconds.len() < limits.runs
        && (seconds.len() < MIN_RUNS || started.elapsed().as_secs_f64() < limits.max_seconds)
    {
        let t = Instant::now();
        step(backend)?;
        sync(backend)?;
        seconds.push(t.elapsed().as_secs_f64());
    }
    Ok(seconds)
}
