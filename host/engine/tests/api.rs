//! One test (at least) per engine call, on the loopback NIC: data arrives
//! whole, completions fire once (callback and flag), counters count.

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use common::*;
use rolex_engine::*;

#[test]
fn main_address_and_addresses_are_distinct_per_engine() {
    let a = engine(2);
    let b = engine(2);
    assert_ne!(a.main_address(), b.main_address());
    let aa = a.addresses(0).unwrap();
    assert_eq!(aa.len(), 2);
    assert_eq!(aa[0], a.main_address());
    assert_ne!(aa[0], aa[1]);
    assert!(matches!(
        a.addresses(1),
        Err(TransferError::UnknownGroup { group: 1 })
    ));
}

#[test]
fn reg_mr_gives_one_key_per_nic_and_serialisable_desc() {
    let e = engine(4);
    let (h, d) = e
        .alloc_mr(4096, Access::REMOTE_WRITE | Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(d.nics.len(), 4);
    assert_eq!(d.len, 4096);
    assert_eq!(d.ptr, h.as_ptr() as u64);
    assert_eq!(d.access, Access::REMOTE_WRITE | Access::LOCAL_WRITE);
    let keys: std::collections::HashSet<u64> = d.nics.iter().map(|(_, k)| *k).collect();
    assert_eq!(keys.len(), 4, "keys differ per NIC");
    let bytes = rolex_core::wire::Wire::to_vec(&d).unwrap();
    assert_eq!(mr_desc_from_bytes(&bytes).unwrap(), d);
}

#[test]
fn reg_mr_of_caller_memory_and_dereg() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let mut buf = vec![0u64; 64];
        let ptr = std::ptr::NonNull::new(buf.as_mut_ptr() as *mut u8).unwrap();
        // SAFETY: `buf` outlives the registration: it is deregistered below
        // before `buf` is dropped, and not touched through Rust meanwhile.
        let (h, d) = unsafe { b.reg_mr(ptr, 512, Access::all()) }.unwrap();
        let (src, _) = region(&a, 512);
        src.write(0, &pattern(512, 3)).unwrap();
        let (f, done) = flag();
        a.submit_single_write(512, None, (&src, 0), (&d, 0), done)
            .unwrap();
        wait(&f).unwrap();
        assert_eq!(h.to_vec(0, 512).unwrap(), pattern(512, 3));
        b.dereg_mr(&h).unwrap();
        assert_eq!(b.dereg_mr(&h), Err(TransferError::RegionDeregistered));
        // The key no longer works and the memory is not touched.
        let (f, done) = flag();
        src.fill(0xee).unwrap();
        a.submit_single_write(8, None, (&src, 0), (&d, 0), done)
            .unwrap();
        assert!(matches!(
            wait(&f),
            Err(TransferError::Protection {
                check: ProtectionCheck::UnknownKey,
                ..
            })
        ));
        drop(h);
        let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
        assert_eq!(bytes, pattern(512, 3));
    });
}

#[test]
fn single_write_with_callback_and_flag() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let (src, _) = region(&a, 1000);
        let (dst, dd) = region(&b, 1000);
        src.write(0, &pattern(1000, 1)).unwrap();
        let (tx, rx) = mpsc::channel();
        a.submit_single_write(
            600,
            None,
            (&src, 100),
            (&dd, 300),
            OnDone::callback(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        rx.recv_timeout(HANG).unwrap().unwrap();
        assert_eq!(dst.to_vec(300, 600).unwrap(), pattern(1000, 1)[100..700]);
        assert_eq!(dst.to_vec(0, 300).unwrap(), vec![0; 300]);
        let (f, done) = flag();
        a.submit_single_write(8, None, (&src, 0), (&dd, 0), done)
            .unwrap();
        assert_eq!(wait(&f), Ok(0));
        let c = a.counters().total;
        assert_eq!(c.writes, 2);
        assert_eq!(c.bytes_written, 608);
        assert_eq!(c.rtts, 2);
    });
}

#[test]
fn write_with_imm_fires_expectation_after_data() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let (src, _) = region(&a, 256);
        let (dst, dd) = region(&b, 256);
        src.write(0, &pattern(256, 9)).unwrap();
        let (tx, rx) = mpsc::channel();
        let dst2 = dst.clone();
        b.expect_imm_count(
            7,
            1,
            OnDone::callback(move |r| {
                // The data is visible when the immediate is.
                tx.send((r, dst2.to_vec(0, 256).unwrap())).unwrap();
            }),
        )
        .unwrap();
        a.submit_single_write(256, Some(7), (&src, 0), (&dd, 0), OnDone::callback(|_| {}))
            .unwrap();
        let (r, data) = rx.recv_timeout(HANG).unwrap();
        r.unwrap();
        assert_eq!(data, pattern(256, 9));
        assert_eq!(b.imm_count(7), 0);
        assert_eq!(b.counters().total.imm_arrivals, 1);
        assert_eq!(a.counters().total.write_imms, 1);
    });
}

#[test]
fn imm_arrivals_before_expectation_count_and_rearm_works() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let (src, _) = region(&a, 64);
        let (_dst, dd) = region(&b, 64);
        for _ in 0..3 {
            let (f, done) = flag();
            a.submit_single_write(8, Some(42), (&src, 0), (&dd, 0), done)
                .unwrap();
            wait(&f).unwrap();
        }
        // Arrivals are counted by b's worker; wait for them to show.
        while b.imm_count(42) < 3 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let (f, done) = flag();
        b.expect_imm_count(42, 2, done).unwrap();
        wait(&f).unwrap();
        assert_eq!(b.imm_count(42), 1, "firing consumed two arrivals");
        let (f2, done) = flag();
        b.expect_imm_count(42, 2, done).unwrap();
        assert!(!f2.is_done());
        assert_eq!(
            b.expect_imm_count(42, 1, OnDone::callback(|_| {})),
            Err(TransferError::ImmAlreadyArmed { imm: 42 })
        );
        let (f, done) = flag();
        a.submit_single_write(8, Some(42), (&src, 0), (&dd, 0), done)
            .unwrap();
        wait(&f).unwrap();
        wait(&f2).unwrap();
        let (f3, done) = flag();
        b.expect_imm_count(43, 0, done).unwrap();
        wait(&f3).unwrap();
    });
}

#[test]
fn read_copies_remote_bytes() {
    bounded(|| {
        let a = engine(2);
        let b = engine(2);
        let (local, _) = region(&a, 512);
        let (remote, rd) = region(&b, 512);
        remote.write(0, &pattern(512, 4)).unwrap();
        for _ in 0..4 {
            let (f, done) = flag();
            a.submit_read(200, (&local, 10), (&rd, 50), done).unwrap();
            wait(&f).unwrap();
        }
        assert_eq!(local.to_vec(10, 200).unwrap(), pattern(512, 4)[50..250]);
        let c = a.counters();
        assert_eq!(c.total.reads, 4);
        assert_eq!(c.total.bytes_read, 800);
        // Reads rotate over both NICs.
        assert!(c.domains.iter().all(|d| d.counters.reads == 2));
        // A destination without LOCAL_WRITE is refused.
        let (ro, _) = a.alloc_mr(64, Access::REMOTE_READ).unwrap();
        assert_eq!(
            a.submit_read(8, (&ro, 0), (&rd, 0), OnDone::callback(|_| {})),
            Err(TransferError::LocalAccess {
                missing: Access::LOCAL_WRITE
            })
        );
    });
}

#[test]
fn cas_and_faa_return_old_values() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let (word, wd) = region(&b, 64);
        word.store_u64(8, 10).unwrap();
        let (f, v) = vflag();
        a.submit_faa((&wd, 8), 5, v).unwrap();
        assert_eq!(wait(&f), Ok(10));
        let (f, v) = vflag();
        a.submit_cas((&wd, 8), 15, 100, v).unwrap();
        assert_eq!(wait(&f), Ok(15));
        let (f, v) = vflag();
        a.submit_cas((&wd, 8), 15, 200, v).unwrap();
        assert_eq!(wait(&f), Ok(100), "failed CAS returns the current value");
        assert_eq!(word.load_u64(8).unwrap(), 100);
        let (tx, rx) = mpsc::channel();
        a.submit_faa(
            (&wd, 8),
            u64::MAX,
            OnValue::callback(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        assert_eq!(rx.recv_timeout(HANG).unwrap(), Ok(100));
        assert_eq!(word.load_u64(8).unwrap(), 99, "FAA wraps");
        let c = a.counters().total;
        assert_eq!((c.cas, c.faa, c.atomics), (2, 2, 4));
    });
}

#[test]
fn send_and_recv_pool_reuses_buffers() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        b.submit_recvs(64, 2, move |m| g.lock().unwrap().push(m.to_vec()))
            .unwrap();
        // More messages than buffers: buffers come back after each callback.
        for i in 0..10u8 {
            let (f, done) = flag();
            a.submit_send(&b.main_address(), &[i; 5], done).unwrap();
            wait(&f).unwrap();
        }
        while got.lock().unwrap().len() < 10 {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut msgs = got.lock().unwrap().clone();
        msgs.sort();
        assert_eq!(msgs, (0..10u8).map(|i| vec![i; 5]).collect::<Vec<_>>());
        // Too large for the posted buffers.
        let (f, done) = flag();
        a.submit_send(&b.main_address(), &[0; 65], done).unwrap();
        assert!(matches!(
            wait(&f),
            Err(TransferError::MessageTooLarge {
                len: 65,
                buffer_len: 64,
                ..
            })
        ));
        assert_eq!(b.counters().total.recvs, 10);
        assert_eq!(a.counters().total.sends, 11);
    });
}

#[test]
fn send_without_posted_receive_waits_then_fails() {
    bounded(|| {
        let a = TransferEngine::new(EngineConfig {
            fabric: Fabric::Loopback(LoopbackConfig {
                recv_wait: Duration::from_millis(30),
                ..LoopbackConfig::default()
            }),
            ..EngineConfig::default()
        })
        .unwrap();
        let b = engine(1);
        let (f, done) = flag();
        a.submit_send(&b.main_address(), b"hello", done).unwrap();
        match wait(&f) {
            Err(TransferError::NoReceiveBuffer { peer, waited }) => {
                assert_eq!(peer, b.main_address());
                assert!(waited >= Duration::from_millis(30));
            }
            other => panic!("expected NoReceiveBuffer, got {other:?}"),
        }
        // A receive posted while the send waits lets it through.
        let (f, done) = flag();
        a.submit_send(&b.main_address(), b"late", done).unwrap();
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        b.submit_recvs(16, 1, move |m| tx.lock().unwrap().send(m.to_vec()).unwrap())
            .unwrap();
        wait(&f).unwrap();
        assert_eq!(rx.recv_timeout(HANG).unwrap(), b"late");
    });
}

#[test]
fn paged_writes_with_arbitrary_indices_and_strides() {
    bounded(|| {
        let a = engine(2);
        let b = engine(2);
        let (src, _) = region(&a, 64 * 1024);
        let (dst, dd) = region(&b, 64 * 1024);
        src.write(0, &pattern(64 * 1024, 5)).unwrap();
        let page = 100u64;
        let sp = Pages {
            indices: vec![9, 0, 3, 7, 2],
            stride: 300,
            offset: 17,
        };
        let dp = Pages {
            indices: vec![1, 40, 5, 0, 22],
            stride: 128,
            offset: 1000,
        };
        let (f, done) = flag();
        b.expect_imm_count(0xabc, 5, done).unwrap();
        a.submit_paged_writes(
            page,
            Some(0xabc),
            (&src, &sp),
            (&dd, &dp),
            OnDone::callback(|r| r.unwrap()),
        )
        .unwrap();
        wait(&f).unwrap();
        let all = pattern(64 * 1024, 5);
        let mut expect = vec![0u8; 64 * 1024];
        for i in 0..5 {
            let s = (17 + sp.indices[i] as u64 * 300) as usize;
            let d = (1000 + dp.indices[i] as u64 * 128) as usize;
            expect[d..d + 100].copy_from_slice(&all[s..s + 100]);
        }
        assert_eq!(dst.to_vec(0, 64 * 1024).unwrap(), expect);
        // Pages went over both NICs.
        assert!(a
            .counters()
            .domains
            .iter()
            .all(|d| d.counters.write_imms > 0));
        assert_eq!(
            a.submit_paged_writes(
                page,
                None,
                (&src, &sp),
                (
                    &dd,
                    &Pages {
                        indices: vec![1],
                        stride: 1,
                        offset: 0
                    }
                ),
                OnDone::callback(|_| {})
            ),
            Err(TransferError::PagesMismatch { src: 5, dst: 1 })
        );
        let far = Pages {
            indices: vec![u32::MAX],
            stride: u64::MAX,
            offset: 0,
        };
        assert_eq!(
            a.submit_paged_writes(
                page,
                None,
                (&src, &far),
                (&dd, &far),
                OnDone::callback(|_| {})
            ),
            Err(TransferError::PageOffsetOverflow { page: 0 })
        );
    });
}

#[test]
fn transfer_split_over_four_domains_arrives_whole() {
    bounded(|| {
        let a = engine(4);
        let b = engine(4);
        let len = 1 << 20;
        let (src, _) = region(&a, len + 64);
        let (dst, dd) = region(&b, len + 64);
        src.write(0, &pattern(len as usize + 64, 11)).unwrap();
        let pieces = single_write_pieces(len - 3, dd.nics.len());
        assert_eq!(pieces, 4);
        let (f, done) = flag();
        b.expect_imm_count(1, pieces, done).unwrap();
        a.submit_single_write(
            len - 3,
            Some(1),
            (&src, 3),
            (&dd, 5),
            OnDone::callback(|r| r.unwrap()),
        )
        .unwrap();
        wait(&f).unwrap();
        assert_eq!(
            dst.to_vec(5, (len - 3) as usize).unwrap(),
            pattern(len as usize + 64, 11)[3..len as usize]
        );
        let c = a.counters();
        assert_eq!(c.total.bytes_written, len - 3);
        for d in &c.domains {
            assert_eq!(d.counters.write_imms, 1, "one piece per NIC");
        }
        let bc = b.counters();
        assert!(bc.domains.iter().all(|d| d.counters.imm_arrivals == 1));
        assert_eq!(single_write_pieces(1000, 4), 1);
        assert_eq!(single_write_pieces(3 * SPLIT_MIN, 2), 2);
        assert_eq!(single_write_pieces(3 * SPLIT_MIN, 4), 3);
    });
}

fn peers(n: usize) -> Vec<(TransferEngine, MrHandle, MrDesc)> {
    (0..n)
        .map(|_| {
            let e = engine(2);
            let (h, d) = region(&e, 4096);
            (e, h, d)
        })
        .collect()
}

#[test]
fn scatter_to_a_peer_group_of_five() {
    bounded(|| {
        let a = engine(2);
        let ps = peers(5);
        let h = a
            .add_peer_group(ps.iter().map(|p| p.0.main_address()).collect())
            .unwrap();
        let (src, _) = region(&a, 4096);
        src.write(0, &pattern(4096, 2)).unwrap();
        let flags: Vec<_> = ps
            .iter()
            .map(|p| {
                let (f, done) = flag();
                p.0.expect_imm_count(77, 1, done).unwrap();
                f
            })
            .collect();
        let dst: Vec<ScatterDst> = ps
            .iter()
            .enumerate()
            .map(|(i, p)| ScatterDst {
                len: 10 * i as u64,
                src: 100 * i as u64,
                dst: p.2.clone(),
                dst_offset: 7,
            })
            .collect();
        let (f, done) = flag();
        a.submit_scatter(Some(h), done, Some(77), &src, &dst)
            .unwrap();
        wait(&f).unwrap();
        for f in &flags {
            wait(f).unwrap();
        }
        for (i, p) in ps.iter().enumerate() {
            let n = 10 * i;
            assert_eq!(
                p.1.to_vec(7, n).unwrap(),
                pattern(4096, 2)[100 * i..100 * i + n]
            );
        }
        // A destination outside the group is refused.
        let other = engine(1);
        let (_oh, od) = region(&other, 64);
        let bad = [ScatterDst {
            len: 1,
            src: 0,
            dst: od,
            dst_offset: 0,
        }];
        assert!(matches!(
            a.submit_scatter(Some(h), OnDone::callback(|_| {}), None, &src, &bad),
            Err(TransferError::PeerNotInGroup { .. })
        ));
        assert_eq!(
            a.submit_scatter(None, OnDone::callback(|_| {}), None, &src, &[]),
            Err(TransferError::NoDestinations)
        );
    });
}

#[test]
fn barrier_to_a_peer_group_of_four() {
    bounded(|| {
        let a = engine(2);
        let ps = peers(4);
        let h = a
            .add_peer_group(ps.iter().map(|p| p.0.main_address()).collect())
            .unwrap();
        let flags: Vec<_> = ps
            .iter()
            .map(|p| {
                let (f, done) = flag();
                p.0.expect_imm_count(5, 2, done).unwrap();
                f
            })
            .collect();
        let descs: Vec<MrDesc> = ps.iter().map(|p| p.2.clone()).collect();
        for _ in 0..2 {
            let (f, done) = flag();
            a.submit_barrier(Some(h), done, 5, &descs).unwrap();
            wait(&f).unwrap();
        }
        for f in &flags {
            wait(f).unwrap();
        }
        // Barrier writes no bytes.
        assert_eq!(a.counters().total.bytes_written, 0);
        assert!(ps
            .iter()
            .all(|p| p.1.to_vec(0, 4096).unwrap().iter().all(|b| *b == 0)));
        assert_eq!(
            a.submit_barrier(
                Some(PeerGroupHandle::clone(&h)),
                OnDone::callback(|_| {}),
                5,
                &[]
            ),
            Err(TransferError::NoDestinations)
        );
    });
}

#[test]
fn add_peer_group_rejects_unknown_peer() {
    let a = engine(1);
    let ghost = NetAddr::new(b"loopback/none/0").unwrap();
    assert_eq!(
        a.add_peer_group(vec![a.main_address(), ghost]),
        Err(TransferError::UnknownPeer { peer: ghost })
    );
}

#[test]
fn watcher_reports_changes() {
    bounded(|| {
        let e = engine(1);
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let w = e
            .alloc_uvm_watcher(move |old, new| tx.lock().unwrap().send((old, new)).unwrap())
            .unwrap();
        w.store(1);
        assert_eq!(rx.recv_timeout(HANG).unwrap(), (0, 1));
        // A writer holding only the raw address (as a GPU would).
        let p = w.as_ptr();
        // SAFETY: `p` points to the watcher's live, aligned word; the store
        // is atomic like the GPU's.
        unsafe { (*(p.as_ptr() as *const AtomicU64)).store(5, SeqCst) };
        assert_eq!(rx.recv_timeout(HANG).unwrap(), (1, 5));
        let calls = Arc::new(AtomicUsize::new(0));
        let c2 = calls.clone();
        let w2 = e
            .alloc_uvm_watcher(move |_, _| {
                c2.fetch_add(1, SeqCst);
            })
            .unwrap();
        drop(w2);
        w.store(6);
        assert_eq!(rx.recv_timeout(HANG).unwrap(), (5, 6));
        assert_eq!(calls.load(SeqCst), 0);
    });
}

#[test]
fn channel_batch_of_mixed_ops_is_one_doorbell() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let (local, _) = region(&a, 256);
        let (remote, rd) = region(&b, 256);
        remote.write(64, &pattern(64, 8)).unwrap();
        remote.store_u64(0, 3).unwrap();
        local.write(128, &pattern(32, 1)).unwrap();
        let mut ch = a.channel().unwrap();
        let before = a.counters().total;
        let ops = [
            BatchOp::Read {
                dst: &local,
                dst_offset: 0,
                src: &rd,
                src_offset: 64,
                len: 64,
            },
            BatchOp::Faa {
                dst: &rd,
                offset: 0,
                add: 2,
            },
            BatchOp::Cas {
                dst: &rd,
                offset: 8,
                expected: 0,
                new: 9,
            },
            BatchOp::Write {
                src: &local,
                src_offset: 128,
                dst: &rd,
                dst_offset: 200,
                len: 32,
                imm: None,
            },
            BatchOp::Faa {
                dst: &rd,
                offset: 3,
                add: 1,
            },
        ];
        let mut res = Vec::new();
        ch.run(&ops, &mut res).unwrap();
        assert_eq!(res[0], Ok(0));
        assert_eq!(res[1], Ok(3));
        assert_eq!(res[2], Ok(0));
        assert_eq!(res[3], Ok(0));
        assert!(matches!(
            res[4],
            Err(TransferError::Protection {
                check: ProtectionCheck::Misaligned { .. },
                ..
            })
        ));
        assert_eq!(local.to_vec(0, 64).unwrap(), pattern(64, 8));
        assert_eq!(remote.load_u64(0).unwrap(), 5);
        assert_eq!(remote.load_u64(8).unwrap(), 9);
        assert_eq!(remote.to_vec(200, 32).unwrap(), pattern(32, 1));
        let after = a.counters().total;
        assert_eq!(after.doorbells - before.doorbells, 1);
        assert_eq!(after.rtts - before.rtts, 1);
        assert_eq!(after.reads - before.reads, 1);
        assert_eq!(after.atomics - before.atomics, 2);
    });
}

/// `Channel::post_iter`: batches on the channels of two engines are both
/// posted before either is waited for, each gets its own outcomes
/// whichever is waited for first; a batch whose `Posted` was leaked is
/// waited for by the channel's next post, so none of its completions is
/// taken for one of the next batch's.
#[test]
fn channel_batches_post_before_waiting_and_a_leaked_batch_is_waited_for() {
    bounded(|| {
        let (a1, a2, b) = (engine(1), engine(1), engine(1));
        let (remote, rd) = region(&b, 64);
        remote.store_u64(0, 100).unwrap();
        remote.store_u64(8, 200).unwrap();
        let (mut c1, mut c2) = (a1.channel().unwrap(), a2.channel().unwrap());
        let faa = |offset, add| BatchOp::Faa {
            dst: &rd,
            offset,
            add,
        };
        let (mut r1, mut r2) = (Vec::new(), Vec::new());
        let p1 = c1
            .post_iter([faa(0, 1), faa(8, 2)].into_iter(), &mut r1)
            .unwrap();
        let p2 = c2.post_iter([faa(8, 3)].into_iter(), &mut r2).unwrap();
        let got2 = p2.wait().to_vec();
        let got1 = p1.wait().to_vec();
        assert_eq!(got1[0], Ok(100));
        assert_eq!(got2.len(), 1);
        // The two FAAs on word 8 landed in some order.
        let (x, y) = (got1[1].clone().unwrap(), got2[0].clone().unwrap());
        assert!((x, y) == (200, 202) || (x, y) == (203, 200), "{x} {y}");
        assert_eq!(remote.load_u64(0).unwrap(), 101);
        assert_eq!(remote.load_u64(8).unwrap(), 205);
        assert_eq!(a1.counters().total.rtts + a2.counters().total.rtts, 2);

        // A leaked batch: the next run waits for it first.
        std::mem::forget(c1.post_iter([faa(0, 10)].into_iter(), &mut r1).unwrap());
        let mut res = Vec::new();
        c1.run(&[faa(16, 5)], &mut res).unwrap();
        assert_eq!(res, vec![Ok(0)], "its own outcome, not the leaked FAA's");
        assert_eq!(remote.load_u64(0).unwrap(), 111);
        assert_eq!(remote.load_u64(16).unwrap(), 5);
    });
}

#[test]
fn callbacks_fire_once_for_many_operations() {
    bounded(|| {
        let a = engine(2);
        let b = engine(2);
        let (src, _) = region(&a, 4096);
        let (_dst, dd) = region(&b, 4096);
        let n = 500;
        let fired = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        for i in 0..n {
            let fired = fired.clone();
            let tx = tx.clone();
            a.submit_single_write(
                8,
                None,
                (&src, 8 * (i % 512)),
                (&dd, 8 * (i % 512)),
                OnDone::callback(move |r| {
                    r.unwrap();
                    if fired.fetch_add(1, SeqCst) + 1 == n as usize {
                        tx.send(()).unwrap();
                    }
                }),
            )
            .unwrap();
        }
        rx.recv_timeout(HANG).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(fired.load(SeqCst), n as usize);
    });
}

#[test]
fn groups_route_to_their_own_nics() {
    bounded(|| {
        let a = TransferEngine::new(EngineConfig {
            groups: 2,
            nics_per_group: 2,
            ..EngineConfig::default()
        })
        .unwrap();
        let b = engine(2);
        assert_eq!(a.groups(), 2);
        let (src, _) = a.alloc_mr_in(1, 64, Access::all()).unwrap();
        let (_d, dd) = region(&b, 64);
        let (f, done) = flag();
        a.submit_single_write(64, None, (&src, 0), (&dd, 0), done)
            .unwrap();
        wait(&f).unwrap();
        let c = a.counters();
        let g1: u64 = c
            .domains
            .iter()
            .filter(|d| d.group == 1)
            .map(|d| d.counters.writes)
            .sum();
        assert_eq!(g1, 1);
        assert!(matches!(
            a.alloc_mr_in(2, 64, Access::all()),
            Err(TransferError::UnknownGroup { group: 2 })
        ));
    });
}

#[test]
fn bad_configs_are_refused() {
    for nics in [0, 5] {
        assert!(matches!(
            TransferEngine::loopback(nics),
            Err(TransferError::Config(ConfigError::NicsPerGroup(n))) if n == nics
        ));
    }
    assert!(matches!(
        TransferEngine::new(EngineConfig {
            groups: 0,
            ..EngineConfig::default()
        }),
        Err(TransferError::Config(ConfigError::NoGroups))
    ));
    let bad = LoopbackConfig {
        unordered: Some(Unordered {
            seed: 1,
            window: 0,
            writes_in_order: false,
        }),
        ..LoopbackConfig::default()
    };
    assert!(matches!(
        TransferEngine::new(EngineConfig {
            fabric: Fabric::Loopback(bad),
            ..EngineConfig::default()
        }),
        Err(TransferError::Config(ConfigError::ZeroWindow))
    ));
}
