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
//! headers itself, so a lost enqueue or a lower trigger still works: all
//! of them every [`AgentConfig::slt_scan_every`], and in between those it
//! found due), and retrains the one whose SLT is fullest first — models
//! near a full SLT first. With none due, it walks one model in turn and
//! retrains it if a quarter of its leaves would merge away
//! (`Agent::sweep`): space that deletes emptied comes back even where
//! nothing splits. A walk that finds nothing to do waits
//! [`AgentConfig::sweep_every`] for the next; one that retrains does not.
//!
//! Space: a retraining drops the leaves deletes emptied and merges thin
//! neighbours (keys moved into the leaf before, only after the switch;
//! see `Agent::release_leaf`), frees them after the grace period, and
//! stashes free leaves in the new records' SLT slots for splits to take;
//! a model grown past twice [`AgentConfig::max_model_leaves`] is cut into
//! several, in new directory slots, published by a new topology blob.
//!
//! **Leaf stashes.** A split takes the leaf stashed in the SLT slot it
//! claims, or draws a new one from `alloc_num` when the agent left none
//! there (compute nodes reach no other free leaf one-sidedly). Splits
//! come in bursts, often before the agent notices any (it polls, and a
//! compute node wakes it only at [`SltHeader::RETRAIN_SLOT`]), so a
//! stash must already hold what the model's next record will take. Each
//! model keeps its *demand*: the most SLT slots one of its records took
//! (a cut shares it among the pieces by their leaves). A retraining gives
//! the new record `demand + 1` leaves (at most
//! [`AgentConfig::leaf_stash`]): first the old record's stashed leaves
//! that no split claimed (never handed out, and no longer claimable: a
//! claim needs a chain lock, and the old record is frozen, then retired),
//! then free leaves past their grace period. So free leaves wait in the
//! free list, not in the stashes of models that stopped splitting, and a
//! model keeps what its bursts take across retrainings that saw no split.
//!
//! The bound this keeps, with `D` = [`AgentStats::stash_demand`] (each
//! model's demand, or the slots its current record took if more, plus
//! one; at most `leaf_stash` each). A split draws a new leaf only past
//! its record's stash. A record stashed in full (`demand + 1`, within
//! `leaf_stash`) draws fewer leaves than the slots by which it raises its
//! model's demand: such draws total less than `D`. A record stashed short
//! was made when the free list had no leaf ready, so every leaf handed
//! out then was live, stashed (at most `D`), within its grace period or a
//! compute node's spare; and from then on the records current at that
//! moment draw at most the slots they take (less than `D`). So
//! `alloc_num` stays below the most leaves ever live, plus the most freed
//! within one grace period, plus the compute nodes' spares (at most one
//! per session splitting at once), plus `3 * D`. Demands only rise, and
//! at most to `leaf_stash`, so a store emptied and refilled again and
//! again soon stops drawing new leaves: its free leaves wait in the free
//! list and in stashes sized for the bursts its models saw
//! (`host/tests/kv_leaf_reuse.rs`).
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

use alloc::collections::{BTreeSet, VecDeque};
use alloc::vec::Vec;
use core::time::Duration;

use rolex_core::entry::{LeafAddr, LockOwner, LtEntry, SltHeader};
use rolex_core::layout::topology;
use rolex_core::layout::{
    CirqHeader, EditError, Leaf, LeafError, LeafRegion, LeafRegionHeader, ModelRecord,
    ModelRecordParams, ModelSegment, ModelState, Pop, Slot, Superblock,
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
    /// Most free leaves a new record gets in its SLT's unused slots (at
    /// most 255): the leaf of each slot for the compute node that claims
    /// it, so splits reuse the leaves retraining freed at no extra round
    /// trip. A record gets one more than the most slots a record of its
    /// model took (module docs, "Leaf stashes"), up to this. 128 by
    /// default (the slots a model uses before it is queued).
    pub leaf_stash: u64,
    /// Leaves of a model a retraining cuts out: a model grown past twice
    /// this is cut into runs of at most this many leaves, each a model of
    /// its own in a new directory slot (so keys beyond the loaded range,
    /// which all go to the last model, make new models). 256 by default
    /// (as bulk loading).
    pub max_model_leaves: u64,
    /// Least time between two looks at every model's SLT header (what
    /// finds models due without a CirQ ticket: a lost enqueue, or a
    /// trigger below [`SltHeader::RETRAIN_SLOT`]); in between,
    /// [`Agent::poll`] looks only at the models queued and those the last
    /// look found due. One look costs a load per model, a cache miss each
    /// (871 models: about 6% of a busy agent's CPU when every poll looked,
    /// the saving left once the idle walk was paced — README);
    /// a model is found due at most this late. 1 ms by default; zero looks
    /// at every poll.
    pub slt_scan_every: Duration,
    /// Least time between two idle sweep walks that retrained nothing
    /// (module docs: a walk reads a whole model; one per poll was a
    /// quarter of a busy agent's CPU). A walk that retrains its model is
    /// followed by the next at once. 10 ms by default (the memory node's
    /// idle park); zero walks at every idle poll.
    pub sweep_every: Duration,
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
            leaf_stash: SltHeader::RETRAIN_SLOT as u64,
            max_model_leaves: 256,
            slt_scan_every: Duration::from_millis(1),
            sweep_every: Duration::from_millis(10),
        }
    }
}

/// The pool's leaf region, as its header (read from `mem`) checked
/// against the superblock `sb` has it.
pub(crate) fn read_leaf_region<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
) -> Result<LeafRegion, AgentError> {
    let mut lrh = [0u8; LeafRegionHeader::SIZE as usize];
    mem.read(sb.leaf_region_offset(), &mut lrh)?;
    let header = LeafRegionHeader::read_from_bytes(&lrh).map_err(|_| {
        AgentError::Layout(rolex_core::layout::LayoutError::TooShort {
            part: rolex_core::layout::Part::LeafRegion,
            needed: LeafRegionHeader::SIZE,
            found: lrh.len() as u64,
        })
    })?;
    Ok(header.check(&sb.leaf_region()?)?)
}

/// Bytes of the topology blob at `at` (what the superblock's offset word
/// names), by the blob's own count: the offset word is what makes a blob
/// the topology (the agent writes the length word first), so after a
/// death between the two stores the length word may not be this blob's.
fn read_topology_len<M: PoolMemory>(mem: &M, sb: &Superblock, at: u64) -> Result<u64, AgentError> {
    let mut head = [0u8; topology::HEADER_SIZE as usize];
    mem.read(at, &mut head)?;
    let count = u64::from_le_bytes(head[..8].try_into().unwrap_or([0; 8]));
    topology::len_for(count)
        .filter(|&n| n <= sb.model_region_len())
        .ok_or(AgentError::Layout(
            rolex_core::layout::LayoutError::InvalidField {
                field: rolex_core::layout::Field::ModelCount,
                value: count,
            },
        ))
}

/// The published topology: its blob's offset and bytes, decoded (see
/// [`read_topology_len`]).
pub(crate) fn read_topology<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
) -> Result<(u64, u64, topology::Topology), AgentError> {
    let at = mem.load(Superblock::UPPER_OFFSET_OFFSET)?;
    let len = read_topology_len(mem, sb, at)?;
    let mut blob = alloc::vec![0u8; len as usize];
    mem.read(at, &mut blob)?;
    Ok((at, len, topology::decode(&blob, sb.directory_capacity())?))
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
    /// Models in the directory (grows when a retraining splits a model).
    pub models: u64,
    /// Leaves retraining gave back: emptied leaves dropped from their
    /// chains, and leaves a record's SLT named that no chain linked (but
    /// not stashed leaves no split claimed that the new record's stash
    /// took over).
    pub leaves_freed: u64,
    /// Free leaves stashed in new records' SLTs for splits to reuse (a
    /// leaf carried over from the old record's stash counts again).
    pub leaves_stashed: u64,
    /// Models cut into several by retraining (each adds
    /// [`RetrainReport::new_models`] models).
    pub models_cut: u64,
    /// Cuts not made because the directory had no slot left (the model
    /// was retrained whole).
    pub cuts_refused: u64,
    /// Retrainings of models whose SLT was not due, made because at least
    /// a quarter of their leaves would merge away (deletes).
    pub sweep_retrains: u64,
    /// Leaves held by the agent as free: dropped from their chains by a
    /// retraining and not yet handed out again.
    pub leaves_free: u64,
    /// Leaves the models' stashes are sized for: over every model, one
    /// more than the most SLT slots one of its records took (its current
    /// record included), at most [`AgentConfig::leaf_stash`]. The leaf
    /// region's high-water mark stays within the most leaves ever live
    /// plus a slack of three times this, plus leaves within their grace
    /// period and compute nodes' spares (module docs, "Leaf stashes").
    pub stash_demand: u64,
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
    /// Segments of the new records.
    pub segments: u64,
    /// Models the retraining added: it cut a model grown past twice
    /// [`AgentConfig::max_model_leaves`] leaves into several (0: not cut).
    pub new_models: u64,
    /// Nanoseconds the model was frozen.
    pub freeze_ns: u64,
}

/// A model prepared for retraining (step 1), not yet frozen.
#[derive(Clone, Debug)]
pub struct Prepared {
    model_id: u64,
    record_at: u64,
    leaves: Vec<LeafInfo>,
    /// The leaves the new record would keep as prepared (see
    /// [`keep_nonempty`]): what `segments` were fitted over.
    kept: Vec<LeafAddr>,
    segments: Vec<ModelSegment>,
}

impl Prepared {
    /// Whether the kept leaves under the freeze are those prepared.
    fn kept_unchanged(&self, leaves: &[LeafInfo]) -> bool {
        leaves.len() == self.kept.len() && leaves.iter().zip(&self.kept).all(|(a, b)| a.addr == *b)
    }

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
    /// Leaves given back (emptied leaves dropped by a retraining, leaves
    /// left unlinked in a retired record's SLT), each with the clock from
    /// which it may be handed out again (its grace period, as a retired
    /// record's: no compute node still reads it through a stale cache).
    free_leaves: VecDeque<(LeafAddr, u64)>,
    /// Leaves stashed in each model's current record (indexed like
    /// `records`).
    stash_len: Vec<u64>,
    /// The most SLT slots one record of each model took before it was
    /// retrained (indexed like `records`): what its stash is sized for.
    demand: Vec<u64>,
    /// The published topology: (first key, directory slot) in key order,
    /// its blob's pool offset and bytes, and its epoch.
    topology: Vec<(u64, u64)>,
    topology_at: (u64, u64),
    epoch: u64,
    /// The model the next idle [`Self::sweep`] looks at.
    sweep_next: u64,
    /// When the next idle sweep walk may start (agent clock).
    sweep_at: u64,
    /// When every model's SLT header was last looked at (`None`: never),
    /// and the models that look found due and that were not retrained
    /// since (see [`AgentConfig::slt_scan_every`]).
    scanned_at: Option<u64>,
    watch: BTreeSet<u64>,
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
        let region = read_leaf_region(&mem, &sb)?;
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
            free_leaves: VecDeque::new(),
            stash_len: Vec::new(),
            demand: Vec::new(),
            topology: Vec::new(),
            topology_at: (sb.upper_offset(), 0),
            epoch: 0,
            sweep_next: 0,
            sweep_at: 0,
            scanned_at: None,
            watch: BTreeSet::new(),
        };
        let (at, len, t) = read_topology(&agent.mem, &sb)?;
        agent.topology_at = (at, len);
        agent.epoch = t.epoch;
        agent.topology = t.first_keys.into_iter().zip(t.ids).collect();
        for m in 0..sb.model_count() {
            let at = agent.mem.load(sb.directory_entry_offset(m)?)?;
            let r = agent.record(at)?;
            agent.records.push(at);
            agent.slts.push(r.slt_offset());
            agent.backoff.push(Backoff::default());
            agent.stash_len.push(0);
            agent.demand.push(0);
        }
        agent.stats.model_region_used = agent.space.extent();
        agent.stats.models = agent.records.len() as u64;
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
        let mut s = self.stats;
        s.leaves_free = self.free_leaves.len() as u64 + self.stashed_unclaimed();
        let cap = self.cfg.leaf_stash.min(SltHeader::CAPACITY);
        s.stash_demand = (0..self.records.len() as u64)
            .map(|m| {
                let used = self.slt_used(m).unwrap_or(0);
                let demand = self.demand.get(m as usize).copied().unwrap_or(0);
                demand.max(used).saturating_add(1).min(cap)
            })
            .sum();
        s
    }

    /// Leaves stashed in live records' SLTs and not claimed yet.
    fn stashed_unclaimed(&self) -> u64 {
        (0..self.records.len() as u64)
            .filter(|&m| self.stash_len[m as usize] > 0)
            .map(|m| {
                let used = self.slt_used(m).unwrap_or(0);
                self.stash_len[m as usize].saturating_sub(used)
            })
            .sum()
    }

    /// The first model-region byte past every record in use or retired
    /// (where bump allocation goes on); a restarted agent attaches with it
    /// (and does not reuse the retired records below it: the free space is
    /// kept in the agent's memory only).
    pub fn next_free(&self) -> u64 {
        self.space.next_free()
    }

    /// Publishes `entries` (first key, slot; in key order, tiling the key
    /// space) as the topology, in a blob written in free model-region
    /// space (restart recovery, [`crate::recover`], when a cut committed
    /// but was not published).
    pub(crate) fn republish_topology(
        &mut self,
        entries: Vec<(u64, u64)>,
    ) -> Result<(), AgentError> {
        let epoch = self.epoch + 1;
        let bytes = topology::encode(epoch, &entries);
        let len = bytes.len() as u64;
        let now = self.mem.now_ns();
        let at = self
            .space
            .alloc(len, now)
            .ok_or(AgentError::ModelRegionFull {
                needed: len,
                left: self.space.largest(now),
            })?;
        self.mem.write(at, &bytes)?;
        self.publish(&NewTopology {
            at,
            len,
            epoch,
            entries,
        })?;
        Ok(())
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
        // Every model's SLT header now and then; in between, the models
        // queued and those the last look found due (they stay due until
        // retrained: an SLT only fills).
        let scan = self.scanned_at.map_or(true, |at| {
            now.saturating_sub(at) >= ns(self.cfg.slt_scan_every)
        });
        let candidates: Vec<u64> = if scan {
            self.watch.clear();
            self.scanned_at = Some(now);
            (0..self.records.len() as u64).collect()
        } else {
            self.watch.union(&self.pending).copied().collect()
        };
        let mut best: Option<(u64, u64)> = None;
        for m in candidates {
            if m >= self.records.len() as u64 {
                continue;
            }
            let used = self.slt_used(m)?;
            let due = used >= self.cfg.retrain_trigger.max(1)
                || (self.pending.contains(&m) && used >= queued_min.max(1));
            // Watched even while backed off or rolling forward: due once
            // that is over, whenever the next look at every model comes.
            if due && scan {
                self.watch.insert(m);
            }
            if !self.ready(m, now) || self.is_unfinished(m) {
                continue;
            }
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
            return self.sweep(now);
        };
        let r = self.retrain(m);
        if r.is_ok() {
            self.pending.remove(&m);
            self.watch.remove(&m);
        }
        self.account(m, r).map(Some)
    }

    /// With nothing due: looks at the next model in turn (a walk of its
    /// chains, nothing locked) and retrains it if at least a quarter of
    /// its leaves would merge away ([`keep_nonempty`]): deletes empty and
    /// thin leaves without filling any SLT, and this gives their space
    /// back all the same. `Ok(None)`: the model needs nothing, or the last
    /// walk retrained nothing less than [`AgentConfig::sweep_every`] ago.
    fn sweep(&mut self, now: u64) -> Result<Option<RetrainReport>, AgentError> {
        let n = self.records.len() as u64;
        if n == 0 || now < self.sweep_at {
            return Ok(None);
        }
        let m = self.sweep_next % n;
        self.sweep_next = m + 1;
        if !self.ready(m, now) || self.is_unfinished(m) {
            return Ok(None);
        }
        let r = self.record(self.records[m as usize])?;
        let leaves = walk_model(&self.mem, &self.region, &r, &mut self.buf)?;
        let kept = keep_nonempty(&leaves, self.merge_limit()).len();
        if leaves.len() < 2 || (leaves.len() - kept) * 4 < leaves.len() {
            self.sweep_at = now.saturating_add(ns(self.cfg.sweep_every));
            return Ok(None);
        }
        self.stats.sweep_retrains += 1;
        let r = self.retrain(m);
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
        let kept = keep_nonempty(&leaves, self.merge_limit());
        let fences: Vec<u64> = kept.iter().map(|l| l.fence_lo).collect();
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
            kept: kept.iter().map(|l| l.addr).collect(),
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

        // Steps 2–6: every writer of the model waits for them, so the
        // platform may keep this thread from being preempted meanwhile.
        self.mem.frozen(true);
        let done = self.frozen_steps(&r, at, state, &p);
        self.mem.frozen(false);
        done
    }

    /// Steps 2–6 of [`Self::install_steps`] (the frozen section): freeze,
    /// build, switch, then roll forward; before the switch a failure
    /// thaws.
    fn frozen_steps(
        &mut self,
        r: &ModelRecord,
        at: u64,
        state: ModelState,
        p: &Prepared,
    ) -> Result<RetrainReport, AgentError> {
        let t0 = self.mem.now_ns();
        let frozen = self.freeze(r, at, state);
        self.stats.lock_ns_total += self.mem.now_ns().saturating_sub(t0);
        if let Err(AgentError::FreezeDeadline { .. }) = frozen {
            self.stats.freeze_timeouts += 1;
        }
        let frozen = frozen?;
        let mut built = match self.build(r, at, state, p) {
            Ok(built) => built,
            Err(e) => {
                self.thaw(frozen)?;
                return Err(e);
            }
        };
        if let Err(e) = self.switch(&built) {
            // New slots written before the failure name records no
            // topology lists: unreachable, and their space is reused. Put
            // the model count and the slots back (best effort: a restart
            // also clears slots the topology does not list whose records
            // do not check, see `crate::recover`).
            let count = self.records.len() as u64;
            let _ = self.mem.store(Superblock::MODEL_COUNT_OFFSET, count);
            for p in &built.pieces[1..] {
                if let Ok(at) = self.sb.directory_entry_offset(p.model_id) {
                    let _ = self.mem.store(at, 0);
                }
            }
            self.unbuild(core::mem::take(&mut built.pieces), built.topology.take());
            self.thaw(frozen)?;
            return Err(e);
        }
        // The point of no return: the directory names the new record.
        self.roll_forward(Switched {
            built,
            t0,
            retired: false,
            published: false,
            done: 0,
            freed: false,
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
                    new_record: sw.built.report.new_record,
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
        if report.new_models > 0 {
            s.models_cut += 1;
        }
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
        let walked = self.rewalk(r, p)?;
        let (leaves, dropped) = self.drop_empty(&walked)?;
        let orphans = self.orphans(r, &walked)?;
        // The stash is sized for the most slots one record of the model
        // took (see "Leaf stashes" in the module docs), its own unclaimed
        // stash carried over first.
        let splits = SltHeader::from_raw(self.mem.load(r.slt_offset())?).used();
        let demand = match self.demand.get_mut(model_id as usize) {
            Some(d) => {
                *d = (*d).max(splits);
                *d
            }
            None => splits,
        };
        let plan = StashPlan {
            want: demand.saturating_add(1),
            carry: orphans
                .iter()
                .filter(|(_, claimed)| !claimed)
                .map(|&(a, _)| a)
                .collect(),
        };
        let starts = self.cut_points(&leaves);
        let made = match self.build_pieces(r, state, p, &leaves, &starts, plan.clone()) {
            // No room for the cut: retrain the model whole (the region
            // may have room for that, or the model is refused as usual).
            Err(AgentError::ModelRegionFull { .. }) if !starts.is_empty() => {
                self.stats.cuts_refused += 1;
                self.build_pieces(r, state, p, &leaves, &[], plan)
            }
            made => made,
        };
        let (pieces, topology, keys, segment_count) = made?;
        // Orphans carried over into a new stash stay stashed: not freed.
        let carried: BTreeSet<LeafAddr> = pieces
            .iter()
            .flat_map(|p| p.stash.carried().iter().map(|&(a, _)| a))
            .collect();
        let orphans = orphans
            .into_iter()
            .filter(|(a, _)| !carried.contains(a))
            .collect();
        let n = leaves.len() as u64;
        let new_at = pieces[0].at;
        Ok(Built {
            dropped,
            orphans,
            old_at: at,
            old_size: r.total_len()?,
            retire_at: at + ModelRecord::STATE_OFFSET,
            retired: state.frozen().retired(new_at)?.raw(),
            report: RetrainReport {
                model_id,
                old_record: at,
                new_record: new_at,
                leaves: n,
                synonyms_absorbed: (walked.len() as u64).saturating_sub(r.leaf_count()),
                keys,
                segments: segment_count,
                new_models: pieces.len() as u64 - 1,
                freeze_ns: 0,
            },
            pieces,
            topology,
            leaves,
        })
    }

    /// Step 4 for a model of `leaves` cut at `starts` (see
    /// [`Self::cut_points`]; none: one record): the new records, each
    /// with its share of `plan`'s stashed leaves (the old stash carried
    /// over first), and the topology blob
    /// that lists them when there are several. Nothing points at any of
    /// it yet; on an error nothing of it is kept. Returns them with the
    /// keys the leaves hold and the segments of all the records.
    fn build_pieces(
        &mut self,
        r: &ModelRecord,
        state: ModelState,
        p: &Prepared,
        leaves: &[LeafInfo],
        starts: &[usize],
        plan: StashPlan,
    ) -> Result<(Vec<Piece>, Option<NewTopology>, u64, u64), AgentError> {
        let StashPlan { want, mut carry } = plan;
        let model_id = r.model_id();
        let n = leaves.len() as u64;
        if !starts.is_empty() && !p.kept_unchanged(leaves) {
            // Each piece is fitted here anyway; counted as `segments_for`
            // counts a refit.
            self.stats.refits += 1;
        }
        let mut pieces: Vec<Piece> = Vec::with_capacity(starts.len() + 1);
        let mut keys = 0;
        let mut segment_count = 0;
        for (i, &start) in core::iter::once(&0).chain(starts).enumerate() {
            let end = starts.get(i).copied().unwrap_or(leaves.len());
            let part = &leaves[start..end];
            let params = PieceParams {
                model_id: if i == 0 {
                    model_id
                } else {
                    (self.records.len() + i - 1) as u64
                },
                first_key: part[0].fence_lo,
                key_hi: part[part.len() - 1].fence_hi,
                epsilon: r.epsilon(),
                generation: if i == 0 { state.next_generation() } else { 0 },
                predecessor: p.record_at,
            };
            let segments = if starts.is_empty() {
                self.segments_for(r, p, part)
            } else {
                let fences: Vec<u64> = part.iter().map(|l| l.fence_lo).collect();
                fit_model(&fences, r.epsilon()).map_err(AgentError::from)
            };
            let share = want.saturating_mul(part.len() as u64) / n.max(1);
            let made = segments.and_then(|segments| {
                segment_count += segments.len() as u64;
                self.build_record(&params, part, &segments, share, &mut carry)
            });
            match made {
                Ok((at, record, k, stash)) => {
                    keys += k;
                    pieces.push(Piece {
                        model_id: params.model_id,
                        at,
                        size: record.total_len()?,
                        record,
                        start,
                        stash,
                    });
                }
                Err(e) => {
                    self.unbuild(pieces, None);
                    return Err(e);
                }
            }
        }
        let topology = match self.next_topology(&pieces) {
            Ok(t) => t,
            Err(e) => {
                self.unbuild(pieces, None);
                return Err(e);
            }
        };
        Ok((pieces, topology, keys, segment_count))
    }

    /// Where a model of `leaves` (kept leaves, in key order) is cut into
    /// several: nowhere while it has at most twice
    /// [`AgentConfig::max_model_leaves`] leaves, or when the directory has
    /// no slot left for the new models; else into runs of equal length of
    /// at most `max_model_leaves`. Returns the index of each piece's first
    /// leaf but the first's.
    fn cut_points(&mut self, leaves: &[LeafInfo]) -> Vec<usize> {
        let max = self.cfg.max_model_leaves.max(1);
        let n = leaves.len() as u64;
        if n <= max.saturating_mul(2) {
            return Vec::new();
        }
        // A cut's topology is the published one with the model replaced by
        // its pieces: with an earlier cut still unpublished (its roll
        // forward failed), that would leave the earlier cut's models out.
        if self
            .unfinished
            .iter()
            .any(|sw| sw.built.topology.is_some() && !sw.published)
        {
            return Vec::new();
        }
        let k = n.div_ceil(max);
        let free_slots = self
            .sb
            .directory_capacity()
            .saturating_sub(self.records.len() as u64);
        if k - 1 > free_slots {
            self.stats.cuts_refused += 1;
            return Vec::new();
        }
        let run = n.div_ceil(k);
        (1..k)
            .map(|i| (i * run) as usize)
            .filter(|&i| i < leaves.len())
            .collect()
    }

    /// The topology after a retraining that cut its model into `pieces`
    /// (none when it was not cut): the blob, written in free model-region
    /// space, and what the agent keeps of it. Nothing points at it yet.
    fn next_topology(&mut self, pieces: &[Piece]) -> Result<Option<NewTopology>, AgentError> {
        if pieces.len() < 2 {
            return Ok(None);
        }
        let m = pieces[0].model_id;
        let mut entries = Vec::with_capacity(self.topology.len() + pieces.len());
        for &(first, id) in &self.topology {
            if id == m {
                entries.extend(pieces.iter().map(|p| (p.record.first_key(), p.model_id)));
            } else {
                entries.push((first, id));
            }
        }
        let epoch = self.epoch + 1;
        let bytes = topology::encode(epoch, &entries);
        let len = bytes.len() as u64;
        let now = self.mem.now_ns();
        let Some(at) = self.space.alloc(len, now) else {
            return Err(AgentError::ModelRegionFull {
                needed: len,
                left: self.space.largest(now),
            });
        };
        if let Err(e) = self.mem.write(at, &bytes) {
            self.space.unused(at, len);
            return Err(e.into());
        }
        Ok(Some(NewTopology {
            at,
            len,
            epoch,
            entries,
        }))
    }

    /// Gives back what a build that never went live took: its records'
    /// space and stashes (leaves carried over from the old record stay
    /// in its SLT, where they are), and its topology blob's space.
    fn unbuild(&mut self, pieces: Vec<Piece>, topology: Option<NewTopology>) {
        for p in pieces {
            self.space.unused(p.at, p.size);
            self.give_back_stash(p.stash);
        }
        if let Some(t) = topology {
            self.space.unused(t.at, t.len);
        }
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
        if !p.segments.is_empty() && p.kept_unchanged(leaves) {
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
    /// at it yet (its space is given back if writing it fails). Its stash:
    /// up to `want_stash` leaves, from `carry` first (see [`StashPlan`]).
    /// Returns its offset, its header and the keys its leaves hold.
    fn build_record(
        &mut self,
        piece: &PieceParams,
        leaves: &[LeafInfo],
        segments: &[ModelSegment],
        want_stash: u64,
        carry: &mut Vec<LeafAddr>,
    ) -> Result<(u64, ModelRecord, u64, Stash), AgentError> {
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
        let stash = self.take_stash(now, want_stash, carry);
        let written = self
            .write_record(new_at, piece, leaves, segments, keys)
            .and_then(|nr| self.write_stash(&nr, &stash.leaves).map(|()| nr));
        match written {
            Ok(nr) => Ok((new_at, nr, keys, stash)),
            Err(e) => {
                self.space.unused(new_at, size);
                carry.extend(self.give_back_stash(stash));
                Err(e)
            }
        }
    }

    /// Up to `want` (at most [`AgentConfig::leaf_stash`]) leaves for a new
    /// record's SLT: those of `carry` first, then free leaves whose grace
    /// period is over at `now`.
    fn take_stash(&mut self, now: u64, want: u64, carry: &mut Vec<LeafAddr>) -> Stash {
        let cap = want.min(self.cfg.leaf_stash).min(SltHeader::CAPACITY) as usize;
        let carried = carry.len().min(cap);
        let mut leaves: Vec<(LeafAddr, u64)> = carry.drain(..carried).map(|a| (a, now)).collect();
        while leaves.len() < cap {
            match self.free_leaves.front() {
                Some(&(_, ready_at)) if ready_at <= now => {
                    leaves.extend(self.free_leaves.pop_front());
                }
                _ => break,
            }
        }
        Stash { leaves, carried }
    }

    /// Leaves taken for a stash that did not go live: those from the free
    /// list free again, first; returns those carried over (still in the
    /// old record's SLT).
    fn give_back_stash(&mut self, stash: Stash) -> Vec<LeafAddr> {
        let Stash {
            mut leaves,
            carried,
        } = stash;
        for l in leaves.drain(carried..).rev() {
            self.free_leaves.push_front(l);
        }
        leaves.into_iter().map(|(a, _)| a).collect()
    }

    /// Writes `stash` into the unused SLT slots 1, 2, … of the new record
    /// `nr` (before it goes live): slot `i`'s word names the leaf the
    /// compute node that claims slot `i` splits into (pointer 0: linked to
    /// nothing until then).
    fn write_stash(
        &mut self,
        nr: &ModelRecord,
        stash: &[(LeafAddr, u64)],
    ) -> Result<(), AgentError> {
        let mut words = Vec::with_capacity(stash.len() * 8);
        for (addr, _) in stash {
            words.extend_from_slice(&LtEntry::for_leaf(*addr).raw().to_le_bytes());
        }
        if !words.is_empty() {
            self.mem.write(nr.slt_slot_offset(1)?, &words)?;
        }
        Ok(())
    }

    /// Step 3's reclamation: `walked` (every leaf of the frozen model, in
    /// key order) without the leaves retraining merges into the leaf
    /// before them — empty ones, and those whose keys fit beside that
    /// leaf's within three quarters of its slots ([`merges`]) — each
    /// merged leaf's range (and keys) handed to the kept leaf before it,
    /// whose `fence_hi` grows over it. The first leaf is always kept: its
    /// `fence_lo` is the model's first key. The counts the walks saw are
    /// only hints (a walk reuses a leaf it saw unchanged in its links): a
    /// merge is decided on counts read again under the freeze, when they
    /// are stable. Returns the kept leaves (fences and counts as the new
    /// record has them) and the merged ones, each with the index of the
    /// kept leaf that takes it.
    fn drop_empty(
        &mut self,
        walked: &[LeafInfo],
    ) -> Result<(Vec<LeafInfo>, Vec<Dropped>), AgentError> {
        let limit = self.merge_limit();
        let mut kept: Vec<LeafInfo> = Vec::with_capacity(walked.len());
        let mut fresh: Vec<bool> = Vec::with_capacity(walked.len());
        let mut dropped = Vec::new();
        for l in walked {
            let Some(last) = kept.last_mut() else {
                kept.push(*l);
                fresh.push(false);
                continue;
            };
            if !merges(last.count, l.count, limit) {
                kept.push(*l);
                fresh.push(false);
                continue;
            }
            let last_fresh = fresh.last_mut().expect("as long as kept");
            if !*last_fresh {
                last.count = read_leaf(&self.mem, &self.region, last.addr, &mut self.buf)?.count;
                *last_fresh = true;
            }
            let now = read_leaf(&self.mem, &self.region, l.addr, &mut self.buf)?;
            if merges(last.count, now.count, limit) {
                last.count += now.count;
                last.fence_hi = now.fence_hi;
                dropped.push((kept.len() - 1, now));
            } else {
                kept.push(now);
                fresh.push(true);
            }
        }
        Ok((kept, dropped))
    }

    /// The most keys a leaf may hold after retraining merged leaves into
    /// it: three quarters of its slots, so it does not split again soon.
    fn merge_limit(&self) -> u32 {
        let slots = self.region.leaf_slots();
        (slots - slots / 4).max(1)
    }

    /// Step 3's other reclamation: the leaves the frozen record `r`'s SLT
    /// names that no chain links (`walked`), each with whether it was ever
    /// handed out: stashed and never claimed (`false`: free at once), or
    /// claimed by a split that stopped before it linked its new leaf
    /// (`true`: free after the grace period, as its writer may still be
    /// reading it). No compute node can link them any more (the model is
    /// frozen, and retired after the switch).
    fn orphans(
        &self,
        r: &ModelRecord,
        walked: &[LeafInfo],
    ) -> Result<Vec<(LeafAddr, bool)>, AgentError> {
        let mut words = [0u8; ModelRecord::SLT_SIZE as usize];
        self.mem.read(r.slt_offset(), &mut words)?;
        let word =
            |i: usize| u64::from_le_bytes(words[8 * i..8 * i + 8].try_into().unwrap_or([0; 8]));
        let used = SltHeader::from_raw(word(0)).used();
        let named: Vec<(LeafAddr, bool)> = (1..SltHeader::SLOTS)
            .filter(|&i| word(i) != 0)
            .map(|i| (LtEntry::from_raw(word(i)).addr(), i as u64 <= used))
            .filter(|(addr, _)| self.region.leaf_offset(*addr).is_ok())
            .collect();
        Ok(unlinked(named, walked))
    }

    /// Step 4's writes: the record for `leaves` and `segments` at `new_at`.
    fn write_record(
        &mut self,
        new_at: u64,
        piece: &PieceParams,
        leaves: &[LeafInfo],
        segments: &[ModelSegment],
        keys: u64,
    ) -> Result<ModelRecord, AgentError> {
        let n = leaves.len() as u64;
        let nr = ModelRecord::new(
            new_at,
            &ModelRecordParams {
                model_id: piece.model_id,
                first_key: piece.first_key,
                key_hi: piece.key_hi,
                label_stride: 1,
                segment_count: segments.len() as u64,
                train_keys: keys,
                leaf_count: n,
                epsilon: piece.epsilon,
                generation: piece.generation,
                predecessor: piece.predecessor,
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
        // The new models' slots first: no compute node reaches them before
        // the topology names them (after the switch).
        let new = &built.pieces[1..];
        for p in new {
            self.mem
                .store(self.sb.directory_entry_offset(p.model_id)?, p.at)?;
        }
        if !new.is_empty() {
            let count = self.records.len() as u64 + new.len() as u64;
            self.mem.store(Superblock::MODEL_COUNT_OFFSET, count)?;
        }
        let first = &built.pieces[0];
        self.mem
            .store(self.sb.directory_entry_offset(m)?, first.at)?;
        self.records[m as usize] = first.at;
        self.slts[m as usize] = first.record.slt_offset();
        // A cut model's demand is shared among its pieces by their leaves.
        let n = built.leaves.len().max(1) as u64;
        let demand = self.demand.get(m as usize).copied().unwrap_or(0);
        let part = |i: usize| {
            let end = built
                .pieces
                .get(i + 1)
                .map_or(built.leaves.len(), |q| q.start);
            demand * (end - built.pieces[i].start) as u64 / n
        };
        if let (false, Some(d)) = (new.is_empty(), self.demand.get_mut(m as usize)) {
            *d = part(0);
        }
        for (i, p) in new.iter().enumerate() {
            self.records.push(p.at);
            self.slts.push(p.record.slt_offset());
            self.backoff.push(Backoff::default());
            self.stash_len.push(0);
            self.demand.push(part(i + 1));
        }
        self.stats.models = self.records.len() as u64;
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
        if !sw.published {
            if let Some(t) = &sw.built.topology {
                self.publish(t)?;
            }
            sw.published = true;
        }
        while sw.done < sw.built.leaves.len() {
            self.release_leaf(&sw.built, sw.done)?;
            sw.done += 1;
        }
        if !sw.freed {
            // Only now: a dropped leaf is marked freed when the leaf
            // before it is released, and must be before it is reused.
            sw.freed = true;
            let now = self.mem.now_ns();
            let ready_at = now.saturating_add(ns(self.cfg.record_grace));
            let b = &sw.built;
            // Never handed out: first in line.
            for &(a, _) in b.orphans.iter().filter(|(_, claimed)| !claimed) {
                self.free_leaves.push_front((a, now));
            }
            self.free_leaves.extend(
                b.dropped
                    .iter()
                    .map(|(_, l)| l.addr)
                    .chain(b.orphans.iter().filter(|(_, c)| *c).map(|(a, _)| *a))
                    .map(|a| (a, ready_at)),
            );
            self.stats.leaves_freed += (b.dropped.len() + b.orphans.len()) as u64;
            for p in &b.pieces {
                self.stats.leaves_stashed += p.stash.len() as u64;
                if let Some(n) = self.stash_len.get_mut(p.model_id as usize) {
                    *n = p.stash.len() as u64;
                }
            }
        }
        Ok(())
    }

    /// Step 5, after the switch and the retirement, when the model was cut:
    /// points the superblock at the new topology blob (`upper_len`, then
    /// `upper_offset`: the one write that makes it the blob; see
    /// `rolex_core::layout::topology`) and gives the old blob's space back
    /// for reuse after the grace period. Until then compute nodes route
    /// the new models' keys to the model's slot, whose record no longer
    /// covers them, and read the topology again. Idempotent.
    fn publish(&mut self, t: &NewTopology) -> Result<(), PoolError> {
        self.mem.store(Superblock::UPPER_LEN_OFFSET, t.len)?;
        self.mem.store(Superblock::UPPER_OFFSET_OFFSET, t.at)?;
        if self.epoch < t.epoch {
            let now = self.mem.now_ns();
            let (old_at, old_len) = self.topology_at;
            self.space.retire(old_at, old_len, now);
            self.topology_at = (t.at, t.len);
            self.topology = t.entries.clone();
            self.epoch = t.epoch;
        }
        Ok(())
    }

    /// Step 5, after the switch: marks the old record retired with a
    /// forward pointer to the new one (its LT entries stay locked until its
    /// space is reused, after the grace period).
    fn retire(&self, b: &Built) -> Result<(), PoolError> {
        Ok(self.mem.store(b.retire_at, b.retired)?)
    }

    /// Step 6 for leaf `j` of the new record: takes in the keys of the
    /// leaves merged into it, raises its `fence_hi` over their ranges and
    /// clears its `next` link (it is a training leaf with an empty chain
    /// now), re-sealed, in one write; then marks the merged leaves freed;
    /// then unlocks its LT entry. So a writer that locks it finds it
    /// covering its whole range with every key; a reader that reads it
    /// and a merged leaf meanwhile finds a key in either with the same
    /// value (nothing is written to them before the unlock); and a reader
    /// with a stale cache that reaches a merged leaf afterwards finds it
    /// freed and refreshes. Idempotent: keys already taken in are not
    /// taken again, and a merged leaf already freed holds none.
    fn release_leaf(&mut self, b: &Built, j: usize) -> Result<(), PoolError> {
        let l = b.leaves[j];
        // `dropped` is in order of the kept leaf that takes each: a
        // search, not a scan, per leaf released under the freeze.
        let from = b.dropped.partition_point(|(k, _)| *k < j);
        let to = from + b.dropped[from..].partition_point(|(k, _)| *k == j);
        let drops = b.dropped[from..to].iter().map(|(_, d)| d.addr);
        if l.next.raw() != 0 || from < to {
            let mut taken: Vec<Slot> = Vec::new();
            for d in drops.clone() {
                read_leaf(&self.mem, &self.region, d, &mut self.buf)?;
                let leaf = Leaf::from_bytes(&self.buf).map_err(|error| PoolError::Leaf {
                    leaf: d.leaf(),
                    error,
                })?;
                if let Ok(v) = leaf.validate() {
                    taken.extend_from_slice(v.entries());
                }
            }
            // Everything is computed before the one write: a leaf that
            // cannot take the keys (never, by the merge limit) is left
            // whole, with its merged leaves, and the error reported.
            let off = self.region.leaf_offset(l.addr)?;
            read_leaf(&self.mem, &self.region, l.addr, &mut self.buf)?;
            let bad = |error| PoolError::Leaf {
                leaf: l.addr.leaf(),
                error,
            };
            let leaf = Leaf::from_bytes_mut(&mut self.buf).map_err(bad)?;
            let invalid = |e: EditError| match e {
                EditError::Invalid(error) => bad(error),
                _ => bad(LeafError::BadLength { len: 0 }),
            };
            // `read_leaf` validated it; its entries change only with keys
            // taken in (a leaf that only leaves its chain keeps them: no
            // copy, under the freeze, for each such leaf).
            let all = if taken.is_empty() {
                None
            } else {
                let mut all: Vec<Slot> = leaf.validate().map_err(bad)?.entries().to_vec();
                let top = all.last().map(|s| s.key());
                all.extend(taken.iter().filter(|s| top.map_or(true, |t| s.key() > t)));
                Some(all)
            };
            leaf.extend_fence_hi(l.fence_hi).map_err(invalid)?;
            if let Some(all) = all {
                leaf.set_entries(&all).map_err(invalid)?;
            }
            leaf.clear_next();
            leaf.seal();
            self.mem.write(off, &self.buf)?;
            for d in drops {
                self.rewrite_leaf(d, Leaf::mark_freed)?;
            }
        }
        let piece = b.piece_of(j);
        self.mem.store(
            piece.record.lt_entry_offset((j - piece.start) as u64)?,
            LtEntry::for_leaf(l.addr).raw(),
        )?;
        Ok(())
    }
}

impl<M: PoolMemory> Agent<M> {
    /// Reads the leaf at `addr` (validated), applies `edit`, seals and
    /// writes it back.
    fn rewrite_leaf(
        &mut self,
        addr: LeafAddr,
        edit: impl FnOnce(&mut Leaf),
    ) -> Result<(), PoolError> {
        let off = self.region.leaf_offset(addr)?;
        read_leaf(&self.mem, &self.region, addr, &mut self.buf)?;
        let leaf = Leaf::from_bytes_mut(&mut self.buf).map_err(|error| PoolError::Leaf {
            leaf: addr.leaf(),
            error,
        })?;
        edit(leaf);
        leaf.seal();
        self.mem.write(off, &self.buf)?;
        Ok(())
    }
}

/// Free leaves stashed in a record's SLT, in slot order, each with the
/// clock from which it was free: first `carried` leaves carried over from
/// the old record's own stash (never handed out), then leaves from the
/// free list.
struct Stash {
    leaves: Vec<(LeafAddr, u64)>,
    carried: usize,
}

impl Stash {
    /// Leaves stashed.
    fn len(&self) -> usize {
        self.leaves.len()
    }

    /// Those carried over from the old record's stash.
    fn carried(&self) -> &[(LeafAddr, u64)] {
        &self.leaves[..self.carried]
    }
}

/// What a retraining stashes in its new records: `want` leaves in all,
/// taking first `carry`, the old record's stashed leaves that no split
/// claimed. They were never handed out, and no compute node claims them
/// any more (claims are made under a chain lock, and the old record is
/// frozen, then retired), so they are free at once; a new record that
/// takes them keeps them where splits of its model find them, instead of
/// drawing from the free list what its own stash already held.
#[derive(Clone)]
struct StashPlan {
    want: u64,
    carry: Vec<LeafAddr>,
}

/// A leaf retraining dropped, with the index (among the kept leaves) of
/// the leaf that takes its range.
type Dropped = (usize, LeafInfo);

/// Whether retraining merges a leaf of `count` keys into the kept leaf
/// before it, which holds `into` keys: when it is empty, or when both fit
/// within `limit` ([`Agent::merge_limit`]).
fn merges(into: u32, count: u32, limit: u32) -> bool {
    count == 0 || into.saturating_add(count) <= limit
}

/// The leaves a new record keeps of `walked` (a model's leaves in key
/// order), by the counts the walk saw: each leaf [`merges`] into the kept
/// one before it, or is kept. What [`Agent::prepare`] fits over; under the
/// freeze, [`Agent::drop_empty`] decides again on counts read afresh.
fn keep_nonempty(walked: &[LeafInfo], limit: u32) -> Vec<LeafInfo> {
    let mut kept: Vec<LeafInfo> = Vec::with_capacity(walked.len());
    for l in walked {
        match kept.last_mut() {
            Some(last) if merges(last.count, l.count, limit) => {
                last.count += l.count;
                last.fence_hi = l.fence_hi;
            }
            _ => kept.push(*l),
        }
    }
    kept
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
    /// The new records: the model's own slot's first, then those of the
    /// models it was cut into, in key order (one when it was not cut).
    pieces: Vec<Piece>,
    /// The topology blob listing the new models (when the model was cut).
    topology: Option<NewTopology>,
    /// The old record's pool offset and bytes (given back once retired).
    old_at: u64,
    old_size: u64,
    /// Every leaf of the new record, in LT order (fences as it has them).
    leaves: Vec<LeafInfo>,
    /// Emptied leaves of the old record it does not keep, each with the
    /// index (in `leaves`) of the leaf that takes its range, in order of
    /// that index ([`Agent::drop_empty`] makes them so).
    dropped: Vec<Dropped>,
    /// Leaves the old record's SLT names that no chain links, and whether
    /// each was claimed (see [`Agent::orphans`]).
    orphans: Vec<(LeafAddr, bool)>,
    /// The old record's state word, and its value once retired.
    retire_at: u64,
    retired: u64,
    /// What the retraining did (`freeze_ns` is set once it is finished).
    report: RetrainReport,
}

impl Built {
    /// The piece whose record lists leaf `j` (an index into `leaves`).
    fn piece_of(&self, j: usize) -> &Piece {
        let i = self.pieces.partition_point(|p| p.start <= j);
        &self.pieces[i.saturating_sub(1)]
    }
}

/// One new record of a retraining.
struct Piece {
    /// Its directory slot.
    model_id: u64,
    /// Its pool offset, bytes and header.
    at: u64,
    size: u64,
    record: ModelRecord,
    /// Index (in `Built::leaves`) of its first leaf.
    start: usize,
    /// Free leaves stashed in its SLT (with when they became free).
    stash: Stash,
}

/// What a new record is made for.
struct PieceParams {
    model_id: u64,
    /// The record the pieces are built from.
    predecessor: u64,
    first_key: u64,
    key_hi: u64,
    epsilon: u64,
    generation: u16,
}

/// A topology blob written beside the current one, not yet published.
struct NewTopology {
    at: u64,
    len: u64,
    epoch: u64,
    /// Its entries: (first key, directory slot), in key order.
    entries: Vec<(u64, u64)>,
}

/// A retraining past its point of no return (the directory names the new
/// record): the steps left, which the agent only ever rolls forward.
struct Switched {
    built: Built,
    /// The clock when the freeze began.
    t0: u64,
    /// Whether the old record is retired.
    retired: bool,
    /// Whether the new topology (if any) is published.
    published: bool,
    /// Leaves (a prefix of `built.leaves`) whose link is cleared and whose
    /// entry is unlocked.
    done: usize,
    /// Whether the dropped and orphaned leaves went to the free list.
    freed: bool,
}

/// Of the leaves an SLT names (`named`, in slot order, each with whether
/// it was handed out), those no leaf of `walked` is, in the same order.
///
/// Runs under the freeze, so it looks the walk's leaves up in a sorted
/// copy of the named ones (at most 255) rather than building a tree of
/// every walked leaf for each retraining (a quarter of the frozen
/// section's time before), and a walked leaf outside the named ones'
/// range costs two comparisons, no search: most of a model's leaves are
/// its training leaves, numbered apart from the leaves splits drew since
/// (`rolex memnode`'s insert phase, ~300 walked and 32 named leaves: 3.0–
/// 3.6 µs inside the freeze against 6.4–6.9 with a search for each).
fn unlinked(named: Vec<(LeafAddr, bool)>, walked: &[LeafInfo]) -> Vec<(LeafAddr, bool)> {
    let mut sorted: Vec<LeafAddr> = named.iter().map(|&(a, _)| a).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let (Some(&lo), Some(&hi)) = (sorted.first(), sorted.last()) else {
        return named;
    };
    let mut linked = alloc::vec![false; sorted.len()];
    for l in walked.iter().filter(|l| (lo..=hi).contains(&l.addr)) {
        if let Ok(i) = sorted.binary_search(&l.addr) {
            linked[i] = true;
        }
    }
    let is_linked = |a: &LeafAddr| sorted.binary_search(a).is_ok_and(|i| linked[i]);
    named.into_iter().filter(|(a, _)| !is_linked(a)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::testing::VecPool;
    use core::sync::atomic::Ordering::SeqCst;
    use rolex_core::layout::Slot;

    proptest::proptest! {
        /// Against the formulation with a set of every walked leaf, on
        /// small address spaces (repeats in both lists, leaves named and
        /// walked or not) and on lists of an SLT's size.
        #[test]
        fn unlinked_keeps_the_named_leaves_no_walk_reaches_in_slot_order(
            (named, walked) in proptest::prop_oneof![
                (
                    proptest::collection::vec((0u64..12, proptest::bool::ANY), 0..8),
                    proptest::collection::vec(0u64..12, 0..12),
                ),
                // Up to a full SLT's worth, the walk reaching part of it
                // and leaves on both sides of its range.
                (
                    proptest::collection::vec((0u64..600, proptest::bool::ANY), 0..256),
                    proptest::collection::vec(0u64..600, 0..400),
                ),
            ],
        ) {
            let addr = |n: u64| LeafAddr::new(0, n).unwrap();
            let named: Vec<(LeafAddr, bool)> =
                named.into_iter().map(|(n, h)| (addr(n), h)).collect();
            let walked: Vec<LeafInfo> = walked
                .into_iter()
                .map(|n| LeafInfo {
                    addr: addr(n),
                    fence_lo: 0,
                    fence_hi: 0,
                    count: 0,
                    next: LtEntry::from_raw(0),
                    version: 0,
                })
                .collect();
            let set: BTreeSet<LeafAddr> = walked.iter().map(|l| l.addr).collect();
            let want: Vec<(LeafAddr, bool)> =
                named.iter().copied().filter(|(a, _)| !set.contains(a)).collect();
            proptest::prop_assert_eq!(unlinked(named, &walked), want);
        }
    }

    fn load(n: u64) -> (VecPool, u64) {
        crate::memory::testing::small_pool(n)
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
        entries.push(Slot::with_u64(key, key));
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
        // Five leaves, two of them merged into one (a leaf of 2 keys and
        // one of 1 fit within 3 of its 4 slots).
        assert_eq!((r.leaves, r.synonyms_absorbed, r.keys), (4, 1, 9));
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
        assert_eq!(leaves.len(), 4);
        assert_eq!(leaves.iter().map(|l| u64::from(l.count)).sum::<u64>(), 9);
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
    fn every_frozen_section_is_left_also_when_it_thaws() {
        // Retrained: one section, entered before the freeze and left after
        // the last leaf is released.
        let (mem, next_free) = load(40);
        let mut agent = Agent::attach(&mem, AgentConfig::default(), next_free).unwrap();
        agent.retrain(0).unwrap();
        assert_eq!(
            (mem.frozen_in.load(SeqCst), mem.frozen_out.load(SeqCst)),
            (1, 1)
        );
        assert_eq!(mem.relax_frozen.load(SeqCst), 0);
        // A writer holds a lock for good: the freeze waits (relaxing inside
        // the section, where a platform must let that writer run), thaws at
        // its deadline, and the section is left all the same.
        let r = agent.records()[0];
        let (rec, _) = lt_words(&mem, r);
        let lt = rec.lt_entry_offset(1).unwrap();
        let e = LtEntry::from_raw(mem.load(lt).unwrap());
        mem.store(lt, e.with_lock().raw()).unwrap();
        mem.tick_on_relax(1_000_000);
        let err = agent.retrain(0).unwrap_err();
        assert!(matches!(err, AgentError::FreezeDeadline { .. }), "{err}");
        assert_eq!(
            (mem.frozen_in.load(SeqCst), mem.frozen_out.load(SeqCst)),
            (2, 2)
        );
        assert!(mem.relax_frozen.load(SeqCst) > 0);
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

    /// The leaf words of `record`'s SLT slots 1 to `n`.
    fn stash_words(mem: &VecPool, agent: &Agent<&VecPool>, record: u64, n: u64) -> Vec<LeafAddr> {
        let r = agent.record(record).unwrap();
        (1..=n as u8)
            .map(|i| LtEntry::from_raw(mem.load(r.slt_slot_offset(i).unwrap()).unwrap()).addr())
            .collect()
    }

    /// Splits a training leaf of model 0's current record (the first from
    /// `j` on with room for a key between its keys or after them),
    /// inserting a key in the middle of that room.
    fn split_leaf(mem: &VecPool, agent: &Agent<&VecPool>, j: u64) {
        let sb = *agent.superblock();
        let at = agent.records()[0];
        let r = agent.record(at).unwrap();
        let region = sb.leaf_region().unwrap();
        let mut buf = leaf_buffer(&region);
        for j in (j..r.leaf_count()).chain(0..j) {
            let e = LtEntry::from_raw(mem.load(r.lt_entry_offset(j).unwrap()).unwrap());
            read_leaf(mem, &region, e.addr(), &mut buf).unwrap();
            let leaf = Leaf::from_bytes(&buf).unwrap();
            let mut keys: Vec<u64> = leaf
                .validate()
                .unwrap()
                .entries()
                .iter()
                .map(|s| s.key())
                .collect();
            keys.push(leaf.fence_hi().saturating_add(1));
            if let Some(w) = keys.windows(2).find(|w| w[1] - w[0] >= 2) {
                client_split(mem, &sb, at, j, w[0] + (w[1] - w[0]) / 2);
                return;
            }
        }
        panic!("no leaf of model 0 has room for a key");
    }

    #[test]
    fn an_unclaimed_stash_is_carried_over_and_survives_a_failed_switch() {
        let (mem, next_free) = load(40);
        let grace = 1_000;
        let cfg = AgentConfig {
            record_grace: Duration::from_nanos(grace),
            ..AgentConfig::default()
        };
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        let sb = *agent.superblock();
        // Each split leaves a leaf of one key that the retraining merges
        // into the leaf before it: a leaf freed, ready after the grace (so
        // none is stashed yet: `client_split` ignores stashes).
        for _ in 0..6 {
            split_leaf(&mem, &agent, 1);
            agent.retrain(0).unwrap();
        }
        assert!(agent.free_leaves.len() >= 3, "{:?}", agent.stats());
        assert_eq!(agent.stash_len[0], 0);
        mem.advance(2 * grace);
        // Two splits: the demand is 2, and the new record gets 3 leaves.
        split_leaf(&mem, &agent, 1);
        split_leaf(&mem, &agent, 2);
        agent.retrain(0).unwrap();
        assert_eq!((agent.demand[0], agent.stash_len[0]), (2, 3));
        let stashed = stash_words(&mem, &agent, agent.records()[0], 3);
        let free = agent.free_leaves.len();
        let freed = agent.stats().leaves_freed;
        // A failed switch leaves the stash in the old record, live again,
        // and none of it in the free list.
        let dir = sb.directory_entry_offset(0).unwrap();
        mem.fail_writes(dir..dir + 8, 1);
        let old = agent.records()[0];
        assert!(agent.retrain(0).is_err());
        assert_eq!(agent.records()[0], old);
        assert_eq!(stash_words(&mem, &agent, old, 3), stashed);
        assert_eq!(agent.free_leaves.len(), free);
        assert!(agent.free_leaves.iter().all(|(a, _)| !stashed.contains(a)));
        // A retraining that saw no split keeps the demand and carries the
        // same leaves over: none freed, none taken from the free list.
        mem.advance(2 * grace);
        agent.retrain(0).unwrap();
        assert_ne!(agent.records()[0], old);
        assert_eq!(stash_words(&mem, &agent, agent.records()[0], 3), stashed);
        assert_eq!(agent.free_leaves.len(), free);
        assert_eq!(agent.stats().leaves_freed, freed);
        let others = agent.records().len() as u64 - 1;
        assert_eq!(agent.stats().stash_demand, 3 + others);
    }

    #[test]
    fn a_full_model_region_is_refused_before_freezing() {
        let (mem, _) = load(40);
        let mut head = [0u8; Superblock::SIZE as usize];
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

    #[test]
    fn every_slt_is_looked_at_once_per_interval_and_queued_or_watched_models_at_once() {
        let (mem, next_free) = load(40);
        let cfg = AgentConfig {
            // No idle walk in the way.
            sweep_every: Duration::from_secs(3600),
            ..AgentConfig::default()
        };
        let every = ns(cfg.slt_scan_every);
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        let sb = *agent.superblock();
        assert!(agent.records().len() >= 4, "{}", agent.records().len());
        // The first poll looks at every model: none due.
        assert_eq!(agent.poll().unwrap(), None);
        // Model 1 reaches the trigger and its enqueue is lost: found at
        // the next look at every model, not before.
        fill_slt(&mem, &agent, 1);
        assert_eq!(agent.poll().unwrap(), None, "looked at every SLT too soon");
        mem.advance(every - 1);
        assert_eq!(agent.poll().unwrap(), None, "looked at every SLT too soon");
        mem.advance(1);
        assert_eq!(agent.poll().unwrap().map(|r| r.model_id), Some(1));
        // A queued model is retrained at once, between looks.
        fill_slt(&mem, &agent, 2);
        let q = Cirq::of(&mem, &sb);
        let t = q.take();
        q.write(t, 2);
        assert_eq!(agent.poll().unwrap().map(|r| r.model_id), Some(2));
        // Two found due by one look: the second is retrained at the next
        // poll, watched without another look.
        fill_slt(&mem, &agent, 0);
        fill_slt(&mem, &agent, 3);
        mem.advance(every);
        let first = agent.poll().unwrap().map(|r| r.model_id);
        let second = agent.poll().unwrap().map(|r| r.model_id);
        let mut both = [first, second];
        both.sort();
        assert_eq!(both, [Some(0), Some(3)]);
        assert_eq!(agent.poll().unwrap(), None);
    }

    /// Empties every training leaf of model `m` (as deletes of all its
    /// keys would).
    fn empty_model(mem: &VecPool, agent: &Agent<&VecPool>, m: u64) {
        let region = agent.superblock().leaf_region().unwrap();
        let (_, words) = lt_words(mem, agent.records()[m as usize]);
        let mut buf = leaf_buffer(&region);
        for e in words {
            let x = read_leaf(mem, &region, e.addr(), &mut buf).unwrap();
            let leaf = Leaf::from_bytes_mut(&mut buf).unwrap();
            leaf.init(x.fence_lo, x.fence_hi).unwrap();
            leaf.set_next(x.next).unwrap();
            leaf.seal();
            mem.write(region.leaf_offset(e.addr()).unwrap(), &buf)
                .unwrap();
        }
    }

    #[test]
    fn an_idle_walk_that_finds_nothing_waits_and_one_that_retrains_does_not() {
        let (mem, next_free) = load(40);
        let cfg = AgentConfig {
            // Only the idle walk retrains.
            retrain_trigger: u64::MAX,
            ..AgentConfig::default()
        };
        let every = ns(cfg.sweep_every);
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        assert!(agent.records().len() >= 4, "{}", agent.records().len());
        // Model 0 walked: nothing to merge.
        assert_eq!(agent.poll().unwrap(), None);
        // Models 1 and 2 emptied: walked only once the wait is over, then
        // one after the other.
        empty_model(&mem, &agent, 1);
        empty_model(&mem, &agent, 2);
        assert_eq!(agent.poll().unwrap(), None, "walked too soon");
        mem.advance(every - 1);
        assert_eq!(agent.poll().unwrap(), None, "walked too soon");
        mem.advance(1);
        assert_eq!(agent.poll().unwrap().map(|r| r.model_id), Some(1));
        assert_eq!(agent.poll().unwrap().map(|r| r.model_id), Some(2));
        assert_eq!(agent.stats().sweep_retrains, 2);
        // Model 3 walked: nothing; then the wait again.
        assert_eq!(agent.poll().unwrap(), None);
        empty_model(&mem, &agent, 4 % agent.records().len() as u64);
        assert_eq!(agent.poll().unwrap(), None, "walked too soon");
        assert_eq!(agent.stats().sweep_retrains, 2);
    }
}
