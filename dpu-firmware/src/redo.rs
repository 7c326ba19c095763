//! Mending torn leaves from the redo log: the memory node's side of
//! `rolex_core::layout::RedoRegion`.
//!
//! A compute client writes, before each leaf WRITE and in the same batch,
//! a whole copy of the new leaf (a [`RedoEntry`]) into a slot of a redo
//! block it claimed; a death tears at most one of the two writes (see the
//! layout module). Whoever finds a torn leaf in a chain that a dead holder
//! locked — the lease reaper ([`crate::reap`]) or the resume after the
//! memory node's own death ([`crate::recover`]) — writes over it the
//! newest whole copy that holder left for it, before the chain's lock is
//! released: the lock keeps every other writer out meanwhile.
//!
//! The copy taken for a leaf at pool offset `t` of `len` bytes whose
//! chain `owner` locked is, among the slots of every block whose claim
//! word names `owner` (whatever its nonce: a process may hold several
//! blocks), the whole entry (magic, lengths and checksum checked) with
//! `entry.owner == owner`, `entry.nonce` the block's present claim's (an
//! earlier claimer's entries are not this one's), `entry.target == t`, an
//! image of `len` bytes that validates as a leaf, and the greatest `seq`.
//! Writes to a leaf are serialized by its chain's lock, so that entry is
//! the torn write's whole image — `seq` grows across every client of one
//! owner (one counter per process), so the entries of two clients of one
//! process are compared by it.
//!
//! One more check guards against a copy that is not the torn write's: a
//! copy whose leaf version is behind the version word of the torn leaf
//! (the torn write's own copy is one seal ahead of the old leaf, or equal
//! to what the tear left there) is refused and the leaf reported torn.
//! Such a copy would undo acknowledged writes made after it — were a
//! client of the owner to write the leaf without a copy (no block free)
//! while another client of it holds an older one.
//!
//! The log is read at most once per reap or resume, and only when a torn
//! leaf is found ([`Mender`]); blocks claimed by other holders are skipped
//! by their claim word, so a reap reads the dead holder's blocks only.
//! Blocks are freed with a `CAS` from the claim word read, so a block
//! claimed meanwhile by a live client is never taken from it.

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

use rolex_core::entry::{LockOwner, LtEntry, SltHeader};
use rolex_core::layout::{Leaf, LeafRegion, RedoClaim, RedoEntry, RedoRegion, Superblock};

use crate::error::AgentError;
use crate::memory::PoolMemory;
use crate::recover::DamagedLeaf;

/// Where a torn leaf's new bytes came from: the redo entry written over
/// it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The holder whose entry it was (the chain's lock owner).
    pub owner: LockOwner,
    /// The entry's sequence number.
    pub seq: u64,
}

/// The newest usable copy of each leaf that chosen holders left in the
/// redo log, read once (see the module docs for "usable").
#[derive(Clone, Debug, Default)]
pub struct RedoCopies {
    /// `(owner, target)` → `(seq, image)`.
    newest: BTreeMap<(LockOwner, u64), (u64, Vec<u8>)>,
    /// Blocks read (claimed by a chosen holder).
    blocks: u32,
}

impl RedoCopies {
    /// Reads the slots of every block of `redo` whose claim names an
    /// owner `holders` accepts, keeping per `(owner, target)` the newest
    /// whole entry of that owner and that claim (its nonce) whose image is
    /// a valid leaf of `leaf_len` bytes.
    pub fn read<M: PoolMemory>(
        mem: &M,
        redo: &RedoRegion,
        leaf_len: u64,
        holders: impl Fn(LockOwner) -> bool,
    ) -> Result<Self, AgentError> {
        let mut out = Self::default();
        let mut block = vec![0u8; (redo.block_len() - 8) as usize];
        for b in 0..redo.blocks() {
            let claim = RedoClaim::from_raw(mem.load(redo.claim_offset(b)?)?);
            let Some(owner) = claim.owner().filter(|&o| holders(o)) else {
                continue;
            };
            out.blocks += 1;
            mem.read(redo.slot_offset(b, 0)?, &mut block)?;
            for slot in block.chunks_exact(redo.slot_len() as usize) {
                let Ok(e) = RedoEntry::decode(slot) else {
                    continue;
                };
                if e.owner != owner
                    || e.nonce != claim.nonce()
                    || e.image.len() as u64 != leaf_len
                    || !is_valid_leaf(e.image)
                {
                    continue;
                }
                let newer = match out.newest.get(&(owner, e.target)) {
                    Some(&(seq, _)) => e.seq > seq,
                    None => true,
                };
                if newer {
                    out.newest
                        .insert((owner, e.target), (e.seq, e.image.to_vec()));
                }
            }
        }
        Ok(out)
    }

    /// The newest copy `owner` left of the leaf at pool offset `target`:
    /// its sequence number and image.
    pub fn newest(&self, owner: LockOwner, target: u64) -> Option<(u64, &[u8])> {
        self.newest
            .get(&(owner, target))
            .map(|(seq, image)| (*seq, image.as_slice()))
    }

    /// Leaves with a copy.
    pub fn len(&self) -> usize {
        self.newest.len()
    }

    /// Whether no leaf has a copy.
    pub fn is_empty(&self) -> bool {
        self.newest.is_empty()
    }

    /// Blocks read (those claimed by an accepted holder).
    pub fn blocks_read(&self) -> u32 {
        self.blocks
    }
}

/// The newest usable entry `owner` left for the leaf of `len` bytes at
/// pool offset `target` in `sb`'s redo log (see the module docs): its
/// sequence number and image; `None` without a redo log or such an entry.
/// Reads `owner`'s blocks; to mend several leaves read the log once with
/// [`RedoCopies::read`] or [`Mender`].
pub fn newest_entry<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    owner: LockOwner,
    target: u64,
    len: u64,
) -> Result<Option<(u64, Vec<u8>)>, AgentError> {
    let Some(redo) = sb.redo_region()? else {
        return Ok(None);
    };
    let copies = RedoCopies::read(mem, &redo, len, |o| o == owner)?;
    Ok(copies
        .newest(owner, target)
        .map(|(seq, image)| (seq, image.to_vec())))
}

/// Frees every block of `redo` whose claim names an owner `holders`
/// accepts (its claim word set to 0 by `CAS` from the word read: a block
/// freed or claimed again meanwhile is left alone); returns how many.
/// Idempotent.
pub fn free_blocks_of<M: PoolMemory>(
    mem: &M,
    redo: &RedoRegion,
    holders: impl Fn(LockOwner) -> bool,
) -> Result<u64, AgentError> {
    free_where(mem, redo, |c| c.owner().is_some_and(&holders))
}

/// Frees every block of `redo`, claimed or holding a word that is no
/// claim (which no client could ever claim from): for the resume, when
/// no client survives. Returns how many words it cleared.
pub fn free_all_blocks<M: PoolMemory>(mem: &M, redo: &RedoRegion) -> Result<u64, AgentError> {
    free_where(mem, redo, |c| c != RedoClaim::FREE)
}

fn free_where<M: PoolMemory>(
    mem: &M,
    redo: &RedoRegion,
    which: impl Fn(RedoClaim) -> bool,
) -> Result<u64, AgentError> {
    let mut freed = 0;
    for b in 0..redo.blocks() {
        let at = redo.claim_offset(b)?;
        let raw = mem.load(at)?;
        if which(RedoClaim::from_raw(raw)) && mem.cas(at, raw, RedoClaim::FREE.raw())? == raw {
            freed += 1;
        }
    }
    Ok(freed)
}

/// Whether `bytes` are a leaf that validates.
fn is_valid_leaf(bytes: &[u8]) -> bool {
    Leaf::from_bytes(bytes)
        .and_then(|l| l.validate().map(drop))
        .is_ok()
}

/// Walks locked chains and writes their torn leaves again from the redo
/// log: the log is read at the first torn leaf whose holder it may mend,
/// once ([`RedoCopies`]), and kept for the other chains.
#[derive(Debug)]
pub struct Mender<F> {
    leaves: LeafRegion,
    redo: Option<RedoRegion>,
    holders: F,
    copies: Option<RedoCopies>,
    buf: Vec<u8>,
}

impl<F: Fn(LockOwner) -> bool> Mender<F> {
    /// A mender of leaves of `leaves` from `redo` (`None`: the pool has no
    /// redo log, and every torn leaf stays torn), for chains whose lock
    /// owner `holders` accepts (the dead ones).
    pub fn new(leaves: LeafRegion, redo: Option<RedoRegion>, holders: F) -> Self {
        let buf = vec![0u8; leaves.leaf_size() as usize];
        Self {
            leaves,
            redo,
            holders,
            copies: None,
            buf,
        }
    }

    /// Walks the chain that `entry` heads, locked by `entry.owner()` (so
    /// nothing else writes it; read once per leaf): each leaf that does
    /// not validate is written over with the newest copy its holder left
    /// (when `holders` accepts the holder and there is one), read back and
    /// validated, and goes to `report` with model `model_id` — restored
    /// ([`DamagedLeaf::restored`]) or not. The walk goes on past a
    /// restored leaf and stops at one left torn (its link is not to be
    /// trusted), or at a link that names no leaf of the region (damage,
    /// not a tear).
    pub fn mend_chain<M: PoolMemory>(
        &mut self,
        mem: &M,
        model_id: u64,
        entry: LtEntry,
        mut report: impl FnMut(DamagedLeaf),
    ) -> Result<(), AgentError> {
        let owner = entry.owner();
        let mut addr = entry.addr();
        for _ in 0..=SltHeader::CAPACITY {
            let Ok(offset) = self.leaves.leaf_offset(addr) else {
                return Ok(());
            };
            mem.read(offset, &mut self.buf)?;
            let next = match next_of(&self.buf) {
                Ok(next) => next,
                Err(error) => {
                    let restored = self.restore(mem, owner, offset)?;
                    report(DamagedLeaf {
                        model_id,
                        leaf: addr,
                        error,
                        restored,
                    });
                    match (restored, next_of(&self.buf)) {
                        (Some(_), Ok(next)) => next,
                        _ => return Ok(()),
                    }
                }
            };
            if next.pointer() == 0 {
                break;
            }
            addr = next.addr();
        }
        Ok(())
    }

    /// Writes the newest copy `owner` left of the leaf at `offset` over it
    /// and reads it back into the buffer; `Some` if it validates then.
    fn restore<M: PoolMemory>(
        &mut self,
        mem: &M,
        owner: LockOwner,
        offset: u64,
    ) -> Result<Option<Restored>, AgentError> {
        let Some(redo) = self.redo else {
            return Ok(None);
        };
        if !(self.holders)(owner) {
            return Ok(None);
        }
        let copies = match &mut self.copies {
            Some(c) => c,
            None => self.copies.insert(RedoCopies::read(
                mem,
                &redo,
                self.leaves.leaf_size(),
                &self.holders,
            )?),
        };
        let Some((seq, image)) = copies.newest(owner, offset) else {
            return Ok(None);
        };
        // `self.buf` holds the torn leaf.
        if (version_of(image).wrapping_sub(version_of(&self.buf)) as i64) < 0 {
            return Ok(None);
        }
        mem.write(offset, image)?;
        mem.read(offset, &mut self.buf)?;
        Ok(next_of(&self.buf)
            .is_ok()
            .then_some(Restored { owner, seq }))
    }

    /// Whether the redo log was read (a torn leaf of an accepted holder
    /// was found).
    pub fn read_log(&self) -> bool {
        self.copies.is_some()
    }
}

/// The version word of the leaf in `bytes` (0 if too short).
fn version_of(bytes: &[u8]) -> u64 {
    let at = Leaf::VERSION_OFFSET;
    bytes
        .get(at..at + 8)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The link of the leaf in `bytes`, if it validates.
fn next_of(bytes: &[u8]) -> Result<LtEntry, rolex_core::layout::LeafError> {
    Leaf::from_bytes(bytes).and_then(|l| l.validate().map(|v| v.leaf().next()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{Agent, AgentConfig};
    use crate::memory::testing::{small_pool, VecPool};
    use crate::reap::release_locks_reporting;
    use alloc::vec::Vec;
    use rolex_core::layout::{LeafError, ModelRecord, SlotValue};

    const DEAD: LockOwner = LockOwner(5);
    const ALIVE: LockOwner = LockOwner(6);

    /// A small pool, its superblock, and its first chain: the LT entry's
    /// offset and word, and the leaf's pool offset and bytes.
    struct Setup {
        mem: VecPool,
        next_free: u64,
        sb: Superblock,
        redo: RedoRegion,
        lt: u64,
        entry: LtEntry,
        model_id: u64,
        at: u64,
        old: Vec<u8>,
    }

    fn setup() -> Setup {
        let (mem, next_free) = small_pool(64);
        let mut sbb = [0u8; Superblock::SIZE as usize];
        mem.read(0, &mut sbb).unwrap();
        let sb = Superblock::read(&sbb).unwrap();
        let redo = sb
            .redo_region()
            .unwrap()
            .expect("small pools have a redo log");
        let at = mem.load(sb.directory_entry_offset(0).unwrap()).unwrap();
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        mem.read(at, &mut rb).unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        let lt = r.lt_entry_offset(0).unwrap();
        let entry = LtEntry::from_raw(mem.load(lt).unwrap());
        let region = sb.leaf_region().unwrap();
        let leaf_at = region.leaf_offset(entry.addr()).unwrap();
        let mut old = vec![0u8; region.leaf_size() as usize];
        mem.read(leaf_at, &mut old).unwrap();
        assert!(is_valid_leaf(&old));
        Setup {
            mem,
            next_free,
            sb,
            redo,
            lt,
            entry,
            model_id: r.model_id(),
            at: leaf_at,
            old,
        }
    }

    impl Setup {
        /// The leaf with `key` (inside its fences) added: a sealed image.
        fn image_with(&self, key_from_lo: u64) -> Vec<u8> {
            let mut new = self.old.clone();
            let l = Leaf::from_bytes_mut(&mut new).unwrap();
            let key = l.fence_lo() + key_from_lo;
            assert!(key <= l.fence_hi());
            l.upsert(key, SlotValue::from_u64(key ^ 0xABCD)).unwrap();
            l.seal();
            assert!(is_valid_leaf(&new));
            new
        }

        /// Block `b` claimed by `owner`.
        fn claim(&self, b: u32, owner: LockOwner) {
            let c = RedoClaim::new(owner, 0x1000 + b);
            self.mem
                .store(self.redo.claim_offset(b).unwrap(), c.raw())
                .unwrap();
        }

        fn claim_word(&self, b: u32) -> u64 {
            self.mem.load(self.redo.claim_offset(b).unwrap()).unwrap()
        }

        /// Writes an entry into slot `s` of block `b`, under the block's
        /// claim ([`Setup::claim`]'s nonce); returns the slot's pool
        /// offset.
        fn put(&self, b: u32, s: u32, e: RedoEntry<'_>) -> u64 {
            self.put_as(
                b,
                s,
                RedoEntry {
                    nonce: 0x1000 + b,
                    ..e
                },
            )
        }

        /// [`Setup::put`] with the entry's own nonce.
        fn put_as(&self, b: u32, s: u32, e: RedoEntry<'_>) -> u64 {
            let mut slot = vec![0u8; self.redo.slot_len() as usize];
            e.encode(&mut slot).unwrap();
            let at = self.redo.slot_offset(b, s).unwrap();
            self.mem.write(at, &slot).unwrap();
            at
        }

        /// The chain locked by `owner`, its leaf torn by a write of `new`
        /// cut in the middle.
        fn tear(&self, owner: LockOwner, new: &[u8]) -> Vec<u8> {
            self.mem
                .store(self.lt, self.entry.locked_by(owner).raw())
                .unwrap();
            let mut torn = self.old.clone();
            let cut = new.len() / 2;
            torn[..cut].copy_from_slice(&new[..cut]);
            assert!(!is_valid_leaf(&torn), "the cut leaves a torn leaf");
            self.mem.write(self.at, &torn).unwrap();
            torn
        }

        fn leaf(&self) -> Vec<u8> {
            let mut b = vec![0u8; self.old.len()];
            self.mem.read(self.at, &mut b).unwrap();
            b
        }

        fn reap(&self, dead: LockOwner) -> (u64, Vec<DamagedLeaf>) {
            let mut named = Vec::new();
            let n = release_locks_reporting(&self.mem, &self.sb, |o| o == dead, |d| named.push(d))
                .unwrap();
            (n, named)
        }
    }

    fn entry(owner: LockOwner, seq: u64, target: u64, image: &[u8]) -> RedoEntry<'_> {
        RedoEntry {
            owner,
            nonce: 0,
            seq,
            target,
            image,
        }
    }

    /// Every key of `image` is found in the leaf at `s.at` as it is now.
    fn every_key_readable(s: &Setup, image: &[u8]) {
        let now = s.leaf();
        let leaf = Leaf::from_bytes(&now).unwrap().validate().unwrap();
        let want = Leaf::from_bytes(image).unwrap().validate().unwrap();
        assert!(!want.is_empty());
        for slot in want.entries() {
            assert_eq!(leaf.get(slot.key()), slot.value(), "key {}", slot.key());
        }
    }

    #[test]
    fn the_reaper_restores_a_torn_leaf_from_its_newest_entry_and_frees_the_blocks() {
        let s = setup();
        let older = s.image_with(1);
        let newer = s.image_with(2);
        // Two blocks of the dead holder (two clients of one process), the
        // newest entry in the first slot: slot order does not matter.
        s.claim(0, DEAD);
        s.claim(2, DEAD);
        s.put(0, 0, entry(DEAD, 9, s.at, &newer));
        s.put(2, 3, entry(DEAD, 5, s.at, &older));
        s.claim(1, ALIVE);
        s.tear(DEAD, &newer);

        let (released, named) = s.reap(DEAD);
        assert_eq!(released, 1);
        assert_eq!(named.len(), 1, "{named:?}");
        assert_eq!(named[0].model_id, s.model_id);
        assert_eq!(named[0].leaf, s.entry.addr());
        assert!(matches!(named[0].error, LeafError::ChecksumMismatch { .. }));
        assert_eq!(
            named[0].restored,
            Some(Restored {
                owner: DEAD,
                seq: 9
            })
        );
        assert_eq!(s.leaf(), newer, "the newest whole image, byte for byte");
        every_key_readable(&s, &newer);
        let mut buf = Vec::new();
        crate::leaves::read_leaf(
            &s.mem,
            &s.sb.leaf_region().unwrap(),
            s.entry.addr(),
            &mut buf,
        )
        .expect("readers find the leaf whole");
        assert_eq!(
            LtEntry::from_raw(s.mem.load(s.lt).unwrap()),
            s.entry.locked_by(DEAD).without_lock(),
            "the chain is released"
        );
        assert_eq!((s.claim_word(0), s.claim_word(2)), (0, 0), "freed");
        assert_eq!(
            RedoClaim::from_raw(s.claim_word(1)).owner(),
            Some(ALIVE),
            "a live holder's block is kept"
        );
        // Idempotent: nothing left to release, name or free.
        assert_eq!(s.reap(DEAD), (0, Vec::new()));
        assert_eq!(s.leaf(), newer);
    }

    #[test]
    fn entries_that_are_not_the_torn_writes_image_are_ignored() {
        // Each case: the entries it writes (block claimed by DEAD unless
        // it says otherwise); the leaf is torn by `new` every time.
        type Case = fn(&Setup, &[u8]);
        let cases: [(&str, Case); 7] = [
            ("an entry of an earlier claim of the block", |s, new| {
                s.claim(0, DEAD);
                s.put_as(
                    0,
                    0,
                    RedoEntry {
                        nonce: 0x0FFF,
                        ..entry(DEAD, 9, s.at, new)
                    },
                );
            }),
            (
                "another owner's entry in the dead holder's block",
                |s, new| {
                    s.claim(0, DEAD);
                    s.put(0, 0, entry(ALIVE, 9, s.at, new));
                },
            ),
            ("the dead holder's entry in another's block", |s, new| {
                s.claim(0, ALIVE);
                s.put(0, 0, entry(DEAD, 9, s.at, new));
            }),
            ("a torn entry", |s, new| {
                s.claim(0, DEAD);
                let at = s.put(0, 0, entry(DEAD, 9, s.at, new));
                // A byte of the image cut off its end: the checksum fails.
                let last = at + rolex_core::layout::RedoHeader::SIZE + new.len() as u64 - 1;
                let mut b = [0u8; 1];
                s.mem.read(last, &mut b).unwrap();
                s.mem.write(last, &[b[0] ^ 0xFF]).unwrap();
            }),
            ("an image of another length", |s, _| {
                s.claim(0, DEAD);
                let mut short = vec![0u8; Leaf::size_for(2) as usize];
                let l = Leaf::from_bytes_mut(&mut short).unwrap();
                let old = Leaf::from_bytes(&s.old).unwrap();
                l.init(old.fence_lo(), old.fence_hi()).unwrap();
                l.seal();
                assert!(is_valid_leaf(&short), "a valid leaf, of 2 slots");
                s.put(0, 0, entry(DEAD, 9, s.at, &short));
            }),
            ("an image that does not validate", |s, new| {
                s.claim(0, DEAD);
                let mut bad = new.to_vec();
                let n = bad.len();
                bad[n - 1] ^= 0xFF;
                assert!(!is_valid_leaf(&bad));
                s.put(0, 0, entry(DEAD, 9, s.at, &bad));
            }),
            ("an entry for another leaf", |s, new| {
                s.claim(0, DEAD);
                s.put(0, 0, entry(DEAD, 9, s.at + s.old.len() as u64, new));
            }),
        ];
        for (what, write) in cases {
            let s = setup();
            let new = s.image_with(1);
            write(&s, &new);
            let torn = s.tear(DEAD, &new);
            let (released, named) = s.reap(DEAD);
            assert_eq!(released, 1, "{what}");
            assert_eq!(named.len(), 1, "{what}: {named:?}");
            assert_eq!(named[0].restored, None, "{what}: reported torn");
            assert_eq!(s.leaf(), torn, "{what}: left as it was");
            assert!(!LtEntry::from_raw(s.mem.load(s.lt).unwrap()).is_locked());
            let owner = RedoClaim::from_raw(s.claim_word(0)).owner();
            assert!(owner.is_none() || owner == Some(ALIVE), "{what}: {owner:?}");
        }
    }

    #[test]
    fn a_copy_older_than_the_torn_leaf_is_refused() {
        let s = setup();
        // The holder's copy is of a write (version + 1) that a later one
        // (version + 2, by a client of it without a copy) followed; the
        // later one tore.
        let copied = s.image_with(1);
        let mut later = copied.clone();
        let l = Leaf::from_bytes_mut(&mut later).unwrap();
        l.upsert(l.fence_lo() + 2, SlotValue::from_u64(1)).unwrap();
        l.seal();
        s.claim(0, DEAD);
        s.put(0, 0, entry(DEAD, 9, s.at, &copied));
        let torn = s.tear(DEAD, &later);
        let (released, named) = s.reap(DEAD);
        assert_eq!((released, named.len()), (1, 1));
        assert_eq!(named[0].restored, None, "reported torn");
        assert_eq!(s.leaf(), torn, "left as it was");
        // Equal versions (the tear kept the old version word) are the
        // torn write's own copy: taken.
        let s = setup();
        let new = s.image_with(1);
        s.claim(0, DEAD);
        s.put(0, 0, entry(DEAD, 9, s.at, &new));
        s.mem.store(s.lt, s.entry.locked_by(DEAD).raw()).unwrap();
        let mut torn = s.old.clone();
        torn[Leaf::HEADER_SIZE..].copy_from_slice(&new[Leaf::HEADER_SIZE..]);
        assert!(!is_valid_leaf(&torn));
        s.mem.write(s.at, &torn).unwrap();
        let (_, named) = s.reap(DEAD);
        assert!(named[0].restored.is_some(), "{named:?}");
        assert_eq!(s.leaf(), new);
    }

    #[test]
    fn a_live_holders_torn_leaf_is_neither_touched_nor_named() {
        let s = setup();
        let new = s.image_with(1);
        s.claim(0, ALIVE);
        s.put(0, 0, entry(ALIVE, 9, s.at, &new));
        let torn = s.tear(ALIVE, &new);
        assert_eq!(s.reap(DEAD), (0, Vec::new()));
        assert_eq!(s.leaf(), torn, "its writer writes it again itself");
        assert_ne!(s.claim_word(0), 0);
    }

    #[test]
    fn the_resume_restores_an_anonymous_holders_torn_leaf_and_frees_every_block() {
        let s = setup();
        let new = s.image_with(3);
        s.claim(1, LockOwner::ANONYMOUS);
        s.put(1, 2, entry(LockOwner::ANONYMOUS, 1, s.at, &new));
        s.claim(3, ALIVE);
        s.tear(LockOwner::ANONYMOUS, &new);
        let (_, rec) = Agent::resume(&s.mem, AgentConfig::default(), s.next_free).unwrap();
        assert_eq!(rec.restored_count, 1, "{rec:?}");
        assert_eq!(
            rec.restored[0].restored,
            Some(Restored {
                owner: LockOwner::ANONYMOUS,
                seq: 1
            })
        );
        assert_eq!((rec.damaged_count, rec.compute_locks_released), (0, 1));
        assert_eq!(rec.redo_blocks_freed, 2);
        assert_eq!(s.leaf(), new);
        every_key_readable(&s, &new);
        assert!(!LtEntry::from_raw(s.mem.load(s.lt).unwrap()).is_locked());
        for b in 0..s.redo.blocks() {
            assert_eq!(s.claim_word(b), 0, "block {b}");
        }
    }

    /// A resume killed after each of its mutations in turn (the restore,
    /// the lock releases, the blocks freed, the later steps): the next one
    /// finds the leaf whole, nothing damaged, every block free.
    #[test]
    fn a_resume_killed_after_each_mutation_is_resumed_with_the_leaf_restored() {
        let mut completed_at = None;
        for crash in 0..500u64 {
            let s = setup();
            let new = s.image_with(3);
            s.claim(0, DEAD);
            s.claim(2, LockOwner::ANONYMOUS);
            s.put(0, 1, entry(DEAD, 2, s.at, &new));
            s.tear(DEAD, &new);
            s.mem.crash_after(crash);
            let died = Agent::resume(&s.mem, AgentConfig::default(), s.next_free).is_err();
            s.mem.revive();
            let (_, rec) = Agent::resume(&s.mem, AgentConfig::default(), s.next_free)
                .unwrap_or_else(|e| panic!("resume after a death at {crash} mutations: {e}"));
            assert_eq!(rec.damaged_count, 0, "after a death at {crash}: {rec:?}");
            assert_eq!(s.leaf(), new, "after a death at {crash}");
            assert!(!LtEntry::from_raw(s.mem.load(s.lt).unwrap()).is_locked());
            for b in 0..s.redo.blocks() {
                assert_eq!(s.claim_word(b), 0, "block {b} after a death at {crash}");
            }
            if !died {
                completed_at = Some(crash);
                break;
            }
        }
        let n = completed_at.expect("a resume completed");
        eprintln!("a resume killed after each of its first {n} mutations: every next one whole");
        assert!(
            n > 3,
            "the restore, the release and two frees are mutations"
        );
    }

    #[test]
    fn the_resume_reports_a_torn_leaf_without_a_copy_as_damaged() {
        let s = setup();
        let new = s.image_with(3);
        s.claim(1, LockOwner(9));
        s.put(1, 0, entry(LockOwner(9), 4, s.at, &new));
        // Locked by another holder than the copy's.
        s.tear(LockOwner(8), &new);
        let (_, rec) = Agent::resume(&s.mem, AgentConfig::default(), s.next_free).unwrap();
        assert_eq!((rec.restored_count, rec.damaged_count), (0, 1), "{rec:?}");
        assert_eq!(rec.damaged[0].restored, None);
        assert_eq!(rec.redo_blocks_freed, 1);
    }

    #[test]
    fn copies_are_read_once_and_only_when_a_leaf_is_torn() {
        let s = setup();
        let new = s.image_with(1);
        s.claim(0, DEAD);
        s.put(0, 0, entry(DEAD, 9, s.at, &new));
        let copies = RedoCopies::read(&s.mem, &s.redo, s.old.len() as u64, |o| o == DEAD).unwrap();
        assert_eq!((copies.blocks_read(), copies.len()), (1, 1));
        assert_eq!(copies.newest(DEAD, s.at), Some((9, new.as_slice())));
        assert_eq!(
            newest_entry(&s.mem, &s.sb, DEAD, s.at, s.old.len() as u64).unwrap(),
            Some((9, new.clone()))
        );
        assert_eq!(
            newest_entry(&s.mem, &s.sb, ALIVE, s.at, s.old.len() as u64).unwrap(),
            None
        );
        // A whole chain: the mender does not read the log.
        s.mem.store(s.lt, s.entry.locked_by(DEAD).raw()).unwrap();
        let mut m = Mender::new(s.sb.leaf_region().unwrap(), Some(s.redo), |o| o == DEAD);
        let mut named = 0;
        m.mend_chain(&s.mem, 0, s.entry.locked_by(DEAD), |_| named += 1)
            .unwrap();
        assert!(!m.read_log());
        assert_eq!(named, 0);
        // Freeing is by owner, from the word read.
        s.claim(1, ALIVE);
        assert_eq!(free_blocks_of(&s.mem, &s.redo, |o| o == DEAD).unwrap(), 1);
        assert_eq!(free_blocks_of(&s.mem, &s.redo, |o| o == DEAD).unwrap(), 0);
        s.mem.store(s.redo.claim_offset(2).unwrap(), 77).unwrap();
        assert_eq!(
            free_all_blocks(&s.mem, &s.redo).unwrap(),
            2,
            "a claim and a stray word"
        );
    }
}
