//! [`MemoryNodeError`]: every way starting or driving a hosted memory node
//! fails, naming what was wrong.

use core::fmt;
use std::path::PathBuf;

use rolex_core::layout::{AgentAreaError, LayoutError};
use rolex_dpu::AgentError;
use rolex_engine::TransferError;

/// A hosted memory node failure.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum MemoryNodeError {
    /// The transfer engine failed an operation.
    Transfer {
        /// What the memory node was doing.
        during: &'static str,
        /// The engine's error.
        error: TransferError,
    },
    /// The pool's bytes are not a valid layout.
    Layout(LayoutError),
    /// The agent failed (bulk load, retraining or releasing locks).
    Agent(AgentError),
    /// A configuration value is out of range, or the node was asked for
    /// something its configuration does not have.
    BadConfig {
        /// Which field.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A pool file cannot be created, or cannot be resumed.
    PoolFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: PoolFileProblem,
    },
}

/// Why a pool file cannot be used (see `MemoryNode::resume`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolFileProblem {
    /// There is no such file.
    Missing,
    /// The file system refused an operation.
    Io {
        /// What the node was doing (`"opening"`, `"mapping"`, …).
        during: &'static str,
        /// The error's kind.
        kind: std::io::ErrorKind,
    },
    /// Another process holds the file (a memory node serving it).
    InUse,
    /// The file does not hold an agent area and a pool: it is too short,
    /// or its magic words are not ours.
    NotAPool {
        /// What gave it away.
        why: NotAPool,
    },
    /// The pool is of a layout version this build does not read.
    LayoutVersion {
        /// The version in the file.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
}

/// What shows that a file is not a pool file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotAPool {
    /// The agent area at the file's start is refused.
    Area(AgentAreaError),
    /// The pool after the agent area does not start with the pool magic.
    PoolMagic {
        /// The word found instead.
        found: u64,
    },
    /// The file is shorter than the agent area and pool it describes.
    Short {
        /// Bytes needed.
        needed: u64,
        /// Bytes the file has.
        found: u64,
    },
}

impl fmt::Display for PoolFileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => f.write_str("no such file"),
            Self::Io { during, kind } => write!(f, "{during} failed: {kind}"),
            Self::InUse => f.write_str("locked by a memory node that serves it (flock)"),
            Self::NotAPool { why } => {
                f.write_str("not a pool file (")?;
                match why {
                    NotAPool::Area(e) => write!(f, "{e}")?,
                    NotAPool::PoolMagic { found } => write!(
                        f,
                        "the pool magic is {found:#018x}, not {:#018x}",
                        rolex_core::layout::MAGIC
                    )?,
                    NotAPool::Short { needed, found } => {
                        write!(f, "{found} bytes, its layout needs {needed}")?
                    }
                }
                f.write_str(")")
            }
            Self::LayoutVersion { found, supported } => write!(
                f,
                "its pool has layout version {found}; this build reads version {supported}"
            ),
        }
    }
}

impl fmt::Display for MemoryNodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transfer { during, error } => write!(f, "{during}: {error}"),
            Self::Layout(e) => write!(f, "pool layout: {e}"),
            Self::Agent(e) => write!(f, "memory-node agent: {e}"),
            Self::BadConfig { field, reason } => write!(f, "invalid {field}: {reason}"),
            Self::PoolFile { path, problem } => {
                write!(f, "pool file {}: {problem}", path.display())
            }
        }
    }
}

impl std::error::Error for MemoryNodeError {}

impl From<LayoutError> for MemoryNodeError {
    fn from(e: LayoutError) -> Self {
        Self::Layout(e)
    }
}

impl From<AgentError> for MemoryNodeError {
    fn from(e: AgentError) -> Self {
        Self::Agent(e)
    }
}

/// Wraps an engine error with what the memory node was doing.
pub(crate) fn transfer(during: &'static str) -> impl Fn(TransferError) -> MemoryNodeError {
    move |error| MemoryNodeError::Transfer { during, error }
}
