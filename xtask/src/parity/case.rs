//! What one model's parity run is made of, shared by its parts (`execs`, `rows`, `claims`,
//! `mtp`, `run`): the case, the routing a run used, a mode row's figures, the route log, the
//! non-finite check, and the speculative check's lengths.

use std::collections::BTreeMap;

use solder_circuit::Mode;
use solder_config::ModelConfig;
use solder_model_layers::{CircuitExec, Session};

use super::diff::Diff;
use super::differs::{Differs, ProgramKey};
use super::golden::{non_finite, Golden};

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
