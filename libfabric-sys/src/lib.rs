//! Raw bindings to the system libfabric, generated at build time from its
//! headers (found by pkg-config; 1.17, Debian 12's, or newer).
//!
//! libfabric implements most of its API (`fi_domain`, `fi_write`,
//! `fi_cq_read`, …) as `static inline` functions over per-object operation
//! tables; those are reached through the `rfi_*` functions of a C shim
//! compiled into this crate, each forwarding to the inline of the same name.
//! The real symbols (`fi_getinfo`, `fi_fabric`, `fi_strerror`, …) are bound
//! directly. Constants bindgen cannot evaluate from macros are the `rfi_*`
//! statics ([`rfi_addr_unspec`], [`rfi_eagain`], [`rfi_eavail`]).
//!
//! Everything here is `unsafe` and unchecked; the safe wrapper lives in the
//! host crate's libfabric domain.
#![allow(non_upper_case_globals, non_camel_case_types, non_snake_case)]
#![allow(missing_docs, clippy::all)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// `FI_VERSION(major, minor)`: the API version asked of `fi_getinfo`.
pub const fn fi_version_of(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_reports_a_version_of_at_least_1_17() {
        // SAFETY: `fi_version` takes no arguments and only returns a number.
        let v = unsafe { fi_version() };
        assert!(v >= fi_version_of(1, 17), "libfabric version {v:#x}");
    }

    #[test]
    fn strerror_of_eagain_is_text() {
        // SAFETY: reading an immutable exported constant.
        let eagain = unsafe { rfi_eagain };
        // SAFETY: `fi_strerror` returns a static NUL-terminated string for
        // any error number.
        let s = unsafe { std::ffi::CStr::from_ptr(fi_strerror(eagain)) };
        assert!(!s.to_bytes().is_empty());
    }
}
