//! [`KvError`]: every way a key-value operation or a client connection
//! fails, naming what was wrong.

use core::fmt;

use rolex_core::layout::LayoutError;
use rolex_core::model::ModelError;

use rolex_engine::TransferError;

/// A key-value store failure. Whatever it is, the pool is left consistent:
/// an operation that fails changed nothing, or completed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum KvError {
    /// The transfer engine failed an operation.
    Transfer {
        /// What the store was doing.
        during: &'static str,
        /// The engine's error.
        error: TransferError,
    },
    /// The pool's layout version is not the one this build reads.
    LayoutVersion {
        /// The version the pool (or its descriptor) announces.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// The pool's bytes are not a valid layout.
    Layout(LayoutError),
    /// `scan` was asked for 0 keys.
    ScanCountZero,
    /// `range` was given `lo > hi`.
    InvalidRange {
        /// The low bound.
        lo: u64,
        /// The high bound.
        hi: u64,
    },
    /// A configuration value is out of range.
    BadConfig {
        /// Which field.
        field: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A model's synonym leaf table stayed full for the whole bounded wait
    /// for its retraining; the insert did not happen.
    SltFull {
        /// The model.
        model: u64,
    },
    /// The leaf region has no leaf left; the insert did not happen.
    LeafRegionFull {
        /// Leaves the region holds.
        capacity: u64,
    },
    /// An operation kept failing (contention, torn leaves, frozen model)
    /// for its whole retry budget; it did not take effect.
    TooManyRetries {
        /// The operation.
        op: &'static str,
        /// Attempts made.
        attempts: u64,
    },
    /// The models' first keys (the pool's upper blob) cannot be indexed:
    /// they do not increase (the error names the model) or the upper
    /// levels' bound is too large.
    Locator(ModelError),
    /// The pool holds something the protocol never produces.
    Inconsistent {
        /// What.
        what: &'static str,
        /// The model concerned.
        model: u64,
    },
}

impl fmt::Display for KvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transfer { during, error } => write!(f, "{during}: {error}"),
            Self::LayoutVersion { found, expected } => write!(
                f,
                "pool layout version {found}, this client reads version {expected}"
            ),
            Self::Layout(e) => write!(f, "pool layout: {e}"),
            Self::ScanCountZero => f.write_str("scan asked for 0 keys"),
            Self::InvalidRange { lo, hi } => write!(f, "range bounds inverted: lo {lo} > hi {hi}"),
            Self::BadConfig { field, reason } => write!(f, "invalid {field}: {reason}"),
            Self::SltFull { model } => write!(
                f,
                "model {model}: synonym leaf table full and not retrained in time"
            ),
            Self::LeafRegionFull { capacity } => {
                write!(f, "leaf region full ({capacity} leaves)")
            }
            Self::TooManyRetries { op, attempts } => {
                write!(f, "{op} gave up after {attempts} attempts")
            }
            Self::Locator(e) => write!(f, "model locator: {e}"),
            Self::Inconsistent { what, model } => write!(f, "model {model}: {what}"),
        }
    }
}

impl std::error::Error for KvError {}

impl From<LayoutError> for KvError {
    fn from(e: LayoutError) -> Self {
        Self::Layout(e)
    }
}

/// Wraps an engine error with what the store was doing.
pub(crate) fn transfer(during: &'static str) -> impl Fn(TransferError) -> KvError {
    move |error| KvError::Transfer { during, error }
}
