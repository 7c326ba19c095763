//! Covered writes: the writes of one post call to one peer share the
//! acknowledgement of the last of them.
//!
//! A write's completion means its data is visible at the target (design
//! §3); writes ask for `FI_DELIVERY_COMPLETE` for that, and on `tcp`
//! (1.17) each such write costs the target an acknowledgement message
//! back (a `send` at the target, a `recv` at the initiator, both on the
//! loopback's receive path here): a paged write of 16 × 1 KiB posts 4
//! chained writes and made the target send 4 of them.
//!
//! Where the endpoint orders writes after writes to one peer
//! (`tx_attr->msg_order` has `FI_ORDER_WAW` or `FI_ORDER_RMA_WAW`), the
//! domain asks for delivery completion only on the last data write of a
//! post call to each peer, the *coverer*; the earlier ones to that peer
//! (*covered* writes) ask for the provider's default completion, which
//! only says their buffers may be reused. A covered write's completion
//! is reported to the engine when both its own completion and its
//! coverer's successful one have been read. Why that still means its data
//! is visible: message order is "the order in which transport headers
//! are identified and processed" at the target (fi_endpoint(3)), and
//! fi_cq(3) ("target completion semantics") states that where an endpoint
//! orders two transfers, the completion of the second at the target means
//! the first one's data is available; a delivery completion means the
//! coverer was processed at the target, so every write posted before it
//! on the same endpoint to the same peer was processed before, data
//! placed. (Checked against the 1.17 `tcp` provider's source: rxm keeps
//! one connection per peer, and the target reads each connection's stream
//! in order, placing a write's data before it parses the next header;
//! `tcpx_set_ack_flags` asks for the acknowledgement only on
//! `FI_DELIVERY_COMPLETE` or `FI_TRANSMIT_COMPLETE`.) Writes are covered
//! only within one post call, so nothing waits on a write that has not
//! been posted; the coverer is posted after them (posts refused with
//! `-FI_EAGAIN` are retried in order).
//!
//! What it costs: a covered write's completion comes with its coverer's,
//! after the later writes of the call have gone out too (a worker round
//! posts at most 256 KiB, so not much later); and `tcp` writes a local
//! completion for each covered write as soon as it is sent, signalling
//! the queue's wait object (a socket-pair `send`, and a wake-up of a
//! worker blocked on it): about 2.6 more system calls per 16-page paged
//! write at the initiator against 4.4 fewer at the target (README,
//! issue 20).
//!
//! Riders: where writes are covered, the endpoint also chains writes of
//! later transfers into an earlier transfer's post; their pieces are
//! held like covered writes whose own part is the post's, completed by
//! whatever completes the post (its coverer, or the post itself).
//!
//! Invariant: every covered write's engine completion is reported exactly
//! once, with the first error of its own completion and its coverer's
//! (a failed or timed-out coverer fails the writes it covers: their data
//! is not known to have landed), or on flush / shutdown.

use std::collections::HashMap;
use std::sync::Arc;

use super::ffi::Post;
use super::Sink;
use crate::domain::Completion;
use crate::error::TransferError;

/// Which completion of a covered write is reported.
#[derive(Clone, Copy)]
enum Part {
    /// Its own (the provider is done with its buffers).
    Own,
    /// Its coverer's.
    Cover,
}

/// A covered write waiting for its own completion and its coverer's.
struct Held {
    sink: Arc<Sink>,
    wr_id: u64,
    pieces: u32,
    own: bool,
    cover: bool,
    /// Its engine completion was reported (an error came first).
    done: bool,
}

/// The covered writes of one NIC and their coverers (under the domain's
/// lock, with the operations themselves).
#[derive(Default)]
pub(super) struct Covers {
    /// Covered writes by sequence number, from their post until both
    /// their own completion and their coverer's have been seen.
    held: HashMap<u64, Held>,
    /// The writes each coverer covers, by the coverer's sequence number,
    /// until the coverer finishes.
    coverers: HashMap<u64, Vec<u64>>,
}

/// Where a write that asks for delivery completion goes (its address-vector
/// entry); `None` for every other post.
pub(super) fn delivered_to(post: &Post) -> Option<u64> {
    match post {
        Post::Write {
            to, deliver: true, ..
        }
        | Post::WriteChain {
            to, deliver: true, ..
        } => Some(to.fi_addr),
        _ => None,
    }
}

/// Makes a write that asks for delivery completion ask for the provider's
/// default completion instead (it is covered).
fn cover(post: &mut Post) {
    if let Post::Write { deliver, .. } | Post::WriteChain { deliver, .. } = post {
        *deliver = false;
    }
}

/// For the posts of one call, in posting order (`seq`, post): which are
/// covered, and by which later one. Changes the covered posts to ask for
/// the default completion; returns `(covered, coverer)` pairs.
pub(super) fn plan<'a>(
    posts: impl DoubleEndedIterator<Item = (u64, &'a mut Post)>,
) -> Vec<(u64, u64)> {
    let mut last: Vec<(u64, u64)> = Vec::new();
    let mut out = Vec::new();
    for (seq, post) in posts.rev() {
        let Some(to) = delivered_to(post) else {
            continue;
        };
        match last.iter().find(|(a, _)| *a == to) {
            Some(&(_, coverer)) => {
                cover(post);
                out.push((seq, coverer));
            }
            None => last.push((to, seq)),
        }
    }
    out
}

impl Covers {
    /// Records covered write `seq` (before it is posted), owing `pieces`
    /// completions of `wr_id` to `sink`.
    pub(super) fn hold(
        &mut self,
        seq: u64,
        coverer: u64,
        sink: &Arc<Sink>,
        wr_id: u64,
        pieces: u32,
    ) {
        self.held.insert(
            seq,
            Held {
                sink: sink.clone(),
                wr_id,
                pieces,
                own: false,
                cover: false,
                done: false,
            },
        );
        self.coverers.entry(coverer).or_default().push(seq);
    }

    /// Records `pieces` work requests of `wr_id` carried in another
    /// transfer's post (chained into it): they complete when `coverer`
    /// does, the post itself or the write that covers it (their own part
    /// is the post's, already sent when it is).
    pub(super) fn ride(
        &mut self,
        seq: u64,
        coverer: u64,
        sink: &Arc<Sink>,
        wr_id: u64,
        pieces: u32,
    ) {
        self.hold(seq, coverer, sink, wr_id, pieces);
        if let Some(h) = self.held.get_mut(&seq) {
            h.own = true;
        }
    }

    /// The provider is done with operation `seq` (completion, failed post,
    /// timeout, shutdown): reports it to `sink`, unless it is a covered
    /// write still waiting for its coverer; a coverer also settles the
    /// writes it covers.
    pub(super) fn finish(
        &mut self,
        seq: u64,
        sink: &Sink,
        wr_id: u64,
        pieces: u32,
        result: Result<u64, TransferError>,
    ) {
        if self.held.is_empty() && self.coverers.is_empty() {
            sink.finish(wr_id, pieces, result);
            return;
        }
        if self.held.contains_key(&seq) {
            self.part(seq, Part::Own, result);
            return;
        }
        if let Some(covered) = self.coverers.remove(&seq) {
            for s in covered {
                self.part(s, Part::Cover, result.clone());
            }
        }
        sink.finish(wr_id, pieces, result);
    }

    fn part(&mut self, seq: u64, part: Part, result: Result<u64, TransferError>) {
        let Some(h) = self.held.get_mut(&seq) else {
            return;
        };
        match part {
            Part::Own => h.own = true,
            Part::Cover => h.cover = true,
        }
        if !h.done {
            match result {
                Err(e) => {
                    h.done = true;
                    h.sink.finish(h.wr_id, h.pieces, Err(e));
                }
                Ok(_) if h.own && h.cover => {
                    h.done = true;
                    h.sink.finish(h.wr_id, h.pieces, Ok(0));
                }
                Ok(_) => {}
            }
        }
        if h.own && h.cover {
            self.held.remove(&seq);
        }
    }

    /// Operation `seq` is abandoned (flushed) before the provider finished
    /// it: forgets it, and says whether its completion is still owed (a
    /// covered write that already failed was reported).
    pub(super) fn abandon(&mut self, seq: u64) -> bool {
        self.coverers.remove(&seq);
        self.held.remove(&seq).map_or(true, |h| !h.done)
    }

    /// Forgets every covered write of `sink` (flushed) and pushes the
    /// completions still owed of those waiting only for a coverer, one
    /// per piece with `EngineShutDown`; returns how many it pushed.
    pub(super) fn flush(&mut self, sink: &Arc<Sink>, out: &mut Vec<Completion>) -> u64 {
        let mine: Vec<u64> = self
            .held
            .iter()
            .filter(|(_, h)| Arc::ptr_eq(&h.sink, sink))
            .map(|(s, _)| *s)
            .collect();
        let mut pushed = 0;
        for s in mine {
            if let Some(h) = self.held.remove(&s) {
                if !h.done {
                    for _ in 0..h.pieces {
                        out.push(Completion {
                            wr_id: h.wr_id,
                            result: Err(TransferError::EngineShutDown),
                        });
                    }
                    pushed += u64::from(h.pieces);
                }
            }
        }
        pushed
    }

    /// At shutdown, after every operation was finished: reports what is
    /// still owed (nothing, unless a coverer was lost) as `EngineShutDown`.
    pub(super) fn shut(&mut self) {
        self.coverers.clear();
        for (_, h) in self.held.drain() {
            if !h.done {
                h.sink
                    .finish(h.wr_id, h.pieces, Err(TransferError::EngineShutDown));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::fabric::ffi::Target;
    use crate::domain::fabric::Sink;
    use crossbeam_queue::SegQueue;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Mutex;

    fn sink() -> Arc<Sink> {
        Arc::new(Sink {
            queue: SegQueue::new(),
            outstanding: AtomicU64::new(0),
            sleeper: Mutex::new(None),
            has_sleeper: AtomicBool::new(false),
            channel: AtomicBool::new(false),
        })
    }

    fn drained(s: &Sink) -> Vec<Completion> {
        std::iter::from_fn(|| s.queue.pop()).collect()
    }

    fn write(fi_addr: u64, len: u64, deliver: bool) -> Post {
        Post::Write {
            offset: 0,
            len,
            desc: 0,
            to: Target {
                fi_addr,
                addr: 0,
                key: 1,
            },
            imm: None,
            deliver,
        }
    }

    fn chain(fi_addr: u64) -> Post {
        Post::WriteChain {
            n: 4,
            desc: 0,
            to: Target {
                fi_addr,
                addr: 0,
                key: 1,
            },
            deliver: true,
        }
    }

    #[test]
    fn only_the_last_write_to_each_peer_asks_for_delivery() {
        let mut posts = [
            (10, write(1, 64, true)),
            (11, chain(2)),
            (
                12,
                Post::Read {
                    offset: 0,
                    len: 8,
                    desc: 0,
                    from: Target {
                        fi_addr: 1,
                        addr: 0,
                        key: 1,
                    },
                },
            ),
            (13, chain(1)),
            (14, write(2, 8, true)),
            // An immediate alone asks for no delivery: neither covers nor
            // is covered.
            (15, write(1, 0, false)),
            (16, write(3, 8, true)),
        ];
        let mut covered = plan(posts.iter_mut().map(|(s, p)| (*s, p)));
        covered.sort();
        assert_eq!(covered, vec![(10, 13), (11, 14)]);
        let asks: Vec<u64> = posts
            .iter()
            .filter(|(_, p)| delivered_to(p).is_some())
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(asks, vec![13, 14, 16], "the coverers, and a lone write");
    }

    #[test]
    fn a_covered_write_completes_once_both_completions_are_in() {
        for own_first in [true, false] {
            let s = sink();
            let mut c = Covers::default();
            c.hold(1, 2, &s, 7, 4);
            if own_first {
                c.finish(1, &s, 7, 4, Ok(0));
                assert!(drained(&s).is_empty(), "waits for its coverer");
                c.finish(2, &s, 8, 1, Ok(0));
            } else {
                c.finish(2, &s, 8, 1, Ok(0));
                assert_eq!(drained(&s).len(), 1, "the coverer alone");
                c.finish(1, &s, 7, 4, Ok(0));
            }
            let done = drained(&s);
            let covered: Vec<_> = done.iter().filter(|c| c.wr_id == 7).collect();
            assert_eq!(covered.len(), 4, "one completion per piece");
            assert!(covered.iter().all(|c| c.result.is_ok()));
            assert!(c.held.is_empty() && c.coverers.is_empty());
        }
    }

    #[test]
    fn a_failed_coverer_fails_what_it_covers_at_once() {
        let s = sink();
        let mut c = Covers::default();
        c.hold(1, 3, &s, 7, 1);
        c.hold(2, 3, &s, 7, 1);
        c.finish(1, &s, 7, 1, Ok(0));
        c.finish(3, &s, 7, 1, Err(TransferError::EngineShutDown));
        let done = drained(&s);
        assert_eq!(done.len(), 3);
        assert!(done.iter().all(|c| c.result.is_err()));
        // Write 2's own completion comes later: nothing more is reported.
        c.finish(2, &s, 7, 1, Ok(0));
        assert!(drained(&s).is_empty());
        assert!(c.held.is_empty() && c.coverers.is_empty());
    }

    #[test]
    fn a_flushed_coverer_leaves_its_covered_writes_to_the_flush() {
        let s = sink();
        let mut c = Covers::default();
        c.hold(1, 3, &s, 7, 2);
        c.hold(2, 3, &s, 7, 1);
        c.finish(1, &s, 7, 2, Ok(0));
        // Flushed: write 2 and the coverer are still the provider's.
        assert!(c.abandon(2), "write 2's completion is owed");
        assert!(c.abandon(3), "the coverer's completion is owed");
        let mut out = Vec::new();
        assert_eq!(c.flush(&s, &mut out), 2, "write 1's pieces");
        assert!(out.iter().all(|c| c.wr_id == 7 && c.result.is_err()));
        assert!(c.held.is_empty() && c.coverers.is_empty());
        // A covered write that already failed owes nothing more.
        c.hold(4, 5, &s, 9, 1);
        c.finish(4, &s, 9, 1, Err(TransferError::EngineShutDown));
        assert!(!c.abandon(4));
    }

    #[test]
    fn riders_complete_with_what_completes_their_post() {
        let s = sink();
        let mut c = Covers::default();
        // Post 1 carries transfer 7's pieces and rides transfer 8 on it;
        // post 1 is covered by post 2.
        c.hold(1, 2, &s, 7, 2);
        c.ride(10, 2, &s, 8, 2);
        c.finish(1, &s, 7, 2, Ok(0));
        assert!(drained(&s).is_empty(), "all wait for the coverer");
        c.finish(2, &s, 9, 1, Ok(0));
        let done = drained(&s);
        assert_eq!(done.iter().filter(|d| d.wr_id == 8).count(), 2);
        assert_eq!(done.iter().filter(|d| d.wr_id == 7).count(), 2);
        assert!(done.iter().all(|d| d.result.is_ok()));
        assert!(c.held.is_empty() && c.coverers.is_empty());
        // A rider on a post that asks for delivery itself fails with it.
        c.ride(11, 3, &s, 12, 1);
        c.finish(3, &s, 9, 1, Err(TransferError::EngineShutDown));
        let done = drained(&s);
        assert_eq!(done.len(), 2);
        assert!(done.iter().all(|d| d.result.is_err()));
        assert!(c.held.is_empty() && c.coverers.is_empty());
    }

    /// One event of a covered write's life, for the property below.
    #[derive(Clone, Copy, Debug)]
    enum Ev {
        Own(usize, bool),
        Cover(bool),
    }

    proptest! {
        /// Whatever order the completions come in, each covered write is
        /// reported exactly once: successful when its own completion and
        /// its coverer's both were, failed when either failed.
        #[test]
        fn each_covered_write_is_reported_once(
            oks in prop::collection::vec(any::<bool>(), 1..6),
            cover_ok in any::<bool>(),
            cut in 0usize..6,
            order in prop::collection::vec(any::<u8>(), 6),
        ) {
            let n = oks.len();
            let s = sink();
            let mut c = Covers::default();
            for i in 0..n {
                c.hold(i as u64, 100, &s, i as u64, 1);
            }
            let mut evs: Vec<Ev> = (0..n).map(|i| Ev::Own(i, oks[i])).collect();
            evs.insert(cut.min(n), Ev::Cover(cover_ok));
            // Any order: completions are not ordered (`comp_order` none).
            let m = evs.len();
            for (i, r) in order.iter().enumerate().take(m) {
                evs.swap(i % m, *r as usize % m);
            }
            let mut reported = vec![0; n];
            for ev in evs {
                match ev {
                    Ev::Own(i, ok) => {
                        let r = if ok { Ok(0) } else { Err(TransferError::EngineShutDown) };
                        c.finish(i as u64, &s, i as u64, 1, r);
                    }
                    Ev::Cover(ok) => {
                        let r = if ok { Ok(0) } else { Err(TransferError::EngineShutDown) };
                        c.finish(100, &s, 100, 1, r);
                    }
                }
                for d in drained(&s) {
                    if d.wr_id == 100 {
                        continue;
                    }
                    let i = d.wr_id as usize;
                    reported[i] += 1;
                    prop_assert_eq!(d.result.is_ok(), oks[i] && cover_ok);
                }
            }
            prop_assert!(reported.iter().all(|&r| r == 1), "{:?}", reported);
            prop_assert!(c.held.is_empty() && c.coverers.is_empty());
        }
    }
}
