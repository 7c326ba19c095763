//! The versioned binary encoding of what peers exchange out of band.
//!
//! Every message is a 2-byte header followed by the body of one type, all
//! integers little-endian:
//!
//! ```text
//!  0         1         2
//!  +---------+---------+------------------------
//!  | version |   tag   | body (per type)
//!  +---------+---------+------------------------
//! ```
//!
//! `version` is [`WIRE_VERSION`]; `tag` names the type ([`NetAddr::TAG`],
//! [`MrDesc::TAG`], [`PagesRef::TAG`], [`ScatterDst::TAG`]). Bodies nest
//! without headers (a [`ScatterDst`] holds an [`MrDesc`] body, which holds
//! [`NetAddr`] bodies). The byte diagram of each body is on its type.
//!
//! Invariant: the encoding is canonical. [`Wire::decode`] accepts exactly the
//! bytes that [`Wire::encode`] produces for some valid value, so
//! `decode(b) == Ok(v)` implies `encode(v) == b`; anything else is a
//! [`WireError`] naming the field, never a panic, and a decoder never
//! allocates more than the input bytes justify.
//!
//! Range checks that need more than one message (an offset and length
//! against an [`MrDesc`], page offsets `offset + index * stride` against a
//! region) are the transfer engine's job; [`MrDesc::checked_addr`] and
//! [`Pages::page_offset`] do the arithmetic without overflow.

use core::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

mod mr_desc;
mod net_addr;
mod paged_msg;
mod pages;
mod scatter_dst;
#[cfg(test)]
mod tests;

pub use mr_desc::{Access, MrDesc};
pub use net_addr::NetAddr;
#[cfg(feature = "alloc")]
pub use paged_msg::{encode_paged_acks, encode_paged_msg};
pub use paged_msg::{
    paged_msg_len, set_ack_now, Ack, AckStatus, PageTarget, PagedAcks, PagedMsg, ACK_ENTRY_LEN,
    MAX_ACKS, MAX_DATA, MAX_PAGES, MAX_PAGE_LEN, PAGED_ACKS_TAG, PAGED_MSG_TAG, PAGE_ENTRY_LEN,
    SEGMENT_ENTRY_LEN,
};
#[cfg(feature = "alloc")]
pub use pages::Pages;
pub use pages::{encode_pages, pages_encoded_len, PagesIter, PagesRef};
pub use scatter_dst::ScatterDst;

/// The encoding version this crate writes and the only one it reads.
pub const WIRE_VERSION: u8 = 1;

/// The most NICs (one `(NetAddr, rkey)` each) an [`MrDesc`] can name.
pub const MAX_NICS: usize = 4;

/// Length of the `version | tag` header that starts every message.
pub const HEADER_LEN: usize = core::mem::size_of::<Header>();

/// Why bytes could not be decoded, or a value could not be encoded.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The input ended inside `what`: it needs `need` more bytes, `have`
    /// were left.
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Bytes that field needs.
        need: usize,
        /// Bytes that were left.
        have: usize,
    },
    /// A complete `what` was followed by `extra` bytes.
    TrailingBytes {
        /// The message that was decoded.
        what: &'static str,
        /// Bytes after it.
        extra: usize,
    },
    /// The header's version byte is not [`WIRE_VERSION`].
    BadVersion {
        /// The version found.
        found: u8,
    },
    /// The header's tag is not the one of the type being decoded.
    BadTag {
        /// The type being decoded.
        what: &'static str,
        /// The tag found.
        found: u8,
    },
    /// `what` has `len` elements or bytes; at most `max` are allowed.
    TooLong {
        /// The field.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// `what` has bits set that this version does not define.
    UnknownBits {
        /// The field.
        what: &'static str,
        /// The undefined bits.
        bits: u8,
    },
    /// `what` is well-formed but not a valid value, because `why`.
    Invalid {
        /// The field.
        what: &'static str,
        /// The rule it breaks.
        why: &'static str,
    },
    /// The output buffer holds `have` bytes; the encoding needs `need`.
    BufferTooSmall {
        /// Bytes the encoding needs.
        need: usize,
        /// Bytes the buffer holds.
        have: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            WireError::Truncated { what, need, have } => {
                write!(f, "truncated {what}: needs {need} bytes, {have} left")
            }
            WireError::TrailingBytes { what, extra } => {
                write!(f, "{extra} trailing bytes after {what}")
            }
            WireError::BadVersion { found } => {
                write!(f, "wire version {found}, expected {WIRE_VERSION}")
            }
            WireError::BadTag { what, found } => {
                write!(f, "message tag {found} is not {what}")
            }
            WireError::TooLong { what, len, max } => {
                write!(f, "{what} has length {len}, at most {max} allowed")
            }
            WireError::UnknownBits { what, bits } => {
                write!(f, "{what} has unknown bits {bits:#04x}")
            }
            WireError::Invalid { what, why } => write!(f, "invalid {what}: {why}"),
            WireError::BufferTooSmall { need, have } => {
                write!(f, "output buffer holds {have} bytes, encoding needs {need}")
            }
        }
    }
}

impl core::error::Error for WireError {}

/// A type with a wire encoding: header plus body, see the [module docs](self).
///
/// ```
/// use rolex_core::wire::{Access, MrDesc, NetAddr, Wire, WireError};
///
/// let nic = NetAddr::new(&[10, 0, 0, 1])?;
/// let desc = MrDesc::new(0x7f00_0000, 4096, Access::REMOTE_WRITE, &[(nic, 42)])?;
/// let mut buf = [0u8; 64];
/// let n = desc.encode(&mut buf)?;
/// assert_eq!(MrDesc::decode(&buf[..n])?, desc);
/// assert!(matches!(MrDesc::decode(&buf[..n - 1]), Err(WireError::Truncated { .. })));
/// # Ok::<(), WireError>(())
/// ```
pub trait Wire: Sized {
    /// The header tag of this type.
    const TAG: u8;
    /// The type's name, used in errors.
    const NAME: &'static str;

    /// Bytes [`Wire::encode`] writes, header included.
    fn encoded_len(&self) -> usize;

    /// Writes header and body to the start of `out`; returns the bytes
    /// written. Fails with [`WireError::BufferTooSmall`] if `out` is short,
    /// or with the error decoding would report if `self` is not a valid
    /// value (so everything encoded decodes).
    fn encode(&self, out: &mut [u8]) -> Result<usize, WireError>;

    /// Decodes one message from the start of `bytes`; returns it and the
    /// bytes after it. Never panics.
    fn decode_prefix(bytes: &[u8]) -> Result<(Self, &[u8]), WireError>;

    /// Decodes exactly one message: trailing bytes are an error. Never
    /// panics.
    fn decode(bytes: &[u8]) -> Result<Self, WireError> {
        let (value, rest) = Self::decode_prefix(bytes)?;
        if rest.is_empty() {
            Ok(value)
        } else {
            Err(WireError::TrailingBytes {
                what: Self::NAME,
                extra: rest.len(),
            })
        }
    }

    /// Encodes into a new vector of exactly [`Wire::encoded_len`] bytes.
    ///
    /// Fails (rather than panicking) when `self` is not a valid value.
    #[cfg(feature = "alloc")]
    fn to_vec(&self) -> Result<alloc::vec::Vec<u8>, WireError> {
        let mut out = alloc::vec![0; self.encoded_len()];
        let n = self.encode(&mut out)?;
        out.truncate(n);
        Ok(out)
    }
}

/// Checks the header of a message and returns its tag, so a receiver can
/// pick the type to decode.
pub fn peek_tag(bytes: &[u8]) -> Result<u8, WireError> {
    let header = Reader::new(bytes).read::<Header>("message header")?;
    if header.version != WIRE_VERSION {
        return Err(WireError::BadVersion {
            found: header.version,
        });
    }
    Ok(header.tag)
}

/// The message header.
///
/// ```text
///  0         1         2
///  +---------+---------+
///  | version |   tag   |
///  +---------+---------+
/// ```
#[repr(C)]
#[derive(Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
struct Header {
    version: u8,
    tag: u8,
}
const _: () = assert!(core::mem::size_of::<Header>() == 2);

/// A cursor over input bytes; every read names its field for errors.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    pub(crate) fn rest(&self) -> &'a [u8] {
        self.rest
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        if self.rest.len() < n {
            return Err(WireError::Truncated {
                what,
                need: n,
                have: self.rest.len(),
            });
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    /// Reads a fixed-size little-endian head.
    pub(crate) fn read<T: FromBytes + KnownLayout + Immutable + Unaligned>(
        &mut self,
        what: &'static str,
    ) -> Result<T, WireError> {
        let bytes = self.take(core::mem::size_of::<T>(), what)?;
        // `take` returned exactly size_of::<T>() bytes and T is unaligned,
        // so this cannot fail; map rather than unwrap all the same.
        T::read_from_bytes(bytes).map_err(|_| WireError::Invalid {
            what,
            why: "size mismatch reading fixed head",
        })
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        let b = self.take(1, what)?;
        Ok(b[0])
    }
}

/// A cursor over the output buffer. Its length is checked against the
/// encoded length first, so a short write is a bug caught as an error.
pub(crate) struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(out: &'a mut [u8]) -> Self {
        Writer { out, at: 0 }
    }

    pub(crate) fn put(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        let have = self.out.len();
        let end = self
            .at
            .checked_add(bytes.len())
            .filter(|&end| end <= have)
            .ok_or(WireError::BufferTooSmall {
                need: self.at.saturating_add(bytes.len()),
                have,
            })?;
        self.out[self.at..end].copy_from_slice(bytes);
        self.at = end;
        Ok(())
    }

    pub(crate) fn written(&self) -> usize {
        self.at
    }
}

/// A header-less body: what nests inside other messages.
pub(crate) trait Body: Sized {
    fn body_len(&self) -> usize;
    /// Fails if `self` is not a valid value (the error decoding would give).
    fn validate(&self) -> Result<(), WireError>;
    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), WireError>;
    fn decode_body(r: &mut Reader<'_>) -> Result<Self, WireError>;
}

/// Implements [`Wire`] for a [`Body`] type: a header (version, `tag`) then
/// the body, validated on encode and decode.
macro_rules! wire_via_body {
    ($ty:ty, $tag:expr, $name:literal) => {
        impl $crate::wire::Wire for $ty {
            const TAG: u8 = $tag;
            const NAME: &'static str = $name;

            fn encoded_len(&self) -> usize {
                $crate::wire::encoded_len(self)
            }

            fn encode(&self, out: &mut [u8]) -> Result<usize, $crate::wire::WireError> {
                $crate::wire::encode_message(self, out)
            }

            fn decode_prefix(bytes: &[u8]) -> Result<(Self, &[u8]), $crate::wire::WireError> {
                $crate::wire::decode_message(bytes)
            }
        }
    };
}
pub(crate) use wire_via_body;

pub(crate) fn encoded_len<T: Body>(v: &T) -> usize {
    HEADER_LEN.saturating_add(v.body_len())
}

pub(crate) fn encode_message<T: Body + Wire>(v: &T, out: &mut [u8]) -> Result<usize, WireError> {
    v.validate()?;
    let need = v.encoded_len();
    if out.len() < need {
        return Err(WireError::BufferTooSmall {
            need,
            have: out.len(),
        });
    }
    let mut w = Writer::new(out);
    w.put(
        Header {
            version: WIRE_VERSION,
            tag: T::TAG,
        }
        .as_bytes(),
    )?;
    v.encode_body(&mut w)?;
    Ok(w.written())
}

/// Checks version and tag for `T` and returns the reader past the header.
pub(crate) fn read_header<'a>(
    bytes: &'a [u8],
    tag: u8,
    name: &'static str,
) -> Result<Reader<'a>, WireError> {
    let mut r = Reader::new(bytes);
    let header = r.read::<Header>(name)?;
    if header.version != WIRE_VERSION {
        return Err(WireError::BadVersion {
            found: header.version,
        });
    }
    if header.tag != tag {
        return Err(WireError::BadTag {
            what: name,
            found: header.tag,
        });
    }
    Ok(r)
}

pub(crate) fn decode_message<T: Body + Wire>(bytes: &[u8]) -> Result<(T, &[u8]), WireError> {
    let mut r = read_header(bytes, T::TAG, T::NAME)?;
    let value = T::decode_body(&mut r)?;
    Ok((value, r.rest()))
}
