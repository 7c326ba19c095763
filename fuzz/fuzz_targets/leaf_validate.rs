//! Fuzzes leaf validation with arbitrary pool bytes.
//!
//! A leaf arrives from a one-sided READ that may be torn or corrupted, so
//! `Leaf::validate` must never panic, whatever the bytes. The first input
//! byte picks a mode: bit 0 reseals the leaf first (so the structural checks
//! behind the checksum are reached, not only the checksum). On a leaf that
//! validates, search agrees with a linear scan, and edits followed by a seal
//! keep it valid.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::layout::{Leaf, LeafError, SlotValue};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    // Probe keys come from the input's last 8 bytes (or 0).
    let key = rest
        .len()
        .checked_sub(8)
        .map(|at| u64::from_le_bytes(rest[at..].try_into().expect("8 bytes")))
        .unwrap_or(0);

    // The raw bytes first: a length that is not a leaf is an error, not a panic.
    match Leaf::from_bytes(rest) {
        Ok(leaf) => {
            let _ = leaf.validate();
        }
        Err(e) => assert_eq!(e, LeafError::BadLength { len: rest.len() }),
    }

    // Then the longest prefix that is a leaf.
    let Some(room) = rest.len().checked_sub(Leaf::HEADER_SIZE) else {
        return;
    };
    let len = Leaf::HEADER_SIZE + room / Leaf::SLOT_SIZE * Leaf::SLOT_SIZE;
    let mut bytes = rest[..len].to_vec();
    let leaf = Leaf::from_bytes_mut(&mut bytes).expect("a whole number of slots");
    if mode & 1 == 1 {
        leaf.seal();
    }
    let valid = match leaf.validate() {
        Ok(valid) => valid,
        Err(_) => return,
    };
    let linear = valid
        .entries()
        .iter()
        .find(|s| s.key() == key)
        .and_then(|s| s.value());
    assert_eq!(valid.get(key), linear, "binary search agrees with a scan");

    let _ = leaf.upsert(key, SlotValue::from_u64(key ^ 0x5a5a));
    leaf.seal();
    assert!(leaf.validate().is_ok(), "upsert keeps a valid leaf valid");
    let _ = leaf.remove(key);
    leaf.seal();
    assert!(leaf.validate().is_ok(), "remove keeps a valid leaf valid");
});
