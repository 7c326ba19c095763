//! Deregistration that waits for the operations in flight (issue 18): a
//! memory region's keys are invalidated (`ibv_dereg_mr`) only once no
//! operation the NIC may still execute uses it.
//!
//! Invalidating first would not free memory under the NIC (after
//! `ibv_dereg_mr` returns the device no longer touches the region), but
//! every request still queued with the old local key would fail with a
//! local protection error, which moves its RC queue pair to the error
//! state: one region's deregistration would break the connection to a
//! peer for everything else in flight on it. So, in this order:
//!
//! 1. refuse new operations on the region (its local key is forgotten:
//!    they fail with [`TransferError::LocalNotRegistered`](crate::error::TransferError::LocalNotRegistered));
//! 2. drive the NIC's progress until no in-flight record (posted, waiting
//!    for a connection or for room, or timed out but not yet reported by
//!    the NIC) holds the region, sleeping between rounds, at most until a
//!    deadline;
//! 3. invalidate the keys. Past the deadline they are invalidated anyway:
//!    what is left then fails, as the invalidation makes it.
//!
//! The steps are driven through [`DrainRegion`], which the verbs domain
//! implements over its device and tests over a fake.

use std::time::{Duration, Instant};

/// What deregistering one region needs from a domain.
pub trait DrainRegion {
    /// Step 1: no new operation may use the region.
    fn refuse_new(&mut self);
    /// Step 2, one round: drives the NIC's progress once and returns how
    /// many in-flight operations still hold the region.
    fn progress_holders(&mut self) -> usize;
    /// Step 3: invalidates the region's keys (`ibv_dereg_mr`).
    fn invalidate(&mut self);
}

/// How a deregistration ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drained {
    /// No operation held the region when its keys were invalidated.
    Clean,
    /// The deadline passed with `left` operations holding it; the keys
    /// were invalidated anyway.
    Forced {
        /// Operations still holding the region.
        left: usize,
    },
}

/// Longest sleep between two progress rounds.
pub const MAX_NAP: Duration = Duration::from_millis(1);

/// Deregisters one region through `d` (steps 1 to 3 of the module docs),
/// waiting at most until `deadline`; `nap` sleeps between rounds (a
/// growing back-off up to [`MAX_NAP`]: the caller's thread never spins).
pub fn deregister(
    d: &mut impl DrainRegion,
    deadline: Instant,
    mut nap: impl FnMut(Duration),
) -> Drained {
    d.refuse_new();
    let mut wait = Duration::from_micros(10);
    let outcome = loop {
        let left = d.progress_holders();
        if left == 0 {
            break Drained::Clean;
        }
        if Instant::now() >= deadline {
            break Drained::Forced { left };
        }
        nap(wait);
        wait = (wait * 2).min(MAX_NAP);
    };
    d.invalidate();
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NIC with `holders` operations on the region, of which each
    /// progress round completes `per_round`; it logs the calls.
    struct FakeNic {
        holders: usize,
        per_round: usize,
        log: Vec<&'static str>,
        refused: bool,
        invalid: bool,
    }

    impl FakeNic {
        fn new(holders: usize, per_round: usize) -> FakeNic {
            FakeNic {
                holders,
                per_round,
                log: Vec::new(),
                refused: false,
                invalid: false,
            }
        }

        /// A new operation on the region: accepted only before step 1.
        fn submit(&mut self) -> bool {
            if self.refused {
                return false;
            }
            self.holders += 1;
            true
        }
    }

    impl DrainRegion for FakeNic {
        fn refuse_new(&mut self) {
            self.refused = true;
            self.log.push("refuse");
        }
        fn progress_holders(&mut self) -> usize {
            // An operation executing after the keys are gone would fail
            // with a protection error (and break its queue pair).
            assert!(!self.invalid, "progress after invalidation");
            self.holders -= self.per_round.min(self.holders);
            self.log.push("progress");
            self.holders
        }
        fn invalidate(&mut self) {
            assert!(
                self.refused,
                "keys invalidated before new operations were refused"
            );
            self.invalid = true;
            self.log.push("invalidate");
        }
    }

    #[test]
    fn keys_are_invalidated_only_after_the_operations_in_flight() {
        let mut nic = FakeNic::new(5, 2);
        assert!(nic.submit());
        let mut naps = Vec::new();
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(deregister(&mut nic, far, |d| naps.push(d)), Drained::Clean);
        // 6 holders, 2 a round: 3 rounds, naps between them only.
        assert_eq!(
            nic.log,
            ["refuse", "progress", "progress", "progress", "invalidate"]
        );
        assert_eq!(naps.len(), 2);
        assert!(naps.windows(2).all(|w| w[0] <= w[1]) && naps.iter().all(|&n| n <= MAX_NAP));
        // Refused from step 1 on.
        assert!(!nic.submit());
    }

    #[test]
    fn nothing_in_flight_is_invalidated_at_once() {
        let mut nic = FakeNic::new(0, 1);
        let far = Instant::now() + Duration::from_secs(3600);
        let r = deregister(&mut nic, far, |_| panic!("no nap needed"));
        assert_eq!(r, Drained::Clean);
        assert_eq!(nic.log, ["refuse", "progress", "invalidate"]);
    }

    #[test]
    fn past_the_deadline_the_keys_go_anyway() {
        // A NIC that never completes (a dead peer's operations before
        // their timeout).
        let mut nic = FakeNic::new(3, 0);
        let soon = Instant::now() + Duration::from_millis(5);
        let r = deregister(&mut nic, soon, std::thread::sleep);
        assert_eq!(r, Drained::Forced { left: 3 });
        assert_eq!(nic.log.last(), Some(&"invalidate"));
        assert!(nic.invalid);
    }
}
