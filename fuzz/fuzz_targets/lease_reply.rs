//! Fuzzes the lease client's reading of a reply with arbitrary server
//! bytes.
//!
//! A compute node takes its lease (and a key to the pool) from whatever
//! answers at its memory node's lease port: `wire::decode_reply` (the code
//! the client runs on its socket) must never panic; a grant it accepts
//! names a leased id and a duration in the accepted range, and re-encodes
//! to the same bytes (the format is canonical).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::wire::Wire;
use rolex_kv::lease::wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = wire::decode_reply(data) {
        assert!(g.owner.is_leased());
        let ms = u32::try_from(g.duration.as_millis()).expect("a granted duration fits");
        assert!(wire::DURATION_MS.contains(&ms));
        let desc = g
            .pool
            .map(|d| d.to_vec().expect("a decoded descriptor re-encodes"))
            .unwrap_or_default();
        assert_eq!(wire::granted(g.owner.0, ms, &desc), data, "re-encodes");
    }
});
