//! The memory-node agent of ROLEX-RS: bulk load, CirQ consumer, retraining
//! and shadow redirection, as `no_std` + `alloc` logic over
//! [`PoolMemory`], a trait for the agent's own memory.
//!
//! The agent never sits on the data path: compute nodes read, write and
//! lock the pool with one-sided operations; the agent only reacts to the
//! retraining queue (and to SLT counts it watches), builds a new model
//! record beside the old one, and installs it with one 8-byte write of the
//! model's directory word. A hosted driver (a thread that owns an
//! [`Agent`] over a registered region and parks when idle) lives in
//! `rolex-memnode` (`MemoryNode`), so this crate stays freestanding.
//!
//! - [`memory`] — [`PoolMemory`], [`MemError`] and [`SharedBytes`], the
//!   checked access every pool over an address range makes.
//! - [`bulk`] — laying out and bulk-loading a fresh pool (fences, models and
//!   their fit are `rolex_core::model`'s, as the clients' prediction).
//! - [`leaves`] — reading and validating leaves and chains from the pool.
//! - [`agent`] — the retraining service, [`Agent`].
//! - [`record_space`] — [`RecordSpace`], the model region's free space:
//!   retired records reused after a grace period.
//! - [`recover`] — [`Agent::resume`]: attaching to a pool whose previous
//!   agent died (validation, thaw or roll forward, compute-node locks
//!   released, free space retired at the restart).
//! - [`reap`] — releasing the chain locks of a compute node whose lease
//!   ended, mending the leaves it left torn.
//! - [`redo`] — the redo log's memory-node side: the newest whole copy of
//!   a torn leaf, written over it; blocks of dead holders freed.
//! - [`histogram`] — [`Histogram`], the freeze-time histogram.
//! - [`error`] — [`AgentError`].
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

extern crate alloc;

pub mod agent;
pub mod bulk;
pub mod error;
pub mod histogram;
pub mod leaves;
pub mod memory;
pub mod reap;
pub mod record_space;
pub mod recover;
pub mod redo;

pub use agent::{Agent, AgentConfig, AgentStats, Failure, Notice, Prepared, RetrainReport};
pub use bulk::{BulkConfig, BulkPlan};
pub use error::{AgentError, Inconsistency, PoolError};
pub use histogram::Histogram;
pub use memory::{MemError, PoolMemory, SharedBytes};
pub use reap::{release_locks_of, release_locks_reporting, release_locks_where};
pub use record_space::RecordSpace;
pub use recover::{DamagedLeaf, Recovery, ValueReclaim};
pub use redo::{Mender, RedoCopies, Restored};

/// The pool layout version this agent understands (the superblock's).
pub const LAYOUT_VERSION: u32 = rolex_core::layout::LAYOUT_VERSION;
