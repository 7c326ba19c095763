//! The fabric model (design §3): a [`Domain`] is one NIC, an [`Endpoint`]
//! is a queue pair with its completion queue on it.
//!
//! A domain registers memory (handing out remote keys), resolves peers,
//! holds posted receive buffers and reports what arrives from peers
//! (immediates, messages). An endpoint posts doorbell batches of
//! [`WorkRequest`]s — read, write (optionally with immediate), 8-byte CAS
//! and fetch-and-add, send — and reports each one's [`Completion`] exactly
//! once, in any order. Backends are selected through [`AnyDomain`] /
//! [`AnyEndpoint`] (enum dispatch); `loopback` is the first, the libfabric
//! (feature `libfabric`) and verbs (feature `verbs`) domains plug in beside
//! it.

#[cfg(feature = "libfabric")]
pub mod fabric;
pub mod loopback;
#[cfg(feature = "verbs")]
pub mod verbs;

use std::os::fd::RawFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::Thread;
use std::time::Instant;

use rolex_core::wire::NetAddr;

use crate::atomics::AtomicProfile;
use crate::counters::CounterSnapshot;
use crate::error::{OpKind, TransferError};
use crate::region::Region;

/// A remote location: which NIC, which key, which address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    /// The target NIC.
    pub peer: NetAddr,
    /// Remote key of the target region on that NIC.
    pub rkey: u64,
    /// Address in the target's address space (region start + offset).
    pub addr: u64,
}

/// A local location: a registered region and an offset in it.
#[derive(Clone, Debug)]
pub struct Local {
    /// The region.
    pub region: Arc<Region>,
    /// Byte offset in it.
    pub offset: u64,
}

/// One operation for a NIC.
#[derive(Clone, Debug)]
pub enum WorkOp {
    /// Copy `len` remote bytes into local memory.
    Read {
        /// Destination.
        local: Local,
        /// Source.
        remote: Remote,
        /// Bytes.
        len: u64,
    },
    /// Copy `len` local bytes to remote memory; with an immediate, the
    /// target is told after the data is visible.
    Write {
        /// Source; `None` only for a zero-byte write.
        local: Option<Local>,
        /// Destination.
        remote: Remote,
        /// Bytes.
        len: u64,
        /// Immediate delivered to the target.
        imm: Option<u32>,
    },
    /// 8-byte compare-and-swap; completes with the old value.
    Cas {
        /// The word (8-byte aligned).
        remote: Remote,
        /// Value expected.
        expected: u64,
        /// Value stored if the word equals `expected`.
        new: u64,
    },
    /// 8-byte fetch-and-add (wrapping); completes with the old value.
    Faa {
        /// The word (8-byte aligned).
        remote: Remote,
        /// Addend.
        add: u64,
    },
    /// Two-sided send into a receive buffer the peer posted.
    Send {
        /// The target NIC.
        peer: NetAddr,
        /// The message (copied at submission).
        data: Vec<u8>,
    },
}

impl WorkOp {
    /// The NIC this operation goes to.
    pub fn peer(&self) -> &NetAddr {
        match self {
            WorkOp::Read { remote, .. }
            | WorkOp::Write { remote, .. }
            | WorkOp::Cas { remote, .. }
            | WorkOp::Faa { remote, .. } => &remote.peer,
            WorkOp::Send { peer, .. } => peer,
        }
    }

    /// Payload bytes the operation moves (8 for atomics).
    pub fn bytes(&self) -> u64 {
        match self {
            WorkOp::Read { len, .. } | WorkOp::Write { len, .. } => *len,
            WorkOp::Cas { .. } | WorkOp::Faa { .. } => 8,
            WorkOp::Send { data, .. } => data.len() as u64,
        }
    }

    /// Which kind of operation this is, as errors name it.
    pub fn kind(&self) -> OpKind {
        match self {
            WorkOp::Read { .. } => OpKind::Read,
            WorkOp::Write { .. } => OpKind::Write,
            WorkOp::Cas { .. } => OpKind::Cas,
            WorkOp::Faa { .. } => OpKind::Faa,
            WorkOp::Send { .. } => OpKind::Send,
        }
    }
}

/// An operation tagged with the caller's id, returned in its completion.
#[derive(Clone, Debug)]
pub struct WorkRequest {
    /// Caller's id.
    pub wr_id: u64,
    /// The operation.
    pub op: WorkOp,
}

/// The outcome of one work request: the old word for atomics, 0 otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The request's id.
    pub wr_id: u64,
    /// Its outcome.
    pub result: Result<u64, TransferError>,
}

/// What an endpoint needs after a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Nothing outstanding.
    Idle,
    /// Work outstanding; poll again soon (hardware decides when).
    Busy,
    /// Work outstanding that cannot complete before this instant: sleep
    /// until then (injected latency, a send waiting for a receive buffer).
    WaitUntil(Instant),
}

impl Progress {
    /// The more urgent of two.
    pub fn merge(self, other: Progress) -> Progress {
        match (self, other) {
            (Progress::Busy, _) | (_, Progress::Busy) => Progress::Busy,
            (Progress::WaitUntil(a), Progress::WaitUntil(b)) => Progress::WaitUntil(a.min(b)),
            (Progress::WaitUntil(a), Progress::Idle) | (Progress::Idle, Progress::WaitUntil(a)) => {
                Progress::WaitUntil(a)
            }
            (Progress::Idle, Progress::Idle) => Progress::Idle,
        }
    }
}

/// The callback of a receive pool: called with each received message.
pub type RecvFn = dyn Fn(&[u8]) + Send + Sync;

/// A receive buffer of a pool; handed back to its domain after the pool's
/// callback has seen the message in it.
pub struct RecvBuffer {
    /// The bytes.
    pub data: Box<[u8]>,
    /// The pool's callback.
    pub pool: Arc<RecvFn>,
}

impl std::fmt::Debug for RecvBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBuffer")
            .field("len", &self.data.len())
            .finish()
    }
}

/// What arrives at a domain from peers.
#[derive(Debug)]
pub enum Incoming {
    /// A write carrying this immediate has landed (its data is visible).
    Imm(u32),
    /// A message landed in a posted receive buffer.
    Message {
        /// The buffer.
        buf: RecvBuffer,
        /// Message bytes at its start.
        len: usize,
    },
}

/// Where a NIC hands each arriving immediate at once, from whichever thread
/// learns of it (the engine's ImmCounter: an expectation's flag is set
/// without a hop through the worker). Returns `false` when the count of
/// that immediate overflowed (the NIC counts it as an error).
pub type ImmSink = Arc<dyn Fn(u32) -> bool + Send + Sync>;

thread_local! {
    /// Set while this thread waits on a client channel that runs its
    /// group's round itself when a backend asks ([`round_wanted_here`]).
    static DRIVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// A backend asked this (driving) thread for a round of its group.
    static ROUND_WANTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Called by a backend that read completions of another endpoint than the
/// one polled (the group worker's, from a client channel's poll): whether
/// the calling thread runs the group's round for them itself soon (a
/// channel waiting in its group, see [`Driving`]), so the backend need not
/// wake the worker — a thread hand-off and, on a busy-polling NIC, a
/// second spinning thread per such completion.
pub(crate) fn round_wanted_here() -> bool {
    DRIVING.with(|d| {
        if d.get() {
            ROUND_WANTED.with(|w| w.set(true));
        }
        d.get()
    })
}

/// While alive, this thread answers [`round_wanted_here`] with yes; it
/// then owes its group a round, checked with [`Driving::take_wanted`].
pub(crate) struct Driving(());

impl Driving {
    pub(crate) fn new() -> Driving {
        DRIVING.with(|d| d.set(true));
        Driving(())
    }

    /// Whether a backend asked for a round since the last call.
    pub(crate) fn take_wanted(&self) -> bool {
        ROUND_WANTED.with(|w| w.replace(false))
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        DRIVING.with(|d| d.set(false));
    }
}

/// The tail of a [`Domain::poll_incoming`] for a backend that queues what
/// its progress delivers: moves everything queued into `out`; returns how
/// many.
#[cfg(any(feature = "libfabric", feature = "verbs"))]
pub(crate) fn drain_incoming(
    queue: &crossbeam_queue::SegQueue<Incoming>,
    out: &mut Vec<Incoming>,
) -> usize {
    let mut n = 0;
    while let Some(e) = queue.pop() {
        out.push(e);
        n += 1;
    }
    n
}

/// One NIC.
pub trait Domain: Send + Sync {
    /// This NIC's address.
    fn address(&self) -> NetAddr;
    /// The device this NIC opened (`mlx5_0`, `rdmap16s27-rdm`, `lo`;
    /// `loopback` for the in-process NIC): NICs of one engine on one device
    /// share the name ([`crate::topology`]).
    fn device_name(&self) -> String;
    /// Registers a region with this NIC; returns its remote key.
    fn register(&self, region: &Arc<Region>) -> Result<u64, TransferError>;
    /// Forgets a remote key: later accesses with it fail. Called once the
    /// region is dead (new operations on it are refused); returns once no
    /// operation of this NIC in flight uses the region any more, or, where
    /// the NIC cannot tell (it pins regions itself), at once.
    fn deregister(&self, rkey: u64);
    /// Checks that a peer address is reachable.
    fn resolve(&self, peer: &NetAddr) -> Result<(), TransferError>;
    /// Opens a new queue pair on this NIC.
    fn open_endpoint(&self) -> Result<AnyEndpoint, TransferError>;
    /// Posts a receive buffer.
    fn post_recv(&self, buf: RecvBuffer);
    /// Moves what arrived since the last call into `out`; returns how many.
    fn poll_incoming(&self, out: &mut Vec<Incoming>) -> usize;
    /// The thread to unpark when something arrives.
    fn set_waker(&self, waker: Thread);
    /// Hands immediates to `sink` as they arrive instead of queueing them
    /// for [`Domain::poll_incoming`] (messages are still queued). The
    /// default keeps queueing them.
    fn set_imm_sink(&self, _sink: ImmSink) {}
    /// Whether operations posted on one endpoint take effect in order
    /// (RC-like); `false` for SRD-like unordered delivery.
    fn ordered(&self) -> bool;
    /// Whether the writes of one post call to one peer are placed at the
    /// target in posting order, each one's data before the next one's
    /// (a write cut in the middle leaves the later ones unplaced): true
    /// wherever [`Domain::ordered`] is, and where only writes after
    /// writes are ordered (`tcp;ofi_rxm` orders RMA apart from atomics).
    /// The store's redo copy of a leaf write relies on it.
    fn writes_ordered(&self) -> bool {
        self.ordered()
    }
    /// Whether writes can carry a 32-bit immediate; where not, a write
    /// with one completes with [`TransferError::NoImmediates`]. The
    /// default: yes.
    fn immediates(&self) -> bool {
        true
    }
    /// This NIC's counters.
    fn counters(&self) -> CounterSnapshot;
    /// Fault injection: while failed, every operation targeting this NIC
    /// completes with [`TransferError::PeerFailed`]. Returns whether the
    /// backend supports it.
    fn set_failed(&self, failed: bool) -> bool;
    /// Takes the NIC off the fabric: peers now get
    /// [`TransferError::UnknownPeer`].
    fn shutdown(&self);
    /// After [`Domain::shutdown`], once the engine's worker stopped
    /// progressing the NIC: closes what `shutdown` left open, cancelling
    /// the operations still in flight (a peer that never answered) and
    /// dropping what they hold, their pins on registered regions above
    /// all. The engine calls it before it waits for those pins to go
    /// (`Region::kill`), which would otherwise wait for ever. Default:
    /// nothing (a backend that closes everything in `shutdown`).
    fn close(&self) {}
    /// The NIC's wait object, if it has one the engine's worker can block
    /// on: a descriptor readable when the NIC has something to progress
    /// (a peer's bytes, acknowledgements, a socket draining). `None` (the
    /// default): the worker parks.
    fn wait_fd(&self) -> Option<RawFd> {
        None
    }
    /// Hands the wait object of [`Domain::wait_fd`] to the engine's
    /// worker: from now on the worker blocks on it instead of a thread of
    /// the NIC's own, raising `sleeping` while it does, so that arrivals
    /// read by another thread [`signal`](Domain::signal) it.
    fn take_wait(&self, _sleeping: Arc<AtomicBool>) {}
    /// Whether the worker may block on the wait object now (nothing is
    /// ready that a read of the queue would return first).
    fn may_block(&self) -> bool {
        true
    }
    /// Whether a client channel posted on this NIC within the last
    /// `within`: its thread reads the queue itself (and runs the group's
    /// round for the worker's completions it meets, see
    /// `round_wanted_here`), so the worker may stand aside instead of
    /// waking on the NIC's wait object for every packet of the channel's.
    /// The default (backends without a shared queue to compete for): no.
    fn channels_busy(&self, _within: std::time::Duration) -> bool {
        false
    }
    /// Wakes a worker blocked on the wait object.
    fn signal(&self) {}
    /// How this NIC's 8-byte atomics relate to the host (reply byte order,
    /// atomic with the CPU or not); the default is a NIC whose atomics
    /// are the CPU's own (the loopback NIC).
    fn atomic_profile(&self) -> AtomicProfile {
        AtomicProfile::CPU_COHERENT
    }
    /// The worker blocked on the wait object was woken by it: the NIC had
    /// something to do (a peer's operation aimed at it, which leaves no
    /// completion, included). The default ignores it.
    fn woken(&self) {}
    /// Whether a thread other than the group's worker may post on the
    /// worker's endpoint and leave the completion to whoever polls next
    /// (the waiter, or the worker woken by the NIC's own wait object or
    /// timer): true where posting and progress need no thread of their
    /// own. The default: no.
    fn direct_post(&self) -> bool {
        false
    }
    /// Whether the completion of an operation posted directly
    /// ([`Domain::direct_post`]) reaches the group's worker by itself (the
    /// NIC's wait object or timer wakes it), so that a round of the group
    /// comes without a waiter. Submissions a [`Plug`](crate::Plug) holds
    /// back wait for that round: on a NIC where it does not come they are
    /// posted at once. The default: yes.
    fn completion_wakes_worker(&self) -> bool {
        true
    }
}

/// A queue pair and its completion queue.
pub trait Endpoint: Send {
    /// Posts `batch` (drained) as one doorbell; every request completes
    /// through [`Endpoint::poll`], errors included. Consecutive requests
    /// with the same `wr_id` belong to one transfer: an endpoint may chain
    /// them into one post (libfabric), each still completing once, with
    /// its own `wr_id`; where writes to a peer are ordered, libfabric
    /// chains consecutive writes of different transfers too.
    fn post(&mut self, batch: &mut Vec<WorkRequest>);
    /// Moves finished requests' completions into `out`.
    fn poll(&mut self, out: &mut Vec<Completion>) -> Progress;
    /// Completes everything outstanding with
    /// [`TransferError::EngineShutDown`] (nothing more takes effect).
    fn flush(&mut self, out: &mut Vec<Completion>);
    /// Names a thread to unpark when one of this endpoint's operations
    /// completes on another thread (`None`: nobody). The default ignores
    /// it: the caller then wakes on its own timer only.
    fn set_sleeper(&mut self, _thread: Option<Thread>) {}
    /// Marks this endpoint as a client channel's: its thread waits for its
    /// own operations, so their traffic is no reason for the group's
    /// worker to keep polling the NIC (libfabric's busy polling counts
    /// from the last *other* activity). The default does nothing.
    fn mark_channel(&mut self) {}
}

/// The backends, for dispatch.
#[derive(Clone)]
pub enum AnyDomain {
    /// The in-process loopback NIC.
    Loopback(Arc<loopback::LoopbackDomain>),
    /// A libfabric NIC.
    #[cfg(feature = "libfabric")]
    Libfabric(Arc<fabric::LibfabricDomain>),
    /// An ibverbs (RC) NIC.
    #[cfg(feature = "verbs")]
    Verbs(Arc<verbs::VerbsDomain>),
}

/// The backends' endpoints, for dispatch.
// Endpoints are few and long-lived (one per worker NIC or channel), so the
// loopback variant's size costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum AnyEndpoint {
    /// An endpoint on the loopback NIC.
    Loopback(loopback::LoopbackEndpoint),
    /// An endpoint on a libfabric NIC.
    #[cfg(feature = "libfabric")]
    Libfabric(fabric::FabricEndpoint),
    /// An endpoint on an ibverbs NIC.
    #[cfg(feature = "verbs")]
    Verbs(verbs::VerbsEndpoint),
}

macro_rules! dispatch {
    ($self:ident, $d:ident => $e:expr) => {
        match $self {
            AnyDomain::Loopback($d) => $e,
            #[cfg(feature = "libfabric")]
            AnyDomain::Libfabric($d) => $e,
            #[cfg(feature = "verbs")]
            AnyDomain::Verbs($d) => $e,
        }
    };
}

impl Domain for AnyDomain {
    fn address(&self) -> NetAddr {
        dispatch!(self, d => d.address())
    }
    fn device_name(&self) -> String {
        // The backends' own `device_name` returns a `&str`.
        dispatch!(self, d => Domain::device_name(&**d))
    }
    fn register(&self, region: &Arc<Region>) -> Result<u64, TransferError> {
        dispatch!(self, d => d.register(region))
    }
    fn deregister(&self, rkey: u64) {
        dispatch!(self, d => d.deregister(rkey))
    }
    fn resolve(&self, peer: &NetAddr) -> Result<(), TransferError> {
        dispatch!(self, d => d.resolve(peer))
    }
    fn open_endpoint(&self) -> Result<AnyEndpoint, TransferError> {
        dispatch!(self, d => d.open_endpoint())
    }
    fn post_recv(&self, buf: RecvBuffer) {
        dispatch!(self, d => d.post_recv(buf))
    }
    fn poll_incoming(&self, out: &mut Vec<Incoming>) -> usize {
        dispatch!(self, d => d.poll_incoming(out))
    }
    fn set_waker(&self, waker: Thread) {
        dispatch!(self, d => d.set_waker(waker))
    }
    fn set_imm_sink(&self, sink: ImmSink) {
        dispatch!(self, d => d.set_imm_sink(sink))
    }
    fn ordered(&self) -> bool {
        dispatch!(self, d => d.ordered())
    }
    fn writes_ordered(&self) -> bool {
        dispatch!(self, d => d.writes_ordered())
    }

    fn immediates(&self) -> bool {
        dispatch!(self, d => d.immediates())
    }
    fn counters(&self) -> CounterSnapshot {
        dispatch!(self, d => d.counters())
    }
    fn set_failed(&self, failed: bool) -> bool {
        dispatch!(self, d => d.set_failed(failed))
    }
    fn shutdown(&self) {
        dispatch!(self, d => d.shutdown())
    }
    fn close(&self) {
        dispatch!(self, d => d.close())
    }
    fn wait_fd(&self) -> Option<RawFd> {
        dispatch!(self, d => d.wait_fd())
    }
    fn take_wait(&self, sleeping: Arc<AtomicBool>) {
        dispatch!(self, d => d.take_wait(sleeping))
    }
    fn may_block(&self) -> bool {
        dispatch!(self, d => d.may_block())
    }
    fn channels_busy(&self, within: std::time::Duration) -> bool {
        dispatch!(self, d => d.channels_busy(within))
    }
    fn signal(&self) {
        dispatch!(self, d => d.signal())
    }
    fn atomic_profile(&self) -> AtomicProfile {
        dispatch!(self, d => d.atomic_profile())
    }
    fn woken(&self) {
        dispatch!(self, d => d.woken())
    }
    fn direct_post(&self) -> bool {
        dispatch!(self, d => d.direct_post())
    }
    fn completion_wakes_worker(&self) -> bool {
        dispatch!(self, d => d.completion_wakes_worker())
    }
}

impl Endpoint for AnyEndpoint {
    fn post(&mut self, batch: &mut Vec<WorkRequest>) {
        match self {
            AnyEndpoint::Loopback(e) => e.post(batch),
            #[cfg(feature = "libfabric")]
            AnyEndpoint::Libfabric(e) => e.post(batch),
            #[cfg(feature = "verbs")]
            AnyEndpoint::Verbs(e) => e.post(batch),
        }
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Progress {
        match self {
            AnyEndpoint::Loopback(e) => e.poll(out),
            #[cfg(feature = "libfabric")]
            AnyEndpoint::Libfabric(e) => e.poll(out),
            #[cfg(feature = "verbs")]
            AnyEndpoint::Verbs(e) => e.poll(out),
        }
    }
    fn set_sleeper(&mut self, thread: Option<Thread>) {
        match self {
            AnyEndpoint::Loopback(e) => e.set_sleeper(thread),
            #[cfg(feature = "libfabric")]
            AnyEndpoint::Libfabric(e) => e.set_sleeper(thread),
            #[cfg(feature = "verbs")]
            AnyEndpoint::Verbs(e) => e.set_sleeper(thread),
        }
    }
    fn mark_channel(&mut self) {
        #[cfg(feature = "libfabric")]
        if let AnyEndpoint::Libfabric(e) = self {
            e.mark_channel();
        }
    }
    fn flush(&mut self, out: &mut Vec<Completion>) {
        match self {
            AnyEndpoint::Loopback(e) => e.flush(out),
            #[cfg(feature = "libfabric")]
            AnyEndpoint::Libfabric(e) => e.flush(out),
            #[cfg(feature = "verbs")]
            AnyEndpoint::Verbs(e) => e.flush(out),
        }
    }
}
