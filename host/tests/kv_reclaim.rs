//! Leaves are given back and reused: retraining drops the leaves deletes
//! emptied (their ranges go to the leaf before them), frees them after a
//! grace period, and stashes them in new records' SLTs, where splits take
//! them instead of drawing new leaves. A sliding window of keys (insert
//! new, delete old) many times larger than the store then runs in a
//! bounded number of leaves, and a compute node whose cache still names a
//! freed leaf refreshes instead of answering from it.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rolex_dpu::AgentError;
use rolex_host::kv::{KvClient, KvClientConfig};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig, MemoryNodeError};

/// The grace period of these tests' nodes.
const GRACE: Duration = Duration::from_millis(10);

/// Leaves of 4 slots loaded half full, models of at most
/// `max_model_leaves` leaves, retrained by hand only.
fn node(pairs: &[(u64, u64)], max_model_leaves: u64) -> MemoryNode {
    MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves,
            retrain_trigger: 1000,
            retraining_thread: false,
            record_grace: GRACE,
            spare_leaf_factor: 4.0,
            ..MemoryNodeConfig::default()
        },
        pairs,
    )
    .unwrap()
}

fn client(node: &MemoryNode, max_age: Duration) -> KvClient {
    KvClient::connect(
        KvClientConfig {
            model_max_age: max_age,
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap()
}

/// Retrains every model, waiting out grace periods while the model region
/// is full of records retired too recently.
fn retrain_all(node: &MemoryNode) {
    for m in 0..node.stats().models {
        let mut tries = 0;
        loop {
            match node.retrain_now(m) {
                Ok(_) => break,
                Err(MemoryNodeError::Agent(AgentError::ModelRegionFull { .. })) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(GRACE);
                }
                Err(e) => panic!("retraining model {m}: {e}"),
            }
        }
    }
}

#[test]
fn a_sliding_window_many_times_the_store_runs_in_bounded_leaves() {
    const WINDOW: usize = 1500;
    const ROUNDS: usize = 100;
    const STEP: usize = 500;
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    while live.len() < WINDOW {
        live.insert(rng.gen_range(0..1u64 << 40), rng.gen());
    }
    let pairs: Vec<(u64, u64)> = live.iter().map(|(&k, &v)| (k, v)).collect();
    let mut order: std::collections::VecDeque<u64> = pairs.iter().map(|p| p.0).collect();
    let node = node(&pairs, 8);
    let c = client(&node, Duration::from_millis(1));
    let mut s = c.session().unwrap();
    let start = node.stats();
    let mut peak_allocated = 0;
    let mut after_warmup = 0;
    for round in 0..ROUNDS {
        for _ in 0..STEP {
            let k = loop {
                let k = rng.gen_range(0..1u64 << 40);
                if !live.contains_key(&k) {
                    break k;
                }
            };
            let v = rng.gen();
            assert_eq!(s.insert(k, v).unwrap(), None, "insert of new key {k}");
            live.insert(k, v);
            order.push_back(k);
            let old = order.pop_front().unwrap();
            let want = live.remove(&old);
            assert_eq!(s.delete(old).unwrap(), want, "delete of key {old}");
        }
        retrain_all(&node);
        std::thread::sleep(GRACE * 2);
        let st = node.stats();
        peak_allocated = peak_allocated.max(st.leaves_allocated);
        if round == 4 {
            after_warmup = st.leaves_allocated;
        }
    }
    for (&k, &v) in &live {
        assert_eq!(s.get(k).unwrap(), Some(v), "live key {k}");
    }
    let end = node.stats();
    let stash = c.stats().stash_leaves;
    println!(
        "window {WINDOW} keys, {} inserts and deletes: leaves allocated {} at load, {} after 5 rounds, {} at the end; \
         live {} free {}; freed {} in all, {} splits took a stashed leaf; pool bytes in use {} -> {}",
        ROUNDS * STEP,
        start.leaves_allocated,
        after_warmup,
        end.leaves_allocated,
        end.leaves_live,
        end.leaves_free,
        end.agent.leaves_freed,
        stash,
        start.pool_bytes_used,
        end.pool_bytes_used
    );
    assert!(end.agent.leaves_freed > 0, "retraining freed no leaf");
    assert!(stash > 0, "no split reused a freed leaf");
    // Without reuse every round's splits draw new leaves: 10 windows of
    // inserts would allocate several times the warm store's leaves.
    assert!(
        peak_allocated <= after_warmup * 3 / 2,
        "leaves keep growing: {after_warmup} after warm-up, {peak_allocated} at peak"
    );
    assert!(end.leaves_live <= 2 * live.len() as u64, "{end:?}");
}

#[test]
fn a_reader_whose_cache_names_a_freed_leaf_refreshes() {
    // Keys 0, 10, 20, …: leaves of 2 keys at load.
    let pairs: Vec<(u64, u64)> = (0..400u64).map(|i| (i * 10, i)).collect();
    // Few models, so the few leaves freed here are not spread over many.
    let node = node(&pairs, 64);
    // The stale reader never refreshes by age.
    let stale = client(&node, Duration::from_secs(3600));
    let mut r = stale.session().unwrap();
    assert_eq!(r.get(1000).unwrap(), Some(100));
    let w = client(&node, Duration::from_millis(1));
    let mut s = w.session().unwrap();
    // Empty a run of leaves in the middle, then retrain: they are dropped
    // and freed, their range handed to the leaf before them.
    for k in (900..1400).step_by(10) {
        assert_eq!(s.delete(k).unwrap(), Some(k / 10));
    }
    retrain_all(&node);
    assert!(node.stats().agent.leaves_freed > 0);
    // The writer inserts into the freed range through the new record; the
    // stale reader's cache still names the freed leaves.
    assert_eq!(s.insert(1005, 7).unwrap(), None);
    assert_eq!(
        r.get(1005).unwrap(),
        Some(7),
        "stale reader, after the insert"
    );
    assert_eq!(r.get(1000).unwrap(), None, "stale reader, deleted key");
    assert_eq!(
        r.scan(890, 3).unwrap(),
        vec![(890, 89), (1005, 7), (1400, 140)]
    );
    // After the grace period the freed leaves are stashed and reused by
    // splits elsewhere; the stale reader still answers right.
    std::thread::sleep(GRACE * 3);
    retrain_all(&node);
    for i in 0..2000u64 {
        s.insert(3_000_000 + i, i).unwrap();
        if i % 100 == 99 {
            retrain_all(&node);
        }
    }
    let st = node.stats();
    eprintln!(
        "models {} (cut {}), leaves freed {}, stashed {}, free {}, splits into stashed leaves {}",
        st.models,
        st.agent.models_cut,
        st.agent.leaves_freed,
        st.agent.leaves_stashed,
        st.leaves_free,
        w.stats().stash_leaves
    );
    assert!(w.stats().stash_leaves > 0, "no split reused a freed leaf");
    assert_eq!(r.get(1005).unwrap(), Some(7));
    assert_eq!(r.get(1100).unwrap(), None);
    assert_eq!(r.get(3_000_500).unwrap(), Some(500));
}
