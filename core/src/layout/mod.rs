//! Everything that lives in a memory node's pool, as exact byte layouts.
//!
//! One registered region per memory node holds, in this order when laid out
//! by [`Superblock::plan`]:
//!
//! ```text
//! +------------+-----------------+------+--------------------------+-------------------+----------------+
//! | superblock | model directory | CirQ | model region             | leaf region       | value region   |
//! | (160 B)    | u64 per model   |      | records, LT, fences, SLT,| alloc_num,        | alloc, blocks  |
//! |            |                 |      | segments; upper blob     | capacity, leaves  | (out-of-line)  |
//! +------------+-----------------+------+--------------------------+-------------------+----------------+
//! ```
//!
//! Every in-pool type is `#[repr(C)]`, built only from explicit little-endian
//! fields (so it has alignment 1, no padding, and can be cast from any byte
//! buffer a one-sided READ returned), has a compile-time size assertion and a
//! byte diagram in its doc comment, and exports the byte offsets of the words
//! that compute nodes target with `CAS`/`FAA`. Decoders of pool bytes never
//! panic: a bad layout is a [`LayoutError`], [`LeafError`] or [`CirqError`]
//! naming what was wrong. Every word that one-sided atomics target is at an
//! 8-byte-aligned pool offset (the superblock check enforces region
//! alignment; every type's size is a multiple of 8).

mod agent_area;
mod atomics_probe;
mod cirq;
pub mod free;
mod leaf;
mod leaf_region;
mod model_record;
mod redo;
mod superblock;
pub mod topology;
pub mod value;

pub use agent_area::{
    log_record_size, log_ring_index, AgentArea, AgentAreaError, AgentState, LogRecord, LogRecords,
    AGENT_AREA_VERSION, AGENT_MAGIC,
};
pub use atomics_probe::AtomicsProbe;
pub use cirq::{CirqError, CirqHeader, Pop};
pub use free::{FreeBlock, FreeBundle, FreeError, FreeHead};
pub use leaf::{EditError, Leaf, LeafError, Slot, ValidLeaf};
pub use leaf_region::{LeafRegion, LeafRegionHeader};
pub use model_record::{ModelFlags, ModelRecord, ModelRecordParams, ModelSegment, ModelState};
pub use redo::{RedoClaim, RedoEntry, RedoError, RedoHeader, RedoRegion, REDO_MAGIC};
pub use superblock::{PoolParams, Superblock, LAYOUT_VERSION, MAGIC};
pub use value::{
    block_class, cut_class, largest_class_within, BlockRef, SlotValue, ValueBlock,
    ValueBlockHeader, ValueError, ValueRegion, ValueRegionHeader, INLINE_MAX, MAX_VALUE_LEN,
    MIN_BLOCK,
};

use core::fmt;

/// A part of the pool, as named in a [`LayoutError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Part {
    /// The superblock at offset 0.
    Superblock,
    /// The model directory (one `u64` per model slot).
    Directory,
    /// The retraining queue.
    Cirq,
    /// The model region (records, their tables, upper levels).
    ModelRegion,
    /// The leaf region.
    LeafRegion,
    /// The value region (out-of-line values).
    ValueRegion,
    /// The redo log ([`RedoRegion`]).
    RedoLog,
    /// The blob of upper-level segments.
    UpperLevels,
    /// A model record's header.
    ModelRecord,
    /// A model's leaf table.
    LeafTable,
    /// A model's fence table.
    FenceTable,
    /// A model's synonym leaf table.
    SynonymTable,
    /// A model's segment table.
    SegmentTable,
}

impl fmt::Display for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Superblock => "superblock",
            Self::Directory => "model directory",
            Self::Cirq => "CirQ",
            Self::ModelRegion => "model region",
            Self::LeafRegion => "leaf region",
            Self::ValueRegion => "value region",
            Self::RedoLog => "redo log",
            Self::UpperLevels => "upper-level blob",
            Self::ModelRecord => "model record",
            Self::LeafTable => "leaf table",
            Self::FenceTable => "fence table",
            Self::SynonymTable => "synonym leaf table",
            Self::SegmentTable => "segment table",
        })
    }
}

/// A parameter of the pool or of a model record, as named in a
/// [`LayoutError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// Total pool size.
    PoolSize,
    /// Leaf-region id (must fit an entry's 7-bit region field).
    LeafRegionId,
    /// Slots per leaf, `L`.
    LeafSlots,
    /// Keys per leaf at training.
    KeysPerLeaf,
    /// Number of leaves the leaf region holds.
    LeafCapacity,
    /// Model-directory capacity.
    DirectoryCapacity,
    /// Models in use in the directory.
    ModelCount,
    /// Slots of the CirQ.
    CirqCapacity,
    /// A model's leaf count.
    LeafCount,
    /// A model's slope.
    Slope,
    /// A model's intercept.
    Intercept,
    /// A model's key range (`first_key ..= key_hi`).
    KeyRange,
    /// A model's state word.
    State,
    /// A model's generation.
    Generation,
    /// A forward pointer.
    Forward,
    /// A model's label stride.
    LabelStride,
    /// A model's segment count (or a segment's label span).
    SegmentCount,
    /// A checksum word.
    Checksum,
    /// The redo log's blocks and slots per block.
    RedoGeometry,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::PoolSize => "pool size",
            Self::LeafRegionId => "leaf-region id",
            Self::LeafSlots => "leaf slots (L)",
            Self::KeysPerLeaf => "keys per leaf",
            Self::LeafCapacity => "leaf capacity",
            Self::DirectoryCapacity => "directory capacity",
            Self::ModelCount => "model count",
            Self::CirqCapacity => "CirQ capacity",
            Self::LeafCount => "leaf count",
            Self::Slope => "slope",
            Self::Intercept => "intercept",
            Self::KeyRange => "key range",
            Self::State => "state word",
            Self::Generation => "generation",
            Self::Forward => "forward pointer",
            Self::LabelStride => "label stride",
            Self::SegmentCount => "segment count",
            Self::Checksum => "checksum",
            Self::RedoGeometry => "redo log geometry (blocks << 32 | slots per block)",
        })
    }
}

/// A pool layout that is not what this crate's [`LAYOUT_VERSION`] defines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// Fewer bytes than the layout needs.
    TooShort {
        /// What was being read.
        part: Part,
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        found: u64,
    },
    /// The superblock does not start with [`MAGIC`].
    BadMagic {
        /// The word found instead.
        found: u64,
    },
    /// The superblock's layout version is not [`LAYOUT_VERSION`].
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// A part does not start at an 8-byte-aligned offset (RDMA atomics need
    /// one).
    Misaligned {
        /// The part.
        part: Part,
        /// Its offset.
        offset: u64,
    },
    /// A part reaches past the end of the pool (or its end overflows `u64`).
    OutOfPool {
        /// The part.
        part: Part,
        /// Its offset.
        offset: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// A part is not inside the part that must contain it.
    Outside {
        /// The part.
        part: Part,
        /// Where it must lie.
        container: Part,
    },
    /// Two parts share bytes.
    Overlap {
        /// One part.
        a: Part,
        /// The other.
        b: Part,
    },
    /// A parameter has a value the layout does not allow.
    InvalidField {
        /// The parameter.
        field: Field,
        /// Its value (floating-point values as their bits).
        value: u64,
    },
    /// A model's table is not where the record's layout puts it (right
    /// after the record, in the order [`ModelRecord::new`] lays them out):
    /// a reader fetches a record and its tables in one READ of
    /// [`ModelRecord::total_len`] bytes.
    Misplaced {
        /// The table.
        part: Part,
        /// Where the layout puts it.
        expected: u64,
        /// Where the record says it is.
        found: u64,
    },
    /// An index past the end of a table or region.
    IndexOutOfRange {
        /// The table or region.
        part: Part,
        /// The index asked for.
        index: u64,
        /// Its length.
        len: u64,
    },
    /// A leaf address names a leaf region this pool does not hold.
    WrongRegion {
        /// The region this pool holds.
        expected: u8,
        /// The region named.
        found: u8,
    },
    /// An `alloc_num` `FAA` returned a leaf number past the region's
    /// capacity: no leaf was allocated.
    RegionFull {
        /// The value the `FAA` returned.
        fetched: u64,
        /// The region's capacity.
        capacity: u64,
    },
    /// An `FAA` on the value region's `alloc` returned an offset whose
    /// claim reaches past the region's capacity: nothing was claimed.
    ValueRegionFull {
        /// The offset the `FAA` returned.
        fetched: u64,
        /// Bytes claimed.
        len: u64,
        /// The block area's capacity.
        capacity: u64,
    },
    /// Computing a part's size or offset overflowed `u64`.
    Overflow {
        /// The part.
        part: Part,
    },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooShort {
                part,
                needed,
                found,
            } => write!(f, "{part}: need {needed} bytes, have {found}"),
            Self::BadMagic { found } => {
                write!(
                    f,
                    "superblock magic is {found:#018x}, expected {MAGIC:#018x}"
                )
            }
            Self::UnsupportedVersion { found } => write!(
                f,
                "pool layout version {found}, this build reads version {LAYOUT_VERSION}"
            ),
            Self::Misaligned { part, offset } => {
                write!(f, "{part} at offset {offset:#x} is not 8-byte aligned")
            }
            Self::OutOfPool { part, offset, len } => write!(
                f,
                "{part} [{offset:#x}, +{len:#x}) reaches past the end of the pool"
            ),
            Self::Outside { part, container } => write!(f, "{part} lies outside the {container}"),
            Self::Overlap { a, b } => write!(f, "{a} overlaps {b}"),
            Self::InvalidField { field, value } => write!(f, "invalid {field}: {value}"),
            Self::Misplaced {
                part,
                expected,
                found,
            } => write!(
                f,
                "the {part} is at {found}, not at {expected} where the record's layout puts it"
            ),
            Self::IndexOutOfRange { part, index, len } => {
                write!(f, "index {index} past the end of the {part} (length {len})")
            }
            Self::WrongRegion { expected, found } => write!(
                f,
                "leaf region {found} is not in this pool (its leaf region is {expected})"
            ),
            Self::RegionFull { fetched, capacity } => write!(
                f,
                "leaf region full: alloc_num returned {fetched}, capacity {capacity}"
            ),
            Self::ValueRegionFull {
                fetched,
                len,
                capacity,
            } => write!(
                f,
                "value region full: a claim of {len} bytes at {fetched} passes its capacity {capacity}"
            ),
            Self::Overflow { part } => write!(f, "{part}: offset arithmetic overflows u64"),
        }
    }
}

impl core::error::Error for LayoutError {}

/// A byte range `[offset, offset + len)` of the pool, for bounds and overlap
/// checks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub(crate) part: Part,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl Span {
    pub(crate) const fn new(part: Part, offset: u64, len: u64) -> Self {
        Self { part, offset, len }
    }

    /// The end offset, or `OutOfPool` if it overflows.
    pub(crate) fn end(&self) -> Result<u64, LayoutError> {
        self.offset
            .checked_add(self.len)
            .ok_or(LayoutError::OutOfPool {
                part: self.part,
                offset: self.offset,
                len: self.len,
            })
    }

    /// Checks 8-byte alignment and that the span ends within `pool_size`.
    pub(crate) fn check_in_pool(&self, pool_size: u64) -> Result<(), LayoutError> {
        if self.offset % 8 != 0 {
            return Err(LayoutError::Misaligned {
                part: self.part,
                offset: self.offset,
            });
        }
        if self.end()? > pool_size {
            return Err(LayoutError::OutOfPool {
                part: self.part,
                offset: self.offset,
                len: self.len,
            });
        }
        Ok(())
    }

    /// Whether the two spans share a byte (empty spans share none).
    pub(crate) fn overlaps(&self, other: &Span) -> bool {
        // Callers check both ends first; saturate so this stays total anyway.
        self.len > 0
            && other.len > 0
            && self.offset < other.offset.saturating_add(other.len)
            && other.offset < self.offset.saturating_add(self.len)
    }

    /// Checks that `self` lies inside `container`.
    pub(crate) fn check_inside(&self, container: &Span) -> Result<(), LayoutError> {
        let inside = self.offset >= container.offset && self.end()? <= container.end()?;
        if inside {
            Ok(())
        } else {
            Err(LayoutError::Outside {
                part: self.part,
                container: container.part,
            })
        }
    }

    /// Checks that no two of `spans` overlap.
    pub(crate) fn check_disjoint(spans: &[Span]) -> Result<(), LayoutError> {
        for (i, a) in spans.iter().enumerate() {
            for b in &spans[i + 1..] {
                if a.overlaps(b) {
                    return Err(LayoutError::Overlap {
                        a: a.part,
                        b: b.part,
                    });
                }
            }
        }
        Ok(())
    }
}
