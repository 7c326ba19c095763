//! [`ScatterDst`]: one destination of a scatter — a length, a source
//! offset, and where it lands in a peer's region.
//!
//! Valid when its [`MrDesc`] is valid; whether `src + len` fits the local
//! source region and `dst_offset + len` fits `dst` is checked by the engine
//! when it submits the scatter (see [`MrDesc::checked_addr`]), not here.

use zerocopy::byteorder::{LE, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{Body, MrDesc, Reader, WireError, Writer};

/// One slice of a scatter: `len` bytes from local offset `src` to
/// `dst_offset` inside the peer region `dst`.
///
/// Body on the wire:
///
/// ```text
///  0          8          16               24
///  +----------+----------+----------------+------------------+
///  | len  u64 | src  u64 | dst_offset u64 | MrDesc body      |
///  +----------+----------+----------------+------------------+
/// ```
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ScatterDst {
    /// Bytes to write.
    pub len: u64,
    /// Offset in the local source region.
    pub src: u64,
    /// The peer's region.
    pub dst: MrDesc,
    /// Offset in `dst`.
    pub dst_offset: u64,
}

/// The fixed head of a [`ScatterDst`] body.
#[repr(C)]
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
struct ScatterHead {
    len: U64<LE>,
    src: U64<LE>,
    dst_offset: U64<LE>,
}
const _: () = assert!(core::mem::size_of::<ScatterHead>() == 24);

impl Body for ScatterDst {
    fn body_len(&self) -> usize {
        core::mem::size_of::<ScatterHead>() + self.dst.body_len()
    }

    fn validate(&self) -> Result<(), WireError> {
        self.dst.validate()
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        let head = ScatterHead {
            len: U64::new(self.len),
            src: U64::new(self.src),
            dst_offset: U64::new(self.dst_offset),
        };
        w.put(head.as_bytes())?;
        self.dst.encode_body(w)
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let head = r.read::<ScatterHead>("ScatterDst head")?;
        let dst = MrDesc::decode_body(r)?;
        Ok(ScatterDst {
            len: head.len.get(),
            src: head.src.get(),
            dst,
            dst_offset: head.dst_offset.get(),
        })
    }
}

super::wire_via_body!(ScatterDst, 4, "ScatterDst");

#[cfg(test)]
mod tests {
    use super::super::{Access, NetAddr};
    use super::*;
    use crate::wire::Wire;

    #[test]
    fn known_encoding() {
        let dst = MrDesc::new(
            0x40,
            0x80,
            Access::REMOTE_WRITE,
            &[(NetAddr::new(&[5]).unwrap(), 7)],
        )
        .unwrap();
        let s = ScatterDst {
            len: 3,
            src: 4,
            dst,
            dst_offset: 5,
        };
        let mut out = [0u8; 64];
        let n = s.encode(&mut out).unwrap();
        let expect = [
            &[1, ScatterDst::TAG][..],    // header
            &[3, 0, 0, 0, 0, 0, 0, 0],    // len
            &[4, 0, 0, 0, 0, 0, 0, 0],    // src
            &[5, 0, 0, 0, 0, 0, 0, 0],    // dst_offset
            &[0x40, 0, 0, 0, 0, 0, 0, 0], // dst.ptr
            &[0x80, 0, 0, 0, 0, 0, 0, 0], // dst.len
            &[4, 1],                      // access, nic_cnt
            &[7, 0, 0, 0, 0, 0, 0, 0],    // rkey
            &[1, 5],                      // NetAddr body
        ]
        .concat();
        assert_eq!(&out[..n], &expect[..]);
        assert_eq!(n, s.encoded_len());
        assert_eq!(ScatterDst::decode(&expect), Ok(s.clone()));
        // A bare MrDesc is not a ScatterDst.
        let mut d = [0u8; 64];
        let m = s.dst.encode(&mut d).unwrap();
        assert_eq!(
            ScatterDst::decode(&d[..m]),
            Err(WireError::BadTag {
                what: "ScatterDst",
                found: MrDesc::TAG
            })
        );
    }
}
