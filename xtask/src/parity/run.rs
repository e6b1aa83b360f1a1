//! The parity runs of one model: reference-only and all-rules programs over the same
//! prompts, teacher-forced, in every mode; the detection run; the golden comparison.

use solder_circuit::{Mode, Policy, RuleSet};
use solder_config::ServeShape;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{CircuitExec, GraphPolicy};

use super::case::{
    err, random_prompt, spec_gen, spec_prefix, Case, Detection, FiniteCheck, ModeRow, RouteLog,
    Routing, R,
};
use super::claims::Blame;
use super::differs::Differs;
use super::execs::{build_exec, serve_of, LONG_PROMPT};
use super::golden::GoldenFigures;
use super::rows::{decode_alone, detection_run, mode_rows, Baseline};
use super::speculative::SpecFigures;
use super::verified::verify_exec_plans;

pub struct VariantFigures {
    pub fusions: &'static str,
    pub plan_digest: String,
    pub plans_digest: String,
    pub launches_per_step: usize,
    pub pool_bytes: usize,
    pub live_lower_bound: usize,
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::parity::builtin_named;
    use crate::parity::case::Weights;
    use crate::parity::diff::Diff;
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
}
