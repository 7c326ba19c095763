//! [`MemoryNode`]: the memory node of the store on this process's fabric —
//! an engine of its own that registers the pool, bulk-loads it, and drives
//! the `rolex-dpu` retraining agent from a thread that parks when idle.
//!
//! The agent reaches the pool through [`HostPool`], whose 8-byte atomics are
//! the very `AtomicU64` words the loopback NIC's remote `CAS`/`FAA` use, so
//! the agent's freeze races correctly with compute nodes' locks — where the
//! engine's NIC makes its atomics atomic with the CPU's. Where it does not
//! (ConnectX's `IBV_ATOMIC_HCA`; EFA, whose atomics the provider emulates
//! on this CPU), the node's own `CAS`, `FAA` and stores on pool words go
//! through its NIC, a queue pair to itself
//! (`rolex_engine::TransferEngine::shared_words`, design §5.8):
//! [`MemoryNodeConfig::atomics`] says which, `Auto` by default. The thread
//! never sits on the data path: compute nodes only use one-sided verbs.
//!
//! The retraining thread runs on a core budget ([`MemoryNodeConfig::cores`]:
//! it is pinned to that many CPUs) and its CPU time is measured with the
//! thread CPU clock. With [`MemoryNodeConfig::pool_file`] the pool lives in
//! a shared file mapping behind an agent area
//! (`rolex_core::layout::AgentArea`), so another process — the freestanding
//! firmware image — can serve the very pool this node registered: start it
//! with `retraining_thread: false`, hand the image the file, and stop it
//! with [`MemoryNode::stop_external_agent`].
//!
//! A file-backed pool survives its process: the node publishes the agent's
//! `next_free` in the agent area as it moves, and
//! [`MemoryNode::resume`] maps a file that a dead node left, recovers it
//! (`rolex_dpu::recover`) and serves it again with every write that was
//! acknowledged before the death (a write's completion at a compute node
//! means its bytes are in the mapping, which the kernel keeps when the
//! process dies).

use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rolex_core::entry::LockOwner;
use rolex_core::layout::{
    AgentArea, LeafRegion, ModelRecord, Superblock, ValueRegion, LAYOUT_VERSION,
};
use rolex_core::wire::{Access, MrDesc};
use rolex_dpu::{
    Agent, AgentConfig, AgentError, AgentStats, BulkConfig, BulkPlan, DamagedLeaf, MemError,
    PoolMemory, Prepared, RetrainReport, SharedBytes,
};

use rolex_engine::{AtomicRoute, EngineConfig, MrHandle, SharedWords, TransferEngine};
use rolex_kv::PoolInfo;

use crate::error::{transfer, MemoryNodeError, NotAPool, PoolFileProblem};

/// How to build a memory node.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryNodeConfig {
    /// The memory node's own engine.
    pub engine: EngineConfig,
    /// Slots per leaf, `L` (at least 2).
    pub leaf_slots: u32,
    /// Fill factor at bulk load, in `(0, 1]`: keys per leaf =
    /// `round(fill · L)`, at least 1.
    pub fill: f64,
    /// Error bound of the models, in key positions; the models are trained
    /// over leaf fences, so their bound is `ceil(epsilon / keys_per_leaf)`
    /// leaves (see `rolex_core::model`).
    pub epsilon: u64,
    /// Most training leaves a bulk-loaded model has; retraining cuts a
    /// model grown past twice this into models of at most this many
    /// (see `rolex_dpu::AgentConfig::max_model_leaves`).
    pub max_model_leaves: u64,
    /// Leaf capacity for synonym leaves, as a fraction of the loaded leaves
    /// (plus a fixed 1024).
    pub spare_leaf_factor: f64,
    /// Bytes of model region for the records retraining builds (retired
    /// records are reused after `record_grace`); `None`: 16 times the
    /// loaded records or 64 bytes per spare leaf, whichever is more, plus
    /// 4 MiB.
    pub model_region_spare: Option<u64>,
    /// Directory slots for models retraining creates when it cuts a model
    /// grown past twice `max_model_leaves` into several; `None`: four
    /// times the loaded models, at least 4096. A full directory stops the
    /// cutting (models then grow instead).
    pub directory_spare: Option<u64>,
    /// SLT slots used that make the agent retrain a model (compute nodes
    /// enqueue at 128 regardless). 32 by default: retraining is also when
    /// emptied and underfull leaves are merged away, so a model retrained
    /// every 32 splits keeps the space of a store whose keys churn within
    /// 1.35 times its load (`rolex bench --workload churn`; at 128, 1.66).
    pub retrain_trigger: u64,
    /// Longest the agent's freeze of a model waits for writers holding its
    /// locks before it thaws the model and retries it later; see
    /// `rolex_dpu::AgentConfig::freeze_deadline`.
    pub freeze_deadline: Duration,
    /// How long a retired model record stays untouched before the agent
    /// reuses its space; longer than compute nodes' `model_max_age` plus a
    /// request's time in flight. See `rolex_dpu::AgentConfig::record_grace`.
    pub record_grace: Duration,
    /// How long a CirQ ticket may stay unwritten before the agent skips it
    /// as abandoned (its producer died or stalled between its `FAA` and its
    /// WRITE); see `rolex_dpu::AgentConfig::cirq_abandon_after`.
    pub cirq_abandon_after: Duration,
    /// How often the agent looks at every model's SLT header (between
    /// those looks, only the models queued or found due); see
    /// `rolex_dpu::AgentConfig::slt_scan_every`. 1 ms by default.
    pub slt_scan_every: Duration,
    /// Least time between two idle sweep walks (merging emptied leaves
    /// away) that retrained nothing; see
    /// `rolex_dpu::AgentConfig::sweep_every`. 10 ms by default.
    pub sweep_every: Duration,
    /// Run the retraining thread (`false`: retrain only through
    /// [`MemoryNode::poll_once`] / [`MemoryNode::retrain_now`], for tests
    /// that interleave retraining deliberately).
    pub retraining_thread: bool,
    /// Longest park of the idle retraining thread: how late it may notice
    /// a CirQ entry written by a compute node in another process (local
    /// clients wake it at once). 10 ms by default: an idle node polls 100
    /// times a second, about 0.2% of a core here.
    pub idle_park: Duration,
    /// CPUs the retraining thread may run on (the core budget, at least
    /// 1): it is pinned to the last `cores` CPUs the process may use (all
    /// of them if there are fewer).
    pub cores: usize,
    /// Lay the pool out in this file (created or emptied), mapped shared,
    /// behind an agent area, instead of in engine-owned memory (see the
    /// module docs); the file outlives the process, so a node that died
    /// can be resumed on it ([`MemoryNode::resume`]). `None`: engine
    /// memory.
    pub pool_file: Option<PathBuf>,
    /// Bytes of the agent area's log ring when `pool_file` is set.
    pub log_capacity: u64,
    /// Bytes of the value region beyond the loaded values' blocks: room
    /// for the out-of-line values (over 8 bytes) compute nodes write.
    /// They claim it in chunks of 1 MiB per size class and reuse what
    /// their overwrites and deletes free, so a workload needs about its
    /// live out-of-line bytes plus a few chunks per client. `None`: half
    /// the loaded values' bytes, at least 16 MiB.
    pub value_spare: Option<u64>,
    /// Blocks of the redo log (`rolex_core::layout::RedoRegion`): compute
    /// clients connected at once whose leaf writes are copied there first,
    /// so a leaf torn by a death is written again whole (a client finding
    /// none free connects without a copy, see `KvClient`). 0: no redo log.
    /// 64 by default.
    pub redo_blocks: u32,
    /// Slots of each redo block: leaf writes one client has in flight,
    /// and failed ones not yet written again. 64 by default.
    pub redo_slots: u32,
    /// Where the node applies its own atomics on pool words (see
    /// [`AtomicsRoute`]; `Auto` by default).
    pub atomics: AtomicsRoute,
}

impl Default for MemoryNodeConfig {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            leaf_slots: 16,
            fill: 0.75,
            epsilon: 32,
            max_model_leaves: 256,
            spare_leaf_factor: 1.0,
            model_region_spare: None,
            directory_spare: None,
            retrain_trigger: 32,
            freeze_deadline: AgentConfig::default().freeze_deadline,
            cirq_abandon_after: AgentConfig::default().cirq_abandon_after,
            slt_scan_every: AgentConfig::default().slt_scan_every,
            sweep_every: AgentConfig::default().sweep_every,
            record_grace: AgentConfig::default().record_grace,
            retraining_thread: true,
            idle_park: Duration::from_millis(10),
            cores: 1,
            pool_file: None,
            log_capacity: 64 << 10,
            value_spare: None,
            redo_blocks: 64,
            redo_slots: 64,
            atomics: AtomicsRoute::Auto,
        }
    }
}

/// The memory node's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNodeStats {
    /// The agent's counters (retrains, keys retrained, freeze times…).
    pub agent: AgentStats,
    /// Models (directory slots).
    pub models: u64,
    /// Keys bulk-loaded (after [`MemoryNode::resume`]: keys the pool held
    /// when it was resumed).
    pub keys_loaded: u64,
    /// Leaves bulk-loaded (after a resume: leaves allocated when it was
    /// resumed, so `synonym_leaves` counts those created since).
    pub leaves_loaded: u64,
    /// Leaves allocated so far (`alloc_num`).
    pub leaves_allocated: u64,
    /// Synonym leaves compute nodes created (`alloc_num` − loaded).
    pub synonym_leaves: u64,
    /// Leaves the region holds.
    pub leaf_capacity: u64,
    /// Bytes of the pool.
    pub pool_bytes: u64,
    /// Leaves given back by retraining (emptied leaves dropped from their
    /// chains) and not handed out again yet: waiting out their grace
    /// period, or offered to compute nodes in a model's leaf stash.
    pub leaves_free: u64,
    /// Leaves that hold part of the store: allocated and not free.
    pub leaves_live: u64,
    /// Bytes of the pool in use: live leaves, the model region's records
    /// in use (retired records waiting or reusable excluded), and the
    /// value region's bytes handed out ([`Self::value_bytes`]).
    pub pool_bytes_used: u64,
    /// Bytes of the value region handed out: the loaded values' blocks
    /// and the chunks compute nodes claimed (a claimed chunk counts whole,
    /// in use or held for reuse by its client).
    pub value_bytes: u64,
    /// Bytes of the value region's block area.
    pub value_capacity: u64,
    /// Retrainings that failed (the last error is kept by the node); a
    /// freeze past its deadline is not one (see `AgentStats::freeze_timeouts`).
    pub agent_errors: u64,
    /// CPU time of the retraining thread so far, in nanoseconds (the
    /// thread CPU clock; 0 without a thread).
    pub agent_cpu_ns: u64,
    /// Wall time the thread spent in steps that retrained a model, in
    /// nanoseconds (keys retrained per second = keys / this).
    pub retrain_busy_ns: u64,
    /// CPUs the retraining thread was pinned to (0: not pinned).
    pub pinned_cores: u64,
}

/// Where a memory node applies its own atomics on pool words that compute
/// nodes update through the NIC (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtomicsRoute {
    /// As the engine's NICs need: through the NIC where one's atomics are
    /// atomic only among NIC operations, else CPU atomics.
    #[default]
    Auto,
    /// CPU atomics on the mapped words (right where the NIC's atomics are
    /// coherent with the CPU's: loopback, libfabric `tcp`/`shm`, most
    /// `IBV_ATOMIC_GLOB` devices).
    Cpu,
    /// Every `CAS`, `FAA` and store through this node's own NIC (tests of
    /// that path on fabrics that would not need it).
    Nic,
}

/// [`PoolMemory`] over a registered region (see the module docs).
///
/// During a model's frozen section ([`PoolMemory::frozen`]) the calling
/// thread runs at real-time priority (`SCHED_FIFO` 1): on a machine
/// whose cores are shared, a time-shared thread is preempted by whatever
/// wakes on its core, and every writer of the frozen model waits for the
/// whole preemption (the README's issue-17 figures: the freeze's p99 with
/// and without it). The section is bounded work: its only
/// wait, for a writer's lock ([`PoolMemory::relax`]), runs at normal
/// priority, so the writer gets the CPU. Without the privilege
/// (`CAP_SYS_NICE`) the thread stays as it is.
pub struct HostPool {
    mr: MrHandle,
    epoch: Instant,
    /// The node's NIC route for atomics, when they go through it.
    nic: Option<Arc<SharedWords>>,
    /// [`BOOST_OFF`], [`BOOST_ON`] or [`BOOST_REFUSED`].
    boost: AtomicU8,
}

/// The agent's thread runs at its normal priority.
const BOOST_OFF: u8 = 0;
/// The agent's thread runs at real-time priority (a frozen section).
const BOOST_ON: u8 = 1;
/// The system refused real-time priority: not asked again.
const BOOST_REFUSED: u8 = 2;

/// Sets the calling thread's scheduling policy (`SCHED_FIFO` at priority
/// 1, or back to `SCHED_OTHER`); whether the system agreed.
fn set_realtime(on: bool) -> bool {
    let (policy, priority) = if on {
        (libc::SCHED_FIFO, 1)
    } else {
        (libc::SCHED_OTHER, 0)
    };
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `param` is a valid `sched_param`; pid 0 is the calling
    // thread.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

impl HostPool {
    /// The pool over a registered region (for tools and tests that bulk
    /// load or inspect a pool themselves), its atomics on the CPU.
    pub fn new(mr: MrHandle) -> Self {
        Self {
            mr,
            epoch: Instant::now(),
            nic: None,
            boost: AtomicU8::new(BOOST_OFF),
        }
    }

    /// The pool over `mr`, registered with `engine`, its atomics where
    /// `route` says (see [`AtomicsRoute`]).
    pub fn with_route(
        mr: MrHandle,
        engine: &TransferEngine,
        route: AtomicsRoute,
    ) -> Result<Self, MemoryNodeError> {
        let route = match route {
            AtomicsRoute::Auto => engine.atomic_profile().route(),
            AtomicsRoute::Cpu => AtomicRoute::Cpu,
            AtomicsRoute::Nic => AtomicRoute::Nic,
        };
        let nic = match route {
            AtomicRoute::Cpu => None,
            AtomicRoute::Nic => Some(Arc::new(
                engine
                    .shared_words_via(&mr, AtomicRoute::Nic)
                    .map_err(transfer("routing the pool's atomics through the NIC"))?,
            )),
        };
        Ok(Self {
            nic,
            ..Self::new(mr)
        })
    }

    /// The same pool and route, for another user (the reaper, a release).
    fn share(&self) -> Self {
        Self {
            mr: self.mr.clone(),
            epoch: self.epoch,
            nic: self.nic.clone(),
            boost: AtomicU8::new(BOOST_OFF),
        }
    }

    /// Whether the atomics go through the NIC.
    pub fn atomics_via_nic(&self) -> bool {
        self.nic.is_some()
    }

    /// The region as shared bytes, for the checked word atomics.
    fn words(&self) -> SharedBytes<'_> {
        // SAFETY: the region's memory was allocated (or mapped) by the
        // engine and is freed only when the last `Arc<Region>` goes; `self.mr`
        // holds one, so `[as_ptr, as_ptr + len)` stays valid while `self` is
        // borrowed. Compute nodes reach the same words only through the NIC
        // (the loopback NIC's remote CAS/FAA use `AtomicU64` on them), so the
        // agent's atomics are atomic with respect to theirs. (No region guard
        // per word: entering one bumps a counter every NIC operation on the
        // pool also bumps, and that cache line would bounce between the agent
        // and the compute nodes for every LT entry a freeze locks.)
        unsafe { SharedBytes::new(self.mr.as_ptr(), self.mr.len()) }
    }
}

/// Releases `owner`'s locks in every live model; each leaf of a released
/// chain that does not validate is mended from `owner`'s redo copy where
/// it can be and goes to `torn` first; then `owner`'s redo blocks are
/// freed (see [`rolex_dpu::release_locks_reporting`]).
fn release_locks(
    pool: &HostPool,
    owner: LockOwner,
    torn: impl FnMut(DamagedLeaf),
) -> Result<u64, MemoryNodeError> {
    let sb = superblock_of(pool)?;
    Ok(rolex_dpu::release_locks_reporting(
        pool,
        &sb,
        |o| o == owner,
        torn,
    )?)
}

fn superblock_of(pool: &HostPool) -> Result<Superblock, MemoryNodeError> {
    let mut sbb = [0u8; Superblock::SIZE as usize];
    pool.read(0, &mut sbb).map_err(AgentError::from)?;
    Ok(Superblock::read(&sbb)?)
}

fn mem_err(offset: u64, len: u64) -> impl Fn(rolex_engine::TransferError) -> MemError {
    move |e| match e {
        rolex_engine::TransferError::RegionDeregistered => MemError::Unavailable,
        _ => MemError::OutOfBounds { offset, len },
    }
}

impl PoolMemory for HostPool {
    fn size(&self) -> u64 {
        self.mr.len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.mr
            .read(offset, buf)
            .map_err(mem_err(offset, buf.len() as u64))
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), MemError> {
        self.mr
            .write(offset, buf)
            .map_err(mem_err(offset, buf.len() as u64))
    }
    fn load(&self, offset: u64) -> Result<u64, MemError> {
        self.words().load(offset)
    }
    fn store(&self, offset: u64, value: u64) -> Result<(), MemError> {
        match &self.nic {
            // A plain store could be undone by a NIC atomic that read the
            // word before it: a CAS loop through the NIC instead.
            Some(w) => w
                .swap(offset, value)
                .map(|_| ())
                .map_err(mem_err(offset, 8)),
            None => self.words().store(offset, value),
        }
    }
    fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        match &self.nic {
            Some(w) => w.cas(offset, expected, new).map_err(mem_err(offset, 8)),
            None => self.words().cas(offset, expected, new),
        }
    }
    fn faa(&self, offset: u64, add: u64) -> Result<u64, MemError> {
        match &self.nic {
            Some(w) => w.faa(offset, add).map_err(mem_err(offset, 8)),
            None => self.words().faa(offset, add),
        }
    }
    fn relax(&self, attempt: u32) {
        // Inside a frozen section: wait at normal priority, so that the
        // writer whose lock the agent waits for gets the CPU.
        let boosted = self.boost.load(SeqCst) == BOOST_ON;
        if boosted {
            set_realtime(false);
        }
        // Writers hold locks for microseconds and the agent may be waiting
        // under a freeze: yield for a good while before napping (a nap
        // costs at least the timer slack, tens of microseconds).
        if attempt < 256 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(u64::from(attempt.min(1000))));
        }
        if boosted {
            set_realtime(true);
        }
    }
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
    fn frozen(&self, on: bool) {
        match (on, self.boost.load(SeqCst)) {
            (true, BOOST_OFF) => {
                let next = if set_realtime(true) {
                    BOOST_ON
                } else {
                    BOOST_REFUSED
                };
                self.boost.store(next, SeqCst);
            }
            (false, BOOST_ON) => {
                set_realtime(false);
                self.boost.store(BOOST_OFF, SeqCst);
            }
            _ => {}
        }
    }
}

struct NodeShared {
    agent: Mutex<Agent<HostPool>>,
    stop: AtomicBool,
    errors: Mutex<(u64, Option<AgentError>)>,
    /// True while the retraining thread is inside one agent step.
    busy: AtomicBool,
    /// The thread's CPU time, ns (updated after each step).
    cpu_ns: AtomicU64,
    /// Wall time of steps that retrained, ns.
    retrain_ns: AtomicU64,
    /// CPUs the thread is pinned to.
    pinned: AtomicU64,
    /// Notices the agent met (unknown CirQ models), kept for the driver.
    notices: Mutex<Vec<rolex_dpu::Notice>>,
    /// The agent area of a file-backed pool, where the agent's
    /// `next_free` is published for a later [`MemoryNode::resume`].
    area: Option<MrHandle>,
    /// The `next_free` published last.
    published: AtomicU64,
}

impl NodeShared {
    /// Publishes the agent's `next_free` in the agent area if it moved
    /// (one store; a resume takes every byte below it that no directory
    /// record holds for a record retired at the restart).
    fn publish(&self, agent: &Agent<HostPool>) {
        let Some(area) = &self.area else { return };
        let nf = agent.next_free();
        if self.published.swap(nf, SeqCst) != nf {
            // Best effort: a resume also counts every directory record.
            let _ = area.store_u64(AgentArea::NEXT_FREE_OFFSET, nf);
        }
    }
}

/// A pool file mapped and its headers checked (`MemoryNode::open_pool_file`).
struct Opened {
    mapping: FileMapping,
    /// Its agent area's header.
    area_header: AgentArea,
    /// Where the pool starts in the file.
    at: u64,
    sb: Superblock,
    /// The pool's bytes (from the superblock; inside the file).
    pool_len: u64,
}

/// What [`MemoryNode::start`] and [`MemoryNode::resume`] hand to
/// `MemoryNode::assemble`.
struct Parts {
    engine: TransferEngine,
    mr: MrHandle,
    desc: MrDesc,
    area: Option<(MrHandle, PathBuf)>,
    mapping: Option<FileMapping>,
    agent: Agent<HostPool>,
    models: u64,
    keys_loaded: u64,
    leaves_loaded: u64,
    region: LeafRegion,
    values: ValueRegion,
    /// The pool as the node's own atomics reach it (their route).
    words: HostPool,
}

/// What compute nodes may do to the pool.
pub(crate) fn pool_access() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC
}

/// The agent's configuration from the node's.
fn agent_config(cfg: &MemoryNodeConfig) -> AgentConfig {
    AgentConfig {
        retrain_trigger: cfg.retrain_trigger,
        cirq_abandon_after: cfg.cirq_abandon_after,
        freeze_deadline: cfg.freeze_deadline,
        record_grace: cfg.record_grace,
        max_model_leaves: cfg.max_model_leaves,
        slt_scan_every: cfg.slt_scan_every,
        sweep_every: cfg.sweep_every,
        ..AgentConfig::default()
    }
}

/// Notices the node keeps for [`MemoryNode::take_notices`].
const MAX_NOTICES: usize = 1024;

/// A file mapped shared, read-write, whole; unmapped on drop. The file is
/// held open with an exclusive `flock` for as long as the mapping lives,
/// so two memory nodes never serve one pool file (the kernel drops the
/// lock when the process dies, so a killed node's file can be resumed).
struct FileMapping {
    ptr: NonNull<u8>,
    len: usize,
    _file: std::fs::File,
}

// SAFETY: the mapping is plain shared memory; the pointer is only used to
// register it with the engine and to unmap it once, on drop.
unsafe impl Send for FileMapping {}
// SAFETY: as for `Send`: `&FileMapping` gives no access to the memory.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Creates (or empties) the file at `path`, sized `len`, and maps it.
    fn create(path: &Path, len: u64) -> Result<Self, MemoryNodeError> {
        let err = pool_file_error(path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| err(io_problem("creating", &e)))?;
        // Locked before it is emptied: a file another node serves is left
        // alone.
        lock_file(&file).map_err(&err)?;
        file.set_len(0)
            .and_then(|()| file.set_len(len))
            .map_err(|e| err(io_problem("sizing", &e)))?;
        Self::map(file, len).map_err(err)
    }

    /// Maps the existing file at `path` whole, as it is.
    fn open(path: &Path) -> Result<Self, MemoryNodeError> {
        let err = pool_file_error(path);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| {
                err(match e.kind() {
                    std::io::ErrorKind::NotFound => PoolFileProblem::Missing,
                    _ => io_problem("opening", &e),
                })
            })?;
        lock_file(&file).map_err(&err)?;
        let len = file
            .metadata()
            .map_err(|e| err(io_problem("reading the size", &e)))?
            .len();
        if len < AgentArea::SIZE {
            return Err(err(PoolFileProblem::NotAPool {
                why: NotAPool::Short {
                    needed: AgentArea::SIZE,
                    found: len,
                },
            }));
        }
        Self::map(file, len).map_err(err)
    }

    fn map(file: std::fs::File, len: u64) -> Result<Self, PoolFileProblem> {
        let too_large = PoolFileProblem::Io {
            during: "mapping",
            kind: std::io::ErrorKind::OutOfMemory,
        };
        let n = usize::try_from(len).map_err(|_| too_large.clone())?;
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of our own open file at an address
        // the kernel picks; it aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io_problem("mapping", &std::io::Error::last_os_error()));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(too_large)?;
        Ok(Self {
            ptr,
            len: n,
            _file: file,
        })
    }

    /// A copy of `len` bytes at `offset` (inside the mapping).
    fn copy(&self, offset: u64, len: u64) -> Vec<u8> {
        let (o, n) = (offset as usize, len as usize);
        assert!(
            o <= self.len && n <= self.len - o,
            "copy inside the mapping"
        );
        // SAFETY: `[ptr + o, ptr + o + n)` lies in the mapping (checked
        // above), which is mapped while `self` lives; nothing else maps or
        // registers it yet (copies are taken before registration), so
        // nothing writes it concurrently.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(o), n) }.to_vec()
    }
}

/// Takes the exclusive lock of a pool file, or says another process has it.
fn lock_file(file: &std::fs::File) -> Result<(), PoolFileProblem> {
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` on a descriptor we own; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    Err(match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => PoolFileProblem::InUse,
        _ => io_problem("locking", &e),
    })
}

fn io_problem(during: &'static str, e: &std::io::Error) -> PoolFileProblem {
    PoolFileProblem::Io {
        during,
        kind: e.kind(),
    }
}

fn pool_file_error(path: &Path) -> impl Fn(PoolFileProblem) -> MemoryNodeError + '_ {
    move |problem| MemoryNodeError::PoolFile {
        path: path.to_path_buf(),
        problem,
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; dropped after
        // the engine that registered it (field order in `MemoryNode`), so
        // nothing touches the memory any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// Pins the calling thread to the last `k` CPUs it may run on; returns how
/// many it is pinned to (0 if pinning failed: an optimisation only).
fn pin_to_cores(k: usize) -> u64 {
    // SAFETY: `cpu_set_t` is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid, writable `cpu_set_t` of `size` bytes; pid 0
    // is the calling thread.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return 0;
    }
    // SAFETY: `CPU_ISSET` reads `set` at indices below its bit size.
    let allowed: Vec<usize> = (0..8 * size)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect();
    let chosen = &allowed[allowed.len().saturating_sub(k.max(1))..];
    // SAFETY: as above, all-zero is the empty set.
    let mut mine: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in chosen {
        // SAFETY: `c < 8 * size`, inside the set.
        unsafe { libc::CPU_SET(c, &mut mine) };
    }
    // SAFETY: `mine` is a valid `cpu_set_t` of `size` bytes.
    if chosen.is_empty() || unsafe { libc::sched_setaffinity(0, size, &mine) } != 0 {
        return 0;
    }
    chosen.len() as u64
}

/// A cheap, cloneable view of whether the memory node's retraining thread
/// is working right now, for benchmarks that split client latencies by it.
///
/// It is true during every agent step, including the short steps that find
/// the CirQ empty (microseconds, at most every `idle_park`), so it slightly
/// over-reports activity; it never under-reports a retraining.
#[derive(Clone)]
pub struct AgentActivity(Arc<NodeShared>);

impl AgentActivity {
    /// Whether the retraining thread is inside an agent step now.
    pub fn busy(&self) -> bool {
        self.0.busy.load(SeqCst)
    }
}

/// The memory node: engine, pool and retraining agent (see the module
/// docs). Dropping it stops the retraining thread, then the engine.
pub struct MemoryNode {
    shared: Arc<NodeShared>,
    thread: Option<JoinHandle<()>>,
    mr: MrHandle,
    desc: MrDesc,
    plan_models: u64,
    keys_loaded: u64,
    leaves_loaded: u64,
    leaf_capacity: u64,
    leaf_size: u64,
    alloc_num_offset: u64,
    values: ValueRegion,
    /// The pool as the node's own atomics reach it (their route).
    words: HostPool,
    /// The agent area of a file-backed pool: its handle (registered for
    /// local access only) and its path.
    area: Option<(MrHandle, PathBuf)>,
    // Dropped after the thread is joined.
    engine: TransferEngine,
    // Last: unmapped after the engine let go of it.
    _mapping: Option<FileMapping>,
}

impl std::fmt::Debug for MemoryNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryNode")
            .field("models", &self.plan_models)
            .field("pool_bytes", &self.mr.len())
            .finish()
    }
}

impl MemoryNode {
    /// Starts a memory node holding `pairs` (keys strictly increasing; may
    /// be empty): lays the pool out, registers it, bulk-loads it, and starts
    /// the retraining thread if configured.
    ///
    /// A memory node and a compute node in one process, on the loopback
    /// fabric (each has an engine of its own):
    ///
    /// ```
    /// use rolex_kv::{KvClient, KvClientConfig};
    /// use rolex_memnode::{MemoryNode, MemoryNodeConfig};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pairs: Vec<(u64, u64)> = (0..1000u64).map(|i| (i * 10, i)).collect();
    /// let node = MemoryNode::start(MemoryNodeConfig::default(), &pairs)?;
    ///
    /// let client = KvClient::connect(KvClientConfig::default(), &node.pool())?;
    /// let mut session = client.session()?; // one per thread
    /// assert_eq!(session.get(420)?, Some(42));
    /// assert_eq!(session.insert(421, 7)?, None);
    /// assert_eq!(session.scan(420, 2)?, [(420, 42), (421, 7)]);
    /// # Ok(())
    /// # }
    /// ```
    pub fn start(cfg: MemoryNodeConfig, pairs: &[(u64, u64)]) -> Result<Self, MemoryNodeError> {
        Self::start_with_values(cfg, pairs, &mut |_, word, out| {
            out.extend_from_slice(&word.to_le_bytes())
        })
    }

    /// [`MemoryNode::start`] with values of any length: each pair's value
    /// is what `value_of(key, word, out)` appends to `out` (empty when
    /// called; it is called twice per pair, once to size the value region,
    /// and must give the same bytes both times). Values over 8 bytes are
    /// laid out in value blocks.
    pub fn start_with_values(
        cfg: MemoryNodeConfig,
        pairs: &[(u64, u64)],
        value_of: &mut dyn FnMut(u64, u64, &mut Vec<u8>),
    ) -> Result<Self, MemoryNodeError> {
        if !(cfg.fill > 0.0 && cfg.fill <= 1.0) {
            return Err(MemoryNodeError::BadConfig {
                field: "fill",
                reason: "must be in (0, 1]",
            });
        }
        if !(cfg.spare_leaf_factor >= 0.0 && cfg.spare_leaf_factor.is_finite()) {
            return Err(MemoryNodeError::BadConfig {
                field: "spare_leaf_factor",
                reason: "must be finite and not negative",
            });
        }
        let keys_per_leaf =
            ((f64::from(cfg.leaf_slots) * cfg.fill).round() as u32).clamp(1, cfg.leaf_slots.max(1));
        let keys: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        let k = u64::from(keys_per_leaf);
        let leaves = (keys.len() as u64).div_ceil(k).max(1);
        let mut bulk = BulkConfig {
            leaf_region_id: 0,
            leaf_slots: cfg.leaf_slots,
            keys_per_leaf,
            epsilon: cfg.epsilon.div_ceil(k),
            max_model_leaves: cfg.max_model_leaves,
            spare_leaves: (leaves as f64 * cfg.spare_leaf_factor) as u64 + 1024,
            model_region_spare: 0,
            directory_spare: 0,
            value_capacity: 0,
            redo_blocks: cfg.redo_blocks,
            redo_slots: cfg.redo_slots,
        };
        let mut buf = Vec::new();
        let loaded = rolex_dpu::bulk::value_bytes(pairs.iter().map(|&(k, w)| {
            buf.clear();
            value_of(k, w, &mut buf);
            buf.len()
        }))
        .ok_or(MemoryNodeError::BadConfig {
            field: "values",
            reason: "a value is longer than rolex_core::layout::MAX_VALUE_LEN",
        })?;
        let spare = cfg.value_spare.unwrap_or((loaded / 2).max(16 << 20));
        bulk.value_capacity = loaded.saturating_add(spare);
        let probe = BulkPlan::new(&bulk, &keys)?;
        bulk.directory_spare = match cfg.directory_spare {
            Some(n) => n,
            None => probe.model_count().saturating_mul(4).max(4096),
        };
        let records = probe.next_free() - probe.superblock().model_region_offset();
        bulk.model_region_spare = match cfg.model_region_spare {
            Some(n) => n,
            // Records grow with the leaves they list (16 bytes each) and
            // with the models cut from them: room for every leaf the region
            // holds, listed four times over (records waiting out their
            // grace period), beside the loaded records' 16 times.
            None => records
                .saturating_mul(16)
                .max(bulk.spare_leaves.saturating_mul(64))
                .saturating_add(4 << 20),
        };
        // Room for at least one retraining of the largest model.
        let one = ModelRecord::size_for(cfg.max_model_leaves + 255, cfg.max_model_leaves + 255)?;
        bulk.model_region_spare = bulk.model_region_spare.max(one);
        let plan = BulkPlan::new(&bulk, &keys)?;
        drop(keys);
        let engine = TransferEngine::new(cfg.engine.clone())
            .map_err(transfer("starting the memory node's engine"))?;
        let access = pool_access();
        let mut mapping = None;
        let mut area = None;
        let (mr, desc) = match &cfg.pool_file {
            None => engine
                .alloc_mr(plan.pool_size(), access)
                .map_err(transfer("registering the pool"))?,
            Some(path) => {
                let bad = |reason| MemoryNodeError::BadConfig {
                    field: "log_capacity",
                    reason,
                };
                let at = AgentArea::pool_offset_for(cfg.log_capacity).ok_or(bad("too large"))?;
                let total = at.checked_add(plan.pool_size()).ok_or(bad("too large"))?;
                let m = FileMapping::create(path, total)?;
                let base = m.ptr;
                mapping = Some(m);
                // SAFETY: `[base, base + at)` and `[base + at, base +
                // total)` lie in the mapping, which stays mapped until
                // `_mapping` drops after the engine (field order), i.e.
                // after every registration is gone. Nothing holds Rust
                // references into it: all access goes through the engine.
                let (am, _) = unsafe { engine.reg_mr(base, at, Access::LOCAL_WRITE) }
                    .map_err(transfer("registering the agent area"))?;
                // SAFETY: as above; `at < total` so the pointer is inside.
                let pool_ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(at as usize)) };
                // SAFETY: as above.
                let r = unsafe { engine.reg_mr(pool_ptr, plan.pool_size(), access) }
                    .map_err(transfer("registering the pool"))?;
                let header =
                    AgentArea::new(plan.next_free(), cfg.retrain_trigger, cfg.log_capacity);
                am.write(0, zerocopy::IntoBytes::as_bytes(&header))
                    .map_err(transfer("writing the agent area"))?;
                area = Some((am, path.clone()));
                r
            }
        };
        let pool = HostPool::with_route(mr.clone(), &engine, cfg.atomics)?;
        plan.write_values(&pool, pairs, value_of)?;
        let words = pool.share();
        let agent = Agent::attach(pool, agent_config(&cfg), plan.next_free())?;
        let region = plan.superblock().leaf_region()?;
        let values = plan.superblock().value_region()?;
        Self::assemble(
            &cfg,
            Parts {
                engine,
                mr,
                desc,
                area,
                mapping,
                agent,
                models: plan.model_count(),
                keys_loaded: plan.key_count(),
                leaves_loaded: plan.leaf_count(),
                region,
                values,
                words,
            },
        )
    }

    /// Resumes the pool in `cfg.pool_file` that a memory node laid out
    /// ([`MemoryNode::start`] with `pool_file`) and that was left by its
    /// process when it died (`SIGKILL`, a crash): maps the file as it is —
    /// nothing is truncated or loaded — checks it is a pool file of this
    /// layout version, recovers it ([`rolex_dpu::Agent::resume`]: pool
    /// validated, an interrupted retraining thawed or rolled forward,
    /// every compute node's chain lock released, leaves checked, the
    /// model region's free space retired as of now) *before* registering
    /// it, then serves it as `start` does. Returns the recovery report.
    ///
    /// Locks: every compute-node lock is released at once, before any
    /// compute node can reach the pool (no window for returning compute
    /// nodes): an operation issued before the restart cannot land after
    /// it — the old engine's endpoints and memory keys died with its
    /// process, so a compute node reaches the resumed pool only through a
    /// new bootstrap (new address, keys and lease) — and lease ids start
    /// afresh, so an old lock's id could name a new compute node.
    ///
    /// The pool's shape comes from the file: `cfg`'s `leaf_slots`, `fill`,
    /// `epsilon`, `spare_leaf_factor`, `model_region_spare` and
    /// `log_capacity` are not used. The file stays locked (`flock`) while
    /// the node lives, so a second node cannot serve it at once.
    pub fn resume(cfg: MemoryNodeConfig) -> Result<(Self, rolex_dpu::Recovery), MemoryNodeError> {
        let path = cfg.pool_file.clone().ok_or(MemoryNodeError::BadConfig {
            field: "pool_file",
            reason: "resuming needs the pool file",
        })?;
        let Opened {
            mapping,
            area_header,
            at,
            sb,
            pool_len,
        } = Self::open_pool_file(&path)?;
        let engine = TransferEngine::new(cfg.engine.clone())
            .map_err(transfer("starting the memory node's engine"))?;
        let base = mapping.ptr;
        // SAFETY: `[base, base + at)` and `[base + at, base + at +
        // pool_len)` lie in the mapping (checked by `open_pool_file`), which stays mapped
        // until `_mapping` drops after the engine (field order), i.e. after
        // every registration is gone. Nothing holds Rust references into
        // it: all access goes through the engine.
        let (am, _) = unsafe { engine.reg_mr(base, at, Access::LOCAL_WRITE) }
            .map_err(transfer("registering the agent area"))?;
        // SAFETY: as above; `at` is inside the file (checked by
        // `open_pool_file`), so the pointer is inside.
        let pool_ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(at as usize)) };
        // SAFETY: as above. Compute nodes can reach the pool only once
        // `assemble` returns and the caller offers its descriptor.
        let (mr, desc) = unsafe { engine.reg_mr(pool_ptr, pool_len, pool_access()) }
            .map_err(transfer("registering the pool"))?;
        let pool = HostPool::with_route(mr.clone(), &engine, cfg.atomics)?;
        let words = pool.share();
        let (agent, recovery) = Agent::resume(pool, agent_config(&cfg), area_header.next_free())?;
        am.store_u64(AgentArea::NEXT_FREE_OFFSET, agent.next_free())
            .map_err(transfer("writing the agent area"))?;
        let region = sb.leaf_region()?;
        let allocated = mr.load_u64(region.alloc_num_offset()).unwrap_or(0);
        let node = Self::assemble(
            &cfg,
            Parts {
                engine,
                mr,
                desc,
                area: Some((am, path.clone())),
                mapping: Some(mapping),
                agent,
                models: sb.model_count(),
                keys_loaded: recovery.keys,
                leaves_loaded: allocated.min(region.capacity()),
                region,
                values: sb.value_region()?,
                words,
            },
        )?;
        Ok((node, recovery))
    }

    /// Checks that the file at `path` is a pool file [`MemoryNode::resume`]
    /// could serve — there, not locked by another process, its agent area,
    /// magic, layout version and superblock sound, as long as its layout
    /// needs — without writing to it: a caller that has more to check
    /// before resuming (the data set it holds) refuses with the file as it
    /// was. Resuming checks the rest (models, leaves) as it recovers.
    pub fn check_pool_file(path: &Path) -> Result<(), MemoryNodeError> {
        Self::open_pool_file(path).map(drop)
    }

    /// Maps the pool file at `path` and checks its headers (see
    /// [`MemoryNode::check_pool_file`]); writes nothing.
    fn open_pool_file(path: &Path) -> Result<Opened, MemoryNodeError> {
        let err = pool_file_error(path);
        let mapping = FileMapping::open(path)?;
        let not_a_pool = |why| err(PoolFileProblem::NotAPool { why });
        let area_header = AgentArea::read(&mapping.copy(0, AgentArea::SIZE))
            .map_err(|e| not_a_pool(NotAPool::Area(e)))?;
        let file_len = mapping.len as u64;
        let at = area_header
            .pool_offset()
            .filter(|&at| at.saturating_add(Superblock::SIZE) <= file_len)
            .ok_or_else(|| {
                not_a_pool(NotAPool::Short {
                    needed: area_header
                        .pool_offset()
                        .unwrap_or(u64::MAX)
                        .saturating_add(Superblock::SIZE),
                    found: file_len,
                })
            })?;
        let head = mapping.copy(at, Superblock::SIZE);
        let word = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().unwrap_or([0; 8]));
        if word(0) != rolex_core::layout::MAGIC {
            return Err(not_a_pool(NotAPool::PoolMagic { found: word(0) }));
        }
        let version = word(8) as u32;
        if version != LAYOUT_VERSION {
            return Err(err(PoolFileProblem::LayoutVersion {
                found: version,
                supported: LAYOUT_VERSION,
            }));
        }
        let sb = Superblock::read(&head)?;
        let pool_len = sb.pool_size();
        if at.saturating_add(pool_len) > file_len {
            return Err(not_a_pool(NotAPool::Short {
                needed: at.saturating_add(pool_len),
                found: file_len,
            }));
        }
        Ok(Opened {
            mapping,
            area_header,
            at,
            sb,
            pool_len,
        })
    }

    /// Starts serving: the agent's thread (if configured) and the node.
    fn assemble(cfg: &MemoryNodeConfig, p: Parts) -> Result<Self, MemoryNodeError> {
        let published = p.agent.next_free();
        let shared = Arc::new(NodeShared {
            agent: Mutex::new(p.agent),
            stop: AtomicBool::new(false),
            errors: Mutex::new((0, None)),
            busy: AtomicBool::new(false),
            cpu_ns: AtomicU64::new(0),
            retrain_ns: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            notices: Mutex::new(Vec::new()),
            area: p.area.as_ref().map(|(mr, _)| mr.clone()),
            published: AtomicU64::new(published),
        });
        let thread = if cfg.retraining_thread {
            let s = shared.clone();
            let park = cfg.idle_park;
            let cores = cfg.cores;
            Some(
                std::thread::Builder::new()
                    .name("rolex-memnode-retrain".into())
                    .spawn(move || {
                        s.pinned.store(pin_to_cores(cores), SeqCst);
                        retrain_loop(&s, park)
                    })
                    .map_err(|_| MemoryNodeError::BadConfig {
                        field: "retraining_thread",
                        reason: "the thread could not be spawned",
                    })?,
            )
        } else {
            None
        };
        Ok(Self {
            shared,
            thread,
            mr: p.mr,
            desc: p.desc,
            plan_models: p.models,
            keys_loaded: p.keys_loaded,
            leaves_loaded: p.leaves_loaded,
            leaf_capacity: p.region.capacity(),
            leaf_size: p.region.leaf_size(),
            alloc_num_offset: p.region.alloc_num_offset(),
            values: p.values,
            words: p.words,
            area: p.area,
            engine: p.engine,
            _mapping: p.mapping,
        })
    }

    /// The pool file and its agent area's header, for a file-backed pool.
    pub fn agent_area(&self) -> Option<(PathBuf, AgentArea)> {
        let (mr, path) = self.area.as_ref()?;
        let bytes = mr.to_vec(0, AgentArea::SIZE as usize).ok()?;
        let header = AgentArea::read(&bytes).ok()?;
        Some((path.clone(), header))
    }

    /// The whole agent area (header and log ring) of a file-backed pool.
    pub fn agent_area_bytes(&self) -> Option<Vec<u8>> {
        let (mr, _) = self.area.as_ref()?;
        mr.to_vec(0, mr.len() as usize).ok()
    }

    /// Asks an external agent serving a file-backed pool to stop after its
    /// current step (it publishes the stopped state when it has).
    pub fn stop_external_agent(&self) -> Result<(), MemoryNodeError> {
        let (mr, _) = self.area.as_ref().ok_or(MemoryNodeError::BadConfig {
            field: "pool_file",
            reason: "the pool is not file-backed",
        })?;
        mr.store_u64(AgentArea::COMMAND_OFFSET, AgentArea::STOP)
            .map_err(transfer("writing the agent area"))
    }

    /// Notices the agent met so far (CirQ entries naming no model), taken.
    pub fn take_notices(&self) -> Vec<rolex_dpu::Notice> {
        let mut a = self.agent();
        let mut out = std::mem::take(
            &mut *self
                .shared
                .notices
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        while let Some(n) = a.take_notice() {
            out.push(n);
        }
        out
    }

    /// What compute nodes connect with.
    pub fn pool(&self) -> PoolInfo {
        PoolInfo {
            desc: self.desc.clone(),
            layout_version: LAYOUT_VERSION,
        }
    }

    /// What the node offers compute nodes in other processes over the
    /// bootstrap connection: its engine's address, the pool's descriptor
    /// and the layout version ([`PoolInfo::from_offer`] turns it back).
    #[cfg(feature = "libfabric")]
    pub fn offer(&self) -> rolex_engine::domain::fabric::bootstrap::Offer {
        rolex_engine::domain::fabric::bootstrap::Offer {
            addr: self.engine.main_address(),
            descs: vec![self.desc.clone()],
            layout_version: LAYOUT_VERSION,
        }
    }

    /// The memory node's engine.
    pub fn engine(&self) -> &TransferEngine {
        &self.engine
    }

    /// A file-backed pool's file, the file's length and the pool's offset
    /// in it (`lease_keys` maps it again for each lease).
    pub(crate) fn pool_file(&self) -> Option<(&std::fs::File, usize, usize)> {
        let m = self._mapping.as_ref()?;
        let at = (self.mr.as_ptr() as usize).checked_sub(m.ptr.as_ptr() as usize)?;
        Some((&m._file, m.len, at))
    }

    /// The registered pool (for tests and inspection; compute nodes never
    /// use it).
    pub fn pool_handle(&self) -> &MrHandle {
        &self.mr
    }

    /// Models in the directory: those bulk-loaded, and those retraining
    /// added by cutting models that grew too large.
    pub fn model_count(&self) -> u64 {
        self.agent().stats().models.max(self.plan_models)
    }

    /// Releases every chain lock held by `owner`, a compute node whose
    /// lease ended (see [`crate::lease_server`]); returns how many. Never waits
    /// for the retraining agent (whose freeze may be the one waiting for
    /// those locks).
    pub fn release_locks_of(&self, owner: LockOwner) -> Result<u64, MemoryNodeError> {
        release_locks(&self.words, owner, |_| {})
    }

    /// [`MemoryNode::release_locks_of`], also naming the leaves of the
    /// chains it released that did not validate: writes `owner`'s
    /// connection carried only in part before it died. Each was written
    /// again whole from `owner`'s newest redo copy of it before the
    /// release where there was one ([`DamagedLeaf::restored`]); one left
    /// torn keeps its keys unreadable (see
    /// [`rolex_dpu::release_locks_reporting`]). `owner`'s redo blocks are
    /// freed.
    pub fn release_locks_reporting(
        &self,
        owner: LockOwner,
    ) -> Result<(u64, Vec<DamagedLeaf>), MemoryNodeError> {
        let mut torn = Vec::new();
        let n = release_locks(&self.words, owner, |d| torn.push(d))?;
        Ok((n, torn))
    }

    /// Releases every chain lock whose leased holder `dead` says is dead
    /// (a periodic sweep: "holds no lease now", for a dead node's operation
    /// that landed after both releases of its lease); returns how many.
    /// Torn leaves of those chains are mended as
    /// [`MemoryNode::release_locks_reporting`] does, and the dead holders'
    /// redo blocks freed.
    pub fn release_locks_where(
        &self,
        dead: impl Fn(LockOwner) -> bool,
    ) -> Result<u64, MemoryNodeError> {
        self.release_locks_where_reporting(dead, |_| {})
    }

    /// [`MemoryNode::release_locks_where`], handing every leaf of a
    /// released chain that did not validate to `torn` (restored or not,
    /// as [`MemoryNode::release_locks_reporting`]).
    pub fn release_locks_where_reporting(
        &self,
        dead: impl Fn(LockOwner) -> bool,
        torn: impl FnMut(DamagedLeaf),
    ) -> Result<u64, MemoryNodeError> {
        let sb = superblock_of(&self.words)?;
        Ok(rolex_dpu::release_locks_reporting(
            &self.words,
            &sb,
            dead,
            torn,
        )?)
    }

    /// [`MemoryNode::release_locks_of`] as a lease server's callback: it
    /// keeps the pool's registration alive, so it may outlive the node.
    pub fn lock_releaser(&self) -> Arc<crate::lease_server::OnExpire> {
        self.lock_releaser_with(|_, _| {})
    }

    /// [`MemoryNode::lock_releaser`] that hands every torn leaf of a chain
    /// it releases to `torn` (written again whole from the redo log, or
    /// left torn: [`DamagedLeaf::restored`]), with the dead owner (see
    /// [`MemoryNode::release_locks_reporting`]).
    pub fn lock_releaser_with(
        &self,
        torn: impl Fn(LockOwner, DamagedLeaf) + Send + Sync + 'static,
    ) -> Arc<crate::lease_server::OnExpire> {
        let pool = self.words.share();
        Arc::new(move |owner| {
            release_locks(&pool, owner, |d| torn(owner, d)).map_err(|e| e.to_string())
        })
    }

    fn agent(&self) -> std::sync::MutexGuard<'_, Agent<HostPool>> {
        self.shared.agent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Figures so far.
    pub fn stats(&self) -> MemoryNodeStats {
        let agent = self.agent().stats();
        let allocated = self.mr.load_u64(self.alloc_num_offset).unwrap_or(0);
        let errors = self
            .shared
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0;
        let allocated_leaves = allocated.min(self.leaf_capacity);
        let leaves_free = agent.leaves_free.min(allocated_leaves);
        let leaves_live = allocated_leaves - leaves_free;
        let records_used = agent
            .model_region_used
            .saturating_sub(agent.model_region_free);
        let value_bytes = self
            .mr
            .load_u64(self.values.alloc_offset())
            .unwrap_or(0)
            .min(self.values.capacity());
        MemoryNodeStats {
            agent,
            models: agent.models.max(self.plan_models),
            keys_loaded: self.keys_loaded,
            leaves_loaded: self.leaves_loaded,
            leaves_allocated: allocated.min(self.leaf_capacity),
            synonym_leaves: allocated
                .min(self.leaf_capacity)
                .saturating_sub(self.leaves_loaded),
            leaf_capacity: self.leaf_capacity,
            pool_bytes: self.mr.len(),
            leaves_free,
            leaves_live,
            pool_bytes_used: leaves_live * self.leaf_size + records_used + value_bytes,
            value_bytes,
            value_capacity: self.values.capacity(),
            agent_errors: errors,
            agent_cpu_ns: self.shared.cpu_ns.load(SeqCst),
            retrain_busy_ns: self.shared.retrain_ns.load(SeqCst),
            pinned_cores: self.shared.pinned.load(SeqCst),
        }
    }

    /// A view of the retraining thread's activity (see [`AgentActivity`]).
    pub fn activity(&self) -> AgentActivity {
        AgentActivity(self.shared.clone())
    }

    /// The last error the retraining thread met, if any (freezes past their
    /// deadline are counted in `AgentStats::freeze_timeouts` instead).
    pub fn last_agent_error(&self) -> Option<AgentError> {
        self.shared
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
    }

    /// One step of the agent on the caller's thread: drain the CirQ and
    /// retrain the neediest due model.
    pub fn poll_once(&self) -> Result<Option<RetrainReport>, MemoryNodeError> {
        let mut a = self.agent();
        let r = a.poll();
        self.shared.publish(&a);
        Ok(r?)
    }

    /// Retrains model `model` now, whatever its SLT count.
    pub fn retrain_now(&self, model: u64) -> Result<RetrainReport, MemoryNodeError> {
        let mut a = self.agent();
        let r = a.retrain(model);
        self.shared.publish(&a);
        Ok(r?)
    }

    /// Retraining step 1 alone (walk and fit, nothing locked): with
    /// [`MemoryNode::install`], lets tests run compute-node operations
    /// between training and installation.
    pub fn prepare(&self, model: u64) -> Result<Prepared, MemoryNodeError> {
        Ok(self.agent().prepare(model)?)
    }

    /// Retraining steps 2–6 for a prepared model: freeze, carry over the
    /// leaves created since [`MemoryNode::prepare`], switch, retire.
    pub fn install(&self, prepared: Prepared) -> Result<RetrainReport, MemoryNodeError> {
        let mut a = self.agent();
        let r = a.install(prepared);
        self.shared.publish(&a);
        Ok(r?)
    }

    /// SLT slots model `model` has used.
    pub fn slt_used(&self, model: u64) -> Result<u64, MemoryNodeError> {
        Ok(self.agent().slt_used(model)?)
    }

    /// Runs `f` between two steps of the retraining agent: the agent is
    /// held until `f` returns, so no freeze, switch or release of a model's
    /// entries is under way meanwhile, and what `f` reads of the model
    /// records and their LT entries is what the last step left (compute
    /// nodes, if any still run, go on changing it). A copy of the pool
    /// taken while a step runs may see a whole model frozen — every LT
    /// entry locked by the agent — or a directory word from before a
    /// switch beside its record's state from after it.
    ///
    /// `f` must not call this node's methods that use the agent
    /// ([`MemoryNode::stats`], [`MemoryNode::model_count`],
    /// [`MemoryNode::poll_once`], …): they would wait for it forever.
    pub fn between_agent_steps<R>(&self, f: impl FnOnce() -> R) -> R {
        let _held = self.agent();
        f()
    }

    /// Wakes the retraining thread (it also wakes on its own every
    /// `idle_park`).
    pub fn wake(&self) {
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }
}

fn retrain_loop(s: &NodeShared, park: Duration) {
    let mut nap = Duration::from_micros(100);
    // Reading the thread's CPU clock is a file read (`/proc`): after every
    // step that worked, and otherwise every 64th idle step, so an idle
    // node's polling of the CirQ stays a few loads per park.
    let mut idle_steps = 0u32;
    while !s.stop.load(SeqCst) {
        s.busy.store(true, SeqCst);
        let t0 = Instant::now();
        let r = {
            let mut a = s.agent.lock().unwrap_or_else(|e| e.into_inner());
            let r = a.poll();
            s.publish(&a);
            let mut kept = None;
            while let Some(n) = a.take_notice() {
                let g =
                    kept.get_or_insert_with(|| s.notices.lock().unwrap_or_else(|e| e.into_inner()));
                // Bounded: a driver that never takes notices keeps the newest.
                if g.len() >= MAX_NOTICES {
                    g.remove(0);
                }
                g.push(n);
            }
            r
        };
        s.busy.store(false, SeqCst);
        if matches!(r, Ok(Some(_))) {
            s.retrain_ns
                .fetch_add(t0.elapsed().as_nanos() as u64, SeqCst);
        }
        idle_steps = if matches!(r, Ok(None)) {
            idle_steps.wrapping_add(1)
        } else {
            0
        };
        if idle_steps % 64 <= 1 {
            s.cpu_ns.store(thread_cpu_ns(), SeqCst);
        }
        match r {
            Ok(Some(_)) => {
                nap = Duration::from_micros(100);
                std::thread::yield_now();
            }
            Ok(None) => {
                std::thread::park_timeout(nap);
                nap = (nap * 2).min(park);
            }
            // A freeze that met a writer's lock past its deadline is the
            // designed outcome under contention, not a failure: the agent
            // thawed, counted it (`AgentStats::freeze_timeouts`) and backs
            // the model off; the thread goes on at once.
            Err(AgentError::FreezeDeadline { .. }) => {
                std::thread::yield_now();
            }
            Err(e) => {
                let mut g = s.errors.lock().unwrap_or_else(|e| e.into_inner());
                g.0 += 1;
                g.1 = Some(e);
                drop(g);
                std::thread::park_timeout(park);
            }
        }
    }
}

impl Drop for MemoryNode {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(all(test, feature = "libfabric"))]
mod tests {
    use super::*;

    #[test]
    fn the_agent_gets_every_knob_of_the_nodes_config() {
        let cfg = MemoryNodeConfig {
            retrain_trigger: 7,
            cirq_abandon_after: Duration::from_millis(3),
            freeze_deadline: Duration::from_micros(250),
            record_grace: Duration::from_millis(40),
            max_model_leaves: 9,
            slt_scan_every: Duration::ZERO,
            sweep_every: Duration::from_millis(55),
            ..MemoryNodeConfig::default()
        };
        let a = agent_config(&cfg);
        assert_eq!(a.retrain_trigger, 7);
        assert_eq!(a.cirq_abandon_after, cfg.cirq_abandon_after);
        assert_eq!(a.freeze_deadline, cfg.freeze_deadline);
        assert_eq!(a.record_grace, cfg.record_grace);
        assert_eq!(a.max_model_leaves, 9);
        assert_eq!(a.slt_scan_every, Duration::ZERO);
        assert_eq!(a.sweep_every, cfg.sweep_every);
        // The node's defaults are the agent's.
        let d = agent_config(&MemoryNodeConfig::default());
        assert_eq!(d.slt_scan_every, AgentConfig::default().slt_scan_every);
        assert_eq!(d.sweep_every, AgentConfig::default().sweep_every);
    }

    #[test]
    fn the_offer_carries_the_pool_back() {
        let pairs: Vec<(u64, u64)> = (1..200u64).map(|k| (k * 7, k)).collect();
        let node = MemoryNode::start(
            MemoryNodeConfig {
                retraining_thread: false,
                ..MemoryNodeConfig::default()
            },
            &pairs,
        )
        .unwrap();
        let offer = node.offer();
        assert_eq!(offer.addr, node.engine().main_address());
        assert_eq!(PoolInfo::from_offer(&offer), Some(node.pool()));
        let empty = rolex_engine::domain::fabric::bootstrap::Offer {
            descs: Vec::new(),
            ..offer
        };
        assert_eq!(PoolInfo::from_offer(&empty), None);
    }

    /// A compute node dies with its leaf write torn and its redo entry
    /// whole: the reaper writes the leaf again whole before it releases
    /// the chain, and a client reads every key of it, the torn write's
    /// key included.
    #[test]
    fn the_reaper_mends_a_dead_nodes_torn_leaf_from_its_redo_copy() {
        use rolex_core::entry::LtEntry;
        use rolex_core::layout::{Leaf, ModelRecord, RedoClaim, RedoEntry, SlotValue};
        use rolex_dpu::Restored;
        use rolex_kv::{KvClient, KvClientConfig};

        const DEAD: LockOwner = LockOwner(41);
        let pairs: Vec<(u64, u64)> = (1..400u64).map(|k| (k * 10, k)).collect();
        let node = MemoryNode::start(
            MemoryNodeConfig {
                retraining_thread: false,
                ..MemoryNodeConfig::default()
            },
            &pairs,
        )
        .unwrap();
        let pool = &node.words;
        let sb = superblock_of(pool).unwrap();
        let redo = sb.redo_region().unwrap().expect("a redo log by default");
        let region = sb.leaf_region().unwrap();
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        let at = pool.load(sb.directory_entry_offset(0).unwrap()).unwrap();
        pool.read(at, &mut rb).unwrap();
        let lt = ModelRecord::read(&rb).unwrap().lt_entry_offset(0).unwrap();
        let entry = LtEntry::from_raw(pool.load(lt).unwrap());
        let leaf_at = region.leaf_offset(entry.addr()).unwrap();
        let mut old = vec![0u8; region.leaf_size() as usize];
        pool.read(leaf_at, &mut old).unwrap();
        // The write: a key between two loaded ones.
        let mut new = old.clone();
        let leaf = Leaf::from_bytes_mut(&mut new).unwrap();
        let key = leaf.used_entries()[0].key() + 1;
        leaf.upsert(key, SlotValue::from_u64(7777)).unwrap();
        leaf.seal();
        let keys: Vec<u64> = leaf.used_entries().iter().map(|s| s.key()).collect();
        // What the dead node's batch left: its block, its entry, the chain
        // locked, the leaf torn half way.
        pool.store(redo.claim_offset(5).unwrap(), RedoClaim::new(DEAD, 3).raw())
            .unwrap();
        let mut slot = vec![0u8; redo.slot_len() as usize];
        RedoEntry {
            owner: DEAD,
            nonce: 3,
            seq: 12,
            target: leaf_at,
            image: &new,
        }
        .encode(&mut slot)
        .unwrap();
        pool.write(redo.slot_offset(5, 1).unwrap(), &slot).unwrap();
        pool.store(lt, entry.locked_by(DEAD).raw()).unwrap();
        let mut torn = old.clone();
        torn[..new.len() / 2].copy_from_slice(&new[..new.len() / 2]);
        pool.write(leaf_at, &torn).unwrap();

        let (released, named) = node.release_locks_reporting(DEAD).unwrap();
        assert_eq!(released, 1);
        assert_eq!(named.len(), 1, "{named:?}");
        assert_eq!(
            named[0].restored,
            Some(Restored {
                owner: DEAD,
                seq: 12
            })
        );
        assert_eq!(pool.load(redo.claim_offset(5).unwrap()).unwrap(), 0);
        let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut s = client.session().unwrap();
        for k in keys {
            let want = if k == key { 7777 } else { k / 10 };
            assert_eq!(s.get(k).unwrap(), Some(want), "key {k}");
        }
    }
}
