//! A radix table over sorted keys: the O(1) first step of a lookup.
//!
//! A learned lookup starts by finding which of a sorted list of keys (the
//! segments' first keys of a model, the models' first keys of a locator)
//! is the last one `≤` a key. A binary search does that in `log n`
//! dependent, unpredictable steps; a [`RadixTable`] (the radix layer of
//! RadixSpline, Kipf et al., aiDM 2020) does it with one shift and two
//! table reads, then searches only the keys that share the key's bucket.
//!
//! The table cuts `[first key, last key]` into `2^b` buckets of equal
//! width, a power of two, so a key's bucket is `(key − first) >> shift`;
//! `starts[i]` is the number of keys in buckets below `i`. Keys in lower
//! buckets are smaller than the key, keys in higher buckets larger, so the
//! answer lies among the keys of its own bucket: `starts[i] ..
//! starts[i + 1]`. With about two buckets per key that range holds one key
//! or none on keys spread evenly; a skewed list only makes some ranges
//! longer (the search within them is a binary search), never wrong.
//!
//! The table is built on the host from a list the caller keeps (nothing of
//! it is in the pool) and never changes; a new list needs a new table.

use alloc::vec::Vec;
use core::ops::Range;

/// Buckets per key a table aims for (rounded up to a power of two).
const BUCKETS_PER_KEY: usize = 2;

/// Most buckets a table has: 2^16 (256 KiB of `u32`), whatever the list.
const MAX_BITS: u32 = 16;

/// A radix table over a sorted list of keys (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RadixTable {
    /// The list's first key (bucket 0 starts there).
    first: u64,
    /// A key's bucket is `(key − first) >> shift`.
    shift: u32,
    /// `starts[i]`: keys in buckets below `i`; `2^b + 1` entries, the last
    /// the list's length.
    starts: Vec<u32>,
}

impl RadixTable {
    /// The table over `keys` (ascending; equal neighbours are allowed). A
    /// list longer than `u32::MAX` keys is indexed as if it ended there
    /// (no list of this crate comes near).
    pub fn new(keys: &[u64]) -> Self {
        let n = keys.len().min(u32::MAX as usize);
        let keys = &keys[..n];
        let (first, last) = match (keys.first(), keys.last()) {
            (Some(&f), Some(&l)) => (f, l.max(f)),
            _ => (0, 0),
        };
        let bits = n
            .saturating_mul(BUCKETS_PER_KEY)
            .next_power_of_two()
            .trailing_zeros()
            .min(MAX_BITS);
        // The smallest shift that maps `last − first` to a bucket below
        // 2^bits.
        let span_bits = u64::BITS - (last - first).leading_zeros();
        let shift = span_bits.saturating_sub(bits);
        let buckets = 1usize << bits;
        let mut starts = Vec::with_capacity(buckets + 1);
        let mut i = 0usize;
        for b in 0..buckets {
            // Keys whose bucket is below `b`.
            while i < n && ((keys[i] - first) >> shift) < b as u64 {
                i += 1;
            }
            starts.push(i as u32);
        }
        starts.push(n as u32);
        Self {
            first,
            shift,
            starts,
        }
    }

    /// The indices among which the last key `≤ key` lies, if any key is:
    /// every key before the range is `< key` and every key after it
    /// `> key`. Find the answer with [`Self::last_at_most`] or by searching
    /// the range: the answer is the range's start plus the number of its
    /// keys `≤ key`, minus one (none: no key is `≤ key`).
    pub fn range(&self, key: u64) -> Range<usize> {
        if key < self.first {
            return 0..0;
        }
        let last = self.starts.len() - 2;
        let b = (((key - self.first) >> self.shift) as usize).min(last);
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
    fn evenly_spread_keys_get_short_ranges() {
        let keys: Vec<u64> = (0..1000u64).map(|i| i * 1_000_003).collect();
        let t = RadixTable::new(&keys);
        let longest = (0..keys.len())
            .map(|i| t.range(keys[i]).len())
            .max()
            .unwrap_or(0);
        assert!(longest <= 2, "{longest}");
        assert!(t.bytes() <= 2049 * 4 + 16);
    }
}
