//! Fuzzes a compute node's parsing of a model record and its tables
//! (`rolex_kv`'s `ModelView::parse`) with arbitrary pool bytes against a
//! fixed superblock, and what sessions then ask the view.
//!
//! A compute node READs a record and its tables one-sidedly: a READ that
//! raced a retraining, or met a record since retired and its space
//! reused, brings any bytes, and a torn or corrupted record must never
//! panic a client. Half the inputs are raw bytes (the record where its
//! own LT offset says); the other half a well-formed header built from
//! fuzzed parameters, followed by fuzzed tables, so the tables' contents
//! (unsorted fences, wild segments, SLT pointers) get exercised too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::layout::{ModelRecord, ModelRecordParams, PoolParams, Superblock};
use zerocopy::IntoBytes;

/// Takes the fuzz input's bytes from the front, zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(std::array::from_fn(|_| self.u8()))
    }
}

fuzz_target!(|data: &[u8]| {
    let sb = Superblock::plan(&PoolParams {
        leaf_region_id: 3,
        leaf_slots: 16,
        keys_per_leaf: 12,
        epsilon: 8,
        leaf_capacity: 1000,
        directory_capacity: 64,
        cirq_capacity: 64,
        model_region_len: 1 << 16,
        value_capacity: 1 << 12,
    })
    .expect("the fixed pool plans");
    let mut input = Input(data);
    let structured = input.u8() & 1 == 1;
    let keys = [input.u64(), input.u64()];
    if !structured {
        let bytes = input.0;
        let at = ModelRecord::read(bytes)
            .map(|r| r.lt_offset().wrapping_sub(ModelRecord::SIZE))
            .unwrap_or(sb.model_region_offset());
        let _ = rolex_kv::fuzzing::model_view(at, bytes, &sb, &keys);
        return;
    }
    let at = sb.model_region_offset() + 8 * u64::from(input.u8());
    let first_key = input.u64();
    let p = ModelRecordParams {
        model_id: u64::from(input.u8() % 64),
        first_key,
        key_hi: first_key.saturating_add(input.u64() >> input.u8().min(63)),
        label_stride: u64::from(input.u8()).max(1),
        segment_count: 1 + u64::from(input.u8() % 8),
        train_keys: input.u64(),
        leaf_count: 1 + u64::from(input.u8() % 16),
        epsilon: u64::from(input.u8()),
        generation: u16::from(input.u8()),
        predecessor: 0,
    };
    let Ok(record) = ModelRecord::new(at, &p) else {
        return;
    };
    let total = record.total_len().expect("a new record has a length") as usize;
    let mut bytes = record.as_bytes().to_vec();
    // The tables as the READ found them, cut short or zero-padded to what
    // the record claims.
    bytes.extend_from_slice(&input.0[..input.0.len().min(total - bytes.len())]);
    if input.0.len() % 2 == 0 {
        bytes.resize(total, 0);
    }
    let keys = [
        keys[0],
        keys[1],
        p.first_key,
        p.key_hi,
        p.first_key + (p.key_hi - p.first_key) / 2,
    ];
    // Garbage tables may be refused (a segment is checked as it is read);
    // what parses is the record that was built.
    if let Ok(leaves) = rolex_kv::fuzzing::model_view(at, &bytes, &sb, &keys) {
        assert_eq!(leaves, p.leaf_count);
        assert_eq!(bytes.len(), total, "parsed only with all its tables");
    }
});
