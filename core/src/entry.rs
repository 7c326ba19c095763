//! Leaf-table entries: the 64-bit words of a model's leaf table (LT) and
//! synonym leaf table (SLT), and the SLT's slot-use header.
//!
//! An [`LtEntry`] packs `lock:1 | region:7 | pointer:8 | owner:16 | leaf:32`
//! (most significant bit first) into one `u64`, so a compute node locks a
//! leaf chain with a single 8-byte `CAS` on the whole word, and the word says
//! who holds it. The invariant this module keeps: no field is ever silently
//! truncated — constructors reject values that do not fit, and the helpers
//! that change fields (`locked_by`, `without_lock`, `with_pointer`) are pure
//! bit operations on the word, so the value a client computes is exactly the
//! value it compares and swaps.
//!
//! The design's entry is `lock:1 | region:7 | pointer:8 | leaf:48`; 16 of
//! the leaf bits carry the lock's [`LockOwner`] instead (2^32 leaves per
//! region remain), so a memory node can release the locks of a compute node
//! that died holding them (see `rolex_host::kv::lease`) without guessing.
//!
//! Slot 0 of every SLT is not an entry but an [`SltHeader`]: the count of
//! synonym slots claimed so far, advanced by `FAA`.

use core::fmt;

/// A mask of the `bits` low bits.
const fn low_mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// A value that does not fit the field it was meant for, handed back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EntryError {
    /// A leaf-region number above [`LtEntry::MAX_REGION`].
    RegionOutOfRange(u8),
    /// A leaf number above [`LtEntry::MAX_LEAF`].
    LeafOutOfRange(u64),
    /// A slot-use `FAA` returned this count: every synonym slot was already
    /// claimed (see [`SltHeader::claimed_slot`]).
    SltFull(u64),
}

impl fmt::Display for EntryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::RegionOutOfRange(r) => write!(
                f,
                "leaf region {r} does not fit the entry's {}-bit region field (max {})",
                LtEntry::REGION_BITS,
                LtEntry::MAX_REGION
            ),
            Self::LeafOutOfRange(l) => write!(
                f,
                "leaf number {l} does not fit the entry's {}-bit leaf field (max {})",
                LtEntry::LEAF_BITS,
                LtEntry::MAX_LEAF
            ),
            Self::SltFull(n) => write!(
                f,
                "synonym leaf table is full: slot-use count was {n}, capacity {}",
                SltHeader::CAPACITY
            ),
        }
    }
}

impl core::error::Error for EntryError {}

/// The physical address of a leaf: its leaf region and its leaf number in
/// that region (the value `alloc_num` had when the leaf was allocated).
///
/// Both fields are checked on construction to fit an [`LtEntry`], so turning
/// an address into an entry cannot fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LeafAddr {
    region: u8,
    leaf: u64,
}

impl LeafAddr {
    /// The address of leaf `leaf` in leaf region `region`, if both fit an
    /// [`LtEntry`].
    pub const fn new(region: u8, leaf: u64) -> Result<Self, EntryError> {
        if region > LtEntry::MAX_REGION {
            return Err(EntryError::RegionOutOfRange(region));
        }
        if leaf > LtEntry::MAX_LEAF {
            return Err(EntryError::LeafOutOfRange(leaf));
        }
        Ok(Self { region, leaf })
    }

    /// The leaf region number (`0..=LtEntry::MAX_REGION`).
    pub const fn region(self) -> u8 {
        self.region
    }

    /// The leaf number within the region (`0..=LtEntry::MAX_LEAF`).
    pub const fn leaf(self) -> u64 {
        self.leaf
    }
}

/// Who holds a locked [`LtEntry`]: a 16-bit id.
///
/// - [`LockOwner::ANONYMOUS`] (0): a lock whose holder is not recorded — the
///   in-process clients, which cannot die apart from the memory node. Every
///   unlocked entry carries owner 0.
/// - 1 ..= 0xFFFE: a compute node holding a lease from the memory node; when
///   its lease ends (it died), the memory node releases its locks.
/// - [`LockOwner::AGENT`] (0xFFFF): the retraining agent freezing a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LockOwner(pub u16);

impl LockOwner {
    /// No holder recorded.
    pub const ANONYMOUS: Self = Self(0);
    /// The retraining agent.
    pub const AGENT: Self = Self(u16::MAX);

    /// Whether this id names a leased compute node (whose locks a memory
    /// node may release once the lease ends).
    pub const fn is_leased(self) -> bool {
        self.0 != Self::ANONYMOUS.0 && self.0 != Self::AGENT.0
    }
}

/// One leaf-table word: `lock:1 | region:7 | pointer:8 | owner:16 | leaf:32`.
///
/// ```text
///  63  62      56 55      48 47              32 31                          0
/// +---+----------+----------+------------------+----------------------------+
/// |lck|  region  | pointer  |      owner       |            leaf            |
/// +---+----------+----------+------------------+----------------------------+
/// ```
///
/// - `lock`: set while a compute node (or the retraining agent, which freezes
///   a model by locking all its entries) owns the leaf's chain.
/// - `owner`: the [`LockOwner`] of a locked entry; 0 when unlocked.
/// - `region`, `leaf`: the leaf's [`LeafAddr`].
/// - `pointer`: the SLT slot of the leaf's next synonym leaf; 0 = none (slot 0
///   is the [`SltHeader`], never a leaf).
///
/// In the pool an entry is stored as a little-endian `u64`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct LtEntry(u64);

impl LtEntry {
    /// Width of the leaf-number field.
    pub const LEAF_BITS: u32 = 32;
    /// Width of the lock-owner field.
    pub const OWNER_BITS: u32 = 16;
    /// Width of the synonym-pointer field.
    pub const POINTER_BITS: u32 = 8;
    /// Width of the leaf-region field.
    pub const REGION_BITS: u32 = 7;
    /// Width of the lock field.
    pub const LOCK_BITS: u32 = 1;

    /// Position of the leaf-number field's lowest bit.
    pub const LEAF_SHIFT: u32 = 0;
    /// Position of the owner field's lowest bit.
    pub const OWNER_SHIFT: u32 = Self::LEAF_SHIFT + Self::LEAF_BITS;
    /// Position of the pointer field's lowest bit.
    pub const POINTER_SHIFT: u32 = Self::OWNER_SHIFT + Self::OWNER_BITS;
    /// Position of the region field's lowest bit.
    pub const REGION_SHIFT: u32 = Self::POINTER_SHIFT + Self::POINTER_BITS;
    /// Position of the lock bit.
    pub const LOCK_SHIFT: u32 = Self::REGION_SHIFT + Self::REGION_BITS;

    /// The leaf-number bits, in place.
    pub const LEAF_MASK: u64 = low_mask(Self::LEAF_BITS) << Self::LEAF_SHIFT;
    /// The owner bits, in place.
    pub const OWNER_MASK: u64 = low_mask(Self::OWNER_BITS) << Self::OWNER_SHIFT;
    /// The pointer bits, in place.
    pub const POINTER_MASK: u64 = low_mask(Self::POINTER_BITS) << Self::POINTER_SHIFT;
    /// The region bits, in place.
    pub const REGION_MASK: u64 = low_mask(Self::REGION_BITS) << Self::REGION_SHIFT;
    /// The lock bit, in place.
    pub const LOCK_MASK: u64 = low_mask(Self::LOCK_BITS) << Self::LOCK_SHIFT;

    /// The largest leaf-region number.
    pub const MAX_REGION: u8 = low_mask(Self::REGION_BITS) as u8;
    /// The largest SLT slot a pointer can name.
    pub const MAX_POINTER: u8 = low_mask(Self::POINTER_BITS) as u8;
    /// The largest leaf number.
    pub const MAX_LEAF: u64 = low_mask(Self::LEAF_BITS);

    /// The all-zero word: unlocked, region 0, no synonym, leaf 0.
    pub const EMPTY: Self = Self(0);

    /// An unlocked entry for leaf `leaf` of region `region` whose next synonym
    /// is in SLT slot `pointer` (0 = none).
    pub const fn new(region: u8, pointer: u8, leaf: u64) -> Result<Self, EntryError> {
        match LeafAddr::new(region, leaf) {
            Ok(addr) => Ok(Self::for_leaf(addr).with_pointer(pointer)),
            Err(e) => Err(e),
        }
    }

    /// An unlocked entry for `addr` with no synonym.
    pub const fn for_leaf(addr: LeafAddr) -> Self {
        Self(((addr.region as u64) << Self::REGION_SHIFT) | ((addr.leaf) << Self::LEAF_SHIFT))
    }

    /// The entry stored as `raw` (every `u64` is a valid entry).
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The word as stored (and as compared and swapped).
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Whether the lock bit is set.
    pub const fn is_locked(self) -> bool {
        self.0 & Self::LOCK_MASK != 0
    }

    /// The leaf-region number.
    pub const fn region(self) -> u8 {
        ((self.0 & Self::REGION_MASK) >> Self::REGION_SHIFT) as u8
    }

    /// The SLT slot of the next synonym leaf (0 = none).
    pub const fn pointer(self) -> u8 {
        ((self.0 & Self::POINTER_MASK) >> Self::POINTER_SHIFT) as u8
    }

    /// Who holds the lock ([`LockOwner::ANONYMOUS`] when unlocked).
    pub const fn owner(self) -> LockOwner {
        LockOwner(((self.0 & Self::OWNER_MASK) >> Self::OWNER_SHIFT) as u16)
    }

    /// The leaf number.
    pub const fn leaf(self) -> u64 {
        (self.0 & Self::LEAF_MASK) >> Self::LEAF_SHIFT
    }

    /// The leaf's address (region and leaf number).
    pub const fn addr(self) -> LeafAddr {
        LeafAddr {
            region: self.region(),
            leaf: self.leaf(),
        }
    }

    /// The same word locked with no owner recorded
    /// ([`LockOwner::ANONYMOUS`]): `locked_by(LockOwner::ANONYMOUS)`.
    pub const fn with_lock(self) -> Self {
        self.locked_by(LockOwner::ANONYMOUS)
    }

    /// The same word locked by `owner`: the `new` operand of a lock CAS.
    pub const fn locked_by(self, owner: LockOwner) -> Self {
        Self(
            (self.0 & !Self::OWNER_MASK)
                | Self::LOCK_MASK
                | ((owner.0 as u64) << Self::OWNER_SHIFT),
        )
    }

    /// The same word unlocked (lock bit and owner clear): the `expected`
    /// operand of a lock CAS.
    pub const fn without_lock(self) -> Self {
        Self(self.0 & !(Self::LOCK_MASK | Self::OWNER_MASK))
    }

    /// The same word with its pointer replaced (an unlock may carry a new
    /// synonym pointer). A `u8` always fits the 8-bit field.
    pub const fn with_pointer(self, pointer: u8) -> Self {
        Self((self.0 & !Self::POINTER_MASK) | ((pointer as u64) << Self::POINTER_SHIFT))
    }
}

// The five fields tile the word exactly; a `u8` pointer and a `u16` owner
// fill their fields.
const _: () = assert!(
    LtEntry::LOCK_BITS
        + LtEntry::REGION_BITS
        + LtEntry::POINTER_BITS
        + LtEntry::OWNER_BITS
        + LtEntry::LEAF_BITS
        == 64
);
const _: () = assert!(LtEntry::LOCK_SHIFT + LtEntry::LOCK_BITS == 64);
const _: () = assert!(
    LtEntry::LEAF_MASK
        ^ LtEntry::OWNER_MASK
        ^ LtEntry::POINTER_MASK
        ^ LtEntry::REGION_MASK
        ^ LtEntry::LOCK_MASK
        == u64::MAX
);
const _: () = assert!(LtEntry::POINTER_BITS == u8::BITS);
const _: () = assert!(LtEntry::OWNER_BITS == u16::BITS);

impl fmt::Debug for LtEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LtEntry")
            .field("lock", &self.is_locked())
            .field("region", &self.region())
            .field("pointer", &self.pointer())
            .field("owner", &self.owner().0)
            .field("leaf", &self.leaf())
            .finish()
    }
}

/// Slot 0 of a synonym leaf table: how many synonym slots have been claimed.
///
/// A compute node that needs a synonym leaf does `FAA(slot 0, +1)`; the value
/// it gets back, `n`, means it owns slot `n + 1` (see
/// [`claimed_slot`](Self::claimed_slot)). Slots `1..=255` are usable, so the
/// table is full once the count reaches [`CAPACITY`](Self::CAPACITY) = 255.
/// Racing `FAA`s on a full table keep incrementing the word past 255; any
/// count `>= 255` is read as *full* (never wrapped or truncated to a small
/// count), and a claim that fetched such a count owns no slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct SltHeader(u64);

impl SltHeader {
    /// Words in an SLT: the header plus one slot per possible pointer value.
    pub const SLOTS: usize = 1 << LtEntry::POINTER_BITS;
    /// Usable synonym slots (all but slot 0).
    pub const CAPACITY: u64 = Self::SLOTS as u64 - 1;
    /// The slot whose claim puts the model into the retraining queue (the
    /// model has then used 2^7 synonym slots). Exactly one claimant gets it.
    pub const RETRAIN_SLOT: u8 = 1 << 7;

    /// The header stored as `raw` (every `u64` is a valid header).
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The word as stored.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Synonym slots in use, saturated at [`CAPACITY`](Self::CAPACITY).
    pub const fn used(self) -> u64 {
        if self.0 > Self::CAPACITY {
            Self::CAPACITY
        } else {
            self.0
        }
    }

    /// Whether no synonym slot is left.
    pub const fn is_full(self) -> bool {
        self.0 >= Self::CAPACITY
    }

    /// The slot owned by a claimant whose `FAA(+1)` returned `fetched`, or
    /// [`EntryError::SltFull`] if the table was already full.
    pub const fn claimed_slot(fetched: u64) -> Result<u8, EntryError> {
        if fetched >= Self::CAPACITY {
            Err(EntryError::SltFull(fetched))
        } else {
            Ok((fetched + 1) as u8)
        }
    }

    /// Whether the claimant of `slot` must enqueue the model for retraining.
    pub const fn triggers_retraining(slot: u8) -> bool {
        slot == Self::RETRAIN_SLOT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn masks_match_the_diagram() {
        assert_eq!(LtEntry::LOCK_MASK, 1 << 63);
        assert_eq!(LtEntry::REGION_MASK, 0x7f << 56);
        assert_eq!(LtEntry::POINTER_MASK, 0xff << 48);
        assert_eq!(LtEntry::OWNER_MASK, 0xffff << 32);
        assert_eq!(LtEntry::LEAF_MASK, (1 << 32) - 1);
        let e = LtEntry::new(0x55, 0xaa, 0x5678_9abc)
            .unwrap()
            .locked_by(LockOwner(0x1234));
        assert_eq!(
            e.raw(),
            0x8000_0000_0000_0000 | 0x55 << 56 | 0xaa << 48 | 0x1234 << 32 | 0x5678_9abc
        );
        assert_eq!(e.owner(), LockOwner(0x1234));
        assert_eq!(e.without_lock().owner(), LockOwner::ANONYMOUS);
    }

    #[test]
    fn out_of_range_fields_are_rejected_not_truncated() {
        assert_eq!(
            LtEntry::new(128, 0, 0),
            Err(EntryError::RegionOutOfRange(128))
        );
        assert_eq!(
            LtEntry::new(0, 0, 1 << 32),
            Err(EntryError::LeafOutOfRange(1 << 32))
        );
        assert!(LtEntry::new(127, 255, (1 << 32) - 1).is_ok());
        assert_eq!(
            LeafAddr::new(200, 0),
            Err(EntryError::RegionOutOfRange(200))
        );
    }

    #[test]
    fn slt_header_reads_overflow_as_full() {
        assert_eq!(SltHeader::claimed_slot(0), Ok(1));
        assert_eq!(SltHeader::claimed_slot(254), Ok(255));
        assert_eq!(SltHeader::claimed_slot(255), Err(EntryError::SltFull(255)));
        assert_eq!(
            SltHeader::claimed_slot(1000),
            Err(EntryError::SltFull(1000))
        );
        assert!(!SltHeader::from_raw(254).is_full());
        assert!(SltHeader::from_raw(255).is_full());
        assert!(SltHeader::from_raw(256).is_full());
        assert_eq!(SltHeader::from_raw(300).used(), 255);
        assert_eq!(SltHeader::from_raw(u64::MAX).used(), 255);
        assert_eq!(SltHeader::SLOTS, 256);
    }

    #[test]
    fn exactly_one_claim_triggers_retraining() {
        let triggers = (0..1000u64)
            .filter_map(|f| SltHeader::claimed_slot(f).ok())
            .filter(|&s| SltHeader::triggers_retraining(s))
            .count();
        assert_eq!(triggers, 1);
        assert_eq!(SltHeader::claimed_slot(127), Ok(SltHeader::RETRAIN_SLOT));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn fields_round_trip(lock: bool, owner: u16, region in 0u8..=127, pointer: u8, leaf in 0u64..(1 << 32)) {
            let e = LtEntry::new(region, pointer, leaf).unwrap();
            let e = if lock { e.locked_by(LockOwner(owner)) } else { e };
            prop_assert_eq!(e.is_locked(), lock);
            prop_assert_eq!(e.owner(), LockOwner(if lock { owner } else { 0 }));
            prop_assert_eq!(e.region(), region);
            prop_assert_eq!(e.pointer(), pointer);
            prop_assert_eq!(e.leaf(), leaf);
            prop_assert_eq!(LtEntry::from_raw(e.raw()), e);
            prop_assert_eq!(e.addr(), LeafAddr::new(region, leaf).unwrap());
        }

        #[test]
        fn raw_words_round_trip(raw: u64) {
            let e = LtEntry::from_raw(raw);
            let rebuilt = LtEntry::new(e.region(), e.pointer(), e.leaf()).unwrap();
            let rebuilt = if e.is_locked() { rebuilt.locked_by(e.owner()) } else { rebuilt };
            // An unlocked word with owner bits set is not one this crate
            // writes; every other word is rebuilt from its fields.
            prop_assume!(e.is_locked() || e.owner() == LockOwner::ANONYMOUS);
            prop_assert_eq!(rebuilt.raw(), raw);
        }

        #[test]
        fn helpers_touch_only_their_field(raw: u64, pointer: u8, owner: u16) {
            let e = LtEntry::from_raw(raw);
            let lock_bits = LtEntry::LOCK_MASK | LtEntry::OWNER_MASK;
            let l = e.locked_by(LockOwner(owner));
            prop_assert_eq!(l.raw() & !lock_bits, raw & !lock_bits);
            prop_assert!(l.is_locked());
            prop_assert_eq!(l.owner(), LockOwner(owner));
            prop_assert!(!e.without_lock().is_locked());
            prop_assert_eq!(e.without_lock().owner(), LockOwner::ANONYMOUS);
            prop_assert_eq!(l.without_lock(), e.without_lock());
            prop_assert_eq!(l.addr(), e.addr());
            let p = e.with_pointer(pointer);
            prop_assert_eq!(p.pointer(), pointer);
            prop_assert_eq!(p.raw() & !LtEntry::POINTER_MASK, raw & !LtEntry::POINTER_MASK);
        }

        #[test]
        fn region_and_leaf_range_is_checked(region: u8, leaf: u64) {
            let r = LtEntry::new(region, 0, leaf);
            prop_assert_eq!(r.is_ok(), region <= 127 && leaf < (1 << 32));
        }
    }
}
