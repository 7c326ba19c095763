//! The retraining service: CirQ consumer, retraining without moving data,
//! and shadow redirection.
//!
//! One retraining of model `m` (record `R`, directory word `D[m] = R`):
//!
//! 1. **Prepare** (nothing locked): walk `R`'s chains in key order and fit
//!    new segments over the leaves' fences ([`rolex_core::model::fit_model`],
//!    the scheme bulk loading used and clients predict with).
//! 2. **Freeze**: set `FROZEN` in `R`'s state word, then lock every LT
//!    entry of `R` by `CAS`, waiting for writers that hold one — until the
//!    deadline ([`AgentConfig::freeze_deadline`], from the freeze's start):
//!    past it the agent *thaws* `R` (restores the entries it locked, clears
//!    `FROZEN`), reports [`AgentError::FreezeDeadline`] and retries the model
//!    later, so writers never wait long for a frozen model, even when one
//!    of them holds a lock for good. Once every entry is locked no compute
//!    node changes a leaf of `m`: writers whose lock `CAS` fails read the
//!    state word and wait (frozen) or refresh (retired).
//! 3. Walk the chains again (now stable), cheaply: a leaf of step 1 whose
//!    `next` word is unchanged is not re-read. If the leaf list changed (a
//!    writer split a leaf meanwhile), refit — microseconds. Leaves
//!    created meanwhile are thus carried over, as training leaves of the new
//!    record (equivalent to listing them in its SLT, and it keeps the new SLT
//!    empty for the next round).
//! 4. **Build** the new record `R'` beside the old one, in space of the
//!    model region that no compute node can still be using
//!    ([`crate::record_space`]: first fit among records retired longer
//!    than [`AgentConfig::record_grace`] ago, else past the highest record):
//!    LT = every leaf in key order, *locked*; fences = their `fence_lo`;
//!    empty SLT; segments.
//! 5. **Switch** `D[m] := R'` (one 8-byte write): **the point of no
//!    return**. Then mark `R` retired with a forward pointer to `R'`. `R`'s
//!    LT entries stay locked until its space is reused, so a stale writer
//!    never writes through `R`; `R`'s space is given back to the model
//!    region, reusable once the grace period has passed.
//! 6. Leaf by leaf, clear the `next` link of the leaf of `R'` (each is now a
//!    training leaf with an empty chain; re-sealed), then unlock its LT
//!    entry in `R'`. Until then writers of that leaf back off; readers
//!    never wait: a reader with a stale model that meets a cleared link
//!    before its key sees that the key is not covered and refreshes.
//!
//! Each step is one method, called in this order: `prepare` (1), `freeze`
//! and `lock_entry` (2), `rewalk` and `segments_for` (3), `build_record`
//! (4) — `build` runs 3–4 and computes everything the later steps need —
//! `switch` and `retire` (5), `release_leaf` (6, one leaf); `install` runs
//! 2–6, with `finish` running what follows the switch.
//!
//! **Before the point of no return** (steps 2–4 and a directory write that
//! failed) a failure `thaw`s the old record: its entries and state word
//! back, nothing of `R'` visible. **After it** the agent only rolls
//! forward: it never un-retires `R`, whose entries the directory no longer
//! leads to. `finish` is idempotent and resumable; if it fails, the
//! retraining is kept as unfinished and reported
//! ([`AgentError::RollForward`], with the entries of `R'` still locked),
//! and the next [`Agent::poll`] — or any retraining of that model — rolls
//! it forward first.
//!
//! Data never moves and no leaf's fences change, so every invariant the
//! readers rely on (a leaf's `fence_lo` never changes, its `fence_hi` only
//! shrinks, and following `next` links from the leaf whose `fence_lo ≤ k`
//! reaches `k`'s owner) holds across the switch. Freeze time (steps 2–6)
//! is measured with [`PoolMemory::now_ns`].
//!
//! Priority: [`Agent::poll`] drains the CirQ into a local pending set, adds
//! every model whose SLT count reached the trigger (it watches the SLT
//! headers itself, so a lost enqueue or a lower trigger still works), and
//! retrains the one whose SLT is fullest first — models near a full SLT
//! first.
//!
//! Failures: a model whose retraining (or roll forward) failed is backed
//! off — not tried again before [`AgentConfig::retry_backoff_min`], doubled
//! with every consecutive failure up to [`AgentConfig::retry_backoff_max`],
//! reset by a success — and reported ([`AgentStats::failures`],
//! [`AgentStats::last_failure`]). A backed-off model is simply not a
//! candidate, so the others are retrained meanwhile: a failing model never
//! spins the agent nor starves the rest.
//!
//! The CirQ consumer never waits forever for a producer: a ticket handed
//! out for longer than [`AgentConfig::cirq_abandon_after`] whose slot is
//! still unwritten (its producer died between its `FAA` and its WRITE, or
//! stalled) is skipped with a [`Notice::AbandonedTicket`]; the SLT watch
//! above retrains its model all the same (see `rolex_core::layout::CirqHeader`).

use alloc::collections::BTreeSet;
use alloc::vec::Vec;
use core::time::Duration;

use rolex_core::entry::{LockOwner, LtEntry, SltHeader};
use rolex_core::layout::{
    CirqHeader, Leaf, LeafRegion, LeafRegionHeader, ModelRecord, ModelRecordParams, ModelSegment,
    ModelState, Pop, Superblock,
};
use rolex_core::model::fit_model;
use zerocopy::{FromBytes, IntoBytes};

use crate::error::{AgentError, Inconsistency, PoolError};
use crate::histogram::Histogram;
use crate::leaves::{check_tiling, leaf_buffer, read_leaf, walk_model, LeafInfo};
use crate::memory::PoolMemory;
use crate::record_space::RecordSpace;

/// How the agent decides what to retrain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentConfig {
    /// SLT slots used that make a model due for retraining (compute nodes
    /// enqueue at [`SltHeader::RETRAIN_SLOT`] = 128; a smaller trigger makes
    /// the agent retrain earlier on its own).
    pub retrain_trigger: u64,
    /// How long a CirQ ticket may stay handed out and unwritten before the
    /// consumer skips it as abandoned (a producer writes its slot one round
    /// trip after taking its ticket; one that stalls longer is taken for
    /// dead, and its late write is harmless). 100 ms by default.
    pub cirq_abandon_after: Duration,
    /// Longest the freeze (step 2) waits for writers holding LT entries of
    /// the model, from its start; past it the model is thawed and retried
    /// later. Writers hold a lock for a few round trips, so this is only
    /// ever reached by a stalled or dead holder. 20 ms by default.
    pub freeze_deadline: Duration,
    /// How long [`Agent::poll`] leaves a model alone after its retraining
    /// failed once; doubled with each consecutive failure. 1 ms by default.
    pub retry_backoff_min: Duration,
    /// The most a failing model is left alone. 1 s by default.
    pub retry_backoff_max: Duration,
    /// How long a retired model record stays untouched before its space is
    /// reused, on the agent's clock. It must exceed the longest a compute
    /// node uses a cached record it has not seen live
    /// (`rolex_kv::KvClientConfig::model_max_age`, 500 ms by default) plus
    /// the longest one request stays in flight, so that no stale compute
    /// node's `CAS` or READ meets another model's record (see
    /// [`crate::record_space`]). 2 s by default.
    pub record_grace: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            retrain_trigger: SltHeader::RETRAIN_SLOT as u64,
            cirq_abandon_after: Duration::from_millis(100),
            freeze_deadline: Duration::from_millis(20),
            retry_backoff_min: Duration::from_millis(1),
            retry_backoff_max: Duration::from_secs(1),
            record_grace: Duration::from_secs(2),
        }
    }
}

/// Nanoseconds of `d`, saturated.
fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the agent has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Models retrained and installed.
    pub retrains: u64,
    /// Keys held by the models when they were retrained.
    pub keys_retrained: u64,
    /// Leaves of the new models.
    pub leaves_retrained: u64,
    /// Synonym leaves that became training leaves.
    pub synonyms_absorbed: u64,
    /// Total nanoseconds models spent frozen.
    pub freeze_ns_total: u64,
    /// Longest freeze, in nanoseconds.
    pub freeze_ns_max: u64,
    /// Of the freeze time, nanoseconds spent locking the old LT (waiting
    /// for writers that held an entry), freezes given up included.
    pub lock_ns_total: u64,
    /// Freezes that passed their deadline and were thawed.
    pub freeze_timeouts: u64,
    /// Times the steps after a switch failed and were left to roll forward
    /// (each reported as [`AgentError::RollForward`]).
    pub roll_forward_failures: u64,
    /// Entries popped from the CirQ.
    pub cirq_pops: u64,
    /// Retrainings refitted under the freeze because leaves appeared.
    pub refits: u64,
    /// Retrainings (or roll forwards) [`Agent::poll`] met failing: a freeze
    /// past its deadline, a full model region, an inconsistent pool… Each
    /// backs its model off.
    pub failures: u64,
    /// The last of them.
    pub last_failure: Option<Failure>,
    /// Bytes of the model region up to the end of its highest record in
    /// use or waiting (records below it may be free: see the next two).
    pub model_region_used: u64,
    /// Bytes of retired records, in their grace period or reusable.
    pub model_region_free: u64,
    /// New records placed in the space of retired ones.
    pub records_reused: u64,
    /// Retrainings refused because the model region was really full
    /// (published in the model's record for compute nodes).
    pub refusals: u64,
    /// CirQ entries that named no model of the directory (skipped, and
    /// reported as a [`Notice`]).
    pub cirq_unknown: u64,
    /// CirQ tickets skipped as abandoned (never written in time; each
    /// reported as a [`Notice::AbandonedTicket`]).
    pub cirq_abandoned: u64,
    /// Every freeze time, in nanoseconds (p50/p99/max).
    pub freeze_hist: Histogram,
}

/// A retraining that failed in [`Agent::poll`], as [`AgentStats`] keeps
/// the last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The model.
    pub model_id: u64,
    /// What failed.
    pub error: AgentError,
    /// Consecutive failures of the model, this one included.
    pub consecutive: u32,
    /// Nanoseconds before the model is tried again.
    pub retry_in_ns: u64,
}

/// A model's failures: how many in a row, and when it may be tried again
/// (the clock, ns).
#[derive(Clone, Copy, Debug, Default)]
struct Backoff {
    failures: u32,
    retry_at: u64,
}

/// Something the agent met and skipped, for its driver to log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notice {
    /// A CirQ entry named a model the directory does not have; it was
    /// consumed and nothing else was touched.
    UnknownModel {
        /// The id the entry named.
        model_id: u64,
        /// Its CirQ ticket.
        ticket: u64,
        /// Models the directory has.
        models: u64,
    },
    /// A CirQ ticket stayed unwritten past
    /// [`AgentConfig::cirq_abandon_after`]: its producer died or stalled
    /// between its `FAA` and its WRITE. The consumer skipped it.
    AbandonedTicket {
        /// The ticket.
        ticket: u64,
        /// Nanoseconds it was known to be handed out and unwritten.
        waited_ns: u64,
    },
}

impl core::fmt::Display for Notice {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            Self::UnknownModel {
                model_id,
                ticket,
                models,
            } => write!(
                f,
                "CirQ ticket {ticket} names model {model_id}, but the directory has {models} models: skipped"
            ),
            Self::AbandonedTicket { ticket, waited_ns } => write!(
                f,
                "CirQ ticket {ticket} unwritten after {} ms: skipped as abandoned",
                waited_ns / 1_000_000
            ),
        }
    }
}

/// Notices kept until the driver takes them (older ones are dropped).
const MAX_NOTICES: usize = 64;

/// The consumer's evidence that the CirQ head is stalled: every ticket
/// below `tail` was handed out before `since` (the clock, ns).
#[derive(Clone, Copy, Debug)]
struct Stall {
    tail: u64,
    since: u64,
}

/// What one retraining did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetrainReport {
    /// The model.
    pub model_id: u64,
    /// Its retired record.
    pub old_record: u64,
    /// Its new record.
    pub new_record: u64,
    /// Training leaves of the new record.
    pub leaves: u64,
    /// Leaves that were synonyms before.
    pub synonyms_absorbed: u64,
    /// Keys in the model.
    pub keys: u64,
    /// Segments of the new record.
    pub segments: u64,
    /// Nanoseconds the model was frozen.
    pub freeze_ns: u64,
}

/// A model prepared for retraining (step 1), not yet frozen.
#[derive(Clone, Debug)]
pub struct Prepared {
    model_id: u64,
    record_at: u64,
    leaves: Vec<LeafInfo>,
    segments: Vec<ModelSegment>,
}

impl Prepared {
    /// The model.
    pub fn model_id(&self) -> u64 {
        self.model_id
    }

    /// Leaves seen by the unlocked walk.
    pub fn leaves(&self) -> u64 {
        self.leaves.len() as u64
    }
}

/// The retraining service over the agent's own memory (see the module
/// docs).
pub struct Agent<M: PoolMemory> {
    mem: M,
    sb: Superblock,
    region: LeafRegion,
    cfg: AgentConfig,
    space: RecordSpace,
    /// Current record offset of each model (the agent alone writes the
    /// directory, so this mirror is exact).
    records: Vec<u64>,
    /// Their SLT header offsets.
    slts: Vec<u64>,
    pending: BTreeSet<u64>,
    stats: AgentStats,
    buf: Vec<u8>,
    notices: alloc::collections::VecDeque<Notice>,
    /// Set while the CirQ head is pending.
    stall: Option<Stall>,
    /// Retrainings past their switch whose last steps failed (at most one
    /// per model).
    unfinished: Vec<Switched>,
    /// Each model's failures (indexed like `records`).
    backoff: Vec<Backoff>,
}

impl<M: PoolMemory> Agent<M> {
    /// Attaches to a pool laid out by [`crate::BulkPlan`] (or a previous
    /// agent); `next_free` is the first unused model-region byte.
    pub fn attach(mem: M, cfg: AgentConfig, next_free: u64) -> Result<Self, AgentError> {
        let mut head = [0u8; Superblock::SIZE as usize];
        mem.read(0, &mut head)?;
        let sb = Superblock::read(&head)?;
        let start = sb.model_region_offset();
        let region_end = start + sb.model_region_len();
        if !(start..=region_end).contains(&next_free) {
            return Err(AgentError::BadConfig {
                field: "next_free",
                value: next_free,
            });
        }
        let mut lrh = [0u8; LeafRegionHeader::SIZE as usize];
        mem.read(sb.leaf_region_offset(), &mut lrh)?;
        let header = LeafRegionHeader::read_from_bytes(&lrh).map_err(|_| {
            AgentError::Layout(rolex_core::layout::LayoutError::TooShort {
                part: rolex_core::layout::Part::LeafRegion,
                needed: LeafRegionHeader::SIZE,
                found: lrh.len() as u64,
            })
        })?;
        let region = header.check(&sb.leaf_region()?)?;
        let mut agent = Self {
            mem,
            sb,
            region,
            cfg,
            space: RecordSpace::new(start, region_end, next_free, ns(cfg.record_grace)),
            records: Vec::new(),
            slts: Vec::new(),
            pending: BTreeSet::new(),
            stats: AgentStats::default(),
            buf: leaf_buffer(&region),
            notices: alloc::collections::VecDeque::new(),
            stall: None,
            unfinished: Vec::new(),
            backoff: Vec::new(),
        };
        for m in 0..sb.model_count() {
            let at = agent.mem.load(sb.directory_entry_offset(m)?)?;
            let r = agent.record(at)?;
            agent.records.push(at);
            agent.slts.push(r.slt_offset());
            agent.backoff.push(Backoff::default());
        }
        agent.stats.model_region_used = agent.space.extent();
        Ok(agent)
    }

    /// The memory the agent serves.
    pub fn mem(&self) -> &M {
        &self.mem
    }

    /// The pool's superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Statistics so far.
    pub fn stats(&self) -> AgentStats {
        self.stats
    }

    /// The first model-region byte past every record in use or retired
    /// (where bump allocation goes on); a restarted agent attaches with it
    /// (and does not reuse the retired records below it: the free space is
    /// kept in the agent's memory only).
    pub fn next_free(&self) -> u64 {
        self.space.next_free()
    }

    /// Gives `[at, at + size)` of the model region back as a record
    /// retired now: reusable once the grace period has passed (restart
    /// recovery, [`crate::recover`]).
    pub(crate) fn retire_space(&mut self, at: u64, size: u64) {
        self.space.retire(at, size, self.mem.now_ns());
        let (waiting, ready) = self.space.free_bytes();
        self.stats.model_region_free = waiting + ready;
    }

    /// The oldest notice not taken yet.
    pub fn take_notice(&mut self) -> Option<Notice> {
        self.notices.pop_front()
    }

    /// Checks that the pool still carries this agent's magic and layout
    /// version (two word loads): a pool overwritten or reformatted under
    /// the agent is refused before anything is written.
    pub fn check_pool(&self) -> Result<(), AgentError> {
        let magic = self.mem.load(0)?;
        if magic != rolex_core::layout::MAGIC {
            return Err(AgentError::Layout(
                rolex_core::layout::LayoutError::BadMagic { found: magic },
            ));
        }
        let version = self.mem.load(8)? as u32;
        if version != rolex_core::layout::LAYOUT_VERSION {
            return Err(AgentError::Layout(
                rolex_core::layout::LayoutError::UnsupportedVersion { found: version },
            ));
        }
        Ok(())
    }

    /// The current record offset of every model.
    pub fn records(&self) -> &[u64] {
        &self.records
    }

    /// SLT slots model `model_id` has used.
    pub fn slt_used(&self, model_id: u64) -> Result<u64, AgentError> {
        let off = *self
            .slts
            .get(model_id as usize)
            .ok_or(AgentError::UnknownModel { model_id })?;
        Ok(SltHeader::from_raw(self.mem.load(off)?).used())
    }

    fn record(&self, at: u64) -> Result<ModelRecord, AgentError> {
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        self.mem.read(at, &mut rb)?;
        let r = ModelRecord::read(&rb)?;
        r.check(at, &self.sb)?;
        Ok(r)
    }

    /// Keeps `n` for the driver (dropping the oldest past [`MAX_NOTICES`]).
    fn notice(&mut self, n: Notice) {
        if self.notices.len() == MAX_NOTICES {
            self.notices.pop_front();
        }
        self.notices.push_back(n);
    }

    /// Moves every ready CirQ entry into the pending set, skipping tickets
    /// abandoned by their producers (see the module docs).
    fn drain_cirq(&mut self) -> Result<(), AgentError> {
        let base = self.sb.cirq_offset();
        let capacity = self.mem.load(base + CirqHeader::CAPACITY_OFFSET)?;
        loop {
            let head = self.mem.load(base + CirqHeader::HEAD_OFFSET)?;
            let tail = self.mem.load(base + CirqHeader::TAIL_OFFSET)?;
            let slot = base + CirqHeader::slot_offset(head, capacity)?;
            let value = self.mem.load(slot)?;
            match CirqHeader::pop(head, tail, value)? {
                Pop::Empty => {
                    self.stall = None;
                    return Ok(());
                }
                Pop::Pending => {
                    let now = self.mem.now_ns();
                    let stall = match self.stall {
                        Some(s) if head < s.tail => s,
                        _ => *self.stall.insert(Stall { tail, since: now }),
                    };
                    let waited_ns = now.saturating_sub(stall.since);
                    if waited_ns < ns(self.cfg.cirq_abandon_after) {
                        return Ok(());
                    }
                    // Clear what the slot held (nothing, or a late write of a
                    // ticket skipped a lap ago) unless the WRITE just landed.
                    if self.mem.cas(slot, value, CirqHeader::EMPTY_SLOT)? != value {
                        continue;
                    }
                    self.mem.store(base + CirqHeader::HEAD_OFFSET, head + 1)?;
                    self.stats.cirq_abandoned += 1;
                    self.notice(Notice::AbandonedTicket {
                        ticket: head,
                        waited_ns,
                    });
                }
                Pop::Ready {
                    model_id,
                    next_head,
                } => {
                    // Clear, then advance (release order for producers).
                    self.mem.store(slot, CirqHeader::EMPTY_SLOT)?;
                    self.mem.store(base + CirqHeader::HEAD_OFFSET, next_head)?;
                    self.stats.cirq_pops += 1;
                    if (model_id as usize) < self.records.len() {
                        self.pending.insert(model_id);
                    } else {
                        self.stats.cirq_unknown += 1;
                        self.notice(Notice::UnknownModel {
                            model_id,
                            ticket: head,
                            models: self.records.len() as u64,
                        });
                    }
                }
            }
        }
    }

    /// One step of the service: rolls forward an unfinished retraining, or
    /// drains the CirQ, picks the model whose SLT is fullest among those
    /// due, and retrains it. Models backed off after a failure are left
    /// alone until their time comes. `Ok(None)`: nothing was due.
    pub fn poll(&mut self) -> Result<Option<RetrainReport>, AgentError> {
        self.check_pool()?;
        let now = self.mem.now_ns();
        if let Some(i) = self
            .unfinished
            .iter()
            .position(|sw| self.ready(sw.built.report.model_id, now))
        {
            let sw = self.unfinished.swap_remove(i);
            let m = sw.built.report.model_id;
            let r = self.roll_forward(sw);
            return self.account(m, r).map(Some);
        }
        self.drain_cirq()?;
        let queued_min = self.cfg.retrain_trigger.min(SltHeader::RETRAIN_SLOT as u64);
        let mut best: Option<(u64, u64)> = None;
        for m in 0..self.records.len() as u64 {
            if !self.ready(m, now) || self.is_unfinished(m) {
                continue;
            }
            let used = self.slt_used(m)?;
            let due = used >= self.cfg.retrain_trigger.max(1)
                || (self.pending.contains(&m) && used >= queued_min.max(1));
            if due && best.map_or(true, |(_, u)| used > u) {
                best = Some((m, used));
            }
        }
        let Some((m, _)) = best else {
            // Queued models whose SLT was emptied by a retraining meanwhile;
            // those backed off stay queued.
            let waiting: BTreeSet<u64> = self
                .pending
                .iter()
                .copied()
                .filter(|&m| !self.ready(m, now))
                .collect();
            self.pending = waiting;
            return Ok(None);
        };
        let r = self.retrain(m);
        if r.is_ok() {
            self.pending.remove(&m);
        }
        self.account(m, r).map(Some)
    }

    /// Whether model `m` is not backed off at `now`.
    fn ready(&self, m: u64, now: u64) -> bool {
        self.backoff
            .get(m as usize)
            .map_or(true, |b| b.retry_at <= now)
    }

    /// Whether model `m` has a retraining left to roll forward.
    fn is_unfinished(&self, m: u64) -> bool {
        self.unfinished
            .iter()
            .any(|sw| sw.built.report.model_id == m)
    }

    /// Backs model `m` off after a failure (from now, when it failed), or
    /// clears its failures after a success; reports the failure in the
    /// statistics.
    fn account(
        &mut self,
        m: u64,
        r: Result<RetrainReport, AgentError>,
    ) -> Result<RetrainReport, AgentError> {
        let now = self.mem.now_ns();
        let Some(b) = self.backoff.get_mut(m as usize) else {
            return r;
        };
        match r {
            Ok(report) => {
                *b = Backoff::default();
                Ok(report)
            }
            Err(error) => {
                b.failures = b.failures.saturating_add(1);
                let doublings = (b.failures - 1).min(63);
                let wait = ns(self.cfg.retry_backoff_min)
                    .saturating_mul(1 << doublings)
                    .min(ns(self.cfg.retry_backoff_max));
                b.retry_at = now.saturating_add(wait);
                self.stats.failures += 1;
                self.stats.last_failure = Some(Failure {
                    model_id: m,
                    error,
                    consecutive: b.failures,
                    retry_in_ns: wait,
                });
                Err(error)
            }
        }
    }

    /// Retrains model `model_id` now, whatever its SLT count.
    pub fn retrain(&mut self, model_id: u64) -> Result<RetrainReport, AgentError> {
        let p = self.prepare(model_id)?;
        self.install(p)
    }

    /// Step 1: walks the model unlocked and fits new segments.
    pub fn prepare(&mut self, model_id: u64) -> Result<Prepared, AgentError> {
        self.check_pool()?;
        self.settle(model_id)?;
        let record_at = *self
            .records
            .get(model_id as usize)
            .ok_or(AgentError::UnknownModel { model_id })?;
        let r = self.record(record_at)?;
        let leaves = walk_model(&self.mem, &self.region, &r, &mut self.buf)?;
        let fences: Vec<u64> = leaves.iter().map(|l| l.fence_lo).collect();
        // A racing split can make an unlocked walk skip or repeat a range;
        // such a fit is discarded under the freeze.
        let segments = if fences.windows(2).all(|w| w[0] < w[1]) {
            fit_model(&fences, r.epsilon())?
        } else {
            Vec::new()
        };
        Ok(Prepared {
            model_id,
            record_at,
            leaves,
            segments,
        })
    }

    /// Steps 2–6: freeze, re-walk (refit if needed), build, switch, retire,
    /// clear links, unlock. A failure before the switch thaws the old
    /// record; one after it is [`AgentError::RollForward`] (see the module
    /// docs). A model region too full for the new record even once every
    /// retired record's grace period has passed is published in the old
    /// record (`Agent::refuse`).
    pub fn install(&mut self, p: Prepared) -> Result<RetrainReport, AgentError> {
        let model_id = p.model_id;
        let r = self.install_steps(p);
        if let Err(AgentError::ModelRegionFull { needed, .. }) = r {
            self.refuse(model_id, needed)?;
        }
        r
    }

    /// Publishes in model `model_id`'s current record (its retraining
    /// thawed or never frozen: still live) that a retraining needing
    /// `needed` bytes was refused, if the model region is really full: not
    /// even the records in their grace period would make room. Compute nodes that find the model's SLT full
    /// then fail at once ("pool full") instead of waiting for a retraining
    /// that cannot come; the next successful retraining's record has no
    /// such mark.
    fn refuse(&mut self, model_id: u64, needed: u64) -> Result<(), AgentError> {
        // The record the directory names now (a retraining that found the
        // model retrained since its preparation refused the current one).
        let Some(&at) = self.records.get(model_id as usize) else {
            return Ok(());
        };
        if self.space.largest_eventually() >= needed {
            return Ok(());
        }
        self.stats.refusals += 1;
        Ok(self.mem.store(at + ModelRecord::REFUSED_OFFSET, needed)?)
    }

    /// [`Self::install`]'s steps.
    fn install_steps(&mut self, p: Prepared) -> Result<RetrainReport, AgentError> {
        self.check_pool()?;
        let model_id = p.model_id;
        self.settle(model_id)?;
        let at = p.record_at;
        if self.records.get(model_id as usize) != Some(&at) {
            // Retrained since `prepare`: prepare again.
            return self.retrain(model_id);
        }
        let r = self.record(at)?;
        if r.model_id() != model_id {
            return Err(AgentError::Inconsistent {
                model_id,
                what: Inconsistency::WrongRecord,
            });
        }
        let state = r.state();
        if state.is_frozen() {
            return Err(AgentError::Inconsistent {
                model_id,
                what: Inconsistency::AlreadyFrozen,
            });
        }
        // Room for the record as prepared (at most one segment per leaf):
        // a region without it is refused before anything is frozen. The
        // record's exact size is known under the freeze (step 4), which
        // thaws if that does not fit.
        let n = (p.leaves.len() as u64).max(1);
        let needed = ModelRecord::size_for(n, n)?;
        let left = self.space.largest(self.mem.now_ns());
        if needed > left {
            return Err(AgentError::ModelRegionFull { needed, left });
        }

        let t0 = self.mem.now_ns();
        let frozen = self.freeze(&r, at, state);
        self.stats.lock_ns_total += self.mem.now_ns().saturating_sub(t0);
        if let Err(AgentError::FreezeDeadline { .. }) = frozen {
            self.stats.freeze_timeouts += 1;
        }
        let frozen = frozen?;
        let built = match self.build(&r, at, state, &p) {
            Ok(built) => built,
            Err(e) => {
                self.thaw(frozen)?;
                return Err(e);
            }
        };
        if let Err(e) = self.switch(&built) {
            self.space.unused(built.at, built.size);
            self.thaw(frozen)?;
            return Err(e);
        }
        // The point of no return: the directory names the new record.
        self.roll_forward(Switched {
            built,
            t0,
            retired: false,
            done: 0,
        })
    }

    /// Rolls forward the unfinished retraining of model `model_id`, if
    /// there is one (before anything else touches the model).
    fn settle(&mut self, model_id: u64) -> Result<(), AgentError> {
        match self
            .unfinished
            .iter()
            .position(|sw| sw.built.report.model_id == model_id)
        {
            Some(i) => {
                let sw = self.unfinished.swap_remove(i);
                self.roll_forward(sw).map(|_| ())
            }
            None => Ok(()),
        }
    }

    /// The steps after the switch ([`Self::finish`]); the retraining is
    /// counted once they are all done, and kept as unfinished if one fails.
    fn roll_forward(&mut self, mut sw: Switched) -> Result<RetrainReport, AgentError> {
        match self.finish(&mut sw) {
            Ok(()) => {
                let mut report = sw.built.report;
                report.freeze_ns = self.mem.now_ns().saturating_sub(sw.t0);
                self.count(&report);
                Ok(report)
            }
            Err(cause) => {
                self.stats.roll_forward_failures += 1;
                let e = AgentError::RollForward {
                    model_id: sw.built.report.model_id,
                    new_record: sw.built.at,
                    locked: (sw.built.leaves.len() - sw.done) as u64,
                    cause,
                };
                self.unfinished.push(sw);
                Err(e)
            }
        }
    }

    /// Step 2: sets `FROZEN` in the state word of record `r` (at `at`, in
    /// state `state`), then locks every LT entry of `r` for the agent,
    /// waiting for writers that hold one until the deadline. Returns what
    /// [`Self::thaw`] needs to undo it; on any error (the deadline
    /// included) it has thawed already.
    fn freeze(
        &mut self,
        r: &ModelRecord,
        at: u64,
        state: ModelState,
    ) -> Result<Frozen, AgentError> {
        let mut frozen = Frozen {
            state_at: at + ModelRecord::STATE_OFFSET,
            state,
            locked: Vec::with_capacity(r.leaf_count() as usize),
        };
        self.mem.store(frozen.state_at, state.frozen().raw())?;
        let start = self.mem.now_ns();
        for j in 0..r.leaf_count() {
            match self.lock_entry(r, j, start) {
                Ok(locked) => frozen.locked.push(locked),
                Err(e) => {
                    self.thaw(frozen)?;
                    return Err(e);
                }
            }
        }
        Ok(frozen)
    }

    /// Locks LT entry `j` of record `r` for the agent, waiting for a writer
    /// that holds it until the freeze's deadline (counted from `start`);
    /// returns its offset and the word it held.
    fn lock_entry(
        &self,
        r: &ModelRecord,
        j: u64,
        start: u64,
    ) -> Result<(u64, LtEntry), AgentError> {
        let off = r.lt_entry_offset(j)?;
        let deadline = ns(self.cfg.freeze_deadline);
        let mut attempt = 0u32;
        loop {
            let v = LtEntry::from_raw(self.mem.load(off)?);
            if !v.is_locked()
                && self
                    .mem
                    .cas(off, v.raw(), v.locked_by(LockOwner::AGENT).raw())?
                    == v.raw()
            {
                return Ok((off, v));
            }
            let waited_ns = self.mem.now_ns().saturating_sub(start);
            if waited_ns >= deadline {
                return Err(AgentError::FreezeDeadline {
                    model_id: r.model_id(),
                    entry: j,
                    holder: v.owner(),
                    waited_ns,
                });
            }
            attempt += 1;
            self.mem.relax(attempt);
        }
    }

    /// Undoes [`Self::freeze`] (all of it, or what it did before it ran out
    /// of time), before the point of no return only: the old entries and
    /// state word back. Nothing of the new record is visible yet (the
    /// directory still names the old one). Never called after the switch.
    fn thaw(&mut self, frozen: Frozen) -> Result<(), AgentError> {
        for (off, v) in frozen.locked {
            self.mem.store(off, v.raw())?;
        }
        self.mem.store(frozen.state_at, frozen.state.raw())?;
        Ok(())
    }

    /// Adds a finished retraining to the statistics.
    fn count(&mut self, report: &RetrainReport) {
        let s = &mut self.stats;
        s.retrains += 1;
        s.keys_retrained += report.keys;
        s.leaves_retrained += report.leaves;
        s.synonyms_absorbed += report.synonyms_absorbed;
        s.freeze_ns_total += report.freeze_ns;
        s.freeze_ns_max = s.freeze_ns_max.max(report.freeze_ns);
        s.freeze_hist.record(report.freeze_ns);
        s.model_region_used = self.space.extent();
        let (waiting, ready) = self.space.free_bytes();
        s.model_region_free = waiting + ready;
        s.records_reused = self.space.reused();
    }

    /// Steps 3–4 under the freeze of record `r` (at `at`, state `state`
    /// before the freeze), as prepared in `p`: the new record, written
    /// beside `r` but not switched in, and everything the steps after the
    /// switch need (so that none of them has anything left to compute).
    fn build(
        &mut self,
        r: &ModelRecord,
        at: u64,
        state: ModelState,
        p: &Prepared,
    ) -> Result<Built, AgentError> {
        let model_id = r.model_id();
        let leaves = self.rewalk(r, p)?;
        let segments = self.segments_for(r, p, &leaves)?;
        let (new_at, record, keys) = self.build_record(r, state, &leaves, &segments)?;
        let n = leaves.len() as u64;
        Ok(Built {
            at: new_at,
            size: record.total_len()?,
            record,
            old_at: at,
            old_size: r.total_len()?,
            retire_at: at + ModelRecord::STATE_OFFSET,
            retired: state.frozen().retired(new_at)?.raw(),
            report: RetrainReport {
                model_id,
                old_record: at,
                new_record: new_at,
                leaves: n,
                synonyms_absorbed: n.saturating_sub(r.leaf_count()),
                keys,
                segments: segments.len() as u64,
                freeze_ns: 0,
            },
            leaves,
        })
    }

    /// Step 3: the chains of the frozen record `r` again, now stable, in
    /// key order, and checked to tile the model's key range.
    ///
    /// Under the freeze only splits changed the leaf list, and a split
    /// always rewrites the split leaf's `next` to a leaf number never used
    /// before; so a prepared leaf whose `next` word is unchanged is
    /// unchanged in everything the new record needs (its fences and links).
    /// Data never moves, so the prepared leaves appear in the same order in
    /// this walk, with new leaves between them: a cursor into the prepared
    /// list (no map to build under the freeze) finds each, and only split
    /// or new leaves are read in full.
    fn rewalk(&mut self, r: &ModelRecord, p: &Prepared) -> Result<Vec<LeafInfo>, AgentError> {
        let model_id = r.model_id();
        let mut leaves = Vec::with_capacity(p.leaves.len() + 16);
        let mut cursor = 0usize;
        for j in 0..r.leaf_count() {
            let mut addr = LtEntry::from_raw(self.mem.load(r.lt_entry_offset(j)?)?).addr();
            let mut hops = 0u64;
            loop {
                let known = p.leaves.get(cursor).filter(|k| k.addr == addr);
                if known.is_some() {
                    cursor += 1;
                }
                let info = match known {
                    Some(k)
                        if self
                            .mem
                            .load(self.region.leaf_offset(addr)? + Leaf::NEXT_OFFSET as u64)?
                            == k.next.raw() =>
                    {
                        *k
                    }
                    _ => read_leaf(&self.mem, &self.region, addr, &mut self.buf)?,
                };
                leaves.push(info);
                if info.next.pointer() == 0 {
                    break;
                }
                hops += 1;
                if hops > SltHeader::CAPACITY {
                    return Err(AgentError::Inconsistent {
                        model_id,
                        what: Inconsistency::ChainTooLong,
                    });
                }
                addr = info.next.addr();
            }
        }
        check_tiling(r, &leaves)?;
        Ok(leaves)
    }

    /// Step 3's refit: the prepared segments if the re-walk found the
    /// prepared leaves exactly (and the unlocked fit was usable), else a
    /// new fit over `leaves`' fences.
    fn segments_for(
        &mut self,
        r: &ModelRecord,
        p: &Prepared,
        leaves: &[LeafInfo],
    ) -> Result<Vec<ModelSegment>, AgentError> {
        let same = !p.segments.is_empty()
            && leaves.len() == p.leaves.len()
            && leaves.iter().zip(&p.leaves).all(|(a, b)| a.addr == b.addr);
        if same {
            return Ok(p.segments.clone());
        }
        self.stats.refits += 1;
        let fences: Vec<u64> = leaves.iter().map(|l| l.fence_lo).collect();
        Ok(fit_model(&fences, r.epsilon())?)
    }

    /// Step 4: writes the new record beside `r` in free space of the model
    /// region ([`RecordSpace::alloc`]: no compute node can still use it) —
    /// LT = every leaf of `leaves` in key order, *locked* by the agent;
    /// fences = their `fence_lo`; an empty SLT; `segments`. Nothing points
    /// at it yet (its space is given back if writing it fails). Returns its
    /// offset, its header and the keys its leaves hold.
    fn build_record(
        &mut self,
        r: &ModelRecord,
        state: ModelState,
        leaves: &[LeafInfo],
        segments: &[ModelSegment],
    ) -> Result<(u64, ModelRecord, u64), AgentError> {
        let n = leaves.len() as u64;
        let keys: u64 = leaves.iter().map(|l| u64::from(l.count)).sum();
        let size = ModelRecord::size_for(n, segments.len() as u64)?;
        let now = self.mem.now_ns();
        let Some(new_at) = self.space.alloc(size, now) else {
            return Err(AgentError::ModelRegionFull {
                needed: size,
                left: self.space.largest(now),
            });
        };
        let written = self.write_record(new_at, r, state, leaves, segments, keys);
        if written.is_err() {
            self.space.unused(new_at, size);
        }
        written.map(|nr| (new_at, nr, keys))
    }

    /// Step 4's writes: the record for `leaves` and `segments` at `new_at`.
    fn write_record(
        &mut self,
        new_at: u64,
        r: &ModelRecord,
        state: ModelState,
        leaves: &[LeafInfo],
        segments: &[ModelSegment],
        keys: u64,
    ) -> Result<ModelRecord, AgentError> {
        let n = leaves.len() as u64;
        let nr = ModelRecord::new(
            new_at,
            &ModelRecordParams {
                model_id: r.model_id(),
                first_key: r.first_key(),
                key_hi: r.key_hi(),
                label_stride: 1,
                segment_count: segments.len() as u64,
                train_keys: keys,
                leaf_count: n,
                epsilon: r.epsilon(),
                generation: state.next_generation(),
            },
        )?;
        nr.check(new_at, &self.sb)?;
        let mut lt = Vec::with_capacity(leaves.len() * 8);
        let mut fb = Vec::with_capacity(leaves.len() * 8);
        for l in leaves {
            lt.extend_from_slice(
                &LtEntry::for_leaf(l.addr)
                    .locked_by(LockOwner::AGENT)
                    .raw()
                    .to_le_bytes(),
            );
            fb.extend_from_slice(&l.fence_lo.to_le_bytes());
        }
        let mut sg = Vec::with_capacity(segments.len() * ModelSegment::SIZE as usize);
        for s in segments {
            sg.extend_from_slice(s.as_bytes());
        }
        self.mem.write(new_at, nr.as_bytes())?;
        self.mem.write(nr.lt_offset(), &lt)?;
        self.mem.write(nr.fences_offset(), &fb)?;
        self.mem
            .write(nr.slt_offset(), &[0u8; ModelRecord::SLT_SIZE as usize])?;
        self.mem.write(nr.segments_offset(), &sg)?;
        Ok(nr)
    }

    /// Step 5: the switch — the model's directory word to the new record
    /// (one 8-byte write, the point of no return if it succeeds) — and the
    /// agent's mirror of it.
    fn switch(&mut self, built: &Built) -> Result<(), AgentError> {
        let m = built.report.model_id;
        self.mem
            .store(self.sb.directory_entry_offset(m)?, built.at)?;
        self.records[m as usize] = built.at;
        self.slts[m as usize] = built.record.slt_offset();
        Ok(())
    }

    /// Everything after the switch: [`Self::retire`], then
    /// [`Self::release_leaf`] for every leaf of the new record, in order.
    /// Resumable and idempotent: `sw` says what is done, and a leaf is
    /// handled again only while its entry is still locked by the agent.
    fn finish(&mut self, sw: &mut Switched) -> Result<(), PoolError> {
        if !sw.retired {
            self.retire(&sw.built)?;
            sw.retired = true;
            let now = self.mem.now_ns();
            self.space.retire(sw.built.old_at, sw.built.old_size, now);
        }
        while sw.done < sw.built.leaves.len() {
            self.release_leaf(&sw.built, sw.done)?;
            sw.done += 1;
        }
        Ok(())
    }

    /// Step 5, after the switch: marks the old record retired with a
    /// forward pointer to the new one (its LT entries stay locked until its
    /// space is reused, after the grace period).
    fn retire(&self, b: &Built) -> Result<(), PoolError> {
        Ok(self.mem.store(b.retire_at, b.retired)?)
    }

    /// Step 6 for leaf `j` of the new record: clears its `next` link (it
    /// is a training leaf with an empty chain now; re-sealed), then
    /// unlocks its LT entry.
    fn release_leaf(&mut self, b: &Built, j: usize) -> Result<(), PoolError> {
        let l = b.leaves[j];
        if l.next.raw() != 0 {
            let off = self.region.leaf_offset(l.addr)?;
            read_leaf(&self.mem, &self.region, l.addr, &mut self.buf)?;
            let leaf = Leaf::from_bytes_mut(&mut self.buf).map_err(|error| PoolError::Leaf {
                leaf: l.addr.leaf(),
                error,
            })?;
            leaf.clear_next();
            leaf.seal();
            self.mem.write(off, &self.buf)?;
        }
        self.mem.store(
            b.record.lt_entry_offset(j as u64)?,
            LtEntry::for_leaf(l.addr).raw(),
        )?;
        Ok(())
    }
}

/// What [`Agent::freeze`] changed: the old record's state word (at
/// `state_at`, `state` before) and each LT entry it locked, with the word
/// it held.
struct Frozen {
    state_at: u64,
    state: ModelState,
    locked: Vec<(u64, LtEntry)>,
}

/// A record built beside the old one (steps 3–4), not yet switched in,
/// with everything the steps after the switch need.
struct Built {
    /// Its pool offset and bytes.
    at: u64,
    size: u64,
    record: ModelRecord,
    /// The old record's pool offset and bytes (given back once retired).
    old_at: u64,
    old_size: u64,
    /// Every leaf of the new record, in LT order.
    leaves: Vec<LeafInfo>,
    /// The old record's state word, and its value once retired.
    retire_at: u64,
    retired: u64,
    /// What the retraining did (`freeze_ns` is set once it is finished).
    report: RetrainReport,
}

/// A retraining past its point of no return (the directory names the new
/// record): the steps left, which the agent only ever rolls forward.
struct Switched {
    built: Built,
    /// The clock when the freeze began.
    t0: u64,
    /// Whether the old record is retired.
    retired: bool,
    /// Leaves (a prefix of `built.leaves`) whose link is cleared and whose
    /// entry is unlocked.
    done: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bulk::{BulkConfig, BulkPlan};
    use crate::memory::testing::VecPool;
    use rolex_core::layout::Slot;

    fn load(n: u64) -> (VecPool, u64) {
        let cfg = BulkConfig {
            leaf_region_id: 2,
            leaf_slots: 4,
            keys_per_leaf: 2,
            epsilon: 1,
            max_model_leaves: 4,
            spare_leaves: 64,
            model_region_spare: 1 << 16,
        };
        let pairs: Vec<(u64, u64)> = (0..n).map(|i| (i * 10, i)).collect();
        let keys: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        let plan = BulkPlan::new(&cfg, &keys).unwrap();
        let mem = VecPool::new(plan.pool_size());
        plan.write(&mem, &pairs).unwrap();
        (mem, plan.next_free())
    }

    /// What a compute node does to split training leaf `j` of the record
    /// at `at` while inserting `key` (lock, allocate, write B then A',
    /// unlock carrying the new pointer).
    fn client_split(mem: &VecPool, sb: &Superblock, at: u64, j: u64, key: u64) {
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        mem.read(at, &mut rb).unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        let region = sb.leaf_region().unwrap();
        let lt = r.lt_entry_offset(j).unwrap();
        let e = LtEntry::from_raw(mem.load(lt).unwrap());
        assert_eq!(mem.cas(lt, e.raw(), e.with_lock().raw()).unwrap(), e.raw());
        let leaf_no = mem.faa(region.alloc_num_offset(), 1).unwrap();
        let slot =
            SltHeader::claimed_slot(mem.faa(r.slt_slot_offset(0).unwrap(), 1).unwrap()).unwrap();
        let b_addr = region.claim(leaf_no).unwrap();
        let mut a = leaf_buffer(&region);
        let x = read_leaf(mem, &region, e.addr(), &mut a).unwrap();
        let leaf = Leaf::from_bytes(&a).unwrap();
        let mut entries: Vec<Slot> = leaf.validate().unwrap().entries().to_vec();
        entries.push(Slot::new(key, key));
        entries.sort_by_key(|s| s.key());
        let mid = entries.len() / 2;
        let mut b = leaf_buffer(&region);
        let bl = Leaf::from_bytes_mut(&mut b).unwrap();
        bl.init(entries[mid].key(), x.fence_hi).unwrap();
        bl.set_entries(&entries[mid..]).unwrap();
        bl.set_next(x.next).unwrap();
        bl.seal();
        let al = Leaf::from_bytes_mut(&mut a).unwrap();
        al.init(x.fence_lo, entries[mid].key() - 1).unwrap();
        al.set_entries(&entries[..mid]).unwrap();
        al.set_next(LtEntry::for_leaf(b_addr).with_pointer(slot))
            .unwrap();
        al.seal();
        mem.write(region.leaf_offset(b_addr).unwrap(), &b).unwrap();
        mem.store(
            r.slt_slot_offset(slot).unwrap(),
            LtEntry::for_leaf(b_addr)
                .with_pointer(x.next.pointer())
                .raw(),
        )
        .unwrap();
        mem.write(region.leaf_offset(e.addr()).unwrap(), &a)
            .unwrap();
        let unlocked = e.with_pointer(slot);
        assert_eq!(
            mem.cas(lt, e.with_lock().raw(), unlocked.raw()).unwrap(),
            e.with_lock().raw()
        );
    }

    #[test]
    fn retraining_step_by_step() {
        let (mem, next_free) = load(40);
        let mut agent = Agent::attach(&mem, AgentConfig::default(), next_free).unwrap();
        let sb = *agent.superblock();
        let old = agent.records()[0];
        // Step 1, then a compute node splits leaf 1 before the freeze.
        let p = agent.prepare(0).unwrap();
        assert_eq!(p.leaves(), 4);
        client_split(&mem, &sb, old, 1, 25);
        assert_eq!(agent.slt_used(0).unwrap(), 1);
        let r = agent.install(p).unwrap();
        assert_eq!((r.leaves, r.synonyms_absorbed, r.keys), (5, 1, 9));
        assert_eq!(agent.stats().refits, 1);
        // Switched, retired with a forward pointer, old entries locked.
        let dir = sb.directory_entry_offset(0).unwrap();
        assert_eq!(mem.load(dir).unwrap(), r.new_record);
        let state = ModelState::from_raw(mem.load(old).unwrap());
        assert!(state.is_retired() && state.forward() == Some(r.new_record));
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        mem.read(old, &mut rb).unwrap();
        let or = ModelRecord::read(&rb).unwrap();
        for j in 0..or.leaf_count() {
            assert!(
                LtEntry::from_raw(mem.load(or.lt_entry_offset(j).unwrap()).unwrap()).is_locked()
            );
        }
        // The new record: live, unlocked, no links, an empty SLT, tiling.
        mem.read(r.new_record, &mut rb).unwrap();
        let nr = ModelRecord::read(&rb).unwrap();
        nr.check(r.new_record, &sb).unwrap();
        assert_eq!(nr.state().generation(), 1);
        assert!(!nr.state().is_frozen());
        assert_eq!(mem.load(nr.slt_slot_offset(0).unwrap()).unwrap(), 0);
        let region = sb.leaf_region().unwrap();
        let mut buf = leaf_buffer(&region);
        let leaves = walk_model(&mem, &region, &nr, &mut buf).unwrap();
        check_tiling(&nr, &leaves).unwrap();
        assert_eq!(leaves.len(), 5);
        for (j, l) in leaves.iter().enumerate() {
            assert_eq!(l.next.raw(), 0);
            let e = LtEntry::from_raw(mem.load(nr.lt_entry_offset(j as u64).unwrap()).unwrap());
            assert!(!e.is_locked());
            assert_eq!(
                mem.load(nr.fence_offset(j as u64).unwrap()).unwrap(),
                l.fence_lo
            );
        }
        // Nothing is due now; a CirQ entry is consumed and skipped.
        assert_eq!(agent.poll().unwrap(), None);
    }

    #[test]
    fn the_freeze_waits_for_a_writer_holding_a_lock() {
        let (mem, next_free) = load(40);
        let mut agent = Agent::attach(&mem, AgentConfig::default(), next_free).unwrap();
        let sb = *agent.superblock();
        let at = agent.records()[1];
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        mem.read(at, &mut rb).unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        let lt = r.lt_entry_offset(2).unwrap();
        let e = mem.load(lt).unwrap();
        mem.store(lt, LtEntry::from_raw(e).with_lock().raw())
            .unwrap();
        let dir = sb.directory_entry_offset(1).unwrap();
        std::thread::scope(|s| {
            let h = s.spawn(move || agent.retrain(1).unwrap());
            // Frozen, but not switched while the writer holds its lock.
            while !ModelState::from_raw(mem.load(at).unwrap()).is_frozen() {
                std::thread::yield_now();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert_eq!(mem.load(dir).unwrap(), at);
            mem.store(lt, e).unwrap();
            let report = h.join().unwrap();
            assert_eq!(mem.load(dir).unwrap(), report.new_record);
        });
    }

    #[test]
    fn retired_records_are_reused_after_their_grace_period() {
        let (mem, next_free) = load(40);
        let grace = 1_000;
        let cfg = AgentConfig {
            record_grace: Duration::from_nanos(grace),
            ..AgentConfig::default()
        };
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        let sb = *agent.superblock();
        let region = sb.leaf_region().unwrap();
        let models = agent.records().len() as u64;
        let size = ModelRecord::size_for(4, 4).unwrap();
        let room = sb.model_region_offset() + sb.model_region_len() - next_free;
        // Far more retrainings than the region holds records.
        let rounds = 40 * room / size;
        let first = agent.records()[0];
        for i in 0..rounds {
            let m = i % models;
            let old = agent.records()[m as usize];
            let r = agent.retrain(m).unwrap();
            // Never the space of a record retired less than the grace ago.
            assert_ne!(r.new_record, old);
            mem.advance(grace / 4);
        }
        let s = agent.stats();
        assert_eq!(s.retrains, rounds);
        assert!(s.records_reused > rounds / 2, "{s:?}");
        assert!(s.model_region_used <= sb.model_region_len());
        // The first record's space serves some model now: its state and id
        // tell a stale reader so.
        let now = ModelRecord::read(&{
            let mut b = [0u8; ModelRecord::SIZE as usize];
            mem.read(first, &mut b).unwrap();
            b
        })
        .unwrap();
        assert!(now.model_id() != 0 || now.state().generation() != 0);
        // Every key is still found from the current records.
        let mut buf = leaf_buffer(&region);
        let mut keys = 0;
        for m in 0..models {
            let r = agent.record(agent.records()[m as usize]).unwrap();
            assert_eq!(r.model_id(), m);
            let leaves = walk_model(&mem, &region, &r, &mut buf).unwrap();
            keys += leaves.iter().map(|l| u64::from(l.count)).sum::<u64>();
        }
        assert_eq!(keys, 40);
    }

    #[test]
    fn a_full_model_region_is_refused_before_freezing() {
        let (mem, _) = load(40);
        let mut head = [0u8; 128];
        mem.read(0, &mut head).unwrap();
        let sb = Superblock::read(&head).unwrap();
        let end = sb.model_region_offset() + sb.model_region_len();
        let mut agent = Agent::attach(&mem, AgentConfig::default(), end - 64).unwrap();
        let at = agent.records()[0];
        assert!(matches!(
            agent.retrain(0),
            Err(AgentError::ModelRegionFull { .. })
        ));
        assert!(!ModelState::from_raw(mem.load(at).unwrap()).is_frozen());
        // Really full (nothing retired to wait for): published for compute
        // nodes in the record.
        let refused = mem.load(at + ModelRecord::REFUSED_OFFSET).unwrap();
        assert!(refused > 64, "{refused}");
        assert_eq!(agent.stats().refusals, 1);
        assert_eq!(agent.record(at).unwrap().refused(), refused);
    }

    /// The CirQ as a compute node sees it: `FAA` the tail for a ticket,
    /// and (separately, so a test can leave it out) WRITE the slot.
    struct Cirq<'a> {
        mem: &'a VecPool,
        base: u64,
        capacity: u64,
    }

    impl<'a> Cirq<'a> {
        fn of(mem: &'a VecPool, sb: &Superblock) -> Self {
            let base = sb.cirq_offset();
            let capacity = mem.load(base + CirqHeader::CAPACITY_OFFSET).unwrap();
            Self {
                mem,
                base,
                capacity,
            }
        }
        fn take(&self) -> u64 {
            self.mem
                .faa(self.base + CirqHeader::TAIL_OFFSET, 1)
                .unwrap()
        }
        fn write(&self, ticket: u64, model: u64) {
            let at = self.base + CirqHeader::slot_offset(ticket, self.capacity).unwrap();
            let v = CirqHeader::encode_slot(ticket, model).unwrap();
            self.mem.store(at, v).unwrap();
        }
        fn head(&self) -> u64 {
            self.mem.load(self.base + CirqHeader::HEAD_OFFSET).unwrap()
        }
    }

    /// Sets model `m`'s SLT count to the retraining slot, as if compute
    /// nodes had split that often (the queue alone then makes it due).
    fn fill_slt(mem: &VecPool, agent: &Agent<&VecPool>, m: u64) {
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        mem.read(agent.records()[m as usize], &mut rb).unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        mem.store(
            r.slt_slot_offset(0).unwrap(),
            u64::from(SltHeader::RETRAIN_SLOT),
        )
        .unwrap();
    }

    #[test]
    fn a_producer_killed_between_faa_and_write_is_skipped_and_the_queue_goes_on() {
        let (mem, next_free) = load(40);
        let cfg = AgentConfig {
            // Only the queue makes a model due.
            retrain_trigger: u64::MAX,
            ..AgentConfig::default()
        };
        let timeout = ns(cfg.cirq_abandon_after);
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        let sb = *agent.superblock();
        let q = Cirq::of(&mem, &sb);
        assert!(q.capacity >= 4, "capacity {}", q.capacity);
        for m in 0..4 {
            fill_slt(&mem, &agent, m);
        }
        // The killed producer: ticket 0, never written. Then a live one.
        let dead = q.take();
        let t1 = q.take();
        q.write(t1, 1);
        eprintln!("injected: ticket {dead} taken and never written; ticket {t1} queues model 1");
        assert_eq!(agent.poll().unwrap(), None, "waits for the pending head");
        assert_eq!((q.head(), agent.stats().cirq_pops), (dead, 0));
        mem.advance(timeout - 1);
        assert_eq!(agent.poll().unwrap(), None, "not abandoned yet");
        mem.advance(1);
        let r = agent.poll().unwrap().expect("the later ticket is consumed");
        let st = agent.stats();
        eprintln!(
            "found after the timeout: head {}, pops {}, abandoned {}, retrained model {}, notice {:?}",
            q.head(),
            st.cirq_pops,
            st.cirq_abandoned,
            r.model_id,
            agent.notices.front()
        );
        assert_eq!(r.model_id, 1);
        assert_eq!((q.head(), st.cirq_pops, st.cirq_abandoned), (t1 + 1, 1, 1));
        assert_eq!(
            agent.take_notice(),
            Some(Notice::AbandonedTicket {
                ticket: dead,
                waited_ns: timeout
            })
        );
        // A lap later: the dead producer's WRITE lands late, in the slot
        // of ticket `capacity`, which is taken but not written yet.
        for t in t1 + 1..q.capacity {
            assert_eq!(q.take(), t);
            q.write(t, 0);
        }
        assert_eq!(agent.poll().unwrap().map(|r| r.model_id), Some(0));
        let late = q.take();
        assert_eq!(late, q.capacity);
        q.write(dead, 3);
        eprintln!("injected: ticket {dead}'s WRITE (model 3) lands in the slot of ticket {late}");
        assert_eq!(agent.poll().unwrap(), None, "not ticket {late}'s entry");
        assert_eq!(q.head(), late);
        q.write(late, 2);
        let r = agent.poll().unwrap().expect("ticket {late} is consumed");
        eprintln!(
            "found: ticket {late} delivered model {}, head {}",
            r.model_id,
            q.head()
        );
        assert_eq!((r.model_id, q.head()), (2, late + 1));
        assert_eq!(agent.stats().cirq_abandoned, 1);
    }

    #[test]
    fn a_writer_holding_a_lock_past_the_deadline_gets_the_model_thawed() {
        let (mem, next_free) = load(40);
        let cfg = AgentConfig::default();
        let deadline = ns(cfg.freeze_deadline);
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        let sb = *agent.superblock();
        let at = agent.records()[1];
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        mem.read(at, &mut rb).unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        let words = |mem: &VecPool| -> Vec<u64> {
            (0..r.leaf_count())
                .map(|j| mem.load(r.lt_entry_offset(j).unwrap()).unwrap())
                .collect()
        };
        // A writer (lease 7) holds entry 2 and stalls; time passes as the
        // agent waits (1 ms a relax).
        let lt = r.lt_entry_offset(2).unwrap();
        let e = LtEntry::from_raw(mem.load(lt).unwrap());
        let held = e.locked_by(LockOwner(7));
        assert_eq!(mem.cas(lt, e.raw(), held.raw()).unwrap(), e.raw());
        let before = words(&mem);
        mem.tick_on_relax(1_000_000);
        eprintln!("injected: lease 7 holds LT entry 2 of model 1 through the freeze");
        let err = agent.retrain(1).unwrap_err();
        eprintln!("found: {err}");
        match err {
            AgentError::FreezeDeadline {
                model_id,
                entry,
                holder,
                waited_ns,
            } => {
                assert_eq!((model_id, entry, holder), (1, 2, LockOwner(7)));
                assert!(waited_ns >= deadline);
            }
            other => panic!("{other}"),
        }
        // Thawed: every entry as it was (the writer's lock untouched), not
        // frozen, not switched.
        assert_eq!(words(&mem), before);
        assert!(!ModelState::from_raw(mem.load(at).unwrap()).is_frozen());
        assert_eq!(mem.load(sb.directory_entry_offset(1).unwrap()).unwrap(), at);
        assert_eq!(agent.stats().freeze_timeouts, 1);
        // The writer finishes (its unlock finds its own word), another
        // writer splits a leaf of the thawed model, and the next attempt
        // succeeds, carrying the new leaf over.
        assert_eq!(mem.cas(lt, held.raw(), e.raw()).unwrap(), held.raw());
        client_split(&mem, &sb, at, 0, 85);
        let report = agent.retrain(1).unwrap();
        eprintln!(
            "found: after the writer finished, model 1 retrained: {} leaves ({} absorbed)",
            report.leaves, report.synonyms_absorbed
        );
        assert_eq!(report.synonyms_absorbed, 1);
        assert_eq!(
            mem.load(sb.directory_entry_offset(1).unwrap()).unwrap(),
            report.new_record
        );
        assert_eq!(agent.stats().freeze_timeouts, 1);
    }

    /// Every LT word of the record at `at`: (record, words).
    fn lt_words(mem: &VecPool, at: u64) -> (ModelRecord, Vec<LtEntry>) {
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        mem.read(at, &mut rb).unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        let words = (0..r.leaf_count())
            .map(|j| LtEntry::from_raw(mem.load(r.lt_entry_offset(j).unwrap()).unwrap()))
            .collect();
        (r, words)
    }

    #[test]
    fn a_failure_after_the_switch_is_rolled_forward_never_undone() {
        let (mem, next_free) = load(40);
        let mut agent = Agent::attach(&mem, AgentConfig::default(), next_free).unwrap();
        let sb = *agent.superblock();
        let old = agent.records()[0];
        // A split, so that the new record has a link to clear.
        client_split(&mem, &sb, old, 1, 25);
        let leaves = sb.leaf_region_offset()..sb.leaf_region_offset() + sb.leaf_region_len();
        // Step 6's first leaf write fails, twice (nothing else writes
        // leaves during a retraining).
        mem.fail_writes(leaves, 2);
        eprintln!("injected: the next 2 leaf writes fail (step 6, after the switch)");
        let err = agent.retrain(0).unwrap_err();
        eprintln!("found: {err}");
        let AgentError::RollForward {
            model_id,
            new_record,
            locked,
            cause,
        } = err
        else {
            panic!("{err}")
        };
        assert_eq!(
            (model_id, cause),
            (0, PoolError::Mem(crate::MemError::Unavailable))
        );
        // Switched and retired, never thawed: the directory names the new
        // record, the old one forwards to it and stays locked.
        let dir = sb.directory_entry_offset(0).unwrap();
        assert_eq!(mem.load(dir).unwrap(), new_record);
        let state = ModelState::from_raw(mem.load(old).unwrap());
        assert!(state.is_retired() && state.forward() == Some(new_record));
        assert!(lt_words(&mem, old).1.iter().all(|e| e.is_locked()));
        let (_, words) = lt_words(&mem, new_record);
        let still = words.iter().filter(|e| e.is_locked()).count() as u64;
        eprintln!(
            "found: {still} of {} new entries locked by the agent",
            words.len()
        );
        assert_eq!(still, locked);
        assert!(locked > 0);
        assert_eq!(agent.stats().retrains, 0);
        assert_eq!(agent.stats().roll_forward_failures, 1);

        // The next poll rolls forward first; it fails once more.
        let err = agent.poll().unwrap_err();
        eprintln!("found on the next poll: {err}");
        assert!(matches!(err, AgentError::RollForward { new_record: n, .. } if n == new_record));
        assert_eq!(mem.load(dir).unwrap(), new_record);
        // The model is backed off: not tried again until its time comes.
        let f = agent.stats().last_failure.expect("the failure is kept");
        assert_eq!((f.model_id, f.error, f.consecutive), (0, err, 1));
        assert_eq!(agent.poll().unwrap(), None);
        mem.advance(f.retry_in_ns);
        // Then it goes through: nothing stays locked, links are cleared.
        let r = agent.poll().unwrap().expect("the retraining is finished");
        eprintln!(
            "found on the poll after: model {} finished at record {}",
            r.model_id, r.new_record
        );
        assert_eq!((r.model_id, r.new_record), (0, new_record));
        let (nr, words) = lt_words(&mem, new_record);
        assert!(words.iter().all(|e| !e.is_locked()), "{words:?}");
        let region = sb.leaf_region().unwrap();
        let mut buf = leaf_buffer(&region);
        let walked = walk_model(&mem, &region, &nr, &mut buf).unwrap();
        check_tiling(&nr, &walked).unwrap();
        assert!(walked.iter().all(|l| l.next.raw() == 0));
        assert_eq!(walked.len() as u64, nr.leaf_count());
        let st = agent.stats();
        assert_eq!((st.retrains, st.roll_forward_failures), (1, 2));
        // Writers go on with the new record.
        client_split(&mem, &sb, new_record, 0, 5);
        assert_eq!(agent.retrain(0).unwrap().synonyms_absorbed, 1);
    }

    #[test]
    fn a_failing_model_is_backed_off_while_the_others_are_retrained() {
        let (mem, next_free) = load(40);
        let cfg = AgentConfig::default();
        let (min, max) = (ns(cfg.retry_backoff_min), ns(cfg.retry_backoff_max));
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        // Model 0 is the fullest, so it would always be picked first; a
        // writer holds one of its locks for good (anonymous: nobody can
        // release it), so every freeze of it runs out of time.
        for m in [0, 1, 2] {
            fill_slt(&mem, &agent, m);
        }
        let (r0, _) = lt_words(&mem, agent.records()[0]);
        mem.store(r0.slt_slot_offset(0).unwrap(), 200).unwrap();
        let lt = r0.lt_entry_offset(3).unwrap();
        let e = LtEntry::from_raw(mem.load(lt).unwrap());
        mem.store(lt, e.with_lock().raw()).unwrap();
        mem.tick_on_relax(1_000_000);
        eprintln!("injected: model 0 (SLT 200) has an LT entry locked for good; models 1 and 2 are due (SLT 128)");

        let err = agent.poll().unwrap_err();
        assert!(
            matches!(err, AgentError::FreezeDeadline { model_id: 0, .. }),
            "{err}"
        );
        let f = agent.stats().last_failure.unwrap();
        eprintln!("found: {} (retry in {} ns)", f.error, f.retry_in_ns);
        assert_eq!((f.model_id, f.consecutive, f.retry_in_ns), (0, 1, min));
        // Backed off: the other models are retrained meanwhile.
        let mut others = Vec::new();
        while let Some(r) = agent.poll().unwrap() {
            others.push(r.model_id);
        }
        eprintln!("found: while model 0 is backed off, models {others:?} were retrained");
        assert_eq!(others, [1, 2]);
        // It is retried only once its backoff ran out, each wait twice the
        // last, up to the bound; every failure is counted and kept.
        let mut waits = Vec::new();
        for n in 2..=14u32 {
            let wait = agent.stats().last_failure.unwrap().retry_in_ns;
            mem.advance(wait - 1);
            assert_eq!(agent.poll().unwrap(), None, "retried early");
            mem.advance(1);
            let err = agent.poll().unwrap_err();
            assert!(matches!(
                err,
                AgentError::FreezeDeadline { model_id: 0, .. }
            ));
            let f = agent.stats().last_failure.unwrap();
            assert_eq!(f.consecutive, n);
            assert_eq!(f.retry_in_ns, (min << (n - 1)).min(max));
            waits.push(f.retry_in_ns / 1_000_000);
        }
        eprintln!("found: backoff after each failure (ms): {waits:?}");
        assert_eq!(agent.stats().failures, 14);
        assert_eq!(agent.stats().freeze_timeouts, 14);
        // The writer lets go: the next try succeeds and clears the backoff.
        mem.store(lt, e.raw()).unwrap();
        mem.advance(max);
        let r = agent.poll().unwrap().expect("model 0 retrained");
        assert_eq!(r.model_id, 0);
        assert_eq!(agent.backoff[0].failures, 0);
        eprintln!("found: after the lock was released, model 0 retrained");
    }
}
