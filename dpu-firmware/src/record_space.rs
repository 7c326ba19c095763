//! Space for model records in the model region: bump allocation past the
//! highest byte used, and reuse of retired records once a grace period has
//! passed since they were retired.
//!
//! Invariant: a retired record's bytes return to use only at or after
//! `retired_at + grace` on the agent's clock ([`crate::PoolMemory::now_ns`]).
//! The grace period ([`crate::AgentConfig::record_grace`]) is longer than a
//! compute node may go on using a record it has not seen live (its
//! `KvClientConfig::model_max_age`) plus the time one request may stay in
//! flight, so no compute node `CAS`es, `FAA`s or writes a word of a record
//! that was reused under it; a stale reader that reads a reused record
//! meets another model id or generation and refreshes (see `rolex-kv`).
//!
//! Free space lives in the agent's memory only: it is not part of the pool
//! layout, so a restarted agent forgets it (the space of records retired
//! before the restart is not reused; restart recovery is another step).
//! Free blocks are kept by offset and merged with their neighbours, a
//! block that reaches the bump pointer lowers it, and allocation is first
//! fit — records of a model change size with every retraining, so size
//! classes would strand space.

use alloc::collections::{BTreeMap, VecDeque};

/// The model region's record space (see the module docs). Offsets and
/// sizes are pool bytes, multiples of 8.
#[derive(Clone, Debug)]
pub struct RecordSpace {
    start: u64,
    end: u64,
    /// First byte past every record ever allocated and not given back.
    next_free: u64,
    grace_ns: u64,
    /// Retired records in retirement order: (offset, size, reusable from).
    waiting: VecDeque<(u64, u64, u64)>,
    /// Reusable blocks: offset → size, none adjacent to another or to
    /// `next_free`.
    ready: BTreeMap<u64, u64>,
    ready_bytes: u64,
    waiting_bytes: u64,
    reused: u64,
    /// [`Self::largest_eventually`]'s answer while nothing was allocated,
    /// retired or given back since (the grace periods ending do not
    /// change it).
    eventually: Option<u64>,
}

impl RecordSpace {
    /// The space of a model region `[start, end)` whose records end at
    /// `next_free`; retired records wait `grace_ns` before reuse.
    pub fn new(start: u64, end: u64, next_free: u64, grace_ns: u64) -> Self {
        Self {
            start,
            end,
            next_free,
            grace_ns,
            waiting: VecDeque::new(),
            ready: BTreeMap::new(),
            ready_bytes: 0,
            waiting_bytes: 0,
            reused: 0,
            eventually: None,
        }
    }

    /// First byte past every record in use or waiting (where bump
    /// allocation goes on).
    pub fn next_free(&self) -> u64 {
        self.next_free
    }

    /// Bytes from the region's start to [`Self::next_free`].
    pub fn extent(&self) -> u64 {
        self.next_free - self.start
    }

    /// Bytes of retired records: still in their grace period, and
    /// reusable.
    pub fn free_bytes(&self) -> (u64, u64) {
        (self.waiting_bytes, self.ready_bytes)
    }

    /// Allocations served from retired records so far.
    pub fn reused(&self) -> u64 {
        self.reused
    }

    /// Gives back the record `[at, at + size)`, retired at `now`: reusable
    /// from `now + grace`.
    pub fn retire(&mut self, at: u64, size: u64, now: u64) {
        self.eventually = None;
        self.waiting_bytes += size;
        self.waiting
            .push_back((at, size, now.saturating_add(self.grace_ns)));
    }

    /// Moves every record whose grace period ended by `now` to the
    /// reusable blocks.
    fn expire(&mut self, now: u64) {
        while let Some(&(at, size, from)) = self.waiting.front() {
            if from > now {
                break;
            }
            self.waiting.pop_front();
            self.waiting_bytes -= size;
            self.release(at, size);
        }
    }

    /// Adds `[at, at + size)` to the reusable blocks, merged with its
    /// neighbours, or lowers the bump pointer when it ends there.
    fn release(&mut self, mut at: u64, mut size: u64) {
        if let Some((&prev, &psize)) = self.ready.range(..at).next_back() {
            if prev + psize == at {
                self.ready.remove(&prev);
                self.ready_bytes -= psize;
                at = prev;
                size += psize;
            }
        }
        if let Some(nsize) = self.ready.remove(&(at + size)) {
            self.ready_bytes -= nsize;
            size += nsize;
        }
        if at + size == self.next_free {
            self.next_free = at;
        } else {
            self.ready.insert(at, size);
            self.ready_bytes += size;
        }
    }

    /// The largest record that fits at `now`: the largest reusable block
    /// or the room past the bump pointer.
    pub fn largest(&mut self, now: u64) -> u64 {
        self.expire(now);
        let tail = self.end - self.next_free;
        self.ready.values().copied().fold(tail, u64::max)
    }

    /// The largest record that will fit once every retired record's grace
    /// period has passed (nothing else changing). Worked out on a copy of
    /// the space once, then kept until the space changes: the agent asks
    /// on every refused retraining, of every model, which on a region full
    /// of records in their grace period would copy and merge them all
    /// each time.
    pub fn largest_eventually(&mut self) -> u64 {
        if let Some(n) = self.eventually {
            return n;
        }
        let mut all = self.clone();
        let n = all.largest(u64::MAX);
        self.eventually = Some(n);
        n
    }

    /// Room for a record of `size` bytes at `now`: the first reusable block
    /// that fits, else past the bump pointer; `None` if neither has room.
    pub fn alloc(&mut self, size: u64, now: u64) -> Option<u64> {
        self.eventually = None;
        self.expire(now);
        let fit = self
            .ready
            .iter()
            .find(|(_, &s)| s >= size)
            .map(|(&at, &s)| (at, s));
        if let Some((at, s)) = fit {
            self.ready.remove(&at);
            self.ready_bytes -= s;
            if s > size {
                self.ready.insert(at + size, s - size);
                self.ready_bytes += s - size;
            }
            self.reused += 1;
            return Some(at);
        }
        if self.end - self.next_free >= size {
            let at = self.next_free;
            self.next_free += size;
            return Some(at);
        }
        None
    }

    /// Gives back `[at, at + size)` at once, never seen by a compute node
    /// (a record built and then abandoned before its switch).
    pub fn unused(&mut self, at: u64, size: u64) {
        self.eventually = None;
        self.release(at, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retired_records_wait_for_their_grace_period() {
        let mut s = RecordSpace::new(1000, 2000, 1000, 50);
        let a = s.alloc(200, 0).unwrap();
        let b = s.alloc(200, 0).unwrap();
        assert_eq!((a, b), (1000, 1200));
        s.retire(a, 200, 10);
        // Not before 60: from the tail.
        assert_eq!(s.alloc(100, 59), Some(1400));
        assert_eq!(s.free_bytes(), (200, 0));
        // From 60: first fit in the retired record, the rest kept.
        assert_eq!(s.alloc(120, 60), Some(1000));
        assert_eq!(s.free_bytes(), (0, 80));
        assert_eq!(s.reused(), 1);
        assert_eq!(s.largest(60), 2000 - 1500);
        s.retire(1400, 100, 60);
        assert_eq!(s.largest(60), 500);
        assert_eq!(s.largest_eventually(), 600);
        // Kept until the space changes; each change is seen.
        assert_eq!(s.largest_eventually(), 600);
        assert_eq!(s.alloc(500, 60), Some(1500));
        assert_eq!(s.largest_eventually(), 100);
        s.retire(1500, 500, 70);
        assert_eq!(s.largest_eventually(), 600);
        s.unused(b, 200);
        assert_eq!(s.largest_eventually(), 880);
    }

    #[test]
    fn neighbours_merge_and_the_tail_shrinks() {
        let mut s = RecordSpace::new(0, 1000, 0, 0);
        let blocks: alloc::vec::Vec<u64> = (0..4).map(|_| s.alloc(100, 0).unwrap()).collect();
        s.retire(blocks[1], 100, 0);
        s.retire(blocks[2], 100, 0);
        assert_eq!(s.largest(0), 600);
        assert_eq!(s.free_bytes(), (0, 200));
        s.retire(blocks[3], 100, 0);
        // 100..400 reaches the bump pointer: the tail grows back.
        assert_eq!(s.largest(0), 900);
        assert_eq!(s.next_free(), 100);
        assert_eq!(s.free_bytes(), (0, 0));
        assert_eq!(s.alloc(901, 0), None);
        assert_eq!(s.alloc(900, 0), Some(100));
    }

    #[test]
    fn space_stays_bounded_under_endless_retraining() {
        // Models whose records grow and shrink, each retrained forever.
        let mut s = RecordSpace::new(0, 1 << 20, 0, 5);
        let mut live: alloc::vec::Vec<(u64, u64)> = (0..8)
            .map(|i| (s.alloc(1024 + 64 * i, 0).unwrap(), 1024 + 64 * i))
            .collect();
        for t in 0..100_000u64 {
            let m = (t % 8) as usize;
            let size = 1024 + 8 * ((t * 7919) % 200);
            let at = s.alloc(size, t).expect("bounded use");
            let (old, old_size) = core::mem::replace(&mut live[m], (at, size));
            s.retire(old, old_size, t);
        }
        assert!(s.extent() < 64 << 10, "extent {}", s.extent());
        assert!(s.reused() > 0);
    }
}
