//! The client's reaper (module `reaper` of the store's client): the thread
//! that releases what a failed posted unlock left locked while every
//! session of its client is idle. These tests attack it from every side:
//! live sessions of the same client writing the same chains while it
//! works (unordered fabric, modelled latency, injected faults, windows in
//! which the memory node refuses everything; histories checked); clients
//! and sessions dropped while it is busy with a lock the node keeps
//! refusing to release; clients made and dropped in a loop; the memory
//! node refusing operations for long; cluster clients. Each checks that
//! no lock is left, that acknowledged writes read back, that the client's
//! value space goes back to the pool, and that no reaper thread outlives
//! its client.
//!
//! The tests of this file run one at a time (they count the process's
//! reaper threads).

mod common;

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rolex_checker::{Call, Ret};
use rolex_core::entry::LockOwner;
use rolex_host::kv::{KvClient, KvClientConfig, KvSession};
use rolex_host::memnode::MemoryNode;
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig, Unordered};

/// One test at a time: each counts the reaper threads of the process.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A generous bound on what the tests wait for (a hang guard, never a
/// timing assertion).
const HANG: Duration = Duration::from_secs(20);

/// Waits until `done` holds, at most [`HANG`]; whether it did.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + HANG;
    while Instant::now() < until {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    done()
}

/// The threads of this process named as a reaper.
fn reapers() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(Result::ok)
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == "rolex-kv-reaper")
                })
                .count()
        })
        .unwrap_or(0)
}

/// A loopback engine, unordered (window 8), with `latency_us` per
/// operation and `faults`.
fn engine(latency_us: u64, faults: Option<Faults>, seed: u64) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            faults,
            latency: Duration::from_micros(latency_us),
            unordered: Some(Unordered {
                seed,
                window: 8,
                writes_in_order: false,
            }),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    }
}

/// An unordered client of `node` without faults owning its locks as
/// `owner`, giving up a write after `max_attempts`.
fn client(node: &MemoryNode, latency_us: u64, owner: u16, max_attempts: u64) -> KvClient {
    KvClient::connect(
        KvClientConfig {
            engine: engine(latency_us, None, u64::from(owner)),
            lock_owner: LockOwner(owner),
            max_attempts,
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap()
}

/// A memory node holding keys 0, 10, …, 9990 with byte values, and
/// `value_spare` bytes of value space.
fn value_node(value_spare: u64) -> MemoryNode {
    let pairs: Vec<(u64, u64)> = (0..1000u64).map(|i| (i * 10, i)).collect();
    common::value_node(&pairs, value_spare, value)
}

/// The bytes of value `id` of `key` (1 KiB).
fn value(key: u64, id: u64) -> Vec<u8> {
    common::id_value(key, id, 1024)
}

/// As [`common::write_then_fail_its_unlock`] with a byte value, the node left
/// refusing operations (the caller lets it answer again).
fn put_then_refuse(node: &MemoryNode, s: &mut KvSession, k: u64, id: u64) {
    assert!(s.put(k, &value(k, id)).unwrap(), "key {k} was loaded");
    assert!(node.engine().set_failed(true), "loopback fails peers");
}

/// A client is dropped — its session first, then the client handle —
/// while its reaper holds a lock recorded as maybe held that the memory
/// node keeps refusing to release. Once the node answers again, the lock
/// is released and the client's value space is given back (its last
/// handle is the reaper's session), and the reaper thread ends.
#[test]
fn a_client_dropped_while_its_reaper_is_busy_is_closed_once_the_node_is_back() {
    dropped_while_a_release_is_refused(141, false);
}

/// A session is the last of the user's handles on its client (the client
/// handle went first) and is dropped while its unlock failed, the reaper
/// holds it maybe held and the memory node refuses operations: once the
/// node is back, nothing is left locked, the client's space is given
/// back, and no reaper thread is left.
#[test]
fn a_last_session_dropped_while_its_unlocks_fail_leaves_nothing_behind() {
    dropped_while_a_release_is_refused(142, true);
}

/// Three rounds of: a client of lock owner `owner` writes values of its
/// own, its unlock fails and the node goes on refusing; the client's
/// handles are dropped (the client handle first if `client_first`); then
/// the node answers again: the lock is released, the client's value space
/// given back, and its reaper ends.
fn dropped_while_a_release_is_refused(owner: u16, client_first: bool) {
    let _one = serial();
    let before = reapers();
    for round in 0..3u64 {
        let node = value_node(8 << 20);
        let c = client(&node, 300, owner, 2000);
        let mut s = c.session().unwrap();
        // Value space of its own: a few byte values written.
        for k in 0..20u64 {
            assert!(s.put(k * 80, &value(k * 80, round)).unwrap());
        }
        s.flush().unwrap();
        put_then_refuse(&node, &mut s, 5000, round);
        // The reaper took the failed unlock and could not release it.
        assert!(
            eventually(|| c.locks_maybe_held() > 0),
            "round {round}: the failed unlock recorded"
        );
        if client_first {
            drop(c);
            drop(s);
        } else {
            drop(s);
            drop(c);
        }
        std::thread::sleep(Duration::from_millis(120));
        assert!(node.engine().set_failed(false));
        assert!(
            eventually(|| common::free_word(&node) != 0),
            "round {round}: the client's value space given back"
        );
        assert!(
            eventually(|| reapers() <= before),
            "round {round}: the reaper ended"
        );
        assert_eq!(
            node.release_locks_of(LockOwner(owner)).unwrap(),
            0,
            "round {round}: a lock left"
        );
    }
}

/// 40 clients, one after the other, each posting unlocks (its reaper
/// started) — some failing — and dropped at once: no reaper thread
/// accumulates, and no lock is left.
#[test]
fn clients_made_and_dropped_in_a_loop_leave_no_reaper_thread() {
    let _one = serial();
    let before = reapers();
    let (node, pairs) = common::half_full_node();
    for i in 0..40u64 {
        let c = client(&node, 100, 143, 2000);
        let mut s = c.session().unwrap();
        let (k, _) = pairs[16 * (i % 50) as usize];
        if i % 3 == 0 {
            common::write_then_fail_its_unlock(&node, &mut s, k, i << 8 | 1);
        } else {
            s.update(k, i << 8 | 1).unwrap();
        }
        if i % 2 == 0 {
            drop(s);
            drop(c);
        } else {
            drop(c);
            drop(s);
        }
    }
    assert!(
        eventually(|| reapers() <= before),
        "{} reapers left of {before}",
        reapers()
    );
    assert_eq!(node.release_locks_of(LockOwner(143)).unwrap(), 0);
}

/// The memory node refuses every operation for a second while a failed
/// unlock of an idle client is maybe held: the reaper keeps trying at its
/// tick, not in a loop (its `CAS`es over that second are far fewer than
/// a spinning thread's), and releases the lock once the node is back —
/// without any session of the client running again, as another client's
/// writer of the chain sees.
#[test]
fn a_long_refusal_costs_the_reaper_a_look_per_tick_and_ends_in_a_release() {
    let _one = serial();
    let (node, pairs) = common::half_full_node();
    let a = client(&node, 300, 144, 2000);
    let b = client(&node, 300, 145, 20_000);
    let mut s = a.session().unwrap();
    let (k, _) = pairs[160];
    // The update's unlock is posted as it returns and lands 300 µs later;
    // the refusal must start first. A thread descheduled longer than that
    // (a loaded machine) lets it land, and nothing is recorded: then the
    // update goes again (a few reaper ticks tell).
    let mut last = 0;
    for v in 1..=20 {
        s.update(k, v).unwrap();
        last = v;
        assert!(node.engine().set_failed(true));
        let start = Instant::now();
        while a.locks_maybe_held() == 0 && start.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if a.locks_maybe_held() > 0 {
            break;
        }
        assert!(node.engine().set_failed(false));
    }
    assert!(a.locks_maybe_held() > 0, "recorded");
    let cas = a.engine().counters().total.cas;
    std::thread::sleep(Duration::from_secs(1));
    let tried = a.engine().counters().total.cas - cas;
    assert!(node.engine().set_failed(false));
    // 50 ms ticks: about 20 looks; a loop without its park would make
    // tens of thousands.
    assert!(tried <= 200, "{tried} CAS in a second of refusal");
    assert!(eventually(|| a.locks_maybe_held() == 0), "released");
    let mut t = b.session().unwrap();
    assert_eq!(t.update(k, 100).unwrap(), Some(last));
    t.flush().unwrap();
    drop(s);
    assert_eq!(node.release_locks_of(LockOwner(144)).unwrap(), 0);
    assert_eq!(node.release_locks_of(LockOwner(145)).unwrap(), 0);
}

/// Three live sessions of one client write and read 6 keys of 3 leaves
/// (unordered fabric, 150 µs of latency, 10 % of operations failing) while
/// a fourth session of the same client writes the same keys and goes idle
/// again and again with its unlock failed (the memory node refusing for
/// 2 ms), so the reaper releases locks of those chains while the live
/// sessions lock them. The history — every key read back at the end by a
/// client without faults — is linearizable; no lock is left once every
/// session flushed.
#[test]
fn the_reaper_races_live_sessions_of_its_client_on_the_same_chains() {
    use rolex_checker::{Clock, History, Recorder};
    let _one = serial();
    const OWNER: LockOwner = LockOwner(146);
    for seed in 1..=3u64 {
        let (node, loaded) = common::half_full_node();
        let (keys, initial) = common::two_keys_in_each_of_three_leaves(&loaded);
        let c = common::faulty_client(&node, (seed, 0, 0.10), OWNER, |faults| {
            engine(150, Some(faults), seed)
        });
        let clock = std::sync::Arc::new(Clock::new());
        let mut history = History::new(initial.iter().copied());
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4usize)
                .map(|t| {
                    let (c, clock, keys, node, stop) = (&c, clock.clone(), &keys, &node, &stop);
                    scope.spawn(move || {
                        let mut s = (0..1000)
                            .find_map(|_| c.session().ok())
                            .expect("a session under injected faults");
                        let mut rec = Recorder::new(t, clock);
                        let mut rng = StdRng::seed_from_u64(seed * 31 + t as u64);
                        let calls = if t == 3 { 15 } else { 60 };
                        for i in 0..calls {
                            let key = keys[rng.gen_range(0..keys.len())];
                            let value = (t as u64) << 32 | (i + 1);
                            let call = match (t, rng.gen_range(0..4)) {
                                (3, _) | (_, 2) => Call::Update { key, value },
                                (_, 0) => Call::Get { key },
                                (_, 1) => Call::Insert { key, value },
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
                                Err(e) => rec.error(op, e.may_have_applied()),
                            }
                            if t == 3 {
                                // Its unlock in flight fails; it stays
                                // idle for a few of the reaper's ticks.
                                node.engine().set_failed(true);
                                std::thread::sleep(Duration::from_millis(2));
                                node.engine().set_failed(false);
                                std::thread::sleep(Duration::from_millis(60));
                            }
                        }
                        if t == 3 {
                            stop.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                        for _ in 0..200 {
                            let _ = s.flush();
                            if c.locks_maybe_held() == 0 {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        rec.into_records()
                    })
                })
                .collect();
            for w in workers {
                history.extend(w.join().unwrap());
            }
        });
        assert!(stop.load(std::sync::atomic::Ordering::SeqCst));
        println!(
            "seed {seed}: {} locks released late",
            c.stats().locks_released_late
        );
        assert_eq!(c.locks_maybe_held(), 0, "seed {seed}: a lock maybe held");
        assert_eq!(
            node.release_locks_of(OWNER).unwrap(),
            0,
            "seed {seed}: a lock left"
        );
        let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut r = reader.session().unwrap();
        let mut rec = Recorder::new(9, clock);
        for &key in &keys {
            let op = rec.invoke(Call::Get { key });
            let got = r.get(key).unwrap();
            rec.finish(op, Ret::Value(got));
        }
        history.extend(rec.into_records());
        history
            .check()
            .unwrap_or_else(|v| panic!("seed {seed}: not linearizable: {v}"));
    }
}

/// Cluster clients: a cluster session writes keys on both memory nodes
/// and goes idle; its unlocks fail (both nodes refuse for 2 ms). Another
/// cluster client (another owner, as another process) writes the same
/// keys: each client's reaper releases its node's lock, so every write
/// goes through and no lock is left.
#[test]
fn cluster_clients_idle_with_failed_unlocks_hold_up_no_other_writer() {
    let _one = serial();
    let pairs = common::loaded(3000, 4);
    let connect = |owner: u16| {
        move |i: usize, node: &MemoryNode| {
            KvClient::connect(
                KvClientConfig {
                    engine: engine(300, None, u64::from(owner) * 10 + i as u64),
                    lock_owner: LockOwner(owner),
                    max_attempts: 20_000,
                    ..KvClientConfig::default()
                },
                &node.pool(),
            )
            .unwrap()
        }
    };
    let (mns, a) = common::cluster_with(&pairs, 2, connect(147));
    let b = {
        use rolex_host::kv::cluster::{ClusterClient, ClusterNode};
        let nodes = mns
            .iter()
            .enumerate()
            .map(|(i, n)| ClusterNode {
                name: format!("node-{i}"),
                client: connect(148)(i, n),
            })
            .collect();
        ClusterClient::new(a.map().clone(), nodes).unwrap()
    };
    let (lo, hi) = (pairs[100].0, pairs[2900].0);
    let mut s = a.session().unwrap();
    let mut t = b.session().unwrap();
    for round in 1..=5u64 {
        s.update(lo, round << 8 | 1).unwrap();
        s.update(hi, round << 8 | 1).unwrap();
        for n in &mns {
            assert!(n.engine().set_failed(true));
        }
        std::thread::sleep(Duration::from_millis(2));
        for n in &mns {
            assert!(n.engine().set_failed(false));
        }
        for k in [lo, hi] {
            assert_eq!(
                t.update(k, round << 8 | 2).unwrap(),
                Some(round << 8 | 1),
                "round {round}: {k}"
            );
        }
        t.flush().unwrap();
    }
    s.flush().unwrap();
    assert_eq!(a.locks_maybe_held() + b.locks_maybe_held(), 0);
    for n in &mns {
        for owner in [147, 148] {
            assert_eq!(n.release_locks_of(LockOwner(owner)).unwrap(), 0);
        }
    }
}

/// The last handle on a client — a session, the client handle gone first
/// — is dropped at once after its unlock failed, while the memory node
/// refuses operations: its drop records the lock as maybe held and hands
/// the client to its reaper, which releases the lock once the node is
/// back, then gives the client's value space back and ends. Before the
/// reaper adopted such a client, the lock was left for good and the space
/// lost (20 of 20 rounds).
#[test]
fn the_last_handle_dropped_at_once_after_a_failed_unlock_is_closed_by_the_reaper() {
    let _one = serial();
    let before = reapers();
    for round in 0..6u64 {
        let node = value_node(8 << 20);
        let c = client(&node, 300, 149, 2000);
        let mut s = c.session().unwrap();
        let last_is_client = round % 2 == 1;
        for k in 0..20u64 {
            assert!(s.put(k * 80, &value(k * 80, round)).unwrap());
        }
        s.flush().unwrap();
        put_then_refuse(&node, &mut s, 5000, round);
        std::thread::sleep(Duration::from_millis(1));
        if last_is_client {
            // The session settles (records) its failed unlock, then the
            // client handle goes last.
            drop(s);
            drop(c);
        } else {
            drop(c);
            drop(s);
        }
        std::thread::sleep(Duration::from_millis(60));
        assert!(node.engine().set_failed(false));
        assert!(
            eventually(|| common::free_word(&node) != 0),
            "round {round}: the client's value space given back"
        );
        assert!(
            eventually(|| reapers() <= before),
            "round {round}: the reaper ended"
        );
        assert_eq!(
            node.release_locks_of(LockOwner(149)).unwrap(),
            0,
            "round {round}: a lock left"
        );
    }
}
