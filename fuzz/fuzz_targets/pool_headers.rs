//! Fuzzes the decoders of the pool's fixed headers and model records with
//! arbitrary pool bytes.
//!
//! Compute nodes READ the superblock, the value region's header and model
//! records (with their segment tables) one-sidedly, and a memory node
//! resuming a pool file reads its agent area and superblock: a torn READ,
//! a record since reused, or a damaged file brings any bytes. None of the
//! decoders may panic; a model record they accept must name tables that
//! lie inside the length it claims, after the record, inside the model
//! region, so a reader slicing its tables out of `total_len` bytes stays
//! in bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_core::layout::{
    AgentArea, ModelRecord, ModelSegment, PoolParams, Superblock, ValueRegionHeader,
};

fuzz_target!(|data: &[u8]| {
    let _ = Superblock::read(data);
    let _ = AgentArea::read(data);
    let _ = ValueRegionHeader::read(data);
    let _ = ModelSegment::read(data);
    let Ok(record) = ModelRecord::read(data) else {
        return;
    };
    let Ok(sb) = Superblock::plan(&PoolParams {
        leaf_region_id: 3,
        leaf_slots: 16,
        keys_per_leaf: 12,
        epsilon: 8,
        leaf_capacity: 1000,
        directory_capacity: 64,
        cirq_capacity: 64,
        model_region_len: 1 << 16,
        value_capacity: 1 << 12,
    }) else {
        return;
    };
    // Where the record claims to be: its own tables say.
    let at = record.lt_offset().wrapping_sub(ModelRecord::SIZE);
    if record.check(at, &sb).is_err() {
        return;
    }
    let total = record.total_len().expect("a checked record has a length");
    let end = at + total;
    let region = sb.model_region_offset()..sb.model_region_offset() + sb.model_region_len();
    assert!(region.contains(&at) && end <= region.end, "record inside the model region");
    let inside = |offset: u64, len: u64| offset >= at + ModelRecord::SIZE && offset + len <= end;
    assert!(inside(record.lt_offset(), 8 * record.leaf_count()), "LT");
    assert!(inside(record.fences_offset(), 8 * record.leaf_count()), "fences");
    assert!(
        inside(
            record.segments_offset(),
            ModelSegment::SIZE * record.segment_count()
        ),
        "segments"
    );
});
