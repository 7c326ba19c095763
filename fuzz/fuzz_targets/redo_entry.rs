//! Fuzzes the redo log's entry decoder with arbitrary slot bytes.
//!
//! The memory node reads redo slots a dead compute node wrote (maybe in
//! part, or not at all) when it mends a torn leaf, so `RedoEntry::decode`
//! must never panic and never hand back an image past the slot. The first
//! input byte picks a mode: bit 0 encodes the rest as an entry first and
//! cuts it at the second byte (a torn write over the input), so the
//! checks behind the magic are reached; a decoded entry encodes back to
//! the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::layout::{RedoEntry, RedoHeader};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut slot = rest.to_vec();
    if mode & 1 == 1 {
        if let Some((&cut, image)) = rest.split_first() {
            let mut whole = vec![0u8; RedoHeader::SIZE as usize + image.len()];
            let entry = RedoEntry {
                owner: rolex_core::entry::LockOwner(u16::from(cut)),
                nonce: u32::from(cut) << 8,
                seq: u64::from(mode),
                target: 8 * u64::from(cut),
                image,
            };
            let n = entry.encode(&mut whole).expect("sized for it");
            let cut = usize::from(cut).min(n).min(slot.len());
            slot[..cut].copy_from_slice(&whole[..cut]);
        }
    }
    let Ok(entry) = RedoEntry::decode(&slot) else {
        return;
    };
    let len = RedoHeader::SIZE as usize + entry.image.len();
    assert!(len <= slot.len(), "an image inside the slot");
    let mut again = vec![0u8; len];
    assert_eq!(entry.encode(&mut again), Ok(len));
    assert_eq!(again[..], slot[..len], "a decoded entry encodes to its bytes");
});
