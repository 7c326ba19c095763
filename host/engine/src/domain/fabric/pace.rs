//! When a NIC without a usable wait object reads its queue.
//!
//! A provider with manual progress (`tcp;ofi_rxm`, `shm`, EFA's RDM
//! protocol) moves data only while its queue is read, and a peer's
//! operation aimed at this NIC leaves no completion here. Where the queue
//! has a wait object the waiter (module `waiter`) or the worker blocks on
//! it and no timer is needed. Where it has none (`shm`; EFA before
//! libfabric 2.5; `wait_fd: false`) nothing announces a peer's
//! operation, so the queue is read on a schedule, and the schedule is
//! what this module decides, as a pure function of the time since the
//! NIC's last activity (a post, a completion, an arrival):
//!
//! - while the endpoint has operations outstanding, or within
//!   [`HOT`](super::HOT) of the last activity: "busy", i.e. the group's
//!   short back-off (1 to 200 µs) — an initiator waiting for its own
//!   operations, or a target between a peer's operations, is never left
//!   on a millisecond timer;
//! - then sleeps that start at [`FLOOR`] and double every
//!   [`HOT`](super::HOT) of further idleness up to
//!   [`LibfabricConfig::idle_poll`](super::LibfabricConfig::idle_poll):
//!   a target that sees a peer's operation every few tens of
//!   milliseconds answers within a few hundred µs, and a NIC idle for
//!   long costs one read per `idle_poll` (1 ms: well under 1 % of a core).
//!
//! A target that must answer every peer's operation at once (EFA's
//! emulated atomics on a memory node without a wait object) sets
//! [`LibfabricConfig::busy_poll`](super::LibfabricConfig::busy_poll): a
//! core, as the NIC it stands in for.

use std::time::Duration;

/// The first sleep after the busy window.
pub const FLOOR: Duration = Duration::from_micros(50);

/// How long a NIC without a wait object sleeps before reading its queue
/// again, `since` its last activity: `None` for "busy" (the group's short
/// back-off), else the sleep. `hot` is the busy window, `cap` the longest
/// sleep (`idle_poll`; never below [`FLOOR`]).
pub fn idle_sleep(since: Duration, hot: Duration, cap: Duration) -> Option<Duration> {
    if since < hot {
        return None;
    }
    let cap = cap.max(FLOOR);
    let doublings = if hot.is_zero() {
        u32::MAX
    } else {
        u32::try_from((since - hot).as_nanos() / hot.as_nanos()).unwrap_or(u32::MAX)
    };
    let sleep = FLOOR
        .checked_mul(1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(cap);
    Some(sleep.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOT: Duration = Duration::from_millis(20);
    const CAP: Duration = Duration::from_millis(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn busy_within_the_hot_window_then_sleeps_from_the_floor() {
        assert_eq!(idle_sleep(ms(0), HOT, CAP), None);
        assert_eq!(idle_sleep(ms(19), HOT, CAP), None);
        assert_eq!(idle_sleep(ms(20), HOT, CAP), Some(FLOOR));
        assert_eq!(idle_sleep(ms(39), HOT, CAP), Some(FLOOR));
        assert_eq!(idle_sleep(ms(40), HOT, CAP), Some(FLOOR * 2));
        assert_eq!(idle_sleep(ms(60), HOT, CAP), Some(FLOOR * 4));
        assert_eq!(idle_sleep(ms(80), HOT, CAP), Some(FLOOR * 8));
        // 50 µs × 32 > 1 ms: capped from 100 ms of idleness on.
        assert_eq!(idle_sleep(ms(120), HOT, CAP), Some(CAP));
    }

    #[test]
    fn sleeps_never_shrink_as_idleness_grows_and_stay_within_the_cap() {
        let mut last = Duration::ZERO;
        for t in (0..100_000u64).step_by(7) {
            let since = Duration::from_micros(t * 13);
            let s = idle_sleep(since, HOT, CAP).unwrap_or_default();
            assert!(s >= last, "at {since:?}: {s:?} after {last:?}");
            assert!(s <= CAP);
            last = s;
        }
        // Days of idleness, a zero window, a cap below the floor: no
        // overflow, never below the floor.
        assert_eq!(
            idle_sleep(Duration::from_secs(1 << 40), HOT, CAP),
            Some(CAP)
        );
        assert_eq!(idle_sleep(ms(5), Duration::ZERO, CAP), Some(CAP));
        assert_eq!(
            idle_sleep(ms(50), HOT, Duration::from_micros(1)),
            Some(FLOOR)
        );
    }
}
