//! The waiter: one thread per libfabric NIC that blocks on the completion
//! queue's wait object (`FI_WAIT_FD`) and reads the queue as soon as the
//! provider has something to progress — the NIC's own progress engine.
//!
//! Why: under manual progress (`tcp;ofi_rxm`) data moves only while the
//! queue is read, and a one-sided write aimed at this NIC leaves no
//! completion here, so a poller that sleeps between reads delays every
//! peer's write by its sleep. The wait object is the provider's own
//! readiness signal (for `tcp;ofi_rxm` an epoll set over its sockets, its
//! connection events and its queue): the waiter reads the queue within a
//! thread wake-up of bytes arriving, a peer's write is placed without
//! waking the engine's worker at all, and an idle NIC costs no CPU.
//!
//! Loop (invariant: the waiter blocks whenever `fi_trywait` allows it and
//! reads the queue once per wake-up, so it works only when the provider
//! has work): `fi_trywait`; when it allows, poll(2) on the wait descriptor
//! and the waiter's own stop descriptor; then one read of the queue
//! (`progress`, which also wakes the worker when completions or arrivals
//! came out of it). `fi_trywait` answering "events queued" skips the
//! poll. While the worker itself reads the queue without pause (its
//! `busy_poll` window) it *disarms* the waiter, which then parks instead of
//! competing for the queue's lock and a CPU; the worker arms it again
//! before it sleeps ([`WaiterHealth::arm`]).
//!
//! Where the queue's wait object has no descriptor (`FI_WAIT_UNSPEC`: what
//! EFA offers while its shared-memory peer provider is on) the waiter
//! blocks in `fi_cq_sread` instead ([`Block::Sread`]) and hands what that
//! read to the domain with its progress; [`Waiter::stop`] wakes it with
//! `fi_cq_signal`.
//!
//! In an engine the group's worker takes the wait object over
//! (`Domain::take_wait`) and blocks on it itself, one thread hand-off
//! fewer per completion; the waiter then stays parked. It serves a NIC
//! used without a worker, and the time before the worker starts.
//!
//! The thread uses the fabric and queue through [`TryWait`] without owning
//! them: [`Waiter::stop`] joins it, and the domain calls it before the
//! queue closes.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle, Thread};

use super::ffi::{CqEvent, Sread, TryWait};

/// One read of the queue, run by the waiter after each wake-up, with the
/// events a blocking read already took out of the queue (none with a
/// descriptor); `false` when the domain is gone (the waiter then ends).
pub(crate) type ProgressFn = Box<dyn FnMut(Vec<CqEvent>) -> bool + Send>;

/// How the waiter blocks until the provider has something to progress.
#[derive(Clone, Copy)]
pub(crate) enum Block {
    /// poll(2) on the wait descriptor once `fi_trywait` allows it.
    Fd { trywait: TryWait, fd: libc::c_int },
    /// `fi_cq_sread` (a wait object without a descriptor).
    Sread(Sread),
}

/// Longest single `fi_cq_sread`, in ms: a backstop, as
/// [`WAIT_BACKSTOP`](super::WAIT_BACKSTOP); stopping signals the queue.
const SREAD_MS: libc::c_int = 1000;

/// What the domain and the waiter thread share.
struct Shared {
    /// Cleared while the poller reads the queue itself without pause
    /// (busy polling): the waiter then parks instead of competing with it
    /// for the queue and the CPU.
    armed: AtomicBool,
    stop: AtomicBool,
    /// Set when the wait object proved unusable (an error from
    /// `fi_trywait` or poll(2)): the domain falls back to timed reads.
    failed: AtomicBool,
    /// An eventfd written once to stop the waiter while it blocks.
    stop_fd: OwnedFd,
    /// The waiter thread, to unpark when armed again.
    thread: OnceLock<Thread>,
}

/// The waiter thread of one NIC; [`Waiter::stop`] (or drop) ends it.
pub(crate) struct Waiter {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Signalled on stop when the thread blocks in `fi_cq_sread`.
    sread: Option<Sread>,
}

impl Waiter {
    /// Starts a waiter that blocks as `block` says on its queue, running
    /// `progress` after each wake-up. `None` when the thread or its stop
    /// descriptor cannot be made (the domain then reads the queue on a
    /// schedule).
    ///
    /// The fabric, the queue and the descriptor behind `block` must stay
    /// open until [`Waiter::stop`] returns.
    pub(crate) fn start(block: Block, progress: ProgressFn) -> Option<Waiter> {
        // SAFETY: `eventfd` takes no pointers; a negative result is an
        // error, checked below.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return None;
        }
        // SAFETY: `efd` is a fresh descriptor nothing else owns.
        let stop_fd = unsafe { OwnedFd::from_raw_fd(efd) };
        let shared = Arc::new(Shared {
            armed: AtomicBool::new(true),
            stop: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            stop_fd,
            thread: OnceLock::new(),
        });
        let s = shared.clone();
        let thread = thread::Builder::new()
            .name("rolex-fi-wait".into())
            .spawn(move || match block {
                Block::Fd { trywait, fd } => run(&s, trywait, fd, progress),
                Block::Sread(q) => run_sread(&s, q, progress),
            })
            .ok()?;
        let _ = shared.thread.set(thread.thread().clone());
        Some(Waiter {
            shared,
            thread: Some(thread),
            sread: match block {
                Block::Sread(q) => Some(q),
                Block::Fd { .. } => None,
            },
        })
    }

    /// A handle on [`Waiter::usable`] for the poller.
    pub(crate) fn health(&self) -> WaiterHealth {
        WaiterHealth(self.shared.clone())
    }

    /// Stops and joins the thread; after it nothing uses the queue. From
    /// the waiter thread itself (its progress dropped the domain) it only
    /// asks the loop to end.
    pub(crate) fn stop(&mut self) {
        let Some(t) = self.thread.take() else {
            return;
        };
        self.shared.stop.store(true, SeqCst);
        t.thread().unpark();
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid `u64` to our eventfd; a
        // failure (counter overflow) still leaves it readable.
        let _ = unsafe {
            libc::write(
                self.shared.stop_fd.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
        if let Some(q) = &self.sread {
            // SAFETY: the queue is open until this returns (`start`).
            unsafe { q.signal() };
        }
        if t.thread().id() != thread::current().id() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
impl Waiter {
    /// CPU time the waiter thread has used (its own thread clock).
    pub(crate) fn cpu_time(&self) -> Option<std::time::Duration> {
        use std::os::unix::thread::JoinHandleExt;
        let t = self.thread.as_ref()?;
        let mut clock: libc::clockid_t = 0;
        // SAFETY: a live thread's handle (not joined: `thread` is `Some`)
        // and a valid out-pointer.
        if unsafe { libc::pthread_getcpuclockid(t.as_pthread_t(), &mut clock) } != 0 {
            return None;
        }
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a clock id from `pthread_getcpuclockid`, a valid out-pointer.
        if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
            return None;
        }
        Some(std::time::Duration::new(
            ts.tv_sec as u64,
            ts.tv_nsec as u32,
        ))
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether a waiter still reads its queue (see [`Waiter::usable`]).
#[derive(Clone)]
pub(crate) struct WaiterHealth(Arc<Shared>);

impl WaiterHealth {
    /// See [`Waiter::usable`].
    pub(crate) fn usable(&self) -> bool {
        !self.0.failed.load(SeqCst) && !self.0.stop.load(SeqCst)
    }

    /// The poller is about to sleep: the waiter blocks on the wait object
    /// again (one atomic swap when it already does).
    pub(crate) fn arm(&self) {
        if !self.0.armed.swap(true, SeqCst) {
            if let Some(t) = self.0.thread.get() {
                t.unpark();
            }
        }
    }

    /// The poller reads the queue without pause for a while: the waiter
    /// parks after its current wait.
    pub(crate) fn disarm(&self) {
        if self.0.armed.load(SeqCst) {
            self.0.armed.store(false, SeqCst);
        }
    }
}

fn run(s: &Shared, trywait: TryWait, fd: libc::c_int, mut progress: ProgressFn) {
    let stopping = || s.stop.load(SeqCst);
    while !stopping() {
        if !s.armed.load(SeqCst) {
            thread::park();
            continue;
        }
        // SAFETY: the domain keeps the fabric and queue open until `stop`
        // has joined this thread (module docs).
        match unsafe { trywait.may_block() } {
            Ok(true) => {
                let mut fds = [
                    libc::pollfd {
                        fd,
                        events: libc::POLLIN | libc::POLLPRI,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: s.stop_fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: `fds` is a valid array of two `pollfd`s.
                let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
                if stopping() {
                    return;
                }
                let broken = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
                let interrupted =
                    rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
                if (rc < 0 && !interrupted) || fds[0].revents & broken != 0 {
                    // A descriptor that stays in error would make this
                    // loop spin: give up on it.
                    s.failed.store(true, SeqCst);
                    progress(Vec::new());
                    return;
                }
            }
            Ok(false) => {}
            Err(_) => {
                s.failed.store(true, SeqCst);
                progress(Vec::new());
                return;
            }
        }
        if !progress(Vec::new()) {
            return;
        }
    }
}

/// The loop over a wait object without a descriptor: `fi_cq_sread` blocks
/// until the provider has completions (driving its progress meanwhile),
/// and what it read goes to `progress` with a read of the rest. Events
/// read while stopping still go to `progress` (their contexts are freed
/// there or, with the domain gone, dropped here).
fn run_sread(s: &Shared, q: Sread, mut progress: ProgressFn) {
    let stopping = || s.stop.load(SeqCst);
    while !stopping() {
        if !s.armed.load(SeqCst) {
            thread::park();
            continue;
        }
        let mut events = Vec::new();
        // SAFETY: the domain keeps the queue open until `stop` has joined
        // this thread (module docs).
        let read = unsafe { q.sread(&mut events, SREAD_MS) };
        if read.is_err() {
            s.failed.store(true, SeqCst);
            progress(events);
            return;
        }
        if !progress(events) {
            return;
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::domain::fabric::{probe, LibfabricConfig, LibfabricDomain};
    use crate::domain::{
        Completion, Domain, Endpoint, Local, Progress, Remote, WorkOp, WorkRequest,
    };
    use crate::region::Region;
    use crate::Access;

    /// Bound on every wait below: a hang guard, not a timing assertion.
    const GUARD: Duration = Duration::from_secs(30);

    /// A `tcp` NIC whose own timed reads never come (an hour apart): only
    /// its waiter (with `wait_fd`), or the test's own polls, read its
    /// queue. Also `retry`'s tests' NIC.
    pub(in crate::domain::fabric) fn nic(wait_fd: bool, op_timeout: Duration) -> LibfabricDomain {
        LibfabricDomain::open(&LibfabricConfig {
            wait_fd,
            op_timeout,
            idle_poll: Duration::from_secs(3600),
            ..LibfabricConfig::new("tcp", Some("127.0.0.1"))
        })
        .expect("open a tcp NIC")
    }

    /// A NIC whose waiter blocks in `fi_cq_sread` (no descriptor).
    fn nic_sread() -> LibfabricDomain {
        LibfabricDomain::open(&LibfabricConfig {
            wait_sread: true,
            op_timeout: GUARD,
            idle_poll: Duration::from_secs(3600),
            ..LibfabricConfig::new("tcp", Some("127.0.0.1"))
        })
        .expect("open a tcp NIC")
    }

    fn region(len: u64) -> Arc<Region> {
        Region::alloc(len, Access::all(), 1, 0).expect("region")
    }

    /// Posts one write of `len` bytes with immediate `imm` from `a` into
    /// `dst` on `b`, and polls `a` alone until it completes.
    fn write_polling_only_the_initiator(
        a: &LibfabricDomain,
        b: &LibfabricDomain,
        src: &Arc<Region>,
        dst: &Arc<Region>,
        imm: u32,
    ) -> Completion {
        let rkey = b.register(dst).expect("register dst");
        a.register(src).expect("register src");
        let mut ep = a.open_endpoint().expect("endpoint");
        let len = src.len();
        ep.post(&mut vec![WorkRequest {
            wr_id: 9,
            op: WorkOp::Write {
                local: Some(Local {
                    region: src.clone(),
                    offset: 0,
                }),
                remote: Remote {
                    peer: b.address(),
                    rkey,
                    addr: dst.addr(),
                },
                len,
                imm: Some(imm),
            },
        }]);
        let start = Instant::now();
        let mut out = Vec::new();
        while out.is_empty() {
            assert!(start.elapsed() < GUARD, "the write never completed");
            if let Progress::WaitUntil(_) | Progress::Busy = ep.poll(&mut out) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        out.remove(0)
    }

    #[test]
    fn a_peers_write_is_placed_while_nobody_polls_the_target() {
        if let Err(e) = probe("tcp", Some("127.0.0.1")) {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            return;
        }
        let (a, b) = (nic(true, GUARD), nic(true, GUARD));
        assert!(b.inner.wait.get().is_some(), "tcp gets a waiter");
        let (src, dst) = (region(1 << 20), region(1 << 20));
        {
            let g = src.enter().expect("src");
            let bytes: Vec<u8> = (0..src.len()).map(|i| (i % 251) as u8).collect();
            assert!(g.write(0, &bytes));
        }
        // Delivery completion: the initiator's completion needs the
        // target to place the data, and only `b`'s waiter reads its queue.
        let c = write_polling_only_the_initiator(&a, &b, &src, &dst, 77);
        assert_eq!(c.wr_id, 9);
        assert_eq!(c.result, Ok(0));
        let mut got = vec![0u8; dst.len() as usize];
        assert!(dst.enter().expect("dst").read(0, &mut got));
        assert!(got.iter().enumerate().all(|(i, &v)| v == (i % 251) as u8));
        // The immediate came out of `b`'s queue too, read by the waiter.
        let start = Instant::now();
        while b.counters().imm_arrivals == 0 {
            assert!(start.elapsed() < GUARD, "the immediate never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut inc = Vec::new();
        b.poll_incoming(&mut inc);
        assert!(matches!(inc.as_slice(), [crate::domain::Incoming::Imm(77)]));
    }

    #[test]
    fn without_a_waiter_an_unpolled_target_stalls_its_peers_writes() {
        if let Err(e) = probe("tcp", Some("127.0.0.1")) {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            return;
        }
        // The contrast that shows what the waiter does: the same write
        // fails by timeout when nobody reads the target's queue.
        let (a, b) = (nic(false, Duration::from_secs(1)), nic(false, GUARD));
        assert!(b.inner.wait.get().is_none());
        let c = write_polling_only_the_initiator(&a, &b, &region(4096), &region(4096), 1);
        // Never posted (the connection needs the target's progress: the
        // peer refuses with -FI_EAGAIN until given up on), or posted and
        // never completed.
        assert!(
            matches!(
                c.result,
                Err(crate::TransferError::Timeout { .. }
                    | crate::TransferError::PeerNotReady { .. })
            ),
            "{:?}",
            c.result
        );
    }

    #[test]
    fn an_idle_waiter_blocks() {
        if let Err(e) = probe("tcp", Some("127.0.0.1")) {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            return;
        }
        let (a, b) = (nic(true, GUARD), nic(true, GUARD));
        let c = write_polling_only_the_initiator(&a, &b, &region(4096), &region(4096), 1);
        assert_eq!(c.result, Ok(0));
        // Connections are up and nothing moves: the waiters of both NICs
        // must be blocked.
        assert_idle_waiters(&a, &b, "idle waiters");
    }

    #[test]
    fn a_waiter_without_a_descriptor_blocks_in_sread_and_places_writes() {
        if let Err(e) = probe("tcp", Some("127.0.0.1")) {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            return;
        }
        // EFA's wait object while its shm peer is on: no descriptor, only
        // `fi_cq_sread`. Forced on tcp: the target's waiter must still
        // place a peer's write (its queue is read by nobody else), hand the
        // immediate over, and use no CPU while idle.
        let (a, b) = (nic_sread(), nic_sread());
        assert!(b.inner.wait.get().is_some(), "a waiter runs");
        assert!(b.inner.wait_obj.get().is_none(), "with no descriptor");
        assert_eq!(b.wait_fd(), None, "nothing for the worker to block on");
        let (src, dst) = (region(64 << 10), region(64 << 10));
        {
            let g = src.enter().expect("src");
            let bytes: Vec<u8> = (0..src.len()).map(|i| (i % 253) as u8).collect();
            assert!(g.write(0, &bytes));
        }
        let c = write_polling_only_the_initiator(&a, &b, &src, &dst, 5);
        assert_eq!(c.result, Ok(0));
        let mut got = vec![0u8; dst.len() as usize];
        assert!(dst.enter().expect("dst").read(0, &mut got));
        assert!(got.iter().enumerate().all(|(i, &v)| v == (i % 253) as u8));
        let start = Instant::now();
        while b.counters().imm_arrivals == 0 {
            assert!(start.elapsed() < GUARD, "the immediate never arrived");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_idle_waiters(&a, &b, "idle sread waiters");
    }

    /// The waiters of `a` and `b` use (almost) no CPU over a second once
    /// nothing moves: measured on their own threads, so other tests
    /// running meanwhile do not count.
    fn assert_idle_waiters(a: &LibfabricDomain, b: &LibfabricDomain, what: &str) {
        std::thread::sleep(Duration::from_millis(100));
        let cpu = |d: &LibfabricDomain| {
            let g = crate::domain::fabric::lock(&d.inner.live);
            g.as_ref()
                .and_then(|l| l.waiter.as_ref())
                .and_then(|w| w.cpu_time())
                .expect("waiter CPU clock")
        };
        let before = (cpu(a), cpu(b));
        std::thread::sleep(Duration::from_millis(1000));
        let used = (cpu(a) - before.0) + (cpu(b) - before.1);
        assert!(
            used < Duration::from_millis(10),
            "{what} used {used:?} of CPU in a second"
        );
    }
}
