//! The parity runs of one model: reference-only and all-rules programs over the same
//! prompts, teacher-forced, in every mode; the detection run; the golden comparison.

use std::collections::BTreeMap;

use solder_circuit::{Mode, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{CircuitExec, GraphPolicy, Session};

use super::claims::Blame;
use super::differs::{Differs, ProgramKey};
pub use super::execs::{build_exec, build_exec_with, decode_all, serve_of, LONG_PROMPT};
use super::golden::{non_finite, Golden, GoldenFigures};
use super::rows::{decode_alone, detection_run, mode_rows, Baseline};
use super::speculative::SpecFigures;
use super::verified::verify_exec_plans;

pub enum Weights {
    Random { seed: u64 },
    Checkpoint(std::path::PathBuf),
}

pub struct Case {
    pub name: String,
    pub config: ModelConfig,
    pub weights: Weights,
    pub prompt: Vec<u32>,
    pub golden: Option<Golden>,
    /// `--max-batch`: the widest multi-seq width to run (`None`: `serve_for`'s).
    pub max_batch: Option<usize>,
    /// `--levers`: the levers of the all-rules exec (none by default).
    pub levers: solder_config::Levers,
}

/// Where two runs' logits first differ (by position) and by how much at most.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diff {
    pub first_position: Option<usize>,
    pub max_abs: f32,
}

impl Diff {
    pub const NONE: Diff = Diff {
        first_position: None,
        max_abs: 0.0,
    };

    pub fn of(a: &[f32], b: &[f32], vocab: usize) -> Diff {
        let mut diff = Diff::NONE;
        if a.len() != b.len() {
            return Diff {
                first_position: Some(0),
                max_abs: f32::INFINITY,
            };
        }
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            if x.to_bits() != y.to_bits() {
                // A NaN stays NaN (reported as such), never dropped by `max`.
                let d = (x - y).abs();
                diff.max_abs = if d.is_nan() || diff.max_abs.is_nan() {
                    f32::NAN
                } else {
                    diff.max_abs.max(d)
                };
                let position = i / vocab;
                diff.first_position =
                    Some(diff.first_position.map_or(position, |p| p.min(position)));
            }
        }
        diff
    }

    pub fn merge(self, other: Diff) -> Diff {
        Diff {
            first_position: match (self.first_position, other.first_position) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            max_abs: if self.max_abs.is_nan() || other.max_abs.is_nan() {
                f32::NAN
            } else {
                self.max_abs.max(other.max_abs)
            },
        }
    }

    pub fn identical(&self) -> bool {
        self.first_position.is_none()
    }
}

pub struct VariantFigures {
    pub fusions: &'static str,
    pub plan_digest: String,
    pub plans_digest: String,
    pub launches_per_step: usize,
    pub pool_bytes: usize,
    pub live_lower_bound: usize,
}

pub struct ModeRow {
    pub mode: Mode,
    pub rows: usize,
    /// Live sequences (multi_seq: fewer than rows means padding rows ran).
    pub live: usize,
    /// Tokens fed to each sequence of the row.
    pub tokens: usize,
    /// The all-rules programs the row ran, in first-run order (`claims::Blame::judge` sets
    /// them): what the row proves, e.g. a verify row at K > its tokens ran narrower programs.
    pub programs: Vec<ProgramKey>,
    pub ref_vs_fused: Diff,
    /// Each sequence's logits against the same sequence decoded alone (each routing against
    /// itself): byte identity, unless a `by_chunk` rule ran (`vs_decode_ok`).
    pub vs_decode: Diff,
    /// The all-rules programs' graphs replayed vs the same programs run eagerly.
    pub graph_vs_eager: Diff,
    /// The `differs` rules of the all-rules programs this row ran, and their bound: None
    /// holds `ref_vs_fused` to byte identity (`differs` module).
    pub differs: Option<Differs>,
    /// A `bit_identical` claim this row disproved: the rule and its first launch
    /// (`claims::blame`).
    pub broken_claim: Option<String>,
}

impl ModeRow {
    /// Byte identity, or with a `differs` rule in this row's programs its bound.
    pub fn ref_vs_fused_ok(&self) -> bool {
        match &self.differs {
            None => self.ref_vs_fused.identical(),
            Some(differs) => differs.allows(&self.ref_vs_fused),
        }
    }

    /// Byte identity with each sequence decoded alone, or, where this row's programs ran a
    /// `differs` rule declared `by_chunk` (a prompt's rows summed together: the bytes depend
    /// on the chunking), that rule's bound.
    pub fn vs_decode_ok(&self) -> bool {
        match &self.differs {
            Some(differs) if !differs.by_chunk.is_empty() => differs.allows(&self.vs_decode),
            _ => self.vs_decode.identical(),
        }
    }
}

pub struct Detection {
    pub changed_at: usize,
    pub first_difference: Option<usize>,
}

impl Detection {
    pub fn ok(&self) -> bool {
        self.first_difference == Some(self.changed_at)
    }
}

pub struct CaseReport {
    pub name: String,
    pub family: String,
    pub tokens: usize,
    pub vocab: usize,
    pub variants: Vec<VariantFigures>,
    pub modes: Vec<ModeRow>,
    pub detection: Detection,
    pub golden: Option<GoldenFigures>,
    /// Plans of both execs (every program and route arm) rebuilt with the verifier on.
    pub verified_plans: usize,
    /// The all-rules decode of the first prompt, `[T * V]` (compared across backends).
    pub decode_logits: Vec<f32>,
    /// Every run whose logits held a NaN or infinity: which, and where the first one was.
    pub non_finite: Vec<String>,
    /// Steps that ran on a runtime route arm.
    pub routes: RouteLog,
    /// The all-rules exec's graph counters (its steps replay graphs; the reference's run
    /// eagerly).
    pub graphs: String,
    /// Greedy speculative decoding against plain greedy decoding (all rules).
    pub speculative: SpecFigures,
    /// The MTP draft head's checks (qwen3_next cases with a head).
    pub mtp: Option<super::mtp::MtpFigures>,
    /// The levers the all-rules routing ran with (`--levers`), sorted.
    pub levers: Vec<String>,
    /// The `differs` rules those levers let the all-rules routing apply, and their bound.
    pub differs: Option<Differs>,
}

/// Steps per (routing, arm capability, mode, rows) that took a runtime route arm, and all
/// steps per (routing, mode, rows), arm or not.
#[derive(Debug, Default, Clone)]
pub struct RouteLog {
    pub steps: BTreeMap<(&'static str, &'static str, Mode, usize), usize>,
    pub all_steps: BTreeMap<(&'static str, Mode, usize), usize>,
    /// The all-rules programs run since the last `take_ran`, in first-run order.
    ran: Vec<ProgramKey>,
}

impl RouteLog {
    /// Counts the step `session` just ran, and its arm if it ran on one.
    pub(super) fn record(&mut self, fusions: &'static str, session: &Session) {
        let Some((mode, rows, arm)) = session.last_program() else {
            return;
        };
        *self.all_steps.entry((fusions, mode, rows)).or_default() += 1;
        if fusions == "all" && !self.ran.contains(&(mode, rows, arm)) {
            self.ran.push((mode, rows, arm));
        }
        if let Some(condition) = arm {
            *self
                .steps
                .entry((fusions, condition.capability(), mode, rows))
                .or_default() += 1;
        }
    }

    /// The all-rules programs run since the last call (a mode row's programs).
    pub fn take_ran(&mut self) -> Vec<ProgramKey> {
        std::mem::take(&mut self.ran)
    }

    /// All steps the routing ran at (mode, rows).
    pub fn of(&self, fusions: &'static str, mode: Mode, rows: usize) -> usize {
        self.all_steps
            .get(&(fusions, mode, rows))
            .copied()
            .unwrap_or(0)
    }
}

/// Which exec a run used, and so which routing its arms belong to.
#[derive(Clone, Copy)]
pub struct Routing<'a> {
    pub exec: &'a CircuitExec,
    pub fusions: &'static str,
}

/// Collects the first non-finite logit of each run, named by model, mode and rows.
pub(super) struct FiniteCheck<'a> {
    pub(super) model: &'a str,
    pub(super) vocab: usize,
    pub(super) found: Vec<String>,
}

impl FiniteCheck<'_> {
    pub(super) fn check(&mut self, run: &str, logits: &[f32]) {
        if let Some(at) = non_finite(logits, self.vocab) {
            self.found
                .push(format!("{}: {run}: logits not finite {at}", self.model));
        }
    }
}

impl CaseReport {
    pub fn passes(&self) -> bool {
        self.modes.iter().all(|m| {
            m.ref_vs_fused_ok()
                && m.broken_claim.is_none()
                && m.vs_decode_ok()
                && m.graph_vs_eager.identical()
        }) && self.detection.ok()
            && self.golden.is_none_or(|g| g.passes())
            && self.non_finite.is_empty()
            && self.speculative.passes()
            && self.mtp.as_ref().is_none_or(|m| m.passes())
    }
}

pub(super) type R<T> = Result<T, String>;

pub(super) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// A prompt of `len` tokens from `seed`.
pub fn random_prompt(seed: u64, vocab: usize, len: usize) -> Vec<u32> {
    let mut rng =
        solder_model_layers::weights::SplitMix64(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5eed);
    (0..len)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect()
}

/// Runs one case: the reference routing against the all-rules routing with `case.levers` on
/// (`--levers`; where a lever lets a `differs` rule apply, see `differs`).
pub fn run_case(case: &Case, rules: &RuleSet, backend: &mut dyn GpuBackend) -> R<CaseReport> {
    let vocab = case.config.vocab_size;
    let tokens = case.prompt.len();
    let serve = serve_of(case);
    check_prompt(case, &serve)?;
    let widest = serve.multi_seq_ladder.last().copied().unwrap_or(1);
    let (reference_exec, fused_exec, fused_policy, verified_plans) =
        build_execs(case, rules, backend)?;
    let reference = Routing {
        exec: &reference_exec,
        fusions: "reference",
    };
    let fused = Routing {
        exec: &fused_exec,
        fusions: "all",
    };
    let mut routes = RouteLog::default();
    let mut finite = FiniteCheck {
        model: &case.name,
        vocab,
        found: Vec::new(),
    };

    let prompts = case_prompts(case, widest);
    let alone = decode_alone(
        &case.name,
        [reference, fused],
        &prompts,
        backend,
        &mut (&mut routes, &mut finite),
    )?;

    // Each row's tolerance comes from the all-rules programs it ran (`Differs::of_programs`);
    // a row that changed bytes under none is a broken `bit_identical` claim, blamed on a rule.
    let blame = Blame {
        case,
        rules,
        policy: &fused_policy,
        exec: &fused_exec,
        scale: alone.scale,
    };
    let base = Baseline {
        reference,
        fused,
        prompts: &prompts,
        alone: &alone.alone,
        alone_fused: &alone.alone_fused,
        blame: &blame,
        vocab,
    };
    let mut log = (&mut routes, &mut finite);
    let modes = mode_rows(
        &base,
        &serve,
        [&alone.fused_alone, &alone.fused_eager],
        alone.differs.is_some(),
        backend,
        &mut log,
    )?;
    tracing::info!(model = %case.name, "detection run");
    let detection = detection_run(&base, &alone.fused_alone, backend, &mut log)?;
    let golden = case
        .golden
        .as_ref()
        .map(|g| g.compare(&alone.fused_alone))
        .transpose()
        .map_err(|e| format!("{}: {e}", case.name))?;

    let variants = variant_figures([&reference, &fused])?;
    tracing::info!(model = %case.name, "speculative decoding and MTP checks");
    let (speculative, graphs, mtp) = draft_checks(
        case,
        rules,
        backend,
        [reference_exec, fused_exec],
        &alone.fused_alone,
    )?;
    Ok(CaseReport {
        name: case.name.clone(),
        family: case.config.family.as_str().to_string(),
        tokens,
        vocab,
        variants,
        modes,
        detection,
        golden,
        verified_plans,
        decode_logits: alone.fused_alone,
        non_finite: finite.found,
        routes,
        graphs,
        speculative,
        mtp,
        levers: case.levers.enabled().map(str::to_string).collect(),
        differs: alone.differs,
    })
}

/// The reference-only and all-rules (the case's levers on) execs with their graph policies
/// set and every plan verified: `(reference, all rules, the all-rules policy, plans verified)`.
fn build_execs(
    case: &Case,
    rules: &RuleSet,
    backend: &mut dyn GpuBackend,
) -> R<(CircuitExec, CircuitExec, Policy, usize)> {
    let reference_exec = build_exec(case, rules, backend, Policy::reference_only())?;
    let fused_policy = Policy {
        levers: case.levers.clone(),
        ..Policy::default()
    };
    let fused_exec = build_exec(case, rules, backend, fused_policy.clone())?;
    let verified_plans =
        verify_exec_plans(&reference_exec, rules, &Policy::reference_only(), backend)?
            + verify_exec_plans(&fused_exec, rules, &fused_policy, backend)?;
    // The reference routing runs eagerly; the all-rules routing replays graphs (a failed
    // capture is an error), and each of its runs is repeated eagerly (`eagerly`).
    reference_exec.set_graph_policy(GraphPolicy::Never);
    fused_exec.set_graph_policy(GraphPolicy::Always);
    Ok((reference_exec, fused_exec, fused_policy, verified_plans))
}

/// The case's prompt and, to fill the widest multi-seq width, `widest - 1` random prompts of
/// its length.
fn case_prompts(case: &Case, widest: usize) -> Vec<Vec<u32>> {
    let (vocab, tokens) = (case.config.vocab_size, case.prompt.len());
    (0..widest)
        .map(|r| {
            if r == 0 {
                case.prompt.clone()
            } else {
                random_prompt(r as u64, vocab, tokens)
            }
        })
        .collect()
}

/// Speculative decoding from the prompt's first tokens on the all-rules exec, its graph
/// counters, then (with both execs freed) the MTP head's check on execs of its own.
fn draft_checks(
    case: &Case,
    rules: &RuleSet,
    backend: &mut dyn GpuBackend,
    [mut reference_exec, mut fused_exec]: [CircuitExec; 2],
    fused_alone: &[f32],
) -> R<(SpecFigures, String, Option<super::mtp::MtpFigures>)> {
    let tokens = case.prompt.len();
    let prompt = &case.prompt;
    // Speculative decoding from the prompt's first tokens: lossless for every k and drafter.
    let prefix = &prompt[..spec_prefix(tokens)];
    // Within the model's positions: the prefix, the tokens generated and a verify step of 8.
    let room = case
        .config
        .max_position_embeddings
        .saturating_sub(prefix.len() + 8);
    let gen = spec_gen(tokens).min(room);
    let speculative = super::speculative::check(&fused_exec, backend, prefix, gen)
        .map_err(|e| format!("{}: speculative: {e}", case.name))?;
    let graphs = fused_exec.graph_counters().to_string();
    // The MTP head (qwen3_next): on execs of its own, after these are freed.
    let mtp_inputs = (prefix.to_vec(), fused_alone.to_vec());
    reference_exec.free(backend).map_err(err)?;
    fused_exec.free(backend).map_err(err)?;
    let mtp = super::mtp::check(case, rules, backend, &mtp_inputs.1, (&mtp_inputs.0, gen))
        .map_err(|e| format!("{}: mtp: {e}", case.name))?;
    Ok((speculative, graphs, mtp))
}

/// The case's prompt has at least two tokens and fits the model's positions (checked before
/// any KV cache is allocated); a `--max-batch` above what the prompt runs is warned about.
fn check_prompt(case: &Case, serve: &ServeShape) -> R<()> {
    let tokens = case.prompt.len();
    if tokens < 2 {
        return Err(format!(
            "{}: the prompt needs at least two tokens",
            case.name
        ));
    }
    // Before any KV cache is allocated: the prompt must fit the model's positions.
    if tokens > case.config.max_position_embeddings {
        return Err(format!(
            "{}: a prompt of {tokens} tokens is longer than the model's \
             max_position_embeddings {}",
            case.name, case.config.max_position_embeddings
        ));
    }
    if let Some(asked) = case.max_batch.filter(|&n| n > serve.max_batch) {
        eprintln!(
            "warning: {}: --max-batch {asked}, but a prompt of {tokens} tokens runs multi-seq \
             widths up to {} (prompts past {LONG_PROMPT} tokens: run::LONG_PROMPT_MAX_BATCH)",
            case.name, serve.max_batch
        );
    }
    Ok(())
}

/// Each routing's decode-plan figures (digests, launches, pool).
fn variant_figures(routings: [&Routing; 2]) -> R<Vec<VariantFigures>> {
    routings
        .into_iter()
        .map(|routing| {
            let exec = routing.exec;
            let plan = exec.plan(Mode::Decode, 1).ok_or("no decode plan")?;
            Ok(VariantFigures {
                fusions: routing.fusions,
                plan_digest: plan.digest.clone(),
                plans_digest: exec.plans_digest().to_string(),
                launches_per_step: plan.compute_steps(),
                pool_bytes: plan.pool_bytes,
                live_lower_bound: plan.live_lower_bound,
            })
        })
        .collect::<R<Vec<_>>>()
}

/// The speculative check's prefix (at most) and tokens generated (at most, at least).
const SPEC_PREFIX: usize = 32;
const SPEC_GEN: usize = 12;
const SPEC_GEN_LEAST: usize = 4;

/// The tokens the speculative (and MTP) check generates after a prompt of `tokens`: as many
/// as the prompt has, from 4 to 12. A short prompt asks for a short run (the emulated
/// parity steps' `--tokens 4`, where every launch also runs its CUDA source on the host);
/// with 4, k = 7's verify step still runs, past the tokens compared.
pub(super) fn spec_gen(tokens: usize) -> usize {
    tokens.clamp(SPEC_GEN_LEAST, SPEC_GEN)
}

/// The speculative check's prefix of a prompt of `tokens`: half of it, at most `SPEC_PREFIX`.
pub(super) fn spec_prefix(tokens: usize) -> usize {
    (tokens / 2).clamp(1, SPEC_PREFIX)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::parity::builtin_named;
    use safetensors::tensor::TensorView;
    use safetensors::SafeTensors;

    fn rules() -> RuleSet {
        RuleSet::from_file(&crate::paths::workspace_root().join("fusions/FUSIONS.toml")).unwrap()
    }

    /// A prefill row whose chunks differ from the prompt decoded alone by `vs_decode`, its
    /// programs applying one `differs` rule (`by_chunk` or not) or none.
    pub(crate) fn chunk_row(vs_decode: f32, differs: Option<bool>) -> ModeRow {
        ModeRow {
            mode: solder_circuit::Mode::Prefill,
            rows: 8,
            live: 1,
            tokens: 40,
            programs: Vec::new(),
            ref_vs_fused: Diff::NONE,
            vs_decode: Diff {
                first_position: (vs_decode != 0.0).then_some(0),
                max_abs: vs_decode,
            },
            graph_vs_eager: Diff::NONE,
            differs: differs.map(|by_chunk| super::super::differs::Differs {
                rules: vec!["r (gdn_chunked)".into()],
                by_chunk: if by_chunk {
                    vec!["r".into()]
                } else {
                    Vec::new()
                },
                tolerance: 0.5,
                scale: 4.0,
            }),
            broken_claim: None,
        }
    }

    /// Each sequence against itself decoded alone stays byte for byte, but where a rule
    /// declared `by_chunk` ran, within its bound (0.5 × 4 here) and never NaN.
    #[test]
    fn only_a_by_chunk_rule_lets_a_prompts_chunks_differ_from_its_decode() {
        assert!(chunk_row(0.0, None).vs_decode_ok());
        assert!(!chunk_row(0.1, None).vs_decode_ok());
        assert!(!chunk_row(0.1, Some(false)).vs_decode_ok());
        assert!(chunk_row(0.1, Some(true)).vs_decode_ok());
        assert!(chunk_row(2.0, Some(true)).vs_decode_ok());
        assert!(!chunk_row(2.1, Some(true)).vs_decode_ok());
        assert!(!chunk_row(f32::NAN, Some(true)).vs_decode_ok());
    }

    fn builtin_case(name: &str, weights: Option<Weights>) -> Case {
        let builtin = builtin_named(name).unwrap();
        let config = builtin.config().unwrap();
        Case {
            name: builtin.name.to_string(),
            prompt: random_prompt(builtin.seed, config.vocab_size, 3),
            config,
            weights: weights.unwrap_or(Weights::Random { seed: builtin.seed }),
            golden: None,
            max_batch: None,
            levers: Default::default(),
        }
    }

    /// tiny-llama saved as a checkpoint whose `lm_head` row `row` is NaN.
    pub(crate) fn nan_lm_head_checkpoint(row: usize) -> std::path::PathBuf {
        let builtin = builtin_named("tiny-llama").unwrap();
        let config = builtin.config().unwrap();
        // One folder per row: two tests may build theirs at once.
        let dir =
            std::env::temp_dir().join(format!("xtask-nan-lm-head-{}-{row}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), builtin.config_json).unwrap();
        let instance =
            solder_circuit::Instance::from_config(&config, ServeShape::default()).unwrap();
        let path = dir.join("model.safetensors");
        solder_model_layers::HostWeights::random(&instance.circuit, builtin.seed)
            .save(&instance.circuit, &path)
            .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
            .tensors()
            .into_iter()
            .map(|(name, t)| (name, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
            .collect();
        let (_, _, shape, data) = tensors
            .iter_mut()
            .find(|(name, ..)| name == "lm_head.weight")
            .expect("tiny-llama has an untied lm_head");
        let hidden = shape[1];
        for bf16 in data[row * hidden * 2..(row + 1) * hidden * 2].chunks_exact_mut(2) {
            bf16.copy_from_slice(&0x7fc0u16.to_le_bytes());
        }
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(name, dtype, shape, data)| {
                (
                    name.clone(),
                    TensorView::new(*dtype, shape.clone(), data).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
        dir
    }

    #[test]
    fn a_nan_row_of_lm_head_fails_the_case_by_vocab_index() {
        let dir = nan_lm_head_checkpoint(17);
        let case = builtin_case("tiny-llama", Some(Weights::Checkpoint(dir.clone())));
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(2)).unwrap();
        let ran = run_case(&case, &rules(), &mut backend);
        let _ = std::fs::remove_dir_all(&dir);
        match ran {
            Ok(report) => {
                assert!(!report.passes(), "a NaN vocabulary column passed parity");
                let first = report
                    .non_finite
                    .first()
                    .expect("non-finite logits reported");
                assert!(first.contains("tiny-llama"), "{first}");
                assert!(first.contains("decode rows 1"), "{first}");
                assert!(first.contains("position 0, vocab index 17: NaN"), "{first}");
                let detection = super::super::report::detection_verdict(&report);
                assert_ne!(detection, "HARNESS BROKEN", "a NaN is reported as one");
            }
            // A checkpoint loader that refuses non-finite weights is as good, if it names them.
            Err(e) => assert!(e.contains("lm_head"), "{e}"),
        }
    }

    #[test]
    fn the_route_arms_that_ran_are_counted() {
        let case = builtin_case("tiny-qwen3-next", None);
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(2)).unwrap();
        let report = run_case(&case, &rules(), &mut backend).unwrap();
        assert!(report.passes());
        let arms: Vec<_> = report
            .routes
            .steps
            .iter()
            .filter(|((fusions, arm, mode, _), _)| {
                *fusions == "all" && *arm == "route:gdn_even_pitch" && *mode == Mode::MultiSeq
            })
            .collect();
        assert!(!arms.is_empty(), "{:?}", report.routes);
        // Each multi-seq run is one step per prompt token.
        assert!(
            arms.iter()
                .all(|(_, &steps)| steps % case.prompt.len() == 0),
            "{arms:?}"
        );
        let text = super::super::report::routes_text(&report.routes);
        assert!(
            text.iter()
                .any(|l| l.starts_with("route:gdn_even_pitch (all): multi_seq rows")),
            "{text:?}"
        );
    }

    #[test]
    fn a_prompt_past_the_position_limit_is_refused_before_building() {
        let mut case = builtin_case("tiny-llama", None);
        case.prompt = random_prompt(1, case.config.vocab_size, 600);
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(1)).unwrap();
        let e = run_case(&case, &rules(), &mut backend).err().unwrap();
        assert!(e.contains("max_position_embeddings 512"), "{e}");
    }

    /// FUSIONS.toml with `rule`'s numerics replaced by `numerics`.
    fn rules_with(rule: &str, numerics: &str) -> RuleSet {
        let path = crate::paths::workspace_root().join("fusions/FUSIONS.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        let at = text.find(&format!("id = \"{rule}\"")).unwrap();
        let from = at + text[at..].find("numerics = ").unwrap();
        let to = from + text[from..].find('\n').unwrap();
        let edited = format!("{}numerics = {numerics}{}", &text[..from], &text[to..]);
        RuleSet::from_toml_str(&edited, "edited FUSIONS.toml").unwrap()
    }

    /// Issue 19.1: the decode rule claimed `bit_identical` while the verify rule stays
    /// `differs`; the verify rule's tolerance used to cover the decode program too.
    #[test]
    fn a_false_bit_identical_claim_fails_naming_the_rule_and_its_launch() {
        let mut case = builtin_case("tiny-mistral-fold", None);
        // tiny-mistral-fold's fold first changes a byte at position 29 of its 40 tokens.
        case.prompt = random_prompt(0x3158, case.config.vocab_size, 40);
        case.max_batch = Some(1);
        case.levers.set("fold_o_proj", true).unwrap();
        let rules = rules_with("attention_o_proj_residual", "\"bit_identical\"");
        let mut backend = solder_model_layers::kernels::cpu_backend(Some(2)).unwrap();
        let report = run_case(&case, &rules, &mut backend).unwrap();
        assert!(!report.passes(), "a false bit_identical claim passed");
        let decode = &report.modes[0];
        assert_eq!(decode.mode, Mode::Decode);
        assert!(decode.differs.is_none(), "{:?}", decode.differs);
        let claim = decode.broken_claim.as_deref().unwrap_or_default();
        assert!(
            claim.contains("`attention_o_proj_residual`")
                && claim.contains("first differing launch 3 of")
                && claim.contains("attn::paged_decode_o"),
            "{claim}"
        );
        // The verify rows run the causal rule, still `differs`: held to its tolerance.
        let verify: Vec<&ModeRow> = report
            .modes
            .iter()
            .filter(|m| m.mode == Mode::Verify)
            .collect();
        assert!(!verify.is_empty());
        for row in verify {
            let differs = row.differs.as_ref().expect("the causal fold applies");
            assert_eq!(
                differs.rules,
                ["attention_causal_o_proj_residual (fold_o_proj)"]
            );
            assert!(row.ref_vs_fused_ok() && row.broken_claim.is_none());
        }
    }

    #[test]
    fn diffs_keep_nan() {
        let d = Diff::of(&[0.0, 1.0], &[0.0, f32::NAN], 2);
        assert!(d.max_abs.is_nan() && d.first_position == Some(0));
        let merged = d.merge(Diff::of(&[2.0], &[1.0], 1));
        assert!(merged.max_abs.is_nan());
        assert!(Diff::of(&[2.0], &[1.0], 1).merge(d).max_abs.is_nan());
    }
}
