//! Per-peer retry queues for posts a provider refused with `-FI_EAGAIN`.
//!
//! Why per peer: EFA answers `-FI_EAGAIN` for every post to a peer in
//! receiver-not-ready back-off (`EFA_RDM_PEER_IN_BACKOFF` in its RDM
//! message, RMA and atomic paths) while posts to other peers go through,
//! and elsewhere a full send queue refuses everything for a while. One
//! queue for all peers would stall every peer behind the one in back-off.
//!
//! Invariants:
//! - per peer, requests are posted in the order they were submitted:
//!   nothing to a peer overtakes a refused request to the same peer;
//! - a request to a peer with nothing queued is posted at once, whatever
//!   other peers have queued;
//! - every submitted request is, exactly once, posted, failed by the post
//!   function itself, or handed back by [`RetryQueues::expire`] /
//!   [`RetryQueues::drain_where`] for the caller to fail: nothing is lost
//!   and nothing is kept once its peer has been given up on;
//! - a peer whose queue made no progress (no successful post) for the
//!   bound given to [`RetryQueues::expire`] is given up on: its whole
//!   queue is handed back, so a peer that never recovers costs its own
//!   requests a bounded wait and the others nothing.
//!
//! Device-free: the queue calls a post function it is given, so tests
//! drive it with a fake provider.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// What a post function did with one request.
pub(crate) enum Attempt<T> {
    /// Posted (the provider owns it now), or failed and already completed
    /// by the post function: either way it leaves the queue.
    Done,
    /// Refused for now (`-FI_EAGAIN`): handed back to wait in its peer's
    /// queue.
    Again(T),
}

/// One peer's waiting requests.
struct PeerQueue<T> {
    items: VecDeque<T>,
    /// When the queue last made progress: its first refusal, or its last
    /// successful post since.
    since: Instant,
    /// Refusals since then (for the error).
    refusals: u64,
}

/// A peer given up on by [`RetryQueues::expire`]: its requests, in
/// submission order, for the caller to fail.
pub(crate) struct GivenUp<K, T> {
    /// The peer (the domain names it from the operations' own records).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) peer: K,
    /// How long its queue made no progress.
    pub(crate) waited: Duration,
    /// Refusals in that time.
    pub(crate) refusals: u64,
    /// Its requests, oldest first.
    pub(crate) items: Vec<T>,
}

/// The retry queues of one endpoint, by peer `K`.
pub(crate) struct RetryQueues<K, T> {
    peers: HashMap<K, PeerQueue<T>>,
    /// Peers with a queue, in the order they got it (retry round-robin
    /// starts where the last round stopped, so no peer starves).
    order: VecDeque<K>,
    len: usize,
}

impl<K: Copy + Eq + Hash, T> Default for RetryQueues<K, T> {
    fn default() -> Self {
        RetryQueues {
            peers: HashMap::new(),
            order: VecDeque::new(),
            len: 0,
        }
    }
}

impl<K: Copy + Eq + Hash, T> RetryQueues<K, T> {
    /// Requests waiting, all peers together.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `peer` has requests waiting (it is in back-off).
    #[cfg(test)]
    pub(crate) fn waiting(&self, peer: &K) -> bool {
        self.peers.contains_key(peer)
    }

    /// Submits `item` for `peer`: posted at once through `post` unless
    /// the peer already has requests waiting (then it queues behind
    /// them); queued if refused.
    pub(crate) fn submit(
        &mut self,
        peer: K,
        item: T,
        now: Instant,
        post: impl FnOnce(T) -> Attempt<T>,
    ) {
        if let Some(q) = self.peers.get_mut(&peer) {
            q.items.push_back(item);
            self.len += 1;
            return;
        }
        if let Attempt::Again(item) = post(item) {
            self.queue(peer, item, now);
        }
    }

    fn queue(&mut self, peer: K, item: T, now: Instant) {
        let q = self.peers.entry(peer).or_insert_with(|| {
            self.order.push_back(peer);
            PeerQueue {
                items: VecDeque::new(),
                since: now,
                refusals: 0,
            }
        });
        q.items.push_back(item);
        q.refusals += 1;
        self.len += 1;
    }

    /// Retries every peer's queue once, in round-robin order: posts from
    /// the front of each until one is refused again. Returns how many
    /// requests left the queues.
    pub(crate) fn retry(&mut self, now: Instant, mut post: impl FnMut(T) -> Attempt<T>) -> usize {
        let mut done = 0;
        for _ in 0..self.order.len() {
            let Some(peer) = self.order.pop_front() else {
                break;
            };
            let Some(q) = self.peers.get_mut(&peer) else {
                continue;
            };
            while let Some(item) = q.items.pop_front() {
                match post(item) {
                    Attempt::Done => {
                        done += 1;
                        self.len -= 1;
                        q.since = now;
                        q.refusals = 0;
                    }
                    Attempt::Again(item) => {
                        q.items.push_front(item);
                        q.refusals += 1;
                        break;
                    }
                }
            }
            if q.items.is_empty() {
                self.peers.remove(&peer);
            } else {
                self.order.push_back(peer);
            }
        }
        done
    }

    /// Gives up on every peer whose queue made no progress for `bound`
    /// (at `now`): returns them with their requests, which leave the
    /// queues.
    pub(crate) fn expire(&mut self, now: Instant, bound: Duration) -> Vec<GivenUp<K, T>> {
        let stale: Vec<K> = self
            .peers
            .iter()
            .filter(|(_, q)| now.saturating_duration_since(q.since) >= bound)
            .map(|(k, _)| *k)
            .collect();
        stale
            .into_iter()
            .filter_map(|peer| {
                let q = self.remove(&peer)?;
                Some(GivenUp {
                    peer,
                    waited: now.saturating_duration_since(q.since),
                    refusals: q.refusals,
                    items: q.items.into(),
                })
            })
            .collect()
    }

    /// Takes every waiting request for which `pick` holds out of the
    /// queues (a flushed endpoint's), keeping the others' order.
    pub(crate) fn drain_where(&mut self, mut pick: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        let peers: Vec<K> = self.order.iter().copied().collect();
        for peer in peers {
            let Some(q) = self.peers.get_mut(&peer) else {
                continue;
            };
            let (taken, kept): (VecDeque<T>, VecDeque<T>) = q.items.drain(..).partition(&mut pick);
            self.len -= taken.len();
            out.extend(taken);
            q.items = kept;
            if q.items.is_empty() {
                self.remove(&peer);
            }
        }
        out
    }

    /// Takes everything out.
    #[cfg(test)]
    pub(crate) fn drain_all(&mut self) -> Vec<T> {
        self.drain_where(|_| true)
    }

    fn remove(&mut self, peer: &K) -> Option<PeerQueue<T>> {
        let q = self.peers.remove(peer)?;
        self.order.retain(|p| p != peer);
        self.len -= q.items.len();
        Some(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;
    use std::rc::Rc;

    /// A request: its peer and number, and a drop counter (so a test can
    /// see that none is leaked or dropped twice).
    struct Req {
        peer: u8,
        n: u32,
        alive: Rc<RefCell<i64>>,
    }

    impl Req {
        fn new(peer: u8, n: u32, alive: &Rc<RefCell<i64>>) -> Req {
            *alive.borrow_mut() += 1;
            Req {
                peer,
                n,
                alive: alive.clone(),
            }
        }
    }

    impl Drop for Req {
        fn drop(&mut self) {
            *self.alive.borrow_mut() -= 1;
        }
    }

    /// A provider that refuses each peer's next posts as many times as
    /// its budget says (`u32::MAX`: for ever), and records what it posted.
    #[derive(Default)]
    struct FakeProvider {
        refuse: HashMap<u8, u32>,
        /// What it took, in posting order (it owns them now).
        posted: Vec<Req>,
        refusals: u32,
    }

    impl FakeProvider {
        fn post(&mut self, r: Req) -> Attempt<Req> {
            let left = self.refuse.entry(r.peer).or_default();
            if *left > 0 {
                if *left != u32::MAX {
                    *left -= 1;
                }
                self.refusals += 1;
                return Attempt::Again(r);
            }
            self.posted.push(r);
            Attempt::Done
        }

        fn of(&self, peer: u8) -> Vec<u32> {
            self.posted
                .iter()
                .filter(|r| r.peer == peer)
                .map(|r| r.n)
                .collect()
        }
    }

    #[test]
    fn a_peer_in_back_off_does_not_stall_the_others_and_keeps_its_order() {
        let alive = Rc::new(RefCell::new(0));
        let mut fake = FakeProvider::default();
        // Peer 1 refuses its next 5 posts.
        fake.refuse.insert(1, 5);
        let mut q: RetryQueues<u8, Req> = RetryQueues::default();
        let t0 = Instant::now();
        // Interleaved submissions to three peers, with retries between.
        for n in 0..10u32 {
            for peer in [0u8, 1, 2] {
                q.submit(peer, Req::new(peer, n, &alive), t0, |r| fake.post(r));
            }
            // While peer 1 waits, every request to 0 and 2 is posted.
            assert_eq!(fake.of(0).len(), n as usize + 1);
            assert_eq!(fake.of(2).len(), n as usize + 1);
            if n % 3 == 2 {
                q.retry(t0, |r| fake.post(r));
            }
        }
        while !q.is_empty() {
            q.retry(t0, |r| fake.post(r));
        }
        let all: Vec<u32> = (0..10).collect();
        assert_eq!(fake.of(0), all);
        assert_eq!(fake.of(1), all, "peer 1's order is kept");
        assert_eq!(fake.of(2), all);
        assert_eq!(fake.refusals, 5);
        assert_eq!(
            *alive.borrow(),
            10 * 3,
            "posted requests belong to the provider"
        );
        drop(fake);
        assert_eq!(*alive.borrow(), 0);
    }

    #[test]
    fn nothing_to_a_waiting_peer_overtakes_its_queue() {
        let alive = Rc::new(RefCell::new(0));
        let mut fake = FakeProvider::default();
        fake.refuse.insert(7, 1);
        let mut q: RetryQueues<u8, Req> = RetryQueues::default();
        let t0 = Instant::now();
        q.submit(7, Req::new(7, 0, &alive), t0, |r| fake.post(r));
        assert!(q.waiting(&7));
        // The provider would take this one, but it must wait its turn.
        q.submit(7, Req::new(7, 1, &alive), t0, |r| fake.post(r));
        assert!(fake.of(7).is_empty());
        assert_eq!(q.len(), 2);
        assert_eq!(q.retry(t0, |r| fake.post(r)), 2);
        assert_eq!(fake.of(7), vec![0, 1]);
        assert!(q.is_empty() && !q.waiting(&7));
    }

    #[test]
    fn a_peer_that_never_recovers_is_given_up_after_the_bound() {
        let alive = Rc::new(RefCell::new(0));
        let mut fake = FakeProvider::default();
        fake.refuse.insert(1, u32::MAX);
        let mut q: RetryQueues<u8, Req> = RetryQueues::default();
        let t0 = Instant::now();
        let bound = Duration::from_secs(10);
        for n in 0..4 {
            q.submit(1, Req::new(1, n, &alive), t0, |r| fake.post(r));
            q.submit(2, Req::new(2, n, &alive), t0, |r| fake.post(r));
        }
        // Retried for a while: nothing expires before the bound.
        for s in 1..10 {
            let now = t0 + Duration::from_secs(s);
            q.retry(now, |r| fake.post(r));
            assert!(q.expire(now, bound).is_empty());
        }
        let gone = q.expire(t0 + bound, bound);
        assert_eq!(gone.len(), 1);
        let g = &gone[0];
        assert_eq!(g.peer, 1);
        assert_eq!(g.waited, bound);
        assert_eq!(g.refusals, 1 + 9, "the first refusal and one per retry");
        let ns: Vec<u32> = g.items.iter().map(|r| r.n).collect();
        assert_eq!(ns, vec![0, 1, 2, 3], "handed back oldest first");
        assert!(q.is_empty() && !q.waiting(&1));
        assert_eq!(fake.of(2), vec![0, 1, 2, 3]);
        // Nothing is kept: the given-up requests are the caller's, and
        // once dropped (failed) and the provider's released, none lives.
        assert_eq!(*alive.borrow(), 8);
        drop(gone);
        drop(fake);
        assert_eq!(*alive.borrow(), 0);
    }

    #[test]
    fn progress_restarts_the_bound() {
        let alive = Rc::new(RefCell::new(0));
        let mut fake = FakeProvider::default();
        let mut q: RetryQueues<u8, Req> = RetryQueues::default();
        let t0 = Instant::now();
        let bound = Duration::from_secs(10);
        fake.refuse.insert(3, 1);
        for n in 0..3 {
            q.submit(3, Req::new(3, n, &alive), t0, |r| fake.post(r));
        }
        // At 8 s one request gets through, then the peer refuses again.
        fake.refuse.insert(3, 0);
        let mut once = true;
        q.retry(t0 + Duration::from_secs(8), |r| {
            if once {
                once = false;
                fake.post(r)
            } else {
                Attempt::Again(r)
            }
        });
        assert_eq!(q.len(), 2);
        // 12 s after the first refusal, 4 s after the last progress.
        assert!(q.expire(t0 + Duration::from_secs(12), bound).is_empty());
        assert_eq!(q.expire(t0 + Duration::from_secs(18), bound).len(), 1);
        assert!(q.is_empty());
    }

    #[test]
    fn a_flush_takes_only_its_own_requests() {
        let alive = Rc::new(RefCell::new(0));
        let mut fake = FakeProvider::default();
        fake.refuse.insert(1, u32::MAX);
        fake.refuse.insert(2, u32::MAX);
        let mut q: RetryQueues<u8, Req> = RetryQueues::default();
        let t0 = Instant::now();
        for n in 0..6 {
            let peer = 1 + (n % 2) as u8;
            q.submit(peer, Req::new(peer, n, &alive), t0, |r| fake.post(r));
        }
        // "Our" requests are the even-numbered ones.
        let mine = q.drain_where(|r| r.n % 2 == 0);
        assert_eq!(mine.iter().map(|r| r.n).collect::<Vec<_>>(), vec![0, 2, 4]);
        assert!(!q.waiting(&1), "peer 1's queue is gone with its requests");
        assert!(q.waiting(&2));
        assert_eq!(q.len(), 3);
        drop(mine);
        let rest = q.drain_all();
        assert_eq!(rest.len(), 3);
        assert!(q.is_empty());
        drop(rest);
        assert_eq!(*alive.borrow(), 0);
    }
}

/// The queues on a real provider: over `tcp;ofi_rxm` a peer whose queue
/// nobody reads never accepts the connection, so every post to it is
/// refused with `-FI_EAGAIN` (what EFA answers for a peer in
/// receiver-not-ready back-off). A write to a live peer posted after it
/// must complete while the first waits (one queue for all peers held it
/// behind), and the refused one must fail after the bound with
/// `PeerNotReady`, never posted. Skipped where `tcp` is not usable.
#[cfg(test)]
mod on_tcp {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::domain::fabric::waiter::tests::nic;
    use crate::domain::fabric::{probe, LibfabricDomain};
    use crate::domain::{Domain, Endpoint, Local, Progress, Remote, WorkOp, WorkRequest};
    use crate::region::Region;
    use crate::{Access, TransferError};

    /// Bound on the whole test: a hang guard, not a timing assertion.
    const GUARD: Duration = Duration::from_secs(60);

    fn write(
        wr_id: u64,
        src: &Arc<Region>,
        to: &LibfabricDomain,
        dst: &Arc<Region>,
    ) -> WorkRequest {
        let rkey = to.register(dst).expect("register dst");
        WorkRequest {
            wr_id,
            op: WorkOp::Write {
                local: Some(Local {
                    region: src.clone(),
                    offset: 0,
                }),
                remote: Remote {
                    peer: to.address(),
                    rkey,
                    addr: dst.addr(),
                },
                len: src.len(),
                imm: None,
            },
        }
    }

    #[test]
    fn a_peer_that_refuses_posts_stalls_only_itself() {
        if let Err(e) = probe("tcp", Some("127.0.0.1")) {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            return;
        }
        let bound = Duration::from_secs(3);
        let a = nic(false, bound);
        // `dead`: nobody ever reads its queue, so it never accepts `a`.
        let dead = nic(false, GUARD);
        // `live`: its waiter reads its queue whenever bytes arrive.
        let live = nic(true, GUARD);
        let region = |len| Region::alloc(len, Access::all(), 1, 0).expect("region");
        let (src, to_dead, to_live) = (region(4096), region(4096), region(4096));
        a.register(&src).expect("register src");
        let mut ep = a.open_endpoint().expect("endpoint");
        ep.post(&mut vec![
            write(1, &src, &dead, &to_dead),
            write(2, &src, &live, &to_live),
        ]);
        let start = Instant::now();
        let mut got = Vec::new();
        let mut out = Vec::new();
        while got.len() < 2 {
            assert!(start.elapsed() < GUARD, "completions missing: {got:?}");
            if let Progress::WaitUntil(_) | Progress::Busy = ep.poll(&mut out) {
                std::thread::sleep(Duration::from_micros(200));
            }
            got.extend(out.drain(..).map(|c| (c.wr_id, c.result)));
        }
        // The live peer's write completed first, while the dead peer's waited.
        assert_eq!(got[0], (2, Ok(0)), "{got:?}");
        match &got[1] {
            (
                1,
                Err(TransferError::PeerNotReady {
                    peer,
                    waited,
                    refusals,
                    ..
                }),
            ) => {
                assert_eq!(*peer, dead.address());
                assert!(*waited >= bound && *refusals > 0, "{waited:?} {refusals}");
            }
            other => panic!("the dead peer's write: {other:?}"),
        }
        println!("{got:?}");
        assert_eq!(a.counters().errors, 1);
    }
}
