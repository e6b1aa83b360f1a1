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
//! names any of its levers, so the fuser keeps its bytes) must equal the baseline's.
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

mod table;

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
}

/// The variants of `--ab LIST`: the baseline, each lever alone, then (with two or more) all
/// of them together. An unknown, empty or repeated name is refused, naming it.
pub fn variants(list: &str, rules: &RuleSet) -> Result<Vec<Variant>, String> {
    let mut levers: Vec<String> = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(format!("`--ab {list}`: an empty lever name"));
        }
        Levers::default()
            .set(name, true)
            .map_err(|e| format!("`--ab`: {e}"))?;
        if levers.iter().any(|l| l == name) {
            return Err(format!("`--ab`: lever `{name}` is named twice"));
        }
        levers.push(name.to_string());
    }
    let variant = |levers: Vec<String>| Variant {
        name: if levers.is_empty() {
            "baseline".to_string()
        } else {
            levers.join("+")
        },
        bit_identical: levers.iter().all(|l| keeps_bytes(rules, l)),
        levers,
    };
    let mut out = vec![variant(Vec::new())];
    out.extend(levers.iter().map(|l| variant(vec![l.clone()])));
    if levers.len() > 1 {
        out.push(variant(levers));
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
    let mut execs: Vec<Option<CircuitExec>> = Vec::with_capacity(variants.len());
    for (v, variant) in variants.iter().enumerate() {
        let mut policy = Policy::default();
        for lever in &variant.levers {
            policy.levers.set(lever, true).map_err(|e| e.to_string())?;
        }
        let t = Instant::now();
        let boot = Boot {
            config: config.clone(),
            serve: serve.clone(),
            rules: rules.clone(),
            policy,
            weights: shared.source(),
            kv,
        };
        match CircuitExec::build(backend, boot) {
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
                fail(&mut failed, variants, v, format!("build: {e}"))?;
                execs.push(None);
            }
        }
    }
    drop(shared);
    // Graphs first: the sessions below borrow the execs.
    let mut graphs: Vec<Vec<CapturedGraph>> = Vec::with_capacity(execs.len());
    for (v, exec) in execs.iter_mut().enumerate() {
        let mut mine = Vec::with_capacity(widths.len());
        if let Some(exec) = exec.as_mut() {
            for &width in &widths {
                match exec.capture(backend, mode_of(width), width) {
                    Ok(graph) => mine.push(graph),
                    Err(e) => {
                        let why = format!("capture {}:{width}: {e}", mode_of(width));
                        fail(&mut failed, variants, v, why)?;
                        break;
                    }
                }
            }
        }
        graphs.push(mine);
    }

    let mut rows = Vec::new();
    {
        let widest = widths.iter().copied().max().unwrap_or(1);
        let vocab = config.vocab_size as u32;
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
                    _ => session.prefill(backend, id, &prompt).map(|_| ()),
                }
            });
            match prefilled {
                Ok(()) => sessions.push(Some((session, seqs))),
                Err(e) => {
                    fail(&mut failed, variants, v, format!("prefill: {e}"))?;
                    sessions.push(None);
                }
            }
        }
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
                let traffic =
                    solder_circuit::plan_traffic(&exec.instance.circuit, plan, context + earlier);
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
    cleanup?;
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

/// Marks variant `v` failed (its first failure is kept); the baseline's failure ends the run.
fn fail(
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

/// A live variant at one width: its exec and that width's graph.
struct Lane<'a> {
    v: usize,
    exec: &'a CircuitExec,
    graph: &'a CapturedGraph,
}

/// One width's timing parameters.
struct Width {
    width: usize,
    rounds: usize,
    runs: usize,
    max_seconds: f64,
}

fn mode_of(width: usize) -> Mode {
    if width == 1 {
        Mode::Decode
    } else {
        Mode::MultiSeq
    }
}

fn program(exec: &CircuitExec, width: usize) -> Result<&solder_model_layers::Program, String> {
    if width == 1 {
        exec.decode_program()
    } else {
        exec.multi_seq_program(width)
    }
    .map_err(|e| e.to_string())
}

/// (eager seconds, replay seconds) per lane — a warm-up, then interleaved rounds — or `None`
/// for a lane whose run failed (marked in `failed`).
fn time_width(
    backend: &mut dyn GpuBackend,
    lanes: &[Lane<'_>],
    variants: &[Variant],
    at: &Width,
    failed: &mut [Option<String>],
) -> Result<Vec<Option<(Vec<f64>, Vec<f64>)>>, String> {
    let n = lanes.len();
    let eager = |backend: &mut dyn GpuBackend, lane: &Lane<'_>| -> Result<(), String> {
        let program = program(lane.exec, at.width)?;
        lane.exec.run(backend, program).map_err(|e| e.to_string())
    };
    let replay = |backend: &mut dyn GpuBackend, lane: &Lane<'_>| -> Result<(), String> {
        lane.exec
            .replay(backend, lane.graph)
            .map_err(|e| e.to_string())
    };
    let mut samples: Vec<Option<(Vec<f64>, Vec<f64>)>> = vec![Some((Vec::new(), Vec::new())); n];
    let mut drop_lane = |samples: &mut [Option<_>], i: usize, e: String| {
        samples[i] = None;
        let why = format!("{}:{}: {e}", mode_of(at.width), at.width);
        fail(failed, variants, lanes[i].v, why)
    };
    for i in 0..n {
        let warm = (0..WARMUP).try_for_each(|_| {
            eager(backend, &lanes[i])?;
            replay(backend, &lanes[i])
        });
        if let Err(e) = warm {
            drop_lane(&mut samples, i, e)?;
        }
    }
    let started = Instant::now();
    for round in 0..at.rounds {
        if round >= MIN_ROUNDS && started.elapsed().as_secs_f64() > at.max_seconds {
            break;
        }
        for k in 0..n {
            let i = (k + round) % n;
            if samples[i].is_none() {
                continue;
            }
            let lane = &lanes[i];
            let timed_pair = timed(backend, at.runs, |b| eager(b, lane))
                .and_then(|e| timed(backend, at.runs, |b| replay(b, lane)).map(|r| (e, r)));
            match timed_pair {
                Ok((e, r)) => {
                    if let Some((eager_s, replay_s)) = samples[i].as_mut() {
                        eager_s.extend(e);
                        replay_s.extend(r);
                    }
                }
                Err(e) => drop_lane(&mut samples, i, e)?,
            }
        }
    }
    Ok(samples)
}

/// Seconds of each of `runs` calls of `step`, each followed by a synchronize.
fn timed(
    backend: &mut dyn GpuBackend,
    runs: usize,
    mut step: impl FnMut(&mut dyn GpuBackend) -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let sync = |backend: &mut dyn GpuBackend| backend.synchronize().map_err(|e| e.to_string());
    sync(backend)?;
    let mut seconds = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        step(backend)?;
        sync(backend)?;
        seconds.push(t.elapsed().as_secs_f64());
    }
    Ok(seconds)
}

/// A lane's eager and replayed logits against its session step's, and (bit-identical
/// variants) against the baseline's session step.
fn check_bytes(
    backend: &mut dyn GpuBackend,
    lane: &Lane<'_>,
    stepped: &[Option<Vec<f32>>],
    variant: &Variant,
) -> Result<Bytes, String> {
    let (exec, width) = (lane.exec, lane.graph.rows);
    exec.run(backend, program(exec, width)?)
        .map_err(|e| e.to_string())?;
    let eager_logits = read_logits(backend, exec, width)?;
    exec.replay(backend, lane.graph)
        .map_err(|e| e.to_string())?;
    let replay_logits = read_logits(backend, exec, width)?;
    let own = stepped[lane.v]
        .as_ref()
        .ok_or("no session step to compare with")?;
    for (what, logits) in [("eager", &eager_logits), ("graph replay", &replay_logits)] {
        if let Err(e) = crate::gpu::step::same_bytes(own, logits) {
            return Ok(Bytes::Differ(format!("{what} vs its session step: {e}")));
        }
    }
    if !variant.bit_identical {
        return Ok(Bytes::OwnOnly);
    }
    let baseline = stepped[0]
        .as_ref()
        .ok_or("no baseline step to compare with")?;
    match crate::gpu::step::same_bytes(baseline, own) {
        Ok(()) => Ok(Bytes::Same),
        Err(e) => Ok(Bytes::Differ(format!("vs baseline: {e}"))),
    }
}

/// The first `rows` rows of the exec's logits region.
fn read_logits(
    backend: &mut dyn GpuBackend,
    exec: &CircuitExec,
    rows: usize,
) -> Result<Vec<f32>, String> {
    let mut raw = vec![0u8; rows * exec.config.vocab_size * 4];
    backend
        .copy_d2h(exec.workspace().offset(exec.layout.logits_offset), &mut raw)
        .map_err(|e| format!("reading logits: {e}"))?;
    Ok(raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
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
mod tests {
    use super::*;

    fn rules() -> RuleSet {
        RuleSet::from_file(&crate::workspace_root().join("fusions/FUSIONS.toml")).unwrap()
    }

    #[test]
    fn variants_are_the_baseline_each_lever_and_all_together() {
        let rules = rules();
        let names = |list: &str| -> Vec<String> {
            variants(list, &rules)
                .unwrap()
                .into_iter()
                .map(|v| v.name)
                .collect()
        };
        assert_eq!(names("pdl"), ["baseline", "pdl"]);
        assert_eq!(
            names("pdl, split_rope_kv"),
            ["baseline", "pdl", "split_rope_kv", "pdl+split_rope_kv"]
        );
        let all = variants("pdl,split_rope_kv", &rules).unwrap();
        assert!(all.iter().all(|v| v.bit_identical), "{all:?}");
        assert_eq!(all[3].levers, ["pdl", "split_rope_kv"]);
    }

    #[test]
    fn unknown_empty_and_repeated_levers_are_refused_by_name() {
        let rules = rules();
        let err = variants("pdl,gemv_classicc", &rules).unwrap_err();
        assert!(
            err.contains("`gemv_classicc`") && err.contains("known levers"),
            "{err}"
        );
        assert!(variants("pdl,,split_rope_kv", &rules)
            .unwrap_err()
            .contains("empty lever name"));
        assert!(variants("pdl,pdl", &rules)
            .unwrap_err()
            .contains("`pdl` is named twice"));
    }

    #[test]
    fn a_lever_a_differs_rule_names_is_not_bit_identical() {
        let text = std::fs::read_to_string(crate::workspace_root().join("fusions/FUSIONS.toml"))
            .unwrap()
            + r#"
[[rule]]
id = "zz_fast_exp_test"
pattern = [{ op = "silu_mul" }]
kernel = "act::silu_mul"
numerics = { differs = "fast_exp", tolerance = 0.01 }
priority = 1
"#;
        let rules = RuleSet::from_toml_str(&text, "test").unwrap();
        let all = variants("fast_exp,pdl", &rules).unwrap();
        let identical: Vec<(&str, bool)> = all
            .iter()
            .map(|v| (v.name.as_str(), v.bit_identical))
            .collect();
        assert_eq!(
            identical,
            [
                ("baseline", true),
                ("fast_exp", false),
                ("pdl", true),
                ("fast_exp+pdl", false)
            ]
        );
    }

    fn tiny_setup(rules: RuleSet) -> Setup {
        let builtin = crate::parity::builtin_named("tiny-llama").unwrap();
        let widths = vec![1, 2];
        Setup {
            name: "tiny-llama".into(),
            config: builtin.config().unwrap(),
            weights: WeightSource::Random { seed: builtin.seed },
            rules,
            serve: ServeShape::default(),
            kv: super::super::timing::kv_shape(8, &widths),
            context: 8,
            widths,
            rounds: 3,
            runs: 2,
            max_seconds: 60.0,
            copy_bytes_per_s: 1e9,
        }
    }

    /// The whole A/B loop on the CPU backend with a tiny model: every variant at every width,
    /// timed in both modes, logits the baseline's bytes.
    #[test]
    fn the_ab_loop_runs_on_the_cpu_backend() {
        let rules = rules();
        let all = variants("pdl,split_rope_kv", &rules).unwrap();
        let mut backend = solder_model_layers::kernels::cpu_backend(None).unwrap();
        let figures = measure(&mut backend, tiny_setup(rules), &all).unwrap();
        assert!(figures.problems().is_empty(), "{:?}", figures.problems());
        assert_eq!(figures.rows.len(), 8);
        for row in &figures.rows {
            assert_eq!(row.bytes, Bytes::Same, "{row:?}");
            assert_eq!((row.eager_runs, row.graph_runs), (6, 6), "{row:?}");
            assert!(row.graph_us > 0.0 && row.floor_us > 0.0, "{row:?}");
        }
        // split_rope_kv's layers launch once more each.
        let launches = |v: usize| {
            figures
                .rows
                .iter()
                .find(|r| r.variant == v)
                .unwrap()
                .launches
        };
        assert_eq!(launches(0), launches(1));
        assert!(launches(2) > launches(0));
        assert!(figures.table().contains("pdl+split_rope_kv"));
        assert_eq!(backend.live_allocations(), 0);
    }

    /// A variant that cannot build is reported and left out; the others are still measured.
    #[test]
    fn a_failing_variant_is_reported_and_the_others_still_run() {
        let text = std::fs::read_to_string(crate::workspace_root().join("fusions/FUSIONS.toml"))
            .unwrap()
            + r#"
[[rule]]
id = "zz_missing_kernel_under_pdl"
pattern = [{ op = "residual_add" }]
kernel = "add::no_such_kernel"
numerics = "bit_identical"
when = { pdl = true }
priority = 10000
"#;
        let rules = RuleSet::from_toml_str(&text, "test").unwrap();
        let all = variants("pdl,split_rope_kv", &rules).unwrap();
        let mut backend = solder_model_layers::kernels::cpu_backend(None).unwrap();
        let figures = measure(&mut backend, tiny_setup(rules), &all).unwrap();
        let failed: Vec<usize> = figures.failures.iter().map(|(v, _)| *v).collect();
        assert_eq!(failed, [1, 3], "{:?}", figures.failures);
        assert!(
            figures.failures[0].1.contains("no_such_kernel"),
            "{:?}",
            figures.failures
        );
        let measured: Vec<usize> = figures.rows.iter().map(|r| r.variant).collect();
        assert_eq!(measured, [0, 2, 0, 2]);
        assert_eq!(figures.problems().len(), 2);
        let table = figures.table();
        assert!(table.contains("FAILED pdl: build:"), "{table}");
        assert!(table.contains("failed pdl, pdl+split_rope_kv"), "{table}");
        assert_eq!(backend.live_allocations(), 0);
    }
}
