//! Pipelined calls (`KvSession::run_many`): round trips (a batch of
//! writes on distinct chains costs 2 on an ordered fabric, 3 on an
//! unordered one; gets 1), program order within a call against a
//! sequential `BTreeMap` (one thread, both fabrics), histories of
//! concurrent batches against the checker (`rolex_checker`, chains
//! colliding, models retraining), and batches under injected faults (both
//! fabrics): no lock left held, every acknowledged write readable.
//! Sessions dropped with their unlocks posted (unordered fabric, with and
//! without injected faults) leave no chain locked.

mod common;

use std::collections::BTreeMap;

use common::Delivery;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rolex_checker::{Call, Ret};
use rolex_core::entry::LockOwner;
use rolex_host::kv::{KvClient, KvClientConfig, KvOp, KvSession, Request};
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig};

fn engine(unordered: bool, faults: Option<Faults>, seed: u64) -> EngineConfig {
    let order = if unordered {
        Delivery::Unordered
    } else {
        Delivery::Ordered
    };
    engine_in(order, faults, seed)
}

fn engine_in(order: Delivery, faults: Option<Faults>, seed: u64) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            faults,
            unordered: order.loopback(seed),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    }
}

/// A random batch of up to `depth` requests over keys `0, 1000, …`
/// (`keys` of them), values naming thread `t` and request number.
fn random_batch(rng: &mut StdRng, keys: u64, depth: usize, t: usize, n: &mut u64) -> Vec<Request> {
    (0..rng.gen_range(1..=depth))
        .map(|_| {
            let key = rng.gen_range(0..keys) * 1000;
            *n += 1;
            let value = (t as u64) << 32 | *n;
            match rng.gen_range(0..10) {
                0..=2 => Request::Get(key),
                3..=5 => Request::Insert(key, value),
                6..=7 => Request::Update(key, value),
                _ => Request::Delete(key),
            }
        })
        .collect()
}

/// The answers of a `run_many` call whose requests all succeed.
fn answers(s: &mut KvSession, reqs: &[Request]) -> Vec<Option<u64>> {
    s.run_many(reqs)
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect()
}

/// The checker's call for `r`.
fn call(r: Request) -> Call {
    match r {
        Request::Get(key) => Call::Get { key },
        Request::Insert(key, value) => Call::Insert { key, value },
        Request::Update(key, value) => Call::Update { key, value },
        Request::Delete(key) => Call::Delete { key },
    }
}

#[test]
fn a_batch_of_writes_on_distinct_chains_costs_two_round_trips() {
    let (node, pairs) = common::half_full_node();
    let cfg = |unordered| KvClientConfig {
        engine: engine(unordered, None, 3),
        // Nothing retrains: no age refresh to blur the counts.
        model_max_age: std::time::Duration::from_secs(3600),
        ..KvClientConfig::default()
    };
    let c = KvClient::connect(cfg(false), &node.pool()).unwrap();
    let mut s = c.session().unwrap();
    let spread: Vec<(u64, u64)> = pairs.iter().step_by(16).copied().collect();

    // 8 updates.
    let e0 = c.stats().engine.rtts;
    let reqs: Vec<Request> = spread[..8]
        .iter()
        .map(|&(k, v)| Request::Update(k, v + 1))
        .collect();
    let got = s.run_many(&reqs).unwrap();
    for (&(_, v), a) in spread.iter().zip(&got) {
        assert_eq!(*a.as_ref().unwrap(), Some(v));
    }
    let upd = c.stats().op(KvOp::Update);
    assert_eq!((upd.ops, upd.rtts), (8, 2), "8 updates in 2 round trips");
    assert_eq!(c.stats().engine.rtts - e0, 2);

    // 4 gets, 2 inserts of new keys, 2 deletes: 2 round trips in all.
    let e0 = c.stats().engine.rtts;
    let before = c.stats().total().rtts;
    let mut reqs: Vec<Request> = spread[8..12]
        .iter()
        .map(|&(k, _)| Request::Get(k))
        .collect();
    reqs.push(Request::Insert(spread[12].0 + 1, 77));
    reqs.push(Request::Insert(spread[13].0 + 1, 78));
    reqs.push(Request::Delete(spread[14].0));
    reqs.push(Request::Delete(spread[15].0));
    let got = answers(&mut s, &reqs);
    let want: Vec<Option<u64>> = spread[8..12]
        .iter()
        .map(|&(_, v)| Some(v))
        .chain([None, None, Some(spread[14].1), Some(spread[15].1)])
        .collect();
    assert_eq!(got, want);
    assert_eq!(c.stats().total().rtts - before, 2);
    assert_eq!(c.stats().engine.rtts - e0, 2);
    let st = c.stats();
    assert_eq!(
        (
            st.op(KvOp::Get).ops,
            st.op(KvOp::Insert).ops,
            st.op(KvOp::Delete).ops
        ),
        (4, 2, 2),
        "each request counted as its kind"
    );

    // Two writes of one chain (here: one key) go in two batches, in
    // order; a get after them sees the second.
    let k = spread[0].0;
    let before = c.stats().total().rtts;
    let got = answers(
        &mut s,
        &[
            Request::Update(k, 5),
            Request::Update(k, 6),
            Request::Get(k),
        ],
    );
    assert_eq!(got, vec![Some(spread[0].1 + 1), Some(5), Some(6)]);
    assert_eq!(c.stats().total().rtts - before, 2 + 2 + 1);

    // Everything landed, and the unordered fabric answers the same.
    let u = KvClient::connect(cfg(true), &node.pool()).unwrap();
    let mut us = u.session().unwrap();
    let got: Vec<Option<u64>> = us
        .run_many(&[
            Request::Get(spread[1].0),
            Request::Get(spread[12].0 + 1),
            Request::Get(spread[14].0),
            Request::Update(spread[2].0, 9),
            Request::Get(spread[2].0),
        ])
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        got,
        vec![
            Some(spread[1].1 + 1),
            Some(77),
            None,
            Some(spread[2].1 + 1),
            Some(9)
        ]
    );
    us.flush().unwrap();
    assert_eq!(u.locks_maybe_held(), 0);
    assert_eq!(c.locks_maybe_held(), 0);
}

/// On an unordered fabric a call of writes on distinct chains costs 3
/// round trips (the locks; the records' and chains' READs; the leaf
/// writes, each unlock then posted), whatever its depth, and a call of
/// gets 1.
#[test]
fn a_batch_of_writes_on_distinct_chains_costs_three_round_trips_unordered() {
    for seed in 1..=3 {
        let (node, pairs) = common::half_full_node();
        let c = KvClient::connect(
            KvClientConfig {
                engine: engine(true, None, seed),
                // Nothing retrains: no age refresh to blur the counts.
                model_max_age: std::time::Duration::from_secs(3600),
                ..KvClientConfig::default()
            },
            &node.pool(),
        )
        .unwrap();
        let mut s = c.session().unwrap();
        let spread: Vec<(u64, u64)> = pairs.iter().step_by(16).copied().collect();
        let cost = |s: &mut KvSession, reqs: &[Request], kind: KvOp| {
            let before = c.stats().op(kind);
            let got = answers(s, reqs);
            let after = c.stats().op(kind);
            assert_eq!(after.ops - before.ops, reqs.len() as u64);
            (got, after.rtts - before.rtts, after.posted - before.posted)
        };
        let value = |k: u64| k ^ seed << 40;

        let reqs: Vec<Request> = spread[..8]
            .iter()
            .map(|&(k, _)| Request::Update(k, value(k)))
            .collect();
        let (got, rtts, posted) = cost(&mut s, &reqs, KvOp::Update);
        let want: Vec<Option<u64>> = spread[..8].iter().map(|&(_, v)| Some(v)).collect();
        assert_eq!(got, want, "seed {seed}");
        assert_eq!((rtts, posted), (3, 8), "seed {seed}: 8 updates");

        let reqs: Vec<Request> = spread[8..16]
            .iter()
            .map(|&(k, _)| Request::Insert(k + 1, value(k)))
            .collect();
        let (got, rtts, _) = cost(&mut s, &reqs, KvOp::Insert);
        assert_eq!(got, vec![None; 8], "seed {seed}");
        assert_eq!(rtts, 3, "seed {seed}: 8 inserts of new keys");

        let reqs: Vec<Request> = spread[..8].iter().map(|&(k, _)| Request::Get(k)).collect();
        let (got, rtts, _) = cost(&mut s, &reqs, KvOp::Get);
        let want: Vec<Option<u64>> = spread[..8].iter().map(|&(k, _)| Some(value(k))).collect();
        assert_eq!(got, want, "seed {seed}");
        assert_eq!(rtts, 1, "seed {seed}: 8 gets");

        let reqs: Vec<Request> = spread[8..16]
            .iter()
            .map(|&(k, _)| Request::Delete(k + 1))
            .collect();
        let (got, rtts, _) = cost(&mut s, &reqs, KvOp::Delete);
        let want: Vec<Option<u64>> = spread[8..16].iter().map(|&(k, _)| Some(value(k))).collect();
        assert_eq!(got, want, "seed {seed}");
        assert_eq!(rtts, 3, "seed {seed}: 8 deletes");

        // Gets and writes together: still 3.
        let before = c.stats().total().rtts;
        let mut reqs: Vec<Request> = spread[16..20]
            .iter()
            .map(|&(k, _)| Request::Get(k))
            .collect();
        reqs.extend(spread[20..24].iter().map(|&(k, v)| Request::Update(k, v)));
        let got = s.run_many(&reqs).unwrap();
        assert!(got.iter().all(Result::is_ok), "seed {seed}: {got:?}");
        assert_eq!(c.stats().total().rtts - before, 3, "seed {seed}: mixed");
        s.flush().unwrap();
        assert_eq!(c.locks_maybe_held(), 0);
    }
}

/// One thread, random batches (chains collide, inserts split, models
/// retrain): every answer is what the requests applied one by one, in
/// order, to a `BTreeMap` give.
fn answers_in_request_order(unordered: bool, seed: u64) {
    let keys = 40u64;
    let pairs: Vec<(u64, u64)> = (0..keys / 2).map(|i| (i * 2 * 1000, i)).collect();
    let node = common::churning_node(&pairs);
    let c = KvClient::connect(
        KvClientConfig {
            engine: engine(unordered, None, seed),
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap();
    let mut s = c.session().unwrap();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let mut rng = StdRng::seed_from_u64(5 + seed);
    let mut n = 0;
    for b in 0..400 {
        if b % 50 == 0 {
            for m in 0..node.model_count() {
                common::retrain_unless_busy(&node, m);
            }
        }
        let reqs = random_batch(&mut rng, keys, 8, 0, &mut n);
        let got = s.run_many(&reqs).unwrap();
        for (r, a) in reqs.iter().zip(got) {
            let a = a.unwrap_or_else(|e| panic!("batch {b}: {r:?}: {e}"));
            let want = match *r {
                Request::Get(k) => model.get(&k).copied(),
                Request::Insert(k, v) => model.insert(k, v),
                Request::Update(k, v) => match model.get_mut(&k) {
                    Some(old) => Some(std::mem::replace(old, v)),
                    None => None,
                },
                Request::Delete(k) => model.remove(&k),
            };
            assert_eq!(a, want, "batch {b}: {r:?} (in {reqs:?})");
        }
    }
    for (&k, &v) in &model {
        assert_eq!(s.get(k).unwrap(), Some(v));
    }
    let all: Vec<(u64, u64)> = model.into_iter().collect();
    assert_eq!(s.scan(0, all.len() + 1).unwrap(), all);
    s.flush().unwrap();
    assert_eq!(c.locks_maybe_held(), 0);
}

#[test]
fn answers_follow_request_order_within_a_call() {
    answers_in_request_order(false, 0);
}

#[test]
fn answers_follow_request_order_within_a_call_on_an_unordered_fabric() {
    for seed in 1..=3 {
        answers_in_request_order(true, seed);
    }
}

/// Four threads on two compute nodes, each issuing random batches of up
/// to 8 mixed requests over 24 keys (chains collide), while a retrainer
/// retrains every model again and again: the history (each request of a
/// call invoked at its start and returned at its end) is linearizable.
fn concurrent_batches(order: Delivery, seed: u64) {
    let keys = 24u64;
    let pairs: Vec<(u64, u64)> = (0..keys / 2).map(|i| (i * 2 * 1000, i)).collect();
    let node = common::churning_node_with_grace(&pairs, std::time::Duration::from_millis(20));
    let cfg = KvClientConfig {
        engine: engine_in(order, None, seed),
        model_max_age: std::time::Duration::from_millis(5),
        ..KvClientConfig::default()
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
        |s, rec, rng, t, i| {
            let mut n = i * 8;
            let reqs = random_batch(rng, keys, 8, t, &mut n);
            let ops: Vec<_> = reqs.iter().map(|&r| rec.invoke(call(r))).collect();
            let got = s.run_many(&reqs).unwrap();
            for ((op, r), a) in ops.into_iter().zip(&reqs).zip(got) {
                let a = a.unwrap_or_else(|e| panic!("{r:?}: {e}"));
                rec.finish(
                    op,
                    match r {
                        Request::Get(_) => Ret::Value(a),
                        _ => Ret::Prior(a),
                    },
                );
            }
        },
    );
    let st: Vec<_> = clients.iter().map(|c| c.stats().total()).collect();
    eprintln!(
        "{order:?} seed {seed}: {} ops checked, {retrains} retrains, round trips per request {:.2}, retries {}",
        checked.single_ops,
        st.iter().map(|s| s.rtts).sum::<u64>() as f64 / st.iter().map(|s| s.ops).sum::<u64>() as f64,
        st.iter().map(|s| s.retries).sum::<u64>()
    );
    assert!(checked.single_ops >= 240);
    assert!(retrains > 0);
    for c in &clients {
        assert_eq!(c.locks_maybe_held(), 0);
    }
    assert!(node.last_agent_error().is_none());
}

#[test]
fn concurrent_batches_are_linearizable_on_an_ordered_fabric() {
    for seed in 1..=3 {
        concurrent_batches(Delivery::Ordered, seed);
    }
}

#[test]
fn concurrent_batches_are_linearizable_on_an_unordered_fabric() {
    for seed in 1..=3 {
        concurrent_batches(Delivery::Unordered, seed);
    }
}

#[test]
fn concurrent_batches_are_linearizable_on_tcps_order() {
    for seed in 1..=3 {
        concurrent_batches(Delivery::WritesInOrder, seed);
    }
}

/// Batches under injected faults (retraining): the history with failed
/// writes of unknown outcome (or none, when the error says so) is
/// linearizable, every key read back at the end included — so every
/// acknowledged write is readable unless a later write replaced it — and
/// once the threads flushed, no lock is maybe held and no LT word is
/// locked. Faults at `probability`, and leaf writes torn at `torn` (a
/// prefix lands, the rest of the batch fails: `Faults::torn`).
fn batches_under_injected_faults(order: Delivery, (probability, torn): (f64, f64)) {
    const OWNER: LockOwner = LockOwner(9);
    let keys = 48u64;
    let all: Vec<u64> = (0..keys).map(|k| k * 1000).collect();
    for seed in 1..=4 {
        let pairs: Vec<(u64, u64)> = (0..keys / 2).map(|i| (i * 2 * 1000, i)).collect();
        let node = common::churning_node(&pairs);
        let clients = [0, 1].map(|client| {
            common::faulty_client(&node, (seed, client, probability), OWNER, |faults| {
                engine_in(order, Some(Faults { torn, ..faults }), seed)
            })
        });
        let (checked, f) = common::faulty_history(
            &node,
            &clients,
            (&pairs, OWNER, seed),
            80,
            |s, rec, rng, (t, i), f| {
                // Values unique per thread: up to 8 requests per call.
                let mut n = i * 8;
                let reqs = random_batch(rng, keys, 8, t, &mut n);
                let ops: Vec<_> = reqs.iter().map(|&r| rec.invoke(call(r))).collect();
                match s.run_many(&reqs) {
                    Ok(got) => {
                        for ((op, r), a) in ops.into_iter().zip(&reqs).zip(got) {
                            match (r, a) {
                                (Request::Get(_), Ok(v)) => rec.finish(op, Ret::Value(v)),
                                (_, Ok(v)) => rec.finish(op, Ret::Prior(v)),
                                (_, Err(e)) => {
                                    f.count(e.may_have_applied());
                                    rec.error(op, e.may_have_applied());
                                }
                            }
                        }
                    }
                    Err(e) => {
                        // Nothing ran.
                        for op in ops {
                            f.count(false);
                            rec.error(op, e.may_have_applied());
                        }
                    }
                }
            },
            (&all, |s: &mut KvSession, key| s.get(key).unwrap()),
        );
        let rtts: u64 = clients.iter().map(|c| c.stats().total().rtts).sum();
        let ops: u64 = clients.iter().map(|c| c.stats().total().ops).sum();
        println!(
            "{order:?} seed {seed}: {} requests failed ({} may have \
             applied) of {} checked; round trips per request {:.2}",
            f.failed,
            f.unknown,
            checked.single_ops,
            rtts as f64 / ops as f64
        );
    }
}

#[test]
fn batches_under_injected_faults_leave_no_lock_and_lose_no_write() {
    batches_under_injected_faults(Delivery::Ordered, (0.01, 0.0));
}

#[test]
fn batches_under_injected_faults_leave_no_lock_and_lose_no_write_unordered() {
    batches_under_injected_faults(Delivery::Unordered, (0.01, 0.0));
}

#[test]
fn batches_under_injected_faults_leave_no_lock_and_lose_no_write_on_tcps_order() {
    batches_under_injected_faults(Delivery::WritesInOrder, (0.01, 0.0));
}

/// Leaf writes torn by a broken link are written again whole before
/// their locks are released: every key reads back.
#[test]
fn batches_with_torn_leaf_writes_lose_no_write() {
    batches_under_injected_faults(Delivery::Ordered, (0.0, 0.05));
}

#[test]
fn batches_with_torn_leaf_writes_lose_no_write_unordered() {
    batches_under_injected_faults(Delivery::Unordered, (0.0, 0.05));
}

#[test]
fn batches_with_torn_leaf_writes_lose_no_write_on_tcps_order() {
    batches_under_injected_faults(Delivery::WritesInOrder, (0.0, 0.05));
}

/// Sessions dropped right after a call of writes on an unordered fabric,
/// their unlocks posted and not yet awaited (a new session each call,
/// some on models retraining meanwhile), answer as a sequential
/// `BTreeMap` and leave no chain locked: dropping a session settles its
/// posted unlocks. With injected faults, every lock an unlock that failed
/// left is released by the client's record of locks maybe held once a
/// later session flushes, and every key reads back as a write of its own
/// (or its load value) left it.
fn sessions_dropped_with_unlocks_posted(faults: bool) {
    const OWNER: LockOwner = LockOwner(21);
    let keys = 64u64;
    for seed in 1..=4u64 {
        let pairs: Vec<(u64, u64)> = (0..keys / 2).map(|i| (i * 2 * 1000, i)).collect();
        let node = common::churning_node(&pairs);
        let c = (0..1000u64)
            .find_map(|attempt| {
                let cfg = KvClientConfig {
                    engine: engine(
                        true,
                        faults.then_some(Faults {
                            probability: 0.02,
                            seed: seed * 1_000_003 + attempt,
                            torn: 0.0,
                            tear_kills: false,
                        }),
                        seed,
                    ),
                    lock_owner: OWNER,
                    ..KvClientConfig::default()
                };
                KvClient::connect(cfg, &node.pool()).ok()
            })
            .expect("connecting under injected faults");
        let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
        // Each key's values a write of it may have left (faults).
        let mut maybe: BTreeMap<u64, Vec<Option<u64>>> = BTreeMap::new();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut n = 0;
        let mut failed = 0;
        for call in 0..150 {
            let Ok(mut s) = c.session() else {
                failed += 1;
                continue;
            };
            if call % 10 == 0 {
                for m in 0..node.model_count() {
                    let _ = node.retrain_now(m);
                }
            }
            let reqs = random_batch(&mut rng, keys, 8, 0, &mut n);
            match s.run_many(&reqs) {
                Ok(got) => {
                    for (&r, a) in reqs.iter().zip(got) {
                        let key = match r {
                            Request::Get(k)
                            | Request::Insert(k, _)
                            | Request::Update(k, _)
                            | Request::Delete(k) => k,
                        };
                        let a = match a {
                            Ok(a) => a,
                            Err(e) => {
                                assert!(faults, "call {call}: {r:?}: {e}");
                                failed += 1;
                                if e.may_have_applied() {
                                    let after = match r {
                                        Request::Insert(_, v) | Request::Update(_, v) => Some(v),
                                        _ => None,
                                    };
                                    maybe.entry(key).or_default().push(after);
                                }
                                continue;
                            }
                        };
                        if maybe.contains_key(&key) {
                            // Its value is unknown to the model: take what
                            // the store says from here on.
                            continue;
                        }
                        let want = match r {
                            Request::Get(k) => model.get(&k).copied(),
                            Request::Insert(k, v) => model.insert(k, v),
                            Request::Update(k, v) => {
                                model.get_mut(&k).map(|o| std::mem::replace(o, v))
                            }
                            Request::Delete(k) => model.remove(&k),
                        };
                        assert_eq!(a, want, "seed {seed} call {call}: {r:?}");
                    }
                }
                Err(e) => {
                    assert!(faults, "call {call}: {e}");
                    assert!(!e.may_have_applied(), "nothing ran: {e}");
                    failed += 1;
                }
            }
            // Dropped with its unlocks posted.
            drop(s);
            if !faults {
                assert_eq!(c.locks_maybe_held(), 0, "seed {seed} call {call}");
            }
        }
        // Until none is left, within the hang guard: a lock kept for
        // repair waits for every other lock of this process in its stripe
        // (module `held` of rolex-kv), the stripe table is the process's
        // (tests running beside this one count in it too), and plain
        // records of its stripe wait for it. One run in about 600 of this
        // file had 21 records of one word (one kept for repair, its stripe
        // counting another lock) still held after 100 tries 1 ms apart,
        // all released after 152 (186 ms).
        let start = std::time::Instant::now();
        while c.locks_maybe_held() > 0 && start.elapsed() < common::HANG {
            if let Ok(mut s) = c.session() {
                let _ = s.flush();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(c.locks_maybe_held(), 0, "seed {seed}: a lock maybe held");
        assert_eq!(
            node.release_locks_of(OWNER).unwrap(),
            0,
            "seed {seed}: an LT word locked"
        );
        assert_eq!(faults, failed > 0, "seed {seed}: {failed} failed");
        // Every key as the model says (a key a failed write touched: as
        // the model or as one of those writes may have left it).
        let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut s = reader.session().unwrap();
        for k in 0..keys {
            let key = k * 1000;
            let got = s.get(key).unwrap();
            if !maybe.contains_key(&key) {
                assert_eq!(got, model.get(&key).copied(), "seed {seed}: key {key}");
            }
        }
    }
}

#[test]
fn sessions_dropped_with_unlocks_posted_leave_no_lock() {
    sessions_dropped_with_unlocks_posted(false);
}

#[test]
fn sessions_dropped_with_unlocks_posted_under_injected_faults_leave_no_lock() {
    sessions_dropped_with_unlocks_posted(true);
}

/// A client on an unordered loopback fabric with 200 µs of modelled
/// latency, so that a posted unlock and the next lock's `CAS` come due
/// together and run in either order; nothing retrains.
fn latent_unordered_client(node: &rolex_host::memnode::MemoryNode, seed: u64) -> KvClient {
    common::steady_client(node, Some((seed, std::time::Duration::from_micros(200))))
}

/// On an unordered fabric a write's unlock is posted and not awaited, and
/// later operations of the session do not wait for it unless they lock
/// its chain: then they wait for it before their lock's `CAS` (which would
/// otherwise meet the session's own lock and retry). Writes of one chain
/// back to back — single and pipelined, gets between them — each see the
/// one before and never retry.
#[test]
fn a_write_of_a_chain_whose_unlock_is_posted_waits_for_it_not_at_the_lock() {
    for seed in 1..=3 {
        let (node, pairs) = common::half_full_node();
        let c = latent_unordered_client(&node, seed);
        let mut s = c.session().unwrap();
        let (k, v0) = pairs[pairs.len() / 2];
        let (k2, _) = pairs[pairs.len() / 4];
        let retries = |c: &KvClient| c.stats().total().retries;
        let before = retries(&c);
        let mut last = v0;
        for i in 1..=40u64 {
            let v = i << 32 | seed;
            if i % 2 == 0 {
                assert_eq!(
                    s.update(k, v).unwrap(),
                    Some(last),
                    "seed {seed}, write {i}"
                );
            } else {
                let got = s
                    .run_many(&[Request::Update(k, v), Request::Get(k2)])
                    .unwrap();
                assert_eq!(
                    got[0].as_ref().unwrap(),
                    &Some(last),
                    "seed {seed}, write {i}"
                );
            }
            last = v;
            if i % 5 == 0 {
                // A read after the write sees it, its unlock settled or not.
                assert_eq!(s.get(k).unwrap(), Some(v), "seed {seed}");
            }
        }
        assert_eq!(
            retries(&c) - before,
            0,
            "seed {seed}: a write met its own lock"
        );
        s.flush().unwrap();
        assert_eq!(c.locks_maybe_held(), 0);
        drop(s);
        let mut r = c.session().unwrap();
        assert_eq!(r.get(k).unwrap(), Some(last));
    }
}

/// More unlocks posted than a session keeps unsettled (calls of 100
/// writes on an unordered fabric, one after the other on the same 100
/// chains): every write sees the one before, and nothing is left locked.
/// What it asserts is the answers: they would be the same if the next
/// call waited for each unlock only at its own chain's lock, so it does
/// not tell whether the wait-for-all path (`PENDING_MAX`) ran — that was
/// checked by hand (it runs on each of the three later calls).
#[test]
fn calls_of_many_writes_each_see_the_one_before() {
    // Keys 16 apart in the list are in distinct leaves.
    let (node, pairs) = common::half_full_node_of(4000);
    let c = latent_unordered_client(&node, 5);
    let mut s = c.session().unwrap();
    let spread: Vec<(u64, u64)> = pairs.iter().step_by(16).take(100).copied().collect();
    let mut want: Vec<Option<u64>> = spread.iter().map(|&(_, v)| Some(v)).collect();
    for round in 1..=4u64 {
        let reqs: Vec<Request> = spread
            .iter()
            .map(|&(k, _)| Request::Update(k, k ^ round << 48))
            .collect();
        let got = answers(&mut s, &reqs);
        assert_eq!(got, want, "round {round}");
        want = spread.iter().map(|&(k, _)| Some(k ^ round << 48)).collect();
    }
    drop(s);
    assert_eq!(c.locks_maybe_held(), 0);
    let mut r = c.session().unwrap();
    for (&(k, _), w) in spread.iter().zip(&want) {
        assert_eq!(r.get(k).unwrap(), *w);
    }
}
