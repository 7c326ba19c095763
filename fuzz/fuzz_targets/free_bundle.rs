//! Fuzzes the parsing of bundles of the value region's free stack with
//! arbitrary pool bytes.
//!
//! A bundle is read one-sidedly from a block another compute node gave
//! back, so it may be torn, corrupted or no bundle at all:
//! `FreeBundle::parse` must never panic, and whatever it accepts must list
//! only whole blocks of a size class inside the value region and write
//! back to the very same bytes. The input's first 8 bytes pick where in a
//! 1 MiB value region the bundle was read; the rest are its bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::layout::{FreeBundle, ValueRegion, ValueRegionHeader};

fuzz_target!(|data: &[u8]| {
    let Some((head, bytes)) = data.split_at_checked(8) else {
        return;
    };
    let region = ValueRegion::new(4096, ValueRegionHeader::SIZE + (1 << 20)).expect("a region");
    let at = region.area_offset(u64::from_le_bytes(head.try_into().expect("8 bytes")) % (1 << 20));
    if let Ok(bundle) = FreeBundle::parse(bytes, at, &region) {
        let end = region.area_offset(region.capacity());
        let entries: Vec<_> = bundle.entries().collect();
        for b in entries.iter().chain([bundle.own(at)].iter()) {
            assert!(b.offset >= region.area_offset(0) && b.offset + b.class <= end);
        }
        let mut again = vec![0u8; FreeBundle::len(entries.len()) as usize];
        let n = FreeBundle::write(&mut again, bundle.own(at), bundle.next(), &entries)
            .expect("an accepted bundle writes back");
        assert_eq!(&again[..n], &bytes[..n]);
    }
});
