//! [`CircuitBuilder`]: the API that builds a circuit op by op, for solder's own families and
//! for engines that describe their models themselves.
//!
//! Invariant: what [`finish`](CircuitBuilder::finish) returns satisfies [`ir`](crate::ir)'s
//! invariants (topological op order, one writer per tensor, unique op names, unique weight slots)
//! and every size in it fits: each tensor at [`MAX_ROWS`] rows, each weight slot and each state
//! slot or page takes at most [`MAX_TENSOR_BYTES`], computed with checked arithmetic; violations
//! are errors naming the op, tensor, weight or state, never panics.

use std::collections::HashMap;

use crate::error::CircuitError;
use crate::ir::{
    Attr, Binding, Circuit, Dtype, LayerKind, MetaField, NodeId, Op, Shape, StateDecl, StateId,
    StateKind, Tensor, TensorId, WeightId, WeightSlot, MAX_ROWS, MAX_TENSOR_BYTES,
};
use crate::ops::OpKind;

/// Describes one op to add; see `CircuitBuilder::op`.
#[derive(Debug, Clone)]
pub struct OpSpec {
    pub kind: OpKind,
    pub name: String,
    pub role: String,
    pub layer: Option<u32>,
    pub layer_kind: Option<LayerKind>,
    pub inputs: Vec<TensorId>,
    pub weights: Vec<WeightId>,
    pub meta: Vec<MetaField>,
    pub attrs: Vec<(String, Attr)>,
    pub branch: u8,
}

impl OpSpec {
    pub fn new(kind: OpKind, name: impl Into<String>, role: impl Into<String>) -> OpSpec {
        OpSpec {
            kind,
            name: name.into(),
            role: role.into(),
            layer: None,
            layer_kind: None,
            inputs: Vec::new(),
            weights: Vec::new(),
            meta: Vec::new(),
            attrs: Vec::new(),
            branch: 0,
        }
    }

    pub fn layer(mut self, layer: u32, kind: LayerKind) -> OpSpec {
        self.layer = Some(layer);
        self.layer_kind = Some(kind);
        self
    }

    pub fn inputs(mut self, inputs: &[TensorId]) -> OpSpec {
        self.inputs = inputs.to_vec();
        self
    }

    pub fn weights(mut self, weights: &[WeightId]) -> OpSpec {
        self.weights = weights.to_vec();
        self
    }

    pub fn meta(mut self, meta: &[MetaField]) -> OpSpec {
        self.meta = meta.to_vec();
        self
    }

    pub fn attr(mut self, key: &str, value: Attr) -> OpSpec {
        self.attrs.push((key.to_string(), value));
        self
    }

    pub fn branch(mut self, branch: u8) -> OpSpec {
        self.branch = branch;
        self
    }
}

/// The shape and format of an op output.
#[derive(Debug, Clone)]
pub struct OutSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Shape,
    pub binding: Binding,
}

impl OutSpec {
    /// A per-row arena tensor `[n, cols]`.
    pub fn rows(name: impl Into<String>, dtype: Dtype, cols: usize) -> OutSpec {
        OutSpec {
            name: name.into(),
            dtype,
            shape: Shape::rows(&[cols]),
            binding: Binding::Arena,
        }
    }

    pub fn bound(mut self, binding: Binding) -> OutSpec {
        self.binding = binding;
        self
    }
}

#[derive(Debug)]
pub struct CircuitBuilder {
    circuit: Circuit,
    weight_index: HashMap<String, WeightId>,
    op_names: HashMap<String, NodeId>,
    /// The first refusal of a call that returns no `Result` (`input`, `state`); `finish`
    /// returns it.
    refused: Option<CircuitError>,
}

/// Refuses a size that overflowed (`None`) or exceeds `MAX_TENSOR_BYTES`.
fn check_size(
    what: &str,
    name: &str,
    shape: &str,
    bytes: Option<usize>,
) -> Result<(), CircuitError> {
    match bytes {
        Some(bytes) if bytes <= MAX_TENSOR_BYTES => Ok(()),
        _ => Err(CircuitError::TooLarge {
            what: what.to_string(),
            name: name.to_string(),
            shape: shape.to_string(),
            max: MAX_TENSOR_BYTES,
        }),
    }
}

/// A tensor is checked at the widest plan (`MAX_ROWS`), so `Tensor::bytes` is exact at
/// every rows a plan may have.
fn check_tensor(spec: &OutSpec) -> Result<(), CircuitError> {
    let tensor = Tensor {
        name: String::new(),
        dtype: spec.dtype,
        shape: spec.shape.clone(),
        binding: spec.binding,
    };
    let shape = format!("{} {} at {MAX_ROWS} rows", spec.dtype.as_str(), spec.shape);
    check_size("tensor", &spec.name, &shape, tensor.checked_bytes(MAX_ROWS))
}

fn check_weight(name: &str, shape: &[usize], dtype: Dtype) -> Result<(), CircuitError> {
    let bytes = shape
        .iter()
        .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d));
    check_size("weight", name, &format!("{shape:?}"), bytes)
}

fn check_state(name: &str, kind: &StateKind) -> Result<(), CircuitError> {
    let bytes = match kind {
        StateKind::KvPages { .. } => kind.checked_page_bytes(),
        _ => kind.checked_slot_bytes(),
    };
    check_size("state", name, &format!("{kind:?}"), bytes)
}

impl CircuitBuilder {
    pub fn new(name: impl Into<String>, family: impl Into<String>, num_layers: u32) -> Self {
        CircuitBuilder {
            circuit: Circuit {
                name: name.into(),
                family: family.into(),
                num_layers,
                tensors: Vec::new(),
                ops: Vec::new(),
                weights: Vec::new(),
                states: Vec::new(),
                producers: Vec::new(),
                consumers: Vec::new(),
            },
            weight_index: HashMap::new(),
            op_names: HashMap::new(),
            refused: None,
        }
    }

    /// A builder that starts with `base`'s weight slots and state declarations (same ids, same
    /// names) and nothing else: the circuit of another step of the same model (the MTP draft
    /// head), whose weights and states then share one layout with `base`'s. Asking for one of
    /// `base`'s weights by name returns its slot.
    pub fn extending(base: &Circuit, name: impl Into<String>) -> Self {
        let mut b = CircuitBuilder::new(name, base.family.clone(), base.num_layers);
        b.circuit.weights = base.weights.clone();
        b.circuit.states = base.states.clone();
        b.weight_index = base
            .weights
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.clone(), WeightId(i as u32)))
            .collect();
        b
    }

    /// A model input (written by the session, not by an op). One too large is refused by
    /// `finish`.
    pub fn input(&mut self, spec: OutSpec) -> TensorId {
        if let Err(err) = check_tensor(&spec) {
            self.refused.get_or_insert(err);
        }
        self.push_tensor(spec, None)
    }

    /// A weight slot; asking twice for one name returns the same slot (tied embeddings), and
    /// asking with a different shape is an error.
    pub fn weight(&mut self, name: &str, shape: &[usize]) -> Result<WeightId, CircuitError> {
        if let Some(&id) = self.weight_index.get(name) {
            let slot = &self.circuit.weights[id.0 as usize];
            if slot.shape != shape {
                return Err(CircuitError::Build(format!(
                    "weight `{name}` declared with shapes {:?} and {:?}",
                    slot.shape, shape
                )));
            }
            return Ok(id);
        }
        check_weight(name, shape, Dtype::Bf16)?;
        let id = WeightId(self.circuit.weights.len() as u32);
        self.circuit.weights.push(WeightSlot {
            name: name.to_string(),
            shape: shape.to_vec(),
            parts: Vec::new(),
            dtype: Dtype::Bf16,
            format: crate::format::WeightFormat::Bf16,
        });
        self.weight_index.insert(name.to_string(), id);
        Ok(id)
    }

    /// A slot stacked at load from checkpoint tensors `parts` (each of shape `part_shape`),
    /// named `name` (not a checkpoint tensor).
    pub fn weight_stacked(
        &mut self,
        name: &str,
        parts: Vec<String>,
        part_shape: &[usize],
    ) -> Result<WeightId, CircuitError> {
        if parts.is_empty() || self.weight_index.contains_key(name) {
            return Err(CircuitError::Build(format!(
                "stacked weight `{name}`: no parts, or the name is taken"
            )));
        }
        let mut shape = vec![parts.len()];
        shape.extend_from_slice(part_shape);
        check_weight(name, &shape, Dtype::Bf16)?;
        let id = WeightId(self.circuit.weights.len() as u32);
        self.circuit.weights.push(WeightSlot {
            name: name.to_string(),
            shape,
            parts,
            dtype: Dtype::Bf16,
            format: crate::format::WeightFormat::Bf16,
        });
        self.weight_index.insert(name.to_string(), id);
        Ok(id)
    }

    /// A persistent state; one whose slot (or page) is too large is refused by `finish`.
    pub fn state(&mut self, name: impl Into<String>, kind: StateKind) -> StateId {
        let name = name.into();
        if let Err(err) = check_state(&name, &kind) {
            self.refused.get_or_insert(err);
        }
        let id = StateId(self.circuit.states.len() as u32);
        self.circuit.states.push(StateDecl { name, kind });
        id
    }

    /// Adds an op reading `spec.inputs` and writing fresh tensors described by `outputs`.
    pub fn op(&mut self, spec: OpSpec, outputs: &[OutSpec]) -> Result<Vec<TensorId>, CircuitError> {
        if self.op_names.contains_key(&spec.name) {
            return Err(CircuitError::Build(format!(
                "two ops named `{}`",
                spec.name
            )));
        }
        for input in &spec.inputs {
            if input.0 as usize >= self.circuit.tensors.len() {
                return Err(CircuitError::Build(format!(
                    "op `{}` reads tensor #{} that does not exist",
                    spec.name, input.0
                )));
            }
        }
        for w in &spec.weights {
            if w.0 as usize >= self.circuit.weights.len() {
                return Err(CircuitError::Build(format!(
                    "op `{}` names weight #{} that does not exist",
                    spec.name, w.0
                )));
            }
        }
        for output in outputs {
            check_tensor(output)?;
        }
        let node = NodeId(self.circuit.ops.len() as u32);
        for input in &spec.inputs {
            self.circuit.consumers[input.0 as usize].push(node);
        }
        let outs: Vec<TensorId> = outputs
            .iter()
            .map(|o| self.push_tensor(o.clone(), Some(node)))
            .collect();
        self.op_names.insert(spec.name.clone(), node);
        self.circuit.ops.push(Op {
            kind: spec.kind,
            name: spec.name,
            role: spec.role,
            layer: spec.layer,
            layer_kind: spec.layer_kind,
            inputs: spec.inputs,
            outputs: outs.clone(),
            weights: spec.weights,
            meta: spec.meta,
            attrs: spec.attrs,
            branch: spec.branch,
        });
        Ok(outs)
    }

    /// Like `op` for an op with exactly one output.
    pub fn op1(&mut self, spec: OpSpec, output: OutSpec) -> Result<TensorId, CircuitError> {
        Ok(self.op(spec, &[output])?[0])
    }

    pub fn finish(self) -> Result<Circuit, CircuitError> {
        if let Some(err) = self.refused {
            return Err(err);
        }
        let c = self.circuit;
        for (i, t) in c.tensors.iter().enumerate() {
            let written = c.producers[i].is_some();
            match t.binding {
                Binding::Input(_) if written => {
                    return Err(CircuitError::Build(format!(
                        "model input `{}` is written by an op",
                        t.name
                    )))
                }
                Binding::Arena | Binding::Output(_) | Binding::State(_) if !written => {
                    return Err(CircuitError::Build(format!(
                        "tensor `{}` has no writer",
                        t.name
                    )))
                }
                _ => {}
            }
        }
        Ok(c)
    }

    fn push_tensor(&mut self, spec: OutSpec, producer: Option<NodeId>) -> TensorId {
        let id = TensorId(self.circuit.tensors.len() as u32);
        self.circuit.tensors.push(Tensor {
            name: spec.name,
            dtype: spec.dtype,
            shape: spec.shape,
            binding: spec.binding,
        });
        self.circuit.producers.push(producer);
        self.circuit.consumers.push(Vec::new());
        id
    }
}
