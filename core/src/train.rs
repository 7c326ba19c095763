//! Training one model: the PLR over its training leaves' fences.
//!
//! # Label scheme (this crate's choice, used for bulk-loaded and retrained
//! models alike)
//!
//! A model's training keys are the `fence_lo` of its training leaves, in
//! leaf order, and the label of leaf `j`'s fence is `j` (label stride
//! `S = 1`, stored in the record). Every training leaf has a fence, empty or
//! not, so the fences are exactly the keys where ownership changes: a key
//! `x` of the model is owned by leaf `j` iff `fence_j ≤ x < fence_{j+1}`,
//! i.e. `j` is the label of `x`'s predecessor among the training keys. The
//! PLR bounds `|f(fence_j) − j| ≤ ε` and `f` is monotone, so with
//! `p = f(x)`: `p ≥ f(fence_j) ≥ j − ε` and `p ≤ f(fence_{j+1}) ≤ j + 1 + ε`
//! (or `p ≤ n − 1` by the clamp for the last leaf). Hence the owning leaf
//! lies in `[p − ε − 1, p + ε]` (δ = 1 leaf), clamped to the model's
//! leaves. ε is therefore counted in leaves.
//!
//! Why fences and not every key with labels `j·S + r` (the lead's first
//! plan): a leaf that is empty at training contributes no key under that
//! scheme, and then a key later inserted into it can be predicted below its
//! window; dropping empty leaves at retraining instead would have to grow a
//! neighbour's fences, which breaks the invariant stale readers rely on
//! (a leaf's `fence_lo` never changes and its `fence_hi` only shrinks).
//! Fences have neither problem, retraining needs no leaf contents (only the
//! leaf list, which the freeze makes stable), and the PLR needs no explicit
//! labels.

use alloc::vec::Vec;

use crate::layout::{LayoutError, ModelSegment};
use crate::plr::{fit, PlrError};

/// Why a model could not be fitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FitError {
    /// The PLR refused the fences (unsorted, duplicate, ε too large).
    Plr(PlrError),
    /// A segment's parameters do not fit the pool's segment layout.
    Layout(LayoutError),
}

impl core::fmt::Display for FitError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            FitError::Plr(e) => write!(f, "PLR fit failed: {e}"),
            FitError::Layout(e) => write!(f, "model segment: {e}"),
        }
    }
}

impl core::error::Error for FitError {}

impl From<PlrError> for FitError {
    fn from(e: PlrError) -> Self {
        FitError::Plr(e)
    }
}

impl From<LayoutError> for FitError {
    fn from(e: LayoutError) -> Self {
        FitError::Layout(e)
    }
}

/// Fits the prediction segments of a model whose training leaves have the
/// (strictly increasing) `fences`; segment bases are leaf indices.
pub fn fit_model(fences: &[u64], epsilon: u64) -> Result<Vec<ModelSegment>, FitError> {
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
/// whose first key is `≤ key`, or the first) evaluated at `key`.
pub fn predict(segments: &[ModelSegment], key: u64) -> u64 {
    let i = segments
        .partition_point(|s| s.first_key() <= key)
        .saturating_sub(1);
    segments.get(i).map_or(0, |s| s.predict(key))
}

/// The window of training leaves `[lo, hi]` that holds the owner of `key`
/// (see the module docs), for a model of `leaves` training leaves.
pub fn window(segments: &[ModelSegment], epsilon: u64, leaves: u64, key: u64) -> (u64, u64) {
    let p = predict(segments, key);
    let last = leaves.saturating_sub(1);
    let lo = p.saturating_sub(epsilon.saturating_add(1)).min(last);
    let hi = p.saturating_add(epsilon).min(last);
    (lo, hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Every key between the fences lies in the window of its owner.
        #[test]
        fn owner_is_in_the_window(
            mut fences in proptest::collection::btree_set(any::<u64>(), 1..300),
            eps in 0u64..8,
            probes in proptest::collection::vec(any::<u64>(), 1..50),
        ) {
            fences.insert(0);
            let fences: Vec<u64> = fences.into_iter().collect();
            let segs = fit_model(&fences, eps).unwrap();
            for x in probes.into_iter().chain(fences.iter().copied()) {
                let owner = fences.partition_point(|&f| f <= x) as u64 - 1;
                let (lo, hi) = window(&segs, eps, fences.len() as u64, x);
                prop_assert!(lo <= owner && owner <= hi, "x {} owner {} window {:?}", x, owner, (lo, hi));
            }
        }
    }
}
