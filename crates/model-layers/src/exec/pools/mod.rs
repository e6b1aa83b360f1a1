//! The pools of one `CircuitExec`'s state allocation, which every session on it lends from:
//! `pages` (the KV page pool; page 0 is the scratch page) and `slots` (the recurrent-state slot
//! pool; a slot is zeroed when taken). They belong to the exec, behind its lock, so that
//! several sessions share them, never the same page or slot.

mod pages;
mod slots;

use solder_gpu_runtime::DevicePtr;

use crate::layout::Layout;
pub(crate) use pages::PagePool;
pub(crate) use slots::{Fill, SlotPool};

/// The KV page pool and the recurrent-state slot pool of one `CircuitExec`, which every
/// session on it lends from.
#[derive(Debug)]
pub(crate) struct Pools {
    pub(crate) pages: PagePool,
    pub(crate) slots: SlotPool,
}

impl Pools {
    /// The pools of `layout`'s pages and slots in the state allocation at `states`.
    pub(crate) fn new(layout: &Layout, states: DevicePtr) -> Pools {
        Pools {
            pages: PagePool::new(layout.kv_pages, layout.kv_block_size),
            slots: SlotPool::new(layout, states),
        }
    }

    /// What sequences hold now, in words, or None when every page and slot is in the pools.
    pub(crate) fn held(&self) -> Option<String> {
        let (pages, slots) = (self.pages.lent(), self.slots.lent());
        (pages + slots > 0).then(|| format!("{pages} KV page(s) and {slots} state slot(s) are"))
    }
}
