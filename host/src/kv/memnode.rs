//! [`MemoryNode`]: the memory node of the store on this process's fabric —
//! an engine of its own that registers the pool, bulk-loads it, and drives
//! the `rolex-dpu` retraining agent from a thread that parks when idle.
//!
//! The agent reaches the pool through [`HostPool`], whose 8-byte atomics are
//! the very `AtomicU64` words the loopback NIC's remote `CAS`/`FAA` use, so
//! the agent's freeze races correctly with compute nodes' locks. The thread
//! never sits on the data path: compute nodes only use one-sided verbs.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rolex_core::layout::{ModelRecord, LAYOUT_VERSION};
use rolex_core::wire::{Access, MrDesc};
use rolex_dpu::{
    Agent, AgentConfig, AgentError, AgentStats, BulkConfig, BulkPlan, MemError, PoolMemory,
    Prepared, RetrainReport,
};

use super::error::{transfer, KvError};
use crate::engine::{EngineConfig, TransferEngine};
use crate::region::MrHandle;

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
    /// leaves (see `rolex_dpu::train`).
    pub epsilon: u64,
    /// Most training leaves a bulk-loaded model has.
    pub max_model_leaves: u64,
    /// Leaf capacity for synonym leaves, as a fraction of the loaded leaves
    /// (plus a fixed 1024).
    pub spare_leaf_factor: f64,
    /// Bytes of model region for the records retraining builds (retired
    /// records are not reused); `None`: 16 times the loaded records plus
    /// 4 MiB.
    pub model_region_spare: Option<u64>,
    /// SLT slots used that make the agent retrain a model (compute nodes
    /// enqueue at 128 regardless).
    pub retrain_trigger: u64,
    /// Run the retraining thread (`false`: retrain only through
    /// [`MemoryNode::poll_once`] / [`MemoryNode::retrain_now`], for tests
    /// that interleave retraining deliberately).
    pub retraining_thread: bool,
    /// Longest park of the idle retraining thread.
    pub idle_park: Duration,
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
            retrain_trigger: 128,
            retraining_thread: true,
            idle_park: Duration::from_millis(2),
        }
    }
}

/// What a compute node needs to connect: the pool's descriptor and the
/// layout version it was built with.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolInfo {
    /// The registered pool (read, write and atomic rights).
    pub desc: MrDesc,
    /// The pool's layout version.
    pub layout_version: u32,
}

/// The memory node's figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNodeStats {
    /// The agent's counters (retrains, keys retrained, freeze times…).
    pub agent: AgentStats,
    /// Models (directory slots).
    pub models: u64,
    /// Keys bulk-loaded.
    pub keys_loaded: u64,
    /// Leaves bulk-loaded.
    pub leaves_loaded: u64,
    /// Leaves allocated so far (`alloc_num`).
    pub leaves_allocated: u64,
    /// Synonym leaves compute nodes created (`alloc_num` − loaded).
    pub synonym_leaves: u64,
    /// Leaves the region holds.
    pub leaf_capacity: u64,
    /// Bytes of the pool.
    pub pool_bytes: u64,
    /// Retrainings that failed (the last error is kept by the node).
    pub agent_errors: u64,
}

/// [`PoolMemory`] over a registered region (see the module docs).
pub struct HostPool {
    mr: MrHandle,
    epoch: Instant,
}

impl HostPool {
    fn word<T>(
        &self,
        offset: u64,
        f: impl FnOnce(&std::sync::atomic::AtomicU64) -> T,
    ) -> Result<T, MemError> {
        if offset.checked_add(8).map_or(true, |e| e > self.mr.len()) {
            return Err(MemError::OutOfBounds { offset, len: 8 });
        }
        let p = self.mr.as_ptr().wrapping_add(offset as usize);
        if (p as usize) % 8 != 0 {
            return Err(MemError::Misaligned { offset });
        }
        // SAFETY: `[p, p + 8)` is inside the region (checked above) and
        // 8-byte aligned. The region's memory was allocated by the engine
        // and is freed only when the last `Arc<Region>` goes, and `self.mr`
        // holds one, so it stays valid for this borrow. `AtomicU64` has the
        // size and alignment of `u64` and every bit pattern is valid; the
        // loopback NIC's remote CAS/FAA use `AtomicU64` on these same words,
        // so the agent's atomics are atomic with respect to them. (No region
        // guard per word: entering one bumps a counter every NIC operation
        // on the pool also bumps, and that cache line would bounce between
        // the agent and the compute nodes for every LT entry a freeze locks.)
        let w = unsafe { &*(p as *const std::sync::atomic::AtomicU64) };
        Ok(f(w))
    }
}

fn mem_err(offset: u64, len: u64) -> impl Fn(crate::error::TransferError) -> MemError {
    move |e| match e {
        crate::error::TransferError::RegionDeregistered => MemError::Unavailable,
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
        self.word(offset, |w| w.load(SeqCst))
    }
    fn store(&self, offset: u64, value: u64) -> Result<(), MemError> {
        self.word(offset, |w| w.store(value, SeqCst))
    }
    fn cas(&self, offset: u64, expected: u64, new: u64) -> Result<u64, MemError> {
        self.word(offset, |w| {
            match w.compare_exchange(expected, new, SeqCst, SeqCst) {
                Ok(v) | Err(v) => v,
            }
        })
    }
    fn faa(&self, offset: u64, add: u64) -> Result<u64, MemError> {
        self.word(offset, |w| w.fetch_add(add, SeqCst))
    }
    fn relax(&self, attempt: u32) {
        // Writers hold locks for microseconds; yield first, then nap.
        if attempt < 8 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(u64::from(attempt.min(1000))));
        }
    }
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

struct NodeShared {
    agent: Mutex<Agent<HostPool>>,
    stop: AtomicBool,
    errors: Mutex<(u64, Option<AgentError>)>,
    /// True while the retraining thread is inside one agent step.
    busy: AtomicBool,
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
    alloc_num_offset: u64,
    // Last: dropped after the thread is joined.
    engine: TransferEngine,
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
    pub fn start(cfg: MemoryNodeConfig, pairs: &[(u64, u64)]) -> Result<Self, KvError> {
        if !(cfg.fill > 0.0 && cfg.fill <= 1.0) {
            return Err(KvError::BadConfig {
                field: "fill",
                reason: "must be in (0, 1]",
            });
        }
        if !(cfg.spare_leaf_factor >= 0.0 && cfg.spare_leaf_factor.is_finite()) {
            return Err(KvError::BadConfig {
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
        };
        let probe = BulkPlan::new(&bulk, &keys)?;
        let records = probe.next_free() - probe.superblock().model_region_offset();
        bulk.model_region_spare = match cfg.model_region_spare {
            Some(n) => n,
            None => records.saturating_mul(16).saturating_add(4 << 20),
        };
        // Room for at least one retraining of the largest model.
        let one = ModelRecord::size_for(cfg.max_model_leaves + 255, cfg.max_model_leaves + 255)?;
        bulk.model_region_spare = bulk.model_region_spare.max(one);
        let plan = BulkPlan::new(&bulk, &keys)?;
        drop(keys);
        let engine = TransferEngine::new(cfg.engine.clone())
            .map_err(transfer("starting the memory node's engine"))?;
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_WRITE
            | Access::REMOTE_ATOMIC;
        let (mr, desc) = engine
            .alloc_mr(plan.pool_size(), access)
            .map_err(transfer("registering the pool"))?;
        let pool = HostPool {
            mr: mr.clone(),
            epoch: Instant::now(),
        };
        plan.write(&pool, pairs)?;
        let agent = Agent::attach(
            pool,
            AgentConfig {
                retrain_trigger: cfg.retrain_trigger,
            },
            plan.next_free(),
        )?;
        let region = plan.superblock().leaf_region()?;
        let shared = Arc::new(NodeShared {
            agent: Mutex::new(agent),
            stop: AtomicBool::new(false),
            errors: Mutex::new((0, None)),
            busy: AtomicBool::new(false),
        });
        let thread = if cfg.retraining_thread {
            let s = shared.clone();
            let park = cfg.idle_park;
            Some(
                std::thread::Builder::new()
                    .name("rolex-memnode-retrain".into())
                    .spawn(move || retrain_loop(&s, park))
                    .map_err(|_| KvError::BadConfig {
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
            mr,
            desc,
            plan_models: plan.model_count(),
            keys_loaded: plan.key_count(),
            leaves_loaded: plan.leaf_count(),
            leaf_capacity: region.capacity(),
            alloc_num_offset: region.alloc_num_offset(),
            engine,
        })
    }

    /// What compute nodes connect with.
    pub fn pool(&self) -> PoolInfo {
        PoolInfo {
            desc: self.desc.clone(),
            layout_version: LAYOUT_VERSION,
        }
    }

    /// The memory node's engine.
    pub fn engine(&self) -> &TransferEngine {
        &self.engine
    }

    /// The registered pool (for tests and inspection; compute nodes never
    /// use it).
    pub fn pool_handle(&self) -> &MrHandle {
        &self.mr
    }

    /// Models in the directory.
    pub fn model_count(&self) -> u64 {
        self.plan_models
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
        MemoryNodeStats {
            agent,
            models: self.plan_models,
            keys_loaded: self.keys_loaded,
            leaves_loaded: self.leaves_loaded,
            leaves_allocated: allocated.min(self.leaf_capacity),
            synonym_leaves: allocated
                .min(self.leaf_capacity)
                .saturating_sub(self.leaves_loaded),
            leaf_capacity: self.leaf_capacity,
            pool_bytes: self.mr.len(),
            agent_errors: errors,
        }
    }

    /// A view of the retraining thread's activity (see [`AgentActivity`]).
    pub fn activity(&self) -> AgentActivity {
        AgentActivity(self.shared.clone())
    }

    /// The last error the retraining thread met, if any.
    pub fn last_agent_error(&self) -> Option<AgentError> {
        self.shared
            .errors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
    }

    /// One step of the agent on the caller's thread: drain the CirQ and
    /// retrain the neediest due model.
    pub fn poll_once(&self) -> Result<Option<RetrainReport>, KvError> {
        Ok(self.agent().poll()?)
    }

    /// Retrains model `model` now, whatever its SLT count.
    pub fn retrain_now(&self, model: u64) -> Result<RetrainReport, KvError> {
        Ok(self.agent().retrain(model)?)
    }

    /// Retraining step 1 alone (walk and fit, nothing locked): with
    /// [`MemoryNode::install`], lets tests run compute-node operations
    /// between training and installation.
    pub fn prepare(&self, model: u64) -> Result<Prepared, KvError> {
        Ok(self.agent().prepare(model)?)
    }

    /// Retraining steps 2–6 for a prepared model: freeze, carry over the
    /// leaves created since [`MemoryNode::prepare`], switch, retire.
    pub fn install(&self, prepared: Prepared) -> Result<RetrainReport, KvError> {
        Ok(self.agent().install(prepared)?)
    }

    /// SLT slots model `model` has used.
    pub fn slt_used(&self, model: u64) -> Result<u64, KvError> {
        Ok(self.agent().slt_used(model)?)
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
    while !s.stop.load(SeqCst) {
        s.busy.store(true, SeqCst);
        let r = s.agent.lock().unwrap_or_else(|e| e.into_inner()).poll();
        s.busy.store(false, SeqCst);
        match r {
            Ok(Some(_)) => {
                nap = Duration::from_micros(100);
                std::thread::yield_now();
            }
            Ok(None) => {
                std::thread::park_timeout(nap);
                nap = (nap * 2).min(park);
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
