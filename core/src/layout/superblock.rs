//! The superblock: the first 160 bytes of a pool, saying where everything
//! else is and with which parameters the data set was laid out.
//!
//! A compute node READs it once at connect time and trusts nothing in it
//! until [`Superblock::check`] passes. The invariant `check` establishes:
//! the magic and version are this crate's, every part is 8-byte aligned and
//! inside the pool, the superblock, directory, CirQ, model region and leaf
//! region are pairwise disjoint, and the upper-level blob lies in the model
//! region — so every offset derived from a checked superblock is in bounds.

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{
    CirqHeader, Field, LayoutError, Leaf, LeafRegion, LeafRegionHeader, Part, RedoRegion, Span,
    ValueRegion, ValueRegionHeader,
};
use crate::entry::LtEntry;

/// The first word of every pool: the bytes `"RLXPOOL\0"` read as a
/// little-endian `u64`.
pub const MAGIC: u64 = u64::from_le_bytes(*b"RLXPOOL\0");

/// The version of every layout in [`crate::layout`]; a pool of another
/// version is refused. Version 2: model records carry a label stride and a
/// table of prediction segments. Version 3: leaf-table entries record the
/// lock's owner (`lock:1 | region:7 | pointer:8 | owner:16 | leaf:32`).
/// Version 4: a CirQ slot carries its ticket's tag (`tag:32 | model_id+1:32`),
/// so a skipped producer's late write is never taken for a later ticket's.
/// Version 5: a model record's word at 104 (reserved before) is `refused`,
/// the bytes a retraining needed when the model region was really full.
/// Version 6: a leaf's flag `FREED` marks a leaf retraining gave back, and
/// the agent may fill a new record's unused SLT slots with free leaves
/// (the slot's leaf, for the compute node that claims it). Version 7:
/// values are byte strings — a slot is 24 bytes (key, value word, length,
/// generation: inline bytes or a pointer to a value block), and the pool
/// has a value region (the superblock is 160 bytes). Still version 7: the
/// superblock's two reserved words place the redo log
/// ([`RedoRegion`](super::RedoRegion)); 0 in both (older pools) means none.
pub const LAYOUT_VERSION: u32 = 7;

/// The parameters [`Superblock::plan`] lays a fresh pool out from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolParams {
    /// Id of the pool's leaf region (`0..=127`): the `region` field of its
    /// leaves' entries.
    pub leaf_region_id: u8,
    /// Slots per leaf, `L` (at least 1).
    pub leaf_slots: u32,
    /// Keys placed in each leaf at training (`1..=leaf_slots`).
    pub keys_per_leaf: u32,
    /// The models' error bound ε, in positions.
    pub epsilon: u64,
    /// Leaves the leaf region holds (at least 1).
    pub leaf_capacity: u64,
    /// Model slots in the directory.
    pub directory_capacity: u64,
    /// Slots of the CirQ (at least `directory_capacity`, at least 1).
    pub cirq_capacity: u64,
    /// Bytes of the model region (rounded up to a multiple of 8).
    pub model_region_len: u64,
    /// Bytes of the value region's block area (out-of-line values; may be
    /// 0: then only values of up to `INLINE_MAX` bytes can be stored).
    pub value_capacity: u64,
    /// Blocks of the redo log ([`RedoRegion`]): one per compute client
    /// connected at once. 0: no redo log (leaf writes are not copied, and
    /// a leaf torn by a death stays torn).
    pub redo_blocks: u32,
    /// Slots per redo block: leaf writes one client keeps in flight, and
    /// failed ones it has not written again yet (at least 1 when
    /// `redo_blocks` is not 0).
    pub redo_slots: u32,
}

/// The pool's first 160 bytes.
///
/// ```text
/// offset  size  field
///      0     8  magic               MAGIC
///      8     4  version             LAYOUT_VERSION
///     12     4  leaf_region_id      0..=127
///     16     8  pool_size           bytes of the registered region
///     24     8  directory_offset    u64 per model slot: pool offset of the
///     32     8  directory_capacity    model's current record (0 = unused)
///     40     8  model_count         directory slots in use
///     48     8  cirq_offset         retraining queue
///     56     8  cirq_len
///     64     8  model_region_offset model records, their tables, upper levels
///     72     8  model_region_len
///     80     8  leaf_region_offset  LeafRegionHeader, then leaves
///     88     8  leaf_region_len
///     96     8  upper_offset        blob of upper-level segments (inside the
///    104     8  upper_len             model region; len 0 = none)
///    112     8  epsilon             ε of the models
///    120     4  leaf_slots          L
///    124     4  keys_per_leaf       keys per leaf at training
///    128     8  value_region_offset ValueRegionHeader, then value blocks
///    136     8  value_region_len
///    144     8  redo_offset         the redo log (0 with redo_geometry 0: none)
///    152     8  redo_geometry       blocks << 32 | slots per block
/// ```
///
/// The retraining agent switches a model by one 8-byte write to its
/// directory word ([`directory_entry_offset`](Self::directory_entry_offset)).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct Superblock {
    magic: U64,
    version: U32,
    leaf_region_id: U32,
    pool_size: U64,
    directory_offset: U64,
    directory_capacity: U64,
    model_count: U64,
    cirq_offset: U64,
    cirq_len: U64,
    model_region_offset: U64,
    model_region_len: U64,
    leaf_region_offset: U64,
    leaf_region_len: U64,
    upper_offset: U64,
    upper_len: U64,
    epsilon: U64,
    leaf_slots: U32,
    keys_per_leaf: U32,
    value_region_offset: U64,
    value_region_len: U64,
    redo_offset: U64,
    redo_geometry: U64,
}

const _: () = assert!(core::mem::size_of::<Superblock>() == 160);

/// Rounds `n` up to a multiple of 8.
fn align8(n: u64, part: Part) -> Result<u64, LayoutError> {
    n.checked_add(7)
        .map(|n| n & !7)
        .ok_or(LayoutError::Overflow { part })
}

impl Superblock {
    /// Bytes of the superblock.
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// Offset of `model_count` (updated when the agent adds models).
    pub const MODEL_COUNT_OFFSET: u64 = core::mem::offset_of!(Self, model_count) as u64;
    /// Offset of `upper_offset`.
    pub const UPPER_OFFSET_OFFSET: u64 = core::mem::offset_of!(Self, upper_offset) as u64;
    /// Offset of `upper_len`.
    pub const UPPER_LEN_OFFSET: u64 = core::mem::offset_of!(Self, upper_len) as u64;

    /// Lays out a fresh pool: superblock, directory, CirQ, model region,
    /// leaf region, value region, back to back from offset 0; no models yet and no upper
    /// levels. The result passes [`check`](Self::check).
    pub fn plan(p: &PoolParams) -> Result<Self, LayoutError> {
        let directory_len = p
            .directory_capacity
            .checked_mul(8)
            .ok_or(LayoutError::Overflow {
                part: Part::Directory,
            })?;
        let cirq_len = CirqHeader::len_for(p.cirq_capacity)
            .map_err(|_| LayoutError::Overflow { part: Part::Cirq })?;
        let model_len = align8(p.model_region_len, Part::ModelRegion)?;
        let leaf_len = LeafRegion::len_for(p.leaf_capacity, p.leaf_slots)?;
        let value_len = ValueRegion::len_for(p.value_capacity)?;
        let redo_len = RedoRegion::len_for(p.redo_blocks, p.redo_slots, p.leaf_slots)?;
        let mut at = Self::SIZE;
        let mut place = |len: u64, part: Part| {
            let offset = at;
            at = at.checked_add(len).ok_or(LayoutError::Overflow { part })?;
            Ok::<u64, LayoutError>(offset)
        };
        let directory_offset = place(directory_len, Part::Directory)?;
        let cirq_offset = place(cirq_len, Part::Cirq)?;
        let model_region_offset = place(model_len, Part::ModelRegion)?;
        let leaf_region_offset = place(leaf_len, Part::LeafRegion)?;
        let value_region_offset = place(value_len, Part::ValueRegion)?;
        let redo_offset = if redo_len == 0 {
            0
        } else {
            place(redo_len, Part::RedoLog)?
        };
        let sb = Self {
            magic: U64::new(MAGIC),
            version: U32::new(LAYOUT_VERSION),
            leaf_region_id: U32::new(p.leaf_region_id.into()),
            pool_size: U64::new(at),
            directory_offset: U64::new(directory_offset),
            directory_capacity: U64::new(p.directory_capacity),
            model_count: U64::new(0),
            cirq_offset: U64::new(cirq_offset),
            cirq_len: U64::new(cirq_len),
            model_region_offset: U64::new(model_region_offset),
            model_region_len: U64::new(model_len),
            leaf_region_offset: U64::new(leaf_region_offset),
            leaf_region_len: U64::new(leaf_len),
            upper_offset: U64::new(0),
            upper_len: U64::new(0),
            epsilon: U64::new(p.epsilon),
            leaf_slots: U32::new(p.leaf_slots),
            keys_per_leaf: U32::new(p.keys_per_leaf),
            value_region_offset: U64::new(value_region_offset),
            value_region_len: U64::new(value_len),
            redo_offset: U64::new(redo_offset),
            redo_geometry: U64::new(if redo_len == 0 {
                0
            } else {
                u64::from(p.redo_blocks) << 32 | u64::from(p.redo_slots)
            }),
        };
        sb.check()?;
        Ok(sb)
    }

    /// Decodes and checks the superblock at the start of `bytes`.
    pub fn read(bytes: &[u8]) -> Result<Self, LayoutError> {
        let (sb, _) = Self::read_from_prefix(bytes).map_err(|_| LayoutError::TooShort {
            part: Part::Superblock,
            needed: Self::SIZE,
            found: bytes.len() as u64,
        })?;
        sb.check()?;
        Ok(sb)
    }

    /// The spans of the seven top-level parts (the redo log's empty when
    /// the pool has none).
    fn spans(&self) -> Result<[Span; 7], LayoutError> {
        let directory_len =
            self.directory_capacity()
                .checked_mul(8)
                .ok_or(LayoutError::Overflow {
                    part: Part::Directory,
                })?;
        Ok([
            Span::new(Part::Superblock, 0, Self::SIZE),
            Span::new(Part::Directory, self.directory_offset(), directory_len),
            Span::new(Part::Cirq, self.cirq_offset(), self.cirq_len()),
            Span::new(
                Part::ModelRegion,
                self.model_region_offset(),
                self.model_region_len(),
            ),
            Span::new(
                Part::LeafRegion,
                self.leaf_region_offset(),
                self.leaf_region_len(),
            ),
            Span::new(
                Part::ValueRegion,
                self.value_region_offset(),
                self.value_region_len(),
            ),
            match self.redo_region()? {
                Some(r) => Span::new(Part::RedoLog, r.offset(), r.len()),
                None => Span::new(Part::RedoLog, 0, 0),
            },
        ])
    }

    /// Checks magic, version, parameters, bounds, alignment and overlap.
    pub fn check(&self) -> Result<(), LayoutError> {
        if self.magic.get() != MAGIC {
            return Err(LayoutError::BadMagic {
                found: self.magic.get(),
            });
        }
        if self.version() != LAYOUT_VERSION {
            return Err(LayoutError::UnsupportedVersion {
                found: self.version(),
            });
        }
        let invalid = |field, value| Err(LayoutError::InvalidField { field, value });
        let raw_id = self.leaf_region_id.get();
        if raw_id > LtEntry::MAX_REGION.into() {
            return invalid(Field::LeafRegionId, raw_id.into());
        }
        if self.leaf_slots() == 0 {
            return invalid(Field::LeafSlots, 0);
        }
        if self.keys_per_leaf() == 0 || self.keys_per_leaf() > self.leaf_slots() {
            return invalid(Field::KeysPerLeaf, self.keys_per_leaf().into());
        }
        if self.model_count() > self.directory_capacity() {
            return invalid(Field::ModelCount, self.model_count());
        }
        // Every model id must fit a CirQ slot.
        if self.directory_capacity() > CirqHeader::MAX_MODEL_ID + 1 {
            return invalid(Field::DirectoryCapacity, self.directory_capacity());
        }
        let pool = self.pool_size();
        if pool < Self::SIZE {
            return invalid(Field::PoolSize, pool);
        }
        let spans = self.spans()?;
        for span in &spans {
            span.check_in_pool(pool)?;
        }
        Span::check_disjoint(&spans)?;
        // At most one queued entry per directory slot is outstanding, so a
        // CirQ this large makes producers wait only for abandoned tickets
        // or a stopped consumer (see `CirqHeader`).
        let cirq_capacity = self.cirq_len().saturating_sub(CirqHeader::SIZE) / 8;
        if self.cirq_len() < CirqHeader::SIZE
            || cirq_capacity == 0
            || cirq_capacity < self.directory_capacity()
        {
            return invalid(Field::CirqCapacity, cirq_capacity);
        }
        if self.leaf_region_len() < LeafRegionHeader::SIZE + Leaf::size_for(self.leaf_slots()) {
            return invalid(Field::LeafCapacity, 0);
        }
        if self.value_region_len() < ValueRegionHeader::SIZE {
            return Err(LayoutError::TooShort {
                part: Part::ValueRegion,
                needed: ValueRegionHeader::SIZE,
                found: self.value_region_len(),
            });
        }
        if self.upper_len() > 0 {
            let upper = Span::new(Part::UpperLevels, self.upper_offset(), self.upper_len());
            upper.check_in_pool(pool)?;
            upper.check_inside(&spans[3])?;
        }
        Ok(())
    }

    /// The layout version.
    pub fn version(&self) -> u32 {
        self.version.get()
    }

    /// The leaf region's id (`0..=127` once checked).
    pub fn leaf_region_id(&self) -> u8 {
        u8::try_from(self.leaf_region_id.get()).unwrap_or(u8::MAX)
    }

    /// The redo log, if the pool has one (both words 0: none). Its span
    /// is checked by [`check`](Self::check).
    pub fn redo_region(&self) -> Result<Option<RedoRegion>, LayoutError> {
        let geometry = self.redo_geometry.get();
        if geometry == 0 && self.redo_offset.get() == 0 {
            return Ok(None);
        }
        let (blocks, slots) = ((geometry >> 32) as u32, geometry as u32);
        RedoRegion::new(self.redo_offset.get(), blocks, slots, self.leaf_slots()).map(Some)
    }

    /// Bytes of the pool.
    pub fn pool_size(&self) -> u64 {
        self.pool_size.get()
    }

    /// Pool offset of the model directory.
    pub fn directory_offset(&self) -> u64 {
        self.directory_offset.get()
    }

    /// Model slots in the directory.
    pub fn directory_capacity(&self) -> u64 {
        self.directory_capacity.get()
    }

    /// Directory slots in use.
    pub fn model_count(&self) -> u64 {
        self.model_count.get()
    }

    /// Pool offset of the CirQ.
    pub fn cirq_offset(&self) -> u64 {
        self.cirq_offset.get()
    }

    /// Bytes of the CirQ.
    pub fn cirq_len(&self) -> u64 {
        self.cirq_len.get()
    }

    /// Pool offset of the model region.
    pub fn model_region_offset(&self) -> u64 {
        self.model_region_offset.get()
    }

    /// Bytes of the model region.
    pub fn model_region_len(&self) -> u64 {
        self.model_region_len.get()
    }

    /// Pool offset of the leaf region.
    pub fn leaf_region_offset(&self) -> u64 {
        self.leaf_region_offset.get()
    }

    /// Bytes of the leaf region.
    pub fn leaf_region_len(&self) -> u64 {
        self.leaf_region_len.get()
    }

    /// Pool offset of the upper-level blob.
    pub fn upper_offset(&self) -> u64 {
        self.upper_offset.get()
    }

    /// Bytes of the upper-level blob (0 = none yet).
    pub fn upper_len(&self) -> u64 {
        self.upper_len.get()
    }

    /// Pool offset of the value region.
    pub fn value_region_offset(&self) -> u64 {
        self.value_region_offset.get()
    }

    /// Bytes of the value region (its header included).
    pub fn value_region_len(&self) -> u64 {
        self.value_region_len.get()
    }

    /// The value region as described here.
    pub fn value_region(&self) -> Result<ValueRegion, LayoutError> {
        ValueRegion::new(self.value_region_offset(), self.value_region_len())
    }

    /// The models' ε.
    pub fn epsilon(&self) -> u64 {
        self.epsilon.get()
    }

    /// Slots per leaf, `L`.
    pub fn leaf_slots(&self) -> u32 {
        self.leaf_slots.get()
    }

    /// Keys per leaf at training.
    pub fn keys_per_leaf(&self) -> u32 {
        self.keys_per_leaf.get()
    }

    /// Sets the directory slots in use (checked by [`check`](Self::check)).
    pub fn set_model_count(&mut self, count: u64) {
        self.model_count.set(count);
    }

    /// Points at a new upper-level blob (checked by [`check`](Self::check)).
    pub fn set_upper_levels(&mut self, offset: u64, len: u64) {
        self.upper_offset.set(offset);
        self.upper_len.set(len);
    }

    /// The span of the model region, for checking records against it.
    pub(crate) fn model_region_span(&self) -> Span {
        Span::new(
            Part::ModelRegion,
            self.model_region_offset(),
            self.model_region_len(),
        )
    }

    /// The leaf region as described here: as many leaves as fit its length
    /// (the region header's capacity may be lower, see
    /// [`LeafRegionHeader::check`]).
    pub fn leaf_region(&self) -> Result<LeafRegion, LayoutError> {
        let room = self
            .leaf_region_len()
            .checked_sub(LeafRegionHeader::SIZE)
            .ok_or(LayoutError::TooShort {
                part: Part::LeafRegion,
                needed: LeafRegionHeader::SIZE,
                found: self.leaf_region_len(),
            })?;
        let capacity = (room / Leaf::size_for(self.leaf_slots())).min(LtEntry::MAX_LEAF + 1);
        let id =
            u8::try_from(self.leaf_region_id.get()).map_err(|_| LayoutError::InvalidField {
                field: Field::LeafRegionId,
                value: self.leaf_region_id.get().into(),
            })?;
        LeafRegion::new(id, self.leaf_region_offset(), capacity, self.leaf_slots())
    }

    /// Pool offset of directory slot `model_id`: the word that holds the
    /// pool offset of that model's current record.
    pub fn directory_entry_offset(&self, model_id: u64) -> Result<u64, LayoutError> {
        if model_id >= self.directory_capacity() {
            return Err(LayoutError::IndexOutOfRange {
                part: Part::Directory,
                index: model_id,
                len: self.directory_capacity(),
            });
        }
        model_id
            .checked_mul(8)
            .and_then(|o| o.checked_add(self.directory_offset()))
            .ok_or(LayoutError::Overflow {
                part: Part::Directory,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params() -> PoolParams {
        PoolParams {
            leaf_region_id: 3,
            leaf_slots: 16,
            keys_per_leaf: 12,
            epsilon: 8,
            leaf_capacity: 1000,
            directory_capacity: 64,
            cirq_capacity: 64,
            model_region_len: 1 << 16,
            value_capacity: 1 << 12,
            redo_blocks: 2,
            redo_slots: 3,
        }
    }

    #[test]
    fn offsets_match_the_diagram() {
        assert_eq!(Superblock::MODEL_COUNT_OFFSET, 40);
        assert_eq!(Superblock::UPPER_OFFSET_OFFSET, 96);
        assert_eq!(Superblock::UPPER_LEN_OFFSET, 104);
        let sb = Superblock::plan(&params()).unwrap();
        let bytes = sb.as_bytes();
        assert_eq!(&bytes[..8], b"RLXPOOL\0");
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            LAYOUT_VERSION
        );
        assert_eq!(bytes[12], 3);
        assert_eq!(u32::from_le_bytes(bytes[120..124].try_into().unwrap()), 16);
    }

    #[test]
    fn planned_pool_round_trips_through_bytes() {
        let sb = Superblock::plan(&params()).unwrap();
        let mut pool = std::vec![0u8; 256];
        pool[..160].copy_from_slice(sb.as_bytes());
        let back = Superblock::read(&pool).unwrap();
        assert_eq!(back.as_bytes(), sb.as_bytes());
        let region = back.leaf_region().unwrap();
        assert_eq!(region.capacity(), 1000);
        assert_eq!(region.id(), 3);
        assert_eq!(
            back.value_region_offset(),
            back.leaf_region_offset() + back.leaf_region_len()
        );
        let redo = back.redo_region().unwrap().unwrap();
        assert_eq!(
            redo.offset(),
            back.value_region_offset() + back.value_region_len()
        );
        assert_eq!((redo.blocks(), redo.slots()), (2, 3));
        assert_eq!(back.pool_size(), redo.offset() + redo.len());
        assert_eq!(back.value_region().unwrap().capacity(), 1 << 12);
        // Without a redo log the words are 0 and the pool ends with the
        // value region (as pools laid out before the log read).
        let none = Superblock::plan(&PoolParams {
            redo_blocks: 0,
            ..params()
        })
        .unwrap();
        assert_eq!(none.redo_region(), Ok(None));
        assert_eq!(
            none.pool_size(),
            none.value_region_offset() + none.value_region_len()
        );
        assert_eq!(back.directory_entry_offset(0), Ok(160));
        assert!(back.directory_entry_offset(64).is_err());
    }

    #[test]
    fn bad_superblocks_are_named() {
        assert!(matches!(
            Superblock::read(&[0u8; 100]),
            Err(LayoutError::TooShort { .. })
        ));
        let good = Superblock::plan(&params()).unwrap();

        let mut sb = good;
        sb.magic.set(0xdead);
        assert_eq!(sb.check(), Err(LayoutError::BadMagic { found: 0xdead }));

        let mut sb = good;
        sb.version.set(LAYOUT_VERSION + 1);
        assert_eq!(
            sb.check(),
            Err(LayoutError::UnsupportedVersion {
                found: LAYOUT_VERSION + 1
            })
        );

        let mut sb = good;
        sb.pool_size.set(good.pool_size() - 1);
        assert!(matches!(
            sb.check(),
            Err(LayoutError::OutOfPool {
                part: Part::RedoLog,
                ..
            })
        ));

        let mut sb = good;
        sb.redo_offset.set(good.value_region_offset());
        assert!(matches!(
            sb.check(),
            Err(LayoutError::Overlap {
                b: Part::RedoLog,
                ..
            })
        ));

        let mut sb = good;
        sb.redo_geometry.set(5 << 32);
        assert_eq!(
            sb.check(),
            Err(LayoutError::InvalidField {
                field: Field::RedoGeometry,
                value: 5 << 32
            })
        );

        let mut sb = good;
        sb.cirq_offset.set(good.directory_offset() + 8);
        assert_eq!(
            sb.check(),
            Err(LayoutError::Overlap {
                a: Part::Directory,
                b: Part::Cirq
            })
        );

        let mut sb = good;
        sb.model_region_offset.set(good.model_region_offset() + 4);
        assert!(matches!(
            sb.check(),
            Err(LayoutError::Misaligned {
                part: Part::ModelRegion,
                ..
            })
        ));

        let mut sb = good;
        sb.leaf_region_offset.set(!7);
        assert!(matches!(sb.check(), Err(LayoutError::OutOfPool { .. })));

        let mut sb = good;
        sb.set_upper_levels(good.leaf_region_offset(), 8);
        assert_eq!(
            sb.check(),
            Err(LayoutError::Outside {
                part: Part::UpperLevels,
                container: Part::ModelRegion
            })
        );
        sb.set_upper_levels(good.model_region_offset(), 64);
        assert_eq!(sb.check(), Ok(()));

        let mut sb = good;
        sb.set_model_count(65);
        assert!(matches!(
            sb.check(),
            Err(LayoutError::InvalidField {
                field: Field::ModelCount,
                ..
            })
        ));

        let mut sb = good;
        sb.keys_per_leaf.set(17);
        assert!(matches!(
            sb.check(),
            Err(LayoutError::InvalidField {
                field: Field::KeysPerLeaf,
                ..
            })
        ));

        let mut sb = good;
        sb.leaf_region_id.set(128);
        assert!(matches!(
            sb.check(),
            Err(LayoutError::InvalidField {
                field: Field::LeafRegionId,
                ..
            })
        ));

        let mut p = params();
        p.cirq_capacity = 63;
        assert!(matches!(
            Superblock::plan(&p),
            Err(LayoutError::InvalidField {
                field: Field::CirqCapacity,
                ..
            })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..160)) {
            if let Ok(sb) = Superblock::read(&bytes) {
                let _ = sb.leaf_region();
                let _ = sb.directory_entry_offset(0);
            }
        }

        #[test]
        fn plans_pass_check_and_parts_stay_disjoint(
            id in 0u8..=127,
            slots in 1u32..512,
            leaves in 1u64..1 << 24,
            directory in 0u64..1 << 16,
            extra_cirq in 0u64..64,
            model_len in 0u64..1 << 24,
        ) {
            let p = PoolParams {
                leaf_region_id: id,
                leaf_slots: slots,
                keys_per_leaf: slots,
                epsilon: 4,
                leaf_capacity: leaves,
                directory_capacity: directory,
                cirq_capacity: directory.max(1) + extra_cirq,
                model_region_len: model_len,
                value_capacity: model_len / 2,
                redo_blocks: 0,
                redo_slots: 0,
            };
            let sb = Superblock::plan(&p).unwrap();
            prop_assert_eq!(sb.check(), Ok(()));
            prop_assert_eq!(sb.leaf_region().unwrap().capacity(), leaves);
            prop_assert!(sb.model_region_len() >= model_len);
        }

        #[test]
        fn a_corrupted_word_is_caught_or_harmless(word in 0usize..16, value: u64) {
            // Whatever one field becomes, check() either refuses it or every
            // part still lies in the pool.
            let mut bytes = Superblock::plan(&params()).unwrap().as_bytes().to_vec();
            bytes[word * 8..word * 8 + 8].copy_from_slice(&value.to_le_bytes());
            if let Ok(sb) = Superblock::read(&bytes) {
                let region = sb.leaf_region().unwrap();
                let end = region.offset() + LeafRegion::len_for(region.capacity(), region.leaf_slots()).unwrap();
                prop_assert!(end <= sb.pool_size());
            }
        }
    }
}
