//! [`FabricEndpoint`]: a queue pair on a libfabric NIC, as the engine's
//! workers and client channels see it.
//!
//! All endpoints of one NIC share its libfabric endpoint and completion
//! queue; each has its own [`Sink`], and every operation's context names
//! the sink its completion goes to, so whichever poller reads the queue
//! routes completions right. One post call's writes to one peer share
//! one delivery acknowledgement where the provider orders writes (module
//! `cover`), so [`Endpoint::post`] builds every post of a call before it
//! posts any; there, consecutive writes of different transfers from one
//! region to the same peer and key are chained into one post as well
//! (up to the provider's iov limit), the later ones riding on it.
//! Consecutive reads into one region from one peer and key are chained
//! so on every provider whose `rma_iov_limit` allows it (`tcp`, `shm`;
//! not EFA or verbs, whose limit is 1): one request and one response
//! instead of one each per read; the chain completes as one (an error
//! the provider reports for it is every read's). Invariant: every request handed to
//! [`Endpoint::post`] produces exactly one completion in its sink —
//! errors found before posting at once, the rest from the provider, a
//! timeout, [`Endpoint::flush`] or the NIC's shutdown.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_queue::SegQueue;
use rolex_core::wire::{encode_paged_msg, set_ack_now, NetAddr, PageTarget};

use super::ffi::{self, CtxKind, OpCtx, PinnedRegion, Post, Target};
use super::{
    cover, lock, paged, Inner, Live, OpMeta, Pending, Sink, HOT, OUTSTANDING_BACKSTOP,
    WAIT_BACKSTOP,
};
use crate::counters::Counters;
use crate::domain::{Completion, Endpoint, Local, Progress, WorkOp, WorkRequest};
use crate::error::{OpKind, TransferError};

/// A queue pair on a libfabric NIC (see the module docs).
pub struct FabricEndpoint {
    inner: Arc<Inner>,
    sink: Arc<Sink>,
    /// Scratch: the pieces chained to the write being built (kept to
    /// reuse its allocation), and their work-request ids.
    chain: Vec<WorkOp>,
    chain_ids: Vec<u64>,
    /// Scratch: the posts of one call, built before any is posted.
    built: Vec<Built>,
}

/// One post built by [`Endpoint::post`], not yet posted.
struct Built {
    seq: u64,
    ctx: Box<OpCtx>,
    post: Post,
    /// Work requests of the post's first transfer: `meta.wr_id` and
    /// `meta.pieces`.
    meta: OpMeta,
    /// Pieces of later transfers chained into the same post (`(wr_id,
    /// pieces)`), completed with it (module `cover`).
    riders: Vec<(u64, u32)>,
}

/// The consecutive runs of equal ids in `ids`: `(id, length)`.
fn runs(ids: &[u64]) -> Vec<(u64, u32)> {
    let mut out: Vec<(u64, u32)> = Vec::new();
    for &id in ids {
        match out.last_mut() {
            Some((last, n)) if *last == id => *n += 1,
            _ => out.push((id, 1)),
        }
    }
    out
}

impl FabricEndpoint {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        FabricEndpoint {
            inner,
            sink: Arc::new(Sink {
                queue: SegQueue::new(),
                outstanding: AtomicU64::new(0),
                sleeper: Mutex::new(None),
                has_sleeper: AtomicBool::new(false),
                channel: AtomicBool::new(false),
            }),
            chain: Vec::new(),
            chain_ids: Vec::new(),
            built: Vec::new(),
        }
    }

    /// One post for a write or a read and the pieces chained to it (see
    /// [`Post::WriteChain`], [`Post::ReadChain`]): one pinned region, one
    /// remote range each.
    fn build_chain(
        &self,
        live: &mut Live,
        seq: u64,
        first: &WorkOp,
        rest: &[WorkOp],
    ) -> Result<(Box<OpCtx>, Post), TransferError> {
        let inner = &self.inner;
        let Some((local, remote, _)) = chainable(first) else {
            return Err(TransferError::EngineShutDown);
        };
        let fi_addr = inner.fi_addr(live, &remote.peer)?;
        let p = PinnedRegion::new(local.region.clone()).ok_or(TransferError::RegionDeregistered)?;
        let mut ctx = OpCtx::new(CtxKind::Op(seq));
        let mut key = 0;
        for (i, op) in std::iter::once(first).chain(rest).enumerate() {
            let Some((local, remote, len)) = chainable(op) else {
                return Err(TransferError::EngineShutDown);
            };
            if p.ptr(local.offset, len).is_none() {
                return Err(TransferError::LocalOutOfBounds {
                    offset: local.offset,
                    len,
                    region_len: local.region.len(),
                });
            }
            let (addr, k) = inner.target(remote)?;
            key = k;
            ctx.chain[i] = (local.offset, len, addr);
        }
        let desc = inner.local_desc(&local.region)?;
        ctx.pinned = Some(p);
        let to = Target {
            fi_addr,
            addr: 0,
            key,
        };
        let n = 1 + rest.len();
        let post = match first {
            WorkOp::Read { .. } => Post::ReadChain { n, desc, from: to },
            _ => Post::WriteChain {
                n,
                desc,
                to,
                deliver: inner.delivery_complete,
            },
        };
        Ok((ctx, post))
    }

    /// One message carrying `pages` (`(wr_id, page)`, module `paged`)
    /// in `segments` (`(seq, pages)`: runs of one transfer's pages, a
    /// sequence number each): their bytes are copied out of the source
    /// region now, into the context's buffer, which the context owns until
    /// the send completes. Returns each segment's pages as the user named
    /// them (for the error of a refused one). Every page is one that
    /// `by_message` accepts (the caller gathered them so).
    fn build_paged(
        &self,
        live: &mut Live,
        segments: &[(u64, u8)],
        pages: &[(u64, WorkOp)],
    ) -> Result<(Box<OpCtx>, Post, Vec<paged::Sent>), TransferError> {
        let inner = &self.inner;
        let Some((local, remote, _, imm)) = pages.first().and_then(|p| by_message(&p.1)) else {
            return Err(TransferError::EngineShutDown);
        };
        if imm.is_some() && !inner.claims.immediates {
            return Err(TransferError::NoImmediates {
                provider: inner.provider.clone(),
                cq_data_size: inner.order.cq_data_size,
            });
        }
        let fi_addr = inner.fi_addr(live, &remote.peer)?;
        let region = local.region.clone();
        let guard = region.enter().ok_or(TransferError::RegionDeregistered)?;
        let n = pages.len();
        let (mut targets, mut sources, mut named) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for (_, op) in pages {
            let Some((local, remote, len, _)) = by_message(op) else {
                return Err(TransferError::EngineShutDown);
            };
            region.check(local.offset, len)?;
            let (addr, key) = inner.target(remote)?;
            targets.push(PageTarget {
                key,
                addr,
                len: len as u32,
            });
            sources.push(local.offset);
            named.push((remote.rkey, remote.addr, len));
        }
        let first = segments.first().map_or(0, |s| s.0);
        let mut ctx = OpCtx::new(CtxKind::Op(first));
        // A buffer of an earlier message (its send completed), so that
        // sending does not fault fresh pages in each time.
        ctx.bytes = live.msg_bufs.pop().unwrap_or_default();
        encode_paged_msg(
            &mut ctx.bytes,
            imm,
            &inner.addr,
            segments,
            &targets,
            |i, dst| guard.read(sources[i], dst),
        )
        .map_err(|error| TransferError::Malformed {
            what: "paged message",
            error,
        })?;
        drop(guard);
        let (a, len) = (ctx.bytes.as_ptr() as u64, ctx.bytes.len() as u64);
        let desc = inner.op_mr(&mut ctx, a, len)?;
        let post = Post::TSend {
            desc,
            fi_addr,
            tag: paged::PAGED_TAG,
        };
        let mut at = 0;
        let sent = segments
            .iter()
            .map(|&(_, k)| {
                let k = usize::from(k);
                let s = paged::Sent {
                    pages: named[at..at + k].into(),
                    extras: Vec::new(),
                };
                at += k;
                s
            })
            .collect();
        Ok((ctx, post, sent))
    }

    /// Builds one message of `pages` (module `paged`): its first segment's
    /// bookkeeping goes with the post into `built` (sequence number
    /// `first_seq` if still unused, else a new one); the others' into
    /// `retry_meta` at once, under their own sequence numbers, completed
    /// by their own acknowledgements (or failed with the message, see
    /// `Inner::fail_extras`). Pages that cannot be sent fail here.
    fn post_message(
        &mut self,
        live: &mut Live,
        built: &mut Vec<Built>,
        first_seq: &mut Option<u64>,
        pages: &[(u64, WorkOp)],
        (op, peer, since): (OpKind, NetAddr, Instant),
    ) {
        let ids: Vec<u64> = pages.iter().map(|p| p.0).collect();
        let mut segments: Vec<(u64, u8)> = Vec::new();
        let mut runs_of = Vec::new();
        for (id, n) in runs(&ids) {
            let seq = first_seq.take().unwrap_or_else(|| {
                live.next_seq += 1;
                live.next_seq - 1
            });
            segments.push((seq, n as u8));
            runs_of.push(id);
        }
        match self.build_paged(live, &segments, pages) {
            Ok((ctx, post, sent)) => {
                Counters::bump(&self.inner.counters.paged_by_message, 1);
                let extras: Vec<u64> = segments[1..].iter().map(|s| s.0).collect();
                let mut first = None;
                for (((seq, n), wr_id), mut s) in segments.iter().zip(runs_of).zip(sent) {
                    let meta = |paged| OpMeta {
                        wr_id,
                        pieces: u32::from(*n),
                        sink: self.sink.clone(),
                        op,
                        peer,
                        since,
                        paged: Some(paged),
                    };
                    if first.is_none() {
                        s.extras = extras.clone();
                        first = Some((*seq, meta(s)));
                    } else {
                        self.sink.outstanding.fetch_add(u64::from(*n), SeqCst);
                        live.retry_meta.insert(*seq, meta(s));
                    }
                }
                if let Some((seq, meta)) = first {
                    built.push(Built {
                        seq,
                        ctx,
                        post,
                        meta,
                        riders: Vec::new(),
                    });
                }
            }
            Err(e) => {
                for &id in &ids {
                    self.fail_now(id, e.clone());
                }
            }
        }
    }

    /// The context and post of one request, or why it cannot be posted.
    fn build(
        &self,
        live: &mut Live,
        seq: u64,
        op: WorkOp,
    ) -> Result<(Box<OpCtx>, Post), TransferError> {
        let inner = &self.inner;
        let mut ctx = OpCtx::new(CtxKind::Op(seq));
        let target = |live: &mut Live, remote: &crate::domain::Remote| {
            let fi_addr = inner.fi_addr(live, &remote.peer)?;
            let (addr, key) = inner.target(remote)?;
            Ok::<_, TransferError>(Target { fi_addr, addr, key })
        };
        let pin = |ctx: &mut OpCtx, local: &Local, len: u64| {
            let p =
                PinnedRegion::new(local.region.clone()).ok_or(TransferError::RegionDeregistered)?;
            if p.ptr(local.offset, len).is_none() {
                return Err(TransferError::LocalOutOfBounds {
                    offset: local.offset,
                    len,
                    region_len: local.region.len(),
                });
            }
            ctx.pinned = Some(p);
            inner.local_desc(&local.region)
        };
        let post = match op {
            WorkOp::Read { local, remote, len } => {
                let from = target(live, &remote)?;
                let desc = pin(&mut ctx, &local, len)?;
                Post::Read {
                    offset: local.offset,
                    len,
                    desc,
                    from,
                }
            }
            WorkOp::Write {
                local,
                remote,
                len,
                imm,
            } => {
                if imm.is_some() && !inner.claims.immediates {
                    return Err(TransferError::NoImmediates {
                        provider: inner.provider.clone(),
                        cq_data_size: inner.order.cq_data_size,
                    });
                }
                let to = target(live, &remote)?;
                let (offset, desc) = match &local {
                    Some(l) if len > 0 => (l.offset, pin(&mut ctx, l, len)?),
                    _ => (0, 0),
                };
                let len = if local.is_some() { len } else { 0 };
                Post::Write {
                    offset,
                    len,
                    desc,
                    to,
                    imm,
                    // Data to make visible before the completion (§3);
                    // see `LibfabricDomain::delivery_complete`.
                    deliver: inner.delivery_complete && len > 0,
                }
            }
            WorkOp::Cas {
                remote,
                expected,
                new,
            } => {
                let to = target(live, &remote)?;
                ctx.words = [new, expected, 0];
                // With FI_MR_LOCAL the words go through a bounce slot,
                // lent at posting (`Inner::bounce_in`).
                Post::Cas { desc: 0, to }
            }
            WorkOp::Faa { remote, add } => {
                let to = target(live, &remote)?;
                ctx.words = [add, 0, 0];
                Post::Faa { desc: 0, to }
            }
            WorkOp::Send { peer, data } => {
                let fi_addr = inner.fi_addr(live, &peer)?;
                ctx.bytes = data;
                // A message that fits a bounce slot is copied into one at
                // posting; a larger one is registered for this send.
                let (a, n) = (ctx.bytes.as_ptr() as u64, ctx.bytes.len());
                let n = if inner.bounced(n) { 0 } else { n as u64 };
                let desc = inner.op_mr(&mut ctx, a, n)?;
                Post::Send { desc, fi_addr }
            }
        };
        Ok((ctx, post))
    }

    fn fail_now(&self, wr_id: u64, e: TransferError) {
        Counters::bump(&self.inner.counters.errors, 1);
        self.sink.queue.push(Completion {
            wr_id,
            result: Err(e),
        });
    }
}

/// A write (data, no immediate) or a read that may be chained with
/// others of its kind: its local range's region, target and length.
fn chainable(op: &WorkOp) -> Option<(&Local, &crate::domain::Remote, u64)> {
    match op {
        WorkOp::Write {
            local: Some(l),
            remote,
            len,
            imm: None,
        } if *len > 0 => Some((l, remote, *len)),
        WorkOp::Read { local, remote, len } if *len > 0 => Some((local, remote, *len)),
        _ => None,
    }
}

/// A page that may travel by message (module `paged`): its source,
/// target, length and immediate.
fn by_message(op: &WorkOp) -> Option<(&Local, &crate::domain::Remote, u64, Option<u32>)> {
    match op {
        WorkOp::Write {
            local: Some(l),
            remote,
            len,
            imm,
        } if *len > 0 && *len <= paged::PAGE_LIMIT => Some((l, remote, *len, *imm)),
        _ => None,
    }
}

/// Whether `b` can go in the same message as `a`: both pages by message,
/// from the same region, to the same peer, with the same immediate.
fn same_message(a: &WorkOp, b: &WorkOp) -> bool {
    match (by_message(a), by_message(b)) {
        (Some((la, ra, _, ia)), Some((lb, rb, _, ib))) => {
            Arc::ptr_eq(&la.region, &lb.region) && ra.peer == rb.peer && ia == ib
        }
        _ => false,
    }
}

/// Whether `b` can go in the same post as `a`: both chainable and of one
/// kind (reads or writes), with the same local region, peer and key.
fn same_chain(a: &WorkOp, b: &WorkOp) -> bool {
    match (chainable(a), chainable(b)) {
        (Some((la, ra, _)), Some((lb, rb, _))) => {
            matches!(a, WorkOp::Read { .. }) == matches!(b, WorkOp::Read { .. })
                && Arc::ptr_eq(&la.region, &lb.region)
                && ra.peer == rb.peer
                && ra.rkey == rb.rkey
        }
        _ => false,
    }
}

fn kind(op: &WorkOp) -> OpKind {
    match op {
        WorkOp::Read { .. } => OpKind::Read,
        WorkOp::Write { .. } => OpKind::Write,
        WorkOp::Cas { .. } => OpKind::Cas,
        WorkOp::Faa { .. } => OpKind::Faa,
        WorkOp::Send { .. } => OpKind::Send,
    }
}

thread_local! {
    static SLACK_SET: Cell<bool> = const { Cell::new(false) };
}

impl Endpoint for FabricEndpoint {
    fn post(&mut self, batch: &mut Vec<WorkRequest>) {
        if batch.is_empty() {
            return;
        }
        let inner = self.inner.clone();
        let mut g = lock(&inner.live);
        let Some(live) = g.as_mut() else {
            for wr in batch.drain(..) {
                self.fail_now(wr.wr_id, TransferError::EngineShutDown);
            }
            return;
        };
        Counters::bump(&inner.counters.doorbells, 1);
        let now = Instant::now();
        if self.sink.channel.load(Relaxed) {
            inner
                .channel_posted
                .store(crate::timer::monotonic_ns(), Relaxed);
        } else {
            live.last_activity = now;
        }
        let mut reqs = batch.drain(..).peekable();
        let mut chain = std::mem::take(&mut self.chain);
        let mut chain_ids = std::mem::take(&mut self.chain_ids);
        let mut built = std::mem::take(&mut self.built);
        // Build every post first: which writes share an acknowledgement
        // (module `cover`) is decided among those that can be posted.
        while let Some(WorkRequest { wr_id, op }) = reqs.next() {
            self.inner.counters.count_posted(&op);
            let (op_kind, peer): (OpKind, NetAddr) = (kind(&op), *op.peer());
            let seq = live.next_seq;
            live.next_seq += 1;
            // Pages to one peer: packed into messages (module `paged`)
            // where the NIC sends them so and a message carries more of
            // them than a chain (`paged::worth`), starting at a transfer
            // of two pages or more (a paged write; single writes keep the
            // one-sided path, whose chains already carry them at the
            // stream's rate), then as many following pages to the peer as
            // the batch has.
            let worth = |op: &WorkOp| {
                by_message(op).is_some_and(|p| paged::worth(&inner.addr, p.2, inner.chain_limit))
            };
            if inner.paged_send
                && worth(&op)
                && reqs
                    .peek()
                    .is_some_and(|n| n.wr_id == wr_id && same_message(&op, &n.op))
            {
                let mut bytes = by_message(&op).map_or(0, |p| p.2);
                chain.clear();
                chain_ids.clear();
                while chain.len() + 1 < paged::GATHER_PAGES {
                    let next = reqs.next_if(|n| {
                        same_message(&op, &n.op)
                            && worth(&n.op)
                            && by_message(&n.op)
                                .is_some_and(|(_, _, l, _)| bytes + l <= paged::DATA_LIMIT)
                    });
                    match next {
                        Some(n) => {
                            self.inner.counters.count_posted(&n.op);
                            bytes += by_message(&n.op).map_or(0, |p| p.2);
                            chain.push(n.op);
                            chain_ids.push(n.wr_id);
                        }
                        None => break,
                    }
                }
                if !chain.is_empty() {
                    let ops: Vec<(u64, WorkOp)> = std::iter::once((wr_id, op))
                        .chain(chain_ids.drain(..).zip(chain.drain(..)))
                        .collect();
                    let mut first_seq = Some(seq);
                    for m in paged::pack(&inner.addr, &ops) {
                        self.post_message(
                            live,
                            &mut built,
                            &mut first_seq,
                            &ops[m],
                            (op_kind, peer, now),
                        );
                    }
                    continue;
                }
            }
            // The pieces that follow this one from the same region to the
            // same peer and key go in the same post: of the same transfer,
            // and, for reads and where writes share acknowledgements
            // (module `cover`), of later transfers too, which then complete
            // with this post. (A read's completion means its bytes are
            // here whatever it travelled with; a write's own completion
            // says less than a delivery, so writes of other transfers ride
            // only where the post's delivery covers them.)
            chain.clear();
            chain_ids.clear();
            chain_ids.push(wr_id);
            if chainable(&op).is_some() {
                let read = matches!(op, WorkOp::Read { .. });
                while chain.len() + 1 < inner.chain_limit {
                    let next = reqs.next_if(|n| {
                        (n.wr_id == wr_id || read || inner.cover_writes) && same_chain(&op, &n.op)
                    });
                    match next {
                        Some(n) => {
                            self.inner.counters.count_posted(&n.op);
                            chain.push(n.op);
                            chain_ids.push(n.wr_id);
                        }
                        None => break,
                    }
                }
            }
            let mut riders = if chain_ids.iter().any(|&id| id != wr_id) {
                runs(&chain_ids)
            } else {
                Vec::new()
            };
            let pieces = if riders.is_empty() {
                chain_ids.len() as u32
            } else {
                riders.remove(0).1
            };
            let result = if chain.is_empty() {
                self.build(live, seq, op)
            } else {
                self.build_chain(live, seq, &op, &chain)
            };
            match result {
                Ok((ctx, post)) => built.push(Built {
                    seq,
                    ctx,
                    post,
                    meta: OpMeta {
                        wr_id,
                        pieces,
                        sink: self.sink.clone(),
                        op: op_kind,
                        peer,
                        since: now,
                        paged: None,
                    },
                    riders,
                }),
                Err(e) => {
                    for &id in &chain_ids {
                        self.fail_now(id, e.clone());
                    }
                }
            }
        }
        if inner.paged_send {
            // The last message to each peer asks for the
            // acknowledgements of all (module `paged`).
            let mut asked: Vec<u64> = Vec::new();
            for b in built.iter_mut().rev() {
                if let (Post::TSend { fi_addr, .. }, Some(_)) = (&b.post, &b.meta.paged) {
                    if !asked.contains(fi_addr) {
                        asked.push(*fi_addr);
                        set_ack_now(&mut b.ctx.bytes);
                    }
                }
            }
        }
        let mut covered = Vec::new();
        if inner.cover_writes {
            covered = cover::plan(built.iter_mut().map(|b| (b.seq, &mut b.post)));
            for &(seq, coverer) in &covered {
                // `built` is in posting order, so by sequence number.
                if let Ok(i) = built.binary_search_by_key(&seq, |b| b.seq) {
                    let b = &built[i];
                    let m = &b.meta;
                    live.covers.hold(seq, coverer, &m.sink, m.wr_id, m.pieces);
                }
            }
            covered.sort_unstable();
        }
        // Riders complete with whatever completes their post: its coverer,
        // or the post itself (a chained read's always).
        for b in built.iter_mut().filter(|b| !b.riders.is_empty()) {
            let by = match covered.binary_search_by_key(&b.seq, |c| c.0) {
                Ok(i) => covered[i].1,
                Err(_) => b.seq,
            };
            for (id, n) in b.riders.drain(..) {
                let seq = live.next_seq;
                live.next_seq += 1;
                live.covers.ride(seq, by, &self.sink, id, n);
                self.sink.outstanding.fetch_add(u64::from(n), SeqCst);
            }
        }
        for Built {
            seq,
            ctx,
            post,
            meta,
            riders: _,
        } in built.drain(..)
        {
            if cover::delivered_to(&post).is_some() {
                Counters::bump(&inner.counters.delivery_acks, 1);
            }
            self.sink
                .outstanding
                .fetch_add(u64::from(meta.pieces), SeqCst);
            live.retry_meta.insert(seq, meta);
            let p = Pending {
                ctx,
                post,
                seq: Some(seq),
            };
            // Keep posting order per peer: nothing overtakes a refused
            // post to the same peer; other peers go on.
            let fi_addr = p.post.fi_addr();
            inner.submit(live, fi_addr, p);
        }
        chain.clear();
        self.chain = chain;
        self.chain_ids = chain_ids;
        self.built = built;
        // Posted by another thread than the worker (a submitter posting
        // directly): a post the provider refused waits for our retry,
        // which only a poller makes, and the worker may sleep on a wait
        // object that will not announce it.
        if !live.retry.is_empty() {
            if let Some(t) = inner.waker.get() {
                if t.id() != std::thread::current().id() {
                    t.unpark();
                    inner.wake_sleeping_worker();
                }
            }
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Progress {
        if !SLACK_SET.get() {
            ffi::short_timer_slack();
            SLACK_SET.set(true);
        }
        let inner = self.inner.clone();
        let mut g = lock(&inner.live);
        let (since, retrying) = match g.as_mut() {
            Some(live) => {
                inner.progress(live, Some(&self.sink));
                inner.endpoint_polled.store(true, Relaxed);
                let retrying = !live.retry.is_empty() || !live.recv_retry.is_empty();
                (Some(live.last_activity.elapsed()), retrying)
            }
            None => (None, false),
        };
        drop(g);
        while let Some(c) = self.sink.queue.pop() {
            out.push(c);
        }
        let waiter = inner.wait.get().filter(|w| w.usable());
        let spin = since.is_some_and(|s| s < inner.cfg.busy_poll);
        if let Some(w) = waiter {
            // A spinning poller reads the queue itself; a sleeping one
            // leaves it to the waiter, which wakes it on completions,
            // unless the worker blocks on the wait object itself
            // (`Domain::take_wait`).
            if spin || inner.worker_waits.get().is_some() {
                w.disarm();
            } else {
                w.arm();
            }
        }
        // "Poll again now" (busy polling) is `WaitUntil(now)`: the caller
        // yields the CPU after letting go of what it holds (the worker's
        // round runs under its group's lock, which waiters poll through).
        if self.sink.outstanding.load(SeqCst) > 0 {
            if spin {
                return Progress::WaitUntil(Instant::now());
            }
            let woken = inner
                .waker
                .get()
                .is_some_and(|t| t.id() == std::thread::current().id());
            if waiter.is_some() && woken && !retrying {
                // Everything the provider still has to do is announced on
                // its wait object (a peer's bytes, acknowledgements, a full
                // socket draining), and the thread polling here is the
                // one woken then (the worker: it blocks on the object, or
                // the waiter unparks it). Sleeping until then instead of
                // backing off saves it a futex round trip per few µs.
                // Other pollers (client channels) are woken by nobody and
                // keep the back-off.
                return Progress::WaitUntil(Instant::now() + OUTSTANDING_BACKSTOP);
            }
            // Posts refused with `-FI_EAGAIN` wait for our own retry.
            return Progress::Busy;
        }
        let Some(since) = since else {
            return Progress::Idle;
        };
        let cfg = &inner.cfg;
        if spin {
            Progress::WaitUntil(Instant::now())
        } else if waiter.is_some() {
            Progress::WaitUntil(Instant::now() + WAIT_BACKSTOP)
        } else {
            // No wait object: the schedule of module `pace`.
            match super::pace::idle_sleep(since, HOT, cfg.idle_poll) {
                None => Progress::Busy,
                Some(d) => Progress::WaitUntil(Instant::now() + d),
            }
        }
    }

    fn mark_channel(&mut self) {
        self.sink.channel.store(true, Relaxed);
    }

    fn set_sleeper(&mut self, thread: Option<std::thread::Thread>) {
        let set = thread.is_some();
        *lock(&self.sink.sleeper) = thread;
        self.sink.has_sleeper.store(set, SeqCst);
    }

    fn flush(&mut self, out: &mut Vec<Completion>) {
        let inner = self.inner.clone();
        let mut g = lock(&inner.live);
        if let Some(live) = g.as_mut() {
            let mine: Vec<u64> = live
                .inflight
                .iter()
                .filter(|(_, f)| Arc::ptr_eq(&f.sink, &self.sink))
                .map(|(s, _)| *s)
                .collect();
            let shut = |out: &mut Vec<Completion>, wr_id, pieces: u32| {
                for _ in 0..pieces {
                    out.push(Completion {
                        wr_id,
                        result: Err(TransferError::EngineShutDown),
                    });
                }
                self.sink.outstanding.fetch_sub(u64::from(pieces), SeqCst);
            };
            for s in mine {
                if let Some(f) = live.inflight.remove(&s) {
                    if live.covers.abandon(s) {
                        shut(out, f.wr_id, f.pieces);
                    }
                    // The provider may still use the buffers: keep them.
                    if let Some(l) = f.leaked {
                        live.abandoned.insert(s, l);
                    }
                }
            }
            let waiting: std::collections::HashSet<u64> = live
                .retry_meta
                .iter()
                .filter(|(_, m)| Arc::ptr_eq(&m.sink, &self.sink))
                .map(|(s, _)| *s)
                .collect();
            for &s in &waiting {
                if let Some(m) = live.retry_meta.remove(&s) {
                    if live.covers.abandon(s) {
                        shut(out, m.wr_id, m.pieces);
                    }
                }
            }
            // Covered writes whose own completion came, waiting for a
            // coverer flushed above.
            let owed = live.covers.flush(&self.sink, out);
            self.sink.outstanding.fetch_sub(owed, SeqCst);
            // This endpoint's requests never posted: drop them here. Only
            // these: the queues also hold other endpoints' requests and the
            // domain's own sends (a paged message's acknowledgements, which
            // have no `retry_meta` and which peers wait for).
            drop(
                live.retry
                    .drain_where(|p| p.seq.is_some_and(|s| waiting.contains(&s))),
            );
        }
        drop(g);
        while let Some(c) = self.sink.queue.pop() {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_group_consecutive_ids() {
        assert_eq!(runs(&[7, 7, 8, 9, 9, 9]), vec![(7, 2), (8, 1), (9, 3)]);
        assert_eq!(runs(&[5]), vec![(5, 1)]);
        assert!(runs(&[]).is_empty());
    }
}
