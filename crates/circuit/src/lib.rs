//! solder's compiler: no GPU, no environment reads, no I/O but the rules file it is handed.
//!
//! From a model's step circuit ([`ir`], built by [`families`] or by an engine through [`builder`])
//! and fusion rules ([`rules`]), [`fuser::fuse`] covers every op by exactly one rule group, and
//! the planner (`planner::{topo, liveness, streams, memory, linearise}`, run in order by its
//! driver) turns the groups into an [`ExecutionPlan`] ([`plan`]) per (mode, rows): launch order,
//! streams and events, and offsets of every kept edge in one arena. [`verify`] checks each
//! pass's output when [`BuildOptions::verify`] is on (tests, debug builds, `plan --verify`);
//! it depends on `plan` and the passes' results, never on the driver.
//!
//! Invariants: every node is covered by exactly one group and a plan never runs a kernel the
//! available modules lack; no two buffers that may be live at the same time overlap; same
//! inputs give the same plan digests, run after run.

#![forbid(unsafe_code)]

pub mod builder;
pub mod chain;
mod display;
pub mod error;
pub mod families;
pub mod flops;
pub mod format;
pub mod fuser;
pub mod instance;
pub mod ir;
pub mod mode;
pub mod ops;
pub mod plan;
pub mod planner;
pub mod policy;
pub mod precision;
pub mod prune;
pub mod routes;
pub mod rules;
pub mod shapes;
pub mod traffic;
pub mod verify;

pub use display::PlanDisplay;
pub use error::CircuitError;
pub use families::{build_circuit, model_name, CircuitOptions};
pub use format::{MatrixLayout, WeightFormat};
pub use fuser::{fuse, FusionPlan, Group, GroupId};
pub use instance::{Instance, Precision};
pub use mode::Mode;
pub use ops::OpKind;
pub use plan::{
    plans_digest, weight_bytes_by_format, Buffer, ExecutionPlan, FormatBytes, Step, StepKind,
};
pub use planner::BuildOptions;
pub use policy::{Available, Fusions, Policy};
pub use precision::{PrecisionSpec, Tier};
pub use routes::RouteCondition;
pub use rules::{Numerics, Rule, RuleSet, Vocabulary};
pub use shapes::ProgramShapes;
pub use traffic::{plan_traffic, LaunchTraffic, PlanTraffic};
