//! The planner: topo → liveness → streams → memory → linearise, from a
//! [`FusionPlan`](crate::FusionPlan) to an [`ExecutionPlan`] (the types live in [`crate::plan`]).
//! Each pass is a module with one entry function; `driver` runs them in order, with the verifier
//! after each pass when asked.
//!
//! Imports go one way: the passes and `verify` use `crate::plan`, and only `driver` uses
//! `verify`, so the verifier never depends on the driver.

mod driver;
pub mod linearise;
pub mod liveness;
pub mod memory;
pub mod streams;
pub mod topo;

pub use crate::plan::{plans_digest, Buffer, EventId, ExecutionPlan, Step, StepKind};
pub use driver::BuildOptions;
