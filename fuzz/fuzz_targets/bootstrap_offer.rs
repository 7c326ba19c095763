//! Fuzzes the bootstrap client's reading of a server's reply with
//! arbitrary bytes.
//!
//! A compute node fetches its pool's descriptors from whatever answers at
//! the address it was given: `decode_offer` (the code the client runs on
//! its socket) must never panic, with or without the description; an
//! offer it accepts with its description re-encodes to the same bytes
//! (the format is canonical), and reading the same bytes without the
//! description gives the same offer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_engine::domain::fabric::bootstrap::{decode_offer, encode_offer};

fuzz_target!(|data: &[u8]| {
    let plain = decode_offer(data, false);
    if let Ok((offer, meta)) = decode_offer(data, true) {
        let bytes = encode_offer(&offer, &meta).expect("a decoded offer re-encodes");
        assert_eq!(bytes, data, "the offer's encoding is canonical");
        assert_eq!(plain.map(|(o, _)| o), Ok(offer));
    }
});
