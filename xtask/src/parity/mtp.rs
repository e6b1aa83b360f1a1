//! The MTP draft head in parity (qwen3_next cases whose weights carry one: random weights,
//! which give the built-in tiny Qwen3-Next a random head, or a checkpoint with `mtp.*`
//! tensors). Per case, on execs serving draft programs (`draft_widths` \[4\]):
//!
//! - the head's logits over the prompt's pairs (hidden\[p\], token\[p+1\]) (`MtpDrafter::catch_up`,
//!   teacher-forced) under the reference routing and all rules: identical bytes;
//! - the target's logits of the draft-serving exec against the plain exec's decode: identical
//!   bytes (keeping the final hidden rows for the head changes nothing the target computes);
//! - with a golden holding `mtp_logits`: `e <= 1.5 e_hf` against transformers' modules
//!   (`tests/fixtures/golden/generate.py`, `mtp_reference`);
//! - greedy speculative decoding with the head as the drafter, for every k of `KS`: exactly
//!   plain greedy decoding's tokens and logits bytes.

use solder_config::{Family, ServeShape};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{greedy, CircuitExec, Drafter, MtpDrafter, Session};

use super::case::{Case, Weights};
use super::diff::Diff;
use super::differs::{max_abs, Differs};
use super::execs::build_exec_with;
use super::golden::GoldenFigures;
use super::speculative::KS;

/// What the MTP checks of one case found.
#[derive(Debug, Clone)]
pub struct MtpFigures {
    /// Pairs the head was run over (prompt length - 1).
    pub pairs: usize,
    pub ref_vs_fused: Diff,
    /// The `differs` rules the all-rules draft exec applied (the case's levers on), with the
    /// bound they allow `ref_vs_fused` relative to the reference head's largest |logit|; None:
    /// byte identity.
    pub head_differs: Option<Differs>,
    pub target_unchanged: Diff,
    pub golden: Option<GoldenFigures>,
    /// The head alone over transformers' hidden rows (`mtp_head_logits`), when the golden has them.
    pub golden_head: Option<GoldenFigures>,
    /// Speculative runs with the head drafting, tokens each generated, drafts proposed and
    /// accepted in all.
    pub runs: usize,
    pub tokens: usize,
    pub proposed: usize,
    pub accepted: usize,
    /// Every speculative run whose tokens or logits differ from plain greedy decoding, and
    /// the first non-finite head logit of each routing.
    pub failures: Vec<String>,
}

impl MtpFigures {
    pub fn passes(&self) -> bool {
        self.head_differs
            .as_ref()
            .map_or(self.ref_vs_fused.identical(), |d| {
                d.allows(&self.ref_vs_fused)
            })
            && self.target_unchanged.identical()
            && self.golden.is_none_or(|g| g.passes())
            && self.golden_head.is_none_or(|g| g.passes())
            && self.failures.is_empty()
            && self.runs > 0
    }
}

/// Draft programs at one row and four.
pub const DRAFT_WIDTHS: [usize; 1] = [4];

type R<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Whether `case` has an MTP head to check.
pub fn applies(case: &Case) -> R<bool> {
    if case.config.family != Family::Qwen3Next {
        return Ok(false);
    }
    match &case.weights {
        Weights::Random { .. } => Ok(true),
        Weights::Checkpoint(dir) => {
            let checkpoint = solder_model_layers::Checkpoint::open(dir).map_err(err)?;
            let prefix = solder_circuit::families::MTP_PREFIX;
            let found = checkpoint.names().any(|name| name.starts_with(prefix));
            Ok(found)
        }
    }
}

/// The MTP checks of `case`; `plain_decode` is the all-rules plain exec's decode of the prompt.
pub fn check(
    case: &Case,
    rules: &solder_circuit::RuleSet,
    backend: &mut dyn GpuBackend,
    plain_decode: &[f32],
    (prefix, gen): (&[u32], usize),
) -> R<Option<MtpFigures>> {
    if !applies(case)? {
        return Ok(None);
    }
    let serve = ServeShape {
        draft_widths: DRAFT_WIDTHS.to_vec(),
        ..ServeShape::default()
    };
    let vocab = case.config.vocab_size;
    let mut runs = Vec::new();
    let mut head_differs = None;
    // The all-rules exec runs with the case's levers on, as the plain all-rules exec did.
    let fused_policy = solder_circuit::Policy {
        levers: case.levers.clone(),
        ..solder_circuit::Policy::default()
    };
    for policy in [solder_circuit::Policy::reference_only(), fused_policy] {
        let mut exec = build_exec_with(case, rules, backend, policy, serve.clone())?;
        let ran = head_over_prompt(&exec, backend, &case.prompt);
        if let (Some(((_, reference_head), _, _)), Ok(_)) = (runs.first(), &ran) {
            head_differs = Differs::of(&exec, max_abs(std::slice::from_ref(reference_head)));
        }
        let (speculative, head_alone) = match ran {
            Ok(_) if runs.len() == 1 => (
                Some(speculative(&exec, backend, prefix, gen)),
                case.golden
                    .as_ref()
                    .and_then(|g| g.mtp_head.as_ref())
                    .map(|h| head_over_rows(&exec, backend, &case.prompt, &h.hidden)),
            ),
            _ => (None, None),
        };
        let head_alone = head_alone.transpose();
        exec.free(backend).map_err(err)?;
        runs.push((ran?, speculative.transpose()?, head_alone?));
    }
    let reference = &runs[0].0;
    let ((fused_target, fused_head), spec) = (&runs[1].0, &runs[1].1);
    let golden_head = match (&case.golden, &runs[1].2) {
        (Some(g), Some(ours)) => g
            .compare_mtp_head(ours)
            .transpose()
            .map_err(|e| format!("{}: mtp head golden: {e}", case.name))?,
        _ => None,
    };
    let golden = case
        .golden
        .as_ref()
        .and_then(|g| g.compare_mtp(fused_head))
        .transpose()
        .map_err(|e| format!("{}: mtp golden: {e}", case.name))?;
    let mut spec = spec.clone().unwrap_or_default();
    for (routing, head) in [("reference", &reference.1), ("all-rules", fused_head)] {
        if let Some(at) = super::golden::non_finite(head, vocab) {
            spec.failures
                .push(format!("{routing} MTP head logits not finite {at}"));
        }
    }
    Ok(Some(MtpFigures {
        pairs: case.prompt.len() - 1,
        ref_vs_fused: Diff::of(&reference.1, fused_head, vocab),
        head_differs,
        target_unchanged: Diff::of(fused_target, plain_decode, vocab),
        golden,
        golden_head,
        runs: spec.runs,
        tokens: spec.tokens,
        proposed: spec.proposed,
        accepted: spec.accepted,
        failures: spec.failures,
    }))
}

/// The target's prefill logits and the head's teacher-forced logits over `prompt`.
fn head_over_prompt(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
) -> R<(Vec<f32>, Vec<f32>)> {
    let mut drafter = MtpDrafter::new(exec).map_err(err)?;
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let target = drafter
        .prefill(backend, &mut session, id, prompt)
        .map_err(err)?;
    let head = drafter.catch_up(backend, id, prompt).map_err(err)?;
    drafter.forget(id);
    session.end_sequence(id).map_err(err)?;
    Ok((target, head))
}

/// The head's teacher-forced logits over `prompt` paired with the given hidden rows (f32
/// values of bf16, `\[T, H\]`) instead of the target's own.
fn head_over_rows(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    hidden: &[f32],
) -> R<Vec<f32>> {
    let mut drafter = MtpDrafter::new(exec).map_err(err)?;
    let rows = hidden
        .iter()
        .map(|&v| solder_model_layers::numerics::to_bf16(v))
        .collect();
    // Any sequence id: no target session runs, the rows are given.
    let seq = 0;
    drafter.observe_rows(seq, 0, rows).map_err(err)?;
    let logits = drafter.catch_up(backend, seq, prompt).map_err(err)?;
    drafter.forget(seq);
    Ok(logits)
}

#[derive(Debug, Clone, Default)]
struct Spec {
    runs: usize,
    tokens: usize,
    proposed: usize,
    accepted: usize,
    failures: Vec<String>,
}

/// Greedy speculative decoding of `gen` tokens after `prefix` with the head drafting, for
/// every k of `KS`, against plain greedy decoding on the same exec.
fn speculative(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    prefix: &[u32],
    gen: usize,
) -> R<Spec> {
    let vocab = exec.config.vocab_size;
    let (want_tokens, want_logits) = {
        let mut session = Session::new(exec);
        let id = session.add_sequence();
        let logits = session.prefill(backend, id, prefix).map_err(err)?;
        let mut token = greedy(&logits[(prefix.len() - 1) * vocab..]);
        let (mut tokens, mut all) = (vec![token], Vec::new());
        for _ in 0..gen {
            let logits = session.decode(backend, id, token).map_err(err)?;
            token = greedy(&logits);
            tokens.push(token);
            all.extend(logits);
        }
        session.end_sequence(id).map_err(err)?;
        (tokens, all)
    };
    let mut spec = Spec::default();
    for k in KS {
        let mut drafter = MtpDrafter::new(exec).map_err(err)?;
        let mut session = Session::new(exec);
        let id = session.add_sequence();
        let logits = drafter
            .prefill(backend, &mut session, id, prefix)
            .map_err(err)?;
        let mut pending = greedy(&logits[(prefix.len() - 1) * vocab..]);
        let (mut tokens, mut all) = (vec![pending], Vec::<f32>::new());
        while all.len() < gen * vocab {
            let step = session
                .speculative_step(backend, id, pending, k, &mut drafter)
                .map_err(|e| format!("mtp k {k}: {e}"))?;
            spec.proposed += step.proposed;
            spec.accepted += step.accepted;
            tokens.extend(&step.tokens);
            all.extend(&step.logits);
            pending = *step
                .tokens
                .last()
                .ok_or("a speculative step emitted no token")?;
        }
        let n = gen * vocab;
        if tokens[..=gen] != want_tokens[..] {
            spec.failures.push(format!("mtp k {k}: tokens differ"));
        } else if let Some(i) = (0..n).find(|&i| all[i].to_bits() != want_logits[i].to_bits()) {
            spec.failures.push(format!(
                "mtp k {k}: logits differ at position {}",
                i / vocab
            ));
        }
        spec.runs += 1;
        spec.tokens += gen;
        drafter.forget(id);
        session.end_sequence(id).map_err(err)?;
    }
    Ok(spec)
}
