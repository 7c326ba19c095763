//! `rolex-memnode`: the hosted memory node of the ROLEX store (design §5,
//! §6): an engine of its own that registers the pool (in memory or in a
//! shared file), bulk-loads it, and runs the `rolex-dpu` retraining agent
//! on a thread that parks when idle; the lease server through which it
//! learns that a compute node died and releases its locks.
//!
//! This is the only host crate that links the agent (`rolex-dpu`): compute
//! nodes (`rolex-kv`) and the transfer engine (`rolex-engine`) never do.
//!
//! - [`node`]: [`MemoryNode`], [`MemoryNodeConfig`], [`HostPool`] (the
//!   agent's view of a registered pool), [`MemoryNodeStats`].
//! - [`lease_server`]: [`LeaseServer`], [`LeaseConfig`].
//! - [`lease_keys`]: [`LeaseKeys`], a key to a file-backed pool per lease,
//!   closed when the lease ends (fences late RMA at the memory node).
//! - [`error`]: [`MemoryNodeError`], what failed and where.
#![deny(missing_docs)]

pub mod error;
pub mod lease_keys;
pub mod lease_server;
pub mod node;

pub use error::{MemoryNodeError, NotAPool, PoolFileProblem};
pub use lease_keys::LeaseKeys;
pub use lease_server::{LeaseConfig, LeaseServer, OnExpire, PoolKeys};
pub use node::{
    AgentActivity, AtomicsRoute, HostPool, MemoryNode, MemoryNodeConfig, MemoryNodeStats,
};
pub use rolex_dpu::{
    AgentError, AgentStats, DamagedLeaf, Notice, Prepared, Recovery, Restored, RetrainReport,
    ValueReclaim,
};
pub use rolex_kv::PoolInfo;
