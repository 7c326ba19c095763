//! [`KvClient`]: a compute node of the store — its own engine, the cached
//! hierarchy and models shared by every thread of the process. Its reads
//! go through the I/O layer in `io` (doorbell batches), as its sessions' do.
//!
//! Connecting reads, with one-sided READs only: the superblock (checked,
//! including its layout version), the leaf-region header, the topology
//! blob (every model's first key and directory slot, from which the
//! locator's upper levels are fitted; `rolex_core::layout::topology`), and
//! every model's record with its tables. Nothing is ever written at
//! connect time, so a client that refuses a pool leaves it untouched.
//!
//! The set of models grows while the store runs (the memory node cuts a
//! model grown too large into several): a session that finds the model
//! its cached topology names for a key not covering that key reads the
//! topology again (`ClientShared::refresh_topology`), and a model it has
//! not cached yet is read when first needed.

use std::sync::atomic::{
    AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rolex_core::entry::LockOwner;
use rolex_core::layout::topology;
use rolex_core::layout::{
    LayoutError, LeafRegion, LeafRegionHeader, ModelRecord, Part, Superblock, LAYOUT_VERSION,
};
use rolex_core::model::Locator;
use rolex_core::wire::MrDesc;
use zerocopy::FromBytes;

use crate::cache::{clock_ns, ModelView};
use crate::error::{transfer, KvError};
use crate::held::{HeldLocks, StripeUse};
use crate::io::Io;
use crate::lease::{LeaseClient, LeaseFence};
use crate::pool_info::PoolInfo;
use crate::reaper::Posted;
use crate::redo::RedoLog;
use crate::session::KvSession;
use crate::stats::{KvStats, ModelBytes, SessionCounters};
use crate::values::ValueSpace;
use rolex_engine::engine::{EngineConfig, TransferEngine};

/// How a compute node connects.
#[derive(Clone, Debug, PartialEq)]
pub struct KvClientConfig {
    /// The client's own engine (a separate compute node on the fabric).
    pub engine: EngineConfig,
    /// Error bound of the upper levels that locate a model, in models.
    pub upper_epsilon: u64,
    /// Bytes of each session's registered read buffer (grown on demand).
    pub session_buffer: u64,
    /// How long an insert waits for a full SLT's retraining before it fails
    /// with [`KvError::SltFull`].
    pub slt_full_wait: Duration,
    /// Attempts an operation makes (lock contention, frozen model, torn
    /// leaves) before it fails with [`KvError::TooManyRetries`].
    pub max_attempts: u64,
    /// How long after a cached model record was last seen live a writer
    /// may still lock through it; an older view is refreshed first. The
    /// memory node reuses a retired record's space only after its grace
    /// period (`rolex_dpu::AgentConfig::record_grace`, 2 s by default),
    /// which must exceed this plus the longest a request stays in flight.
    /// It is also the longest a model fetch may take and still use a record
    /// retired under it (see `fetch_model`). 500 ms by default.
    pub model_max_age: Duration,
    /// The id every chain lock of this client carries: the one its memory
    /// node's lease handed out ([`super::lease::LeaseClient::owner`]), so
    /// the node can release them if this process dies holding them;
    /// [`LockOwner::ANONYMOUS`] for clients without a lease (in the memory
    /// node's process: they cannot die apart from it). Never
    /// [`LockOwner::AGENT`], the retraining agent's (refused at connect).
    pub lock_owner: LockOwner,
    /// The lease `lock_owner` names, if any: every write (lock `CAS`, data
    /// WRITE, unlock) is refused with [`KvError::LeaseExpired`] once it is
    /// not valid (see [`crate::lease`] for the timing). Set both with
    /// [`KvClientConfig::with_lease`].
    pub lease: Option<LeaseFence>,
}

impl KvClientConfig {
    /// This configuration with `lease`'s id on every chain lock and its
    /// validity checked before every write.
    pub fn with_lease(mut self, lease: &LeaseClient) -> Self {
        self.lock_owner = lease.owner();
        self.lease = Some(lease.fence());
        self
    }
}

impl Default for KvClientConfig {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            upper_epsilon: 4,
            session_buffer: 64 * 1024,
            slt_full_wait: Duration::from_secs(10),
            max_attempts: 1_000_000,
            model_max_age: Duration::from_millis(500),
            lock_owner: LockOwner::ANONYMOUS,
            lease: None,
        }
    }
}

/// What every session of a client shares.
pub(crate) struct ClientShared {
    pub(crate) pool: MrDesc,
    pub(crate) sb: Superblock,
    pub(crate) region: LeafRegion,
    pub(crate) ordered: bool,
    pub(crate) cfg: KvClientConfig,
    /// The models' key ranges as last read.
    pub(crate) topology: RwLock<Arc<Topology>>,
    /// Bumped each time `topology` is replaced (sessions keep a copy while
    /// it does not move).
    pub(crate) topology_version: AtomicU64,
    /// Cached models, by directory slot (`None`: not read yet).
    pub(crate) models: Vec<RwLock<Option<Arc<ModelView>>>>,
    /// Bumped each time a model's view is installed, by directory slot
    /// (sessions keep a copy while it does not move).
    pub(crate) model_versions: Vec<AtomicU64>,
    pub(crate) sessions: Mutex<Vec<Arc<SessionCounters>>>,
    /// Leaf numbers drawn for a split that found its SLT full and could
    /// not give them back: the next split takes one instead of drawing.
    spare_leaves: Mutex<Vec<u64>>,
    // Sessions hold channels of this engine.
    pub(crate) engine: TransferEngine,
    /// Dropped after the engine (see its `Drop`).
    pub(crate) held: Arc<HeldLocks>,
    /// The redo block this client claimed, if any (module `redo`).
    pub(crate) redo: Option<Arc<RedoLog>>,
    /// Each live session's posted unlocks (`KvSession::pending`): a lock
    /// that meets one of them failed settles it, whichever session posted
    /// it (module `session::lock`), and the client's reaper releases them
    /// while every session is idle (module `reaper`).
    pub(crate) posted: Arc<Posted>,
    /// The client's handles: its `KvClient` clones and its sessions (the
    /// reaper's included; not the session `close` uses). The drop that
    /// takes it to 0 is the last handle's, and closes the client.
    pub(crate) handles: AtomicUsize,
    /// Where this client's out-of-line values go.
    pub(crate) values: ValueSpace,
    /// The stripes of this pool's locks in this process (module `held`);
    /// last, so released after everything that may count in them.
    pub(crate) stripes: StripeUse,
}

/// Which model serves which key range, as a client caches it: the
/// locator over the models' first keys and each one's directory slot.
#[derive(Debug)]
pub(crate) struct Topology {
    pub(crate) epoch: u64,
    pub(crate) locator: Locator,
    pub(crate) ids: Vec<u64>,
}

impl Topology {
    /// The directory slot of the model that serves `key`.
    pub(crate) fn route(&self, key: u64) -> usize {
        self.ids
            .get(self.locator.locate(key))
            .map_or(0, |&id| id as usize)
    }
}

/// Reads of a topology blob that did not decode (the superblock's words
/// met half-updated, or the blob reused) before a client gives up.
const TOPOLOGY_TRIES: u32 = 100;

/// Reads the topology the superblock names: its two words in one READ,
/// then the blob (see `rolex_core::layout::topology`), again while what
/// was read does not decode.
pub(crate) fn read_topology(
    io: &mut Io,
    pool: &MrDesc,
    sb: &Superblock,
    upper_epsilon: u64,
) -> Result<Topology, KvError> {
    let region = (
        sb.model_region_offset(),
        sb.model_region_offset() + sb.model_region_len(),
    );
    let mut last = (
        0,
        0,
        LayoutError::TooShort {
            part: Part::UpperLevels,
            needed: topology::HEADER_SIZE,
            found: 0,
        },
    );
    for attempt in 0..TOPOLOGY_TRIES {
        if attempt > 0 {
            std::thread::sleep(Duration::from_micros(50));
        }
        let words = io.read_bytes(
            pool,
            Superblock::UPPER_OFFSET_OFFSET,
            16,
            "reading the topology's place",
        )?;
        let word = |i: usize| u64::from_le_bytes(words[i..i + 8].try_into().unwrap_or([0; 8]));
        let (offset, len) = (word(0), word(8));
        let inside = offset >= region.0
            && offset.checked_add(len).is_some_and(|end| end <= region.1)
            && len >= topology::HEADER_SIZE;
        if !inside {
            last = (
                offset,
                len,
                LayoutError::TooShort {
                    part: Part::UpperLevels,
                    needed: topology::HEADER_SIZE,
                    found: len,
                },
            );
            continue;
        }
        let blob = io.read_bytes(pool, offset, len, "reading the topology")?;
        match topology::decode(&blob, sb.directory_capacity()) {
            Ok(t) => {
                let locator =
                    Locator::new(t.first_keys, upper_epsilon).map_err(KvError::Locator)?;
                return Ok(Topology {
                    epoch: t.epoch,
                    locator,
                    ids: t.ids,
                });
            }
            Err(e) => last = (offset, len, e),
        }
    }
    Err(KvError::Topology {
        offset: last.0,
        len: last.1,
        error: last.2,
    })
}

impl ClientShared {
    /// Model `m`'s cached view, if it was read.
    pub(crate) fn view(&self, m: usize) -> Option<Arc<ModelView>> {
        self.models
            .get(m)?
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn install(&self, m: usize, v: ModelView) {
        if let Some(slot) = self.models.get(m) {
            *slot.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(v));
            if let Some(version) = self.model_versions.get(m) {
                version.fetch_add(1, Release);
            }
        }
    }

    /// The topology as cached.
    pub(crate) fn topology(&self) -> Arc<Topology> {
        self.topology
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the topology again and keeps it if it is newer.
    pub(crate) fn refresh_topology(&self, io: &mut Io) -> Result<(), KvError> {
        let t = read_topology(io, &self.pool, &self.sb, self.cfg.upper_epsilon)?;
        let mut g = self.topology.write().unwrap_or_else(|e| e.into_inner());
        if t.epoch > g.epoch {
            *g = Arc::new(t);
            self.topology_version.fetch_add(1, Release);
        }
        Ok(())
    }

    /// A spare leaf number, if the client keeps one.
    pub(crate) fn take_spare_leaf(&self) -> Option<u64> {
        self.spare_leaves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
    }

    /// Keeps leaf number `leaf_no` (drawn, never written) for a later
    /// split.
    pub(crate) fn keep_spare_leaf(&self, leaf_no: u64) {
        self.spare_leaves
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(leaf_no);
    }
}

/// A compute node's handle (see the module docs). Cheap to clone; open one
/// [`KvSession`] per thread.
///
/// What a compute node does with a memory node's [`PoolInfo`] (from
/// `MemoryNode::pool` in `rolex-memnode` in one process, or from
/// `PoolInfo::from_offer` (feature `libfabric`) over the bootstrap
/// connection between processes; the example of `rolex-memnode`'s
/// `MemoryNode::start` runs this end to end):
///
/// ```
/// use rolex_kv::{KvClient, KvClientConfig, KvError, PoolInfo};
///
/// fn put_and_read(pool: &PoolInfo) -> Result<(), KvError> {
///     let client = KvClient::connect(KvClientConfig::default(), pool)?;
///     let mut session = client.session()?;
///     assert_eq!(session.insert(7, 70)?, None, "a new key");
///     assert_eq!(session.get(7)?, Some(70));
///     Ok(())
/// }
/// ```
pub struct KvClient {
    shared: Arc<ClientShared>,
}

impl Clone for KvClient {
    fn clone(&self) -> Self {
        self.shared.handles.fetch_add(1, Relaxed);
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for KvClient {
    fn drop(&mut self) {
        // The last handle: no session can take or free a block any more.
        // A lock maybe held goes to the client's reaper first, which
        // closes the client once it released it (module `reaper`).
        if self.shared.let_go() && !Posted::adopt(&self.shared) {
            if let Ok(mut s) = KvSession::uncounted(self.shared.clone()) {
                s.close_for_good();
            }
        }
    }
}

impl ClientShared {
    /// Counts a handle dropped; `true` for the last one (exactly one drop
    /// sees it, however many drop at once).
    pub(crate) fn let_go(&self) -> bool {
        self.handles.fetch_sub(1, AcqRel) == 1
    }
}

impl std::fmt::Debug for KvClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvClient")
            .field("models", &self.shared.topology().ids.len())
            .field("ordered", &self.shared.ordered)
            .finish()
    }
}

impl KvClient {
    /// Connects a new compute node (with its own engine) to `pool`.
    pub fn connect(cfg: KvClientConfig, pool: &PoolInfo) -> Result<Self, KvError> {
        if pool.layout_version != LAYOUT_VERSION {
            return Err(KvError::LayoutVersion {
                found: pool.layout_version,
                expected: LAYOUT_VERSION,
            });
        }
        if cfg.session_buffer < 4096 {
            return Err(KvError::BadConfig {
                field: "session_buffer",
                reason: "must be at least 4096 bytes",
            });
        }
        if cfg.lock_owner == LockOwner::AGENT {
            return Err(KvError::BadConfig {
                field: "lock_owner",
                reason: "the retraining agent's id; a compute node's locks name a lease or none",
            });
        }
        if cfg
            .lease
            .as_ref()
            .is_some_and(|l| l.owner() != cfg.lock_owner)
        {
            return Err(KvError::BadConfig {
                field: "lease",
                reason: "fences a lease other than the one lock_owner names",
            });
        }
        if cfg.max_attempts == 0 {
            return Err(KvError::BadConfig {
                field: "max_attempts",
                reason: "must be at least 1",
            });
        }
        let engine = TransferEngine::new(cfg.engine.clone())
            .map_err(transfer("starting the client's engine"))?;
        let mut io = Io::new(&engine, cfg.session_buffer, cfg.lease.clone())?;
        // A lease may come with a key to the pool of its own, which the
        // memory node closes when the lease ends there.
        let desc = &cfg
            .lease
            .as_ref()
            .and_then(LeaseFence::pool)
            .unwrap_or(&pool.desc)
            .clone();
        let head = io.read_bytes(desc, 0, Superblock::SIZE, "reading the superblock")?;
        // Check the version word first, so a pool of another version is
        // named as such whatever else changed.
        let version = u32::from_le_bytes(head[8..12].try_into().unwrap_or([0; 4]));
        if version != LAYOUT_VERSION {
            return Err(KvError::LayoutVersion {
                found: version,
                expected: LAYOUT_VERSION,
            });
        }
        let sb = Superblock::read(&head)?;
        if sb.pool_size() > desc.len {
            return Err(KvError::PoolTooSmall {
                described: sb.pool_size(),
                registered: desc.len,
            });
        }
        let lrh = io.read_bytes(
            desc,
            sb.leaf_region_offset(),
            LeafRegionHeader::SIZE,
            "reading the leaf-region header",
        )?;
        let header =
            LeafRegionHeader::read_from_bytes(&lrh).map_err(|_| LayoutError::TooShort {
                part: Part::LeafRegion,
                needed: LeafRegionHeader::SIZE,
                found: lrh.len() as u64,
            })?;
        let region = header.check(&sb.leaf_region()?)?;
        let values = ValueSpace::new(sb.value_region()?);
        let topology = read_topology(&mut io, desc, &sb, cfg.upper_epsilon)?;
        let views: Vec<RwLock<Option<Arc<ModelView>>>> = (0..sb.directory_capacity())
            .map(|_| RwLock::new(None))
            .collect();
        for &m in &topology.ids {
            let v = fetch_model(
                &mut io,
                desc,
                &sb,
                m,
                FetchPlan::new(cfg.model_max_age, None),
            )?;
            *views[m as usize].write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(v));
        }
        let ordered = engine.ordered();
        let held = Arc::new(HeldLocks::default());
        // The last READ or CAS of the connect: nothing after it fails, so
        // a block claimed is a block this client will free.
        let redo = if engine.writes_ordered() {
            RedoLog::claim(&mut io, desc, &sb, cfg.lock_owner, held.clone())?.map(Arc::new)
        } else {
            None
        };
        let shared = ClientShared {
            pool: desc.clone(),
            sb,
            region,
            ordered,
            cfg,
            topology: RwLock::new(Arc::new(topology)),
            topology_version: AtomicU64::new(0),
            model_versions: (0..sb.directory_capacity())
                .map(|_| AtomicU64::new(0))
                .collect(),
            models: views,
            sessions: Mutex::new(Vec::new()),
            spare_leaves: Mutex::new(Vec::new()),
            engine,
            held,
            redo,
            posted: Arc::default(),
            handles: AtomicUsize::new(1),
            values,
            stripes: StripeUse::of(desc),
        };
        drop(io);
        Ok(Self {
            shared: Arc::new(shared),
        })
    }

    /// A session for one thread: its own queue pair and buffers over the
    /// shared cache.
    pub fn session(&self) -> Result<KvSession, KvError> {
        KvSession::new(self.shared.clone())
    }

    /// Gives the value space this client holds free (blocks it freed, the
    /// rest of its chunks) back to the pool's free stack, where any client
    /// takes it before claiming new space; returns the bytes given back
    /// (0, with no round trip, when it holds none). Sessions may go on:
    /// what they free later is this client's again.
    ///
    /// Dropping the last handle on a client (the client, its clones and
    /// its sessions) does this too, ignoring errors (while a lock is
    /// maybe held, the client's reaper does it once it released that
    /// lock, or gave up after 30 s); a client whose memory
    /// node is gone should [`Self::abandon_values`] first, or the drop
    /// waits for the engine's operation timeout. On an error, space whose
    /// give-back certainly did not land is still this client's, and space
    /// whose give-back may have landed is neither this client's nor
    /// reused (see the `values` module).
    pub fn close(&self) -> Result<u64, KvError> {
        if self.shared.values.usage().1 == 0 {
            return Ok(0);
        }
        // Not a handle: its drop is not a last handle's.
        KvSession::uncounted(self.shared.clone())?.give_back_all_values()
    }

    /// Forgets the value space this client holds free without giving it
    /// back, and its redo block without freeing it (its memory node is
    /// gone): dropping the client then costs no round trip.
    pub fn abandon_values(&self) {
        drop(self.shared.values.take_all());
        if let Some(redo) = &self.shared.redo {
            redo.abandon();
        }
    }

    /// Whether this client's leaf writes go out behind a whole copy in
    /// the pool's redo log, so the memory node can write a leaf torn by a
    /// death again (module `redo` of this crate; `rolex_core::layout::
    /// redo`): where the fabric places a peer's writes in posting order,
    /// the pool has a redo log, and one of its blocks was free when this
    /// client connected. Leaf writes that found no free slot of the
    /// block went out alone (`KvStats::redo_unlogged`).
    pub fn redo_logged(&self) -> bool {
        self.shared.redo.is_some()
    }

    /// Whether the client's fabric keeps posting order (2-RTT writes) or
    /// not (3-RTT writes).
    pub fn ordered(&self) -> bool {
        self.shared.ordered
    }

    /// Chain locks this client may still hold: a lock or release of one
    /// of its sessions failed without saying whether it landed, and no
    /// later operation has released it yet (each operation, and
    /// [`KvSession::flush`], tries; see [`KvError::LockMaybeHeld`]).
    pub fn locks_maybe_held(&self) -> usize {
        self.shared.held.count()
    }

    /// Models in the pool, as this client last read its topology.
    pub fn model_count(&self) -> u64 {
        self.shared.topology().ids.len() as u64
    }

    /// The client's engine.
    pub fn engine(&self) -> &TransferEngine {
        &self.shared.engine
    }

    /// Bytes the client caches (see [`ModelBytes`]).
    pub fn model_bytes(&self) -> ModelBytes {
        let t = self.shared.topology();
        let ids = t.ids.len() as u64 * 8;
        let (mut total, mut learned) = (t.locator.cached_bytes() + ids, t.locator.learned_bytes());
        for m in 0..self.shared.models.len() {
            if let Some(v) = self.shared.view(m) {
                let (t, l) = v.bytes();
                total += t;
                learned += l;
            }
        }
        ModelBytes { total, learned }
    }

    /// Every session's counters summed, with the engine's.
    pub fn stats(&self) -> KvStats {
        let mut s = KvStats::default();
        for c in self
            .shared
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            c.add_into(&mut s);
        }
        s.engine = self.shared.engine.counters().total;
        s.locks_maybe_held = self.shared.held.count() as u64;
        s.locks_released_late = self.shared.held.resolved();
        s.value_space = self.shared.values.usage();
        s.model_bytes = self.model_bytes();
        if let Some(redo) = &self.shared.redo {
            s.redo_logged = redo.logged();
            s.redo_unlogged = redo.unlogged();
        }
        s
    }
}

/// How [`fetch_model`] reads a model's record.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FetchPlan {
    /// `KvClientConfig::model_max_age` in nanoseconds: the longest a fetch
    /// may take and still use a record that was retired under it.
    pub(crate) max_age_ns: u64,
    /// Bytes of the model's record as last cached (0: none): the record's
    /// first READ takes this much and an eighth more, so a record that did
    /// not grow by more comes whole in that READ.
    pub(crate) len_hint: u64,
}

impl FetchPlan {
    /// The plan for a model whose cached view (if any) is `cached`.
    pub(crate) fn new(max_age: Duration, cached: Option<&ModelView>) -> Self {
        Self {
            max_age_ns: u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX),
            len_hint: cached.map_or(0, |v| v.record.total_len().unwrap_or(0)),
        }
    }

    /// Bytes the first READ of a record at `at` takes: the header, or the
    /// hinted length with slack (256 bytes: 16 more training leaves), as
    /// far as the model region goes.
    fn first_len(&self, at: u64, sb: &Superblock) -> u64 {
        if self.len_hint == 0 {
            return ModelRecord::SIZE;
        }
        let end = sb.model_region_offset() + sb.model_region_len();
        let want = self.len_hint + self.len_hint / 8 + 256;
        want.min(end.saturating_sub(at)).max(ModelRecord::SIZE)
    }
}

/// Tries [`fetch_model`] makes before it gives up.
const FETCH_TRIES: u64 = 1000;

/// Reads model `m`'s current record and tables: the directory word, then
/// the record it names — with its tables in the same READ when
/// `plan.len_hint` covers them, else in a second READ. 2 round trips for a
/// model whose record did not grow since it was cached, 3 otherwise.
///
/// A record found **retired** by the time it is read (the agent retrained
/// the model during the fetch) is used as it was read, provided the whole
/// try took at most `model_max_age` from `t0`, the clock before the
/// directory READ. Before, the fetch read the directory again, and a model
/// retrained faster than a fetch's round trips was never fetched (every
/// try found its record retired). Why such a view is safe:
/// - its bytes are the record's own: the directory named it during the
///   directory READ, and the agent retires a record only after the
///   directory names its successor, so it was retired after `t0`; its
///   space is reused only `record_grace` after that, and the grace
///   exceeds `model_max_age` (`KvClientConfig::model_max_age`), so every
///   byte read landed first. Each READ's header must also name `m` and the
///   generation of the first (a record read past its reuse does not);
/// - a retired record is a model not retrained since, which still finds
///   every key (design §5.2), and every operation notices it is stale (its
///   batch's directory word no longer names it) and refreshes;
/// - the view counts as seen live at `t0` (it was live then or later), so
///   writers lock through it only within `model_max_age` of `t0`, as the
///   grace allows for, and no writer writes through it: a retired record's
///   LT entries stay locked by the agent until its space is reused, and a
///   lock's batch reads the record's state word and refreshes on
///   `RETIRED`.
///
/// A record read live in its last READ is dated from the clock before that
/// READ, as before. Fails with [`KvError::ModelFetchStarved`] when every
/// try found the record retired (or reused) and took longer than
/// `model_max_age`.
pub(crate) fn fetch_model(
    io: &mut Io,
    pool: &MrDesc,
    sb: &Superblock,
    m: u64,
    plan: FetchPlan,
) -> Result<ModelView, KvError> {
    let dir = sb.directory_entry_offset(m)?;
    let (mut retired, mut reused) = (0, 0);
    for _ in 0..FETCH_TRIES {
        let t0 = clock_ns();
        let at = io.read_u64(pool, dir, "reading a directory word")?;
        let mut seen = clock_ns();
        let mut bytes =
            io.read_bytes(pool, at, plan.first_len(at, sb), "reading a model record")?;
        let head = ModelRecord::read(&bytes)?;
        let in_time = |now: u64| now.saturating_sub(t0) <= plan.max_age_ns;
        if head.model_id() != m {
            // Another model's record: the space was reused since the
            // directory READ (only past the grace) and the directory
            // names this model's newer record.
            reused += 1;
            continue;
        }
        head.check(at, sb)?;
        let total = head.total_len()?;
        if (bytes.len() as u64) < total {
            if head.state().is_retired() && !in_time(clock_ns()) {
                retired += 1;
                continue;
            }
            seen = clock_ns();
            bytes = io.read_bytes(pool, at, total, "reading a model's tables")?;
        }
        let done = clock_ns();
        let v = ModelView::parse(at, &bytes, sb)?;
        let state = v.record.state();
        if v.record.model_id() != m || state.generation() != head.state().generation() {
            // Reused between the two READs.
            reused += 1;
            continue;
        }
        if state.is_retired() {
            if !in_time(done) {
                retired += 1;
                continue;
            }
            seen = t0;
        }
        v.seen_live(seen);
        return Ok(v);
    }
    Err(KvError::ModelFetchStarved {
        model: m,
        tries: FETCH_TRIES,
        retired,
        reused,
        max_age: Duration::from_nanos(plan.max_age_ns),
    })
}
