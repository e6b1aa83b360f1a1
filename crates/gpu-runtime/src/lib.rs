//! solder's GPU runtime: the [`GpuBackend`] trait (memory, copies, modules, typed launches,
//! streams, events, graph capture, device facts) and its backends.
//!
//! - [`cpu::CpuBackend`]: the reference executor and the checker. Kernels are CPU twins
//!   registered under their `module::func` names ([`twin`]). It poisons new memory, refuses any
//!   launch range outside a live allocation, reports unordered cross-stream accesses to
//!   overlapping bytes (vector clocks advanced by events), and refuses to free memory a live
//!   graph captured.
//! - [`Checked<B>`](Checked): the CPU backend's launch, copy, race and graph-lifetime checks as a
//!   layer over any backend, forwarding every call it accepts.
//! - `cuda::CudaBackend` (feature `cuda`): cudarc with dynamic loading, so it builds with no
//!   CUDA present; construction checks that a driver library loads and returns
//!   [`GpuError::NoDriver`] otherwise, never panicking. Kernels are listed from each module's
//!   PTX; every driver call's result is checked and named.
//!
//! Invariant: backends add no logic of their own beyond executing and checking what they are
//! handed; results of a twin never depend on the number of host threads.

mod backend;
mod checked;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod error;
pub mod twin;
mod types;

pub use backend::{fresh_instance_id, GpuBackend};
pub use checked::Checked;
pub use cpu::CpuBackend;
#[cfg(feature = "cuda")]
pub use cuda::CudaBackend;
pub use error::GpuError;
pub use twin::{par_chunks_mut, Element, TwinCtx, TwinFn};
pub use types::{
    Access, DeviceFacts, DevicePtr, EventId, GraphExecId, GraphId, KernelArg, KernelId,
    LaunchConfig, LaunchOrder, ModuleImage, ReadbackId, StreamId,
};
