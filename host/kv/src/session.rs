//! [`KvSession`]: one thread's handle on the store — the operations, over a
//! client's shared cache, with one-sided verbs only.
//!
//! # Chains and ownership (what makes every read correct)
//!
//! A training leaf's chain is the leaf and its synonyms, linked in key
//! order through the leaves' `next` words. Within a chain each leaf owns a
//! disjoint sub-interval of the chain's fences: a full leaf `X = [lo, hi]`
//! *splits* — a new synonym `B = [mid, hi]` takes the upper half, `X`
//! shrinks to `[lo, mid − 1]` and links to `B`, which links to `X`'s old
//! successor (a B-link list). So, always: a leaf's `fence_lo` never changes,
//! its `fence_hi` only shrinks, and from any leaf whose `fence_lo ≤ k`,
//! following `next` while `k > fence_hi` reaches the leaf that owns `k`
//! (*the chase*). A leaf read whose fences contain `k` was `k`'s owner at
//! the instant of the read, so its contents about `k` were the truth then:
//! that instant is the read's linearization point.
//!
//! # get: one round trip
//!
//! The cached fences name the training leaf that owns `k` (the model narrows
//! the fence search to its window); one doorbell batch READs the model's
//! directory word and every leaf of the cached chain. Any order of those
//! reads is safe (unordered fabric): each leaf is validated on its own
//! (checksum, re-read alone while torn — for at most `TORN_LIMIT`: a leaf
//! torn longer is reported damaged), and the chase accepts only a leaf
//! whose fences contain `k`. The directory word only makes staleness cheap
//! to notice: if it changed, the model is refreshed and the get redone (a
//! view not seen live within `KvClientConfig::model_max_age` also READs
//! the record's state and model id in the batch, 16 bytes: its space may
//! have been reused, even at the same offset, and its leaves freed). A
//! reader that did not notice (the switch landed after its word was read)
//! is still right: retraining moves no data and changes no fence, and once
//! it clears a link the chase stops at a leaf that does not cover `k`, which
//! sends the reader to refresh. For the same reason a view that the refresh
//! itself read already retired (a model retrained faster than a fetch's
//! round trips, see `fetch_model`) answers gets while it is younger than
//! `model_max_age` although its directory word never matches (then it is
//! refreshed); a writer's lock through it meets the agent's lock on its
//! entries and its `RETIRED` state word, and refreshes.
//!
//! # Writes: lock the chain, modify, unlock
//!
//! The writer locks its chain by `CAS` on the training leaf's LT entry
//! (the cached word is the `expected`; a mismatch returns the current word).
//! The lock's batch also reads the record's state word and model id: a
//! record that is `RETIRED`, or whose space was reused (another model id or
//! generation) → refresh and redo (a lock that landed there is released
//! unchanged); `FROZEN` or another writer → back off and retry. A retired
//! record's space is reused only after a grace period, so a writer never
//! locks through a view it has not seen live for longer than
//! `KvClientConfig::model_max_age`: such a view is refreshed first (see
//! the `cache` module).
//! - ordered fabric: batch 1 = CAS + READ state + READ chain (the READs run
//!   after the CAS); batch 2 = WRITE the leaves + CAS unlock (after the
//!   data): **2 round trips**.
//! - unordered fabric: CAS (1), READ state + READ chain (2: the state is
//!   read while the lock is held, and the READs chain into one request on
//!   a provider that chains reads; a `CAS` that met another lock reads the
//!   state alone), WRITE leaves (3): **3 dependent round trips**. The
//!   unlock `CAS` is posted once the data is written and not awaited
//!   (even where the fabric keeps writes in order, as `tcp` does: a lock
//!   word is only ever changed by atomics, see
//!   `KvSession::write_and_unlock`): a later read sees
//!   the write without it, and the session's next lock of the same chain
//!   waits for it first (so no write of this session overtakes its own
//!   unlock); other operations settle it only once it completed
//!   (`KvSession::reap`).
//! - a split (see below) adds the claim of a leaf and an SLT slot (1), and
//!   writes `B` and `A'` in one batch on an ordered fabric, in two on an
//!   unordered one, its unlock posted like an unordered write's: **3 round
//!   trips + 1 posted** on an ordered fabric, **5 + 1 posted** on an
//!   unordered one (one more than a single unordered batch would take: the
//!   price of never shrinking a leaf before its new synonym is whole). The
//!   claim of SLT slot 128 enqueues the model in the CirQ (2 more).
//!
//! A held lock is a `ChainLock` guard, and only the guard releases it: with
//! the writes, unchanged, or — on every error after the lock — unchanged
//! before the error is returned, in the same round trips as the unlock of
//! a write that changed nothing (its docs list each path). A lock or
//! release that fails without saying whether it landed is recorded as
//! *maybe held* and released by a later operation (module `held`), and the
//! error says so ([`KvError::LockMaybeHeld`]). Every lock word carries the
//! client's configured owner (`KvClientConfig::lock_owner`: the lease's id
//! for a compute node in another process).
//!
//! # Pipelined calls
//!
//! [`KvSession::run_many`] runs a slice of `u64` requests ([`Request`]:
//! gets, inserts, updates, deletes) with all of them in flight: on an
//! ordered fabric every write's lock batch and every get's batch go out
//! as one doorbell batch, then every write's leaf write and unlock as a
//! second — 2 round trips for requests on distinct chains. On an
//! unordered fabric the locks (and the gets' reads) go first, then the
//! locked chains' reads, then the leaf writes, each unlock posted once
//! its write completed — 3 round trips for the call, not 3 per write.
//! What
//! cannot go that way (a busy or stale lock, a split) is released
//! unchanged and redone through the single path above; module `pipeline`
//! says how requests are ordered and who releases what.
//! [`KvSession::run_many_values`] does the same for byte values
//! ([`ValueRequest`]): a long value's block is written in round 1, beside
//! its chain's lock, as a single write writes it in its lock's batch.
//!
//! # Splits: the new leaf is complete before the old one shrinks
//!
//! A full owner `X = [lo, hi]` (holding the chain lock) splits into
//! `A' = [lo, mid − 1]` (same leaf, linked to `B`) and a new synonym
//! `B = [mid, hi]` (linked to `X`'s old successor):
//! 1. claim an SLT slot and a leaf in one batch — or, if the SLT is full,
//!    give the leaf back (`CAS` on `alloc_num`, or keep it as the client's
//!    spare for its next split): a full SLT consumes no leaf;
//! 2. write `B` and its SLT slot; then `X`'s SLT slot (when `X` is a
//!    synonym) and `A'`. On an unordered fabric the second batch is posted
//!    only once the first completed without error; on an ordered one both
//!    go in one batch in that order (an ordered fabric applies a batch in
//!    posting order, so a crash or a failure leaves a prefix of it; should
//!    `B` or its slot report an error while a later write of the batch
//!    succeeded, `B` is written again, lock held, before anything else);
//! 3. post the unlock, which points the LT entry at `B`'s slot when `X` is
//!    the training leaf.
//!
//! An insert that finds the SLT full waits for the model's retraining
//! (refreshing the model, up to `KvClientConfig::slt_full_wait`), unless
//! the model's record says the agent refused to retrain it for want of
//! model-region space (`ModelRecord::refused`, read with the record the
//! refresh reads anyway): then it fails at once with
//! [`KvError::PoolFull`].
//!
//! Nothing links to `B` before `A'` lands, so a writer that dies (or fails)
//! anywhere before that leaves `X` whole and `B` an unreachable leaf (one
//! leaf and one SLT slot lost, no key); once `A'` landed, `B` was already
//! complete. The agent walks chains by the leaves' `next` links, never by
//! the SLT, so an unreachable `B` is not part of any chain.
//!
//! Readers at every intermediate state: between `B`'s write and `A'`'s, the
//! keys of `[mid, hi]` are in both `X` and `B`. No reader sees both copies:
//! a get and a scan step reach a leaf only by the chase from the training
//! leaf, following `next` words, and accept a leaf only if its fences
//! contain the key (a scan goes on from `fence_hi + 1` through that leaf's
//! own `next`). Before `A'` lands, `X` covers `[mid, hi]` and links past
//! `B`; after it, `A'` stops at `mid − 1` and links to `B`, already whole.
//! So each key has exactly one owner on the chase at any instant, and a
//! scan's cursor moves through disjoint fences. `B` may be in the batch a
//! reader planned from its cache (a cache that learned it, or an SLT whose
//! `X` slot names it while `A'` did not land — a link batch that failed
//! part-way): a leaf in the batch that the chase does not reach is never
//! looked at. And a batch that read `A'` may hold an older `B`
//! (reads of one batch are unordered): `B` was complete before `A'` was
//! posted, so an older read of it is a leaf that does not validate (zeros,
//! as allocated) and is read again alone.
//!
//! # Values
//!
//! A slot holds a value of up to 8 bytes itself; a longer one lives in a
//! value block the slot points to (`rolex_core::layout::value`: the block
//! names its key, length and generation under a checksum). A write of an
//! out-of-line value takes a block from the client's value space (module
//! `values`; a chunk claim is one `FAA` round trip, amortized over a MiB)
//! and WRITEs it **in the lock's batch**: nothing names the block yet, so
//! it may land whether or not the lock does, and the leaf write that names
//! it is posted only after that batch completed — so a reader that follows
//! the pointer always finds the block whole, and writes keep their round
//! trips (2 on an ordered fabric, 3 on an unordered one). A get of such a
//! value is the leaf read, then the block read (2 round trips); a block
//! that no longer names the key, length and generation its slot gave (the
//! writer that replaced the value freed it and it was reused, or is being
//! rewritten: the leaf read was stale) sends the get back to the leaf. The
//! block a write replaced or deleted is freed once that write landed, and
//! reused by this client with its generation bumped (module `values` says
//! who releases what on every error path).
//!
//! # Errors: applied or not
//!
//! An error is determinate ([`KvError::may_have_applied`] is `false`: the
//! operation did not take effect) when it comes before any write of the
//! operation was posted — a failed lock, read, chase, claim, or a split's
//! first batch on an unordered fabric (`B` is unreachable until `A'`
//! lands). Once a write may have landed — a write or write-and-unlock
//! batch with an error in it, a split's `A'` batch, a held lock found
//! changed by the unlock of an ordered write, the retraining request after
//! a completed split — the error is wrapped in [`KvError::Indeterminate`].
//! An error of an earlier operation's posted unlock is reported by the
//! operation that settles it (the next one once the unlock completed, or
//! the next lock of its chain), which did not run (determinate for it:
//! the one whose unlock it was had returned, its writes complete). A
//! failed unlock whose session stays idle is released by another session
//! of the client whose lock meets the chain, or by the client's reaper
//! thread (module `reaper`); its error then goes nowhere, and
//! `KvClient::locks_maybe_held` counts the lock while it is still held.

mod free;
mod lock;
mod pipeline;
mod scan;
mod split;

pub use pipeline::{Answer, Reply, Request, ValueAnswer, ValueRequest};
pub(crate) use scan::ScanSpec;
pub use scan::Scanned;

use std::ops::Range;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolex_core::entry::{LeafAddr, SltHeader};
use rolex_core::layout::{
    BlockRef, CirqError, CirqHeader, EditError, Leaf, LeafError, ModelRecord, ModelState,
    SlotValue, ValueBlock, MAX_VALUE_LEN,
};
use rolex_engine::TransferError;

use crate::cache::{clock_ns, ModelView};
use crate::client::{fetch_model, ClientShared, FetchPlan};
use crate::error::KvError;
use crate::io::{InFlight, Io, Op};
use crate::stats::{KvOp, SessionCounters};
use crate::values::{Block, ValueSpace};
use lock::ChainLock;
pub(crate) use lock::PostedUnlocks;

/// Re-reads of one torn leaf before an operation gives up.
const MAX_TORN: u32 = 100_000;
/// How long a leaf may stay *torn* — failing its checksum on every read —
/// before a reader calls it damaged ([`KvError::Leaf`]) instead of
/// reading it again. A live writer's WRITE leaves a leaf torn only while
/// it lands (microseconds; as long as a sender stopped part-way stays
/// stopped); one torn for this long was most likely torn by a crash — a
/// memory node killed while it placed a write, whose resume names the
/// leaf — and would otherwise cost every get of its keys the whole
/// [`MAX_TORN`] budget (about a minute of backed-off reads). The error
/// is determinate (a read): a caller may try again.
const TORN_LIMIT: Duration = Duration::from_secs(2);
/// Torn reads a reader makes before [`TORN_LIMIT`] is looked at.
const MIN_TORN: u32 = 16;
/// Leaves a chase follows before it calls a chain broken.
const MAX_HOPS: usize = SltHeader::SLOTS + 2;
/// Chains a scan reads per batch.
const SCAN_CHAINS: u64 = 32;

/// Where the leaves of one batch land in the read buffer: (address, local
/// offset) of each READ planned.
type LeafReads = Vec<(LeafAddr, u64)>;

/// Pairs with the values read for them, in their order (`None`: the key
/// was removed before its value could be read).
type ValuesRead = Vec<(u64, Option<Vec<u8>>)>;

/// Value bytes a scan reads per batch of value blocks (at least one
/// block per batch, whatever its size).
const SCAN_VALUE_BATCH: u64 = 1 << 20;

/// What a write does to its key.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Insert(SlotValue),
    Update(SlotValue),
    Delete,
}

/// A write as the public methods ask for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteOp {
    Insert,
    Update,
    Delete,
}

/// The leaf a chase ended at: the owner of its key.
struct Owner {
    /// Its address.
    addr: LeafAddr,
    /// Its SLT slot (0: the chain's training leaf).
    slot: u8,
    /// Its validated bytes.
    bytes: Vec<u8>,
    /// The leaves the chase visited before it.
    path: Vec<LeafAddr>,
}

/// Buffers a session's gets reuse instead of allocating per operation.
#[derive(Default)]
struct HotBuffers {
    /// A get's doorbell batch.
    ops: Vec<Op>,
    /// Where its leaves land in the read buffer.
    reads: LeafReads,
    /// The last owner leaf's bytes (any contents; resized before use).
    leaf: Vec<u8>,
}

/// Makes each session's answers of a `get_many` over several sessions
/// (`keys[i]` on `sessions[i]`) from the slot values its gets found or
/// its error (it may read more: out-of-line values).
type GetAnswers<T> = fn(
    &mut [&mut KvSession],
    &[&[u64]],
    Vec<Result<Vec<Option<SlotValue>>, KvError>>,
) -> Vec<Result<T, KvError>>;

/// A [`KvSession::resolve`] as it goes: the answers (inline values
/// already in), the out-of-line blocks (the answer they belong to, the
/// block), how many of them were read and the answers whose block no
/// longer held their value.
#[derive(Default)]
struct Resolving {
    out: Vec<(u64, Vec<u8>)>,
    blocks: Vec<(usize, BlockRef)>,
    next: usize,
    stale: Vec<usize>,
}

/// One batch of value-block READs: the ops, which of
/// [`Resolving::blocks`] they read, the read buffer's bytes they use.
struct ValueBatch {
    ops: Vec<Op>,
    blocks: Range<usize>,
    end: u64,
}

impl Resolving {
    /// The next batch of blocks to read, at most [`SCAN_VALUE_BATCH`]
    /// bytes (or one block); `None` when every block was read.
    fn plan(&mut self) -> Option<ValueBatch> {
        let from = self.next;
        let (mut ops, mut local) = (Vec::new(), 0u64);
        while let Some(&(_, at)) = self.blocks.get(self.next) {
            if !ops.is_empty() && local + at.read_len() > SCAN_VALUE_BATCH {
                break;
            }
            ops.push(Op::Read {
                remote: at.offset,
                local,
                len: at.read_len(),
            });
            local += at.read_len().next_multiple_of(8);
            self.next += 1;
        }
        (!ops.is_empty()).then_some(ValueBatch {
            ops,
            blocks: from..self.next,
            end: local,
        })
    }
}

/// A [`KvSession::get_many`] as it goes: its keys, the slot values found
/// so far, the keys still to read, and the batches tried.
struct GetMany<'k> {
    keys: &'k [u64],
    out: Vec<Option<SlotValue>>,
    pending: Vec<usize>,
    attempt: u64,
}

impl<'k> GetMany<'k> {
    fn new(keys: &'k [u64]) -> Self {
        Self {
            keys,
            out: vec![None; keys.len()],
            pending: (0..keys.len()).collect(),
            attempt: 0,
        }
    }
}

/// A doorbell batch of leaf READs under model checks, as a
/// [`KvSession::get_many`] batch and a scan round plan it: the clock
/// before it, its ops, the read buffer's bytes it uses (its leaves land
/// past the buffer's first leaf, where a chase reads a torn leaf again
/// alone), and the model views its plans read under, each checked once.
struct LeafBatch {
    posted: u64,
    ops: Vec<Op>,
    end: u64,
    views: Vec<BatchView>,
}

/// A model view a [`LeafBatch`] reads under: moved out of the session's
/// cache and back into it once the batch landed (so no reference count
/// is touched: threads reading one model would bounce its cache line),
/// with its model, its version and where its check lands.
struct BatchView {
    m: usize,
    version: u64,
    view: Arc<ModelView>,
    at: u64,
}

/// One batch of a [`KvSession::get_many`] as planned: its READs, and
/// each key's chain (index, view in the batch, training leaf, where its
/// leaves land).
struct GetBatch {
    batch: LeafBatch,
    plans: Vec<(usize, usize, u64, LeafReads)>,
}

/// What a get's batch, looked at where it landed, says
/// ([`KvSession::landed`]).
enum Landed {
    /// The model view is stale: refresh and try again.
    Stale,
    /// The chain's first leaf owns the key: its value, if present.
    Found(Option<SlotValue>),
    /// Follow the chain ([`KvSession::chase`]).
    Chase,
}

/// Where a chase ended.
enum Chase {
    /// At the leaf that owns the key.
    Owner(Owner),
    /// The cached model no longer describes the chain: refresh.
    Stale,
}

/// Chain `j` of model `m` as the session's cached view has it: the chain
/// that owns a key, which a write locks.
struct ChainAt {
    m: usize,
    view: Arc<ModelView>,
    j: u64,
    /// The client's version of model `m`'s view when it was taken from the
    /// session's cache (see [`KvSession::keep_view`]).
    version: u64,
}

/// How a locked modification ended.
enum Locked {
    Done(Option<SlotValue>),
    /// No synonym slot left: the lock was released, wait for retraining.
    SltFull,
}

/// What a write does to the owner of its key, decided while its chain is
/// locked.
enum Edit {
    /// Write the edited leaf back; `old` is the key's previous value.
    Write {
        leaf_off: u64,
        bytes: Vec<u8>,
        old: Option<SlotValue>,
    },
    /// Nothing to write (an update or delete of an absent key).
    Unchanged(Option<SlotValue>),
    /// An insert of `value` found the owner full: split it.
    Full { owner: Owner, value: SlotValue },
    /// A `u64` method met a value of `len` bytes: nothing to write, the
    /// operation fails ([`KvError::ValueNotU64`]).
    NotU64(usize),
}

/// What a split starts from: the insert `key` → `value` and the full owner
/// it met in the locked chain `at`.
struct SplitInput<'a> {
    key: u64,
    value: SlotValue,
    at: &'a ChainAt,
    owner: Owner,
}

/// One thread's session (see the module docs). Not shared between
/// threads; open one per thread with [`super::KvClient::session`]. To
/// keep several operations of one thread in flight, hand them to
/// [`KvSession::run_many`] (or [`KvSession::get_many`] for gets).
pub struct KvSession {
    shared: Arc<ClientShared>,
    io: Io,
    counters: Arc<SessionCounters>,
    chain: Vec<LeafAddr>,
    /// Buffers the get path reuses.
    hot: HotBuffers,
    /// Unlocks posted and not awaited (unordered fabric), oldest first;
    /// settled once complete, by the next lock of their chain, or all by
    /// `flush` and `Drop` (module `lock`, `KvSession::reap`) — or, once
    /// one failed, by another session of the client whose lock meets its
    /// chain, or by the client's reaper while its sessions are idle (the
    /// client lists every session's: `ClientShared::posted`, module
    /// `reaper`).
    pending: Arc<PostedUnlocks>,
    /// Whether it counts as a handle on its client (`ClientShared::handles`).
    counted: bool,
    /// How many of `pending` this session posted and has not seen taken
    /// out: at least their number (another session only takes failed
    /// ones out), so 0 says there are none without locking the list.
    posted_here: usize,
    leaf_size: u64,
    rng: u64,
    /// Where value blocks are staged in the write buffer: past anything a
    /// leaf write stages.
    value_local: u64,
    /// Bytes of value blocks read or written.
    scratch: Vec<u8>,
    /// Whether the current write posted a leaf write that names its new
    /// value (from then on its block is never given back).
    slot_posted: bool,
    /// The topology as this session last took it, with the client's
    /// version of it: routing reads the session's copy while the version
    /// word says it is the client's, so a get touches no lock and no
    /// reference count the client's other threads write.
    topo: (u64, Arc<crate::client::Topology>),
    /// Model views this session took, by directory slot, with the
    /// client's version of each (see `topo`).
    views: Vec<Option<(u64, Arc<ModelView>)>>,
}

impl std::fmt::Debug for KvSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvSession").finish_non_exhaustive()
    }
}

impl KvSession {
    /// A session of `shared`, counted as a handle on the client (its drop
    /// may be the last handle's: `ClientShared::let_go`).
    pub(crate) fn new(shared: Arc<ClientShared>) -> Result<Self, KvError> {
        let mut s = Self::uncounted(shared)?;
        s.shared.handles.fetch_add(1, Relaxed);
        s.counted = true;
        Ok(s)
    }

    /// A session of `shared` that is not a handle on the client (the one
    /// `KvClient::close` gives space back through).
    pub(crate) fn uncounted(shared: Arc<ClientShared>) -> Result<Self, KvError> {
        let mut io = Io::new(
            &shared.engine,
            shared.cfg.session_buffer,
            shared.cfg.lease.clone(),
        )?;
        io.set_redo(shared.redo.clone());
        let counters = Arc::new(SessionCounters::default());
        shared
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(counters.clone());
        let pending = Arc::new(PostedUnlocks::default());
        shared.posted.add(&pending);
        let leaf_size = shared.region.leaf_size();
        let rng = (Arc::as_ptr(&counters) as u64) | 1;
        let topo = (shared.topology_version.load(Acquire), shared.topology());
        Ok(Self {
            shared,
            io,
            counters,
            chain: Vec::new(),
            hot: HotBuffers::default(),
            pending,
            posted_here: 0,
            leaf_size,
            rng,
            value_local: (8 * leaf_size).max(64 << 10),
            scratch: Vec::new(),
            slot_posted: false,
            topo,
            views: Vec::new(),
            counted: false,
        })
    }

    /// The one-sided reads a get of `key` would post now in its doorbell
    /// batch, as `(pool offset, length)`: the model's directory word (and
    /// its state words when the cached view is due a check), then the
    /// leaves of the key's chain as the session's cached model has them.
    /// Nothing is read and nothing counted; the model is fetched first if
    /// the session has none. For benchmarks: replaying these reads
    /// measures a get's own fabric traffic without the get's CPU (`rolex
    /// bench`'s `raw_read_mops`).
    pub fn get_reads(&mut self, key: u64) -> Result<Vec<(u64, u64)>, KvError> {
        let at = self.chain_at(key)?;
        let mut ops = Vec::new();
        let checked = self.model_check_at(at.m, &at.view, 0, clock_ns(), &mut ops);
        self.keep_view(at.m, (at.version, at.view));
        checked?;
        let region = self.shared.region;
        let mut reads: Vec<(u64, u64)> = ops
            .iter()
            .filter_map(|op| match *op {
                Op::Read { remote, len, .. } => Some((remote, len)),
                _ => None,
            })
            .collect();
        for &addr in &self.chain {
            reads.push((region.leaf_offset(addr)?, self.leaf_size));
        }
        Ok(reads)
    }

    /// The value of `key`, if present, as a `u64` ([`KvError::ValueNotU64`]
    /// if it is not 8 bytes long).
    pub fn get(&mut self, key: u64) -> Result<Option<u64>, KvError> {
        self.counted(KvOp::Get, |s| {
            let v = s.get_inner(key)?;
            if let Some(v) = v {
                s.io.cur.value_bytes += v.len() as u64;
            }
            v.map(|v| as_u64(key, v)).transpose()
        })
    }

    /// The values of `keys` (as [`Self::get`], each), read together: the
    /// leaves of every key and each model's staleness word go out in one
    /// doorbell batch, so `n` gets cost one round trip instead of `n`
    /// (plus one more for the keys whose cached model was stale, and for
    /// out-of-line values). Each get is linearized at its own leaf read,
    /// as a single get; the gets of one call are concurrent with each
    /// other (they all only read). Counted as `keys.len()` gets.
    pub fn get_many(&mut self, keys: &[u64]) -> Result<Vec<Option<u64>>, KvError> {
        self.counted_n(KvOp::Get, keys.len(), |s| {
            let found = s.get_many_inner(keys)?;
            s.u64_answers(keys, found)
        })
    }

    /// [`Self::get_many`] for values of any length (out-of-line values are
    /// read in one more batch).
    pub fn get_many_values(&mut self, keys: &[u64]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.counted_n(KvOp::Get, keys.len(), |s| {
            let found = s.get_many_inner(keys)?;
            s.value_answers(keys, found)
        })
    }

    /// Sets `key` to the 8-byte value `value`; returns the previous value
    /// if the key was present. A key whose value is not 8 bytes long is
    /// left as it is ([`KvError::ValueNotU64`]).
    pub fn insert(&mut self, key: u64, value: u64) -> Result<Option<u64>, KvError> {
        self.counted(KvOp::Insert, |s| {
            s.write_value(key, WriteOp::Insert, &value.to_le_bytes(), true)
                .map(|old| old.and_then(|o| o.as_u64()))
        })
    }

    /// Sets `key` to `value` only if present; returns the previous value
    /// (`None`: absent, nothing written). As [`Self::insert`] for values
    /// that are not 8 bytes.
    pub fn update(&mut self, key: u64, value: u64) -> Result<Option<u64>, KvError> {
        self.counted(KvOp::Update, |s| {
            s.write_value(key, WriteOp::Update, &value.to_le_bytes(), true)
                .map(|old| old.and_then(|o| o.as_u64()))
        })
    }

    /// Removes `key`; returns its value if it was present. As
    /// [`Self::insert`] for values that are not 8 bytes ([`Self::remove`]
    /// removes any).
    pub fn delete(&mut self, key: u64) -> Result<Option<u64>, KvError> {
        self.counted(KvOp::Delete, |s| {
            s.write_value(key, WriteOp::Delete, &[], true)
                .map(|old| old.and_then(|o| o.as_u64()))
        })
    }

    /// Up to `n` pairs with key `≥ from`, in key order, with `u64` values
    /// ([`KvError::ValueNotU64`] if one is not 8 bytes). Not atomic: a
    /// pair present for the whole scan is returned; one written meanwhile
    /// may or may not be.
    pub fn scan(&mut self, from: u64, n: usize) -> Result<Vec<(u64, u64)>, KvError> {
        if n == 0 {
            return Err(KvError::ScanCountZero);
        }
        self.counted(KvOp::Scan, |s| {
            let found = s.scan_inner(from, u64::MAX, n)?;
            s.io.cur.value_bytes += found.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
            found
                .into_iter()
                .map(|(k, v)| Ok((k, as_u64(k, v)?)))
                .collect()
        })
    }

    /// Every pair with `lo ≤ key ≤ hi`, in key order (as [`Self::scan`]).
    pub fn range(&mut self, lo: u64, hi: u64) -> Result<Vec<(u64, u64)>, KvError> {
        if lo > hi {
            return Err(KvError::InvalidRange { lo, hi });
        }
        self.counted(KvOp::Scan, |s| {
            let found = s.scan_inner(lo, hi, usize::MAX)?;
            s.io.cur.value_bytes += found.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
            found
                .into_iter()
                .map(|(k, v)| Ok((k, as_u64(k, v)?)))
                .collect()
        })
    }

    /// Sets `key` to the bytes `value` (0 bytes to
    /// [`rolex_core::layout::MAX_VALUE_LEN`]); returns whether the key was
    /// present (its old value is replaced). Up to 8 bytes go inline in the
    /// leaf; longer values are written to a value block first, in the
    /// lock's round trip, so the write keeps its round trips (module
    /// docs, "Values").
    pub fn put(&mut self, key: u64, value: &[u8]) -> Result<bool, KvError> {
        self.counted(KvOp::Insert, |s| {
            s.write_value(key, WriteOp::Insert, value, false)
                .map(|old| old.is_some())
        })
    }

    /// Sets `key` to `value` only if present; returns whether it was
    /// (`false`: nothing written).
    pub fn update_value(&mut self, key: u64, value: &[u8]) -> Result<bool, KvError> {
        self.counted(KvOp::Update, |s| {
            s.write_value(key, WriteOp::Update, value, false)
                .map(|old| old.is_some())
        })
    }

    /// Removes `key`, whatever its value; returns whether it was present.
    pub fn remove(&mut self, key: u64) -> Result<bool, KvError> {
        self.counted(KvOp::Delete, |s| {
            s.write_value(key, WriteOp::Delete, &[], false)
                .map(|old| old.is_some())
        })
    }

    /// The value of `key`, if present, in a new `Vec` (see
    /// [`Self::get_into`] to reuse a buffer).
    pub fn get_value(&mut self, key: u64) -> Result<Option<Vec<u8>>, KvError> {
        let mut out = Vec::new();
        Ok(self.get_into(key, &mut out)?.then_some(out))
    }

    /// Puts the value of `key` into `out` (cleared first) and returns
    /// `true`, or returns `false` if the key is absent. One round trip for
    /// an inline value, two for one out of line (the leaf, then its block;
    /// a block found reused since the leaf was read is a stale read: the
    /// get starts again).
    pub fn get_into(&mut self, key: u64, out: &mut Vec<u8>) -> Result<bool, KvError> {
        self.counted(KvOp::Get, |s| s.get_bytes(key, out))
    }

    /// Up to `n` pairs with key `≥ from`, in key order, with their values
    /// (as [`Self::scan`]; the values out of line are read in batches
    /// after the leaves).
    pub fn scan_values(&mut self, from: u64, n: usize) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        if n == 0 {
            return Err(KvError::ScanCountZero);
        }
        self.counted(KvOp::Scan, |s| s.scan_values_inner(from, n))
    }

    /// Every pair with `lo ≤ key ≤ hi`, in key order, with their values
    /// (as [`Self::scan_values`]).
    pub fn range_values(&mut self, lo: u64, hi: u64) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        if lo > hi {
            return Err(KvError::InvalidRange { lo, hi });
        }
        self.counted(KvOp::Scan, |s| {
            let found = s.scan_inner(lo, hi, usize::MAX)?;
            s.resolve(found)
        })
    }

    /// Waits for this session's posted unlocks, if any, and retries the
    /// release of every chain lock the client may still hold (later
    /// operations do both themselves: the unlocks once complete or once
    /// they lock the same chain). An error is the posted unlock's (see
    /// [`KvError::LockMaybeHeld`]); [`crate::KvClient::locks_maybe_held`]
    /// counts the locks still not released.
    pub fn flush(&mut self) -> Result<(), KvError> {
        self.settle()?;
        self.resolve_held();
        Ok(())
    }

    fn counted<T>(
        &mut self,
        op: KvOp,
        f: impl FnOnce(&mut Self) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        self.counted_n(op, 1, f)
    }

    /// [`Self::counted`] for a call that is `n` operations of kind `op`.
    fn counted_n<T>(
        &mut self,
        op: KvOp,
        n: usize,
        f: impl FnOnce(&mut Self) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        self.io.cur = Default::default();
        let r = self.reap().and_then(|()| {
            self.resolve_held();
            f(self)
        });
        self.io.cur.ops = n as u64;
        self.counters.per_op[op.index()].add(&self.io.cur);
        r
    }

    // ---- shared pieces -------------------------------------------------

    /// The model that serves `key` and its cached view: the one the cached
    /// topology routes `key` to, read if not cached yet. A view whose key
    /// range does not hold `key` means the topology changed (the memory
    /// node cut a model into several) and one of the two is stale: the
    /// topology is read again, then, if it still routes `key` there, the
    /// model. A view that does hold `key` may still be stale (retired);
    /// the operation notices and refreshes it (see the module docs).
    ///
    /// The view is taken out of the session's cache (the third value is its
    /// version); give it back with [`Self::keep_view`] (one not given back
    /// is read from the client's cache next time).
    fn view_for(&mut self, key: u64) -> Result<(usize, Arc<ModelView>, u64), KvError> {
        for attempt in 0..self.shared.cfg.max_attempts {
            let m = self.route(key);
            let Some((version, view)) = self.take_view(m) else {
                self.refresh(m)?;
                continue;
            };
            if (view.record.first_key()..=view.record.key_hi()).contains(&key) {
                return Ok((m, view, version));
            }
            self.keep_view(m, (version, view));
            self.io.cur.retries += 1;
            self.shared.refresh_topology(&mut self.io)?;
            self.io.cur.refreshes += 1;
            if self.route(key) == m {
                self.refresh(m)?;
                self.backoff(attempt);
            }
        }
        Err(KvError::TooManyRetries {
            op: "finding the model of a key",
            attempts: self.shared.cfg.max_attempts,
        })
    }

    /// The chain that owns `key` in the cached view; `self.chain` is set to
    /// its leaves as the cache knows them.
    fn chain_at(&mut self, key: u64) -> Result<ChainAt, KvError> {
        let (m, view, version) = self.view_for(key)?;
        let j = self.owner(&view, key);
        self.chain.clear();
        view.chain(j, &mut self.chain);
        Ok(ChainAt {
            m,
            view,
            j,
            version,
        })
    }

    /// The directory slot of the model the topology routes `key` to: the
    /// session's copy while it is the client's current one.
    fn route(&mut self, key: u64) -> usize {
        let v = self.shared.topology_version.load(Acquire);
        if v != self.topo.0 {
            self.topo = (v, self.shared.topology());
        }
        self.topo.1.route(key)
    }

    /// Model `m`'s view and its version: the session's copy while it is
    /// the client's current one (moved out: no reference count touched),
    /// else the client's (`None`: not read yet).
    fn take_view(&mut self, m: usize) -> Option<(u64, Arc<ModelView>)> {
        // The version first: a view installed after it was read is newer
        // than the version says, and is taken again next time.
        let v = self.shared.model_versions.get(m)?.load(Acquire);
        if let Some(slot) = self.views.get_mut(m) {
            if slot.as_ref().is_some_and(|(cv, _)| *cv == v) {
                return slot.take();
            }
        }
        self.shared.view(m).map(|view| (v, view))
    }

    /// Puts a view taken by [`Self::take_view`] back into the session's
    /// cache.
    fn keep_view(&mut self, m: usize, cached: (u64, Arc<ModelView>)) {
        if self.views.len() <= m {
            let n = self.shared.models.len().max(m + 1);
            self.views.resize_with(n, || None);
        }
        self.views[m] = Some(cached);
    }

    fn refresh(&mut self, m: usize) -> Result<(), KvError> {
        let shared = self.shared.clone();
        let plan = FetchPlan::new(shared.cfg.model_max_age, shared.view(m).as_deref());
        let v = fetch_model(&mut self.io, &shared.pool, &shared.sb, m as u64, plan)?;
        shared.install(m, v);
        self.io.cur.refreshes += 1;
        Ok(())
    }

    /// The READs a read's batch starts with to tell whether `view` (of
    /// model `m`) is still the model's record, into `ops`, landing at `at`
    /// in the read buffer: the directory word (at `at`), and, when the
    /// view was not seen live within `KvClientConfig::model_max_age`
    /// before `posted` (the clock before the batch), the record's state
    /// and model id (at `at + 8`): its space may have been reused since —
    /// even by this model's next record, the directory word naming the
    /// same offset again — and the leaves it names freed and reused.
    /// Returns where the next free byte is.
    fn model_check_at(
        &self,
        m: usize,
        view: &ModelView,
        at: u64,
        posted: u64,
        ops: &mut Vec<Op>,
    ) -> Result<u64, KvError> {
        let dir = self.shared.sb.directory_entry_offset(m as u64)?;
        ops.push(Op::Read {
            remote: dir,
            local: at,
            len: 8,
        });
        if view.age_ns(posted) <= self.max_age_ns() {
            return Ok(at + 8);
        }
        ops.push(Op::Read {
            remote: view.offset + ModelRecord::STATE_OFFSET,
            local: at + 8,
            len: 16,
        });
        Ok(at + 24)
    }

    /// After a batch [`Self::model_check_at`] started (its check landed
    /// at `at`): whether `view` is still its model's record, the directory
    /// naming it (and, for a view not seen live lately, its state word
    /// saying live, its generation and model id the view's). Then the view
    /// counts as seen live at `posted`.
    fn still_current_at(&self, view: &ModelView, posted: u64, at: u64) -> Result<bool, KvError> {
        let with_state = view.age_ns(posted) > self.max_age_ns();
        if !words_current(view, with_state, |off| self.io.local_u64(at + off))? {
            return Ok(false);
        }
        view.seen_live(posted);
        Ok(true)
    }

    /// `KvClientConfig::model_max_age` in nanoseconds.
    fn max_age_ns(&self) -> u64 {
        u64::try_from(self.shared.cfg.model_max_age.as_nanos()).unwrap_or(u64::MAX)
    }

    fn backoff(&mut self, attempt: u64) {
        // xorshift jitter so contending sessions drift apart.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        if attempt < 4 {
            std::thread::yield_now();
        } else {
            let cap = (1u64 << attempt.min(10)).min(500);
            std::thread::sleep(Duration::from_micros(1 + self.rng % cap));
        }
    }

    fn owner(&self, view: &ModelView, key: u64) -> u64 {
        let (j, hit) = view.owner(key);
        if !hit {
            self.counters.model_misses.fetch_add(1, Relaxed);
        }
        j
    }

    /// Plans READs of `chain` after `base` bytes of the read buffer, as many
    /// as fit; returns (address, local offset) of each.
    fn plan_reads(&mut self, base: u64, ops: &mut Vec<Op>) -> Result<LeafReads, KvError> {
        let mut out = Vec::with_capacity(self.chain.len());
        self.plan_reads_into(base, ops, &mut out)?;
        Ok(out)
    }

    /// [`Self::plan_reads`] into `out`.
    fn plan_reads_into(
        &mut self,
        base: u64,
        ops: &mut Vec<Op>,
        out: &mut LeafReads,
    ) -> Result<(), KvError> {
        let region = self.shared.region;
        for (i, &addr) in self.chain.iter().enumerate() {
            let local = base + i as u64 * self.leaf_size;
            if local + self.leaf_size > self.io.read_cap() {
                break;
            }
            ops.push(Op::Read {
                remote: region.leaf_offset(addr)?,
                local,
                len: self.leaf_size,
            });
            out.push((addr, local));
        }
        self.io.cur.leaves_read += out.len() as u64;
        Ok(())
    }

    /// The validated bytes of the leaf at `addr`: from the batch if it was
    /// read there and is intact, else read alone until it validates.
    ///
    /// A leaf still torn after [`TORN_LIMIT`] of re-reads is reported as
    /// damaged: [`KvError::Leaf`] naming `model`, the leaf and its fault.
    fn leaf(
        &mut self,
        model: u64,
        addr: LeafAddr,
        batch: &[(LeafAddr, u64)],
    ) -> Result<Vec<u8>, KvError> {
        // The get path hands its last owner leaf's buffer back (`hot`).
        let mut bytes = std::mem::take(&mut self.hot.leaf);
        bytes.resize(self.leaf_size as usize, 0);
        if let Some(&(_, local)) = batch.iter().find(|(a, _)| *a == addr) {
            self.io.local(local, &mut bytes)?;
            if valid(&bytes) {
                return Ok(bytes);
            }
            self.io.cur.retries += 1;
        }
        let remote = self.shared.region.leaf_offset(addr)?;
        let since = Instant::now();
        for attempt in 0..MAX_TORN {
            self.io.run(
                &self.shared.pool,
                &[Op::Read {
                    remote,
                    local: 0,
                    len: self.leaf_size,
                }],
                "reading a leaf",
            )?;
            self.io.cur.leaves_read += 1;
            self.io.local(0, &mut bytes)?;
            if valid(&bytes) {
                return Ok(bytes);
            }
            self.io.cur.retries += 1;
            if attempt >= MIN_TORN && since.elapsed() >= TORN_LIMIT {
                let fault = Leaf::from_bytes(&bytes).and_then(|l| l.validate().map(drop));
                if let Err(error) = fault {
                    return Err(bad_leaf(model, addr)(error));
                }
            }
            self.backoff(u64::from(attempt));
        }
        Err(KvError::TooManyRetries {
            op: "reading a torn leaf",
            attempts: u64::from(MAX_TORN),
        })
    }

    /// The chase from `start` (SLT slot `slot`) to the owner of `key`, in a
    /// chain of model `model`.
    fn chase(
        &mut self,
        model: u64,
        key: u64,
        start: LeafAddr,
        slot: u8,
        batch: &[(LeafAddr, u64)],
    ) -> Result<Chase, KvError> {
        let (mut addr, mut slot) = (start, slot);
        let mut path = Vec::new();
        for _ in 0..MAX_HOPS {
            let bytes = self.leaf(model, addr, batch)?;
            let leaf = Leaf::from_bytes(&bytes).map_err(bad_leaf(model, addr))?;
            if key < leaf.fence_lo() || leaf.is_freed() {
                // A freed leaf: retraining gave it back after the cache
                // (or the link that led here) was read.
                return Ok(Chase::Stale);
            }
            if key <= leaf.fence_hi() {
                return Ok(Chase::Owner(Owner {
                    addr,
                    slot,
                    bytes,
                    path,
                }));
            }
            let next = leaf.next();
            if next.pointer() == 0 {
                return Ok(Chase::Stale);
            }
            path.push(addr);
            addr = next.addr();
            slot = next.pointer();
        }
        Ok(Chase::Stale)
    }

    /// Records the synonyms a chase walked if the cache did not know them.
    fn learn(&self, view: &ModelView, j: u64, path: &[LeafAddr], owner: LeafAddr) {
        if path.is_empty() {
            // The owner was the chain's first leaf: nothing walked, and
            // nothing is a prefix of what the cache knows.
            return;
        }
        let walked: Vec<LeafAddr> = path
            .iter()
            .skip(1)
            .copied()
            .chain((!path.is_empty()).then_some(owner))
            .collect();
        let known = self.chain.get(1..).unwrap_or(&[]);
        if !known.starts_with(&walked) {
            view.learn(j, walked);
        }
    }

    // ---- get -----------------------------------------------------------

    fn get_inner(&mut self, key: u64) -> Result<Option<SlotValue>, KvError> {
        for attempt in 0..self.shared.cfg.max_attempts {
            let at = self.chain_at(key)?;
            let found = self.get_once(key, &at);
            self.keep_view(at.m, (at.version, at.view));
            match found? {
                Some(v) => return Ok(v),
                None => {
                    self.io.cur.retries += 1;
                    self.refresh(at.m)?;
                    self.backoff(attempt);
                }
            }
        }
        Err(KvError::TooManyRetries {
            op: "get",
            attempts: self.shared.cfg.max_attempts,
        })
    }

    /// One attempt of a get through the chain `at`: the value found
    /// (`Some(None)`: absent), or `None` when the model view was stale.
    ///
    /// The hot path of the store: its op list, its reads' plan and the
    /// owner leaf's bytes live in buffers the session reuses (an error
    /// drops them; the next get allocates anew).
    fn get_once(&mut self, key: u64, at: &ChainAt) -> Result<Option<Option<SlotValue>>, KvError> {
        let mut ops = std::mem::take(&mut self.hot.ops);
        ops.clear();
        // The precise clock. (The kernel's coarse clock was tried here: it
        // is cheaper, but its lag behind the precise one is not bounded by
        // its resolution — 4.8 ms against a 4 ms tick measured on this
        // VM — so an age taken from it could call a view young that is
        // not.)
        let posted = clock_ns();
        let base = self.model_check_at(at.m, &at.view, 0, posted, &mut ops)?;
        let mut batch = std::mem::take(&mut self.hot.reads);
        batch.clear();
        self.plan_reads_into(base, &mut ops, &mut batch)?;
        self.io.run(&self.shared.pool, &ops, "get")?;
        self.hot.ops = ops;
        match self.landed(key, &at.view, posted, base, &batch)? {
            Landed::Chase => {}
            Landed::Stale => {
                self.hot.reads = batch;
                return Ok(None);
            }
            Landed::Found(v) => {
                self.hot.reads = batch;
                return Ok(Some(v));
            }
        }
        let found = match self.chase(at.m as u64, key, self.chain[0], 0, &batch)? {
            Chase::Owner(owner) => {
                self.learn(&at.view, at.j, &owner.path, owner.addr);
                let v = lookup(&owner.bytes, key);
                self.hot.leaf = owner.bytes;
                Some(v)
            }
            Chase::Stale => None,
        };
        self.hot.reads = batch;
        Ok(found)
    }

    /// A get's batch as it landed, looked at in place (one region guard, no
    /// copy): whether the staleness check (from local 0) says the view is
    /// stale, and if not (then the view counts as seen live at `posted`),
    /// whether the chain's first leaf (the first of `batch`) is intact and
    /// owns `key`, which answers the get. Anything else (a torn or freed
    /// leaf, a key past its fences) is left to the chase, which reads and
    /// checks the leaves again.
    ///
    /// A view `fetch_model` read already retired (the model was retrained
    /// during the fetch) is stale by construction — the directory names its
    /// successor — but still answers while it is younger than
    /// `KvClientConfig::model_max_age`, as a view whose staleness a get did
    /// not notice does (see the module docs): its leaves are not reused
    /// within the grace, and the chase sends the get to refresh where the
    /// retrainings since changed its chain. Without that, a get under a model
    /// retrained faster than a fetch and a get's round trips would refresh
    /// forever. Such a view never counts as seen live again, so it ages out
    /// (then its record's state word is read and says `RETIRED`: refresh).
    fn landed(
        &self,
        key: u64,
        view: &ModelView,
        posted: u64,
        base: u64,
        batch: &[(LeafAddr, u64)],
    ) -> Result<Landed, KvError> {
        let with_state = view.age_ns(posted) > self.max_age_ns();
        let answers_stale = !with_state && view.record.state().is_retired();
        let first = batch.first().map(|&(_, local)| local);
        let leaf_size = self.leaf_size;
        let end = first.map_or(base, |local| local + leaf_size).max(base);
        let (current, landed) =
            self.io
                .with_local(0, end, |bytes| -> Result<(bool, Landed), KvError> {
                    let word = |at: u64| Ok(le_word(bytes, at));
                    let current = words_current(view, with_state, word)?;
                    if !current && !answers_stale {
                        return Ok((false, Landed::Stale));
                    }
                    let Some(leaf) =
                        first.and_then(|at| bytes.get(at as usize..(at + leaf_size) as usize))
                    else {
                        return Ok((current, Landed::Chase));
                    };
                    let landed = owner_value(leaf, key).map_or(Landed::Chase, Landed::Found);
                    Ok((current, landed))
                })??;
        if current {
            view.seen_live(posted);
        }
        Ok(landed)
    }

    /// The slot values of `keys`: every key's chain (as its cached model
    /// has it) and each model's staleness check in one batch, landing past
    /// the first leaf of the read buffer (a chase that reads a leaf alone
    /// reads it there); keys whose model was stale, or whose chase says so,
    /// go again in the next batch, after a refresh.
    fn get_many_inner(&mut self, keys: &[u64]) -> Result<Vec<Option<SlotValue>>, KvError> {
        let mut g = GetMany::new(keys);
        while let Some(batch) = self.plan_get_batch(&mut g)? {
            let landed = self
                .post_leaf_batch(&batch.batch, "get_many")
                .map(|f| first_error(f.wait()));
            self.landed_get_batch(&mut g, batch, landed)?;
        }
        Ok(g.out)
    }

    /// [`Self::get_many_inner`] on several sessions at once — one per
    /// memory node of a cluster, `keys[i]` on `sessions[i]`: each round's
    /// batch is posted on every session before any is waited for, so the
    /// call costs the round trips of one session, not their sum. Then
    /// `finish` makes every session's answers (it may read more, on all
    /// sessions together), and the call counts as `keys[i].len()` gets
    /// on each session (as [`Self::get_many`]).
    fn get_many_with<T>(
        sessions: &mut [&mut KvSession],
        keys: &[&[u64]],
        finish: GetAnswers<T>,
    ) -> Vec<Result<T, KvError>> {
        let mut states: Vec<Result<GetMany<'_>, KvError>> = sessions
            .iter_mut()
            .zip(keys)
            .map(|(s, &mine)| {
                s.io.cur = Default::default();
                s.reap().map(|()| {
                    s.resolve_held();
                    GetMany::new(mine)
                })
            })
            .collect();
        Self::rounds(
            sessions,
            &mut states,
            |s, g| s.plan_get_batch(g),
            |s, b| Some(s.post_leaf_batch(&b.batch, "get_many")),
            |s, g, b, landed| s.landed_get_batch(g, b, landed),
        );
        let found = states.into_iter().map(|g| g.map(|g| g.out)).collect();
        let answers = finish(sessions, keys, found);
        for (s, mine) in sessions.iter_mut().zip(keys) {
            s.io.cur.ops = mine.len() as u64;
            s.counters.per_op[KvOp::Get.index()].add(&s.io.cur);
        }
        answers
    }

    /// Runs rounds over several sessions (`states[i]` on `sessions[i]`)
    /// until none plans a batch: each session's next batch planned from
    /// its state (`plan`), every batch posted (`post`) before any is
    /// waited for, then each handed to its state as it landed (`land`:
    /// its first op error, or why nothing was posted). A state that
    /// failed stays failed, and its session plans nothing more.
    fn rounds<S, P>(
        sessions: &mut [&mut KvSession],
        states: &mut [Result<S, KvError>],
        plan: impl Fn(&mut KvSession, &mut S) -> Result<Option<P>, KvError>,
        post: for<'a> fn(&'a mut KvSession, &'a P) -> Option<pipeline::Posting<'a>>,
        land: impl Fn(
            &mut KvSession,
            &mut S,
            P,
            Result<Option<TransferError>, KvError>,
        ) -> Result<(), KvError>,
    ) {
        loop {
            let mut batches = Vec::with_capacity(states.len());
            for (s, st) in sessions.iter_mut().zip(states.iter_mut()) {
                let planned = match st {
                    Ok(state) => plan(s, state),
                    Err(_) => Ok(None),
                };
                batches.push(planned.unwrap_or_else(|e| {
                    *st = Err(e);
                    None
                }));
            }
            if batches.iter().all(Option::is_none) {
                return;
            }
            let landed = pipeline::post_all(sessions, &batches, post);
            for (((s, st), batch), landed) in sessions
                .iter_mut()
                .zip(states.iter_mut())
                .zip(batches)
                .zip(landed)
            {
                let (Ok(state), Some(batch)) = (st.as_mut(), batch) else {
                    continue;
                };
                let landed = landed.unwrap_or_else(|| Ok(Vec::new()));
                if let Err(e) = land(s, state, batch, landed.map(|r| first_error(&r))) {
                    *st = Err(e);
                }
            }
        }
    }

    /// [`Self::get_many`] on several sessions at once (see
    /// `get_many_with`): `keys[i]` on `sessions[i]`, one result each.
    pub(crate) fn get_many_on(
        sessions: &mut [&mut KvSession],
        keys: &[&[u64]],
    ) -> Vec<Result<Vec<Option<u64>>, KvError>> {
        Self::get_many_with(sessions, keys, |sessions, keys, found| {
            sessions
                .iter_mut()
                .zip(keys)
                .zip(found)
                .map(|((s, mine), f)| f.and_then(|f| s.u64_answers(mine, f)))
                .collect()
        })
    }

    /// [`Self::get_many_values`] on several sessions at once (see
    /// `get_many_with`): after every session's leaves, the out-of-line
    /// values too are read in batches posted on every session before any
    /// is waited for.
    pub(crate) fn get_many_values_on(
        sessions: &mut [&mut KvSession],
        keys: &[&[u64]],
    ) -> Vec<Result<Vec<Option<Vec<u8>>>, KvError>> {
        Self::get_many_with(sessions, keys, Self::values_on)
    }

    /// Each session's [`Self::value_answers`] from what its gets found,
    /// its value blocks read in rounds of one batch per session, all
    /// posted before any is waited for.
    fn values_on(
        sessions: &mut [&mut KvSession],
        keys: &[&[u64]],
        found: Vec<Result<Vec<Option<SlotValue>>, KvError>>,
    ) -> Vec<Result<Vec<Option<Vec<u8>>>, KvError>> {
        let mut present: Vec<Vec<usize>> = Vec::with_capacity(keys.len());
        let pairs = keys
            .iter()
            .zip(found)
            .map(|(mine, f)| {
                let (idx, pairs) =
                    present_values(mine, f.inspect_err(|_| present.push(Vec::new()))?);
                present.push(idx);
                Ok(pairs)
            })
            .collect();
        Self::values_rounds(sessions, pairs)
            .into_iter()
            .zip(keys)
            .zip(present)
            .map(|((values, mine), idx)| Ok(place_values(mine.len(), &idx, values?)))
            .collect()
    }

    /// Each session's `pairs` (`pairs[i]` on `sessions[i]`) with their
    /// values, in the same order: inline ones as they are, the blocks read
    /// in rounds of one batch per session, all posted before any is
    /// waited for; a value whose block was rewritten since its leaf was
    /// read is read again by a get of its key (`None`: the key was
    /// removed meanwhile).
    pub(super) fn values_rounds(
        sessions: &mut [&mut KvSession],
        pairs: Vec<Result<Vec<(u64, SlotValue)>, KvError>>,
    ) -> Vec<Result<ValuesRead, KvError>> {
        let mut states: Vec<Result<Resolving, KvError>> = sessions
            .iter()
            .zip(pairs)
            .map(|(s, p)| s.resolving(p?))
            .collect();
        Self::rounds(
            sessions,
            &mut states,
            |_, r| Ok(r.plan()),
            |s, b| Some(s.post_values(b)),
            |s, r, b, landed| match landed? {
                None => s.values_landed(r, &b),
                Some(error) => Err(KvError::Transfer {
                    during: "reading values",
                    error,
                }),
            },
        );
        sessions
            .iter_mut()
            .zip(states)
            .map(|(s, r)| s.resolved_each(r?))
            .collect()
    }

    /// [`Self::get_many`]'s answers from the slot values found.
    fn u64_answers(
        &mut self,
        keys: &[u64],
        found: Vec<Option<SlotValue>>,
    ) -> Result<Vec<Option<u64>>, KvError> {
        let mut out = Vec::with_capacity(found.len());
        for (&key, v) in keys.iter().zip(found) {
            if let Some(v) = v {
                self.io.cur.value_bytes += v.len() as u64;
            }
            out.push(v.map(|v| as_u64(key, v)).transpose()?);
        }
        Ok(out)
    }

    /// [`Self::get_many_values`]' answers from the slot values found: the
    /// out-of-line values read in one more batch.
    fn value_answers(
        &mut self,
        keys: &[u64],
        found: Vec<Option<SlotValue>>,
    ) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let (present, pairs) = present_values(keys, found);
        Ok(place_values(
            keys.len(),
            &present,
            self.resolve_each(pairs)?,
        ))
    }

    /// The next batch of `g` planned: one check per model, then each
    /// pending key's chain; `None` when no key is pending.
    fn plan_get_batch(&mut self, g: &mut GetMany<'_>) -> Result<Option<GetBatch>, KvError> {
        if g.pending.is_empty() {
            return Ok(None);
        }
        if g.attempt >= self.shared.cfg.max_attempts {
            return Err(KvError::TooManyRetries {
                op: "get_many",
                attempts: g.attempt,
            });
        }
        g.attempt += 1;
        let mut batch = self.leaf_batch();
        let mut plans = Vec::with_capacity(g.pending.len());
        for &i in &g.pending {
            let key = g.keys[i];
            let vi = self.batch_view(&mut batch, key)?;
            let view = &batch.views[vi].view;
            let j = self.owner(view, key);
            self.chain.clear();
            view.chain(j, &mut self.chain);
            let reads = self.plan_chain(&mut batch)?;
            plans.push((i, vi, j, reads));
        }
        Ok(Some(GetBatch { batch, plans }))
    }

    /// An empty [`LeafBatch`], its clock read now.
    fn leaf_batch(&self) -> LeafBatch {
        LeafBatch {
            posted: clock_ns(),
            ops: Vec::new(),
            end: self.leaf_size.next_multiple_of(8),
            views: Vec::new(),
        }
    }

    /// The view of `b` that serves `key` (its index in `b.views`): the
    /// one `b` has if it is its model's current view and holds `key`,
    /// else the session's ([`Self::view_for`]), added to `b` with its
    /// check's READs.
    fn batch_view(&mut self, b: &mut LeafBatch, key: u64) -> Result<usize, KvError> {
        let m = self.route(key);
        let current = self.shared.model_versions.get(m).map(|v| v.load(Acquire));
        let held = b.views.iter().position(|v| {
            v.m == m
                && Some(v.version) == current
                && (v.view.record.first_key()..=v.view.record.key_hi()).contains(&key)
        });
        if let Some(vi) = held {
            return Ok(vi);
        }
        let (m, view, version) = self.view_for(key)?;
        let next = self.model_check_at(m, &view, b.end, b.posted, &mut b.ops)?;
        b.views.push(BatchView {
            m,
            version,
            view,
            at: b.end,
        });
        b.end = next;
        Ok(b.views.len() - 1)
    }

    /// Adds to `b` the READs of the chain in `self.chain`; returns where
    /// each of its leaves lands.
    fn plan_chain(&mut self, b: &mut LeafBatch) -> Result<LeafReads, KvError> {
        let step = self.leaf_size.next_multiple_of(8);
        let mut reads = Vec::with_capacity(self.chain.len());
        for &addr in &self.chain {
            b.ops.push(Op::Read {
                remote: self.shared.region.leaf_offset(addr)?,
                local: b.end,
                len: self.leaf_size,
            });
            reads.push((addr, b.end));
            b.end += step;
        }
        self.io.cur.leaves_read += reads.len() as u64;
        Ok(reads)
    }

    /// Puts the views of a batch that landed back into the session's
    /// cache.
    fn keep_views(&mut self, b: LeafBatch) {
        for v in b.views {
            self.keep_view(v.m, (v.version, v.view));
        }
    }

    /// Posts `b` (its read buffer reserved first). On `Err` nothing was
    /// posted.
    fn post_leaf_batch<'a>(
        &'a mut self,
        b: &'a LeafBatch,
        during: &'static str,
    ) -> Result<InFlight<'a>, KvError> {
        self.io.reserve(&self.shared.engine, b.end, 0)?;
        self.io.post_each(&self.shared.pool, &b.ops, during)
    }

    /// The models of `b` whose check, as it landed, says a view is stale
    /// (the views found current count as seen live when `b` was posted);
    /// `landed`: its first op error (the call's, `during` it), or why it
    /// was not posted.
    fn stale_models(
        &self,
        b: &LeafBatch,
        landed: Result<Option<TransferError>, KvError>,
        during: &'static str,
    ) -> Result<Vec<usize>, KvError> {
        if let Some(error) = landed? {
            return Err(KvError::Transfer { during, error });
        }
        let mut stale = Vec::new();
        for v in &b.views {
            if !self.still_current_at(&v.view, b.posted, v.at)? && !stale.contains(&v.m) {
                stale.push(v.m);
            }
        }
        Ok(stale)
    }

    /// A batch of `g` as it landed (`landed`: its first op error, which
    /// is the call's, as [`Io::run`] reports it; `Err`: not posted): each
    /// key whose model was current and whose chase ended at its owner
    /// answered, the others pending again once their models were
    /// refreshed.
    fn landed_get_batch(
        &mut self,
        g: &mut GetMany<'_>,
        b: GetBatch,
        landed: Result<Option<TransferError>, KvError>,
    ) -> Result<(), KvError> {
        let GetBatch { batch, plans } = b;
        let mut stale = self.stale_models(&batch, landed, "get_many")?;
        let mut again = Vec::new();
        for (i, vi, j, reads) in plans {
            let (m, view) = (batch.views[vi].m, &batch.views[vi].view);
            if stale.contains(&m) {
                again.push(i);
                continue;
            }
            let Some(&(start, first)) = reads.first() else {
                again.push(i);
                continue;
            };
            // The chain's first leaf owns most keys: looked at in place,
            // as a single get looks (no copy); the chase otherwise.
            let key = g.keys[i];
            let leaf_size = self.leaf_size;
            if let Some(v) = self
                .io
                .with_local(first, leaf_size, |leaf| owner_value(leaf, key))?
            {
                g.out[i] = v;
                continue;
            }
            self.chain.clear();
            self.chain.extend(reads.iter().map(|r| r.0));
            match self.chase(m as u64, key, start, 0, &reads)? {
                Chase::Owner(owner) => {
                    self.learn(view, j, &owner.path, owner.addr);
                    g.out[i] = lookup(&owner.bytes, g.keys[i]);
                }
                Chase::Stale => {
                    if !stale.contains(&m) {
                        stale.push(m);
                    }
                    again.push(i);
                }
            }
        }
        self.keep_views(batch);
        for m in stale {
            self.io.cur.retries += 1;
            self.refresh(m)?;
        }
        g.pending = again;
        Ok(())
    }

    /// [`Self::get_inner`], then the value's bytes into `out`: read from
    /// its block when out of line, the whole get again while the block
    /// read is stale.
    fn get_bytes(&mut self, key: u64, out: &mut Vec<u8>) -> Result<bool, KvError> {
        // The pointer whose block last did not hold the value, and since
        // when the leaf has named it: a block is freed only once no leaf
        // names it, so a leaf naming a block that stays wrong is damage
        // (reported after `TORN_LIMIT`, as a torn leaf is), not a race.
        let mut wrong: Option<(BlockRef, Instant, u32)> = None;
        for attempt in 0..self.shared.cfg.max_attempts {
            let at = match self.get_inner(key)? {
                None => return Ok(false),
                Some(v) => match v.block() {
                    Some(at) => at,
                    None => {
                        out.clear();
                        out.extend_from_slice(v.inline_bytes().unwrap_or(&[]));
                        self.io.cur.value_bytes += out.len() as u64;
                        return Ok(true);
                    }
                },
            };
            if self.read_block(key, at, out)? {
                self.io.cur.value_bytes += out.len() as u64;
                return Ok(true);
            }
            self.io.cur.retries += 1;
            let (since, n) = match wrong {
                Some((p, since, n)) if p == at => (since, n + 1),
                _ => (Instant::now(), 1),
            };
            if n > MIN_TORN && since.elapsed() >= TORN_LIMIT {
                return Err(KvError::BadValuePointer {
                    key,
                    offset: at.offset,
                    len: at.len,
                });
            }
            wrong = Some((at, since, n));
            self.backoff(attempt);
        }
        Err(KvError::TooManyRetries {
            op: "get (value block)",
            attempts: self.shared.cfg.max_attempts,
        })
    }

    /// READs the value block `at` of `key` (one round trip) and puts its
    /// value into `out`: `false` if the block no longer holds it (reused
    /// or being rewritten since the leaf naming it was read: read the
    /// leaf again).
    fn read_block(&mut self, key: u64, at: BlockRef, out: &mut Vec<u8>) -> Result<bool, KvError> {
        self.check_pointer(key, at)?;
        let n = at.read_len();
        self.io.reserve(&self.shared.engine, n, 0)?;
        self.io.run(
            &self.shared.pool,
            &[Op::Read {
                remote: at.offset,
                local: 0,
                len: n,
            }],
            "reading a value block",
        )?;
        // Checked where it landed; only the value is copied out.
        self.io
            .with_local(0, n, |b| match ValueBlock::check(b, key, at) {
                Ok(v) => {
                    out.clear();
                    out.extend_from_slice(v);
                    true
                }
                Err(_) => false,
            })
    }

    /// A validated leaf's pointer must lie in the value region.
    fn check_pointer(&self, key: u64, at: BlockRef) -> Result<(), KvError> {
        if self.shared.values.region().holds(at) {
            Ok(())
        } else {
            Err(KvError::BadValuePointer {
                key,
                offset: at.offset,
                len: at.len,
            })
        }
    }

    // ---- writes --------------------------------------------------------

    /// A write of `key` (`value` unused by a delete): stages an out-of-line
    /// value's block, runs the write, then settles the blocks — the new
    /// one given back if the write did not publish it, the replaced one
    /// freed once the write landed (the `values` module says who releases
    /// what). `strict`: a `u64` method's write, refused with
    /// [`KvError::ValueNotU64`] where the key's value is not 8 bytes.
    fn write_value(
        &mut self,
        key: u64,
        op: WriteOp,
        value: &[u8],
        strict: bool,
    ) -> Result<Option<SlotValue>, KvError> {
        let (kind, staged) = match op {
            WriteOp::Delete => (Kind::Delete, None),
            WriteOp::Insert | WriteOp::Update => {
                let (v, staged) = match SlotValue::inline(value) {
                    Some(v) => (v, None),
                    None => {
                        let (block, write) = self.stage_block(key, value)?;
                        let at = BlockRef {
                            offset: block.offset,
                            len: value.len() as u32,
                            gen: block.gen,
                        };
                        (SlotValue::Block(at), Some((block, write)))
                    }
                };
                self.io.cur.value_bytes += value.len() as u64;
                match op {
                    WriteOp::Insert => (Kind::Insert(v), staged),
                    _ => (Kind::Update(v), staged),
                }
            }
        };
        let mut write = staged.map(|(_, w)| w);
        self.slot_posted = false;
        let r = self.write_op(key, kind, &mut write, strict);
        let block = staged.map(|(b, _)| b);
        let values = &self.shared.values;
        match &r {
            Ok(old) => {
                let published = match kind {
                    Kind::Insert(_) => true,
                    Kind::Update(_) => old.is_some(),
                    Kind::Delete => false,
                };
                if let Some(b) = block.filter(|_| !published) {
                    values.give_back(b);
                }
                let replaced = published || matches!(kind, Kind::Delete);
                if let Some(o) = old.and_then(|o| o.block()).filter(|_| replaced) {
                    if let Some(class) = rolex_core::layout::block_class(o.len as usize) {
                        if values.free(o.offset, class, o.gen) {
                            self.shed_values();
                        }
                    }
                }
            }
            Err(e) => {
                // Once a leaf write naming it was posted, a slot may name
                // it: never handed out again (nor is the block it may have
                // replaced freed) — unless the error is determinate: the
                // write did not happen, and no slot a reader can reach
                // names it (a split's new leaf that failed is linked by
                // nothing).
                if let Some(b) = block.filter(|_| !self.slot_posted || !e.may_have_applied()) {
                    values.give_back(b);
                }
            }
        }
        r
    }

    /// Takes a block for `key`'s `value` ([`Self::take_block`]: getting
    /// space first if this client has none of its class) and stages it in
    /// the write buffer; returns it and its WRITE.
    fn stage_block(&mut self, key: u64, value: &[u8]) -> Result<(Block, Op), KvError> {
        let too_long = KvError::ValueTooLong {
            len: value.len(),
            max: MAX_VALUE_LEN,
        };
        let block = self.take_block(value.len())?;
        let n = rolex_core::layout::ValueBlockHeader::SIZE + value.len() as u64;
        // Built where the WRITE takes it from: the value is copied once.
        let value_local = self.value_local;
        let staged = self
            .io
            .reserve(&self.shared.engine, 0, value_local + n)
            .and_then(|()| {
                self.io.fill(value_local, n, |out| {
                    ValueBlock::write(out, key, block.gen, block.class, value)
                })
            })
            .and_then(|built| built.ok_or(too_long));
        if let Err(e) = staged {
            self.shared.values.give_back(block);
            return Err(e);
        }
        Ok((
            block,
            Op::Write {
                remote: block.offset,
                local: self.value_local,
                len: n,
            },
        ))
    }

    /// Takes a block for a value of `len` bytes from this client's value
    /// space, getting space first if it has none of the value's class: a
    /// large block held free (what a resume gives back) carved; then
    /// space other clients gave back (the pool's free stack, three round
    /// trips a bundle); once a bundle was popped without a block of the
    /// class (or none is left), any larger block held carved; then a new
    /// chunk (one `FAA`). What it gets beyond the block stays ready in the
    /// client's space. On `Err` nothing is taken (what was got stays
    /// there too).
    pub(crate) fn take_block(&mut self, len: usize) -> Result<Block, KvError> {
        let mut pops = 0;
        loop {
            match self.shared.values.take(len) {
                None => {
                    return Err(KvError::ValueTooLong {
                        len,
                        max: MAX_VALUE_LEN,
                    })
                }
                Some(Ok(b)) => return Ok(b),
                Some(Err(_)) if self.shared.values.split(len, true) => {}
                Some(Err(_)) if pops > 0 && self.shared.values.split(len, false) => {}
                Some(Err(_)) if pops < ValueSpace::POPS && self.pop_values()? => pops += 1,
                Some(Err(_)) if self.shared.values.split(len, false) => {}
                Some(Err(need)) => {
                    pops = ValueSpace::POPS;
                    match self.claim_values(need.len, len) {
                        // The region is full: what others gave back is
                        // all there is; take it, bundle after bundle,
                        // until a block of the class shows up or the
                        // stack is empty.
                        Err(KvError::ValueSpaceFull { .. }) if self.pop_values()? => {}
                        r => r?,
                    }
                }
            }
        }
    }

    /// Claims `len` bytes of the value region (one `FAA`) for blocks of
    /// values of `value_len` bytes.
    fn claim_values(&mut self, len: u64, value_len: usize) -> Result<(), KvError> {
        let region = *self.shared.values.region();
        let fetched = self.io.run(
            &self.shared.pool,
            &[Op::Faa {
                remote: region.alloc_offset(),
                add: len,
            }],
            "claiming value space",
        )?[0];
        let (offset, len) = match region.claim(fetched, len) {
            Ok(offset) => (offset, len),
            // Past the end: the bytes from `fetched` to the end are still
            // this client's alone (every later `FAA` fetched past them),
            // so they are taken rather than left to no one until a
            // resume gives them back.
            Err(_) if fetched < region.capacity() => {
                (region.area_offset(fetched), region.capacity() - fetched)
            }
            Err(_) => {
                return Err(KvError::ValueSpaceFull {
                    needed: len,
                    capacity: region.capacity(),
                })
            }
        };
        self.shared.values.add_chunk(offset, len, value_len);
        Ok(())
    }

    fn write_op(
        &mut self,
        key: u64,
        kind: Kind,
        block: &mut Option<Op>,
        strict: bool,
    ) -> Result<Option<SlotValue>, KvError> {
        let mut slt_deadline: Option<Instant> = None;
        for attempt in 0..self.shared.cfg.max_attempts {
            let at = self.chain_at(key)?;
            let Some((lock, batch)) = self.lock_chain(&at, attempt, block)? else {
                self.keep_view(at.m, (at.version, at.view));
                continue;
            };
            match self.modify_locked(key, kind, strict, &at, lock, &batch)? {
                Locked::Done(v) => {
                    self.keep_view(at.m, (at.version, at.view));
                    return Ok(v);
                }
                Locked::SltFull => {
                    // Its unlock lands before this operation locks again.
                    self.settle()?;
                    let refused = self.shared.view(at.m).map_or(0, |v| v.record.refused());
                    if refused != 0 {
                        // The agent cannot retrain the model: no wait.
                        return Err(KvError::PoolFull {
                            model: at.m as u64,
                            needed: refused,
                        });
                    }
                    let now = Instant::now();
                    let deadline = *slt_deadline.get_or_insert_with(|| {
                        self.counters.slt_full_waits.fetch_add(1, Relaxed);
                        now + self.shared.cfg.slt_full_wait
                    });
                    if now >= deadline {
                        return Err(KvError::SltFull { model: at.m as u64 });
                    }
                    self.io.cur.retries += 1;
                    std::thread::sleep(Duration::from_micros(200));
                    self.refresh(at.m)?;
                }
            }
        }
        Err(KvError::TooManyRetries {
            op: "write",
            attempts: self.shared.cfg.max_attempts,
        })
    }

    /// Holding `lock` on chain `at` (its leaves in the read buffer as
    /// `batch` says): edit the owner of `key`, then write it and unlock in
    /// one release — or split it when an insert finds it full. Every path
    /// releases the lock through the guard (see [`ChainLock`]).
    fn modify_locked(
        &mut self,
        key: u64,
        kind: Kind,
        strict: bool,
        at: &ChainAt,
        lock: ChainLock,
        batch: &[(LeafAddr, u64)],
    ) -> Result<Locked, KvError> {
        let edit = match self.edit_owner(key, kind, strict, at, batch) {
            Ok(edit) => edit,
            Err(e) => return Err(lock.abort(self, e)),
        };
        match edit {
            Edit::Write {
                leaf_off,
                bytes,
                old,
            } => {
                let unlocked = lock.unlocked();
                self.slot_posted = true;
                lock.release(self, &[(leaf_off, &bytes)], unlocked)?;
                Ok(Locked::Done(old))
            }
            Edit::Unchanged(old) => {
                lock.release_unchanged(self)?;
                Ok(Locked::Done(old))
            }
            Edit::NotU64(len) => {
                lock.release_unchanged(self)?;
                Err(KvError::ValueNotU64 { key, len })
            }
            Edit::Full { owner, value } => {
                // Conservative: the split's writes name the value from its
                // first batch on.
                self.slot_posted = true;
                self.split(
                    SplitInput {
                        key,
                        value,
                        at,
                        owner,
                    },
                    lock,
                )
            }
        }
    }

    /// The owner of `key` in the locked chain `at`, edited in a copy (no
    /// write is posted: a torn leaf is re-read, nothing else goes out).
    fn edit_owner(
        &mut self,
        key: u64,
        kind: Kind,
        strict: bool,
        at: &ChainAt,
        batch: &[(LeafAddr, u64)],
    ) -> Result<Edit, KvError> {
        let model = at.m as u64;
        let mut owner = match self.chase(model, key, self.chain[0], 0, batch)? {
            Chase::Owner(owner) => owner,
            Chase::Stale => {
                return Err(KvError::Inconsistent {
                    what: "a locked chain does not cover its key",
                    model,
                })
            }
        };
        self.learn(&at.view, at.j, &owner.path, owner.addr);
        let leaf_off = self.shared.region.leaf_offset(owner.addr)?;
        let leaf = Leaf::from_bytes_mut(&mut owner.bytes).map_err(bad_leaf(model, owner.addr))?;
        if strict {
            let current = leaf.validate().ok().and_then(|l| l.get(key));
            if let Some(v) = current.filter(|v| v.as_u64().is_none()) {
                return Ok(Edit::NotU64(v.len()));
            }
        }
        let old = match kind {
            Kind::Update(v) => match leaf.validate().ok().and_then(|l| l.get(key)) {
                None => None,
                Some(_) => leaf.upsert(key, v).ok().flatten(),
            },
            Kind::Delete => leaf.remove(key),
            Kind::Insert(value) => match leaf.upsert(key, value) {
                Ok(old) => old,
                Err(EditError::Full { .. }) => return Ok(Edit::Full { owner, value }),
                Err(_) => {
                    return Err(KvError::Inconsistent {
                        what: "the owning leaf refused its key",
                        model,
                    })
                }
            },
        };
        let changed = match kind {
            Kind::Insert(_) => true,
            Kind::Update(_) | Kind::Delete => old.is_some(),
        };
        if !changed {
            return Ok(Edit::Unchanged(old));
        }
        leaf.seal();
        Ok(Edit::Write {
            leaf_off,
            bytes: owner.bytes,
            old,
        })
    }

    /// Puts model `m` into the retraining queue. A queue that stays full
    /// for a bounded wait is back-pressure: the ticket is given up (the
    /// agent skips it once its abandon timeout runs out) and
    /// [`KvError::CirqFull`] returned. A ticket the agent already skipped
    /// as abandoned (this session stalled that long) is not written: the
    /// agent's own SLT watch retrains the model.
    fn enqueue(&mut self, m: u64) -> Result<(), KvError> {
        // With the backoff, about half a second: several of the agent's
        // default abandon timeouts.
        const FULL_ATTEMPTS: u64 = 2_000;
        let base = self.shared.sb.cirq_offset();
        let capacity = (self.shared.sb.cirq_len() - CirqHeader::SIZE) / 8;
        let v = self.io.run(
            &self.shared.pool,
            &[
                Op::Faa {
                    remote: base + CirqHeader::TAIL_OFFSET,
                    add: 1,
                },
                Op::Read {
                    remote: base + CirqHeader::HEAD_OFFSET,
                    local: 0,
                    len: 8,
                },
            ],
            "enqueueing a model for retraining",
        )?;
        let ticket = v[0];
        let mut head = self.io.local_u64(0)?;
        let mut attempt = 0;
        loop {
            match CirqHeader::check_ticket(ticket, head, capacity) {
                Ok(_) => break,
                Err(CirqError::Full { .. }) if attempt >= FULL_ATTEMPTS => {
                    return Err(KvError::CirqFull {
                        model: m,
                        ticket,
                        head,
                        capacity,
                        attempts: attempt,
                    });
                }
                Err(CirqError::Full { .. }) => {
                    attempt += 1;
                    self.backoff(attempt);
                    head = self.io.read_u64(
                        &self.shared.pool,
                        base + CirqHeader::HEAD_OFFSET,
                        "reading the CirQ head",
                    )?;
                }
                Err(CirqError::Abandoned { .. }) => return Ok(()),
                Err(_) => {
                    return Err(KvError::Inconsistent {
                        what: "the CirQ has no slots",
                        model: m,
                    })
                }
            }
        }
        let slot =
            CirqHeader::slot_offset(ticket, capacity).map_err(|_| KvError::Inconsistent {
                what: "the CirQ has no slots",
                model: m,
            })?;
        let value = CirqHeader::encode_slot(ticket, m).map_err(|_| KvError::Inconsistent {
            what: "model id too large to queue",
            model: m,
        })?;
        self.io.stage(0, &value.to_le_bytes())?;
        self.io.run(
            &self.shared.pool,
            &[Op::Write {
                remote: base + slot,
                local: 0,
                len: 8,
            }],
            "enqueueing a model for retraining",
        )?;
        self.counters.retrain_requests.fetch_add(1, Relaxed);
        Ok(())
    }

    // ---- scans ---------------------------------------------------------

    /// The values of a scan's pairs: inline ones as they are, blocks
    /// READ in batches of [`SCAN_VALUE_BATCH`] bytes; a block no longer
    /// holding its value (rewritten since its leaf was read) is read
    /// again by a get of its key, and the pair dropped if the key was
    /// removed meanwhile (a scan is not atomic).
    fn resolve(&mut self, found: Vec<(u64, SlotValue)>) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        let each = self.resolve_each(found)?;
        Ok(each
            .into_iter()
            .filter_map(|(k, v)| Some((k, v?)))
            .collect())
    }

    /// [`Self::resolve`] with every pair kept in its place: `None` for a
    /// key removed before its value could be read.
    fn resolve_each(&mut self, found: Vec<(u64, SlotValue)>) -> Result<ValuesRead, KvError> {
        let mut r = self.resolving(found)?;
        while let Some(b) = r.plan() {
            self.io.reserve(&self.shared.engine, b.end, 0)?;
            self.io.run(&self.shared.pool, &b.ops, "reading values")?;
            self.values_landed(&mut r, &b)?;
        }
        self.resolved_each(r)
    }

    /// [`Self::resolve`] begun: the inline values taken, each block
    /// pointer checked (a pointer out of the value area is an error).
    fn resolving(&self, found: Vec<(u64, SlotValue)>) -> Result<Resolving, KvError> {
        let mut r = Resolving {
            out: Vec::with_capacity(found.len()),
            ..Resolving::default()
        };
        for (k, v) in found {
            if let Some(at) = v.block() {
                self.check_pointer(k, at)?;
                r.blocks.push((r.out.len(), at));
            }
            r.out.push((k, v.inline_bytes().unwrap_or(&[]).to_vec()));
        }
        Ok(r)
    }

    /// Posts a batch of value blocks [`Resolving::plan`] made.
    fn post_values<'a>(&'a mut self, b: &'a ValueBatch) -> Result<InFlight<'a>, KvError> {
        self.io.reserve(&self.shared.engine, b.end, 0)?;
        self.io
            .post_each(&self.shared.pool, &b.ops, "reading values")
    }

    /// A batch of value blocks as it landed: each block still holding
    /// its key's value is the answer, the others are read again by
    /// [`Self::resolved_each`].
    fn values_landed(&mut self, r: &mut Resolving, b: &ValueBatch) -> Result<(), KvError> {
        for (&(idx, at), op) in r.blocks[b.blocks.clone()].iter().zip(&b.ops) {
            let Op::Read { local, len, .. } = *op else {
                continue;
            };
            let key = r.out[idx].0;
            match self.io.with_local(local, len, |b| {
                ValueBlock::check(b, key, at).map(<[u8]>::to_vec)
            })? {
                Ok(v) => r.out[idx].1 = v,
                Err(_) => r.stale.push(idx),
            }
        }
        Ok(())
    }

    /// [`Self::resolve`] ended: each value whose block was rewritten
    /// since its leaf was read is read again by a get of its key (`None`:
    /// the key is gone), every pair kept in its place.
    fn resolved_each(&mut self, r: Resolving) -> Result<ValuesRead, KvError> {
        let Resolving { out, stale, .. } = r;
        let mut out: Vec<(u64, Option<Vec<u8>>)> =
            out.into_iter().map(|(k, v)| (k, Some(v))).collect();
        for idx in stale {
            self.io.cur.retries += 1;
            let mut v = Vec::new();
            out[idx].1 = self.get_bytes(out[idx].0, &mut v)?.then_some(v);
        }
        self.io.cur.value_bytes += out
            .iter()
            .filter_map(|(_, v)| v.as_ref())
            .map(|v| v.len() as u64)
            .sum::<u64>();
        Ok(out)
    }
}

/// The first error among a batch's `results`.
/// The keys of `keys` whose get found a slot value: their indexes, and
/// each key with its slot value (in `keys`' order).
fn present_values(
    keys: &[u64],
    found: Vec<Option<SlotValue>>,
) -> (Vec<usize>, Vec<(u64, SlotValue)>) {
    found
        .into_iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i, (keys[i], v))))
        .unzip()
}

/// The answers to `n` keys: the values `resolved` (those of the present
/// keys, indexes `present`, in their order; `None`: removed meanwhile) at
/// their keys' places, `None` elsewhere.
fn place_values(
    n: usize,
    present: &[usize],
    resolved: Vec<(u64, Option<Vec<u8>>)>,
) -> Vec<Option<Vec<u8>>> {
    let mut out = vec![None; n];
    for (&i, (_, v)) in present.iter().zip(resolved) {
        out[i] = v;
    }
    out
}

fn first_error(results: &[Result<u64, TransferError>]) -> Option<TransferError> {
    results.iter().find_map(|r| r.as_ref().err().cloned())
}

/// The error of leaf `leaf`'s bytes, met in a chain of model `model`, not
/// being a leaf of this pool.
fn bad_leaf(model: u64, leaf: LeafAddr) -> impl Fn(LeafError) -> KvError {
    move |error| KvError::Leaf { model, leaf, error }
}

/// `v` as a `u64`, for the `u64` methods.
fn as_u64(key: u64, v: SlotValue) -> Result<u64, KvError> {
    v.as_u64()
        .ok_or_else(|| KvError::ValueNotU64 { key, len: v.len() })
}

fn valid(bytes: &[u8]) -> bool {
    Leaf::from_bytes(bytes).is_ok_and(|l| l.validate().is_ok())
}

/// Whether a staleness check's words, as `word` reads them by offset from
/// the check's start (directory word at 0; state and model id at 8 and 16,
/// read when `with_state`), name `view` as its model's live record.
fn words_current(
    view: &ModelView,
    with_state: bool,
    mut word: impl FnMut(u64) -> Result<u64, KvError>,
) -> Result<bool, KvError> {
    if word(0)? != view.offset {
        return Ok(false);
    }
    if with_state {
        let state = ModelState::from_raw(word(8)?);
        if !view.is_current(state, word(16)?) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The little-endian word at `at` in `bytes` (0 past their end: the
/// callers' ranges always hold it).
fn le_word(bytes: &[u8], at: u64) -> u64 {
    usize::try_from(at)
        .ok()
        .and_then(|at| bytes.get(at..at.checked_add(8)?))
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// What a leaf's bytes as they landed say of `key`: if they are an
/// intact leaf (checksum and structure) that is not freed and owns `key`
/// (its fences hold it), its value there (`Some(None)`: absent); `None`
/// when only a chase can tell.
fn owner_value(leaf: &[u8], key: u64) -> Option<Option<SlotValue>> {
    let owns = Leaf::from_bytes(leaf).is_ok_and(|l| {
        l.validate().is_ok() && !l.is_freed() && (l.fence_lo()..=l.fence_hi()).contains(&key)
    });
    owns.then(|| lookup(leaf, key))
}

/// The value of `key` in the owner's bytes, which the chase validated
/// (checksum and structure: sorted, values well formed) when it read them,
/// so they are searched without checking them again.
fn lookup(bytes: &[u8], key: u64) -> Option<SlotValue> {
    let entries = Leaf::from_bytes(bytes).ok()?.used_entries();
    let i = entries
        .binary_search_by_key(&key, rolex_core::layout::Slot::key)
        .ok()?;
    entries[i].value()
}
