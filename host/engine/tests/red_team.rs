//! Adversarial use of the engine as an LLM serving stack uses it: many
//! peers moving KV-cache pages with immediates into one receiver whose
//! expectations are armed, cancelled and re-armed meanwhile; senders that
//! fail part-way on shuffled, faulty NICs; peers that die while barriers
//! and scatters aim at them; ranges at the edges of `u64`; descriptors
//! gone stale. Every assertion is about outcomes (counts, bytes, which
//! error), never about timing; waits are bounded by the hang guard.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{bounded, engine, flag, pattern, region, wait, HANG};
use rolex_engine::{
    EngineConfig, Fabric, Faults, LoopbackConfig, MrDesc, OnDone, Pages, ScatterDst,
    TransferEngine, TransferError, Unordered,
};

/// A small deterministic generator (xorshift64*), so a failing history
/// can be replayed from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn loopback_engine(nics: usize, lb: LoopbackConfig, abort_notices: bool) -> TransferEngine {
    TransferEngine::new(EngineConfig {
        nics_per_group: nics,
        fabric: Fabric::Loopback(lb),
        abort_notices,
        ..EngineConfig::default()
    })
    .expect("loopback engine")
}

/// Waits (bounded) until `cond` holds, polling.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "hung waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Callbacks for calls that must be refused: a refused call drops its
/// `on_done` uncalled. (A panic in a callback would be caught by the
/// callback thread, so they count instead.)
#[derive(Clone, Default)]
struct Never(Arc<AtomicUsize>);

impl Never {
    fn on_done(&self) -> OnDone {
        let n = self.0.clone();
        OnDone::callback(move |_| {
            n.fetch_add(1, SeqCst);
        })
    }

    /// Checks that none ran: `e`'s callbacks run in order, so one queued
    /// now has run after any of them.
    fn check(&self, e: &TransferEngine) {
        let (tx, rx) = std::sync::mpsc::channel();
        e.expect_imm_count(
            u32::MAX >> 1,
            0,
            OnDone::callback(move |_| tx.send(()).unwrap()),
        )
        .unwrap();
        rx.recv_timeout(HANG).unwrap();
        assert_eq!(self.0.load(SeqCst), 0, "a refused call's callback ran");
    }
}

/// One expectation armed by the test: how it fired (and how often).
#[derive(Default)]
struct Outcome {
    fired: AtomicUsize,
    result: Mutex<Option<Result<(), TransferError>>>,
}

/// The record of every expectation a test armed: `(imm, target, outcome)`.
#[derive(Default)]
struct Ledger {
    armed: Mutex<Vec<(u32, u32, Arc<Outcome>)>>,
}

impl Ledger {
    /// Arms `count` arrivals of `imm` on `e` (optionally with a deadline);
    /// records it if the engine accepted it.
    fn arm(
        &self,
        e: &TransferEngine,
        imm: u32,
        count: u32,
        deadline: Option<Instant>,
    ) -> Result<(), TransferError> {
        let o = Arc::new(Outcome::default());
        let o2 = o.clone();
        let done = OnDone::callback(move |r| {
            *o2.result.lock().unwrap() = Some(r);
            o2.fired.fetch_add(1, SeqCst);
        });
        // Recorded before arming: it may fire before `arm` returns.
        let mut armed = self.armed.lock().unwrap();
        let r = match deadline {
            Some(d) => e.expect_imm_count_until(imm, count, d, done),
            None => e.expect_imm_count(imm, count, done),
        };
        if r.is_ok() {
            armed.push((imm, count, o));
        }
        r
    }

    fn len(&self) -> usize {
        self.armed.lock().unwrap().len()
    }

    fn fired(&self) -> usize {
        self.armed
            .lock()
            .unwrap()
            .iter()
            .map(|(_, _, o)| o.fired.load(SeqCst))
            .sum()
    }

    /// Waits until every expectation fired, then checks none fired twice.
    fn settle(&self) {
        until("every expectation to fire", || self.fired() >= self.len());
        // A second firing would have been queued with the first.
        std::thread::sleep(Duration::from_millis(20));
        for (imm, count, o) in self.armed.lock().unwrap().iter() {
            assert_eq!(
                o.fired.load(SeqCst),
                1,
                "expectation of {count} x imm {imm} fired {} times",
                o.fired.load(SeqCst)
            );
        }
    }

    /// Arrivals consumed by expectations met on `imm`.
    fn consumed(&self, imm: u32) -> u64 {
        self.armed
            .lock()
            .unwrap()
            .iter()
            .filter(|(i, _, o)| *i == imm && matches!(*o.result.lock().unwrap(), Some(Ok(()))))
            .map(|(_, c, _)| u64::from(*c))
            .sum()
    }
}

/// Eight sender threads on four engines (1 to 4 NICs, half of them
/// shuffling and slow) write pages with four immediates into one 2-NIC
/// receiver, while another thread arms, cancels and re-arms expectations
/// on those immediates, some with deadlines that pass meanwhile. At the end every expectation fired exactly once,
/// and for each immediate the pages written equal the arrivals consumed
/// by the expectations that were met plus those still counted: nothing
/// lost, nothing counted twice.
#[test]
fn many_senders_while_expectations_are_cancelled_and_rearmed_count_exactly() {
    bounded(|| {
        const IMMS: u32 = 4;
        const PAGE: u64 = 256;
        const SLOTS: u64 = 64;
        let rx = Arc::new(engine(2));
        let (_dst, dd) = region(&rx, SLOTS * PAGE);
        let senders: Vec<Arc<TransferEngine>> = (0..4)
            .map(|i| {
                let lb = if i % 2 == 1 {
                    LoopbackConfig {
                        unordered: Some(Unordered {
                            seed: 40 + i as u64,
                            window: 8,
                            writes_in_order: false,
                        }),
                        latency: Duration::from_micros(50),
                        ..LoopbackConfig::default()
                    }
                } else {
                    LoopbackConfig::default()
                };
                Arc::new(loopback_engine(i + 1, lb, false))
            })
            .collect();
        let sent: Arc<Vec<AtomicU64>> = Arc::new((0..IMMS).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let ledger = Arc::new(Ledger::default());

        let controller = {
            let (rx, stop, ledger) = (rx.clone(), stop.clone(), ledger.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x5eed);
                let mut rounds = 0u64;
                while !stop.load(SeqCst) || rounds < 200 {
                    rounds += 1;
                    let imm = rng.below(u64::from(IMMS)) as u32;
                    // A third of the expectations carry a deadline that
                    // fires while pages still arrive.
                    let deadline = (rng.below(3) == 0)
                        .then(|| Instant::now() + Duration::from_micros(rng.below(2000)));
                    match rng.below(3) {
                        0 | 1 => match ledger.arm(&rx, imm, 1 + rng.below(12) as u32, deadline) {
                            Ok(()) | Err(TransferError::ImmAlreadyArmed { .. }) => {}
                            Err(e) => panic!("arming imm {imm}: {e}"),
                        },
                        _ => {
                            rx.cancel_imm_count(imm);
                        }
                    }
                    if rounds % 16 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        };

        let threads: Vec<_> = (0..8)
            .map(|t| {
                let tx = senders[t % 4].clone();
                let (dd, sent) = (dd.clone(), sent.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(1 + t as u64);
                    let (src, _) = region(&tx, SLOTS * PAGE);
                    src.write(0, &pattern((SLOTS * PAGE) as usize, t as u8))
                        .unwrap();
                    for round in 0..60u64 {
                        let imm = ((t as u64 + round) % u64::from(IMMS)) as u32;
                        let n = 1 + rng.below(8) as usize;
                        let pick = |rng: &mut Rng| -> Vec<u32> {
                            (0..n).map(|_| rng.below(SLOTS) as u32).collect()
                        };
                        let sp = Pages {
                            indices: pick(&mut rng),
                            stride: PAGE,
                            offset: 0,
                        };
                        let dp = Pages {
                            indices: pick(&mut rng),
                            stride: PAGE,
                            offset: 0,
                        };
                        let (f, d) = flag();
                        tx.submit_paged_writes(PAGE, Some(imm), (&src, &sp), (&dd, &dp), d)
                            .unwrap();
                        wait(&f).unwrap();
                        sent[imm as usize].fetch_add(n as u64, SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        stop.store(true, SeqCst);
        controller.join().unwrap();
        for imm in 0..IMMS {
            rx.cancel_imm_count(imm);
        }
        ledger.settle();
        assert!(ledger.len() > 50, "the controller armed expectations");
        for imm in 0..IMMS {
            let sent = sent[imm as usize].load(SeqCst);
            let left = u64::from(rx.imm_count(imm));
            assert_eq!(
                ledger.consumed(imm) + left,
                sent,
                "imm {imm}: {sent} pages written, {} consumed by expectations met, {left} still counted",
                ledger.consumed(imm)
            );
        }
    });
}

/// Scatter destinations on a 2-NIC receiver: two good ones, which the
/// sender's two NICs aim at the receiver's two NICs, and one whose keys
/// the receiver does not know.
fn two_good_one_bad(dd: &MrDesc) -> Vec<ScatterDst> {
    let mut bad = dd.clone();
    for n in &mut bad.nics {
        n.1 ^= 0x5a5a;
    }
    (0..3)
        .map(|i| ScatterDst {
            len: 64,
            src: 64 * i,
            dst: if i == 2 { bad.clone() } else { dd.clone() },
            dst_offset: 64 * i,
        })
        .collect()
}

/// A transfer that fails part-way aborts one expectation at its receiver,
/// however many of the receiver's NICs its pieces reached: the notice of
/// one failed transfer must not also fail the receiver's next, unrelated
/// expectation on the same immediate (an immediate per layer is reused
/// every step).
#[test]
fn one_failed_transfer_to_a_multi_nic_receiver_aborts_one_expectation() {
    bounded(|| {
        let a = loopback_engine(2, LoopbackConfig::default(), true);
        let b = loopback_engine(2, LoopbackConfig::default(), true);
        let (src, _) = region(&a, 192);
        let (dst, dd) = region(&b, 192);
        let (fl, d) = flag();
        b.expect_imm_count(5, 3, d).unwrap();
        let (w, d) = flag();
        a.submit_scatter(None, d, Some(5), &src, &two_good_one_bad(&dd))
            .unwrap();
        assert!(matches!(wait(&w), Err(TransferError::Protection { .. })));
        assert_eq!(wait(&fl), Err(TransferError::SenderAborted { imm: 5 }));
        // Every notice of the failed transfer has been delivered once a
        // later transfer from the same sender, on both its NICs, landed.
        let (fl, d) = flag();
        b.expect_imm_count(6, 2, d).unwrap();
        let good: Vec<ScatterDst> = two_good_one_bad(&dd).into_iter().take(2).collect();
        let (w, d) = flag();
        a.submit_scatter(None, d, Some(6), &src, &good).unwrap();
        wait(&w).unwrap();
        wait(&fl).unwrap();
        // The next transfer on immediate 5 succeeds: its expectation (on
        // top of the arrivals the failed one left counted) is met.
        let left = b.imm_count(5);
        let (fl, d) = flag();
        b.expect_imm_count(5, left + 1, d).unwrap();
        let (w, d) = flag();
        a.submit_single_write(64, Some(5), (&src, 0), (&dd, 0), d)
            .unwrap();
        wait(&w).unwrap();
        assert_eq!(
            wait(&fl),
            Ok(0),
            "a second notice of the failed transfer failed the next expectation"
        );
        drop(dst);
    });
}

/// Shuffling, slow, faulty sender NICs; abort notices on; every transfer
/// its own immediate, its expectation armed before or after it is
/// submitted. A transfer that completed is always seen whole by its
/// expectation (its immediates arrive before it completes). One that
/// failed ends its expectation as aborted or met (every page landed
/// before the fault); an expectation still pending then is cancelled and
/// armed again with a deadline — the notice, if it is still on its way,
/// aborts that one (or was kept for it), and if a fault lost it the
/// deadline fires. Every expectation fires once; no outcome depends on
/// timing, only which of the allowed ones is seen.
#[test]
fn faulty_shuffled_senders_end_every_expectation_once_and_consistently() {
    bounded(|| {
        const PAGES: u32 = 4;
        const PAGE: u64 = 128;
        const TRANSFERS: u32 = 48;
        for receiver_nics in [1, 2] {
            let lb = LoopbackConfig {
                unordered: Some(Unordered {
                    seed: 7,
                    window: 8,
                    writes_in_order: false,
                }),
                latency: Duration::from_micros(20),
                faults: Some(Faults {
                    probability: 0.15,
                    seed: 3 + receiver_nics as u64,
                    torn: 0.0,
                    tear_kills: false,
                }),
                ..LoopbackConfig::default()
            };
            let a = loopback_engine(2, lb, true);
            let b = loopback_engine(receiver_nics, LoopbackConfig::default(), true);
            let len = u64::from(TRANSFERS * PAGES) * PAGE;
            let (src, _) = region(&a, len);
            src.write(0, &pattern(len as usize, 9)).unwrap();
            let (dst, dd) = region(&b, len);
            let first = Ledger::default();
            let mut flags = Vec::new();
            for t in 0..TRANSFERS {
                if t % 2 == 0 {
                    first.arm(&b, t, PAGES, None).unwrap();
                }
                let pages = Pages {
                    indices: (t * PAGES..(t + 1) * PAGES).collect(),
                    stride: PAGE,
                    offset: 0,
                };
                let (f, d) = flag();
                a.submit_paged_writes(PAGE, Some(t), (&src, &pages), (&dd, &pages), d)
                    .unwrap();
                flags.push(f);
                if t % 2 == 1 {
                    first.arm(&b, t, PAGES, None).unwrap();
                }
            }
            let sent: Vec<Result<u64, TransferError>> = flags.iter().map(wait).collect();
            let outcome = |l: &Ledger, t: u32| -> Option<Result<(), TransferError>> {
                let armed = l.armed.lock().unwrap();
                let (_, _, o) = armed.iter().find(|(i, _, _)| *i == t).unwrap();
                let r = o.result.lock().unwrap().clone();
                r
            };
            let again = Ledger::default();
            let deadline = Instant::now() + Duration::from_millis(200);
            for t in 0..TRANSFERS {
                if sent[t as usize].is_ok() {
                    until("a completed transfer's expectation", || {
                        outcome(&first, t).is_some()
                    });
                } else if outcome(&first, t).is_none() && b.cancel_imm_count(t) {
                    again.arm(&b, t, PAGES, Some(deadline)).unwrap();
                }
            }
            first.settle();
            again.settle();
            let all = pattern(len as usize, 9);
            let mut tally: HashMap<&'static str, usize> = HashMap::new();
            for t in 0..TRANSFERS {
                let got = outcome(&first, t).unwrap();
                let kind = match (&sent[t as usize], &got) {
                    (Ok(_), Ok(())) => "completed, met",
                    (Ok(_), other) => {
                        panic!("transfer {t} completed but its expectation {other:?}")
                    }
                    (Err(_), Ok(())) => "failed, every page landed",
                    (Err(_), Err(TransferError::SenderAborted { imm })) if *imm == t => {
                        "failed, aborted"
                    }
                    (Err(_), Err(TransferError::ImmCancelled { .. })) => {
                        match outcome(&again, t).unwrap() {
                            Err(TransferError::SenderAborted { imm }) if imm == t => {
                                "failed, aborted late"
                            }
                            Err(TransferError::ImmDeadline {
                                expected, arrived, ..
                            }) if expected == PAGES && arrived < PAGES => "failed, notice lost",
                            other => panic!("transfer {t} failed, re-armed: {other:?}"),
                        }
                    }
                    (Err(e), other) => {
                        panic!("transfer {t} failed ({e}), its expectation {other:?}")
                    }
                };
                *tally.entry(kind).or_default() += 1;
                if let Ok(()) = got {
                    let at = t as usize * PAGES as usize * PAGE as usize;
                    let n = PAGES as usize * PAGE as usize;
                    assert_eq!(
                        dst.to_vec(at as u64, n).unwrap(),
                        all[at..at + n],
                        "transfer {t}"
                    );
                }
            }
            println!("{receiver_nics}-NIC receiver: {tally:?}");
            assert!(tally.keys().any(|k| k.starts_with("failed, aborted")));
        }
    });
}

/// Whether `e` names one of `addrs` as the peer that failed it.
fn names_peer(e: &TransferError, addrs: &[rolex_engine::NetAddr]) -> bool {
    match e {
        TransferError::UnknownPeer { peer }
        | TransferError::PeerFailed { peer, .. }
        | TransferError::Protection { peer, .. } => addrs.contains(peer),
        _ => false,
    }
}

/// A peer group whose member died: a barrier or scatter to it fails with
/// an error naming the dead peer, never hangs, and still reaches every
/// living member; the group cannot be made again with the dead peer.
#[test]
fn a_dead_member_fails_barrier_and_scatter_by_name_and_the_living_still_get_theirs() {
    bounded(|| {
        let a = engine(2);
        let mut peers: Vec<(Option<TransferEngine>, MrDesc)> = (0..4)
            .map(|_| {
                let e = engine(2);
                let (_h, d) = region(&e, 4096);
                (Some(e), d)
            })
            .collect();
        let addrs: Vec<_> = peers
            .iter()
            .map(|p| p.0.as_ref().unwrap().main_address())
            .collect();
        let g = a.add_peer_group(addrs.clone()).unwrap();
        let dead_addrs = peers[2].0.as_ref().unwrap().addresses(0).unwrap();
        drop(peers[2].0.take());
        let descs: Vec<MrDesc> = peers.iter().map(|p| p.1.clone()).collect();
        let (src, _) = region(&a, 4096);
        for (round, imm) in [(0, 11u32), (1, 12)] {
            let mut landed = Vec::new();
            for p in peers.iter().filter_map(|p| p.0.as_ref()) {
                let (f, d) = flag();
                p.expect_imm_count(imm, 1, d).unwrap();
                landed.push(f);
            }
            let (w, d) = flag();
            if round == 0 {
                a.submit_barrier(Some(g), d, imm, &descs).unwrap();
            } else {
                let dst: Vec<ScatterDst> = descs
                    .iter()
                    .enumerate()
                    .map(|(i, dd)| ScatterDst {
                        len: 64,
                        src: 64 * i as u64,
                        dst: dd.clone(),
                        dst_offset: 0,
                    })
                    .collect();
                a.submit_scatter(Some(g), d, Some(imm), &src, &dst).unwrap();
            }
            let e = wait(&w).expect_err("a dead member fails the transfer");
            assert!(
                names_peer(&e, &dead_addrs),
                "{e:?} does not name the dead peer"
            );
            for f in &landed {
                assert_eq!(wait(f), Ok(0));
            }
        }
        assert_eq!(
            a.add_peer_group(addrs),
            Err(TransferError::UnknownPeer {
                peer: dead_addrs[0]
            })
        );
    });
}

/// Threads keep barriers and scatters in flight to four peers while the
/// peers die one by one: every transfer notifies exactly once, and each
/// failure names a peer that is dead by then.
#[test]
fn peers_dying_under_concurrent_barriers_and_scatters() {
    bounded(|| {
        let a = Arc::new(engine(2));
        let mut peers: Vec<Option<TransferEngine>> = (0..4).map(|_| Some(engine(2))).collect();
        let descs: Vec<MrDesc> = peers
            .iter()
            .map(|p| region(p.as_ref().unwrap(), 4096).1)
            .collect();
        let all_addrs: Vec<Vec<rolex_engine::NetAddr>> = peers
            .iter()
            .map(|p| p.as_ref().unwrap().addresses(0).unwrap())
            .collect();
        let g = a
            .add_peer_group(all_addrs.iter().map(|v| v[0]).collect())
            .unwrap();
        let dead: Arc<Mutex<Vec<rolex_engine::NetAddr>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (a, descs, dead, stop, done) = (
                    a.clone(),
                    descs.clone(),
                    dead.clone(),
                    stop.clone(),
                    done.clone(),
                );
                std::thread::spawn(move || {
                    let (src, _) = region(&a, 4096);
                    let mut n = 0u64;
                    while !stop.load(SeqCst) {
                        n += 1;
                        let (f, d) = flag();
                        if (n + t) % 2 == 0 {
                            a.submit_barrier(Some(g), d, 1, &descs).unwrap();
                        } else {
                            let dst: Vec<ScatterDst> = descs
                                .iter()
                                .map(|dd| ScatterDst {
                                    len: 256,
                                    src: 0,
                                    dst: dd.clone(),
                                    dst_offset: 256 * t,
                                })
                                .collect();
                            a.submit_scatter(Some(g), d, Some(2), &src, &dst).unwrap();
                        }
                        // Read the dead list before the outcome: a peer
                        // named must have been dropped (or be dropping).
                        if let Err(e) = wait(&f) {
                            until("the failing peer to be listed as dying", || {
                                names_peer(&e, &dead.lock().unwrap())
                            });
                        }
                        done.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        for (i, p) in peers.iter_mut().enumerate() {
            let before = done.load(SeqCst);
            until("transfers to progress", || done.load(SeqCst) >= before + 20);
            dead.lock().unwrap().extend(&all_addrs[i]);
            drop(p.take());
        }
        let before = done.load(SeqCst);
        until("transfers to all-dead peers to end", || {
            done.load(SeqCst) >= before + 20
        });
        stop.store(true, SeqCst);
        for t in threads {
            t.join().unwrap();
        }
    });
}

/// Ranges at the edges of `u64`: page offsets whose arithmetic overflows
/// are refused at once (the callback never runs), remote ranges that wrap
/// fail through the completion and change nothing; zero-length and
/// overlapping pages behave as documented.
#[test]
fn ranges_at_the_edges_of_u64() {
    bounded(|| {
        let (a, b) = (engine(2), engine(2));
        let (src, _) = region(&a, 4096);
        src.write(0, &pattern(4096, 1)).unwrap();
        let (dst, dd) = region(&b, 4096);
        let refused = Never::default();
        let never = || refused.on_done();
        let one = |offset: u64, stride: u64, i: u32| Pages {
            indices: vec![0, i],
            stride,
            offset,
        };
        let ok = one(0, 64, 1);
        // Index * stride overflows; offset + index * stride overflows
        // (page 0 of the latter is a local range past the region).
        for bad in [one(0, u64::MAX / 2, 3), one(u64::MAX - 10, 64, 1)] {
            assert!(matches!(
                a.submit_paged_writes(64, Some(1), (&src, &bad), (&dd, &ok), never()),
                Err(TransferError::PageOffsetOverflow { page: 1 }
                    | TransferError::LocalOutOfBounds { .. })
            ));
            assert_eq!(
                a.submit_paged_writes(64, Some(1), (&src, &ok), (&dd, &bad), never()),
                Err(TransferError::PageOffsetOverflow { page: 1 })
            );
        }
        // Local ranges that wrap are the caller's error, at once.
        assert!(matches!(
            a.submit_single_write(16, None, (&src, u64::MAX - 7), (&dd, 0), never()),
            Err(TransferError::LocalOutOfBounds { .. })
        ));
        assert!(matches!(
            a.submit_read(16, (&src, u64::MAX - 7), (&dd, 0), never()),
            Err(TransferError::LocalOutOfBounds { .. })
        ));
        refused.check(&a);
        // Remote ranges that wrap fail through the completion.
        for (off, len) in [(u64::MAX, 1), (u64::MAX - 7, 16), (4096, 1), (4095, 2)] {
            let (f, d) = flag();
            a.submit_single_write(len, Some(2), (&src, 0), (&dd, off), d)
                .unwrap();
            assert!(
                matches!(wait(&f), Err(TransferError::Protection { .. })),
                "write at {off} + {len}"
            );
            let (f, d) = flag();
            a.submit_read(len, (&src, 0), (&dd, off), d).unwrap();
            assert!(matches!(wait(&f), Err(TransferError::Protection { .. })));
        }
        for off in [u64::MAX - 7, 4092, 4096] {
            let (f, d) = common::vflag();
            a.submit_faa((&dd, off), 1, d).unwrap();
            assert!(matches!(wait(&f), Err(TransferError::Protection { .. })));
        }
        // A page that runs past the region fails the whole transfer.
        let past = Pages {
            indices: vec![0, 63, 64],
            stride: 64,
            offset: 0,
        };
        let (f, d) = flag();
        let from = Pages {
            indices: vec![0, 1, 2],
            stride: 64,
            offset: 0,
        };
        a.submit_paged_writes(64, Some(3), (&src, &from), (&dd, &past), d)
            .unwrap();
        assert!(matches!(wait(&f), Err(TransferError::Protection { .. })));
        assert_eq!(
            dst.to_vec(0, 4096).unwrap(),
            vec![0; 4096],
            "nothing written"
        );
        assert_eq!(b.imm_count(3), 0);
        // Zero-length pages are refused; overlapping destination pages
        // are allowed, each delivering its immediate.
        let (_, d) = flag();
        assert_eq!(
            a.submit_paged_writes(0, Some(4), (&src, &ok), (&dd, &ok), d),
            Err(TransferError::ZeroLength {
                op: rolex_engine::OpKind::PagedWrite
            })
        );
        let same = Pages {
            indices: vec![5, 5, 5],
            stride: 64,
            offset: 32,
        };
        let (fl, d) = flag();
        b.expect_imm_count(4, 3, d).unwrap();
        let (f, d) = flag();
        a.submit_paged_writes(64, Some(4), (&src, &from), (&dd, &same), d)
            .unwrap();
        wait(&f).unwrap();
        assert_eq!(wait(&fl), Ok(0));
        let got = dst.to_vec(32 + 5 * 64, 64).unwrap();
        let all = pattern(4096, 1);
        assert!(
            (0..3).any(|i| got == all[i * 64..(i + 1) * 64]),
            "the slot holds one whole page"
        );
    });
}

/// Descriptors that went stale: a region deregistered and another
/// registered in its place (likely at the same address) is not reachable
/// through the old descriptor, whose key the NIC refuses; handles of
/// another engine are refused at once.
#[test]
fn stale_and_foreign_descriptors_never_reach_new_memory() {
    bounded(|| {
        let (a, b) = (engine(2), engine(2));
        let (src, _) = region(&a, 4096);
        src.write(0, &pattern(4096, 5)).unwrap();
        for _ in 0..8 {
            let (old, od) = region(&b, 4096);
            b.dereg_mr(&old).unwrap();
            assert_eq!(b.dereg_mr(&old), Err(TransferError::RegionDeregistered));
            drop(old);
            let (new, nd) = region(&b, 4096);
            let (f, d) = flag();
            a.submit_single_write(4096, Some(1), (&src, 0), (&od, 0), d)
                .unwrap();
            assert!(matches!(
                wait(&f),
                Err(TransferError::Protection {
                    check: rolex_engine::ProtectionCheck::UnknownKey,
                    ..
                })
            ));
            assert_eq!(new.to_vec(0, 4096).unwrap(), vec![0; 4096]);
            assert_eq!(b.imm_count(1), 0);
            // The new descriptor works.
            let (f, d) = flag();
            a.submit_single_write(64, None, (&src, 0), (&nd, 0), d)
                .unwrap();
            wait(&f).unwrap();
            b.dereg_mr(&new).unwrap();
        }
        // Another engine's handle, as source or as local destination.
        let (theirs, td) = region(&b, 64);
        let refused = Never::default();
        let never = || refused.on_done();
        assert_eq!(
            a.submit_single_write(8, None, (&theirs, 0), (&td, 0), never()),
            Err(TransferError::ForeignRegion)
        );
        assert_eq!(
            a.submit_read(8, (&theirs, 0), (&td, 0), never()),
            Err(TransferError::ForeignRegion)
        );
        assert_eq!(a.dereg_mr(&theirs), Err(TransferError::ForeignRegion));
        refused.check(&a);
    });
}

/// With abort notices on, a barrier (or scatter) that fails for one of its
/// destinations must not tell the others, whose immediates all landed:
/// their expectations were met, and a notice arriving afterwards would
/// fail their next expectation on the immediate (the next step's
/// barrier) although nothing went wrong there.
#[test]
fn a_barrier_failing_at_one_peer_leaves_the_others_next_barrier_alone() {
    bounded(|| {
        let a = loopback_engine(2, LoopbackConfig::default(), true);
        let peers: Vec<(TransferEngine, MrDesc)> = (0..3)
            .map(|_| {
                let e = loopback_engine(2, LoopbackConfig::default(), true);
                let (_h, d) = region(&e, 64);
                (e, d)
            })
            .collect();
        let (src, _) = region(&a, 64);
        let mut bad = peers[2].1.clone();
        for n in &mut bad.nics {
            n.1 ^= 0x5a5a;
        }
        let good: Vec<MrDesc> = peers[..2].iter().map(|p| p.1.clone()).collect();
        for step in 0..2 {
            let arm = |imm: u32| -> Vec<_> {
                peers[..2]
                    .iter()
                    .map(|p| {
                        let (f, d) = flag();
                        p.0.expect_imm_count(imm, 1, d).unwrap();
                        f
                    })
                    .collect()
            };
            // Step 0: a barrier, with the third peer's key broken; step 1
            // the same with a scatter.
            let landed = arm(7);
            let (w, d) = flag();
            let mut dst = good.clone();
            dst.push(bad.clone());
            if step == 0 {
                a.submit_barrier(None, d, 7, &dst).unwrap();
            } else {
                let sd: Vec<ScatterDst> = dst
                    .iter()
                    .map(|dd| ScatterDst {
                        len: 8,
                        src: 0,
                        dst: dd.clone(),
                        dst_offset: 0,
                    })
                    .collect();
                a.submit_scatter(None, d, Some(7), &src, &sd).unwrap();
            }
            assert!(wait(&w).is_err());
            for f in &landed {
                assert_eq!(wait(f), Ok(0));
            }
            // Any notice has been delivered once a later barrier from the
            // same sender landed on both NICs of each good peer.
            let synced = arm(8);
            let (w, d) = flag();
            let mut twice = good.clone();
            twice.extend(good.iter().cloned());
            a.submit_barrier(None, d, 8, &twice).unwrap();
            wait(&w).unwrap();
            for f in &synced {
                assert_eq!(wait(f), Ok(0));
            }
            for p in &peers[..2] {
                assert_eq!(p.0.imm_count(8), 1);
                let (_, d) = flag();
                p.0.expect_imm_count(8, 1, d).unwrap();
            }
            // The next barrier among the good peers is met at both.
            let next = arm(7);
            let (w, d) = flag();
            a.submit_barrier(None, d, 7, &good).unwrap();
            wait(&w).unwrap();
            for f in &next {
                assert_eq!(
                    wait(f),
                    Ok(0),
                    "step {step}: a notice for the failed peer reached a good one"
                );
            }
        }
    });
}

/// Deadlines fire on a receiver with nothing else to do: its group-0
/// worker sleeps until the earliest of them (parked on loopback, in
/// `ppoll` on `tcp`), also in an engine of two groups whose arrivals are
/// counted by the other group's worker; cancelling one does not move the
/// others.
fn deadlines_fire_on_an_idle_receiver(rx: &TransferEngine) {
    let ledger = Ledger::default();
    let now = Instant::now();
    // Immediate 3 is cancelled at once: its deadline is far enough away
    // that a stalled machine cannot let it pass first.
    for (imm, ms) in [(1u32, 30u64), (2, 10), (3, 3_600_000), (4, 10)] {
        ledger
            .arm(rx, imm, 2, Some(now + Duration::from_millis(ms)))
            .unwrap();
    }
    assert!(rx.cancel_imm_count(3));
    ledger.settle();
    let armed = ledger.armed.lock().unwrap();
    for (imm, _, o) in armed.iter() {
        let got = o.result.lock().unwrap().clone().unwrap();
        if *imm == 3 {
            assert_eq!(got, Err(TransferError::ImmCancelled { imm: 3 }));
        } else {
            assert_eq!(
                got,
                Err(TransferError::ImmDeadline {
                    imm: *imm,
                    arrived: 0,
                    expected: 2
                })
            );
        }
    }
}

#[test]
fn deadlines_fire_on_idle_loopback_receivers() {
    bounded(|| {
        deadlines_fire_on_an_idle_receiver(&engine(1));
        let two_groups = TransferEngine::new(EngineConfig {
            groups: 2,
            nics_per_group: 2,
            ..EngineConfig::default()
        })
        .unwrap();
        deadlines_fire_on_an_idle_receiver(&two_groups);
    });
}

/// A single write delivers exactly `single_write_pieces(len, receiver
/// NICs)` arrivals, whatever the sender's NIC count, at every length
/// around the split boundaries, also from a shuffling, slow sender; and
/// the expectation met by them sees the write whole (each piece's
/// immediate comes after its data), before the sender's own completion
/// is waited for.
#[test]
fn single_writes_deliver_exactly_the_documented_arrivals() {
    bounded(|| {
        const K: u64 = rolex_engine::SPLIT_MIN;
        let lens = [
            1,
            K - 1,
            K,
            K + 1,
            2 * K - 1,
            2 * K,
            2 * K + 65,
            3 * K + 63,
            4 * K - 64,
            4 * K + 1,
            9 * K + 7,
        ];
        let max = 9 * K + 7;
        for shuffled in [false, true] {
            for sn in 1..=4 {
                let lb = if shuffled {
                    LoopbackConfig {
                        unordered: Some(Unordered {
                            seed: sn as u64,
                            window: 4,
                            writes_in_order: false,
                        }),
                        latency: Duration::from_micros(30),
                        ..LoopbackConfig::default()
                    }
                } else {
                    LoopbackConfig::default()
                };
                let a = loopback_engine(sn, lb, false);
                let (src, _) = region(&a, max);
                let all = pattern(max as usize, sn as u8 + 16 * shuffled as u8);
                src.write(0, &all).unwrap();
                for rn in 1..=4 {
                    let b = engine(rn);
                    let (dst, dd) = region(&b, max + 64);
                    for (i, &len) in lens.iter().enumerate() {
                        let imm = i as u32;
                        let pieces = rolex_engine::single_write_pieces(len, rn);
                        let what = format!("{sn} -> {rn} NICs, {len} bytes, shuffled {shuffled}");
                        // Nothing of an earlier write may pass for this one.
                        dst.write(64, &vec![0; len as usize]).unwrap();
                        let (fl, d) = flag();
                        b.expect_imm_count(imm, pieces, d).unwrap();
                        let (w, d) = flag();
                        a.submit_single_write(len, Some(imm), (&src, 0), (&dd, 64), d)
                            .unwrap();
                        assert_eq!(wait(&fl), Ok(0), "{what}");
                        assert!(
                            dst.to_vec(64, len as usize).unwrap() == all[..len as usize],
                            "{what}: data not whole when the expectation was met"
                        );
                        wait(&w).unwrap();
                        assert_eq!(b.imm_count(imm), 0, "{what}: more than {pieces} arrivals");
                    }
                }
            }
        }
    });
}

/// Control messages from eight threads on four engines into a receiver
/// with three buffers, on any of its NICs: each message is delivered once,
/// whole; a message too large for the buffers fails without using one up;
/// then the receiver dies and sends to it fail naming it.
#[test]
fn many_senders_share_a_few_receive_buffers_then_the_receiver_dies() {
    bounded(|| {
        let wait_long = LoopbackConfig {
            recv_wait: HANG,
            ..LoopbackConfig::default()
        };
        let rx = loopback_engine(2, LoopbackConfig::default(), false);
        let got: Arc<Mutex<HashMap<(u8, u16), usize>>> = Arc::default();
        let g = got.clone();
        // Counted, not asserted here: the callback thread catches panics.
        let torn = Arc::new(AtomicUsize::new(0));
        let t2 = torn.clone();
        rx.submit_recvs(64, 3, move |m| {
            if m.len() < 3 || m.len() != 3 + m[0] as usize {
                t2.fetch_add(1, SeqCst);
            }
            let key = (m[0], u16::from_le_bytes([m[1], m[2]]));
            *g.lock().unwrap().entry(key).or_default() += 1;
        })
        .unwrap();
        let addrs = rx.addresses(0).unwrap();
        let senders: Vec<Arc<TransferEngine>> = (0..4)
            .map(|i| {
                let lb = if i % 2 == 0 {
                    wait_long
                } else {
                    LoopbackConfig {
                        unordered: Some(Unordered {
                            seed: i as u64,
                            window: 4,
                            writes_in_order: false,
                        }),
                        ..wait_long
                    }
                };
                Arc::new(loopback_engine(1 + i % 2, lb, false))
            })
            .collect();
        const EACH: u16 = 60;
        let threads: Vec<_> = (0..8u8)
            .map(|t| {
                let tx = senders[t as usize % 4].clone();
                let addrs = addrs.clone();
                std::thread::spawn(move || {
                    let mut flags = Vec::new();
                    for seq in 0..EACH {
                        let mut m = vec![t, seq.to_le_bytes()[0], seq.to_le_bytes()[1]];
                        m.extend(std::iter::repeat_n(0xee, t as usize));
                        let (f, d) = flag();
                        tx.submit_send(&addrs[seq as usize % 2], &m, d).unwrap();
                        flags.push(f);
                        if flags.len() == 4 {
                            for f in flags.drain(..) {
                                wait(&f).unwrap();
                            }
                        }
                    }
                    for f in flags {
                        wait(&f).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (f, d) = flag();
        senders[0].submit_send(&addrs[1], &[0; 65], d).unwrap();
        assert!(matches!(
            wait(&f),
            Err(TransferError::MessageTooLarge {
                len: 65,
                buffer_len: 64,
                ..
            })
        ));
        until("every message's callback", || {
            got.lock().unwrap().values().sum::<usize>() >= 8 * EACH as usize
        });
        // All three buffers are back: three sends in flight at once land.
        let flags: Vec<_> = (0..3u16)
            .map(|i| {
                let (f, d) = flag();
                senders[1]
                    .submit_send(&addrs[0], &[9, i as u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], d)
                    .unwrap();
                f
            })
            .collect();
        for f in &flags {
            wait(f).unwrap();
        }
        until("the last three callbacks", || {
            got.lock().unwrap().values().sum::<usize>() >= 8 * EACH as usize + 3
        });
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 8 * EACH as usize + 3);
        assert!(got.values().all(|&n| n == 1), "a message delivered twice");
        assert_eq!(torn.load(SeqCst), 0, "a message arrived cut or padded");
        drop(got);
        drop(rx);
        let (f, d) = flag();
        senders[2].submit_send(&addrs[1], b"anyone?", d).unwrap();
        match wait(&f) {
            Err(TransferError::UnknownPeer { peer }) => assert_eq!(peer, addrs[1]),
            other => panic!("a send to a dead receiver: {other:?}"),
        }
    });
}

/// The source of paged writes with immediates is deregistered while
/// four threads keep them in flight on a slow sender, abort notices on:
/// a transfer that completed is met at the receiver, one that failed is
/// aborted there (none of its pieces can have landed the immediate it
/// lacked), and calls after the deregistration are refused at once.
#[test]
fn source_deregistered_under_paged_writes_aborts_exactly_the_failed_transfers() {
    bounded(|| {
        const PAGE: u64 = 512;
        const PAGES: u32 = 4;
        let lb = LoopbackConfig {
            latency: Duration::from_micros(300),
            ..LoopbackConfig::default()
        };
        let a = Arc::new(loopback_engine(2, lb, true));
        let b = Arc::new(loopback_engine(2, LoopbackConfig::default(), true));
        let (src, _) = region(&a, 64 * PAGE);
        let (_dst, dd) = region(&b, 64 * PAGE);
        let ledger = Arc::new(Ledger::default());
        let next_imm = Arc::new(AtomicU64::new(0));
        let outcomes: Arc<Mutex<HashMap<u32, Result<u64, TransferError>>>> = Arc::default();
        let started = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let (a, b, src, dd) = (a.clone(), b.clone(), src.clone(), dd.clone());
                let (ledger, next_imm, outcomes, started) = (
                    ledger.clone(),
                    next_imm.clone(),
                    outcomes.clone(),
                    started.clone(),
                );
                std::thread::spawn(move || loop {
                    let imm = next_imm.fetch_add(1, SeqCst) as u32;
                    ledger.arm(&b, imm, PAGES, None).unwrap();
                    let pages = Pages {
                        indices: (0..PAGES).map(|i| (t * PAGES + i) % 64).collect(),
                        stride: PAGE,
                        offset: 0,
                    };
                    let (f, d) = flag();
                    match a.submit_paged_writes(PAGE, Some(imm), (&src, &pages), (&dd, &pages), d) {
                        Ok(()) => {
                            started.fetch_add(1, SeqCst);
                            let r = wait(&f);
                            outcomes.lock().unwrap().insert(imm, r);
                        }
                        Err(TransferError::RegionDeregistered) => {
                            assert!(b.cancel_imm_count(imm));
                            outcomes
                                .lock()
                                .unwrap()
                                .insert(imm, Err(TransferError::RegionDeregistered));
                            return;
                        }
                        Err(e) => panic!("submit: {e}"),
                    }
                })
            })
            .collect();
        until("transfers in flight", || started.load(SeqCst) >= 40);
        a.dereg_mr(&src).unwrap();
        for t in threads {
            t.join().unwrap();
        }
        ledger.settle();
        let outcomes = outcomes.lock().unwrap();
        let (mut met, mut aborted) = (0, 0);
        for (imm, _, o) in ledger.armed.lock().unwrap().iter() {
            let got = o.result.lock().unwrap().clone().unwrap();
            match (&outcomes[imm], got) {
                (Ok(_), Ok(())) => met += 1,
                (
                    Err(TransferError::RegionDeregistered),
                    Err(TransferError::ImmCancelled { .. }),
                ) => {}
                (Err(_), Err(TransferError::SenderAborted { .. })) => aborted += 1,
                (sent, got) => panic!("imm {imm}: transfer {sent:?}, expectation {got:?}"),
            }
        }
        println!("{met} transfers met, {aborted} aborted by the deregistration");
        assert!(met >= 36);
    });
}

/// A sender that keeps writes in flight under a plug and then waits for
/// the receiver's expectation (not for its own writes): the writes the
/// plug held back must still be posted (the plug's promise: at the latest
/// with the group's next round), or the receiver waits forever.
fn plugged_sender_waiting_on_an_expectation(a: &TransferEngine, b: &TransferEngine) {
    let (src, _) = region(a, 64);
    let (_dst, dd) = region(b, 64 * 8);
    let (fl, d) = flag();
    b.expect_imm_count(7, 8, d).unwrap();
    let _plug = a.plug();
    let flags: Vec<_> = (0..8u64)
        .map(|i| {
            let (f, d) = flag();
            a.submit_single_write(64, Some(7), (&src, 0), (&dd, 64 * i), d)
                .unwrap();
            f
        })
        .collect();
    let r = fl.wait(Duration::from_secs(10));
    assert_eq!(
        r,
        Some(Ok(0)),
        "the receiver saw {} of 8 writes the plugged sender submitted",
        b.imm_count(7)
    );
    for f in &flags {
        wait(f).unwrap();
    }
}

#[test]
fn a_plugged_sender_waiting_on_an_expectation_still_posts_its_writes() {
    bounded(|| plugged_sender_waiting_on_an_expectation(&engine(1), &engine(1)));
}

/// Client channels keep doorbell batches in flight on a slow engine (and
/// one whose peer dies) while that engine is dropped from under them: each
/// batch returns (every operation with its own result) or is refused as a
/// whole with `EngineShutDown`, and never hangs.
#[test]
fn channels_in_flight_when_their_engine_or_peer_is_dropped() {
    bounded(|| {
        let lb = LoopbackConfig {
            latency: Duration::from_micros(200),
            ..LoopbackConfig::default()
        };
        let a = loopback_engine(2, lb, false);
        let b = engine(1);
        let (src, _) = region(&a, 4096);
        src.write(0, &pattern(4096, 3)).unwrap();
        let (_dst, dd) = region(&b, 4096);
        let ran = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let mut ch = a.channel().unwrap();
                let (src, dd, ran) = (src.clone(), dd.clone(), ran.clone());
                std::thread::spawn(move || {
                    let mut results = Vec::new();
                    loop {
                        let ops: Vec<_> = (0..8u64)
                            .flat_map(|i| {
                                [
                                    rolex_engine::BatchOp::Write {
                                        src: &src,
                                        src_offset: 64 * i,
                                        dst: &dd,
                                        dst_offset: 512 * t + 64 * i,
                                        len: 64,
                                        imm: Some(t as u32),
                                    },
                                    rolex_engine::BatchOp::Faa {
                                        dst: &dd,
                                        offset: 4088,
                                        add: 1,
                                    },
                                ]
                            })
                            .collect();
                        match ch.run(&ops, &mut results) {
                            Ok(()) => assert_eq!(results.len(), ops.len()),
                            Err(TransferError::EngineShutDown) => return,
                            Err(e) => panic!("channel run: {e}"),
                        }
                        ran.fetch_add(1, SeqCst);
                    }
                })
            })
            .collect();
        until("batches to run", || ran.load(SeqCst) >= 30);
        // The peer dies first: batches keep returning, with errors.
        drop(b);
        let seen = ran.load(SeqCst);
        until("batches after the peer died", || {
            ran.load(SeqCst) >= seen + 6
        });
        drop(a);
        for t in threads {
            t.join().unwrap();
        }
    });
}

/// A paged write to a 2-NIC receiver whose second NIC does not know the
/// key (pages alternate NICs): the pages through the first NIC land, the
/// others fail at the target; with abort notices the receiver's
/// expectation is aborted once, and its next one on the immediate, for a
/// good transfer, is met (on top of the pages the failed one left).
fn paged_write_half_refused_at_the_target(a: &TransferEngine, b: &TransferEngine) {
    const PAGE: u64 = 1024;
    // From the sender's last domain group (its own worker and NICs).
    let (src, _) = a
        .alloc_mr_in(a.groups() - 1, 16 * PAGE, rolex_engine::Access::all())
        .unwrap();
    src.write(0, &pattern(16 * PAGE as usize, 4)).unwrap();
    let (_dst, dd) = region(b, 16 * PAGE);
    let mut half = dd.clone();
    half.nics[1].1 ^= 0x5a5a;
    let pages = Pages {
        indices: (0..8).collect(),
        stride: PAGE,
        offset: 0,
    };
    let (fl, d) = flag();
    b.expect_imm_count(3, 8, d).unwrap();
    let (w, d) = flag();
    a.submit_paged_writes(PAGE, Some(3), (&src, &pages), (&half, &pages), d)
        .unwrap();
    assert!(matches!(wait(&w), Err(TransferError::Protection { .. })));
    assert_eq!(wait(&fl), Err(TransferError::SenderAborted { imm: 3 }));
    // Pages after the notice, on both NICs: any other notice came first
    // (per NIC, one sender's posts are delivered in order here).
    let (fl, d) = flag();
    b.expect_imm_count(4, 8, d).unwrap();
    let (w, d) = flag();
    a.submit_paged_writes(PAGE, Some(4), (&src, &pages), (&dd, &pages), d)
        .unwrap();
    wait(&w).unwrap();
    wait(&fl).unwrap();
    let left = b.imm_count(3);
    assert!(left <= 8);
    let (fl, d) = flag();
    b.expect_imm_count(3, left + 8, d).unwrap();
    let (w, d) = flag();
    a.submit_paged_writes(PAGE, Some(3), (&src, &pages), (&dd, &pages), d)
        .unwrap();
    wait(&w).unwrap();
    assert_eq!(wait(&fl), Ok(0));
}

#[test]
fn a_paged_write_half_refused_at_the_target_aborts_once() {
    bounded(|| {
        paged_write_half_refused_at_the_target(
            &loopback_engine(2, LoopbackConfig::default(), true),
            &loopback_engine(2, LoopbackConfig::default(), true),
        );
        let two_groups = TransferEngine::new(EngineConfig {
            groups: 2,
            nics_per_group: 2,
            abort_notices: true,
            ..EngineConfig::default()
        })
        .unwrap();
        paged_write_half_refused_at_the_target(
            &two_groups,
            &loopback_engine(2, LoopbackConfig::default(), true),
        );
    });
}

/// A receiver with many callback expectations armed is dropped while
/// four threads stream pages with immediates into it (on loopback the
/// immediates are counted on the senders' threads, racing with the drop):
/// every expectation's callback still runs exactly once, met or
/// `EngineShutDown`, and the senders see their writes fail, not hang.
#[test]
fn a_receiver_dropped_under_streaming_writes_fires_every_expectation_once() {
    bounded(|| {
        for round in 0..10u64 {
            let rx = engine(2);
            let (_dst, dd) = region(&rx, 64 * 64);
            let ledger = Ledger::default();
            let mut rng = Rng(round + 1);
            for imm in 0..32u32 {
                ledger
                    .arm(&rx, imm, 1 + rng.below(40) as u32, None)
                    .unwrap();
            }
            let stop = Arc::new(AtomicBool::new(false));
            let sent = Arc::new(AtomicUsize::new(0));
            let senders: Vec<_> = (0..4u32)
                .map(|t| {
                    let (dd, stop, sent) = (dd.clone(), stop.clone(), sent.clone());
                    std::thread::spawn(move || {
                        let tx = engine(1 + t as usize % 2);
                        let (src, _) = region(&tx, 64 * 64);
                        let mut i = 0u32;
                        while !stop.load(SeqCst) {
                            i += 1;
                            let pages = Pages {
                                indices: vec![i % 64, (i + 1) % 64],
                                stride: 64,
                                offset: 0,
                            };
                            let (f, d) = flag();
                            tx.submit_paged_writes(
                                64,
                                Some((i + t) % 32),
                                (&src, &pages),
                                (&dd, &pages),
                                d,
                            )
                            .unwrap();
                            if wait(&f).is_ok() {
                                sent.fetch_add(1, SeqCst);
                            }
                        }
                    })
                })
                .collect();
            until("writes to land", || sent.load(SeqCst) >= 50);
            drop(rx);
            ledger.settle();
            for (imm, _, o) in ledger.armed.lock().unwrap().iter() {
                let got = o.result.lock().unwrap().clone().unwrap();
                assert!(
                    matches!(got, Ok(()) | Err(TransferError::EngineShutDown)),
                    "imm {imm}: {got:?}"
                );
            }
            stop.store(true, SeqCst);
            for t in senders {
                t.join().unwrap();
            }
        }
    });
}

/// An engine that is its own peer (prefill and decode on one host): paged
/// writes with an immediate into its own region, a barrier to a group
/// holding itself, a message to its own receive buffers, one-sided reads
/// and atomics on its own words — all complete, each once, with the data.
fn talks_to_itself(e: &TransferEngine) {
    let (mr, desc) = region(e, 8192 + 64);
    mr.write(0, &pattern(4096, 12)).unwrap();
    let pages = |first: u32| Pages {
        indices: (first..first + 4).collect(),
        stride: 1024,
        offset: 0,
    };
    let (fl, d) = flag();
    e.expect_imm_count(1, 4, d).unwrap();
    let (w, d) = flag();
    e.submit_paged_writes(1024, Some(1), (&mr, &pages(0)), (&desc, &pages(4)), d)
        .unwrap();
    assert_eq!(wait(&fl), Ok(0));
    wait(&w).unwrap();
    assert!(mr.to_vec(4096, 4096).unwrap() == pattern(4096, 12));
    let g = e.add_peer_group(vec![e.main_address()]).unwrap();
    let (fl, d) = flag();
    e.expect_imm_count(2, 1, d).unwrap();
    let (w, d) = flag();
    e.submit_barrier(Some(g), d, 2, std::slice::from_ref(&desc))
        .unwrap();
    wait(&w).unwrap();
    assert_eq!(wait(&fl), Ok(0));
    let (tx, rx) = std::sync::mpsc::channel();
    let tx = Mutex::new(tx);
    e.submit_recvs(16, 1, move |m| tx.lock().unwrap().send(m.to_vec()).unwrap())
        .unwrap();
    let (w, d) = flag();
    e.submit_send(&e.main_address(), b"to myself", d).unwrap();
    wait(&w).unwrap();
    assert_eq!(rx.recv_timeout(HANG).unwrap(), b"to myself");
    let (f, d) = common::vflag();
    e.submit_faa((&desc, 8192), 5, d).unwrap();
    assert_eq!(wait(&f), Ok(0));
    let (f, d) = common::vflag();
    e.submit_cas((&desc, 8192), 5, 9, d).unwrap();
    assert_eq!(wait(&f), Ok(5));
    let (w, d) = flag();
    e.submit_read(8, (&mr, 8200), (&desc, 8192), d).unwrap();
    wait(&w).unwrap();
    assert_eq!(mr.load_u64(8200).unwrap(), 9);
}

#[test]
fn an_engine_talks_to_itself() {
    bounded(|| {
        talks_to_itself(&engine(1));
        talks_to_itself(&engine(3));
        talks_to_itself(&loopback_engine(
            2,
            LoopbackConfig {
                unordered: Some(Unordered {
                    seed: 1,
                    window: 4,
                    writes_in_order: false,
                }),
                latency: Duration::from_micros(20),
                ..LoopbackConfig::default()
            },
            true,
        ));
    });
}

/// A sender dies with its paged writes in flight (a slow NIC): its own
/// flag fails with `EngineShutDown`, and the receiver, which cannot be
/// told (no notice comes from a dead sender), ends its expectation at its
/// deadline naming the pages that did land — which stay counted — or had
/// it met if every page landed first.
#[test]
fn a_sender_dying_mid_transfer_ends_the_receivers_wait_at_its_deadline() {
    bounded(|| {
        const PAGES: u32 = 16;
        let b = loopback_engine(2, LoopbackConfig::default(), true);
        let (_dst, dd) = region(&b, 64 * u64::from(PAGES));
        for round in 0..2u32 {
            let lb = LoopbackConfig {
                latency: Duration::from_micros(200),
                bandwidth_gbps: Some(0.05),
                ..LoopbackConfig::default()
            };
            let a = loopback_engine(2, lb, true);
            let (src, _) = region(&a, 64 * u64::from(PAGES));
            let ledger = Ledger::default();
            ledger
                .arm(
                    &b,
                    round,
                    PAGES,
                    Some(Instant::now() + Duration::from_millis(300)),
                )
                .unwrap();
            let pages = Pages {
                indices: (0..PAGES).collect(),
                stride: 64,
                offset: 0,
            };
            let (w, d) = flag();
            a.submit_paged_writes(64, Some(round), (&src, &pages), (&dd, &pages), d)
                .unwrap();
            drop(a);
            let sent = wait(&w);
            ledger.settle();
            let got = ledger.armed.lock().unwrap()[0]
                .2
                .result
                .lock()
                .unwrap()
                .clone();
            match (sent, got.unwrap()) {
                (Ok(_), Ok(())) => {}
                (Err(TransferError::EngineShutDown), Ok(())) => {}
                (
                    Err(TransferError::EngineShutDown),
                    Err(TransferError::ImmDeadline {
                        imm,
                        arrived,
                        expected,
                    }),
                ) => {
                    assert_eq!((imm, expected), (round, PAGES));
                    assert!(arrived < PAGES);
                    assert_eq!(
                        b.imm_count(round),
                        arrived,
                        "the pages that landed stay counted"
                    );
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
    });
}

/// Four threads scatter to three peers while one peer deregisters the
/// destination region and registers a new one in its place: every scatter
/// notifies once; those that fail name that peer's key as unknown; the
/// new region (likely at the same address) never receives a byte through
/// the stale descriptor.
fn destination_deregistered_under_concurrent_scatters(
    make: impl Fn() -> TransferEngine,
    key_error: impl Fn(&TransferError, &[rolex_engine::NetAddr]) -> bool + Send + Sync + 'static,
) {
    let key_error = Arc::new(key_error);
    let a = Arc::new(make());
    let peers: Vec<TransferEngine> = (0..3).map(|_| make()).collect();
    let regions: Vec<(rolex_engine::MrHandle, MrDesc)> =
        peers.iter().map(|p| region(p, 4096)).collect();
    let descs: Vec<MrDesc> = regions.iter().map(|r| r.1.clone()).collect();
    let victim_addrs = peers[1].addresses(0).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    // Threads whose scatter landed once (their slice of every peer's
    // region written), before the deregistration.
    let landed = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (a, descs, stop, done, failed, victim_addrs, key_error, landed) = (
                a.clone(),
                descs.clone(),
                stop.clone(),
                done.clone(),
                failed.clone(),
                victim_addrs.clone(),
                key_error.clone(),
                landed.clone(),
            );
            let mut first = true;
            std::thread::spawn(move || {
                let (src, _) = region(&a, 4096);
                src.write(0, &[0xab; 4096]).unwrap();
                while !stop.load(SeqCst) {
                    let dst: Vec<ScatterDst> = descs
                        .iter()
                        .map(|dd| ScatterDst {
                            len: 1024,
                            src: 0,
                            dst: dd.clone(),
                            dst_offset: 1024 * t,
                        })
                        .collect();
                    let (f, d) = flag();
                    a.submit_scatter(None, d, Some(3), &src, &dst).unwrap();
                    match wait(&f) {
                        Ok(_) if first => {
                            first = false;
                            landed.fetch_add(1, SeqCst);
                        }
                        Ok(_) => {}
                        Err(e) if key_error(&e, &victim_addrs) => {
                            failed.fetch_add(1, SeqCst);
                        }
                        Err(e) => panic!("scatter: {e:?}"),
                    }
                    done.fetch_add(1, SeqCst);
                }
            })
        })
        .collect();
    // Every thread's slice landed once: a thread started late would
    // otherwise meet only the stale descriptor, and write no peer.
    until("scatters to land", || {
        done.load(SeqCst) >= 40 && landed.load(SeqCst) == 4
    });
    peers[1].dereg_mr(&regions[1].0).unwrap();
    let fresh: Vec<_> = (0..4).map(|_| region(&peers[1], 4096)).collect();
    let seen = failed.load(SeqCst);
    until("scatters to the stale descriptor to fail", || {
        failed.load(SeqCst) >= seen + 20
    });
    stop.store(true, SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    for (h, _) in &fresh {
        assert_eq!(h.to_vec(0, 4096).unwrap(), vec![0; 4096]);
    }
    for (i, r) in regions.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert_eq!(r.0.to_vec(0, 4096).unwrap(), vec![0xab; 4096], "peer {i}");
    }
}

#[test]
fn a_destination_deregistered_under_concurrent_scatters_is_never_written_again() {
    bounded(|| {
        destination_deregistered_under_concurrent_scatters(
            || engine(2),
            |e, victim| {
                matches!(e, TransferError::Protection {
                    peer,
                    check: rolex_engine::ProtectionCheck::UnknownKey,
                    ..
                } if victim.contains(peer))
            },
        )
    });
}

/// The same over libfabric `tcp` in one process (skipped where libfabric
/// or its `tcp` provider is missing, as the other fabric tests are).
mod tcp {
    use super::*;
    use rolex_engine::domain::fabric::{probe, LibfabricConfig};

    fn usable() -> bool {
        match probe("tcp", Some("127.0.0.1")) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("skipped: libfabric tcp not usable here: {e}");
                false
            }
        }
    }

    pub(super) fn tcp_engine(nics: usize, abort_notices: bool) -> TransferEngine {
        TransferEngine::new(EngineConfig {
            nics_per_group: nics,
            fabric: Fabric::Libfabric(LibfabricConfig {
                op_timeout: Duration::from_secs(2),
                ..LibfabricConfig::new("tcp", Some("127.0.0.1"))
            }),
            pin_workers: false,
            abort_notices,
            ..EngineConfig::default()
        })
        .expect("tcp engine")
    }

    #[test]
    fn senders_while_expectations_are_cancelled_and_rearmed_count_exactly() {
        if !usable() {
            return;
        }
        bounded(|| {
            const IMMS: u32 = 3;
            const PAGE: u64 = 256;
            const SLOTS: u64 = 32;
            let rx = Arc::new(tcp_engine(2, false));
            let (_dst, dd) = region(&rx, SLOTS * PAGE);
            let senders: Vec<Arc<TransferEngine>> =
                (0..2).map(|i| Arc::new(tcp_engine(i + 1, false))).collect();
            let sent: Arc<Vec<AtomicU64>> =
                Arc::new((0..IMMS).map(|_| AtomicU64::new(0)).collect());
            let stop = Arc::new(AtomicBool::new(false));
            let ledger = Arc::new(Ledger::default());
            let controller = {
                let (rx, stop, ledger) = (rx.clone(), stop.clone(), ledger.clone());
                std::thread::spawn(move || {
                    let mut rng = Rng(0xfab);
                    let mut rounds = 0u64;
                    while !stop.load(SeqCst) || rounds < 100 {
                        rounds += 1;
                        let imm = rng.below(u64::from(IMMS)) as u32;
                        let deadline = (rng.below(3) == 0)
                            .then(|| Instant::now() + Duration::from_micros(rng.below(3000)));
                        if rng.below(3) < 2 {
                            match ledger.arm(&rx, imm, 1 + rng.below(8) as u32, deadline) {
                                Ok(()) | Err(TransferError::ImmAlreadyArmed { .. }) => {}
                                Err(e) => panic!("arming imm {imm}: {e}"),
                            }
                        } else {
                            rx.cancel_imm_count(imm);
                        }
                        std::thread::sleep(Duration::from_micros(100));
                    }
                })
            };
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let tx = senders[t % 2].clone();
                    let (dd, sent) = (dd.clone(), sent.clone());
                    std::thread::spawn(move || {
                        let mut rng = Rng(11 + t as u64);
                        let (src, _) = region(&tx, SLOTS * PAGE);
                        for round in 0..25u64 {
                            let imm = ((t as u64 + round) % u64::from(IMMS)) as u32;
                            let n = 1 + rng.below(6) as usize;
                            let pick = |rng: &mut Rng| -> Vec<u32> {
                                (0..n).map(|_| rng.below(SLOTS) as u32).collect()
                            };
                            let (sp, dp) = (
                                Pages {
                                    indices: pick(&mut rng),
                                    stride: PAGE,
                                    offset: 0,
                                },
                                Pages {
                                    indices: pick(&mut rng),
                                    stride: PAGE,
                                    offset: 0,
                                },
                            );
                            let (f, d) = flag();
                            if round % 3 == 0 {
                                // A single write, split over the receiver's
                                // NICs when large enough.
                                tx.submit_single_write(
                                    PAGE,
                                    Some(imm),
                                    (&src, 0),
                                    (&dd, PAGE * (t as u64)),
                                    d,
                                )
                                .unwrap();
                                wait(&f).unwrap();
                                sent[imm as usize].fetch_add(1, SeqCst);
                                continue;
                            }
                            tx.submit_paged_writes(PAGE, Some(imm), (&src, &sp), (&dd, &dp), d)
                                .unwrap();
                            wait(&f).unwrap();
                            sent[imm as usize].fetch_add(n as u64, SeqCst);
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            // Completion at the sender does not order the receiver's
            // arrivals on tcp: wait until every one is counted.
            let total: u64 = sent.iter().map(|s| s.load(SeqCst)).sum();
            until("every arrival at the receiver", || {
                rx.counters().total.imm_arrivals >= total
            });
            stop.store(true, SeqCst);
            controller.join().unwrap();
            for imm in 0..IMMS {
                rx.cancel_imm_count(imm);
            }
            ledger.settle();
            for imm in 0..IMMS {
                let sent = sent[imm as usize].load(SeqCst);
                let left = u64::from(rx.imm_count(imm));
                assert_eq!(ledger.consumed(imm) + left, sent, "imm {imm}");
            }
        });
    }

    #[test]
    fn one_failed_transfer_to_a_multi_nic_receiver_aborts_one_expectation() {
        if !usable() {
            return;
        }
        bounded(|| {
            let a = tcp_engine(2, true);
            let b = tcp_engine(2, true);
            let (src, _) = region(&a, 192);
            let (_dst, dd) = region(&b, 192);
            let (fl, d) = flag();
            b.expect_imm_count(5, 3, d).unwrap();
            let (w, d) = flag();
            a.submit_scatter(None, d, Some(5), &src, &two_good_one_bad(&dd))
                .unwrap();
            assert!(wait(&w).is_err());
            assert_eq!(wait(&fl), Err(TransferError::SenderAborted { imm: 5 }));
            // Whatever notices were sent have arrived once this scatter's
            // immediates, sent after them on both NICs, are counted.
            let before = b.counters().total.imm_arrivals;
            let (fl, d) = flag();
            b.expect_imm_count(6, 2, d).unwrap();
            let good: Vec<ScatterDst> = two_good_one_bad(&dd).into_iter().take(2).collect();
            let (w, d) = flag();
            a.submit_scatter(None, d, Some(6), &src, &good).unwrap();
            wait(&w).unwrap();
            wait(&fl).unwrap();
            until("the scatter's arrivals", || {
                b.counters().total.imm_arrivals >= before + 2
            });
            let left = b.imm_count(5);
            let (fl, d) = flag();
            b.expect_imm_count(5, left + 1, d).unwrap();
            let (w, d) = flag();
            a.submit_single_write(64, Some(5), (&src, 0), (&dd, 0), d)
                .unwrap();
            wait(&w).unwrap();
            assert_eq!(wait(&fl), Ok(0));
        });
    }

    #[test]
    fn deadlines_fire_on_an_idle_receiver() {
        if !usable() {
            return;
        }
        bounded(|| super::deadlines_fire_on_an_idle_receiver(&tcp_engine(2, false)));
    }

    #[test]
    fn a_plugged_sender_waiting_on_an_expectation_still_posts_its_writes() {
        if !usable() {
            return;
        }
        bounded(|| {
            super::plugged_sender_waiting_on_an_expectation(
                &tcp_engine(1, false),
                &tcp_engine(1, false),
            )
        });
    }

    #[test]
    fn a_paged_write_half_refused_at_the_target_aborts_once() {
        if !usable() {
            return;
        }
        bounded(|| {
            super::paged_write_half_refused_at_the_target(
                &tcp_engine(2, true),
                &tcp_engine(2, true),
            )
        });
    }

    /// Paged writes with an immediate at page sizes around `tcp;ofi_rxm`'s
    /// eager limit (pages packed into messages the target places): each
    /// page delivers exactly one arrival, after its data.
    #[test]
    fn paged_writes_around_the_message_size_count_each_page_once() {
        if !usable() {
            return;
        }
        bounded(|| {
            let a = tcp_engine(2, false);
            let b = tcp_engine(2, false);
            let max_page = 40_000u64;
            let slots = 20u32;
            let (src, _) = region(&a, max_page * u64::from(slots));
            let all = pattern((max_page * u64::from(slots)) as usize, 77);
            src.write(0, &all).unwrap();
            let (dst, dd) = region(&b, max_page * u64::from(slots));
            let mut imm = 0;
            for page in [1u64, 63, 4096, 16_300, 16_384, 16_385, 40_000] {
                for n in [1u32, 3, 17] {
                    imm += 1;
                    dst.write(0, &vec![0; (max_page * u64::from(slots)) as usize])
                        .unwrap();
                    // Source pages forwards, destination pages backwards.
                    let sp = Pages {
                        indices: (0..n).collect(),
                        stride: page,
                        offset: 0,
                    };
                    let dp = Pages {
                        indices: (0..n).rev().collect(),
                        stride: page,
                        offset: 0,
                    };
                    let (fl, d) = flag();
                    b.expect_imm_count(imm, n, d).unwrap();
                    let (w, d) = flag();
                    a.submit_paged_writes(page, Some(imm), (&src, &sp), (&dd, &dp), d)
                        .unwrap();
                    let what = format!("{n} pages of {page} bytes");
                    assert_eq!(wait(&fl), Ok(0), "{what}");
                    for i in 0..n as usize {
                        let s = sp.page_offset(i).unwrap() as usize;
                        let d = dp.page_offset(i).unwrap();
                        assert!(
                            dst.to_vec(d, page as usize).unwrap() == all[s..s + page as usize],
                            "{what}: page {i}"
                        );
                    }
                    wait(&w).unwrap();
                    assert_eq!(b.imm_count(imm), 0, "{what}: extra arrivals");
                }
            }
        });
    }

    #[test]
    fn an_engine_talks_to_itself() {
        if !usable() {
            return;
        }
        bounded(|| {
            super::talks_to_itself(&tcp_engine(1, false));
            super::talks_to_itself(&tcp_engine(2, true));
        });
    }

    /// Known failure, kept as a reproduction (run with `--ignored`): one
    /// late write to a key the target has deregistered (a freed KV block)
    /// breaks the `tcp;ofi_rxm` connection between the two engines, so
    /// writes in flight to the peer's regions that are still registered
    /// fail too (cancelled, then "not connected" until it reconnects):
    /// 160-190 of them in each of 3 rounds here, with four threads
    /// writing. Loopback fails only the stale write.
    #[test]
    #[ignore = "libfabric tcp: a write to a deregistered key breaks the connection (notes/engteam.md)"]
    fn one_write_to_a_deregistered_key_fails_no_other_write_to_that_peer() {
        if !usable() {
            return;
        }
        bounded(|| {
            let a = Arc::new(tcp_engine(1, false));
            let b = tcp_engine(1, false);
            let (_stable, sd) = region(&b, 4096);
            let (freed, fd) = region(&b, 4096);
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicUsize::new(0));
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let (a, sd, stop, done) = (a.clone(), sd.clone(), stop.clone(), done.clone());
                    std::thread::spawn(move || {
                        let (src, _) = region(&a, 512);
                        let mut failed = Vec::new();
                        while !stop.load(SeqCst) {
                            let (f, d) = flag();
                            a.submit_single_write(512, None, (&src, 0), (&sd, 512 * t), d)
                                .unwrap();
                            if let Err(e) = wait(&f) {
                                failed.push(e);
                            }
                            done.fetch_add(1, SeqCst);
                        }
                        failed
                    })
                })
                .collect();
            until("writes to the stable region", || done.load(SeqCst) >= 200);
            b.dereg_mr(&freed).unwrap();
            let (src, _) = region(&a, 512);
            let (f, d) = flag();
            a.submit_single_write(512, None, (&src, 0), (&fd, 0), d)
                .unwrap();
            assert!(wait(&f).is_err(), "the stale write fails");
            let seen = done.load(SeqCst);
            until("more writes to the stable region", || {
                done.load(SeqCst) >= seen + 400
            });
            stop.store(true, SeqCst);
            let failed: Vec<TransferError> = threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect();
            assert!(
                failed.is_empty(),
                "{} writes to a still-registered region failed, e.g. {}",
                failed.len(),
                failed[0]
            );
        });
    }

    /// A barrier to a peer that died fails, naming it, within the
    /// operation timeout (never hangs), and still reaches the living.
    #[test]
    fn a_barrier_to_a_dead_peer_fails_by_name() {
        if !usable() {
            return;
        }
        bounded(|| {
            let a = tcp_engine(1, false);
            let mut peers: Vec<(Option<TransferEngine>, MrDesc)> = (0..3)
                .map(|_| {
                    let e = tcp_engine(1, false);
                    let (_h, d) = region(&e, 64);
                    (Some(e), d)
                })
                .collect();
            let descs: Vec<MrDesc> = peers.iter().map(|p| p.1.clone()).collect();
            // Connect first: a barrier that lands everywhere.
            let (w, d) = flag();
            a.submit_barrier(None, d, 1, &descs).unwrap();
            wait(&w).unwrap();
            let dead = peers[1].0.as_ref().unwrap().addresses(0).unwrap();
            drop(peers[1].0.take());
            let landed: Vec<_> = peers
                .iter()
                .filter_map(|p| p.0.as_ref())
                .map(|p| {
                    let (f, d) = flag();
                    p.expect_imm_count(2, 1, d).unwrap();
                    f
                })
                .collect();
            let (w, d) = flag();
            a.submit_barrier(None, d, 2, &descs).unwrap();
            let e = wait(&w).expect_err("the dead peer fails the barrier");
            println!("barrier to a dead tcp peer: {e}");
            for f in &landed {
                assert_eq!(wait(f), Ok(0));
            }
            assert!(
                format!("{e}").contains(&format!("{}", dead[0])) || names_peer(&e, &dead),
                "{e:?} does not name the dead peer {}",
                dead[0]
            );
        });
    }
}
