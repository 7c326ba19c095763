//! Fuzzes the `ScatterDst` decoder with arbitrary peer bytes.
//!
//! Decoding never panics; whatever decodes re-encodes to the same bytes
//! (the encoding is canonical) and decodes again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::wire::{ScatterDst, Wire};

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = ScatterDst::decode(data) {
        let bytes = value.to_vec().expect("a decoded ScatterDst re-encodes");
        assert_eq!(bytes, data, "ScatterDst encoding is canonical");
        assert_eq!(ScatterDst::decode(&bytes), Ok(value));
    }
});
