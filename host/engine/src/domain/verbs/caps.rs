//! What a verbs device can do, read once at open (`ibv_query_device`), and
//! the choices made from it, device-free so tests drive them with made-up
//! devices:
//! - the [`AtomicProfile`] (vendor and `atomic_cap`: ConnectX replies
//!   big-endian and is atomic only among its own operations, design §5.8);
//! - the outstanding read/atomic limits clamped to the device
//!   ([`DeviceCaps::clamp`]): asking `ibv_modify_qp` for more than
//!   `max_qp_init_rd_atom` / `max_qp_rd_atom` fails with `EINVAL`;
//! - the limits a connection uses, agreed in the handshake
//!   ([`agreed_timing`]): this side's initiator depth never exceeds the
//!   responder resources the peer offers, or the peer NAKs the excess
//!   reads and atomics with a remote invalid request error.

use super::bringup::RcTiming;
use super::handshake::Handshake;
use crate::atomics::AtomicProfile;

/// The fields of `ibv_device_attr` the domain uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// IEEE OUI of the vendor (`0x02c9` Mellanox/NVIDIA).
    pub vendor_id: u32,
    /// The vendor's part number.
    pub vendor_part_id: u32,
    /// `IBV_ATOMIC_NONE` / `_HCA` / `_GLOB`.
    pub atomic_cap: u32,
    /// Outstanding reads/atomics a queue pair may accept as responder.
    pub max_qp_rd_atom: u32,
    /// Outstanding reads/atomics a queue pair may initiate.
    pub max_qp_init_rd_atom: u32,
    /// Queue pairs the device supports.
    pub max_qp: u32,
    /// Work requests a shared receive queue may hold.
    pub max_srq_wr: u32,
}

impl DeviceCaps {
    /// The device's atomics as the engine uses them, on this host.
    pub fn atomic_profile(&self) -> AtomicProfile {
        AtomicProfile::from_verbs(
            self.vendor_id,
            self.atomic_cap,
            cfg!(target_endian = "little"),
        )
    }

    /// `t` with its read/atomic limits lowered to what the device takes
    /// (never below 1: a device reporting 0 still gets a valid request,
    /// which it refuses by name if it must).
    pub fn clamp(&self, t: RcTiming) -> RcTiming {
        let cap = |want: u8, max: u32| -> u8 {
            let max = u8::try_from(max).unwrap_or(u8::MAX).max(1);
            want.min(max)
        };
        RcTiming {
            max_rd_atomic: cap(t.max_rd_atomic, self.max_qp_init_rd_atom),
            max_dest_rd_atomic: cap(t.max_dest_rd_atomic, self.max_qp_rd_atom),
            ..t
        }
    }

    /// A shared-receive-queue depth the device takes.
    pub fn clamp_srq(&self, depth: u32) -> u32 {
        depth.min(self.max_srq_wr.max(1))
    }
}

/// The limits one connection uses: this side's (already clamped) timing,
/// with its initiator depth lowered to the responder resources the peer's
/// handshake offers. The responder resources stay this side's own: they
/// are what its handshake offered.
pub fn agreed_timing(local: &RcTiming, peer: &Handshake) -> RcTiming {
    RcTiming {
        max_rd_atomic: local.max_rd_atomic.min(peer.dest_rd_atomic).max(1),
        ..*local
    }
}

#[cfg(test)]
mod tests {
    use super::super::handshake::HandshakeKind;
    use super::*;
    use crate::atomics::{AtomicRoute, ReplyOrder, IBV_ATOMIC_HCA};

    fn connectx7() -> DeviceCaps {
        // What ibv_devinfo -v prints for a ConnectX-7 (values as documented
        // for mlx5: 16 outstanding reads/atomics each way).
        DeviceCaps {
            vendor_id: 0x02c9,
            vendor_part_id: 4129,
            atomic_cap: IBV_ATOMIC_HCA,
            max_qp_rd_atom: 16,
            max_qp_init_rd_atom: 16,
            max_qp: 1 << 18,
            max_srq_wr: 32767,
        }
    }

    fn hs(dest_rd_atomic: u8) -> Handshake {
        Handshake {
            kind: HandshakeKind::Request,
            tag: 1,
            lid: 0,
            gid: [0; 16],
            ud_qpn: 1,
            qkey: 1,
            msg_qpn: 2,
            msg_psn: 0,
            rdma_qpn: 3,
            rdma_psn: 0,
            mtu: 5,
            rd_atomic: 16,
            dest_rd_atomic,
        }
    }

    #[test]
    fn connectx_is_detected_as_big_endian_and_hca_only() {
        let p = connectx7().atomic_profile();
        if cfg!(target_endian = "little") {
            assert_eq!(p.reply, ReplyOrder::BigEndian);
        }
        assert_eq!(p.route(), AtomicRoute::Nic);
    }

    #[test]
    fn limits_are_clamped_to_the_device() {
        let want = RcTiming {
            max_rd_atomic: 64,
            max_dest_rd_atomic: 64,
            ..RcTiming::default()
        };
        let small = DeviceCaps {
            max_qp_rd_atom: 4,
            max_qp_init_rd_atom: 8,
            ..connectx7()
        };
        let t = small.clamp(want);
        assert_eq!((t.max_rd_atomic, t.max_dest_rd_atomic), (8, 4));
        assert_eq!(t.timeout, want.timeout);
        // Within the device: unchanged.
        assert_eq!(connectx7().clamp(RcTiming::default()), RcTiming::default());
        // A device reporting 0 or more than 255.
        let odd = DeviceCaps {
            max_qp_rd_atom: 0,
            max_qp_init_rd_atom: 1000,
            ..connectx7()
        };
        let t = odd.clamp(want);
        assert_eq!((t.max_rd_atomic, t.max_dest_rd_atomic), (64, 1));
        assert!(t.validate().is_ok());
        assert_eq!(small.clamp_srq(1 << 20), 32767);
        assert_eq!(small.clamp_srq(1024), 1024);
    }

    #[test]
    fn initiator_depth_never_exceeds_what_the_peer_offers() {
        let local = RcTiming {
            max_rd_atomic: 16,
            max_dest_rd_atomic: 8,
            ..RcTiming::default()
        };
        let t = agreed_timing(&local, &hs(4));
        assert_eq!((t.max_rd_atomic, t.max_dest_rd_atomic), (4, 8));
        let t = agreed_timing(&local, &hs(32));
        assert_eq!(t.max_rd_atomic, 16);
    }
}
