//! Reading leaves and leaf chains from the agent's own memory.
//!
//! The agent reads with plain copies that race with compute nodes' one-sided
//! writes, so every leaf is validated (checksum and structure) and re-read
//! while torn. A chain is walked from its training leaf through the leaves'
//! `next` links (the authoritative chain; the SLT is only an index of it),
//! and the walk refuses anything longer than an SLT can hold.

use alloc::vec;
use alloc::vec::Vec;

use rolex_core::entry::{LeafAddr, LtEntry, SltHeader};
use rolex_core::layout::{Leaf, LeafRegion, ModelRecord};

use crate::error::{AgentError, Inconsistency, PoolError};
use crate::memory::PoolMemory;

/// Re-reads of a torn leaf before giving up (writers hold a chain for
/// microseconds; this bounds a read of a corrupted leaf).
pub const MAX_LEAF_RETRIES: u32 = 100_000;

/// How long, on a platform with a clock ([`PoolMemory::now_ns`]), a leaf
/// is re-read while torn before the read fails: a live writer writes a
/// torn leaf again whole within its round trips, while one its holder
/// left torn as it died stays so (the retraining fails, and its model is
/// backed off). At least [`MIN_TORN_READS`] re-reads are made first.
pub const TORN_LEAF_LIMIT_NS: u64 = 2_000_000_000;

/// Re-reads of a torn leaf made before [`TORN_LEAF_LIMIT_NS`] is looked at.
pub const MIN_TORN_READS: u32 = 16;

/// What the agent needs to know about one leaf.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeafInfo {
    /// Where it is.
    pub addr: LeafAddr,
    /// Its inclusive low fence.
    pub fence_lo: u64,
    /// Its inclusive high fence.
    pub fence_hi: u64,
    /// Keys it holds.
    pub count: u32,
    /// Its synonym link (0 = none).
    pub next: LtEntry,
    /// Its version.
    pub version: u64,
}

/// Reads the leaf at `addr` into `buf` (resized to a leaf) until it
/// validates.
pub fn read_leaf<M: PoolMemory>(
    mem: &M,
    region: &LeafRegion,
    addr: LeafAddr,
    buf: &mut Vec<u8>,
) -> Result<LeafInfo, PoolError> {
    let offset = region.leaf_offset(addr)?;
    buf.resize(region.leaf_size() as usize, 0);
    let mut attempt = 0u32;
    // The clock from the first torn read: a leaf that validates at once
    // (nearly every one; the frozen section reads dozens) costs no clock
    // read.
    let mut torn_since = None;
    let mut too_long = |attempt: u32| {
        let start = *torn_since.get_or_insert_with(|| mem.now_ns());
        start != 0
            && attempt >= MIN_TORN_READS
            && mem.now_ns().saturating_sub(start) >= TORN_LEAF_LIMIT_NS
    };
    loop {
        mem.read(offset, buf)?;
        let leaf = Leaf::from_bytes(buf).map_err(|error| PoolError::Leaf {
            leaf: addr.leaf(),
            error,
        })?;
        match leaf.validate() {
            Ok(v) => {
                return Ok(LeafInfo {
                    addr,
                    fence_lo: leaf.fence_lo(),
                    fence_hi: leaf.fence_hi(),
                    count: v.len() as u32,
                    next: leaf.next(),
                    version: leaf.version(),
                })
            }
            Err(error) if attempt >= MAX_LEAF_RETRIES || too_long(attempt) => {
                return Err(PoolError::Leaf {
                    leaf: addr.leaf(),
                    error,
                })
            }
            Err(_) => {
                attempt += 1;
                mem.relax(attempt);
            }
        }
    }
}

/// Walks every chain of the model whose record is `record`, in LT order:
/// all its leaves in key order.
pub fn walk_model<M: PoolMemory>(
    mem: &M,
    region: &LeafRegion,
    record: &ModelRecord,
    buf: &mut Vec<u8>,
) -> Result<Vec<LeafInfo>, AgentError> {
    let mut out = Vec::with_capacity(record.leaf_count() as usize);
    for j in 0..record.leaf_count() {
        let entry = LtEntry::from_raw(mem.load(record.lt_entry_offset(j)?)?);
        let mut addr = entry.addr();
        let mut hops = 0u64;
        loop {
            let info = read_leaf(mem, region, addr, buf)?;
            out.push(info);
            if info.next.pointer() == 0 {
                break;
            }
            hops += 1;
            if hops > SltHeader::CAPACITY {
                return Err(AgentError::Inconsistent {
                    model_id: record.model_id(),
                    what: Inconsistency::ChainTooLong,
                });
            }
            addr = info.next.addr();
        }
    }
    Ok(out)
}

/// Checks that `leaves` tile `[record.first_key(), record.key_hi()]` in
/// order (what a walk under freeze must find).
pub fn check_tiling(record: &ModelRecord, leaves: &[LeafInfo]) -> Result<(), AgentError> {
    let bad = |what| AgentError::Inconsistent {
        model_id: record.model_id(),
        what,
    };
    let (Some(first), Some(last)) = (leaves.first(), leaves.last()) else {
        return Err(bad(Inconsistency::RangeEnds));
    };
    if first.fence_lo != record.first_key() || last.fence_hi != record.key_hi() {
        return Err(bad(Inconsistency::RangeEnds));
    }
    for (i, w) in leaves.windows(2).enumerate() {
        if w[0].fence_hi.checked_add(1) != Some(w[1].fence_lo) {
            return Err(bad(Inconsistency::FenceGap {
                index: i as u64 + 1,
            }));
        }
    }
    Ok(())
}

/// A zeroed leaf-sized buffer.
pub fn leaf_buffer(region: &LeafRegion) -> Vec<u8> {
    vec![0u8; region.leaf_size() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::testing::small_pool;
    use rolex_core::layout::Superblock;

    #[test]
    fn a_leaf_torn_for_good_fails_its_read_after_the_time_limit() {
        let (mem, _) = small_pool(16);
        let mut sbb = [0u8; Superblock::SIZE as usize];
        mem.read(0, &mut sbb).unwrap();
        let region = Superblock::read(&sbb).unwrap().leaf_region().unwrap();
        let addr = region.claim(0).unwrap();
        let off = region.leaf_offset(addr).unwrap();
        let mut buf = Vec::new();
        read_leaf(&mem, &region, addr, &mut buf).expect("a whole leaf reads");
        // A byte of its slots flipped: the checksum no longer matches.
        let last = off + region.leaf_size() - 1;
        let mut b = [0u8; 1];
        mem.read(last, &mut b).unwrap();
        mem.write(last, &[b[0] ^ 0xff]).unwrap();
        // The clock moves 1 ms per re-read: the limit is reached after
        // about 2,000 of them, long before MAX_LEAF_RETRIES.
        mem.advance(1);
        mem.tick_on_relax(1_000_000);
        let err = read_leaf(&mem, &region, addr, &mut buf).expect_err("torn for good");
        assert!(matches!(err, PoolError::Leaf { leaf: 0, .. }), "{err:?}");
        let waited = mem.now_ns() - 1;
        assert!(
            (TORN_LEAF_LIMIT_NS..TORN_LEAF_LIMIT_NS + 2_000_000).contains(&waited),
            "{waited} ns of re-reads"
        );
    }
}
