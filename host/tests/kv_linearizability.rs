//! Linearizability under concurrency: four threads on two compute nodes run
//! random operations on a small key space while the memory node retrains;
//! the recorded history is checked against a sequential `BTreeMap` model
//! (`rolex_checker`).

mod common;

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use rolex_checker::{Call, Clock, History, Recorder, Ret};
use rolex_host::kv::{KvClient, KvClientConfig};

fn run(unordered: bool, seed: u64) {
    let pairs: Vec<(u64, u64)> = (0..12u64).map(|i| (i * 2 * 1000, i)).collect();
    let mut engine = rolex_host::EngineConfig::default();
    if unordered {
        engine.fabric = rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
            unordered: Some(rolex_host::Unordered { seed, window: 8 }),
            ..rolex_host::LoopbackConfig::default()
        });
    }
    // Records and freed leaves are reused within the run (a grace period
    // of 20 ms, clients refresh views older than 5 ms), so histories cover
    // splits into leaves retraining freed.
    let node = common::churning_node_with_grace(&pairs, std::time::Duration::from_millis(20));
    let cfg = KvClientConfig {
        engine,
        model_max_age: std::time::Duration::from_millis(5),
        ..KvClientConfig::default()
    };
    let clients = [
        KvClient::connect(cfg.clone(), &node.pool()).unwrap(),
        KvClient::connect(cfg, &node.pool()).unwrap(),
    ];
    let clock = Arc::new(Clock::new());
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Full retraining passes done so far: workers wait for a new one twice
    // mid-run, so every worker meets retrained models however the threads
    // are scheduled (a loaded machine can otherwise run the workers to the
    // end before the retrainer's first pass).
    let passes = std::sync::atomic::AtomicU64::new(0);
    let mut history = History::new(pairs.iter().copied());
    std::thread::scope(|scope| {
        // Besides the agent's own thread, retrain every model again and again
        // while the workers run, so stale caches are the rule.
        let retrainer = scope.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for m in 0..node.model_count() {
                    if common::retrain_unless_busy(&node, m) {
                        n += 1;
                    }
                }
                passes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            n
        });
        let threads: Vec<_> = (0..4usize)
            .map(|t| {
                let client = clients[t % 2].clone();
                let clock = clock.clone();
                let passes = &passes;
                scope.spawn(move || {
                    let mut s = client.session().unwrap();
                    let mut rec = Recorder::new(t, clock);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 31 + t as u64);
                    for i in 0..300u64 {
                        if i == 100 || i == 200 {
                            wait_for_new_pass(passes);
                        }
                        let key = rng.gen_range(0..24u64) * 1000;
                        let value = (t as u64) << 32 | i;
                        match rng.gen_range(0..12) {
                            0..=2 => {
                                let op = rec.invoke(Call::Get { key });
                                let r = s.get(key).unwrap();
                                rec.finish(op, Ret::Value(r));
                            }
                            3..=4 => {
                                let op = rec.invoke(Call::Insert { key, value });
                                let r = s.insert(key, value).unwrap();
                                rec.finish(op, Ret::Prior(r));
                            }
                            5..=6 => {
                                let op = rec.invoke(Call::Update { key, value });
                                let r = s.update(key, value).unwrap();
                                rec.finish(op, Ret::Prior(r));
                            }
                            7..=9 => {
                                let op = rec.invoke(Call::Delete { key });
                                let r = s.delete(key).unwrap();
                                rec.finish(op, Ret::Prior(r));
                            }
                            10 => {
                                let n = rng.gen_range(1..6);
                                let op = rec.invoke(Call::Scan { from: key, n });
                                let r = s.scan(key, n).unwrap();
                                rec.finish(op, Ret::Entries(r));
                            }
                            _ => {
                                let hi = key + rng.gen_range(0..6u64) * 1000;
                                let op = rec.invoke(Call::Range { lo: key, hi });
                                let r = s.range(key, hi).unwrap();
                                rec.finish(op, Ret::Entries(r));
                            }
                        }
                    }
                    s.flush().unwrap();
                    rec.into_records()
                })
            })
            .collect();
        for t in threads {
            history.extend(t.join().unwrap());
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(retrainer.join().unwrap() > 0);
    });
    let checked = history
        .check()
        .unwrap_or_else(|v| panic!("not linearizable: {v}"));
    assert_eq!(checked.single_ops + checked.scans, 1200);
    let st = node.stats();
    let refreshes: u64 = clients.iter().map(|c| c.stats().total().refreshes).sum();
    let stash: u64 = clients.iter().map(|c| c.stats().stash_leaves).sum();
    eprintln!(
        "retrains {} refreshes {refreshes}; leaves freed {}, splits into freed leaves {stash}; models {} ({} cut)",
        st.agent.retrains, st.agent.leaves_freed, st.models, st.agent.models_cut
    );
    assert!(st.agent.retrains > 0, "retraining ran during the test");
    assert!(refreshes > 0, "clients met retrained models");
    assert!(node.last_agent_error().is_none());
}

/// Waits (bounded: a hang guard, not a timing assertion) until the
/// retrainer finishes a pass that started after this call.
fn wait_for_new_pass(passes: &std::sync::atomic::AtomicU64) {
    let seen = passes.load(std::sync::atomic::Ordering::SeqCst);
    let start = std::time::Instant::now();
    while passes.load(std::sync::atomic::Ordering::SeqCst) < seen + 2 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "the retrainer made no progress"
        );
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

#[test]
fn histories_are_linearizable_on_an_ordered_fabric() {
    for seed in 1..=3 {
        run(false, seed);
    }
}

#[test]
fn histories_are_linearizable_on_an_unordered_fabric() {
    for seed in 1..=3 {
        run(true, seed);
    }
}
