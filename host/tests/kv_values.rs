//! Values of any size: byte values against a `BTreeMap` (inline and out of
//! line, through splits and retraining), round trips per operation, the
//! `u64` methods refusing other lengths, torn and reused value blocks
//! detected (never returned), concurrent writers never exposing a mixed
//! value, space reused under an update-heavy run, large free blocks
//! carved for small values, and linearizability of histories with values
//! of many lengths.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

mod common;

use rand::{Rng, SeedableRng};
use rolex_core::layout::{Superblock, ValueRegionHeader};
use rolex_host::kv::{KvClient, KvClientConfig, KvError, KvOp, KvSession};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

/// The bytes of value `id` of `key`: a length picked by `id` (8 bytes
/// inline, 9 to 70,000 out of line), the id, then a pattern of both, so a
/// value from another key or write, or a torn mix of two, never passes
/// [`decode`]. (Shorter values are tested against the model.)
fn encode(key: u64, id: u64) -> Vec<u8> {
    const LENS: [usize; 8] = [8, 9, 40, 100, 1000, 4096, 16, 70_000];
    let len = LENS[(id % LENS.len() as u64) as usize];
    let mut out = Vec::with_capacity(len);
    let mut x = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ id;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    if len >= 8 {
        out[..8].copy_from_slice(&id.to_le_bytes());
    }
    out
}

/// The id of `bytes` if they are a value [`encode`] made for `key`.
fn decode(key: u64, bytes: &[u8]) -> Option<u64> {
    let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    (encode(key, id) == bytes).then_some(id)
}

fn node(pairs: &[(u64, u64)], value_spare: u64) -> MemoryNode {
    common::value_node(pairs, value_spare, encode)
}

#[test]
fn byte_values_match_a_btreemap_through_splits_and_retraining() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let pairs: Vec<(u64, u64)> = (0..400u64).map(|i| (i * 50, i)).collect();
    let mut model: BTreeMap<u64, Vec<u8>> = pairs.iter().map(|&(k, i)| (k, encode(k, i))).collect();
    let node = node(&pairs, 64 << 20);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let mut buf = Vec::new();
    for i in 1000..7000u64 {
        let k = rng.gen_range(0..400 * 50 + 100);
        let mut v = encode(k, i);
        if i % 5 == 0 {
            v.truncate(rng.gen_range(0..8)); // inline, shorter than 8
        }
        match rng.gen_range(0..10) {
            0..=3 => assert_eq!(
                s.put(k, &v).unwrap(),
                model.insert(k, v).is_some(),
                "put {k}"
            ),
            4 => {
                let present = model.contains_key(&k);
                if present {
                    model.insert(k, v.clone());
                }
                assert_eq!(s.update_value(k, &v).unwrap(), present, "update {k}");
            }
            5 => assert_eq!(
                s.remove(k).unwrap(),
                model.remove(&k).is_some(),
                "remove {k}"
            ),
            6 => {
                let n = rng.gen_range(1..20);
                let want: Vec<(u64, Vec<u8>)> = model
                    .range(k..)
                    .take(n)
                    .map(|(&k, v)| (k, v.clone()))
                    .collect();
                assert_eq!(s.scan_values(k, n).unwrap(), want, "scan {k}");
            }
            _ => {
                let found = s.get_into(k, &mut buf).unwrap();
                assert_eq!(found.then_some(&buf), model.get(&k), "get {k}");
            }
        }
        if i % 1500 == 0 {
            for m in 0..node.model_count() {
                common::retrain_unless_busy(&node, m);
            }
        }
    }
    let all = s.range_values(0, u64::MAX).unwrap();
    let want: Vec<(u64, Vec<u8>)> = model.into_iter().collect();
    assert_eq!(all.len(), want.len());
    assert!(all == want, "the final range differs from the model");
}

#[test]
fn round_trips_per_operation_with_values_in_and_out_of_line() {
    let pairs: Vec<(u64, u64)> = (0..200u64).map(|i| (i * 100, i * 8)).collect(); // id % 8 == 0: 8 bytes
    let node = node(&pairs, 16 << 20);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    assert!(client.ordered(), "the default loopback fabric is ordered");
    let before = client.stats();
    for i in 0..100u64 {
        assert!(s.get_value(i * 100).unwrap().is_some());
    }
    let mid = client.stats();
    assert_eq!(
        mid.op(KvOp::Get).rtts - before.op(KvOp::Get).rtts,
        100,
        "an inline get is one round trip"
    );
    // Prime the value space (a chunk claim is one FAA round trip): keys
    // 100..200 take 100 blocks, then give them back (inline values again),
    // and the grace period passes.
    for i in 100..200u64 {
        assert!(s.update_value(i * 100, &[1u8; 1024]).unwrap());
    }
    for i in 100..200u64 {
        assert!(s.update_value(i * 100, &[1u8; 8]).unwrap());
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mid = client.stats();
    for i in 0..100u64 {
        assert!(s.update_value(i * 100, &[i as u8; 1024]).unwrap());
    }
    let upd = client.stats();
    assert_eq!(
        upd.op(KvOp::Update).rtts - mid.op(KvOp::Update).rtts,
        200,
        "an out-of-line update is two round trips: the block rides with the lock"
    );
    for i in 0..100u64 {
        assert_eq!(s.get_value(i * 100).unwrap(), Some(vec![i as u8; 1024]));
    }
    let end = client.stats();
    assert_eq!(
        end.op(KvOp::Get).rtts - upd.op(KvOp::Get).rtts,
        200,
        "an out-of-line get is the leaf, then the block"
    );
    assert_eq!(
        end.op(KvOp::Get).value_bytes - upd.op(KvOp::Get).value_bytes,
        100 * 1024
    );
}

#[test]
fn u64_methods_refuse_other_lengths_and_change_nothing() {
    let pairs: Vec<(u64, u64)> = (0..50u64).map(|i| (i * 10, i * 8)).collect();
    let node = node(&pairs, 16 << 20);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    s.put(10, b"hello, a longer value").unwrap();
    s.put(20, b"abc").unwrap();
    for key in [10, 20] {
        let len = s.get_value(key).unwrap().unwrap().len();
        let not = KvError::ValueNotU64 { key, len };
        assert_eq!(s.get(key), Err(not.clone()));
        assert_eq!(s.insert(key, 5), Err(not.clone()));
        assert_eq!(s.update(key, 5), Err(not.clone()));
        assert_eq!(s.delete(key), Err(not.clone()));
        assert!(!not.may_have_applied());
        assert_eq!(s.get_value(key).unwrap().unwrap().len(), len, "unchanged");
    }
    assert!(matches!(
        s.scan(0, 5),
        Err(KvError::ValueNotU64 { key: 10, .. })
    ));
    assert_eq!(s.get(30).unwrap(), Some(24), "8-byte values read as u64");
    assert!(s.remove(10).unwrap());
    assert_eq!(s.get_value(10).unwrap(), None);
    let e = s.put(1, &vec![0; rolex_core::layout::MAX_VALUE_LEN + 1]);
    assert!(matches!(e, Err(KvError::ValueTooLong { .. })), "{e:?}");
    assert!(!s.put(1, &[]).unwrap(), "key 1 was absent");
    assert_eq!(
        s.get_value(1).unwrap(),
        Some(Vec::new()),
        "an empty value is a value"
    );
}

#[test]
fn torn_and_reused_blocks_are_detected_never_returned() {
    let pairs: Vec<(u64, u64)> = vec![(100, 1), (200, 2)];
    let node = node(&pairs, 16 << 20);
    let cfg = KvClientConfig {
        max_attempts: 50,
        ..KvClientConfig::default()
    };
    let client = KvClient::connect(cfg, &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    // The loaded values are 9 and 40 bytes (ids 1, 2), in blocks packed
    // from the start of the value region, key 100's first.
    let mh = node.pool_handle();
    let sb = Superblock::read(&mh.to_vec(0, Superblock::SIZE as usize).unwrap()).unwrap();
    let first = sb.value_region_offset() + ValueRegionHeader::SIZE;
    assert_eq!(s.get_value(100).unwrap(), Some(encode(100, 1)));
    // A torn block: one value byte changed under the checksum.
    let at = first + 32 + 4;
    let word = mh.load_u64(at & !7).unwrap();
    mh.store_u64(at & !7, word ^ 0xff).unwrap();
    let e = s.get_value(100).unwrap_err();
    assert!(matches!(e, KvError::TooManyRetries { .. }), "{e:?}");
    mh.store_u64(at & !7, word).unwrap();
    assert_eq!(s.get_value(100).unwrap(), Some(encode(100, 1)));
    // A reused block: its header names another key (generation and
    // checksum made consistent by a real write through the other key is
    // what reuse looks like; a changed key word alone must be refused).
    let key_word = first + 8;
    mh.store_u64(key_word, 200).unwrap();
    assert!(s.get_value(100).is_err());
    mh.store_u64(key_word, 100).unwrap();
    assert_eq!(s.get_value(100).unwrap(), Some(encode(100, 1)));
}

#[test]
fn concurrent_writers_never_expose_a_mixed_or_foreign_value() {
    // Four keys, two writers rewriting them with values of every length
    // (blocks freed and reused with new generations all along), two
    // readers checking that every value read is one some writer wrote to
    // that very key, whole.
    let pairs: Vec<(u64, u64)> = (0..4u64).map(|i| (i * 1000, i * 8)).collect();
    let node = node(&pairs, 64 << 20);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for w in 0..2u64 {
            let client = client.clone();
            let stop = &stop;
            scope.spawn(move || {
                let mut s = client.session().unwrap();
                for i in 0..2000u64 {
                    let key = (i % 4) * 1000;
                    s.put(key, &encode(key, 2 * i + w)).unwrap();
                }
                stop.store(true, SeqCst);
            });
        }
        for _ in 0..2 {
            let (client, stop) = (client.clone(), &stop);
            scope.spawn(move || {
                let mut s = client.session().unwrap();
                let mut buf = Vec::new();
                let mut reads = 0;
                while !stop.load(SeqCst) || reads < 100 {
                    let key = (reads % 4) * 1000;
                    assert!(s.get_into(key, &mut buf).unwrap());
                    assert!(
                        decode(key, &buf).is_some(),
                        "key {key}: {} bytes that no writer wrote to it",
                        buf.len()
                    );
                    for (k, v) in s.scan_values(0, 4).unwrap() {
                        assert!(decode(k, &v).is_some(), "scan: key {k}");
                    }
                    reads += 1;
                }
            });
        }
    });
}

#[test]
fn update_heavy_large_values_reuse_their_space() {
    let pairs: Vec<(u64, u64)> = (0..200u64).map(|i| (i * 10, i * 8 + 5)).collect(); // 4 KiB each
    let node = node(&pairs, 64 << 20);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let start = node.stats().value_bytes;
    let mut s = client.session().unwrap();
    let value = vec![0x5au8; 4096];
    for i in 0..20_000u64 {
        assert!(s.update_value((i % 200) * 10, &value).unwrap());
    }
    let end = node.stats().value_bytes;
    let written = 20_000 * 4096u64;
    // The loaded blocks plus a bounded slack (a chunk or two, at most 8 MiB
    // of blocks waiting out their grace period), far below what was
    // written.
    assert!(
        end <= start + 16 * (1 << 20),
        "value bytes {start} -> {end} after writing {written}"
    );
    let (claimed, free) = client.stats().value_space;
    assert!(free <= claimed, "{free} of {claimed}");
    for i in 0..200u64 {
        assert_eq!(s.get_value(i * 10).unwrap().as_deref(), Some(&value[..]));
    }
}

/// One random operation with byte values, recorded for the checker: ids
/// stand for values ([`encode`]), `put` answers whether the key was new.
fn value_op(
    s: &mut KvSession,
    rec: &mut rolex_checker::Recorder,
    rng: &mut rand::rngs::StdRng,
    key: u64,
    id: u64,
) {
    use rolex_checker::{Call, Ret};
    let ids = |entries: Vec<(u64, Vec<u8>)>| -> Vec<(u64, u64)> {
        entries
            .into_iter()
            .map(|(k, v)| (k, decode(k, &v).expect("a value no one wrote")))
            .collect()
    };
    match rng.gen_range(0..10) {
        0..=2 => {
            let op = rec.invoke(Call::Get { key });
            let r = s.get_value(key).unwrap();
            let r = r.map(|v| decode(key, &v).expect("a value no one wrote"));
            rec.finish(op, Ret::Value(r));
        }
        3..=4 => {
            let op = rec.invoke(Call::Insert { key, value: id });
            let replaced = s.put(key, &encode(key, id)).unwrap();
            rec.finish(op, Ret::Applied(!replaced));
        }
        5 => {
            let op = rec.invoke(Call::Update { key, value: id });
            let r = s.update_value(key, &encode(key, id)).unwrap();
            rec.finish(op, Ret::Applied(r));
        }
        6 => {
            let op = rec.invoke(Call::Delete { key });
            let r = s.remove(key).unwrap();
            rec.finish(op, Ret::Applied(r));
        }
        7..=8 => {
            let n = rng.gen_range(1..6);
            let op = rec.invoke(Call::Scan { from: key, n });
            let r = s.scan_values(key, n).unwrap();
            rec.finish(op, Ret::Entries(ids(r)));
        }
        _ => {
            let hi = key + rng.gen_range(0..4u64) * 1000;
            let op = rec.invoke(Call::Range { lo: key, hi });
            let r = s.range_values(key, hi).unwrap();
            rec.finish(op, Ret::Entries(ids(r)));
        }
    }
}

#[test]
fn histories_with_values_of_many_lengths_are_linearizable() {
    let pairs: Vec<(u64, u64)> = (0..10u64).map(|i| (i * 2000, i)).collect();
    let node = MemoryNode::start_with_values(
        MemoryNodeConfig {
            value_spare: Some(32 << 20),
            ..common::churning_config()
        },
        &pairs,
        &mut |k, id, out| out.extend_from_slice(&encode(k, id)),
    )
    .unwrap();
    let clients = [
        KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap(),
        KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap(),
    ];
    // Ids are unique per (thread, op) and cover every length class.
    let (checked, _) =
        common::run_history(&node, &clients, &pairs, (4, 250, 3), |s, rec, rng, t, i| {
            let key = rng.gen_range(0..20u64) * 1000;
            let id = 100 + (t as u64) * 1000 + i;
            value_op(s, rec, rng, key, id);
        });
    assert!(checked.single_ops > 0 && checked.scans > 0);
}

#[test]
fn get_many_answers_as_single_gets_in_one_round_trip() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let pairs: Vec<(u64, u64)> = (0..600u64).map(|i| (i * 30, i)).collect();
    let mut model: BTreeMap<u64, Vec<u8>> = pairs.iter().map(|&(k, i)| (k, encode(k, i))).collect();
    let node = node(&pairs, 64 << 20);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    // A fresh cache: 32 gets of 8-byte values in one round trip.
    let keys: Vec<u64> = (0..32u64).map(|i| i * 8 * 30).collect(); // ids ≡ 0 mod 8
    let before = client.stats().op(KvOp::Get);
    let got = s.get_many(&keys).unwrap();
    let after = client.stats().op(KvOp::Get);
    assert_eq!((after.ops - before.ops, after.rtts - before.rtts), (32, 1));
    for (k, v) in keys.iter().zip(&got) {
        assert_eq!(*v, Some(k / 30), "key {k}");
    }
    // Then with writes, splits and retraining between the reads (stale
    // caches), values of every length, absent and repeated keys.
    for round in 0..40u64 {
        for _ in 0..40 {
            let k = rng.gen_range(0..600 * 30 + 50);
            let id = 1000 + round * 100 + rng.gen_range(0..100);
            if rng.gen_bool(0.2) {
                s.remove(k).unwrap();
                model.remove(&k);
            } else {
                s.put(k, &encode(k, id)).unwrap();
                model.insert(k, encode(k, id));
            }
        }
        if round % 10 == 9 {
            for m in 0..node.model_count() {
                common::retrain_unless_busy(&node, m);
            }
        }
        let keys: Vec<u64> = (0..24).map(|_| rng.gen_range(0..600 * 30 + 50)).collect();
        let got = s.get_many_values(&keys).unwrap();
        for (k, v) in keys.iter().zip(got) {
            assert_eq!(v.as_ref(), model.get(k), "round {round}, key {k}");
        }
    }
    // The u64 form refuses a value that is not 8 bytes, naming its key.
    s.put(7, b"abc").unwrap();
    let e = s.get_many(&[0, 7]).unwrap_err();
    assert!(
        matches!(e, KvError::ValueNotU64 { key: 7, len: 3 }),
        "{e:?}"
    );
}

#[test]
fn clients_that_come_and_go_give_their_space_back() {
    // Each round a new client writes 200 values of 16 KiB, reads them,
    // deletes them and goes away: 3.2 MB written per round, 64 MB in all,
    // into a value region of 24 MiB. Without the space coming back, the
    // fourth or fifth round would find the region full.
    let node = node(&[(1, 1)], 24 << 20);
    let mut after_first = None;
    for round in 0..20u64 {
        let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut s = client.session().unwrap();
        for k in 0..200u64 {
            let mut v = encode(k, round * 1000 + k);
            v.resize(16 << 10, round as u8);
            assert!(!s.put(10 + k, &v).unwrap(), "round {round} key {k} was new");
        }
        for k in 0..200u64 {
            let got = s.get_value(10 + k).unwrap().unwrap();
            assert_eq!(got.len(), 16 << 10);
            assert_eq!(
                got[..8],
                (round * 1000 + k).to_le_bytes(),
                "round {round} key {k}"
            );
        }
        for k in 0..200u64 {
            assert!(s.remove(10 + k).unwrap());
        }
        drop(s);
        drop(client);
        assert_ne!(
            common::free_word(&node),
            0,
            "round {round}: nothing given back"
        );
        let used = node.stats().value_bytes;
        let first = *after_first.get_or_insert(used);
        assert!(
            used <= first + (4 << 20),
            "round {round}: value region use {first} -> {used}"
        );
    }
}

#[test]
fn a_client_dropped_before_its_session_gives_its_space_back_with_the_session() {
    // As above, but each round's client handle goes first and its session
    // last: the session is then the last handle on the client.
    let node = node(&[(1, 1)], 24 << 20);
    for round in 0..12u64 {
        let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut s = client.session().unwrap();
        drop(client);
        for k in 0..200u64 {
            let mut v = encode(k, round * 1000 + k);
            v.resize(16 << 10, round as u8);
            assert!(!s.put(10 + k, &v).unwrap(), "round {round} key {k} was new");
        }
        for k in 0..200u64 {
            assert!(s.remove(10 + k).unwrap());
        }
        drop(s);
        assert_ne!(
            common::free_word(&node),
            0,
            "round {round}: nothing given back"
        );
    }
}

#[test]
fn only_the_last_of_a_clients_handles_gives_its_space_back_in_any_drop_order() {
    // A client, a clone of it and a session, dropped in each of the six
    // orders: nothing is given back before the last drop, and its space
    // is given back by it, whichever handle it is.
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    for order in orders {
        let node = node(&[(1, 1)], 8 << 20);
        let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let clone = client.clone();
        let mut s = client.session().unwrap();
        for k in 0..20u64 {
            let mut v = encode(k, k);
            v.resize(4 << 10, 1);
            assert!(!s.put(10 + k, &v).unwrap());
            assert!(s.remove(10 + k).unwrap());
        }
        let mut handles: Vec<Option<Box<dyn std::any::Any>>> = vec![
            Some(Box::new(client)),
            Some(Box::new(clone)),
            Some(Box::new(s)),
        ];
        for (i, &h) in order.iter().enumerate() {
            assert_eq!(
                common::free_word(&node),
                0,
                "{order:?}: given back before the last drop"
            );
            drop(handles[h].take());
            if i == 2 {
                assert_ne!(common::free_word(&node), 0, "{order:?}: not given back");
            }
        }
    }
}

#[test]
fn concurrent_give_backs_and_takes_never_share_a_block() {
    give_backs_and_takes_race(false);
}

#[test]
fn concurrent_give_backs_and_takes_never_share_a_block_unordered() {
    give_backs_and_takes_race(true);
}

/// Four clients (four value spaces) write their own keys with values that
/// name their key and write, give everything they hold back every few
/// writes and take it again from the pool: a block handed to two clients
/// at once would show as a value no writer wrote to that key.
fn give_backs_and_takes_race(unordered: bool) {
    let node = node(&[(1, 1)], 64 << 20);
    let mut engine = rolex_host::EngineConfig::default();
    if unordered {
        engine.fabric = rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
            unordered: Some(rolex_host::Unordered {
                seed: 5,
                window: 8,
                writes_in_order: false,
            }),
            ..rolex_host::LoopbackConfig::default()
        });
    }
    let cfg = KvClientConfig {
        engine,
        ..KvClientConfig::default()
    };
    std::thread::scope(|scope| {
        for c in 0..4u64 {
            let (node, cfg) = (&node, cfg.clone());
            scope.spawn(move || {
                let client = KvClient::connect(cfg, &node.pool()).unwrap();
                let mut s = client.session().unwrap();
                let keys: Vec<u64> = (0..16).map(|i| 1000 * (c + 1) + i).collect();
                let mut last: BTreeMap<u64, u64> = BTreeMap::new();
                for i in 0..600u64 {
                    let key = keys[(i % 16) as usize];
                    let id = (c << 32) | i;
                    s.put(key, &encode(key, id)).unwrap();
                    last.insert(key, id);
                    if i % 7 == 6 {
                        client.close().unwrap();
                    }
                    if i % 5 == 0 {
                        for (&k, &id) in &last {
                            let got = s.get_value(k).unwrap().unwrap();
                            assert_eq!(decode(k, &got), Some(id), "client {c} key {k}");
                        }
                    }
                }
            });
        }
    });
}

/// A client fills the value region with values of 1 MiB blocks (what a
/// resume gives back), deletes them and closes: the pool's free space is
/// all large blocks on the free stack, and no new space can be claimed.
/// Four clients then write values of 9 to 1000 bytes at once (blocks of
/// 64 B to 1.3 KB): each carves the large blocks it pops, none is
/// refused, and every value reads back as its writer wrote it (a block
/// carved by two clients would show as another write's bytes).
#[test]
fn large_free_blocks_are_carved_for_small_values_by_concurrent_clients() {
    let node = node(&[(1, 1)], 24 << 20);
    let a = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = a.session().unwrap();
    let big = vec![5u8; (1 << 20) - 32];
    let mut n = 0u64;
    loop {
        match s.put(10 + n, &big) {
            Ok(_) => n += 1,
            Err(KvError::ValueSpaceFull { .. }) => break,
            Err(e) => panic!("put {n}: {e}"),
        }
    }
    assert!(n > 16, "{n} large values fit");
    for k in 0..n {
        assert!(s.remove(10 + k).unwrap());
    }
    drop(s);
    a.close().unwrap();
    drop(a);
    assert_ne!(common::free_word(&node), 0, "nothing given back");
    let small = |key: u64, id: u64| {
        const LENS: [usize; 5] = [9, 40, 100, 333, 1000];
        let mut v = encode(key, id);
        v.resize(LENS[(id % 5) as usize], 0);
        let id_bytes = id.to_le_bytes();
        v[..8].copy_from_slice(&id_bytes);
        v
    };
    std::thread::scope(|scope| {
        for c in 0..4u64 {
            let node = &node;
            scope.spawn(move || {
                let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
                let mut s = client.session().unwrap();
                let keys: Vec<u64> = (0..64).map(|i| 100_000 * (c + 1) + i).collect();
                let mut last: BTreeMap<u64, u64> = BTreeMap::new();
                for i in 0..1500u64 {
                    let key = keys[(i % 64) as usize];
                    let id = (c << 32) | i;
                    s.put(key, &small(key, id)).unwrap_or_else(|e| {
                        panic!(
                            "client {c} write {i}: {e} (holding {:?})",
                            client.stats().value_space
                        )
                    });
                    last.insert(key, id);
                    if i % 97 == 0 || i == 1499 {
                        for (&k, &id) in &last {
                            let got = s.get_value(k).unwrap().unwrap();
                            assert_eq!(got, small(k, id), "client {c} key {k}");
                        }
                    }
                }
                let (claimed, _) = client.stats().value_space;
                assert!(claimed > 0, "client {c} took space");
            });
        }
    });
}

#[test]
fn a_client_that_frees_much_gives_the_excess_back_while_it_runs() {
    // 768 values of 64 KiB (blocks of 80 KiB, 60 MiB) deleted by one
    // long-lived client: it keeps at most its bound (32 MiB), the rest
    // goes to the pool, where another client writing 400 of them finds
    // it instead of claiming new space.
    let node = node(&[(1, 1)], 80 << 20);
    let a = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = a.session().unwrap();
    let v = vec![7u8; 64 << 10];
    for k in 0..768u64 {
        s.put(10 + k, &v).unwrap();
    }
    let used = node.stats().value_bytes;
    for k in 0..768u64 {
        assert!(s.remove(10 + k).unwrap());
    }
    assert_ne!(common::free_word(&node), 0, "nothing given back");
    let (claimed, free) = a.stats().value_space;
    assert!(free <= 32 << 20, "held {free} of {claimed}");
    let b = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut t = b.session().unwrap();
    for k in 0..400u64 {
        t.put(5000 + k, &v).unwrap();
    }
    let again = node.stats().value_bytes;
    assert!(
        again <= used + (4 << 20),
        "a second client claimed new space: {used} -> {again}"
    );
    for k in 0..400u64 {
        assert_eq!(t.get_value(5000 + k).unwrap().as_deref(), Some(&v[..]));
    }
}

#[test]
fn give_backs_under_injected_faults_never_hand_a_block_out_twice() {
    // Two compute nodes whose NIC fails 3% of operations (some after they
    // took effect) write, delete, give their space back and take it again
    // concurrently; then the chain locks failed operations left held are
    // released (as the memory node's reaper does for a holder that is
    // gone) and a third compute node, without faults, writes from what
    // they gave back. A block on the free stack twice, or handed out while
    // a slot still names it, would show as bytes no writer wrote to a key.
    let node = node(&[(1, 1)], 64 << 20);
    const OWNER: rolex_core::entry::LockOwner = rolex_core::entry::LockOwner(9);
    let faulty = |seed| KvClientConfig {
        engine: rolex_host::EngineConfig {
            fabric: rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
                faults: Some(rolex_host::Faults {
                    probability: 0.03,
                    seed,
                    torn: 0.0,
                    tear_kills: false,
                }),
                ..rolex_host::LoopbackConfig::default()
            }),
            ..rolex_host::EngineConfig::default()
        },
        lock_owner: OWNER,
        // A chain the other one left locked fails fast.
        max_attempts: 200,
        ..KvClientConfig::default()
    };
    // Connecting only reads: try again after a fault, with other draws (a
    // seed's faults follow the posting order, so the same seed would fail
    // the same way).
    let connect = |cfg: &dyn Fn(u64) -> KvClientConfig| {
        (0..1000u64)
            .find_map(|attempt| KvClient::connect(cfg(attempt), &node.pool()).ok())
            .expect("a connection within 1000 seeds")
    };
    let failed: u64 = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2u64)
            .map(|c| {
                let client = connect(&|attempt| faulty(40 + c + 100 * attempt));
                scope.spawn(move || {
                    let mut failed = 0;
                    let mut s = loop {
                        if let Ok(s) = client.session() {
                            break s;
                        }
                    };
                    for i in 0..1500u64 {
                        let key = 1000 * (c + 1) + i % 40;
                        let r = if i % 3 == 2 {
                            s.remove(key).map(|_| ())
                        } else {
                            s.put(key, &encode(key, (c << 32) | i)).map(|_| ())
                        };
                        failed += u64::from(r.is_err());
                        if i % 50 == 49 {
                            failed += u64::from(client.close().is_err());
                        }
                    }
                    failed
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert!(failed > 0, "no fault was injected");
    node.release_locks_of(OWNER).unwrap();
    // A block in two places shows as a value block that never checks:
    // fail in seconds rather than retry for minutes.
    let clean = KvClient::connect(
        KvClientConfig {
            max_attempts: 20_000,
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap();
    let mut s = clean.session().unwrap();
    for i in 0..1500u64 {
        let key = 9000 + i % 30;
        s.put(key, &encode(key, i)).unwrap();
        let got = s.get_value(key).unwrap().unwrap();
        assert_eq!(decode(key, &got), Some(i), "clean key {key}");
        if i % 40 == 39 {
            clean.close().unwrap();
        }
    }
    for key in (1000..1040).chain(2000..2040).chain(9000..9030) {
        if let Some(v) = s.get_value(key).unwrap() {
            assert!(
                decode(key, &v).is_some(),
                "key {key}: bytes no writer wrote to it"
            );
        }
    }
}
