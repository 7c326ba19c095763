//! A leaf: a small header and `L` sorted (key, value) slots, validated as a
//! whole so that a torn one-sided read is always detected.
//!
//! Readers fetch leaves with one-sided READs that race with writers, and the
//! fabric gives no order inside a message, so a leaf carries a checksum of
//! every other byte it holds. The invariant: a leaf that passes
//! [`Leaf::validate`] is byte-for-byte a leaf some writer sealed (up to an
//! xxh3-64 collision) *and* is structurally sound — the used prefix is sorted
//! by strictly increasing key, every key lies in the inclusive fences, the
//! count fits the slots. Searches are only offered on a [`ValidLeaf`].

use core::fmt;

use xxhash_rust::xxh3::xxh3_64;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::value::SlotValue;
use crate::entry::{LeafAddr, LockOwner, LtEntry};

/// A leaf that is torn, corrupted or structurally wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeafError {
    /// The buffer is not `Leaf::HEADER_SIZE + k * Leaf::SLOT_SIZE` bytes.
    BadLength {
        /// Its length.
        len: usize,
    },
    /// The stored checksum does not match the contents (a torn read or
    /// corruption).
    ChecksumMismatch {
        /// The checksum word.
        stored: u64,
        /// The checksum of the other bytes.
        computed: u64,
    },
    /// The flags word has bits this layout version does not define.
    UnknownFlags {
        /// The flags word.
        flags: u32,
    },
    /// `fence_lo > fence_hi`.
    FencesInverted {
        /// The low fence.
        lo: u64,
        /// The high fence.
        hi: u64,
    },
    /// The synonym link is locked, or names a leaf while its pointer says
    /// "none".
    BadLink {
        /// The link word.
        raw: u64,
    },
    /// More used slots than the leaf has.
    CountExceedsCapacity {
        /// The slot count.
        count: u32,
        /// The number of slots.
        capacity: usize,
    },
    /// The key at `index` is not greater than the key before it.
    KeysNotIncreasing {
        /// The slot index.
        index: usize,
    },
    /// The key at `index` is outside `[fence_lo, fence_hi]`.
    KeyOutsideFences {
        /// The slot index.
        index: usize,
        /// The key.
        key: u64,
    },
    /// The value words of the slot at `index` are not a value
    /// ([`SlotValue`]).
    BadValue {
        /// The slot index.
        index: usize,
    },
}

impl fmt::Display for LeafError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BadLength { len } => write!(
                f,
                "{len} bytes is not a leaf ({} + a multiple of {})",
                Leaf::HEADER_SIZE,
                Leaf::SLOT_SIZE
            ),
            Self::ChecksumMismatch { stored, computed } => write!(
                f,
                "leaf checksum {stored:#018x} does not match contents ({computed:#018x}): torn or corrupted"
            ),
            Self::UnknownFlags { flags } => write!(f, "leaf flags {flags:#x} are not defined"),
            Self::FencesInverted { lo, hi } => {
                write!(f, "leaf fences inverted: fence_lo {lo} > fence_hi {hi}")
            }
            Self::BadLink { raw } => write!(f, "leaf synonym link {raw:#018x} is malformed"),
            Self::CountExceedsCapacity { count, capacity } => {
                write!(f, "leaf count {count} exceeds its {capacity} slots")
            }
            Self::KeysNotIncreasing { index } => {
                write!(f, "leaf key at slot {index} is not above the key before it")
            }
            Self::KeyOutsideFences { index, key } => {
                write!(f, "leaf key {key} at slot {index} is outside the fences")
            }
            Self::BadValue { index } => {
                write!(f, "leaf slot {index} holds no valid value (length/generation)")
            }
        }
    }
}

impl core::error::Error for LeafError {}

/// A leaf edit that was refused; the leaf is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EditError {
    /// Every slot is used: the pair is handed back.
    Full {
        /// The key.
        key: u64,
        /// The value.
        value: SlotValue,
    },
    /// The key lies outside the leaf's fences.
    OutsideFences {
        /// The key.
        key: u64,
    },
    /// The new contents would not be a valid leaf.
    Invalid(LeafError),
}

impl fmt::Display for EditError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Full { key, .. } => write!(f, "leaf full: cannot insert key {key}"),
            Self::OutsideFences { key } => write!(f, "key {key} is outside the leaf's fences"),
            Self::Invalid(e) => write!(f, "edit would break the leaf: {e}"),
        }
    }
}

impl core::error::Error for EditError {}

/// One (key, value) slot of a leaf: the key and a [`SlotValue`], inline
/// bytes or a pointer to a value block.
///
/// ```text
/// offset  size  field
///      0     8  key   (u64 LE)
///      8     8  word  inline: the value's bytes, zero past len
///                     block:  pool offset of the value block
///     16     4  len   the value's length in bytes
///     20     4  gen   0: inline (len <= INLINE_MAX); else the block's
///                     generation (len > INLINE_MAX)
/// ```
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, PartialEq, Eq, Default,
)]
#[repr(C)]
pub struct Slot {
    key: U64,
    word: U64,
    len: U32,
    gen: U32,
}

const _: () = assert!(core::mem::size_of::<Slot>() == 24);

impl Slot {
    /// A slot holding `key` → `value`.
    pub fn new(key: u64, value: SlotValue) -> Self {
        let (word, len, gen) = value.encode();
        Self {
            key: U64::new(key),
            word: U64::new(word),
            len: U32::new(len),
            gen: U32::new(gen),
        }
    }

    /// A slot holding `key` → the 8-byte value `value` (inline).
    pub fn with_u64(key: u64, value: u64) -> Self {
        Self::new(key, SlotValue::from_u64(value))
    }

    /// The key.
    pub const fn key(&self) -> u64 {
        self.key.get()
    }

    /// The value, or `None` if the slot's words are not one this layout
    /// defines (a validated leaf has none such).
    pub fn value(&self) -> Option<SlotValue> {
        SlotValue::decode(self.word.get(), self.len.get(), self.gen.get())
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value() {
            Some(v) => write!(f, "{} => {v:?}", self.key()),
            None => write!(f, "{} => <bad value>", self.key()),
        }
    }
}

/// The fixed part of a leaf.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug)]
#[repr(C)]
struct LeafHeader {
    checksum: U64,
    version: U64,
    fence_lo: U64,
    fence_hi: U64,
    next: U64,
    count: U32,
    flags: U32,
}

const _: () = assert!(core::mem::size_of::<LeafHeader>() == 48);

/// A leaf as it lies in the pool: a 48-byte header, then `L` slots.
///
/// ```text
/// offset      size  field
///      0         8  checksum  xxh3-64 of bytes [8, end): every byte but itself
///      8         8  version   bumped by every seal (a counter, wrapping)
///     16         8  fence_lo  lowest key the leaf may hold (inclusive)
///     24         8  fence_hi  highest key the leaf may hold (inclusive)
///     32         8  next      synonym link, an LtEntry-format word (below)
///     40         4  count     slots in use, a prefix sorted by key
///     44         4  flags     bit 31 FREED (given back by retraining: no keys,
///                             no link); other bits 0 (reserved)
///     48    24 * L  slots     (key, value: see Slot), keys strictly
///                             increasing over [0, count); unused slots
///                             are zero
/// ```
///
/// **Fences are inclusive**, `[fence_lo, fence_hi]`, so `u64::MAX` is a
/// storable key.
///
/// **The synonym link** `next` names the chain's next leaf physically, so a
/// reader whose cached SLT is stale can still follow the chain: it is an
/// [`LtEntry`]-format word whose region and leaf fields are the next leaf's
/// [`LeafAddr`] and whose pointer field is the SLT slot that leaf was given
/// when linked (1..=255); pointer 0 means "no next leaf", and then the whole
/// word is 0. The lock bit is always 0 here (locks live in the LT only).
///
/// **`L` is a runtime parameter**, not a const generic: `Leaf` is a slice
/// DST whose slot count is the buffer's length, so a compute node that learns
/// `L` from the superblock at connect time handles leaves without
/// monomorphising over it, and casting a READ buffer needs no copy. (The
/// zerocopy derives on a const-generic array would also work, but would put
/// `L` in every caller's type.)
///
/// **Values** are inline up to [`super::value::INLINE_MAX`] bytes, else
/// pointers to value blocks (see [`super::value`]); validation checks that
/// each used slot's words are a value, not what the block holds.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug)]
#[repr(C)]
pub struct Leaf {
    header: LeafHeader,
    slots: [Slot],
}

impl Leaf {
    /// Bytes before the first slot.
    pub const HEADER_SIZE: usize = core::mem::size_of::<LeafHeader>();
    /// Bytes per slot.
    pub const SLOT_SIZE: usize = core::mem::size_of::<Slot>();
    /// Offset of the checksum word.
    pub const CHECKSUM_OFFSET: usize = core::mem::offset_of!(LeafHeader, checksum);
    /// Offset of the version word (a reader that only wants to know whether
    /// a leaf changed can READ the 8 bytes here).
    pub const VERSION_OFFSET: usize = core::mem::offset_of!(LeafHeader, version);
    /// Offset of the inclusive low fence.
    pub const FENCE_LO_OFFSET: usize = core::mem::offset_of!(LeafHeader, fence_lo);
    /// Offset of the inclusive high fence.
    pub const FENCE_HI_OFFSET: usize = core::mem::offset_of!(LeafHeader, fence_hi);
    /// Offset of the synonym link.
    pub const NEXT_OFFSET: usize = core::mem::offset_of!(LeafHeader, next);
    /// Offset of the slot count.
    pub const COUNT_OFFSET: usize = core::mem::offset_of!(LeafHeader, count);
    /// Offset of the flags word.
    pub const FLAGS_OFFSET: usize = core::mem::offset_of!(LeafHeader, flags);
    /// Flag: the leaf was freed by retraining (see [`Self::is_freed`]);
    /// the only flag (since layout version 6).
    pub const FREED: u32 = 1 << 31;

    /// Bytes of a leaf with `slots` slots (`u32` slots cannot overflow).
    pub const fn size_for(slots: u32) -> u64 {
        Self::HEADER_SIZE as u64 + Self::SLOT_SIZE as u64 * slots as u64
    }

    /// Views `bytes` as a leaf; its slot count is implied by the length.
    pub fn from_bytes(bytes: &[u8]) -> Result<&Self, LeafError> {
        Self::ref_from_bytes(bytes).map_err(|_| LeafError::BadLength { len: bytes.len() })
    }

    /// Views `bytes` as a leaf to be edited.
    pub fn from_bytes_mut(bytes: &mut [u8]) -> Result<&mut Self, LeafError> {
        let len = bytes.len();
        Self::mut_from_bytes(bytes).map_err(|_| LeafError::BadLength { len })
    }

    /// Number of slots, `L`.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The stored checksum.
    pub fn checksum(&self) -> u64 {
        self.header.checksum.get()
    }

    /// The checksum the contents call for.
    pub fn compute_checksum(&self) -> u64 {
        xxh3_64(&self.as_bytes()[Self::CHECKSUM_OFFSET + 8..])
    }

    /// The version (bumped by each seal).
    pub fn version(&self) -> u64 {
        self.header.version.get()
    }

    /// The inclusive low fence.
    pub fn fence_lo(&self) -> u64 {
        self.header.fence_lo.get()
    }

    /// The inclusive high fence.
    pub fn fence_hi(&self) -> u64 {
        self.header.fence_hi.get()
    }

    /// The synonym link word, as stored.
    pub fn next(&self) -> LtEntry {
        LtEntry::from_raw(self.header.next.get())
    }

    /// The stored slot count (not yet checked against the capacity).
    pub fn count(&self) -> u32 {
        self.header.count.get()
    }

    /// The flags word.
    pub fn flags(&self) -> u32 {
        self.header.flags.get()
    }

    /// The used slots (the count's prefix, clamped): for a leaf whose structure is
    /// known valid ([`Self::check_structure`]) but whose checksum may not
    /// match (a recovery re-sealing a leaf it knows whole).
    pub fn used_entries(&self) -> &[Slot] {
        self.used()
    }

    /// The used prefix, clamped to the slots the leaf has: safe on any leaf,
    /// meaningful on one whose structure is valid.
    fn used(&self) -> &[Slot] {
        let n = (self.count() as usize).min(self.slots.len());
        &self.slots[..n]
    }

    /// Checks everything but the checksum: flags, fences, link, count, key
    /// order and key range.
    pub fn check_structure(&self) -> Result<(), LeafError> {
        if self.flags() & !Self::FREED != 0 {
            return Err(LeafError::UnknownFlags {
                flags: self.flags(),
            });
        }
        if self.is_freed() && (self.count() != 0 || self.next().raw() != 0) {
            return Err(LeafError::UnknownFlags {
                flags: self.flags(),
            });
        }
        let (lo, hi) = (self.fence_lo(), self.fence_hi());
        if lo > hi {
            return Err(LeafError::FencesInverted { lo, hi });
        }
        let next = self.next();
        if next.is_locked()
            || next.owner() != LockOwner::ANONYMOUS
            || (next.pointer() == 0 && next.raw() != 0)
        {
            return Err(LeafError::BadLink { raw: next.raw() });
        }
        if self.count() as usize > self.slots.len() {
            return Err(LeafError::CountExceedsCapacity {
                count: self.count(),
                capacity: self.slots.len(),
            });
        }
        let mut prev: Option<u64> = None;
        for (index, slot) in self.used().iter().enumerate() {
            let key = slot.key();
            if prev.is_some_and(|p| p >= key) {
                return Err(LeafError::KeysNotIncreasing { index });
            }
            if key < lo || key > hi {
                return Err(LeafError::KeyOutsideFences { index, key });
            }
            if slot.value().is_none() {
                return Err(LeafError::BadValue { index });
            }
            prev = Some(key);
        }
        Ok(())
    }

    /// Checks the checksum, then the structure; on success the leaf can be
    /// searched.
    pub fn validate(&self) -> Result<ValidLeaf<'_>, LeafError> {
        let (stored, computed) = (self.checksum(), self.compute_checksum());
        if stored != computed {
            return Err(LeafError::ChecksumMismatch { stored, computed });
        }
        self.check_structure()?;
        Ok(ValidLeaf { leaf: self })
    }

    /// Whether the leaf was given back by retraining ([`Self::FREED`]): it
    /// belongs to no chain, holds nothing, and a reader that reaches it
    /// through a stale cache or link must refresh.
    pub fn is_freed(&self) -> bool {
        self.flags() & Self::FREED != 0
    }

    /// Marks the leaf freed ([`Self::FREED`]): no keys, no link, fences
    /// kept (so a stale reader still sees which range it no longer
    /// serves). Seal it before it is written to the pool.
    pub fn mark_freed(&mut self) {
        let (lo, hi, version) = (self.fence_lo(), self.fence_hi(), self.version());
        self.as_mut_bytes().fill(0);
        self.header.version.set(version);
        self.header.fence_lo.set(lo);
        self.header.fence_hi.set(hi);
        self.header.flags.set(Self::FREED);
    }

    /// Raises the high fence to `fence_hi` (`≥` the current one): how
    /// retraining hands an emptied successor's range to the leaf before
    /// it. The keys held stay inside the fences. Seal it before it is
    /// written to the pool.
    pub fn extend_fence_hi(&mut self, fence_hi: u64) -> Result<(), EditError> {
        if fence_hi < self.fence_hi() {
            return Err(EditError::Invalid(LeafError::FencesInverted {
                lo: self.fence_hi(),
                hi: fence_hi,
            }));
        }
        self.header.fence_hi.set(fence_hi);
        Ok(())
    }

    /// Makes this an empty leaf for keys `[fence_lo, fence_hi]` with no
    /// synonym, keeping the version so that a reused leaf's next seal still
    /// moves it forward. Seal it before it is written to the pool.
    pub fn init(&mut self, fence_lo: u64, fence_hi: u64) -> Result<(), EditError> {
        if fence_lo > fence_hi {
            return Err(EditError::Invalid(LeafError::FencesInverted {
                lo: fence_lo,
                hi: fence_hi,
            }));
        }
        let version = self.version();
        self.as_mut_bytes().fill(0);
        self.header.version.set(version);
        self.header.fence_lo.set(fence_lo);
        self.header.fence_hi.set(fence_hi);
        Ok(())
    }

    /// Links this leaf to its next synonym: `next` must be unlocked, and
    /// either name a leaf with a nonzero pointer (its SLT slot) or be
    /// [`LtEntry::EMPTY`]; a freed leaf links to nothing (as
    /// [`Self::upsert`]).
    pub fn set_next(&mut self, next: LtEntry) -> Result<(), EditError> {
        if next.raw() != LtEntry::EMPTY.raw() {
            self.refuse_if_freed()?;
        }
        if next.is_locked()
            || next.owner() != LockOwner::ANONYMOUS
            || (next.pointer() == 0 && next.raw() != 0)
        {
            return Err(EditError::Invalid(LeafError::BadLink { raw: next.raw() }));
        }
        self.header.next.set(next.raw());
        Ok(())
    }

    /// Unlinks this leaf from any synonym ([`LtEntry::EMPTY`], which
    /// [`set_next`](Self::set_next) always accepts).
    pub fn clear_next(&mut self) {
        self.header.next.set(LtEntry::EMPTY.raw());
    }

    /// Inserts `key` → `value`, or replaces the value of `key` and returns
    /// the old one. Assumes a valid structure (as after [`init`](Self::init)
    /// or [`validate`](Self::validate)); never panics on any leaf. A freed
    /// leaf ([`Self::is_freed`]) holds no key: it is refused
    /// ([`EditError::Invalid`], as [`Self::validate`] would name the
    /// result), and [`init`](Self::init) makes it a leaf again.
    pub fn upsert(&mut self, key: u64, value: SlotValue) -> Result<Option<SlotValue>, EditError> {
        self.refuse_if_freed()?;
        if key < self.fence_lo() || key > self.fence_hi() {
            return Err(EditError::OutsideFences { key });
        }
        let n = self.used().len();
        match self.used().binary_search_by_key(&key, Slot::key) {
            Ok(i) => {
                let old = self.slots[i].value();
                self.slots[i] = Slot::new(key, value);
                // A slot of an unchecked leaf may hold no value: report
                // it as the inline empty value rather than panic.
                Ok(Some(old.unwrap_or(SlotValue::Inline {
                    len: 0,
                    bytes: [0; 8],
                })))
            }
            Err(_) if n == self.slots.len() => Err(EditError::Full { key, value }),
            Err(i) => {
                self.slots.copy_within(i..n, i + 1);
                self.slots[i] = Slot::new(key, value);
                self.header.count.set(n as u32 + 1);
                Ok(None)
            }
        }
    }

    /// Removes `key`, returning its value; vacated slots are zeroed.
    pub fn remove(&mut self, key: u64) -> Option<SlotValue> {
        let n = self.used().len();
        let i = self.used().binary_search_by_key(&key, Slot::key).ok()?;
        let old = self.slots[i].value().unwrap_or(SlotValue::Inline {
            len: 0,
            bytes: [0; 8],
        });
        self.slots.copy_within(i + 1..n, i);
        self.slots[n - 1] = Slot::default();
        self.header.count.set(n as u32 - 1);
        Some(old)
    }

    /// Replaces the contents with `entries` (sorted, inside the fences, at
    /// most `L`), zeroing the rest: how a writer redistributes a chain. A
    /// freed leaf takes none (as [`Self::upsert`]).
    pub fn set_entries(&mut self, entries: &[Slot]) -> Result<(), EditError> {
        if !entries.is_empty() {
            self.refuse_if_freed()?;
        }
        if entries.len() > self.slots.len() {
            return Err(EditError::Invalid(LeafError::CountExceedsCapacity {
                count: u32::try_from(entries.len()).unwrap_or(u32::MAX),
                capacity: self.slots.len(),
            }));
        }
        let (lo, hi) = (self.fence_lo(), self.fence_hi());
        for (index, slot) in entries.iter().enumerate() {
            if index > 0 && entries[index - 1].key() >= slot.key() {
                return Err(EditError::Invalid(LeafError::KeysNotIncreasing { index }));
            }
            if slot.key() < lo || slot.key() > hi {
                return Err(EditError::Invalid(LeafError::KeyOutsideFences {
                    index,
                    key: slot.key(),
                }));
            }
        }
        self.slots[..entries.len()].copy_from_slice(entries);
        self.slots[entries.len()..].fill(Slot::default());
        // `entries.len() <= L`, and `L` fits `u32` for any leaf a superblock
        // describes; saturate rather than wrap for a larger buffer.
        self.header
            .count
            .set(u32::try_from(entries.len()).unwrap_or(u32::MAX));
        Ok(())
    }

    /// The error of an edit that would give a freed leaf keys or a link
    /// (what [`Self::check_structure`] says of such a leaf).
    fn refuse_if_freed(&self) -> Result<(), EditError> {
        if self.is_freed() {
            return Err(EditError::Invalid(LeafError::UnknownFlags {
                flags: self.flags(),
            }));
        }
        Ok(())
    }

    /// Bumps the version and recomputes the checksum: the last step before a
    /// writer writes the leaf.
    pub fn seal(&mut self) {
        self.header.version.set(self.version().wrapping_add(1));
        let sum = self.compute_checksum();
        self.header.checksum.set(sum);
    }
}

/// A leaf that passed [`Leaf::validate`]: sorted, within its fences, intact.
#[derive(Clone, Copy, Debug)]
pub struct ValidLeaf<'a> {
    leaf: &'a Leaf,
}

impl<'a> ValidLeaf<'a> {
    /// The underlying leaf.
    pub fn leaf(&self) -> &'a Leaf {
        self.leaf
    }

    /// The used slots, sorted by strictly increasing key.
    pub fn entries(&self) -> &'a [Slot] {
        self.leaf.used()
    }

    /// Number of used slots.
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether no slot is used.
    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }

    /// Whether every slot is used.
    pub fn is_full(&self) -> bool {
        self.len() == self.leaf.capacity()
    }

    /// The version.
    pub fn version(&self) -> u64 {
        self.leaf.version()
    }

    /// Whether `key` lies in this leaf's fences `[fence_lo, fence_hi]`.
    pub fn covers(&self, key: u64) -> bool {
        (self.leaf.fence_lo()..=self.leaf.fence_hi()).contains(&key)
    }

    /// The next synonym leaf, if linked: its address and its SLT slot.
    pub fn next_synonym(&self) -> Option<(LeafAddr, u8)> {
        let next = self.leaf.next();
        (next.pointer() != 0).then(|| (next.addr(), next.pointer()))
    }

    /// `Ok(index)` of `key`, or `Err(index)` where it would be inserted.
    pub fn search(&self, key: u64) -> Result<usize, usize> {
        self.entries().binary_search_by_key(&key, Slot::key)
    }

    /// The value stored for `key`.
    pub fn get(&self, key: u64) -> Option<SlotValue> {
        // A valid leaf's used slots all hold values.
        self.search(key)
            .ok()
            .and_then(|i| self.entries()[i].value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    fn u(v: u64) -> SlotValue {
        SlotValue::from_u64(v)
    }
    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;
    use std::vec::Vec;

    fn buffer(slots: u32) -> Vec<u8> {
        std::vec![0u8; Leaf::size_for(slots) as usize]
    }

    /// A sealed leaf of `slots` slots holding `entries` within `[lo, hi]`.
    fn sealed(slots: u32, lo: u64, hi: u64, entries: &[(u64, u64)]) -> Vec<u8> {
        let mut bytes = buffer(slots);
        let leaf = Leaf::from_bytes_mut(&mut bytes).unwrap();
        leaf.init(lo, hi).unwrap();
        for &(k, v) in entries {
            leaf.upsert(k, u(v)).unwrap();
        }
        leaf.seal();
        bytes
    }

    #[test]
    fn header_offsets_match_the_diagram() {
        assert_eq!(Leaf::CHECKSUM_OFFSET, 0);
        assert_eq!(Leaf::VERSION_OFFSET, 8);
        assert_eq!(Leaf::FENCE_LO_OFFSET, 16);
        assert_eq!(Leaf::FENCE_HI_OFFSET, 24);
        assert_eq!(Leaf::NEXT_OFFSET, 32);
        assert_eq!(Leaf::COUNT_OFFSET, 40);
        assert_eq!(Leaf::FLAGS_OFFSET, 44);
        assert_eq!(Leaf::HEADER_SIZE, 48);
        assert_eq!(Leaf::size_for(16), 48 + 384);
    }

    #[test]
    fn lengths_that_are_not_leaves_are_rejected() {
        assert_eq!(
            Leaf::from_bytes(&[0u8; 47]).unwrap_err(),
            LeafError::BadLength { len: 47 }
        );
        assert_eq!(
            Leaf::from_bytes(&[0u8; 50]).unwrap_err(),
            LeafError::BadLength { len: 50 }
        );
        assert_eq!(Leaf::from_bytes(&[0u8; 72]).unwrap().capacity(), 1);
    }

    #[test]
    fn unsealed_zero_leaf_is_invalid() {
        let bytes = buffer(4);
        assert!(matches!(
            Leaf::from_bytes(&bytes).unwrap().validate(),
            Err(LeafError::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn u64_max_is_storable_with_inclusive_fences() {
        let bytes = sealed(
            4,
            u64::MAX - 1,
            u64::MAX,
            &[(u64::MAX, 7), (u64::MAX - 1, 6)],
        );
        let leaf = Leaf::from_bytes(&bytes).unwrap().validate().unwrap();
        assert_eq!(leaf.get(u64::MAX), Some(u(7)));
        assert_eq!(leaf.get(u64::MAX - 1), Some(u(6)));
        assert!(leaf.covers(u64::MAX));
    }

    #[test]
    fn edits_keep_order_and_report_refusals() {
        let mut bytes = buffer(3);
        let leaf = Leaf::from_bytes_mut(&mut bytes).unwrap();
        assert!(matches!(leaf.init(5, 4), Err(EditError::Invalid(_))));
        leaf.init(10, 20).unwrap();
        assert_eq!(leaf.upsert(15, u(1)), Ok(None));
        assert_eq!(leaf.upsert(11, u(2)), Ok(None));
        assert_eq!(leaf.upsert(15, u(3)), Ok(Some(u(1))));
        assert_eq!(
            leaf.upsert(9, u(0)),
            Err(EditError::OutsideFences { key: 9 })
        );
        assert_eq!(
            leaf.upsert(21, u(0)),
            Err(EditError::OutsideFences { key: 21 })
        );
        assert_eq!(leaf.upsert(20, u(4)), Ok(None));
        assert_eq!(
            leaf.upsert(12, u(5)),
            Err(EditError::Full {
                key: 12,
                value: u(5)
            })
        );
        assert_eq!(leaf.remove(11), Some(u(2)));
        assert_eq!(leaf.remove(11), None);
        leaf.seal();
        let v = leaf.validate().unwrap();
        let keys: Vec<u64> = v.entries().iter().map(Slot::key).collect();
        assert_eq!(keys, [15, 20]);
        assert_eq!(v.search(16), Err(1));
        assert_eq!(v.search(20), Ok(1));
        assert_eq!(v.version(), 1);
    }

    #[test]
    fn set_entries_checks_what_it_writes() {
        let mut bytes = buffer(2);
        let leaf = Leaf::from_bytes_mut(&mut bytes).unwrap();
        leaf.init(0, 100).unwrap();
        let e = |k| Slot::with_u64(k, k);
        assert_eq!(
            leaf.set_entries(&[e(1), e(1)]),
            Err(EditError::Invalid(LeafError::KeysNotIncreasing {
                index: 1
            }))
        );
        assert_eq!(
            leaf.set_entries(&[e(1), e(101)]),
            Err(EditError::Invalid(LeafError::KeyOutsideFences {
                index: 1,
                key: 101
            }))
        );
        assert!(matches!(
            leaf.set_entries(&[e(1), e(2), e(3)]),
            Err(EditError::Invalid(LeafError::CountExceedsCapacity { .. }))
        ));
        leaf.set_entries(&[e(1), e(2)]).unwrap();
        leaf.seal();
        assert_eq!(leaf.validate().unwrap().get(2), Some(u(2)));
    }

    #[test]
    fn synonym_link_round_trips_and_malformed_links_are_rejected() {
        let mut bytes = buffer(2);
        let leaf = Leaf::from_bytes_mut(&mut bytes).unwrap();
        leaf.init(0, 9).unwrap();
        leaf.seal();
        assert_eq!(leaf.validate().unwrap().next_synonym(), None);
        let link = LtEntry::new(3, 7, 42).unwrap();
        leaf.set_next(link).unwrap();
        leaf.seal();
        let addr = LeafAddr::new(3, 42).unwrap();
        assert_eq!(leaf.validate().unwrap().next_synonym(), Some((addr, 7)));
        assert!(leaf.set_next(link.with_lock()).is_err());
        assert!(leaf.set_next(LtEntry::new(3, 0, 42).unwrap()).is_err());
        // A sealed leaf with a malformed link is rejected by validation.
        leaf.header.next.set(LtEntry::new(3, 0, 42).unwrap().raw());
        leaf.seal();
        assert!(matches!(leaf.validate(), Err(LeafError::BadLink { .. })));
    }

    /// A freed leaf holds no key and no link: edits that would give it
    /// either are refused and it stays valid (found by the fuzz target
    /// `leaf_validate`: an upsert made a valid freed leaf invalid); `init`
    /// makes it a leaf again.
    #[test]
    fn a_freed_leaf_refuses_keys_and_links_and_stays_valid() {
        let mut bytes = sealed(4, 10, 20, &[(11, 1), (12, 2)]);
        let leaf = Leaf::from_bytes_mut(&mut bytes).unwrap();
        leaf.mark_freed();
        leaf.seal();
        assert!(leaf.validate().is_ok());
        let refused = EditError::Invalid(LeafError::UnknownFlags { flags: Leaf::FREED });
        assert_eq!(leaf.upsert(15, SlotValue::from_u64(1)), Err(refused));
        let slot = Slot::new(15, SlotValue::from_u64(1));
        assert_eq!(leaf.set_entries(&[slot]), Err(refused));
        let link = LtEntry::new(3, 0, 1).unwrap();
        assert_eq!(leaf.set_next(link), Err(refused));
        assert_eq!(leaf.set_entries(&[]), Ok(()));
        assert_eq!(leaf.set_next(LtEntry::EMPTY), Ok(()));
        assert_eq!(leaf.remove(11), None);
        leaf.seal();
        assert!(leaf.validate().is_ok() && leaf.is_freed());
        leaf.init(10, 20).unwrap();
        assert_eq!(leaf.upsert(15, SlotValue::from_u64(1)), Ok(None));
        leaf.seal();
        assert_eq!(
            leaf.validate().unwrap().get(15),
            Some(SlotValue::from_u64(1))
        );
    }

    #[test]
    fn structural_errors_are_named_even_with_a_good_checksum() {
        let mut bytes = sealed(4, 10, 20, &[(11, 1), (12, 2)]);
        let leaf = Leaf::from_bytes_mut(&mut bytes).unwrap();
        leaf.header.count.set(5);
        leaf.seal();
        assert_eq!(
            leaf.validate().unwrap_err(),
            LeafError::CountExceedsCapacity {
                count: 5,
                capacity: 4
            }
        );
        leaf.header.count.set(2);
        leaf.slots[1].key.set(11);
        leaf.seal();
        assert_eq!(
            leaf.validate().unwrap_err(),
            LeafError::KeysNotIncreasing { index: 1 }
        );
        leaf.slots[1].key.set(21);
        leaf.seal();
        assert_eq!(
            leaf.validate().unwrap_err(),
            LeafError::KeyOutsideFences { index: 1, key: 21 }
        );
        leaf.slots[1].key.set(12);
        leaf.header.flags.set(1);
        leaf.seal();
        assert_eq!(
            leaf.validate().unwrap_err(),
            LeafError::UnknownFlags { flags: 1 }
        );
        leaf.header.flags.set(0);
        leaf.header.fence_lo.set(30);
        leaf.seal();
        assert_eq!(
            leaf.validate().unwrap_err(),
            LeafError::FencesInverted { lo: 30, hi: 20 }
        );
    }

    /// Slot count, fences and a sorted set of entries inside them.
    fn leaf_contents() -> impl Strategy<Value = (u32, u64, u64, Vec<(u64, u64)>)> {
        (1u32..12, any::<u64>(), any::<u64>()).prop_flat_map(|(slots, a, b)| {
            let (lo, hi) = (a.min(b), a.max(b));
            let map = btree_map(lo..=hi, any::<u64>(), 0..=slots as usize);
            (
                Just(slots),
                Just(lo),
                Just(hi),
                map.prop_map(|m| m.into_iter().collect()),
            )
        })
    }

    /// Applies a sequence of edits (insert or remove) to a sealed image.
    fn edited(image: &[u8], edits: &[(bool, u64, u64)]) -> Vec<u8> {
        let mut bytes = image.to_vec();
        let leaf = Leaf::from_bytes_mut(&mut bytes).unwrap();
        let (lo, hi) = (leaf.fence_lo(), leaf.fence_hi());
        for &(insert, k, v) in edits {
            let k = lo + k % (hi - lo).saturating_add(1).max(1);
            if insert {
                let _ = leaf.upsert(k, u(v));
            } else {
                leaf.remove(k);
            }
        }
        leaf.seal();
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn sealed_leaves_validate_and_find_every_key((slots, lo, hi, entries) in leaf_contents()) {
            let bytes = sealed(slots, lo, hi, &entries);
            let leaf = Leaf::from_bytes(&bytes).unwrap().validate().unwrap();
            prop_assert_eq!(leaf.len(), entries.len());
            for &(k, v) in &entries {
                prop_assert_eq!(leaf.get(k), Some(u(v)));
            }
        }

        #[test]
        fn any_single_bit_flip_is_detected(
            (slots, lo, hi, entries) in leaf_contents(),
            bit in any::<prop::sample::Index>(),
        ) {
            let mut bytes = sealed(slots, lo, hi, &entries);
            let bit = bit.index(bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Leaf::from_bytes(&bytes).unwrap().validate().is_err());
        }

        #[test]
        fn torn_reads_are_detected(
            (slots, lo, hi, entries) in leaf_contents(),
            edits in vec((any::<bool>(), any::<u64>(), any::<u64>()), 0..4),
            words in vec(any::<bool>(), 64),
        ) {
            let old = sealed(slots, lo, hi, &entries);
            let new = edited(&old, &edits);
            prop_assert!(Leaf::from_bytes(&new).unwrap().validate().is_ok());
            // Every split at an 8-byte boundary, both ways round.
            for cut in (8..old.len()).step_by(8) {
                for (a, b) in [(&old, &new), (&new, &old)] {
                    let mut torn = a[..cut].to_vec();
                    torn.extend_from_slice(&b[cut..]);
                    if torn != old && torn != new {
                        prop_assert!(Leaf::from_bytes(&torn).unwrap().validate().is_err());
                    }
                }
            }
            // Any mix of 8-byte words from the two images.
            let torn: Vec<u8> = old
                .chunks(8)
                .zip(new.chunks(8))
                .zip(words.iter().cycle())
                .flat_map(|((o, n), &take_new)| if take_new { n } else { o }.to_vec())
                .collect();
            if torn != old && torn != new {
                prop_assert!(Leaf::from_bytes(&torn).unwrap().validate().is_err());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..400), fix_checksum: bool, key: u64) {
            let mut bytes = bytes;
            let len = bytes.len().saturating_sub(Leaf::HEADER_SIZE) / Leaf::SLOT_SIZE
                * Leaf::SLOT_SIZE
                + Leaf::HEADER_SIZE.min(bytes.len());
            bytes.truncate(len);
            let Ok(leaf) = Leaf::from_bytes_mut(&mut bytes) else {
                prop_assert!(len < Leaf::HEADER_SIZE);
                return Ok(());
            };
            if fix_checksum {
                let sum = leaf.compute_checksum();
                leaf.header.checksum.set(sum);
            }
            if let Ok(valid) = leaf.validate() {
                let found = valid.get(key);
                let linear = valid.entries().iter().find(|s| s.key() == key).and_then(Slot::value);
                prop_assert_eq!(found, linear);
            }
            // Edits on an unchecked leaf must not panic either.
            let _ = leaf.upsert(key, u(1));
            let _ = leaf.remove(key);
        }
    }
}
