//! Releasing the chain locks of a compute node that died holding them.
//!
//! A compute node locks a chain by `CAS`ing its leaf-table entry to
//! `locked_by(owner)`, where `owner` is the id its memory node's lease gave
//! it (see `rolex_host::kv::lease`). When that lease ends — the node's
//! process died — nothing else would ever unlock what it held, and every
//! writer of those chains (and the retraining agent's freeze of their
//! models) would wait forever. [`release_locks_of`] clears exactly the
//! locks that carry the dead node's id, each by `CAS` from the very word it
//! read, so a lock taken or released meanwhile is never touched; the
//! entry's other fields (leaf, synonym pointer) are kept.
//!
//! Why that is enough for the data: a writer changes leaves only while it
//! holds the lock, and every step of a write leaves the chain readable (a
//! split writes the new synonym leaf before the shrunk leaf that links to
//! it; an update rewrites one sealed leaf). A writer that died mid-way left
//! either its old chain or its new one — the unlock it never posted only
//! carried a synonym *hint*; readers and the next writer follow the leaves'
//! own links.
//!
//! Except for one case: a leaf WRITE the dead node's connection carried
//! only in part. A transport that places a write's payload as it arrives
//! (libfabric's `tcp`) keeps the prefix that arrived before the
//! connection broke, over the old leaf: the leaf fails its checksum, and
//! its keys are unreadable (a live writer writes such a leaf again whole
//! before it releases its lock; a dead one cannot). [`release_locks_reporting`]
//! checks each chain it releases, before the release (while no writer can
//! change it): a leaf that does not validate is written again whole from
//! the newest copy the dead holder left of it in the redo log
//! ([`crate::redo`]), where the pool has one and the holder wrote one, and
//! is named either way ([`DamagedLeaf::restored`] says which). Then the
//! dead holder's redo blocks are freed.

use rolex_core::entry::{LockOwner, LtEntry};
use rolex_core::layout::{ModelRecord, Superblock};

use crate::error::AgentError;
use crate::memory::PoolMemory;
use crate::recover::DamagedLeaf;
use crate::redo::{free_blocks_of, Mender};

/// Clears every lock of a live model (the directory's) held by `owner`;
/// returns how many it cleared. Locks of [`LockOwner::ANONYMOUS`] and
/// [`LockOwner::AGENT`] are never released (returns 0 for those owners):
/// only a leased owner can be known dead. Idempotent: run it again after
/// the dead node's last in-flight operations may have landed.
pub fn release_locks_of<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    owner: LockOwner,
) -> Result<u64, AgentError> {
    release_locks_where(mem, sb, |o| o == owner)
}

/// Clears every lock of a live model whose leased owner `dead` says is
/// dead (e.g. "holds no lease now": a sweep for locks whose holder's last
/// operation landed after both releases of its lease); returns how many.
/// Locks of [`LockOwner::ANONYMOUS`] and [`LockOwner::AGENT`] are never
/// passed to `dead` nor released.
pub fn release_locks_where<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    dead: impl Fn(LockOwner) -> bool,
) -> Result<u64, AgentError> {
    release_locks_reporting(mem, sb, dead, |_| {})
}

/// [`release_locks_where`], checking first each chain it releases: every
/// leaf of it that does not validate (module docs: a write the dead
/// holder's connection carried in part) is written again whole from the
/// holder's newest redo copy of it where there is one, and goes to `torn`
/// either way ([`DamagedLeaf::restored`]). The chain is released whether
/// or not it was mended — kept locked it would stop every writer of it
/// and the agent's freezes of its model for good. Last, the redo blocks
/// claimed by dead holders are freed (also those of a holder that held no
/// lock). Idempotent.
pub fn release_locks_reporting<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    dead: impl Fn(LockOwner) -> bool,
    mut torn: impl FnMut(DamagedLeaf),
) -> Result<u64, AgentError> {
    let is_dead = |o: LockOwner| o.is_leased() && dead(o);
    let redo = sb.redo_region()?;
    let mut mender = Mender::new(sb.leaf_region()?, redo, is_dead);
    let mut released = 0;
    let mut rb = [0u8; ModelRecord::SIZE as usize];
    for m in 0..sb.model_count() {
        let at = mem.load(sb.directory_entry_offset(m)?)?;
        mem.read(at, &mut rb)?;
        let r = ModelRecord::read(&rb)?;
        r.check(at, sb)?;
        for j in 0..r.leaf_count() {
            let off = r.lt_entry_offset(j)?;
            let v = LtEntry::from_raw(mem.load(off)?);
            if !(v.is_locked() && is_dead(v.owner())) {
                continue;
            }
            mender.mend_chain(mem, r.model_id(), v, &mut torn)?;
            if mem.cas(off, v.raw(), v.without_lock().raw())? == v.raw() {
                released += 1;
            }
        }
    }
    if let Some(redo) = &redo {
        free_blocks_of(mem, redo, is_dead)?;
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dead_owners_locks_are_released_and_fields_kept() {
        let (mem, _) = crate::memory::testing::small_pool(64);
        let mut sbb = [0u8; Superblock::SIZE as usize];
        mem.read(0, &mut sbb).unwrap();
        let sb = Superblock::read(&sbb).unwrap();
        assert!(sb.model_count() >= 2);

        // Entry j of every model gets the owner `owners[j % 4]`.
        let owners = [
            LockOwner(5),
            LockOwner(6),
            LockOwner::AGENT,
            LockOwner::ANONYMOUS,
        ];
        let mut entries = Vec::new();
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        for m in 0..sb.model_count() {
            let at = mem.load(sb.directory_entry_offset(m).unwrap()).unwrap();
            mem.read(at, &mut rb).unwrap();
            let r = ModelRecord::read(&rb).unwrap();
            for j in 0..r.leaf_count() {
                let off = r.lt_entry_offset(j).unwrap();
                let v = LtEntry::from_raw(mem.load(off).unwrap()).with_pointer(3);
                let owner = owners[j as usize % owners.len()];
                mem.store(off, v.locked_by(owner).raw()).unwrap();
                entries.push((off, v, owner));
            }
        }
        let fives = entries.iter().filter(|e| e.2 == LockOwner(5)).count() as u64;
        assert!(fives > 0);
        assert_eq!(release_locks_of(&mem, &sb, LockOwner(5)).unwrap(), fives);
        for &(off, v, owner) in &entries {
            let now = LtEntry::from_raw(mem.load(off).unwrap());
            if owner == LockOwner(5) {
                assert_eq!(now, v.without_lock(), "released, pointer and leaf kept");
            } else {
                assert_eq!(now, v.locked_by(owner), "other holders untouched");
            }
        }
        // Idempotent, and the unknowable owners are never released.
        assert_eq!(release_locks_of(&mem, &sb, LockOwner(5)).unwrap(), 0);
        assert_eq!(release_locks_of(&mem, &sb, LockOwner::AGENT).unwrap(), 0);
        assert_eq!(
            release_locks_of(&mem, &sb, LockOwner::ANONYMOUS).unwrap(),
            0
        );
        // A sweep by predicate: only leased owners are ever asked about.
        let asked = core::cell::RefCell::new(alloc::vec::Vec::new());
        let swept = release_locks_where(&mem, &sb, |o| {
            asked.borrow_mut().push(o);
            o == LockOwner(6)
        })
        .unwrap();
        assert!(swept > 0);
        assert!(asked.borrow().iter().all(|o| o.is_leased()));
        assert_eq!(release_locks_of(&mem, &sb, LockOwner(6)).unwrap(), 0);
    }
}
