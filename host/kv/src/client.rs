//! [`KvClient`]: a compute node of the store — its own engine, the cached
//! hierarchy and models shared by every thread of the process — and the
//! I/O layer its sessions post doorbell batches through.
//!
//! Connecting reads, with one-sided READs only: the superblock (checked,
//! including its layout version), the leaf-region header, the upper blob
//! (every model's first key, from which the locator's upper levels are
//! fitted), and every model's record with its tables. Nothing is ever
//! written at connect time, so a client that refuses a pool leaves it
//! untouched.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rolex_core::entry::LockOwner;
use rolex_core::layout::{LeafRegion, LeafRegionHeader, ModelRecord, Superblock, LAYOUT_VERSION};
use rolex_core::wire::{Access, MrDesc};
use zerocopy::FromBytes;

use crate::cache::{Locator, ModelView};
use crate::error::{transfer, KvError};
use crate::pool_info::PoolInfo;
use crate::session::KvSession;
use crate::stats::{KvStats, ModelBytes, OpStats, SessionCounters};
use rolex_engine::batch::{BatchOp, Channel};
use rolex_engine::engine::{EngineConfig, TransferEngine};
use rolex_engine::MrHandle;
use rolex_engine::TransferError;

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
    /// The id this client's chain locks carry: the one its memory node's
    /// lease handed out ([`super::lease::LeaseClient::owner`]), so the node
    /// can release them if this process dies holding them;
    /// [`LockOwner::ANONYMOUS`] for clients without a lease (in-process).
    pub lock_owner: LockOwner,
}

impl Default for KvClientConfig {
    fn default() -> Self {
        Self {
            engine: EngineConfig::default(),
            upper_epsilon: 4,
            session_buffer: 64 * 1024,
            slt_full_wait: Duration::from_secs(10),
            max_attempts: 1_000_000,
            lock_owner: LockOwner::ANONYMOUS,
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
    pub(crate) locator: Locator,
    pub(crate) models: Vec<RwLock<Arc<ModelView>>>,
    pub(crate) sessions: Mutex<Vec<Arc<SessionCounters>>>,
    // Last: sessions hold channels of this engine.
    pub(crate) engine: TransferEngine,
}

impl ClientShared {
    pub(crate) fn view(&self, m: usize) -> Arc<ModelView> {
        self.models[m]
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn install(&self, m: usize, v: ModelView) {
        *self.models[m].write().unwrap_or_else(|e| e.into_inner()) = Arc::new(v);
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
#[derive(Clone)]
pub struct KvClient {
    shared: Arc<ClientShared>,
}

impl std::fmt::Debug for KvClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvClient")
            .field("models", &self.shared.models.len())
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
        if cfg.max_attempts == 0 {
            return Err(KvError::BadConfig {
                field: "max_attempts",
                reason: "must be at least 1",
            });
        }
        let engine = TransferEngine::new(cfg.engine.clone())
            .map_err(transfer("starting the client's engine"))?;
        let mut io = Io::new(&engine, cfg.session_buffer)?;
        let desc = &pool.desc;
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
            return Err(KvError::Inconsistent {
                what: "the superblock describes a pool larger than the registered region",
                model: 0,
            });
        }
        let lrh = io.read_bytes(
            desc,
            sb.leaf_region_offset(),
            LeafRegionHeader::SIZE,
            "reading the leaf-region header",
        )?;
        let header =
            LeafRegionHeader::read_from_bytes(&lrh).map_err(|_| KvError::Inconsistent {
                what: "leaf-region header unreadable",
                model: 0,
            })?;
        let region = header.check(&sb.leaf_region()?)?;
        let models = sb.model_count();
        if models == 0 || sb.upper_len() != models * 8 {
            return Err(KvError::Inconsistent {
                what: "the upper blob does not hold one first key per model",
                model: 0,
            });
        }
        let blob = io.read_bytes(
            desc,
            sb.upper_offset(),
            sb.upper_len(),
            "reading the upper levels",
        )?;
        let firsts: Vec<u64> = blob
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        if firsts.first() != Some(&0) || firsts.windows(2).any(|w| w[0] >= w[1]) {
            return Err(KvError::Inconsistent {
                what: "model first keys are not increasing from 0",
                model: 0,
            });
        }
        let locator =
            Locator::new(firsts, cfg.upper_epsilon).map_err(|_| KvError::Inconsistent {
                what: "model first keys cannot be fitted",
                model: 0,
            })?;
        let mut views = Vec::with_capacity(models as usize);
        for m in 0..models {
            views.push(RwLock::new(Arc::new(fetch_model(&mut io, desc, &sb, m)?)));
        }
        let ordered = engine.ordered();
        let shared = ClientShared {
            pool: desc.clone(),
            sb,
            region,
            ordered,
            cfg,
            locator,
            models: views,
            sessions: Mutex::new(Vec::new()),
            engine,
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

    /// Whether the client's fabric keeps posting order (2-RTT writes) or
    /// not (3-RTT writes).
    pub fn ordered(&self) -> bool {
        self.shared.ordered
    }

    /// Models in the pool.
    pub fn model_count(&self) -> u64 {
        self.shared.models.len() as u64
    }

    /// The client's engine.
    pub fn engine(&self) -> &TransferEngine {
        &self.shared.engine
    }

    /// Bytes the client caches (see [`ModelBytes`]).
    pub fn model_bytes(&self) -> ModelBytes {
        let (mut total, mut learned) = self.shared.locator.bytes();
        for m in 0..self.shared.models.len() {
            let (t, l) = self.shared.view(m).bytes();
            total += t;
            learned += l;
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
        s.model_bytes = self.model_bytes();
        s
    }
}

/// Reads model `m`'s current record and tables.
pub(crate) fn fetch_model(
    io: &mut Io,
    pool: &MrDesc,
    sb: &Superblock,
    m: u64,
) -> Result<ModelView, KvError> {
    let dir = sb.directory_entry_offset(m)?;
    for _ in 0..1000 {
        let at = io.read_u64(pool, dir, "reading a directory word")?;
        let head = io.read_bytes(pool, at, ModelRecord::SIZE, "reading a model record")?;
        let r = ModelRecord::read(&head)?;
        r.check(at, sb)?;
        if r.model_id() != m {
            return Err(KvError::Inconsistent {
                what: "the directory names a record of another model",
                model: m,
            });
        }
        if r.state().is_retired() {
            // The directory was switched before the record was retired, so
            // re-reading it finds the successor.
            continue;
        }
        let bytes = io.read_bytes(pool, at, r.total_len()?, "reading a model's tables")?;
        return Ok(ModelView::parse(at, &bytes, sb)?);
    }
    Err(KvError::Inconsistent {
        what: "the directory keeps naming a retired record",
        model: m,
    })
}

/// One operation of a doorbell batch, by pool and local offsets.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    /// READ `len` pool bytes at `remote` into the read buffer at `local`.
    Read { remote: u64, local: u64, len: u64 },
    /// WRITE `len` bytes of the write buffer at `local` to the pool.
    Write { remote: u64, local: u64, len: u64 },
    /// CAS on the pool word at `remote`.
    Cas {
        remote: u64,
        expected: u64,
        new: u64,
    },
    /// FAA on the pool word at `remote`.
    Faa { remote: u64, add: u64 },
}

/// A session's queue pair and registered buffers, counting what it posts.
pub(crate) struct Io {
    ch: Channel,
    rbuf: MrHandle,
    wbuf: MrHandle,
    results: Vec<Result<u64, TransferError>>,
    values: Vec<u64>,
    /// What the current operation has cost so far.
    pub(crate) cur: OpStats,
}

impl Io {
    pub(crate) fn new(engine: &TransferEngine, cap: u64) -> Result<Self, KvError> {
        let ch = engine.channel().map_err(transfer("opening a channel"))?;
        let (rbuf, _) = engine
            .alloc_mr(cap, Access::LOCAL_WRITE)
            .map_err(transfer("registering a session buffer"))?;
        let (wbuf, _) = engine
            .alloc_mr(cap, Access::LOCAL_WRITE)
            .map_err(transfer("registering a session buffer"))?;
        Ok(Self {
            ch,
            rbuf,
            wbuf,
            results: Vec::new(),
            values: Vec::new(),
            cur: OpStats::default(),
        })
    }

    /// Bytes the read buffer holds.
    pub(crate) fn read_cap(&self) -> u64 {
        self.rbuf.len()
    }

    /// Posts `ops` as one doorbell batch and waits: one dependent round
    /// trip. Returns each op's value (old word of an atomic, else 0).
    pub(crate) fn run(
        &mut self,
        pool: &MrDesc,
        ops: &[Op],
        during: &'static str,
    ) -> Result<&[u64], KvError> {
        let mut batch = Vec::with_capacity(ops.len());
        for op in ops {
            batch.push(match *op {
                Op::Read { remote, local, len } => {
                    self.cur.bytes_read += len;
                    BatchOp::Read {
                        dst: &self.rbuf,
                        dst_offset: local,
                        src: pool,
                        src_offset: remote,
                        len,
                    }
                }
                Op::Write { remote, local, len } => {
                    self.cur.bytes_written += len;
                    BatchOp::Write {
                        src: &self.wbuf,
                        src_offset: local,
                        dst: pool,
                        dst_offset: remote,
                        len,
                        imm: None,
                    }
                }
                Op::Cas {
                    remote,
                    expected,
                    new,
                } => {
                    self.cur.atomics += 1;
                    BatchOp::Cas {
                        dst: pool,
                        offset: remote,
                        expected,
                        new,
                    }
                }
                Op::Faa { remote, add } => {
                    self.cur.atomics += 1;
                    BatchOp::Faa {
                        dst: pool,
                        offset: remote,
                        add,
                    }
                }
            });
        }
        self.cur.rtts += 1;
        self.ch
            .run(&batch, &mut self.results)
            .map_err(transfer(during))?;
        self.values.clear();
        for r in self.results.drain(..) {
            self.values.push(r.map_err(transfer(during))?);
        }
        Ok(&self.values)
    }

    /// Copies read-buffer bytes `[local, local + out.len())` into `out`.
    pub(crate) fn local(&self, local: u64, out: &mut [u8]) -> Result<(), KvError> {
        self.rbuf
            .read(local, out)
            .map_err(transfer("reading a session buffer"))
    }

    /// The little-endian word at `local` in the read buffer.
    pub(crate) fn local_u64(&self, local: u64) -> Result<u64, KvError> {
        let mut b = [0u8; 8];
        self.local(local, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Stages `bytes` in the write buffer at `local`.
    pub(crate) fn stage(&self, local: u64, bytes: &[u8]) -> Result<(), KvError> {
        self.wbuf
            .write(local, bytes)
            .map_err(transfer("filling a session buffer"))
    }

    /// Reads `len` pool bytes at `remote`: one round trip per read-buffer
    /// size.
    pub(crate) fn read_bytes(
        &mut self,
        pool: &MrDesc,
        remote: u64,
        len: u64,
        during: &'static str,
    ) -> Result<Vec<u8>, KvError> {
        let cap = self.rbuf.len();
        let mut out = vec![0u8; len as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(cap);
            self.run(
                pool,
                &[Op::Read {
                    remote: remote + done,
                    local: 0,
                    len: n,
                }],
                during,
            )?;
            self.local(0, &mut out[done as usize..(done + n) as usize])?;
            done += n;
        }
        Ok(out)
    }

    /// Reads one pool word.
    pub(crate) fn read_u64(
        &mut self,
        pool: &MrDesc,
        remote: u64,
        during: &'static str,
    ) -> Result<u64, KvError> {
        self.run(
            pool,
            &[Op::Read {
                remote,
                local: 0,
                len: 8,
            }],
            during,
        )?;
        self.local_u64(0)
    }
}
