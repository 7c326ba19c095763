//! Linearizability under injected faults: four threads on two compute
//! nodes whose loopback NIC fails operations (`LoopbackConfig::faults`:
//! error completions, some after the operation took effect, some before)
//! run random operations on a small key space while the memory node
//! retrains (a low trigger, and a thread that retrains every model again
//! and again). A write that returned an error is recorded with an unknown
//! outcome (a read that failed had no effect, and is left out: each
//! unknown outcome multiplies the checker's search); every key is then
//! read back by a compute node without faults, and the whole history is
//! checked against a sequential `BTreeMap` model (`rolex_checker`).
//!
//! The workers run in rounds. Between two rounds, when no operation is in
//! flight, the test does what the memory node's reaper does for a holder
//! that is gone: it releases the chain locks that failed operations left
//! held (the compute nodes' locks carry a leased owner id for this). A
//! lock left held would otherwise fail every later write to its chain —
//! each one more write of unknown outcome for the checker to place — and
//! stall the agent's freeze of its model. How many there were is printed,
//! not asserted: a lock or unlock CAS that itself failed may or may not
//! have applied, and the session cannot yet tell its own lock word from
//! another session's.

mod common;

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Barrier};

use common::Delivery;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rolex_checker::{Call, Clock, History, Record, Recorder, Ret};
use rolex_core::entry::LockOwner;
use rolex_host::kv::{KvClient, KvClientConfig, KvError, KvSession};
use rolex_host::memnode::MemoryNode;
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig};

/// Keys `0, 1000, …, 63000`; the even ones loaded. Enough keys that each
/// has few writes of unknown outcome.
const KEYS: u64 = 64;
const THREADS: usize = 4;
/// Operations per thread and round; rounds.
const OPS_PER_ROUND: u64 = 50;
const ROUNDS: u64 = 15;
/// The id the compute nodes' locks carry (any leased id).
const OWNER: LockOwner = LockOwner(7);

/// What one fault-injected run found.
#[derive(Debug, Default)]
struct Found {
    failed: u64,
    leaked_locks: u64,
    retrains: u64,
    ops: usize,
}

/// A compute node's engine on the loopback fabric, with `faults`.
fn engine(faults: Option<Faults>, order: Delivery, seed: u64) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            faults,
            unordered: order.loopback(seed),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    }
}

/// Records `call` made through `f`: its answer, or if it returned an
/// error, an unknown outcome for a write and nothing for a read. Returns
/// whether it failed.
fn record<T>(
    rec: &mut Recorder,
    call: Call,
    f: impl FnOnce() -> Result<T, KvError>,
    ret: impl FnOnce(T) -> Ret,
) -> bool {
    let op = rec.invoke(call);
    match f() {
        Ok(v) => {
            rec.finish(op, ret(v));
            false
        }
        Err(_) => {
            if !matches!(call, Call::Get { .. } | Call::Scan { .. }) {
                rec.abandon(op);
            }
            true
        }
    }
}

/// One round of a worker's random operations, recorded in `rec`; returns
/// how many failed.
fn round(s: &mut KvSession, rec: &mut Recorder, rng: &mut StdRng, t: usize, first: u64) -> u64 {
    let mut failed = 0;
    for i in first..first + OPS_PER_ROUND {
        let key = rng.gen_range(0..KEYS) * 1000;
        let value = (t as u64) << 32 | i;
        let prior = Ret::Prior;
        let failed_now = match rng.gen_range(0..12) {
            0..=2 => record(rec, Call::Get { key }, || s.get(key), Ret::Value),
            3..=5 => record(
                rec,
                Call::Insert { key, value },
                || s.insert(key, value),
                prior,
            ),
            6..=7 => record(
                rec,
                Call::Update { key, value },
                || s.update(key, value),
                prior,
            ),
            8..=9 => record(rec, Call::Delete { key }, || s.delete(key), prior),
            _ => {
                let n = rng.gen_range(1..6);
                record(
                    rec,
                    Call::Scan { from: key, n },
                    || s.scan(key, n),
                    Ret::Entries,
                )
            }
        };
        failed += u64::from(failed_now);
    }
    // The unordered fabric's last unlock: a failure here shows as a lock
    // left held, released after the round.
    let _ = s.flush();
    failed
}

/// Runs the workers against a retraining memory node with faults at
/// `probability`, then reads every key back without faults; returns the
/// history and what was found.
fn run(probability: f64, order: Delivery, seed: u64) -> (History, Found) {
    let pairs: Vec<(u64, u64)> = (0..KEYS / 2).map(|i| (i * 2 * 1000, i)).collect();
    let node = common::churning_node(&pairs);
    let faults = Faults {
        probability,
        seed,
        torn: 0.0,
        tear_kills: false,
    };
    let cfg = KvClientConfig {
        engine: engine(Some(faults), order, seed),
        lock_owner: OWNER,
        ..KvClientConfig::default()
    };
    // Connecting only reads: try again after a fault.
    let connect = |cfg: &KvClientConfig| loop {
        if let Ok(c) = KvClient::connect(cfg.clone(), &node.pool()) {
            break c;
        }
    };
    let clients = [connect(&cfg), connect(&cfg)];
    let clock = Arc::new(Clock::new());
    let stop = AtomicBool::new(false);
    // The workers and the releaser of leaked locks, between rounds.
    let between = Barrier::new(THREADS + 1);
    let mut history = History::new(pairs.iter().copied());
    let mut found = Found::default();
    let retrains_before = node.stats().agent.retrains;
    std::thread::scope(|scope| {
        // Stops the retrainer also when a worker's panic unwinds the scope.
        let _stop = common::StopOnDrop(&stop);
        let retrainer = scope.spawn(|| {
            while !stop.load(SeqCst) {
                for m in 0..node.model_count() {
                    // A failed retraining thaws the model; the next round
                    // tries again.
                    let _ = node.retrain_now(m);
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        });
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let client = clients[t % 2].clone();
                let clock = clock.clone();
                let between = &between;
                scope.spawn(move || {
                    let mut s = client.session().unwrap();
                    let mut rec = Recorder::new(t, clock);
                    let mut rng = StdRng::seed_from_u64(seed * 31 + t as u64);
                    let mut failed = 0;
                    for r in 0..ROUNDS {
                        failed += round(&mut s, &mut rec, &mut rng, t, r * OPS_PER_ROUND);
                        between.wait();
                        between.wait();
                    }
                    (rec.into_records(), failed)
                })
            })
            .collect();
        for _ in 0..ROUNDS {
            between.wait();
            // No operation is in flight: release what failed ones left
            // locked, as the reaper would, so a freeze waiting for one can
            // finish and later writes to its chain can go on.
            found.leaked_locks += node.release_locks_of(OWNER).unwrap();
            between.wait();
        }
        for w in workers {
            let (records, failed) = w.join().unwrap();
            history.extend(records);
            found.failed += failed;
        }
        stop.store(true, SeqCst);
        retrainer.join().unwrap();
    });
    found.retrains = node.stats().agent.retrains - retrains_before;
    history.extend(read_back(&node, &clock));
    found.ops = history.records().len();
    (history, found)
}

/// Every key read once, after all else, by a compute node without faults.
fn read_back(node: &MemoryNode, clock: &Arc<Clock>) -> Vec<Record> {
    let client = KvClient::connect(
        KvClientConfig {
            engine: engine(None, Delivery::Ordered, 0),
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap();
    let mut s = client.session().unwrap();
    let mut rec = Recorder::new(THREADS, clock.clone());
    for k in 0..KEYS {
        let key = k * 1000;
        let op = rec.invoke(Call::Get { key });
        let got = s
            .get(key)
            .unwrap_or_else(|e| panic!("reading key {key} back: {e}"));
        rec.finish(op, Ret::Value(got));
    }
    rec.into_records()
}

fn check(probability: f64, order: Delivery) {
    for seed in 1..=3 {
        let (history, found) = run(probability, order, seed);
        let checked = history.check();
        println!(
            "injected: p = {probability} per posted operation, seed {seed}, {order:?}, \
             {} operations; found: {} failed, {} chain locks left held (released between rounds), \
             {} retrains, {}",
            found.ops,
            found.failed,
            found.leaked_locks,
            found.retrains,
            match &checked {
                Ok(c) => format!(
                    "linearizable ({} single-key ops, {} scans)",
                    c.single_ops, c.scans
                ),
                Err(v) => format!("NOT linearizable: {v}"),
            }
        );
        checked.unwrap_or_else(|v| panic!("seed {seed}: not linearizable: {v}"));
        assert!(found.failed > 0, "seed {seed}: faults were injected");
        assert!(found.retrains > 0, "seed {seed}: retraining ran meanwhile");
    }
}

#[test]
fn fault_injected_histories_are_linearizable_on_an_ordered_fabric() {
    check(0.005, Delivery::Ordered);
}

#[test]
fn fault_injected_histories_are_linearizable_on_an_unordered_fabric() {
    check(0.005, Delivery::Unordered);
}

#[test]
fn fault_injected_histories_are_linearizable_on_tcps_order() {
    check(0.005, Delivery::WritesInOrder);
}
