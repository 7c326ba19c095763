//! Scans read together (`scan_many`, `scan_many_values`): each scan of a
//! call answers what a scan alone answers, against a `BTreeMap`, on one
//! memory node and across several (scans that start anywhere and cross
//! the nodes' boundaries); a call of short scans costs the round trips of
//! one; scans read together while another compute node inserts and the
//! memory node retrains return every key present throughout, in order;
//! scans of values while other compute nodes rewrite values of 0 to 300
//! bytes (pipelined on an unordered fabric, and op by op) return only
//! values written to their keys; and a key removed before a scan could
//! read its value leaves no hole (one node, and across nodes); a call of
//! more scans than one round's MiB of leaves holds answers each; scans at
//! the ends of the key space; and across three churning nodes, scans of
//! values while pipelined calls rewrite values across the nodes.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{churning_node, cluster_with, eight_slot_node, loaded, StopOnDrop};
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

/// Calls of `scan_many_values` (on an unordered fabric) while two other
/// compute nodes rewrite every loaded key with values of 0 to 300 bytes
/// (one through pipelined calls on an unordered fabric, one op by op)
/// and insert and delete keys between them, and the memory node splits,
/// merges and retrains all the time: each scan is sorted without
/// duplicates, at most `n` long, starts at or after its start, holds
/// every loaded key (never deleted) between its start and its last key,
/// and every value it returns is one some writer wrote to that key
/// (whole: no torn, foreign or freed block's bytes).
#[test]
fn scans_of_values_read_together_while_values_are_rewritten_return_written_values() {
    use rolex_host::kv::ValueRequest;
    use rolex_host::{EngineConfig, Fabric, LoopbackConfig, Unordered};
    use std::sync::Mutex;
    let unordered = |seed| KvClientConfig {
        engine: EngineConfig {
            fabric: Fabric::Loopback(LoopbackConfig {
                unordered: Some(Unordered {
                    seed,
                    window: 8,
                    writes_in_order: false,
                }),
                ..LoopbackConfig::default()
            }),
            ..EngineConfig::default()
        },
        ..KvClientConfig::default()
    };
    for seed in 1..=3u64 {
        let pairs: Vec<(u64, u64)> = (0..200u64).map(|i| (i * 100, i)).collect();
        let node = churning_node(&pairs);
        // Every value written to each key (before it is written), and the
        // load values: a value read must be among them.
        let written: Mutex<HashMap<u64, Vec<Vec<u8>>>> = Mutex::new(
            pairs
                .iter()
                .map(|&(k, v)| (k, vec![v.to_le_bytes().to_vec()]))
                .collect(),
        );
        let note = |k: u64, v: &[u8]| {
            written
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(k)
                .or_default()
                .push(v.to_vec());
        };
        // Writers finished.
        let done = std::sync::atomic::AtomicUsize::new(0);
        let loaded: BTreeMap<u64, u64> = pairs.iter().copied().collect();
        std::thread::scope(|scope| {
            // A pipelined writer: calls of up to 8 requests.
            let piped = KvClient::connect(unordered(seed), &node.pool()).unwrap();
            let (done, note) = (&done, &note);
            scope.spawn(move || {
                let mut s = piped.session().unwrap();
                let mut rng = StdRng::seed_from_u64(seed * 10 + 1);
                let mut id = 1u64 << 40;
                while id < (1 << 40) + 4_000 {
                    let data: Vec<(bool, u64, Vec<u8>)> = (0..rng.gen_range(1..=8))
                        .map(|_| {
                            id += 1;
                            let i = rng.gen_range(0..400u64);
                            let key = i * 50 + u64::from(rng.gen_bool(0.5)) * 7;
                            let v = common::id_value(key, id, rng.gen_range(0..=300));
                            (rng.gen_bool(0.2) && key % 100 != 0, key, v)
                        })
                        .collect();
                    for (remove, k, v) in &data {
                        if !remove {
                            note(*k, v);
                        }
                    }
                    let reqs: Vec<ValueRequest<'_>> = data
                        .iter()
                        .map(|(remove, k, v)| match remove {
                            true => ValueRequest::Remove(*k),
                            false => ValueRequest::Put(*k, v),
                        })
                        .collect();
                    for (r, a) in reqs.iter().zip(s.run_many_values(&reqs).unwrap()) {
                        a.unwrap_or_else(|e| panic!("{r:?}: {e}"));
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
            // A writer op by op.
            let single = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
            scope.spawn(move || {
                let mut s = single.session().unwrap();
                let mut rng = StdRng::seed_from_u64(seed * 10 + 2);
                let mut id = 2u64 << 40;
                while id < (2 << 40) + 2_000 {
                    id += 1;
                    let key = rng.gen_range(0..800u64) * 25;
                    let v = common::id_value(key, id, rng.gen_range(0..=300));
                    if key % 100 != 0 && rng.gen_bool(0.3) {
                        s.remove(key).unwrap();
                    } else {
                        note(key, &v);
                        s.put(key, &v).unwrap();
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
            let reader = KvClient::connect(unordered(seed + 100), &node.pool()).unwrap();
            let mut s = reader.session().unwrap();
            let mut rng = StdRng::seed_from_u64(seed * 10 + 3);
            let mut call = 0;
            // Scans all along the writes, and some after.
            while done.load(Ordering::SeqCst) < 2 || call < 100 {
                call += 1;
                let scans: Vec<(u64, usize)> = (0..rng.gen_range(1..9))
                    .map(|_| (rng.gen_range(0..21_000u64), rng.gen_range(1..60usize)))
                    .collect();
                // Read together, or one by one.
                let got = if call % 4 == 0 {
                    scans
                        .iter()
                        .map(|&(f, n)| s.scan_values(f, n).unwrap())
                        .collect()
                } else {
                    s.scan_many_values(&scans).unwrap()
                };
                assert_eq!(got.len(), scans.len());
                // (A check that failed poisons it: the writers go on.)
                let written = written.lock().unwrap_or_else(|e| e.into_inner());
                for (&(from, n), got) in scans.iter().zip(&got) {
                    let at = format!("seed {seed} call {call} scan ({from}, {n})");
                    check_scan_of_values(&at, (from, n), got, &written, &loaded);
                }
            }
        });
        assert!(node.stats().agent.retrains > 0, "seed {seed}: retrained");
        assert!(node.last_agent_error().is_none(), "seed {seed}");
    }
}

/// Checks a scan of values `(from, n)` that ran while other compute
/// nodes wrote (`written`: every value written to each key, the loaded
/// ones first) and never removed a `loaded` key: at most `n` pairs, sorted,
/// from `from` on, each value one written to its key, and every loaded
/// key up to its last pair present (up to the end of the keys if it
/// returned fewer than `n`: a short scan says the keys ended).
fn check_scan_of_values(
    at: &str,
    (from, n): (u64, usize),
    got: &[(u64, Vec<u8>)],
    written: &HashMap<u64, Vec<Vec<u8>>>,
    loaded: &BTreeMap<u64, u64>,
) {
    assert!(got.len() <= n, "{at}: {} pairs", got.len());
    assert!(got.windows(2).all(|w| w[0].0 < w[1].0), "{at}: unsorted");
    assert!(
        got.first().map_or(true, |p| p.0 >= from),
        "{at}: starts before"
    );
    for (k, v) in got {
        assert!(
            written.get(k).is_some_and(|w| w.contains(v)),
            "{at}: key {k}: {} bytes no writer wrote to it",
            v.len()
        );
    }
    let last = got.last().map_or(u64::MAX, |p| p.0);
    let end = if got.len() < n { u64::MAX } else { last };
    for &k in loaded.range(from..=end).map(|(k, _)| k) {
        assert!(
            got.binary_search_by_key(&k, |p| p.0).is_ok(),
            "{at}: loaded key {k} missing: {:?}",
            got.iter().map(|p| p.0).collect::<Vec<_>>()
        );
    }
}

/// A key removed between the read of its leaf and the read of its value
/// block is left out of a scan of values; the scan must still return its
/// `n` pairs (the next key present takes its place), or it says the keys
/// ended (fewer than `n` pairs) while loaded keys follow — and across
/// nodes a scan short on one node goes on at the next node's range
/// start, skipping the rest of the first node's keys. One compute node
/// puts and removes a long value at key `k` again and again (the second
/// key of node 0; its blocks are reused soon after they are freed);
/// another scans values from `k`, long scans alone and read together
/// (their leaves take longer to read than a block's reuse), on node 0's session
/// and across the cluster: each answer is the loaded keys' first `n`
/// pairs from its start, or the same with `k` (and its value) among them.
#[test]
fn a_pair_removed_before_its_value_is_read_leaves_no_hole_in_a_scan() {
    let pairs = loaded(40_000, 10);
    let (mns, c) = cluster_with(&pairs, 2, |_, node| {
        KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap()
    });
    let (lo1, _) = c.map().range(1).unwrap();
    // Not a loaded key (those are 1 mod 10).
    let k = 15;
    // Long enough that the blocks waiting out their grace pass
    // `ValueSpace::WAITING_MAX` after a few dozen removes: each is reused
    // soon after it was freed.
    let long = common::id_value(k, 7, 256 << 10);
    let model: BTreeMap<u64, Vec<u8>> = pairs
        .iter()
        .map(|&(k, v)| (k, v.to_le_bytes().to_vec()))
        .collect();
    let with_k = |m: &BTreeMap<u64, Vec<u8>>| {
        let mut m = m.clone();
        m.insert(k, long.clone());
        m
    };
    // Node 0's own session sees its range only.
    let mine: BTreeMap<u64, Vec<u8>> = model.range(..lo1).map(|(k, v)| (*k, v.clone())).collect();
    let (model, mine) = (
        [model.clone(), with_k(&model)],
        [mine.clone(), with_k(&mine)],
    );
    let churner = KvClient::connect(KvClientConfig::default(), &mns[0].pool()).unwrap();
    let stop = AtomicBool::new(false);
    let mut own = c.node(0).unwrap().session().unwrap();
    let mut s = c.session().unwrap();
    let n = 15_000;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let mut w = churner.session().unwrap();
            while !stop.load(Ordering::Relaxed) {
                w.put(k, &long).unwrap();
                w.remove(k).unwrap();
            }
        });
        type Model = BTreeMap<u64, Vec<u8>>;
        let check = |what: &str, m: &[Model; 2], from, n, got: &Vec<(u64, Vec<u8>)>| {
            assert!(
                m.iter().any(|m| *got == first(m, from, n)),
                "{what} ({from}, {n}): {} pairs, {:?} …",
                got.len(),
                got.iter().take(3).map(|p| p.0).collect::<Vec<_>>()
            );
        };
        // The writer stops however the scans end (a failed check too).
        let _stop = StopOnDrop(&stop);
        for _ in 0..60 {
            check("scan_values", &mine, k, n, &own.scan_values(k, n).unwrap());
            check(
                "cluster scan_values",
                &model,
                k,
                n,
                &s.scan_values(k, n).unwrap(),
            );
            let scans = [(k, n), (k, 1), (k - 4, 2)];
            for (&(from, n), got) in scans.iter().zip(&own.scan_many_values(&scans).unwrap()) {
                check("scan_many_values", &mine, from, n, got);
            }
            for (&(from, n), got) in scans.iter().zip(&s.scan_many_values(&scans).unwrap()) {
                check("cluster scan_many_values", &model, from, n, got);
            }
        }
    });
}

/// A call of more scans than one round's MiB of leaves holds (hundreds
/// of long scans, and duplicates): its scans go on in the next rounds,
/// each answering as the model, on one node and across three.
#[test]
fn a_call_of_more_scans_than_a_round_holds_answers_each() {
    let pairs = loaded(60_000, 3);
    let model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let node = rolex_host::memnode::MemoryNode::start(Default::default(), &pairs).unwrap();
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let (_mns, c) = cluster_with(&pairs, 3, |_, node| {
        KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap()
    });
    let mut cs = c.session().unwrap();
    let mut rng = StdRng::seed_from_u64(5);
    for call in 0..4 {
        let mut scans: Vec<(u64, usize)> = (0..300)
            .map(|_| (rng.gen_range(0..181_000u64), rng.gen_range(300..1500usize)))
            .collect();
        scans.extend_from_within(..20);
        let before = client.stats().op(KvOp::Scan).rtts;
        let got = s.scan_many(&scans).unwrap();
        let rounds = client.stats().op(KvOp::Scan).rtts - before;
        assert!(rounds > 1, "call {call}: {rounds} round trips");
        for (&(from, n), got) in scans.iter().zip(&got) {
            assert_eq!(
                got,
                &first(&model, from, n),
                "call {call}: scan ({from}, {n})"
            );
        }
        let got = cs.scan_many_values(&scans).unwrap();
        for (&(from, n), got) in scans.iter().zip(&got) {
            let want: Vec<(u64, Vec<u8>)> = first(&model, from, n)
                .into_iter()
                .map(|(k, v)| (k, v.to_le_bytes().to_vec()))
                .collect();
            assert_eq!(got, &want, "call {call}: cluster scan ({from}, {n})");
        }
    }
}

/// Scans at the ends of the key space: from 0, from `u64::MAX` and just
/// below, with `n` up to `usize::MAX`, over a store holding keys 0,
/// `u64::MAX - 1` and `u64::MAX`: each answers as the model, read
/// together, on one node and across three.
#[test]
fn scans_at_the_ends_of_the_key_space_answer_as_the_model() {
    let mut pairs = loaded(3000, 4);
    pairs.insert(0, (0, 77));
    pairs.push((u64::MAX - 1, 78));
    pairs.push((u64::MAX, 79));
    let model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let node = eight_slot_node(&pairs);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let (_mns, c) = cluster_with(&pairs, 3, |_, node| {
        KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap()
    });
    let mut cs = c.session().unwrap();
    let scans = [
        (u64::MAX, 5),
        (u64::MAX - 1, 1),
        (u64::MAX - 2, usize::MAX),
        (0, 1),
        (0, usize::MAX),
        (11_990, usize::MAX),
        (u64::MAX / 2, 3),
    ];
    let got = s.scan_many(&scans).unwrap();
    let got_c = cs.scan_many(&scans).unwrap();
    let got_v = cs.scan_many_values(&scans).unwrap();
    for (i, &(from, n)) in scans.iter().enumerate() {
        let want = first(&model, from, n);
        assert_eq!(got[i], want, "scan ({from}, {n})");
        assert_eq!(got_c[i], want, "cluster scan ({from}, {n})");
        let want_v: Vec<(u64, Vec<u8>)> = want
            .iter()
            .map(|&(k, v)| (k, v.to_le_bytes().to_vec()))
            .collect();
        assert_eq!(got_v[i], want_v, "cluster values scan ({from}, {n})");
        assert_eq!(s.scan(from, n).unwrap(), want, "alone ({from}, {n})");
    }
}

/// Across three memory nodes that split, merge and retrain all the time:
/// calls of scans of values read together (many crossing the nodes'
/// boundaries) while another compute node rewrites the loaded keys with
/// values of 0 to 300 bytes and puts and removes keys between them, in
/// pipelined calls across the nodes on an unordered fabric: each scan
/// is sorted, at most `n` long, holds every loaded key between its start
/// and its last key (every one after it too, if short), each with a
/// value written to it.
#[test]
fn cluster_scans_of_values_while_values_are_rewritten_leave_no_hole() {
    use rolex_host::kv::cluster::{ClusterClient, ClusterNode, PartitionMap};
    use rolex_host::kv::ValueRequest;
    use rolex_host::{EngineConfig, Fabric, LoopbackConfig, Unordered};
    use std::sync::Mutex;
    for seed in 1..=2u64 {
        let pairs: Vec<(u64, u64)> = (0..300u64).map(|i| (i * 100, i)).collect();
        let keys: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        let map = PartitionMap::balanced(&keys, 3).unwrap();
        let mut mns = Vec::new();
        let connect = |mns: &[rolex_host::memnode::MemoryNode], unordered: bool| {
            let nodes = mns
                .iter()
                .enumerate()
                .map(|(i, mn)| ClusterNode {
                    name: format!("node-{i}"),
                    client: KvClient::connect(
                        KvClientConfig {
                            engine: EngineConfig {
                                fabric: Fabric::Loopback(LoopbackConfig {
                                    unordered: unordered.then_some(Unordered {
                                        seed,
                                        window: 8,
                                        writes_in_order: false,
                                    }),
                                    ..LoopbackConfig::default()
                                }),
                                ..EngineConfig::default()
                            },
                            ..KvClientConfig::default()
                        },
                        &mn.pool(),
                    )
                    .unwrap(),
                })
                .collect();
            ClusterClient::new(map.clone(), nodes).unwrap()
        };
        for i in 0..3 {
            let (lo, hi) = map.range(i).unwrap();
            let mine: Vec<(u64, u64)> = pairs
                .iter()
                .copied()
                .filter(|&(k, _)| lo <= k && k <= hi)
                .collect();
            mns.push(churning_node(&mine));
        }
        let writer = connect(&mns, true);
        let reader = connect(&mns, false);
        let written: Mutex<HashMap<u64, Vec<Vec<u8>>>> = Mutex::new(
            pairs
                .iter()
                .map(|&(k, v)| (k, vec![v.to_le_bytes().to_vec()]))
                .collect(),
        );
        let done = AtomicBool::new(false);
        let loaded: BTreeMap<u64, u64> = pairs.iter().copied().collect();
        std::thread::scope(|scope| {
            let (written, done) = (&written, &done);
            scope.spawn(move || {
                let _done = StopOnDrop(done);
                let mut s = writer.session().unwrap();
                let mut rng = StdRng::seed_from_u64(seed * 10 + 1);
                let mut id = 1u64 << 40;
                for _ in 0..600 {
                    let data: Vec<(bool, u64, Vec<u8>)> = (0..rng.gen_range(1..=12))
                        .map(|_| {
                            id += 1;
                            let key = rng.gen_range(0..1200u64) * 25;
                            let v = common::id_value(key, id, rng.gen_range(0..=300));
                            (rng.gen_bool(0.3) && key % 100 != 0, key, v)
                        })
                        .collect();
                    {
                        let mut w = written.lock().unwrap_or_else(|e| e.into_inner());
                        for (remove, k, v) in &data {
                            if !remove {
                                w.entry(*k).or_default().push(v.clone());
                            }
                        }
                    }
                    let reqs: Vec<ValueRequest<'_>> = data
                        .iter()
                        .map(|(remove, k, v)| match remove {
                            true => ValueRequest::Remove(*k),
                            false => ValueRequest::Put(*k, v),
                        })
                        .collect();
                    for (r, a) in reqs.iter().zip(s.run_many_values(&reqs)) {
                        a.unwrap_or_else(|e| panic!("{r:?}: {e}"));
                    }
                }
            });
            let mut s = reader.session().unwrap();
            let mut rng = StdRng::seed_from_u64(seed * 10 + 3);
            let mut call = 0;
            while !done.load(Ordering::Relaxed) || call < 50 {
                call += 1;
                let scans: Vec<(u64, usize)> = (0..rng.gen_range(1..9))
                    .map(|_| (rng.gen_range(0..31_000u64), rng.gen_range(1..80usize)))
                    .collect();
                let got = if call % 4 == 0 {
                    scans
                        .iter()
                        .map(|&(f, n)| s.scan_values(f, n).unwrap())
                        .collect()
                } else {
                    s.scan_many_values(&scans).unwrap()
                };
                let written = written.lock().unwrap_or_else(|e| e.into_inner());
                for (&(from, n), got) in scans.iter().zip(&got) {
                    let at = format!("seed {seed} call {call} scan ({from}, {n})");
                    check_scan_of_values(&at, (from, n), got, &written, &loaded);
                }
            }
        });
        for mn in &mns {
            assert!(mn.last_agent_error().is_none(), "seed {seed}");
        }
    }
}
