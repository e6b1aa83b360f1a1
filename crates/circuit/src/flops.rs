//! Arithmetic: the floating-point operations each op of a plan must do (a multiply-add counts
//! two), read off the circuit, so a launch's bytes (`traffic`) and its FLOPs give its roofline
//! time — the slower of moving its bytes and doing its arithmetic.
//!
//! What an op must compute at `rows` rows:
//! - a matrix product (linear, LM head, router): `2 · rows · out · in` per weight matrix (a
//!   one-dimensional slot, a bias, adds nothing);
//! - stacked experts (MoE gate/up, down): `2 · rows · k · out · in` of one expert's matrix;
//! - attention: `4 · (heads · head_dim)` per (row, attended position) — `q·kᵀ` and `p·v`; a
//!   row of a sequence's step at position `context + i` attends `context + i + 1` positions,
//!   no more than its sliding window;
//! - the gated delta rule: 7 per element of a sequence's `[heads][key][value]` state per row
//!   (decay, `kᵀS`, the rank-one update, `qᵀS`).
//!
//! Not counted: element-wise ops, norms, rope, softmax and the conv update (a few operations
//! per activation element, well under 1% of a layer's products), and the exponentials.
//!
//! Invariant: pure arithmetic over the circuit; products saturate, never wrap.

use crate::ir::{Attr, Binding, Circuit, Op, StateKind};
use crate::ops::OpKind;

/// FLOPs `op` does at `rows` rows, `seqs` sequences each holding `context` tokens before
/// the step.
pub fn op_flops(circuit: &Circuit, op: &Op, rows: usize, seqs: usize, context: usize) -> u64 {
    match op.kind {
        OpKind::Linear | OpKind::LmHead | OpKind::Router => matrices(circuit, op)
            .map(|(elements, _)| mul(&[2, rows]).saturating_mul(elements))
            .fold(0, u64::saturating_add),
        OpKind::MoeGateUp | OpKind::MoeDown => {
            let k = int_attr(op, "k").unwrap_or(1);
            matrices(circuit, op)
                .map(|(elements, stacked)| {
                    let per_expert = elements / stacked.max(1) as u64;
                    mul(&[2, rows, k]).saturating_mul(per_expert)
                })
                .fold(0, u64::saturating_add)
        }
        OpKind::Attention => {
            let width = circuit.tensor(op.inputs[0]).shape.elements(1);
            let window = int_attr(op, "window").filter(|&w| w > 0);
            mul(&[4, width]).saturating_mul(attended(rows, seqs, context, window))
        }
        OpKind::GdnRecurrence => {
            let state = gdn_state(circuit, op).map_or(0, |(h, k, v)| mul(&[h, k, v]));
            mul(&[7, rows]).saturating_mul(state)
        }
        _ => 0,
    }
}

/// The (heads, key_dim, value_dim) of the recurrent state a gated-delta-rule op reads or
/// writes; None when it touches none.
pub(crate) fn gdn_state(circuit: &Circuit, op: &Op) -> Option<(usize, usize, usize)> {
    op.inputs
        .iter()
        .chain(&op.outputs)
        .find_map(|&t| match circuit.tensor(t).binding {
            Binding::State(s) => match circuit.states[s.0 as usize].kind {
                StateKind::GdnRecurrent {
                    heads,
                    key_dim,
                    value_dim,
                    ..
                } => Some((heads, key_dim, value_dim)),
                _ => None,
            },
            _ => None,
        })
}

/// Positions the step's rows attend in all: each of `seqs` sequences takes `rows / seqs`
/// consecutive rows after its `context` tokens, row `i` attending `context + i + 1`
/// positions (at most `window`).
pub fn attended(rows: usize, seqs: usize, context: usize, window: Option<usize>) -> u64 {
    let seqs = seqs.max(1);
    let per_seq = rows.div_ceil(seqs);
    let one: u64 = (1..=per_seq)
        .map(|i| {
            let span = context.saturating_add(i);
            window.map_or(span, |w| span.min(w)) as u64
        })
        .fold(0, u64::saturating_add);
    one.saturating_mul(seqs as u64)
}

/// Each weight matrix `op` reads: its elements and how many matrices it stacks (the experts
/// of a `[experts, out, in]` slot; 1 for a plain matrix).
fn matrices<'c>(circuit: &'c Circuit, op: &'c Op) -> impl Iterator<Item = (u64, usize)> + 'c {
    op.weights
        .iter()
        .map(|w| &circuit.weights[w.0 as usize])
        .filter(|slot| slot.shape.len() >= 2)
        .map(|slot| {
            let stacked = if slot.shape.len() >= 3 {
                slot.shape[0]
            } else {
                1
            };
            (mul(&slot.shape), stacked)
        })
}

fn int_attr(op: &Op, name: &str) -> Option<usize> {
    op.attrs
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| match v {
            Attr::Int(v) => usize::try_from(*v).ok(),
            Attr::Float(_) => None,
        })
}

fn mul(factors: &[usize]) -> u64 {
    factors
        .iter()
        .fold(1u64, |acc, &f| acc.saturating_mul(f as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verify_chunk_attends_its_context_and_the_causal_triangle() {
        // 4 rows of one sequence after 10 tokens: 11 + 12 + 13 + 14.
        assert_eq!(attended(4, 1, 10, None), 50);
        // 4 sequences of one row each: 11 apiece.
        assert_eq!(attended(4, 4, 10, None), 44);
        // A window of 12 caps the last two rows.
        assert_eq!(attended(4, 1, 10, Some(12)), 11 + 12 + 12 + 12);
    }
}
