//! Value blocks given back to the pool: the value region's **free stack**.
//!
//! A compute node reuses the blocks it frees itself (see `rolex-kv`'s value
//! space); what it still holds when it closes, or holds beyond its bound,
//! it gives back to the pool, where any compute node takes it before it
//! claims new space. No memory-node CPU is involved: the stack is a
//! lock-free (Treiber) stack of **bundles** whose head is the value
//! region's `free` word ([`ValueRegionHeader`](super::ValueRegionHeader)),
//! pushed and popped with one-sided `CAS`.
//!
//! A bundle is a free block that lists other free blocks:
//!
//! ```text
//! offset  size  field
//!      0     8  checksum  xxh3 of bytes [8, 40 + 16 * count)
//!      8     8  mark      FREE_MARK ("RLXFREE\0")
//!     16     8  next      the next bundle's position (0: the last)
//!     24     4  class     the bundle block's own size class
//!     28     4  gen       the generation its last value carried
//!     32     4  count     entries that follow (at most MAX_ENTRIES)
//!     36     4  reserved  0
//!     40  16·n  entries   offset:u64 (pool) | class:u32 | gen:u32
//! ```
//!
//! The `free` word is `tag:24 | position:40`: a position is a block's
//! offset in the block area divided by 16, plus one (0: the stack is
//! empty), and the tag counts the word's changes, so a pop that read the
//! head, then its bundle, and lost a race (the bundle popped, reused,
//! pushed again) fails its `CAS` instead of installing a stale `next`
//! ([`FreeHead`]).
//!
//! Why a popped bundle is trusted: it was written whole before the `CAS`
//! that pushed it (an ordered fabric posts the writes first in one batch;
//! an unordered one waits for them), and while it is on the stack nobody
//! writes it. A pop reads the head, then the bundle, then `CAS`es the
//! head from what it read to the bundle's `next` with the tag bumped: if
//! the `CAS` succeeds, nothing changed the head in between, so the bundle
//! read was of a block on the stack. The decoder still checks everything
//! ([`FreeBundle::parse`]): pool bytes are written by peers.
//!
//! A block on the stack no longer reads as a value: its first word is the
//! bundle's checksum, or (for a listed block) whatever its last value
//! left, and a reader holding an old pointer checks the key and generation
//! of what it reads (`ValueBlock::check`), so it sees a stale pointer.

use core::fmt;

use xxhash_rust::xxh3::xxh3_64;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::value::{block_class, ValueRegion, MIN_BLOCK};

/// The `mark` word of a bundle: the bytes `"RLXFREE\0"` as a little-endian
/// `u64`.
pub const FREE_MARK: u64 = u64::from_le_bytes(*b"RLXFREE\0");

/// Bytes of a block's offset in the block area per unit of a position.
const POSITION_UNIT: u64 = 16;
/// Bits of a position in the head word.
const POSITION_BITS: u32 = 40;
const POSITION_MASK: u64 = (1 << POSITION_BITS) - 1;

/// The head of a bundle, before its entries.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct FreeBundleHeader {
    checksum: U64,
    mark: U64,
    next: U64,
    class: U32,
    gen: U32,
    count: U32,
    reserved: U32,
}

const _: () = assert!(core::mem::size_of::<FreeBundleHeader>() == 40);

/// One block a bundle lists.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
struct EntryBytes {
    offset: U64,
    class: U32,
    gen: U32,
}

const _: () = assert!(core::mem::size_of::<EntryBytes>() == 16);

/// A free block: where it is, its size class and the generation its last
/// value carried (the next one must differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FreeBlock {
    /// Pool offset.
    pub offset: u64,
    /// Bytes of the block (a size class).
    pub class: u64,
    /// Generation of its last value (0: never held one).
    pub gen: u32,
}

/// The value region's `free` word, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeHead {
    /// Changes of the word so far (mod 2^24).
    pub tag: u32,
    /// Position of the top bundle (0: empty).
    pub position: u64,
}

impl FreeHead {
    /// The word `word` of a value region.
    pub fn from_word(word: u64) -> Self {
        Self {
            tag: (word >> POSITION_BITS) as u32,
            position: word & POSITION_MASK,
        }
    }

    /// The word.
    pub fn word(self) -> u64 {
        (u64::from(self.tag & 0xff_ffff) << POSITION_BITS) | (self.position & POSITION_MASK)
    }

    /// The head after a change to `position`: the tag bumped.
    pub fn then(self, position: u64) -> Self {
        Self {
            tag: self.tag.wrapping_add(1) & 0xff_ffff,
            position,
        }
    }

    /// Whether the stack is empty.
    pub fn is_empty(self) -> bool {
        self.position == 0
    }
}

/// Why bytes are no bundle, or a block cannot be listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FreeError {
    /// Fewer bytes than the header and its entries.
    TooShort {
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        needed: u64,
    },
    /// The mark is not [`FREE_MARK`]: not a bundle (a torn read, or a
    /// position that names no bundle).
    NotABundle {
        /// The mark word found.
        mark: u64,
    },
    /// The checksum does not match.
    ChecksumMismatch {
        /// The checksum word.
        stored: u64,
        /// The checksum of the other bytes.
        computed: u64,
    },
    /// More entries than the bundle's block holds, or than
    /// [`FreeBundle::MAX_ENTRIES`].
    TooManyEntries {
        /// Entries claimed.
        count: u32,
        /// Entries the block holds.
        fit: u64,
    },
    /// A block that is not a whole block of a size class inside the block
    /// area, at a 16-byte boundary (a listed one, or the bundle's own).
    BadBlock {
        /// Its pool offset.
        offset: u64,
        /// Its class.
        class: u64,
    },
    /// The reserved word is not 0.
    Reserved {
        /// The word.
        word: u32,
    },
    /// A `next` position outside the block area.
    BadNext {
        /// The position.
        position: u64,
    },
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooShort { len, needed } => {
                write!(f, "free bundle of {len} bytes, need {needed}")
            }
            Self::NotABundle { mark } => {
                write!(f, "no free bundle there (mark {mark:#018x})")
            }
            Self::ChecksumMismatch { stored, computed } => write!(
                f,
                "free bundle checksum {stored:#018x} but its bytes give {computed:#018x}"
            ),
            Self::TooManyEntries { count, fit } => {
                write!(f, "free bundle lists {count} blocks, its block holds {fit}")
            }
            Self::BadBlock { offset, class } => write!(
                f,
                "free block at pool offset {offset} of {class} bytes is not a block of the value region"
            ),
            Self::Reserved { word } => write!(f, "free bundle reserved word is {word:#x}, not 0"),
            Self::BadNext { position } => {
                write!(f, "free bundle's next position {position} is outside the value region")
            }
        }
    }
}

/// A parsed bundle (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct FreeBundle<'a> {
    header: FreeBundleHeader,
    entries: &'a [u8],
}

impl<'a> FreeBundle<'a> {
    /// Bytes of the header.
    pub const HEADER: u64 = core::mem::size_of::<FreeBundleHeader>() as u64;
    /// Bytes per entry.
    pub const ENTRY: u64 = core::mem::size_of::<EntryBytes>() as u64;
    /// Most entries a bundle lists, whatever its block's size, so a pop
    /// reads at most [`Self::MAX_BYTES`].
    pub const MAX_ENTRIES: u64 = 255;
    /// Most bytes of a bundle.
    pub const MAX_BYTES: u64 = Self::HEADER + Self::MAX_ENTRIES * Self::ENTRY;
    /// Most bytes of blocks one bundle holds (its own and those it lists)
    /// when its writer can choose ([`bundles`]): a pop takes a bundle
    /// whole, so this bounds what one pop hands one client and leaves the
    /// rest to others.
    pub const HELD_MAX: u64 = 4 << 20;

    /// Entries a bundle written in a block of `class` bytes holds.
    pub fn fit(class: u64) -> u64 {
        (class.saturating_sub(Self::HEADER) / Self::ENTRY).min(Self::MAX_ENTRIES)
    }

    /// Bytes of a bundle of `count` entries.
    pub fn len(count: usize) -> u64 {
        Self::HEADER + count as u64 * Self::ENTRY
    }

    /// Writes into `out` the bundle in block `own` that lists `entries` and
    /// links to `next` (a position, 0 for none); returns the bytes
    /// written, or `None` if `out` is too short or `own`'s block cannot
    /// hold the entries.
    pub fn write(
        out: &mut [u8],
        own: FreeBlock,
        next: u64,
        entries: &[FreeBlock],
    ) -> Option<usize> {
        if entries.len() as u64 > Self::fit(own.class) {
            return None;
        }
        let len = usize::try_from(Self::len(entries.len())).ok()?;
        let out = out.get_mut(..len)?;
        let header = FreeBundleHeader {
            checksum: U64::new(0),
            mark: U64::new(FREE_MARK),
            next: U64::new(next),
            class: U32::new(u32::try_from(own.class).ok()?),
            gen: U32::new(own.gen),
            count: U32::new(entries.len() as u32),
            reserved: U32::new(0),
        };
        let (head, rest) = out.split_at_mut(Self::HEADER as usize);
        head.copy_from_slice(header.as_bytes());
        for (e, slot) in entries
            .iter()
            .zip(rest.chunks_exact_mut(Self::ENTRY as usize))
        {
            let bytes = EntryBytes {
                offset: U64::new(e.offset),
                class: U32::new(u32::try_from(e.class).ok()?),
                gen: U32::new(e.gen),
            };
            slot.copy_from_slice(bytes.as_bytes());
        }
        let sum = xxh3_64(&out[8..]);
        out[..8].copy_from_slice(&sum.to_le_bytes());
        Some(len)
    }

    /// The bundle at the start of `bytes`, read from the block at pool
    /// offset `at` of `region`: checked whole (mark, checksum, reserved,
    /// entry count, every block a block of a size class inside the block
    /// area, `next` inside it).
    pub fn parse(bytes: &'a [u8], at: u64, region: &ValueRegion) -> Result<Self, FreeError> {
        let (header, _) =
            FreeBundleHeader::read_from_prefix(bytes).map_err(|_| FreeError::TooShort {
                len: bytes.len(),
                needed: Self::HEADER,
            })?;
        if header.mark.get() != FREE_MARK {
            return Err(FreeError::NotABundle {
                mark: header.mark.get(),
            });
        }
        let count = header.count.get();
        let class = u64::from(header.class.get());
        let fit = Self::fit(class);
        if u64::from(count) > fit {
            return Err(FreeError::TooManyEntries { count, fit });
        }
        let len = Self::len(count as usize);
        let body = bytes.get(..len as usize).ok_or(FreeError::TooShort {
            len: bytes.len(),
            needed: len,
        })?;
        let computed = xxh3_64(&body[8..]);
        if computed != header.checksum.get() {
            return Err(FreeError::ChecksumMismatch {
                stored: header.checksum.get(),
                computed,
            });
        }
        if header.reserved.get() != 0 {
            return Err(FreeError::Reserved {
                word: header.reserved.get(),
            });
        }
        check_block(region, at, class)?;
        let next = header.next.get();
        if next != 0 && block_at(region, next).is_none() {
            return Err(FreeError::BadNext { position: next });
        }
        let bundle = Self {
            header,
            entries: &body[Self::HEADER as usize..],
        };
        for e in bundle.entries() {
            check_block(region, e.offset, e.class)?;
        }
        Ok(bundle)
    }

    /// The next bundle's position (0: none).
    pub fn next(&self) -> u64 {
        self.header.next.get()
    }

    /// The bundle's own block (at `at`, where it was read).
    pub fn own(&self, at: u64) -> FreeBlock {
        FreeBlock {
            offset: at,
            class: u64::from(self.header.class.get()),
            gen: self.header.gen.get(),
        }
    }

    /// The blocks it lists.
    pub fn entries(&self) -> impl Iterator<Item = FreeBlock> + 'a {
        self.entries
            .chunks_exact(Self::ENTRY as usize)
            .filter_map(|c| EntryBytes::read_from_bytes(c).ok())
            .map(|e| FreeBlock {
                offset: e.offset.get(),
                class: u64::from(e.class.get()),
                gen: e.gen.get(),
            })
    }
}

/// Free blocks as bundles, each `(own, listed)`: the largest block left
/// holds a bundle listing as many of the smallest others as it fits
/// ([`FreeBundle::fit`]) while the bundle's bytes (its own block's and
/// those it lists) stay within `max_bytes` — a pop takes a whole bundle,
/// so this bounds what one pop hands one client. Every block is in
/// exactly one bundle.
#[cfg(feature = "alloc")]
pub fn bundles(
    mut blocks: alloc::vec::Vec<FreeBlock>,
    max_bytes: u64,
) -> alloc::vec::Vec<(FreeBlock, alloc::vec::Vec<FreeBlock>)> {
    blocks.sort_unstable_by_key(|b| (b.class, b.offset));
    let mut out = alloc::vec::Vec::new();
    let mut small = 0;
    while small < blocks.len() {
        let Some(own) = blocks.pop() else { break };
        let fit = FreeBundle::fit(own.class) as usize;
        let mut bytes = own.class;
        let mut take = 0;
        while let Some(b) = blocks.get(small + take).filter(|_| take < fit) {
            if bytes.saturating_add(b.class) > max_bytes {
                break;
            }
            bytes += b.class;
            take += 1;
        }
        out.push((own, blocks[small..small + take].to_vec()));
        small += take;
    }
    out
}

/// The position of the block at pool offset `offset` (`None` unless it
/// starts inside `region`'s block area at a 16-byte boundary).
pub fn position_of(region: &ValueRegion, offset: u64) -> Option<u64> {
    let at = offset.checked_sub(region.area_offset(0))?;
    if at % POSITION_UNIT != 0 || at >= region.capacity() {
        return None;
    }
    let p = at / POSITION_UNIT + 1;
    (p <= POSITION_MASK).then_some(p)
}

/// The pool offset of the block at `position` (`None` for 0 or a position
/// outside `region`'s block area).
pub fn block_at(region: &ValueRegion, position: u64) -> Option<u64> {
    let at = position
        .checked_sub(1)?
        .checked_mul(POSITION_UNIT)
        .filter(|&at| at < region.capacity())?;
    Some(region.area_offset(at))
}

/// `Ok` if `class` is a size class and `[offset, offset + class)` a block
/// of `region`'s block area at a position.
fn check_block(region: &ValueRegion, offset: u64, class: u64) -> Result<(), FreeError> {
    let bad = FreeError::BadBlock { offset, class };
    let is_class = class >= MIN_BLOCK
        && usize::try_from(class - 32)
            .ok()
            .and_then(block_class)
            .is_some_and(|c| c == class);
    let inside = position_of(region, offset).is_some()
        && offset
            .checked_add(class)
            .is_some_and(|end| end <= region.area_offset(region.capacity()));
    if is_class && inside {
        Ok(())
    } else {
        Err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::ValueRegionHeader;
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    fn region() -> ValueRegion {
        ValueRegion::new(4096, ValueRegionHeader::SIZE + (1 << 20)).unwrap()
    }

    fn block(region: &ValueRegion, at: u64, class: u64, gen: u32) -> FreeBlock {
        FreeBlock {
            offset: region.area_offset(at),
            class,
            gen,
        }
    }

    #[test]
    fn a_bundle_round_trips_and_refuses_every_changed_byte() {
        let r = region();
        let own = block(&r, 0, 512, 7);
        let entries = vec![block(&r, 512, 64, 1), block(&r, 576, 1280, 0)];
        let next = position_of(&r, r.area_offset(4096)).unwrap();
        let mut buf = vec![0u8; 512];
        let n = FreeBundle::write(&mut buf, own, next, &entries).unwrap();
        assert_eq!(n as u64, FreeBundle::len(2));
        let b = FreeBundle::parse(&buf, own.offset, &r).unwrap();
        assert_eq!(b.own(own.offset), own);
        assert_eq!(b.next(), next);
        assert_eq!(b.entries().collect::<Vec<_>>(), entries);
        for i in 0..n {
            let mut bad = buf.clone();
            bad[i] ^= 1;
            assert!(FreeBundle::parse(&bad, own.offset, &r).is_err(), "byte {i}");
        }
        assert!(FreeBundle::parse(&buf[..n - 1], own.offset, &r).is_err());
    }

    #[test]
    fn blocks_outside_the_area_or_of_no_class_are_refused() {
        let r = region();
        let own = block(&r, 0, 512, 0);
        let mut buf = vec![0u8; 512];
        for bad in [
            FreeBlock {
                offset: 8,
                class: 64,
                gen: 0,
            },
            block(&r, 8, 64, 0),
            block(&r, 64, 100, 0),
            block(&r, (1 << 20) - 64, 128, 0),
        ] {
            FreeBundle::write(&mut buf, own, 0, &[bad]).unwrap();
            assert!(
                matches!(
                    FreeBundle::parse(&buf, own.offset, &r),
                    Err(FreeError::BadBlock { .. })
                ),
                "{bad:?}"
            );
        }
        // A bundle too small for its entries is never written.
        assert_eq!(FreeBundle::fit(64), 1);
        let two = [block(&r, 64, 64, 0), block(&r, 128, 64, 0)];
        assert_eq!(
            FreeBundle::write(&mut buf, block(&r, 0, 64, 0), 0, &two),
            None
        );
    }

    #[test]
    fn head_words_carry_a_tag_and_a_position() {
        let h = FreeHead::from_word(0);
        assert!(h.is_empty());
        let h2 = h.then(5);
        assert_eq!((h2.tag, h2.position), (1, 5));
        assert_eq!(FreeHead::from_word(h2.word()), h2);
        let wrap = FreeHead {
            tag: 0xff_ffff,
            position: 9,
        }
        .then(0);
        assert_eq!((wrap.tag, wrap.position), (0, 0));
        let r = region();
        for at in [0u64, 16, 4096, (1 << 20) - 16] {
            let p = position_of(&r, r.area_offset(at)).unwrap();
            assert_eq!(block_at(&r, p), Some(r.area_offset(at)));
        }
        assert_eq!(position_of(&r, r.area_offset(8)), None);
        assert_eq!(position_of(&r, r.area_offset(1 << 20)), None);
        assert_eq!(block_at(&r, 0), None);
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600), at in 0u64..(1 << 21)) {
            let _ = FreeBundle::parse(&bytes, at, &region());
        }
    }
}
