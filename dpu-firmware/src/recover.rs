//! Restart recovery: an agent attaching to a pool that a previous agent
//! (or the memory-node process around it) left when it died — `SIGKILL`,
//! a crash, a power-cycled DPU — with only the pool's bytes to go on.
//!
//! [`Agent::resume`] runs these steps, each a function of its own, before
//! any compute node can reach the pool again (the caller registers and
//! offers the pool only afterwards):
//!
//! 1. [`validate`]: the superblock (magic, layout version, parts in
//!    bounds), the leaf region's header, every directory record (it
//!    checks, serves its own model, is not retired, and no two overlap)
//!    and every LT entry's leaf (in this pool's leaf region), before the
//!    steps below write anything.
//! 2. [`finish_retrainings`]: the retraining that was under way when the
//!    agent died, following the protocol's point of no return
//!    ([`crate::agent`], step 5):
//!    - a directory record left `FROZEN` died *before* its switch: it is
//!      thawed — its entries locked by [`LockOwner::AGENT`] unlocked,
//!      `FROZEN` cleared — exactly what the agent's own thaw does;
//!    - a live directory record with entries still locked by the agent is
//!      a new record whose switch happened: it is rolled forward — each
//!      such leaf's `next` link cleared (re-sealed), then its entry
//!      unlocked — exactly the agent's step 6 (a leaf that step's write
//!      left torn is re-sealed: the write changes header words only).
//!      The record it replaced is left as it is (retired, or frozen if the
//!      agent died between the switch and the retire): nothing leads to
//!      it any more.
//! 3. [`release_compute_locks`]: every other lock of a directory record
//!    (any compute node's: leased or anonymous) is released, at once,
//!    each chain's torn leaves first written again whole from the redo
//!    copies of its lock owner ([`crate::redo`]; in-process clients died
//!    with the node too), and then every redo block is freed (clients
//!    claim anew when they reconnect). The
//!    choice, and why no window for returning compute nodes is needed: an
//!    operation issued before the restart can never land after it — the
//!    old process's fabric endpoints and memory keys died with it, and a
//!    compute node must bootstrap again (new address, new keys, a new
//!    lease) to reach the restarted pool, so no holder of a lock from
//!    before can still write under it. Waiting would only keep chains
//!    locked; worse, lease ids restart with the lease server, so a new
//!    compute node could be handed the id an old lock carries. The data
//!    needs nothing more: every step of a compute node's write leaves its
//!    chain readable (see [`crate::reap`]).
//! 4. [`check_leaves`]: every chain of every directory record is walked
//!    (one read per leaf: no writer runs yet) and must validate and tile
//!    its model's key range; leaves that fail are reported
//!    ([`Recovery::damaged`]), not fixed.
//! 5. The model region's free space ([`free_space`]), which the dead agent
//!    kept in its memory only (see [`crate::record_space`]): every byte
//!    that is neither a directory record nor the upper levels, below the
//!    higher of the last published `next_free` and the end of the highest
//!    directory record, is taken for a record retired *now* — reusable
//!    only once the grace period has passed from the restart, since the
//!    pool cannot tell when each was retired. Above that point the space
//!    was never used, or freed past its grace period before the death.
//!
//! 6. The value region's free space ([`reclaim_values`]): no compute node
//!    holds anything across the restart (each must bootstrap again, with
//!    a new value space), so the space the dead clients held — the
//!    uncarved rest of their chunks, freed blocks they kept or were
//!    waiting out the grace on, bundles on the free stack — is all the
//!    block area below `alloc` that no leaf slot names. Step 4's walk
//!    marks every block a slot names (its offset, and the size class its
//!    length gives) in a [`ValueMap`], one bit per 16 bytes of what was
//!    handed out (1/128 of it in memory, whatever the number of values);
//!    every gap between them is cut into large blocks (classes up to
//!    1 MiB, no byte wasted) and the free stack is rebuilt of them: the
//!    old one discarded, the new bundles written as the gaps are cut
//!    (each linked to the one written before it, so a few thousand
//!    blocks are held at a time), the head set last. Skipped, the stack
//!    left as it is, when a leaf is damaged or a model's chains do not
//!    tile its range: what such a leaf names is not known.
//!
//! Every step is idempotent: a restart that dies during recovery is
//! recovered by the next one (step 6 empties the stack before it writes a
//! bundle, so a death in the middle leaves an empty stack, never one
//! naming half-written bundles).

use alloc::vec::Vec;

use rolex_core::entry::{LeafAddr, LockOwner, LtEntry, SltHeader};
use rolex_core::layout::free::{bundles, position_of};
use rolex_core::layout::topology;
use rolex_core::layout::{
    block_class, cut_class, FreeBlock, FreeBundle, FreeHead, Leaf, LeafError, LeafRegion,
    ModelRecord, ModelState, Slot, SlotValue, Superblock, ValueRegion, ValueRegionHeader,
    MIN_BLOCK,
};

use crate::agent::{Agent, AgentConfig};
use crate::error::{AgentError, Inconsistency, PoolError};
use crate::leaves::{check_tiling, leaf_buffer, LeafInfo};
use crate::memory::PoolMemory;
use crate::redo::Restored;

/// Leaves [`Recovery::damaged`] names at most (the count is kept whole).
pub const MAX_DAMAGED_NAMED: usize = 16;

/// A leaf that did not validate: found on resume, or in a chain whose
/// dead holder's locks were released ([`crate::reap`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DamagedLeaf {
    /// The model whose chain leads to it.
    pub model_id: u64,
    /// The leaf.
    pub leaf: LeafAddr,
    /// What was wrong (e.g. a checksum mismatch: a write torn by the
    /// death).
    pub error: LeafError,
    /// `Some` when it was then written again whole from the redo copy of
    /// its chain's lock owner ([`crate::redo`]) and validates now; `None`
    /// when it stays as it was found.
    pub restored: Option<Restored>,
}

/// What [`Agent::resume`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Models in the directory.
    pub models: u64,
    /// Models found frozen before their switch, and thawed.
    pub thawed: u64,
    /// LT entries those thaws unlocked.
    pub thaw_unlocked: u64,
    /// Models found past their switch with entries left locked by the
    /// agent, and rolled forward.
    pub rolled_forward: u64,
    /// LT entries (and their leaves' links) those roll forwards finished.
    pub entries_finished: u64,
    /// Compute nodes' chain locks released.
    pub compute_locks_released: u64,
    /// Torn leaves of those chains written again whole from their
    /// holders' redo copies before the release (step 3; they count among
    /// [`Recovery::leaves`], not among the damaged).
    pub restored_count: u64,
    /// The first [`MAX_DAMAGED_NAMED`] of them.
    pub restored: Vec<DamagedLeaf>,
    /// Redo blocks freed at the restart (every claimed one).
    pub redo_blocks_freed: u64,
    /// Leaves walked (every chain of every model).
    pub leaves: u64,
    /// Keys those leaves hold (the damaged ones' not counted).
    pub keys: u64,
    /// Leaves that failed validation (see [`Recovery::damaged`]).
    pub damaged_count: u64,
    /// The first [`MAX_DAMAGED_NAMED`] of them.
    pub damaged: Vec<DamagedLeaf>,
    /// Models whose valid chains do not tile their key range.
    pub untiled: Vec<u64>,
    /// The first model-region byte past every record, as resumed.
    pub next_free: u64,
    /// Model-region blocks `(offset, bytes)` taken for records retired at
    /// the restart (reusable after the grace period).
    pub retired: Vec<(u64, u64)>,
    /// Directory slots of a cut that had not committed, cleared.
    pub cut_dropped: u64,
    /// Leaves the leaf region's `alloc_num` was raised by, where the
    /// models held leaves at or past it (a damaged word: new leaves would
    /// have been claimed over live ones); 0 otherwise.
    pub leaves_raised: u64,
    /// Whether the topology was published again (a cut had committed and
    /// not been published, or the superblock's `upper_len` did not match
    /// the blob its `upper_offset` names).
    pub republished: bool,
    /// The value region's free space, rebuilt (step 6).
    pub values: ValueReclaim,
}

impl Recovery {
    /// Bytes of [`Recovery::retired`].
    pub fn retired_bytes(&self) -> u64 {
        self.retired.iter().map(|&(_, n)| n).sum()
    }
}

/// A directory record: its model, offset and header.
#[derive(Clone, Copy, Debug)]
pub struct LiveRecord {
    /// The model (its directory slot).
    pub model_id: u64,
    /// The record's pool offset.
    pub at: u64,
    /// Its header.
    pub record: ModelRecord,
}

/// The pool as [`validate`] found it.
#[derive(Clone, Debug)]
pub struct Validated {
    /// The superblock.
    pub sb: Superblock,
    /// The leaf region, narrowed to its header's capacity.
    pub region: LeafRegion,
    /// Every directory record, in model order.
    pub records: Vec<LiveRecord>,
    /// The topology the superblock names.
    pub published: topology::Topology,
    /// Its blob's pool offset and bytes.
    pub upper: (u64, u64),
    /// Slots of a cut that did not commit, cleared.
    pub cut_dropped: u64,
}

/// Step 1: checks the superblock, the leaf region's header and every
/// directory record (see the module docs).
pub fn validate<M: PoolMemory>(mem: &M) -> Result<Validated, AgentError> {
    let mut head = [0u8; Superblock::SIZE as usize];
    mem.read(0, &mut head)?;
    let sb = Superblock::read(&head)?;
    if sb.pool_size() > mem.size() {
        return Err(AgentError::BadConfig {
            field: "pool size (the superblock's is larger than the memory)",
            value: sb.pool_size(),
        });
    }
    // The redo log's geometry, before steps 2 and 3 write (step 3 reads
    // the log).
    sb.redo_region()?;
    let region = crate::agent::read_leaf_region(mem, &sb)?;
    let (upper_at, upper_len, published) = crate::agent::read_topology(mem, &sb)?;
    let mut records = Vec::with_capacity(sb.model_count() as usize);
    let mut rb = [0u8; ModelRecord::SIZE as usize];
    let mut unreadable = None;
    for m in 0..sb.model_count() {
        let at = mem.load(sb.directory_entry_offset(m)?)?;
        let listed = published.ids.contains(&m);
        let read = (|| {
            mem.read(at, &mut rb)?;
            let record = ModelRecord::read(&rb)?;
            record.check(at, &sb)?;
            Ok::<ModelRecord, AgentError>(record)
        })();
        let record = match read {
            Ok(r) if listed => r,
            Ok(r) if r.model_id() == m && !r.state().is_retired() => r,
            Err(e) if listed => return Err(e),
            // A slot the topology does not list whose record is not one:
            // a cut that failed before its point of no return left it
            // (its space since reused). Cleared with the slots after it.
            _ => {
                unreadable = Some(m);
                break;
            }
        };
        let bad = |what| AgentError::Inconsistent { model_id: m, what };
        if record.model_id() != m {
            return Err(bad(Inconsistency::WrongRecord));
        }
        if record.state().is_retired() {
            return Err(bad(Inconsistency::RetiredInDirectory));
        }
        records.push(LiveRecord {
            model_id: m,
            at,
            record,
        });
    }
    if let Some(first) = unreadable {
        for m in first..sb.model_count() {
            mem.store(sb.directory_entry_offset(m)?, 0)?;
        }
        mem.store(Superblock::MODEL_COUNT_OFFSET, first)?;
    }
    let cut_dropped = drop_uncommitted_cuts(mem, &sb, &published.ids, &mut records)?
        + unreadable.map_or(0, |first| sb.model_count() - first);
    let mut spans: Vec<(u64, u64, u64)> = Vec::with_capacity(records.len());
    for r in &records {
        spans.push((r.at, r.at + r.record.total_len()?, r.model_id));
    }
    spans.sort_unstable();
    for w in spans.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(AgentError::Inconsistent {
                model_id: w[1].2,
                what: Inconsistency::RecordsOverlap { other: w[0].2 },
            });
        }
    }
    // Every LT entry names a leaf of this pool's leaf region, checked
    // here, before steps 2 and 3 write: a damaged entry refuses the
    // resume with the pool as it was (step 4 would refuse it too, after
    // the lock release had written to that very word).
    for r in &records {
        for j in 0..r.record.leaf_count() {
            let e = LtEntry::from_raw(mem.load(r.record.lt_entry_offset(j)?)?);
            region.leaf_offset(e.addr())?;
        }
    }
    Ok(Validated {
        sb,
        region,
        records,
        published,
        upper: (upper_at, upper_len),
        cut_dropped,
    })
}

/// Step 1's part for a cut that did not commit: a retraining that cuts a
/// model writes the new models' slots (and the model count) before its
/// point of no return, the switch of the model's own slot (see
/// [`crate::agent`], `switch`). A record the published topology does not
/// list whose key range overlaps a frozen one it does list is such a
/// piece: its slot is cleared and the model count set back (the pieces
/// are always the last slots), and the frozen model is thawed by step 2.
/// A record the topology does not list that overlaps no frozen one is a
/// cut that committed but was not published yet: kept, and published by
/// [`Agent::resume`]. Returns how many slots were cleared.
fn drop_uncommitted_cuts<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    listed: &[u64],
    records: &mut Vec<LiveRecord>,
) -> Result<u64, AgentError> {
    let frozen: Vec<(u64, u64)> = records
        .iter()
        .filter(|r| listed.contains(&r.model_id) && r.record.state().is_frozen())
        .map(|r| (r.record.first_key(), r.record.key_hi()))
        .collect();
    let uncommitted = |r: &LiveRecord| {
        !listed.contains(&r.model_id)
            && frozen
                .iter()
                .any(|&(lo, hi)| r.record.first_key() <= hi && lo <= r.record.key_hi())
    };
    let Some(first) = records
        .iter()
        .filter(|r| uncommitted(r))
        .map(|r| r.model_id)
        .min()
    else {
        return Ok(0);
    };
    let cleared = records.len() as u64 - first;
    for m in first..records.len() as u64 {
        mem.store(sb.directory_entry_offset(m)?, 0)?;
    }
    records.truncate(first as usize);
    mem.store(Superblock::MODEL_COUNT_OFFSET, first)?;
    Ok(cleared)
}

/// The topology the directory records make: (first key, slot) in key
/// order, checked to tile the key space (each model's range starting
/// right after the one before it, from 0 to `u64::MAX`).
fn topology_of(records: &[LiveRecord]) -> Result<Vec<(u64, u64)>, AgentError> {
    let mut ranges: Vec<(u64, u64, u64)> = records
        .iter()
        .map(|r| (r.record.first_key(), r.record.key_hi(), r.model_id))
        .collect();
    ranges.sort_unstable();
    let mut expect = Some(0u64);
    for &(lo, hi, m) in &ranges {
        if expect != Some(lo) {
            return Err(AgentError::Inconsistent {
                model_id: m,
                what: Inconsistency::RangeEnds,
            });
        }
        expect = hi.checked_add(1);
    }
    if expect.is_some() {
        let m = ranges.last().map_or(0, |r| r.2);
        return Err(AgentError::Inconsistent {
            model_id: m,
            what: Inconsistency::RangeEnds,
        });
    }
    Ok(ranges.into_iter().map(|(lo, _, m)| (lo, m)).collect())
}

/// What [`finish_retrainings`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    /// Models thawed.
    pub thawed: u64,
    /// Entries the thaws unlocked.
    pub thaw_unlocked: u64,
    /// Models rolled forward.
    pub rolled_forward: u64,
    /// Entries the roll forwards finished.
    pub entries_finished: u64,
}

/// Step 2: thaws a directory record frozen before its switch, or rolls
/// forward one whose switch happened (see the module docs). `records`
/// is [`validate`]'s list; the thawed ones' headers are updated in it.
pub fn finish_retrainings<M: PoolMemory>(
    mem: &M,
    region: &LeafRegion,
    records: &mut [LiveRecord],
) -> Result<Finished, AgentError> {
    let mut done = Finished::default();
    let mut buf = leaf_buffer(region);
    for live in records.iter_mut() {
        let r = &live.record;
        let state = r.state();
        let mut touched = 0u64;
        // The leaves of the record this one was built from, read once if
        // a leaf of this one is left to finish: those its retraining
        // merged into a kept leaf are found there.
        let mut old: Option<Vec<LeafInfo>> = None;
        for j in 0..r.leaf_count() {
            let off = r.lt_entry_offset(j)?;
            let v = LtEntry::from_raw(mem.load(off)?);
            if !(v.is_locked() && v.owner() == LockOwner::AGENT) {
                continue;
            }
            if !state.is_frozen() {
                let hi = match r.fence_offset(j + 1) {
                    Ok(at) => mem.load(at)?.wrapping_sub(1),
                    Err(_) => r.key_hi(),
                };
                if old.is_none() {
                    old = Some(predecessor_leaves(mem, region, r, &mut buf)?);
                }
                let old = old.as_deref().unwrap_or(&[]);
                finish_leaf(mem, region, v.addr(), hi, old, &mut buf)?;
            }
            mem.store(off, v.without_lock().raw())?;
            touched += 1;
        }
        if state.is_frozen() {
            let thawed = ModelState::live(state.generation())?;
            mem.store(live.at + ModelRecord::STATE_OFFSET, thawed.raw())?;
            live.record.set_state(thawed);
            done.thawed += 1;
            done.thaw_unlocked += touched;
        } else if touched > 0 {
            done.rolled_forward += 1;
            done.entries_finished += touched;
        }
    }
    Ok(done)
}

/// The leaves of the record `r` was built from (its predecessor), in key
/// order, by its chains (empty for a bulk-loaded record, or if that record
/// is not readable as one: nothing was merged then, or nothing can be
/// found).
fn predecessor_leaves<M: PoolMemory>(
    mem: &M,
    region: &LeafRegion,
    r: &ModelRecord,
    buf: &mut [u8],
) -> Result<Vec<LeafInfo>, AgentError> {
    let at = r.predecessor();
    if at == 0 {
        return Ok(Vec::new());
    }
    let mut rb = [0u8; ModelRecord::SIZE as usize];
    mem.read(at, &mut rb)?;
    let Ok(p) = ModelRecord::read(&rb) else {
        return Ok(Vec::new());
    };
    if p.first_key() > r.key_hi() || r.first_key() > p.key_hi() {
        return Ok(Vec::new());
    }
    // Walked by hand, one read per leaf: a leaf torn by the death (only
    // the agent's step 6 writes them now) still has sound fences and link.
    let mut out = Vec::with_capacity(p.leaf_count() as usize);
    for j in 0..p.leaf_count() {
        let mut addr = LtEntry::from_raw(mem.load(p.lt_entry_offset(j)?)?).addr();
        for _ in 0..=SltHeader::CAPACITY {
            mem.read(region.leaf_offset(addr)?, buf)?;
            let Ok(leaf) = Leaf::from_bytes(buf) else {
                break;
            };
            if leaf.check_structure().is_err() {
                break;
            }
            out.push(LeafInfo {
                addr,
                fence_lo: leaf.fence_lo(),
                fence_hi: leaf.fence_hi(),
                count: leaf.count(),
                next: leaf.next(),
                version: leaf.version(),
            });
            if leaf.next().pointer() == 0 {
                break;
            }
            addr = leaf.next().addr();
        }
    }
    out.sort_unstable_by_key(|l| l.fence_lo);
    out.dedup_by_key(|l| l.fence_lo);
    Ok(out)
}

/// The agent's step 6 for the training leaf at `addr`, whose range in
/// its new record ends at `hi`: the leaves of the old record (`old`, in
/// key order) that cover the rest of its range up to `hi` — those the
/// retraining merged into it: emptied or underfull — give it their keys
/// and range, its `next` link is cleared and it is re-sealed, in one
/// write; then those leaves are marked freed (their numbers are not
/// reused: the free list died with the agent). Nothing is written to a
/// leaf already finished. A leaf that write left torn is re-sealed.
fn finish_leaf<M: PoolMemory>(
    mem: &M,
    region: &LeafRegion,
    addr: LeafAddr,
    hi: u64,
    old: &[LeafInfo],
    buf: &mut [u8],
) -> Result<(), PoolError> {
    let off = region.leaf_offset(addr)?;
    mem.read(off, buf)?;
    let mut other = alloc::vec![0u8; buf.len()];
    let leaf_err = |leaf: LeafAddr| {
        move |error| PoolError::Leaf {
            leaf: leaf.leaf(),
            error,
        }
    };
    let leaf = Leaf::from_bytes_mut(buf).map_err(leaf_err(addr))?;
    if leaf.validate().is_err() {
        // Torn by the death in the middle of this very step's write.
        // The write sets fences, slots and link at once, so a torn leaf
        // whose structure holds is either version; re-sealed, the walk
        // below finishes what is missing.
        leaf.check_structure().map_err(leaf_err(addr))?;
    } else if leaf.next().raw() == 0 && leaf.fence_hi() == hi {
        return Ok(());
    }
    let mut all: Vec<Slot> = leaf.used_entries().to_vec();
    let mut merged: Vec<LeafAddr> = Vec::new();
    while leaf.fence_hi() < hi {
        let lo = leaf.fence_hi() + 1;
        let Ok(i) = old.binary_search_by_key(&lo, |l| l.fence_lo) else {
            break;
        };
        let at = old[i].addr;
        mem.read(region.leaf_offset(at)?, &mut other)?;
        let m = Leaf::from_bytes(&other).map_err(leaf_err(at))?;
        let v = m.validate().map_err(leaf_err(at))?;
        if m.is_freed() || m.fence_lo() != lo || m.fence_hi() > hi {
            break;
        }
        all.extend_from_slice(v.entries());
        let _ = leaf.extend_fence_hi(m.fence_hi());
        merged.push(at);
    }
    leaf.set_entries(&all).map_err(|e| PoolError::Leaf {
        leaf: addr.leaf(),
        error: match e {
            rolex_core::layout::EditError::Invalid(e) => e,
            _ => LeafError::CountExceedsCapacity {
                count: all.len() as u32,
                capacity: 0,
            },
        },
    })?;
    leaf.clear_next();
    leaf.seal();
    mem.write(off, buf)?;
    for at in merged {
        mem.read(region.leaf_offset(at)?, &mut other)?;
        let m = Leaf::from_bytes_mut(&mut other).map_err(leaf_err(at))?;
        m.mark_freed();
        m.seal();
        mem.write(region.leaf_offset(at)?, &other)?;
    }
    Ok(())
}

/// What [`release_compute_locks`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Compute nodes' chain locks released.
    pub locks: u64,
    /// Torn leaves of those chains written again whole from their
    /// holders' redo copies.
    pub restored_count: u64,
    /// The first [`MAX_DAMAGED_NAMED`] of them.
    pub restored: Vec<DamagedLeaf>,
    /// Redo blocks freed (every claimed one).
    pub redo_blocks_freed: u64,
}

/// Step 3: releases every compute node's lock (leased or anonymous) in
/// the directory records. Before it releases a chain it mends its torn
/// leaves from the redo log, keyed by the chain's lock owner (see
/// [`crate::redo`]: in-process clients died with the node too, so
/// [`LockOwner::ANONYMOUS`]'s chains are mended as well); leaves left
/// torn are step 4's to report. Then it frees every redo block: no client
/// survives the restart, each claims a block anew when it reconnects. The
/// agent's own locks are [`finish_retrainings`]' business (run it first).
pub fn release_compute_locks<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    region: &LeafRegion,
    records: &[LiveRecord],
) -> Result<Released, AgentError> {
    let redo = sb.redo_region()?;
    let mut mender = crate::redo::Mender::new(*region, redo, |o| o != LockOwner::AGENT);
    let mut out = Released::default();
    for live in records {
        for j in 0..live.record.leaf_count() {
            let off = live.record.lt_entry_offset(j)?;
            let v = LtEntry::from_raw(mem.load(off)?);
            if v.is_locked() && v.owner() != LockOwner::AGENT {
                mender.mend_chain(mem, live.model_id, v, |d| {
                    if d.restored.is_some() {
                        out.restored_count += 1;
                        if out.restored.len() < MAX_DAMAGED_NAMED {
                            out.restored.push(d);
                        }
                    }
                })?;
                mem.store(off, v.without_lock().raw())?;
                out.locks += 1;
            }
        }
    }
    if let Some(redo) = &redo {
        out.redo_blocks_freed = crate::redo::free_all_blocks(mem, redo)?;
    }
    Ok(out)
}

/// What [`check_leaves`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeafCheck {
    /// Leaves walked.
    pub leaves: u64,
    /// Keys the valid ones hold.
    pub keys: u64,
    /// Leaves that failed validation.
    pub damaged_count: u64,
    /// The first [`MAX_DAMAGED_NAMED`] of them.
    pub damaged: Vec<DamagedLeaf>,
    /// Models whose chains (all valid) do not tile their key range.
    pub untiled: Vec<u64>,
    /// The highest leaf index walked (`None`: no leaf).
    pub highest: Option<u64>,
}

/// Which bytes of the value region's handed-out block area the leaves'
/// slots name (step 4 marks them, step 6 gives back the rest): one bit
/// per 16-byte granule (blocks start at 16-byte boundaries and their size
/// classes are multiples of 16), so a map of `n` bytes of block area
/// takes `n / 128` bytes of memory, however many values there are.
#[derive(Clone, Debug, Default)]
pub struct ValueMap {
    /// Pool offset of the block area's first byte.
    start: u64,
    /// Pool offset past the last byte handed out.
    end: u64,
    /// Pool offset past the furthest range marked, unclamped (past `end`
    /// where a slot names a block beyond `alloc`).
    reach: u64,
    /// Bit `i`: granule `[start + 16 i, start + 16 i + 16)` is named.
    bits: Vec<u64>,
}

/// The granule of a [`ValueMap`].
const GRANULE: u64 = 16;

impl ValueMap {
    /// A map of the pool offsets `[start, end)`, nothing marked.
    pub fn new(start: u64, end: u64) -> Self {
        let granules = end.saturating_sub(start).div_ceil(GRANULE);
        ValueMap {
            start,
            end: end.max(start),
            reach: start,
            bits: alloc::vec![0; granules.div_ceil(64) as usize],
        }
    }

    /// Pool offset past the furthest range marked, where that lies past
    /// the map's end: a slot names a block beyond what `alloc` says was
    /// handed out.
    pub fn named_past_end(&self) -> Option<u64> {
        (self.reach > self.end).then_some(self.reach)
    }

    /// Marks pool offsets `[s, e)` named (clamped to the map; every
    /// granule the range touches).
    pub fn mark(&mut self, s: u64, e: u64) {
        self.reach = self.reach.max(e);
        let (s, e) = (s.clamp(self.start, self.end), e.clamp(self.start, self.end));
        if s >= e {
            return;
        }
        let (from, to) = (
            (s - self.start) / GRANULE,
            (e - self.start).div_ceil(GRANULE),
        );
        for g in from..to {
            self.bits[(g / 64) as usize] |= 1 << (g % 64);
        }
    }

    fn marked(&self, g: u64) -> bool {
        self.bits[(g / 64) as usize] & (1 << (g % 64)) != 0
    }

    /// Bytes marked (whole granules, within the map).
    pub fn marked_bytes(&self) -> u64 {
        let granules: u64 = self.bits.iter().map(|w| u64::from(w.count_ones())).sum();
        (granules * GRANULE).min(self.end - self.start)
    }

    /// Each maximal run of unmarked bytes, `(from, to)` pool offsets, in
    /// order (the last one ends at the map's end).
    pub fn gaps(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        let n = (self.end - self.start).div_ceil(GRANULE);
        let mut g = 0;
        core::iter::from_fn(move || {
            while g < n && self.marked(g) {
                // A whole word named: skip it.
                if g % 64 == 0 && self.bits[(g / 64) as usize] == u64::MAX {
                    g += 64;
                } else {
                    g += 1;
                }
            }
            if g >= n {
                return None;
            }
            let from = g;
            while g < n && !self.marked(g) {
                if g % 64 == 0 && self.bits[(g / 64) as usize] == 0 {
                    g += 64;
                } else {
                    g += 1;
                }
            }
            let to = g.min(n);
            Some((
                self.start + from * GRANULE,
                (self.start + to * GRANULE).min(self.end),
            ))
        })
    }
}

/// Step 4: walks every chain of every directory record with one read per
/// leaf (no writer runs during recovery, so a leaf that does not validate
/// is damaged, not being written); a chain stops at a damaged leaf.
/// The blocks its slots name are marked in `values`.
pub fn check_leaves<M: PoolMemory>(
    mem: &M,
    region: &LeafRegion,
    records: &[LiveRecord],
    values: &mut ValueMap,
) -> Result<LeafCheck, AgentError> {
    let mut out = LeafCheck::default();
    let mut buf = leaf_buffer(region);
    for live in records {
        let r = &live.record;
        let mut walked: Vec<LeafInfo> = Vec::with_capacity(r.leaf_count() as usize);
        let mut whole = true;
        for j in 0..r.leaf_count() {
            let mut addr = LtEntry::from_raw(mem.load(r.lt_entry_offset(j)?)?).addr();
            let mut hops = 0u64;
            loop {
                mem.read(region.leaf_offset(addr)?, &mut buf)?;
                let leaf = Leaf::from_bytes(&buf).map_err(|error| AgentError::Leaf {
                    leaf: addr.leaf(),
                    error,
                })?;
                out.leaves += 1;
                out.highest = out.highest.max(Some(addr.leaf()));
                let valid = match leaf.validate() {
                    Ok(v) => v,
                    Err(error) => {
                        out.damaged_count += 1;
                        if out.damaged.len() < MAX_DAMAGED_NAMED {
                            out.damaged.push(DamagedLeaf {
                                model_id: live.model_id,
                                leaf: addr,
                                error,
                                restored: None,
                            });
                        }
                        whole = false;
                        break;
                    }
                };
                out.keys += valid.len() as u64;
                for slot in valid.entries() {
                    if let Some(SlotValue::Block(b)) = slot.value() {
                        let class = block_class(b.len as usize).unwrap_or(MIN_BLOCK);
                        values.mark(b.offset, b.offset.saturating_add(class));
                    }
                }
                walked.push(LeafInfo {
                    addr,
                    fence_lo: leaf.fence_lo(),
                    fence_hi: leaf.fence_hi(),
                    count: valid.len() as u32,
                    next: leaf.next(),
                    version: leaf.version(),
                });
                let next = leaf.next();
                if next.pointer() == 0 {
                    break;
                }
                hops += 1;
                if hops > SltHeader::CAPACITY {
                    return Err(AgentError::Inconsistent {
                        model_id: live.model_id,
                        what: Inconsistency::ChainTooLong,
                    });
                }
                addr = next.addr();
            }
        }
        if whole && check_tiling(r, &walked).is_err() {
            out.untiled.push(live.model_id);
        }
    }
    Ok(out)
}

/// Step 5: the model region's bump pointer and the blocks to retire now
/// (see the module docs): `upper` is the published topology blob
/// (offset, bytes), `published_next_free` the last `next_free`
/// the dead agent published (clamped into the region; the region's start
/// if it never published one).
pub fn free_space(
    sb: &Superblock,
    records: &[LiveRecord],
    upper: (u64, u64),
    published_next_free: u64,
) -> Result<(u64, Vec<(u64, u64)>), AgentError> {
    let start = sb.model_region_offset();
    let end = start + sb.model_region_len();
    let mut used: Vec<(u64, u64)> = Vec::with_capacity(records.len() + 1);
    for r in records {
        used.push((r.at, r.at + r.record.total_len()?));
    }
    if upper.1 > 0 {
        used.push((upper.0, upper.0 + upper.1));
    }
    used.sort_unstable();
    let highest = used.iter().map(|&(_, e)| e).max().unwrap_or(start);
    let bump = published_next_free.clamp(start, end).max(highest);
    let mut gaps = Vec::new();
    let mut at = start;
    for &(s, e) in &used {
        if s > at {
            gaps.push((at, s - at));
        }
        at = at.max(e);
    }
    if bump > at {
        gaps.push((at, bump - at));
    }
    Ok((bump, gaps))
}

/// What [`reclaim_values`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ValueReclaim {
    /// Whether the free stack was rebuilt (`false`: a leaf was damaged or
    /// a model untiled, and the stack was left as it was).
    pub rebuilt: bool,
    /// Bytes of the block area handed out before the restart (`alloc`,
    /// at most the capacity).
    pub handed_out: u64,
    /// Bytes of it the leaves' slots name (kept).
    pub referenced: u64,
    /// Bytes put on the free stack: every other byte of it, but for gaps
    /// of less than [`MIN_BLOCK`] (none where every block is a whole size
    /// class, as clients and the bulk load cut them).
    pub bytes: u64,
    /// Blocks put on the free stack.
    pub blocks: u64,
    /// Bundles they make.
    pub bundles: u64,
    /// Bytes `alloc` was raised by before the rebuild, where the leaves'
    /// slots named blocks past it (a damaged word: compute nodes would
    /// have carved new blocks over those values); 0 otherwise.
    pub raised: u64,
}

/// The largest block step 6 cuts a gap into.
pub const RECLAIM_BLOCK_MAX: u64 = 1 << 20;
/// The most bytes one bundle of step 6 holds (its own block and those it
/// lists): a compute node pops a bundle whole, so this bounds what one
/// pop hands one client.
pub const RECLAIM_BUNDLE_MAX: u64 = FreeBundle::HELD_MAX;

/// Blocks step 6 holds before it writes them as bundles.
const RECLAIM_CHUNK: usize = 4096;

impl ValueMap {
    /// A map of `sb`'s value region as handed out (`alloc`, at most the
    /// capacity), nothing marked.
    pub fn of_pool<M: PoolMemory>(mem: &M, sb: &Superblock) -> Result<Self, AgentError> {
        let region = sb.value_region()?;
        let mut hb = [0u8; ValueRegionHeader::SIZE as usize];
        mem.read(region.offset(), &mut hb)?;
        let handed_out = ValueRegionHeader::read(&hb)?.alloc().min(region.capacity());
        Ok(ValueMap::new(
            region.area_offset(0),
            region.area_offset(handed_out),
        ))
    }
}

/// Step 4's sequel for the leaf region: where a leaf the models hold —
/// walked in their chains (`walked`: the highest index), or stashed in
/// their SLT slots for compute nodes' splits — lies at or past
/// `alloc_num` (a damaged word: compute nodes and the agent claim leaves
/// from `alloc_num` on, and would split into live leaves), raises it past
/// them (at most to the capacity). Returns by how many leaves.
fn raise_alloc_num<M: PoolMemory>(
    mem: &M,
    region: &LeafRegion,
    records: &[LiveRecord],
    walked: Option<u64>,
) -> Result<u64, AgentError> {
    let mut highest = walked;
    let mut slt = alloc::vec![0u8; 8 * SltHeader::SLOTS];
    for live in records {
        mem.read(live.record.slt_offset(), &mut slt)?;
        for w in slt.chunks_exact(8).skip(1) {
            let raw = u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
            if raw != 0 {
                highest = highest.max(Some(LtEntry::from_raw(raw).addr().leaf()));
            }
        }
    }
    let Some(highest) = highest else {
        return Ok(0);
    };
    let want = highest.saturating_add(1).min(region.capacity());
    let alloc_num = mem.load(region.alloc_num_offset())?;
    if want <= alloc_num {
        return Ok(0);
    }
    mem.store(region.alloc_num_offset(), want)?;
    Ok(want - alloc_num)
}

/// Step 4's sequel: where `named` (step 4's walk) reaches past the value
/// region's `alloc`, raises `alloc` past every block named (at most to the
/// capacity) — else compute nodes, which carve new blocks from `alloc`
/// on, would write over live values. Returns by how many bytes (0: no
/// slot names a block past it).
fn raise_alloc<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    named: &ValueMap,
) -> Result<u64, AgentError> {
    let Some(reach) = named.named_past_end() else {
        return Ok(0);
    };
    let region = sb.value_region()?;
    let want = reach
        .saturating_sub(region.area_offset(0))
        .min(region.capacity());
    let alloc = mem.load(region.alloc_offset())?;
    if want <= alloc {
        return Ok(0);
    }
    mem.store(region.alloc_offset(), want)?;
    Ok(want - alloc)
}

/// Step 6: rebuilds the value region's free stack of every byte of the
/// block area handed out (the map's extent, [`ValueMap::of_pool`]) that
/// no block `named` marks (step 4's walk; see the module docs). `seed`
/// varies the generations the blocks are given (the resume's clock): the
/// generation a block of the stack names is a mix of the seed and its
/// offset, so a pointer from before the restart (none should be
/// followed: every compute node bootstraps again) would match the
/// generation of a block carved there with probability about 2^-32.
pub fn reclaim_values<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    named: &ValueMap,
    seed: u64,
) -> Result<ValueReclaim, AgentError> {
    reclaim_values_in_chunks(mem, sb, named, seed, RECLAIM_CHUNK)
}

/// [`reclaim_values`], writing bundles each time `chunk` blocks are cut.
fn reclaim_values_in_chunks<M: PoolMemory>(
    mem: &M,
    sb: &Superblock,
    named: &ValueMap,
    seed: u64,
    chunk: usize,
) -> Result<ValueReclaim, AgentError> {
    let region = sb.value_region()?;
    let start = region.area_offset(0);
    if named.start != start {
        return Err(AgentError::BadConfig {
            field: "value map (not of this pool's value region)",
            value: named.start,
        });
    }
    let mut out = ValueReclaim {
        rebuilt: true,
        handed_out: named.end - named.start,
        referenced: named.marked_bytes(),
        ..ValueReclaim::default()
    };
    // Emptied first: a death below leaves an empty stack, not one naming
    // a bundle half written over (the next resume rebuilds it).
    let head = FreeHead::from_word(mem.load(region.free_offset())?).then(0);
    mem.store(region.free_offset(), head.word())?;
    // Each bundle written names the one written before it (`top`): the
    // stack is built bottom up, and the head names the last one.
    let mut top = 0;
    let mut pending: Vec<FreeBlock> = Vec::with_capacity(chunk.min(RECLAIM_CHUNK));
    let mut buf = Vec::new();
    for (from, to) in named.gaps() {
        // Blocks start at 16-byte boundaries of the area (free positions).
        let mut at = start + (from - start).div_ceil(16) * 16;
        let to = start + (to - start) / 16 * 16;
        while let Some(class) = cut_class(to.saturating_sub(at), RECLAIM_BLOCK_MAX) {
            pending.push(FreeBlock {
                offset: at,
                class,
                gen: generation(seed, at),
            });
            out.bytes += class;
            out.blocks += 1;
            at += class;
            if pending.len() >= chunk {
                let blocks = core::mem::take(&mut pending);
                top = write_bundles(mem, &region, blocks, top, &mut buf, &mut out)?;
            }
        }
    }
    if !pending.is_empty() {
        top = write_bundles(mem, &region, pending, top, &mut buf, &mut out)?;
    }
    if top != 0 {
        mem.store(region.free_offset(), head.then(top).word())?;
    }
    Ok(out)
}

/// Writes `blocks` as bundles, the first linked to the bundle at position
/// `top` (0: none) and each next one to the one before it; returns the
/// position of the last.
fn write_bundles<M: PoolMemory>(
    mem: &M,
    region: &ValueRegion,
    blocks: Vec<FreeBlock>,
    mut top: u64,
    buf: &mut Vec<u8>,
    out: &mut ValueReclaim,
) -> Result<u64, AgentError> {
    for (own, listed) in bundles(blocks, RECLAIM_BUNDLE_MAX) {
        let at = position_of(region, own.offset).ok_or(AgentError::BadConfig {
            field: "value region (a block cut from it has no free position)",
            value: region.capacity(),
        })?;
        buf.resize(FreeBundle::len(listed.len()) as usize, 0);
        FreeBundle::write(buf, own, top, &listed).ok_or(AgentError::BadConfig {
            field: "value region (a free bundle does not fit its block)",
            value: own.class,
        })?;
        mem.write(own.offset, buf)?;
        out.bundles += 1;
        top = at;
    }
    Ok(top)
}

/// The generation step 6 gives the block at `offset` (see
/// [`reclaim_values`]): a 64-bit mix (splitmix64's finalizer) of the seed
/// and the offset.
fn generation(seed: u64, offset: u64) -> u32 {
    let mut z = seed ^ offset.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

impl<M: PoolMemory> Agent<M> {
    /// Attaches to a pool a previous agent left when it died, after
    /// recovering it (steps 1–6 of the module docs); `published_next_free`
    /// is the last `next_free` that agent published (e.g. in its agent
    /// area, `rolex_core::layout::AgentArea`; the model region's start if
    /// none). The caller must not let compute nodes reach the pool before
    /// this returns.
    pub fn resume(
        mem: M,
        cfg: AgentConfig,
        published_next_free: u64,
    ) -> Result<(Self, Recovery), AgentError> {
        let Validated {
            sb,
            region,
            mut records,
            published,
            upper,
            cut_dropped,
        } = validate(&mem)?;
        let finished = finish_retrainings(&mem, &region, &mut records)?;
        let entries = topology_of(&records)?;
        let released = release_compute_locks(&mem, &sb, &region, &records)?;
        let mut named = ValueMap::of_pool(&mem, &sb)?;
        let mut leaves = check_leaves(&mem, &region, &records, &mut named)?;
        let leaves_raised = raise_alloc_num(&mem, &region, &records, leaves.highest)?;
        let raised = raise_alloc(&mem, &sb, &named)?;
        if raised > 0 {
            // The walk again, over the extent handed out now.
            named = ValueMap::of_pool(&mem, &sb)?;
            leaves = check_leaves(&mem, &region, &records, &mut named)?;
        }
        let values = if leaves.damaged_count == 0 && leaves.untiled.is_empty() {
            let seed = mem.now_ns() ^ sb.pool_size().rotate_left(32);
            reclaim_values(&mem, &sb, &named, seed)?
        } else {
            ValueReclaim::default()
        };
        let values = ValueReclaim { raised, ..values };
        let (bump, retired) = free_space(&sb, &records, upper, published_next_free)?;
        let mut agent = Agent::attach(mem, cfg, bump)?;
        for &(at, size) in &retired {
            agent.retire_space(at, size);
        }
        let listed: Vec<(u64, u64)> = published
            .first_keys
            .iter()
            .copied()
            .zip(published.ids.iter().copied())
            .collect();
        // A cut committed and not published when the agent died; or a
        // length word that is not the blob's (the agent read the blob by
        // its own count, compute nodes read `upper_len` bytes: every one
        // of them would fail to decode it, forever).
        let republished = entries != listed || sb.upper_len() != upper.1;
        if republished {
            agent.republish_topology(entries)?;
        }
        let report = Recovery {
            models: records.len() as u64,
            thawed: finished.thawed,
            thaw_unlocked: finished.thaw_unlocked,
            rolled_forward: finished.rolled_forward,
            entries_finished: finished.entries_finished,
            compute_locks_released: released.locks,
            restored_count: released.restored_count,
            restored: released.restored,
            redo_blocks_freed: released.redo_blocks_freed,
            leaves: leaves.leaves,
            keys: leaves.keys,
            damaged_count: leaves.damaged_count,
            damaged: leaves.damaged,
            untiled: leaves.untiled,
            next_free: bump,
            retired,
            cut_dropped,
            republished,
            leaves_raised,
            values,
        };
        Ok((agent, report))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bulk::{BulkConfig, BulkPlan};
    use crate::leaves::{read_leaf, walk_model};
    use crate::memory::testing::VecPool;
    use alloc::vec;

    fn load(n: u64) -> (VecPool, u64) {
        crate::memory::testing::small_pool(n)
    }

    /// A cut whose switch fails at its point of no return (the model's own
    /// directory word) leaves nothing of it: the model count and the new
    /// slots are put back, the model thawed, and a resume finds the pool
    /// whole.
    #[test]
    fn a_cut_that_fails_at_its_switch_leaves_no_slot_behind() {
        let (mem, next_free) = load(64);
        let cfg = AgentConfig {
            max_model_leaves: 1,
            ..AgentConfig::default()
        };
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        let sb = *agent.superblock();
        let models = sb.model_count();
        let dir0 = sb.directory_entry_offset(0).unwrap();
        mem.fail_writes(dir0..dir0 + 8, 1);
        assert!(agent.retrain(0).is_err(), "the switch failed");
        assert_eq!(mem.load(Superblock::MODEL_COUNT_OFFSET).unwrap(), models);
        for m in models..models + 4 {
            let at = sb.directory_entry_offset(m).unwrap();
            assert_eq!(mem.load(at).unwrap(), 0, "slot {m}");
        }
        assert!(!record(&mem, mem.load(dir0).unwrap()).state().is_frozen());
        // The agent goes on: the same cut succeeds.
        let r = agent.retrain(0).unwrap();
        assert!(r.new_models > 0, "{r:?}");
        drop(agent);
        let (_, rec) = Agent::resume(&mem, cfg, next_free).unwrap();
        assert_eq!((rec.keys, rec.cut_dropped, rec.damaged_count), (64, 0, 0));
    }

    /// A retraining that both merges leaves (one key each in leaves of 4
    /// slots) and cuts its model (an agent allowing one leaf per model,
    /// bulk-loaded with four), killed after each of its mutations in turn:
    /// every resume finds every key, once, in models that tile the key
    /// space, with no lock left, and retraining goes on.
    #[test]
    fn a_cut_and_merging_retraining_killed_at_every_step_is_resumed_whole() {
        let keys = 16u64;
        let bulk = BulkConfig {
            leaf_region_id: 2,
            leaf_slots: 4,
            keys_per_leaf: 1,
            epsilon: 1,
            max_model_leaves: 8,
            spare_leaves: 64,
            model_region_spare: 1 << 16,
            directory_spare: 64,
            value_capacity: 1 << 16,
            redo_blocks: 4,
            redo_slots: 4,
        };
        let pairs: Vec<(u64, u64)> = (0..keys).map(|i| (i * 10, i)).collect();
        let ks: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        let plan = BulkPlan::new(&bulk, &ks).unwrap();
        let cfg = AgentConfig {
            max_model_leaves: 1,
            ..AgentConfig::default()
        };
        let mut completed_at = None;
        // Resumes that thawed, rolled forward, dropped an uncommitted cut,
        // published a committed one.
        let mut seen = [0u64; 4];
        for crash in 0..400u64 {
            let mem = VecPool::new(plan.pool_size());
            plan.write(&mem, &pairs).unwrap();
            {
                let mut agent = Agent::attach(&mem, cfg, plan.next_free()).unwrap();
                mem.crash_after(crash);
                if agent.retrain(0).is_ok() {
                    completed_at = Some(crash);
                }
            }
            mem.revive();
            let (mut agent, rec) = Agent::resume(&mem, cfg, plan.next_free())
                .unwrap_or_else(|e| panic!("resume after {crash} mutations: {e}"));
            assert_eq!(
                (rec.keys, rec.damaged_count, rec.untiled.len()),
                (keys, 0, 0),
                "after {crash} mutations: {rec:?}"
            );
            seen[0] += rec.thawed;
            seen[1] += rec.rolled_forward;
            seen[2] += u64::from(rec.cut_dropped > 0);
            seen[3] += u64::from(rec.republished);
            let sb = *agent.superblock();
            for m in 0..sb.model_count() {
                let at = mem.load(sb.directory_entry_offset(m).unwrap()).unwrap();
                assert!(
                    entries(&mem, at).iter().all(|e| !e.is_locked()),
                    "after {crash} mutations: model {m} keeps a lock"
                );
            }
            for m in 0..sb.model_count() {
                agent
                    .retrain(m)
                    .unwrap_or_else(|e| panic!("after {crash} mutations, model {m}: {e}"));
            }
            if completed_at.is_some() {
                eprintln!(
                    "killed after each of the first {crash} mutations of the retraining: \
                     every resume whole; thawed {}, rolled forward {}, uncommitted cuts \
                     dropped {}, cuts published {}",
                    seen[0], seen[1], seen[2], seen[3]
                );
                assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
                return;
            }
        }
        panic!("the retraining never completed");
    }

    /// Every block on the value region's free stack, walked from its head
    /// (bundles' own blocks and those they list), and the bundles.
    fn stack(mem: &VecPool, sb: &Superblock) -> (Vec<FreeBlock>, u64) {
        use rolex_core::layout::free::block_at;
        let region = sb.value_region().unwrap();
        let mut pos = FreeHead::from_word(mem.load(region.free_offset()).unwrap()).position;
        let (mut out, mut n) = (Vec::new(), 0);
        let end = region.area_offset(region.capacity());
        while pos != 0 {
            let at = block_at(&region, pos).unwrap();
            let mut buf = vec![0u8; FreeBundle::MAX_BYTES.min(end - at) as usize];
            mem.read(at, &mut buf).unwrap();
            let b = FreeBundle::parse(&buf, at, &region).unwrap();
            out.push(b.own(at));
            out.extend(b.entries());
            pos = b.next();
            n += 1;
            assert!(n < 1 << 20, "the stack loops");
        }
        (out, n)
    }

    /// A pool whose clients died holding space (see the test below), the
    /// plan's `next_free`, the `(start, end)` of every block a slot
    /// names, `alloc`, and the leaf model 0's first entry names.
    fn value_pool() -> (VecPool, u64, Vec<(u64, u64)>, u64, LeafAddr) {
        use rolex_core::layout::{BlockRef, ValueBlock};
        let keys = 48u64;
        let bulk = BulkConfig {
            leaf_region_id: 2,
            leaf_slots: 8,
            keys_per_leaf: 4,
            epsilon: 1,
            max_model_leaves: 4,
            spare_leaves: 64,
            model_region_spare: 1 << 16,
            directory_spare: 64,
            value_capacity: 12 << 20,
            redo_blocks: 4,
            redo_slots: 4,
        };
        let pairs: Vec<(u64, u64)> = (0..keys).map(|i| (i * 10, i)).collect();
        let ks: Vec<u64> = pairs.iter().map(|p| p.0).collect();
        let plan = BulkPlan::new(&bulk, &ks).unwrap();
        let mem = VecPool::new(plan.pool_size());
        let len_of = |key: u64| 20 + (key / 10 % 7) as usize * 150;
        plan.write_values(&mem, &pairs, &mut |key, _, out| {
            out.resize(len_of(key), key as u8)
        })
        .unwrap();
        let sb = superblock(&mem);
        let values = sb.value_region().unwrap();
        let loaded = mem.load(values.offset()).unwrap();
        // Dead clients claimed 10 MB past the load (more than one bundle
        // holds); one of them wrote a block there that a slot names.
        let alloc = loaded + 10_000_000;
        mem.store(values.alloc_offset(), alloc).unwrap();
        let fresh = BlockRef {
            offset: values.area_offset(loaded + 4096),
            len: 5000,
            gen: 3,
        };
        let class = block_class(5000).unwrap();
        let mut block = vec![0u8; fresh.read_len() as usize];
        ValueBlock::write(&mut block, 0, 3, class, &[9; 5000]).unwrap();
        mem.write(fresh.offset, &block).unwrap();
        // An old stack (its head naming some block of the area).
        mem.store(
            values.free_offset(),
            FreeHead {
                tag: 5,
                position: 77,
            }
            .word(),
        )
        .unwrap();
        // In model 0's first leaf: its first key deleted, its second
        // overwritten into `fresh`.
        let region = sb.leaf_region().unwrap();
        let r0 = record(
            &mem,
            mem.load(sb.directory_entry_offset(0).unwrap()).unwrap(),
        );
        let addr = LtEntry::from_raw(mem.load(r0.lt_entry_offset(0).unwrap()).unwrap()).addr();
        let mut buf = leaf_buffer(&region);
        read_leaf(&mem, &region, addr, &mut buf).unwrap();
        let leaf = Leaf::from_bytes_mut(&mut buf).unwrap();
        let slots = leaf.validate().unwrap().entries().to_vec();
        let gone = leaf.remove(slots[0].key()).unwrap();
        let replaced = leaf
            .upsert(slots[1].key(), SlotValue::Block(fresh))
            .unwrap()
            .unwrap();
        leaf.seal();
        mem.write(region.leaf_offset(addr).unwrap(), &buf).unwrap();

        // What the slots name, computed from the writes above.
        let mut named: Vec<(u64, u64)> = Vec::new();
        let mut off = values.area_offset(0);
        for &(key, _) in &pairs {
            let c = block_class(len_of(key)).unwrap();
            if key != slots[0].key() && key != slots[1].key() {
                named.push((off, off + c));
            }
            off += c;
        }
        named.push((fresh.offset, fresh.offset + class));
        let unnamed = |b: &BlockRef| !named.iter().any(|&(s, _)| s == b.offset);
        assert!(unnamed(&gone.block().unwrap()) && unnamed(&replaced.block().unwrap()));
        (mem, plan.next_free(), named, alloc, addr)
    }

    fn superblock(mem: &VecPool) -> Superblock {
        let mut h = [0u8; Superblock::SIZE as usize];
        mem.read(0, &mut h).unwrap();
        Superblock::read(&h).unwrap()
    }

    /// The free stack of `mem` lists exactly the bytes below `alloc` that
    /// `named` does not: no named block listed, nothing listed twice,
    /// every block inside what was handed out. Returns (blocks, bundles).
    fn assert_stack_is_the_unnamed_space(
        mem: &VecPool,
        named: &[(u64, u64)],
        alloc: u64,
    ) -> (u64, u64) {
        let sb = superblock(mem);
        let values = sb.value_region().unwrap();
        let (listed, bundles) = stack(mem, &sb);
        let (lo, hi) = (values.area_offset(0), values.area_offset(alloc));
        let mut spans: Vec<(u64, u64, bool)> = listed
            .iter()
            .map(|b| (b.offset, b.offset + b.class, true))
            .chain(named.iter().map(|&(s, e)| (s, e, false)))
            .collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            assert!(w[0].1 <= w[1].0, "overlap: {:?} {:?}", w[0], w[1]);
        }
        assert!(listed
            .iter()
            .all(|b| b.offset >= lo && b.offset + b.class <= hi && b.class <= RECLAIM_BLOCK_MAX));
        // Exactly the handed-out bytes, tiled.
        assert_eq!((spans[0].0, spans.last().unwrap().1), (lo, hi));
        assert!(spans.windows(2).all(|w| w[0].1 == w[1].0), "a gap left out");
        (listed.len() as u64, bundles)
    }

    /// A pool whose clients died holding space: the bulk-loaded values,
    /// one slot deleted and one overwritten into a block claimed later,
    /// `alloc` moved on by chunks nobody gave back, an old free stack.
    /// The resume puts exactly the bytes no slot names on a new stack:
    /// no named block listed, nothing listed twice, every block inside
    /// what was handed out; a second resume rebuilds the same.
    #[test]
    fn a_resume_rebuilds_the_value_free_stack_of_exactly_the_unnamed_space() {
        let (mem, next_free, named, alloc, addr) = value_pool();
        let sb = superblock(&mem);
        let values = sb.value_region().unwrap();
        let region = sb.leaf_region().unwrap();
        let named_bytes: u64 = named.iter().map(|&(s, e)| e - s).sum();
        let (_, rec) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
        eprintln!("found: {:?}", rec.values);
        let v = rec.values;
        assert!(v.rebuilt);
        assert_eq!((v.handed_out, v.referenced), (alloc, named_bytes));
        assert_eq!(
            v.bytes,
            alloc - named_bytes,
            "every unnamed byte given back"
        );
        assert_eq!(
            assert_stack_is_the_unnamed_space(&mem, &named, alloc),
            (v.blocks, v.bundles)
        );
        let head = FreeHead::from_word(mem.load(values.free_offset()).unwrap());
        assert_eq!(head.tag, 7, "emptied, then set");

        // Again: the same space, a new stack.
        let (_, again) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
        assert_eq!(
            (
                again.values.bytes,
                again.values.blocks,
                again.values.referenced
            ),
            (v.bytes, v.blocks, v.referenced)
        );

        // A damaged leaf: what it names is unknown, the stack is left.
        let before = mem.load(values.free_offset()).unwrap();
        let off = region.leaf_offset(addr).unwrap() + region.leaf_size() - 8;
        mem.store(off, mem.load(off).unwrap() ^ 1).unwrap();
        let (_, damaged) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
        assert_eq!(damaged.damaged_count, 1);
        assert!(!damaged.values.rebuilt);
        assert_eq!(mem.load(values.free_offset()).unwrap(), before);
    }

    /// Regression: a value region whose `alloc` word was damaged (lower
    /// than the blocks the leaves name) resumed as if only that much had
    /// been handed out — blocks past it neither kept nor given back — and
    /// compute nodes then carved new blocks over live values (found with
    /// `rolex memnode --resume` on a pool file whose `alloc` was halved:
    /// a `rolex bench` ycsb-a run's gets spun through a million retries
    /// on blocks another key's value had overwritten). The resume raises
    /// `alloc` past every named block and rebuilds the stack from there.
    #[test]
    fn an_alloc_word_below_the_named_blocks_is_raised_past_them() {
        let (mem, next_free, named, _, _) = value_pool();
        let sb = superblock(&mem);
        let values = sb.value_region().unwrap();
        let reach = named.iter().map(|&(_, e)| e).max().unwrap();
        let needed = reach - values.area_offset(0);
        for damaged in [0, needed / 2, needed - 16] {
            mem.store(values.alloc_offset(), damaged).unwrap();
            let (_, rec) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
            let alloc = mem.load(values.alloc_offset()).unwrap();
            assert_eq!(
                alloc, needed,
                "alloc {damaged}: raised to the last named block's end"
            );
            assert_eq!(rec.values.raised, needed - damaged);
            assert!(rec.values.rebuilt);
            // Nothing named is on the stack; every other byte below is.
            assert_stack_is_the_unnamed_space(&mem, &named, alloc);
        }
        // Above the blocks named: left as it is.
        mem.store(values.alloc_offset(), needed + 4096).unwrap();
        let (_, rec) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
        assert_eq!(rec.values.raised, 0);
        assert_eq!(mem.load(values.alloc_offset()).unwrap(), needed + 4096);
    }

    /// Regression: a leaf region whose `alloc_num` was damaged (below
    /// leaves the models hold) resumed as it was, and the next split
    /// claimed a live leaf and wrote over it (found with `rolex memnode
    /// --resume` on a pool file with `alloc_num` 0: an insert-only `rolex
    /// bench` failed with "a locked chain does not cover its key"). The
    /// resume raises it past every leaf walked or stashed.
    #[test]
    fn an_alloc_num_below_the_leaves_held_is_raised_past_them() {
        let (mem, next_free) = load(64);
        let sb = superblock(&mem);
        let region = sb.leaf_region().unwrap();
        let loaded = mem.load(region.alloc_num_offset()).unwrap();
        let (_, clean) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
        assert_eq!(clean.leaves_raised, 0);
        for damaged in [0, loaded / 2, loaded - 1] {
            mem.store(region.alloc_num_offset(), damaged).unwrap();
            let (mut agent, rec) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
            assert_eq!(rec.leaves_raised, loaded - damaged, "alloc_num {damaged}");
            assert_eq!(mem.load(region.alloc_num_offset()).unwrap(), loaded);
            // A compute node's claim gets a leaf no model holds.
            let claimed = mem.faa(region.alloc_num_offset(), 1).unwrap();
            assert!(claimed >= loaded, "claimed live leaf {claimed}");
            mem.store(region.alloc_num_offset(), loaded).unwrap();
            // Retraining (which claims leaves) keeps every key.
            agent.retrain(0).unwrap();
            drop(agent);
            let (_, after) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
            assert_eq!((after.keys, after.damaged_count), (64, 0));
        }
    }

    /// Step 6 writing its bundles every few blocks (3 here, 4096 in a
    /// resume), each linked to the one written before: the stack is the
    /// same space, whole, however it was cut into chunks.
    #[test]
    fn value_bundles_written_chunk_by_chunk_make_one_whole_stack() {
        let (mem, _, named, alloc, _) = value_pool();
        let sb = superblock(&mem);
        let mut map = ValueMap::of_pool(&mem, &sb).unwrap();
        for &(s, e) in &named {
            map.mark(s, e);
        }
        for chunk in [1, 3, 64] {
            let v = reclaim_values_in_chunks(&mem, &sb, &map, 9, chunk).unwrap();
            assert_eq!(
                assert_stack_is_the_unnamed_space(&mem, &named, alloc),
                (v.blocks, v.bundles),
                "chunks of {chunk}"
            );
            assert!(v.bundles > 1, "chunks of {chunk}: {v:?}");
        }
    }

    /// A [`ValueMap`] against a byte-by-byte reference: what is marked,
    /// the gaps between, and the bytes named, for random ranges (some
    /// overlapping, some outside the map, some unaligned).
    #[test]
    fn a_value_map_marks_and_lists_gaps_as_a_byte_map_does() {
        let mut x = 0x1234_5678_9abc_def1u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for round in 0..200 {
            let start = 4096 + 16 * rnd(8);
            let len = 16 * rnd(300);
            let end = start + len;
            let mut map = ValueMap::new(start, end);
            let mut bytes = alloc::vec![false; len as usize];
            for _ in 0..rnd(12) {
                let s = start - 64 + rnd(len + 128);
                let e = s + rnd(400);
                map.mark(s, e);
                // The reference marks whole granules the range touches.
                let (cs, ce) = (s.clamp(start, end), e.clamp(start, end));
                if cs < ce {
                    let g0 = (cs - start) / 16 * 16;
                    let g1 = ((ce - start).div_ceil(16) * 16).min(len);
                    bytes[g0 as usize..g1 as usize]
                        .iter_mut()
                        .for_each(|b| *b = true);
                }
            }
            let mut gaps = Vec::new();
            let mut i = 0usize;
            while i < bytes.len() {
                if bytes[i] {
                    i += 1;
                    continue;
                }
                let from = i;
                while i < bytes.len() && !bytes[i] {
                    i += 1;
                }
                gaps.push((start + from as u64, start + i as u64));
            }
            assert_eq!(map.gaps().collect::<Vec<_>>(), gaps, "round {round}");
            let named = bytes.iter().filter(|&&b| b).count() as u64;
            assert_eq!(map.marked_bytes(), named, "round {round}");
        }
    }

    /// A resume killed after each of its mutations in turn (step 6's
    /// emptying of the stack, each bundle written, the head set): the
    /// next resume rebuilds the same stack; a pop in between finds an
    /// empty stack or a whole one, never a bundle half written.
    #[test]
    fn a_resume_killed_while_it_rebuilds_the_value_stack_is_resumed_whole() {
        let mut rebuilt_at = None;
        for crash in 0..200u64 {
            let (mem, next_free, named, alloc, _) = value_pool();
            mem.crash_after(crash);
            let died = Agent::resume(&mem, AgentConfig::default(), next_free).is_err();
            mem.revive();
            let sb = superblock(&mem);
            let head = mem.load(sb.value_region().unwrap().free_offset()).unwrap();
            if died && FreeHead::from_word(head).tag != 5 {
                // Step 6 began: what a compute node would find meanwhile
                // is nothing but whole bundles (the walk parses each).
                // (Before it, the planted old stack, which is no stack.)
                let _ = stack(&mem, &sb);
            }
            let (_, rec) = Agent::resume(&mem, AgentConfig::default(), next_free)
                .unwrap_or_else(|e| panic!("resume after a death at {crash} mutations: {e}"));
            assert!(rec.values.rebuilt);
            assert_eq!(
                assert_stack_is_the_unnamed_space(&mem, &named, alloc),
                (rec.values.blocks, rec.values.bundles),
                "after a death at {crash} mutations"
            );
            if !died {
                rebuilt_at = Some(crash);
                break;
            }
        }
        let n = rebuilt_at.expect("a resume completed");
        eprintln!("a resume killed after each of its first {n} mutations: every next one whole");
        assert!(n > 4, "step 6 writes several bundles");
    }

    fn record(mem: &VecPool, at: u64) -> ModelRecord {
        let mut rb = [0u8; ModelRecord::SIZE as usize];
        mem.read(at, &mut rb).unwrap();
        ModelRecord::read(&rb).unwrap()
    }

    fn entries(mem: &VecPool, at: u64) -> Vec<LtEntry> {
        let r = record(mem, at);
        (0..r.leaf_count())
            .map(|j| LtEntry::from_raw(mem.load(r.lt_entry_offset(j).unwrap()).unwrap()))
            .collect()
    }

    /// Splits training leaf `j` of the record at `at` into two (the upper
    /// half a new synonym leaf), as a compute node does, without the SLT.
    fn split(mem: &VecPool, sb: &Superblock, at: u64, j: u64) {
        let r = record(mem, at);
        let region = sb.leaf_region().unwrap();
        let e = LtEntry::from_raw(mem.load(r.lt_entry_offset(j).unwrap()).unwrap());
        let b_addr = region
            .claim(mem.faa(region.alloc_num_offset(), 1).unwrap())
            .unwrap();
        let mut a = leaf_buffer(&region);
        let x = read_leaf(mem, &region, e.addr(), &mut a).unwrap();
        let leaf = Leaf::from_bytes(&a).unwrap();
        let slots = leaf.validate().unwrap().entries().to_vec();
        let mid = slots.len() / 2;
        let mut b = leaf_buffer(&region);
        let bl = Leaf::from_bytes_mut(&mut b).unwrap();
        bl.init(slots[mid].key(), x.fence_hi).unwrap();
        bl.set_entries(&slots[mid..]).unwrap();
        bl.set_next(x.next).unwrap();
        bl.seal();
        let al = Leaf::from_bytes_mut(&mut a).unwrap();
        al.init(x.fence_lo, slots[mid].key() - 1).unwrap();
        al.set_entries(&slots[..mid]).unwrap();
        al.set_next(LtEntry::for_leaf(b_addr).with_pointer(1))
            .unwrap();
        al.seal();
        mem.write(region.leaf_offset(b_addr).unwrap(), &b).unwrap();
        mem.write(region.leaf_offset(e.addr()).unwrap(), &a)
            .unwrap();
    }

    #[test]
    fn a_freeze_cut_short_by_the_death_is_thawed_and_compute_locks_released() {
        let (mem, next_free) = load(40);
        let agent = Agent::attach(&mem, AgentConfig::default(), next_free).unwrap();
        let at = agent.records()[1];
        let sb = *agent.superblock();
        drop(agent);
        // The agent died freezing model 1: FROZEN set, its first entries
        // locked by the agent; a compute node (lease 7) held the next one
        // and an anonymous holder model 0's first.
        let r = record(&mem, at);
        let state = r.state();
        mem.store(at + ModelRecord::STATE_OFFSET, state.frozen().raw())
            .unwrap();
        let before = entries(&mem, at);
        for j in 0..2 {
            let off = r.lt_entry_offset(j).unwrap();
            mem.store(off, before[j as usize].locked_by(LockOwner::AGENT).raw())
                .unwrap();
        }
        let off = r.lt_entry_offset(2).unwrap();
        mem.store(off, before[2].locked_by(LockOwner(7)).raw())
            .unwrap();
        let m0 = agent_records(&mem, &sb)[0];
        let r0 = record(&mem, m0);
        let e0 = entries(&mem, m0)[0];
        mem.store(r0.lt_entry_offset(0).unwrap(), e0.with_lock().raw())
            .unwrap();
        eprintln!("injected: model 1 frozen with 2 entries agent-locked, one held by lease 7, one anonymous lock in model 0");

        let (mut agent, rec) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
        eprintln!("found: {rec:?}");
        assert_eq!(
            (rec.thawed, rec.thaw_unlocked, rec.rolled_forward),
            (1, 2, 0)
        );
        assert_eq!(rec.compute_locks_released, 2);
        assert_eq!((rec.damaged_count, rec.untiled.len()), (0, 0));
        assert_eq!(rec.keys, 40);
        assert_eq!(
            entries(&mem, at),
            before,
            "every entry as before the freeze"
        );
        assert_eq!(record(&mem, at).state(), state, "FROZEN cleared");
        assert!(!entries(&mem, m0)[0].is_locked());
        // Nothing was retired before the death: no block waits.
        assert!(rec.retired.is_empty(), "{:?}", rec.retired);
        // The model retrains again.
        agent.retrain(1).unwrap();
        // Idempotent: a second recovery finds nothing to do.
        drop(agent);
        let (_, again) = Agent::resume(&mem, AgentConfig::default(), 0).unwrap();
        assert_eq!(
            (
                again.thawed,
                again.rolled_forward,
                again.compute_locks_released
            ),
            (0, 0, 0)
        );
    }

    fn agent_records(mem: &VecPool, sb: &Superblock) -> Vec<u64> {
        (0..sb.model_count())
            .map(|m| mem.load(sb.directory_entry_offset(m).unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn a_retraining_past_its_switch_is_rolled_forward_and_old_records_wait_their_grace() {
        let (mem, next_free) = load(40);
        let cfg = AgentConfig::default();
        let mut agent = Agent::attach(&mem, cfg, next_free).unwrap();
        let sb = *agent.superblock();
        let old = agent.records()[0];
        split(&mem, &sb, old, 1);
        // Step 6's leaf writes fail: the agent is left past its switch
        // with entries of the new record locked, then dies.
        let leaves = sb.leaf_region_offset()..sb.leaf_region_offset() + sb.leaf_region_len();
        mem.fail_writes(leaves, 1);
        let err = agent.retrain(0).unwrap_err();
        let AgentError::RollForward { new_record, .. } = err else {
            panic!("{err}")
        };
        let published = agent.next_free();
        drop(agent);
        let locked = entries(&mem, new_record)
            .iter()
            .filter(|e| e.is_locked())
            .count() as u64;
        eprintln!(
            "injected: death after the switch, {locked} entries of the new record agent-locked"
        );
        assert!(locked > 0);

        // And the death tore step 6's write of the first locked leaf
        // (its checksum word no longer matches).
        let region = sb.leaf_region().unwrap();
        let torn = entries(&mem, new_record)
            .into_iter()
            .find(|e| e.is_locked())
            .unwrap();
        let off = region.leaf_offset(torn.addr()).unwrap();
        mem.store(off, mem.load(off).unwrap() ^ 1).unwrap();

        let (mut agent, rec) = Agent::resume(&mem, cfg, published).unwrap();
        eprintln!("found: {rec:?}");
        assert_eq!((rec.rolled_forward, rec.entries_finished), (1, locked));
        assert_eq!(rec.damaged_count, 0, "the torn leaf re-sealed");
        assert_eq!(rec.thawed, 0);
        let nr = record(&mem, new_record);
        assert!(entries(&mem, new_record).iter().all(|e| !e.is_locked()));
        let mut buf = leaf_buffer(&region);
        let walked = walk_model(&mem, &region, &nr, &mut buf).unwrap();
        check_tiling(&nr, &walked).unwrap();
        assert!(walked.iter().all(|l| l.next.raw() == 0));
        // The old record's bytes are retired now, not reusable yet.
        let old_len = record(&mem, old).total_len().unwrap();
        assert!(
            rec.retired
                .iter()
                .any(|&(a, n)| a <= old && old + old_len <= a + n),
            "{:?} lacks {old}",
            rec.retired
        );
        assert_eq!(agent.stats().model_region_free, rec.retired_bytes());
        // Retrainings go on, past the bump pointer until the grace passed.
        let r = agent.retrain(1).unwrap();
        assert!(r.new_record >= rec.next_free, "{r:?}");
        mem.advance(u64::try_from(cfg.record_grace.as_nanos()).unwrap() + 1);
        let r = agent.retrain(2).unwrap();
        assert!(
            r.new_record < rec.next_free,
            "reused after the grace: {r:?}"
        );
    }

    /// Regression: the agent reads the topology blob by its own count, a
    /// compute node by the superblock's `upper_len`; a pool whose
    /// `upper_len` was damaged resumed and served, and every compute node
    /// then failed to connect ("the topology blob does not decode").
    #[test]
    fn a_length_word_that_is_not_the_blobs_is_published_again() {
        for more in [None, Some(8), Some(16)] {
            let (mem, next_free) = load(40);
            let (at, len) = (
                mem.load(Superblock::UPPER_OFFSET_OFFSET).unwrap(),
                mem.load(Superblock::UPPER_LEN_OFFSET).unwrap(),
            );
            let bad = more.map_or(0, |m| len + m);
            mem.store(Superblock::UPPER_LEN_OFFSET, bad).unwrap();
            let (_, rec) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
            assert!(rec.republished, "upper_len {bad}");
            // What a compute node reads: both words, then that many bytes.
            let (at2, len2) = (
                mem.load(Superblock::UPPER_OFFSET_OFFSET).unwrap(),
                mem.load(Superblock::UPPER_LEN_OFFSET).unwrap(),
            );
            assert_eq!(len2, len, "upper_len {bad}: the blob's length again");
            let mut blob = vec![0u8; len2 as usize];
            mem.read(at2, &mut blob).unwrap();
            let mut head = [0u8; Superblock::SIZE as usize];
            mem.read(0, &mut head).unwrap();
            let sb = Superblock::read(&head).unwrap();
            let t = topology::decode(&blob, sb.directory_capacity()).unwrap();
            let mut old = vec![0u8; len as usize];
            mem.read(at, &mut old).unwrap();
            let was = topology::decode(&old, sb.directory_capacity()).unwrap();
            assert_eq!((t.first_keys, t.ids), (was.first_keys, was.ids));
        }
    }

    #[test]
    fn pools_that_are_not_resumable_are_refused_with_the_reason() {
        let (mem, next_free) = load(40);
        let agent = Agent::attach(&mem, AgentConfig::default(), next_free).unwrap();
        let sb = *agent.superblock();
        let recs = agent.records().to_vec();
        drop(agent);
        // A directory naming a retired record.
        let r = record(&mem, recs[1]);
        let retired = r.state().retired(recs[0]).unwrap();
        mem.store(recs[1] + ModelRecord::STATE_OFFSET, retired.raw())
            .unwrap();
        let err = Agent::resume(&mem, AgentConfig::default(), next_free).err();
        assert_eq!(
            err,
            Some(AgentError::Inconsistent {
                model_id: 1,
                what: Inconsistency::RetiredInDirectory
            })
        );
        mem.store(recs[1] + ModelRecord::STATE_OFFSET, r.state().raw())
            .unwrap();
        // Two models naming the same record.
        let dir1 = sb.directory_entry_offset(1).unwrap();
        mem.store(dir1, recs[0]).unwrap();
        assert!(matches!(
            Agent::resume(&mem, AgentConfig::default(), next_free),
            Err(AgentError::Inconsistent {
                what: Inconsistency::WrongRecord,
                ..
            })
        ));
        mem.store(dir1, recs[1]).unwrap();
        // Another layout version.
        let word = mem.load(8).unwrap();
        mem.store(8, word + 1).unwrap();
        assert!(matches!(
            Agent::resume(&mem, AgentConfig::default(), next_free),
            Err(AgentError::Layout(
                rolex_core::layout::LayoutError::UnsupportedVersion { .. }
            ))
        ));
        mem.store(8, word).unwrap();
        // An LT entry naming another leaf region is refused before
        // anything is written.
        // (Locked by a compute node: the lock release of step 3 would
        // write to it.)
        let lt = record(&mem, recs[2]).lt_entry_offset(0).unwrap();
        let entry = mem.load(lt).unwrap();
        let id = sb.leaf_region().unwrap().id();
        let elsewhere = LeafAddr::new(id ^ 1, LtEntry::from_raw(entry).leaf()).unwrap();
        let bad = LtEntry::for_leaf(elsewhere).locked_by(LockOwner(7));
        mem.store(lt, bad.raw()).unwrap();
        let dump = |m: &VecPool| {
            let mut b = vec![0u8; m.size() as usize];
            m.read(0, &mut b).unwrap();
            b
        };
        let before = dump(&mem);
        assert!(Agent::resume(&mem, AgentConfig::default(), next_free).is_err());
        assert!(dump(&mem) == before, "a refused resume wrote to the pool");
        mem.store(lt, entry).unwrap();
        // A torn leaf is reported, not hidden.
        let region = sb.leaf_region().unwrap();
        let e = entries(&mem, recs[2])[0];
        let off = region.leaf_offset(e.addr()).unwrap() + region.leaf_size() - 8;
        mem.store(off, mem.load(off).unwrap() ^ 1).unwrap();
        let (_, rec) = Agent::resume(&mem, AgentConfig::default(), next_free).unwrap();
        assert_eq!(rec.damaged_count, 1);
        assert_eq!(
            (rec.damaged[0].model_id, rec.damaged[0].leaf),
            (2, e.addr())
        );
    }
}
