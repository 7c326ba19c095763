//! The loopback domain: an in-process NIC with real RDMA semantics, the
//! embedded default of the engine (no system packages needed).
//!
//! Each engine is a separate host with its own addresses
//! (`loopback/<host>/<nic>`); a process-wide registry (module `fabric`) lets
//! engines find each other. Regions get random 64-bit keys per NIC, and
//! every access is checked (key, bounds, right, atomic alignment) before
//! anything moves. Options ([`LoopbackConfig`]): unordered delivery
//! (seeded shuffle within a window, like EFA's SRD), injected latency and
//! bandwidth per NIC, and fault injection: a failed NIC answers every
//! operation with an error ([`Domain::set_failed`]), and with [`Faults`]
//! each posted operation fails on its own with a seeded probability, some
//! after they took effect at the target and some before, always with the
//! same error ([`TransferError::InjectedFault`]), so the initiator cannot
//! tell which. A send with no posted receive waits up to
//! [`LoopbackConfig::recv_wait`], then fails with
//! [`TransferError::NoReceiveBuffer`].
//!
//! A WRITE's payload is copied into the target region as a software
//! provider places a received payload (`memmove`): not atomically with
//! the target's atomics, and an 8-byte one may even be stored twice
//! (glibc stores the first and the last 8 bytes of an 8 to 16 byte copy),
//! so a `CAS` that lands between the two stores is undone. Only CAS and
//! FAA are atomic with each other, as the verbs and libfabric atomics are
//! guaranteed to be; a word that others change by atomics must only be
//! changed by atomics.

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
    /// Writes keep their posting order among themselves (they land in
    /// the order they were posted; reads and atomics are shuffled among
    /// them and each other): the order `tcp;ofi_rxm` grants (within RMA
    /// and within atomics, not across), where the engine reports
    /// [`writes_ordered`](crate::TransferEngine::writes_ordered) but not
    /// [`ordered`](crate::TransferEngine::ordered). `false`: EFA's SRD,
    /// nothing in order.
    pub writes_in_order: bool,
}

/// Injected per-operation faults: each operation a loopback endpoint posts
/// completes with [`TransferError::InjectedFault`] with probability
/// `probability` — half of those after the operation took effect at the
/// target (the write landed, the CAS or FAA changed the word, the message
/// arrived), half before (nothing happened). Protection is kept: an
/// operation that fails the NIC's checks changes nothing either way.
///
/// With probability `torn` (on top of `probability`), a WRITE of more
/// than 8 bytes is *torn*: only a prefix of its bytes lands (at least one
/// byte, never all; no immediate is delivered) and it fails, and every
/// later operation of the same doorbell batch fails before it runs. That
/// is what a stream transport does when its connection breaks in the
/// middle of a message (libfabric's `tcp` places an RMA write's payload in
/// the target region as it arrives): the target keeps the prefix, and
/// nothing posted after it on that connection is carried out. An 8-byte
/// write, an atomic or a READ is never torn.
///
/// Deterministic for a seed: each endpoint draws from its own stream,
/// derived from `seed` and the endpoint's number on its NIC, one draw per
/// posted operation in posting order (plus one for a torn write's
/// prefix).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Probability that an operation fails, in `[0, 1]`.
    pub probability: f64,
    /// Seed of the draws.
    pub seed: u64,
    /// Probability that a WRITE of more than 8 bytes is torn, in `[0, 1]`
    /// with `probability + torn ≤ 1`.
    pub torn: f64,
    /// A torn write breaks the endpoint for good: every later operation
    /// posted on it fails before it runs, as when the process that wrote
    /// died in the middle of the write (nothing it would post next, a
    /// repair included, goes out). Other endpoints of the NIC go on.
    pub tear_kills: bool,
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
    /// Injected per-operation faults of this NIC's endpoints (`None`:
    /// operations fail only on their own account).
    pub faults: Option<Faults>,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            latency: Duration::ZERO,
            bandwidth_gbps: None,
            unordered: None,
            recv_wait: Duration::from_secs(1),
            faults: None,
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
        if let Some(f) = self.faults {
            let ok = |p: f64| (0.0..=1.0).contains(&p);
            if !(ok(f.probability) && ok(f.torn) && ok(f.probability + f.torn)) {
                return Err(ConfigError::FaultProbability);
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

    fn device_name(&self) -> String {
        "loopback".into()
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

    fn set_imm_sink(&self, sink: crate::domain::ImmSink) {
        self.nic.set_imm_sink(sink);
    }

    fn direct_post(&self) -> bool {
        // Operations take effect at post time, on the posting thread;
        // modelled time needs the worker's timed sleeps.
        let c = &self.cfg;
        c.latency.is_zero() && c.bandwidth_gbps.is_none() && c.unordered.is_none()
    }

    fn completion_wakes_worker(&self) -> bool {
        // Posted directly, an operation completes on the posting thread
        // and nothing tells the worker: only a waiter or a submission
        // runs the group's next round.
        !self.direct_post()
    }

    fn ordered(&self) -> bool {
        self.cfg.unordered.is_none()
    }

    fn writes_ordered(&self) -> bool {
        self.cfg.unordered.map_or(true, |u| u.writes_in_order)
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
    use crate::error::OpKind;
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
    fn an_immediate_reaches_the_sink_on_the_posting_thread() {
        let a = open_host(&LoopbackConfig::default(), 1).unwrap();
        let b = open_host(&LoopbackConfig::default(), 1).unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = seen.clone();
        b[0].set_imm_sink(Arc::new(move |imm| {
            s.lock().unwrap().push((imm, std::thread::current().id()));
            true
        }));
        let (src, dst) = (region(64), region(64));
        let rkey = b[0].register(&dst).unwrap();
        let mut ep = a[0].open_endpoint().unwrap();
        ep.post(&mut vec![WorkRequest {
            wr_id: 1,
            op: WorkOp::Write {
                local: Some(Local {
                    region: src,
                    offset: 0,
                }),
                remote: Remote {
                    peer: b[0].address(),
                    rkey,
                    addr: dst.addr(),
                },
                len: 8,
                imm: Some(9),
            },
        }]);
        // Counted by the thread that ran the write: nothing waits in the
        // target's queue for a worker.
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(9, std::thread::current().id())]
        );
        assert_eq!(b[0].poll_incoming(&mut Vec::new()), 0);
        assert_eq!(b[0].counters().imm_arrivals, 1);
        for d in a.iter().chain(&b) {
            d.shutdown();
        }
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

    /// An initiator NIC that injects faults, a target NIC, and a region
    /// registered on the target.
    struct Faulty {
        a: Arc<LoopbackDomain>,
        b: Arc<LoopbackDomain>,
        dst: Arc<Region>,
        remote: Remote,
    }

    /// A host whose NIC injects `faults` (and shuffles when `unordered`),
    /// a target host, and a region of `len` bytes on the target with
    /// `access`.
    fn faulty_pair(faults: Faults, unordered: bool, len: u64, access: Access) -> Faulty {
        let cfg = LoopbackConfig {
            faults: Some(faults),
            unordered: unordered.then_some(Unordered {
                seed: 3,
                window: 8,
                writes_in_order: false,
            }),
            ..LoopbackConfig::default()
        };
        let a = open_host(&cfg, 1).unwrap().remove(0);
        let b = open_host(&LoopbackConfig::default(), 1).unwrap().remove(0);
        let dst = Region::alloc(len, access, 0, 0).unwrap();
        let rkey = b.register(&dst).unwrap();
        let remote = Remote {
            peer: b.address(),
            rkey,
            addr: dst.addr(),
        };
        Faulty { a, b, dst, remote }
    }

    /// Posts `ops` on a new endpoint of `nic`, eight to a doorbell, and
    /// polls until all completed; returns their results in posting order.
    fn run_all(nic: &LoopbackDomain, ops: Vec<WorkOp>) -> Vec<Result<u64, TransferError>> {
        let n = ops.len();
        let mut ep = nic.open_endpoint().unwrap();
        let mut batch = Vec::new();
        let mut done = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            batch.push(WorkRequest {
                wr_id: i as u64,
                op,
            });
            if batch.len() == 8 {
                ep.post(&mut batch);
            }
        }
        ep.post(&mut batch);
        while done.len() < n {
            ep.poll(&mut done);
        }
        done.sort_by_key(|c: &Completion| c.wr_id);
        done.into_iter().map(|c| c.result).collect()
    }

    fn word(r: &Region, offset: u64) -> u64 {
        r.enter()
            .unwrap()
            .word(offset)
            .unwrap()
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    fn is_injected(r: &Result<u64, TransferError>, kind: OpKind) -> bool {
        matches!(r, Err(TransferError::InjectedFault { op, .. }) if *op == kind)
    }

    #[test]
    fn injected_faults_fail_some_operations_after_they_applied_and_some_before() {
        const N: u64 = 4000;
        for unordered in [false, true] {
            let faults = Faults {
                probability: 0.3,
                seed: 11,
                torn: 0.0,
                tear_kills: false,
            };
            let Faulty { a, b, dst, remote } = faulty_pair(faults, unordered, 8, Access::all());
            let faa = WorkOp::Faa { remote, add: 1 };
            let results = run_all(&a, vec![faa; N as usize]);
            let ok = results.iter().filter(|r| r.is_ok()).count() as u64;
            let failed = results
                .iter()
                .filter(|r| is_injected(r, OpKind::Faa))
                .count() as u64;
            assert_eq!(ok + failed, N, "only injected errors");
            // Each FAA that took effect added one: the successes, and the
            // failures injected after the operation applied.
            let after = word(&dst, 0) - ok;
            let before = failed - after;
            println!(
                "unordered {unordered}: {N} FAAs at p = {}: {ok} completed, {failed} failed \
                 ({after} after applying, {before} before)",
                faults.probability
            );
            assert!(after > 0 && before > 0, "both kinds of fault occur");
            assert_eq!(a.counters().errors, failed);
            a.shutdown();
            b.shutdown();
        }
    }

    #[test]
    fn torn_writes_land_a_prefix_and_fail_the_rest_of_their_batch() {
        // 64-byte writes of 0xAB into their own 64-byte slots, eight to a
        // doorbell; 8-byte writes are never torn.
        const N: usize = 800;
        const SLOT: u64 = 64;
        for unordered in [false, true] {
            let faults = Faults {
                probability: 0.0,
                seed: 17,
                torn: 0.1,
                tear_kills: false,
            };
            let Faulty { a, b, dst, remote } =
                faulty_pair(faults, unordered, N as u64 * SLOT, Access::all());
            let src = region(SLOT);
            src.enter().unwrap().write(0, &[0xAB; SLOT as usize]);
            let write = |i: usize, len: u64| WorkOp::Write {
                local: Some(Local {
                    region: src.clone(),
                    offset: 0,
                }),
                remote: Remote {
                    addr: remote.addr + i as u64 * SLOT,
                    ..remote
                },
                len,
                imm: None,
            };
            let results = run_all(&a, (0..N).map(|i| write(i, SLOT)).collect());
            let (mut torn, mut after_torn) = (0, 0);
            for (batch, rs) in results.chunks(8).enumerate() {
                let mut broken = false;
                for (k, r) in rs.iter().enumerate() {
                    let i = batch * 8 + k;
                    let mut got = [0u8; SLOT as usize];
                    dst.enter().unwrap().read(i as u64 * SLOT, &mut got);
                    let landed = got.iter().take_while(|&&b| b == 0xAB).count();
                    assert!(got[landed..].iter().all(|&b| b == 0), "write {i}: a prefix");
                    match r {
                        Ok(_) => {
                            assert!(!broken, "write {i} ran after a torn one of its batch");
                            assert_eq!(landed, SLOT as usize, "write {i} completed whole");
                        }
                        Err(_) if broken => {
                            assert_eq!(landed, 0, "write {i} after a torn one landed");
                            after_torn += 1;
                        }
                        Err(e) => {
                            assert!(is_injected(r, OpKind::Write), "write {i}: {e}");
                            assert!(0 < landed && landed < SLOT as usize, "write {i} torn");
                            torn += 1;
                            broken = true;
                        }
                    }
                }
            }
            println!("unordered {unordered}: {N} writes: {torn} torn, {after_torn} after one");
            assert!(torn > 0 && after_torn > 0, "both occur");
            // 8 bytes: never torn.
            let small = run_all(&a, (0..N).map(|i| write(i, 8)).collect());
            assert!(
                small.iter().all(Result::is_ok),
                "8-byte writes are never torn"
            );
            a.shutdown();
            b.shutdown();
        }
    }

    #[test]
    fn writes_in_order_keep_their_order_while_reads_still_move() {
        // Batch i of 8: four writes of 4i+1..=4i+4 to word i, each followed
        // by a read of that word.
        const BATCHES: usize = 200;
        for writes_in_order in [true, false] {
            let cfg = LoopbackConfig {
                unordered: Some(Unordered {
                    seed: 9,
                    window: 8,
                    writes_in_order,
                }),
                ..LoopbackConfig::default()
            };
            let a = open_host(&cfg, 1).unwrap().remove(0);
            let b = open_host(&LoopbackConfig::default(), 1).unwrap().remove(0);
            assert!(!a.ordered());
            assert_eq!(a.writes_ordered(), writes_in_order);
            let n = BATCHES as u64 * 4;
            let (src, dst, seen) = (region(n * 8), region(BATCHES as u64 * 8), region(n * 8));
            for v in 0..n {
                src.enter().unwrap().write(v * 8, &(v + 1).to_le_bytes());
            }
            let remote = Remote {
                peer: b.address(),
                rkey: b.register(&dst).unwrap(),
                addr: dst.addr(),
            };
            let at = |i: u64| Remote {
                addr: remote.addr + i * 8,
                ..remote
            };
            let local = |r: &Arc<Region>, offset: u64| Local {
                region: r.clone(),
                offset,
            };
            let mut ops = Vec::new();
            for v in 0..n {
                let word = v / 4;
                ops.push(WorkOp::Write {
                    local: Some(local(&src, v * 8)),
                    remote: at(word),
                    len: 8,
                    imm: None,
                });
                ops.push(WorkOp::Read {
                    local: local(&seen, v * 8),
                    remote: at(word),
                    len: 8,
                });
            }
            assert!(run_all(&a, ops).iter().all(Result::is_ok));
            let last_wins = (0..BATCHES as u64)
                .filter(|&i| word(&dst, i * 8) == 4 * i + 4)
                .count();
            // A batch's last read, posted after all its writes, saw an
            // earlier one's value.
            let early_reads = (0..BATCHES as u64)
                .filter(|&i| word(&seen, (4 * i + 3) * 8) != 4 * i + 4)
                .count();
            println!(
                "writes in order {writes_in_order}: last write landed last in \
                 {last_wins}/{BATCHES} batches, last read early in {early_reads}"
            );
            if writes_in_order {
                assert_eq!(last_wins, BATCHES, "writes land in posting order");
            } else {
                assert!(last_wins < BATCHES, "writes are shuffled too");
            }
            assert!(early_reads > 0, "reads still run out of order");
            a.shutdown();
            b.shutdown();
        }
    }

    #[test]
    fn injected_faults_are_the_same_for_the_same_seed() {
        let outcome = |seed: u64, unordered: bool| {
            let faults = Faults {
                probability: 0.2,
                seed,
                torn: 0.0,
                tear_kills: false,
            };
            let Faulty { a, b, dst, remote } = faulty_pair(faults, unordered, 8, Access::all());
            let results = run_all(&a, vec![WorkOp::Faa { remote, add: 1 }; 500]);
            let failed: Vec<bool> = results.iter().map(|r| r.is_err()).collect();
            let applied = word(&dst, 0);
            a.shutdown();
            b.shutdown();
            (failed, applied)
        };
        for unordered in [false, true] {
            let first = outcome(5, unordered);
            assert_eq!(first, outcome(5, unordered), "unordered {unordered}");
            assert_ne!(first, outcome(6, unordered), "unordered {unordered}");
        }
    }

    #[test]
    fn a_faulted_cas_returns_no_value_whether_or_not_it_applied() {
        // Every operation fails: each CAS 0 → i + 1 on its own word.
        const WORDS: u64 = 1000;
        let faults = Faults {
            probability: 1.0,
            seed: 2,
            torn: 0.0,
            tear_kills: false,
        };
        let Faulty { a, b, dst, remote } = faulty_pair(faults, false, WORDS * 8, Access::all());
        let cas: Vec<WorkOp> = (0..WORDS)
            .map(|i| WorkOp::Cas {
                remote: Remote {
                    addr: remote.addr + i * 8,
                    ..remote
                },
                expected: 0,
                new: i + 1,
            })
            .collect();
        let results = run_all(&a, cas);
        assert!(results.iter().all(|r| is_injected(r, OpKind::Cas)));
        let applied = (0..WORDS).filter(|&i| word(&dst, i * 8) == i + 1).count() as u64;
        let untouched = (0..WORDS).filter(|&i| word(&dst, i * 8) == 0).count() as u64;
        println!(
            "{WORDS} CASes at p = 1: all failed without a value; {applied} swapped, {untouched} not"
        );
        assert_eq!(applied + untouched, WORDS);
        assert!(applied > 0 && untouched > 0);
        a.shutdown();
        b.shutdown();
    }

    #[test]
    fn injected_faults_keep_protection() {
        // Every operation fails, half of them after running: none of those
        // that the NIC must refuse may change the target.
        let faults = Faults {
            probability: 1.0,
            seed: 9,
            torn: 0.0,
            tear_kills: false,
        };
        let Faulty { a, b, dst, remote } = faulty_pair(faults, false, 64, Access::REMOTE_READ);
        let src = region(64);
        src.enter().unwrap().write(0, &[0xAB; 64]);
        let local = Local {
            region: src.clone(),
            offset: 0,
        };
        let write = |remote: Remote, len: u64| WorkOp::Write {
            local: Some(local.clone()),
            remote,
            len,
            imm: None,
        };
        let refused = [
            // No remote-write or atomic right on the region.
            write(remote, 8),
            WorkOp::Faa { remote, add: 1 },
            // Outside the region, and an unknown key.
            write(
                Remote {
                    addr: remote.addr + 60,
                    ..remote
                },
                8,
            ),
            write(
                Remote {
                    rkey: remote.rkey ^ 1,
                    ..remote
                },
                8,
            ),
        ];
        let ops: Vec<WorkOp> = refused.iter().cycle().take(400).cloned().collect();
        let results = run_all(&a, ops);
        let protection = results
            .iter()
            .filter(|r| matches!(r, Err(TransferError::Protection { .. })))
            .count();
        let injected = results.iter().filter(|r| r.is_err()).count() - protection;
        println!("400 refused operations at p = 1: {protection} protection errors, {injected} injected before running");
        assert!(results.iter().all(|r| r.is_err()));
        assert!(protection > 0 && injected > 0);
        let mut bytes = [0u8; 64];
        dst.enter().unwrap().read(0, &mut bytes);
        assert_eq!(bytes, [0; 64], "the target is unchanged");
        a.shutdown();
        b.shutdown();
    }

    #[test]
    fn fault_probability_outside_zero_one_is_refused() {
        for p in [-0.1, 1.5, f64::NAN] {
            let cfg = LoopbackConfig {
                faults: Some(Faults {
                    probability: p,
                    seed: 0,
                    torn: 0.0,
                    tear_kills: false,
                }),
                ..LoopbackConfig::default()
            };
            assert_eq!(cfg.validate(), Err(ConfigError::FaultProbability));
            assert!(matches!(
                open_host(&cfg, 1),
                Err(TransferError::Config(ConfigError::FaultProbability))
            ));
        }
        for p in [0.0, 1.0] {
            let faults = Some(Faults {
                probability: p,
                seed: 0,
                torn: 0.0,
                tear_kills: false,
            });
            let cfg = LoopbackConfig {
                faults,
                ..LoopbackConfig::default()
            };
            assert_eq!(cfg.validate(), Ok(()));
        }
        // Probability 0 fails nothing.
        let Faulty { a, b, dst, remote } = faulty_pair(
            Faults {
                probability: 0.0,
                seed: 1,
                torn: 0.0,
                tear_kills: false,
            },
            true,
            8,
            Access::all(),
        );
        let results = run_all(&a, vec![WorkOp::Faa { remote, add: 1 }; 200]);
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(word(&dst, 0), 200);
        a.shutdown();
        b.shutdown();
    }
}
