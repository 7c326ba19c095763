//! [`AgentError`]: every way bulk loading or retraining fails, as a small
//! `Copy` enum naming what was wrong and where.

use core::fmt;

use rolex_core::entry::{EntryError, LockOwner};
use rolex_core::layout::{CirqError, LayoutError, LeafError};
use rolex_core::model::ModelError;

use crate::memory::MemError;

/// A pool state the agent refuses to build on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Inconsistency {
    /// A model's leaves do not tile its key range: the leaf at `index` (in
    /// chain order) does not start one past the previous leaf's `fence_hi`.
    FenceGap {
        /// Position of the leaf in the walk.
        index: u64,
    },
    /// The first leaf does not start at the model's first key, or the last
    /// does not end at its last key.
    RangeEnds,
    /// A chain is longer than any the SLT can hold (a cycle of links).
    ChainTooLong,
    /// The model was already frozen by someone else.
    AlreadyFrozen,
    /// The directory word does not point at a record serving this model.
    WrongRecord,
    /// The directory names a retired record (found on resume).
    RetiredInDirectory,
    /// The model's record overlaps model `other`'s (found on resume).
    RecordsOverlap {
        /// The other model.
        other: u64,
    },
}

impl fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::FenceGap { index } => {
                write!(
                    f,
                    "leaf {index} of the walk does not follow its predecessor's fences"
                )
            }
            Self::RangeEnds => f.write_str("leaves do not cover the model's key range"),
            Self::ChainTooLong => f.write_str("a leaf chain is longer than the SLT allows"),
            Self::AlreadyFrozen => f.write_str("the model is already frozen"),
            Self::WrongRecord => f.write_str("the directory names a record of another model"),
            Self::RetiredInDirectory => f.write_str("the directory names a retired record"),
            Self::RecordsOverlap { other } => {
                write!(f, "its record overlaps model {other}'s")
            }
        }
    }
}

/// What failed in a pool access, a layout computation or a leaf read: the
/// only ways reading a leaf can fail, and the only ways the steps after a
/// retraining's switch can (see [`AgentError::RollForward`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// The pool memory refused an access.
    Mem(MemError),
    /// An offset computed from the layout is out of its part.
    Layout(LayoutError),
    /// A leaf stayed invalid after every retry.
    Leaf {
        /// Its leaf number.
        leaf: u64,
        /// The last validation failure.
        error: LeafError,
    },
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Mem(e) => write!(f, "pool memory: {e}"),
            Self::Layout(e) => write!(f, "pool layout: {e}"),
            Self::Leaf { leaf, error } => write!(f, "leaf {leaf}: {error}"),
        }
    }
}

impl core::error::Error for PoolError {}

impl From<MemError> for PoolError {
    fn from(e: MemError) -> Self {
        Self::Mem(e)
    }
}

impl From<LayoutError> for PoolError {
    fn from(e: LayoutError) -> Self {
        Self::Layout(e)
    }
}

/// Why bulk loading or retraining failed. Nothing the agent was installing
/// becomes visible when it returns one (a retraining aborted before its
/// switch thaws the old model), except [`AgentError::RollForward`]: that
/// retraining is installed and only its last steps are left, which the
/// agent retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AgentError {
    /// The pool memory refused an access.
    Mem(MemError),
    /// Fences could not be cut into models, or a model fitted over its
    /// fences.
    Model(ModelError),
    /// A pool layout is malformed or does not fit.
    Layout(LayoutError),
    /// A leaf stayed invalid after every retry.
    Leaf {
        /// Its leaf number.
        leaf: u64,
        /// The last validation failure.
        error: LeafError,
    },
    /// An entry field does not fit.
    Entry(EntryError),
    /// The retraining queue is malformed.
    Cirq(CirqError),
    /// Bulk-load keys are not strictly increasing at `index`: `key` is not
    /// above `prev`, the key before it.
    UnsortedKeys {
        /// Index of the first offending key.
        index: u64,
        /// The offending key.
        key: u64,
        /// The key before it.
        prev: u64,
    },
    /// A bulk-load parameter is out of range.
    BadConfig {
        /// Which parameter.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// No room left in the model region for a new record.
    ModelRegionFull {
        /// Bytes a record may need.
        needed: u64,
        /// The largest record that fits now: the biggest reusable block of
        /// retired records, or the room past the highest record.
        left: u64,
    },
    /// The directory has no model `model_id`.
    UnknownModel {
        /// The model asked for.
        model_id: u64,
    },
    /// The freeze of model `model_id` waited past its deadline
    /// ([`crate::AgentConfig::freeze_deadline`]) for a writer holding LT
    /// entry `entry`; the agent thawed the model (unlocked what it had
    /// locked, cleared `FROZEN`) and retries it later.
    FreezeDeadline {
        /// The model.
        model_id: u64,
        /// The LT entry still locked.
        entry: u64,
        /// Who held it.
        holder: LockOwner,
        /// Nanoseconds the freeze had waited.
        waited_ns: u64,
    },
    /// A retraining passed its point of no return (the directory names
    /// the new record `new_record`, the old one is retired), but a step
    /// after it failed: `locked` LT entries of the new record are still
    /// locked by the agent (their writers back off, readers go on). The
    /// agent never undoes a switch; it retries those steps (rolls forward)
    /// on its next polls, and before anything else touches the model.
    RollForward {
        /// The model.
        model_id: u64,
        /// Its new record.
        new_record: u64,
        /// Entries of the new record still locked.
        locked: u64,
        /// What failed.
        cause: PoolError,
    },
    /// The model's pool state is not one the protocol produces.
    Inconsistent {
        /// The model.
        model_id: u64,
        /// What was wrong.
        what: Inconsistency,
    },
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Mem(e) => write!(f, "pool memory: {e}"),
            Self::Model(e) => write!(f, "training: {e}"),
            Self::Layout(e) => write!(f, "pool layout: {e}"),
            Self::Leaf { leaf, error } => write!(f, "leaf {leaf}: {error}"),
            Self::Entry(e) => write!(f, "entry: {e}"),
            Self::Cirq(e) => write!(f, "retraining queue: {e}"),
            Self::UnsortedKeys { index, key, prev } => write!(
                f,
                "bulk-load key {key} at index {index} is not above the key before it, {prev}"
            ),
            Self::BadConfig { field, value } => write!(f, "invalid {field}: {value}"),
            Self::ModelRegionFull { needed, left } => write!(
                f,
                "model region full: a new record may need {needed} bytes, {left} left"
            ),
            Self::UnknownModel { model_id } => write!(f, "no model {model_id} in the directory"),
            Self::FreezeDeadline {
                model_id,
                entry,
                holder,
                waited_ns,
            } => {
                write!(
                    f,
                    "model {model_id}: the freeze gave up after {} us waiting for LT entry {entry}, locked by ",
                    waited_ns / 1000
                )?;
                match holder {
                    LockOwner::ANONYMOUS => f.write_str("an anonymous holder")?,
                    LockOwner::AGENT => f.write_str("the agent")?,
                    LockOwner(id) => write!(f, "lease {id}")?,
                }
                f.write_str("; thawed, to be retried")
            }
            Self::RollForward {
                model_id,
                new_record,
                locked,
                cause,
            } => write!(
                f,
                "model {model_id}: switched to record {new_record}, but finishing failed \
                 with {locked} of its LT entries still locked ({cause}); rolling forward"
            ),
            Self::Inconsistent { model_id, what } => write!(f, "model {model_id}: {what}"),
        }
    }
}

impl core::error::Error for AgentError {}

impl From<MemError> for AgentError {
    fn from(e: MemError) -> Self {
        Self::Mem(e)
    }
}

impl From<PoolError> for AgentError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Mem(e) => Self::Mem(e),
            PoolError::Layout(e) => Self::Layout(e),
            PoolError::Leaf { leaf, error } => Self::Leaf { leaf, error },
        }
    }
}

impl From<LayoutError> for AgentError {
    fn from(e: LayoutError) -> Self {
        Self::Layout(e)
    }
}

impl From<EntryError> for AgentError {
    fn from(e: EntryError) -> Self {
        Self::Entry(e)
    }
}

impl From<ModelError> for AgentError {
    fn from(e: ModelError) -> Self {
        Self::Model(e)
    }
}

impl From<CirqError> for AgentError {
    fn from(e: CirqError) -> Self {
        Self::Cirq(e)
    }
}
