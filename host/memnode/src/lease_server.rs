//! The memory node's side of leases (the protocol and the compute node's
//! side are `rolex_kv::lease`): one parked thread per connected compute
//! node, blocked in a read that returns only when the lease ends. Then the
//! dead node's locks are released twice, after [`LeaseConfig::grace`] and
//! again after [`LeaseConfig::linger`] (its last operations may still be in
//! flight on the fabric); its id is reused only after the second pass.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rolex_core::entry::LockOwner;
use rolex_kv::lease::wire::{self, REQUEST_HEAD};
use rolex_kv::lease::{io_err, LeaseError};

/// Options of a [`LeaseServer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The token compute nodes must present (the bootstrap's).
    pub token: String,
    /// Wait between a lease's end and the first release of its locks.
    pub grace: Duration,
    /// Wait before the second release, after which the id is free again.
    pub linger: Duration,
    /// Bound on a client's request.
    pub handshake_timeout: Duration,
}

impl LeaseConfig {
    /// Defaults: 100 ms grace, 2 s linger, 5 s handshake bound.
    pub fn new(token: &str) -> Self {
        LeaseConfig {
            token: token.to_string(),
            grace: Duration::from_millis(100),
            linger: Duration::from_secs(2),
            handshake_timeout: Duration::from_secs(5),
        }
    }
}

/// Called with the id of each lease that ended (twice, see the module
/// docs); returns how many locks it released, or why it could not.
pub type OnExpire = dyn Fn(LockOwner) -> Result<u64, String> + Send + Sync;

struct ServerShared {
    cfg: LeaseConfig,
    stop: AtomicBool,
    /// Ids held or still being released.
    used: Mutex<BTreeSet<u16>>,
    next: Mutex<u16>,
    /// Open lease connections (to end them at shutdown).
    conns: Mutex<HashMap<u16, TcpStream>>,
    on_expire: Arc<OnExpire>,
    released: AtomicU64,
    expired: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ServerShared {
    /// The next free leased id, cycling so a recent id is not reused soon.
    fn allocate(&self) -> Option<u16> {
        let mut used = lock(&self.used);
        let mut next = lock(&self.next);
        for _ in 0..u16::MAX {
            let id = *next;
            *next = if id >= LockOwner::AGENT.0 - 1 {
                1
            } else {
                id + 1
            };
            if LockOwner(id).is_leased() && used.insert(id) {
                return Some(id);
            }
        }
        None
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
        let listener =
            TcpListener::bind(listen).map_err(io_err(format!("listening on {listen}")))?;
        let addr = listener
            .local_addr()
            .map_err(io_err("reading the listening address"))?;
        let shared = Arc::new(ServerShared {
            cfg,
            stop: AtomicBool::new(false),
            used: Mutex::new(BTreeSet::new()),
            next: Mutex::new(1),
            conns: Mutex::new(HashMap::new()),
            on_expire,
            released: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        });
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
        lock(&self.shared.used).len()
    }

    /// Whether `owner` is an id this server has granted and not yet freed
    /// (its lease is held, or it ended and its locks are being released).
    pub fn holds(&self, owner: LockOwner) -> bool {
        lock(&self.shared.used).contains(&owner.0)
    }

    /// Leases that ended so far.
    pub fn expired(&self) -> u64 {
        self.shared.expired.load(Ordering::Relaxed)
    }

    /// Locks released so far on behalf of ended leases.
    pub fn released(&self) -> u64 {
        self.shared.released.load(Ordering::Relaxed)
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
        let stream = match conn {
            Ok(s) => s,
            Err(_) => {
                // Out of descriptors or an aborted connection: do not spin.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let s2 = s.clone();
        // One parked thread per lease: compute nodes are few.
        let spawned = std::thread::Builder::new()
            .name("rolex-lease-conn".into())
            .spawn(move || serve_one(&s2, stream));
        if let Err(e) = spawned {
            eprintln!("lease: cannot start a connection thread: {e}");
        }
    }
}

fn refuse(stream: &mut TcpStream, why: &str) {
    let _ = stream.write_all(&wire::refused(why));
}

fn serve_one(s: &ServerShared, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(s.cfg.handshake_timeout));
    let _ = stream.set_write_timeout(Some(s.cfg.handshake_timeout));
    let mut head = [0u8; REQUEST_HEAD];
    if stream.read_exact(&mut head).is_err() {
        refuse(&mut stream, "not a lease request");
        return;
    }
    let len = match wire::request_token_len(&head) {
        Ok(len) => len,
        Err(why) => {
            refuse(&mut stream, why);
            return;
        }
    };
    let mut token = vec![0u8; len];
    if stream.read_exact(&mut token).is_err() {
        return;
    }
    if token != s.cfg.token.as_bytes() {
        refuse(&mut stream, "wrong token");
        return;
    }
    let Some(id) = s.allocate() else {
        refuse(&mut stream, "no lease id is free (65534 compute nodes)");
        return;
    };
    let ok = wire::granted(id);
    let registered = stream
        .try_clone()
        .map(|c| lock(&s.conns).insert(id, c))
        .is_ok();
    if !registered || stream.write_all(&ok).is_err() {
        lock(&s.conns).remove(&id);
        lock(&s.used).remove(&id);
        return;
    }
    keepalive(&stream);
    let _ = stream.set_read_timeout(None);
    // The client never sends again: a read returns only at the lease's end.
    let mut sink = [0u8; 64];
    loop {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => continue,
        }
    }
    lock(&s.conns).remove(&id);
    if s.stop.load(Ordering::SeqCst) {
        return;
    }
    s.expired.fetch_add(1, Ordering::Relaxed);
    let owner = LockOwner(id);
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
    lock(&s.used).remove(&id);
}

/// TCP keepalive after 5 s idle, 3 probes 1 s apart: a peer machine that
/// vanished ends its lease within about 8 s.
fn keepalive(stream: &TcpStream) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    for (level, name, value) in [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 5),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
    ] {
        let v: libc::c_int = value;
        // SAFETY: `fd` is an open socket owned by `stream` for this call;
        // the option value is a c_int that lives across the call and its
        // size is passed. A failure only leaves the default (no keepalive).
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
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
            ..LeaseConfig::new(token)
        }
    }

    #[test]
    fn a_dropped_lease_is_reported_twice_and_its_id_freed() {
        let (tx, rx) = mpsc::channel();
        let tx = Mutex::new(tx);
        let srv = LeaseServer::start(
            "127.0.0.1:0",
            quick("t"),
            Arc::new(move |o: LockOwner| {
                let _ = lock(&tx).send(o);
                Ok(1)
            }),
        )
        .unwrap();
        let a = LeaseClient::acquire(&srv.local_addr().to_string(), "t", Duration::from_secs(5))
            .unwrap();
        let b = LeaseClient::acquire(&srv.local_addr().to_string(), "t", Duration::from_secs(5))
            .unwrap();
        assert!(a.owner().is_leased() && b.owner().is_leased());
        assert_ne!(a.owner(), b.owner());
        assert!(srv.holds(a.owner()) && srv.holds(b.owner()));
        assert!(!srv.holds(LockOwner::AGENT));
        let dead = a.owner();
        drop(a);
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let second = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((first, second), (dead, dead));
        // The survivor's lease is untouched.
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        while srv.active() != 1 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(srv.expired(), 1);
        assert_eq!(srv.released(), 2);
        assert!(!srv.holds(dead));
        drop(b);
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

    #[test]
    fn ids_cycle_and_skip_those_in_use() {
        let s = ServerShared {
            cfg: quick("t"),
            stop: AtomicBool::new(false),
            used: Mutex::new(BTreeSet::new()),
            next: Mutex::new(LockOwner::AGENT.0 - 1),
            conns: Mutex::new(HashMap::new()),
            on_expire: Arc::new(|_: LockOwner| Ok(0)),
            released: AtomicU64::new(0),
            expired: AtomicU64::new(0),
        };
        lock(&s.used).insert(1);
        assert_eq!(s.allocate(), Some(LockOwner::AGENT.0 - 1));
        assert_eq!(s.allocate(), Some(2), "wrapped past the agent's id and 1");
        for id in 3..LockOwner::AGENT.0 - 1 {
            assert_eq!(s.allocate(), Some(id));
        }
        assert_eq!(s.allocate(), None, "every lease id in use");
    }
}
