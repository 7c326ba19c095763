//! `rolex plr`: train the model hierarchy on a key set and report it.
//!
//! The reported `max_error` is measured, not trusted: after training, every
//! key is located from the root and predicted by its model, and the largest
//! distance to its true position is printed. A key that the hierarchy routes
//! to the wrong model is an internal error (non-zero exit), never a number.

use crate::dataset::{self, spinner, DataSetArgs, EmptyFile};
use clap::Args;
use rolex_core::model::{Hierarchy, HierarchyConfig};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Keys per training leaf used by `rolex plr`. It does not change the fit
/// (segments are trained on key positions); it only sizes the leaf ranges.
const KEYS_PER_LEAF: u64 = 16;

/// Arguments of `rolex plr`.
#[derive(Debug, Args)]
#[command(mut_group("source", |g| g.required(true)))]
pub struct PlrArgs {
    /// Maximum prediction error ε, in key positions, for every level.
    #[arg(long, short, default_value_t = 32)]
    epsilon: u64,
    #[command(flatten)]
    data: DataSetArgs,
    /// Write the generated keys to FILE in SOSD format and stop (no training).
    #[arg(long, value_name = "FILE", requires = "dist", conflicts_with = "keys")]
    write_keys: Option<PathBuf>,
    /// Training runs to time; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: u32,
    /// Print one JSON line instead of the table.
    #[arg(long)]
    json: bool,
}

/// Runs `rolex plr`.
pub fn run(args: PlrArgs) -> Result<(), Box<dyn std::error::Error>> {
    let keys = args.data.load(0, EmptyFile::Reject)?;
    if let Some(path) = &args.write_keys {
        dataset::write_sosd(path, &keys)?;
        eprintln!("wrote {} keys to {}", keys.len(), path.display());
        return Ok(());
    }
    let cfg = HierarchyConfig {
        epsilon: args.epsilon,
        upper_epsilon: args.epsilon,
        keys_per_leaf: KEYS_PER_LEAF,
    };

    let spinner = spinner(format!("training on {} keys", keys.len()));
    let mut times = Vec::with_capacity(args.runs as usize);
    let mut hierarchy = None;
    for _ in 0..args.runs {
        let start = Instant::now();
        let h = Hierarchy::train(&keys, cfg)?;
        times.push(start.elapsed());
        hierarchy = Some(h);
    }
    spinner.finish_and_clear();
    let hierarchy = hierarchy.expect("runs >= 1");
    times.sort();
    let median: Duration = times[times.len() / 2];
    let ns_per_key = median.as_nanos() as f64 / keys.len() as f64;

    let max_error = measure_max_error(&hierarchy, &keys)?;
    let levels: Vec<usize> = hierarchy.levels().collect();
    let segments = levels[0];
    let model_bytes = hierarchy.model_bytes();

    if args.json {
        let line = serde_json::json!({
            "keys": keys.len(),
            "epsilon": args.epsilon,
            "segments": segments,
            "levels": levels,
            "max_error": max_error,
            "model_bytes": model_bytes,
            "train_ns_per_key": (ns_per_key * 100.0).round() / 100.0,
        });
        println!("{line}");
    } else {
        println!("keys              {}", keys.len());
        println!("epsilon           {}", args.epsilon);
        println!("segments          {segments}");
        println!("levels            {levels:?} (bottom to root)");
        println!("max_error         {max_error} (measured on every key)");
        println!(
            "model_bytes       {model_bytes} ({:.1} per million keys)",
            model_bytes as f64 * 1e6 / keys.len() as f64
        );
        println!(
            "train_ns_per_key  {ns_per_key:.2} (median of {} runs)",
            args.runs
        );
    }
    Ok(())
}

/// Predicts every key through `locate` and its model, returning the largest
/// distance to the key's true position within its model.
fn measure_max_error(h: &Hierarchy, keys: &[u64]) -> Result<u64, Box<dyn std::error::Error>> {
    let mut max_error = 0u64;
    let mut start = 0usize;
    for (m, model) in h.models().iter().enumerate() {
        let len = model.len as usize;
        let Some(own) = keys.get(start..start + len) else {
            return Err(format!("internal error: model {m} claims keys past the end").into());
        };
        for (pos, &key) in own.iter().enumerate() {
            let located = h.locate(key);
            if located != m {
                return Err(format!(
                    "internal error: key {key} belongs to model {m} but locate() gives {located}"
                )
                .into());
            }
            max_error = max_error.max(model.predict(key).abs_diff(pos as u64));
        }
        start += len;
    }
    if start != keys.len() {
        return Err(format!(
            "internal error: models cover {start} of {} keys",
            keys.len()
        )
        .into());
    }
    Ok(max_error)
}
