//! `CircuitExec`: every compiled program of a model, its one workspace, its weights and its
//! KV cache on a backend. This file is its public surface; the mechanisms live below it:
//! `boot` (what a build is given), `build` (plans, weights, programs), `compile` (plans bound
//! to the allocations), `workspace` (the three allocations and `resize_kv`), `owned` (the
//! device resources it must give back and the backend it is bound to), `pools` (KV pages and
//! state slots), `hidden` (the MTP draft head's rows); the step graphs' policy, cache and
//! lifecycle are `crate::graphs`'.
//!
//! Invariants: the workspace is allocated once, sized for every program, and never moved, so
//! a captured graph stays valid for the exec's life; `free` refuses while a graph that
//! captured one of its programs is alive. An exec is bound to the backend it was built on
//! (`GpuBackend::instance_id`): every call handed another backend is refused, naming both. A
//! build that fails frees everything it allocated and destroys every stream and event it
//! made; `free` frees and destroys them all. The KV pages and state slots are pooled here,
//! once: every `Session` on the exec lends from the same pools, so no page or slot is ever
//! held by two sequences.
//!
//! Graphs: `run_step` replays the graph of a step's program (captured on first use, or ahead
//! by `capture_all`) as `GraphPolicy` says (`graphs`); `resize_kv`, the one operation that
//! moves memory a program names, destroys every graph captured before it (they are recaptured
//! at their next use), so no graph ever replays stale. `free` destroys the cached graphs and
//! refuses while a graph handed out by `capture` lives.
//!
//! Launch order: with the `pdl` lever every program launches with programmatic dependent
//! launch (`LaunchOrder::Programmatic`), eagerly and in captured graphs; the plans are the
//! same either way.

mod boot;
mod build;
mod compile;
pub(crate) mod hidden;
mod owned;
mod pools;
mod workspace;

use std::sync::{Mutex, MutexGuard, PoisonError};

use half::bf16;
use solder_circuit::{ExecutionPlan, Instance, Mode, RouteCondition};
use solder_config::ModelConfig;
use solder_gpu_runtime::{DevicePtr, EventId, GpuBackend, LaunchOrder, StreamId};

use crate::bytes;
use crate::error::ExecError;
use crate::graphs::lifecycle::{Graphs, Lanes};
use crate::graphs::{CaptureReport, CapturedGraph, GraphCounters, GraphPolicy, StepRun};
use crate::layout::Layout;
use crate::meta::StepMeta;
use crate::program::Program;
pub use boot::{kv_page_bytes, Boot, KvBudget, KvShape, WeightSource};
pub use hidden::HiddenRows;
use owned::{BoundBackend, Memory, Owned};
pub(crate) use pools::{Fill, PagePool, Pools};

/// The lever that launches every kernel with programmatic dependent launch
/// (`LaunchOrder::Programmatic`): a launch mode, not a rule, so plans and their digests are
/// the same with it on or off.
pub const PDL_LEVER: &str = "pdl";

pub struct CircuitExec {
    pub config: ModelConfig,
    pub instance: Instance,
    pub plans: Vec<ExecutionPlan>,
    programs: Vec<Program>,
    /// Runtime-route arms, beside their primary programs.
    arms: Vec<Program>,
    /// The arms' plans, in `arms` order.
    arm_plans: Vec<ExecutionPlan>,
    /// Bytes between consecutive state slots of each Gated DeltaNet layer's recurrent state.
    pub gdn_pitch: Vec<usize>,
    pub layout: Layout,
    /// The workspace, weights and state allocations.
    memory: Memory,
    streams: Vec<StreamId>,
    events: Vec<EventId>,
    /// What `free` gives back: the three allocations, the side streams and the events.
    owned: Owned,
    backend: BoundBackend,
    /// The KV page pool and the state-slot pool every session lends from.
    pools: Mutex<Pools>,
    rules_digest: String,
    plans_digest: String,
    /// The build's levers, which the emitters read again when `resize_kv` recompiles.
    levers: solder_config::Levers,
    /// The step graphs `run_step` keeps (their policy and counters) and the handles
    /// `capture` gave out.
    graphs: Graphs,
    freed: bool,
    /// Unique in the process: the owner a `CapturedGraph` records.
    id: u64,
    /// How every program's launches are ordered (`Programmatic` with the `pdl` lever).
    launch_order: LaunchOrder,
}

/// Building, binding, freeing.
impl CircuitExec {
    /// Builds every program of `boot` on `backend`, which the exec is bound to from then on.
    /// On failure nothing stays allocated: every allocation, stream and event made is given
    /// back before the error returns.
    pub fn build(backend: &mut dyn GpuBackend, boot: Boot) -> Result<CircuitExec, ExecError> {
        let mut owned = Owned::default();
        match CircuitExec::build_owning(backend, boot, &mut owned) {
            Ok(exec) => Ok(exec),
            Err(e) => {
                if let Err(cleanup) = owned.release(backend) {
                    tracing::warn!(%cleanup, build = %e, "a failed build could not give everything back");
                }
                Err(e)
            }
        }
    }

    /// Refuses a backend other than the one the exec was built on (its memory, streams and
    /// events are not this exec's).
    pub(crate) fn check_backend(&self, backend: &dyn GpuBackend) -> Result<(), ExecError> {
        if backend.instance_id() == self.backend.id {
            return Ok(());
        }
        Err(ExecError::WrongBackend {
            built_on: self.backend.name.clone(),
            given: BoundBackend::of(backend).name,
        })
    }

    /// Unique in the process: what graphs and rewind points name their exec by.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// `check_live` then `check_backend`: what every session call checks before it touches
    /// the exec's memory (a session made after `free` must not reach freed memory).
    pub(crate) fn check_usable(&self, backend: &dyn GpuBackend) -> Result<(), ExecError> {
        self.check_live()?;
        self.check_backend(backend)
    }

    pub(crate) fn check_live(&self) -> Result<(), ExecError> {
        if self.freed {
            return Err(ExecError::Freed);
        }
        Ok(())
    }

    /// The page and slot pools, locked (a panic while they were held poisons nothing they
    /// keep: every pool operation leaves them consistent).
    pub(crate) fn pools(&self) -> MutexGuard<'_, Pools> {
        self.pools.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Frees the workspace, weights and KV cache and destroys the exec's side streams and
    /// events; refused while captured graphs live. A free that fails part-way keeps what it
    /// could not give back, and a second call retries only that; a free after a whole one is
    /// `ExecError::Freed`.
    pub fn free(&mut self, backend: &mut dyn GpuBackend) -> Result<(), ExecError> {
        self.check_backend(backend)?;
        if self.freed && self.owned.is_empty() {
            return Err(ExecError::Freed);
        }
        if self.graphs.handles_out() > 0 {
            return Err(ExecError::GraphsAlive {
                live: self.graphs.handles_out(),
            });
        }
        // The step graphs go first: memory a live graph names cannot be freed.
        self.release_graphs(backend)?;
        // Runs and captures are refused from here on, even if a part of the release fails.
        self.freed = true;
        self.owned.release(backend)
    }

    /// Resizes the KV page pool to `pages` pages (page 0 the scratch page): a new state
    /// allocation, every program rebound to it, and every graph captured before destroyed (they
    /// baked the old allocation and page count; each is recaptured at its next use). Needs
    /// every page and slot back in the pools (no sequence alive: a `Session` borrows the exec,
    /// so none can run meanwhile) and no graph handed out by `capture` alive. On failure the
    /// exec is as it was, but for the destroyed graphs.
    pub fn resize_kv(
        &mut self,
        backend: &mut dyn GpuBackend,
        pages: usize,
    ) -> Result<(), ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        self.resize_state(backend, pages)
    }

    /// Grows the KV page pool to `pages` pages keeping every page's contents and id and every
    /// recurrent slot, so sequences parked by `Session::park` resume where they were (their
    /// block tables unchanged); programs are rebound and graphs destroyed (recaptured at next
    /// use). All or nothing, as `resize_kv`.
    pub fn grow_kv(&mut self, backend: &mut dyn GpuBackend, pages: usize) -> Result<(), ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        self.grow_state(backend, pages)
    }
}

/// What was built: digests, memory, programs and plans.
impl CircuitExec {
    pub fn rules_digest(&self) -> &str {
        &self.rules_digest
    }

    pub fn plans_digest(&self) -> &str {
        &self.plans_digest
    }

    pub fn workspace_bytes(&self) -> usize {
        self.layout.workspace_bytes
    }

    pub fn workspace(&self) -> DevicePtr {
        self.memory.workspace
    }

    pub fn kv_cache(&self) -> DevicePtr {
        self.memory.kv
    }

    pub fn default_stream(&self) -> StreamId {
        self.streams[0]
    }

    pub fn programs(&self) -> &[Program] {
        &self.programs
    }

    /// How every program's launches are ordered (`Programmatic` with the `pdl` lever).
    pub fn launch_order(&self) -> LaunchOrder {
        self.launch_order
    }

    /// The program compiled for exactly (mode, rows).
    pub fn program(&self, mode: Mode, rows: usize) -> Result<&Program, ExecError> {
        find_program(&self.programs, mode, rows)
    }

    pub fn decode_program(&self) -> Result<&Program, ExecError> {
        self.program(Mode::Decode, 1)
    }

    pub fn multi_seq_program(&self, rows: usize) -> Result<&Program, ExecError> {
        self.program(Mode::MultiSeq, rows)
    }

    pub fn verify_program(&self, k: usize) -> Result<&Program, ExecError> {
        self.program(Mode::Verify, k)
    }

    /// The multi-seq program for `rows` given each row's recurrent-state slot: an arm whose
    /// condition the slots meet, else the primary program.
    pub fn multi_seq_step(&self, rows: usize, states: &[u32]) -> Result<&Program, ExecError> {
        let arm = self.arms.iter().find(|p| {
            p.mode == Mode::MultiSeq && p.rows == rows && p.arm.is_some_and(|c| c.holds(states))
        });
        match arm {
            Some(arm) => Ok(arm),
            None => self.multi_seq_program(rows),
        }
    }

    /// The arms of runtime routes (each with its condition in `Program::arm`).
    pub fn arms(&self) -> &[Program] {
        &self.arms
    }

    /// The plans of the runtime routes' arms, each with its condition, in `arms()` order
    /// (printable with `PlanDisplay` like any plan).
    pub fn arm_plans(&self) -> impl Iterator<Item = (RouteCondition, &ExecutionPlan)> {
        self.arms
            .iter()
            .zip(&self.arm_plans)
            .filter_map(|(program, plan)| program.arm.map(|c| (c, plan)))
    }

    /// The plan a program was compiled from.
    pub fn plan(&self, mode: Mode, rows: usize) -> Option<&ExecutionPlan> {
        self.plans.iter().find(|p| p.mode == mode && p.rows == rows)
    }
}

/// Running programs, and the graphs they are captured into (`crate::graphs`).
impl CircuitExec {
    /// Runs `program` on the model's streams, eagerly.
    pub fn run(&self, backend: &mut dyn GpuBackend, program: &Program) -> Result<(), ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        program.run(backend, &self.streams, &self.events)
    }

    /// Runs one step of `program` (its metadata already uploaded) as the graph policy says:
    /// replays its graph, capturing it first if it has none or its graph went stale, or runs
    /// it eagerly. Under `GraphPolicy::Auto` a failed capture turns graphs off for the exec
    /// and the step runs eagerly; under `Always` it is the step's error.
    pub(crate) fn run_step(
        &self,
        backend: &mut dyn GpuBackend,
        program: &Program,
    ) -> Result<StepRun, ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        self.graphs.run_step(backend, program, self.lanes())
    }

    /// Captures every program of the exec, primaries then route arms, that has no current
    /// graph yet, so no later step pays for a capture. Refused under `GraphPolicy::Never`, or
    /// once a failed capture turned graphs off; a capture that fails is returned (and, under
    /// `Auto`, turns graphs off).
    pub fn capture_all(&self, backend: &mut dyn GpuBackend) -> Result<CaptureReport, ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        let programs = self.programs.iter().chain(&self.arms);
        let model = &self.instance.circuit.name;
        self.graphs
            .capture_all(backend, programs, self.lanes(), model)
    }

    /// The graph counters (a snapshot): launches, eager steps and why, captures, recaptures,
    /// capture time.
    pub fn graph_counters(&self) -> GraphCounters {
        self.graphs.counters()
    }

    pub fn graph_policy(&self) -> GraphPolicy {
        self.graphs.policy()
    }

    /// Sets the graph policy of every later step; setting it clears an earlier failure
    /// (graphs are tried again). Cached graphs stay (`release_graphs` destroys them).
    pub fn set_graph_policy(&self, policy: GraphPolicy) {
        self.graphs.set_policy(policy);
    }

    /// Destroys every cached step graph (they are captured again at their next use); returns
    /// the first failure, keeping the graphs it could not destroy.
    pub fn release_graphs(&self, backend: &mut dyn GpuBackend) -> Result<(), ExecError> {
        self.check_backend(backend)?;
        self.graphs.release_cached(backend)
    }

    /// Captures the (mode, rows) program into a graph and instantiates it: a handle the
    /// caller replays and releases (apart from the step graphs `run_step` keeps).
    pub fn capture(
        &mut self,
        backend: &mut dyn GpuBackend,
        mode: Mode,
        rows: usize,
    ) -> Result<CapturedGraph, ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        let program = find_program(&self.programs, mode, rows)?;
        let lanes = Lanes {
            streams: &self.streams,
            events: &self.events,
        };
        self.graphs.capture(backend, program, lanes)
    }

    pub fn replay(
        &self,
        backend: &mut dyn GpuBackend,
        graph: &CapturedGraph,
    ) -> Result<(), ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        self.graphs.replay(backend, graph, self.lanes())
    }

    /// Whether this exec captured `graph` (only then may it replay or release it).
    pub fn owns(&self, graph: &CapturedGraph) -> bool {
        self.graphs.owns(graph)
    }

    /// Destroys a graph `capture` handed out; one another exec captured is refused and handed
    /// back inside `ExecError::ForeignGraph`.
    pub fn release(
        &mut self,
        backend: &mut dyn GpuBackend,
        graph: CapturedGraph,
    ) -> Result<(), ExecError> {
        self.check_backend(backend)?;
        self.graphs.release(backend, graph)
    }

    fn lanes(&self) -> Lanes<'_> {
        Lanes {
            streams: &self.streams,
            events: &self.events,
        }
    }
}

/// The MTP draft head's hidden rows (`hidden`), and steps from metadata the caller builds.
impl CircuitExec {
    /// Whether the exec serves the MTP draft head's programs.
    pub fn has_draft_head(&self) -> bool {
        self.instance.draft.is_some()
    }

    /// The first `rows` rows of `which` hidden region (bf16 `[rows, hidden]`), as the last
    /// program that wrote them left them.
    pub fn read_hidden(
        &self,
        backend: &mut dyn GpuBackend,
        which: HiddenRows,
        rows: usize,
    ) -> Result<Vec<bf16>, ExecError> {
        self.read_hidden_at(backend, which, 0, rows)
    }

    /// Rows `first..first + rows` of `which` hidden region (a sequence's rows of a multi-row
    /// step: its place in a multi-seq or batched-verify program).
    pub fn read_hidden_at(
        &self,
        backend: &mut dyn GpuBackend,
        which: HiddenRows,
        first: usize,
        rows: usize,
    ) -> Result<Vec<bf16>, ExecError> {
        self.check_draft(backend)?;
        self.check_hidden_rows("first", first, "rows", rows)?;
        let mut raw = vec![0u8; rows * self.config.hidden_size * 2];
        backend.copy_d2h(self.hidden_ptr(which, first), &mut raw)?;
        Ok(hidden::bf16s_from_bytes(&raw))
    }

    /// Writes `values` (whole rows, bf16 `[n, hidden]`) into the target hidden region's first
    /// rows: the draft head's input for the next draft step.
    pub fn write_hidden(
        &self,
        backend: &mut dyn GpuBackend,
        values: &[bf16],
    ) -> Result<(), ExecError> {
        let hidden = self.config.hidden_size;
        if !values.len().is_multiple_of(hidden) {
            return Err(ExecError::Build(format!(
                "{} hidden values are not whole rows of {hidden}",
                values.len()
            )));
        }
        self.check_draft(backend)?;
        let rows = values.len() / hidden;
        self.check_hidden_rows("first", 0, "values.len() / hidden_size", rows)?;
        let target = self.hidden_ptr(HiddenRows::Target, 0);
        backend.copy_h2d(target, bytes::bf16_bytes(values))?;
        Ok(())
    }

    /// Copies the draft head's output row `from` to the draft input row `to` (device to
    /// device): how one draft step's hidden state feeds the next.
    pub fn chain_hidden(
        &self,
        backend: &mut dyn GpuBackend,
        from: usize,
        to: usize,
    ) -> Result<(), ExecError> {
        self.check_draft(backend)?;
        self.check_hidden_rows("from", from, "rows", 1)?;
        self.check_hidden_rows("to", to, "rows", 1)?;
        backend.copy_d2d(
            self.hidden_ptr(HiddenRows::Target, to),
            self.hidden_ptr(HiddenRows::Draft, from),
            self.config.hidden_size * 2,
        )?;
        Ok(())
    }

    /// One step of the (mode, rows) program with `meta` (built by the caller from its own
    /// pages, positions and slots): uploads it, runs the program (`run_step`), and returns the
    /// logits of every row, f32 `[rows, vocab]`. The caller owns the pages and slots it names;
    /// nothing is lent or checked against a session.
    pub fn step_with_meta(
        &self,
        backend: &mut dyn GpuBackend,
        mode: Mode,
        meta: &StepMeta,
    ) -> Result<Vec<f32>, ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        let rows = meta.rows();
        let program = self.program(mode, rows)?;
        meta.upload(backend, self.default_stream(), self.workspace())?;
        self.run_step(backend, program)?;
        let mut raw = vec![0u8; rows * self.config.vocab_size * 4];
        let logits = self.workspace().offset(self.layout.logits_offset);
        backend.copy_d2h(logits, &mut raw)?;
        Ok(bytes::f32s_from_bytes(&raw))
    }
}

/// The program of `programs` compiled for exactly (mode, rows), or an error listing them.
fn find_program(programs: &[Program], mode: Mode, rows: usize) -> Result<&Program, ExecError> {
    programs
        .iter()
        .find(|p| p.mode == mode && p.rows == rows)
        .ok_or_else(|| {
            let available: Vec<String> = programs
                .iter()
                .map(|p| format!("{}:{}", p.mode, p.rows))
                .collect();
            ExecError::NoProgram {
                mode: mode.to_string(),
                rows,
                available: available.join(" "),
            }
        })
}
