//! Building an exec from a `Boot`: the weights loaded and checked against the circuit's slots,
//! a plan for every (mode, rows) of the serve shape and for every runtime route's arm, the
//! workspace sized and filled (`workspace`), every program compiled against it, and the
//! streams and events the widest plan needs.
//!
//! Invariant: each step records what it makes in the build's `Owned` before the next step
//! runs, so `CircuitExec::build` can give everything back when a later step fails. The order of
//! allocations, uploads and compiles is fixed: a rebuild lands on the same addresses.

use std::sync::Mutex;

use solder_circuit::{
    plans_digest, Available, CircuitOptions, ExecutionPlan, Instance, Policy, RouteCondition,
    RuleSet,
};
use solder_gpu_runtime::{EventId, GpuBackend, LaunchOrder, StreamId};

use super::boot::{Boot, WeightSource};
use super::compile::{compile_all, Targets};
use super::owned::{fresh_exec_id, BoundBackend, Owned};
use super::pools::Pools;
use super::workspace::{self, Weights};
use super::{CircuitExec, PDL_LEVER};
use crate::checkpoint::Checkpoint;
use crate::error::ExecError;
use crate::graphs::lifecycle::Graphs;
use crate::layout::Layout;
use crate::weights::{check_checkpoint, HostWeights};
use solder_config::Quantization;

/// The plans of a build: the primaries in shape order, and the arms of the runtime routes
/// whose plan differs from their primary's, each with its condition.
struct Planned {
    plans: Vec<ExecutionPlan>,
    arm_conditions: Vec<RouteCondition>,
    arm_plans: Vec<ExecutionPlan>,
}

impl Planned {
    /// Every plan the workspace serves: primaries, then arms.
    fn served(&self) -> Vec<&ExecutionPlan> {
        self.plans.iter().chain(&self.arm_plans).collect()
    }
}

impl CircuitExec {
    /// `build`, recording in `owned` every device resource it makes.
    pub(super) fn build_owning(
        backend: &mut dyn GpuBackend,
        boot: Boot,
        owned: &mut Owned,
    ) -> Result<CircuitExec, ExecError> {
        let Boot {
            config,
            serve,
            rules,
            policy,
            weights,
            kv,
            precision,
        } = boot;
        kv.check()?;
        let options = CircuitOptions {
            kv_block_size: kv.block_size,
        };
        let instance =
            Instance::from_config_precision(&config, serve, options, &precision, &rules)?;
        // Weights first: a checkpoint missing a tensor is refused before any plan is built.
        let weights = load_weights(&instance, weights, config.quantization.as_ref())?;
        let available = Available {
            kernels: backend.kernel_names().into_iter().collect(),
            ..Available::default()
        };
        let planned = plan_all(&instance, &rules, &available, &policy)?;
        let inv_freq = config.rope.kernel_table(config.head_dim);
        let served = planned.served();
        let layout = workspace::size(&instance, &served, config.vocab_size, inv_freq.len(), &kv)?;
        let memory = workspace::allocate(backend, owned, &layout, weights, &inv_freq)?;
        let launch_order = launch_order(&policy);
        let targets = Targets {
            layout: &layout,
            memory,
            levers: &policy.levers,
        };
        let arms = planned.arm_conditions.iter().copied();
        let (programs, arms) = compile_all(
            backend,
            &instance,
            &targets,
            &planned.plans,
            arms.zip(&planned.arm_plans),
            launch_order,
        )?;
        let gdn_pitch = gdn_pitch(&instance, &layout);
        let (streams, events) = make_lanes(backend, owned, &served)?;
        tracing::info!(
            model = %instance.circuit.name, programs = programs.len(), workspace_bytes = layout.workspace_bytes,
            weights_bytes = layout.weights_bytes, state_bytes = layout.state_bytes, "built circuit exec"
        );
        let id = fresh_exec_id();
        Ok(CircuitExec {
            owned: std::mem::take(owned),
            backend: BoundBackend::of(backend),
            pools: Mutex::new(Pools::new(&layout, memory.kv)),
            rules_digest: rules.digest.clone(),
            levers: policy.levers.clone(),
            // Primaries in shape order, then the route arms.
            plans_digest: plans_digest(planned.plans.iter().chain(&planned.arm_plans)),
            config,
            instance,
            plans: planned.plans,
            programs,
            arms,
            arm_plans: planned.arm_plans,
            gdn_pitch,
            layout,
            memory,
            streams,
            events,
            graphs: Graphs::new(id),
            freed: false,
            id,
            launch_order,
        })
    }
}

/// The weights of `source`, checked against the circuit's weight slots (the draft circuit,
/// when served, extends the model's slots: one list for both): host bytes of the right
/// lengths, or a checkpoint whose every slot was found with its shape and format (headers
/// only: its tensors are read when streamed to the device).
fn load_weights<'a>(
    instance: &'a Instance,
    source: WeightSource,
    quantization: Option<&'a Quantization>,
) -> Result<Weights<'a>, ExecError> {
    let storage = instance.storage();
    let host = match source {
        WeightSource::Checkpoint(dir) => {
            let checkpoint = Checkpoint::open(&dir)?;
            if instance.draft.is_some() {
                check_draft_head(&checkpoint, &instance.serve().draft_widths)?;
            }
            check_checkpoint(storage, &checkpoint, quantization)?;
            return Ok(Weights::Checkpoint {
                checkpoint,
                circuit: storage,
                quantization,
            });
        }
        WeightSource::Host(w) => w,
        WeightSource::Random { seed } => HostWeights::random(storage, seed),
    };
    if host.slots.len() != storage.weights.len() {
        return Err(ExecError::Build(format!(
            "{} weight slots given, the circuit has {}",
            host.slots.len(),
            storage.weights.len()
        )));
    }
    host.check_lengths(storage)?;
    Ok(Weights::Host(host))
}

/// A plan for every (mode, rows) of the serve shape, then an arm plan per (mode, rows) whose
/// runtime route enables different rules.
fn plan_all(
    instance: &Instance,
    rules: &RuleSet,
    available: &Available,
    policy: &Policy,
) -> Result<Planned, ExecError> {
    let plans = instance
        .shapes()
        .into_iter()
        .map(|(mode, rows)| ExecutionPlan::build(instance, rules, available, policy, mode, rows))
        .collect::<Result<Vec<_>, _>>()?;
    let mut arm_conditions = Vec::new();
    let mut arm_plans = Vec::new();
    for plan in &plans {
        for condition in solder_circuit::routes::routes(instance.circuit_for(plan.mode)?, plan.mode)
        {
            let with = available.clone().with_capability(condition.capability());
            let arm = ExecutionPlan::build(instance, rules, &with, policy, plan.mode, plan.rows)?;
            if arm.digest != plan.digest {
                arm_conditions.push(condition);
                arm_plans.push(arm);
            }
        }
    }
    Ok(Planned {
        plans,
        arm_conditions,
        arm_plans,
    })
}

/// Bytes between consecutive state slots of each Gated DeltaNet layer's recurrent state.
fn gdn_pitch(instance: &Instance, layout: &Layout) -> Vec<usize> {
    instance
        .circuit
        .states
        .iter()
        .zip(&layout.states)
        .filter(|(decl, _)| {
            matches!(
                decl.kind,
                solder_circuit::ir::StateKind::GdnRecurrent { .. }
            )
        })
        .map(|(_, region)| region.slot_bytes)
        .collect()
}

/// Stream 0 and the side streams and events the widest of `served` needs.
fn make_lanes(
    backend: &mut dyn GpuBackend,
    owned: &mut Owned,
    served: &[&ExecutionPlan],
) -> Result<(Vec<StreamId>, Vec<EventId>), ExecError> {
    let mut streams = vec![backend.default_stream()];
    for _ in 1..served.iter().map(|p| p.num_streams).max().unwrap_or(1) {
        streams.push(owned.create_stream(backend)?);
    }
    let events = (0..served.iter().map(|p| p.event_count).max().unwrap_or(0))
        .map(|_| owned.create_event(backend))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((streams, events))
}

/// How the exec's launches are ordered: programmatic dependent launch with the `pdl` lever.
fn launch_order(policy: &Policy) -> LaunchOrder {
    if policy.levers.is_on(PDL_LEVER) {
        LaunchOrder::Programmatic
    } else {
        LaunchOrder::Serial
    }
}

/// A checkpoint the draft programs are built for must carry the MTP head (`mtp.*`): one
/// without any is refused by name before any slot is read (a partial head is refused by the
/// first missing tensor's name when the slots load).
fn check_draft_head(checkpoint: &Checkpoint, draft_widths: &[usize]) -> Result<(), ExecError> {
    let prefix = solder_circuit::families::MTP_PREFIX;
    if checkpoint.names().any(|name| name.starts_with(prefix)) {
        return Ok(());
    }
    Err(ExecError::Build(format!(
        "{}: the serve asks for draft programs (draft_widths {draft_widths:?}) but the \
         checkpoint has no MTP draft head (no `{prefix}*` tensor): leave draft_widths empty",
        checkpoint.dir.display()
    )))
}
