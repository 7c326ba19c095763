//! [`MemoryNodeError`]: every way starting or driving a hosted memory node
//! fails, naming what was wrong.

use core::fmt;

use rolex_core::layout::LayoutError;
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
}

impl fmt::Display for MemoryNodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Transfer { during, error } => write!(f, "{during}: {error}"),
            Self::Layout(e) => write!(f, "pool layout: {e}"),
            Self::Agent(e) => write!(f, "memory-node agent: {e}"),
            Self::BadConfig { field, reason } => write!(f, "invalid {field}: {reason}"),
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
