//! The learned model hierarchy: bottom-level PLR segments ("models"), the
//! upper levels that locate them, leaf fences, and leaf-range prediction.
//!
//! # Label scheme (the project's choice)
//!
//! The training keys are cut by [`crate::plr`] into models with error bound
//! `ε`. Inside model `m` keys are numbered by local position `p = 0..len`
//! (the PLR's own labels). With `keys_per_leaf = K` (the training fill, at
//! most the leaf's slot count) the key at local position `p` is stored in the
//! model's leaf `p / K`; leaves are numbered per model, `0..ceil(len / K)`,
//! so leaf boundaries never straddle two models.
//!
//! # Fences
//!
//! Every training leaf owns a fixed, **inclusive** key interval
//! `[fence_lo, fence_hi]`: `fence_lo` is the training key at position
//! `j · K` (0 for the very first leaf of model 0) and `fence_hi` is one less
//! than the next leaf's `fence_lo` (the next leaf may belong to the next
//! model), or `u64::MAX` for the last leaf of all. The fences tile the whole
//! key space. A key belongs to the model whose key interval contains it
//! (model 0 also owns everything below its first key) and to the leaf whose
//! fences contain it; that chain is where it is stored, whatever happened
//! since training.
//!
//! # The leaf range and its bias δ = 1 position
//!
//! Let `x` lie in model `m` with training keys `k_0 < … < k_{n−1}` and let
//! `i` be the position of its predecessor: `k_i ≤ x < k_{i+1}` (or
//! `x ≥ k_{n−1}`, `i = n − 1`). By the fences, `x` lives in leaf `⌊i / K⌋`.
//! (If `x < k_0`, which only happens in model 0, it lives in leaf 0.)
//! `predict` is monotone and within `±ε` at training keys, so with
//! `p = predict(x)`:
//! - `p ≥ predict(k_i) ≥ i − ε`, hence `i ≤ p + ε`;
//! - if `i < n − 1`: `p ≤ predict(k_{i+1}) ≤ i + 1 + ε`; if `i = n − 1`:
//!   `p ≤ n − 1 = i` by the clamp; either way `i ≥ p − ε − 1`.
//! - if `x < k_0`: the owning leaf is 0 and `p ≤ predict(k_0) ≤ ε`, so
//!   `p − ε − 1 < 0` and the saturated range below starts at leaf 0.
//!
//! Since `⌊· / K⌋` is monotone, the owning leaf lies in
//! `[⌊(p − ε − 1) / K⌋, ⌊(p + ε) / K⌋]`, the lower end saturating at 0 and
//! the upper end clamped to the model's last leaf. Compared with the ±ε of
//! training keys the range is widened by one position on the low side only
//! (δ = 1): a key between two training keys may be predicted up to one
//! position beyond its predecessor. This is tighter than the paper's δ of a
//! whole leaf span. `core/tests/leaf_chains.rs` checks it against a
//! reference after random inserts, updates and deletes.
//!
//! # Upper levels
//!
//! Level 0 holds the models. Level `l + 1` is the same PLR fitted over the
//! first keys of level `l`, with its own bound `upper_epsilon` (labels are
//! again local positions; a segment's `i`-th label is entry `start + i` of
//! the level below). `upper_epsilon` is separate from `epsilon` because it
//! only sizes the window searched per level (`2 · upper_epsilon + 2`
//! entries) and never widens a leaf range; setting both equal is fine.
//! Fitting stops at a single root segment. Any two points fit a line, so
//! every segment but a level's last spans at least two entries: each level
//! is at most half the size of the one below (rounded up) and the hierarchy
//! has O(log n) levels. [`Hierarchy::locate`] walks down from the
//! root; at each level the same argument as above gives a window of
//! `2 · upper_epsilon + 2` entries that contains the right one, found there
//! by binary search.
#![cfg(feature = "alloc")]

use alloc::vec::Vec;
use core::fmt;

use crate::plr::{fit, PlrError, Segment, MAX_EPSILON};

/// Parameters of a hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HierarchyConfig {
    /// Error bound of the bottom models, in key positions.
    pub epsilon: u64,
    /// Error bound of the upper levels, in entries of the level below.
    pub upper_epsilon: u64,
    /// Training keys per leaf (`K`, at most the leaf's slot count).
    pub keys_per_leaf: u64,
}

/// Why a hierarchy could not be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelError {
    /// The training keys (or the models' first keys) were rejected by the
    /// PLR: unsorted, duplicate, or an error bound too large.
    Plr(PlrError),
    /// No keys (or no models): a hierarchy needs at least one model.
    Empty,
    /// `keys_per_leaf` is 0.
    ZeroKeysPerLeaf,
    /// Model `index` has no keys.
    EmptyModel {
        /// Index of the model.
        index: usize,
    },
    /// Model `index` has a negative, infinite or NaN parameter, so its
    /// predictions would not be monotone.
    BadParameters {
        /// Index of the model.
        index: usize,
    },
    /// The leaf fence keys do not match the models: `expected` keys
    /// (one per leaf) but `got`.
    LeafCount {
        /// Leaves the models imply.
        expected: u64,
        /// Fence keys supplied.
        got: u64,
    },
    /// The models' lengths add up to more than `u64::MAX` keys.
    TooManyKeys,
    /// Leaf `leaf` (global number) has a fence key that is not above the
    /// previous leaf's, or the first leaf of a model does not start at the
    /// model's first key.
    LeafOrder {
        /// Global number of the offending leaf.
        leaf: u64,
    },
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ModelError::Plr(e) => write!(f, "PLR fit failed: {e}"),
            ModelError::Empty => write!(f, "a hierarchy needs at least one key"),
            ModelError::ZeroKeysPerLeaf => write!(f, "keys_per_leaf must be at least 1"),
            ModelError::EmptyModel { index } => write!(f, "model {index} has no keys"),
            ModelError::BadParameters { index } => write!(
                f,
                "model {index} has a negative or non-finite slope or intercept"
            ),
            ModelError::TooManyKeys => write!(f, "the models hold more than u64::MAX keys"),
            ModelError::LeafCount { expected, got } => write!(
                f,
                "the models have {expected} leaves but {got} fence keys were given"
            ),
            ModelError::LeafOrder { leaf } => write!(
                f,
                "fence key of leaf {leaf} is out of order or does not start its model"
            ),
        }
    }
}

impl core::error::Error for ModelError {}

impl From<PlrError> for ModelError {
    fn from(e: PlrError) -> Self {
        ModelError::Plr(e)
    }
}

/// The leaves a key may live in: leaves `first_leaf..=last_leaf` of model
/// `model` (numbers local to the model).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafRange {
    /// The model that owns the key.
    pub model: usize,
    /// First candidate leaf (inclusive).
    pub first_leaf: u64,
    /// Last candidate leaf (inclusive).
    pub last_leaf: u64,
}

/// A trained model hierarchy with its leaf fences.
#[derive(Clone, Debug, PartialEq)]
pub struct Hierarchy {
    cfg: HierarchyConfig,
    /// `levels[0]` are the models, the last level is the single root.
    levels: Vec<Vec<Segment>>,
    /// `starts[l][i]`: index in level `l − 1` of segment `i`'s label 0 (for
    /// `l = 0`: the global position of model `i`'s first key). Prefix sums
    /// of `len`, kept for lookups; a cache can rebuild them.
    starts: Vec<Vec<u64>>,
    /// `leaf_base[m]`: global number of model `m`'s leaf 0; one extra entry
    /// at the end holds the total.
    leaf_base: Vec<u64>,
    /// The training key at each leaf's first position, in global leaf order.
    leaf_keys: Vec<u64>,
}

impl Hierarchy {
    /// Trains models over `keys` (strictly increasing, not empty) and the
    /// upper levels over them.
    pub fn train(keys: &[u64], cfg: HierarchyConfig) -> Result<Hierarchy, ModelError> {
        check_config(&cfg)?;
        let models = fit(keys, cfg.epsilon)?;
        if models.is_empty() {
            return Err(ModelError::Empty);
        }
        let k = cfg.keys_per_leaf;
        let mut leaf_keys = Vec::new();
        let mut pos = 0usize;
        for m in &models {
            // Model lengths sum to keys.len(), so every index is in range.
            let mut j = 0;
            while j < m.len {
                leaf_keys.push(keys[pos + j as usize]);
                j = j.saturating_add(k);
            }
            pos += m.len as usize;
        }
        Self::build(models, leaf_keys, cfg)
    }

    /// Rebuilds a hierarchy from its models and the fence key of every leaf
    /// (the training key at each leaf's first position, in model then leaf
    /// order: `ceil(len / keys_per_leaf)` keys per model, the first equal to
    /// the model's `first_key`), e.g. when a compute node caches models read
    /// from the pool or the retraining agent replaces some of them. The
    /// upper levels are fitted afresh.
    ///
    /// The parts are checked for shape (non-empty models, monotone
    /// parameters, fence keys that match the models and increase), not
    /// against the keys: the `±ε` bound of each model is the caller's
    /// promise.
    pub fn from_parts(
        models: Vec<Segment>,
        leaf_keys: Vec<u64>,
        cfg: HierarchyConfig,
    ) -> Result<Hierarchy, ModelError> {
        check_config(&cfg)?;
        if models.is_empty() {
            return Err(ModelError::Empty);
        }
        let mut expected = 0u64;
        let mut total = 0u64;
        for (index, m) in models.iter().enumerate() {
            total = total.checked_add(m.len).ok_or(ModelError::TooManyKeys)?;
            if m.len == 0 {
                return Err(ModelError::EmptyModel { index });
            }
            if !(m.slope >= 0.0 && m.slope.is_finite() && m.intercept.is_finite()) {
                return Err(ModelError::BadParameters { index });
            }
            expected = expected.saturating_add(leaves_for(m.len, cfg.keys_per_leaf));
        }
        if expected != leaf_keys.len() as u64 {
            return Err(ModelError::LeafCount {
                expected,
                got: leaf_keys.len() as u64,
            });
        }
        let mut leaf = 0usize;
        for m in &models {
            if leaf_keys[leaf] != m.first_key || (leaf > 0 && leaf_keys[leaf - 1] >= m.first_key) {
                return Err(ModelError::LeafOrder { leaf: leaf as u64 });
            }
            let n = leaves_for(m.len, cfg.keys_per_leaf) as usize;
            for j in leaf + 1..leaf + n {
                if leaf_keys[j - 1] >= leaf_keys[j] {
                    return Err(ModelError::LeafOrder { leaf: j as u64 });
                }
            }
            leaf += n;
        }
        Self::build(models, leaf_keys, cfg)
    }

    /// Builds the upper levels over validated models and fences.
    fn build(
        models: Vec<Segment>,
        leaf_keys: Vec<u64>,
        cfg: HierarchyConfig,
    ) -> Result<Hierarchy, ModelError> {
        let mut leaf_base = Vec::with_capacity(models.len() + 1);
        let mut total = 0u64;
        for m in &models {
            leaf_base.push(total);
            total += leaves_for(m.len, cfg.keys_per_leaf);
        }
        leaf_base.push(total);

        let mut levels = Vec::new();
        let mut starts = Vec::new();
        let mut below = models;
        loop {
            starts.push(prefix_starts(&below));
            let done = below.len() == 1;
            let firsts: Vec<u64> = if done {
                Vec::new()
            } else {
                below.iter().map(|s| s.first_key).collect()
            };
            levels.push(below);
            if done {
                break;
            }
            // Each segment but the last spans ≥ 2 entries, so levels shrink.
            below = fit(&firsts, cfg.upper_epsilon)?;
        }
        Ok(Hierarchy {
            cfg,
            levels,
            starts,
            leaf_base,
            leaf_keys,
        })
    }

    /// The configuration the hierarchy was built with.
    pub fn config(&self) -> HierarchyConfig {
        self.cfg
    }

    /// The bottom-level models, in key order.
    pub fn models(&self) -> &[Segment] {
        &self.levels[0]
    }

    /// Every level, models first and the single root last.
    pub fn level_segments(&self) -> &[Vec<Segment>] {
        &self.levels
    }

    /// Number of segments per level, models first, ending with 1 (the root).
    pub fn levels(&self) -> impl Iterator<Item = usize> + '_ {
        self.levels.iter().map(Vec::len)
    }

    /// Number of training keys.
    pub fn keys(&self) -> u64 {
        self.levels[0].iter().map(|m| m.len).sum()
    }

    /// Bytes of all segments at all levels as a cache holds them: 32 bytes
    /// per segment (first key, length, slope, intercept). Leaf fence keys
    /// (8 bytes per leaf, see [`Self::fence_bytes`]) and the per-level
    /// prefix sums (derivable from the lengths) are not counted.
    pub fn model_bytes(&self) -> usize {
        let segments: usize = self.levels.iter().map(Vec::len).sum();
        segments * core::mem::size_of::<Segment>()
    }

    /// Bytes of the leaf fence keys: 8 per training leaf.
    pub fn fence_bytes(&self) -> usize {
        self.leaf_keys.len() * core::mem::size_of::<u64>()
    }

    /// Index of the model that owns `key`: the last model whose first key is
    /// `≤ key`, or 0 if there is none.
    pub fn locate(&self, key: u64) -> usize {
        let mut idx = 0usize;
        let e = self.cfg.upper_epsilon;
        for l in (1..self.levels.len()).rev() {
            let seg = &self.levels[l][idx];
            let start = self.starts[l][idx];
            let p = seg.predict(key);
            // The entry sought is within [p − ε − 1, p + ε] of this segment's
            // labels (module docs); `p ≤ len − 1` by the clamp.
            let lo = start + p.saturating_sub(e.saturating_add(1));
            let hi = start + p.saturating_add(e).min(seg.len - 1);
            let window = &self.levels[l - 1][lo as usize..=hi as usize];
            let below = window.partition_point(|s| s.first_key <= key);
            idx = lo as usize + below.saturating_sub(1);
        }
        idx
    }

    /// The model owning `key` and the leaves of that model its chain may be
    /// (see the module docs for the bound).
    pub fn predict(&self, key: u64) -> LeafRange {
        let model = self.locate(key);
        let m = &self.levels[0][model];
        let p = m.predict(key);
        let e = self.cfg.epsilon;
        let k = self.cfg.keys_per_leaf;
        let last = self.leaves_in(model).saturating_sub(1);
        LeafRange {
            model,
            first_leaf: (p.saturating_sub(e.saturating_add(1)) / k).min(last),
            last_leaf: (p.saturating_add(e) / k).min(last),
        }
    }

    /// Predicted global position of `key` among the training keys.
    pub fn position(&self, key: u64) -> u64 {
        let model = self.locate(key);
        self.starts[0][model] + self.levels[0][model].predict(key)
    }

    /// Global position of model `model`'s first training key.
    pub fn model_start(&self, model: usize) -> Option<u64> {
        self.starts[0].get(model).copied()
    }

    /// Number of training leaves of `model` (0 for a model that does not
    /// exist).
    pub fn leaves_in(&self, model: usize) -> u64 {
        match (self.leaf_base.get(model), self.leaf_base.get(model + 1)) {
            (Some(a), Some(b)) => b - a,
            _ => 0,
        }
    }

    /// The training key at each leaf's first position, in model then leaf
    /// order: the fence keys [`Self::from_parts`] takes back.
    pub fn leaf_keys(&self) -> &[u64] {
        &self.leaf_keys
    }

    /// Total number of training leaves over all models.
    pub fn total_leaves(&self) -> u64 {
        self.leaf_keys.len() as u64
    }

    /// Inclusive fences `(fence_lo, fence_hi)` of leaf `leaf` of `model`,
    /// or `None` if there is no such leaf.
    pub fn fences(&self, model: usize, leaf: u64) -> Option<(u64, u64)> {
        if leaf >= self.leaves_in(model) {
            return None;
        }
        let g = (self.leaf_base[model] + leaf) as usize;
        let lo = if g == 0 { 0 } else { self.leaf_keys[g] };
        let hi = match self.leaf_keys.get(g + 1) {
            Some(next) => next - 1,
            None => u64::MAX,
        };
        Some((lo, hi))
    }

    /// The training leaf whose fences contain `key`, as `(model, leaf)`:
    /// where `key` is stored, found from the fences alone (a writer can lock
    /// this chain without reading first).
    pub fn owning_leaf(&self, key: u64) -> (usize, u64) {
        let g = self
            .leaf_keys
            .partition_point(|&k| k <= key)
            .saturating_sub(1) as u64;
        let model = self.leaf_base.partition_point(|&b| b <= g) - 1;
        (model, g - self.leaf_base[model])
    }
}

fn check_config(cfg: &HierarchyConfig) -> Result<(), ModelError> {
    if cfg.keys_per_leaf == 0 {
        return Err(ModelError::ZeroKeysPerLeaf);
    }
    for epsilon in [cfg.epsilon, cfg.upper_epsilon] {
        if epsilon > MAX_EPSILON {
            return Err(PlrError::EpsilonTooLarge {
                epsilon,
                max: MAX_EPSILON,
            }
            .into());
        }
    }
    Ok(())
}

/// `ceil(len / k)` for `k ≥ 1`.
fn leaves_for(len: u64, k: u64) -> u64 {
    len / k + (len % k != 0) as u64
}

fn prefix_starts(level: &[Segment]) -> Vec<u64> {
    let mut acc = 0u64;
    level
        .iter()
        .map(|s| {
            let start = acc;
            acc += s.len;
            start
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec;

    fn cfg(epsilon: u64, upper_epsilon: u64, keys_per_leaf: u64) -> HierarchyConfig {
        HierarchyConfig {
            epsilon,
            upper_epsilon,
            keys_per_leaf,
        }
    }

    fn sorted_unique(mut v: Vec<u64>) -> Vec<u64> {
        v.sort_unstable();
        v.dedup();
        v
    }

    fn keys_strategy() -> impl Strategy<Value = Vec<u64>> {
        prop_oneof![
            prop::collection::vec(any::<u64>(), 1..3000).prop_map(sorted_unique),
            prop::collection::vec(0u64..5000, 1..3000).prop_map(sorted_unique),
            // Quadratic growth: many models.
            (1usize..3000).prop_map(|n| (0..n as u64).map(|i| i * i * 7).collect()),
            prop::collection::vec((any::<u64>(), 1u64..200), 1..30).prop_map(|runs| {
                let mut v = vec![0, u64::MAX];
                for (base, n) in runs {
                    v.extend((0..n).map(|j| base.saturating_add(j * j)));
                }
                sorted_unique(v)
            }),
        ]
    }

    fn probe_keys(keys: &[u64], extra: &[u64]) -> Vec<u64> {
        let mut probes = vec![0, 1, u64::MAX, u64::MAX - 1];
        for &k in keys {
            probes.extend([k, k.wrapping_sub(1), k.wrapping_add(1)]);
        }
        probes.extend_from_slice(extra);
        probes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn locate_matches_binary_search(
            keys in keys_strategy(),
            extra in prop::collection::vec(any::<u64>(), 0..50),
            eps in 0u64..8,
            ueps in 0u64..4,
            k in 1u64..9,
        ) {
            let h = Hierarchy::train(&keys, cfg(eps, ueps, k)).unwrap();
            let firsts: Vec<u64> = h.models().iter().map(|m| m.first_key).collect();
            for key in probe_keys(&keys, &extra) {
                let want = firsts.partition_point(|&f| f <= key).saturating_sub(1);
                prop_assert_eq!(h.locate(key), want, "key {}", key);
            }
            let sizes: Vec<usize> = h.levels().collect();
            prop_assert_eq!(sizes[0], h.models().len());
            prop_assert_eq!(*sizes.last().unwrap(), 1);
            prop_assert!(sizes.windows(2).all(|w| w[1] < w[0]));
        }

        #[test]
        fn training_keys_fall_in_their_leaf_range(
            keys in keys_strategy(),
            eps in 0u64..8,
            ueps in 0u64..4,
            k in 1u64..9,
        ) {
            let h = Hierarchy::train(&keys, cfg(eps, ueps, k)).unwrap();
            let mut model = 0;
            let mut local = 0u64;
            for &key in &keys {
                if local == h.models()[model].len {
                    model += 1;
                    local = 0;
                }
                let r = h.predict(key);
                prop_assert_eq!(r.model, model);
                let leaf = local / k;
                prop_assert!(r.first_leaf <= leaf && leaf <= r.last_leaf);
                prop_assert_eq!(h.owning_leaf(key), (model, leaf));
                let (lo, hi) = h.fences(model, leaf).unwrap();
                prop_assert!(lo <= key && key <= hi);
                prop_assert!(h.position(key).abs_diff(h.model_start(model).unwrap() + local) <= eps);
                local += 1;
            }
        }

        #[test]
        fn fences_tile_the_key_space(keys in keys_strategy(), k in 1u64..9) {
            let h = Hierarchy::train(&keys, cfg(4, 2, k)).unwrap();
            let mut next = 0u64;
            let mut leaves = 0;
            for m in 0..h.models().len() {
                prop_assert_eq!(h.leaves_in(m), h.models()[m].len.div_ceil(k));
                for j in 0..h.leaves_in(m) {
                    let (lo, hi) = h.fences(m, j).unwrap();
                    prop_assert_eq!(lo, next);
                    prop_assert!(lo <= hi);
                    next = hi.wrapping_add(1);
                    leaves += 1;
                }
                prop_assert_eq!(h.fences(m, h.leaves_in(m)), None);
            }
            prop_assert_eq!(next, 0, "the last fence ends at u64::MAX");
            prop_assert_eq!(h.total_leaves(), leaves);
        }

        #[test]
        fn from_parts_round_trips(keys in keys_strategy(), k in 1u64..9) {
            let c = cfg(3, 1, k);
            let h = Hierarchy::train(&keys, c).unwrap();
            let again = Hierarchy::from_parts(h.models().to_vec(), h.leaf_keys().to_vec(), c).unwrap();
            prop_assert_eq!(again, h);
        }
    }

    #[test]
    fn single_key() {
        let h = Hierarchy::train(&[42], cfg(0, 0, 4)).unwrap();
        assert_eq!(h.levels().collect::<Vec<_>>(), vec![1]);
        assert_eq!(h.model_bytes(), 32);
        assert_eq!(h.fences(0, 0), Some((0, u64::MAX)));
        for key in [0, 41, 42, 43, u64::MAX] {
            assert_eq!(
                h.predict(key),
                LeafRange {
                    model: 0,
                    first_leaf: 0,
                    last_leaf: 0
                }
            );
        }
        assert_eq!(h.leaves_in(1), 0);
        assert_eq!(h.fences(1, 0), None);
    }

    #[test]
    fn bad_input() {
        let c = cfg(4, 4, 4);
        assert_eq!(Hierarchy::train(&[], c), Err(ModelError::Empty));
        assert_eq!(
            Hierarchy::train(&[1, 2], cfg(4, 4, 0)),
            Err(ModelError::ZeroKeysPerLeaf)
        );
        assert_eq!(
            Hierarchy::train(&[3, 2], c),
            Err(ModelError::Plr(PlrError::Unsorted {
                index: 1,
                prev: 3,
                key: 2
            }))
        );
        assert_eq!(
            Hierarchy::train(&[2, 2], c),
            Err(ModelError::Plr(PlrError::Duplicate { index: 1, key: 2 }))
        );
        assert!(matches!(
            Hierarchy::train(&[1], cfg(4, MAX_EPSILON + 1, 4)),
            Err(ModelError::Plr(PlrError::EpsilonTooLarge { .. }))
        ));
    }

    #[test]
    fn from_parts_rejects_inconsistent_parts() {
        let keys: Vec<u64> = (0..200u64).map(|i| i * i).collect();
        let c = cfg(2, 1, 4);
        let h = Hierarchy::train(&keys, c).unwrap();
        let models = h.models().to_vec();
        assert!(models.len() > 2);
        let fences = h.leaf_keys().to_vec();

        assert_eq!(
            Hierarchy::from_parts(Vec::new(), Vec::new(), c),
            Err(ModelError::Empty)
        );
        let mut short = fences.clone();
        short.pop();
        assert!(matches!(
            Hierarchy::from_parts(models.clone(), short, c),
            Err(ModelError::LeafCount { .. })
        ));
        let mut bad = models.clone();
        bad[1].slope = -1.0;
        assert_eq!(
            Hierarchy::from_parts(bad, fences.clone(), c),
            Err(ModelError::BadParameters { index: 1 })
        );
        let mut bad = models.clone();
        bad[2].intercept = f64::NAN;
        assert_eq!(
            Hierarchy::from_parts(bad, fences.clone(), c),
            Err(ModelError::BadParameters { index: 2 })
        );
        let mut bad = models.clone();
        bad[1].len = u64::MAX;
        assert_eq!(
            Hierarchy::from_parts(bad, fences.clone(), c),
            Err(ModelError::TooManyKeys)
        );
        let mut bad = models.clone();
        bad[0].len = 0;
        assert_eq!(
            Hierarchy::from_parts(bad, fences.clone(), c),
            Err(ModelError::EmptyModel { index: 0 })
        );
        let mut swapped = fences.clone();
        swapped.swap(1, 2);
        assert!(matches!(
            Hierarchy::from_parts(models.clone(), swapped, c),
            Err(ModelError::LeafOrder { .. })
        ));
        // Models whose first keys are not increasing.
        let mut bad = models.clone();
        bad.swap(0, 1);
        assert!(Hierarchy::from_parts(bad, fences, c).is_err());
    }

    #[test]
    fn deep_hierarchy_with_zero_upper_epsilon() {
        // Quadratic keys with ε = 0 give many models; ε_upper = 0 many levels.
        let keys: Vec<u64> = (0..20_000u64).map(|i| i * i * 3 + i).collect();
        let h = Hierarchy::train(&keys, cfg(0, 0, 8)).unwrap();
        let sizes: Vec<usize> = h.levels().collect();
        assert!(sizes.len() >= 4, "{sizes:?}");
        let firsts: Vec<u64> = h.models().iter().map(|m| m.first_key).collect();
        for (i, &f) in firsts.iter().enumerate() {
            assert_eq!(h.locate(f), i);
            assert_eq!(h.locate(f.saturating_sub(1)), i.saturating_sub(1));
            assert_eq!(h.locate(f + 1), i);
        }
        assert_eq!(
            h.model_bytes(),
            sizes.iter().sum::<usize>() * core::mem::size_of::<Segment>()
        );
    }
}
