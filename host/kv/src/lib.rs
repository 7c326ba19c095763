//! `rolex-kv`: the compute-node client of the learned key-value store
//! (ROLEX, design §5) on the transfer engine. [`KvClient`] connects to a
//! memory node's pool ([`PoolInfo`]) and caches its learned models; its
//! per-thread [`KvSession`]s serve `get`, `insert`, `update`, `delete`,
//! `scan` and `range` with one-sided verbs only. Keys are `u64` (every
//! value, `u64::MAX` included; variable-length keys are not supported).
//! Values are byte strings of 0 bytes to
//! [`rolex_core::layout::MAX_VALUE_LEN`]: up to 8 bytes inline in the
//! leaf slot (a get stays one round trip), longer ones out of line in
//! value blocks the slot points to (a get reads the leaf, then the block:
//! two round trips). The byte methods (`put`, `get_value`, `get_into`,
//! `update_value`, `remove`, `scan_values`, `range_values`) take any
//! value; the `u64` methods (`insert`, `get`, …) are shorthands for
//! 8-byte values (little-endian) and refuse, changing nothing, a key
//! whose value has another length.
//!
//! This crate never links the memory node's agent (`rolex-dpu`): what a
//! compute node shares with it (the learned model, the pool layouts) lives
//! in `rolex-core`. The hosted memory node is `rolex-memnode`.
//!
//! - [`client`]: [`KvClient`], [`KvClientConfig`].
//! - [`cluster`]: several memory nodes, each serving a key range of a
//!   versioned [`PartitionMap`]: [`ClusterClient`] (one [`KvClient`] per
//!   node) and [`ClusterSession`], which route every operation by key and
//!   scan across the ranges in key order.
//! - [`session`]: [`KvSession`] and the protocol (chains, locks, chase);
//!   its private `lock` takes and releases chain locks, `split` splits a
//!   full leaf, `pipeline` runs several requests ([`Request`]) in the
//!   round trips of one ([`KvSession::run_many`]).
//! - `cache` (private): what a compute node caches.
//! - `io` (private): a session's queue pair and buffers, one doorbell batch
//!   per round trip.
//! - `held` (private): chain locks whose lock or release failed without
//!   saying whether it landed, and their safe release.
//! - `values` (private): a client's share of the value region (chunks
//!   claimed by `FAA`, blocks freed and reused with new generations).
//! - [`pool_info`]: [`PoolInfo`], what a client connects to.
//! - [`stats`]: [`KvStats`], [`OpStats`], [`KvOp`], [`ModelBytes`].
//! - [`error`]: [`KvError`], what failed and where.
//! - [`lease`]: [`lease::LeaseClient`], [`lease::LeaseFence`] and the
//!   lease wire format: how a memory node learns a compute node died or
//!   stalled and releases its locks, and how the compute node stops
//!   writing before that (the timing is stated there).
#![deny(missing_docs)]

mod cache;
pub mod client;
pub mod cluster;
pub mod error;
mod held;
mod io;
pub mod lease;
pub mod pool_info;
pub mod session;
pub mod stats;
mod values;

pub use client::{KvClient, KvClientConfig};
pub use cluster::{ClusterClient, ClusterNode, ClusterSession, PartitionMap};
pub use error::KvError;
pub use pool_info::PoolInfo;
pub use session::{Answer, KvSession, Request};
pub use stats::{KvOp, KvStats, ModelBytes, OpStats};
