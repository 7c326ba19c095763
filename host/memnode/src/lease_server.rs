//! The memory node's side of leases (the protocol, its timing and the
//! compute node's side are `rolex_kv::lease`): one parked thread per
//! connected compute node, blocked in a read of its renewals, bounded by
//! the time left on its lease. A request must arrive whole within
//! [`LeaseConfig::handshake_timeout`] (one bound for all its bytes), and
//! at most [`MAX_HANDSHAKES`] requests are read at once (one more is
//! refused at once): connections that send nothing, or a byte at a time,
//! hold no thread for longer, nor more threads than that. A lease ends `duration` after the last
//! renewal received (or when its connection closes); then the holder's
//! locks are released twice, after [`LeaseConfig::grace`] and again after
//! [`LeaseConfig::linger`]. Ids are handed out round-robin over the whole
//! leased space and one is reused only once the space has wrapped *and*
//! [`LeaseConfig::reuse_after`] (an hour) has passed since its release.
//!
//! # What is fenced, and what is not
//! - A stalled holder (stopped, paused, cut off from the lease port) stops
//!   posting writes at least `duration / 4` before the server can release
//!   its locks: its later lock `CAS`es, WRITEs and unlocks are refused at
//!   the client (`KvError::LeaseExpired`).
//! - Its late unlock `CAS` (posted before it lapsed, delivered after the
//!   release) expects `locked_by(its id)`; the id is not reused for an
//!   hour, so it fails against any later holder's word; a late lock `CAS`
//!   that lands on a free word takes a lock that nobody holds a lease for,
//!   and the memory node's sweep of locks without a lease releases it.
//! - A data WRITE (or a split's leaf WRITE) that the holder posted while
//!   its lease was valid and that reaches the pool only after the lease
//!   ended (the process stopped between the validity check and the
//!   provider sending it, or the provider queued it and sends it only when
//!   the process runs again: `tcp;ofi_rxm` has manual progress) is fenced
//!   only with per-lease keys ([`LeaseServer::start_with_keys`] with
//!   [`crate::LeaseKeys`], which `rolex memnode --pool-file` uses): the
//!   key is closed the moment the lease ends, before any lock is
//!   released, and the provider refuses what arrives through it
//!   (`tcp;ofi_rxm` drops the connection; nothing lands). **Not fenced**:
//!   the same late WRITE to an anonymous pool (no file to map again; its
//!   compute nodes use the offer's key, which is never closed), and a
//!   transfer the provider had already accepted before the close and is
//!   still placing when the locks are released (the grace period, 100 ms
//!   by default, is what separates them; a leaf-sized WRITE is placed in
//!   microseconds).

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rolex_core::entry::LockOwner;
use rolex_core::wire::{MrDesc, Wire};
use rolex_engine::{DeadlineReader, Refusals};
use rolex_kv::lease::wire;
use rolex_kv::lease::{io_err, LeaseError};

/// Lease requests read at once; one more is refused at once.
pub const MAX_HANDSHAKES: usize = 64;

/// Options of a [`LeaseServer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The token compute nodes must present (the bootstrap's).
    pub token: String,
    /// A lease ends this long after the last renewal received (clients
    /// renew every quarter of it and stop writing a quarter before it).
    pub duration: Duration,
    /// Wait between a lease's end and the first release of its locks.
    pub grace: Duration,
    /// Wait before the second release, after which the id is free again.
    pub linger: Duration,
    /// An id freed is not handed out again before this long (nor before
    /// the round-robin has gone round the whole space).
    pub reuse_after: Duration,
    /// Bound on a client's request.
    pub handshake_timeout: Duration,
}

impl LeaseConfig {
    /// Defaults: 2 s leases, 100 ms grace, 2 s linger, ids reused after an
    /// hour at the earliest, 5 s handshake bound.
    pub fn new(token: &str) -> Self {
        LeaseConfig {
            token: token.to_string(),
            duration: Duration::from_secs(2),
            grace: Duration::from_millis(100),
            linger: Duration::from_secs(2),
            reuse_after: Duration::from_secs(3600),
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// Called with the id of each lease that ended (twice, see the module
/// docs); returns how many locks it released, or why it could not.
pub type OnExpire = dyn Fn(LockOwner) -> Result<u64, String> + Send + Sync;

/// Keys to the pool granted per lease and closed when it ends
/// ([`crate::LeaseKeys`] for a file-backed pool).
pub trait PoolKeys: Send + Sync {
    /// Opens a key to the pool for lease `owner` alone; `None`: none (the
    /// compute node uses the offer's key).
    fn open(&self, owner: LockOwner) -> Result<Option<MrDesc>, String>;
    /// Closes `owner`'s key: from the return on, nothing posted through it
    /// reaches the pool.
    fn close(&self, owner: LockOwner);
    /// Frees what `owner`'s closed key kept (once its locks are released
    /// for the last time).
    fn forget(&self, owner: LockOwner);
}

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEnd {
    /// No renewal within the lease's duration (the holder stalled).
    Expired,
    /// Its connection closed (the holder died or dropped its lease).
    Closed,
}

/// Ids and their reuse (see the module docs).
struct Ids {
    /// Held, or ended and still being released.
    used: BTreeSet<u16>,
    /// When each id was last freed.
    freed: HashMap<u16, Instant>,
    /// Where the round-robin goes on.
    next: u16,
}

struct ServerShared {
    cfg: LeaseConfig,
    stop: AtomicBool,
    ids: Mutex<Ids>,
    /// Open lease connections (to end them at shutdown).
    conns: Mutex<HashMap<u16, TcpStream>>,
    on_expire: Arc<OnExpire>,
    keys: Option<Arc<dyn PoolKeys>>,
    released: AtomicU64,
    expired: AtomicU64,
    timed_out: AtomicU64,
    /// Requests being read now (at most [`MAX_HANDSHAKES`]).
    handshakes: AtomicUsize,
    /// Requests refused.
    refusals: Refusals,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ServerShared {
    fn new(
        cfg: LeaseConfig,
        on_expire: Arc<OnExpire>,
        keys: Option<Arc<dyn PoolKeys>>,
        next: u16,
    ) -> Self {
        ServerShared {
            cfg,
            stop: AtomicBool::new(false),
            ids: Mutex::new(Ids {
                used: BTreeSet::new(),
                freed: HashMap::new(),
                next,
            }),
            conns: Mutex::new(HashMap::new()),
            on_expire,
            keys,
            released: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            handshakes: AtomicUsize::new(0),
            refusals: Refusals::default(),
        }
    }

    /// The next leased id round-robin that is neither in use nor freed
    /// less than [`LeaseConfig::reuse_after`] ago.
    fn allocate(&self) -> Option<u16> {
        let mut ids = lock(&self.ids);
        let now = Instant::now();
        let reuse_after = self.cfg.reuse_after;
        ids.freed
            .retain(|_, at| now.saturating_duration_since(*at) < reuse_after);
        for _ in 0..u16::MAX {
            let id = ids.next;
            ids.next = if id >= LockOwner::AGENT.0 - 1 {
                1
            } else {
                id + 1
            };
            if LockOwner(id).is_leased() && !ids.freed.contains_key(&id) && ids.used.insert(id) {
                return Some(id);
            }
        }
        None
    }

    fn free(&self, id: u16) {
        let mut ids = lock(&self.ids);
        ids.used.remove(&id);
        ids.freed.insert(id, Instant::now());
    }
}

/// The memory node's side: accepts leases and reports the ones that end.
pub struct LeaseServer {
    shared: Arc<ServerShared>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for LeaseServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl LeaseServer {
    /// Listens on `listen` (`ADDR:PORT`, port 0 for any) and serves leases
    /// until dropped; `on_expire` is called from the ended lease's thread.
    pub fn start(
        listen: &str,
        cfg: LeaseConfig,
        on_expire: Arc<OnExpire>,
    ) -> Result<LeaseServer, LeaseError> {
        Self::start_with_keys(listen, cfg, on_expire, None)
    }

    /// [`LeaseServer::start`], granting each lease a key of its own to the
    /// pool from `keys` and closing it the moment the lease ends, before
    /// its locks are released (see [`crate::lease_keys`]).
    pub fn start_with_keys(
        listen: &str,
        cfg: LeaseConfig,
        on_expire: Arc<OnExpire>,
        keys: Option<Arc<dyn PoolKeys>>,
    ) -> Result<LeaseServer, LeaseError> {
        let ms = u32::try_from(cfg.duration.as_millis()).unwrap_or(u32::MAX);
        if !wire::DURATION_MS.contains(&ms) {
            return Err(LeaseError::Protocol(
                "lease duration outside 40 ms ..= 1 hour",
            ));
        }
        let listener =
            TcpListener::bind(listen).map_err(io_err(format!("listening on {listen}")))?;
        let addr = listener
            .local_addr()
            .map_err(io_err("reading the listening address"))?;
        let shared = Arc::new(ServerShared::new(cfg, on_expire, keys, 1));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("rolex-lease".into())
            .spawn(move || accept_loop(&s, listener))
            .map_err(io_err("starting the lease thread"))?;
        Ok(LeaseServer {
            shared,
            addr,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Leases held now (ids still being released included).
    pub fn active(&self) -> usize {
        lock(&self.shared.ids).used.len()
    }

    /// Whether `owner` is an id this server has granted and not yet freed
    /// (its lease is held, or it ended and its locks are being released).
    pub fn holds(&self, owner: LockOwner) -> bool {
        lock(&self.shared.ids).used.contains(&owner.0)
    }

    /// Leases that ended so far (closed or expired).
    pub fn expired(&self) -> u64 {
        self.shared.expired.load(Ordering::Relaxed)
    }

    /// Leases that ended for want of a renewal (their holder stalled).
    pub fn timed_out(&self) -> u64 {
        self.shared.timed_out.load(Ordering::Relaxed)
    }

    /// Locks released so far on behalf of ended leases.
    pub fn released(&self) -> u64 {
        self.shared.released.load(Ordering::Relaxed)
    }

    /// The requests it refused (malformed, a wrong token, too many at
    /// once, no id or key to give, one that did not arrive whole in
    /// time), for its operator.
    pub fn refusals(&self) -> &Refusals {
        &self.shared.refusals
    }
}

impl Drop for LeaseServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept and every lease thread; none of them releases
        // anything once `stop` is set.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for (_, c) in lock(&self.shared.conns).drain() {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(s: &Arc<ServerShared>, listener: TcpListener) {
    for conn in listener.incoming() {
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        let mut stream = match conn {
            Ok(s) => s,
            Err(_) => {
                // Out of descriptors or an aborted connection: do not spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if s.handshakes.fetch_add(1, Ordering::SeqCst) >= MAX_HANDSHAKES {
            s.handshakes.fetch_sub(1, Ordering::SeqCst);
            let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
            refuse(s, &mut stream, "too many lease requests at once: try again");
            continue;
        }
        let s2 = s.clone();
        // One parked thread per lease: compute nodes are few.
        let spawned = std::thread::Builder::new()
            .name("rolex-lease-conn".into())
            .spawn(move || serve_one(&s2, stream));
        if let Err(e) = spawned {
            s.handshakes.fetch_sub(1, Ordering::SeqCst);
            eprintln!("lease: cannot start a connection thread: {e}");
        }
    }
}

/// Refuses the request on `stream`, saying `why`, and counts it.
fn refuse(s: &ServerShared, stream: &mut TcpStream, why: &str) {
    s.refusals.note(stream.peer_addr().ok(), why);
    let _ = stream.write_all(&wire::refused(why));
}

fn serve_one(s: &ServerShared, mut stream: TcpStream) {
    let _ = stream.set_write_timeout(Some(s.cfg.handshake_timeout));
    let read = wire::read_request(&mut DeadlineReader::new(&stream, s.cfg.handshake_timeout));
    // The request is read (or given up on): the next one may be.
    s.handshakes.fetch_sub(1, Ordering::SeqCst);
    let token = match read {
        Ok(token) => token,
        Err(why) => {
            refuse(s, &mut stream, why);
            return;
        }
    };
    if token != s.cfg.token.as_bytes() {
        refuse(s, &mut stream, "wrong token");
        return;
    }
    let Some(id) = s.allocate() else {
        refuse(
            s,
            &mut stream,
            "no lease id is free (65534 held, or released within the reuse bound)",
        );
        return;
    };
    // Checked at start.
    let ms = s.cfg.duration.as_millis() as u32;
    let owner = LockOwner(id);
    let desc = match s.keys.as_ref().map(|k| k.open(owner)) {
        None | Some(Ok(None)) => Vec::new(),
        Some(Ok(Some(d))) => d.to_vec().unwrap_or_default(),
        Some(Err(e)) => {
            refuse(s, &mut stream, &format!("no key to the pool: {e}"));
            s.free(id);
            return;
        }
    };
    let end_key = |forget: bool| {
        if let Some(k) = &s.keys {
            k.close(owner);
            if forget {
                k.forget(owner);
            }
        }
    };
    let _ = stream.set_nodelay(true);
    // The lease runs from here: the client's starts before it sent its
    // request, so earlier.
    let mut last = Instant::now();
    let registered = stream
        .try_clone()
        .map(|c| lock(&s.conns).insert(id, c))
        .is_ok();
    if !registered || stream.write_all(&wire::granted(id, ms, &desc)).is_err() {
        lock(&s.conns).remove(&id);
        end_key(true);
        s.free(id);
        return;
    }
    let end = serve_renewals(s, &mut stream, &mut last);
    // Before anything else: nothing it posted lands from here on.
    end_key(false);
    lock(&s.conns).remove(&id);
    let _ = stream.shutdown(Shutdown::Both);
    if s.stop.load(Ordering::SeqCst) {
        return;
    }
    s.expired.fetch_add(1, Ordering::Relaxed);
    if end == LeaseEnd::Expired {
        s.timed_out.fetch_add(1, Ordering::Relaxed);
    }
    for wait in [s.cfg.grace, s.cfg.linger] {
        std::thread::sleep(wait);
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        match (s.on_expire)(owner) {
            Ok(n) => {
                s.released.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => eprintln!("lease {id}: releasing its locks failed: {e}"),
        }
    }
    end_key(true);
    s.free(id);
}

/// Echoes renewals until the lease ends: `duration` after the last one
/// received (`last`, taken when the read returned: no earlier than it
/// arrived), or when the connection closes or misbehaves.
fn serve_renewals(s: &ServerShared, stream: &mut TcpStream, last: &mut Instant) -> LeaseEnd {
    let mut buf = [0u8; wire::RENEWAL];
    let mut have = 0;
    loop {
        let deadline = *last + s.cfg.duration;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return LeaseEnd::Expired;
        }
        if stream.set_read_timeout(Some(left)).is_err() {
            return LeaseEnd::Closed;
        }
        match stream.read(&mut buf[have..]) {
            Ok(0) => return LeaseEnd::Closed,
            Ok(n) => {
                have += n;
                if have == wire::RENEWAL {
                    have = 0;
                    // A renewal counts only if it arrived before the end.
                    if Instant::now() >= deadline {
                        return LeaseEnd::Expired;
                    }
                    *last = Instant::now();
                    if stream.write_all(&buf).is_err() {
                        return LeaseEnd::Closed;
                    }
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return LeaseEnd::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rolex_kv::lease::LeaseClient;
    use std::sync::mpsc;

    fn quick(token: &str) -> LeaseConfig {
        LeaseConfig {
            grace: Duration::from_millis(1),
            linger: Duration::from_millis(1),
            duration: Duration::from_millis(400),
            ..LeaseConfig::new(token)
        }
    }

    fn reporting(cfg: LeaseConfig) -> (LeaseServer, mpsc::Receiver<LockOwner>) {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let srv = LeaseServer::start(
            "127.0.0.1:0",
            cfg,
            Arc::new(move |o: LockOwner| {
                let _ = lock(&tx).send(o);
                Ok(1)
            }),
        )
        .unwrap();
        (srv, rx)
    }

    #[test]
    fn a_dropped_lease_is_reported_twice_and_its_id_kept_from_reuse() {
        let (srv, rx) = reporting(quick("t"));
        let at = srv.local_addr().to_string();
        let a = LeaseClient::acquire(&at, "t", Duration::from_secs(5)).unwrap();
        let b = LeaseClient::acquire(&at, "t", Duration::from_secs(5)).unwrap();
        assert!(a.owner().is_leased() && b.owner().is_leased());
        assert_ne!(a.owner(), b.owner());
        assert_eq!(a.duration(), Duration::from_millis(400));
        assert!(srv.holds(a.owner()) && srv.holds(b.owner()));
        assert!(!srv.holds(LockOwner::AGENT));
        let dead = a.owner();
        let fence = a.fence();
        assert!(fence.valid());
        drop(a);
        assert!(!fence.valid(), "a dropped lease fences at once");
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let second = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((first, second), (dead, dead));
        // The survivor's lease is untouched, renewed past its duration.
        assert!(rx.recv_timeout(Duration::from_millis(900)).is_err());
        assert!(b.valid());
        while srv.active() != 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!((srv.expired(), srv.timed_out()), (1, 0));
        assert_eq!(srv.released(), 2);
        assert!(!srv.holds(dead));
        // Its id is not handed out again within the reuse bound.
        let c = LeaseClient::acquire(&at, "t", Duration::from_secs(5)).unwrap();
        assert_ne!(c.owner(), dead);
        drop((b, c));
    }

    /// A holder that stops renewing (its renewals held back, as a stopped
    /// process's are): the client counts its lease over before the server
    /// ends it, and never counts it valid again.
    #[test]
    fn a_stalled_holder_is_fenced_before_its_locks_are_released() {
        let (srv, rx) = reporting(quick("t"));
        let at = srv.local_addr().to_string();
        // A client that speaks the protocol by hand and never renews.
        let mut raw = TcpStream::connect(&at).unwrap();
        raw.write_all(&wire::request(b"t")).unwrap();
        let mut g = [0u8; wire::REPLY_HEAD + wire::GRANT_TAIL];
        raw.read_exact(&mut g).unwrap();
        let granted = Instant::now();
        let owner = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let waited = granted.elapsed();
        eprintln!(
            "injected: a holder that never renews a 400 ms lease; found: released after {waited:?}"
        );
        assert_eq!(owner.0, u16::from_le_bytes([g[1], g[2]]));
        assert!(
            waited >= Duration::from_millis(399),
            "released before the duration"
        );
        assert_eq!(srv.timed_out(), 1);
        let mut rest = [0u8; 1];
        assert_eq!(raw.read(&mut rest).unwrap_or(0), 0, "the server closed it");
        // The real client: valid while it renews, never counting on more
        // than `d − m` past a renewal it sent.
        let c = LeaseClient::acquire(&at, "t", Duration::from_secs(5)).unwrap();
        assert!(c.margin() == Duration::from_millis(100));
        std::thread::sleep(Duration::from_millis(900));
        assert!(c.valid(), "renewed past its duration");
        assert!(c.fence().remaining() <= Duration::from_millis(300));
    }

    #[test]
    fn wrong_token_and_strangers_are_refused_with_the_reason() {
        let srv = LeaseServer::start(
            "127.0.0.1:0",
            quick("right"),
            Arc::new(|_: LockOwner| Ok(0)),
        )
        .unwrap();
        let addr = srv.local_addr().to_string();
        match LeaseClient::acquire(&addr, "wrong", Duration::from_secs(5)) {
            Err(LeaseError::Refused(why)) => assert!(why.contains("wrong token"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        let mut reply = Vec::new();
        let _ = s.read_to_end(&mut reply);
        assert_eq!(reply.first(), Some(&1), "a stranger gets a refusal");
        assert_eq!(srv.active(), 0);
    }

    /// Regression: every connection got a thread whose reads each waited
    /// up to the handshake bound, so connections sending a byte at a time
    /// held a thread each for as long as they liked, as many as they were.
    #[test]
    fn a_trickling_request_is_cut_off_at_the_handshake_bound() {
        let cfg = LeaseConfig {
            handshake_timeout: Duration::from_millis(300),
            ..quick("t")
        };
        let srv = LeaseServer::start("127.0.0.1:0", cfg, Arc::new(|_: LockOwner| Ok(0))).unwrap();
        let mut s = TcpStream::connect(srv.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        // 100 ms a byte: 1.1 s for the whole request; the server gives up
        // within its 300 ms, refusing it.
        let mut reply = Vec::new();
        for &b in &wire::request(b"t") {
            if s.write_all(&[b]).is_err() {
                break;
            }
            let mut got = [0u8; 64];
            match s.read(&mut got) {
                Ok(0) => break,
                Ok(n) => reply.extend_from_slice(&got[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
            std::thread::sleep(Duration::from_millis(90));
        }
        assert_eq!(reply.first(), Some(&1), "refused: {reply:?}");
        assert_eq!(srv.active(), 0);
    }

    #[test]
    fn requests_beyond_the_bound_are_refused_and_the_server_recovers() {
        let srv =
            LeaseServer::start("127.0.0.1:0", quick("t"), Arc::new(|_: LockOwner| Ok(0))).unwrap();
        let at = srv.local_addr().to_string();
        let silent: Vec<TcpStream> = (0..MAX_HANDSHAKES)
            .map(|_| TcpStream::connect(&at).unwrap())
            .collect();
        // Every silent one is being read (a hang guard, not a timing bound).
        for _ in 0..500 {
            if srv.shared.handshakes.load(Ordering::SeqCst) == MAX_HANDSHAKES {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        match LeaseClient::acquire(&at, "t", Duration::from_secs(5)) {
            Err(LeaseError::Refused(why)) => assert!(why.contains("too many"), "{why}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        // Counted for the operator, naming the peer.
        let last = srv.refusals().last().unwrap();
        assert!(
            last.starts_with("127.0.0.1:") && last.contains("too many"),
            "{last}"
        );
        drop(silent);
        let got = (0..100).find_map(|_| {
            let c = LeaseClient::acquire(&at, "t", Duration::from_secs(5)).ok();
            if c.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            c
        });
        assert!(got.is_some(), "no lease once the silent connections left");
    }

    #[test]
    fn ids_cycle_over_the_whole_space_and_skip_those_in_use_or_freed_recently() {
        let s = ServerShared::new(
            quick("t"),
            Arc::new(|_: LockOwner| Ok(0)),
            None,
            LockOwner::AGENT.0 - 1,
        );
        lock(&s.ids).used.insert(1);
        assert_eq!(s.allocate(), Some(LockOwner::AGENT.0 - 1));
        assert_eq!(s.allocate(), Some(2), "wrapped past the agent's id and 1");
        s.free(2);
        for id in 3..LockOwner::AGENT.0 - 1 {
            assert_eq!(s.allocate(), Some(id));
        }
        assert_eq!(
            s.allocate(),
            None,
            "every lease id in use or freed within the hour"
        );
        // An hour later (simulated), the freed id comes round again.
        let long_ago = Instant::now()
            .checked_sub(Duration::from_secs(3601))
            .unwrap_or_else(Instant::now);
        lock(&s.ids).freed.insert(2, long_ago);
        if long_ago.elapsed() >= Duration::from_secs(3600) {
            assert_eq!(s.allocate(), Some(2));
        }
    }
}
