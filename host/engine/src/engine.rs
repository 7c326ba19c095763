//! [`TransferEngine`]: the public API of the transfer engine (design §4),
//! the seed's calls plus one-sided reads and 8-byte atomics.
//!
//! Calls validate the caller's own arguments (lengths, local ranges, page
//! lists, handles) and return those errors at once; when a call returns an
//! error its `on_done` is dropped without being called. Everything about
//! the remote side — the peer's descriptor (checked here before posting,
//! because software providers do not enforce protection, §7), the peer
//! itself, the NIC's protection checks — is reported through the
//! operation's completion, exactly once, as a NIC would.
//!
//! Multi-NIC: a single write of at least [`SPLIT_MIN`] bytes is split into
//! [`single_write_pieces`] pieces, one per NIC of the *receiver* at most
//! (piece `i` to the peer's NIC `i`), which the sender's NICs take in turn
//! (piece `i` on local NIC `(s + i) mod k`, `s` moving from call to call);
//! smaller writes, reads, atomics and sends take the NICs in turn; paged
//! writes send page `i`, scatters and barriers destination `i`, through
//! NIC `(s + i) mod k` (so a call of one page or destination does not
//! always take NIC 0). Every piece that carries an immediate counts one arrival at
//! the receiver, so a receiver expects `single_write_pieces(len,
//! receiver_nics)` arrivals for a single write — what it knows itself,
//! whatever the sender's NIC count —, the number of pages for paged
//! writes, the number of destinations aimed at it for a scatter, and 1 for
//! a barrier.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rolex_core::wire::{Access, MrDesc, NetAddr, Pages, ScatterDst, Wire};

use crate::atomics::{AtomicProfile, AtomicRoute, SharedWords};
use crate::batch::Channel;
use crate::callback::{CallbackThread, Notify, OnDone, OnValue};
use crate::counters::{Counters, DomainCounters, EngineCounters};
use crate::domain::loopback::{self, LoopbackConfig};
use crate::domain::{AnyDomain, Domain, Local, RecvBuffer, Remote, WorkOp};
use crate::error::{ConfigError, OpKind, TransferError};
use crate::group::{arrive, Worker, WorkerConfig};
use crate::plug::Plug;
use crate::region::{MrHandle, Region};
use crate::shared::{receiver, remote, EngineShared, GroupShared, Registered, Request};
use crate::watcher::{Watcher, WatcherSet};

/// Smallest piece a single write is split into across NICs.
pub const SPLIT_MIN: u64 = 64 * 1024;

/// How many pieces (and immediate arrivals) a single write of `len` bytes
/// becomes at a receiver with `dst_nics` NICs (the NICs its descriptor
/// names): `clamp(len / SPLIT_MIN, 1, dst_nics)`. It does not depend on
/// the sender: a sender with fewer NICs posts several pieces on one NIC.
pub fn single_write_pieces(len: u64, dst_nics: usize) -> u32 {
    let nics = dst_nics.max(1) as u64;
    (len / SPLIT_MIN).clamp(1, nics) as u32
}

/// Decodes an [`MrDesc`] received from a peer.
pub fn mr_desc_from_bytes(bytes: &[u8]) -> Result<MrDesc, TransferError> {
    MrDesc::decode(bytes).map_err(|error| TransferError::Malformed {
        what: "MrDesc",
        error,
    })
}

/// Decodes a [`NetAddr`] received from a peer.
pub fn net_addr_from_bytes(bytes: &[u8]) -> Result<NetAddr, TransferError> {
    NetAddr::decode(bytes).map_err(|error| TransferError::Malformed {
        what: "NetAddr",
        error,
    })
}

/// Which NIC backend an engine uses.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq)]
pub enum Fabric {
    /// The in-process loopback NIC.
    Loopback(LoopbackConfig),
    /// A libfabric provider (design §7).
    #[cfg(feature = "libfabric")]
    Libfabric(crate::domain::fabric::LibfabricConfig),
    /// An ibverbs device over RC (ConnectX; design §3, §7).
    #[cfg(feature = "verbs")]
    Verbs(crate::domain::verbs::VerbsConfig),
}

impl Fabric {
    /// The backend's name, as `te-bench --fabric` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Fabric::Loopback(_) => "loopback",
            #[cfg(feature = "libfabric")]
            Fabric::Libfabric(_) => "libfabric",
            #[cfg(feature = "verbs")]
            Fabric::Verbs(_) => "verbs",
        }
    }
}

/// How to build an engine.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Domain groups (one worker thread each); group 0 also serves the host.
    pub groups: usize,
    /// NICs per group, 1 to 4 (the same on every peer).
    pub nics_per_group: usize,
    /// The backend.
    pub fabric: Fabric,
    /// Longest single operation, in bytes.
    pub max_transfer: u64,
    /// Pin workers to CPUs when the machine allows.
    pub pin_workers: bool,
    /// Abort notices ([`crate::imm_wait`]): when a transfer carrying an
    /// immediate fails part-way, tell each receiver one of its failed
    /// pieces was aimed at (once, whatever its NICs) with a zero-length write
    /// carrying the immediate with [`ABORT_BIT`](crate::imm_wait::ABORT_BIT)
    /// set, which fails the receiver's expectation on it with
    /// [`TransferError::SenderAborted`]. Applications then use immediates
    /// below the bit (others are refused with
    /// [`TransferError::ImmReserved`]). Set it the same on every peer.
    pub abort_notices: bool,
    /// How long a thread waiting on a [`CompletionFlag`](crate::CompletionFlag)
    /// (or a [`Channel`] waiting for its batch) polls the completion itself
    /// before it sleeps: a small operation then completes on the waiting
    /// thread, without waking the worker; longer waits cost no CPU.
    pub spin: Duration,
}

/// [`EngineConfig::spin`] by default: a few round trips of a software
/// fabric on this kind of machine.
pub const DEFAULT_SPIN: Duration = Duration::from_micros(100);

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            groups: 1,
            nics_per_group: 1,
            fabric: Fabric::Loopback(LoopbackConfig::default()),
            max_transfer: 1 << 30,
            pin_workers: true,
            abort_notices: false,
            spin: DEFAULT_SPIN,
        }
    }
}

/// A pre-registered set of peers for scatter and barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerGroupHandle(u64);

impl PeerGroupHandle {
    /// The handle's number.
    pub fn get(self) -> u64 {
        self.0
    }
}

/// A transfer engine: one host's NICs, grouped, with their workers, the
/// callback thread and the watcher thread (see the module docs).
///
/// Dropping it fails whatever is in flight with
/// [`TransferError::EngineShutDown`], takes its NICs off the fabric,
/// deregisters its memory and joins its threads.
///
/// Two engines on the in-process loopback fabric; the receiver registers
/// a region and hands its descriptor to the sender, which writes into it
/// with an immediate that the receiver's expectation counts:
///
/// ```
/// use std::time::Duration;
/// use rolex_engine::{Access, CompletionFlag, EngineConfig, OnDone, TransferEngine};
///
/// # fn main() -> Result<(), rolex_engine::TransferError> {
/// let sender = TransferEngine::new(EngineConfig::default())?; // loopback, 1 NIC
/// let receiver = TransferEngine::loopback(1)?;
///
/// // The descriptor is what a peer needs (between processes it travels
/// // over the bootstrap connection).
/// let (dst, dst_desc) = receiver.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)?;
/// let (src, _) = sender.alloc_mr(4096, Access::LOCAL_WRITE)?;
/// src.write(0, b"hello, memory node")?;
///
/// let landed = CompletionFlag::new();
/// receiver.expect_imm_count(7, 1, OnDone::flag(&landed))?;
/// let written = CompletionFlag::new();
/// sender.submit_single_write(18, Some(7), (&src, 0), (&dst_desc, 100), OnDone::flag(&written))?;
///
/// let hang = Duration::from_secs(10);
/// written.wait(hang).expect("write completed")?;
/// landed.wait(hang).expect("immediate counted")?;
/// assert_eq!(dst.to_vec(100, 18)?, b"hello, memory node");
/// # Ok(())
/// # }
/// ```
pub struct TransferEngine {
    shared: Arc<EngineShared>,
    workers: Vec<JoinHandle<()>>,
    callback: CallbackThread,
    watchers: WatcherSet,
}

impl std::fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TransferEngine")
            .field("id", &self.shared.id)
            .field("main_address", &self.main_address())
            .finish()
    }
}

impl TransferEngine {
    /// Starts an engine.
    pub fn new(config: EngineConfig) -> Result<Self, TransferError> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        if config.groups == 0 {
            return Err(TransferError::Config(ConfigError::NoGroups));
        }
        if !(1..=rolex_core::wire::MAX_NICS).contains(&config.nics_per_group) {
            return Err(TransferError::Config(ConfigError::NicsPerGroup(
                config.nics_per_group,
            )));
        }
        let id = IDS.fetch_add(1, Relaxed);
        let all: Vec<AnyDomain> = match &config.fabric {
            Fabric::Loopback(cfg) => {
                loopback::open_host(cfg, config.groups * config.nics_per_group)?
                    .into_iter()
                    .map(AnyDomain::Loopback)
                    .collect()
            }
            #[cfg(feature = "libfabric")]
            Fabric::Libfabric(cfg) => {
                crate::domain::fabric::open_host(cfg, config.groups * config.nics_per_group)?
                    .into_iter()
                    .map(AnyDomain::Libfabric)
                    .collect()
            }
            #[cfg(feature = "verbs")]
            Fabric::Verbs(cfg) => {
                crate::domain::verbs::open_host(cfg, config.groups * config.nics_per_group)?
                    .into_iter()
                    .map(AnyDomain::Verbs)
                    .collect()
            }
        };
        let groups = all
            .chunks(config.nics_per_group)
            .map(|c| GroupShared::new(c.to_vec()))
            .collect();
        let callback = match CallbackThread::spawn(format!("rolex-te{id}-cb")) {
            Ok(c) => c,
            Err(_) => {
                all.iter().for_each(|d| d.shutdown());
                return Err(TransferError::ThreadSpawn { thread: "callback" });
            }
        };
        let mut shared = EngineShared::new(id, groups, callback.queue(), config.max_transfer);
        shared.abort_notices = config.abort_notices;
        let shared = Arc::new(shared);
        // Immediates are counted by whichever thread reads them off a NIC.
        for d in &all {
            let (imms, cbq) = (shared.imm.clone(), shared.cbq.clone());
            let aborts = shared.abort_notices;
            d.set_imm_sink(Arc::new(move |imm| arrive(&imms, &cbq, aborts, imm)));
        }
        let mut engine = TransferEngine {
            shared: shared.clone(),
            workers: Vec::new(),
            callback,
            watchers: WatcherSet::new(id),
        };
        let worker = WorkerConfig {
            pin: config.pin_workers,
            spin: config.spin,
        };
        for g in 0..config.groups {
            // On failure, dropping `engine` stops what was started.
            engine
                .workers
                .push(Worker::spawn(shared.clone(), g, &worker)?);
        }
        Ok(engine)
    }

    /// A loopback engine with default options and `nics` NICs in one group.
    pub fn loopback(nics: usize) -> Result<Self, TransferError> {
        Self::new(EngineConfig {
            nics_per_group: nics,
            ..EngineConfig::default()
        })
    }

    /// The address peers use to reach this engine (group 0, NIC 0).
    pub fn main_address(&self) -> NetAddr {
        self.shared.groups[0].domains[0].address()
    }

    /// The addresses of one group's NICs.
    pub fn addresses(&self, group: usize) -> Result<Vec<NetAddr>, TransferError> {
        Ok(self
            .group(group)?
            .domains
            .iter()
            .map(|d| d.address())
            .collect())
    }

    /// The devices one group's NICs opened (see [`crate::topology`]).
    pub fn devices(&self, group: usize) -> Result<Vec<String>, TransferError> {
        Ok(self
            .group(group)?
            .domains
            .iter()
            .map(|d| d.device_name())
            .collect())
    }

    /// Number of domain groups.
    pub fn groups(&self) -> usize {
        self.shared.groups.len()
    }

    /// NICs per group.
    pub fn nics(&self) -> usize {
        self.shared.groups[0].domains.len()
    }

    /// Whether every NIC keeps posting order (RC-like).
    pub fn ordered(&self) -> bool {
        self.shared
            .groups
            .iter()
            .all(|g| g.domains.iter().all(|d| d.ordered()))
    }

    /// Whether every NIC places the writes of one post call to a peer in
    /// posting order ([`Domain::writes_ordered`]).
    pub fn writes_ordered(&self) -> bool {
        self.shared
            .groups
            .iter()
            .all(|g| g.domains.iter().all(|d| d.writes_ordered()))
    }

    /// Whether every NIC's writes can carry a 32-bit immediate (EFA: 4
    /// bytes of CQ data; a provider with fewer fails such writes with
    /// [`TransferError::NoImmediates`]).
    pub fn immediates(&self) -> bool {
        self.shared
            .groups
            .iter()
            .all(|g| g.domains.iter().all(|d| d.immediates()))
    }

    /// What the first NIC negotiated with libfabric (library and API
    /// versions, provider, ordering, registration mode); `None` on other
    /// backends. Every NIC of an engine opens with the same configuration.
    #[cfg(feature = "libfabric")]
    pub fn libfabric(&self) -> Option<crate::domain::fabric::Negotiated> {
        match &self.shared.groups[0].domains[0] {
            AnyDomain::Libfabric(d) => Some(d.negotiated().clone()),
            _ => None,
        }
    }

    fn group(&self, group: usize) -> Result<&GroupShared, TransferError> {
        self.shared
            .groups
            .get(group)
            .ok_or(TransferError::UnknownGroup { group })
    }

    fn live(&self) -> Result<(), TransferError> {
        if self.shared.shutdown.load(SeqCst) {
            Err(TransferError::EngineShutDown)
        } else {
            Ok(())
        }
    }

    fn register(&self, region: Arc<Region>) -> Result<(MrHandle, MrDesc), TransferError> {
        let group = self.group(region.group())?;
        let mut rkeys = Vec::with_capacity(group.domains.len());
        let mut nics = Vec::with_capacity(group.domains.len());
        for d in &group.domains {
            match d.register(&region) {
                Ok(k) => {
                    rkeys.push(k);
                    nics.push((d.address(), k));
                }
                Err(e) => {
                    for (d, k) in group.domains.iter().zip(&rkeys) {
                        d.deregister(*k);
                    }
                    return Err(e);
                }
            }
        }
        let desc =
            MrDesc::new(region.addr(), region.len(), region.access(), &nics).map_err(|error| {
                TransferError::Malformed {
                    what: "local MrDesc",
                    error,
                }
            })?;
        self.shared
            .regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Registered {
                region: region.clone(),
                rkeys,
            });
        Ok((MrHandle { region }, desc))
    }

    /// Allocates and registers `len` zeroed bytes with group 0's NICs; the
    /// engine owns the memory (freed when the last handle and the last
    /// operation using it are gone). Returns the local handle and the
    /// descriptor to give peers.
    pub fn alloc_mr(&self, len: u64, access: Access) -> Result<(MrHandle, MrDesc), TransferError> {
        self.alloc_mr_in(0, len, access)
    }

    /// [`TransferEngine::alloc_mr`] for a given domain group.
    pub fn alloc_mr_in(
        &self,
        group: usize,
        len: u64,
        access: Access,
    ) -> Result<(MrHandle, MrDesc), TransferError> {
        self.live()?;
        self.group(group)?;
        self.register(Region::alloc(len, access, self.shared.id, group)?)
    }

    /// Registers caller-owned memory with group 0's NICs.
    ///
    /// # Safety
    /// `[ptr, ptr + len)` must be valid for reads and writes and stay
    /// allocated and unmoved until [`TransferEngine::dereg_mr`] returns for
    /// this region or the engine is dropped. Peers and this engine's NICs
    /// read and write it at any time meanwhile (like DMA): the caller must
    /// not keep Rust references to it across such accesses.
    pub unsafe fn reg_mr(
        &self,
        ptr: NonNull<u8>,
        len: u64,
        access: Access,
    ) -> Result<(MrHandle, MrDesc), TransferError> {
        // SAFETY: forwarded contract, see above.
        unsafe { self.reg_mr_in(0, ptr, len, access) }
    }

    /// [`TransferEngine::reg_mr`] for a given domain group.
    ///
    /// # Safety
    /// As for [`TransferEngine::reg_mr`].
    pub unsafe fn reg_mr_in(
        &self,
        group: usize,
        ptr: NonNull<u8>,
        len: u64,
        access: Access,
    ) -> Result<(MrHandle, MrDesc), TransferError> {
        self.live()?;
        self.group(group)?;
        // SAFETY: the caller upholds `Region::external`'s contract, which
        // is this function's.
        let region = unsafe { Region::external(ptr, len, access, self.shared.id, group)? };
        self.register(region)
    }

    /// How this engine's NICs' atomics relate to the host: the reply byte
    /// order of the first and the narrowest scope of all (design §5.8).
    pub fn atomic_profile(&self) -> AtomicProfile {
        AtomicProfile::combine(
            self.shared
                .groups
                .iter()
                .flat_map(|g| g.domains.iter().map(|d| d.atomic_profile())),
        )
    }

    /// The host's own atomics on words of `mr` that peers update through
    /// the NIC: through this engine's NIC where its atomics are atomic only
    /// among NIC operations (ConnectX's `IBV_ATOMIC_HCA`), with CPU
    /// atomics elsewhere (see [`crate::atomics`]). A memory node applies
    /// every atomic on lock, queue and counter words through this.
    pub fn shared_words(&self, mr: &MrHandle) -> Result<SharedWords, TransferError> {
        self.shared_words_via(mr, self.atomic_profile().route())
    }

    /// [`TransferEngine::shared_words`] with the route chosen by the
    /// caller (tests; a device whose detection is known to be wrong).
    pub fn shared_words_via(
        &self,
        mr: &MrHandle,
        route: AtomicRoute,
    ) -> Result<SharedWords, TransferError> {
        self.live()?;
        if mr.region.engine() != self.shared.id {
            return Err(TransferError::ForeignRegion);
        }
        let rkeys = self
            .shared
            .regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|r| Arc::ptr_eq(&r.region, &mr.region))
            .map(|r| r.rkeys.clone())
            .ok_or(TransferError::RegionDeregistered)?;
        let group = self.group(mr.group())?;
        let nics: Vec<(NetAddr, u64)> = group
            .domains
            .iter()
            .map(|d| d.address())
            .zip(rkeys)
            .collect();
        let r = &mr.region;
        let desc = MrDesc::new(r.addr(), r.len(), r.access(), &nics).map_err(|error| {
            TransferError::Malformed {
                what: "local MrDesc",
                error,
            }
        })?;
        Ok(SharedWords::new(
            self.shared.clone(),
            mr.clone(),
            desc,
            route,
        ))
    }

    /// Deregisters a region. When this returns no NIC touches its memory
    /// any more and its keys no longer work.
    ///
    /// What happens to operations using it, in order:
    /// - new operations with it as their local buffer fail
    ///   ([`TransferError::RegionDeregistered`]) from the start of the call;
    /// - operations of this engine already in flight on it complete or
    ///   fail, each exactly once through its `on_done`, and the call waits
    ///   for them: the loopback and libfabric NICs hold the region pinned
    ///   while they copy, the verbs NIC is driven until it reports every
    ///   request that uses it (at most `VerbsConfig::op_timeout`; after
    ///   that the keys are invalidated anyway and what is left fails);
    /// - then its keys are invalidated on every NIC: a peer's operation
    ///   with them racing with this call lands before or fails after, as
    ///   the NIC decides (on the loopback NIC it fails from the start).
    ///
    /// Invalidating a verbs key under a request still queued would fail it
    /// with a local protection error, which breaks the queue pair to its
    /// peer for every other operation: hence the wait.
    pub fn dereg_mr(&self, mr: &MrHandle) -> Result<(), TransferError> {
        if mr.region.engine() != self.shared.id {
            return Err(TransferError::ForeignRegion);
        }
        // The group first: once the entry is out of the list, nothing may
        // fail before its keys are invalidated.
        let group = self.group(mr.region.group())?;
        let entry = {
            let mut regions = self
                .shared
                .regions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let i = regions
                .iter()
                .position(|r| Arc::ptr_eq(&r.region, &mr.region))
                .ok_or(TransferError::RegionDeregistered)?;
            regions.swap_remove(i)
        };
        // Refuse new operations and wait for the copies in progress, then
        // invalidate the keys (verbs drains its queued requests first).
        entry.region.kill();
        for (d, k) in group.domains.iter().zip(&entry.rkeys) {
            d.deregister(*k);
        }
        Ok(())
    }

    fn submit(
        &self,
        group: usize,
        ops: Vec<(usize, WorkOp)>,
        notify: Notify,
    ) -> Result<(), TransferError> {
        self.submit_to(group, ops, Vec::new(), notify)
    }

    /// [`Self::submit`] of writes with `receivers`, one per op (see
    /// `Request::receivers`).
    fn submit_to(
        &self,
        group: usize,
        ops: Vec<(usize, WorkOp)>,
        receivers: Vec<NetAddr>,
        notify: Notify,
    ) -> Result<(), TransferError> {
        self.live()?;
        let g = self.group(group)?;
        let c = &self.shared.counters;
        Counters::bump(&c.rtts, 1);
        if g.submit(Request {
            ops,
            notify,
            receivers,
        }) {
            Counters::bump(&c.direct_posts, 1);
        } else {
            Counters::bump(&c.handoffs, 1);
        }
        Ok(())
    }

    /// Sends a copy of `msg` to the peer at `peer`, into a receive buffer
    /// it posted with [`TransferEngine::submit_recvs`]. Completes once the
    /// message is in the buffer; with no buffer posted within the backend's
    /// wait bound it fails with [`TransferError::NoReceiveBuffer`].
    pub fn submit_send(
        &self,
        peer: &NetAddr,
        msg: &[u8],
        on_done: OnDone,
    ) -> Result<(), TransferError> {
        self.shared.check_len(OpKind::Send, msg.len() as u64)?;
        let nic = self.shared.nic() % self.nics();
        let op = WorkOp::Send {
            peer: *peer,
            data: msg.to_vec(),
        };
        self.submit(0, vec![(nic, op)], on_done.into())
    }

    /// Posts a pool of `count` receive buffers of `len` bytes; `cb` is
    /// called (on the callback thread) with each message, after which its
    /// buffer goes back to the pool. Buffers are posted on the main NIC
    /// (the loopback NICs of one engine share them).
    pub fn submit_recvs(
        &self,
        len: u64,
        count: u64,
        cb: impl Fn(&[u8]) + Send + Sync + 'static,
    ) -> Result<(), TransferError> {
        self.live()?;
        self.shared.check_len(OpKind::Recv, len)?;
        if count == 0 {
            return Err(TransferError::ZeroLength { op: OpKind::Recv });
        }
        let size = usize::try_from(len).map_err(|_| TransferError::TooLarge {
            op: OpKind::Recv,
            len,
            max: self.shared.max_transfer,
        })?;
        let pool: Arc<crate::domain::RecvFn> = Arc::new(cb);
        let d = &self.shared.groups[0].domains[0];
        for _ in 0..count {
            d.post_recv(RecvBuffer {
                data: vec![0; size].into_boxed_slice(),
                pool: pool.clone(),
            });
        }
        Ok(())
    }

    /// Arms "`count` writes carrying `imm` have landed here": `on_done`
    /// fires once, when the count is reached, counting arrivals from before
    /// this call; firing consumes `count` arrivals so `imm` can be re-armed.
    /// `count == 0` fires at once. One expectation per immediate at a time.
    /// It fires with an error instead if it is cancelled
    /// ([`TransferEngine::cancel_imm_count`]) or the sender reports its
    /// transfer failed ([`EngineConfig::abort_notices`]).
    pub fn expect_imm_count(
        &self,
        imm: u32,
        count: u32,
        on_done: OnDone,
    ) -> Result<(), TransferError> {
        self.arm_imm(imm, count, on_done, None)
    }

    /// [`TransferEngine::expect_imm_count`] with a deadline: if the count
    /// is not reached by `deadline`, `on_done` fires with
    /// [`TransferError::ImmDeadline`] (naming the arrivals seen), and the
    /// arrivals stay counted for the next expectation on `imm`.
    pub fn expect_imm_count_until(
        &self,
        imm: u32,
        count: u32,
        deadline: std::time::Instant,
        on_done: OnDone,
    ) -> Result<(), TransferError> {
        self.arm_imm(imm, count, on_done, Some(deadline))
    }

    /// Cancels the expectation armed on `imm`: its `on_done` fires with
    /// [`TransferError::ImmCancelled`]; arrivals stay counted. Returns
    /// whether one was armed.
    pub fn cancel_imm_count(&self, imm: u32) -> bool {
        let fired = self
            .shared
            .imm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .cancel(imm);
        match fired {
            Some((n, r)) => {
                n.fire(r, &self.shared.cbq);
                true
            }
            None => false,
        }
    }

    fn arm_imm(
        &self,
        imm: u32,
        count: u32,
        on_done: OnDone,
        deadline: Option<std::time::Instant>,
    ) -> Result<(), TransferError> {
        self.live()?;
        self.shared.check_imm(Some(imm))?;
        let r = self
            .shared
            .imm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .expect(imm, count, Notify::Done(on_done), deadline)?;
        match r {
            Some((n, r)) => n.fire(r, &self.shared.cbq),
            // Group 0's worker keeps the deadlines: it recomputes its sleep.
            None if deadline.is_some() => self.shared.groups[0].wake(),
            None => {}
        }
        Ok(())
    }

    /// Arrivals of `imm` not yet consumed by an expectation.
    pub fn imm_count(&self, imm: u32) -> u32 {
        self.shared
            .imm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .count(imm)
    }

    /// Writes `len` bytes from `src` (local region, offset) to `dst`
    /// (peer's descriptor, offset), split across NICs when large; with
    /// `imm`, every piece delivers it after its data (see the module docs
    /// for how many arrivals that is).
    pub fn submit_single_write(
        &self,
        len: u64,
        imm: Option<u32>,
        src: (&MrHandle, u64),
        dst: (&MrDesc, u64),
        on_done: OnDone,
    ) -> Result<(), TransferError> {
        self.shared.check_imm(imm)?;
        self.shared.check_len(OpKind::Write, len)?;
        self.shared.local(src.0, src.1, len)?;
        let group = src.0.group();
        let nics = self.group(group)?.domains.len();
        let pieces = u64::from(single_write_pieces(len, dst.0.nics.len()));
        // Pieces of equal size rounded up to 64 bytes; the last takes the rest.
        let chunk = len.div_ceil(pieces).next_multiple_of(64).min(len);
        // The whole range is checked once; pieces then stay inside it.
        if let Err(e) = remote(dst.0, 0, dst.1, len, Access::REMOTE_WRITE) {
            self.shared.fail(on_done.into(), e);
            return Ok(());
        }
        let mut ops = Vec::with_capacity(pieces as usize);
        let mut off = 0;
        // Piece `i` goes to the peer's NIC `i`, through our NICs in turn
        // from the next one (small writes spread over the group like reads
        // and atomics, and a sender with fewer NICs than pieces does not
        // load its first NIC most).
        let first = self.shared.nic();
        let mut i = 0;
        while off < len {
            let n = chunk.min(len - off);
            let remote = match remote(dst.0, i, dst.1 + off, n, Access::REMOTE_WRITE) {
                Ok(r) => r,
                Err(e) => {
                    self.shared.fail(on_done.into(), e);
                    return Ok(());
                }
            };
            ops.push((
                (first + i) % nics,
                WorkOp::Write {
                    local: Some(Local {
                        region: src.0.region.clone(),
                        offset: src.1 + off,
                    }),
                    remote,
                    len: n,
                    imm,
                },
            ));
            off += n;
            i += 1;
        }
        let receivers = self.receivers(dst.0, imm, ops.len());
        self.submit_to(group, ops, receivers, on_done.into())
    }

    /// Writes page `i` of `src` (`offset + indices[i] * stride`, `page_len`
    /// bytes) to page `i` of `dst`, for every `i`, spread across NICs; with
    /// `imm`, each page delivers it once.
    pub fn submit_paged_writes(
        &self,
        page_len: u64,
        imm: Option<u32>,
        src: (&MrHandle, &Pages),
        dst: (&MrDesc, &Pages),
        on_done: OnDone,
    ) -> Result<(), TransferError> {
        self.shared.check_imm(imm)?;
        self.shared.check_len(OpKind::PagedWrite, page_len)?;
        let (sp, dp) = (src.1, dst.1);
        if sp.indices.len() != dp.indices.len() {
            return Err(TransferError::PagesMismatch {
                src: sp.indices.len(),
                dst: dp.indices.len(),
            });
        }
        if sp.indices.is_empty() {
            return Err(TransferError::ZeroLength {
                op: OpKind::PagedWrite,
            });
        }
        let group = src.0.group();
        let nics = self.group(group)?.domains.len();
        let first = self.shared.nic();
        let mut ops = Vec::with_capacity(sp.indices.len());
        let mut remote_err = None;
        for i in 0..sp.indices.len() {
            let so = sp
                .page_offset(i)
                .ok_or(TransferError::PageOffsetOverflow { page: i })?;
            let d_off = dp
                .page_offset(i)
                .ok_or(TransferError::PageOffsetOverflow { page: i })?;
            let local = self.shared.local(src.0, so, page_len)?;
            let nic = (first + i) % nics;
            match remote(dst.0, nic, d_off, page_len, Access::REMOTE_WRITE) {
                Ok(remote) => ops.push((
                    nic,
                    WorkOp::Write {
                        local: Some(local),
                        remote,
                        len: page_len,
                        imm,
                    },
                )),
                Err(e) => {
                    remote_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = remote_err {
            self.shared.fail(on_done.into(), e);
            return Ok(());
        }
        let receivers = self.receivers(dst.0, imm, ops.len());
        self.submit_to(group, ops, receivers, on_done.into())
    }

    /// Pre-resolves a set of peers for [`TransferEngine::submit_scatter`]
    /// and [`TransferEngine::submit_barrier`].
    pub fn add_peer_group(&self, addrs: Vec<NetAddr>) -> Result<PeerGroupHandle, TransferError> {
        self.live()?;
        let d = &self.shared.groups[0].domains[0];
        for a in &addrs {
            d.resolve(a)?;
        }
        let mut groups = self
            .shared
            .peer_groups
            .write()
            .unwrap_or_else(|e| e.into_inner());
        groups.push(addrs.into_iter().collect());
        Ok(PeerGroupHandle(groups.len() as u64))
    }

    fn check_in_group(
        &self,
        h: Option<PeerGroupHandle>,
        peers: &[&MrDesc],
    ) -> Result<(), TransferError> {
        let Some(h) = h else {
            return Ok(());
        };
        let groups = self
            .shared
            .peer_groups
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let set =
            h.0.checked_sub(1)
                .and_then(|i| groups.get(i as usize))
                .ok_or(TransferError::UnknownPeerGroup { handle: h.0 })?;
        for d in peers {
            let (peer, _) = d.nics.first().ok_or(TransferError::NoNics)?;
            if !d.nics.iter().any(|(a, _)| set.contains(a)) {
                return Err(TransferError::PeerNotInGroup {
                    peer: *peer,
                    handle: h.0,
                });
            }
        }
        Ok(())
    }

    /// Writes slice `d.len` bytes at `src + d.src` to each destination `d`
    /// (zero-length slices are allowed: they carry only the immediate);
    /// with `imm`, every destination receives it once. With a peer group,
    /// every destination must be in it.
    pub fn submit_scatter(
        &self,
        group: Option<PeerGroupHandle>,
        on_done: OnDone,
        imm: Option<u32>,
        src: &MrHandle,
        dst: &[ScatterDst],
    ) -> Result<(), TransferError> {
        self.shared.check_imm(imm)?;
        if dst.is_empty() {
            return Err(TransferError::NoDestinations);
        }
        self.check_in_group(group, &dst.iter().map(|d| &d.dst).collect::<Vec<_>>())?;
        let g = src.group();
        let nics = self.group(g)?.domains.len();
        let first = self.shared.nic();
        let mut ops = Vec::with_capacity(dst.len());
        let mut remote_err = None;
        for (i, d) in dst.iter().enumerate() {
            if d.len > self.shared.max_transfer {
                return Err(TransferError::TooLarge {
                    op: OpKind::Scatter,
                    len: d.len,
                    max: self.shared.max_transfer,
                });
            }
            let local = self.shared.local(src, d.src, d.len)?;
            let nic = (first + i) % nics;
            match remote(&d.dst, nic, d.dst_offset, d.len, Access::REMOTE_WRITE) {
                Ok(remote) => ops.push((
                    nic,
                    WorkOp::Write {
                        local: (d.len > 0).then_some(local),
                        remote,
                        len: d.len,
                        imm,
                    },
                )),
                Err(e) => {
                    remote_err.get_or_insert(e);
                }
            }
        }
        if let Some(e) = remote_err {
            self.shared.fail(on_done.into(), e);
            return Ok(());
        }
        let receivers = dst
            .iter()
            .flat_map(|d| self.receivers(&d.dst, imm, 1))
            .collect();
        self.submit_to(g, ops, receivers, on_done.into())
    }

    /// Delivers `imm` to every destination with a zero-byte write (a valid
    /// descriptor with write access is required, as EFA does).
    pub fn submit_barrier(
        &self,
        group: Option<PeerGroupHandle>,
        on_done: OnDone,
        imm: u32,
        dst: &[MrDesc],
    ) -> Result<(), TransferError> {
        self.shared.check_imm(Some(imm))?;
        if dst.is_empty() {
            return Err(TransferError::NoDestinations);
        }
        self.check_in_group(group, &dst.iter().collect::<Vec<_>>())?;
        let nics = self.nics();
        let first = self.shared.nic();
        let mut ops = Vec::with_capacity(dst.len());
        for (i, d) in dst.iter().enumerate() {
            let nic = (first + i) % nics;
            match remote(d, nic, 0, 0, Access::REMOTE_WRITE) {
                Ok(remote) => ops.push((
                    nic,
                    WorkOp::Write {
                        local: None,
                        remote,
                        len: 0,
                        imm: Some(imm),
                    },
                )),
                Err(e) => {
                    self.shared.fail(on_done.into(), e);
                    return Ok(());
                }
            }
        }
        let receivers = dst
            .iter()
            .flat_map(|d| self.receivers(d, Some(imm), 1))
            .collect();
        self.submit_to(0, ops, receivers, on_done.into())
    }

    /// Reads `len` bytes from `src` (peer's descriptor, offset) into `dst`
    /// (local region with `LOCAL_WRITE`, offset).
    pub fn submit_read(
        &self,
        len: u64,
        dst: (&MrHandle, u64),
        src: (&MrDesc, u64),
        on_done: OnDone,
    ) -> Result<(), TransferError> {
        self.shared.check_len(OpKind::Read, len)?;
        let local = self.shared.local(dst.0, dst.1, len)?;
        if !dst.0.access().contains(Access::LOCAL_WRITE) {
            return Err(TransferError::LocalAccess {
                missing: Access::LOCAL_WRITE,
            });
        }
        let group = dst.0.group();
        let nic = self.shared.nic() % self.group(group)?.domains.len();
        match remote(src.0, nic, src.1, len, Access::REMOTE_READ) {
            Ok(remote) => self.submit(
                group,
                vec![(nic, WorkOp::Read { local, remote, len })],
                on_done.into(),
            ),
            Err(e) => {
                self.shared.fail(on_done.into(), e);
                Ok(())
            }
        }
    }

    /// The receivers of `n` writes carrying `imm` to `desc`, where abort
    /// notices need them (see `Request::receivers`); else none.
    fn receivers(&self, desc: &MrDesc, imm: Option<u32>, n: usize) -> Vec<NetAddr> {
        match receiver(desc) {
            Some(r) if self.shared.abort_notices && imm.is_some() => vec![r; n],
            _ => Vec::new(),
        }
    }

    fn atomic(
        &self,
        dst: (&MrDesc, u64),
        op: impl FnOnce(Remote) -> WorkOp,
        on_value: OnValue,
    ) -> Result<(), TransferError> {
        let nic = self.shared.nic() % self.nics();
        match remote(dst.0, nic, dst.1, 8, Access::REMOTE_ATOMIC) {
            Ok(r) => self.submit(0, vec![(nic, op(r))], on_value.into()),
            Err(e) => {
                self.shared.fail(on_value.into(), e);
                Ok(())
            }
        }
    }

    /// Compare-and-swap on the peer's 8-byte aligned word at `dst`:
    /// completes with the old value (the swap happened iff it equals
    /// `expected`).
    pub fn submit_cas(
        &self,
        dst: (&MrDesc, u64),
        expected: u64,
        new: u64,
        on_value: OnValue,
    ) -> Result<(), TransferError> {
        self.atomic(
            dst,
            |remote| WorkOp::Cas {
                remote,
                expected,
                new,
            },
            on_value,
        )
    }

    /// Fetch-and-add (wrapping) on the peer's 8-byte aligned word at
    /// `dst`: completes with the old value.
    pub fn submit_faa(
        &self,
        dst: (&MrDesc, u64),
        add: u64,
        on_value: OnValue,
    ) -> Result<(), TransferError> {
        self.atomic(dst, |remote| WorkOp::Faa { remote, add }, on_value)
    }

    /// A 64-bit word in host memory that anyone may update; the watcher
    /// thread calls `cb(old, new)` on every change it observes.
    pub fn alloc_uvm_watcher(
        &self,
        cb: impl FnMut(u64, u64) + Send + 'static,
    ) -> Result<Watcher, TransferError> {
        self.live()?;
        self.watchers.add(Box::new(cb))
    }

    /// Batches the calling thread's flag-notified submissions until the
    /// guard drops: each is accepted at once, and while its group has
    /// transfers in flight it is posted together with the thread's next
    /// ones (at the thread's next wait that has to poll, the guard's drop,
    /// or any round of the group), one post call for several transfers
    /// (see [`Plug`]). For loops that keep many transfers in flight;
    /// a submission to an idle group is posted at once.
    pub fn plug(&self) -> Plug {
        Plug::new()
    }

    /// A client channel on group 0 for low-latency doorbell batches (see
    /// [`Channel`]); one per client thread.
    pub fn channel(&self) -> Result<Channel, TransferError> {
        self.channel_in(0)
    }

    /// [`TransferEngine::channel`] for a given group.
    pub fn channel_in(&self, group: usize) -> Result<Channel, TransferError> {
        self.live()?;
        let g = self.group(group)?;
        let nic = g.channels.fetch_add(1, Relaxed) % g.domains.len();
        Channel::new(self.shared.clone(), group, nic)
    }

    /// Fault injection: while `failed`, every operation peers aim at this
    /// engine's NICs completes with [`TransferError::PeerFailed`]. Returns
    /// whether the backend supports it.
    pub fn set_failed(&self, failed: bool) -> bool {
        // Every domain must be told, so no short-circuiting `all`.
        let mut supported = true;
        for d in self.shared.groups.iter().flat_map(|g| &g.domains) {
            supported &= d.set_failed(failed);
        }
        supported
    }

    /// The engine's counters and each domain's.
    pub fn counters(&self) -> EngineCounters {
        let mut total = self.shared.counters.snapshot();
        let mut domains = Vec::new();
        for (gi, g) in self.shared.groups.iter().enumerate() {
            for d in &g.domains {
                let c = d.counters();
                total += c;
                domains.push(DomainCounters {
                    addr: d.address(),
                    group: gi,
                    counters: c,
                });
            }
        }
        EngineCounters { total, domains }
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        let shared = &self.shared;
        shared.shutdown.store(true, SeqCst);
        // Off the fabric first: peers now get `UnknownPeer`.
        for g in &shared.groups {
            for d in &g.domains {
                d.shutdown();
            }
        }
        // Workers fail what is in flight, then exit.
        for g in &shared.groups {
            g.wake();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        // Nothing progresses the NICs now: close their endpoints, which
        // cancels what is still in flight (a peer that never answered)
        // and drops its pins on our regions, for which `kill` waits.
        for g in &shared.groups {
            for d in &g.domains {
                d.close();
            }
        }
        // No NIC touches our memory after this.
        let regions =
            std::mem::take(&mut *shared.regions.lock().unwrap_or_else(|e| e.into_inner()));
        for r in regions {
            r.region.kill();
        }
        // Expectations that can no longer fire.
        let pending = shared
            .imm
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_all();
        for n in pending {
            n.fire(Err(TransferError::EngineShutDown), &shared.cbq);
        }
        self.watchers.stop();
        self.callback.stop();
    }
}
