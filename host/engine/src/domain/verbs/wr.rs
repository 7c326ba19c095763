//! Work-request building for the verbs domain: [`WrTemplates`] pre-fill
//! per peer the fields every request of an opcode shares, and a [`Chain`]
//! links up to [`MAX_CHAIN`] `ibv_send_wr`s through their `next` pointers so
//! one `ibv_post_send` (one doorbell) posts them all.
//!
//! Invariants a built chain keeps, tested here without a device:
//! - `wrs[i].next` points at `wrs[i + 1]`, the last one's is null, and each
//!   request's `sg_list` points at its own scatter-gather entry (none for a
//!   zero-byte write);
//! - only the last request is signalled: RC completes a queue pair's
//!   requests in order, so its completion stands for the whole chain;
//! - writes and sends of at most the template's inline limit are inline
//!   (the NIC copies the bytes at post time; no local key is needed);
//! - atomics target 8-byte-aligned words and land their old value in an
//!   8-byte local buffer; immediates go out in network byte order.
//!
//! The chain's pointers only point into its own boxed arrays, which never
//! move while the chain lives; rebuilding rewrites all of them.

use std::fmt;
use std::ptr;

use ibverbs_sys::{ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode};

/// Most requests linked behind one doorbell.
pub const MAX_CHAIN: usize = 4;

/// A local buffer of a request: address, length, local key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// Local key of its registration.
    pub lkey: u32,
}

/// One operation of a chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainOp {
    /// RDMA write (with an immediate when `imm` is set).
    Write {
        /// Source; `len` 0 for a zero-byte write.
        local: Sge,
        /// Target address.
        remote_addr: u64,
        /// Target key.
        rkey: u32,
        /// Immediate for the target.
        imm: Option<u32>,
    },
    /// RDMA read.
    Read {
        /// Destination.
        local: Sge,
        /// Source address.
        remote_addr: u64,
        /// Source key.
        rkey: u32,
    },
    /// 8-byte compare-and-swap.
    Cas {
        /// Where the old value lands (8 bytes).
        result: Sge,
        /// The word.
        remote_addr: u64,
        /// Its key.
        rkey: u32,
        /// Value expected.
        expected: u64,
        /// Value stored on a match.
        new: u64,
    },
    /// 8-byte fetch-and-add.
    Faa {
        /// Where the old value lands (8 bytes).
        result: Sge,
        /// The word.
        remote_addr: u64,
        /// Its key.
        rkey: u32,
        /// Addend.
        add: u64,
    },
    /// Two-sided send.
    Send {
        /// The message.
        local: Sge,
    },
}

/// Why a chain could not be built (nothing was changed in the NIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChainError {
    /// No operations.
    Empty,
    /// More than [`MAX_CHAIN`] operations.
    TooLong {
        /// How many were given.
        len: usize,
    },
    /// An atomic on a word that is not 8-byte aligned.
    Misaligned {
        /// Index in the chain.
        index: usize,
    },
    /// An atomic whose result buffer is not 8 bytes.
    AtomicResult {
        /// Index in the chain.
        index: usize,
    },
    /// A read or send of zero bytes.
    ZeroLength {
        /// Index in the chain.
        index: usize,
    },
}

impl fmt::Display for ChainError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChainError::Empty => f.write_str("empty work-request chain"),
            ChainError::TooLong { len } => {
                write!(f, "{len} work requests in a chain, at most {MAX_CHAIN}")
            }
            ChainError::Misaligned { index } => {
                write!(f, "atomic #{index} targets a word not 8-byte aligned")
            }
            ChainError::AtomicResult { index } => {
                write!(f, "atomic #{index} has a result buffer that is not 8 bytes")
            }
            ChainError::ZeroLength { index } => write!(f, "request #{index} moves zero bytes"),
        }
    }
}

impl std::error::Error for ChainError {}

/// Per-peer pre-filled requests, one per opcode: building a request copies
/// one and sets only what varies (id, addresses, lengths, keys).
#[derive(Clone)]
pub struct WrTemplates {
    write: ibv_send_wr,
    write_imm: ibv_send_wr,
    read: ibv_send_wr,
    cas: ibv_send_wr,
    faa: ibv_send_wr,
    send: ibv_send_wr,
    max_inline: u32,
}

// SAFETY: a template's pointer fields (`next`, `sg_list`, the UD address
// handle, the bind-info pointers) are all null: `fill` sets the list
// pointers only in the `Chain` it builds. A value of plain integers and null
// pointers may move between threads.
unsafe impl Send for WrTemplates {}

impl fmt::Debug for WrTemplates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WrTemplates")
            .field("max_inline", &self.max_inline)
            .finish_non_exhaustive()
    }
}

fn template(opcode: ibv_wr_opcode::Type) -> ibv_send_wr {
    ibv_send_wr {
        opcode,
        num_sge: 1,
        ..ibv_send_wr::default()
    }
}

impl WrTemplates {
    /// Templates for a peer whose queue pair takes up to `max_inline`
    /// inline bytes (the `max_inline_data` it was created with).
    pub fn new(max_inline: u32) -> WrTemplates {
        WrTemplates {
            write: template(ibv_wr_opcode::IBV_WR_RDMA_WRITE),
            write_imm: template(ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM),
            read: template(ibv_wr_opcode::IBV_WR_RDMA_READ),
            cas: template(ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP),
            faa: template(ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD),
            send: template(ibv_wr_opcode::IBV_WR_SEND),
            max_inline,
        }
    }

    /// The inline limit.
    pub fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// One request (unlinked, unsignalled) and its scatter-gather entry.
    fn fill(
        &self,
        index: usize,
        wr_id: u64,
        op: &ChainOp,
    ) -> Result<(ibv_send_wr, Sge), ChainError> {
        let inline = |len: u32| {
            if len > 0 && len <= self.max_inline {
                ibv_send_flags::IBV_SEND_INLINE.0
            } else {
                0
            }
        };
        let atomic = |result: &Sge, remote_addr: u64| {
            if remote_addr % 8 != 0 {
                Err(ChainError::Misaligned { index })
            } else if result.len != 8 {
                Err(ChainError::AtomicResult { index })
            } else {
                Ok(())
            }
        };
        let (mut wr, sge) = match *op {
            ChainOp::Write {
                local,
                remote_addr,
                rkey,
                imm,
            } => {
                let mut wr = match imm {
                    Some(imm) => {
                        let mut wr = self.write_imm;
                        wr.__bindgen_anon_1.imm_data = imm.to_be();
                        wr
                    }
                    None => self.write,
                };
                wr.wr.rdma.remote_addr = remote_addr;
                wr.wr.rdma.rkey = rkey;
                wr.send_flags = inline(local.len);
                if local.len == 0 {
                    wr.num_sge = 0;
                }
                (wr, local)
            }
            ChainOp::Read {
                local,
                remote_addr,
                rkey,
            } => {
                if local.len == 0 {
                    return Err(ChainError::ZeroLength { index });
                }
                let mut wr = self.read;
                wr.wr.rdma.remote_addr = remote_addr;
                wr.wr.rdma.rkey = rkey;
                (wr, local)
            }
            ChainOp::Cas {
                result,
                remote_addr,
                rkey,
                expected,
                new,
            } => {
                atomic(&result, remote_addr)?;
                let mut wr = self.cas;
                wr.wr.atomic.remote_addr = remote_addr;
                wr.wr.atomic.rkey = rkey;
                wr.wr.atomic.compare_add = expected;
                wr.wr.atomic.swap = new;
                (wr, result)
            }
            ChainOp::Faa {
                result,
                remote_addr,
                rkey,
                add,
            } => {
                atomic(&result, remote_addr)?;
                let mut wr = self.faa;
                wr.wr.atomic.remote_addr = remote_addr;
                wr.wr.atomic.rkey = rkey;
                wr.wr.atomic.compare_add = add;
                (wr, result)
            }
            ChainOp::Send { local } => {
                if local.len == 0 {
                    return Err(ChainError::ZeroLength { index });
                }
                let mut wr = self.send;
                wr.send_flags = inline(local.len);
                (wr, local)
            }
        };
        wr.wr_id = wr_id;
        Ok((wr, sge))
    }
}

/// Up to [`MAX_CHAIN`] linked requests, ready for one `ibv_post_send`.
pub struct Chain {
    wrs: Box<[ibv_send_wr; MAX_CHAIN]>,
    sges: Box<[ibv_sge; MAX_CHAIN]>,
    len: usize,
}

// SAFETY: the raw pointers inside `wrs` point only into `wrs` and `sges`,
// boxes this value owns; moving the value to another thread moves their
// owner with them, and nothing else holds them.
unsafe impl Send for Chain {}

impl Default for Chain {
    fn default() -> Self {
        Chain::new()
    }
}

impl fmt::Debug for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Chain").field("len", &self.len).finish()
    }
}

impl Chain {
    /// An empty chain.
    pub fn new() -> Chain {
        Chain {
            wrs: Box::new([ibv_send_wr::default(); MAX_CHAIN]),
            sges: Box::new([ibv_sge::default(); MAX_CHAIN]),
            len: 0,
        }
    }

    /// Builds the chain from `(wr_id, op)` pairs with a peer's templates;
    /// on error the chain is left empty.
    pub fn build(&mut self, t: &WrTemplates, ops: &[(u64, ChainOp)]) -> Result<(), ChainError> {
        self.len = 0;
        if ops.is_empty() {
            return Err(ChainError::Empty);
        }
        if ops.len() > MAX_CHAIN {
            return Err(ChainError::TooLong { len: ops.len() });
        }
        for (i, (wr_id, op)) in ops.iter().enumerate() {
            let (wr, sge) = t.fill(i, *wr_id, op)?;
            self.wrs[i] = wr;
            self.sges[i] = ibv_sge {
                addr: sge.addr,
                length: sge.len,
                lkey: sge.lkey,
            };
        }
        let n = ops.len();
        let wrs = self.wrs.as_mut_ptr();
        let sges = self.sges.as_mut_ptr();
        for i in 0..n {
            let wr = &mut self.wrs[i];
            wr.sg_list = if wr.num_sge == 0 {
                ptr::null_mut()
            } else {
                sges.wrapping_add(i)
            };
            wr.next = if i + 1 < n {
                wrs.wrapping_add(i + 1)
            } else {
                ptr::null_mut()
            };
            if i + 1 == n {
                wr.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
        }
        self.len = n;
        Ok(())
    }

    /// Requests in the chain.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the chain holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `i`-th request.
    pub fn wr(&self, i: usize) -> Option<&ibv_send_wr> {
        self.wrs[..self.len].get(i)
    }

    /// The `i`-th scatter-gather entry.
    pub fn sge(&self, i: usize) -> Option<&ibv_sge> {
        self.sges[..self.len].get(i)
    }

    /// The first request, for `ibv_post_send`; null when empty. Valid while
    /// `self` is neither moved out of its boxes nor rebuilt.
    pub fn head(&mut self) -> *mut ibv_send_wr {
        if self.len == 0 {
            ptr::null_mut()
        } else {
            self.wrs.as_mut_ptr()
        }
    }

    /// The position in the chain of the request at `wr` (how many requests
    /// precede it), if `wr` points at one of them: what `ibv_post_send`'s
    /// `bad_wr` says about how much of the chain it took.
    pub fn index_of(&self, wr: *const ibv_send_wr) -> Option<usize> {
        self.wrs[..self.len].iter().position(|w| ptr::eq(w, wr))
    }

    /// The ids of the chain's requests, in order.
    pub fn wr_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.wrs[..self.len].iter().map(|w| w.wr_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIG: u32 = ibv_send_flags::IBV_SEND_SIGNALED.0;
    const INL: u32 = ibv_send_flags::IBV_SEND_INLINE.0;

    fn sge(addr: u64, len: u32) -> Sge {
        Sge {
            addr,
            len,
            lkey: 0xaa,
        }
    }

    fn four() -> Vec<(u64, ChainOp)> {
        vec![
            (
                1,
                ChainOp::Write {
                    local: sge(0x1000, 4096),
                    remote_addr: 0x9000,
                    rkey: 7,
                    imm: None,
                },
            ),
            (
                2,
                ChainOp::Write {
                    local: sge(0x2000, 16),
                    remote_addr: 0xa000,
                    rkey: 8,
                    imm: Some(0x0102_0304),
                },
            ),
            (
                3,
                ChainOp::Read {
                    local: sge(0x3000, 64),
                    remote_addr: 0xb000,
                    rkey: 9,
                },
            ),
            (
                4,
                ChainOp::Cas {
                    result: sge(0x4000, 8),
                    remote_addr: 0xc008,
                    rkey: 10,
                    expected: 5,
                    new: 6,
                },
            ),
        ]
    }

    #[test]
    fn four_requests_link_through_next_with_their_own_sges() {
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        c.build(&t, &four()).unwrap();
        assert_eq!(c.len(), 4);
        let head = c.head();
        let base = head as *const ibv_send_wr;
        for i in 0..4 {
            let wr = c.wr(i).unwrap();
            let expect_next = if i < 3 {
                base.wrapping_add(i + 1)
            } else {
                ptr::null()
            };
            assert_eq!(wr.next as *const _, expect_next, "next of #{i}");
            assert_eq!(wr.sg_list as *const _, c.sge(i).unwrap() as *const _);
            assert_eq!(wr.num_sge, 1);
            assert_eq!(wr.wr_id, i as u64 + 1);
            // Only the last is signalled.
            assert_eq!(wr.send_flags & SIG != 0, i == 3, "signal of #{i}");
        }
        assert_eq!(c.wr_ids().collect::<Vec<_>>(), [1, 2, 3, 4]);
        // `bad_wr` back to a position: the requests ahead of it were taken.
        assert_eq!(c.index_of(base.wrapping_add(2)), Some(2));
        assert_eq!(c.index_of(base), Some(0));
        assert_eq!(c.index_of(ptr::null()), None);
        assert_eq!(c.index_of(base.wrapping_add(4)), None, "past the chain");
        let s = c.sge(2).unwrap();
        assert_eq!((s.addr, s.length, s.lkey), (0x3000, 64, 0xaa));
    }

    #[test]
    fn opcodes_flags_and_remote_fields_per_operation() {
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        c.build(&t, &four()).unwrap();
        let w = c.wr(0).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        assert_eq!(w.send_flags & INL, 0, "4 KiB is above the inline limit");
        // SAFETY: reading the union member the builder wrote for a write.
        let (ra, rk) = unsafe { (w.wr.rdma.remote_addr, w.wr.rdma.rkey) };
        assert_eq!((ra, rk), (0x9000, 7));
        let w = c.wr(1).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        assert_ne!(w.send_flags & INL, 0, "16 bytes go inline");
        // SAFETY: the builder set imm_data for a write with immediate.
        let imm = unsafe { w.__bindgen_anon_1.imm_data };
        assert_eq!(u32::from_be(imm), 0x0102_0304);
        let w = c.wr(2).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_RDMA_READ);
        assert_eq!(w.send_flags & INL, 0, "reads are never inline");
        // SAFETY: the rdma member, written for a read.
        assert_eq!(
            unsafe { (w.wr.rdma.remote_addr, w.wr.rdma.rkey) },
            (0xb000, 9)
        );
        let w = c.wr(3).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP);
        // SAFETY: the atomic member, written for a CAS.
        let a = unsafe { w.wr.atomic };
        assert_eq!(
            (a.remote_addr, a.rkey, a.compare_add, a.swap),
            (0xc008, 10, 5, 6)
        );
    }

    #[test]
    fn faa_send_and_zero_byte_write() {
        let t = WrTemplates::new(32);
        let mut c = Chain::new();
        c.build(
            &t,
            &[
                (
                    7,
                    ChainOp::Faa {
                        result: sge(0x10, 8),
                        remote_addr: 0x80,
                        rkey: 3,
                        add: 11,
                    },
                ),
                (
                    8,
                    ChainOp::Send {
                        local: sge(0x20, 32),
                    },
                ),
                (
                    9,
                    ChainOp::Send {
                        local: sge(0x40, 33),
                    },
                ),
                (
                    10,
                    ChainOp::Write {
                        local: sge(0, 0),
                        remote_addr: 0x100,
                        rkey: 4,
                        imm: Some(1),
                    },
                ),
            ],
        )
        .unwrap();
        let w = c.wr(0).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD);
        // SAFETY: the atomic member, written for a FAA.
        assert_eq!(
            unsafe { (w.wr.atomic.compare_add, w.wr.atomic.rkey) },
            (11, 3)
        );
        let w = c.wr(1).unwrap();
        assert_eq!(w.opcode, ibv_wr_opcode::IBV_WR_SEND);
        assert_ne!(
            w.send_flags & INL,
            0,
            "32 bytes at the 32-byte limit go inline"
        );
        assert_eq!(c.wr(2).unwrap().send_flags & INL, 0, "33 bytes do not");
        let w = c.wr(3).unwrap();
        assert_eq!((w.num_sge, w.sg_list), (0, ptr::null_mut()));
        assert_eq!(w.send_flags, SIG, "zero bytes: signalled, not inline");
    }

    #[test]
    fn single_request_is_signalled_and_unlinked() {
        let t = WrTemplates::new(0);
        let mut c = Chain::new();
        c.build(&t, &four()[..1]).unwrap();
        let w = c.wr(0).unwrap();
        assert!(w.next.is_null());
        assert_eq!(w.send_flags, SIG);
        assert!(c.wr(1).is_none());
    }

    #[test]
    fn bad_chains_are_refused_and_leave_it_empty() {
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        assert_eq!(c.build(&t, &[]), Err(ChainError::Empty));
        let mut five = four();
        five.push(five[0]);
        assert_eq!(c.build(&t, &five), Err(ChainError::TooLong { len: 5 }));
        let mut ops = four();
        ops[3].1 = ChainOp::Cas {
            result: sge(0, 8),
            remote_addr: 0xc004,
            rkey: 1,
            expected: 0,
            new: 0,
        };
        assert_eq!(c.build(&t, &ops), Err(ChainError::Misaligned { index: 3 }));
        ops[3].1 = ChainOp::Faa {
            result: sge(0, 4),
            remote_addr: 0xc000,
            rkey: 1,
            add: 0,
        };
        assert_eq!(
            c.build(&t, &ops),
            Err(ChainError::AtomicResult { index: 3 })
        );
        ops[3].1 = ChainOp::Read {
            local: sge(0, 0),
            remote_addr: 0,
            rkey: 1,
        };
        assert_eq!(c.build(&t, &ops), Err(ChainError::ZeroLength { index: 3 }));
        assert!(c.is_empty());
        assert!(c.head().is_null());
        assert!(ChainError::TooLong { len: 5 }
            .to_string()
            .contains("at most 4"));
    }

    #[test]
    fn rebuilding_relinks_and_survives_a_move() {
        let t = WrTemplates::new(64);
        let mut c = Chain::new();
        c.build(&t, &four()).unwrap();
        c.build(&t, &four()[..2]).unwrap();
        let moved = std::thread::spawn(move || c).join().unwrap();
        let base = moved.wr(0).unwrap() as *const ibv_send_wr;
        assert_eq!(moved.wr(0).unwrap().next as *const _, base.wrapping_add(1));
        assert!(moved.wr(1).unwrap().next.is_null());
        assert_ne!(moved.wr(1).unwrap().send_flags & SIG, 0);
        assert_eq!(moved.wr(0).unwrap().send_flags & SIG, 0);
    }
}
