//! Fuzzes the bootstrap server's reading of a request with arbitrary
//! client bytes.
//!
//! Anyone who can reach a memory node's control port sends these:
//! `decode_request` (the code the server runs on its socket) must never
//! panic, and a request it accepts re-encodes to the same bytes (the
//! format is canonical).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_engine::domain::fabric::bootstrap::decode_request;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode_request(data) {
        assert_eq!(req.encode().expect("a decoded request re-encodes"), data);
    }
});
