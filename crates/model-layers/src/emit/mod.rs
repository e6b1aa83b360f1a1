//! Emitters: one plan group → its launches. `View` is what a kernel's emitter (declared beside
//! the kernel in `crate::kernels`) sees of its group; `emit_group` finds the emitter by the
//! group's emitter kernel name in the registry and checks what it emitted.
//!
//! Invariants: a group emits exactly the kernels its rule names, in order (checked here; a
//! variant entry of a kernel, chosen at emit time by rows and levers, counts as the kernel);
//! every tensor the group keeps is passed to some launch (a kernel that cannot store a kept
//! intermediate is an error naming it, never a silently dropped output).

use std::cell::RefCell;

use solder_circuit::ir::{Attr, Binding, MetaField, Op, TensorId};
use solder_circuit::{Group, OpKind};

use crate::bind::Bindings;
use crate::error::ExecError;
use crate::kernels::{Buf, Launch};

/// What an emitter returns.
pub type R = Result<Vec<Launch>, ExecError>;

/// The launches of `group` (run on `stream`), checked against its rule's kernel list.
pub fn emit_group(
    bind: &Bindings<'_>,
    group: &Group,
    stream: u8,
) -> Result<Vec<Launch>, ExecError> {
    let view = View {
        bind,
        group,
        stream,
        passed: RefCell::new(Vec::new()),
    };
    let emitter = group
        .emitter
        .as_deref()
        .unwrap_or(group.kernels[0].as_str());
    let decl = crate::kernels::decl(emitter)
        .ok_or_else(|| view.err(format!("no emitter for `{emitter}`")))?;
    let launches = (decl.emit)(&view)?;
    // A variant entry (gemv's streaming entries) stands for the kernel it is a variant of.
    let names: Vec<&str> = launches
        .iter()
        .map(|l| crate::kernels::variant_of(l.kernel).unwrap_or(l.kernel))
        .collect();
    if names != group.kernels.iter().map(String::as_str).collect::<Vec<_>>() {
        return Err(view.err(format!(
            "emitted {names:?}, the rule names {:?}",
            group.kernels
        )));
    }
    let passed = view.passed.borrow();
    for &t in &group.outputs {
        if !passed.contains(&t) {
            let name = &bind.circuit.tensor(t).name;
            return Err(view.err(format!(
                "the kernel cannot store `{name}`, which the plan keeps"
            )));
        }
    }
    Ok(launches)
}

/// A group seen by an emitter: its ops by kind and role, and their buffers.
pub struct View<'a> {
    bind: &'a Bindings<'a>,
    group: &'a Group,
    /// The stream the plan runs the group on.
    stream: u8,
    passed: RefCell<Vec<TensorId>>,
}

impl<'a> View<'a> {
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

    /// Whether the build turned lever `name` on.
    pub fn lever(&self, name: &str) -> bool {
        self.bind.levers.is_on(name)
    }

    /// The group's only op of `kind` (and `role`, when given).
    pub fn op(&self, kind: OpKind, role: Option<&str>) -> Result<&'a Op, ExecError> {
        let mut found = self
            .group
            .nodes
            .iter()
            .map(|n| self.bind.circuit.op(*n))
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

    /// Whether the group holds an op of `kind`.
    pub fn has(&self, kind: OpKind) -> bool {
        self.group
            .nodes
            .iter()
            .any(|n| self.bind.circuit.op(*n).kind == kind)
    }

    /// The op of this group that writes input `index` of `op`.
    pub fn producer_in_group(&self, op: &Op, index: usize) -> Result<&'a Op, ExecError> {
        let t = self.tensor_at(op, &op.inputs, index, "input")?;
        self.bind
            .circuit
            .producer(t)
            .filter(|p| self.group.nodes.contains(p))
            .map(|p| self.bind.circuit.op(p))
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
                self.bind.circuit.tensor(t).name,
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
                self.bind.circuit.tensor(t).name,
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
        match self.bind.circuit.tensor(t).binding {
            Binding::State(s) => {
                self.passed.borrow_mut().push(t);
                Ok(self.bind.state(s))
            }
            _ => Err(self.err(format!(
                "`{}` is not a state edge",
                self.bind.circuit.tensor(t).name
            ))),
        }
    }

    /// The per-row snapshots of the recurrent state an op's state edge names.
    pub fn snapshots_of(&self, t: TensorId) -> Result<Buf, ExecError> {
        match self.bind.circuit.tensor(t).binding {
            Binding::State(s) => Ok(self.bind.snapshots(s)),
            _ => Err(self.err(format!(
                "`{}` is not a state edge",
                self.bind.circuit.tensor(t).name
            ))),
        }
    }

    /// How a recurrent kernel walks this plan's rows: 0, each row its own sequence
    /// (decode, multi-seq); 1, every row a consecutive token of one sequence (verify); 2,
    /// runs of consecutive rows on one slot, each run a sequence's consecutive tokens
    /// (verify_batch).
    pub fn chain_mode(&self) -> u32 {
        match self.bind.plan.mode {
            solder_circuit::Mode::Verify => 1,
            solder_circuit::Mode::VerifyBatch => 2,
            _ => 0,
        }
    }

    /// Rows of this plan are consecutive tokens of sequences (verify, verify_batch), so the
    /// recurrent kernels keep per-row snapshots.
    pub fn chained(&self) -> bool {
        matches!(
            self.bind.plan.mode,
            solder_circuit::Mode::Verify | solder_circuit::Mode::VerifyBatch
        )
    }

    pub fn state_slots(&self) -> u32 {
        self.bind.layout.state_slots as u32
    }

    pub fn weight(&self, op: &Op, index: usize) -> Result<Buf, ExecError> {
        op.weights
            .get(index)
            .map(|w| self.bind.weight(*w))
            .ok_or_else(|| self.err(format!("op `{}` has no weight {index}", op.name)))
    }

    pub fn weight_opt(&self, op: &Op, index: usize) -> Option<Buf> {
        op.weights.get(index).map(|w| self.bind.weight(*w))
    }

    pub fn meta(&self, field: MetaField) -> Buf {
        self.bind.meta(field)
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

    /// `bytes` of the gemv split-K scratch slot of this group's stream, if the workspace has it.
    pub fn gemv_scratch(&self, bytes: usize) -> Option<Buf> {
        self.bind.gemv_scratch(self.stream, bytes)
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
        self.bind.layout.kv_block_size as u32
    }

    pub fn kv_pages(&self) -> u32 {
        self.bind.layout.kv_pages as u32
    }

    pub fn max_blocks(&self) -> u32 {
        self.bind.layout.max_blocks as u32
    }
}
