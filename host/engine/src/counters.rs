//! What every engine and every domain counts (design §8): operations by
//! kind, doorbell batches, bytes moved, atomics, errors and dependent round
//! trips — hardware-independent figures that every benchmark prints first.
//!
//! Counters are relaxed atomics bumped on the data path; a
//! [`CounterSnapshot`] is a plain copy of them. Snapshots taken while
//! operations run are not a consistent cut, only monotone per field.
//!
//! Every thread bumps its own shard of a [`Counters`] (up to [`SHARDS`]
//! threads each get one; more share them), so threads submitting to one
//! engine or NIC do not write the same cache lines per operation; a
//! snapshot sums the shards.

use std::fmt;
use std::ops::{Add, AddAssign, Deref};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

use rolex_core::wire::NetAddr;

use crate::domain::WorkOp;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// One thread's share of a [`Counters`] (relaxed atomics): what a
        /// [`Counters`] dereferences to on the calling thread.
        #[derive(Debug, Default)]
        #[repr(align(128))]
        pub struct CounterShard {
            $($(#[$doc])* pub $name: AtomicU64,)*
        }

        /// A copy of [`Counters`] at one moment.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct CounterSnapshot {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl CounterShard {
            /// Copies this shard's counters.
            fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot { $($name: self.$name.load(Relaxed),)* }
            }
        }

        impl AddAssign for CounterSnapshot {
            fn add_assign(&mut self, rhs: Self) {
                $(self.$name += rhs.$name;)*
            }
        }

        impl CounterSnapshot {
            /// What was counted between `earlier` and this snapshot, field
            /// by field (counters only grow; a field that did not is 0).
            pub fn since(&self, earlier: &Self) -> Self {
                CounterSnapshot { $($name: self.$name.saturating_sub(earlier.$name),)* }
            }
        }
    };
}

counters! {
    /// One-sided reads posted.
    reads,
    /// One-sided writes posted without immediate.
    writes,
    /// One-sided writes posted with an immediate.
    write_imms,
    /// Two-sided sends posted.
    sends,
    /// Messages received into posted buffers.
    recvs,
    /// Compare-and-swap operations posted.
    cas,
    /// Fetch-and-add operations posted.
    faa,
    /// All 8-byte atomics posted (`cas + faa`).
    atomics,
    /// Doorbell batches (one post of one or more work requests).
    doorbells,
    /// Bytes fetched by reads.
    bytes_read,
    /// Bytes put by writes and sends.
    bytes_written,
    /// Operations that completed with an error.
    errors,
    /// Dependent round trips: one per submitted transfer or doorbell batch
    /// of independent operations.
    rtts,
    /// Immediates delivered to this side (each piece of a split write counts).
    imm_arrivals,
    /// Transfers posted by the submitting thread itself (a flag's
    /// operation on a free group: no hand-off to the worker).
    direct_posts,
    /// Transfers queued for a group's worker (callbacks, a busy group, or
    /// NICs that need the worker to post).
    handoffs,
    /// Posts whose completion waits for the target's acknowledgement that
    /// the data is visible (libfabric `FI_DELIVERY_COMPLETE`; on `tcp` one
    /// message back per post). Writes covered by a later write's
    /// acknowledgement are not counted (libfabric domain, `cover`).
    delivery_acks,
    /// Paged-write messages sent: the pages of one paged write to one
    /// peer moved as one message that the target's domain places
    /// (libfabric domain, `paged`; `tcp` by default).
    paged_by_message,
    /// Times a thread read completions of its group worker's operations
    /// (a flag-notified operation the group posted, such as the key-value
    /// store's posted unlock) outside a round it runs for the group, and
    /// woke the worker for them: a thread hand-off each (libfabric domain,
    /// whose endpoints share one completion queue; 0 elsewhere). A
    /// channel waiting in its group serves such completions itself.
    worker_wakes,
}

/// Shards of a [`Counters`]: threads beyond this many share them.
pub const SHARDS: usize = 16;

/// Live counters of one domain or engine: a shard per thread (see the
/// module docs). `counters.reads` is the calling thread's shard's counter
/// (through `Deref`): bump it with [`Counters::bump`], read the whole with
/// [`Counters::snapshot`].
pub struct Counters {
    shards: Box<[CounterShard; SHARDS]>,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            shards: Box::new(std::array::from_fn(|_| CounterShard::default())),
        }
    }
}

impl fmt::Debug for Counters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Counters").field(&self.snapshot()).finish()
    }
}

/// The calling thread's shard index (`0..SHARDS`): threads take indices in
/// turn. Also the shard of a region's guard count (`region.rs`).
pub(crate) fn shard_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: usize = NEXT.fetch_add(1, Relaxed) % SHARDS;
    }
    INDEX.with(|i| *i)
}

impl Deref for Counters {
    type Target = CounterShard;

    fn deref(&self) -> &CounterShard {
        &self.shards[shard_index()]
    }
}

impl Counters {
    /// Every counter, summed over the threads' shards.
    pub fn snapshot(&self) -> CounterSnapshot {
        let mut sum = CounterSnapshot::default();
        for s in self.shards.iter() {
            sum += s.snapshot();
        }
        sum
    }

    /// Adds `n` to one counter.
    #[inline]
    pub fn bump(field: &AtomicU64, n: u64) {
        field.fetch_add(n, Relaxed);
    }

    /// Counts one posted operation by kind, with its bytes and atomics.
    pub(crate) fn count_posted(&self, op: &WorkOp) {
        let s: &CounterShard = self;
        s.count(op);
    }
}

impl CounterShard {
    /// [`Counters::count_posted`] on this shard.
    fn count(&self, op: &WorkOp) {
        match op {
            WorkOp::Read { len, .. } => {
                Counters::bump(&self.reads, 1);
                Counters::bump(&self.bytes_read, *len);
            }
            WorkOp::Write { len, imm, .. } => {
                Counters::bump(
                    if imm.is_some() {
                        &self.write_imms
                    } else {
                        &self.writes
                    },
                    1,
                );
                Counters::bump(&self.bytes_written, *len);
            }
            WorkOp::Cas { .. } => {
                Counters::bump(&self.cas, 1);
                Counters::bump(&self.atomics, 1);
            }
            WorkOp::Faa { .. } => {
                Counters::bump(&self.faa, 1);
                Counters::bump(&self.atomics, 1);
            }
            WorkOp::Send { data, .. } => {
                Counters::bump(&self.sends, 1);
                Counters::bump(&self.bytes_written, data.len() as u64);
            }
        }
    }
}

impl Add for CounterSnapshot {
    type Output = Self;
    fn add(mut self, rhs: Self) -> Self {
        self += rhs;
        self
    }
}

/// The counters of one domain (NIC) of an engine.
#[derive(Debug, Clone, Copy)]
pub struct DomainCounters {
    /// The domain's address.
    pub addr: NetAddr,
    /// Its domain group.
    pub group: usize,
    /// Its counters.
    pub counters: CounterSnapshot,
}

/// An engine's counters: the total and each domain's share.
#[derive(Debug, Clone)]
pub struct EngineCounters {
    /// Sum over the domains plus what the engine itself counts (round trips,
    /// errors found before posting).
    pub total: CounterSnapshot,
    /// Per domain.
    pub domains: Vec<DomainCounters>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_and_sum() {
        let c = Counters::default();
        Counters::bump(&c.reads, 2);
        Counters::bump(&c.bytes_read, 128);
        let s = c.snapshot();
        assert_eq!(s.reads, 2);
        assert_eq!(s.bytes_read, 128);
        let t = s + s;
        assert_eq!(t.reads, 4);
        assert_eq!(t.writes, 0);
    }

    #[test]
    fn a_snapshot_sums_every_threads_shard() {
        // More threads than shards: some share one, and nothing is lost.
        let c = Counters::default();
        std::thread::scope(|s| {
            for t in 0..SHARDS as u64 + 3 {
                let c = &c;
                s.spawn(move || {
                    for _ in 0..1000 {
                        Counters::bump(&c.writes, 1);
                    }
                    Counters::bump(&c.bytes_written, t);
                });
            }
        });
        let n = SHARDS as u64 + 3;
        let snap = c.snapshot();
        assert_eq!(snap.writes, 1000 * n);
        assert_eq!(snap.bytes_written, n * (n - 1) / 2);
        assert_eq!(snap.reads, 0);
    }
}
