//! `rolex bench`: the store end to end — a memory node bulk-loaded with a
//! key set, `--clients` compute nodes on the loopback fabric, `--threads`
//! client threads running a YCSB workload — and the figures of design §8:
//! round trips, bytes, leaves and retries per operation kind first (counted
//! by the clients over the run only), then throughput and latency, beside
//! `raw_read_mops`: the rate of plain one-sided doorbell batches that
//! replay the gets' own reads — for each operation's key, the model's
//! directory word and the key's chain as the cached model has it, the very
//! positions, lengths and counts a get of that key posts — measured in the
//! same run with the same threads and compute nodes: the fabric's limit
//! for what the gets read, without their CPU.
//!
//! Key sets are `rolex plr`'s. The run's inserts are held out of the key
//! set before the load (`ycsb::Plan::split`): with `--dist` the generator
//! makes `-n` plus the inserts, with `--keys` the file's keys minus the
//! inserts are loaded. Every thread's operations are generated before the
//! clock starts, so the generator's cost is not in the figures.
//!
//! The run is checked, never trusted. During the run every answer is
//! checked against what could have been written: each value written names
//! its writer (`ycsb::write_value`), so a get, an update's prior value or a
//! scan entry must be the key's load value or the value of a write of this
//! run to that very key; a key present when issued must be found (YCSB
//! never deletes; `churn` and `delete-only` delete only keys the deleting
//! thread owns, each once), so a get, an update or a delete must find its
//! key; inserts must find their keys new; scans must be sorted and start at
//! their (present) first key. At the end every key the run wrote — a delete
//! writes "absent" — is read back and must be a value a linearizable
//! execution could end with (`rolex_checker::final_value_possible`). Any
//! problem sets `verified` to false and the command exits non-zero.
//!
//! `-n 0` starts an empty store (`insert-only` and `append` only): every key
//! the run inserts is drawn from `--dist`. The pool has room for the run's
//! inserts as if every synonym leaf ended half full, whatever the run
//! deletes (the store may reclaim emptied leaves; the size does not count
//! on it). Every run reports the pool's space: bytes in use before and
//! after the run, leaves live and free at the end (`null` against a remote
//! memory node).
//!
//! With `--fabric libfabric:PROVIDER --memnode ADDR:PORT` the memory node
//! is another process (`rolex memnode --fabric … --listen …`): the pool,
//! the engine address and the data set's description come over the
//! bootstrap connection, the key set is rebuilt here from that description
//! (any `--dist`/`-n`/`--seed`/`--keys`/`--leaf-slots`/`--fill`/`--epsilon`
//! given must agree with it, and the rebuilt keys must hash to the memory
//! node's). The memory node loads its whole data set, so the run's inserts
//! are new keys (`ycsb::Plan::split_fresh`), the same in every process:
//! `append`'s above its range; the others' from its gaps while there are
//! enough, else drawn from the data set's generator with a seed derived
//! from the run's (`ycsb::Plan::drawn_seed`; a key file's data set has no
//! generator, and its runs stay within its gaps). `churn` and `delete-only`
//! delete the node's keys, shared out over every process's threads. Each
//! process holds a lease at the memory node (its lease
//! port comes in the description), and its chain locks carry the lease's
//! id: if the process dies (`SIGKILL` included) holding locks, the memory
//! node releases them and the other processes go on. Several such
//! processes may share one memory node:
//! `--compute-count P --compute-index I` makes this process run threads
//! `I·T … I·T+T−1` of a `P·T`-thread plan of `P·ops` operations, so every
//! process knows every writer's values; a final value written by another
//! process is then accepted. The JSON keys are the same; `retrains` and
//! `synonym_leaves`, which only the memory node knows, are `null`.
//!
//! `--inject-failures P` (loopback only) makes each operation the compute
//! nodes post fail with probability P (`rolex_host::Faults`; the memory
//! node's own engine is spared): an error completion, half of them after
//! the operation took effect. The run goes on: a failed operation is
//! counted (`failed_ops`), the write it attempted is one that may or may
//! not have taken effect ([`final_possible`]), a key whose insert failed
//! may be absent, and steps that only read (connecting, the final reads)
//! are retried. `--inject-torn P` (loopback only, alone or beside it)
//! tears each WRITE of more than 8 bytes with probability P: only a
//! prefix lands and the rest of its doorbell batch fails, as a stream
//! transport's connection breaking mid-message does (`Faults::torn`);
//! writers write a torn leaf again whole before they release its lock, and
//! the run checks as above. Every run reports `locks_held_end`: the chains still
//! locked once the threads stopped, counted as `rolex inspect --models`
//! counts them, between two steps of the retraining agent (`null` against
//! a remote memory node, where other processes may still hold some).
//!
//! `--plot FILE.svg` draws the run (`crate::plot`): the latency CDF of each
//! operation kind that ran and the throughput over the run. Each thread
//! records every operation's latency in a histogram of its kind (merged
//! for the overall percentiles) and counts the operations it completed in
//! each 10 ms of the run, from the clock read the latency needs anyway:
//! per operation, an index and an increment more than the latency alone.

use crate::data_set_desc::{key_hash, DataSetDesc};
use crate::dataset::{self, spinner, DataSetArgs, Dist, EmptyFile};
use crate::fabric::{
    libfabric_engine, parse_fabric, verbs_kv_engine, FabricArg, VerbsArgs, NO_VERBS,
};
use crate::plot::{self, Bucket, Cdf};
use crate::ycsb::{self, KeySets, Op, Plan, Start, Workload};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rolex_checker::{final_value_possible, TimedWrite};
use rolex_core::entry::LockOwner;
use rolex_core::layout::LAYOUT_VERSION;
use rolex_host::domain::fabric::bootstrap::Bootstrap;
use rolex_host::kv::lease::LeaseClient;
use rolex_host::kv::KvError;
use rolex_host::kv::{
    ClusterClient, ClusterNode, KvClient, KvClientConfig, KvOp, KvStats, ModelBytes, OpStats,
    PartitionMap, PoolInfo, Request,
};
use rolex_host::memnode::{AgentActivity, MemoryNode, MemoryNodeConfig, MemoryNodeStats};
use rolex_host::{
    Access, BatchOp, EngineConfig, Fabric, Faults, LoopbackConfig, TransferEngine, TransferError,
    Unordered,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::values::{Found, IdSession, Prior, Read, ValueSize};

/// Arguments of `rolex bench`.
#[derive(Debug, Args)]
// The data set is not required: a remote memory node names it itself.
// Its help says what bench does with it (inserts held out or added; the
// seed also drives the operations).
#[command(mut_arg("keys", |a| a.help(
    "Read keys from a SOSD file (as `rolex plr`); the run's inserts are held out of it, the rest is loaded",
)))]
#[command(mut_arg("n", |a| a.help("Keys to load when generating (the run's inserts come on top)")))]
#[command(mut_arg("seed", |a| a.help("Seed of the key set and of every thread's operations")))]
pub struct BenchArgs {
    /// The workload: YCSB A–F, or insert-only / update-only.
    #[arg(long, value_enum)]
    workload: Workload,
    #[command(flatten)]
    data: DataSetArgs,
    /// Operations of the run, over all threads.
    #[arg(long)]
    ops: u64,
    /// Client threads.
    #[arg(long)]
    threads: usize,
    /// Compute nodes (client engines); threads are dealt round-robin.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// Zipfian constant θ of the request keys, in (0, 1).
    #[arg(long, default_value_t = ycsb::DEFAULT_THETA, allow_negative_numbers = true)]
    zipf: f64,
    /// Error bound ε of the models, in key positions [default: the store's].
    #[arg(long)]
    epsilon: Option<u64>,
    /// Slots per leaf L [default: the store's].
    #[arg(long)]
    leaf_slots: Option<u32>,
    /// Fill factor of the leaves at load, in (0, 1] [default: the store's].
    #[arg(long)]
    fill: Option<f64>,
    /// The fabric: `loopback`, or with `--memnode` `libfabric:PROVIDER` or
    /// `verbs[:DEVICE]` (a build with `--features verbs`).
    #[arg(long, default_value = "loopback", value_parser = parse_fabric)]
    fabric: FabricArg,
    #[command(flatten)]
    verbs: VerbsArgs,
    /// Bootstrap address (`ADDR:PORT`) of a `rolex memnode --fabric`
    /// process to run against (needs `--fabric libfabric:PROVIDER`), or
    /// several, comma-separated, in shard order: the nodes of a cluster
    /// (`rolex memnode --shard I/N`), which must agree on the data set, the
    /// node count and the partition map.
    #[arg(long, value_name = "ADDR:PORT[,ADDR:PORT…]")]
    memnode: Option<String>,
    /// Memory nodes started in this process (loopback), each holding one
    /// key range of equal key count (the loaded keys' quantiles); the
    /// compute nodes route every operation by key.
    #[arg(long, default_value_t = 1)]
    memnodes: usize,
    /// Shared token of the bootstrap connection.
    #[arg(long, default_value = "rolex")]
    token: String,
    /// Node (IP address) this process's libfabric endpoints open on
    /// (default: the local address that reaches `--memnode`).
    #[arg(long)]
    node: Option<String>,
    /// libfabric: spin (yielding) this many µs after the last activity
    /// before sleeping between queue reads (latency vs CPU).
    #[arg(long, default_value_t = 200)]
    busy_poll_us: u64,
    /// Compute processes sharing the memory node in this run (`P`).
    #[arg(long, default_value_t = 1)]
    compute_count: usize,
    /// This process's index among them, `0..P`.
    #[arg(long, default_value_t = 0)]
    compute_index: usize,
    /// Deliver out of posting order (SRD-like): writes take 3 round trips.
    #[arg(long)]
    unordered: bool,
    /// Injected round-trip time of every fabric operation, in µs.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    rtt_us: f64,
    /// Fail each operation the compute nodes post with probability P
    /// (loopback only): error completions, half after the operation took
    /// effect, half before. A failed operation is counted (`failed_ops`)
    /// and the run goes on; its key's outcome is unknown to the checks.
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    inject_failures: Option<f64>,
    /// Tear each WRITE of more than 8 bytes the compute nodes post with
    /// probability P (loopback only): a prefix lands, it fails, and the
    /// rest of its doorbell batch fails before running — a connection
    /// broken mid-write. Counted and checked as `--inject-failures`.
    #[arg(long, value_name = "P", allow_negative_numbers = true)]
    inject_torn: Option<f64>,
    /// Blocks of the in-process memory node's redo log (`rolex memnode
    /// --redo-blocks`): where the fabric places a peer's writes in order,
    /// each leaf write goes out behind a whole copy there. 0 turns it off
    /// (to measure what the copies cost). A remote node has its own.
    #[arg(long, value_name = "N")]
    redo_blocks: Option<u32>,
    /// With several memory nodes: go on past operations that fail because
    /// a memory node is lost — down (its peer failed or vanished, as the
    /// cluster client judges: `ClusterClient::is_down`), or its lease
    /// expired (its lease server unreachable). Each is counted
    /// (`failed_ops`), its key's outcome unknown to the checks; the nodes
    /// lost are named (`nodes_lost`), the keys written there that cannot
    /// be read back counted (`keys_unverified`), and every other key is
    /// verified as usual. Without it the first such error stops the run.
    #[arg(long)]
    keep_going: bool,
    /// Before the measured run, grow the store by appending this many keys
    /// above the loaded range (spaced by the loaded keys' mean gap, each
    /// with its load value; untimed, retraining as it goes): the run then
    /// sees them as loaded (`keys` counts them, reads draw over them). For
    /// a store grown N times over by models the memory node cut (loopback;
    /// not with `--workload append`, whose keys go there).
    #[arg(long, value_name = "N")]
    grow: Option<u64>,
    /// Value size in bytes: `B`, or `MIN..MAX` (a length drawn uniformly
    /// per write), at least 8 (a value carries its writer's id for the
    /// checks). 8: the values are `u64`s, inline in the leaves; longer
    /// ones live out of line in value blocks, and every value read back is
    /// checked byte for byte. [default: 8, or the remote memory node's]
    #[arg(long, value_name = "B|MIN..MAX")]
    value_size: Option<ValueSize>,
    /// Operations a thread keeps in flight: runs of up to D consecutive
    /// gets, updates, inserts and deletes of its stream go out together
    /// (`run_many`, or `run_many_values` for values other than 8 bytes: on
    /// an ordered fabric 2 round trips per memory node for requests on
    /// distinct chains; `get_many` for a run of gets only; `scan_many` for
    /// a run of scans: their leaves in shared round trips); a
    /// read-modify-write's get goes at the start of its call, its update
    /// where it stands.
    #[arg(long, default_value_t = 1, value_name = "D")]
    depth: usize,
    /// Print one JSON line instead of the table.
    #[arg(long)]
    json: bool,
    /// Draw the run into this SVG file: latency CDF per operation kind and
    /// throughput over the run.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

type BenchError = Box<dyn std::error::Error>;

/// Operations a thread does between two progress updates.
const PROGRESS_EVERY: u64 = 256;

/// Operations the raw-read baseline runs at most (and at least), over all
/// threads: enough for a stable rate, bounded so the run stays short.
const RAW_MIN: u64 = 20_000;
const RAW_MAX: u64 = 400_000;

/// Shuffle window of the unordered loopback fabric.
const UNORDERED_WINDOW: usize = 16;

/// The workload's operation kinds, in the order their latencies are kept.
const KINDS: [&str; 6] = [
    "get",
    "update",
    "insert",
    "scan",
    "read-modify-write",
    "delete",
];

/// The index of `op`'s kind in [`KINDS`].
fn kind(op: &Op) -> usize {
    match op {
        Op::Read(_) => 0,
        Op::Update { .. } => 1,
        Op::Insert { .. } => 2,
        Op::Scan { .. } => 3,
        Op::ReadModifyWrite { .. } => 4,
        Op::Delete { .. } => 5,
    }
}

/// `op` as the requests of a pipelined call, if it can be in one (a scan
/// cannot): its read, if it has one to go first, and its request. A
/// read-modify-write is a get of its key, put at the call's start, and
/// an update where it stands (see [`StreamRun::run_many`]).
fn requests(op: &Op) -> Option<(Option<Request>, Request)> {
    match *op {
        Op::Read(key) => Some((None, Request::Get(key))),
        Op::Update { key, value } => Some((None, Request::Update(key, value))),
        Op::Insert { key, value } => Some((None, Request::Insert(key, value))),
        Op::Delete { key } => Some((None, Request::Delete(key))),
        Op::ReadModifyWrite { key, value } => {
            Some((Some(Request::Get(key)), Request::Update(key, value)))
        }
        Op::Scan { .. } => None,
    }
}

/// Width of the intervals threads count completed operations in.
const INTERVAL_NS: u64 = 10_000_000;

fn validate(args: &BenchArgs) -> Result<(), BenchError> {
    if args.depth == 0 {
        return Err("--depth must be at least 1 (operations in flight per thread)".into());
    }
    if args.ops == 0 {
        return Err("--ops must be at least 1".into());
    }
    if args.threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    if args.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    let nodes = args
        .memnode
        .as_deref()
        .map_or(args.memnodes, |m| m.split(',').count());
    if args.keep_going && nodes < 2 {
        return Err(
            "--keep-going needs several memory nodes (--memnodes N, or --memnode A,B,…): \
             with one, every operation fails once it is down"
                .into(),
        );
    }
    if args.clients > args.threads {
        return Err(format!(
            "--clients {} exceeds --threads {}: every compute node needs a thread",
            args.clients, args.threads
        )
        .into());
    }
    if let Some(f) = args.fill {
        if !(f > 0.0 && f <= 1.0) {
            return Err(format!("--fill {f} is outside (0, 1]").into());
        }
    }
    if let Some(l) = args.leaf_slots {
        if l < 2 {
            return Err(format!("--leaf-slots {l}: a leaf needs at least 2 slots").into());
        }
    }
    if args.epsilon == Some(0) {
        return Err("--epsilon must be at least 1".into());
    }
    if !(args.rtt_us.is_finite() && args.rtt_us >= 0.0 && args.rtt_us <= 1e6) {
        return Err(format!("--rtt-us {} must be in [0, 10^6]", args.rtt_us).into());
    }
    if args.data.n == Some(0) && !args.workload.can_start_empty() {
        return Err(format!(
            "-n 0 starts an empty store, which only insert-only and append run on: \
             {} reads, updates or deletes loaded keys (give -n 1 or more)",
            args.workload
        )
        .into());
    }
    if args.grow.is_some() {
        if args.memnode.is_some() {
            return Err("--grow grows the store this run starts: not with --memnode".into());
        }
        if args.workload == Workload::Append {
            return Err("--grow appends above the loaded range, where --workload append's keys go: use another workload".into());
        }
    }
    for (flag, p) in [
        ("--inject-failures", args.inject_failures),
        ("--inject-torn", args.inject_torn),
    ] {
        let Some(p) = p else { continue };
        if !(0.0..=1.0).contains(&p) {
            return Err(format!("{flag} {p} must be in [0, 1]").into());
        }
        if !matches!(args.fabric, FabricArg::Loopback) || args.memnode.is_some() {
            return Err(format!(
                "{flag} fails operations of the loopback NIC: it needs --fabric loopback, not {}",
                args.fabric.name()
            )
            .into());
        }
    }
    if args.redo_blocks.is_some() && args.memnode.is_some() {
        return Err(
            "--redo-blocks sizes the memory node this run starts: a --memnode has its own (rolex memnode --redo-blocks)".into(),
        );
    }
    if let (Some(p), Some(t)) = (args.inject_failures, args.inject_torn) {
        if p + t > 1.0 {
            return Err(format!(
                "--inject-failures {p} and --inject-torn {t} add up to more than 1"
            )
            .into());
        }
    }
    match (&args.fabric, &args.memnode) {
        (FabricArg::Loopback, Some(_)) => {
            return Err("--memnode needs --fabric libfabric:PROVIDER or verbs".into())
        }
        (FabricArg::Libfabric(_) | FabricArg::Verbs(_), None) => {
            return Err(format!(
                "--fabric {} needs --memnode ADDR:PORT (start one with rolex memnode --fabric … --listen …)",
                args.fabric.name()
            )
            .into())
        }
        _ => {}
    }
    if matches!(args.fabric, FabricArg::Verbs(_)) && !cfg!(feature = "verbs") {
        return Err(format!("--fabric verbs: {NO_VERBS}").into());
    }
    if args.memnodes == 0 {
        return Err("--memnodes must be at least 1".into());
    }
    if args.memnodes > 1 && args.memnode.is_some() {
        return Err(
            "--memnodes starts memory nodes in this process; against memory nodes in other \
             processes give their addresses: --memnode A,B,C"
                .into(),
        );
    }
    if args.memnode.is_none() && !args.data.is_given() {
        return Err("give --keys FILE, or --dist with -n".into());
    }
    if args.compute_count == 0 || args.compute_index >= args.compute_count {
        return Err(format!(
            "--compute-index {} must be below --compute-count {}",
            args.compute_index, args.compute_count
        )
        .into());
    }
    if args.compute_count > 1 && args.memnode.is_none() {
        return Err("--compute-count is for runs against a shared --memnode".into());
    }
    if (args.unordered || args.rtt_us != 0.0) && args.memnode.is_some() {
        return Err("--unordered and --rtt-us shape the loopback fabric only".into());
    }
    if let Some(path) = &args.plot {
        plot::create(path)?;
    }
    Ok(())
}

fn engine_config(args: &BenchArgs) -> Result<EngineConfig, BenchError> {
    match &args.fabric {
        FabricArg::Libfabric(p) => {
            let node = match (p.as_str(), &args.node) {
                (_, Some(n)) => Some(n.clone()),
                ("shm" | "efa" | "verbs", None) => None,
                _ => memnode_addrs(args)
                    .first()
                    .and_then(|a| local_ip_towards(a)),
            };
            return Ok(libfabric_engine(p, node.as_deref(), args.busy_poll_us));
        }
        FabricArg::Verbs(device) => return Ok(verbs_kv_engine(device.clone(), &args.verbs)?),
        FabricArg::Loopback => {}
    }
    Ok(EngineConfig {
        fabric: Fabric::Loopback(LoopbackConfig {
            latency: Duration::from_secs_f64(args.rtt_us * 1e-6),
            unordered: args.unordered.then_some(Unordered {
                seed: args.data.seed,
                window: UNORDERED_WINDOW,
                writes_in_order: false,
            }),
            ..LoopbackConfig::default()
        }),
        // A shared 2-core machine: let the scheduler place the workers.
        pin_workers: false,
        ..EngineConfig::default()
    })
}

/// The compute nodes' engine: `engine` (the memory node's), with
/// `--inject-failures`'s and `--inject-torn`'s faults on its loopback NIC.
fn client_engine(args: &BenchArgs, mut engine: EngineConfig) -> EngineConfig {
    if let (true, Fabric::Loopback(lb)) = (args.injects(), &mut engine.fabric) {
        lb.faults = Some(Faults {
            probability: args.inject_failures.unwrap_or(0.0),
            seed: args.data.seed,
            torn: args.inject_torn.unwrap_or(0.0),
            tear_kills: false,
        });
    }
    engine
}

impl BenchArgs {
    /// Whether the run injects faults (`--inject-failures`,
    /// `--inject-torn`).
    fn injects(&self) -> bool {
        self.inject_failures.is_some() || self.inject_torn.is_some()
    }
}

/// The local address this machine would use to reach `server`
/// (`HOST:PORT`): a connected UDP socket picks the route, nothing is sent.
fn local_ip_towards(server: &str) -> Option<String> {
    use std::net::ToSocketAddrs;
    let to = server.to_socket_addrs().ok()?.next()?;
    let any = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let s = std::net::UdpSocket::bind(any).ok()?;
    s.connect(to).ok()?;
    Some(s.local_addr().ok()?.ip().to_string())
}

/// `--memnode`'s addresses, in shard order.
fn memnode_addrs(args: &BenchArgs) -> Vec<&str> {
    args.memnode
        .as_deref()
        .map(|m| m.split(',').map(str::trim).collect())
        .unwrap_or_default()
}

/// A memory node in another process, as its bootstrap offer describes it.
struct Remote {
    /// Its bootstrap address.
    addr: String,
    pool: PoolInfo,
    desc: DataSetDesc,
}

/// The partition map of the memory nodes `remotes` (given in this order):
/// a lone node serves every key; the nodes of a cluster must each be the
/// shard of their place, of as many nodes as were given, and agree on the
/// rest of their description (data set, pool shape, partition map).
fn cluster_map(remotes: &[Remote]) -> Result<PartitionMap, BenchError> {
    let first = remotes.first().ok_or("--memnode names no memory node")?;
    if remotes.len() == 1 && first.desc.shard.map_or(true, |s| s.count == 1) {
        return Ok(first.desc.map.clone().unwrap_or_else(PartitionMap::single));
    }
    let n = remotes.len();
    for (i, r) in remotes.iter().enumerate() {
        match r.desc.shard {
            None => {
                return Err(format!(
                    "the memory node at {} serves every key (no --shard), but {n} were given \
                     as a cluster: start each with rolex memnode --shard I/{n}",
                    r.addr
                )
                .into())
            }
            Some(s) if s.count != n => {
                return Err(format!(
                    "the memory node at {} is shard {s} of a cluster of {} nodes, but --memnode names {n}",
                    r.addr, s.count
                )
                .into())
            }
            Some(s) if s.index != i => {
                return Err(format!(
                    "the memory node at {} is shard {s}, but was given as shard {i}/{n}: give --memnode in shard order",
                    r.addr
                )
                .into())
            }
            Some(_) => {}
        }
        if r.desc.cluster_part() != first.desc.cluster_part() {
            return Err(format!(
                "the memory nodes disagree: {} holds {}, {} holds {}",
                first.addr,
                first.desc.encode(),
                r.addr,
                r.desc.encode()
            )
            .into());
        }
    }
    first
        .desc
        .map
        .clone()
        .ok_or_else(|| format!("the memory node at {} names no partition map", first.addr).into())
}

/// Fetches the remote memory node's pool and data-set description.
fn fetch_remote(args: &BenchArgs, server: &str) -> Result<Remote, BenchError> {
    let (offer, meta) = Bootstrap::new(&args.token)
        .with_rxm_buffer(args.fabric.rxm_buffer())
        .fetch_with_meta(server, LAYOUT_VERSION)?;
    let pool = PoolInfo::from_offer(&offer)
        .ok_or_else(|| format!("the memory node at {server} offered no pool"))?;
    let text = String::from_utf8(meta)
        .map_err(|_| format!("the memory node at {server} sent a description that is not text"))?;
    let desc = DataSetDesc::parse(&text)
        .map_err(|e| format!("the memory node at {server} is not a rolex memnode: {e}"))?;
    Ok(Remote {
        addr: server.to_string(),
        pool,
        desc,
    })
}

/// The lease of this process at the memory node `server` (its host) on
/// `port`.
fn acquire_lease(server: &str, port: u16, token: &str) -> Result<LeaseClient, BenchError> {
    let host = server
        .rsplit_once(':')
        .map(|(h, _)| h)
        .ok_or_else(|| format!("--memnode {server}: not ADDR:PORT"))?;
    let at = format!("{host}:{port}");
    LeaseClient::acquire(&at, token, Duration::from_secs(10))
        .map_err(|e| format!("the memory node at {server}: {e}").into())
}

/// The remote memory node's key set, rebuilt here, and the distribution
/// it was generated from (`None`: a key file); any data-set or pool
/// parameter given on the command line must agree with it.
fn remote_keys(
    args: &BenchArgs,
    server: &str,
    r: &Remote,
) -> Result<(Vec<u64>, Option<Dist>), BenchError> {
    let d = &r.desc;
    let differ = |what: &str, here: String, there: String| -> BenchError {
        format!(
            "the memory node at {server} holds a different data set: {what} is {there} there, {here} here (its data set: {})",
            d.encode()
        )
        .into()
    };
    if let Some(l) = args.leaf_slots.filter(|&l| l != d.leaf_slots) {
        return Err(differ(
            "--leaf-slots",
            l.to_string(),
            d.leaf_slots.to_string(),
        ));
    }
    if let Some(f) = args.fill.filter(|&f| f != d.fill) {
        return Err(differ("--fill", f.to_string(), d.fill.to_string()));
    }
    if let Some(e) = args.epsilon.filter(|&e| e != d.epsilon) {
        return Err(differ("--epsilon", e.to_string(), d.epsilon.to_string()));
    }
    if let Some(v) = args.value_size.filter(|&v| v != d.value_size) {
        return Err(differ(
            "--value-size",
            v.to_string(),
            d.value_size.to_string(),
        ));
    }
    let (keys, dist) = match d.source.strip_prefix("dist:") {
        Some(name) => {
            if let Some(path) = &args.data.keys {
                return Err(differ(
                    "the source",
                    path.display().to_string(),
                    d.source.clone(),
                ));
            }
            let dist = <Dist as ValueEnum>::from_str(name, true).map_err(|_| {
                format!("the memory node at {server} names an unknown distribution {name:?}")
            })?;
            if let Some(mine) = args.data.dist.filter(|&x| x != dist) {
                return Err(differ("--dist", mine.to_string(), name.to_string()));
            }
            if let Some(n) = args.data.n.filter(|&n| n != d.n) {
                return Err(differ("-n", n.to_string(), d.n.to_string()));
            }
            if args.data.seed != d.seed {
                return Err(differ(
                    "--seed",
                    args.data.seed.to_string(),
                    d.seed.to_string(),
                ));
            }
            (dataset::generate(dist, d.n, d.seed)?, Some(dist))
        }
        None => {
            let Some(path) = &args.data.keys else {
                return Err(format!(
                    "the memory node at {server} holds the keys of a file: give the same file with --keys"
                )
                .into());
            };
            if args.data.dist.is_some() {
                return Err(differ("the source", "--dist".into(), "a key file".into()));
            }
            (dataset::read_sosd(path)?, None)
        }
    };
    let h = key_hash(&keys);
    if h != d.keyhash || keys.len() as u64 != d.n {
        return Err(differ(
            "the key set's hash",
            format!("{h:016x} ({} keys)", keys.len()),
            format!("{:016x} ({} keys)", d.keyhash, d.n),
        ));
    }
    Ok((keys, dist))
}

fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:>6} [{bar:30}] {human_pos}/{human_len} [{elapsed} < {eta}]",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

/// Log-linear latency histogram in nanoseconds: exact below 128 ns, then
/// 64 buckets per power of two (under 1.6% error).
#[derive(Clone)]
struct Histogram {
    counts: Vec<u64>,
}

const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;

impl Histogram {
    fn new() -> Self {
        Histogram {
            counts: vec![0; (64 - SUB_BITS as usize) * SUB as usize + 2 * SUB as usize],
        }
    }

    fn index(v: u64) -> usize {
        let shift = (63 - v.max(1).leading_zeros()).saturating_sub(SUB_BITS);
        (u64::from(shift) * SUB + (v >> shift)) as usize
    }

    /// The middle of bucket `i`.
    fn value(i: usize) -> u64 {
        let i = i as u64;
        if i < 2 * SUB {
            return i;
        }
        let shift = i / SUB - 1;
        let m = i - shift * SUB;
        (m << shift) + (1 << shift) / 2
    }

    fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
    }

    fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
    }

    fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The distribution: `(ns, fraction of the samples ≤ ns)` at every
    /// non-empty bucket, from `(first, 0)`; empty when there is no sample.
    fn cdf(&self) -> Vec<(u64, f64)> {
        let total = self.count() as f64;
        let mut seen = 0;
        let mut out = Vec::new();
        for (i, &c) in self.counts.iter().enumerate().filter(|(_, c)| **c > 0) {
            if out.is_empty() {
                out.push((Self::value(i), 0.0));
            }
            seen += c;
            out.push((Self::value(i), seen as f64 / total));
        }
        out
    }

    /// The `q`-quantile (0..=1), in nanoseconds; 0 when empty.
    fn quantile(&self, q: f64) -> u64 {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i);
            }
        }
        0
    }
}

/// Problems seen in the store's answers: counted, the first few kept.
#[derive(Default)]
struct Problems {
    count: u64,
    first: Vec<String>,
}

/// Messages kept per [`Problems`].
const KEEP_PROBLEMS: usize = 10;

impl Problems {
    fn push(&mut self, what: impl FnOnce() -> String) {
        self.count += 1;
        if self.first.len() < KEEP_PROBLEMS {
            self.first.push(what());
        }
    }

    fn merge(&mut self, o: Problems) {
        self.count += o.count;
        let room = KEEP_PROBLEMS.saturating_sub(self.first.len());
        self.first.extend(o.first.into_iter().take(room));
    }
}

/// What one run thread hands back.
struct ThreadOut {
    /// Latencies per operation kind (indexed as [`KINDS`]).
    latency: Vec<Histogram>,
    /// Operations completed in each [`INTERVAL_NS`] since `RunCtx::epoch`.
    per_interval: Vec<u64>,
    /// Insert latencies while the retraining agent was working (sampled
    /// before and after the insert) and while it was not.
    insert_retraining: Histogram,
    insert_quiet: Histogram,
    /// Per key, this thread's writes that may be its final value.
    writes: HashMap<u64, KeyWrites>,
    /// Problems in the answers (see [`RunCtx::check_value`]).
    problems: Problems,
    gets: u64,
    /// Operations that returned an error (with injected faults; otherwise
    /// an error ends the run).
    failed: u64,
    /// When the thread began its first and finished its last operation.
    began: Instant,
    ended: Instant,
}

impl ThreadOut {
    fn new() -> Self {
        ThreadOut {
            latency: vec![Histogram::new(); KINDS.len()],
            per_interval: Vec::with_capacity(1024),
            insert_retraining: Histogram::new(),
            insert_quiet: Histogram::new(),
            writes: HashMap::new(),
            problems: Problems::default(),
            gets: 0,
            failed: 0,
            began: Instant::now(),
            ended: Instant::now(),
        }
    }

    /// Records operation `op`, invoked at `inv` and returned at `ret` (ns
    /// since the epoch), and the write it made or may have made.
    fn record(&mut self, op: &Op, (inv, ret): (u64, u64), write: Option<Write>) {
        self.latency[kind(op)].record(ret - inv);
        let slot = (ret / INTERVAL_NS) as usize;
        if slot >= self.per_interval.len() {
            self.per_interval.resize(slot + 1, 0);
        }
        self.per_interval[slot] += 1;
        if let Some(w) = write {
            let timed = |value| TimedWrite {
                invoke: inv,
                ret,
                value,
            };
            let (key, value, applied) = match w {
                Write::Applied { key, value } => (key, value, true),
                Write::Unknown { key, value } => (key, value, false),
            };
            self.writes
                .entry(key)
                .or_default()
                .add(timed(value), applied);
        }
    }
}

/// A write an operation of the run made; a delete writes `None`.
#[derive(Clone, Copy, Debug)]
enum Write {
    /// It returned: `key` holds `value` from some point of its interval.
    Applied { key: u64, value: Option<u64> },
    /// It returned an error: it may or may not have taken effect.
    Unknown { key: u64, value: Option<u64> },
}

/// One thread's writes to one key that can be the key's final value: its
/// last write that returned, and the failed writes after it, each of
/// which may or may not have taken effect. Earlier writes cannot be final:
/// a later write of the same thread that took effect strictly follows
/// them.
///
/// A failed write's interval ends when its error returned: every
/// operation the store posts for it has completed by then, so it cannot
/// take effect later.
#[derive(Clone, Debug, Default, PartialEq)]
struct KeyWrites {
    applied: Option<TimedWrite>,
    unknown: Vec<TimedWrite>,
}

impl KeyWrites {
    fn add(&mut self, w: TimedWrite, applied: bool) {
        if applied {
            self.applied = Some(w);
            self.unknown.clear();
        } else {
            self.unknown.push(w);
        }
    }
}

/// Whether `got`, read back at the end, is a value a linearizable
/// execution of the run could leave in a key whose value before the run
/// was `initial`, given each thread's writes to it ([`KeyWrites`]).
///
/// [`final_value_possible`] over the writes that returned, or over those
/// and one failed write of the value read back: if the final value is a
/// failed write's, that write took effect (and other failed writes need
/// not have); otherwise none need have. So these cases are all there is.
fn final_possible(initial: Option<u64>, writes: &[KeyWrites], got: Option<u64>) -> bool {
    let applied: Vec<TimedWrite> = writes.iter().filter_map(|w| w.applied).collect();
    final_value_possible(initial, &applied, got)
        || writes
            .iter()
            .flat_map(|w| &w.unknown)
            .filter(|u| u.value == got)
            .any(|u| {
                let mut with = applied.clone();
                with.push(*u);
                final_value_possible(initial, &with, got)
            })
}

/// What every run thread shares.
struct RunCtx {
    /// Every thread's operations, generated before the clock starts: the
    /// zipfian draws (a ChaCha block and a `powf` per key) would otherwise
    /// be a sizeable share of a get.
    streams: Vec<Vec<Op>>,
    /// Zero of the write timestamps.
    epoch: Instant,
    /// Releases the threads together.
    start: Barrier,
    /// Whether a local memory node is retraining (splits insert
    /// latencies; empty against remote ones).
    activity: Vec<AgentActivity>,
    /// Whether faults are injected: an operation that fails is counted
    /// and the run goes on.
    faults: bool,
    /// `--keep-going`: an operation that failed on a memory node lost
    /// ([`node_lost`]) is counted and the run goes on.
    keep_going: bool,
    /// The memory nodes operations were found lost on (`--keep-going`).
    lost: Mutex<BTreeSet<usize>>,
    /// The run's value sizes.
    value_size: ValueSize,
    /// Gets a thread reads together (`--depth`).
    depth: usize,
}

impl RunCtx {
    /// Whether the run goes on past the failed operation `f` of a thread
    /// of `client`: under injected faults, or with `--keep-going` when
    /// its memory node is lost (noted in `lost`).
    fn tolerates(&self, f: &Failed, client: &ClusterClient) -> bool {
        if self.faults {
            return true;
        }
        let Some(node) = f.node.filter(|&n| f.lease_lost || client.is_down(n)) else {
            return false;
        };
        if self.keep_going {
            self.lost
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(node);
        }
        self.keep_going
    }

    /// Whether `value` can ever have been `key`'s: its load value, or the
    /// value of a write of this run to this key. Values name their writer
    /// (`ycsb::write_value`), so this is one lookup.
    fn value_ok(&self, key: u64, value: u64) -> bool {
        match ycsb::writer_of(value) {
            // A 40-bit hash of the key: a store that returns it for a key
            // that was not loaded would have to compute it. (Looking the
            // key up in the loaded set here would cost a third of a get.)
            None => value == ycsb::load_value(key),
            Some((t, seq)) => {
                let op = self
                    .streams
                    .get(t)
                    .and_then(|s| s.get(usize::try_from(seq.checked_sub(1)?).ok()?));
                matches!(
                    op,
                    Some(Op::Update { key: k, value: v }
                        | Op::Insert { key: k, value: v }
                        | Op::ReadModifyWrite { key: k, value: v })
                        if *k == key && *v == value
                )
            }
        }
    }

    /// Records a problem unless `got` is a value `key` can have held.
    fn check_value(&self, p: &mut Problems, what: &str, key: u64, got: Option<u64>) {
        match got {
            // A key present when issued stays present: YCSB never deletes,
            // and a key is deleted only by its owner, once.
            None => p.push(|| format!("{what} of present key {key} found it absent")),
            Some(v) if !self.value_ok(key, v) => {
                p.push(|| format!("{what} of key {key} returned {v}, never written to it"))
            }
            Some(_) => {}
        }
    }
}

/// An operation of a stream that returned an error.
struct Failed {
    /// The call and its error, as the run's error names them (`get KEY:
    /// …`, `update KEY: …`).
    message: String,
    /// The write it attempted, which may or may not have taken effect.
    write: Option<Write>,
    /// The memory node its error names, if it names one.
    node: Option<usize>,
    /// Whether the error is that node's lease having expired.
    lease_lost: bool,
}

impl Failed {
    /// `call` (e.g. `get KEY`) failed with `error`, attempting `write`.
    fn new(call: std::fmt::Arguments<'_>, error: KvError, write: Option<Write>) -> Self {
        Failed {
            message: format!("{call}: {error}"),
            write,
            node: node_named(&error),
            lease_lost: error.lease_expired(),
        }
    }
}

/// The memory node a cluster client's error names, if it names one.
fn node_named(e: &KvError) -> Option<usize> {
    match e {
        KvError::MemoryNode { node, .. } | KvError::MemoryNodeDown { node, .. } => Some(*node),
        _ => None,
    }
}

/// The memory node `client` lost, if `e` says it lost one: a node it
/// found down, or one whose lease expired.
fn node_lost(e: &KvError, client: &ClusterClient) -> Option<usize> {
    node_named(e).filter(|&n| e.lease_expired() || client.is_down(n))
}

/// One thread running its stream: its session, and what it saw.
struct StreamRun<'a> {
    session: IdSession,
    ctx: &'a RunCtx,
    out: ThreadOut,
    /// Keys whose insert by this thread returned an error: they may be
    /// absent, until an answer shows them present.
    unsure: HashSet<u64>,
}

impl StreamRun<'_> {
    /// Nanoseconds since the run's epoch.
    fn now(&self) -> u64 {
        self.ctx.epoch.elapsed().as_nanos() as u64
    }

    /// Runs `op` and checks its answers; returns the write it made.
    fn execute(&mut self, op: Op) -> Result<Option<Write>, Failed> {
        match op {
            Op::Read(key) => self.get("get", key).map(|()| None),
            Op::Update { key, value } => self.update("update", key, value),
            Op::ReadModifyWrite { key, value } => {
                self.get("read-modify-write's get", key)?;
                self.update("read-modify-write's update", key, value)
            }
            Op::Insert { key, value } => self.insert(key, value),
            Op::Scan { from, len } => self.scan(from, len).map(|()| None),
            Op::Delete { key } => self.delete(key),
        }
    }

    fn get(&mut self, what: &str, key: u64) -> Result<(), Failed> {
        let got = self
            .session
            .get(key)
            .map_err(|error| Failed::new(format_args!("get {key}"), error, None))?;
        self.out.gets += 1;
        self.check_read(what, key, got);
        Ok(())
    }

    /// The gets of `keys`, read together ([`IdSession::get_many`]).
    fn get_many(&mut self, keys: &[u64]) -> Result<(), Failed> {
        let got = self.session.get_many(keys).map_err(|error| {
            Failed::new(format_args!("get_many {} keys", keys.len()), error, None)
        })?;
        for (&key, got) in keys.iter().zip(got) {
            self.out.gets += 1;
            self.check_read("get", key, got);
        }
        Ok(())
    }

    /// The requests of `ops` (each [`requests`]) in one pipelined call
    /// (`IdSession::run_many`: `u64` requests or byte values), each
    /// answer checked as its single call's would be; inserts are timed by
    /// the whole call. The reads of the read-modify-writes go first, then
    /// every op's request in order (a read-modify-write's update where it
    /// stands): the ops of one call are in flight together, so any order
    /// is theirs to take, and this one lets the pipeline read every key
    /// in its first batch and write them all in its next (a get and an
    /// update of one key never share a batch).
    fn run_many(&mut self, ops: &[Op]) -> Vec<Result<Option<Write>, Failed>> {
        let split: Vec<(Option<Request>, Request)> = ops.iter().filter_map(requests).collect();
        let reads: Vec<Request> = split.iter().filter_map(|&(read, _)| read).collect();
        let mut reqs = reads.clone();
        reqs.extend(split.iter().map(|&(_, r)| r));
        let busy = |ctx: &RunCtx| ctx.activity.iter().any(AgentActivity::busy);
        let before = busy(self.ctx);
        let start = self.now();
        let mut answers = self.session.run_many(&reqs).into_iter();
        let took = self.now() - start;
        let retraining = before || busy(self.ctx);
        let mut read_answers: Vec<Result<Found, KvError>> =
            answers.by_ref().take(reads.len()).collect();
        read_answers.reverse();
        let prior = |a: Result<Found, KvError>| {
            a.map(|f| match f {
                Found::Wrote(p) => p,
                // A write is never answered with a read.
                Found::Read(_) => Prior::Present,
            })
        };
        let got = |a: Result<Found, KvError>| {
            a.map(|f| match f {
                Found::Read(v) => v,
                Found::Wrote(_) => None,
            })
        };
        split
            .iter()
            .zip(answers)
            .map(|(&(read, r), a)| match (read, r) {
                (Some(_), Request::Update(key, value)) => {
                    let read = read_answers.pop().unwrap_or(Err(KvError::BadConfig {
                        field: "read-modify-write",
                        reason: "its read was not answered",
                    }));
                    // Checked in the order a single read-modify-write
                    // checks them: its read, then its update.
                    let read = got(read).map(|v| {
                        self.out.gets += 1;
                        self.check_read("read-modify-write's get", key, v);
                    });
                    let w = self.update_answer("read-modify-write's update", key, value, prior(a));
                    match read {
                        Ok(()) => w,
                        // The update ran (or may have): its write counts.
                        Err(error) => Err(Failed::new(
                            format_args!("get {key}"),
                            error,
                            w.unwrap_or_else(|f| f.write),
                        )),
                    }
                }
                (_, Request::Get(key)) => {
                    let v = got(a)
                        .map_err(|error| Failed::new(format_args!("get {key}"), error, None))?;
                    self.out.gets += 1;
                    self.check_read("get", key, v);
                    Ok(None)
                }
                (_, Request::Update(key, value)) => {
                    self.update_answer("update", key, value, prior(a))
                }
                (_, Request::Insert(key, value)) => {
                    self.insert_answer(key, value, prior(a), (took, retraining))
                }
                (_, Request::Delete(key)) => self.delete_answer(key, prior(a)),
            })
            .collect()
    }

    /// Checks what a get of `key` read.
    fn check_read(&mut self, what: &str, key: u64, got: Option<Read>) {
        let got = match got {
            None => Prior::Absent,
            Some(Read::Id(v)) => Prior::Id(v),
            Some(Read::Foreign(len)) => {
                self.out.problems.push(|| {
                    format!(
                        "{what} of key {key} returned {len} bytes that are no value written to it"
                    )
                });
                return;
            }
        };
        self.check_present(what, key, got);
    }

    fn update(&mut self, what: &str, key: u64, value: u64) -> Result<Option<Write>, Failed> {
        let r = self.session.update(key, value);
        self.update_answer(what, key, value, r)
    }

    /// Checks what an update of `key` to `value` answered.
    fn update_answer(
        &mut self,
        what: &str,
        key: u64,
        value: u64,
        r: Result<Prior, KvError>,
    ) -> Result<Option<Write>, Failed> {
        let prior = r.map_err(|error| {
            Failed::new(
                format_args!("update {key}"),
                error,
                Some(Write::Unknown {
                    key,
                    value: Some(value),
                }),
            )
        })?;
        if !prior.present() && self.unsure.contains(&key) {
            // Its insert did not take effect: the update wrote nothing.
            return Ok(None);
        }
        self.check_present(what, key, prior);
        Ok(Some(Write::Applied {
            key,
            value: Some(value),
        }))
    }

    /// A delete of a key this thread owns: present, unless its insert
    /// failed. Either way the key is absent after it.
    fn delete(&mut self, key: u64) -> Result<Option<Write>, Failed> {
        let r = self.session.delete(key);
        self.delete_answer(key, r)
    }

    /// Checks what a delete of `key` answered.
    fn delete_answer(
        &mut self,
        key: u64,
        r: Result<Prior, KvError>,
    ) -> Result<Option<Write>, Failed> {
        let prior = r.map_err(|error| {
            Failed::new(
                format_args!("delete {key}"),
                error,
                Some(Write::Unknown { key, value: None }),
            )
        })?;
        self.check_present("delete", key, prior);
        self.unsure.remove(&key);
        Ok(Some(Write::Applied { key, value: None }))
    }

    fn insert(&mut self, key: u64, value: u64) -> Result<Option<Write>, Failed> {
        let busy = || self.ctx.activity.iter().any(AgentActivity::busy);
        let before = busy();
        let start = self.now();
        let r = self.session.insert(key, value);
        let took = self.now() - start;
        let retraining = before || busy();
        self.insert_answer(key, value, r, (took, retraining))
    }

    /// Checks what an insert of `key` with `value` answered, which took
    /// `took` ns (`retraining`: while a memory node was retraining).
    fn insert_answer(
        &mut self,
        key: u64,
        value: u64,
        r: Result<Prior, KvError>,
        (took, retraining): (u64, bool),
    ) -> Result<Option<Write>, Failed> {
        if retraining {
            self.out.insert_retraining.record(took);
        } else {
            self.out.insert_quiet.record(took);
        }
        let prior = r.map_err(|error| {
            self.unsure.insert(key);
            Failed::new(
                format_args!("insert {key}"),
                error,
                Some(Write::Unknown {
                    key,
                    value: Some(value),
                }),
            )
        })?;
        if prior.present() {
            self.out
                .problems
                .push(|| format!("insert of new key {key} found it present ({prior:?})"));
        }
        Ok(Some(Write::Applied {
            key,
            value: Some(value),
        }))
    }

    fn scan(&mut self, from: u64, len: usize) -> Result<(), Failed> {
        self.scan_many(&[(from, len)])
    }

    /// The scans `(from, len)` of `scans`, read together
    /// ([`IdSession::scan_many`]), each checked as a single scan.
    fn scan_many(&mut self, scans: &[(u64, usize)]) -> Result<(), Failed> {
        let found = self.session.scan_many(scans).map_err(|error| match scans {
            [(from, len)] => Failed::new(format_args!("scan {from} {len}"), error, None),
            _ => Failed::new(
                format_args!("scan_many of {} scans", scans.len()),
                error,
                None,
            ),
        })?;
        for (&(from, len), entries) in scans.iter().zip(found) {
            self.check_scan(from, len, &entries);
        }
        Ok(())
    }

    /// Checks what a scan of `len` pairs from `from` (a present key)
    /// returned: sorted, from `from` (unless its insert failed), values
    /// written to their keys.
    fn check_scan(&mut self, from: u64, len: usize, entries: &[(u64, Read)]) {
        let sorted = entries.windows(2).all(|w| w[0].0 < w[1].0);
        let at_from = entries.first().is_some_and(|e| e.0 == from);
        // A key whose insert failed may be absent: the scan starts later.
        let first_ok = at_from
            || (self.unsure.contains(&from) && !entries.first().is_some_and(|e| e.0 <= from));
        if at_from {
            self.unsure.remove(&from);
        }
        let p = &mut self.out.problems;
        if !sorted || !first_ok || entries.len() > len {
            p.push(|| {
                format!(
                    "scan from present key {from} for {len}: {} entries, sorted {sorted}, starts at it {first_ok}",
                    entries.len()
                )
            });
        }
        for &(k, r) in entries {
            match r {
                Read::Id(v) if !self.ctx.value_ok(k, v) => {
                    p.push(|| format!("scan returned key {k} with {v}, never written to it"))
                }
                Read::Foreign(len) => p.push(|| {
                    format!(
                        "scan returned key {k} with {len} bytes that are no value written to it"
                    )
                }),
                Read::Id(_) => {}
            }
        }
    }

    /// Checks `got`, what `what` saw of `key` (present when issued) —
    /// unless it is absent and its insert failed. A write with byte
    /// values only says the key was present, not with which value.
    fn check_present(&mut self, what: &str, key: u64, got: Prior) {
        // Most runs have no unsure key: skip the set's hashing then.
        if !self.unsure.is_empty() {
            if got.present() {
                self.unsure.remove(&key);
            } else if self.unsure.contains(&key) {
                return;
            }
        }
        match got {
            Prior::Absent => self
                .ctx
                .check_value(&mut self.out.problems, what, key, None),
            Prior::Id(v) => self
                .ctx
                .check_value(&mut self.out.problems, what, key, Some(v)),
            Prior::Present => {}
        }
    }
}

/// Runs one thread's stream. Errors abort the whole run, unless faults
/// are injected: then a failed operation is counted, and the write it
/// attempted recorded as one that may or may not have taken effect.
fn run_thread(
    client: &ClusterClient,
    ctx: &RunCtx,
    t: usize,
    done: &AtomicU64,
    abort: &AtomicBool,
) -> Result<ThreadOut, String> {
    let session = client.session().map_err(|e| format!("thread {t}: {e}"))?;
    let mut run = StreamRun {
        session: IdSession::new(session, ctx.value_size),
        ctx,
        out: ThreadOut::new(),
        unsure: HashSet::new(),
    };
    ctx.start.wait();
    run.out.began = Instant::now();
    let mut since = 0;
    // One clock read per operation: the previous return stands for this
    // invocation. It is earlier than the real one, which only widens the
    // write's interval (the final-state check stays sound) and adds the
    // loop's few nanoseconds to the latency.
    let mut inv = run.now();
    let stream = &ctx.streams[t];
    let mut at = 0;
    while at < stream.len() {
        if abort.load(Ordering::Relaxed) {
            break;
        }
        // A run of gets, read together; or of gets and writes, run
        // together.
        let gets = stream[at..]
            .iter()
            .take(ctx.depth)
            .take_while(|op| matches!(op, Op::Read(_)))
            .count();
        let mixed = stream[at..]
            .iter()
            .take(ctx.depth)
            .take_while(|op| requests(op).is_some())
            .count();
        if mixed > 1 && mixed > gets {
            let ops = &stream[at..at + mixed];
            let answers = run.run_many(ops);
            let ret = run.now();
            for (op, r) in ops.iter().zip(answers) {
                let write = match r {
                    Ok(write) => write,
                    Err(f) if ctx.tolerates(&f, client) => {
                        run.out.failed += 1;
                        f.write
                    }
                    Err(f) => return Err(f.message),
                };
                run.out.record(op, (inv, ret), write);
            }
            inv = ret;
            at += mixed;
            since += mixed as u64;
            if since >= PROGRESS_EVERY {
                done.fetch_add(since, Ordering::Relaxed);
                since = 0;
            }
            continue;
        }
        if gets > 1 {
            let keys: Vec<u64> = stream[at..at + gets]
                .iter()
                .map(|op| match op {
                    Op::Read(k) => *k,
                    _ => 0,
                })
                .collect();
            match run.get_many(&keys) {
                Ok(()) => {}
                Err(f) if ctx.tolerates(&f, client) => run.out.failed += gets as u64,
                Err(f) => return Err(f.message),
            }
            let ret = run.now();
            for op in &stream[at..at + gets] {
                run.out.record(op, (inv, ret), None);
            }
            inv = ret;
            at += gets;
            since += gets as u64;
            if since >= PROGRESS_EVERY {
                done.fetch_add(since, Ordering::Relaxed);
                since = 0;
            }
            continue;
        }
        let scans: Vec<(u64, usize)> = stream[at..]
            .iter()
            .take(ctx.depth)
            .map_while(|op| match *op {
                Op::Scan { from, len } => Some((from, len)),
                _ => None,
            })
            .collect();
        if scans.len() > 1 {
            match run.scan_many(&scans) {
                Ok(()) => {}
                Err(f) if ctx.tolerates(&f, client) => run.out.failed += scans.len() as u64,
                Err(f) => return Err(f.message),
            }
            let ret = run.now();
            for op in &stream[at..at + scans.len()] {
                run.out.record(op, (inv, ret), None);
            }
            inv = ret;
            at += scans.len();
            since += scans.len() as u64;
            if since >= PROGRESS_EVERY {
                done.fetch_add(since, Ordering::Relaxed);
                since = 0;
            }
            continue;
        }
        let op = &stream[at];
        at += 1;
        let write = match run.execute(*op) {
            Ok(write) => write,
            Err(f) if ctx.tolerates(&f, client) => {
                run.out.failed += 1;
                f.write
            }
            Err(f) => return Err(f.message),
        };
        let ret = run.now();
        run.out.record(op, (inv, ret), write);
        inv = ret;
        since += 1;
        if since >= PROGRESS_EVERY {
            done.fetch_add(since, Ordering::Relaxed);
            since = 0;
        }
    }
    // The unordered fabric's last unlock may still be in flight. With
    // injected faults it may fail: the locks counted at the end show it.
    if let Err(e) = run.session.session.flush() {
        let lost = ctx.keep_going && node_lost(&e, client).is_some();
        if !ctx.faults && !lost {
            return Err(format!("thread {t}: {e}"));
        }
    }
    run.out.ended = Instant::now();
    done.fetch_add(since, Ordering::Relaxed);
    Ok(run.out)
}

/// Runs `f(t)` on `threads` threads while a progress bar follows `done`;
/// the first error stops the others.
fn with_progress<T: Send>(
    threads: usize,
    total: u64,
    msg: &str,
    quiet: bool,
    f: impl Fn(usize, &AtomicU64, &AtomicBool) -> Result<T, String> + Sync,
) -> Result<Vec<T>, BenchError> {
    let done = AtomicU64::new(0);
    let abort = AtomicBool::new(false);
    let pb = if quiet {
        ProgressBar::hidden()
    } else {
        bar(total, msg)
    };
    let results: Vec<Result<T, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (f, done, abort) = (&f, &done, &abort);
                s.spawn(move || {
                    let r = f(t, done, abort);
                    if r.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        while !handles.iter().all(|h| h.is_finished()) {
            pb.set_position(done.load(Ordering::Relaxed));
            std::thread::sleep(Duration::from_millis(50));
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    pb.finish_and_clear();
    results.into_iter().map(|r| r.map_err(Into::into)).collect()
}

/// `b − a`, field by field (counters only grow).
fn diff(a: &OpStats, b: &OpStats) -> OpStats {
    OpStats {
        ops: b.ops - a.ops,
        rtts: b.rtts - a.rtts,
        posted: b.posted - a.posted,
        bytes_read: b.bytes_read - a.bytes_read,
        bytes_written: b.bytes_written - a.bytes_written,
        atomics: b.atomics - a.atomics,
        leaves_read: b.leaves_read - a.leaves_read,
        retries: b.retries - a.retries,
        refreshes: b.refreshes - a.refreshes,
        keys: b.keys - a.keys,
        value_bytes: b.value_bytes - a.value_bytes,
    }
}

fn merged_stats(clients: &[ClusterClient]) -> KvStats {
    let mut s = KvStats::default();
    for c in clients {
        s.merge(&c.stats());
    }
    s
}

/// The shape of the raw baseline.
#[derive(Clone, Copy, Debug)]
struct RawSpec {
    /// Batches over all threads.
    batches: u64,
    /// Whether faults are injected: a read that failed still made its
    /// round trip, and counts.
    faults: bool,
    /// `--keep-going`: keys of memory nodes found down in the run are
    /// left out of the plan, and a node whose batch fails in the raw
    /// phase is left out from then on (its batches not counted).
    keep_going: bool,
}

/// One thread's replay of its gets' doorbell batches: per batch, the node
/// it goes to and its reads, `(pool offset, length)`, in `reads`.
#[derive(Default)]
struct RawPlan {
    batches: Vec<(usize, std::ops::Range<usize>)>,
    reads: Vec<(u64, u64)>,
}

/// The raw fabric baseline: each thread replays, as plain one-sided
/// doorbell batches, the reads a get of its operations' keys posts (the
/// model's directory word and the key's chain as the cached model has it:
/// [`rolex_host::kv::ClusterSession::get_reads`], taken before the clock
/// starts), `batches` batches in all; returns the batches made per second. The baseline so reads the
/// very bytes, positions and counts of the workload's gets — their skew and
/// cache behaviour — without any of their CPU.
fn raw_reads(
    clients: &[ClusterClient],
    pools: &[PoolInfo],
    streams: &[Vec<Op>],
    spec: RawSpec,
    quiet: bool,
) -> Result<f64, BenchError> {
    let RawSpec {
        batches,
        faults,
        keep_going,
    } = spec;
    let threads = streams.len();
    let start = Barrier::new(threads);
    let t0 = std::sync::Mutex::new(None::<Instant>);
    let ends = with_progress(threads, batches, "raw", quiet, |t, done, abort| {
        let client = &clients[t % clients.len()];
        let mine = batches / threads as u64 + u64::from((t as u64) < batches % threads as u64);
        // The plan: what each of this thread's first keys' gets would read.
        let mut plan = RawPlan::default();
        let mut session = client
            .session()
            .map_err(|e| format!("raw reads: opening a session: {e}"))?;
        for op in streams[t].iter().take(mine as usize) {
            let key = match *op {
                Op::Read(key)
                | Op::Update { key, .. }
                | Op::Insert { key, .. }
                | Op::ReadModifyWrite { key, .. }
                | Op::Delete { key }
                | Op::Scan { from: key, .. } => key,
            };
            match retry_injected(|| session.get_reads(key)) {
                // Planned from the cached model without a round trip: a
                // node found down in the run is left out here too.
                Ok((node, _)) if keep_going && client.is_down(node) => {}
                Ok((node, reads)) => {
                    let from = plan.reads.len();
                    plan.reads.extend(reads);
                    plan.batches.push((node, from..plan.reads.len()));
                }
                Err(e) if faults || (keep_going && node_lost(&e, client).is_some()) => {}
                Err(e) => return Err(format!("raw reads: planning key {key}: {e}")),
            }
        }
        drop(session);
        // A buffer as large as the largest batch and a channel on the
        // engine of each node's client.
        let most = plan
            .batches
            .iter()
            .map(|(_, r)| {
                plan.reads[r.clone()]
                    .iter()
                    .map(|&(_, len)| len)
                    .sum::<u64>()
            })
            .max()
            .unwrap_or(8)
            .max(8);
        let (mut dsts, mut chans) = (Vec::new(), Vec::new());
        for node in 0..pools.len() {
            let engine: &TransferEngine = client
                .node(node)
                .ok_or("raw reads: a memory node without a client")?
                .engine();
            let (dst, _) = engine
                .alloc_mr(most, Access::LOCAL_WRITE)
                .map_err(|e| format!("raw reads: registering a buffer: {e}"))?;
            let ch = engine
                .channel()
                .map_err(|e| format!("raw reads: opening a channel: {e}"))?;
            dsts.push(dst);
            chans.push(ch);
        }
        let mut ops = Vec::new();
        let mut results = Vec::new();
        // `--keep-going`: nodes whose batch failed here (lost during the
        // raw phase); their batches are skipped, and not counted.
        let mut lost = vec![false; pools.len()];
        let mut made = 0u64;
        start.wait();
        {
            let mut g = t0.lock().unwrap_or_else(|e| e.into_inner());
            g.get_or_insert_with(Instant::now);
        }
        for i in 0..mine {
            if abort.load(Ordering::Relaxed) {
                break;
            }
            let Some((node, reads)) = plan
                .batches
                .get(i as usize % plan.batches.len().max(1))
                .map(|(node, r)| (*node, &plan.reads[r.clone()]))
            else {
                return Err("raw reads: no key's reads could be planned".into());
            };
            if lost[node] {
                continue;
            }
            let (pool, dst) = (&pools[node].desc, &dsts[node]);
            ops.clear();
            let mut at = 0;
            for &(src_offset, len) in reads {
                ops.push(BatchOp::Read {
                    dst,
                    dst_offset: at,
                    src: pool,
                    src_offset,
                    len,
                });
                at += len;
            }
            let failed = match chans[node].run(&ops, &mut results) {
                Err(e) => Some(e.to_string()),
                Ok(_) if faults => None,
                Ok(_) => results
                    .iter()
                    .find_map(|r| r.as_ref().err())
                    .map(|e| e.to_string()),
            };
            if let Some(e) = failed {
                if !keep_going {
                    return Err(format!("raw reads: {e}"));
                }
                if !quiet {
                    eprintln!(
                        "rolex bench: raw reads: memory node {node} failed ({e}); \
                         its batches are left out of raw_read_mops"
                    );
                }
                lost[node] = true;
                continue;
            }
            made += 1;
            if (i + 1) % PROGRESS_EVERY == 0 {
                done.fetch_add(PROGRESS_EVERY, Ordering::Relaxed);
            }
        }
        Ok((Instant::now(), made))
    })?;
    let t0 = t0
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .ok_or("raw reads never started")?;
    let made: u64 = ends.iter().map(|&(_, made)| made).sum();
    let end = ends
        .into_iter()
        .map(|(end, _)| end)
        .max()
        .ok_or("raw reads: no thread")?;
    Ok(made as f64 / (end - t0).as_secs_f64().max(1e-9))
}

/// Reads every written key back and checks it ([`final_possible`]);
/// returns the problems, and the keys that could not be read back because
/// their memory node is down (`--keep-going`; none otherwise: such a read
/// is an error).
fn verify(
    clients: &[ClusterClient],
    loaded: &[u64],
    writes: HashMap<u64, Vec<KeyWrites>>,
    (args, value_size): (&BenchArgs, ValueSize),
    by_others: &(dyn Fn(u64, Option<u64>) -> bool + Sync),
) -> Result<(Problems, u64), BenchError> {
    let keys: Vec<(u64, Vec<KeyWrites>)> = writes.into_iter().collect();
    let n = keys.len() as u64;
    let per = keys.len().div_ceil(args.threads.max(1)).max(1);
    let chunks: Vec<&[(u64, Vec<KeyWrites>)]> = keys.chunks(per).collect();
    let found = with_progress(chunks.len(), n, "verify", args.json, |t, done, abort| {
        let client = &clients[t % clients.len()];
        let s = client.session().map_err(|e| format!("verify: {e}"))?;
        let mut s = IdSession::new(s, value_size);
        let mut problems = Problems::default();
        let mut unverified = 0u64;
        for (i, (key, w)) in chunks[t].iter().enumerate() {
            if abort.load(Ordering::Relaxed) {
                break;
            }
            let read = match retry_injected(|| s.get(*key)) {
                Err(e) if args.keep_going && node_lost(&e, client).is_some() => {
                    unverified += 1;
                    continue;
                }
                r => r.map_err(|e| format!("verify: get {key}: {e}"))?,
            };
            let got = match read {
                None => None,
                Some(Read::Id(v)) => Some(v),
                Some(Read::Foreign(len)) => {
                    problems.push(|| {
                        format!("key {key}: read back {len} bytes that are no value written to it")
                    });
                    continue;
                }
            };
            let initial = loaded
                .binary_search(key)
                .is_ok()
                .then(|| ycsb::load_value(*key));
            if !final_possible(initial, w, got) && !by_others(*key, got) {
                problems.push(|| mismatch(*key, got, w));
            }
            if (i as u64 + 1) % PROGRESS_EVERY == 0 {
                done.fetch_add(PROGRESS_EVERY, Ordering::Relaxed);
            }
        }
        Ok((problems, unverified))
    })?;
    let mut all = Problems::default();
    let mut unverified = 0;
    for (p, u) in found {
        all.merge(p);
        unverified += u;
    }
    Ok((all, unverified))
}

/// What a key read back as `got` should have held, given the writes `w`.
fn mismatch(key: u64, got: Option<u64>, w: &[KeyWrites]) -> String {
    let applied: Vec<Option<u64>> = w
        .iter()
        .filter_map(|w| w.applied)
        .map(|w| w.value)
        .collect();
    let unknown: Vec<Option<u64>> = w.iter().flat_map(|w| &w.unknown).map(|w| w.value).collect();
    let mut s = format!("key {key}: read back {got:?}, but the run's last writes were {applied:?}");
    if !unknown.is_empty() {
        s += &format!(" (and failed writes, which may have taken effect, {unknown:?})");
    }
    s
}

/// Tries of a step that only reads (connecting, a verifying get) that
/// fails with an injected fault, before the run gives up.
const INJECTED_TRIES: u32 = 1000;

/// Runs `f`, again while it fails with an injected fault, at most
/// [`INJECTED_TRIES`] times: for steps that only read, so a failed try
/// leaves nothing to undo. (Without injected faults, one try.)
fn retry_injected<T>(f: impl FnMut() -> Result<T, KvError>) -> Result<T, KvError> {
    retry_while(f, |e| {
        matches!(
            e.on_node(),
            KvError::Transfer {
                error: TransferError::InjectedFault { .. },
                ..
            }
        )
    })
}

/// [`retry_injected`] for an idempotent write (the same key set to the
/// same value): a try whose error came of injected faults only is made
/// again even if it may have taken effect, or left its chain's lock
/// maybe held (the session releases that itself before its next
/// operation).
fn retry_injected_idempotent<T>(f: impl FnMut() -> Result<T, KvError>) -> Result<T, KvError> {
    retry_while(f, only_injected)
}

/// Whether every failure behind `e` is an injected fault.
fn only_injected(e: &KvError) -> bool {
    match e.on_node() {
        KvError::Transfer {
            error: TransferError::InjectedFault { .. },
            ..
        } => true,
        KvError::Indeterminate(inner) => only_injected(inner),
        KvError::LockMaybeHeld { release, after, .. } => {
            only_injected(release) && after.as_deref().map_or(true, only_injected)
        }
        _ => false,
    }
}

/// Runs `f` while its error `retry`s, at most [`INJECTED_TRIES`] times.
fn retry_while<T>(
    mut f: impl FnMut() -> Result<T, KvError>,
    retry: impl Fn(&KvError) -> bool,
) -> Result<T, KvError> {
    let mut tries = 1;
    loop {
        match f() {
            Err(e) if tries < INJECTED_TRIES && retry(&e) => tries += 1,
            r => return r,
        }
    }
}

/// Runs `rolex bench`, step by step: check the arguments, plan the run
/// and its key sets ([`Setup::prepare`]), start or reach the memory node
/// and connect the compute nodes ([`Store::start`]), generate the
/// operations ([`generate_streams`]), run them ([`run_workload`]) and
/// count the locks left once the run settled ([`settled_locks`]), merge
/// what the threads saw ([`Merged::from_threads`]), derive the figures and
/// measure the raw baseline ([`Figures::measure`]), read every written key
/// back ([`verify_final`]), then print ([`Report`]) and plot, and fail if
/// anything did not verify ([`verdict`]).
pub fn run(args: BenchArgs) -> Result<(), BenchError> {
    validate(&args)?;
    let quiet = args.json;
    let mut setup = Setup::prepare(&args)?;
    let store = Store::start(&args, &setup, quiet)?;
    if let Some(n) = args.grow {
        grow(&args, &mut setup, &store, n, quiet)?;
    }
    let before = Snapshot::take(&store);
    let ctx = RunCtx {
        streams: generate_streams(&setup.plan, &setup.sets, args.ops)?,
        epoch: Instant::now(),
        start: Barrier::new(args.threads),
        activity: store.nodes.iter().map(MemoryNode::activity).collect(),
        faults: args.injects(),
        keep_going: args.keep_going,
        lost: Mutex::default(),
        value_size: setup.value_size,
        depth: args.depth,
    };
    let outs = run_workload(&args, &store, &ctx, setup.base, quiet)?;
    let after = Snapshot::take(&store);
    let locks_held_end = settled_locks(&store)?;
    let space = Space::settled(&before, &store);
    let mut merged = Merged::from_threads(outs, ctx.epoch);
    let figures = Figures::measure(&args, &setup, &store, &ctx, (&before, &after), &merged)?;
    let written = merged.writes.len();
    let writes = std::mem::take(&mut merged.writes);
    let (problems, keys_unverified) = verify_final(&args, &setup, &store, &ctx, writes)?;
    merged.problems.merge(problems);
    let report = Report {
        args: &args,
        setup: &setup,
        store: &store,
        counters: (&before, &after),
        merged: &merged,
        figures: &figures,
        verified: merged.problems.count == 0,
        written,
        keys_unverified,
        lost: &ctx.lost,
        locks_held_end,
        space,
    };
    if args.json {
        report.print_json();
    } else {
        report.print_table();
    }
    if let Some(path) = &args.plot {
        plot_run(&args, &setup, &ctx, &merged, path)?;
    }
    verdict(&merged.problems)
}

/// Step 2b (`--grow N`): appends `n` keys above the loaded range, each
/// with its load value, `--threads` sessions at once (key `i` to thread
/// `i mod T`, so the keys rise over time), behind a progress bar; then
/// adds them to the loaded keys (and, shuffled, to the load order), so
/// the run reads them as loaded keys and the final check knows their
/// values.
fn grow(
    args: &BenchArgs,
    setup: &mut Setup,
    store: &Store,
    n: u64,
    quiet: bool,
) -> Result<(), BenchError> {
    let loaded = &setup.sets.loaded;
    let (min, max) = match (loaded.first(), loaded.last()) {
        (Some(&a), Some(&b)) => (a, b),
        _ => (0, 0),
    };
    let room = u64::MAX - max;
    if n > room {
        return Err(
            format!("--grow {n}: only {room} keys fit above the largest loaded key").into(),
        );
    }
    let mean = (max - min) / (loaded.len() as u64).saturating_sub(1).max(1);
    let gap = mean.min(room / n.max(1)).max(1);
    let keys: Vec<u64> = (1..=n).map(|i| max + i * gap).collect();
    let t = args.threads.max(1);
    with_progress(t, n, "growing the store", quiet, |th, done, abort| {
        let s = store.clients[th % store.clients.len()]
            .session()
            .map_err(|e| format!("grow: {e}"))?;
        let mut s = IdSession::new(s, setup.value_size);
        for (i, &k) in keys.iter().enumerate().skip(th).step_by(t) {
            if abort.load(Ordering::Relaxed) {
                break;
            }
            retry_injected_idempotent(|| s.insert(k, ycsb::load_value(k)))
                .map_err(|e| format!("grow: insert {k}: {e}"))?;
            if (i as u64 / t as u64 + 1) % PROGRESS_EVERY == 0 {
                done.fetch_add(PROGRESS_EVERY * t as u64, Ordering::Relaxed);
            }
        }
        s.session.flush().map_err(|e| format!("grow: {e}"))
    })?;
    let mut order: Vec<u64> = setup.sets.order.to_vec();
    let mut added = keys.clone();
    {
        use rand::seq::SliceRandom;
        use rand::SeedableRng;
        added.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(
            args.data.seed ^ n,
        ));
    }
    order.extend(added);
    setup.sets.order = order.into();
    setup.sets.loaded.extend(keys);
    Ok(())
}

/// Step 1: the plan, the key sets and, against a remote memory node, its
/// pool and this process's lease.
struct Setup {
    plan: Plan,
    sets: KeySets,
    /// The memory nodes in other processes, in shard order, if the run is
    /// against them.
    remotes: Vec<Remote>,
    /// Which memory node serves which keys: the remote nodes' map, or
    /// `--memnodes` ranges of the loaded keys' quantiles.
    map: PartitionMap,
    /// This process's first thread of the plan.
    base: usize,
    /// The run's value sizes: `--value-size`, or the remote memory
    /// node's (they must agree), else 8.
    value_size: ValueSize,
    /// This process's lease at each remote memory node (its id is what
    /// the chain locks there carry), held until the run ends, so each
    /// node releases this process's chain locks if it dies holding them.
    leases: Vec<Option<LeaseClient>>,
}

impl Setup {
    /// Plans `args`'s run: every process's threads (`--compute-count` of
    /// them share the plan), and the key sets — the run's inserts held out
    /// of the local data set (all of it with `-n 0`), or new keys for the
    /// remote memory node's, whose key set is rebuilt here.
    fn prepare(args: &BenchArgs) -> Result<Self, BenchError> {
        let share = args.compute_count;
        let plan = Plan::new(
            args.workload,
            args.ops
                .checked_mul(share as u64)
                .ok_or("--ops × --compute-count overflows")?,
            args.threads
                .checked_mul(share)
                .ok_or("--threads × --compute-count overflows")?,
            args.zipf,
            args.data.seed,
        )?;
        let remotes = memnode_addrs(args)
            .into_iter()
            .map(|server| fetch_remote(args, server))
            .collect::<Result<Vec<_>, _>>()?;
        let remote = match remotes.first() {
            Some(r) => {
                // The nodes agree on the data set (checked first), so the
                // first one's is every one's.
                let map = cluster_map(&remotes)?;
                let keys = remote_keys(args, &r.addr, r)?;
                Some((remotes, keys, map))
            }
            None => None,
        };
        let (remotes, sets, map) = match remote {
            // The memory node loaded its whole data set: new keys come from
            // its gaps, or its generator, the same in every process.
            Some((remotes, (keys, dist), map)) => {
                let drawn = match dist {
                    Some(dist) if plan.needs_drawn_keys(&keys) => {
                        let n = (keys.len() as u64)
                            .checked_add(plan.total_inserts())
                            .ok_or("the memory node's keys plus the run's inserts overflow")?;
                        Some(dataset::generate(dist, n, plan.drawn_seed())?)
                    }
                    _ => None,
                };
                (remotes, plan.split_fresh(keys, drawn)?, map)
            }
            None => {
                // `-n 0` with `--dist`: every key is generated to insert.
                let start = if args.data.n == Some(0) && args.data.keys.is_none() {
                    Start::Empty
                } else {
                    Start::Loaded
                };
                let keys = args.data.load(plan.held_out(start), EmptyFile::Reject)?;
                let sets = plan.split(keys, start)?;
                let map = PartitionMap::balanced(&sets.loaded, args.memnodes)
                    .map_err(|e| format!("--memnodes {}: {e}", args.memnodes))?;
                (Vec::new(), sets, map)
            }
        };
        let leases = remotes
            .iter()
            .map(|r| {
                r.desc
                    .lease
                    .map(|port| acquire_lease(&r.addr, port, &args.token))
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let value_size = match remotes.first() {
            Some(r) => r.desc.value_size,
            None => args.value_size.unwrap_or_default(),
        };
        Ok(Setup {
            plan,
            sets,
            remotes,
            map,
            base: args.compute_index * args.threads,
            value_size,
            leases,
        })
    }

    /// The loaded keys node `node` of the map holds.
    fn loaded_on(&self, node: usize) -> &[u64] {
        crate::memnode::range_of(&self.sets.loaded, &self.map, node)
    }

    /// This process's threads of the plan.
    fn mine(&self, args: &BenchArgs) -> std::ops::Range<usize> {
        self.base..self.base + args.threads
    }
}

/// Step 2: the memory nodes — started here and bulk-loaded, each with
/// its range of the key set, or the remote ones' pools — and the compute
/// nodes connected to them.
struct Store {
    /// The memory nodes, when they run in this process (in map order).
    nodes: Vec<MemoryNode>,
    /// Every memory node's pool, in map order.
    pools: Vec<PoolInfo>,
    load_time: Duration,
    /// The compute nodes: each a client of every memory node.
    clients: Vec<ClusterClient>,
}

impl Store {
    /// Starts the store `setup` plans: the local memory nodes (each loaded
    /// with its range of the key set) unless the run is against remote
    /// ones, then `--clients` compute nodes, each with an engine of its
    /// own per memory node.
    fn start(args: &BenchArgs, setup: &Setup, quiet: bool) -> Result<Self, BenchError> {
        let engine_cfg = engine_config(args)?;
        let client_cfg = KvClientConfig {
            engine: client_engine(args, engine_cfg.clone()),
            ..KvClientConfig::default()
        };
        let (nodes, pools, names, load_time): (_, Vec<PoolInfo>, Vec<String>, _) =
            if setup.remotes.is_empty() {
                let mut nodes = Vec::new();
                let mut load_time = Duration::ZERO;
                for i in 0..setup.map.nodes() {
                    let loaded = setup.loaded_on(i);
                    let cfg = memory_node_config(args, setup, loaded.len(), engine_cfg.clone());
                    let (node, took) = bulk_load(cfg, loaded, setup.value_size, quiet)?;
                    load_time += took;
                    nodes.push(node);
                }
                let pools = nodes.iter().map(MemoryNode::pool).collect();
                let names = (0..nodes.len()).map(|i| format!("local {i}")).collect();
                (nodes, pools, names, load_time)
            } else {
                let pools = setup.remotes.iter().map(|r| r.pool.clone()).collect();
                let names = setup.remotes.iter().map(|r| r.addr.clone()).collect();
                (Vec::new(), pools, names, Duration::ZERO)
            };
        let clients = (0..args.clients)
            .map(|_| connect_cluster(setup, &client_cfg, &pools, &names))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Store {
            nodes,
            pools,
            load_time,
            clients,
        })
    }
}

/// One compute node: a client of each memory node (`pools`, named
/// `names`), with this process's lease there if it holds one, routed by
/// the setup's map.
fn connect_cluster(
    setup: &Setup,
    cfg: &KvClientConfig,
    pools: &[PoolInfo],
    names: &[String],
) -> Result<ClusterClient, BenchError> {
    let mut nodes = Vec::new();
    for (i, (pool, name)) in pools.iter().zip(names).enumerate() {
        let cfg = match setup.leases.get(i).and_then(Option::as_ref) {
            Some(lease) => cfg.clone().with_lease(lease),
            None => KvClientConfig {
                lock_owner: LockOwner::ANONYMOUS,
                ..cfg.clone()
            },
        };
        // Connecting only reads: a try that met an injected fault is made
        // again, on an engine whose faults are drawn from another seed (a
        // new engine with the same seed draws the very same faults, and
        // met the same one at every try).
        // Named as the cluster's errors name a node (`memory node I (NAME)`):
        // a node that dies while this process connects is named the same.
        let mut tries = 0u64;
        let client = retry_injected(|| {
            let mut cfg = cfg.clone();
            if let Fabric::Loopback(LoopbackConfig {
                faults: Some(f), ..
            }) = &mut cfg.engine.fabric
            {
                f.seed = f.seed.wrapping_add(tries);
            }
            tries += 1;
            KvClient::connect(cfg, pool)
        })
        .map_err(|e| {
            if pools.len() > 1 {
                format!("connecting to memory node {i} ({name}): {e}")
            } else {
                format!("connecting to the memory node {name}: {e}")
            }
        })?;
        nodes.push(ClusterNode {
            name: name.clone(),
            client,
        });
    }
    if nodes.len() == 1 {
        if let Some(n) = nodes.pop() {
            return Ok(ClusterClient::single(n.client));
        }
    }
    Ok(ClusterClient::new(setup.map.clone(), nodes)?)
}

/// A memory node's configuration: the pool's shape from the arguments
/// (or the remote node's leaf size), for `loaded` keys, with room for the
/// run's inserts (all of them: their keys may all fall in its range).
fn memory_node_config(
    args: &BenchArgs,
    setup: &Setup,
    loaded: usize,
    engine: EngineConfig,
) -> MemoryNodeConfig {
    let defaults = MemoryNodeConfig::default();
    let leaf_slots = match setup.remotes.first() {
        Some(r) => r.desc.leaf_slots,
        None => args.leaf_slots.unwrap_or(defaults.leaf_slots),
    };
    let fill = args.fill.unwrap_or(defaults.fill);
    let inserts = setup.plan.total_inserts() + args.grow.unwrap_or(0);
    // Room for the run's inserts (and `--grow`'s) even if every synonym leaf ends half full,
    // deletes or not (churn's live keys stay constant, but the store need
    // not reclaim the leaves its deletes empty). The node sizes its spare
    // leaves as a factor of the leaves it loads — one leaf for an empty
    // store — so the factor carries the count.
    let keys_per_leaf = (f64::from(leaf_slots) * fill).round().max(1.0);
    let loaded_leaves = (loaded as f64 / keys_per_leaf).ceil().max(1.0);
    let insert_leaves = 2.0 * inserts as f64 / f64::from(leaf_slots);
    // Value blocks: the loaded ones are sized by the node; beyond them,
    // every insert's block at the largest size, and per compute node a
    // chunk for each size class it may claim and the freed blocks it may
    // hold back (see `rolex_kv`'s value space).
    let value_spare = if setup.value_size.is_u64() {
        None
    } else {
        let block = rolex_core::layout::block_class(setup.value_size.max()).unwrap_or(0);
        let per_client = 64u64 << 20;
        Some(
            inserts
                .saturating_mul(block)
                .saturating_add(per_client.saturating_mul(args.clients as u64))
                .saturating_add(loaded as u64 * block / 4),
        )
    };
    MemoryNodeConfig {
        engine,
        leaf_slots,
        fill,
        epsilon: args.epsilon.unwrap_or(defaults.epsilon),
        spare_leaf_factor: defaults
            .spare_leaf_factor
            .max(0.25 + insert_leaves / loaded_leaves),
        value_spare,
        redo_blocks: args.redo_blocks.unwrap_or(defaults.redo_blocks),
        ..defaults
    }
}

/// Starts a memory node holding `loaded` (each key with its load value),
/// behind a spinner; returns it and how long the load took.
fn bulk_load(
    cfg: MemoryNodeConfig,
    loaded: &[u64],
    size: ValueSize,
    quiet: bool,
) -> Result<(MemoryNode, Duration), BenchError> {
    let sp = spinner(format!("bulk-loading {} keys", loaded.len()));
    let pairs: Vec<(u64, u64)> = loaded.iter().map(|&k| (k, ycsb::load_value(k))).collect();
    let load_start = Instant::now();
    let node = MemoryNode::start_with_values(cfg, &pairs, &mut |k, id, out| size.fill(k, id, out));
    let load_time = load_start.elapsed();
    drop(pairs);
    if quiet {
        sp.finish_and_clear();
    } else {
        sp.finish_with_message(format!(
            "bulk-loaded {} keys in {:.2} s",
            loaded.len(),
            load_time.as_secs_f64()
        ));
    }
    Ok((node?, load_time))
}

/// The counters a run's figures are differences of: the compute nodes',
/// and the local memory node's.
struct Snapshot {
    clients: KvStats,
    /// The local memory nodes' counters summed ([`sum_node_stats`]);
    /// `None` against remote ones.
    node: Option<MemoryNodeStats>,
    /// Per memory node, the operations the compute nodes' sessions made
    /// there (a scan across a boundary counts at each node it read).
    per_node_ops: Vec<u64>,
}

impl Snapshot {
    fn take(store: &Store) -> Self {
        let stats: Vec<MemoryNodeStats> = store.nodes.iter().map(MemoryNode::stats).collect();
        Snapshot {
            clients: merged_stats(&store.clients),
            node: sum_node_stats(&stats),
            per_node_ops: (0..store.pools.len())
                .map(|i| {
                    store
                        .clients
                        .iter()
                        .filter_map(|c| c.node_stats(i))
                        .map(|s| s.total().ops)
                        .sum()
                })
                .collect(),
        }
    }
}

/// The counters of several memory nodes as one: the fields the report
/// reads summed (the longest freeze: the longest of any); `None` for none.
fn sum_node_stats(stats: &[MemoryNodeStats]) -> Option<MemoryNodeStats> {
    let (first, rest) = stats.split_first()?;
    let mut t = *first;
    for s in rest {
        t.agent.retrains += s.agent.retrains;
        t.agent.freeze_ns_max = t.agent.freeze_ns_max.max(s.agent.freeze_ns_max);
        t.models += s.models;
        t.keys_loaded += s.keys_loaded;
        t.leaves_loaded += s.leaves_loaded;
        t.synonym_leaves += s.synonym_leaves;
        t.pool_bytes_used += s.pool_bytes_used;
        t.leaves_live += s.leaves_live;
        t.leaves_free += s.leaves_free;
        t.agent_cpu_ns += s.agent_cpu_ns;
    }
    Some(t)
}

/// Step 3: every process's operation streams (another process's values
/// are checked too), generated before the clock starts.
fn generate_streams(plan: &Plan, sets: &KeySets, ops: u64) -> Result<Vec<Vec<Op>>, BenchError> {
    let sp = spinner(format!("generating {ops} operations"));
    let streams = std::thread::scope(|s| {
        let hs: Vec<_> = (0..plan.threads())
            .map(|t| s.spawn(move || plan.stream(t, sets).collect::<Vec<Op>>()))
            .collect();
        hs.into_iter()
            .map(|h| h.join().map_err(|_| "generating operations panicked"))
            .collect::<Result<_, _>>()
    })?;
    sp.finish_and_clear();
    Ok(streams)
}

/// Step 4: this process's threads run their streams, dealt round-robin
/// over the compute nodes, behind a progress bar.
fn run_workload(
    args: &BenchArgs,
    store: &Store,
    ctx: &RunCtx,
    base: usize,
    quiet: bool,
) -> Result<Vec<ThreadOut>, BenchError> {
    let clients = &store.clients;
    if quiet {
        // No progress bar under --json: one line says the clock started
        // (a script may time what it does to the run from it).
        eprintln!(
            "rolex bench: running {} operations on {} threads",
            args.ops, args.threads
        );
    }
    with_progress(args.threads, args.ops, "run", quiet, |t, done, abort| {
        run_thread(&clients[t % clients.len()], ctx, base + t, done, abort)
    })
}

/// How long the end of a run waits for the retraining agent to go idle
/// before it counts the locks left.
const SETTLE: Duration = Duration::from_secs(5);

/// Step 4, once the threads stopped (their last posted unlocks awaited):
/// the chains still locked, over every model's current LT
/// ([`locks_between_steps`], exact whatever the agent is doing), once the
/// local memory node's agent was idle for a few looks in a row (at most
/// [`SETTLE`]) — the wait only lets a retraining under way finish, for the
/// space figures read next ([`Space::settled`]). `None` when the memory
/// node is remote: other processes may still be running there.
fn settled_locks(store: &Store) -> Result<Option<u64>, BenchError> {
    if store.nodes.is_empty() {
        return Ok(None);
    }
    let deadline = Instant::now() + SETTLE;
    let mut idle_looks = 0;
    while idle_looks < 3 && Instant::now() < deadline {
        let busy = store.nodes.iter().any(|n| n.activity().busy());
        idle_looks = if busy { 0 } else { idle_looks + 1 };
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut locked = 0;
    for node in &store.nodes {
        locked += locks_between_steps(node)?;
    }
    Ok(Some(locked))
}

/// The chains locked in `node`'s pool over every model's current LT, as
/// `rolex inspect --models` counts them, counted between two steps of its
/// retraining agent ([`MemoryNode::between_agent_steps`]). Counted from a
/// copy taken while a retraining ran, a model frozen at that moment would
/// count whole — every LT entry locked by the agent — though no lock is
/// left once the step ends; holding the agent makes the count exact
/// whatever it was doing, where waiting for it to look idle does not (a
/// model backed off after failed freezes is retrained when its backoff
/// ends, long after the agent looked idle).
fn locks_between_steps(node: &MemoryNode) -> Result<u64, BenchError> {
    node.between_agent_steps(|| {
        let pool = node.pool_handle();
        let bytes = pool.to_vec(0, pool.len() as usize)?;
        Ok(crate::inspect::locked_chains(&bytes)?.values().sum::<u64>())
    })
}

/// Step 4, once the run settled: the local memory node's space.
#[derive(Clone, Copy, Debug)]
struct Space {
    /// Bytes of the pool in use before the run and once it settled.
    bytes_start: u64,
    bytes_end: u64,
    /// Leaves holding part of the store, and leaves freed and not reused,
    /// once it settled.
    leaves_live: u64,
    leaves_free: u64,
}

impl Space {
    /// The space from the counters `before` the run and the memory node's
    /// now (after [`settled_locks`] waited for its agent); `None` when the
    /// memory node is remote.
    fn settled(before: &Snapshot, store: &Store) -> Option<Space> {
        let start = before.node.as_ref()?;
        let stats: Vec<MemoryNodeStats> = store.nodes.iter().map(MemoryNode::stats).collect();
        let end = sum_node_stats(&stats)?;
        Some(Space {
            bytes_start: start.pool_bytes_used,
            bytes_end: end.pool_bytes_used,
            leaves_live: end.leaves_live,
            leaves_free: end.leaves_free,
        })
    }
}

/// Step 5: the threads' outputs merged.
struct Merged {
    /// Latencies per operation kind (indexed as [`KINDS`]).
    by_kind: Vec<Histogram>,
    /// Operations completed in each [`INTERVAL_NS`] since the epoch.
    per_interval: Vec<u64>,
    insert_retraining: Histogram,
    insert_quiet: Histogram,
    /// Per key, each thread's writes that may be its final value.
    writes: HashMap<u64, Vec<KeyWrites>>,
    problems: Problems,
    gets: u64,
    /// Operations that returned an error.
    failed: u64,
    /// When the first operation began and the last ended.
    began: Instant,
    ended: Instant,
}

impl Merged {
    /// Merges the threads' outputs; `epoch` stands for the start of a run
    /// without threads.
    fn from_threads(outs: Vec<ThreadOut>, epoch: Instant) -> Self {
        let began = outs.iter().map(|o| o.began).min().unwrap_or(epoch);
        let ended = outs.iter().map(|o| o.ended).max().unwrap_or(began);
        let mut m = Merged {
            by_kind: vec![Histogram::new(); KINDS.len()],
            per_interval: Vec::new(),
            insert_retraining: Histogram::new(),
            insert_quiet: Histogram::new(),
            writes: HashMap::new(),
            problems: Problems::default(),
            gets: 0,
            failed: 0,
            began,
            ended,
        };
        for o in outs {
            for (all, h) in m.by_kind.iter_mut().zip(&o.latency) {
                all.merge(h);
            }
            if m.per_interval.len() < o.per_interval.len() {
                m.per_interval.resize(o.per_interval.len(), 0);
            }
            for (a, b) in m.per_interval.iter_mut().zip(&o.per_interval) {
                *a += b;
            }
            m.insert_retraining.merge(&o.insert_retraining);
            m.insert_quiet.merge(&o.insert_quiet);
            for (k, w) in o.writes {
                m.writes.entry(k).or_default().push(w);
            }
            m.problems.merge(o.problems);
            m.gets += o.gets;
            m.failed += o.failed;
        }
        m
    }
}

/// Step 6: the run's figures, and the fabric's own limit measured with the
/// same threads and compute nodes.
struct Figures {
    /// Per operation kind (indexed as [`KvOp::ALL`]), over the run only.
    per: Vec<OpStats>,
    total_ops: u64,
    total_retries: u64,
    leaves_per_get: f64,
    mops: f64,
    p50_us: f64,
    p99_us: f64,
    raw_mops: f64,
    /// Retrains over the run (`None`: the memory node is remote).
    retrains: Option<u64>,
    synonym_leaves: Option<u64>,
    model_bytes: ModelBytes,
    /// Operations each memory node served over the run (this process's).
    per_node_ops: Vec<u64>,
}

impl Figures {
    /// The figures of a run between the counters `(before, after)`, and
    /// the raw baseline: doorbell batches reading what an average get
    /// reads, at the workload's own keys.
    fn measure(
        args: &BenchArgs,
        setup: &Setup,
        store: &Store,
        ctx: &RunCtx,
        (before, after): (&Snapshot, &Snapshot),
        merged: &Merged,
    ) -> Result<Self, BenchError> {
        let per: Vec<OpStats> = KvOp::ALL
            .iter()
            .map(|&k| diff(&before.clients.op(k), &after.clients.op(k)))
            .collect();
        let get = per[0];
        let leaves_per_get = get.leaves_per_op();
        // The fabric's own limit for what the gets read.
        let raw_mops = raw_reads(
            &store.clients,
            &store.pools,
            &ctx.streams[setup.mine(args)],
            RawSpec {
                batches: merged.gets.clamp(RAW_MIN, RAW_MAX),
                faults: args.injects(),
                keep_going: args.keep_going,
            },
            args.json,
        )? / 1e6;
        let mut latency = Histogram::new();
        merged.by_kind.iter().for_each(|h| latency.merge(h));
        let elapsed = merged.ended - merged.began;
        let retrains = match (&before.node, &after.node) {
            (Some(b), Some(a)) => Some(a.agent.retrains - b.agent.retrains),
            _ => None,
        };
        Ok(Figures {
            total_ops: per.iter().map(|o| o.ops).sum(),
            total_retries: per.iter().map(|o| o.retries).sum(),
            per,
            leaves_per_get,
            mops: args.ops as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6,
            p50_us: latency.quantile(0.5) as f64 / 1e3,
            p99_us: latency.quantile(0.99) as f64 / 1e3,
            raw_mops,
            retrains,
            synonym_leaves: after.node.as_ref().map(|a| a.synonym_leaves),
            model_bytes: store.clients[0].model_bytes(),
            per_node_ops: before
                .per_node_ops
                .iter()
                .zip(&after.per_node_ops)
                .map(|(b, a)| a - b)
                .collect(),
        })
    }
}

/// Step 7: reads every key this process's threads wrote back and checks
/// it against the writes (see [`verify`]).
fn verify_final(
    args: &BenchArgs,
    setup: &Setup,
    store: &Store,
    ctx: &RunCtx,
    writes: HashMap<u64, Vec<KeyWrites>>,
) -> Result<(Problems, u64), BenchError> {
    // A final value another process wrote to the key (checked against its
    // stream) stands: this process cannot know when that write landed.
    let shared = args.compute_count > 1;
    let mine = setup.mine(args);
    let by_others = |key: u64, got: Option<u64>| {
        shared
            && got.is_some_and(|v| {
                ycsb::writer_of(v).is_some_and(|(t, _)| !mine.contains(&t)) && ctx.value_ok(key, v)
            })
    };
    verify(
        &store.clients,
        &setup.sets.loaded,
        writes,
        (args, setup.value_size),
        &by_others,
    )
}

/// Step 8: what a run prints, as a table or one JSON line.
struct Report<'a> {
    args: &'a BenchArgs,
    setup: &'a Setup,
    store: &'a Store,
    /// The counters before and after the run.
    counters: (&'a Snapshot, &'a Snapshot),
    merged: &'a Merged,
    figures: &'a Figures,
    verified: bool,
    /// Keys read back by the final check.
    written: usize,
    /// Keys of them that could not be read back, their memory node lost
    /// (`--keep-going`).
    keys_unverified: u64,
    /// The memory nodes operations were found lost on during the run.
    lost: &'a Mutex<BTreeSet<usize>>,
    /// Chains locked once the run settled (`None`: the memory node is
    /// remote).
    locks_held_end: Option<u64>,
    /// The pool's space (`None`: the memory node is remote).
    space: Option<Space>,
}

impl Report<'_> {
    /// Leaf writes of the run copied into the redo log first, and those
    /// that found no free slot of their client's block.
    fn redo(&self) -> (u64, u64) {
        let (before, after) = self.counters;
        (
            after.clients.redo_logged - before.clients.redo_logged,
            after.clients.redo_unlogged - before.clients.redo_unlogged,
        )
    }
}

/// `x` rounded to 2 decimals.
fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `x` rounded to 3 decimals.
fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

impl Report<'_> {
    /// Keys the store holds at the end of the run as planned: loaded, plus
    /// inserted, less deleted (failed operations aside).
    fn live_keys(&self) -> u64 {
        let plan = &self.setup.plan;
        (self.setup.sets.loaded.len() as u64 + plan.total_inserts())
            .saturating_sub(plan.total_deletes())
    }

    /// The names of the memory nodes lost: found down by a compute node,
    /// or lost by an operation of the run.
    fn nodes_lost(&self) -> Vec<String> {
        let lost = self.lost.lock().unwrap_or_else(|e| e.into_inner());
        (0..self.setup.map.nodes())
            .filter(|&n| lost.contains(&n) || self.store.clients.iter().any(|c| c.is_down(n)))
            .map(|n| {
                self.store
                    .clients
                    .first()
                    .and_then(|c| c.node_name(n))
                    .map_or_else(|| format!("node {n}"), str::to_string)
            })
            .collect()
    }

    /// Loaded keys each memory node holds (its range of the key set).
    fn per_node_keys(&self) -> Vec<u64> {
        self.setup.map.count(self.setup.sets.loaded.iter().copied())
    }

    /// The JSON line: its keys and their order are the command's contract.
    fn print_json(&self) {
        let (args, f, space) = (self.args, self.figures, self.space);
        let per_kind = |get: &dyn Fn(&OpStats) -> f64| {
            json_object(
                KvOp::ALL
                    .iter()
                    .zip(&f.per)
                    .map(|(k, o)| (k.name(), serde_json::json!(get(o)).to_string())),
            )
        };
        let v = |x: serde_json::Value| x.to_string();
        let line = json_object([
            ("workload", v(args.workload.name().into())),
            ("keys", v(self.setup.sets.loaded.len().into())),
            ("ops", v(args.ops.into())),
            ("threads", v(args.threads.into())),
            ("mops", v(r3(f.mops).into())),
            ("p50_us", v(r2(f.p50_us).into())),
            ("p99_us", v(r2(f.p99_us).into())),
            ("rtt_per_op", per_kind(&|o| r3(o.rtt_per_op()))),
            ("bytes_per_op", per_kind(&|o| r2(o.bytes_per_op()))),
            (
                "value_bytes_per_op",
                per_kind(&|o| r2(o.value_bytes_per_op())),
            ),
            ("leaves_per_get", v(r3(f.leaves_per_get).into())),
            (
                "retries_per_op",
                v(r3(ratio(f.total_retries, f.total_ops)).into()),
            ),
            ("retrains", v(f.retrains.into())),
            ("synonym_leaves", v(f.synonym_leaves.into())),
            ("model_bytes", v(f.model_bytes.total.into())),
            ("raw_read_mops", v(r3(f.raw_mops).into())),
            ("failed_ops", v(self.merged.failed.into())),
            ("redo_logged", v(self.redo().0.into())),
            ("redo_unlogged", v(self.redo().1.into())),
            ("locks_held_end", v(self.locks_held_end.into())),
            ("pool_bytes_start", v(space.map(|s| s.bytes_start).into())),
            ("pool_bytes_end", v(space.map(|s| s.bytes_end).into())),
            ("leaves_live", v(space.map(|s| s.leaves_live).into())),
            ("leaves_free", v(space.map(|s| s.leaves_free).into())),
            ("memnodes", v(self.setup.map.nodes().into())),
            ("per_memnode_keys", v(self.per_node_keys().into())),
            ("per_memnode_ops", v(f.per_node_ops.clone().into())),
            ("nodes_lost", v(self.nodes_lost().into())),
            ("keys_unverified", v(self.keys_unverified.into())),
            ("verified", v(self.verified.into())),
        ]);
        println!("{line}");
    }

    /// The table, for a person.
    fn print_table(&self) {
        self.print_setting();
        self.print_memnodes();
        self.print_per_op();
        self.print_speed();
        self.print_retraining();
        self.print_outcome();
    }

    /// The workload, the key set and the fabric.
    fn print_setting(&self) {
        let (args, store, sets) = (self.args, self.store, &self.setup.sets);
        println!(
            "workload        {} ({} ops, {} threads, {} client(s), θ = {})",
            args.workload, args.ops, args.threads, args.clients, args.zipf
        );
        match (&self.counters.1.node, &args.memnode) {
            // (the memory nodes' counters summed when there are several)
            (Some(na), _) => {
                let plan = &self.setup.plan;
                println!(
                    "keys            {} loaded in {:.2} s ({} models, {} leaves; {} inserted and {} deleted by the run)",
                    sets.loaded.len(),
                    store.load_time.as_secs_f64(),
                    na.models,
                    na.leaves_loaded,
                    plan.total_inserts(),
                    plan.total_deletes()
                );
                let fabric = if args.unordered {
                    "unordered"
                } else {
                    "ordered"
                };
                println!(
                    "fabric          loopback, {fabric}, injected RTT {} µs",
                    args.rtt_us
                );
            }
            (None, server) => {
                println!(
                    "keys            {} held by the memory node ({})",
                    sets.loaded.len(),
                    self.setup
                        .remotes
                        .first()
                        .map(|r| r.desc.encode())
                        .unwrap_or_default()
                );
                let name = args.fabric.name();
                println!(
                    "fabric          {name}, memory node at {} (compute process {} of {}), {}",
                    server.as_deref().unwrap_or("?"),
                    args.compute_index,
                    args.compute_count,
                    if store.clients[0].ordered() {
                        "ordered"
                    } else {
                        "unordered"
                    }
                );
            }
        }
    }

    /// A cluster's nodes: keys and operations each served.
    fn print_memnodes(&self) {
        let map = &self.setup.map;
        if map.nodes() < 2 {
            return;
        }
        println!(
            "memory nodes    {} (partition map version {}): loaded keys {:?}, operations served {:?}",
            map.nodes(),
            map.version(),
            self.per_node_keys(),
            self.figures.per_node_ops
        );
    }

    /// Round trips, bytes, leaves and retries per operation kind.
    fn print_per_op(&self) {
        println!(
            "per op          rtts    bytes   leaves  retries  value B  ops   (values: {} bytes)",
            self.setup.value_size
        );
        for (k, o) in KvOp::ALL.iter().zip(&self.figures.per) {
            if o.ops > 0 {
                println!(
                    "  {:<12} {:>6.3} {:>8.1} {:>8.3} {:>8.4} {:>8.1}  {}",
                    k.name(),
                    o.rtt_per_op(),
                    o.bytes_per_op(),
                    o.leaves_per_op(),
                    o.retries_per_op(),
                    o.value_bytes_per_op(),
                    o.ops
                );
            }
        }
    }

    /// Throughput beside the raw baseline, latency, and insert latency
    /// split by the agent's activity.
    fn print_speed(&self) {
        let f = self.figures;
        let (mops, raw_mops) = (f.mops, f.raw_mops);
        println!(
            "throughput      {mops:.3} Mops/s  (raw batched reads of the same bytes: {raw_mops:.3} Mops/s, ratio {:.2})",
            if raw_mops > 0.0 { mops / raw_mops } else { 0.0 }
        );
        println!(
            "latency         p50 {:.2} µs   p99 {:.2} µs",
            f.p50_us, f.p99_us
        );
        for (h, when) in [
            (&self.merged.insert_quiet, "agent idle"),
            (&self.merged.insert_retraining, "agent retraining"),
        ] {
            if h.count() > 0 {
                println!(
                    "  insert, {when:<17} p50 {:.2} µs   p99 {:.2} µs   ({} inserts)",
                    h.quantile(0.5) as f64 / 1e3,
                    h.quantile(0.99) as f64 / 1e3,
                    h.count()
                );
            }
        }
    }

    /// The local memory node's retraining and its CPU cost.
    fn print_retraining(&self) {
        let (before, after) = self.counters;
        let (Some(node_before), Some(node_after), Some(retrains)) =
            (&before.node, &after.node, self.figures.retrains)
        else {
            println!("retraining      on the memory node (see its own figures)");
            return;
        };
        println!(
            "retraining      {retrains} retrains, {} synonym leaves, longest freeze {:.1} µs",
            node_after.synonym_leaves,
            node_after.agent.freeze_ns_max as f64 / 1e3
        );
        let agent_cpu_s = node_after
            .agent_cpu_ns
            .saturating_sub(node_before.agent_cpu_ns) as f64
            / 1e9;
        let inserts = after
            .clients
            .op(KvOp::Insert)
            .ops
            .saturating_sub(before.clients.op(KvOp::Insert).ops);
        if inserts > 0 {
            println!(
                "agent CPU       {agent_cpu_s:.3} s over the run, {:.3} s per million inserts",
                agent_cpu_s * 1e6 / inserts as f64
            );
        } else {
            println!("agent CPU       {agent_cpu_s:.3} s over the run");
        }
    }

    /// The models' footprint and the verification.
    fn print_outcome(&self) {
        let model_bytes = self.figures.model_bytes;
        let held = self.live_keys().max(1);
        println!(
            "model bytes     {} cached per client ({:.0} per million keys held; learned models alone {})",
            model_bytes.total,
            model_bytes.total as f64 * 1e6 / held as f64,
            model_bytes.learned
        );
        match (self.args.inject_failures, self.args.inject_torn) {
            (None, None) => println!(
                "failed ops      {} (no failures injected)",
                self.merged.failed
            ),
            (p, t) => println!(
                "failed ops      {} (each operation failed with probability {}, each write \
                 of more than 8 bytes torn with probability {})",
                self.merged.failed,
                p.unwrap_or(0.0),
                t.unwrap_or(0.0)
            ),
        }
        match self.redo() {
            (0, 0) => println!(
                "redo log        off (the fabric does not place a peer's writes in order, or \
                 the pool has none: a leaf torn by a death stays torn)"
            ),
            (copied, alone) => println!(
                "redo log        {copied} leaf writes copied whole first, {alone} not (no free slot)"
            ),
        }
        let lost = self.nodes_lost();
        if !lost.is_empty() {
            println!(
                "nodes lost      {} ({} keys written there not read back)",
                lost.join(", "),
                self.keys_unverified
            );
        }
        match self.locks_held_end {
            Some(n) => println!("locks held end  {n} chains locked once the run settled"),
            None => println!("locks held end  unknown here (the memory node is remote)"),
        }
        match self.space {
            Some(s) => println!(
                "space           pool bytes in use {} → {} ({:.1} per live key), leaves {} live / {} free",
                s.bytes_start,
                s.bytes_end,
                s.bytes_end as f64 / held as f64,
                s.leaves_live,
                s.leaves_free
            ),
            None => println!("space           unknown here (the memory node is remote)"),
        }
        println!(
            "verified        {} ({} written keys read back)",
            if self.verified { "yes" } else { "NO" },
            self.written
        );
    }
}

/// `--plot`: draws the run into `path` (and names it in the table).
fn plot_run(
    args: &BenchArgs,
    setup: &Setup,
    ctx: &RunCtx,
    merged: &Merged,
    path: &Path,
) -> Result<(), BenchError> {
    let secs = |t: Instant| (t - ctx.epoch).as_secs_f64();
    let title = format!(
        "rolex bench {} ({} keys, {} ops, {} threads, {})",
        args.workload,
        setup.sets.loaded.len(),
        args.ops,
        args.threads,
        args.fabric.name()
    );
    draw_run(
        path,
        &title,
        &merged.by_kind,
        &merged.per_interval,
        (secs(merged.began), secs(merged.ended)),
    )?;
    if !args.json {
        println!("plot            {}", path.display());
    }
    Ok(())
}

/// Step 9: the run fails if any answer or final value did not verify,
/// naming the first problems.
fn verdict(problems: &Problems) -> Result<(), BenchError> {
    if problems.count == 0 {
        return Ok(());
    }
    for p in &problems.first {
        eprintln!("mismatch: {p}");
    }
    Err(format!(
        "verification failed: {} problem(s) in the run's answers or final state",
        problems.count
    )
    .into())
}

/// `--plot`: the latency CDF of every kind that ran and the throughput
/// over the run. `run` is when the first operation began and the last
/// ended, in seconds since the run's epoch (where `per_interval` counts
/// from).
fn draw_run(
    path: &Path,
    title: &str,
    by_kind: &[Histogram],
    per_interval: &[u64],
    run: (f64, f64),
) -> Result<(), BenchError> {
    let cdfs: Vec<Cdf> = KINDS
        .iter()
        .zip(by_kind)
        .filter(|(_, h)| h.count() > 0)
        .map(|(&name, h)| Cdf {
            name,
            ops: h.count(),
            points: h
                .cdf()
                .into_iter()
                .map(|(ns, f)| (ns as f64 / 1e3, f))
                .collect(),
        })
        .collect();
    let (width, buckets) = intervals(per_interval, run);
    plot::bench(path, title, &cdfs, &buckets, width)?;
    Ok(())
}

/// Interval counts ([`INTERVAL_NS`] each, from the epoch) merged into at
/// most [`PLOT_INTERVALS`] intervals of a round width, timed from the
/// first operation's start; a first or last interval under half the width
/// joins its neighbour (a few operations over a sliver of time would read
/// as a spike). Returns the width in seconds and the intervals.
fn intervals(per_interval: &[u64], (began, ended): (f64, f64)) -> (f64, Vec<Bucket>) {
    let fine = INTERVAL_NS as f64 / 1e9;
    let span = (ended - began).max(0.0);
    let k = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
        .into_iter()
        .find(|&k| span / (k as f64 * fine) <= PLOT_INTERVALS as f64)
        .unwrap_or(1000);
    let width = k as f64 * fine;
    let mut out: Vec<Bucket> = Vec::new();
    for (j, chunk) in per_interval.chunks(k).enumerate() {
        let start = (j as f64 * width).max(began);
        let end = ((j + 1) as f64 * width).min(ended);
        let ops: u64 = chunk.iter().sum();
        if end > start {
            out.push(Bucket {
                start_s: start - began,
                end_s: end - began,
                ops,
            });
        } else if let Some(last) = out.last_mut() {
            last.ops += ops;
        }
    }
    let short = |b: &Bucket| b.end_s - b.start_s < width / 2.0;
    if out.len() >= 2 && short(&out[out.len() - 1]) {
        let last = out.remove(out.len() - 1);
        let prev = out.len() - 1;
        out[prev].end_s = last.end_s;
        out[prev].ops += last.ops;
    }
    if out.len() >= 2 && short(&out[0]) {
        let first = out.remove(0);
        out[0].start_s = first.start_s;
        out[0].ops += first.ops;
    }
    (width, out)
}

/// Most throughput intervals a plot shows: enough to see phases, few
/// enough that each holds many operations.
const PLOT_INTERVALS: usize = 60;

/// A JSON object with its fields in the given order (values already JSON).
fn json_object<'a>(fields: impl IntoIterator<Item = (&'a str, String)>) -> String {
    let body: Vec<String> = fields
        .into_iter()
        .map(|(k, v)| format!("{}:{v}", serde_json::Value::from(k)))
        .collect();
    format!("{{{}}}", body.join(","))
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lock count at the end of a run never counts a model the agent
    /// froze for a retraining (a run under load once reported 131 chains
    /// locked, every entry of the model the agent was retraining as the
    /// count copied the pool): counted while another thread retrains the
    /// same model over and over, it is always 0.
    #[test]
    fn the_lock_count_never_sees_a_retraining_in_progress() {
        let pairs: Vec<(u64, u64)> = (1..20_000u64).map(|k| (k * 7, k)).collect();
        let node = MemoryNode::start(
            MemoryNodeConfig {
                retraining_thread: false,
                ..MemoryNodeConfig::default()
            },
            &pairs,
        )
        .unwrap();
        // Each retraining takes a new record and retired ones wait out the
        // grace period, so the model region holds only so many of them.
        let retrains = 10;
        let done = AtomicBool::new(false);
        let counts = std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..retrains {
                    node.retrain_now(0).unwrap();
                }
                done.store(true, Ordering::SeqCst);
            });
            let mut counts = Vec::new();
            while !done.load(Ordering::SeqCst) {
                counts.push(locks_between_steps(&node).unwrap());
            }
            counts
        });
        assert_eq!(node.stats().agent.retrains, retrains);
        assert!(counts.iter().all(|&n| n == 0), "{counts:?}");
    }

    #[test]
    fn histogram_buckets_are_contiguous_and_tight() {
        let mut last = 0;
        for v in (0..4096u64).chain([1 << 20, (1 << 40) + 12345, u64::MAX]) {
            let i = Histogram::index(v);
            assert!(i >= last || v > 4095);
            last = i;
            let mid = Histogram::value(i);
            let err = (mid as f64 - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 1.0 / 64.0, "{v}: bucket {i} mid {mid}");
        }
    }

    #[test]
    fn answers_are_checked_against_their_writers() {
        use ycsb::{load_value, write_value};
        let ctx = RunCtx {
            streams: vec![
                vec![
                    Op::Read(5),
                    Op::Update {
                        key: 5,
                        value: write_value(0, 2),
                    },
                ],
                vec![Op::Insert {
                    key: 9,
                    value: write_value(1, 1),
                }],
            ],
            epoch: Instant::now(),
            start: Barrier::new(1),
            activity: Vec::new(),
            faults: false,
            keep_going: false,
            lost: Mutex::default(),
            value_size: ValueSize::default(),
            depth: 1,
        };
        assert!(ctx.value_ok(5, load_value(5)));
        assert!(!ctx.value_ok(7, load_value(5)));
        assert!(ctx.value_ok(5, write_value(0, 2)));
        assert!(!ctx.value_ok(5, write_value(0, 1)), "op 1 is a read");
        assert!(!ctx.value_ok(7, write_value(0, 2)), "written to 5, not 7");
        assert!(ctx.value_ok(9, write_value(1, 1)));
        assert!(!ctx.value_ok(9, write_value(2, 1)), "no thread 2");
        assert!(!ctx.value_ok(5, 1 << 40), "sequence 0 is never written");
        let mut p = Problems::default();
        ctx.check_value(&mut p, "get", 5, Some(load_value(5)));
        assert_eq!(p.count, 0);
        ctx.check_value(&mut p, "get", 5, None);
        ctx.check_value(&mut p, "get", 5, Some(write_value(0, 1)));
        assert_eq!(p.count, 2);
        for _ in 0..20 {
            p.push(|| "x".into());
        }
        assert_eq!((p.count, p.first.len()), (22, KEEP_PROBLEMS));
    }

    #[test]
    fn failed_writes_may_or_may_not_be_the_final_value() {
        let w = |invoke, ret, value| TimedWrite {
            invoke,
            ret,
            value: Some(value),
        };
        let (initial, a, b) = (Some(1), 10, 20);
        // One thread: a applied (0–1), then b failed (2–3).
        let mut one = KeyWrites::default();
        one.add(w(0, 1, a), true);
        one.add(w(2, 3, b), false);
        let writes = [one.clone()];
        assert!(final_possible(initial, &writes, Some(a)), "b did not apply");
        assert!(final_possible(initial, &writes, Some(b)), "b applied");
        assert!(!final_possible(initial, &writes, initial), "a applied");
        // A failed write that a returned write strictly follows is not
        // kept: it cannot be final.
        one.add(w(4, 5, a), true);
        assert_eq!(one.unknown, []);
        // Only a failed write: the key may keep its value, or take it.
        let mut only = KeyWrites::default();
        only.add(w(0, 1, b), false);
        let writes = [only.clone()];
        assert!(final_possible(initial, &writes, initial));
        assert!(final_possible(initial, &writes, Some(b)));
        assert!(!final_possible(initial, &writes, Some(a)));
        // Another thread's applied write strictly after the failed one.
        let mut later = KeyWrites::default();
        later.add(w(5, 6, a), true);
        assert!(!final_possible(
            initial,
            &[only.clone(), later.clone()],
            Some(b)
        ));
        // ... or overlapping it: either may be last.
        let mut overlap = KeyWrites::default();
        overlap.add(w(1, 6, a), true);
        assert!(final_possible(initial, &[only, overlap], Some(b)));
    }

    #[test]
    fn deletes_are_writes_of_absent() {
        let w = |invoke, ret, value| TimedWrite { invoke, ret, value };
        let loaded = Some(7);
        // A loaded key deleted: absent at the end, never its load value.
        let mut del = KeyWrites::default();
        del.add(w(0, 1, None), true);
        assert!(final_possible(loaded, &[del.clone()], None));
        assert!(!final_possible(loaded, &[del], loaded));
        // A key inserted then deleted by its owner (churn).
        let mut churn = KeyWrites::default();
        churn.add(w(0, 1, Some(10)), true);
        churn.add(w(2, 3, None), true);
        assert!(final_possible(None, &[churn.clone()], None));
        assert!(!final_possible(None, &[churn], Some(10)));
        // A delete that failed: the key may be present still, or not.
        let mut failed = KeyWrites::default();
        failed.add(w(0, 1, Some(10)), true);
        failed.add(w(2, 3, None), false);
        assert!(final_possible(None, &[failed.clone()], None));
        assert!(final_possible(None, &[failed], Some(10)));
    }

    #[test]
    fn histogram_cdf_rises_to_one() {
        let mut h = Histogram::new();
        assert!(h.cdf().is_empty());
        for v in [100u64, 100, 5000, 90_000] {
            h.record(v);
        }
        let c = h.cdf();
        assert_eq!(c.first(), Some(&(100, 0.0)));
        assert_eq!(c[1], (100, 0.5));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(c.last().map(|p| p.1), Some(1.0));
    }

    #[test]
    fn intervals_keep_every_operation() {
        // 10 ms counts over 0.35 s, the run starting 3 ms in.
        let counts: Vec<u64> = (0..35).map(|i| i + 1).collect();
        let (w, b) = intervals(&counts, (0.003, 0.35));
        assert_eq!(w, 0.01);
        assert_eq!(
            b.iter().map(|b| b.ops).sum::<u64>(),
            counts.iter().sum::<u64>()
        );
        assert_eq!(b[0].start_s, 0.0);
        assert!((b[b.len() - 1].end_s - 0.347).abs() < 1e-9);
        assert!(b
            .windows(2)
            .all(|w| (w[0].end_s - w[1].start_s).abs() < 1e-9));
        // A long run gets wider intervals, at most PLOT_INTERVALS of them.
        let long = vec![7u64; 6000];
        let (w, b) = intervals(&long, (0.0, 60.0));
        assert_eq!(w, 1.0);
        assert!(b.len() <= PLOT_INTERVALS, "{}", b.len());
        assert_eq!(b.iter().map(|b| b.ops).sum::<u64>(), 42_000);
        assert!(intervals(&[], (0.0, 0.0)).1.is_empty());
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::new();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=100u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 - 50_000.0).abs() / 50_000.0 < 0.02, "{p50}");
        assert!((p99 - 99_000.0).abs() / 99_000.0 < 0.02, "{p99}");
    }
}
