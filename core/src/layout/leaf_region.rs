//! The leaf region: an allocation counter, a capacity, then equal-sized
//! leaves addressed by leaf number.
//!
//! Leaves are allocated lock-free by `FAA(alloc_num, 1)`: the fetched value
//! is the new leaf's number if it is below `capacity`. Racing `FAA`s may push
//! `alloc_num` past `capacity`; such a claim allocated nothing and reads as
//! [`LayoutError::RegionFull`]. The invariant: [`LeafRegion::leaf_offset`]
//! only ever returns an offset whose whole leaf lies inside the region.

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{Field, LayoutError, Leaf, Part};
use crate::entry::{LeafAddr, LtEntry};

/// The first 16 bytes of the leaf region; leaves follow.
///
/// ```text
/// offset  size  field
///      0     8  alloc_num  leaves handed out so far (FAA target; may exceed capacity)
///      8     8  capacity   leaves the region holds
///     16     …  leaf 0, leaf 1, … each Leaf::size_for(L) bytes
/// ```
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Clone, Copy, Debug)]
#[repr(C)]
pub struct LeafRegionHeader {
    alloc_num: U64,
    capacity: U64,
}

const _: () = assert!(core::mem::size_of::<LeafRegionHeader>() == 16);

impl LeafRegionHeader {
    /// Bytes of the header (the first leaf starts here).
    pub const SIZE: u64 = core::mem::size_of::<Self>() as u64;
    /// Offset of `alloc_num` within the region: the allocation `FAA` target.
    pub const ALLOC_NUM_OFFSET: u64 = core::mem::offset_of!(Self, alloc_num) as u64;
    /// Offset of `capacity` within the region.
    pub const CAPACITY_OFFSET: u64 = core::mem::offset_of!(Self, capacity) as u64;

    /// A fresh header: nothing allocated, `capacity` leaves.
    pub const fn new(capacity: u64) -> Self {
        Self {
            alloc_num: U64::new(0),
            capacity: U64::new(capacity),
        }
    }

    /// Leaves handed out so far (may exceed the capacity after racing claims).
    pub fn alloc_num(&self) -> u64 {
        self.alloc_num.get()
    }

    /// Leaves the region holds.
    pub fn capacity(&self) -> u64 {
        self.capacity.get()
    }

    /// Checks this header against the region the superblock describes and
    /// returns that region narrowed to the header's capacity.
    pub fn check(&self, described: &LeafRegion) -> Result<LeafRegion, LayoutError> {
        if self.capacity() > described.capacity() {
            return Err(LayoutError::InvalidField {
                field: Field::LeafCapacity,
                value: self.capacity(),
            });
        }
        Ok(LeafRegion {
            capacity: self.capacity(),
            ..*described
        })
    }
}

/// Where a pool's leaf region is and how its leaves are sized (decoded from
/// the superblock, not stored in the pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafRegion {
    id: u8,
    offset: u64,
    capacity: u64,
    leaf_slots: u32,
}

impl LeafRegion {
    /// Bytes a region of `capacity` leaves of `leaf_slots` slots needs.
    pub fn len_for(capacity: u64, leaf_slots: u32) -> Result<u64, LayoutError> {
        capacity
            .checked_mul(Leaf::size_for(leaf_slots))
            .and_then(|n| n.checked_add(LeafRegionHeader::SIZE))
            .ok_or(LayoutError::Overflow {
                part: Part::LeafRegion,
            })
    }

    /// A region with id `id` at pool offset `offset` holding `capacity`
    /// leaves of `leaf_slots` slots. Checks that the id and every leaf
    /// number fit an [`LtEntry`] and that the region's end is computable.
    pub fn new(id: u8, offset: u64, capacity: u64, leaf_slots: u32) -> Result<Self, LayoutError> {
        if id > LtEntry::MAX_REGION {
            return Err(LayoutError::InvalidField {
                field: Field::LeafRegionId,
                value: id.into(),
            });
        }
        if capacity > LtEntry::MAX_LEAF + 1 {
            return Err(LayoutError::InvalidField {
                field: Field::LeafCapacity,
                value: capacity,
            });
        }
        let len = Self::len_for(capacity, leaf_slots)?;
        offset.checked_add(len).ok_or(LayoutError::OutOfPool {
            part: Part::LeafRegion,
            offset,
            len,
        })?;
        Ok(Self {
            id,
            offset,
            capacity,
            leaf_slots,
        })
    }

    /// The region's id (the `region` field of its leaves' entries).
    pub fn id(&self) -> u8 {
        self.id
    }

    /// Pool offset of the region (of its header).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Leaves the region holds.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Slots per leaf, `L`.
    pub fn leaf_slots(&self) -> u32 {
        self.leaf_slots
    }

    /// Bytes per leaf.
    pub fn leaf_size(&self) -> u64 {
        Leaf::size_for(self.leaf_slots)
    }

    /// Pool offset of `alloc_num`: the allocation `FAA` target.
    pub fn alloc_num_offset(&self) -> u64 {
        // `new` checked that the whole region's end fits a u64.
        self.offset + LeafRegionHeader::ALLOC_NUM_OFFSET
    }

    /// Pool offset of the leaf at `addr`.
    pub fn leaf_offset(&self, addr: LeafAddr) -> Result<u64, LayoutError> {
        if addr.region() != self.id {
            return Err(LayoutError::WrongRegion {
                expected: self.id,
                found: addr.region(),
            });
        }
        if addr.leaf() >= self.capacity {
            return Err(LayoutError::IndexOutOfRange {
                part: Part::LeafRegion,
                index: addr.leaf(),
                len: self.capacity,
            });
        }
        // Cannot overflow: leaf < capacity and `new` checked the region's end.
        Ok(self.offset + LeafRegionHeader::SIZE + addr.leaf() * self.leaf_size())
    }

    /// The leaf allocated by a claimant whose `FAA(alloc_num, 1)` returned
    /// `fetched`.
    pub fn claim(&self, fetched: u64) -> Result<LeafAddr, LayoutError> {
        if fetched >= self.capacity {
            return Err(LayoutError::RegionFull {
                fetched,
                capacity: self.capacity,
            });
        }
        LeafAddr::new(self.id, fetched).map_err(|_| LayoutError::InvalidField {
            field: Field::LeafCapacity,
            value: self.capacity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_offsets_match_the_diagram() {
        assert_eq!(LeafRegionHeader::ALLOC_NUM_OFFSET, 0);
        assert_eq!(LeafRegionHeader::CAPACITY_OFFSET, 8);
        assert_eq!(LeafRegionHeader::new(9).as_bytes()[8], 9);
    }

    #[test]
    fn offsets_and_claims() {
        let r = LeafRegion::new(2, 4096, 10, 4).unwrap();
        let size = Leaf::size_for(4);
        assert_eq!(r.alloc_num_offset(), 4096);
        assert_eq!(r.leaf_offset(LeafAddr::new(2, 0).unwrap()), Ok(4096 + 16));
        assert_eq!(
            r.leaf_offset(LeafAddr::new(2, 9).unwrap()),
            Ok(4096 + 16 + 9 * size)
        );
        assert_eq!(
            r.leaf_offset(LeafAddr::new(2, 10).unwrap()),
            Err(LayoutError::IndexOutOfRange {
                part: Part::LeafRegion,
                index: 10,
                len: 10
            })
        );
        assert_eq!(
            r.leaf_offset(LeafAddr::new(3, 0).unwrap()),
            Err(LayoutError::WrongRegion {
                expected: 2,
                found: 3
            })
        );
        assert_eq!(r.claim(9), Ok(LeafAddr::new(2, 9).unwrap()));
        assert_eq!(
            r.claim(10),
            Err(LayoutError::RegionFull {
                fetched: 10,
                capacity: 10
            })
        );
        assert!(LeafRegion::new(128, 0, 1, 1).is_err());
        assert!(LeafRegion::new(0, 0, (1 << 48) + 1, 1).is_err());
        assert!(LeafRegion::new(0, u64::MAX - 8, 1, 1).is_err());
        assert!(LeafRegion::new(0, 0, u64::MAX, u32::MAX).is_err());
    }

    #[test]
    fn header_capacity_must_fit_the_described_region() {
        let r = LeafRegion::new(0, 64, 10, 4).unwrap();
        assert_eq!(LeafRegionHeader::new(5).check(&r).unwrap().capacity(), 5);
        assert!(LeafRegionHeader::new(11).check(&r).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_allocated_leaf_lies_inside_the_region(
            offset in (0u64..1 << 40).prop_map(|o| o * 8),
            capacity in 1u64..1 << 20,
            slots in 1u32..64,
            fetched: u64,
        ) {
            let r = LeafRegion::new(1, offset, capacity, slots).unwrap();
            let end = offset + LeafRegion::len_for(capacity, slots).unwrap();
            match r.claim(fetched) {
                Ok(addr) => {
                    let at = r.leaf_offset(addr).unwrap();
                    prop_assert!(at >= offset + LeafRegionHeader::SIZE);
                    prop_assert!(at + r.leaf_size() <= end);
                    prop_assert_eq!(at % 8, offset % 8);
                }
                Err(e) => prop_assert!(fetched >= capacity, "{}", e),
            }
        }
    }
}
