//! `rolex-core`: the pure logic and byte layouts shared by every part of ROLEX-RS.
//!
//! Both the host library (compute-node client and transfer engine) and the
//! memory-node firmware link this crate, so it is `no_std`; the optional
//! `alloc` feature adds growable forms of the same types. Nothing here knows
//! about threads, sockets, libfabric or ibverbs.
//!
//! - [`plr`]: optimal streaming piecewise-linear fit (exact integer geometry).
//! - `radix` (with `alloc`): a radix table over sorted keys, the O(1) first
//!   step of the client's lookups.
//! - [`model`]: the store's learned model: leaf fences, their cut into models,
//!   training, prediction and its window, and the locator over the models.
//! - [`entry`]: leaf-table entries (`lock | region | pointer | leaf`).
//! - [`layout`]: everything that lives in the memory pool, as `zerocopy` types.
//! - [`imm_counter`]: order-independent completion counting per immediate.
//! - [`wire`]: the versioned binary encoding of what peers exchange.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]

#[cfg(feature = "alloc")]
extern crate alloc;

pub mod entry;
pub mod imm_counter;
pub mod layout;
pub mod model;
pub mod plr;
#[cfg(feature = "alloc")]
pub mod radix;
pub mod wire;
