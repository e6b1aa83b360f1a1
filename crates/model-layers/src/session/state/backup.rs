//! `StateBackup`: the recurrent state of the slots a step advances in place, copied
//! device-to-device into the state allocation's backup slots (`layout::StateRegion`) before
//! the step runs, and copied back if it fails, so a failed step leaves the state as it was.
//! The save is queued on the step's stream (`copy_d2d_async`: the host does not wait for the
//! step before it); the restore, after a failure, waits for everything queued first
//! (`copy_d2d`).
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
        let (states, stream) = (exec.kv_cache(), exec.default_stream());
        let runs = runs(&self.slots);
        for region in exec.layout.states.iter().filter(|r| r.slot_bytes > 0) {
            for &Run { slot, index, len } in &runs {
                let live = states.offset(region.offset + slot as usize * region.slot_bytes);
                let saved = states.offset(region.backup_offset + index * region.slot_bytes);
                let bytes = len * region.slot_bytes;
                match direction {
                    // Ordered before the step on its stream: nothing waits for the step before.
                    Direction::Save => backend.copy_d2d_async(stream, saved, live, bytes)?,
                    // After a failure: waits for everything queued, then puts the state back.
                    Direction::Restore => backend.copy_d2d(live, saved, bytes)?,
                }
            }
        }
        Ok(())
    }
}

/// `len` consecutive slots from `slot`, saved in consecutive backup slots from `index`: one
/// copy per region, not one per slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    slot: u32,
    index: usize,
    len: usize,
}

/// The runs of `slots` (backup slot i holds `slots[i]`): each maximal stretch of ascending
/// consecutive slots. A batch whose sequences took their slots in order (the pool lends the
/// lowest free one) is one run, so a step of 128 sequences copies each of a model's state
/// regions once, not 128 times.
fn runs(slots: &[u32]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for (index, &slot) in slots.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if run.slot.checked_add(run.len as u32) == Some(slot) => run.len += 1,
            _ => runs.push(Run {
                slot,
                index,
                len: 1,
            }),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::{runs, Run};

    #[test]
    fn consecutive_slots_are_one_run_and_gaps_or_reversals_start_another() {
        let run = |slot, index, len| Run { slot, index, len };
        assert_eq!(runs(&[]), []);
        assert_eq!(runs(&[1, 2, 3, 4]), [run(1, 0, 4)]);
        assert_eq!(
            runs(&[3, 4, 9, 10, 2, 1]),
            [run(3, 0, 2), run(9, 2, 2), run(2, 4, 1), run(1, 5, 1)]
        );
        assert_eq!(runs(&[u32::MAX, 0]), [run(u32::MAX, 0, 1), run(0, 1, 1)]);
    }
}

#[derive(Debug, Clone, Copy)]
enum Direction {
    Save,
    Restore,
}
