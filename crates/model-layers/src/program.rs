//! `Program`: one plan compiled to launches with final device pointers, and its runner.
//!
//! Invariants: a program's launches are exactly its plan's groups' kernels in the plan's
//! order, after one `gemv::counters_reset` where it has split kernels' counters; it reads per-step values only from the workspace's metadata region (uploaded by the
//! session beforehand) and never allocates, synchronises or reads host memory while it runs.

use std::fmt;

use solder_circuit::{ExecutionPlan, Mode, RouteCondition, StepKind};
use solder_gpu_runtime::{
    EventId, GpuBackend, KernelArg, KernelId, LaunchConfig, LaunchOrder, StreamId,
};

use crate::bind::Bindings;
use crate::emit::emit_group;
use crate::error::ExecError;

#[derive(Debug, Clone, PartialEq)]
pub enum ProgramStep {
    Launch {
        stream: u8,
        kernel: KernelId,
        name: &'static str,
        config: LaunchConfig,
        args: Vec<KernelArg>,
    },
    Record {
        stream: u8,
        event: u32,
    },
    Wait {
        stream: u8,
        event: u32,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    pub mode: Mode,
    pub rows: usize,
    pub plan_digest: String,
    pub steps: Vec<ProgramStep>,
    pub num_streams: usize,
    pub event_count: usize,
    /// The runtime route this program is an arm of (None: a primary program).
    pub arm: Option<solder_circuit::RouteCondition>,
    /// How every launch is ordered after the one before it on its stream: `Programmatic`
    /// with the `pdl` lever (programmatic dependent launch), else `Serial`. Not part of the
    /// plan (or its digest): the same launches, scheduled differently, give the same bytes.
    pub launch_order: LaunchOrder,
}

impl Program {
    /// The key its step graph is cached under: (mode, rows, arm).
    pub fn key(&self) -> ProgramKey {
        ProgramKey {
            mode: self.mode,
            rows: self.rows,
            arm: self.arm,
        }
    }

    pub fn launches(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, ProgramStep::Launch { .. }))
            .count()
    }

    /// Submits every step; `streams[i]` and `events[i]` are the backend handles of the plan's
    /// stream and event `i`.
    pub fn run(
        &self,
        backend: &mut dyn GpuBackend,
        streams: &[StreamId],
        events: &[EventId],
    ) -> Result<(), ExecError> {
        for step in &self.steps {
            match step {
                ProgramStep::Launch {
                    stream,
                    kernel,
                    config,
                    args,
                    ..
                } => backend.launch_ordered(
                    streams[*stream as usize],
                    *kernel,
                    config,
                    args,
                    self.launch_order,
                )?,
                ProgramStep::Record { stream, event } => {
                    backend.record_event(events[*event as usize], streams[*stream as usize])?
                }
                ProgramStep::Wait { stream, event } => {
                    backend.wait_event(streams[*stream as usize], events[*event as usize])?
                }
            }
        }
        Ok(())
    }
}

/// Compiles `plan` against `bind`'s device ranges, resolving kernels in `backend`; every
/// launch will be ordered as `launch_order` says.
pub fn compile(
    plan: &ExecutionPlan,
    bind: &Bindings<'_>,
    backend: &dyn GpuBackend,
    launch_order: LaunchOrder,
) -> Result<Program, ExecError> {
    let mut steps = Vec::with_capacity(plan.steps.len() + 1);
    // Every split kernel's arrival counters start the step at zero, whatever an earlier
    // (aborted) step left: the reset is the program's first launch, on stream 0, which every
    // other stream forks from.
    // A backend without the reset (a reference-kernels-only CPU backend) runs without it.
    let reset = crate::kernels::gemv::counters_reset_launch(
        bind.circuit,
        bind.rows(),
        &bind.scratch_regions(),
    )
    .filter(|launch| backend.kernel(launch.kernel).is_ok());
    let resets = match reset {
        Some(launch) => {
            steps.push(ProgramStep::Launch {
                stream: 0,
                kernel: backend.kernel(launch.kernel)?,
                name: launch.kernel,
                config: launch.config,
                args: launch.args,
            });
            1
        }
        None => 0,
    };
    for step in &plan.steps {
        match step.kind {
            StepKind::Launch(g) => {
                for launch in emit_group(bind, plan.group(g), step.stream)? {
                    steps.push(ProgramStep::Launch {
                        stream: step.stream,
                        kernel: backend.kernel(launch.kernel)?,
                        name: launch.kernel,
                        config: launch.config,
                        args: launch.args,
                    });
                }
            }
            StepKind::Record(e) => steps.push(ProgramStep::Record {
                stream: step.stream,
                event: e.0,
            }),
            StepKind::Wait(e) => steps.push(ProgramStep::Wait {
                stream: step.stream,
                event: e.0,
            }),
        }
    }
    let program = Program {
        mode: plan.mode,
        rows: plan.rows,
        plan_digest: plan.digest.clone(),
        steps,
        num_streams: plan.num_streams,
        event_count: plan.event_count,
        arm: None,
        launch_order,
    };
    if program.launches() != plan.kernel_count_fused + resets {
        return Err(ExecError::Build(format!(
            "{} program at {} rows has {} launches, its plan {} and {resets} counter reset",
            plan.mode,
            plan.rows,
            program.launches(),
            plan.kernel_count_fused
        )));
    }
    Ok(program)
}

/// A program by what names it: its mode, rows and route arm (the key graphs are cached by).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProgramKey {
    pub mode: Mode,
    pub rows: usize,
    pub arm: Option<RouteCondition>,
}

impl fmt::Display for ProgramKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.mode, self.rows)?;
        if let Some(arm) = self.arm {
            write!(f, " (arm {})", arm.capability())?;
        }
        Ok(())
    }
}
