//! [`MrDesc`]: the serialisable descriptor of a registered memory region,
//! and its [`Access`] rights.
//!
//! A peer that holds an `MrDesc` may address `[ptr, ptr + len)` of the
//! owner's memory through any of the listed NICs, with the listed rights.
//! Invariant of a valid value (checked on encode and decode): 1 to
//! [`MAX_NICS`] NICs, `ptr + len` does not overflow `u64`, and `access` has
//! only defined bits.

use bitflags::bitflags;
use zerocopy::byteorder::{LE, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{Body, NetAddr, Reader, WireError, Writer, MAX_NICS};

bitflags! {
    /// Access rights of a registered region (one byte on the wire; other
    /// bits are an error).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub struct Access: u8 {
        /// The local NIC may write into the region (receives, reads).
        const LOCAL_WRITE = 1;
        /// Peers may read the region.
        const REMOTE_READ = 2;
        /// Peers may write the region.
        const REMOTE_WRITE = 4;
        /// Peers may run 8-byte atomics (CAS, fetch-and-add) on the region.
        const REMOTE_ATOMIC = 8;
    }
}

/// A registered region as a peer sees it: where it is, how long, what the
/// peer may do, and one `(NetAddr, rkey)` per NIC that reaches it.
///
/// Body on the wire:
///
/// ```text
///  0          8          16        17        18
///  +----------+----------+---------+---------+---------------------------+
///  | ptr  u64 | len  u64 | access  | nic_cnt | nic_cnt × NIC entry       |
///  +----------+----------+---------+---------+---------------------------+
///  NIC entry:
///  0          8            9            9+addr_len
///  +----------+------------+------------+
///  | rkey u64 | addr_len   | addr bytes |
///  +----------+------------+------------+
/// ```
///
/// `nic_cnt` is 1 to [`MAX_NICS`]; `ptr + len` must not overflow; only
/// [`Access`] bits are allowed. Whether an offset and length fall inside the
/// region is for the engine to check, with [`MrDesc::checked_addr`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct MrDesc {
    /// Start address of the region in the owner's address space.
    pub ptr: u64,
    /// Length of the region in bytes.
    pub len: u64,
    /// What peers may do with it.
    pub access: Access,
    /// One `(address, remote key)` per NIC; at least one.
    pub nics: heapless::Vec<(NetAddr, u64), MAX_NICS>,
}

/// The fixed head of an [`MrDesc`] body.
#[repr(C)]
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
struct MrDescHead {
    ptr: U64<LE>,
    len: U64<LE>,
    access: u8,
    nic_count: u8,
}
const _: () = assert!(core::mem::size_of::<MrDescHead>() == 18);

impl MrDesc {
    /// A descriptor, checked like a decoded one: 1 to [`MAX_NICS`] NICs,
    /// `ptr + len` without overflow, only defined access bits.
    pub fn new(
        ptr: u64,
        len: u64,
        access: Access,
        nics: &[(NetAddr, u64)],
    ) -> Result<Self, WireError> {
        let nics = heapless::Vec::from_slice(nics).map_err(|()| WireError::TooLong {
            what: "MrDesc NICs",
            len: nics.len(),
            max: MAX_NICS,
        })?;
        let desc = MrDesc {
            ptr,
            len,
            access,
            nics,
        };
        desc.validate()?;
        Ok(desc)
    }

    /// The address of `[offset, offset + len)` inside the region, or `None`
    /// if that range is not wholly inside it (overflow included).
    pub fn checked_addr(&self, offset: u64, len: u64) -> Option<u64> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        self.ptr.checked_add(offset)
    }

    /// One past the region's last address, if it does not overflow.
    pub fn end(&self) -> Option<u64> {
        self.ptr.checked_add(self.len)
    }
}

impl Body for MrDesc {
    fn body_len(&self) -> usize {
        let nics: usize = self.nics.iter().map(|(a, _)| 8 + a.body_len()).sum();
        core::mem::size_of::<MrDescHead>() + nics
    }

    fn validate(&self) -> Result<(), WireError> {
        if self.nics.is_empty() {
            return Err(WireError::Invalid {
                what: "MrDesc NICs",
                why: "at least one NIC is required",
            });
        }
        if self.end().is_none() {
            return Err(WireError::Invalid {
                what: "MrDesc",
                why: "ptr + len overflows u64",
            });
        }
        let unknown = self.access.bits() & !Access::all().bits();
        if unknown != 0 {
            return Err(WireError::UnknownBits {
                what: "MrDesc access",
                bits: unknown,
            });
        }
        Ok(())
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        let head = MrDescHead {
            ptr: U64::new(self.ptr),
            len: U64::new(self.len),
            access: self.access.bits(),
            // validate: 1..=MAX_NICS, so it fits a byte.
            nic_count: self.nics.len() as u8,
        };
        w.put(head.as_bytes())?;
        for (addr, rkey) in &self.nics {
            w.put(&rkey.to_le_bytes())?;
            addr.encode_body(w)?;
        }
        Ok(())
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let head = r.read::<MrDescHead>("MrDesc head")?;
        let count = usize::from(head.nic_count);
        if count == 0 {
            return Err(WireError::Invalid {
                what: "MrDesc NICs",
                why: "at least one NIC is required",
            });
        }
        if count > MAX_NICS {
            return Err(WireError::TooLong {
                what: "MrDesc NICs",
                len: count,
                max: MAX_NICS,
            });
        }
        let access = Access::from_bits(head.access).ok_or(WireError::UnknownBits {
            what: "MrDesc access",
            bits: head.access & !Access::all().bits(),
        })?;
        let mut nics = heapless::Vec::new();
        for _ in 0..count {
            let rkey = r.read::<U64<LE>>("MrDesc rkey")?.get();
            let addr = NetAddr::decode_body(r)?;
            // count <= MAX_NICS was checked, so this cannot be full.
            nics.push((addr, rkey)).map_err(|_| WireError::TooLong {
                what: "MrDesc NICs",
                len: count,
                max: MAX_NICS,
            })?;
        }
        let desc = MrDesc {
            ptr: head.ptr.get(),
            len: head.len.get(),
            access,
            nics,
        };
        desc.validate()?;
        Ok(desc)
    }
}

super::wire_via_body!(MrDesc, 2, "MrDesc");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Wire;

    fn addr(b: u8) -> NetAddr {
        NetAddr::new(&[b; 3]).unwrap()
    }

    #[test]
    fn known_encoding() {
        let d = MrDesc::new(
            0x1122_3344_5566_7788,
            0x100,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
            &[(addr(0xaa), 0x0102_0304_0506_0708)],
        )
        .unwrap();
        let mut out = [0u8; 64];
        let n = d.encode(&mut out).unwrap();
        let expect = [
            &[1, MrDesc::TAG][..],                             // header
            &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11], // ptr
            &[0x00, 0x01, 0, 0, 0, 0, 0, 0],                   // len
            &[6, 1],                                           // access, nic_cnt
            &[0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01], // rkey
            &[3, 0xaa, 0xaa, 0xaa],                            // NetAddr body
        ]
        .concat();
        assert_eq!(&out[..n], &expect[..]);
        assert_eq!(n, d.encoded_len());
        assert_eq!(MrDesc::decode(&expect), Ok(d));
    }

    #[test]
    fn new_validates() {
        let one = [(addr(1), 9)];
        assert!(matches!(
            MrDesc::new(0, 1, Access::empty(), &[]),
            Err(WireError::Invalid {
                what: "MrDesc NICs",
                ..
            })
        ));
        assert!(matches!(
            MrDesc::new(0, 1, Access::empty(), &[one[0]; 5]),
            Err(WireError::TooLong { len: 5, max: 4, .. })
        ));
        assert!(MrDesc::new(0, 1, Access::empty(), &[one[0]; 4]).is_ok());
        assert!(matches!(
            MrDesc::new(u64::MAX, 1, Access::empty(), &one),
            Err(WireError::Invalid { what: "MrDesc", .. })
        ));
        assert!(MrDesc::new(u64::MAX, 0, Access::empty(), &one).is_ok());
        assert_eq!(
            MrDesc::new(0, 1, Access::from_bits_retain(0x30), &one),
            Err(WireError::UnknownBits {
                what: "MrDesc access",
                bits: 0x30
            })
        );
    }

    #[test]
    fn encode_refuses_invalid_values() {
        let mut d = MrDesc::new(0, 8, Access::all(), &[(addr(1), 2)]).unwrap();
        let mut out = [0u8; 64];
        d.nics.clear();
        assert!(matches!(d.encode(&mut out), Err(WireError::Invalid { .. })));
        d.nics.push((addr(1), 2)).unwrap();
        d.ptr = u64::MAX;
        assert!(matches!(d.encode(&mut out), Err(WireError::Invalid { .. })));
    }

    #[test]
    fn decode_rejects_bad_fields() {
        let d = MrDesc::new(0x1000, 0x10, Access::all(), &[(addr(1), 2)]).unwrap();
        let mut out = [0u8; 64];
        let n = d.encode(&mut out).unwrap();
        let good = &out[..n];
        // access is byte 2 + 16, nic_cnt 2 + 17.
        let mut b = good.to_vec();
        b[18] = 0x10;
        assert!(matches!(
            MrDesc::decode(&b),
            Err(WireError::UnknownBits { bits: 0x10, .. })
        ));
        b = good.to_vec();
        b[19] = 0;
        assert!(matches!(MrDesc::decode(&b), Err(WireError::Invalid { .. })));
        b[19] = 5;
        assert!(matches!(
            MrDesc::decode(&b),
            Err(WireError::TooLong { len: 5, .. })
        ));
        b[19] = 2;
        assert!(matches!(
            MrDesc::decode(&b),
            Err(WireError::Truncated { .. })
        ));
        b = good.to_vec();
        b[2..10].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(
            MrDesc::decode(&b),
            Err(WireError::Invalid { what: "MrDesc", .. })
        ));
    }

    #[test]
    fn checked_addr_stays_inside() {
        let d = MrDesc::new(1000, 100, Access::all(), &[(addr(1), 2)]).unwrap();
        assert_eq!(d.checked_addr(0, 100), Some(1000));
        assert_eq!(d.checked_addr(99, 1), Some(1099));
        assert_eq!(d.checked_addr(100, 0), Some(1100));
        assert_eq!(d.checked_addr(99, 2), None);
        assert_eq!(d.checked_addr(101, 0), None);
        assert_eq!(d.checked_addr(u64::MAX, 2), None);
    }
}
