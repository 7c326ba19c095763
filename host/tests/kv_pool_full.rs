//! A memory node whose memory is really full answers writes that need
//! more of it with a clear error at once — `PoolFull` when the model region
//! has no room for the retraining a full SLT needs, `LeafRegionFull` when
//! no leaf is left — never after the SLT-full wait; and reads, updates and
//! deletes of the keys present go on.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rolex_host::kv::{KvClient, KvClientConfig, KvError, KvSession};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

/// Longest one failing insert may take: far below the SLT-full wait.
const FAST: Duration = Duration::from_secs(2);

fn node(pairs: &[(u64, u64)], model_region_spare: Option<u64>) -> MemoryNode {
    MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 4,
            spare_leaf_factor: 0.0,
            model_region_spare,
            record_grace: Duration::from_millis(10),
            ..MemoryNodeConfig::default()
        },
        pairs,
    )
    .unwrap()
}

fn client(node: &MemoryNode) -> KvClient {
    KvClient::connect(
        KvClientConfig {
            slt_full_wait: Duration::from_secs(10),
            model_max_age: Duration::from_millis(2),
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap()
}

/// Inserts keys from `keys` until one fails; returns its error. Every
/// insert, the failing one included, takes less than [`FAST`].
fn insert_until_full(
    s: &mut KvSession,
    model: &mut BTreeMap<u64, u64>,
    keys: impl Iterator<Item = u64>,
) -> KvError {
    for k in keys {
        let t = Instant::now();
        let r = s.insert(k, k);
        let took = t.elapsed();
        match r {
            Ok(old) => {
                assert_eq!(old, model.insert(k, k));
                assert!(took < FAST, "insert of {k} took {took:?}");
            }
            Err(e) => {
                eprintln!("insert of {k} failed after {took:?}: {e}");
                assert!(took < FAST, "the failing insert took {took:?}");
                assert!(!e.may_have_applied(), "{e}");
                return e;
            }
        }
    }
    panic!("the pool never filled");
}

/// Gets, updates and deletes of present keys still work.
fn reads_and_changes_go_on(s: &mut KvSession, model: &mut BTreeMap<u64, u64>) {
    for (&k, &v) in model.iter() {
        assert_eq!(s.get(k).unwrap(), Some(v), "key {k}");
    }
    let keys: Vec<u64> = model.keys().copied().step_by(7).collect();
    for (i, &k) in keys.iter().enumerate() {
        if i % 2 == 0 {
            assert_eq!(s.update(k, k + 1).unwrap(), model.insert(k, k + 1));
        } else {
            assert_eq!(s.delete(k).unwrap(), model.remove(&k));
        }
    }
    let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(s.range(0, u64::MAX).unwrap(), want);
}

#[test]
fn a_full_model_region_fails_inserts_at_once_and_reads_go_on() {
    let pairs: Vec<(u64, u64)> = (0..64u64).map(|i| (i << 20, i)).collect();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    // The smallest model region: room for one retraining of a model.
    let node = node(&pairs, Some(0));
    let c = client(&node);
    let mut s = c.session().unwrap();
    // Ever more leaves in model 0, whose records grow until none fits.
    let err = insert_until_full(&mut s, &mut model, 1..(1 << 20));
    assert!(matches!(err, KvError::PoolFull { model: 0, .. }), "{err}");
    let st = node.stats().agent;
    assert!(st.refusals > 0, "{st:?}");
    // Again: at once.
    let t = Instant::now();
    let again = s.insert((1 << 20) - 1, 0).unwrap_err();
    assert!(matches!(again, KvError::PoolFull { .. }), "{again}");
    assert!(t.elapsed() < FAST);
    reads_and_changes_go_on(&mut s, &mut model);
}

#[test]
fn a_full_leaf_region_fails_inserts_at_once_and_reads_go_on() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let pairs: Vec<(u64, u64)> = (0..64u64).map(|i| (i << 20, i)).collect();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let node = node(&pairs, None);
    let c = client(&node);
    let mut s = c.session().unwrap();
    let keys = std::iter::repeat_with(move || rng.gen_range(0..64u64 << 20));
    let err = insert_until_full(&mut s, &mut model, keys);
    assert!(matches!(err, KvError::LeafRegionFull { .. }), "{err}");
    reads_and_changes_go_on(&mut s, &mut model);
}
