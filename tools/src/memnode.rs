//! `rolex memnode`: runs a memory node (pool, retraining agent) on the
//! loopback fabric with the agent pinned to a core budget, and reports
//! what the agent costs: retrainings, keys retrained per second, how long
//! models stayed frozen (p50/p99/max), and the agent's CPU time.
//!
//! Two phases. First every model is retrained `--rounds` times back to
//! back (the retraining throughput on one core: keys per second of the
//! calling thread's CPU time). Then `--clients` local compute-node threads
//! insert fresh keys for `--duration` seconds while the agent's own thread
//! (pinned to `--cores` CPUs) retrains models as their SLTs fill; the
//! agent's CPU per million inserts comes from that phase. Every inserted
//! key is read back at the end. The insert phase's report gives the
//! retraining throughput (keys and retrainings per second of the agent's
//! busy time — wall time inside retraining steps — and retrainings per
//! second of the phase) and the model region's use (retired records, reuse,
//! retrainings refused for want of room).
//!
//! With `--fabric libfabric:PROVIDER --listen ADDR:PORT` (or `--fabric
//! verbs[:DEVICE]` in a build with the verbs backend) it instead serves
//! the pool to compute nodes in other processes (`rolex bench --memnode`):
//! it loads the data set (values as `rolex bench` loads them), offers the
//! pool's descriptor, its engine's address and the layout version over the
//! bootstrap connection to clients presenting `--token`, with a
//! description of the data set attached ([`DataSetDesc`]), prints
//! `memory node listening on ADDR:PORT …` as its first stdout line, and
//! runs (retraining agent and the engine's progress) until it is
//! terminated by a signal (SIGINT, SIGTERM or SIGKILL: the default
//! dispositions are the clean stop). Meanwhile each progress line on
//! stderr gives the same throughput since the previous line, and the model
//! region's use.
//!
//! Serving with `--pool-file PATH` keeps the pool in that file (mapped
//! shared, behind the agent area) and the data set's description next to
//! it, in `PATH.dataset` ([`DataSetDesc`]'s text form without the lease
//! port). After the process died, however it died, `--resume` serves the
//! same file again: `MemoryNode::resume` validates and recovers the pool
//! (an interrupted retraining finished or undone, every compute node's
//! chain lock released — compute nodes connect afresh), and the offer
//! carries the stored description, so compute nodes given the original
//! data-set arguments are accepted. The pool's shape comes from the file;
//! data-set arguments given with `--resume` must match the stored ones.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rand::{Rng, SeedableRng};
use rolex_core::entry::LockOwner;
use rolex_core::layout::RedoRegion;
use rolex_host::domain::fabric::bootstrap::{Bootstrap, BootstrapServer};
use rolex_host::kv::{KvClient, KvClientConfig, PartitionMap};
use rolex_host::memnode::{AgentStats, AtomicsRoute, DamagedLeaf, MemoryNode, MemoryNodeConfig};
use rolex_host::memnode::{LeaseConfig, LeaseKeys, LeaseServer, PoolKeys};
use rolex_host::Fabric;

use crate::cpu::{share, CpuWindow};
use crate::data_set_desc::{key_hash, DataSetDesc, Shard};
use crate::dataset::{DataSetArgs, EmptyFile};
use crate::fabric::{
    libfabric_engine, parse_fabric, serving_node, verbs_kv_engine, FabricArg, VerbsArgs,
};
use crate::values::ValueSize;
use crate::ycsb;

/// The keys of `keys` (sorted) in `map`'s range `node`.
pub fn range_of<'a>(keys: &'a [u64], map: &PartitionMap, node: usize) -> &'a [u64] {
    let (lo, hi) = map.range(node).unwrap_or((1, 0));
    let a = keys.partition_point(|&k| k < lo);
    let b = keys.partition_point(|&k| k <= hi);
    &keys[a..b.max(a)]
}

/// Arguments of `rolex memnode`.
#[derive(Debug, Args)]
#[command(mut_arg("seed", |a| a.help("Seed of the generator and of the inserted keys")))]
pub struct MemnodeArgs {
    #[command(flatten)]
    data: DataSetArgs,
    /// CPUs the retraining agent is pinned to (its core budget).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    cores: u64,
    /// Seconds of the insert phase.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Compute-node threads inserting during the insert phase (0: none).
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Times every model is retrained in the throughput phase (0: skip).
    #[arg(long, default_value_t = 1)]
    rounds: u32,
    /// Slots per leaf.
    #[arg(long, default_value_t = 16)]
    leaf_slots: u32,
    /// SLT slots that make the agent retrain a model on its own (each
    /// retraining also merges emptied and underfull leaves away).
    #[arg(long, default_value_t = 32)]
    trigger: u64,
    /// µs between two looks of the retraining agent at every model's SLT
    /// header (what finds a model due whose CirQ ticket was lost, or whose
    /// trigger is below the compute nodes' own); in between it looks only
    /// at the models queued and those found due. A model is found due at
    /// most this late; each look costs a cache miss per model (0: look at
    /// every poll).
    #[arg(long, value_name = "US", default_value_t = duration_us(MemoryNodeConfig::default().slt_scan_every),
          value_parser = clap::value_parser!(u64).range(0..=60_000_000), allow_negative_numbers = true)]
    slt_scan_every_us: u64,
    /// ms between two of the agent's idle sweep walks (which merge emptied
    /// and underfull leaves away) that retrained nothing; a walk that
    /// retrained its model is followed by the next at once (0: walk at
    /// every idle poll, a whole model read each).
    #[arg(long, value_name = "MS", default_value_t = duration_ms(MemoryNodeConfig::default().sweep_every),
          value_parser = clap::value_parser!(u64).range(0..=3_600_000), allow_negative_numbers = true)]
    sweep_every_ms: u64,
    /// Synonym-leaf room, as a multiple of the loaded leaves.
    #[arg(long, default_value_t = 2.0)]
    spare_leaves: f64,
    /// Blocks of the redo log: compute clients connected at once whose
    /// leaf writes are first copied whole into the pool, so that a leaf
    /// torn by a death (a compute node's, or this node's) is written again
    /// whole before its chain is released (a client finding no block free
    /// writes without a copy). Costs pool memory, 8 bytes a block plus
    /// `--redo-slots` slots of a leaf and 40 bytes each (64 x 64 slots of
    /// 16-slot leaves: about 2 MiB), and every leaf write carries the leaf
    /// twice (no extra round trip). 0 disables the redo log. With
    /// `--resume` the pool file's are kept.
    #[arg(long, value_name = "N", default_value_t = MemoryNodeConfig::default().redo_blocks,
          value_parser = clap::value_parser!(u32).range(0..=65536), conflicts_with = "resume")]
    redo_blocks: u32,
    /// Slots of each redo block: leaf writes one client keeps in flight,
    /// and failed ones not yet written again (at least 1).
    #[arg(long, value_name = "N", default_value_t = MemoryNodeConfig::default().redo_slots,
          value_parser = clap::value_parser!(u32).range(1..=65536), conflicts_with = "resume")]
    redo_slots: u32,
    /// Lay the pool out in this file (agent area, then pool; created or
    /// emptied) so `rolex inspect` or the firmware image can read it, and,
    /// with `--fabric`, so that a node that died can be restarted on it
    /// with `--resume` (its data-set description goes to FILE.dataset).
    #[arg(long, value_name = "FILE")]
    pool_file: Option<PathBuf>,
    /// With `--fabric` and `--pool-file`: serve the pool a memory node left
    /// in that file when its process died, instead of loading a data set.
    /// The pool is checked (layout version, directory, leaves) and
    /// recovered: a retraining the death interrupted is finished or
    /// undone, and every compute node's chain lock is released (compute
    /// nodes reconnect). Data-set arguments are optional; given, they must
    /// match the pool's. Pool-shape arguments are taken from the file.
    #[arg(long)]
    resume: bool,
    /// Fill factor of the leaves at load [default: the store's].
    #[arg(long)]
    fill: Option<f64>,
    /// Error bound of the models, in key positions [default: the store's].
    #[arg(long)]
    epsilon: Option<u64>,
    /// Serve the pool to other processes on this fabric
    /// (`libfabric:PROVIDER`, or `verbs[:DEVICE]` in a build with
    /// `--features verbs`) until terminated, instead of measuring.
    #[arg(long, value_parser = parse_fabric, requires = "listen")]
    fabric: Option<FabricArg>,
    #[command(flatten)]
    verbs: VerbsArgs,
    /// Bootstrap address to listen on with `--fabric` (`ADDR:PORT`; port
    /// 0 picks a free one, printed on the first line).
    #[arg(long, requires = "fabric")]
    listen: Option<String>,
    /// Shared token compute nodes must present.
    #[arg(long, default_value = "rolex")]
    token: String,
    /// Node (IP address) libfabric endpoints open on (default: the
    /// `--listen` address; unused by `shm`).
    #[arg(long)]
    node: Option<String>,
    /// libfabric: the engine reads the queue without pause (yielding the
    /// CPU between reads) for this many µs after the last activity, then
    /// sleeps on the provider's wait object, which wakes it when bytes
    /// arrive (0: always sleep there). Latency against CPU: the memory
    /// node prints what serving costs every 5 s while it serves.
    #[arg(long, default_value_t = 200)]
    busy_poll_us: u64,
    /// libfabric without a wait descriptor (`shm`): µs between queue reads
    /// of the serving memory node when idle. One-sided operations aimed at
    /// this node only progress while it reads its queue and produce no
    /// completion here, so this bounds the extra latency every compute-node
    /// operation may wait (0: read without pause, one core busy). `tcp`
    /// wakes on arriving bytes instead and ignores it.
    #[arg(long, default_value_t = 20)]
    idle_poll_us: u64,
    /// Value size of the loaded data set, in bytes: `B`, or `MIN..MAX` (a
    /// length per key, as `rolex bench --value-size` draws it). Values over
    /// 8 bytes are laid out in value blocks.
    #[arg(long, default_value = "8", value_name = "B|MIN..MAX")]
    value_size: ValueSize,
    /// MiB of value region beyond the loaded values, for the values
    /// compute nodes write [default: half the loaded values, at least 16].
    #[arg(long, value_name = "MIB")]
    value_spare: Option<u64>,
    /// Where the node applies its own atomics on pool words that compute
    /// nodes CAS (locks, the CirQ, counters): `auto` through its NIC where
    /// the device's atomics are atomic only among NIC operations
    /// (ConnectX) or emulated by this CPU (EFA), else CPU atomics; `cpu`
    /// or `nic` to force one.
    #[arg(long, value_enum, default_value = "auto")]
    atomics: Atomics,
    /// With `--fabric`: serve node I of a cluster of N memory nodes, which
    /// holds the I-th of N key ranges of equal key counts (the data set's
    /// quantiles); every node is given the same data set, and `rolex bench
    /// --memnode A,B,…` names them in shard order.
    #[arg(long, value_name = "I/N", requires = "fabric")]
    shard: Option<Shard>,
}

/// A default duration as whole µs, for a flag's default value.
fn duration_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A default duration as whole ms, for a flag's default value.
fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `--atomics`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Atomics {
    /// As the NIC needs.
    Auto,
    /// CPU atomics.
    Cpu,
    /// Through the node's own NIC.
    Nic,
}

impl From<Atomics> for AtomicsRoute {
    fn from(a: Atomics) -> Self {
        match a {
            Atomics::Auto => AtomicsRoute::Auto,
            Atomics::Cpu => AtomicsRoute::Cpu,
            Atomics::Nic => AtomicsRoute::Nic,
        }
    }
}

/// Bytes of the redo log `--redo-blocks` and `--redo-slots` ask for
/// (0: none), refused when they do not fit the pool's 64-bit offsets.
fn redo_log_bytes(args: &MemnodeArgs) -> Result<u64, String> {
    RedoRegion::len_for(args.redo_blocks, args.redo_slots, args.leaf_slots).map_err(|e| {
        format!(
            "--redo-blocks {} --redo-slots {} with --leaf-slots {}: {e} (fewer blocks or \
             slots; --redo-blocks 0 disables the redo log)",
            args.redo_blocks, args.redo_slots, args.leaf_slots
        )
    })
}

/// The line for a leaf found torn in a chain whose holder died (`who`
/// says how): written again whole from its redo copy, or left torn.
fn torn_line(who: &str, d: &DamagedLeaf) -> String {
    let leaf = format!(
        "leaf {} of region {} (model {})",
        d.leaf.leaf(),
        d.leaf.region(),
        d.model_id
    );
    match d.restored {
        Some(r) => format!(
            "{who}: {leaf} was torn ({}); written again whole from its redo copy \
             (holder {}, seq {}), its chain is released",
            d.error, r.owner.0, r.seq
        ),
        None => format!(
            "{who}: {leaf} was left torn ({}) and has no redo copy; its chain is released, \
             the leaf's keys are unreadable",
            d.error
        ),
    }
}

/// Percentiles of a set of freeze times, in µs.
fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// Runs `rolex memnode`.
pub fn run(args: MemnodeArgs) -> Result<(), Box<dyn std::error::Error>> {
    // Refuse a fabric that cannot serve before loading anything.
    match &args.fabric {
        Some(FabricArg::Loopback) => {
            return Err(
                "--fabric loopback: a memory node serves other processes over \
                        libfabric:PROVIDER or verbs (leave --fabric out to measure in-process)"
                    .into(),
            )
        }
        Some(FabricArg::Verbs(_)) if !cfg!(feature = "verbs") => {
            return Err(format!("--fabric verbs: {}", crate::fabric::NO_VERBS).into())
        }
        _ => {}
    }
    if !args.resume {
        redo_log_bytes(&args)?;
    }
    if args.resume {
        let Some(path) = &args.pool_file else {
            return Err("--resume needs --pool-file PATH: the pool file to resume".into());
        };
        let Some(fabric) = &args.fabric else {
            return Err("--resume serves the pool: give --fabric and --listen too".into());
        };
        return serve(&args, fabric, Pool::Resume(path));
    }
    // An empty key file loads an empty pool, as it always has.
    let keys = args.data.load(0, EmptyFile::Accept)?;
    if let Some(fabric) = &args.fabric {
        return serve(&args, fabric, Pool::Load(keys));
    }
    if !(args.duration.is_finite() && args.duration >= 0.0) {
        return Err(format!("--duration {} is not a number of seconds", args.duration).into());
    }
    let pairs: Vec<(u64, u64)> = keys.iter().map(|&k| (k, k ^ 0x5555)).collect();
    let cfg = MemoryNodeConfig {
        leaf_slots: args.leaf_slots,
        retrain_trigger: args.trigger,
        redo_blocks: args.redo_blocks,
        redo_slots: args.redo_slots,
        cores: args.cores as usize,
        pool_file: args.pool_file.clone(),
        spare_leaf_factor: args.spare_leaves,
        fill: args.fill.unwrap_or(MemoryNodeConfig::default().fill),
        epsilon: args.epsilon.unwrap_or(MemoryNodeConfig::default().epsilon),
        slt_scan_every: Duration::from_micros(args.slt_scan_every_us),
        sweep_every: Duration::from_millis(args.sweep_every_ms),
        ..MemoryNodeConfig::default()
    };
    let t = Instant::now();
    let node = MemoryNode::start(cfg, &pairs)?;
    println!(
        "memory node: {} keys in {} models, pool {:.1} MiB, loaded in {:.2} s; agent pinned to {} core(s)",
        keys.len(),
        node.model_count(),
        node.stats().pool_bytes as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64(),
        args.cores
    );

    // Phase 1: retraining throughput on one core (this thread).
    if args.rounds > 0 {
        let before = node.stats().agent;
        let cpu0 = thread_cpu_ns();
        let t0 = Instant::now();
        for _ in 0..args.rounds {
            for m in 0..node.model_count() {
                node.retrain_now(m)?;
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = (thread_cpu_ns() - cpu0) as f64 / 1e9;
        let after = node.stats().agent;
        let keys_done = after.keys_retrained - before.keys_retrained;
        println!(
            "retrain every model x{}: {} retrainings, {} keys in {:.3} s CPU ({:.3} s wall): {:.1} M keys/s on one core",
            args.rounds,
            after.retrains - before.retrains,
            keys_done,
            cpu,
            wall,
            keys_done as f64 / cpu.max(1e-9) / 1e6
        );
    }

    // Phase 2: inserts while the agent retrains on its own thread.
    let base = node.stats();
    let stop = AtomicBool::new(false);
    let inserted = AtomicU64::new(0);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool())?;
    let existing: BTreeSet<u64> = keys.iter().copied().collect();
    let phase_start = Instant::now();
    let mut phase = Duration::ZERO;
    let written: Vec<Vec<u64>> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for c in 0..args.clients {
            let client = &client;
            let stop = &stop;
            let inserted = &inserted;
            let existing = &existing;
            let keys = &keys;
            let seed = args.data.seed ^ (u64::from(c) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            hs.push(s.spawn(move || -> Result<Vec<u64>, String> {
                let mut sess = client.session().map_err(|e| e.to_string())?;
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                let mut mine = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    // A key between two neighbouring loaded keys: the
                    // inserts follow the data set's distribution.
                    let i = rng.gen_range(0..keys.len());
                    let lo = keys[i];
                    let hi = keys.get(i + 1).copied().unwrap_or(u64::MAX);
                    if hi - lo < 2 {
                        continue;
                    }
                    let k = rng.gen_range(lo + 1..hi);
                    if existing.contains(&k) {
                        continue;
                    }
                    if let Err(e) = sess.insert(k, k ^ 0x5555) {
                        // The pool ran out of room (e.g. the leaf region):
                        // end the phase for everyone and report it.
                        eprintln!("inserts stopped early: {e} (try a larger --spare-leaves)");
                        stop.store(true, Ordering::Relaxed);
                        break;
                    }
                    mine.push(k);
                    inserted.fetch_add(1, Ordering::Relaxed);
                }
                Ok(mine)
            }));
        }
        std::thread::sleep(Duration::from_secs_f64(args.duration));
        stop.store(true, Ordering::Relaxed);
        let joined = hs
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect::<Result<Vec<_>, String>>();
        // The phase ends once every client stopped (its wall time, not
        // the nominal --duration, is what the agent's CPU is compared to).
        phase = phase_start.elapsed();
        joined
    })?;
    let st = node.stats();
    let a = st.agent;
    let b = base.agent;
    let n_ins = inserted.load(Ordering::Relaxed);
    let retrains = a.retrains - b.retrains;
    let keys_retrained = a.keys_retrained - b.keys_retrained;
    let cpu = (st.agent_cpu_ns - base.agent_cpu_ns) as f64 / 1e9;
    println!(
        "inserts: {} in {:.1} s by {} client(s), {} synonym leaves",
        n_ins, args.duration, args.clients, st.synonym_leaves
    );
    println!(
        "agent: {} retrainings, {} keys retrained, {}, {} CirQ entries, {} failures",
        retrains,
        keys_retrained,
        Throughput {
            retrains,
            keys: keys_retrained,
            busy_ns: st.retrain_busy_ns - base.retrain_busy_ns,
            wall: phase,
        },
        a.cirq_pops - b.cirq_pops,
        st.agent_errors
    );
    println!("{}", RegionUse(&a));
    let h = a.freeze_hist;
    println!(
        "freeze (all {} retrainings of the run): p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        h.count(),
        us(h.quantile(500)),
        us(h.quantile(990)),
        us(h.max())
    );
    // A share of a phase shorter than the CPU clock's grain means nothing.
    let share = if phase >= Duration::from_millis(100) {
        format!("{:.1}% of one core", 100.0 * cpu / phase.as_secs_f64())
    } else {
        "phase too short for a share".to_string()
    };
    println!(
        "agent CPU: {:.3} s in the insert phase ({share}), {:.3} s per million inserts; pinned to {} core(s)",
        cpu,
        if n_ins > 0 { cpu * 1e6 / n_ins as f64 } else { 0.0 },
        st.pinned_cores
    );
    for n in node.take_notices() {
        eprintln!("agent notice: {n}");
    }
    if let Some(e) = node.last_agent_error() {
        eprintln!("agent error: {e}");
    }
    // Every inserted key is there.
    let mut sess = client.session()?;
    for k in written.iter().flatten() {
        if sess.get(*k)? != Some(k ^ 0x5555) {
            return Err(format!("inserted key {k:#x} was lost").into());
        }
    }
    println!("checked: every inserted key reads back");
    Ok(())
}

/// Where the served pool comes from.
enum Pool<'a> {
    /// A fresh pool loaded with these keys (in `--pool-file` if given).
    Load(Vec<u64>),
    /// The pool a dead memory node left in this file.
    Resume(&'a Path),
}

/// Where a pool file's data-set description is kept: `PATH.dataset`.
pub fn desc_path(pool_file: &Path) -> PathBuf {
    let mut p = pool_file.as_os_str().to_owned();
    p.push(".dataset");
    PathBuf::from(p)
}

/// Writes `desc` (its lease port left out: a restarted node has another)
/// next to `pool_file`, replacing any older one in one rename.
fn store_desc(pool_file: &Path, desc: &DataSetDesc) -> Result<(), String> {
    let path = desc_path(pool_file);
    let tmp = {
        let mut p = path.as_os_str().to_owned();
        p.push(".tmp");
        PathBuf::from(p)
    };
    let text = DataSetDesc {
        lease: None,
        ..desc.clone()
    }
    .encode();
    std::fs::write(&tmp, text + "\n")
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| format!("writing the data-set description {}: {e}", path.display()))
}

/// Starts a memory node whose pool lives in a scratch file (in `/dev/shm`
/// where it exists: memory, as an anonymous pool) unlinked once mapped: a
/// pool in a file can be mapped once per lease, so every lease gets a key
/// of its own that is closed when the lease ends and a stalled compute
/// node's late RMA is refused here ([`LeaseKeys`]), with or without
/// `--pool-file`. Nothing is kept: the file has no name once the node
/// runs. If the scratch file cannot be made, the pool is anonymous (and
/// late writes of a fenced compute node are not refused; said on stderr).
fn start_in_scratch_file(
    cfg: MemoryNodeConfig,
    pairs: &[(u64, u64)],
    size: ValueSize,
) -> Result<MemoryNode, Box<dyn std::error::Error>> {
    let fill = &mut |k, id, out: &mut Vec<u8>| size.fill(k, id, out);
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let path = dir.join(format!("rolex-memnode-{}-{stamp}.pool", std::process::id()));
    let scratch = MemoryNodeConfig {
        pool_file: Some(path.clone()),
        ..cfg.clone()
    };
    let started = MemoryNode::start_with_values(scratch, pairs, fill);
    let _ = std::fs::remove_file(&path);
    match started {
        Ok(node) => Ok(node),
        Err(e) => {
            eprintln!(
                "memory node: no scratch pool file in {} ({e}): the pool is anonymous, \
                 and a fenced compute node's late writes are not refused",
                dir.display()
            );
            Ok(MemoryNode::start_with_values(cfg, pairs, fill)?)
        }
    }
}

/// The description stored next to `pool_file` by the node that laid it out.
fn load_desc(pool_file: &Path) -> Result<DataSetDesc, String> {
    let path = desc_path(pool_file);
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "pool file {}: its data-set description {} cannot be read ({e}); \
             was the pool laid out by `rolex memnode --fabric … --pool-file`?",
            pool_file.display(),
            path.display()
        )
    })?;
    DataSetDesc::parse(text.trim()).map_err(|e| format!("{}: {e}", path.display()))
}

/// The description of the data set `args` names, loaded as `keys`.
fn describe(args: &MemnodeArgs, cfg: &MemoryNodeConfig, keys: &[u64]) -> DataSetDesc {
    DataSetDesc {
        source: match args.data.dist {
            Some(d) if args.data.keys.is_none() => format!("dist:{d}"),
            _ => "keys".into(),
        },
        n: keys.len() as u64,
        seed: args.data.seed,
        keyhash: key_hash(keys),
        leaf_slots: cfg.leaf_slots,
        fill: cfg.fill,
        epsilon: cfg.epsilon,
        value_size: args.value_size,
        shard: None,
        map: None,
        lease: None,
    }
}

/// The pool shape `args` names (what [`describe`] needs of it).
fn defaults_for(args: &MemnodeArgs) -> MemoryNodeConfig {
    let defaults = MemoryNodeConfig::default();
    MemoryNodeConfig {
        leaf_slots: args.leaf_slots,
        fill: args.fill.unwrap_or(defaults.fill),
        epsilon: args.epsilon.unwrap_or(defaults.epsilon),
        ..defaults
    }
}

/// `--fabric`: serves the pool to other processes until terminated.
fn serve(
    args: &MemnodeArgs,
    fabric: &FabricArg,
    pool: Pool<'_>,
) -> Result<(), Box<dyn std::error::Error>> {
    let engine = match fabric {
        // Refused by `run` before anything was loaded.
        FabricArg::Loopback => return Err("--fabric loopback cannot serve other processes".into()),
        FabricArg::Libfabric(p) => {
            let node = serving_node(p, args.node.as_deref(), args.listen.as_deref());
            let mut e = libfabric_engine(p, node.as_deref(), args.busy_poll_us);
            if let Fabric::Libfabric(l) = &mut e.fabric {
                l.idle_poll = Duration::from_micros(args.idle_poll_us);
            }
            e
        }
        FabricArg::Verbs(device) => verbs_kv_engine(device.clone(), &args.verbs)?,
    };
    let listen = args
        .listen
        .as_deref()
        .ok_or("--fabric needs --listen ADDR:PORT")?;
    let defaults = MemoryNodeConfig::default();
    let cfg = MemoryNodeConfig {
        engine,
        leaf_slots: args.leaf_slots,
        retrain_trigger: args.trigger,
        redo_blocks: args.redo_blocks,
        redo_slots: args.redo_slots,
        cores: args.cores as usize,
        spare_leaf_factor: args.spare_leaves,
        fill: args.fill.unwrap_or(defaults.fill),
        epsilon: args.epsilon.unwrap_or(defaults.epsilon),
        pool_file: args.pool_file.clone(),
        value_spare: args.value_spare.map(|m| m.saturating_mul(1 << 20)),
        atomics: args.atomics.into(),
        slt_scan_every: Duration::from_micros(args.slt_scan_every_us),
        sweep_every: Duration::from_millis(args.sweep_every_ms),
        ..defaults
    };
    let (node_, desc, held) = match pool {
        Pool::Load(keys) => {
            let mut desc = describe(args, &cfg, &keys);
            // A node of a cluster: the map from the whole data set's
            // quantiles (every node computes the same), and its range.
            let mine = match args.shard {
                Some(shard) => {
                    let map = PartitionMap::balanced(&keys, shard.count)
                        .map_err(|e| format!("--shard {shard}: {e}"))?;
                    let mine = range_of(&keys, &map, shard.index).to_vec();
                    desc.shard = Some(shard);
                    desc.map = Some(map);
                    mine
                }
                None => keys,
            };
            if let Some(path) = &args.pool_file {
                // A description left by an earlier pool in this file must
                // never outlive it.
                match std::fs::remove_file(desc_path(path)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(format!(
                            "removing the old data-set description {}: {e}",
                            desc_path(path).display()
                        )
                        .into())
                    }
                    _ => {}
                }
            }
            // The values `rolex bench` checks its answers against.
            let pairs: Vec<(u64, u64)> = mine.iter().map(|&k| (k, ycsb::load_value(k))).collect();
            drop(mine);
            let held = pairs.len() as u64;
            let size = args.value_size;
            let node_ = match &args.pool_file {
                Some(_) => MemoryNode::start_with_values(cfg, &pairs, &mut |k, id, out| {
                    size.fill(k, id, out)
                })?,
                None => start_in_scratch_file(cfg, &pairs, size)?,
            };
            drop(pairs);
            if let Some(path) = &args.pool_file {
                store_desc(path, &desc)?;
            }
            (node_, desc, held)
        }
        Pool::Resume(path) => {
            // The pool file's problems first (missing, not a pool, another
            // layout version): nothing is offered before the banner. Then
            // its description and the data-set arguments, before the
            // recovery writes to the pool: a refused resume leaves the
            // file as it was.
            let t = Instant::now();
            MemoryNode::check_pool_file(path)?;
            let desc = load_desc(path)?;
            if args.data.is_given() {
                let keys = args.data.load(0, EmptyFile::Accept)?;
                let mine = DataSetDesc {
                    leaf_slots: desc.leaf_slots,
                    fill: desc.fill,
                    epsilon: desc.epsilon,
                    shard: args.shard.or(desc.shard),
                    map: desc.map.clone(),
                    ..describe(args, &defaults_for(args), &keys)
                };
                if mine != desc {
                    return Err(format!(
                        "pool file {} holds another data set: {} (the arguments name {})",
                        path.display(),
                        desc.encode(),
                        mine.encode()
                    )
                    .into());
                }
            }
            let (node_, rec) = MemoryNode::resume(cfg)?;
            eprintln!(
                "resumed pool file {} in {:.2} s: {} models, {} keys in {} leaves; \
                 {} model(s) thawed ({} entries), {} rolled forward ({} entries), \
                 {} compute-node lock(s) released ({} torn leaves written again whole from \
                 their redo copies, {} redo blocks freed), {} damaged leaves, \
                 {} untiled models, {} KiB of model region retired until the grace period \
                 passes; {}",
                path.display(),
                t.elapsed().as_secs_f64(),
                rec.models,
                rec.keys,
                rec.leaves,
                rec.thawed,
                rec.thaw_unlocked,
                rec.rolled_forward,
                rec.entries_finished,
                rec.compute_locks_released,
                rec.restored_count,
                rec.redo_blocks_freed,
                rec.damaged_count,
                rec.untiled.len(),
                rec.retired_bytes() >> 10,
                value_reclaim(&rec.values)
            );
            if rec.leaves_raised > 0 || rec.values.raised > 0 {
                eprintln!(
                    "pool file {}: its allocation words were behind what its models hold \
                     (damaged): leaf region alloc_num raised by {} leaves, value region \
                     alloc by {} bytes, so that nothing live is handed out again",
                    path.display(),
                    rec.leaves_raised,
                    rec.values.raised
                );
            }
            for d in &rec.restored {
                eprintln!("{}", torn_line("the memory node died mid-write", d));
            }
            if rec.restored_count > rec.restored.len() as u64 {
                eprintln!(
                    "... {} torn leaves in all written again whole from their redo copies",
                    rec.restored_count
                );
            }
            for d in &rec.damaged {
                eprintln!(
                    "damaged leaf {} of model {}: {} (keys it held may be unreadable)",
                    d.leaf.leaf(),
                    d.model_id,
                    d.error
                );
            }
            for m in &rec.untiled {
                eprintln!("model {m}: its leaves do not tile its key range");
            }
            (node_, desc, rec.keys)
        }
    };
    let node_ = Arc::new(node_);
    // On stderr: the first stdout line is the banner clients wait for.
    if let Some(n) = node_.engine().libfabric() {
        eprintln!("memory node: {n}");
    }
    // Leases on the bootstrap's address, any port: a compute process that
    // dies holding chain locks has them released (`kv::lease`).
    let lease_host = listen
        .rsplit_once(':')
        .map(|(h, _)| h)
        .filter(|h| !h.is_empty())
        .unwrap_or("0.0.0.0");
    let release = node_.lock_releaser_with(|owner, d| {
        eprintln!(
            "{}",
            torn_line(&format!("compute node {} died mid-write", owner.0), &d)
        )
    });
    // A pool in a file: each lease gets a key of its own, closed when the
    // lease ends, so a stalled compute node's late RMA is refused here.
    let keys = LeaseKeys::new(node_.clone()).map(|k| k as Arc<dyn PoolKeys>);
    let leases = LeaseServer::start_with_keys(
        &format!("{lease_host}:0"),
        LeaseConfig::new(&args.token),
        Arc::new(move |owner: LockOwner| {
            let n = release(owner)?;
            eprintln!(
                "compute node {} left (lease ended): released {n} chain lock(s)",
                owner.0
            );
            Ok(n)
        }),
        keys,
    )?;
    let desc = DataSetDesc {
        lease: Some(leases.local_addr().port()),
        ..desc
    };
    let srv = BootstrapServer::start_with_meta(
        listen,
        Bootstrap::new(&args.token).with_rxm_buffer(fabric.rxm_buffer()),
        node_.offer(),
        desc.encode().into_bytes(),
    )?;
    println!(
        "memory node listening on {} ({}, fabric address {}): {} keys in {} models, {}",
        srv.local_addr(),
        fabric.name(),
        node_.engine().main_address(),
        held,
        node_.model_count(),
        desc.encode()
    );
    use std::io::Write as _;
    std::io::stdout().flush()?;
    // Runs until a signal ends the process; the engine's worker drives the
    // software provider's progress and the agent retrains meanwhile.
    let mut reported = 0;
    let mut leased = 0;
    // Refusals of the bootstrap and lease servers already reported.
    let mut refused = (0, 0);
    let mut progress = (0, 0);
    let mut ticks = 0u64;
    let mut last = (node_.stats(), Instant::now());
    // What serving costs (the provider's progress: the software stand-in
    // for the NIC, design §7), apart from the agent's retraining.
    let mut window = (CpuWindow::start(), node_.stats().agent_cpu_ns);
    let how = match fabric {
        FabricArg::Libfabric(_) if args.busy_poll_us > 0 => format!(
            "the engine busy-polls {} µs after each activity",
            args.busy_poll_us
        ),
        FabricArg::Libfabric(_) => "the engine wakes on the wait object".to_string(),
        _ => "a hardware NIC".to_string(),
    };
    loop {
        std::thread::sleep(Duration::from_millis(200));
        ticks += 1;
        if ticks % 25 == 0 {
            let (cpu, wall) = window.0.take();
            let agent_ns = node_.stats().agent_cpu_ns;
            let agent = Duration::from_nanos(agent_ns.saturating_sub(window.1));
            window.1 = agent_ns;
            let serving = cpu.saturating_sub(agent);
            if serving >= Duration::from_millis(1) {
                eprintln!(
                    "serving: {:.0}% of a core in the last {:.1} s ({how}), agent {:.0}%",
                    share(serving, wall),
                    wall.as_secs_f64(),
                    share(agent, wall)
                );
            }
        }
        // Every 5 s: the peers the control servers refused meanwhile (a
        // count and the last one, not a line per peer: a flood of
        // connections would be a flood of lines).
        if ticks % 25 == 0 {
            for (what, r, seen) in [
                ("bootstrap", srv.refusals(), &mut refused.0),
                ("lease", leases.refusals(), &mut refused.1),
            ] {
                let n = r.count();
                if n > *seen {
                    eprintln!(
                        "{what} server: refused {} peer(s) in the last 5 s (last: {})",
                        n - *seen,
                        r.last().unwrap_or_default()
                    );
                    *seen = n;
                }
            }
        }
        // Every 5 s: locks held by ids with no lease (a dead node's lock
        // CAS that landed after both releases of its lease).
        if ticks % 25 == 0 {
            let torn = |d| eprintln!("{}", torn_line("a holder without a lease", &d));
            match node_.release_locks_where_reporting(|o| !leases.holds(o), torn) {
                Ok(0) => {}
                Ok(n) => eprintln!("released {n} orphaned chain lock(s) (holders without a lease)"),
                Err(e) => eprintln!("sweeping orphaned chain locks failed: {e}"),
            }
        }
        if leases.active() != leased {
            leased = leases.active();
            eprintln!("compute nodes with a lease: {leased}");
        }
        let st = node_.stats();
        if (st.agent.retrains, st.synonym_leaves) != progress {
            progress = (st.agent.retrains, st.synonym_leaves);
            let (before, since) = &last;
            let rate = Throughput {
                retrains: st.agent.retrains - before.agent.retrains,
                keys: st.agent.keys_retrained - before.agent.keys_retrained,
                busy_ns: st.retrain_busy_ns - before.retrain_busy_ns,
                wall: since.elapsed(),
            };
            let h = &st.agent.freeze_hist;
            eprintln!(
                "retrained {} model(s) so far ({rate} since the last report; freeze p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs over all); {} synonym leaves created by compute nodes; {}",
                progress.0,
                us(h.quantile(500)),
                us(h.quantile(990)),
                us(h.max()),
                progress.1,
                RegionUse(&st.agent)
            );
            last = (st, Instant::now());
        }
        let errors = st.agent_errors;
        if errors > reported {
            reported = errors;
            if let Some(e) = node_.last_agent_error() {
                eprintln!("agent error ({errors} so far): {e}");
            }
        }
    }
}

/// Retraining throughput over an interval: keys retrained per second of
/// the agent's busy time (wall time inside retraining steps), and
/// retrainings per second of busy time and of the interval.
struct Throughput {
    retrains: u64,
    keys: u64,
    busy_ns: u64,
    wall: Duration,
}

impl std::fmt::Display for Throughput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let busy = self.busy_ns as f64 / 1e9;
        if busy <= 0.0 {
            return write!(f, "no retraining time");
        }
        write!(
            f,
            "{:.2} M keys/s and {:.0} retrainings/s while retraining, {:.1} retrainings/s over {:.1} s",
            self.keys as f64 / busy / 1e6,
            self.retrains as f64 / busy,
            self.retrains as f64 / self.wall.as_secs_f64().max(1e-9),
            self.wall.as_secs_f64()
        )
    }
}

/// The model region's use: its extent, the retired records' bytes, the
/// records reused and the retrainings refused for want of room; and the
/// store's growth and reclamation: models (cuts), leaves freed and
/// stashed for reuse.
struct RegionUse<'a>(&'a AgentStats);

impl std::fmt::Display for RegionUse<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = self.0;
        write!(
            f,
            "model region: {} KiB used, {} KiB of it retired records, {} records reused, {} retrainings refused (full); \
             {} models ({} cut), {} leaves freed, {} stashed for splits, {} free",
            a.model_region_used >> 10,
            a.model_region_free >> 10,
            a.records_reused,
            a.refusals,
            a.models,
            a.models_cut,
            a.leaves_freed,
            a.leaves_stashed,
            a.leaves_free
        )
    }
}

/// The resume's value-space line: what step 6 put on the free stack.
fn value_reclaim(v: &rolex_host::memnode::ValueReclaim) -> String {
    if !v.rebuilt {
        return "value free space left as it was (damaged or untiled leaves: what they name is unknown)".into();
    }
    format!(
        "value region: {} KiB handed out, {} KiB named by slots, {} KiB reclaimed onto the free stack ({} blocks, {} bundles)",
        v.handed_out >> 10,
        v.referenced >> 10,
        v.bytes >> 10,
        v.blocks,
        v.bundles
    )
}

/// CPU time of the calling thread, in nanoseconds (0 if unavailable): the
/// first field of `/proc/thread-self/schedstat` is the thread's run time in
/// nanoseconds (`std` has no thread CPU clock, and this crate no libc).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
