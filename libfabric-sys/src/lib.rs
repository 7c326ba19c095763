//! Raw bindings to libfabric (1.17, Debian 12's, and newer), loaded at run
//! time: the project builds without libfabric, its headers, a C compiler
//! or pkg-config, and only the libfabric domain needs the library, when it
//! opens.
//!
//! - [`abi`]: the subset of libfabric's ABI the domain uses, declared by
//!   hand (structs, operation tables, constants); `tests/abi.rs` checks
//!   every declared size and offset against the installed headers.
//! - [`load`]: [`lib`] `dlopen`s `libfabric.so.1` (or `ROLEX_LIBFABRIC`)
//!   once and resolves the real symbols (`fi_getinfo`, `fi_fabric`, ...);
//!   a missing library is a [`LoadError`] saying how to install it.
//! - [`ops`]: libfabric's `static inline` calls (`fi_domain`, `fi_write`,
//!   `fi_cq_read`, ...), which go through the objects' operation tables,
//!   written in Rust.
//!
//! Everything that touches libfabric objects is `unsafe` and unchecked;
//! the safe wrapper is the host crate's libfabric domain.
#![deny(missing_docs)]

pub mod abi;
pub mod load;
pub mod ops;

pub use abi::*;
pub use load::{lib, Lib, LoadError, DEFAULT_LIBRARY, LIBRARY_ENV, MIN_VERSION};
pub use ops::*;
