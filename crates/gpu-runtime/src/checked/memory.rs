//! The allocations made through the layer: base address → size, nothing more.
//!
//! Invariant: holds exactly the allocations the inner backend returned and has not freed.

use std::collections::BTreeMap;

#[derive(Debug, Default)]
pub(super) struct Allocations {
    bytes: BTreeMap<u64, usize>,
}

impl Allocations {
    pub(super) fn insert(&mut self, base: u64, bytes: usize) {
        self.bytes.insert(base, bytes);
    }

    pub(super) fn remove(&mut self, base: u64) {
        self.bytes.remove(&base);
    }

    pub(super) fn is_base(&self, addr: u64) -> bool {
        self.bytes.contains_key(&addr)
    }

    pub(super) fn live(&self) -> usize {
        self.bytes.len()
    }

    /// The base of the live allocation holding all of `start..start + bytes` (a zero-byte
    /// range may sit anywhere in `base..=end`, as on the CPU backend).
    pub(super) fn containing(&self, start: u64, bytes: usize) -> Option<u64> {
        let end = start.checked_add(bytes as u64)?;
        let (base, size) = self.bytes.range(..=start).next_back()?;
        (end <= base + *size as u64).then_some(*base)
    }
}
