//! `Spares`: spare slots lent by the slot pool (`SlotPool::spares`), one per sequence, for the
//! recurrent kernels (or a rewind's copies) to write a sequence's new state into while the
//! slot it holds keeps the state before. `keep` hands each sequence its spare and gives the
//! slot it held back to the pool; dropped without `keep`, the spares go back and every
//! sequence still holds its slot, as it was: a failure needs no copy to undo.
//!
//! Invariants: a spare is lent to one `Spares` at a time and no sequence holds it until
//! `keep`; the spares of one `Spares` are the lowest run of consecutive free slots the pool
//! has (slots written evenly pitched keep the multi-seq step's runtime route), lent in the
//! order of the sequences asked for.

use crate::error::SessionError;
use crate::exec::CircuitExec;
use crate::session::{SeqId, Session};

pub(crate) struct Spares<'e> {
    exec: &'e CircuitExec,
    /// Each sequence and the spare lent for it.
    lent: Vec<(SeqId, u32)>,
}

impl<'e> Spares<'e> {
    /// Lends a spare for each of `ids`; none for a model without recurrent state.
    pub(crate) fn lend(exec: &'e CircuitExec, ids: &[SeqId]) -> Result<Spares<'e>, SessionError> {
        let mut pools = exec.pools();
        let lent = if pools.slots.recurrent() {
            ids.iter()
                .copied()
                .zip(pools.slots.spares(ids.len())?)
                .collect()
        } else {
            Vec::new()
        };
        Ok(Spares { exec, lent })
    }

    /// The spare lent for `id`.
    pub(crate) fn of(&self, id: SeqId) -> Option<u32> {
        self.lent
            .iter()
            .find(|&&(s, _)| s == id)
            .map(|&(_, spare)| spare)
    }

    /// Each sequence takes its spare (written, by now, with its new state) and the slot it
    /// held goes back to the pool.
    pub(crate) fn keep(mut self, session: &mut Session<'_>) {
        let mut pools = self.exec.pools();
        for (id, spare) in std::mem::take(&mut self.lent) {
            match session.seqs.get_mut(&id) {
                Some(seq) => pools.slots.keep_spare(seq.slot.replace(spare)),
                // Gone since (not reachable through the session's API): nothing holds it.
                None => pools.slots.give_back_spare(spare),
            }
        }
    }
}

impl Drop for Spares<'_> {
    fn drop(&mut self) {
        if self.lent.is_empty() {
            return;
        }
        let mut pools = self.exec.pools();
        for &(_, spare) in &self.lent {
            pools.slots.give_back_spare(spare);
        }
    }
}
