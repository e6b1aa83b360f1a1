//! The happens-before race tracker: a vector clock per stream, advanced by each launch or
//! copy on it and merged by event waits, and the recent accesses to each allocation.
//!
//! Invariants: an access `p` on stream `ps` is ordered before the current work of stream `s`
//! iff `clocks[s][ps] >= p.epoch`; each stream's accesses to an allocation are kept in epoch
//! order, so the ones not yet ordered before `s` are a suffix (found by binary search); an
//! access every stream has already seen is dropped, so one stream alone records nothing.

use std::collections::{HashMap, VecDeque};

use crate::types::KernelId;

/// What made an access, rendered only when a race is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Arg { kernel: KernelId, index: usize },
    Call(&'static str),
}

/// One byte range an operation touches, in device addresses (an empty one touches nothing).
#[derive(Debug, Clone, Copy)]
pub struct Touch {
    pub alloc: u64,
    pub start: u64,
    pub end: u64,
    pub write: bool,
    pub label: Label,
}

#[derive(Debug, Clone, Copy)]
struct Access {
    start: u64,
    end: u64,
    epoch: u32,
    label: Label,
}

/// One stream's recent accesses of one kind to one allocation, in epoch order.
///
/// A newer access to the same range supersedes an older one (any later access that would
/// race the older would race the newer), so the queue is compacted to about one entry per
/// distinct range: a decode loop reusing its buffers keeps a bounded history even when a
/// stream stays idle and never sees the others' work.
#[derive(Debug, Default, Clone)]
struct Queue {
    entries: VecDeque<Access>,
    /// The epoch of the newest access to each range.
    latest: HashMap<(u64, u64), u32>,
}

impl Queue {
    fn push(&mut self, access: Access) {
        self.latest.insert((access.start, access.end), access.epoch);
        self.entries.push_back(access);
        if self.entries.len() > 2 * self.latest.len() + 32 {
            let latest = &self.latest;
            self.entries
                .retain(|a| latest.get(&(a.start, a.end)) == Some(&a.epoch));
        }
    }

    /// Drops the accesses every stream has seen.
    fn prune(&mut self, seen_by_all: u32) {
        while let Some(front) = self.entries.front().filter(|a| a.epoch <= seen_by_all) {
            let range = (front.start, front.end);
            if self.latest.get(&range) == Some(&front.epoch) {
                self.latest.remove(&range);
            }
            self.entries.pop_front();
        }
    }

    /// The most recent access not yet seen (`epoch > seen`) that overlaps `touch`.
    fn unordered_overlap(&self, seen: u32, touch: &Touch) -> Option<&Access> {
        let first_unseen = self.entries.partition_point(|a| a.epoch <= seen);
        self.entries
            .range(first_unseen..)
            .rev()
            .find(|a| a.start < touch.end && touch.start < a.end)
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[derive(Debug, Default, Clone)]
struct Lane {
    writes: Queue,
    reads: Queue,
}

/// Two unordered accesses to overlapping bytes.
#[derive(Debug)]
pub struct Conflict {
    pub current: Label,
    pub previous: Label,
    pub previous_stream: u32,
    pub start: u64,
    pub end: u64,
}

#[derive(Clone)]
pub struct Tracker {
    /// `clocks[s][t]`: the last epoch of stream `t` ordered before stream `s`'s next work.
    clocks: Vec<Vec<u32>>,
    /// Per allocation base, per stream.
    history: HashMap<u64, Vec<Lane>>,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker {
            clocks: vec![vec![0]],
            history: HashMap::new(),
        }
    }

    pub fn streams(&self) -> usize {
        self.clocks.len()
    }

    /// A new stream. It starts ordered after all work submitted so far, which keeps the
    /// checker's view independent of when accesses were pruned.
    pub fn add_stream(&mut self) -> u32 {
        let id = self.clocks.len();
        let mut clock: Vec<u32> = (0..id).map(|t| self.clocks[t][t]).collect();
        clock.push(0);
        for existing in &mut self.clocks {
            existing.push(0);
        }
        self.clocks.push(clock);
        id as u32
    }

    pub fn clock(&self, stream: u32) -> &[u32] {
        &self.clocks[stream as usize]
    }

    /// Orders stream `stream`'s next work after everything `other` has seen.
    pub fn merge(&mut self, stream: u32, other: &[u32]) {
        for (mine, theirs) in self.clocks[stream as usize].iter_mut().zip(other) {
            *mine = (*mine).max(*theirs);
        }
    }

    pub fn merge_streams(&mut self, stream: u32, other: u32) {
        let other = self.clocks[other as usize].clone();
        self.merge(stream, &other);
    }

    /// All work is done: nothing recorded can race any more.
    pub fn clear(&mut self) {
        self.history.clear();
    }

    pub fn forget_allocation(&mut self, base: u64) {
        self.history.remove(&base);
    }

    /// Accesses held (for tests that check pruning).
    pub fn pending(&self) -> usize {
        self.history
            .values()
            .flatten()
            .map(|lane| lane.writes.len() + lane.reads.len())
            .sum()
    }

    /// The first of `touches` that conflicts with an access of another stream not ordered
    /// before `stream`'s next work.
    pub fn check(&self, stream: u32, touches: &[Touch]) -> Result<(), Conflict> {
        let clock = &self.clocks[stream as usize];
        for touch in touches.iter().filter(|touch| touch.start < touch.end) {
            let Some(lanes) = self.history.get(&touch.alloc) else {
                continue;
            };
            for (other, lane) in lanes.iter().enumerate() {
                if other == stream as usize {
                    continue;
                }
                let seen = clock[other];
                let hit = lane.writes.unordered_overlap(seen, touch).or_else(|| {
                    if touch.write {
                        lane.reads.unordered_overlap(seen, touch)
                    } else {
                        None
                    }
                });
                if let Some(previous) = hit {
                    return Err(Conflict {
                        current: touch.label,
                        previous: previous.label,
                        previous_stream: other as u32,
                        start: touch.start.max(previous.start),
                        end: touch.end.min(previous.end),
                    });
                }
            }
        }
        Ok(())
    }

    /// Advances `stream`'s clock for one operation; returns the operation's epoch.
    pub fn tick(&mut self, stream: u32) -> u32 {
        let own = &mut self.clocks[stream as usize][stream as usize];
        *own += 1;
        *own
    }

    /// Remembers `touches` made at `epoch` on `stream`, dropping what every stream has seen.
    pub fn record(&mut self, stream: u32, epoch: u32, touches: &[Touch]) {
        let s = stream as usize;
        let seen_by_all = self.clocks.iter().map(|clock| clock[s]).min().unwrap_or(0);
        if epoch <= seen_by_all {
            return;
        }
        let streams = self.clocks.len();
        for touch in touches.iter().filter(|touch| touch.start < touch.end) {
            let lanes = self.history.entry(touch.alloc).or_default();
            if lanes.len() < streams {
                lanes.resize_with(streams, Lane::default);
            }
            let lane = &mut lanes[s];
            lane.writes.prune(seen_by_all);
            lane.reads.prune(seen_by_all);
            let access = Access {
                start: touch.start,
                end: touch.end,
                epoch,
                label: touch.label,
            };
            if touch.write {
                lane.writes.push(access);
            } else {
                lane.reads.push(access);
            }
        }
    }
}
