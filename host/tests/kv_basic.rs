//! Single-threaded behaviour of the store against a `BTreeMap`: bulk load,
//! get, insert (with splits into synonym leaves), update, delete, scan and
//! range, and bad input.

use std::collections::BTreeMap;

mod common;

use rand::{Rng, SeedableRng};
use rolex_host::kv::{KvClient, KvClientConfig, KvError};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig, MemoryNodeError};

fn check_all(s: &mut rolex_host::kv::KvSession, model: &BTreeMap<u64, u64>) {
    for (&k, &v) in model {
        assert_eq!(s.get(k).unwrap(), Some(v), "key {k}");
    }
    let all = s.range(0, u64::MAX).unwrap();
    let want: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
    assert_eq!(all, want);
}

#[test]
fn bulk_loaded_keys_are_found_with_one_round_trip() {
    let pairs: Vec<(u64, u64)> = (0..2000u64).map(|i| (i * 977 + 5, i)).collect();
    let node = common::small_kv_node(&pairs);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    for &(k, v) in &pairs {
        assert_eq!(s.get(k).unwrap(), Some(v));
        assert_eq!(s.get(k + 1).unwrap(), None);
    }
    assert_eq!(s.get(0).unwrap(), None);
    assert_eq!(s.get(u64::MAX).unwrap(), None);
    let st = client.stats();
    let g = st.op(rolex_host::kv::KvOp::Get);
    assert_eq!(g.ops, 4002);
    assert_eq!(g.rtts, 4002, "a get with a fresh cache is one round trip");
    assert_eq!(g.leaves_read, 4002);
}

#[test]
fn random_ops_match_a_btreemap() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let pairs: Vec<(u64, u64)> = (0..300u64).map(|i| (i * 64, i)).collect();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let node = common::small_kv_node(&pairs);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    for i in 0..6000u64 {
        let k = rng.gen_range(0..300 * 64 + 100);
        match rng.gen_range(0..10) {
            0..=3 => assert_eq!(s.insert(k, i).unwrap(), model.insert(k, i), "insert {k}"),
            4 => {
                let want = model.get_mut(&k).map(|v| std::mem::replace(v, i));
                assert_eq!(s.update(k, i).unwrap(), want, "update {k}");
            }
            5..=6 => assert_eq!(s.delete(k).unwrap(), model.remove(&k), "delete {k}"),
            7 => {
                let n = rng.gen_range(1..40);
                let want: Vec<(u64, u64)> =
                    model.range(k..).take(n).map(|(&a, &b)| (a, b)).collect();
                assert_eq!(s.scan(k, n).unwrap(), want, "scan {k} {n}");
            }
            _ => assert_eq!(s.get(k).unwrap(), model.get(&k).copied(), "get {k}"),
        }
    }
    check_all(&mut s, &model);
    assert!(client.stats().synonym_leaves > 0, "inserts split leaves");
}

#[test]
fn extreme_keys_and_an_empty_store() {
    let node = common::small_kv_node(&[]);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    assert_eq!(s.get(0).unwrap(), None);
    assert_eq!(s.scan(0, 5).unwrap(), vec![]);
    for k in [u64::MAX, 0, u64::MAX - 1, 1, 1 << 63] {
        assert_eq!(s.insert(k, !k).unwrap(), None);
    }
    for k in [u64::MAX, 0, u64::MAX - 1, 1, 1 << 63] {
        assert_eq!(s.get(k).unwrap(), Some(!k));
    }
    assert_eq!(
        s.range(u64::MAX - 1, u64::MAX).unwrap(),
        vec![(u64::MAX - 1, 1), (u64::MAX, 0)]
    );
    assert_eq!(s.scan(u64::MAX, 3).unwrap(), vec![(u64::MAX, 0)]);
    assert_eq!(s.delete(u64::MAX).unwrap(), Some(0));
    assert_eq!(s.get(u64::MAX).unwrap(), None);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let pairs: Vec<(u64, u64)> = (0..100u64).map(|i| (i * 3, i)).collect();
    let node = common::small_kv_node(&pairs);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    assert_eq!(s.scan(0, 0), Err(KvError::ScanCountZero));
    assert_eq!(s.range(10, 9), Err(KvError::InvalidRange { lo: 10, hi: 9 }));
    let mut info = node.pool();
    info.layout_version += 1;
    assert!(matches!(
        KvClient::connect(KvClientConfig::default(), &info),
        Err(KvError::LayoutVersion { .. })
    ));
    // A pool whose superblock says another version.
    let pool = node.pool_handle();
    let mut word = [0u8; 4];
    pool.read(8, &mut word).unwrap();
    let v = u32::from_le_bytes(word);
    pool.write(8, &(v + 1).to_le_bytes()).unwrap();
    assert_eq!(
        KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap_err(),
        KvError::LayoutVersion {
            found: v + 1,
            expected: v
        }
    );
    pool.write(8, &v.to_le_bytes()).unwrap();
    // Nothing was corrupted.
    for &(k, val) in &pairs {
        assert_eq!(s.get(k).unwrap(), Some(val));
    }
    assert_eq!(s.range(0, u64::MAX).unwrap(), pairs);
    assert!(matches!(
        MemoryNode::start(MemoryNodeConfig::default(), &[(5, 1), (5, 2)]),
        Err(MemoryNodeError::Agent(_))
    ));
}
