//! The memory-node agent: CirQ consumer, retraining and shadow redirection.
//!
//! Not built yet. The agent's logic (retraining over a trait for "my own
//! memory", hosted and freestanding builds) is the work of the issues "The
//! learned key-value store end to end" and "The memory-node agent as DPU
//! firmware". Today this crate only checks that the pool layouts it will
//! consume are the ones `rolex-core` exports.
#![no_std]
#![deny(missing_docs)]

/// The pool layout version this agent understands (the superblock's).
pub const LAYOUT_VERSION: u32 = rolex_core::layout::LAYOUT_VERSION;
