//! The plan types: [`ExecutionPlan`] (one (mode, rows) of a model: launch order, streams,
//! events and the arena), its [`Step`]s and [`Buffer`]s, and [`plans_digest`].
//!
//! Data only, with what can be read off it: the planner ([`planner`](crate::planner)) builds it,
//! the verifier ([`verify`](crate::verify)) checks it, `display` prints it. Invariant: this module
//! depends on neither, so the verifier never depends on the passes' driver.

use std::fmt::Write as _;

use crate::format::WeightFormat;
use crate::fuser::{FusionPlan, Group, GroupId};
use crate::ir::{Circuit, Dtype, Shape, TensorId};
use crate::mode::Mode;
use crate::rules::hex_sha256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(pub u32);

/// The weight slots a plan's ops read that are stored in one format, and their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatBytes {
    pub format: WeightFormat,
    pub slots: usize,
    pub bytes: u64,
}

/// The bytes of the weight slots `circuit`'s ops read, by format: bf16 first, then fp8, then
/// int4 (`WeightFormat::KINDS` order), formats of one kind by their text. Each slot counts
/// once, at [`WeightSlot::bytes`](crate::ir::WeightSlot::bytes); sums saturate.
pub fn weight_bytes_by_format(circuit: &Circuit) -> Vec<FormatBytes> {
    let mut read = vec![false; circuit.weights.len()];
    for op in &circuit.ops {
        for w in &op.weights {
            read[w.0 as usize] = true;
        }
    }
    let mut out: Vec<FormatBytes> = Vec::new();
    for (slot, _) in circuit.weights.iter().zip(&read).filter(|(_, r)| **r) {
        let bytes = slot.bytes() as u64;
        match out.iter_mut().find(|f| f.format == slot.format) {
            Some(f) => {
                f.slots += 1;
                f.bytes = f.bytes.saturating_add(bytes);
            }
            None => out.push(FormatBytes {
                format: slot.format,
                slots: 1,
                bytes,
            }),
        }
    }
    let rank = |f: &WeightFormat| WeightFormat::KINDS.iter().position(|k| *k == f.kind());
    out.sort_by_key(|f| (rank(&f.format), f.format.to_string()));
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    Launch(GroupId),
    Record(EventId),
    Wait(EventId),
}

/// One entry of the submission order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub stream: u8,
    pub kind: StepKind,
}

/// An arena buffer: one kept edge at its offset.
#[derive(Debug, Clone, PartialEq)]
pub struct Buffer {
    pub tensor: TensorId,
    pub name: String,
    pub dtype: Dtype,
    pub shape: Shape,
    pub bytes: usize,
    pub offset: usize,
    pub writer: GroupId,
    pub readers: Vec<GroupId>,
    /// Positions (in launch order) of its writer and last reader.
    pub first: usize,
    pub last: usize,
}

/// One (mode, rows) of a model, ready to compile into a program.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionPlan {
    pub circuit: String,
    pub mode: Mode,
    pub rows: usize,
    /// Whether its recurrent kernels keep per-row snapshots, for a speculative step to roll
    /// back to (`ProgramShapes::keeps_snapshots`: verify and batched verify up to the serve's
    /// `speculative_rows`).
    pub keeps_snapshots: bool,
    pub fusion: FusionPlan,
    /// Groups in launch order.
    pub order: Vec<GroupId>,
    /// Stream of each group, indexed by `GroupId`.
    pub stream_of: Vec<u8>,
    pub steps: Vec<Step>,
    pub buffers: Vec<Buffer>,
    pub num_streams: usize,
    pub event_count: usize,
    pub pool_bytes: usize,
    /// No placement is smaller: the peak over steps of the live bytes, or, where the pool
    /// misses that, the heaviest set of buffers found that may all be live at once (side
    /// streams can make it heavier; `planner::memory::lower_bound`).
    pub live_lower_bound: usize,
    pub placement: &'static str,
    pub kernel_count_original: usize,
    pub kernel_count_fused: usize,
    /// Fused launches in one decoder layer (the middle one).
    pub launches_per_layer: usize,
    pub rules_digest: String,
    /// Bytes of the weights the plan reads, per storage format (`weight_bytes_by_format`).
    pub weight_bytes: Vec<FormatBytes>,
    /// SHA-256 over `canonical_text`: the fusion, the steps and the arena.
    pub digest: String,
}

impl ExecutionPlan {
    pub fn group(&self, id: GroupId) -> &Group {
        self.fusion.group(id)
    }

    pub fn steps_on(&self, stream: u8) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(move |s| s.stream == stream)
    }

    pub fn total_steps(&self) -> usize {
        self.steps.len()
    }

    /// Kernel launches per step (a group may launch several kernels).
    pub fn compute_steps(&self) -> usize {
        self.kernel_count_fused
    }

    /// Whether a weight the plan reads is stored in a format other than bf16.
    pub fn has_quantized_weights(&self) -> bool {
        self.weight_bytes
            .iter()
            .any(|f| f.format != WeightFormat::Bf16)
    }

    pub fn buffer_of(&self, tensor: TensorId) -> Option<&Buffer> {
        self.buffers.iter().find(|b| b.tensor == tensor)
    }

    /// The fusion's text, then the steps and the arena: what the plan digest covers.
    pub fn canonical_text(&self, circuit: &Circuit) -> String {
        let mut out = self.fusion.canonical_text(circuit);
        for step in &self.steps {
            let _ = match step.kind {
                StepKind::Launch(g) => writeln!(out, "s{} launch {}", step.stream, g.0),
                StepKind::Record(e) => writeln!(out, "s{} record {}", step.stream, e.0),
                StepKind::Wait(e) => writeln!(out, "s{} wait {}", step.stream, e.0),
            };
        }
        for b in &self.buffers {
            let _ = writeln!(out, "buffer {} {}+{}", b.name, b.offset, b.bytes);
        }
        let _ = writeln!(out, "pool {}", self.pool_bytes);
        out
    }
}

/// SHA-256 over the digests of `plans`, in order: one name for a model's whole ladder.
pub fn plans_digest<'a>(plans: impl IntoIterator<Item = &'a ExecutionPlan>) -> String {
    let mut text = String::new();
    for p in plans {
        let _ = writeln!(text, "{} {} {}", p.mode, p.rows, p.digest);
    }
    hex_sha256(text.as_bytes())
}
