//! Values: byte strings held inline in a leaf slot when they are small, or
//! out of line in a **value block** of the value region that the slot
//! points to (the paper's value pointer).
//!
//! A slot's value is a [`SlotValue`]: up to [`INLINE_MAX`] bytes inline
//! (so a get of a small value stays one round trip), else a [`BlockRef`]
//! — the block's pool offset, the value's length and the block's
//! *generation*. A block carries, under its checksum, the key it belongs to,
//! the value's length and the same generation ([`ValueBlockHeader`]).
//!
//! The invariant that makes reuse safe: a block is written whole before
//! any slot points at it, and every time a block is handed out again its
//! generation changes. So a reader holding a pointer from a leaf it read
//! earlier either finds the block still saying (this key, this length,
//! this generation) with a checksum that matches — then those are the
//! value's bytes as the slot meant them — or [`ValueBlock::check`] fails
//! ([`ValueError`]) and the reader's leaf is stale (read it again). A torn
//! block (read while it is being rewritten for its next owner) fails the
//! checksum; a block handed to another key, or to the same key by a later
//! write, fails the identity. Generations are 32 bits; a reader would
//! have to sleep through 2^32 reuses of one block to be fooled.
//!
//! Space: blocks come in size classes ([`block_class`], four per power of
//! two, so at most 25% of a block is slack), carved by compute nodes out
//! of chunks they claim from the region with one `FAA` on its
//! [`ValueRegionHeader`]'s `alloc` word; a block freed by an overwrite or
//! a delete is reused by the compute node that freed it (see
//! `rolex-kv`'s value space), and what a compute node gives back goes on
//! the region's free stack for any compute node to take ([`super::free`]).

use core::fmt;

use xxhash_rust::xxh3::xxh3_64;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{LayoutError, Part};

/// Longest value held inline in a slot, in bytes.
pub const INLINE_MAX: usize = 8;

/// Longest value the store holds, in bytes (16 MiB).
pub const MAX_VALUE_LEN: usize = 16 << 20;

/// Smallest block, in bytes (a header and 32 value bytes).
pub const MIN_BLOCK: u64 = 64;

/// A value as a slot holds it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotValue {
    /// Up to [`INLINE_MAX`] bytes in the slot itself.
    Inline {
        /// Bytes used (`0..=INLINE_MAX`).
        len: u8,
        /// The bytes, zero past `len`.
        bytes: [u8; INLINE_MAX],
    },
    /// Out of line, in a value block.
    Block(BlockRef),
}

impl SlotValue {
    /// The 8-byte value `v` (its little-endian bytes), inline.
    pub const fn from_u64(v: u64) -> Self {
        Self::Inline {
            len: 8,
            bytes: v.to_le_bytes(),
        }
    }

    /// `bytes` inline, if they fit ([`INLINE_MAX`]).
    pub fn inline(bytes: &[u8]) -> Option<Self> {
        if bytes.len() > INLINE_MAX {
            return None;
        }
        let mut b = [0u8; INLINE_MAX];
        b[..bytes.len()].copy_from_slice(bytes);
        Some(Self::Inline {
            len: bytes.len() as u8,
            bytes: b,
        })
    }

    /// The value as a `u64`: `Some` for an inline value of exactly 8
    /// bytes (what [`Self::from_u64`] makes).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::Inline { len: 8, bytes } => Some(u64::from_le_bytes(bytes)),
            _ => None,
        }
    }

    /// The inline bytes (`None` for a block).
    pub fn inline_bytes(&self) -> Option<&[u8]> {
        match self {
            Self::Inline { len, bytes } => bytes.get(..usize::from(*len)),
            Self::Block(_) => None,
        }
    }

    /// The block this value lives in, if out of line.
    pub fn block(&self) -> Option<BlockRef> {
        match *self {
            Self::Block(b) => Some(b),
            Self::Inline { .. } => None,
        }
    }

    /// The value's length in bytes.
    pub fn len(&self) -> usize {
        match *self {
            Self::Inline { len, .. } => usize::from(len),
            Self::Block(b) => b.len as usize,
        }
    }

    /// Whether the value is zero bytes long.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot words `(word, len, gen)` that encode this value.
    pub(crate) fn encode(&self) -> (u64, u32, u32) {
        match *self {
            Self::Inline { len, bytes } => (u64::from_le_bytes(bytes), u32::from(len), 0),
            Self::Block(b) => (b.offset, b.len, b.gen),
        }
    }

    /// Decodes slot words; `None` if they are not a value this layout
    /// defines: an inline length over [`INLINE_MAX`] or bytes set past it,
    /// or a block (generation not 0) whose length is not above
    /// [`INLINE_MAX`] and at most [`MAX_VALUE_LEN`], or whose offset is not
    /// 8-byte aligned.
    pub(crate) fn decode(word: u64, len: u32, gen: u32) -> Option<Self> {
        if gen == 0 {
            let n = len as usize;
            if n > INLINE_MAX || (n < INLINE_MAX && word >> (8 * n) != 0) {
                return None;
            }
            return Some(Self::Inline {
                len: n as u8,
                bytes: word.to_le_bytes(),
            });
        }
        let n = len as usize;
        if n <= INLINE_MAX || n > MAX_VALUE_LEN || word % 8 != 0 {
            return None;
        }
        Some(Self::Block(BlockRef {
            offset: word,
            len,
            gen,
        }))
    }
}

impl fmt::Debug for SlotValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Inline { .. } => match self.as_u64() {
                Some(v) => write!(f, "{v}"),
                None => write!(f, "{:?}", self.inline_bytes().unwrap_or(&[])),
            },
            Self::Block(b) => write!(f, "{b:?}"),
        }
    }
}

/// Where an out-of-line value lives: the value block's pool offset, the
/// value's length, and the generation the block must carry.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRef {
    /// Pool offset of the block (8-byte aligned).
    pub offset: u64,
    /// The value's length in bytes (`INLINE_MAX < len <= MAX_VALUE_LEN`).
    pub len: u32,
    /// The block's generation when this value was written (never 0).
    pub gen: u32,
}

impl BlockRef {
    /// Bytes a reader READs for this value: the block's header and the
    /// value.
    pub fn read_len(&self) -> u64 {
        ValueBlockHeader::SIZE + u64::from(self.len)
    }
}

impl fmt::Debug for BlockRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block@{:#x}[{} B, gen {}]",
            self.offset, self.len, self.gen
        )
    }
}

/// The bytes of a block that holds `len` value bytes, rounded up to its
/// size class: [`MIN_BLOCK`], then four classes per power of two (so a
/// class is at most 1.25 times what it holds, plus the header). `None`
/// past [`MAX_VALUE_LEN`].
pub fn block_class(len: usize) -> Option<u64> {
    if len > MAX_VALUE_LEN {
        return None;
    }
    let need = ValueBlockHeader::SIZE + len as u64;
    if need <= MIN_BLOCK {
        return Some(MIN_BLOCK);
    }
    // base = the largest power of two below `need`; steps of base / 4.
    let base = 1u64 << (63 - (need - 1).leading_zeros());
    let step = base / 4;
    Some(base + (need - base).div_ceil(step) * step)
}

/// The largest size class of at most `room` bytes (`None` below
/// [`MIN_BLOCK`]).
pub fn largest_class_within(room: u64) -> Option<u64> {
    if room < MIN_BLOCK {
        return None;
    }
    // Four classes per power of two from MIN_BLOCK on (see block_class).
    let base = 1u64 << (63 - room.leading_zeros());
    let step = base / 4;
    Some(base + (room - base) / step * step)
}

/// The class of the next block to cut from `room` free bytes (a multiple
/// of 16) so that nothing is lost: at most `max` bytes (`max >= 2 *
/// MIN_BLOCK`), and leaving 0 or at least [`MIN_BLOCK`] bytes, so that
/// cutting again until nothing is left wastes no byte. `None` if `room`
/// is below [`MIN_BLOCK`] (those bytes cannot be a block).
pub fn cut_class(room: u64, max: u64) -> Option<u64> {
    let c = largest_class_within(room.min(max))?;
    let left = room - c;
    if left == 0 || left >= MIN_BLOCK {
        return Some(c);
    }
    // Here `room >= 2 * MIN_BLOCK` (below it `room`, a multiple of 16,
    // is a class of at most `max` itself) and `room < c + MIN_BLOCK <=
    // max + MIN_BLOCK`: the class below `room - MIN_BLOCK` is at most
    // `max` and leaves at least MIN_BLOCK.
    largest_class_within(room - MIN_BLOCK).filter(|&c| room - c >= MIN_BLOCK)
}

/// A value block that does not hold what its slot says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ValueError {
    /// Fewer bytes than the header and the value.
    TooShort {
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        needed: u64,
    },
    /// The checksum does not match: torn (read while rewritten) or
    /// corrupted.
    ChecksumMismatch {
        /// The checksum word.
        stored: u64,
        /// The checksum of the other bytes.
        computed: u64,
    },
    /// The reserved word is not 0 (a block of another layout).
    Reserved {
        /// The word.
        word: u32,
    },
    /// The block belongs to another key, or to another write of this one
    /// (another generation or length): the slot that named it is stale.
    OtherOwner {
        /// The key the block names.
        key: u64,
        /// Its length.
        len: u32,
        /// Its generation.
        gen: u32,
    },
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooShort { len, needed } => {
                write!(f, "value block of {len} bytes, need {needed}")
            }
            Self::ChecksumMismatch { stored, computed } => write!(
                f,
                "value block checksum {stored:#018x} does not match contents ({computed:#018x}): torn or corrupted"
            ),
            Self::Reserved { word } => {
                write!(f, "value block reserved word is {word:#x}, not 0")
            }
            Self::OtherOwner { key, len, gen } => write!(
                f,
                "value block now holds key {key} ({len} bytes, generation {gen}): reused"
            ),
        }
    }
}

impl core::error::Error for ValueError {}

/// The first 32 bytes of a value block; the value follows.
///
/// ```text
/// offset  size  field
///      0     8  checksum  xxh3-64 of bytes [8, 32 + len)
///      8     8  key       the key whose value this is
///     16     4  len       the value's length
///     20     4  gen       the block's generation (never 0)
///     24     4  class     bytes of the block, header included (its size class)
///     28     4  reserved  0
///     32   len  value
/// ```
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ValueBlockHeader {
    checksum: U64,
    key: U64,
    len: U32,
    gen: U32,
    class: U32,
    reserved: U32,
}

const _: () = assert!(core::mem::size_of::<ValueBlockHeader>() == 32);

impl ValueBlockHeader {
    /// Bytes of the header.
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;

    /// The key the block names.
    pub fn key(&self) -> u64 {
        self.key.get()
    }

    /// The value's length.
    pub fn len(&self) -> u32 {
        self.len.get()
    }

    /// Whether the value is empty (never, for a block a slot names).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The generation.
    pub fn gen(&self) -> u32 {
        self.gen.get()
    }

    /// The block's bytes (its size class).
    pub fn class(&self) -> u32 {
        self.class.get()
    }
}

/// Writing and checking value blocks.
pub struct ValueBlock;

impl ValueBlock {
    /// Writes the block for `key` → `value` of generation `gen` and size
    /// class `class` into `out`, which must be exactly
    /// `ValueBlockHeader::SIZE + value.len()` bytes (what a writer WRITEs:
    /// the rest of the class is never read). Returns `None` if `out` has
    /// another length.
    pub fn write(out: &mut [u8], key: u64, gen: u32, class: u64, value: &[u8]) -> Option<()> {
        let len = u32::try_from(value.len()).ok()?;
        if out.len() as u64 != ValueBlockHeader::SIZE + u64::from(len) {
            return None;
        }
        let (head, body) = out.split_at_mut(ValueBlockHeader::SIZE as usize);
        body.copy_from_slice(value);
        let header = ValueBlockHeader {
            checksum: U64::new(0),
            key: U64::new(key),
            len: U32::new(len),
            gen: U32::new(gen),
            class: U32::new(u32::try_from(class).unwrap_or(u32::MAX)),
            reserved: U32::new(0),
        };
        head.copy_from_slice(header.as_bytes());
        let sum = xxh3_64(&out[8..]);
        out[..8].copy_from_slice(&sum.to_le_bytes());
        Some(())
    }

    /// The value bytes of `bytes`, READ at `at` for `key`: the block must
    /// be whole (checksum) and name `key`, `at`'s length and generation.
    pub fn check(bytes: &[u8], key: u64, at: BlockRef) -> Result<&[u8], ValueError> {
        let needed = at.read_len();
        if (bytes.len() as u64) < needed {
            return Err(ValueError::TooShort {
                len: bytes.len(),
                needed,
            });
        }
        let bytes = &bytes[..needed as usize];
        let (header, value) =
            ValueBlockHeader::read_from_prefix(bytes).map_err(|_| ValueError::TooShort {
                len: bytes.len(),
                needed,
            })?;
        if header.key() != key || header.len() != at.len || header.gen() != at.gen {
            return Err(ValueError::OtherOwner {
                key: header.key(),
                len: header.len(),
                gen: header.gen(),
            });
        }
        let computed = xxh3_64(&bytes[8..]);
        if computed != header.checksum.get() {
            return Err(ValueError::ChecksumMismatch {
                stored: header.checksum.get(),
                computed,
            });
        }
        if header.reserved.get() != 0 {
            return Err(ValueError::Reserved {
                word: header.reserved.get(),
            });
        }
        Ok(value)
    }
}

/// The first 32 bytes of the value region; blocks follow.
///
/// ```text
/// offset  size  field
///      0     8  alloc     bytes of the block area handed out (FAA target;
///                         may exceed capacity after racing claims)
///      8     8  capacity  bytes of the block area
///     16     8  loaded    bytes of blocks the bulk load wrote (the first
///                         ones handed out)
///     24     8  free      head of the stack of blocks given back
///                         (`tag:24 | position:40`, 0: empty; CAS target;
///                         see `layout::free`)
///     32     …  the block area
/// ```
///
/// (`free` was a reserved 0 before; an empty stack is 0, so older pools
/// read the same.)
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ValueRegionHeader {
    alloc: U64,
    capacity: U64,
    loaded: U64,
    free: U64,
}

const _: () = assert!(core::mem::size_of::<ValueRegionHeader>() == 32);

impl ValueRegionHeader {
    /// Bytes of the header.
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// Offset of `alloc` within the region: the claim `FAA` target.
    pub const ALLOC_OFFSET: u64 = core::mem::offset_of!(Self, alloc) as u64;
    /// Offset of `free` within the region: the free stack's `CAS` target.
    pub const FREE_OFFSET: u64 = core::mem::offset_of!(Self, free) as u64;

    /// A header with `loaded` bytes of `capacity` handed out to the bulk
    /// load.
    pub const fn new(capacity: u64, loaded: u64) -> Self {
        Self {
            alloc: U64::new(loaded),
            capacity: U64::new(capacity),
            loaded: U64::new(loaded),
            free: U64::new(0),
        }
    }

    /// The header at the start of `bytes`.
    pub fn read(bytes: &[u8]) -> Result<Self, LayoutError> {
        Self::read_from_prefix(bytes)
            .map(|(h, _)| h)
            .map_err(|_| LayoutError::TooShort {
                part: Part::ValueRegion,
                needed: Self::SIZE,
                found: bytes.len() as u64,
            })
    }

    /// Bytes handed out so far (may exceed the capacity).
    pub fn alloc(&self) -> u64 {
        self.alloc.get()
    }

    /// Bytes of the block area.
    pub fn capacity(&self) -> u64 {
        self.capacity.get()
    }

    /// Bytes the bulk load wrote.
    pub fn loaded(&self) -> u64 {
        self.loaded.get()
    }

    /// The `free` word (see [`crate::layout::FreeHead`]).
    pub fn free(&self) -> u64 {
        self.free.get()
    }
}

/// Where a pool's value region is (decoded from the superblock).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueRegion {
    offset: u64,
    capacity: u64,
}

impl ValueRegion {
    /// The region at pool offset `offset`, `len` bytes long (header
    /// included).
    pub fn new(offset: u64, len: u64) -> Result<Self, LayoutError> {
        let capacity = len
            .checked_sub(ValueRegionHeader::SIZE)
            .ok_or(LayoutError::TooShort {
                part: Part::ValueRegion,
                needed: ValueRegionHeader::SIZE,
                found: len,
            })?;
        Ok(Self { offset, capacity })
    }

    /// Bytes of the region for a block area of `capacity` bytes.
    pub fn len_for(capacity: u64) -> Result<u64, LayoutError> {
        capacity
            .checked_add(ValueRegionHeader::SIZE + 7)
            .map(|n| n & !7)
            .ok_or(LayoutError::Overflow {
                part: Part::ValueRegion,
            })
    }

    /// Pool offset of the region (its header).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes of the block area.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Pool offset of the `alloc` word.
    pub fn alloc_offset(&self) -> u64 {
        self.offset + ValueRegionHeader::ALLOC_OFFSET
    }

    /// Pool offset of the `free` word (the free stack's head).
    pub fn free_offset(&self) -> u64 {
        self.offset + ValueRegionHeader::FREE_OFFSET
    }

    /// Pool offset of the block area's byte `at`.
    pub fn area_offset(&self, at: u64) -> u64 {
        self.offset + ValueRegionHeader::SIZE + at
    }

    /// The pool offset of the `len` bytes an `FAA(alloc, len)` that
    /// returned `fetched` claimed, if they lie in the block area
    /// ([`LayoutError::ValueRegionFull`] otherwise: nothing was claimed).
    pub fn claim(&self, fetched: u64, len: u64) -> Result<u64, LayoutError> {
        match fetched.checked_add(len) {
            Some(end) if end <= self.capacity => Ok(self.area_offset(fetched)),
            _ => Err(LayoutError::ValueRegionFull {
                fetched,
                len,
                capacity: self.capacity,
            }),
        }
    }

    /// Whether `at` names bytes inside the block area (a pointer read from
    /// a leaf is checked before it is followed).
    pub fn holds(&self, at: BlockRef) -> bool {
        let start = self.offset + ValueRegionHeader::SIZE;
        at.offset >= start
            && at
                .offset
                .checked_add(at.read_len())
                .is_some_and(|end| end <= start + self.capacity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec;

    #[test]
    fn classes_are_within_a_quarter_and_aligned() {
        assert_eq!(block_class(0), Some(64));
        assert_eq!(block_class(32), Some(64));
        assert_eq!(block_class(33), Some(80));
        assert_eq!(block_class(4096), Some(5120));
        assert_eq!(block_class(1024), Some(1280));
        assert_eq!(block_class(MAX_VALUE_LEN + 1), None);
        for len in (0..70_000).step_by(7) {
            let c = block_class(len).unwrap();
            let need = 32 + len as u64;
            assert!(c >= need && c % 8 == 0, "{len}: {c}");
            assert!(c <= MIN_BLOCK.max(need + need / 4 + 8), "{len}: {c}");
        }
    }

    #[test]
    fn slot_words_round_trip_and_bad_words_are_refused() {
        for v in [
            SlotValue::from_u64(7),
            SlotValue::inline(b"").unwrap(),
            SlotValue::inline(b"abc").unwrap(),
            SlotValue::Block(BlockRef {
                offset: 4096,
                len: 9,
                gen: 3,
            }),
        ] {
            let (w, l, g) = v.encode();
            assert_eq!(SlotValue::decode(w, l, g), Some(v));
        }
        assert_eq!(SlotValue::decode(1 << 24, 3, 0), None);
        assert_eq!(SlotValue::decode(0, 9, 0), None);
        assert_eq!(SlotValue::decode(8, 8, 1), None);
        assert_eq!(SlotValue::decode(9, 100, 1), None);
        assert_eq!(SlotValue::inline(&[0; 9]), None);
        assert_eq!(SlotValue::from_u64(5).as_u64(), Some(5));
        assert_eq!(SlotValue::inline(b"abc").unwrap().as_u64(), None);
    }

    #[test]
    fn cuts_are_classes_that_waste_nothing() {
        for max in [2 * MIN_BLOCK, 1024, 1 << 20] {
            for room in (0..40_000u64).step_by(16).chain([(1 << 20) + 16, 5 << 20]) {
                let mut left = room;
                while let Some(c) = cut_class(left, max) {
                    assert!(c <= left && c <= max, "{room}/{max}: {c}");
                    assert_eq!(block_class((c - 32) as usize), Some(c), "{room}: {c}");
                    left -= c;
                }
                if room >= MIN_BLOCK {
                    assert_eq!(left, 0, "{room}/{max}");
                }
            }
        }
    }

    #[test]
    fn region_claims_stay_inside() {
        let r = ValueRegion::new(1000, ValueRegionHeader::SIZE + 4096).unwrap();
        assert_eq!(r.claim(0, 4096), Ok(1032));
        assert!(r.claim(1, 4096).is_err());
        assert!(r.claim(u64::MAX, 1).is_err());
        let b = |offset, len| BlockRef {
            offset,
            len,
            gen: 1,
        };
        assert!(r.holds(b(1032, 100)));
        assert!(!r.holds(b(1024, 100)));
        assert!(!r.holds(b(1032 + 4000, 100)));
        assert!(!r.holds(b(u64::MAX - 8, 100)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn blocks_check_their_owner_and_detect_tears(
            key: u64,
            gen in 1u32..,
            value in proptest::collection::vec(any::<u8>(), 9..300),
            other in proptest::collection::vec(any::<u8>(), 9..300),
            cut in any::<prop::sample::Index>(),
        ) {
            let at = BlockRef { offset: 0, len: value.len() as u32, gen };
            let class = block_class(value.len()).unwrap();
            let mut buf = vec![0u8; at.read_len() as usize];
            ValueBlock::write(&mut buf, key, gen, class, &value).unwrap();
            prop_assert_eq!(ValueBlock::check(&buf, key, at), Ok(&value[..]));
            prop_assert!(ValueBlock::check(&buf, key ^ 1, at).is_err());
            let newer = BlockRef { gen: gen.wrapping_add(1).max(1), ..at };
            prop_assert!(ValueBlock::check(&buf, key, newer).is_err());
            // The same block rewritten for the next generation, read torn.
            let next = BlockRef { len: other.len() as u32, gen: gen.wrapping_add(1).max(1), ..at };
            let mut new = vec![0u8; next.read_len() as usize];
            ValueBlock::write(&mut new, key, next.gen, class, &other).unwrap();
            let cut = cut.index(buf.len().min(new.len()));
            let mut torn = new[..cut].to_vec();
            torn.extend_from_slice(&buf[cut.min(buf.len())..]);
            if torn.len() as u64 >= at.read_len() && torn[..buf.len()] != buf[..] {
                prop_assert!(ValueBlock::check(&torn, key, at).is_err());
            }
        }

        #[test]
        fn any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200), key: u64, len in 0u32..300, gen: u32) {
            let _ = ValueBlock::check(&bytes, key, BlockRef { offset: 0, len, gen });
        }
    }
}
