//! Sizing reads of a circuit's op attributes (the widest heads, head_dim, projection widths):
//! the one place the scratch sizes (`attn::scratch_max`, `attn::fold::o_scratch_max`,
//! `gemv::split::slot_bytes`) and the counters reset read them. Emitters read an op's own
//! attributes through `View::u32`.

use solder_circuit::ir::{Attr, Circuit, Op};
use solder_circuit::OpKind;

/// `op`'s integer attribute `key`, when it is positive.
pub fn positive(op: &Op, key: &str) -> Option<u64> {
    op.attrs.iter().find_map(|(k, v)| match v {
        Attr::Int(v) if k == key && *v > 0 => Some(*v as u64),
        _ => None,
    })
}

/// The largest positive `key` of `circuit`'s ops of `kind` (with `role`, when given); 0 when
/// none has it.
pub fn widest(circuit: &Circuit, kind: OpKind, role: Option<&str>, key: &str) -> usize {
    circuit
        .ops
        .iter()
        .filter(|op| op.kind == kind && role.is_none_or(|r| op.role == r))
        .filter_map(|op| positive(op, key))
        .max()
        .unwrap_or(0) as usize
}
