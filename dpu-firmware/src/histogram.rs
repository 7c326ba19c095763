//! [`Histogram`]: a fixed-size log-linear histogram of nanosecond times
//! (the agent's model freeze times), cheap enough to update on every
//! retraining and `Copy` so it travels inside [`crate::AgentStats`].
//!
//! Buckets: values below 16 have one bucket each; above, every power of
//! two is cut into 8 equal sub-buckets, so a reported quantile is at most
//! 12.5 % above the true value. Values of 2^40 ns (18 minutes) and more
//! share the last bucket. The exact maximum is kept beside the buckets.

/// Exponents above this share the last bucket.
const MAX_EXP: u32 = 40;
/// Buckets: 16 exact, then 8 per power of two from 2^4 to 2^MAX_EXP.
const BUCKETS: usize = 16 + 8 * (MAX_EXP as usize - 3);

/// A log-linear histogram of `u64` values (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Histogram {
    counts: [u32; BUCKETS],
    total: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
            total: 0,
            max: 0,
        }
    }
}

fn bucket(v: u64) -> usize {
    if v < 16 {
        return v as usize;
    }
    let e = (63 - v.leading_zeros()).min(MAX_EXP);
    if e == MAX_EXP && v >> MAX_EXP > 1 {
        return BUCKETS - 1;
    }
    let sub = (v >> (e - 3)) & 7;
    16 + (e as usize - 4) * 8 + sub as usize
}

/// The largest value of bucket `b`.
fn upper(b: usize) -> u64 {
    if b < 16 {
        return b as u64;
    }
    if b >= BUCKETS - 1 {
        return u64::MAX;
    }
    let e = (b - 16) / 8 + 4;
    let sub = ((b - 16) % 8) as u64;
    ((8 + sub + 1) << (e - 3)) - 1
}

impl Histogram {
    /// Counts one value.
    pub fn record(&mut self, v: u64) {
        let b = bucket(v);
        self.counts[b] = self.counts[b].saturating_add(1);
        self.total += 1;
        self.max = self.max.max(v);
    }

    /// Values counted.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The largest value counted (0 if none).
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The quantile at `per_mille`/1000 (500: the median, 990: p99,
    /// clamped to 1000): the upper edge of the bucket that holds it, never
    /// above the maximum; 0 if empty.
    pub fn quantile(&self, per_mille: u32) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let p = u128::from(per_mille.min(1000));
        let rank = ((u128::from(self.total) * p).div_ceil(1000) as u64).max(1);
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return upper(b).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// A value lands in a bucket whose range holds it, within 12.5 %.
        #[test]
        fn buckets_bound_their_values(v in 0u64..(1u64 << MAX_EXP)) {
            let b = bucket(v);
            prop_assert!(upper(b) >= v);
            prop_assert!(b == 0 || upper(b - 1) < v);
            prop_assert!(upper(b) - v <= v / 8 + 1);
        }

        /// Quantiles are within 12.5 % above the exact ones.
        #[test]
        fn quantiles_are_close(mut vs in proptest::collection::vec(0u64..10_000_000, 1..200)) {
            let mut h = Histogram::default();
            for &v in &vs {
                h.record(v);
            }
            vs.sort_unstable();
            for q in [500u32, 990, 1000] {
                let exact = vs[(vs.len() * q as usize).div_ceil(1000).max(1) - 1];
                let got = h.quantile(q);
                prop_assert!(got >= exact && got <= exact + exact / 8 + 1, "q {} exact {} got {}", q, exact, got);
            }
            prop_assert_eq!(h.max(), *vs.last().unwrap());
        }
    }

    #[test]
    fn huge_values_share_the_last_bucket() {
        let mut h = Histogram::default();
        h.record(u64::MAX);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(h.quantile(500), u64::MAX);
        assert_eq!(Histogram::default().quantile(500), 0);
    }
}
