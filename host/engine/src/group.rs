//! The worker thread of each domain group, and the group's completion
//! processing that waiting threads run themselves.
//!
//! A group is 1 to 4 domains (NICs). Its state — the endpoints the worker
//! posts on, the transfers in flight, the batches being built — lives in
//! one [`WorkerCell`] behind a lock, and a *round* (take queued requests,
//! post them as one doorbell per domain, poll completions, aggregate the
//! pieces of each transfer into one notification, turn arrivals into
//! ImmCounter updates and receive callbacks) can be run by whoever holds
//! the lock:
//!
//! - the group's worker thread, which runs rounds while work is pending;
//! - a thread waiting on a [`CompletionFlag`](crate::CompletionFlag) of
//!   one of the group's operations, which runs rounds itself for the
//!   engine's spin budget ([`FlagDriver`]) — no thread hand-off between
//!   the completion and the waiter — while the worker stands aside
//!   (parked, not woken by the NICs' wait objects);
//! - a submitting thread, which posts a request whose notification is a
//!   flag at once under the lock ([`DirectPost`]) when nothing waits in
//!   the group's queue (so posting order is kept) and the NICs allow it;
//! - a client channel's thread that read completions of the group's
//!   operations while it waits for its own batch (module `batch`); while
//!   channels post on the group's NICs the worker stands aside too, when
//!   nothing needs it itself (`WorkerCell::channels_busy`).
//!
//! Invariants: every request's notification fires exactly once (on
//! shutdown with [`TransferError::EngineShutDown`] for whatever had not
//! finished; a request that reaches a closed group fails so); the worker
//! never spins while idle — with nothing in flight it parks until unparked
//! by a submission or an arrival (or, when every NIC of the group has a
//! wait object, blocks on those: see `Worker::sleep`), and while
//! operations wait on modelled time it sleeps until the earliest of them.
//! A round posts at most `ROUND_BYTES` of payload before it reads
//! completions again, so a burst of large writes does not hold back the
//! completions of those before it. Lock order: a group's cell, then a
//! NIC's own locks, then the engine's ImmCounter.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError, Weak};
use std::thread;
use std::time::{Duration, Instant};

use rolex_core::wire::NetAddr;

use crate::callback::{CallbackQueue, FlagDriver, Job, Notify};
use crate::counters::Counters;
use crate::domain::{
    AnyEndpoint, Completion, Domain, Endpoint, Incoming, Progress, Remote, WorkOp, WorkRequest,
};
use crate::error::TransferError;
use crate::imm_wait::{ImmWaits, ABORT_BIT};
use crate::shared::{DirectPost, EngineShared, GroupShared, Request};

/// Most requests a worker takes from its queue per round before it reads
/// completions again.
const ROUND_OPS: usize = 1024;
/// Most payload bytes a worker posts per round (at least one request): on
/// software providers posting copies the data into a socket, about 100 µs
/// per 256 KiB here, and completions wait meanwhile.
const ROUND_BYTES: u64 = 256 << 10;
/// Longest the worker stands aside while waiters poll its group: it then
/// looks again. The last waiter to stop polling wakes it at once when
/// something needs it (see `FlagDriver::leave` for `WorkerCell`).
const ASIDE_BACKSTOP: Duration = Duration::from_micros(500);
/// How recently a client channel must have posted on a NIC of the group
/// for the worker to leave the NICs to the channels (`channels_busy`): a
/// few of their round trips on a software fabric, so a thread between
/// two operations still counts and one that went idle soon does not.
const CHANNELS_BUSY: Duration = Duration::from_millis(1);

/// A transfer in flight: pieces left, first error, value (atomics).
struct Transfer {
    remaining: usize,
    error: Option<TransferError>,
    value: u64,
    notify: Notify,
    /// Notified by a callback: no waiter polls for it.
    callback: bool,
    /// With abort notices on: every piece that carried an immediate, in
    /// piece order; its receiver is told if the transfer fails.
    notices: Vec<Notice>,
}

/// A piece carrying an immediate, for an abort notice.
struct Notice {
    piece: u64,
    nic: usize,
    remote: Remote,
    /// Its receiving engine (`Request::receivers`).
    receiver: NetAddr,
    imm: u32,
    /// The piece completed: its target and key are good for the notice.
    landed: bool,
}

/// A work request's id: the transfer's slot in the low bits and, only for
/// a piece that needs an abort notice, 1 + its index above
/// [`PIECE_SHIFT`]. Every other piece of a transfer carries the bare slot:
/// a NIC chains consecutive pieces with the same id into one post (the
/// libfabric endpoint's `fi_writemsg` chains), so giving each piece its own
/// id would post every page alone.
const PIECE_SHIFT: u32 = 40;
const SLOT_MASK: u64 = (1 << PIECE_SHIFT) - 1;

/// The id of a transfer's piece: `notice` is the piece's index when an
/// abort notice tracks it.
fn piece_wr_id(slot: usize, notice: Option<usize>) -> u64 {
    slot as u64 | notice.map_or(0, |p| (p as u64 + 1) << PIECE_SHIFT)
}

/// The ids of a transfer's pieces in piece order, `tracked` the (sorted)
/// pieces that abort notices track; endless, zipped with the pieces.
fn piece_ids(slot: usize, tracked: impl Iterator<Item = u64>) -> impl Iterator<Item = u64> {
    let mut tracked = tracked.peekable();
    (0u64..).map(move |p| piece_wr_id(slot, tracked.next_if_eq(&p).map(|p| p as usize)))
}

/// The slot of a piece's id, and the piece's index if a notice tracks it.
fn split_wr_id(wr_id: u64) -> (usize, Option<u64>) {
    (
        (wr_id & SLOT_MASK) as usize,
        (wr_id >> PIECE_SHIFT).checked_sub(1),
    )
}

/// The `wr_id` of abort notices: no transfer waits for them.
const NOTICE: u64 = u64::MAX;

/// Where abort notices go: one per `(receiver, immediate)` of which a
/// piece failed, to the target of a piece that landed there if one did
/// (its key is known good), else of the first piece. One, because a
/// receiver counts arrivals once for all its NICs; none where every piece
/// landed, because that receiver's expectation can be met: a notice
/// arriving after it would fail the receiver's next expectation on the
/// immediate (the next step's barrier at the members a barrier reached).
fn notice_targets(notices: &[Notice]) -> Vec<(usize, Remote, u32)> {
    struct Target {
        nic: usize,
        remote: Remote,
        imm: u32,
        receiver: NetAddr,
        landed: bool,
        failed: bool,
    }
    let mut out: Vec<Target> = Vec::new();
    for n in notices {
        match out
            .iter_mut()
            .find(|t| t.receiver == n.receiver && t.imm == n.imm)
        {
            Some(t) => {
                t.failed |= !n.landed;
                if !t.landed && n.landed {
                    (t.nic, t.remote, t.landed) = (n.nic, n.remote, true);
                }
            }
            None => out.push(Target {
                nic: n.nic,
                remote: n.remote,
                imm: n.imm,
                receiver: n.receiver,
                landed: n.landed,
                failed: !n.landed,
            }),
        }
    }
    out.into_iter()
        .filter(|t| t.failed)
        .map(|t| (t.nic, t.remote, t.imm))
        .collect()
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

/// What one round found.
struct Round {
    /// Something was posted, completed or arrived.
    busy: bool,
    /// What the endpoints need next.
    progress: Progress,
}

/// The state a round works on (see the module docs).
pub(crate) struct WorkerState {
    endpoints: Vec<AnyEndpoint>,
    batches: Vec<Vec<WorkRequest>>,
    transfers: Vec<Option<Transfer>>,
    free: Vec<usize>,
    comps: Vec<Completion>,
    incoming: Vec<Incoming>,
    /// Set when the worker has shut the group down: nothing is posted any
    /// more.
    closed: bool,
    /// Abort notices queued in `batches`, not yet posted.
    notices_pending: bool,
    /// Payload bytes (at least 1 per transfer) accepted under a plug
    /// (`crate::plug`) and not yet posted; 0: none.
    unposted: u64,
}

/// A group's completion processing, shared by its worker, the threads
/// that wait on its flags and those that post directly.
pub(crate) struct WorkerCell {
    index: usize,
    engine: Arc<EngineShared>,
    state: Mutex<WorkerState>,
    /// Threads polling the group themselves right now.
    spinners: AtomicUsize,
    /// Transfers accepted and not yet notified.
    inflight: AtomicUsize,
    /// Of those, the ones notified by a callback.
    callbacks: AtomicUsize,
    /// Waiters that stopped polling with their operation in flight and
    /// sleep until it completes.
    asleep: AtomicUsize,
    /// Whether every NIC of the group lets a submitter post directly.
    direct: bool,
    /// Whether a plug may hold submissions back: every NIC's completions
    /// bring a round of the group without a waiter
    /// ([`Domain::completion_wakes_worker`]), which posts them.
    deferrable: bool,
    /// How long a waiter polls before it parks.
    spin: Duration,
}

impl WorkerCell {
    fn group(&self) -> &GroupShared {
        &self.engine.groups[self.index]
    }

    fn lock(&self) -> MutexGuard<'_, WorkerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_lock(&self) -> Option<MutexGuard<'_, WorkerState>> {
        match self.state.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// One round (see the module docs) on `s`.
    fn round(&self, s: &mut WorkerState) -> Round {
        let group = self.group();
        let mut busy = false;
        // Submissions first (new work fills the pipeline), up to a round's
        // budget: completions are read between rounds, so a burst of large
        // writes does not hold back the completions (and the submitters
        // waiting on them) of the writes before.
        let (mut taken, mut bytes) = (0, 0);
        while taken < ROUND_OPS && bytes < ROUND_BYTES {
            let Some(req) = group.queue.pop() else {
                break;
            };
            bytes += req.ops.iter().map(|(_, op)| op.bytes()).sum::<u64>();
            self.accept(s, req);
            taken += 1;
        }
        // Both flags are cleared whatever `taken` is: the post below
        // posts whatever they stand for.
        let notices = std::mem::take(&mut s.notices_pending);
        let deferred = std::mem::take(&mut s.unposted) > 0;
        if taken > 0 || notices || deferred {
            busy = true;
            s.post();
        }
        // Completions.
        let mut progress = Progress::Idle;
        for ep in &mut s.endpoints {
            progress = progress.merge(ep.poll(&mut s.comps));
        }
        if !s.comps.is_empty() {
            busy = true;
            let comps = std::mem::take(&mut s.comps);
            for c in &comps {
                self.complete(s, c.wr_id, c.result.clone());
            }
            s.comps = comps;
            s.comps.clear();
        }
        // Arrivals.
        let mut arrived = 0;
        for d in 0..group.domains.len() {
            let mut inc = std::mem::take(&mut s.incoming);
            arrived += group.domains[d].poll_incoming(&mut inc);
            for e in inc.drain(..) {
                self.arrival(d, e);
            }
            s.incoming = inc;
        }
        busy |= arrived > 0;
        // Abort notices of transfers that failed this round.
        if std::mem::take(&mut s.notices_pending) {
            busy = true;
            s.post();
        }
        if let Some(at) = self.expire_imms() {
            progress = progress.merge(Progress::WaitUntil(at));
        }
        Round { busy, progress }
    }

    fn accept(&self, s: &mut WorkerState, req: Request) {
        let Request {
            ops,
            notify,
            receivers,
        } = req;
        if s.closed {
            notify.fire(Err(TransferError::EngineShutDown), &self.engine.cbq);
            return;
        }
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
                        receiver: receivers.get(piece).copied().unwrap_or(remote.peer),
                        imm: *imm,
                        landed: false,
                    });
                }
            }
        }
        let callback = notify.flag().is_none();
        let t = Transfer {
            remaining: ops.len(),
            error: None,
            value: 0,
            notify,
            callback,
            notices,
        };
        self.inflight.fetch_add(1, SeqCst);
        if callback {
            self.callbacks.fetch_add(1, SeqCst);
        }
        let slot = match s.free.pop() {
            Some(i) => {
                s.transfers[i] = Some(t);
                i
            }
            None => {
                s.transfers.push(Some(t));
                s.transfers.len() - 1
            }
        };
        let n = s.batches.len();
        let tracked = s.transfers[slot]
            .as_ref()
            .map_or(&[][..], |t| &t.notices[..])
            .iter()
            .map(|n| n.piece);
        let ids = piece_ids(slot, tracked);
        for ((d, op), wr_id) in ops.into_iter().zip(ids) {
            s.batches[d % n].push(WorkRequest { wr_id, op });
        }
    }

    /// Counts a transfer out of those in flight (it is being notified).
    fn settled(&self, t: &Transfer) {
        if t.callback {
            self.callbacks.fetch_sub(1, SeqCst);
        }
        self.inflight.fetch_sub(1, SeqCst);
    }

    fn complete(&self, s: &mut WorkerState, wr_id: u64, result: Result<u64, TransferError>) {
        let (slot, piece) = split_wr_id(wr_id);
        let Some(Some(t)) = s.transfers.get_mut(slot) else {
            return;
        };
        match result {
            Ok(v) => {
                t.value = v;
                if let Some(Ok(i)) = piece.map(|p| t.notices.binary_search_by_key(&p, |n| n.piece))
                {
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
            if let Some(t) = s.transfers[slot].take() {
                s.free.push(slot);
                self.settled(&t);
                if t.error.is_some() && !t.notices.is_empty() && !s.closed {
                    Self::send_notices(s, &notice_targets(&t.notices));
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
    /// same target; posted by the round, its outcome ignored.
    fn send_notices(s: &mut WorkerState, notices: &[(usize, Remote, u32)]) {
        let n = s.batches.len();
        for &(d, remote, imm) in notices {
            s.batches[d % n].push(WorkRequest {
                wr_id: NOTICE,
                op: WorkOp::Write {
                    local: None,
                    remote,
                    len: 0,
                    imm: Some(imm | ABORT_BIT),
                },
            });
            s.notices_pending = true;
        }
    }

    /// Fires the expectations past their deadline (group 0 keeps them);
    /// returns the next deadline.
    fn expire_imms(&self) -> Option<Instant> {
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

    fn arrival(&self, domain: usize, e: Incoming) {
        match e {
            Incoming::Imm(imm) => {
                if !arrive(
                    &self.engine.imm,
                    &self.engine.cbq,
                    self.engine.abort_notices,
                    imm,
                ) {
                    // More than u32::MAX arrivals outstanding: count it as
                    // an error; an expectation would be reported by its
                    // caller.
                    Counters::bump(&self.engine.counters.errors, 1);
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

    /// Fails everything in flight or queued with
    /// [`TransferError::EngineShutDown`] and closes the group.
    fn shut_down(&self, s: &mut WorkerState) {
        let mut comps = Vec::new();
        for (ep, batch) in s.endpoints.iter_mut().zip(s.batches.iter_mut()) {
            for wr in batch.drain(..) {
                comps.push(Completion {
                    wr_id: wr.wr_id,
                    result: Err(TransferError::EngineShutDown),
                });
            }
            ep.flush(&mut comps);
        }
        for c in comps {
            self.complete(s, c.wr_id, c.result);
        }
        s.closed = true;
        while let Some(req) = self.group().queue.pop() {
            req.notify
                .fire(Err(TransferError::EngineShutDown), &self.engine.cbq);
        }
        for t in s.transfers.iter_mut().filter_map(Option::take) {
            self.settled(&t);
            t.notify.fire(
                Err(t.error.unwrap_or(TransferError::EngineShutDown)),
                &self.engine.cbq,
            );
        }
    }
}

impl WorkerState {
    /// Posts every batch built (one doorbell per domain).
    fn post(&mut self) {
        for (ep, batch) in self.endpoints.iter_mut().zip(self.batches.iter_mut()) {
            ep.post(batch);
        }
    }
}

/// Counts one arrival of `imm` in the engine's ImmCounter and fires the
/// expectation it completes, on the calling thread (flags are set here,
/// callbacks go to the callback thread); with abort notices on, an
/// immediate with [`ABORT_BIT`] fails the expectation of the immediate
/// below it instead. `false` when the count of `imm` overflowed.
pub(crate) fn arrive(imms: &Mutex<ImmWaits>, cbq: &CallbackQueue, aborts: bool, imm: u32) -> bool {
    let mut w = imms.lock().unwrap_or_else(|e| e.into_inner());
    if aborts && imm & ABORT_BIT != 0 {
        let fired = w.abort(imm & !ABORT_BIT);
        drop(w);
        if let Some((n, r)) = fired {
            n.fire(r, cbq);
        }
        return true;
    }
    let fired = w.arrive(imm);
    drop(w);
    match fired {
        Ok(Some((notify, r))) => {
            notify.fire(r, cbq);
            true
        }
        Ok(None) => true,
        Err(_) => false,
    }
}

impl WorkerCell {
    /// Whether client channels keep the group's NICs polled (one posted
    /// within [`CHANNELS_BUSY`]) and nothing needs the worker itself: no
    /// transfer notified by a callback in flight (a flag's completion is
    /// seen to by its waiter, or by a channel's thread that reads it, see
    /// `domain::round_wanted_here`), no waiter asleep, nothing queued.
    /// Then the worker stands aside, parked: blocked on the NICs' wait
    /// objects it would wake for every packet of the channels' (a thread
    /// hand-off and a lock taken against theirs each time). Whatever it
    /// is needed for meanwhile wakes it (a submission, an arrival, a
    /// completion of its own read outside a channel's wait), and it looks
    /// again every [`ASIDE_BACKSTOP`].
    fn channels_busy(&self) -> bool {
        self.callbacks.load(SeqCst) == 0
            && self.asleep.load(SeqCst) == 0
            && self.group().queue.is_empty()
            && self
                .group()
                .domains
                .iter()
                .any(|d| d.channels_busy(CHANNELS_BUSY))
    }
}

impl FlagDriver for WorkerCell {
    fn try_drive(&self) -> bool {
        match self.try_lock() {
            Some(mut s) if !s.closed => {
                self.round(&mut s);
                true
            }
            _ => false,
        }
    }

    fn wake_worker(&self) {
        self.group().wake();
    }

    fn spin(&self) -> Duration {
        self.spin
    }

    fn enter(&self) {
        self.spinners.fetch_add(1, SeqCst);
    }

    fn leave(&self, waiting: bool) {
        if waiting {
            self.asleep.fetch_add(1, SeqCst);
        }
        // The last waiter to stop polling hands the group back to the
        // worker at once when work is left that no polling thread will see
        // to: a sleeper's operation, a callback's, queued requests. Flag
        // operations nobody waits on yet are not reason enough: their
        // waiters poll for them when they come (a waiter that got its
        // outcome is usually back within microseconds, and waking the
        // worker for each cost a thread hand-off per transfer at depth 32);
        // the worker looks again after `ASIDE_BACKSTOP` anyway.
        if self.spinners.fetch_sub(1, SeqCst) == 1
            && (waiting
                || self.asleep.load(SeqCst) > 0
                || self.callbacks.load(SeqCst) > 0
                || !self.group().queue.is_empty())
        {
            self.group().wake();
        }
    }

    fn woke(&self) {
        self.asleep.fetch_sub(1, SeqCst);
    }
}

impl DirectPost for WorkerCell {
    fn try_post(&self, req: Request) -> Result<(), Request> {
        // A send may wait for the peer's receive buffer: the worker's
        // timed retries see to it.
        let sends = req
            .ops
            .iter()
            .any(|(_, op)| matches!(op, WorkOp::Send { .. }));
        if !self.direct || sends {
            return Err(req);
        }
        let Some(mut s) = self.try_lock() else {
            // A round is running: it (or the next) takes the queue.
            return Err(req);
        };
        // Requests queued before this one are posted first (posting order).
        if s.closed || !self.group().queue.is_empty() {
            return Err(req);
        }
        // Under a plug, with transfers in flight to batch with: posted
        // later, with the thread's next submissions (`crate::plug`), up to
        // a round's worth of payload: larger posts hold completions back
        // (`ROUND_BYTES`).
        let bytes = req.ops.iter().map(|(_, op)| op.bytes()).sum::<u64>().max(1);
        let defer = self.deferrable
            && crate::plug::plugged()
            && self.inflight.load(SeqCst) > 0
            && s.unposted + bytes <= ROUND_BYTES;
        self.accept(&mut s, req);
        if defer {
            s.unposted += bytes;
        } else {
            s.unposted = 0;
            s.post();
        }
        Ok(())
    }

    fn flush(&self) {
        let mut s = self.lock();
        if std::mem::take(&mut s.unposted) > 0 {
            s.post();
        }
    }
}

/// The worker thread of one group.
pub(crate) struct Worker {
    cell: Arc<WorkerCell>,
    /// The NICs' wait objects when every NIC of the group has one
    /// ([`Domain::wait_fd`]): the worker blocks on them instead of
    /// parking, so a NIC's event wakes it without a thread in between.
    wait_fds: Vec<libc::pollfd>,
}

/// How a worker is started.
pub(crate) struct WorkerConfig {
    /// Pin the thread to a CPU.
    pub(crate) pin: bool,
    /// How long a waiter polls the group before it parks.
    pub(crate) spin: Duration,
}

impl Worker {
    pub(crate) fn spawn(
        engine: Arc<EngineShared>,
        index: usize,
        cfg: &WorkerConfig,
    ) -> Result<thread::JoinHandle<()>, TransferError> {
        let group = &engine.groups[index];
        let endpoints = group
            .domains
            .iter()
            .map(|d| d.open_endpoint())
            .collect::<Result<Vec<_>, _>>()?;
        let n = endpoints.len();
        let direct = group.domains.iter().all(|d| d.direct_post());
        let deferrable = group.domains.iter().all(|d| d.completion_wakes_worker());
        let cell = Arc::new(WorkerCell {
            index,
            engine: engine.clone(),
            state: Mutex::new(WorkerState {
                endpoints,
                batches: (0..n).map(|_| Vec::new()).collect(),
                transfers: Vec::new(),
                free: Vec::new(),
                comps: Vec::new(),
                incoming: Vec::new(),
                closed: false,
                notices_pending: false,
                unposted: 0,
            }),
            spinners: AtomicUsize::new(0),
            inflight: AtomicUsize::new(0),
            callbacks: AtomicUsize::new(0),
            asleep: AtomicUsize::new(0),
            direct,
            deferrable,
            spin: cfg.spin,
        });
        let flag_driver: Weak<dyn FlagDriver> = Arc::downgrade(&cell) as Weak<dyn FlagDriver>;
        let direct_post: Weak<dyn DirectPost> = Arc::downgrade(&cell) as Weak<dyn DirectPost>;
        let _ = group.flag_driver.set(flag_driver);
        let _ = group.direct.set(direct_post);
        let worker = Worker {
            cell,
            wait_fds: Vec::new(),
        };
        let pin = cfg.pin;
        let ready = Arc::new(AtomicBool::new(false));
        let ready2 = ready.clone();
        let handle = thread::Builder::new()
            .name(format!("rolex-te{}-g{index}", engine.id))
            .spawn(move || {
                let mut worker = worker;
                if pin {
                    pin_current_thread();
                }
                let engine = worker.cell.engine.clone();
                let group = &engine.groups[worker.cell.index];
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

    fn run(mut self) {
        let cell = self.cell.clone();
        let mut nap = Duration::from_micros(1);
        loop {
            let round = {
                let mut s = cell.lock();
                let round = cell.round(&mut s);
                if cell.engine.shutdown.load(SeqCst) {
                    cell.shut_down(&mut s);
                    return;
                }
                round
            };
            if round.busy {
                nap = Duration::from_micros(1);
                continue;
            }
            if cell.spinners.load(SeqCst) > 0 || cell.channels_busy() {
                // Waiters poll the group themselves: stand aside, parked
                // rather than on the wait objects (which would wake this
                // thread for every completion they handle).
                thread::park_timeout(ASIDE_BACKSTOP);
                continue;
            }
            match round.progress {
                Progress::Idle => self.sleep(None),
                Progress::WaitUntil(t) => {
                    let now = Instant::now();
                    if t > now {
                        // A modelled deadline: wake on time, not up to
                        // the default timer slack late.
                        crate::timer::precise_timers();
                        self.sleep(Some(t - now));
                    } else {
                        // Busy polling: leave the CPU to others between
                        // rounds, outside the lock.
                        thread::yield_now();
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
        let engine = &self.cell.engine;
        let group = &engine.groups[self.cell.index];
        group.sleeping.store(true, SeqCst);
        // Pairs with the fence in `GroupShared::wake`: a submission either
        // sees `sleeping` and signals, or is seen here.
        std::sync::atomic::fence(SeqCst);
        let may_block = group.queue.is_empty()
            && !engine.shutdown.load(SeqCst)
            && self.cell.spinners.load(SeqCst) == 0
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
            } else if rc > 0 {
                // A peer's operation aimed at this NIC leaves no completion
                // here: its wake-up is the only sign of that activity
                // (busy polling counts from it).
                for (d, p) in group.domains.iter().zip(&self.wait_fds) {
                    if p.revents != 0 {
                        d.woken();
                    }
                }
            }
        }
        group.sleeping.store(false, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(piece: u64, receiver: &NetAddr, nic: &NetAddr, imm: u32, landed: bool) -> Notice {
        Notice {
            piece,
            nic: piece as usize % 2,
            remote: Remote {
                peer: *nic,
                rkey: piece,
                addr: 0,
            },
            receiver: *receiver,
            imm,
            landed,
        }
    }

    #[test]
    fn one_notice_per_receiver_with_a_failed_piece() {
        let addr = |s: &str| NetAddr::new(s.as_bytes()).unwrap();
        let (r1, r1b, r2, r3) = (addr("r1/0"), addr("r1/1"), addr("r2/0"), addr("r3/0"));
        let notices = [
            // Receiver 1, on both its NICs: piece 1 failed, piece 0 landed.
            notice(0, &r1, &r1, 5, true),
            notice(1, &r1, &r1b, 5, false),
            notice(2, &r1, &r1b, 5, true),
            // Receiver 2: everything landed, so no notice.
            notice(3, &r2, &r2, 5, true),
            notice(4, &r2, &r2, 5, true),
            // Receiver 3: nothing landed; the first piece's target.
            notice(5, &r3, &r3, 5, false),
            notice(6, &r3, &r3, 5, false),
            // Another immediate to receiver 1: its own notice.
            notice(7, &r1, &r1b, 6, false),
        ];
        let got: Vec<(u64, u32)> = notice_targets(&notices)
            .into_iter()
            .map(|(_, r, imm)| (r.rkey, imm))
            .collect();
        assert_eq!(got, vec![(0, 5), (5, 5), (7, 6)]);
    }

    #[test]
    fn pieces_without_a_notice_share_their_transfers_id() {
        // 16 pages, no immediates: one id for all, so a NIC may chain them.
        let ids: Vec<u64> = piece_ids(7, std::iter::empty()).take(16).collect();
        assert!(ids.iter().all(|&id| id == 7), "{ids:x?}");
        assert_eq!(split_wr_id(ids[0]), (7, None));
    }

    #[test]
    fn pieces_a_notice_tracks_are_named_apart() {
        // Pieces 0 and 5 carry immediates (tracked); the rest do not.
        let ids: Vec<u64> = piece_ids(3, [0u64, 5].into_iter()).take(8).collect();
        for (p, &id) in ids.iter().enumerate() {
            let (slot, piece) = split_wr_id(id);
            assert_eq!(slot, 3);
            match p {
                0 | 5 => assert_eq!(piece, Some(p as u64)),
                _ => assert_eq!((id, piece), (3, None)),
            }
        }
        assert_ne!(ids[0], ids[1], "a tracked piece 0 is not an untracked one");
    }
}
