//! Compulsory traffic: the bytes each launch of a plan must move between DRAM and the chip,
//! read off the plan and the circuit (tensor shapes, dtypes, which weights a group reads, the
//! state it touches), and the step's bandwidth floor at a given rate.
//!
//! What a launch must move:
//! - weights: every slot its nodes read, once per launch (a slot two nodes of one group read
//!   counts once), in its storage format (a quantized slot's values, scales and zeros:
//!   `WeightSlot::bytes`); an embedding gathers one table row per row; a stacked expert slot is read
//!   for `min(experts, rows * k)` experts (every row's top-k on distinct experts);
//! - activations: its inputs from outside the group and its kept outputs (arena edges, the
//!   tokens, the logits), at the plan's rows; fused edges move nothing;
//! - state: a KV write writes its rows' K and V; an attention reads the KV of every token its
//!   sequences hold after the step (`context` before it plus the step's own), once per
//!   sequence; a recurrent state is read and written once per sequence slot, and a plan that
//!   keeps snapshots (`ExecutionPlan::keeps_snapshots`: verify and batched verify up to the
//!   serve's `speculative_rows`) also writes one per row. That is a speculative step's traffic,
//!   the most the program moves: the same program run for a prompt's chunk or a mixed step
//!   writes no snapshot (its rows' keep-snapshots flags are 0, `MetaField::KeepSnapshots`);
//! - metadata: each field its nodes read (i32 per row; block tables one entry per page a
//!   row's sequence holds).
//!
//! Not counted: rope's inv_freq (a few hundred bytes the layout appends), the attention
//! scratch (flash-decoding partials live in L2), and re-reads a kernel makes of its own bytes.
//! Sequences: decode, verify and draft steps hold one; multi_seq and verify_batch one per row.
//!
//! Invariant: pure arithmetic over the plan and the circuit; sums saturate, never wrap.

use std::collections::BTreeSet;

use crate::format::WeightFormat;
use crate::fuser::GroupId;
use crate::ir::{Binding, Circuit, MetaField, StateKind, WeightId};
use crate::mode::Mode;
use crate::ops::OpKind;
use crate::plan::ExecutionPlan;

/// The bytes one launch (one group of the plan) must move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchTraffic {
    pub group: GroupId,
    pub rule: String,
    /// The group's kernels (`module::func`).
    pub kernels: Vec<String>,
    pub layer: Option<u32>,
    pub weights_read: u64,
    /// `weights_read` split by the slots' storage format, in first-read order.
    pub weights_by_format: Vec<(WeightFormat, u64)>,
    pub activations_read: u64,
    pub activations_written: u64,
    pub state_read: u64,
    pub state_written: u64,
    pub meta_read: u64,
    /// The arithmetic its ops must do (`crate::flops`).
    pub flops: u64,
    /// The dependent steps of its longest chain (`crate::chain`).
    pub chain: u64,
}

impl LaunchTraffic {
    pub fn read(&self) -> u64 {
        self.weights_read
            .saturating_add(self.activations_read)
            .saturating_add(self.state_read)
            .saturating_add(self.meta_read)
    }

    pub fn written(&self) -> u64 {
        self.activations_written.saturating_add(self.state_written)
    }

    pub fn total(&self) -> u64 {
        self.read().saturating_add(self.written())
    }

    /// Microseconds to move `total` bytes at `bytes_per_s`.
    pub fn floor_us(&self, bytes_per_s: f64) -> f64 {
        floor_us(self.total(), bytes_per_s)
    }

    /// The launch's roofline: the slower of moving its bytes at `bytes_per_s` and doing its
    /// FLOPs at `flops_per_s`, microseconds.
    pub fn roofline_us(&self, bytes_per_s: f64, flops_per_s: f64) -> f64 {
        self.floor_us(bytes_per_s)
            .max(floor_us(self.flops, flops_per_s))
    }

    /// Microseconds its longest dependent chain takes (`crate::chain::chain_us`).
    pub fn chain_us(&self) -> f64 {
        crate::chain::chain_us(self.chain)
    }

    /// The slower of its roofline and its chain, microseconds.
    pub fn bound_us(&self, bytes_per_s: f64, flops_per_s: f64) -> f64 {
        self.roofline_us(bytes_per_s, flops_per_s)
            .max(self.chain_us())
    }
}

/// Every launch of one plan, in launch order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanTraffic {
    pub mode: Mode,
    pub rows: usize,
    /// Tokens each sequence held before the step.
    pub context: usize,
    pub launches: Vec<LaunchTraffic>,
}

impl PlanTraffic {
    fn sum(&self, f: impl Fn(&LaunchTraffic) -> u64) -> u64 {
        self.launches
            .iter()
            .fold(0u64, |acc, l| acc.saturating_add(f(l)))
    }

    pub fn weights_read(&self) -> u64 {
        self.sum(|l| l.weights_read)
    }

    pub fn activations_read(&self) -> u64 {
        self.sum(|l| l.activations_read)
    }

    /// `weights_read` by storage format: bf16, fp8, int4 (`WeightFormat::KINDS` order), formats
    /// of one kind by their text.
    pub fn weights_read_by_format(&self) -> Vec<(WeightFormat, u64)> {
        let mut out: Vec<(WeightFormat, u64)> = Vec::new();
        for &(format, bytes) in self.launches.iter().flat_map(|l| &l.weights_by_format) {
            match out.iter_mut().find(|(f, _)| *f == format) {
                Some((_, b)) => *b = b.saturating_add(bytes),
                None => out.push((format, bytes)),
            }
        }
        let rank = |f: &WeightFormat| WeightFormat::KINDS.iter().position(|k| *k == f.kind());
        out.sort_by_key(|(f, _)| (rank(f), f.to_string()));
        out
    }

    pub fn activations_written(&self) -> u64 {
        self.sum(|l| l.activations_written)
    }

    pub fn state_read(&self) -> u64 {
        self.sum(|l| l.state_read)
    }

    pub fn state_written(&self) -> u64 {
        self.sum(|l| l.state_written)
    }

    pub fn meta_read(&self) -> u64 {
        self.sum(|l| l.meta_read)
    }

    pub fn total(&self) -> u64 {
        self.sum(LaunchTraffic::total)
    }

    /// The step's floor: every launch's bytes at `bytes_per_s`, launches back to back.
    pub fn floor_us(&self, bytes_per_s: f64) -> f64 {
        floor_us(self.total(), bytes_per_s)
    }

    pub fn flops(&self) -> u64 {
        self.sum(|l| l.flops)
    }

    /// The step's roofline: each launch at the slower of its bytes and its FLOPs, launches
    /// back to back.
    pub fn roofline_us(&self, bytes_per_s: f64, flops_per_s: f64) -> f64 {
        self.launches
            .iter()
            .map(|l| l.roofline_us(bytes_per_s, flops_per_s))
            .sum()
    }

    /// The step's bound: each launch at the slowest of its bytes, its FLOPs and its longest
    /// dependent chain (`LaunchTraffic::bound_us`), launches back to back.
    pub fn bound_us(&self, bytes_per_s: f64, flops_per_s: f64) -> f64 {
        self.launches
            .iter()
            .map(|l| l.bound_us(bytes_per_s, flops_per_s))
            .sum()
    }
}

/// Microseconds to move `bytes` at `bytes_per_s` (or do that many FLOPs at a FLOP rate;
/// infinite at a rate that is not positive).
pub fn floor_us(bytes: u64, bytes_per_s: f64) -> f64 {
    if bytes_per_s > 0.0 {
        bytes as f64 / bytes_per_s * 1e6
    } else {
        f64::INFINITY
    }
}

/// Sequences a step of `mode` at `rows` holds.
pub fn sequences(mode: Mode, rows: usize) -> usize {
    match mode {
        Mode::Decode | Mode::Verify | Mode::Prefill | Mode::Draft => 1,
        Mode::MultiSeq | Mode::VerifyBatch => rows,
    }
}

/// The traffic of every launch of `plan` (built from `circuit`), each sequence holding
/// `context` tokens before the step.
pub fn plan_traffic(circuit: &Circuit, plan: &ExecutionPlan, context: usize) -> PlanTraffic {
    let rows = plan.rows;
    let seqs = sequences(plan.mode, rows).max(1);
    // Tokens each sequence holds once the step's own are written.
    let held = context.saturating_add(rows.div_ceil(seqs));
    let launches = plan
        .order
        .iter()
        .map(|&g| launch_traffic(circuit, plan, g, seqs, context, held))
        .collect();
    PlanTraffic {
        mode: plan.mode,
        rows,
        context,
        launches,
    }
}

fn u(bytes: usize) -> u64 {
    bytes as u64
}

fn mul(factors: &[usize]) -> u64 {
    factors
        .iter()
        .fold(1u64, |acc, &f| acc.saturating_mul(f as u64))
}

fn launch_traffic(
    circuit: &Circuit,
    plan: &ExecutionPlan,
    id: GroupId,
    seqs: usize,
    context: usize,
    held: usize,
) -> LaunchTraffic {
    let group = plan.group(id);
    let rows = plan.rows;
    let mut t = LaunchTraffic {
        group: id,
        rule: group.rule.clone(),
        kernels: group.kernels.clone(),
        layer: group.layer,
        weights_read: 0,
        weights_by_format: Vec::new(),
        activations_read: 0,
        activations_written: 0,
        state_read: 0,
        state_written: 0,
        meta_read: 0,
        flops: 0,
        chain: 0,
    };
    for &input in &group.inputs {
        let tensor = circuit.tensor(input);
        if matches!(tensor.binding, Binding::Arena | Binding::Input(_)) {
            t.activations_read = t.activations_read.saturating_add(u(tensor.bytes(rows)));
        }
    }
    for &output in &group.outputs {
        let tensor = circuit.tensor(output);
        if matches!(tensor.binding, Binding::Arena | Binding::Output(_)) {
            t.activations_written = t.activations_written.saturating_add(u(tensor.bytes(rows)));
        }
    }
    let mut weights: Vec<(WeightId, u64)> = Vec::new();
    let mut meta: BTreeSet<MetaField> = BTreeSet::new();
    let mut block_size = 1;
    for &node in &group.nodes {
        let op = circuit.op(node);
        let flops = crate::flops::op_flops(circuit, op, rows, seqs, context);
        t.flops = t.flops.saturating_add(flops);
        let chain = crate::chain::op_chain(circuit, op, rows, seqs, &group.kernels);
        t.chain = t.chain.max(chain);
        for &w in &op.weights {
            let bytes = weight_bytes(circuit, op, w, rows);
            match weights.iter_mut().find(|(id, _)| *id == w) {
                Some((_, b)) => *b = (*b).max(bytes),
                None => weights.push((w, bytes)),
            }
        }
        meta.extend(op.meta.iter().copied());
        for &input in &op.inputs {
            if let Binding::State(s) = circuit.tensor(input).binding {
                if let StateKind::KvPages { block_size: b, .. } = circuit.states[s.0 as usize].kind
                {
                    block_size = b.max(1);
                }
                t.state_read = t.state_read.saturating_add(state_read(
                    &circuit.states[s.0 as usize].kind,
                    seqs,
                    held,
                ));
            }
        }
        for &output in &op.outputs {
            let tensor = circuit.tensor(output);
            if let Binding::State(s) = tensor.binding {
                let kind = &circuit.states[s.0 as usize].kind;
                let (read, written) = match kind {
                    StateKind::KvPages { .. } => (
                        0,
                        mul(&[tensor.shape.elements(rows), tensor.dtype.size_bytes()]),
                    ),
                    _ => {
                        let slot = u(kind.slot_bytes());
                        let writes = if plan.keeps_snapshots {
                            seqs.saturating_add(rows)
                        } else {
                            seqs
                        };
                        (
                            mul(&[seqs]).saturating_mul(slot),
                            mul(&[writes]).saturating_mul(slot),
                        )
                    }
                };
                t.state_read = t.state_read.saturating_add(read);
                t.state_written = t.state_written.saturating_add(written);
            }
        }
    }
    t.weights_read = weights
        .iter()
        .fold(0u64, |acc, (_, b)| acc.saturating_add(*b));
    for (w, bytes) in &weights {
        let format = circuit.weights[w.0 as usize].format;
        match t.weights_by_format.iter_mut().find(|(f, _)| *f == format) {
            Some((_, b)) => *b = b.saturating_add(*bytes),
            None => t.weights_by_format.push((format, *bytes)),
        }
    }
    t.meta_read = meta
        .iter()
        .map(|field| match field {
            MetaField::BlockTables => mul(&[rows, held.div_ceil(block_size), 4]),
            _ => mul(&[rows, 4]),
        })
        .fold(0u64, u64::saturating_add);
    t
}

/// Bytes of slot `w` that `op` reads at `rows` rows.
fn weight_bytes(circuit: &Circuit, op: &crate::ir::Op, w: WeightId, rows: usize) -> u64 {
    let slot = &circuit.weights[w.0 as usize];
    // A stacked quantized slot's matrices lie at its stride: `full / first` is one matrix's.
    let full = u(slot.bytes());
    let first = slot.shape.first().copied().unwrap_or(1).max(1);
    let per_first = full / first as u64;
    match op.kind {
        // One table row per row gathered.
        OpKind::Embedding => per_first.saturating_mul(rows.min(first) as u64),
        OpKind::MoeGateUp | OpKind::MoeDown if !slot.parts.is_empty() => {
            let k = op
                .attrs
                .iter()
                .find(|(name, _)| name == "k")
                .and_then(|(_, v)| match v {
                    crate::ir::Attr::Int(k) => usize::try_from(*k).ok(),
                    crate::ir::Attr::Float(_) => None,
                })
                .unwrap_or(first);
            per_first.saturating_mul(rows.saturating_mul(k).min(first) as u64)
        }
        _ => full,
    }
}

/// Bytes an op reading state `kind` reads: the KV of `held` tokens per sequence.
fn state_read(kind: &StateKind, seqs: usize, held: usize) -> u64 {
    match kind {
        StateKind::KvPages {
            num_kv_heads,
            head_dim,
            dtype,
            ..
        } => mul(&[seqs, held, 2, *num_kv_heads, *head_dim, dtype.size_bytes()]),
        // A recurrent state edge read by a later op orders it; the bytes were counted where
        // the state is updated in place.
        _ => 0,
    }
}
