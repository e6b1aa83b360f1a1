//! `cargo xtask bench --speculative DRAFT --k K`: greedy speculative decoding of the bench's
//! model, drafted by DRAFT — `self` (the target drafting for itself: acceptance 1.0, the
//! mechanics and the best case), `random` (the same shape with other random weights:
//! acceptance near zero, the worst case), a synth name or a checkpoint folder (a draft model
//! with the same vocabulary). Prints tokens per verify step, the acceptance rate per draft
//! position, the target steps saved against plain decoding, and ms per token both ways,
//! measured side by side in one run; the speculative tokens must equal plain greedy's.

use std::path::PathBuf;
use std::time::Instant;

use solder_circuit::{Policy, RuleSet};
use solder_config::ServeShape;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{
    greedy, Boot, CircuitExec, Drafter, KvShape, ModelDrafter, Session, WeightSource,
};

/// What drafts.
pub enum DraftSource {
    /// The target exec itself.
    Itself,
    /// Another exec, built from these weights with the given config.
    Model {
        config: Box<solder_config::ModelConfig>,
        weights: WeightSource,
        name: String,
    },
}

impl DraftSource {
    /// `self`, `random` (the target's config, other random weights), a synth name or a
    /// checkpoint folder.
    pub fn parse(
        value: &str,
        target: &solder_config::ModelConfig,
        synth: impl Fn(&str) -> Result<solder_config::ModelConfig, String>,
    ) -> Result<DraftSource, String> {
        Ok(match value {
            "self" => DraftSource::Itself,
            "random" => DraftSource::Model {
                config: Box::new(target.clone()),
                weights: WeightSource::Random { seed: 0xd2af7 },
                name: "random".into(),
            },
            other if PathBuf::from(other).join("config.json").is_file() => {
                let dir = PathBuf::from(other);
                DraftSource::Model {
                    config: Box::new(crate::files::model_config(&dir.join("config.json"))?),
                    weights: WeightSource::Checkpoint(dir),
                    name: other.to_string(),
                }
            }
            other => DraftSource::Model {
                config: Box::new(synth(other).map_err(|e| {
                    format!("`--speculative {other}`: not self, random, a checkpoint folder or a synth model ({e})")
                })?),
                weights: WeightSource::Random { seed: 7 },
                name: other.to_string(),
            },
        })
    }
}

/// Runs plain greedy decoding and speculative decoding of `gen` tokens after `prompt`, side
/// by side, and prints the figures.
#[allow(clippy::too_many_arguments)]
pub fn run(
    backend: &mut dyn GpuBackend,
    target: &CircuitExec,
    source: DraftSource,
    rules: &RuleSet,
    kv: KvShape,
    prompt: &[u32],
    gen: usize,
    k: usize,
    name: &str,
) -> Result<(), String> {
    let err = |e: solder_model_layers::SessionError| e.to_string();
    let (draft_exec, draft_name) = build_draft(backend, target, source, rules, kv)?;
    let drafts_on = draft_exec.as_ref().unwrap_or(target);

    // Plain greedy decoding: the reference tokens and time.
    let mut session = Session::new(target);
    let (want, plain_ms) = plain_decode(&mut session, backend, prompt, gen)?;
    let first = want[0];

    // Speculative: the same prefix and count.
    let mut drafter = ModelDrafter::new(drafts_on);
    let spec = session.add_sequence();
    session.prefill(backend, spec, prompt).map_err(err)?;
    let mut got = vec![first];
    let mut pending = first;
    let mut verify_steps = 0usize;
    let mut reached = vec![0usize; k];
    let mut accepted_at = vec![0usize; k];
    let t = Instant::now();
    while got.len() <= gen {
        let step = session
            .speculative_step(backend, spec, pending, k, &mut drafter)
            .map_err(err)?;
        verify_steps += 1;
        // Position i was judged when every earlier one was accepted.
        for i in 0..k.min(step.accepted + 1) {
            reached[i] += 1;
            if i < step.accepted {
                accepted_at[i] += 1;
            }
        }
        got.extend(&step.tokens);
        pending = *step.tokens.last().ok_or("a step emits a token")?;
    }
    let fed = got.len() - 1;
    let spec_ms = t.elapsed().as_secs_f64() * 1e3 / fed as f64;
    drafter.forget(spec);
    got.truncate(gen + 1);
    if got != want {
        return Err("speculative decoding's tokens differ from plain greedy decoding's".into());
    }
    let rates = acceptance_rates(&reached, &accepted_at);
    let per_step = fed as f64 / verify_steps as f64;
    eprintln!(
        "plain decode {plain_ms:.2} ms/token; speculative {spec_ms:.2} ms/token ({} draft steps per verify step)",
        k
    );
    println!(
        "solder speculative: model={name} draft={draft_name} k={k} gen_tokens={fed} verify_steps={verify_steps} \
         tokens_per_verify_step={per_step:.3} acceptance_by_position={} target_steps_saved={:.3} \
         plain_ms_per_token={plain_ms:.3} speculative_ms_per_token={spec_ms:.3} tokens_match=yes",
        rates.join(","),
        1.0 - verify_steps as f64 / fed as f64
    );
    drop(drafter);
    drop(session);
    if let Some(mut exec) = draft_exec {
        exec.free(backend).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// The draft model's exec (none when the target drafts for itself) and its name; a draft
/// model's vocabulary must be the target's.
fn build_draft(
    backend: &mut dyn GpuBackend,
    target: &CircuitExec,
    source: DraftSource,
    rules: &RuleSet,
    kv: KvShape,
) -> Result<(Option<CircuitExec>, String), String> {
    let mut draft_exec = None;
    let draft_name = match source {
        DraftSource::Itself => "self".to_string(),
        DraftSource::Model {
            config,
            weights,
            name,
        } => {
            if config.vocab_size != target.config.vocab_size {
                return Err(format!(
                    "draft model {name} has a vocabulary of {}, the target {}: they must be the same",
                    config.vocab_size, target.config.vocab_size
                ));
            }
            let boot = Boot {
                config: *config,
                serve: ServeShape::with_max_batch(1).map_err(|e| e.to_string())?,
                rules: rules.clone(),
                policy: Policy::default(),
                weights,
                kv,
                precision: Default::default(),
            };
            let t = Instant::now();
            draft_exec = Some(CircuitExec::build(backend, boot).map_err(|e| e.to_string())?);
            eprintln!("built draft {name} in {:.1} s", t.elapsed().as_secs_f64());
            name
        }
    };
    Ok((draft_exec, draft_name))
}

/// Plain greedy decoding of `gen` tokens after `prompt` on a sequence of its own: the first
/// token and the `gen` after it, and the milliseconds per decoded token.
fn plain_decode(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    prompt: &[u32],
    gen: usize,
) -> Result<(Vec<u32>, f64), String> {
    let err = |e: solder_model_layers::SessionError| e.to_string();
    let vocab = session.exec().config.vocab_size;
    let plain = session.add_sequence();
    let logits = session.prefill(backend, plain, prompt).map_err(err)?;
    let first = greedy(&logits[(prompt.len() - 1) * vocab..]);
    let mut want = vec![first];
    let t = Instant::now();
    let mut token = first;
    for _ in 0..gen {
        token = greedy(&session.decode(backend, plain, token).map_err(err)?);
        want.push(token);
    }
    let plain_ms = t.elapsed().as_secs_f64() * 1e3 / gen as f64;
    session.end_sequence(plain).map_err(err)?;
    Ok((want, plain_ms))
}

/// Per draft position `i+1:rate`, the share of the times it was judged that it was accepted
/// (`-` where never judged).
fn acceptance_rates(reached: &[usize], accepted_at: &[usize]) -> Vec<String> {
    reached
        .iter()
        .zip(accepted_at)
        .enumerate()
        .map(|(i, (&r, &a))| {
            if r == 0 {
                format!("{}:-", i + 1)
            } else {
                format!("{}:{:.2}", i + 1, a as f64 / r as f64)
            }
        })
        .collect()
}
