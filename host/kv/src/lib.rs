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
//!   round trips of one ([`KvSession::run_many`]; for byte values,
//!   [`ValueRequest`] and [`KvSession::run_many_values`]).
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
mod reaper;
mod redo;
pub mod session;
pub mod stats;
mod values;

pub use client::{KvClient, KvClientConfig};

/// The fuzz targets' way into decoders this crate keeps private; built
/// only by `cargo fuzz`, which compiles every crate with `--cfg fuzzing`.
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    use rolex_core::entry::LeafAddr;
    use rolex_core::layout::{LayoutError, Superblock};

    /// Parses the model record at pool offset `offset` from `bytes` (a
    /// READ of its record and tables) as a compute node caches it, then
    /// asks the view what a session asks it: the owning training leaf of
    /// each of `keys`, that leaf's cached chain, every SLT slot's stash,
    /// the bytes cached. Returns how many leaves the model has.
    pub fn model_view(
        offset: u64,
        bytes: &[u8],
        sb: &Superblock,
        keys: &[u64],
    ) -> Result<u64, LayoutError> {
        let v = crate::cache::ModelView::parse(offset, bytes, sb)?;
        let mut chain: Vec<LeafAddr> = Vec::new();
        for &key in keys {
            let (leaf, _) = v.owner(key);
            chain.clear();
            v.chain(leaf, &mut chain);
        }
        for slot in 0..=u8::MAX {
            let _ = v.stash_leaf(slot);
        }
        let _ = (v.has_stash(), v.bytes());
        Ok(v.record.leaf_count())
    }
}
pub use cluster::{ClusterClient, ClusterNode, ClusterSession, PartitionMap};
pub use error::KvError;
pub use pool_info::PoolInfo;
pub use session::{Answer, KvSession, Reply, Request, Scanned, ValueAnswer, ValueRequest};
pub use stats::{KvOp, KvStats, ModelBytes, OpStats};
