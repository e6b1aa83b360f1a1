//! solder's model layers: a compiled model on a backend, and decoding over it.
//!
//! An engine reads this page first. The API is the crate root:
//! - [`CircuitExec`] — every program of a model (one per mode and padded width) compiled into
//!   one workspace on a backend, with its weights and KV cache: [`CircuitExec::build`] from a
//!   [`Boot`] (the instance, the rules, the weights as a [`WeightSource`], the [`KvShape`]).
//!   Its step graphs follow a [`GraphPolicy`] and report [`GraphCounters`].
//! - [`Session`] — sequences on an exec: prefill, decode, multi-sequence steps, speculative
//!   steps ([`Session::speculative_step`], [`Session::speculative_step_many`]) with a
//!   [`Drafter`] ([`ModelDrafter`], [`MtpDrafter`], or an engine's own), sampling per
//!   sequence ([`Sampling`]), and taking a sequence back ([`RewindPoint`]).
//! - [`HostWeights`] and [`Checkpoint`] — weights on the host; the errors [`ExecError`],
//!   [`SessionError`], [`WeightsError`], [`MetaError`], each naming what is at fault.
//!
//! Public modules, for engines that go below the root: [`kernels`] (the kernel registry, the
//! CPU and CUDA backends loaded with every module), [`meta`] (a step's metadata, for
//! [`CircuitExec::step_with_meta`]), [`sampling`] (the samplers and the accept rule),
//! [`weights`] (seeded random weights, the tolerated unused tensors) and [`numerics`] (the
//! arithmetic every CPU twin is made of).
//!
//! Inside, the layers import downward only: `session` → `exec` → `graphs` → `program` →
//! `emit` → `bind` → `layout` → [`kernels`] → [`numerics`]. The map is `docs/ARCHITECTURE.md`;
//! `examples/` shows each use.
//!
//! Invariants: a program reads per-step values only from the workspace's metadata region;
//! the workspace is allocated once per [`CircuitExec`] and freed only after every graph that
//! captured one of its programs is destroyed; a fused twin whose rule says `bit_identical`
//! performs the same arithmetic in the same order as the reference twins.

mod bind;
mod bytes;
mod checkpoint;
mod emit;
mod error;
mod exec;
mod graphs;
pub mod kernels;
mod layout;
pub mod meta;
pub mod numerics;
mod program;
mod progress;
pub mod sampling;
mod session;
pub mod weights;

pub use checkpoint::Checkpoint;
pub use error::{ExecError, MetaError, SessionError, WeightsError};
pub use exec::{
    kv_page_bytes, Boot, CircuitExec, HiddenRows, KvBudget, KvShape, WeightSource, PDL_LEVER,
};
pub use graphs::{CaptureReport, CapturedGraph, EagerReason, GraphCounters, GraphPolicy, StepRun};
pub use layout::{Layout, StateRegion, StateRows, IDS_SLOTS};
pub use program::{Program, ProgramKey, ProgramStep};
pub use sampling::{greedy, Acceptance, Sampler, Sampling, SamplingError, SamplingParams};
pub use session::{
    Acceptances, Draft, Drafter, ModelDrafter, MtpDrafter, ParkedSession, RewindPoint, SeqId,
    Session, SpecPolicy, SpeculativeStep, Verdict,
};
pub use weights::HostWeights;
