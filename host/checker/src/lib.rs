//! `rolex-checker`: test support, not a library API. Recorded histories of
//! concurrent key-value operations, and checkers that decide whether a
//! history is one a correct store could produce; `rolex bench` and the
//! store's tests use it.
//!
//! A [`History`] holds one [`Record`] per operation: the calling thread,
//! the [`Call`] with its arguments, the logical time it was invoked, and —
//! unless the operation never returned or its outcome is unknown — the time
//! it returned and its [`Ret`]. Times come from one [`Clock`] (a sequentially
//! consistent counter), so "A returned before B was invoked" in real time
//! is exactly `A.ret < B.invoke`, with no ties.
//!
//! The [`Call`]s mirror `KvSession`'s methods (`insert` sets the key
//! whether present or not; `update` only if present), plus an
//! insert-if-absent for stores that have one; record a session's answers
//! as [`Ret::Value`], [`Ret::Prior`] and [`Ret::Entries`].
//!
//! An operation that returned an error is one of two things, and
//! [`Recorder::error`] records either from the error's own word
//! (`KvError::may_have_applied`): **determinate** — it did not take effect
//! ([`Ret::Failed`]: it is linearized as a no-op inside its interval, and
//! no scan may see it) — or **indeterminate** — it may have taken effect
//! at any point after its invocation, or never (no return: the same as an
//! operation that never returned, [`Recorder::abandon`]).
//!
//! **Single-key operations** (get, inserts, update, delete) are
//! checked for linearizability against a sequential `BTreeMap` model.
//! Linearizability is local (Herlihy & Wing), so the history is linearizable
//! iff each key's sub-history is; each key is searched separately with
//! Wing & Gong's algorithm as refined by Lowe: walk the key's invoke/return
//! events in time order, try to linearize any operation whose invocation
//! precedes the first pending return, backtrack on a mismatch, and memoise
//! (set of linearized operations, model state) so no configuration is
//! explored twice. The set is stored canonically as the first operation not
//! yet linearized (in invocation order) plus the few linearized past it, so
//! the memo stays small for long histories. An operation with no return
//! may take effect at any point after its invocation, or never.
//!
//! **Scans and ranges** are not atomic in the store (they read leaves in
//! several batches), so they are not part of the linearizability search.
//! What is checked for each, soundly (a failure is always a real bug):
//! the entries are strictly increasing and within the bounds (at most `n`
//! from `from` upwards for a scan; inside `[lo, hi]` for a range); every
//! returned `(k, v)` is a value `k` may have held during the operation (a
//! write of `v` to `k` was invoked before the operation returned and was
//! not certainly overwritten before the operation was invoked); and no key
//! that was certainly present throughout the operation's interval, inside
//! the span the result covers, is missing. A key is certainly present
//! throughout if some operation that saw or made it present returned before
//! the scan was invoked and no delete of it may fall between that
//! operation and the scan's return. The span a scan covers is `[from, last
//! returned key]` when it returned `n` entries, `[from, ∞)` otherwise.
//!
//! [`final_value_possible`] is the cheap check `rolex bench` uses for its
//! `verified` flag: the value read back at the end must be the value of
//! some write that no other write to that key strictly follows in real time.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A logical time from a [`Clock`].
pub type Time = u64;

/// A shared logical clock: each tick is unique and ordered consistently
/// with real time across threads.
#[derive(Debug)]
pub struct Clock(AtomicU64);

impl Clock {
    /// A clock whose first tick is 1 (0 is the initial state's time).
    pub fn new() -> Self {
        Clock(AtomicU64::new(1))
    }

    /// The next time. `SeqCst`: if one thread's tick happens before
    /// another's in real time, it is smaller.
    pub fn tick(&self) -> Time {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// An operation and its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// Read `key`.
    Get {
        /// The key.
        key: u64,
    },
    /// Set `key` to `value`, present or not (the store's `insert`).
    Insert {
        /// The key.
        key: u64,
        /// The value.
        value: u64,
    },
    /// Insert `key` if absent; no change if present.
    InsertIfAbsent {
        /// The key.
        key: u64,
        /// The value.
        value: u64,
    },
    /// Set `key` to `value` if present; no change if absent.
    Update {
        /// The key.
        key: u64,
        /// The value.
        value: u64,
    },
    /// Remove `key` if present.
    Delete {
        /// The key.
        key: u64,
    },
    /// Up to `n` entries with keys `>= from`, in key order.
    Scan {
        /// The smallest key wanted.
        from: u64,
        /// Most entries returned.
        n: usize,
    },
    /// Every entry with `lo <= key <= hi` (both bounds inclusive).
    Range {
        /// Smallest key.
        lo: u64,
        /// Largest key.
        hi: u64,
    },
}

impl Call {
    /// The key of a single-key operation.
    pub fn key(&self) -> Option<u64> {
        match *self {
            Call::Get { key }
            | Call::InsertIfAbsent { key, .. }
            | Call::Insert { key, .. }
            | Call::Update { key, .. }
            | Call::Delete { key } => Some(key),
            Call::Scan { .. } | Call::Range { .. } => None,
        }
    }
}

/// What an operation returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    /// A get's answer.
    Value(Option<u64>),
    /// Whether a write took effect: insert-if-absent → the key was absent;
    /// update and delete → the key was present; insert → the key was
    /// absent (new).
    Applied(bool),
    /// A write's view of the value before it (a stronger answer than
    /// [`Ret::Applied`], accepted by every write): what `KvSession`'s
    /// `insert`, `update` and `delete` return.
    Prior(Option<u64>),
    /// A scan's or range's entries.
    Entries(Vec<(u64, u64)>),
    /// The operation returned an error that says it did not take effect
    /// (any call): it changed nothing and answered nothing.
    Failed,
}

/// One operation of a history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The calling thread.
    pub thread: usize,
    /// The operation.
    pub call: Call,
    /// When it was invoked.
    pub invoke: Time,
    /// When it returned and what it returned; `None` if it never returned
    /// or failed without telling whether it took effect (then it may take
    /// effect at any point after `invoke`, or never).
    pub ret: Option<(Time, Ret)>,
}

/// Records one thread's operations against a shared [`Clock`].
#[derive(Debug)]
pub struct Recorder {
    thread: usize,
    clock: Arc<Clock>,
    records: Vec<Record>,
}

/// An invoked operation that has not been recorded as finished.
#[derive(Debug)]
#[must_use = "finish or abandon the operation"]
pub struct Invoked {
    call: Call,
    at: Time,
}

impl Recorder {
    /// A recorder for `thread`.
    pub fn new(thread: usize, clock: Arc<Clock>) -> Self {
        Recorder {
            thread,
            clock,
            records: Vec::new(),
        }
    }

    /// Marks `call` invoked now; call this right before issuing it.
    pub fn invoke(&mut self, call: Call) -> Invoked {
        Invoked {
            call,
            at: self.clock.tick(),
        }
    }

    /// Records that the operation returned `ret` now.
    pub fn finish(&mut self, op: Invoked, ret: Ret) {
        let t = self.clock.tick();
        self.push(op, Some((t, ret)));
    }

    /// Records that the operation's outcome is unknown (it failed after it
    /// may have taken effect).
    pub fn abandon(&mut self, op: Invoked) {
        self.push(op, None);
    }

    /// Records that the operation returned an error now that says it did
    /// not take effect ([`Ret::Failed`]).
    pub fn fail(&mut self, op: Invoked) {
        self.finish(op, Ret::Failed);
    }

    /// Records that the operation returned an error now:
    /// [`Recorder::abandon`] if the error says it may have taken effect
    /// (`KvError::may_have_applied`), else [`Recorder::fail`].
    pub fn error(&mut self, op: Invoked, may_have_applied: bool) {
        if may_have_applied {
            self.abandon(op);
        } else {
            self.fail(op);
        }
    }

    fn push(&mut self, op: Invoked, ret: Option<(Time, Ret)>) {
        self.records.push(Record {
            thread: self.thread,
            call: op.call,
            invoke: op.at,
            ret,
        });
    }

    /// The records so far.
    pub fn into_records(self) -> Vec<Record> {
        self.records
    }
}

/// Why a history is not one a correct store could produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// A record's answer does not fit its call (e.g. a get with entries),
    /// or it returned before it was invoked.
    Malformed {
        /// The record.
        record: Record,
        /// What is wrong.
        why: &'static str,
    },
    /// A key's single-key operations have no linearization.
    NotLinearizable {
        /// The key.
        key: u64,
        /// Its initial value.
        initial: Option<u64>,
        /// Its operations, in invocation order.
        ops: Vec<Record>,
    },
    /// A scan's or range's entries are not strictly increasing.
    Unsorted {
        /// The scan or range.
        record: Record,
    },
    /// A scan or range returned a key outside its bounds, or a scan more
    /// than `n` entries.
    OutOfBounds {
        /// The scan or range.
        record: Record,
        /// The offending key (the last one for too many entries).
        key: u64,
    },
    /// A scan or range returned a value its key cannot have held during it.
    ValueNeverHeld {
        /// The scan or range.
        record: Record,
        /// The key.
        key: u64,
        /// The value returned.
        value: u64,
    },
    /// A scan or range missed a key present throughout its interval.
    MissingKey {
        /// The scan or range.
        record: Record,
        /// The key present throughout but not returned.
        key: u64,
    },
}

/// Most operations a [`Violation::NotLinearizable`] prints.
const SHOW_OPS: usize = 40;

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Malformed { record, why } => {
                write!(f, "malformed record: {why}: {record:?}")
            }
            Violation::NotLinearizable { key, initial, ops } => {
                write!(
                    f,
                    "key {key}: its {} operations have no linearization (initial value {initial:?})",
                    ops.len()
                )?;
                for r in ops.iter().take(SHOW_OPS) {
                    let ret = match &r.ret {
                        Some((t, v)) => format!("ret {t} {v:?}"),
                        None => "outcome unknown".to_string(),
                    };
                    write!(
                        f,
                        "\n  thread {} [{}, {ret}] {:?}",
                        r.thread, r.invoke, r.call
                    )?;
                }
                if ops.len() > SHOW_OPS {
                    write!(f, "\n  … {} more", ops.len() - SHOW_OPS)?;
                }
                Ok(())
            }
            Violation::Unsorted { record } => {
                write!(f, "entries not strictly increasing: {record:?}")
            }
            Violation::OutOfBounds { record, key } => {
                write!(f, "key {key} outside the bounds or count: {record:?}")
            }
            Violation::ValueNeverHeld { record, key, value } => write!(
                f,
                "key {key} returned with value {value}, which it cannot have held then: {record:?}"
            ),
            Violation::MissingKey { record, key } => write!(
                f,
                "key {key} was present throughout but is missing from {record:?}"
            ),
        }
    }
}

impl std::error::Error for Violation {}

/// What a successful check covered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Keys whose sub-histories were linearized.
    pub keys: usize,
    /// Single-key operations.
    pub single_ops: usize,
    /// Scans and ranges.
    pub scans: usize,
    /// Configurations the search memoised, over all keys.
    pub configurations: usize,
}

/// A history: the initial contents and the records of every thread.
#[derive(Clone, Debug, Default)]
pub struct History {
    initial: BTreeMap<u64, u64>,
    records: Vec<Record>,
}

impl History {
    /// A history starting from `initial` contents.
    pub fn new(initial: impl IntoIterator<Item = (u64, u64)>) -> Self {
        History {
            initial: initial.into_iter().collect(),
            records: Vec::new(),
        }
    }

    /// Adds records (one thread's, or any).
    pub fn extend(&mut self, records: impl IntoIterator<Item = Record>) {
        self.records.extend(records);
    }

    /// The records.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// Checks every key's sub-history for linearizability and every scan
    /// and range as the module docs describe.
    pub fn check(&self) -> Result<Checked, Violation> {
        let mut per_key: BTreeMap<u64, Vec<&Record>> = BTreeMap::new();
        let mut scans = Vec::new();
        for r in &self.records {
            check_shape(r)?;
            match r.call.key() {
                Some(k) => per_key.entry(k).or_default().push(r),
                None => scans.push(r),
            }
        }
        let mut checked = Checked {
            keys: per_key.len(),
            single_ops: self.records.len() - scans.len(),
            scans: scans.len(),
            configurations: 0,
        };
        for (&key, ops) in &per_key {
            let initial = self.initial.get(&key).copied();
            match linearize_key(initial, ops) {
                Some(n) => checked.configurations += n,
                None => {
                    let mut ops: Vec<Record> = ops.iter().map(|r| (*r).clone()).collect();
                    ops.sort_by_key(|r| r.invoke);
                    return Err(Violation::NotLinearizable { key, initial, ops });
                }
            }
        }
        if !scans.is_empty() {
            let facts = KeyFacts::build(&self.initial, &per_key);
            for s in scans {
                check_scan(s, &facts)?;
            }
        }
        Ok(checked)
    }
}

fn check_shape(r: &Record) -> Result<(), Violation> {
    let Some((t, ret)) = &r.ret else {
        return Ok(());
    };
    let bad = |why| {
        Err(Violation::Malformed {
            record: r.clone(),
            why,
        })
    };
    if *t <= r.invoke {
        return bad("returned before it was invoked");
    }
    let fits = match r.call {
        _ if *ret == Ret::Failed => true,
        Call::Get { .. } => matches!(ret, Ret::Value(_)),
        Call::InsertIfAbsent { .. }
        | Call::Insert { .. }
        | Call::Update { .. }
        | Call::Delete { .. } => {
            matches!(ret, Ret::Applied(_) | Ret::Prior(_))
        }
        Call::Scan { .. } | Call::Range { .. } => matches!(ret, Ret::Entries(_)),
    };
    if fits {
        Ok(())
    } else {
        bad("the answer's kind does not fit the call")
    }
}

/// The model's step: the state after `call` from `state`, if `ret` (None =
/// unknown) is what the sequential model answers.
fn step(state: Option<u64>, call: Call, ret: Option<&Ret>) -> Option<Option<u64>> {
    if ret == Some(&Ret::Failed) {
        return Some(state);
    }
    let (applies, next) = match call {
        Call::Get { .. } => {
            return match ret {
                None => Some(state),
                Some(Ret::Value(v)) => (*v == state).then_some(state),
                Some(_) => None,
            }
        }
        Call::InsertIfAbsent { value, .. } => (state.is_none(), Some(value)),
        Call::Insert { value, .. } => (state.is_none(), Some(value)),
        Call::Update { value, .. } => (state.is_some(), Some(value)),
        Call::Delete { .. } => (state.is_some(), None),
        Call::Scan { .. } | Call::Range { .. } => return None,
    };
    let after = if applies || matches!(call, Call::Insert { .. }) {
        next
    } else {
        state
    };
    let ok = match ret {
        None => true,
        Some(Ret::Applied(a)) => *a == applies,
        Some(Ret::Prior(p)) => *p == state,
        Some(_) => false,
    };
    ok.then_some(after)
}

/// An event of one key's sub-history: the invocation or the return of op.
#[derive(Clone, Copy, Debug)]
struct Event {
    op: usize,
    call: bool,
}

/// Searches one key's sub-history for a linearization; returns the number
/// of memoised configurations, or `None` if there is none.
fn linearize_key(initial: Option<u64>, records: &[&Record]) -> Option<usize> {
    // Bit order: completed ops by invocation, then ops that never returned
    // (so those rarely disturb the canonical "first unlinearized" prefix).
    let mut ops: Vec<&Record> = records.to_vec();
    ops.sort_by_key(|r| (r.ret.is_none(), r.invoke));
    let n = ops.len();
    let ret_time = |r: &Record| r.ret.as_ref().map_or(Time::MAX, |(t, _)| *t);

    // Events in time order. Ticks are unique, so only the never-returned
    // ops tie (at Time::MAX); their order among themselves is irrelevant.
    let mut events: Vec<(Time, Event)> = Vec::with_capacity(2 * n);
    for (i, r) in ops.iter().enumerate() {
        events.push((r.invoke, Event { op: i, call: true }));
        events.push((ret_time(r), Event { op: i, call: false }));
    }
    events.sort_by_key(|&(t, e)| (t, !e.call, e.op));
    // Doubly linked list over events; index 0 is the head sentinel.
    let len = events.len() + 1;
    let mut next: Vec<usize> = (1..=len).collect();
    let mut prev: Vec<usize> = (0..len).map(|i| i.wrapping_sub(1)).collect();
    next[len - 1] = 0;
    prev[0] = len - 1;
    let end = 0;
    let mut call_at = vec![0; n];
    let mut ret_at = vec![0; n];
    for (i, &(_, e)) in events.iter().enumerate() {
        if e.call {
            call_at[e.op] = i + 1;
        } else {
            ret_at[e.op] = i + 1;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = q;
        prev[q] = p;
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = i;
        prev[q] = i;
    };

    let mut lin = LinSet::new(n);
    let mut memo: HashSet<(Vec<u64>, usize, Option<u64>)> = HashSet::new();
    let mut stack: Vec<(usize, Option<u64>)> = Vec::new();
    let mut state = initial;
    let mut cur = next[0];
    loop {
        if cur == end {
            return Some(memo.len());
        }
        let e = events[cur - 1].1;
        let r = ops[e.op];
        if e.call {
            let ret = r.ret.as_ref().map(|(_, v)| v);
            if let Some(after) = step(state, r.call, ret) {
                lin.set(e.op);
                if memo.insert(lin.canonical(after)) {
                    stack.push((e.op, state));
                    state = after;
                    unlink(&mut next, &mut prev, call_at[e.op]);
                    unlink(&mut next, &mut prev, ret_at[e.op]);
                    cur = next[0];
                    continue;
                }
                lin.clear(e.op);
            }
            cur = next[cur];
        } else {
            if r.ret.is_none() {
                // Only never-returned ops are left: they may never take effect.
                return Some(memo.len());
            }
            let (op, before) = stack.pop()?;
            state = before;
            lin.clear(op);
            relink(&mut next, &mut prev, ret_at[op]);
            relink(&mut next, &mut prev, call_at[op]);
            cur = next[call_at[op]];
        }
    }
}

/// The set of linearized ops as a bit set, with the first unset bit
/// (`low`) and the stack of highest set bits kept up to date so that the
/// canonical form is cheap: `(words from low's word up to the highest set
/// bit, low, state)`.
struct LinSet {
    bits: Vec<u64>,
    low: usize,
    highs: Vec<usize>,
}

impl LinSet {
    fn new(n: usize) -> Self {
        LinSet {
            bits: vec![0; n.div_ceil(64).max(1)],
            low: 0,
            highs: Vec::new(),
        }
    }

    fn get(&self, i: usize) -> bool {
        self.bits
            .get(i / 64)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// Ops are set and cleared in stack order (set = push, clear = pop).
    fn set(&mut self, i: usize) {
        self.bits[i / 64] |= 1 << (i % 64);
        let high = self.highs.last().map_or(i, |&h| h.max(i));
        self.highs.push(high);
        while self.get(self.low) {
            self.low += 1;
        }
    }

    fn clear(&mut self, i: usize) {
        self.bits[i / 64] &= !(1 << (i % 64));
        self.highs.pop();
        self.low = self.low.min(i);
    }

    fn canonical(&self, state: Option<u64>) -> (Vec<u64>, usize, Option<u64>) {
        let first = self.low / 64;
        if first >= self.bits.len() {
            // Everything is linearized: `low` alone says so.
            return (Vec::new(), self.low, state);
        }
        let last = self.highs.last().map_or(first, |&h| (h / 64).max(first));
        let mut words = self.bits[first..=last.min(self.bits.len() - 1)].to_vec();
        // Bits below `low` are all set by definition: mask them out so the
        // key depends only on the set.
        words[0] &= !((1u64 << (self.low % 64)) - 1);
        (words, self.low, state)
    }
}

/// Per-key facts the scan checks use, gathered from the single-key ops.
#[derive(Default)]
struct KeyFacts {
    keys: BTreeMap<u64, Facts>,
}

#[derive(Default)]
struct Facts {
    /// Writes that set a value and may have taken effect: (invoke, return
    /// or MAX, value). The initial value is (0, 0, v).
    sets: Vec<(Time, Time, u64)>,
    /// Writes that certainly changed the state: (invoke, return).
    changes: Vec<(Time, Time)>,
    /// Deletes that may have taken effect: (invoke, return or MAX).
    removes: Vec<(Time, Time)>,
    /// Ops that certainly saw or made the key present at their
    /// linearization point: (invoke, return).
    present: Vec<(Time, Time)>,
}

impl KeyFacts {
    fn build(initial: &BTreeMap<u64, u64>, per_key: &BTreeMap<u64, Vec<&Record>>) -> Self {
        let mut keys: BTreeMap<u64, Facts> = BTreeMap::new();
        for (&k, &v) in initial {
            let f = keys.entry(k).or_default();
            f.sets.push((0, 0, v));
            f.present.push((0, 0));
        }
        for (&k, ops) in per_key {
            let f = keys.entry(k).or_default();
            for r in ops {
                let (ret_t, ret) = match &r.ret {
                    // It did nothing: no fact about the key.
                    Some((_, Ret::Failed)) => continue,
                    Some((t, v)) => (*t, Some(v)),
                    None => (Time::MAX, None),
                };
                let span = (r.invoke, ret_t);
                // Some(true) = took effect, Some(false) = did not, None = unknown.
                let effect = |absent_applies: bool| match ret {
                    Some(Ret::Applied(a)) => Some(*a),
                    Some(Ret::Prior(p)) => Some(p.is_none() == absent_applies),
                    _ => None,
                };
                match r.call {
                    Call::Get { .. } => {
                        if let Some(Ret::Value(Some(_))) = ret {
                            f.present.push(span);
                        }
                    }
                    Call::InsertIfAbsent { value, .. } | Call::Update { value, .. } => {
                        let absent_applies = matches!(r.call, Call::InsertIfAbsent { .. });
                        match effect(absent_applies) {
                            Some(true) => {
                                f.sets.push((span.0, span.1, value));
                                f.changes.push(span);
                                f.present.push(span);
                            }
                            // A refused insert saw the key present.
                            Some(false) if absent_applies => f.present.push(span),
                            Some(false) => {}
                            None => f.sets.push((span.0, span.1, value)),
                        }
                    }
                    Call::Insert { value, .. } => {
                        f.sets.push((span.0, span.1, value));
                        if ret.is_some() {
                            f.changes.push(span);
                            f.present.push(span);
                        }
                    }
                    Call::Delete { .. } => match effect(false) {
                        Some(true) => {
                            f.changes.push(span);
                            f.removes.push(span);
                        }
                        Some(false) => {}
                        None => f.removes.push(span),
                    },
                    Call::Scan { .. } | Call::Range { .. } => {}
                }
            }
        }
        KeyFacts { keys }
    }
}

impl Facts {
    /// May the key have held `value` at some point in `[inv, ret]`?
    fn may_hold(&self, value: u64, inv: Time, ret: Time) -> bool {
        self.sets.iter().any(|&(s_inv, s_ret, v)| {
            v == value
                && s_inv < ret
                && !self
                    .changes
                    .iter()
                    .any(|&(c_inv, c_ret)| c_inv > s_ret && c_ret < inv)
        })
    }

    /// Was the key certainly present during all of `[inv, ret]`?
    fn present_throughout(&self, inv: Time, ret: Time) -> bool {
        // The witness that returned last before `inv` leaves the least room
        // for a delete; pick the one invoked latest.
        let Some(w_inv) = self
            .present
            .iter()
            .filter(|&&(_, w_ret)| w_ret < inv)
            .map(|&(w_inv, _)| w_inv)
            .max()
        else {
            return false;
        };
        !self
            .removes
            .iter()
            .any(|&(d_inv, d_ret)| d_ret > w_inv && d_inv < ret)
    }
}

fn check_scan(r: &Record, facts: &KeyFacts) -> Result<(), Violation> {
    let Some((ret_t, Ret::Entries(entries))) = &r.ret else {
        return Ok(());
    };
    let (inv, ret_t) = (r.invoke, *ret_t);
    if entries.windows(2).any(|w| w[0].0 >= w[1].0) {
        return Err(Violation::Unsorted { record: r.clone() });
    }
    let out = |key| {
        Err(Violation::OutOfBounds {
            record: r.clone(),
            key,
        })
    };
    // The span of keys whose presence the result vouches for.
    let (lo, hi) = match r.call {
        Call::Scan { from, n } => {
            if entries.len() > n {
                return out(entries[entries.len() - 1].0);
            }
            if let Some(&(k, _)) = entries.iter().find(|(k, _)| *k < from) {
                return out(k);
            }
            let hi = if entries.len() == n {
                entries.last().map_or(from, |e| e.0)
            } else {
                u64::MAX
            };
            (from, hi)
        }
        Call::Range { lo, hi } => {
            if let Some(&(k, _)) = entries.iter().find(|(k, _)| *k < lo || *k > hi) {
                return out(k);
            }
            (lo, hi)
        }
        _ => return Ok(()),
    };
    for &(k, v) in entries {
        let holds = facts
            .keys
            .get(&k)
            .is_some_and(|f| f.may_hold(v, inv, ret_t));
        if !holds {
            return Err(Violation::ValueNeverHeld {
                record: r.clone(),
                key: k,
                value: v,
            });
        }
    }
    if lo > hi || (matches!(r.call, Call::Scan { n: 0, .. })) {
        return Ok(());
    }
    let returned: HashMap<u64, u64> = entries.iter().copied().collect();
    for (&k, f) in facts.keys.range(lo..=hi) {
        if !returned.contains_key(&k) && f.present_throughout(inv, ret_t) {
            return Err(Violation::MissingKey {
                record: r.clone(),
                key: k,
            });
        }
    }
    Ok(())
}

/// One write to a key as `rolex bench` keeps it: when it was invoked and
/// returned (any clock that orders real time, e.g. nanoseconds since a
/// shared start) and the value it left (`None` for a delete).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedWrite {
    /// When it was invoked.
    pub invoke: u64,
    /// When it returned.
    pub ret: u64,
    /// The value it wrote, `None` if it deleted the key.
    pub value: Option<u64>,
}

/// Whether `final_value` (the key read back after every operation
/// finished) is a state a linearizable execution could end in, given the
/// key's value before the run and the writes that returned success on it
/// (writes that failed determinately are left out; those whose outcome is
/// unknown go to [`final_value_possible_with`]).
///
/// With no writes the key must still hold `initial`. Otherwise the last
/// write in some linearization is one that no other write strictly follows
/// in real time (`w.ret < w2.invoke`); the final value must be the value of
/// one of those. Writes of one thread never overlap, so it is enough to pass
/// each thread's last write to the key.
pub fn final_value_possible(
    initial: Option<u64>,
    writes: &[TimedWrite],
    final_value: Option<u64>,
) -> bool {
    let Some(latest_invoke) = writes.iter().map(|w| w.invoke).max() else {
        return final_value == initial;
    };
    writes
        .iter()
        .any(|w| w.ret >= latest_invoke && w.value == final_value)
}

/// A write to a key whose outcome is unknown (it returned an error that
/// says it may have taken effect): it may have taken effect at any point
/// after `invoke`, or never.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaybeWrite {
    /// When it was invoked.
    pub invoke: u64,
    /// The value it wrote, `None` if it deleted the key.
    pub value: Option<u64>,
}

/// [`final_value_possible`] with writes of unknown outcome too: each may be
/// the last write of the linearization (it may take effect after
/// everything else), or may never have taken effect — so the final value
/// is possible if one of them wrote it, or if it is possible from the
/// writes that returned alone (a `maybe` write that took effect before
/// the last of those changes nothing at the end).
pub fn final_value_possible_with(
    initial: Option<u64>,
    writes: &[TimedWrite],
    maybe: &[MaybeWrite],
    final_value: Option<u64>,
) -> bool {
    maybe.iter().any(|w| w.value == final_value)
        || final_value_possible(initial, writes, final_value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A record from explicit times.
    fn rec(thread: usize, call: Call, inv: Time, ret: Time, r: Ret) -> Record {
        Record {
            thread,
            call,
            invoke: inv,
            ret: Some((ret, r)),
        }
    }

    fn get(k: u64) -> Call {
        Call::Get { key: k }
    }
    fn ins(k: u64, v: u64) -> Call {
        Call::InsertIfAbsent { key: k, value: v }
    }
    fn upd(k: u64, v: u64) -> Call {
        Call::Update { key: k, value: v }
    }
    fn del(k: u64) -> Call {
        Call::Delete { key: k }
    }

    fn check(initial: &[(u64, u64)], recs: Vec<Record>) -> Result<Checked, Violation> {
        let mut h = History::new(initial.iter().copied());
        h.extend(recs);
        h.check()
    }

    #[test]
    fn sequential_history_is_linearizable() {
        let recs = vec![
            rec(0, ins(1, 10), 1, 2, Ret::Applied(true)),
            rec(0, get(1), 3, 4, Ret::Value(Some(10))),
            rec(0, upd(1, 11), 5, 6, Ret::Prior(Some(10))),
            rec(0, del(1), 7, 8, Ret::Applied(true)),
            rec(0, get(1), 9, 10, Ret::Value(None)),
            rec(0, upd(1, 12), 11, 12, Ret::Applied(false)),
        ];
        let c = check(&[], recs).unwrap();
        assert_eq!((c.keys, c.single_ops), (1, 6));
    }

    #[test]
    fn concurrent_read_may_see_either_value() {
        // Update [1, 10] overlaps both reads: old then new is fine.
        let ok = vec![
            rec(0, upd(1, 2), 1, 10, Ret::Applied(true)),
            rec(1, get(1), 2, 3, Ret::Value(Some(1))),
            rec(1, get(1), 4, 5, Ret::Value(Some(2))),
        ];
        check(&[(1, 1)], ok).unwrap();
        // New then old is not: once a read saw 2, the update took effect.
        let bad = vec![
            rec(0, upd(1, 2), 1, 10, Ret::Applied(true)),
            rec(1, get(1), 2, 3, Ret::Value(Some(2))),
            rec(1, get(1), 4, 5, Ret::Value(Some(1))),
        ];
        assert!(matches!(
            check(&[(1, 1)], bad),
            Err(Violation::NotLinearizable { key: 1, .. })
        ));
    }

    #[test]
    fn stale_read_after_completed_write_is_caught() {
        let recs = vec![
            rec(0, upd(5, 50), 1, 2, Ret::Applied(true)),
            rec(1, get(5), 3, 4, Ret::Value(Some(5))),
        ];
        assert!(matches!(
            check(&[(5, 5)], recs),
            Err(Violation::NotLinearizable { key: 5, .. })
        ));
    }

    #[test]
    fn lost_update_is_caught() {
        // Two updates complete one after the other; a later read sees the
        // first: the second was lost.
        let recs = vec![
            rec(0, upd(7, 1), 1, 2, Ret::Applied(true)),
            rec(1, upd(7, 2), 3, 4, Ret::Applied(true)),
            rec(0, get(7), 5, 6, Ret::Value(Some(1))),
        ];
        assert!(check(&[(7, 0)], recs).is_err());
        // Two concurrent inserts of an absent key cannot both succeed.
        let recs = vec![
            rec(0, ins(8, 1), 1, 4, Ret::Applied(true)),
            rec(1, ins(8, 2), 2, 3, Ret::Applied(true)),
        ];
        assert!(check(&[], recs).is_err());
        // …but one may fail.
        let recs = vec![
            rec(0, ins(8, 1), 1, 4, Ret::Applied(true)),
            rec(1, ins(8, 2), 2, 3, Ret::Applied(false)),
            rec(1, get(8), 5, 6, Ret::Value(Some(1))),
        ];
        check(&[], recs).unwrap();
    }

    #[test]
    fn value_never_written_is_caught() {
        let recs = vec![
            rec(0, upd(3, 30), 1, 5, Ret::Applied(true)),
            rec(1, get(3), 2, 4, Ret::Value(Some(99))),
        ];
        assert!(check(&[(3, 3)], recs).is_err());
    }

    #[test]
    fn wrong_write_answers_are_caught() {
        // Update of an absent key claims success.
        let recs = vec![rec(0, upd(1, 1), 1, 2, Ret::Applied(true))];
        assert!(check(&[], recs).is_err());
        // Delete reports a prior value the key never had.
        let recs = vec![rec(0, del(1), 1, 2, Ret::Prior(Some(4)))];
        assert!(check(&[(1, 3)], recs).is_err());
    }

    #[test]
    fn unreturned_write_may_or_may_not_take_effect() {
        let pending = |t| Record {
            thread: 0,
            call: upd(1, 2),
            invoke: t,
            ret: None,
        };
        for seen in [1, 2] {
            let recs = vec![pending(1), rec(1, get(1), 2, 3, Ret::Value(Some(seen)))];
            check(&[(1, 1)], recs).unwrap();
        }
        // But not before it was invoked.
        let recs = vec![rec(1, get(1), 2, 3, Ret::Value(Some(2))), pending(4)];
        assert!(check(&[(1, 1)], recs).is_err());
    }

    #[test]
    fn malformed_records_are_rejected() {
        let recs = vec![rec(0, get(1), 1, 2, Ret::Applied(true))];
        assert!(matches!(check(&[], recs), Err(Violation::Malformed { .. })));
        let recs = vec![rec(0, get(1), 3, 2, Ret::Value(None))];
        assert!(matches!(check(&[], recs), Err(Violation::Malformed { .. })));
    }

    fn scan(from: u64, n: usize) -> Call {
        Call::Scan { from, n }
    }

    #[test]
    fn scans_are_checked() {
        let init = [(1, 10), (2, 20), (3, 30), (4, 40)];
        let ok = vec![rec(
            0,
            scan(2, 2),
            1,
            2,
            Ret::Entries(vec![(2, 20), (3, 30)]),
        )];
        check(&init, ok).unwrap();
        // Missing key 3, present throughout.
        let missing = vec![rec(
            0,
            scan(2, 2),
            1,
            2,
            Ret::Entries(vec![(2, 20), (4, 40)]),
        )];
        assert!(matches!(
            check(&init, missing),
            Err(Violation::MissingKey { key: 3, .. })
        ));
        // Fewer than n entries: the scan claims the end; key 4 is missing.
        let short = vec![rec(0, scan(3, 5), 1, 2, Ret::Entries(vec![(3, 30)]))];
        assert!(matches!(
            check(&init, short),
            Err(Violation::MissingKey { key: 4, .. })
        ));
        let unsorted = vec![rec(
            0,
            scan(1, 2),
            1,
            2,
            Ret::Entries(vec![(2, 20), (1, 10)]),
        )];
        assert!(matches!(
            check(&init, unsorted),
            Err(Violation::Unsorted { .. })
        ));
        let too_many = vec![rec(
            0,
            scan(1, 1),
            1,
            2,
            Ret::Entries(vec![(1, 10), (2, 20)]),
        )];
        assert!(matches!(
            check(&init, too_many),
            Err(Violation::OutOfBounds { .. })
        ));
        let below = vec![rec(0, scan(2, 1), 1, 2, Ret::Entries(vec![(1, 10)]))];
        assert!(matches!(
            check(&init, below),
            Err(Violation::OutOfBounds { .. })
        ));
        let range_out = vec![rec(
            0,
            Call::Range { lo: 1, hi: 2 },
            1,
            2,
            Ret::Entries(vec![(1, 10), (2, 20), (3, 30)]),
        )];
        assert!(matches!(
            check(&init, range_out),
            Err(Violation::OutOfBounds { key: 3, .. })
        ));
        let bad_value = vec![rec(0, scan(1, 1), 1, 2, Ret::Entries(vec![(1, 11)]))];
        assert!(matches!(
            check(&init, bad_value),
            Err(Violation::ValueNeverHeld { key: 1, .. })
        ));
    }

    #[test]
    fn scans_tolerate_concurrent_writes() {
        let init = [(1, 10), (2, 20), (3, 30)];
        // Delete of 2 and update of 3 overlap the scan: both outcomes fine.
        for entries in [
            vec![(1, 10), (2, 20), (3, 30)],
            vec![(1, 10), (3, 31)],
            vec![(1, 10), (2, 20), (3, 31)],
        ] {
            let recs = vec![
                rec(1, del(2), 2, 8, Ret::Applied(true)),
                rec(2, upd(3, 31), 3, 7, Ret::Applied(true)),
                rec(0, scan(1, 10), 1, 9, Ret::Entries(entries)),
            ];
            check(&init, recs).unwrap();
        }
        // A delete that finished before the scan began: key 2 must be gone.
        let recs = vec![
            rec(1, del(2), 1, 2, Ret::Applied(true)),
            rec(
                0,
                scan(1, 10),
                3,
                4,
                Ret::Entries(vec![(1, 10), (2, 20), (3, 30)]),
            ),
        ];
        assert!(matches!(
            check(&init, recs),
            Err(Violation::ValueNeverHeld { key: 2, .. })
        ));
        // A key inserted before the scan began must be there.
        let recs = vec![
            rec(1, ins(5, 50), 1, 2, Ret::Applied(true)),
            rec(0, scan(4, 10), 3, 4, Ret::Entries(vec![])),
        ];
        assert!(matches!(
            check(&init, recs),
            Err(Violation::MissingKey { key: 5, .. })
        ));
    }

    #[test]
    fn an_error_is_recorded_as_failed_or_unknown() {
        let clock = Arc::new(Clock::new());
        let mut r = Recorder::new(3, clock);
        let op = r.invoke(ins(1, 10));
        r.error(op, false);
        let op = r.invoke(del(1));
        r.error(op, true);
        let recs = r.into_records();
        assert!(matches!(recs[0].ret, Some((_, Ret::Failed))));
        assert_eq!(recs[1].ret, None);
        assert_eq!(recs[1].thread, 3);
    }

    #[test]
    fn a_failed_write_never_takes_effect() {
        let init = [(1, 10)];
        // The failed update returned before the get began: 11 was never
        // written.
        let failed = |then: Ret| {
            vec![
                rec(0, upd(1, 11), 1, 2, Ret::Failed),
                rec(1, get(1), 3, 4, then),
            ]
        };
        check(&init, failed(Ret::Value(Some(10)))).unwrap();
        assert!(matches!(
            check(&init, failed(Ret::Value(Some(11)))),
            Err(Violation::NotLinearizable { key: 1, .. })
        ));
        // The same write with an unknown outcome may have taken effect, or
        // not.
        for seen in [10, 11] {
            let recs = vec![
                Record {
                    thread: 0,
                    call: upd(1, 11),
                    invoke: 1,
                    ret: None,
                },
                rec(1, get(1), 3, 4, Ret::Value(Some(seen))),
            ];
            check(&init, recs).unwrap();
        }
        // A failed delete does not remove the key, for gets and scans.
        let recs = vec![
            rec(0, del(1), 1, 2, Ret::Failed),
            rec(1, scan(0, 5), 3, 4, Ret::Entries(vec![])),
        ];
        assert!(matches!(
            check(&init, recs),
            Err(Violation::MissingKey { key: 1, .. })
        ));
        // Nor does a scan see a failed insert's value.
        let recs = vec![
            rec(0, Call::Insert { key: 2, value: 20 }, 1, 2, Ret::Failed),
            rec(1, scan(0, 5), 3, 4, Ret::Entries(vec![(1, 10), (2, 20)])),
        ];
        assert!(matches!(
            check(&init, recs),
            Err(Violation::ValueNeverHeld { key: 2, .. })
        ));
        // A failed get or scan answers nothing and constrains nothing.
        let recs = vec![
            rec(0, get(1), 1, 2, Ret::Failed),
            rec(0, scan(0, 5), 3, 4, Ret::Failed),
        ];
        let c = check(&init, recs).unwrap();
        assert_eq!((c.single_ops, c.scans), (1, 1));
    }

    #[test]
    fn final_value_with_unknown_outcomes() {
        let w = |invoke, ret, value| TimedWrite { invoke, ret, value };
        let m = |invoke, value| MaybeWrite { invoke, value };
        // A write of unknown outcome may be last, or may never have landed.
        let done = [w(1, 2, Some(5))];
        let maybe = [m(3, Some(6))];
        assert!(final_value_possible_with(None, &done, &maybe, Some(6)));
        assert!(final_value_possible_with(None, &done, &maybe, Some(5)));
        assert!(!final_value_possible_with(None, &done, &maybe, None));
        // With no write that returned, the initial value stays possible.
        assert!(final_value_possible_with(Some(1), &[], &maybe, Some(1)));
        assert!(final_value_possible_with(Some(1), &[], &[m(1, None)], None));
        assert!(!final_value_possible_with(Some(1), &[], &maybe, Some(2)));
    }

    #[test]
    fn final_value_check() {
        let w = |invoke, ret, value| TimedWrite { invoke, ret, value };
        assert!(final_value_possible(Some(1), &[], Some(1)));
        assert!(!final_value_possible(Some(1), &[], Some(2)));
        // Sequential writes: only the last counts.
        let seq = [w(1, 2, Some(5)), w(3, 4, Some(6))];
        assert!(final_value_possible(Some(1), &seq, Some(6)));
        assert!(!final_value_possible(Some(1), &seq, Some(5)));
        assert!(!final_value_possible(Some(1), &seq, Some(1)));
        // Concurrent writes: either may be last.
        let conc = [w(1, 4, Some(5)), w(2, 3, Some(6))];
        assert!(final_value_possible(None, &conc, Some(5)));
        assert!(final_value_possible(None, &conc, Some(6)));
        assert!(!final_value_possible(None, &conc, None));
        // A last delete: absent.
        let d = [w(1, 2, Some(5)), w(3, 4, None)];
        assert!(final_value_possible(None, &d, None));
    }

    /// A simulated run: initial contents, records, final contents.
    type Simulated = (Vec<(u64, u64)>, Vec<Record>, BTreeMap<u64, u64>);

    /// A linearizable history by construction: threads run ops one after
    /// another with random durations; each op takes effect at a random
    /// point inside its interval, and its answer comes from the model
    /// applied in that order.
    fn simulate(
        seed: u64,
        threads: usize,
        ops_per_thread: usize,
        keys: u64,
        scans: bool,
    ) -> Simulated {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let initial: Vec<(u64, u64)> = (0..keys).step_by(2).map(|k| (k, k + 1000)).collect();
        // Draw every op's interval and linearization point first.
        struct Planned {
            thread: usize,
            call: Call,
            inv: Time,
            ret: Time,
            at: Time,
        }
        let mut planned = Vec::new();
        let mut value = 1_000_000;
        for t in 0..threads {
            let mut now: Time = rng.gen_range(1..20);
            for _ in 0..ops_per_thread {
                let inv = now * 4 * threads as u64 + t as u64;
                let dur = rng.gen_range(1..30);
                let ret = (now + dur) * 4 * threads as u64 + t as u64;
                let at = rng.gen_range(inv * 2 + 1..ret * 2);
                let key = rng.gen_range(0..keys);
                value += 1;
                let call = match rng.gen_range(0..if scans { 6 } else { 5 }) {
                    0 => get(key),
                    1 => ins(key, value),
                    2 => upd(key, value),
                    3 => del(key),
                    4 => Call::Insert { key, value },
                    _ => scan(key, rng.gen_range(0..4)),
                };
                planned.push(Planned {
                    thread: t,
                    call,
                    inv,
                    ret,
                    at,
                });
                now += dur + rng.gen_range(1..5);
            }
        }
        planned.sort_by_key(|p| p.at);
        let mut model: BTreeMap<u64, u64> = initial.iter().copied().collect();
        let mut recs = Vec::new();
        for p in planned {
            let r = match p.call {
                Call::Get { key } => Ret::Value(model.get(&key).copied()),
                Call::InsertIfAbsent { key, value } => {
                    let had = model.contains_key(&key);
                    if !had {
                        model.insert(key, value);
                    }
                    Ret::Applied(!had)
                }
                Call::Insert { key, value } => Ret::Prior(model.insert(key, value)),
                Call::Update { key, value } => match model.get_mut(&key) {
                    Some(v) => Ret::Prior(Some(std::mem::replace(v, value))),
                    None => Ret::Prior(None),
                },
                Call::Delete { key } => Ret::Applied(model.remove(&key).is_some()),
                Call::Scan { from, n } => {
                    Ret::Entries(model.range(from..).take(n).map(|(&k, &v)| (k, v)).collect())
                }
                Call::Range { lo, hi } => {
                    Ret::Entries(model.range(lo..=hi).map(|(&k, &v)| (k, v)).collect())
                }
            };
            recs.push(rec(p.thread, p.call, p.inv, p.ret, r));
        }
        (initial, recs, model)
    }

    #[test]
    fn long_simulated_history_is_accepted_quickly() {
        // 40,000 single-key ops over 8 keys from 8 threads.
        let (init, recs, last) = simulate(42, 8, 5_000, 8, false);
        let c = check(&init, recs.clone()).unwrap();
        assert_eq!(c.single_ops, 40_000);
        // Plant a stale read at the very end: the search must exhaust the
        // key's whole history before it can say no.
        let end = recs
            .iter()
            .filter_map(|r| r.ret.as_ref())
            .map(|r| r.0)
            .max()
            .unwrap();
        let (&k, &v) = last.iter().next().expect("some key is present at the end");
        let mut h = recs;
        h.push(rec(9, upd(k, 1), end + 1, end + 2, Ret::Applied(true)));
        h.push(rec(9, get(k), end + 3, end + 4, Ret::Value(Some(v))));
        assert!(matches!(
            check(&init, h),
            Err(Violation::NotLinearizable { key, .. }) if key == k
        ));
    }

    /// Brute force: is there an order of the completed ops plus some of the
    /// never-returned ones, respecting real time, that the model accepts?
    fn brute_force(initial: Option<u64>, recs: &[Record]) -> bool {
        fn go(state: Option<u64>, recs: &[Record], used: &mut Vec<bool>) -> bool {
            let must_left = recs
                .iter()
                .zip(used.iter())
                .any(|(r, &u)| !u && r.ret.is_some());
            if !must_left {
                return true;
            }
            for i in 0..recs.len() {
                if used[i] {
                    continue;
                }
                // i can go next only if no unused op returned before i began.
                let blocked = recs
                    .iter()
                    .zip(used.iter())
                    .any(|(o, &u)| !u && o.ret.as_ref().is_some_and(|(t, _)| *t < recs[i].invoke));
                if blocked {
                    continue;
                }
                let ret = recs[i].ret.as_ref().map(|(_, v)| v);
                if let Some(next) = step(state, recs[i].call, ret) {
                    used[i] = true;
                    if go(next, recs, used) {
                        return true;
                    }
                    used[i] = false;
                }
            }
            false
        }
        go(initial, recs, &mut vec![false; recs.len()])
    }

    /// A small random single-key history: answers from the model applied
    /// at random points inside the intervals (linearizable), then maybe one
    /// answer replaced by a random one (often not linearizable).
    fn arb_small_history() -> impl Strategy<Value = (Option<u64>, Vec<Record>)> {
        let vals = prop_oneof![Just(None), (1u64..4).prop_map(Some)];
        let call = (0u8..5, 1u64..4).prop_map(|(c, v)| match c {
            0 => get(0),
            1 => ins(0, v),
            2 => upd(0, v),
            3 => del(0),
            _ => Call::Insert { key: 0, value: v },
        });
        // (call, gap, duration, point inside in 1/8ths, pending, Prior answer)
        let op = (call, 1u64..6, 1u64..6, 1u64..8, 0u8..8, any::<bool>());
        let thread = prop::collection::vec(op, 1..4);
        let mutation =
            prop::option::of((any::<prop::sample::Index>(), any::<bool>(), vals.clone()));
        (vals, prop::collection::vec(thread, 1..4), mutation).prop_map(
            |(init, threads, mutation)| {
                let mut planned = Vec::new();
                for (t, ops) in threads.into_iter().enumerate() {
                    let mut now = 1u64;
                    for (call, gap, dur, point, pend, prior) in ops {
                        let inv = (now + gap) * 64 + t as u64;
                        let end = (now + gap + dur) * 64 + t as u64;
                        let at = inv + (end - inv) * point / 8;
                        now += gap + dur;
                        planned.push((at, t, call, inv, end, pend, prior));
                        if pend == 0 {
                            break;
                        }
                    }
                }
                planned.sort_by_key(|p| p.0);
                let mut state = init;
                let mut recs = Vec::new();
                for (_, t, call, inv, end, pend, prior) in planned {
                    // 0: never returned; 1: failed, did not take effect.
                    let (pending, failed) = (pend == 0, pend == 1);
                    let before = state;
                    let applies = match call {
                        Call::Get { .. } => false,
                        Call::InsertIfAbsent { .. } | Call::Insert { .. } => before.is_none(),
                        _ => before.is_some(),
                    };
                    let answer = match call {
                        Call::Get { .. } => Ret::Value(before),
                        _ if prior => Ret::Prior(before),
                        _ => Ret::Applied(applies),
                    };
                    // A never-returned op takes effect here or not at all.
                    if (!pending || prior) && !failed {
                        state = step(before, call, Some(&answer)).expect("model answer");
                    }
                    let answer = if failed { Ret::Failed } else { answer };
                    let ret = (!pending).then_some((end, answer));
                    recs.push(Record {
                        thread: t,
                        call,
                        invoke: inv,
                        ret,
                    });
                }
                if let Some((i, applied, v)) = mutation {
                    let i = i.index(recs.len());
                    if let Some((t, old)) = recs[i].ret.clone() {
                        let new = match (&old, applied) {
                            (Ret::Value(_), _) => Ret::Value(v),
                            (_, true) => Ret::Applied(v.is_some()),
                            _ => Ret::Prior(v),
                        };
                        recs[i].ret = Some((t, new));
                    }
                }
                (init, recs)
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// The search agrees with brute force on small histories, both
        /// linearizable and not.
        #[test]
        fn search_agrees_with_brute_force((init, recs) in arb_small_history()) {
            let refs: Vec<&Record> = recs.iter().collect();
            let fast = linearize_key(init, &refs).is_some();
            prop_assert_eq!(fast, brute_force(init, &recs));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Histories linearizable by construction are accepted.
        #[test]
        fn simulated_histories_are_accepted(seed in any::<u64>(), threads in 1usize..6) {
            let (init, recs, _) = simulate(seed, threads, 40, 6, true);
            prop_assert!(check(&init, recs).is_ok());
        }

        /// A get that answers a value no one wrote is always caught.
        #[test]
        fn planted_foreign_value_is_caught(seed in any::<u64>(), threads in 1usize..5, pick in any::<prop::sample::Index>()) {
            let (init, mut recs, _) = simulate(seed, threads, 30, 4, false);
            let gets: Vec<usize> = recs.iter().enumerate()
                .filter(|(_, r)| matches!(r.call, Call::Get { .. })).map(|(i, _)| i).collect();
            prop_assume!(!gets.is_empty());
            let i = gets[pick.index(gets.len())];
            let t = recs[i].ret.as_ref().unwrap().0;
            recs[i].ret = Some((t, Ret::Value(Some(7_777_777_777))));
            prop_assert!(check(&init, recs).is_err());
        }
    }
}
