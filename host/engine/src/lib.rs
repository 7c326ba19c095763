//! `rolex-engine`: the transfer engine and its NIC domains.
//!
//! A portable point-to-point RDMA transfer engine after Perplexity's
//! TransferEngine (design §4): memory registration, two-sided send/receive,
//! one-sided single and paged writes with 32-bit immediates counted by an
//! order-independent ImmCounter, peer groups with scatter and barrier,
//! multi-NIC splitting, UVM watchers — plus one-sided reads and 8-byte
//! atomics, and [`Channel`] doorbell batches for low-latency clients.
//! It assumes only what RC and SRD both give: reliable, unordered delivery.
//!
//! - [`engine`]: the public API, [`TransferEngine`].
//! - [`domain`]: the `Domain` / `Endpoint` traits and the backends
//!   (`loopback`; `fabric` and `verbs` behind their features).
//! - `shared` (private): the state the API, the group workers and the
//!   channels share, and the check of remote ranges; it imports none of them.
//! - `group` (private): the worker thread of each domain group.
//! - [`atomics`]: how a NIC's atomics relate to the host's, and
//!   [`SharedWords`], the host's own atomics on words peers update.
//! - [`imm_wait`]: expectations with deadlines, cancellation and
//!   senders' abort notices.
//! - [`region`]: registered memory and [`MrHandle`].
//! - [`callback`]: [`OnDone`], [`OnValue`], [`CompletionFlag`].
//! - [`control`]: what the TCP control servers share ([`DeadlineReader`],
//!   [`Refusals`]).
//! - [`batch`]: [`Channel`] and [`BatchOp`].
//! - [`watcher`]: UVM watchers, [`Watcher`].
//! - [`counters`]: per-engine and per-domain counters.
//! - [`topology`]: which devices an engine's NICs open ([`NicSelect`]:
//!   listed, named, nearest a GPU, on a NUMA node), from sysfs.
//! - [`error`]: every failure, [`TransferError`].
#![deny(missing_docs)]

pub mod atomics;
pub mod batch;
pub mod callback;
pub mod control;
pub mod counters;
pub mod domain;
pub mod engine;
pub mod error;
mod group;
pub mod imm_wait;
mod plug;
pub mod region;
mod shared;
mod timer;
pub mod topology;
pub mod watcher;

pub use atomics::{AtomicProfile, AtomicRoute, AtomicScope, ReplyOrder, SharedWords};
pub use batch::{BatchOp, Channel, Posted};
pub use callback::{CompletionFlag, OnDone, OnValue};
pub use control::{DeadlineReader, Refusals};
pub use counters::{CounterSnapshot, DomainCounters, EngineCounters};
pub use domain::loopback::{Faults, LoopbackConfig, Unordered};
pub use engine::{
    mr_desc_from_bytes, net_addr_from_bytes, single_write_pieces, EngineConfig, Fabric,
    PeerGroupHandle, TransferEngine, DEFAULT_SPIN, SPLIT_MIN,
};
pub use error::{ConfigError, OpKind, ProtectionCheck, TransferError};
pub use plug::Plug;
pub use region::MrHandle;
pub use rolex_core::wire::{Access, MrDesc, NetAddr, Pages, ScatterDst};
pub use timer::monotonic_ns;
pub use topology::{NicChoice, NicSelect, PciAddr};
pub use watcher::Watcher;
