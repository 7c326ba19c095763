//! The libfabric domain (design §3, §7): one RDM endpoint of a named
//! provider (`tcp` meaning `tcp;ofi_rxm`, `shm`, `sockets`, `efa`,
//! `verbs;ofi_rxm`) with messages, RMA, 8-byte atomics and remote CQ data
//! as the immediate, behind the same [`Domain`] /
//! [`Endpoint`](crate::domain::Endpoint) traits as loopback.
//!
//! - Memory registration honours the provider's `mr_mode`. With
//!   `FI_MR_VIRT_ADDR` remote addresses are virtual addresses; without it
//!   they are offsets into the region, and the region's base is carried in
//!   the (application-chosen) key so an initiator can turn the absolute
//!   address of a [`Remote`] into an offset. Application keys carry a check
//!   field ([`keys`]) so a corrupted key is refused *before posting*: the
//!   software providers do not enforce protection (§7), so every check an
//!   initiator can make is made here or in the engine, never left to them.
//!   With provider keys (hardware) the NIC checks.
//! - libfabric is loaded when the first NIC opens (`libfabric_sys::lib`);
//!   without it opening fails with [`TransferError::LibfabricLoad`], which
//!   says how to install it. `fi_getinfo` is asked for the highest API
//!   version the library serves, and what was negotiated is kept
//!   ([`LibfabricDomain::negotiated`]). On `efa` with API 1.18 or newer
//!   the endpoint refuses shared memory, so same-host peers go through
//!   the NIC like remote ones.
//! - Ordering ([`Domain::ordered`]) and immediates
//!   ([`Domain::immediates`]) are decided at start-up from what the
//!   provider's `fi_info` grants, never by provider name
//!   ([`efa::Claims::of_domain`]): ordered when the transmit and receive
//!   `msg_order` grant read-after-write and write-after-write *and*
//!   `max_order_{raw,waw}_size` cover every message size; immediates when
//!   `cq_data_size` holds 32 bits (a write carrying one is refused before
//!   posting otherwise).
//! - Progress: `tcp;ofi_rxm` and `shm` progress only when their completion
//!   queue is read, and a peer's one-sided write leaves no completion at
//!   its target, so someone must read the queue while the domain lives.
//!   Over `tcp` the queue's wait object (`FI_WAIT_FD`: rxm's epoll set
//!   over its sockets and connection events, [`LibfabricConfig::wait_fd`])
//!   says when: in an engine the group's worker blocks on it itself
//!   (`Domain::take_wait`, ppoll(2) over its NICs' objects) and reads the
//!   queue as soon as bytes arrive, so a peer's write is placed, and an
//!   acknowledgement completes a write, within one thread wake-up;
//!   submissions, and arrivals another thread read out of the queue, wake
//!   it with `fi_cq_signal` while it sleeps there (one atomic load when
//!   it does not). A NIC used without an engine worker has the same done
//!   by its waiter thread (module `waiter`), which stands aside (parked)
//!   once a worker takes the object over. The worker reads the queue
//!   without pause for [`LibfabricConfig::busy_poll`] after the last
//!   activity, and otherwise sleeps until woken: [`OUTSTANDING_BACKSTOP`]
//!   at most while operations are outstanding (everything the provider
//!   still has to do is announced on the object; posts refused with
//!   `-FI_EAGAIN` keep the group's short back-off of 1 to 200 µs), and
//!   [`WAIT_BACKSTOP`] when idle. CPU cost when idle: none (the worker
//!   wakes once a second). Providers whose
//!   wait object does not announce arriving data (`shm`), or
//!   `wait_fd: false`, fall back to timed reads (module [`pace`]): the
//!   back-off while operations are outstanding and for [`HOT`] after the
//!   last activity, then sleeps from 50 µs doubling up to
//!   [`LibfabricConfig::idle_poll`] (1 ms by default: about a thousand
//!   reads of a few µs per second, well under 1% of a core). A queue
//!   whose wait object has no descriptor (`FI_WAIT_UNSPEC`, EFA with its
//!   shared-memory peer on) gets a waiter blocked in `fi_cq_sread`. When
//!   active, up to one core per domain, like the NIC it stands in for.
//! - A write's completion means its data is visible at the target (§3):
//!   writes carrying data ask for `FI_DELIVERY_COMPLETE` wherever
//!   `fi_getinfo` grants it ([`LibfabricDomain::delivery_complete`]);
//!   `tcp;ofi_rxm`'s default completion comes before the target has placed
//!   the data. Where the provider orders writes after writes, only the
//!   last data write of a post call to each peer asks for it, and the
//!   earlier ones complete with it (module `cover`): on `tcp` each such
//!   request costs the target an acknowledgement message.
//! - Paged writes by message (module `paged`): where the provider's RMA is
//!   the target's CPU anyway (`tcp`: [`efa::PagedByMessage`]), the pages
//!   of paged writes to one peer travel packed into tagged messages that
//!   the target's domain checks against its registrations, places, counts
//!   the immediates of, and acknowledges; each transfer's pages complete
//!   on that acknowledgement ([`LibfabricConfig::paged_by_message`]).
//! - Shutdown first waits (at most [`DRAIN`]) for posted operations, then
//!   stops reading the queue; the endpoint closes only when nothing can
//!   touch it any more: after the engine's worker stopped, and for
//!   shared-memory endpoints (`FI_PROTO_SHM`) once no shared-memory
//!   endpoint of the process is open (see `ShmParking`).
//! - An operation that cannot be posted, or does not complete, within
//!   [`LibfabricConfig::op_timeout`] fails with [`TransferError::Timeout`];
//!   its buffers stay owned by the domain until the provider lets go.

pub mod bootstrap;
mod bounce;
mod cover;
pub mod efa;
mod endpoint;
mod ffi;
pub mod keys;
pub mod pace;
mod paged;
mod retry;
mod waiter;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use rolex_core::wire::{Access, NetAddr};

pub use endpoint::FabricEndpoint;
use ffi::{
    Av, Cq, CqEvent, CtxKind, DomainH, Ep, Fabric, FiError, Info, Leaked, Mr, OpCtx, Post, Sread,
    TryWait, WaitObj,
};
use waiter::{Waiter, WaiterHealth};

use crate::counters::{CounterSnapshot, Counters};
use crate::domain::{AnyEndpoint, Completion, Domain, ImmSink, Incoming, RecvBuffer, Remote};
use crate::error::{OpKind, ProtectionCheck, TransferError};
use crate::region::Region;
use crate::topology::{self, ListedNic, NicSelect};

/// Without a waiter: how long after the last activity the poller keeps
/// the worker's short back-off before sleeping longer (see [`pace`]).
pub const HOT: Duration = Duration::from_millis(20);

/// With a waiter (see [`LibfabricConfig::wait_fd`]): the longest an idle
/// poller sleeps without being woken, a backstop should the provider ever
/// need a read its wait object does not announce.
pub const WAIT_BACKSTOP: Duration = Duration::from_secs(1);

/// With a wait object: the longest the worker sleeps while it has
/// operations outstanding without being woken (the object wakes it when
/// the provider has something to do). The old back-off's longest nap: a
/// wake-up the provider should announce and does not costs no more than
/// before, and a few thousand short reads a second only while operations
/// are in flight.
pub const OUTSTANDING_BACKSTOP: Duration = Duration::from_micros(200);

/// Longest wait at shutdown for posted operations to complete before the
/// endpoint closes (see `Inner::drain`).
pub const DRAIN: Duration = Duration::from_secs(2);

/// Options of the libfabric domain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibfabricConfig {
    /// Provider as the user names it: `tcp` (meaning `tcp;ofi_rxm`),
    /// `shm`, `sockets`, `efa`, `verbs` (meaning `verbs;ofi_rxm`), or a
    /// full libfabric provider string.
    pub provider: String,
    /// The node (address) to open endpoints on; `tcp` picks the first
    /// interface without it (§7).
    pub node: Option<String>,
    /// Bound on posting (while the connection forms) and on completion.
    pub op_timeout: Duration,
    /// Where [`LibfabricConfig::wait_fd`] applies and the provider
    /// refuses a descriptor (`FI_WAIT_FD`) but has a wait object
    /// (`FI_WAIT_UNSPEC`: EFA while its shared-memory peer is on), the
    /// waiter blocks in `fi_cq_sread` instead. This skips the descriptor
    /// and takes that path at once, to test it without a device. Off by
    /// default.
    pub wait_sread: bool,
    /// The bounce pools lent to sends, receives and atomics where the
    /// provider needs a descriptor for every local buffer (`FI_MR_LOCAL`).
    pub bounce: BounceConfig,
    /// Treat the provider as needing local descriptors (`FI_MR_LOCAL`)
    /// even where it does not: regions' descriptors and the bounce pools
    /// are then used on `tcp` and `shm` too, which tests that path
    /// without a device. Off by default.
    pub local_mr: bool,
    /// The worker reads the queue without pause (yielding the CPU between
    /// reads) for this long after the last activity instead of sleeping:
    /// lower latency, one busy core per domain meanwhile. Activity is a
    /// post, a completion, an arrival, or a wake-up by the wait object
    /// (a peer's one-sided operation aimed at this NIC, which leaves no
    /// completion here: a target busy-polls between its peers' operations).
    /// Threads waiting on their own operations poll them themselves
    /// ([`EngineConfig::spin`](crate::EngineConfig::spin)) and do not
    /// need it.
    pub busy_poll: Duration,
    /// The longest queue-read interval of a NIC without a waiter (see
    /// [`LibfabricConfig::wait_fd`]), reached after [`HOT`] and a few
    /// doublings from 50 µs of idleness ([`pace`]).
    pub idle_poll: Duration,
    /// Block on the provider's wait object (`FI_WAIT_FD`) between queue
    /// reads, where it signals arriving data (`tcp`): a waiter thread
    /// wakes the worker when bytes arrive, so the worker needs no timer
    /// and an idle NIC costs no CPU. Other providers, or `false`, read the
    /// queue on the [`HOT`] / [`LibfabricConfig::idle_poll`] timer.
    pub wait_fd: bool,
    /// Which of the provider's devices (the distinct domains `fi_getinfo`
    /// lists: EFA devices, verbs devices, network interfaces) the NICs
    /// open, chosen by name or PCIe/NUMA topology ([`crate::topology`]);
    /// by default every device in the provider's order, the first for
    /// one NIC.
    pub nics: NicSelect,
    /// Whether paged writes to a peer travel packed into tagged messages
    /// that the target's domain places and acknowledges (module `paged`)
    /// instead of one-sided writes: by default where the provider's
    /// `fi_info` says its RMA runs in the target's CPU anyway and the
    /// engine progresses it ([`efa::PagedByMessage::preferred`]: `tcp`;
    /// `sockets` can, forced on), and not with
    /// [`LibfabricConfig::local_mr`]; forced on or off for tests and
    /// measurements. Never on verbs, EFA or `shm`. Messages are sized to
    /// `tcp;ofi_rxm`'s eager limit (`FI_OFI_RXM_BUFFER_SIZE`, 16 KiB by
    /// default), which, as for rxm's own messages, both peers must agree
    /// on. The counter `paged_by_message` counts the messages sent.
    pub paged_by_message: PagedMode,
}

/// [`LibfabricConfig::paged_by_message`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PagedMode {
    /// Where [`efa::PagedByMessage::preferred`] holds.
    #[default]
    Auto,
    /// Wherever [`efa::PagedByMessage::possible`] holds.
    On,
    /// Never sent that way (a NIC where the path is possible still
    /// places its peers' paged messages).
    Off,
}

impl LibfabricConfig {
    /// A configuration for `provider` on `node` with default bounds.
    pub fn new(provider: &str, node: Option<&str>) -> Self {
        LibfabricConfig {
            provider: provider.to_string(),
            node: node.map(str::to_string),
            op_timeout: Duration::from_secs(10),
            wait_sread: false,
            bounce: BounceConfig::default(),
            local_mr: false,
            busy_poll: Duration::ZERO,
            idle_poll: Duration::from_millis(1),
            wait_fd: true,
            nics: NicSelect::default(),
            paged_by_message: PagedMode::Auto,
        }
    }

    /// The libfabric provider string for the user's name.
    pub fn provider_string(&self) -> String {
        match self.provider.as_str() {
            "tcp" => "tcp;ofi_rxm".into(),
            "verbs" => "verbs;ofi_rxm".into(),
            p => p.into(),
        }
    }

    /// This process's `FI_OFI_RXM_BUFFER_SIZE` where the provider is a
    /// `*;ofi_rxm` one (the variable as set, else rxm's default of 16384),
    /// `None` for any other provider. Processes whose sizes differ never
    /// connect over rxm; the bootstrap compares them
    /// ([`bootstrap::Bootstrap::rxm_buffer`]).
    pub fn rxm_buffer(&self) -> Option<u32> {
        self.provider_string()
            .ends_with(";ofi_rxm")
            .then(paged::rxm_buffer_size)
    }
}

/// Sizes of a NIC's bounce pools: memory registered once when the NIC
/// opens (only where local descriptors are needed) and lent, slot by
/// slot, to operations whose buffers are the domain's own, so that no
/// operation registers memory. A post that finds its pool empty waits,
/// like one the provider refused, until a completion gives a slot back
/// (see `retry`); messages and receive buffers larger than a slot are
/// registered for that operation alone. Sends and receives have pools of
/// their own, so posted receives (which hold their slots until a message
/// comes) never starve sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BounceConfig {
    /// Slots for atomics (24 bytes each: operand, compare, result).
    pub words: usize,
    /// Slots for sends.
    pub sends: usize,
    /// Slots for posted receives; receive buffers beyond them wait
    /// unposted until a message frees a slot.
    pub recvs: usize,
    /// Bytes per send or receive slot.
    pub msg_size: usize,
}

impl Default for BounceConfig {
    /// 1,024 atomics, 256 sends and 256 receives of up to 4 KiB in
    /// flight per NIC (2 MiB registered).
    fn default() -> Self {
        BounceConfig {
            words: 1024,
            sends: 256,
            recvs: 256,
            msg_size: 4096,
        }
    }
}

/// Whether `provider` (as [`LibfabricConfig::provider`] names it) can
/// open an RDM endpoint with messages, RMA, atomics and remote CQ data on
/// `node`; the error says why not.
pub fn probe(provider: &str, node: Option<&str>) -> Result<(), TransferError> {
    let cfg = LibfabricConfig::new(provider, node);
    get_info(&cfg).map(|_| ())
}

/// `fi_getinfo` for `cfg` (loading libfabric first), asking for delivery
/// completion first and, where the provider cannot give it, again without
/// (see [`LibfabricDomain::delivery_complete`]).
fn get_info(cfg: &LibfabricConfig) -> Result<Info, TransferError> {
    let lib = libfabric_sys::lib().map_err(TransferError::LibfabricLoad)?;
    let prov = cfg.provider_string();
    let hints = |delivery_complete, tagged| ffi::Hints {
        provider: &prov,
        node: cfg.node.as_deref(),
        service: None,
        delivery_complete,
        tagged,
    };
    // Tagged messages (the paged-by-message path, module `paged`) where
    // the provider has them.
    Info::get(lib, &hints(true, true))
        .or_else(|_| Info::get(lib, &hints(true, false)))
        .or_else(|_| Info::get(lib, &hints(false, true)))
        .or_else(|_| Info::get(lib, &hints(false, false)))
        .map_err(fi_err)
}

/// What a libfabric NIC negotiated when it opened, for tools to print
/// (`Display` gives one line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The library file loaded (`libfabric.so.1`, or `ROLEX_LIBFABRIC`).
    pub library: String,
    /// The library's version (`fi_version()`, encoded as `FI_VERSION`).
    pub library_version: u32,
    /// The API version the fabric was opened with (`FI_VERSION`).
    pub api_version: u32,
    /// The provider chosen (e.g. `tcp;ofi_rxm`).
    pub provider: String,
    /// The provider's transmit ordering (`tx_attr->msg_order`, `FI_ORDER_*`
    /// bits).
    pub msg_order: u64,
    /// The memory-registration mode (`domain_attr->mr_mode`, `FI_MR_*`
    /// bits).
    pub mr_mode: u64,
    /// What bounds ordering and immediates, as `fi_getinfo` granted it.
    pub order: efa::OrderAttrs,
    /// What the domain claims from it ([`Domain::ordered`],
    /// [`Domain::immediates`]).
    pub claims: efa::Claims,
    /// Shared memory was refused (`FI_OPT_SHARED_MEMORY_PERMITTED` off and
    /// the provider agreed): same-host peers go through the NIC.
    pub shared_memory_off: bool,
}

/// `FI_VERSION`-encoded `v` as `major.minor`.
fn version_text(v: u32) -> String {
    format!(
        "{}.{}",
        libfabric_sys::fi_major(v),
        libfabric_sys::fi_minor(v)
    )
}

impl std::fmt::Display for Negotiated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "libfabric {} ({}), API {}, provider {}, msg_order {:#x}, mr_mode {:#x}, {}, {}",
            version_text(self.library_version),
            self.library,
            version_text(self.api_version),
            self.provider,
            self.msg_order,
            self.mr_mode,
            if self.claims.ordered {
                "ordered"
            } else {
                "unordered"
            },
            if self.claims.immediates {
                "immediates"
            } else {
                "no immediates"
            },
        )?;
        if self.shared_memory_off {
            f.write_str(", shared memory off")?;
        }
        Ok(())
    }
}

/// Whether a NIC of `provider` at `api_version` should refuse shared
/// memory: on `efa` from API 1.18 (the option's first version), so that
/// peers on the same host are reached through the device like remote ones
/// (the engine treats every NIC as one NIC; EFA would otherwise hand them
/// to its `shm` peer provider). The software providers have no NIC path
/// to prefer.
fn wants_nic_only(provider: &str, api_version: u32) -> bool {
    provider.split(';').next() == Some("efa") && api_version >= libfabric_sys::fi_version_of(1, 18)
}

pub(crate) fn fi_err(e: FiError) -> TransferError {
    TransferError::Libfabric {
        call: e.call,
        errno: e.errno,
        text: e.text(),
    }
}

/// How remote addresses and keys work on this domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MrScheme {
    /// Virtual addresses, application keys with a check field.
    VirtApp,
    /// Virtual addresses, provider keys (the NIC checks).
    VirtProv,
    /// Offsets, application keys carrying the region base.
    OffsetApp,
}

/// A remote key this domain minted: the registration and the region.
struct MrEntry {
    mr: Mr,
    region: usize,
    /// The region itself, for pages placed by this domain (module
    /// `paged`); a dead one refuses them.
    weak: Weak<Region>,
}

/// A posted operation not yet completed.
struct Inflight {
    /// The posted context; `None` once a paged message's send completed
    /// and it waits for the target's acknowledgement only (module
    /// `paged`).
    leaked: Option<Leaked>,
    wr_id: u64,
    /// Work requests the post carries (several for a chained write), each
    /// owed one completion.
    pieces: u32,
    sink: Arc<Sink>,
    op: OpKind,
    peer: NetAddr,
    since: Instant,
    /// A segment of a paged message (module `paged`): its pages,
    /// completed by the target's acknowledgement.
    paged: Option<paged::Sent>,
}

/// An operation waiting to be posted (the provider said `-FI_EAGAIN`).
struct Pending {
    ctx: Box<OpCtx>,
    post: Post,
    /// The operation's sequence number (`None`: a receive).
    seq: Option<u64>,
}

/// Per-peer queues of refused operations, by the peer's address-vector
/// entry (module `retry`).
type RetryByPeer = retry::RetryQueues<u64, Pending>;

/// Where an endpoint's completions go, and how many it has outstanding.
pub(crate) struct Sink {
    queue: SegQueue<Completion>,
    outstanding: AtomicU64,
    /// A thread that sleeps until the endpoint's next completion (a
    /// client channel past its spin budget), unparked by whoever reads it
    /// off the queue.
    sleeper: Mutex<Option<Thread>>,
    /// Whether `sleeper` is set (read without the lock on every finish).
    has_sleeper: AtomicBool,
    /// A client channel's sink (`Endpoint::mark_channel`): its posts and
    /// completions do not count as the NIC's activity for busy polling.
    pub(super) channel: AtomicBool,
}

impl Sink {
    /// Completes the `pieces` work requests of one post with `result`.
    fn finish(&self, wr_id: u64, pieces: u32, result: Result<u64, TransferError>) {
        for _ in 1..pieces {
            self.queue.push(Completion {
                wr_id,
                result: result.clone(),
            });
        }
        self.queue.push(Completion { wr_id, result });
        self.outstanding.fetch_sub(u64::from(pieces), SeqCst);
        if self.has_sleeper.load(SeqCst) {
            if let Some(t) = lock(&self.sleeper).as_ref() {
                t.unpark();
            }
        }
    }
}

/// Bookkeeping of an operation between its post and its completion.
struct OpMeta {
    wr_id: u64,
    /// As [`Inflight::pieces`].
    pieces: u32,
    sink: Arc<Sink>,
    op: OpKind,
    peer: NetAddr,
    since: Instant,
    /// As [`Inflight::paged`].
    paged: Option<paged::Sent>,
}

impl OpMeta {
    /// The in-flight record of the operation once posted, holding
    /// `leaked` (its context) if it has one.
    fn posted(self, leaked: Option<Leaked>) -> Inflight {
        Inflight {
            leaked,
            wr_id: self.wr_id,
            pieces: self.pieces,
            sink: self.sink,
            op: self.op,
            peer: self.peer,
            since: self.since,
            paged: self.paged,
        }
    }
}

/// The endpoint and everything that lives and dies with it (under one
/// lock: posting, reading the queue and closing never overlap).
struct Live {
    /// First to close (`Drop`): after it nothing touches our buffers.
    ep: Option<Ep>,
    av: Av,
    cq: Cq,
    peers: HashMap<NetAddr, u64>,
    next_seq: u64,
    inflight: HashMap<u64, Inflight>,
    /// Posted in this order; front is the oldest (timeouts).
    order: VecDeque<u64>,
    /// Failed by timeout or flush while the provider still owns them.
    abandoned: HashMap<u64, Leaked>,
    /// Operations waiting for `-FI_EAGAIN` to clear, per peer, each
    /// peer's in posting order (a peer in back-off stalls only itself).
    retry: RetryByPeer,
    /// Receives waiting for `-FI_EAGAIN` to clear, in posting order.
    recv_retry: VecDeque<Pending>,
    /// Metadata of operations in `retry`.
    retry_meta: HashMap<u64, OpMeta>,
    /// Posted receives, by context address.
    recvs: HashMap<usize, Leaked>,
    last_activity: Instant,
    /// Completions of client channels' operations read by the current
    /// `Inner::progress` (not activity, see [`Sink::channel`]).
    channel_done: usize,
    /// Blocks on the queue's wait object and reads the queue; stopped
    /// before the queue closes.
    waiter: Option<Waiter>,
    /// Writes whose completion waits for a later write's delivery
    /// completion (module `cover`).
    covers: cover::Covers,
    /// Acknowledgements of peers' paged messages not yet sent, each with
    /// the peer it goes to; a peer's are sent at the end of the progress
    /// round in which a message of it asked (module `paged`).
    acks_out: Vec<(NetAddr, rolex_core::wire::Ack)>,
    /// Peers whose message asked for the acknowledgements this round.
    acks_due: Vec<NetAddr>,
    /// Buffers of paged messages whose send completed, for the next ones
    /// (at most `paged::KEEP_BUFS`).
    msg_bufs: Vec<Vec<u8>>,
}

impl Drop for Live {
    fn drop(&mut self) {
        if let Some(w) = self.waiter.as_mut() {
            w.stop();
        }
        // Closing the endpoint cancels what is in flight; after it the
        // provider touches none of our contexts, so they can be freed.
        drop(self.ep.take());
        let shut = Err(TransferError::EngineShutDown);
        for (seq, f) in std::mem::take(&mut self.inflight) {
            if let Some(l) = f.leaked {
                // SAFETY: the endpoint is closed (above).
                drop(unsafe { l.reclaim() });
            }
            self.covers
                .finish(seq, &f.sink, f.wr_id, f.pieces, shut.clone());
        }
        for (seq, m) in std::mem::take(&mut self.retry_meta) {
            self.covers
                .finish(seq, &m.sink, m.wr_id, m.pieces, shut.clone());
        }
        self.covers.shut();
        let recvs = self.recvs.drain().map(|(_, l)| l);
        for l in self.abandoned.drain().map(|(_, l)| l).chain(recvs) {
            // SAFETY: as above.
            drop(unsafe { l.reclaim() });
        }
    }
}

/// The shared state of one libfabric NIC. Field order is drop order:
/// endpoint side, then registrations, then domain, fabric and info.
pub(crate) struct Inner {
    live: Mutex<Option<Live>>,
    /// The endpoint after [`Domain::shutdown`], closed only when the last
    /// reference goes, i.e. after the engine's worker stopped polling
    /// every NIC (see `shutdown`).
    closing: Mutex<Option<Live>>,
    mrs: Mutex<HashMap<u64, MrEntry>>,
    /// The bounce pools (with `FI_MR_LOCAL` only); dropped before the
    /// domain, after every context holding a slot.
    pools: Option<Pools>,
    /// Registrations made for one operation (buffers larger than a
    /// bounce slot), for tests and tools.
    op_registrations: AtomicU64,
    /// Local descriptors by region address (for `FI_MR_LOCAL`).
    local: Mutex<HashMap<usize, usize>>,
    dom: DomainH,
    _fabric: Fabric,
    _info: Info,
    addr: NetAddr,
    scheme: MrScheme,
    mr_local: bool,
    /// Pass regions' descriptors without `FI_MR_LOCAL` too (API 1.22 and
    /// newer, see `local_desc`).
    desc_hints: bool,
    mr_endpoint: bool,
    /// Ordering and immediates (see the module docs), and what they were
    /// decided from.
    claims: efa::Claims,
    order: efa::OrderAttrs,
    /// The provider chosen (for errors).
    provider: String,
    manual_progress: bool,
    delivery_complete: bool,
    /// Writes to one peer are ordered: the writes of one post call to a
    /// peer share the delivery completion of the last (module `cover`).
    cover_writes: bool,
    shared_memory: bool,
    /// Most pieces one posted write chains (1: no chaining).
    chain_limit: usize,
    /// Paged writes leave packed into messages (module `paged`).
    paged_send: bool,
    /// Peers' paged messages are received and placed here.
    paged_serve: bool,
    cfg: LibfabricConfig,
    incoming: SegQueue<Incoming>,
    /// Where immediates go at once (the engine's ImmCounter), when set.
    imm_sink: OnceLock<ImmSink>,
    waker: OnceLock<Thread>,
    /// Whether a waiter reads the queue (unset: the poller reads it on a
    /// timer).
    wait: OnceLock<WaiterHealth>,
    /// The queue's wait object and what `fi_trywait` / `fi_cq_signal`
    /// need (set with a waiter; the queue stays open while `Inner` lives,
    /// see `shutdown`).
    wait_obj: OnceLock<(libc::c_int, TryWait)>,
    /// Set once the engine's worker blocks on the wait object itself
    /// ([`Domain::take_wait`]): its "sleeping" flag.
    worker_waits: OnceLock<Arc<AtomicBool>>,
    /// Set by every endpoint poll (which reads the queue), cleared by
    /// `poll_incoming`, which then need not read it again.
    endpoint_polled: AtomicBool,
    /// When a client channel last posted here (`timer::monotonic_ns`; 0:
    /// never), for `Domain::channels_busy`.
    channel_posted: AtomicU64,
    alive: AtomicBool,
    next_key: AtomicU64,
    pub(crate) counters: Counters,
}

/// A NIC's bounce pools (module `bounce`).
struct Pools {
    words: Arc<bounce::BouncePool<Mr>>,
    sends: Arc<bounce::BouncePool<Mr>>,
    recvs: Arc<bounce::BouncePool<Mr>>,
}

/// Shared-memory endpoints of this process (design §7, `FI_PROTO_SHM`):
/// how many are open, and those shut down but not yet closed.
///
/// `shm` (1.17) gives in-process peers direct pointers to each other's
/// regions, and a peer's progress may still touch ours after every one of
/// our operations has completed (the last acknowledgement of a large
/// write); closing our endpoint unmaps the region under it (crashes of the
/// surviving engine, or writes into memory the allocator reused).
/// Invariant: a shared-memory endpoint closes only once no shared-memory
/// endpoint of the process is open any more, i.e. when nothing progresses
/// them; until then it stays parked, its queue no longer read.
struct ShmParking {
    open: usize,
    parked: Vec<Arc<Inner>>,
}

static SHM_PARKING: Mutex<ShmParking> = Mutex::new(ShmParking {
    open: 0,
    parked: Vec::new(),
});

/// One libfabric NIC of an engine.
pub struct LibfabricDomain {
    inner: Arc<Inner>,
    negotiated: Negotiated,
    device: String,
}

impl std::fmt::Debug for LibfabricDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibfabricDomain")
            .field("provider", &self.negotiated.provider)
            .field("addr", &self.inner.addr)
            .finish()
    }
}

/// The devices `info` lists (the distinct domains of its entries, in its
/// order) with the index of each one's first entry, placed by the NIC
/// attribute's bus address where the provider gives one, else by name.
fn devices_of(info: &Info, sysfs: &std::path::Path) -> (Vec<ListedNic>, Vec<usize>) {
    let names = info.domain_names();
    let pci = info.pci_addresses();
    let mut firsts: Vec<usize> = Vec::new();
    for (i, n) in names.iter().enumerate() {
        if !firsts.iter().any(|&f| names[f] == *n) {
            firsts.push(i);
        }
    }
    let listed: Vec<(String, Option<topology::PciAddr>)> = firsts
        .iter()
        .map(|&i| (names[i].clone(), pci.get(i).copied().flatten()))
        .collect();
    (topology::enumerate_at(sysfs, &listed), firsts)
}

/// The devices `cfg`'s provider lists on `cfg.node` (the distinct domains
/// of `fi_getinfo`'s entries, in its order), each placed.
pub fn list_nics(cfg: &LibfabricConfig) -> Result<Vec<ListedNic>, TransferError> {
    let info = get_info(cfg)?;
    Ok(devices_of(&info, &cfg.nics.sysfs).0)
}

/// `fi_getinfo`'s list for `cfg` and, for each of `nics` NICs, the entry
/// it opens: the first entry of its device, the devices chosen by
/// [`LibfabricConfig::nics`] and taken in turn ([`topology::assign`]).
fn chosen_entries(cfg: &LibfabricConfig, nics: usize) -> Result<(Info, Vec<usize>), TransferError> {
    let info = get_info(cfg)?;
    let (devices, firsts) = devices_of(&info, &cfg.nics.sysfs);
    let backend = format!("libfabric {}", cfg.provider_string());
    let chosen =
        topology::choose_placed(&cfg.nics, &backend, &devices).map_err(TransferError::NicChoice)?;
    let entries = topology::assign(&chosen, nics)
        .into_iter()
        .map(|d| firsts[d])
        .collect();
    Ok((info, entries))
}

/// Opens `nics` libfabric NICs (one fabric, domain and endpoint each) on
/// the devices [`LibfabricConfig::nics`] chooses, in turn.
pub fn open_host(
    cfg: &LibfabricConfig,
    nics: usize,
) -> Result<Vec<Arc<LibfabricDomain>>, TransferError> {
    let (info, entries) = chosen_entries(cfg, nics)?;
    entries
        .into_iter()
        .map(|e| {
            let one = info.entry(e).map_err(fi_err)?;
            LibfabricDomain::open_entry(cfg, one).map(Arc::new)
        })
        .collect()
}

impl LibfabricDomain {
    /// Opens one NIC, on the first device [`LibfabricConfig::nics`]
    /// chooses.
    pub fn open(cfg: &LibfabricConfig) -> Result<LibfabricDomain, TransferError> {
        let (info, entries) = chosen_entries(cfg, 1)?;
        let first = entries.first().copied().unwrap_or(0);
        Self::open_entry(cfg, info.entry(first).map_err(fi_err)?)
    }

    /// Opens one NIC from a list of one `fi_info` entry.
    fn open_entry(cfg: &LibfabricConfig, mut info: Info) -> Result<LibfabricDomain, TransferError> {
        let device = info.domain_names().into_iter().next().unwrap_or_default();
        let g = info.granted();
        info.clear_tx_op_flags();
        let virt = g.mr_mode & libfabric_sys::FI_MR_VIRT_ADDR != 0;
        let prov_key = g.mr_mode & libfabric_sys::FI_MR_PROV_KEY != 0;
        let unsupported = |why| TransferError::UnsupportedMrMode {
            provider: g.provider.clone(),
            mr_mode: g.mr_mode,
            why,
        };
        if g.mr_mode & libfabric_sys::FI_MR_RAW != 0 {
            return Err(unsupported("raw keys (FI_MR_RAW) are not supported"));
        }
        let scheme = match (virt, prov_key) {
            (true, true) => MrScheme::VirtProv,
            (true, false) if g.mr_key_size >= 8 => MrScheme::VirtApp,
            (false, false) if g.mr_key_size >= 8 => MrScheme::OffsetApp,
            (false, true) => {
                return Err(unsupported(
                    "offset addressing with provider keys leaves no room for the region base",
                ))
            }
            _ => return Err(unsupported("application keys shorter than 8 bytes")),
        };
        let claims = efa::Claims::of_domain(&g.order);
        let by_message = efa::PagedByMessage::from_attrs(&efa::PagedAttrs {
            tagged: g.tagged,
            mr_mode: g.mr_mode,
            shared_memory: g.shared_memory,
            manual_progress: g.manual_progress,
        });
        let fabric = Fabric::open(&info).map_err(fi_err)?;
        let dom = DomainH::open(&fabric, &info).map_err(fi_err)?;
        // The wait objects to try, best first (see `wait_signals_data`);
        // the last, none, always opens.
        let tries: &[WaitObj] = match (
            cfg.wait_fd && wait_signals_data(&g.provider),
            cfg.wait_sread,
        ) {
            (true, false) => &[WaitObj::Fd, WaitObj::Unspec, WaitObj::None],
            (true, true) => &[WaitObj::Unspec, WaitObj::None],
            (false, _) => &[WaitObj::None],
        };
        let mut opened = None;
        for &w in tries {
            match Cq::open(&dom, 4096, w) {
                Ok(cq) => {
                    opened = Some((cq, w));
                    break;
                }
                Err(e) if w == WaitObj::None => return Err(fi_err(e)),
                Err(_) => {}
            }
        }
        let Some((cq, wait_obj)) = opened else {
            return Err(TransferError::Libfabric {
                call: "fi_cq_open",
                errno: libc::EINVAL,
                text: "no wait object could be opened".into(),
            });
        };
        let av = Av::open(&dom).map_err(fi_err)?;
        let nic_only = wants_nic_only(&g.provider, g.api_version);
        let (ep, shared_memory_off) = Ep::open(&dom, &info, &cq, &av, nic_only).map_err(fi_err)?;
        let mr_local = g.mr_mode & libfabric_sys::FI_MR_LOCAL != 0 || cfg.local_mr;
        let mr_endpoint = g.mr_mode & libfabric_sys::FI_MR_ENDPOINT != 0;
        let next_key = AtomicU64::new(rand::random::<u64>() >> 16);
        // Registered once, here; freed with `Inner` (after the endpoint,
        // before the domain).
        let pools = if mr_local {
            let pool = |slots, size| {
                bounce::BouncePool::new(slots, size, |addr, len| {
                    let key = next_key.fetch_add(1, Relaxed);
                    let mr = dom
                        .reg(addr, len, access_flags(Access::empty()), key)
                        .map_err(fi_err)?;
                    if mr_endpoint {
                        mr.bind_enable(&ep).map_err(fi_err)?;
                    }
                    let desc = mr.desc() as usize;
                    Ok::<_, TransferError>((mr, desc))
                })
            };
            let b = cfg.bounce;
            Some(Pools {
                words: pool(b.words.max(1), 24)?,
                sends: pool(b.sends.max(1), b.msg_size.max(8))?,
                recvs: pool(b.recvs.max(1), b.msg_size.max(8))?,
            })
        } else {
            None
        };
        let negotiated = Negotiated {
            library: info.lib().path().to_string(),
            library_version: info.lib().version(),
            api_version: fabric.api_version(),
            provider: g.provider.clone(),
            msg_order: g.msg_order,
            mr_mode: g.mr_mode,
            order: g.order,
            claims,
            shared_memory_off,
        };
        // Read after the endpoint is bound: the provider adds its sockets
        // and connection events to the queue's wait set then.
        let wait_fd = match wait_obj {
            WaitObj::Fd => cq.wait_fd().ok(),
            _ => None,
        };
        let trywait = TryWait::new(&fabric, &cq);
        let sread = (wait_obj == WaitObj::Unspec).then(|| Sread::new(&cq));
        let name = ep.name().map_err(fi_err)?;
        let addr = NetAddr::new(&name).map_err(|error| TransferError::Malformed {
            what: "libfabric endpoint address",
            error,
        })?;
        if g.shared_memory {
            lock(&SHM_PARKING).open += 1;
        }
        let live = Live {
            ep: Some(ep),
            av,
            cq,
            peers: HashMap::new(),
            next_seq: 0,
            inflight: HashMap::new(),
            order: VecDeque::new(),
            abandoned: HashMap::new(),
            retry: RetryByPeer::default(),
            recv_retry: VecDeque::new(),
            retry_meta: HashMap::new(),
            recvs: HashMap::new(),
            last_activity: Instant::now(),
            channel_done: 0,
            waiter: None,
            covers: cover::Covers::default(),
            acks_out: Vec::new(),
            acks_due: Vec::new(),
            msg_bufs: Vec::new(),
        };
        let inner = Arc::new(Inner {
            live: Mutex::new(Some(live)),
            closing: Mutex::new(None),
            mrs: Mutex::new(HashMap::new()),
            pools,
            op_registrations: AtomicU64::new(0),
            local: Mutex::new(HashMap::new()),
            dom,
            _fabric: fabric,
            _info: info,
            addr,
            scheme,
            mr_local,
            desc_hints: negotiated.api_version >= libfabric_sys::fi_version_of(1, 22),
            mr_endpoint,
            claims,
            order: g.order,
            provider: g.provider.clone(),
            manual_progress: g.manual_progress,
            delivery_complete: g.delivery_complete,
            cover_writes: g.delivery_complete && writes_ordered(g.msg_order),
            shared_memory: g.shared_memory,
            chain_limit: g.chain_limit,
            // Local descriptors forced on a provider that needs none
            // (`local_mr`) test the one-sided path with them: kept there.
            paged_send: match cfg.paged_by_message {
                PagedMode::Auto => by_message.preferred && !mr_local,
                PagedMode::On => by_message.possible,
                PagedMode::Off => false,
            },
            paged_serve: by_message.possible,
            cfg: cfg.clone(),
            incoming: SegQueue::new(),
            imm_sink: OnceLock::new(),
            waker: OnceLock::new(),
            wait: OnceLock::new(),
            wait_obj: OnceLock::new(),
            worker_waits: OnceLock::new(),
            endpoint_polled: AtomicBool::new(false),
            channel_posted: AtomicU64::new(0),
            alive: AtomicBool::new(true),
            next_key,
            counters: Counters::default(),
        });
        let block = match (wait_fd, sread) {
            (Some(fd), _) => Some(waiter::Block::Fd { trywait, fd }),
            (None, Some(q)) => Some(waiter::Block::Sread(q)),
            (None, None) => None,
        };
        if inner.paged_serve {
            let mut g = lock(&inner.live);
            if let Some(live) = g.as_mut() {
                inner.paged_post_receives(live);
            }
        }
        if let Some(block) = block {
            let mut g = lock(&inner.live);
            if let Some(live) = g.as_mut() {
                live.waiter = Waiter::start(block, waiter_progress(&inner));
                if let Some(w) = &live.waiter {
                    let _ = inner.wait.set(w.health());
                    // Only a descriptor can be handed to the worker
                    // (`Domain::take_wait`); `fi_cq_sread` stays with the
                    // waiter, which unparks the worker.
                    if let Some(fd) = wait_fd {
                        let _ = inner.wait_obj.set((fd, trywait));
                    }
                }
            }
        }
        Ok(LibfabricDomain {
            inner,
            negotiated,
            device,
        })
    }

    /// The device (libfabric domain) this NIC opened: `eth0`, `lo`,
    /// `rdmap16s27-rdm`, `mlx5_0`.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// The provider libfabric chose (e.g. `tcp;ofi_rxm`).
    pub fn provider(&self) -> &str {
        &self.negotiated.provider
    }

    /// What this NIC negotiated: library and API versions, provider,
    /// ordering, registration mode.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// Whether the provider needs its queue read to move data (manual
    /// progress, §7): the poller then stands in for the NIC.
    pub fn manual_progress(&self) -> bool {
        self.inner.manual_progress
    }

    /// Whether writes carrying data ask for `FI_DELIVERY_COMPLETE`, so
    /// that their completion means the data is visible in the target's
    /// memory (design §3). Decided by what `fi_getinfo` grants; without
    /// it a write completes when the provider's default says so (on a
    /// hardware NIC, the target's acknowledgement). Zero-length writes
    /// (an immediate alone) never ask for it: they carry no data to make
    /// visible, and `shm` (1.17) never completes a zero-length write that
    /// asks for it.
    pub fn delivery_complete(&self) -> bool {
        self.inner.delivery_complete
    }
}

impl Drop for LibfabricDomain {
    fn drop(&mut self) {
        // An engine shuts its NICs down first; this covers a domain used
        // on its own, so the shared-memory count stays right.
        self.shutdown();
    }
}

/// The waiter's read of the queue: the events its blocking read took out
/// (with `fi_cq_sread`), progress, then wake the worker if completions or
/// arrivals came out (arrivals wake it themselves).
fn waiter_progress(inner: &Arc<Inner>) -> waiter::ProgressFn {
    let weak = Arc::downgrade(inner);
    Box::new(move |events| {
        let Some(inner) = weak.upgrade() else {
            return false;
        };
        let handled = match lock(&inner.live).as_mut() {
            Some(live) => {
                let n = events.len();
                for ev in events {
                    inner.event(live, ev, None);
                }
                n + inner.progress(live, None)
            }
            None => return false,
        };
        if handled > 0 {
            if let Some(t) = inner.waker.get() {
                t.unpark();
            }
        }
        true
    })
}

/// Whether `msg_order` (`tx_attr->msg_order`) orders a write after a
/// write to the same peer: `FI_ORDER_WAW`, or `FI_ORDER_RMA_WAW` where the
/// provider orders RMA apart from atomics (`tcp;ofi_rxm` asked for both).
fn writes_ordered(msg_order: u64) -> bool {
    msg_order & (libfabric_sys::FI_ORDER_WAW | libfabric_sys::FI_ORDER_RMA_WAW) != 0
}

/// Whether `provider`'s completion-queue wait object becomes ready when
/// data arrives for this endpoint, not only when a completion is written:
/// true over `tcp` (rxm adds its sockets' epoll set and its connection
/// events) and `efa` (its RDM queue waits on the device queue's completion
/// channel, and every packet of its protocol arrives through the device's
/// receive queue; the device's own RDMA needs no target progress), where
/// blocking on it replaces timed reads. EFA grants `FI_WAIT_FD` only with
/// its shared-memory peer off (`FI_EFA_ENABLE_SHM_TRANSFER=0`),
/// `FI_WAIT_UNSPEC` (`fi_cq_sread`) with it on, and neither before
/// libfabric 2.5 (prov/efa `efa_rdm_cq_configure_wait`); the domain tries
/// them in that order. `shm` moves data through shared memory, which
/// signals no descriptor.
fn wait_signals_data(provider: &str) -> bool {
    matches!(provider.split(';').next(), Some("tcp" | "efa"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn access_flags(a: Access) -> u64 {
    use libfabric_sys as s;
    let mut f = s::FI_READ | s::FI_WRITE | s::FI_SEND | s::FI_RECV;
    if a.contains(Access::REMOTE_READ) {
        f |= s::FI_REMOTE_READ;
    }
    if a.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC) {
        f |= s::FI_REMOTE_WRITE;
    }
    f
}

impl Inner {
    fn fail_fast(&self) -> Result<(), TransferError> {
        if self.alive.load(SeqCst) {
            Ok(())
        } else {
            Err(TransferError::EngineShutDown)
        }
    }

    /// The provider's view of a remote access: `(address, key)`, after the
    /// key's own check.
    fn target(&self, remote: &Remote) -> Result<(u64, u64), TransferError> {
        let unknown = || TransferError::Protection {
            peer: remote.peer,
            rkey: remote.rkey,
            check: ProtectionCheck::UnknownKey,
        };
        match self.scheme {
            MrScheme::VirtProv => Ok((remote.addr, remote.rkey)),
            MrScheme::VirtApp => keys::check_virt(remote.rkey)
                .then_some((remote.addr, remote.rkey))
                .ok_or_else(unknown),
            MrScheme::OffsetApp => {
                let base = keys::offset_base(remote.rkey).ok_or_else(unknown)?;
                let off = remote.addr.checked_sub(base).ok_or_else(unknown)?;
                Ok((off, remote.rkey))
            }
        }
    }

    /// A local descriptor for `region`: required with `FI_MR_LOCAL`;
    /// otherwise passed where the API honours it (1.22 and newer: a
    /// valid descriptor or null; EFA's RDM path registers a buffer given
    /// without one through its registration cache), null on older ones,
    /// which ignore it.
    fn local_desc(&self, region: &Arc<Region>) -> Result<usize, TransferError> {
        if !self.mr_local && !self.desc_hints {
            return Ok(0);
        }
        let desc = lock(&self.local)
            .get(&(Arc::as_ptr(region) as usize))
            .copied();
        match desc {
            Some(d) => Ok(d),
            None if self.mr_local => Err(TransferError::LocalNotRegistered),
            None => Ok(0),
        }
    }

    /// Registers a buffer owned by one operation (`FI_MR_LOCAL` only);
    /// returns its descriptor.
    fn op_mr(&self, ctx: &mut OpCtx, addr: u64, len: u64) -> Result<usize, TransferError> {
        if !self.mr_local || len == 0 {
            return Ok(0);
        }
        let key = self.next_key.fetch_add(1, Relaxed);
        let mr = self
            .dom
            .reg(addr, len, access_flags(Access::empty()), key)
            .map_err(fi_err)?;
        self.op_registrations.fetch_add(1, Relaxed);
        let d = mr.desc() as usize;
        ctx.mrs.push(mr);
        Ok(d)
    }

    /// Whether a message of `len` bytes goes through a bounce slot (else,
    /// with `FI_MR_LOCAL`, it is registered for its operation).
    fn bounced(&self, len: usize) -> bool {
        self.pools
            .as_ref()
            .is_some_and(|p| len > 0 && len <= p.sends.slot_size())
    }

    /// Lends `ctx` the bounce slot its post needs, filled with what it
    /// sends (atomic words, message bytes); `false` when the pool is
    /// empty (the post then waits like one refused with `-FI_EAGAIN`).
    /// Nothing to do without pools, for posts that need none, or when
    /// the context has its slot already.
    fn bounce_in(&self, ctx: &mut OpCtx, post: &Post) -> bool {
        let Some(pools) = &self.pools else {
            return true;
        };
        if ctx.bounce.is_some() {
            return true;
        }
        let pool = match post {
            Post::Cas { .. } | Post::Faa { .. } => &pools.words,
            Post::Send { .. } if self.bounced(ctx.bytes.len()) => &pools.sends,
            Post::Recv { .. } => match &ctx.kind {
                ffi::CtxKind::Recv(Some(b)) if self.bounced(b.data.len()) => &pools.recvs,
                _ => return true,
            },
            _ => return true,
        };
        let Some(mut lease) = pool.lease() else {
            return false;
        };
        match post {
            Post::Cas { .. } | Post::Faa { .. } => {
                for (i, w) in ctx.words.iter().enumerate() {
                    lease.set_word(i, *w);
                }
            }
            Post::Send { .. } => {
                let n = ctx.bytes.len();
                lease.bytes_mut()[..n].copy_from_slice(&ctx.bytes);
            }
            _ => {}
        }
        ctx.bounce = Some(lease);
        true
    }

    /// The address-vector entry of `peer`, inserting it on first use.
    fn fi_addr(&self, live: &mut Live, peer: &NetAddr) -> Result<u64, TransferError> {
        if let Some(a) = live.peers.get(peer) {
            return Ok(*a);
        }
        let a = live.av.insert(peer.as_bytes()).map_err(fi_err)?;
        live.peers.insert(*peer, a);
        Ok(a)
    }

    /// Reads the completion queue (driving progress), retries posts the
    /// provider refused with `-FI_EAGAIN`, and fails what timed out, on
    /// behalf of the endpoint whose completions go to `own` (`None`: of
    /// nobody's in particular). Returns how many events were handled.
    fn progress(&self, live: &mut Live, own: Option<&Arc<Sink>>) -> usize {
        let mut events = Vec::new();
        // A failing read leaves the queue as it was; the next poll retries.
        let n = live.cq.read(&mut events, 256).unwrap_or_default();
        let mut foreign = 0;
        live.channel_done = 0;
        for ev in events {
            if self.event(live, ev, own) {
                foreign += 1;
            }
        }
        let mut handled = n;
        self.paged_send_acks(live);
        handled += self.retry(live);
        self.expire(live);
        // Client channels' completions are not the NIC's activity: their
        // threads wait for them; the worker has no reason to poll on.
        if handled > live.channel_done {
            live.last_activity = Instant::now();
        }
        // Completions of another endpoint's operations (the worker's, read
        // by a client channel): the worker may be asleep on a wait object
        // that no longer fires. Completions of the caller's own endpoint
        // wake nobody: a thread running the worker's round for it (a
        // waiter on a flag) handles them itself.
        if foreign > 0 && !crate::domain::round_wanted_here() {
            if let Some(t) = self.waker.get() {
                if t.id() != std::thread::current().id() {
                    Counters::bump(&self.counters.worker_wakes, 1);
                    t.unpark();
                    self.wake_sleeping_worker();
                }
            }
        }
        handled
    }

    /// Handles one event of the queue; whether it completed an operation
    /// of an endpoint other than the one whose completions go to `own`.
    fn event(&self, live: &mut Live, ev: CqEvent, own: Option<&Arc<Sink>>) -> bool {
        match ev {
            // The immediate is 32 bits; the provider's CQ data may be
            // wider, the upper bits are never set by our writes.
            CqEvent::RemoteData(d) => self.arrive_imm(d as u32),
            CqEvent::Done {
                mut ctx,
                len,
                result,
            } => match std::mem::replace(&mut ctx.kind, CtxKind::Recv(None)) {
                CtxKind::PagedRecv => {
                    live.recvs.remove(&(&*ctx as *const OpCtx as usize));
                    ctx.kind = CtxKind::PagedRecv;
                    let foreign = match result {
                        Ok(()) => {
                            let n = len.min(ctx.bytes.len());
                            self.paged_arrival(live, &ctx.bytes[..n], own)
                        }
                        Err(_) => {
                            Counters::bump(&self.counters.errors, 1);
                            false
                        }
                    };
                    // The same buffer goes back to the provider.
                    self.paged_repost(live, ctx);
                    return foreign;
                }
                CtxKind::Recv(buf) => {
                    live.recvs.remove(&(&*ctx as *const OpCtx as usize));
                    if let Some(mut buf) = buf {
                        match result {
                            Ok(()) => {
                                // Received into a bounce slot: copy out.
                                if let Some(l) = &ctx.bounce {
                                    let n = len.min(buf.data.len());
                                    buf.data[..n].copy_from_slice(&l.bytes()[..n]);
                                }
                                drop(ctx);
                                Counters::bump(&self.counters.recvs, 1);
                                self.deliver(Incoming::Message { buf, len });
                            }
                            // A receive that failed (truncation): give the
                            // buffer back to the provider.
                            Err(_) => {
                                drop(ctx);
                                self.post_recv_locked(live, buf);
                            }
                        }
                    }
                }
                CtxKind::Op(seq) => {
                    live.abandoned.remove(&seq);
                    let Some(mut f) = live.inflight.remove(&seq) else {
                        return false;
                    };
                    if f.paged.is_some() && result.is_ok() {
                        // A paged message is out: its buffer goes now;
                        // its first segment completes on the target's
                        // acknowledgement (module `paged`; one that came
                        // first finished it and left the context in
                        // `abandoned`, taken above).
                        paged::recycle(live, std::mem::take(&mut ctx.bytes));
                        drop(ctx);
                        f.leaked = None;
                        live.inflight.insert(seq, f);
                        return false;
                    }
                    let value = ctx.result_word();
                    drop(ctx);
                    let result = match result {
                        Ok(()) => Ok(value),
                        Err(errno) => {
                            Counters::bump(&self.counters.errors, u64::from(f.pieces));
                            let e = TransferError::FabricCompletion {
                                op: f.op,
                                peer: f.peer,
                                errno,
                                text: ffi::strerror(errno),
                            };
                            if let Some(sent) = &f.paged {
                                self.fail_extras(live, sent, &e);
                            }
                            Err(e)
                        }
                    };
                    let foreign = !own.is_some_and(|o| Arc::ptr_eq(o, &f.sink));
                    if f.sink.channel.load(Relaxed) {
                        live.channel_done += 1;
                    }
                    live.covers.finish(seq, &f.sink, f.wr_id, f.pieces, result);
                    return foreign;
                }
            },
        }
        false
    }

    /// Counts an immediate that arrived: at once into the engine's sink
    /// when set, else queued as an arrival.
    fn arrive_imm(&self, imm: u32) {
        Counters::bump(&self.counters.imm_arrivals, 1);
        match self.imm_sink.get() {
            // Counted at once by whoever read the queue.
            Some(sink) => {
                if !sink(imm) {
                    Counters::bump(&self.counters.errors, 1);
                }
            }
            None => self.deliver(Incoming::Imm(imm)),
        }
    }

    fn deliver(&self, e: Incoming) {
        self.incoming.push(e);
        if let Some(t) = self.waker.get() {
            t.unpark();
        }
        self.wake_sleeping_worker();
    }

    /// When the worker blocks on the wait object ([`Domain::take_wait`])
    /// and sleeps now: signal the object, so that what another thread read
    /// out of the queue (an arrival) does not wait for its timeout.
    fn wake_sleeping_worker(&self) {
        if let Some(sleeping) = self.worker_waits.get() {
            std::sync::atomic::fence(SeqCst);
            if sleeping.load(SeqCst) {
                if let Some((_, t)) = self.wait_obj.get() {
                    // SAFETY: the queue is open while `Inner` lives.
                    unsafe { t.signal() };
                }
            }
        }
    }

    /// Posts what waited for `-FI_EAGAIN` to clear: each peer's queue in
    /// order until the peer refuses again, then the receives in order.
    fn retry(&self, live: &mut Live) -> usize {
        let mut posted = 0;
        if !live.retry.is_empty() {
            let mut queues = std::mem::take(&mut live.retry);
            posted += queues.retry(Instant::now(), |p| match self.try_post(live, p) {
                Ok(()) => retry::Attempt::Done,
                Err(p) => retry::Attempt::Again(p),
            });
            live.retry = queues;
        }
        while let Some(p) = live.recv_retry.pop_front() {
            match self.try_post(live, p) {
                Ok(()) => posted += 1,
                Err(p) => {
                    live.recv_retry.push_front(p);
                    break;
                }
            }
        }
        posted
    }

    /// Submits an operation to the peer `fi_addr`: posted now unless the
    /// peer has refused operations waiting (it then queues behind them),
    /// queued if refused.
    fn submit(&self, live: &mut Live, fi_addr: u64, p: Pending) {
        let mut queues = std::mem::take(&mut live.retry);
        queues.submit(fi_addr, p, Instant::now(), |p| {
            match self.try_post(live, p) {
                Ok(()) => retry::Attempt::Done,
                Err(p) => retry::Attempt::Again(p),
            }
        });
        live.retry = queues;
    }

    /// Posts one operation; hands it back on `-FI_EAGAIN`. Other errors
    /// complete it at once.
    fn try_post(&self, live: &mut Live, p: Pending) -> Result<(), Pending> {
        let Some(ep) = live.ep.as_ref() else {
            return Ok(());
        };
        let Pending { mut ctx, post, seq } = p;
        if !self.bounce_in(&mut ctx, &post) {
            return Err(Pending { ctx, post, seq });
        }
        match ep.post(ctx, &post) {
            Ok(leaked) => {
                match seq {
                    Some(seq) => {
                        if let Some(m) = live.retry_meta.remove(&seq) {
                            if let Some(sent) = &m.paged {
                                self.posted_extras(live, &sent.extras);
                            }
                            live.inflight.insert(seq, m.posted(Some(leaked)));
                            live.order.push_back(seq);
                        } else {
                            // Flushed while waiting: nobody wants the
                            // result any more, but the provider owns it.
                            live.abandoned.insert(seq, leaked);
                        }
                    }
                    None => {
                        live.recvs.insert(leaked.addr(), leaked);
                    }
                }
                Ok(())
            }
            Err((ctx, e)) if e.is_eagain() => Err(Pending { ctx, post, seq }),
            Err((ctx, e)) => {
                drop(ctx);
                if let Some((seq, m)) = seq.and_then(|s| live.retry_meta.remove_entry(&s)) {
                    Counters::bump(&self.counters.errors, u64::from(m.pieces));
                    let e = fi_err(e);
                    if let Some(sent) = &m.paged {
                        self.fail_extras(live, sent, &e);
                    }
                    live.covers.finish(seq, &m.sink, m.wr_id, m.pieces, Err(e));
                }
                Ok(())
            }
        }
    }

    /// Fails operations older than the timeout (posted or waiting to be).
    fn expire(&self, live: &mut Live) {
        let limit = self.cfg.op_timeout;
        let now = Instant::now();
        while let Some(&seq) = live.order.front() {
            let Some(f) = live.inflight.get(&seq) else {
                live.order.pop_front();
                continue;
            };
            if now.duration_since(f.since) < limit {
                break;
            }
            live.order.pop_front();
            if let Some(f) = live.inflight.remove(&seq) {
                Counters::bump(&self.counters.errors, u64::from(f.pieces));
                live.covers.finish(
                    seq,
                    &f.sink,
                    f.wr_id,
                    f.pieces,
                    Err(TransferError::Timeout {
                        op: f.op,
                        peer: f.peer,
                        waited: limit,
                    }),
                );
                if let Some(l) = f.leaked {
                    live.abandoned.insert(seq, l);
                }
            }
        }
        // Waiting posts: a peer whose queue made no progress within the
        // bound is given up on, its operations failed (never posted: the
        // contexts are ours to drop).
        for g in live.retry.expire(now, limit) {
            for p in g.items {
                let Some((seq, m)) = p
                    .seq
                    .and_then(|s| live.retry_meta.remove(&s).map(|m| (s, m)))
                else {
                    continue;
                };
                Counters::bump(&self.counters.errors, u64::from(m.pieces));
                let e = TransferError::PeerNotReady {
                    op: m.op,
                    peer: m.peer,
                    waited: g.waited,
                    refusals: g.refusals,
                    rxm_buffer: self.cfg.rxm_buffer(),
                };
                if let Some(sent) = &m.paged {
                    self.fail_extras(live, sent, &e);
                }
                live.covers.finish(seq, &m.sink, m.wr_id, m.pieces, Err(e));
            }
        }
    }

    /// Before the endpoint closes: reads the queue until every posted
    /// operation has completed (or [`DRAIN`] / the operation timeout has
    /// passed), posting nothing new. A provider may still be working on
    /// them, and a peer in this process may still hold our operations in
    /// its queue: `shm` (1.17) hands in-process peers its own mapping of
    /// our endpoint's region, and a peer that finishes one of our
    /// operations after our endpoint closed writes its acknowledgement
    /// into unmapped memory (seen as crashes of the surviving engine).
    fn drain(&self) {
        let deadline = Instant::now() + DRAIN.min(self.cfg.op_timeout);
        loop {
            {
                let mut g = lock(&self.live);
                let Some(live) = g.as_mut() else { return };
                let mut events = Vec::new();
                let _ = live.cq.read(&mut events, 256);
                for ev in events {
                    self.event(live, ev, None);
                }
                self.paged_send_acks(live);
                if live.inflight.is_empty() && live.abandoned.is_empty() {
                    return;
                }
            }
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn post_recv_locked(&self, live: &mut Live, buf: RecvBuffer) {
        let mut ctx = OpCtx::new(CtxKind::Recv(None));
        let (addr, len) = (buf.data.as_ptr() as u64, buf.data.len() as u64);
        // A buffer that fits a bounce slot receives into one (lent at
        // posting, `bounce_in`); a larger one is registered for this post.
        let len = if self.bounced(buf.data.len()) { 0 } else { len };
        let desc = match self.op_mr(&mut ctx, addr, len) {
            Ok(d) => d,
            // Without a descriptor the buffer cannot be posted; dropping
            // it shrinks the pool, which the sender sees as no buffer.
            Err(_) => return,
        };
        ctx.kind = CtxKind::Recv(Some(buf));
        let p = Pending {
            ctx,
            post: Post::Recv { desc },
            seq: None,
        };
        if !live.recv_retry.is_empty() {
            live.recv_retry.push_back(p);
        } else if let Err(p) = self.try_post(live, p) {
            live.recv_retry.push_back(p);
        }
    }
}

impl Domain for LibfabricDomain {
    fn address(&self) -> NetAddr {
        self.inner.addr
    }

    fn device_name(&self) -> String {
        self.device.clone()
    }

    fn register(&self, region: &Arc<Region>) -> Result<u64, TransferError> {
        let inner = &self.inner;
        inner.fail_fast()?;
        let flags = access_flags(region.access());
        let mut attempts = 0;
        let (mr, key) = loop {
            let want = match inner.scheme {
                MrScheme::VirtProv => 0,
                MrScheme::VirtApp => keys::virt_key(inner.next_key.fetch_add(1, Relaxed)),
                MrScheme::OffsetApp => {
                    keys::offset_key(region.addr()).ok_or(TransferError::UnsupportedMrMode {
                        provider: self.negotiated.provider.clone(),
                        mr_mode: 0,
                        why: "region address above 2^48 cannot be carried in the key",
                    })?
                }
            };
            match inner.dom.reg(region.addr(), region.len(), flags, want) {
                Ok(mr) => {
                    let key = if inner.scheme == MrScheme::VirtProv {
                        mr.key()
                    } else {
                        want
                    };
                    break (mr, key);
                }
                // A key in use: try the next one (application keys).
                Err(e)
                    if e.errno == libfabric_sys::FI_ENOKEY
                        && inner.scheme == MrScheme::VirtApp
                        && attempts < 8 =>
                {
                    attempts += 1;
                }
                Err(e) => return Err(fi_err(e)),
            }
        };
        if inner.mr_endpoint {
            let live = lock(&inner.live);
            let ep = live
                .as_ref()
                .and_then(|l| l.ep.as_ref())
                .ok_or(TransferError::EngineShutDown)?;
            mr.bind_enable(ep).map_err(fi_err)?;
        }
        let desc = mr.desc() as usize;
        let r = Arc::as_ptr(region) as usize;
        lock(&inner.local).insert(r, desc);
        lock(&inner.mrs).insert(
            key,
            MrEntry {
                mr,
                region: r,
                weak: Arc::downgrade(region),
            },
        );
        Ok(key)
    }

    fn deregister(&self, rkey: u64) {
        let entry = lock(&self.inner.mrs).remove(&rkey);
        if let Some(e) = entry {
            lock(&self.inner.local).remove(&e.region);
            drop(e.mr);
        }
    }

    fn resolve(&self, peer: &NetAddr) -> Result<(), TransferError> {
        let mut g = lock(&self.inner.live);
        let live = g.as_mut().ok_or(TransferError::EngineShutDown)?;
        self.inner.fi_addr(live, peer).map(|_| ())
    }

    fn open_endpoint(&self) -> Result<AnyEndpoint, TransferError> {
        self.inner.fail_fast()?;
        Ok(AnyEndpoint::Libfabric(FabricEndpoint::new(
            self.inner.clone(),
        )))
    }

    fn post_recv(&self, buf: RecvBuffer) {
        let mut g = lock(&self.inner.live);
        if let Some(live) = g.as_mut() {
            self.inner.post_recv_locked(live, buf);
        }
    }

    fn poll_incoming(&self, out: &mut Vec<Incoming>) -> usize {
        // Reading the queue here too keeps arrivals flowing when no
        // endpoint is polled (skipped when one just did: the worker polls
        // its endpoint right before); never wait for the lock.
        if !self.inner.endpoint_polled.swap(false, Relaxed) {
            if let Ok(mut g) = self.inner.live.try_lock() {
                if let Some(live) = g.as_mut() {
                    self.inner.progress(live, None);
                }
            }
        }
        crate::domain::drain_incoming(&self.inner.incoming, out)
    }

    fn set_waker(&self, waker: Thread) {
        let _ = self.inner.waker.set(waker.clone());
        waker.unpark();
    }

    fn set_imm_sink(&self, sink: ImmSink) {
        let _ = self.inner.imm_sink.set(sink);
    }

    fn woken(&self) {
        // Target-side work (a peer's write, read or atomic) produces no
        // completion here: count the wake-up as activity, so that
        // `busy_poll` keeps reading the queue for the peer's next one.
        if let Some(live) = lock(&self.inner.live).as_mut() {
            live.last_activity = Instant::now();
        }
    }

    fn direct_post(&self) -> bool {
        // Posting only takes the endpoint's lock; what the provider still
        // has to do is announced on the wait object, or read on the
        // timer, and a refused post wakes the worker (`post`).
        true
    }

    fn ordered(&self) -> bool {
        self.inner.claims.ordered
    }

    fn writes_ordered(&self) -> bool {
        // The order covered writes rely on too (module `cover`: rxm keeps
        // one connection per peer, and the target reads each stream in
        // order, placing a write's data before it parses the next header).
        self.inner.claims.ordered || writes_ordered(self.inner.order.tx_msg_order)
    }

    fn immediates(&self) -> bool {
        self.inner.claims.immediates
    }

    fn atomic_profile(&self) -> crate::atomics::AtomicProfile {
        efa::atomic_profile(&self.negotiated().provider)
    }

    fn counters(&self) -> CounterSnapshot {
        self.inner.counters.snapshot()
    }

    fn set_failed(&self, _failed: bool) -> bool {
        // The target side of a real fabric cannot be made to fail its
        // peers' operations.
        false
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        let inner = &self.inner;
        inner.wait.get().filter(|w| w.usable())?;
        inner.wait_obj.get().map(|(fd, _)| *fd)
    }

    fn take_wait(&self, sleeping: Arc<AtomicBool>) {
        let inner = &self.inner;
        if inner.worker_waits.set(sleeping).is_ok() {
            // The waiter parks after its current wait and is never armed
            // again (see `FabricEndpoint::poll`): the worker reads the
            // queue when the wait object wakes it.
            if let Some(w) = inner.wait.get() {
                w.disarm();
            }
        }
    }

    fn channels_busy(&self, within: Duration) -> bool {
        let last = self.inner.channel_posted.load(Relaxed);
        let within = u64::try_from(within.as_nanos()).unwrap_or(u64::MAX);
        last != 0 && crate::timer::monotonic_ns().saturating_sub(last) < within
    }

    fn may_block(&self) -> bool {
        let inner = &self.inner;
        if !inner.incoming.is_empty() {
            return false;
        }
        match inner.wait_obj.get() {
            // SAFETY: the queue is open while `Inner` lives. An error
            // leaves the worker to its timeout.
            Some((_, t)) => unsafe { t.may_block() }.unwrap_or(true),
            None => true,
        }
    }

    fn signal(&self) {
        if let Some((_, t)) = self.inner.wait_obj.get() {
            // SAFETY: the queue is open while `Inner` lives.
            unsafe { t.signal() };
        }
    }

    fn shutdown(&self) {
        if !self.inner.alive.swap(false, SeqCst) {
            return;
        }
        // The waiter reads the queue under the lock: take it out first,
        // stop it without the lock.
        let waiter = lock(&self.inner.live)
            .as_mut()
            .and_then(|l| l.waiter.take());
        if let Some(mut w) = waiter {
            w.stop();
        }
        self.inner.drain();
        // Not closed here: the engine's worker may still be reading the
        // queues of its other NICs, and `shm` (1.17) lets an in-process
        // peer's progress touch this endpoint's region, which closing
        // unmaps. The endpoint closes in `close` (once the worker
        // stopped), else when `Inner` drops.
        let live = lock(&self.inner.live).take();
        *lock(&self.inner.closing) = live;
        while self.inner.incoming.pop().is_some() {}
        if self.inner.shared_memory {
            let swept = {
                let mut p = lock(&SHM_PARKING);
                p.open = p.open.saturating_sub(1);
                p.parked.push(self.inner.clone());
                if p.open == 0 {
                    std::mem::take(&mut p.parked)
                } else {
                    Vec::new()
                }
            };
            // Nothing progresses a shared-memory endpoint any more: close
            // them all (each before its domain, which its `Inner` owns).
            for inner in swept {
                drop(lock(&inner.closing).take());
            }
        }
    }

    fn close(&self) {
        // A shared-memory endpoint closes with the process's last one
        // (`shutdown`): an in-process peer may still progress into it.
        // Any other: closing cancels what is in flight, and `Live`'s drop
        // frees the contexts, releasing their pins on our regions.
        if !self.inner.shared_memory {
            drop(lock(&self.inner.closing).take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use libfabric_sys::fi_version_of;

    #[test]
    fn only_efa_from_api_1_18_refuses_shared_memory() {
        assert!(wants_nic_only("efa", fi_version_of(1, 18)));
        assert!(wants_nic_only("efa", fi_version_of(2, 0)));
        assert!(!wants_nic_only("efa", fi_version_of(1, 17)));
        assert!(!wants_nic_only("tcp;ofi_rxm", fi_version_of(2, 0)));
        assert!(!wants_nic_only("shm", fi_version_of(2, 0)));
        assert!(!wants_nic_only("verbs;ofi_rxm", fi_version_of(2, 0)));
    }

    #[test]
    fn a_write_with_an_immediate_is_refused_where_none_can_be_carried() {
        use crate::domain::Endpoint;
        if let Err(e) = probe("tcp", Some("127.0.0.1")) {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            return;
        }
        let open = || {
            LibfabricDomain::open(&LibfabricConfig {
                wait_fd: false,
                ..LibfabricConfig::new("tcp", Some("127.0.0.1"))
            })
            .expect("open a tcp NIC")
        };
        let (mut a, b) = (open(), open());
        assert!(a.immediates(), "tcp carries 8 bytes of CQ data");
        // As a provider with `cq_data_size` 2 would be (no waiter: the
        // domain's `Inner` is not shared yet).
        let inner = Arc::get_mut(&mut a.inner).expect("unshared");
        inner.order.cq_data_size = 2;
        inner.claims = efa::Claims::of_domain(&inner.order);
        assert!(!a.immediates());
        let region = |len| Region::alloc(len, Access::all(), 1, 0).expect("region");
        let (src, dst) = (region(64), region(64));
        a.register(&src).expect("register src");
        let rkey = b.register(&dst).expect("register dst");
        let mut ep = a.open_endpoint().expect("endpoint");
        let write = |wr_id, imm| crate::domain::WorkRequest {
            wr_id,
            op: crate::domain::WorkOp::Write {
                local: Some(crate::domain::Local {
                    region: src.clone(),
                    offset: 0,
                }),
                remote: Remote {
                    peer: b.address(),
                    rkey,
                    addr: dst.addr(),
                },
                len: 64,
                imm,
            },
        };
        ep.post(&mut vec![write(1, Some(7)), write(2, None)]);
        let (mut got, mut out) = (Vec::new(), Vec::new());
        let start = Instant::now();
        while got.len() < 2 {
            assert!(start.elapsed() < Duration::from_secs(30), "{got:?}");
            ep.poll(&mut out);
            b.poll_incoming(&mut Vec::new());
            got.append(&mut out);
            std::thread::sleep(Duration::from_micros(200));
        }
        got.sort_by_key(|c| c.wr_id);
        assert_eq!(
            got[0].result,
            Err(TransferError::NoImmediates {
                provider: "tcp;ofi_rxm".into(),
                cq_data_size: 2
            })
        );
        assert_eq!(got[1].result, Ok(0), "a write without one goes through");
        assert_eq!(b.counters().imm_arrivals, 0);
    }

    #[test]
    fn negotiated_prints_on_one_line() {
        let n = Negotiated {
            library: "libfabric.so.1".into(),
            library_version: fi_version_of(2, 1),
            api_version: fi_version_of(2, 1),
            provider: "efa".into(),
            msg_order: 0x12,
            mr_mode: 0x2f0,
            order: efa::OrderAttrs {
                tx_msg_order: 0x12,
                rx_msg_order: 0x12,
                max_msg_size: usize::MAX,
                max_order_raw_size: 0,
                max_order_war_size: 0,
                max_order_waw_size: 0,
                cq_data_size: 4,
                inject_size: 32,
            },
            claims: efa::Claims {
                ordered: false,
                immediates: true,
            },
            shared_memory_off: true,
        };
        assert_eq!(
            n.to_string(),
            "libfabric 2.1 (libfabric.so.1), API 2.1, provider efa, msg_order 0x12, \
             mr_mode 0x2f0, unordered, immediates, shared memory off"
        );
    }
}
