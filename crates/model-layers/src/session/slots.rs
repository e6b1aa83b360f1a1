//! `SlotPool`: the recurrent-state slots of a model with recurrent layers (Gated DeltaNet),
//! one per live sequence, lent at a sequence's first step and returned when it ends.
//!
//! Invariants: the scratch slot (`meta::SCRATCH_SLOT`, slot 0) is never lent — padding rows
//! use it; a lent slot is zeroed in every recurrent state region before it is handed out, so a
//! sequence starts from zeros whoever held the slot before; a model without recurrent state
//! has no slots and its sequences never take one.

use solder_gpu_runtime::{DevicePtr, GpuBackend};

use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::meta::SCRATCH_SLOT;

#[derive(Debug, Clone)]
pub(super) struct SlotPool {
    /// Free slots, the next to lend last.
    free: Vec<u32>,
    /// The state allocation and, per recurrent state, the offset of its slots and one slot's
    /// bytes.
    states: DevicePtr,
    regions: Vec<(usize, usize)>,
}

impl SlotPool {
    pub(super) fn new(exec: &CircuitExec) -> SlotPool {
        let regions: Vec<(usize, usize)> = exec
            .layout
            .states
            .iter()
            .filter(|r| r.slot_bytes > 0)
            .map(|r| (r.offset, r.slot_bytes))
            .collect();
        let free = if regions.is_empty() {
            Vec::new()
        } else {
            (SCRATCH_SLOT + 1..exec.layout.state_slots as u32)
                .rev()
                .collect()
        };
        SlotPool {
            free,
            states: exec.kv_cache(),
            regions,
        }
    }

    /// Whether the model keeps recurrent state, so each sequence needs a slot.
    pub(super) fn recurrent(&self) -> bool {
        !self.regions.is_empty()
    }

    /// Checks that `needed` slots are free.
    pub(super) fn check(&self, needed: usize) -> Result<(), SessionError> {
        if needed > self.free.len() {
            return Err(SessionError::SlotsExhausted {
                needed,
                free: self.free.len(),
            });
        }
        Ok(())
    }

    /// Lends the lowest free slot, zeroed; a slot that fails to zero stays free.
    pub(super) fn take(&mut self, backend: &mut dyn GpuBackend) -> Result<u32, SessionError> {
        let Some(slot) = self.free.pop() else {
            return Err(SessionError::SlotsExhausted { needed: 1, free: 0 });
        };
        for &(offset, slot_bytes) in &self.regions {
            let at = self.states.offset(offset + slot as usize * slot_bytes);
            if let Err(e) = backend.memset(at, 0, slot_bytes) {
                self.free.push(slot);
                return Err(e.into());
            }
        }
        Ok(slot)
    }

    /// Returns a slot (zeroed again when next lent).
    pub(super) fn give_back(&mut self, slot: u32) {
        self.free.push(slot);
    }
}
