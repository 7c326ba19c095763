//! Page lists: [`Pages`] (owned, `alloc`) and [`PagesRef`] (borrowed from
//! the input bytes, no allocation) share one encoding.
//!
//! A page list names the pages `offset + index * stride` of a region for
//! paged writes. Decoders check that the input holds all `count` indices
//! before touching them, so a 4-byte count cannot make a decoder allocate
//! (or read) more than the input justifies. Whether the pages fit a region,
//! and whether `offset + index * stride` overflows, is the engine's check
//! ([`Pages::page_offset`] / [`PagesRef::page_offset`] do it without
//! overflow).

use core::iter::FusedIterator;

use zerocopy::byteorder::{LE, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::{read_header, Reader, WireError, Writer, HEADER_LEN, WIRE_VERSION};

/// The header tag of a page list.
const PAGES_TAG: u8 = 3;
const PAGES_NAME: &str = "Pages";

/// The fixed head of a page-list body.
///
/// ```text
///  0             8             16           20
///  +-------------+-------------+------------+------------------------+
///  | stride u64  | offset u64  | count u32  | count × index u32      |
///  +-------------+-------------+------------+------------------------+
/// ```
#[repr(C)]
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
struct PagesHead {
    stride: U64<LE>,
    offset: U64<LE>,
    count: U32<LE>,
}
const PAGES_HEAD_LEN: usize = core::mem::size_of::<PagesHead>();
const _: () = assert!(PAGES_HEAD_LEN == 20);

/// Bytes a page-list message with `count` indices takes, header included;
/// `None` if that does not fit in `usize`.
pub fn pages_encoded_len(count: usize) -> Option<usize> {
    count
        .checked_mul(4)?
        .checked_add(HEADER_LEN + PAGES_HEAD_LEN)
}

/// Encodes a page list from its parts, without allocation; returns the bytes
/// written. The same bytes as [`Pages`]' [`Wire::encode`](crate::wire::Wire::encode)
/// for the same parts.
///
/// Fails with [`WireError::TooLong`] for more than `u32::MAX` indices and
/// [`WireError::BufferTooSmall`] if `out` is short.
pub fn encode_pages(
    indices: &[u32],
    stride: u64,
    offset: u64,
    out: &mut [u8],
) -> Result<usize, WireError> {
    let count = u32::try_from(indices.len()).map_err(|_| WireError::TooLong {
        what: "Pages indices",
        len: indices.len(),
        max: u32::MAX as usize,
    })?;
    let need = pages_encoded_len(indices.len()).ok_or(WireError::TooLong {
        what: "Pages indices",
        len: indices.len(),
        max: (usize::MAX - HEADER_LEN - PAGES_HEAD_LEN) / 4,
    })?;
    if out.len() < need {
        return Err(WireError::BufferTooSmall {
            need,
            have: out.len(),
        });
    }
    let mut w = Writer::new(out);
    w.put(&[WIRE_VERSION, PAGES_TAG])?;
    let head = PagesHead {
        stride: U64::new(stride),
        offset: U64::new(offset),
        count: U32::new(count),
    };
    w.put(head.as_bytes())?;
    for &i in indices {
        w.put(&i.to_le_bytes())?;
    }
    Ok(w.written())
}

/// A page list read in place from a message: no allocation, indices stay
/// little-endian in the input bytes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PagesRef<'a> {
    stride: u64,
    offset: u64,
    indices: &'a [U32<LE>],
}

impl<'a> PagesRef<'a> {
    /// The header tag of a page list (the same as `Pages::TAG`).
    pub const TAG: u8 = PAGES_TAG;

    /// Decodes exactly one page-list message; trailing bytes are an error.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, WireError> {
        let (pages, rest) = Self::decode_prefix(bytes)?;
        if rest.is_empty() {
            Ok(pages)
        } else {
            Err(WireError::TrailingBytes {
                what: PAGES_NAME,
                extra: rest.len(),
            })
        }
    }

    /// Decodes one page-list message from the start of `bytes`; returns it
    /// and the bytes after it.
    pub fn decode_prefix(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), WireError> {
        let mut r = read_header(bytes, PAGES_TAG, PAGES_NAME)?;
        let pages = Self::decode_body(&mut r)?;
        Ok((pages, r.rest()))
    }

    fn decode_body(r: &mut Reader<'a>) -> Result<Self, WireError> {
        let head = r.read::<PagesHead>("Pages head")?;
        let count = head.count.get() as usize;
        let need = count.checked_mul(4).ok_or(WireError::TooLong {
            what: "Pages indices",
            len: count,
            max: usize::MAX / 4,
        })?;
        // The length check comes before any use of `count`.
        let bytes = r.take(need, "Pages indices")?;
        let indices = <[U32<LE>]>::ref_from_bytes(bytes).map_err(|_| WireError::Invalid {
            what: "Pages indices",
            why: "size mismatch reading indices",
        })?;
        Ok(PagesRef {
            stride: head.stride.get(),
            offset: head.offset.get(),
            indices,
        })
    }

    /// Distance in bytes between consecutive page indices.
    pub fn stride(&self) -> u64 {
        self.stride
    }

    /// Byte offset of page index 0.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// The `i`-th page index.
    pub fn get(&self, i: usize) -> Option<u32> {
        self.indices.get(i).map(|v| v.get())
    }

    /// The page indices in order.
    pub fn iter(&self) -> PagesIter<'a> {
        PagesIter {
            inner: self.indices.iter(),
        }
    }

    /// Byte offset `offset + index * stride` of the `i`-th page; `None` if
    /// `i` is out of range or the arithmetic overflows.
    pub fn page_offset(&self, i: usize) -> Option<u64> {
        page_offset(self.get(i)?, self.stride, self.offset)
    }

    /// Bytes [`PagesRef::encode`] writes, header included.
    pub fn encoded_len(&self) -> usize {
        // The indices came from a slice of the input, so this fits.
        HEADER_LEN + PAGES_HEAD_LEN + self.indices.len() * 4
    }

    /// Encodes the list again (the same bytes it was decoded from).
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let need = self.encoded_len();
        if out.len() < need {
            return Err(WireError::BufferTooSmall {
                need,
                have: out.len(),
            });
        }
        let mut w = Writer::new(out);
        w.put(&[WIRE_VERSION, PAGES_TAG])?;
        let head = PagesHead {
            stride: U64::new(self.stride),
            offset: U64::new(self.offset),
            // Decoded from a u32 count.
            count: U32::new(self.indices.len() as u32),
        };
        w.put(head.as_bytes())?;
        w.put(self.indices.as_bytes())?;
        Ok(w.written())
    }

    /// An owned copy.
    #[cfg(feature = "alloc")]
    pub fn to_pages(&self) -> Pages {
        Pages {
            indices: self.iter().collect(),
            stride: self.stride,
            offset: self.offset,
        }
    }
}

impl<'a> IntoIterator for PagesRef<'a> {
    type Item = u32;
    type IntoIter = PagesIter<'a>;

    fn into_iter(self) -> PagesIter<'a> {
        self.iter()
    }
}

/// Iterator over the page indices of a [`PagesRef`].
#[derive(Clone, Debug)]
pub struct PagesIter<'a> {
    inner: core::slice::Iter<'a, U32<LE>>,
}

impl Iterator for PagesIter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        self.inner.next().map(|v| v.get())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl DoubleEndedIterator for PagesIter<'_> {
    fn next_back(&mut self) -> Option<u32> {
        self.inner.next_back().map(|v| v.get())
    }
}

impl ExactSizeIterator for PagesIter<'_> {}
impl FusedIterator for PagesIter<'_> {}

fn page_offset(index: u32, stride: u64, offset: u64) -> Option<u64> {
    u64::from(index).checked_mul(stride)?.checked_add(offset)
}

#[cfg(feature = "alloc")]
pub use owned::Pages;

#[cfg(feature = "alloc")]
mod owned {
    use super::super::Wire;
    use super::*;
    use alloc::vec::Vec;

    /// A page list: pages `offset + indices[i] * stride` of a region.
    ///
    /// Same encoding as [`PagesRef`] (see [`encode_pages`]); at most
    /// `u32::MAX` indices. Stride and offset are not checked against
    /// anything here: the engine checks every page against the region.
    #[derive(Clone, PartialEq, Eq, Debug)]
    pub struct Pages {
        /// Page indices, in transfer order.
        pub indices: Vec<u32>,
        /// Distance in bytes between consecutive page indices.
        pub stride: u64,
        /// Byte offset of page index 0.
        pub offset: u64,
    }

    impl Pages {
        /// Byte offset `offset + indices[i] * stride` of the `i`-th page;
        /// `None` if `i` is out of range or the arithmetic overflows.
        pub fn page_offset(&self, i: usize) -> Option<u64> {
            page_offset(*self.indices.get(i)?, self.stride, self.offset)
        }
    }

    impl Wire for Pages {
        const TAG: u8 = PAGES_TAG;
        const NAME: &'static str = PAGES_NAME;

        fn encoded_len(&self) -> usize {
            pages_encoded_len(self.indices.len()).unwrap_or(usize::MAX)
        }

        fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
            encode_pages(&self.indices, self.stride, self.offset, out)
        }

        fn decode_prefix(bytes: &[u8]) -> Result<(Self, &[u8]), WireError> {
            let (pages, rest) = PagesRef::decode_prefix(bytes)?;
            Ok((pages.to_pages(), rest))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "alloc")]
    use crate::wire::Wire;

    #[test]
    fn known_encoding_and_borrowed_view() {
        let mut out = [0u8; 64];
        let n = encode_pages(&[3, 0x0102_0304], 4096, 16, &mut out).unwrap();
        let expect: &[u8] = &[
            1, PAGES_TAG, // header
            0, 0x10, 0, 0, 0, 0, 0, 0, // stride
            16, 0, 0, 0, 0, 0, 0, 0, // offset
            2, 0, 0, 0, // count
            3, 0, 0, 0, // index 0
            0x04, 0x03, 0x02, 0x01, // index 1
        ];
        assert_eq!(&out[..n], expect);
        let p = PagesRef::decode(expect).unwrap();
        assert_eq!((p.stride(), p.offset(), p.len()), (4096, 16, 2));
        assert_eq!(p.iter().collect::<std::vec::Vec<_>>(), [3, 0x0102_0304]);
        assert_eq!(p.iter().next_back(), Some(0x0102_0304));
        assert_eq!(p.get(2), None);
        assert_eq!(p.page_offset(0), Some(3 * 4096 + 16));
        let mut again = [0u8; 64];
        let m = p.encode(&mut again).unwrap();
        assert_eq!(&again[..m], expect);
    }

    #[test]
    fn huge_count_is_truncation_not_allocation() {
        let mut b = [0u8; 2 + 20];
        b[..2].copy_from_slice(&[1, PAGES_TAG]);
        b[18..22].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = PagesRef::decode(&b).unwrap_err();
        assert_eq!(
            err,
            WireError::Truncated {
                what: "Pages indices",
                need: u32::MAX as usize * 4,
                have: 0
            }
        );
        #[cfg(feature = "alloc")]
        assert_eq!(Pages::decode(&b), Err(err));
    }

    #[test]
    fn page_offset_checks_overflow() {
        let mut out = [0u8; 32];
        let n = encode_pages(&[u32::MAX], u64::MAX / 2, 0, &mut out).unwrap();
        let p = PagesRef::decode(&out[..n]).unwrap();
        assert_eq!(p.page_offset(0), None);
        let n = encode_pages(&[1], 10, u64::MAX - 9, &mut out).unwrap();
        assert_eq!(PagesRef::decode(&out[..n]).unwrap().page_offset(0), None);
        let n = encode_pages(&[1], 10, u64::MAX - 10, &mut out).unwrap();
        let p = PagesRef::decode(&out[..n]).unwrap();
        assert_eq!(p.page_offset(0), Some(u64::MAX));
    }

    #[cfg(feature = "alloc")]
    #[test]
    fn owned_matches_borrowed() {
        let pages = Pages {
            indices: alloc::vec![9, 8, 7],
            stride: 64,
            offset: 1,
        };
        let bytes = pages.to_vec().unwrap();
        assert_eq!(bytes.len(), pages.encoded_len());
        let mut direct = [0u8; 64];
        let n = encode_pages(&pages.indices, 64, 1, &mut direct).unwrap();
        assert_eq!(&direct[..n], &bytes[..]);
        assert_eq!(PagesRef::decode(&bytes).unwrap().to_pages(), pages);
        assert_eq!(Pages::decode(&bytes), Ok(pages.clone()));
        assert_eq!(pages.page_offset(1), Some(8 * 64 + 1));
        assert_eq!(pages.page_offset(3), None);
    }
}
