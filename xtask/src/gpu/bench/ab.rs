//! `gpu-bench --ab LEVER[,LEVER...]`: the same model built once per lever set — none (the
//! baseline), each lever alone, and all of them together — and timed side by side in one run.
//!
//! Per width: one real session step on every variant (it uploads that width's metadata and
//! gives the logits the checks compare), a warm-up, then rounds: in each round every variant
//! runs `runs` eager steps and `runs` graph replays, each synchronized before the clock is
//! read, the variants' order rotated from round to round, so clock and thermal drift falls on
//! all of them alike; the median of all rounds. Then each variant runs once eagerly and
//! replays once more, and its logits are read back: every variant's eager, replayed and
//! session logits must be the same bytes, and a bit-identical variant's (no `differs` rule
//! names any of its levers, so the fuser keeps its bytes) must equal the baseline's, and one
//! whose extra levers over another variant keep bytes that variant's (`Variant::same_as`).
//!
//! Invariants: one set of host weights serves every variant (random ones are generated
//! once); a lever name `KNOWN_LEVERS` lacks is refused by name before anything is built.

use std::time::Instant;

use solder_circuit::rules::Numerics;
use solder_circuit::{Instance, Mode, Policy, RuleSet};
use solder_config::{Levers, ModelConfig, ServeShape};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{
    Boot, CapturedGraph, CircuitExec, HostWeights, KvShape, SeqId, Session, WeightSource,
};

use crate::gpu::median;
pub use table::{AbFigures, AbRow, Bytes};

mod rounds;
mod table;

use rounds::{check_bytes, time_width, Lane, Width};

/// Untimed eager runs and replays per variant before a width's rounds.
const WARMUP: usize = 2;
/// Rounds run whatever `max_seconds` says.
const MIN_ROUNDS: usize = 2;

/// One lever set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// `baseline`, a lever's name, or the levers joined by `+`.
    pub name: String,
    pub levers: Vec<String>,
    /// No `differs` rule names any of its levers: its logits must be the baseline's bytes.
    pub bit_identical: bool,
    /// The variant (an index of the list) whose bytes its logits must be: the baseline when
    /// `bit_identical` (the baseline itself too), else the one with the most of its levers
    /// whose other levers no `differs` rule names (`tensor_cores` for
    /// `tensor_cores+mma_narrow`); none else.
    pub same_as: Option<usize>,
}

/// The variants of `--ab LIST`: the baseline, each item alone, then (with two or more) all of
/// them together, unless one item already holds them all. An item is a lever or levers joined
/// by `+` (`tensor_cores+mma_narrow`: one variant with both). An unknown or empty name, a
/// repeated item or a lever repeated within one is refused, naming it.
pub fn variants(list: &str, rules: &RuleSet) -> Result<Vec<Variant>, String> {
    let mut items: Vec<Vec<String>> = Vec::new();
    for item in list.split(',').map(str::trim) {
        let mut set: Vec<String> = Vec::new();
        for name in item.split('+').map(str::trim) {
            if name.is_empty() {
                return Err(format!("`--ab {list}`: an empty lever name"));
            }
            Levers::default()
                .set(name, true)
                .map_err(|e| format!("`--ab`: {e}"))?;
            if set.iter().any(|l| l == name) {
                return Err(format!("`--ab`: lever `{name}` is named twice in `{item}`"));
            }
            set.push(name.to_string());
        }
        if items.contains(&set) {
            return Err(format!("`--ab`: `{item}` is named twice"));
        }
        items.push(set);
    }
    let variant = |levers: Vec<String>| Variant {
        name: if levers.is_empty() {
            "baseline".to_string()
        } else {
            levers.join("+")
        },
        bit_identical: levers.iter().all(|l| keeps_bytes(rules, l)),
        same_as: None,
        levers,
    };
    let mut all: Vec<String> = Vec::new();
    for lever in items.iter().flatten() {
        if !all.contains(lever) {
            all.push(lever.clone());
        }
    }
    let holds_all = |set: &Vec<String>| all.iter().all(|l| set.contains(l));
    let together = items.len() > 1 && !items.iter().any(holds_all);
    let mut out = vec![variant(Vec::new())];
    out.extend(items.into_iter().map(variant));
    if together {
        out.push(variant(all));
    }
    let sets: Vec<Vec<String>> = out.iter().map(|v| v.levers.clone()).collect();
    for v in out.iter_mut() {
        // A bit-identical variant against the baseline (the baseline against itself); another
        // against the largest set it adds only byte-keeping levers to.
        v.same_as = match v.bit_identical {
            true => Some(0),
            false => (sets.iter().enumerate())
                .filter(|(_, u)| {
                    u.len() < v.levers.len()
                        && u.iter().all(|l| v.levers.contains(l))
                        && (v.levers.iter())
                            .filter(|l| !u.contains(l))
                            .all(|l| keeps_bytes(rules, l))
                })
                .max_by_key(|(i, u)| (u.len(), usize::MAX - i))
                .map(|(i, _)| i),
        };
    }
    Ok(out)
}

/// A lever changes logits only through a `differs` rule naming it (a `when` gate switches
/// between bit-identical rules; `pdl` only reorders launches).
fn keeps_bytes(rules: &RuleSet, lever: &str) -> bool {
    !rules
        .rules
        .iter()
        .any(|r| matches!(&r.numerics, Numerics::Differs { lever: l, .. } if l == lever))
}

/// What `measure` runs.
pub struct Setup {
    pub name: String,
    pub config: ModelConfig,
    pub weights: WeightSource,
    pub rules: RuleSet,
    pub serve: ServeShape,
    pub kv: KvShape,
    pub context: usize,
    pub widths: Vec<usize>,
    /// Rounds per width (at least `MIN_ROUNDS` run, then until `max_seconds`).
    pub rounds: usize,
    /// Timed eager runs and replays per variant per round.
    pub runs: usize,
    /// Stop a width's rounds after this many seconds (once `MIN_ROUNDS` ran).
    pub max_seconds: f64,
    /// Device-to-device copy bandwidth, bytes read + written per second (the floor's rate).
    pub copy_bytes_per_s: f64,
}

/// Builds every variant, times them interleaved and checks their logits bytes. A variant
/// that fails (build, capture, a step, a run) is reported in `AbFigures::failures` and left
/// out from then on, so the others are still measured; the baseline failing is the error.
pub fn measure(
    backend: &mut dyn GpuBackend,
    setup: Setup,
    variants: &[Variant],
) -> Result<AbFigures, String> {
    let Setup {
        name,
        config,
        weights,
        rules,
        serve,
        kv,
        context,
        widths,
        rounds,
        runs,
        max_seconds,
        copy_bytes_per_s,
    } = setup;
    let device = crate::gpu::describe(&backend.facts());
    let mut failed: Vec<Option<String>> = vec![None; variants.len()];
    let shared = SharedWeights::new(weights, &config, &serve)?;
    let boot = |policy: Policy| Boot {
        config: config.clone(),
        serve: serve.clone(),
        rules: rules.clone(),
        policy,
        weights: shared.source(),
        kv,
        precision: Default::default(),
    };
    let mut execs = build_variants(backend, &name, &boot, variants, &mut failed)?;
    drop(shared);
    // Graphs first: the sessions below borrow the execs.
    let graphs = capture_graphs(backend, &mut execs, &widths, variants, &mut failed)?;

    let mut rows = Vec::new();
    {
        let widest = widths.iter().copied().max().unwrap_or(1);
        let vocab = config.vocab_size as u32;
        let mut sessions = prefill_sessions(
            backend,
            &execs,
            (widest, context, vocab),
            variants,
            &mut failed,
        )?;
        println!("prefilled {widest} sequences of {context} tokens on each variant");
        for (earlier, &width) in widths.iter().enumerate() {
            let at = Width {
                width,
                rounds,
                runs,
                max_seconds,
            };
            // The session steps: metadata uploaded, and the logits every check starts from.
            let mut stepped: Vec<Option<Vec<f32>>> = vec![None; variants.len()];
            for (v, lane) in sessions.iter_mut().enumerate() {
                let Some((session, seqs)) = lane.as_mut().filter(|_| failed[v].is_none()) else {
                    continue;
                };
                let batch: Vec<(SeqId, u32)> =
                    seqs[..width].iter().map(|&id| (id, 1 % vocab)).collect();
                match session.multi_seq_step(backend, &batch) {
                    Ok(logits) => stepped[v] = Some(logits.concat()),
                    Err(e) => fail(&mut failed, variants, v, format!("step of {width}: {e}"))?,
                }
            }
            let live: Vec<usize> = (0..variants.len())
                .filter(|&v| failed[v].is_none())
                .collect();
            let lanes: Vec<Lane<'_>> = live
                .iter()
                .map(|&v| Lane {
                    v,
                    exec: execs[v].as_ref().expect("a live variant was built"),
                    graph: &graphs[v][earlier],
                })
                .collect();
            let samples = time_width(backend, &lanes, variants, &at, &mut failed)?;
            for (lane, sample) in lanes.iter().zip(samples) {
                let Some((mut eager, mut replays)) = sample else {
                    continue;
                };
                let (v, exec, variant) = (lane.v, lane.exec, &variants[lane.v]);
                let bytes = match check_bytes(backend, lane, &stepped, variant) {
                    Ok(bytes) => bytes,
                    Err(e) => {
                        fail(&mut failed, variants, v, format!("{width} rows: {e}"))?;
                        continue;
                    }
                };
                let plan = exec.plan(mode_of(width), width).ok_or_else(|| {
                    format!("{}: no plan of {}:{width}", variant.name, mode_of(width))
                })?;
                // The timed runs repeat the session's step: `context` tokens, one per earlier
                // width's step, and this step's.
                let circuit = exec
                    .instance
                    .circuit_for(plan.mode)
                    .map_err(|e| e.to_string())?;
                let traffic = solder_circuit::plan_traffic(circuit, plan, context + earlier);
                rows.push(AbRow {
                    variant: v,
                    rows: width,
                    launches: program(exec, width)?.launches(),
                    floor_us: traffic.floor_us(copy_bytes_per_s),
                    eager_runs: eager.len(),
                    eager_us: median(&mut eager) * 1e6,
                    graph_runs: replays.len(),
                    graph_us: median(&mut replays) * 1e6,
                    bytes,
                });
            }
            println!("timed {} variants at {width} rows", lanes.len());
        }
    }
    release_all(backend, &mut execs, graphs)?;
    Ok(AbFigures {
        model: name,
        device,
        copy_bytes_per_s,
        context,
        variants: variants.to_vec(),
        rows,
        failures: failed
            .into_iter()
            .enumerate()
            .filter_map(|(v, why)| why.map(|why| (v, why)))
            .collect(),
    })
}

/// Builds every variant's exec (`boot` of its policy); a variant that fails to build is
/// marked failed and has none.
fn build_variants(
    backend: &mut dyn GpuBackend,
    name: &str,
    boot: &dyn Fn(Policy) -> Boot,
    variants: &[Variant],
    failed: &mut [Option<String>],
) -> Result<Vec<Option<CircuitExec>>, String> {
    let mut execs: Vec<Option<CircuitExec>> = Vec::with_capacity(variants.len());
    for (v, variant) in variants.iter().enumerate() {
        let mut policy = Policy::default();
        for lever in &variant.levers {
            policy.levers.set(lever, true).map_err(|e| e.to_string())?;
        }
        let t = Instant::now();
        match CircuitExec::build(backend, boot(policy)) {
            Ok(exec) => {
                println!(
                    "built {name} ({}): {} programs in {:.1} s",
                    variant.name,
                    exec.programs().len(),
                    t.elapsed().as_secs_f64()
                );
                execs.push(Some(exec));
            }
            Err(e) => {
                fail(failed, variants, v, format!("build: {e}"))?;
                execs.push(None);
            }
        }
    }
    Ok(execs)
}

/// Each built variant's graph per width (a variant whose capture fails is marked failed and
/// keeps the graphs captured before).
fn capture_graphs(
    backend: &mut dyn GpuBackend,
    execs: &mut [Option<CircuitExec>],
    widths: &[usize],
    variants: &[Variant],
    failed: &mut [Option<String>],
) -> Result<Vec<Vec<CapturedGraph>>, String> {
    let mut graphs: Vec<Vec<CapturedGraph>> = Vec::with_capacity(execs.len());
    for (v, exec) in execs.iter_mut().enumerate() {
        let mut mine = Vec::with_capacity(widths.len());
        if let Some(exec) = exec.as_mut() {
            for &width in widths {
                match exec.capture(backend, mode_of(width), width) {
                    Ok(graph) => mine.push(graph),
                    Err(e) => {
                        let why = format!("capture {}:{width}: {e}", mode_of(width));
                        fail(failed, variants, v, why)?;
                        break;
                    }
                }
            }
        }
        graphs.push(mine);
    }
    Ok(graphs)
}

/// A variant's session and its sequences (none for a failed variant).
type Prefilled<'e> = Option<(Session<'e>, Vec<SeqId>)>;

/// A session per live variant with `widest` sequences, each prefilled with `context` tokens
/// of its own prompt (a variant whose prefill fails is marked failed and has none).
fn prefill_sessions<'e>(
    backend: &mut dyn GpuBackend,
    execs: &'e [Option<CircuitExec>],
    (widest, context, vocab): (usize, usize, u32),
    variants: &[Variant],
    failed: &mut [Option<String>],
) -> Result<Vec<Prefilled<'e>>, String> {
    let mut sessions: Vec<Option<(Session<'_>, Vec<SeqId>)>> = Vec::new();
    for (v, exec) in execs.iter().enumerate() {
        let Some(exec) = exec.as_ref().filter(|_| failed[v].is_none()) else {
            sessions.push(None);
            continue;
        };
        let mut session = Session::new(exec);
        let seqs: Vec<SeqId> = (0..widest).map(|_| session.add_sequence()).collect();
        let prefilled = seqs.iter().enumerate().try_for_each(|(s, &id)| {
            let prompt = super::timing::prompt(s, context, vocab);
            match context {
                0 => Ok(()),
                // No logits read: prefill programs, no LM head.
                _ => session.prefill_chunk(backend, id, &prompt),
            }
        });
        match prefilled {
            Ok(()) => sessions.push(Some((session, seqs))),
            Err(e) => {
                fail(failed, variants, v, format!("prefill: {e}"))?;
                sessions.push(None);
            }
        }
    }
    Ok(sessions)
}

/// Releases every graph and frees every exec; the last failure is the error.
fn release_all(
    backend: &mut dyn GpuBackend,
    execs: &mut [Option<CircuitExec>],
    graphs: Vec<Vec<CapturedGraph>>,
) -> Result<(), String> {
    let mut cleanup = Ok(());
    for (exec, mine) in execs.iter_mut().zip(graphs) {
        let Some(exec) = exec.as_mut() else { continue };
        for graph in mine {
            if let Err(e) = exec.release(backend, graph) {
                cleanup = Err(e.to_string());
            }
        }
        if let Err(e) = exec.free(backend) {
            cleanup = Err(e.to_string());
        }
    }
    cleanup
}

/// Marks variant `v` failed (its first failure is kept); the baseline's failure ends the run.
pub(super) fn fail(
    failed: &mut [Option<String>],
    variants: &[Variant],
    v: usize,
    why: String,
) -> Result<(), String> {
    println!("variant {} failed: {why}", variants[v].name);
    if v == 0 {
        return Err(format!("the baseline failed: {why}"));
    }
    failed[v].get_or_insert(why);
    Ok(())
}

pub(super) fn mode_of(width: usize) -> Mode {
    if width == 1 {
        Mode::Decode
    } else {
        Mode::MultiSeq
    }
}

pub(super) fn program(
    exec: &CircuitExec,
    width: usize,
) -> Result<&solder_model_layers::Program, String> {
    if width == 1 {
        exec.decode_program()
    } else {
        exec.multi_seq_program(width)
    }
    .map_err(|e| e.to_string())
}

/// The weights every variant is built from: random ones generated once and copied per build.
enum SharedWeights {
    Host(HostWeights),
    Checkpoint(std::path::PathBuf),
}

impl SharedWeights {
    fn new(
        weights: WeightSource,
        config: &ModelConfig,
        serve: &ServeShape,
    ) -> Result<SharedWeights, String> {
        Ok(match weights {
            WeightSource::Checkpoint(dir) => SharedWeights::Checkpoint(dir),
            WeightSource::Host(host) => SharedWeights::Host(host),
            WeightSource::Random { seed } => {
                let instance =
                    Instance::from_config(config, serve.clone()).map_err(|e| e.to_string())?;
                SharedWeights::Host(HostWeights::random(instance.storage(), seed))
            }
        })
    }

    fn source(&self) -> WeightSource {
        match self {
            SharedWeights::Host(host) => WeightSource::Host(HostWeights {
                slots: host.slots.clone(),
            }),
            SharedWeights::Checkpoint(dir) => WeightSource::Checkpoint(dir.clone()),
        }
    }
}

#[cfg(test)]
mod tests;
