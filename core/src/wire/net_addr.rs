//! [`NetAddr`]: a peer's fabric address as opaque bytes, 1 to 64 of them.
//!
//! The bytes are whatever the backend's address is (a libfabric `fi_addr`
//! name, a GID + QP number, a loopback id). Invariant: `1 <= len <= 64` and
//! the bytes past `len` are zero, so the value is `Copy` with no allocation
//! and comparisons look only at the used bytes.

use core::cmp::Ordering;
use core::fmt;
use core::hash::{Hash, Hasher};

use super::{Body, Reader, WireError, Writer};

/// A peer's network address: 1 to [`NetAddr::MAX_LEN`] opaque bytes.
///
/// Body on the wire (after the message header when it stands alone):
///
/// ```text
///  0       1                 1+len
///  +-------+-----------------+
///  |  len  |  bytes[len]     |      len in 1..=64
///  +-------+-----------------+
/// ```
///
/// `Debug` and `Display` print the bytes in hex.
#[derive(Clone, Copy)]
pub struct NetAddr {
    len: u8,
    bytes: [u8; NetAddr::MAX_LEN],
}

impl NetAddr {
    /// The longest address in bytes.
    pub const MAX_LEN: usize = 64;

    /// An address holding `bytes`; they must be 1 to [`NetAddr::MAX_LEN`]
    /// long.
    pub fn new(bytes: &[u8]) -> Result<Self, WireError> {
        if bytes.is_empty() {
            return Err(WireError::Invalid {
                what: "NetAddr",
                why: "address is empty",
            });
        }
        if bytes.len() > Self::MAX_LEN {
            return Err(WireError::TooLong {
                what: "NetAddr",
                len: bytes.len(),
                max: Self::MAX_LEN,
            });
        }
        let mut buf = [0; Self::MAX_LEN];
        buf[..bytes.len()].copy_from_slice(bytes);
        Ok(NetAddr {
            // Checked above: at most 64.
            len: bytes.len() as u8,
            bytes: buf,
        })
    }

    /// The address bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // `len <= MAX_LEN` by construction; `get` keeps this panic-free.
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

impl PartialEq for NetAddr {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for NetAddr {}

impl Hash for NetAddr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialOrd for NetAddr {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Lexicographic on the bytes.
impl Ord for NetAddr {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Display for NetAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NetAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NetAddr({self})")
    }
}

impl Body for NetAddr {
    fn body_len(&self) -> usize {
        1 + self.as_bytes().len()
    }

    fn validate(&self) -> Result<(), WireError> {
        // Every constructed NetAddr is valid.
        Ok(())
    }

    fn encode_body(&self, w: &mut Writer<'_>) -> Result<(), WireError> {
        w.put(&[self.len])?;
        w.put(self.as_bytes())
    }

    fn decode_body(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let len = r.u8("NetAddr length")?;
        let bytes = r.take(usize::from(len), "NetAddr bytes")?;
        NetAddr::new(bytes)
    }
}

super::wire_via_body!(NetAddr, 1, "NetAddr");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Wire;

    #[test]
    fn new_checks_length() {
        assert!(matches!(
            NetAddr::new(&[]),
            Err(WireError::Invalid {
                what: "NetAddr",
                ..
            })
        ));
        assert_eq!(
            NetAddr::new(&[7; 65]),
            Err(WireError::TooLong {
                what: "NetAddr",
                len: 65,
                max: 64
            })
        );
        assert_eq!(NetAddr::new(&[7; 64]).unwrap().as_bytes(), &[7; 64]);
        assert_eq!(NetAddr::new(&[1, 2]).unwrap().as_bytes(), &[1, 2]);
    }

    #[test]
    fn debug_and_display_print_hex() {
        let a = NetAddr::new(&[0x0a, 0xff, 0x00]).unwrap();
        assert_eq!(format!("{a}"), "0aff00");
        assert_eq!(format!("{a:?}"), "NetAddr(0aff00)");
    }

    #[test]
    fn order_is_lexicographic_on_bytes() {
        let a = NetAddr::new(&[1, 2]).unwrap();
        let b = NetAddr::new(&[1, 2, 0]).unwrap();
        let c = NetAddr::new(&[2]).unwrap();
        assert!(a < b && b < c);
        assert_ne!(a, b);
    }

    #[test]
    fn known_encoding() {
        let a = NetAddr::new(&[0xab, 0xcd]).unwrap();
        let mut out = [0u8; 8];
        let n = a.encode(&mut out).unwrap();
        assert_eq!(&out[..n], &[1, NetAddr::TAG, 2, 0xab, 0xcd]);
        assert_eq!(n, a.encoded_len());
        assert_eq!(NetAddr::decode(&out[..n]), Ok(a));
        assert_eq!(
            a.encode(&mut out[..4]),
            Err(WireError::BufferTooSmall { need: 5, have: 4 })
        );
    }

    #[test]
    fn zero_length_is_rejected() {
        assert!(matches!(
            NetAddr::decode(&[1, NetAddr::TAG, 0]),
            Err(WireError::Invalid {
                what: "NetAddr",
                ..
            })
        ));
        let mut long = [0u8; 3 + 65];
        long[..3].copy_from_slice(&[1, NetAddr::TAG, 65]);
        assert!(matches!(
            NetAddr::decode(&long),
            Err(WireError::TooLong { len: 65, .. })
        ));
    }
}
