//! The connection protocol of the verbs domain, device-free: a
//! [`Connector`] keeps the peer table (which peers are connecting, which
//! are connected) and runs the UD handshake exchange over any
//! [`QpDevice`], so the real device and the tests' fake run the same code.
//!
//! Protocol (one exchange per peer connection):
//! - the active side creates its two RC queue pairs (INIT), sends a
//!   [`HandshakeKind::Request`] under a random tag to the peer's UD queue
//!   pair, and resends it every [`ConnectorConfig::retry`] until a reply
//!   with that tag arrives or [`ConnectorConfig::timeout`] has passed;
//! - the passive side creates its pair, brings it to RTS against the
//!   request's queue pairs, answers with a [`HandshakeKind::Reply`] echoing
//!   the tag, and remembers the reply so a resent request (the reply was
//!   lost) gets the same answer instead of a second connection;
//! - the active side, on the reply, brings its pair to RTS.
//!
//! Invariants:
//! - at most one connection or attempt per peer address; when two sides
//!   connect to each other at once, the side with the smaller address
//!   keeps its attempt and the other abandons its own and answers;
//!   (resends of the abandoned request cannot overtake the answer: UD
//!   from one queue pair to another follows one path, in order);
//! - a request naming other queue pairs than the connection we hold with
//!   its sender means the sender dropped that connection and starts over
//!   (after an error on it): the new pair replaces the old;
//! - bytes from the network never panic: malformed messages are refused
//!   with the [`HandshakeError`] or address error that names why;
//! - path MTU is the smaller of both ports' active MTUs.
//!
//! A domain's own address is a peer like any other: its request arrives
//! on its own UD queue pair and is answered by a passive pair kept here
//! (the loop-back connection), since the peer table's one entry for that
//! address is the active side.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use rand::Rng;
use rolex_core::wire::{NetAddr, WireError};

use super::addr::VerbsAddr;
use super::bringup::{
    connect_peer, create_peer, local_handshake, BringUpError, PeerQps, QpDevice, RcTiming,
};
use super::handshake::{Handshake, HandshakeError, HandshakeKind, ENCODED_LEN};

/// What the connector needs to know about the local port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectorConfig {
    /// Local port.
    pub port: u8,
    /// Local GID index.
    pub gid_index: u8,
    /// Most peers in the table at once (connected or connecting); a
    /// request from a new peer beyond it is refused without creating
    /// queue pairs.
    pub max_peers: usize,
    /// The port's active MTU code.
    pub mtu: u8,
    /// RC timing of every connection.
    pub timing: RcTiming,
    /// Interval between resends of an unanswered request.
    pub retry: Duration,
    /// How long an attempt may take before it fails.
    pub timeout: Duration,
}

/// A handshake to send over UD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// Where to.
    pub to: VerbsAddr,
    /// The encoded message.
    pub bytes: [u8; ENCODED_LEN],
}

/// Why a connection could not be made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectError {
    /// The peer address is not a verbs address.
    Address(WireError),
    /// No reply within the timeout.
    Timeout {
        /// Requests sent.
        tries: u32,
    },
    /// Creating or moving a queue pair failed.
    Device(BringUpError),
    /// Our own handshake could not be encoded (a field out of range).
    Encode(HandshakeError),
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnectError::Address(e) => write!(f, "bad verbs address: {e}"),
            ConnectError::Timeout { tries } => {
                write!(f, "no handshake reply after {tries} requests")
            }
            ConnectError::Device(e) => write!(f, "queue-pair bring-up failed: {e}"),
            ConnectError::Encode(e) => write!(f, "handshake not encodable: {e}"),
        }
    }
}

impl std::error::Error for ConnectError {}

/// Why an incoming message was not acted on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum IncomingError {
    /// It did not decode.
    Malformed(HandshakeError),
    /// Its sender fields do not form a verbs address.
    Sender(WireError),
    /// Answering it needed a queue pair that could not be brought up.
    Device(BringUpError),
    /// A new peer while the table holds [`ConnectorConfig::max_peers`].
    TooManyPeers {
        /// The bound.
        max: usize,
    },
}

impl fmt::Display for IncomingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IncomingError::Malformed(e) => write!(f, "malformed handshake: {e}"),
            IncomingError::Sender(e) => write!(f, "handshake sender: {e}"),
            IncomingError::Device(e) => write!(f, "cannot answer handshake: {e}"),
            IncomingError::TooManyPeers { max } => {
                write!(f, "handshake from a new peer refused: {max} peers already")
            }
        }
    }
}

impl std::error::Error for IncomingError {}

/// What happened to a peer.
#[derive(Debug)]
pub enum Event<Q> {
    /// Its two RC queue pairs are at RTS: the data path may use them.
    Connected {
        /// The peer.
        peer: NetAddr,
        /// Its queue pairs (ownership passes to the data path).
        qps: PeerQps<Q>,
    },
    /// An attempt failed; operations waiting for the peer should fail.
    Failed {
        /// The peer.
        peer: NetAddr,
        /// Why.
        why: ConnectError,
    },
}

/// A peer's standing in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerState {
    /// Neither connected nor connecting.
    Unknown,
    /// Waiting for the reply.
    Connecting,
    /// Connected (its queue pairs were handed out).
    Connected,
}

enum Slot<Q> {
    Connecting {
        tag: u64,
        qps: PeerQps<Q>,
        to: VerbsAddr,
        request: [u8; ENCODED_LEN],
        deadline: Instant,
        next_try: Instant,
        tries: u32,
    },
    Connected {
        /// The peer's queue pairs (msg, rdma) this connection targets.
        remote: (u32, u32),
        /// Our reply when we were the passive side (resent on duplicates).
        reply: Option<Outgoing>,
    },
}

/// Passive pairs kept for this domain's own requests (one per attempt
/// still answerable; older ones are dropped first).
pub const MAX_SELF_LOOPS: usize = 4;

/// A passive pair answering this domain's own requests.
struct SelfLoop<Q> {
    tag: u64,
    _qps: PeerQps<Q>,
    reply: Outgoing,
}

/// The peer table and handshake exchange of one domain (module docs).
pub struct Connector<Q> {
    me: VerbsAddr,
    me_net: NetAddr,
    cfg: ConnectorConfig,
    slots: HashMap<NetAddr, Slot<Q>>,
    loops: Vec<SelfLoop<Q>>,
}

impl<Q> fmt::Debug for Connector<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector")
            .field("me", &self.me_net)
            .field("peers", &self.slots.len())
            .finish()
    }
}

fn sender_of(h: &Handshake) -> VerbsAddr {
    VerbsAddr {
        gid: h.gid,
        lid: h.lid,
        ud_qpn: h.ud_qpn,
        qkey: h.qkey,
    }
}

impl<Q> Connector<Q> {
    /// A connector for the domain at `me`.
    pub fn new(me: VerbsAddr, cfg: ConnectorConfig) -> Result<Connector<Q>, WireError> {
        Ok(Connector {
            me_net: me.to_net()?,
            me,
            cfg,
            slots: HashMap::new(),
            loops: Vec::new(),
        })
    }

    /// The domain's own address.
    pub fn address(&self) -> NetAddr {
        self.me_net
    }

    /// Where `peer` stands.
    pub fn state(&self, peer: &NetAddr) -> PeerState {
        match self.slots.get(peer) {
            None => PeerState::Unknown,
            Some(Slot::Connecting { .. }) => PeerState::Connecting,
            Some(Slot::Connected { .. }) => PeerState::Connected,
        }
    }

    /// Whether an attempt is waiting for a reply.
    pub fn connecting(&self) -> bool {
        self.slots
            .values()
            .any(|s| matches!(s, Slot::Connecting { .. }))
    }

    /// Forgets a peer (its connection broke): the next [`Connector::connect`]
    /// starts over. An attempt in progress is dropped with its queue pairs.
    pub fn forget(&mut self, peer: &NetAddr) {
        self.slots.remove(peer);
        if *peer == self.me_net {
            self.loops.clear();
        }
    }

    fn handshake(&self, kind: HandshakeKind, tag: u64, qps: &PeerQps<Q>) -> Handshake {
        local_handshake(kind, tag, &self.me, self.cfg.mtu, &self.cfg.timing, qps)
    }

    /// Starts connecting to `peer` unless connected or connecting; returns
    /// where it stands. The request to send is pushed onto `out`.
    pub fn connect<D: QpDevice<Qp = Q>>(
        &mut self,
        dev: &mut D,
        peer: &NetAddr,
        now: Instant,
        rng: &mut impl Rng,
        out: &mut Vec<Outgoing>,
    ) -> Result<PeerState, ConnectError> {
        match self.state(peer) {
            PeerState::Unknown => {}
            s => return Ok(s),
        }
        let to = VerbsAddr::from_net(peer).map_err(ConnectError::Address)?;
        let qps = create_peer(dev, self.cfg.port, rng).map_err(ConnectError::Device)?;
        let tag = rng.gen();
        let request = self
            .handshake(HandshakeKind::Request, tag, &qps)
            .encode()
            .map_err(ConnectError::Encode)?;
        out.push(Outgoing { to, bytes: request });
        self.slots.insert(
            *peer,
            Slot::Connecting {
                tag,
                qps,
                to,
                request,
                deadline: now + self.cfg.timeout,
                next_try: now + self.cfg.retry,
                tries: 1,
            },
        );
        Ok(PeerState::Connecting)
    }

    /// Resends requests that are due and fails attempts past their
    /// deadline; returns the earliest instant something is due, if any.
    pub fn tick(
        &mut self,
        now: Instant,
        out: &mut Vec<Outgoing>,
        events: &mut Vec<Event<Q>>,
    ) -> Option<Instant> {
        let mut expired = Vec::new();
        let mut due: Option<Instant> = None;
        for (peer, slot) in &mut self.slots {
            if let Slot::Connecting {
                to,
                request,
                deadline,
                next_try,
                tries,
                ..
            } = slot
            {
                if now >= *deadline {
                    expired.push((*peer, *tries));
                    continue;
                }
                if now >= *next_try {
                    out.push(Outgoing {
                        to: *to,
                        bytes: *request,
                    });
                    *tries += 1;
                    *next_try = now + self.cfg.retry;
                }
                let next = (*next_try).min(*deadline);
                due = Some(due.map_or(next, |d| d.min(next)));
            }
        }
        for (peer, tries) in expired {
            self.slots.remove(&peer);
            events.push(Event::Failed {
                peer,
                why: ConnectError::Timeout { tries },
            });
        }
        due
    }

    /// Handles a message received on the UD queue pair (the bytes after
    /// the GRH).
    pub fn on_message<D: QpDevice<Qp = Q>>(
        &mut self,
        dev: &mut D,
        bytes: &[u8],
        rng: &mut impl Rng,
        out: &mut Vec<Outgoing>,
        events: &mut Vec<Event<Q>>,
    ) -> Result<(), IncomingError> {
        let h = Handshake::decode(bytes).map_err(IncomingError::Malformed)?;
        let from = sender_of(&h);
        let peer = from.to_net().map_err(IncomingError::Sender)?;
        match h.kind {
            HandshakeKind::Request => {
                let req = Received { h: &h, from, peer };
                self.on_request(dev, req, rng, out, events)
            }
            HandshakeKind::Reply => {
                self.on_reply(dev, &h, peer, events);
                Ok(())
            }
        }
    }

    /// Answers a connection request (or ignores it: a duplicate, or the
    /// loser of a simultaneous connect).
    fn on_request<D: QpDevice<Qp = Q>>(
        &mut self,
        dev: &mut D,
        req: Received<'_>,
        rng: &mut impl Rng,
        out: &mut Vec<Outgoing>,
        events: &mut Vec<Event<Q>>,
    ) -> Result<(), IncomingError> {
        let Received { h, from, peer } = req;
        let remote = (h.msg_qpn, h.rdma_qpn);
        if peer == self.me_net {
            // Our own request, looped back: answer with a kept passive pair.
            if let Some(l) = self.loops.iter().find(|l| l.tag == h.tag) {
                out.push(l.reply);
                return Ok(());
            }
            if self.loops.len() >= MAX_SELF_LOOPS {
                // Only the newest attempts can still be waiting for an answer.
                self.loops.remove(0);
            }
            let (qps, reply) = self.answer(dev, h, from, rng)?;
            out.push(reply);
            self.loops.push(SelfLoop {
                tag: h.tag,
                _qps: qps,
                reply,
            });
            return Ok(());
        }
        match self.slots.get(&peer) {
            Some(Slot::Connected {
                remote: have,
                reply: Some(reply),
            }) if *have == remote => {
                // Our reply was lost: the same answer again.
                out.push(*reply);
                return Ok(());
            }
            Some(Slot::Connected {
                remote: have,
                reply: None,
            }) if *have == remote => return Ok(()),
            Some(Slot::Connecting { .. }) if self.me_net < peer => {
                // Both sides connect at once: the smaller address keeps its
                // attempt; the peer abandons its own when ours arrives.
                return Ok(());
            }
            // Connecting and yielding, or connected to a pair the peer
            // dropped: answer as the passive side, in the peer's slot.
            Some(_) => {}
            // A new peer: only while the table has room.
            None if self.slots.len() >= self.cfg.max_peers => {
                return Err(IncomingError::TooManyPeers {
                    max: self.cfg.max_peers,
                })
            }
            None => {}
        }
        let (qps, reply) = self.answer(dev, h, from, rng)?;
        out.push(reply);
        self.slots.insert(
            peer,
            Slot::Connected {
                remote,
                reply: Some(reply),
            },
        );
        events.push(Event::Connected { peer, qps });
        Ok(())
    }

    /// A passive pair at RTS against the request's queue pairs, and the
    /// reply naming it.
    fn answer<D: QpDevice<Qp = Q>>(
        &self,
        dev: &mut D,
        h: &Handshake,
        from: VerbsAddr,
        rng: &mut impl Rng,
    ) -> Result<(PeerQps<Q>, Outgoing), IncomingError> {
        let mut qps = create_peer(dev, self.cfg.port, rng).map_err(IncomingError::Device)?;
        connect_peer(
            dev,
            &mut qps,
            h,
            self.cfg.port,
            self.cfg.gid_index,
            self.cfg.mtu.min(h.mtu),
            &self.cfg.timing,
        )
        .map_err(IncomingError::Device)?;
        let bytes = self
            .handshake(HandshakeKind::Reply, h.tag, &qps)
            .encode()
            // Our own queue-pair numbers and PSNs are 24-bit: a device
            // handing out larger ones is refusing the bring-up.
            .map_err(|_| {
                IncomingError::Device(BringUpError::Device {
                    role: super::bringup::QpRole::Msg,
                    call: "ibv_create_qp",
                    errno: libc::ERANGE,
                })
            })?;
        Ok((qps, Outgoing { to: from, bytes }))
    }

    fn on_reply<D: QpDevice<Qp = Q>>(
        &mut self,
        dev: &mut D,
        h: &Handshake,
        peer: NetAddr,
        events: &mut Vec<Event<Q>>,
    ) {
        let matches = matches!(
            self.slots.get(&peer),
            Some(Slot::Connecting { tag, .. }) if *tag == h.tag
        );
        if !matches {
            // A duplicate or stale reply: nothing waits for it.
            return;
        }
        let Some(Slot::Connecting { mut qps, .. }) = self.slots.remove(&peer) else {
            return;
        };
        match connect_peer(
            dev,
            &mut qps,
            h,
            self.cfg.port,
            self.cfg.gid_index,
            self.cfg.mtu.min(h.mtu),
            &self.cfg.timing,
        ) {
            Ok(()) => {
                self.slots.insert(
                    peer,
                    Slot::Connected {
                        remote: (h.msg_qpn, h.rdma_qpn),
                        reply: None,
                    },
                );
                events.push(Event::Connected { peer, qps });
            }
            Err(e) => events.push(Event::Failed {
                peer,
                why: ConnectError::Device(e),
            }),
        }
    }
}

/// A handshake as it arrived: decoded, with its sender's UD address and
/// the engine address that names the peer.
struct Received<'a> {
    h: &'a Handshake,
    from: VerbsAddr,
    peer: NetAddr,
}

#[cfg(test)]
mod tests {
    use super::super::bringup::{QpRole, QpState, Transition};
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A fake device: numbers queue pairs from `base`, logs transitions,
    /// and records which queue pairs are still alive.
    struct Fake {
        next: u32,
        alive: Rc<RefCell<Vec<u32>>>,
        log: Vec<(u32, Transition)>,
        fail_create: bool,
    }

    struct FakeQp {
        qpn: u32,
        state: QpState,
        alive: Rc<RefCell<Vec<u32>>>,
    }

    impl Drop for FakeQp {
        fn drop(&mut self) {
            self.alive.borrow_mut().retain(|q| *q != self.qpn);
        }
    }

    impl Fake {
        fn new(base: u32) -> Fake {
            Fake {
                next: base,
                alive: Rc::default(),
                log: Vec::new(),
                fail_create: false,
            }
        }
    }

    impl QpDevice for Fake {
        type Qp = FakeQp;
        fn create_qp(&mut self, role: QpRole) -> Result<(FakeQp, u32), BringUpError> {
            if self.fail_create {
                return Err(BringUpError::Device {
                    role,
                    call: "ibv_create_qp",
                    errno: 12,
                });
            }
            self.next += 1;
            self.alive.borrow_mut().push(self.next);
            Ok((
                FakeQp {
                    qpn: self.next,
                    state: QpState::Reset,
                    alive: self.alive.clone(),
                },
                self.next,
            ))
        }
        fn modify(
            &mut self,
            qp: &mut FakeQp,
            _role: QpRole,
            t: &Transition,
        ) -> Result<(), BringUpError> {
            qp.state = qp.state.apply(t)?;
            self.log.push((qp.qpn, *t));
            Ok(())
        }
    }

    /// One simulated domain: its connector, device and inbox.
    struct Side {
        c: Connector<FakeQp>,
        dev: Fake,
        connected: HashMap<NetAddr, PeerQps<FakeQp>>,
        failed: Vec<(NetAddr, ConnectError)>,
        rng: StdRng,
    }

    fn cfg() -> ConnectorConfig {
        ConnectorConfig {
            port: 1,
            gid_index: 3,
            max_peers: 64,
            mtu: 5,
            timing: RcTiming::default(),
            retry: Duration::from_millis(10),
            timeout: Duration::from_millis(100),
        }
    }

    fn side(n: u8, mtu: u8) -> Side {
        let me = VerbsAddr {
            gid: [n; 16],
            lid: u16::from(n),
            ud_qpn: 0x100 * u32::from(n),
            qkey: 0x1000 + u32::from(n),
        };
        Side {
            c: Connector::new(me, ConnectorConfig { mtu, ..cfg() }).unwrap(),
            dev: Fake::new(0x1000 * u32::from(n)),
            connected: HashMap::new(),
            failed: Vec::new(),
            rng: StdRng::seed_from_u64(u64::from(n)),
        }
    }

    impl Side {
        fn addr(&self) -> NetAddr {
            self.c.address()
        }
        fn absorb(&mut self, events: Vec<Event<FakeQp>>) {
            for e in events {
                match e {
                    Event::Connected { peer, qps } => {
                        self.connected.insert(peer, qps);
                    }
                    Event::Failed { peer, why } => self.failed.push((peer, why)),
                }
            }
        }
        fn deliver(&mut self, m: &Outgoing, out: &mut Vec<Outgoing>) {
            let mut ev = Vec::new();
            self.c
                .on_message(&mut self.dev, &m.bytes, &mut self.rng, out, &mut ev)
                .unwrap();
            self.absorb(ev);
        }
    }

    /// Delivers messages between sides until none is left; `drop` decides
    /// which are lost (by index in the global sequence).
    fn run(sides: &mut [&mut Side], mut queue: Vec<Outgoing>, drop: &dyn Fn(usize) -> bool) {
        let mut n = 0;
        while !queue.is_empty() {
            let mut next = Vec::new();
            for m in queue {
                n += 1;
                if drop(n - 1) {
                    continue;
                }
                let to = m.to.to_net().unwrap();
                let s = sides
                    .iter_mut()
                    .find(|s| s.addr() == to)
                    .expect("message to a known side");
                s.deliver(&m, &mut next);
            }
            queue = next;
        }
    }

    fn rts(q: &PeerQps<FakeQp>) -> bool {
        q.msg.qp.state == QpState::Rts && q.rdma.qp.state == QpState::Rts
    }

    /// Checks that `a`'s pair targets `b`'s pair crosswise.
    fn crosswise(a: &Side, b: &Side) {
        let qa = &a.connected[&b.addr()];
        let qb = &b.connected[&a.addr()];
        assert!(rts(qa) && rts(qb));
        let dest = |dev: &Fake, qpn: u32| {
            dev.log.iter().find_map(|(q, t)| match t {
                Transition::Rtr { dest_qpn, .. } if *q == qpn => Some(*dest_qpn),
                _ => None,
            })
        };
        assert_eq!(dest(&a.dev, qa.msg.qpn), Some(qb.msg.qpn));
        assert_eq!(dest(&a.dev, qa.rdma.qpn), Some(qb.rdma.qpn));
        assert_eq!(dest(&b.dev, qb.msg.qpn), Some(qa.msg.qpn));
        assert_eq!(dest(&b.dev, qb.rdma.qpn), Some(qa.rdma.qpn));
    }

    #[test]
    fn a_flood_of_requests_creates_a_bounded_number_of_queue_pairs() {
        let mut target = side(1, 5);
        target.c.cfg.max_peers = 3;
        let mut refused = 0;
        for n in 2..12u8 {
            let mut s = side(n, 5);
            let mut out = Vec::new();
            let to = target.addr();
            s.c.connect(&mut s.dev, &to, Instant::now(), &mut s.rng, &mut out)
                .unwrap();
            let (mut replies, mut ev) = (Vec::new(), Vec::new());
            match target.c.on_message(
                &mut target.dev,
                &out[0].bytes,
                &mut target.rng,
                &mut replies,
                &mut ev,
            ) {
                Ok(()) => target.absorb(ev),
                Err(IncomingError::TooManyPeers { max: 3 }) => {
                    refused += 1;
                    assert!(replies.is_empty() && ev.is_empty());
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        assert_eq!((target.connected.len(), refused), (3, 7));
        assert_eq!(target.dev.alive.borrow().len(), 2 * 3);
        // A known peer starting over is still answered at the bound.
        let known = *target.connected.keys().next().unwrap();
        assert_eq!(target.c.state(&known), PeerState::Connected);

        // Our own requests (a loop-back connection), each a new tag: the
        // passive pairs kept for them stay bounded too.
        let mut out = Vec::new();
        let me = target.addr();
        target
            .c
            .connect(
                &mut target.dev,
                &me,
                Instant::now(),
                &mut target.rng,
                &mut out,
            )
            .unwrap();
        let alive_before = target.dev.alive.borrow().len();
        for tag in 0..10u64 {
            let mut m = out[0];
            m.bytes[6..14].copy_from_slice(&tag.to_le_bytes());
            let (mut replies, mut ev) = (Vec::new(), Vec::new());
            target
                .c
                .on_message(
                    &mut target.dev,
                    &m.bytes,
                    &mut target.rng,
                    &mut replies,
                    &mut ev,
                )
                .unwrap();
            assert_eq!(replies.len(), 1);
        }
        assert_eq!(target.c.loops.len(), MAX_SELF_LOOPS);
        assert_eq!(
            target.dev.alive.borrow().len(),
            alive_before + 2 * MAX_SELF_LOOPS
        );
    }

    #[test]
    fn request_reply_connects_both_sides_crosswise() {
        let (mut a, mut b) = (side(1, 5), side(2, 3));
        let t0 = Instant::now();
        let mut out = Vec::new();
        let s =
            a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out)
                .unwrap();
        assert_eq!(s, PeerState::Connecting);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].to.to_net().unwrap(), b.addr());
        run(&mut [&mut a, &mut b], out, &|_| false);
        assert_eq!(a.c.state(&b.addr()), PeerState::Connected);
        assert_eq!(b.c.state(&a.addr()), PeerState::Connected);
        crosswise(&a, &b);
        // The path MTU is the smaller of the two ports' (3).
        for dev in [&a.dev, &b.dev] {
            assert!(dev.log.iter().all(|(_, t)| match t {
                Transition::Rtr { path_mtu, .. } => *path_mtu == 3,
                _ => true,
            }));
        }
        // Connecting again is a no-op.
        let mut out = Vec::new();
        let s =
            a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out)
                .unwrap();
        assert_eq!((s, out.len()), (PeerState::Connected, 0));
        assert!(!a.c.connecting());
    }

    #[test]
    fn a_lost_request_is_resent_and_a_lost_reply_answered_again() {
        let (mut a, mut b) = (side(1, 5), side(2, 5));
        let t0 = Instant::now();
        let mut out = Vec::new();
        a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out)
            .unwrap();
        // The request is lost.
        run(&mut [&mut a, &mut b], out, &|i| i == 0);
        assert_eq!(a.c.state(&b.addr()), PeerState::Connecting);
        let mut out = Vec::new();
        let mut ev = Vec::new();
        assert!(a.c.tick(t0, &mut out, &mut ev).is_some());
        assert!(out.is_empty(), "not due yet");
        a.c.tick(t0 + Duration::from_millis(10), &mut out, &mut ev);
        assert_eq!(out.len(), 1, "resent");
        // This time the reply is lost (message #1 of this run).
        run(&mut [&mut a, &mut b], out, &|i| i == 1);
        assert_eq!(b.c.state(&a.addr()), PeerState::Connected);
        assert_eq!(a.c.state(&b.addr()), PeerState::Connecting);
        let b_pairs = b.dev.alive.borrow().len();
        let mut out = Vec::new();
        a.c.tick(t0 + Duration::from_millis(20), &mut out, &mut ev);
        run(&mut [&mut a, &mut b], out, &|_| false);
        assert!(ev.is_empty());
        assert_eq!(a.c.state(&b.addr()), PeerState::Connected);
        // The duplicate request created no second pair at b.
        assert_eq!(b.dev.alive.borrow().len(), b_pairs);
        crosswise(&a, &b);
    }

    #[test]
    fn an_unanswered_attempt_times_out_and_drops_its_pair() {
        let mut a = side(1, 5);
        let b = side(2, 5);
        let t0 = Instant::now();
        let mut out = Vec::new();
        a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out)
            .unwrap();
        assert_eq!(a.dev.alive.borrow().len(), 2);
        let mut ev = Vec::new();
        let mut t = t0;
        while a.c.connecting() {
            t += Duration::from_millis(10);
            a.c.tick(t, &mut out, &mut ev);
        }
        assert_eq!(t - t0, Duration::from_millis(100));
        assert!(matches!(
            ev.as_slice(),
            [Event::Failed { peer, why: ConnectError::Timeout { tries: 10 } }] if *peer == b.addr()
        ));
        assert_eq!(a.c.state(&b.addr()), PeerState::Unknown);
        assert!(a.dev.alive.borrow().is_empty(), "queue pairs released");
        assert!(ConnectError::Timeout { tries: 3 }
            .to_string()
            .contains("3 requests"));
    }

    #[test]
    fn simultaneous_connects_make_one_connection() {
        let (mut a, mut b) = (side(1, 5), side(2, 5));
        assert!(a.addr() < b.addr());
        let t0 = Instant::now();
        let mut out = Vec::new();
        a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out)
            .unwrap();
        b.c.connect(&mut b.dev, &a.addr(), t0, &mut b.rng, &mut out)
            .unwrap();
        run(&mut [&mut a, &mut b], out, &|_| false);
        assert_eq!(a.c.state(&b.addr()), PeerState::Connected);
        assert_eq!(b.c.state(&a.addr()), PeerState::Connected);
        crosswise(&a, &b);
        // b abandoned its own attempt: only its passive pair is alive.
        assert_eq!(b.dev.alive.borrow().len(), 2);
        assert_eq!(a.dev.alive.borrow().len(), 2);
        // Nothing left to resend.
        let mut out2 = Vec::new();
        let mut ev = Vec::new();
        a.c.tick(t0 + Duration::from_millis(50), &mut out2, &mut ev);
        b.c.tick(t0 + Duration::from_millis(50), &mut out2, &mut ev);
        assert!(out2.is_empty() && ev.is_empty());
    }

    #[test]
    fn a_peer_starting_over_replaces_the_connection() {
        let (mut a, mut b) = (side(1, 5), side(2, 5));
        let t0 = Instant::now();
        let mut out = Vec::new();
        a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out)
            .unwrap();
        run(&mut [&mut a, &mut b], out, &|_| false);
        let old = b.connected[&a.addr()].msg.qpn;
        // a's connection broke: it forgets b and connects again.
        a.connected.clear();
        a.c.forget(&b.addr());
        let mut out = Vec::new();
        a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out)
            .unwrap();
        run(&mut [&mut a, &mut b], out, &|_| false);
        assert_ne!(b.connected[&a.addr()].msg.qpn, old, "replaced");
        crosswise(&a, &b);
    }

    #[test]
    fn connecting_to_oneself_loops_through_a_kept_passive_pair() {
        let mut a = side(1, 5);
        let me = a.addr();
        let t0 = Instant::now();
        let mut out = Vec::new();
        a.c.connect(&mut a.dev, &me, t0, &mut a.rng, &mut out)
            .unwrap();
        let first = out[0];
        run(&mut [&mut a], out, &|_| false);
        assert_eq!(a.c.state(&me), PeerState::Connected);
        let q = &a.connected[&me];
        assert!(rts(q));
        assert_eq!(a.dev.alive.borrow().len(), 4, "active and passive pair");
        // A resent request gets the same reply, no third pair.
        let mut out = Vec::new();
        a.deliver(&first, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(a.dev.alive.borrow().len(), 4);
        a.connected.clear();
        a.c.forget(&me);
        assert!(a.dev.alive.borrow().is_empty());
    }

    #[test]
    fn malformed_and_stale_messages_change_nothing() {
        let (mut a, mut b) = (side(1, 5), side(2, 5));
        let mut out = Vec::new();
        let mut ev = Vec::new();
        for bad in [&[][..], &[0u8; 10][..], &[0xffu8; ENCODED_LEN][..]] {
            assert!(matches!(
                a.c.on_message(&mut a.dev, bad, &mut a.rng, &mut out, &mut ev),
                Err(IncomingError::Malformed(_))
            ));
        }
        // A request whose sender fields are not an address (qkey top bit).
        let t0 = Instant::now();
        b.c.connect(&mut b.dev, &a.addr(), t0, &mut b.rng, &mut out)
            .unwrap();
        let mut h = Handshake::decode(&out[0].bytes).unwrap();
        h.qkey |= 0x8000_0000;
        assert!(matches!(
            a.c.on_message(
                &mut a.dev,
                &h.encode().unwrap(),
                &mut a.rng,
                &mut Vec::new(),
                &mut ev
            ),
            Err(IncomingError::Sender(_))
        ));
        // A reply nobody waits for.
        let mut r = Handshake::decode(&out[0].bytes).unwrap();
        r.kind = HandshakeKind::Reply;
        a.c.on_message(
            &mut a.dev,
            &r.encode().unwrap(),
            &mut a.rng,
            &mut Vec::new(),
            &mut ev,
        )
        .unwrap();
        assert!(ev.is_empty());
        assert_eq!(a.c.state(&b.addr()), PeerState::Unknown);
        assert!(a.dev.alive.borrow().is_empty());
        // A non-verbs peer address.
        let lo = NetAddr::new(b"loopback/1/0").unwrap();
        assert!(matches!(
            a.c.connect(&mut a.dev, &lo, t0, &mut a.rng, &mut out),
            Err(ConnectError::Address(_))
        ));
    }

    #[test]
    fn device_failures_are_reported_not_panicked() {
        let (mut a, mut b) = (side(1, 5), side(2, 5));
        let t0 = Instant::now();
        a.dev.fail_create = true;
        let mut out = Vec::new();
        assert!(matches!(
            a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out),
            Err(ConnectError::Device(_))
        ));
        assert_eq!(a.c.state(&b.addr()), PeerState::Unknown);
        a.dev.fail_create = false;
        b.dev.fail_create = true;
        a.c.connect(&mut a.dev, &b.addr(), t0, &mut a.rng, &mut out)
            .unwrap();
        let mut ev = Vec::new();
        assert!(matches!(
            b.c.on_message(
                &mut b.dev,
                &out[0].bytes,
                &mut b.rng,
                &mut Vec::new(),
                &mut ev
            ),
            Err(IncomingError::Device(_))
        ));
        assert_eq!(b.c.state(&a.addr()), PeerState::Unknown);
    }
}
