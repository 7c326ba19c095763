//! The worker thread of each domain group.
//!
//! A group is 1 to 4 domains (NICs) served by one worker thread; the state
//! the worker shares with the API ([`GroupShared`], its request queue) is
//! in `shared`. The
//! worker takes requests from a lock-free queue, posts their work requests
//! as one doorbell per domain per round, polls completions, aggregates the
//! pieces of each transfer into one notification, and turns arrivals
//! (immediates, messages) into ImmCounter updates and receive callbacks.
//!
//! Invariants: every request's notification fires exactly once (on
//! shutdown with [`TransferError::EngineShutDown`] for whatever had not
//! finished); the worker never spins while idle — with nothing in flight it
//! parks until unparked by a submission or an arrival (or, when every NIC
//! of the group has a wait object, blocks on those: see `Worker::sleep`),
//! and while operations wait on modelled time it sleeps until the earliest
//! of them. A round posts at most `ROUND_BYTES` of payload before it
//! reads completions again, so a burst of large writes does not hold back
//! the completions of those before it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::callback::{Job, Notify};
use crate::counters::Counters;
use crate::domain::{
    AnyEndpoint, Completion, Domain, Endpoint, Incoming, Progress, Remote, WorkOp, WorkRequest,
};
use crate::error::TransferError;
use crate::imm_wait::ABORT_BIT;
use crate::shared::{EngineShared, GroupShared, Request};

/// Most requests a worker takes from its queue per round before it reads
/// completions again.
const ROUND_OPS: usize = 1024;
/// Most payload bytes a worker posts per round (at least one request): on
/// software providers posting copies the data into a socket, about 100 µs
/// per 256 KiB here, and completions wait meanwhile.
const ROUND_BYTES: u64 = 256 << 10;

/// A transfer in flight: pieces left, first error, value (atomics).
struct Transfer {
    remaining: usize,
    error: Option<TransferError>,
    value: u64,
    notify: Notify,
    /// With abort notices on: every piece that carried an immediate, in
    /// piece order; its receiver is told if the transfer fails.
    notices: Vec<Notice>,
}

/// A piece carrying an immediate, for an abort notice.
struct Notice {
    piece: u64,
    nic: usize,
    remote: Remote,
    imm: u32,
    /// The piece completed: its target and key are good for the notice.
    landed: bool,
}

/// A work request's id: the transfer's slot in the low bits, the piece's
/// index above [`PIECE_SHIFT`].
const PIECE_SHIFT: u32 = 40;
const SLOT_MASK: u64 = (1 << PIECE_SHIFT) - 1;

/// The `wr_id` of abort notices: no transfer waits for them.
const NOTICE: u64 = u64::MAX;

/// Where abort notices go: one per `(peer, immediate)`, to the target of a
/// piece that landed there if one did (its key is known good), else of
/// the first piece.
fn notice_targets(notices: &[Notice]) -> Vec<(usize, Remote, u32)> {
    let mut out: Vec<(usize, Remote, u32, bool)> = Vec::new();
    for n in notices {
        match out
            .iter_mut()
            .find(|(_, r, i, _)| r.peer == n.remote.peer && *i == n.imm)
        {
            Some(o) if !o.3 && n.landed => *o = (n.nic, n.remote, n.imm, true),
            Some(_) => {}
            None => out.push((n.nic, n.remote, n.imm, n.landed)),
        }
    }
    out.into_iter().map(|(d, r, i, _)| (d, r, i)).collect()
}

/// Pins the calling thread to one CPU of those it may run on, chosen
/// round-robin across workers. Failure (or a single allowed CPU) leaves
/// it unpinned: pinning is an optimisation only.
fn pin_current_thread() {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: `cpu_set_t` is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid, writable `cpu_set_t` of `size` bytes; pid 0
    // is the calling thread.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return;
    }
    let max = 8 * size;
    // SAFETY: `CPU_ISSET` reads `set` at indices below its bit size.
    let allowed: Vec<usize> = (0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    if allowed.len() < 2 {
        return;
    }
    let cpu = allowed[NEXT.fetch_add(1, Relaxed) % allowed.len()];
    // SAFETY: as above, all-zero is the empty set.
    let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu < max`, inside the set.
    unsafe { libc::CPU_SET(cpu, &mut one) };
    // SAFETY: `one` is a valid `cpu_set_t` of `size` bytes. The result is
    // ignored on purpose: failing to pin is not an error.
    let _ = unsafe { libc::sched_setaffinity(0, size, &one) };
}

/// The worker of one group.
pub(crate) struct Worker {
    index: usize,
    engine: Arc<EngineShared>,
    endpoints: Vec<AnyEndpoint>,
    batches: Vec<Vec<WorkRequest>>,
    transfers: Vec<Option<Transfer>>,
    free: Vec<usize>,
    comps: Vec<Completion>,
    incoming: Vec<Incoming>,
    /// The NICs' wait objects when every NIC of the group has one
    /// ([`Domain::wait_fd`]): the worker blocks on them instead of
    /// parking, so a NIC's event wakes it without a thread in between.
    wait_fds: Vec<libc::pollfd>,
    /// Abort notices queued in `batches`, not yet posted.
    notices_pending: bool,
}

impl Worker {
    pub(crate) fn spawn(
        engine: Arc<EngineShared>,
        index: usize,
        pin: bool,
    ) -> Result<thread::JoinHandle<()>, TransferError> {
        let group = &engine.groups[index];
        let endpoints = group
            .domains
            .iter()
            .map(|d| d.open_endpoint())
            .collect::<Result<Vec<_>, _>>()?;
        let n = endpoints.len();
        let worker = Worker {
            index,
            engine: engine.clone(),
            endpoints,
            batches: (0..n).map(|_| Vec::new()).collect(),
            transfers: Vec::new(),
            free: Vec::new(),
            comps: Vec::new(),
            incoming: Vec::new(),
            wait_fds: Vec::new(),
            notices_pending: false,
        };
        let ready = Arc::new(AtomicBool::new(false));
        let ready2 = ready.clone();
        let handle = thread::Builder::new()
            .name(format!("rolex-te{}-g{index}", engine.id))
            .spawn(move || {
                let mut worker = worker;
                if pin {
                    pin_current_thread();
                }
                let engine = worker.engine.clone();
                let group = &engine.groups[worker.index];
                let _ = group.waker.set(thread::current());
                for d in &group.domains {
                    d.set_waker(thread::current());
                }
                let fds: Option<Vec<_>> = group.domains.iter().map(|d| d.wait_fd()).collect();
                if let Some(fds) = fds {
                    for d in &group.domains {
                        d.take_wait(group.sleeping.clone());
                    }
                    worker.wait_fds = fds
                        .into_iter()
                        .map(|fd| libc::pollfd {
                            fd,
                            events: libc::POLLIN | libc::POLLPRI,
                            revents: 0,
                        })
                        .collect();
                }
                ready2.store(true, SeqCst);
                worker.run();
            })
            .map_err(|_| TransferError::ThreadSpawn { thread: "worker" })?;
        // The waker must be known before submissions can rely on it.
        while !ready.load(SeqCst) {
            if handle.is_finished() {
                break;
            }
            thread::sleep(Duration::from_micros(50));
        }
        Ok(handle)
    }

    fn group(&self) -> &GroupShared {
        &self.engine.groups[self.index]
    }

    fn run(mut self) {
        let mut nap = Duration::from_micros(1);
        loop {
            let mut busy = false;
            // Submissions first (new work fills the pipeline), up to a
            // round's budget: completions are read between rounds, so a
            // burst of large writes does not hold back the completions
            // (and the submitters waiting on them) of the writes before.
            let (mut taken, mut bytes) = (0, 0);
            while taken < ROUND_OPS && bytes < ROUND_BYTES {
                let Some(req) = self.group().queue.pop() else {
                    break;
                };
                bytes += req.ops.iter().map(|(_, op)| op.bytes()).sum::<u64>();
                self.accept(req);
                taken += 1;
            }
            if taken > 0 || std::mem::take(&mut self.notices_pending) {
                busy = true;
                for (ep, batch) in self.endpoints.iter_mut().zip(self.batches.iter_mut()) {
                    ep.post(batch);
                }
            }
            // Completions.
            let mut progress = Progress::Idle;
            for ep in &mut self.endpoints {
                progress = progress.merge(ep.poll(&mut self.comps));
            }
            if !self.comps.is_empty() {
                busy = true;
                let comps = std::mem::take(&mut self.comps);
                for c in &comps {
                    self.complete(c.wr_id, c.result.clone());
                }
                self.comps = comps;
                self.comps.clear();
            }
            // Arrivals.
            let mut arrived = 0;
            for d in 0..self.group().domains.len() {
                let mut inc = std::mem::take(&mut self.incoming);
                arrived += self.group().domains[d].poll_incoming(&mut inc);
                for e in inc.drain(..) {
                    self.arrival(d, e);
                }
                self.incoming = inc;
            }
            busy |= arrived > 0;
            if self.engine.shutdown.load(SeqCst) {
                self.shut_down();
                return;
            }
            if let Some(at) = self.expire_imms() {
                progress = progress.merge(Progress::WaitUntil(at));
            }
            if busy || self.notices_pending {
                nap = Duration::from_micros(1);
                continue;
            }
            match progress {
                Progress::Idle => self.sleep(None),
                Progress::WaitUntil(t) => {
                    let now = Instant::now();
                    if t > now {
                        self.sleep(Some(t - now));
                    }
                }
                Progress::Busy => {
                    // Hardware still working: back off without spinning.
                    thread::park_timeout(nap);
                    nap = (nap * 2).min(Duration::from_micros(200));
                }
            }
        }
    }

    /// Sleeps until woken, or `timeout`: parks, or with wait objects
    /// blocks on them (a NIC event or [`GroupShared::wake`]'s signal ends
    /// it).
    fn sleep(&mut self, timeout: Option<Duration>) {
        if self.wait_fds.is_empty() {
            match timeout {
                None => thread::park(),
                Some(t) => thread::park_timeout(t),
            }
            return;
        }
        let group = &self.engine.groups[self.index];
        group.sleeping.store(true, SeqCst);
        // Pairs with the fence in `GroupShared::wake`: a submission either
        // sees `sleeping` and signals, or is seen here.
        std::sync::atomic::fence(SeqCst);
        let may_block = group.queue.is_empty()
            && !self.engine.shutdown.load(SeqCst)
            && group.domains.iter().all(|d| d.may_block());
        if may_block {
            let ts = timeout.map(|t| libc::timespec {
                tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
                tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
            });
            let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const _);
            // SAFETY: `wait_fds` is a valid array of `pollfd`s of the given
            // length; `tsp` is null or points at a live `timespec`.
            let rc = unsafe {
                libc::ppoll(
                    self.wait_fds.as_mut_ptr(),
                    self.wait_fds.len() as libc::nfds_t,
                    tsp,
                    std::ptr::null(),
                )
            };
            let broken = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
            if rc > 0 && self.wait_fds.iter().any(|p| p.revents & broken != 0) {
                // A descriptor in error would make every sleep return at
                // once: park from now on (the NICs' own timers remain).
                self.wait_fds.clear();
            }
        }
        group.sleeping.store(false, SeqCst);
    }

    fn accept(&mut self, req: Request) {
        let Request { ops, notify } = req;
        if ops.is_empty() {
            notify.fire(Ok(0), &self.engine.cbq);
            return;
        }
        let mut notices = Vec::new();
        if self.engine.abort_notices {
            for (piece, (d, op)) in ops.iter().enumerate() {
                if let WorkOp::Write {
                    remote,
                    imm: Some(imm),
                    ..
                } = op
                {
                    notices.push(Notice {
                        piece: piece as u64,
                        nic: *d,
                        remote: *remote,
                        imm: *imm,
                        landed: false,
                    });
                }
            }
        }
        let t = Transfer {
            remaining: ops.len(),
            error: None,
            value: 0,
            notify,
            notices,
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.transfers[s] = Some(t);
                s
            }
            None => {
                self.transfers.push(Some(t));
                self.transfers.len() - 1
            }
        };
        let n = self.batches.len();
        for (piece, (d, op)) in ops.into_iter().enumerate() {
            self.batches[d % n].push(WorkRequest {
                wr_id: slot as u64 | ((piece as u64) << PIECE_SHIFT),
                op,
            });
        }
    }

    fn complete(&mut self, wr_id: u64, result: Result<u64, TransferError>) {
        let slot = (wr_id & SLOT_MASK) as usize;
        let piece = wr_id >> PIECE_SHIFT;
        let Some(Some(t)) = self.transfers.get_mut(slot) else {
            return;
        };
        match result {
            Ok(v) => {
                t.value = v;
                if let Ok(i) = t.notices.binary_search_by_key(&piece, |n| n.piece) {
                    t.notices[i].landed = true;
                }
            }
            Err(e) => {
                if t.error.is_none() {
                    t.error = Some(e);
                }
            }
        }
        t.remaining -= 1;
        if t.remaining == 0 {
            if let Some(t) = self.transfers[slot].take() {
                self.free.push(slot);
                if t.error.is_some() && !t.notices.is_empty() {
                    self.send_notices(&notice_targets(&t.notices));
                }
                let r = match t.error {
                    Some(e) => Err(e),
                    None => Ok(t.value),
                };
                t.notify.fire(r, &self.engine.cbq);
            }
        }
    }

    /// Tells the receivers of a failed transfer (abort notices): a
    /// zero-length write carrying each immediate with the abort bit, to the
    /// same target; posted with the next doorbell, its outcome ignored.
    fn send_notices(&mut self, notices: &[(usize, Remote, u32)]) {
        let n = self.batches.len();
        for &(d, remote, imm) in notices {
            self.batches[d % n].push(WorkRequest {
                wr_id: NOTICE,
                op: WorkOp::Write {
                    local: None,
                    remote,
                    len: 0,
                    imm: Some(imm | ABORT_BIT),
                },
            });
            self.notices_pending = true;
        }
    }

    /// Fires the expectations past their deadline (group 0 keeps them);
    /// returns the next deadline.
    fn expire_imms(&mut self) -> Option<Instant> {
        if self.index != 0 {
            return None;
        }
        let mut fired = Vec::new();
        let next = {
            let mut w = self.engine.imm.lock().unwrap_or_else(|e| e.into_inner());
            w.next_deadline()?;
            w.expire(Instant::now(), &mut fired);
            w.next_deadline()
        };
        for (n, r) in fired {
            n.fire(r, &self.engine.cbq);
        }
        next
    }

    fn arrival(&mut self, domain: usize, e: Incoming) {
        match e {
            Incoming::Imm(imm) if self.engine.abort_notices && imm & ABORT_BIT != 0 => {
                let fired = self
                    .engine
                    .imm
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .abort(imm & !ABORT_BIT);
                if let Some((n, r)) = fired {
                    n.fire(r, &self.engine.cbq);
                }
            }
            Incoming::Imm(imm) => {
                let fired = {
                    let mut w = self.engine.imm.lock().unwrap_or_else(|e| e.into_inner());
                    w.arrive(imm)
                };
                match fired {
                    Ok(Some((notify, r))) => notify.fire(r, &self.engine.cbq),
                    Ok(None) => {}
                    // More than u32::MAX arrivals outstanding: count it as an
                    // error; an expectation would be reported by its caller.
                    Err(_) => Counters::bump(&self.engine.counters.errors, 1),
                }
            }
            Incoming::Message { buf, len } => {
                let d = self.group().domains[domain].clone();
                self.engine.cbq.push(Job::Run(Box::new(move || {
                    (buf.pool)(&buf.data[..len.min(buf.data.len())]);
                    // The buffer goes back to the pool after the callback.
                    d.post_recv(buf);
                })));
            }
        }
    }

    fn shut_down(&mut self) {
        let mut comps = Vec::new();
        for (ep, batch) in self.endpoints.iter_mut().zip(self.batches.iter_mut()) {
            for wr in batch.drain(..) {
                comps.push(Completion {
                    wr_id: wr.wr_id,
                    result: Err(TransferError::EngineShutDown),
                });
            }
            ep.flush(&mut comps);
        }
        for c in comps {
            self.complete(c.wr_id, c.result);
        }
        while let Some(req) = self.group().queue.pop() {
            req.notify
                .fire(Err(TransferError::EngineShutDown), &self.engine.cbq);
        }
        for t in self.transfers.iter_mut().filter_map(Option::take) {
            t.notify.fire(
                Err(t.error.unwrap_or(TransferError::EngineShutDown)),
                &self.engine.cbq,
            );
        }
    }
}
