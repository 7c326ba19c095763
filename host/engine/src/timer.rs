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
//! Also here: [`monotonic_ns`], the monotonic clock as one number (the
//! key-value store's views keep their ages in it).

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

/// The precise monotonic clock in nanoseconds: `CLOCK_MONOTONIC` on Linux,
/// elsewhere since this process first asked. A failing call (none is
/// known) reads as 0. (`CLOCK_MONOTONIC_COARSE` is cheaper, but its lag
/// behind this clock is not bounded by its resolution: 4.8 ms against a
/// 4 ms tick was measured on the project's VM, so ages taken from it may
/// be understated.)
pub fn monotonic_ns() -> u64 {
    #[cfg(target_os = "linux")]
    {
        clock_gettime_ns(libc::CLOCK_MONOTONIC)
    }
    #[cfg(not(target_os = "linux"))]
    {
        static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let epoch = *EPOCH.get_or_init(std::time::Instant::now);
        u64::try_from(epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// `clock`'s time in nanoseconds; 0 if the call fails (none is known to).
#[cfg(target_os = "linux")]
fn clock_gettime_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call writes only it.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Sleeps for `d` with the calling thread's timers precise.
pub(crate) fn sleep(d: Duration) {
    precise_timers();
    thread::sleep(d);
}

#[cfg(test)]
mod tests {
    use super::*;

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
