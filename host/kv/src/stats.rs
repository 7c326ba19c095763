//! What compute nodes count per operation kind: dependent round trips,
//! bytes, atomics, leaves read, retries — the hardware-independent figures
//! of design §8, beside the engine's own counters.
//!
//! Each session counts into its own relaxed atomics (no sharing on the data
//! path); [`crate::KvClient::stats`] sums every session's counters.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use rolex_engine::counters::CounterSnapshot;

/// The operation kinds counted apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvOp {
    /// `get`.
    Get,
    /// `insert`.
    Insert,
    /// `update`.
    Update,
    /// `delete`.
    Delete,
    /// `scan` and `range`.
    Scan,
}

impl KvOp {
    /// Every kind, in counter order.
    pub const ALL: [KvOp; 5] = [
        KvOp::Get,
        KvOp::Insert,
        KvOp::Update,
        KvOp::Delete,
        KvOp::Scan,
    ];

    /// The kind's name as the bench prints it.
    pub fn name(self) -> &'static str {
        match self {
            KvOp::Get => "get",
            KvOp::Insert => "insert",
            KvOp::Update => "update",
            KvOp::Delete => "delete",
            KvOp::Scan => "scan",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Totals of one operation kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpStats {
    /// Operations completed (successfully or with an error).
    pub ops: u64,
    /// Dependent round trips the operations waited for (one per doorbell
    /// batch; an unlock posted and not awaited is not counted here, see
    /// `posted`).
    pub rtts: u64,
    /// Operations posted without waiting (the unordered fabric's unlock).
    pub posted: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// 8-byte atomics (CAS and FAA).
    pub atomics: u64,
    /// Leaves read.
    pub leaves_read: u64,
    /// Attempts repeated (lock contention, torn leaf, stale model, frozen
    /// model).
    pub retries: u64,
    /// Model refreshes (a stale or retired cached model was re-read).
    pub refreshes: u64,
    /// Keys returned (scans).
    pub keys: u64,
    /// Value bytes the operations carried: written by puts, returned by
    /// gets and scans (inline or out of line).
    pub value_bytes: u64,
}

impl OpStats {
    /// Average dependent round trips per operation (0 when none ran).
    pub fn rtt_per_op(&self) -> f64 {
        ratio(self.rtts, self.ops)
    }

    /// Average bytes moved (read + written) per operation.
    pub fn bytes_per_op(&self) -> f64 {
        ratio(self.bytes_read + self.bytes_written, self.ops)
    }

    /// Average leaves read per operation.
    pub fn leaves_per_op(&self) -> f64 {
        ratio(self.leaves_read, self.ops)
    }

    /// Average value bytes per operation.
    pub fn value_bytes_per_op(&self) -> f64 {
        ratio(self.value_bytes, self.ops)
    }

    /// Average retries per operation.
    pub fn retries_per_op(&self) -> f64 {
        ratio(self.retries, self.ops)
    }

    /// What one call of `counts[k]` operations of each kind `k` (in
    /// [`KvOp::ALL`] order) cost in all, shared out by kind in proportion
    /// to the counts (a pipelined call's round trips serve all its
    /// operations). The shares add up to `self` exactly; the units a
    /// proportional share leaves over (a call of 7 gets and 1 update
    /// shares 2 round trips as 1.75 and 0.25) go by systematic sampling
    /// from `seed` (any random number), so over many calls each kind is
    /// counted its proportional share on average, not rounded down every
    /// time. Each share's `ops` is its count.
    pub(crate) fn split(&self, counts: &[u64; 5], seed: u64) -> [OpStats; 5] {
        let whole: u64 = counts.iter().sum();
        let mut out = [OpStats::default(); 5];
        if whole == 0 {
            return out;
        }
        let whole = u128::from(whole);
        let u = u128::from(seed) % whole;
        // Sampling points u, u + whole, …: how many lie below `x`.
        let below = |x: u128| if x <= u { 0 } else { (x - u - 1) / whole + 1 };
        macro_rules! split_fields {
            ($($f:ident),*) => {
                $(
                    let mut cum = 0u128;
                    for k in 0..5 {
                        let part = u128::from(self.$f) * u128::from(counts[k]);
                        let rest = part % whole;
                        let extra = below(cum + rest) - below(cum);
                        cum += rest;
                        out[k].$f = (part / whole + extra) as u64;
                    }
                )*
            };
        }
        split_fields!(
            rtts,
            posted,
            bytes_read,
            bytes_written,
            atomics,
            leaves_read,
            retries,
            refreshes,
            keys,
            value_bytes
        );
        for k in 0..5 {
            out[k].ops = counts[k];
        }
        out
    }

    fn add(&mut self, o: &OpStats) {
        self.ops += o.ops;
        self.rtts += o.rtts;
        self.posted += o.posted;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.atomics += o.atomics;
        self.leaves_read += o.leaves_read;
        self.retries += o.retries;
        self.refreshes += o.refreshes;
        self.keys += o.keys;
        self.value_bytes += o.value_bytes;
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Bytes a compute node caches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelBytes {
    /// Everything: upper levels, model first keys, records, segments, LT,
    /// fences, SLT and learned chains.
    pub total: u64,
    /// The learned models alone: segments of every level (40 bytes each in
    /// the pool's form).
    pub learned: u64,
}

/// A client's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct KvStats {
    /// Per operation kind, indexed like [`KvOp::ALL`].
    pub per_op: [OpStats; 5],
    /// Synonym leaves this client created (leaf splits).
    pub synonym_leaves: u64,
    /// Of them, leaves reused from a stash the memory node left in the
    /// model's SLT (leaves retraining freed), instead of drawn new.
    pub stash_leaves: u64,
    /// Models this client put into the retraining queue.
    pub retrain_requests: u64,
    /// Lookups where the model's window missed the owning leaf and the
    /// fences were searched in full (never needed for correctness).
    pub model_misses: u64,
    /// Inserts that waited for a full SLT to be retrained.
    pub slt_full_waits: u64,
    /// Lock attempts that backed off before their `CAS` because a retried
    /// release of this process held the chain's stripe (module `held`;
    /// counted in [`OpStats::retries`] too): one of the pool's chains that
    /// falls in the same stripe (1 in 4,096) had a lock maybe held.
    pub stripe_waits: u64,
    /// Bytes of the value region this client claimed for out-of-line
    /// values, and of those the bytes in blocks it freed and holds for
    /// reuse (or has not handed out yet), when the stats were taken.
    pub value_space: (u64, u64),
    /// Chain locks the client may still hold (see
    /// [`crate::KvClient::locks_maybe_held`]), when the stats were taken.
    pub locks_maybe_held: u64,
    /// Chain locks whose lock or release failed without saying whether it
    /// landed, and which a retry released since (or found not held).
    pub locks_released_late: u64,
    /// Leaf writes that went out behind a whole copy in the pool's redo
    /// log (see [`crate::KvClient::redo_logged`]).
    pub redo_logged: u64,
    /// Leaf writes that went out without one: the client's redo block had
    /// no free slot (or the client has none: then 0 here, see
    /// `redo_logged`).
    pub redo_unlogged: u64,
    /// The client engine's own counters.
    pub engine: CounterSnapshot,
    /// What the client caches.
    pub model_bytes: ModelBytes,
}

impl KvStats {
    /// The totals of one kind.
    pub fn op(&self, op: KvOp) -> OpStats {
        self.per_op[op.index()]
    }

    /// All kinds summed.
    pub fn total(&self) -> OpStats {
        let mut t = OpStats::default();
        for o in &self.per_op {
            t.add(o);
        }
        t
    }

    /// Adds another client's counters (several compute nodes on one pool).
    pub fn merge(&mut self, other: &KvStats) {
        for (a, b) in self.per_op.iter_mut().zip(&other.per_op) {
            a.add(b);
        }
        self.synonym_leaves += other.synonym_leaves;
        self.stash_leaves += other.stash_leaves;
        self.retrain_requests += other.retrain_requests;
        self.model_misses += other.model_misses;
        self.slt_full_waits += other.slt_full_waits;
        self.stripe_waits += other.stripe_waits;
        self.locks_maybe_held += other.locks_maybe_held;
        self.locks_released_late += other.locks_released_late;
        self.redo_logged += other.redo_logged;
        self.redo_unlogged += other.redo_unlogged;
        self.value_space.0 += other.value_space.0;
        self.value_space.1 += other.value_space.1;
        self.engine += other.engine;
        self.model_bytes.total += other.model_bytes.total;
        self.model_bytes.learned += other.model_bytes.learned;
    }
}

macro_rules! atomic_op_stats {
    ($($f:ident),*) => {
        /// A session's live counters of one kind. One writer (the session,
        /// through `&mut` of it), any number of readers.
        #[derive(Debug, Default)]
        pub(crate) struct AtomicOpStats { $(pub(crate) $f: AtomicU64,)* }

        impl AtomicOpStats {
            /// Adds `o`. Only the owning session calls this, so a load and a
            /// store do (no locked read-modify-write per counter and
            /// operation); readers see each counter grow.
            pub(crate) fn add(&self, o: &OpStats) {
                $(if o.$f != 0 {
                    self.$f.store(self.$f.load(Relaxed) + o.$f, Relaxed);
                })*
            }
            pub(crate) fn load(&self) -> OpStats {
                OpStats { $($f: self.$f.load(Relaxed),)* }
            }
        }
    };
}

atomic_op_stats!(
    ops,
    rtts,
    posted,
    bytes_read,
    bytes_written,
    atomics,
    leaves_read,
    retries,
    refreshes,
    keys,
    value_bytes
);

/// One session's counters.
#[derive(Debug, Default)]
pub(crate) struct SessionCounters {
    pub(crate) per_op: [AtomicOpStats; 5],
    pub(crate) synonym_leaves: AtomicU64,
    pub(crate) stash_leaves: AtomicU64,
    pub(crate) retrain_requests: AtomicU64,
    pub(crate) model_misses: AtomicU64,
    pub(crate) slt_full_waits: AtomicU64,
    pub(crate) stripe_waits: AtomicU64,
}

impl SessionCounters {
    pub(crate) fn add_into(&self, s: &mut KvStats) {
        for (a, b) in s.per_op.iter_mut().zip(&self.per_op) {
            a.add(&b.load());
        }
        s.synonym_leaves += self.synonym_leaves.load(Relaxed);
        s.stash_leaves += self.stash_leaves.load(Relaxed);
        s.retrain_requests += self.retrain_requests.load(Relaxed);
        s.model_misses += self.model_misses.load(Relaxed);
        s.slt_full_waits += self.slt_full_waits.load(Relaxed);
        s.stripe_waits += self.stripe_waits.load(Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_shares_add_up_and_average_out() {
        let call = OpStats {
            rtts: 2,
            bytes_read: 1001,
            retries: 1,
            ..OpStats::default()
        };
        let counts = [7, 0, 1, 0, 0];
        let mut sum = [OpStats::default(); 5];
        for seed in 0..8000u64 {
            let parts = call.split(&counts, seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut one = OpStats::default();
            for (k, p) in parts.iter().enumerate() {
                assert_eq!(p.ops, counts[k]);
                one.add(p);
                sum[k].add(p);
            }
            assert_eq!((one.rtts, one.bytes_read, one.retries), (2, 1001, 1));
        }
        // 8,000 calls: updates waited for 2 / 8 of each call's round trips.
        let upd = sum[2].rtts as f64 / 8000.0;
        assert!((upd - 0.25).abs() < 0.03, "update share {upd}");
        assert_eq!(sum[1], OpStats::default());
    }
}
