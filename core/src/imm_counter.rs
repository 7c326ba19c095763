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
            ImmError::Full(_) => f.write_str("immediate counter is full: no room to track a new immediate"),
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
                if self.slots.is_full() {
                    return Err(full());
                }
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

        fn expect(
            &mut self,
            imm: u32,
            target: u32,
            token: T,
        ) -> Result<Option<T>, ImmError<T>> {
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
    }
}

