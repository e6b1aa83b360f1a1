//! Runtime routes: alternative plans for the same (mode, rows), selected per step by a
//! condition on the step's state (DESIGN.md, "Runtime routes").
//!
//! An arm is built like any plan, with the route's capability added to the available set,
//! so only rules that `require` it (e.g. `route:gdn_even_pitch`) can tell an arm from its
//! primary. Invariant: an arm's rules are `bit_identical` to what they replace, so choosing an
//! arm never changes a logit; the condition only says when the arm's kernels are valid.

use crate::ir::Circuit;
use crate::mode::Mode;
use crate::ops::OpKind;

/// Every route condition, in declaration order.
pub const ALL_CONDITIONS: &[RouteCondition] = &[RouteCondition::GdnEvenPitch];

/// The capabilities of every route (what a rule's `requires` may name).
pub fn capabilities() -> Vec<&'static str> {
    ALL_CONDITIONS.iter().map(|c| c.capability()).collect()
}

/// A condition a step's state can meet, enabling an arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteCondition {
    /// Every row's recurrent-state slot is `slots[0] + r * pitch` for one pitch >= 1: the
    /// recurrence can address the states as one strided batch instead of gathering by slot.
    GdnEvenPitch,
}

impl RouteCondition {
    /// The capability an arm's rules `require`.
    pub fn capability(self) -> &'static str {
        match self {
            RouteCondition::GdnEvenPitch => "route:gdn_even_pitch",
        }
    }

    /// Whether the step's per-row state slots meet the condition.
    pub fn holds(self, slots: &[u32]) -> bool {
        match self {
            RouteCondition::GdnEvenPitch => match slots {
                [] | [_] => false,
                [first, second, ..] => {
                    let pitch = i64::from(*second) - i64::from(*first);
                    pitch >= 1
                        && slots
                            .iter()
                            .enumerate()
                            .all(|(r, &s)| i64::from(s) == i64::from(*first) + r as i64 * pitch)
                }
            },
        }
    }
}

/// The routes a circuit's plans in `mode` may take.
pub fn routes(circuit: &Circuit, mode: Mode) -> Vec<RouteCondition> {
    let recurrent = circuit
        .ops
        .iter()
        .any(|op| op.kind == OpKind::GdnRecurrence);
    if recurrent && mode == Mode::MultiSeq {
        vec![RouteCondition::GdnEvenPitch]
    } else {
        Vec::new()
    }
}
