//! Fuzzes the `NetAddr` decoder with arbitrary peer bytes.
//!
//! Decoding never panics; whatever decodes re-encodes to the same bytes
//! (the encoding is canonical) and decodes again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::wire::{NetAddr, Wire};

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = NetAddr::decode(data) {
        let bytes = value.to_vec().expect("a decoded NetAddr re-encodes");
        assert_eq!(bytes, data, "NetAddr encoding is canonical");
        assert_eq!(NetAddr::decode(&bytes), Ok(value));
    }
});
