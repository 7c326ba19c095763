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
//! key is read back at the end.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{ArgGroup, Args};
use rand::{Rng, SeedableRng};
use rolex_host::kv::{KvClient, KvClientConfig, MemoryNode, MemoryNodeConfig};

use crate::dataset::{self, Dist};

/// Arguments of `rolex memnode`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["keys", "dist"])))]
pub struct MemnodeArgs {
    /// Read the keys to load from a SOSD file.
    #[arg(long, value_name = "FILE")]
    keys: Option<PathBuf>,
    /// Generate the keys to load from a distribution.
    #[arg(long, value_enum, requires = "n")]
    dist: Option<Dist>,
    /// Keys to generate.
    #[arg(long, short)]
    n: Option<u64>,
    /// Seed of the generator and of the inserted keys.
    #[arg(long, default_value_t = 1)]
    seed: u64,
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
    /// SLT slots that make the agent retrain a model on its own.
    #[arg(long, default_value_t = 128)]
    trigger: u64,
    /// Synonym-leaf room, as a multiple of the loaded leaves.
    #[arg(long, default_value_t = 2.0)]
    spare_leaves: f64,
    /// Lay the pool out in this file (agent area, then pool) so `rolex
    /// inspect` or the firmware image can read it.
    #[arg(long, value_name = "FILE")]
    pool_file: Option<PathBuf>,
}

/// Percentiles of a set of freeze times, in µs.
fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// Runs `rolex memnode`.
pub fn run(args: MemnodeArgs) -> Result<(), Box<dyn std::error::Error>> {
    let keys = match (&args.keys, args.dist) {
        (Some(path), _) => dataset::read_sosd(path)?,
        (None, Some(dist)) => dataset::generate(dist, args.n.unwrap_or(0), args.seed)?,
        (None, None) => return Err("give --keys FILE or --dist D -n N".into()),
    };
    if !(args.duration.is_finite() && args.duration >= 0.0) {
        return Err(format!("--duration {} is not a number of seconds", args.duration).into());
    }
    let pairs: Vec<(u64, u64)> = keys.iter().map(|&k| (k, k ^ 0x5555)).collect();
    let cfg = MemoryNodeConfig {
        leaf_slots: args.leaf_slots,
        retrain_trigger: args.trigger,
        cores: args.cores as usize,
        pool_file: args.pool_file.clone(),
        spare_leaf_factor: args.spare_leaves,
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
    let written: Vec<Vec<u64>> = std::thread::scope(|s| {
        let mut hs = Vec::new();
        for c in 0..args.clients {
            let client = &client;
            let stop = &stop;
            let inserted = &inserted;
            let existing = &existing;
            let keys = &keys;
            let seed = args.seed ^ (u64::from(c) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
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
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a client thread panicked".into()))
            })
            .collect::<Result<Vec<_>, String>>()
    })?;
    let st = node.stats();
    let a = st.agent;
    let b = base.agent;
    let n_ins = inserted.load(Ordering::Relaxed);
    let retrains = a.retrains - b.retrains;
    let keys_retrained = a.keys_retrained - b.keys_retrained;
    let busy = (st.retrain_busy_ns - base.retrain_busy_ns) as f64 / 1e9;
    let cpu = (st.agent_cpu_ns - base.agent_cpu_ns) as f64 / 1e9;
    println!(
        "inserts: {} in {:.1} s by {} client(s), {} synonym leaves",
        n_ins, args.duration, args.clients, st.synonym_leaves
    );
    println!(
        "agent: {} retrainings, {} keys retrained ({:.1} M keys/s while retraining), {} CirQ entries, {} failures",
        retrains,
        keys_retrained,
        keys_retrained as f64 / busy.max(1e-9) / 1e6,
        a.cirq_pops - b.cirq_pops,
        st.agent_errors
    );
    let h = a.freeze_hist;
    println!(
        "freeze (all {} retrainings of the run): p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        h.count(),
        us(h.quantile(500)),
        us(h.quantile(990)),
        us(h.max())
    );
    println!(
        "agent CPU: {:.3} s in the insert phase ({:.1}% of one core), {:.3} s per million inserts; pinned to {} core(s)",
        cpu,
        100.0 * cpu / args.duration.max(1e-9),
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

/// CPU time of the calling thread, in nanoseconds (0 if unavailable): the
/// first field of `/proc/thread-self/schedstat` is the thread's run time in
/// nanoseconds (`std` has no thread CPU clock, and this crate no libc).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
