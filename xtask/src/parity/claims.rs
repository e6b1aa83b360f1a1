//! Each mode row's numerics claim, judged per program: a row is held to the tolerance of the
//! `differs` rules applied in the all-rules programs it ran (`Differs::of_programs`), and a
//! row whose programs apply none must be byte-identical to the reference. When such a row
//! changes a byte, some `bit_identical` rule of those programs is wrong; `Blame::judge` names
//! it and its first launch.
//!
//! How the rule is found: each `bit_identical` rule of the row's programs, in launch order, is
//! taken out of the rule set, the all-rules exec rebuilt without it and the row's run
//! repeated; the first rule whose removal gives the reference's bytes is the one named. This
//! runs only when a row has already failed, so a passing parity pays nothing for it. The
//! launch named is that rule's first launch in the first program of the row that applies it
//! (the program's launches before it are rules the search cleared).
//!
//! Invariant: a row's `broken_claim` is set only when its `differs` is None and its
//! reference-vs-all-rules comparison is not byte-identical.

use solder_circuit::{Numerics, Policy, RuleSet};
use solder_gpu_runtime::GpuBackend;
use solder_model_layers::{CircuitExec, GraphPolicy};

use super::case::{Case, ModeRow, Routing};
use super::differs::{plans_of, Differs, ProgramKey};
use super::execs::build_exec;

type R<T> = Result<T, String>;

/// One run of a row under a routing: each sequence's logits.
pub type Rerun<'a> = dyn Fn(Routing, &mut dyn GpuBackend) -> R<Vec<Vec<f32>>> + 'a;

/// What judging a row needs: the case, its rules and the all-rules exec and policy.
pub struct Blame<'a> {
    pub case: &'a Case,
    pub rules: &'a RuleSet,
    pub policy: &'a Policy,
    pub exec: &'a CircuitExec,
    /// max |logit| of the reference decodes (what a `differs` tolerance is relative to).
    pub scale: f32,
}

/// A `bit_identical` rule applied in a row's programs, where it first launches.
struct Candidate {
    rule: String,
    /// `3 of 10 in decode rows 1 (`attn::paged_decode_o`, layer 0)`.
    launch: String,
}

impl Blame<'_> {
    /// Sets `row.differs` from `programs` (the all-rules programs the row ran) and, when the
    /// row then fails byte identity, `row.broken_claim`. `reference` is the row's reference
    /// logits per sequence, `rerun` repeats the row's all-rules run on another exec.
    pub fn judge(
        &self,
        row: &mut ModeRow,
        programs: &[ProgramKey],
        backend: &mut dyn GpuBackend,
        reference: &[Vec<f32>],
        rerun: &Rerun<'_>,
    ) -> R<()> {
        row.programs = programs.to_vec();
        row.differs = Differs::of_programs(self.exec, programs, self.scale);
        if row.differs.is_some() || row.ref_vs_fused.identical() {
            return Ok(());
        }
        let label = format!("{} rows {}", row.mode.as_str(), row.rows);
        let candidates = self.candidates(programs);
        for candidate in &candidates {
            if self.restores_bytes(&candidate.rule, backend, reference, rerun)? {
                // The launch's program is named only where it is not the row's own.
                let launch = candidate.launch.replace(&format!(" in {label} ("), " (");
                row.broken_claim = Some(format!(
                    "rule `{}` is bit_identical but changed bytes in {label}: first \
                     differing launch {launch} (without the rule the row is byte-identical)",
                    candidate.rule
                ));
                return Ok(());
            }
        }
        let named: Vec<&str> = candidates.iter().map(|c| c.rule.as_str()).collect();
        row.broken_claim = Some(format!(
            "{label} changed bytes under bit_identical rules only, and no single rule's \
             removal restores them (rules applied: {})",
            named.join(", ")
        ));
        Ok(())
    }

    /// The `bit_identical` rules of `programs`, each once, in launch order.
    fn candidates(&self, programs: &[ProgramKey]) -> Vec<Candidate> {
        let mut found: Vec<Candidate> = Vec::new();
        for plan in plans_of(self.exec, programs) {
            let total: usize = plan
                .order
                .iter()
                .map(|&g| plan.group(g).kernels.len())
                .sum();
            let mut launch = 0;
            for &id in &plan.order {
                let group = plan.group(id);
                if group.numerics == Numerics::BitIdentical
                    && !found.iter().any(|c| c.rule == group.rule)
                {
                    found.push(Candidate {
                        rule: group.rule.clone(),
                        launch: format!(
                            "{} of {total} in {} rows {} (`{}`{})",
                            launch + 1,
                            plan.mode.as_str(),
                            plan.rows,
                            group.kernels.join("`, `"),
                            group
                                .layer
                                .map_or(String::new(), |l| format!(", layer {l}"))
                        ),
                    });
                }
                launch += group.kernels.len();
            }
        }
        found
    }

    /// Whether the row's run, on an exec built without `rule`, gives `reference`'s bytes.
    fn restores_bytes(
        &self,
        rule: &str,
        backend: &mut dyn GpuBackend,
        reference: &[Vec<f32>],
        rerun: &Rerun<'_>,
    ) -> R<bool> {
        let mut without = self.rules.clone();
        without.rules.retain(|r| r.id != rule);
        let mut exec = match build_exec(self.case, &without, backend, self.policy.clone()) {
            Ok(exec) => exec,
            // A rule set this rule's removal cannot plan says nothing about the rule.
            Err(e) => {
                tracing::info!("without `{rule}`: {e}");
                return Ok(false);
            }
        };
        exec.set_graph_policy(GraphPolicy::Never);
        let routing = Routing {
            exec: &exec,
            fusions: "",
        };
        let ran = rerun(routing, backend);
        exec.free(backend).map_err(|e| e.to_string())?;
        let logits = ran?;
        Ok(logits.len() == reference.len()
            && logits.iter().zip(reference).all(|(a, b)| {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }))
    }
}
