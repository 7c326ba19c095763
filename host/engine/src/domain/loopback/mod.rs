//! The loopback domain: an in-process NIC with real RDMA semantics, the
//! embedded default of the engine (no system packages needed).
//!
//! Each engine is a separate host with its own addresses
//! (`loopback/<host>/<nic>`); a process-wide registry (module `fabric`) lets
//! engines find each other. Regions get random 64-bit keys per NIC, and
//! every access is checked (key, bounds, right, atomic alignment) before
//! anything moves. Options ([`LoopbackConfig`]): unordered delivery
//! (seeded shuffle within a window, like EFA's SRD), injected latency and
//! bandwidth per NIC, and fault injection (a failed NIC answers with
//! errors). A send with no posted receive waits up to
//! [`LoopbackConfig::recv_wait`], then fails with
//! [`TransferError::NoReceiveBuffer`].

mod endpoint;
mod fabric;

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

use crossbeam_queue::SegQueue;
use rolex_core::wire::NetAddr;

pub use endpoint::LoopbackEndpoint;
use fabric::NicState;

use crate::counters::CounterSnapshot;
use crate::domain::{AnyEndpoint, Domain, Incoming, RecvBuffer};
use crate::error::{ConfigError, TransferError};
use crate::region::Region;

/// Unordered delivery: operations that are due run and complete in a
/// seeded random order, within windows of `window` operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unordered {
    /// Seed of the shuffle (each endpoint derives its own stream).
    pub seed: u64,
    /// Operations shuffled together (at least 1).
    pub window: usize,
}

/// Options of the loopback NIC.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoopbackConfig {
    /// Injected round-trip latency of every operation.
    pub latency: Duration,
    /// Injected link bandwidth of each NIC, in Gbit/s (`None`: memory
    /// speed).
    pub bandwidth_gbps: Option<f64>,
    /// SRD-like unordered delivery (`None`: in posting order, RC-like).
    pub unordered: Option<Unordered>,
    /// How long a send waits for the peer to post a receive buffer.
    pub recv_wait: Duration,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            latency: Duration::ZERO,
            bandwidth_gbps: None,
            unordered: None,
            recv_wait: Duration::from_secs(1),
        }
    }
}

impl LoopbackConfig {
    /// Checks the options.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(u) = self.unordered {
            if u.window == 0 {
                return Err(ConfigError::ZeroWindow);
            }
        }
        if let Some(b) = self.bandwidth_gbps {
            if !(b.is_finite() && b > 0.0) {
                return Err(ConfigError::Bandwidth);
            }
        }
        Ok(())
    }
}

/// One loopback NIC of an engine.
pub struct LoopbackDomain {
    nic: Arc<NicState>,
    cfg: LoopbackConfig,
    endpoints: AtomicU64,
}

/// Opens `nics` loopback NICs for one engine (one host): they share the
/// engine's receive pool and are on the fabric when this returns.
pub fn open_host(
    cfg: &LoopbackConfig,
    nics: usize,
) -> Result<Vec<Arc<LoopbackDomain>>, TransferError> {
    static HOSTS: AtomicU64 = AtomicU64::new(1);
    cfg.validate().map_err(TransferError::Config)?;
    let host = HOSTS.fetch_add(1, Relaxed);
    let recvq = Arc::new(SegQueue::new());
    (0..nics)
        .map(|i| {
            let name = format!("loopback/{host}/{i}");
            let addr = NetAddr::new(name.as_bytes()).map_err(|error| TransferError::Malformed {
                what: "loopback address",
                error,
            })?;
            Ok(Arc::new(LoopbackDomain {
                nic: NicState::attach(addr, recvq.clone()),
                cfg: *cfg,
                endpoints: AtomicU64::new(0),
            }))
        })
        .collect()
}

impl Domain for LoopbackDomain {
    fn address(&self) -> NetAddr {
        self.nic.addr
    }

    fn register(&self, region: &Arc<Region>) -> Result<u64, TransferError> {
        // Random keys: a peer cannot guess another region's key.
        loop {
            let rkey: u64 = rand::random();
            if rkey != 0 && self.nic.insert_region(rkey, region.clone()) {
                return Ok(rkey);
            }
        }
    }

    fn deregister(&self, rkey: u64) {
        self.nic.remove_region(rkey);
    }

    fn resolve(&self, peer: &NetAddr) -> Result<(), TransferError> {
        match NicState::lookup(peer) {
            Some(n) if n.alive() => Ok(()),
            _ => Err(TransferError::UnknownPeer { peer: *peer }),
        }
    }

    fn open_endpoint(&self) -> Result<AnyEndpoint, TransferError> {
        let salt = self.endpoints.fetch_add(1, Relaxed);
        Ok(AnyEndpoint::Loopback(LoopbackEndpoint::new(
            self.nic.clone(),
            self.cfg,
            salt,
        )))
    }

    fn post_recv(&self, buf: RecvBuffer) {
        if self.nic.alive() {
            self.nic.recvq.push(buf);
        }
    }

    fn poll_incoming(&self, out: &mut Vec<Incoming>) -> usize {
        let mut n = 0;
        while let Some(e) = self.nic.pop_incoming() {
            out.push(e);
            n += 1;
        }
        n
    }

    fn set_waker(&self, waker: Thread) {
        self.nic.set_waker(waker);
    }

    fn ordered(&self) -> bool {
        self.cfg.unordered.is_none()
    }

    fn counters(&self) -> CounterSnapshot {
        self.nic.counters.snapshot()
    }

    fn set_failed(&self, failed: bool) -> bool {
        self.nic.set_failed(failed);
        true
    }

    fn shutdown(&self) {
        self.nic.detach();
    }
}

#[cfg(test)]
mod tests {
    //! The Domain / Endpoint seam driven directly, without an engine: what a
    //! new backend must do.
    use super::*;
    use crate::domain::{Completion, Endpoint, Local, Progress, Remote, WorkOp, WorkRequest};
    use rolex_core::wire::Access;

    fn region(len: u64) -> Arc<Region> {
        Region::alloc(len, Access::all(), 0, 0).unwrap()
    }

    #[test]
    fn post_poll_and_incoming() {
        let a = open_host(&LoopbackConfig::default(), 1).unwrap();
        let b = open_host(&LoopbackConfig::default(), 2).unwrap();
        let (src, dst) = (region(64), region(64));
        src.enter().unwrap().write(0, b"abcdefgh");
        let rkey = b[1].register(&dst).unwrap();
        let mut ep = a[0].open_endpoint().unwrap();
        let remote = Remote {
            peer: b[1].address(),
            rkey,
            addr: dst.addr() + 8,
        };
        let local = Local {
            region: src.clone(),
            offset: 0,
        };
        let mut batch = vec![
            WorkRequest {
                wr_id: 1,
                op: WorkOp::Write {
                    local: Some(local),
                    remote,
                    len: 8,
                    imm: Some(5),
                },
            },
            WorkRequest {
                wr_id: 2,
                op: WorkOp::Faa {
                    remote: Remote {
                        addr: dst.addr() + 16,
                        ..remote
                    },
                    add: 3,
                },
            },
        ];
        ep.post(&mut batch);
        assert!(batch.is_empty());
        let mut out = Vec::new();
        assert_eq!(ep.poll(&mut out), Progress::Idle);
        assert_eq!(
            out,
            vec![
                Completion {
                    wr_id: 1,
                    result: Ok(0)
                },
                Completion {
                    wr_id: 2,
                    result: Ok(0)
                }
            ]
        );
        let mut inc = Vec::new();
        // The immediate arrives on the NIC it was aimed at.
        assert_eq!(b[0].poll_incoming(&mut inc), 0);
        assert_eq!(b[1].poll_incoming(&mut inc), 1);
        assert!(matches!(inc[0], Incoming::Imm(5)));
        let mut word = [0; 16];
        dst.enter().unwrap().read(8, &mut word);
        assert_eq!(&word[..8], b"abcdefgh");
        assert_eq!(u64::from_ne_bytes(word[8..].try_into().unwrap()), 3);
        assert_eq!(a[0].counters().doorbells, 1);
        assert_eq!(b[1].counters().imm_arrivals, 1);
        for d in a.iter().chain(&b) {
            d.shutdown();
        }
        assert!(a[0].resolve(&b[1].address()).is_err());
    }

    #[test]
    fn latency_defers_and_flush_fails_outstanding() {
        let cfg = LoopbackConfig {
            latency: Duration::from_secs(3600),
            ..LoopbackConfig::default()
        };
        let a = open_host(&cfg, 1).unwrap();
        let b = open_host(&LoopbackConfig::default(), 1).unwrap();
        let dst = region(8);
        let rkey = b[0].register(&dst).unwrap();
        let mut ep = a[0].open_endpoint().unwrap();
        let remote = Remote {
            peer: b[0].address(),
            rkey,
            addr: dst.addr(),
        };
        ep.post(&mut vec![WorkRequest {
            wr_id: 7,
            op: WorkOp::Faa { remote, add: 1 },
        }]);
        let mut out = Vec::new();
        assert!(matches!(ep.poll(&mut out), Progress::WaitUntil(_)));
        assert!(out.is_empty());
        ep.flush(&mut out);
        assert_eq!(
            out,
            vec![Completion {
                wr_id: 7,
                result: Err(TransferError::EngineShutDown)
            }]
        );
        assert_eq!(
            dst.enter()
                .unwrap()
                .word(0)
                .unwrap()
                .load(std::sync::atomic::Ordering::SeqCst),
            0
        );
        for d in a.iter().chain(&b) {
            d.shutdown();
        }
    }
}
