//! Speculative decoding in parity: greedy speculative steps, for several k and drafters that
//! always agree (the target model drafting for itself), never agree (its drafts moved by one)
//! and agree at random, must give exactly the tokens and logits bytes of plain greedy
//! decoding from the same prefix.

use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{greedy, CircuitExec, Drafter, ModelDrafter, Session};

/// The test drafters, shared with model-layers' tests (one copy, public API only).
#[path = "../../../crates/model-layers/tests/exec_support/drafters.rs"]
mod drafters;
use drafters::{Bend, Bent};

/// The k each case runs (k + 1 must fit the widest verify program, 8).
pub const KS: [usize; 4] = [1, 2, 4, 7];

/// What the speculative runs of one case found.
#[derive(Debug, Clone, Default)]
pub struct SpecFigures {
    /// Runs (k × drafter) and the tokens each generated.
    pub runs: usize,
    pub tokens: usize,
    /// Drafts proposed and accepted, per drafter, in `DRAFTERS` order.
    pub proposed: [usize; 3],
    pub accepted: [usize; 3],
    /// Every run whose tokens or logits differ from plain greedy decoding.
    pub failures: Vec<String>,
    /// Why nothing ran (a model with too few positions for a prefix and a verify step).
    pub skipped: Option<String>,
}

impl SpecFigures {
    pub fn passes(&self) -> bool {
        self.failures.is_empty() && (self.runs > 0 || self.skipped.is_some())
    }
}

pub const DRAFTERS: [&str; 3] = ["agrees", "never", "random"];

type R<T> = Result<T, String>;

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Greedy from `prefix`, `gen` tokens: plain decoding, then every k and drafter.
pub fn check(
    exec: &CircuitExec,
    backend: &mut dyn GpuBackend,
    prefix: &[u32],
    gen: usize,
) -> R<SpecFigures> {
    let vocab = exec.config.vocab_size;
    if gen == 0 {
        return Ok(SpecFigures {
            skipped: Some(format!(
                "max_position_embeddings {} leaves no room past a prefix of {} and a verify step",
                exec.config.max_position_embeddings,
                prefix.len()
            )),
            ..SpecFigures::default()
        });
    }
    let (want_tokens, want_logits) = {
        let mut session = Session::new(exec);
        let id = session.add_sequence();
        let logits = session.prefill(backend, id, prefix).map_err(err)?;
        let mut token = greedy(&logits[(prefix.len() - 1) * vocab..]);
        let mut tokens = vec![token];
        let mut all = Vec::with_capacity(gen * vocab);
        for _ in 0..gen {
            let logits = session.decode(backend, id, token).map_err(err)?;
            token = greedy(&logits);
            tokens.push(token);
            all.extend(logits);
        }
        (tokens, all)
    };
    let mut figures = SpecFigures::default();
    for k in KS {
        for (mode, name) in DRAFTERS.iter().enumerate() {
            // The target drafting for itself, its drafts as is, all moved by one, or each
            // moved with probability 1/2 from a seed of k.
            let bend = [Bend::None, Bend::Always, Bend::Random(k as u64)][mode];
            let mut drafter = Bent {
                inner: ModelDrafter::new(exec),
                bend,
            };
            let mut session = Session::new(exec);
            let id = session.add_sequence();
            let logits = session.prefill(backend, id, prefix).map_err(err)?;
            let mut pending = greedy(&logits[(prefix.len() - 1) * vocab..]);
            let mut tokens = vec![pending];
            let mut all: Vec<f32> = Vec::with_capacity((gen + k) * vocab);
            while all.len() < gen * vocab {
                let step = session
                    .speculative_step(backend, id, pending, k, &mut drafter)
                    .map_err(|e| format!("k {k}, drafter {name}: {e}"))?;
                figures.proposed[mode] += step.proposed;
                figures.accepted[mode] += step.accepted;
                tokens.extend(&step.tokens);
                all.extend(&step.logits);
                pending = *step.tokens.last().ok_or("a step emits a token")?;
            }
            all.truncate(gen * vocab);
            tokens.truncate(gen + 1);
            drafter.forget(id);
            figures.runs += 1;
            figures.tokens += gen;
            let same_logits = all
                .iter()
                .zip(&want_logits)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            if tokens != want_tokens || !same_logits {
                figures.failures.push(format!(
                    "k {k}, drafter {name}: {} differ from plain greedy decoding",
                    if tokens != want_tokens {
                        "tokens"
                    } else {
                        "logits bytes"
                    }
                ));
            }
        }
    }
    Ok(figures)
}
