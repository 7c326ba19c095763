//! The compute node's I/O layer: [`Io`], a session's own queue pair
//! ([`Channel`]) with its registered read and write buffers, and [`Op`], one
//! one-sided operation of a doorbell batch addressed by pool offset and
//! buffer offset.
//!
//! Every protocol step of the store is one [`Io::run`]: the ops it is given
//! go out as one doorbell batch, and the call returns when all of them have
//! completed — one dependent round trip, counted in [`Io::cur`] together
//! with the bytes and atomics it carried. That count is what
//! `host/tests/kv_rtts.rs` asserts per operation, so `Io` posts nothing
//! outside `run` (the one operation a session posts without waiting for
//! it, an unordered fabric's unlock, goes through the engine and is counted
//! as `posted`, not as a round trip). [`Io::post_each`] is `run`'s first
//! half, for a thread that posts on several memory nodes' sessions before
//! it waits on any (still one round trip per batch in each `Io`). The
//! buffers are reused by every step: a READ lands at `local` in the read
//! buffer (copied out with [`Io::local`]), a WRITE sends what
//! [`Io::stage`] put at `local` in the write buffer; a step's caller keeps
//! its ops' buffer ranges disjoint.
//!
//! With a lease ([`LeaseFence`]), a batch that writes anything (WRITE,
//! `CAS`, FAA) is posted only while the lease is valid; otherwise `run`
//! fails with [`KvError::LeaseExpired`] and posts nothing. A lease granted
//! a key to the pool of its own fences reads too (the memory node closes
//! that key when the lease ends there).

use rolex_core::wire::{Access, MrDesc};
use rolex_engine::batch::{BatchOp, Channel, Posted};
use rolex_engine::engine::TransferEngine;
use rolex_engine::{MrHandle, TransferError};

use std::sync::Arc;

use crate::error::{transfer, KvError};
use crate::lease::LeaseFence;
use crate::redo::{Outcome, RedoLog};
use crate::stats::OpStats;
use rolex_core::layout::RedoHeader;

/// One operation of a doorbell batch, by pool and local offsets.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    /// READ `len` pool bytes at `remote` into the read buffer at `local`.
    Read { remote: u64, local: u64, len: u64 },
    /// WRITE `len` bytes of the write buffer at `local` to the pool.
    Write { remote: u64, local: u64, len: u64 },
    /// CAS on the pool word at `remote`.
    Cas {
        remote: u64,
        expected: u64,
        new: u64,
    },
    /// FAA on the pool word at `remote`.
    Faa { remote: u64, add: u64 },
}

/// A session's queue pair and registered buffers, counting what it posts.
pub(crate) struct Io {
    ch: Channel,
    rbuf: MrHandle,
    wbuf: MrHandle,
    results: Vec<Result<u64, TransferError>>,
    values: Vec<u64>,
    /// The lease this client's writes need, if it has one.
    fence: Option<LeaseFence>,
    /// A READ into `rbuf` failed (timed out, among others): the provider
    /// may still land it there later, so `rbuf` is no longer looked at in
    /// place: [`Io::with_local`] copies out of it from then on (a session
    /// that saw a READ fail pays the copy a get paid before).
    rbuf_tainted: bool,
    /// A WRITE from `wbuf` failed: the provider may still read it later,
    /// so [`Io::fill`] no longer builds bytes in place there (it builds
    /// them aside and copies them in, as [`Io::stage`] does).
    wbuf_tainted: bool,
    /// What the current operation has cost so far.
    pub(crate) cur: OpStats,
    /// The client's redo block, where its leaf writes are copied first
    /// (module `redo`).
    redo: Option<Arc<RedoLog>>,
    /// Redo entries staged by the last [`Io::stage_writes`]: the next
    /// batch posts their WRITEs first, ahead of every op it was given.
    logged: Vec<Logged>,
    /// The next batch with its redo entries in front.
    batch: Vec<Op>,
    /// Scratch for encoding a redo entry.
    entry: Vec<u8>,
}

/// A redo entry staged for the next batch.
#[derive(Clone, Copy, Debug)]
struct Logged {
    /// Its WRITE (from the write buffer to its slot).
    op: Op,
    slot: u32,
    /// Pool offset of the leaf write it copies.
    target: u64,
}

/// A batch [`Io::post_each`] posted and nobody waited for yet: it holds
/// the `Io` borrowed (its buffers may still be landing) until
/// [`InFlight::wait`], or its drop, which waits too (and then trusts
/// neither buffer in place: it did not look at the outcomes).
#[must_use = "a posted batch is waited for by `wait`"]
pub(crate) struct InFlight<'a> {
    /// `Some` until waited for.
    posted: Option<Posted<'a>>,
    /// The batch as posted: redo entries first (`logged`), then the ops.
    ops: &'a [Op],
    logged: &'a mut Vec<Logged>,
    redo: Option<&'a RedoLog>,
    rbuf_tainted: &'a mut bool,
    wbuf_tainted: &'a mut bool,
}

impl<'a> InFlight<'a> {
    /// Waits for the batch: each op's own outcome, in order, as
    /// [`Io::run_each`] returns them.
    pub(crate) fn wait(mut self) -> &'a [Result<u64, TransferError>] {
        let Some(posted) = self.posted.take() else {
            return &[];
        };
        let results = posted.wait();
        taint(self.ops, results, self.rbuf_tainted, self.wbuf_tainted);
        let skip = self.logged.len();
        settle_logged(self.redo, self.logged, self.ops, Some(results));
        results.get(skip..).unwrap_or(&[])
    }
}

impl Drop for InFlight<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(posted) = self.posted.take() {
            drop(posted);
            *self.rbuf_tainted = true;
            *self.wbuf_tainted = true;
            // Outcomes not looked at: every copied leaf may be torn.
            settle_logged(self.redo, self.logged, self.ops, None);
        }
    }
}

impl Io {
    /// Opens a channel on `engine` (a queue pair of the session's own) and
    /// registers a read and a write buffer of `cap` bytes each; its
    /// writes need `fence` valid, if given.
    pub(crate) fn new(
        engine: &TransferEngine,
        cap: u64,
        fence: Option<LeaseFence>,
    ) -> Result<Self, KvError> {
        let ch = engine.channel().map_err(transfer("opening a channel"))?;
        let (rbuf, _) = engine
            .alloc_mr(cap, Access::LOCAL_WRITE)
            .map_err(transfer("registering a session buffer"))?;
        let (wbuf, _) = engine
            .alloc_mr(cap, Access::LOCAL_WRITE)
            .map_err(transfer("registering a session buffer"))?;
        Ok(Self {
            ch,
            rbuf,
            wbuf,
            results: Vec::new(),
            values: Vec::new(),
            fence,
            rbuf_tainted: false,
            wbuf_tainted: false,
            cur: OpStats::default(),
            redo: None,
            logged: Vec::new(),
            batch: Vec::new(),
            entry: Vec::new(),
        })
    }

    /// Copies this `Io`'s leaf writes into `redo` from now on (module
    /// `redo`).
    pub(crate) fn set_redo(&mut self, redo: Option<Arc<RedoLog>>) {
        self.redo = redo;
    }

    /// Bytes the read buffer holds.
    pub(crate) fn read_cap(&self) -> u64 {
        self.rbuf.len()
    }

    /// Makes the read buffer hold at least `read` bytes and the write
    /// buffer `write` (registering larger ones, at least doubled, when
    /// they are smaller: a value larger than the buffers grows them once).
    /// Buffer contents are not kept.
    pub(crate) fn reserve(
        &mut self,
        engine: &TransferEngine,
        read: u64,
        write: u64,
    ) -> Result<(), KvError> {
        let grow = |cur: u64, want: u64| want.max(cur.saturating_mul(2));
        if self.rbuf.len() < read {
            let len = grow(self.rbuf.len(), read);
            self.rbuf = engine
                .alloc_mr(len, Access::LOCAL_WRITE)
                .map_err(transfer("growing a session buffer"))?
                .0;
        }
        if self.wbuf.len() < write {
            let len = grow(self.wbuf.len(), write);
            self.wbuf = engine
                .alloc_mr(len, Access::LOCAL_WRITE)
                .map_err(transfer("growing a session buffer"))?
                .0;
        }
        Ok(())
    }

    /// Posts `ops` as one doorbell batch and waits: one dependent round
    /// trip. Returns each op's value (old word of an atomic, else 0), or
    /// the first op's error (then the others' outcomes are unknown to the
    /// caller: use [`Io::run_each`] where they matter).
    pub(crate) fn run(
        &mut self,
        pool: &MrDesc,
        ops: &[Op],
        during: &'static str,
    ) -> Result<&[u64], KvError> {
        self.post_and_wait(pool, ops, during)?;
        self.values.clear();
        for r in self.results.drain(..) {
            self.values.push(r.map_err(transfer(during))?);
        }
        Ok(&self.values)
    }

    /// [`Io::run`] with each op's own outcome: `Err` only when nothing was
    /// posted (the engine is shut down); otherwise one result per op, in
    /// order, so a caller knows which of a batch's writes and atomics may
    /// have landed.
    pub(crate) fn run_each(
        &mut self,
        pool: &MrDesc,
        ops: &[Op],
        during: &'static str,
    ) -> Result<&[Result<u64, TransferError>], KvError> {
        self.post_and_wait(pool, ops, during)?;
        Ok(&self.results)
    }

    fn post_and_wait(
        &mut self,
        pool: &MrDesc,
        ops: &[Op],
        during: &'static str,
    ) -> Result<(), KvError> {
        if let Err(e) = self.check_lease_for(ops) {
            settle_logged(self.redo.as_deref(), &mut self.logged, &[], None);
            return Err(e);
        }
        let mut all = std::mem::take(&mut self.batch);
        let ops = with_logged(&self.logged, ops, &mut all);
        let batch = batch_ops(ops, pool, &self.rbuf, &self.wbuf, &mut self.cur);
        let done = self.ch.run_iter(batch, &mut self.results);
        self.cur.rtts += 1;
        if done.is_err() {
            // Nothing was posted; still, trust neither buffer in place.
            self.rbuf_tainted = true;
            self.wbuf_tainted = true;
            settle_logged(self.redo.as_deref(), &mut self.logged, &[], None);
        } else {
            taint(
                ops,
                &self.results,
                &mut self.rbuf_tainted,
                &mut self.wbuf_tainted,
            );
            let skip = self.logged.len();
            settle_logged(
                self.redo.as_deref(),
                &mut self.logged,
                ops,
                Some(&self.results),
            );
            // The entries' own outcomes are not the caller's.
            self.results.drain(..skip);
        }
        self.batch = all;
        done.map_err(transfer(during))
    }

    /// The first half of [`Io::run_each`]: checks the lease as `run` does
    /// and posts `ops` as one doorbell batch (one round trip in [`Io::cur`])
    /// without waiting. `Err` only when nothing was posted (the lease, or
    /// the engine shut down). The returned [`InFlight`] borrows this `Io`
    /// until [`InFlight::wait`] (or its drop, which waits too): nothing
    /// else uses the buffers while the batch may land in them. Several
    /// sessions' `Io`s (one per memory node) each post one batch before
    /// any waits: their round trips overlap.
    pub(crate) fn post_each<'a>(
        &'a mut self,
        pool: &MrDesc,
        ops: &'a [Op],
        during: &'static str,
    ) -> Result<InFlight<'a>, KvError> {
        if let Err(e) = self.check_lease_for(ops) {
            settle_logged(self.redo.as_deref(), &mut self.logged, &[], None);
            return Err(e);
        }
        let Io {
            ch,
            rbuf,
            wbuf,
            results,
            rbuf_tainted,
            wbuf_tainted,
            cur,
            redo,
            logged,
            batch,
            ..
        } = self;
        let ops = with_logged(logged, ops, batch);
        let posted = ch.post_iter(batch_ops(ops, pool, rbuf, wbuf, cur), results);
        cur.rtts += 1;
        let redo = redo.as_deref();
        match posted {
            Ok(posted) => Ok(InFlight {
                posted: Some(posted),
                ops,
                logged,
                redo,
                rbuf_tainted,
                wbuf_tainted,
            }),
            Err(e) => {
                // Nothing was posted; still, trust neither buffer in place.
                *rbuf_tainted = true;
                *wbuf_tainted = true;
                settle_logged(redo, logged, &[], None);
                Err(transfer(during)(e))
            }
        }
    }

    /// `Ok` unless `ops` need the lease and it is not valid now. A lease
    /// with a key of its own: that key is closed at the memory node when
    /// the lease ends there, so reads are refused here too.
    #[inline]
    fn check_lease_for(&self, ops: &[Op]) -> Result<(), KvError> {
        let own_key = self.fence.as_ref().is_some_and(|f| f.pool().is_some());
        if own_key || ops.iter().any(|op| !matches!(op, Op::Read { .. })) {
            self.check_lease()?;
        }
        Ok(())
    }

    /// `Ok` unless this client has a lease and it is not valid now: then
    /// nothing that writes may be posted.
    pub(crate) fn check_lease(&self) -> Result<(), KvError> {
        match &self.fence {
            Some(f) if !f.valid() => Err(KvError::LeaseExpired { owner: f.owner().0 }),
            _ => Ok(()),
        }
    }

    /// Copies read-buffer bytes `[local, local + out.len())` into `out`.
    pub(crate) fn local(&self, local: u64, out: &mut [u8]) -> Result<(), KvError> {
        self.rbuf
            .read(local, out)
            .map_err(transfer("reading a session buffer"))
    }

    /// Calls `f` with read-buffer bytes `[local, local + len)` where they
    /// lie: no copy and one region guard (the get path checks its
    /// directory word and searches its leaf there).
    pub(crate) fn with_local<R>(
        &self,
        local: u64,
        len: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, KvError> {
        if self.rbuf_tainted {
            let n = usize::try_from(len).map_err(|_| KvError::Transfer {
                during: "reading a session buffer",
                error: TransferError::LocalOutOfBounds {
                    offset: local,
                    len,
                    region_len: self.rbuf.len(),
                },
            })?;
            let bytes = self
                .rbuf
                .to_vec(local, n)
                .map_err(transfer("reading a session buffer"))?;
            return Ok(f(&bytes));
        }
        // SAFETY: nothing writes the read buffer while `f` runs. It is this
        // `Io`'s alone: registered for local writes only (no peer can
        // write it), never cloned or handed out, and the only operations
        // that land in it are the READs of this `Io`'s own batches. Those
        // are posted by `run`/`run_each`, which return only once every op
        // of their batch completed (`Channel::run_iter`), or by
        // `post_each`, whose `InFlight` holds `&mut self` until the batch
        // completed (its `wait`, or its drop, waits); all take
        // `&mut self`, so none is in progress while `&self` is lent here.
        // A READ that completed with an error (a timeout above all) may
        // still land later: the buffer is then tainted and copied from
        // instead (above).
        unsafe { self.rbuf.with_bytes(local, len, f) }.map_err(transfer("reading a session buffer"))
    }

    /// The little-endian word at `local` in the read buffer.
    pub(crate) fn local_u64(&self, local: u64) -> Result<u64, KvError> {
        let mut b = [0u8; 8];
        self.local(local, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Stages `bytes` in the write buffer at `local`.
    pub(crate) fn stage(&self, local: u64, bytes: &[u8]) -> Result<(), KvError> {
        self.wbuf
            .write(local, bytes)
            .map_err(transfer("filling a session buffer"))
    }

    /// Has `f` build `len` bytes at `local` of the write buffer where they
    /// lie (no copy of what it builds), returning what `f` returns.
    pub(crate) fn fill<R>(
        &mut self,
        local: u64,
        len: u64,
        f: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, KvError> {
        let during = "filling a session buffer";
        if self.wbuf_tainted {
            let n = usize::try_from(len).map_err(|_| KvError::Transfer {
                during,
                error: TransferError::LocalOutOfBounds {
                    offset: local,
                    len,
                    region_len: self.wbuf.len(),
                },
            })?;
            let mut aside = vec![0; n];
            let r = f(&mut aside);
            self.stage(local, &aside)?;
            return Ok(r);
        }
        // SAFETY: nothing reads or writes the write buffer while `f` runs.
        // It is this `Io`'s alone: registered for local writes only (no
        // peer can read or write it), never cloned or handed out, and the
        // only operations that read it are the WRITEs of this `Io`'s own
        // batches, posted by `run`/`run_each`, which return only once every
        // op of their batch completed, or by `post_each`, whose `InFlight`
        // holds `&mut self` until they did; all take `&mut self` as this
        // does. A WRITE that completed with an error may still be read by
        // the provider later: the buffer is then tainted and filled aside
        // instead (above).
        unsafe { self.wbuf.with_bytes_mut(local, len, f) }.map_err(transfer(during))
    }

    /// Stages `writes` (pool offset, bytes: leaf writes) one after
    /// another in the write buffer and returns their WRITEs, in the same
    /// order. With a redo block, each write's copy is staged too, behind
    /// them in the buffer: the next batch posted ([`Io::run`],
    /// [`Io::run_each`], [`Io::post_each`]) sends the copies' WRITEs
    /// first, and its results are the given ops' alone (module `redo`):
    /// that batch must be the one that carries these writes. A copy that
    /// does not fit the write buffer ([`Io::copy_len`]) is left out.
    pub(crate) fn stage_writes(&mut self, writes: &[(u64, &[u8])]) -> Result<Vec<Op>, KvError> {
        // Copies staged and never posted (the caller gave up): nothing
        // of them was written.
        settle_logged(self.redo.as_deref(), &mut self.logged, &[], None);
        let mut ops = Vec::with_capacity(writes.len() + 1);
        let mut local = 0u64;
        for &(remote, bytes) in writes {
            self.stage(local, bytes)?;
            ops.push(Op::Write {
                remote,
                local,
                len: bytes.len() as u64,
            });
            local += (bytes.len() as u64).next_multiple_of(8);
        }
        let Some(redo) = self.redo.clone() else {
            return Ok(ops);
        };
        let mut entry = std::mem::take(&mut self.entry);
        for &(target, bytes) in writes {
            // A word is never torn (atomic at the target): no copy.
            if bytes.len() <= 8 {
                continue;
            }
            let room = local + RedoHeader::SIZE + bytes.len() as u64 <= self.wbuf.len();
            let Some(taken) = room
                .then(|| redo.take(target, bytes.len() as u64))
                .flatten()
            else {
                redo.unstaged(room);
                continue;
            };
            let len = redo.encode(target, bytes, &mut entry) as u64;
            let staged = self.stage(local, &entry);
            self.logged.push(Logged {
                op: Op::Write {
                    remote: taken.remote,
                    local,
                    len,
                },
                slot: taken.slot,
                target,
            });
            if let Err(e) = staged {
                self.entry = entry;
                settle_logged(Some(&redo), &mut self.logged, &[], None);
                return Err(e);
            }
            local += len.next_multiple_of(8);
        }
        self.entry = entry;
        Ok(ops)
    }

    /// Bytes [`Io::stage_writes`] stages beside a write of `len` bytes:
    /// its redo copy, if this `Io` makes one (reserve the write buffer
    /// for it, or the copy is left out).
    pub(crate) fn copy_len(&self, len: u64) -> u64 {
        match &self.redo {
            Some(_) if len > 8 => (RedoHeader::SIZE + len).next_multiple_of(8),
            _ => 0,
        }
    }

    /// The leaf at `target` is known whole (module `redo`).
    pub(crate) fn redo_whole(&self, target: u64) {
        if let Some(redo) = &self.redo {
            redo.whole(target);
        }
    }

    /// Reads `len` pool bytes at `remote`: one round trip per read-buffer
    /// size.
    pub(crate) fn read_bytes(
        &mut self,
        pool: &MrDesc,
        remote: u64,
        len: u64,
        during: &'static str,
    ) -> Result<Vec<u8>, KvError> {
        let cap = self.rbuf.len();
        let mut out = vec![0u8; len as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(cap);
            self.run(
                pool,
                &[Op::Read {
                    remote: remote + done,
                    local: 0,
                    len: n,
                }],
                during,
            )?;
            self.local(0, &mut out[done as usize..(done + n) as usize])?;
            done += n;
        }
        Ok(out)
    }

    /// Reads one pool word.
    pub(crate) fn read_u64(
        &mut self,
        pool: &MrDesc,
        remote: u64,
        during: &'static str,
    ) -> Result<u64, KvError> {
        self.run(
            pool,
            &[Op::Read {
                remote,
                local: 0,
                len: 8,
            }],
            during,
        )?;
        self.local_u64(0)
    }
}

/// `ops` as the engine's batch operations on `pool` and the buffers,
/// counting their bytes and atomics in `cur` as they are posted.
#[inline]
fn batch_ops<'a>(
    ops: &'a [Op],
    pool: &'a MrDesc,
    rbuf: &'a MrHandle,
    wbuf: &'a MrHandle,
    cur: &'a mut OpStats,
) -> impl ExactSizeIterator<Item = BatchOp<'a>> + 'a {
    ops.iter().map(move |op| match *op {
        Op::Read { remote, local, len } => {
            cur.bytes_read += len;
            BatchOp::Read {
                dst: rbuf,
                dst_offset: local,
                src: pool,
                src_offset: remote,
                len,
            }
        }
        Op::Write { remote, local, len } => {
            cur.bytes_written += len;
            BatchOp::Write {
                src: wbuf,
                src_offset: local,
                dst: pool,
                dst_offset: remote,
                len,
                imm: None,
            }
        }
        Op::Cas {
            remote,
            expected,
            new,
        } => {
            cur.atomics += 1;
            BatchOp::Cas {
                dst: pool,
                offset: remote,
                expected,
                new,
            }
        }
        Op::Faa { remote, add } => {
            cur.atomics += 1;
            BatchOp::Faa {
                dst: pool,
                offset: remote,
                add,
            }
        }
    })
}

/// `ops` with the WRITEs of `logged` in front, built in `scratch`; `ops`
/// itself when nothing is logged.
fn with_logged<'a>(logged: &[Logged], ops: &'a [Op], scratch: &'a mut Vec<Op>) -> &'a [Op] {
    if logged.is_empty() {
        return ops;
    }
    scratch.clear();
    scratch.extend(logged.iter().map(|l| l.op));
    scratch.extend_from_slice(ops);
    scratch
}

/// Settles the slots of `logged` (then empties it) after the batch `all`
/// (`logged`'s WRITEs first, then the caller's ops) completed with
/// `results`; `None`: not posted (`all` empty) or not looked at (every
/// copied leaf may be torn).
fn settle_logged(
    redo: Option<&RedoLog>,
    logged: &mut Vec<Logged>,
    all: &[Op],
    results: Option<&[Result<u64, TransferError>]>,
) {
    let Some(redo) = redo else {
        logged.clear();
        return;
    };
    let skip = logged.len();
    for l in logged.drain(..) {
        let outcome = match results {
            _ if all.is_empty() => Outcome::NotPosted,
            None => Outcome::MaybeTorn,
            Some(results) => {
                // The leaf write it copies: the caller's WRITE to `target`.
                let written = all
                    .iter()
                    .zip(results)
                    .skip(skip)
                    .filter(|(op, _)| matches!(op, Op::Write { remote, .. } if *remote == l.target))
                    .all(|(_, r)| r.is_ok());
                if written {
                    Outcome::Written
                } else {
                    Outcome::MaybeTorn
                }
            }
        };
        redo.settle(l.slot, l.target, outcome);
    }
}

/// After a batch of `ops` completed with `results`: a failed READ may
/// still land in the read buffer, a failed WRITE may still be read from
/// the write buffer (see [`Io`]'s fields), so each marks its buffer. One
/// pass, and only when something failed: this runs on every batch.
#[inline]
fn taint(
    ops: &[Op],
    results: &[Result<u64, TransferError>],
    rbuf_tainted: &mut bool,
    wbuf_tainted: &mut bool,
) {
    if results.iter().any(Result::is_err) {
        for (op, r) in ops.iter().zip(results) {
            if r.is_err() {
                match op {
                    Op::Read { .. } => *rbuf_tainted = true,
                    _ => *wbuf_tainted = true,
                }
            }
        }
    }
}
