//! solder's model layers: weights (`checkpoint`, `weights`), the host side of the kernels
//! (`kernels`: one declaration per kernel — its typed arguments and grid, CPU twin and
//! emitter side by side, one file or folder per kernel module; `numerics`: the shared
//! arithmetic), `emit` (plan group → launches through the kernels' emitters), `program`
//! (plan → `Program` with final pointers), `exec` (`CircuitExec`: every program of a model in
//! one workspace), `graphs` (the exec's step graphs: policy, cache, lifecycle, counters),
//! `meta` (the per-step metadata: its region's layout, a step's values, their encoding and
//! upload), `session` (`Session`: paged KV cache, state slots, prefill, decode,
//! multi-sequence steps) and `sampling` (greedy, temperature/top-k/top-p with a seeded
//! generator per sequence, speculative sampling's accept/resample rule).
//!
//! Invariants: a program reads per-step values only from the workspace's metadata region;
//! the workspace is allocated once per `CircuitExec` and freed only after every graph that
//! captured one of its programs is destroyed; a fused twin that its rule calls
//! `bit_identical` performs the same arithmetic in the same order as the reference twins.

mod bind;
mod bytes;
pub mod checkpoint;
pub mod emit;
pub mod error;
pub mod exec;
pub mod graphs;
pub mod kernels;
pub mod layout;
pub mod meta;
pub mod numerics;
pub mod program;
pub mod sampling;
pub mod session;
pub mod weights;

pub use checkpoint::Checkpoint;
pub use error::{ExecError, MetaError, SessionError, WeightsError};
pub use exec::{Boot, CircuitExec, HiddenRows, KvShape, WeightSource, PDL_LEVER};
pub use graphs::{
    CaptureReport, CapturedGraph, EagerReason, GraphCounters, GraphPolicy, ProgramKey, StepRun,
};
pub use program::{Program, ProgramStep};
pub use sampling::{greedy, Acceptance, Sampler, Sampling, SamplingError, SamplingParams};
pub use session::{
    Acceptances, Draft, Drafter, ModelDrafter, MtpDrafter, RewindPoint, SeqId, Session, SpecPolicy,
    SpeculativeStep, Verdict,
};
pub use weights::HostWeights;
