//! Long randomized stress: four threads on two compute nodes insert,
//! update, delete, get and scan while the memory node retrains many times
//! (small leaves, small models, a low SLT trigger). Each thread owns the
//! keys `≡ t (mod 4)`, so it knows their exact state: every answer about
//! them is checked, every scan is checked sorted and complete for them, and
//! the final contents must equal the union of the threads' models.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rolex_host::kv::{KvClient, KvClientConfig};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

const THREADS: u64 = 4;

fn stress(unordered: bool, ops: u64) {
    let pairs: Vec<(u64, u64)> = (0..400u64).map(|i| (i * 40, i)).collect();
    let node = MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 8,
            retrain_trigger: 3,
            spare_leaf_factor: 40.0,
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    let mut engine = rolex_host::EngineConfig::default();
    if unordered {
        engine.fabric = rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
            unordered: Some(rolex_host::Unordered {
                seed: 5,
                window: 16,
                writes_in_order: false,
            }),
            ..rolex_host::LoopbackConfig::default()
        });
    }
    let cfg = KvClientConfig {
        engine,
        ..KvClientConfig::default()
    };
    let clients = [
        KvClient::connect(cfg.clone(), &node.pool()).unwrap(),
        KvClient::connect(cfg.clone(), &node.pool()).unwrap(),
    ];
    let models: Vec<BTreeMap<u64, u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let client = clients[(t % 2) as usize].clone();
                let mut mine: BTreeMap<u64, u64> = pairs
                    .iter()
                    .copied()
                    .filter(|(k, _)| k % THREADS == t)
                    .collect();
                scope.spawn(move || {
                    let mut s = client.session().unwrap();
                    let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t);
                    for i in 0..ops {
                        let k = rng.gen_range(0..4000u64) * THREADS + t;
                        let v = i << 8 | t;
                        match rng.gen_range(0..20) {
                            0..=7 => assert_eq!(s.insert(k, v).unwrap(), mine.insert(k, v)),
                            8..=9 => {
                                let want = mine.get_mut(&k).map(|x| std::mem::replace(x, v));
                                assert_eq!(s.update(k, v).unwrap(), want);
                            }
                            10..=13 => assert_eq!(s.delete(k).unwrap(), mine.remove(&k)),
                            14..=16 => assert_eq!(s.get(k).unwrap(), mine.get(&k).copied()),
                            _ => {
                                let n = rng.gen_range(1..60);
                                let got = s.scan(k, n).unwrap();
                                assert!(got.len() <= n);
                                assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
                                assert!(got.iter().all(|e| e.0 >= k));
                                // Complete for this thread's keys in the span.
                                let end = if got.len() == n {
                                    got[n - 1].0
                                } else {
                                    u64::MAX
                                };
                                let own: Vec<(u64, u64)> =
                                    got.iter().copied().filter(|e| e.0 % THREADS == t).collect();
                                let want: Vec<(u64, u64)> =
                                    mine.range(k..=end).map(|(&a, &b)| (a, b)).collect();
                                assert_eq!(own, want, "scan from {k}");
                            }
                        }
                    }
                    s.flush().unwrap();
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = BTreeMap::new();
    for m in models {
        all.extend(m);
    }
    // A fresh compute node sees exactly the union: no key lost, none
    // invented.
    let fresh = KvClient::connect(cfg, &node.pool()).unwrap();
    let mut s = fresh.session().unwrap();
    let want: Vec<(u64, u64)> = all.iter().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(s.range(0, u64::MAX).unwrap(), want);
    for (&k, &v) in &all {
        assert_eq!(s.get(k).unwrap(), Some(v));
    }
    // The agent retrains as SLTs fill; on a loaded machine its thread may
    // lag the workload: wait for it (a hang guard, not a timing bound).
    let start = std::time::Instant::now();
    while node.stats().agent.retrains < 10 && start.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let st = node.stats();
    assert!(
        st.agent.retrains >= 10,
        "retrained only {} times",
        st.agent.retrains
    );
    assert!(node.last_agent_error().is_none());
}

#[test]
fn stress_ordered_fabric() {
    stress(false, 4000);
}

#[test]
fn stress_unordered_fabric() {
    stress(true, 2500);
}
