//! Model records are reused: a store retrained many times more than its
//! model region could hold without reuse keeps every key in bounded space,
//! and a compute node whose cached record was reused by another model
//! notices (another model id) and refreshes instead of answering from, or
//! locking through, the other model's record.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rolex_dpu::{AgentError, RetrainReport};
use rolex_host::kv::{KvClient, KvClientConfig, KvOp};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig, MemoryNodeError};

/// The grace period of these tests' nodes, and a client age below it.
const GRACE: Duration = Duration::from_millis(10);
const MAX_AGE: Duration = Duration::from_millis(2);

fn node(pairs: &[(u64, u64)], spare: u64) -> MemoryNode {
    MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 4,
            retrain_trigger: 1000,
            retraining_thread: false,
            model_region_spare: Some(spare),
            record_grace: GRACE,
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

/// Retrains `m`, waiting out the grace period while the region is full of
/// records retired too recently.
fn retrain(node: &MemoryNode, m: u64) -> RetrainReport {
    for _ in 0..100 {
        match node.retrain_now(m) {
            Ok(r) => return r,
            Err(MemoryNodeError::Agent(AgentError::ModelRegionFull { .. })) => {
                std::thread::sleep(GRACE)
            }
            Err(e) => panic!("retraining model {m}: {e}"),
        }
    }
    panic!("model {m}: the model region stayed full past many grace periods");
}

#[test]
fn retraining_far_past_the_model_region_keeps_every_key_in_bounded_space() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let pairs: Vec<(u64, u64)> = (0..64u64).map(|i| (i * 1000, i)).collect();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    // Room for a few dozen records of these models beyond the loaded ones.
    let spare = 96 << 10;
    let node = node(&pairs, spare);
    let models = node.model_count();
    let c = client(&node, MAX_AGE);
    let mut s = c.session().unwrap();
    let start = node.stats().agent.model_region_used;
    let rounds = 3000u64;
    for i in 0..rounds {
        retrain(&node, i % models);
        let k = rng.gen_range(0..70_000);
        match rng.gen_range(0..4) {
            0 => assert_eq!(s.insert(k, i).unwrap(), model.insert(k, i)),
            1 => assert_eq!(s.delete(k).unwrap(), model.remove(&k)),
            _ => assert_eq!(s.get(k).unwrap(), model.get(&k).copied()),
        }
    }
    for (&k, &v) in &model {
        assert_eq!(s.get(k).unwrap(), Some(v));
    }
    let st = node.stats().agent;
    assert_eq!(st.retrains, rounds);
    // Without reuse the region holds far fewer records than were built.
    let record = rolex_core::layout::ModelRecord::size_for(8, 8).unwrap();
    assert!(rounds * record > 10 * spare);
    assert!(st.records_reused > rounds / 2, "{st:?}");
    assert!(
        st.model_region_used <= start + spare,
        "used {} of {} + {spare}",
        st.model_region_used,
        start
    );
}

#[test]
fn a_stale_client_whose_record_was_reused_refreshes() {
    let pairs: Vec<(u64, u64)> = (0..200u64).map(|i| (i * 100, i)).collect();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let node = node(&pairs, 64 << 10);
    let models = node.model_count();
    // Both cache every record now; `careless` would lock through a cached
    // record for an hour (longer than the grace period: unsafe but for the
    // check of the record's identity in the lock's batch).
    let stale = client(&node, MAX_AGE);
    let careless = client(&node, Duration::from_secs(3600));
    let mut a = stale.session().unwrap();
    let mut b = careless.session().unwrap();
    // Retrain model 0 once: its cached record is retired. Then retrain the
    // others past the grace period until one takes its space.
    let cached = retrain(&node, 0).old_record;
    let mut taken = None;
    'rounds: for _ in 0..1000 {
        std::thread::sleep(GRACE);
        for m in 1..models {
            let r = retrain(&node, m);
            let size = rolex_core::layout::ModelRecord::size_for(r.leaves, r.segments).unwrap();
            if (r.new_record..r.new_record + size).contains(&cached) {
                taken = Some(r);
                break 'rounds;
            }
        }
    }
    let taken = taken.expect("the cached record's space was never reused");
    eprintln!(
        "model 0's cached record at {cached} now holds model {} (record at {})",
        taken.model_id, taken.new_record
    );
    // Keys of model 0, through both stale caches: right answers.
    let keys: Vec<u64> = model.keys().copied().take(10).collect();
    for &k in &keys {
        assert_eq!(a.get(k).unwrap(), model.get(&k).copied());
    }
    let k = keys[3] + 1;
    assert_eq!(a.insert(k, 7).unwrap(), model.insert(k, 7));
    assert_eq!(b.update(keys[1], 8).unwrap(), model.insert(keys[1], 8));
    assert_eq!(b.insert(k + 1, 9).unwrap(), model.insert(k + 1, 9));
    assert_eq!(b.delete(keys[2]).unwrap(), model.remove(&keys[2]));
    let fresh = client(&node, MAX_AGE);
    let mut f = fresh.session().unwrap();
    for (&k, &v) in &model {
        assert_eq!(f.get(k).unwrap(), Some(v));
    }
    // The other model's record was not written through.
    let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(f.range(0, u64::MAX).unwrap(), want);
    assert!(stale.stats().op(KvOp::Get).refreshes > 0);
    assert!(careless.stats().op(KvOp::Update).refreshes > 0);
}
