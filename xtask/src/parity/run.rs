//! The parity runs of one model: reference-only and all-rules programs over the same
//! prompts, teacher-forced, in every mode; the detection run; the golden comparison.

use solder_circuit::{Mode, Policy, RuleSet};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{Boot, CircuitExec, KvShape, Session, WeightSource};

use super::golden::{Golden, GoldenFigures};
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
                let d = (x - y).abs();
                diff.max_abs = if d.is_nan() {
                    f32::INFINITY
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
            max_abs: self.max_abs.max(other.max_abs),
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
    pub ref_vs_fused: Diff,
    /// Each sequence's logits against the same sequence decoded alone (reference routing).
    pub vs_decode: Diff,
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
}

impl CaseReport {
    pub fn passes(&self) -> bool {
        self.modes
            .iter()
            .all(|m| m.ref_vs_fused.identical() && m.vs_decode.identical())
            && self.detection.ok()
            && self.golden.is_none_or(|g| g.passes())
    }
}

type R<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
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

pub fn run_case(case: &Case, rules: &RuleSet, backend: &mut dyn GpuBackend) -> R<CaseReport> {
    let vocab = case.config.vocab_size;
    let tokens = case.prompt.len();
    if tokens < 2 {
        return Err(format!(
            "{}: the prompt needs at least two tokens",
            case.name
        ));
    }
    let serve = ServeShape::default();
    let widest = serve.multi_seq_ladder.last().copied().unwrap_or(1);
    let mut reference = build_exec(case, rules, backend, Policy::reference_only())?;
    let mut fused = build_exec(case, rules, backend, Policy::default())?;
    let verified_plans = verify_exec_plans(&reference, rules, &Policy::reference_only(), backend)?
        + verify_exec_plans(&fused, rules, &Policy::default(), backend)?;

    let prompts: Vec<Vec<u32>> = (0..widest)
        .map(|r| {
            if r == 0 {
                case.prompt.clone()
            } else {
                random_prompt(r as u64, vocab, tokens)
            }
        })
        .collect();
    tracing::info!(model = %case.name, "decoding {} prompts alone (reference routing)", prompts.len());
    let alone: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| decode_all(&reference, backend, p))
        .collect::<R<_>>()?;
    let fused_alone = decode_all(&fused, backend, &prompts[0])?;

    let mut modes = vec![ModeRow {
        mode: Mode::Decode,
        rows: 1,
        live: 1,
        ref_vs_fused: Diff::of(&alone[0], &fused_alone, vocab),
        vs_decode: Diff::of(&fused_alone, &alone[0], vocab),
    }];
    let mut widths: Vec<(usize, usize)> = serve.multi_seq_ladder.iter().map(|&w| (w, w)).collect();
    if serve.multi_seq_ladder.len() >= 2 {
        // The widest width again with padding rows: one more live sequence than the width below.
        let below = serve.multi_seq_ladder[serve.multi_seq_ladder.len() - 2];
        widths.push((widest, below + 1));
    }
    for (width, live) in widths {
        tracing::info!(model = %case.name, width, live, "multi_seq");
        let r = multi_seq(&reference, backend, &prompts[..live])?;
        let f = multi_seq(&fused, backend, &prompts[..live])?;
        let mut row = ModeRow {
            mode: Mode::MultiSeq,
            rows: width,
            live,
            ref_vs_fused: Diff::NONE,
            vs_decode: Diff::NONE,
        };
        for s in 0..live {
            row.ref_vs_fused = row.ref_vs_fused.merge(Diff::of(&r[s], &f[s], vocab));
            row.vs_decode = row
                .vs_decode
                .merge(Diff::of(&f[s], &alone[s], vocab))
                .merge(Diff::of(&r[s], &alone[s], vocab));
        }
        modes.push(row);
    }
    for &k in &serve.verify_widths {
        let r = verify_chunks(&reference, backend, &prompts[0], k)?;
        let f = verify_chunks(&fused, backend, &prompts[0], k)?;
        modes.push(ModeRow {
            mode: Mode::Verify,
            rows: k,
            live: 1,
            ref_vs_fused: Diff::of(&r, &f, vocab),
            vs_decode: Diff::of(&f, &alone[0], vocab).merge(Diff::of(&r, &alone[0], vocab)),
        });
    }

    let changed_at = tokens / 2;
    let mut changed = prompts[0].clone();
    changed[changed_at] = (changed[changed_at] + 1) % vocab as u32;
    let detection = Detection {
        changed_at,
        first_difference: Diff::of(&decode_all(&fused, backend, &changed)?, &fused_alone, vocab)
            .first_position,
    };
    let golden = case.golden.as_ref().map(|g| g.compare(&fused_alone));

    let variants = [(&reference, "reference"), (&fused, "all")]
        .into_iter()
        .map(|(exec, fusions)| {
            let plan = exec.plan(Mode::Decode, 1).ok_or("no decode plan")?;
            Ok(VariantFigures {
                fusions,
                plan_digest: plan.digest.clone(),
                plans_digest: exec.plans_digest().to_string(),
                launches_per_step: plan.compute_steps(),
                pool_bytes: plan.pool_bytes,
                live_lower_bound: plan.live_lower_bound,
            })
        })
        .collect::<R<Vec<_>>>()?;
    reference.free(backend).map_err(err)?;
    fused.free(backend).map_err(err)?;
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
        decode_logits: fused_alone,
    })
}

/// The exec of `case` under `policy` on `backend`: the default serve shape, and a KV cache
/// for every prompt of the widest multi-seq width.
pub fn build_exec(
    case: &Case,
    rules: &RuleSet,
    backend: &mut dyn GpuBackend,
    policy: Policy,
) -> R<CircuitExec> {
    let serve = ServeShape::default();
    let widest = serve.multi_seq_ladder.last().copied().unwrap_or(1);
    let tokens = case.prompt.len();
    let block_size = 16;
    let kv = KvShape {
        pages: (widest + 2) * tokens.div_ceil(block_size) + 2,
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
    };
    CircuitExec::build(backend, boot).map_err(|e| format!("{}: {e}", case.name))
}

/// Teacher-forced decode of `prompt`, one token per step: logits `[T * V]`.
pub fn decode_all(exec: &CircuitExec, backend: &mut dyn GpuBackend, prompt: &[u32]) -> R<Vec<f32>> {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let mut logits = Vec::with_capacity(prompt.len() * exec.config.vocab_size);
    for &token in prompt {
        logits.extend(session.decode(backend, id, token).map_err(err)?);
    }
    session.end_sequence(id).map_err(err)?;
    Ok(logits)
}

/// Every prompt in its own row, one token per step: each sequence's logits.
fn multi_seq(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    prompts: &[Vec<u32>],
) -> R<Vec<Vec<f32>>> {
    let mut session = Session::new(exec);
    let ids: Vec<_> = prompts.iter().map(|_| session.add_sequence()).collect();
    let mut logits = vec![Vec::new(); prompts.len()];
    for t in 0..prompts[0].len() {
        let batch: Vec<_> = ids.iter().zip(prompts).map(|(&id, p)| (id, p[t])).collect();
        for (out, l) in logits
            .iter_mut()
            .zip(session.multi_seq_step(backend, &batch).map_err(err)?)
        {
            out.extend(l);
        }
    }
    for id in ids {
        session.end_sequence(id).map_err(err)?;
    }
    Ok(logits)
}

/// `prompt` in verify steps of `k` tokens (the remainder through narrower programs).
fn verify_chunks(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    k: usize,
) -> R<Vec<f32>> {
    let mut session = Session::new(exec);
    let id = session.add_sequence();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(k) {
        let out = if chunk.len() == k {
            session.verify(backend, id, chunk)
        } else {
            session.prefill(backend, id, chunk)
        };
        logits.extend(out.map_err(err)?);
    }
    session.end_sequence(id).map_err(err)?;
    Ok(logits)
}
