//! YCSB core workloads for `rolex bench`: operation mixes, request key
//! distributions and the split of a key set into loaded and inserted keys.
//!
//! Everything here is pure and deterministic: the operations of thread `t`
//! depend only on `(workload, θ, seed, t, its op count)` and the key set,
//! never on timing or on what other threads do. Two invariants hold for
//! every stream: a read, update, read-modify-write or scan start names a key
//! that is present when the stream issues it (a loaded key or one this
//! thread already inserted; YCSB workloads never delete), and an insert
//! names a key that no one has loaded or inserted, taken from the same
//! distribution as the data set (held out of it before the load), so the
//! store's key distribution keeps its shape as it grows.
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
        }
    }

    /// The operation mix (YCSB's `workloads/workload[a-f]`).
    pub fn mix(self) -> Mix {
        let m = |read, update, insert, scan, rmw| Mix {
            read,
            update,
            insert,
            scan,
            rmw,
        };
        match self {
            Workload::A => m(50, 50, 0, 0, 0),
            Workload::B => m(95, 5, 0, 0, 0),
            Workload::C => m(100, 0, 0, 0, 0),
            Workload::D => m(95, 0, 5, 0, 0),
            Workload::E => m(0, 0, 5, 95, 0),
            Workload::F => m(50, 0, 0, 0, 50),
            Workload::InsertOnly => m(0, 0, 100, 0, 0),
            Workload::UpdateOnly => m(0, 100, 0, 0, 0),
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
                 inserts {inserts}: run fewer inserts"
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
/// each thread makes (known before the load, so the inserted keys can be
/// held out of it).
#[derive(Clone, Debug)]
pub struct Plan {
    workload: Workload,
    theta: f64,
    seed: u64,
    ops: Vec<u64>,
    inserts: Vec<u64>,
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
        let mix = workload.mix();
        let inserts = per
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                if mix.insert == 0 {
                    return 0;
                }
                if mix.insert == 100 {
                    return n;
                }
                let mut rng = thread_rng(seed, i, STREAM_KIND);
                (0..n)
                    .filter(|_| draw_kind(&mix, &mut rng) == Kind::Insert)
                    .count() as u64
            })
            .collect();
        Ok(Plan {
            workload,
            theta,
            seed,
            ops: per,
            inserts,
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

    /// Inserts of the whole run: the keys to hold out of the load.
    pub fn total_inserts(&self) -> u64 {
        self.inserts.iter().sum()
    }

    /// Splits a strictly increasing key set into the keys to load and each
    /// thread's keys to insert. The held-out keys are a uniform random
    /// sample (per seed), so they follow the data set's distribution.
    pub fn split(&self, keys: Vec<u64>) -> Result<KeySets, YcsbError> {
        check_sorted(&keys)?;
        let total = self.total_inserts();
        if total >= keys.len() as u64 {
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
        let loaded: Vec<u64> = keys
            .iter()
            .zip(&is_held)
            .filter(|(_, &h)| !h)
            .map(|(&k, _)| k)
            .collect();
        Ok(self.assemble(loaded, &held_keys, &mut rng))
    }

    /// For a run against a memory node that loaded the whole strictly
    /// increasing key set `loaded`: the keys to insert are new keys in its
    /// gaps — the midpoints of a uniform random sample (per seed) of the
    /// gaps wider than one — so every process of the run derives the same
    /// ones, they follow the data set's distribution, and none is loaded.
    /// (The seed is the data set's too, so a second run that writes into
    /// the same memory node finds the first run's keys and values: give
    /// each writing run a fresh memory node.)
    pub fn split_fresh(&self, loaded: Vec<u64>) -> Result<KeySets, YcsbError> {
        check_sorted(&loaded)?;
        let total = self.total_inserts();
        let wide: Vec<u64> = loaded
            .windows(2)
            .filter(|w| w[1] - w[0] >= 2)
            .map(|w| w[0] + (w[1] - w[0]) / 2)
            .collect();
        if total > wide.len() as u64 {
            return Err(YcsbError::TooFewGaps {
                gaps: wide.len(),
                inserts: total,
            });
        }
        let mut rng = self.split_rng();
        let held_keys: Vec<u64> = rand::seq::index::sample(&mut rng, wide.len(), total as usize)
            .iter()
            .map(|i| wide[i])
            .collect();
        Ok(self.assemble(loaded, &held_keys, &mut rng))
    }

    fn split_rng(&self) -> ChaCha8Rng {
        ChaCha8Rng::seed_from_u64(self.seed ^ 0x5851_f42d_4c95_7f2d)
    }

    /// The key sets from what is loaded and the keys to insert, dealt to
    /// the threads in order.
    fn assemble(&self, loaded: Vec<u64>, held: &[u64], rng: &mut ChaCha8Rng) -> KeySets {
        let mut order = loaded.clone();
        order.shuffle(rng);
        let mut inserts = Vec::with_capacity(self.threads());
        let mut rest = held;
        for &n in &self.inserts {
            let (mine, tail) = rest.split_at(n as usize);
            inserts.push(mine.to_vec());
            rest = tail;
        }
        KeySets {
            loaded,
            order: order.into(),
            inserts,
        }
    }

    /// The operation stream of `thread`, which inserts `inserts` (its share
    /// from [`KeySets::inserts`], in that order).
    pub fn stream(&self, thread: usize, sets: &KeySets) -> OpStream {
        let mix = self.workload.mix();
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
            mix,
            thread,
            left: self.ops[thread],
            seq: 0,
            kind_rng: thread_rng(self.seed, thread, STREAM_KIND),
            key_rng: thread_rng(self.seed, thread, STREAM_KEY),
            zipf: self.zipf.clone(),
            latest,
            order: Arc::clone(&sets.order),
            items: loaded + own.len() as u64,
            own,
            inserted: 0,
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
}

/// The operations of one thread, generated on the fly.
#[derive(Clone, Debug)]
pub struct OpStream {
    mix: Mix,
    thread: usize,
    left: u64,
    seq: u64,
    kind_rng: ChaCha8Rng,
    key_rng: ChaCha8Rng,
    zipf: ScrambledZipfian,
    latest: Option<Zipfian>,
    order: Arc<[u64]>,
    /// Loaded keys + this thread's inserts over the whole run: the range of
    /// the scrambled zipfian, sized once as YCSB sizes it for expected keys.
    items: u64,
    own: Vec<u64>,
    inserted: usize,
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
        let op = match draw_kind(&self.mix, &mut self.kind_rng) {
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

    const ALL: [Workload; 8] = [
        Workload::A,
        Workload::B,
        Workload::C,
        Workload::D,
        Workload::E,
        Workload::F,
        Workload::InsertOnly,
        Workload::UpdateOnly,
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
                    + u32::from(m.rmw),
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
            plan.split(keyset(10)),
            Err(YcsbError::TooFewKeys { .. })
        ));
        assert_eq!(
            plan.split(vec![1, 2, 2, 3]).unwrap_err(),
            YcsbError::Unsorted {
                index: 2,
                key: 2,
                previous: 2
            }
        );
        let sets = plan.split(keyset(11)).unwrap();
        assert_eq!(sets.loaded.len(), 1);
        assert_eq!(sets.inserts[0].len() + sets.inserts[1].len(), 10);
    }

    #[test]
    fn fresh_keys_are_new_in_the_gaps_the_same_everywhere_and_bounded() {
        let plan = Plan::new(Workload::D, 2000, 4, 0.99, 9).unwrap();
        let total = plan.total_inserts() as usize;
        assert!(total > 0);
        let loaded: Vec<u64> = (0..10_000u64).map(|i| i * i + 3 * i).collect();
        let a = plan.split_fresh(loaded.clone()).unwrap();
        let b = plan.split_fresh(loaded.clone()).unwrap();
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
            plan.split_fresh((0..10_000).collect()),
            Err(YcsbError::TooFewGaps { gaps: 0, .. })
        ));
        assert_eq!(
            plan.split_fresh(vec![5, 1]).unwrap_err(),
            YcsbError::Unsorted {
                index: 1,
                key: 1,
                previous: 5
            }
        );
    }

    #[test]
    fn mix_shares_are_respected() {
        let sets_for = |plan: &Plan| plan.split(keyset(50_000)).unwrap();
        for w in ALL {
            let plan = Plan::new(w, 20_000, 1, 0.99, 3).unwrap();
            let sets = sets_for(&plan);
            let mut c = [0u32; 5];
            for op in plan.stream(0, &sets) {
                let i = match op {
                    Op::Read(_) => 0,
                    Op::Update { .. } => 1,
                    Op::Insert { .. } => 2,
                    Op::Scan { .. } => 3,
                    Op::ReadModifyWrite { .. } => 4,
                };
                c[i] += 1;
            }
            let m = w.mix();
            for (got, want) in c.iter().zip([m.read, m.update, m.insert, m.scan, m.rmw]) {
                let got = f64::from(*got) / 20_000.0 * 100.0;
                assert!((got - f64::from(want)).abs() < 1.5, "{w}: {c:?}");
            }
        }
    }

    #[test]
    fn latest_prefers_recent_inserts() {
        let plan = Plan::new(Workload::D, 20_000, 1, 0.99, 5).unwrap();
        let sets = plan.split(keyset(100_000)).unwrap();
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
        let sets = plan.split(keyset(100_000)).unwrap();
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

        /// Every stream: deterministic per (seed, thread); reads and updates
        /// name present keys; inserts name fresh keys, distinct over all
        /// threads, and each thread uses exactly its planned inserts; scans
        /// are 1..=100 long; written values are unique.
        #[test]
        fn streams_keep_their_invariants(
            w in proptest::sample::select(ALL.to_vec()),
            ops in 1u64..600,
            threads in 1usize..4,
            seed in any::<u64>(),
            theta in 0.01f64..0.999,
        ) {
            let plan = Plan::new(w, ops, threads, theta, seed).unwrap();
            let sets = plan.split(keyset(1000 + ops)).unwrap();
            let loaded: HashSet<u64> = sets.loaded.iter().copied().collect();
            prop_assert_eq!(loaded.len() as u64 + plan.total_inserts(), 1000 + ops);
            let mut all_inserted = HashSet::new();
            let mut values = HashSet::new();
            let mut total = 0;
            for t in 0..threads {
                let a: Vec<Op> = plan.stream(t, &sets).collect();
                let b: Vec<Op> = plan.stream(t, &sets).collect();
                prop_assert_eq!(&a, &b);
                prop_assert_eq!(a.len() as u64, plan.ops_of(t));
                total += a.len() as u64;
                let mut mine = HashSet::new();
                let mut n_ins = 0;
                for op in a {
                    let present = |k: &u64| loaded.contains(k) || mine.contains(k);
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
                    }
                }
                prop_assert_eq!(n_ins, plan.inserts_of(t));
            }
            prop_assert_eq!(total, ops);
        }
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
