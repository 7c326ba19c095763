//! `rolex-host`: one dependency for users who want the whole host side of
//! ROLEX-RS. It re-exports, unchanged:
//!
//! - the transfer engine, `rolex-engine`, at the crate root (its modules
//!   [`engine`], [`domain`], [`batch`], … and its main types);
//! - the key-value compute-node client, `rolex-kv`, as [`kv`];
//! - the hosted memory node, `rolex-memnode`, as [`memnode`].
//!
//! A compute node that only needs the client should depend on `rolex-kv`
//! alone: it does not link the memory node's agent.
//!
//! Where to start: the examples, `cargo run --example transfer_engine -p
//! rolex-host` (registration, paged writes with immediates and their
//! ImmCounter expectation, scatter to a peer group, barrier) and `cargo
//! run --example kv_store -p rolex-host` (a memory node and a compute
//! node: get, insert, update, scan, delete); then the examples on
//! [`TransferEngine`], [`kv::KvClient`] and
//! [`memnode::MemoryNode::start`].
#![deny(missing_docs)]

pub use rolex_engine::*;
/// The key-value compute-node client (`rolex-kv`).
pub use rolex_kv as kv;
/// The hosted memory node (`rolex-memnode`).
pub use rolex_memnode as memnode;
