//! The circuit IR: ops (nodes) and tensors (edges) of one decode step, rows symbolic.
//!
//! Invariants: [`Circuit::ops`] is in execution order and that order is topological (every
//! tensor an op reads is a model input or was written by an earlier op); every tensor has at
//! most one writer; weight slots are unique by checkpoint name.

use std::fmt;

/// The most rows a plan may have (`solder_config::MAX_ROWS`, 2^18: the serve shape holds every
/// program to it). `Mode::check_rows` refuses more.
pub const MAX_ROWS: usize = solder_config::MAX_ROWS;

/// The most bytes one tensor (at `MAX_ROWS`), weight slot or state slot may take: 256 TiB,
/// far above what `solder_config::DIM_BOUNDS` allows (2^46), and low enough that sums over a
/// plan's tensors stay far below `u64::MAX`. The builder refuses anything larger.
pub const MAX_TENSOR_BYTES: usize = 1 << 48;

/// Index of an op in `Circuit::ops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u32);

/// Index of a tensor in `Circuit::tensors`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TensorId(pub u32);

/// Index of a weight slot in `Circuit::weights`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WeightId(pub u32);

/// Index of a persistent state declaration in `Circuit::states`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateId(pub u32);

/// Storage format of a tensor, weight or state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bf16,
    F16,
    F32,
    I32,
}

impl Dtype {
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
            Dtype::I32 => "i32",
        }
    }
}

/// A tensor's shape: `[n, dims...]` when `per_row` (n = the plan's rows), else `[dims...]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    pub per_row: bool,
    pub dims: Vec<usize>,
}

impl Shape {
    /// `[n, dims...]`.
    pub fn rows(dims: &[usize]) -> Shape {
        Shape {
            per_row: true,
            dims: dims.to_vec(),
        }
    }

    /// Elements at `rows` rows; saturates at `usize::MAX` rather than wrap (see
    /// `checked_elements`).
    pub fn elements(&self, rows: usize) -> usize {
        self.checked_elements(rows).unwrap_or(usize::MAX)
    }

    /// Elements at `rows` rows, `None` when the product overflows `usize`.
    pub fn checked_elements(&self, rows: usize) -> Option<usize> {
        let per = self
            .dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
        if self.per_row {
            per.checked_mul(rows)
        } else {
            Some(per)
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        match (self.per_row, dims.is_empty()) {
            (true, true) => write!(f, "[n]"),
            (true, false) => write!(f, "[n,{}]", dims.join(",")),
            (false, _) => write!(f, "[{}]", dims.join(",")),
        }
    }
}

/// Where a tensor's bytes live. Only `Arena` tensors are planned into the workspace arena;
/// the others are the model's own buffers or persistent state, fixed outside the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Binding {
    Arena,
    /// Uploaded by the session into the metadata region before a run.
    Input(ModelInput),
    /// Read back by the session after a run.
    Output(ModelOutput),
    /// The state after an op updated it in place: an ordering edge that carries no bytes.
    State(StateId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelInput {
    Tokens,
    /// The target's final hidden rows (`ModelOutput::Hidden`), read by the MTP draft head.
    Hidden,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelOutput {
    Logits,
    /// The target's final-norm output (what its LM head reads), kept for the draft head:
    /// bf16 `[n, hidden]` in the workspace's hidden region.
    Hidden,
    /// The draft head's own final-norm output (`mtp.norm`), which the next draft step chains
    /// from: bf16 `[n, hidden]` in the workspace's draft-hidden region.
    DraftHidden,
}

impl Binding {
    pub fn as_str(&self) -> &'static str {
        match self {
            Binding::Arena => "arena",
            Binding::Input(ModelInput::Tokens) => "input.tokens",
            Binding::Input(ModelInput::Hidden) => "input.hidden",
            Binding::Output(ModelOutput::Logits) => "output.logits",
            Binding::Output(ModelOutput::Hidden) => "output.hidden",
            Binding::Output(ModelOutput::DraftHidden) => "output.draft_hidden",
            Binding::State(_) => "state",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Shape,
    pub binding: Binding,
}

impl Tensor {
    /// Bytes this tensor occupies at `rows` rows; zero for state edges. Exact for a tensor
    /// the builder accepted at `rows <= MAX_ROWS` (at most `MAX_TENSOR_BYTES`); otherwise it
    /// saturates at `usize::MAX` rather than wrap (see `checked_bytes`).
    pub fn bytes(&self, rows: usize) -> usize {
        self.checked_bytes(rows).unwrap_or(usize::MAX)
    }

    /// Bytes at `rows` rows, `None` when the product overflows `usize`.
    pub fn checked_bytes(&self, rows: usize) -> Option<usize> {
        match self.binding {
            Binding::State(_) => Some(0),
            _ => self
                .shape
                .checked_elements(rows)?
                .checked_mul(self.dtype.size_bytes()),
        }
    }
}

/// A per-step value in the workspace's metadata region, uploaded by the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetaField {
    Positions,
    SlotMapping,
    SeqLens,
    BlockTables,
    /// Each row's per-sequence state slot (recurrent layers): the slot its kernels read.
    StateSlots,
    /// Each row's slot the recurrent kernels write the advanced state to: its `StateSlots`
    /// entry (in place), or another slot, so the slot read survives the step untouched.
    StateSlotsOut,
    /// Each row's flag: 1 where a verify program's recurrent kernels keep the state after the
    /// row (a speculative row the session may roll back to), 0 where they skip it.
    KeepSnapshots,
    /// Each row's flag: 1 where the step reads the row's logits (copied back, or picked on
    /// the device), 0 where the LM head skips the row and leaves its logits row as it was (a
    /// padding row; a prompt chunk's row nobody reads, as in a mixed step). vLLM's
    /// `logits_indices` make the same cut by gathering the rows first.
    WantLogits,
}

impl MetaField {
    pub fn as_str(self) -> &'static str {
        match self {
            MetaField::Positions => "positions",
            MetaField::SlotMapping => "slot_mapping",
            MetaField::SeqLens => "seq_lens",
            MetaField::BlockTables => "block_tables",
            MetaField::StateSlots => "state_slots",
            MetaField::StateSlotsOut => "state_slots_out",
            MetaField::KeepSnapshots => "keep_snapshots",
            MetaField::WantLogits => "want_logits",
        }
    }
}

/// The kind of a decoder layer, matched by a rule's `layer_kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    FullAttention,
    /// Gated DeltaNet (qwen3_next's linear attention).
    LinearAttention,
}

impl LayerKind {
    pub const ALL: &'static [LayerKind] = &[LayerKind::FullAttention, LayerKind::LinearAttention];

    pub fn as_str(self) -> &'static str {
        match self {
            LayerKind::FullAttention => "full_attention",
            LayerKind::LinearAttention => "linear_attention",
        }
    }

    pub fn parse(name: &str) -> Option<LayerKind> {
        LayerKind::ALL.iter().copied().find(|k| k.as_str() == name)
    }
}

/// A weight slot: one checkpoint tensor, by its name in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSlot {
    pub name: String,
    pub shape: Vec<usize>,
    /// When not empty, the slot is these checkpoint tensors stacked along a new first axis
    /// (e.g. one tensor per expert), each of shape `shape[1..]`; `name` is then the slot's
    /// own name, not a checkpoint tensor's.
    pub parts: Vec<String>,
    /// The element type the kernels compute with (bf16); checkpoints in other float formats
    /// are converted at load.
    pub dtype: Dtype,
    /// How the slot's bytes are stored (`crate::format`): bf16, or quantized and dequantized
    /// to `dtype` in registers by the kernels that read it. Chosen by the precision policy.
    pub format: crate::format::WeightFormat,
}

impl WeightSlot {
    /// Bytes the slot occupies on the device: dense `dtype` elements for bf16, the format's
    /// blobs ([`WeightFormat::slot_bytes`](crate::format::WeightFormat::slot_bytes)) for a
    /// quantized slot. Saturates at `usize::MAX` rather than wrap.
    pub fn bytes(&self) -> usize {
        let dense = || {
            self.shape
                .iter()
                .try_fold(self.dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
        };
        match self.format {
            crate::format::WeightFormat::Bf16 => dense(),
            quantized => quantized.slot_bytes(&self.shape),
        }
        .unwrap_or(usize::MAX)
    }
}

/// Persistent per-sequence state that outlives a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDecl {
    pub name: String,
    pub kind: StateKind,
}

impl StateKind {
    /// Bytes of one sequence slot's state (recurrent kinds); KV pages are per page, not slot.
    /// Exact for a state the builder accepted; otherwise saturates rather than wrap.
    pub fn slot_bytes(&self) -> usize {
        self.checked_slot_bytes().unwrap_or(usize::MAX)
    }

    /// `slot_bytes`, `None` when the product overflows `usize`.
    pub fn checked_slot_bytes(&self) -> Option<usize> {
        let product = |factors: &[usize]| {
            factors
                .iter()
                .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        };
        match *self {
            StateKind::KvPages { .. } => Some(0),
            StateKind::GdnConv {
                channels, history, ..
            } => product(&[channels, history, 2]),
            StateKind::GdnRecurrent {
                heads,
                key_dim,
                value_dim,
                ..
            } => product(&[heads, key_dim, value_dim, 4]),
        }
    }

    /// Bytes of one KV page (K then V), `None` for the recurrent kinds or on overflow.
    pub fn checked_page_bytes(&self) -> Option<usize> {
        match *self {
            StateKind::KvPages {
                block_size,
                num_kv_heads,
                head_dim,
                dtype,
                ..
            } => [2, block_size, num_kv_heads, head_dim, dtype.size_bytes()]
                .iter()
                .try_fold(1usize, |acc, &f| acc.checked_mul(f)),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateKind {
    /// Paged KV cache of one attention layer: pages of `block_size` tokens, each holding
    /// K then V as `[block_size, num_kv_heads, head_dim]`.
    KvPages {
        layer: u32,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
        dtype: Dtype,
    },
    /// Gated DeltaNet conv history per sequence slot: `[channels][history]` bf16
    /// (history = kernel - 1).
    GdnConv {
        layer: u32,
        channels: usize,
        history: usize,
    },
    /// Gated DeltaNet recurrent state per sequence slot: `[heads][key_dim][value_dim]` f32.
    GdnRecurrent {
        layer: u32,
        heads: usize,
        key_dim: usize,
        value_dim: usize,
    },
}

/// A scalar attribute an op's kernels need (eps, head counts, rope base...).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f64),
}

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Int(v) => write!(f, "{v}"),
            // Debug prints the shortest text that round-trips: stable for digests.
            Attr::Float(v) => write!(f, "{v:?}"),
        }
    }
}

/// One operation of the step.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub kind: crate::ops::OpKind,
    /// Unique, readable name, e.g. `l3.q_proj`.
    pub name: String,
    /// What the op is for within its kind, matched by a rule's `role` (e.g. `q_proj`).
    pub role: String,
    pub layer: Option<u32>,
    pub layer_kind: Option<LayerKind>,
    pub inputs: Vec<TensorId>,
    pub outputs: Vec<TensorId>,
    pub weights: Vec<WeightId>,
    pub meta: Vec<MetaField>,
    pub attrs: Vec<(String, Attr)>,
    /// Branch hint: ops with a non-zero branch may run on a side stream.
    pub branch: u8,
}

/// One decode step of a model as a graph of ops.
#[derive(Debug, Clone, PartialEq)]
pub struct Circuit {
    pub name: String,
    pub family: String,
    pub num_layers: u32,
    pub tensors: Vec<Tensor>,
    pub ops: Vec<Op>,
    pub weights: Vec<WeightSlot>,
    pub states: Vec<StateDecl>,
    /// Writer of each tensor (None for model inputs), indexed by `TensorId`.
    pub producers: Vec<Option<NodeId>>,
    /// Readers of each tensor in execution order, indexed by `TensorId`.
    pub consumers: Vec<Vec<NodeId>>,
}

impl Circuit {
    pub fn op(&self, id: NodeId) -> &Op {
        &self.ops[id.0 as usize]
    }

    /// ` window=W` for each of `nodes` that attends over a sliding window (its `window`
    /// attribute), in node order; empty when none does. Printed plans and plan digests carry
    /// it, so a windowed plan never reads as (or digests to) a full-attention one.
    pub fn windows_note(&self, nodes: &[NodeId]) -> String {
        nodes
            .iter()
            .filter_map(|n| {
                self.op(*n)
                    .attrs
                    .iter()
                    .find(|(key, _)| key == "window")
                    .map(|(_, value)| format!(" window={value}"))
            })
            .collect()
    }

    /// ` weight=NAME:FORMAT` for each weight slot `nodes` read that is not stored bf16, in node
    /// order, each slot once; empty when every one is bf16. Plan digests and printed plans carry
    /// it, so a quantized plan never reads as (or digests to) a bf16 one, and a bf16 plan's
    /// text is what it was before weights had formats.
    pub fn formats_note(&self, nodes: &[NodeId]) -> String {
        let mut seen: Vec<WeightId> = Vec::new();
        let mut out = String::new();
        for &w in nodes.iter().flat_map(|n| &self.op(*n).weights) {
            let slot = &self.weights[w.0 as usize];
            if slot.format != crate::format::WeightFormat::Bf16 && !seen.contains(&w) {
                seen.push(w);
                out += &format!(" weight={}:{}", slot.name, slot.format);
            }
        }
        out
    }

    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.0 as usize]
    }

    pub fn producer(&self, id: TensorId) -> Option<NodeId> {
        self.producers[id.0 as usize]
    }

    pub fn consumers(&self, id: TensorId) -> &[NodeId] {
        &self.consumers[id.0 as usize]
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.ops.len() as u32).map(NodeId)
    }
}
