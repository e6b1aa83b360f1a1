//! What a kernel's emitter sees of its plan group (`View`), and the `Operands` it reads them
//! from: the lowering's bindings (`bind::Bindings` implements it) give each tensor, weight,
//! state, metadata field and scratch region its device range. Not the twin's view of a
//! launch's arguments (that is `args`): this one is the emit side, a plan group → launches.
//!
//! Invariant: an emitter reads everything it launches with through `View`, so the kernels
//! layer never names the lowering's types (`Bindings`, `Layout`, plans' buffers).

use std::cell::RefCell;

use solder_circuit::ir::{
    Attr, Binding, Circuit, MetaField, Op, StateId, TensorId, WeightId, WeightSlot,
};
use solder_circuit::{Group, Mode, OpKind};
use solder_config::Levers;

use super::launch::{Buf, Launch};
use crate::error::ExecError;

/// What an emitter returns.
pub type R = Result<Vec<Launch>, ExecError>;

/// The device ranges an emitter's launches take, for one plan at its rows.
pub trait Operands {
    fn circuit(&self) -> &Circuit;
    /// The plan's mode (how recurrent kernels walk its rows).
    fn mode(&self) -> Mode;
    fn rows(&self) -> usize;
    /// The build's levers (emit-time entry and launch-shape choices that keep the bytes).
    fn levers(&self) -> &Levers;
    /// A tensor's range at this plan's rows; `None` when it has no storage (a fused edge).
    fn tensor(&self, t: TensorId) -> Option<Buf>;
    /// A state's region: a layer's KV pages, or its sequence slots.
    fn state(&self, state: StateId) -> Buf;
    /// The per-row snapshots of a recurrent state, when the plan keeps them
    /// (`ExecutionPlan::keeps_snapshots`).
    fn snapshots(&self, state: StateId) -> Option<Buf>;
    fn weight(&self, w: WeightId) -> Buf;
    fn meta(&self, field: MetaField) -> Buf;
    fn inv_freq(&self) -> Buf;
    /// The attention scratch of an attention op with `heads` and `head_dim` at this rows.
    fn attn_scratch(&self, heads: usize, head_dim: usize) -> Buf;
    /// The o-fold scratch of `heads` heads and `n_out` output features at this rows.
    fn o_scratch(&self, heads: usize, n_out: usize) -> Buf;
    /// The experts' down dots (`gemm::experts_down_mma`): the workspace's region, whole.
    fn moe_scratch(&self) -> Buf;
    /// The whole gemv split-K scratch slot of `stream`; `None` when the workspace has none.
    fn gemv_slot(&self, stream: u8) -> Option<Buf>;
    /// Sequence slots of the recurrent states.
    fn state_slots(&self) -> usize;
    fn kv_block_size(&self) -> usize;
    fn kv_pages(&self) -> usize;
    /// Block-table entries per row.
    fn max_blocks(&self) -> usize;
}

/// A group seen by an emitter: its ops by kind and role, and their buffers.
pub struct View<'a> {
    bind: &'a (dyn Operands + 'a),
    group: &'a Group,
    /// The stream the plan runs the group on.
    stream: u8,
    passed: RefCell<Vec<TensorId>>,
}

impl<'a> View<'a> {
    /// The view of `group`, run on `stream`, over `operands`.
    pub fn new(operands: &'a (dyn Operands + 'a), group: &'a Group, stream: u8) -> View<'a> {
        View {
            bind: operands,
            group,
            stream,
            passed: RefCell::new(Vec::new()),
        }
    }

    /// Every tensor an emitter passed to a launch so far (an output, a kept output, a state).
    pub fn passed(&self) -> Vec<TensorId> {
        self.passed.borrow().clone()
    }

    pub fn err(&self, message: String) -> ExecError {
        ExecError::Emit {
            rule: self.group.rule.clone(),
            kernel: self.group.kernels.join("+"),
            message,
        }
    }

    pub fn rows(&self) -> u32 {
        self.bind.rows() as u32
    }

    /// The plan's mode (what its rows are: one sequence's tokens, or one token of each).
    pub fn mode(&self) -> Mode {
        self.bind.mode()
    }

    /// The build's levers (what a declaration's `shape` reads).
    pub fn levers(&self) -> &'a Levers {
        self.bind.levers()
    }

    /// Whether the build turned lever `name` on.
    pub fn lever(&self, name: &str) -> bool {
        self.bind.levers().is_on(name)
    }

    /// The group's only op of `kind` (and `role`, when given).
    pub fn op(&self, kind: OpKind, role: Option<&str>) -> Result<&'a Op, ExecError> {
        let mut found = self
            .group
            .nodes
            .iter()
            .map(|n| self.bind.circuit().op(*n))
            .filter(|op| op.kind == kind && role.is_none_or(|r| op.role == r));
        match (found.next(), found.next()) {
            (Some(op), None) => Ok(op),
            _ => Err(self.err(format!(
                "expected exactly one `{}` op{}",
                kind.as_str(),
                role.map(|r| format!(" with role `{r}`"))
                    .unwrap_or_default()
            ))),
        }
    }

    /// The group's ops of `kind`, in group order.
    pub fn ops(&self, kind: OpKind) -> Vec<&'a Op> {
        (self.group.nodes.iter())
            .map(|n| self.bind.circuit().op(*n))
            .filter(|op| op.kind == kind)
            .collect()
    }

    /// Whether the group holds an op of `kind`.
    pub fn has(&self, kind: OpKind) -> bool {
        self.group
            .nodes
            .iter()
            .any(|n| self.bind.circuit().op(*n).kind == kind)
    }

    /// The op of this group that writes input `index` of `op`.
    pub fn producer_in_group(&self, op: &Op, index: usize) -> Result<&'a Op, ExecError> {
        let t = self.tensor_at(op, &op.inputs, index, "input")?;
        self.bind
            .circuit()
            .producer(t)
            .filter(|p| self.group.nodes.contains(p))
            .map(|p| self.bind.circuit().op(p))
            .ok_or_else(|| {
                self.err(format!(
                    "input {index} of `{}` is not written inside the group",
                    op.name
                ))
            })
    }

    fn tensor_at(
        &self,
        op: &Op,
        list: &[TensorId],
        index: usize,
        what: &str,
    ) -> Result<TensorId, ExecError> {
        list.get(index)
            .copied()
            .ok_or_else(|| self.err(format!("op `{}` has no {what} {index}", op.name)))
    }

    /// A stored input of `op` (read from outside the group).
    pub fn input(&self, op: &Op, index: usize) -> Result<Buf, ExecError> {
        let t = self.tensor_at(op, &op.inputs, index, "input")?;
        self.bind.tensor(t).ok_or_else(|| {
            self.err(format!(
                "input `{}` of `{}` has no storage",
                self.bind.circuit().tensor(t).name,
                op.name
            ))
        })
    }

    /// A stored output of `op`: required.
    pub fn output(&self, op: &Op, index: usize) -> Result<Buf, ExecError> {
        let t = self.tensor_at(op, &op.outputs, index, "output")?;
        self.passed.borrow_mut().push(t);
        self.bind.tensor(t).ok_or_else(|| {
            self.err(format!(
                "output `{}` of `{}` is fused away but the kernel must store it",
                self.bind.circuit().tensor(t).name,
                op.name
            ))
        })
    }

    /// An output of `op` that the kernel stores only when the plan keeps it.
    pub fn output_opt(&self, op: &Op, index: usize) -> Result<Option<Buf>, ExecError> {
        let t = self.tensor_at(op, &op.outputs, index, "output")?;
        let buf = self.bind.tensor(t);
        if buf.is_some() {
            self.passed.borrow_mut().push(t);
        }
        Ok(buf)
    }

    /// The KV region an op's state edge (input or output) names.
    pub fn state_of(&self, t: TensorId) -> Result<Buf, ExecError> {
        match self.bind.circuit().tensor(t).binding {
            Binding::State(s) => {
                self.passed.borrow_mut().push(t);
                Ok(self.bind.state(s))
            }
            _ => Err(self.err(format!(
                "`{}` is not a state edge",
                self.bind.circuit().tensor(t).name
            ))),
        }
    }

    /// The per-row snapshots of the recurrent state an op's state edge names, when the plan
    /// keeps them (verify and batched verify up to the serve's `speculative_rows`).
    pub fn snapshots_of(&self, t: TensorId) -> Result<Option<Buf>, ExecError> {
        match self.bind.circuit().tensor(t).binding {
            Binding::State(s) => Ok(self.bind.snapshots(s)),
            _ => Err(self.err(format!(
                "`{}` is not a state edge",
                self.bind.circuit().tensor(t).name
            ))),
        }
    }

    /// How a recurrent kernel walks this plan's rows: 0, each row its own sequence
    /// (decode, multi-seq); 1, every row a consecutive token of one sequence (verify); 2,
    /// runs of consecutive rows on one slot, each run a sequence's consecutive tokens
    /// (verify_batch).
    pub fn chain_mode(&self) -> u32 {
        match self.bind.mode().rows_as() {
            solder_circuit::Mode::Verify => 1,
            solder_circuit::Mode::VerifyBatch => 2,
            _ => 0,
        }
    }

    /// Rows of this plan are consecutive tokens of sequences (verify, verify_batch, prefill).
    pub fn chained(&self) -> bool {
        matches!(
            self.bind.mode().rows_as(),
            solder_circuit::Mode::Verify | solder_circuit::Mode::VerifyBatch
        )
    }

    pub fn state_slots(&self) -> u32 {
        self.bind.state_slots() as u32
    }

    pub fn weight(&self, op: &Op, index: usize) -> Result<Buf, ExecError> {
        op.weights
            .get(index)
            .map(|w| self.bind.weight(*w))
            .ok_or_else(|| self.err(format!("op `{}` has no weight {index}", op.name)))
    }

    /// The slot of every weight of every op of the group (names and stored formats).
    pub fn weight_slots(&self) -> impl Iterator<Item = &'a WeightSlot> + 'a {
        let circuit = self.bind.circuit();
        self.group
            .nodes
            .iter()
            .flat_map(move |n| circuit.op(*n).weights.iter())
            .filter_map(move |w| circuit.weights.get(w.0 as usize))
    }

    /// The slot of `op`'s weight `index` (its name and `format`: which entry reads it).
    pub fn weight_slot(&self, op: &Op, index: usize) -> Result<&'a WeightSlot, ExecError> {
        op.weights
            .get(index)
            .map(|w| &self.bind.circuit().weights[w.0 as usize])
            .ok_or_else(|| self.err(format!("op `{}` has no weight {index}", op.name)))
    }

    /// The format of `op`'s weight `index` (bf16 when it has none): which format entry of a
    /// kernel an emitter launches.
    pub fn weight_format(&self, op: &Op, index: usize) -> solder_circuit::WeightFormat {
        self.weight_slot(op, index)
            .map_or(solder_circuit::WeightFormat::Bf16, |s| s.format)
    }

    pub fn weight_opt(&self, op: &Op, index: usize) -> Option<Buf> {
        op.weights.get(index).map(|w| self.bind.weight(*w))
    }

    pub fn meta(&self, field: MetaField) -> Buf {
        self.bind.meta(field)
    }

    /// The step's want-logits flags when `op` reads them (the model's LM head: a row flagged 0
    /// is skipped, `MetaField::WantLogits`); `None` for an op that computes every row (a
    /// router, the MTP head's fc).
    pub fn want_logits(&self, op: &Op) -> Option<Buf> {
        op.meta
            .contains(&MetaField::WantLogits)
            .then(|| self.meta(MetaField::WantLogits))
    }

    pub fn inv_freq(&self) -> Buf {
        self.bind.inv_freq()
    }

    /// The attention scratch of an attention op with `heads` and `head_dim` at this rows.
    pub fn attn_scratch(&self, heads: usize, head_dim: usize) -> Buf {
        self.bind.attn_scratch(heads, head_dim)
    }

    /// The o-fold scratch of `heads` heads and `n_out` output features at this rows.
    pub fn o_scratch(&self, heads: usize, n_out: usize) -> Buf {
        self.bind.o_scratch(heads, n_out)
    }

    /// `bytes` of the experts' down-dots region (`gemm::experts_down_mma`), or an error
    /// naming both sizes when the workspace holds fewer.
    pub fn moe_scratch(&self, bytes: usize) -> Result<Buf, ExecError> {
        let region = self.bind.moe_scratch();
        if bytes > region.bytes {
            return Err(self.err(format!(
                "the experts' down dots need {bytes} bytes, the workspace holds {}",
                region.bytes
            )));
        }
        Ok(Buf::new(region.ptr, bytes))
    }

    /// `bytes` of the gemv split-K scratch slot of this group's stream, for `entry`'s launch
    /// split `splits` ways: an error naming the kernel, the slot and both sizes when the
    /// workspace has no slot for the stream or a smaller one (a launch never falls back to
    /// unsplit behind the declaration's back).
    pub fn gemv_scratch(&self, entry: &str, splits: u32, bytes: usize) -> Result<Buf, ExecError> {
        match self.bind.gemv_slot(self.stream) {
            Some(slot) if bytes <= slot.bytes => Ok(Buf::new(slot.ptr, bytes)),
            slot => Err(self.err(format!(
                "`{entry}` split {splits} ways needs {bytes} bytes of the gemv split-K scratch, \
                 but stream {}'s slot holds {} bytes",
                self.stream,
                slot.map_or(0, |s| s.bytes)
            ))),
        }
    }

    pub fn u32(&self, op: &Op, key: &str) -> Result<u32, ExecError> {
        match op.attrs.iter().find(|(k, _)| k == key) {
            Some((_, Attr::Int(v))) if *v >= 0 && *v <= u32::MAX as i64 => Ok(*v as u32),
            _ => Err(self.err(format!("op `{}` has no integer attribute `{key}`", op.name))),
        }
    }

    pub fn f32(&self, op: &Op, key: &str) -> Result<f32, ExecError> {
        match op.attrs.iter().find(|(k, _)| k == key) {
            Some((_, Attr::Float(v))) => Ok(*v as f32),
            _ => Err(self.err(format!("op `{}` has no float attribute `{key}`", op.name))),
        }
    }

    pub fn kv_block_size(&self) -> u32 {
        self.bind.kv_block_size() as u32
    }

    pub fn kv_pages(&self) -> u32 {
        self.bind.kv_pages() as u32
    }

    pub fn max_blocks(&self) -> u32 {
        self.bind.max_blocks() as u32
    }
}

#[cfg(test)]
mod tests {
    use solder_circuit::Numerics;
    use solder_gpu_runtime::DevicePtr;

    use super::*;

    /// Operands with no tensors, whose only gemv slot (stream 0) holds `slot` bytes.
    struct OneSlot {
        circuit: Circuit,
        levers: Levers,
        slot: usize,
    }

    fn buf() -> Buf {
        Buf::new(DevicePtr(4096), 0)
    }

    impl Operands for OneSlot {
        fn circuit(&self) -> &Circuit {
            &self.circuit
        }
        fn mode(&self) -> Mode {
            Mode::Decode
        }
        fn rows(&self) -> usize {
            1
        }
        fn levers(&self) -> &Levers {
            &self.levers
        }
        fn tensor(&self, _: TensorId) -> Option<Buf> {
            None
        }
        fn state(&self, _: StateId) -> Buf {
            buf()
        }
        fn snapshots(&self, _: StateId) -> Option<Buf> {
            Some(buf())
        }
        fn weight(&self, _: WeightId) -> Buf {
            buf()
        }
        fn meta(&self, _: MetaField) -> Buf {
            buf()
        }
        fn inv_freq(&self) -> Buf {
            buf()
        }
        fn attn_scratch(&self, _: usize, _: usize) -> Buf {
            buf()
        }
        fn o_scratch(&self, _: usize, _: usize) -> Buf {
            buf()
        }
        fn moe_scratch(&self) -> Buf {
            buf()
        }
        fn gemv_slot(&self, stream: u8) -> Option<Buf> {
            (stream == 0 && self.slot > 0).then(|| Buf::new(DevicePtr(8192), self.slot))
        }
        fn state_slots(&self) -> usize {
            1
        }
        fn kv_block_size(&self) -> usize {
            16
        }
        fn kv_pages(&self) -> usize {
            1
        }
        fn max_blocks(&self) -> usize {
            1
        }
    }

    fn group() -> Group {
        Group {
            rule: "linear_r".into(),
            kernels: vec!["gemv::linear".into()],
            emitter: None,
            numerics: Numerics::Reference,
            nodes: vec![],
            inputs: vec![],
            outputs: vec![],
            fused: vec![],
            layer: None,
            branch: 0,
        }
    }

    fn operands(slot: usize) -> OneSlot {
        OneSlot {
            circuit: Circuit {
                name: "t".into(),
                family: "t".into(),
                num_layers: 0,
                tensors: vec![],
                ops: vec![],
                weights: vec![],
                states: vec![],
                producers: vec![],
                consumers: vec![],
            },
            levers: Levers::default(),
            slot,
        }
    }

    #[test]
    fn a_split_scratch_slot_too_small_is_an_error_naming_kernel_slot_and_sizes() {
        let group = group();
        let small = operands(80_000);
        let view = View::new(&small, &group, 0);
        let fits = view.gemv_scratch("gemv::linear_r1", 3, 60_000).unwrap();
        assert_eq!((fits.ptr, fits.bytes), (DevicePtr(8192), 60_000));
        let message = view
            .gemv_scratch("gemv::linear_r1", 3, 100_000)
            .unwrap_err()
            .to_string();
        for part in ["gemv::linear_r1", "3 ways", "100000", "stream 0", "80000"] {
            assert!(message.contains(part), "`{part}` missing from: {message}");
        }
        // Another stream has no slot at all: an error too, never an unsplit launch.
        let other = View::new(&small, &group, 1);
        let message = other
            .gemv_scratch("gemv::linear_r1", 2, 10)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("stream 1's slot holds 0 bytes"),
            "{message}"
        );
    }
}
