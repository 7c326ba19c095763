//! YCSB core workloads for `rolex bench`: operation mixes, request key
//! distributions and the split of a key set into loaded and inserted keys.
//!
//! Everything here is pure and deterministic: the operations of thread `t`
//! depend only on `(workload, θ, seed, t, its op count)` and the key set,
//! never on timing or on what other threads do. Three invariants hold for
//! every stream: a read, update, read-modify-write or scan start names a key
//! that is present when the stream issues it (a loaded key or one this
//! thread already inserted; YCSB workloads never delete); an insert names a
//! key that no one has loaded or inserted, taken from the same distribution
//! as the data set (held out of it before the load), so the store's key
//! distribution keeps its shape as it grows; and a delete names a key that
//! this thread owns and that is present when issued — its share of the
//! loaded keys (the threads' shares are disjoint), then the keys it
//! inserted itself — so no key is deleted twice.
//!
//! Beyond YCSB, three workloads of a store that changes size: `append`
//! inserts increasing keys above the loaded range (spaced by the data set's
//! mean gap, dealt round-robin to the threads so that the keys inserted
//! rise over time as the threads advance together); `churn` alternates, in
//! each thread, an insert of a new key (held out as insert-only's are) and
//! a delete of an old one (its share of the loaded keys in load order, then
//! its own inserts, first in first out), so the live key count stays
//! constant; `delete-only` deletes loaded keys. `insert-only` and `append`
//! may start from an empty store ([`Start::Empty`]): all keys are then
//! inserted (`append` inserts them in increasing order).
//!
//! The mixes are YCSB's core workloads: A 50/50 read/update, B 95/5
//! read/update, C read-only, D 95/5 read/insert with the "latest" request
//! distribution, E 95/5 scan/insert with scan lengths uniform in 1..=100,
//! F 50/50 read/read-modify-write; plus insert-only and update-only.
//! Request keys are zipfian after Gray et al. ("Quickly generating
//! billion-record synthetic databases", SIGMOD'94), scrambled as YCSB's
//! `ScrambledZipfianGenerator` does: a zipfian rank over 10^10 items, hashed
//! with FNV-1a and reduced modulo the key count, so the hot keys are
//! scattered over the key space instead of being its smallest keys.
//!
//! One deliberate difference from YCSB: its "latest" and insert key
//! sequence are shared by all client threads (an acknowledged counter).
//! Here each thread sees the loaded keys plus its own inserts, which keeps
//! every stream deterministic per seed and per thread; "latest" therefore
//! means the thread's own most recent inserts, then the load order's tail.

use clap::ValueEnum;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::fmt;
use std::sync::Arc;

/// YCSB's default zipfian constant.
pub const DEFAULT_THETA: f64 = 0.99;

/// Items of the zipfian rank space behind the scrambled generator (YCSB's
/// `ScrambledZipfianGenerator.ITEM_COUNT`).
const SCRAMBLE_ITEMS: u64 = 10_000_000_000;

/// Longest scan of workload E (YCSB's `maxscanlength`).
pub const MAX_SCAN_LEN: usize = 100;

/// Up to this many items, ζ(n, θ) is summed term by term; beyond, the tail
/// is integrated (see [`zeta`]).
const ZETA_EXACT_TERMS: u64 = 1 << 12;

/// Bits of a written value that hold the writer's sequence number; the bits
/// above hold the writer's thread + 1 (0 for values written by the load).
const VALUE_SEQ_BITS: u32 = 40;

/// Threads a run may have: thread + 1 must fit above the sequence bits of a
/// value and leave its top bit clear.
pub const MAX_THREADS: usize = (1 << (63 - VALUE_SEQ_BITS)) - 1;

/// A workload of `rolex bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    /// YCSB A: 50% read, 50% update, zipfian.
    #[value(name = "ycsb-a")]
    A,
    /// YCSB B: 95% read, 5% update, zipfian.
    #[value(name = "ycsb-b")]
    B,
    /// YCSB C: 100% read, zipfian.
    #[value(name = "ycsb-c")]
    C,
    /// YCSB D: 95% read of the latest keys, 5% insert.
    #[value(name = "ycsb-d")]
    D,
    /// YCSB E: 95% short scans (1..=100 keys) from zipfian keys, 5% insert.
    #[value(name = "ycsb-e")]
    E,
    /// YCSB F: 50% read, 50% read-modify-write, zipfian.
    #[value(name = "ycsb-f")]
    F,
    /// 100% insert of new keys.
    #[value(name = "insert-only")]
    InsertOnly,
    /// 100% update, zipfian.
    #[value(name = "update-only")]
    UpdateOnly,
    /// 100% insert of increasing keys above the loaded range.
    #[value(name = "append")]
    Append,
    /// Alternately insert a new key and delete an old one: the live key
    /// count stays constant.
    #[value(name = "churn")]
    Churn,
    /// 100% delete of loaded keys.
    #[value(name = "delete-only")]
    DeleteOnly,
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Percentages of each operation kind in a workload; they add up to 100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// Point reads.
    pub read: u8,
    /// Updates of present keys.
    pub update: u8,
    /// Inserts of new keys.
    pub insert: u8,
    /// Scans.
    pub scan: u8,
    /// Read-modify-writes.
    pub rmw: u8,
    /// Deletes of keys the thread owns.
    pub delete: u8,
}

/// How a workload picks the key of a read, update or scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestDist {
    /// Scrambled zipfian over the present keys.
    Zipfian,
    /// Zipfian over recency: the most recently inserted key is the hottest.
    Latest,
}

impl Workload {
    /// The name on the command line and in the JSON line.
    pub fn name(self) -> &'static str {
        match self {
            Workload::A => "ycsb-a",
            Workload::B => "ycsb-b",
            Workload::C => "ycsb-c",
            Workload::D => "ycsb-d",
            Workload::E => "ycsb-e",
            Workload::F => "ycsb-f",
            Workload::InsertOnly => "insert-only",
            Workload::UpdateOnly => "update-only",
            Workload::Append => "append",
            Workload::Churn => "churn",
            Workload::DeleteOnly => "delete-only",
        }
    }

    /// Whether the workload can run on a store that starts empty: it only
    /// inserts (reads, updates and deletes need loaded keys).
    pub fn can_start_empty(self) -> bool {
        self.mix().insert == 100
    }

    /// The operation mix (YCSB's `workloads/workload[a-f]`).
    pub fn mix(self) -> Mix {
        let m = |read, update, insert, scan, rmw, delete| Mix {
            read,
            update,
            insert,
            scan,
            rmw,
            delete,
        };
        match self {
            Workload::A => m(50, 50, 0, 0, 0, 0),
            Workload::B => m(95, 5, 0, 0, 0, 0),
            Workload::C => m(100, 0, 0, 0, 0, 0),
            Workload::D => m(95, 0, 5, 0, 0, 0),
            Workload::E => m(0, 0, 5, 95, 0, 0),
            Workload::F => m(50, 0, 0, 0, 50, 0),
            Workload::InsertOnly | Workload::Append => m(0, 0, 100, 0, 0, 0),
            Workload::UpdateOnly => m(0, 100, 0, 0, 0, 0),
            // Not drawn: churn alternates insert, delete, insert, …
            Workload::Churn => m(0, 0, 50, 0, 0, 50),
            Workload::DeleteOnly => m(0, 0, 0, 0, 0, 100),
        }
    }

    /// The request key distribution.
    pub fn request_dist(self) -> RequestDist {
        match self {
            Workload::D => RequestDist::Latest,
            _ => RequestDist::Zipfian,
        }
    }
}

/// One operation of a stream. Values written are unique per run: they
/// encode the writing thread and its sequence number (see [`write_value`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Read `key`.
    Read(u64),
    /// Set the present `key` to `value`.
    Update {
        /// The key.
        key: u64,
        /// The new value.
        value: u64,
    },
    /// Insert the new `key` with `value`.
    Insert {
        /// The key.
        key: u64,
        /// Its value.
        value: u64,
    },
    /// Read up to `len` keys from `from` upwards.
    Scan {
        /// The first key (present when issued).
        from: u64,
        /// Keys to read, in `1..=MAX_SCAN_LEN`.
        len: usize,
    },
    /// Read `key`, then set it to `value`.
    ReadModifyWrite {
        /// The key.
        key: u64,
        /// The new value.
        value: u64,
    },
    /// Delete the present `key` (one this thread owns).
    Delete {
        /// The key.
        key: u64,
    },
}

/// How the store starts a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Loaded with the key set, less the keys the run inserts.
    Loaded,
    /// Empty: every key of the set is one the run inserts (only for
    /// workloads that only insert, [`Workload::can_start_empty`]).
    Empty,
}

/// Why a workload cannot be planned.
#[derive(Clone, Debug, PartialEq)]
pub enum YcsbError {
    /// θ is outside (0, 1).
    BadTheta(f64),
    /// No operations were asked for.
    NoOps,
    /// No threads were asked for.
    NoThreads,
    /// More threads than values can name.
    TooManyThreads(usize),
    /// A thread would issue more operations than a value can number.
    TooManyOps(u64),
    /// The key set cannot provide the inserts and still leave keys to load.
    TooFewKeys {
        /// Keys in the set.
        have: usize,
        /// Keys the run inserts (held out of the load).
        inserts: u64,
    },
    /// The loaded key set has too few gaps to draw the run's new keys from
    /// (a run against a memory node).
    TooFewGaps {
        /// Gaps wider than one between consecutive loaded keys.
        gaps: usize,
        /// Keys the run inserts.
        inserts: u64,
    },
    /// The workload reads, updates or deletes loaded keys, but the store
    /// starts with none.
    NeedsLoadedKeys(Workload),
    /// The run deletes more loaded keys than are loaded.
    TooFewToDelete {
        /// Keys loaded.
        loaded: usize,
        /// Loaded keys the run deletes.
        deletes: u64,
    },
    /// The keys to append do not fit above the largest loaded key.
    NoRoomAbove {
        /// The largest loaded key.
        max: u64,
        /// Keys the run appends.
        inserts: u64,
    },
    /// The key set is not strictly increasing.
    Unsorted {
        /// Index of the first key not above its predecessor.
        index: usize,
        /// That key.
        key: u64,
        /// Its predecessor, at `index − 1`.
        previous: u64,
    },
}

impl fmt::Display for YcsbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            YcsbError::BadTheta(t) => write!(
                f,
                "zipf θ = {t} is outside (0, 1): Gray et al.'s generator (as in YCSB) \
                 needs 0 < θ < 1, since α = 1/(1−θ) is undefined at θ = 1"
            ),
            YcsbError::NoOps => f.write_str("--ops must be at least 1"),
            YcsbError::NoThreads => f.write_str("--threads must be at least 1"),
            YcsbError::TooManyThreads(t) => {
                write!(f, "{t} threads: at most {MAX_THREADS} are supported")
            }
            YcsbError::TooManyOps(n) => write!(
                f,
                "{n} operations per thread: at most 2^{VALUE_SEQ_BITS} − 1 are supported"
            ),
            YcsbError::TooFewKeys { have, inserts } => write!(
                f,
                "the key set has {have} keys but the run inserts {inserts} new ones, held out \
                 of the load: it needs at least {} keys",
                inserts + 1
            ),
            YcsbError::TooFewGaps { gaps, inserts } => write!(
                f,
                "the memory node's key set has {gaps} gaps to draw new keys from, but the run \
                 inserts {inserts}, and no generator to draw more from (a key file's data set): \
                 run fewer inserts"
            ),
            YcsbError::NeedsLoadedKeys(w) => write!(
                f,
                "{w} reads, updates or deletes loaded keys, but the store starts empty: \
                 only insert-only and append run on an empty store"
            ),
            YcsbError::TooFewToDelete { loaded, deletes } => write!(
                f,
                "the run deletes {deletes} loaded keys but only {loaded} are loaded: \
                 run at most {loaded} operations"
            ),
            YcsbError::NoRoomAbove { max, inserts } => write!(
                f,
                "the run appends {inserts} keys above the largest loaded key {max}, \
                 but only {} keys fit above it",
                u64::MAX - max
            ),
            YcsbError::Unsorted {
                index,
                key,
                previous,
            } => write!(
                f,
                "key set not strictly increasing at index {index}: key {key} after {previous}"
            ),
        }
    }
}

impl std::error::Error for YcsbError {}

/// FNV-1a, 64 bits, over `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// YCSB's `fnvhash64(long)`: FNV-1a over the value's 8 little-endian
/// bytes, made non-negative.
pub fn fnv_scramble(x: u64) -> u64 {
    (fnv1a64(&x.to_le_bytes()) as i64).unsigned_abs() & (u64::MAX >> 1)
}

/// ζ(n, θ) = Σ_{i=1}^{n} i^−θ.
///
/// Exact sum for the first [`ZETA_EXACT_TERMS`] terms; the rest is
/// ∫_{m+½}^{n+½} x^−θ dx (midpoint rule, whose error per term is about
/// θ(θ+1)/24 · i^−θ−2, below 10^−8 in total past 2^12), so ζ over 10^10
/// items costs microseconds instead of a minute.
pub fn zeta(n: u64, theta: f64) -> f64 {
    zeta_range(0, n, theta)
}

/// Σ_{i=from+1}^{to} i^−θ (0 when `to <= from`), exact below
/// [`ZETA_EXACT_TERMS`] and integrated above.
fn zeta_range(from: u64, to: u64, theta: f64) -> f64 {
    if to <= from {
        return 0.0;
    }
    let exact_to = to.min(from.max(ZETA_EXACT_TERMS));
    let mut sum = 0.0;
    for i in from + 1..=exact_to {
        sum += (i as f64).powf(-theta);
    }
    if to > exact_to {
        let e = 1.0 - theta;
        let a = exact_to as f64 + 0.5;
        let b = to as f64 + 0.5;
        sum += (b.powf(e) - a.powf(e)) / e;
    }
    sum
}

/// Gray et al.'s zipfian generator over ranks `0..items`, rank 0 hottest.
/// The item count may grow; ζ is then extended incrementally (as YCSB's
/// `ZipfianGenerator.nextLong(itemcount)` does).
#[derive(Clone, Debug)]
pub struct Zipfian {
    items: u64,
    theta: f64,
    alpha: f64,
    zeta2: f64,
    zetan: f64,
    eta: f64,
}

impl Zipfian {
    /// A generator over `items ≥ 1` ranks with constant `theta ∈ (0, 1)`.
    pub fn new(items: u64, theta: f64) -> Result<Self, YcsbError> {
        check_theta(theta)?;
        let items = items.max(1);
        Ok(Self::with_zeta(items, theta, zeta(items, theta)))
    }

    fn with_zeta(items: u64, theta: f64, zetan: f64) -> Self {
        let zeta2 = zeta(2, theta);
        let mut z = Zipfian {
            items,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zeta2,
            zetan,
            eta: 0.0,
        };
        z.eta = z.compute_eta();
        z
    }

    fn compute_eta(&self) -> f64 {
        (1.0 - (2.0 / self.items as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan)
    }

    /// Ranks the generator draws from.
    #[cfg(test)]
    pub fn items(&self) -> u64 {
        self.items
    }

    /// ζ(items, θ).
    #[cfg(test)]
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// Extends the rank space to `items` (never shrinks it).
    pub fn grow_to(&mut self, items: u64) {
        if items > self.items {
            self.zetan += zeta_range(self.items, items, self.theta);
            self.items = items;
            self.eta = self.compute_eta();
        }
    }

    /// Draws a rank in `0..items`.
    pub fn next(&self, rng: &mut impl Rng) -> u64 {
        let u: f64 = rng.gen();
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1.min(self.items - 1);
        }
        let r = (self.items as f64 * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.items - 1)
    }
}

fn check_theta(theta: f64) -> Result<(), YcsbError> {
    if theta > 0.0 && theta < 1.0 {
        Ok(())
    } else {
        Err(YcsbError::BadTheta(theta))
    }
}

/// YCSB's scrambled zipfian: a zipfian rank over 10^10 items, hashed and
/// reduced modulo the item count.
#[derive(Clone, Debug)]
pub struct ScrambledZipfian {
    base: Zipfian,
}

/// YCSB's precomputed ζ(10^10, 0.99) (`ScrambledZipfianGenerator.ZETAN`).
const YCSB_ZETAN_099: f64 = 26.469_028_201_783_02;

impl ScrambledZipfian {
    /// A scrambled zipfian generator with constant `theta ∈ (0, 1)`.
    pub fn new(theta: f64) -> Result<Self, YcsbError> {
        check_theta(theta)?;
        let zetan = if theta == DEFAULT_THETA {
            YCSB_ZETAN_099
        } else {
            zeta(SCRAMBLE_ITEMS, theta)
        };
        Ok(ScrambledZipfian {
            base: Zipfian::with_zeta(SCRAMBLE_ITEMS, theta, zetan),
        })
    }

    /// Draws an item in `0..items` (`items ≥ 1`).
    pub fn next(&self, items: u64, rng: &mut impl Rng) -> u64 {
        fnv_scramble(self.base.next(rng)) % items.max(1)
    }
}

/// The value written by operation `seq` (1-based) of `thread`: unique per
/// run, never 0, top bit clear.
pub fn write_value(thread: usize, seq: u64) -> u64 {
    ((thread as u64 + 1) << VALUE_SEQ_BITS) | (seq & ((1 << VALUE_SEQ_BITS) - 1))
}

/// The writer of a value made by [`write_value`]: `(thread, seq)`; `None`
/// for a value below 2^40 (a [`load_value`]).
pub fn writer_of(value: u64) -> Option<(usize, u64)> {
    let tag = value >> VALUE_SEQ_BITS;
    let thread = usize::try_from(tag.checked_sub(1)?).ok()?;
    Some((thread, value & ((1 << VALUE_SEQ_BITS) - 1)))
}

/// The value the load gives `key`: never 0, top bit clear, and below
/// 2^40 so it never equals a [`write_value`].
pub fn load_value(key: u64) -> u64 {
    let mut x = key ^ 0x9e37_79b9_7f4a_7c15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (x & ((1 << VALUE_SEQ_BITS) - 1)) | 1
}

/// How a run's operations are spread over threads, and how many inserts
/// and deletes each thread makes (known before the load, so the inserted
/// keys can be held out of it and the deleted ones shared out).
#[derive(Clone, Debug)]
pub struct Plan {
    workload: Workload,
    theta: f64,
    seed: u64,
    ops: Vec<u64>,
    inserts: Vec<u64>,
    deletes: Vec<u64>,
    zipf: ScrambledZipfian,
}

/// Separate streams of one thread's generator.
const STREAM_KIND: u64 = 0;
const STREAM_KEY: u64 = 1;
const STREAMS_PER_THREAD: u64 = 2;

fn thread_rng(seed: u64, thread: usize, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(thread as u64 * STREAMS_PER_THREAD + stream);
    rng
}

/// Draws the kind of the next operation; the kind stream is separate from
/// the key stream so that [`Plan::new`] can count inserts by replaying it.
fn draw_kind(mix: &Mix, rng: &mut ChaCha8Rng) -> Kind {
    let mut x = rng.gen_range(0..100u8);
    for (share, kind) in [
        (mix.read, Kind::Read),
        (mix.update, Kind::Update),
        (mix.insert, Kind::Insert),
        (mix.scan, Kind::Scan),
        (mix.delete, Kind::Delete),
    ] {
        if x < share {
            return kind;
        }
        x -= share;
    }
    Kind::Rmw
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Update,
    Insert,
    Scan,
    Rmw,
    Delete,
}

/// The kinds of one thread's operations, in order: drawn from the mix, or
/// for churn insert and delete by turns, insert first — so delete `j`
/// follows insert `j`, and a thread whose share of loaded keys is used up
/// always has an inserted key left to delete.
#[derive(Clone, Debug)]
struct Kinds {
    mix: Mix,
    alternate: bool,
    rng: ChaCha8Rng,
    insert_next: bool,
}

impl Kinds {
    fn new(workload: Workload, seed: u64, thread: usize) -> Self {
        Kinds {
            mix: workload.mix(),
            alternate: workload == Workload::Churn,
            rng: thread_rng(seed, thread, STREAM_KIND),
            insert_next: true,
        }
    }

    fn next(&mut self) -> Kind {
        if self.alternate {
            let kind = if self.insert_next {
                Kind::Insert
            } else {
                Kind::Delete
            };
            self.insert_next = !self.insert_next;
            return kind;
        }
        draw_kind(&self.mix, &mut self.rng)
    }

    /// Inserts and deletes among the first `n` kinds.
    fn count(mut self, n: u64) -> (u64, u64) {
        let m = self.mix;
        if self.alternate {
            return (n.div_ceil(2), n / 2);
        }
        match (m.insert, m.delete) {
            (100, _) => (n, 0),
            (_, 100) => (0, n),
            (0, 0) => (0, 0),
            _ => (0..n).fold((0, 0), |(i, d), _| match self.next() {
                Kind::Insert => (i + 1, d),
                Kind::Delete => (i, d + 1),
                _ => (i, d),
            }),
        }
    }
}

impl Plan {
    /// Plans `ops` operations of `workload` over `threads` threads.
    pub fn new(
        workload: Workload,
        ops: u64,
        threads: usize,
        theta: f64,
        seed: u64,
    ) -> Result<Self, YcsbError> {
        check_theta(theta)?;
        if ops == 0 {
            return Err(YcsbError::NoOps);
        }
        if threads == 0 {
            return Err(YcsbError::NoThreads);
        }
        if threads > MAX_THREADS {
            return Err(YcsbError::TooManyThreads(threads));
        }
        let t = threads as u64;
        let per: Vec<u64> = (0..t).map(|i| ops / t + u64::from(i < ops % t)).collect();
        if per[0] >= 1 << VALUE_SEQ_BITS {
            return Err(YcsbError::TooManyOps(per[0]));
        }
        let (inserts, deletes) = per
            .iter()
            .enumerate()
            .map(|(i, &n)| Kinds::new(workload, seed, i).count(n))
            .unzip();
        Ok(Plan {
            workload,
            theta,
            seed,
            ops: per,
            inserts,
            deletes,
            zipf: ScrambledZipfian::new(theta)?,
        })
    }

    /// Threads.
    pub fn threads(&self) -> usize {
        self.ops.len()
    }

    /// Operations of `thread`.
    #[cfg(test)]
    pub fn ops_of(&self, thread: usize) -> u64 {
        self.ops[thread]
    }

    /// Inserts of `thread`.
    #[cfg(test)]
    pub fn inserts_of(&self, thread: usize) -> u64 {
        self.inserts[thread]
    }

    /// Deletes of `thread`.
    #[cfg(test)]
    pub fn deletes_of(&self, thread: usize) -> u64 {
        self.deletes[thread]
    }

    /// Inserts of the whole run.
    pub fn total_inserts(&self) -> u64 {
        self.inserts.iter().sum()
    }

    /// Deletes of the whole run.
    pub fn total_deletes(&self) -> u64 {
        self.deletes.iter().sum()
    }

    /// Keys the data set must hold beyond those loaded: the keys the run
    /// inserts, held out of the load — except `append`'s on a loaded
    /// store, which are made above the loaded range.
    pub fn held_out(&self, start: Start) -> u64 {
        match (self.workload, start) {
            (Workload::Append, Start::Loaded) => 0,
            _ => self.total_inserts(),
        }
    }

    /// Splits a strictly increasing key set into the keys to load and each
    /// thread's keys to insert (and to delete). The held-out keys
    /// ([`Plan::held_out`]) are a uniform random sample (per seed), so they
    /// follow the data set's distribution; with [`Start::Empty`] nothing
    /// is loaded.
    pub fn split(&self, keys: Vec<u64>, start: Start) -> Result<KeySets, YcsbError> {
        check_sorted(&keys)?;
        let total = self.held_out(start);
        let room = match start {
            Start::Loaded => total < keys.len() as u64,
            Start::Empty => total <= keys.len() as u64,
        };
        if !room {
            return Err(YcsbError::TooFewKeys {
                have: keys.len(),
                inserts: total,
            });
        }
        let mut rng = self.split_rng();
        let held = rand::seq::index::sample(&mut rng, keys.len(), total as usize);
        let mut is_held = vec![false; keys.len()];
        let mut held_keys = Vec::with_capacity(total as usize);
        for i in held.iter() {
            is_held[i] = true;
            held_keys.push(keys[i]);
        }
        let loaded: Vec<u64> = match start {
            Start::Loaded => keys
                .iter()
                .zip(&is_held)
                .filter(|(_, &h)| !h)
                .map(|(&k, _)| k)
                .collect(),
            Start::Empty => Vec::new(),
        };
        self.assemble(loaded, &held_keys, &mut rng)
    }

    /// Midpoints of the gaps wider than one between consecutive keys of
    /// the strictly increasing `loaded`: keys that are new and inside.
    fn gap_keys(loaded: &[u64]) -> Vec<u64> {
        loaded
            .windows(2)
            .filter(|w| w[1] - w[0] >= 2)
            .map(|w| w[0] + (w[1] - w[0]) / 2)
            .collect()
    }

    /// Whether [`Plan::split_fresh`] over `loaded` needs keys drawn from
    /// the data set's generator: the run inserts more keys than the loaded
    /// set has gaps (`append` above a loaded range needs none).
    pub fn needs_drawn_keys(&self, loaded: &[u64]) -> bool {
        let total = self.total_inserts();
        if total == 0 || (self.workload == Workload::Append && !loaded.is_empty()) {
            return false;
        }
        let gaps = loaded.windows(2).filter(|w| w[1] - w[0] >= 2).count();
        total > gaps as u64
    }

    /// The seed to draw [`Plan::split_fresh`]'s extra keys with: derived
    /// from the run's seed, so every process of a run draws the same keys,
    /// and different from it, so they are not the loaded keys again.
    pub fn drawn_seed(&self) -> u64 {
        self.seed ^ 0x2545_f491_4f6c_dd1d
    }

    /// For a run against a memory node that loaded the whole strictly
    /// increasing key set `loaded`: the keys to insert are new keys —
    /// above the loaded range for `append`; otherwise in its gaps (the
    /// midpoints of a uniform random sample, per seed, of the gaps wider
    /// than one) while there are enough; otherwise a uniform random sample
    /// of `drawn` (strictly increasing keys of the data set's distribution,
    /// drawn with [`Plan::drawn_seed`]; see [`Plan::needs_drawn_keys`])
    /// less the loaded keys. Every process of the run derives the same
    /// keys, they follow the data set's distribution, and none is loaded.
    /// (The seed is the data set's too, so a second run that writes into
    /// the same memory node finds the first run's keys and values: give
    /// each writing run a fresh memory node.)
    pub fn split_fresh(
        &self,
        loaded: Vec<u64>,
        drawn: Option<Vec<u64>>,
    ) -> Result<KeySets, YcsbError> {
        check_sorted(&loaded)?;
        let total = self.total_inserts();
        let mut rng = self.split_rng();
        let mut sample = |from: &[u64]| -> Vec<u64> {
            rand::seq::index::sample(&mut rng, from.len(), total as usize)
                .iter()
                .map(|i| from[i])
                .collect()
        };
        let wide = Self::gap_keys(&loaded);
        let held_keys = if !self.needs_drawn_keys(&loaded) {
            if self.workload == Workload::Append && !loaded.is_empty() {
                Vec::new()
            } else {
                sample(&wide)
            }
        } else {
            let too_few = YcsbError::TooFewGaps {
                gaps: wide.len(),
                inserts: total,
            };
            let drawn = drawn.ok_or(too_few.clone())?;
            check_sorted(&drawn)?;
            let fresh: Vec<u64> = drawn
                .into_iter()
                .filter(|k| loaded.binary_search(k).is_err())
                .collect();
            if (fresh.len() as u64) < total {
                return Err(too_few);
            }
            sample(&fresh)
        };
        self.assemble(loaded, &held_keys, &mut rng)
    }

    fn split_rng(&self) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(self.seed ^ 0x5851_f42d_4c95_7f2d)
    }

    /// The key sets from what is loaded and the keys to insert (dealt to
    /// the threads in order, or made by [`Plan::append_keys`]), and each
    /// thread's share of the loaded keys to delete: the load order cut
    /// into one run of consecutive keys per thread.
    fn assemble(
        &self,
        loaded: Vec<u64>,
        held: &[u64],
        rng: &mut ChaCha8Rng,
    ) -> Result<KeySets, YcsbError> {
        if loaded.is_empty() && !self.workload.can_start_empty() {
            return Err(YcsbError::NeedsLoadedKeys(self.workload));
        }
        let mut order = loaded.clone();
        order.shuffle(rng);
        let inserts = if self.workload == Workload::Append {
            self.append_keys(&loaded, held)?
        } else {
            let mut inserts = Vec::with_capacity(self.threads());
            let mut rest = held;
            for &n in &self.inserts {
                let (mine, tail) = rest.split_at(n as usize);
                inserts.push(mine.to_vec());
                rest = tail;
            }
            inserts
        };
        let t = self.threads();
        let shares: Vec<std::ops::Range<usize>> = if self.total_deletes() == 0 {
            vec![0..0; t]
        } else {
            let (n, mut at) = (order.len(), 0);
            (0..t)
                .map(|i| {
                    let len = n / t + usize::from(i < n % t);
                    at += len;
                    at - len..at
                })
                .collect()
        };
        // A thread deletes its share, then (churn) its own inserts.
        for (i, share) in shares.iter().enumerate() {
            if self.deletes[i] > (share.len() + inserts[i].len()) as u64 {
                return Err(YcsbError::TooFewToDelete {
                    loaded: loaded.len(),
                    deletes: self.total_deletes(),
                });
            }
        }
        Ok(KeySets {
            loaded,
            order: order.into(),
            inserts,
            deletes: shares,
        })
    }

    /// `append`'s keys, dealt round-robin — key `i` of the run (over all
    /// threads) is thread `i mod T`'s, so the keys inserted rise over time
    /// while the threads advance together: above the largest loaded key,
    /// spaced by the loaded keys' mean gap (at least 1, and less if all
    /// would not fit below 2^64); on an empty store, the held-out keys in
    /// increasing order.
    fn append_keys(&self, loaded: &[u64], held: &[u64]) -> Result<Vec<Vec<u64>>, YcsbError> {
        let total = self.total_inserts();
        let keys: Vec<u64> = match (loaded.first(), loaded.last()) {
            (Some(&min), Some(&max)) => {
                let room = u64::MAX - max;
                if total > room {
                    return Err(YcsbError::NoRoomAbove {
                        max,
                        inserts: total,
                    });
                }
                let mean = (max - min) / (loaded.len() as u64 - 1).max(1);
                let gap = mean.min(room / total.max(1)).max(1);
                // i · gap ≤ total · (room / total) ≤ room: no overflow.
                (1..=total).map(|i| max + i * gap).collect()
            }
            _ => {
                let mut keys = held.to_vec();
                keys.sort_unstable();
                keys
            }
        };
        let t = self.threads();
        let mut dealt: Vec<Vec<u64>> = self
            .inserts
            .iter()
            .map(|&n| Vec::with_capacity(n as usize))
            .collect();
        for (i, k) in keys.into_iter().enumerate() {
            dealt[i % t].push(k);
        }
        // Every operation inserts, and operations are dealt as i mod T is.
        debug_assert!(dealt
            .iter()
            .zip(&self.inserts)
            .all(|(d, &n)| d.len() as u64 == n));
        Ok(dealt)
    }

    /// The operation stream of `thread`, which inserts its keys from
    /// [`KeySets::inserts`] in that order, and deletes its share of
    /// [`KeySets::deletes`], then its own inserted keys in the order it
    /// inserted them.
    pub fn stream(&self, thread: usize, sets: &KeySets) -> OpStream {
        let own = sets.inserts[thread].clone();
        let loaded = sets.order.len() as u64;
        let latest = match self.workload.request_dist() {
            // Ranks over what is present now; grows with each insert.
            RequestDist::Latest => {
                Some(Zipfian::new(loaded, self.theta).expect("θ was checked by Plan::new"))
            }
            RequestDist::Zipfian => None,
        };
        OpStream {
            kinds: Kinds::new(self.workload, self.seed, thread),
            thread,
            left: self.ops[thread],
            seq: 0,
            key_rng: thread_rng(self.seed, thread, STREAM_KEY),
            zipf: self.zipf.clone(),
            latest,
            order: Arc::clone(&sets.order),
            items: loaded + own.len() as u64,
            own,
            inserted: 0,
            share: sets.deletes[thread].clone(),
            deleted: 0,
        }
    }
}

/// [`YcsbError::Unsorted`] at the first key of `keys` not above its
/// predecessor, if any.
fn check_sorted(keys: &[u64]) -> Result<(), YcsbError> {
    match keys.windows(2).position(|w| w[0] >= w[1]) {
        Some(i) => Err(YcsbError::Unsorted {
            index: i + 1,
            key: keys[i + 1],
            previous: keys[i],
        }),
        None => Ok(()),
    }
}

/// A key set split for a run.
#[derive(Clone, Debug)]
pub struct KeySets {
    /// The keys to load, strictly increasing.
    pub loaded: Vec<u64>,
    /// The same keys in load order (a random permutation: YCSB loads record
    /// numbers whose keys are hashed, so its load order is not key order).
    pub order: Arc<[u64]>,
    /// Each thread's new keys, in the order it inserts them.
    pub inserts: Vec<Vec<u64>>,
    /// Each thread's share of the loaded keys to delete, as a range of
    /// `order` (disjoint between threads; empty when the run deletes
    /// nothing).
    pub deletes: Vec<std::ops::Range<usize>>,
}

/// The operations of one thread, generated on the fly.
#[derive(Clone, Debug)]
pub struct OpStream {
    kinds: Kinds,
    thread: usize,
    left: u64,
    seq: u64,
    key_rng: ChaCha8Rng,
    zipf: ScrambledZipfian,
    latest: Option<Zipfian>,
    order: Arc<[u64]>,
    /// Loaded keys + this thread's inserts over the whole run: the range of
    /// the scrambled zipfian, sized once as YCSB sizes it for expected keys.
    items: u64,
    own: Vec<u64>,
    inserted: usize,
    /// This thread's loaded keys to delete, in `order`.
    share: std::ops::Range<usize>,
    deleted: usize,
}

impl OpStream {
    /// Keys present from this thread's view: loaded + inserted so far.
    fn present(&self) -> u64 {
        self.order.len() as u64 + self.inserted as u64
    }

    /// The key with index `i` in this thread's insertion order.
    fn key_at(&self, i: u64) -> u64 {
        let loaded = self.order.len() as u64;
        if i < loaded {
            self.order[i as usize]
        } else {
            self.own[(i - loaded) as usize]
        }
    }

    fn request_key(&mut self) -> u64 {
        let present = self.present();
        if let Some(latest) = &mut self.latest {
            latest.grow_to(present);
            let back = latest.next(&mut self.key_rng);
            return self.key_at(present - 1 - back);
        }
        // Keys inserted later are in range but not present yet: redraw, as
        // YCSB does for keys past its acknowledged insert counter.
        loop {
            let i = self.zipf.next(self.items, &mut self.key_rng);
            if i < present {
                return self.key_at(i);
            }
        }
    }
}

impl Iterator for OpStream {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        self.seq += 1;
        let value = write_value(self.thread, self.seq);
        let op = match self.kinds.next() {
            Kind::Read => Op::Read(self.request_key()),
            Kind::Update => Op::Update {
                key: self.request_key(),
                value,
            },
            Kind::Rmw => Op::ReadModifyWrite {
                key: self.request_key(),
                value,
            },
            Kind::Scan => {
                let from = self.request_key();
                let len = self.key_rng.gen_range(1..=MAX_SCAN_LEN);
                Op::Scan { from, len }
            }
            Kind::Insert => {
                // Plan::new counted exactly this many inserts on this stream.
                let key = self.own[self.inserted];
                self.inserted += 1;
                Op::Insert { key, value }
            }
            Kind::Delete => {
                // Plan::split checked the share and the inserts suffice;
                // churn's delete j follows its insert j.
                let i = self.deleted;
                self.deleted += 1;
                let key = match self.share.clone().nth(i) {
                    Some(at) => self.order[at],
                    None => self.own[i - self.share.len()],
                };
                Op::Delete { key }
            }
        };
        Some(op)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.left).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    const ALL: [Workload; 11] = [
        Workload::A,
        Workload::B,
        Workload::C,
        Workload::D,
        Workload::E,
        Workload::F,
        Workload::InsertOnly,
        Workload::UpdateOnly,
        Workload::Append,
        Workload::Churn,
        Workload::DeleteOnly,
    ];

    fn keyset(n: u64) -> Vec<u64> {
        (0..n).map(|i| i * 7 + 3).collect()
    }

    #[test]
    fn mixes_add_up_to_100() {
        for w in ALL {
            let m = w.mix();
            assert_eq!(
                u32::from(m.read)
                    + u32::from(m.update)
                    + u32::from(m.insert)
                    + u32::from(m.scan)
                    + u32::from(m.rmw)
                    + u32::from(m.delete),
                100,
                "{w}"
            );
        }
    }

    #[test]
    fn fnv_matches_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn zeta_tail_matches_exact_sum_and_ycsb_constant() {
        for theta in [0.5, 0.8, 0.99] {
            let n = 1 << 21;
            let exact: f64 = (1..=n).map(|i| (i as f64).powf(-theta)).sum();
            let fast = zeta(n, theta);
            assert!(((fast - exact) / exact).abs() < 1e-9, "θ={theta}");
        }
        let z = zeta(SCRAMBLE_ITEMS, 0.99);
        assert!((z - YCSB_ZETAN_099).abs() / YCSB_ZETAN_099 < 1e-9, "{z}");
    }

    #[test]
    fn zipfian_growth_equals_fresh_generator() {
        let mut z = Zipfian::new(1000, 0.99).unwrap();
        z.grow_to(1500);
        let f = Zipfian::new(1500, 0.99).unwrap();
        assert!((z.zetan() - f.zetan()).abs() < 1e-9);
        assert_eq!(z.items(), 1500);
    }

    #[test]
    fn zipfian_rank_frequencies_follow_the_law() {
        // P(rank r) = (r+1)^−θ / ζ(n). Gray's method is exact for ranks 0
        // and 1 and approximates the rest; check the exact head.
        let n = 1000;
        let z = Zipfian::new(n, 0.99).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let draws = 200_000;
        let mut counts = vec![0u32; n as usize];
        for _ in 0..draws {
            let r = z.next(&mut rng);
            assert!(r < n);
            counts[r as usize] += 1;
        }
        for (r, &c) in counts.iter().enumerate().take(2) {
            let p = ((r + 1) as f64).powf(-0.99) / z.zetan();
            let got = f64::from(c) / f64::from(draws);
            assert!((got - p).abs() < 0.1 * p, "rank {r}: {got} vs {p}");
        }
        // Monotone in expectation: the head beats the tail by far.
        assert!(counts[0] > 100 * counts[900].max(1));
    }

    #[test]
    fn bad_theta_is_rejected() {
        for t in [0.0, 1.0, 1.5, -0.1, f64::NAN] {
            assert!(matches!(
                Plan::new(Workload::A, 10, 1, t, 1),
                Err(YcsbError::BadTheta(_))
            ));
        }
        assert!(Plan::new(Workload::A, 10, 1, 0.5, 1).is_ok());
    }

    #[test]
    fn zero_ops_or_threads_are_rejected() {
        assert_eq!(
            Plan::new(Workload::C, 0, 1, 0.99, 1).unwrap_err(),
            YcsbError::NoOps
        );
        assert_eq!(
            Plan::new(Workload::C, 1, 0, 0.99, 1).unwrap_err(),
            YcsbError::NoThreads
        );
    }

    #[test]
    fn split_needs_room_and_sorted_input() {
        let plan = Plan::new(Workload::InsertOnly, 10, 2, 0.99, 1).unwrap();
        assert_eq!(plan.total_inserts(), 10);
        assert!(matches!(
            plan.split(keyset(10), Start::Loaded),
            Err(YcsbError::TooFewKeys { .. })
        ));
        assert_eq!(
            plan.split(vec![1, 2, 2, 3], Start::Loaded).unwrap_err(),
            YcsbError::Unsorted {
                index: 2,
                key: 2,
                previous: 2
            }
        );
        let sets = plan.split(keyset(11), Start::Loaded).unwrap();
        assert_eq!(sets.loaded.len(), 1);
        assert_eq!(sets.inserts[0].len() + sets.inserts[1].len(), 10);
    }

    #[test]
    fn fresh_keys_are_new_in_the_gaps_the_same_everywhere_and_bounded() {
        let plan = Plan::new(Workload::D, 2000, 4, 0.99, 9).unwrap();
        let total = plan.total_inserts() as usize;
        assert!(total > 0);
        let loaded: Vec<u64> = (0..10_000u64).map(|i| i * i + 3 * i).collect();
        let a = plan.split_fresh(loaded.clone(), None).unwrap();
        let b = plan.split_fresh(loaded.clone(), None).unwrap();
        assert_eq!(a.inserts, b.inserts, "every process derives the same keys");
        assert_eq!(a.loaded, loaded);
        let mut all: Vec<u64> = a.inserts.concat();
        assert_eq!(all.len(), total);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), total, "no key inserted twice");
        for k in &all {
            let i = loaded.partition_point(|x| x < k);
            assert!(
                i > 0 && i < loaded.len() && loaded[i] != *k,
                "{k} is new, inside"
            );
        }
        // A set without gaps cannot give new keys; unsorted input is named.
        assert!(matches!(
            plan.split_fresh((0..10_000).collect(), None),
            Err(YcsbError::TooFewGaps { gaps: 0, .. })
        ));
        assert_eq!(
            plan.split_fresh(vec![5, 1], None).unwrap_err(),
            YcsbError::Unsorted {
                index: 1,
                key: 1,
                previous: 5
            }
        );
    }

    #[test]
    fn mix_shares_are_respected() {
        let sets_for = |plan: &Plan| plan.split(keyset(50_000), Start::Loaded).unwrap();
        for w in ALL {
            let plan = Plan::new(w, 20_000, 1, 0.99, 3).unwrap();
            let sets = sets_for(&plan);
            let mut c = [0u32; 6];
            for op in plan.stream(0, &sets) {
                let i = match op {
                    Op::Read(_) => 0,
                    Op::Update { .. } => 1,
                    Op::Insert { .. } => 2,
                    Op::Scan { .. } => 3,
                    Op::ReadModifyWrite { .. } => 4,
                    Op::Delete { .. } => 5,
                };
                c[i] += 1;
            }
            let m = w.mix();
            let want = [m.read, m.update, m.insert, m.scan, m.rmw, m.delete];
            for (got, want) in c.iter().zip(want) {
                let got = f64::from(*got) / 20_000.0 * 100.0;
                assert!((got - f64::from(want)).abs() < 1.5, "{w}: {c:?}");
            }
        }
    }

    #[test]
    fn latest_prefers_recent_inserts() {
        let plan = Plan::new(Workload::D, 20_000, 1, 0.99, 5).unwrap();
        let sets = plan.split(keyset(100_000), Start::Loaded).unwrap();
        let own: HashSet<u64> = sets.inserts[0].iter().copied().collect();
        let reads: Vec<u64> = plan
            .stream(0, &sets)
            .filter_map(|op| match op {
                Op::Read(k) => Some(k),
                _ => None,
            })
            .collect();
        // ~1000 inserted keys among ~80,000 loaded: a uniform pick would
        // hit them ~1% of the time; "latest" hits them most of the time.
        let hits = reads.iter().filter(|k| own.contains(k)).count();
        assert!(hits * 2 > reads.len(), "{hits} of {}", reads.len());
    }

    #[test]
    fn scrambled_zipfian_spreads_the_hot_keys() {
        // The hottest keys are not the smallest ones (scrambled), and the
        // head is hot: the 10 most frequent keys take a sizeable share.
        let plan = Plan::new(Workload::C, 50_000, 1, 0.99, 9).unwrap();
        let sets = plan.split(keyset(100_000), Start::Loaded).unwrap();
        let mut freq: HashMap<u64, u32> = HashMap::new();
        for op in plan.stream(0, &sets) {
            let Op::Read(k) = op else {
                panic!("C is read-only")
            };
            *freq.entry(k).or_default() += 1;
        }
        let mut by: Vec<(u32, u64)> = freq.into_iter().map(|(k, c)| (c, k)).collect();
        by.sort_unstable_by(|a, b| b.cmp(a));
        let top10: u32 = by.iter().take(10).map(|x| x.0).sum();
        assert!(top10 > 5_000, "top 10 keys got {top10} of 50000");
        let max_key = *sets.loaded.last().unwrap();
        assert!(by.iter().take(10).any(|&(_, k)| k > max_key / 2));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Every stream: deterministic per (seed, thread); reads, updates
        /// and deletes name present keys; inserts name fresh keys, distinct
        /// over all threads, and each thread uses exactly its planned
        /// inserts and deletes; no key is deleted twice, over all threads;
        /// scans are 1..=100 long; written values are unique.
        #[test]
        fn streams_keep_their_invariants(
            w in proptest::sample::select(ALL.to_vec()),
            ops in 1u64..600,
            threads in 1usize..4,
            seed in any::<u64>(),
            theta in 0.01f64..0.999,
        ) {
            let plan = Plan::new(w, ops, threads, theta, seed).unwrap();
            let sets = plan.split(keyset(1000 + ops), Start::Loaded).unwrap();
            let loaded: HashSet<u64> = sets.loaded.iter().copied().collect();
            prop_assert_eq!(loaded.len() as u64 + plan.held_out(Start::Loaded), 1000 + ops);
            let mut all_inserted = HashSet::new();
            let mut all_deleted = HashSet::new();
            let mut values = HashSet::new();
            let mut total = 0;
            for t in 0..threads {
                let a: Vec<Op> = plan.stream(t, &sets).collect();
                let b: Vec<Op> = plan.stream(t, &sets).collect();
                prop_assert_eq!(&a, &b);
                prop_assert_eq!(a.len() as u64, plan.ops_of(t));
                total += a.len() as u64;
                let mut mine = HashSet::new();
                let (mut n_ins, mut n_del) = (0, 0);
                for op in a {
                    let present = |k: &u64| {
                        (loaded.contains(k) || mine.contains(k)) && !all_deleted.contains(k)
                    };
                    match op {
                        Op::Read(k) => prop_assert!(present(&k)),
                        Op::Update { key, value } | Op::ReadModifyWrite { key, value } => {
                            prop_assert!(present(&key));
                            prop_assert!(values.insert(value));
                        }
                        Op::Scan { from, len } => {
                            prop_assert!(present(&from));
                            prop_assert!((1..=MAX_SCAN_LEN).contains(&len));
                        }
                        Op::Insert { key, value } => {
                            prop_assert!(!present(&key));
                            prop_assert!(all_inserted.insert(key));
                            prop_assert!(values.insert(value));
                            prop_assert!(value != load_value(key));
                            mine.insert(key);
                            n_ins += 1;
                        }
                        Op::Delete { key } => {
                            prop_assert!(present(&key));
                            all_deleted.insert(key);
                            n_del += 1;
                        }
                    }
                }
                prop_assert_eq!(n_ins, plan.inserts_of(t));
                prop_assert_eq!(n_del, plan.deletes_of(t));
            }
            prop_assert_eq!(total, ops);
        }
    }

    /// Each thread's operations of `plan` over `sets`.
    fn streams(plan: &Plan, sets: &KeySets) -> Vec<Vec<Op>> {
        (0..plan.threads())
            .map(|t| plan.stream(t, sets).collect())
            .collect()
    }

    #[test]
    fn append_keys_rise_above_the_loaded_max_round_robin() {
        let plan = Plan::new(Workload::Append, 1001, 2, 0.99, 4).unwrap();
        assert_eq!(plan.held_out(Start::Loaded), 0);
        let sets = plan.split(keyset(5000), Start::Loaded).unwrap();
        assert_eq!(sets.loaded, keyset(5000), "append loads every key");
        let max = *sets.loaded.last().unwrap();
        let s = streams(&plan, &sets);
        let key = |op: &Op| match op {
            Op::Insert { key, .. } => *key,
            other => panic!("append only inserts: {other:?}"),
        };
        // Op j of every thread, thread by thread: the run's key order.
        let mut run = Vec::new();
        for j in 0..s[0].len() {
            run.extend(s.iter().filter_map(|ops| ops.get(j)).map(key));
        }
        assert_eq!(run.len(), 1001);
        assert!(run[0] > max);
        // Spaced by the loaded keys' mean gap (7), increasing.
        assert!(run.windows(2).all(|w| w[1] - w[0] == 7), "{:?}", &run[..4]);
        // Too close to 2^64: the gap shrinks to fit, or the run is refused.
        let near = vec![0, u64::MAX - 2000];
        let sets = plan.split(near.clone(), Start::Loaded).unwrap();
        let all: Vec<u64> = sets.inserts.concat();
        assert!(all.iter().all(|&k| k > u64::MAX - 2000));
        assert_eq!(
            plan.split(vec![0, u64::MAX - 1000], Start::Loaded)
                .unwrap_err(),
            YcsbError::NoRoomAbove {
                max: u64::MAX - 1000,
                inserts: 1001
            }
        );
    }

    #[test]
    fn an_empty_start_inserts_every_key_and_only_for_inserting_workloads() {
        for w in [Workload::InsertOnly, Workload::Append] {
            let plan = Plan::new(w, 500, 2, 0.99, 8).unwrap();
            assert_eq!(plan.held_out(Start::Empty), 500);
            let sets = plan.split(keyset(500), Start::Empty).unwrap();
            assert!(sets.loaded.is_empty() && sets.order.is_empty());
            let mut all: Vec<u64> = sets.inserts.concat();
            if w == Workload::Append {
                // Dealt in increasing order, round-robin.
                assert_eq!(sets.inserts[0][..3], [3, 17, 31]);
                assert_eq!(sets.inserts[1][..3], [10, 24, 38]);
            }
            all.sort_unstable();
            assert_eq!(all, keyset(500), "{w}");
            assert_eq!(streams(&plan, &sets).concat().len(), 500);
        }
        for w in [
            Workload::A,
            Workload::D,
            Workload::Churn,
            Workload::DeleteOnly,
        ] {
            let plan = Plan::new(w, 100, 2, 0.99, 8).unwrap();
            assert_eq!(
                plan.split(keyset(1000), Start::Empty).unwrap_err(),
                YcsbError::NeedsLoadedKeys(w)
            );
            assert!(!w.can_start_empty());
        }
    }

    #[test]
    fn churn_keeps_the_live_count_and_deletes_each_key_once() {
        // Few loaded keys: the threads run out of their shares and go on
        // with their own inserts, first in first out.
        for (n, ops) in [(2000u64, 2000u64), (9, 2001)] {
            let plan = Plan::new(Workload::Churn, ops, 3, 0.99, 2).unwrap();
            let keys = keyset(n + plan.held_out(Start::Loaded));
            let sets = plan.split(keys, Start::Loaded).unwrap();
            assert_eq!(sets.loaded.len() as u64, n);
            let loaded: HashSet<u64> = sets.loaded.iter().copied().collect();
            let mut deleted = HashSet::new();
            for (t, ops) in streams(&plan, &sets).into_iter().enumerate() {
                let share: Vec<u64> = sets.order[sets.deletes[t].clone()].to_vec();
                let mut live: i64 = 0;
                let mut fifo = std::collections::VecDeque::new();
                let mut from_share = 0;
                for (j, op) in ops.iter().enumerate() {
                    match *op {
                        Op::Insert { key, .. } => {
                            assert_eq!(j % 2, 0, "insert first, then by turns");
                            assert!(!loaded.contains(&key));
                            fifo.push_back(key);
                            live += 1;
                        }
                        Op::Delete { key } => {
                            assert!(deleted.insert(key), "{key} deleted twice");
                            let want = match share.get(from_share) {
                                Some(&k) => {
                                    from_share += 1;
                                    k
                                }
                                None => fifo.pop_front().expect("an inserted key"),
                            };
                            assert_eq!(key, want, "share in load order, then FIFO");
                            live -= 1;
                        }
                        other => panic!("churn only inserts and deletes: {other:?}"),
                    }
                    assert!((0..=1).contains(&live), "live keys stay constant");
                }
            }
            assert_eq!(deleted.len() as u64, plan.total_deletes());
            // Each thread ends one above where it started after an odd
            // number of operations, even otherwise.
            let odd = (0..3).filter(|&t| plan.ops_of(t) % 2 == 1).count() as u64;
            assert_eq!(plan.total_inserts() - plan.total_deletes(), odd);
        }
    }

    #[test]
    fn delete_only_shares_the_loaded_keys_out() {
        let plan = Plan::new(Workload::DeleteOnly, 999, 2, 0.99, 6).unwrap();
        assert_eq!(plan.held_out(Start::Loaded), 0);
        let sets = plan.split(keyset(1000), Start::Loaded).unwrap();
        let s = streams(&plan, &sets);
        let mut seen = HashSet::new();
        for (t, ops) in s.iter().enumerate() {
            for op in ops {
                let Op::Delete { key } = *op else {
                    panic!("delete-only: {op:?}")
                };
                assert!(sets.order[sets.deletes[t].clone()].contains(&key));
                assert!(seen.insert(key), "{key} deleted twice");
            }
        }
        assert_eq!(seen.len(), 999);
        assert!(seen.iter().all(|k| sets.loaded.binary_search(k).is_ok()));
        // Every loaded key at most, on both splits.
        let all = Plan::new(Workload::DeleteOnly, 1000, 3, 0.99, 6).unwrap();
        assert!(all.split(keyset(1000), Start::Loaded).is_ok());
        let more = Plan::new(Workload::DeleteOnly, 1001, 3, 0.99, 6).unwrap();
        let err = YcsbError::TooFewToDelete {
            loaded: 1000,
            deletes: 1001,
        };
        assert_eq!(more.split(keyset(1000), Start::Loaded).unwrap_err(), err);
        assert_eq!(more.split_fresh(keyset(1000), None).unwrap_err(), err);
    }

    #[test]
    fn fresh_keys_beyond_the_gaps_are_drawn_and_the_same_everywhere() {
        // 100 loaded keys have 99 gaps; 500 inserts need drawn keys.
        let loaded = keyset(100);
        let plan = Plan::new(Workload::InsertOnly, 500, 2, 0.99, 3).unwrap();
        assert!(plan.needs_drawn_keys(&loaded));
        assert!(matches!(
            plan.split_fresh(loaded.clone(), None),
            Err(YcsbError::TooFewGaps {
                gaps: 99,
                inserts: 500
            })
        ));
        // Drawn keys overlapping the loaded ones: those are left out.
        let drawn: Vec<u64> = (0..600u64).map(|i| i * 3).collect();
        let a = plan
            .split_fresh(loaded.clone(), Some(drawn.clone()))
            .unwrap();
        let b = plan
            .split_fresh(loaded.clone(), Some(drawn.clone()))
            .unwrap();
        assert_eq!(a.inserts, b.inserts);
        let mut all = a.inserts.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 500);
        assert!(all
            .iter()
            .all(|k| drawn.contains(k) && loaded.binary_search(k).is_err()));
        assert!(matches!(
            plan.split_fresh(loaded.clone(), Some(drawn[..400].to_vec())),
            Err(YcsbError::TooFewGaps { .. })
        ));
        // Append needs no gaps: its keys go above the range.
        let append = Plan::new(Workload::Append, 500, 2, 0.99, 3).unwrap();
        assert!(!append.needs_drawn_keys(&loaded));
        let sets = append.split_fresh(loaded.clone(), None).unwrap();
        assert!(sets.inserts.concat().iter().all(|&k| k > loaded[99]));
        // Few inserts still come from the gaps.
        let few = Plan::new(Workload::InsertOnly, 50, 2, 0.99, 3).unwrap();
        assert!(!few.needs_drawn_keys(&loaded));
    }

    #[test]
    fn values_never_collide_with_load_values() {
        for t in [0usize, 1, 1000] {
            for s in [1u64, 2, (1 << 40) - 1] {
                let v = write_value(t, s);
                assert!(v >= 1 << VALUE_SEQ_BITS && v >> 63 == 0);
                assert_eq!(writer_of(v), Some((t, s)));
            }
        }
        for k in [0u64, 1, u64::MAX, 12345] {
            let v = load_value(k);
            assert!(v != 0 && v < 1 << VALUE_SEQ_BITS);
            assert_eq!(writer_of(v), None);
        }
    }
}
