//! Precise timed sleeps for modelled time.
//!
//! Linux lets a normal thread's timed sleep end as much as its *timer
//! slack* late (50 µs by default), which turned the loopback fabric's
//! modelled round trips of a few microseconds into 50-70 µs each (`rolex
//! bench --rtt-us 2` measured a get p50 of 71 µs). A thread about to sleep
//! until a modelled deadline lowers its own slack first, once: its timed
//! sleeps then end within about a microsecond of the deadline plus the
//! scheduler's own delay. Nothing spins; the cost is that the kernel
//! cannot batch this thread's wake-ups with others'.
//!
//! Also here: [`coarse_now_ns`], a monotonic clock for hot paths that can
//! live with a resolution of milliseconds (a lease or staleness age): it
//! reads the kernel's last tick instead of the time-stamp counter.

use std::cell::Cell;
use std::thread;
use std::time::Duration;

/// Waits shorter than this are not worth a timed sleep: measured on this
/// project's 2-core VMs, a 2 µs sleep takes about 20 µs with the slack
/// lowered (70 µs without). A waiter within its spin budget polls for them
/// instead.
pub(crate) const SLEEP_FLOOR: Duration = Duration::from_micros(25);

/// The slack asked for, in nanoseconds.
const SLACK_NS: libc::c_ulong = 1_000;

thread_local! {
    static PRECISE: Cell<bool> = const { Cell::new(false) };
}

/// Lowers the calling thread's timer slack to [`SLACK_NS`], once per
/// thread (Linux; elsewhere nothing). A refusal (a kernel without the
/// call) leaves the default slack, which is only less precise.
pub(crate) fn precise_timers() {
    PRECISE.with(|done| {
        if !done.get() {
            done.set(true);
            #[cfg(target_os = "linux")]
            // SAFETY: PR_SET_TIMERSLACK takes one integer argument and
            // changes only the calling thread's slack.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, SLACK_NS, 0, 0, 0);
            }
        }
    });
}

/// The monotonic clock (`CLOCK_MONOTONIC`'s timeline, in nanoseconds) as
/// of the kernel's last tick: never ahead of the precise clock and at most
/// [`coarse_resolution_ns`] behind it. On Linux this is
/// `CLOCK_MONOTONIC_COARSE`, a few nanoseconds in the vDSO where the
/// precise clock costs a time-stamp-counter read (about 20 ns on the
/// project's VMs); elsewhere the precise clock. A failing call (none is
/// known) reads as 0, which callers that take it as "when something was
/// seen" treat as long ago.
pub fn coarse_now_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the call writes only
        // it.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        if rc != 0 {
            return 0;
        }
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    }
    #[cfg(not(target_os = "linux"))]
    {
        monotonic_ns()
    }
}

/// How far [`coarse_now_ns`] may lag the precise monotonic clock, in
/// nanoseconds (the tick, e.g. 4 ms at `HZ=250`; taken once per process;
/// 10 ms if the kernel does not say).
pub fn coarse_resolution_ns() -> u64 {
    static RES: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *RES.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec; the call writes
            // only it.
            let rc = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
            if rc == 0 && (ts.tv_sec > 0 || ts.tv_nsec > 0) {
                return (ts.tv_sec as u64)
                    .saturating_mul(1_000_000_000)
                    .saturating_add(ts.tv_nsec as u64);
            }
            10_000_000
        }
        #[cfg(not(target_os = "linux"))]
        {
            0
        }
    })
}

/// The precise monotonic clock in nanoseconds: `CLOCK_MONOTONIC` on Linux
/// (the timeline [`coarse_now_ns`] reads at its ticks), elsewhere since
/// this process first asked. A failing call (none is known) reads as 0.
pub fn monotonic_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the call writes only
        // it.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        if rc != 0 {
            return 0;
        }
        (ts.tv_sec as u64)
            .saturating_mul(1_000_000_000)
            .saturating_add(ts.tv_nsec as u64)
    }
    #[cfg(not(target_os = "linux"))]
    {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let epoch = *EPOCH.get_or_init(std::time::Instant::now);
        u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Sleeps for `d` with the calling thread's timers precise.
pub(crate) fn sleep(d: Duration) {
    precise_timers();
    thread::sleep(d);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coarse clock never runs ahead of the precise one (same
    /// timeline on Linux) nor lags it by more than its resolution.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_coarse_clock_lags_the_precise_one_by_at_most_its_resolution() {
        let precise = monotonic_ns;
        let res = coarse_resolution_ns();
        assert!(res > 0);
        for _ in 0..1000 {
            let before = precise();
            let c = coarse_now_ns();
            let after = precise();
            assert!(c <= after, "coarse {c} ahead of {after}");
            assert!(
                c + res >= before,
                "coarse {c} lags {before} by more than {res}"
            );
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_slack_is_lowered_for_the_calling_thread_only() {
        // SAFETY: PR_GET_TIMERSLACK reads the calling thread's slack.
        let slack = || unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        thread::spawn(move || {
            let before = slack();
            sleep(Duration::from_micros(1));
            assert_eq!(slack() as libc::c_ulong, SLACK_NS);
            assert!(before as libc::c_ulong >= SLACK_NS);
        })
        .join()
        .unwrap();
    }
}
