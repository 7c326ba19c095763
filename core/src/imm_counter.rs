//! Order-independent completion counting per 32-bit immediate.
//!
//! A receiver learns that a transfer has landed by counting the writes that
//! carried the transfer's immediate value. Transports such as EFA/SRD
//! deliver those writes in any order, and an expectation may be armed before
//! or after the first of them arrives, so the counter keeps, per immediate,
//! the number of arrivals not yet consumed plus at most one armed
//! expectation `(target, token)`.
//!
//! Invariant, for every tracked immediate: if an expectation is armed then
//! `count < target`. An expectation fires exactly once — in the call
//! (`arrive` or `expect`) that makes `count >= target` — and firing consumes
//! `target` arrivals, so surplus arrivals carry over to the next expectation
//! on the same immediate. An immediate with no arrivals left and nothing
//! armed takes no room.
//!
//! Two stores share that logic: [`FixedImmCounter`] (no allocation, at most
//! `N` immediates tracked at once) and, with the `alloc` feature,
//! [`ImmCounterMap`] (a `BTreeMap`, never full).

use core::fmt;

/// Why an [`ImmCounter`] refused an operation; carries back what was refused.
///
/// For [`ImmCounter::expect`] the payload is the caller's token, so nothing
/// is lost; for [`ImmCounter::arrive`] it is `()` and the caller must treat
/// the refused arrival as described on that method.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ImmError<T> {
    /// A fixed-capacity counter already tracks as many immediates as it can
    /// hold and this immediate is not one of them.
    Full(T),
    /// An expectation is already armed on this immediate.
    AlreadyArmed(T),
    /// The arrival would push the un-consumed count past `u32::MAX`; the
    /// count was left unchanged.
    Overflow(T),
}

impl<T> ImmError<T> {
    /// The value that was refused (the token, or `()` for an arrival).
    pub fn into_inner(self) -> T {
        match self {
            ImmError::Full(t) | ImmError::AlreadyArmed(t) | ImmError::Overflow(t) => t,
        }
    }
}

impl<T> fmt::Display for ImmError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImmError::Full(_) => {
                f.write_str("immediate counter is full: no room to track a new immediate")
            }
            ImmError::AlreadyArmed(_) => {
                f.write_str("an expectation is already armed on this immediate")
            }
            ImmError::Overflow(_) => {
                f.write_str("arrival count for this immediate would overflow u32")
            }
        }
    }
}

impl<T: fmt::Debug> core::error::Error for ImmError<T> {}

/// Counts arrivals per immediate and fires expectations once their target is
/// reached, whatever the order of arrivals and expectations.
///
/// `T` is the caller's token (a callback id, a flag index, ...), handed back
/// when its expectation fires, is cancelled, or is refused.
pub trait ImmCounter<T> {
    /// Records `n` arrivals of `imm`; returns the token of the expectation
    /// this completed, if any (at most one: there is at most one armed
    /// expectation per immediate).
    ///
    /// On `Err` nothing changed and the arrivals were **not** recorded:
    /// [`ImmError::Full`] (a fixed counter has no room for a new immediate)
    /// or [`ImmError::Overflow`] (more than `u32::MAX` arrivals outstanding).
    /// The caller must not drop them silently: report them like an error
    /// completion of the transfer that carried `imm` (the expectation on
    /// that immediate, if one is armed later, would otherwise wait forever),
    /// or retry after freeing room (e.g. after cancelling stale
    /// expectations).
    fn arrive(&mut self, imm: u32, n: u32) -> Result<Option<T>, ImmError<()>>;

    /// Arms the expectation "`target` arrivals of `imm`" with `token`.
    ///
    /// Arrivals recorded before this call count. Returns `Ok(Some(token))`
    /// if the expectation is already satisfied (it fired immediately, which
    /// always happens for `target == 0`, and consumed `target` arrivals),
    /// `Ok(None)` if it is now armed. A second expectation on an immediate
    /// that has one is refused with [`ImmError::AlreadyArmed`]; a fixed
    /// counter without room refuses with [`ImmError::Full`]; both hand the
    /// token back.
    fn expect(&mut self, imm: u32, target: u32, token: T) -> Result<Option<T>, ImmError<T>>;

    /// The current un-consumed count for `imm` (0 if untracked).
    fn count(&self, imm: u32) -> u32;

    /// Whether an expectation is armed on `imm`.
    fn is_armed(&self, imm: u32) -> bool;

    /// Removes the armed expectation on `imm` (engine shutdown,
    /// cancellation), returning its token. Arrivals already counted stay.
    fn cancel(&mut self, imm: u32) -> Option<T>;

    /// The armed expectation on `imm`, as `(target, token)`.
    fn armed(&self, imm: u32) -> Option<(u32, &T)>;

    /// Removes the armed expectation on `imm` only if `pred` accepts its
    /// token (a deadline that belongs to that expectation and not to a
    /// later one on the same immediate); returns the token removed.
    /// Arrivals already counted stay.
    fn cancel_if(&mut self, imm: u32, pred: impl FnOnce(&T) -> bool) -> Option<T>
    where
        Self: Sized,
    {
        match self.armed(imm) {
            Some((_, t)) if pred(t) => self.cancel(imm),
            _ => None,
        }
    }
}

/// The state of one tracked immediate; the logic both stores share.
#[derive(Clone, Debug)]
struct Slot<T> {
    count: u32,
    /// `(target, token)`; when `Some`, `count < target`.
    armed: Option<(u32, T)>,
}

impl<T> Slot<T> {
    const fn new() -> Self {
        Slot {
            count: 0,
            armed: None,
        }
    }

    /// Whether the slot can be forgotten without losing information.
    fn is_idle(&self) -> bool {
        self.count == 0 && self.armed.is_none()
    }

    fn arrive(&mut self, n: u32) -> Result<Option<T>, ImmError<()>> {
        // u64 cannot overflow: both terms are below 2^32.
        let total = u64::from(self.count) + u64::from(n);
        if let Some((target, _)) = &self.armed {
            let target = u64::from(*target);
            if total >= target {
                // count < target, so total - target < n: fits in u32.
                self.count = (total - target) as u32;
                return Ok(self.armed.take().map(|(_, token)| token));
            }
        }
        self.count = u32::try_from(total).map_err(|_| ImmError::Overflow(()))?;
        Ok(None)
    }

    fn expect(&mut self, target: u32, token: T) -> Result<Option<T>, ImmError<T>> {
        if self.armed.is_some() {
            return Err(ImmError::AlreadyArmed(token));
        }
        if self.count >= target {
            self.count -= target;
            return Ok(Some(token));
        }
        self.armed = Some((target, token));
        Ok(None)
    }
}

/// An [`ImmCounter`] without allocation: at most `N` immediates tracked at
/// once, kept sorted by immediate in a `heapless::Vec` (binary search).
///
/// An immediate occupies room while it has un-consumed arrivals or an armed
/// expectation, and is freed as soon as it has neither.
pub struct FixedImmCounter<T, const N: usize> {
    /// Sorted by `.0`, no duplicates, no idle slot.
    slots: heapless::Vec<(u32, Slot<T>), N>,
}

impl<T, const N: usize> FixedImmCounter<T, N> {
    /// An empty counter.
    pub const fn new() -> Self {
        FixedImmCounter {
            slots: heapless::Vec::new(),
        }
    }

    /// How many immediates are tracked now (non-zero count or armed).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no immediate is tracked.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The most immediates this counter can track at once (`N`).
    pub const fn capacity(&self) -> usize {
        N
    }

    /// Removes every armed expectation and hands `(imm, token)` for each to
    /// `f`, in immediate order (engine shutdown). Counts stay.
    pub fn cancel_all(&mut self, mut f: impl FnMut(u32, T)) {
        self.slots.retain_mut(|(imm, slot)| {
            if let Some((_, token)) = slot.armed.take() {
                f(*imm, token);
            }
            !slot.is_idle()
        });
    }

    fn find(&self, imm: u32) -> Result<usize, usize> {
        self.slots.binary_search_by_key(&imm, |(k, _)| *k)
    }

    /// Runs `f` on the slot for `imm`, creating it if needed (or handing
    /// `full` back when there is no room), and frees it if `f` left it idle.
    fn with_slot<R, E>(
        &mut self,
        imm: u32,
        full: impl FnOnce() -> E,
        f: impl FnOnce(&mut Slot<T>) -> Result<R, E>,
    ) -> Result<R, E> {
        let at = match self.find(imm) {
            Ok(at) => at,
            Err(at) => {
                if self.slots.insert(at, (imm, Slot::new())).is_err() {
                    return Err(full());
                }
                at
            }
        };
        let result = f(&mut self.slots[at].1);
        if self.slots[at].1.is_idle() {
            self.slots.remove(at);
        }
        result
    }
}

impl<T, const N: usize> Default for FixedImmCounter<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: fmt::Debug, const N: usize> fmt::Debug for FixedImmCounter<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.slots.iter().map(|(k, v)| (k, v)))
            .finish()
    }
}

impl<T, const N: usize> ImmCounter<T> for FixedImmCounter<T, N> {
    fn arrive(&mut self, imm: u32, n: u32) -> Result<Option<T>, ImmError<()>> {
        if n == 0 {
            // Nothing to record; do not take room for it.
            return Ok(None);
        }
        self.with_slot(imm, || ImmError::Full(()), |slot| slot.arrive(n))
    }

    fn expect(&mut self, imm: u32, target: u32, token: T) -> Result<Option<T>, ImmError<T>> {
        match self.find(imm) {
            Ok(at) => {
                let result = self.slots[at].1.expect(target, token);
                if self.slots[at].1.is_idle() {
                    self.slots.remove(at);
                }
                result
            }
            // Untracked: count is 0, so only target 0 fires at once, and
            // firing needs no room.
            Err(_) if target == 0 => Ok(Some(token)),
            Err(at) => match self.slots.insert(at, (imm, Slot::new())) {
                Ok(()) => {
                    self.slots[at].1.armed = Some((target, token));
                    Ok(None)
                }
                Err(_) => Err(ImmError::Full(token)),
            },
        }
    }

    fn count(&self, imm: u32) -> u32 {
        self.find(imm).map_or(0, |at| self.slots[at].1.count)
    }

    fn is_armed(&self, imm: u32) -> bool {
        self.find(imm)
            .is_ok_and(|at| self.slots[at].1.armed.is_some())
    }

    fn armed(&self, imm: u32) -> Option<(u32, &T)> {
        let at = self.find(imm).ok()?;
        self.slots[at].1.armed.as_ref().map(|(n, t)| (*n, t))
    }

    fn cancel(&mut self, imm: u32) -> Option<T> {
        let at = self.find(imm).ok()?;
        let token = self.slots[at].1.armed.take().map(|(_, t)| t);
        if self.slots[at].1.is_idle() {
            self.slots.remove(at);
        }
        token
    }
}

#[cfg(feature = "alloc")]
pub use map::ImmCounterMap;

#[cfg(feature = "alloc")]
mod map {
    use super::{ImmCounter, ImmError, Slot};
    use alloc::collections::btree_map::{BTreeMap, Entry};
    use core::fmt;

    /// An [`ImmCounter`] backed by a `BTreeMap`: never [`ImmError::Full`].
    ///
    /// Idle immediates (no arrivals left, nothing armed) are removed, so the
    /// map holds only immediates with outstanding state.
    pub struct ImmCounterMap<T> {
        slots: BTreeMap<u32, Slot<T>>,
    }

    impl<T> ImmCounterMap<T> {
        /// An empty counter.
        pub const fn new() -> Self {
            ImmCounterMap {
                slots: BTreeMap::new(),
            }
        }

        /// How many immediates are tracked now (non-zero count or armed).
        pub fn len(&self) -> usize {
            self.slots.len()
        }

        /// Whether no immediate is tracked.
        pub fn is_empty(&self) -> bool {
            self.slots.is_empty()
        }

        /// Removes every armed expectation and hands `(imm, token)` for each
        /// to `f`, in immediate order (engine shutdown). Counts stay.
        pub fn cancel_all(&mut self, mut f: impl FnMut(u32, T)) {
            self.slots.retain(|imm, slot| {
                if let Some((_, token)) = slot.armed.take() {
                    f(*imm, token);
                }
                !slot.is_idle()
            });
        }

        fn with_slot<R>(&mut self, imm: u32, f: impl FnOnce(&mut Slot<T>) -> R) -> R {
            match self.slots.entry(imm) {
                Entry::Occupied(mut e) => {
                    let r = f(e.get_mut());
                    if e.get().is_idle() {
                        e.remove();
                    }
                    r
                }
                Entry::Vacant(e) => {
                    let mut slot = Slot::new();
                    let r = f(&mut slot);
                    if !slot.is_idle() {
                        e.insert(slot);
                    }
                    r
                }
            }
        }
    }

    impl<T> Default for ImmCounterMap<T> {
        fn default() -> Self {
            Self::new()
        }
    }

    impl<T: fmt::Debug> fmt::Debug for ImmCounterMap<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_map().entries(self.slots.iter()).finish()
        }
    }

    impl<T> ImmCounter<T> for ImmCounterMap<T> {
        fn arrive(&mut self, imm: u32, n: u32) -> Result<Option<T>, ImmError<()>> {
            self.with_slot(imm, |slot| slot.arrive(n))
        }

        fn expect(&mut self, imm: u32, target: u32, token: T) -> Result<Option<T>, ImmError<T>> {
            self.with_slot(imm, |slot| slot.expect(target, token))
        }

        fn count(&self, imm: u32) -> u32 {
            self.slots.get(&imm).map_or(0, |s| s.count)
        }

        fn is_armed(&self, imm: u32) -> bool {
            self.slots.get(&imm).is_some_and(|s| s.armed.is_some())
        }

        fn cancel(&mut self, imm: u32) -> Option<T> {
            self.with_slot(imm, |slot| slot.armed.take().map(|(_, t)| t))
        }

        fn armed(&self, imm: u32) -> Option<(u32, &T)> {
            self.slots.get(&imm)?.armed.as_ref().map(|(n, t)| (*n, t))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::vec::Vec;

    #[test]
    fn arrivals_before_expectation_count() {
        let mut c = FixedImmCounter::<&str, 4>::new();
        assert_eq!(c.arrive(7, 2), Ok(None));
        assert_eq!(c.count(7), 2);
        assert_eq!(c.expect(7, 3, "a"), Ok(None));
        assert!(c.is_armed(7));
        assert_eq!(c.arrive(7, 1), Ok(Some("a")));
        assert_eq!(c.count(7), 0);
        assert!(c.is_empty(), "an idle immediate is freed");
    }

    #[test]
    fn surplus_carries_over_and_rearming_works() {
        let mut c = FixedImmCounter::<u8, 2>::new();
        assert_eq!(c.expect(1, 2, 10), Ok(None));
        assert_eq!(c.arrive(1, 5), Ok(Some(10)));
        assert_eq!(c.count(1), 3);
        assert_eq!(c.expect(1, 3, 11), Ok(Some(11)), "fires at once");
        assert_eq!(c.count(1), 0);
        assert_eq!(c.expect(1, 1, 12), Ok(None));
        assert_eq!(c.arrive(1, 1), Ok(Some(12)));
    }

    #[test]
    fn target_zero_fires_at_once_even_when_full() {
        let mut c = FixedImmCounter::<u8, 1>::new();
        assert_eq!(c.arrive(1, 1), Ok(None));
        assert_eq!(c.expect(2, 0, 5), Ok(Some(5)));
        assert_eq!(c.expect(1, 0, 6), Ok(Some(6)));
        assert_eq!(c.count(1), 1);
    }

    #[test]
    fn second_expectation_is_refused_with_its_token() {
        let mut c = FixedImmCounter::<u8, 2>::new();
        assert_eq!(c.expect(3, 2, 1), Ok(None));
        assert_eq!(c.expect(3, 1, 2), Err(ImmError::AlreadyArmed(2)));
        assert_eq!(c.cancel(3), Some(1));
        assert_eq!(c.cancel(3), None);
        assert!(c.is_empty());
    }

    #[test]
    fn full_hands_back_and_loses_nothing() {
        let mut c = FixedImmCounter::<u8, 2>::new();
        assert_eq!(c.arrive(1, 1), Ok(None));
        assert_eq!(c.expect(2, 1, 9), Ok(None));
        assert_eq!(c.arrive(3, 1), Err(ImmError::Full(())));
        assert_eq!(c.expect(3, 1, 7), Err(ImmError::Full(7)));
        assert_eq!((c.count(1), c.count(3), c.len()), (1, 0, 2));
        // Room comes back when an immediate goes idle.
        assert_eq!(c.arrive(2, 1), Ok(Some(9)));
        assert_eq!(c.expect(3, 1, 7), Ok(None));
        assert_eq!(c.arrive(3, 1), Ok(Some(7)));
    }

    #[test]
    fn overflow_is_an_error_and_changes_nothing() {
        let mut c = FixedImmCounter::<u8, 1>::new();
        assert_eq!(c.arrive(1, u32::MAX), Ok(None));
        assert_eq!(c.arrive(1, 1), Err(ImmError::Overflow(())));
        assert_eq!(c.count(1), u32::MAX);
        // With an expectation armed the sum is consumed, so no overflow.
        let mut c = FixedImmCounter::<u8, 1>::new();
        assert_eq!(c.arrive(1, u32::MAX - 1), Ok(None));
        assert_eq!(c.expect(1, u32::MAX, 4), Ok(None));
        assert_eq!(c.arrive(1, u32::MAX), Ok(Some(4)));
        assert_eq!(c.count(1), u32::MAX - 1);
    }

    fn cancel_if_only_takes_the_expectation_it_names<C: ImmCounter<u8>>(mut c: C) {
        assert_eq!(c.armed(1), None);
        assert_eq!(c.cancel_if(1, |_| true), None);
        c.arrive(1, 2).unwrap();
        assert_eq!(c.expect(1, 5, 7), Ok(None));
        assert_eq!(c.armed(1), Some((5, &7)));
        // A deadline of an earlier expectation (token 6) leaves this one.
        assert_eq!(c.cancel_if(1, |t| *t == 6), None);
        assert!(c.is_armed(1));
        assert_eq!(c.cancel_if(1, |t| *t == 7), Some(7));
        assert!(!c.is_armed(1));
        // The arrivals stay for the next expectation.
        assert_eq!(c.count(1), 2);
        assert_eq!(c.expect(1, 2, 8), Ok(Some(8)));
    }

    #[test]
    fn cancel_if_on_both_stores() {
        cancel_if_only_takes_the_expectation_it_names(FixedImmCounter::<u8, 4>::new());
        #[cfg(feature = "alloc")]
        cancel_if_only_takes_the_expectation_it_names(ImmCounterMap::<u8>::new());
    }

    #[test]
    fn cancel_all_keeps_counts() {
        let mut c = FixedImmCounter::<u8, 4>::new();
        c.expect(1, 5, 1).unwrap();
        c.expect(2, 5, 2).unwrap();
        c.arrive(2, 3).unwrap();
        c.arrive(3, 1).unwrap();
        let mut got = Vec::new();
        c.cancel_all(|imm, t| got.push((imm, t)));
        assert_eq!(got, [(1, 1), (2, 2)]);
        assert_eq!((c.len(), c.count(2), c.count(3)), (2, 3, 1));
    }

    #[test]
    fn errors_display_and_hand_back() {
        let e: ImmError<u8> = ImmError::Full(3);
        assert!(std::format!("{e}").contains("full"));
        assert_eq!(e.into_inner(), 3);
        let _: &dyn core::error::Error = &e;
    }

    /// One operation of a random history.
    #[derive(Clone, Debug)]
    enum Op {
        Arrive(u32, u32),
        Expect(u32, u32),
        Cancel(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        let n = prop_oneof![
            8 => 0..4u32,
            1 => Just(u32::MAX),
            1 => (u32::MAX - 3)..=u32::MAX,
        ];
        let target = prop_oneof![6 => 0..6u32, 1 => Just(u32::MAX)];
        prop_oneof![
            4 => (0..5u32, n).prop_map(|(i, n)| Op::Arrive(i, n)),
            3 => (0..5u32, target).prop_map(|(i, t)| Op::Expect(i, t)),
            1 => (0..5u32).prop_map(Op::Cancel),
        ]
    }

    /// The reference: per immediate a count and maybe `(target, token)`,
    /// with room for `cap` immediates that have either.
    struct Model {
        cap: usize,
        slots: BTreeMap<u32, (u64, Option<(u32, usize)>)>,
    }

    impl Model {
        fn tracked(&self, imm: u32) -> bool {
            self.slots.contains_key(&imm)
        }

        fn room(&self, imm: u32) -> bool {
            self.tracked(imm) || self.slots.len() < self.cap
        }

        fn tidy(&mut self, imm: u32) {
            if self.slots.get(&imm) == Some(&(0, None)) {
                self.slots.remove(&imm);
            }
        }

        fn apply(&mut self, op: &Op, token: usize) -> Outcome {
            let out = match *op {
                Op::Arrive(_, 0) => Outcome::Arrive(Ok(None)),
                Op::Arrive(imm, _) if !self.room(imm) => Outcome::Arrive(Err(ImmError::Full(()))),
                Op::Arrive(imm, n) => {
                    let slot = self.slots.entry(imm).or_insert((0, None));
                    let total = slot.0 + u64::from(n);
                    match slot.1 {
                        Some((target, t)) if total >= u64::from(target) => {
                            *slot = (total - u64::from(target), None);
                            Outcome::Arrive(Ok(Some(t)))
                        }
                        _ if total > u64::from(u32::MAX) => {
                            Outcome::Arrive(Err(ImmError::Overflow(())))
                        }
                        _ => {
                            slot.0 = total;
                            Outcome::Arrive(Ok(None))
                        }
                    }
                }
                Op::Expect(imm, target) => {
                    let count = self.slots.get(&imm).map_or(0, |s| s.0);
                    if self.slots.get(&imm).is_some_and(|s| s.1.is_some()) {
                        Outcome::Expect(Err(ImmError::AlreadyArmed(token)))
                    } else if count >= u64::from(target) {
                        if let Some(s) = self.slots.get_mut(&imm) {
                            s.0 -= u64::from(target);
                        }
                        Outcome::Expect(Ok(Some(token)))
                    } else if !self.room(imm) {
                        Outcome::Expect(Err(ImmError::Full(token)))
                    } else {
                        self.slots.entry(imm).or_insert((0, None)).1 = Some((target, token));
                        Outcome::Expect(Ok(None))
                    }
                }
                Op::Cancel(imm) => Outcome::Cancel(
                    self.slots
                        .get_mut(&imm)
                        .and_then(|s| s.1.take())
                        .map(|a| a.1),
                ),
            };
            let imm = match *op {
                Op::Arrive(i, _) | Op::Expect(i, _) | Op::Cancel(i) => i,
            };
            self.tidy(imm);
            out
        }
    }

    #[derive(Debug, PartialEq)]
    enum Outcome {
        Arrive(Result<Option<usize>, ImmError<()>>),
        Expect(Result<Option<usize>, ImmError<usize>>),
        Cancel(Option<usize>),
    }

    fn run(c: &mut impl ImmCounter<usize>, op: &Op, token: usize) -> Outcome {
        match *op {
            Op::Arrive(imm, n) => Outcome::Arrive(c.arrive(imm, n)),
            Op::Expect(imm, t) => Outcome::Expect(c.expect(imm, t, token)),
            Op::Cancel(imm) => Outcome::Cancel(c.cancel(imm)),
        }
    }

    /// Every op gives the model's answer, and counts agree after each.
    fn check_against_model<C: ImmCounter<usize>>(c: &mut C, cap: usize, ops: &[Op]) {
        let mut model = Model {
            cap,
            slots: BTreeMap::new(),
        };
        for (token, op) in ops.iter().enumerate() {
            let want = model.apply(op, token);
            assert_eq!(run(c, op, token), want, "op {token}: {op:?}");
            for imm in 0..5 {
                let (count, armed) = model
                    .slots
                    .get(&imm)
                    .map_or((0, false), |s| (s.0, s.1.is_some()));
                assert_eq!(u64::from(c.count(imm)), count);
                assert_eq!(c.is_armed(imm), armed);
            }
        }
    }

    /// One event of a transfer schedule.
    #[derive(Clone, Copy, Debug)]
    enum Event {
        /// `n` writes carrying `imm` land.
        Arrive(u32, u32),
        /// The receiver wants to arm the next transfer on `imm`.
        Arm(u32),
    }

    /// Per immediate the targets of successive transfers, and a shuffled
    /// order of events: each transfer's arm, and arrivals that add up to
    /// the sum of the immediate's targets, split into random chunks.
    fn schedule() -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<Event>)> {
        proptest::collection::vec(proptest::collection::vec(0..6u32, 1..4), 1..5)
            .prop_flat_map(|targets| {
                let chunks: Vec<_> = targets
                    .iter()
                    .enumerate()
                    .map(|(imm, ts)| {
                        split(ts.iter().sum()).prop_map(move |chunks| {
                            chunks
                                .into_iter()
                                .map(|n| Event::Arrive(imm as u32, n))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                (Just(targets), chunks)
            })
            .prop_flat_map(|(targets, chunks)| {
                let mut events: Vec<_> = chunks.into_iter().flatten().collect();
                for (imm, ts) in targets.iter().enumerate() {
                    events.extend(ts.iter().map(|_| Event::Arm(imm as u32)));
                }
                (Just(targets), Just(events).prop_shuffle())
            })
    }

    /// `total` split into positive chunks.
    fn split(total: u32) -> impl Strategy<Value = Vec<u32>> {
        proptest::collection::vec(1..4u32, 0..=total as usize).prop_map(move |sizes| {
            let mut left = total;
            let mut out = Vec::new();
            for s in sizes {
                let s = s.min(left);
                if s > 0 {
                    out.push(s);
                    left -= s;
                }
            }
            if left > 0 {
                out.push(left);
            }
            out
        })
    }

    /// What the receiver of one immediate knows while a schedule runs.
    #[derive(Default)]
    struct Receiver {
        targets: Vec<u32>,
        arrived: u64,
        /// Index of the next transfer to arm.
        next: usize,
        armed: bool,
        /// Arm requests waiting for the armed transfer to fire.
        waiting: usize,
        fired: Vec<usize>,
    }

    impl Receiver {
        /// Arrivals transfer `j` needs: its target plus all earlier ones.
        fn reaches(&self, j: usize) -> u64 {
            self.targets[..=j].iter().map(|&t| u64::from(t)).sum()
        }

        /// Arms waiting transfers while none is armed (an armed one must
        /// be refused), through any that fire at once.
        fn arm(&mut self, c: &mut impl ImmCounter<(u32, usize)>, imm: u32) {
            if self.armed && self.waiting > 0 {
                assert_eq!(
                    c.expect(imm, 1, (imm, usize::MAX)),
                    Err(ImmError::AlreadyArmed((imm, usize::MAX)))
                );
            }
            while self.waiting > 0 && !self.armed {
                self.waiting -= 1;
                let j = self.next;
                self.next += 1;
                match c.expect(imm, self.targets[j], (imm, j)) {
                    Ok(Some(token)) => {
                        assert_eq!(token, (imm, j));
                        assert!(self.arrived >= self.reaches(j), "fired early");
                        self.fired.push(j);
                    }
                    Ok(None) => {
                        assert!(self.arrived < self.reaches(j), "should have fired");
                        self.armed = true;
                    }
                    Err(e) => panic!("expect refused: {e:?}"),
                }
            }
        }

        fn arrive(&mut self, c: &mut impl ImmCounter<(u32, usize)>, imm: u32, n: u32) {
            let before = self.arrived;
            self.arrived += u64::from(n);
            let got = c.arrive(imm, n).expect("never full or overflowing here");
            if !self.armed {
                assert_eq!(got, None, "nothing armed");
                return;
            }
            let j = self.next - 1;
            let reaches = self.reaches(j);
            if let Some(token) = got {
                assert_eq!(token, (imm, j));
                assert!(
                    before < reaches && reaches <= self.arrived,
                    "fired off its arrival"
                );
                self.armed = false;
                self.fired.push(j);
                self.arm(c, imm);
            } else {
                assert!(self.arrived < reaches, "missed its target");
            }
        }

        fn consumed(&self) -> u64 {
            self.fired.iter().map(|&j| u64::from(self.targets[j])).sum()
        }
    }

    /// Runs a schedule and checks each expectation fires exactly once,
    /// exactly at the event that brings its immediate's arrivals to the sum
    /// of targets so far, and that counts are arrivals minus consumed.
    fn check_schedule(
        c: &mut impl ImmCounter<(u32, usize)>,
        targets: &[Vec<u32>],
        events: &[Event],
    ) {
        let mut rx: Vec<Receiver> = targets
            .iter()
            .map(|ts| Receiver {
                targets: ts.clone(),
                ..Receiver::default()
            })
            .collect();
        for &ev in events {
            match ev {
                Event::Arm(imm) => {
                    let r = &mut rx[imm as usize];
                    r.waiting += 1;
                    r.arm(c, imm);
                }
                Event::Arrive(imm, n) => rx[imm as usize].arrive(c, imm, n),
            }
            for (imm, r) in rx.iter().enumerate() {
                assert_eq!(u64::from(c.count(imm as u32)), r.arrived - r.consumed());
            }
        }
        for (imm, r) in rx.iter().enumerate() {
            let all: Vec<usize> = (0..r.targets.len()).collect();
            assert_eq!(r.fired, all, "each transfer fires once, in order");
            assert_eq!(c.count(imm as u32), 0);
            assert!(!c.is_armed(imm as u32));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn fixed_matches_model(ops in proptest::collection::vec(op(), 0..120)) {
            let mut c = FixedImmCounter::<usize, 3>::new();
            check_against_model(&mut c, 3, &ops);
        }

        #[test]
        fn small_fixed_matches_model(ops in proptest::collection::vec(op(), 0..120)) {
            let mut c = FixedImmCounter::<usize, 1>::new();
            check_against_model(&mut c, 1, &ops);
        }

        #[test]
        fn shuffled_schedule_fires_each_once_fixed((targets, events) in schedule()) {
            let mut c = FixedImmCounter::<(u32, usize), 4>::new();
            check_schedule(&mut c, &targets, &events);
            prop_assert!(c.is_empty());
        }
    }

    #[cfg(feature = "alloc")]
    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn map_matches_model(ops in proptest::collection::vec(op(), 0..120)) {
            let mut c = ImmCounterMap::<usize>::new();
            check_against_model(&mut c, usize::MAX, &ops);
            prop_assert_eq!(c.len(), (0..5).filter(|&i| c.count(i) > 0 || c.is_armed(i)).count());
        }

        #[test]
        fn shuffled_schedule_fires_each_once_map((targets, events) in schedule()) {
            let mut c = ImmCounterMap::<(u32, usize)>::new();
            check_schedule(&mut c, &targets, &events);
            prop_assert!(c.is_empty());
        }

        /// With room for every immediate, the fixed and map counters give
        /// the same answer to every operation.
        #[test]
        fn fixed_and_map_agree(ops in proptest::collection::vec(op(), 0..120)) {
            let mut fixed = FixedImmCounter::<usize, 5>::new();
            let mut map = ImmCounterMap::<usize>::new();
            for (token, op) in ops.iter().enumerate() {
                prop_assert_eq!(run(&mut fixed, op, token), run(&mut map, op, token));
                prop_assert_eq!(fixed.len(), map.len());
            }
        }
    }
}
