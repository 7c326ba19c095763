//! Adversarial runs of the retraining agent beside concurrent writers:
//! tiny leaves and tiny models, so that every few writes split a leaf,
//! every retraining merges thin or emptied leaves away and every few
//! retrainings cut a model, while the agent's own thread and a second
//! retrainer step as fast as they can. Histories of byte values (8 to
//! 300 bytes, in line and out of line) are checked linearizable, final
//! values included; a store emptied and refilled again and again must
//! come back to the same space; freezes that meet writers holding their
//! locks for milliseconds must thaw cleanly; keys at both ends of `u64`
//! must survive cuts and merges.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rolex_checker::{Call, Clock, History, Recorder, Ret};
use rolex_host::kv::{KvClient, KvClientConfig, KvSession};
use rolex_host::memnode::{AgentError, MemoryNode, MemoryNodeConfig, MemoryNodeError};

/// Grace period of retired records and freed leaves in these tests; the
/// clients refresh views older than [`MAX_AGE`], well within it.
const GRACE: Duration = Duration::from_millis(20);
const MAX_AGE: Duration = Duration::from_millis(5);

/// Leaves of 4 slots loaded half full, models of at most 8 leaves (cut
/// past 16), retrained at 2 SLT slots, with room for many records and
/// leaves.
fn tiny_config(thread: bool) -> MemoryNodeConfig {
    common::tiny_churn_config(thread, GRACE)
}

/// The length of value `id` of `key`: 8 to 300 bytes (in line at 8).
fn value_len(key: u64, id: u64) -> usize {
    let x = (key ^ id.wrapping_mul(0x9e37_79b9)) % 293;
    if x % 4 == 0 {
        8
    } else {
        8 + x as usize
    }
}

/// The bytes of value `id` of `key`.
fn value(key: u64, id: u64) -> Vec<u8> {
    common::id_value(key, id, value_len(key, id))
}

/// The id of the bytes a read returned for `key`; a value no write made
/// (torn, or another key's) fails the test.
fn id_of(key: u64, bytes: &[u8]) -> u64 {
    common::value_id(key, bytes)
        .unwrap_or_else(|| panic!("key {key}: {} bytes no write made", bytes.len()))
}

/// A node of [`tiny_config`] (with `cfg` applied) holding `pairs` as byte
/// values.
fn byte_node(
    pairs: &[(u64, u64)],
    thread: bool,
    cfg: impl FnOnce(&mut MemoryNodeConfig),
) -> MemoryNode {
    let mut c = tiny_config(thread);
    cfg(&mut c);
    MemoryNode::start_with_values(c, pairs, &mut |k, id, out| {
        out.extend_from_slice(&value(k, id))
    })
    .expect("a tiny memory node")
}

/// A client of `node`: ordered loopback, or unordered with `seed`'s
/// shuffle; `latency` of modelled latency either way.
fn client(node: &MemoryNode, unordered: Option<u64>, latency: Duration) -> KvClient {
    common::loopback_client(node, unordered, latency, MAX_AGE)
}

/// One random byte-value operation on `key` (value id `id`), recorded:
/// get, put, update, remove, scan, range by the weights `w`.
fn byte_op(
    s: &mut KvSession,
    rec: &mut Recorder,
    rng: &mut StdRng,
    (key, id): (u64, u64),
    w: [u32; 6],
) {
    let mut x = rng.gen_range(0..w.iter().sum::<u32>());
    let mut pick = 0;
    while x >= w[pick] {
        x -= w[pick];
        pick += 1;
    }
    let ids = |v: Vec<(u64, Vec<u8>)>| -> Vec<(u64, u64)> {
        v.into_iter().map(|(k, b)| (k, id_of(k, &b))).collect()
    };
    match pick {
        0 => {
            let op = rec.invoke(Call::Get { key });
            let r = s.get_value(key).unwrap().map(|b| id_of(key, &b));
            rec.finish(op, Ret::Value(r));
        }
        1 => {
            let op = rec.invoke(Call::Insert { key, value: id });
            let present = s.put(key, &value(key, id)).unwrap();
            rec.finish(op, Ret::Applied(!present));
        }
        2 => {
            let op = rec.invoke(Call::Update { key, value: id });
            let present = s.update_value(key, &value(key, id)).unwrap();
            rec.finish(op, Ret::Applied(present));
        }
        3 => {
            let op = rec.invoke(Call::Delete { key });
            let present = s.remove(key).unwrap();
            rec.finish(op, Ret::Applied(present));
        }
        4 => {
            let n = rng.gen_range(1..10);
            let op = rec.invoke(Call::Scan { from: key, n });
            let r = ids(s.scan_values(key, n).unwrap());
            rec.finish(op, Ret::Entries(r));
        }
        _ => {
            let hi = key.saturating_add(rng.gen_range(0..8u64) * 1000);
            let op = rec.invoke(Call::Range { lo: key, hi });
            let r = ids(s.range_values(key, hi).unwrap());
            rec.finish(op, Ret::Entries(r));
        }
    }
}

/// LT entries locked in the live records of `node` (through its
/// directory): after a quiet period, none may be.
fn locked_entries(node: &MemoryNode) -> u64 {
    use rolex_core::entry::LtEntry;
    use rolex_core::layout::{ModelRecord, Superblock};
    let mh = node.pool_handle();
    let sb = Superblock::read(&mh.to_vec(0, Superblock::SIZE as usize).unwrap()).unwrap();
    let mut n = 0;
    for m in 0..sb.model_count() {
        let at = mh.load_u64(sb.directory_entry_offset(m).unwrap()).unwrap();
        if at == 0 {
            continue;
        }
        let r = ModelRecord::read(&mh.to_vec(at, ModelRecord::SIZE as usize).unwrap()).unwrap();
        for j in 0..r.leaf_count() {
            let e = LtEntry::from_raw(mh.load_u64(r.lt_entry_offset(j).unwrap()).unwrap());
            n += u64::from(e.is_locked());
        }
    }
    n
}

/// What a retrainer thread did.
#[derive(Debug, Default)]
struct Retrained {
    retrains: u64,
    deadlines: u64,
}

/// Retrains every model of `node` again and again, and runs agent steps
/// between, until `stop`, with `gap` between passes; a freeze past its deadline is counted, any
/// other error fails the test.
fn retrainer(node: &MemoryNode, stop: &AtomicBool, passes: &AtomicU64, gap: Duration) -> Retrained {
    let mut done = Retrained::default();
    while !stop.load(SeqCst) {
        for m in 0..node.model_count() {
            match node.retrain_now(m) {
                Ok(_) => done.retrains += 1,
                Err(MemoryNodeError::Agent(AgentError::FreezeDeadline { .. })) => {
                    done.deadlines += 1
                }
                Err(e) => panic!("retraining model {m}: {e}"),
            }
            match node.poll_once() {
                Ok(_) | Err(MemoryNodeError::Agent(AgentError::FreezeDeadline { .. })) => {}
                Err(e) => panic!("an agent step: {e}"),
            }
        }
        passes.fetch_add(1, SeqCst);
        // A zero gap (passes back to back, faster than a compute node's
        // round trips) is what the churn tests run: model fetches and gets
        // no longer starve at that pace (see
        // `a_model_retrained_faster_than_a_fetch_still_gets_fetched`).
        std::thread::sleep(gap);
    }
    done
}

/// Waits (a hang guard, not a timing bound) for a retraining pass that
/// started after this call.
fn wait_for_pass(passes: &AtomicU64) {
    let seen = passes.load(SeqCst);
    let start = std::time::Instant::now();
    while passes.load(SeqCst) < seen + 2 {
        assert!(start.elapsed() < Duration::from_secs(120), "no retraining");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Four threads over `clients` run `ops` byte operations each over
/// `keys` keys (`0, 1000, …`) while a retrainer retrains every model
/// again and again, `gap` between passes (each thread waits for a fresh
/// pass twice); then a
/// fresh client reads every key back into the history, which must be
/// linearizable. Returns the retrainer's counts.
fn byte_history(
    node: &MemoryNode,
    clients: &[KvClient],
    initial: &[(u64, u64)],
    (keys, ops, seed): (u64, u64, u64),
    (w, gap): ([u32; 6], Duration),
) -> Retrained {
    let clock = Arc::new(Clock::new());
    let stop = AtomicBool::new(false);
    let passes = AtomicU64::new(0);
    let mut history = History::new(initial.iter().copied());
    let done = std::thread::scope(|scope| {
        let r = scope.spawn(|| retrainer(node, &stop, &passes, gap));
        // Stops the retrainer also when a worker's panic unwinds the scope.
        let _stop = common::StopOnDrop(&stop);
        let workers: Vec<_> = (0..4usize)
            .map(|t| {
                let client = clients[t % clients.len()].clone();
                let (clock, passes) = (clock.clone(), &passes);
                scope.spawn(move || {
                    let mut s = client.session().unwrap();
                    let mut rec = Recorder::new(t, clock);
                    let mut rng = StdRng::seed_from_u64(seed * 31 + t as u64);
                    for i in 0..ops {
                        if i == ops / 3 || i == 2 * ops / 3 {
                            wait_for_pass(passes);
                        }
                        let key = rng.gen_range(0..keys) * 1000;
                        let id = (t as u64) << 32 | (i + 1);
                        byte_op(&mut s, &mut rec, &mut rng, (key, id), w);
                    }
                    s.flush().unwrap();
                    rec.into_records()
                })
            })
            .collect();
        for w in workers {
            history.extend(w.join().unwrap());
        }
        stop.store(true, SeqCst);
        r.join().unwrap()
    });
    let fresh = client(node, None, Duration::ZERO);
    let mut s = fresh.session().unwrap();
    let mut rec = Recorder::new(4, clock);
    for k in 0..keys {
        let key = k * 1000;
        let op = rec.invoke(Call::Get { key });
        let got = s.get_value(key).unwrap().map(|b| id_of(key, &b));
        rec.finish(op, Ret::Value(got));
    }
    history.extend(rec.into_records());
    history
        .check()
        .unwrap_or_else(|v| panic!("seed {seed}: not linearizable: {v}"));
    done
}

fn churn(unordered: bool, latency: Duration, seed: u64) {
    // One model at load; the inserts grow it past 16 leaves again and again.
    let pairs: Vec<(u64, u64)> = (0..16u64).map(|i| (i * 18 * 1000, 1000 + i)).collect();
    let node = byte_node(&pairs, true, |_| {});
    let clients = [
        client(&node, unordered.then_some(seed), latency),
        client(&node, unordered.then_some(seed + 100), latency),
    ];
    let done = byte_history(
        &node,
        &clients,
        &pairs,
        (300, 400, seed),
        // Passes back to back: writers meet frozen and retired records
        // all the time, and refresh to records retired under their fetch.
        ([3, 4, 2, 4, 1, 1], Duration::ZERO),
    );
    let st = node.stats();
    eprintln!(
        "seed {seed}: {done:?}; agent retrains {} cut {} leaves freed {} stashed {}, models {}",
        st.agent.retrains,
        st.agent.models_cut,
        st.agent.leaves_freed,
        st.agent.leaves_stashed,
        st.models
    );
    assert!(done.retrains > 0);
    assert!(
        node.last_agent_error().is_none(),
        "{:?}",
        node.last_agent_error()
    );
    assert_eq!(locked_entries(&node), 0, "a chain left locked");
}

#[test]
fn byte_histories_under_constant_cuts_and_merges_ordered() {
    for seed in 1..=2 {
        churn(false, Duration::ZERO, seed);
    }
}

#[test]
fn byte_histories_under_constant_cuts_and_merges_unordered_with_latency() {
    for seed in 3..=4 {
        churn(true, Duration::from_micros(30), seed);
    }
}

/// Keys of [`refill`]: 600 keys, 4 threads each owning those `≡ t (mod 4)`.
const REFILL_KEYS: u64 = 600;

/// Retrains every model, waiting out freezes that met a lock and record
/// regions full of records retired too recently.
fn retrain_all(node: &MemoryNode) {
    common::retrain_all(node, GRACE);
}

#[test]
fn emptying_and_refilling_again_and_again_comes_back_to_the_same_space() {
    let node = byte_node(&[], true, |_| {});
    let clients = [
        client(&node, None, Duration::ZERO),
        client(&node, Some(9), Duration::from_micros(10)),
    ];
    let mut full = Vec::new();
    let mut empty = Vec::new();
    for round in 0..6u64 {
        // Fill: four threads insert their keys (byte values), then check
        // them all.
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let c = clients[(t % 2) as usize].clone();
                scope.spawn(move || {
                    let mut s = c.session().unwrap();
                    for k in (t..REFILL_KEYS).step_by(4) {
                        let key = k * 7919;
                        assert!(!s.put(key, &value(key, round)).unwrap(), "key {key}");
                    }
                    s.flush().unwrap();
                });
            }
        });
        let mut s = clients[0].session().unwrap();
        let got = s.range_values(0, u64::MAX).unwrap();
        assert_eq!(got.len() as u64, REFILL_KEYS, "round {round}");
        for (k, b) in got {
            assert_eq!(id_of(k, &b), round);
        }
        retrain_all(&node);
        full.push(node.stats());
        // Empty: the same threads remove every key.
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let c = clients[(t % 2) as usize].clone();
                scope.spawn(move || {
                    let mut s = c.session().unwrap();
                    for k in (t..REFILL_KEYS).step_by(4) {
                        assert!(s.remove(k * 7919).unwrap(), "key {}", k * 7919);
                    }
                    s.flush().unwrap();
                });
            }
        });
        assert_eq!(s.range_values(0, u64::MAX).unwrap(), vec![]);
        // Merges drop the emptied leaves; after the grace period they are
        // free for the next round's splits.
        retrain_all(&node);
        std::thread::sleep(GRACE * 2);
        retrain_all(&node);
        empty.push(node.stats());
        assert_eq!(
            locked_entries(&node),
            0,
            "round {round}: a chain left locked"
        );
    }
    for (i, (f, e)) in full.iter().zip(&empty).enumerate() {
        eprintln!(
            "round {i}: full: models {} live {} free {} alloc {} bytes {} values {}; empty: models {} live {} free {} alloc {} bytes {} values {}",
            f.models, f.leaves_live, f.leaves_free, f.leaves_allocated, f.pool_bytes_used, f.value_bytes,
            e.models, e.leaves_live, e.leaves_free, e.leaves_allocated, e.pool_bytes_used, e.value_bytes
        );
    }
    assert!(
        node.last_agent_error().is_none(),
        "{:?}",
        node.last_agent_error()
    );
    // Live leaves and pool bytes in use come back to round 1's figures.
    // Allocated leaves (`alloc_num`) used to creep up here (215 at round 0,
    // 329 at round 9, 410 at round 29 in one run) until stashes were
    // sized by each model's demand (session 14; `kv_leaf_reuse` checks
    // the agent's stated bound every round): this bound only catches a
    // leak of every round's leaves, which would double them within two
    // rounds.
    let (f1, e1) = (full[1], empty[1]);
    for (i, (f, e)) in full.iter().zip(&empty).enumerate().skip(2) {
        assert!(
            f.leaves_allocated <= f1.leaves_allocated * 2,
            "round {i}: leaves allocated {} after round 1's {}",
            f.leaves_allocated,
            f1.leaves_allocated
        );
        assert!(
            f.leaves_live <= f1.leaves_live * 5 / 4,
            "round {i}: {} leaves live when full (round 1: {})",
            f.leaves_live,
            f1.leaves_live
        );
        assert!(
            e.leaves_live <= e1.leaves_live.max(e.models * 2),
            "round {i}: {} leaves live in an empty store ({} after round 1)",
            e.leaves_live,
            e1.leaves_live
        );
        // Leaves and records; value chunks are claimed per client and
        // size class as the schedule has it, bounded below.
        let (used, used1) = (
            e.pool_bytes_used - e.value_bytes,
            e1.pool_bytes_used - e1.value_bytes,
        );
        assert!(
            used <= used1 * 5 / 4,
            "round {i}: pool bytes in leaves and records {used} when empty (round 1: {used1})"
        );
        assert!(
            e.value_bytes <= e1.value_bytes + (4 << 20),
            "round {i}: value bytes {} after round 1's {}",
            e.value_bytes,
            e1.value_bytes
        );
    }
}

#[test]
fn freezes_that_meet_locks_held_for_milliseconds_thaw_cleanly() {
    let pairs: Vec<(u64, u64)> = (0..32u64).map(|i| (i * 2 * 1000, 1000 + i)).collect();
    // Writers hold each lock for a few round trips of 2 ms; the freeze
    // gives up after 1 ms, so most freezes that meet a writer thaw.
    let node = byte_node(&pairs, true, |c| {
        c.freeze_deadline = Duration::from_millis(1)
    });
    let latency = Duration::from_millis(2);
    let clients = [
        client(&node, None, latency),
        client(&node, Some(5), latency),
    ];
    let done = byte_history(
        &node,
        &clients,
        &pairs,
        (64, 60, 7),
        ([2, 4, 2, 3, 1, 0], Duration::from_millis(10)),
    );
    let st = node.stats();
    eprintln!(
        "{done:?}; freeze timeouts {}, agent retrains {}",
        st.agent.freeze_timeouts, st.agent.retrains
    );
    assert!(done.deadlines > 0, "no freeze met a writer's lock");
    assert!(done.retrains > 0);
    assert!(
        node.last_agent_error().is_none(),
        "{:?}",
        node.last_agent_error()
    );
    assert_eq!(locked_entries(&node), 0, "a thaw left a chain locked");
    // With the writers gone every model retrains at once.
    for m in 0..node.model_count() {
        node.retrain_now(m).unwrap();
    }
}

/// Keys at both ends of `u64` and dense runs: 0..200, around 2^63, and
/// `u64::MAX - 199 ..= u64::MAX`.
fn extreme_keys() -> Vec<u64> {
    let mut keys: Vec<u64> = (0..200).collect();
    keys.extend((0..200).map(|i| (1u64 << 63) - 100 + i));
    keys.extend((0..200).map(|i| u64::MAX - i));
    keys.sort_unstable();
    keys
}

#[test]
fn keys_at_the_ends_of_u64_survive_cuts_and_merges() {
    let keys = extreme_keys();
    // Loaded: the ends only.
    let pairs: Vec<(u64, u64)> = [0u64, 1, u64::MAX - 1, u64::MAX]
        .iter()
        .map(|&k| (k, 1))
        .collect();
    let node = byte_node(&pairs, true, |_| {});
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let c = client(&node, Some(3), Duration::from_micros(5));
    let mut s = c.session().unwrap();
    let mut rng = StdRng::seed_from_u64(17);
    let check = |s: &mut KvSession, model: &BTreeMap<u64, u64>, at: &str| {
        let got: Vec<(u64, u64)> = s
            .range_values(0, u64::MAX)
            .unwrap()
            .into_iter()
            .map(|(k, b)| (k, id_of(k, &b)))
            .collect();
        let want: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
        assert_eq!(got, want, "{at}");
        let tail: Vec<(u64, u64)> = model.range(u64::MAX - 3..).map(|(&k, &v)| (k, v)).collect();
        let got: Vec<(u64, u64)> = s
            .scan_values(u64::MAX - 3, 10)
            .unwrap()
            .into_iter()
            .map(|(k, b)| (k, id_of(k, &b)))
            .collect();
        assert_eq!(got, tail, "{at}: scan at the top");
        for &k in [0, 1, 199, u64::MAX - 1, u64::MAX].iter() {
            assert_eq!(
                s.get_value(k).unwrap().map(|b| id_of(k, &b)),
                model.get(&k).copied(),
                "{at}: key {k}"
            );
        }
    };
    for round in 0..4u64 {
        // Fill every key in random order, retraining now and then.
        let mut order = keys.clone();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        for (i, &k) in order.iter().enumerate() {
            let id = (round << 32) | (i as u64 + 2);
            assert_eq!(
                s.put(k, &value(k, id)).unwrap(),
                model.insert(k, id).is_some(),
                "put {k}"
            );
            if i % 60 == 59 {
                retrain_all(&node);
            }
        }
        retrain_all(&node);
        check(&mut s, &model, &format!("round {round}, full"));
        // Delete all but a few, in random order: leaves merge away.
        for (i, &k) in order.iter().enumerate() {
            if k % 50 != 0 {
                assert_eq!(
                    s.remove(k).unwrap(),
                    model.remove(&k).is_some(),
                    "remove {k}"
                );
            }
            if i % 60 == 59 {
                retrain_all(&node);
            }
        }
        retrain_all(&node);
        check(&mut s, &model, &format!("round {round}, thinned"));
    }
    let st = node.stats();
    eprintln!(
        "models {} cut {} refused {}, leaves freed {}",
        st.models, st.agent.models_cut, st.agent.cuts_refused, st.agent.leaves_freed
    );
    assert!(st.agent.models_cut > 0, "no model was cut");
    assert!(st.agent.leaves_freed > 0, "no leaf merged away");
    assert!(
        node.last_agent_error().is_none(),
        "{:?}",
        node.last_agent_error()
    );
    assert_eq!(locked_entries(&node), 0);
}

/// A model retrained more often than a compute node's model fetch takes
/// (two or three round trips: the directory word, then the record) is still
/// fetched, and gets through it still answer. Before the fix each try of the
/// fetch found the record it read retired and went back to the directory,
/// and after 1000 tries it reported `KvError::Inconsistent` ("the directory
/// keeps naming a retired or reused record") although the pool was sound:
/// `connect` or a get failed in 4 of 6 runs (see /work/notes/agentteam.md,
/// finding A). Now a fetch uses a record retired under it while the try
/// took less than `model_max_age`, and a get answers through such a view
/// while it is that young (`rolex_kv` `fetch_model` says why both are safe).
#[test]
fn a_model_retrained_faster_than_a_fetch_still_gets_fetched() {
    let pairs: Vec<(u64, u64)> = (0..16u64).map(|i| (i * 1000, 1000 + i)).collect();
    let node = byte_node(&pairs, false, |_| {});
    let stop = AtomicBool::new(false);
    let retrains = AtomicU64::new(0);
    let failed = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(SeqCst) {
                node.retrain_now(0).unwrap();
                retrains.fetch_add(1, SeqCst);
                std::thread::sleep(Duration::from_micros(100));
            }
        });
        let _stop = common::StopOnDrop(&stop);
        // The retrainer is running before the client connects (a hang
        // guard, not a timing bound).
        for _ in 0..10_000 {
            if retrains.load(SeqCst) > 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(retrains.load(SeqCst) > 0, "the retrainer never retrained");
        let c = client(&node, None, Duration::from_micros(500));
        let mut s = c.session().unwrap();
        let mut failed = 0;
        // Rounds long enough for cached views to age out (MAX_AGE) and be
        // fetched again while the model is being retrained.
        for _ in 0..4 {
            for k in 0..16u64 {
                match s.get_value(k * 1000) {
                    Ok(v) => assert_eq!(v.map(|b| id_of(k * 1000, &b)), Some(1000 + k)),
                    Err(e) => {
                        eprintln!("get {}: {e}", k * 1000);
                        failed += 1;
                    }
                }
            }
        }
        failed
    });
    assert_eq!(failed, 0, "gets that gave up");
}

/// [`byte_op`]'s writes and gets, an error recorded as the checker wants
/// it (`KvError::may_have_applied`: unknown outcome, else failed).
/// Returns whether it failed.
fn faulty_byte_op(
    s: &mut KvSession,
    rec: &mut Recorder,
    rng: &mut StdRng,
    (key, id): (u64, u64),
) -> bool {
    let (call, r) = match rng.gen_range(0..10) {
        0..=2 => {
            let op = rec.invoke(Call::Get { key });
            let r = s
                .get_value(key)
                .map(|v| Ret::Value(v.map(|b| id_of(key, &b))));
            (op, r)
        }
        3..=5 => {
            let op = rec.invoke(Call::Insert { key, value: id });
            (op, s.put(key, &value(key, id)).map(|p| Ret::Applied(!p)))
        }
        6 => {
            let op = rec.invoke(Call::Update { key, value: id });
            let r = s.update_value(key, &value(key, id)).map(Ret::Applied);
            (op, r)
        }
        _ => {
            let op = rec.invoke(Call::Delete { key });
            (op, s.remove(key).map(Ret::Applied))
        }
    };
    match r {
        Ok(ret) => {
            rec.finish(call, ret);
            false
        }
        Err(e) => {
            rec.error(call, e.may_have_applied());
            true
        }
    }
}

#[test]
fn windows_of_a_failed_memory_node_under_cuts_and_merges() {
    use rolex_core::entry::LockOwner;
    const OWNER: LockOwner = LockOwner(7);
    let pairs: Vec<(u64, u64)> = (0..16u64).map(|i| (i * 12 * 1000, 1000 + i)).collect();
    let node = byte_node(&pairs, true, |_| {});
    let cfg = KvClientConfig {
        engine: rolex_host::EngineConfig {
            fabric: rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
                latency: Duration::from_micros(20),
                ..rolex_host::LoopbackConfig::default()
            }),
            ..rolex_host::EngineConfig::default()
        },
        model_max_age: MAX_AGE,
        lock_owner: OWNER,
        ..KvClientConfig::default()
    };
    let clients = [
        KvClient::connect(cfg.clone(), &node.pool()).unwrap(),
        KvClient::connect(cfg, &node.pool()).unwrap(),
    ];
    let clock = Arc::new(Clock::new());
    let stop = AtomicBool::new(false);
    let passes = AtomicU64::new(0);
    let mut history = History::new(pairs.iter().copied());
    let (windows, failed) = std::thread::scope(|scope| {
        let r = scope.spawn(|| retrainer(&node, &stop, &passes, Duration::from_micros(300)));
        // The node refuses every operation for 2 ms in every 6 ms.
        let failer = scope.spawn(|| {
            let mut n = 0u64;
            while !stop.load(SeqCst) {
                std::thread::sleep(Duration::from_millis(4));
                assert!(node.engine().set_failed(true), "loopback fails peers");
                std::thread::sleep(Duration::from_millis(2));
                node.engine().set_failed(false);
                n += 1;
            }
            n
        });
        let _stop = common::StopOnDrop(&stop);
        let workers: Vec<_> = (0..4usize)
            .map(|t| {
                let client = clients[t % 2].clone();
                let clock = clock.clone();
                scope.spawn(move || {
                    let mut s = (0..1000)
                        .find_map(|_| client.session().ok())
                        .expect("a session");
                    let mut rec = Recorder::new(t, clock);
                    let mut rng = StdRng::seed_from_u64(77 + t as u64);
                    let mut failed = 0u64;
                    for i in 0..300u64 {
                        let key = rng.gen_range(0..200u64) * 1000;
                        let id = (t as u64) << 32 | (i + 1);
                        failed += u64::from(faulty_byte_op(&mut s, &mut rec, &mut rng, (key, id)));
                    }
                    for _ in 0..1000 {
                        if s.flush().is_ok() && client.locks_maybe_held() == 0 {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    (rec.into_records(), failed)
                })
            })
            .collect();
        let mut failed = 0;
        for w in workers {
            let (records, f) = w.join().unwrap();
            history.extend(records);
            failed += f;
        }
        stop.store(true, SeqCst);
        r.join().unwrap();
        (failer.join().unwrap(), failed)
    });
    node.engine().set_failed(false);
    let leaked = node.release_locks_of(OWNER).unwrap();
    let fresh = client(&node, None, Duration::ZERO);
    let mut s = fresh.session().unwrap();
    let mut rec = Recorder::new(4, clock);
    for k in 0..200u64 {
        let key = k * 1000;
        let op = rec.invoke(Call::Get { key });
        let got = s.get_value(key).unwrap().map(|b| id_of(key, &b));
        rec.finish(op, Ret::Value(got));
    }
    history.extend(rec.into_records());
    let st = node.stats();
    eprintln!(
        "windows {windows}, leaked locks {leaked}, cuts {}, freed {}, failures {failed}",
        st.agent.models_cut, st.agent.leaves_freed
    );
    history
        .check()
        .unwrap_or_else(|v| panic!("not linearizable: {v}"));
    assert!(windows > 0);
    assert!(
        node.last_agent_error().is_none(),
        "{:?}",
        node.last_agent_error()
    );
    assert_eq!(locked_entries(&node), 0, "a chain left locked");
}
