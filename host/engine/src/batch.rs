//! [`Channel`]: the low-latency path for clients. A channel owns its own
//! endpoint (queue pair) on one NIC, so a client thread posts a batch of
//! reads, writes, CAS and FAA as **one doorbell** and waits for all of
//! them itself — no hop through the worker or the callback thread.
//!
//! Invariants: one [`Channel::run`] is one doorbell batch and one round
//! trip in the counters (its operations are independent: the NIC may run
//! them in any order); every operation gets exactly one result; waiting
//! polls for the engine's spin budget ([`EngineConfig::spin`](crate::EngineConfig::spin),
//! yielding the CPU every few polls, the group's worker standing aside
//! meanwhile), then sleeps until the backend's next due time or with a
//! growing nap, never a long busy spin.
//!
//! The group's own operations share the NIC's completion queue with the
//! channels (on libfabric): a completion of the worker's that a spinning
//! channel reads (a key-value session's posted unlock, notified by a flag
//! nobody waits on yet) is processed by the channel's thread, which runs
//! the group's round for it at once, instead of waking the worker (a
//! thread hand-off, and on a busy-polling NIC a second spinning thread
//! beside the channel's: measured on `tcp` here, a store's insert ran
//! each of its round trips about twice as slow with the worker woken for
//! its previous unlock). While channels post on a NIC, the worker leaves
//! it to them unless it has work of its own (`group`, `channels_busy`).
//!
//! A run is also two halves: [`Channel::post_iter`] posts the batch and
//! returns a [`Posted`], whose [`Posted::wait`] waits for it. A thread
//! with a channel on each of several engines (a compute node of several
//! memory nodes) posts on every one before it waits on any, so their
//! round trips overlap. The [`Posted`] borrows its channel and results
//! until it was waited for (its drop waits), so a channel has at most one
//! batch in flight and nothing outlives it.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use rolex_core::wire::{Access, MrDesc};

use crate::callback::{Asleep, FlagDriver};
use crate::counters::Counters;
use crate::domain::{
    AnyEndpoint, Completion, Domain, Driving, Endpoint, Progress, WorkOp, WorkRequest,
};
use crate::error::{OpKind, TransferError};
use crate::region::MrHandle;
use crate::shared::{remote, EngineShared};

/// One operation of a doorbell batch.
#[derive(Clone, Copy, Debug)]
pub enum BatchOp<'a> {
    /// Read `len` bytes of the peer's `src` at `src_offset` into local
    /// `dst` at `dst_offset`.
    Read {
        /// Local destination (needs `LOCAL_WRITE`).
        dst: &'a MrHandle,
        /// Offset in it.
        dst_offset: u64,
        /// Peer region.
        src: &'a MrDesc,
        /// Offset in it.
        src_offset: u64,
        /// Bytes.
        len: u64,
    },
    /// Write `len` local bytes to the peer, optionally with an immediate.
    Write {
        /// Local source.
        src: &'a MrHandle,
        /// Offset in it.
        src_offset: u64,
        /// Peer region.
        dst: &'a MrDesc,
        /// Offset in it.
        dst_offset: u64,
        /// Bytes.
        len: u64,
        /// Immediate delivered after the data.
        imm: Option<u32>,
    },
    /// Compare-and-swap on the peer's aligned word; result: the old value.
    Cas {
        /// Peer region.
        dst: &'a MrDesc,
        /// Offset of the word.
        offset: u64,
        /// Expected value.
        expected: u64,
        /// Value stored on a match.
        new: u64,
    },
    /// Fetch-and-add on the peer's aligned word; result: the old value.
    Faa {
        /// Peer region.
        dst: &'a MrDesc,
        /// Offset of the word.
        offset: u64,
        /// Addend (wrapping).
        add: u64,
    },
}

/// A client's own queue pair for doorbell batches (see the module docs).
/// Not shared between threads: open one per client thread.
pub struct Channel {
    engine: Arc<EngineShared>,
    endpoint: AnyEndpoint,
    group: usize,
    nic: usize,
    wrs: Vec<WorkRequest>,
    comps: Vec<Completion>,
    pending: Vec<bool>,
    /// Operations of the last batch posted and not yet waited for: only
    /// after a [`Posted`] was leaked (`mem::forget`), since waiting and
    /// dropping both wait. The next post waits for them first.
    unfinished: usize,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel").field("nic", &self.nic).finish()
    }
}

/// Polls between two yields of the CPU while spinning.
const POLLS_PER_YIELD: u32 = 4;

/// Registers a channel as polling its group while it waits (the group's
/// worker stands aside meanwhile); unregisters on drop, or with
/// [`Spinning::stop`] when the channel goes to sleep with operations in
/// flight (the worker then takes the group back at once).
/// After `stop(true)` it holds the sleeper's registration until dropped.
/// While registered, the thread also answers the backends' requests for a
/// round of the group (`domain::round_wanted_here`): [`Spinning::serve`]
/// runs it, and so do `stop` and the drop for one still owed, so none is
/// lost on any way out of a wait.
struct Spinning(Option<(Arc<dyn FlagDriver>, Driving)>, Asleep);

impl Spinning {
    fn new(driver: Option<Arc<dyn FlagDriver>>) -> Self {
        let driving = driver.map(|d| {
            d.enter();
            (d, Driving::new())
        });
        Spinning(driving, Asleep(None))
    }

    /// Runs the group's round on this thread if a backend asked for one,
    /// or wakes the worker for it where another thread holds the group.
    #[inline]
    fn serve(&self) {
        if let Some((d, driving)) = &self.0 {
            if driving.take_wanted() {
                if !d.try_drive() {
                    d.wake_worker();
                }
                // The round read this thread's own completions too, each
                // "another endpoint's" to it: nothing more is owed.
                driving.take_wanted();
            }
        }
    }

    fn stop(&mut self, waiting: bool) {
        self.serve();
        if let Some((d, driving)) = self.0.take() {
            drop(driving);
            d.leave(waiting);
            if waiting {
                self.1 = Asleep(Some(d));
            }
        }
    }
}

impl Drop for Spinning {
    fn drop(&mut self) {
        self.stop(false);
    }
}

/// A doorbell batch posted on a [`Channel`] and not yet waited for
/// ([`Channel::post_iter`]). [`Posted::wait`] waits for every operation;
/// dropping it waits too, so the batch never outlives the borrows of the
/// channel and of its results (nor, through them, the buffers its
/// operations use).
#[must_use = "a posted batch is waited for by `wait` (or on drop)"]
pub struct Posted<'c> {
    ch: &'c mut Channel,
    /// `Some` until [`Posted::wait`] hands it back.
    results: Option<&'c mut Vec<Result<u64, TransferError>>>,
    /// Operations posted and not completed yet.
    remaining: usize,
}

impl std::fmt::Debug for Posted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Posted")
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}

impl<'c> Posted<'c> {
    /// Waits for every operation of the batch, as [`Channel::run`] does,
    /// and returns the results: each operation's outcome, in order.
    #[inline]
    pub fn wait(mut self) -> &'c [Result<u64, TransferError>] {
        self.finish();
        match self.results.take() {
            Some(results) => {
                let results: &'c Vec<_> = results;
                results
            }
            None => &[],
        }
    }

    #[inline]
    fn finish(&mut self) {
        let remaining = std::mem::take(&mut self.remaining);
        if let Some(results) = self.results.as_deref_mut() {
            self.ch.wait(results, remaining);
        }
    }
}

impl Drop for Posted<'_> {
    #[inline]
    fn drop(&mut self) {
        self.finish();
    }
}

impl Channel {
    pub(crate) fn new(
        engine: Arc<EngineShared>,
        group: usize,
        nic: usize,
    ) -> Result<Self, TransferError> {
        let mut endpoint = engine.groups[group].domains[nic].open_endpoint()?;
        endpoint.mark_channel();
        Ok(Channel {
            engine,
            endpoint,
            group,
            nic,
            wrs: Vec::new(),
            comps: Vec::new(),
            pending: Vec::new(),
            unfinished: 0,
        })
    }

    /// The NIC index (within its group) this channel posts on.
    pub fn nic(&self) -> usize {
        self.nic
    }

    fn build(&self, op: &BatchOp<'_>) -> Result<WorkOp, TransferError> {
        let e = &self.engine;
        Ok(match *op {
            BatchOp::Read {
                dst,
                dst_offset,
                src,
                src_offset,
                len,
            } => {
                e.check_len(OpKind::Read, len)?;
                let local = e.local(dst, dst_offset, len)?;
                if !dst.access().contains(Access::LOCAL_WRITE) {
                    return Err(TransferError::LocalAccess {
                        missing: Access::LOCAL_WRITE,
                    });
                }
                WorkOp::Read {
                    local,
                    remote: remote(src, self.nic, src_offset, len, Access::REMOTE_READ)?,
                    len,
                }
            }
            BatchOp::Write {
                src,
                src_offset,
                dst,
                dst_offset,
                len,
                imm,
            } => {
                e.check_len(OpKind::Write, len)?;
                e.check_imm(imm)?;
                WorkOp::Write {
                    local: Some(e.local(src, src_offset, len)?),
                    remote: remote(dst, self.nic, dst_offset, len, Access::REMOTE_WRITE)?,
                    len,
                    imm,
                }
            }
            BatchOp::Cas {
                dst,
                offset,
                expected,
                new,
            } => WorkOp::Cas {
                remote: remote(dst, self.nic, offset, 8, Access::REMOTE_ATOMIC)?,
                expected,
                new,
            },
            BatchOp::Faa { dst, offset, add } => WorkOp::Faa {
                remote: remote(dst, self.nic, offset, 8, Access::REMOTE_ATOMIC)?,
                add,
            },
        })
    }

    /// Posts `ops` as one doorbell batch and waits for all of them.
    /// `results[i]` is operation `i`'s outcome: the old word for CAS/FAA,
    /// 0 otherwise. Fails as a whole only when the engine is shut down.
    pub fn run(
        &mut self,
        ops: &[BatchOp<'_>],
        results: &mut Vec<Result<u64, TransferError>>,
    ) -> Result<(), TransferError> {
        self.run_iter(ops.iter().copied(), results)
    }

    /// [`Self::run`] over operations made as they are posted (a caller
    /// that translates its own operation list needs no second list).
    pub fn run_iter<'a>(
        &mut self,
        ops: impl ExactSizeIterator<Item = BatchOp<'a>>,
        results: &mut Vec<Result<u64, TransferError>>,
    ) -> Result<(), TransferError> {
        let remaining = self.post_ops(ops, results)?;
        self.wait(results, remaining);
        Ok(())
    }

    /// The first half of [`Self::run_iter`]: posts `ops` as one doorbell
    /// batch and returns without waiting. The batch is waited for by
    /// [`Posted::wait`] (or when the [`Posted`] is dropped), which fills
    /// `results` as [`Self::run`] does; until then the channel and
    /// `results` stay borrowed, so nothing else is posted on the channel
    /// and no buffer the batch uses is handed back early through it. A
    /// caller with several channels (one per memory node) posts on each
    /// before it waits on any: the batches' round trips overlap. Fails,
    /// posting nothing, only when the engine is shut down.
    pub fn post_iter<'c, 'a>(
        &'c mut self,
        ops: impl ExactSizeIterator<Item = BatchOp<'a>>,
        results: &'c mut Vec<Result<u64, TransferError>>,
    ) -> Result<Posted<'c>, TransferError> {
        let remaining = self.post_ops(ops, results)?;
        Ok(Posted {
            ch: self,
            results: Some(results),
            remaining,
        })
    }

    /// Posts `ops` as one doorbell batch (the results of operations that
    /// could not be built set, the others' left pending); returns how
    /// many were posted.
    #[inline]
    fn post_ops<'a>(
        &mut self,
        ops: impl ExactSizeIterator<Item = BatchOp<'a>>,
        results: &mut Vec<Result<u64, TransferError>>,
    ) -> Result<usize, TransferError> {
        if self.engine.shutdown.load(SeqCst) {
            return Err(TransferError::EngineShutDown);
        }
        if self.unfinished > 0 {
            self.finish_leaked();
        }
        let n = ops.len();
        results.clear();
        results.extend((0..n).map(|_| Ok(0)));
        self.pending.clear();
        self.pending.resize(n, false);
        for (i, op) in ops.enumerate().take(n) {
            match self.build(&op) {
                Ok(op) => {
                    self.pending[i] = true;
                    self.wrs.push(WorkRequest {
                        wr_id: i as u64,
                        op,
                    });
                }
                Err(e) => {
                    Counters::bump(&self.engine.counters.errors, 1);
                    results[i] = Err(e);
                }
            }
        }
        let remaining = self.wrs.len();
        if remaining > 0 {
            Counters::bump(&self.engine.counters.rtts, 1);
            self.endpoint.post(&mut self.wrs);
        }
        self.unfinished = remaining;
        Ok(remaining)
    }

    /// Waits for the operations of a batch whose [`Posted`] was leaked,
    /// their outcomes dropped, so that no completion of theirs is taken
    /// for one of the next batch's.
    #[cold]
    fn finish_leaked(&mut self) {
        let mut lost: Vec<Result<u64, TransferError>> = vec![Ok(0); self.pending.len()];
        let remaining = self.unfinished;
        self.wait(&mut lost, remaining);
    }

    /// Waits until the `remaining` pending operations of the batch posted
    /// last have completed, their outcomes put into `results`.
    #[inline]
    fn wait(&mut self, results: &mut [Result<u64, TransferError>], remaining: usize) {
        if remaining == 0 {
            return;
        }
        self.wait_for(results, remaining);
        self.unfinished = 0;
    }

    /// [`Self::wait`] for `remaining > 0` operations.
    fn wait_for(&mut self, results: &mut [Result<u64, TransferError>], mut remaining: usize) {
        // One poll before any waiting machinery: a backend that ran the
        // batch as it was posted (loopback without modelled latency) has
        // every completion ready, and the group's driver, the clock and the
        // spinning guard would only cost shared-cache-line traffic. Only
        // the thread-local `Driving` mark: a completion of the group's
        // own (a posted unlock, often read by exactly this poll) is then
        // handled here, not by waking the worker.
        let mut progress = {
            let driving = Driving::new();
            let progress = self.endpoint.poll(&mut self.comps);
            if driving.take_wanted() {
                self.serve_group();
                // The round read this thread's own completions too, each
                // "another endpoint's" to it: nothing more is owed.
                driving.take_wanted();
            }
            progress
        };
        self.settle(results, &mut remaining);
        if remaining == 0 {
            return;
        }
        let driver = self.engine.groups[self.group]
            .flag_driver
            .get()
            .and_then(Weak::upgrade);
        let budget = driver
            .as_ref()
            .map_or(crate::engine::DEFAULT_SPIN, |d| d.spin());
        let start = Instant::now();
        // As a flag's wait: what this thread holds back under a plug may
        // be what the batch waits for.
        if crate::plug::plugged() {
            crate::plug::flush();
        }
        // Completions of the group's own operations (a posted unlock) that
        // this thread's polls read go to the worker's queue: this thread
        // runs the group's round for them itself while it spins, instead
        // of waking the worker (module `domain`, `round_wanted_here`).
        let mut spinning = Spinning::new(driver);
        let mut sleeping = false;
        let mut polls = 0u32;
        let mut nap = Duration::from_micros(1);
        loop {
            spinning.serve();
            if remaining == 0 {
                if sleeping {
                    self.endpoint.set_sleeper(None);
                }
                return;
            }
            match progress {
                Progress::Idle => {
                    // Nothing outstanding yet results missing: cannot
                    // happen with a correct backend; do not wait forever.
                    for (r, p) in results.iter_mut().zip(&self.pending) {
                        if *p {
                            *r = Err(TransferError::LostCompletion);
                        }
                    }
                    self.pending.iter_mut().for_each(|p| *p = false);
                    if sleeping {
                        self.endpoint.set_sleeper(None);
                    }
                    return;
                }
                Progress::WaitUntil(t) if t > Instant::now() => {
                    // A modelled deadline. Closer than a timed sleep can
                    // wake (tens of µs on a VM even with the slack
                    // lowered), poll for it within the spin budget, as a
                    // client polls its completion queue; else sleep.
                    let left = t.saturating_duration_since(Instant::now());
                    if left < crate::timer::SLEEP_FLOOR && start.elapsed() < budget {
                        thread::yield_now();
                    } else {
                        crate::timer::sleep(left);
                    }
                }
                // Due now (busy polling) or still working.
                Progress::WaitUntil(_) | Progress::Busy => {
                    polls += 1;
                    if start.elapsed() < budget {
                        if polls % POLLS_PER_YIELD == 0 {
                            thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    } else {
                        // Sleeping: the worker takes the group back, and
                        // whoever reads the completion off the NIC wakes
                        // this thread (backends that can; the others'
                        // callers wake on the growing nap).
                        if !sleeping {
                            sleeping = true;
                            spinning.stop(true);
                            self.endpoint.set_sleeper(Some(thread::current()));
                        } else {
                            thread::park_timeout(nap);
                            nap = (nap * 2).min(Duration::from_micros(200));
                        }
                    }
                }
            }
            progress = self.endpoint.poll(&mut self.comps);
            self.settle(results, &mut remaining);
        }
    }

    /// Runs the group's round on this thread for the group's completions
    /// a poll read (module `domain`, `round_wanted_here`), or wakes the
    /// worker for it where another thread holds the group.
    fn serve_group(&self) {
        let group = &self.engine.groups[self.group];
        match group.flag_driver.get().and_then(Weak::upgrade) {
            Some(d) => {
                if !d.try_drive() {
                    d.wake_worker();
                }
            }
            None => group.wake(),
        }
    }

    /// Moves the completions of the last poll into `results`, counting
    /// down `remaining` for each pending operation they finish.
    fn settle(&mut self, results: &mut [Result<u64, TransferError>], remaining: &mut usize) {
        for c in self.comps.drain(..) {
            let i = c.wr_id as usize;
            if self.pending.get(i) == Some(&true) {
                self.pending[i] = false;
                results[i] = c.result;
                *remaining -= 1;
            }
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if self.unfinished > 0 {
            self.finish_leaked();
        }
        // Nothing can be outstanding between runs; flush for backends that
        // hold resources per request anyway.
        let mut out = Vec::new();
        self.endpoint.flush(&mut out);
    }
}
