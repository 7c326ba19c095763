//! `rolex plr`: train the store's learned model on a key set and report it.
//!
//! Training is exactly a bulk load's (`rolex_core::model`): the keys' leaf
//! fences at `--keys-per-leaf`, the PLR's cut of the fences into models of
//! at most `--max-model-leaves` leaves, each model fitted over its own
//! fences, and the locator over the models' first fences with the client's
//! default bound. ε and `max_error` are counted in leaves.
//!
//! The reported `max_error` is measured, not trusted: after training, every
//! key is located from the root and predicted by its model, and the largest
//! distance between the prediction and the key's owning leaf is printed —
//! at most ε at a fence and ε + 1 between fences (the window argument of
//! `rolex_core::model`). A key that the locator routes to the wrong model,
//! or whose owning leaf lies outside its model's window, is an internal
//! error (non-zero exit), never a number.

use crate::dataset::{self, spinner, DataSetArgs, EmptyFile};
use clap::Args;
use rolex_core::layout::ModelSegment;
use rolex_core::model::{fit_model, leaf_fences, plan_models, predict, window, Locator, ModelSpan};
use rolex_host::kv::KvClientConfig;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Arguments of `rolex plr`.
#[derive(Debug, Args)]
#[command(mut_group("source", |g| g.required(true)))]
pub struct PlrArgs {
    /// Maximum prediction error ε of the models, in leaves (a key between
    /// two fences may be predicted ε + 1 leaves from its own).
    #[arg(long, short, default_value_t = 2)]
    epsilon: u64,
    /// Keys per training leaf, as a bulk load fills them.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..))]
    keys_per_leaf: u64,
    /// Most training leaves of one model (the memory node's default).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    max_model_leaves: u64,
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

/// One trained model: its leaves and segments.
struct Model {
    span: ModelSpan,
    segments: Vec<ModelSegment>,
}

/// The store's model over a key set.
struct Trained {
    models: Vec<Model>,
    locator: Locator,
}

impl Trained {
    /// Trains as a bulk load does (module docs).
    fn new(
        keys: &[u64],
        args: &PlrArgs,
        upper_epsilon: u64,
    ) -> Result<Self, rolex_core::model::ModelError> {
        let fences = leaf_fences(keys, args.keys_per_leaf)?;
        let spans = plan_models(&fences, args.epsilon, args.max_model_leaves)?;
        let mut models = Vec::with_capacity(spans.len());
        for span in spans {
            models.push(Model {
                span,
                segments: fit_model(&fences[span.range()], args.epsilon)?,
            });
        }
        let firsts = models
            .iter()
            .map(|m| fences[m.span.first_leaf as usize])
            .collect();
        let locator = Locator::new(firsts, upper_epsilon)?;
        Ok(Self { models, locator })
    }

    /// Segments of all models together.
    fn segments(&self) -> usize {
        self.models.iter().map(|m| m.segments.len()).sum()
    }
}

/// Runs `rolex plr`.
pub fn run(args: PlrArgs) -> Result<(), Box<dyn std::error::Error>> {
    let keys = args.data.load(0, EmptyFile::Reject)?;
    if let Some(path) = &args.write_keys {
        dataset::write_sosd(path, &keys)?;
        eprintln!("wrote {} keys to {}", keys.len(), path.display());
        return Ok(());
    }
    let upper_epsilon = KvClientConfig::default().upper_epsilon;

    let spinner = spinner(format!("training on {} keys", keys.len()));
    let mut times = Vec::with_capacity(args.runs as usize);
    let mut trained = None;
    for _ in 0..args.runs {
        let start = Instant::now();
        let t = Trained::new(&keys, &args, upper_epsilon)?;
        times.push(start.elapsed());
        trained = Some(t);
    }
    spinner.finish_and_clear();
    let trained = trained.expect("runs >= 1");
    times.sort();
    let median: Duration = times[times.len() / 2];
    let ns_per_key = median.as_nanos() as f64 / keys.len() as f64;

    let max_error = measure_max_error(&trained, &keys, args.keys_per_leaf, args.epsilon)?;
    let segments = trained.segments();
    // Bottom level: every model's segments; then the locator's, to its root.
    let levels: Vec<usize> = std::iter::once(segments)
        .chain(trained.locator.levels())
        .collect();
    let model_bytes = segments as u64 * ModelSegment::SIZE + trained.locator.learned_bytes();

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
        println!(
            "models            {} ({} keys per leaf, at most {} leaves per model)",
            trained.models.len(),
            args.keys_per_leaf,
            args.max_model_leaves
        );
        println!("epsilon           {} (leaves)", args.epsilon);
        println!("segments          {segments}");
        println!("levels            {levels:?} (bottom to root)");
        println!("max_error         {max_error} (leaves, measured on every key)");
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

/// Locates and predicts every key as a client does, returning the largest
/// distance in leaves between the prediction and the key's owning leaf.
fn measure_max_error(
    t: &Trained,
    keys: &[u64],
    keys_per_leaf: u64,
    epsilon: u64,
) -> Result<u64, Box<dyn std::error::Error>> {
    let k = keys_per_leaf as usize;
    let mut max_error = 0u64;
    let mut seen = 0usize;
    for (m, model) in t.models.iter().enumerate() {
        let n = model.span.leaves;
        for j in 0..n {
            // Leaf g holds keys [gK, (g+1)K) and owns them by its fences.
            let g = (model.span.first_leaf + j) as usize;
            let own = keys
                .get(g.saturating_mul(k)..keys.len().min((g + 1).saturating_mul(k)))
                .unwrap_or(&[]);
            for &key in own {
                for (how, located) in [
                    ("locate()", t.locator.locate(key)),
                    ("the learned levels", t.locator.locate_learned(key)),
                ] {
                    if located != m {
                        return Err(format!(
                            "internal error: key {key} belongs to model {m} but {how} gives {located}"
                        )
                        .into());
                    }
                }
                let (lo, hi) = window(&model.segments, epsilon, n, key);
                if !(lo..=hi).contains(&j) {
                    return Err(format!(
                        "internal error: key {key} belongs to leaf {j} of model {m} but its window is [{lo}, {hi}]"
                    )
                    .into());
                }
                max_error = max_error.max(predict(&model.segments, key).abs_diff(j));
            }
            seen += own.len();
        }
    }
    if seen != keys.len() {
        return Err(format!("internal error: models cover {seen} of {} keys", keys.len()).into());
    }
    Ok(max_error)
}
