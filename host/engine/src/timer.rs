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
