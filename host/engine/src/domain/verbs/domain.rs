//! [`VerbsDomain`]: one ConnectX (or any verbs) port behind the [`Domain`]
//! trait, tying the device-free modules to a device.
//!
//! - Address ([`VerbsAddr`]): GID, LID, UD queue-pair number, qkey.
//! - Peers connect on first use (an operation aimed at them, or
//!   [`Domain::resolve`]) through the [`Connector`]'s UD handshake;
//!   operations wait for the connection, then go to the peer's message
//!   queue pair (sends) or RDMA queue pair (reads, writes, atomics) as
//!   chains of up to four requests ([`SendSide`]). The passive side of a
//!   handshake is answered by whoever reads the completion queue: the
//!   worker's [`Domain::poll_incoming`], any endpoint's poll, `resolve`.
//! - One completion queue for everything; each entry's `wr_id` says what it
//!   was ([`WrTag`]), the queue-pair number which peer's queue pair
//!   completed, and [`SendSide::complete`] which operations it settles;
//!   each operation's record names the endpoint ([`Sink`]) that posted it.
//! - Immediates arrive as completions of the zero-length receives on the
//!   shared receive queue (reposted at once); messages land in registered
//!   staging buffers posted on the message receive queue, one per buffer
//!   the engine posts, and are copied into it before it is handed back.
//! - A queue pair that fails (a remote access error breaks RC) is retired:
//!   its peer is forgotten, operations not yet posted move to a new
//!   connection, and the old pair is released once its completions are in.
//! - Registrations ask for relaxed ordering (unless
//!   [`VerbsConfig::relaxed_ordering`] is off, which makes the domain
//!   ordered) and fall back without it where the device refuses; remote
//!   keys are the NIC's 32-bit `rkey`s.
//! - Every operation completes exactly once: from the NIC, at posting when
//!   it cannot be built, with [`TransferError::Timeout`] after
//!   [`VerbsConfig::op_timeout`], with [`TransferError::UnknownPeer`] when
//!   its connection cannot be made, or with
//!   [`TransferError::EngineShutDown`] at flush and shutdown. Buffers the
//!   NIC may still touch stay owned by the domain until it lets go.
//!
//! Drop order (fields of `Live`): queue pairs, then the device's receive
//! queues and completion queue, then every buffer the NIC could write.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use ibverbs_sys::{ibv_wc, ibv_wc_status};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rolex_core::wire::{Access, NetAddr};

use super::addr::VerbsAddr;
use super::bringup::AccessFlags;
use super::caps::DeviceCaps;
use super::completions::WrError;
use super::connect::{ConnectError, Connector, ConnectorConfig, Event, Outgoing, PeerState};
use super::demux::{transfer_error, NotPosted, SendSide, WrTag};
use super::endpoint::VerbsEndpoint;
use super::error::VerbsError;
use super::ffi::{wc_buffer, Ah, Device, DmaBuf, Qp, RegionMr};
use super::handshake::ENCODED_LEN;
use super::srq::SrqStock;
use super::wr::{Chain, ChainOp, Sge, WrTemplates};
use super::{Nic, VerbsConfig, GRH_LEN, UD_RECVS, UD_SENDS, UD_SLOT};
use crate::atomics::AtomicProfile;
use crate::counters::{CounterSnapshot, Counters};
use crate::domain::{
    AnyEndpoint, Completion, Domain, Incoming, Local, RecvBuffer, Remote, WorkOp, WorkRequest,
};
use crate::error::{OpKind, ProtectionCheck, TransferError};
use crate::region::Region;

/// How long after the last activity pollers keep the short back-off
/// before dropping to [`VerbsConfig::idle_poll`].
pub const HOT: Duration = Duration::from_millis(20);

/// Longest wait at shutdown for posted operations to complete.
pub const DRAIN: Duration = Duration::from_secs(2);

/// The largest RC message.
pub const MAX_MESSAGE: u64 = 1 << 31;

/// Atomic result words per registered slab.
const ATOMIC_SLAB: usize = 512;

/// Free staging buffers kept per size class.
const POOL_KEEP: usize = 64;

/// Where an endpoint's completions go, and how many it has outstanding.
pub(crate) struct Sink {
    pub(crate) queue: SegQueue<Completion>,
    pub(crate) outstanding: AtomicU64,
}

impl Sink {
    pub(crate) fn new() -> Arc<Sink> {
        Arc::new(Sink {
            queue: SegQueue::new(),
            outstanding: AtomicU64::new(0),
        })
    }

    fn push(&self, c: Completion) {
        self.queue.push(c);
        self.outstanding.fetch_sub(1, SeqCst);
    }
}

/// Which queue pair of a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Which {
    Msg,
    Rdma,
}

/// A connected peer's two queue pairs.
struct Peer {
    msg: SendSide<Qp>,
    rdma: SendSide<Qp>,
    msg_qpn: u32,
    rdma_qpn: u32,
}

impl Peer {
    fn side(&mut self, w: Which) -> &mut SendSide<Qp> {
        match w {
            Which::Msg => &mut self.msg,
            Which::Rdma => &mut self.rdma,
        }
    }
}

/// Where a queue pair's peer entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loc {
    Live(NetAddr),
    /// Retired; keyed by its message queue-pair number.
    Retiring(u32),
}

/// What an operation holds while the NIC may use it.
#[derive(Default)]
struct Resources {
    region: Option<Arc<Region>>,
    buf: Option<DmaBuf>,
    _inline: Option<Vec<u8>>,
    atomic: Option<usize>,
}

impl Resources {
    /// Whether the operation uses the region at address `at` (its `Arc`'s).
    fn holds(&self, at: usize) -> bool {
        self.region
            .as_ref()
            .is_some_and(|r| Arc::as_ptr(r) as usize == at)
    }
}

/// Operations in flight that use the region at `at`: posted, waiting, or
/// failed by timeout or flush while the NIC may still execute them.
fn holders(live: &Live, at: usize) -> usize {
    let ops = live.ops.values().filter(|r| r.res.holds(at)).count();
    ops + live.abandoned.values().filter(|r| r.holds(at)).count()
}

/// One region's deregistration on a verbs NIC ([`dereg`](super::dereg)).
struct RegionDrain<'a> {
    inner: &'a Inner,
    rkey: u64,
    at: usize,
}

impl super::dereg::DrainRegion for RegionDrain<'_> {
    fn refuse_new(&mut self) {
        lock(&self.inner.local).remove(&self.at);
    }

    fn progress_holders(&mut self) -> usize {
        let mut g = lock(&self.inner.live);
        match g.as_mut() {
            Some(live) => {
                self.inner.progress(live);
                holders(live, self.at)
            }
            // Shut down: the queue pairs are gone, nothing executes.
            None => 0,
        }
    }

    fn invalidate(&mut self) {
        // `ibv_dereg_mr` when the registration drops.
        drop(lock(&self.inner.mrs).remove(&self.rkey));
    }
}

struct OpRecord {
    wr_id: u64,
    sink: Arc<Sink>,
    op: OpKind,
    peer: NetAddr,
    since: Instant,
    res: Resources,
}

struct MsgSlot {
    buf: RecvBuffer,
    staging: DmaBuf,
}

/// The queue pairs and everything that lives and dies with them (under
/// one lock: posting, reading the completion queue and connecting never
/// overlap). Field order is drop order: see the module docs.
pub(super) struct Live {
    peers: HashMap<NetAddr, Peer>,
    retiring: HashMap<u32, Peer>,
    conn: Connector<Qp>,
    ud: Qp,
    ahs: HashMap<VerbsAddr, Ah>,
    dev: Device,
    ud_buf: DmaBuf,
    msgs: HashMap<u64, MsgSlot>,
    atomics: Vec<DmaBuf>,
    pool: HashMap<usize, Vec<DmaBuf>>,
    ops: BTreeMap<u64, OpRecord>,
    abandoned: HashMap<u64, Resources>,
    pending_msgs: VecDeque<RecvBuffer>,
    ud_send_free: Vec<usize>,
    atomic_free: Vec<usize>,
    next_msg: u64,
    by_qpn: HashMap<u32, (Loc, Which)>,
    waiting: HashMap<NetAddr, VecDeque<(u64, ChainOp, Which)>>,
    next_seq: u64,
    budget: usize,
    /// The immediates' receive queue (stocked by `Nic::open`).
    imm_stock: SrqStock,
    templates: WrTemplates,
    chain: Chain,
    wcs: Vec<ibv_wc>,
    rng: StdRng,
    pub(super) last_activity: Instant,
}

impl Live {
    /// Whether connections are being made (pollers should keep going).
    pub(super) fn connecting(&self) -> bool {
        self.conn.connecting() || !self.waiting.is_empty()
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        // Nothing more will complete: tell the endpoints. The resources
        // drop with the fields, after the queue pairs.
        for rec in self.ops.values() {
            rec.sink.push(Completion {
                wr_id: rec.wr_id,
                result: Err(TransferError::EngineShutDown),
            });
        }
    }
}

/// The shared state of one verbs NIC.
pub(crate) struct Inner {
    pub(super) live: Mutex<Option<Live>>,
    mrs: Mutex<HashMap<u64, (RegionMr, usize)>>,
    /// Local keys by region (its `Arc` address).
    local: Mutex<HashMap<usize, u32>>,
    pd: Arc<super::ffi::Pd>,
    addr: NetAddr,
    cfg: VerbsConfig,
    relaxed: AtomicBool,
    incoming: SegQueue<Incoming>,
    waker: OnceLock<Thread>,
    alive: AtomicBool,
    pub(super) counters: Counters,
    /// The device's atomics: fetched values are converted from
    /// `atomics.reply` before a completion reports them.
    atomics: AtomicProfile,
    caps: DeviceCaps,
}

/// One verbs NIC of an engine (see the module docs).
pub struct VerbsDomain {
    inner: Arc<Inner>,
    name: String,
}

impl std::fmt::Debug for VerbsDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsDomain")
            .field("device", &self.name)
            .field("addr", &self.inner.addr)
            .finish()
    }
}

/// Opens `nics` verbs domains (one context, protection domain, completion
/// queue and UD queue pair each) on the devices
/// [`super::chosen_devices`] picks from libibverbs' list.
pub fn open_host(cfg: &VerbsConfig, nics: usize) -> Result<Vec<Arc<VerbsDomain>>, TransferError> {
    let listed = super::ffi::device_names()?;
    super::chosen_devices(cfg, &listed, nics)?
        .into_iter()
        .map(|device| {
            let one = VerbsConfig {
                device: Some(device),
                ..cfg.clone()
            };
            VerbsDomain::open(&one).map(Arc::new)
        })
        .collect()
}

fn malformed(error: rolex_core::wire::WireError) -> TransferError {
    TransferError::Malformed {
        what: "verbs address",
        error,
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tries `register` with relaxed ordering while `relaxed` holds, and once
/// more without it if the device refuses; returns the outcome and whether
/// relaxed ordering is still worth asking for.
pub(super) fn with_relaxed_fallback<T>(
    relaxed: bool,
    mut register: impl FnMut(bool) -> Result<T, VerbsError>,
) -> (Result<T, VerbsError>, bool) {
    if !relaxed {
        return (register(false), false);
    }
    match register(true) {
        Ok(t) => (Ok(t), true),
        Err(first) => match register(false) {
            Ok(t) => (Ok(t), false),
            // Refused either way: the flag was not the reason.
            Err(_) => (Err(first), true),
        },
    }
}

/// The NIC access a region's rights ask for.
pub(super) fn region_access(a: Access, relaxed: bool) -> AccessFlags {
    AccessFlags {
        // Reads land in it and the NIC needs it for remote write/atomics.
        local_write: true,
        remote_read: a.contains(Access::REMOTE_READ),
        remote_write: a.contains(Access::REMOTE_WRITE),
        remote_atomic: a.contains(Access::REMOTE_ATOMIC),
        relaxed_ordering: relaxed,
    }
}

pub(super) fn op_kind(op: &WorkOp) -> OpKind {
    match op {
        WorkOp::Read { .. } => OpKind::Read,
        WorkOp::Write { .. } => OpKind::Write,
        WorkOp::Cas { .. } => OpKind::Cas,
        WorkOp::Faa { .. } => OpKind::Faa,
        WorkOp::Send { .. } => OpKind::Send,
    }
}

/// A message length the NIC takes.
pub(super) fn msg_len(op: OpKind, len: u64) -> Result<u32, TransferError> {
    if len > MAX_MESSAGE {
        return Err(TransferError::TooLarge {
            op,
            len,
            max: MAX_MESSAGE,
        });
    }
    Ok(len as u32)
}

/// The NIC's 32-bit key of a remote, refused before posting if wider.
pub(super) fn rkey32(remote: &Remote) -> Result<u32, TransferError> {
    u32::try_from(remote.rkey).map_err(|_| TransferError::Protection {
        peer: remote.peer,
        rkey: remote.rkey,
        check: ProtectionCheck::UnknownKey,
    })
}

fn size_class(len: usize) -> usize {
    len.max(64).next_power_of_two()
}

impl VerbsDomain {
    /// Opens one NIC: the device, its queues and UD queue pair, the
    /// handshake receives.
    pub fn open(cfg: &VerbsConfig) -> Result<VerbsDomain, TransferError> {
        let nic = Nic::open(cfg)?;
        let name = nic.name().to_string();
        let Nic {
            device,
            ud,
            qkey,
            lid,
            gid,
            gid_index,
            mtu,
            caps,
            timing,
        } = nic;
        // The receive queues were made as deep as the device takes.
        let cfg = &VerbsConfig {
            srq_depth: caps.clamp_srq(cfg.srq_depth),
            gid_index,
            timing,
            ..cfg.clone()
        };
        let me = VerbsAddr {
            gid,
            lid,
            ud_qpn: ud.qpn,
            qkey,
        };
        let addr = me.to_net().map_err(malformed)?;
        let conn = Connector::new(
            me,
            ConnectorConfig {
                port: cfg.port,
                gid_index: cfg.gid_index,
                max_peers: cfg.max_peers,
                mtu,
                timing,
                retry: cfg.handshake_retry,
                timeout: cfg.handshake_timeout,
            },
        )
        .map_err(malformed)?;
        let ud_buf = DmaBuf::new(&device.pd, (UD_RECVS + UD_SENDS) * UD_SLOT)?;
        let pd = device.pd.clone();
        let live = Live {
            peers: HashMap::new(),
            retiring: HashMap::new(),
            conn,
            ud: ud.qp,
            ahs: HashMap::new(),
            dev: device,
            ud_buf,
            msgs: HashMap::new(),
            atomics: Vec::new(),
            pool: HashMap::new(),
            ops: BTreeMap::new(),
            abandoned: HashMap::new(),
            pending_msgs: VecDeque::new(),
            ud_send_free: (0..UD_SENDS).collect(),
            atomic_free: Vec::new(),
            next_msg: 0,
            by_qpn: HashMap::new(),
            waiting: HashMap::new(),
            next_seq: 0,
            budget: cfg.cq_depth as usize,
            imm_stock: {
                let mut s = SrqStock::new(cfg.srq_depth);
                s.refilled(cfg.srq_depth);
                s
            },
            templates: WrTemplates::new(cfg.max_inline),
            chain: Chain::new(),
            wcs: wc_buffer(64),
            rng: StdRng::from_entropy(),
            last_activity: Instant::now(),
        };
        // Posted only now that `live` owns both: on an error it drops the
        // queue pair before the buffer the receives point into.
        for i in 0..UD_RECVS {
            let sge = live
                .ud_buf
                .sge(i * UD_SLOT, UD_SLOT)
                .ok_or(TransferError::Verbs {
                    call: "ibv_post_recv",
                    errno: libc::EINVAL,
                })?;
            live.ud.post_recv(WrTag::UdRecv.id(i as u64), sge)?;
        }
        Ok(VerbsDomain {
            name,
            inner: Arc::new(Inner {
                live: Mutex::new(Some(live)),
                mrs: Mutex::new(HashMap::new()),
                local: Mutex::new(HashMap::new()),
                pd,
                addr,
                cfg: cfg.clone(),
                relaxed: AtomicBool::new(cfg.relaxed_ordering),
                incoming: SegQueue::new(),
                waker: OnceLock::new(),
                alive: AtomicBool::new(true),
                counters: Counters::default(),
                atomics: caps.atomic_profile(),
                caps,
            }),
        })
    }

    /// The device's name (`mlx5_0`, `rxe0`).
    pub fn device_name(&self) -> &str {
        &self.name
    }

    /// What the device reported at open.
    pub fn caps(&self) -> DeviceCaps {
        self.inner.caps
    }

    /// Whether registrations still ask for relaxed ordering (the device
    /// did not refuse it).
    pub fn relaxed_ordering(&self) -> bool {
        self.inner.relaxed.load(SeqCst)
    }
}

impl Drop for VerbsDomain {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    pub(super) fn cfg(&self) -> &VerbsConfig {
        &self.cfg
    }

    fn deliver(&self, e: Incoming) {
        self.incoming.push(e);
        if let Some(t) = self.waker.get() {
            t.unpark();
        }
    }

    /// Reads the completion queue, drives the handshakes, posts what
    /// waits, fails what timed out. Returns how many completions were
    /// handled.
    pub(super) fn progress(&self, live: &mut Live) -> usize {
        let mut handled = 0;
        for _ in 0..4 {
            let mut wcs = std::mem::take(&mut live.wcs);
            // A failing read leaves the queue as it was; the next poll
            // retries.
            let n = live.dev.cq.poll(&mut wcs).unwrap_or(0);
            for wc in &wcs[..n] {
                self.on_wc(live, wc);
            }
            let full = n == wcs.len();
            live.wcs = wcs;
            handled += n;
            if !full {
                break;
            }
        }
        let due = live.imm_stock.due();
        if due > 0 && live.dev.srq.post_zero_length(due, WrTag::Imm.id(0)).is_ok() {
            live.imm_stock.refilled(due);
        }
        let now = Instant::now();
        let (mut out, mut ev) = (Vec::new(), Vec::new());
        live.conn.tick(now, &mut out, &mut ev);
        self.after_connector(live, out, ev);
        self.expire(live, now);
        self.sweep_retiring(live);
        while live.msgs.len() < self.cfg.srq_depth as usize {
            let Some(buf) = live.pending_msgs.pop_front() else {
                break;
            };
            self.post_msg(live, buf);
        }
        self.pump_all(live);
        if handled > 0 {
            live.last_activity = now;
        }
        handled
    }

    fn on_wc(&self, live: &mut Live, wc: &ibv_wc) {
        let (status, vendor) = wc.error().unwrap_or((ibv_wc_status::IBV_WC_SUCCESS, 0));
        let ok = status == ibv_wc_status::IBV_WC_SUCCESS;
        let flushed = status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        match WrTag::split(wc.wr_id()) {
            Some((WrTag::Op, _)) => self.on_op_wc(live, wc.qp_num, wc.wr_id(), status, vendor),
            Some((WrTag::Imm, _)) => {
                if let (true, Some(imm)) = (ok, wc.imm_data()) {
                    Counters::bump(&self.counters.imm_arrivals, 1);
                    self.deliver(Incoming::Imm(u32::from_be(imm)));
                } else if !ok && !flushed {
                    self.qp_failed(live, wc.qp_num);
                }
                // Refilled in one post below the watermark (`progress`).
                live.imm_stock.consumed(1);
            }
            Some((WrTag::Msg, slot)) => {
                let Some(MsgSlot { mut buf, staging }) = live.msgs.remove(&slot) else {
                    return;
                };
                if ok {
                    let len = wc.len().min(buf.data.len());
                    staging.read(0, &mut buf.data[..len]);
                    self.pool_put(live, staging);
                    Counters::bump(&self.counters.recvs, 1);
                    self.deliver(Incoming::Message { buf, len });
                } else {
                    if !flushed {
                        // Too long for the buffer: RC breaks the pair.
                        self.qp_failed(live, wc.qp_num);
                    }
                    self.pool_put(live, staging);
                    live.pending_msgs.push_back(buf);
                }
            }
            Some((WrTag::UdRecv, slot)) => {
                let slot = slot as usize;
                let n = wc.len();
                if ok && (GRH_LEN..=UD_SLOT).contains(&n) {
                    let mut bytes = [0u8; UD_SLOT];
                    let body = &mut bytes[..n - GRH_LEN];
                    if live.ud_buf.read(slot * UD_SLOT + GRH_LEN, body) {
                        let (mut out, mut ev) = (Vec::new(), Vec::new());
                        // A malformed handshake is dropped: it came from
                        // the network, and its sender retries or times out.
                        let _ = live.conn.on_message(
                            &mut live.dev,
                            body,
                            &mut live.rng,
                            &mut out,
                            &mut ev,
                        );
                        self.after_connector(live, out, ev);
                    }
                }
                if let Some(sge) = live.ud_buf.sge(slot * UD_SLOT, UD_SLOT) {
                    let _ = live.ud.post_recv(WrTag::UdRecv.id(slot as u64), sge);
                }
            }
            Some((WrTag::UdSend, slot)) => {
                live.ud_send_free.push(slot as usize);
                if !ok && !flushed {
                    // The UD queue pair is in SQE now; the handshake's
                    // retry resends once it is back.
                    let _ = super::bringup::recover_ud(&mut live.dev, &mut live.ud);
                }
            }
            None => {}
        }
    }

    fn on_op_wc(&self, live: &mut Live, qpn: u32, wr_id: u64, status: u32, vendor: u32) {
        let Some(&(loc, which)) = live.by_qpn.get(&qpn) else {
            return;
        };
        let peer = match loc {
            Loc::Live(a) => live.peers.get_mut(&a),
            Loc::Retiring(k) => live.retiring.get_mut(&k),
        };
        let Some(peer) = peer else {
            return;
        };
        let side = peer.side(which);
        let was_failed = side.failed();
        let mut settled = Vec::new();
        if side
            .complete(wr_id, status, vendor, &mut settled, &mut live.budget)
            .is_err()
        {
            // A flush of an unsignalled request of a settled chain.
            return;
        }
        let now_failed = side.failed() && !was_failed;
        for (id, r) in settled {
            self.finish(live, id, r);
        }
        if let (true, Loc::Live(a)) = (now_failed, loc) {
            self.retire(live, &a, true);
        }
    }

    /// A receive failed on a queue pair (it is in the error state now).
    fn qp_failed(&self, live: &mut Live, qpn: u32) {
        if let Some(&(Loc::Live(a), _)) = live.by_qpn.get(&qpn) {
            self.retire(live, &a, true);
        }
    }

    /// Takes a peer's connection out of use: operations not yet posted
    /// wait for a new one, which starts at once if any wait.
    fn retire(&self, live: &mut Live, addr: &NetAddr, forget: bool) {
        let Some(mut peer) = live.peers.remove(addr) else {
            return;
        };
        if forget {
            live.conn.forget(addr);
        }
        let mut moved = VecDeque::new();
        for w in [Which::Msg, Which::Rdma] {
            moved.extend(
                peer.side(w)
                    .take_backlog()
                    .into_iter()
                    .map(|(i, o)| (i, o, w)),
            );
        }
        let key = peer.msg_qpn;
        live.by_qpn
            .insert(peer.msg_qpn, (Loc::Retiring(key), Which::Msg));
        live.by_qpn
            .insert(peer.rdma_qpn, (Loc::Retiring(key), Which::Rdma));
        live.retiring.insert(key, peer);
        if !moved.is_empty() {
            let w = live.waiting.entry(*addr).or_default();
            // Older than anything that queued since.
            for e in moved.into_iter().rev() {
                w.push_front(e);
            }
            if forget {
                self.start_connect(live, addr);
            }
        }
    }

    /// Releases retired connections whose completions are all in.
    fn sweep_retiring(&self, live: &mut Live) {
        let done: Vec<u32> = live
            .retiring
            .iter()
            .filter(|(_, p)| p.msg.drained() && p.rdma.drained())
            .map(|(k, _)| *k)
            .collect();
        for k in done {
            if let Some(p) = live.retiring.remove(&k) {
                live.by_qpn.remove(&p.msg_qpn);
                live.by_qpn.remove(&p.rdma_qpn);
            }
        }
    }

    fn start_connect(&self, live: &mut Live, peer: &NetAddr) {
        let mut out = Vec::new();
        let r = live
            .conn
            .connect(&mut live.dev, peer, Instant::now(), &mut live.rng, &mut out);
        for o in &out {
            self.ud_send(live, o);
        }
        if let Err(e) = r {
            self.fail_waiting(live, peer, &e);
        }
    }

    fn connect_error(peer: &NetAddr, e: &ConnectError) -> TransferError {
        match e {
            ConnectError::Address(error) => malformed(*error),
            ConnectError::Device(super::bringup::BringUpError::Device { call, errno, .. }) => {
                TransferError::Verbs {
                    call,
                    errno: *errno,
                }
            }
            // No answer: the peer is not (or no longer) there.
            _ => TransferError::UnknownPeer { peer: *peer },
        }
    }

    fn fail_waiting(&self, live: &mut Live, peer: &NetAddr, e: &ConnectError) {
        let err = Inner::connect_error(peer, e);
        if let Some(w) = live.waiting.remove(peer) {
            for (id, _, _) in w {
                self.fail_op(live, id, err.clone());
            }
        }
    }

    fn after_connector(&self, live: &mut Live, out: Vec<Outgoing>, ev: Vec<Event<Qp>>) {
        for o in &out {
            self.ud_send(live, o);
        }
        for e in ev {
            match e {
                Event::Connected { peer, qps } => {
                    // A peer starting over replaces the pair we had.
                    self.retire(live, &peer, false);
                    let depth = self.cfg.send_depth as usize;
                    let mut p = Peer {
                        msg_qpn: qps.msg.qpn,
                        rdma_qpn: qps.rdma.qpn,
                        msg: SendSide::new(qps.msg.qp, depth),
                        rdma: SendSide::new(qps.rdma.qp, depth),
                    };
                    live.by_qpn.insert(p.msg_qpn, (Loc::Live(peer), Which::Msg));
                    live.by_qpn
                        .insert(p.rdma_qpn, (Loc::Live(peer), Which::Rdma));
                    for (id, op, w) in live.waiting.remove(&peer).unwrap_or_default() {
                        p.side(w).push(id, op);
                    }
                    live.peers.insert(peer, p);
                }
                Event::Failed { peer, why } => self.fail_waiting(live, &peer, &why),
            }
        }
    }

    fn ud_send(&self, live: &mut Live, o: &Outgoing) {
        let Some(slot) = live.ud_send_free.pop() else {
            // All slots busy: the handshake's retry sends it again.
            return;
        };
        let off = (UD_RECVS + slot) * UD_SLOT;
        let sge = match live.ud_buf.sge(off, ENCODED_LEN) {
            Some(s) if live.ud_buf.write(off, &o.bytes) => s,
            _ => {
                live.ud_send_free.push(slot);
                return;
            }
        };
        if !live.ahs.contains_key(&o.to) {
            match Ah::new(
                &live.dev.pd,
                o.to.gid,
                o.to.lid,
                self.cfg.port,
                self.cfg.gid_index,
            ) {
                Ok(ah) => {
                    live.ahs.insert(o.to, ah);
                }
                Err(_) => {
                    live.ud_send_free.push(slot);
                    return;
                }
            }
        }
        let posted = match live.ahs.get(&o.to) {
            Some(ah) => live
                .ud
                .post_ud_send(
                    ah,
                    o.to.ud_qpn,
                    o.to.qkey,
                    sge,
                    WrTag::UdSend.id(slot as u64),
                )
                .is_ok(),
            None => false,
        };
        if !posted {
            live.ud_send_free.push(slot);
        }
    }

    /// Posts what the peers' backlogs hold, as far as room allows.
    fn pump_all(&self, live: &mut Live) {
        let mut not_posted = Vec::new();
        {
            let Live {
                peers,
                templates,
                chain,
                budget,
                ops,
                ..
            } = live;
            let mut keep =
                |id: u64| WrTag::split(id).is_some_and(|(_, seq)| ops.contains_key(&seq));
            for p in peers.values_mut() {
                for side in [&mut p.msg, &mut p.rdma] {
                    side.pump(templates, chain, budget, &mut keep, &mut not_posted);
                }
            }
        }
        for (id, why) in not_posted {
            match why {
                NotPosted::Skipped => {
                    if let Some((_, seq)) = WrTag::split(id) {
                        if let Some(res) = live.abandoned.remove(&seq) {
                            self.release(live, res);
                        }
                    }
                }
                NotPosted::Refused(e) => self.fail_op(live, id, e.into()),
            }
        }
    }

    /// Completes an operation that never reached the NIC (or whose
    /// outcome the NIC will not report).
    fn fail_op(&self, live: &mut Live, id: u64, err: TransferError) {
        let Some((_, seq)) = WrTag::split(id) else {
            return;
        };
        if let Some(rec) = live.ops.remove(&seq) {
            Counters::bump(&self.counters.errors, 1);
            rec.sink.push(Completion {
                wr_id: rec.wr_id,
                result: Err(err),
            });
            self.release(live, rec.res);
        } else if let Some(res) = live.abandoned.remove(&seq) {
            self.release(live, res);
        }
    }

    /// Completes an operation the NIC settled.
    fn finish(&self, live: &mut Live, id: u64, r: Result<(), WrError>) {
        let Some((_, seq)) = WrTag::split(id) else {
            return;
        };
        let Some(rec) = live.ops.remove(&seq) else {
            // Timed out or flushed earlier: only the buffers are left.
            if let Some(res) = live.abandoned.remove(&seq) {
                self.release(live, res);
            }
            return;
        };
        let result = match r {
            Ok(()) => Ok(rec
                .res
                .atomic
                .and_then(|slot| self.atomic_value(live, slot))
                .unwrap_or(0)),
            Err(e) => {
                Counters::bump(&self.counters.errors, 1);
                Err(match e {
                    WrError::Status { status, .. }
                        if rec.op == OpKind::Send
                            && status == ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR =>
                    {
                        TransferError::NoReceiveBuffer {
                            peer: rec.peer,
                            waited: rec.since.elapsed(),
                        }
                    }
                    e => transfer_error(rec.op, rec.peer, &e),
                })
            }
        };
        rec.sink.push(Completion {
            wr_id: rec.wr_id,
            result,
        });
        self.release(live, rec.res);
    }

    fn release(&self, live: &mut Live, res: Resources) {
        if let Some(slot) = res.atomic {
            live.atomic_free.push(slot);
        }
        if let Some(buf) = res.buf {
            self.pool_put(live, buf);
        }
    }

    /// Fails operations older than the timeout; buffers the NIC may still
    /// use stay until it reports them.
    fn expire(&self, live: &mut Live, now: Instant) {
        let limit = self.cfg.op_timeout;
        while let Some((&seq, rec)) = live.ops.first_key_value() {
            if now.duration_since(rec.since) < limit {
                break;
            }
            let Some(rec) = live.ops.remove(&seq) else {
                break;
            };
            Counters::bump(&self.counters.errors, 1);
            rec.sink.push(Completion {
                wr_id: rec.wr_id,
                result: Err(TransferError::Timeout {
                    op: rec.op,
                    peer: rec.peer,
                    waited: limit,
                }),
            });
            live.abandoned.insert(seq, rec.res);
        }
    }

    /// The old value an atomic left in its result slot, in host order.
    fn atomic_value(&self, live: &Live, slot: usize) -> Option<u64> {
        let raw = live
            .atomics
            .get(slot / ATOMIC_SLAB)?
            .load_u64((slot % ATOMIC_SLAB) * 8)?;
        Some(self.atomics.reply.to_host(raw))
    }

    fn atomic_slot(&self, live: &mut Live) -> Result<(usize, Sge), TransferError> {
        if live.atomic_free.is_empty() {
            let slab = DmaBuf::new(&live.dev.pd, ATOMIC_SLAB * 8)?;
            let base = live.atomics.len() * ATOMIC_SLAB;
            live.atomics.push(slab);
            live.atomic_free.extend((base..base + ATOMIC_SLAB).rev());
        }
        let slot = live.atomic_free.pop().ok_or(TransferError::Verbs {
            call: "ibv_reg_mr",
            errno: libc::ENOMEM,
        })?;
        let sge = live
            .atomics
            .get(slot / ATOMIC_SLAB)
            .and_then(|b| b.sge((slot % ATOMIC_SLAB) * 8, 8));
        match sge {
            Some(s) => Ok((slot, s)),
            None => {
                live.atomic_free.push(slot);
                Err(TransferError::Verbs {
                    call: "ibv_reg_mr",
                    errno: libc::EINVAL,
                })
            }
        }
    }

    fn pool_take(&self, live: &mut Live, len: usize) -> Result<DmaBuf, TransferError> {
        let class = size_class(len);
        if let Some(b) = live.pool.get_mut(&class).and_then(Vec::pop) {
            return Ok(b);
        }
        Ok(DmaBuf::new(&live.dev.pd, class)?)
    }

    fn pool_put(&self, live: &mut Live, buf: DmaBuf) {
        let v = live.pool.entry(buf.len()).or_default();
        if v.len() < POOL_KEEP {
            v.push(buf);
        }
    }

    /// Posts one message buffer on the message receive queue.
    fn post_msg(&self, live: &mut Live, buf: RecvBuffer) {
        let len = buf.data.len().min(MAX_MESSAGE as usize);
        let Ok(staging) = self.pool_take(live, len) else {
            // Without a staging buffer it cannot be posted; dropping it
            // shrinks the pool, which senders see as no buffer.
            return;
        };
        let slot = live.next_msg;
        live.next_msg += 1;
        let posted = staging
            .sge(0, len)
            .is_some_and(|sge| live.dev.msg_srq.post_recv(WrTag::Msg.id(slot), sge).is_ok());
        if posted {
            live.msgs.insert(slot, MsgSlot { buf, staging });
        } else {
            self.pool_put(live, staging);
        }
    }

    /// The local buffer of a read or write.
    fn local_sge(&self, local: &Local, len: u32) -> Result<(Sge, Arc<Region>), TransferError> {
        if !local.region.alive() {
            return Err(TransferError::RegionDeregistered);
        }
        local.region.check(local.offset, u64::from(len))?;
        let lkey = *lock(&self.local)
            .get(&(Arc::as_ptr(&local.region) as usize))
            .ok_or(TransferError::LocalNotRegistered)?;
        Ok((
            Sge {
                addr: local.region.addr() + local.offset,
                len,
                lkey,
            },
            local.region.clone(),
        ))
    }

    /// The queue pair, request and held resources of one operation, or
    /// why it cannot be posted.
    fn build(
        &self,
        live: &mut Live,
        op: WorkOp,
    ) -> Result<(Which, ChainOp, Resources), TransferError> {
        match op {
            WorkOp::Read { local, remote, len } => {
                // Refused here, not when its chain is built, so it fails
                // alone.
                if len == 0 {
                    return Err(TransferError::ZeroLength { op: OpKind::Read });
                }
                let n = msg_len(OpKind::Read, len)?;
                let rkey = rkey32(&remote)?;
                let (sge, region) = self.local_sge(&local, n)?;
                Ok((
                    Which::Rdma,
                    ChainOp::Read {
                        local: sge,
                        remote_addr: remote.addr,
                        rkey,
                    },
                    Resources {
                        region: Some(region),
                        ..Resources::default()
                    },
                ))
            }
            WorkOp::Write {
                local,
                remote,
                len,
                imm,
            } => {
                let rkey = rkey32(&remote)?;
                let (sge, region) = match &local {
                    Some(l) if len > 0 => {
                        let n = msg_len(OpKind::Write, len)?;
                        let (s, r) = self.local_sge(l, n)?;
                        (s, Some(r))
                    }
                    _ => (
                        Sge {
                            addr: 0,
                            len: 0,
                            lkey: 0,
                        },
                        None,
                    ),
                };
                Ok((
                    Which::Rdma,
                    ChainOp::Write {
                        local: sge,
                        remote_addr: remote.addr,
                        rkey,
                        imm,
                    },
                    Resources {
                        region,
                        ..Resources::default()
                    },
                ))
            }
            WorkOp::Cas {
                remote,
                expected,
                new,
            } => {
                let rkey = self.atomic_target(&remote)?;
                let (slot, result) = self.atomic_slot(live)?;
                Ok((
                    Which::Rdma,
                    ChainOp::Cas {
                        result,
                        remote_addr: remote.addr,
                        rkey,
                        expected,
                        new,
                    },
                    Resources {
                        atomic: Some(slot),
                        ..Resources::default()
                    },
                ))
            }
            WorkOp::Faa { remote, add } => {
                let rkey = self.atomic_target(&remote)?;
                let (slot, result) = self.atomic_slot(live)?;
                Ok((
                    Which::Rdma,
                    ChainOp::Faa {
                        result,
                        remote_addr: remote.addr,
                        rkey,
                        add,
                    },
                    Resources {
                        atomic: Some(slot),
                        ..Resources::default()
                    },
                ))
            }
            WorkOp::Send { data, .. } => {
                if data.is_empty() {
                    return Err(TransferError::ZeroLength { op: OpKind::Send });
                }
                let n = msg_len(OpKind::Send, data.len() as u64)?;
                if n <= self.cfg.max_inline {
                    // Inline: the NIC copies the bytes at post time; the
                    // vector's heap buffer does not move with it.
                    let sge = Sge {
                        addr: data.as_ptr() as u64,
                        len: n,
                        lkey: 0,
                    };
                    return Ok((
                        Which::Msg,
                        ChainOp::Send { local: sge },
                        Resources {
                            _inline: Some(data),
                            ..Resources::default()
                        },
                    ));
                }
                let buf = self.pool_take(live, data.len())?;
                let sge = match buf.sge(0, data.len()) {
                    Some(s) if buf.write(0, &data) => s,
                    _ => {
                        self.pool_put(live, buf);
                        return Err(TransferError::Verbs {
                            call: "ibv_post_send",
                            errno: libc::EINVAL,
                        });
                    }
                };
                Ok((
                    Which::Msg,
                    ChainOp::Send { local: sge },
                    Resources {
                        buf: Some(buf),
                        ..Resources::default()
                    },
                ))
            }
        }
    }

    fn atomic_target(&self, remote: &Remote) -> Result<u32, TransferError> {
        if remote.addr % 8 != 0 {
            return Err(TransferError::Protection {
                peer: remote.peer,
                rkey: remote.rkey,
                check: ProtectionCheck::Misaligned { addr: remote.addr },
            });
        }
        rkey32(remote)
    }

    /// Posts `batch` for the endpoint whose completions go to `sink`.
    pub(super) fn post(&self, sink: &Arc<Sink>, batch: &mut Vec<WorkRequest>) {
        if batch.is_empty() {
            return;
        }
        let mut g = lock(&self.live);
        let Some(live) = g.as_mut() else {
            for wr in batch.drain(..) {
                Counters::bump(&self.counters.errors, 1);
                sink.queue.push(Completion {
                    wr_id: wr.wr_id,
                    result: Err(TransferError::EngineShutDown),
                });
            }
            return;
        };
        Counters::bump(&self.counters.doorbells, 1);
        let now = Instant::now();
        for WorkRequest { wr_id, op } in batch.drain(..) {
            self.counters.count_posted(&op);
            let (kind, peer) = (op_kind(&op), *op.peer());
            let (which, chain_op, res) = match self.build(live, op) {
                Ok(x) => x,
                Err(e) => {
                    Counters::bump(&self.counters.errors, 1);
                    sink.queue.push(Completion {
                        wr_id,
                        result: Err(e),
                    });
                    continue;
                }
            };
            let seq = live.next_seq;
            live.next_seq += 1;
            sink.outstanding.fetch_add(1, SeqCst);
            live.ops.insert(
                seq,
                OpRecord {
                    wr_id,
                    sink: sink.clone(),
                    op: kind,
                    peer,
                    since: now,
                    res,
                },
            );
            let id = WrTag::Op.id(seq);
            if let Some(p) = live.peers.get_mut(&peer) {
                p.side(which).push(id, chain_op);
            } else {
                live.waiting
                    .entry(peer)
                    .or_default()
                    .push_back((id, chain_op, which));
                if live.conn.state(&peer) == PeerState::Unknown {
                    self.start_connect(live, &peer);
                }
            }
        }
        self.pump_all(live);
        live.last_activity = now;
    }

    /// Fails everything `sink` has outstanding with
    /// [`TransferError::EngineShutDown`].
    pub(super) fn flush(&self, sink: &Arc<Sink>, out: &mut Vec<Completion>) {
        let mut g = lock(&self.live);
        if let Some(live) = g.as_mut() {
            let mine: Vec<u64> = live
                .ops
                .iter()
                .filter(|(_, r)| Arc::ptr_eq(&r.sink, sink))
                .map(|(s, _)| *s)
                .collect();
            for seq in mine {
                if let Some(rec) = live.ops.remove(&seq) {
                    out.push(Completion {
                        wr_id: rec.wr_id,
                        result: Err(TransferError::EngineShutDown),
                    });
                    sink.outstanding.fetch_sub(1, SeqCst);
                    // The NIC may still use its buffers: keep them.
                    live.abandoned.insert(seq, rec.res);
                }
            }
        }
        drop(g);
        while let Some(c) = sink.queue.pop() {
            out.push(c);
        }
    }

    fn shutdown(&self) {
        if !self.alive.swap(false, SeqCst) {
            return;
        }
        let deadline = Instant::now() + DRAIN.min(self.cfg.op_timeout);
        loop {
            {
                let mut g = lock(&self.live);
                let Some(live) = g.as_mut() else { break };
                self.progress(live);
                if live.ops.is_empty() || Instant::now() >= deadline {
                    break;
                }
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        // Queue pairs first, then queues and buffers (Live's field order);
        // what had not completed is failed as shut down.
        let live = lock(&self.live).take();
        drop(live);
        lock(&self.local).clear();
        lock(&self.mrs).clear();
        while self.incoming.pop().is_some() {}
    }
}

impl Domain for VerbsDomain {
    fn address(&self) -> NetAddr {
        self.inner.addr
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn register(&self, region: &Arc<Region>) -> Result<u64, TransferError> {
        let inner = &self.inner;
        if !inner.alive.load(SeqCst) {
            return Err(TransferError::EngineShutDown);
        }
        let (r, still) = with_relaxed_fallback(inner.relaxed.load(SeqCst), |relaxed| {
            RegionMr::new(&inner.pd, region, region_access(region.access(), relaxed))
        });
        if !still {
            inner.relaxed.store(false, SeqCst);
        }
        let mr = r?;
        let (rkey, lkey) = (u64::from(mr.rkey()), mr.lkey());
        let at = Arc::as_ptr(region) as usize;
        lock(&inner.local).insert(at, lkey);
        lock(&inner.mrs).insert(rkey, (mr, at));
        Ok(rkey)
    }

    /// Refuses new operations on the region, waits (driving progress, at
    /// most [`VerbsConfig::op_timeout`]) until none in flight uses it,
    /// then invalidates its keys ([`super::dereg`]).
    fn deregister(&self, rkey: u64) {
        let Some(at) = lock(&self.inner.mrs).get(&rkey).map(|(_, at)| *at) else {
            return;
        };
        let mut drain = RegionDrain {
            inner: &self.inner,
            rkey,
            at,
        };
        let deadline = Instant::now() + self.inner.cfg.op_timeout;
        if let super::dereg::Drained::Forced { .. } =
            super::dereg::deregister(&mut drain, deadline, std::thread::sleep)
        {
            Counters::bump(&self.inner.counters.errors, 1);
        }
    }

    fn resolve(&self, peer: &NetAddr) -> Result<(), TransferError> {
        let inner = &self.inner;
        VerbsAddr::from_net(peer).map_err(malformed)?;
        let deadline = Instant::now() + inner.cfg.handshake_timeout + inner.cfg.handshake_retry;
        let mut started = false;
        loop {
            {
                let mut g = lock(&inner.live);
                let live = g.as_mut().ok_or(TransferError::EngineShutDown)?;
                inner.progress(live);
                match live.conn.state(peer) {
                    PeerState::Connected => return Ok(()),
                    PeerState::Connecting => {}
                    // Gone after we started it: the attempt failed.
                    PeerState::Unknown if started => {
                        return Err(TransferError::UnknownPeer { peer: *peer })
                    }
                    PeerState::Unknown => {
                        let mut out = Vec::new();
                        let r = live.conn.connect(
                            &mut live.dev,
                            peer,
                            Instant::now(),
                            &mut live.rng,
                            &mut out,
                        );
                        for o in &out {
                            inner.ud_send(live, o);
                        }
                        r.map_err(|e| Inner::connect_error(peer, &e))?;
                        started = true;
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(TransferError::UnknownPeer { peer: *peer });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    fn open_endpoint(&self) -> Result<AnyEndpoint, TransferError> {
        if !self.inner.alive.load(SeqCst) {
            return Err(TransferError::EngineShutDown);
        }
        Ok(AnyEndpoint::Verbs(VerbsEndpoint::new(self.inner.clone())))
    }

    fn post_recv(&self, buf: RecvBuffer) {
        let inner = &self.inner;
        let mut g = lock(&inner.live);
        let Some(live) = g.as_mut() else {
            return;
        };
        if live.msgs.len() < inner.cfg.srq_depth as usize && live.pending_msgs.is_empty() {
            inner.post_msg(live, buf);
        } else {
            live.pending_msgs.push_back(buf);
        }
    }

    fn poll_incoming(&self, out: &mut Vec<Incoming>) -> usize {
        // Reading the queue here keeps arrivals and handshakes flowing
        // when no endpoint is polled; never wait for the lock.
        if let Ok(mut g) = self.inner.live.try_lock() {
            if let Some(live) = g.as_mut() {
                self.inner.progress(live);
            }
        }
        crate::domain::drain_incoming(&self.inner.incoming, out)
    }

    fn set_waker(&self, waker: Thread) {
        let _ = self.inner.waker.set(waker.clone());
        waker.unpark();
    }

    fn ordered(&self) -> bool {
        // RC: one queue pair executes its requests in order, and every
        // one-sided operation to a peer goes through one queue pair — but
        // with relaxed ordering asked for, the placement of a write's data
        // in host memory may be overtaken by a later operation's, so only
        // a domain configured without it claims order. (Fixed at open, not
        // by the device's answer: a peer's registrations count too.)
        !self.inner.cfg.relaxed_ordering
    }

    fn counters(&self) -> CounterSnapshot {
        self.inner.counters.snapshot()
    }

    fn set_failed(&self, _failed: bool) -> bool {
        // A real NIC cannot be made to fail its peers' operations.
        false
    }

    fn shutdown(&self) {
        self.inner.shutdown();
    }

    fn atomic_profile(&self) -> AtomicProfile {
        self.inner.atomics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_holds_the_region_it_uses_only() {
        let a = Region::alloc(64, Access::all(), 1, 0).unwrap();
        let b = Region::alloc(64, Access::all(), 1, 0).unwrap();
        let at = |r: &Arc<Region>| Arc::as_ptr(r) as usize;
        let res = Resources {
            region: Some(a.clone()),
            ..Resources::default()
        };
        assert!(res.holds(at(&a)) && !res.holds(at(&b)));
        // Atomics and sends hold no registered region.
        assert!(!Resources::default().holds(at(&a)));
    }

    #[test]
    fn relaxed_ordering_falls_back_once_refused() {
        let refuse = |relaxed: bool| {
            if relaxed {
                Err(VerbsError {
                    call: "ibv_reg_mr",
                    errno: libc::EINVAL,
                })
            } else {
                Ok(7)
            }
        };
        assert_eq!(with_relaxed_fallback(true, refuse), (Ok(7), false));
        assert_eq!(with_relaxed_fallback(false, refuse), (Ok(7), false));
        let mut asked = Vec::new();
        let r = with_relaxed_fallback(true, |relaxed| {
            asked.push(relaxed);
            Ok::<_, VerbsError>(1)
        });
        assert_eq!((r, asked), ((Ok(1), true), vec![true]));
        // Refused either way: the first error, and relaxed stays wanted.
        let r: (Result<(), VerbsError>, bool) = with_relaxed_fallback(true, |relaxed| {
            Err(VerbsError {
                call: "ibv_reg_mr",
                errno: if relaxed { 1 } else { 2 },
            })
        });
        assert_eq!(r.0.unwrap_err().errno, 1);
        assert!(r.1);
    }

    #[test]
    fn region_rights_become_nic_access() {
        let a = region_access(Access::REMOTE_READ, true);
        assert!(a.local_write && a.remote_read && a.relaxed_ordering);
        assert!(!a.remote_write && !a.remote_atomic);
        let a = region_access(Access::all(), false);
        assert!(a.remote_write && a.remote_atomic && !a.relaxed_ordering);
        assert_eq!(
            region_access(Access::all(), true),
            AccessFlags::REGISTRATION
        );
    }

    #[test]
    fn lengths_keys_and_kinds_are_checked_before_posting() {
        assert_eq!(msg_len(OpKind::Read, 4096), Ok(4096));
        assert_eq!(msg_len(OpKind::Read, MAX_MESSAGE), Ok(1 << 31));
        assert!(matches!(
            msg_len(OpKind::Write, MAX_MESSAGE + 1),
            Err(TransferError::TooLarge {
                max: MAX_MESSAGE,
                ..
            })
        ));
        let peer = NetAddr::new(b"p").unwrap();
        let r = Remote {
            peer,
            rkey: 0x1234,
            addr: 0,
        };
        assert_eq!(rkey32(&r), Ok(0x1234));
        assert!(matches!(
            rkey32(&Remote { rkey: 1 << 32, ..r }),
            Err(TransferError::Protection {
                check: ProtectionCheck::UnknownKey,
                ..
            })
        ));
        assert_eq!(op_kind(&WorkOp::Faa { remote: r, add: 1 }), OpKind::Faa);
        assert_eq!(size_class(1), 64);
        assert_eq!(size_class(65), 128);
        assert_eq!(size_class(4096), 4096);
    }

    #[test]
    fn opening_without_a_device_names_the_call() {
        let cfg = VerbsConfig {
            device: Some("rolex-no-such-device".into()),
            ..VerbsConfig::default()
        };
        match VerbsDomain::open(&cfg) {
            Err(TransferError::Verbs { call, .. }) => assert!(call.starts_with("ibv_"), "{call}"),
            other => panic!("expected a verbs error, got {other:?}"),
        }
        match open_host(&cfg, 2) {
            Err(e @ TransferError::Verbs { .. }) => {
                assert!(e.to_string().contains("libibverbs call ibv_"), "{e}")
            }
            other => panic!("expected a verbs error, got {other:?}"),
        }
    }

    #[test]
    fn an_engine_on_a_missing_device_fails_naming_the_call() {
        use crate::engine::{EngineConfig, Fabric, TransferEngine};
        let cfg = VerbsConfig {
            device: Some("rolex-no-such-device".into()),
            ..VerbsConfig::default()
        };
        let fabric = Fabric::Verbs(cfg);
        assert_eq!(fabric.name(), "verbs");
        match TransferEngine::new(EngineConfig {
            fabric,
            ..EngineConfig::default()
        }) {
            Err(TransferError::Verbs { call, .. }) => assert!(call.starts_with("ibv_"), "{call}"),
            other => panic!("expected a verbs error, got {other:?}"),
        }
        // Bad options are refused before any device is touched.
        let bad = VerbsConfig {
            port: 0,
            ..VerbsConfig::default()
        };
        assert!(matches!(
            VerbsDomain::open(&bad),
            Err(TransferError::Config(crate::error::ConfigError::Verbs(_)))
        ));
    }
}
