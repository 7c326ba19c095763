//! `rolex te-bench` (being written with the transfer engine).
use clap::Args;

/// Arguments of `rolex te-bench`.
#[derive(Debug, Args)]
pub struct TeBenchArgs {}

/// Runs the transfer-engine benchmark.
pub fn run(_args: TeBenchArgs) -> Result<(), Box<dyn std::error::Error>> {
    Err("te-bench is not built yet".into())
}
