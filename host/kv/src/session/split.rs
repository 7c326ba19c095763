//! A leaf split, step by step (the parent module's docs, "Splits", say why
//! this order loses no key whenever the writer stops): claim a slot and a
//! leaf, cut the full leaf in two, write the new leaf whole, then the
//! shrunk one, then release the lock.
//!
//! Invariants: a full SLT consumes no leaf (the leaf drawn with the slot
//! is given back, or kept as the client's spare for its next split); no
//! write that links to the new leaf `B` is posted before `B` and its SLT
//! slot are known written, except on an ordered fabric, where they go
//! first in the same batch and are written again under the lock if they
//! report an error.

use std::sync::atomic::Ordering::Relaxed;

use rolex_core::entry::{LeafAddr, LtEntry, SltHeader};
use rolex_core::layout::{Leaf, LeafRegion, Slot};

use super::lock::{owned, ChainLock};
use super::{bad_leaf, first_error, KvSession, Locked, SplitInput};
use crate::cache::ModelView;
use crate::error::KvError;
use crate::io::Op;

/// Split step 1's result: the new synonym leaf `B` and its SLT slot.
#[derive(Clone, Copy, Debug)]
struct Claim {
    leaf: LeafAddr,
    slot: u8,
}

/// Split step 2's result: the two leaves a split writes.
struct Halves {
    /// `A'`: `X`'s first half, same version line, `fence_hi` shrunk, linked
    /// to `B`.
    a: Vec<u8>,
    /// `B`: the second half, linked to `X`'s old successor.
    b: Vec<u8>,
    /// `X`'s old successor (`B`'s SLT slot points on to it).
    successor: LtEntry,
}

impl Halves {
    /// `X`'s pairs (its validated entries; none if it does not validate)
    /// with the new pair, cut in two at the middle key.
    fn cut(s: &SplitInput<'_>, claim: Claim, leaf_size: u64) -> Result<Self, KvError> {
        let model = s.at.m as u64;
        let x = Leaf::from_bytes(&s.owner.bytes).map_err(bad_leaf(model, s.owner.addr))?;
        let (x_lo, x_hi, x_next) = (x.fence_lo(), x.fence_hi(), x.next());
        let mut entries: Vec<Slot> = match x.validate() {
            Ok(v) => v.entries().to_vec(),
            Err(_) => Vec::new(),
        };
        let pos = entries.partition_point(|e| e.key() < s.key);
        entries.insert(pos, Slot::new(s.key, s.value));
        let mid = entries.len() / 2;
        let mid_key = entries[mid].key();
        let inconsistent = |_| KvError::Inconsistent {
            what: "a split produced an invalid leaf",
            model,
        };
        let b_link = LtEntry::for_leaf(claim.leaf).with_pointer(claim.slot);
        let mut a = s.owner.bytes.clone();
        let al = Leaf::from_bytes_mut(&mut a).map_err(bad_leaf(model, s.owner.addr))?;
        al.init(x_lo, mid_key - 1).map_err(inconsistent)?;
        al.set_entries(&entries[..mid]).map_err(inconsistent)?;
        al.set_next(b_link).map_err(inconsistent)?;
        al.seal();
        let mut b = vec![0u8; leaf_size as usize];
        let bl = Leaf::from_bytes_mut(&mut b).map_err(bad_leaf(model, claim.leaf))?;
        bl.init(mid_key, x_hi).map_err(inconsistent)?;
        bl.set_entries(&entries[mid..]).map_err(inconsistent)?;
        bl.set_next(x_next).map_err(inconsistent)?;
        bl.seal();
        Ok(Halves {
            a,
            b,
            successor: x_next,
        })
    }
}

/// Split step 3: where a split's bytes go, and the LT word its release
/// leaves.
struct SplitWrites {
    halves: Halves,
    b_off: u64,
    /// `B`'s SLT slot: `B`, pointing on to `X`'s old successor.
    b_slot: (u64, [u8; 8]),
    /// `X`'s SLT slot when `X` is a synonym: `X`, pointing on to `B`.
    x_slot: Option<(u64, [u8; 8])>,
    a_off: u64,
    /// The LT entry after the release: the word before the lock, pointing
    /// at `B`'s slot when `X` is the training leaf.
    unlock_to: LtEntry,
}

impl SplitWrites {
    /// Places `halves` for the split `s` that claimed `claim`, in a chain
    /// whose LT word was `unlocked` before the lock.
    fn place(
        region: LeafRegion,
        s: &SplitInput<'_>,
        claim: Claim,
        halves: Halves,
        unlocked: LtEntry,
    ) -> Result<Self, KvError> {
        let record = &s.at.view.record;
        let b_off = region.leaf_offset(claim.leaf)?;
        let b_slot_entry = LtEntry::for_leaf(claim.leaf).with_pointer(halves.successor.pointer());
        let b_slot = (
            record.slt_slot_offset(claim.slot)?,
            b_slot_entry.raw().to_le_bytes(),
        );
        let (x_slot, unlock_to) = if s.owner.slot == 0 {
            (None, unlocked.with_pointer(claim.slot))
        } else {
            let x_entry = LtEntry::for_leaf(s.owner.addr).with_pointer(claim.slot);
            let x_slot = (
                record.slt_slot_offset(s.owner.slot)?,
                x_entry.raw().to_le_bytes(),
            );
            (Some(x_slot), unlocked)
        };
        let a_off = region.leaf_offset(s.owner.addr)?;
        Ok(SplitWrites {
            halves,
            b_off,
            b_slot,
            x_slot,
            a_off,
            unlock_to,
        })
    }

    /// `B` and its SLT slot: nothing links to either yet.
    fn new_leaf(&self) -> [(u64, &[u8]); 2] {
        [
            (self.b_off, &self.halves.b),
            (self.b_slot.0, &self.b_slot.1),
        ]
    }

    /// What links to `B`: `X`'s SLT slot when `X` is a synonym (an index
    /// entry only), then `A'`.
    fn links(&self) -> Vec<(u64, &[u8])> {
        let mut writes: Vec<(u64, &[u8])> = Vec::with_capacity(2);
        if let Some((off, bytes)) = &self.x_slot {
            writes.push((*off, bytes));
        }
        writes.push((self.a_off, &self.halves.a));
        writes
    }

    /// [`Self::new_leaf`] as owned bytes, for a release that must write
    /// them again first.
    fn new_leaf_owned(&self) -> Vec<(u64, Vec<u8>)> {
        owned(&self.new_leaf())
    }

    /// [`Self::links`] as owned bytes, likewise.
    fn links_owned(&self) -> Vec<(u64, Vec<u8>)> {
        owned(&self.links())
    }
}

impl KvSession {
    /// Splits the full owner `X` of `s.key` while inserting `s.key` →
    /// `s.value`, holding `lock` on its chain:
    /// 1. [`Self::claim_synonym`]: claim an SLT slot and a leaf `B` for it
    ///    (one round trip); an SLT already full gives the leaf back,
    ///    releases the lock unchanged and reports [`Locked::SltFull`];
    /// 2. [`Halves::cut`]: `X`'s pairs and the new one, cut in two — `A'`
    ///    (`X`'s first half, `fence_hi` shrunk, linked to `B`) and `B` (the
    ///    second half, linked to `X`'s old successor); no I/O;
    /// 3. [`SplitWrites::place`] and [`Self::write_split`]: `B` and its SLT
    ///    slot, then `X`'s slot when `X` is a synonym and `A'`, then the
    ///    posted unlock, which points the LT entry at the new slot when `X`
    ///    is the training leaf;
    /// 4. [`Self::learn_split`]: the cache learns the new link and synonym;
    ///    the claim of SLT slot 128 enqueues the model for retraining.
    ///
    /// An error in steps 1 to 3 before the release aborts the lock.
    pub(super) fn split(&mut self, s: SplitInput<'_>, lock: ChainLock) -> Result<Locked, KvError> {
        let claim = match self.claim_synonym(&s.at.view) {
            Ok(Some(claim)) => claim,
            Ok(None) => {
                lock.release_unchanged(self)?;
                return Ok(Locked::SltFull);
            }
            Err(e) => return Err(lock.abort(self, e)),
        };
        let planned = Halves::cut(&s, claim, self.leaf_size).and_then(|halves| {
            SplitWrites::place(self.shared.region, &s, claim, halves, lock.unlocked())
        });
        let writes = match planned {
            Ok(writes) => writes,
            Err(e) => return Err(lock.abort(self, e)),
        };
        self.write_split(&writes, lock)?;
        // The split is in the pool: what follows cannot undo it.
        self.learn_split(&s, claim, writes.unlock_to)
            .map_err(KvError::indeterminate)?;
        Ok(Locked::Done(None))
    }

    /// Split step 1: `FAA` the model's SLT count and, unless the client
    /// keeps a spare leaf or the record has stashed leaves, `FAA
    /// alloc_num`, in one batch. The claimed slot's stashed leaf, if the
    /// agent left one there (`ModelView::stash_leaf`), is the new leaf; a
    /// leaf drawn or spare and not needed is kept as the client's spare.
    /// A stash that ran out costs one more round trip (the draw). `None`:
    /// the SLT has no slot left, and the leaf drawn went back (see
    /// [`Self::give_back`]); [`KvError::LeafRegionFull`]: no leaf left (the
    /// slot claimed stays unused).
    fn claim_synonym(&mut self, view: &ModelView) -> Result<Option<Claim>, KvError> {
        let region = self.shared.region;
        let slt0 = view.record.slt_slot_offset(0)?;
        let spare = self.shared.take_spare_leaf();
        let draw = Op::Faa {
            remote: region.alloc_num_offset(),
            add: 1,
        };
        let mut ops = vec![Op::Faa {
            remote: slt0,
            add: 1,
        }];
        if spare.is_none() && !view.has_stash() {
            ops.push(draw);
        }
        let got = match self
            .io
            .run(&self.shared.pool, &ops, "claiming a synonym slot and leaf")
        {
            Ok(got) => got.to_vec(),
            Err(e) => {
                // The spare was not used; a leaf drawn may be lost.
                if let Some(leaf_no) = spare {
                    self.shared.keep_spare_leaf(leaf_no);
                }
                return Err(e);
            }
        };
        let mut leaf_no = spare.or_else(|| got.get(1).copied());
        let Ok(slot) = SltHeader::claimed_slot(got[0]) else {
            match (spare, leaf_no) {
                (Some(leaf_no), _) => self.shared.keep_spare_leaf(leaf_no),
                (None, Some(leaf_no)) => self.give_back(leaf_no),
                (None, None) => {}
            }
            return Ok(None);
        };
        if let Some(leaf) = view.stash_leaf(slot) {
            if let Some(leaf_no) = leaf_no {
                self.shared.keep_spare_leaf(leaf_no);
            }
            self.counters.stash_leaves.fetch_add(1, Relaxed);
            return Ok(Some(Claim { leaf, slot }));
        }
        if leaf_no.is_none() {
            // The stash ran out: draw (the slot stays claimed if this
            // fails, as when the region is full).
            leaf_no = Some(
                self.io
                    .run(&self.shared.pool, &[draw], "drawing a synonym leaf")?[0],
            );
        }
        let leaf_no = leaf_no.unwrap_or(u64::MAX);
        let leaf = region.claim(leaf_no).map_err(|_| KvError::LeafRegionFull {
            capacity: region.capacity(),
        })?;
        Ok(Some(Claim { leaf, slot }))
    }

    /// Returns leaf `leaf_no`, drawn and never written, to the region: a
    /// `CAS` of `alloc_num` back from `leaf_no + 1` (one round trip, on the
    /// full-SLT path only). If another leaf was drawn since, the client
    /// keeps it for its next split instead; if the `CAS` failed without
    /// saying whether it landed, neither (the number may be handed out
    /// again: one leaf lost rather than two owners).
    fn give_back(&mut self, leaf_no: u64) {
        let region = self.shared.region;
        if leaf_no >= region.capacity() {
            return; // Past the end: nothing was allocated.
        }
        let back = Op::Cas {
            remote: region.alloc_num_offset(),
            expected: leaf_no + 1,
            new: leaf_no,
        };
        match self
            .io
            .run_each(&self.shared.pool, &[back], "giving a leaf back")
        {
            Ok([Ok(v)]) if *v == leaf_no + 1 => {}
            Ok([Ok(_)]) => self.shared.keep_spare_leaf(leaf_no),
            _ => {}
        }
    }

    /// Split step 3: writes `B` whole before anything links to it, then
    /// `A'`, then posts the unlock (module docs, "Splits"). Errors before
    /// anything links to `B` are determinate; after, indeterminate.
    fn write_split(&mut self, w: &SplitWrites, lock: ChainLock) -> Result<(), KvError> {
        let during = "writing a split";
        let failed = |error| KvError::Transfer { during, error };
        let new_leaf = w.new_leaf();
        let links = w.links();
        if self.shared.ordered {
            let all: Vec<(u64, &[u8])> = new_leaf.iter().chain(&links).copied().collect();
            let (b_err, link_err) = match self
                .io
                .stage_writes(&all)
                .and_then(|ops| self.io.run_each(&self.shared.pool, &ops, during))
            {
                Ok(r) => (first_error(&r[..2]), first_error(&r[2..])),
                Err(e) => return Err(lock.abort(self, e)),
            };
            if let Some(error) = b_err {
                // Only a prefix of an ordered batch lands when one of it
                // fails; should `A'` have landed anyway, `B` must be whole
                // before the chain is unlocked.
                return Err(
                    match lock.keep(self, w.new_leaf_owned(), failed(error.clone())) {
                        Ok(()) => failed(error),
                        Err(e) => e,
                    }
                    .indeterminate(),
                );
            }
            if let Some(error) = link_err {
                // `A'` may have landed in part: whole again before the
                // release (`B` is whole).
                let rewrite = w.links_owned();
                return lock.rewrite_then_release(self, rewrite, w.unlock_to, failed(error));
            }
        } else {
            match self
                .io
                .stage_writes(&new_leaf)
                .and_then(|ops| self.io.run_each(&self.shared.pool, &ops, during))
            {
                Ok(r) => {
                    if let Some(error) = first_error(r) {
                        // Nothing links to `B`: the insert did not happen.
                        return Err(lock.abort(self, failed(error)));
                    }
                }
                Err(e) => return Err(lock.abort(self, e)),
            }
            match self
                .io
                .stage_writes(&links)
                .and_then(|ops| self.io.run_each(&self.shared.pool, &ops, during))
            {
                Ok(r) => {
                    if let Some(error) = first_error(r) {
                        // `A'` may have landed, in part: whole again
                        // before the release (`B` is whole).
                        let rewrite = w.links_owned();
                        return lock.rewrite_then_release(
                            self,
                            rewrite,
                            w.unlock_to,
                            failed(error),
                        );
                    }
                }
                Err(e) => return Err(lock.abort(self, e)),
            }
        }
        lock.post_release(self, w.unlock_to)
            .map_err(KvError::indeterminate)
    }

    /// Split step 4, after the release: what the cache learns, and the
    /// retraining request at the SLT's last slot.
    fn learn_split(
        &mut self,
        s: &SplitInput<'_>,
        claim: Claim,
        unlocked_to: LtEntry,
    ) -> Result<(), KvError> {
        let view = &s.at.view;
        view.lt[s.at.j as usize].store(unlocked_to.raw(), Relaxed);
        let mut synonyms: Vec<LeafAddr> = s.owner.path.iter().skip(1).copied().collect();
        if !s.owner.path.is_empty() {
            synonyms.push(s.owner.addr);
        }
        synonyms.push(claim.leaf);
        view.learn(s.at.j, synonyms);
        self.counters.synonym_leaves.fetch_add(1, Relaxed);
        if SltHeader::triggers_retraining(claim.slot) {
            self.enqueue(s.at.m as u64)?;
        }
        Ok(())
    }
}
