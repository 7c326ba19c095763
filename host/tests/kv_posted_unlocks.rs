//! Posted unlocks settled lazily (unordered fabric): a write's unlock
//! `CAS` is posted once its leaf landed and waited for only by a later
//! lock of its chain, by `flush`, by `Drop`, or once a session holds too
//! many. These tests attack that from every side a session can be left
//! with unlocks in flight: sessions of one client (one lock owner) and of
//! two clients writing a few chains with modelled latency and injected
//! faults (histories checked); a session that writes and goes idle while
//! others write its chain; splits whose unlock is posted, followed at once
//! by writes and gets of the chain and of the new synonym leaf; unlocks
//! that fail while the memory node refuses operations; cluster sessions
//! dropped with more unlocks posted than a session keeps. Each checks that
//! no lock is left, and that every acknowledged write is readable.

mod common;

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rolex_checker::{Call, Ret};
use rolex_core::entry::LockOwner;
use rolex_host::kv::{KvClient, KvClientConfig, KvSession, Request};
use rolex_host::memnode::MemoryNode;
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig, Unordered};

/// A loopback engine: unordered (window 8) or not, with `latency` per
/// operation and `faults`.
fn engine(unordered: bool, latency_us: u64, faults: Option<Faults>, seed: u64) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            faults,
            latency: Duration::from_micros(latency_us),
            unordered: unordered.then_some(Unordered {
                seed,
                window: 8,
                writes_in_order: false,
            }),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    }
}

/// A client of `node` without faults owning its locks as `owner`.
fn client(node: &MemoryNode, unordered: bool, latency_us: u64, owner: u8, seed: u64) -> KvClient {
    KvClient::connect(
        KvClientConfig {
            engine: engine(unordered, latency_us, None, seed),
            lock_owner: LockOwner(owner.into()),
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap()
}

/// Flushes `s` until `c` holds no lock maybe (a flush's error is a posted
/// unlock's, reported once) and asserts it then holds none.
fn drain(c: &KvClient, s: &mut KvSession) {
    for _ in 0..100 {
        let _ = s.flush();
        if c.locks_maybe_held() == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(c.locks_maybe_held(), 0, "a lock maybe held after flushing");
}

/// Four sessions — two per client, both clients configured with the same
/// lock owner, so every session shares its owner id with the three others
/// — write and read 6 keys of 3 leaves on an unordered fabric with 150 µs
/// of modelled latency and 3 % of operations failing (no retraining: the
/// failures land on the writes, not on model refreshes). The history,
/// every key read back at the end by a client without faults included, is
/// linearizable; once every session flushed, no lock is maybe held and no
/// LT word is locked.
#[test]
fn sessions_of_one_owner_write_few_chains_under_latency_and_faults() {
    sessions_of_one_owner(true, 1..=3, 0.03);
}

/// [`sessions_of_one_owner_write_few_chains_under_latency_and_faults`]
/// with 20 % of operations failing, over 20 seeds: a leaf write fails
/// often, its lock is kept for repair, and the retry that wrote the leaf
/// again whole then fails its release `CAS` — which may have landed. The
/// chain may then be locked again by another session of the process (the
/// same word: one owner id) whose own release fails in turn; the record
/// must not take that lock for its own and write its old leaf over that
/// session's acknowledged writes. While such a record kept its repair,
/// this failed in 19 runs of 20.
#[test]
fn a_repair_whose_release_may_have_landed_writes_no_old_leaf() {
    sessions_of_one_owner(true, 1..=20, 0.2);
}

/// [`a_repair_whose_release_may_have_landed_writes_no_old_leaf`] on an
/// ordered fabric, 40 seeds: there a leaf write and its unlock `CAS` go
/// in one batch, and when both fail the unlock may have landed (the
/// write failing alone does not say it was torn). The lock is kept for
/// repair, unsure: it must not write its leaf again over a whole leaf
/// that another session of the process, which locked the chain since,
/// wrote. While such a lock rewrote its leaf whenever it found its
/// locked word, this failed in 14 runs of 20.
#[test]
fn a_repair_whose_release_may_have_landed_writes_no_old_leaf_ordered() {
    sessions_of_one_owner(false, 1..=40, 0.2);
}

/// The history of four sessions of two clients with one lock owner over
/// 6 keys of 3 leaves, on an `unordered` fabric or not with 150 µs of
/// latency and `probability` of operations failing, for each of `seeds`:
/// checked linearizable, no lock maybe held or left once flushed.
fn sessions_of_one_owner(unordered: bool, seeds: std::ops::RangeInclusive<u64>, probability: f64) {
    use rolex_checker::{Clock, History, Recorder};
    const OWNER: LockOwner = LockOwner(51);
    for seed in seeds {
        let (node, loaded) = common::half_full_node();
        // Two keys per leaf, three leaves (keys 160 apart are in distinct
        // leaves): two of them present at load.
        let (keys, initial) = common::two_keys_in_each_of_three_leaves(&loaded);
        let clients = [0, 1].map(|client| {
            common::faulty_client(&node, (seed, client, probability), OWNER, |faults| {
                engine(unordered, 150, Some(faults), seed)
            })
        });
        let clock = std::sync::Arc::new(Clock::new());
        let mut history = History::new(initial.iter().copied());
        let mut failed = 0u64;
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4usize)
                .map(|t| {
                    let (c, clock, keys) = (&clients[t % 2], clock.clone(), &keys);
                    scope.spawn(move || {
                        let mut s = (0..1000)
                            .find_map(|_| c.session().ok())
                            .expect("a session under injected faults");
                        let mut rec = Recorder::new(t, clock);
                        let mut rng = StdRng::seed_from_u64(seed * 17 + t as u64);
                        let mut failed = 0u64;
                        for i in 0..80u64 {
                            let key = keys[rng.gen_range(0..keys.len())];
                            let value = (t as u64) << 32 | (i + 1);
                            let call = match rng.gen_range(0..4) {
                                0 => Call::Get { key },
                                1 => Call::Insert { key, value },
                                2 => Call::Update { key, value },
                                _ => Call::Delete { key },
                            };
                            let op = rec.invoke(call);
                            let r = match call {
                                Call::Get { .. } => s.get(key).map(Ret::Value),
                                Call::Insert { .. } => s.insert(key, value).map(Ret::Prior),
                                Call::Update { .. } => s.update(key, value).map(Ret::Prior),
                                _ => s.delete(key).map(Ret::Prior),
                            };
                            match r {
                                Ok(ret) => rec.finish(op, ret),
                                Err(e) => {
                                    failed += 1;
                                    rec.error(op, e.may_have_applied());
                                }
                            }
                        }
                        // Retries every lock its client may still hold; what
                        // is left (a lock kept for repair waits while other
                        // threads hold locks in its stripe) is flushed once
                        // every thread is done (below).
                        for _ in 0..100 {
                            let _ = s.flush();
                            if c.locks_maybe_held() == 0 {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        (rec.into_records(), failed)
                    })
                })
                .collect();
            for w in workers {
                let (records, f) = w.join().unwrap();
                history.extend(records);
                failed += f;
            }
        });
        assert!(failed > 0, "seed {seed}: faults were injected");
        for c in &clients {
            for _ in 0..1000 {
                if c.locks_maybe_held() == 0 {
                    break;
                }
                if let Ok(mut s) = c.session() {
                    let _ = s.flush();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(c.locks_maybe_held(), 0, "seed {seed}");
        }
        assert_eq!(node.release_locks_of(OWNER).unwrap(), 0, "seed {seed}");
        let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut s = reader.session().unwrap();
        let mut rec = Recorder::new(4, clock.clone());
        for &key in &keys {
            let op = rec.invoke(Call::Get { key });
            let got = s.get(key).unwrap();
            rec.finish(op, Ret::Value(got));
        }
        history.extend(rec.into_records());
        let checked = history
            .check()
            .unwrap_or_else(|v| panic!("seed {seed}: not linearizable: {v}"));
        println!(
            "seed {seed}: {failed} failed of {} checked",
            checked.single_ops
        );
    }
}

/// A session writes a key and goes idle, its unlock posted and never
/// settled by it, while another session of its client (same owner) and a
/// session of another client write the same key at once, single and
/// pipelined: none hangs, each sees the write before it, the idle
/// session's next write sees theirs. Once flushed no LT word is locked.
#[test]
fn a_session_idle_with_its_unlock_posted_holds_up_no_other_writer() {
    for seed in 1..=3u64 {
        let (node, pairs) = common::half_full_node();
        let c1 = client(&node, true, 300, 61, seed);
        let c2 = client(&node, true, 300, 62, seed + 100);
        let (mut a, mut b) = (c1.session().unwrap(), c1.session().unwrap());
        let mut c = c2.session().unwrap();
        let (k, v0) = pairs[pairs.len() / 3];
        // A key of another leaf, written with `k` in pipelined calls.
        let (k2, v2) = pairs[pairs.len() / 3 + 40];
        let mut last = v0;
        let mut last2 = v2;
        for i in 1..=25u64 {
            let va = i << 40 | 1;
            let vb = i << 40 | 2;
            let vc = i << 40 | 3;
            assert_eq!(a.update(k, va).unwrap(), Some(last), "seed {seed} {i}");
            // `a` idle from here, its unlock posted.
            if i % 2 == 0 {
                assert_eq!(b.update(k, vb).unwrap(), Some(va), "seed {seed} {i}");
            } else {
                let got = b
                    .run_many(&[Request::Update(k, vb), Request::Update(k2, vb)])
                    .unwrap();
                assert_eq!(got[0].as_ref().unwrap(), &Some(va), "seed {seed} {i}");
                assert_eq!(got[1].as_ref().unwrap(), &Some(last2), "seed {seed} {i}");
                last2 = vb;
            }
            assert_eq!(c.update(k, vc).unwrap(), Some(vb), "seed {seed} {i}");
            assert_eq!(b.get(k).unwrap(), Some(vc), "seed {seed} {i}");
            last = vc;
        }
        // The idle session's last unlock is still its own to settle.
        for s in [&mut a, &mut b] {
            s.flush().unwrap();
        }
        c.flush().unwrap();
        assert_eq!(c1.locks_maybe_held() + c2.locks_maybe_held(), 0);
        assert_eq!(node.release_locks_of(LockOwner(61)).unwrap(), 0);
        assert_eq!(node.release_locks_of(LockOwner(62)).unwrap(), 0);
        assert_eq!(a.get(k).unwrap(), Some(last));
        assert_eq!(a.get(k2).unwrap(), Some(last2));
    }
}

/// Inserts of new keys into full 8-slot leaves split them, the split's
/// unlock posted and not awaited (on either fabric). Right after each, the
/// same session and another of its client (same owner) insert next to it,
/// read the key that moved to the new synonym leaf and update it: every
/// acknowledged write is read back, by a fresh client at the end too, and
/// no lock is left.
#[test]
fn writes_and_gets_right_after_a_split_whose_unlock_is_posted() {
    for (unordered, seed) in [(true, 1u64), (true, 2), (false, 3)] {
        let pairs = common::loaded(600, 16);
        let node = common::eight_slot_node(&pairs);
        let c = client(&node, unordered, 200, 71, seed);
        let (mut a, mut b) = (c.session().unwrap(), c.session().unwrap());
        let mut want: std::collections::BTreeMap<u64, u64> = pairs.iter().copied().collect();
        let mut rng = StdRng::seed_from_u64(seed);
        // New keys between the loaded ones (1, 17, 33, …): each leaf
        // fills up and splits, often more than once.
        let bases: Vec<u64> = (0..12)
            .map(|_| pairs[rng.gen_range(0..pairs.len())].0)
            .collect();
        for off in 1..16u64 {
            for (n, &base) in bases.iter().enumerate() {
                let key = base + off;
                if want.contains_key(&key) {
                    continue;
                }
                let v = key << 8 | 1;
                let (w, r) = if n % 2 == 0 {
                    (&mut a, &mut b)
                } else {
                    (&mut b, &mut a)
                };
                assert_eq!(w.insert(key, v).unwrap(), None, "{key}");
                want.insert(key, v);
                // At once: the other session reads it and the key before
                // it (which may have moved to the new leaf), and updates
                // both; the writer reads them back.
                let prev = key - 1;
                assert_eq!(r.get(key).unwrap(), Some(v), "{key}");
                assert_eq!(r.get(prev).unwrap(), want.get(&prev).copied(), "{prev}");
                let got = r
                    .run_many(&[Request::Update(key, v + 1), Request::Get(prev)])
                    .unwrap();
                assert_eq!(got[0].as_ref().unwrap(), &Some(v), "{key}");
                assert_eq!(got[1].as_ref().unwrap(), &want.get(&prev).copied());
                want.insert(key, v + 1);
                assert_eq!(w.update(key, v + 2).unwrap(), Some(v + 1), "{key}");
                want.insert(key, v + 2);
                assert_eq!(w.get(key).unwrap(), Some(v + 2), "{key}");
            }
        }
        assert!(
            c.stats().synonym_leaves > 0,
            "unordered {unordered}: no leaf split"
        );
        a.flush().unwrap();
        b.flush().unwrap();
        assert_eq!(c.locks_maybe_held(), 0);
        assert_eq!(node.release_locks_of(LockOwner(71)).unwrap(), 0);
        let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut s = reader.session().unwrap();
        for (&k, &v) in &want {
            assert_eq!(s.get(k).unwrap(), Some(v), "unordered {unordered}: key {k}");
        }
    }
}

/// Unlocks posted just before the memory node starts refusing operations
/// (`set_failed`), some still in flight when it does: whatever their fate,
/// their error reaches a later operation or the flush (never a hang), and
/// once the node answers again and the session flushed, no lock is held
/// maybe or left in the pool, and every acknowledged write reads back;
/// another session of the client that writes those keys meanwhile fails or
/// succeeds, and never loses a write it acknowledged.
#[test]
fn unlocks_that_fail_while_the_node_refuses_are_released_after() {
    for seed in 1..=4u64 {
        let (node, pairs) = common::half_full_node();
        let c = client(&node, true, 300, 81, seed);
        let (mut a, mut b) = (c.session().unwrap(), c.session().unwrap());
        // Keys 160 apart: distinct leaves.
        let keys: Vec<(u64, u64)> = pairs.iter().step_by(16).take(20).copied().collect();
        let mut want: std::collections::BTreeMap<u64, u64> = keys.iter().copied().collect();
        let mut maybe: std::collections::BTreeMap<u64, Vec<u64>> = Default::default();
        for round in 1..=4u64 {
            // `a` writes every key, its unlocks posted …
            let reqs: Vec<Request> = keys
                .iter()
                .map(|&(k, _)| Request::Update(k, k ^ round << 48))
                .collect();
            // A posted unlock's error fails the call before it ran.
            let got = match a.run_many(&reqs) {
                Ok(got) => got,
                Err(e) => {
                    assert!(!e.may_have_applied(), "seed {seed}: {e}");
                    continue;
                }
            };
            for (&(k, _), r) in keys.iter().zip(got) {
                match r {
                    Ok(prior) => {
                        if maybe.remove(&k).is_none() {
                            assert_eq!(prior, want.get(&k).copied(), "seed {seed}: {k}");
                        }
                        want.insert(k, k ^ round << 48);
                    }
                    Err(e) => {
                        assert!(round > 1, "seed {seed}: {e}");
                        if e.may_have_applied() {
                            maybe.entry(k).or_default().push(k ^ round << 48);
                        }
                    }
                }
            }
            // … and the node refuses operations while some are in flight.
            assert!(node.engine().set_failed(true), "loopback fails peers");
            std::thread::sleep(Duration::from_micros(200 * seed));
            assert!(node.engine().set_failed(false));
            // `a`'s next operation settles its unlocks that completed
            // (those that failed: released again, or recorded).
            let _ = a.get(keys[0].0);
            // Another session of the client writes one of them: it may
            // fail, never hangs; what it acknowledges is kept.
            let (k, _) = keys[round as usize];
            let v = k ^ round << 52;
            match b.update(k, v) {
                Ok(_) => {
                    want.insert(k, v);
                    maybe.remove(&k);
                }
                Err(e) => {
                    if e.may_have_applied() {
                        maybe.entry(k).or_default().push(v);
                    }
                }
            }
            let _ = a.flush();
        }
        drain(&c, &mut a);
        drain(&c, &mut b);
        // No chain is left locked: every model retrains (a freeze meets
        // no lock of ours).
        for m in 0..node.model_count() {
            node.retrain_now(m).unwrap();
        }
        assert_eq!(
            node.release_locks_of(LockOwner(81)).unwrap(),
            0,
            "seed {seed}"
        );
        let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut s = reader.session().unwrap();
        for (&k, &v) in &want {
            let got = s.get(k).unwrap();
            let ok = got == Some(v)
                || maybe
                    .get(&k)
                    .is_some_and(|m| m.iter().any(|&x| got == Some(x)));
            assert!(
                ok,
                "seed {seed}: key {k}: {got:?}, want {v} or {:?}",
                maybe.get(&k)
            );
        }
    }
}

/// Cluster sessions (two memory nodes, unordered, modelled latency)
/// dropped right after a call of 100 writes — more unlocks posted than a
/// session keeps — while a session of another cluster client of the same
/// owner writes the same keys: every acknowledged write reads back and no
/// lock is left.
#[test]
fn cluster_sessions_dropped_with_many_unlocks_posted_leave_no_lock() {
    const OWNER: u8 = 91;
    let pairs = common::loaded(3000, 4);
    let connect = |i: usize, node: &MemoryNode| client(node, true, 100, OWNER, 7 + i as u64);
    let (mns, c) = common::cluster_with(&pairs, 2, connect);
    let other = {
        use rolex_host::kv::cluster::{ClusterClient, ClusterNode};
        let nodes = mns
            .iter()
            .enumerate()
            .map(|(i, n)| ClusterNode {
                name: format!("node-{i}"),
                client: client(n, true, 100, OWNER, 70 + i as u64),
            })
            .collect();
        ClusterClient::new(c.map().clone(), nodes).unwrap()
    };
    // 100 keys spread over both nodes, 8 leaves apart (8-slot leaves).
    let spread: Vec<u64> = pairs.iter().step_by(29).take(100).map(|p| p.0).collect();
    let mut want: std::collections::BTreeMap<u64, Option<u64>> =
        spread.iter().map(|&k| (k, Some((k - 1) / 4))).collect();
    let mut o = other.session().unwrap();
    for round in 1..=6u64 {
        let mut s = c.session().unwrap();
        let reqs: Vec<Request> = spread
            .iter()
            .map(|&k| Request::Update(k, k ^ round << 48))
            .collect();
        for (&k, a) in spread.iter().zip(s.run_many(&reqs)) {
            assert_eq!(a.unwrap(), want[&k], "round {round}: {k}");
            want.insert(k, Some(k ^ round << 48));
        }
        drop(s);
        // At once, through the other client: a write of a few of them,
        // then every key read.
        for &k in spread.iter().step_by(7) {
            let v = k ^ round << 52;
            assert_eq!(o.update(k, v).unwrap(), want[&k], "round {round}: {k}");
            want.insert(k, Some(v));
        }
        let got = o.get_many(&spread).unwrap();
        for (k, g) in spread.iter().zip(got) {
            assert_eq!(g, want[k], "round {round}: {k}");
        }
    }
    o.flush().unwrap();
    assert_eq!(c.locks_maybe_held() + other.locks_maybe_held(), 0);
    for n in &mns {
        assert_eq!(n.release_locks_of(LockOwner(OWNER.into())).unwrap(), 0);
    }
}

/// Two sessions (two clients) each write one chain, then at once the
/// other's, round after round, on an unordered fabric with 300 µs of
/// modelled latency and 10 % of operations failing: a write's next
/// operation starts while its unlock is still in flight, and when that
/// unlock fails its chain stays locked until the session settles it. No
/// write may run out of attempts (`max_attempts` 3,000 here) waiting for
/// the other session's chain; every key ends at a value some write left;
/// no lock is left once both flushed.
#[test]
fn crossed_writes_whose_unlocks_fail_in_flight_do_not_wait_for_each_other() {
    use std::sync::Barrier;
    let (node, pairs) = common::half_full_node();
    let connect = |owner: u16, seed: u64| {
        (0..1000u64)
            .find_map(|attempt| {
                let faults = Faults {
                    probability: 0.1,
                    seed: seed * 1_000_003 + attempt,
                    torn: 0.0,
                    tear_kills: false,
                };
                KvClient::connect(
                    KvClientConfig {
                        engine: engine(true, 300, Some(faults), seed),
                        lock_owner: LockOwner(owner),
                        max_attempts: 3000,
                        ..KvClientConfig::default()
                    },
                    &node.pool(),
                )
                .ok()
            })
            .expect("connecting under injected faults")
    };
    let clients = [connect(101, 1), connect(102, 2)];
    // Key pairs in distinct leaves (160 apart).
    let rounds = 30usize;
    let xy: Vec<(u64, u64)> = (0..rounds)
        .map(|i| (pairs[32 * i].0, pairs[32 * i + 16].0))
        .collect();
    let barrier = Barrier::new(2);
    let too_many = std::sync::atomic::AtomicU64::new(0);
    // Per thread: each key's last acknowledged value and the values of its
    // writes of unknown outcome since.
    let results: Vec<Vec<(u64, u64, Vec<u64>)>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2u64)
            .map(|t| {
                let (c, xy, barrier, too_many) = (&clients[t as usize], &xy, &barrier, &too_many);
                scope.spawn(move || {
                    let mut s = (0..1000)
                        .find_map(|_| c.session().ok())
                        .expect("a session under injected faults");
                    let mut out = Vec::new();
                    for (i, &(x, y)) in xy.iter().enumerate() {
                        let (first, second) = if t == 0 { (x, y) } else { (y, x) };
                        barrier.wait();
                        for (n, key) in [first, second].into_iter().enumerate() {
                            let v = (i as u64) << 8 | t << 4 | n as u64 | 1 << 40;
                            match s.update(key, v) {
                                Ok(_) => out.push((key, v, Vec::new())),
                                Err(e) => {
                                    if matches!(e, rolex_host::kv::KvError::TooManyRetries { .. }) {
                                        too_many.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                                    }
                                    if e.may_have_applied() {
                                        out.push((key, 0, vec![v]));
                                    }
                                }
                            }
                        }
                    }
                    drain(c, &mut s);
                    out
                })
            })
            .collect();
        threads.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let too_many = too_many.into_inner();
    println!("{too_many} writes ran out of attempts");
    assert_eq!(too_many, 0, "writes waited for each other's failed unlocks");
    for c in &clients {
        assert_eq!(c.locks_maybe_held(), 0);
    }
    assert_eq!(node.release_locks_of(LockOwner(101)).unwrap(), 0);
    assert_eq!(node.release_locks_of(LockOwner(102)).unwrap(), 0);
    // Each key is written by both threads, in rounds the barrier orders
    // only loosely: its value is one of the writes made to it.
    let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut r = reader.session().unwrap();
    for &(x, y) in &xy {
        for key in [x, y] {
            let got = r.get(key).unwrap().unwrap();
            let made = results
                .iter()
                .flatten()
                .filter(|w| w.0 == key)
                .any(|w| w.1 == got || w.2.contains(&got));
            let load = pairs.iter().any(|&(k, v)| k == key && v == got);
            assert!(made || load, "key {key}: {got} was never written");
        }
    }
}

/// A write whose unlock is posted, then at once a retraining of every
/// model (its freeze waits for the posted unlock to land: the session
/// does nothing meanwhile), then writes of the same key by the same
/// session — through its stale view first — and by another session of its
/// client: each sees the write before it, and no lock is left.
#[test]
fn retraining_right_after_a_write_whose_unlock_is_posted() {
    for seed in 1..=2u64 {
        let pairs = common::loaded(300, 10);
        let node = common::small_kv_node(&pairs);
        let c = client(&node, true, 300, 111, seed);
        let (mut a, mut b) = (c.session().unwrap(), c.session().unwrap());
        let mut rng = StdRng::seed_from_u64(seed);
        let mut want: std::collections::BTreeMap<u64, u64> = pairs.iter().copied().collect();
        let mut retrained = 0;
        for i in 1..=20u64 {
            let (k, _) = pairs[rng.gen_range(0..pairs.len())];
            let v = i << 32 | 1;
            assert_eq!(
                a.update(k, v).unwrap(),
                want.insert(k, v),
                "seed {seed} {i}"
            );
            for m in 0..node.model_count() {
                if common::retrain_unless_busy(&node, m) {
                    retrained += 1;
                }
            }
            assert_eq!(a.update(k, v + 1).unwrap(), Some(v), "seed {seed} {i}");
            assert_eq!(b.update(k, v + 2).unwrap(), Some(v + 1), "seed {seed} {i}");
            want.insert(k, v + 2);
            assert_eq!(a.get(k).unwrap(), Some(v + 2), "seed {seed} {i}");
        }
        assert!(retrained > 0, "seed {seed}: nothing retrained");
        a.flush().unwrap();
        b.flush().unwrap();
        assert_eq!(c.locks_maybe_held(), 0);
        assert_eq!(node.release_locks_of(LockOwner(111)).unwrap(), 0);
        let mut r = c.session().unwrap();
        for (&k, &v) in &want {
            assert_eq!(r.get(k).unwrap(), Some(v), "seed {seed}: key {k}");
        }
    }
}

/// A session's posted unlock fails (the memory node refused operations
/// while it was in flight) and the session goes idle. Another session of
/// the same client that writes the chain finds the word locked by its own
/// owner: it settles the failed unlock itself (released again), and its
/// write goes through. Before the fix only the posting session ever looked
/// at its unlock: the other backed off until it ran out of attempts (20
/// of 20 rounds, `max_attempts` 2,000 here; minutes with the default).
#[test]
fn a_failed_unlock_of_an_idle_session_does_not_block_its_chain() {
    let (node, pairs) = common::half_full_node();
    let c = KvClient::connect(
        KvClientConfig {
            engine: engine(true, 300, None, 1),
            lock_owner: LockOwner(121),
            max_attempts: 2000,
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap();
    let (mut a, mut b) = (c.session().unwrap(), c.session().unwrap());
    for i in 0..20u64 {
        let (k, _) = pairs[16 * i as usize];
        // `a`'s unlock in flight fails; `a` stays idle.
        common::write_then_fail_its_unlock(&node, &mut a, k, i << 8 | 1);
        let r = b.update(k, i << 8 | 2);
        let _ = a.flush();
        assert_eq!(r.unwrap(), Some(i << 8 | 1), "round {i}");
        b.flush().unwrap();
        assert_eq!(c.locks_maybe_held(), 0, "round {i}");
        assert_eq!(a.get(k).unwrap(), Some(i << 8 | 2), "round {i}");
    }
    assert_eq!(node.release_locks_of(LockOwner(121)).unwrap(), 0);
}

/// As above, but the writer that meets the chain belongs to another
/// client (another lock owner, as another process would be): only the
/// posting client can release its lock, and its sessions are idle — its
/// reaper does it, once the memory node takes operations again, and the
/// other client's write goes through. Before the reaper, every round ran
/// out of attempts (10 of 10 with `max_attempts` 2,000; here 20,000).
#[test]
fn a_failed_unlock_of_an_idle_client_does_not_block_another_clients_writer() {
    let (node, pairs) = common::half_full_node();
    let connect = |owner: u16| {
        KvClient::connect(
            KvClientConfig {
                engine: engine(true, 300, None, u64::from(owner)),
                lock_owner: LockOwner(owner),
                // Seconds of backing off: the reaper looks every 50 ms.
                max_attempts: 20_000,
                ..KvClientConfig::default()
            },
            &node.pool(),
        )
        .unwrap()
    };
    let (ca, cb) = (connect(131), connect(132));
    let (mut a, mut b) = (ca.session().unwrap(), cb.session().unwrap());
    for i in 0..10u64 {
        let (k, _) = pairs[16 * i as usize];
        // `a`'s unlock in flight fails; `a`'s client stays idle.
        common::write_then_fail_its_unlock(&node, &mut a, k, i << 8 | 1);
        assert_eq!(
            b.update(k, i << 8 | 2).unwrap(),
            Some(i << 8 | 1),
            "round {i}"
        );
        b.flush().unwrap();
        assert_eq!(b.get(k).unwrap(), Some(i << 8 | 2), "round {i}");
    }
    a.flush().unwrap();
    assert_eq!((ca.locks_maybe_held(), cb.locks_maybe_held()), (0, 0));
    for owner in [131, 132] {
        assert_eq!(node.release_locks_of(LockOwner(owner)).unwrap(), 0);
    }
}
