//! Whoever waits polls (design §4, "Latency"): operations notified by a
//! flag may be posted by the submitting thread and completed by the thread
//! that waits, callbacks go through the worker, immediates are counted by
//! whichever thread reads them — and with all those paths mixed, every
//! operation takes effect once and every notification fires once. On
//! loopback, and on `libfabric:tcp` where it is usable.

mod common;

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc};

use common::*;
use rolex_engine::*;

#[test]
fn mixed_paths_apply_every_operation_once_and_notify_once() {
    for fabric in fabrics() {
        let name = fabric.name();
        bounded(move || {
            let target = Arc::new(engine_on(&fabric));
            let (word, wd) = region(&target, 4096);
            let client = Arc::new(engine_on(&fabric));
            let threads = 4u64;
            let per = 200u64;
            let callbacks = Arc::new(AtomicU64::new(0));
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (c, wd, callbacks) = (client.clone(), wd.clone(), callbacks.clone());
                    std::thread::spawn(move || {
                        let (src, _) = region(&c, 64);
                        let (tx, rx) = mpsc::channel();
                        let mut olds = Vec::new();
                        for i in 0..per {
                            match (t + i) % 3 {
                                // A flag, waited on (the waiter polls).
                                0 => {
                                    let (f, v) = vflag();
                                    c.submit_faa((&wd, 0), 1, v).unwrap();
                                    olds.push(wait(&f).unwrap());
                                }
                                // A flag, polled with `is_done`.
                                1 => {
                                    let (f, v) = vflag();
                                    c.submit_faa((&wd, 0), 1, v).unwrap();
                                    let start = std::time::Instant::now();
                                    while !f.is_done() {
                                        assert!(start.elapsed() < HANG, "is_done never true");
                                        std::thread::yield_now();
                                    }
                                    olds.push(f.result().unwrap().unwrap());
                                }
                                // A callback (through the worker), then a
                                // flag-notified write behind it.
                                _ => {
                                    let tx = tx.clone();
                                    let n = callbacks.clone();
                                    c.submit_faa(
                                        (&wd, 0),
                                        1,
                                        OnValue::callback(move |r| {
                                            n.fetch_add(1, SeqCst);
                                            let _ = tx.send(r);
                                        }),
                                    )
                                    .unwrap();
                                    let (f, d) = flag();
                                    let off = 64 + 8 * t;
                                    c.submit_single_write(8, None, (&src, 0), (&wd, off), d)
                                        .unwrap();
                                    wait(&f).unwrap();
                                    olds.push(rx.recv_timeout(HANG).unwrap().unwrap());
                                }
                            }
                        }
                        olds
                    })
                })
                .collect();
            let mut all: Vec<u64> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
            assert_eq!(word.load_u64(0).unwrap(), threads * per, "{name}");
            // Every add applied once, atomically: each old value seen once.
            all.sort_unstable();
            assert_eq!(all, (0..threads * per).collect::<Vec<_>>(), "{name}");
            let cb = callbacks.load(SeqCst);
            let c = client.counters().total;
            // Every transfer went one way or the other, exactly once;
            // callbacks always through the worker.
            assert_eq!(c.direct_posts + c.handoffs, c.rtts, "{name}");
            assert!(c.handoffs >= cb, "{name}: {c:?}");
            assert_eq!(c.errors, 0, "{name}");
        });
    }
}

#[test]
fn callbacks_are_handed_to_the_worker_and_flags_are_not_lost() {
    bounded(|| {
        let target = engine(1);
        let (_word, wd) = region(&target, 64);
        let client = engine(1);
        let (tx, rx) = mpsc::channel();
        for _ in 0..50 {
            let tx = tx.clone();
            client
                .submit_faa((&wd, 8), 1, OnValue::callback(move |r| tx.send(r).unwrap()))
                .unwrap();
        }
        for _ in 0..50 {
            rx.recv_timeout(HANG).unwrap().unwrap();
        }
        let c = client.counters().total;
        assert_eq!((c.handoffs, c.direct_posts), (50, 0));
        // Flags: posted here or by the worker, never both, never dropped.
        let flags: Vec<_> = (0..50)
            .map(|_| {
                let (f, v) = vflag();
                client.submit_faa((&wd, 8), 1, v).unwrap();
                f
            })
            .collect();
        let mut olds: Vec<u64> = flags.iter().map(|f| wait(f).unwrap()).collect();
        olds.sort_unstable();
        assert_eq!(olds, (50..100).collect::<Vec<_>>());
        let c = client.counters().total;
        assert_eq!(c.handoffs + c.direct_posts, 100);
    });
}

#[test]
fn an_expectation_fires_without_the_receivers_worker_on_loopback() {
    bounded(|| {
        let sender = engine(1);
        let receiver = engine(1);
        let (_dst, dd) = region(&receiver, 64);
        let (src, _) = region(&sender, 64);
        for round in 0..20u32 {
            let (landed, on_landed) = flag();
            receiver.expect_imm_count(5, 1, on_landed).unwrap();
            let (written, d) = flag();
            sender
                .submit_single_write(8, Some(5), (&src, 0), (&dd, 0), d)
                .unwrap();
            wait(&written).unwrap();
            // The write's data and immediate took effect before its
            // completion (loopback runs it at once), and the immediate was
            // counted by the thread that ran it: the expectation has fired
            // by now, whoever ran the write.
            assert!(landed.is_done(), "round {round}");
            assert_eq!(landed.result(), Some(Ok(0)));
        }
        assert_eq!(receiver.counters().total.imm_arrivals, 20);
    });
}

#[test]
fn a_sleeping_waiters_operation_completes_while_others_poll_and_leave() {
    // A send waits at the target until a receive buffer is posted, so its
    // waiter runs out of spin budget and sleeps; meanwhile another thread's
    // flag writes are waited on (polled) one after the other, each waiter
    // leaving the group with the send still in flight. The send's
    // completion must still reach its sleeper, and every write land.
    bounded(|| {
        let target = Arc::new(
            TransferEngine::new(EngineConfig {
                fabric: Fabric::Loopback(LoopbackConfig {
                    recv_wait: std::time::Duration::from_secs(20),
                    ..LoopbackConfig::default()
                }),
                pin_workers: false,
                ..EngineConfig::default()
            })
            .expect("target"),
        );
        let (word, wd) = region(&target, 4096);
        let client = Arc::new(engine_on(&Fabric::Loopback(LoopbackConfig::default())));
        let (sent, on_sent) = flag();
        client
            .submit_send(&target.main_address(), b"hello", on_sent)
            .unwrap();
        let sleeper = {
            let sent = sent.clone();
            std::thread::spawn(move || wait(&sent))
        };
        let (src, _) = region(&client, 8);
        src.write(0, &7u64.to_le_bytes()).unwrap();
        for i in 0..200u64 {
            let (f, d) = flag();
            client
                .submit_single_write(8, None, (&src, 0), (&wd, 8 * (i % 512)), d)
                .unwrap();
            wait(&f).unwrap();
            if i == 100 {
                let (tx, rx) = mpsc::channel();
                target
                    .submit_recvs(16, 1, move |m| tx.send(m.to_vec()).unwrap())
                    .unwrap();
                assert_eq!(rx.recv_timeout(HANG).unwrap(), b"hello");
            }
        }
        sleeper.join().unwrap().unwrap();
        for i in 0..200u64 {
            assert_eq!(word.load_u64(8 * (i % 512)).unwrap(), 7);
        }
        assert_eq!(client.counters().total.errors, 0);
    });
}

#[test]
fn threads_keeping_writes_in_flight_each_see_every_write_land() {
    // Several threads keep flag writes in flight and wait on them like a
    // bandwidth loop (`te-bench --threads 3 --depth 8`): submissions post
    // directly, or are queued when another thread's round holds the group
    // and posted by whoever runs the next round; several writes of
    // different transfers may share a post and its delivery
    // acknowledgement. Every write must complete and land, whatever the
    // interleaving.
    for fabric in fabrics() {
        let name = fabric.name();
        bounded(move || {
            let target = Arc::new(engine_on(&fabric));
            let (word, wd) = region(&target, 4096);
            let client = Arc::new(engine_on(&fabric));
            let (threads, per, depth) = (3u64, 300u64, 8usize);
            let hs: Vec<_> = (0..threads)
                .map(|t| {
                    let (c, wd) = (client.clone(), wd.clone());
                    std::thread::spawn(move || {
                        let (src, _) = region(&c, 8);
                        src.write(0, &(t + 1).to_le_bytes()).unwrap();
                        let flags: Vec<_> = (0..depth).map(|_| CompletionFlag::new()).collect();
                        for i in 0..per as usize {
                            let f = &flags[i % depth];
                            if i >= depth {
                                wait(f).unwrap();
                            }
                            f.reset();
                            let slot = 8 * (t * per + i as u64) % 4096;
                            c.submit_single_write(8, None, (&src, 0), (&wd, slot), OnDone::flag(f))
                                .unwrap();
                        }
                        for f in &flags {
                            wait(f).unwrap();
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
            // Every thread's last writes to its slots hold its value (the
            // slots of different threads overlap in 4 KiB, so check only
            // that each holds some thread's value).
            for s in 0..512u64 {
                let v = word.load_u64(8 * s).unwrap();
                assert!((1..=threads).contains(&v), "{name}: slot {s} holds {v}");
            }
            let c = client.counters().total;
            assert_eq!(c.errors, 0, "{name}");
            assert_eq!(c.writes, threads * per, "{name}");
        });
    }
}

#[test]
fn plugged_submissions_are_posted_by_a_wait_or_the_plugs_drop() {
    // Under a plug, writes to a group with transfers in flight are accepted
    // and posted together later: a wait on one of them must post them (it
    // may depend on any), and so must the plug's drop (checked exactly by
    // the unit tests of `plug`); nested plugs post at the outer one's drop.
    // Every write lands once.
    for fabric in fabrics() {
        let name = fabric.name();
        bounded(move || {
            let target = engine_on(&fabric);
            let (word, wd) = region(&target, 4096);
            let client = engine_on(&fabric);
            let (src, _) = region(&client, 8);
            src.write(0, &5u64.to_le_bytes()).unwrap();
            let write = |slot: u64| {
                let (f, d) = flag();
                client
                    .submit_single_write(8, None, (&src, 0), (&wd, 8 * slot), d)
                    .unwrap();
                f
            };
            // A wait inside the plug posts what the plug held back.
            {
                let _plug = client.plug();
                let fs: Vec<_> = (0..32).map(write).collect();
                wait(fs.last().unwrap()).unwrap();
                for f in &fs {
                    wait(f).unwrap();
                }
            }
            // The drop of the outer of two plugs posts them.
            let fs = {
                let _outer = client.plug();
                let _inner = client.plug();
                (32..64).map(write).collect::<Vec<_>>()
            };
            for f in &fs {
                wait(f).unwrap();
            }
            for s in 0..64 {
                assert_eq!(word.load_u64(8 * s).unwrap(), 5, "{name}: slot {s}");
            }
            let c = client.counters().total;
            assert_eq!((c.errors, c.writes), (0, 64), "{name}");
            assert!(c.doorbells <= 64, "{name}: {c:?}");
        });
    }
}
