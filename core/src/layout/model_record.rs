//! A model record in the model region: the model's parameters and state,
//! and where its leaf table (LT), fence table and synonym leaf table (SLT)
//! are.
//!
//! The record's first word is a [`ModelState`]: flags, generation and a
//! forward pointer in one `u64`, so a get can READ it in the same doorbell
//! batch as its leaves and learn whether its cached model was retired. The
//! invariant [`ModelRecord::check`] establishes: every table the record
//! names lies inside the model region, aligned, disjoint from the record and
//! from each other, and the parameters are usable (finite floats, a
//! non-empty key range, a leaf count an entry can address).

use bitflags::bitflags;
use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{Field, LayoutError, Part, Span, Superblock};
use crate::entry::{LtEntry, SltHeader};

bitflags! {
    /// The flag bits of a [`ModelState`], in place.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct ModelFlags: u64 {
        /// Retraining has started to replace this model: its LT entries are
        /// being locked, writers wait or refresh.
        const FROZEN = 1 << 62;
        /// The model was replaced; the forward pointer names its successor.
        const RETIRED = 1 << 63;
    }
}

/// A model's state word: `retired:1 | frozen:1 | generation:14 | forward:48`.
///
/// ```text
///  63  62  61          48 47                                              0
/// +---+---+--------------+-------------------------------------------------+
/// |RET|FRZ|  generation  |          forward (pool offset, 0 = none)        |
/// +---+---+--------------+-------------------------------------------------+
/// ```
///
/// - `generation` counts retrainings of the key range, modulo 2^14 (compare
///   it for equality only).
/// - `forward` is the pool offset of the record that replaced this one in
///   the same directory slot; nonzero exactly when `RETIRED` is set (offset
///   0 is the superblock, never a record).
/// - A model goes live → `FROZEN` → `FROZEN | RETIRED`. A retraining that
///   gives up after freezing (nothing of a successor became visible) thaws
///   it back to live; a retired model never changes again.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct ModelState(u64);

impl ModelState {
    /// Width of the forward pointer.
    pub const FORWARD_BITS: u32 = 48;
    /// Width of the generation.
    pub const GENERATION_BITS: u32 = 14;
    /// Width of the flags.
    pub const FLAG_BITS: u32 = 2;
    /// Position of the generation's lowest bit.
    pub const GENERATION_SHIFT: u32 = Self::FORWARD_BITS;
    /// The forward-pointer bits.
    pub const FORWARD_MASK: u64 = (1 << Self::FORWARD_BITS) - 1;
    /// The generation bits, in place.
    pub const GENERATION_MASK: u64 = ((1 << Self::GENERATION_BITS) - 1) << Self::GENERATION_SHIFT;
    /// The largest generation.
    pub const MAX_GENERATION: u16 = (1 << Self::GENERATION_BITS) - 1;

    /// A live (neither frozen nor retired) model of `generation`.
    pub const fn live(generation: u16) -> Result<Self, LayoutError> {
        if generation > Self::MAX_GENERATION {
            return Err(LayoutError::InvalidField {
                field: Field::Generation,
                value: generation as u64,
            });
        }
        Ok(Self((generation as u64) << Self::GENERATION_SHIFT))
    }

    /// The word stored as `raw`; [`check`](Self::check) tells whether it is
    /// consistent.
    pub const fn from_raw(raw: u64) -> Self {
        Self(raw)
    }

    /// The word as stored.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The flags.
    pub const fn flags(self) -> ModelFlags {
        ModelFlags::from_bits_truncate(self.0)
    }

    /// Whether the model is frozen (retraining is replacing it).
    pub const fn is_frozen(self) -> bool {
        self.flags().contains(ModelFlags::FROZEN)
    }

    /// Whether the model was replaced.
    pub const fn is_retired(self) -> bool {
        self.flags().contains(ModelFlags::RETIRED)
    }

    /// The generation.
    pub const fn generation(self) -> u16 {
        ((self.0 & Self::GENERATION_MASK) >> Self::GENERATION_SHIFT) as u16
    }

    /// The successor record's pool offset, if retired.
    pub const fn forward(self) -> Option<u64> {
        match self.0 & Self::FORWARD_MASK {
            0 => None,
            f => Some(f),
        }
    }

    /// The generation a successor record gets (wrapping).
    pub const fn next_generation(self) -> u16 {
        (self.generation() + 1) & Self::MAX_GENERATION
    }

    /// This state with `FROZEN` set.
    pub const fn frozen(self) -> Self {
        Self(self.0 | ModelFlags::FROZEN.bits())
    }

    /// This state frozen and retired, forwarding to the record at pool
    /// offset `forward` (nonzero, 8-aligned, below 2^48).
    pub const fn retired(self, forward: u64) -> Result<Self, LayoutError> {
        if forward == 0 || forward % 8 != 0 || forward > Self::FORWARD_MASK {
            return Err(LayoutError::InvalidField {
                field: Field::Forward,
                value: forward,
            });
        }
        let flags = ModelFlags::FROZEN.bits() | ModelFlags::RETIRED.bits();
        Ok(Self((self.0 & !Self::FORWARD_MASK) | flags | forward))
    }

    /// Checks that the word is one the transitions above can produce.
    pub const fn check(self) -> Result<(), LayoutError> {
        let bad = Err(LayoutError::InvalidField {
            field: Field::State,
            value: self.0,
        });
        match (self.is_retired(), self.forward()) {
            (false, None) => Ok(()),
            (true, Some(f)) if self.is_frozen() && f % 8 == 0 => Ok(()),
            _ => bad,
        }
    }
}

const _: () =
    assert!(ModelState::FLAG_BITS + ModelState::GENERATION_BITS + ModelState::FORWARD_BITS == 64);
const _: () = assert!(
    ModelFlags::all().bits() | ModelState::GENERATION_MASK | ModelState::FORWARD_MASK == u64::MAX
);
const _: () = assert!(ModelFlags::all().bits() & ModelState::GENERATION_MASK == 0);

impl core::fmt::Debug for ModelState {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ModelState")
            .field("flags", &self.flags())
            .field("generation", &self.generation())
            .field("forward", &self.forward())
            .finish()
    }
}

/// The values a new record is made from (everything but its table offsets,
/// which [`ModelRecord::new`] lays out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelRecordParams {
    /// The directory slot this record serves.
    pub model_id: u64,
    /// The smallest key the model covers (inclusive).
    pub first_key: u64,
    /// The largest key the model covers (inclusive).
    pub key_hi: u64,
    /// Label stride `S`: the key of rank `r` in training leaf `j` has label
    /// `j · S + r` (at least 1).
    pub label_stride: u64,
    /// Segments of the model's prediction function (at least 1).
    pub segment_count: u64,
    /// Keys the model was trained on.
    pub train_keys: u64,
    /// Training leaves: the LT's and the fence table's length (at least 1).
    pub leaf_count: u64,
    /// The error bound ε the model was trained with.
    pub epsilon: u64,
    /// The record's generation.
    pub generation: u16,
    /// Pool offset of the record this one was built from by retraining
    /// (0: none, bulk-loaded).
    pub predecessor: u64,
}

/// One piece of a model's prediction function, as stored in the record's
/// segment table.
///
/// ```text
/// offset  size  field
///      0     8  first_key  first training key of the piece
///      8     8  base       label of first_key
///     16     8  len        labels spanned: last label − base + 1 (≥ 1)
///     24     8  slope      f64 bits, ≥ 0
///     32     8  intercept  f64 bits: predicted local label of first_key
/// ```
///
/// The prediction for a key `x` of the piece is `base + clamp(round(
/// intercept + slope · (x − first_key)), 0, len − 1)`. Pieces are stored in
/// key order with increasing, disjoint label spans, so the whole function
/// is monotone.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ModelSegment {
    first_key: U64,
    base: U64,
    len: U64,
    slope: U64,
    intercept: U64,
}

const _: () = assert!(core::mem::size_of::<ModelSegment>() == 40);

impl ModelSegment {
    /// Bytes of one segment.
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;

    /// A segment over labels `base .. base + len`; checked for usable
    /// parameters.
    pub fn new(
        first_key: u64,
        base: u64,
        len: u64,
        slope: f64,
        intercept: f64,
    ) -> Result<Self, LayoutError> {
        let s = Self {
            first_key: U64::new(first_key),
            base: U64::new(base),
            len: U64::new(len),
            slope: U64::new(slope.to_bits()),
            intercept: U64::new(intercept.to_bits()),
        };
        s.check()?;
        Ok(s)
    }

    /// Decodes the segment at the start of `bytes` and checks it.
    pub fn read(bytes: &[u8]) -> Result<Self, LayoutError> {
        let (s, _) = Self::read_from_prefix(bytes).map_err(|_| LayoutError::TooShort {
            part: Part::SegmentTable,
            needed: Self::SIZE,
            found: bytes.len() as u64,
        })?;
        s.check()?;
        Ok(s)
    }

    /// Checks that the prediction is monotone and total: a finite slope
    /// `≥ 0`, a finite intercept, `len ≥ 1`, and `base + len` fits `u64`.
    pub fn check(&self) -> Result<(), LayoutError> {
        let invalid = |field, value| Err(LayoutError::InvalidField { field, value });
        if !(self.slope() >= 0.0 && self.slope().is_finite()) {
            return invalid(Field::Slope, self.slope.get());
        }
        if !self.intercept().is_finite() {
            return invalid(Field::Intercept, self.intercept.get());
        }
        if self.is_empty() || self.base().checked_add(self.len()).is_none() {
            return invalid(Field::SegmentCount, self.len());
        }
        Ok(())
    }

    /// The first training key.
    pub fn first_key(&self) -> u64 {
        self.first_key.get()
    }

    /// The label of the first training key.
    pub fn base(&self) -> u64 {
        self.base.get()
    }

    /// Labels spanned.
    pub fn len(&self) -> u64 {
        self.len.get()
    }

    /// Whether the segment spans no label (never for a checked one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slope (labels per key).
    pub fn slope(&self) -> f64 {
        f64::from_bits(self.slope.get())
    }

    /// The intercept (local label of `first_key`).
    pub fn intercept(&self) -> f64 {
        f64::from_bits(self.intercept.get())
    }

    /// The predicted label of `key`, monotone in `key`, within
    /// `[base, base + len − 1]`.
    pub fn predict(&self, key: u64) -> u64 {
        let dx = key.saturating_sub(self.first_key()) as f64;
        let v = self.intercept() + self.slope() * dx;
        // `as u64` saturates (negatives and NaN give 0) and truncates.
        let p = ((v + 0.5) as u64).min(self.len().saturating_sub(1));
        self.base().saturating_add(p)
    }
}

/// A model record's fixed 120 bytes. By default ([`ModelRecord::new`]) its
/// tables follow it in this order:
///
/// ```text
/// offset  size  field
///      0     8  state            ModelState: flags | generation | forward
///      8     8  model_id         directory slot served
///     16     8  first_key        smallest key covered (inclusive)
///     24     8  key_hi           largest key covered (inclusive)
///     32     8  label_stride     S: label of rank r in training leaf j is j·S + r
///     40     8  segment_count    g: pieces of the prediction function (≥ 1)
///     48     8  train_keys       keys trained on
///     56     8  leaf_count       n: LT and fence-table length
///     64     8  epsilon          ε
///     72     8  lt_offset        pool offset of LT: n LtEntry words
///     80     8  fences_offset    pool offset of fence table: n u64, fence_lo of
///                                training leaf i; its fence_hi is fence_lo of
///                                leaf i+1 minus 1, or key_hi for the last leaf
///     88     8  slt_offset       pool offset of SLT: 256 words, word 0 the
///                                SltHeader, words 1..=255 LtEntry
///     96     8  segments_offset  pool offset of g ModelSegment (40 B each)
///    104     8  refused          bytes a retraining of this model needed and
///                                the model region did not have (0: none); set
///                                by the agent when the region is really full
///    112     8  predecessor      pool offset of the record retraining built
///                                this one from (0: bulk-loaded): where a
///                                restarted agent finds the leaves a
///                                retraining that died merged into this one's
/// 120 + 0        8n  LT
/// 120 + 8n       8n  fence table
/// 120 + 16n    2048  SLT
/// 2168 + 16n    40g  segment table
/// ```
///
/// The fence table lets a compute node that caches it lock the chain that
/// owns a key without reading a leaf first.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct ModelRecord {
    state: U64,
    model_id: U64,
    first_key: U64,
    key_hi: U64,
    label_stride: U64,
    segment_count: U64,
    train_keys: U64,
    leaf_count: U64,
    epsilon: U64,
    lt_offset: U64,
    fences_offset: U64,
    slt_offset: U64,
    segments_offset: U64,
    refused: U64,
    predecessor: U64,
}

const _: () = assert!(core::mem::size_of::<ModelRecord>() == 120);

impl ModelRecord {
    /// Bytes of the fixed part.
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// Offset of the state word within the record.
    pub const STATE_OFFSET: u64 = core::mem::offset_of!(Self, state) as u64;
    /// Offset of the `refused` word within the record (written by the
    /// agent only, read by compute nodes with the record).
    pub const REFUSED_OFFSET: u64 = core::mem::offset_of!(Self, refused) as u64;
    /// Bytes of an SLT.
    pub const SLT_SIZE: u64 = SltHeader::SLOTS as u64 * 8;

    /// Bytes of a record with `leaf_count` training leaves and
    /// `segment_count` segments laid out as [`new`](Self::new) does:
    /// header, LT, fence table, SLT, segment table.
    pub fn size_for(leaf_count: u64, segment_count: u64) -> Result<u64, LayoutError> {
        leaf_count
            .checked_mul(16)
            .and_then(|t| t.checked_add(Self::SIZE + Self::SLT_SIZE))
            .and_then(|t| t.checked_add(segment_count.checked_mul(ModelSegment::SIZE)?))
            .ok_or(LayoutError::Overflow {
                part: Part::ModelRecord,
            })
    }

    /// A record to be written at pool offset `at`, its tables following it
    /// (the LT, fence table, SLT and segments themselves are written
    /// separately).
    pub fn new(at: u64, p: &ModelRecordParams) -> Result<Self, LayoutError> {
        let size = Self::size_for(p.leaf_count, p.segment_count)?;
        at.checked_add(size).ok_or(LayoutError::Overflow {
            part: Part::ModelRecord,
        })?;
        // Cannot overflow: `at + size` fits.
        let lt = at + Self::SIZE;
        let fences = lt + 8 * p.leaf_count;
        let slt = fences + 8 * p.leaf_count;
        let segments = slt + Self::SLT_SIZE;
        let record = Self {
            state: U64::new(ModelState::live(p.generation)?.raw()),
            model_id: U64::new(p.model_id),
            first_key: U64::new(p.first_key),
            key_hi: U64::new(p.key_hi),
            label_stride: U64::new(p.label_stride),
            segment_count: U64::new(p.segment_count),
            train_keys: U64::new(p.train_keys),
            leaf_count: U64::new(p.leaf_count),
            epsilon: U64::new(p.epsilon),
            lt_offset: U64::new(lt),
            fences_offset: U64::new(fences),
            slt_offset: U64::new(slt),
            segments_offset: U64::new(segments),
            refused: U64::new(0),
            predecessor: U64::new(p.predecessor),
        };
        record.check_fields()?;
        Ok(record)
    }

    /// Decodes the record at the start of `bytes` (not yet checked).
    pub fn read(bytes: &[u8]) -> Result<Self, LayoutError> {
        Self::read_from_prefix(bytes)
            .map(|(r, _)| r)
            .map_err(|_| LayoutError::TooShort {
                part: Part::ModelRecord,
                needed: Self::SIZE,
                found: bytes.len() as u64,
            })
    }

    /// The state word.
    pub fn state(&self) -> ModelState {
        ModelState::from_raw(self.state.get())
    }

    /// Replaces the state word.
    pub fn set_state(&mut self, state: ModelState) {
        self.state.set(state.raw());
    }

    /// Bytes a retraining of this model needed and the model region did
    /// not have, even counting the records still in their grace period (0:
    /// none). While it is nonzero the model's SLT will not be emptied: a
    /// writer that finds the SLT full fails at once ("pool full") instead
    /// of waiting for a retraining.
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Pool offset of the record retraining built this one from (0:
    /// bulk-loaded).
    pub fn predecessor(&self) -> u64 {
        self.predecessor.get()
    }

    /// The directory slot served.
    pub fn model_id(&self) -> u64 {
        self.model_id.get()
    }

    /// The smallest key covered (inclusive).
    pub fn first_key(&self) -> u64 {
        self.first_key.get()
    }

    /// The largest key covered (inclusive).
    pub fn key_hi(&self) -> u64 {
        self.key_hi.get()
    }

    /// The label stride `S`.
    pub fn label_stride(&self) -> u64 {
        self.label_stride.get()
    }

    /// Segments of the prediction function.
    pub fn segment_count(&self) -> u64 {
        self.segment_count.get()
    }

    /// Pool offset of the segment table.
    pub fn segments_offset(&self) -> u64 {
        self.segments_offset.get()
    }

    /// Pool offset of segment `index`.
    pub fn segment_offset(&self, index: u64) -> Result<u64, LayoutError> {
        if index >= self.segment_count() {
            return Err(LayoutError::IndexOutOfRange {
                part: Part::SegmentTable,
                index,
                len: self.segment_count(),
            });
        }
        index
            .checked_mul(ModelSegment::SIZE)
            .and_then(|o| o.checked_add(self.segments_offset()))
            .ok_or(LayoutError::Overflow {
                part: Part::SegmentTable,
            })
    }

    /// Bytes from the record's start to the end of its last table, when the
    /// tables follow the record as [`new`](Self::new) lays them out (what
    /// one READ of the whole model fetches).
    pub fn total_len(&self) -> Result<u64, LayoutError> {
        Self::size_for(self.leaf_count(), self.segment_count())
    }

    /// Keys trained on.
    pub fn train_keys(&self) -> u64 {
        self.train_keys.get()
    }

    /// Training leaves (LT length).
    pub fn leaf_count(&self) -> u64 {
        self.leaf_count.get()
    }

    /// The error bound ε.
    pub fn epsilon(&self) -> u64 {
        self.epsilon.get()
    }

    /// Pool offset of the LT.
    pub fn lt_offset(&self) -> u64 {
        self.lt_offset.get()
    }

    /// Pool offset of the fence table.
    pub fn fences_offset(&self) -> u64 {
        self.fences_offset.get()
    }

    /// Pool offset of the SLT (of its header word).
    pub fn slt_offset(&self) -> u64 {
        self.slt_offset.get()
    }

    /// Pool offset of the `index`-th 8-byte word of a table of `len` words.
    fn word_offset(part: Part, base: u64, index: u64, len: u64) -> Result<u64, LayoutError> {
        if index >= len {
            return Err(LayoutError::IndexOutOfRange { part, index, len });
        }
        index
            .checked_mul(8)
            .and_then(|o| o.checked_add(base))
            .ok_or(LayoutError::Overflow { part })
    }

    /// Pool offset of LT entry `index` (a lock-CAS target).
    pub fn lt_entry_offset(&self, index: u64) -> Result<u64, LayoutError> {
        Self::word_offset(Part::LeafTable, self.lt_offset(), index, self.leaf_count())
    }

    /// Pool offset of training leaf `index`'s `fence_lo`.
    pub fn fence_offset(&self, index: u64) -> Result<u64, LayoutError> {
        Self::word_offset(
            Part::FenceTable,
            self.fences_offset(),
            index,
            self.leaf_count(),
        )
    }

    /// Pool offset of SLT slot `slot`; slot 0 is the [`SltHeader`] (the
    /// slot-claim `FAA` target).
    pub fn slt_slot_offset(&self, slot: u8) -> Result<u64, LayoutError> {
        Self::word_offset(
            Part::SynonymTable,
            self.slt_offset(),
            slot.into(),
            SltHeader::SLOTS as u64,
        )
    }

    /// The checks that need no pool: state, parameters, table sizes.
    fn check_fields(&self) -> Result<(), LayoutError> {
        let invalid = |field, value| Err(LayoutError::InvalidField { field, value });
        self.state().check()?;
        if self.first_key() > self.key_hi() {
            return invalid(Field::KeyRange, self.first_key());
        }
        if self.label_stride() == 0 {
            return invalid(Field::LabelStride, 0);
        }
        // At least one piece, and the table's size must be computable.
        if self.segment_count() == 0 || self.segment_count() > u64::MAX / (2 * ModelSegment::SIZE) {
            return invalid(Field::SegmentCount, self.segment_count());
        }
        // Each training leaf has an LT entry, and an entry addresses at most
        // 2^48 leaves.
        if self.leaf_count() == 0 || self.leaf_count() > LtEntry::MAX_LEAF + 1 {
            return invalid(Field::LeafCount, self.leaf_count());
        }
        Ok(())
    }

    /// Checks the record found at pool offset `at` against the superblock:
    /// fields, a model id inside the directory, and that the record and its tables lie disjoint, aligned,
    /// inside the model region.
    pub fn check(&self, at: u64, sb: &Superblock) -> Result<(), LayoutError> {
        self.check_fields()?;
        if self.model_id() >= sb.directory_capacity() {
            return Err(LayoutError::IndexOutOfRange {
                part: Part::Directory,
                index: self.model_id(),
                len: sb.directory_capacity(),
            });
        }
        // leaf_count <= 2^48, so 8 * leaf_count cannot overflow.
        let table = 8 * self.leaf_count();
        // The tables follow the record as `new` lays them out: a reader
        // takes them out of one READ of `total_len` bytes from `at`.
        let total = self.total_len()?;
        at.checked_add(total).ok_or(LayoutError::OutOfPool {
            part: Part::ModelRecord,
            offset: at,
            len: total,
        })?;
        let lt = at + Self::SIZE;
        let layout = [
            (Part::LeafTable, lt, self.lt_offset()),
            (Part::FenceTable, lt + table, self.fences_offset()),
            (Part::SynonymTable, lt + 2 * table, self.slt_offset()),
            (
                Part::SegmentTable,
                lt + 2 * table + Self::SLT_SIZE,
                self.segments_offset(),
            ),
        ];
        for (part, expected, found) in layout {
            if found != expected {
                return Err(LayoutError::Misplaced {
                    part,
                    expected,
                    found,
                });
            }
        }
        let spans = [
            Span::new(Part::ModelRecord, at, Self::SIZE),
            Span::new(Part::LeafTable, self.lt_offset(), table),
            Span::new(Part::FenceTable, self.fences_offset(), table),
            Span::new(Part::SynonymTable, self.slt_offset(), Self::SLT_SIZE),
            Span::new(
                Part::SegmentTable,
                self.segments_offset(),
                self.segment_count() * ModelSegment::SIZE,
            ),
        ];
        let region = sb.model_region_span();
        for span in &spans {
            span.check_in_pool(sb.pool_size())?;
            span.check_inside(&region)?;
        }
        Span::check_disjoint(&spans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::PoolParams;
    use proptest::prelude::*;

    fn params(leaf_count: u64) -> ModelRecordParams {
        ModelRecordParams {
            model_id: 3,
            first_key: 100,
            key_hi: 10_000,
            label_stride: 8,
            segment_count: 2,
            train_keys: 1234,
            leaf_count,
            epsilon: 16,
            generation: 5,
            predecessor: 0,
        }
    }

    fn pool() -> Superblock {
        Superblock::plan(&PoolParams {
            leaf_region_id: 0,
            leaf_slots: 8,
            keys_per_leaf: 6,
            epsilon: 16,
            leaf_capacity: 10,
            directory_capacity: 4,
            cirq_capacity: 4,
            model_region_len: 1 << 16,
            value_capacity: 0,
            redo_blocks: 0,
            redo_slots: 0,
        })
        .unwrap()
    }

    #[test]
    fn layout_matches_the_diagram() {
        let at = 4096;
        let r = ModelRecord::new(at, &params(10)).unwrap();
        assert_eq!(ModelRecord::STATE_OFFSET, 0);
        assert_eq!(ModelRecord::REFUSED_OFFSET, 104);
        assert_eq!(r.refused(), 0);
        assert_eq!(r.lt_offset(), at + 120);
        assert_eq!(r.fences_offset(), at + 120 + 80);
        assert_eq!(r.slt_offset(), at + 120 + 160);
        assert_eq!(r.segments_offset(), at + 120 + 160 + 2048);
        assert_eq!(ModelRecord::size_for(10, 2), Ok(120 + 160 + 2048 + 80));
        assert_eq!(r.total_len(), Ok(120 + 160 + 2048 + 80));
        assert_eq!(r.lt_entry_offset(9), Ok(at + 120 + 72));
        assert!(r.lt_entry_offset(10).is_err());
        assert_eq!(r.fence_offset(0), Ok(at + 200));
        assert_eq!(r.slt_slot_offset(0), Ok(at + 280));
        assert_eq!(r.slt_slot_offset(255), Ok(at + 280 + 255 * 8));
        assert_eq!(r.segment_offset(1), Ok(at + 280 + 2048 + 40));
        assert!(r.segment_offset(2).is_err());
        assert_eq!(r.label_stride(), 8);
        assert_eq!(r.segment_count(), 2);
        assert_eq!(r.state().generation(), 5);
        let back = ModelRecord::read(r.as_bytes()).unwrap();
        assert_eq!(back.as_bytes(), r.as_bytes());
    }

    #[test]
    fn record_checks_against_the_model_region() {
        let sb = pool();
        let at = sb.model_region_offset();
        let r = ModelRecord::new(at, &params(10)).unwrap();
        assert_eq!(r.check(at, &sb), Ok(()));
        // Past the region's end.
        let end = sb.model_region_offset() + sb.model_region_len();
        let late = ModelRecord::new(end - 120, &params(10)).unwrap();
        assert!(matches!(
            late.check(end - 120, &sb),
            Err(LayoutError::OutOfPool { .. }) | Err(LayoutError::Outside { .. })
        ));
        // Tables anywhere but where the record's layout puts them (a reader
        // slices them out of one READ of `total_len` bytes from `at`):
        // overlapping the record, or elsewhere in the region.
        let mut bad = r;
        bad.lt_offset.set(at);
        assert_eq!(
            bad.check(at, &sb),
            Err(LayoutError::Misplaced {
                part: Part::LeafTable,
                expected: at + 120,
                found: at
            })
        );
        let mut bad = r;
        bad.slt_offset.set(at + 8192);
        assert!(matches!(
            bad.check(at, &sb),
            Err(LayoutError::Misplaced {
                part: Part::SynonymTable,
                ..
            })
        ));
        let mut bad = r;
        bad.model_id.set(4);
        assert_eq!(
            bad.check(at, &sb),
            Err(LayoutError::IndexOutOfRange {
                part: Part::Directory,
                index: 4,
                len: 4
            })
        );
        let mut bad = r;
        bad.label_stride.set(0);
        assert!(matches!(
            bad.check(at, &sb),
            Err(LayoutError::InvalidField {
                field: Field::LabelStride,
                ..
            })
        ));
        let mut bad = r;
        bad.segment_count.set(0);
        assert!(matches!(
            bad.check(at, &sb),
            Err(LayoutError::InvalidField {
                field: Field::SegmentCount,
                ..
            })
        ));
        assert!(matches!(
            ModelSegment::new(0, 0, 1, f64::NAN, 0.0),
            Err(LayoutError::InvalidField {
                field: Field::Slope,
                ..
            })
        ));
        assert!(ModelSegment::new(0, 0, 1, -1.0, 0.0).is_err());
        assert!(ModelSegment::new(0, 0, 0, 1.0, 0.0).is_err());
        assert!(ModelSegment::new(0, 0, 1, 1.0, f64::INFINITY).is_err());
        let mut p = params(0);
        assert!(ModelRecord::new(at, &p).is_err());
        p.leaf_count = 1;
        p.key_hi = 1;
        assert!(ModelRecord::new(at, &p).is_err());
    }

    #[test]
    fn state_transitions() {
        let live = ModelState::live(3).unwrap();
        assert_eq!(live.check(), Ok(()));
        assert!(!live.is_frozen() && !live.is_retired());
        let frozen = live.frozen();
        assert!(frozen.is_frozen() && !frozen.is_retired());
        assert_eq!(frozen.check(), Ok(()));
        let retired = frozen.retired(4096).unwrap();
        assert!(retired.is_retired() && retired.is_frozen());
        assert_eq!(retired.forward(), Some(4096));
        assert_eq!(retired.generation(), 3);
        assert_eq!(retired.check(), Ok(()));
        assert!(live.retired(0).is_err());
        assert!(live.retired(4097).is_err());
        assert!(live.retired(1 << 48).is_err());
        assert!(ModelState::live(1 << 14).is_err());
        assert_eq!(
            ModelState::live(ModelState::MAX_GENERATION)
                .unwrap()
                .next_generation(),
            0
        );
        // Forward without RETIRED, RETIRED without forward: refused.
        assert!(ModelState::from_raw(8).check().is_err());
        assert!(
            ModelState::from_raw(ModelFlags::RETIRED.bits() | ModelFlags::FROZEN.bits())
                .check()
                .is_err()
        );
    }

    #[test]
    fn segment_predictions_stay_in_their_span() {
        let s = ModelSegment::new(1000, 40, 10, 0.5, 0.2).unwrap();
        assert_eq!(s.predict(0), 40);
        assert_eq!(s.predict(1000), 40);
        assert_eq!(s.predict(1004), 42);
        assert_eq!(s.predict(u64::MAX), 49);
        let back = ModelSegment::read(s.as_bytes()).unwrap();
        assert_eq!(back.as_bytes(), s.as_bytes());
        assert!(ModelSegment::read(&[0u8; 39]).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn segment_predict_is_monotone(a: u64, b: u64, first: u64, base in 0u64..1 << 40, len in 1u64..1 << 20, slope in 0.0f64..4.0, icpt in -100.0f64..100.0) {
            let s = ModelSegment::new(first, base, len, slope, icpt).unwrap();
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(s.predict(lo) <= s.predict(hi));
            prop_assert!(s.predict(hi) < base + len);
            prop_assert!(s.predict(lo) >= base);
        }

        #[test]
        fn state_fields_round_trip(generation in 0u16..1 << 14, forward in 1u64..1 << 45) {
            let s = ModelState::live(generation).unwrap();
            prop_assert_eq!(s.generation(), generation);
            let r = s.frozen().retired(forward * 8).unwrap();
            prop_assert_eq!(r.generation(), generation);
            prop_assert_eq!(r.forward(), Some(forward * 8));
            prop_assert_eq!(ModelState::from_raw(r.raw()), r);
        }

        #[test]
        fn arbitrary_records_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..136), slot: u8, index: u64) {
            let sb = pool();
            if let Ok(r) = ModelRecord::read(&bytes) {
                let _ = r.check(sb.model_region_offset(), &sb);
                let _ = r.lt_entry_offset(index);
                let _ = r.fence_offset(index);
                let _ = r.slt_slot_offset(slot);
                let _ = r.segment_offset(index);
                let _ = r.total_len();
            }
        }

        #[test]
        fn checked_records_keep_tables_in_the_region(leaves in 1u64..500, at_word in 0u64..8192) {
            let sb = pool();
            let at = sb.model_region_offset() + at_word * 8;
            let r = ModelRecord::new(at, &params(leaves)).unwrap();
            let fits = at + ModelRecord::size_for(leaves, 2).unwrap()
                <= sb.model_region_offset() + sb.model_region_len();
            prop_assert_eq!(r.check(at, &sb).is_ok(), fits);
        }
    }
}
