//! Fuzzes the `MrDesc` decoder with arbitrary peer bytes.
//!
//! Decoding never panics; whatever decodes re-encodes to the same bytes
//! (the encoding is canonical) and decodes again to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::wire::{MrDesc, Wire};

fuzz_target!(|data: &[u8]| {
    if let Ok(value) = MrDesc::decode(data) {
        let bytes = value.to_vec().expect("a decoded MrDesc re-encodes");
        assert_eq!(bytes, data, "MrDesc encoding is canonical");
        assert_eq!(MrDesc::decode(&bytes), Ok(value));
    }
});
