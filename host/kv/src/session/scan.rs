//! Scans: one, or several read together.
//!
//! A scan walks the chains of its models from the chain that owns its
//! cursor (module docs of `session`: each leaf reached by the chase from
//! a training leaf, the cursor moving on from `fence_hi + 1`). Its leaves
//! are read in *rounds*: a round reads, for every scan of the call not
//! done yet, the model's directory word (once per model view, as
//! [`KvSession::get_many`] reads it) and the next chains from its cursor
//! — as many as its remaining count needs, at most [`SCAN_CHAINS`] — in
//! one doorbell batch; then each scan walks what landed for it. So `D`
//! scans of a few leaves each cost the round trips of one
//! ([`KvSession::scan_many`]), and one long range costs one round trip per
//! [`SCAN_CHAINS`] chains. Across memory nodes every node's round is
//! posted before any is waited for (`KvSession::rounds`).
//!
//! A scan whose model was stale (the directory word says so, or its
//! chase found a freed leaf or a chain that does not start where the last
//! one ended) keeps what it found below its cursor and goes on in the next
//! round, once the model was refreshed; each such retry counts against
//! `KvClientConfig::max_attempts`, per scan. A leaf torn in the batch is
//! read again alone (the chase's rule), at the start of the read buffer,
//! which a round never uses for its batch.
//!
//! Not atomic, as [`KvSession::scan`]: a pair present for the whole call
//! is returned; one written meanwhile may or may not be. The scans of one
//! call only read, so they are concurrent with each other.
//!
//! A scan of values reads its out-of-line values after its leaves; a pair
//! whose key was removed before its value could be read is left out. A
//! scan that found its `n` pairs and lost some that way goes on past the
//! last pair it found, for as many as it lost (`go_on`): a scan shorter
//! than `n` says the keys ended, so it must not stop short while keys
//! present all along follow (and a cluster's scan, short on one node,
//! goes on at the next node's range start, past them).

use rolex_core::layout::{Leaf, SlotValue};
use rolex_engine::TransferError;

use super::{bad_leaf, first_error, Chase, KvSession, LeafBatch, LeafReads, Owner, SCAN_CHAINS};
use crate::cache::ModelView;
use crate::error::KvError;
use crate::stats::KvOp;

/// Leaf bytes one round reads at most for all of its scans (a scan that
/// would go past it waits for the next round; the first scan of a round
/// always goes).
const SCAN_ROUND_BYTES: u64 = 1 << 20;

/// A scan as asked: the pairs with `from ≤ key ≤ hi`, at most `n`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScanSpec {
    pub(crate) from: u64,
    pub(crate) hi: u64,
    pub(crate) n: usize,
}

/// What each scan of a call found, in the call's order: each scan's pairs
/// in key order.
pub type Scanned<V> = Vec<Vec<(u64, V)>>;

/// What each scan of a call found, its values as the slots hold them.
pub(crate) type ScanFound = Scanned<SlotValue>;

/// One scan of a call as it goes: where it goes on from, what it found,
/// its retries.
struct ScanState {
    cursor: u64,
    hi: u64,
    n: usize,
    out: Vec<(u64, SlotValue)>,
    attempt: u64,
    done: bool,
}

/// One round of a call's scans as planned: its READs, and each scan's
/// chains.
struct ScanRound {
    batch: LeafBatch,
    plans: Vec<ScanPlan>,
}

/// One scan's share of a round: its model view (index in the round's
/// views), the first training leaf `j` and the number of chains read
/// from it, where they land.
struct ScanPlan {
    scan: usize,
    view: usize,
    j: u64,
    chains: u64,
    reads: LeafReads,
}

/// Where a scan's walk through its round's leaves ended.
enum Walked {
    /// It has its pairs.
    Done,
    /// It goes on from its cursor in the next round.
    More,
    /// Its model view was stale: refresh it, then go on from the cursor.
    Stale,
}

impl KvSession {
    /// Several scans read together: for each `(from, n)`, up to `n` pairs
    /// with key `≥ from`, in key order, as [`Self::scan`] answers it. The
    /// scans' leaves are read in rounds shared by all of them (module
    /// docs of `session::scan`): `D` short scans cost the round trips of
    /// one. Counted as `scans.len()` scans. A scan with `n == 0` fails the
    /// call ([`KvError::ScanCountZero`]) before anything is read; so does
    /// any other error, for every scan of the call.
    pub fn scan_many(&mut self, scans: &[(u64, usize)]) -> Result<Scanned<u64>, KvError> {
        let specs = specs_of(scans)?;
        one(Self::scan_many_with(&mut [self], &[&specs], u64_scans))
    }

    /// [`Self::scan_many`] with values of any length, as
    /// [`Self::scan_values`] answers each scan: the out-of-line values of
    /// all the scans are read together after their leaves.
    pub fn scan_many_values(
        &mut self,
        scans: &[(u64, usize)],
    ) -> Result<Scanned<Vec<u8>>, KvError> {
        let specs = specs_of(scans)?;
        one(Self::scan_many_with(&mut [self], &[&specs], value_scans))
    }

    /// [`Self::scan_many`] on several sessions at once (one per memory
    /// node of a cluster; `specs[i]` on `sessions[i]`): each round posted
    /// on every session before any is waited for.
    pub(crate) fn scan_many_on(
        sessions: &mut [&mut KvSession],
        specs: &[&[ScanSpec]],
    ) -> Vec<Result<Scanned<u64>, KvError>> {
        Self::scan_many_with(sessions, specs, u64_scans)
    }

    /// [`Self::scan_many_values`] on several sessions at once, as
    /// [`Self::scan_many_on`] (the value blocks too).
    pub(crate) fn scan_many_values_on(
        sessions: &mut [&mut KvSession],
        specs: &[&[ScanSpec]],
    ) -> Vec<Result<Scanned<Vec<u8>>, KvError>> {
        Self::scan_many_with(sessions, specs, value_scans)
    }

    /// The scans `specs[i]` on `sessions[i]`, answered by `finish` from
    /// what they found, each session's call counted as `specs[i].len()`
    /// scans (its answers' reads included). A scan that found its `n`
    /// pairs and then lost some to `finish` (keys removed before their
    /// values could be read) goes on past the last pair it found, for as
    /// many as it lost ([`go_on`]), in further rounds of the same call.
    fn scan_many_with<V>(
        sessions: &mut [&mut KvSession],
        specs: &[&[ScanSpec]],
        finish: ScanAnswers<V>,
    ) -> Vec<Result<Scanned<V>, KvError>> {
        for s in sessions.iter_mut() {
            s.io.cur = Default::default();
        }
        let mut out: Vec<Result<Scanned<V>, KvError>> = specs
            .iter()
            .map(|mine| Ok(mine.iter().map(|_| Vec::new()).collect()))
            .collect();
        // Each session's scans still going: each one's index and spec.
        let mut going: Vec<Vec<(usize, ScanSpec)>> = specs
            .iter()
            .map(|mine| mine.iter().copied().enumerate().collect())
            .collect();
        let mut settle = true;
        while going.iter().any(|g| !g.is_empty()) {
            let now: Vec<Vec<ScanSpec>> = going
                .iter()
                .map(|g| g.iter().map(|&(_, spec)| spec).collect())
                .collect();
            let now: Vec<&[ScanSpec]> = now.iter().map(Vec::as_slice).collect();
            let found = Self::scan_found(sessions, &now, settle);
            settle = false;
            // What each scan found: how many pairs, and the last key.
            let shapes: Vec<Vec<(usize, Option<u64>)>> = found
                .iter()
                .map(|f| {
                    f.iter()
                        .flatten()
                        .map(|pairs| (pairs.len(), pairs.last().map(|p| p.0)))
                        .collect()
                })
                .collect();
            let answers = finish(sessions, found);
            for (((o, g), answer), shape) in out.iter_mut().zip(&mut going).zip(answers).zip(shapes)
            {
                let mine = std::mem::take(g);
                if mine.is_empty() {
                    continue;
                }
                let answer = match answer {
                    Ok(a) => a,
                    Err(e) => {
                        *o = Err(e);
                        continue;
                    }
                };
                let Ok(acc) = o.as_mut() else { continue };
                for (((i, spec), kept), (len, last)) in mine.into_iter().zip(answer).zip(shape) {
                    if let Some(next) = go_on(&spec, len, last, kept.len()) {
                        g.push((i, next));
                    }
                    acc[i].extend(kept);
                }
            }
        }
        for (s, mine) in sessions.iter_mut().zip(specs) {
            s.io.cur.ops = mine.len() as u64;
            s.counters.per_op[KvOp::Scan.index()].add(&s.io.cur);
        }
        out
    }

    /// One scan of values on this session, not counted (the caller is):
    /// [`Self::scan_inner`], its values read; a scan that lost pairs to
    /// keys removed before their values could be read goes on as
    /// [`Self::scan_many_with`]'s do.
    pub(super) fn scan_values_inner(
        &mut self,
        from: u64,
        n: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, KvError> {
        let mut spec = ScanSpec {
            from,
            hi: u64::MAX,
            n,
        };
        let mut out = Vec::new();
        loop {
            let found = self.scan_inner(spec.from, spec.hi, spec.n)?;
            let (len, last) = (found.len(), found.last().map(|p| p.0));
            let kept = self.resolve(found)?;
            let next = go_on(&spec, len, last, kept.len());
            out.extend(kept);
            match next {
                Some(next) => spec = next,
                None => return Ok(out),
            }
        }
    }

    /// One scan on this session, not counted (the caller is).
    pub(super) fn scan_inner(
        &mut self,
        from: u64,
        hi: u64,
        n: usize,
    ) -> Result<Vec<(u64, SlotValue)>, KvError> {
        let mut found = self.scan_alone(&[ScanSpec { from, hi, n }], false)?;
        Ok(found.pop().unwrap_or_default())
    }

    /// What the scans `specs[i]` on `sessions[i]` find, in rounds posted
    /// on every session before any is waited for; `settle`: each session
    /// first waits for its posted unlock and retries the locks it may
    /// hold (as every counted call does first).
    fn scan_found(
        sessions: &mut [&mut KvSession],
        specs: &[&[ScanSpec]],
        settle: bool,
    ) -> Vec<Result<ScanFound, KvError>> {
        if let ([s], [mine]) = (&mut *sessions, specs) {
            return vec![s.scan_alone(mine, settle)];
        }
        let mut states: Vec<Result<Vec<ScanState>, KvError>> = sessions
            .iter_mut()
            .zip(specs)
            .map(|(s, mine)| {
                if settle {
                    s.reap()?;
                    s.resolve_held();
                }
                Ok(mine.iter().map(ScanState::new).collect())
            })
            .collect();
        Self::rounds(
            sessions,
            &mut states,
            |s, st| s.plan_scan_round(st),
            |s, r| Some(s.post_leaf_batch(&r.batch, "scan")),
            |s, st, r, landed| s.landed_scan_round(st, r, landed),
        );
        states
            .into_iter()
            .map(|st| Ok(st?.into_iter().map(|sc| sc.out).collect()))
            .collect()
    }

    /// [`Self::scan_found`] on this session alone: its rounds one after
    /// the other, without the several sessions' bookkeeping.
    fn scan_alone(&mut self, specs: &[ScanSpec], settle: bool) -> Result<ScanFound, KvError> {
        if settle {
            self.reap()?;
            self.resolve_held();
        }
        let mut scans: Vec<ScanState> = specs.iter().map(ScanState::new).collect();
        while let Some(r) = self.plan_scan_round(&mut scans)? {
            let landed = self
                .post_leaf_batch(&r.batch, "scan")
                .map(|f| first_error(f.wait()));
            self.landed_scan_round(&mut scans, r, landed)?;
        }
        Ok(scans.into_iter().map(|sc| sc.out).collect())
    }

    /// The next round of `scans`: each scan not done, in order, while the
    /// round's leaves stay under [`SCAN_ROUND_BYTES`]. Leaves land past
    /// the read buffer's first leaf (where a torn leaf is read again
    /// alone). `None` when every scan is done.
    fn plan_scan_round(&mut self, scans: &mut [ScanState]) -> Result<Option<ScanRound>, KvError> {
        let per_chain = u64::from(self.shared.sb.keys_per_leaf()).max(1);
        let step = self.leaf_size.next_multiple_of(8);
        let mut batch = self.leaf_batch();
        let mut plans = Vec::new();
        for (i, sc) in scans.iter_mut().enumerate().filter(|(_, sc)| !sc.done) {
            if sc.attempt >= self.shared.cfg.max_attempts {
                return Err(KvError::TooManyRetries {
                    op: "scan",
                    attempts: sc.attempt,
                });
            }
            let vi = self.batch_view(&mut batch, sc.cursor)?;
            let view = &batch.views[vi].view;
            let j = self.owner(view, sc.cursor);
            let leaves = view.fences.len() as u64;
            let want = (sc.n.saturating_sub(sc.out.len()) as u64)
                .div_ceil(per_chain)
                .saturating_add(1);
            let mut chains = want.clamp(1, SCAN_CHAINS).min(leaves - j);
            if sc.hi != u64::MAX {
                // Only the chains up to the one holding `hi`.
                let last = view.fences.partition_point(|&f| f <= sc.hi) as u64;
                chains = chains.min(last.saturating_sub(j).max(1));
            }
            self.chain.clear();
            for jj in j..j + chains {
                view.chain(jj, &mut self.chain);
            }
            if !plans.is_empty() && batch.end + self.chain.len() as u64 * step > SCAN_ROUND_BYTES {
                break;
            }
            let reads = self.plan_chain(&mut batch)?;
            plans.push(ScanPlan {
                scan: i,
                view: vi,
                j,
                chains,
                reads,
            });
        }
        Ok((!plans.is_empty()).then_some(ScanRound { batch, plans }))
    }

    /// A round of `scans` as it landed (`landed`: its first op error;
    /// `Err`: not posted): each scan whose model was current walks its
    /// leaves; the models found stale are refreshed, once each.
    fn landed_scan_round(
        &mut self,
        scans: &mut [ScanState],
        r: ScanRound,
        landed: Result<Option<TransferError>, KvError>,
    ) -> Result<(), KvError> {
        let ScanRound { batch, plans } = r;
        let mut stale = self.stale_models(&batch, landed, "scan")?;
        let mut chased_stale = 0;
        for p in &plans {
            let sc = &mut scans[p.scan];
            let (m, view) = (batch.views[p.view].m, &batch.views[p.view].view);
            let walked = if stale.contains(&m) {
                Walked::Stale
            } else {
                self.walk(sc, p, (m, view))?
            };
            match walked {
                Walked::Done => sc.done = true,
                Walked::More => {}
                Walked::Stale => {
                    sc.attempt += 1;
                    self.io.cur.retries += 1;
                    if !stale.contains(&m) {
                        chased_stale = chased_stale.max(sc.attempt);
                        stale.push(m);
                    }
                }
            }
        }
        self.keep_views(batch);
        for m in stale {
            self.refresh(m)?;
        }
        if chased_stale > 0 {
            // A freed leaf or a broken chain: retraining is under way.
            self.backoff(chased_stale);
        }
        Ok(())
    }

    /// Walks `sc` through its share `p` of a round that landed (under
    /// model `m`'s `view`), from its cursor: the pairs in `[cursor, hi]`
    /// of each leaf the chase reaches, chain after chain, until it has `n`
    /// of them, passes `hi`, or comes to the end of what `p` read.
    fn walk(
        &mut self,
        sc: &mut ScanState,
        p: &ScanPlan,
        (m, view): (usize, &ModelView),
    ) -> Result<Walked, KvError> {
        let leaves = view.fences.len() as u64;
        let mut jj = p.j;
        let mut start = view.training_leaf(jj);
        loop {
            let Owner { addr, bytes, .. } =
                match self.chase(m as u64, sc.cursor, start, 0, &p.reads)? {
                    Chase::Owner(owner) => owner,
                    Chase::Stale => return Ok(Walked::Stale),
                };
            let leaf = Leaf::from_bytes(&bytes).map_err(bad_leaf(m as u64, addr))?;
            let (fence_hi, next) = (leaf.fence_hi(), leaf.next());
            if let Ok(v) = leaf.validate() {
                for s in v.entries() {
                    if s.key() < sc.cursor {
                        continue;
                    }
                    if s.key() > sc.hi {
                        return Ok(self.scan_done(sc));
                    }
                    // A validated leaf's used slots all hold values.
                    let Some(value) = s.value() else { continue };
                    sc.out.push((s.key(), value));
                    if sc.out.len() >= sc.n {
                        return Ok(self.scan_done(sc));
                    }
                }
            }
            if fence_hi >= sc.hi {
                return Ok(self.scan_done(sc));
            }
            sc.cursor = fence_hi + 1;
            if next.pointer() != 0 {
                start = next.addr();
                continue;
            }
            // The chain ended: the next training leaf must start here.
            jj += 1;
            if jj == leaves {
                // The model ended: the next one starts at its `key_hi + 1`.
                let ended = sc.cursor == view.record.key_hi().wrapping_add(1);
                return Ok(if ended { Walked::More } else { Walked::Stale });
            }
            if view.fences[jj as usize] != sc.cursor {
                return Ok(Walked::Stale);
            }
            if jj >= p.j + p.chains {
                return Ok(Walked::More);
            }
            start = view.training_leaf(jj);
        }
    }

    /// A scan that has its pairs, its keys counted.
    fn scan_done(&mut self, sc: &ScanState) -> Walked {
        self.io.cur.keys += sc.out.len() as u64;
        Walked::Done
    }
}

impl ScanState {
    fn new(spec: &ScanSpec) -> Self {
        Self {
            cursor: spec.from,
            hi: spec.hi,
            n: spec.n,
            out: Vec::new(),
            attempt: 0,
            done: false,
        }
    }
}

/// How a call's scans are answered from what they found, on each session.
type ScanAnswers<V> =
    fn(&mut [&mut KvSession], Vec<Result<ScanFound, KvError>>) -> Vec<Result<Scanned<V>, KvError>>;

/// Where the scan `spec` goes on after its leaves held `found` pairs (the
/// last one's key `last`) of which its answer kept `kept` (the others'
/// keys were removed before their values could be read): past `last`, for
/// the pairs left out — else a scan short of `n` pairs would say the keys
/// ended while keys present all along follow (and a cluster's scan would
/// go on at the next node's range, past them). `None` when it is done: it
/// kept all it found, or found fewer than `n` (it reached its end).
fn go_on(spec: &ScanSpec, found: usize, last: Option<u64>, kept: usize) -> Option<ScanSpec> {
    let last = last.filter(|&l| found >= spec.n && kept < found && l < spec.hi)?;
    Some(ScanSpec {
        from: last + 1,
        hi: spec.hi,
        n: found - kept,
    })
}

/// The `(from, n)` scans of a public call as specs (`from` to the end),
/// or [`KvError::ScanCountZero`] if one asks for no pair.
fn specs_of(scans: &[(u64, usize)]) -> Result<Vec<ScanSpec>, KvError> {
    scans
        .iter()
        .map(|&(from, n)| {
            if n == 0 {
                return Err(KvError::ScanCountZero);
            }
            Ok(ScanSpec {
                from,
                hi: u64::MAX,
                n,
            })
        })
        .collect()
}

/// The answer of a call on one session.
fn one<T>(mut answers: Vec<Result<T, KvError>>) -> Result<T, KvError> {
    answers.pop().unwrap_or(Err(KvError::BadConfig {
        field: "sessions",
        reason: "a call on one session answered nothing",
    }))
}

/// Each session's scans with `u64` values ([`KvError::ValueNotU64`] for
/// one that is not 8 bytes, as [`KvSession::scan`]).
fn u64_scans(
    sessions: &mut [&mut KvSession],
    found: Vec<Result<ScanFound, KvError>>,
) -> Vec<Result<Scanned<u64>, KvError>> {
    sessions
        .iter_mut()
        .zip(found)
        .map(|(s, f)| {
            f?.into_iter()
                .map(|pairs| {
                    s.io.cur.value_bytes += pairs.iter().map(|(_, v)| v.len() as u64).sum::<u64>();
                    pairs
                        .into_iter()
                        .map(|(k, v)| Ok((k, super::as_u64(k, v)?)))
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// Each session's scans with their values: every scan's out-of-line
/// values of a session read together, in rounds posted on every session
/// before any is waited for; a pair whose key was removed before its
/// value could be read is left out (as [`KvSession::scan_values`]).
fn value_scans(
    sessions: &mut [&mut KvSession],
    found: Vec<Result<ScanFound, KvError>>,
) -> Vec<Result<Scanned<Vec<u8>>, KvError>> {
    // Every session's pairs in one list, each with its scan.
    let mut owners: Vec<Vec<usize>> = Vec::with_capacity(found.len());
    let mut counts: Vec<usize> = Vec::with_capacity(found.len());
    let pairs: Vec<Result<Vec<(u64, SlotValue)>, KvError>> = found
        .into_iter()
        .map(|f| {
            let f = f.inspect_err(|_| {
                owners.push(Vec::new());
                counts.push(0);
            })?;
            owners.push(
                f.iter()
                    .enumerate()
                    .flat_map(|(i, p)| std::iter::repeat(i).take(p.len()))
                    .collect(),
            );
            counts.push(f.len());
            Ok(f.into_iter().flatten().collect())
        })
        .collect();
    KvSession::values_rounds(sessions, pairs)
        .into_iter()
        .zip(owners)
        .zip(counts)
        .map(|((values, owner), count)| {
            let mut out: Scanned<Vec<u8>> = vec![Vec::new(); count];
            for ((k, v), i) in values?.into_iter().zip(owner) {
                if let Some(v) = v {
                    out[i].push((k, v));
                }
            }
            Ok(out)
        })
        .collect()
}
