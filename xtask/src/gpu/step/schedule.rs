//! `gpu-step`'s run: the model, the exec, the schedule of steps, and the checks `--compare`
//! and `--cpu-twin` make over it.

use std::path::{Path, PathBuf};
use std::time::Instant;

use solder_circuit::{Mode, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::{DevicePtr, GpuBackend};
use solder_model_layers::{
    greedy, Boot, CapturedGraph, CircuitExec, KvShape, SeqId, Session, SessionError, WeightSource,
};

use super::same_bytes;
use crate::args::Args;
use crate::gpu::BackendKind;

/// Positions a sequence takes after the decode steps: six multi-seq steps, then a pipeline's
/// six (four returned, two queued ahead).
const AFTER_DECODE: usize = 12;

/// What one run of the schedule does.
#[derive(Clone, Copy)]
struct Schedule {
    context: usize,
    steps: usize,
    width: usize,
    compare: bool,
    /// Graph replays of each compared step, each from the same state, each compared.
    replays: usize,
    profile: bool,
    device: BackendKind,
}

/// Every logits vector of one run of the schedule, by stage.
type Trace = Vec<(String, Vec<f32>)>;

pub fn run(args: &Args) -> Result<(), String> {
    // Positions travel as i32 in the metadata; the model's own limit is checked below.
    let context = args
        .number_in("context", 1..=crate::gpu::MAX_CONTEXT)?
        .unwrap_or(3);
    let steps = args.number_in("steps", 1..=4096)?.unwrap_or(1);
    let width = width_of(args)?;
    let replays = args.number_in("replays", 1..=1_000_000)?.unwrap_or(1);
    // The prefill, the decode steps, six multi-seq steps (two compared, then one greedy on the
    // device, then three greedy steps enqueued ahead), then a pipeline's six (four returned,
    // two queued).
    let tokens = context + steps + AFTER_DECODE;
    let (name, config, weights) = model(args, tokens)?;
    check_positions(&name, &config, context, steps)?;
    let rules = RuleSet::from_file(&super::rules_path(args)).map_err(|e| e.to_string())?;
    let kind = BackendKind::parse(Some(args.value("backend").unwrap_or("cuda")))?;
    let schedule = Schedule {
        context,
        steps,
        width,
        compare: args.flag("compare") || args.value("replays").is_some(),
        replays,
        profile: args.flag("profile"),
        device: kind,
    };
    let policy = Policy {
        levers: args.levers()?,
        ..Policy::default()
    };
    let started = Instant::now();
    let mut cpu = None;
    let mut device = crate::gpu::device_backend(kind)?;
    let backend: &mut dyn GpuBackend = match device.as_deref_mut() {
        Some(device) => device,
        None => cpu.insert(cpu_backend()?),
    };
    println!("{}", crate::gpu::describe(&backend.facts()));
    let boot = || Boot {
        config: config.clone(),
        serve: ServeShape::with_max_batch(width).expect("a ladder width is a valid batch"),
        rules: rules.clone(),
        policy: policy.clone(),
        weights: weights.source(),
        kv: KvShape {
            pages: 2 * tokens.div_ceil(16) + 2 * width + 2,
            block_size: 16,
            max_seq_len: tokens.next_multiple_of(16),
            max_sequences: width + 1,
        },
        precision: Default::default(),
    };
    let mut exec = CircuitExec::build(backend, boot()).map_err(|e| format!("{name}: {e}"))?;
    println!(
        "built {name} ({} programs) in {:.2} s",
        exec.programs().len(),
        started.elapsed().as_secs_f64()
    );
    let first = run_schedule(&name, &mut exec, backend, schedule);
    let second = match (&first, schedule.compare) {
        (Ok(_), true) => {
            let again = Schedule {
                compare: false,
                replays: 1,
                profile: false,
                ..schedule
            };
            Some(run_schedule(&name, &mut exec, backend, again))
        }
        _ => None,
    };
    exec.free(backend).map_err(|e| e.to_string())?;
    let first = first?;
    let checksum: f64 = first
        .iter()
        .flat_map(|(_, l)| l.iter())
        .map(|&v| v as f64)
        .sum();
    check_second_run(&name, &first, second)?;
    if args.flag("cpu-twin") {
        cpu_twin(&name, &first, boot(), schedule)?;
    }
    println!(
        "gpu-step {name}: ok, context {context}, logits checksum {checksum:.6e}, {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--width`: a width of the multi-seq ladder, 4 or more (default 4).
fn width_of(args: &Args) -> Result<usize, String> {
    // A width of the ladder, 4 or more: W - 1 live rows must pad to W (one live row would
    // run the decode program, and 3 rows pad to 4).
    let width = args.number_in("width", 4..=128)?.unwrap_or(4);
    let ladder = ServeShape::default().multi_seq_ladder;
    if !ladder.contains(&width) {
        return Err(format!(
            "`--width {width}`: not a width of the multi-seq ladder {ladder:?}"
        ));
    }
    Ok(width)
}

/// With `--compare`, the second identical run's logits equal the first's byte for byte.
fn check_second_run(
    name: &str,
    first: &Trace,
    second: Option<Result<Trace, String>>,
) -> Result<(), String> {
    let Some(second) = second else {
        return Ok(());
    };
    let second = second?;
    for ((stage, a), (_, b)) in first.iter().zip(&second) {
        same_bytes(a, b).map_err(|e| format!("{name}: {stage}: the second run: {e}"))?;
    }
    println!(
        "second identical run: all {} logits vectors equal byte for byte",
        first.len()
    );
    Ok(())
}

/// Refuses a schedule whose positions pass the model's `max_position_embeddings`, naming it.
pub(super) fn check_positions(
    name: &str,
    config: &ModelConfig,
    context: usize,
    steps: usize,
) -> Result<(), String> {
    let tokens = context + steps + AFTER_DECODE;
    if tokens > config.max_position_embeddings {
        return Err(format!(
            "`--context {context} --steps {steps}`: {tokens} positions (the prefill, the \
             decode steps and {AFTER_DECODE} steps after them), more than {name}'s \
             max_position_embeddings {}",
            config.max_position_embeddings
        ));
    }
    Ok(())
}

fn cpu_backend() -> Result<solder_gpu_runtime::CpuBackend, String> {
    solder_model_layers::kernels::cpu_backend(None).map_err(|e| e.to_string())
}

/// Where the weights come from, for each exec built (a `WeightSource` is consumed).
enum Weights {
    Checkpoint(PathBuf),
    Random(u64),
}

impl Weights {
    fn source(&self) -> WeightSource {
        match self {
            Weights::Checkpoint(dir) => WeightSource::Checkpoint(dir.clone()),
            Weights::Random(seed) => WeightSource::Random { seed: *seed },
        }
    }
}

/// The model's name, config and weights; a built-in's positions raised to `tokens`.
fn model(args: &Args, tokens: usize) -> Result<(String, ModelConfig, Weights), String> {
    let given = (
        args.value("model"),
        args.value("builtin"),
        args.value("synth"),
    );
    match given {
        (Some(dir), None, None) => {
            let config = crate::files::model_config(&Path::new(dir).join("config.json"))?;
            Ok((dir.into(), config, Weights::Checkpoint(dir.into())))
        }
        (None, None, Some(synth)) => {
            let path =
                crate::paths::workspace_root().join(format!("tests/fixtures/configs/{synth}.json"));
            let config = crate::files::model_config(&path)?;
            Ok((synth.into(), config, Weights::Random(1)))
        }
        (None, builtin, None) => {
            let name = builtin.unwrap_or("tiny-llama");
            let builtin = crate::parity::builtin_named(name)?;
            let mut config = builtin.config()?;
            // Random weights know no trained length; rope's tables do not depend on it.
            config.max_position_embeddings = config.max_position_embeddings.max(tokens);
            Ok((name.into(), config, Weights::Random(builtin.seed)))
        }
        _ => Err("give one of --model, --builtin, --synth".into()),
    }
}

/// The profiler range `ncu --profile-from-start off` records (CUDA only).
fn profiling(schedule: Schedule, on: bool) -> Result<(), String> {
    if !schedule.profile || schedule.device != BackendKind::Cuda {
        return Ok(());
    }
    #[cfg(feature = "cuda")]
    {
        solder_gpu_runtime::cuda::set_profiling(on).map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = on;
        crate::gpu::needs_cuda("--profile")
    }
}

/// Prefill, decode steps, a multi-seq step; the graphs and copies `--compare` needs.
fn run_schedule(
    name: &str,
    exec: &mut CircuitExec,
    backend: &mut dyn GpuBackend,
    schedule: Schedule,
) -> Result<Trace, String> {
    let graphs = if schedule.compare {
        let decode = exec
            .capture(backend, Mode::Decode, 1)
            .map_err(|e| format!("{name}: capture decode: {e}"))?;
        match exec.capture(backend, Mode::MultiSeq, schedule.width) {
            Ok(multi) => Some((decode, multi)),
            Err(e) => {
                let _ = exec.release(backend, decode);
                return Err(format!("{name}: capture multi_seq:{}: {e}", schedule.width));
            }
        }
    } else {
        None
    };
    let snapshot = match graphs {
        Some(_) => Some(
            backend
                .alloc(exec.layout.state_bytes.max(1))
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };
    let trace = steps(name, exec, backend, schedule, graphs.as_ref().zip(snapshot));
    if let Some(snapshot) = snapshot {
        backend.free(snapshot).map_err(|e| e.to_string())?;
    }
    if let Some((decode, multi)) = graphs {
        exec.release(backend, decode).map_err(|e| e.to_string())?;
        exec.release(backend, multi).map_err(|e| e.to_string())?;
    }
    trace
}

fn steps(
    name: &str,
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    schedule: Schedule,
    compare: Option<(&(CapturedGraph, CapturedGraph), DevicePtr)>,
) -> Result<Trace, String> {
    let vocab = exec.config.vocab_size;
    let err = |e: SessionError| format!("{name}: {e}");
    let mut trace = Trace::new();
    let mut record = |stage: String, logits: Vec<f32>| -> Result<u32, String> {
        if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
            return Err(format!("{name}: {stage}: logit {i} is {}", logits[i]));
        }
        let next = greedy(&logits[logits.len() - vocab..]);
        println!("{stage}: ok");
        trace.push((stage, logits));
        Ok(next)
    };
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let prompt: Vec<u32> = (0..schedule.context as u32)
        .map(|i| (i * 31 + 7) % vocab as u32)
        .collect();
    let logits = session.prefill(backend, id, &prompt).map_err(err)?;
    let mut token = record(format!("prefill of {} tokens", prompt.len()), logits)?;
    for step in 0..schedule.steps {
        let last = step + 1 == schedule.steps;
        if let (true, Some((_, snapshot))) = (last, compare) {
            save(exec, backend, snapshot, true)?;
        }
        if last {
            profiling(schedule, true)?;
        }
        let logits = session.decode(backend, id, token).map_err(err);
        if last {
            profiling(schedule, false)?;
        }
        let logits = logits?;
        if let (true, Some(((decode, _), snapshot))) = (last, compare) {
            again(
                exec,
                backend,
                snapshot,
                decode,
                &logits,
                name,
                schedule.replays,
            )?;
        }
        token = record(format!("decode step {step}"), logits)?;
    }
    // The prefilled sequence and width - 2 fresh ones: one padding row. Two steps: the first
    // lends the fresh sequences their pages and state slots, so that the second (compared,
    // profiled) runs from a state a snapshot can hold.
    let mut batch = vec![(id, token)];
    for i in 1..schedule.width - 1 {
        batch.push((session.add_sequence(), i as u32 % vocab as u32));
    }
    for step in 0..2 {
        let last = step == 1;
        if let (true, Some((_, snapshot))) = (last, compare) {
            save(exec, backend, snapshot, true)?;
        }
        if last {
            profiling(schedule, true)?;
        }
        let logits = session.multi_seq_step(backend, &batch).map_err(err);
        if last {
            profiling(schedule, false)?;
        }
        let logits = logits?.concat();
        if let (true, Some(((_, multi), snapshot))) = (last, compare) {
            again(
                exec,
                backend,
                snapshot,
                multi,
                &logits,
                name,
                schedule.replays,
            )?;
        }
        let stage = format!(
            "multi_seq step {step} ({} live rows of {})",
            batch.len(),
            schedule.width
        );
        let next = record(stage, logits)?;
        batch[0].1 = next;
    }
    // A third step, every sequence greedy: `next_tokens` takes the tokens on the device
    // (`pick::argmax`) and reads back only them; they must be the host's arg-max of the
    // logits the step left in the workspace.
    let ids = session.next_tokens(backend, &batch).map_err(err)?;
    let logits = read_logits(exec, backend, batch.len() * vocab)?;
    let host: Vec<u32> = logits.chunks(vocab).map(greedy).collect();
    if ids != host {
        return Err(format!(
            "{name}: next_tokens' device tokens {ids:?} are not the host's arg-max {host:?}"
        ));
    }
    println!(
        "greedy step ({} live rows of {}): the device's tokens are the host's arg-max",
        batch.len(),
        schedule.width
    );
    // Three greedy steps enqueued ahead, each fed the one before's tokens on the device: the
    // last step's tokens are the host's arg-max of the logits it left, and each step's fed
    // tokens (as the session now holds them) are the step before's.
    for (slot, id) in batch.iter_mut().zip(&ids) {
        slot.1 = *id;
    }
    let ahead = session.next_tokens_ahead(backend, &batch, 3).map_err(err)?;
    let logits = read_logits(exec, backend, batch.len() * vocab)?;
    for ((row, (id, _)), tokens) in logits.chunks(vocab).zip(&batch).zip(&ahead) {
        let held = session.tokens(*id).map_err(err)?;
        let fed = &held[held.len() - 3..];
        if tokens[2] != greedy(row) || fed[1..] != tokens[..2] {
            return Err(format!(
                "{name}: steps ahead: tokens {tokens:?}, fed {fed:?}, host arg-max {}",
                greedy(row)
            ));
        }
    }
    let how = match session.recurrent() {
        true => "one by one (recurrent state)",
        false => "fed on the device",
    };
    println!("3 greedy steps ahead, {how}: the last the host's arg-max");
    if !session.recurrent() {
        pipeline_matches_ahead(&mut session, backend, name, &batch, &ahead)?;
    }
    Ok(trace)
}

/// Four greedy steps through a pipeline (2 queued ahead, each step's ids copied back on the
/// pipeline's own stream), then the same four from the same point by `next_tokens_ahead`: the
/// tokens must agree, and a stop must leave each sequence at the tokens returned.
fn pipeline_matches_ahead(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    name: &str,
    batch: &[(SeqId, u32)],
    ahead: &[Vec<u32>],
) -> Result<(), String> {
    let err = |e: SessionError| format!("{name}: pipeline: {e}");
    let feed: Vec<(SeqId, u32)> = batch
        .iter()
        .zip(ahead)
        .map(|(&(id, _), tokens)| (id, tokens[2]))
        .collect();
    let lens = feed
        .iter()
        .map(|&(id, _)| session.seq_len(id))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    session.start_pipeline(backend, &feed, 2).map_err(err)?;
    let mut piped = vec![Vec::new(); feed.len()];
    for _ in 0..4 {
        let next = session.pipeline_next(backend).map_err(err)?;
        for (row, token) in piped.iter_mut().zip(next) {
            row.push(token);
        }
    }
    session.stop_pipeline(backend).map_err(err)?;
    for (&(id, _), &len) in feed.iter().zip(&lens) {
        if session.seq_len(id).map_err(err)? != len + 4 {
            return Err(format!(
                "{name}: pipeline: sequence {id} not at the 4 steps returned"
            ));
        }
        session.truncate_to(id, len).map_err(err)?;
    }
    let again = session.next_tokens_ahead(backend, &feed, 4).map_err(err)?;
    if piped != again {
        return Err(format!(
            "{name}: pipeline tokens {piped:?}, next_tokens_ahead's {again:?}"
        ));
    }
    println!("4 greedy steps through a pipeline (2 ahead): next_tokens_ahead's tokens");
    Ok(())
}

/// Copies the state allocation into `snapshot` (or back from it).
fn save(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    snapshot: DevicePtr,
    into_snapshot: bool,
) -> Result<(), String> {
    let bytes = exec.layout.state_bytes;
    if bytes == 0 {
        return Ok(());
    }
    let result = if into_snapshot {
        backend.copy_d2d(snapshot, exec.kv_cache(), bytes)
    } else {
        backend.copy_d2d(exec.kv_cache(), snapshot, bytes)
    };
    result.map_err(|e| format!("state snapshot: {e}"))
}

/// The step the session just ran, from the state before it: eagerly, then as `graph`'s
/// replay, `replays` times (each from the same state); each one's logits must be `session`'s
/// bytes, the first difference failing with its replay's index. Leaves the state as the step
/// left it.
fn again(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    snapshot: DevicePtr,
    graph: &CapturedGraph,
    session: &[f32],
    name: &str,
    replays: usize,
) -> Result<(), String> {
    let program = exec
        .program(graph.mode, graph.rows)
        .map_err(|e| e.to_string())?;
    let stage = format!("{}:{}", graph.mode, graph.rows);
    save(exec, backend, snapshot, false)?;
    exec.run(backend, program).map_err(|e| e.to_string())?;
    let eager = read_logits(exec, backend, session.len())?;
    same_bytes(session, &eager).map_err(|e| format!("{name}: {stage} eager again: {e}"))?;
    for replay in 0..replays {
        save(exec, backend, snapshot, false)?;
        exec.replay(backend, graph).map_err(|e| e.to_string())?;
        backend.synchronize().map_err(|e| e.to_string())?;
        let replayed = read_logits(exec, backend, session.len())?;
        same_bytes(session, &replayed)
            .map_err(|e| format!("{name}: {stage} graph replay {replay} (of {replays}): {e}"))?;
    }
    let replayed = if replays == 1 {
        "graph replay".to_string()
    } else {
        format!("{replays} graph replays")
    };
    println!(
        "{stage}: eager run and {replayed} from the same state equal the session's {} logits byte for byte",
        session.len()
    );
    Ok(())
}

/// The first `count` logits of the workspace.
fn read_logits(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    count: usize,
) -> Result<Vec<f32>, String> {
    let mut raw = vec![0u8; count * 4];
    backend
        .copy_d2h(exec.workspace().offset(exec.layout.logits_offset), &mut raw)
        .map_err(|e| format!("logits: {e}"))?;
    Ok(raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

/// The schedule again on the CPU backend; each stage within `cross::TOLERANCE`. Run with
/// `--backend cpu` it compares the CPU backend with itself, which says nothing of a device:
/// a smoke test of this path, said so in its line (and held to byte identity, since a second
/// exec on a second CPU backend must give the same bytes).
fn cpu_twin(name: &str, device: &Trace, boot: Boot, schedule: Schedule) -> Result<(), String> {
    let smoke = schedule.device == BackendKind::Cpu;
    let started = Instant::now();
    let mut cpu = cpu_backend()?;
    let mut exec = CircuitExec::build(&mut cpu, boot).map_err(|e| format!("{name} (cpu): {e}"))?;
    let plain = Schedule {
        compare: false,
        replays: 1,
        profile: false,
        device: BackendKind::Cpu,
        ..schedule
    };
    let twin = run_schedule(name, &mut exec, &mut cpu, plain);
    exec.free(&mut cpu).map_err(|e| e.to_string())?;
    let twin = twin?;
    if smoke {
        for ((stage, d), (_, c)) in device.iter().zip(&twin) {
            same_bytes(d, c).map_err(|e| format!("{name}: {stage}: cpu against cpu: {e}"))?;
        }
        println!(
            "cpu twin smoke test (--backend cpu: the CPU backend against itself, no device ran, \
             so no device check): {} stages equal byte for byte, {:.1} s",
            twin.len(),
            started.elapsed().as_secs_f64()
        );
        return Ok(());
    }
    let mut worst = 0.0f32;
    for ((stage, d), (_, c)) in device.iter().zip(&twin) {
        let (max_abs, magnitude, relative) = crate::gpu::cross::distance(d, c);
        worst = worst.max(relative);
        // NaN is infinitely far (`distance`), so this also refuses a NaN.
        if relative.is_nan() || relative > crate::gpu::cross::TOLERANCE {
            return Err(format!(
                "{name}: {stage}: max |device - cpu| {max_abs:.3e} = {relative:.3e} of max |cpu| \
                 {magnitude:.3e}, over {:e}",
                crate::gpu::cross::TOLERANCE
            ));
        }
    }
    println!(
        "cpu twin: {} stages, worst max |device - cpu| / max |cpu| {worst:.3e} (<= {:e}), {:.1} s",
        twin.len(),
        crate::gpu::cross::TOLERANCE,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
