//! Key sets for the benchmarks: deterministic generators and SOSD files.
//!
//! Every key set this module hands out is strictly increasing (sorted, no
//! duplicates), whatever its source: generators sort and deduplicate, and a
//! file that is not strictly increasing is rejected with the index of the
//! first offending key. The SOSD format is a little-endian `u64` count
//! followed by that many little-endian `u64` keys.
//!
//! [`DataSetArgs`] is the one declaration of the data-set arguments
//! (`--keys`, `--dist`, `-n`, `--seed`) that `rolex plr`, `rolex bench` and
//! `rolex memnode` flatten into their own, and [`DataSetArgs::load`] the one
//! place that turns them into keys; what differs per subcommand (whether a
//! data set is required, help wording) is set by each subcommand on top.

use clap::{ArgGroup, Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Normal};
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Key distributions of the generators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dist {
    /// Uniform over `[0, 2^63)`.
    Uniform,
    /// Lognormal with μ = 0, σ = 2, scaled by 10^12.
    Lognormal,
    /// Normal with μ = 4, σ = 2, scaled by 10^12; negative draws are redrawn.
    Normal,
    /// `0, 1, …, N−1`.
    Sequential,
}

impl fmt::Display for Dist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Dist::Uniform => "uniform",
            Dist::Lognormal => "lognormal",
            Dist::Normal => "normal",
            Dist::Sequential => "sequential",
        };
        f.write_str(name)
    }
}

/// Why a key set could not be produced.
#[derive(Debug)]
pub enum DatasetError {
    /// The file could not be opened, read or written.
    Io {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        source: io::Error,
    },
    /// The file is shorter than its header promises.
    Truncated {
        /// The file.
        path: PathBuf,
        /// Keys the header announces.
        count: u64,
        /// Bytes the file would need.
        need: u64,
        /// Bytes the file has.
        have: u64,
    },
    /// The file is longer than its header promises.
    Oversized {
        /// The file.
        path: PathBuf,
        /// Keys the header announces.
        count: u64,
        /// Bytes past the last announced key.
        extra: u64,
    },
    /// Keys are not strictly increasing.
    NotIncreasing {
        /// The file.
        path: PathBuf,
        /// Index of the offending key.
        index: u64,
        /// The key before it.
        prev: u64,
        /// The offending key.
        key: u64,
    },
    /// A generator was asked for no keys, or for more than it can make.
    BadCount {
        /// The distribution.
        dist: Dist,
        /// The count asked for.
        n: u64,
        /// Why it cannot be made.
        why: &'static str,
    },
    /// The file holds no keys where a key set needs at least one.
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The arguments name no complete source, or a count that overflows.
    Usage(&'static str),
}

impl fmt::Display for DatasetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DatasetError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            DatasetError::Truncated {
                path,
                count,
                need,
                have,
            } => write!(
                f,
                "{}: truncated SOSD file: the header announces {count} keys ({need} bytes) but the file has {have} bytes",
                path.display()
            ),
            DatasetError::Oversized { path, count, extra } => write!(
                f,
                "{}: oversized SOSD file: {extra} bytes follow the {count} keys the header announces",
                path.display()
            ),
            DatasetError::NotIncreasing {
                path,
                index,
                prev,
                key,
            } => {
                let what = if prev == key { "duplicate" } else { "unsorted" };
                write!(
                    f,
                    "{}: {what} key at index {index}: {key} follows {prev} (keys must be strictly increasing)",
                    path.display()
                )
            }
            DatasetError::BadCount { dist, n, why } => {
                write!(f, "cannot generate {n} {dist} keys: {why}")
            }
            DatasetError::Empty { path } => {
                write!(f, "{}: the file holds no keys", path.display())
            }
            DatasetError::Usage(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for DatasetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DatasetError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// The data-set arguments shared by the subcommands that need a key set.
///
/// `--keys` and `--dist` exclude each other (group `source`), and `--dist`
/// needs `-n`. The group is not required here: a subcommand that always
/// needs a data set marks it required with
/// `#[command(mut_group("source", |g| g.required(true)))]`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").args(["keys", "dist"])))]
pub struct DataSetArgs {
    /// Read keys from a SOSD file (little-endian u64 count, then the keys, strictly increasing).
    #[arg(long, value_name = "FILE")]
    pub keys: Option<PathBuf>,
    /// Generate keys from a distribution instead (deterministic for a seed).
    #[arg(long, value_enum, requires = "n")]
    pub dist: Option<Dist>,
    /// Number of keys to generate (exact: duplicates and rejected draws are redrawn).
    #[arg(long, short)]
    pub n: Option<u64>,
    /// Seed of the generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Whether [`DataSetArgs::load`] accepts a key file that holds no keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmptyFile {
    /// An empty file is an error ([`DatasetError::Empty`]).
    Reject,
    /// An empty file is an empty key set (`rolex memnode` serves one).
    Accept,
}

impl DataSetArgs {
    /// Whether `--keys` or `--dist` was given.
    pub fn is_given(&self) -> bool {
        self.keys.is_some() || self.dist.is_some()
    }

    /// The key set the arguments name: the `--keys` file as it is, or
    /// `-n` plus `inserts` keys of `--dist` (`rolex bench` generates its
    /// run's inserts on top of the loaded keys; others pass 0). A spinner
    /// shows on a terminal while it runs.
    pub fn load(&self, inserts: u64, empty: EmptyFile) -> Result<Vec<u64>, DatasetError> {
        match (&self.keys, self.dist) {
            (Some(path), _) => {
                let sp = spinner(format!("reading {}", path.display()));
                let keys = read_sosd(path);
                sp.finish_and_clear();
                let keys = keys?;
                if keys.is_empty() && empty == EmptyFile::Reject {
                    return Err(DatasetError::Empty { path: path.clone() });
                }
                Ok(keys)
            }
            (None, Some(dist)) => {
                let n = self.n.ok_or(DatasetError::Usage("--dist needs -n"))?;
                let total = n
                    .checked_add(inserts)
                    .ok_or(DatasetError::Usage("-n plus the run's inserts overflows"))?;
                let sp = spinner(format!("generating {total} {dist} keys"));
                let keys = generate(dist, total, self.seed);
                sp.finish_and_clear();
                keys
            }
            (None, None) => Err(DatasetError::Usage("give --keys FILE, or --dist with -n")),
        }
    }
}

/// A spinner on stderr with `msg` and the elapsed time; hidden when stderr
/// is not a terminal, so piped output stays clean.
pub fn spinner(msg: String) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// Generates exactly `n` distinct keys of `dist`, sorted, the same for the
/// same `(dist, n, seed)`.
///
/// Draws that are rejected (negative normals, duplicates) are redrawn from
/// the same stream, so the count is exact and the result still depends only
/// on the arguments.
pub fn generate(dist: Dist, n: u64, seed: u64) -> Result<Vec<u64>, DatasetError> {
    if n == 0 {
        return Err(DatasetError::BadCount {
            dist,
            n,
            why: "a key set needs at least one key",
        });
    }
    // Redrawing duplicates needs room: cap far below each domain's size.
    const MAX_KEYS: u64 = 1 << 32;
    if n > MAX_KEYS {
        return Err(DatasetError::BadCount {
            dist,
            n,
            why: "more than 2^32 keys",
        });
    }
    if dist == Dist::Sequential {
        return Ok((0..n).collect());
    }
    let n = n as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut draw: Box<dyn FnMut(&mut ChaCha8Rng) -> u64> = match dist {
        Dist::Uniform => Box::new(|rng| rng.gen_range(0..1u64 << 63)),
        Dist::Lognormal => {
            let d = LogNormal::new(0.0, 2.0).expect("constant parameters are valid");
            Box::new(move |rng| scale(d.sample(rng)))
        }
        Dist::Normal => {
            let d = Normal::new(4.0, 2.0).expect("constant parameters are valid");
            Box::new(move |rng| loop {
                let x = d.sample(rng);
                if x >= 0.0 {
                    break scale(x);
                }
            })
        }
        Dist::Sequential => unreachable!("handled above"),
    };
    let mut keys: Vec<u64> = (0..n).map(|_| draw(&mut rng)).collect();
    keys.sort_unstable();
    keys.dedup();
    while keys.len() < n {
        let missing = n - keys.len();
        keys.extend((0..missing).map(|_| draw(&mut rng)));
        keys.sort_unstable();
        keys.dedup();
    }
    Ok(keys)
}

/// `x · 10^12` as a key; `as` saturates, so a huge draw becomes `u64::MAX`.
fn scale(x: f64) -> u64 {
    (x * 1e12) as u64
}

/// Reads a SOSD file and checks that its keys are strictly increasing.
pub fn read_sosd(path: &Path) -> Result<Vec<u64>, DatasetError> {
    let io_err = |source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let have = file.metadata().map_err(io_err)?.len();
    if have < 8 {
        return Err(DatasetError::Truncated {
            path: path.to_path_buf(),
            count: 0,
            need: 8,
            have,
        });
    }
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut word = [0u8; 8];
    reader.read_exact(&mut word).map_err(io_err)?;
    let count = u64::from_le_bytes(word);
    // Check the size before allocating: a corrupt header must not cost memory.
    let need = count.checked_mul(8).and_then(|b| b.checked_add(8));
    match need {
        Some(need) if need > have => {
            return Err(DatasetError::Truncated {
                path: path.to_path_buf(),
                count,
                need,
                have,
            })
        }
        None => {
            return Err(DatasetError::Truncated {
                path: path.to_path_buf(),
                count,
                need: u64::MAX,
                have,
            })
        }
        Some(need) if need < have => {
            return Err(DatasetError::Oversized {
                path: path.to_path_buf(),
                count,
                extra: have - need,
            })
        }
        Some(_) => {}
    }
    let mut bytes = vec![0u8; (count * 8) as usize];
    reader.read_exact(&mut bytes).map_err(io_err)?;
    let keys: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect();
    check_increasing(&keys).map_err(|(index, prev, key)| DatasetError::NotIncreasing {
        path: path.to_path_buf(),
        index,
        prev,
        key,
    })?;
    Ok(keys)
}

/// Writes keys as a SOSD file.
pub fn write_sosd(path: &Path, keys: &[u64]) -> Result<(), DatasetError> {
    let io_err = |source| DatasetError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path).map_err(io_err)?);
    out.write_all(&(keys.len() as u64).to_le_bytes())
        .map_err(io_err)?;
    for k in keys {
        out.write_all(&k.to_le_bytes()).map_err(io_err)?;
    }
    out.flush().map_err(io_err)
}

/// The first place where `keys` is not strictly increasing, as
/// `(index, previous key, key)`.
fn check_increasing(keys: &[u64]) -> Result<(), (u64, u64, u64)> {
    match keys.windows(2).position(|w| w[0] >= w[1]) {
        Some(i) => Err(((i + 1) as u64, keys[i], keys[i + 1])),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("rolex-dataset-{}-{name}", std::process::id()))
    }

    #[test]
    fn generators_are_exact_sorted_unique_and_deterministic() {
        for dist in [
            Dist::Uniform,
            Dist::Lognormal,
            Dist::Normal,
            Dist::Sequential,
        ] {
            let a = generate(dist, 20_000, 7).unwrap();
            assert_eq!(a.len(), 20_000, "{dist}");
            assert!(a.windows(2).all(|w| w[0] < w[1]), "{dist}");
            assert_eq!(a, generate(dist, 20_000, 7).unwrap(), "{dist}");
        }
        assert_ne!(
            generate(Dist::Uniform, 100, 1).unwrap(),
            generate(Dist::Uniform, 100, 2).unwrap()
        );
        assert!(generate(Dist::Uniform, 10_000, 3)
            .unwrap()
            .iter()
            .all(|&k| k < 1 << 63));
    }

    /// A command that flattens the data-set arguments, as the subcommands do.
    #[derive(Debug, clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        data: DataSetArgs,
    }

    fn parse(argv: &[&str]) -> Result<DataSetArgs, clap::Error> {
        use clap::Parser;
        Cmd::try_parse_from(std::iter::once("cmd").chain(argv.iter().copied())).map(|c| c.data)
    }

    #[test]
    fn data_set_args_keep_their_relations() {
        let a = parse(&["--dist", "normal", "-n", "10"]).unwrap();
        assert_eq!(
            (a.dist, a.n, a.seed, a.is_given()),
            (Some(Dist::Normal), Some(10), 1, true)
        );
        let a = parse(&["--keys", "f", "--seed", "4"]).unwrap();
        assert_eq!((a.keys.as_deref(), a.seed), (Some(Path::new("f")), 4));
        assert!(
            !parse(&[]).unwrap().is_given(),
            "the group is not required here"
        );
        let e = parse(&["--keys", "f", "--dist", "uniform", "-n", "3"]).unwrap_err();
        assert!(e.to_string().contains("cannot be used with"), "{e}");
        let e = parse(&["--dist", "uniform"]).unwrap_err();
        assert!(e.to_string().contains("--n <N>"), "{e}");
    }

    #[test]
    fn load_generates_n_plus_inserts_with_the_seed() {
        let a = parse(&["--dist", "uniform", "--n", "100", "--seed", "5"]).unwrap();
        let keys = a.load(20, EmptyFile::Reject).unwrap();
        assert_eq!(keys, generate(Dist::Uniform, 120, 5).unwrap());
        let e = a.load(u64::MAX, EmptyFile::Reject).unwrap_err();
        assert_eq!(e.to_string(), "-n plus the run's inserts overflows");
        let e = parse(&[]).unwrap().load(0, EmptyFile::Accept).unwrap_err();
        assert!(e.to_string().starts_with("give --keys FILE"), "{e}");
    }

    #[test]
    fn load_reads_the_file_and_applies_the_empty_policy() {
        let path = tmp("load");
        write_sosd(&path, &[3, 9]).unwrap();
        let a = parse(&["--keys", path.to_str().unwrap()]).unwrap();
        assert_eq!(a.load(7, EmptyFile::Reject).unwrap(), vec![3, 9]);
        write_sosd(&path, &[]).unwrap();
        assert_eq!(a.load(0, EmptyFile::Accept).unwrap(), Vec::<u64>::new());
        let e = a.load(0, EmptyFile::Reject).unwrap_err();
        assert!(matches!(e, DatasetError::Empty { .. }), "{e}");
        assert!(e.to_string().ends_with(": the file holds no keys"), "{e}");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn zero_keys_is_an_error() {
        assert!(matches!(
            generate(Dist::Uniform, 0, 1),
            Err(DatasetError::BadCount { .. })
        ));
    }

    #[test]
    fn sosd_round_trip_keeps_extreme_keys() {
        let path = tmp("round-trip");
        let keys = vec![0, 1, 1 << 40, u64::MAX];
        write_sosd(&path, &keys).unwrap();
        assert_eq!(read_sosd(&path).unwrap(), keys);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn sosd_rejects_bad_files_with_what_was_wrong() {
        let path = tmp("bad");
        let write = |bytes: &[u8]| std::fs::write(&path, bytes).unwrap();
        let header = |n: u64| n.to_le_bytes().to_vec();

        write(&[1, 2, 3]);
        assert!(matches!(
            read_sosd(&path),
            Err(DatasetError::Truncated { .. })
        ));

        let mut b = header(3);
        b.extend(5u64.to_le_bytes());
        write(&b);
        let e = read_sosd(&path).unwrap_err();
        assert!(e.to_string().contains("announces 3 keys"), "{e}");

        write(&header(u64::MAX));
        assert!(matches!(
            read_sosd(&path),
            Err(DatasetError::Truncated { .. })
        ));

        let mut b = header(1);
        b.extend(5u64.to_le_bytes());
        b.push(0);
        write(&b);
        assert!(matches!(
            read_sosd(&path),
            Err(DatasetError::Oversized { extra: 1, .. })
        ));

        for (keys, what) in [([1u64, 3, 2], "unsorted"), ([1, 2, 2], "duplicate")] {
            let mut b = header(3);
            keys.iter().for_each(|k| b.extend(k.to_le_bytes()));
            write(&b);
            let e = read_sosd(&path).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
            assert!(e.to_string().contains("index 2"), "{e}");
        }
        std::fs::remove_file(&path).unwrap();

        let e = read_sosd(Path::new("/nonexistent/keys.sosd")).unwrap_err();
        assert!(matches!(e, DatasetError::Io { .. }), "{e}");
    }
}
