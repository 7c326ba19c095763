//! Faults seen from compute nodes, injected with the loopback NIC's own
//! hook (`TransferEngine::set_failed` on the memory node: every operation
//! aimed at it fails, before it applies, while set):
//! - a split cut right after its new leaf was written (the NIC fails
//!   before the shrunk leaf goes out): every key is still found, by the
//!   same client once the NIC is back (it writes the shrunk leaf again,
//!   which may have landed in part, then releases its own lock: the
//!   insert took effect) and by a fresh one after the writer "died" and
//!   the memory node's reaper released its lock;
//! - a full SLT consumes no leaf, however often inserts retry it;
//! - histories with the NIC failing on and off, each error recorded as
//!   its `may_have_applied` says, stay linearizable, and no lock is left
//!   held at the end.
//!
//! Each test prints what it injected and what it found.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rolex_checker::{Call, Clock, History, Recorder, Ret};
use rolex_core::entry::{LockOwner, LtEntry};
use rolex_core::layout::{Leaf, LeafRegion, ModelRecord, Superblock};
use rolex_host::kv::{KvClient, KvClientConfig, KvError};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};
use rolex_host::{EngineConfig, Fabric, LoopbackConfig, Unordered};

/// The pool's superblock and leaf region, read from the memory node.
fn layout(node: &MemoryNode) -> (Superblock, LeafRegion) {
    let mut b = vec![0u8; Superblock::SIZE as usize];
    node.pool_handle().read(0, &mut b).unwrap();
    let sb = Superblock::read(&b).unwrap();
    let region = sb.leaf_region().unwrap();
    (sb, region)
}

fn alloc_num(node: &MemoryNode) -> u64 {
    let (_, region) = layout(node);
    node.pool_handle()
        .load_u64(region.alloc_num_offset())
        .unwrap()
}

/// The bytes of leaf `n` of the region.
fn leaf_bytes(node: &MemoryNode, n: u64) -> Vec<u8> {
    let (_, region) = layout(node);
    let off = region.leaf_offset(region.claim(n).unwrap()).unwrap();
    let mut b = vec![0u8; region.leaf_size() as usize];
    node.pool_handle().read(off, &mut b).unwrap();
    b
}

/// LT entries of the live models that are locked.
fn locks_held(node: &MemoryNode) -> u64 {
    let (sb, _) = layout(node);
    let mem = node.pool_handle();
    let mut rb = vec![0u8; ModelRecord::SIZE as usize];
    let mut n = 0;
    for m in 0..sb.model_count() {
        let at = mem.load_u64(sb.directory_entry_offset(m).unwrap()).unwrap();
        mem.read(at, &mut rb).unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        for j in 0..r.leaf_count() {
            let e = LtEntry::from_raw(mem.load_u64(r.lt_entry_offset(j).unwrap()).unwrap());
            n += u64::from(e.is_locked());
        }
    }
    n
}

fn unordered(seed: u64, latency: Duration) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            unordered: Some(Unordered {
                seed,
                window: 8,
                writes_in_order: false,
            }),
            latency,
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    }
}

/// The owner the writer's locks carry (as a lease would hand out).
const WRITER: LockOwner = LockOwner(9);

/// What one cut split left.
struct Cut {
    node: MemoryNode,
    writer: KvClient,
    session: rolex_host::kv::KvSession,
    keys: Vec<(u64, u64)>,
    err: KvError,
}

/// Fills the leaf of key 0 (3 keys, 4 slots) with a fast client, then
/// inserts a key that splits it through a slow unordered client (100 ms a
/// round trip) while a watcher fails the memory node's NIC as soon as the
/// new leaf `B` is whole in the pool — long before the batch that would
/// shrink the old leaf arrives. Returns `None` if the watcher was late
/// (the shrunk leaf landed first): the caller tries again.
fn cut_a_split(seed: u64) -> Option<Cut> {
    let pairs: Vec<(u64, u64)> = (0..30u64).map(|i| (i * 10, i)).collect();
    let node = common::small_kv_node(&pairs);
    let fast = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut keys = pairs.clone();
    fast.session().unwrap().insert(1, 1).unwrap();
    keys.push((1, 1));
    keys.sort();
    let writer = KvClient::connect(
        KvClientConfig {
            engine: unordered(seed, Duration::from_millis(100)),
            lock_owner: WRITER,
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap();
    let mut session = writer.session().unwrap();
    let x_before = leaf_bytes(&node, 0);
    let b_no = alloc_num(&node);
    let done = AtomicBool::new(false);
    let (_, region) = layout(&node);
    let b_off = region.leaf_offset(region.claim(b_no).unwrap()).unwrap();
    let (saw_b, err) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut b = vec![0u8; region.leaf_size() as usize];
            let deadline = Instant::now() + common::HANG;
            while !done.load(SeqCst) && Instant::now() < deadline {
                node.pool_handle().read(b_off, &mut b).unwrap();
                if Leaf::from_bytes(&b).is_ok_and(|l| l.validate().is_ok()) {
                    assert!(node.engine().set_failed(true));
                    return true;
                }
                std::thread::yield_now();
            }
            false
        });
        let err = session.insert(2, 2).expect_err("the NIC failed mid-split");
        done.store(true, SeqCst);
        (watcher.join().unwrap(), err)
    });
    assert!(saw_b, "the watcher saw the new leaf");
    let x_after = leaf_bytes(&node, 0);
    let b = leaf_bytes(&node, b_no);
    let (x, bl) = (
        Leaf::from_bytes(&x_after).unwrap(),
        Leaf::from_bytes(&b).unwrap(),
    );
    eprintln!(
        "seed {seed}: injected: NIC failed once B (leaf {b_no}, [{}, {}]) was whole; \
         found: X [{}, {}] next {:?}, error: {err}",
        bl.fence_lo(),
        bl.fence_hi(),
        x.fence_lo(),
        x.fence_hi(),
        x.next().raw()
    );
    assert!(bl.validate().is_ok(), "B is whole");
    if x_after != x_before {
        node.engine().set_failed(false);
        eprintln!("seed {seed}: the shrunk leaf landed before the NIC failed; again");
        return None;
    }
    Some(Cut {
        node,
        writer,
        session,
        keys,
        err,
    })
}

fn cut() -> Cut {
    (1..=5)
        .find_map(cut_a_split)
        .expect("the watcher failed the NIC in time once in 5 tries")
}

fn every_key_found(client: &KvClient, keys: &[(u64, u64)]) {
    let mut s = client.session().unwrap();
    for &(k, v) in keys {
        assert_eq!(s.get(k).unwrap(), Some(v), "key {k}");
    }
    assert_eq!(s.range(0, u64::MAX).unwrap(), keys);
}

#[test]
fn a_split_cut_after_its_new_leaf_loses_no_key_and_its_writer_releases_the_lock() {
    let Cut {
        node,
        writer,
        mut session,
        keys,
        err,
    } = cut();
    // A' was never written: B is unreachable so far, but the error cannot
    // know whether A' landed, in part or whole.
    assert!(err.may_have_applied(), "{err}");
    // Still failed: nothing lands; the lock stays recorded, kept until A'
    // is written again whole.
    session.flush().unwrap();
    assert_eq!(writer.locks_maybe_held(), 1);
    assert_eq!(locks_held(&node), 1);
    node.engine().set_failed(false);
    // Readers find every key with the lock still held.
    let reader = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    every_key_found(&reader, &keys);
    // The writer writes A' and releases the lock: the split, and the
    // insert, took effect.
    session.flush().unwrap();
    assert_eq!(writer.locks_maybe_held(), 0);
    assert_eq!(writer.stats().locks_released_late, 1);
    assert_eq!(locks_held(&node), 0);
    eprintln!("the writer finished its split and released its lock once the NIC was back");
    let mut keys = keys;
    keys.push((2, 2));
    keys.sort();
    every_key_found(&reader, &keys);
    assert_eq!(session.insert(2, 3).unwrap(), Some(2));
    keys.retain(|&(k, _)| k != 2);
    keys.push((2, 3));
    keys.sort();
    every_key_found(&reader, &keys);
    // The insert's unlock may still be in flight (unordered fabric): wait
    // for it, or the freeze below may meet it past its deadline.
    session.flush().unwrap();
    node.retrain_now(0).unwrap();
    every_key_found(&reader, &keys);
}

#[test]
fn a_split_cut_after_its_new_leaf_loses_no_key_when_its_writer_dies() {
    let Cut {
        node,
        writer,
        session,
        keys,
        ..
    } = cut();
    // The writer dies: its unlock never lands, its process state is gone.
    drop(session);
    drop(writer);
    node.engine().set_failed(false);
    assert_eq!(locks_held(&node), 1);
    // Its lease ends: the memory node's reaper releases its lock.
    assert_eq!(node.release_locks_of(WRITER).unwrap(), 1);
    assert_eq!(locks_held(&node), 0);
    let next = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    every_key_found(&next, &keys);
    // The chain takes writes again; the agent's walk accepts it.
    let mut s = next.session().unwrap();
    let mut keys = keys;
    for k in [2, 3, 4, 5, 6] {
        assert_eq!(s.insert(k, k).unwrap(), None);
        keys.push((k, k));
    }
    keys.sort();
    every_key_found(&next, &keys);
    s.flush().unwrap();
    node.retrain_now(0).unwrap();
    every_key_found(&next, &keys);
    eprintln!(
        "found all {} keys after the reaper and a retraining",
        keys.len()
    );
}

/// Inserts into one model until its SLT is full, then 20 more.
fn full_slt(engine: EngineConfig) {
    // One model whose chains take every insert; no retraining.
    let pairs: Vec<(u64, u64)> = (0..4u64).map(|i| (i << 32, i)).collect();
    let node = MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 4,
            retrain_trigger: 10_000,
            retraining_thread: false,
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    let client = KvClient::connect(
        KvClientConfig {
            engine,
            slt_full_wait: Duration::from_millis(20),
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap();
    let mut s = client.session().unwrap();
    let mut k = 1u64;
    let err = loop {
        match s.insert(k, k) {
            Ok(_) => k += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, KvError::SltFull { .. }), "{err}");
    let loaded = node.stats().leaves_loaded;
    let synonyms = client.stats().synonym_leaves;
    assert_eq!(
        alloc_num(&node),
        loaded + synonyms,
        "every leaf drawn is in use"
    );
    let before = alloc_num(&node);
    let claims_before = client.stats().op(rolex_host::kv::KvOp::Insert).atomics;
    for i in 0..20 {
        let e = s.insert(k + i, 0).unwrap_err();
        assert!(matches!(e, KvError::SltFull { .. }) && !e.may_have_applied());
    }
    let claims = client.stats().op(rolex_host::kv::KvOp::Insert).atomics - claims_before;
    eprintln!(
        "20 inserts into a full SLT ({claims} atomics, claims and give-backs): \
         alloc_num {before} -> {}",
        alloc_num(&node)
    );
    assert!(claims > 40, "the inserts kept claiming");
    assert_eq!(alloc_num(&node), before, "a full SLT consumed leaves");
    assert_eq!(s.get(k).unwrap(), None);
    // Each of those released its lock before it locked again: a lock
    // whose fate is unknown on that chain is released by the next flush.
    node.engine().set_failed(true);
    let e = s.insert(k, 0).unwrap_err();
    node.engine().set_failed(false);
    assert!(e.lock_may_be_held() && !e.may_have_applied(), "{e}");
    s.flush().unwrap();
    assert_eq!(client.locks_maybe_held(), 0);
    assert_eq!(locks_held(&node), 0);
}

#[test]
fn a_full_slt_consumes_no_leaf_on_an_ordered_fabric() {
    full_slt(EngineConfig::default());
}

#[test]
fn a_full_slt_consumes_no_leaf_on_an_unordered_fabric() {
    full_slt(unordered(5, Duration::ZERO));
}

/// One history on a fabric that fails on and off (see the module docs).
fn flaky_history(unordered_fabric: bool, seed: u64) {
    let pairs: Vec<(u64, u64)> = (0..12u64).map(|i| (i * 2 * 1000, i)).collect();
    let node = common::churning_node(&pairs);
    let engine = if unordered_fabric {
        unordered(seed, Duration::ZERO)
    } else {
        EngineConfig::default()
    };
    let cfg = KvClientConfig {
        engine,
        lock_owner: WRITER,
        max_attempts: 2000,
        ..KvClientConfig::default()
    };
    let clients = [
        KvClient::connect(cfg.clone(), &node.pool()).unwrap(),
        KvClient::connect(cfg, &node.pool()).unwrap(),
    ];
    let clock = Arc::new(Clock::new());
    let stop = AtomicBool::new(false);
    let (failed_windows, errors, maybe) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let mut history = History::new(pairs.iter().copied());
    std::thread::scope(|scope| {
        // Stops the retrainer also when a worker's panic unwinds the scope.
        let _stop = common::StopOnDrop(&stop);
        // A bounded number of retrainings: the test is about faults, not
        // about how long the model region lasts (see kv_records).
        let retrainer = scope.spawn(|| {
            let mut n = 0u64;
            // Until the run ends, and at least once: a lock a failure left
            // maybe held can hold every freeze off until the run is over.
            while (!stop.load(SeqCst) || n == 0) && n < 100 {
                for m in 0..node.model_count() {
                    if common::retrain_unless_busy(&node, m) {
                        n += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            n
        });
        let workers: Vec<_> = (0..4usize)
            .map(|t| {
                let client = clients[t % 2].clone();
                let (clock, errors, maybe) = (clock.clone(), &errors, &maybe);
                let (node, failed_windows) = (&node, &failed_windows);
                scope.spawn(move || {
                    let mut s = client.session().unwrap();
                    let mut rec = Recorder::new(t, clock);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 31 + t as u64);
                    for i in 0..500u64 {
                        let key = rng.gen_range(0..24u64) * 1000;
                        let value = (t as u64) << 32 | i;
                        // Worker 0 fails the NIC now and then for one of its
                        // operations (which fails at its first transfer)
                        // and a random spin before it, during which the
                        // others' operations fail wherever they are.
                        let window = t == 0 && rng.gen_range(0..25) == 0;
                        if window {
                            node.engine().set_failed(true);
                            failed_windows.fetch_add(1, SeqCst);
                            let until =
                                Instant::now() + Duration::from_micros(rng.gen_range(1..50));
                            while Instant::now() < until {
                                std::hint::spin_loop();
                            }
                        }
                        let (call, r) = match rng.gen_range(0..10) {
                            0..=2 => {
                                let call = Call::Get { key };
                                let op = rec.invoke(call);
                                (op, s.get(key).map(Ret::Value))
                            }
                            3..=4 => {
                                let op = rec.invoke(Call::Insert { key, value });
                                (op, s.insert(key, value).map(Ret::Prior))
                            }
                            5..=6 => {
                                let op = rec.invoke(Call::Update { key, value });
                                (op, s.update(key, value).map(Ret::Prior))
                            }
                            7..=8 => {
                                let op = rec.invoke(Call::Delete { key });
                                (op, s.delete(key).map(Ret::Prior))
                            }
                            _ => {
                                let n = rng.gen_range(1..6);
                                let op = rec.invoke(Call::Scan { from: key, n });
                                (op, s.scan(key, n).map(Ret::Entries))
                            }
                        };
                        if window {
                            node.engine().set_failed(false);
                        }
                        match r {
                            Ok(ret) => rec.finish(call, ret),
                            Err(e) => {
                                errors.fetch_add(1, SeqCst);
                                maybe.fetch_add(u64::from(e.may_have_applied()), SeqCst);
                                rec.error(call, e.may_have_applied());
                            }
                        }
                    }
                    rec.into_records()
                })
            })
            .collect();
        for w in workers {
            history.extend(w.join().unwrap());
        }
        // Every worker's session is gone: a flush releases whatever is
        // still recorded (a retraining may be waiting for it).
        for c in &clients {
            c.session().unwrap().flush().unwrap();
            assert_eq!(c.locks_maybe_held(), 0, "a lock stayed maybe held");
        }
        stop.store(true, SeqCst);
        assert!(retrainer.join().unwrap() > 0);
    });
    // The node's own retraining thread may be inside a freeze (its
    // entries locked by the agent) right now: wait until it is out of its
    // step (a hang guard, not a timing assertion); a lock left behind by
    // anyone stays, and fails the test.
    let activity = node.activity();
    let start = Instant::now();
    while (activity.busy() || locks_held(&node) != 0) && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(locks_held(&node), 0, "a chain stayed locked");
    let checked = history
        .check()
        .unwrap_or_else(|v| panic!("not linearizable: {v}"));
    let late: u64 = clients.iter().map(|c| c.stats().locks_released_late).sum();
    eprintln!(
        "{} seed {seed}: injected {} failure windows; found {} errors ({} may have applied), \
         {late} locks released late, {} ops checked, {} retrains",
        if unordered_fabric {
            "unordered"
        } else {
            "ordered"
        },
        failed_windows.load(SeqCst),
        errors.load(SeqCst),
        maybe.load(SeqCst),
        checked.single_ops + checked.scans,
        node.stats().agent.retrains,
    );
    assert_eq!(checked.single_ops + checked.scans, 2000);
    // Worker 0's own operation fails in each window.
    assert!(errors.load(SeqCst) >= failed_windows.load(SeqCst));
    assert!(failed_windows.load(SeqCst) > 0);
    assert!(node.last_agent_error().is_none());
}

#[test]
fn histories_with_a_flaky_nic_are_linearizable_on_an_ordered_fabric() {
    for seed in 1..=3 {
        flaky_history(false, seed);
    }
}

#[test]
fn histories_with_a_flaky_nic_are_linearizable_on_an_unordered_fabric() {
    for seed in 1..=3 {
        flaky_history(true, seed);
    }
}
