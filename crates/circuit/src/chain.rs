//! Dependent chains: the longest run of operations one thread of a launch must do one after
//! another, each waiting on the one before — a latency floor that neither bandwidth nor more
//! blocks lift, and that bytes and FLOPs (`traffic`, `flops`) do not see. Read off the circuit
//! and the kernels the plan chose.
//!
//! Counted: the gated delta rule, whose state carries from row to row of a sequence.
//! - Row by row (`gdn::recurrence`, `gdn::gates_recurrence` and their pitched forms): a thread
//!   walks its sequence's rows in order, each a pass over its state column: `rows per sequence
//!   · key_dim` dependent steps.
//! - The chunked form (`CHUNKED_KERNELS`, chunks of `GDN_CHUNK` rows L): its chunks in order,
//!   each `2 · key_dim` (a pair dot, the chunk's first state's product) + `L(L − 1)/2` (the
//!   substitution) + `4L` (outputs and the state update) + `L − 1` (the gates' running sum).
//!
//! Not counted: every other kernel, whose chains (a dot's segment, a softmax, a conv's taps)
//! are short beside its bytes.
//!
//! A step costs `CYCLES_PER_STEP` cycles at `CLOCK_GHZ` (`chain_us`): a dependent FMA's latency
//! on an H200. The chain is an estimate of a floor, not a timing.

use crate::flops::gdn_state;
use crate::ir::{Circuit, Op};
use crate::ops::OpKind;

/// The kernels that run the gated delta rule in chunks (rules `gdn_chunked`,
/// `gdn_gates_chunked` and their `_tensor_cores` forms). The tensor cores' form is counted as
/// the CUDA cores': a product's k steps are one warp's chain of `mma.sync`, as long as a
/// thread's dot; what it shortens is the issue of the chunk's FLOPs, which a chain does not
/// count.
pub const CHUNKED_KERNELS: [&str; 4] = [
    "gdn::chunked",
    "gdn::gates_chunked",
    "gdn::chunked_mma",
    "gdn::gates_chunked_mma",
];
/// Rows per chunk of the chunked form (gdn.cu `GDN_CHUNK`).
pub const GDN_CHUNK: usize = 16;
/// Cycles one dependent step costs: a dependent FMA's latency on sm_90.
pub const CYCLES_PER_STEP: f64 = 4.0;
/// The clock chains are timed at: an H200's SM boost clock, GHz.
pub const CLOCK_GHZ: f64 = 1.98;

/// The dependent steps of `op`'s longest chain at `rows` rows of `seqs` sequences, run by a
/// launch of `kernels`; 0 for an op whose chain is not counted.
pub fn op_chain(circuit: &Circuit, op: &Op, rows: usize, seqs: usize, kernels: &[String]) -> u64 {
    if op.kind != OpKind::GdnRecurrence {
        return 0;
    }
    let Some((_, key_dim, _)) = gdn_state(circuit, op) else {
        return 0;
    };
    let per_seq = rows.div_ceil(seqs.max(1)) as u64;
    let chunked = kernels
        .iter()
        .any(|k| CHUNKED_KERNELS.contains(&k.as_str()));
    if chunked {
        let l = GDN_CHUNK as u64;
        let per_chunk = 2 * key_dim as u64 + l * (l - 1) / 2 + 4 * l + (l - 1);
        per_seq.div_ceil(l).saturating_mul(per_chunk)
    } else {
        per_seq.saturating_mul(key_dim as u64)
    }
}

/// Microseconds `steps` dependent steps take at `CYCLES_PER_STEP` and `CLOCK_GHZ`.
pub fn chain_us(steps: u64) -> f64 {
    steps as f64 * CYCLES_PER_STEP / (CLOCK_GHZ * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_of_a_thousand_steps_takes_about_two_microseconds() {
        assert!((chain_us(1000) - 2.0202).abs() < 1e-3);
        assert_eq!(chain_us(0), 0.0);
    }
}
