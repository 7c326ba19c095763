//! The store's learned model, the only one: leaf fences, their cut into
//! models, each model's fit, prediction and window, and the [`Locator`]
//! over the models. Bulk loading and retraining (`rolex-dpu`), the client's
//! lookups (`rolex-kv`) and `rolex plr` all call this code, so what the
//! tests below and `core/tests/leaf_chains.rs` prove is what the store runs.
//!
//! # Leaves and fences
//!
//! Sorted keys are loaded `K` to a leaf (the fill: `K ≤ L`, the leaf's
//! slots). Training leaf `g` takes keys `gK .. (g+1)K`; its `fence_lo` is
//! its first key, except leaf 0's, which is 0 ([`leaf_fences`]). Its
//! `fence_hi` is one less than the next leaf's `fence_lo`, or `u64::MAX`
//! for the last. The fences thus tile the whole key space: every `u64` key
//! has exactly one owning training leaf, empty or not.
//!
//! # Models
//!
//! [`plan_models`] runs the PLR over all fences (leaf number as label) and
//! cuts each piece into runs of at most `max_model_leaves` leaves, so one
//! retraining never walks an unbounded number of leaves. Each run is a
//! model: [`fit_model`] fits it afresh over its own fences, numbering its
//! leaves from 0. A model owns the keys `[first fence, next model's first
//! fence − 1]` (the first model also owns everything below, as its first
//! fence is 0) and that range never changes: retraining refits a model
//! over its own leaves, it never moves a boundary between models.
//!
//! # Label scheme
//!
//! A model's training keys are the `fence_lo` of its training leaves, in
//! leaf order, and the label of leaf `j`'s fence is `j` (label stride
//! `S = 1`, stored in the record). Every training leaf has a fence, empty or
//! not, so the fences are exactly the keys where ownership changes: a key
//! `x` of the model is owned by leaf `j` iff `fence_j ≤ x < fence_{j+1}`,
//! i.e. `j` is the label of `x`'s predecessor among the training keys.
//! ε is therefore counted in leaves.
//!
//! Why fences and not every key with labels `j·S + r`: a leaf that is
//! empty at training contributes no key under that scheme, and then a key
//! later inserted into it can be predicted below its window; dropping empty
//! leaves at retraining instead would have to grow a neighbour's fences,
//! which breaks the invariant stale readers rely on (below). Fences have
//! neither problem, retraining needs no leaf contents (only the leaf list,
//! which the freeze makes stable), and the PLR needs no explicit labels.
//!
//! # The window: δ = 1 leaf
//!
//! Let `f` be the model's prediction ([`predict`]): monotone (slope ≥ 0 in
//! every segment, and each segment's predictions are clamped to its own
//! labels, which increase from segment to segment) and within `±ε` of `j`
//! at `fence_j`. For `x` owned by leaf `j`, with `p = f(x)`:
//! - `p ≥ f(fence_j) ≥ j − ε`, hence `j ≤ p + ε`;
//! - if `j < n − 1`: `p ≤ f(fence_{j+1}) ≤ j + 1 + ε`; if `j = n − 1`:
//!   `p ≤ n − 1 = j` by the clamp; either way `j ≥ p − ε − 1`.
//!
//! So the owner lies in `[p − ε − 1, p + ε]` clamped to `0 ..= n − 1`
//! ([`window`]): `2ε + 2` leaves, one more than the `±ε` of the training
//! keys, on the low side only (δ = 1 leaf). `|p − j| ≤ ε + 1` for every key,
//! `≤ ε` for the fences themselves.
//!
//! # Upper levels
//!
//! The [`Locator`] finds the model of a key: the same PLR over the models'
//! first keys (label: model number) with its own bound `upper_epsilon`,
//! then over those segments' first keys, up to a single root segment. Any
//! two points fit a line, so every segment but a level's last spans at
//! least two entries and the levels shrink geometrically. Walking down from
//! the root, the argument above gives a window of `2 · upper_epsilon + 2`
//! entries per level that holds the entry sought, found there by binary
//! search; the result is then checked against the first keys. That walk is
//! [`Locator::locate_learned`]; [`Locator::locate`], the clients' path,
//! answers from a radix table over the first keys instead (`crate::radix`:
//! one table read and a search of a few keys, where the walk costs a
//! binary search per level) and gives the same model.
//!
//! # Stale models stay correct (DESIGN §5.2)
//!
//! Each training leaf owns the fixed, inclusive interval `[fence_lo,
//! fence_hi]`, and its chain (the training leaf and its synonym leaves)
//! holds exactly the keys of that interval. A full leaf splits B-link
//! style: a new synonym leaf takes the upper part, the old leaf's
//! `fence_hi` shrinks to just below it and links to it. So a chain's
//! `fence_lo` never changes, a leaf's `fence_hi` only shrinks, and data
//! never leaves its chain. A model not retrained since therefore still
//! finds every key: the locator's model ranges are fixed, the window holds
//! the training leaf by the fences (which are fixed), and that leaf's chain
//! holds the key. *Every key present is found from a model not retrained
//! since, after any sequence of inserts, updates, deletes and splits* —
//! `core/tests/leaf_chains.rs` checks exactly this against a `BTreeMap`.

#[cfg(feature = "alloc")]
use alloc::vec::Vec;
use core::fmt;
use core::ops::Range;

use crate::layout::{LayoutError, ModelSegment};
use crate::plr::PlrError;
#[cfg(feature = "alloc")]
use crate::plr::{fit, Segment};
#[cfg(feature = "alloc")]
use crate::radix::RadixTable;

/// Why fences could not be cut or fitted, or a locator built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelError {
    /// The PLR refused a model's fences (unsorted or duplicate at `index`
    /// of the fences given, or ε too large).
    Plr(PlrError),
    /// A segment's parameters do not fit the pool's segment layout.
    Layout(LayoutError),
    /// `keys_per_leaf` is 0.
    ZeroKeysPerLeaf,
    /// `max_model_leaves` is 0.
    ZeroMaxModelLeaves,
    /// A locator was asked for over no model.
    NoModels,
    /// The PLR refused an upper level of a locator. At level 0 (the
    /// models' first keys) an `index` in the error is a model number.
    Upper {
        /// Level (0: over the models' first keys).
        level: usize,
        /// What the PLR said.
        error: PlrError,
    },
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Plr(e) => write!(f, "PLR fit failed: {e}"),
            Self::Layout(e) => write!(f, "model segment: {e}"),
            Self::ZeroKeysPerLeaf => f.write_str("keys_per_leaf must be at least 1"),
            Self::ZeroMaxModelLeaves => f.write_str("max_model_leaves must be at least 1"),
            Self::NoModels => f.write_str("a locator needs at least one model"),
            Self::Upper { level: 0, error } => {
                write!(f, "the models' first keys cannot be indexed: {error}")
            }
            Self::Upper { level, error } => {
                write!(f, "upper level {level} cannot be fitted: {error}")
            }
        }
    }
}

impl core::error::Error for ModelError {}

impl From<PlrError> for ModelError {
    fn from(e: PlrError) -> Self {
        Self::Plr(e)
    }
}

impl From<LayoutError> for ModelError {
    fn from(e: LayoutError) -> Self {
        Self::Layout(e)
    }
}

/// The training-leaf fences of sorted `keys` loaded `keys_per_leaf` to a
/// leaf: every `keys_per_leaf`-th key, the first replaced by 0 so that the
/// fences tile the key space (module docs). No keys give one empty leaf,
/// `[0]`. The keys must be strictly increasing (not checked here; the PLR
/// of [`plan_models`] refuses fences that are not).
#[cfg(feature = "alloc")]
pub fn leaf_fences(keys: &[u64], keys_per_leaf: u64) -> Result<Vec<u64>, ModelError> {
    if keys_per_leaf == 0 {
        return Err(ModelError::ZeroKeysPerLeaf);
    }
    let k = usize::try_from(keys_per_leaf).unwrap_or(usize::MAX);
    let mut fences: Vec<u64> = keys.iter().step_by(k).copied().collect();
    match fences.first_mut() {
        Some(f) => *f = 0,
        None => fences.push(0),
    }
    Ok(fences)
}

/// One model of a plan: a run of consecutive training leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelSpan {
    /// Global number of its first training leaf.
    pub first_leaf: u64,
    /// Its training leaves (at least 1).
    pub leaves: u64,
}

impl ModelSpan {
    /// Global number of the first leaf after the model.
    pub fn end(&self) -> u64 {
        self.first_leaf + self.leaves
    }

    /// Its leaves as indices into the fence list it was planned from.
    pub fn range(&self) -> Range<usize> {
        self.first_leaf as usize..self.end() as usize
    }
}

/// Cuts the training leaves with `fences` (strictly increasing) into
/// models: the PLR's pieces at `epsilon` leaves, each cut into runs of at
/// most `max_model_leaves` (module docs). The spans tile `0..fences.len()`
/// in order; no fences give no models.
#[cfg(feature = "alloc")]
pub fn plan_models(
    fences: &[u64],
    epsilon: u64,
    max_model_leaves: u64,
) -> Result<Vec<ModelSpan>, ModelError> {
    if max_model_leaves == 0 {
        return Err(ModelError::ZeroMaxModelLeaves);
    }
    let mut spans = Vec::new();
    let mut start = 0u64;
    for piece in fit(fences, epsilon)? {
        let end = start + piece.len;
        let mut a = start;
        while a < end {
            let b = end.min(a.saturating_add(max_model_leaves));
            spans.push(ModelSpan {
                first_leaf: a,
                leaves: b - a,
            });
            a = b;
        }
        start = end;
    }
    Ok(spans)
}

/// Fits the prediction segments of a model whose training leaves have the
/// (strictly increasing) `fences`; segment bases are the model's leaf
/// numbers, so `|predict(fences[j]) − j| ≤ epsilon`.
#[cfg(feature = "alloc")]
pub fn fit_model(fences: &[u64], epsilon: u64) -> Result<Vec<ModelSegment>, ModelError> {
    let segments = fit(fences, epsilon)?;
    let mut out = Vec::with_capacity(segments.len());
    let mut base = 0u64;
    for s in segments {
        out.push(ModelSegment::new(
            s.first_key,
            base,
            s.len,
            s.slope,
            s.intercept,
        )?);
        base += s.len;
    }
    Ok(out)
}

/// The leaf a model predicts for `key`: the segment that holds it (the last
/// whose first key is `≤ key`, or the first) evaluated at `key`. Monotone
/// in `key`; 0 for a model without segments.
pub fn predict(segments: &[ModelSegment], key: u64) -> u64 {
    let i = segments
        .partition_point(|s| s.first_key() <= key)
        .saturating_sub(1);
    segments.get(i).map_or(0, |s| s.predict(key))
}

/// The window of training leaves `[lo, hi]` that holds the owner of `key`
/// (module docs: `[p − ε − 1, p + ε]` clamped), for a model of `leaves`
/// (at least 1) training leaves fitted at `epsilon`.
pub fn window(segments: &[ModelSegment], epsilon: u64, leaves: u64, key: u64) -> (u64, u64) {
    let p = predict(segments, key);
    let last = leaves.saturating_sub(1);
    let lo = p.saturating_sub(epsilon.saturating_add(1)).min(last);
    let hi = p.saturating_add(epsilon).min(last);
    (lo, hi)
}

/// Where [`owning_leaf`] found a key's training leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafLookup {
    /// The training leaf (model-local number) whose fences hold the key.
    pub leaf: u64,
    /// Whether the model's window held it (else all fences were searched:
    /// the model does not fit its fences, which the window proof excludes
    /// for a model trained by [`fit_model`]).
    pub in_window: bool,
}

/// The training leaf of a model (its `fences` and `segments`, fitted at
/// `epsilon`) that owns `key`, a key of the model: a binary search of the
/// fences in the [`window`], checked, or of all fences if the window missed.
/// Empty `fences` (no model has them) give leaf 0, not in the window.
pub fn owning_leaf(
    segments: &[ModelSegment],
    epsilon: u64,
    fences: &[u64],
    key: u64,
) -> LeafLookup {
    let n = fences.len() as u64;
    if n == 0 {
        return LeafLookup {
            leaf: 0,
            in_window: false,
        };
    }
    let (lo, hi) = window(segments, epsilon, n, key);
    let in_window =
        fences[lo as usize] <= key && fences.get(hi as usize + 1).map_or(true, |&next| next > key);
    let leaf = if in_window {
        let w = &fences[lo as usize..=hi as usize];
        lo + w.partition_point(|&f| f <= key).saturating_sub(1) as u64
    } else {
        fences.partition_point(|&f| f <= key).saturating_sub(1) as u64
    };
    LeafLookup { leaf, in_window }
}

/// Locates the model that owns a key: learned upper levels over the
/// models' first keys, verified against those keys (module docs).
#[cfg(feature = "alloc")]
#[derive(Clone, Debug, PartialEq)]
pub struct Locator {
    firsts: Vec<u64>,
    /// `levels[0]` indexes `firsts`, `levels[l + 1]` indexes `levels[l]`;
    /// the last level is the single root.
    levels: Vec<Vec<Segment>>,
    /// `starts[l][i]`: the entry below that is label 0 of `levels[l][i]`.
    starts: Vec<Vec<u64>>,
    epsilon: u64,
    /// The first step of [`Self::locate`]: a radix table over `firsts`.
    radix: RadixTable,
}

#[cfg(feature = "alloc")]
impl Locator {
    /// Fits the upper levels over the models' `first_keys` (strictly
    /// increasing, at least one) with error bound `epsilon` entries.
    pub fn new(first_keys: Vec<u64>, epsilon: u64) -> Result<Self, ModelError> {
        if first_keys.is_empty() {
            return Err(ModelError::NoModels);
        }
        let upper = |level| move |error| ModelError::Upper { level, error };
        let mut levels = Vec::new();
        let mut starts = Vec::new();
        let mut segs = fit(&first_keys, epsilon).map_err(upper(0))?;
        loop {
            let mut acc = 0u64;
            starts.push(
                segs.iter()
                    .map(|s| {
                        let a = acc;
                        acc += s.len;
                        a
                    })
                    .collect(),
            );
            if segs.len() == 1 {
                levels.push(segs);
                break;
            }
            let firsts: Vec<u64> = segs.iter().map(|s| s.first_key).collect();
            levels.push(segs);
            segs = fit(&firsts, epsilon).map_err(upper(levels.len()))?;
        }
        Ok(Self {
            radix: RadixTable::new(&first_keys),
            firsts: first_keys,
            levels,
            starts,
            epsilon,
        })
    }

    /// The model owning `key`: the last whose first key is `≤ key` (model 0
    /// owns everything below), found by the radix table over the first
    /// keys (`crate::radix`): one shift and two table reads, then a search
    /// of the first keys in the key's bucket (about one on evenly spread
    /// keys). On a get's path this replaced the walk down the learned
    /// levels (a binary search per level: about half of a get's routing
    /// cost on loopback); both give the same model
    /// (`locate_matches_binary_search`), and the levels stay the models'
    /// learned index as `rolex plr` reports it ([`Self::locate_learned`]).
    pub fn locate(&self, key: u64) -> usize {
        self.radix.last_at_most(&self.firsts, key)
    }

    /// The model the learned levels alone give for `key`, unchecked (what
    /// [`Self::locate`] checks; tests and `rolex plr` hold it to the first
    /// keys).
    pub fn locate_learned(&self, key: u64) -> usize {
        let mut idx = 0usize;
        let e = self.epsilon;
        for l in (0..self.levels.len()).rev() {
            let seg = &self.levels[l][idx];
            let start = self.starts[l][idx];
            let p = seg.predict(key);
            // The entry sought is within [p − ε − 1, p + ε] of this
            // segment's labels (the window argument of the module docs).
            let lo = (start + p.saturating_sub(e.saturating_add(1))) as usize;
            let hi = (start + p.saturating_add(e).min(seg.len - 1)) as usize;
            let k = if l == 0 {
                self.firsts[lo..=hi].partition_point(|&f| f <= key)
            } else {
                self.levels[l - 1][lo..=hi].partition_point(|s| s.first_key <= key)
            };
            idx = lo + k.saturating_sub(1);
        }
        idx
    }

    /// The models' first keys, in model order.
    pub fn first_keys(&self) -> &[u64] {
        &self.firsts
    }

    /// The upper levels' error bound, in entries of the level below.
    pub fn epsilon(&self) -> u64 {
        self.epsilon
    }

    /// Segments per level, from the one over the models' first keys to the
    /// root (always 1).
    pub fn levels(&self) -> impl Iterator<Item = usize> + '_ {
        self.levels.iter().map(Vec::len)
    }

    /// Bytes of the learned segments, as the pool lays segments out
    /// ([`ModelSegment::SIZE`] each).
    pub fn learned_bytes(&self) -> u64 {
        let segs: usize = self.levels.iter().map(Vec::len).sum();
        segs as u64 * ModelSegment::SIZE
    }

    /// Bytes a cache holds for the locator: the learned segments, 8 per
    /// model first key, and the radix table over them.
    pub fn cached_bytes(&self) -> u64 {
        self.learned_bytes() + self.firsts.len() as u64 * 8 + self.radix.bytes()
    }
}

#[cfg(all(test, feature = "alloc"))]
mod tests {
    use super::*;
    use crate::plr::MAX_EPSILON;
    use proptest::prelude::*;

    fn sorted_unique(mut v: Vec<u64>) -> Vec<u64> {
        v.sort_unstable();
        v.dedup();
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Every key between the fences lies in the window of its owner, at
        /// most ε + 1 leaves from the prediction (ε at the fences), and
        /// `owning_leaf` finds it there.
        #[test]
        fn owner_is_in_the_window(
            mut fences in proptest::collection::btree_set(any::<u64>(), 1..300),
            eps in 0u64..8,
            probes in proptest::collection::vec(any::<u64>(), 1..50),
        ) {
            fences.insert(0);
            let fences: Vec<u64> = fences.into_iter().collect();
            let segs = fit_model(&fences, eps).unwrap();
            for (j, &f) in fences.iter().enumerate() {
                prop_assert!(predict(&segs, f).abs_diff(j as u64) <= eps);
            }
            for x in probes.into_iter().chain(fences.iter().copied()) {
                let owner = fences.partition_point(|&f| f <= x) as u64 - 1;
                let (lo, hi) = window(&segs, eps, fences.len() as u64, x);
                prop_assert!(lo <= owner && owner <= hi, "x {} owner {} window {:?}", x, owner, (lo, hi));
                prop_assert!(predict(&segs, x).abs_diff(owner) <= eps + 1);
                prop_assert_eq!(
                    owning_leaf(&segs, eps, &fences, x),
                    LeafLookup { leaf: owner, in_window: true }
                );
            }
        }

        /// The plan tiles the leaves with spans of at most
        /// `max_model_leaves`, cut only where the PLR cuts or the cap does,
        /// and each model's fit keeps its own fences within ε.
        #[test]
        fn plan_tiles_the_leaves(
            keys in proptest::collection::vec(any::<u64>(), 0..2000).prop_map(sorted_unique),
            k in 1u64..20,
            eps in 0u64..6,
            max in 1u64..40,
        ) {
            let fences = leaf_fences(&keys, k).unwrap();
            prop_assert_eq!(fences.len(), keys.len().div_ceil(k as usize).max(1));
            let spans = plan_models(&fences, eps, max).unwrap();
            let pieces = fit(&fences, eps).unwrap();
            let mut piece_ends = Vec::new();
            let mut end = 0;
            for p in &pieces {
                end += p.len;
                piece_ends.push(end);
            }
            let mut next = 0;
            for s in &spans {
                prop_assert_eq!(s.first_leaf, next);
                prop_assert!(s.leaves >= 1 && s.leaves <= max);
                // A span ends at a piece end or is cut by the cap.
                prop_assert!(s.leaves == max || piece_ends.contains(&s.end()));
                let own = &fences[s.range()];
                let segs = fit_model(own, eps).unwrap();
                for (j, &f) in own.iter().enumerate() {
                    prop_assert!(predict(&segs, f).abs_diff(j as u64) <= eps);
                }
                next = s.end();
            }
            prop_assert_eq!(next, fences.len() as u64);
        }

        /// The learned walk alone finds the last model whose first key is
        /// `≤ key`, and the levels shrink to one root.
        #[test]
        fn locate_matches_binary_search(
            firsts in proptest::collection::vec(any::<u64>(), 1..3000).prop_map(sorted_unique),
            extra in proptest::collection::vec(any::<u64>(), 0..50),
            ueps in 0u64..6,
        ) {
            let loc = Locator::new(firsts.clone(), ueps).unwrap();
            let mut probes = vec![0, 1, u64::MAX, u64::MAX - 1];
            for &f in &firsts {
                probes.extend([f, f.wrapping_sub(1), f.wrapping_add(1)]);
            }
            probes.extend(extra);
            for key in probes {
                let want = firsts.partition_point(|&f| f <= key).saturating_sub(1);
                prop_assert_eq!(loc.locate_learned(key), want, "key {}", key);
                prop_assert_eq!(loc.locate(key), want);
            }
            let sizes: Vec<usize> = loc.levels().collect();
            prop_assert!(sizes[0] <= firsts.len());
            prop_assert_eq!(*sizes.last().unwrap(), 1);
            prop_assert!(sizes.windows(2).all(|w| w[1] < w[0]));
        }
    }

    #[test]
    fn fences_step_by_the_fill_from_zero() {
        assert_eq!(leaf_fences(&[], 4).unwrap(), vec![0]);
        assert_eq!(leaf_fences(&[7], 4).unwrap(), vec![0]);
        let keys: Vec<u64> = (10..20).collect();
        assert_eq!(leaf_fences(&keys, 3).unwrap(), vec![0, 13, 16, 19]);
        assert_eq!(leaf_fences(&keys, u64::MAX).unwrap(), vec![0]);
        assert_eq!(leaf_fences(&keys, 0), Err(ModelError::ZeroKeysPerLeaf));
    }

    #[test]
    fn bad_input_is_refused_with_its_context() {
        assert_eq!(
            plan_models(&[0, 1], 1, 0),
            Err(ModelError::ZeroMaxModelLeaves)
        );
        assert_eq!(plan_models(&[], 1, 4), Ok(Vec::new()));
        assert_eq!(
            plan_models(&[0, 5, 5], 1, 4),
            Err(ModelError::Plr(PlrError::Duplicate { index: 2, key: 5 }))
        );
        assert!(matches!(
            fit_model(&[0, 1], MAX_EPSILON + 1),
            Err(ModelError::Plr(PlrError::EpsilonTooLarge { .. }))
        ));
        assert_eq!(Locator::new(Vec::new(), 2), Err(ModelError::NoModels));
        assert_eq!(
            Locator::new(vec![0, 9, 4], 2),
            Err(ModelError::Upper {
                level: 0,
                error: PlrError::Unsorted {
                    index: 2,
                    prev: 9,
                    key: 4
                }
            })
        );
    }

    #[test]
    fn one_model_has_a_root() {
        let loc = Locator::new(vec![0], 4).unwrap();
        assert_eq!(loc.levels().collect::<Vec<_>>(), vec![1]);
        assert_eq!(loc.locate(0), 0);
        assert_eq!(loc.locate(u64::MAX), 0);
        assert_eq!(loc.learned_bytes(), ModelSegment::SIZE);
        // The segment, the first key, and the radix table over it.
        assert_eq!(
            loc.cached_bytes(),
            ModelSegment::SIZE + 8 + loc.radix.bytes()
        );
        assert!(loc.radix.bytes() > 0);
    }

    #[test]
    fn deep_locator_with_zero_epsilon() {
        // Quadratic first keys with ε = 0 give many levels.
        let firsts: Vec<u64> = (0..20_000u64).map(|i| i * i * 3 + i).collect();
        let loc = Locator::new(firsts.clone(), 0).unwrap();
        let sizes: Vec<usize> = loc.levels().collect();
        assert!(sizes.len() >= 3, "{sizes:?}");
        for (i, &f) in firsts.iter().enumerate() {
            assert_eq!(loc.locate_learned(f), i);
            assert_eq!(loc.locate_learned(f.saturating_sub(1)), i.saturating_sub(1));
            assert_eq!(loc.locate_learned(f + 1), i);
        }
        assert_eq!(
            loc.learned_bytes(),
            sizes.iter().sum::<usize>() as u64 * ModelSegment::SIZE
        );
    }
}
