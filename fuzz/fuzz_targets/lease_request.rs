//! Fuzzes the lease server's reading of a request with arbitrary client
//! bytes.
//!
//! Anyone who can reach a memory node's lease port sends these:
//! `wire::decode_request` (the code the server runs on its socket) must
//! never panic, and a request it accepts re-encodes to the same bytes
//! (the format is canonical).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_kv::lease::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(token) = wire::decode_request(data) {
        assert!(token.len() <= wire::MAX_TOKEN);
        assert_eq!(wire::request(&token), data, "re-encodes");
    }
});
