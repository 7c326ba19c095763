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

use std::sync::Arc;
use std::time::{Duration, Instant};

use rolex_core::entry::{LeafAddr, LtEntry, SltHeader};
use rolex_core::layout::{CirqError, CirqHeader, EditError, Leaf, ModelRecord, ModelState};

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

/// What a write does to its key.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Insert(u64),
    Update(u64),
    Delete,
}

/// Where a chase ended.
enum Chase {
    /// The leaf that owns the key: address, SLT slot (0 = training leaf),
    /// validated bytes, and the leaves visited before it.
    Owner {
        addr: LeafAddr,
        slot: u8,
        bytes: Vec<u8>,
        path: Vec<LeafAddr>,
    },
    /// The cached model no longer describes the chain: refresh.
    Stale,
}

/// How a locked modification ended.
enum Locked {
    Done(Option<u64>),
    /// No synonym slot left: the lock was released, wait for retraining.
    SltFull,
}

/// One thread's session (see the module docs). Not shared between
/// threads; open one per thread with [`super::KvClient::session`].
pub struct KvSession {
    shared: Arc<ClientShared>,
    io: Io,
    counters: Arc<SessionCounters>,
    chain: Vec<LeafAddr>,
    /// Unlock posted and not awaited (unordered fabric): flag, expected old
    /// word, LT offset.
    pending: Option<(Arc<CompletionFlag>, u64)>,
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
        if let Some((flag, locked)) = self.pending.take() {
            match flag.wait(Duration::from_secs(30)) {
                Some(Ok(v)) if v == locked => {}
                Some(Ok(_)) => {
                    return Err(KvError::Inconsistent {
                        what: "a posted unlock found its entry changed",
                        model: 0,
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
            self.counters
                .model_misses
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        j
    }

    /// Plans READs of `chain` after `base` bytes of the read buffer, as many
    /// as fit; returns (address, local offset) of each.
    fn plan_reads(
        &mut self,
        base: u64,
        ops: &mut Vec<Op>,
    ) -> Result<Vec<(LeafAddr, u64)>, KvError> {
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

    /// The chase from `start` (SLT slot `slot`) to the owner of `key`.
    fn chase(
        &mut self,
        key: u64,
        start: LeafAddr,
        slot: u8,
        batch: &[(LeafAddr, u64)],
    ) -> Result<Chase, KvError> {
        let (mut addr, mut slot) = (start, slot);
        let mut path = Vec::new();
        for _ in 0..MAX_HOPS {
            let bytes = self.leaf(addr, batch)?;
            let leaf = Leaf::from_bytes(&bytes).map_err(|_| KvError::Inconsistent {
                what: "leaf size",
                model: 0,
            })?;
            if key < leaf.fence_lo() {
                return Ok(Chase::Stale);
            }
            if key <= leaf.fence_hi() {
                return Ok(Chase::Owner {
                    addr,
                    slot,
                    bytes,
                    path,
                });
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
            let (m, view) = self.view_for(key);
            let j = self.owner(&view, key);
            self.chain.clear();
            view.chain(j, &mut self.chain);
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
            match self.chase(key, self.chain[0], 0, &batch)? {
                Chase::Owner {
                    addr, bytes, path, ..
                } => {
                    self.learn(&view, j, &path, addr);
                    return Ok(lookup(&bytes, key));
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
        let pool = self.shared.pool.clone();
        let ordered = self.shared.ordered;
        let mut slt_deadline: Option<Instant> = None;
        for attempt in 0..self.shared.cfg.max_attempts {
            let (m, view) = self.view_for(key);
            let j = self.owner(&view, key);
            self.chain.clear();
            view.chain(j, &mut self.chain);
            let lt_off = view.record.lt_entry_offset(j)?;
            let exp =
                LtEntry::from_raw(view.lt[j as usize].load(std::sync::atomic::Ordering::Relaxed));
            let mut ops = vec![
                Op::Cas {
                    remote: lt_off,
                    expected: exp.raw(),
                    new: exp.locked_by(self.shared.cfg.lock_owner).raw(),
                },
                Op::Read {
                    remote: view.offset + ModelRecord::STATE_OFFSET,
                    local: 0,
                    len: 8,
                },
            ];
            let mut batch = if ordered {
                self.plan_reads(8, &mut ops)?
            } else {
                Vec::new()
            };
            let old = self.io.run(&pool, &ops, "locking a chain")?[0];
            if old != exp.raw() {
                self.io.cur.retries += 1;
                let o = LtEntry::from_raw(old);
                if !o.is_locked() {
                    // Our cached word was stale (a new synonym pointer).
                    view.lt[j as usize].store(old, std::sync::atomic::Ordering::Relaxed);
                    continue;
                }
                let state = ModelState::from_raw(self.io.local_u64(0)?);
                if state.is_retired() {
                    self.refresh(m)?;
                } else {
                    self.backoff(attempt);
                }
                continue;
            }
            if !ordered {
                let mut ops = Vec::new();
                batch = self.plan_reads(8, &mut ops)?;
                self.io.run(&pool, &ops, "reading a locked chain")?;
            }
            match self.modify_locked(key, kind, m, &view, j, lt_off, exp, &batch)? {
                Locked::Done(v) => return Ok(v),
                Locked::SltFull => {
                    let now = Instant::now();
                    let deadline = *slt_deadline.get_or_insert_with(|| {
                        self.counters
                            .slt_full_waits
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        now + self.shared.cfg.slt_full_wait
                    });
                    if now >= deadline {
                        return Err(KvError::SltFull { model: m as u64 });
                    }
                    self.io.cur.retries += 1;
                    std::thread::sleep(Duration::from_micros(200));
                    self.refresh(m)?;
                }
            }
        }
        Err(KvError::TooManyRetries {
            op: "write",
            attempts: self.shared.cfg.max_attempts,
        })
    }

    /// Holding the lock of chain `j` (LT word `exp` | lock): find the owner,
    /// modify, write, unlock. Every path releases the lock.
    #[allow(clippy::too_many_arguments)]
    fn modify_locked(
        &mut self,
        key: u64,
        kind: Kind,
        m: usize,
        view: &ModelView,
        j: u64,
        lt_off: u64,
        exp: LtEntry,
        batch: &[(LeafAddr, u64)],
    ) -> Result<Locked, KvError> {
        let locked = exp.locked_by(self.shared.cfg.lock_owner).raw();
        let chased = self.chase(key, self.chain[0], 0, batch);
        let (addr, slot, mut bytes, path) = match chased {
            Ok(Chase::Owner {
                addr,
                slot,
                bytes,
                path,
            }) => (addr, slot, bytes, path),
            Ok(Chase::Stale) => {
                self.unlock(&[], lt_off, locked, exp.raw())?;
                return Err(KvError::Inconsistent {
                    what: "a locked chain does not cover its key",
                    model: m as u64,
                });
            }
            Err(e) => {
                self.unlock(&[], lt_off, locked, exp.raw())?;
                return Err(e);
            }
        };
        self.learn(view, j, &path, addr);
        let region = self.shared.region;
        let leaf_off = region.leaf_offset(addr)?;
        let leaf = Leaf::from_bytes_mut(&mut bytes).map_err(|_| KvError::Inconsistent {
            what: "leaf size",
            model: m as u64,
        })?;
        let result = match kind {
            Kind::Update(v) => match leaf.validate().ok().and_then(|l| l.get(key)) {
                None => None,
                Some(_) => leaf.upsert(key, v).ok().flatten(),
            },
            Kind::Delete => leaf.remove(key),
            Kind::Insert(v) => match leaf.upsert(key, v) {
                Ok(old) => old,
                Err(EditError::Full { .. }) => {
                    return self.split(key, v, m, view, j, lt_off, exp, addr, slot, bytes, &path);
                }
                Err(_) => {
                    self.unlock(&[], lt_off, locked, exp.raw())?;
                    return Err(KvError::Inconsistent {
                        what: "the owning leaf refused its key",
                        model: m as u64,
                    });
                }
            },
        };
        let changed = match kind {
            Kind::Insert(_) => true,
            Kind::Update(_) | Kind::Delete => result.is_some(),
        };
        if changed {
            leaf.seal();
            self.unlock(&[(leaf_off, &bytes)], lt_off, locked, exp.raw())?;
        } else {
            self.unlock(&[], lt_off, locked, exp.raw())?;
        }
        Ok(Locked::Done(result))
    }

    /// Splits the full owner `X` (at `addr`, SLT slot `slot`) while
    /// inserting `key` → `value`.
    #[allow(clippy::too_many_arguments)]
    fn split(
        &mut self,
        key: u64,
        value: u64,
        m: usize,
        view: &ModelView,
        j: u64,
        lt_off: u64,
        exp: LtEntry,
        addr: LeafAddr,
        slot: u8,
        xbytes: Vec<u8>,
        path: &[LeafAddr],
    ) -> Result<Locked, KvError> {
        let locked = exp.locked_by(self.shared.cfg.lock_owner).raw();
        let pool = self.shared.pool.clone();
        let region = self.shared.region;
        let slt0 = view.record.slt_slot_offset(0)?;
        let got = self
            .io
            .run(
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
            )
            .map(|v| (v[0], v[1]));
        let (leaf_no, fetched) = match got {
            Ok(x) => x,
            Err(e) => {
                self.unlock(&[], lt_off, locked, exp.raw())?;
                return Err(e);
            }
        };
        let Ok(new_slot) = SltHeader::claimed_slot(fetched) else {
            self.unlock(&[], lt_off, locked, exp.raw())?;
            return Ok(Locked::SltFull);
        };
        let Ok(b_addr) = region.claim(leaf_no) else {
            self.unlock(&[], lt_off, locked, exp.raw())?;
            return Err(KvError::LeafRegionFull {
                capacity: region.capacity(),
            });
        };
        // The chain's contents in order, with the new pair, cut in two.
        let x = Leaf::from_bytes(&xbytes).map_err(|_| KvError::Inconsistent {
            what: "leaf size",
            model: m as u64,
        })?;
        let (x_lo, x_hi, x_next) = (x.fence_lo(), x.fence_hi(), x.next());
        let mut entries: Vec<rolex_core::layout::Slot> = match x.validate() {
            Ok(v) => v.entries().to_vec(),
            Err(_) => Vec::new(),
        };
        let pos = entries.partition_point(|s| s.key() < key);
        entries.insert(pos, rolex_core::layout::Slot::new(key, value));
        let mid = entries.len() / 2;
        let mid_key = entries[mid].key();
        let inconsistent = |_| KvError::Inconsistent {
            what: "a split produced an invalid leaf",
            model: m as u64,
        };
        let b_link = LtEntry::for_leaf(b_addr).with_pointer(new_slot);
        // A' = X's first half, same version line, fence_hi shrunk.
        let mut a = xbytes.clone();
        let al = Leaf::from_bytes_mut(&mut a).map_err(|_| KvError::Inconsistent {
            what: "leaf size",
            model: m as u64,
        })?;
        al.init(x_lo, mid_key - 1).map_err(inconsistent)?;
        al.set_entries(&entries[..mid]).map_err(inconsistent)?;
        al.set_next(b_link).map_err(inconsistent)?;
        al.seal();
        // B = the second half, linked to X's old successor.
        let mut b = vec![0u8; self.leaf_size as usize];
        let bl = Leaf::from_bytes_mut(&mut b).map_err(|_| KvError::Inconsistent {
            what: "leaf size",
            model: m as u64,
        })?;
        bl.init(mid_key, x_hi).map_err(inconsistent)?;
        bl.set_entries(&entries[mid..]).map_err(inconsistent)?;
        bl.set_next(x_next).map_err(inconsistent)?;
        bl.seal();
        let b_slot_entry = LtEntry::for_leaf(b_addr).with_pointer(x_next.pointer());
        let b_slot_bytes = b_slot_entry.raw().to_le_bytes();
        let mut writes: Vec<(u64, &[u8])> = vec![
            (region.leaf_offset(b_addr)?, &b),
            (view.record.slt_slot_offset(new_slot)?, &b_slot_bytes),
        ];
        let x_slot_bytes;
        let unlock_to = if slot == 0 {
            exp.with_pointer(new_slot)
        } else {
            x_slot_bytes = LtEntry::for_leaf(addr)
                .with_pointer(new_slot)
                .raw()
                .to_le_bytes();
            writes.push((view.record.slt_slot_offset(slot)?, &x_slot_bytes));
            exp
        };
        // B is written before (ordered) or with (unordered, B validated by
        // readers) the A' that makes it reachable.
        writes.push((region.leaf_offset(addr)?, &a));
        self.unlock(&writes, lt_off, locked, unlock_to.raw())?;
        view.lt[j as usize].store(unlock_to.raw(), std::sync::atomic::Ordering::Relaxed);
        let mut synonyms: Vec<LeafAddr> = path.iter().skip(1).copied().collect();
        if !path.is_empty() {
            synonyms.push(addr);
        }
        synonyms.push(b_addr);
        view.learn(j, synonyms);
        self.counters
            .synonym_leaves
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if SltHeader::triggers_retraining(new_slot) {
            self.enqueue(m as u64)?;
        }
        Ok(Locked::Done(None))
    }

    /// Writes `writes` and releases the lock (`locked` → `to`): in one
    /// batch on an ordered fabric; on an unordered one, the unlock is posted
    /// after the writes completed and not awaited.
    fn unlock(
        &mut self,
        writes: &[(u64, &[u8])],
        lt_off: u64,
        locked: u64,
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
                remote: lt_off,
                expected: locked,
                new: to,
            });
            let got = *self
                .io
                .run(&pool, &ops, "writing and unlocking")?
                .last()
                .unwrap_or(&0);
            if got != locked {
                return Err(KvError::Inconsistent {
                    what: "a held lock changed under its holder",
                    model: 0,
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
            .submit_cas((&pool, lt_off), locked, to, OnValue::flag(&flag))
            .map_err(crate::error::transfer("posting an unlock"))?;
        self.pending = Some((flag, locked));
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
        self.counters
            .retrain_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
                let (bytes, next) = match self.chase(cursor, start, 0, &batch)? {
                    Chase::Owner { bytes, .. } => {
                        let next = Leaf::from_bytes(&bytes)
                            .map(|l| l.next())
                            .unwrap_or_default();
                        (bytes, next)
                    }
                    Chase::Stale => {
                        attempt += 1;
                        self.io.cur.retries += 1;
                        self.refresh(m)?;
                        self.backoff(attempt);
                        continue 'batch;
                    }
                };
                let leaf = Leaf::from_bytes(&bytes).map_err(|_| KvError::Inconsistent {
                    what: "leaf size",
                    model: m as u64,
                })?;
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

fn valid(bytes: &[u8]) -> bool {
    Leaf::from_bytes(bytes).is_ok_and(|l| l.validate().is_ok())
}

fn lookup(bytes: &[u8], key: u64) -> Option<u64> {
    Leaf::from_bytes(bytes)
        .ok()
        .and_then(|l| l.validate().ok())
        .and_then(|v| v.get(key))
}
