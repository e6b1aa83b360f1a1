//! The pass driver: [`ExecutionPlan::build`](crate::ExecutionPlan::build) runs topo → liveness →
//! streams → memory → linearise and, when [`BuildOptions::verify`](crate::BuildOptions::verify) is
//! on, the verifier after each pass and on the finished plan.
//!
//! Invariant: with verification on, `build` returns only plans [`verify::verify_plan`] accepts
//! (a failure is a compiler bug reported as [`CircuitError::Verify`]).

use super::{linearise, liveness, memory, streams, topo};
use crate::error::CircuitError;
use crate::fuser::fuse;
use crate::instance::Instance;
use crate::ir::{Circuit, MAX_TENSOR_BYTES};
use crate::mode::Mode;
use crate::plan::{weight_bytes_by_format, Buffer, ExecutionPlan};
use crate::policy::{Available, Policy};
use crate::rules::{hex_sha256, RuleSet};
use crate::verify;

/// Whether `build` runs the verifier after each pass: by default in debug builds only;
/// release callers that want it (`cargo xtask plan --verify`, parity) say so.
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

/// The largest arena a plan may have: 2^56 bytes, far above any real one and far below
/// `usize::MAX`, where the placement saturates.
const MAX_ARENA_BYTES: usize = 1 << 56;

/// Every arena buffer's bytes at `rows` fit (a circuit not built by `CircuitBuilder`, whose
/// fields are public, may hold any shape): refused by name, never wrapped.
fn check_sizes(
    circuit: &Circuit,
    lifetimes: &[liveness::Lifetime],
    rows: usize,
) -> Result<(), CircuitError> {
    for l in lifetimes {
        let tensor = circuit.tensor(l.tensor);
        if tensor
            .checked_bytes(rows)
            .is_none_or(|bytes| bytes > MAX_TENSOR_BYTES)
        {
            return Err(CircuitError::TooLarge {
                what: "tensor".to_string(),
                name: tensor.name.clone(),
                shape: format!("{} {} at {rows} rows", tensor.dtype.as_str(), tensor.shape),
                max: MAX_TENSOR_BYTES,
            });
        }
    }
    Ok(())
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
        let circuit = instance.circuit_for(mode)?;
        let check = options.verify;
        let keeps_snapshots = instance.program_shapes().keeps_snapshots(mode, rows);
        let offered;
        let available = match keeps_snapshots {
            true => available,
            false => {
                offered = available
                    .clone()
                    .with_capability(crate::shapes::NO_SNAPSHOTS);
                &offered
            }
        };
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
        check_sizes(circuit, &lifetimes, rows)?;
        if check {
            verify::check_liveness(circuit, &fusion, &order, &lifetimes)?;
        }
        let streams = streams::assign_streams(circuit, &fusion, &order, policy.max_streams);
        if check {
            verify::check_streams(circuit, &fusion, &streams)?;
        }
        let (placement, live_lower_bound) = place_arena(
            circuit,
            &lifetimes,
            &streams,
            order.len(),
            (mode, rows),
            check,
        )?;
        let (steps, event_count) = linearise::linearise(&order, &streams);

        let buffers = buffers(circuit, &lifetimes, &placement.offsets);
        let middle = middle_layer(circuit);
        let mut plan = ExecutionPlan {
            circuit: circuit.name.clone(),
            mode,
            rows,
            keeps_snapshots,
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
            weight_bytes: weight_bytes_by_format(circuit),
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
}

/// The arena's placement and its live lower bound; an arena over [`MAX_ARENA_BYTES`] is
/// refused, and with `check` the placement is verified.
fn place_arena(
    circuit: &Circuit,
    lifetimes: &[liveness::Lifetime],
    streams: &streams::StreamPlan,
    positions: usize,
    (mode, rows): (Mode, usize),
    check: bool,
) -> Result<(memory::Placement, usize), CircuitError> {
    let adjacency = memory::conflicts(lifetimes, streams);
    let live_lower_bound = memory::live_lower_bound(lifetimes, positions);
    let placement = memory::place(lifetimes, &adjacency, live_lower_bound);
    let live_lower_bound = memory::lower_bound(
        lifetimes,
        &adjacency,
        live_lower_bound,
        placement.pool_bytes,
    );
    if placement.pool_bytes > MAX_ARENA_BYTES {
        return Err(CircuitError::TooLarge {
            what: "arena".to_string(),
            name: circuit.name.clone(),
            shape: format!("{mode} at {rows} rows, {} bytes", placement.pool_bytes),
            max: MAX_ARENA_BYTES,
        });
    }
    if check {
        verify::check_memory(lifetimes, &adjacency, &placement, live_lower_bound)?;
    }
    Ok((placement, live_lower_bound))
}

/// One [`Buffer`] per arena lifetime, at its placed offset.
fn buffers(circuit: &Circuit, lifetimes: &[liveness::Lifetime], offsets: &[usize]) -> Vec<Buffer> {
    lifetimes
        .iter()
        .zip(offsets)
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
        .collect()
}

/// The middle of the layers the circuit's ops belong to (`num_layers / 2` for a model's own
/// circuit; the head's one layer for a draft circuit).
fn middle_layer(circuit: &Circuit) -> u32 {
    let layers: std::collections::BTreeSet<u32> =
        circuit.ops.iter().filter_map(|op| op.layer).collect();
    layers
        .iter()
        .nth(layers.len() / 2)
        .copied()
        .unwrap_or(circuit.num_layers / 2)
}
