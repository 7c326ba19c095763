//! CPU time of this process, for the tools that report what they cost:
//! `te-bench` (per measurement) and the serving processes (`te-bench
//! --serve`, `rolex memnode --fabric`), whose CPU stands in for a NIC's on
//! a software provider (design §7) and which say what it costs.

use std::time::{Duration, Instant};

/// CPU time (user and system) of every thread of this process so far,
/// and how many times its threads gave up a CPU (voluntary and forced
/// context switches).
pub fn process_cpu() -> (Duration, u64) {
    // SAFETY: `getrusage` writes one `rusage` to a valid pointer.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (Duration::ZERO, 0);
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let switches = (ru.ru_nvcsw + ru.ru_nivcsw) as u64;
    (tv(ru.ru_utime) + tv(ru.ru_stime), switches)
}

/// The process's CPU time over successive intervals.
pub struct CpuWindow {
    at: Instant,
    cpu: Duration,
}

impl CpuWindow {
    /// A window starting now.
    pub fn start() -> Self {
        CpuWindow {
            at: Instant::now(),
            cpu: process_cpu().0,
        }
    }

    /// CPU time and wall time since the window started (or was last
    /// taken); starts the next window.
    pub fn take(&mut self) -> (Duration, Duration) {
        let next = CpuWindow::start();
        let r = (
            next.cpu.saturating_sub(self.cpu),
            next.at.duration_since(self.at),
        );
        *self = next;
        r
    }
}

/// `cpu` over `wall` as a percentage of one core.
pub fn share(cpu: Duration, wall: Duration) -> f64 {
    100.0 * cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9)
}
