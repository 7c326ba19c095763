//! Fuzzes `VerbsAddr::decode` (the verbs domain's address) with
//! arbitrary peer bytes.
//!
//! Peers' addresses arrive in bootstrap offers and in every message that
//! names a NIC: decoding never panics; whatever decodes re-encodes to the
//! same bytes (the encoding is canonical). Built with `--features verbs`
//! (rolex-engine's verbs domain: rdma-core is built from source).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_engine::domain::verbs::addr::VerbsAddr;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = VerbsAddr::decode(data) {
        let bytes = a.encode().expect("a decoded address re-encodes");
        assert_eq!(&bytes[..], data, "the encoding is canonical");
        assert_eq!(
            VerbsAddr::from_net(&a.to_net().expect("fits a NetAddr")),
            Ok(a)
        );
    }
});
