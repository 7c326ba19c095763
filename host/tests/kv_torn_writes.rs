//! Leaf writes torn by a broken link: on a stream transport (libfabric's
//! `tcp` places an RMA write's payload in the target region as it
//! arrives) a connection that breaks in the middle of a leaf WRITE leaves
//! a prefix of the new leaf over the old one, and nothing posted after it
//! on that connection is carried out. The loopback NIC models it
//! (`Faults::torn`). The writer still holds the chain's lock, and that
//! lock must not be released over a torn leaf: the leaf's other keys —
//! acknowledged writes of other operations — would be unreadable for
//! good. These runs tear leaf writes (single writes and splits; pipelined
//! batches in `kv_pipeline`) while the memory node retrains; every get
//! must answer (a torn leaf left behind fails every get of its keys with
//! [`KvError::Leaf`]), the history with failed writes of unknown outcome
//! must be linearizable, every key must read back, and no lock may be
//! left held once the threads flushed.

mod common;

use rand::Rng;
use rolex_checker::{Call, Ret};
use rolex_core::entry::LockOwner;
use rolex_host::kv::KvError;
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig, Unordered};

/// Keys `0, 1000, …`; the even ones loaded.
const KEYS: u64 = 48;
/// The id the compute nodes' locks carry.
const OWNER: LockOwner = LockOwner(11);

/// A compute node's engine whose NIC tears leaf writes with probability
/// `torn` (no other fault).
fn engine(unordered: bool, torn: f64, faults: Faults) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            faults: Some(Faults {
                probability: 0.0,
                torn,
                ..faults
            }),
            unordered: unordered.then_some(Unordered {
                seed: faults.seed,
                window: 8,
            }),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    }
}

/// Random single operations (get, insert, update, delete, scan) on small
/// leaves that split and merge, with leaf writes torn at `torn`.
fn single_writes_torn(unordered: bool, torn: f64) {
    let all: Vec<u64> = (0..KEYS).map(|k| k * 1000).collect();
    for seed in 1..=3 {
        let pairs: Vec<(u64, u64)> = (0..KEYS / 2).map(|i| (i * 2 * 1000, i)).collect();
        let node = common::churning_node(&pairs);
        let clients = [0, 1].map(|client| {
            common::faulty_client(&node, (seed, client, 0.0), OWNER, |faults| {
                engine(unordered, torn, faults)
            })
        });
        let (checked, f) = common::faulty_history(
            &node,
            &clients,
            (&pairs, OWNER, seed),
            150,
            |s, rec, rng, (t, i), f| {
                let key = rng.gen_range(0..KEYS) * 1000;
                let value = (t as u64) << 32 | i;
                let (op, r) = match rng.gen_range(0..10) {
                    0..=2 => (rec.invoke(Call::Get { key }), s.get(key).map(Ret::Value)),
                    3..=5 => (
                        rec.invoke(Call::Insert { key, value }),
                        s.insert(key, value).map(Ret::Prior),
                    ),
                    6 => (
                        rec.invoke(Call::Update { key, value }),
                        s.update(key, value).map(Ret::Prior),
                    ),
                    7..=8 => (
                        rec.invoke(Call::Delete { key }),
                        s.delete(key).map(Ret::Prior),
                    ),
                    _ => {
                        let n = rng.gen_range(1..6);
                        let op = rec.invoke(Call::Scan { from: key, n });
                        (op, s.scan(key, n).map(Ret::Entries))
                    }
                };
                match r {
                    Ok(ret) => rec.finish(op, ret),
                    Err(e @ KvError::Leaf { .. }) => {
                        panic!("seed {seed}: a torn leaf was left behind: {e}")
                    }
                    Err(e) => {
                        f.count(e.may_have_applied());
                        rec.error(op, e.may_have_applied());
                    }
                }
            },
            (&all, |s: &mut rolex_host::kv::KvSession, key| {
                s.get(key)
                    .unwrap_or_else(|e| panic!("reading key {key} back: {e}"))
            }),
        );
        let torn_seen: u64 = clients.iter().map(|c| c.stats().engine.errors).sum();
        println!(
            "unordered {unordered} seed {seed}: {} operations checked, {} failed ({} may \
             have applied), {torn_seen} errors at the NICs",
            checked.single_ops, f.failed, f.unknown
        );
        assert!(node.last_agent_error().is_none());
    }
}

#[test]
fn torn_leaf_writes_are_repaired_before_the_lock_is_released() {
    single_writes_torn(false, 0.05);
}

#[test]
fn torn_leaf_writes_are_repaired_before_the_lock_is_released_unordered() {
    single_writes_torn(true, 0.05);
}
