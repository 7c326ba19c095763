//! What a compute node caches per model: its record, segments, LT, fences
//! and the synonym chains it has learned (the upper levels that locate a
//! model are `rolex_core::model::Locator`).
//!
//! The cache is advisory for everything but the fences' *ownership*: a
//! model's key range and its training leaves' `fence_lo` never change for
//! as long as the record is live, and data never leaves the chain of the
//! training leaf that owns it. Chains, LT words and SLT contents may be
//! stale; readers follow the leaves' own `next` links and writers learn the
//! current LT word from a failed `CAS`, so a stale cache costs round trips,
//! never correctness.
//!
//! A retired record's space is reused by the memory node after a grace
//! period (`rolex_dpu::AgentConfig::record_grace`), so a cached record's
//! *words* stay safe to `CAS` only for a while after it was last seen live:
//! each view keeps when that was ([`ModelView::age_ns`], measured from
//! before the READ that saw it), and a writer refreshes a view older than
//! `KvClientConfig::model_max_age` before it locks through it. A record read
//! after its space was reused names another model or generation, and the
//! reader refreshes (see `fetch_model` and the lock's check).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::RwLock;

use rolex_core::entry::{LeafAddr, LtEntry, SltHeader};
use rolex_core::layout::{LayoutError, ModelRecord, ModelSegment, ModelState, Superblock};
use rolex_core::model::owning_leaf;

/// One model as cached (see the module docs).
#[derive(Debug)]
pub(crate) struct ModelView {
    /// Pool offset of the record.
    pub(crate) offset: u64,
    pub(crate) record: ModelRecord,
    pub(crate) segments: Vec<ModelSegment>,
    /// Last LT words seen, lock bit clear (the `expected` of lock CASes).
    pub(crate) lt: Vec<AtomicU64>,
    pub(crate) fences: Vec<u64>,
    /// Synonyms after each training leaf, in chain order, as last learned.
    chains: RwLock<HashMap<u64, Vec<LeafAddr>>>,
    /// Whether `chains` ever held an entry: while it never did, a get
    /// skips its lock (a cache line every reading thread would write).
    /// A learned chain is a hint (the chase follows the leaves' links), so
    /// a reader that just misses one being learned only walks a hop more.
    any_chain: AtomicBool,
    /// The SLT's slots as read (index = slot; slot 0 unused here): a slot
    /// not claimed when it was read holds 0 or the free leaf the agent
    /// stashed there for whoever claims it (see [`Self::stash_leaf`]).
    slots: Vec<u64>,
    /// Slots claimed when the SLT was read.
    slots_used: u64,
    /// Whether a slot above those held a stashed leaf then.
    stashed: bool,
    /// [`clock_ns`] before the latest READ that found this record live and
    /// this model's (0: never).
    seen_live_ns: AtomicU64,
}

/// The views' clock: the monotonic clock in nanoseconds
/// ([`rolex_engine::monotonic_ns`]).
pub(crate) fn clock_ns() -> u64 {
    rolex_engine::monotonic_ns()
}

impl ModelView {
    /// Parses a record read at `offset`: `bytes` holds the record and its
    /// tables (`ModelRecord::total_len` bytes from `offset`).
    pub(crate) fn parse(offset: u64, bytes: &[u8], sb: &Superblock) -> Result<Self, LayoutError> {
        let record = ModelRecord::read(bytes)?;
        record.check(offset, sb)?;
        let total = record.total_len()?;
        let too_short = LayoutError::TooShort {
            part: rolex_core::layout::Part::ModelRecord,
            needed: total,
            found: bytes.len() as u64,
        };
        if (bytes.len() as u64) < total || record.lt_offset() != offset + ModelRecord::SIZE {
            return Err(too_short);
        }
        let word = |at: u64| -> u64 {
            let i = (at - offset) as usize;
            u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or([0; 8]))
        };
        let n = record.leaf_count();
        let lt: Vec<AtomicU64> = (0..n)
            .map(|j| {
                AtomicU64::new(
                    LtEntry::from_raw(word(record.lt_offset() + 8 * j))
                        .without_lock()
                        .raw(),
                )
            })
            .collect();
        let fences: Vec<u64> = (0..n)
            .map(|j| word(record.fences_offset() + 8 * j))
            .collect();
        let mut segments = Vec::with_capacity(record.segment_count() as usize);
        for s in 0..record.segment_count() {
            let at = (record.segments_offset() - offset + s * ModelSegment::SIZE) as usize;
            segments.push(ModelSegment::read(&bytes[at..])?);
        }
        // Chains from the SLT: LT pointer, then each slot's pointer.
        let slt: Vec<u64> = (0..SltHeader::SLOTS as u64)
            .map(|i| word(record.slt_offset() + 8 * i))
            .collect();
        let used = SltHeader::from_raw(slt[0]).used();
        let stash = slt.clone();
        let mut chains = HashMap::new();
        if used > 0 {
            for (j, e) in lt.iter().enumerate() {
                let mut p = LtEntry::from_raw(e.load(Relaxed)).pointer();
                let mut chain = Vec::new();
                while p != 0 && chain.len() < SltHeader::CAPACITY as usize {
                    let s = LtEntry::from_raw(slt[p as usize]);
                    if s.raw() == 0 {
                        break;
                    }
                    chain.push(s.addr());
                    p = s.pointer();
                }
                if !chain.is_empty() {
                    chains.insert(j as u64, chain);
                }
            }
        }
        Ok(Self {
            offset,
            record,
            segments,
            lt,
            fences,
            any_chain: AtomicBool::new(!chains.is_empty()),
            chains: RwLock::new(chains),
            stashed: stash
                .iter()
                .enumerate()
                .skip(1)
                .any(|(i, &raw)| i as u64 > used && raw != 0),
            slots: stash,
            slots_used: used,
            seen_live_ns: AtomicU64::new(0),
        })
    }

    /// Notes that a READ posted at `at_ns` ([`clock_ns`]) found the record
    /// live and this model's, with the cached generation.
    pub(crate) fn seen_live(&self, at_ns: u64) {
        // Sessions of every thread read this word on each operation; write
        // it only when it moves by a millisecond or more (the view then
        // looks up to 1 ms older than it is: conservative), so the cache
        // line is not bounced between them by every get.
        if at_ns > self.seen_live_ns.load(Relaxed).saturating_add(1_000_000) {
            self.seen_live_ns.fetch_max(at_ns, Relaxed);
        }
    }

    /// Nanoseconds from when the record was last seen live to `now_ns`.
    pub(crate) fn age_ns(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.seen_live_ns.load(Relaxed))
    }

    /// Whether a record header's first words (state and model id) name the
    /// record this view caches, live: same model, same generation, not
    /// retired. Anything else is a stale view (retired, or the space
    /// reused by another record).
    pub(crate) fn is_current(&self, state: ModelState, model_id: u64) -> bool {
        model_id == self.record.model_id()
            && !state.is_retired()
            && state.generation() == self.record.state().generation()
    }

    /// The training leaf that owns `key` (a key of this model), and whether
    /// the model's window held it.
    pub(crate) fn owner(&self, key: u64) -> (u64, bool) {
        let l = owning_leaf(&self.segments, self.record.epsilon(), &self.fences, key);
        (l.leaf, l.in_window)
    }

    /// The leaf the agent stashed in SLT slot `slot` for whoever claims
    /// it, if any. The agent fills a record's unused slots before the
    /// record goes live and nothing else writes an unclaimed slot, and a
    /// claim (`FAA` of the slot count) only ever returns a slot unclaimed
    /// when this view read the SLT: so a nonzero word cached for the slot
    /// a claim returned is the stash.
    pub(crate) fn stash_leaf(&self, slot: u8) -> Option<LeafAddr> {
        let raw = *self.slots.get(usize::from(slot))?;
        (u64::from(slot) > self.slots_used && raw != 0).then(|| LtEntry::from_raw(raw).addr())
    }

    /// Whether the record had stashed leaves left when this view read it
    /// (a split then claims its slot without drawing a leaf).
    pub(crate) fn has_stash(&self) -> bool {
        self.stashed
    }

    /// Training leaf `j`'s address from the cached LT.
    pub(crate) fn training_leaf(&self, j: u64) -> LeafAddr {
        LtEntry::from_raw(self.lt[j as usize].load(Relaxed)).addr()
    }

    /// Appends chain `j` as cached (training leaf first) to `out`.
    pub(crate) fn chain(&self, j: u64, out: &mut Vec<LeafAddr>) {
        out.push(self.training_leaf(j));
        if !self.any_chain.load(Relaxed) {
            return;
        }
        let g = self.chains.read().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = g.get(&j) {
            out.extend_from_slice(c);
        }
    }

    /// Replaces the cached synonyms of chain `j`.
    pub(crate) fn learn(&self, j: u64, synonyms: Vec<LeafAddr>) {
        let mut g = self.chains.write().unwrap_or_else(|e| e.into_inner());
        if synonyms.is_empty() {
            g.remove(&j);
        } else {
            g.insert(j, synonyms);
            self.any_chain.store(true, Relaxed);
        }
    }

    /// Bytes cached for this model: (everything, learned segments). The
    /// SLT is not kept as such: it is parsed into the learned chains.
    pub(crate) fn bytes(&self) -> (u64, u64) {
        let n = self.fences.len() as u64;
        let segs = self.segments.len() as u64 * ModelSegment::SIZE;
        let syn: u64 = self
            .chains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|c| 8 + c.len() as u64 * 8)
            .sum();
        (ModelRecord::SIZE + 16 * n + segs + syn, segs)
    }
}
