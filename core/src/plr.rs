//! Optimal streaming piecewise-linear regression (PLR) with a hard error bound.
//!
//! [`PlrFitter`] takes strictly increasing `u64` keys one at a time, numbers
//! them itself (the label of a key is its position inside its segment:
//! 0, 1, 2, …) and cuts them into the **fewest** segments such that every
//! key's predicted position is within `±ε` of its label. It is the convex
//! hull algorithm of O'Rourke (1981), in the form popularised by the
//! PGM-index: each key `(x, y)` contributes an upper point `(x, y + ε)` and a
//! lower point `(x, y − ε)`; the fitter keeps the lower convex hull of the
//! upper points, the upper convex hull of the lower points, and the two
//! extreme feasible lines (minimum and maximum slope). A key whose window
//! `[y − ε, y + ε]` lies wholly beyond one extreme line cannot join the
//! segment, so the segment closes and the key opens the next one. Each key
//! costs amortised O(1): hull points are pushed once and popped or skipped
//! once.
//!
//! Invariants:
//! - All geometry is exact integer arithmetic: coordinates are `u64` keys and
//!   `i64` labels, differences and cross products are `i128`, slopes are
//!   compared by cross multiplication. The bounds [`MAX_EPSILON`] and
//!   [`MAX_SEGMENT_LEN`] keep every product below 2^126, so nothing can
//!   overflow.
//! - Floating point appears only in the finished [`Segment`]; the parameters
//!   are the average of the two extreme lines, which is feasible because the
//!   set of feasible lines is convex, and they are evaluated relative to the
//!   segment's first key so no precision is lost to large absolute keys.
//!   Labels are integers and the float error is far below 0.5, so rounding the
//!   prediction to the nearest integer keeps `|predict(key) − label| ≤ ε`.
//! - [`Segment::predict`] is monotone non-decreasing in the key (slope ≥ 0,
//!   IEEE operations are monotone, the clamp is monotone).
//! - The fitter never allocates per key and works without `alloc`: hulls live
//!   in any [`HullStore`] (a caller's slice through [`SliceHull`], or a `Vec`
//!   with the `alloc` feature). Bad input is reported as a [`PlrError`],
//!   never a panic; a rejected key leaves the fitter as it was.

use core::fmt;

#[cfg(feature = "alloc")]
use alloc::vec::Vec;

/// Largest accepted error bound `ε`.
///
/// Together with [`MAX_SEGMENT_LEN`] it bounds every label difference by
/// 2^62, so products with key differences (< 2^64) stay below 2^126.
pub const MAX_EPSILON: u64 = 1 << 59;

/// Most keys one segment may hold; a segment that reaches it is closed and
/// the next key starts a new one. Unreachable in practice (2^61 keys); it
/// exists so that labels provably fit the exact arithmetic.
pub const MAX_SEGMENT_LEN: u64 = 1 << 61;

/// Hull points that may be dead before a growable store is compacted.
/// Compacting only once the dead prefix is also half the store keeps the
/// cost amortised O(1) per point.
const COMPACT_MIN_DEAD: usize = 64;

/// Why a fit could not proceed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlrError {
    /// `key` at stream position `index` is smaller than the key before it.
    Unsorted {
        /// Position of the offending key in the input (0-based).
        index: u64,
        /// The key accepted before it.
        prev: u64,
        /// The offending key.
        key: u64,
    },
    /// `key` at stream position `index` repeats the key before it.
    Duplicate {
        /// Position of the offending key in the input (0-based).
        index: u64,
        /// The repeated key.
        key: u64,
    },
    /// A caller-provided hull store of `capacity` points is too small for
    /// the current segment, even after dropping its dead prefix, when `key`
    /// at stream position `index` was pushed (it was not accepted).
    HullFull {
        /// Capacity of the store that overflowed.
        capacity: usize,
        /// Position of the key that did not fit (0-based).
        index: u64,
        /// The key that did not fit.
        key: u64,
    },
    /// A caller-provided output slice of `capacity` segments is full: the
    /// segment starting at `first_key` has no slot.
    OutputFull {
        /// Capacity of the output slice.
        capacity: usize,
        /// First key of the segment that found no slot.
        first_key: u64,
    },
    /// The requested error bound exceeds [`MAX_EPSILON`].
    EpsilonTooLarge {
        /// The requested bound.
        epsilon: u64,
        /// The largest accepted bound.
        max: u64,
    },
}

impl fmt::Display for PlrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PlrError::Unsorted { index, prev, key } => write!(
                f,
                "key {key} at index {index} is smaller than the previous key {prev}"
            ),
            PlrError::Duplicate { index, key } => {
                write!(f, "key {key} at index {index} repeats the previous key")
            }
            PlrError::HullFull {
                capacity,
                index,
                key,
            } => write!(
                f,
                "PLR hull store of {capacity} points is too small for the segment reaching key {key} at index {index}"
            ),
            PlrError::OutputFull {
                capacity,
                first_key,
            } => write!(
                f,
                "output slice of {capacity} segments is full: no slot for the segment starting at key {first_key}"
            ),
            PlrError::EpsilonTooLarge { epsilon, max } => {
                write!(f, "epsilon {epsilon} exceeds the maximum {max}")
            }
        }
    }
}

impl core::error::Error for PlrError {}

/// A point of the fit: a key and a label shifted by `±ε`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Point {
    /// The key.
    pub x: u64,
    /// Label ± ε, in positions local to the segment.
    pub y: i64,
}

/// One finished segment: a line over local positions `0..len`.
///
/// Cached as four 8-byte words (32 bytes). The default is an empty segment
/// (`len` 0), handy for output buffers.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Segment {
    /// The first training key of the segment (label 0).
    pub first_key: u64,
    /// Number of training keys in the segment (≥ 1).
    pub len: u64,
    /// Positions per key unit; never negative for a fitted segment.
    pub slope: f64,
    /// Predicted position of `first_key`.
    pub intercept: f64,
}

impl Segment {
    /// Predicted local position of `key`: `intercept + slope · (key −
    /// first_key)` rounded half up and clamped to `[0, len − 1]`.
    ///
    /// Keys below `first_key` predict the same as `first_key`. For every
    /// training key the result is within `±ε` of its label, and the result is
    /// monotone non-decreasing in `key`.
    #[inline]
    pub fn predict(&self, key: u64) -> u64 {
        let dx = key.saturating_sub(self.first_key) as f64;
        let v = self.intercept + self.slope * dx;
        // `as u64` saturates (negatives and NaN give 0) and truncates, which
        // is floor for the non-negative values that survive the clamp.
        let p = (v + 0.5) as u64;
        p.min(self.len.saturating_sub(1))
    }
}

/// Storage for one convex hull: a growable or fixed-capacity list of points.
///
/// The fitter only appends, truncates, clears and drops a prefix, so a
/// plain slice with a length is enough.
pub trait HullStore {
    /// The stored points, oldest first.
    fn points(&self) -> &[Point];
    /// Most points the store can hold.
    fn capacity(&self) -> usize;
    /// Appends `p`, or hands it back when the store is full.
    fn try_push(&mut self, p: Point) -> Result<(), Point>;
    /// Keeps the first `len` points.
    fn truncate(&mut self, len: usize);
    /// Removes every point.
    fn clear(&mut self);
    /// Removes the first `n` points, shifting the rest to the front.
    fn drop_front(&mut self, n: usize);
}

/// A hull store over a caller's slice, for use without `alloc`.
#[derive(Debug)]
pub struct SliceHull<'a> {
    buf: &'a mut [Point],
    len: usize,
}

impl<'a> SliceHull<'a> {
    /// An empty store that can hold `buf.len()` points.
    pub fn new(buf: &'a mut [Point]) -> Self {
        SliceHull { buf, len: 0 }
    }
}

impl HullStore for SliceHull<'_> {
    #[inline]
    fn points(&self) -> &[Point] {
        &self.buf[..self.len]
    }
    #[inline]
    fn capacity(&self) -> usize {
        self.buf.len()
    }
    #[inline]
    fn try_push(&mut self, p: Point) -> Result<(), Point> {
        match self.buf.get_mut(self.len) {
            Some(slot) => {
                *slot = p;
                self.len += 1;
                Ok(())
            }
            None => Err(p),
        }
    }
    #[inline]
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
    #[inline]
    fn clear(&mut self) {
        self.len = 0;
    }
    fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.buf.copy_within(n..self.len, 0);
        self.len -= n;
    }
}

#[cfg(feature = "alloc")]
impl HullStore for Vec<Point> {
    #[inline]
    fn points(&self) -> &[Point] {
        self
    }
    #[inline]
    fn capacity(&self) -> usize {
        usize::MAX
    }
    #[inline]
    fn try_push(&mut self, p: Point) -> Result<(), Point> {
        self.push(p);
        Ok(())
    }
    #[inline]
    fn truncate(&mut self, len: usize) {
        Vec::truncate(self, len);
    }
    #[inline]
    fn clear(&mut self) {
        Vec::clear(self);
    }
    fn drop_front(&mut self, n: usize) {
        self.drain(..n.min(self.len()));
    }
}

/// Direction `dy/dx` between two points, `dx > 0`, compared exactly.
///
/// `dy` fits `i64` (|dy| < 2^62, see [`MAX_EPSILON`]) and `dx` fits `u64`,
/// so each product is one widening multiply and fits `i128`.
#[derive(Clone, Copy)]
struct Slope {
    dx: u64,
    dy: i64,
}

/// `dy · dx` without overflow.
#[inline(always)]
fn wide(dy: i64, dx: u64) -> i128 {
    dy as i128 * dx as i128
}

impl Slope {
    /// Slope from `a` to `b`; callers guarantee `a.x < b.x`.
    #[inline(always)]
    fn between(a: Point, b: Point) -> Slope {
        Slope {
            dx: b.x - a.x,
            dy: b.y - a.y,
        }
    }

    /// `self < other`, by cross multiplication (both `dx` are positive).
    #[inline(always)]
    fn lt(self, other: Slope) -> bool {
        wide(self.dy, other.dx) < wide(other.dy, self.dx)
    }
}

/// Cross product `(a − o) × (b − o)`: positive for a left turn.
#[inline(always)]
fn cross(o: Point, a: Point, b: Point) -> i128 {
    let s = Slope::between(o, a);
    let t = Slope::between(o, b);
    wide(t.dy, s.dx) - wide(s.dy, t.dx)
}

/// An extreme line in the form the per-key test needs: through `anchor`
/// with direction `dir`, plus `2ε · dir.dx` so that both ends of a key's
/// window are tested with one pair of multiplies.
#[derive(Clone, Copy, Debug, Default)]
struct Line {
    anchor: Point,
    dx: u64,
    dy: i64,
    /// `2ε · dx`.
    span: i128,
}

impl Line {
    /// The line from `from` to `anchor` (`from.x < anchor.x`).
    #[inline(always)]
    fn new(from: Point, anchor: Point, eps: i64) -> Line {
        let d = Slope::between(from, anchor);
        Line {
            anchor,
            dx: d.dx,
            dy: d.dy,
            span: wide(2 * eps, d.dx),
        }
    }

    /// `(q − anchor) × dir` scaled: positive when `q` (right of the anchor)
    /// lies above the line, zero on it. With the bounds of [`MAX_EPSILON`]
    /// and [`MAX_SEGMENT_LEN`] each product is below 1.5 · 2^125 and `span`
    /// below 2^124, so `above(q) + span` cannot overflow either.
    #[inline(always)]
    fn above(&self, q: Point) -> i128 {
        wide(q.y - self.anchor.y, self.dx) - wide(self.dy, q.x - self.anchor.x)
    }
}

/// The line through `a` and `b` (`a.x < b.x`) as `(slope, value at x0)`,
/// with `x0 ≤ a.x`. The value is formed as one exact fraction and rounded
/// once, so large absolute keys cost no precision.
fn line_at(a: Point, b: Point, x0: u64) -> (f64, f64) {
    let s = Slope::between(a, b);
    let num = wide(a.y, s.dx) - wide(s.dy, a.x - x0);
    let den = s.dx as f64;
    (s.dy as f64 / den, num as f64 / den)
}

/// A hull store of `capacity` points overflowed; [`PlrFitter::push`] names
/// the key that caused it ([`PlrError::HullFull`]).
#[derive(Clone, Copy, Debug)]
struct HullOverflow {
    capacity: usize,
}

impl HullOverflow {
    /// The error of `key`, at stream position `index`, not fitting.
    fn at(self, index: u64, key: u64) -> PlrError {
        PlrError::HullFull {
            capacity: self.capacity,
            index,
            key,
        }
    }
}

/// Appends `p` to a hull whose live points start at `*start`, dropping the
/// dead prefix first when the store is full or the prefix has grown large.
#[inline]
fn push_live<S: HullStore>(store: &mut S, start: &mut usize, p: Point) -> Result<(), HullOverflow> {
    let len = store.points().len();
    if len >= store.capacity() || (*start >= COMPACT_MIN_DEAD && *start * 2 >= len) {
        store.drop_front(*start);
        *start = 0;
    }
    store.try_push(p).map_err(|_| HullOverflow {
        capacity: store.capacity(),
    })
}

/// Streaming optimal PLR over strictly increasing keys.
///
/// Push keys with [`push`](Self::push); each call returns the segment it
/// closed, if any. [`finish`](Self::finish) returns the last segment and
/// resets the fitter for a new stream.
#[derive(Debug)]
pub struct PlrFitter<S: HullStore> {
    eps: i64,
    upper: S,
    lower: S,
    upper_start: usize,
    lower_start: usize,
    /// `[U_a, L_c, L_b, U_d]`: the minimum-slope line runs `U_a → L_b`, the
    /// maximum-slope line `L_c → U_d` (U = upper point, L = lower point).
    rect: [Point; 4],
    /// `U_a → L_b`, anchored at `L_b`.
    min_line: Line,
    /// `L_c → U_d`, anchored at `U_d`.
    max_line: Line,
    first_key: u64,
    last_key: u64,
    /// Keys in the open segment.
    n: u64,
    /// Keys accepted since the stream began.
    seen: u64,
}

#[cfg(feature = "alloc")]
impl PlrFitter<Vec<Point>> {
    /// A fitter with growable hulls and error bound `epsilon`.
    pub fn new(epsilon: u64) -> Result<Self, PlrError> {
        Self::with_storage(epsilon, Vec::new(), Vec::new())
    }
}

impl<S: HullStore> PlrFitter<S> {
    /// A fitter with error bound `epsilon` (0 allowed: the keys of a segment
    /// must then be exactly collinear) keeping its hulls in `upper` and
    /// `lower`. Both stores are cleared.
    pub fn with_storage(epsilon: u64, mut upper: S, mut lower: S) -> Result<Self, PlrError> {
        if epsilon > MAX_EPSILON {
            return Err(PlrError::EpsilonTooLarge {
                epsilon,
                max: MAX_EPSILON,
            });
        }
        upper.clear();
        lower.clear();
        Ok(PlrFitter {
            eps: epsilon as i64,
            upper,
            lower,
            upper_start: 0,
            lower_start: 0,
            rect: [Point::default(); 4],
            min_line: Line::default(),
            max_line: Line::default(),
            first_key: 0,
            last_key: 0,
            n: 0,
            seen: 0,
        })
    }

    /// The error bound.
    pub fn epsilon(&self) -> u64 {
        self.eps as u64
    }

    /// Keys accepted since the stream began.
    pub fn keys_seen(&self) -> u64 {
        self.seen
    }

    /// Adds the next key. Returns the segment that this key closed, if it
    /// could not join the open one. On error nothing changes.
    #[inline]
    pub fn push(&mut self, key: u64) -> Result<Option<Segment>, PlrError> {
        if self.seen > 0 && key <= self.last_key {
            return Err(if key == self.last_key {
                PlrError::Duplicate {
                    index: self.seen,
                    key,
                }
            } else {
                PlrError::Unsorted {
                    index: self.seen,
                    prev: self.last_key,
                    key,
                }
            });
        }
        let index = self.seen;
        let full = move |o: HullOverflow| o.at(index, key);
        if self.n >= 2 && self.n < MAX_SEGMENT_LEN {
            if self.extend(key).map_err(full)? {
                self.accept(key);
                return Ok(None);
            }
        } else if self.n == 1 {
            self.second(key).map_err(full)?;
            self.accept(key);
            return Ok(None);
        }
        // Open a new segment with `key`, closing the current one (if any).
        if self.upper.capacity() == 0 || self.lower.capacity() == 0 {
            let capacity = self.upper.capacity().min(self.lower.capacity());
            return Err(full(HullOverflow { capacity }));
        }
        let closed = (self.n > 0).then(|| self.segment());
        self.start(key);
        self.accept(key);
        Ok(closed)
    }

    /// Closes the open segment and returns it (`None` if no key is pending),
    /// then resets the fitter for a new stream.
    pub fn finish(&mut self) -> Option<Segment> {
        let last = (self.n > 0).then(|| self.segment());
        self.upper.clear();
        self.lower.clear();
        self.upper_start = 0;
        self.lower_start = 0;
        self.n = 0;
        self.seen = 0;
        last
    }

    #[inline(always)]
    fn accept(&mut self, key: u64) {
        self.last_key = key;
        self.n += 1;
        self.seen += 1;
    }

    fn start(&mut self, key: u64) {
        let u = Point {
            x: key,
            y: self.eps,
        };
        let l = Point {
            x: key,
            y: -self.eps,
        };
        self.upper.clear();
        self.lower.clear();
        // Capacity ≥ 1 was checked by the caller.
        let _ = self.upper.try_push(u);
        let _ = self.lower.try_push(l);
        self.upper_start = 0;
        self.lower_start = 0;
        self.rect[0] = u;
        self.rect[1] = l;
        self.first_key = key;
        self.n = 0;
    }

    /// The second key of a segment always fits: any two points lie on a line.
    fn second(&mut self, key: u64) -> Result<(), HullOverflow> {
        for capacity in [self.upper.capacity(), self.lower.capacity()] {
            if capacity < 2 {
                return Err(HullOverflow { capacity });
            }
        }
        let u = Point {
            x: key,
            y: 1 + self.eps,
        };
        let l = Point {
            x: key,
            y: 1 - self.eps,
        };
        push_live(&mut self.upper, &mut self.upper_start, u)?;
        push_live(&mut self.lower, &mut self.lower_start, l)?;
        self.rect[2] = l;
        self.rect[3] = u;
        self.min_line = Line::new(self.rect[0], l, self.eps);
        self.max_line = Line::new(self.rect[1], u, self.eps);
        Ok(())
    }

    /// Tries to add `key` as the `n`-th point (n ≥ 2) of the open segment.
    /// `Ok(false)`: it does not fit and nothing changed.
    #[inline]
    fn extend(&mut self, key: u64) -> Result<bool, HullOverflow> {
        let y = self.n as i64;
        let u = Point {
            x: key,
            y: y + self.eps,
        };
        let l = Point {
            x: key,
            y: y - self.eps,
        };
        // Where the window's ends `l` and `u = l + 2ε` lie relative to the
        // two extreme lines (the window lies right of both anchors).
        let below_min = self.min_line.above(l);
        let below_max = self.max_line.above(l);
        // The window lies wholly below the minimum-slope line or wholly
        // above the maximum-slope line: no line reaches it.
        if below_min + self.min_line.span < 0 || below_max > 0 {
            return Ok(false);
        }
        // `u` below the maximum-slope line lowers the maximum slope; `l`
        // above the minimum-slope line raises the minimum slope.
        let tighten_max = below_max + self.max_line.span < 0;
        let tighten_min = below_min > 0;
        if !(tighten_max || tighten_min) {
            return Ok(true);
        }
        let [ua, lc, _, _] = self.rect;

        // Work out every change first, so a full store fails without
        // touching the state.
        let up = self.upper.points();
        let lo = self.lower.points();
        let mut lower_start = self.lower_start;
        let mut upper_end = up.len();
        let mut new_lc = lc;
        if tighten_max {
            // New maximum slope: the tangent from `u` to the lower points'
            // hull, i.e. the smallest slope from a lower point to `u`.
            let live = &lo[lower_start..]; // never empty: start < len
            let mut best = 0;
            let mut best_slope = Slope::between(live[0], u);
            for (i, &p) in live.iter().enumerate().skip(1) {
                let s = Slope::between(p, u);
                if best_slope.lt(s) {
                    break;
                }
                best = i;
                best_slope = s;
            }
            lower_start += best;
            new_lc = live[best];
            // `u` joins the lower hull of the upper points.
            while upper_end >= self.upper_start + 2
                && cross(up[upper_end - 2], up[upper_end - 1], u) <= 0
            {
                upper_end -= 1;
            }
        }
        let mut upper_start = self.upper_start;
        let mut lower_end = lo.len();
        let mut new_ua = ua;
        if tighten_min {
            // New minimum slope: the largest slope from an upper point to
            // `l` (the upper hull as updated above, without `u` itself).
            let live = &up[upper_start..upper_end]; // start < end
            let mut best = 0;
            let mut best_slope = Slope::between(live[0], l);
            for (i, &p) in live.iter().enumerate().skip(1) {
                let s = Slope::between(p, l);
                if s.lt(best_slope) {
                    break;
                }
                best = i;
                best_slope = s;
            }
            upper_start += best;
            new_ua = live[best];
            while lower_end >= lower_start + 2
                && cross(lo[lower_end - 2], lo[lower_end - 1], l) >= 0
            {
                lower_end -= 1;
            }
        }
        if tighten_max && upper_end + 1 - upper_start > self.upper.capacity() {
            return Err(HullOverflow {
                capacity: self.upper.capacity(),
            });
        }
        if tighten_min && lower_end + 1 - lower_start > self.lower.capacity() {
            return Err(HullOverflow {
                capacity: self.lower.capacity(),
            });
        }

        self.upper_start = upper_start;
        self.lower_start = lower_start;
        if tighten_max {
            self.upper.truncate(upper_end);
            push_live(&mut self.upper, &mut self.upper_start, u)?;
            self.rect[1] = new_lc;
            self.rect[3] = u;
            self.max_line = Line::new(new_lc, u, self.eps);
        }
        if tighten_min {
            self.lower.truncate(lower_end);
            push_live(&mut self.lower, &mut self.lower_start, l)?;
            self.rect[0] = new_ua;
            self.rect[2] = l;
            self.min_line = Line::new(new_ua, l, self.eps);
        }
        Ok(true)
    }

    /// The open segment's parameters (requires `n ≥ 1`).
    fn segment(&self) -> Segment {
        let mut seg = Segment {
            first_key: self.first_key,
            len: self.n,
            slope: 0.0,
            intercept: 0.0,
        };
        if self.n < 2 {
            return seg;
        }
        let [ua, lc, lb, ud] = self.rect;
        let (s1, v1) = line_at(ua, lb, self.first_key);
        let (s2, v2) = line_at(lc, ud, self.first_key);
        let slope = (s1 + s2) * 0.5;
        if slope >= 0.0 {
            seg.slope = slope;
            seg.intercept = (v1 + v2) * 0.5;
        } else {
            // A feasible line falls, so the last label is below 2ε and the
            // flat line through the middle label is feasible too.
            seg.intercept = (self.n - 1) as f64 * 0.5;
        }
        seg
    }
}

/// Fits `keys` (strictly increasing) with error bound `epsilon`, handing each
/// segment to `emit` in key order; `emit` may stop the fit with an error.
/// Hulls live in the caller's `upper` and `lower` slices. Returns the number
/// of segments.
pub fn fit_each<F>(
    keys: &[u64],
    epsilon: u64,
    upper: &mut [Point],
    lower: &mut [Point],
    mut emit: F,
) -> Result<usize, PlrError>
where
    F: FnMut(Segment) -> Result<(), PlrError>,
{
    let mut fitter =
        PlrFitter::with_storage(epsilon, SliceHull::new(upper), SliceHull::new(lower))?;
    run(&mut fitter, keys, &mut emit)
}

/// Fits `keys` into the caller's `out` slice (no allocation), returning how
/// many segments were written; [`PlrError::OutputFull`] if `out` is short.
pub fn fit_into(
    keys: &[u64],
    epsilon: u64,
    upper: &mut [Point],
    lower: &mut [Point],
    out: &mut [Segment],
) -> Result<usize, PlrError> {
    let capacity = out.len();
    let mut slots = out.iter_mut();
    fit_each(keys, epsilon, upper, lower, |seg| {
        let slot = slots.next().ok_or(PlrError::OutputFull {
            capacity,
            first_key: seg.first_key,
        })?;
        *slot = seg;
        Ok(())
    })
}

/// Fits `keys` (strictly increasing) with error bound `epsilon`.
/// Empty input gives no segments.
#[cfg(feature = "alloc")]
pub fn fit(keys: &[u64], epsilon: u64) -> Result<Vec<Segment>, PlrError> {
    let mut fitter = PlrFitter::new(epsilon)?;
    let mut out = Vec::new();
    run(&mut fitter, keys, &mut |seg| {
        out.push(seg);
        Ok(())
    })?;
    Ok(out)
}

fn run<S: HullStore>(
    fitter: &mut PlrFitter<S>,
    keys: &[u64],
    emit: &mut dyn FnMut(Segment) -> Result<(), PlrError>,
) -> Result<usize, PlrError> {
    let mut count = 0;
    for &key in keys {
        if let Some(seg) = fitter.push(key)? {
            emit(seg)?;
            count += 1;
        }
    }
    if let Some(seg) = fitter.finish() {
        emit(seg)?;
        count += 1;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    /// Without `alloc`, the tests fit through caller slices large enough
    /// for any hull (a hull never holds more points than its segment).
    #[cfg(not(feature = "alloc"))]
    fn fit(keys: &[u64], epsilon: u64) -> Result<Vec<Segment>, PlrError> {
        let mut up = vec![Point::default(); keys.len() + 1];
        let mut lo = vec![Point::default(); keys.len() + 1];
        let mut out = Vec::new();
        fit_each(keys, epsilon, &mut up, &mut lo, |s| {
            out.push(s);
            Ok(())
        })?;
        Ok(out)
    }

    /// Exact check: does the line through `(xa, ya)`, `(xb, yb)` pass within
    /// `±eps` of every `(x, label)` in `pts`?
    fn line_fits(xa: u64, ya: i128, xb: u64, yb: i128, pts: &[(u64, i128)], eps: i128) -> bool {
        let dx = xb as i128 - xa as i128;
        let dy = yb - ya;
        pts.iter().all(|&(x, y)| {
            // (line(x) − y)·dx = (ya − y)·dx + dy·(x − xa)
            let d = (ya - y) * dx + dy * (x as i128 - xa as i128);
            d.abs() <= eps * dx
        })
    }

    /// Brute force: some line fits all points within ±eps. A non-empty
    /// bounded feasible region has a vertex, which is a line through two
    /// window ends of different keys.
    fn feasible(pts: &[(u64, i128)], eps: i128) -> bool {
        if pts.len() <= 1 {
            return true;
        }
        for i in 0..pts.len() {
            for j in i + 1..pts.len() {
                for si in [-eps, eps] {
                    for sj in [-eps, eps] {
                        let (xa, ya) = pts[i];
                        let (xb, yb) = pts[j];
                        if line_fits(xa, ya + si, xb, yb + sj, pts, eps) {
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// Greedy maximal segments; optimal because feasibility is hereditary.
    /// Returns the segments' `(start index, len)`.
    fn brute_segments(keys: &[u64], eps: u64) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = 0;
        while start < keys.len() {
            let mut end = start + 1;
            let mut pts: Vec<(u64, i128)> = vec![(keys[start], 0)];
            while end < keys.len() {
                pts.push((keys[end], (end - start) as i128));
                if !feasible(&pts, eps as i128) {
                    break;
                }
                end += 1;
            }
            out.push((start, end - start));
            start = end;
        }
        out
    }

    fn check_bound(keys: &[u64], segs: &[Segment], eps: u64) {
        let mut i = 0;
        for seg in segs {
            assert!(seg.len >= 1);
            assert_eq!(seg.first_key, keys[i]);
            assert!(seg.slope >= 0.0 && seg.slope.is_finite());
            assert!(seg.intercept.is_finite());
            let mut prev = 0;
            for label in 0..seg.len {
                let key = keys[i + label as usize];
                let p = seg.predict(key);
                assert!(
                    p.abs_diff(label) <= eps,
                    "key {key} label {label} predicted {p} eps {eps} seg {seg:?}"
                );
                assert!(p >= prev, "prediction not monotone at {key}");
                prev = p;
            }
            i += seg.len as usize;
        }
        assert_eq!(i, keys.len());
    }

    fn sorted_unique(mut v: Vec<u64>) -> Vec<u64> {
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Small key sets: tiny values, values near u64::MAX, and spread ones.
    fn small_keys() -> impl Strategy<Value = Vec<u64>> {
        prop_oneof![
            prop::collection::vec(0u64..200, 0..40).prop_map(sorted_unique),
            prop::collection::vec(0u64..200, 0..40)
                .prop_map(|v| sorted_unique(v.into_iter().map(|d| u64::MAX - d).collect())),
            prop::collection::vec(any::<u64>(), 0..40).prop_map(sorted_unique),
            // Runs of steps with occasional jumps: many near-collinear keys.
            prop::collection::vec((1u64..4, prop::bool::weighted(0.1)), 0..40)
                .prop_map(|v| {
                    let mut k = 0u64;
                    v.into_iter()
                        .map(|(step, jump)| {
                            k = k.saturating_add(if jump { step * 50 } else { step });
                            k
                        })
                        .collect::<Vec<_>>()
                })
                .prop_map(sorted_unique),
        ]
    }

    /// Larger key sets with huge gaps and dense runs.
    fn big_keys() -> impl Strategy<Value = Vec<u64>> {
        prop::collection::vec((any::<u64>(), 0u64..300, 1u64..5), 1..20).prop_map(|runs| {
            let mut v = Vec::new();
            for (base, len, step) in runs {
                for j in 0..len {
                    v.push(base.saturating_add(j * step));
                }
            }
            v.push(0);
            v.push(u64::MAX);
            sorted_unique(v)
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(192))]

        #[test]
        fn matches_brute_force(keys in small_keys(), eps in 0u64..4) {
            let segs = fit(&keys, eps).unwrap();
            let brute = brute_segments(&keys, eps);
            let got: Vec<(usize, usize)> = {
                let mut start = 0;
                segs.iter().map(|s| { let r = (start, s.len as usize); start += s.len as usize; r }).collect()
            };
            prop_assert_eq!(got, brute);
            check_bound(&keys, &segs, eps);
        }

        #[test]
        fn error_bound_holds(keys in big_keys(), eps in 0u64..64) {
            let segs = fit(&keys, eps).unwrap();
            check_bound(&keys, &segs, eps);
        }

        #[test]
        fn slice_storage_matches_vec(keys in big_keys(), eps in 0u64..16) {
            let want = fit(&keys, eps).unwrap();
            let mut up = [Point::default(); 64];
            let mut lo = [Point::default(); 64];
            let mut out = vec![Segment::default(); keys.len()];
            match fit_into(&keys, eps, &mut up, &mut lo, &mut out) {
                Ok(n) => prop_assert_eq!(&out[..n], &want[..]),
                Err(PlrError::HullFull { capacity, index, key }) => {
                    prop_assert_eq!(capacity, 64);
                    prop_assert_eq!(keys[index as usize], key);
                }
                Err(e) => prop_assert!(false, "unexpected {}", e),
            }
        }
    }

    #[test]
    fn empty_and_single() {
        assert!(fit(&[], 4).unwrap().is_empty());
        for key in [0, 7, u64::MAX] {
            let segs = fit(&[key], 0).unwrap();
            assert_eq!(
                segs,
                vec![Segment {
                    first_key: key,
                    len: 1,
                    slope: 0.0,
                    intercept: 0.0
                }]
            );
            assert_eq!(segs[0].predict(0), 0);
            assert_eq!(segs[0].predict(u64::MAX), 0);
        }
    }

    #[test]
    fn extremes_of_the_key_space() {
        let keys = [0, 1, 2, u64::MAX / 2, u64::MAX - 1, u64::MAX];
        for eps in 0..4 {
            let segs = fit(&keys, eps).unwrap();
            check_bound(&keys, &segs, eps);
        }
        // Two keys always share a segment, however far apart.
        let segs = fit(&[0, u64::MAX], 0).unwrap();
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].predict(0), 0);
        assert_eq!(segs[0].predict(u64::MAX), 1);
    }

    #[test]
    fn epsilon_zero_needs_collinear_keys() {
        let keys: Vec<u64> = (0..100).map(|i| 1000 + 3 * i).collect();
        assert_eq!(fit(&keys, 0).unwrap().len(), 1);
        let segs = fit(&[0, 1, 2, 4, 6, 8], 0).unwrap();
        let lens: Vec<u64> = segs.iter().map(|s| s.len).collect();
        assert_eq!(lens, vec![3, 3]);
    }

    #[test]
    fn rejects_bad_order() {
        assert_eq!(
            fit(&[1, 5, 3], 2),
            Err(PlrError::Unsorted {
                index: 2,
                prev: 5,
                key: 3
            })
        );
        assert_eq!(
            fit(&[1, 5, 5], 2),
            Err(PlrError::Duplicate { index: 2, key: 5 })
        );
        assert_eq!(
            fit(&[0, 0], 2),
            Err(PlrError::Duplicate { index: 1, key: 0 })
        );
        // A rejected key leaves the fitter usable.
        let (mut up, mut lo) = ([Point::default(); 4], [Point::default(); 4]);
        let mut f =
            PlrFitter::with_storage(1, SliceHull::new(&mut up), SliceHull::new(&mut lo)).unwrap();
        f.push(10).unwrap();
        assert!(f.push(9).is_err());
        assert!(f.push(10).is_err());
        f.push(11).unwrap();
        assert_eq!(f.finish().unwrap().len, 2);
    }

    #[test]
    fn errors_name_the_key_and_its_index() {
        let text = |e: PlrError| {
            use core::fmt::Write;
            let mut s = std::string::String::new();
            write!(s, "{e}").unwrap();
            s
        };
        let unsorted = fit(&[1, 5, 3], 2).unwrap_err();
        assert_eq!(
            text(unsorted),
            "key 3 at index 2 is smaller than the previous key 5"
        );
        let duplicate = fit(&[1, 5, 5], 2).unwrap_err();
        assert_eq!(text(duplicate), "key 5 at index 2 repeats the previous key");
        let full = PlrError::HullFull {
            capacity: 3,
            index: 7,
            key: 42,
        };
        assert!(text(full).contains("key 42 at index 7"), "{}", text(full));
        let out = PlrError::OutputFull {
            capacity: 2,
            first_key: 9,
        };
        assert!(text(out).contains("starting at key 9"), "{}", text(out));
    }

    #[test]
    fn rejects_huge_epsilon() {
        assert!(fit(&[1], MAX_EPSILON).is_ok());
        assert_eq!(
            fit(&[1], MAX_EPSILON + 1),
            Err(PlrError::EpsilonTooLarge {
                epsilon: MAX_EPSILON + 1,
                max: MAX_EPSILON
            })
        );
        let keys = [0, 5, 6, 100, u64::MAX];
        let segs = fit(&keys, MAX_EPSILON).unwrap();
        assert_eq!(segs.len(), 1);
        check_bound(&keys, &segs, MAX_EPSILON);
    }

    #[test]
    fn tiny_hull_storage() {
        // A convex run of keys grows the hulls: gaps 1, 2, 3, …
        let keys: Vec<u64> = (0..60u64).map(|i| i * (i + 1) / 2).collect();
        let want = fit(&keys, 8).unwrap();
        let mut out = vec![Segment::default(); 60];
        // Too small stores fail with the capacity that overflowed; large
        // enough ones give exactly the growable result.
        let mut smallest_ok = None;
        for cap in 0..64 {
            let mut up = vec![Point::default(); cap];
            let mut lo = vec![Point::default(); cap];
            match fit_into(&keys, 8, &mut up, &mut lo, &mut out) {
                Ok(n) => {
                    assert_eq!(&out[..n], &want[..]);
                    smallest_ok.get_or_insert(cap);
                }
                Err(PlrError::HullFull {
                    capacity,
                    index,
                    key,
                }) => {
                    assert_eq!(capacity, cap);
                    // The error names the key that did not fit, where it was.
                    assert_eq!(keys[index as usize], key);
                    assert!(smallest_ok.is_none(), "fails at {cap} after succeeding");
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        let smallest_ok = smallest_ok.unwrap();
        assert!(
            smallest_ok > 2,
            "this curve needs more than two hull points"
        );
        let mut up = [Point::default(); 64];
        let mut lo = [Point::default(); 64];
        let n = fit_into(&keys, 8, &mut up, &mut lo, &mut out).unwrap();
        assert_eq!(&out[..n], &want[..]);
        assert_eq!(
            fit_into(&keys, 8, &mut up, &mut lo, &mut out[..n - 1]),
            Err(PlrError::OutputFull {
                capacity: n - 1,
                first_key: want[n - 1].first_key
            })
        );
    }

    #[test]
    fn hull_full_leaves_fitter_intact() {
        let keys: Vec<u64> = (0..60u64).map(|i| i * (i + 1) / 2).collect();
        let mut up = [Point::default(); 3];
        let mut lo = [Point::default(); 3];
        let mut f =
            PlrFitter::with_storage(8, SliceHull::new(&mut up), SliceHull::new(&mut lo)).unwrap();
        let mut accepted = 0;
        for &k in &keys {
            match f.push(k) {
                Ok(_) => accepted += 1,
                Err(e) => {
                    assert_eq!(
                        e,
                        PlrError::HullFull {
                            capacity: 3,
                            index: accepted as u64,
                            key: k
                        }
                    );
                    // The same key fails again the same way.
                    assert_eq!(f.push(k), Err(e));
                    break;
                }
            }
        }
        assert!(accepted < keys.len());
        assert_eq!(f.keys_seen(), accepted as u64);
    }

    #[test]
    fn callback_sees_segments_in_order() {
        let keys: Vec<u64> = (0..1000u64).map(|i| i * i).collect();
        let want = fit(&keys, 4).unwrap();
        let mut up = [Point::default(); 128];
        let mut lo = [Point::default(); 128];
        let mut got = Vec::new();
        let n = fit_each(&keys, 4, &mut up, &mut lo, |s| {
            got.push(s);
            Ok(())
        })
        .unwrap();
        assert_eq!(n, want.len());
        assert_eq!(got, want);
    }
}
