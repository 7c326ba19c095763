//! What a compute node caches: the upper levels that locate a model, and
//! per model its record, segments, LT, fences and the synonym chains it has
//! learned.
//!
//! The cache is advisory for everything but the fences' *ownership*: a
//! model's key range and its training leaves' `fence_lo` never change for
//! as long as the record is live, and data never leaves the chain of the
//! training leaf that owns it. Chains, LT words and SLT contents may be
//! stale; readers follow the leaves' own `next` links and writers learn the
//! current LT word from a failed `CAS`, so a stale cache costs round trips,
//! never correctness.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::RwLock;

use rolex_core::entry::{LeafAddr, LtEntry, SltHeader};
use rolex_core::layout::{LayoutError, ModelRecord, ModelSegment, Superblock};
use rolex_core::plr::{fit, Segment};
use rolex_core::train::window;

use crate::error::KvError;

/// Locates the model that owns a key: learned upper levels over the models'
/// first keys, verified against those keys.
#[derive(Clone, Debug)]
pub(crate) struct Locator {
    firsts: Vec<u64>,
    /// `levels[0]` indexes `firsts`; the last level is a single root.
    levels: Vec<Vec<Segment>>,
    starts: Vec<Vec<u64>>,
    epsilon: u64,
}

impl Locator {
    /// Fits the upper levels over `firsts` (every model's first key, in
    /// model order) with error bound `epsilon`.
    pub(crate) fn new(firsts: Vec<u64>, epsilon: u64) -> Result<Self, KvError> {
        let mut levels = Vec::new();
        let mut starts = Vec::new();
        let mut below: Vec<u64> = firsts.clone();
        while below.len() > 1 {
            let segs = fit(&below, epsilon).map_err(|error| KvError::UpperLevels {
                level: levels.len(),
                error,
            })?;
            let mut acc = 0u64;
            starts.push(
                segs.iter()
                    .map(|s| {
                        let a = acc;
                        acc += s.len;
                        a
                    })
                    .collect(),
            );
            below = segs.iter().map(|s| s.first_key).collect();
            levels.push(segs);
        }
        Ok(Self {
            firsts,
            levels,
            starts,
            epsilon,
        })
    }

    /// The model owning `key`: the last whose first key is `≤ key` (model 0
    /// owns everything below).
    pub(crate) fn locate(&self, key: u64) -> usize {
        let mut idx = 0usize;
        let e = self.epsilon;
        for l in (0..self.levels.len()).rev() {
            let seg = &self.levels[l][idx];
            let start = self.starts[l][idx];
            let p = seg.predict(key);
            // The entry sought is within [p − ε − 1, p + ε] of this
            // segment's labels (the δ = 1 argument of `rolex_core::model`).
            let lo = (start + p.saturating_sub(e.saturating_add(1))) as usize;
            let hi = (start + p.saturating_add(e).min(seg.len - 1)) as usize;
            let k = if l == 0 {
                self.firsts[lo..=hi].partition_point(|&f| f <= key)
            } else {
                self.levels[l - 1][lo..=hi].partition_point(|s| s.first_key <= key)
            };
            idx = lo + k.saturating_sub(1);
        }
        // The windows are proven, but a wrong model would cost a refresh
        // loop, so check against the first keys (two comparisons).
        let ok = (idx == 0 || self.firsts[idx] <= key)
            && self.firsts.get(idx + 1).map_or(true, |&n| n > key);
        if ok {
            idx
        } else {
            self.firsts.partition_point(|&f| f <= key).saturating_sub(1)
        }
    }

    pub(crate) fn bytes(&self) -> (u64, u64) {
        let segs: usize = self.levels.iter().map(Vec::len).sum();
        let learned = segs as u64 * ModelSegment::SIZE;
        (learned + self.firsts.len() as u64 * 8, learned)
    }
}

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
            chains: RwLock::new(chains),
        })
    }

    /// The training leaf that owns `key` (a key of this model), and whether
    /// the model's window held it.
    pub(crate) fn owner(&self, key: u64) -> (u64, bool) {
        let n = self.fences.len() as u64;
        let (lo, hi) = window(&self.segments, self.record.epsilon(), n, key);
        let in_window = self.fences[lo as usize] <= key
            && (hi + 1 == n || self.fences[(hi + 1) as usize] > key);
        if in_window {
            let w = &self.fences[lo as usize..=hi as usize];
            (
                lo + w.partition_point(|&f| f <= key).saturating_sub(1) as u64,
                true,
            )
        } else {
            (
                self.fences.partition_point(|&f| f <= key).saturating_sub(1) as u64,
                false,
            )
        }
    }

    /// Training leaf `j`'s address from the cached LT.
    pub(crate) fn training_leaf(&self, j: u64) -> LeafAddr {
        LtEntry::from_raw(self.lt[j as usize].load(Relaxed)).addr()
    }

    /// Appends chain `j` as cached (training leaf first) to `out`.
    pub(crate) fn chain(&self, j: u64, out: &mut Vec<LeafAddr>) {
        out.push(self.training_leaf(j));
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
