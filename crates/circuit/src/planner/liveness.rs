//! Pass 2, liveness: which arena buffers a plan needs and from which step to which.
//!
//! Invariant: one [`Lifetime`] per kept arena edge; `first` is its writer's position in the
//! order, `last` its last reader's (or `first` when nothing reads it). Model-bound edges
//! (tokens, logits) and state edges are constraints outside the arena and get none.

use crate::fuser::{FusionPlan, GroupId};
use crate::ir::{Binding, Circuit, TensorId};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lifetime {
    pub tensor: TensorId,
    pub bytes: usize,
    pub writer: GroupId,
    /// Distinct reader groups, in order.
    pub readers: Vec<GroupId>,
    pub first: usize,
    pub last: usize,
}

pub fn liveness(circuit: &Circuit, fusion: &FusionPlan, order: &[GroupId]) -> Vec<Lifetime> {
    let mut position = vec![0usize; fusion.groups.len()];
    for (pos, g) in order.iter().enumerate() {
        position[g.0 as usize] = pos;
    }
    let mut lifetimes = Vec::new();
    for &writer in order {
        for &t in &fusion.group(writer).outputs {
            let tensor = circuit.tensor(t);
            if tensor.binding != Binding::Arena {
                continue;
            }
            let mut readers: Vec<GroupId> = circuit
                .consumers(t)
                .iter()
                .map(|n| fusion.group_of[n.0 as usize])
                .collect();
            readers.sort_by_key(|g| position[g.0 as usize]);
            readers.dedup();
            let first = position[writer.0 as usize];
            let last = readers
                .iter()
                .map(|g| position[g.0 as usize])
                .max()
                .unwrap_or(first);
            lifetimes.push(Lifetime {
                tensor: t,
                bytes: tensor.bytes(fusion.rows),
                writer,
                readers,
                first,
                last,
            });
        }
    }
    lifetimes
}
