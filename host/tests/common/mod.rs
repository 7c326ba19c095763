//! Helpers shared by the store's end-to-end tests: the engine tests' own
//! helpers (waits bounded by a generous hang guard, never a timing
//! assertion; engines; regions), and small memory nodes.
#![allow(dead_code)]

#[path = "../../engine/tests/common/mod.rs"]
mod engine;
// Each test file uses a different part of these helpers, or none.
#[allow(unused_imports)]
pub use engine::*;

/// The order a loopback NIC keeps: which fabric's it stands in for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Everything in posting order (RC).
    Ordered,
    /// Nothing in order (EFA's SRD).
    Unordered,
    /// Writes in order among themselves, reads and atomics not
    /// (`tcp;ofi_rxm`).
    WritesInOrder,
}

impl Delivery {
    /// The loopback setting, its shuffle seeded with `seed`.
    pub fn loopback(self, seed: u64) -> Option<rolex_host::Unordered> {
        (self != Delivery::Ordered).then_some(rolex_host::Unordered {
            seed,
            window: 8,
            writes_in_order: self == Delivery::WritesInOrder,
        })
    }
}

/// 1,000 keys (0, 10, 20, …) in half-full leaves, no retraining thread:
/// keys 160 apart are in distinct leaves, and no write of a new key
/// splits.
pub fn half_full_node() -> (rolex_host::memnode::MemoryNode, Vec<(u64, u64)>) {
    half_full_node_of(1000)
}

/// A client of `node` on the loopback fabric — ordered (`None`), or
/// unordered with the shuffle of `seed` and `latency` of modelled latency
/// — whose model views never age out: for tests where nothing retrains,
/// so no record is retired or reused, and the age refresh (one more round
/// trip, a retry, on a loaded machine where a test outlives 500 ms) would
/// only blur the counts they assert.
pub fn steady_client(
    node: &rolex_host::memnode::MemoryNode,
    unordered: Option<(u64, std::time::Duration)>,
) -> rolex_host::kv::KvClient {
    match unordered {
        Some((seed, latency)) => steady_client_in(node, Delivery::Unordered, seed, latency),
        None => steady_client_in(node, Delivery::Ordered, 0, std::time::Duration::ZERO),
    }
}

/// [`steady_client`] on a loopback NIC keeping `order` (its shuffle
/// seeded with `seed`; `latency` modelled when not ordered).
pub fn steady_client_in(
    node: &rolex_host::memnode::MemoryNode,
    order: Delivery,
    seed: u64,
    latency: std::time::Duration,
) -> rolex_host::kv::KvClient {
    let mut engine = rolex_host::EngineConfig::default();
    if let Some(unordered) = order.loopback(seed) {
        engine.fabric = rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
            unordered: Some(unordered),
            latency,
            ..rolex_host::LoopbackConfig::default()
        });
    }
    rolex_host::kv::KvClient::connect(
        rolex_host::kv::KvClientConfig {
            engine,
            model_max_age: std::time::Duration::from_secs(3600),
            ..rolex_host::kv::KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap()
}

/// [`half_full_node`] with `n` keys.
pub fn half_full_node_of(n: u64) -> (rolex_host::memnode::MemoryNode, Vec<(u64, u64)>) {
    let pairs: Vec<(u64, u64)> = (0..n).map(|i| (i * 10, i)).collect();
    let node = rolex_host::memnode::MemoryNode::start(
        rolex_host::memnode::MemoryNodeConfig {
            fill: 0.5,
            retraining_thread: false,
            ..rolex_host::memnode::MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    (node, pairs)
}

/// `n` pairs `(i * gap + 1, i)`.
pub fn loaded(n: u64, gap: u64) -> Vec<(u64, u64)> {
    (0..n).map(|i| (i * gap + 1, i)).collect()
}

/// A memory node of 8-slot leaves and at most 32 leaves per model
/// holding `pairs`: a few thousand keys make several models.
pub fn eight_slot_node(pairs: &[(u64, u64)]) -> rolex_host::memnode::MemoryNode {
    rolex_host::memnode::MemoryNode::start(
        rolex_host::memnode::MemoryNodeConfig {
            leaf_slots: 8,
            max_model_leaves: 32,
            ..rolex_host::memnode::MemoryNodeConfig::default()
        },
        pairs,
    )
    .unwrap()
}

/// A cluster of `nodes` [`eight_slot_node`]s holding `pairs` in balanced
/// key ranges, node `i`'s client made by `connect(i, node)`.
pub fn cluster_with(
    pairs: &[(u64, u64)],
    nodes: usize,
    connect: impl Fn(usize, &rolex_host::memnode::MemoryNode) -> rolex_host::kv::KvClient,
) -> (
    Vec<rolex_host::memnode::MemoryNode>,
    rolex_host::kv::cluster::ClusterClient,
) {
    use rolex_host::kv::cluster::{ClusterClient, ClusterNode, PartitionMap};
    let keys: Vec<u64> = pairs.iter().map(|p| p.0).collect();
    let map = PartitionMap::balanced(&keys, nodes).unwrap();
    let mut mns = Vec::new();
    let mut clients = Vec::new();
    for i in 0..nodes {
        let (lo, hi) = map.range(i).unwrap();
        let mine: Vec<(u64, u64)> = pairs
            .iter()
            .copied()
            .filter(|&(k, _)| lo <= k && k <= hi)
            .collect();
        let node = eight_slot_node(&mine);
        let client = connect(i, &node);
        clients.push(ClusterNode {
            name: format!("node-{i}"),
            client,
        });
        mns.push(node);
    }
    (mns, ClusterClient::new(map, clients).unwrap())
}

/// A memory node with small leaves (4 slots, 3 keys each at load), ε = 4
/// and at most 8 leaves per model, so a few hundred keys make many models
/// and inserts split early; no retraining thread (tests retrain by hand).
pub fn small_kv_node(pairs: &[(u64, u64)]) -> rolex_host::memnode::MemoryNode {
    rolex_host::memnode::MemoryNode::start(
        rolex_host::memnode::MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.75,
            epsilon: 4,
            max_model_leaves: 8,
            retraining_thread: false,
            ..rolex_host::memnode::MemoryNodeConfig::default()
        },
        pairs,
    )
    .expect("small memory node")
}

/// Retrains model `m` while compute nodes run: `true` if it was retrained,
/// `false` if the freeze met a lock held past its deadline (the designed
/// outcome under contention: the agent thaws and retries later). Any other
/// error fails the test.
pub fn retrain_unless_busy(node: &rolex_host::memnode::MemoryNode, m: u64) -> bool {
    match node.retrain_now(m) {
        Ok(_) => true,
        Err(rolex_host::memnode::MemoryNodeError::Agent(
            rolex_host::memnode::AgentError::FreezeDeadline { .. },
        )) => false,
        Err(e) => panic!("retraining model {m}: {e}"),
    }
}

/// A tiny memory node whose models split and retrain all the time: leaves
/// of 2 slots loaded half full, models of at most 3 leaves, ε = 1, and a
/// retraining request at the second SLT slot.
pub fn churning_node(pairs: &[(u64, u64)]) -> rolex_host::memnode::MemoryNode {
    churning_node_with_grace(
        pairs,
        rolex_host::memnode::MemoryNodeConfig::default().record_grace,
    )
}

/// [`churning_node`] whose retired records and freed leaves are reused
/// after `grace` (its clients must refresh cached models well within it:
/// `KvClientConfig::model_max_age`).
pub fn churning_node_with_grace(
    pairs: &[(u64, u64)],
    grace: std::time::Duration,
) -> rolex_host::memnode::MemoryNode {
    rolex_host::memnode::MemoryNode::start(
        rolex_host::memnode::MemoryNodeConfig {
            record_grace: grace,
            ..churning_config()
        },
        pairs,
    )
    .expect("starting a small memory node")
}

/// The configuration of [`churning_node`].
pub fn churning_config() -> rolex_host::memnode::MemoryNodeConfig {
    rolex_host::memnode::MemoryNodeConfig {
        leaf_slots: 2,
        fill: 0.5,
        epsilon: 1,
        max_model_leaves: 3,
        retrain_trigger: 2,
        ..rolex_host::memnode::MemoryNodeConfig::default()
    }
}

/// Sets its flag when dropped: held in a thread scope whose threads run
/// until the flag is set (a retrainer), so that a panic of the scope's
/// own code — a worker's, passed on by its `join().unwrap()` — stops
/// them and fails the test instead of leaving the scope waiting for ever.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A concurrent run for the linearizability checker: `threads` threads,
/// dealt over `clients` round-robin, each run `ops` operations of
/// `one_op` (given its session, recorder, random source, thread and
/// operation number; it records what it does), while a retrainer thread
/// retrains every model of `node` again and again (stale caches are the
/// rule). Each thread waits twice mid-run for a retraining pass that
/// started after it asked, so every thread meets retrained models however
/// the threads are scheduled. Returns the history's check (panics if it
/// is not linearizable) and the retrainings the retrainer made.
pub fn run_history(
    node: &rolex_host::memnode::MemoryNode,
    clients: &[rolex_host::kv::KvClient],
    initial: &[(u64, u64)],
    (threads, ops, seed): (usize, u64, u64),
    one_op: impl Fn(
            &mut rolex_host::kv::KvSession,
            &mut rolex_checker::Recorder,
            &mut rand::rngs::StdRng,
            usize,
            u64,
        ) + Sync,
) -> (rolex_checker::Checked, u64) {
    use rand::SeedableRng;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
    let clock = std::sync::Arc::new(rolex_checker::Clock::new());
    let stop = AtomicBool::new(false);
    let passes = AtomicU64::new(0);
    let mut history = rolex_checker::History::new(initial.iter().copied());
    let retrains = std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        let retrainer = scope.spawn(|| {
            let mut n = 0u64;
            while !stop.load(SeqCst) {
                for m in 0..node.model_count() {
                    if retrain_unless_busy(node, m) {
                        n += 1;
                    }
                }
                passes.fetch_add(1, SeqCst);
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            n
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let client = clients[t % clients.len()].clone();
                let (clock, passes, one_op) = (clock.clone(), &passes, &one_op);
                scope.spawn(move || {
                    let mut s = client.session().unwrap();
                    let mut rec = rolex_checker::Recorder::new(t, clock);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 31 + t as u64);
                    for i in 0..ops {
                        if i == ops / 3 || i == 2 * ops / 3 {
                            wait_for_new_pass(passes);
                        }
                        one_op(&mut s, &mut rec, &mut rng, t, i);
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
        retrainer.join().unwrap()
    });
    let checked = history
        .check()
        .unwrap_or_else(|v| panic!("not linearizable: {v}"));
    (checked, retrains)
}

/// Waits (bounded: a hang guard, not a timing assertion) until the
/// retrainer finishes a pass that started after this call.
fn wait_for_new_pass(passes: &std::sync::atomic::AtomicU64) {
    use std::sync::atomic::Ordering::SeqCst;
    let seen = passes.load(SeqCst);
    let start = std::time::Instant::now();
    while passes.load(SeqCst) < seen + 2 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "the retrainer made no progress"
        );
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// One random operation over `key` for a history: get, insert, update,
/// delete, scan or range, by the weights `w` (in that order, out of their
/// sum), recorded in `rec`.
pub fn random_op(
    s: &mut rolex_host::kv::KvSession,
    rec: &mut rolex_checker::Recorder,
    rng: &mut rand::rngs::StdRng,
    (key, value): (u64, u64),
    w: [u32; 6],
) {
    use rand::Rng;
    use rolex_checker::{Call, Ret};
    let mut x = rng.gen_range(0..w.iter().sum::<u32>());
    let mut pick = 0;
    while x >= w[pick] {
        x -= w[pick];
        pick += 1;
    }
    match pick {
        0 => {
            let op = rec.invoke(Call::Get { key });
            let r = s.get(key).unwrap();
            rec.finish(op, Ret::Value(r));
        }
        1 => {
            let op = rec.invoke(Call::Insert { key, value });
            let r = s.insert(key, value).unwrap();
            rec.finish(op, Ret::Prior(r));
        }
        2 => {
            let op = rec.invoke(Call::Update { key, value });
            let r = s.update(key, value).unwrap();
            rec.finish(op, Ret::Prior(r));
        }
        3 => {
            let op = rec.invoke(Call::Delete { key });
            let r = s.delete(key).unwrap();
            rec.finish(op, Ret::Prior(r));
        }
        4 => {
            let n = rng.gen_range(1..8);
            let op = rec.invoke(Call::Scan { from: key, n });
            let r = s.scan(key, n).unwrap();
            rec.finish(op, Ret::Entries(r));
        }
        _ => {
            let hi = key + rng.gen_range(0..6u64) * 1000;
            let op = rec.invoke(Call::Range { lo: key, hi });
            let r = s.range(key, hi).unwrap();
            rec.finish(op, Ret::Entries(r));
        }
    }
}

/// The pool offsets of every leaf-table entry of every model of the pool
/// `mem` (the directory's records).
pub fn lt_entry_offsets(mem: &rolex_host::memnode::HostPool) -> Vec<u64> {
    use rolex_core::layout::{ModelRecord, Superblock};
    use rolex_dpu::PoolMemory;
    let mut sbb = [0u8; Superblock::SIZE as usize];
    mem.read(0, &mut sbb).unwrap();
    let sb = Superblock::read(&sbb).unwrap();
    let mut rb = [0u8; ModelRecord::SIZE as usize];
    let mut out = Vec::new();
    for m in 0..sb.model_count() {
        let at = mem.load(sb.directory_entry_offset(m).unwrap()).unwrap();
        mem.read(at, &mut rb).unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        out.extend((0..r.leaf_count()).map(|j| r.lt_entry_offset(j).unwrap()));
    }
    out
}

/// Locks every leaf-table entry of every model of the pool `mem` for
/// `owner` (with `mem`'s own atomics); returns how many.
pub fn plant_locks(
    mem: &rolex_host::memnode::HostPool,
    owner: rolex_core::entry::LockOwner,
) -> u64 {
    use rolex_core::entry::LtEntry;
    use rolex_dpu::PoolMemory;
    let offsets = lt_entry_offsets(mem);
    for &off in &offsets {
        let v = LtEntry::from_raw(mem.load(off).unwrap());
        assert_eq!(
            mem.cas(off, v.raw(), v.locked_by(owner).raw()).unwrap(),
            v.raw()
        );
    }
    offsets.len() as u64
}

/// What each thread of [`faulty_history`] counts: requests that failed,
/// and those of them that may have applied.
#[derive(Clone, Copy, Debug, Default)]
pub struct Failures {
    pub failed: u64,
    pub unknown: u64,
}

impl Failures {
    /// Counts one failed request (`maybe`: it may have applied).
    pub fn count(&mut self, maybe: bool) {
        self.failed += 1;
        self.unknown += u64::from(maybe);
    }
}

/// A client of `node` whose engine (`engine(faults)`) fails operations
/// with `probability`, owning its locks as `owner`. Connecting only reads:
/// it is tried again after a fault with the next fault seed (an engine
/// replays its seed's faults from the start, so the same seed could fail
/// the same read every time); `seed` and `client` pick the seeds.
pub fn faulty_client(
    node: &rolex_host::memnode::MemoryNode,
    (seed, client, probability): (u64, u64, f64),
    owner: rolex_core::entry::LockOwner,
    engine: impl Fn(rolex_host::Faults) -> rolex_host::EngineConfig,
) -> rolex_host::kv::KvClient {
    (0..1000u64)
        .find_map(|attempt| {
            let faults = rolex_host::Faults {
                probability,
                seed: seed * 1_000_003 + client * 1009 + attempt,
                torn: 0.0,
                tear_kills: false,
            };
            let cfg = rolex_host::kv::KvClientConfig {
                engine: engine(faults),
                lock_owner: owner,
                ..rolex_host::kv::KvClientConfig::default()
            };
            rolex_host::kv::KvClient::connect(cfg, &node.pool()).ok()
        })
        .expect("connecting under injected faults")
}

/// A concurrent run under injected faults for the linearizability
/// checker: four threads over `clients` (round-robin), each making
/// `calls` calls of `one_call` (given its session, recorder, random
/// source, thread and call number; it records what it does and counts
/// what failed), while a retrainer retrains every model of `node` again
/// and again. Each thread then flushes until its client holds no lock
/// maybe. Checked after: no client holds a lock maybe, no LT word is
/// locked by `owner`, and — every key of `keys` read back by a client
/// without faults (`read_back`, as the history records it) — the history
/// is linearizable (panics otherwise). Returns the check and the
/// failures.
pub fn faulty_history(
    node: &rolex_host::memnode::MemoryNode,
    clients: &[rolex_host::kv::KvClient],
    (initial, owner, seed): (&[(u64, u64)], rolex_core::entry::LockOwner, u64),
    calls: u64,
    one_call: impl Fn(
            &mut rolex_host::kv::KvSession,
            &mut rolex_checker::Recorder,
            &mut rand::rngs::StdRng,
            (usize, u64),
            &mut Failures,
        ) + Sync,
    (keys, read_back): (
        &[u64],
        impl Fn(&mut rolex_host::kv::KvSession, u64) -> Option<u64>,
    ),
) -> (rolex_checker::Checked, Failures) {
    use rand::SeedableRng;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let clock = std::sync::Arc::new(rolex_checker::Clock::new());
    let stop = AtomicBool::new(false);
    let mut history = rolex_checker::History::new(initial.iter().copied());
    let mut total = Failures::default();
    std::thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        let retrainer = scope.spawn(|| {
            while !stop.load(SeqCst) {
                for m in 0..node.model_count() {
                    let _ = node.retrain_now(m);
                }
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
        });
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let client = clients[t % clients.len()].clone();
                let (clock, one_call) = (clock.clone(), &one_call);
                scope.spawn(move || {
                    // Opening a session reads: a fault fails it, nothing
                    // else.
                    let mut s = (0..1000)
                        .find_map(|_| client.session().ok())
                        .expect("a session under injected faults");
                    let mut rec = rolex_checker::Recorder::new(t, clock);
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 17 + t as u64);
                    let mut f = Failures::default();
                    for i in 0..calls {
                        one_call(&mut s, &mut rec, &mut rng, (t, i), &mut f);
                    }
                    // Retries every lock this client may still hold.
                    for _ in 0..100 {
                        let _ = s.flush();
                        if client.locks_maybe_held() == 0 {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    (rec.into_records(), f)
                })
            })
            .collect();
        for w in workers {
            let (records, f) = w.join().unwrap();
            history.extend(records);
            total.failed += f.failed;
            total.unknown += f.unknown;
        }
        stop.store(true, SeqCst);
        retrainer.join().unwrap();
    });
    // Faults were injected (an operation whose torn write was written again
    // at once succeeds: count the NICs' errors, not the failed calls).
    let errors: u64 = clients.iter().map(|c| c.stats().engine.errors).sum();
    assert!(errors > 0, "seed {seed}: faults were injected");
    // A lock kept for repair waits for every other lock of this process
    // in its stripe (module `held` of rolex-kv): threads still working
    // when another flushed may have kept it; every thread is done now.
    for c in clients {
        let start = std::time::Instant::now();
        while c.locks_maybe_held() > 0 && start.elapsed() < HANG {
            if let Ok(mut s) = c.session() {
                let _ = s.flush();
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(c.locks_maybe_held(), 0, "seed {seed}: a lock maybe held");
    }
    assert_eq!(node.release_locks_of(owner).unwrap(), 0, "seed {seed}");
    let reader =
        rolex_host::kv::KvClient::connect(rolex_host::kv::KvClientConfig::default(), &node.pool())
            .unwrap();
    let mut s = reader.session().unwrap();
    let mut rec = rolex_checker::Recorder::new(4, clock.clone());
    for &key in keys {
        let op = rec.invoke(rolex_checker::Call::Get { key });
        let got = read_back(&mut s, key);
        rec.finish(op, rolex_checker::Ret::Value(got));
    }
    history.extend(rec.into_records());
    let checked = history
        .check()
        .unwrap_or_else(|v| panic!("seed {seed}: not linearizable: {v}"));
    (checked, total)
}

/// Value `id` of `key`, `len` bytes: the id's bytes, then a pattern of
/// key and id (a value shorter than 8 bytes is a prefix of that).
pub fn id_value(key: u64, id: u64, len: usize) -> Vec<u8> {
    let mut out = id.to_le_bytes().to_vec();
    let mut x = key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ id | 1;
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The id of `bytes` if they are a value [`id_value`] made for `key` (8
/// bytes or more: a load value is its 8-byte id).
pub fn value_id(key: u64, bytes: &[u8]) -> Option<u64> {
    let id = u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?);
    (id_value(key, id, bytes.len()) == bytes).then_some(id)
}

/// The value region's `free` word of `node` (the head of the space given
/// back).
pub fn free_word(node: &rolex_host::memnode::MemoryNode) -> u64 {
    use rolex_core::layout::{Superblock, ValueRegionHeader};
    let mh = node.pool_handle();
    let sb = Superblock::read(&mh.to_vec(0, Superblock::SIZE as usize).unwrap()).unwrap();
    mh.load_u64(sb.value_region_offset() + ValueRegionHeader::FREE_OFFSET)
        .unwrap()
}

/// `s` updates `k` to `v`, then `node` refuses operations for 2 ms, while
/// the update's posted unlock (with a few hundred µs of modelled latency)
/// is in flight: its unlock fails.
pub fn write_then_fail_its_unlock(
    node: &rolex_host::memnode::MemoryNode,
    s: &mut rolex_host::kv::KvSession,
    k: u64,
    v: u64,
) {
    s.update(k, v).unwrap();
    assert!(node.engine().set_failed(true), "loopback fails peers");
    std::thread::sleep(std::time::Duration::from_millis(2));
    assert!(node.engine().set_failed(false));
}

/// Six keys of a [`half_full_node`] (whose pairs are `loaded`), two in
/// each of three leaves (keys 160 apart are in distinct leaves), one of
/// each two loaded: the keys, and the loaded pairs among them.
pub fn two_keys_in_each_of_three_leaves(loaded: &[(u64, u64)]) -> (Vec<u64>, Vec<(u64, u64)>) {
    let keys: Vec<u64> = [100u64, 260, 420]
        .iter()
        .flat_map(|&k| [k, k + 5])
        .collect();
    let initial = loaded
        .iter()
        .copied()
        .filter(|p| keys.contains(&p.0))
        .collect();
    (keys, initial)
}

/// A memory node of 8-slot leaves (at most 32 per model) holding `pairs`
/// with byte values (`value(key, id)` for the pair `(key, id)`) and
/// `value_spare` bytes of value space.
pub fn value_node(
    pairs: &[(u64, u64)],
    value_spare: u64,
    value: impl Fn(u64, u64) -> Vec<u8>,
) -> rolex_host::memnode::MemoryNode {
    rolex_host::memnode::MemoryNode::start_with_values(
        rolex_host::memnode::MemoryNodeConfig {
            leaf_slots: 8,
            max_model_leaves: 32,
            value_spare: Some(value_spare),
            ..rolex_host::memnode::MemoryNodeConfig::default()
        },
        pairs,
        &mut |k, id, out| out.extend_from_slice(&value(k, id)),
    )
    .unwrap()
}

/// A scratch file in the temporary directory, named for this process and
/// `name`, removed on drop (a pool file for the resume tests).
pub struct Scratch(pub std::path::PathBuf);

impl Scratch {
    /// The scratch file `name` (not created).
    pub fn new(name: &str) -> Self {
        Self(std::env::temp_dir().join(format!("rolex-{}-{name}", std::process::id())))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A client of `node` on the loopback fabric — ordered, or unordered with
/// `unordered`'s shuffle seed — with `latency` of modelled latency, whose
/// cached views count as fresh for `model_max_age`.
pub fn loopback_client(
    node: &rolex_host::memnode::MemoryNode,
    unordered: Option<u64>,
    latency: std::time::Duration,
    model_max_age: std::time::Duration,
) -> rolex_host::kv::KvClient {
    let engine = rolex_host::EngineConfig {
        fabric: rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
            unordered: unordered.map(|seed| rolex_host::Unordered {
                seed,
                window: 8,
                writes_in_order: false,
            }),
            latency,
            ..rolex_host::LoopbackConfig::default()
        }),
        ..rolex_host::EngineConfig::default()
    };
    rolex_host::kv::KvClient::connect(
        rolex_host::kv::KvClientConfig {
            engine,
            model_max_age,
            ..rolex_host::kv::KvClientConfig::default()
        },
        &node.pool(),
    )
    .expect("connecting a loopback client")
}

/// A node configuration for churn at its hardest: leaves of 4 slots
/// loaded half full, models of at most 8 leaves (cut past 16) retrained
/// at 2 SLT slots, records and freed leaves reused after `grace`, room
/// for many records, leaves and values; the agent's own thread on or off.
pub fn tiny_churn_config(
    thread: bool,
    grace: std::time::Duration,
) -> rolex_host::memnode::MemoryNodeConfig {
    rolex_host::memnode::MemoryNodeConfig {
        leaf_slots: 4,
        fill: 0.5,
        epsilon: 2,
        max_model_leaves: 8,
        retrain_trigger: 2,
        retraining_thread: thread,
        record_grace: grace,
        spare_leaf_factor: 40.0,
        model_region_spare: Some(64 << 20),
        value_spare: Some(32 << 20),
        ..rolex_host::memnode::MemoryNodeConfig::default()
    }
}

/// Retrains every model of `node`, waiting `wait` after a freeze that met
/// a lock or a model region full of records retired too recently (100
/// tries each at most; any other error fails the test).
pub fn retrain_all(node: &rolex_host::memnode::MemoryNode, wait: std::time::Duration) {
    use rolex_host::memnode::{AgentError, MemoryNodeError};
    for m in 0..node.model_count() {
        for tries in 0.. {
            match node.retrain_now(m) {
                Ok(_) => break,
                Err(MemoryNodeError::Agent(
                    AgentError::FreezeDeadline { .. } | AgentError::ModelRegionFull { .. },
                )) if tries < 100 => std::thread::sleep(wait),
                Err(e) => panic!("retraining model {m}: {e}"),
            }
        }
    }
}
