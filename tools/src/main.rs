//! `rolex`: the ROLEX-RS command line.
//!
//! Every subcommand returns its errors to `main`, which prints them as one
//! `error: …` line and exits non-zero: bad input never panics.
mod dataset;
mod plr;
mod te_bench;

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
    /// Train the learned model hierarchy (optimal PLR) on a key set and report
    /// segments, levels, the measured maximum error and training speed.
    Plr(plr::PlrArgs),
    /// Benchmark the transfer engine: bandwidth, operation rate and latency,
    /// beside memcpy of the same size measured in the same run.
    TeBench(te_bench::TeBenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plr(args) => plr::run(args),
        Command::TeBench(args) => te_bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
