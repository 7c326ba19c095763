//! The redo log (`rolex_core::layout::redo`): where the fabric places a
//! peer's writes in posting order, every leaf write of a client goes out
//! behind a whole copy in a block of the pool's redo log that the client
//! claimed, so the memory node can write a leaf torn by a death again.
//! These tests check the compute side: which clients copy, that every
//! copy is the leaf's bytes as written, that blocks are claimed and freed
//! (and run out cleanly), and that a writer dying in the middle of a leaf
//! write loses no acknowledged key once the memory node's reaper ran.

mod common;

use std::collections::BTreeMap;

use rolex_core::entry::LockOwner;
use rolex_core::layout::{Leaf, RedoClaim, RedoEntry, Superblock};
use rolex_host::kv::{KvClient, KvClientConfig};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig, Restored};
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig};

/// The pool's superblock.
fn superblock(node: &MemoryNode) -> Superblock {
    let mut sb = vec![0u8; Superblock::SIZE as usize];
    node.pool_handle().read(0, &mut sb).unwrap();
    Superblock::read(&sb).unwrap()
}

/// Every block's claim word, in order.
fn claims(node: &MemoryNode) -> Vec<RedoClaim> {
    let region = superblock(node).redo_region().unwrap().expect("a redo log");
    (0..region.blocks())
        .map(|b| {
            let mut w = [0u8; 8];
            node.pool_handle()
                .read(region.claim_offset(b).unwrap(), &mut w)
                .unwrap();
            RedoClaim::from_raw(u64::from_le_bytes(w))
        })
        .collect()
}

/// The whole entries in the blocks claimed now by `owner`: per target, the
/// newest one's image.
fn newest_entries(node: &MemoryNode, owner: LockOwner) -> BTreeMap<u64, Vec<u8>> {
    let region = superblock(node).redo_region().unwrap().unwrap();
    let mut newest: BTreeMap<u64, (u64, Vec<u8>)> = BTreeMap::new();
    for (b, claim) in claims(node).into_iter().enumerate() {
        if claim.owner() != Some(owner) {
            continue;
        }
        for s in 0..region.slots() {
            let mut slot = vec![0u8; region.slot_len() as usize];
            let at = region.slot_offset(b as u32, s).unwrap();
            node.pool_handle().read(at, &mut slot).unwrap();
            let Ok(e) = RedoEntry::decode(&slot) else {
                continue;
            };
            assert_eq!(e.owner, owner);
            assert_eq!(e.nonce, claim.nonce(), "an entry of this claim");
            if newest.get(&e.target).map_or(true, |(seq, _)| e.seq > *seq) {
                newest.insert(e.target, (e.seq, e.image.to_vec()));
            }
        }
    }
    newest
        .into_iter()
        .map(|(t, (_, image))| (t, image))
        .collect()
}

fn client(node: &MemoryNode, owner: LockOwner, fabric: LoopbackConfig) -> KvClient {
    KvClient::connect(
        KvClientConfig {
            engine: EngineConfig {
                fabric: Fabric::Loopback(fabric),
                ..EngineConfig::default()
            },
            lock_owner: owner,
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap()
}

/// On an ordered fabric every leaf write (updates in place, inserts that
/// split) is copied, and the newest copy of each leaf is the leaf's bytes
/// in the pool; an unordered fabric and a pool without a redo log copy
/// nothing.
#[test]
fn every_leaf_write_is_copied_whole_first() {
    const OWNER: LockOwner = LockOwner(33);
    let (node, pairs) = common::half_full_node();
    let c = client(&node, OWNER, LoopbackConfig::default());
    assert!(c.redo_logged());
    let mut s = c.session().unwrap();
    for &(k, v) in pairs.iter().step_by(7) {
        assert_eq!(s.update(k, v + 1).unwrap(), Some(v));
    }
    // Enough new keys next to each other to split leaves.
    for k in 0..40u64 {
        assert_eq!(s.insert(5001 + k * 2, k).unwrap(), None);
    }
    s.flush().unwrap();
    let st = c.stats();
    assert!(st.redo_logged >= 40 + pairs.len() as u64 / 7, "{st:?}");
    assert_eq!(st.redo_unlogged, 0);
    let copies = newest_entries(&node, OWNER);
    assert!(!copies.is_empty());
    for (target, image) in &copies {
        let mut leaf = vec![0u8; image.len()];
        node.pool_handle().read(*target, &mut leaf).unwrap();
        assert_eq!(
            &leaf, image,
            "the newest copy of the leaf at {target} is the leaf"
        );
        Leaf::from_bytes(image).unwrap().validate().unwrap();
    }

    // Unordered: writes are not placed in posting order, nothing copied.
    let u = client(
        &node,
        LockOwner(34),
        LoopbackConfig {
            unordered: Some(rolex_host::Unordered {
                seed: 1,
                window: 8,
                writes_in_order: false,
            }),
            ..LoopbackConfig::default()
        },
    );
    assert!(!u.redo_logged());
    let mut us = u.session().unwrap();
    us.update(pairs[1].0, 5).unwrap();
    us.flush().unwrap();
    assert_eq!(u.stats().redo_logged, 0);

    // A pool without a redo log.
    let bare = MemoryNode::start(
        MemoryNodeConfig {
            redo_blocks: 0,
            retraining_thread: false,
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    assert_eq!(superblock(&bare).redo_region(), Ok(None));
    let b = client(&bare, OWNER, LoopbackConfig::default());
    assert!(!b.redo_logged());
    b.session().unwrap().update(pairs[1].0, 5).unwrap();
}

/// A client claims one block and its last handle frees it; with every
/// block claimed, a client connects without a copy, and gets a block
/// again once one is freed.
#[test]
fn blocks_are_claimed_freed_and_run_out_cleanly() {
    let pairs: Vec<(u64, u64)> = (0..500).map(|i| (i * 10, i)).collect();
    let node = MemoryNode::start(
        MemoryNodeConfig {
            redo_blocks: 2,
            redo_slots: 4,
            retraining_thread: false,
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    let claimed = |node: &MemoryNode| claims(node).iter().filter(|c| c.owner().is_some()).count();
    assert_eq!(claimed(&node), 0);
    let a = client(&node, LockOwner(1), LoopbackConfig::default());
    let b = client(&node, LockOwner(1), LoopbackConfig::default());
    assert!(a.redo_logged() && b.redo_logged());
    assert_eq!(claimed(&node), 2);
    let c = client(&node, LockOwner(2), LoopbackConfig::default());
    assert!(!c.redo_logged(), "no block left");
    // Still a working client, its writes uncopied.
    c.session().unwrap().update(10, 11).unwrap();
    // Four slots: many writes in turn reuse them.
    let mut s = a.session().unwrap();
    for i in 0..100u64 {
        s.update((i % 50) * 10, i).unwrap();
    }
    assert_eq!(a.stats().redo_unlogged, 0);
    drop(s);
    drop(a);
    assert_eq!(claimed(&node), 1, "the last handle freed its block");
    let d = client(&node, LockOwner(3), LoopbackConfig::default());
    assert!(d.redo_logged());
    drop((b, c, d));
    assert_eq!(claimed(&node), 0);
    // A client whose memory node is gone keeps its block (no round trip).
    let e = client(&node, LockOwner(4), LoopbackConfig::default());
    e.abandon_values();
    drop(e);
    assert_eq!(claimed(&node), 1);
}

/// Leaf writes torn by a broken link, repaired by the live writer: with
/// copies in front of them (a torn copy fails the leaf write behind it)
/// every acknowledged write is still read back, and the client's slots
/// are all free again once no lock is maybe held.
#[test]
fn torn_writes_with_copies_lose_nothing() {
    let (node, pairs) = common::half_full_node();
    let mut torn = 0;
    for seed in 1..=4u64 {
        let c = common::faulty_client(&node, (seed, 0, 0.0), LockOwner(40 + seed as u16), |f| {
            EngineConfig {
                fabric: Fabric::Loopback(LoopbackConfig {
                    faults: Some(Faults { torn: 0.2, ..f }),
                    ..LoopbackConfig::default()
                }),
                ..EngineConfig::default()
            }
        });
        assert!(c.redo_logged());
        let mut s = c.session().unwrap();
        let mut acked = BTreeMap::new();
        for (i, &(k, _)) in pairs.iter().enumerate().step_by(3) {
            let v = seed * 1_000_000 + i as u64;
            match s.update(k, v) {
                Ok(_) => {
                    acked.insert(k, v);
                }
                Err(e) => assert!(e.may_have_applied(), "{e}"),
            }
        }
        for _ in 0..100 {
            let _ = s.flush();
            if c.locks_maybe_held() == 0 {
                break;
            }
        }
        assert_eq!(c.locks_maybe_held(), 0);
        let reader = common::steady_client(&node, None);
        let mut r = reader.session().unwrap();
        for (k, v) in &acked {
            assert_eq!(r.get(*k).unwrap(), Some(*v), "seed {seed}: key {k}");
        }
        assert!(c.stats().redo_logged > 0);
        torn += c.stats().engine.errors;
    }
    assert!(torn > 0, "no write was torn");
}

/// A writer that dies in the middle of a leaf write — the tear severs its
/// endpoint (`Faults::tear_kills`): nothing it would post next, its repair
/// included, goes out — loses no acknowledged key: where the leaf was torn
/// (its copy went out whole before it), the memory node's lease reaper
/// writes the copy over it before it releases the dead holder's lock;
/// where the copy was torn, the leaf write behind it never started.
#[test]
fn a_writer_dead_mid_write_loses_no_acknowledged_key() {
    const DEAD: LockOwner = LockOwner(12);
    let (mut restored, mut copy_torn) = (0, 0);
    for seed in 1..=24u64 {
        let pairs: Vec<(u64, u64)> = (0..200).map(|i| (i * 2 * 1000, i)).collect();
        // No retraining: the agent would re-read a torn leaf for 2 s
        // before failing its model's retraining.
        let node = MemoryNode::start(
            MemoryNodeConfig {
                retraining_thread: false,
                ..common::churning_config()
            },
            &pairs,
        )
        .unwrap();
        let writer = common::faulty_client(&node, (seed, 0, 0.0), DEAD, |f| EngineConfig {
            fabric: Fabric::Loopback(LoopbackConfig {
                faults: Some(Faults {
                    torn: 0.2,
                    tear_kills: true,
                    ..f
                }),
                ..LoopbackConfig::default()
            }),
            ..EngineConfig::default()
        });
        assert!(writer.redo_logged());
        let mut acked: BTreeMap<u64, u64> = pairs.iter().copied().collect();
        let mut s = writer.session().unwrap();
        let mut died = None;
        for i in 0..400u64 {
            // Updates in place over 40 leaves, and now and then a new key
            // beside one (a leaf of 2 slots holding 1: the second such
            // insert splits it).
            let j = i * 7919 % 40;
            let key = if i % 40 == 39 {
                j * 2000 + 1 + i
            } else {
                j * 2000
            };
            let value = seed << 32 | (i + 1);
            match s.insert(key, value) {
                Ok(_) => {
                    acked.insert(key, value);
                }
                Err(e) => {
                    died = Some((key, value, e));
                    break;
                }
            }
        }
        let (key, value, err) = died.expect("a tear within 400 writes");
        assert!(err.may_have_applied(), "seed {seed}: {err}");
        // The writer dies: nothing of it lands any more (its client's
        // reaper would go on writing the leaf again).
        node.engine().set_failed(true);
        drop(s);
        drop(writer);
        let (_, damaged) = node.release_locks_reporting(DEAD).unwrap();
        node.engine().set_failed(false);
        for d in &damaged {
            assert!(
                matches!(d.restored, Some(Restored { owner: DEAD, .. })),
                "seed {seed}: left torn: {d:?}"
            );
            restored += 1;
        }
        if damaged.is_empty() {
            copy_torn += 1;
        }
        assert!(
            claims(&node).iter().all(|c| c.owner() != Some(DEAD)),
            "seed {seed}: the dead writer's block was freed"
        );
        let reader = common::steady_client(&node, None);
        let mut r = reader.session().unwrap();
        for (k, v) in &acked {
            let got = r.get(*k).unwrap();
            if *k == key {
                assert!(
                    got == Some(*v) || got == Some(value),
                    "seed {seed}: key {k}: {got:?}"
                );
            } else {
                assert_eq!(got, Some(*v), "seed {seed}: key {k}");
            }
        }
        // The store goes on: the dead writer's chain takes writes again.
        r.insert(key, 1).unwrap();
        println!(
            "seed {seed}: {} leaves written again from their copies",
            damaged.len()
        );
    }
    println!(
        "{restored} leaves restored; {copy_torn} deaths tore a copy (or a prefix of no effect)"
    );
    assert!(restored > 0, "no death tore a leaf behind a whole copy");
}
