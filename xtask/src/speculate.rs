//! `cargo xtask bench --speculative DRAFT --k K [--batch N]`: greedy speculative decoding of
//! the bench's model, drafted by DRAFT — `self` (the target drafting for itself: acceptance
//! 1.0, the mechanics and the best case), `random` (the same shape with other random weights:
//! acceptance near zero, the worst case), `mtp` (the model's own MTP head, qwen3_next only),
//! a synth name or a checkpoint folder (a draft model with the same vocabulary). With
//! `--batch N`, N sequences (each its own prompt) run together: plain decoding by multi-seq
//! steps, speculative decoding by `Session::speculative_step_many` (batched verify, and
//! batched drafting where the drafter has it: the MTP head drafts all N in one program per
//! draft step). Prints tokens per verify step, the acceptance rate per draft position, the
//! target steps saved against plain decoding, and tokens/s and ms per token both ways,
//! measured side by side in one run; every sequence's speculative tokens must equal plain
//! greedy's.

use std::path::PathBuf;
use std::time::Instant;

use solder_circuit::{Policy, RuleSet};
use solder_config::ServeShape;
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{
    greedy, Boot, CircuitExec, Drafter, KvShape, ModelDrafter, MtpDrafter, SeqId, Session,
    SessionError, WeightSource,
};

/// What drafts.
pub enum DraftSource {
    /// The target exec itself.
    Itself,
    /// The target's MTP head (its exec built with draft programs).
    Mtp,
    /// Another exec, built from these weights with the given config.
    Model {
        config: Box<solder_config::ModelConfig>,
        weights: WeightSource,
        name: String,
    },
}

impl DraftSource {
    /// `self`, `random` (the target's config, other random weights), `mtp`, a synth name or a
    /// checkpoint folder.
    pub fn parse(
        value: &str,
        target: &solder_config::ModelConfig,
        synth: impl Fn(&str) -> Result<solder_config::ModelConfig, String>,
    ) -> Result<DraftSource, String> {
        Ok(match value {
            "self" => DraftSource::Itself,
            "mtp" => DraftSource::Mtp,
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
                    format!("`--speculative {other}`: not self, random, mtp, a checkpoint folder or a synth model ({e})")
                })?),
                weights: WeightSource::Random { seed: 7 },
                name: other.to_string(),
            },
        })
    }
}

/// The serve shape a speculative bench of `batch` sequences at draft length `k` compiles:
/// the multi-seq ladder up to `batch`, batched-verify widths doubling from 4 until one holds
/// `batch · (k + 1)` rows (none for one sequence: it runs the verify programs), and with the
/// MTP head, draft programs at one row and at every ladder width (a draft step of several
/// sequences runs them all in one).
pub fn serve(batch: usize, k: usize, mtp: bool) -> Result<ServeShape, String> {
    let mut serve = ServeShape::with_max_batch(batch).map_err(|e| e.to_string())?;
    if batch > 1 {
        let rows = batch * (k + 1);
        let mut widths = vec![4];
        while widths[widths.len() - 1] < rows {
            widths.push(widths[widths.len() - 1] * 2);
        }
        serve.verify_batch_widths = widths;
    }
    if mtp {
        serve.draft_widths = std::iter::once(1)
            .chain(serve.multi_seq_ladder.iter().copied())
            .collect();
    }
    Ok(serve)
}

/// The drafter a run uses: a draft model's (or the target's own) decoding, or the MTP head,
/// which must see every target step's hidden rows (so it prefills).
enum AnyDrafter<'e> {
    Model(ModelDrafter<'e>),
    Mtp(MtpDrafter<'e>),
}

impl AnyDrafter<'_> {
    fn prefill(
        &mut self,
        backend: &mut dyn GpuBackend,
        session: &mut Session<'_>,
        id: SeqId,
        prompt: &[u32],
    ) -> Result<Vec<f32>, SessionError> {
        match self {
            AnyDrafter::Model(_) => session.prefill(backend, id, prompt),
            AnyDrafter::Mtp(head) => head.prefill(backend, session, id, prompt),
        }
    }

    fn drafter(&mut self) -> &mut dyn Drafter {
        match self {
            AnyDrafter::Model(d) => d,
            AnyDrafter::Mtp(d) => d,
        }
    }
}

/// Acceptance per draft position, summed over sequences and steps.
#[derive(Default)]
struct Tally {
    /// Sequence-steps (each sequence's verify step counts once).
    seq_steps: usize,
    /// Position i was judged when every earlier one was accepted.
    reached: Vec<usize>,
    accepted_at: Vec<usize>,
    proposed: usize,
    accepted: usize,
}

impl Tally {
    fn record(&mut self, k: usize, accepted: usize) {
        self.reached.resize(k.max(self.reached.len()), 0);
        self.accepted_at.resize(k.max(self.accepted_at.len()), 0);
        self.seq_steps += 1;
        self.proposed += k;
        self.accepted += accepted;
        for i in 0..k.min(accepted + 1) {
            self.reached[i] += 1;
            if i < accepted {
                self.accepted_at[i] += 1;
            }
        }
    }
}

/// Runs plain greedy decoding and speculative decoding of `gen` tokens after each of
/// `prompts` (one sequence each, all together), side by side, and prints the figures.
#[allow(clippy::too_many_arguments)]
pub fn run(
    backend: &mut dyn GpuBackend,
    target: &CircuitExec,
    source: DraftSource,
    rules: &RuleSet,
    kv: KvShape,
    prompts: &[Vec<u32>],
    gen: usize,
    k: usize,
    name: &str,
) -> Result<(), String> {
    let err = |e: SessionError| e.to_string();
    let batch = prompts.len();
    let mtp = matches!(source, DraftSource::Mtp);
    let (draft_exec, draft_name) = build_draft(backend, target, source, rules, kv)?;
    let drafts_on = draft_exec.as_ref().unwrap_or(target);

    // Plain greedy decoding: the reference tokens and time.
    let mut session = Session::new(target);
    let (want, plain_s) = plain_decode(&mut session, backend, prompts, gen)?;

    // Speculative: the same prefixes and count.
    let mut drafter = if mtp {
        AnyDrafter::Mtp(MtpDrafter::new(target).map_err(err)?)
    } else {
        AnyDrafter::Model(ModelDrafter::new(drafts_on))
    };
    let ids: Vec<SeqId> = prompts.iter().map(|_| session.add_sequence()).collect();
    let mut got: Vec<Vec<u32>> = Vec::with_capacity(batch);
    for (&id, prompt) in ids.iter().zip(prompts) {
        drafter
            .prefill(backend, &mut session, id, prompt)
            .map_err(err)?;
        got.push(vec![want[got.len()][0]]);
    }
    let mut tally = Tally::default();
    let mut verify_steps = 0usize;
    let mut live: Vec<usize> = (0..batch).collect();
    let t = Instant::now();
    while !live.is_empty() {
        let steps = if batch == 1 {
            let pending = *got[0].last().ok_or("a step emits a token")?;
            let step = session.speculative_step(backend, ids[0], pending, k, drafter.drafter());
            vec![step.map_err(err)?]
        } else {
            let mut entries = Vec::with_capacity(live.len());
            for &i in &live {
                entries.push((ids[i], *got[i].last().ok_or("a step emits a token")?, k));
            }
            session
                .speculative_step_many(backend, &entries, drafter.drafter())
                .map_err(err)?
        };
        verify_steps += 1;
        for (&i, step) in live.iter().zip(steps) {
            tally.record(k, step.accepted);
            got[i].extend(&step.tokens);
        }
        live.retain(|&i| got[i].len() <= gen);
    }
    let spec_s = t.elapsed().as_secs_f64();
    let fed: usize = got.iter().map(|g| g.len() - 1).sum();
    for (i, (got, want)) in got.iter_mut().zip(&want).enumerate() {
        got.truncate(gen + 1);
        if got != want {
            return Err(format!(
                "sequence {i}: speculative decoding's tokens differ from plain greedy decoding's"
            ));
        }
    }
    for &id in &ids {
        drafter.drafter().forget(id);
    }
    report(
        name,
        &draft_name,
        (k, batch, gen),
        &tally,
        verify_steps,
        fed,
        (plain_s, spec_s),
    );
    drop(drafter);
    drop(session);
    if let Some(mut exec) = draft_exec {
        exec.free(backend).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Prints the figures of a run: `fed` tokens in `spec_s` seconds against `batch · gen` plain
/// ones in `plain_s`.
fn report(
    name: &str,
    draft_name: &str,
    (k, batch, gen): (usize, usize, usize),
    tally: &Tally,
    verify_steps: usize,
    fed: usize,
    (plain_s, spec_s): (f64, f64),
) {
    let plain_tokens = (batch * gen) as f64;
    let (plain_tps, spec_tps) = (plain_tokens / plain_s, fed as f64 / spec_s);
    let rates = acceptance_rates(&tally.reached, &tally.accepted_at);
    let per_step = fed as f64 / tally.seq_steps as f64;
    let acceptance = tally.accepted as f64 / tally.proposed.max(1) as f64;
    eprintln!(
        "plain decode {plain_tps:.1} tokens/s; speculative {spec_tps:.1} tokens/s ({batch} sequence(s), \
         k {k}, acceptance {acceptance:.3})"
    );
    println!(
        "solder speculative: model={name} draft={draft_name} k={k} batch={batch} gen_tokens={fed} \
         verify_steps={verify_steps} tokens_per_verify_step={per_step:.3} acceptance={acceptance:.3} \
         acceptance_by_position={} target_steps_saved={:.3} plain_tok_per_s={plain_tps:.2} \
         speculative_tok_per_s={spec_tps:.2} plain_ms_per_token={:.3} \
         speculative_ms_per_token={:.3} tokens_match=yes",
        rates.join(","),
        1.0 - tally.seq_steps as f64 / fed as f64,
        plain_s * 1e3 / plain_tokens,
        spec_s * 1e3 / fed as f64,
    );
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
        DraftSource::Mtp => {
            if !target.has_draft_head() {
                return Err(format!(
                    "`--speculative mtp`: {} has no MTP draft head (qwen3_next only)",
                    target.instance.circuit.name
                ));
            }
            "mtp".to_string()
        }
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

/// Plain greedy decoding of `gen` tokens after each of `prompts`, one sequence each, all in
/// one multi-seq step per token (decode for one): each sequence's first token and the `gen`
/// after it, and the seconds the `gen` steps took.
fn plain_decode(
    session: &mut Session<'_>,
    backend: &mut dyn GpuBackend,
    prompts: &[Vec<u32>],
    gen: usize,
) -> Result<(Vec<Vec<u32>>, f64), String> {
    let err = |e: SessionError| e.to_string();
    let vocab = session.exec().config.vocab_size;
    let mut ids = Vec::with_capacity(prompts.len());
    let mut want = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let id = session.add_sequence();
        let logits = session.prefill(backend, id, prompt).map_err(err)?;
        want.push(vec![greedy(&logits[(prompt.len() - 1) * vocab..])]);
        ids.push(id);
    }
    let t = Instant::now();
    for _ in 0..gen {
        let next: Vec<u32> = if let [id] = ids[..] {
            let token = want[0][want[0].len() - 1];
            vec![greedy(&session.decode(backend, id, token).map_err(err)?)]
        } else {
            let batch: Vec<(SeqId, u32)> = ids
                .iter()
                .zip(&want)
                .map(|(&id, w)| (id, w[w.len() - 1]))
                .collect();
            let logits = session.multi_seq_step(backend, &batch).map_err(err)?;
            logits.iter().map(|l| greedy(l)).collect()
        };
        for (w, token) in want.iter_mut().zip(next) {
            w.push(token);
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    for id in ids {
        session.end_sequence(id).map_err(err)?;
    }
    Ok((want, seconds))
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

#[cfg(test)]
mod tests {
    use super::serve;
    use solder_config::ServeShape;

    #[test]
    fn a_batch_gets_verify_and_draft_widths_that_hold_it() {
        let shape = serve(4, 2, true).unwrap();
        assert_eq!(shape.multi_seq_ladder, [2, 4]);
        // 4 sequences of 3 rows: 12 rows, held by 16.
        assert_eq!(shape.verify_batch_widths, [4, 8, 16]);
        assert_eq!(shape.draft_widths, [1, 2, 4]);
        // One sequence without a head: the bench's shape before batches.
        assert_eq!(
            serve(1, 4, false).unwrap(),
            ServeShape::with_max_batch(1).unwrap()
        );
        assert_eq!(serve(1, 4, true).unwrap().draft_widths, [1]);
    }
}
