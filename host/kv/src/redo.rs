//! The compute side of the redo log (`rolex_core::layout::redo`): a client
//! claims a block of it when it connects, and each leaf WRITE of its
//! sessions goes out behind a WRITE of the leaf's new bytes into a slot of
//! that block, in the same batch, so a leaf torn by a death (this
//! process's mid-send, or the memory node's mid-copy) can be written
//! again whole by the memory node.
//!
//! When: only where the fabric places one peer's writes in posting order
//! (`TransferEngine::writes_ordered`: `tcp;ofi_rxm`, ordered loopback, RC
//! without relaxed ordering), which is what makes "a torn leaf has a whole
//! entry" true; and only when the pool has a redo log and a block was
//! free at connect ([`KvClient::redo_logged`](crate::KvClient::redo_logged)
//! says). Elsewhere leaf writes go out alone, as before. Why not on an
//! unordered fabric: an entry could land after its leaf write, and
//! waiting for it would cost a round trip per write; the one unordered
//! fabric that is hardware (EFA) places a leaf (one packet) whole.
//!
//! Slots: a slot is taken for each leaf write staged, and stays taken
//! while its entry may still be needed — until a write of the same leaf
//! by this client completed (the first one, or the repair that writes a
//! torn leaf again: module `session::lock`), or the repair was found not
//! needed. A client with no lock maybe held needs none of its failed
//! writes' slots (every leaf it may have torn is written again before its
//! lock is released), so they are taken back when the block runs out. A
//! write that still finds no free slot goes out without a copy (counted in
//! [`RedoLog::unlogged`]; never blocks a writer).
//!
//! Order of entries: one counter per process numbers every entry
//! (`seq`), so of two entries naming one leaf — written under its chain
//! lock one after the other, perhaps by two clients of one owner — the
//! later has the greater number. Entries carry the claim's nonce: those an
//! earlier claimer of the block left are never taken for this client's.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use rolex_core::entry::LockOwner;
use rolex_core::layout::{RedoClaim, RedoEntry, RedoHeader, RedoRegion, Superblock};
use rolex_core::wire::MrDesc;

use crate::error::KvError;
use crate::held::HeldLocks;
use crate::io::{Io, Op};

/// The process-wide entry counter (see the module docs).
static SEQ: AtomicU64 = AtomicU64::new(1);

/// Tries of one claim or release `CAS` that failed without saying whether
/// it landed.
const CAS_TRIES: usize = 3;

/// What a slot is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    /// Staged or in flight for a write of the leaf at this pool offset.
    InFlight(u64),
    /// Holds the entry of a write of the leaf at this offset that failed
    /// (the leaf may be torn) and was not written again yet.
    Failed(u64),
}

/// How a staged entry's write went, for [`RedoLog::settle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Not posted: nothing was written.
    NotPosted,
    /// The leaf write completed: the leaf is whole.
    Written,
    /// The leaf write failed, or its outcome was not looked at: the leaf
    /// may be torn.
    MaybeTorn,
}

/// A client's claimed redo block (see the module docs).
pub(crate) struct RedoLog {
    region: RedoRegion,
    block: u32,
    claim: RedoClaim,
    owner: LockOwner,
    slots: Mutex<Vec<Slot>>,
    /// The client's locks maybe held: none means no failed write's slot is
    /// still needed.
    held: Arc<HeldLocks>,
    unlogged: AtomicU64,
    logged: AtomicU64,
    /// Never freed: the memory node is gone (`KvClient::abandon_values`).
    abandoned: AtomicBool,
}

impl std::fmt::Debug for RedoLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedoLog")
            .field("block", &self.block)
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

/// A slot taken for one leaf write.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Taken {
    pub(crate) slot: u32,
    /// Pool offset of the slot.
    pub(crate) remote: u64,
}

impl RedoLog {
    /// Claims a free block of `sb`'s redo log for a client owning its
    /// locks as `owner`: a `CAS` from 0 on each block's claim word in turn,
    /// from one drawn at random. `None` when the pool has no redo log or
    /// every block is claimed. A claim `CAS` whose outcome is unknown is
    /// tried again: finding the claim word already this client's means it
    /// landed (the nonce is this client's alone).
    pub(crate) fn claim(
        io: &mut Io,
        pool: &MrDesc,
        sb: &Superblock,
        owner: LockOwner,
        held: Arc<HeldLocks>,
    ) -> Result<Option<Self>, KvError> {
        let Some(region) = sb.redo_region()? else {
            return Ok(None);
        };
        let random = RandomState::new().hash_one(SEQ.fetch_add(1, Relaxed));
        let nonce = (random as u32).max(1);
        let claim = RedoClaim::new(owner, nonce);
        let blocks = region.blocks();
        let first = (random >> 32) as u32 % blocks;
        for i in 0..blocks {
            let block = (first + i) % blocks;
            let at = region.claim_offset(block)?;
            if swap(
                io,
                pool,
                at,
                RedoClaim::FREE.raw(),
                claim.raw(),
                "claiming a redo block",
            )? {
                return Ok(Some(Self {
                    region,
                    block,
                    claim,
                    owner,
                    slots: Mutex::new(vec![Slot::Free; region.slots() as usize]),
                    held,
                    unlogged: AtomicU64::new(0),
                    logged: AtomicU64::new(0),
                    abandoned: AtomicBool::new(false),
                }));
            }
        }
        Ok(None)
    }

    /// The longest write a slot copies.
    pub(crate) fn image_max(&self) -> u64 {
        self.region.image_max()
    }

    /// Leaf writes that went out without a copy: no slot was free.
    pub(crate) fn unlogged(&self) -> u64 {
        self.unlogged.load(Relaxed)
    }

    /// Leaf writes that went out behind a copy.
    pub(crate) fn logged(&self) -> u64 {
        self.logged.load(Relaxed)
    }

    /// Counts a leaf write staged without a copy: it did not fit the
    /// write buffer (`room` false), or [`Self::take`] found no slot (it
    /// counted it already).
    pub(crate) fn unstaged(&self, room: bool) {
        if !room {
            self.unlogged.fetch_add(1, Relaxed);
        }
    }

    /// Takes a slot for a write of `len` bytes at pool offset `target`;
    /// `None` (counted) when none is free or the write does not fit one.
    pub(crate) fn take(&self, target: u64, len: u64) -> Option<Taken> {
        if len > self.image_max() {
            self.unlogged.fetch_add(1, Relaxed);
            return None;
        }
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut free = slots.iter().position(|s| *s == Slot::Free);
        if free.is_none() && self.held.count() == 0 {
            // No lock maybe held: every leaf a failed write of ours may
            // have torn was written again whole (module docs).
            for s in slots.iter_mut() {
                if matches!(s, Slot::Failed(_)) {
                    *s = Slot::Free;
                }
            }
            free = slots.iter().position(|s| *s == Slot::Free);
        }
        let Some(i) = free else {
            self.unlogged.fetch_add(1, Relaxed);
            return None;
        };
        slots[i] = Slot::InFlight(target);
        let slot = i as u32;
        let remote = self.region.slot_offset(self.block, slot).ok()?;
        self.logged.fetch_add(1, Relaxed);
        Some(Taken { slot, remote })
    }

    /// Writes the entry for `image` (bound for `target`) into `out`, which
    /// must hold [`RedoHeader::SIZE`] more bytes than `image`; returns its
    /// length.
    pub(crate) fn encode(&self, target: u64, image: &[u8], out: &mut Vec<u8>) -> usize {
        out.clear();
        out.resize(RedoHeader::SIZE as usize + image.len(), 0);
        let entry = RedoEntry {
            owner: self.owner,
            nonce: self.claim.nonce(),
            seq: SEQ.fetch_add(1, Relaxed),
            target,
            image,
        };
        // Sized for it above: cannot fail.
        entry.encode(out).unwrap_or(0)
    }

    /// Settles slot `slot`, taken for a write of the leaf at `target`.
    pub(crate) fn settle(&self, slot: u32, target: u64, outcome: Outcome) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match outcome {
            Outcome::NotPosted => {
                if let Some(s) = slots.get_mut(slot as usize) {
                    *s = Slot::Free;
                }
            }
            Outcome::MaybeTorn => {
                if let Some(s) = slots.get_mut(slot as usize) {
                    *s = Slot::Failed(target);
                }
            }
            Outcome::Written => {
                if let Some(s) = slots.get_mut(slot as usize) {
                    *s = Slot::Free;
                }
                free_failed(&mut slots, target);
            }
        }
    }

    /// The leaf at `target` is known whole (a repair found the writes
    /// before it had landed): the entries of its failed writes are not
    /// needed.
    pub(crate) fn whole(&self, target: u64) {
        free_failed(
            &mut self.slots.lock().unwrap_or_else(|e| e.into_inner()),
            target,
        );
    }

    /// Never frees the block: the memory node is gone.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Relaxed);
    }

    /// Frees the block (a `CAS` from this client's claim to 0), unless a
    /// failed write's entry may still be needed: then the block stays
    /// claimed for the memory node (its lease reaper frees it once it used
    /// it). Returns whether it was freed.
    pub(crate) fn release(&self, io: &mut Io, pool: &MrDesc) -> Result<bool, KvError> {
        if self.abandoned.load(Relaxed) {
            return Ok(false);
        }
        let failed = self
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|s| !matches!(s, Slot::Free));
        if failed && self.held.count() > 0 {
            return Ok(false);
        }
        let at = self.region.claim_offset(self.block)?;
        swap(
            io,
            pool,
            at,
            self.claim.raw(),
            RedoClaim::FREE.raw(),
            "freeing a redo block",
        )
    }
}

/// Frees the slots holding entries of failed writes of the leaf at
/// `target`.
fn free_failed(slots: &mut [Slot], target: u64) {
    for s in slots.iter_mut() {
        if *s == Slot::Failed(target) {
            *s = Slot::Free;
        }
    }
}

/// `CAS`es the word at `at` from `from` to `to`; `true` if it holds `to`
/// by this call (or held it already: the nonce makes `to` this client's
/// alone, so a retry finding it means the earlier try landed).
fn swap(
    io: &mut Io,
    pool: &MrDesc,
    at: u64,
    from: u64,
    to: u64,
    during: &'static str,
) -> Result<bool, KvError> {
    let cas = [Op::Cas {
        remote: at,
        expected: from,
        new: to,
    }];
    let mut last = None;
    for attempt in 0..CAS_TRIES {
        match io.run_each(pool, &cas, during)? {
            [Ok(old)] if *old == from => return Ok(true),
            [Ok(old)] => return Ok(attempt > 0 && *old == to),
            [Err(e)] => last = Some(e.clone()),
            _ => {}
        }
    }
    Err(KvError::Transfer {
        during,
        error: last.unwrap_or(rolex_engine::TransferError::EngineShutDown),
    })
}
