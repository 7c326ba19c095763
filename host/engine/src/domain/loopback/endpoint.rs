//! [`LoopbackEndpoint`]: a queue pair on the loopback NIC. The CPU thread
//! that polls it is the NIC: it runs each operation against the target's
//! registered memory, after the protection check, and reports completions.
//!
//! Invariants: a failed check changes nothing (all checks run before the
//! first byte moves); a write's immediate is queued at the target only after
//! its data is copied; 8-byte atomics go through `AtomicU64` on the target
//! word, so they are atomic against each other from any thread. In
//! unordered mode, due operations run and complete in a seeded shuffle
//! within windows of `window` operations (SRD-like); with injected latency
//! or bandwidth an operation takes effect when its modelled time has come,
//! and the poller sleeps until then instead of spinning. With injected
//! [`Faults`](super::Faults), each operation draws its fate once, when it
//! is posted (so the faults of a seed follow the posting order, whatever
//! the timing): it fails before it runs (nothing happens), or runs and
//! then fails (its effect stays, its value is dropped), or completes; an
//! operation that fails on its own keeps its own error.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rolex_core::wire::{Access, NetAddr};

use super::fabric::{NicState, RegionCache};
use super::LoopbackConfig;
use crate::counters::Counters;
use crate::domain::{Completion, Endpoint, Incoming, Progress, Remote, WorkOp, WorkRequest};
use crate::error::{ProtectionCheck, TransferError};

/// How often a send that found no receive buffer is retried.
const SEND_RETRY: Duration = Duration::from_micros(200);

enum Exec {
    Done(Result<u64, TransferError>),
    /// A send found no posted receive buffer: retry later.
    NoBuffer,
}

/// An injected fault drawn for one operation (see [`super::Faults`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// Fail without running: the target sees nothing.
    Before,
    /// Run, then fail: the effect stays, the result is an error.
    After,
    /// A WRITE of which only the first `n` bytes land (`0 < n < len`),
    /// then fail; the rest of its doorbell batch fails [`Fault::Before`]
    /// (see [`super::Faults`]).
    Torn(u64),
}

/// A posted operation and the fault drawn for it.
struct Posted {
    wr: WorkRequest,
    fault: Option<Fault>,
}

/// A send waiting for the peer to post a receive buffer.
struct WaitingSend {
    since: Instant,
    next_try: Instant,
    wr: WorkRequest,
    /// The fault drawn when it first ran, applied once it is delivered.
    fault: Option<Fault>,
}

/// Shuffles `chunk` (in posting order) as `shuffle` would, then puts its
/// writes back in posting order among themselves, in the places the
/// shuffle gave writes: reads and atomics still run in any order, around
/// and between them (`Unordered::writes_in_order`).
fn shuffle_but_writes(chunk: &mut Vec<Posted>, rng: &mut StdRng) {
    let is_write = |p: &Posted| matches!(p.wr.op, WorkOp::Write { .. });
    let mut order: Vec<usize> = (0..chunk.len()).collect();
    order.shuffle(rng);
    // The writes' own indices, in posting order, into the places of writes.
    let mut writes = (0..chunk.len()).filter(|&i| is_write(&chunk[i]));
    for at in order.iter_mut() {
        if is_write(&chunk[*at]) {
            *at = writes.next().unwrap_or(*at);
        }
    }
    let mut taken: Vec<Option<Posted>> = chunk.drain(..).map(Some).collect();
    chunk.extend(order.into_iter().filter_map(|i| taken[i].take()));
}

/// A queue pair on the loopback NIC (see the module docs).
pub struct LoopbackEndpoint {
    nic: Arc<NicState>,
    cfg: LoopbackConfig,
    /// Resolved peers (an address vector).
    peers: Peers,
    /// Posted, not yet executed: `(due, request)`, due times non-decreasing.
    inflight: VecDeque<(Instant, Posted)>,
    waiting: VecDeque<WaitingSend>,
    ready: Vec<Completion>,
    link_free: Instant,
    rng: Option<StdRng>,
    /// The draws of injected faults, when configured.
    fault_rng: Option<StdRng>,
    scratch: Vec<Posted>,
    done_scratch: Vec<Completion>,
    /// The region the last operation hit (see [`RegionCache`]).
    regions: RegionCache,
    /// A torn write broke this endpoint for good (`Faults::tear_kills`).
    severed: bool,
}

impl LoopbackEndpoint {
    pub(crate) fn new(nic: Arc<NicState>, cfg: LoopbackConfig, salt: u64) -> Self {
        let rng = cfg
            .unordered
            .map(|u| StdRng::seed_from_u64(u.seed ^ salt.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        // Another multiplier: the fault stream is not the shuffle's.
        let fault_rng = cfg
            .faults
            .map(|f| StdRng::seed_from_u64(f.seed ^ salt.wrapping_mul(0xd6e8_feb8_6659_fd93)));
        LoopbackEndpoint {
            nic,
            cfg,
            peers: Peers::default(),
            inflight: VecDeque::new(),
            waiting: VecDeque::new(),
            ready: Vec::new(),
            link_free: Instant::now(),
            rng,
            fault_rng,
            scratch: Vec::new(),
            done_scratch: Vec::new(),
            regions: RegionCache::default(),
            severed: false,
        }
    }

    /// Whether operations take effect at post time (no latency, bandwidth
    /// or shuffling configured).
    fn direct(&self) -> bool {
        self.cfg.latency.is_zero() && self.cfg.bandwidth_gbps.is_none() && self.rng.is_none()
    }

    fn exec(&mut self, op: &WorkOp) -> Exec {
        match self.exec_inner(op) {
            Ok(Some(v)) => Exec::Done(Ok(v)),
            Ok(None) => Exec::NoBuffer,
            Err(e) => Exec::Done(Err(e)),
        }
    }

    /// Runs one operation; `Ok(None)` when a send must wait for a buffer.
    fn exec_inner(&mut self, op: &WorkOp) -> Result<Option<u64>, TransferError> {
        let t = target(&mut self.peers, op.peer())?;
        match op {
            WorkOp::Read { local, remote, len } => {
                let (region, off) =
                    t.check(&mut self.regions, remote, *len, Access::REMOTE_READ)?;
                let rg = region.enter().ok_or_else(|| gone(t, remote))?;
                let lg = local
                    .region
                    .enter()
                    .ok_or(TransferError::RegionDeregistered)?;
                if !rg.copy_to(off, &lg, local.offset, *len) {
                    return Err(TransferError::LocalOutOfBounds {
                        offset: local.offset,
                        len: *len,
                        region_len: local.region.len(),
                    });
                }
                Ok(Some(0))
            }
            WorkOp::Write {
                local,
                remote,
                len,
                imm,
            } => {
                let (region, off) =
                    t.check(&mut self.regions, remote, *len, Access::REMOTE_WRITE)?;
                if let Some(local) = local {
                    let rg = region.enter().ok_or_else(|| gone(t, remote))?;
                    let lg = local
                        .region
                        .enter()
                        .ok_or(TransferError::RegionDeregistered)?;
                    if !lg.copy_to(local.offset, &rg, off, *len) {
                        return Err(TransferError::LocalOutOfBounds {
                            offset: local.offset,
                            len: *len,
                            region_len: local.region.len(),
                        });
                    }
                }
                if let Some(imm) = imm {
                    t.deliver(Incoming::Imm(*imm));
                }
                Ok(Some(0))
            }
            WorkOp::Cas {
                remote,
                expected,
                new,
            } => {
                let (region, off) = t.check(&mut self.regions, remote, 8, Access::REMOTE_ATOMIC)?;
                let rg = region.enter().ok_or_else(|| gone(t, remote))?;
                let word = rg
                    .word(off)
                    .ok_or(TransferError::UnknownPeer { peer: t.addr })?;
                Ok(Some(
                    match word.compare_exchange(*expected, *new, SeqCst, SeqCst) {
                        Ok(old) | Err(old) => old,
                    },
                ))
            }
            WorkOp::Faa { remote, add } => {
                let (region, off) = t.check(&mut self.regions, remote, 8, Access::REMOTE_ATOMIC)?;
                let rg = region.enter().ok_or_else(|| gone(t, remote))?;
                let word = rg
                    .word(off)
                    .ok_or(TransferError::UnknownPeer { peer: t.addr })?;
                Ok(Some(word.fetch_add(*add, SeqCst)))
            }
            WorkOp::Send { peer, data } => {
                let Some(mut buf) = t.recvq.pop() else {
                    return Ok(None);
                };
                if data.len() > buf.data.len() {
                    let buffer_len = buf.data.len() as u64;
                    t.recvq.push(buf);
                    return Err(TransferError::MessageTooLarge {
                        peer: *peer,
                        len: data.len() as u64,
                        buffer_len,
                    });
                }
                buf.data[..data.len()].copy_from_slice(data);
                t.deliver(Incoming::Message {
                    buf,
                    len: data.len(),
                });
                Ok(Some(0))
            }
        }
    }

    fn finish(
        &mut self,
        wr_id: u64,
        result: Result<u64, TransferError>,
        out: &mut Vec<Completion>,
    ) {
        if result.is_err() {
            Counters::bump(&self.nic.counters.errors, 1);
        }
        out.push(Completion { wr_id, result });
    }

    /// The injected fault of the next operation posted, `op`, if any: one
    /// draw per operation (and one more for a torn write's prefix), so the
    /// faults of a seed do not depend on outcomes.
    fn draw_fault(&mut self, op: &WorkOp) -> Option<Fault> {
        let f = self.cfg.faults?;
        let rng = self.fault_rng.as_mut()?;
        let x: f64 = rng.gen();
        let (p, torn) = (f.probability, f.torn);
        match *op {
            _ if x < p / 2.0 => Some(Fault::Before),
            _ if x < p => Some(Fault::After),
            WorkOp::Write { len, .. } if len > 8 && x < p + torn => {
                Some(Fault::Torn(rng.gen_range(1..len)))
            }
            _ => None,
        }
    }

    /// The faults of a doorbell batch's next operation, `op`, given whether
    /// an earlier operation of the batch was torn (then it fails before it
    /// runs: the connection is down).
    fn batch_fault(&mut self, op: &WorkOp, broken: &mut bool) -> Option<Fault> {
        let drawn = self.draw_fault(op);
        if *broken || self.severed {
            return Some(Fault::Before);
        }
        *broken = matches!(drawn, Some(Fault::Torn(_)));
        self.severed = *broken && self.cfg.faults.is_some_and(|f| f.tear_kills);
        drawn
    }

    /// Runs one request now: completes it, or parks a send that found no
    /// receive buffer (`now`: the caller's clock, read here if `None`).
    fn run(&mut self, posted: Posted, now: Option<Instant>, out: &mut Vec<Completion>) {
        let Posted { wr, fault } = posted;
        match (fault, &wr.op) {
            (Some(Fault::Before), _) => {
                let err = injected(&wr.op);
                self.finish(wr.wr_id, Err(err), out);
                return;
            }
            (Some(Fault::Torn(n)), WorkOp::Write { local, remote, .. }) => {
                // The prefix lands (protection checked on it alone, as a
                // target checks what it places); the write fails either way.
                let prefix = WorkOp::Write {
                    local: local.clone(),
                    remote: *remote,
                    len: n,
                    imm: None,
                };
                let _ = self.exec(&prefix);
                let err = injected(&wr.op);
                self.finish(wr.wr_id, Err(err), out);
                return;
            }
            _ => {}
        }
        match self.exec(&wr.op) {
            Exec::Done(r) => self.finish(wr.wr_id, after(fault, &wr.op, r), out),
            Exec::NoBuffer => {
                let now = now.unwrap_or_else(Instant::now);
                self.waiting.push_back(WaitingSend {
                    since: now,
                    next_try: now + SEND_RETRY,
                    wr,
                    fault,
                })
            }
        }
    }

    /// The modelled time at which a request of `bytes` posted now lands.
    fn due(&mut self, now: Instant, bytes: u64) -> Instant {
        let start = self.link_free.max(now);
        let xfer = match self.cfg.bandwidth_gbps {
            Some(gbps) => Duration::from_secs_f64(bytes as f64 * 8.0 / (gbps * 1e9)),
            None => Duration::ZERO,
        };
        self.link_free = start + xfer;
        self.link_free + self.cfg.latency
    }

    fn retry_waiting(&mut self, now: Instant) {
        let mut n = self.waiting.len();
        while n > 0 {
            n -= 1;
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            if w.next_try > now {
                self.waiting.push_back(w);
                continue;
            }
            match self.exec(&w.wr.op) {
                Exec::Done(r) => {
                    let r = after(w.fault, &w.wr.op, r);
                    let mut out = std::mem::take(&mut self.ready);
                    self.finish(w.wr.wr_id, r, &mut out);
                    self.ready = out;
                }
                Exec::NoBuffer if now.duration_since(w.since) >= self.cfg.recv_wait => {
                    let err = TransferError::NoReceiveBuffer {
                        peer: *w.wr.op.peer(),
                        waited: now.duration_since(w.since),
                    };
                    let mut out = std::mem::take(&mut self.ready);
                    self.finish(w.wr.wr_id, Err(err), &mut out);
                    self.ready = out;
                }
                Exec::NoBuffer => self.waiting.push_back(WaitingSend {
                    next_try: now + SEND_RETRY,
                    ..w
                }),
            }
        }
    }
}

/// The error of an access whose region the target deregistered after the
/// NIC's check found it (the check and the copy race with `dereg_mr`): its
/// key is gone, as a later access finds in the check itself — unless the
/// whole target is going away (its engine shutting down).
fn gone(t: &NicState, remote: &Remote) -> TransferError {
    if t.alive() {
        TransferError::Protection {
            peer: t.addr,
            rkey: remote.rkey,
            check: ProtectionCheck::UnknownKey,
        }
    } else {
        TransferError::UnknownPeer { peer: t.addr }
    }
}

/// An endpoint's resolved peers (an address vector), with the last one
/// used kept apart: a queue pair mostly talks to one peer, and comparing
/// its address is cheaper than hashing it.
#[derive(Default)]
struct Peers {
    last: Option<(NetAddr, Arc<NicState>)>,
    all: HashMap<NetAddr, Arc<NicState>>,
}

/// The live NIC at `peer`, resolved through (and kept in) `peers`. Borrowed,
/// not cloned: every thread reading one target would otherwise write its
/// reference count's cache line on each operation.
fn target<'p>(peers: &'p mut Peers, peer: &NetAddr) -> Result<&'p Arc<NicState>, TransferError> {
    let hit = matches!(&peers.last, Some((a, n)) if a == peer && n.alive());
    if !hit {
        let known = peers.all.get(peer).filter(|n| n.alive()).cloned();
        let nic = match known {
            Some(n) => n,
            None => {
                peers.all.remove(peer);
                let n = NicState::lookup(peer)
                    .filter(|n| n.alive())
                    .ok_or(TransferError::UnknownPeer { peer: *peer })?;
                peers.all.insert(*peer, n.clone());
                n
            }
        };
        peers.last = Some((*peer, nic));
    }
    let nic = match &peers.last {
        Some((_, n)) => n,
        None => return Err(TransferError::UnknownPeer { peer: *peer }),
    };
    if nic.failed() {
        return Err(TransferError::PeerFailed { peer: *peer });
    }
    Ok(nic)
}

/// The error of an injected fault on `op`.
fn injected(op: &WorkOp) -> TransferError {
    TransferError::InjectedFault {
        op: op.kind(),
        peer: *op.peer(),
    }
}

/// `result` of an operation that ran, under its drawn `fault`: an
/// [`Fault::After`] turns a success into the injected error (the effect
/// stays; an atomic's old value is dropped), an error of its own stands.
fn after(
    fault: Option<Fault>,
    op: &WorkOp,
    result: Result<u64, TransferError>,
) -> Result<u64, TransferError> {
    match (fault, result) {
        (Some(Fault::After), Ok(_)) => Err(injected(op)),
        (_, r) => r,
    }
}

impl Endpoint for LoopbackEndpoint {
    fn post(&mut self, batch: &mut Vec<WorkRequest>) {
        if batch.is_empty() {
            return;
        }
        Counters::bump(&self.nic.counters.doorbells, 1);
        if self.direct() {
            // No clock: a send parked for want of a buffer reads its own.
            let mut out = std::mem::take(&mut self.ready);
            let mut broken = false;
            for wr in batch.drain(..) {
                self.nic.counters.count_posted(&wr.op);
                let fault = self.batch_fault(&wr.op, &mut broken);
                self.run(Posted { wr, fault }, None, &mut out);
            }
            self.ready = out;
            return;
        }
        let now = Instant::now();
        let mut broken = false;
        for wr in batch.drain(..) {
            self.nic.counters.count_posted(&wr.op);
            let bytes = match &wr.op {
                WorkOp::Read { len, .. } | WorkOp::Write { len, .. } => *len,
                WorkOp::Cas { .. } | WorkOp::Faa { .. } => 8,
                WorkOp::Send { data, .. } => data.len() as u64,
            };
            let due = self.due(now, bytes);
            let fault = self.batch_fault(&wr.op, &mut broken);
            self.inflight.push_back((due, Posted { wr, fault }));
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Progress {
        if self.inflight.is_empty() && self.waiting.is_empty() {
            // Nothing modelled in flight: what ran at post time is ready.
            out.append(&mut self.ready);
            return Progress::Idle;
        }
        let now = Instant::now();
        if !self.inflight.is_empty() {
            let mut due = std::mem::take(&mut self.scratch);
            while self.inflight.front().is_some_and(|(t, _)| *t <= now) {
                if let Some((_, posted)) = self.inflight.pop_front() {
                    due.push(posted);
                }
            }
            let window = self.cfg.unordered.map_or(usize::MAX, |u| u.window.max(1));
            let mut done = std::mem::take(&mut self.done_scratch);
            while !due.is_empty() {
                let take = due.len().min(window);
                let mut chunk: Vec<Posted> = due.drain(..take).collect();
                if let Some(rng) = &mut self.rng {
                    if self.cfg.unordered.is_some_and(|u| u.writes_in_order) {
                        shuffle_but_writes(&mut chunk, rng);
                    } else {
                        chunk.shuffle(rng);
                    }
                }
                for posted in chunk {
                    self.run(posted, Some(now), &mut done);
                }
                if let Some(rng) = &mut self.rng {
                    done.shuffle(rng);
                }
                out.append(&mut done);
            }
            self.scratch = due;
            self.done_scratch = done;
        }
        if !self.waiting.is_empty() {
            self.retry_waiting(now);
        }
        out.append(&mut self.ready);
        let mut p = Progress::Idle;
        if let Some((t, _)) = self.inflight.front() {
            p = p.merge(Progress::WaitUntil(*t));
        }
        if let Some(t) = self.waiting.iter().map(|w| w.next_try).min() {
            p = p.merge(Progress::WaitUntil(t));
        }
        p
    }

    fn flush(&mut self, out: &mut Vec<Completion>) {
        out.append(&mut self.ready);
        let ids: Vec<u64> = self
            .inflight
            .drain(..)
            .map(|(_, posted)| posted.wr.wr_id)
            .chain(self.waiting.drain(..).map(|w| w.wr.wr_id))
            .collect();
        for wr_id in ids {
            self.finish(wr_id, Err(TransferError::EngineShutDown), out);
        }
    }
}
