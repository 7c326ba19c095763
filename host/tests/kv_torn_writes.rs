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

use common::Delivery;
use rand::Rng;
use rolex_checker::{Call, Ret};
use rolex_core::entry::LockOwner;
use rolex_core::layout::{Leaf, Superblock};
use rolex_host::kv::KvError;
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig};

/// Keys `0, 1000, …`; the even ones loaded.
const KEYS: u64 = 48;
/// The id the compute nodes' locks carry.
const OWNER: LockOwner = LockOwner(11);

/// A compute node's engine whose NIC tears leaf writes with probability
/// `torn` (no other fault).
fn engine(order: Delivery, torn: f64, faults: Faults) -> EngineConfig {
    EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            faults: Some(Faults {
                probability: 0.0,
                torn,
                ..faults
            }),
            unordered: order.loopback(faults.seed),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    }
}

/// Random single operations (get, insert, update, delete, scan) on small
/// leaves that split and merge, with leaf writes torn at `torn`.
fn single_writes_torn(order: Delivery, torn: f64) {
    let all: Vec<u64> = (0..KEYS).map(|k| k * 1000).collect();
    for seed in 1..=3 {
        let pairs: Vec<(u64, u64)> = (0..KEYS / 2).map(|i| (i * 2 * 1000, i)).collect();
        let node = common::churning_node(&pairs);
        let clients = [0, 1].map(|client| {
            common::faulty_client(&node, (seed, client, 0.0), OWNER, |faults| {
                engine(order, torn, faults)
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
            "{order:?} seed {seed}: {} operations checked, {} failed ({} may \
             have applied), {torn_seen} errors at the NICs",
            checked.single_ops, f.failed, f.unknown
        );
        assert!(node.last_agent_error().is_none());
    }
}

#[test]
fn torn_leaf_writes_are_repaired_before_the_lock_is_released() {
    single_writes_torn(Delivery::Ordered, 0.05);
}

#[test]
fn torn_leaf_writes_are_repaired_before_the_lock_is_released_unordered() {
    single_writes_torn(Delivery::Unordered, 0.05);
}

/// Over `tcp`'s order an unlock goes as a WRITE behind its leaf: a torn
/// leaf fails it too, and the lock is kept for repair.
#[test]
fn torn_leaf_writes_are_repaired_before_the_lock_is_released_writes_in_order() {
    single_writes_torn(Delivery::WritesInOrder, 0.05);
}

/// A writer that dies with a leaf torn under its lock (every leaf write of
/// it lands only in part, its repairs too) on a pool without a redo log
/// leaves the leaf for good: the memory node's reaper, releasing the dead
/// owner's lock, names it. (A prefix short enough to hold only bytes the
/// old and new leaf share leaves the old leaf whole: then nothing is
/// torn, and the writer's retry, finding its leaf whole, released the
/// lock at once; some seeds do that.) With a redo log the leaf is written
/// again from its copy: `kv_redo.rs`.
#[test]
fn the_reaper_names_a_leaf_its_dead_holder_left_torn() {
    const DEAD: LockOwner = LockOwner(12);
    let mut named = 0;
    for seed in 1..=8 {
        let pairs: Vec<(u64, u64)> = (0..KEYS / 2).map(|i| (i * 2 * 1000, i)).collect();
        // No retraining: the agent would re-read the torn leaf for 2 s
        // before failing its model's retraining.
        let node = MemoryNode::start(
            MemoryNodeConfig {
                retraining_thread: false,
                redo_blocks: 0,
                ..common::churning_config()
            },
            &pairs,
        )
        .unwrap();
        let writer = common::faulty_client(&node, (seed, 0, 0.0), DEAD, |faults| {
            engine(Delivery::Ordered, 1.0, faults)
        });
        let mut s = writer.session().unwrap();
        // An update: its leaf is rewritten in place (a split's new leaf,
        // torn, would be linked by nothing).
        let err = s.update(2000, 7).expect_err("every leaf write is torn");
        assert!(err.may_have_applied(), "{err}");
        if !err.lock_may_be_held() {
            // The prefix held only bytes the old and new leaf share:
            // nothing torn, so the lock was released at once.
            assert_eq!(writer.locks_maybe_held(), 0, "seed {seed}");
            continue;
        }
        assert_eq!(writer.locks_maybe_held(), 1);
        // The writer dies: nothing of it lands any more (its client's
        // reaper would go on writing the leaf again), nobody writes the
        // leaf again.
        node.engine().set_failed(true);
        drop(s);
        drop(writer);
        let (released, torn) = node.release_locks_reporting(DEAD).unwrap();
        node.engine().set_failed(false);
        assert_eq!(released, 1, "seed {seed}");
        assert!(torn.len() <= 1, "seed {seed}: {torn:?}");
        for d in &torn {
            // What it names fails its checks, as every reader finds.
            let mut sbb = vec![0u8; Superblock::SIZE as usize];
            node.pool_handle().read(0, &mut sbb).unwrap();
            let region = Superblock::read(&sbb).unwrap().leaf_region().unwrap();
            let mut leaf = vec![0u8; region.leaf_size() as usize];
            let off = region.leaf_offset(d.leaf).unwrap();
            node.pool_handle().read(off, &mut leaf).unwrap();
            assert!(
                Leaf::from_bytes(&leaf)
                    .and_then(|l| l.validate().map(drop))
                    .is_err(),
                "seed {seed}: {d:?} validates"
            );
            println!("seed {seed}: the reaper released 1 lock and named {d:?}");
            named += 1;
        }
        // A live writer's lock is never released: nothing else is named.
        assert_eq!(
            node.release_locks_reporting(OWNER).unwrap(),
            (0, Vec::new())
        );
    }
    assert!(named > 0, "no seed left a leaf torn");
}
