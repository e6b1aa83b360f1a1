//! `SlotPool`: the recurrent-state slots of a model with recurrent layers (Gated DeltaNet),
//! one per live sequence, lent at a sequence's first step and returned when it ends. One pool
//! per `CircuitExec`; every `Session` on the exec lends from it.
//!
//! Besides one slot per sequence the pool holds `Layout::spare_slots` spares: a step lends one
//! (`spares`) to each sequence it advances as the slot its kernels write; on success the
//! sequence keeps it and the slot it read comes back (`keep_spare`), on failure the spare
//! comes back unread (`give_back_spare`). Sequences may hold at most
//! `state_slots − 1 − spare_slots` slots, so the spares a step needs are always free.
//!
//! Invariants: the scratch slot (`meta::SCRATCH_SLOT`, slot 0) is never lent — padding rows
//! use it; every other slot is free, held by exactly one sequence of one session, or lent to
//! one step as a spare; the lowest free slot is lent first; a lent slot is zeroed (or, for a fork, copied from its
//! parent's) in every recurrent state region before it is handed out, so a sequence starts
//! from zeros or its parent's state whoever held the slot before; a model without recurrent state
//! has no slots and its sequences never take one.

use std::collections::BTreeSet;

use solder_gpu_runtime::{DevicePtr, GpuBackend, StreamId};

use crate::error::SessionError;
use crate::layout::Layout;
use crate::meta::SCRATCH_SLOT;

/// What a lent slot holds: zeros (a new sequence), or a copy of slot `from` (a fork).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Fill {
    Zero,
    CopyOf(u32),
}

#[derive(Debug, Clone)]
pub(crate) struct SlotPool {
    free: BTreeSet<u32>,
    /// The state allocation and, per recurrent state, the offset of its slots and one slot's
    /// bytes.
    states: DevicePtr,
    regions: Vec<(usize, usize)>,
    /// Slots sequences may hold together (all but the scratch slot and the spares; none
    /// without recurrent state).
    lendable: usize,
    /// Slots sequences hold now.
    held: usize,
}

impl SlotPool {
    /// The slots of `layout`'s recurrent states in the state allocation at `states`.
    pub(crate) fn new(layout: &Layout, states: DevicePtr) -> SlotPool {
        let regions: Vec<(usize, usize)> = layout
            .states
            .iter()
            .filter(|r| r.slot_bytes > 0)
            .map(|r| (r.offset, r.slot_bytes))
            .collect();
        let free: BTreeSet<u32> = if regions.is_empty() {
            BTreeSet::new()
        } else {
            (SCRATCH_SLOT + 1..layout.state_slots as u32).collect()
        };
        SlotPool {
            lendable: free.len().saturating_sub(layout.spare_slots),
            held: 0,
            free,
            states,
            regions,
        }
    }

    /// The same slots in a new state allocation at `states` (the KV pool grew; every slot's
    /// region was copied to the same offsets).
    pub(crate) fn rebase(&mut self, states: DevicePtr) {
        self.states = states;
    }

    /// Slots lent to sequences now.
    pub(crate) fn lent(&self) -> usize {
        self.held
    }

    /// Whether the model keeps recurrent state, so each sequence needs a slot.
    pub(crate) fn recurrent(&self) -> bool {
        !self.regions.is_empty()
    }

    /// Checks that sequences may take `needed` more slots (their share: the spares a step
    /// lends are not theirs to hold).
    pub(crate) fn check(&self, needed: usize) -> Result<(), SessionError> {
        let free = self.lendable - self.held;
        if needed > free {
            return Err(SessionError::SlotsExhausted { needed, free });
        }
        Ok(())
    }

    /// Lends the lowest free slot, every recurrent region filled as `fill` says by work queued
    /// on `stream` (before the step that takes it; the host does not wait): zeroed, or a copy
    /// of another slot's (a fork's state, written once, not zeroed first). A slot that fails
    /// to fill stays free.
    pub(crate) fn take(
        &mut self,
        backend: &mut dyn GpuBackend,
        stream: StreamId,
        fill: Fill,
    ) -> Result<u32, SessionError> {
        self.check(1)?;
        let Some(slot) = self.free.pop_first() else {
            return Err(SessionError::SlotsExhausted { needed: 1, free: 0 });
        };
        self.held += 1;
        for &(offset, slot_bytes) in &self.regions {
            let at = |slot: u32| self.states.offset(offset + slot as usize * slot_bytes);
            let queued = match fill {
                Fill::Zero => backend.memset_async(stream, at(slot), 0, slot_bytes),
                Fill::CopyOf(from) => {
                    backend.copy_d2d_async(stream, at(slot), at(from), slot_bytes)
                }
            };
            if let Err(e) = queued {
                self.free.insert(slot);
                self.held -= 1;
                return Err(e.into());
            }
        }
        Ok(slot)
    }

    /// Returns a slot (zeroed again when next lent).
    pub(crate) fn give_back(&mut self, slot: u32) {
        if self.free.insert(slot) {
            self.held -= 1;
        }
    }

    /// Lends `n` free slots as a step's spares, in order: the lowest run of `n` consecutive
    /// free slots where there is one (slots written evenly pitched keep the runtime route),
    /// else the `n` lowest. Nothing is written to them: the step's kernels write each whole
    /// before anyone reads it.
    pub(crate) fn spares(&mut self, n: usize) -> Result<Vec<u32>, SessionError> {
        if n > self.free.len() {
            return Err(SessionError::SlotsExhausted {
                needed: n,
                free: self.free.len(),
            });
        }
        let run = self.free.iter().copied().find(|&first| {
            (1..n as u32).all(|i| first.checked_add(i).is_some_and(|s| self.free.contains(&s)))
        });
        let spares: Vec<u32> = match run {
            Some(first) => (first..first + n as u32).collect(),
            None => self.free.iter().copied().take(n).collect(),
        };
        for spare in &spares {
            self.free.remove(spare);
        }
        Ok(spares)
    }

    /// Returns a spare the step that lent it did not keep.
    pub(crate) fn give_back_spare(&mut self, spare: u32) {
        self.free.insert(spare);
    }

    /// A sequence took a spare lent to it (its new state written there): `held`, the slot it
    /// held before, if any, is free.
    pub(crate) fn keep_spare(&mut self, held: Option<u32>) {
        match held {
            Some(slot) => {
                self.free.insert(slot);
            }
            None => self.held += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use solder_gpu_runtime::DevicePtr;

    use super::SlotPool;
    use crate::error::SessionError;

    /// Slots 1..=8 of one region, 4 of them spares; sequences hold `held`.
    fn pool(held: &[u32]) -> SlotPool {
        let mut free: BTreeSet<u32> = (1..=8).collect();
        for slot in held {
            free.remove(slot);
        }
        SlotPool {
            free,
            states: DevicePtr(0),
            regions: vec![(0, 16)],
            lendable: 4,
            held: held.len(),
        }
    }

    #[test]
    fn spares_are_the_lowest_run_of_free_slots_else_the_lowest_free_ones() {
        let mut pool = pool(&[1, 3, 4]);
        assert_eq!(pool.spares(2).expect("two"), [5, 6]);
        // Free now: 2, 7, 8: no run of three.
        assert_eq!(pool.spares(3).expect("three"), [2, 7, 8]);
        match pool.spares(1) {
            Err(SessionError::SlotsExhausted { needed: 1, free: 0 }) => {}
            other => panic!("{other:?}"),
        }
        // Spares given back are free again; the sequences still hold their three.
        for spare in [2, 5, 6, 7, 8] {
            pool.give_back_spare(spare);
        }
        assert_eq!(pool.lent(), 3);
        assert_eq!(pool.spares(4).expect("four"), [5, 6, 7, 8]);
    }

    #[test]
    fn a_kept_spare_frees_the_slot_held_and_counts_a_new_holder() {
        let mut pool = pool(&[1, 2]);
        let spares = pool.spares(3).expect("spares");
        assert_eq!(spares, [3, 4, 5]);
        // Sequences holding 1 and 2 take 3 and 4; a new one (no slot before) takes 5.
        pool.keep_spare(Some(1));
        pool.keep_spare(Some(2));
        pool.keep_spare(None);
        assert_eq!(pool.lent(), 3);
        assert_eq!(pool.free, [1, 2, 6, 7, 8].into_iter().collect());
        // Sequences may hold 4 slots in all: one more, not two, whatever is free.
        assert!(pool.check(1).is_ok());
        match pool.check(2) {
            Err(SessionError::SlotsExhausted { needed: 2, free: 1 }) => {}
            other => panic!("{other:?}"),
        }
    }
}
