//! The planner: topo → liveness → streams → memory → linearise, from a `FusionPlan` to an
//! `ExecutionPlan`, with the verifier after each pass in tests and debug builds.
//!
//! Invariant: `ExecutionPlan::build` returns only plans `verify::verify_plan` accepts (it runs
//! whenever verification is on; a failure is a compiler bug reported as `CircuitError::Verify`).

pub mod linearise;
pub mod liveness;
pub mod memory;
pub mod streams;
pub mod topo;

use std::fmt::Write as _;

use crate::error::CircuitError;
use crate::fuser::{fuse, FusionPlan, Group, GroupId};
use crate::instance::Instance;
use crate::ir::{Circuit, Dtype, Shape, TensorId};
use crate::mode::Mode;
use crate::policy::{Available, Policy};
use crate::rules::{hex_sha256, RuleSet};
use crate::verify;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(pub u32);

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

/// Whether `build` runs the verifier after each pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildOptions {
    pub verify: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            verify: cfg!(debug_assertions),
        }
    }
}

/// One (mode, rows) of a model, ready to compile into a program.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionPlan {
    pub circuit: String,
    pub mode: Mode,
    pub rows: usize,
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
    pub live_lower_bound: usize,
    pub placement: &'static str,
    pub kernel_count_original: usize,
    pub kernel_count_fused: usize,
    /// Fused launches in one decoder layer (the middle one).
    pub launches_per_layer: usize,
    pub rules_digest: String,
    /// SHA-256 over `canonical_text`: the fusion, the steps and the arena.
    pub digest: String,
}

impl ExecutionPlan {
    pub fn build(
        instance: &Instance,
        rules: &RuleSet,
        available: &Available,
        policy: &Policy,
        mode: Mode,
        rows: usize,
    ) -> Result<ExecutionPlan, CircuitError> {
        Self::build_with(
            instance,
            rules,
            available,
            policy,
            mode,
            rows,
            BuildOptions::default(),
        )
    }

    pub fn build_with(
        instance: &Instance,
        rules: &RuleSet,
        available: &Available,
        policy: &Policy,
        mode: Mode,
        rows: usize,
        options: BuildOptions,
    ) -> Result<ExecutionPlan, CircuitError> {
        let circuit = &instance.circuit;
        let check = options.verify;
        let fusion = fuse(circuit, rules, available, policy, mode, rows)?;
        if check {
            verify::check_cover(circuit, &fusion, available)?;
        }
        let graph = topo::group_graph(circuit, &fusion);
        let order = topo::topo_order(&graph)?;
        if check {
            verify::check_order(circuit, &fusion, &order)?;
        }
        let lifetimes = liveness::liveness(circuit, &fusion, &order);
        if check {
            verify::check_liveness(circuit, &fusion, &order, &lifetimes)?;
        }
        let streams = streams::assign_streams(circuit, &fusion, &order, policy.max_streams);
        if check {
            verify::check_streams(circuit, &fusion, &streams)?;
        }
        let adjacency = memory::conflicts(&lifetimes, |a, b| streams.happens_before(a, b));
        let placement = memory::place(&lifetimes, &adjacency);
        let live_lower_bound = memory::live_lower_bound(&lifetimes, order.len());
        if check {
            verify::check_memory(&lifetimes, &adjacency, &placement, live_lower_bound)?;
        }
        let (steps, event_count) = linearise::linearise(&order, &streams);

        let buffers = lifetimes
            .iter()
            .zip(&placement.offsets)
            .map(|(l, &offset)| {
                let t = circuit.tensor(l.tensor);
                Buffer {
                    tensor: l.tensor,
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    bytes: l.bytes,
                    offset,
                    writer: l.writer,
                    readers: l.readers.clone(),
                    first: l.first,
                    last: l.last,
                }
            })
            .collect();
        let middle = circuit.num_layers / 2;
        let mut plan = ExecutionPlan {
            circuit: circuit.name.clone(),
            mode,
            rows,
            order,
            stream_of: streams.stream_of,
            steps,
            buffers,
            num_streams: streams.num_streams,
            event_count,
            pool_bytes: placement.pool_bytes,
            live_lower_bound,
            placement: placement.strategy,
            kernel_count_original: fusion.kernel_count_original,
            kernel_count_fused: fusion.kernel_count_fused,
            launches_per_layer: if circuit.num_layers > 0 {
                fusion.launches_in_layer(middle)
            } else {
                0
            },
            rules_digest: fusion.rules_digest.clone(),
            fusion,
            digest: String::new(),
        };
        plan.digest = hex_sha256(plan.canonical_text(circuit).as_bytes());
        if check {
            verify::verify_plan(circuit, &plan, available)?;
        }
        tracing::debug!(
            circuit = %plan.circuit, mode = %mode, rows, launches = plan.compute_steps(),
            pool_bytes = plan.pool_bytes, bound = plan.live_lower_bound, "built plan"
        );
        Ok(plan)
    }

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
