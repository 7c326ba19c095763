//! Fuzzes the topology blob's decoder with arbitrary pool bytes.
//!
//! A compute node READs the blob the superblock names, and a READ that met
//! the superblock's two words half-updated (or a blob since reused) brings
//! any bytes: `topology::decode` must never panic, and what it accepts
//! re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::layout::topology;

fuzz_target!(|data: &[u8]| {
    let Some((&cap, rest)) = data.split_first() else {
        return;
    };
    if let Ok(t) = topology::decode(rest, u64::from(cap)) {
        let entries: Vec<(u64, u64)> = t
            .first_keys
            .iter()
            .copied()
            .zip(t.ids.iter().copied())
            .collect();
        assert_eq!(topology::encode(t.epoch, &entries), rest, "re-encodes");
        assert!(t.ids.iter().all(|&id| id < u64::from(cap)));
    }
});
