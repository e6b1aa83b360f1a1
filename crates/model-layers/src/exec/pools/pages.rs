//! `PagePool`: the KV cache's pages of `block_size` tokens, lent to sequences as they grow and
//! returned when they shrink or end. One pool per `CircuitExec` (it owns the KV memory); every
//! `Session` on the exec lends from it.
//!
//! Invariants: the scratch page (`meta::SCRATCH_PAGE`, page 0) is never lent — padding rows
//! write there, and a block table names it in place of a page recycled out of every layer's
//! sliding window (`recycle`: a position-preserving placeholder the kernels never read, never
//! given back); every other page is either free or held by one or more sequences — a page
//! shared by a fork (`share`) counts its extra holders and comes back to the pool only when
//! its last holder lets go (`shrink`, `recycle`); the lowest free pages are lent first, so
//! the same steps from the same free set lend the same pages.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::SessionError;
use crate::meta::SCRATCH_PAGE;

#[derive(Debug, Clone)]
pub(crate) struct PagePool {
    free: BTreeSet<u32>,
    /// Holders beyond the first of each shared page (absent: one holder or free).
    extra_holders: BTreeMap<u32, u32>,
    block_size: usize,
    /// Pages a sequence may hold (all but the scratch page).
    lendable: usize,
}

impl PagePool {
    /// A pool of `pages` pages (the scratch page among them) of `block_size` tokens.
    pub(crate) fn new(pages: usize, block_size: usize) -> PagePool {
        PagePool {
            free: (SCRATCH_PAGE + 1..pages as u32).collect(),
            extra_holders: BTreeMap::new(),
            block_size,
            lendable: pages.saturating_sub(1),
        }
    }

    /// Adds pages up to `pages` in all (the pool only grows: a growth of the KV allocation
    /// keeps every lent page's id, so the new ones are those past the old count).
    pub(crate) fn extend_to(&mut self, pages: usize) {
        let old = self.lendable as u32 + 1;
        self.free.extend(old..pages as u32);
        self.lendable = self.lendable.max(pages.saturating_sub(1));
    }

    /// Pages lent to sequences now.
    pub(crate) fn lent(&self) -> usize {
        self.lendable - self.free.len()
    }

    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Pages a sequence holding `held` pages needs to hold `tokens` tokens.
    pub(crate) fn needed(&self, tokens: usize, held: usize) -> usize {
        tokens.div_ceil(self.block_size).saturating_sub(held)
    }

    /// Checks that `needed` more pages are free.
    pub(crate) fn check(&self, needed: usize) -> Result<(), SessionError> {
        if needed > self.free.len() {
            return Err(SessionError::PagesExhausted {
                needed,
                free: self.free.len(),
            });
        }
        Ok(())
    }

    /// Grows `held` until it holds `tokens` tokens; returns the pages lent. All or nothing:
    /// refused, with `held` unchanged, when too few pages are free.
    pub(crate) fn grow(
        &mut self,
        held: &mut Vec<u32>,
        tokens: usize,
    ) -> Result<usize, SessionError> {
        let needed = self.needed(tokens, held.len());
        self.check(needed)?;
        held.extend((0..needed).filter_map(|_| self.free.pop_first()));
        Ok(needed)
    }

    /// Shrinks `held` to its first `keep` pages; the rest are let go (a page comes back to
    /// the pool with its last holder; placeholders of recycled pages are only dropped).
    pub(crate) fn shrink(&mut self, held: &mut Vec<u32>, keep: usize) {
        while held.len() > keep {
            if let Some(page) = held.pop().filter(|page| *page != SCRATCH_PAGE) {
                self.let_go(page);
            }
        }
    }

    /// A second holder of `held`'s first `blocks` pages (a fork sharing its parent's full
    /// pages): the pages the new holder holds, placeholders kept in place so positions match.
    pub(crate) fn share(&mut self, held: &[u32], blocks: usize) -> Vec<u32> {
        let shared: Vec<u32> = held.iter().take(blocks).copied().collect();
        for &page in shared.iter().filter(|page| **page != SCRATCH_PAGE) {
            *self.extra_holders.entry(page).or_insert(0) += 1;
        }
        shared
    }

    /// Whether `page` has more than one holder (a write into it must copy it first).
    pub(crate) fn is_shared(&self, page: u32) -> bool {
        self.extra_holders.contains_key(&page)
    }

    /// One holder lets go of `page`: it comes back to the pool when that was the last.
    fn let_go(&mut self, page: u32) {
        match self.extra_holders.get_mut(&page) {
            Some(1) => {
                self.extra_holders.remove(&page);
            }
            Some(extra) => *extra -= 1,
            None => {
                self.free.insert(page);
            }
        }
    }

    /// Lets go of the pages of `held`'s first `before` blocks, each replaced by the scratch
    /// page so later blocks keep their positions; returns how many this holder let go (blocks
    /// already recycled count once; a shared page comes back with its last holder).
    pub(crate) fn recycle(&mut self, held: &mut [u32], before: usize) -> usize {
        let mut freed = 0;
        for page in held.iter_mut().take(before) {
            if *page != SCRATCH_PAGE {
                let page = std::mem::replace(page, SCRATCH_PAGE);
                self.let_go(page);
                freed += 1;
            }
        }
        freed
    }

    /// Pages of `held` that are real pages, not placeholders of recycled ones.
    pub(crate) fn live(held: &[u32]) -> usize {
        held.iter().filter(|page| **page != SCRATCH_PAGE).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_lent_lowest_first() {
        let mut pool = PagePool::new(6, 4);
        assert_eq!(pool.free_count(), 5, "page 0 is the scratch page");
        let mut held = Vec::new();
        assert_eq!(pool.grow(&mut held, 9).unwrap(), 3);
        assert_eq!(held, [1, 2, 3]);
        assert_eq!(pool.grow(&mut held, 12).unwrap(), 0);
        pool.shrink(&mut held, 1);
        assert_eq!(held, [1]);
        let mut other = Vec::new();
        pool.grow(&mut other, 5).unwrap();
        assert_eq!(other, [2, 3]);
        match pool.grow(&mut other, 100) {
            Err(SessionError::PagesExhausted { needed, free }) => {
                assert_eq!((needed, free), (23, 2))
            }
            other => panic!("expected PagesExhausted, got {other:?}"),
        }
        assert_eq!(other, [2, 3], "a refused grow lends nothing");
        pool.shrink(&mut other, 0);
        pool.shrink(&mut held, 0);
        assert_eq!(pool.free_count(), 5);
    }

    #[test]
    fn recycled_pages_leave_placeholders_and_come_back_once() {
        let mut pool = PagePool::new(6, 4);
        let mut held = Vec::new();
        pool.grow(&mut held, 16).unwrap();
        assert_eq!(held, [1, 2, 3, 4]);
        assert_eq!(pool.recycle(&mut held, 2), 2);
        assert_eq!(held, [SCRATCH_PAGE, SCRATCH_PAGE, 3, 4], "positions kept");
        assert_eq!(PagePool::live(&held), 2);
        assert_eq!(pool.free_count(), 3);
        assert_eq!(
            pool.recycle(&mut held, 3),
            1,
            "block 0 and 1 already recycled"
        );
        assert_eq!(
            pool.needed(20, held.len()),
            1,
            "placeholders hold their positions"
        );
        pool.grow(&mut held, 20).unwrap();
        assert_eq!(held, [SCRATCH_PAGE, SCRATCH_PAGE, SCRATCH_PAGE, 4, 1]);
        pool.shrink(&mut held, 0);
        assert_eq!(pool.free_count(), 5, "the scratch page is never given back");
        assert!(!pool.free.contains(&SCRATCH_PAGE));
    }

    #[test]
    fn a_shared_page_comes_back_with_its_last_holder() {
        let mut pool = PagePool::new(8, 4);
        let mut parent = Vec::new();
        pool.grow(&mut parent, 10).unwrap();
        assert_eq!(parent, [1, 2, 3]);
        // Two forks share the two full pages; the partial third is theirs to copy.
        let mut first = pool.share(&parent, 2);
        let mut second = pool.share(&parent, 2);
        assert_eq!(first, [1, 2]);
        assert!(pool.is_shared(1) && pool.is_shared(2) && !pool.is_shared(3));
        assert_eq!(pool.lent(), 3, "shared pages are lent once");
        pool.grow(&mut first, 12).unwrap();
        assert_eq!(first, [1, 2, 4]);
        pool.shrink(&mut parent, 0);
        assert_eq!(pool.free_count(), 4, "only the parent's own page came back");
        assert!(pool.is_shared(1), "two forks still hold page 1");
        assert_eq!(pool.recycle(&mut second, 1), 1);
        assert_eq!(second, [SCRATCH_PAGE, 2]);
        assert!(!pool.is_shared(1), "the first fork is its last holder");
        assert!(!pool.free.contains(&1));
        pool.shrink(&mut first, 0);
        assert!(pool.free.contains(&1) && !pool.free.contains(&2));
        pool.shrink(&mut second, 0);
        assert_eq!(
            pool.free_count(),
            7,
            "every page back after every holder ends"
        );
        assert!(pool.extra_holders.is_empty());
    }

    #[test]
    fn an_extended_pool_keeps_lent_pages_and_lends_the_new_ones() {
        let mut pool = PagePool::new(4, 4);
        let mut held = Vec::new();
        pool.grow(&mut held, 12).unwrap();
        assert_eq!(held, [1, 2, 3]);
        assert!(pool.grow(&mut held, 13).is_err());
        pool.extend_to(6);
        assert_eq!(pool.free_count(), 2);
        pool.grow(&mut held, 20).unwrap();
        assert_eq!(held, [1, 2, 3, 4, 5]);
        pool.shrink(&mut held, 0);
        assert_eq!(pool.free_count(), 5);
    }

    #[test]
    fn a_sequence_grows_to_262144_positions() {
        // Two sequences of 262,144 tokens in pages of 16, and the scratch page.
        let mut pool = PagePool::new(2 * 16_384 + 1, 16);
        let (mut first, mut second) = (Vec::new(), Vec::new());
        assert_eq!(pool.grow(&mut first, 262_143).unwrap(), 16_384);
        assert_eq!(pool.needed(262_144, first.len()), 0);
        assert_eq!(pool.needed(262_145, first.len()), 1);
        assert_eq!(pool.grow(&mut second, 262_144).unwrap(), 16_384);
        assert_eq!(second.last(), Some(&32_768));
        assert_eq!(pool.free_count(), 0);
        assert_eq!(pool.lent(), 32_768);
        pool.shrink(&mut first, 0);
        assert_eq!(pool.free_count(), 16_384);
    }
}
