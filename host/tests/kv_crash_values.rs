//! Value-region and leaf failures a memory node's death can leave.
//!
//! A memory node killed while a compute node's leaf write was landing,
//! in-process on the loopback fabric with a file-backed pool: the leaf
//! is left *torn* — the first part of the write applied, the rest not,
//! as a software fabric that copies a write's payload into the pool
//! (`ofi_rxm` over `tcp`, in the memory node's own process) leaves it when
//! `SIGKILL` stops that copy part-way. The write was not acknowledged, but
//! the leaf also holds keys whose writes were: the resume
//! (`MemoryNode::resume`) must still serve every one of them.
//!
//! A leaf is written in place, sorted, so a torn insert can overwrite a
//! neighbour's slot with the shifted next one: no repair from the leaf's
//! bytes alone can bring that key back. The write's redo copy does
//! (`rolex_core::layout::redo`): the client wrote it whole just before the
//! leaf, and the resume writes it over the torn leaf of a chain the dead
//! node's client still locked, before it releases compute locks. The test
//! tears each leaf after its put returned (the copy is then the newest
//! naming it) and locks its chain as the writer's death before the unlock
//! would have left it. (Without a copy — an unordered fabric, no free
//! block — the resume still reports such a leaf as damaged, every key it
//! held unreadable.)
//!
//! A leaf so damaged fails the gets of its keys within a bound, naming
//! the leaf (`KvError::Leaf`), rather than spinning through every re-read
//! a torn leaf is allowed (about a minute of backed-off reads each); a
//! value block the leaf names that stays wrong likewise
//! (`KvError::BadValuePointer`, where it used to take minutes).
//!
//! And a chunk claim that runs past the end of the value region takes
//! the bytes left there instead of leaving them to no one (a writer killed
//! after such a claim, or any other client, then found the region full
//! with up to a chunk unused: `tools/tests/crash_values.rs`).

mod common;

use common::Scratch;

use rolex_core::layout::Superblock;
use rolex_dpu::PoolMemory;
use rolex_host::kv::{KvClient, KvClientConfig, KvError};
use rolex_host::memnode::{HostPool, MemoryNode, MemoryNodeConfig};

fn config(file: &Scratch) -> MemoryNodeConfig {
    MemoryNodeConfig {
        leaf_slots: 8,
        fill: 0.5,
        max_model_leaves: 32,
        retraining_thread: false,
        value_spare: Some(4 << 20),
        pool_file: Some(file.0.clone()),
        ..MemoryNodeConfig::default()
    }
}

/// Version `ver` of `key`'s value: 8..=300 bytes naming both.
fn value(key: u64, ver: u64) -> Vec<u8> {
    let len = 8 + ((key.wrapping_mul(31) ^ ver.wrapping_mul(0x9e37)) % 293) as usize;
    let mut v: Vec<u8> = (0..len as u64)
        .map(|i| (key ^ ver.rotate_left(9) ^ i.wrapping_mul(131)) as u8)
        .collect();
    if len >= 16 {
        v[..8].copy_from_slice(&key.to_le_bytes());
        v[8..16].copy_from_slice(&ver.to_le_bytes());
    }
    v
}

/// The leaf region's bytes: (its pool offset, the bytes).
fn leaf_region(mem: &HostPool) -> (u64, Vec<u8>) {
    let mut sbb = [0u8; Superblock::SIZE as usize];
    mem.read(0, &mut sbb).unwrap();
    let sb = Superblock::read(&sbb).unwrap();
    let (at, len) = (sb.leaf_region_offset(), sb.leaf_region_len());
    let mut b = vec![0u8; len as usize];
    mem.read(at, &mut b).unwrap();
    (at, b)
}

/// Locks, as the anonymous owner (the in-process clients'), the chain of
/// the leaf holding pool byte `byte` (a leaf a write was torn in).
fn lock_chain_of(mem: &HostPool, byte: u64) {
    use rolex_core::entry::{LockOwner, LtEntry};
    use rolex_core::layout::Leaf;
    let mut sbb = [0u8; Superblock::SIZE as usize];
    mem.read(0, &mut sbb).unwrap();
    let region = Superblock::read(&sbb).unwrap().leaf_region().unwrap();
    let size = region.leaf_size();
    for lt in common::lt_entry_offsets(mem) {
        let head = LtEntry::from_raw(mem.load(lt).unwrap());
        // The chain: the head's leaf, then each leaf's synonym link.
        let mut e = head;
        for _ in 0..64 {
            let off = region.leaf_offset(e.addr()).unwrap();
            if (off..off + size).contains(&byte) {
                mem.store(lt, head.locked_by(LockOwner::ANONYMOUS).raw())
                    .unwrap();
                return;
            }
            let mut lb = vec![0u8; size as usize];
            mem.read(off, &mut lb).unwrap();
            match Leaf::from_bytes(&lb) {
                Ok(leaf) if leaf.next().pointer() != 0 => e = leaf.next(),
                _ => break,
            }
        }
    }
    panic!("no chain holds pool byte {byte}");
}

/// Puts to keys whose leaves hold acknowledged values; each leaf write is
/// torn at `cut` (a fraction of the bytes it changed) and the node
/// resumed: returns (the keys whose acknowledged value was not served,
/// described; leaves the resume found damaged).
fn torn_leaf_writes_then_resume(name: &str, cut: f64) -> (Vec<String>, u64) {
    let file = Scratch::new(name);
    let pairs: Vec<(u64, u64)> = (1..=400u64).map(|i| (i * 100, 1)).collect();
    let node = MemoryNode::start_with_values(config(&file), &pairs, &mut |k, ver, out| {
        out.extend_from_slice(&value(k, ver))
    })
    .unwrap();
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    // Acknowledged: a new version of every loaded key, and fresh keys.
    let mut acked: Vec<(u64, u64)> = pairs.iter().map(|&(k, _)| (k, 2)).collect();
    acked.extend((1..400u64).step_by(3).map(|i| (i * 100 + 50, 2)));
    for &(k, ver) in &acked {
        s.put(k, &value(k, ver)).unwrap();
    }
    // Puts to keys far apart, acknowledged; the last one is the write the
    // death tears (a death tears only writes in flight, and this client
    // has one at a time: the redo slot of a write that completed is
    // reused by the next).
    let mem = HostPool::new(node.pool_handle().clone());
    let mut torn = Vec::new();
    let keys: Vec<u64> = (7..400u64).step_by(40).map(|i| i * 100).collect();
    for (n, &key) in keys.iter().enumerate() {
        let (at, before) = leaf_region(&mem);
        s.put(key, &value(key, 3)).unwrap();
        if n + 1 < keys.len() {
            if let Some(a) = acked.iter_mut().find(|a| a.0 == key) {
                a.1 = 3;
            }
            continue;
        }
        let (_, after) = leaf_region(&mem);
        let changed: Vec<usize> = (0..before.len())
            .filter(|&j| before[j] != after[j])
            .collect();
        let (first, last) = (changed[0], *changed.last().unwrap());
        let keep = first + ((last + 1 - first) as f64 * cut) as usize;
        mem.write(at + keep as u64, &before[keep..=last]).unwrap();
        // The death came before the unlock: the chain is still locked by
        // the writer (an in-process client: the anonymous owner).
        lock_chain_of(&mem, at + first as u64);
        torn.push((key, first, last, keep));
    }
    eprintln!(
        "injected: {} leaf writes torn after {:.0}% of the bytes they changed (first: {:?})",
        torn.len(),
        cut * 100.0,
        torn[0]
    );
    // The memory node dies with its in-process client: nothing of the
    // client is closed (its redo block stays claimed, as at a death).
    client.abandon_values();
    drop(s);
    drop(client);
    drop(mem);
    drop(node);

    let (node, rec) = MemoryNode::resume(config(&file)).unwrap();
    eprintln!(
        "found: resume: {} leaves, {} keys, {} damaged (first: {:?}), untiled {:?}",
        rec.leaves,
        rec.keys,
        rec.damaged_count,
        rec.damaged.first(),
        rec.untiled
    );
    assert_eq!(
        rec.restored_count,
        torn.len() as u64,
        "each torn leaf written again from its copy: {:?}",
        rec.restored
    );
    if rec.damaged_count > 0 {
        // A get of a key there fails (after 2 s of re-reads).
        return (
            vec![format!("{} leaves damaged", rec.damaged_count)],
            rec.damaged_count,
        );
    }
    let client = KvClient::connect(
        KvClientConfig {
            max_attempts: 2000,
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap();
    let mut s = client.session().unwrap();
    let mut lost = Vec::new();
    for &(k, ver) in &acked {
        let torn_here = torn.iter().any(|t| t.0 == k);
        match s.get_value(k) {
            Ok(Some(v)) if v == value(k, ver) => {}
            Ok(Some(v)) if torn_here && v == value(k, 3) => {}
            other => lost.push(format!("key {k}: {:?}", other.map(|o| o.map(|v| v.len())))),
        }
    }
    eprintln!(
        "found: {} of {} acknowledged values served",
        acked.len() - lost.len(),
        acked.len()
    );
    (lost, rec.damaged_count)
}

#[test]
fn a_leaf_write_torn_by_the_death_loses_no_acknowledged_neighbour() {
    for (name, cut) in [("torn-half.pool", 0.5), ("torn-most.pool", 0.9)] {
        let (lost, damaged) = torn_leaf_writes_then_resume(name, cut);
        assert!(
            lost.is_empty(),
            "{} acknowledged values lost ({damaged} leaves damaged): {:?}",
            lost.len(),
            &lost[..lost.len().min(10)]
        );
    }
}

/// A chunk claim that runs past the end of the value region (its `FAA`
/// moved `alloc` past the capacity) still leaves the bytes from where it
/// started to the end to its client alone: they are taken, not left
/// unused by everyone until a resume. Values of one length fill the
/// region to within a block before a write fails with `ValueSpaceFull`.
#[test]
fn a_claim_past_the_end_of_the_value_region_takes_what_is_left() {
    let pairs: Vec<(u64, u64)> = (0..2000u64).map(|i| (i * 10, i)).collect();
    let node = MemoryNode::start(
        MemoryNodeConfig {
            value_spare: Some(3 << 19),
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let len = 1000;
    let class = rolex_core::layout::block_class(len).unwrap();
    let mut written = 0u64;
    let capacity = loop {
        let (k, _) = pairs[written as usize];
        match s.put(k, &value(k, 5)[..8].repeat(len / 8 + 1)[..len]) {
            Ok(_) => written += 1,
            Err(rolex_host::kv::KvError::ValueSpaceFull { capacity, .. }) => break capacity,
            Err(e) => panic!("put {written}: {e}"),
        }
    };
    eprintln!(
        "found: {written} values of {len} B ({class} B blocks, {} B) before ValueSpaceFull, \
         in a block area of {capacity} B",
        written * class
    );
    assert!(
        written * class + class > capacity,
        "{} B of {capacity} B left unused",
        capacity - written * class
    );
    for &(k, _) in &pairs[..written as usize] {
        assert_eq!(s.get_value(k).unwrap().map(|v| v.len()), Some(len));
    }
}

/// A leaf that stays torn — one byte of a slot it holds flipped, as a
/// write torn by a crash leaves it — fails a get of its key with
/// `KvError::Leaf` naming a leaf of the key's model (after a bounded time
/// of re-reads: a live writer's torn state lasts microseconds), where it
/// used to re-read it 100,000 times, backing off, and then fail with
/// `TooManyRetries`; gets of keys in other leaves still answer.
#[test]
fn a_leaf_torn_for_good_fails_its_gets_naming_it() {
    let pairs: Vec<(u64, u64)> = (1..=400u64).map(|i| (i * 100, i)).collect();
    let node = MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 8,
            fill: 0.5,
            retraining_thread: false,
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let mem = HostPool::new(node.pool_handle().clone());
    // The bytes an update of `key` changes lie in its leaf: flip one.
    let key = 20_000;
    let (at, before) = leaf_region(&mem);
    s.update(key, 7).unwrap();
    let (_, after) = leaf_region(&mem);
    let changed = (0..before.len()).find(|&j| before[j] != after[j]).unwrap();
    mem.write(at + changed as u64, &[after[changed] ^ 0x5a])
        .unwrap();
    match s.get(key) {
        Err(KvError::Leaf { leaf, error, .. }) => {
            eprintln!("found: {key}: leaf {leaf:?}: {error}")
        }
        other => panic!("a get of {key} in a torn leaf: {other:?}"),
    }
    // Far from it: still served.
    assert_eq!(s.get(100).unwrap(), Some(1));
    assert_eq!(s.get(40_000).unwrap(), Some(400));
}

/// A value block that stays wrong — a byte of its header flipped, so it
/// fails its checksum while the leaf still names it — fails a get of its
/// key with `KvError::BadValuePointer` naming it, after a bounded time of
/// re-reads (a block is freed only once no leaf names it: a wrong one the
/// leaf keeps naming is damage, not a race), where it used to re-read it
/// up to `max_attempts` (a million) times, backing off, for minutes.
#[test]
fn a_value_block_wrong_for_good_fails_its_gets_naming_it() {
    let pairs: Vec<(u64, u64)> = (1..=400u64).map(|i| (i * 100, i)).collect();
    let node = MemoryNode::start(
        MemoryNodeConfig {
            retraining_thread: false,
            value_spare: Some(1 << 20),
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let (key, v) = (20_000, value(20_000, 9));
    assert!(v.len() > 16, "out of line");
    s.put(key, &v).unwrap();
    s.put(30_000, &value(30_000, 9)).unwrap();
    // The block holds the value's bytes right after its header: flip the
    // header's last byte.
    let mem = HostPool::new(node.pool_handle().clone());
    let mut pool = vec![0u8; node.pool_handle().len() as usize];
    mem.read(0, &mut pool).unwrap();
    let at = pool
        .windows(v.len())
        .position(|w| w == v.as_slice())
        .unwrap() as u64;
    let mut b = [0u8; 1];
    mem.read(at - 1, &mut b).unwrap();
    mem.write(at - 1, &[b[0] ^ 0x5a]).unwrap();
    match s.get_value(key) {
        Err(KvError::BadValuePointer { key: k, offset, .. }) => {
            assert_eq!(k, key);
            eprintln!("found: {key}: block at {offset} reported")
        }
        other => panic!("a get of {key} whose block is damaged: {other:?}"),
    }
    // Another key's value: still served.
    assert_eq!(s.get_value(30_000).unwrap(), Some(value(30_000, 9)));
}
