//! Chain locks whose fate this compute node does not know, and how it
//! releases them without ever freeing a lock it does not hold.
//!
//! A lock `CAS` or an unlock `CAS` that ends in an error completion may
//! still have landed (a fabric may fail an operation after it applied),
//! and one not confirmed in time may land later. Such a lock is *maybe
//! held*: the client records it ([`MaybeHeld`], kept by [`HeldLocks`]) and
//! a later operation of any of its sessions retries the release — a `CAS`
//! from the locked word to the word the release meant to leave, after any
//! writes that must land first. The retry is harmless when the lock was
//! released already (the word differs, the `CAS` fails) — unless a lock was
//! taken since with the very same word: a lock word names its holder by
//! owner id only, and every session of a process (every client configured
//! with the same owner) writes the same id. So a retry runs only while no
//! other lock of this process is being taken, held or released on that
//! chain:
//!
//! - a table of [`Stripe`]s per pool ([`StripeTable`], shared by every
//!   client of this process on that pool; the LT entry's hash picks the
//!   stripe) counts the locks of this process that are being taken, are
//!   held, or whose release is not yet confirmed: [`Stripe::enter`] before
//!   the lock `CAS`, [`Stripe::leave`] once that `CAS` failed, its outcome
//!   went into a [`MaybeHeld`], or the release was confirmed;
//! - a retry holds its stripe *exclusively*, which it gets only while that
//!   count is 0; meanwhile [`Stripe::enter`] refuses and the writer backs
//!   off as from a busy lock, so no lock of this process on the chain is
//!   taken under the retry;
//! - an in-flight `CAS` of ours (an unlock not confirmed in time, or posted
//!   by a dropped or panicking session) keeps its count until its
//!   completion is seen: nothing is retried while it may still land;
//! - a lock kept for *repair* — writes of its holder that failed and may
//!   have landed in part (a torn leaf), to be written again whole before
//!   the release — is *pinned* in its stripe until its release is settled
//!   ([`Stripe::pin`]: counted apart from the locks), and its own retry
//!   holds the stripe exclusively while no lock is counted
//!   ([`Stripe::exclusively_pinned`]; other pinned records may be: each
//!   is on a chain of its own). A plain record's retry waits for pinned
//!   ones too: otherwise another session's record of the same word (a lock
//!   `CAS` of its that failed against our held lock, and may have landed
//!   as far as it knows) could be retried first and release our lock over
//!   the torn leaf;
//! - a record kept for repair whose lock is not surely held any more is
//!   *unsure* ([`Repair::unsure`]). A plain record is not counted in its
//!   stripe, and its lock may still be held (its release failed before it
//!   landed): a repair retried after a release of its own that may have
//!   landed could find that other session's lock under the same word,
//!   take it for its own, and write its old leaf image over that
//!   session's acknowledged writes. A record turns unsure when a retry
//!   wrote its repair whole and its release `CAS` then failed; and it is
//!   unsure from the start when a leaf write and its unlock `CAS`, in one
//!   batch on an ordered fabric, both failed (a torn write lets nothing
//!   after it land, but a failed write does not say it was torn). An
//!   unsure
//!   record's retry, once it found its locked word, reads what its repair
//!   writes: if nothing is torn (a leaf carries a checksum of every other
//!   byte) it writes nothing and releases the word — harmless whoever
//!   holds it: no lock of this process is counted in the stripe, and a
//!   lock left held over whole leaves has its writes done. A torn leaf
//!   under a held word was written by the word's holder, which stays kept
//!   for repair until the leaf is whole: the latest lock of that word
//!   among those kept for repair. So the record writes its repair again
//!   only if no lock of its word kept for repair was taken after it
//!   ([`Repair::superseded`]; else its own release landed, and it is
//!   settled). Each record kept for repair is listed process-wide with the
//!   sequence number its lock took when it was seen taken
//!   ([`next_lock_seq`]).
//!
//! Owner ids are per process: a leased id is held by one process at a
//! time, and [`rolex_core::entry::LockOwner::ANONYMOUS`] clients live in
//! the memory node's process. If the process dies with locks maybe held,
//! the memory node's lease reaper releases the leased ones.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Acquire};
use std::sync::{Arc, Mutex};

use rolex_core::wire::MrDesc;
use rolex_engine::callback::CompletionFlag;

/// Stripes of one pool's table.
const STRIPES: usize = 4096;
/// The stripe word's bit for "a retry holds it"; bits 32 to 62 count
/// pinned records ([`PIN`] each), bits 0 to 31 the locks.
const EXCLUSIVE: u64 = 1 << 63;
/// One pinned record in a stripe word.
const PIN: u64 = 1 << 32;
/// The lock count's bits of a stripe word.
const LOCKS: u64 = PIN - 1;

/// The stripes of one pool (module docs). One table per pool, not one
/// for the process: a lock word can only be confused with another of the
/// same word, so pools never need to wait for each other, and a record
/// kept for repair on one memory node (perhaps dead) does not hold back
/// retries on another's chains that hash to its stripe.
///
/// Tables live as long as the process (a [`Stripe`] is a plain
/// reference), and are reused: one no client uses any more keeps its pool
/// (a client reconnecting to it gets it back, with whatever it still
/// counts), and goes to another pool only once every stripe of it is
/// idle. So the process holds at most one table (32 KiB) per pool it is
/// connected to at once, plus tables left counting by a client that went
/// away with an operation of its own still in flight.
pub(crate) struct StripeTable([AtomicU64; STRIPES]);

/// A pool as the stripe tables tell pools apart: its first NIC's address
/// and its address range at the memory node (not its keys, which a lease
/// of its own changes: two clients of one pool share a table whatever
/// their keys).
#[derive(Clone, Debug, PartialEq, Eq)]
struct PoolKey {
    nic: Option<rolex_core::wire::NetAddr>,
    ptr: u64,
    len: u64,
}

impl PoolKey {
    fn of(pool: &MrDesc) -> Self {
        Self {
            nic: pool.nics.first().map(|&(a, _)| a),
            ptr: pool.ptr,
            len: pool.len,
        }
    }
}

/// Every stripe table of the process: its pool, the clients using it, the
/// table.
static TABLES: Mutex<Vec<(PoolKey, usize, &'static StripeTable)>> = Mutex::new(Vec::new());

impl StripeTable {
    /// The table of `pool`, counted as used by one more client until
    /// [`StripeTable::release`]: the one every other client of this
    /// process on `pool` uses, else an idle one of a pool no client uses,
    /// else a new one.
    pub(crate) fn acquire(pool: &MrDesc) -> &'static StripeTable {
        let key = PoolKey::of(pool);
        let mut tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = tables.iter_mut().find(|t| t.0 == key) {
            t.1 += 1;
            return t.2;
        }
        if let Some(t) = tables.iter_mut().find(|t| t.1 == 0 && t.2.idle()) {
            *t = (key, 1, t.2);
            return t.2;
        }
        let table: &'static StripeTable = Box::leak(Box::new(StripeTable(
            [const { AtomicU64::new(0) }; STRIPES],
        )));
        tables.push((key, 1, table));
        table
    }

    /// Counts one client fewer on this table ([`StripeTable::acquire`]).
    pub(crate) fn release(&'static self) {
        let mut tables = TABLES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = tables.iter_mut().find(|t| std::ptr::eq(t.2, self)) {
            t.1 = t.1.saturating_sub(1);
        }
    }

    /// Whether no stripe counts anything.
    fn idle(&self) -> bool {
        self.0.iter().all(|w| w.load(Acquire) == 0)
    }

    /// The stripe of the LT entry at `lt_off` in this table's pool.
    pub(crate) fn stripe(&'static self, lt_off: u64) -> Stripe {
        // Fibonacci hashing of the word index (LT entries are 8-byte
        // words): neighbouring entries land far apart.
        let h = (lt_off >> 3).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Stripe(&self.0[(h >> 52) as usize % STRIPES])
    }
}

/// A client's use of its pool's [`StripeTable`], ended when dropped.
pub(crate) struct StripeUse(&'static StripeTable);

impl StripeUse {
    /// Uses `pool`'s table ([`StripeTable::acquire`]).
    pub(crate) fn of(pool: &MrDesc) -> Self {
        Self(StripeTable::acquire(pool))
    }

    /// The stripe of the LT entry at `lt_off`.
    pub(crate) fn stripe(&self, lt_off: u64) -> Stripe {
        self.0.stripe(lt_off)
    }
}

impl Drop for StripeUse {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl std::fmt::Debug for StripeUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StripeUse")
            .field(&(self.0 as *const StripeTable))
            .finish()
    }
}

/// The stripe of its pool's table that one LT entry falls in (see the
/// module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stripe(&'static AtomicU64);

impl Stripe {
    /// Counts a lock of this process about to be taken in this stripe;
    /// `false` (nothing counted) while a retry holds it exclusively.
    pub(crate) fn enter(self) -> bool {
        let mut v = self.0.load(Acquire);
        loop {
            if v & EXCLUSIVE != 0 {
                return false;
            }
            match self.0.compare_exchange_weak(v, v + 1, AcqRel, Acquire) {
                Ok(_) => return true,
                Err(now) => v = now,
            }
        }
    }

    /// Uncounts a lock [`Stripe::enter`] counted.
    pub(crate) fn leave(self) {
        self.0.fetch_sub(1, AcqRel);
    }

    /// Takes the stripe exclusively if no lock of this process is counted
    /// in it.
    fn try_exclusive(self) -> bool {
        self.0
            .compare_exchange(0, EXCLUSIVE, AcqRel, Acquire)
            .is_ok()
    }

    /// Ends [`Stripe::try_exclusive`].
    fn end_exclusive(self) {
        self.0.fetch_and(!EXCLUSIVE, AcqRel);
    }

    /// Turns a lock this stripe counts into a pinned record (a lock kept
    /// for repair: module docs).
    pub(crate) fn pin(self) {
        self.0.fetch_add(PIN - 1, AcqRel);
    }

    /// Uncounts a pinned record ([`Stripe::pin`]) whose release settled or
    /// that is dropped.
    pub(crate) fn unpin(self) {
        self.0.fetch_sub(PIN, AcqRel);
    }

    /// [`Stripe::exclusively`] for a pinned record: runs `f` while no
    /// lock of this process is counted in the stripe (pinned records may
    /// be), holding it exclusively; `f` says whether the lock was settled,
    /// and then the record is unpinned. `None` (without running it) if a
    /// lock is counted or another retry holds the stripe.
    pub(crate) fn exclusively_pinned(self, f: impl FnOnce() -> bool) -> Option<bool> {
        let mut v = self.0.load(Acquire);
        loop {
            if v & (EXCLUSIVE | LOCKS) != 0 {
                return None;
            }
            match self
                .0
                .compare_exchange_weak(v, v | EXCLUSIVE, AcqRel, Acquire)
            {
                Ok(_) => break,
                Err(now) => v = now,
            }
        }
        let settled = f();
        if settled {
            self.unpin();
        }
        self.end_exclusive();
        Some(settled)
    }

    /// Runs `f` holding the stripe exclusively; `None` (without running
    /// it) if a lock of this process is counted in the stripe.
    pub(crate) fn exclusively<T>(self, f: impl FnOnce() -> T) -> Option<T> {
        if !self.try_exclusive() {
            return None;
        }
        let out = f();
        self.end_exclusive();
        Some(out)
    }
}

/// The locks kept for repair in this process: each one's LT word and the
/// sequence number of its lock (module docs).
static KEPT: Mutex<Vec<(WordId, u64)>> = Mutex::new(Vec::new());

/// The last sequence number [`next_lock_seq`] gave.
static LOCK_SEQ: AtomicU64 = AtomicU64::new(0);

/// The next lock sequence number, taken once a lock `CAS` of this process
/// was seen to land: a lock of the same word seen taken later numbers
/// higher (it landed after this one was released).
pub(crate) fn next_lock_seq() -> u64 {
    LOCK_SEQ.fetch_add(1, AcqRel) + 1
}

/// One LT word in the memory nodes: its address and its pool's first
/// remote key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WordId {
    addr: u64,
    rkey: u64,
}

impl WordId {
    /// The LT word at `lt_off` in `pool`.
    pub(crate) fn of(pool: &MrDesc, lt_off: u64) -> Self {
        Self {
            addr: pool.ptr.wrapping_add(lt_off),
            rkey: pool.nics.first().map_or(0, |&(_, rkey)| rkey),
        }
    }
}

/// What a lock kept for repair writes before its release, listed in
/// [`KEPT`] while it exists.
#[derive(Debug)]
pub(crate) struct Repair {
    /// The writes: (pool offset, bytes).
    pub(crate) writes: Vec<(u64, Vec<u8>)>,
    /// A release of the lock may have landed (module docs): the writes
    /// go out only over a torn leaf, and only if the record is not
    /// [`Repair::superseded`]; over whole ones the word is released.
    pub(crate) unsure: bool,
    word: WordId,
    seq: u64,
}

impl Repair {
    /// `writes` for the lock of `word` numbered `seq`, listed as kept for
    /// repair (before its stripe pins it: a retry that finds no lock
    /// counted there sees it listed).
    pub(crate) fn new(writes: Vec<(u64, Vec<u8>)>, unsure: bool, word: WordId, seq: u64) -> Self {
        kept().push((word, seq));
        Self {
            writes,
            unsure,
            word,
            seq,
        }
    }

    /// Leaves the lock listed for good (its record is dropped with it
    /// maybe held over a torn leaf: its client closed).
    fn stay_listed(mut self) {
        drop(std::mem::take(&mut self.writes));
        std::mem::forget(self);
    }

    /// Whether a lock of the same word, kept for repair, was seen taken
    /// after this one: then this one was released before it.
    pub(crate) fn superseded(&self) -> bool {
        kept().iter().any(|&(w, s)| w == self.word && s > self.seq)
    }
}

impl Drop for Repair {
    fn drop(&mut self) {
        let mut kept = kept();
        if let Some(i) = kept.iter().position(|&k| k == (self.word, self.seq)) {
            kept.swap_remove(i);
        }
    }
}

/// [`KEPT`], locked.
fn kept() -> std::sync::MutexGuard<'static, Vec<(WordId, u64)>> {
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// A chain lock this client may still hold (see the module docs).
#[derive(Debug)]
pub(crate) struct MaybeHeld {
    /// Pool offset of its LT entry.
    pub(crate) lt_off: u64,
    /// Its stripe.
    pub(crate) stripe: Stripe,
    /// The word while this client holds it.
    pub(crate) locked: u64,
    /// The word its release leaves.
    pub(crate) to: u64,
    /// A `CAS` of ours on the word whose completion has not been seen; it
    /// still counts in the stripe.
    pub(crate) inflight: Option<Arc<CompletionFlag>>,
    /// Writes that must land before the release, if it is kept for
    /// repair: then the record is pinned in its stripe (module docs).
    pub(crate) repair: Option<Repair>,
}

impl MaybeHeld {
    /// Uncounts what this record counts in its stripe: its `CAS` in
    /// flight, its pin (kept for repair).
    fn leave_stripe(&self) {
        if self.inflight.is_some() {
            self.stripe.leave();
        }
        if self.repair.is_some() {
            self.stripe.unpin();
        }
    }
}

/// The locks a client may still hold.
#[derive(Debug, Default)]
pub(crate) struct HeldLocks {
    list: Mutex<Vec<MaybeHeld>>,
    /// Entries recorded and not yet resolved (including those a
    /// resolution pass holds).
    count: AtomicUsize,
    /// Entries resolved so far.
    resolved: AtomicU64,
}

impl HeldLocks {
    /// Records `lock`.
    pub(crate) fn record(&self, lock: MaybeHeld) {
        self.count.fetch_add(1, AcqRel);
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lock);
    }

    /// Locks recorded and not yet resolved.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Acquire)
    }

    /// Locks recorded and resolved since the client connected.
    pub(crate) fn resolved(&self) -> u64 {
        self.resolved.load(Acquire)
    }

    /// Counts a lock settled by a retry right away (never recorded).
    pub(crate) fn note_resolved(&self) {
        self.resolved.fetch_add(1, AcqRel);
    }

    /// Takes every entry for a resolution pass (another pass may hold
    /// some: each entry is in one pass at a time).
    pub(crate) fn take(&self) -> Vec<MaybeHeld> {
        std::mem::take(&mut *self.list.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Ends a pass: `kept` go back, `resolved` more are done.
    pub(crate) fn put_back(&self, kept: Vec<MaybeHeld>, resolved: usize) {
        if !kept.is_empty() {
            self.list
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(kept);
        }
        self.count.fetch_sub(resolved, AcqRel);
        self.resolved.fetch_add(resolved as u64, AcqRel);
    }
}

impl Drop for HeldLocks {
    fn drop(&mut self) {
        // Dropped after the client's engine, which failed every operation
        // still in flight: no `CAS` of ours can land any more, so the
        // stripes may forget them (the locks themselves are the lease
        // reaper's now). A lock kept for repair stays listed: it may hold
        // its word over a torn leaf, which an unsure record of the same
        // word must not take for its own.
        for mut e in self
            .list
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            e.leave_stripe();
            if let Some(r) = e.repair.take() {
                r.stay_listed();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe() -> Stripe {
        // A stripe of its own: no other test of this process uses it.
        static MINE: AtomicU64 = AtomicU64::new(0);
        Stripe(&MINE)
    }

    #[test]
    fn a_retry_excludes_new_locks_and_waits_for_held_ones() {
        let s = stripe();
        assert!(s.enter(), "a lock being taken");
        assert_eq!(s.exclusively(|| ()), None, "a retry waits for it");
        s.leave();
        let inside = s.exclusively(|| {
            assert!(!s.enter(), "no lock is taken under a retry");
            7
        });
        assert_eq!(inside, Some(7));
        assert!(s.enter(), "taken again once the retry ended");
        s.leave();
        assert_eq!(s.0.load(Acquire), 0);
    }

    #[test]
    fn a_lock_kept_for_repair_excludes_other_retries_until_settled() {
        let s = {
            static MINE: AtomicU64 = AtomicU64::new(0);
            Stripe(&MINE)
        };
        assert!(s.enter(), "the lock kept for repair");
        s.pin();
        assert_eq!(s.exclusively(|| ()), None, "another record waits");
        assert!(s.enter(), "a lock being taken");
        assert_eq!(
            s.exclusively_pinned(|| true),
            None,
            "the repair waits for it"
        );
        s.leave();
        let kept = s.exclusively_pinned(|| {
            assert!(!s.enter(), "no lock is taken under the repair");
            false
        });
        assert_eq!(kept, Some(false), "not settled: still pinned");
        assert_eq!(s.exclusively(|| ()), None);
        // A second lock kept for repair in the same stripe (another
        // chain): neither waits for the other.
        assert!(s.enter());
        s.pin();
        assert_eq!(s.exclusively_pinned(|| true), Some(true));
        assert_eq!(s.exclusively(|| ()), None, "one still pinned");
        assert_eq!(s.exclusively_pinned(|| true), Some(true));
        assert_eq!(s.0.load(Acquire), 0, "settled: both unpinned");
        assert_eq!(s.exclusively(|| 1), Some(1), "other records go on");
    }

    #[test]
    fn a_lock_kept_for_repair_is_superseded_by_a_later_one_of_its_word() {
        // Words of their own: no other test of this process lists them.
        let word = WordId {
            addr: 0xdead_0000,
            rkey: 7,
        };
        let other = WordId {
            addr: 0xdead_0008,
            ..word
        };
        let first = Repair::new(vec![(0, vec![1])], true, word, 10);
        let elsewhere = Repair::new(Vec::new(), false, other, 30);
        assert!(!first.superseded(), "a later lock of another word");
        let later = Repair::new(Vec::new(), false, word, 20);
        assert!(first.superseded());
        assert!(!later.superseded(), "the latest of its word");
        drop(later);
        assert!(!first.superseded(), "unlisted once dropped");
        Repair::new(Vec::new(), false, word, 21).stay_listed();
        assert!(first.superseded(), "listed for good");
        drop((first, elsewhere));
    }

    #[test]
    fn stripes_spread_entries() {
        let table: &'static StripeTable = Box::leak(Box::new(StripeTable(
            [const { AtomicU64::new(0) }; STRIPES],
        )));
        let mut seen = std::collections::HashSet::new();
        for j in 0..1024u64 {
            seen.insert(table.stripe((1 << 20) + 8 * j).0 as *const AtomicU64);
        }
        assert!(seen.len() > 1000, "{} stripes for 1024 entries", seen.len());
    }

    fn pool(nic: u8, key: u64) -> MrDesc {
        let addr = rolex_core::wire::NetAddr::new(&[nic; 8]).unwrap();
        MrDesc::new(
            1 << 40,
            1 << 20,
            rolex_core::wire::Access::REMOTE_ATOMIC,
            &[(addr, key)],
        )
        .unwrap()
    }

    #[test]
    fn each_pool_has_a_table_of_its_own_shared_by_its_clients() {
        // Pools of their own: no other test of this process uses them.
        let (a, b) = (pool(0xa1, 7), pool(0xb2, 7));
        let ta = StripeTable::acquire(&a);
        // Another key to the same pool (a lease's own).
        let ta2 = StripeTable::acquire(&pool(0xa1, 99));
        assert!(
            std::ptr::eq(ta, ta2),
            "one table per pool, whatever the key"
        );
        let tb = StripeTable::acquire(&b);
        assert!(!std::ptr::eq(ta, tb), "another pool, another table");
        // A pool's retry never waits for another pool's locks.
        let s = ta.stripe(4096);
        assert!(s.enter());
        assert_eq!(tb.stripe(4096).exclusively(|| 1), Some(1));
        assert_eq!(ta.stripe(4096).exclusively(|| 1), None);
        // A table still counting is not handed to another pool.
        ta.release();
        ta2.release();
        let c = StripeTable::acquire(&pool(0xc3, 7));
        assert!(
            !std::ptr::eq(ta, c),
            "a table still counting stays its pool's"
        );
        let a_back = StripeTable::acquire(&a);
        assert!(std::ptr::eq(ta, a_back), "its pool gets it back");
        s.leave();
        for t in [a_back, tb, c] {
            t.release();
        }
    }
}
