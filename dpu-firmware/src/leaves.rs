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
            Err(error) if attempt >= MAX_LEAF_RETRIES => {
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
