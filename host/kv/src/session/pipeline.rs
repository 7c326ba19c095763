//! Pipelined calls: [`KvSession::run_many`] keeps several `u64`
//! operations of one thread in flight — gets and writes mixed — in the
//! round trips of one; [`KvSession::run_many_values`] does the same for
//! values of any length ([`ValueRequest`]: gets, puts, updates, removes).
//! Both run the same rounds; a call of value requests differs only
//! where its values do (see "Values").
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
//!    it) then its unlocking `CAS`; then, in a call of values, the READs
//!    of the value blocks its gets found (see "Values").
//!
//! So `n` requests on distinct chains cost 2 round trips, not 2 per write
//! and 1 per get.
//!
//! # Round trips (unordered fabric)
//!
//! An unordered fabric (EFA's SRD; loopback's `unordered`) may run a
//! batch's ops in any order, so a READ posted beside a lock's `CAS` may
//! read the chain before the lock lands. The same batches (cut as above)
//! then go in three rounds:
//! - A: for each write, its lock's `CAS` and the READ of its record's
//!   state word and id (as [`KvSession::insert`]'s lock batch on this
//!   fabric: they only judge a `CAS` that failed), and its value block's
//!   WRITE; for each get, what round 1 posts for it (its leaves are
//!   validated each on its own, as [`KvSession::get_many`] reads them);
//! - B: for each write whose `CAS` took the lock on a record round A
//!   found live (and whose block WRITE completed): the record's state
//!   word and id again, then its chain's READs — posted once round A
//!   completed, so they see the locked chain and a record retired after
//!   round A's READ;
//! - C: for each write that took its lock, its leaf's WRITE (if it
//!   changed it); the value blocks its gets found (as round 2). Each
//!   unlock `CAS` is posted once its write completed, and not waited for
//!   (as the single path posts its own): the next batch, the batch's
//!   redone requests and the next call settle those that completed
//!   ([`KvSession::reap`]), and a later lock of the same chain waits for
//!   its unlock first, so no write of this session overtakes an unlock
//!   of its own (a read needs none: the unlock is posted once the leaf
//!   landed).
//!
//! So `n` writes on distinct chains cost 3 round trips, not 3 per write;
//! a batch of gets alone costs 1 (round B is not posted). Rounds A and C
//! are rounds 1 and 2, planned and read by the same code: round 1 keeps
//! each write's chain READs (and its record's again) for round B, and
//! round 2 has no unlocks.
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
//! round 2). The same goes for an unordered fabric's rounds (a lock
//! judged after round B as round 1's is, released in round C). A call of
//! one request on one session takes the single path.
//!
//! # Values
//!
//! A write of a value longer than 8 bytes takes a block from the
//! client's value space when its batch is planned
//! ([`KvSession::take_block`]: no round trip while its class has a block
//! ready), builds it at its own offset of
//! the write buffer (past what round 2's leaf writes use; the buffer is
//! reserved once for all of the batch's blocks before any is built) and
//! posts its WRITE in round 1, after its chain's READs — nothing names
//! the block yet, so it may land whether or not the lock does. Round 2's
//! leaf write, which names it, is planned only if that WRITE completed
//! without error; otherwise the lock is released unchanged and the write
//! redone. A class with no block ready gets space then and there, as the
//! single path would (a pop of the pool's free stack, three round trips a
//! bundle, or a chunk claim, one `FAA`; a chunk holds 16 blocks of its
//! class, the next twice as many), before round 1 is posted: the write
//! stays in the batch. (It went through the single path once — three
//! round trips more for the write itself: `ycsb-a` at depth 8 over `tcp`
//! with 8–200 byte values redid 42–279 of its ~2,500 updates that way, at
//! 0.48–0.66 round trips per update against 0.44–0.48 now.) A write whose
//! block could not be had (a value too long for any, a value region
//! full, a failed round trip) fails with that error, as on the single
//! path, nothing written; one whose block could not be staged goes
//! through the single path, which takes its own. So `n` puts of long values
//! on distinct chains cost 2 round trips, as `n` `u64` writes do, once
//! their classes have space. A get answers from its leaf read as a
//! `u64` get does; the blocks of the values its batch's gets found out of
//! line are READ in round 2, after its leaf writes and unlocks (up to a
//! MiB of them; the read buffer is free once round 1 was taken out of
//! it), so a batch of long-value gets and writes costs 2 round trips
//! too, and one of gets alone 2 instead of 1. A block that is more, whose
//! READ failed, or that was rewritten since its leaf was read is read
//! after the call's last batch, in one round for all of them posted on
//! every session before any is waited for (`values_on`, as
//! [`KvSession::get_many_values`]), where one still rewritten sends its
//! get back to the single path. On an unordered fabric a block's WRITE
//! goes in round A, the leaf write that names it (planned only if the
//! WRITE completed) in round C with the gets' block READs: `n` puts of
//! long values on distinct chains cost 3 round trips.
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
//! On an unordered fabric a lock whose `CAS` failed, or landed on a
//! record round A found retired, reused or unreadable, is judged on
//! round A's reply ([`KvSession::lock_taken`], with the batch's other
//! locks, after round B; released unchanged where it landed) and its
//! write redone or failed. A lock that landed on a live record stays a
//! planned lock through round B and is judged on round B's READs (a
//! round B not posted: each such lock released unchanged with its
//! error, as a failed READ releases it), then released as above, except
//! that [`KvSession::released_many`] posts each unlock itself and does
//! not wait: after its leaf WRITE completed; unchanged (posted at once)
//! when it wrote nothing, or after a leaf WRITE that failed
//! (indeterminate) or a round C not posted. A posted unlock stays in its
//! stripe until [`KvSession::reap`] or [`KvSession::settle`] sees it
//! complete; one that failed
//! goes to the record of locks maybe held, and its error to the request
//! that settled it (which did not run). Wherever a lock's release is
//! posted rather than awaited (also by [`KvSession::lock_taken`] and
//! [`ChainLock::abort`]), it is one of those pending unlocks.
//!
//! Value blocks, as [`KvSession::put`] settles them (module `values`):
//! a block taken for a request is the pipe's until its batch is over.
//! Once round 2 landed, a write that published it (an insert, an update
//! of a present key) leaves it to the slot that names it, and frees the
//! block of the value it replaced (or removed) with `ValueSpace::free`;
//! a write whose round 2 was posted and then failed (indeterminate) keeps
//! its block out of use for good, and frees nothing, since a slot may
//! name either. Every other block of the batch — an update of an absent
//! key, a lock not taken or released unchanged, an error before round 2
//! was posted, a request sent to the single path — was never named by a
//! slot and is given back (`ValueSpace::give_back`) before the batch's
//! redone requests run, which take their own.
//!
//! # Several sessions (a cluster's memory nodes)
//!
//! Each round is four steps, whoever drives them: plan (cut the next
//! batch, plan its ops, enter the locks' stripes), post
//! ([`Io::post_each`](crate::io::Io::post_each)), wait, apply (read
//! round 1 and plan round 2's releases; settle round 2's locks). An
//! unordered fabric's round B goes between them the same way, posted on
//! every session that has one before any is waited for. One
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

use rolex_core::layout::{BlockRef, SlotValue, ValueBlock};

use rolex_engine::TransferError;

use super::lock::{ChainLock, LeafWrite, LockReply, PlannedLock, Releases, IDENTITY_LEN};
use super::{as_u64, lookup, ChainAt, Chase, Edit, Kind, KvSession, LeafReads, WriteOp};
use crate::cache::{clock_ns, ModelView};
use crate::error::KvError;
use crate::io::{InFlight, Op};
use crate::stats::KvOp;
use crate::values::Block;

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
}

/// A request's answer: the value read or replaced.
pub type Answer = Result<Option<u64>, KvError>;

/// One request of a pipelined call of byte values
/// ([`KvSession::run_many_values`]). Each answers as its single method
/// does ([`Reply`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueRequest<'v> {
    /// [`KvSession::get_value`] of the key.
    Get(u64),
    /// [`KvSession::put`] of the key and value.
    Put(u64, &'v [u8]),
    /// [`KvSession::update_value`] of the key and value.
    Update(u64, &'v [u8]),
    /// [`KvSession::remove`] of the key.
    Remove(u64),
}

impl ValueRequest<'_> {
    /// The key it reads or writes.
    pub fn key(self) -> u64 {
        match self {
            ValueRequest::Get(k)
            | ValueRequest::Put(k, _)
            | ValueRequest::Update(k, _)
            | ValueRequest::Remove(k) => k,
        }
    }

    /// The kind it is counted as.
    pub fn kind(self) -> KvOp {
        match self {
            ValueRequest::Get(_) => KvOp::Get,
            ValueRequest::Put(..) => KvOp::Insert,
            ValueRequest::Update(..) => KvOp::Update,
            ValueRequest::Remove(_) => KvOp::Delete,
        }
    }
}

/// What a [`ValueRequest`] answers when it succeeds: what its single
/// method returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A get's value (`None`: absent), as [`KvSession::get_value`].
    Value(Option<Vec<u8>>),
    /// Whether a put, update or remove found the key present, as
    /// [`KvSession::put`], [`KvSession::update_value`] and
    /// [`KvSession::remove`] say.
    Present(bool),
}

/// A [`ValueRequest`]'s answer.
pub type ValueAnswer = Result<Reply, KvError>;

/// A request of either call as the pipeline runs it.
#[derive(Clone, Copy, Debug)]
enum Req<'v> {
    Get(u64),
    /// `value` is unused by a delete.
    Write {
        key: u64,
        op: WriteOp,
        value: Val<'v>,
    },
}

/// A write's value: a `u64` request's word or a value request's bytes.
#[derive(Clone, Copy, Debug)]
enum Val<'v> {
    Word(u64),
    Bytes(&'v [u8]),
}

impl Val<'_> {
    /// Its bytes.
    fn len(self) -> u64 {
        match self {
            Val::Word(_) => 8,
            Val::Bytes(b) => b.len() as u64,
        }
    }

    /// The slot value that holds it in the leaf; `None` when it goes out
    /// of line.
    fn inline(self) -> Option<SlotValue> {
        match self {
            Val::Word(v) => Some(SlotValue::from_u64(v)),
            Val::Bytes(b) => SlotValue::inline(b),
        }
    }
}

impl From<Request> for Req<'_> {
    fn from(r: Request) -> Self {
        let write = |key, op, v| Req::Write {
            key,
            op,
            value: Val::Word(v),
        };
        match r {
            Request::Get(k) => Req::Get(k),
            Request::Insert(k, v) => write(k, WriteOp::Insert, v),
            Request::Update(k, v) => write(k, WriteOp::Update, v),
            Request::Delete(k) => write(k, WriteOp::Delete, 0),
        }
    }
}

impl<'v> From<ValueRequest<'v>> for Req<'v> {
    fn from(r: ValueRequest<'v>) -> Self {
        let write = |key, op, b| Req::Write {
            key,
            op,
            value: Val::Bytes(b),
        };
        match r {
            ValueRequest::Get(k) => Req::Get(k),
            ValueRequest::Put(k, b) => write(k, WriteOp::Insert, b),
            ValueRequest::Update(k, b) => write(k, WriteOp::Update, b),
            ValueRequest::Remove(k) => write(k, WriteOp::Delete, &[]),
        }
    }
}

impl Req<'_> {
    fn key(self) -> u64 {
        match self {
            Req::Get(key) | Req::Write { key, .. } => key,
        }
    }

    /// Whether it locks its chain.
    fn writes(self) -> bool {
        !matches!(self, Req::Get(_))
    }
}

/// A request's outcome inside the pipeline: the slot value a get found,
/// or the one a write replaced (`None`: absent). Each call makes its
/// answers from it.
type Got = Result<Option<SlotValue>, KvError>;

/// One session's outcomes of a call, and the out-of-line values its gets
/// read in the call's rounds (the others are read after them).
type Outcomes = (Vec<Got>, Vec<Option<Vec<u8>>>);

/// A request as round 1 planned it.
struct Member {
    /// Its index in the call.
    i: usize,
    key: u64,
    at: ChainAt,
    /// Where its chain's leaves land in the read buffer.
    reads: LeafReads,
    /// Its ops in round 1 (past its model check, for a get).
    ops: Range<usize>,
    /// A write's lock, and round 1's ops from its `CAS` to its chain's
    /// last READ.
    lock: Option<(PlannedLock, Range<usize>)>,
    /// What a write does to its key.
    kind: Kind,
    /// The WRITE of its value's block in round 1, if it has one.
    value_write: Option<usize>,
    /// On an unordered fabric, a write's READs that wait for its `CAS`
    /// (round B): its record's state word and id again, then its chain.
    /// Empty on an ordered fabric, and for a get.
    later: Vec<Op>,
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
    /// `pipeline`): `n` requests on distinct chains cost 2 round trips in
    /// all on an ordered fabric, 3 on an unordered one (1 if all are
    /// gets). One answer per request, in order, each
    /// as its single method would give it; each request counts as one
    /// operation of its kind, the call's round trips shared out among
    /// them. `Err` only when no request ran: the previous operation's
    /// posted unlock failed (see [`Self::flush`]).
    pub fn run_many(&mut self, reqs: &[Request]) -> Result<Vec<Answer>, KvError> {
        let mut answers = Self::run_many_on(&mut [self], &[reqs]);
        answers.pop().unwrap_or_else(|| Ok(Vec::new()))
    }

    /// [`Self::run_many`] for byte values: gets, puts, updates and
    /// removes of values of any length ([`ValueRequest`]), each answered
    /// as its single method would ([`Reply`]). A long value's block is
    /// written in round 1, beside its chain's lock, so writes keep their
    /// 2 round trips (3 on an unordered fabric); the gets' out-of-line
    /// values are read in round 2 (module docs, "Values"). A write that
    /// would need a round trip to find a block for its value (a chunk
    /// claim, a pop of the pool's free stack) runs through the single
    /// path.
    pub fn run_many_values(
        &mut self,
        reqs: &[ValueRequest<'_>],
    ) -> Result<Vec<ValueAnswer>, KvError> {
        let mut answers = Self::run_many_values_on(&mut [self], &[reqs]);
        answers.pop().unwrap_or_else(|| Ok(Vec::new()))
    }

    /// [`Self::run_many`] on several sessions at once — one per memory
    /// node of a cluster, `reqs[i]` on `sessions[i]` (module docs,
    /// "Several sessions"): each batch's round 1 is posted on every
    /// session before any is waited for, then its round B (unordered
    /// fabric) and its round 2 likewise, so a call costs the round trips
    /// of its busiest session, not their sum.
    /// Each session's answers, errors and counters are what its own
    /// `run_many` would give for its requests.
    pub(crate) fn run_many_on(
        sessions: &mut [&mut KvSession],
        reqs: &[&[Request]],
    ) -> Vec<Result<Vec<Answer>, KvError>> {
        let inner: Vec<Vec<Req<'_>>> = reqs
            .iter()
            .map(|r| r.iter().map(|&r| Req::from(r)).collect())
            .collect();
        let got = Self::run_pipes(sessions, &inner, true);
        sessions
            .iter_mut()
            .zip(reqs)
            .zip(got)
            .map(|((s, &mine), got)| {
                let answers = got.map(|(got, _)| {
                    mine.iter()
                        .zip(got)
                        .map(|(&r, g)| s.u64_answer(r, g))
                        .collect()
                });
                s.count_call(mine.iter().map(|r| r.kind()));
                answers
            })
            .collect()
    }

    /// [`Self::run_many_values`] on several sessions at once, as
    /// [`Self::run_many_on`]; the gets' out-of-line values not read in
    /// round 2 are read after the last batch in rounds of one batch per
    /// session, each posted on every session before any is waited for.
    pub(crate) fn run_many_values_on(
        sessions: &mut [&mut KvSession],
        reqs: &[&[ValueRequest<'_>]],
    ) -> Vec<Result<Vec<ValueAnswer>, KvError>> {
        let inner: Vec<Vec<Req<'_>>> = reqs
            .iter()
            .map(|r| r.iter().map(|&r| Req::from(r)).collect())
            .collect();
        let got = Self::run_pipes(sessions, &inner, false);
        // The gets whose value is out of line and was not read in the
        // call's rounds: (request, key, slot value).
        let mut blocks: Vec<(Vec<usize>, Vec<u64>)> = Vec::with_capacity(reqs.len());
        let mut found = Vec::with_capacity(reqs.len());
        for (&mine, got) in reqs.iter().zip(&got) {
            let (mut idx, mut keys, mut vals) = (Vec::new(), Vec::new(), Vec::new());
            if let Ok((got, values)) = got {
                for (i, ((r, g), read)) in mine.iter().zip(got).zip(values).enumerate() {
                    if read.is_some() {
                        continue;
                    }
                    if let (ValueRequest::Get(key), Ok(Some(v @ SlotValue::Block(_)))) = (r, g) {
                        idx.push(i);
                        keys.push(*key);
                        vals.push(Some(*v));
                    }
                }
            }
            blocks.push((idx, keys));
            found.push(Ok(vals));
        }
        let keys: Vec<&[u64]> = blocks.iter().map(|(_, k)| k.as_slice()).collect();
        let read = Self::values_on(sessions, &keys, found);
        let mut out = Vec::with_capacity(reqs.len());
        for ((((s, &mine), got), (idx, _)), read) in sessions
            .iter_mut()
            .zip(reqs)
            .zip(got)
            .zip(&blocks)
            .zip(read)
        {
            let answers = got.map(|(got, mut values)| {
                let mut read = match read {
                    Ok(values) => idx
                        .iter()
                        .copied()
                        .zip(values.into_iter().map(Ok))
                        .collect(),
                    Err(e) => idx.iter().map(|&i| (i, Err(e.clone()))).collect(),
                };
                mine.iter()
                    .zip(got)
                    .enumerate()
                    .map(|(i, (&r, g))| {
                        let read = take_read(&mut read, i).or_else(|| {
                            let v = values[i].take()?;
                            s.io.cur.value_bytes += v.len() as u64;
                            Some(Ok(Some(v)))
                        });
                        s.value_answer(r, g, read)
                    })
                    .collect()
            });
            s.count_call(mine.iter().map(|r| r.kind()));
            out.push(answers);
        }
        out
    }

    /// A `u64` request's answer from its outcome.
    fn u64_answer(&mut self, req: Request, got: Got) -> Answer {
        let v = got?;
        match req {
            Request::Get(key) => {
                if let Some(v) = v {
                    self.io.cur.value_bytes += v.len() as u64;
                }
                v.map(|v| as_u64(key, v)).transpose()
            }
            _ => Ok(v.and_then(|o| o.as_u64())),
        }
    }

    /// A value request's answer from its outcome (`read`: its
    /// out-of-line value, read after the call's batches).
    fn value_answer(
        &mut self,
        req: ValueRequest<'_>,
        got: Got,
        read: Option<Result<Option<Vec<u8>>, KvError>>,
    ) -> ValueAnswer {
        let v = got?;
        if !matches!(req, ValueRequest::Get(_)) {
            return Ok(Reply::Present(v.is_some()));
        }
        if let Some(read) = read {
            return read.map(Reply::Value);
        }
        let bytes = v.and_then(|v| v.inline_bytes().map(<[u8]>::to_vec));
        if let Some(b) = &bytes {
            self.io.cur.value_bytes += b.len() as u64;
        }
        Ok(Reply::Value(bytes))
    }

    /// Runs each session's requests (`reqs[i]` on `sessions[i]`) to
    /// their outcomes; `strict`: a `u64` call's (its writes refuse a
    /// value that is not 8 bytes long).
    fn run_pipes<'r>(
        sessions: &mut [&mut KvSession],
        reqs: &'r [Vec<Req<'r>>],
        strict: bool,
    ) -> Vec<Result<Outcomes, KvError>> {
        let alone = sessions.len() == 1;
        let mut pipes: Vec<Option<Pipe<'r>>> = Vec::with_capacity(reqs.len());
        let mut results: Vec<Result<Outcomes, KvError>> = Vec::with_capacity(reqs.len());
        for (s, mine) in sessions.iter_mut().zip(reqs) {
            s.io.cur = Default::default();
            let mut pipe = None;
            results.push(s.reap().map(|()| {
                s.resolve_held();
                let got = if alone && mine.len() < 2 {
                    mine.iter().map(|&r| s.run_one(r, strict)).collect()
                } else {
                    pipe = Some(Pipe::new(mine, strict));
                    Vec::new()
                };
                (got, vec![None; mine.len()])
            }));
            pipes.push(pipe);
        }
        Self::drive(sessions, &mut pipes);
        for (r, pipe) in results.iter_mut().zip(pipes) {
            if let (Ok(answers), Some(pipe)) = (r.as_mut(), pipe) {
                *answers = pipe.answers();
            }
        }
        results
    }

    /// Counts a pipelined call of requests of `kinds`: each request one
    /// operation of its kind, the call's cost shared out among them.
    fn count_call(&mut self, kinds: impl Iterator<Item = KvOp>) {
        let mut counts = [0u64; 5];
        for k in kinds {
            counts[k.index()] += 1;
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
            let mut looked = Vec::with_capacity(round1.len());
            let mut round_b = Vec::with_capacity(round1.len());
            for (((s, p), plan), landed) in sessions
                .iter_mut()
                .zip(pipes.iter_mut())
                .zip(round1)
                .zip(landed)
            {
                let (Some(p), Some(plan)) = (p.as_mut(), plan) else {
                    looked.push(Vec::new());
                    round_b.push(None);
                    continue;
                };
                let (l, b) = s.read_round1(plan, landed, p);
                looked.push(l);
                round_b.push(b);
            }
            // Unordered fabric: the READs of the chains round 1 locked.
            if round_b.iter().any(Option::is_some) {
                let landed = post_all(sessions, &round_b, KvSession::post_round_b);
                for ((((s, p), plan), landed), looked) in sessions
                    .iter_mut()
                    .zip(pipes.iter())
                    .zip(round_b)
                    .zip(landed)
                    .zip(looked.iter_mut())
                {
                    if let (Some(p), Some(plan)) = (p.as_ref(), plan) {
                        looked.extend(s.read_round_b(plan, landed, p));
                    }
                }
            }
            let mut round2 = Vec::with_capacity(looked.len());
            for ((s, p), looked) in sessions.iter_mut().zip(pipes.iter_mut()).zip(looked) {
                round2.push(p.as_mut().and_then(|p| s.plan_round2(looked, p)));
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
                    s.finish_round2(r2, released, p);
                }
                // Every block the batch did not publish (or keep out of
                // use): given back before the redos take their own.
                for b in p.blocks.iter_mut().filter_map(Option::take) {
                    s.shared.values.give_back(b);
                }
                p.redo.sort_unstable();
                for i in std::mem::take(&mut p.redo) {
                    p.out[i] = Some(s.run_one(p.reqs[i], p.strict));
                }
            }
        }
    }

    /// The next batch of `p` (module docs), its round 1 planned; `None`
    /// when every request of `p` was answered or redone.
    fn next_batch(&mut self, p: &mut Pipe<'_>) -> Option<Round1> {
        while p.next < p.reqs.len() {
            // Posted unlocks that completed (a chain this batch locks
            // waits for its own: `plan_lock`).
            if let Err(e) = self.reap() {
                p.out[p.next] = Some(Err(e));
                p.next += 1;
                continue;
            }
            let mut batch: Vec<(usize, ChainAt)> = Vec::new();
            while let Some(&req) = p.reqs.get(p.next) {
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
                    let same = (b.m == at.m && b.j == at.j) || p.reqs[*k].key() == req.key();
                    same && (p.reqs[*k].writes() || req.writes())
                });
                if clash {
                    self.keep_view(at.m, (at.version, at.view));
                    break;
                }
                batch.push((p.next, at));
                p.next += 1;
            }
            return Some(self.plan_round1(batch, p));
        }
        None
    }

    /// Posts round 1 of a batch (its read buffer reserved first; its
    /// write buffer was, when its blocks were staged); `None` when it has
    /// nothing to post. On `Err` nothing was posted.
    fn post_round1<'a>(&'a mut self, plan: &'a Round1) -> Option<Posting<'a>> {
        if plan.members.is_empty() {
            return None;
        }
        let writes = plan.members.iter().filter(|m| m.lock.is_some()).count() as u64;
        let step = self.leaf_size.next_multiple_of(8) + self.io.copy_len(self.leaf_size);
        if let Err(e) = self.io.reserve(
            &self.shared.engine,
            plan.end,
            (writes * step).max(plan.write_end),
        ) {
            return Some(Err(e));
        }
        Some(
            self.io
                .post_each(&self.shared.pool, &plan.ops, "running a pipelined batch"),
        )
    }

    /// Posts round 2 of a batch: its writes and unlocks, and its gets'
    /// block READs (the read buffer reserved first); `None` when there is
    /// nothing to post (the releases could not be staged). On `Err`
    /// nothing was posted.
    fn post_round2<'a>(&'a mut self, r2: &'a Round2) -> Option<Posting<'a>> {
        let ops: &[Op] = if r2.reads.is_empty() {
            // Empty on an unordered fabric when no lock writes its leaf.
            let ops = r2.releases.as_ref()?.ops.as_ref().ok()?;
            if ops.is_empty() {
                return None;
            }
            ops
        } else {
            if let Err(e) = self.io.reserve(&self.shared.engine, r2.read_end, 0) {
                return Some(Err(e));
            }
            &r2.ops
        };
        Some(
            self.io
                .post_each(&self.shared.pool, ops, "writing and unlocking"),
        )
    }

    /// `req` through the single-operation path.
    fn run_one(&mut self, req: Req<'_>, strict: bool) -> Got {
        self.reap()?;
        match req {
            Req::Get(key) => self.get_inner(key),
            Req::Write { key, op, value } => {
                let word;
                let bytes = match (op, value) {
                    (WriteOp::Delete, _) => &[][..],
                    (_, Val::Word(v)) => {
                        word = v.to_le_bytes();
                        &word[..]
                    }
                    (_, Val::Bytes(b)) => b,
                };
                self.write_value(key, op, bytes, strict)
            }
        }
    }

    /// Takes and stages the blocks of the batch's long values (module
    /// docs, "Values"): each taken ([`KvSession::take_block`]: a round
    /// trip or more only for a class with no block ready), built at its
    /// own offset of the write buffer past what round 2's leaf writes use
    /// (the buffer reserved once, before any is built: a buffer that
    /// grows keeps nothing); its block in `p.blocks`. A write whose block
    /// could not be had or staged leaves the batch for the single path.
    /// Returns each staged value's WRITE and slot value, and the write
    /// buffer's bytes they use.
    fn stage_blocks(
        &mut self,
        batch: &mut Vec<(usize, ChainAt)>,
        p: &mut Pipe<'_>,
    ) -> (Vec<(usize, Op, SlotValue)>, u64) {
        let step = self.leaf_size.next_multiple_of(8) + self.io.copy_len(self.leaf_size);
        let base = self.value_local.max(batch.len() as u64 * step);
        let mut end = base;
        let mut staged: Vec<(usize, Op, SlotValue)> = Vec::new();
        let mut dropped: Vec<usize> = Vec::new();
        for &(i, _) in batch.iter() {
            let Req::Write {
                op: WriteOp::Insert | WriteOp::Update,
                value: Val::Bytes(value),
                ..
            } = p.reqs[i]
            else {
                continue;
            };
            if SlotValue::inline(value).is_some() {
                continue;
            }
            // A class with no block ready gets space now (a chunk claim
            // or a pop of the free stack: round trips before round 1,
            // fewer than the single path's three for the write). Where
            // none is to be had the write fails as the single path's
            // would, nothing written (a value too long for any block, a
            // full value region, a failed round trip: not tried twice).
            let block = match self.take_block(value.len()) {
                Ok(block) => block,
                Err(e) => {
                    p.out[i] = Some(Err(e));
                    dropped.push(i);
                    continue;
                }
            };
            let n = rolex_core::layout::ValueBlockHeader::SIZE + value.len() as u64;
            let op = Op::Write {
                remote: block.offset,
                local: end,
                len: n,
            };
            let at = BlockRef {
                offset: block.offset,
                len: value.len() as u32,
                gen: block.gen,
            };
            p.blocks[i] = Some(block);
            staged.push((i, op, SlotValue::Block(at)));
            end += n.next_multiple_of(8);
        }
        if !staged.is_empty() {
            let reserved = self.io.reserve(&self.shared.engine, 0, end);
            staged.retain(|&(i, op, _)| {
                let (Req::Write { key, value, .. }, Op::Write { local, len, .. }, Some(block)) =
                    (p.reqs[i], op, p.blocks[i])
                else {
                    return false;
                };
                let Val::Bytes(value) = value else {
                    return false;
                };
                let built = reserved.is_ok()
                    && self
                        .io
                        .fill(local, len, |out| {
                            ValueBlock::write(out, key, block.gen, block.class, value)
                        })
                        .is_ok_and(|b| b.is_some());
                if !built {
                    dropped.push(i);
                }
                built
            });
        }
        if !dropped.is_empty() {
            // Their blocks are given back after the batch; the single
            // path takes its own (those not answered already).
            let mut kept = Vec::with_capacity(batch.len());
            for (i, at) in batch.drain(..) {
                if dropped.contains(&i) {
                    self.keep_view(at.m, (at.version, at.view));
                    if p.out[i].is_none() {
                        p.redo.push(i);
                    }
                } else {
                    kept.push((i, at));
                }
            }
            *batch = kept;
        }
        // A batch without blocks asks nothing more of the write buffer.
        let end = if staged.is_empty() { 0 } else { end };
        (staged, end)
    }

    /// Round 1's plan: each request's ops at its own offsets of the read
    /// buffer (past the first leaf: a chase that reads a leaf alone reads
    /// it there), each write's lock planned (its stripe entered), each
    /// long value's block staged and its WRITE after its chain's READs.
    /// On an unordered fabric a write's READs of its record (again) and
    /// chain are kept for round B (`Member::later`), at the same offsets.
    fn plan_round1(&mut self, mut batch: Vec<(usize, ChainAt)>, p: &mut Pipe<'_>) -> Round1 {
        let step = self.leaf_size.next_multiple_of(8);
        let (staged, write_end) = self.stage_blocks(&mut batch, p);
        let mut plan = Round1 {
            members: Vec::with_capacity(batch.len()),
            ops: Vec::new(),
            checks: Vec::new(),
            posted: clock_ns(),
            end: step,
            write_end,
        };
        let mut chain = Vec::new();
        for (i, at) in batch {
            let req = p.reqs[i];
            let block = staged.iter().find(|s| s.0 == i);
            let kind =
                match req {
                    Req::Get(_)
                    | Req::Write {
                        op: WriteOp::Delete,
                        ..
                    } => Some(Kind::Delete),
                    Req::Write { op, value, .. } => block
                        .map(|s| s.2)
                        .or_else(|| value.inline())
                        .map(|v| match op {
                            WriteOp::Insert => Kind::Insert(v),
                            _ => Kind::Update(v),
                        }),
                };
            let Some(kind) = kind else {
                p.redo.push(i);
                self.keep_view(at.m, (at.version, at.view));
                continue;
            };
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
                    p.redo.push(i);
                    self.keep_view(at.m, (at.version, at.view));
                    continue;
                }
                Err(e) => {
                    p.out[i] = Some(Err(e));
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
                        p.redo.push(i);
                        self.keep_view(at.m, (at.version, at.view));
                        continue;
                    }
                    Err(e) => {
                        p.out[i] = Some(Err(e));
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
                            p.out[i] = Some(Err(e));
                            self.keep_view(at.m, (at.version, at.view));
                            continue;
                        }
                    }
                }
                None
            };
            // Unordered: a READ posted with the CAS may run before it.
            let mut later = Vec::new();
            if lock.is_some() && !self.shared.ordered {
                later.extend(plan.ops.last().copied());
            }
            let mut reads = Vec::with_capacity(remotes.len());
            for (&addr, remote) in chain.iter().zip(remotes) {
                let read = Op::Read {
                    remote,
                    local: plan.end,
                    len: self.leaf_size,
                };
                if later.is_empty() {
                    plan.ops.push(read);
                } else {
                    later.push(read);
                }
                reads.push((addr, plan.end));
                plan.end += step;
            }
            if later.is_empty() {
                self.io.cur.leaves_read += reads.len() as u64;
            }
            let ops = start..plan.ops.len();
            let lock = lock.map(|p| (p, ops.clone()));
            // After its chain's READs, outside its lock's range: a failed
            // block WRITE is no failed READ of the lock's batch.
            let value_write = block.map(|&(_, op, _)| {
                plan.ops.push(op);
                plan.ops.len() - 1
            });
            plan.members.push(Member {
                i,
                key: req.key(),
                at,
                reads,
                ops,
                lock,
                kind,
                value_write,
                later,
            });
        }
        plan
    }

    /// Round 1 as it landed (`landed`: its ops' outcomes; `Err`: nothing
    /// was posted): takes everything out of the read buffer before
    /// anything else may use it (a model refresh reads into it): each
    /// get's answer, each write's lock reply and, where the lock landed
    /// on a live record and its value's block was written, its edit.
    /// Returns the writes; on an unordered fabric, those whose lock
    /// landed so are returned apart, their READs still to post (round B).
    fn read_round1(
        &mut self,
        plan: Round1,
        landed: Option<Landed>,
        p: &mut Pipe<'_>,
    ) -> (Vec<Looked>, Option<RoundB>) {
        let Round1 {
            members,
            checks,
            posted,
            end,
            ..
        } = plan;
        if members.is_empty() {
            return (Vec::new(), None);
        }
        let results = match landed.unwrap_or_else(|| Ok(Vec::new())) {
            Ok(r) => r,
            Err(e) => {
                // Nothing posted: no lock was taken.
                for m in members {
                    if let Some((planned, _)) = m.lock {
                        planned.not_posted();
                    }
                    p.out[m.i] = Some(Err(e.clone()));
                    self.keep_view(m.at.m, (m.at.version, m.at.view));
                }
                return (Vec::new(), None);
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
        let mut locking = Vec::new();
        for m in members {
            self.chain.clear();
            self.chain.extend(m.reads.iter().map(|r| r.0));
            let key = m.key;
            let Some((planned, range)) = m.lock else {
                // A get whose READs failed is redone alone (a READ has no
                // effect), which reports the error if it fails again.
                if failed(&m.ops) || stale.iter().any(|v| Arc::ptr_eq(v, &m.at.view)) {
                    p.redo.push(m.i);
                } else {
                    match self.get_answer(key, &m.at, &m.reads) {
                        Ok(Some(got)) => {
                            if let (false, Some(at)) = (p.strict, got.and_then(|v| v.block())) {
                                p.fresh.push((m.i, at));
                            }
                            p.out[m.i] = Some(Ok(got));
                        }
                        Ok(None) => p.redo.push(m.i),
                        Err(e) => p.out[m.i] = Some(Err(e)),
                    }
                }
                self.keep_view(m.at.m, (m.at.version, m.at.view));
                continue;
            };
            let reply = self.lock_reply(&planned, results.get(range).unwrap_or(&[]));
            // A block that may not have landed is never published: the
            // lock is released unchanged and the write redone.
            let written = m
                .value_write
                .map_or(true, |w| results.get(w).is_some_and(Result::is_ok));
            let live = written && reply.landed(&planned, &m.at);
            if live && !m.later.is_empty() {
                locking.push(Locking {
                    i: m.i,
                    key,
                    at: m.at,
                    reads: m.reads,
                    kind: m.kind,
                    planned,
                    reply,
                    ops: m.later,
                });
                continue;
            }
            let edit = live.then(|| self.edit_owner(key, m.kind, p.strict, &m.at, &m.reads));
            looked.push(Looked {
                i: m.i,
                at: m.at,
                planned,
                reply,
                edit,
            });
        }
        let round_b = (!locking.is_empty()).then(|| RoundB::new(locking, end));
        (looked, round_b)
    }

    /// Posts round B of a batch (unordered fabric): the READs of each
    /// write whose lock round 1 took. On `Err` nothing was posted.
    fn post_round_b<'a>(&'a mut self, plan: &'a RoundB) -> Option<Posting<'a>> {
        if let Err(e) = self.io.reserve(&self.shared.engine, plan.end, 0) {
            return Some(Err(e));
        }
        self.io.cur.leaves_read += plan.leaves;
        Some(
            self.io
                .post_each(&self.shared.pool, &plan.ops, "reading locked chains"),
        )
    }

    /// Round B as it landed (`Err`: nothing posted): each write's lock
    /// reply with its record as read after the `CAS`, and, where the
    /// record is still live, its edit. Returns the writes, as round 1
    /// returns them on an ordered fabric.
    fn read_round_b(&mut self, plan: RoundB, landed: Option<Landed>, p: &Pipe<'_>) -> Vec<Looked> {
        let landed = landed.unwrap_or_else(|| Ok(Vec::new()));
        let mut looked = Vec::with_capacity(plan.locking.len());
        for (w, range) in plan.locking.into_iter().zip(plan.ranges) {
            let reads = match &landed {
                Ok(r) => Ok(r.get(range).unwrap_or(&[])),
                Err(e) => Err(e.clone()),
            };
            let reply = self.lock_reply_after(&w.planned, w.reply, reads);
            self.chain.clear();
            self.chain.extend(w.reads.iter().map(|r| r.0));
            let edit = reply
                .landed(&w.planned, &w.at)
                .then(|| self.edit_owner(w.key, w.kind, p.strict, &w.at, &w.reads));
            looked.push(Looked {
                i: w.i,
                at: w.at,
                planned: w.planned,
                reply,
                edit,
            });
        }
        looked
    }

    /// A get's slot value from round 1's reads of its chain; `None` when
    /// the chase says the model is stale (redo it).
    fn get_answer(
        &mut self,
        key: u64,
        at: &ChainAt,
        reads: &LeafReads,
    ) -> Result<Option<Option<SlotValue>>, KvError> {
        let start = self.chain[0];
        match self.chase(at.m as u64, key, start, 0, reads)? {
            Chase::Owner(owner) => {
                self.learn(&at.view, at.j, &owner.path, owner.addr);
                Ok(Some(lookup(&owner.bytes, key)))
            }
            Chase::Stale => Ok(None),
        }
    }

    /// Round 2's plan: each write's lock judged ([`Self::lock_taken`]),
    /// and its release — with its leaf write, or unchanged — planned into
    /// one batch ([`Self::plan_release_many`]); `None` when no lock is
    /// to be released.
    fn plan_round2(&mut self, looked: Vec<Looked>, p: &mut Pipe<'_>) -> Option<Round2> {
        let mut releases: Vec<(ChainLock, Option<LeafWrite>)> = Vec::new();
        let mut then: Vec<(usize, Then, bool)> = Vec::new();
        for l in looked {
            let taken = self.lock_taken(&l.at, l.planned, 0, l.reply);
            self.keep_view(l.at.m, (l.at.version, l.at.view));
            let lock = match taken {
                Ok(Some(lock)) => lock,
                Ok(None) => {
                    p.redo.push(l.i);
                    continue;
                }
                Err(e) => {
                    p.out[l.i] = Some(Err(e));
                    continue;
                }
            };
            let (write, next) = match l.edit {
                // A lock taken on a live record has its edit, unless its
                // value's block was not written.
                None => (None, Then::Redo),
                Some(Err(e)) => {
                    p.out[l.i] = Some(Err(lock.abort(self, e)));
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
                if let Req::Write { value, .. } = p.reqs[l.i] {
                    self.io.cur.value_bytes += value.len();
                }
            }
            then.push((l.i, next, write.is_some()));
            releases.push((lock, write));
        }
        // The gets' value blocks, up to a MiB of them (the rest are read
        // after the call's last batch).
        let mut reads = Vec::new();
        let mut read_end = 0u64;
        for (i, at) in p.fresh.drain(..) {
            let len = at.read_len();
            let fits = reads.is_empty() || read_end + len <= super::SCAN_VALUE_BATCH;
            if fits && self.check_pointer(p.reqs[i].key(), at).is_ok() {
                reads.push((i, at, read_end));
                read_end += len.next_multiple_of(8);
            }
        }
        if releases.is_empty() && reads.is_empty() {
            return None;
        }
        let releases = (!releases.is_empty()).then(|| self.plan_release_many(releases));
        // Without READs the releases' ops are posted as they are.
        let mut ops = Vec::new();
        if !reads.is_empty() {
            if let Some(Ok(r)) = releases.as_ref().map(|r| r.ops.as_ref()) {
                ops.extend_from_slice(r);
            }
            ops.extend(reads.iter().map(|&(_, at, local)| Op::Read {
                remote: at.offset,
                local,
                len: at.read_len(),
            }));
        }
        Some(Round2 {
            releases,
            then,
            reads,
            ops,
            read_end,
        })
    }

    /// Round 2 as it landed (`landed`: the batch's outcomes; `Err`:
    /// nothing posted; `None`: nothing to post): every lock settled
    /// ([`Self::released_many`]), each write answered or sent to `redo`,
    /// and its blocks settled ([`Self::settle_blocks`]).
    fn finish_round2(&mut self, r2: Round2, landed: Option<Landed>, p: &mut Pipe<'_>) {
        let Round2 {
            releases,
            then,
            reads,
            ..
        } = r2;
        let landed = landed.unwrap_or_else(|| Ok(Vec::new()));
        // The READs' outcomes follow the releases'.
        let split = releases
            .as_ref()
            .and_then(|r| r.ops.as_ref().ok())
            .map_or(0, Vec::len);
        if let Ok(results) = &landed {
            for (k, (i, at, local)) in reads.into_iter().enumerate() {
                if !results.get(split + k).is_some_and(Result::is_ok) {
                    continue;
                }
                let key = p.reqs[i].key();
                // A block rewritten since its leaf was read (or a READ
                // that failed) is read again after the call's batches.
                if let Ok(Ok(v)) = self.io.with_local(local, at.read_len(), |b| {
                    ValueBlock::check(b, key, at).map(<[u8]>::to_vec)
                }) {
                    p.values[i] = Some(v);
                }
            }
        }
        let Some(releases) = releases else {
            return;
        };
        // Whether the leaf writes went out: from then on a slot may name
        // their blocks.
        let posted = releases.ops.is_ok() && landed.is_ok();
        let posting = landed
            .as_deref()
            .map(|r| r.get(..split).unwrap_or(r))
            .map_err(Clone::clone);
        let released = self.released_many(releases, posting);
        for ((i, next, wrote), r) in then.into_iter().zip(released) {
            p.out[i] = match (r, next) {
                (Err(e), _) => {
                    if wrote && posted && e.may_have_applied() {
                        // Its outcome unknown: its block is never handed
                        // out again (nor the one it may have replaced
                        // freed). A determinate error wrote no slot: the
                        // block goes back after the batch.
                        p.blocks[i] = None;
                    }
                    Some(Err(e))
                }
                (Ok(()), Then::Old(old)) => {
                    self.settle_blocks(p, i, old);
                    Some(Ok(old))
                }
                (Ok(()), Then::NotU64(len)) => Some(Err(KvError::ValueNotU64 {
                    key: p.reqs[i].key(),
                    len,
                })),
                (Ok(()), Then::Redo) => {
                    p.redo.push(i);
                    None
                }
            };
        }
    }

    /// The blocks of request `i`, whose write landed and replaced `old`,
    /// as [`Self::write_value`] settles them: its own block kept when the
    /// write published it (else given back after the batch), the
    /// replaced value's block freed.
    fn settle_blocks(&mut self, p: &mut Pipe<'_>, i: usize, old: Option<SlotValue>) {
        let Req::Write { op, .. } = p.reqs[i] else {
            return;
        };
        let published = match op {
            WriteOp::Insert => true,
            WriteOp::Update => old.is_some(),
            WriteOp::Delete => false,
        };
        if published {
            p.blocks[i] = None;
        }
        let replaced = published || op == WriteOp::Delete;
        let Some(o) = old.and_then(|o| o.block()).filter(|_| replaced) else {
            return;
        };
        if let Some(class) = rolex_core::layout::block_class(o.len as usize) {
            if self.shared.values.free(o.offset, class, o.gen) {
                self.shed_values();
            }
        }
    }
}

/// One session's share of a pipelined call as it goes: its requests,
/// their outcomes so far, the next request a batch starts at, the
/// current batch's requests to redo through the single path and the
/// blocks its long values took (until published or given back).
struct Pipe<'r> {
    reqs: &'r [Req<'r>],
    /// A `u64` call's: writes refuse a value not 8 bytes long.
    strict: bool,
    out: Vec<Option<Got>>,
    next: usize,
    redo: Vec<usize>,
    blocks: Vec<Option<Block>>,
    /// The current batch's gets that found a value out of line.
    fresh: Vec<(usize, BlockRef)>,
    /// The out-of-line values read in round 2, by request.
    values: Vec<Option<Vec<u8>>>,
}

impl<'r> Pipe<'r> {
    fn new(reqs: &'r [Req<'r>], strict: bool) -> Self {
        Self {
            reqs,
            strict,
            out: vec![None; reqs.len()],
            next: 0,
            redo: Vec::new(),
            blocks: vec![None; reqs.len()],
            fresh: Vec::new(),
            values: vec![None; reqs.len()],
        }
    }

    /// The outcomes, in request order, and the out-of-line values read.
    fn answers(self) -> (Vec<Got>, Vec<Option<Vec<u8>>>) {
        debug_assert!(
            self.out.iter().all(Option::is_some),
            "a request got no answer"
        );
        debug_assert!(
            self.blocks.iter().all(Option::is_none),
            "a block was neither published nor given back"
        );
        (self.out.into_iter().flatten().collect(), self.values)
    }
}

/// Takes request `i`'s entry out of `read` (request, value read), if it
/// has one.
fn take_read<T>(read: &mut Vec<(usize, T)>, i: usize) -> Option<T> {
    let at = read.iter().position(|(k, _)| *k == i)?;
    Some(read.swap_remove(at).1)
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

/// Round 2 of a batch as planned: the releases, what each released
/// write answers (and whether it writes its leaf), and the READs of the
/// value blocks of the batch's gets.
struct Round2 {
    /// `None` when no lock is to be released.
    releases: Option<Releases>,
    then: Vec<(usize, Then, bool)>,
    /// Each get's block READ: (request, its block, where it lands).
    reads: Vec<(usize, BlockRef, u64)>,
    /// The batch when it has READs: the releases' ops (if they could be
    /// staged), then the READs; empty without READs.
    ops: Vec<Op>,
    /// The read buffer's bytes the READs use.
    read_end: u64,
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
    /// The write buffer's bytes its staged blocks use.
    write_end: u64,
}

/// A write whose lock `CAS` landed in round 1 on an unordered fabric:
/// its round B READs (the record's, then the chain's) still to post.
struct Locking {
    i: usize,
    key: u64,
    at: ChainAt,
    reads: LeafReads,
    kind: Kind,
    planned: PlannedLock,
    /// Round 1's reply: its `CAS` is the lock's.
    reply: LockReply,
    ops: Vec<Op>,
}

/// Round B of a batch on an unordered fabric: the READs of every write
/// whose lock round 1 took, each at the offsets round 1 gave it.
struct RoundB {
    locking: Vec<Locking>,
    ops: Vec<Op>,
    /// Each write's ops in `ops`.
    ranges: Vec<Range<usize>>,
    /// The read buffer's bytes round 1 planned (round B's READs in it).
    end: u64,
    /// Leaves its READs read.
    leaves: u64,
}

impl RoundB {
    fn new(mut locking: Vec<Locking>, end: u64) -> Self {
        let mut ops = Vec::new();
        let mut ranges = Vec::with_capacity(locking.len());
        for w in &mut locking {
            let start = ops.len();
            ops.append(&mut w.ops);
            ranges.push(start..ops.len());
        }
        let leaves = locking.iter().map(|w| w.reads.len() as u64).sum();
        Self {
            locking,
            ops,
            ranges,
            end,
            leaves,
        }
    }
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
