//! Pipelined calls of byte values (`KvSession::run_many_values`,
//! `ClusterSession::run_many_values`): answers against a sequential
//! `BTreeMap` on one session and across three memory nodes (values of 0
//! to 200 bytes, inline and out of line), the value space accounted to
//! the byte (what the client claimed and holds free against the blocks
//! the store's slots name), round trips (long-value puts on distinct
//! chains: 2 for the call on an ordered fabric, 3 on an unordered one),
//! and calls under injected faults: no lock left held, no block handed
//! out twice, and no block lost but those an indeterminate write may have
//! published. Each on an ordered and an unordered fabric (several shuffle
//! seeds). Histories of concurrent calls of value requests and of scans
//! read together (chains colliding, models retraining) against the
//! checker, also under injected faults on an unordered fabric. Calls
//! from fresh clients (chunk claims while a batch is planned: 2 round
//! trips more for a call of one class) mixed with requests of the same
//! keys answer in request order.

mod common;

use std::collections::BTreeMap;

use common::{cluster_with, eight_slot_node, loaded};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rolex_core::entry::LockOwner;
use rolex_core::layout::{block_class, SlotValue};
use rolex_host::kv::{KvClient, KvClientConfig, KvOp, Reply, ValueRequest};
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig, Unordered};

/// A loopback engine: unordered with that shuffle seed if `unordered` is
/// `Some`, failing a share of its operations if `faults` is.
fn engine(unordered: Option<u64>, faults: Option<Faults>) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            faults,
            unordered: unordered.map(|seed| Unordered {
                seed,
                window: 8,
                writes_in_order: false,
            }),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    }
}

/// A client configuration on [`engine`]`(unordered, None)`.
fn config(unordered: Option<u64>) -> KvClientConfig {
    KvClientConfig {
        engine: engine(unordered, None),
        ..KvClientConfig::default()
    }
}

/// The shuffle seeds the unordered variants run with.
const SEEDS: [u64; 3] = [1, 2, 3];

/// Requests of one random call: up to `depth` of them over keys
/// `0..max`, values of 0 to 200 bytes (`store` keeps their bytes alive).
fn random_call(rng: &mut StdRng, max: u64, depth: usize, n: &mut u64) -> Vec<(u8, u64, Vec<u8>)> {
    (0..rng.gen_range(1..=depth))
        .map(|_| {
            let key = rng.gen_range(0..max);
            *n += 1;
            let kind = rng.gen_range(0..10u8);
            (kind, key, common::id_value(key, *n, rng.gen_range(0..=200)))
        })
        .collect()
}

/// The request of `(kind, key, bytes)`.
fn request((kind, key, v): &(u8, u64, Vec<u8>)) -> ValueRequest<'_> {
    match kind {
        0..=2 => ValueRequest::Get(*key),
        3..=5 => ValueRequest::Put(*key, v),
        6..=7 => ValueRequest::Update(*key, v),
        _ => ValueRequest::Remove(*key),
    }
}

/// What `r` answers applied to `model`, and applies it.
fn apply(model: &mut BTreeMap<u64, Vec<u8>>, r: ValueRequest<'_>) -> Reply {
    match r {
        ValueRequest::Get(k) => Reply::Value(model.get(&k).cloned()),
        ValueRequest::Put(k, v) => Reply::Present(model.insert(k, v.to_vec()).is_some()),
        ValueRequest::Update(k, v) => Reply::Present(match model.get_mut(&k) {
            Some(old) => {
                *old = v.to_vec();
                true
            }
            None => false,
        }),
        ValueRequest::Remove(k) => Reply::Present(model.remove(&k).is_some()),
    }
}

/// Bytes of the blocks that hold `values`' out-of-line ones.
fn block_bytes<'a>(values: impl IntoIterator<Item = &'a Vec<u8>>) -> u64 {
    values
        .into_iter()
        .filter(|v| SlotValue::inline(v).is_none())
        .map(|v| block_class(v.len()).unwrap())
        .sum()
}

/// The value space one client's writes hold: what it claimed less what
/// it holds free.
fn held(c: &KvClient) -> u64 {
    let (claimed, free) = c.stats().value_space;
    claimed - free
}

fn value_calls_on_one_node(unordered: Option<u64>) {
    let pairs = loaded(2000, 4);
    let max = 8_100;
    let node = eight_slot_node(&pairs);
    let c = KvClient::connect(config(unordered), &node.pool()).unwrap();
    let mut s = c.session().unwrap();
    let mut model: BTreeMap<u64, Vec<u8>> = pairs
        .iter()
        .map(|&(k, v)| (k, v.to_le_bytes().to_vec()))
        .collect();
    let mut rng = StdRng::seed_from_u64(5);
    let mut n = 1 << 40;
    for call in 0..300 {
        let call_data = random_call(&mut rng, max, 24, &mut n);
        let reqs: Vec<ValueRequest<'_>> = call_data.iter().map(request).collect();
        let got = s.run_many_values(&reqs).unwrap();
        assert_eq!(got.len(), reqs.len());
        for (&r, a) in reqs.iter().zip(got) {
            assert_eq!(a.unwrap(), apply(&mut model, r), "call {call}: {r:?}");
        }
        // Every block this client holds out of its free lists is one a
        // slot names: none lost, none freed twice.
        assert_eq!(held(&c), block_bytes(model.values()), "call {call}");
    }
    s.flush().unwrap();
    assert_eq!(c.locks_maybe_held(), 0);
    // Pipelined, not one by one: a put alone costs 2 round trips (3 on
    // an unordered fabric); here less than half that each.
    let alone = if unordered.is_some() { 3 } else { 2 };
    let puts = c.stats().op(KvOp::Insert);
    assert!(
        2 * puts.rtts < alone * puts.ops,
        "{} round trips for {} puts",
        puts.rtts,
        puts.ops
    );
    let all: Vec<(u64, Vec<u8>)> = model.clone().into_iter().collect();
    assert_eq!(s.scan_values(0, all.len() + 1).unwrap(), all);
    // Closed, it holds nothing free, and still every named block.
    c.close().unwrap();
    assert_eq!(c.stats().value_space.1, 0);
    assert_eq!(held(&c), block_bytes(model.values()));
}

#[test]
fn value_calls_answer_as_a_reference_map_and_account_every_block() {
    value_calls_on_one_node(None);
}

#[test]
fn value_calls_answer_as_a_reference_map_on_an_unordered_fabric() {
    for seed in SEEDS {
        value_calls_on_one_node(Some(seed));
    }
}

fn value_calls_across_nodes(unordered: Option<u64>) {
    let pairs = loaded(3000, 4);
    let max = 12_100;
    let (_mns, c) = cluster_with(&pairs, 3, |_, mn| {
        KvClient::connect(config(unordered), &mn.pool()).unwrap()
    });
    let mut s = c.session().unwrap();
    let mut model: BTreeMap<u64, Vec<u8>> = pairs
        .iter()
        .map(|&(k, v)| (k, v.to_le_bytes().to_vec()))
        .collect();
    let mut rng = StdRng::seed_from_u64(29);
    let mut n = 1 << 40;
    let mut spanning = 0;
    for call in 0..300 {
        let call_data = random_call(&mut rng, max, 24, &mut n);
        let reqs: Vec<ValueRequest<'_>> = call_data.iter().map(request).collect();
        let nodes: std::collections::BTreeSet<usize> =
            reqs.iter().map(|r| s.node_of(r.key())).collect();
        spanning += usize::from(nodes.len() > 1);
        let got = s.run_many_values(&reqs);
        assert_eq!(got.len(), reqs.len());
        for (&r, a) in reqs.iter().zip(got) {
            assert_eq!(a.unwrap(), apply(&mut model, r), "call {call}: {r:?}");
        }
    }
    assert!(spanning > 250, "most calls span several nodes: {spanning}");
    let all: Vec<(u64, Vec<u8>)> = model.clone().into_iter().collect();
    assert_eq!(s.scan_values(0, all.len() + 1).unwrap(), all);
    s.flush().unwrap();
    assert_eq!(c.locks_maybe_held(), 0);
    // Each node's client holds exactly the blocks its range's slots name.
    for i in 0..3 {
        let (lo, hi) = c.map().range(i).unwrap();
        let mine = model.range(lo..=hi).map(|(_, v)| v);
        assert_eq!(held(c.node(i).unwrap()), block_bytes(mine), "node {i}");
    }
}

#[test]
fn value_calls_across_nodes_answer_as_a_reference_map() {
    value_calls_across_nodes(None);
}

#[test]
fn value_calls_across_nodes_answer_as_a_reference_map_on_an_unordered_fabric() {
    for seed in SEEDS {
        value_calls_across_nodes(Some(seed));
    }
}

/// Long-value puts, updates and removes on distinct chains: one call
/// costs `writes` round trips (2 on an ordered fabric, 3 on an unordered
/// one); gets of long values 2 (leaves, then blocks). The engine counts
/// each posted unlock (unordered) as a submission of its own.
fn long_value_round_trips(unordered: Option<u64>) {
    let writes = if unordered.is_some() { 3 } else { 2 };
    let (node, pairs) = common::half_full_node();
    let c = KvClient::connect(
        KvClientConfig {
            // Nothing retrains: no age refresh to blur the counts.
            model_max_age: std::time::Duration::from_secs(3600),
            ..config(unordered)
        },
        &node.pool(),
    )
    .unwrap();
    // The engine's submissions less the unlocks posted without a wait.
    let rounds = || c.stats().engine.rtts - c.stats().total().posted;
    let mut s = c.session().unwrap();
    let spread: Vec<u64> = pairs.iter().step_by(16).map(|p| p.0).collect();
    // A fresh client holds no block: the call gets space for the class
    // when it plans its batch — the pool's free stack read (empty), then
    // a chunk of 16 blocks claimed (one FAA) — and its puts stay in the
    // batch: 2 round trips more, not each put alone.
    let vals: Vec<Vec<u8>> = spread[16..24]
        .iter()
        .map(|&k| common::id_value(k, 1, 40))
        .collect();
    let reqs: Vec<ValueRequest<'_>> = spread[16..24]
        .iter()
        .zip(&vals)
        .map(|(&k, v)| ValueRequest::Put(k, v))
        .collect();
    let e0 = rounds();
    let got = s.run_many_values(&reqs).unwrap();
    assert!(got.into_iter().all(|a| a.unwrap() == Reply::Present(true)));
    assert_eq!(
        rounds() - e0,
        writes + 2,
        "8 long-value puts of a class this client has no block of"
    );
    // A first long value claims a chunk of 16 blocks of its class (one
    // FAA): the call's blocks are taken from it without a round trip.
    assert!(s
        .put(spread[40], &common::id_value(spread[40], 1, 100))
        .unwrap());
    let vals: Vec<Vec<u8>> = spread[..8]
        .iter()
        .map(|&k| common::id_value(k, 2, 100))
        .collect();
    let reqs: Vec<ValueRequest<'_>> = spread[..8]
        .iter()
        .zip(&vals)
        .map(|(&k, v)| ValueRequest::Put(k, v))
        .collect();
    let e0 = rounds();
    let before = c.stats().op(KvOp::Insert);
    let got = s.run_many_values(&reqs).unwrap();
    assert!(got.into_iter().all(|a| a.unwrap() == Reply::Present(true)));
    let after = c.stats().op(KvOp::Insert);
    assert_eq!(
        (after.ops - before.ops, after.rtts - before.rtts),
        (8, writes),
        "8 long-value puts in {writes} round trips"
    );
    assert_eq!(rounds() - e0, writes);
    assert_eq!(
        after.value_bytes - before.value_bytes,
        8 * 100,
        "each value's bytes counted"
    );
    // Their gets: the leaves in one round trip, the blocks in a second.
    let gets: Vec<ValueRequest<'_>> = spread[..8].iter().map(|&k| ValueRequest::Get(k)).collect();
    let e0 = rounds();
    let got = s.run_many_values(&gets).unwrap();
    for (a, v) in got.into_iter().zip(&vals) {
        assert_eq!(a.unwrap(), Reply::Value(Some(v.clone())));
    }
    assert_eq!(rounds() - e0, 2);
    // Updates that replace long values with long values (of another
    // class, primed as above), and removes: still `writes` round trips, the
    // replaced blocks freed.
    assert!(s
        .put(spread[41], &common::id_value(spread[41], 1, 150))
        .unwrap());
    let vals3: Vec<Vec<u8>> = spread[..6]
        .iter()
        .map(|&k| common::id_value(k, 3, 150))
        .collect();
    let mut reqs: Vec<ValueRequest<'_>> = spread[..6]
        .iter()
        .zip(&vals3)
        .map(|(&k, v)| ValueRequest::Update(k, v))
        .collect();
    reqs.push(ValueRequest::Remove(spread[6]));
    reqs.push(ValueRequest::Remove(spread[7]));
    let e0 = rounds();
    let held_before = held(&c);
    let got = s.run_many_values(&reqs).unwrap();
    assert!(got.into_iter().all(|a| a.unwrap() == Reply::Present(true)));
    assert_eq!(rounds() - e0, writes);
    let class = |len| block_class(len).unwrap();
    assert_eq!(
        held(&c),
        held_before + 6 * class(150) - 8 * class(100),
        "the replaced and removed values' blocks freed"
    );
    // Gets of long values and puts of long values together: each get's
    // block is read in the round of the puts' leaf writes.
    let vals4: Vec<Vec<u8>> = spread[8..12]
        .iter()
        .map(|&k| common::id_value(k, 4, 100))
        .collect();
    let mut reqs: Vec<ValueRequest<'_>> = spread[8..12]
        .iter()
        .zip(&vals4)
        .map(|(&k, v)| ValueRequest::Put(k, v))
        .collect();
    reqs.extend(spread[..6].iter().map(|&k| ValueRequest::Get(k)));
    let e0 = rounds();
    let got = s.run_many_values(&reqs).unwrap();
    assert_eq!(rounds() - e0, writes, "4 puts and 6 gets, all long");
    for (a, v) in got[4..].iter().zip(&vals3) {
        assert_eq!(a.as_ref().unwrap(), &Reply::Value(Some(v.clone())));
    }
    s.flush().unwrap();
    assert_eq!(c.locks_maybe_held(), 0);
}

#[test]
fn a_call_of_long_value_puts_on_distinct_chains_costs_two_round_trips() {
    long_value_round_trips(None);
}

#[test]
fn a_call_of_long_value_puts_on_distinct_chains_costs_three_round_trips_unordered() {
    for seed in SEEDS {
        long_value_round_trips(Some(seed));
    }
}

/// One compute node whose NIC fails a share of its operations (some
/// after they took effect) runs pipelined value calls, closing its value
/// space now and then. Then: no chain lock is left held; a client without
/// faults reads every key back as a value some request wrote to it (no
/// block handed out twice); and the blocks the client holds out of its
/// free lists are those the store's slots name, plus at most two per
/// indeterminate failed write (its new block, and the one it may have
/// replaced: kept out of use for good), plus what closes that failed
/// part-way lost of their give-back (measured at each close).
fn value_calls_under_injected_faults(unordered: bool) {
    const OWNER: LockOwner = LockOwner(13);
    let pairs = loaded(600, 8);
    let max = 4_900;
    for seed in 1..=3u64 {
        let node = eight_slot_node(&pairs);
        let c = (0..1000u64)
            .find_map(|attempt| {
                let faults = Faults {
                    probability: 0.02,
                    seed: seed * 1_000_003 + attempt,
                    torn: 0.0,
                    tear_kills: false,
                };
                let cfg = KvClientConfig {
                    engine: engine(unordered.then_some(seed), Some(faults)),
                    lock_owner: OWNER,
                    max_attempts: 200,
                    ..KvClientConfig::default()
                };
                KvClient::connect(cfg, &node.pool()).ok()
            })
            .expect("connecting under injected faults");
        let mut s = loop {
            if let Ok(s) = c.session() {
                break s;
            }
        };
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n = 1 << 40;
        let (mut failed, mut unknown, mut lost) = (0u64, 0u64, 0u64);
        for call in 0..200 {
            let call_data = random_call(&mut rng, max, 16, &mut n);
            let reqs: Vec<ValueRequest<'_>> = call_data.iter().map(request).collect();
            match s.run_many_values(&reqs) {
                Ok(got) => {
                    for (r, a) in reqs.iter().zip(got) {
                        if let Err(e) = a {
                            failed += 1;
                            if e.may_have_applied() && !matches!(r, ValueRequest::Get(_)) {
                                unknown += 1;
                            }
                        }
                    }
                }
                Err(e) => {
                    failed += reqs.len() as u64;
                    assert!(!e.may_have_applied(), "nothing ran: {e}");
                }
            }
            if call % 25 == 24 {
                // An error here may lose blocks of the give-back, never
                // hand one out twice: what it lost stays out of the free
                // lists (a whole give-back leaves `held` as it was).
                let before = held(&c);
                if c.close().is_err() {
                    lost += held(&c).saturating_sub(before);
                }
            }
        }
        assert!(failed > 0, "seed {seed}: faults were injected");
        for _ in 0..100 {
            let _ = s.flush();
            if c.locks_maybe_held() == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(c.locks_maybe_held(), 0, "seed {seed}: a lock maybe held");
        assert_eq!(node.release_locks_of(OWNER).unwrap(), 0, "seed {seed}");
        // What the store holds, read by a client without faults: every
        // value one a request wrote to its key (or its load value).
        let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let all = reader
            .session()
            .unwrap()
            .scan_values(0, max as usize + 1)
            .unwrap();
        for (k, v) in &all {
            let id = u64::from_le_bytes(v[..8.min(v.len())].try_into().unwrap_or([0; 8]));
            let ok = v.len() < 8 || *v == common::id_value(*k, id, v.len());
            assert!(
                ok,
                "seed {seed}: key {k}: {} bytes no request wrote",
                v.len()
            );
        }
        let named = block_bytes(all.iter().map(|(_, v)| v));
        let held = held(&c);
        let biggest = block_class(200).unwrap();
        assert!(
            held >= named && held - named <= 2 * unknown * biggest + lost,
            "seed {seed}: client holds {held} bytes out of its free lists, slots name {named}, \
             {unknown} writes indeterminate, {lost} bytes lost by failed closes"
        );
        println!(
            "unordered {unordered} seed {seed}: {failed} requests failed ({unknown} writes \
             indeterminate); {} bytes kept out of use, {lost} of them lost by failed closes",
            held - named
        );
    }
}

#[test]
fn value_calls_under_injected_faults_leave_no_lock_and_lose_no_block() {
    value_calls_under_injected_faults(false);
}

#[test]
fn value_calls_under_injected_faults_leave_no_lock_and_lose_no_block_unordered() {
    value_calls_under_injected_faults(true);
}

/// One call of a concurrent history over keys `0, 1000, …` (`keys` of
/// them) for thread `t`'s call `i`: a `scan_many_values` of a few scans
/// one time in five, else up to 8 value requests of 8 to 300 bytes (ids
/// unique per thread), each recorded in `rec` (values stand for their
/// ids). With `failures`, an error is recorded and counted (injected
/// faults); without, it fails the test.
fn value_call(
    s: &mut rolex_host::kv::KvSession,
    rec: &mut rolex_checker::Recorder,
    rng: &mut StdRng,
    (t, i, keys): (usize, u64, u64),
    mut failures: Option<&mut common::Failures>,
) {
    use rolex_checker::{Call, Ret};
    if rng.gen_bool(0.2) {
        let scans: Vec<(u64, usize)> = (0..rng.gen_range(1..5))
            .map(|_| (rng.gen_range(0..keys * 1000), rng.gen_range(1..6)))
            .collect();
        let ops: Vec<_> = scans
            .iter()
            .map(|&(from, n)| rec.invoke(Call::Scan { from, n }))
            .collect();
        match s.scan_many_values(&scans) {
            Ok(got) => {
                for (op, got) in ops.into_iter().zip(got) {
                    let ids = got
                        .into_iter()
                        .map(|(k, v)| (k, common::value_id(k, &v).expect("a value no one wrote")))
                        .collect();
                    rec.finish(op, Ret::Entries(ids));
                }
            }
            Err(e) => {
                assert!(failures.is_some(), "scans {scans:?}: {e}");
                assert!(!e.may_have_applied(), "{e}");
                for op in ops {
                    rec.error(op, false);
                }
            }
        }
        return;
    }
    let data: Vec<(u8, u64, Vec<u8>)> = (0..rng.gen_range(1..=8u64))
        .map(|r| {
            let key = rng.gen_range(0..keys) * 1000;
            let id = (t as u64 + 1) << 32 | i << 4 | r;
            let len = rng.gen_range(8..=300);
            (rng.gen_range(0..10u8), key, common::id_value(key, id, len))
        })
        .collect();
    let reqs: Vec<ValueRequest<'_>> = data.iter().map(request).collect();
    let ops: Vec<_> = data
        .iter()
        .zip(&reqs)
        .map(|((_, _, v), r)| {
            let value = u64::from_le_bytes(v[..8].try_into().unwrap());
            rec.invoke(match *r {
                ValueRequest::Get(key) => Call::Get { key },
                ValueRequest::Put(key, _) => Call::Insert { key, value },
                ValueRequest::Update(key, _) => Call::Update { key, value },
                ValueRequest::Remove(key) => Call::Delete { key },
            })
        })
        .collect();
    let mut failed = |rec: &mut rolex_checker::Recorder,
                      op,
                      e: rolex_host::kv::KvError,
                      r: &ValueRequest<'_>| {
        let Some(f) = failures.as_deref_mut() else {
            panic!("{r:?}: {e}");
        };
        f.count(e.may_have_applied());
        rec.error(op, e.may_have_applied());
    };
    let got = match s.run_many_values(&reqs) {
        Ok(got) => got,
        Err(e) => {
            for (op, r) in ops.into_iter().zip(&reqs) {
                failed(rec, op, e.clone(), r);
            }
            return;
        }
    };
    for ((op, r), a) in ops.into_iter().zip(&reqs).zip(got) {
        let a = match a {
            Ok(a) => a,
            Err(e) => {
                failed(rec, op, e, r);
                continue;
            }
        };
        rec.finish(
            op,
            match (r, a) {
                (ValueRequest::Get(k), Reply::Value(v)) => {
                    Ret::Value(v.map(|v| common::value_id(*k, &v).expect("a value no one wrote")))
                }
                (ValueRequest::Put(..), Reply::Present(p)) => Ret::Applied(!p),
                (_, Reply::Present(p)) => Ret::Applied(p),
                (r, a) => panic!("{r:?} answered {a:?}"),
            },
        );
    }
}

/// Four threads on two compute nodes, each issuing calls of up to 8
/// value requests over 24 keys (chains collide; values of 8 to 300
/// bytes, so fresh clients claim a chunk for a size class mid-call),
/// some calls a `scan_many_values` of a few scans instead, while a
/// retrainer retrains every model again and again: the history (each
/// request of a call, each scan of a call, invoked at its start and
/// returned at its end; values stand for their ids) is linearizable, and
/// no lock is left maybe held.
fn concurrent_value_calls(unordered: Option<u64>, seed: u64) {
    let keys = 24u64;
    let pairs: Vec<(u64, u64)> = (0..keys / 2).map(|i| (i * 2 * 1000, i)).collect();
    let node = common::churning_node_with_grace(&pairs, std::time::Duration::from_millis(20));
    let cfg = KvClientConfig {
        model_max_age: std::time::Duration::from_millis(5),
        ..config(unordered)
    };
    let clients = [
        KvClient::connect(cfg.clone(), &node.pool()).unwrap(),
        KvClient::connect(cfg, &node.pool()).unwrap(),
    ];
    let (checked, retrains) = common::run_history(
        &node,
        &clients,
        &pairs,
        (4, 60, seed),
        |s, rec, rng, t, i| value_call(s, rec, rng, (t, i, keys), None),
    );
    eprintln!(
        "unordered {unordered:?} seed {seed}: {} ops and {} scans checked, {retrains} retrains",
        checked.single_ops, checked.scans
    );
    assert!(retrains > 0);
    for c in &clients {
        assert_eq!(c.locks_maybe_held(), 0);
    }
    assert!(node.last_agent_error().is_none());
}

#[test]
fn concurrent_value_calls_are_linearizable() {
    concurrent_value_calls(None, 1);
}

#[test]
fn concurrent_value_calls_are_linearizable_on_an_unordered_fabric() {
    for seed in SEEDS {
        concurrent_value_calls(Some(seed), seed);
    }
}

/// [`concurrent_value_calls`] under injected faults (2% of each client's
/// operations fail, some after they took effect), on an unordered fabric:
/// requests that failed are recorded as failed (or of unknown outcome,
/// when the error says they may have applied), a call that failed as a
/// whole likewise; every key read back at the end by a client without
/// faults is part of the history, which is linearizable; once the
/// threads flushed, no lock is maybe held and no LT word locked. `torn`:
/// the probability that a write of more than 8 bytes lands only in part
/// and fails the rest of its batch (`Faults::torn`: a leaf, a value
/// block), on top of the 2%.
fn concurrent_value_calls_under_faults(seed: u64, torn: f64) {
    const OWNER: LockOwner = LockOwner(23);
    let keys = 24u64;
    let all: Vec<u64> = (0..keys).map(|k| k * 1000).collect();
    let pairs: Vec<(u64, u64)> = (0..keys / 2).map(|i| (i * 2 * 1000, i)).collect();
    let node = common::churning_node(&pairs);
    let clients = [0, 1].map(|client| {
        common::faulty_client(&node, (seed, client, 0.02), OWNER, |faults| {
            engine(Some(seed), Some(Faults { torn, ..faults }))
        })
    });
    let (checked, f) = common::faulty_history(
        &node,
        &clients,
        (&pairs, OWNER, seed),
        60,
        |s, rec, rng, (t, i), f| value_call(s, rec, rng, (t, i, keys), Some(f)),
        (&all, |s: &mut rolex_host::kv::KvSession, key| {
            let got = s
                .get_value(key)
                .unwrap_or_else(|e| panic!("reading key {key} back: {e}"));
            got.map(|v| common::value_id(key, &v).expect("a value no one wrote"))
        }),
    );
    eprintln!(
        "seed {seed}, torn {torn}: {} requests failed of {}; {} scans",
        f.failed, checked.single_ops, checked.scans
    );
}

#[test]
fn concurrent_value_calls_under_injected_faults_are_linearizable_unordered() {
    for seed in 1..=3 {
        concurrent_value_calls_under_faults(seed, 0.0);
    }
}

/// Leaves and value blocks torn by a broken link: a leaf write that
/// failed is written again whole before its lock is released, so no get
/// meets a torn leaf for good (the read-back would fail).
#[test]
fn concurrent_value_calls_with_torn_writes_are_linearizable_unordered() {
    for seed in 1..=3 {
        concurrent_value_calls_under_faults(seed, 0.05);
    }
}

/// Calls from fresh clients (an empty value space: the first write of
/// each size class claims a chunk while its batch is planned) mixing
/// those writes with others on the
/// same keys and chains (requests of one key several times per call),
/// on both fabrics: each answer is the reference map's in request order,
/// and the store ends holding the map.
fn fresh_clients_calls(unordered: Option<u64>) {
    let pairs = loaded(400, 8);
    let max = 3_300;
    let node = eight_slot_node(&pairs);
    let mut model: BTreeMap<u64, Vec<u8>> = pairs
        .iter()
        .map(|&(k, v)| (k, v.to_le_bytes().to_vec()))
        .collect();
    let mut rng = StdRng::seed_from_u64(unordered.unwrap_or(0) + 41);
    let mut n = 1 << 40;
    for call in 0..60 {
        let c = KvClient::connect(config(unordered), &node.pool()).unwrap();
        let mut s = c.session().unwrap();
        // Few keys per call, so requests of one key repeat.
        let keys: Vec<u64> = (0..4).map(|_| rng.gen_range(0..max)).collect();
        let data: Vec<(u8, u64, Vec<u8>)> = (0..rng.gen_range(2..=16))
            .map(|_| {
                let key = keys[rng.gen_range(0..keys.len())];
                n += 1;
                let len = [0, 8, 9, 40, 100, 200, 1000, 5000][rng.gen_range(0..8)];
                (rng.gen_range(0..10u8), key, common::id_value(key, n, len))
            })
            .collect();
        let reqs: Vec<ValueRequest<'_>> = data.iter().map(request).collect();
        let got = s.run_many_values(&reqs).unwrap();
        for (&r, a) in reqs.iter().zip(got) {
            assert_eq!(a.unwrap(), apply(&mut model, r), "call {call}: {r:?}");
        }
        s.flush().unwrap();
        assert_eq!(c.locks_maybe_held(), 0);
    }
    let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let all = reader
        .session()
        .unwrap()
        .scan_values(0, model.len() + 1)
        .unwrap();
    assert_eq!(all, model.into_iter().collect::<Vec<_>>());
}

#[test]
fn calls_from_fresh_clients_claim_chunks_and_answer_in_request_order() {
    fresh_clients_calls(None);
    for seed in SEEDS {
        fresh_clients_calls(Some(seed));
    }
}
