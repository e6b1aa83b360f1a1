//! Compiling plans into programs bound to the exec's allocations: what a build does once and
//! `resize_kv` does again against the new state allocation.

use solder_circuit::{ExecutionPlan, Instance, RouteCondition};
use solder_gpu_runtime::{GpuBackend, LaunchOrder};

use super::owned::Memory;
use crate::bind::Bindings;
use crate::error::ExecError;
use crate::layout::Layout;
use crate::program::{compile, Program};

/// Where programs bind: the layout and the three allocations; and the levers the emitters
/// read.
pub(super) struct Targets<'a> {
    pub(super) layout: &'a Layout,
    pub(super) memory: Memory,
    pub(super) levers: &'a solder_config::Levers,
}

/// Compiles the primary programs of `plans` and the route arms of `arms`, bound to `targets`.
pub(super) fn compile_all<'p>(
    backend: &mut dyn GpuBackend,
    instance: &'p Instance,
    targets: &'p Targets<'p>,
    plans: &'p [ExecutionPlan],
    arms: impl Iterator<Item = (RouteCondition, &'p ExecutionPlan)>,
    launch_order: LaunchOrder,
) -> Result<(Vec<Program>, Vec<Program>), ExecError> {
    let bind = |plan: &'p ExecutionPlan| -> Result<Bindings<'_>, ExecError> {
        Ok(Bindings {
            circuit: instance.circuit_for(plan.mode)?,
            plan,
            layout: targets.layout,
            workspace: targets.memory.workspace,
            weights: targets.memory.weights,
            kv: targets.memory.kv,
            levers: targets.levers,
        })
    };
    let programs = plans
        .iter()
        .map(|plan| compile(plan, &bind(plan)?, backend, launch_order))
        .collect::<Result<Vec<_>, _>>()?;
    let arms = arms
        .map(|(condition, plan)| {
            let mut program = compile(plan, &bind(plan)?, backend, launch_order)?;
            program.arm = Some(condition);
            Ok(program)
        })
        .collect::<Result<Vec<_>, ExecError>>()?;
    Ok((programs, arms))
}
