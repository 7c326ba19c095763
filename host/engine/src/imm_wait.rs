//! The engine's immediate expectations: the order-independent counter of
//! `rolex-core` plus what a receiver needs so that it never waits forever
//! (issue 18, point 5):
//! - an expectation can be **cancelled**: it fires with
//!   [`TransferError::ImmCancelled`];
//! - it can carry a **deadline**: past it, it fires with
//!   [`TransferError::ImmDeadline`] naming how many arrivals it saw;
//! - a sender whose transfer failed part-way sends an **abort notice**
//!   (with [`EngineConfig::abort_notices`](crate::EngineConfig::abort_notices)
//!   on, on both ends): a zero-length write carrying the transfer's
//!   immediate with [`ABORT_BIT`] set, to each receiver a failed piece was
//!   aimed at, one however many of its NICs the transfer reached (a
//!   receiver is named by the first NIC of the descriptor written to); a
//!   receiver whose pieces all landed is not told. It fails the
//!   expectation armed on that immediate with
//!   [`TransferError::SenderAborted`], or the next one armed if none is.
//!
//! Invariants: every expectation fires exactly once (reached, cancelled,
//! past its deadline, aborted, or at shutdown); a deadline only ever fires
//! the expectation it was set for (each expectation has an id, and a
//! deadline names it); arrivals counted stay counted when an expectation
//! is cancelled, expires or is aborted. Pure state: the engine passes the
//! time in, so tests drive it without sleeping.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use rolex_core::imm_counter::{ImmCounter, ImmCounterMap, ImmError};

use crate::callback::Notify;
use crate::error::TransferError;

/// The immediate bit that marks an abort notice (with
/// [`EngineConfig::abort_notices`](crate::EngineConfig::abort_notices) on,
/// applications use immediates below it).
pub const ABORT_BIT: u32 = 1 << 31;

/// One armed expectation's token.
pub(crate) struct Armed {
    id: u64,
    target: u32,
    notify: Notify,
    /// Its deadline, the key `(deadline, id)` in `ImmWaits::deadlines`.
    deadline: Option<Instant>,
}

/// An expectation that fired, and how.
pub(crate) type Fired = (Notify, Result<u64, TransferError>);

/// Expectations, deadlines and abort notices not yet matched.
#[derive(Default)]
pub(crate) struct ImmWaits {
    counter: ImmCounterMap<Armed>,
    /// `(deadline, id) -> imm`.
    deadlines: BTreeMap<(Instant, u64), u32>,
    /// Abort notices that arrived while nothing was armed, per immediate.
    aborted: HashMap<u32, u32>,
    next_id: u64,
}

impl ImmWaits {
    /// Arms "`target` arrivals of `imm`", optionally until `deadline`.
    /// Returns the notify to fire at once, with its outcome, when the
    /// expectation is already met or already aborted.
    pub(crate) fn expect(
        &mut self,
        imm: u32,
        target: u32,
        notify: Notify,
        deadline: Option<Instant>,
    ) -> Result<Option<Fired>, TransferError> {
        if self.counter.is_armed(imm) {
            return Err(TransferError::ImmAlreadyArmed { imm });
        }
        if let Some(n) = self.aborted.get_mut(&imm) {
            *n -= 1;
            if *n == 0 {
                self.aborted.remove(&imm);
            }
            return Ok(Some((notify, Err(TransferError::SenderAborted { imm }))));
        }
        let id = self.next_id;
        self.next_id += 1;
        let armed = Armed {
            id,
            target,
            notify,
            deadline,
        };
        match self.counter.expect(imm, target, armed) {
            Ok(Some(a)) => Ok(Some((a.notify, Ok(0)))),
            Ok(None) => {
                if let Some(d) = deadline {
                    self.deadlines.insert((d, id), imm);
                }
                Ok(None)
            }
            Err(ImmError::AlreadyArmed(_)) => Err(TransferError::ImmAlreadyArmed { imm }),
            Err(_) => Err(TransferError::ImmOverflow { imm }),
        }
    }

    /// Records one arrival of `imm`; returns the expectation it completed.
    pub(crate) fn arrive(&mut self, imm: u32) -> Result<Option<Fired>, ImmError<()>> {
        Ok(self.counter.arrive(imm, 1)?.map(|a| {
            self.forget_deadline(&a);
            (a.notify, Ok(0))
        }))
    }

    /// Cancels the expectation on `imm`, if one is armed.
    pub(crate) fn cancel(&mut self, imm: u32) -> Option<Fired> {
        let a = self.counter.cancel(imm)?;
        self.forget_deadline(&a);
        Some((a.notify, Err(TransferError::ImmCancelled { imm })))
    }

    /// An abort notice for `imm` arrived: fails the armed expectation, or
    /// the next one armed.
    pub(crate) fn abort(&mut self, imm: u32) -> Option<Fired> {
        match self.counter.cancel(imm) {
            Some(a) => {
                self.forget_deadline(&a);
                Some((a.notify, Err(TransferError::SenderAborted { imm })))
            }
            None => {
                let n = self.aborted.entry(imm).or_insert(0);
                *n = n.saturating_add(1);
                None
            }
        }
    }

    /// Fires every expectation whose deadline is at or before `now`.
    pub(crate) fn expire(&mut self, now: Instant, out: &mut Vec<Fired>) {
        while let Some(entry) = self.deadlines.first_entry() {
            let (at, id) = *entry.key();
            if at > now {
                break;
            }
            let imm = entry.remove();
            let arrived = self.counter.count(imm);
            if let Some(a) = self.counter.cancel_if(imm, |a| a.id == id) {
                out.push((
                    a.notify,
                    Err(TransferError::ImmDeadline {
                        imm,
                        arrived,
                        expected: a.target,
                    }),
                ));
            }
        }
    }

    /// The earliest deadline still pending.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first_key_value().map(|((at, _), _)| *at)
    }

    /// Arrivals of `imm` not yet consumed.
    pub(crate) fn count(&self, imm: u32) -> u32 {
        self.counter.count(imm)
    }

    /// Removes every expectation (shutdown).
    pub(crate) fn take_all(&mut self) -> Vec<Notify> {
        let mut v = Vec::new();
        self.counter.cancel_all(|_, a| v.push(a.notify));
        self.deadlines.clear();
        v
    }

    fn forget_deadline(&mut self, a: &Armed) {
        // By key: a server keeps thousands armed (a request's layers), and
        // this runs under the lock every arrival takes.
        if let Some(d) = a.deadline {
            self.deadlines.remove(&(d, a.id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::callback::{CompletionFlag, OnDone};
    use std::sync::Arc;
    use std::time::Duration;

    fn notify() -> (Arc<CompletionFlag>, Notify) {
        let f = CompletionFlag::new();
        (f.clone(), OnDone::flag(&f).into())
    }

    fn outcome(f: Fired) -> Result<u64, TransferError> {
        f.1
    }

    #[test]
    fn deadline_fires_once_with_what_arrived_and_keeps_the_count() {
        let mut w = ImmWaits::default();
        let t0 = Instant::now();
        let (_f, n) = notify();
        assert!(w
            .expect(5, 3, n, Some(t0 + Duration::from_secs(1)))
            .unwrap()
            .is_none());
        w.arrive(5).unwrap();
        assert_eq!(w.next_deadline(), Some(t0 + Duration::from_secs(1)));
        let mut out = Vec::new();
        w.expire(t0, &mut out);
        assert!(out.is_empty());
        w.expire(t0 + Duration::from_secs(1), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(
            outcome(out.pop().unwrap()),
            Err(TransferError::ImmDeadline {
                imm: 5,
                arrived: 1,
                expected: 3
            })
        );
        assert_eq!(w.next_deadline(), None);
        // The arrival stays; a new expectation counts it.
        let (_f, n) = notify();
        assert!(matches!(w.expect(5, 1, n, None), Ok(Some((_, Ok(0))))));
    }

    #[test]
    fn a_deadline_never_fires_a_later_expectation() {
        let mut w = ImmWaits::default();
        let t0 = Instant::now();
        let (_f, n) = notify();
        w.expect(1, 1, n, Some(t0)).unwrap();
        // Met before its deadline: the deadline goes with it.
        assert!(matches!(w.arrive(1), Ok(Some((_, Ok(0))))));
        assert_eq!(w.next_deadline(), None);
        // Cancelled, then re-armed without a deadline.
        let (_f, n) = notify();
        w.expect(1, 2, n, Some(t0)).unwrap();
        assert!(matches!(
            w.cancel(1),
            Some((_, Err(TransferError::ImmCancelled { imm: 1 })))
        ));
        assert!(w.cancel(1).is_none());
        let (_f, n) = notify();
        w.expect(1, 2, n, None).unwrap();
        let mut out = Vec::new();
        w.expire(t0 + Duration::from_secs(9), &mut out);
        assert!(out.is_empty());
        assert!(matches!(
            w.expect(1, 1, notify().1, None),
            Err(TransferError::ImmAlreadyArmed { imm: 1 })
        ));
    }

    #[test]
    fn many_deadlines_out_of_order_leave_only_the_pending_ones() {
        let mut w = ImmWaits::default();
        let t0 = Instant::now();
        let at = |i: u32| t0 + Duration::from_millis(u64::from(1000 - i));
        for imm in 0..1000 {
            assert!(w
                .expect(imm, 1, notify().1, Some(at(imm)))
                .unwrap()
                .is_none());
        }
        // Met, cancelled and aborted from the earliest deadline on: each
        // takes its own deadline with it, none of the others.
        let mut pending: std::collections::BTreeSet<u32> = (0..1000).collect();
        for imm in (0..1000).rev().filter(|i| i % 4 != 0) {
            match imm % 4 {
                1 => assert!(matches!(w.arrive(imm), Ok(Some((_, Ok(0)))))),
                2 => assert!(w.cancel(imm).is_some()),
                _ => assert!(w.abort(imm).is_some()),
            }
            pending.remove(&imm);
            // The earliest deadline is the largest immediate's.
            assert_eq!(w.next_deadline(), pending.last().map(|&i| at(i)));
        }
        let mut out = Vec::new();
        w.expire(t0 + Duration::from_secs(2), &mut out);
        let mut fired: Vec<u32> = out
            .into_iter()
            .map(|(_, r)| match r {
                Err(TransferError::ImmDeadline { imm, .. }) => imm,
                other => panic!("{other:?}"),
            })
            .collect();
        fired.sort();
        assert_eq!(fired, (0..1000).step_by(4).collect::<Vec<_>>());
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn abort_notices_fail_the_armed_or_the_next_expectation() {
        let mut w = ImmWaits::default();
        let (_f, n) = notify();
        w.expect(7, 4, n, Some(Instant::now())).unwrap();
        assert!(matches!(
            w.abort(7),
            Some((_, Err(TransferError::SenderAborted { imm: 7 })))
        ));
        assert_eq!(w.next_deadline(), None);
        // Nothing armed: the next expectation fails at once, once.
        assert!(w.abort(8).is_none());
        assert!(matches!(
            w.expect(8, 1, notify().1, None),
            Ok(Some((_, Err(TransferError::SenderAborted { imm: 8 }))))
        ));
        assert!(w.expect(8, 1, notify().1, None).unwrap().is_none());
        assert_eq!(w.take_all().len(), 1);
    }
}
