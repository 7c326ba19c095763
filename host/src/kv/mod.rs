//! The learned key-value store (ROLEX, design §5) on this crate's transfer
//! engine: a [`MemoryNode`] that holds the pool and retrains models, and
//! [`KvClient`] compute nodes whose per-thread [`KvSession`]s serve `get`,
//! `insert`, `update`, `delete`, `scan` and `range` with one-sided verbs
//! only. `u64` keys (every value, `u64::MAX` included) and `u64` values.
//!
//! - [`memnode`] — [`MemoryNode`], [`MemoryNodeConfig`], [`PoolInfo`],
//!   [`MemoryNodeStats`].
//! - [`client`] — [`KvClient`], [`KvClientConfig`].
//! - [`session`] — [`KvSession`] and the protocol (chains, locks, chase).
//! - `cache` (private): what a compute node caches.
//! - [`stats`] — [`KvStats`], [`OpStats`], [`KvOp`], [`ModelBytes`].
//! - [`error`] — [`KvError`].
//! - [`history`] — recorded histories and the linearizability checker.
//! - [`lease`] — [`lease::LeaseServer`] / [`lease::LeaseClient`]: how a
//!   memory node learns a compute node died and releases its locks.

mod cache;
pub mod client;
pub mod error;
pub mod history;
pub mod lease;
pub mod memnode;
pub mod session;
pub mod stats;

pub use client::{KvClient, KvClientConfig};
pub use error::KvError;
pub use memnode::{
    AgentActivity, HostPool, MemoryNode, MemoryNodeConfig, MemoryNodeStats, PoolInfo,
};
pub use rolex_dpu::{AgentError, AgentStats, Prepared, RetrainReport};
pub use session::KvSession;
pub use stats::{KvOp, KvStats, ModelBytes, OpStats};
