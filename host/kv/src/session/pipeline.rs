//! Pipelined calls: [`KvSession::run_many`] keeps several `u64`
//! operations of one thread in flight — gets and writes mixed — in the
//! round trips of one.
//!
//! # The API
//!
//! An explicit batch, not futures: the caller hands a slice of
//! [`Request`]s and gets one answer per request, in order, when all of
//! them are done. A session is one thread's queue pair and buffers, so a
//! batch is what one thread can have in flight; `D` requests per call is
//! depth `D`. (An async API would need a reactor to poll completions and
//! would let requests of one thread overtake each other in ways this
//! call rules out below.)
//!
//! # Round trips (ordered fabric)
//!
//! The requests are cut, in order, into *batches*: a request whose chain
//! (model, training leaf) or key an earlier request of the batch uses
//! starts the next batch, unless both are gets. So a batch never takes two locks on
//! one chain, and a get that follows a write of its chain sees it. A batch
//! is two doorbell batches:
//! 1. for each write, its lock's `CAS`, the READ of its model record's
//!    state word and id, and the READs of its chain; for each get, its
//!    model's directory word (once per model, as [`KvSession::get_many`])
//!    and the READs of its chain — each at its own offsets of the read
//!    buffer (the reads of one write run after its `CAS`: the fabric
//!    applies a batch in posting order);
//! 2. for each write that took its lock, its leaf's WRITE (if it changed
//!    it) then its unlocking `CAS`.
//!
//! So `n` requests on distinct chains cost 2 round trips, not 2 per write
//! and 1 per get.
//!
//! # What falls back to the single path
//!
//! A request that cannot complete this way is redone after its batch (and
//! before the next one), in request order among the redone ones, through
//! the path of [`KvSession::get`], [`KvSession::insert`], … with that
//! path's round trips: a lock `CAS` that found the chain locked (another
//! writer, a frozen chain) or its cached word stale, a record found
//! retired or reused (the lock, if it landed, released unchanged first), a
//! view not seen live lately, a stale model or a chase that says so for a
//! get, an insert that needs a split (its lock released unchanged in
//! round 2). On an unordered fabric every write takes the single path
//! (each run of consecutive gets is read together, as
//! [`KvSession::get_many`] reads), and so does a call of one request.
//!
//! # Linearizability
//!
//! The requests of one call are concurrent operations of one client: each
//! takes effect at one instant between the call's start and its return (a
//! get at its leaf read, a write while it holds its chain's lock), not
//! necessarily in request order. Requests on distinct chains touch
//! distinct keys, so their relative order is not observable; two requests
//! on one chain (unless both are gets) run in different batches, in
//! request order.
//!
//! # Who releases what
//!
//! A lock round 1 planned counts in its stripe from before the batch is
//! posted (module `held`); a batch that could not be posted leaves every
//! planned lock's stripe. Once its `CAS` is seen to have landed, each lock
//! is a [`ChainLock`] guard, released exactly once: by
//! [`KvSession::lock_taken`] itself when the record was found stale or a
//! READ of the batch failed (unchanged); by [`ChainLock::abort`] when its
//! chain could not be read or edited (unchanged, at once); otherwise in
//! round 2 ([`KvSession::plan_release_many`], whose guards are spent
//! into a plan that [`KvSession::released_many`] settles whether or not
//! the batch was posted) — with its leaf write, or unchanged (a write
//! that changed nothing, a `u64` request that met a longer value, an
//! insert that needs a split). A lock `CAS` that failed
//! without saying whether it landed goes to the client's record of locks
//! maybe held, as on the single path, and its request reports
//! [`KvError::LockMaybeHeld`]; a round 2 that could not be posted
//! releases each lock unchanged (nothing was written). Errors are reported
//! per request as the single path reports them: a request whose leaf
//! write was posted and then failed, or whose unlock failed after it, is
//! indeterminate ([`KvError::may_have_applied`]).
//!
//! # Several sessions (a cluster's memory nodes)
//!
//! Each round is four steps, whoever drives them: plan (cut the next
//! batch, plan its ops, enter the locks' stripes), post
//! ([`Io::post_each`](crate::io::Io::post_each)), wait, apply (read
//! round 1 and plan round 2's releases; settle round 2's locks). One
//! session's call ([`KvSession::run_many`]) and a cluster's call across
//! its nodes (`ClusterSession::run_many`, one session per node) run the
//! same steps (`run_many_on`): round 1 of every session's batch is
//! posted before any is waited for, then each is read; round 2 likewise;
//! then each session's fallbacks run, in turn; then every session's next
//! batch. So a call across `N` nodes costs the round trips of its busiest
//! node, not `N` times them. The sessions share nothing: each has its own
//! queue pair, buffers, locks and pipe (its requests and answers), a
//! batch that could not be posted on one node is settled there as above,
//! and one node's errors are only its own requests' answers. The gets of
//! [`KvSession::get_many`] go the same way across nodes
//! (`get_many_on`).

use std::ops::Range;
use std::sync::Arc;

use rolex_core::layout::SlotValue;

use rolex_engine::TransferError;

use super::lock::{ChainLock, LeafWrite, LockReply, PlannedLock, Releases, IDENTITY_LEN};
use super::{as_u64, lookup, ChainAt, Chase, Edit, Kind, KvSession, LeafReads, WriteOp};
use crate::cache::{clock_ns, ModelView};
use crate::error::KvError;
use crate::io::{InFlight, Op};
use crate::stats::KvOp;

/// One request of a pipelined call ([`KvSession::run_many`]): the `u64`
/// operations. Each answers as its single method does: the value read,
/// or the value the write replaced (`None`: absent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// [`KvSession::get`] of the key.
    Get(u64),
    /// [`KvSession::insert`] of the key and value.
    Insert(u64, u64),
    /// [`KvSession::update`] of the key and value.
    Update(u64, u64),
    /// [`KvSession::delete`] of the key.
    Delete(u64),
}

impl Request {
    /// The key it reads or writes.
    pub fn key(self) -> u64 {
        match self {
            Request::Get(k)
            | Request::Insert(k, _)
            | Request::Update(k, _)
            | Request::Delete(k) => k,
        }
    }

    /// The kind it is counted as.
    pub fn kind(self) -> KvOp {
        match self {
            Request::Get(_) => KvOp::Get,
            Request::Insert(..) => KvOp::Insert,
            Request::Update(..) => KvOp::Update,
            Request::Delete(_) => KvOp::Delete,
        }
    }

    /// Whether it locks its chain.
    fn writes(self) -> bool {
        !matches!(self, Request::Get(_))
    }
}

/// A request's answer: the value read or replaced.
pub type Answer = Result<Option<u64>, KvError>;

/// A request as round 1 planned it.
struct Member {
    /// Its index in the call.
    i: usize,
    req: Request,
    at: ChainAt,
    /// Where its chain's leaves land in the read buffer.
    reads: LeafReads,
    /// Its ops in round 1 (past its model check, for a get).
    ops: Range<usize>,
    /// A write's lock, and round 1's ops from its `CAS` on.
    lock: Option<(PlannedLock, Range<usize>)>,
}

/// What a locked write does once round 2 released its lock.
enum Then {
    /// Answer the value it replaced.
    Old(Option<SlotValue>),
    /// Refuse: the key's value is `len` bytes long.
    NotU64(usize),
    /// Redo it through the single path.
    Redo,
}

impl KvSession {
    /// Runs `reqs` together, up to all of them in flight at once (module
    /// `pipeline`): on an ordered fabric, `n` requests on distinct chains
    /// cost 2 round trips in all. One answer per request, in order, each
    /// as its single method would give it; each request counts as one
    /// operation of its kind, the call's round trips shared out among
    /// them. `Err` only when no request ran: the previous operation's
    /// posted unlock failed (see [`Self::flush`]).
    pub fn run_many(&mut self, reqs: &[Request]) -> Result<Vec<Answer>, KvError> {
        let mut answers = Self::run_many_on(&mut [self], &[reqs]);
        answers.pop().unwrap_or_else(|| Ok(Vec::new()))
    }

    /// [`Self::run_many`] on several sessions at once — one per memory
    /// node of a cluster, `reqs[i]` on `sessions[i]` (module docs,
    /// "Several sessions"): each batch's round 1 is posted on every
    /// session before any is waited for, then its round 2 likewise, so a
    /// call costs the round trips of its busiest session, not their sum.
    /// Each session's answers, errors and counters are what its own
    /// `run_many` would give for its requests.
    pub(crate) fn run_many_on(
        sessions: &mut [&mut KvSession],
        reqs: &[&[Request]],
    ) -> Vec<Result<Vec<Answer>, KvError>> {
        let alone = sessions.len() == 1;
        let mut pipes: Vec<Option<Pipe<'_>>> = Vec::with_capacity(reqs.len());
        let mut results: Vec<Result<Vec<Answer>, KvError>> = Vec::with_capacity(reqs.len());
        for (s, &mine) in sessions.iter_mut().zip(reqs) {
            s.io.cur = Default::default();
            let mut pipe = None;
            results.push(s.settle().map(|()| {
                s.resolve_held();
                if !s.shared.ordered {
                    s.run_unordered(mine)
                } else if alone && mine.len() < 2 {
                    mine.iter().map(|&r| s.run_one(r)).collect()
                } else {
                    pipe = Some(Pipe::new(mine));
                    Vec::new()
                }
            }));
            pipes.push(pipe);
        }
        Self::drive(sessions, &mut pipes);
        for ((s, &mine), (r, pipe)) in sessions
            .iter_mut()
            .zip(reqs)
            .zip(results.iter_mut().zip(pipes))
        {
            if let (Ok(answers), Some(pipe)) = (r.as_mut(), pipe) {
                *answers = pipe.answers();
            }
            s.count_call(mine);
        }
        results
    }

    /// Counts a pipelined call of `reqs`: each request one operation of
    /// its kind, the call's cost shared out among them.
    fn count_call(&mut self, reqs: &[Request]) {
        let mut counts = [0u64; 5];
        for r in reqs {
            counts[r.kind().index()] += 1;
        }
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        for (k, share) in self.io.cur.split(&counts, self.rng).iter().enumerate() {
            if share.ops > 0 {
                self.counters.per_op[k].add(share);
            }
        }
    }

    /// Runs every session's pipe to its end, batch by batch: each round
    /// posted on every session that has one before any is waited for,
    /// then each session's fallbacks (module docs).
    fn drive(sessions: &mut [&mut KvSession], pipes: &mut [Option<Pipe<'_>>]) {
        loop {
            let round1: Vec<Option<Round1>> = sessions
                .iter_mut()
                .zip(pipes.iter_mut())
                .map(|(s, p)| p.as_mut().and_then(|p| s.next_batch(p)))
                .collect();
            if round1.iter().all(Option::is_none) {
                return;
            }
            let landed = post_all(sessions, &round1, KvSession::post_round1);
            let mut round2 = Vec::with_capacity(round1.len());
            for (((s, p), plan), landed) in sessions
                .iter_mut()
                .zip(pipes.iter_mut())
                .zip(round1)
                .zip(landed)
            {
                let (Some(p), Some(plan)) = (p.as_mut(), plan) else {
                    round2.push(None);
                    continue;
                };
                let looked = s.read_round1(plan, landed, &mut p.out, &mut p.redo);
                round2.push(s.plan_round2(looked, &mut p.out, &mut p.redo));
            }
            let released = post_all(sessions, &round2, KvSession::post_round2);
            for (((s, p), r2), released) in sessions
                .iter_mut()
                .zip(pipes.iter_mut())
                .zip(round2)
                .zip(released)
            {
                let Some(p) = p.as_mut() else {
                    continue;
                };
                if let Some(r2) = r2 {
                    s.finish_round2(p.reqs, r2, released, &mut p.out, &mut p.redo);
                }
                p.redo.sort_unstable();
                for i in std::mem::take(&mut p.redo) {
                    p.out[i] = Some(s.run_one(p.reqs[i]));
                }
            }
        }
    }

    /// The next batch of `p` (module docs), its round 1 planned; `None`
    /// when every request of `p` was answered or redone.
    fn next_batch(&mut self, p: &mut Pipe<'_>) -> Option<Round1> {
        let reqs = p.reqs;
        while p.next < reqs.len() {
            // A split's unlock is posted: it lands before the batch.
            if let Err(e) = self.settle() {
                p.out[p.next] = Some(Err(e));
                p.next += 1;
                continue;
            }
            let mut batch: Vec<(usize, ChainAt)> = Vec::new();
            while let Some(&req) = reqs.get(p.next) {
                let at = match self.chain_at(req.key()) {
                    Ok(at) => at,
                    Err(e) => {
                        p.out[p.next] = Some(Err(e));
                        p.next += 1;
                        continue;
                    }
                };
                // By key too: two views of one model (another thread
                // installed a newer one meanwhile) may name two chains
                // for one key.
                let clash = batch.iter().any(|(k, b)| {
                    let same = (b.m == at.m && b.j == at.j) || reqs[*k].key() == req.key();
                    same && (reqs[*k].writes() || req.writes())
                });
                if clash {
                    self.keep_view(at.m, (at.version, at.view));
                    break;
                }
                batch.push((p.next, at));
                p.next += 1;
            }
            return Some(self.plan_round1(reqs, batch, &mut p.out, &mut p.redo));
        }
        None
    }

    /// Posts round 1 of a batch (its read buffer reserved first); `None`
    /// when it has nothing to post. On `Err` nothing was posted.
    fn post_round1<'a>(&'a mut self, plan: &'a Round1) -> Option<Posting<'a>> {
        if plan.members.is_empty() {
            return None;
        }
        let writes = plan.members.iter().filter(|m| m.lock.is_some()).count() as u64;
        let step = self.leaf_size.next_multiple_of(8);
        if let Err(e) = self
            .io
            .reserve(&self.shared.engine, plan.end, writes * step)
        {
            return Some(Err(e));
        }
        Some(
            self.io
                .post_each(&self.shared.pool, &plan.ops, "running a pipelined batch"),
        )
    }

    /// Posts round 2 of a batch: its writes and unlocks; `None` when they
    /// could not be staged (nothing to post). On `Err` nothing was posted.
    fn post_round2<'a>(&'a mut self, r2: &'a Round2) -> Option<Posting<'a>> {
        let ops = r2.releases.ops.as_ref().ok()?;
        Some(
            self.io
                .post_each(&self.shared.pool, ops, "writing and unlocking"),
        )
    }

    /// `reqs` on an unordered fabric: each run of consecutive gets read
    /// together ([`KvSession::get_many`]'s path), each write alone.
    fn run_unordered(&mut self, reqs: &[Request]) -> Vec<Answer> {
        let mut out = Vec::with_capacity(reqs.len());
        let mut i = 0;
        while i < reqs.len() {
            let gets = reqs[i..]
                .iter()
                .take_while(|r| matches!(r, Request::Get(_)))
                .count();
            if gets < 2 {
                out.push(self.run_one(reqs[i]));
                i += 1;
                continue;
            }
            let keys: Vec<u64> = reqs[i..i + gets].iter().map(|r| r.key()).collect();
            match self.settle().and_then(|()| self.get_many_inner(&keys)) {
                Ok(found) => {
                    for (&key, v) in keys.iter().zip(found) {
                        if let Some(v) = v {
                            self.io.cur.value_bytes += v.len() as u64;
                        }
                        out.push(v.map(|v| as_u64(key, v)).transpose());
                    }
                }
                Err(e) => out.extend(keys.iter().map(|_| Err(e.clone()))),
            }
            i += gets;
        }
        out
    }

    /// `req` through the single-operation path.
    fn run_one(&mut self, req: Request) -> Answer {
        self.settle()?;
        let (key, op, value) = match req {
            Request::Get(key) => {
                let v = self.get_inner(key)?;
                if let Some(v) = v {
                    self.io.cur.value_bytes += v.len() as u64;
                }
                return v.map(|v| as_u64(key, v)).transpose();
            }
            Request::Insert(k, v) => (k, WriteOp::Insert, Some(v.to_le_bytes())),
            Request::Update(k, v) => (k, WriteOp::Update, Some(v.to_le_bytes())),
            Request::Delete(k) => (k, WriteOp::Delete, None),
        };
        let bytes = value.as_ref().map_or(&[][..], |b| &b[..]);
        self.write_value(key, op, bytes, true)
            .map(|old| old.and_then(|o| o.as_u64()))
    }

    /// Round 1's plan: each request's ops at its own offsets of the read
    /// buffer (past the first leaf: a chase that reads a leaf alone reads
    /// it there), each write's lock planned (its stripe entered).
    fn plan_round1(
        &mut self,
        reqs: &[Request],
        batch: Vec<(usize, ChainAt)>,
        out: &mut [Option<Answer>],
        redo: &mut Vec<usize>,
    ) -> Round1 {
        let step = self.leaf_size.next_multiple_of(8);
        let mut plan = Round1 {
            members: Vec::with_capacity(batch.len()),
            ops: Vec::new(),
            checks: Vec::new(),
            posted: clock_ns(),
            end: step,
        };
        let mut chain = Vec::new();
        for (i, at) in batch {
            let req = reqs[i];
            chain.clear();
            at.view.chain(at.j, &mut chain);
            let region = self.shared.region;
            let remotes: Result<Vec<u64>, KvError> = chain
                .iter()
                .map(|&a| region.leaf_offset(a).map_err(KvError::from))
                .collect();
            let remotes = match remotes {
                Ok(r) if !r.is_empty() => r,
                Ok(_) => {
                    redo.push(i);
                    self.keep_view(at.m, (at.version, at.view));
                    continue;
                }
                Err(e) => {
                    out[i] = Some(Err(e));
                    self.keep_view(at.m, (at.version, at.view));
                    continue;
                }
            };
            let start = plan.ops.len();
            let lock = if req.writes() {
                match self.plan_lock(&at, 0, plan.end, &mut plan.ops) {
                    Ok(Some(p)) => {
                        plan.end += IDENTITY_LEN;
                        Some(p)
                    }
                    Ok(None) => {
                        redo.push(i);
                        self.keep_view(at.m, (at.version, at.view));
                        continue;
                    }
                    Err(e) => {
                        out[i] = Some(Err(e));
                        self.keep_view(at.m, (at.version, at.view));
                        continue;
                    }
                }
            } else {
                if !plan.checks.iter().any(|c| Arc::ptr_eq(&c.0, &at.view)) {
                    let first = plan.ops.len();
                    let checked =
                        self.model_check_at(at.m, &at.view, plan.end, plan.posted, &mut plan.ops);
                    match checked {
                        Ok(next) => {
                            let ops = first..plan.ops.len();
                            plan.checks.push((at.view.clone(), plan.end, ops));
                            plan.end = next;
                        }
                        Err(e) => {
                            out[i] = Some(Err(e));
                            self.keep_view(at.m, (at.version, at.view));
                            continue;
                        }
                    }
                }
                None
            };
            let mut reads = Vec::with_capacity(remotes.len());
            for (&addr, remote) in chain.iter().zip(remotes) {
                plan.ops.push(Op::Read {
                    remote,
                    local: plan.end,
                    len: self.leaf_size,
                });
                reads.push((addr, plan.end));
                plan.end += step;
            }
            self.io.cur.leaves_read += reads.len() as u64;
            let ops = start..plan.ops.len();
            let lock = lock.map(|p| (p, ops.clone()));
            plan.members.push(Member {
                i,
                req,
                at,
                reads,
                ops,
                lock,
            });
        }
        plan
    }

    /// Round 1 as it landed (`landed`: its ops' outcomes; `Err`: nothing
    /// was posted): takes everything out of the read buffer before
    /// anything else may use it (a model refresh reads into it): each
    /// get's answer, each write's lock reply and, where the lock landed
    /// on a live record, its edit. Returns the writes.
    fn read_round1(
        &mut self,
        plan: Round1,
        landed: Option<Landed>,
        out: &mut [Option<Answer>],
        redo: &mut Vec<usize>,
    ) -> Vec<Looked> {
        let Round1 {
            members,
            checks,
            posted,
            ..
        } = plan;
        if members.is_empty() {
            return Vec::new();
        }
        let results = match landed.unwrap_or_else(|| Ok(Vec::new())) {
            Ok(r) => r,
            Err(e) => {
                // Nothing posted: no lock was taken.
                for m in members {
                    if let Some((p, _)) = m.lock {
                        p.not_posted();
                    }
                    out[m.i] = Some(Err(e.clone()));
                    self.keep_view(m.at.m, (m.at.version, m.at.view));
                }
                return Vec::new();
            }
        };
        // A READ that failed left its bytes of the read buffer as they
        // were (an earlier batch's): nothing it was to read is looked at.
        let failed = |ops: &Range<usize>| {
            results
                .get(ops.clone())
                .map_or(true, |r| r.iter().any(Result::is_err))
        };
        // By view, not model: another thread may have installed a newer
        // view of a model between two of the batch's gets.
        let stale: Vec<Arc<ModelView>> = checks
            .into_iter()
            .filter(|(view, at, ops)| {
                failed(ops) || !self.still_current_at(view, posted, *at).unwrap_or(false)
            })
            .map(|c| c.0)
            .collect();
        let mut looked = Vec::new();
        for m in members {
            self.chain.clear();
            self.chain.extend(m.reads.iter().map(|r| r.0));
            let key = m.req.key();
            let Some((planned, range)) = m.lock else {
                // A get whose READs failed is redone alone (a READ has no
                // effect), which reports the error if it fails again.
                if failed(&m.ops) || stale.iter().any(|v| Arc::ptr_eq(v, &m.at.view)) {
                    redo.push(m.i);
                } else {
                    match self.get_answer(key, &m.at, &m.reads) {
                        Ok(Some(answer)) => out[m.i] = Some(answer),
                        Ok(None) => redo.push(m.i),
                        Err(e) => out[m.i] = Some(Err(e)),
                    }
                }
                self.keep_view(m.at.m, (m.at.version, m.at.view));
                continue;
            };
            let reply = self.lock_reply(&planned, results.get(range).unwrap_or(&[]));
            let edit = reply.landed(&planned, &m.at).then(|| {
                let kind = match m.req {
                    Request::Insert(_, v) => Kind::Insert(SlotValue::from_u64(v)),
                    Request::Update(_, v) => Kind::Update(SlotValue::from_u64(v)),
                    Request::Get(_) | Request::Delete(_) => Kind::Delete,
                };
                self.edit_owner(key, kind, true, &m.at, &m.reads)
            });
            looked.push(Looked {
                i: m.i,
                at: m.at,
                planned,
                reply,
                edit,
            });
        }
        looked
    }

    /// A get's answer from round 1's reads of its chain; `None` when the
    /// chase says the model is stale (redo it).
    fn get_answer(
        &mut self,
        key: u64,
        at: &ChainAt,
        reads: &LeafReads,
    ) -> Result<Option<Answer>, KvError> {
        let start = self.chain[0];
        match self.chase(at.m as u64, key, start, 0, reads)? {
            Chase::Owner(owner) => {
                self.learn(&at.view, at.j, &owner.path, owner.addr);
                let v = lookup(&owner.bytes, key);
                if let Some(v) = v {
                    self.io.cur.value_bytes += v.len() as u64;
                }
                Ok(Some(v.map(|v| as_u64(key, v)).transpose()))
            }
            Chase::Stale => Ok(None),
        }
    }

    /// Round 2's plan: each write's lock judged ([`Self::lock_taken`]),
    /// and its release — with its leaf write, or unchanged — planned into
    /// one batch ([`Self::plan_release_many`]); `None` when no lock is
    /// to be released.
    fn plan_round2(
        &mut self,
        looked: Vec<Looked>,
        out: &mut [Option<Answer>],
        redo: &mut Vec<usize>,
    ) -> Option<Round2> {
        let mut releases: Vec<(ChainLock, Option<LeafWrite>)> = Vec::new();
        let mut then: Vec<(usize, Then)> = Vec::new();
        for l in looked {
            let taken = self.lock_taken(&l.at, l.planned, 0, l.reply);
            self.keep_view(l.at.m, (l.at.version, l.at.view));
            let lock = match taken {
                Ok(Some(lock)) => lock,
                Ok(None) => {
                    redo.push(l.i);
                    continue;
                }
                Err(e) => {
                    out[l.i] = Some(Err(e));
                    continue;
                }
            };
            let (write, next) = match l.edit {
                // A lock taken on a live record always has its edit.
                None => (None, Then::Redo),
                Some(Err(e)) => {
                    out[l.i] = Some(Err(lock.abort(self, e)));
                    continue;
                }
                Some(Ok(Edit::Write {
                    leaf_off,
                    bytes,
                    old,
                })) => (Some((leaf_off, bytes)), Then::Old(old)),
                Some(Ok(Edit::Unchanged(old))) => (None, Then::Old(old)),
                Some(Ok(Edit::NotU64(len))) => (None, Then::NotU64(len)),
                Some(Ok(Edit::Full { .. })) => (None, Then::Redo),
            };
            if write.is_some() {
                self.io.cur.value_bytes += 8;
            }
            releases.push((lock, write));
            then.push((l.i, next));
        }
        if releases.is_empty() {
            return None;
        }
        Some(Round2 {
            releases: self.plan_release_many(releases),
            then,
        })
    }

    /// Round 2 as it landed (`landed`: the batch's outcomes; `Err`:
    /// nothing posted; `None`: nothing to post): every lock settled
    /// ([`Self::released_many`]), each write answered or sent to `redo`.
    fn finish_round2(
        &mut self,
        reqs: &[Request],
        r2: Round2,
        landed: Option<Landed>,
        out: &mut [Option<Answer>],
        redo: &mut Vec<usize>,
    ) {
        let Round2 { releases, then } = r2;
        let landed = landed.unwrap_or_else(|| Ok(Vec::new()));
        let released = self.released_many(releases, landed.as_deref().map_err(Clone::clone));
        for ((i, next), r) in then.into_iter().zip(released) {
            out[i] = match (r, next) {
                (Err(e), _) => Some(Err(e)),
                (Ok(()), Then::Old(old)) => Some(Ok(old.and_then(|o| o.as_u64()))),
                (Ok(()), Then::NotU64(len)) => Some(Err(KvError::ValueNotU64 {
                    key: reqs[i].key(),
                    len,
                })),
                (Ok(()), Then::Redo) => {
                    redo.push(i);
                    None
                }
            };
        }
    }
}

/// One session's share of a pipelined call as it goes: its requests,
/// their answers so far, the next request a batch starts at, and the
/// current batch's requests to redo through the single path.
struct Pipe<'r> {
    reqs: &'r [Request],
    out: Vec<Option<Answer>>,
    next: usize,
    redo: Vec<usize>,
}

impl<'r> Pipe<'r> {
    fn new(reqs: &'r [Request]) -> Self {
        Self {
            reqs,
            out: vec![None; reqs.len()],
            next: 0,
            redo: Vec::new(),
        }
    }

    /// The answers, in request order.
    fn answers(self) -> Vec<Answer> {
        debug_assert!(
            self.out.iter().all(Option::is_some),
            "a request got no answer"
        );
        self.out.into_iter().flatten().collect()
    }
}

/// Posts each session's planned batch (`post`: `None` when a plan has
/// nothing to post) before it waits for any, then waits for each in
/// turn: the batches' round trips overlap. One outcome per plan, in
/// order: the batch's results, `Err` when it was not posted, `None`
/// when there was nothing to post.
pub(super) fn post_all<P>(
    sessions: &mut [&mut KvSession],
    plans: &[Option<P>],
    post: for<'a> fn(&'a mut KvSession, &'a P) -> Option<Posting<'a>>,
) -> Vec<Option<Landed>> {
    let mut flights = Vec::with_capacity(plans.len());
    for (s, plan) in sessions.iter_mut().zip(plans) {
        flights.push(plan.as_ref().and_then(|plan| post(s, plan)));
    }
    flights
        .into_iter()
        .map(|f| f.map(|f| f.map(|f| f.wait().to_vec())))
        .collect()
}

/// A batch being posted: the batch in flight, or why nothing was posted.
pub(super) type Posting<'a> = Result<InFlight<'a>, KvError>;

/// A batch as it landed: each op's outcome, or why nothing was posted.
pub(super) type Landed = Result<Vec<Result<u64, TransferError>>, KvError>;

/// Round 2 of a batch as planned: the releases, and what each released
/// write answers.
struct Round2 {
    releases: Releases,
    then: Vec<(usize, Then)>,
}

/// Round 1 of a batch as planned.
struct Round1 {
    members: Vec<Member>,
    ops: Vec<Op>,
    /// The gets' model checks (one per view): view, where the check
    /// lands, its ops.
    checks: Vec<(Arc<ModelView>, u64, Range<usize>)>,
    /// The clock before the batch.
    posted: u64,
    /// The read buffer's bytes the batch uses.
    end: u64,
}

/// A write after round 1: its lock's reply and, where the lock landed on
/// a live record, what it does to its owner leaf.
struct Looked {
    i: usize,
    at: ChainAt,
    planned: PlannedLock,
    reply: LockReply,
    edit: Option<Result<Edit, KvError>>,
}
