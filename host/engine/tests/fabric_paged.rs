//! Paged writes and scatters over libfabric `tcp` (skipped where it is not
//! usable): the NIC chains the pages of one transfer that go to the same
//! peer and key into one post of up to the provider's iov limit (4 on
//! `tcp;ofi_rxm`); every page must still land at its own destination,
//! the transfer must complete once, and pages carrying an immediate must
//! each count one arrival. The writes of one post to one peer share the
//! delivery acknowledgement of the last (the domain's `cover` module): a
//! completion must still mean that every page of the transfer landed.
//!
//! Over `tcp` the pages of one transfer to one peer travel by default as
//! tagged messages that the target's domain places (the domain's `paged`
//! module); the tests run both paths where it matters, the message path
//! forced on and off ([`PagedMode`]).

mod common;

use common::*;
use rolex_engine::domain::fabric::{probe, LibfabricConfig, PagedMode};
use rolex_engine::*;

/// Both paths of paged writes over `tcp`.
const MODES: [PagedMode; 2] = [PagedMode::Off, PagedMode::On];

fn tcp_engine(nics: usize) -> TransferEngine {
    tcp_engine_with(nics, PagedMode::Auto)
}

fn tcp_engine_with(nics: usize, paged: PagedMode) -> TransferEngine {
    TransferEngine::new(EngineConfig {
        nics_per_group: nics,
        fabric: Fabric::Libfabric(LibfabricConfig {
            paged_by_message: paged,
            ..LibfabricConfig::new("tcp", Some("127.0.0.1"))
        }),
        pin_workers: false,
        ..EngineConfig::default()
    })
    .expect("tcp engine")
}

fn usable() -> bool {
    match probe("tcp", Some("127.0.0.1")) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            false
        }
    }
}

/// What `dst` must hold after copying page `i` of `sp` from `all` to page
/// `i` of `dp`, every page `page` bytes.
fn expected(all: &[u8], len: usize, page: u64, sp: &Pages, dp: &Pages) -> Vec<u8> {
    let mut expect = vec![0u8; len];
    for i in 0..sp.indices.len() {
        let s = sp.page_offset(i).unwrap() as usize;
        let d = dp.page_offset(i).unwrap() as usize;
        expect[d..d + page as usize].copy_from_slice(&all[s..s + page as usize]);
    }
    expect
}

/// Keeps `depth` single writes of `size` bytes in flight from `a`'s `src`
/// to `dst` (described by `dd`), `writes` in all, write `i` to slot
/// `i % depth` with the pattern `seed(i)`; each slot must hold exactly its
/// write's bytes when the write completes (delivery completion, design
/// §3), checked before the slot is reused and at the end.
fn pipelined_single_writes(
    a: &TransferEngine,
    (src, dst, dd): (&MrHandle, &MrHandle, &MrDesc),
    (depth, size): (usize, usize),
    writes: usize,
    seed: impl Fn(usize) -> u8,
) {
    let mut flags: Vec<Option<(std::sync::Arc<CompletionFlag>, u8)>> = vec![None; depth];
    let check = |slot: usize, f: &std::sync::Arc<CompletionFlag>, seed: u8| {
        wait(f).unwrap();
        let got = dst.to_vec((slot * size) as u64, size).unwrap();
        assert!(
            got == pattern(size, seed),
            "slot {slot} did not hold write {seed} when it completed"
        );
    };
    for i in 0..writes {
        let slot = i % depth;
        if let Some((f, seed)) = flags[slot].take() {
            check(slot, &f, seed);
        }
        let seed = seed(i);
        src.write((slot * size) as u64, &pattern(size, seed))
            .unwrap();
        let (f, done) = flag();
        let off = (slot * size) as u64;
        a.submit_single_write(size as u64, None, (src, off), (dd, off), done)
            .unwrap();
        flags[slot] = Some((f, seed));
    }
    for (slot, entry) in flags.iter_mut().enumerate() {
        if let Some((f, seed)) = entry.take() {
            check(slot, &f, seed);
        }
    }
}

#[test]
fn chained_pages_each_land_at_their_own_destination() {
    if !usable() {
        return;
    }
    bounded(|| {
        for (nics, mode) in [1, 2].into_iter().flat_map(|n| MODES.map(|m| (n, m))) {
            let a = tcp_engine_with(nics, mode);
            let b = tcp_engine(nics);
            let len = 256 * 1024;
            let (src, _) = region(&a, len);
            let all = pattern(len as usize, 9);
            src.write(0, &all).unwrap();
            // Page counts around the chain length (4): partial chains,
            // whole ones, and one page alone.
            for n in [1u32, 2, 3, 4, 5, 7, 8, 9, 16, 17] {
                let (dst, dd) = region(&b, len);
                let page = 1000u64;
                let sp = Pages {
                    indices: (0..n).map(|i| (i * 7 + 3) % 61).collect(),
                    stride: 1024,
                    offset: 5,
                };
                let dp = Pages {
                    indices: (0..n).rev().map(|i| i * 3).collect(),
                    stride: 1100,
                    offset: 64,
                };
                let (f, done) = flag();
                a.submit_paged_writes(page, None, (&src, &sp), (&dd, &dp), done)
                    .unwrap();
                wait(&f).unwrap();
                assert_eq!(
                    dst.to_vec(0, len as usize).unwrap(),
                    expected(&all, len as usize, page, &sp, &dp),
                    "{n} pages over {nics} NIC(s), {mode:?}"
                );
            }
            let c = a.counters().total;
            assert_eq!(c.errors, 0);
            assert_eq!(c.writes, 72, "one counted write per page");
            assert_eq!(c.paged_by_message > 0, mode == PagedMode::On, "{c:?}");
        }
    });
}

#[test]
fn pages_with_an_immediate_each_count_one_arrival() {
    if !usable() {
        return;
    }
    bounded(|| {
        for mode in MODES {
            let a = tcp_engine_with(1, mode);
            let b = tcp_engine(1);
            let len = 64 * 1024;
            let (src, _) = region(&a, len);
            let (dst, dd) = region(&b, len);
            let all = pattern(len as usize, 3);
            src.write(0, &all).unwrap();
            let n = 11u32;
            let sp = Pages {
                indices: (0..n).collect(),
                stride: 2048,
                offset: 0,
            };
            let dp = Pages {
                indices: (0..n).map(|i| n - 1 - i).collect(),
                stride: 4096,
                offset: 8,
            };
            let (landed, arrived) = flag();
            b.expect_imm_count(0x51, n, arrived).unwrap();
            let (f, done) = flag();
            a.submit_paged_writes(2048, Some(0x51), (&src, &sp), (&dd, &dp), done)
                .unwrap();
            wait(&f).unwrap();
            wait(&landed).unwrap();
            assert_eq!(b.imm_count(0x51), 0, "exactly {n} arrivals were consumed");
            assert_eq!(
                dst.to_vec(0, len as usize).unwrap(),
                expected(&all, len as usize, 2048, &sp, &dp)
            );
            // Several transfers in flight, each with its own immediate and
            // expectation: each expectation fires once, when its transfer's
            // pages have all arrived, and no arrival is left over.
            let imms: Vec<u32> = (0..8).map(|t| 0x100 + t).collect();
            let mut fired = Vec::new();
            let mut done = Vec::new();
            for &imm in &imms {
                let (landed, arrived) = flag();
                b.expect_imm_count(imm, n, arrived).unwrap();
                fired.push(landed);
                let (f, d) = flag();
                a.submit_paged_writes(2048, Some(imm), (&src, &sp), (&dd, &dp), d)
                    .unwrap();
                done.push(f);
            }
            for (f, landed) in done.iter().zip(&fired) {
                wait(f).unwrap();
                wait(landed).unwrap();
            }
            for &imm in &imms {
                assert_eq!(b.imm_count(imm), 0, "{mode:?}: {imm:#x} left arrivals over");
            }
            assert_eq!(b.counters().total.imm_arrivals, u64::from(n) * 9);
            assert_eq!(
                a.counters().total.paged_by_message > 0,
                mode == PagedMode::On
            );
        }
    });
}

#[test]
fn a_scatter_to_several_peers_lands_whole() {
    if !usable() {
        return;
    }
    bounded(|| {
        let a = tcp_engine(1);
        let peers: Vec<_> = (0..3).map(|_| tcp_engine(1)).collect();
        let (src, _) = region(&a, 3 * 4096);
        let all = pattern(3 * 4096, 7);
        src.write(0, &all).unwrap();
        let regions: Vec<_> = peers.iter().map(|p| region(p, 8192)).collect();
        let dsts: Vec<ScatterDst> = regions
            .iter()
            .enumerate()
            .map(|(i, (_, d))| ScatterDst {
                len: 4096,
                src: i as u64 * 4096,
                dst: d.clone(),
                dst_offset: 100,
            })
            .collect();
        let (f, done) = flag();
        a.submit_scatter(None, done, None, &src, &dsts).unwrap();
        wait(&f).unwrap();
        for (i, (h, _)) in regions.iter().enumerate() {
            let got = h.to_vec(100, 4096).unwrap();
            assert_eq!(got, all[i * 4096..(i + 1) * 4096], "peer {i}");
        }
    });
}

#[test]
fn pipelined_large_writes_are_whole_when_they_complete() {
    if !usable() {
        return;
    }
    // 32 writes of 256 KiB in flight, each to its own slot, every write a
    // new pattern: when a write completes its slot must hold exactly its
    // bytes (delivery completion, design §3), before the slot is reused.
    bounded(|| {
        let a = tcp_engine(1);
        let b = tcp_engine(1);
        let (depth, size) = (32usize, 256 * 1024usize);
        let (src, _) = region(&a, (depth * size) as u64);
        let (dst, dd) = region(&b, (depth * size) as u64);
        pipelined_single_writes(&a, (&src, &dst, &dd), (depth, size), 4 * depth, |i| i as u8);
    });
}

#[test]
fn a_paged_transfer_asks_one_acknowledgement_per_nic() {
    if !usable() {
        return;
    }
    // 16 pages over one NIC: 4 chained posts of 4 pages, of which only the
    // last asks the target to acknowledge delivery (or, by message, one
    // or two messages the target acknowledges); the data of all 16 is in
    // place when the transfer completes.
    bounded(|| {
        for mode in MODES {
            let a = tcp_engine_with(1, mode);
            let b = tcp_engine(1);
            let len = 64 * 1024;
            let (src, _) = region(&a, len);
            let all = pattern(len as usize, 21);
            src.write(0, &all).unwrap();
            let sp = Pages {
                indices: (0..16).collect(),
                stride: 1024,
                offset: 0,
            };
            let dp = Pages {
                indices: (0..16).map(|i| 15 - i).collect(),
                stride: 2048,
                offset: 16,
            };
            for round in 0..5u64 {
                let (dst, dd) = region(&b, len);
                let before = a.counters().total;
                let (f, done) = flag();
                a.submit_paged_writes(1024, None, (&src, &sp), (&dd, &dp), done)
                    .unwrap();
                wait(&f).unwrap();
                assert_eq!(
                    dst.to_vec(0, len as usize).unwrap(),
                    expected(&all, len as usize, 1024, &sp, &dp),
                    "round {round}"
                );
                let c = a.counters().total.since(&before);
                assert_eq!((c.writes, c.doorbells), (16, 1));
                if mode == PagedMode::Off {
                    assert_eq!(c.delivery_acks, 1, "one acknowledgement for 4 posts");
                    assert_eq!(c.paged_by_message, 0);
                } else {
                    // By message: no one-sided write, one message per
                    // provider buffer (16 KiB of pages and a header: two).
                    assert_eq!(c.delivery_acks, 0);
                    assert!((1..=2).contains(&c.paged_by_message), "{c:?}");
                }
            }
            assert_eq!(a.counters().total.errors, 0);
        }
    });
}

#[test]
fn pipelined_paged_writes_are_whole_when_they_complete() {
    if !usable() {
        return;
    }
    // 32 paged writes of 16 x 1 KiB in flight from one thread, each to its
    // own slot with a new pattern per round, and 64 more queued at once as
    // callbacks (the worker posts those several per call, so writes of
    // different transfers share one acknowledgement): every transfer's
    // pages hold its bytes when it completes.
    bounded(|| {
        for mode in MODES {
            let a = tcp_engine_with(1, mode);
            let b = tcp_engine(1);
            let (depth, page, pages) = (32usize, 1024usize, 16u32);
            let size = page * pages as usize;
            let (src, _) = region(&a, (depth * size) as u64);
            let (dst, dd) = region(&b, (depth * size) as u64);
            let slot_pages = |slot: usize| Pages {
                indices: (0..pages)
                    .map(|i| (slot as u32) * pages + (i * 5) % pages)
                    .collect(),
                stride: page as u64,
                offset: 0,
            };
            let write_slot = |slot: usize, seed: u8| {
                let sp = slot_pages(slot);
                for i in 0..pages as usize {
                    let at = sp.page_offset(i).unwrap();
                    src.write(at, &pattern(page, seed.wrapping_add(i as u8)))
                        .unwrap();
                }
            };
            let holds = |slot: usize, seed: u8| {
                let sp = slot_pages(slot);
                (0..pages as usize).all(|i| {
                    let at = sp.page_offset(i).unwrap();
                    dst.to_vec(at, page).unwrap() == pattern(page, seed.wrapping_add(i as u8))
                })
            };
            let mut flags: Vec<Option<(std::sync::Arc<CompletionFlag>, u8)>> = vec![None; depth];
            for i in 0..4 * depth {
                let slot = i % depth;
                if let Some((f, seed)) = flags[slot].take() {
                    wait(&f).unwrap();
                    assert!(
                        holds(slot, seed),
                        "slot {slot} did not hold transfer {seed}"
                    );
                }
                let seed = (i * 17) as u8;
                write_slot(slot, seed);
                let (f, done) = flag();
                let p = slot_pages(slot);
                a.submit_paged_writes(page as u64, None, (&src, &p), (&dd, &p), done)
                    .unwrap();
                flags[slot] = Some((f, seed));
            }
            for (slot, entry) in flags.iter_mut().enumerate() {
                if let Some((f, seed)) = entry.take() {
                    wait(&f).unwrap();
                    assert!(
                        holds(slot, seed),
                        "slot {slot} did not hold transfer {seed}"
                    );
                }
            }
            // Callbacks: queued for the worker, checked as they complete.
            let (tx, rx) = std::sync::mpsc::channel::<bool>();
            let dst = std::sync::Arc::new(dst);
            for i in 0..2 * depth {
                let slot = i % depth;
                if i == depth {
                    // Reuse the slots only once the first half completed.
                    for _ in 0..depth {
                        assert!(rx.recv_timeout(HANG).unwrap(), "landed when completed");
                    }
                }
                let seed = (200 + i) as u8;
                write_slot(slot, seed);
                let p = slot_pages(slot);
                let (tx, dst) = (tx.clone(), dst.clone());
                let check = slot_pages(slot);
                let done = OnDone::callback(move |r| {
                    let ok = r.is_ok()
                        && (0..pages as usize).all(|k| {
                            let at = check.page_offset(k).unwrap();
                            dst.to_vec(at, page).unwrap()
                                == pattern(page, seed.wrapping_add(k as u8))
                        });
                    let _ = tx.send(ok);
                });
                a.submit_paged_writes(page as u64, None, (&src, &p), (&dd, &p), done)
                    .unwrap();
            }
            for _ in 0..depth {
                assert!(
                    rx.recv_timeout(HANG).unwrap(),
                    "a transfer completed before its pages landed"
                );
            }
            let c = a.counters().total;
            assert_eq!(c.errors, 0);
            if mode == PagedMode::Off {
                // One peer, one NIC: one acknowledgement per post, however
                // many transfers it carried.
                assert_eq!(c.delivery_acks, c.doorbells, "{c:?}");
            } else {
                assert_eq!(c.delivery_acks, 0, "{c:?}");
                assert!(c.paged_by_message >= 6 * depth as u64, "{c:?}");
            }
        }
    });
}

#[test]
fn single_writes_sharing_a_post_are_whole_when_they_complete() {
    if !usable() {
        return;
    }
    // 32 single writes of 64 KiB in flight from one thread under a plug,
    // each to its own slot with a new pattern per round: the plug posts
    // resubmissions together and the NIC chains writes of different
    // transfers to the same peer and key into one post (they complete
    // with it); each slot must hold its write's bytes when it completes.
    // Then the same with callbacks, which the worker posts several at once,
    // checked as they complete (a write completed with its own post
    // instead of the carrying post's acknowledgement fails here).
    bounded(|| {
        let a = tcp_engine(1);
        let b = tcp_engine(1);
        let (depth, size) = (32usize, 64 * 1024usize);
        let (src, _) = region(&a, (depth * size) as u64);
        let (dst, dd) = region(&b, (depth * size) as u64);
        let plug = a.plug();
        pipelined_single_writes(&a, (&src, &dst, &dd), (depth, size), 16 * depth, |i| {
            (i * 7) as u8
        });
        drop(plug);
        // Callbacks, queued for the worker (posted several per call),
        // checked at the moment they complete.
        let (tx, rx) = std::sync::mpsc::channel::<bool>();
        let dst = std::sync::Arc::new(dst);
        for round in 0..4 {
            for slot in 0..depth {
                let seed = (100 + round * depth + slot) as u8;
                src.write((slot * size) as u64, &pattern(size, seed))
                    .unwrap();
                let (tx, dst) = (tx.clone(), dst.clone());
                let off = (slot * size) as u64;
                let done = OnDone::callback(move |r| {
                    let ok = r.is_ok() && dst.to_vec(off, size).unwrap() == pattern(size, seed);
                    let _ = tx.send(ok);
                });
                a.submit_single_write(size as u64, None, (&src, off), (&dd, off), done)
                    .unwrap();
            }
            for _ in 0..depth {
                assert!(
                    rx.recv_timeout(HANG).unwrap(),
                    "a write completed before it landed"
                );
            }
        }
        let c = a.counters().total;
        assert_eq!((c.errors, c.writes), (0, 20 * depth as u64));
    });
}

/// Pages the target refuses (module `paged`): a descriptor forged longer
/// than the region, one forged writable, and one of a region deregistered
/// since. The transfer fails with the check that refused it, and nothing
/// of it is written, also not its pages that were in range.
#[test]
fn refused_pages_fail_the_transfer_and_write_nothing() {
    if !usable() {
        return;
    }
    bounded(|| {
        let a = tcp_engine_with(1, PagedMode::On);
        let b = tcp_engine(1);
        let (src, _) = region(&a, 64 * 1024);
        src.write(0, &pattern(64 * 1024, 5)).unwrap();
        let sp = Pages {
            indices: (0..4).collect(),
            stride: 1024,
            offset: 0,
        };
        let protection = |r: Result<u64, TransferError>| match r {
            Err(TransferError::Protection { check, .. }) => check,
            other => panic!("expected a protection error, got {other:?}"),
        };
        // Out of range: the region is 8 KiB, the forged descriptor says 64.
        let (dst, dd) = region(&b, 8 * 1024);
        let long = MrDesc {
            len: 64 * 1024,
            ..dd.clone()
        };
        let dp = Pages {
            indices: vec![0, 1, 2, 16],
            stride: 1024,
            offset: 0,
        };
        let (f, done) = flag();
        a.submit_paged_writes(1024, None, (&src, &sp), (&long, &dp), done)
            .unwrap();
        assert!(matches!(
            protection(wait(&f)),
            ProtectionCheck::OutOfBounds { len: 1024, .. }
        ));
        assert_eq!(dst.to_vec(0, 8 * 1024).unwrap(), vec![0u8; 8 * 1024]);
        // Not writable: a read-only region, its descriptor forged.
        let (ro, rod) = b.alloc_mr(8 * 1024, Access::REMOTE_READ).unwrap();
        let forged = MrDesc {
            access: Access::all(),
            ..rod.clone()
        };
        let in_range = Pages {
            indices: vec![0, 1, 2, 3],
            stride: 1024,
            offset: 0,
        };
        let (f, done) = flag();
        a.submit_paged_writes(1024, None, (&src, &sp), (&forged, &in_range), done)
            .unwrap();
        assert_eq!(
            protection(wait(&f)),
            ProtectionCheck::MissingRight(Access::REMOTE_WRITE)
        );
        assert_eq!(ro.to_vec(0, 8 * 1024).unwrap(), vec![0u8; 8 * 1024]);
        // Deregistered: its key is unknown at the target now.
        let (gone, gd) = region(&b, 8 * 1024);
        b.dereg_mr(&gone).unwrap();
        let (f, done) = flag();
        a.submit_paged_writes(1024, None, (&src, &sp), (&gd, &in_range), done)
            .unwrap();
        assert_eq!(protection(wait(&f)), ProtectionCheck::UnknownKey);
        // The path still works afterwards.
        let (f, done) = flag();
        a.submit_paged_writes(1024, None, (&src, &sp), (&dd, &in_range), done)
            .unwrap();
        wait(&f).unwrap();
        assert_eq!(
            dst.to_vec(0, 4096).unwrap(),
            pattern(64 * 1024, 5)[..4096].to_vec()
        );
        let c = a.counters().total;
        assert_eq!((c.errors, c.delivery_acks), (12, 0), "{c:?}");
    });
}

/// A target that never answers: a TCP listener that accepts nothing (the
/// kernel completes connections into its backlog, nobody speaks), named
/// by the `tcp` provider's address format (a `sockaddr_in`), and a
/// descriptor of `len` bytes there with a well-formed key. Keep the
/// listener while it is used.
fn silent_target(len: u64) -> (std::net::TcpListener, MrDesc) {
    use rolex_engine::domain::fabric::keys;
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = l.local_addr().expect("port").port().to_be_bytes();
    let mut sa = [0u8; 16];
    sa[..8].copy_from_slice(&[2, 0, port[0], port[1], 127, 0, 0, 1]);
    let addr = NetAddr::new(&sa).expect("address");
    // `tcp;ofi_rxm` addresses by offset: the key carries the base.
    let key = keys::offset_key(0x10_0000).expect("key");
    let desc = MrDesc::new(0x10_0000, len, Access::all(), &[(addr, key)]).expect("descriptor");
    (l, desc)
}

/// Failure paths of messages that are never acknowledged (the peer never
/// answers): each transfer fails once when the operation timeout passes,
/// with every page counted as an error; transfers still in flight when
/// the sending engine shuts down complete with `EngineShutDown`; and a
/// target engine that is gone fails them too. Nothing waits forever, and
/// the messages' buffers and bookkeeping go.
#[test]
fn unacknowledged_messages_fail_once() {
    if !usable() {
        return;
    }
    bounded(|| {
        let engine = |timeout| {
            TransferEngine::new(EngineConfig {
                fabric: Fabric::Libfabric(LibfabricConfig {
                    paged_by_message: PagedMode::On,
                    op_timeout: timeout,
                    ..LibfabricConfig::new("tcp", Some("127.0.0.1"))
                }),
                pin_workers: false,
                ..EngineConfig::default()
            })
            .expect("tcp engine")
        };
        let (_listener, desc) = silent_target(1 << 20);
        // Four transfers of 32 pages of 1 KiB, the last three posted
        // together under a plug: messages of 15 pages, some carrying
        // segments of two transfers (one completed by a message whose
        // send another transfer's segment carries).
        let pages = Pages {
            indices: (0..32).collect(),
            stride: 1024,
            offset: 0,
        };
        let four = |a: &TransferEngine, src: &MrHandle, dst: &MrDesc| {
            let plug = a.plug();
            let flags: Vec<_> = (0..4)
                .map(|_| {
                    let (f, done) = flag();
                    a.submit_paged_writes(1024, None, (src, &pages), (dst, &pages), done)
                        .unwrap();
                    f
                })
                .collect();
            drop(plug);
            flags
        };
        let timed_out = |r: &Result<u64, TransferError>| {
            matches!(
                r,
                Err(TransferError::Timeout { .. } | TransferError::PeerNotReady { .. })
            )
        };
        let a = engine(std::time::Duration::from_millis(500));
        let (src, _) = region(&a, 64 * 1024);
        for round in 0..2 {
            for f in four(&a, &src, &desc) {
                let r = wait(&f);
                assert!(timed_out(&r), "round {round}: {r:?}");
            }
        }
        let c = a.counters().total;
        assert_eq!((c.errors, c.writes), (256, 256), "{c:?}");
        // Alone each transfer is 3 messages (15, 15, 2 pages): fewer means
        // segments of several transfers shared messages.
        assert!(c.paged_by_message < 2 * 4 * 3, "{c:?}");
        drop(a);
        // Shutdown with transfers in flight.
        let a = engine(std::time::Duration::from_secs(30));
        let (src, _) = region(&a, 64 * 1024);
        let flags = four(&a, &src, &desc);
        drop(a);
        for f in &flags {
            let r = wait(f);
            assert!(matches!(r, Err(TransferError::EngineShutDown)), "{r:?}");
        }
        // A target engine that is gone: its region's transfers fail (the
        // provider refuses the connection until the timeout passes).
        let a = engine(std::time::Duration::from_millis(500));
        let (src, _) = region(&a, 64 * 1024);
        let b = tcp_engine(1);
        let (_, dd) = region(&b, 64 * 1024);
        drop(b);
        for f in four(&a, &src, &dd) {
            let r = wait(&f);
            assert!(timed_out(&r), "{r:?}");
        }
        assert_eq!(a.counters().total.errors, 128);
    });
}

/// Single writes of page size keep the one-sided path (chained into
/// posts of several transfers) even where paged writes go by message,
/// and each holds its bytes when it completes.
#[test]
fn single_writes_of_page_size_stay_one_sided() {
    if !usable() {
        return;
    }
    bounded(|| {
        let a = tcp_engine_with(1, PagedMode::On);
        let b = tcp_engine(1);
        let (depth, size) = (32usize, 4096usize);
        let (src, _) = region(&a, (depth * size) as u64);
        let (dst, dd) = region(&b, (depth * size) as u64);
        let plug = a.plug();
        pipelined_single_writes(&a, (&src, &dst, &dd), (depth, size), 8 * depth, |i| {
            (i * 3) as u8
        });
        drop(plug);
        let c = a.counters().total;
        assert_eq!((c.errors, c.paged_by_message), (0, 0), "{c:?}");
        assert!(c.delivery_acks > 0, "{c:?}");
    });
}
