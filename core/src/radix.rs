//! A radix table over sorted keys: the O(1) first step of a lookup.
//!
//! A lookup in a sorted list of keys (the models' first keys of a
//! locator) asks for the last key `≤` a probe. A binary search does that in
//! `log n` dependent, unpredictable steps; a [`RadixTable`] (after the
//! radix layer of RadixSpline, Kipf et al., aiDM 2020) does it with a few
//! bit operations and two table reads, then searches only the keys that
//! share the probe's bucket.
//!
//! # Buckets
//!
//! A key's bucket comes from its distance `d = key − first` to the list's
//! first key, read like a floating-point number: the position `e` of its
//! highest set bit and the `m` bits below it. Buckets are numbered
//! `1 + (e − e_min) · 2^m + mantissa` (bucket 0 is `d = 0`), which is
//! monotone in the key, so keys in lower buckets are smaller than the
//! probe, keys in higher buckets larger, and the answer lies among the keys
//! of the probe's own bucket: `starts[b] .. starts[b + 1]`, where
//! `starts[b]` counts the keys in buckets below `b`. Each power of two of
//! distance gets `2^m` buckets, so keys crowded near the first one (a
//! lognormal key set's models) are split as finely as keys spread over
//! the whole range, which equal-width buckets cannot do in bounded space.
//! `m` grows from about two buckets per key until no bucket holds more than
//! a few keys or the table reaches 2^16 buckets; past that some ranges stay
//! longer (searched by binary search): slower, never wrong.
//!
//! The table is built on the host from a list the caller keeps (nothing of
//! it is in the pool) and never changes; a new list needs a new table.

use alloc::vec::Vec;
use core::ops::Range;

/// Buckets per key a table starts from.
const BUCKETS_PER_KEY: usize = 2;

/// Most keys a table lets one bucket hold while it may still grow.
const MAX_PER_BUCKET: u32 = 4;

/// Most buckets a table has (256 KiB of `u32`), whatever the list.
const MAX_BUCKETS: usize = 1 << 16;

/// A radix table over a sorted list of keys (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RadixTable {
    /// The list's first key (bucket 0).
    first: u64,
    /// The highest bit of the smallest nonzero distance to `first` (the
    /// first octave the table splits).
    e_min: u32,
    /// Mantissa bits per octave.
    m: u32,
    /// The last bucket (a key past the last octave is clamped to it).
    last: usize,
    /// `starts[b]`: keys in buckets below `b`; one entry per bucket and
    /// one more, the list's length.
    starts: Vec<u32>,
}

impl RadixTable {
    /// The table over `keys` (ascending; equal neighbours are allowed). A
    /// list longer than `u32::MAX` keys is indexed as if it ended there
    /// (no list of this crate comes near).
    pub fn new(keys: &[u64]) -> Self {
        let n = keys.len().min(u32::MAX as usize);
        let keys = &keys[..n];
        let first = keys.first().copied().unwrap_or(0);
        let highest = |d: u64| u64::BITS - 1 - d.leading_zeros();
        let nonzero = keys.iter().map(|&k| k - first).filter(|&d| d > 0);
        let (e_min, e_max) = match (nonzero.clone().next(), keys.last()) {
            (Some(lo), Some(&hi)) => (highest(lo), highest(hi - first)),
            _ => (0, 0),
        };
        let octaves = (e_max - e_min + 1) as usize;
        // About two buckets per key to start with, within the cap.
        let mut m = 0u32;
        while (octaves << (m + 1)) < MAX_BUCKETS
            && (octaves << m) < n.saturating_mul(BUCKETS_PER_KEY)
        {
            m += 1;
        }
        loop {
            let t = Self::cut(keys, first, e_min, e_max, m);
            let crowded = t.starts.windows(2).any(|w| w[1] - w[0] > MAX_PER_BUCKET);
            if !crowded || (octaves << (m + 1)) >= MAX_BUCKETS {
                return t;
            }
            m += 1;
        }
    }

    /// The table with `m` mantissa bits over `keys` (ascending, from
    /// `first`, distances' highest bits from `e_min` to `e_max`).
    fn cut(keys: &[u64], first: u64, e_min: u32, e_max: u32, m: u32) -> Self {
        let buckets = 1 + (((e_max - e_min + 1) as usize) << m);
        let mut t = Self {
            first,
            e_min,
            m,
            last: buckets - 1,
            starts: Vec::new(),
        };
        t.starts.reserve(buckets + 1);
        let mut i = 0usize;
        for b in 0..buckets {
            // Keys whose bucket is below `b`.
            while i < keys.len() && t.bucket(keys[i]) < b {
                i += 1;
            }
            t.starts.push(i as u32);
        }
        t.starts.push(keys.len() as u32);
        t
    }

    /// The bucket of `key` (at least `first`), clamped to the table.
    fn bucket(&self, key: u64) -> usize {
        let d = key - self.first;
        if d == 0 {
            return 0;
        }
        let e = u64::BITS - 1 - d.leading_zeros();
        if e < self.e_min {
            // Below every key but the first: the first octave's first
            // bucket holds no smaller key.
            return 1;
        }
        // The `m` bits below the highest (zeros shifted in when `e < m`).
        let mask = (1u64 << self.m) - 1;
        let mantissa = if e >= self.m {
            (d >> (e - self.m)) & mask
        } else {
            (d << (self.m - e)) & mask
        };
        let b = 1 + (((e - self.e_min) as usize) << self.m) + mantissa as usize;
        b.min(self.last)
    }

    /// The indices among which the last key `≤ key` lies, if any key is:
    /// every key before the range is `< key` and every key after it
    /// `> key`. Find the answer with [`Self::last_at_most`] or by searching
    /// the range: the answer is the range's start plus the number of its
    /// keys `≤ key`, minus one (none: no key is `≤ key`).
    pub fn range(&self, key: u64) -> Range<usize> {
        if key < self.first || self.starts.len() < 2 {
            return 0..0;
        }
        let b = self.bucket(key);
        self.starts[b] as usize..self.starts[b + 1] as usize
    }

    /// The index of the last of `keys` (the list the table was built
    /// over) that is `≤ key`, or 0 when none is (the convention of the
    /// callers: entry 0 owns everything below its key).
    pub fn last_at_most(&self, keys: &[u64], key: u64) -> usize {
        let r = self.range(key);
        let start = r.start;
        let within = keys.get(r).map_or(0, |w| w.partition_point(|&k| k <= key));
        (start + within).saturating_sub(1)
    }

    /// Bytes the table holds.
    pub fn bytes(&self) -> u64 {
        self.starts.len() as u64 * 4 + 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn want(keys: &[u64], key: u64) -> usize {
        keys.partition_point(|&k| k <= key).saturating_sub(1)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The table's answer is the binary search's, for keys of any
        /// spread, at and around every key and at the ends.
        #[test]
        fn matches_binary_search(
            keys in proptest::collection::btree_set(any::<u64>(), 1..2000),
            skew in 0u32..60,
            probes in proptest::collection::vec(any::<u64>(), 0..50),
        ) {
            // `skew` squeezes the keys towards 0 so that most buckets are
            // empty and a few crowded.
            let keys: Vec<u64> = keys.into_iter().map(|k| k >> skew).collect();
            let mut keys = keys;
            keys.dedup();
            let t = RadixTable::new(&keys);
            let mut all = vec![0, 1, u64::MAX, u64::MAX - 1];
            for &k in &keys {
                all.extend([k, k.wrapping_sub(1), k.wrapping_add(1)]);
            }
            all.extend(probes);
            for key in all {
                prop_assert_eq!(t.last_at_most(&keys, key), want(&keys, key), "key {}", key);
                let r = t.range(key);
                prop_assert!(keys[..r.start].iter().all(|&k| k < key));
                prop_assert!(keys[r.end..].iter().all(|&k| k > key));
            }
        }
    }

    #[test]
    fn empty_single_and_equal_lists() {
        let t = RadixTable::new(&[]);
        assert_eq!(t.last_at_most(&[], 5), 0);
        assert_eq!(t.range(5), 0..0);
        let t = RadixTable::new(&[7]);
        assert_eq!(t.last_at_most(&[7], 3), 0);
        assert_eq!(t.last_at_most(&[7], 7), 0);
        assert_eq!(t.last_at_most(&[7], u64::MAX), 0);
        let keys = [0, u64::MAX];
        let t = RadixTable::new(&keys);
        assert_eq!(t.last_at_most(&keys, u64::MAX - 1), 0);
        assert_eq!(t.last_at_most(&keys, u64::MAX), 1);
        let keys = [4, 4, 9];
        let t = RadixTable::new(&keys);
        assert_eq!(t.last_at_most(&keys, 4), 1);
        assert_eq!(t.last_at_most(&keys, 8), 1);
        assert_eq!(t.last_at_most(&keys, 9), 2);
    }

    #[test]
    fn skewed_keys_get_more_buckets() {
        // Most keys crowded near 0, a few spread up to 2^60.
        let mut keys: Vec<u64> = (0..500u64).map(|i| i * 1000).collect();
        keys.extend((1..10u64).map(|i| i << 56));
        let t = RadixTable::new(&keys);
        let longest = keys.iter().map(|&k| t.range(k).len()).max().unwrap_or(0);
        assert!(longest <= MAX_PER_BUCKET as usize, "{longest}");
        for &k in &keys {
            assert_eq!(t.last_at_most(&keys, k), want(&keys, k));
        }
    }

    #[test]
    fn evenly_spread_keys_get_short_ranges() {
        let keys: Vec<u64> = (0..1000u64).map(|i| i * 1_000_003).collect();
        let t = RadixTable::new(&keys);
        let longest = (0..keys.len())
            .map(|i| t.range(keys[i]).len())
            .max()
            .unwrap_or(0);
        assert!(longest <= MAX_PER_BUCKET as usize, "{longest}");
        // About two buckets per key (ten octaves of 256 here).
        assert!(t.bytes() <= 4 * 4000, "{}", t.bytes());
    }
}
