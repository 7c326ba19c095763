//! The memory node's side of the redo log, end to end: a writer whose
//! process dies in the middle of a leaf WRITE (the loopback NIC's
//! `Faults::tear_kills`: a torn write severs the writer's endpoint, so
//! nothing it would post next — its own repair included — goes out)
//! leaves the leaf torn under its lock, with the whole copy it wrote just
//! before in its redo block. The memory node's reaper, releasing the dead
//! owner's locks, writes that copy over the leaf first: every key of the
//! leaf reads back, acknowledged values and all, and the dead owner's
//! block is free again. (`kv_torn_writes.rs` has the same death on a pool
//! without a redo log: the leaf stays torn.)

mod common;

use std::collections::BTreeMap;

use rolex_core::entry::LockOwner;
use rolex_core::layout::{RedoClaim, Superblock};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig, Restored};
use rolex_host::{EngineConfig, Fabric, Faults, LoopbackConfig};

/// The id the dying writer's locks carry.
const DEAD: LockOwner = LockOwner(12);

/// Every redo block's claim word.
fn claims(node: &MemoryNode) -> Vec<RedoClaim> {
    let mut sbb = vec![0u8; Superblock::SIZE as usize];
    node.pool_handle().read(0, &mut sbb).unwrap();
    let redo = Superblock::read(&sbb)
        .unwrap()
        .redo_region()
        .unwrap()
        .expect("a redo log");
    (0..redo.blocks())
        .map(|b| {
            let mut w = [0u8; 8];
            node.pool_handle()
                .read(redo.claim_offset(b).unwrap(), &mut w)
                .unwrap();
            RedoClaim::from_raw(u64::from_le_bytes(w))
        })
        .collect()
}

#[test]
fn a_leaf_torn_by_its_writers_death_is_written_again_from_its_copy() {
    let mut restored = 0;
    for seed in 1..=48u64 {
        let pairs: Vec<(u64, u64)> = (0..24u64).map(|i| (i * 2000, i)).collect();
        // No retraining: the agent would re-read a torn leaf for 2 s.
        let node = MemoryNode::start(
            MemoryNodeConfig {
                retraining_thread: false,
                ..common::churning_config()
            },
            &pairs,
        )
        .unwrap();
        // Half the WRITEs of more than 8 bytes torn, the first one fatal:
        // the copy (torn: the leaf write behind it never goes out) or the
        // leaf write (torn behind a whole copy).
        let writer = common::faulty_client(&node, (seed, 0, 0.0), DEAD, |faults| EngineConfig {
            fabric: Fabric::Loopback(LoopbackConfig {
                faults: Some(Faults {
                    torn: 0.5,
                    tear_kills: true,
                    ..faults
                }),
                ..LoopbackConfig::default()
            }),
            ..EngineConfig::default()
        });
        assert!(writer.redo_logged(), "seed {seed}: the writer copies");
        let mut acked: BTreeMap<u64, u64> = pairs.iter().copied().collect();
        let mut s = writer.session().unwrap();
        let mut failed = None;
        for &(k, v) in &pairs {
            match s.update(k, v + 1000) {
                Ok(_) => {
                    acked.insert(k, v + 1000);
                }
                Err(e) => {
                    assert!(e.may_have_applied(), "seed {seed}: {e}");
                    failed = Some((k, v + 1000));
                    break;
                }
            }
        }
        drop(s);
        drop(writer);
        let Some((key, new)) = failed else {
            continue;
        };
        let (released, named) = node.release_locks_reporting(DEAD).unwrap();
        assert_eq!(released, 1, "seed {seed}: the dead writer's lock");
        for d in &named {
            assert!(
                matches!(d.restored, Some(Restored { owner: DEAD, .. })),
                "seed {seed}: {d:?} left torn"
            );
            restored += 1;
            println!("seed {seed}: the reaper restored {d:?}");
        }
        assert!(
            claims(&node).iter().all(|c| c.owner() != Some(DEAD)),
            "seed {seed}: the dead writer's block is freed"
        );
        let reader = common::steady_client(&node, None);
        let mut r = reader.session().unwrap();
        for (&k, &v) in &acked {
            let got = r.get(k).unwrap();
            if k == key {
                // The torn write: restored whole, or never landed.
                assert!(
                    got == Some(v) || got == Some(new),
                    "seed {seed}: key {k}: {got:?}"
                );
            } else {
                assert_eq!(got, Some(v), "seed {seed}: key {k}");
            }
        }
    }
    assert!(restored > 0, "no seed tore a leaf behind a whole copy");
}
