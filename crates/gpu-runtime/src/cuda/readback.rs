//! Pinned host memory for [`copy_d2h_async`](crate::GpuBackend::copy_d2h_async): each readback
//! copies into a page-locked slot (`staging::Slot`) with `cuMemcpyDtoHAsync`, and the slot's
//! event, recorded right after the copy, says when its bytes are there. `take` waits on that
//! event alone, never on the device.
//!
//! Invariants: a slot is read on the host only after its event completed; a slot is reused or
//! freed only after its event completed (a released readback waits in `released` until then);
//! every slot is freed exactly once, with the backend's context current.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaStream};

use super::driver::driver;
use super::staging::{free_slot, retire, take_spare, Slot};
use crate::error::GpuError;
use crate::types::ReadbackId;

/// A queued copy: its slot and its length.
struct Live {
    slot: Slot,
    bytes: usize,
}

#[derive(Default)]
pub(super) struct Readbacks {
    live: HashMap<u32, Live>,
    /// Slots of released readbacks whose copy may still be pending.
    released: Vec<Slot>,
    spare: Vec<Slot>,
    next: u32,
}

// SAFETY: the pinned buffers are owned by this table alone; the backend binds its context
// before touching them from any thread.
unsafe impl Send for Readbacks {}

impl Readbacks {
    /// Queues `cuMemcpyDtoHAsync` of `bytes` from `src` into a pinned slot on `stream`. The
    /// backend's context must be current and no capture active.
    pub(super) fn copy(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        src: u64,
        bytes: usize,
    ) -> Result<ReadbackId, GpuError> {
        self.retire_released()?;
        let id = self.next;
        let next = id.checked_add(1).ok_or(GpuError::Driver {
            call: "copy_d2h_async",
            message: "readback ids exhausted".into(),
        })?;
        let slot = take_spare(&mut self.spare, ctx, bytes)?;
        if bytes > 0 {
            // SAFETY: the slot holds at least `bytes`; no pending copy uses it.
            let queued = unsafe {
                sys::cuMemcpyDtoHAsync_v2(slot.host as *mut c_void, src, bytes, stream.cu_stream())
            }
            .result();
            if let Err(error) = queued {
                self.spare.push(slot);
                return Err(driver("cuMemcpyDtoHAsync", error));
            }
        }
        if let Err(error) = slot.done.record(stream) {
            // Without its event the slot cannot be known written: wait for the stream instead.
            let waited = stream.synchronize();
            self.spare.push(slot);
            waited.map_err(|e| driver("cuStreamSynchronize", e))?;
            return Err(driver("cuEventRecord", error));
        }
        self.next = next;
        self.live.insert(id, Live { slot, bytes });
        Ok(ReadbackId(id))
    }

    pub(super) fn ready(&self, readback: ReadbackId) -> Result<bool, GpuError> {
        self.live(readback)?
            .slot
            .done
            .try_is_complete()
            .map_err(|e| driver("cuEventQuery", e))
    }

    /// Waits for the copy's event and moves its bytes into `dst`.
    pub(super) fn take(&mut self, readback: ReadbackId, dst: &mut [u8]) -> Result<(), GpuError> {
        let live = self.live(readback)?;
        if live.bytes != dst.len() {
            return Err(GpuError::ReadbackLength {
                readback: readback.0,
                asked: dst.len(),
                holds: live.bytes,
            });
        }
        live.slot
            .done
            .synchronize()
            .map_err(|e| driver("cuEventSynchronize", e))?;
        let live = self.live.remove(&readback.0).expect("looked up above");
        // SAFETY: the copy into `host` completed; `dst` holds exactly `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(live.slot.host, dst.as_mut_ptr(), live.bytes) };
        self.spare.push(live.slot);
        Ok(())
    }

    /// Ends a readback without its bytes: its slot is reused once its copy completed.
    pub(super) fn release(&mut self, readback: ReadbackId) -> Result<(), GpuError> {
        self.live(readback)?;
        let live = self.live.remove(&readback.0).expect("looked up above");
        self.released.push(live.slot);
        self.retire_released()
    }

    /// After a full synchronisation: every copy completed.
    pub(super) fn all_completed(&mut self) {
        self.spare.append(&mut self.released);
    }

    /// Frees every slot, ended or not. The caller has waited for all work; the context is
    /// current.
    pub(super) fn free_all(&mut self) {
        self.all_completed();
        self.spare
            .extend(self.live.drain().map(|(_, live)| live.slot));
        self.spare.drain(..).for_each(free_slot);
    }

    fn live(&self, readback: ReadbackId) -> Result<&Live, GpuError> {
        self.live.get(&readback.0).ok_or(GpuError::UnknownHandle {
            what: "readback",
            id: readback.0,
        })
    }

    /// Moves released slots whose copy completed to the spare list.
    fn retire_released(&mut self) -> Result<(), GpuError> {
        retire(&mut self.released, &mut self.spare)
    }
}
