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
//! (checksum, re-read alone while torn), and the chase accepts only a leaf
//! whose fences contain `k`. The directory word only makes staleness cheap
//! to notice: if it changed, the model is refreshed and the get redone. A
//! reader that did not notice (the switch landed after its word was read)
//! is still right: retraining moves no data and changes no fence, and once
//! it clears a link the chase stops at a leaf that does not cover `k`, which
//! sends the reader to refresh.
//!
//! # Writes: lock the chain, modify, unlock
//!
//! The writer locks its chain by `CAS` on the training leaf's LT entry
//! (the cached word is the `expected`; a mismatch returns the current word).
//! A failed lock reads the record's state word in the same batch: `RETIRED`
//! → refresh and redo (retired LT entries stay locked forever), `FROZEN` or
//! another writer → back off and retry.
//! - ordered fabric: batch 1 = CAS + READ state + READ chain (the READs run
//!   after the CAS); batch 2 = WRITE the leaves + CAS unlock (after the
//!   data): **2 round trips**.
//! - unordered fabric: CAS (1), READ chain (2), WRITE leaves (3), then the
//!   unlock is posted once the data is written and not awaited; the next
//!   operation of the session waits for it before it starts, so no operation
//!   of this session can overtake its own unlock: **3 dependent round
//!   trips**.
//! - a split adds one round trip for `FAA alloc_num` + `FAA` SLT count; the
//!   claim of SLT slot 128 enqueues the model in the CirQ (2 more).
//!
//! A held lock is a `ChainLock` guard, and only the guard releases it: with
//! the writes, unchanged, or — on every error after the lock — unchanged
//! before the error is returned, in the same round trips as the unlock of
//! a write that changed nothing (its docs list each path).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rolex_core::entry::{LeafAddr, LtEntry, SltHeader};
use rolex_core::layout::{
    CirqError, CirqHeader, EditError, Leaf, LeafError, LeafRegion, ModelRecord, ModelState, Slot,
};
use rolex_core::wire::MrDesc;

use crate::cache::ModelView;
use crate::client::{fetch_model, ClientShared};
use crate::error::KvError;
use crate::io::{Io, Op};
use crate::stats::{KvOp, SessionCounters};
use rolex_engine::callback::{CompletionFlag, OnValue};

/// Re-reads of one torn leaf before an operation gives up.
const MAX_TORN: u32 = 100_000;
/// Leaves a chase follows before it calls a chain broken.
const MAX_HOPS: usize = SltHeader::SLOTS + 2;
/// Chains a scan reads per batch.
const SCAN_CHAINS: u64 = 32;

/// Where the leaves of one batch land in the read buffer: (address, local
/// offset) of each READ planned.
type LeafReads = Vec<(LeafAddr, u64)>;

/// What a write does to its key.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Insert(u64),
    Update(u64),
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
}

/// How a locked modification ended.
enum Locked {
    Done(Option<u64>),
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
        old: Option<u64>,
    },
    /// Nothing to write (an update or delete of an absent key).
    Unchanged(Option<u64>),
    /// An insert of `value` found the owner full: split it.
    Full { owner: Owner, value: u64 },
}

/// What a split starts from: the insert `key` → `value` and the full owner
/// it met in the locked chain `at`.
struct SplitInput<'a> {
    key: u64,
    value: u64,
    at: &'a ChainAt,
    owner: Owner,
}

/// Split step 1's result: the new synonym leaf `B` and its SLT slot.
#[derive(Clone, Copy, Debug)]
struct Claim {
    leaf: LeafAddr,
    slot: u8,
}

/// Split step 2's result: the two leaves a split writes.
struct Halves {
    /// `A'`: `X`'s first half, same version line, `fence_hi` shrunk, linked
    /// to `B`.
    a: Vec<u8>,
    /// `B`: the second half, linked to `X`'s old successor.
    b: Vec<u8>,
    /// `X`'s old successor (`B`'s SLT slot points on to it).
    successor: LtEntry,
}

impl Halves {
    /// `X`'s pairs (its validated entries; none if it does not validate)
    /// with the new pair, cut in two at the middle key.
    fn cut(s: &SplitInput<'_>, claim: Claim, leaf_size: u64) -> Result<Self, KvError> {
        let model = s.at.m as u64;
        let x = Leaf::from_bytes(&s.owner.bytes).map_err(bad_leaf(model, s.owner.addr))?;
        let (x_lo, x_hi, x_next) = (x.fence_lo(), x.fence_hi(), x.next());
        let mut entries: Vec<Slot> = match x.validate() {
            Ok(v) => v.entries().to_vec(),
            Err(_) => Vec::new(),
        };
        let pos = entries.partition_point(|e| e.key() < s.key);
        entries.insert(pos, Slot::new(s.key, s.value));
        let mid = entries.len() / 2;
        let mid_key = entries[mid].key();
        let inconsistent = |_| KvError::Inconsistent {
            what: "a split produced an invalid leaf",
            model,
        };
        let b_link = LtEntry::for_leaf(claim.leaf).with_pointer(claim.slot);
        let mut a = s.owner.bytes.clone();
        let al = Leaf::from_bytes_mut(&mut a).map_err(bad_leaf(model, s.owner.addr))?;
        al.init(x_lo, mid_key - 1).map_err(inconsistent)?;
        al.set_entries(&entries[..mid]).map_err(inconsistent)?;
        al.set_next(b_link).map_err(inconsistent)?;
        al.seal();
        let mut b = vec![0u8; leaf_size as usize];
        let bl = Leaf::from_bytes_mut(&mut b).map_err(bad_leaf(model, claim.leaf))?;
        bl.init(mid_key, x_hi).map_err(inconsistent)?;
        bl.set_entries(&entries[mid..]).map_err(inconsistent)?;
        bl.set_next(x_next).map_err(inconsistent)?;
        bl.seal();
        Ok(Halves {
            a,
            b,
            successor: x_next,
        })
    }
}

/// Split step 3: where a split's bytes go, and the LT word its release
/// leaves.
struct SplitWrites {
    halves: Halves,
    b_off: u64,
    /// `B`'s SLT slot: `B`, pointing on to `X`'s old successor.
    b_slot: (u64, [u8; 8]),
    /// `X`'s SLT slot when `X` is a synonym: `X`, pointing on to `B`.
    x_slot: Option<(u64, [u8; 8])>,
    a_off: u64,
    /// The LT entry after the release: the word before the lock, pointing
    /// at `B`'s slot when `X` is the training leaf.
    unlock_to: LtEntry,
}

impl SplitWrites {
    /// Places `halves` for the split `s` that claimed `claim`, in a chain
    /// whose LT word was `unlocked` before the lock.
    fn place(
        region: LeafRegion,
        s: &SplitInput<'_>,
        claim: Claim,
        halves: Halves,
        unlocked: LtEntry,
    ) -> Result<Self, KvError> {
        let record = &s.at.view.record;
        let b_off = region.leaf_offset(claim.leaf)?;
        let b_slot_entry = LtEntry::for_leaf(claim.leaf).with_pointer(halves.successor.pointer());
        let b_slot = (
            record.slt_slot_offset(claim.slot)?,
            b_slot_entry.raw().to_le_bytes(),
        );
        let (x_slot, unlock_to) = if s.owner.slot == 0 {
            (None, unlocked.with_pointer(claim.slot))
        } else {
            let x_entry = LtEntry::for_leaf(s.owner.addr).with_pointer(claim.slot);
            let x_slot = (
                record.slt_slot_offset(s.owner.slot)?,
                x_entry.raw().to_le_bytes(),
            );
            (Some(x_slot), unlocked)
        };
        let a_off = region.leaf_offset(s.owner.addr)?;
        Ok(SplitWrites {
            halves,
            b_off,
            b_slot,
            x_slot,
            a_off,
            unlock_to,
        })
    }

    /// The writes in posting order: `B` is written before (ordered fabric)
    /// or with (unordered: readers validate `B`) the `A'` that makes it
    /// reachable.
    fn in_order(&self) -> Vec<(u64, &[u8])> {
        let mut writes: Vec<(u64, &[u8])> = vec![
            (self.b_off, &self.halves.b),
            (self.b_slot.0, &self.b_slot.1),
        ];
        if let Some((off, bytes)) = &self.x_slot {
            writes.push((*off, bytes));
        }
        writes.push((self.a_off, &self.halves.a));
        writes
    }
}

/// A chain this session holds locked: the LT entry at `lt_off` of model
/// `model`, which the lock's CAS turned from `unlocked` into `locked`. It
/// is released exactly once, through this guard:
/// - a write that changed its leaves: [`ChainLock::release`] with the
///   writes (one batch with the unlocking CAS on an ordered fabric; on an
///   unordered one the CAS is posted once the writes completed);
/// - a write that changed nothing, a split that found the SLT full:
///   [`ChainLock::release_unchanged`];
/// - every error after the lock — a READ of the locking batch that failed
///   while its CAS took the lock, the unordered read of the chain, a chase
///   that does not end in the chain, a leaf that refuses its key, the
///   synonym claim, a full leaf region, a split that cannot be laid out:
///   [`ChainLock::abort`], which releases it unchanged, the same way, and
///   hands the error back;
/// - none of those (a panic): `Drop` posts the unchanged release through
///   the engine without waiting for it (best effort: the session is gone
///   or failing; the memory node's lease reaper is the backstop for a dead
///   process).
///
/// A release that was posted spends the guard even if it failed: its CAS
/// may have landed, and a second one could free the lock of a later holder
/// whose locked word is the same (a session of this client that locked the
/// same chain from the same word).
#[must_use = "a locked chain must be released"]
struct ChainLock {
    model: u64,
    lt_off: u64,
    unlocked: LtEntry,
    locked: u64,
    /// `Some` until a release was posted: what `Drop` posts through.
    shared: Option<Arc<ClientShared>>,
}

/// An unlock posted and not awaited (unordered fabric).
struct PendingUnlock {
    flag: Arc<CompletionFlag>,
    /// The locked word the unlocking CAS expects.
    locked: u64,
    /// The model whose chain it releases.
    model: u64,
}

/// One thread's session (see the module docs). Not shared between
/// threads; open one per thread with [`super::KvClient::session`].
pub struct KvSession {
    shared: Arc<ClientShared>,
    io: Io,
    counters: Arc<SessionCounters>,
    chain: Vec<LeafAddr>,
    /// Unlock posted and not awaited (unordered fabric).
    pending: Option<PendingUnlock>,
    leaf_size: u64,
    rng: u64,
}

impl std::fmt::Debug for KvSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvSession").finish_non_exhaustive()
    }
}

impl KvSession {
    pub(crate) fn new(shared: Arc<ClientShared>) -> Result<Self, KvError> {
        let io = Io::new(&shared.engine, shared.cfg.session_buffer)?;
        let counters = Arc::new(SessionCounters::default());
        shared
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(counters.clone());
        let leaf_size = shared.region.leaf_size();
        let rng = (Arc::as_ptr(&counters) as u64) | 1;
        Ok(Self {
            shared,
            io,
            counters,
            chain: Vec::new(),
            pending: None,
            leaf_size,
            rng,
        })
    }

    /// The value of `key`, if present.
    pub fn get(&mut self, key: u64) -> Result<Option<u64>, KvError> {
        self.counted(KvOp::Get, |s| s.get_inner(key))
    }

    /// Sets `key` to `value`; returns the previous value if the key was
    /// present.
    pub fn insert(&mut self, key: u64, value: u64) -> Result<Option<u64>, KvError> {
        self.counted(KvOp::Insert, |s| s.write_op(key, Kind::Insert(value)))
    }

    /// Sets `key` to `value` only if present; returns the previous value
    /// (`None`: absent, nothing written).
    pub fn update(&mut self, key: u64, value: u64) -> Result<Option<u64>, KvError> {
        self.counted(KvOp::Update, |s| s.write_op(key, Kind::Update(value)))
    }

    /// Removes `key`; returns its value if it was present.
    pub fn delete(&mut self, key: u64) -> Result<Option<u64>, KvError> {
        self.counted(KvOp::Delete, |s| s.write_op(key, Kind::Delete))
    }

    /// Up to `n` pairs with key `≥ from`, in key order. Not atomic: a pair
    /// present for the whole scan is returned; one written meanwhile may
    /// or may not be.
    pub fn scan(&mut self, from: u64, n: usize) -> Result<Vec<(u64, u64)>, KvError> {
        if n == 0 {
            return Err(KvError::ScanCountZero);
        }
        self.counted(KvOp::Scan, |s| s.scan_inner(from, u64::MAX, n))
    }

    /// Every pair with `lo ≤ key ≤ hi`, in key order (as [`Self::scan`]).
    pub fn range(&mut self, lo: u64, hi: u64) -> Result<Vec<(u64, u64)>, KvError> {
        if lo > hi {
            return Err(KvError::InvalidRange { lo, hi });
        }
        self.counted(KvOp::Scan, |s| s.scan_inner(lo, hi, usize::MAX))
    }

    /// Waits for this session's posted unlock, if any (the next operation
    /// does this itself).
    pub fn flush(&mut self) -> Result<(), KvError> {
        self.settle()
    }

    fn counted<T>(
        &mut self,
        op: KvOp,
        f: impl FnOnce(&mut Self) -> Result<T, KvError>,
    ) -> Result<T, KvError> {
        self.io.cur = Default::default();
        let r = self.settle().and_then(|()| f(self));
        self.io.cur.ops = 1;
        self.counters.per_op[op.index()].add(&self.io.cur);
        r
    }

    // ---- shared pieces -------------------------------------------------

    fn settle(&mut self) -> Result<(), KvError> {
        if let Some(p) = self.pending.take() {
            match p.flag.wait(Duration::from_secs(30)) {
                Some(Ok(v)) if v == p.locked => {}
                Some(Ok(_)) => {
                    return Err(KvError::Inconsistent {
                        what: "a posted unlock found its entry changed",
                        model: p.model,
                    })
                }
                Some(Err(error)) => {
                    return Err(KvError::Transfer {
                        during: "unlocking a chain",
                        error,
                    })
                }
                None => {
                    return Err(KvError::TooManyRetries {
                        op: "unlock",
                        attempts: 1,
                    })
                }
            }
        }
        Ok(())
    }

    fn view_for(&self, key: u64) -> (usize, Arc<ModelView>) {
        let m = self.shared.locator.locate(key);
        (m, self.shared.view(m))
    }

    /// The chain that owns `key` in the cached view; `self.chain` is set to
    /// its leaves as the cache knows them.
    fn chain_at(&mut self, key: u64) -> ChainAt {
        let (m, view) = self.view_for(key);
        let j = self.owner(&view, key);
        self.chain.clear();
        view.chain(j, &mut self.chain);
        ChainAt { m, view, j }
    }

    fn refresh(&mut self, m: usize) -> Result<(), KvError> {
        let shared = self.shared.clone();
        let v = fetch_model(&mut self.io, &shared.pool, &shared.sb, m as u64)?;
        shared.install(m, v);
        self.io.cur.refreshes += 1;
        Ok(())
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
        let region = self.shared.region;
        let mut out = Vec::with_capacity(self.chain.len());
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
        Ok(out)
    }

    /// The validated bytes of the leaf at `addr`: from the batch if it was
    /// read there and is intact, else read alone until it validates.
    fn leaf(&mut self, addr: LeafAddr, batch: &[(LeafAddr, u64)]) -> Result<Vec<u8>, KvError> {
        let mut bytes = vec![0u8; self.leaf_size as usize];
        if let Some(&(_, local)) = batch.iter().find(|(a, _)| *a == addr) {
            self.io.local(local, &mut bytes)?;
            if valid(&bytes) {
                return Ok(bytes);
            }
            self.io.cur.retries += 1;
        }
        let remote = self.shared.region.leaf_offset(addr)?;
        let pool = self.shared.pool.clone();
        for attempt in 0..MAX_TORN {
            self.io.run(
                &pool,
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
            let bytes = self.leaf(addr, batch)?;
            let leaf = Leaf::from_bytes(&bytes).map_err(bad_leaf(model, addr))?;
            if key < leaf.fence_lo() {
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

    fn get_inner(&mut self, key: u64) -> Result<Option<u64>, KvError> {
        let pool = self.shared.pool.clone();
        for attempt in 0..self.shared.cfg.max_attempts {
            let ChainAt { m, view, j } = self.chain_at(key);
            let dir = self.shared.sb.directory_entry_offset(m as u64)?;
            let mut ops = vec![Op::Read {
                remote: dir,
                local: 0,
                len: 8,
            }];
            let batch = self.plan_reads(8, &mut ops)?;
            self.io.run(&pool, &ops, "get")?;
            if self.io.local_u64(0)? != view.offset {
                self.io.cur.retries += 1;
                self.refresh(m)?;
                continue;
            }
            match self.chase(m as u64, key, self.chain[0], 0, &batch)? {
                Chase::Owner(owner) => {
                    self.learn(&view, j, &owner.path, owner.addr);
                    return Ok(lookup(&owner.bytes, key));
                }
                Chase::Stale => {
                    self.io.cur.retries += 1;
                    self.refresh(m)?;
                    self.backoff(attempt);
                }
            }
        }
        Err(KvError::TooManyRetries {
            op: "get",
            attempts: self.shared.cfg.max_attempts,
        })
    }

    // ---- writes --------------------------------------------------------

    fn write_op(&mut self, key: u64, kind: Kind) -> Result<Option<u64>, KvError> {
        let mut slt_deadline: Option<Instant> = None;
        for attempt in 0..self.shared.cfg.max_attempts {
            let at = self.chain_at(key);
            let Some((lock, batch)) = self.lock_chain(&at, attempt)? else {
                continue;
            };
            match self.modify_locked(key, kind, &at, lock, &batch)? {
                Locked::Done(v) => return Ok(v),
                Locked::SltFull => {
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

    /// Locks the chain `at` (module docs, "Writes"): CAS its LT entry from
    /// the cached word to the same word locked by this client, reading the
    /// record's state word in the same batch, and the chain's leaves — in
    /// that batch on an ordered fabric (the READs run after the CAS), in a
    /// second round trip once the lock is held on an unordered one. Returns
    /// the lock and where each leaf landed in the read buffer; `None` when
    /// the CAS failed (stale cached word, retired or frozen model, another
    /// writer): the cache was corrected or the session backed off, and the
    /// caller retries. If a READ of the batch failed while its CAS took the
    /// lock, the lock is released and the error returned; if the CAS itself
    /// failed it may or may not have taken the lock, and the word is left
    /// as it is: its locked form is the same for every session of this
    /// client's lock owner, so this session cannot tell its own lock.
    fn lock_chain(
        &mut self,
        at: &ChainAt,
        attempt: u64,
    ) -> Result<Option<(ChainLock, LeafReads)>, KvError> {
        let pool = self.shared.pool.clone();
        let ordered = self.shared.ordered;
        let j = at.j as usize;
        let lt_off = at.view.record.lt_entry_offset(at.j)?;
        let exp = LtEntry::from_raw(at.view.lt[j].load(Relaxed));
        let locked = exp.locked_by(self.shared.cfg.lock_owner).raw();
        let mut ops = vec![
            Op::Cas {
                remote: lt_off,
                expected: exp.raw(),
                new: locked,
            },
            Op::Read {
                remote: at.view.offset + ModelRecord::STATE_OFFSET,
                local: 0,
                len: 8,
            },
        ];
        let batch = if ordered {
            self.plan_reads(8, &mut ops)?
        } else {
            Vec::new()
        };
        let lock = |shared: &Arc<ClientShared>| ChainLock {
            model: at.m as u64,
            lt_off,
            unlocked: exp,
            locked,
            shared: Some(shared.clone()),
        };
        let old = match self.io.run(&pool, &ops, "locking a chain").map(|v| v[0]) {
            Ok(old) => old,
            // The CAS took the lock though a READ of its batch failed.
            Err(e) if self.io.completed(0) == Some(exp.raw()) => {
                let held = lock(&self.shared);
                return Err(held.abort(self, e));
            }
            Err(e) => return Err(e),
        };
        if old != exp.raw() {
            self.io.cur.retries += 1;
            let o = LtEntry::from_raw(old);
            if !o.is_locked() {
                // Our cached word was stale (a new synonym pointer).
                at.view.lt[j].store(old, Relaxed);
                return Ok(None);
            }
            let state = ModelState::from_raw(self.io.local_u64(0)?);
            if state.is_retired() {
                self.refresh(at.m)?;
            } else {
                self.backoff(attempt);
            }
            return Ok(None);
        }
        let lock = lock(&self.shared);
        if ordered {
            return Ok(Some((lock, batch)));
        }
        match self.read_chain(&pool) {
            Ok(batch) => Ok(Some((lock, batch))),
            Err(e) => Err(lock.abort(self, e)),
        }
    }

    /// READs the leaves of `self.chain` in one round trip.
    fn read_chain(&mut self, pool: &MrDesc) -> Result<LeafReads, KvError> {
        let mut ops = Vec::new();
        let batch = self.plan_reads(8, &mut ops)?;
        self.io.run(pool, &ops, "reading a locked chain")?;
        Ok(batch)
    }

    /// Holding `lock` on chain `at` (its leaves in the read buffer as
    /// `batch` says): edit the owner of `key`, then write it and unlock in
    /// one release — or split it when an insert finds it full. Every path
    /// releases the lock through the guard (see [`ChainLock`]).
    fn modify_locked(
        &mut self,
        key: u64,
        kind: Kind,
        at: &ChainAt,
        lock: ChainLock,
        batch: &[(LeafAddr, u64)],
    ) -> Result<Locked, KvError> {
        let edit = match self.edit_owner(key, kind, at, batch) {
            Ok(edit) => edit,
            Err(e) => return Err(lock.abort(self, e)),
        };
        match edit {
            Edit::Write {
                leaf_off,
                bytes,
                old,
            } => {
                let unlocked = lock.unlocked;
                lock.release(self, &[(leaf_off, &bytes)], unlocked)?;
                Ok(Locked::Done(old))
            }
            Edit::Unchanged(old) => {
                lock.release_unchanged(self)?;
                Ok(Locked::Done(old))
            }
            Edit::Full { owner, value } => self.split(
                SplitInput {
                    key,
                    value,
                    at,
                    owner,
                },
                lock,
            ),
        }
    }

    /// The owner of `key` in the locked chain `at`, edited in a copy (no
    /// write is posted: a torn leaf is re-read, nothing else goes out).
    fn edit_owner(
        &mut self,
        key: u64,
        kind: Kind,
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

    /// Splits the full owner `X` of `s.key` while inserting `s.key` →
    /// `s.value`, holding `lock` on its chain:
    /// 1. [`Self::claim_synonym`]: claim a leaf `B` and an SLT slot for it
    ///    (one round trip); an SLT already full releases the lock unchanged
    ///    and reports [`Locked::SltFull`];
    /// 2. [`Halves::cut`]: `X`'s pairs and the new one, cut in two — `A'`
    ///    (`X`'s first half, `fence_hi` shrunk, linked to `B`) and `B` (the
    ///    second half, linked to `X`'s old successor); no I/O;
    /// 3. [`SplitWrites::place`] and the release: `B`, its SLT slot, `X`'s
    ///    slot when `X` is a synonym, then `A'`, written with the unlock,
    ///    which points the LT entry at the new slot when `X` is the
    ///    training leaf;
    /// 4. [`Self::learn_split`]: the cache learns the new link and synonym;
    ///    the claim of SLT slot 128 enqueues the model for retraining.
    ///
    /// An error in steps 1 to 3 before the release aborts the lock.
    fn split(&mut self, s: SplitInput<'_>, lock: ChainLock) -> Result<Locked, KvError> {
        let claim = match self.claim_synonym(&s.at.view) {
            Ok(Some(claim)) => claim,
            Ok(None) => {
                lock.release_unchanged(self)?;
                return Ok(Locked::SltFull);
            }
            Err(e) => return Err(lock.abort(self, e)),
        };
        let planned = Halves::cut(&s, claim, self.leaf_size).and_then(|halves| {
            SplitWrites::place(self.shared.region, &s, claim, halves, lock.unlocked)
        });
        let writes = match planned {
            Ok(writes) => writes,
            Err(e) => return Err(lock.abort(self, e)),
        };
        lock.release(self, &writes.in_order(), writes.unlock_to)?;
        self.learn_split(&s, claim, writes.unlock_to)?;
        Ok(Locked::Done(None))
    }

    /// Split step 1: `FAA alloc_num` and `FAA` the model's SLT count in one
    /// batch. `None`: the SLT has no slot left (the leaf number drawn is
    /// left unused); [`KvError::LeafRegionFull`]: no leaf left.
    fn claim_synonym(&mut self, view: &ModelView) -> Result<Option<Claim>, KvError> {
        let pool = self.shared.pool.clone();
        let region = self.shared.region;
        let slt0 = view.record.slt_slot_offset(0)?;
        let got = self.io.run(
            &pool,
            &[
                Op::Faa {
                    remote: region.alloc_num_offset(),
                    add: 1,
                },
                Op::Faa {
                    remote: slt0,
                    add: 1,
                },
            ],
            "allocating a synonym leaf",
        )?;
        let (leaf_no, fetched) = (got[0], got[1]);
        let Ok(slot) = SltHeader::claimed_slot(fetched) else {
            return Ok(None);
        };
        let leaf = region.claim(leaf_no).map_err(|_| KvError::LeafRegionFull {
            capacity: region.capacity(),
        })?;
        Ok(Some(Claim { leaf, slot }))
    }

    /// Split step 4, after the release: what the cache learns, and the
    /// retraining request at the SLT's last slot.
    fn learn_split(
        &mut self,
        s: &SplitInput<'_>,
        claim: Claim,
        unlocked_to: LtEntry,
    ) -> Result<(), KvError> {
        let view = &s.at.view;
        view.lt[s.at.j as usize].store(unlocked_to.raw(), Relaxed);
        let mut synonyms: Vec<LeafAddr> = s.owner.path.iter().skip(1).copied().collect();
        if !s.owner.path.is_empty() {
            synonyms.push(s.owner.addr);
        }
        synonyms.push(claim.leaf);
        view.learn(s.at.j, synonyms);
        self.counters.synonym_leaves.fetch_add(1, Relaxed);
        if SltHeader::triggers_retraining(claim.slot) {
            self.enqueue(s.at.m as u64)?;
        }
        Ok(())
    }

    /// Writes `writes` and releases `lock` (locked word → `to`): in one
    /// batch on an ordered fabric; on an unordered one, the unlock is
    /// posted after the writes completed and not awaited (the next
    /// operation waits for it, [`Self::settle`]). Only [`ChainLock`]'s
    /// release calls this.
    fn write_and_unlock(
        &mut self,
        lock: &ChainLock,
        writes: &[(u64, &[u8])],
        to: u64,
    ) -> Result<(), KvError> {
        let pool = self.shared.pool.clone();
        let mut ops = Vec::with_capacity(writes.len() + 1);
        let mut local = 0u64;
        for &(remote, bytes) in writes {
            self.io.stage(local, bytes)?;
            ops.push(Op::Write {
                remote,
                local,
                len: bytes.len() as u64,
            });
            local += (bytes.len() as u64).next_multiple_of(8);
        }
        if self.shared.ordered {
            ops.push(Op::Cas {
                remote: lock.lt_off,
                expected: lock.locked,
                new: to,
            });
            let got = *self
                .io
                .run(&pool, &ops, "writing and unlocking")?
                .last()
                .unwrap_or(&0);
            if got != lock.locked {
                return Err(KvError::Inconsistent {
                    what: "a held lock changed under its holder",
                    model: lock.model,
                });
            }
            return Ok(());
        }
        if !ops.is_empty() {
            self.io.run(&pool, &ops, "writing a locked chain")?;
        }
        let flag = CompletionFlag::new();
        self.io.cur.posted += 1;
        self.io.cur.atomics += 1;
        self.shared
            .engine
            .submit_cas((&pool, lock.lt_off), lock.locked, to, OnValue::flag(&flag))
            .map_err(crate::error::transfer("posting an unlock"))?;
        self.pending = Some(PendingUnlock {
            flag,
            locked: lock.locked,
            model: lock.model,
        });
        Ok(())
    }

    /// Puts model `m` into the retraining queue.
    fn enqueue(&mut self, m: u64) -> Result<(), KvError> {
        let pool = self.shared.pool.clone();
        let base = self.shared.sb.cirq_offset();
        let capacity = (self.shared.sb.cirq_len() - CirqHeader::SIZE) / 8;
        let v = self.io.run(
            &pool,
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
                Err(CirqError::Full { .. }) => {
                    attempt += 1;
                    self.backoff(attempt);
                    head = self.io.read_u64(
                        &pool,
                        base + CirqHeader::HEAD_OFFSET,
                        "reading the CirQ head",
                    )?;
                }
                Err(_) => {
                    return Err(KvError::Inconsistent {
                        what: "the CirQ head passed a ticket",
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
        let value = CirqHeader::encode_slot(m).map_err(|_| KvError::Inconsistent {
            what: "model id too large to queue",
            model: m,
        })?;
        self.io.stage(0, &value.to_le_bytes())?;
        self.io.run(
            &pool,
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

    fn scan_inner(&mut self, from: u64, hi: u64, n: usize) -> Result<Vec<(u64, u64)>, KvError> {
        let pool = self.shared.pool.clone();
        let per_chain = u64::from(self.shared.sb.keys_per_leaf()).max(1);
        let mut out: Vec<(u64, u64)> = Vec::new();
        let mut cursor = from;
        let mut attempt = 0u64;
        'batch: loop {
            if attempt >= self.shared.cfg.max_attempts {
                return Err(KvError::TooManyRetries {
                    op: "scan",
                    attempts: attempt,
                });
            }
            let (m, view) = self.view_for(cursor);
            let j = self.owner(&view, cursor);
            let leaves = view.fences.len() as u64;
            let want = (n.saturating_sub(out.len()) as u64)
                .div_ceil(per_chain)
                .saturating_add(1);
            let mut chains = want.clamp(1, SCAN_CHAINS).min(leaves - j);
            if hi != u64::MAX {
                // Only the chains up to the one holding `hi`.
                let last = view.fences.partition_point(|&f| f <= hi) as u64;
                chains = chains.min(last.saturating_sub(j).max(1));
            }
            self.chain.clear();
            for jj in j..j + chains {
                view.chain(jj, &mut self.chain);
            }
            let dir = self.shared.sb.directory_entry_offset(m as u64)?;
            let mut ops = vec![Op::Read {
                remote: dir,
                local: 0,
                len: 8,
            }];
            let batch = self.plan_reads(8, &mut ops)?;
            self.io.run(&pool, &ops, "scan")?;
            if self.io.local_u64(0)? != view.offset {
                attempt += 1;
                self.io.cur.retries += 1;
                self.refresh(m)?;
                continue;
            }
            let mut jj = j;
            let mut start = view.training_leaf(jj);
            loop {
                let (addr, bytes, next) = match self.chase(m as u64, cursor, start, 0, &batch)? {
                    Chase::Owner(Owner { addr, bytes, .. }) => {
                        let next = Leaf::from_bytes(&bytes)
                            .map(|l| l.next())
                            .unwrap_or_default();
                        (addr, bytes, next)
                    }
                    Chase::Stale => {
                        attempt += 1;
                        self.io.cur.retries += 1;
                        self.refresh(m)?;
                        self.backoff(attempt);
                        continue 'batch;
                    }
                };
                let leaf = Leaf::from_bytes(&bytes).map_err(bad_leaf(m as u64, addr))?;
                let fence_hi = leaf.fence_hi();
                if let Ok(v) = leaf.validate() {
                    for s in v.entries() {
                        if s.key() < cursor {
                            continue;
                        }
                        if s.key() > hi {
                            self.io.cur.keys += out.len() as u64;
                            return Ok(out);
                        }
                        out.push((s.key(), s.value()));
                        if out.len() >= n {
                            self.io.cur.keys += out.len() as u64;
                            return Ok(out);
                        }
                    }
                }
                if fence_hi >= hi {
                    self.io.cur.keys += out.len() as u64;
                    return Ok(out);
                }
                cursor = fence_hi + 1;
                if next.pointer() != 0 {
                    start = next.addr();
                    continue;
                }
                // The chain ended: the next training leaf must start here.
                jj += 1;
                if jj == leaves {
                    if cursor != view.record.key_hi().wrapping_add(1) {
                        attempt += 1;
                        self.io.cur.retries += 1;
                        self.refresh(m)?;
                    }
                    continue 'batch;
                }
                if view.fences[jj as usize] != cursor {
                    attempt += 1;
                    self.io.cur.retries += 1;
                    self.refresh(m)?;
                    continue 'batch;
                }
                if jj >= j + chains {
                    continue 'batch;
                }
                start = view.training_leaf(jj);
            }
        }
    }
}

impl ChainLock {
    /// Writes `writes` and releases the lock, leaving the LT entry at `to`
    /// (see [`KvSession::write_and_unlock`] for the round trips).
    fn release(
        mut self,
        s: &mut KvSession,
        writes: &[(u64, &[u8])],
        to: LtEntry,
    ) -> Result<(), KvError> {
        // Spent from here on, whatever the post's outcome (see the type).
        self.shared = None;
        s.write_and_unlock(&self, writes, to.raw())
    }

    /// Releases the lock with nothing written, the LT entry back to the
    /// word it held before the lock.
    fn release_unchanged(self, s: &mut KvSession) -> Result<(), KvError> {
        let to = self.unlocked;
        self.release(s, &[], to)
    }

    /// Releases the lock unchanged after `error` and returns `error` — or
    /// the release's own error if that failed (the lock's fate is then the
    /// more urgent news).
    fn abort(self, s: &mut KvSession, error: KvError) -> KvError {
        match self.release_unchanged(s) {
            Ok(()) => error,
            Err(release) => release,
        }
    }
}

impl Drop for ChainLock {
    fn drop(&mut self) {
        // Only reached with no release posted (a panic between lock and
        // release): nobody else changes a locked word, so restoring it is
        // safe. Not awaited, not counted: the session is unwinding.
        if let Some(shared) = self.shared.take() {
            let _ = shared.engine.submit_cas(
                (&shared.pool, self.lt_off),
                self.locked,
                self.unlocked.raw(),
                OnValue::callback(|_| {}),
            );
        }
    }
}

/// The error of leaf `leaf`'s bytes, met in a chain of model `model`, not
/// being a leaf of this pool.
fn bad_leaf(model: u64, leaf: LeafAddr) -> impl Fn(LeafError) -> KvError {
    move |error| KvError::Leaf { model, leaf, error }
}

fn valid(bytes: &[u8]) -> bool {
    Leaf::from_bytes(bytes).is_ok_and(|l| l.validate().is_ok())
}

fn lookup(bytes: &[u8], key: u64) -> Option<u64> {
    Leaf::from_bytes(bytes)
        .ok()
        .and_then(|l| l.validate().ok())
        .and_then(|v| v.get(key))
}
