//! Stale models stay correct: *every key present is found from a model not
//! retrained since, after any sequence of inserts, updates, deletes and
//! splits* (DESIGN §5.2), on the model the store runs (`rolex_core::model`).
//!
//! An in-memory store with the store's mechanics: sorted keys bulk-loaded
//! `K` to a leaf of `L` slots, fences by [`leaf_fences`], models by
//! [`plan_models`] and [`fit_model`], a [`Locator`] over the models' first
//! fences — trained once, never retrained. Writers find a key's chain from
//! the fences alone (independently of the model) and chase `next` links to
//! the leaf whose fences hold it; a full leaf splits B-link style as
//! `rolex-kv`'s session does: a new synonym leaf takes the upper half, the
//! old leaf's `fence_hi` shrinks below it and links to it. Random inserts
//! (anywhere, including below the first and above the last key, and dense
//! bursts into one leaf), updates and deletes change the data. After every
//! step each key touched is searched **only** through the model —
//! `Locator::locate`, then [`window`], then the chains of the training
//! leaves in that window — and the result must match a `BTreeMap`
//! reference: a present key is found once with its value, an absent key is
//! not found. The checks of the whole store also hold every leaf to the
//! invariant: `fence_lo` never changes, `fence_hi` only shrinks, chains
//! tile their training leaf's fences and hold only keys inside them.
#![cfg(feature = "alloc")]

use std::collections::BTreeMap;

use proptest::prelude::*;
use rolex_core::layout::ModelSegment;
use rolex_core::model::{
    fit_model, leaf_fences, owning_leaf, plan_models, window, LeafLookup, Locator, ModelSpan,
};

/// How a store is laid out and trained.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Slots per leaf, `L` (at least 2, so a full leaf can split).
    slots: usize,
    /// Keys per leaf at load, `K ≤ L`.
    keys_per_leaf: u64,
    /// The models' bound, in leaves.
    epsilon: u64,
    /// Most training leaves per model.
    max_model_leaves: u64,
    /// The locator's bound, in models.
    upper_epsilon: u64,
}

/// One leaf: its fences, its link to the next leaf of its chain, and its
/// sorted `(key, value)` entries.
#[derive(Clone, Debug)]
struct Leaf {
    lo: u64,
    hi: u64,
    next: Option<usize>,
    entries: Vec<(u64, u64)>,
}

/// One bulk-loaded model.
struct Model {
    span: ModelSpan,
    segments: Vec<ModelSegment>,
}

struct Store {
    shape: Shape,
    /// The training leaves' `fence_lo`, in global leaf order (fixed).
    fences: Vec<u64>,
    models: Vec<Model>,
    locator: Locator,
    /// Leaves `0..fences.len()` are the training leaves; splits append.
    leaves: Vec<Leaf>,
    /// Each leaf's fences at the last full check.
    seen: Vec<(u64, u64)>,
    /// Smallest and largest bulk-loaded key (0 and 0 when none were).
    loaded: (u64, u64),
    splits: u64,
    /// Splits of a synonym leaf (not a training leaf).
    synonym_splits: u64,
    reference: BTreeMap<u64, u64>,
}

impl Store {
    fn new(keys: &[u64], shape: Shape) -> Store {
        assert!(shape.slots >= 2 && shape.slots as u64 >= shape.keys_per_leaf);
        let fences = leaf_fences(keys, shape.keys_per_leaf).unwrap();
        let spans = plan_models(&fences, shape.epsilon, shape.max_model_leaves).unwrap();
        let models: Vec<Model> = spans
            .iter()
            .map(|&span| Model {
                span,
                segments: fit_model(&fences[span.range()], shape.epsilon).unwrap(),
            })
            .collect();
        let firsts = spans
            .iter()
            .map(|s| fences[s.first_leaf as usize])
            .collect();
        let locator = Locator::new(firsts, shape.upper_epsilon).unwrap();
        let k = shape.keys_per_leaf as usize;
        let leaves: Vec<Leaf> = fences
            .iter()
            .enumerate()
            .map(|(g, &lo)| Leaf {
                lo,
                hi: fences.get(g + 1).map_or(u64::MAX, |&n| n - 1),
                next: None,
                entries: keys
                    .get(g * k..keys.len().min((g + 1) * k))
                    .unwrap_or(&[])
                    .iter()
                    .map(|&x| (x, value_of(x)))
                    .collect(),
            })
            .collect();
        assert!(leaves.iter().all(|l| l.entries.len() <= shape.slots));
        Store {
            shape,
            seen: leaves.iter().map(|l| (l.lo, l.hi)).collect(),
            fences,
            models,
            locator,
            leaves,
            loaded: (
                keys.first().copied().unwrap_or(0),
                keys.last().copied().unwrap_or(0),
            ),
            splits: 0,
            synonym_splits: 0,
            reference: keys.iter().map(|&x| (x, value_of(x))).collect(),
        }
    }

    /// Ground truth, from the fences alone: the training leaf owning `key`.
    fn training_owner(&self, key: u64) -> usize {
        self.fences.partition_point(|&lo| lo <= key) - 1
    }

    /// Ground truth: the model owning `key`.
    fn model_owner(&self, key: u64) -> usize {
        let g = self.training_owner(key) as u64;
        self.models.partition_point(|m| m.span.first_leaf <= g) - 1
    }

    /// The chase: from a leaf with `fence_lo ≤ key`, follow `next` while
    /// `key > fence_hi`; the leaf reached owns `key`.
    fn chase(&self, from: usize, key: u64) -> usize {
        let mut i = from;
        assert!(
            self.leaves[i].lo <= key,
            "chase from leaf {i} above key {key}"
        );
        while key > self.leaves[i].hi {
            i = self.leaves[i]
                .next
                .unwrap_or_else(|| panic!("chain of leaf {from} ends before key {key}"));
        }
        assert!(self.leaves[i].lo <= key);
        i
    }

    /// The writer's leaf for `key`: the fences' chain, chased.
    fn write_leaf(&self, key: u64) -> usize {
        self.chase(self.training_owner(key), key)
    }

    fn upsert(&mut self, key: u64, value: u64) {
        self.reference.insert(key, value);
        let i = self.write_leaf(key);
        let at = match self.leaves[i].entries.binary_search_by_key(&key, |e| e.0) {
            Ok(at) => {
                self.leaves[i].entries[at].1 = value;
                return;
            }
            Err(at) => at,
        };
        self.leaves[i].entries.insert(at, (key, value));
        if self.leaves[i].entries.len() > self.shape.slots {
            self.split(i);
        }
    }

    /// Splits leaf `i`, one entry over full, as `rolex-kv` does: the new
    /// synonym leaf `B = [mid, hi]` takes the upper half and `X`'s old
    /// successor, `X` shrinks to `[lo, mid − 1]` and links to `B`.
    fn split(&mut self, i: usize) {
        let b = self.leaves.len();
        let x = &mut self.leaves[i];
        let upper = x.entries.split_off(x.entries.len() / 2);
        let mid = upper[0].0;
        let new = Leaf {
            lo: mid,
            hi: x.hi,
            next: x.next,
            entries: upper,
        };
        x.hi = mid - 1;
        x.next = Some(b);
        self.seen.push((new.lo, new.hi));
        self.leaves.push(new);
        self.splits += 1;
        if i >= self.fences.len() {
            self.synonym_splits += 1;
        }
    }

    fn delete(&mut self, key: u64) {
        self.reference.remove(&key);
        let i = self.write_leaf(key);
        self.leaves[i].entries.retain(|e| e.0 != key);
    }

    /// Looks `key` up from the stale model only: the located model's window,
    /// every leaf of the chains of the training leaves in it.
    fn get(&self, key: u64) -> Option<u64> {
        let m = &self.models[self.locator.locate(key)];
        let (lo, hi) = window(&m.segments, self.shape.epsilon, m.span.leaves, key);
        assert!(lo <= hi && hi < m.span.leaves);
        let mut found = None;
        for j in lo..=hi {
            let mut leaf = Some((m.span.first_leaf + j) as usize);
            while let Some(i) = leaf {
                let l = &self.leaves[i];
                if let Ok(at) = l.entries.binary_search_by_key(&key, |e| e.0) {
                    assert!(found.is_none(), "key {key} stored twice");
                    found = Some(l.entries[at].1);
                }
                leaf = l.next;
            }
        }
        found
    }

    /// The key is found (or not) exactly as the reference says; the learned
    /// locator names the owning model, the window the owning training leaf,
    /// and the client's path (fences in the window, then the chase) reaches
    /// the leaf the writers use.
    fn check_key(&self, key: u64) {
        let model = self.model_owner(key);
        assert_eq!(self.locator.locate_learned(key), model, "locate({key})");
        assert_eq!(self.locator.locate(key), model);
        let m = &self.models[model];
        let g = self.training_owner(key);
        let lookup = owning_leaf(
            &m.segments,
            self.shape.epsilon,
            &self.fences[m.span.range()],
            key,
        );
        assert_eq!(
            lookup,
            LeafLookup {
                leaf: g as u64 - m.span.first_leaf,
                in_window: true
            },
            "key {key}"
        );
        assert_eq!(
            self.chase(lookup.leaf as usize + m.span.first_leaf as usize, key),
            self.write_leaf(key)
        );
        assert_eq!(
            self.get(key),
            self.reference.get(&key).copied(),
            "key {key}"
        );
    }

    /// The chains tile their training leaves' fences, hold sorted keys
    /// inside their leaves' fences and at most `L` per leaf, every leaf is
    /// on exactly one chain, no `fence_lo` changed and no `fence_hi` grew
    /// since the last check; then every present key is found.
    fn check_all(&mut self) {
        let mut on_chain = vec![false; self.leaves.len()];
        let mut count = 0;
        for (g, &lo) in self.fences.iter().enumerate() {
            let hi = self.fences.get(g + 1).map_or(u64::MAX, |&n| n - 1);
            let mut expect_lo = lo;
            let mut leaf = Some(g);
            let mut last_hi = None;
            while let Some(i) = leaf {
                let l = &self.leaves[i];
                assert!(!on_chain[i], "leaf {i} on two chains or a cycle");
                on_chain[i] = true;
                assert_eq!(l.lo, expect_lo, "chain {g} has a gap at leaf {i}");
                assert!(l.lo <= l.hi);
                assert!(l.entries.len() <= self.shape.slots);
                assert!(l.entries.windows(2).all(|w| w[0].0 < w[1].0));
                assert!(l.entries.iter().all(|e| l.lo <= e.0 && e.0 <= l.hi));
                count += l.entries.len();
                last_hi = Some(l.hi);
                expect_lo = l.hi.wrapping_add(1);
                leaf = l.next;
            }
            assert_eq!(last_hi, Some(hi), "chain {g} does not end at its fence");
        }
        assert!(on_chain.iter().all(|&b| b), "a leaf is on no chain");
        for (i, l) in self.leaves.iter().enumerate() {
            let (lo, hi) = self.seen[i];
            assert_eq!(l.lo, lo, "fence_lo of leaf {i} changed");
            assert!(l.hi <= hi, "fence_hi of leaf {i} grew");
            self.seen[i] = (l.lo, l.hi);
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

    /// A key inside the fences of training leaf `pick` (mod leaves), near
    /// its low end so that bursts are dense.
    fn in_leaf(&self, pick: u64, offset: u64) -> u64 {
        let g = (pick % self.fences.len() as u64) as usize;
        let lo = self.fences[g];
        let hi = self.fences.get(g + 1).map_or(u64::MAX, |&n| n - 1);
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
    /// Insert below the smallest or above the largest loaded key.
    InsertEdge(bool, u64),
    /// Insert `n` close keys into one training leaf (splits its chain).
    Burst(u64, u64, u8),
    /// Overwrite a present key.
    Update(u64, u64),
    /// Delete a present key.
    Delete(u64),
    /// Delete a run of consecutive present keys (empties leaves).
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
            let (first, last) = s.loaded;
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
        3 => (any::<u64>(), any::<u64>(), 1u8..24).prop_map(|(p, o, n)| Op::Burst(p, o, n)),
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

/// Loaded key sets: none, uniform, dense, clustered, with the extremes.
fn keys_strategy() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        Just(Vec::new()),
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

fn shape_strategy() -> impl Strategy<Value = Shape> {
    let leaf = prop_oneof![
        Just((6u64, 8usize)),
        Just((1, 2)),
        Just((2, 2)),
        Just((3, 4)),
        Just((4, 4)),
        Just((12, 16)),
    ];
    let max_model_leaves = prop_oneof![Just(1u64), Just(2), 3u64..9, Just(64), Just(u64::MAX)];
    (leaf, 0u64..8, max_model_leaves, 0u64..4).prop_map(|((k, slots), epsilon, mml, ueps)| Shape {
        slots,
        keys_per_leaf: k,
        epsilon,
        max_model_leaves: mml,
        upper_epsilon: ueps,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn every_key_is_found_from_a_stale_model(
        keys in keys_strategy(),
        shape in shape_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        let mut s = Store::new(&keys, shape);
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

/// xorshift64*, for the deterministic runs.
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
fn long_history(seed: u64, shape: Shape, steps: u64) {
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
    let mut s = Store::new(&keys, shape);
    assert!(s.models.len() > 1);
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
    // The history split training and synonym leaves and emptied some
    // training leaves' whole chains.
    assert!(s.splits > 0 && s.synonym_splits > 0);
    assert!(s.leaves.iter().any(|l| l.next.is_some()));
    assert!((0..s.fences.len()).any(|g| {
        let mut leaf = Some(g);
        let mut empty = true;
        while let Some(i) = leaf {
            empty &= s.leaves[i].entries.is_empty();
            leaf = s.leaves[i].next;
        }
        empty
    }));
}

#[test]
fn long_deterministic_history() {
    let shape = Shape {
        slots: 8,
        keys_per_leaf: 6,
        epsilon: 4,
        max_model_leaves: 256,
        upper_epsilon: 4,
    };
    long_history(0x9E37_79B9_7F4A_7C15, shape, 20_000);
}

#[test]
fn long_history_with_tight_bounds() {
    // ε = 0 and short models: the window is two leaves, so the δ of one
    // leaf decides whether keys between fences are found.
    let shape = Shape {
        slots: 4,
        keys_per_leaf: 3,
        epsilon: 0,
        max_model_leaves: 5,
        upper_epsilon: 0,
    };
    long_history(0xD1B5_4A32_D192_ED03, shape, 10_000);
}
