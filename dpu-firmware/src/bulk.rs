//! Laying out and bulk-loading a fresh pool from sorted (key, value) pairs.
//!
//! The keys are cut into leaves of `keys_per_leaf` keys (the fill factor);
//! the leaves' fences tile the whole key space (`fence_lo` of leaf 0 is 0,
//! `fence_hi` of the last is `u64::MAX`, so every `u64` key has an owner).
//! Fences, the cut into models (PLR pieces of at most `max_model_leaves`
//! leaves) and each model's fit are [`rolex_core::model`]'s, the code the
//! clients predict with. Each model is one directory slot whose key range
//! `[first fence, next model's first fence − 1]` never changes afterwards.
//!
//! Invariant of a written pool: the superblock passes its check, every
//! directory word names a live record of generation 0 whose LT, fences and
//! segments describe exactly its leaves, every leaf is sealed and holds the
//! keys inside its fences, `alloc_num` counts the loaded leaves, and the
//! CirQ and every SLT are empty.

use alloc::vec;
use alloc::vec::Vec;

use rolex_core::entry::{LeafAddr, LtEntry};
use rolex_core::layout::topology;
use rolex_core::layout::{
    block_class, BlockRef, CirqHeader, Leaf, LeafRegionHeader, ModelRecord, ModelRecordParams,
    ModelSegment, PoolParams, Slot, SlotValue, Superblock, ValueBlock, ValueRegionHeader,
    INLINE_MAX,
};
use rolex_core::model::{fit_model, leaf_fences, plan_models, ModelSpan};
use zerocopy::IntoBytes;

use crate::error::AgentError;
use crate::memory::PoolMemory;

/// How to lay a pool out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BulkConfig {
    /// The pool's leaf-region id (`0..=127`).
    pub leaf_region_id: u8,
    /// Slots per leaf, `L` (at least 2, so a full leaf can split).
    pub leaf_slots: u32,
    /// Keys per leaf at load (`1..=leaf_slots`): the fill factor times `L`.
    pub keys_per_leaf: u32,
    /// The models' error bound, in leaves (see [`rolex_core::model`]).
    pub epsilon: u64,
    /// Most training leaves a bulk-loaded model may have (at least 1).
    pub max_model_leaves: u64,
    /// Leaves the region holds beyond the loaded ones (synonym leaves).
    pub spare_leaves: u64,
    /// Bytes of the model region beyond the loaded records (the records
    /// retraining will build; retired records are reused after the
    /// agent's grace period).
    pub model_region_spare: u64,
    /// Directory slots beyond the loaded models: the models retraining
    /// creates when it cuts a model that grew too large (the CirQ gets as
    /// many slots as the directory).
    pub directory_spare: u64,
    /// Bytes of the value region's block area: the loaded out-of-line
    /// values' blocks ([`value_bytes`]) plus room for the values compute
    /// nodes will write.
    pub value_capacity: u64,
    /// Blocks of the redo log (`PoolParams::redo_blocks`: compute clients
    /// connected at once; 0 for none).
    pub redo_blocks: u32,
    /// Slots per redo block (`PoolParams::redo_slots`).
    pub redo_slots: u32,
}

/// Bytes the blocks of out-of-line values of lengths `lens` take (values
/// of up to [`INLINE_MAX`] bytes take none: they stay in their slots).
/// `None` if a length is over [`rolex_core::layout::MAX_VALUE_LEN`] or the
/// sum overflows.
pub fn value_bytes(lens: impl IntoIterator<Item = usize>) -> Option<u64> {
    let mut total = 0u64;
    for len in lens {
        if len > INLINE_MAX {
            total = total.checked_add(block_class(len)?)?;
        }
    }
    Some(total)
}

/// One model of the plan.
#[derive(Clone, Debug)]
struct PlannedModel {
    /// Its training leaves.
    span: ModelSpan,
    /// Its segments.
    segments: Vec<ModelSegment>,
    /// Pool offset of its record.
    at: u64,
    /// Its record.
    record: ModelRecord,
}

/// A laid-out pool, ready to be written (see the module docs).
#[derive(Clone, Debug)]
pub struct BulkPlan {
    cfg: BulkConfig,
    sb: Superblock,
    models: Vec<PlannedModel>,
    fences: Vec<u64>,
    keys: u64,
    next_free: u64,
}

impl BulkPlan {
    /// Plans a pool for `keys` (strictly increasing; may be empty).
    pub fn new(cfg: &BulkConfig, keys: &[u64]) -> Result<Self, AgentError> {
        let bad = |field, value| Err(AgentError::BadConfig { field, value });
        if cfg.leaf_slots < 2 {
            return bad("leaf_slots", cfg.leaf_slots.into());
        }
        if cfg.keys_per_leaf == 0 || cfg.keys_per_leaf > cfg.leaf_slots {
            return bad("keys_per_leaf", cfg.keys_per_leaf.into());
        }
        if cfg.max_model_leaves == 0 {
            return bad("max_model_leaves", 0);
        }
        if let Some(i) = keys.windows(2).position(|w| w[0] >= w[1]) {
            return Err(AgentError::UnsortedKeys {
                index: i as u64 + 1,
                key: keys[i + 1],
                prev: keys[i],
            });
        }
        let k = cfg.keys_per_leaf as usize;
        // Leaf i holds keys [iK, (i+1)K); leaf 0 also owns everything below.
        let fences = leaf_fences(keys, cfg.keys_per_leaf.into())?;
        let spans = plan_models(&fences, cfg.epsilon, cfg.max_model_leaves)?;
        let upper_len = topology::len_for(spans.len() as u64).ok_or(AgentError::BadConfig {
            field: "keys",
            value: keys.len() as u64,
        })?;
        let mut record_bytes = 0u64;
        let mut segs = Vec::with_capacity(spans.len());
        for span in &spans {
            let s = fit_model(&fences[span.range()], cfg.epsilon)?;
            record_bytes = record_bytes
                .checked_add(ModelRecord::size_for(span.leaves, s.len() as u64)?)
                .ok_or(AgentError::BadConfig {
                    field: "model_region_spare",
                    value: cfg.model_region_spare,
                })?;
            segs.push(s);
        }
        let leaf_count = fences.len() as u64;
        let model_count = spans.len() as u64;
        let too_big = AgentError::BadConfig {
            field: "model_region_spare",
            value: cfg.model_region_spare,
        };
        let model_region_len = upper_len
            .checked_add(record_bytes)
            .and_then(|n| n.checked_add(cfg.model_region_spare))
            .ok_or(too_big)?;
        let mut sb = Superblock::plan(&PoolParams {
            leaf_region_id: cfg.leaf_region_id,
            leaf_slots: cfg.leaf_slots,
            keys_per_leaf: cfg.keys_per_leaf,
            epsilon: cfg.epsilon,
            leaf_capacity: leaf_count.checked_add(cfg.spare_leaves).ok_or(
                AgentError::BadConfig {
                    field: "spare_leaves",
                    value: cfg.spare_leaves,
                },
            )?,
            directory_capacity: model_count.saturating_add(cfg.directory_spare),
            cirq_capacity: model_count.saturating_add(cfg.directory_spare),
            model_region_len,
            value_capacity: cfg.value_capacity,
            redo_blocks: cfg.redo_blocks,
            redo_slots: cfg.redo_slots,
        })?;
        sb.set_model_count(model_count);
        sb.set_upper_levels(sb.model_region_offset(), upper_len);
        sb.check()?;
        let mut at = sb.model_region_offset() + upper_len;
        let mut models = Vec::with_capacity(spans.len());
        for (m, (&span, segments)) in spans.iter().zip(segs).enumerate() {
            let key_hi = match fences.get(span.end() as usize) {
                Some(next) => next - 1,
                None => u64::MAX,
            };
            let first_key_pos = (span.first_leaf as usize).saturating_mul(k);
            let last_key_pos = ((span.end() as usize).saturating_mul(k)).min(keys.len());
            let record = ModelRecord::new(
                at,
                &ModelRecordParams {
                    model_id: m as u64,
                    first_key: fences[span.first_leaf as usize],
                    key_hi,
                    label_stride: 1,
                    segment_count: segments.len() as u64,
                    train_keys: last_key_pos.saturating_sub(first_key_pos) as u64,
                    leaf_count: span.leaves,
                    epsilon: cfg.epsilon,
                    generation: 0,
                    predecessor: 0,
                },
            )?;
            record.check(at, &sb)?;
            let size = ModelRecord::size_for(span.leaves, segments.len() as u64)?;
            models.push(PlannedModel {
                span,
                segments,
                at,
                record,
            });
            at += size;
        }
        Ok(Self {
            cfg: *cfg,
            sb,
            models,
            fences,
            keys: keys.len() as u64,
            next_free: at,
        })
    }

    /// Bytes the pool needs (the region to register).
    pub fn pool_size(&self) -> u64 {
        self.sb.pool_size()
    }

    /// The superblock the pool will have.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// Models laid out.
    pub fn model_count(&self) -> u64 {
        self.models.len() as u64
    }

    /// Leaves loaded.
    pub fn leaf_count(&self) -> u64 {
        self.fences.len() as u64
    }

    /// Keys loaded.
    pub fn key_count(&self) -> u64 {
        self.keys
    }

    /// Pool offset of the first model-region byte no record uses: where
    /// the agent builds the next record.
    pub fn next_free(&self) -> u64 {
        self.next_free
    }

    /// Writes the whole pool with 8-byte values: `pairs` must be the keys
    /// the plan was made from, with their values, in the same order.
    pub fn write<M: PoolMemory>(&self, mem: &M, pairs: &[(u64, u64)]) -> Result<(), AgentError> {
        self.write_values(mem, pairs, &mut |_, word, out| {
            out.extend_from_slice(&word.to_le_bytes())
        })
    }

    /// Writes the whole pool: `pairs` must be the keys the plan was made
    /// from, each with a word from which `value_of(key, word, out)` appends
    /// the key's value to `out` (empty when called), in the same order.
    /// Values of up to [`INLINE_MAX`] bytes go in their slots; longer ones
    /// into value blocks (generation 1) packed from the start of the value
    /// region, which must have room for them (see [`value_bytes`]).
    pub fn write_values<M: PoolMemory>(
        &self,
        mem: &M,
        pairs: &[(u64, u64)],
        value_of: &mut dyn FnMut(u64, u64, &mut Vec<u8>),
    ) -> Result<(), AgentError> {
        if pairs.len() as u64 != self.keys {
            return Err(AgentError::BadConfig {
                field: "pairs",
                value: pairs.len() as u64,
            });
        }
        let sb = &self.sb;
        mem.write(0, sb.as_bytes())?;
        // CirQ: header, then empty slots.
        let cirq = CirqHeader::new(sb.directory_capacity().max(1))?;
        mem.write(sb.cirq_offset(), cirq.as_bytes())?;
        let zeros = vec![0u8; (sb.cirq_len() - CirqHeader::SIZE) as usize];
        mem.write(sb.cirq_offset() + CirqHeader::SIZE, &zeros)?;
        // The topology: every model's first key and slot, in key order.
        let entries: Vec<(u64, u64)> = self
            .models
            .iter()
            .enumerate()
            .map(|(m, p)| (p.record.first_key(), m as u64))
            .collect();
        mem.write(sb.upper_offset(), &topology::encode(0, &entries))?;
        let region = sb.leaf_region()?;
        let id = region.id();
        for (i, m) in self.models.iter().enumerate() {
            let r = &m.record;
            mem.write(m.at, r.as_bytes())?;
            let mut lt = Vec::with_capacity(m.span.leaves as usize * 8);
            let mut fences = Vec::with_capacity(m.span.leaves as usize * 8);
            for g in m.span.first_leaf..m.span.end() {
                lt.extend_from_slice(&LtEntry::new(id, 0, g)?.raw().to_le_bytes());
                fences.extend_from_slice(&self.fences[g as usize].to_le_bytes());
            }
            mem.write(r.lt_offset(), &lt)?;
            mem.write(r.fences_offset(), &fences)?;
            mem.write(r.slt_offset(), &[0u8; ModelRecord::SLT_SIZE as usize])?;
            let mut segs = Vec::with_capacity(m.segments.len() * 40);
            for s in &m.segments {
                segs.extend_from_slice(s.as_bytes());
            }
            mem.write(r.segments_offset(), &segs)?;
            mem.store(sb.directory_entry_offset(i as u64)?, m.at)?;
        }
        // Leaf region: header, then the leaves, sealed.
        let capacity = region.capacity();
        mem.write(region.offset(), LeafRegionHeader::new(capacity).as_bytes())?;
        mem.store(region.alloc_num_offset(), self.fences.len() as u64)?;
        let mut buf = vec![0u8; region.leaf_size() as usize];
        let values = sb.value_region()?;
        let mut value = Vec::new();
        let mut block = Vec::new();
        let mut loaded = 0u64;
        let mut slots: Vec<Slot> = Vec::with_capacity(self.cfg.keys_per_leaf as usize);
        let k = self.cfg.keys_per_leaf as usize;
        for (g, &lo) in self.fences.iter().enumerate() {
            let hi = self.fences.get(g + 1).map_or(u64::MAX, |n| n - 1);
            slots.clear();
            let end = ((g + 1) * k).min(pairs.len());
            for &(key, word) in pairs.get(g * k..end).unwrap_or(&[]) {
                value.clear();
                value_of(key, word, &mut value);
                if let Some(inline) = SlotValue::inline(&value) {
                    slots.push(Slot::new(key, inline));
                    continue;
                }
                let too_long = AgentError::BadConfig {
                    field: "value length",
                    value: value.len() as u64,
                };
                let class = block_class(value.len()).ok_or(too_long)?;
                let offset = values
                    .claim(loaded, class)
                    .map_err(|_| AgentError::BadConfig {
                        field: "value_capacity",
                        value: values.capacity(),
                    })?;
                let at = BlockRef {
                    offset,
                    len: value.len() as u32,
                    gen: 1,
                };
                block.resize(at.read_len() as usize, 0);
                ValueBlock::write(&mut block, key, at.gen, class, &value).ok_or(too_long)?;
                mem.write(offset, &block)?;
                loaded += class;
                slots.push(Slot::new(key, SlotValue::Block(at)));
            }
            buf.fill(0);
            let leaf = Leaf::from_bytes_mut(&mut buf).map_err(|error| AgentError::Leaf {
                leaf: g as u64,
                error,
            })?;
            let edit = |e| AgentError::Leaf {
                leaf: g as u64,
                error: match e {
                    rolex_core::layout::EditError::Invalid(l) => l,
                    _ => rolex_core::layout::LeafError::BadLength { len: 0 },
                },
            };
            leaf.init(lo, hi).map_err(edit)?;
            leaf.set_entries(&slots).map_err(edit)?;
            leaf.seal();
            let addr = LeafAddr::new(id, g as u64)?;
            mem.write(region.leaf_offset(addr)?, &buf)?;
        }
        let header = ValueRegionHeader::new(values.capacity(), loaded);
        mem.write(values.offset(), header.as_bytes())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leaves::{check_tiling, leaf_buffer, walk_model};
    use crate::memory::testing::VecPool;

    pub(crate) fn cfg() -> BulkConfig {
        BulkConfig {
            leaf_region_id: 1,
            leaf_slots: 8,
            keys_per_leaf: 6,
            epsilon: 1,
            max_model_leaves: 16,
            spare_leaves: 64,
            model_region_spare: 1 << 16,
            directory_spare: 64,
            value_capacity: 1 << 16,
            redo_blocks: 4,
            redo_slots: 4,
        }
    }

    #[test]
    fn loaded_pool_tiles_the_key_space() {
        let keys: Vec<u64> = (0..500u64).map(|i| i * i * 7 + 3).collect();
        let pairs: Vec<(u64, u64)> = keys.iter().map(|&k| (k, k ^ 0xff)).collect();
        let plan = BulkPlan::new(&cfg(), &keys).unwrap();
        let mem = VecPool::new(plan.pool_size());
        plan.write(&mem, &pairs).unwrap();
        let mut head = [0u8; Superblock::SIZE as usize];
        mem.read(0, &mut head).unwrap();
        let sb = Superblock::read(&head).unwrap();
        assert_eq!(sb.model_count(), plan.model_count());
        assert!(plan.model_count() >= 84 / 16);
        let region = sb.leaf_region().unwrap();
        let mut buf = leaf_buffer(&region);
        let mut prev_hi: Option<u64> = None;
        let mut seen = 0u64;
        for m in 0..sb.model_count() {
            let at = mem.load(sb.directory_entry_offset(m).unwrap()).unwrap();
            let mut rb = [0u8; ModelRecord::SIZE as usize];
            mem.read(at, &mut rb).unwrap();
            let r = ModelRecord::read(&rb).unwrap();
            r.check(at, &sb).unwrap();
            assert!(r.leaf_count() <= 16);
            let leaves = walk_model(&mem, &region, &r, &mut buf).unwrap();
            check_tiling(&r, &leaves).unwrap();
            assert_eq!(r.first_key(), prev_hi.map_or(0, |h| h + 1));
            prev_hi = Some(r.key_hi());
            seen += leaves.iter().map(|l| u64::from(l.count)).sum::<u64>();
        }
        assert_eq!(prev_hi, Some(u64::MAX));
        assert_eq!(seen, 500);
    }

    #[test]
    fn bad_input_is_refused() {
        assert_eq!(
            BulkPlan::new(&cfg(), &[1, 5, 5]).unwrap_err(),
            AgentError::UnsortedKeys {
                index: 2,
                key: 5,
                prev: 5
            }
        );
        assert_eq!(
            BulkPlan::new(&cfg(), &[1, 7, 3]).unwrap_err().to_string(),
            "bulk-load key 3 at index 2 is not above the key before it, 7"
        );
        let mut c = cfg();
        c.keys_per_leaf = 9;
        assert!(matches!(
            BulkPlan::new(&c, &[1]),
            Err(AgentError::BadConfig {
                field: "keys_per_leaf",
                ..
            })
        ));
        let plan = BulkPlan::new(&cfg(), &[]).unwrap();
        assert_eq!(plan.model_count(), 1);
        assert_eq!(plan.leaf_count(), 1);
        let mem = VecPool::new(plan.pool_size());
        assert!(plan.write(&mem, &[(1, 1)]).is_err());
        plan.write(&mem, &[]).unwrap();
    }
}
