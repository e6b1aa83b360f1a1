//! `StateBackup`: the recurrent state of the slots a step advances in place, copied
//! device-to-device into the state allocation's backup slots (`layout::StateRegion`) before
//! the step runs, and copied back if it fails, so a failed step leaves the state as it was.
//!
//! Invariants: a backup holds at most `StateRows::backups` slots (a step advances at most one
//! slot per row, each held by a sequence); only the session that saved it restores it, before any other step runs; no program
//! touches the backup slots.

use solder_gpu_runtime::{GpuBackend, GpuError};

use crate::error::SessionError;
use crate::exec::CircuitExec;

#[derive(Debug)]
pub(crate) struct StateBackup {
    /// The slots saved, by backup slot.
    slots: Vec<u32>,
}

impl StateBackup {
    /// Saves every recurrent state region of `slots` (distinct, held by sequences).
    pub(crate) fn save(
        exec: &CircuitExec,
        backend: &mut dyn GpuBackend,
        slots: &[u32],
    ) -> Result<StateBackup, SessionError> {
        // A backup slot per slot a step can advance (`layout::StateRows`): one per row of the
        // widest program, at most one per sequence slot.
        if slots.len() > exec.layout.state_rows.backups {
            return Err(SessionError::TooWide {
                asked: slots.len(),
                widest: exec.layout.state_rows.backups,
            });
        }
        let backup = StateBackup {
            slots: slots.to_vec(),
        };
        backup.copy(exec, backend, Direction::Save)?;
        Ok(backup)
    }

    /// Puts the saved state back into its slots.
    pub(crate) fn restore(
        &self,
        exec: &CircuitExec,
        backend: &mut dyn GpuBackend,
    ) -> Result<(), GpuError> {
        self.copy(exec, backend, Direction::Restore)
    }

    fn copy(
        &self,
        exec: &CircuitExec,
        backend: &mut dyn GpuBackend,
        direction: Direction,
    ) -> Result<(), GpuError> {
        let states = exec.kv_cache();
        for region in exec.layout.states.iter().filter(|r| r.slot_bytes > 0) {
            for (index, &slot) in self.slots.iter().enumerate() {
                let live = states.offset(region.offset + slot as usize * region.slot_bytes);
                let saved = states.offset(region.backup_offset + index * region.slot_bytes);
                match direction {
                    Direction::Save => backend.copy_d2d(saved, live, region.slot_bytes)?,
                    Direction::Restore => backend.copy_d2d(live, saved, region.slot_bytes)?,
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    Save,
    Restore,
}
