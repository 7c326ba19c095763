//! Atomicity and order independence: FAA from many threads sums exactly,
//! CAS contention has one winner per round, and in unordered mode every
//! ImmCounter expectation fires exactly once, at the right count.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Barrier, Mutex};

use common::*;
use rolex_engine::*;

#[test]
fn faa_from_threads_and_engines_sums_exactly() {
    bounded(|| {
        let target = engine(2);
        let (word, wd) = region(&target, 64);
        let threads = 4;
        let per = 500u64;
        let clients: Vec<_> = (0..2).map(|_| Arc::new(engine(2))).collect();
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let e = clients[t % 2].clone();
                let wd = wd.clone();
                std::thread::spawn(move || {
                    let mut olds = Vec::new();
                    if t % 2 == 0 {
                        // Through the engine's worker.
                        for _ in 0..per {
                            let (f, v) = vflag();
                            e.submit_faa((&wd, 16), 1, v).unwrap();
                            olds.push(wait(&f).unwrap());
                        }
                    } else {
                        // Through a client channel, in batches of 10.
                        let mut ch = e.channel().unwrap();
                        let ops = vec![
                            BatchOp::Faa {
                                dst: &wd,
                                offset: 16,
                                add: 1
                            };
                            10
                        ];
                        let mut res = Vec::new();
                        for _ in 0..per / 10 {
                            ch.run(&ops, &mut res).unwrap();
                            olds.extend(res.iter().map(|r| *r.as_ref().unwrap()));
                        }
                    }
                    olds
                })
            })
            .collect();
        let mut all: Vec<u64> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        assert_eq!(word.load_u64(16).unwrap(), threads as u64 * per);
        // Every old value seen exactly once: the adds were atomic.
        all.sort_unstable();
        assert_eq!(all, (0..threads as u64 * per).collect::<Vec<_>>());
    });
}

#[test]
fn cas_contention_has_one_winner_per_round() {
    bounded(|| {
        let target = engine(1);
        let (word, wd) = region(&target, 64);
        let n = 4;
        let rounds = 100u64;
        let barrier = Arc::new(Barrier::new(n));
        let wins = Arc::new(Mutex::new(vec![0usize; rounds as usize]));
        let hs: Vec<_> = (0..n)
            .map(|t| {
                let e = engine(1);
                let wd = wd.clone();
                let barrier = barrier.clone();
                let wins = wins.clone();
                std::thread::spawn(move || {
                    let mut ch = e.channel().unwrap();
                    let mut res = Vec::new();
                    for r in 0..rounds {
                        barrier.wait();
                        // Everyone tries to move the word from r to r + 1.
                        let ops = [BatchOp::Cas {
                            dst: &wd,
                            offset: 0,
                            expected: r,
                            new: r + 1,
                        }];
                        if t % 2 == 0 {
                            ch.run(&ops, &mut res).unwrap();
                            if res[0] == Ok(r) {
                                wins.lock().unwrap()[r as usize] += 1;
                            }
                        } else {
                            let (f, v) = vflag();
                            e.submit_cas((&wd, 0), r, r + 1, v).unwrap();
                            if wait(&f) == Ok(r) {
                                wins.lock().unwrap()[r as usize] += 1;
                            }
                        }
                        barrier.wait();
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(
            wins.lock().unwrap().iter().all(|w| *w == 1),
            "one winner per round"
        );
        assert_eq!(word.load_u64(0).unwrap(), rounds);
    });
}

fn unordered_engine(seed: u64, nics: usize) -> TransferEngine {
    TransferEngine::new(EngineConfig {
        nics_per_group: nics,
        fabric: Fabric::Loopback(LoopbackConfig {
            unordered: Some(Unordered {
                seed,
                window: 16,
                writes_in_order: false,
            }),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    })
    .unwrap()
}

#[test]
fn unordered_mode_fires_each_expectation_once_at_the_right_count() {
    bounded(|| {
        for seed in [1u64, 2, 3] {
            let a = unordered_engine(seed, 2);
            let b = unordered_engine(seed + 100, 2);
            assert!(!a.ordered());
            let (src, _) = region(&a, 64 * 1024);
            src.write(0, &pattern(64 * 1024, seed as u8)).unwrap();
            let (dst, dd) = region(&b, 64 * 1024);
            let imms = 8u32;
            let per = 12u32;
            let fired: Arc<Vec<AtomicUsize>> =
                Arc::new((0..imms).map(|_| AtomicUsize::new(0)).collect());
            let (tx, rx) = std::sync::mpsc::channel();
            // Half the expectations armed before, half after the writes.
            let arm = |imm: u32| {
                let fired = fired.clone();
                let tx = tx.clone();
                let dst = dst.clone();
                b.expect_imm_count(
                    imm,
                    per,
                    OnDone::callback(move |r| {
                        r.unwrap();
                        fired[imm as usize].fetch_add(1, SeqCst);
                        // All `per` pages of this immediate are visible.
                        let base = imm as u64 * per as u64 * 64;
                        let got = dst.to_vec(base, per as usize * 64).unwrap();
                        tx.send((imm, got)).unwrap();
                    }),
                )
                .unwrap();
            };
            for imm in 0..imms / 2 {
                arm(imm);
            }
            let mut flags = Vec::new();
            for j in 0..per {
                for imm in 0..imms {
                    // Page j of immediate `imm`.
                    let off = (imm * per + j) as u64 * 64;
                    let (f, d) = flag();
                    a.submit_single_write(64, Some(imm), (&src, off), (&dd, off), d)
                        .unwrap();
                    flags.push(f);
                }
            }
            for imm in imms / 2..imms {
                arm(imm);
            }
            for f in &flags {
                wait(f).unwrap();
            }
            let all = pattern(64 * 1024, seed as u8);
            for _ in 0..imms {
                let (imm, got) = rx.recv_timeout(HANG).unwrap();
                let base = (imm * per * 64) as usize;
                assert_eq!(got, all[base..base + (per * 64) as usize]);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            assert!(
                fired.iter().all(|f| f.load(SeqCst) == 1),
                "each fired exactly once"
            );
            assert!((0..imms).all(|i| b.imm_count(i) == 0));
        }
    });
}

#[test]
fn unordered_mode_really_reorders() {
    bounded(|| {
        // Writes of increasing values to one word: in order, the last one
        // wins; shuffled, some seed must leave an earlier value.
        let mut reordered = false;
        for seed in 0..8 {
            let a = unordered_engine(seed, 1);
            let b = engine(1);
            let (src, _) = region(&a, 8 * 64);
            for i in 0..64u64 {
                src.store_u64(8 * i, i).unwrap();
            }
            let (word, wd) = region(&b, 8);
            let mut ch = a.channel().unwrap();
            let ops: Vec<_> = (0..64)
                .map(|i| BatchOp::Write {
                    src: &src,
                    src_offset: 8 * i,
                    dst: &wd,
                    dst_offset: 0,
                    len: 8,
                    imm: None,
                })
                .collect();
            let mut res = Vec::new();
            ch.run(&ops, &mut res).unwrap();
            assert!(res.iter().all(|r| r.is_ok()));
            if word.load_u64(0).unwrap() != 63 {
                reordered = true;
                break;
            }
        }
        assert!(reordered);
    });
}
