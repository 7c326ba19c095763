//! The verbs domain's [`NetAddr`] layout: what a peer needs to send this
//! domain a connection handshake over UD (the port's GID and LID, the UD
//! queue-pair number and the engine's qkey), in 28 bytes.
//!
//! ```text
//!  0     1         2            18        20             24          28
//!  +-----+---------+------------+---------+--------------+-----------+
//!  | 'V' | version | GID (16)   | LID LE  | UD QPN LE    | qkey LE   |
//!  +-----+---------+------------+---------+--------------+-----------+
//! ```
//!
//! The format byte `'V'` keeps verbs addresses apart from the other
//! backends' (loopback addresses are text, libfabric ones provider names).
//! Invariant: [`VerbsAddr::decode`] accepts exactly what
//! [`VerbsAddr::to_net`] produces — the version this build writes, a QPN
//! of at most 24 bits, a qkey with the top bit clear — and refuses
//! anything else with a [`WireError`] naming the field, never a panic: the
//! bytes come from peers. The qkey doubles as an incarnation check: a
//! stale address whose UD queue-pair number was reused by another engine
//! carries the old engine's qkey, which the new queue pair drops.

use rolex_core::wire::{NetAddr, WireError};

use super::handshake::MAX_24;

/// First byte of every verbs address.
pub const FORMAT: u8 = b'V';
/// The layout this build writes and reads.
pub const ADDR_VERSION: u8 = 1;
/// Encoded size in bytes.
pub const ADDR_LEN: usize = 28;

const WHAT: &str = "verbs address";

/// A verbs domain's address, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VerbsAddr {
    /// The port's GID at the domain's GID index.
    pub gid: [u8; 16],
    /// The port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The domain's UD queue pair, where handshakes go.
    pub ud_qpn: u32,
    /// The engine's qkey for UD traffic (top bit clear).
    pub qkey: u32,
}

impl VerbsAddr {
    /// The encoded bytes.
    pub fn encode(&self) -> Result<[u8; ADDR_LEN], WireError> {
        self.check()?;
        let mut b = [0u8; ADDR_LEN];
        b[0] = FORMAT;
        b[1] = ADDR_VERSION;
        b[2..18].copy_from_slice(&self.gid);
        b[18..20].copy_from_slice(&self.lid.to_le_bytes());
        b[20..24].copy_from_slice(&self.ud_qpn.to_le_bytes());
        b[24..28].copy_from_slice(&self.qkey.to_le_bytes());
        Ok(b)
    }

    /// As a [`NetAddr`].
    pub fn to_net(&self) -> Result<NetAddr, WireError> {
        NetAddr::new(&self.encode()?)
    }

    /// Decodes a peer's address bytes.
    pub fn decode(bytes: &[u8]) -> Result<VerbsAddr, WireError> {
        if bytes.len() < ADDR_LEN {
            return Err(WireError::Truncated {
                what: WHAT,
                need: ADDR_LEN,
                have: bytes.len(),
            });
        }
        if bytes.len() > ADDR_LEN {
            return Err(WireError::TrailingBytes {
                what: WHAT,
                extra: bytes.len() - ADDR_LEN,
            });
        }
        if bytes[0] != FORMAT {
            return Err(WireError::BadTag {
                what: WHAT,
                found: bytes[0],
            });
        }
        if bytes[1] != ADDR_VERSION {
            return Err(WireError::Invalid {
                what: "verbs address version",
                why: "this build reads version 1 only",
            });
        }
        let u32_at = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&bytes[2..18]);
        let a = VerbsAddr {
            gid,
            lid: u16::from_le_bytes([bytes[18], bytes[19]]),
            ud_qpn: u32_at(20),
            qkey: u32_at(24),
        };
        a.check()?;
        Ok(a)
    }

    /// Decodes a peer's [`NetAddr`].
    pub fn from_net(addr: &NetAddr) -> Result<VerbsAddr, WireError> {
        VerbsAddr::decode(addr.as_bytes())
    }

    fn check(&self) -> Result<(), WireError> {
        if self.ud_qpn > MAX_24 {
            return Err(WireError::Invalid {
                what: "verbs address UD QPN",
                why: "does not fit 24 bits",
            });
        }
        if self.qkey & 0x8000_0000 != 0 {
            return Err(WireError::Invalid {
                what: "verbs address qkey",
                why: "top bit set (a controlled qkey)",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> VerbsAddr {
        VerbsAddr {
            gid: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8],
            lid: 0x1234,
            ud_qpn: 0x00ab_cdef,
            qkey: 0x1122_3344,
        }
    }

    #[test]
    fn layout_is_format_version_gid_lid_qpn_qkey() {
        let b = sample().encode().unwrap();
        assert_eq!(b[0], b'V');
        assert_eq!(b[1], ADDR_VERSION);
        assert_eq!(&b[2..18], &sample().gid);
        assert_eq!(&b[18..20], &[0x34, 0x12]);
        assert_eq!(&b[20..24], &[0xef, 0xcd, 0xab, 0]);
        assert_eq!(&b[24..28], &0x1122_3344u32.to_le_bytes());
        let net = sample().to_net().unwrap();
        assert_eq!(net.as_bytes(), &b);
        assert_eq!(VerbsAddr::from_net(&net), Ok(sample()));
    }

    #[test]
    fn malformed_addresses_name_the_problem() {
        let good = sample().encode().unwrap();
        assert!(matches!(
            VerbsAddr::decode(&good[..27]),
            Err(WireError::Truncated {
                need: 28,
                have: 27,
                ..
            })
        ));
        let mut long = good.to_vec();
        long.push(0);
        assert!(matches!(
            VerbsAddr::decode(&long),
            Err(WireError::TrailingBytes { extra: 1, .. })
        ));
        // A loopback address is not a verbs one.
        assert!(matches!(
            VerbsAddr::decode(b"loopback/1/0"),
            Err(WireError::Truncated { .. })
        ));
        let mut b = good;
        b[0] = b'l';
        assert_eq!(
            VerbsAddr::decode(&b),
            Err(WireError::BadTag {
                what: WHAT,
                found: b'l'
            })
        );
        let mut b = good;
        b[1] = 2;
        assert!(matches!(
            VerbsAddr::decode(&b),
            Err(WireError::Invalid {
                what: "verbs address version",
                ..
            })
        ));
        let mut b = good;
        b[23] = 1;
        assert!(matches!(
            VerbsAddr::decode(&b),
            Err(WireError::Invalid {
                what: "verbs address UD QPN",
                ..
            })
        ));
        let mut b = good;
        b[27] = 0x80;
        assert!(matches!(
            VerbsAddr::decode(&b),
            Err(WireError::Invalid {
                what: "verbs address qkey",
                ..
            })
        ));
        let bad = VerbsAddr {
            ud_qpn: 1 << 24,
            ..sample()
        };
        assert!(bad.encode().is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn round_trip(gid in any::<[u8; 16]>(), lid in any::<u16>(), qpn in 0..=MAX_24, qkey in 0u32..0x8000_0000) {
            let a = VerbsAddr { gid, lid, ud_qpn: qpn, qkey };
            prop_assert_eq!(VerbsAddr::from_net(&a.to_net().unwrap()), Ok(a));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            if let Ok(a) = VerbsAddr::decode(&bytes) {
                prop_assert_eq!(&a.encode().unwrap()[..], &bytes[..]);
            }
        }
    }
}
