//! `differs` rules in parity (`--levers`): with a lever on, the all-rules routing may apply
//! rules whose numerics are `{ differs = "<lever>", tolerance = <rel> }`. Such a program cannot
//! be byte-identical to the reference, so a reference-vs-all-rules comparison is held to the
//! strictest tolerance of the `differs` rules applied **in the programs that comparison ran**
//! (`Differs::of_programs`), relative to the largest |logit| of the reference's own decodes;
//! every other comparison (each sequence against itself decoded alone under the same routing,
//! graph replay against eager, the detection run, speculative decoding) stays byte for byte,
//! and the golden ratio is the lever-on routing's. One exception, declared by the rule: a
//! `differs` rule with `by_chunk = true` sums a prompt's rows together (Gated DeltaNet's
//! chunked form), so a prompt fed in chunks cannot give the bytes of its rows decoded one at a
//! time; in a row whose programs applied one, that comparison too is held to the tolerance
//! (`ModeRow::vs_decode_ok`), and the report prints it on its own line.
//!
//! Invariants: a tolerance belongs to the rule that fired in a program, never to the lever: a
//! mode row whose programs apply no `differs` rule is byte identity, whatever other programs
//! of the exec apply. Without a `differs` rule in any of the all-rules exec's plans, `Differs`
//! is absent everywhere and parity is exactly the byte-identity check.

use solder_circuit::{ExecutionPlan, Mode, Numerics, RouteCondition};
use solder_model_layers::CircuitExec;

use super::diff::Diff;

/// The `differs` rules an all-rules exec applied, and the bound they allow.
#[derive(Debug, Clone, PartialEq)]
pub struct Differs {
    /// Rule ids with their levers, `id (lever)`, sorted.
    pub rules: Vec<String>,
    /// The rule ids among them declared `by_chunk`, sorted: where they apply, a prompt's
    /// chunks are compared with the prompt decoded alone within the tolerance, not byte for
    /// byte.
    pub by_chunk: Vec<String>,
    /// The strictest applied rule's relative tolerance.
    pub tolerance: f64,
    /// max |logit| over the reference routing's decodes: what the tolerance is relative to.
    pub scale: f32,
}

/// A program of an exec: (mode, rows, the route arm it is, if any), as `Session::last_program`
/// names the one a step ran.
pub type ProgramKey = (Mode, usize, Option<RouteCondition>);

/// The plans of `programs` in `exec` (a key the exec does not hold is skipped).
pub fn plans_of<'a>(
    exec: &'a CircuitExec,
    programs: &'a [ProgramKey],
) -> impl Iterator<Item = &'a ExecutionPlan> + 'a {
    programs
        .iter()
        .filter_map(move |&(mode, rows, arm)| match arm {
            None => exec.plan(mode, rows),
            Some(condition) => exec
                .arm_plans()
                .find(|(c, p)| *c == condition && p.mode == mode && p.rows == rows)
                .map(|(_, p)| p),
        })
}

impl Differs {
    /// The `differs` rules applied in any plan or route arm of `exec` (the report's summary
    /// line); None when there are none.
    pub fn of(exec: &CircuitExec, scale: f32) -> Option<Differs> {
        Differs::collect(
            exec.plans.iter().chain(exec.arm_plans().map(|(_, p)| p)),
            scale,
        )
    }

    /// The `differs` rules applied in `programs` of `exec`: the bound of a comparison that
    /// ran exactly those programs; None (byte identity) when they apply none.
    pub fn of_programs(exec: &CircuitExec, programs: &[ProgramKey], scale: f32) -> Option<Differs> {
        Differs::collect(plans_of(exec, programs), scale)
    }

    fn collect<'a>(plans: impl Iterator<Item = &'a ExecutionPlan>, scale: f32) -> Option<Differs> {
        let mut rules = Vec::new();
        let mut by_chunk = Vec::new();
        let mut tolerance = f64::INFINITY;
        for plan in plans {
            for group in &plan.fusion.groups {
                if let Numerics::Differs {
                    lever,
                    tolerance: t,
                    by_chunk: chunked,
                } = &group.numerics
                {
                    let named = format!("{} ({lever})", group.rule);
                    if !rules.contains(&named) {
                        rules.push(named);
                    }
                    if *chunked && !by_chunk.contains(&group.rule) {
                        by_chunk.push(group.rule.clone());
                    }
                    tolerance = tolerance.min(*t);
                }
            }
        }
        rules.sort();
        by_chunk.sort();
        (!rules.is_empty()).then_some(Differs {
            rules,
            by_chunk,
            tolerance,
            scale,
        })
    }

    /// The largest |reference − all rules| allowed.
    pub fn limit(&self) -> f32 {
        (self.tolerance * self.scale as f64) as f32
    }

    /// Whether `d` is within the limit (NaN never is).
    pub fn allows(&self, d: &Diff) -> bool {
        d.identical() || (d.max_abs.is_finite() && d.max_abs <= self.limit())
    }
}

/// The largest |logit| of `runs` (finite values only; 0 for none).
pub fn max_abs(runs: &[Vec<f32>]) -> f32 {
    runs.iter()
        .flatten()
        .filter(|x| x.is_finite())
        .fold(0.0f32, |m, x| m.max(x.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn differs() -> Differs {
        Differs {
            rules: vec!["r (fold_o_proj)".into()],
            by_chunk: Vec::new(),
            tolerance: 0.01,
            scale: 10.0,
        }
    }

    #[test]
    fn the_limit_is_relative_to_the_scale_and_nan_never_passes() {
        let d = differs();
        assert!((d.limit() - 0.1).abs() < 1e-7);
        assert!(d.allows(&Diff::NONE));
        let at = |max_abs| Diff {
            first_position: Some(0),
            max_abs,
        };
        assert!(d.allows(&at(0.05)));
        assert!(!d.allows(&at(0.2)));
        assert!(!d.allows(&at(f32::NAN)));
        assert!(!d.allows(&at(f32::INFINITY)));
    }

    #[test]
    fn max_abs_skips_non_finite_values() {
        assert_eq!(max_abs(&[vec![1.0, -3.0], vec![f32::NAN, 2.0]]), 3.0);
        assert_eq!(max_abs(&[]), 0.0);
    }
}
