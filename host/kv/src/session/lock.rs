//! Chain locks: taking one ([`KvSession::lock_chain`]), the guard that
//! releases it ([`ChainLock`]) on every path, and what happens when a lock
//! or a release fails without saying whether it landed.
//!
//! Invariant: every lock this session takes is released exactly once —
//! confirmed, or handed to the client's record of locks it may still hold
//! (module `held`), which a later operation releases. A lock's word always
//! carries the client's configured owner. Every lock counts in its stripe
//! of its pool's table (one per pool in the process) from before its
//! `CAS` until its release is confirmed or recorded, so a retried release
//! never frees a lock another session of this process took with the same
//! word.

use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rolex_core::entry::LtEntry;
use rolex_core::layout::{Leaf, ModelRecord, ModelState};
use rolex_engine::callback::{CompletionFlag, OnValue};
use rolex_engine::TransferError;

use super::{ChainAt, KvSession, LeafReads};
use crate::cache::clock_ns;
use crate::client::ClientShared;
use crate::error::KvError;
use crate::held::{next_lock_seq, MaybeHeld, Repair, Stripe, WordId};
use crate::io::Op;

/// How long an operation that settles a posted unlock waits for it
/// before it records the lock as maybe held and fails.
const UNLOCK_WAIT: Duration = Duration::from_secs(30);

/// Posted unlocks a session keeps unsettled at most before an operation
/// waits for them all ([`KvSession::reap`]): a bound on what a session
/// that writes faster than its unlocks complete holds in its stripes.
const PENDING_MAX: usize = 64;

/// Bytes of a record's head a lock reads in its batch: the state word and
/// the model id.
pub(super) const IDENTITY_LEN: u64 = 16;

/// The words of one chain lock: the LT entry at `lt_off` of model `model`,
/// which the lock's `CAS` turned from `unlocked` into `locked`.
#[derive(Clone, Copy, Debug)]
pub(super) struct LockWord {
    model: u64,
    lt_off: u64,
    stripe: Stripe,
    unlocked: LtEntry,
    locked: u64,
    /// Its sequence number once it was seen taken (module `held`); 0
    /// before.
    seq: u64,
}

impl LockWord {
    /// This lock as maybe held, its release leaving `to` once `repair` is
    /// written.
    fn maybe_held(self, to: u64, repair: Option<Repair>) -> MaybeHeld {
        MaybeHeld {
            lt_off: self.lt_off,
            stripe: self.stripe,
            locked: self.locked,
            to,
            inflight: None,
            repair,
        }
    }
}

/// A chain this session holds locked. It is released exactly once,
/// through this guard:
/// - a write that changed its leaves: [`ChainLock::release`] with the
///   writes (one batch with the unlocking `CAS` on an ordered fabric; on
///   an unordered one the `CAS` is posted once the writes completed —
///   never a WRITE of the word, see [`KvSession::write_and_unlock`]);
/// - a split whose leaves are written: [`ChainLock::post_release`];
/// - the locks of a pipelined batch (module `pipeline`):
///   [`KvSession::plan_release_many`] then [`KvSession::released_many`],
///   each with its leaf write or unchanged, all in one batch (on an
///   unordered fabric the leaf writes in one batch, each unlock posted
///   once its write completed);
/// - a write that changed nothing, a split that found the SLT full:
///   [`ChainLock::release_unchanged`];
/// - every error after the lock — the unordered read of the chain, a chase
///   that does not end in the chain, a leaf that refuses its key, the
///   synonym claim, a full leaf region, a split that cannot be laid out or
///   whose writes failed: [`ChainLock::abort`], which releases it
///   unchanged and hands the error back;
/// - a split whose new leaf may be incomplete while the leaf linking to it
///   may have landed: [`ChainLock::keep`], which records it as maybe held
///   with the new leaf to write again before the release;
/// - none of those (a panic): `Drop` posts the unchanged release without
///   waiting and records the lock as maybe held until its completion is
///   seen.
///
/// A release whose `CAS` fails, or whose outcome is unknown, spends the
/// guard too: the lock goes to the client's record of locks it may hold
/// (see [`KvError::LockMaybeHeld`]), whose retry cannot free a later
/// holder's lock.
#[must_use = "a locked chain must be released"]
pub(super) struct ChainLock {
    word: LockWord,
    /// `Some` until a release was posted: what `Drop` posts through.
    shared: Option<Arc<ClientShared>>,
}

/// A lock planned into a batch and not yet posted or not yet looked at
/// ([`KvSession::plan_lock`]): its words (its stripe entered), where its
/// record check lands in the read buffer, and the clock before the batch.
/// Spent exactly once: by [`KvSession::lock_taken`] once its batch was
/// posted, or by [`PlannedLock::not_posted`].
pub(super) struct PlannedLock {
    word: LockWord,
    local: u64,
    posted: u64,
}

/// A leaf write a release posts before its unlock: the leaf's pool
/// offset and its bytes.
pub(super) type LeafWrite = (u64, Vec<u8>);

/// The release of a pipelined batch's locks, planned and not settled
/// yet ([`KvSession::plan_release_many`]): the guards are spent, so
/// [`KvSession::released_many`] must settle it, posted or not.
#[must_use = "planned releases are settled by `released_many`"]
pub(super) struct Releases {
    /// Each lock's words, and its leaf write if it has one (written
    /// again before a retried release should it fail).
    words: Vec<(LockWord, Option<LeafWrite>)>,
    /// The batch: each lock's leaf write (if any) then its unlock; `Err`
    /// when its writes could not be staged (nothing to post).
    pub(super) ops: Result<Vec<Op>, KvError>,
}

/// What a lock's batch said ([`KvSession::lock_reply`]).
pub(super) struct LockReply {
    /// The lock `CAS`'s outcome: the word it found.
    cas: Result<u64, TransferError>,
    /// The record's state word and model id, or the error of the batch's
    /// READs.
    record: Result<(u64, u64), KvError>,
}

impl LockReply {
    /// Whether the lock was taken on the live record of `at` (its chain's
    /// leaves may be edited): the `CAS` found the word `planned` expected,
    /// no READ failed and the record is still the view's. Exactly then
    /// [`KvSession::lock_taken`] returns the lock.
    pub(super) fn landed(&self, planned: &PlannedLock, at: &ChainAt) -> bool {
        let live = self
            .record
            .as_ref()
            .is_ok_and(|&(state, id)| at.view.is_current(ModelState::from_raw(state), id));
        live && self
            .cas
            .as_ref()
            .is_ok_and(|&old| old == planned.word.unlocked.raw())
    }
}

impl PlannedLock {
    /// Gives up a lock whose batch was not posted: its stripe is left.
    pub(super) fn not_posted(self) {
        self.word.stripe.leave();
    }
}

/// An unlock posted and not awaited.
pub(crate) struct PendingUnlock {
    flag: Arc<CompletionFlag>,
    word: LockWord,
    /// The word the unlock leaves.
    to: u64,
}

/// A session's posted unlocks, oldest first. Each is settled exactly
/// once, by whoever takes it out: its session, or another session of the
/// client whose lock met its chain after it failed
/// ([`KvSession::settle_failed_unlocks_of`]).
pub(crate) type PostedUnlocks = Mutex<Vec<PendingUnlock>>;

impl PendingUnlock {
    /// Whether it completed with an error (looking drives the engine's
    /// completions once while it has not completed).
    pub(crate) fn failed(&self) -> bool {
        matches!(self.flag.result(), Some(Err(_)))
    }

    /// This unlock as maybe held until its completion is seen (it still
    /// counts in its stripe).
    fn in_flight(self) -> MaybeHeld {
        MaybeHeld {
            inflight: Some(self.flag),
            ..self.word.maybe_held(self.to, None)
        }
    }
}

/// Whether writes went out and landed.
enum Written {
    /// Every one completed.
    All,
    /// None was posted.
    Not(KvError),
    /// One failed: any of them may have landed.
    Maybe(KvError),
}

impl KvSession {
    /// Locks the chain `at` (module docs, "Writes"): CAS its LT entry from
    /// the cached word to the same word locked by this client, reading the
    /// record's state word in the same batch, and the chain's leaves — in
    /// that batch on an ordered fabric (the READs run after the CAS), in a
    /// second round trip once the lock is held on an unordered one. Returns
    /// the lock and where each leaf landed in the read buffer; `None` when
    /// the CAS failed (stale cached word, retired or frozen model, another
    /// writer, or a retried release of this process holding the chain's
    /// stripe): the cache was corrected or the session backed off, and the
    /// caller retries. A lock `CAS` that failed without saying whether it
    /// landed is recorded as maybe held (and the error says so).
    ///
    /// `block`, if `Some`, is the WRITE of the operation's value block: it
    /// rides in the lock's batch (no round trip of its own; nothing names
    /// the block yet, so it may land whether or not the lock does) and is
    /// taken out of `block` once it completed.
    pub(super) fn lock_chain(
        &mut self,
        at: &ChainAt,
        attempt: u64,
        block: &mut Option<Op>,
    ) -> Result<Option<(ChainLock, LeafReads)>, KvError> {
        let mut ops = Vec::new();
        let Some(planned) = self.plan_lock(at, attempt, 0, &mut ops)? else {
            return Ok(None);
        };
        if !self.shared.ordered {
            return self.lock_chain_unordered(at, attempt, block, planned, ops);
        }
        let batch = match self.plan_reads(IDENTITY_LEN, &mut ops) {
            Ok(batch) => batch,
            Err(e) => {
                planned.not_posted();
                return Err(e);
            }
        };
        let value_write = block.is_some().then_some(ops.len());
        ops.extend(block.iter().copied());
        let reply = match self.io.run_each(&self.shared.pool, &ops, "locking a chain") {
            Ok(r) => {
                if value_write.is_some_and(|i| r[i].is_ok()) {
                    *block = None;
                }
                let r = r.to_vec();
                self.lock_reply(&planned, &r)
            }
            Err(e) => {
                planned.not_posted();
                return Err(e);
            }
        };
        let Some(lock) = self.lock_taken(at, planned, attempt, reply)? else {
            return Ok(None);
        };
        Ok(Some((lock, batch)))
    }

    /// [`Self::lock_chain`] on an unordered fabric, where a READ in the
    /// `CAS`'s batch may run before it: the `CAS` goes alone (with the
    /// value block's WRITE), and once it took the lock the record's READ
    /// (`ops[1]`, as [`Self::plan_lock`] pushed it) and the chain's READs
    /// go together — consecutive READs of the pool, which a provider that
    /// chains reads sends as one request (`tcp`: one message each way
    /// fewer per write than the record's READ beside the `CAS`), the
    /// record then checked while the lock is held. A `CAS` that met
    /// another lock reads the record alone (a retired record's entries
    /// stay locked: the view is then refreshed, not waited on); one that
    /// failed otherwise needs no record. Same round trips as before for a
    /// lock taken: the `CAS`, the reads, then the write.
    fn lock_chain_unordered(
        &mut self,
        at: &ChainAt,
        attempt: u64,
        block: &mut Option<Op>,
        planned: PlannedLock,
        mut ops: Vec<Op>,
    ) -> Result<Option<(ChainLock, LeafReads)>, KvError> {
        let Some(record_op) = ops.pop().filter(|_| ops.len() == 1) else {
            let model = planned.word.model;
            planned.not_posted();
            return Err(KvError::Inconsistent {
                what: "a lock was planned without its record's READ",
                model,
            });
        };
        let value_write = block.is_some().then_some(ops.len());
        ops.extend(block.iter().copied());
        // The value block's WRITE counts as one of the lock's READs did
        // beside the `CAS`: a failed one fails the lock (released), so no
        // leaf is written naming a block that may not have landed.
        let (cas, block_err) = match self.io.run_each(&self.shared.pool, &ops, "locking a chain") {
            Ok(r) => {
                let block_err = value_write.and_then(|i| r[i].clone().err());
                if value_write.is_some() && block_err.is_none() {
                    *block = None;
                }
                (r[0].clone(), block_err)
            }
            Err(e) => {
                planned.not_posted();
                return Err(e);
            }
        };
        let unlocked = planned.word.unlocked.raw();
        let first = LockReply {
            cas: cas.clone(),
            record: Err(KvError::Inconsistent {
                what: "a lock's record was not read",
                model: planned.word.model,
            }),
        };
        let mut batch = Vec::new();
        let mut chain_err = None;
        let locked = |old: u64| old == unlocked || LtEntry::from_raw(old).is_locked();
        let reply = match (cas, block_err) {
            (Ok(old), Some(error)) if locked(old) => self.lock_reply_after(
                &planned,
                first,
                Err(KvError::Transfer {
                    during: "locking a chain",
                    error,
                }),
            ),
            (Ok(old), None) if old == unlocked => {
                let mut reads = vec![record_op];
                let landed = match self.plan_reads(IDENTITY_LEN, &mut reads) {
                    Ok(b) => {
                        batch = b;
                        self.io
                            .run_each(&self.shared.pool, &reads, "reading a locked chain")
                            .map(<[_]>::to_vec)
                    }
                    Err(e) => Err(e),
                };
                match landed {
                    Ok(r) => {
                        chain_err = super::first_error(&r[1..]).map(|error| KvError::Transfer {
                            during: "reading a locked chain",
                            error,
                        });
                        self.lock_reply_after(&planned, first, Ok(&r[..1]))
                    }
                    Err(e) => self.lock_reply_after(&planned, first, Err(e)),
                }
            }
            (Ok(old), None) if LtEntry::from_raw(old).is_locked() => {
                let landed = self
                    .io
                    .run_each(&self.shared.pool, &[record_op], "locking a chain")
                    .map(<[_]>::to_vec);
                match landed {
                    Ok(r) => self.lock_reply_after(&planned, first, Ok(&r)),
                    Err(e) => self.lock_reply_after(&planned, first, Err(e)),
                }
            }
            _ => first,
        };
        let Some(lock) = self.lock_taken(at, planned, attempt, reply)? else {
            return Ok(None);
        };
        match chain_err {
            None => Ok(Some((lock, batch))),
            Some(e) => Err(lock.abort(self, e)),
        }
    }

    /// The lock of chain `at` as a doorbell batch posts it: its `CAS` and
    /// the READ of the record's state word and model id (landing at
    /// `local` of the read buffer, 16 bytes) pushed onto `ops`, which the
    /// caller may extend (on an ordered fabric, READs pushed later run
    /// after the `CAS`). The chain's stripe is entered: from here on the
    /// caller posts the batch and hands its outcome to
    /// [`Self::lock_taken`], or calls `leave` on the stripe if nothing was
    /// posted. `None` (nothing pushed, nothing entered) when the lock
    /// cannot be tried now: the view was not seen live lately (it was
    /// refreshed), or a retried release of this process holds the stripe
    /// (the session backed off).
    pub(super) fn plan_lock(
        &mut self,
        at: &ChainAt,
        attempt: u64,
        local: u64,
        ops: &mut Vec<Op>,
    ) -> Result<Option<PlannedLock>, KvError> {
        let owner = self.shared.cfg.lock_owner;
        let posted = clock_ns();
        if at.view.age_ns(posted) > self.max_age_ns() {
            // Its space may be reused by the time the CAS lands: check the
            // record before locking through it.
            self.io.cur.retries += 1;
            self.refresh(at.m)?;
            return Ok(None);
        }
        let j = at.j as usize;
        let lt_off = at.view.record.lt_entry_offset(at.j)?;
        // An unlock of ours still posted on this chain lands first (the
        // cached word is what it leaves).
        self.settle_chain(lt_off)?;
        let exp = LtEntry::from_raw(at.view.lt[j].load(Relaxed));
        let locked = exp.locked_by(owner).raw();
        let word = LockWord {
            model: at.m as u64,
            lt_off,
            stripe: self.shared.stripes.stripe(lt_off),
            unlocked: exp,
            locked,
            seq: 0,
        };
        if !word.stripe.enter() {
            // A retried release of this process holds the stripe.
            self.io.cur.retries += 1;
            self.counters.stripe_waits.fetch_add(1, Relaxed);
            self.backoff(attempt);
            return Ok(None);
        }
        ops.push(Op::Cas {
            remote: lt_off,
            expected: exp.raw(),
            new: locked,
        });
        ops.push(Op::Read {
            remote: at.view.offset + ModelRecord::STATE_OFFSET,
            local,
            len: IDENTITY_LEN,
        });
        Ok(Some(PlannedLock {
            word,
            local,
            posted,
        }))
    }

    /// What the batch of `planned` said, from `results`: its ops'
    /// outcomes from the lock's `CAS` on (every later op of the batch
    /// counts as one of its READs), and the record's words it read.
    /// Taken out of the read buffer at once, before anything else uses it.
    pub(super) fn lock_reply(
        &self,
        planned: &PlannedLock,
        results: &[Result<u64, TransferError>],
    ) -> LockReply {
        let Some((cas, reads)) = results.split_first() else {
            return LockReply {
                cas: Ok(!planned.word.unlocked.raw()),
                record: Err(KvError::Inconsistent {
                    what: "a lock's batch returned no outcome",
                    model: planned.word.model,
                }),
            };
        };
        LockReply {
            cas: cas.clone(),
            record: self.record_read(planned, Ok(reads)),
        }
    }

    /// A lock's reply with its record read again after its `CAS` landed
    /// (`first`: its batch's reply, whose `CAS` is kept): on an unordered
    /// fabric a pipelined write posts its record's and chain's READs once
    /// its `CAS` completed, the record's READ landing where the lock's
    /// batch put it. `reads`: their outcomes, from the record's READ on
    /// (every later op counts as one of its READs), or why they were not
    /// posted.
    pub(super) fn lock_reply_after(
        &self,
        planned: &PlannedLock,
        first: LockReply,
        reads: Result<&[Result<u64, TransferError>], KvError>,
    ) -> LockReply {
        LockReply {
            cas: first.cas,
            record: self.record_read(planned, reads),
        }
    }

    /// The record's state word and model id as the READs of `planned`'s
    /// batch (`reads`: their outcomes) left them in the read buffer.
    fn record_read(
        &self,
        planned: &PlannedLock,
        reads: Result<&[Result<u64, TransferError>], KvError>,
    ) -> Result<(u64, u64), KvError> {
        let during = "locking a chain";
        match super::first_error(reads?) {
            Some(error) => Err(KvError::Transfer { during, error }),
            None => self.io.local_u64(planned.local).and_then(|state| {
                Ok((state, self.io.local_u64(planned.local + IDENTITY_LEN / 2)?))
            }),
        }
    }

    /// What the batch of a lock [`Self::plan_lock`] planned said
    /// ([`Self::lock_reply`]). Returns the held lock; `None` when it was
    /// not taken — a stale cached word (corrected), a retired or reused
    /// record (the lock, if it landed, released unchanged; the model
    /// refreshed), a frozen chain or another writer (backed off): the
    /// caller retries. A `CAS` that failed without saying whether it
    /// landed is recorded as maybe held (and the error says so); a READ
    /// that failed under a taken lock releases it ([`ChainLock::abort`]).
    pub(super) fn lock_taken(
        &mut self,
        at: &ChainAt,
        planned: PlannedLock,
        attempt: u64,
        reply: LockReply,
    ) -> Result<Option<ChainLock>, KvError> {
        let PlannedLock { word, posted, .. } = planned;
        let LockReply { cas, record } = reply;
        let exp = word.unlocked;
        let j = at.j as usize;
        let during = "locking a chain";
        let old = match cas {
            Ok(old) => old,
            Err(error) => {
                // The lock may have landed.
                let failed = KvError::Transfer { during, error };
                return Err(
                    match self.lost_release(word, exp.raw(), failed.clone(), Vec::new()) {
                        Ok(()) => failed,
                        Err(e) => e,
                    },
                );
            }
        };
        // The record's state and model id, read in the batch: still this
        // view's record, live (a reused record names another model or
        // generation)?
        let current = record
            .as_ref()
            .ok()
            .map(|&(state, id)| at.view.is_current(ModelState::from_raw(state), id));
        if current == Some(false) {
            self.io.cur.retries += 1;
            if old == exp.raw() {
                ChainLock {
                    word,
                    shared: Some(self.shared.clone()),
                }
                .release_unchanged(self)?;
                // Its unlock lands before this operation locks again.
                self.settle()?;
            } else {
                word.stripe.leave();
            }
            self.refresh(at.m)?;
            return Ok(None);
        }
        if current == Some(true) {
            at.view.seen_live(posted);
        }
        if old != exp.raw() {
            word.stripe.leave();
            self.io.cur.retries += 1;
            let o = LtEntry::from_raw(old);
            if !o.is_locked() {
                // Our cached word was stale (a new synonym pointer).
                at.view.lt[j].store(old, Relaxed);
                return Ok(None);
            }
            if let Err(e) = record {
                return Err(e);
            }
            // Live (checked above): frozen, or another writer holds it.
            if o.owner() == self.shared.cfg.lock_owner {
                // Maybe a lock of ours whose release is to be retried: an
                // unlock another session posted that failed, or one
                // recorded.
                self.settle_failed_unlocks_of(word.lt_off);
                self.resolve_held();
            }
            // This session's own unlocks that completed since the
            // operation began (`reap` stops at the first in flight): one
            // that failed is released again now, as a writer of another
            // process may be waiting for its chain while this one waits
            // for that writer's. Its error is this operation's, which did
            // not run.
            self.settle_where(|p| p.flag.is_done())?;
            self.backoff(attempt);
            return Ok(None);
        }
        let lock = ChainLock {
            word: LockWord {
                seq: next_lock_seq(),
                ..word
            },
            shared: Some(self.shared.clone()),
        };
        if let Err(e) = record {
            return Err(lock.abort(self, e));
        }
        Ok(Some(lock))
    }

    /// Waits for this session's posted unlocks, if any. An unlock that
    /// failed is retried at once (see [`Self::lost_release`]); one still
    /// unconfirmed after [`UNLOCK_WAIT`] is recorded as maybe held. An
    /// error goes to the operation that settles, before it ran: it did not
    /// take effect (the one whose unlock it was had already returned).
    /// Every unlock is settled; the first error is returned. (An unlock
    /// that failed may have been settled by another session already:
    /// [`Self::settle_failed_unlocks_of`]; then its error is not seen
    /// here.)
    pub(super) fn settle(&mut self) -> Result<(), KvError> {
        self.settle_where(|_| true)
    }

    /// What an operation does with this session's posted unlocks before it
    /// starts: settles (as [`Self::settle`]) those that completed, without
    /// waiting for the others — they wait until an operation locks their
    /// chain ([`Self::plan_lock`] settles the chain's first), or the
    /// session flushes or drops. Waiting for them all would cost each
    /// operation after a write on an unordered fabric about one round
    /// trip, for nothing: the unlock is posted once the write's leaf
    /// landed, so a read sees the write without it, and another writer
    /// of the chain waits at the lock word itself. Past
    /// [`PENDING_MAX`] unlocks, waits for them all.
    pub(super) fn reap(&mut self) -> Result<(), KvError> {
        if self.posted_here > PENDING_MAX {
            return self.settle();
        }
        // Oldest first, up to the first not complete: each look at one
        // that is not drives the engine's completions once, which is
        // enough per operation (those behind it wait for the next).
        let mut behind = false;
        self.settle_where(|p| {
            behind = behind || !p.flag.is_done();
            !behind
        })
    }

    /// [`Self::settle`] of the posted unlocks of the LT entry at `lt_off`.
    fn settle_chain(&mut self, lt_off: u64) -> Result<(), KvError> {
        self.settle_where(|p| p.word.lt_off == lt_off)
    }

    /// [`Self::settle`] of the posted unlocks `pick` selects (called with
    /// each one, oldest first); the others stay posted, in order.
    fn settle_where(
        &mut self,
        mut pick: impl FnMut(&PendingUnlock) -> bool,
    ) -> Result<(), KvError> {
        if self.posted_here == 0 {
            // The operations' path when nothing was posted: no lock taken.
            return Ok(());
        }
        let taken = std::mem::take(&mut *self.posted());
        let mut out = Ok(());
        let mut kept = Vec::new();
        for p in taken {
            if !pick(&p) {
                kept.push(p);
                continue;
            }
            let r = self.settle_one(p);
            if out.is_ok() {
                out = r;
            }
        }
        // A retried release may have posted again meanwhile: after those
        // kept.
        self.posted_here = {
            let mut posted = self.posted();
            kept.append(&mut posted);
            *posted = kept;
            posted.len()
        };
        out
    }

    /// This session's posted unlocks.
    fn posted(&self) -> MutexGuard<'_, Vec<PendingUnlock>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Settles the unlocks of the LT entry at `lt_off` that other sessions
    /// of this client posted and that failed (their chain stays locked
    /// until they are settled, and their session may not run again for a
    /// while): each is released again at once, or recorded as maybe held
    /// (see [`Self::lost_release`]). Their errors go nowhere: the client's
    /// record counts a lock still held
    /// ([`crate::KvClient::locks_maybe_held`]).
    fn settle_failed_unlocks_of(&mut self, lt_off: u64) {
        self.settle_failed_unlocks_where(|p| p.word.lt_off == lt_off);
    }

    /// [`Self::settle_failed_unlocks_of`] for the failed unlocks `pick`
    /// selects.
    fn settle_failed_unlocks_where(&mut self, pick: impl Fn(&PendingUnlock) -> bool) {
        for list in self.shared.posted.others(&self.pending) {
            let failed: Vec<PendingUnlock> = {
                let mut posted = list.lock().unwrap_or_else(|e| e.into_inner());
                let (failed, kept) = std::mem::take(&mut *posted)
                    .into_iter()
                    .partition(|p| pick(p) && p.failed());
                *posted = kept;
                failed
            };
            for p in failed {
                let _ = self.settle_one(p);
            }
        }
    }

    /// The client's reaper's look through this session of its own (module
    /// `reaper`): settles every failed unlock the client's sessions
    /// posted, then tries again every lock the client records as maybe
    /// held. Returns whether one is still recorded.
    pub(crate) fn reap_for_client(&mut self) -> bool {
        self.settle_failed_unlocks_where(|_| true);
        self.resolve_held();
        self.shared.held.count() > 0
    }

    /// Whether its client records a lock maybe held that its reaper can
    /// still release (module `reaper`).
    pub(crate) fn worth_lingering(&self) -> bool {
        crate::reaper::worth_lingering(&self.shared)
    }

    /// Whether this session is the last handle on its client.
    pub(crate) fn last_handle(&self) -> bool {
        self.counted && self.shared.handles.load(Acquire) == 1
    }

    /// [`Self::settle`] of one posted unlock.
    fn settle_one(&mut self, p: PendingUnlock) -> Result<(), KvError> {
        let w = p.word;
        match p.flag.wait(UNLOCK_WAIT) {
            Some(Ok(v)) if v == w.locked => {
                w.stripe.leave();
                Ok(())
            }
            Some(Ok(_)) => {
                w.stripe.leave();
                Err(KvError::Inconsistent {
                    what: "a posted unlock found its entry changed",
                    model: w.model,
                })
            }
            Some(Err(error)) => {
                let failed = KvError::Transfer {
                    during: "unlocking a chain",
                    error,
                };
                self.lost_release(w, p.to, failed, Vec::new())
            }
            None => {
                self.shared.held.record(p.in_flight());
                Err(KvError::LockMaybeHeld {
                    model: w.model,
                    release: Box::new(KvError::Timeout {
                        during: "unlocking a chain",
                        waited: UNLOCK_WAIT,
                    }),
                    after: None,
                })
            }
        }
    }

    /// Releases `w` with nothing written, leaving `to`: one awaited `CAS`
    /// on an ordered fabric, a posted one on an unordered fabric.
    fn unlock(&mut self, w: LockWord, to: u64) -> Result<(), KvError> {
        if !self.shared.ordered {
            return self.post_unlock(w, to);
        }
        let cas = Op::Cas {
            remote: w.lt_off,
            expected: w.locked,
            new: to,
        };
        let got = match self
            .io
            .run_each(&self.shared.pool, &[cas], "unlocking a chain")
        {
            Ok(r) => r[0].clone(),
            Err(e) => return self.lost_release(w, to, e, Vec::new()),
        };
        self.unlocked(w, to, got, None, &[])
    }

    /// What an awaited unlocking `CAS` of `w` (meant to leave `to`) that
    /// returned `got` means, after writes that failed with `write_err` (if
    /// any; then the operation may have taken effect). `rewrite`: those
    /// writes (pool offset, bytes), written again before a retried
    /// release when the `CAS` failed too: a write torn by a broken link
    /// fails everything posted after it on that link, the `CAS` included,
    /// and must not be left under a released lock (see
    /// [`Self::release_exclusively`]); `Ok` when that retry wrote them
    /// and released the lock at once (the operation took effect). A `CAS`
    /// that completed tells the link carried it, so the writes before it
    /// were placed whole, or not at all where the target refused them.
    fn unlocked(
        &mut self,
        w: LockWord,
        to: u64,
        got: Result<u64, TransferError>,
        write_err: Option<KvError>,
        rewrite: &[(u64, &[u8])],
    ) -> Result<(), KvError> {
        let wrote = |r: Result<(), KvError>| match &write_err {
            None => r,
            Some(e) => Err(after_writes(e, r.err().unwrap_or_else(|| e.clone()))),
        };
        match got {
            Ok(v) if v == w.locked => {
                w.stripe.leave();
                wrote(Ok(()))
            }
            Ok(_) => {
                w.stripe.leave();
                wrote(Err(KvError::Inconsistent {
                    what: "a held lock changed under its holder",
                    model: w.model,
                }))
            }
            Err(error) => {
                let failed = KvError::Transfer {
                    during: "unlocking a chain",
                    error,
                };
                match &write_err {
                    // After writes that failed, kept for repair; but this
                    // `CAS` may have landed: unsure (module `held`).
                    // Written again whole and released at once: the
                    // operation took effect.
                    Some(e) if !rewrite.is_empty() => {
                        match self.lost_release_kept(w, to, failed, owned(rewrite), true) {
                            Ok(Settle::Released) => Ok(()),
                            Ok(_) => Err(e.clone().indeterminate()),
                            Err(released) => Err(after_writes(e, released)),
                        }
                    }
                    _ => wrote(self.lost_release(w, to, failed, Vec::new())),
                }
            }
        }
    }

    /// Posts the `CAS` releasing `w` to `to` and does not wait for it: a
    /// later operation of this session (or its `Drop`) settles it
    /// ([`Self::reap`], [`Self::settle`]).
    fn post_unlock(&mut self, w: LockWord, to: u64) -> Result<(), KvError> {
        if let Err(expired) = self.io.check_lease() {
            // Not posted: the lock stays held until the lease ends there.
            return self.lost_release(w, to, expired, Vec::new());
        }
        let flag = CompletionFlag::new();
        self.io.cur.posted += 1;
        self.io.cur.atomics += 1;
        match self.shared.engine.submit_cas(
            (&self.shared.pool, w.lt_off),
            w.locked,
            to,
            OnValue::flag(&flag),
        ) {
            Ok(()) => {
                // Settled once complete, and before this session locks
                // this chain again (`reap`, `plan_lock`).
                self.posted().push(PendingUnlock { flag, word: w, to });
                self.posted_here += 1;
                crate::reaper::Posted::posted(&self.shared);
                Ok(())
            }
            Err(error) => {
                // Not posted: the lock is still held.
                let failed = KvError::Transfer {
                    during: "posting an unlock",
                    error,
                };
                self.lost_release(w, to, failed, Vec::new())
            }
        }
    }

    /// Writes `writes` and releases `w` (locked word → `to`): in one batch
    /// on an ordered fabric (the unlocking `CAS` behind the writes); on an
    /// unordered one the unlock is posted after the writes completed and
    /// not awaited. If a write fails, it
    /// may have landed in part (a link that broke in the middle of it), so
    /// the lock is kept until `writes` are written again whole, then
    /// released to `to` ([`Self::lost_release`]): at once if that works
    /// (`Ok`: the operation took effect), else by a later operation of the
    /// client (an indeterminate error: the operation takes effect once the
    /// writes land; [`KvError::LockMaybeHeld`] if the lock is still held).
    /// Nothing posted (staging failed, the lease lapsed): the word is
    /// released unchanged.
    ///
    /// A release is always a `CAS`, never a WRITE of the word it leaves,
    /// even where the fabric keeps one peer's writes in order (`tcp`) and
    /// a WRITE behind the leaf would land after it for one message less:
    /// a target may place an 8-byte WRITE's payload by storing the word
    /// twice. glibc's `memmove` of 8 to 16 bytes stores the first and the
    /// last 8 bytes, the same word when there are 8 (of 245,489 locks
    /// taken by `CAS` on a word an 8-byte `memmove` released again and
    /// again, 2 were undone, on the 2-core VM this was found on); the
    /// loopback NIC copies so, as a software provider that copies a
    /// payload it received with `memcpy` would. A `CAS` that takes the
    /// lock between the two stores — another writer's, or the agent's
    /// freeze — is undone by the second, and its holder writes a chain
    /// nobody holds for it: the lost writes of `kv_pipeline`'s histories
    /// on tcp's order (about 1 run in 1,000 with a short freeze
    /// deadline). An atomic is one operation at the target, whatever the
    /// provider: a lock word is only ever changed by atomics.
    fn write_and_unlock(
        &mut self,
        w: LockWord,
        writes: &[(u64, &[u8])],
        to: u64,
    ) -> Result<(), KvError> {
        let mut ops = match self.io.stage_writes(writes) {
            Ok(ops) => ops,
            Err(e) => return Err(self.unlock_after(w, e)),
        };
        if !self.shared.ordered {
            return match self.write(&ops, "writing a locked chain") {
                Written::All => self.post_unlock(w, to).map_err(KvError::indeterminate),
                Written::Not(e) => Err(self.unlock_after(w, e)),
                Written::Maybe(e) => self.release_after_failed_writes(w, to, e, owned(writes)),
            };
        }
        let during = "writing and unlocking";
        ops.push(Op::Cas {
            remote: w.lt_off,
            expected: w.locked,
            new: to,
        });
        let (write_err, got) = match self.io.run_each(&self.shared.pool, &ops, during) {
            Ok(r) => {
                let (last, data) = r.split_last().unwrap_or((&Ok(0), &[]));
                let write_err =
                    super::first_error(data).map(|error| KvError::Transfer { during, error });
                (write_err, last.clone())
            }
            // Nothing posted, nothing written: release it unchanged.
            Err(e) => return Err(self.unlock_after(w, e)),
        };
        // The writes landed (or may have, with an error): whatever the
        // unlock's fate, the operation may have taken effect.
        let r = self.unlocked(w, to, got, write_err.clone(), writes);
        match (write_err, r) {
            (None, Err(e)) => Err(e.indeterminate()),
            (_, r) => r,
        }
    }

    /// Plans the release of a pipelined batch's locks together: one
    /// doorbell batch with, for each lock in order, its leaf WRITE if it
    /// has one (pool offset, bytes, staged in the write buffer here), then
    /// — on an ordered fabric — its unlocking `CAS` back to the word it
    /// held before the lock (the fabric applies them in posting order, so
    /// each unlock lands after its own data). On an unordered fabric the
    /// batch is the leaf WRITEs alone: each unlock is posted by
    /// [`Self::released_many`] once its WRITE completed (a `CAS`, never a
    /// WRITE of the word: [`Self::write_and_unlock`] says why). The guards
    /// are spent: from here on [`Self::released_many`] settles every lock,
    /// whether the batch was posted or not (the caller posts
    /// [`Releases::ops`], then hands it the outcome).
    pub(super) fn plan_release_many(
        &mut self,
        locks: Vec<(ChainLock, Option<LeafWrite>)>,
    ) -> Releases {
        let ordered = self.shared.ordered;
        let writes: Vec<(u64, &[u8])> = locks
            .iter()
            .filter_map(|(_, write)| write.as_ref().map(|(off, b)| (*off, b.as_slice())))
            .collect();
        let staged = self.io.stage_writes(&writes);
        drop(writes);
        let words: Vec<(LockWord, Option<LeafWrite>)> = locks
            .into_iter()
            .map(|(lock, write)| (lock.spend(), write))
            .collect();
        let ops = staged.map(|data| {
            if !ordered {
                return data;
            }
            let mut ops = Vec::with_capacity(data.len() + words.len());
            let mut data = data.into_iter();
            for (w, write) in &words {
                if write.is_some() {
                    ops.extend(data.next());
                }
                ops.push(Op::Cas {
                    remote: w.lt_off,
                    expected: w.locked,
                    new: w.unlocked.raw(),
                });
            }
            ops
        });
        Releases { words, ops }
    }

    /// Settles the locks of `releases` ([`Self::plan_release_many`])
    /// from its batch's outcome (`Err`: not posted). Returns each lock's
    /// outcome, as [`ChainLock::release`] (with a write) or
    /// [`ChainLock::release_unchanged`] (without) would report it: an
    /// error of a lock whose write was posted is indeterminate; a batch
    /// that could not be staged or posted releases each lock unchanged
    /// ([`Self::unlock_after`]: nothing was written). On an unordered
    /// fabric (where the batch had no unlocks) each unlock is posted here
    /// and not awaited, as
    /// [`ChainLock::release`] and [`ChainLock::release_unchanged`] post
    /// theirs: after its leaf write completed, or unchanged (a lock
    /// without a write, or whose write failed: then the error is
    /// indeterminate).
    pub(super) fn released_many(
        &mut self,
        releases: Releases,
        posted: Result<&[Result<u64, TransferError>], KvError>,
    ) -> Vec<Result<(), KvError>> {
        let during = "writing and unlocking";
        let Releases { words, ops } = releases;
        let results = match ops.and(posted) {
            Ok(r) => r,
            // Nothing posted, nothing written: release each unchanged.
            Err(e) => {
                return words
                    .into_iter()
                    .map(|(w, _)| Err(self.unlock_after(w, e.clone())))
                    .collect()
            }
        };
        let mut results = results.iter().cloned();
        let mut out = Vec::with_capacity(words.len());
        for (w, write) in words {
            let wrote = write.is_some();
            let write_err = if wrote {
                results
                    .next()
                    .and_then(Result::err)
                    .map(|error| KvError::Transfer { during, error })
            } else {
                None
            };
            let to = w.unlocked.raw();
            if !self.shared.ordered {
                out.push(match (write_err, write) {
                    (Some(e), Some(write)) => {
                        self.release_after_failed_writes(w, to, e, vec![write])
                    }
                    (_, Some(_)) => self.post_unlock(w, to).map_err(KvError::indeterminate),
                    (_, None) => self.post_unlock(w, to),
                });
                continue;
            }
            let got = results.next().unwrap_or(Ok(w.locked));
            let rewrite = write.as_ref().map(|(off, b)| (*off, b.as_slice()));
            let r = self.unlocked(w, to, got, write_err.clone(), rewrite.as_slice());
            out.push(match (wrote, write_err, r) {
                // The write landed: whatever the unlock's fate, the
                // operation may have taken effect.
                (true, None, Err(e)) => Err(e.indeterminate()),
                (_, _, r) => r,
            });
        }
        out
    }

    /// Posts `ops` (staged writes) as one batch and waits.
    fn write(&mut self, ops: &[Op], during: &'static str) -> Written {
        match self.io.run_each(&self.shared.pool, ops, during) {
            Ok(r) => match super::first_error(r) {
                None => Written::All,
                Some(error) => Written::Maybe(KvError::Transfer { during, error }),
            },
            Err(e) => Written::Not(e),
        }
    }

    /// Releases `w` to `to` after its `rewrite` writes failed with `error`
    /// (they may have landed in part): once they are written again whole,
    /// at once or by a later operation ([`Self::lost_release`]). `Ok` when
    /// that happened at once — the writes are whole and this release
    /// landed: the operation took effect; else the operation's error,
    /// indeterminate (it takes effect once the writes land): `error`, or
    /// the lock maybe held after it.
    fn release_after_failed_writes(
        &mut self,
        w: LockWord,
        to: u64,
        error: KvError,
        rewrite: Vec<(u64, Vec<u8>)>,
    ) -> Result<(), KvError> {
        match self.lost_release_kept(w, to, error.clone(), rewrite, false) {
            Ok(Settle::Released) => Ok(()),
            Ok(_) => Err(error.indeterminate()),
            Err(released) => Err(after_writes(&error, released)),
        }
    }

    /// Releases `w` unchanged after `error` and returns `error` — or, if
    /// the release failed too, [`KvError::LockMaybeHeld`] carrying both,
    /// or the release's own error (a changed lock word: the more urgent
    /// news), indeterminate if `error` was.
    fn unlock_after(&mut self, w: LockWord, error: KvError) -> KvError {
        match self.unlock(w, w.unlocked.raw()) {
            Ok(()) => error,
            Err(KvError::LockMaybeHeld {
                model,
                release,
                after: None,
            }) => KvError::LockMaybeHeld {
                model,
                release,
                after: Some(Box::new(error)),
            },
            Err(other) if error.may_have_applied() => other.indeterminate(),
            Err(other) => other,
        }
    }

    /// The release of `w` (to `to`, after the `repair` writes) failed with
    /// `error` without saying whether its `CAS` landed, or the lock `CAS`
    /// did: stop counting it as a live lock (if it is kept for `repair`,
    /// it stays pinned in its stripe until settled, see module `held`), retry
    /// the release once at once, and record it as maybe held if that does
    /// not settle it.
    /// `Ok` if the retry settled it; else [`KvError::LockMaybeHeld`].
    pub(super) fn lost_release(
        &mut self,
        w: LockWord,
        to: u64,
        error: KvError,
        repair: Vec<(u64, Vec<u8>)>,
    ) -> Result<(), KvError> {
        self.lost_release_kept(w, to, error, repair, false)
            .map(drop)
    }

    /// [`Self::lost_release`], the lock kept for `repair` marked `unsure`
    /// if a release of it may have landed (module `held`), saying how the
    /// retry settled it.
    fn lost_release_kept(
        &mut self,
        w: LockWord,
        to: u64,
        error: KvError,
        repair: Vec<(u64, Vec<u8>)>,
        unsure: bool,
    ) -> Result<Settle, KvError> {
        // A lock kept for repair is listed, then stays pinned in its
        // stripe until its release is settled (module `held`).
        let repair = if repair.is_empty() {
            w.stripe.leave();
            None
        } else {
            let word = WordId::of(&self.shared.pool, w.lt_off);
            let listed = Repair::new(repair, unsure, word, w.seq);
            w.stripe.pin();
            Some(listed)
        };
        let mut e = w.maybe_held(to, repair);
        let how = self.retry_release(&mut e);
        if how != Settle::Pending {
            self.shared.held.note_resolved();
            return Ok(how);
        }
        self.shared.held.record(e);
        Err(KvError::LockMaybeHeld {
            model: w.model,
            release: Box::new(error),
            after: None,
        })
    }

    /// One pass over the client's locks maybe held: each whose own `CAS`
    /// completed and whose stripe no lock of this process counts in is
    /// released again (its repair writes first). Costs its round trips to
    /// the operation that runs it; failures leave the lock recorded.
    pub(super) fn resolve_held(&mut self) {
        if self.shared.held.count() == 0 {
            return;
        }
        let mut entries = self.shared.held.take();
        // Locks kept for repair first: a plain record of the same stripe
        // waits for them (module `held`), so one pass settles both.
        entries.sort_by_key(|e| e.repair.is_none());
        let before = entries.len();
        entries.retain_mut(|e| self.retry_release(e) == Settle::Pending);
        let resolved = before - entries.len();
        self.shared.held.put_back(entries, resolved);
    }

    /// Tries to settle `e`: [`Settle::Pending`] while this client may
    /// still hold it.
    fn retry_release(&mut self, e: &mut MaybeHeld) -> Settle {
        if let Some(flag) = &e.inflight {
            match flag.result() {
                None => return Settle::Pending,
                Some(r) => {
                    e.inflight = None;
                    e.stripe.leave();
                    if r.is_ok() {
                        // It landed (released) or found the word changed
                        // (not ours any more, or never was).
                        return Settle::Gone;
                    }
                }
            }
        }
        let stripe = e.stripe;
        if e.repair.is_some() {
            let mut how = Settle::Pending;
            stripe.exclusively_pinned(|| {
                how = self.release_exclusively(e);
                // Unpinned once settled.
                how != Settle::Pending
            });
            return how;
        }
        stripe
            .exclusively(|| self.release_exclusively(e))
            .unwrap_or(Settle::Pending)
    }

    /// [`Self::retry_release`] holding `e`'s stripe: its repair writes,
    /// then the `CAS` from its locked word. A `CAS` that completes settles
    /// it: it released the lock, or the word was not ours any more.
    ///
    /// The repair writes go out only while the word is still ours: a `CAS`
    /// leaving it as it is tells. The word holding our locked value means
    /// the lock is ours if no release of it may have landed (else the
    /// record is unsure, below): no other session of this
    /// process holds a lock of this stripe that it counts, and other
    /// processes lock with other owner ids — so nobody else writes the
    /// chain until the `CAS` below. Any other value settles it: the lock
    /// `CAS` never landed, or a release of ours did after the writes
    /// before it were placed (a torn write fails what follows it on its
    /// link).
    ///
    /// Once the repair writes are whole, a release `CAS` whose outcome is
    /// unknown may have landed: the lock may be another session's from
    /// then on (same owner id, same word), and writing this record's
    /// leaves again would put an old image over that session's writes.
    /// So the record turns *unsure* then, as one whose unlock went in one
    /// batch with failed writes is from the start (module `held`): its
    /// retry reads what it would write; over whole leaves it only releases
    /// the word (harmless whoever holds it: no lock of this process is
    /// counted in the stripe, and a lock left held over whole leaves has
    /// its writes done); torn ones are its own to write again unless a
    /// lock of its word kept for repair was taken after it. Only a retry
    /// that wrote the repair and released the word says
    /// [`Settle::Released`].
    fn release_exclusively(&mut self, e: &mut MaybeHeld) -> Settle {
        // Whether this retry wrote the record's repair.
        let mut wrote = false;
        if let Some(repair) = &e.repair {
            let ours = Op::Cas {
                remote: e.lt_off,
                expected: e.locked,
                new: e.locked,
            };
            match self
                .io
                .run_each(&self.shared.pool, &[ours], "checking a lock held")
            {
                Ok([Ok(word)]) if *word == e.locked => {}
                Ok([Ok(_)]) => {
                    // Our release landed: the writes before it are whole.
                    self.redo_whole(&repair.writes);
                    return Settle::Gone;
                }
                _ => return Settle::Pending,
            }
            let mut rewrite = true;
            if repair.unsure {
                if repair.superseded() {
                    // Our release landed: a lock of this word was taken
                    // since (and kept for repair: it wrote the leaf).
                    self.redo_whole(&repair.writes);
                    return Settle::Gone;
                }
                match self.in_place(&repair.writes) {
                    // Nothing torn: nothing to write again, and releasing
                    // the word is harmless even if it is another
                    // session's by now (see above).
                    Some(true) => {
                        self.redo_whole(&repair.writes);
                        rewrite = false;
                    }
                    Some(false) => {}
                    None => return Settle::Pending,
                }
            }
            if rewrite {
                let writes: Vec<(u64, &[u8])> = repair
                    .writes
                    .iter()
                    .map(|(off, b)| (*off, b.as_slice()))
                    .collect();
                let ops = match self.io.stage_writes(&writes) {
                    Ok(ops) => ops,
                    Err(_) => return Settle::Pending,
                };
                if !matches!(
                    self.write(&ops, "writing a locked chain again"),
                    Written::All
                ) {
                    return Settle::Pending;
                }
            }
            wrote = rewrite;
        }
        let cas = Op::Cas {
            remote: e.lt_off,
            expected: e.locked,
            new: e.to,
        };
        self.io.cur.retries += 1;
        match self
            .io
            .run_each(&self.shared.pool, &[cas], "releasing a chain lock again")
        {
            Ok([Ok(old)]) if *old == e.locked && (wrote || e.repair.is_none()) => Settle::Released,
            Ok([Ok(_)]) => Settle::Gone,
            _ => {
                // It may have landed: unsure from here on (see above).
                if let Some(repair) = &mut e.repair {
                    repair.unsure = true;
                }
                Settle::Pending
            }
        }
    }

    /// The leaves `writes` wrote are whole (or were found so): the redo
    /// copies of their failed writes are not needed (module `redo`).
    fn redo_whole(&self, writes: &[(u64, Vec<u8>)]) {
        for (target, _) in writes {
            self.io.redo_whole(*target);
        }
    }

    /// Whether nothing `writes` (pool offset, bytes) target is torn in
    /// the pool now: each leaf validates (its checksum covers every other
    /// byte), each other write reads back as written; `None` if a READ
    /// failed.
    fn in_place(&mut self, writes: &[(u64, Vec<u8>)]) -> Option<bool> {
        for (off, bytes) in writes {
            let now = self
                .io
                .read_bytes(
                    &self.shared.pool,
                    *off,
                    bytes.len() as u64,
                    "reading a leaf kept for repair",
                )
                .ok()?;
            let whole = match Leaf::from_bytes(bytes) {
                Ok(_) => Leaf::from_bytes(&now).is_ok_and(|leaf| leaf.validate().is_ok()),
                Err(_) => now == *bytes,
            };
            if !whole {
                return Some(false);
            }
        }
        Some(true)
    }
}

/// How a retried release of a lock maybe held ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Settle {
    /// Not settled: this client may still hold the lock.
    Pending,
    /// Released by this retry, after its repair writes if it has any.
    Released,
    /// Settled otherwise: the word was not ours any more (or never was:
    /// a release of ours landed earlier, or the lock `CAS` never did), or
    /// an unsure record released it without writing (module `held`).
    Gone,
}

impl ChainLock {
    /// The LT word before the lock.
    pub(super) fn unlocked(&self) -> LtEntry {
        self.word.unlocked
    }

    /// Spends the guard: from here on the release's outcome decides.
    fn spend(mut self) -> LockWord {
        self.shared = None;
        self.word
    }

    /// Writes `writes` and releases the lock, leaving the LT entry at `to`
    /// (see [`KvSession::write_and_unlock`] for the round trips).
    pub(super) fn release(
        self,
        s: &mut KvSession,
        writes: &[(u64, &[u8])],
        to: LtEntry,
    ) -> Result<(), KvError> {
        s.write_and_unlock(self.spend(), writes, to.raw())
    }

    /// Posts the release, leaving the LT entry at `to`, without waiting
    /// for it, on any fabric (a split's, once its leaves are written).
    pub(super) fn post_release(self, s: &mut KvSession, to: LtEntry) -> Result<(), KvError> {
        s.post_unlock(self.spend(), to.raw())
    }

    /// Releases the lock with nothing written, the LT entry back to the
    /// word it held before the lock.
    pub(super) fn release_unchanged(self, s: &mut KvSession) -> Result<(), KvError> {
        let w = self.spend();
        s.unlock(w, w.unlocked.raw())
    }

    /// Releases the lock unchanged after `error` and returns `error`,
    /// joined by the release's own if that failed too
    /// ([`KvSession::unlock_after`]).
    pub(super) fn abort(self, s: &mut KvSession, error: KvError) -> KvError {
        s.unlock_after(self.spend(), error)
    }

    /// Keeps the lock until `repair` is written (after `error`), then
    /// releases it unchanged: at once if that works, else by a later
    /// operation ([`KvError::LockMaybeHeld`]).
    pub(super) fn keep(
        self,
        s: &mut KvSession,
        repair: Vec<(u64, Vec<u8>)>,
        error: KvError,
    ) -> Result<(), KvError> {
        let w = self.spend();
        s.lost_release(w, w.unlocked.raw(), error, repair)
    }

    /// Keeps the lock until `rewrite` — writes that failed with `error`
    /// and may have landed in part — is written again whole, then
    /// releases it to `to`, at once or by a later operation. `Ok` when
    /// that happened at once (the writes took effect); else the
    /// operation's error, indeterminate (see
    /// [`KvSession::release_after_failed_writes`]).
    pub(super) fn rewrite_then_release(
        self,
        s: &mut KvSession,
        rewrite: Vec<(u64, Vec<u8>)>,
        to: LtEntry,
        error: KvError,
    ) -> Result<(), KvError> {
        s.release_after_failed_writes(self.spend(), to.raw(), error, rewrite)
    }
}

impl Drop for ChainLock {
    fn drop(&mut self) {
        // Only reached with no release posted (a panic between lock and
        // release): nobody else changes a locked word, so restoring it is
        // safe. Not awaited, not counted: the session is unwinding; the
        // lock stays counted and recorded until its completion is seen.
        if let Some(shared) = self.shared.take() {
            let w = self.word;
            let flag = CompletionFlag::new();
            // A lapsed lease posts nothing: the lock stays held until the
            // lease ends at the memory node.
            let fenced = shared.cfg.lease.as_ref().is_some_and(|l| !l.valid());
            let posted = !fenced
                && shared
                    .engine
                    .submit_cas(
                        (&shared.pool, w.lt_off),
                        w.locked,
                        w.unlocked.raw(),
                        OnValue::flag(&flag),
                    )
                    .is_ok();
            let mut held = w.maybe_held(w.unlocked.raw(), None);
            if posted {
                held.inflight = Some(flag);
            } else {
                w.stripe.leave();
            }
            shared.held.record(held);
        }
    }
}

impl Drop for KvSession {
    fn drop(&mut self) {
        // Its unlock confirmed, or handed to the client's record (whose
        // error has no one left to go to).
        let _ = self.settle();
        // The last handle on its client (the client's went first): what
        // the client holds free goes back, as `KvClient`'s drop would —
        // by the client's reaper, once it released the locks maybe held.
        if self.counted && self.shared.let_go() && !crate::reaper::Posted::adopt(&self.shared) {
            self.close_for_good();
        }
    }
}

/// `writes` as owned bytes, for a release that must write them again
/// first.
pub(super) fn owned(writes: &[(u64, &[u8])]) -> Vec<(u64, Vec<u8>)> {
    writes.iter().map(|&(off, b)| (off, b.to_vec())).collect()
}

/// The error of an operation whose writes failed with `write` (they may
/// have landed, in part) and whose release then answered `release`: a
/// lock maybe held carries the write's error as what came before it;
/// anything else is indeterminate.
fn after_writes(write: &KvError, release: KvError) -> KvError {
    match release {
        KvError::LockMaybeHeld { model, release, .. } => KvError::LockMaybeHeld {
            model,
            release,
            after: Some(Box::new(write.clone().indeterminate())),
        },
        other => other.indeterminate(),
    }
}
