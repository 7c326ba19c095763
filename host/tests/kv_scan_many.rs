//! Scans read together (`scan_many`, `scan_many_values`): each scan of a
//! call answers what a scan alone answers, against a `BTreeMap`, on one
//! memory node and across several (scans that start anywhere and cross
//! the nodes' boundaries); a call of short scans costs the round trips of
//! one; scans read together while another compute node inserts and the
//! memory node retrains return every key present throughout, in order.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{churning_node, cluster_with, eight_slot_node, loaded};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rolex_host::kv::{KvClient, KvClientConfig, KvError, KvOp};

fn bytes(key: u64, len: u8) -> Vec<u8> {
    (0..len).map(|i| (key as u8).wrapping_add(i)).collect()
}

/// The first `n` pairs of `model` from `from`.
fn first<V: Clone>(model: &BTreeMap<u64, V>, from: u64, n: usize) -> Vec<(u64, V)> {
    model
        .range(from..)
        .take(n)
        .map(|(k, v)| (*k, v.clone()))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// Byte values of 0 to 200 bytes written anywhere, then calls of up
    /// to 12 scans from anywhere (node boundaries and their neighbours
    /// among them): every scan of a call equals the model's first `n`
    /// pairs from its start, on the cluster and on one node's session
    /// alone; the `u64` call answers the same where every value is 8
    /// bytes, and refuses the call otherwise.
    #[test]
    fn each_scan_of_a_call_answers_as_the_model(
        nodes in 1usize..4,
        puts in proptest::collection::vec((0u64..3000, 0u8..200), 0..150),
        calls in proptest::collection::vec(
            proptest::collection::vec((0u64..3100, 1usize..120), 1..12),
            4,
        ),
    ) {
        let pairs = loaded(300, 10);
        let (_mns, c) = cluster_with(&pairs, nodes, |_, node| {
            KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap()
        });
        let mut model: BTreeMap<u64, Vec<u8>> =
            pairs.iter().map(|&(k, v)| (k, v.to_le_bytes().to_vec())).collect();
        let mut s = c.session().unwrap();
        for &(k, len) in &puts {
            let v = bytes(k, len);
            prop_assert_eq!(s.put(k, &v).unwrap(), model.insert(k, v).is_some());
        }
        let mut calls = calls;
        let mut edges = Vec::new();
        for i in 1..c.nodes() {
            let (lo, _) = c.map().range(i).unwrap();
            edges.extend([(lo, 50), (lo - 1, 3), (lo - 25, 7)]);
        }
        calls.push(edges);
        for scans in &calls {
            let got = s.scan_many_values(scans).unwrap();
            prop_assert_eq!(got.len(), scans.len());
            for (&(from, n), got) in scans.iter().zip(&got) {
                prop_assert_eq!(got, &first(&model, from, n), "scan {} {}", from, n);
            }
            let all_u64 = scans
                .iter()
                .all(|&(from, n)| first(&model, from, n).iter().all(|(_, v)| v.len() == 8));
            match s.scan_many(scans) {
                Ok(got) => {
                    prop_assert!(all_u64);
                    for (&(from, n), got) in scans.iter().zip(got) {
                        let want: Vec<(u64, u64)> = first(&model, from, n)
                            .into_iter()
                            .map(|(k, v)| (k, u64::from_le_bytes(v.try_into().unwrap())))
                            .collect();
                        prop_assert_eq!(got, want, "u64 scan {} {}", from, n);
                    }
                }
                Err(e) => {
                    prop_assert!(!all_u64, "{e}");
                    let value_not_u64 = match &e {
                        KvError::MemoryNode { error, .. } => {
                            matches!(**error, KvError::ValueNotU64 { .. })
                        }
                        e => matches!(e, KvError::ValueNotU64 { .. }),
                    };
                    prop_assert!(value_not_u64, "{e}");
                }
            }
        }
        // One node's own session: its scans stay in its pool.
        let mut own = c.node(0).unwrap().session().unwrap();
        let (_, hi0) = c.map().range(0).unwrap();
        let mine: BTreeMap<u64, Vec<u8>> =
            model.range(..=hi0).map(|(k, v)| (*k, v.clone())).collect();
        for scans in &calls {
            let got = own.scan_many_values(scans).unwrap();
            for (&(from, n), got) in scans.iter().zip(&got) {
                prop_assert_eq!(got, &first(&mine, from, n), "node 0 scan {} {}", from, n);
            }
        }
    }
}

/// Eight scans of a few leaves each, read together, cost one round trip
/// (eight alone cost eight) and count as eight scans; a call with a scan
/// of no pair is refused before anything is read.
#[test]
fn a_call_of_short_scans_costs_one_round_trip() {
    let pairs = loaded(3000, 4);
    let node = eight_slot_node(&pairs);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let scans: Vec<(u64, usize)> = (0..8u64).map(|i| (1 + i * 1400, 10)).collect();
    // Warm the cached models, then count.
    s.scan_many(&scans).unwrap();
    let before = client.stats().op(KvOp::Scan);
    let got = s.scan_many(&scans).unwrap();
    let after = client.stats().op(KvOp::Scan);
    let model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    for (&(from, n), got) in scans.iter().zip(&got) {
        assert_eq!(got, &first(&model, from, n));
    }
    assert_eq!(after.ops - before.ops, 8);
    assert_eq!(after.rtts - before.rtts, 1, "one round trip for the call");
    for &(from, n) in &scans {
        s.scan(from, n).unwrap();
    }
    let alone = client.stats().op(KvOp::Scan);
    assert_eq!(alone.rtts - after.rtts, 8, "one each alone");
    let rtts = alone.rtts;
    assert!(matches!(
        s.scan_many(&[(1, 5), (9, 0)]),
        Err(KvError::ScanCountZero)
    ));
    assert_eq!(client.stats().op(KvOp::Scan).rtts, rtts, "nothing read");
}

/// A scan of more chains than a round reads goes on in the next rounds
/// while the others of its call are done: a whole-store scan beside
/// short ones.
#[test]
fn a_long_scan_goes_on_beside_short_ones() {
    let pairs = loaded(3000, 4);
    let node = eight_slot_node(&pairs);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let scans = [(0, 5000), (401, 3), (8001, 40), (0, 1)];
    let got = s.scan_many(&scans).unwrap();
    for (&(from, n), got) in scans.iter().zip(&got) {
        assert_eq!(got, &first(&model, from, n), "scan {from} {n}");
    }
    assert_eq!(got[0].len(), 3000);
}

/// Calls of scans while another compute node inserts and deletes keys of
/// its own and the memory node splits and retrains all the time (stale
/// cached models are the rule): each scan is sorted, starts at or after its start, and
/// holds every loaded key (never deleted) between its start and its last
/// key; a scan short of its `n` pairs reached the end of the keys.
#[test]
fn scans_read_together_while_models_retrain_keep_every_key() {
    let pairs: Vec<(u64, u64)> = (0..400u64).map(|i| (i * 100, i)).collect();
    let node = churning_node(&pairs);
    let writer = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let inserter = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut s = writer.session().unwrap();
            let mut rng = StdRng::seed_from_u64(7);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) && n < 20_000 {
                // Keys of its own only, between the loaded ones, a
                // thousand of them inserted and deleted (bounded space).
                let k = rng.gen_range(0..1000u64) * 40 + 1;
                if rng.gen_bool(0.6) {
                    s.insert(k, n).unwrap();
                } else {
                    s.delete(k).unwrap();
                }
                n += 1;
            }
            n
        })
    };
    let loaded: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let mut s = reader.session().unwrap();
    let mut rng = StdRng::seed_from_u64(8);
    for _ in 0..300 {
        let scans: Vec<(u64, usize)> = (0..rng.gen_range(2..9))
            .map(|_| (rng.gen_range(0..41_000u64), rng.gen_range(1..60usize)))
            .collect();
        let got = s.scan_many(&scans).unwrap();
        for (&(from, n), got) in scans.iter().zip(&got) {
            assert!(got.len() <= n, "scan {from} {n}: {} pairs", got.len());
            assert!(
                got.windows(2).all(|w| w[0].0 < w[1].0),
                "scan {from} {n}: unsorted"
            );
            assert!(
                got.first().map_or(true, |p| p.0 >= from),
                "scan {from} {n}: starts before"
            );
            let last = got.last().map_or(u64::MAX, |p| p.0);
            let end = if got.len() < n { u64::MAX } else { last };
            for (&k, &v) in loaded.range(from..=end) {
                assert!(
                    got.binary_search_by_key(&k, |p| p.0)
                        .is_ok_and(|i| got[i].1 == v),
                    "scan {from} {n}: loaded key {k} missing or changed"
                );
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let inserted = inserter.join().unwrap();
    assert!(inserted > 0);
    let st = node.stats();
    assert!(st.agent.retrains > 0, "the models retrained while scanning");
    let scans = reader.stats().op(KvOp::Scan);
    assert!(scans.refreshes > 0, "the scans met stale models");
}
