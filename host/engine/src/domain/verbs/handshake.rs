//! The connection handshake of the verbs domain, sent over each domain's
//! UD queue pair: what one side must learn about the other to bring its
//! two RC queue pairs to RTR (queue-pair numbers, initial PSNs, the port's
//! LID and GID, the UD qkey, the port's active MTU, the outstanding
//! read/atomic limits each side takes) and a request tag pairing a reply
//! with its request.
//!
//! The encoding is fixed-size, little-endian and versioned: a magic, a
//! version byte and a kind byte lead, and [`Handshake::decode`] refuses
//! anything it does not understand (wrong magic or version, unknown kind,
//! wrong length, a queue-pair number or PSN beyond 24 bits, an MTU code
//! outside 1..=5, a read/atomic limit of 0) with a
//! [`HandshakeError`] naming what was wrong — never a panic, since the
//! bytes come from the network.

use std::fmt;

/// The first bytes of every handshake message.
pub const MAGIC: [u8; 4] = *b"RXHS";
/// The encoding this build writes and reads.
/// Version 3 added the read/atomic limits (`rd_atomic`, `dest_rd_atomic`).
pub const VERSION: u8 = 3;
/// Encoded size in bytes.
pub const ENCODED_LEN: usize = 4 + 1 + 1 + 8 + 2 + 16 + 4 + 4 + 4 + 4 + 4 + 4 + 1 + 1 + 1;

/// Queue-pair numbers and PSNs are 24-bit quantities on the wire of
/// InfiniBand and RoCE.
pub const MAX_24: u32 = (1 << 24) - 1;

/// Whether a message opens a connection or answers one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandshakeKind {
    /// Sent by the side that wants the connection.
    Request,
    /// The answer, carrying the responder's queue pairs.
    Reply,
}

/// One handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handshake {
    /// Request or reply.
    pub kind: HandshakeKind,
    /// Chosen by the requester, echoed by the reply.
    pub tag: u64,
    /// The sender port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// The sender port's GID at the domain's GID index (RoCE, global routing).
    pub gid: [u8; 16],
    /// The sender's UD queue-pair number (where replies go).
    pub ud_qpn: u32,
    /// The sender engine's qkey for UD traffic.
    pub qkey: u32,
    /// The sender's RC queue pair for send/recv.
    pub msg_qpn: u32,
    /// Initial PSN of the sender's send queue on `msg_qpn`.
    pub msg_psn: u32,
    /// The sender's RC queue pair for write, write-with-immediate, read and
    /// atomics.
    pub rdma_qpn: u32,
    /// Initial PSN of the sender's send queue on `rdma_qpn`.
    pub rdma_psn: u32,
    /// The sender port's active MTU (IBV_MTU_* code, 1 = 256 … 5 = 4096);
    /// both sides use the smaller of the two.
    pub mtu: u8,
    /// Outstanding reads/atomics the sender initiates at most (its
    /// `max_rd_atomic`, clamped to its device).
    pub rd_atomic: u8,
    /// Outstanding reads/atomics the sender accepts as responder (its
    /// `max_dest_rd_atomic`, clamped to its device): the receiver's
    /// initiator depth on this connection is at most this.
    pub dest_rd_atomic: u8,
}

/// What was wrong with a handshake message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandshakeError {
    /// Not exactly [`ENCODED_LEN`] bytes.
    Length {
        /// Bytes received.
        got: usize,
    },
    /// Does not start with [`MAGIC`].
    Magic,
    /// A version this build does not speak.
    Version {
        /// The version received.
        got: u8,
    },
    /// A kind byte that is neither request nor reply.
    Kind {
        /// The byte received.
        got: u8,
    },
    /// An MTU code outside 1..=5.
    Mtu {
        /// The code received.
        got: u8,
    },
    /// A read/atomic limit of 0 (no reads or atomics could flow).
    RdAtomic {
        /// The field.
        field: &'static str,
    },
    /// A 24-bit field holding a larger value.
    Field24 {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u32,
    },
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Length { got } => {
                write!(f, "handshake of {got} bytes, expected {ENCODED_LEN}")
            }
            HandshakeError::Magic => f.write_str("handshake does not start with the magic"),
            HandshakeError::Version { got } => {
                write!(f, "handshake version {got}, this build speaks {VERSION}")
            }
            HandshakeError::Kind { got } => write!(f, "handshake kind {got} is unknown"),
            HandshakeError::Mtu { got } => write!(f, "handshake MTU code {got} is not 1..=5"),
            HandshakeError::RdAtomic { field } => {
                write!(f, "handshake {field} is 0")
            }
            HandshakeError::Field24 { field, value } => {
                write!(f, "handshake {field} {value:#x} does not fit 24 bits")
            }
        }
    }
}

impl std::error::Error for HandshakeError {}

impl Handshake {
    /// Encodes the message; errors if a 24-bit field is too large (so a
    /// message that decodes is exactly what was sent).
    pub fn encode(&self) -> Result<[u8; ENCODED_LEN], HandshakeError> {
        self.check()?;
        let mut out = [0u8; ENCODED_LEN];
        let mut w = Writer {
            buf: &mut out,
            at: 0,
        };
        w.put(&MAGIC);
        w.put(&[VERSION]);
        w.put(&[match self.kind {
            HandshakeKind::Request => 1,
            HandshakeKind::Reply => 2,
        }]);
        w.put(&self.tag.to_le_bytes());
        w.put(&self.lid.to_le_bytes());
        w.put(&self.gid);
        for v in [
            self.ud_qpn,
            self.qkey,
            self.msg_qpn,
            self.msg_psn,
            self.rdma_qpn,
            self.rdma_psn,
        ] {
            w.put(&v.to_le_bytes());
        }
        w.put(&[self.mtu, self.rd_atomic, self.dest_rd_atomic]);
        debug_assert_eq!(w.at, ENCODED_LEN);
        Ok(out)
    }

    /// Decodes a message received from a peer.
    pub fn decode(bytes: &[u8]) -> Result<Handshake, HandshakeError> {
        let b: &[u8; ENCODED_LEN] = bytes
            .try_into()
            .map_err(|_| HandshakeError::Length { got: bytes.len() })?;
        if b[..4] != MAGIC {
            return Err(HandshakeError::Magic);
        }
        if b[4] != VERSION {
            return Err(HandshakeError::Version { got: b[4] });
        }
        let kind = match b[5] {
            1 => HandshakeKind::Request,
            2 => HandshakeKind::Reply,
            got => return Err(HandshakeError::Kind { got }),
        };
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut tag = [0u8; 8];
        tag.copy_from_slice(&b[6..14]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[16..32]);
        let h = Handshake {
            kind,
            tag: u64::from_le_bytes(tag),
            lid: u16::from_le_bytes([b[14], b[15]]),
            gid,
            ud_qpn: u32_at(32),
            qkey: u32_at(36),
            msg_qpn: u32_at(40),
            msg_psn: u32_at(44),
            rdma_qpn: u32_at(48),
            rdma_psn: u32_at(52),
            mtu: b[56],
            rd_atomic: b[57],
            dest_rd_atomic: b[58],
        };
        h.check()?;
        Ok(h)
    }

    fn check(&self) -> Result<(), HandshakeError> {
        if !(1..=5).contains(&self.mtu) {
            return Err(HandshakeError::Mtu { got: self.mtu });
        }
        for (field, v) in [
            ("rd_atomic", self.rd_atomic),
            ("dest_rd_atomic", self.dest_rd_atomic),
        ] {
            if v == 0 {
                return Err(HandshakeError::RdAtomic { field });
            }
        }
        for (field, value) in [
            ("ud_qpn", self.ud_qpn),
            ("msg_qpn", self.msg_qpn),
            ("msg_psn", self.msg_psn),
            ("rdma_qpn", self.rdma_qpn),
            ("rdma_psn", self.rdma_psn),
        ] {
            if value > MAX_24 {
                return Err(HandshakeError::Field24 { field, value });
            }
        }
        Ok(())
    }
}

struct Writer<'a> {
    buf: &'a mut [u8; ENCODED_LEN],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Handshake {
        Handshake {
            kind: HandshakeKind::Request,
            tag: 0x0102_0304_0506_0708,
            lid: 7,
            gid: [0xfe; 16],
            ud_qpn: 0x11,
            qkey: 0x1234_5678,
            msg_qpn: 0x22,
            msg_psn: 0xab_cdef,
            rdma_qpn: 0x33,
            rdma_psn: 0x12_3456,
            mtu: 5,
            rd_atomic: 16,
            dest_rd_atomic: 8,
        }
    }

    #[test]
    fn layout_is_magic_version_kind_then_fields() {
        let b = sample().encode().unwrap();
        assert_eq!(&b[..4], b"RXHS");
        assert_eq!(b[4], VERSION);
        assert_eq!(b[5], 1);
        assert_eq!(&b[6..14], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[52..56], &0x12_3456u32.to_le_bytes());
        assert_eq!(b[56], 5);
        assert_eq!((b[57], b[58]), (16, 8));
    }

    #[test]
    fn malformed_input_names_what_was_wrong() {
        let good = sample().encode().unwrap();
        assert_eq!(
            Handshake::decode(&good[..10]),
            Err(HandshakeError::Length { got: 10 })
        );
        let mut long = good.to_vec();
        long.push(0);
        assert_eq!(
            Handshake::decode(&long),
            Err(HandshakeError::Length {
                got: ENCODED_LEN + 1
            })
        );
        let mut b = good;
        b[0] = b'X';
        assert_eq!(Handshake::decode(&b), Err(HandshakeError::Magic));
        let mut b = good;
        b[4] = 9;
        assert_eq!(
            Handshake::decode(&b),
            Err(HandshakeError::Version { got: 9 })
        );
        let mut b = good;
        b[5] = 3;
        assert_eq!(Handshake::decode(&b), Err(HandshakeError::Kind { got: 3 }));
        let mut b = good;
        b[47] = 0x01; // top byte of msg_psn
        assert_eq!(
            Handshake::decode(&b),
            Err(HandshakeError::Field24 {
                field: "msg_psn",
                value: 0x01ab_cdef
            })
        );
        let too_big = Handshake {
            rdma_qpn: 1 << 24,
            ..sample()
        };
        assert!(matches!(
            too_big.encode(),
            Err(HandshakeError::Field24 {
                field: "rdma_qpn",
                ..
            })
        ));
        let mut b = good;
        b[56] = 6;
        assert_eq!(Handshake::decode(&b), Err(HandshakeError::Mtu { got: 6 }));
        let mut b = good;
        b[58] = 0;
        assert_eq!(
            Handshake::decode(&b),
            Err(HandshakeError::RdAtomic {
                field: "dest_rd_atomic"
            })
        );
        assert!(HandshakeError::Magic.to_string().contains("magic"));
    }

    fn arb_handshake() -> impl Strategy<Value = Handshake> {
        (
            any::<bool>(),
            any::<u64>(),
            any::<u16>(),
            any::<[u8; 16]>(),
            (0..=MAX_24, any::<u32>(), 0..=MAX_24, 0..=MAX_24),
            (0..=MAX_24, 0..=MAX_24, 1u8..=5, 1u8.., 1u8..),
        )
            .prop_map(
                |(req, tag, lid, gid, (ud, qkey, mq, mp), (rq, rp, mtu, ra, da))| Handshake {
                    kind: if req {
                        HandshakeKind::Request
                    } else {
                        HandshakeKind::Reply
                    },
                    tag,
                    lid,
                    gid,
                    ud_qpn: ud,
                    qkey,
                    msg_qpn: mq,
                    msg_psn: mp,
                    rdma_qpn: rq,
                    rdma_psn: rp,
                    mtu,
                    rd_atomic: ra,
                    dest_rd_atomic: da,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn round_trip(h in arb_handshake()) {
            let b = h.encode().unwrap();
            prop_assert_eq!(Handshake::decode(&b), Ok(h));
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            // Decoding either fails or yields a message that re-encodes to
            // the same bytes.
            if let Ok(h) = Handshake::decode(&bytes) {
                prop_assert_eq!(&h.encode().unwrap()[..], &bytes[..]);
            }
        }

        #[test]
        fn valid_prefix_with_arbitrary_body(body in any::<[u8; ENCODED_LEN - 6]>()) {
            let mut b = [0u8; ENCODED_LEN];
            b[..4].copy_from_slice(&MAGIC);
            b[4] = VERSION;
            b[5] = 2;
            b[6..].copy_from_slice(&body);
            match Handshake::decode(&b) {
                Ok(h) => prop_assert_eq!(h.encode().unwrap(), b),
                Err(e) => {
                    let is_field = matches!(
                        e,
                        HandshakeError::Field24 { .. }
                            | HandshakeError::Mtu { .. }
                            | HandshakeError::RdAtomic { .. }
                    );
                    prop_assert!(is_field, "{}", e);
                }
            }
        }
    }
}
