//! `StateBackup`: the recurrent state of a slot a caller advances in place (a prompt's chunks,
//! continuing a sequence that holds state), copied device-to-device into a spare slot lent by
//! the slot pool (`SlotPool::spares`) before, and copied back if it fails, so a failure leaves
//! the state as it was. The save is queued on the exec's default stream (`copy_d2d_async`: the
//! host does not wait for the step before it); the restore, after a failure, waits for
//! everything queued first (`copy_d2d`). A step, a speculative verify and a rewind need none of
//! this: they write the new state into spares (`session::state::spares`).
//!
//! Invariants: only the session that saved a backup restores it, before any other step runs;
//! its spare goes back to the pool when it is dropped; no program touches the spare while it
//! lives (the steps it spans advance the slot in place).

use solder_gpu_runtime::{GpuBackend, GpuError};

use crate::error::SessionError;
use crate::exec::CircuitExec;

pub(crate) struct StateBackup<'e> {
    exec: &'e CircuitExec,
    /// The slot saved, and the spare it is saved in.
    slot: u32,
    spare: u32,
}

impl<'e> StateBackup<'e> {
    /// Saves every recurrent state region of `slot` (held by a sequence) into a spare.
    pub(crate) fn save(
        exec: &'e CircuitExec,
        backend: &mut dyn GpuBackend,
        slot: u32,
    ) -> Result<StateBackup<'e>, SessionError> {
        let spares = exec.pools().slots.spares(1)?;
        let backup = StateBackup {
            exec,
            slot,
            spare: spares[0],
        };
        // A failed save drops the backup: its spare goes back.
        backup.copy(backend, Direction::Save)?;
        Ok(backup)
    }

    /// Puts the saved state back into its slot.
    pub(crate) fn restore(&self, backend: &mut dyn GpuBackend) -> Result<(), GpuError> {
        self.copy(backend, Direction::Restore)
    }

    fn copy(&self, backend: &mut dyn GpuBackend, direction: Direction) -> Result<(), GpuError> {
        let exec = self.exec;
        let (states, stream) = (exec.kv_cache(), exec.default_stream());
        for region in exec.layout.states.iter().filter(|r| r.slot_bytes > 0) {
            let at = |s: u32| states.offset(region.offset + s as usize * region.slot_bytes);
            let (live, saved) = (at(self.slot), at(self.spare));
            match direction {
                // Ordered before the step on its stream: nothing waits for the step before.
                Direction::Save => {
                    backend.copy_d2d_async(stream, saved, live, region.slot_bytes)?
                }
                // After a failure: waits for everything queued, then puts the state back.
                Direction::Restore => backend.copy_d2d(live, saved, region.slot_bytes)?,
            }
        }
        Ok(())
    }
}

impl Drop for StateBackup<'_> {
    fn drop(&mut self) {
        self.exec.pools().slots.give_back_spare(self.spare);
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    Save,
    Restore,
}
