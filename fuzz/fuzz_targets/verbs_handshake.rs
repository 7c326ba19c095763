//! Fuzzes `Handshake::decode` (the verbs domain's connection handshake,
//! received over UD) with arbitrary peer bytes.
//!
//! Any host on the fabric can send a datagram to a domain's UD queue
//! pair: decoding never panics; whatever decodes re-encodes to the same
//! bytes (the encoding is canonical). Built with `--features verbs`
//! (rolex-engine's verbs domain: rdma-core is built from source).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_engine::domain::verbs::handshake::Handshake;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Handshake::decode(data) {
        let bytes = h.encode().expect("a decoded handshake re-encodes");
        assert_eq!(&bytes[..], data, "the encoding is canonical");
    }
});
