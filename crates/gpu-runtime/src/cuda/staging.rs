//! Pinned host staging for [`copy_h2d_async`](crate::GpuBackend::copy_h2d_async): the caller's
//! bytes are copied into page-locked memory before the call returns, and the DMA reads that copy
//! later, on the stream.
//!
//! Invariants: a slot's bytes are never rewritten while a copy that reads them may still be
//! pending (its event, recorded after the copy, has not completed); every slot is freed
//! exactly once, with the backend's context current.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};

use super::driver::{describe, driver};
use crate::error::GpuError;

/// Smallest slot allocated, in bytes.
const MIN_SLOT_BYTES: usize = 4096;
/// Idle slots kept for reuse; more are freed.
const MAX_SPARE_SLOTS: usize = 16;

/// A page-locked host buffer and the event recorded after the copy that uses it (shared with
/// `readback`, whose copies write such buffers).
pub(super) struct Slot {
    pub(super) host: *mut u8,
    pub(super) capacity: usize,
    /// Recorded on the stream right after the copy that reads (or writes) `host`.
    pub(super) done: CudaEvent,
}

#[derive(Default)]
pub(super) struct Staging {
    in_flight: Vec<Slot>,
    spare: Vec<Slot>,
}

// SAFETY: the pinned buffers are owned by the staging area alone; the backend binds its
// context before touching them from any thread.
unsafe impl Send for Staging {}

impl Staging {
    /// Copies `src` into a pinned slot and queues `cuMemcpyHtoDAsync` from it on `stream`.
    /// The backend's context must be current and no capture active.
    pub(super) fn copy(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        dst: u64,
        src: &[u8],
    ) -> Result<(), GpuError> {
        if src.is_empty() {
            return Ok(());
        }
        self.retire_completed()?;
        let slot = self.take(ctx, src.len())?;
        // SAFETY: the slot holds at least `src.len()` bytes, no pending copy reads them.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), slot.host, src.len()) };
        // SAFETY: `slot.host` stays allocated until `done` completes (see `retire_completed`).
        let queued = unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst,
                slot.host as *const c_void,
                src.len(),
                stream.cu_stream(),
            )
        }
        .result();
        if let Err(error) = queued {
            self.spare.push(slot);
            return Err(driver("cuMemcpyHtoDAsync", error));
        }
        if let Err(error) = slot.done.record(stream) {
            // Without its event the slot cannot be known free: wait for the stream instead.
            let waited = stream.synchronize();
            self.spare.push(slot);
            waited.map_err(|e| driver("cuStreamSynchronize", e))?;
            return Err(driver("cuEventRecord", error));
        }
        self.in_flight.push(slot);
        Ok(())
    }

    /// Moves every slot whose copy completed back to the spare list.
    fn retire_completed(&mut self) -> Result<(), GpuError> {
        retire(&mut self.in_flight, &mut self.spare)
    }

    /// After a full synchronisation: every copy completed.
    pub(super) fn all_completed(&mut self) {
        self.spare.append(&mut self.in_flight);
    }

    /// The smallest spare slot that fits `bytes`, or a new one.
    fn take(&mut self, ctx: &Arc<CudaContext>, bytes: usize) -> Result<Slot, GpuError> {
        take_spare(&mut self.spare, ctx, bytes)
    }

    /// Frees every slot. The caller has waited for all work; the context is current.
    pub(super) fn free_all(&mut self) {
        self.all_completed();
        self.spare.drain(..).for_each(free_slot);
    }
}

/// Moves every slot of `pending` whose copy completed to `spare`, then frees spares past
/// `MAX_SPARE_SLOTS`, the smallest first (large ones are the costly ones to pin again).
pub(super) fn retire(pending: &mut Vec<Slot>, spare: &mut Vec<Slot>) -> Result<(), GpuError> {
    let mut index = 0;
    while index < pending.len() {
        let complete = pending[index]
            .done
            .try_is_complete()
            .map_err(|e| driver("cuEventQuery", e))?;
        if complete {
            spare.push(pending.swap_remove(index));
        } else {
            index += 1;
        }
    }
    while spare.len() > MAX_SPARE_SLOTS {
        let smallest = (0..spare.len())
            .min_by_key(|i| spare[*i].capacity)
            .expect("spare is not empty");
        free_slot(spare.swap_remove(smallest));
    }
    Ok(())
}

/// The smallest slot of `spare` that fits `bytes`, or a new one.
pub(super) fn take_spare(
    spare: &mut Vec<Slot>,
    ctx: &Arc<CudaContext>,
    bytes: usize,
) -> Result<Slot, GpuError> {
    let best = (0..spare.len())
        .filter(|i| spare[*i].capacity >= bytes)
        .min_by_key(|i| spare[*i].capacity);
    match best {
        Some(index) => Ok(spare.swap_remove(index)),
        None => new_slot(ctx, bytes),
    }
}

/// A new pinned slot of at least `bytes` (a power of two, at least `MIN_SLOT_BYTES`).
pub(super) fn new_slot(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Slot, GpuError> {
    let capacity = bytes.next_power_of_two().max(MIN_SLOT_BYTES);
    let done = ctx
        .new_event(None)
        .map_err(|e| driver("cuEventCreate", e))?;
    // SAFETY: a plain page-locked allocation; freed once in `free_slot`.
    let host =
        unsafe { result::malloc_host(capacity, 0) }.map_err(|e| driver("cuMemHostAlloc", e))?;
    Ok(Slot {
        host: host.cast(),
        capacity,
        done,
    })
}

/// Frees a slot whose copy completed; the context is current.
pub(super) fn free_slot(slot: Slot) {
    // SAFETY: allocated by `malloc_host`, freed once; its copy completed.
    if let Err(error) = unsafe { result::free_host(slot.host.cast()) } {
        tracing::warn!(error = %describe(error), "cuMemFreeHost");
    }
}
