//! `CircuitExec`: every compiled program of a model, its one workspace, its weights and its
//! KV cache on a backend.
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

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use solder_circuit::{
    plans_digest, Available, CircuitOptions, ExecutionPlan, Instance, Mode, Policy, RouteCondition,
    RuleSet,
};
use solder_config::{ModelConfig, ServeShape};
use solder_gpu_runtime::{
    DevicePtr, EventId, GpuBackend, GraphExecId, GraphId, LaunchOrder, StreamId,
};

use crate::bind::Bindings;
use crate::bytes;
use crate::checkpoint::Checkpoint;
use crate::error::ExecError;
use crate::graphs::{
    CaptureReport, Decision, GraphCache, GraphCounters, GraphPolicy, ProgramKey, StepRun,
};
use crate::layout::{check_state_bytes, Layout};
use crate::program::{compile, Program};
mod pools;

use crate::weights::HostWeights;
pub(crate) use pools::{PagePool, Pools};

/// The lever that launches every kernel with programmatic dependent launch
/// (`LaunchOrder::Programmatic`): a launch mode, not a rule, so plans and their digests are
/// the same with it on or off.
pub const PDL_LEVER: &str = "pdl";

/// Where the weights come from.
pub enum WeightSource {
    /// A Hugging Face checkpoint folder.
    Checkpoint(PathBuf),
    /// Weights already on the host (converted).
    Host(HostWeights),
    /// Random weights from a seed (built-in models and benches).
    Random { seed: u64 },
}

/// The KV cache's shape: pages, tokens per page, and the longest sequence served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvShape {
    pub pages: usize,
    pub block_size: usize,
    pub max_seq_len: usize,
    /// Sequences alive at once (recurrent state slots; KV pages are shared from one pool).
    pub max_sequences: usize,
}

impl KvShape {
    /// Page ids travel as i32 in the block tables the kernels read.
    pub const MAX_PAGES: usize = i32::MAX as usize;
    /// The circuit's own bound on tokens per page.
    pub const MAX_BLOCK_SIZE: usize = solder_circuit::families::MAX_KV_BLOCK_SIZE;
    /// `max_position_embeddings`' bound (`DIM_BOUNDS`): no model reaches further.
    pub const MAX_SEQ_LEN: usize = 1 << 26;
    /// Recurrent-state slots (slot ids are u32; a million live sequences is far past any
    /// serve).
    pub const MAX_SEQUENCES: usize = 1 << 20;

    /// Each field within its range, refused by name (the state allocation's size is checked
    /// at build, once the model's state is known: `layout::check_state_bytes`).
    pub fn check(&self) -> Result<(), ExecError> {
        let fields = [
            (
                "KvShape::pages",
                self.pages,
                2,
                Self::MAX_PAGES,
                "one is the scratch page",
            ),
            (
                "KvShape::block_size",
                self.block_size,
                1,
                Self::MAX_BLOCK_SIZE,
                "tokens per page",
            ),
            (
                "KvShape::max_seq_len",
                self.max_seq_len,
                1,
                Self::MAX_SEQ_LEN,
                "longest sequence",
            ),
            (
                "KvShape::max_sequences",
                self.max_sequences,
                0,
                Self::MAX_SEQUENCES,
                "state slots",
            ),
        ];
        for (field, value, min, max, what) in fields {
            if !(min..=max).contains(&value) {
                return Err(ExecError::Argument {
                    field,
                    value: value.to_string(),
                    message: format!("must be {min}..={max} ({what})"),
                });
            }
        }
        Ok(())
    }
}

/// Everything a build needs.
pub struct Boot {
    pub config: ModelConfig,
    pub serve: ServeShape,
    pub rules: RuleSet,
    pub policy: Policy,
    pub weights: WeightSource,
    pub kv: KvShape,
}

/// A graph captured from one of the exec's programs. Not `Clone`: `release` consumes it, so a
/// graph cannot be released twice, and it remembers the exec that captured it, which alone
/// may replay or release it.
#[derive(Debug, PartialEq, Eq)]
pub struct CapturedGraph {
    pub mode: Mode,
    pub rows: usize,
    graph: GraphId,
    exec: GraphExecId,
    /// `CircuitExec::id` of the exec that captured it.
    owner: u64,
}

/// Process-wide unique exec ids (graphs name their owner by it).
fn fresh_exec_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The backend an exec was built on: its `instance_id`, and words naming it in errors.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BoundBackend {
    id: u64,
    name: String,
}

impl BoundBackend {
    fn of(backend: &dyn GpuBackend) -> BoundBackend {
        let facts = backend.facts();
        BoundBackend {
            id: backend.instance_id(),
            name: format!(
                "{} backend #{} ({})",
                facts.backend,
                backend.instance_id(),
                facts.name
            ),
        }
    }
}

/// Device resources an exec (or a build in progress) owns and must give back: allocations,
/// streams other than stream 0, and events. `release` gives back what is left and forgets
/// each as it goes, so a second call after a failure retries only what failed.
#[derive(Debug, Default)]
struct Owned {
    allocations: Vec<DevicePtr>,
    streams: Vec<StreamId>,
    events: Vec<EventId>,
}

impl Owned {
    fn is_empty(&self) -> bool {
        self.allocations.is_empty() && self.streams.is_empty() && self.events.is_empty()
    }

    fn alloc(
        &mut self,
        backend: &mut dyn GpuBackend,
        bytes: usize,
    ) -> Result<DevicePtr, ExecError> {
        let ptr = backend.alloc(bytes)?;
        self.allocations.push(ptr);
        Ok(ptr)
    }

    fn create_stream(&mut self, backend: &mut dyn GpuBackend) -> Result<StreamId, ExecError> {
        let stream = backend.create_stream()?;
        self.streams.push(stream);
        Ok(stream)
    }

    fn create_event(&mut self, backend: &mut dyn GpuBackend) -> Result<EventId, ExecError> {
        let event = backend.create_event()?;
        self.events.push(event);
        Ok(event)
    }

    /// Waits for the device, then destroys events and streams and frees allocations, last
    /// made first; returns the first failure (what failed stays owned). A failed wait does
    /// not stop the rest: a backend that cannot wait is not going to run the work either.
    fn release(&mut self, backend: &mut dyn GpuBackend) -> Result<(), ExecError> {
        let mut first: Option<ExecError> = backend.synchronize().err().map(ExecError::from);
        let mut keep = |result: Result<(), solder_gpu_runtime::GpuError>| match result {
            Ok(()) => false,
            Err(e) => {
                first.get_or_insert(e.into());
                true
            }
        };
        let mut events = std::mem::take(&mut self.events);
        events.reverse();
        events.retain(|&e| keep(backend.destroy_event(e)));
        let mut streams = std::mem::take(&mut self.streams);
        streams.reverse();
        streams.retain(|&s| keep(backend.destroy_stream(s)));
        let mut allocations = std::mem::take(&mut self.allocations);
        allocations.reverse();
        allocations.retain(|&p| keep(backend.free(p)));
        self.events = events;
        self.streams = streams;
        self.allocations = allocations;
        first.map_or(Ok(()), Err)
    }
}

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
    workspace: DevicePtr,
    weights: DevicePtr,
    kv: DevicePtr,
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
    /// Graphs handed out by `capture` and not yet released.
    live_graphs: usize,
    /// The step graphs `run_step` keeps, their policy and counters.
    graphs: Mutex<GraphCache>,
    freed: bool,
    /// Unique in the process: the owner a `CapturedGraph` records.
    id: u64,
    /// How every program's launches are ordered (`Programmatic` with the `pdl` lever).
    launch_order: LaunchOrder,
}

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

    /// `build`, recording in `owned` every device resource it makes.
    fn build_owning(
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
        } = boot;
        kv.check()?;
        let options = CircuitOptions {
            kv_block_size: kv.block_size,
        };
        let instance = Instance::from_config_with(&config, serve, options)?;
        // Weights first: a checkpoint missing a tensor is refused before any plan is built.
        // The draft circuit (when served) extends the model's slots: one list for both.
        let storage = instance.storage();
        let host = match weights {
            WeightSource::Checkpoint(dir) => {
                let checkpoint = Checkpoint::open(&dir)?;
                if instance.draft.is_some() {
                    check_draft_head(&checkpoint, &instance.serve().draft_widths)?;
                }
                HostWeights::load(storage, &checkpoint)?
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
        let available = Available {
            kernels: backend.kernel_names().into_iter().collect(),
            ..Available::default()
        };
        let plans = instance
            .shapes()
            .into_iter()
            .map(|(mode, rows)| {
                ExecutionPlan::build(&instance, &rules, &available, &policy, mode, rows)
            })
            .collect::<Result<Vec<_>, _>>()?;

        // Runtime routes: an arm plan per (mode, rows) whose route enables different rules.
        let mut arm_plans = Vec::new();
        for plan in &plans {
            for condition in
                solder_circuit::routes::routes(instance.circuit_for(plan.mode)?, plan.mode)
            {
                let with = available.clone().with_capability(condition.capability());
                let arm =
                    ExecutionPlan::build(&instance, &rules, &with, &policy, plan.mode, plan.rows)?;
                if arm.digest != plan.digest {
                    arm_plans.push((condition, arm));
                }
            }
        }
        let inv_freq = config.rope.inv_freq(config.head_dim);
        // Every program the workspace serves, route arms included: the arena is sized for the
        // largest of them, so an arm never overwrites what lies past the arena.
        let served: Vec<&ExecutionPlan> = plans
            .iter()
            .chain(arm_plans.iter().map(|(_, p)| p))
            .collect();
        let max_rows = served.iter().map(|p| p.rows).max().unwrap_or(1);
        check_state_bytes(instance.storage(), max_rows, kv.pages, kv.max_sequences).map_err(
            |(field, message)| {
                let (field, value) = match field {
                    "pages" => ("KvShape::pages", kv.pages),
                    _ => ("KvShape::max_sequences", kv.max_sequences),
                };
                ExecError::Argument {
                    field,
                    value: value.to_string(),
                    message,
                }
            },
        )?;
        let layout = Layout::new(
            instance.storage(),
            &served,
            config.vocab_size,
            inv_freq.len(),
            kv.pages,
            kv.max_seq_len,
            kv.max_sequences,
        );

        let workspace = owned.alloc(backend, layout.workspace_bytes)?;
        // The attention kernels' arrival counters (and the o-fold kernels' and gemv's split-K
        // counters, right after them) start at zero; each launch leaves them so.
        let scratch_bytes =
            layout.attn_scratch_bytes + layout.o_scratch_bytes + layout.gemv_scratch_bytes;
        if scratch_bytes > 0 {
            backend.memset(
                workspace.offset(layout.attn_scratch_offset),
                0,
                scratch_bytes,
            )?;
        }
        let weights_ptr = owned.alloc(backend, layout.weights_bytes)?;
        let kv_ptr = owned.alloc(backend, layout.state_bytes)?;
        for (slot, offset) in host.slots.iter().zip(&layout.weight_offsets) {
            backend.copy_h2d(weights_ptr.offset(*offset), bytes::bf16_bytes(slot))?;
        }
        backend.copy_h2d(
            weights_ptr.offset(layout.inv_freq_offset),
            &bytes::f32_bytes(&inv_freq),
        )?;
        drop(host);

        let arm_conditions: Vec<RouteCondition> = arm_plans.iter().map(|(c, _)| *c).collect();
        let arm_only: Vec<ExecutionPlan> = arm_plans.into_iter().map(|(_, p)| p).collect();
        let targets = Targets {
            layout: &layout,
            workspace,
            weights: weights_ptr,
            kv: kv_ptr,
            levers: &policy.levers,
        };
        let launch_order = launch_order(&policy);
        let (programs, arms) = compile_all(
            backend,
            &instance,
            &targets,
            &plans,
            arm_conditions.iter().copied().zip(&arm_only),
            launch_order,
        )?;
        let gdn_pitch = instance
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
            .collect();
        let mut streams = vec![backend.default_stream()];
        for _ in 1..plans
            .iter()
            .chain(&arm_only)
            .map(|p| p.num_streams)
            .max()
            .unwrap_or(1)
        {
            streams.push(owned.create_stream(backend)?);
        }
        let events = (0..plans
            .iter()
            .chain(&arm_only)
            .map(|p| p.event_count)
            .max()
            .unwrap_or(0))
            .map(|_| owned.create_event(backend))
            .collect::<Result<Vec<_>, _>>()?;
        tracing::info!(
            model = %instance.circuit.name, programs = programs.len(), workspace_bytes = layout.workspace_bytes,
            weights_bytes = layout.weights_bytes, state_bytes = layout.state_bytes, "built circuit exec"
        );
        let pools = Mutex::new(Pools::new(&layout, kv_ptr));
        Ok(CircuitExec {
            owned: std::mem::take(owned),
            backend: BoundBackend::of(backend),
            pools,
            rules_digest: rules.digest.clone(),
            levers: policy.levers.clone(),
            // Primaries in shape order, then the route arms.
            plans_digest: plans_digest(plans.iter().chain(&arm_only)),
            config,
            instance,
            plans,
            programs,
            arms,
            arm_plans: arm_only,
            gdn_pitch,
            layout,
            workspace,
            weights: weights_ptr,
            kv: kv_ptr,
            streams,
            events,
            live_graphs: 0,
            graphs: Mutex::new(GraphCache::default()),
            freed: false,
            id: fresh_exec_id(),
            launch_order,
        })
    }

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
        self.workspace
    }

    pub fn kv_cache(&self) -> DevicePtr {
        self.kv
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
        self.programs
            .iter()
            .find(|p| p.mode == mode && p.rows == rows)
            .ok_or_else(|| {
                let available: Vec<String> = self
                    .programs
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

    pub fn decode_program(&self) -> Result<&Program, ExecError> {
        self.program(Mode::Decode, 1)
    }

    pub fn multi_seq_program(&self, rows: usize) -> Result<&Program, ExecError> {
        self.program(Mode::MultiSeq, rows)
    }

    /// The plans of the runtime routes' arms, each with its condition, in `arms()` order
    /// (printable with `PlanDisplay` like any plan).
    pub fn arm_plans(&self) -> impl Iterator<Item = (RouteCondition, &ExecutionPlan)> {
        self.arms
            .iter()
            .zip(&self.arm_plans)
            .filter_map(|(program, plan)| program.arm.map(|c| (c, plan)))
    }

    /// The arms of runtime routes (each with its condition in `Program::arm`).
    pub fn arms(&self) -> &[Program] {
        &self.arms
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

    pub fn verify_program(&self, k: usize) -> Result<&Program, ExecError> {
        self.program(Mode::Verify, k)
    }

    /// The plan a program was compiled from.
    pub fn plan(&self, mode: Mode, rows: usize) -> Option<&ExecutionPlan> {
        self.plans.iter().find(|p| p.mode == mode && p.rows == rows)
    }

    /// Refuses a backend other than the one the exec was built on (its memory, streams and
    /// events are not this exec's).
    pub fn check_backend(&self, backend: &dyn GpuBackend) -> Result<(), ExecError> {
        if backend.instance_id() == self.backend.id {
            return Ok(());
        }
        Err(ExecError::WrongBackend {
            built_on: self.backend.name.clone(),
            given: BoundBackend::of(backend).name,
        })
    }

    /// The page and slot pools, locked (a panic while they were held poisons nothing they
    /// keep: every pool operation leaves them consistent).
    pub(crate) fn pools(&self) -> MutexGuard<'_, Pools> {
        self.pools.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `program` on the model's streams, eagerly.
    pub fn run(&self, backend: &mut dyn GpuBackend, program: &Program) -> Result<(), ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        program.run(backend, &self.streams, &self.events)
    }

    /// The graph cache, locked (every cache operation leaves it consistent).
    fn graph_cache(&self) -> MutexGuard<'_, GraphCache> {
        self.graphs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one step of `program` (its metadata already uploaded) as the graph policy says:
    /// replays its graph, capturing it first if it has none or its graph went stale, or runs
    /// it eagerly. Under `GraphPolicy::Auto` a failed capture turns graphs off for the exec
    /// and the step runs eagerly; under `Always` it is the step's error.
    pub fn run_step(
        &self,
        backend: &mut dyn GpuBackend,
        program: &Program,
    ) -> Result<StepRun, ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        let key = program.key();
        let mut cache = self.graph_cache();
        let exec = match cache.decide(&key) {
            Decision::Eager(reason) => {
                program.run(backend, &self.streams, &self.events)?;
                cache.count_eager(reason);
                return Ok(StepRun::Eager(reason));
            }
            Decision::Replay(exec) => {
                backend.launch_graph(exec, self.streams[0])?;
                cache.counters.graph_launches += 1;
                return Ok(StepRun::Replayed);
            }
            Decision::Capture => match self.capture_into(backend, &mut cache, program) {
                Ok(exec) => exec,
                Err(e) if cache.policy == GraphPolicy::Auto => {
                    tracing::debug!(program = %key, error = %e, "capture failed; the step runs eagerly");
                    program.run(backend, &self.streams, &self.events)?;
                    cache.count_eager(crate::graphs::EagerReason::GraphsOff);
                    return Ok(StepRun::Eager(crate::graphs::EagerReason::GraphsOff));
                }
                Err(e) => return Err(e),
            },
        };
        backend.launch_graph(exec, self.streams[0])?;
        cache.counters.graph_launches += 1;
        Ok(StepRun::Captured)
    }

    /// Captures `program` into the cache (destroying a stale graph of its key first); records
    /// a failure in the cache (turning graphs off under `Auto`).
    fn capture_into(
        &self,
        backend: &mut dyn GpuBackend,
        cache: &mut GraphCache,
        program: &Program,
    ) -> Result<GraphExecId, ExecError> {
        let key = program.key();
        if let Some(old) = cache.graphs.remove(&key) {
            // Captured at an older epoch: never replayed again.
            cache.stale.insert(key);
            cache.counters.invalidated += 1;
            destroy(backend, old.graph, old.exec)?;
        }
        let started = Instant::now();
        match self.capture_program(backend, program) {
            Ok((graph, exec)) => {
                let took = started.elapsed();
                tracing::debug!(program = %key, launches = program.launches(), us = took.as_micros() as u64, "captured a step graph");
                cache.captured(key, graph, exec, took);
                Ok(exec)
            }
            Err(e) => {
                cache.capture_failed(&key, &e.to_string());
                Err(e)
            }
        }
    }

    /// Captures every program of the exec, primaries then route arms, that has no current
    /// graph yet, so no later step pays for a capture. Refused under `GraphPolicy::Never`, or
    /// once a failed capture turned graphs off; a capture that fails is returned (and, under
    /// `Auto`, turns graphs off).
    pub fn capture_all(&self, backend: &mut dyn GpuBackend) -> Result<CaptureReport, ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        let mut cache = self.graph_cache();
        if cache.policy == GraphPolicy::Never {
            return Err(ExecError::Graphs(
                "capture_all under GraphPolicy::Never: set the policy to auto or always first"
                    .into(),
            ));
        }
        if let Some(reason) = &cache.off {
            return Err(ExecError::Graphs(format!(
                "graphs are off for this exec after a failed capture ({reason}); set the policy again to retry"
            )));
        }
        let started = Instant::now();
        let mut report = CaptureReport {
            captured: 0,
            already: 0,
            launches: 0,
            time: Duration::ZERO,
        };
        for program in self.programs.iter().chain(&self.arms) {
            if matches!(cache.decide(&program.key()), Decision::Replay(_)) {
                report.already += 1;
                continue;
            }
            self.capture_into(backend, &mut cache, program)?;
            report.captured += 1;
            report.launches += program.launches();
        }
        report.time = started.elapsed();
        tracing::info!(
            model = %self.instance.circuit.name, captured = report.captured, already = report.already,
            launches = report.launches, ms = report.time.as_secs_f64() * 1e3, "captured the ladder"
        );
        Ok(report)
    }

    /// The graph counters (a snapshot): launches, eager steps and why, captures, recaptures,
    /// capture time.
    pub fn graph_counters(&self) -> GraphCounters {
        self.graph_cache().counters.clone()
    }

    pub fn graph_policy(&self) -> GraphPolicy {
        self.graph_cache().policy
    }

    /// Sets the graph policy of every later step; setting it clears an earlier failure
    /// (graphs are tried again). Cached graphs stay (`release_graphs` destroys them).
    pub fn set_graph_policy(&self, policy: GraphPolicy) {
        self.graph_cache().set_policy(policy);
    }

    /// Destroys every cached step graph (they are captured again at their next use); returns
    /// the first failure, keeping the graphs it could not destroy.
    pub fn release_graphs(&self, backend: &mut dyn GpuBackend) -> Result<(), ExecError> {
        self.check_backend(backend)?;
        let mut cache = self.graph_cache();
        let all = cache.take_all();
        let (kept, first) = destroy_all(backend, all);
        cache.put_back(kept);
        first.map_or(Ok(()), Err)
    }

    /// Captures `program` and instantiates it; on failure ends the capture and destroys what
    /// it made.
    fn capture_program(
        &self,
        backend: &mut dyn GpuBackend,
        program: &Program,
    ) -> Result<(GraphId, GraphExecId), ExecError> {
        let stream = self.streams[0];
        backend.begin_capture(stream)?;
        let ran = program.run(backend, &self.streams, &self.events);
        let graph = backend.end_capture(stream)?;
        if let Err(e) = ran {
            // The capture ended; its graph holds nothing worth keeping.
            let _ = backend.destroy_graph(graph);
            return Err(e);
        }
        match backend.instantiate(graph) {
            Ok(exec) => Ok((graph, exec)),
            Err(e) => {
                let _ = backend.destroy_graph(graph);
                Err(e.into())
            }
        }
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
        let (graph, exec) = self.capture_program(backend, self.program(mode, rows)?)?;
        self.live_graphs += 1;
        Ok(CapturedGraph {
            mode,
            rows,
            graph,
            exec,
            owner: self.id,
        })
    }

    pub fn replay(
        &self,
        backend: &mut dyn GpuBackend,
        graph: &CapturedGraph,
    ) -> Result<(), ExecError> {
        self.check_live()?;
        self.check_backend(backend)?;
        self.check_owner(graph)?;
        Ok(backend.launch_graph(graph.exec, self.streams[0])?)
    }

    /// Whether this exec captured `graph` (only then may it replay or release it).
    pub fn owns(&self, graph: &CapturedGraph) -> bool {
        graph.owner == self.id
    }

    /// Refuses a graph another exec captured.
    fn check_owner(&self, graph: &CapturedGraph) -> Result<(), ExecError> {
        if self.owns(graph) {
            Ok(())
        } else {
            Err(self.foreign((graph.mode, graph.rows, graph.owner), None))
        }
    }

    fn foreign(
        &self,
        (mode, rows, owner): (Mode, usize, u64),
        graph: Option<CapturedGraph>,
    ) -> ExecError {
        ExecError::ForeignGraph {
            mode: mode.to_string(),
            rows,
            owner,
            this: self.id,
            graph: graph.map(Box::new),
        }
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

    pub fn release(
        &mut self,
        backend: &mut dyn GpuBackend,
        graph: CapturedGraph,
    ) -> Result<(), ExecError> {
        self.check_backend(backend)?;
        if !self.owns(&graph) {
            // Handed back inside the error: its owner can still release it.
            let what = (graph.mode, graph.rows, graph.owner);
            return Err(self.foreign(what, Some(graph)));
        }
        backend.destroy_graph_exec(graph.exec)?;
        backend.destroy_graph(graph.graph)?;
        self.live_graphs = self.live_graphs.saturating_sub(1);
        Ok(())
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
        if self.live_graphs > 0 {
            return Err(ExecError::GraphsAlive {
                live: self.live_graphs,
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
        if self.live_graphs > 0 {
            return Err(ExecError::GraphsAlive {
                live: self.live_graphs,
            });
        }
        {
            let pools = self.pools();
            if let Some(held) = pools.held() {
                return Err(ExecError::Build(format!(
                    "resize_kv: {held} still lent; end every sequence first"
                )));
            }
        }
        if !(2..=KvShape::MAX_PAGES).contains(&pages) {
            return Err(ExecError::Argument {
                field: "pages",
                value: pages.to_string(),
                message: format!(
                    "resize_kv: must be 2..={} (one is the scratch page)",
                    KvShape::MAX_PAGES
                ),
            });
        }
        check_state_bytes(
            self.instance.storage(),
            self.layout.max_rows,
            pages,
            self.layout.state_slots - 1,
        )
        .map_err(|(_, message)| ExecError::Argument {
            field: "pages",
            value: pages.to_string(),
            message: format!("resize_kv: {message}"),
        })?;
        let served: Vec<&ExecutionPlan> = self.plans.iter().chain(&self.arm_plans).collect();
        let layout = Layout::new(
            self.instance.storage(),
            &served,
            self.config.vocab_size,
            self.layout.inv_freq_len,
            pages,
            self.layout.max_seq_len,
            self.layout.state_slots - 1,
        );
        if layout.workspace_bytes != self.layout.workspace_bytes
            || layout.weights_bytes != self.layout.weights_bytes
        {
            return Err(ExecError::Build(format!(
                "resize_kv to {pages} pages changes the workspace or weights layout \
                 ({} -> {} workspace bytes): only the state allocation may move",
                self.layout.workspace_bytes, layout.workspace_bytes
            )));
        }
        let mut fresh = Owned::default();
        let kv = fresh.alloc(backend, layout.state_bytes)?;
        let targets = Targets {
            layout: &layout,
            workspace: self.workspace,
            weights: self.weights,
            kv,
            levers: &self.levers,
        };
        let arms = self
            .arms
            .iter()
            .zip(&self.arm_plans)
            .filter_map(|(p, plan)| p.arm.map(|c| (c, plan)));
        let compiled = compile_all(
            backend,
            &self.instance,
            &targets,
            &self.plans,
            arms,
            self.launch_order,
        );
        let (programs, arm_programs) = match compiled {
            Ok(both) => both,
            Err(e) => {
                if let Err(cleanup) = fresh.release(backend) {
                    tracing::warn!(%cleanup, "resize_kv could not free the state allocation it made");
                }
                return Err(e);
            }
        };
        // Every graph baked the old allocation and page count: destroyed before it is freed.
        {
            let mut cache = self.graph_cache();
            let stale = cache.invalidate();
            let (kept, first) = destroy_all(backend, stale);
            if let Some(e) = first {
                cache.put_back(kept);
                drop(cache);
                if let Err(cleanup) = fresh.release(backend) {
                    tracing::warn!(%cleanup, "resize_kv could not free the state allocation it made");
                }
                return Err(e);
            }
        }
        let old = self.kv;
        self.owned.allocations.retain(|&p| p != old);
        self.owned.allocations.append(&mut fresh.allocations);
        if let Err(e) = backend.free(old) {
            tracing::warn!(error = %e, "resize_kv could not free the old state allocation; free() retries it");
            self.owned.allocations.push(old);
        }
        tracing::info!(
            from = self.layout.kv_pages,
            to = pages,
            state_bytes = layout.state_bytes,
            "resized the KV pool"
        );
        self.pools = Mutex::new(Pools::new(&layout, kv));
        self.programs = programs;
        self.arms = arm_programs;
        self.layout = layout;
        self.kv = kv;
        Ok(())
    }

    pub fn default_stream(&self) -> StreamId {
        self.streams[0]
    }
}

/// Where programs bind: the layout and the three allocations; and the levers the emitters
/// read.
struct Targets<'a> {
    layout: &'a Layout,
    workspace: DevicePtr,
    weights: DevicePtr,
    kv: DevicePtr,
    levers: &'a solder_config::Levers,
}

/// Compiles the primary programs of `plans` and the route arms of `arms`, bound to `targets`.
fn compile_all<'p>(
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
            workspace: targets.workspace,
            weights: targets.weights,
            kv: targets.kv,
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

/// Destroys a graph's exec, then the graph.
fn destroy(
    backend: &mut dyn GpuBackend,
    graph: GraphId,
    exec: GraphExecId,
) -> Result<(), ExecError> {
    backend.destroy_graph_exec(exec)?;
    backend.destroy_graph(graph)?;
    Ok(())
}

/// Destroys every graph of `all`; returns those it could not destroy and the first failure.
fn destroy_all(
    backend: &mut dyn GpuBackend,
    all: Vec<(ProgramKey, crate::graphs::Cached)>,
) -> (Vec<(ProgramKey, crate::graphs::Cached)>, Option<ExecError>) {
    let mut kept = Vec::new();
    let mut first = None;
    for (key, cached) in all {
        if let Err(e) = destroy(backend, cached.graph, cached.exec) {
            tracing::warn!(program = %key, error = %e, "could not destroy a step graph");
            first.get_or_insert(e);
            kept.push((key, cached));
        }
    }
    (kept, first)
}
