//! Fuzzes the decoders of the paged-by-message path (`PagedMsg`,
//! `PagedAcks`) with arbitrary peer bytes.
//!
//! Decoding never panics; whatever decodes re-encodes to the same bytes
//! (the encoding is canonical) and its pages' bytes add up to the message.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::wire::{
    encode_paged_acks, encode_paged_msg, set_ack_now, PageTarget, PagedAcks, PagedMsg, MAX_DATA,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = PagedMsg::decode(data) {
        let pages: Vec<(PageTarget, &[u8])> = m.pages().collect();
        assert_eq!(pages.len(), m.count());
        let total: usize = pages.iter().map(|(t, d)| {
            assert_eq!(d.len(), t.len as usize, "a page's bytes are its length");
            d.len()
        }).sum();
        assert!(total <= MAX_DATA);
        let targets: Vec<PageTarget> = pages.iter().map(|(t, _)| *t).collect();
        let segs: Vec<(u64, u8)> = m.segments().map(|(s, r)| (s, r.len() as u8)).collect();
        assert_eq!(segs.iter().map(|s| usize::from(s.1)).sum::<usize>(), m.count());
        let mut again = Vec::new();
        encode_paged_msg(&mut again, m.imm, &m.from, &segs, &targets, |i, dst| {
            dst.copy_from_slice(pages[i].1);
            true
        })
        .expect("a decoded message re-encodes");
        if m.ack_now {
            set_ack_now(&mut again);
        }
        assert_eq!(again, data, "PagedMsg encoding is canonical");
    }
    if let Ok(a) = PagedAcks::decode(data) {
        let acks: Vec<_> = a.acks().collect();
        let mut again = Vec::new();
        encode_paged_acks(&mut again, &a.from, &acks).expect("decoded acks re-encode");
        assert_eq!(again, data, "PagedAcks encoding is canonical");
    }
});
