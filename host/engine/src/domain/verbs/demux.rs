//! Completion demultiplexing and the send side of one RC queue pair,
//! device-free.
//!
//! Every queue of a verbs domain reports into one completion queue, so each
//! posted request's `wr_id` says what it was ([`WrTag`]): a request of an
//! engine operation (tagged with the domain's sequence number of the
//! operation, which is unique, unlike the engine's own ids), a zero-length
//! receive on the immediates' shared receive queue, a message receive, or
//! a UD handshake receive or send (tagged with their buffer slot).
//!
//! A [`SendSide`] is one RC queue pair's send half: operations queue in
//! its backlog and go out as chains of up to [`MAX_CHAIN`] requests behind
//! one doorbell, as long as the queue pair has room (`depth` requests) and
//! the domain's completion queue has room (one entry per signalled chain,
//! counted in a shared budget); completions settle them in order through
//! [`Outstanding`]. Invariants: every operation pushed is reported exactly
//! once — settled by a completion, failed at posting, skipped because its
//! owner gave up on it, or flushed; a queue pair that failed stops posting
//! (its backlog can move to a new connection).

use std::collections::VecDeque;

use ibverbs_sys::ibv_wc_status;
use rolex_core::wire::NetAddr;

use super::completions::{Outstanding, UnknownCompletion, WrError};
use super::error::VerbsError;
use super::wr::{Chain, ChainOp, WrTemplates, MAX_CHAIN};
use crate::error::{OpKind, TransferError};

/// What a `wr_id` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WrTag {
    /// A request of an engine operation (its sequence number).
    Op,
    /// A zero-length receive for immediates.
    Imm,
    /// A message receive (its slot).
    Msg,
    /// A UD handshake receive (its slot).
    UdRecv,
    /// A UD handshake send (its slot).
    UdSend,
}

const TAG_SHIFT: u32 = 56;
const VALUE_MASK: u64 = (1 << TAG_SHIFT) - 1;

impl WrTag {
    fn code(self) -> u64 {
        match self {
            WrTag::Op => 1,
            WrTag::Imm => 2,
            WrTag::Msg => 3,
            WrTag::UdRecv => 4,
            WrTag::UdSend => 5,
        }
    }

    /// The `wr_id` for `value` (its low 56 bits).
    pub fn id(self, value: u64) -> u64 {
        (self.code() << TAG_SHIFT) | (value & VALUE_MASK)
    }

    /// What a `wr_id` names; `None` for an id this domain never posts.
    pub fn split(wr_id: u64) -> Option<(WrTag, u64)> {
        let tag = match wr_id >> TAG_SHIFT {
            1 => WrTag::Op,
            2 => WrTag::Imm,
            3 => WrTag::Msg,
            4 => WrTag::UdRecv,
            5 => WrTag::UdSend,
            _ => return None,
        };
        Some((tag, wr_id & VALUE_MASK))
    }
}

/// A chain `ibv_post_send` refused, wholly or in part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PostError {
    /// Requests at the front of the chain the NIC took before the one it
    /// refused (`ibv_post_send` queues the requests ahead of its `bad_wr`).
    pub posted: usize,
    /// Why the rest was refused.
    pub error: VerbsError,
}

/// Posts a built chain (the real queue pair, or a test's fake).
pub trait PostChain {
    /// One `ibv_post_send` of the whole chain.
    fn post_chain(&mut self, chain: &mut Chain) -> Result<(), PostError>;
}

/// An operation that left a send side without a completion from the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotPosted {
    /// The chain could not be built or posted.
    Refused(VerbsError),
    /// Its owner no longer wanted it (timed out or flushed while queued).
    Skipped,
}

/// The send half of one RC queue pair (see the module docs).
#[derive(Debug)]
pub struct SendSide<Q> {
    /// The queue pair.
    pub qp: Q,
    backlog: VecDeque<(u64, ChainOp)>,
    outstanding: Outstanding,
    /// Requests posted and not yet settled.
    in_flight: usize,
    depth: usize,
    failed: bool,
}

impl<Q: PostChain> SendSide<Q> {
    /// A send side of `depth` requests on `qp`.
    pub fn new(qp: Q, depth: usize) -> SendSide<Q> {
        SendSide {
            qp,
            backlog: VecDeque::new(),
            outstanding: Outstanding::new(),
            in_flight: 0,
            depth: depth.max(MAX_CHAIN),
            failed: false,
        }
    }

    /// Queues an operation (`id` is its `wr_id`).
    pub fn push(&mut self, id: u64, op: ChainOp) {
        self.backlog.push_back((id, op));
    }

    /// Whether nothing is queued or outstanding.
    pub fn idle(&self) -> bool {
        self.backlog.is_empty() && self.outstanding.is_empty()
    }

    /// Whether nothing is outstanding at the NIC.
    pub fn drained(&self) -> bool {
        self.outstanding.is_empty()
    }

    /// Whether a request failed on this queue pair (it is in the error
    /// state and posts nothing more).
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// Takes the operations not yet posted (to move them to a new
    /// connection).
    pub fn take_backlog(&mut self) -> VecDeque<(u64, ChainOp)> {
        std::mem::take(&mut self.backlog)
    }

    /// Posts queued operations as chains while the queue pair and the
    /// completion queue have room (`budget` counts the completion entries
    /// left; one per chain). `keep` says whether an operation is still
    /// wanted; the ones not wanted, and the ones the NIC refused, go to
    /// `not_posted` (of a chain refused part-way, the requests ahead of the
    /// refused one were taken and stay outstanding). Returns how many
    /// chains were posted, wholly or in part.
    pub fn pump(
        &mut self,
        templates: &WrTemplates,
        chain: &mut Chain,
        budget: &mut usize,
        keep: &mut dyn FnMut(u64) -> bool,
        not_posted: &mut Vec<(u64, NotPosted)>,
    ) -> usize {
        let mut posted = 0;
        let mut ops: Vec<(u64, ChainOp)> = Vec::with_capacity(MAX_CHAIN);
        while !self.failed && *budget > 0 {
            let room = self.depth - self.in_flight;
            ops.clear();
            while ops.len() < MAX_CHAIN.min(room) {
                let Some((id, op)) = self.backlog.pop_front() else {
                    break;
                };
                if keep(id) {
                    ops.push((id, op));
                } else {
                    not_posted.push((id, NotPosted::Skipped));
                }
            }
            if ops.is_empty() {
                break;
            }
            let r = chain
                .build(templates, &ops)
                .map_err(|_| PostError {
                    posted: 0,
                    error: VerbsError {
                        call: "ibv_post_send",
                        errno: libc::EINVAL,
                    },
                })
                .and_then(|()| self.qp.post_chain(chain));
            // The requests the NIC took: all, or those ahead of the refused
            // one. They are outstanding like any chain (a prefix has no
            // signalled request, so the next completion on this queue pair,
            // or its flush, settles it); only the rest failed.
            let (took, refused) = match r {
                Ok(()) => (ops.len(), None),
                Err(e) => (e.posted.min(ops.len()), Some(e.error)),
            };
            if took > 0 {
                self.outstanding
                    .posted(ops[..took].iter().map(|(id, _)| *id));
                self.in_flight += took;
                *budget -= 1;
                posted += 1;
            }
            if let Some(e) = refused {
                not_posted.extend(
                    ops[took..]
                        .iter()
                        .map(|(id, _)| (*id, NotPosted::Refused(e))),
                );
            }
        }
        posted
    }

    /// Applies one completion of this queue pair; pushes the outcome of
    /// every operation it settles and gives their chains' completion-queue
    /// entries back to `budget`.
    pub fn complete(
        &mut self,
        wr_id: u64,
        status: u32,
        vendor_err: u32,
        out: &mut Vec<(u64, Result<(), WrError>)>,
        budget: &mut usize,
    ) -> Result<(), UnknownCompletion> {
        let (chains, before) = (self.outstanding.len(), out.len());
        self.outstanding.complete(wr_id, status, vendor_err, out)?;
        *budget += chains - self.outstanding.len();
        self.in_flight = self.in_flight.saturating_sub(out.len() - before);
        if self.outstanding.broken() {
            self.failed = true;
        }
        Ok(())
    }

    /// Fails everything outstanding or queued (the queue pair is going
    /// away), giving the completion-queue entries back.
    pub fn flush(&mut self, out: &mut Vec<(u64, Result<(), WrError>)>, budget: &mut usize) {
        *budget += self.outstanding.len();
        self.outstanding.flush(out);
        self.in_flight = 0;
        out.extend(
            self.backlog
                .drain(..)
                .map(|(id, _)| (id, Err(WrError::Flushed))),
        );
    }
}

/// The errno a completion status stands for (as libfabric maps them, so
/// callers see one vocabulary).
pub fn status_errno(e: &WrError) -> i32 {
    match e {
        WrError::Flushed => libc::ECANCELED,
        WrError::Status { status, .. } => match *status {
            ibv_wc_status::IBV_WC_REM_ACCESS_ERR => libc::EACCES,
            ibv_wc_status::IBV_WC_RETRY_EXC_ERR => libc::ETIMEDOUT,
            ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => libc::ENOBUFS,
            ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => libc::EINVAL,
            ibv_wc_status::IBV_WC_LOC_PROT_ERR => libc::EFAULT,
            ibv_wc_status::IBV_WC_LOC_LEN_ERR => libc::EMSGSIZE,
            ibv_wc_status::IBV_WC_REM_OP_ERR => libc::EREMOTEIO,
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR => libc::ECANCELED,
            _ => libc::EIO,
        },
    }
}

/// The engine's error for an operation the NIC completed with `e`: the
/// verbs status by name, its code and vendor syndrome, and the matching
/// errno.
pub fn transfer_error(op: OpKind, peer: NetAddr, e: &WrError) -> TransferError {
    let text = match e {
        WrError::Flushed => {
            "verbs: IBV_WC_WR_FLUSH_ERR (not executed: an earlier request on the queue pair failed)"
                .to_string()
        }
        WrError::Status { status, vendor_err } => format!(
            "verbs: {} — {} (status {status}, vendor syndrome {vendor_err:#x})",
            status_ident(*status),
            WrError::status_name(*status)
        ),
    };
    TransferError::FabricCompletion {
        op,
        peer,
        errno: status_errno(e),
        text,
    }
}

/// The `ibv_wc_status` constant's name.
pub fn status_ident(status: u32) -> &'static str {
    match status {
        ibv_wc_status::IBV_WC_SUCCESS => "IBV_WC_SUCCESS",
        ibv_wc_status::IBV_WC_LOC_LEN_ERR => "IBV_WC_LOC_LEN_ERR",
        ibv_wc_status::IBV_WC_LOC_QP_OP_ERR => "IBV_WC_LOC_QP_OP_ERR",
        ibv_wc_status::IBV_WC_LOC_PROT_ERR => "IBV_WC_LOC_PROT_ERR",
        ibv_wc_status::IBV_WC_WR_FLUSH_ERR => "IBV_WC_WR_FLUSH_ERR",
        ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => "IBV_WC_REM_INV_REQ_ERR",
        ibv_wc_status::IBV_WC_REM_ACCESS_ERR => "IBV_WC_REM_ACCESS_ERR",
        ibv_wc_status::IBV_WC_REM_OP_ERR => "IBV_WC_REM_OP_ERR",
        ibv_wc_status::IBV_WC_RETRY_EXC_ERR => "IBV_WC_RETRY_EXC_ERR",
        ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => "IBV_WC_RNR_RETRY_EXC_ERR",
        ibv_wc_status::IBV_WC_LOC_ACCESS_ERR => "IBV_WC_LOC_ACCESS_ERR",
        ibv_wc_status::IBV_WC_BAD_RESP_ERR => "IBV_WC_BAD_RESP_ERR",
        ibv_wc_status::IBV_WC_FATAL_ERR => "IBV_WC_FATAL_ERR",
        ibv_wc_status::IBV_WC_GENERAL_ERR => "IBV_WC_GENERAL_ERR",
        _ => "IBV_WC_(unknown status)",
    }
}

#[cfg(test)]
mod tests {
    use super::super::wr::Sge;
    use super::*;
    use ibverbs_sys::ibv_send_flags;

    const OK: u32 = ibv_wc_status::IBV_WC_SUCCESS;
    const ACCESS: u32 = ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
    const FLUSH: u32 = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;

    /// Records each posted chain's ids and whether only the last was
    /// signalled; refuses posts when told (taking the first `take_first`
    /// requests of a refused chain, as `ibv_post_send` does with the
    /// requests ahead of its `bad_wr`).
    #[derive(Default)]
    struct FakeQp {
        chains: Vec<Vec<u64>>,
        refuse: bool,
        take_first: usize,
    }

    impl PostChain for FakeQp {
        fn post_chain(&mut self, chain: &mut Chain) -> Result<(), PostError> {
            if self.refuse {
                let posted = self.take_first.min(chain.len());
                if posted > 0 {
                    self.chains.push(chain.wr_ids().take(posted).collect());
                }
                return Err(PostError {
                    posted,
                    error: VerbsError {
                        call: "ibv_post_send",
                        errno: libc::ENOMEM,
                    },
                });
            }
            let sig = ibv_send_flags::IBV_SEND_SIGNALED.0;
            for i in 0..chain.len() {
                let last = i + 1 == chain.len();
                assert_eq!(chain.wr(i).unwrap().send_flags & sig != 0, last);
            }
            self.chains.push(chain.wr_ids().collect());
            Ok(())
        }
    }

    fn write(n: u64) -> ChainOp {
        ChainOp::Write {
            local: Sge {
                addr: 0x1000 * n,
                len: 128,
                lkey: 1,
            },
            remote_addr: 0x9000,
            rkey: 2,
            imm: None,
        }
    }

    fn id(n: u64) -> u64 {
        WrTag::Op.id(n)
    }

    #[test]
    fn tags_round_trip_and_foreign_ids_are_refused() {
        for t in [
            WrTag::Op,
            WrTag::Imm,
            WrTag::Msg,
            WrTag::UdRecv,
            WrTag::UdSend,
        ] {
            assert_eq!(WrTag::split(t.id(12345)), Some((t, 12345)));
            assert_eq!(WrTag::split(t.id(u64::MAX)), Some((t, VALUE_MASK)));
        }
        assert_eq!(WrTag::split(0), None);
        assert_eq!(WrTag::split(0xff << 56), None);
    }

    #[test]
    fn ten_operations_go_out_as_chains_of_four_four_two() {
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        let mut s = SendSide::new(FakeQp::default(), 64);
        for n in 0..10 {
            s.push(id(n), write(n));
        }
        let mut budget = 100;
        let mut np = Vec::new();
        assert_eq!(s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np), 3);
        assert!(np.is_empty());
        assert_eq!(budget, 97);
        let lens: Vec<_> = s.qp.chains.iter().map(Vec::len).collect();
        assert_eq!(lens, [4, 4, 2]);
        // One completion per chain settles its requests, in order.
        let mut out = Vec::new();
        s.complete(id(3), OK, 0, &mut out, &mut budget).unwrap();
        assert_eq!(
            out.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            (0..4).map(id).collect::<Vec<_>>()
        );
        // The last chain's completion settles the middle one too.
        out.clear();
        s.complete(id(9), OK, 0, &mut out, &mut budget).unwrap();
        assert_eq!(out.len(), 6);
        assert!(out.iter().all(|(_, r)| r.is_ok()));
        assert_eq!(budget, 100);
        assert!(s.idle());
    }

    #[test]
    fn queue_pair_depth_and_completion_budget_hold_operations_back() {
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        let mut s = SendSide::new(FakeQp::default(), 6);
        for n in 0..12 {
            s.push(id(n), write(n));
        }
        let mut budget = 10;
        let mut np = Vec::new();
        s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np);
        // Depth 6: a chain of 4 and one of 2.
        assert_eq!(s.qp.chains.iter().map(Vec::len).collect::<Vec<_>>(), [4, 2]);
        let mut out = Vec::new();
        s.complete(id(3), OK, 0, &mut out, &mut budget).unwrap();
        s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np);
        assert_eq!(s.qp.chains.len(), 3);
        assert_eq!(s.qp.chains[2].len(), 4);
        // No completion-queue room: nothing more goes out.
        let mut none = 0;
        s.complete(id(5), OK, 0, &mut out, &mut budget).unwrap();
        s.pump(&t, &mut c, &mut none, &mut |_| true, &mut np);
        assert_eq!(s.qp.chains.len(), 3);
        assert!(!s.idle());
    }

    #[test]
    fn skipped_and_refused_operations_are_reported() {
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        let mut s = SendSide::new(FakeQp::default(), 64);
        for n in 0..5 {
            s.push(id(n), write(n));
        }
        let mut budget = 10;
        let mut np = Vec::new();
        s.pump(&t, &mut c, &mut budget, &mut |i| i != id(1), &mut np);
        assert_eq!(np, [(id(1), NotPosted::Skipped)]);
        assert_eq!(s.qp.chains, [vec![id(0), id(2), id(3), id(4)]]);
        s.qp.refuse = true;
        s.push(id(5), write(5));
        np.clear();
        s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np);
        assert!(
            matches!(np.as_slice(), [(i, NotPosted::Refused(e))] if *i == id(5) && e.errno == libc::ENOMEM)
        );
        assert_eq!(budget, 9, "a refused chain takes no completion entry");
    }

    #[test]
    fn a_partly_posted_chain_keeps_what_the_nic_took() {
        // ibv_post_send queues the requests ahead of the refused one: those
        // are the NIC's until a completion settles them, and must neither
        // fail nor give their buffers back at posting.
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        let mut s = SendSide::new(
            FakeQp {
                refuse: true,
                take_first: 2,
                ..FakeQp::default()
            },
            64,
        );
        for n in 0..4 {
            s.push(id(n), write(n));
        }
        let mut budget = 10;
        let mut np = Vec::new();
        assert_eq!(s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np), 1);
        let refused: Vec<u64> = np.iter().map(|(i, _)| *i).collect();
        assert_eq!(refused, [id(2), id(3)]);
        assert!(np
            .iter()
            .all(|(_, w)| matches!(w, NotPosted::Refused(e) if e.errno == libc::ENOMEM)));
        assert_eq!(budget, 9);
        assert!(!s.drained());
        // The next chain's completion settles the unsignalled prefix.
        s.qp.refuse = false;
        s.push(id(4), write(4));
        np.clear();
        s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np);
        assert!(np.is_empty());
        let mut out = Vec::new();
        s.complete(id(4), OK, 0, &mut out, &mut budget).unwrap();
        assert_eq!(out, [(id(0), Ok(())), (id(1), Ok(())), (id(4), Ok(()))]);
        assert_eq!(budget, 10);
        assert!(s.idle());
        // Nothing taken: every request is refused and no entry is used.
        s.qp.refuse = true;
        s.qp.take_first = 0;
        s.push(id(5), write(5));
        np.clear();
        assert_eq!(s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np), 0);
        assert_eq!(np.len(), 1);
        assert_eq!(budget, 10);
        assert!(s.drained());
    }

    #[test]
    fn a_failure_stops_posting_and_flush_settles_the_rest() {
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        let mut s = SendSide::new(FakeQp::default(), 64);
        for n in 0..6 {
            s.push(id(n), write(n));
        }
        let mut budget = 10;
        let mut np = Vec::new();
        s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np);
        let mut out = Vec::new();
        s.complete(id(1), ACCESS, 0x88, &mut out, &mut budget)
            .unwrap();
        assert!(s.failed());
        assert_eq!(
            out[1].1,
            Err(WrError::Status {
                status: ACCESS,
                vendor_err: 0x88
            })
        );
        // New operations wait; they can move to a new connection.
        s.push(id(6), write(6));
        s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np);
        assert_eq!(s.qp.chains.len(), 2);
        assert_eq!(s.take_backlog().len(), 1);
        out.clear();
        s.complete(id(5), FLUSH, 0, &mut out, &mut budget).unwrap();
        assert!(out.iter().all(|(_, r)| *r == Err(WrError::Flushed)));
        assert!(s.drained());
        assert_eq!(budget, 10);
        // Unknown ids (a flushed unsignalled request) are refused.
        assert!(s.complete(id(4), FLUSH, 0, &mut out, &mut budget).is_err());
        // Flush of a live side settles outstanding and backlog.
        let mut s = SendSide::new(FakeQp::default(), 64);
        s.push(id(7), write(7));
        s.pump(&t, &mut c, &mut budget, &mut |_| true, &mut np);
        s.push(id(8), write(8));
        out.clear();
        s.flush(&mut out, &mut budget);
        assert_eq!(
            out,
            [
                (id(7), Err(WrError::Flushed)),
                (id(8), Err(WrError::Flushed))
            ]
        );
        assert_eq!(budget, 10);
        assert!(s.idle());
    }

    #[test]
    fn statuses_become_errors_that_name_them() {
        let peer = NetAddr::new(b"p").unwrap();
        let e = transfer_error(
            OpKind::Write,
            peer,
            &WrError::Status {
                status: ACCESS,
                vendor_err: 0x88,
            },
        );
        match e {
            TransferError::FabricCompletion {
                op, errno, text, ..
            } => {
                assert_eq!((op, errno), (OpKind::Write, libc::EACCES));
                assert!(text.contains("IBV_WC_REM_ACCESS_ERR"), "{text}");
                assert!(text.contains("0x88"), "{text}");
            }
            other => panic!("{other:?}"),
        }
        let e = transfer_error(OpKind::Read, peer, &WrError::Flushed);
        assert!(
            matches!(e, TransferError::FabricCompletion { errno, .. } if errno == libc::ECANCELED)
        );
        assert_eq!(
            status_errno(&WrError::Status {
                status: ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
                vendor_err: 0
            }),
            libc::ETIMEDOUT
        );
        assert_eq!(status_ident(999), "IBV_WC_(unknown status)");
    }
}
