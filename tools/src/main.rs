//! `rolex`: the ROLEX-RS command line.
//!
//! Every subcommand returns its errors to `main`, which prints them as one
//! `error: …` line and exits non-zero: bad input never panics.
mod bench;
mod bluefield_emu;
mod cpu;
mod data_set_desc;
mod dataset;
mod fabric;
mod inspect;
mod memnode;
mod plot;
mod plr;
mod te_bench;
mod values;
mod ycsb;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// ROLEX-RS: a learned key-value store for disaggregated memory and a
/// portable RDMA transfer engine.
#[derive(Debug, Parser)]
#[command(name = "rolex", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Train the store's learned model (optimal PLR over leaf fences) on a key
    /// set and report segments, levels, the measured maximum error (in
    /// leaves) and training speed.
    Plr(plr::PlrArgs),
    /// Benchmark the transfer engine: bandwidth, operation rate and latency,
    /// beside memcpy of the same size measured in the same run.
    TeBench(te_bench::TeBenchArgs),
    /// Run a YCSB workload on the key-value store end to end (memory node,
    /// compute nodes, loopback fabric) and report round trips, bytes,
    /// throughput and latency beside the fabric's raw read rate; every
    /// written key is read back and checked.
    Bench(bench::BenchArgs),
    /// Run a memory node with its retraining agent pinned to a core budget
    /// and report retrainings, keys retrained per second, model freeze
    /// times (p50/p99/max) and the agent's CPU time; or, with `--fabric`,
    /// serve its pool to compute processes (in a `--pool-file` that
    /// `--resume` serves again after the process died).
    Memnode(memnode::MemnodeArgs),
    /// Print a file-backed pool's agent state, superblock and models, and
    /// decode the agent's log ring (`--log`, with the firmware image's ELF).
    Inspect(inspect::InspectArgs),
    /// Boot the memory-node agent's aarch64 firmware image in QEMU (`virt`,
    /// Cortex-A72) on a pool shared with host compute nodes, which insert
    /// until the emulated agent retrained every model; read every key back
    /// and print one JSON line (`--probe-atomics`: check that guest and
    /// host CAS/FAA agree on the shared memory first).
    BluefieldEmu(bluefield_emu::BluefieldEmuArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plr(args) => plr::run(args),
        Command::TeBench(args) => te_bench::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Memnode(args) => memnode::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::BluefieldEmu(args) => bluefield_emu::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
