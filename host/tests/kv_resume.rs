//! A file-backed memory node left as its death leaves it — a model frozen
//! mid-retraining, chain locks of a leased compute node and an anonymous
//! one, retired records — is resumed in-process on the loopback fabric
//! (`MemoryNode::resume`): every key is there, the frozen model is thawed
//! and retrains again, every compute-node lock is released so writers get
//! through, and the retired records' space waits for its grace period. A
//! pool file a live node holds, and files that are not pools, are refused.

mod common;

use common::Scratch;

use rolex_core::entry::{LockOwner, LtEntry};
use rolex_core::layout::{ModelRecord, ModelState, Superblock};
use rolex_dpu::PoolMemory;
use rolex_host::kv::{KvClient, KvClientConfig};
use rolex_host::memnode::{
    HostPool, MemoryNode, MemoryNodeConfig, MemoryNodeError, NotAPool, PoolFileProblem,
};

fn config(file: &Scratch) -> MemoryNodeConfig {
    MemoryNodeConfig {
        leaf_slots: 4,
        fill: 0.75,
        epsilon: 4,
        max_model_leaves: 8,
        retraining_thread: false,
        pool_file: Some(file.0.clone()),
        ..MemoryNodeConfig::default()
    }
}

/// The directory record of model `m`: (offset, header).
fn record(mem: &HostPool, m: u64) -> (u64, ModelRecord) {
    let mut sbb = [0u8; Superblock::SIZE as usize];
    mem.read(0, &mut sbb).unwrap();
    let sb = Superblock::read(&sbb).unwrap();
    let at = mem.load(sb.directory_entry_offset(m).unwrap()).unwrap();
    let mut rb = [0u8; ModelRecord::SIZE as usize];
    mem.read(at, &mut rb).unwrap();
    (at, ModelRecord::read(&rb).unwrap())
}

#[test]
fn a_pool_left_mid_retraining_with_locks_held_is_resumed_whole() {
    let file = Scratch::new("kv-resume.pool");
    let pairs: Vec<(u64, u64)> = (1..=300u64).map(|i| (i * 100, i)).collect();
    let node = MemoryNode::start(config(&file), &pairs).unwrap();
    let models = node.model_count();
    assert!(models >= 4, "{models} models");
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let fresh: Vec<u64> = (1..300u64).map(|i| i * 100 + 37).collect();
    for &k in &fresh {
        s.insert(k, k ^ 1).unwrap();
    }
    // Retired records: every model retrained once.
    for m in 0..models {
        node.retrain_now(m).unwrap();
    }
    drop(s);
    drop(client);

    // What a death leaves: model 1 frozen, half its entries locked by the
    // agent; lease 9 holding model 2's first entry, an anonymous holder
    // model 3's.
    let mem = HostPool::new(node.pool_handle().clone());
    let (at1, r1) = record(&mem, 1);
    let state = r1.state();
    mem.store(at1 + ModelRecord::STATE_OFFSET, state.frozen().raw())
        .unwrap();
    let frozen_entries = r1.leaf_count().div_ceil(2);
    for j in 0..frozen_entries {
        let off = r1.lt_entry_offset(j).unwrap();
        let v = LtEntry::from_raw(mem.load(off).unwrap());
        mem.store(off, v.locked_by(LockOwner::AGENT).raw()).unwrap();
    }
    for (m, owner) in [(2, LockOwner(9)), (3, LockOwner::ANONYMOUS)] {
        let (_, r) = record(&mem, m);
        let off = r.lt_entry_offset(0).unwrap();
        let v = LtEntry::from_raw(mem.load(off).unwrap());
        mem.store(off, v.locked_by(owner).raw()).unwrap();
    }
    eprintln!(
        "injected: model 1 frozen with {frozen_entries} entries agent-locked, \
         a lock of lease 9 in model 2, an anonymous lock in model 3, {models} retired records"
    );

    // The file is held while its node lives.
    let busy = MemoryNode::resume(config(&file)).unwrap_err();
    assert!(
        matches!(
            &busy,
            MemoryNodeError::PoolFile {
                problem: PoolFileProblem::InUse,
                ..
            }
        ),
        "{busy}"
    );
    eprintln!("found while the node lives: {busy}");
    drop(mem);
    drop(node);

    let (node, rec) = MemoryNode::resume(config(&file)).unwrap();
    eprintln!("found: {rec:?}");
    assert_eq!((rec.thawed, rec.thaw_unlocked), (1, frozen_entries));
    assert_eq!((rec.rolled_forward, rec.compute_locks_released), (0, 2));
    assert_eq!((rec.damaged_count, rec.untiled.len()), (0, 0));
    assert_eq!(rec.keys, (pairs.len() + fresh.len()) as u64);
    assert!(rec.retired_bytes() > 0);
    assert_eq!(node.stats().keys_loaded, rec.keys);
    let mem = HostPool::new(node.pool_handle().clone());
    let (_, r1) = record(&mem, 1);
    assert_eq!(r1.state(), ModelState::live(state.generation()).unwrap());

    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    for &(k, v) in &pairs {
        assert_eq!(s.get(k).unwrap(), Some(v), "loaded key {k}");
    }
    for &k in &fresh {
        assert_eq!(s.get(k).unwrap(), Some(k ^ 1), "inserted key {k}");
    }
    // Writers get through every chain (model 2's and 3's first included),
    // and every model retrains, the thawed one too.
    for k in (1..300u64).map(|i| i * 100 + 71) {
        s.insert(k, k).unwrap();
    }
    for m in 0..models {
        node.retrain_now(m).unwrap();
    }
    assert!(
        node.stats().agent.records_reused == 0,
        "no record reused inside the grace period"
    );
    for k in (1..300u64).map(|i| i * 100 + 71) {
        assert_eq!(s.get(k).unwrap(), Some(k));
    }
    eprintln!("found: every key read back; writes and retraining go on after the resume");
}

#[test]
fn files_that_are_not_pools_are_refused() {
    let missing = Scratch::new("kv-resume-missing.pool");
    let err = MemoryNode::resume(config(&missing)).unwrap_err();
    assert!(
        matches!(
            &err,
            MemoryNodeError::PoolFile {
                problem: PoolFileProblem::Missing,
                ..
            }
        ),
        "{err}"
    );
    let zeros = Scratch::new("kv-resume-zeros.pool");
    std::fs::write(&zeros.0, vec![0u8; 1 << 16]).unwrap();
    let err = MemoryNode::resume(config(&zeros)).unwrap_err();
    assert!(
        matches!(
            &err,
            MemoryNodeError::PoolFile {
                problem: PoolFileProblem::NotAPool {
                    why: NotAPool::Area(_)
                },
                ..
            }
        ),
        "{err}"
    );
    eprintln!("found: {err}");
    let err = MemoryNode::resume(MemoryNodeConfig::default()).unwrap_err();
    assert!(
        matches!(
            err,
            MemoryNodeError::BadConfig {
                field: "pool_file",
                ..
            }
        ),
        "{err}"
    );
}
