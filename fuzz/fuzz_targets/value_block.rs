//! Fuzzes value-block checking with arbitrary pool bytes.
//!
//! A value block arrives from a one-sided READ that may be torn, corrupted
//! or reused for another key, so `ValueBlock::check` must never panic and
//! must accept only what `ValueBlock::write` made for the same key, length
//! and generation. The input's first 16 bytes are the probe's key and its
//! block reference's length and generation; the rest are the block.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::layout::{block_class, BlockRef, ValueBlock, ValueBlockHeader};

fuzz_target!(|data: &[u8]| {
    let Some((head, bytes)) = data.split_at_checked(16) else {
        return;
    };
    let key = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let len = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) % 4096;
    let gen = u32::from_le_bytes(head[12..16].try_into().expect("4 bytes"));
    let at = BlockRef {
        offset: 0,
        len,
        gen,
    };
    if let Ok(value) = ValueBlock::check(bytes, key, at) {
        // Accepted: exactly the block a writer makes for that value.
        assert_eq!(value.len(), len as usize);
        let mut again = vec![0u8; (ValueBlockHeader::SIZE + u64::from(len)) as usize];
        let class = u64::from(u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes")));
        ValueBlock::write(&mut again, key, gen, class, value).expect("the same length");
        assert_eq!(&again[..], &bytes[..again.len()]);
    }
    // A block written for the probe is accepted; one byte changed is not.
    let value = &bytes[..bytes.len().min(len as usize)];
    if value.len() == len as usize {
        let class = block_class(value.len()).unwrap_or(0);
        let mut block = vec![0u8; (ValueBlockHeader::SIZE + u64::from(len)) as usize];
        ValueBlock::write(&mut block, key, gen, class, value).expect("the same length");
        assert_eq!(ValueBlock::check(&block, key, at), Ok(value));
        let flip = (key as usize) % block.len();
        block[flip] ^= 1;
        assert!(ValueBlock::check(&block, key, at).is_err());
    }
});
