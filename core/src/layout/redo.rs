//! The redo log: a whole copy of each leaf write, placed before the write
//! itself, so a leaf torn by a death can be written again whole.
//!
//! A software provider (libfabric's `tcp`) places an RMA write's payload in
//! the target region as it arrives. A leaf write cut in the middle leaves
//! a prefix of the new leaf over the old one: a *torn* leaf, failing its
//! checksum, every acknowledged key of it unreadable. A writer that lives
//! writes it again under its lock (`rolex_host::kv`'s repair); one that
//! dies mid-send, or a memory node killed while it copies the payload in,
//! leaves nobody to. So where the fabric places one peer's writes in the
//! order they were posted, a writer posts, in the same batch and before
//! the leaf WRITE, a WRITE of a [redo entry](RedoEntry) — the leaf's pool
//! offset, its new bytes, who wrote it, a sequence number and a checksum
//! — into a slot of its own. A death tears at most one of the two: a torn
//! entry means the leaf write had not started; a torn leaf means its entry
//! is whole. Whoever finds a torn leaf in a chain locked by a dead holder
//! (the memory node's lease reaper, or its resume after its own death)
//! writes the newest whole entry of that holder naming it, among the
//! entries written under its blocks' present claims (writes to a
//! leaf are serialized by its chain's lock, so that entry is the torn
//! write's whole image). No extra round trip; twice a leaf's bytes per
//! leaf write.
//!
//! The region: `blocks` blocks, each a [claim word](RedoClaim) then
//! `slots` slots of [`RedoRegion::slot_len`] bytes. A compute client claims
//! one free block with a `CAS` on its claim word (its lock owner and a
//! nonce of its own), writes its entries in that block's slots, and frees
//! the block when it closes; the memory node frees the blocks of a holder
//! whose lease ended, after it used them.
//!
//! ```text
//! region:  | block 0 | block 1 | ... | block blocks-1 |
//! block:   | claim u64 | slot 0 | slot 1 | ... | slot slots-1 |
//! slot:    offset size field
//!               0    4  magic     REDO_MAGIC (0: never written)
//!               4    4  len       bytes of the image
//!               8    4  owner     the writer's lock owner (16 bits)
//!              12    4  nonce     the nonce of the block's claim it was
//!                                   written under (older claims' entries
//!                                   are not the present claimer's)
//!              16    8  seq       the writer's sequence number (newest wins)
//!              24    8  target    pool offset the image belongs at
//!              32    8  checksum  xxh3-64 of the image, seeded with the
//!                                   xxh3-64 of bytes 0..32
//!              40  len  image     (the slot is padded to a multiple of 8)
//! ```
//!
//! Decoding never panics and never trusts a length: a slot that is not a
//! whole entry is a [`RedoError`].

use core::fmt;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{LayoutError, Leaf, Part};
use crate::entry::LockOwner;

/// The first word of a written redo entry: `"RDO1"` read as a
/// little-endian `u32`.
pub const REDO_MAGIC: u32 = u32::from_le_bytes(*b"RDO1");

/// A redo slot that is not a whole entry, or an image that does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedoError {
    /// The slot is shorter than an entry's header.
    TooShort {
        /// Its length.
        len: usize,
    },
    /// The slot was never written (magic 0).
    Empty,
    /// The magic word is neither 0 nor [`REDO_MAGIC`].
    BadMagic {
        /// The word found.
        found: u32,
    },
    /// The image does not fit the slot.
    TooLong {
        /// Bytes of the image.
        len: u64,
        /// The most the slot holds.
        max: u64,
    },
    /// The owner field is not a 16-bit lock owner.
    BadOwner {
        /// The field.
        found: u32,
    },
    /// The checksum does not match the header and image (a torn entry).
    ChecksumMismatch {
        /// The stored checksum.
        stored: u64,
        /// The checksum of what is there.
        computed: u64,
    },
}

impl fmt::Display for RedoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooShort { len } => write!(
                f,
                "redo slot of {len} bytes is shorter than an entry's {}-byte header",
                RedoHeader::SIZE
            ),
            Self::Empty => f.write_str("redo slot never written"),
            Self::BadMagic { found } => write!(
                f,
                "redo entry magic is {found:#010x}, expected {REDO_MAGIC:#010x}"
            ),
            Self::TooLong { len, max } => {
                write!(f, "redo image of {len} bytes does not fit its slot ({max})")
            }
            Self::BadOwner { found } => {
                write!(f, "redo entry owner {found} is not a 16-bit lock owner")
            }
            Self::ChecksumMismatch { stored, computed } => write!(
                f,
                "redo entry checksum {stored:#018x} does not match its bytes \
                 ({computed:#018x}): a torn entry"
            ),
        }
    }
}

impl core::error::Error for RedoError {}

/// An entry's header (see the module docs for the byte diagram).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct RedoHeader {
    magic: U32,
    len: U32,
    owner: U32,
    nonce: U32,
    seq: U64,
    target: U64,
    checksum: U64,
}

const _: () = assert!(core::mem::size_of::<RedoHeader>() == 40);

impl RedoHeader {
    /// Bytes of the header.
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// Bytes the checksum's seed covers (everything before `checksum`).
    const SEEDED: usize = core::mem::offset_of!(Self, checksum);
}

/// The checksum of an entry: its image hashed with the header's other
/// bytes as the seed, so a tear anywhere (header or image) changes it.
fn entry_checksum(head: &[u8], image: &[u8]) -> u64 {
    xxh3_64_with_seed(image, xxh3_64(head))
}

/// A whole redo entry, decoded from a slot ([`RedoEntry::decode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedoEntry<'a> {
    /// Who wrote it: the lock owner of the chain lock it wrote under.
    pub owner: LockOwner,
    /// The nonce of the claim of the block it was written in
    /// ([`RedoClaim::nonce`]): an entry whose nonce is not the block's
    /// present claim's was left by an earlier claimer.
    pub nonce: u32,
    /// Its writer's sequence number: of two entries of one writer naming
    /// one target, the greater is the newer.
    pub seq: u64,
    /// The pool offset `image` belongs at.
    pub target: u64,
    /// The bytes written there.
    pub image: &'a [u8],
}

impl<'a> RedoEntry<'a> {
    /// Writes this entry into the start of `slot` (header, then the
    /// image); returns the bytes written (the slot may be longer). Fails
    /// when they do not fit `slot`.
    pub fn encode(&self, slot: &mut [u8]) -> Result<usize, RedoError> {
        let len = RedoHeader::SIZE as usize + self.image.len();
        if slot.len() < len {
            return Err(RedoError::TooLong {
                len: self.image.len() as u64,
                max: (slot.len() as u64).saturating_sub(RedoHeader::SIZE),
            });
        }
        let image_len = u32::try_from(self.image.len()).map_err(|_| RedoError::TooLong {
            len: self.image.len() as u64,
            max: u32::MAX.into(),
        })?;
        let mut head = RedoHeader {
            magic: U32::new(REDO_MAGIC),
            len: U32::new(image_len),
            owner: U32::new(self.owner.0.into()),
            nonce: U32::new(self.nonce),
            seq: U64::new(self.seq),
            target: U64::new(self.target),
            checksum: U64::new(0),
        };
        let sum = entry_checksum(&head.as_bytes()[..RedoHeader::SEEDED], self.image);
        head.checksum = U64::new(sum);
        let (h, rest) = slot.split_at_mut(RedoHeader::SIZE as usize);
        h.copy_from_slice(head.as_bytes());
        rest[..self.image.len()].copy_from_slice(self.image);
        Ok(len)
    }

    /// The whole entry at the start of `slot`, checked: magic, length
    /// within the slot, owner, checksum.
    pub fn decode(slot: &'a [u8]) -> Result<Self, RedoError> {
        let (head, rest) = RedoHeader::read_from_prefix(slot)
            .map_err(|_| RedoError::TooShort { len: slot.len() })?;
        match head.magic.get() {
            REDO_MAGIC => {}
            0 => return Err(RedoError::Empty),
            found => return Err(RedoError::BadMagic { found }),
        }
        let len = head.len.get() as usize;
        let image = rest.get(..len).ok_or(RedoError::TooLong {
            len: len as u64,
            max: rest.len() as u64,
        })?;
        let owner = u16::try_from(head.owner.get()).map_err(|_| RedoError::BadOwner {
            found: head.owner.get(),
        })?;
        let computed = entry_checksum(&slot[..RedoHeader::SEEDED], image);
        if computed != head.checksum.get() {
            return Err(RedoError::ChecksumMismatch {
                stored: head.checksum.get(),
                computed,
            });
        }
        Ok(Self {
            owner: LockOwner(owner),
            nonce: head.nonce.get(),
            seq: head.seq.get(),
            target: head.target.get(),
            image,
        })
    }
}

/// A block's claim word: 0 while the block is free; else bit 63 set, the
/// claimer's lock owner in bits 0-15 and a nonce of the claiming client in
/// bits 16-47 (clients of one owner tell their blocks apart by it; a
/// client frees its block with a `CAS` from its own word).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RedoClaim(u64);

impl RedoClaim {
    /// A free block's word.
    pub const FREE: Self = Self(0);
    const CLAIMED: u64 = 1 << 63;

    /// The word of a block claimed by `owner` with `nonce` (its low 32
    /// bits).
    pub const fn new(owner: LockOwner, nonce: u32) -> Self {
        Self(Self::CLAIMED | (nonce as u64) << 16 | owner.0 as u64)
    }

    /// The word as read from the pool.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw word.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The claiming client's nonce (0 for a free block).
    pub const fn nonce(self) -> u32 {
        (self.0 >> 16) as u32
    }

    /// The claimer's owner, `None` for a free block (or a word that is
    /// not a claim).
    pub const fn owner(self) -> Option<LockOwner> {
        if self.0 & Self::CLAIMED == 0 {
            None
        } else {
            Some(LockOwner(self.0 as u16))
        }
    }
}

/// Where a pool's redo log is and how it is cut (from the superblock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedoRegion {
    offset: u64,
    blocks: u32,
    slots: u32,
    slot_len: u64,
}

impl RedoRegion {
    /// Bytes of one slot for leaves of `leaf_slots` slots: an entry's
    /// header and a leaf, rounded up to 8.
    pub const fn slot_len_for(leaf_slots: u32) -> u64 {
        (RedoHeader::SIZE + Leaf::size_for(leaf_slots)).next_multiple_of(8)
    }

    /// The region at `offset` with `blocks` blocks of `slots` slots, for
    /// leaves of `leaf_slots` slots. Both counts at least 1.
    pub fn new(offset: u64, blocks: u32, slots: u32, leaf_slots: u32) -> Result<Self, LayoutError> {
        if blocks == 0 || slots == 0 {
            return Err(LayoutError::InvalidField {
                field: super::Field::RedoGeometry,
                value: u64::from(blocks) << 32 | u64::from(slots),
            });
        }
        let r = Self {
            offset,
            blocks,
            slots,
            slot_len: Self::slot_len_for(leaf_slots),
        };
        r.checked_len()?;
        Ok(r)
    }

    /// Bytes of a region of `blocks` blocks of `slots` slots for leaves of
    /// `leaf_slots` slots (0 for 0 blocks: no redo log).
    pub fn len_for(blocks: u32, slots: u32, leaf_slots: u32) -> Result<u64, LayoutError> {
        if blocks == 0 {
            return Ok(0);
        }
        Self::new(0, blocks, slots, leaf_slots)?.checked_len()
    }

    fn checked_len(&self) -> Result<u64, LayoutError> {
        let overflow = LayoutError::Overflow {
            part: Part::RedoLog,
        };
        u64::from(self.slots)
            .checked_mul(self.slot_len)
            .and_then(|s| s.checked_add(8))
            .and_then(|b| b.checked_mul(self.blocks.into()))
            .ok_or(overflow)
    }

    /// Pool offset of the region.
    pub const fn offset(&self) -> u64 {
        self.offset
    }

    /// Blocks in the region.
    pub const fn blocks(&self) -> u32 {
        self.blocks
    }

    /// Slots per block.
    pub const fn slots(&self) -> u32 {
        self.slots
    }

    /// Bytes of one slot.
    pub const fn slot_len(&self) -> u64 {
        self.slot_len
    }

    /// The longest image a slot holds.
    pub const fn image_max(&self) -> u64 {
        self.slot_len - RedoHeader::SIZE
    }

    /// Bytes of one block (its claim word and its slots).
    pub const fn block_len(&self) -> u64 {
        8 + self.slots as u64 * self.slot_len
    }

    /// Bytes of the region.
    pub const fn len(&self) -> u64 {
        self.blocks as u64 * self.block_len()
    }

    /// Whether the region has no block (never, once constructed).
    pub const fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// Pool offset of block `block`'s claim word (8-byte aligned when the
    /// region is).
    pub fn claim_offset(&self, block: u32) -> Result<u64, LayoutError> {
        self.index(block, self.blocks)?;
        Ok(self.offset + u64::from(block) * self.block_len())
    }

    /// Pool offset of slot `slot` of block `block`.
    pub fn slot_offset(&self, block: u32, slot: u32) -> Result<u64, LayoutError> {
        self.index(slot, self.slots)?;
        Ok(self.claim_offset(block)? + 8 + u64::from(slot) * self.slot_len)
    }

    fn index(&self, index: u32, len: u32) -> Result<(), LayoutError> {
        if index < len {
            Ok(())
        } else {
            Err(LayoutError::IndexOutOfRange {
                part: Part::RedoLog,
                index: index.into(),
                len: len.into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(image: &[u8], seq: u64) -> RedoEntry<'_> {
        RedoEntry {
            owner: LockOwner(7),
            nonce: 0x00C0_FFEE,
            seq,
            target: 4096,
            image,
        }
    }

    #[test]
    fn an_entry_decodes_as_written() {
        let image: Vec<u8> = (0..200u8).collect();
        let mut slot = vec![0u8; 256];
        assert_eq!(RedoEntry::decode(&slot), Err(RedoError::Empty));
        let n = entry(&image, 9).encode(&mut slot).unwrap();
        assert_eq!(n, 240);
        assert_eq!(RedoEntry::decode(&slot).unwrap(), entry(&image, 9));
        assert!(matches!(
            entry(&image, 9).encode(&mut slot[..239]),
            Err(RedoError::TooLong { len: 200, max: 199 })
        ));
        assert!(matches!(
            RedoEntry::decode(&slot[..39]),
            Err(RedoError::TooShort { len: 39 })
        ));
        // A length past the slot is refused, not trusted.
        assert!(matches!(
            RedoEntry::decode(&slot[..239]),
            Err(RedoError::TooLong { len: 200, max: 199 })
        ));
    }

    #[test]
    fn the_region_places_blocks_and_slots() {
        let r = RedoRegion::new(1024, 3, 4, 16).unwrap();
        assert_eq!(r.slot_len() % 8, 0);
        assert!(r.image_max() >= Leaf::size_for(16));
        assert_eq!(r.claim_offset(0).unwrap(), 1024);
        assert_eq!(r.slot_offset(0, 0).unwrap(), 1032);
        assert_eq!(r.claim_offset(1).unwrap(), 1024 + r.block_len());
        assert_eq!(r.slot_offset(2, 3).unwrap() + r.slot_len(), 1024 + r.len());
        assert!(r.claim_offset(3).is_err());
        assert!(r.slot_offset(0, 4).is_err());
        assert!(RedoRegion::new(0, 0, 4, 16).is_err());
        assert_eq!(RedoRegion::len_for(0, 4, 16).unwrap(), 0);
        assert!(RedoRegion::new(0, u32::MAX, u32::MAX, u32::MAX).is_err());
    }

    #[test]
    fn claims_name_their_owner() {
        let c = RedoClaim::new(LockOwner(0xBEEF), 0x1234_5678);
        assert_eq!(c.owner(), Some(LockOwner(0xBEEF)));
        assert_eq!(c.nonce(), 0x1234_5678);
        assert_ne!(c, RedoClaim::new(LockOwner(0xBEEF), 0x1234_5679));
        assert_eq!(RedoClaim::FREE.owner(), None);
        assert_eq!(RedoClaim::from_raw(c.raw()), c);
        // The anonymous owner claims too.
        assert_eq!(
            RedoClaim::new(LockOwner::ANONYMOUS, 1).owner(),
            Some(LockOwner(0))
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A slot holding a prefix of one entry over another (a write cut
        /// in the middle) decodes as one of the two whole entries or not
        /// at all.
        #[test]
        fn a_torn_entry_is_never_taken_for_a_whole_one(
            old in proptest::collection::vec(any::<u8>(), 0..300),
            new in proptest::collection::vec(any::<u8>(), 0..300),
            seqs in (any::<u64>(), any::<u64>()),
            cut in 0usize..400,
        ) {
            let mut a = vec![0u8; 400];
            let mut b = vec![0u8; 400];
            let na = entry(&old, seqs.0).encode(&mut a).unwrap();
            let nb = entry(&new, seqs.1).encode(&mut b).unwrap();
            let mut torn = a.clone();
            let cut = cut.min(nb);
            torn[..cut].copy_from_slice(&b[..cut]);
            if let Ok(e) = RedoEntry::decode(&torn) {
                prop_assert!(
                    e == entry(&old, seqs.0) && torn[..na] == a[..na]
                        || e == entry(&new, seqs.1) && torn[..nb] == b[..nb]
                );
            }
        }

        /// Decoding any bytes never panics and never returns an image
        /// past the slot.
        #[test]
        fn decoding_any_bytes_is_safe(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            if let Ok(e) = RedoEntry::decode(&bytes) {
                prop_assert!(e.image.len() + RedoHeader::SIZE as usize <= bytes.len());
            }
        }
    }
}
