//! Fuzzes both page-list decoders (`Pages` and the borrowed `PagesRef`)
//! with arbitrary peer bytes.
//!
//! Decoding never panics; both decoders agree; whatever decodes re-encodes
//! to the same bytes (the encoding is canonical) and decodes again to the
//! same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::wire::{Pages, PagesRef, Wire};

fuzz_target!(|data: &[u8]| {
    let owned = Pages::decode(data);
    let borrowed = PagesRef::decode(data);
    match (&owned, &borrowed) {
        (Ok(pages), Ok(view)) => {
            assert_eq!(&view.to_pages(), pages, "Pages and PagesRef agree");
            let bytes = pages.to_vec().expect("decoded Pages re-encode");
            assert_eq!(bytes, data, "Pages encoding is canonical");
            assert_eq!(Pages::decode(&bytes).as_ref(), Ok(pages));
            let mut again = vec![0u8; view.encoded_len()];
            let n = view.encode(&mut again).expect("PagesRef re-encodes");
            assert_eq!(&again[..n], data);
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "both decoders report the same error"),
        _ => panic!("Pages and PagesRef disagree: {owned:?} vs {borrowed:?}"),
    }
});
