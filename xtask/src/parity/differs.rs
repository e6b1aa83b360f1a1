//! `differs` rules in parity (`--levers`): with a lever on, the all-rules routing may apply
//! rules whose numerics are `{ differs = "<lever>", tolerance = <rel> }`. Such a run cannot be
//! byte-identical to the reference, so its reference-vs-all-rules comparison is held to the
//! strictest applied rule's tolerance, relative to the largest |logit| of the reference's own
//! decodes; every other comparison (each sequence against itself decoded alone under the same
//! routing, graph replay against eager, the detection run, speculative decoding) stays byte
//! for byte, and the golden ratio is the lever-on routing's.
//!
//! Invariant: without a `differs` rule in any of the all-rules exec's plans, `Differs` is
//! absent and parity is exactly the byte-identity check.

use solder_circuit::Numerics;
use solder_model_layers::CircuitExec;

use super::run::Diff;

/// The `differs` rules an all-rules exec applied, and the bound they allow.
#[derive(Debug, Clone, PartialEq)]
pub struct Differs {
    /// Rule ids with their levers, `id (lever)`, sorted.
    pub rules: Vec<String>,
    /// The strictest applied rule's relative tolerance.
    pub tolerance: f64,
    /// max |logit| over the reference routing's decodes: what the tolerance is relative to.
    pub scale: f32,
}

impl Differs {
    /// The `differs` rules applied in any plan or route arm of `exec`; None when there are none.
    pub fn of(exec: &CircuitExec, scale: f32) -> Option<Differs> {
        let mut rules = Vec::new();
        let mut tolerance = f64::INFINITY;
        for plan in exec.plans.iter().chain(exec.arm_plans().map(|(_, p)| p)) {
            for group in &plan.fusion.groups {
                if let Numerics::Differs {
                    lever,
                    tolerance: t,
                } = &group.numerics
                {
                    let named = format!("{} ({lever})", group.rule);
                    if !rules.contains(&named) {
                        rules.push(named);
                    }
                    tolerance = tolerance.min(*t);
                }
            }
        }
        rules.sort();
        (!rules.is_empty()).then_some(Differs {
            rules,
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
