//! What an exec holds on its backend: its three allocations (`Memory`), the device resources
//! it made and must give back (`Owned`), the backend it is bound to (`BoundBackend`), and its
//! process-wide id.
//!
//! Invariant: every allocation, side stream and event an exec (or a build in progress) makes
//! is recorded in its `Owned` as it is made, so a failed build or a `free` gives back exactly
//! what was made, last made first.

use solder_gpu_runtime::{DevicePtr, EventId, GpuBackend, StreamId};

use crate::error::ExecError;

/// The exec's three allocations.
#[derive(Debug, Clone, Copy)]
pub(super) struct Memory {
    pub(super) workspace: DevicePtr,
    pub(super) weights: DevicePtr,
    pub(super) kv: DevicePtr,
}

/// Process-wide unique exec ids (graphs name their owner by it).
pub(super) fn fresh_exec_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The backend an exec was built on: its `instance_id`, and words naming it in errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BoundBackend {
    pub(super) id: u64,
    pub(super) name: String,
}

impl BoundBackend {
    pub(super) fn of(backend: &dyn GpuBackend) -> BoundBackend {
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
pub(super) struct Owned {
    pub(super) allocations: Vec<DevicePtr>,
    pub(super) streams: Vec<StreamId>,
    pub(super) events: Vec<EventId>,
}

impl Owned {
    pub(super) fn is_empty(&self) -> bool {
        self.allocations.is_empty() && self.streams.is_empty() && self.events.is_empty()
    }

    pub(super) fn alloc(
        &mut self,
        backend: &mut dyn GpuBackend,
        bytes: usize,
    ) -> Result<DevicePtr, ExecError> {
        let ptr = backend.alloc(bytes)?;
        self.allocations.push(ptr);
        Ok(ptr)
    }

    pub(super) fn create_stream(
        &mut self,
        backend: &mut dyn GpuBackend,
    ) -> Result<StreamId, ExecError> {
        let stream = backend.create_stream()?;
        self.streams.push(stream);
        Ok(stream)
    }

    pub(super) fn create_event(
        &mut self,
        backend: &mut dyn GpuBackend,
    ) -> Result<EventId, ExecError> {
        let event = backend.create_event()?;
        self.events.push(event);
        Ok(event)
    }

    /// Waits for the device, then destroys events and streams and frees allocations, last
    /// made first; returns the first failure (what failed stays owned). A failed wait does
    /// not stop the rest: a backend that cannot wait is not going to run the work either.
    pub(super) fn release(&mut self, backend: &mut dyn GpuBackend) -> Result<(), ExecError> {
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
