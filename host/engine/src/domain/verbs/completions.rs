//! Completion bookkeeping of one RC queue pair, device-free: chains are
//! posted with only their last request signalled ([`super::wr::Chain`]), so
//! one work completion stands for a whole chain, and this module turns it
//! back into one outcome per request.
//!
//! RC executes a queue pair's requests in order, which gives the rules:
//! - the signalled (last) request of a chain succeeded → every request of
//!   the chain succeeded, and so did every chain posted before it;
//! - a request failed → the requests of its chain before it succeeded, it
//!   carries the error, the ones after it are flushed; the queue pair is in
//!   the error state from then on, so every chain posted before the failing
//!   one whose completion never came, and every later one, is flushed.
//!
//! A completion naming no outstanding request is reported, never trusted.

use std::collections::VecDeque;
use std::fmt;

use ibverbs_sys::ibv_wc_status;

use super::wr::MAX_CHAIN;

/// Why a request did not take effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrError {
    /// The NIC reported this `ibv_wc_status` (and vendor code) for it.
    Status {
        /// The status code.
        status: u32,
        /// The vendor's code.
        vendor_err: u32,
    },
    /// It never executed: an earlier request on the queue pair failed (or
    /// the queue pair was flushed at shutdown).
    Flushed,
}

impl WrError {
    /// The status's name as libibverbs spells it.
    pub fn status_name(status: u32) -> &'static str {
        match status {
            ibv_wc_status::IBV_WC_SUCCESS => "success",
            ibv_wc_status::IBV_WC_LOC_LEN_ERR => "local length error",
            ibv_wc_status::IBV_WC_LOC_QP_OP_ERR => "local QP operation error",
            ibv_wc_status::IBV_WC_LOC_PROT_ERR => "local protection error",
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR => "flushed",
            ibv_wc_status::IBV_WC_REM_INV_REQ_ERR => "remote invalid request",
            ibv_wc_status::IBV_WC_REM_ACCESS_ERR => "remote access error",
            ibv_wc_status::IBV_WC_REM_OP_ERR => "remote operation error",
            ibv_wc_status::IBV_WC_RETRY_EXC_ERR => "transport retries exceeded",
            ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR => "RNR retries exceeded",
            _ => "other error",
        }
    }
}

impl fmt::Display for WrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WrError::Status { status, vendor_err } => write!(
                f,
                "{} (status {status}, vendor {vendor_err:#x})",
                WrError::status_name(*status)
            ),
            WrError::Flushed => f.write_str("flushed after an earlier failure"),
        }
    }
}

impl std::error::Error for WrError {}

/// A completion that matches no outstanding request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownCompletion {
    /// Its id.
    pub wr_id: u64,
}

/// The chains outstanding on one RC queue pair, in posting order.
#[derive(Debug, Default)]
pub struct Outstanding {
    chains: VecDeque<([u64; MAX_CHAIN], usize)>,
    broken: bool,
}

impl Outstanding {
    /// Nothing outstanding.
    pub fn new() -> Outstanding {
        Outstanding::default()
    }

    /// Records a posted chain (its requests' ids, in order; at most
    /// [`MAX_CHAIN`], the rest are ignored as [`super::wr::Chain`] never
    /// holds more).
    pub fn posted(&mut self, ids: impl IntoIterator<Item = u64>) {
        let mut a = [0; MAX_CHAIN];
        let mut n = 0;
        for id in ids.into_iter().take(MAX_CHAIN) {
            a[n] = id;
            n += 1;
        }
        if n > 0 {
            self.chains.push_back((a, n));
        }
    }

    /// Chains outstanding.
    pub fn len(&self) -> usize {
        self.chains.len()
    }

    /// Whether nothing is outstanding.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// Whether a request failed (the queue pair is in the error state).
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Applies one work completion (`status` is its `ibv_wc_status`),
    /// pushing the outcome of every request it settles onto `out`.
    pub fn complete(
        &mut self,
        wr_id: u64,
        status: u32,
        vendor_err: u32,
        out: &mut Vec<(u64, Result<(), WrError>)>,
    ) -> Result<(), UnknownCompletion> {
        let found =
            self.chains.iter().enumerate().find_map(|(c, (ids, n))| {
                ids[..*n].iter().position(|i| *i == wr_id).map(|i| (c, i))
            });
        let Some((c, at)) = found else {
            return Err(UnknownCompletion { wr_id });
        };
        let ok = status == ibv_wc_status::IBV_WC_SUCCESS && !self.broken;
        // Chains before this one: in order, so they ran if this one did.
        for _ in 0..c {
            if let Some((ids, n)) = self.chains.pop_front() {
                for id in &ids[..n] {
                    out.push((*id, if ok { Ok(()) } else { Err(WrError::Flushed) }));
                }
            }
        }
        if let Some((ids, n)) = self.chains.pop_front() {
            for (i, id) in ids[..n].iter().enumerate() {
                let r = if ok || i < at {
                    // Earlier requests of the chain ran before the failure.
                    if self.broken {
                        Err(WrError::Flushed)
                    } else {
                        Ok(())
                    }
                } else if i == at {
                    if status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR || self.broken {
                        Err(WrError::Flushed)
                    } else {
                        Err(WrError::Status { status, vendor_err })
                    }
                } else {
                    Err(WrError::Flushed)
                };
                out.push((*id, r));
            }
        }
        if !ok {
            self.broken = true;
        }
        Ok(())
    }

    /// Flushes everything outstanding (shutdown, or after the queue pair
    /// broke and its remaining completions will not come).
    pub fn flush(&mut self, out: &mut Vec<(u64, Result<(), WrError>)>) {
        for (ids, n) in self.chains.drain(..) {
            out.extend(ids[..n].iter().map(|id| (*id, Err(WrError::Flushed))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: u32 = ibv_wc_status::IBV_WC_SUCCESS;
    const ACCESS: u32 = ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
    const FLUSH: u32 = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;

    fn status(s: u32) -> Result<(), WrError> {
        Err(WrError::Status {
            status: s,
            vendor_err: 7,
        })
    }

    #[test]
    fn the_last_request_stands_for_its_chain() {
        let mut o = Outstanding::new();
        o.posted([1, 2, 3, 4]);
        o.posted([5]);
        let mut out = Vec::new();
        o.complete(4, OK, 0, &mut out).unwrap();
        assert_eq!(out, [(1, Ok(())), (2, Ok(())), (3, Ok(())), (4, Ok(()))]);
        assert_eq!(o.len(), 1);
        out.clear();
        o.complete(5, OK, 0, &mut out).unwrap();
        assert_eq!(out, [(5, Ok(()))]);
        assert!(o.is_empty() && !o.broken());
    }

    #[test]
    fn a_later_chain_completing_settles_earlier_ones() {
        let mut o = Outstanding::new();
        o.posted([1, 2]);
        o.posted([3]);
        let mut out = Vec::new();
        o.complete(3, OK, 0, &mut out).unwrap();
        assert_eq!(out, [(1, Ok(())), (2, Ok(())), (3, Ok(()))]);
    }

    #[test]
    fn a_failure_splits_its_chain_and_breaks_the_qp() {
        let mut o = Outstanding::new();
        o.posted([1, 2, 3, 4]);
        o.posted([5, 6]);
        let mut out = Vec::new();
        o.complete(2, ACCESS, 7, &mut out).unwrap();
        assert_eq!(
            out,
            [
                (1, Ok(())),
                (2, status(ACCESS)),
                (3, Err(WrError::Flushed)),
                (4, Err(WrError::Flushed))
            ]
        );
        assert!(o.broken());
        out.clear();
        o.complete(6, FLUSH, 0, &mut out).unwrap();
        assert_eq!(
            out,
            [(5, Err(WrError::Flushed)), (6, Err(WrError::Flushed))]
        );
    }

    #[test]
    fn unknown_completions_are_reported_and_flush_drains() {
        let mut o = Outstanding::new();
        o.posted([1, 2]);
        o.posted(std::iter::empty());
        let mut out = Vec::new();
        assert_eq!(
            o.complete(9, OK, 0, &mut out),
            Err(UnknownCompletion { wr_id: 9 })
        );
        assert!(out.is_empty());
        o.flush(&mut out);
        assert_eq!(
            out,
            [(1, Err(WrError::Flushed)), (2, Err(WrError::Flushed))]
        );
        assert!(o.is_empty());
        assert!(status(ACCESS)
            .unwrap_err()
            .to_string()
            .contains("remote access"));
    }
}
