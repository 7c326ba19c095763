//! Stale models stay correct: an in-memory model of leaf chains with fences.
//!
//! A [`Hierarchy`] is trained once and never retrained. Each training leaf
//! starts a chain holding its training keys; random inserts (anywhere,
//! including below the first and above the last key, and dense bursts into
//! one leaf), updates and deletes then change the data. The owning chain of
//! a key is found from the fences (computed here from the training keys,
//! independently of the model), a full leaf spills into the next leaf of its
//! chain or into a newly appended synonym leaf, chains stay sorted, data
//! never leaves its chain and emptied leaves stay. After every step a key is
//! searched **only** in the chains of the leaves the model predicts, and the
//! result must match a `BTreeMap` reference: every present key is found with
//! its value, absent keys are not found.
#![cfg(feature = "alloc")]

use std::collections::BTreeMap;

use proptest::prelude::*;
use rolex_core::model::{Hierarchy, HierarchyConfig};

type Leaf = Vec<(u64, u64)>;

/// The store: one chain (training leaf + synonym leaves) per training leaf.
struct Store {
    h: Hierarchy,
    /// Slots per leaf.
    slots: usize,
    /// `fence_lo` of every training leaf, in global leaf order.
    fence_lo: Vec<u64>,
    /// Global number of each model's leaf 0.
    leaf_base: Vec<usize>,
    chains: Vec<Vec<Leaf>>,
    reference: BTreeMap<u64, u64>,
}

impl Store {
    fn new(keys: &[u64], cfg: HierarchyConfig, slots: usize) -> Store {
        assert!(slots as u64 >= cfg.keys_per_leaf);
        let h = Hierarchy::train(keys, cfg).unwrap();
        let k = cfg.keys_per_leaf as usize;
        let mut fence_lo = Vec::new();
        let mut leaf_base = Vec::new();
        let mut chains = Vec::new();
        let mut pos = 0;
        for m in h.models() {
            leaf_base.push(fence_lo.len());
            let model_keys = &keys[pos..pos + m.len as usize];
            for leaf_keys in model_keys.chunks(k) {
                fence_lo.push(if fence_lo.is_empty() { 0 } else { leaf_keys[0] });
                chains.push(vec![leaf_keys.iter().map(|&x| (x, value_of(x))).collect()]);
            }
            pos += m.len as usize;
        }
        assert_eq!(pos, keys.len());
        // The model's fences agree with the ones derived here.
        for (m, &base) in leaf_base.iter().enumerate() {
            for j in 0..h.leaves_in(m) {
                let g = base + j as usize;
                let hi = fence_lo.get(g + 1).map_or(u64::MAX, |&n| n - 1);
                assert_eq!(h.fences(m, j), Some((fence_lo[g], hi)));
            }
        }
        let reference = keys.iter().map(|&x| (x, value_of(x))).collect();
        Store {
            h,
            slots,
            fence_lo,
            leaf_base,
            chains,
            reference,
        }
    }

    /// Ground truth: the global training leaf whose fences contain `key`.
    fn owner(&self, key: u64) -> usize {
        self.fence_lo.partition_point(|&lo| lo <= key) - 1
    }

    fn upsert(&mut self, key: u64, value: u64) {
        self.reference.insert(key, value);
        let slots = self.slots;
        let g = self.owner(key);
        let chain = &mut self.chains[g];
        for leaf in chain.iter_mut() {
            if let Some(e) = leaf.iter_mut().find(|e| e.0 == key) {
                e.1 = value;
                return;
            }
        }
        // The first leaf holding a larger key (or the last leaf) takes it.
        let mut i = chain
            .iter()
            .position(|leaf| leaf.last().is_some_and(|e| e.0 > key))
            .unwrap_or(chain.len() - 1);
        let at = chain[i].partition_point(|e| e.0 < key);
        chain[i].insert(at, (key, value));
        // Spill the largest entry down the chain; a full chain grows a
        // synonym leaf.
        while chain[i].len() > slots {
            let moved = chain[i].pop().unwrap();
            if i + 1 == chain.len() {
                chain.push(Vec::new());
            }
            chain[i + 1].insert(0, moved);
            i += 1;
        }
    }

    fn delete(&mut self, key: u64) {
        self.reference.remove(&key);
        let g = self.owner(key);
        for leaf in &mut self.chains[g] {
            leaf.retain(|e| e.0 != key);
        }
    }

    /// Looks `key` up from the stale model only.
    fn get(&self, key: u64) -> Option<u64> {
        let r = self.h.predict(key);
        assert!(r.first_leaf <= r.last_leaf);
        assert!(r.last_leaf < self.h.leaves_in(r.model));
        let mut found = None;
        for leaf in r.first_leaf..=r.last_leaf {
            let g = self.leaf_base[r.model] + leaf as usize;
            for l in &self.chains[g] {
                if let Ok(i) = l.binary_search_by_key(&key, |e| e.0) {
                    assert!(found.is_none(), "key {key} stored twice");
                    found = Some(l[i].1);
                }
            }
        }
        found
    }

    /// The key is found (or not) exactly as the reference says, and the
    /// model picks the model that owns it by the fences.
    fn check_key(&self, key: u64) {
        let g = self.owner(key);
        let model = self.leaf_base.partition_point(|&b| b <= g) - 1;
        assert_eq!(self.h.locate(key), model, "locate({key})");
        assert_eq!(
            self.h.owning_leaf(key),
            (model, (g - self.leaf_base[model]) as u64)
        );
        assert_eq!(
            self.get(key),
            self.reference.get(&key).copied(),
            "key {key}"
        );
    }

    /// Every present key is found; chains are sorted, within their fences,
    /// and no leaf exceeds its slots.
    fn check_all(&self) {
        let mut count = 0;
        for (g, chain) in self.chains.iter().enumerate() {
            let hi = self.fence_lo.get(g + 1).map_or(u64::MAX, |&n| n - 1);
            let flat: Vec<u64> = chain.iter().flatten().map(|e| e.0).collect();
            assert!(flat.windows(2).all(|w| w[0] < w[1]), "chain {g} unsorted");
            assert!(flat.iter().all(|&k| self.fence_lo[g] <= k && k <= hi));
            assert!(chain.iter().all(|l| l.len() <= self.slots));
            count += flat.len();
        }
        assert_eq!(count, self.reference.len());
        for &key in self.reference.keys() {
            self.check_key(key);
        }
    }

    /// The first present key at or after `from` (wrapping to the smallest).
    fn present(&self, from: u64) -> Option<u64> {
        let mut next = self.reference.range(from..).map(|(&k, _)| k);
        next.next()
            .or_else(|| self.reference.keys().next().copied())
    }

    /// A key inside the fences of training leaf `pick` (mod leaves), near its
    /// low end so that bursts are dense.
    fn in_leaf(&self, pick: u64, offset: u64) -> u64 {
        let g = (pick % self.fence_lo.len() as u64) as usize;
        let lo = self.fence_lo[g];
        let hi = self.fence_lo.get(g + 1).map_or(u64::MAX, |&n| n - 1);
        lo + offset % (hi - lo).saturating_add(1).max(1)
    }
}

fn value_of(key: u64) -> u64 {
    key.rotate_left(17) ^ 0x5555
}

#[derive(Clone, Debug)]
enum Op {
    /// Insert a key anywhere.
    InsertAny(u64),
    /// Insert below the smallest or above the largest training key.
    InsertEdge(bool, u64),
    /// Insert `n` consecutive-ish keys into one training leaf.
    Burst(u64, u64, u8),
    /// Overwrite a present key.
    Update(u64, u64),
    /// Delete a present key.
    Delete(u64),
    /// Delete a whole training leaf's worth of present keys.
    DeleteRun(u64, u8),
}

fn apply(s: &mut Store, op: &Op, step: u64) {
    let mut touched = Vec::new();
    match *op {
        Op::InsertAny(k) => {
            s.upsert(k, step);
            touched.push(k);
        }
        Op::InsertEdge(low, d) => {
            let first = *s.fence_lo.get(1).unwrap_or(&u64::MAX);
            let last = *s.fence_lo.last().unwrap();
            let k = if low {
                d % first.max(1)
            } else {
                last.saturating_add(1 + d % 1000)
            };
            s.upsert(k, step);
            touched.push(k);
        }
        Op::Burst(pick, offset, n) => {
            for j in 0..n as u64 {
                let k = s.in_leaf(pick, offset.wrapping_add(j * 3) % 64);
                s.upsert(k, step + j);
                touched.push(k);
            }
        }
        Op::Update(pick, v) => {
            if let Some(k) = s.present(pick) {
                s.upsert(k, v);
                touched.push(k);
            }
        }
        Op::Delete(pick) => {
            if let Some(k) = s.present(pick) {
                s.delete(k);
                touched.push(k);
            }
        }
        Op::DeleteRun(from, n) => {
            // Consecutive present keys: this is what empties whole leaves.
            for _ in 0..n {
                if let Some(k) = s.present(from) {
                    s.delete(k);
                    touched.push(k);
                }
            }
        }
    }
    for k in touched {
        s.check_key(k);
        s.check_key(k.wrapping_add(1));
        s.check_key(k.wrapping_sub(1));
    }
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<u64>().prop_map(Op::InsertAny),
        1 => (any::<bool>(), any::<u64>()).prop_map(|(l, d)| Op::InsertEdge(l, d)),
        2 => (any::<u64>(), any::<u64>(), 1u8..24).prop_map(|(p, o, n)| Op::Burst(p, o, n)),
        2 => (any::<u64>(), any::<u64>()).prop_map(|(p, v)| Op::Update(p, v)),
        2 => any::<u64>().prop_map(Op::Delete),
        1 => (any::<u64>(), 1u8..16).prop_map(|(p, n)| Op::DeleteRun(p, n)),
    ]
}

fn sorted_unique(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v.dedup();
    v
}

/// Training key sets: uniform, clustered, dense, with the extremes.
fn keys_strategy() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        prop::collection::vec(any::<u64>(), 1..400).prop_map(sorted_unique),
        prop::collection::vec(0u64..2000, 1..400).prop_map(sorted_unique),
        prop::collection::vec((any::<u64>(), 1u64..60, 1u64..50), 1..12).prop_map(|runs| {
            let mut v = Vec::new();
            for (base, n, step) in runs {
                v.extend((0..n).map(|j| base.saturating_add(j * j * step)));
            }
            sorted_unique(v)
        }),
        prop::collection::vec(1u64..u64::MAX, 1..300).prop_map(|mut v| {
            v.push(0);
            v.push(u64::MAX);
            sorted_unique(v)
        }),
    ]
}

/// `(keys_per_leaf, slots)` pairs with `slots ≥ keys_per_leaf`.
fn leaf_shape() -> impl Strategy<Value = (u64, usize)> {
    prop_oneof![
        Just((6, 8)),
        Just((1, 2)),
        Just((3, 4)),
        Just((4, 4)),
        Just((12, 16)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_key_is_found_from_a_stale_model(
        keys in keys_strategy(),
        (k, slots) in leaf_shape(),
        eps in 0u64..12,
        ueps in 0u64..4,
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        let cfg = HierarchyConfig { epsilon: eps, upper_epsilon: ueps, keys_per_leaf: k };
        let mut s = Store::new(&keys, cfg, slots);
        s.check_all();
        for (step, op) in ops.iter().enumerate() {
            apply(&mut s, op, step as u64);
            if step % 16 == 15 {
                s.check_all();
            }
        }
        s.check_all();
        // Absent keys are not found.
        for &k in &[0, 1, u64::MAX, u64::MAX / 3] {
            s.check_key(k);
        }
    }
}

/// xorshift64*, for the deterministic run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A long history from one model, with `steps` random operations.
fn long_history(seed: u64, cfg: HierarchyConfig, slots: usize, steps: u64) {
    let mut r = Rng(seed);
    // Clusters of varied spread plus the extremes.
    let mut keys = vec![0, u64::MAX];
    for _ in 0..40 {
        let base = r.next();
        let scale = 1 + r.next() % (1 << (r.next() % 40));
        for _ in 0..500 {
            keys.push(base.saturating_add((r.next() % 1000) * scale));
        }
    }
    let keys = sorted_unique(keys);
    let mut s = Store::new(&keys, cfg, slots);
    s.check_all();
    for step in 0..steps {
        let op = match r.next() % 12 {
            0..=3 => Op::InsertAny(r.next()),
            4 => Op::InsertEdge(r.next() % 2 == 0, r.next()),
            5..=6 => Op::Burst(r.next(), r.next(), (1 + r.next() % 30) as u8),
            7..=8 => Op::Update(r.next(), r.next()),
            9..=10 => Op::Delete(r.next()),
            _ => Op::DeleteRun(r.next(), (1 + r.next() % 20) as u8),
        };
        apply(&mut s, &op, step);
        for _ in 0..4 {
            s.check_key(r.next());
        }
        if step % 2000 == 1999 {
            s.check_all();
        }
    }
    s.check_all();
    // The history grew synonym leaves and emptied some training leaves.
    assert!(s.chains.iter().any(|c| c.len() > 1));
    assert!(s.chains.iter().any(|c| c.iter().all(Vec::is_empty)));
}

#[test]
fn long_deterministic_history() {
    let cfg = HierarchyConfig {
        epsilon: 16,
        upper_epsilon: 4,
        keys_per_leaf: 6,
    };
    long_history(0x9E37_79B9_7F4A_7C15, cfg, 8, 20_000);
}

#[test]
fn long_history_with_tight_bounds() {
    // Small ε: the predicted range is narrow, so the δ of one position
    // decides whether keys between training keys are found.
    let cfg = HierarchyConfig {
        epsilon: 1,
        upper_epsilon: 0,
        keys_per_leaf: 3,
    };
    long_history(0xD1B5_4A32_D192_ED03, cfg, 4, 10_000);
}
