//! Queue-pair bring-up of the verbs domain, device-free: the sequence of
//! state transitions (RESET → INIT → RTR → RTS) and the attributes of each,
//! for the domain's UD queue pair and for the two RC queue pairs per peer
//! (one for send/recv, one for write, write-with-immediate, read and
//! atomics), driven through the [`QpDevice`] trait so the real device
//! (`ffi`) and the tests' fake run the same code.
//!
//! Invariant: a queue pair only ever moves forward one legal step
//! ([`QpState::apply`]); a failed step stops the bring-up and reports which
//! queue pair and which step failed. Initial PSNs are random 24-bit
//! numbers and the engine's qkey a random 31-bit number (qkeys with the top
//! bit set are reserved to privileged senders).

use std::fmt;

use rand::Rng;

use super::addr::VerbsAddr;
use super::handshake::{Handshake, HandshakeKind, MAX_24};

/// Remote access granted on RC queue pairs and registrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AccessFlags {
    /// IBV_ACCESS_LOCAL_WRITE.
    pub local_write: bool,
    /// IBV_ACCESS_REMOTE_WRITE.
    pub remote_write: bool,
    /// IBV_ACCESS_REMOTE_READ.
    pub remote_read: bool,
    /// IBV_ACCESS_REMOTE_ATOMIC.
    pub remote_atomic: bool,
    /// IBV_ACCESS_RELAXED_ORDERING: lets PCIe reorder NIC↔memory
    /// transactions (GPU memory throughput); completions still order.
    pub relaxed_ordering: bool,
}

impl AccessFlags {
    /// Everything the engine's operations need, with relaxed ordering:
    /// what every registration asks for.
    pub const REGISTRATION: AccessFlags = AccessFlags {
        local_write: true,
        remote_write: true,
        remote_read: true,
        remote_atomic: true,
        relaxed_ordering: true,
    };
    /// What an RC queue pair grants its peer (relaxed ordering is a
    /// registration flag only).
    pub const RC_QP: AccessFlags = AccessFlags {
        relaxed_ordering: false,
        ..AccessFlags::REGISTRATION
    };
}

/// RC timing and retry options (`ibv_modify_qp` to RTR/RTS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcTiming {
    /// Local ACK timeout exponent: 4.096 µs × 2^timeout (0 = infinite).
    pub timeout: u8,
    /// Transport retries before an error (0..=7).
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (0..=7, 7 = infinite).
    pub rnr_retry: u8,
    /// RNR NAK timer code advertised to the peer (0..=31).
    pub min_rnr_timer: u8,
    /// Outstanding reads/atomics this side initiates.
    pub max_rd_atomic: u8,
    /// Outstanding reads/atomics this side accepts.
    pub max_dest_rd_atomic: u8,
}

impl Default for RcTiming {
    fn default() -> Self {
        // 14 → about 67 ms per try, 7 tries: a dead peer is reported in
        // about half a second, long enough for a congested fabric.
        RcTiming {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
        }
    }
}

impl RcTiming {
    /// Checks the ranges the hardware accepts.
    pub fn validate(&self) -> Result<(), &'static str> {
        if self.timeout > 31 {
            return Err("RC timeout exponent above 31");
        }
        if self.retry_cnt > 7 || self.rnr_retry > 7 {
            return Err("RC retry counts above 7");
        }
        if self.min_rnr_timer > 31 {
            return Err("RNR timer code above 31");
        }
        if self.max_rd_atomic == 0 || self.max_dest_rd_atomic == 0 {
            return Err("outstanding read/atomic limits of 0");
        }
        Ok(())
    }
}

/// Where a queue pair's peer is (the RTR address vector).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathTo {
    /// Peer LID (InfiniBand).
    pub dlid: u16,
    /// Peer GID (global routing; always used, RoCE needs it).
    pub dgid: [u8; 16],
    /// Local GID index.
    pub sgid_index: u8,
    /// Local port.
    pub port: u8,
}

/// One `ibv_modify_qp` call, with the attributes it sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// RESET → INIT.
    Init {
        /// Port number.
        port: u8,
        /// P_Key index.
        pkey_index: u16,
        /// RC: access granted to the peer; UD: unused.
        access: AccessFlags,
        /// UD: the qkey; RC: unused.
        qkey: Option<u32>,
    },
    /// INIT → RTR.
    Rtr {
        /// RC: path to the peer; UD: none.
        path: Option<PathTo>,
        /// RC: peer queue-pair number.
        dest_qpn: u32,
        /// RC: the peer's initial send PSN (our expected receive PSN).
        rq_psn: u32,
        /// RC: path MTU (IBV_MTU_* code, 1 = 256 … 5 = 4096).
        path_mtu: u8,
        /// RC: reads/atomics accepted.
        max_dest_rd_atomic: u8,
        /// RC: RNR NAK timer code.
        min_rnr_timer: u8,
    },
    /// RTR → RTS.
    Rts {
        /// Our initial send PSN.
        sq_psn: u32,
        /// RC: ACK timeout exponent.
        timeout: u8,
        /// RC: transport retries.
        retry_cnt: u8,
        /// RC: RNR retries.
        rnr_retry: u8,
        /// RC: reads/atomics initiated.
        max_rd_atomic: u8,
    },
    /// SQE → RTS: a UD queue pair whose send failed stops sending (the
    /// send-queue-error state) until moved back; nothing else changes.
    RecoverSqe,
}

/// A queue pair's state, as far as bring-up goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Just created.
    Reset,
    /// Port and access set.
    Init,
    /// Can receive.
    Rtr,
    /// Can send.
    Rts,
    /// A send failed (UD): receives go on, sends wait for
    /// [`Transition::RecoverSqe`].
    Sqe,
}

impl QpState {
    /// The state after `t`, if `t` is the legal next step from `self`.
    pub fn apply(self, t: &Transition) -> Result<QpState, BringUpError> {
        match (self, t) {
            (QpState::Reset, Transition::Init { .. }) => Ok(QpState::Init),
            (QpState::Init, Transition::Rtr { .. }) => Ok(QpState::Rtr),
            (QpState::Rtr, Transition::Rts { .. }) => Ok(QpState::Rts),
            // Harmless on a queue pair that is still at RTS (the error
            // completion and the state change race).
            (QpState::Sqe | QpState::Rts, Transition::RecoverSqe) => Ok(QpState::Rts),
            (from, _) => Err(BringUpError::Illegal { from }),
        }
    }
}

/// Which queue pair of a bring-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpRole {
    /// The domain's UD queue pair (handshakes).
    Ud,
    /// The RC queue pair for send/recv.
    Msg,
    /// The RC queue pair for write, write-with-immediate, read, atomics.
    Rdma,
}

/// Why a bring-up failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BringUpError {
    /// A step out of order (a bug in the caller; never sent to hardware).
    Illegal {
        /// The state it was tried from.
        from: QpState,
    },
    /// The device refused a queue-pair creation or a transition.
    Device {
        /// Which queue pair.
        role: QpRole,
        /// The C call.
        call: &'static str,
        /// Its errno.
        errno: i32,
    },
    /// The peer's handshake is not the kind expected here.
    UnexpectedKind(HandshakeKind),
}

impl fmt::Display for BringUpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BringUpError::Illegal { from } => write!(f, "illegal QP transition from {from:?}"),
            BringUpError::Device { role, call, errno } => {
                write!(
                    f,
                    "{call} on the {role:?} queue pair failed (errno {errno})"
                )
            }
            BringUpError::UnexpectedKind(k) => write!(f, "unexpected handshake {k:?}"),
        }
    }
}

impl std::error::Error for BringUpError {}

/// What bring-up needs of a device: create queue pairs and move them.
pub trait QpDevice {
    /// A queue pair (dropping it destroys it).
    type Qp;
    /// Creates a queue pair in RESET; returns it and its number.
    fn create_qp(&mut self, role: QpRole) -> Result<(Self::Qp, u32), BringUpError>;
    /// Applies one transition.
    fn modify(
        &mut self,
        qp: &mut Self::Qp,
        role: QpRole,
        t: &Transition,
    ) -> Result<(), BringUpError>;
}

/// A queue pair with its number and tracked state.
#[derive(Debug)]
pub struct BroughtUp<Q> {
    /// The device's queue pair.
    pub qp: Q,
    /// Its number.
    pub qpn: u32,
    /// Its initial send PSN (RC) or 0 (UD).
    pub psn: u32,
    /// Its state.
    pub state: QpState,
}

fn step<D: QpDevice>(
    dev: &mut D,
    q: &mut BroughtUp<D::Qp>,
    role: QpRole,
    t: Transition,
) -> Result<(), BringUpError> {
    let next = q.state.apply(&t)?;
    dev.modify(&mut q.qp, role, &t)?;
    q.state = next;
    Ok(())
}

/// A random initial PSN (24 bits).
pub fn random_psn(rng: &mut impl Rng) -> u32 {
    rng.gen::<u32>() & MAX_24
}

/// A random qkey for an engine (top bit clear: not a controlled qkey).
pub fn random_qkey(rng: &mut impl Rng) -> u32 {
    rng.gen::<u32>() & 0x7fff_ffff
}

/// Creates the domain's UD queue pair and brings it to RTS.
pub fn bring_up_ud<D: QpDevice>(
    dev: &mut D,
    port: u8,
    qkey: u32,
) -> Result<BroughtUp<D::Qp>, BringUpError> {
    let (qp, qpn) = dev.create_qp(QpRole::Ud)?;
    let mut q = BroughtUp {
        qp,
        qpn,
        psn: 0,
        state: QpState::Reset,
    };
    step(
        dev,
        &mut q,
        QpRole::Ud,
        Transition::Init {
            port,
            pkey_index: 0,
            access: AccessFlags::default(),
            qkey: Some(qkey),
        },
    )?;
    step(
        dev,
        &mut q,
        QpRole::Ud,
        Transition::Rtr {
            path: None,
            dest_qpn: 0,
            rq_psn: 0,
            path_mtu: 0,
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
        },
    )?;
    step(
        dev,
        &mut q,
        QpRole::Ud,
        Transition::Rts {
            sq_psn: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
        },
    )?;
    Ok(q)
}

/// The two RC queue pairs of one peer, created but not yet connected: what
/// the local handshake advertises.
#[derive(Debug)]
pub struct PeerQps<Q> {
    /// Send/recv.
    pub msg: BroughtUp<Q>,
    /// Write, write-with-immediate, read, atomics.
    pub rdma: BroughtUp<Q>,
}

/// Brings the UD queue pair back from SQE after a handshake send completed
/// in error; without it every later handshake send of the domain would
/// fail and no peer could connect.
pub fn recover_ud<D: QpDevice>(dev: &mut D, qp: &mut D::Qp) -> Result<(), BringUpError> {
    dev.modify(qp, QpRole::Ud, &Transition::RecoverSqe)
}

/// Creates the two RC queue pairs of a peer with random initial PSNs and
/// takes them to INIT.
pub fn create_peer<D: QpDevice>(
    dev: &mut D,
    port: u8,
    rng: &mut impl Rng,
) -> Result<PeerQps<D::Qp>, BringUpError> {
    let mut make = |role| -> Result<BroughtUp<D::Qp>, BringUpError> {
        let (qp, qpn) = dev.create_qp(role)?;
        let mut q = BroughtUp {
            qp,
            qpn,
            psn: random_psn(rng),
            state: QpState::Reset,
        };
        step(
            dev,
            &mut q,
            role,
            Transition::Init {
                port,
                pkey_index: 0,
                access: AccessFlags::RC_QP,
                qkey: None,
            },
        )?;
        Ok(q)
    };
    let msg = make(QpRole::Msg)?;
    let rdma = make(QpRole::Rdma)?;
    Ok(PeerQps { msg, rdma })
}

/// What this side's handshake says about a peer's pair: the sender's
/// address (`me`), its port's MTU code, its read/atomic limits (`timing`,
/// clamped to the device) and the pair's numbers and PSNs.
pub fn local_handshake<Q>(
    kind: HandshakeKind,
    tag: u64,
    me: &VerbsAddr,
    mtu: u8,
    timing: &RcTiming,
    qps: &PeerQps<Q>,
) -> Handshake {
    Handshake {
        kind,
        tag,
        lid: me.lid,
        gid: me.gid,
        ud_qpn: me.ud_qpn,
        qkey: me.qkey,
        msg_qpn: qps.msg.qpn,
        msg_psn: qps.msg.psn,
        rdma_qpn: qps.rdma.qpn,
        rdma_psn: qps.rdma.psn,
        mtu,
        rd_atomic: timing.max_rd_atomic,
        dest_rd_atomic: timing.max_dest_rd_atomic,
    }
}

/// Connects a peer's two RC queue pairs (INIT → RTR → RTS) to the queue
/// pairs the peer's handshake names: our msg QP to its msg QP, our rdma QP
/// to its rdma QP. The initiator depth is lowered to the responder
/// resources the peer offers ([`super::caps::agreed_timing`]).
pub fn connect_peer<D: QpDevice>(
    dev: &mut D,
    qps: &mut PeerQps<D::Qp>,
    remote: &Handshake,
    port: u8,
    sgid_index: u8,
    path_mtu: u8,
    timing: &RcTiming,
) -> Result<(), BringUpError> {
    let timing = &super::caps::agreed_timing(timing, remote);
    let path = PathTo {
        dlid: remote.lid,
        dgid: remote.gid,
        sgid_index,
        port,
    };
    for (role, q, dest_qpn, rq_psn) in [
        (QpRole::Msg, &mut qps.msg, remote.msg_qpn, remote.msg_psn),
        (
            QpRole::Rdma,
            &mut qps.rdma,
            remote.rdma_qpn,
            remote.rdma_psn,
        ),
    ] {
        step(
            dev,
            q,
            role,
            Transition::Rtr {
                path: Some(path),
                dest_qpn,
                rq_psn,
                path_mtu,
                max_dest_rd_atomic: timing.max_dest_rd_atomic,
                min_rnr_timer: timing.min_rnr_timer,
            },
        )?;
        let sq_psn = q.psn;
        step(
            dev,
            q,
            role,
            Transition::Rts {
                sq_psn,
                timeout: timing.timeout,
                retry_cnt: timing.retry_cnt,
                rnr_retry: timing.rnr_retry,
                max_rd_atomic: timing.max_rd_atomic,
            },
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// Records every call; fails the n-th modify when asked.
    #[derive(Default)]
    struct Fake {
        next_qpn: u32,
        log: Vec<(QpRole, u32, Transition)>,
        fail_modify_at: Option<usize>,
        destroyed: std::rc::Rc<std::cell::Cell<usize>>,
    }

    struct FakeQp {
        qpn: u32,
        destroyed: std::rc::Rc<std::cell::Cell<usize>>,
    }

    impl Drop for FakeQp {
        fn drop(&mut self) {
            self.destroyed.set(self.destroyed.get() + 1);
        }
    }

    impl QpDevice for Fake {
        type Qp = FakeQp;
        fn create_qp(&mut self, _role: QpRole) -> Result<(FakeQp, u32), BringUpError> {
            self.next_qpn += 1;
            let qpn = 0x100 + self.next_qpn;
            Ok((
                FakeQp {
                    qpn,
                    destroyed: self.destroyed.clone(),
                },
                qpn,
            ))
        }
        fn modify(
            &mut self,
            qp: &mut FakeQp,
            role: QpRole,
            t: &Transition,
        ) -> Result<(), BringUpError> {
            if self.fail_modify_at == Some(self.log.len()) {
                return Err(BringUpError::Device {
                    role,
                    call: "ibv_modify_qp",
                    errno: 22,
                });
            }
            self.log.push((role, qp.qpn, *t));
            Ok(())
        }
    }

    fn remote() -> Handshake {
        Handshake {
            kind: HandshakeKind::Reply,
            tag: 9,
            lid: 3,
            gid: [7; 16],
            ud_qpn: 0x900,
            qkey: 0x55,
            msg_qpn: 0x901,
            msg_psn: 0x00_1111,
            rdma_qpn: 0x902,
            rdma_psn: 0x00_2222,
            mtu: 5,
            rd_atomic: 16,
            // The peer accepts fewer than we would initiate.
            dest_rd_atomic: 4,
        }
    }

    #[test]
    fn ud_goes_reset_init_rtr_rts_with_the_qkey() {
        let mut dev = Fake::default();
        let q = bring_up_ud(&mut dev, 1, 0x1234).unwrap();
        assert_eq!(q.state, QpState::Rts);
        let kinds: Vec<_> = dev.log.iter().map(|(r, _, t)| (*r, t)).collect();
        assert_eq!(kinds.len(), 3);
        assert!(matches!(
            kinds[0],
            (
                QpRole::Ud,
                Transition::Init {
                    port: 1,
                    qkey: Some(0x1234),
                    ..
                }
            )
        ));
        assert!(matches!(
            kinds[1],
            (QpRole::Ud, Transition::Rtr { path: None, .. })
        ));
        assert!(matches!(kinds[2], (QpRole::Ud, Transition::Rts { .. })));
    }

    #[test]
    fn two_rc_qps_per_peer_connect_crosswise_with_the_timing() {
        let mut dev = Fake::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut qps = create_peer(&mut dev, 1, &mut rng).unwrap();
        assert_ne!(qps.msg.qpn, qps.rdma.qpn);
        assert!(qps.msg.psn <= MAX_24 && qps.rdma.psn <= MAX_24);
        let timing = RcTiming {
            timeout: 18,
            retry_cnt: 3,
            rnr_retry: 5,
            ..RcTiming::default()
        };
        let hs = local_handshake(
            HandshakeKind::Request,
            9,
            &VerbsAddr {
                gid: [1; 16],
                lid: 2,
                ud_qpn: 0x77,
                qkey: 0x55,
            },
            5,
            &timing,
            &qps,
        );
        assert_eq!((hs.rd_atomic, hs.dest_rd_atomic), (16, 16));
        assert_eq!((hs.msg_qpn, hs.msg_psn), (qps.msg.qpn, qps.msg.psn));
        assert_eq!((hs.rdma_qpn, hs.rdma_psn), (qps.rdma.qpn, qps.rdma.psn));
        connect_peer(&mut dev, &mut qps, &remote(), 1, 3, 5, &timing).unwrap();
        assert_eq!(
            (qps.msg.state, qps.rdma.state),
            (QpState::Rts, QpState::Rts)
        );
        let (msg, rdma) = (qps.msg.qpn, qps.rdma.qpn);
        let log: Vec<_> = dev.log.iter().map(|(r, n, _)| (*r, *n)).collect();
        assert_eq!(
            log,
            [
                (QpRole::Msg, msg),
                (QpRole::Rdma, rdma),
                (QpRole::Msg, msg),
                (QpRole::Msg, msg),
                (QpRole::Rdma, rdma),
                (QpRole::Rdma, rdma),
            ]
        );
        // INIT grants remote write/read/atomic.
        assert!(matches!(
            dev.log[0].2,
            Transition::Init {
                access: AccessFlags::RC_QP,
                qkey: None,
                ..
            }
        ));
        // Initiator depth agreed down to the peer's 4; we accept our 16.
        for (rtr, rts) in [(2, 3), (4, 5)] {
            assert!(matches!(
                dev.log[rtr].2,
                Transition::Rtr {
                    max_dest_rd_atomic: 16,
                    ..
                }
            ));
            assert!(matches!(
                dev.log[rts].2,
                Transition::Rts {
                    max_rd_atomic: 4,
                    ..
                }
            ));
        }
        // Our msg QP targets the peer's msg QP at its PSN, rdma to rdma.
        match dev.log[2].2 {
            Transition::Rtr {
                path: Some(p),
                dest_qpn,
                rq_psn,
                path_mtu,
                ..
            } => {
                assert_eq!((dest_qpn, rq_psn, path_mtu), (0x901, 0x1111, 5));
                assert_eq!((p.dlid, p.dgid, p.sgid_index, p.port), (3, [7; 16], 3, 1));
            }
            ref t => panic!("expected RTR, got {t:?}"),
        }
        assert!(matches!(
            dev.log[4].2,
            Transition::Rtr {
                dest_qpn: 0x902,
                rq_psn: 0x2222,
                ..
            }
        ));
        match dev.log[5].2 {
            Transition::Rts {
                sq_psn,
                timeout,
                retry_cnt,
                rnr_retry,
                ..
            } => assert_eq!(
                (sq_psn, timeout, retry_cnt, rnr_retry),
                (qps.rdma.psn, 18, 3, 5)
            ),
            ref t => panic!("expected RTS, got {t:?}"),
        }
    }

    #[test]
    fn a_failed_step_stops_and_names_the_qp_and_keeps_the_state() {
        let mut dev = Fake {
            fail_modify_at: Some(3),
            ..Fake::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let mut qps = create_peer(&mut dev, 1, &mut rng).unwrap();
        let err = connect_peer(&mut dev, &mut qps, &remote(), 1, 0, 5, &RcTiming::default());
        assert_eq!(
            err,
            Err(BringUpError::Device {
                role: QpRole::Msg,
                call: "ibv_modify_qp",
                errno: 22
            })
        );
        assert_eq!(qps.msg.state, QpState::Rtr);
        assert_eq!(qps.rdma.state, QpState::Init);
        assert_eq!(dev.log.len(), 3);
        let destroyed = dev.destroyed.clone();
        drop(qps);
        assert_eq!(destroyed.get(), 2);
    }

    #[test]
    fn illegal_steps_are_refused() {
        let rts = Transition::Rts {
            sq_psn: 0,
            timeout: 0,
            retry_cnt: 0,
            rnr_retry: 0,
            max_rd_atomic: 0,
        };
        assert_eq!(
            QpState::Reset.apply(&rts),
            Err(BringUpError::Illegal {
                from: QpState::Reset
            })
        );
        assert!(QpState::Rts.apply(&rts).is_err());
    }

    #[test]
    fn a_ud_queue_pair_comes_back_from_sqe() {
        let r = Transition::RecoverSqe;
        assert_eq!(QpState::Sqe.apply(&r), Ok(QpState::Rts));
        assert_eq!(QpState::Rts.apply(&r), Ok(QpState::Rts));
        assert!(QpState::Init.apply(&r).is_err());
        // The call the domain makes after a failed handshake send.
        let mut dev = Fake::default();
        let (mut qp, _) = dev.create_qp(QpRole::Ud).unwrap();
        recover_ud(&mut dev, &mut qp).unwrap();
        assert_eq!(dev.log.last().map(|l| (l.0, l.2)), Some((QpRole::Ud, r)));
    }

    #[test]
    fn psns_and_qkeys_are_random_and_in_range() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let psns: Vec<u32> = (0..64).map(|_| random_psn(&mut rng)).collect();
        assert!(psns.iter().all(|p| *p <= MAX_24));
        assert!(psns.windows(2).any(|w| w[0] != w[1]));
        let qkeys: Vec<u32> = (0..64).map(|_| random_qkey(&mut rng)).collect();
        assert!(qkeys.iter().all(|q| q & 0x8000_0000 == 0));
        assert!(qkeys.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn timing_ranges_are_checked() {
        assert!(RcTiming::default().validate().is_ok());
        let bad = RcTiming {
            retry_cnt: 8,
            ..RcTiming::default()
        };
        assert!(bad.validate().is_err());
        let bad = RcTiming {
            timeout: 32,
            ..RcTiming::default()
        };
        assert!(bad.validate().is_err());
    }
}
