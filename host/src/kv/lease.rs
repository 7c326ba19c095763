//! Leases: how a memory node learns that a compute node died, so the chain
//! locks it held can be released.
//!
//! A compute node in another process opens one TCP connection to its
//! memory node's lease port, presents the shared token and gets a
//! [`LockOwner`] id; every chain lock it takes carries that id
//! (`KvClientConfig::lock_owner`). It then keeps the connection open and
//! silent for its whole life. The kernel closes it when the process ends —
//! `SIGKILL` included — and the memory node, blocked in a read on it, sees
//! the end at once; TCP keepalive (a few seconds) covers a machine that
//! vanished without a word. The memory node then releases the dead node's
//! locks ([`crate::kv::MemoryNode::lock_releaser`]) twice: after
//! [`LeaseConfig::grace`], and again after [`LeaseConfig::linger`], because
//! the dead node's last operations may still be in flight on the fabric (a
//! lock `CAS` landing after the first pass). Its id is reused only after
//! the second pass.
//!
//! What this does not cover: a compute node that is alive but cut off from
//! the lease port while still reaching the pool would have its locks
//! released under it. Leases assume the control network fails with the
//! fabric (they share the hosts), as the bootstrap does.
//!
//! Wire format (integers little-endian), every read bounded in time and
//! length:
//!
//! ```text
//! request:  "RLXLEAS1" | token_len u16 | token
//! granted:  0u8 | owner u16
//! refused:  1u8 | msg_len u16 | msg (UTF-8)
//! ```

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rolex_core::entry::LockOwner;

const MAGIC: &[u8; 8] = b"RLXLEAS1";
/// Longest token accepted.
const MAX_TOKEN: usize = 1024;
/// Longest refusal message read.
const MAX_MSG: usize = 4096;

/// Why a lease could not be served or acquired.
#[derive(Debug)]
#[non_exhaustive]
pub enum LeaseError {
    /// A socket call failed.
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// The memory node refused the lease, saying why.
    Refused(String),
    /// The peer does not speak the lease protocol.
    Protocol(&'static str),
}

impl fmt::Display for LeaseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseError::Io { what, source } => write!(f, "lease: {what}: {source}"),
            LeaseError::Refused(why) => write!(f, "lease refused by the memory node: {why}"),
            LeaseError::Protocol(why) => write!(f, "lease: not a rolex lease peer: {why}"),
        }
    }
}

impl std::error::Error for LeaseError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LeaseError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> LeaseError {
    let what = what.into();
    move |source| LeaseError::Io { what, source }
}

/// Bytes of a request before its token: magic and token length.
const REQUEST_HEAD: usize = 10;
/// Bytes of a reply before a refusal's message: status and owner/length.
const REPLY_HEAD: usize = 3;

/// The token length a request header announces, if it is a lease request
/// with an acceptable token length.
fn request_token_len(head: &[u8; REQUEST_HEAD]) -> Result<usize, &'static str> {
    if &head[..8] != MAGIC {
        return Err("not a lease request");
    }
    let len = u16::from_le_bytes([head[8], head[9]]) as usize;
    if len > MAX_TOKEN {
        return Err("token too long");
    }
    Ok(len)
}

/// What a reply header says.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// The lease is granted with this id.
    Granted(LockOwner),
    /// Refused; a message of `len` bytes follows.
    Refused {
        /// Message bytes to read (bounded).
        len: usize,
    },
}

fn reply(head: &[u8; REPLY_HEAD]) -> Result<Reply, LeaseError> {
    let word = u16::from_le_bytes([head[1], head[2]]);
    match head[0] {
        0 if LockOwner(word).is_leased() => Ok(Reply::Granted(LockOwner(word))),
        0 => Err(LeaseError::Protocol("granted an id that is not a lease id")),
        1 => Ok(Reply::Refused {
            len: usize::from(word).min(MAX_MSG),
        }),
        _ => Err(LeaseError::Protocol("unknown reply status")),
    }
}

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
    let msg = &why.as_bytes()[..why.len().min(MAX_MSG)];
    let mut out = vec![1u8];
    out.extend_from_slice(&(msg.len() as u16).to_le_bytes());
    out.extend_from_slice(msg);
    let _ = stream.write_all(&out);
}

fn serve_one(s: &ServerShared, mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(s.cfg.handshake_timeout));
    let _ = stream.set_write_timeout(Some(s.cfg.handshake_timeout));
    let mut head = [0u8; REQUEST_HEAD];
    if stream.read_exact(&mut head).is_err() {
        refuse(&mut stream, "not a lease request");
        return;
    }
    let len = match request_token_len(&head) {
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
    let mut ok = vec![0u8];
    ok.extend_from_slice(&id.to_le_bytes());
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

/// The compute node's side: holds its lease (and so its [`LockOwner`] id)
/// until dropped or the process ends.
#[derive(Debug)]
pub struct LeaseClient {
    _stream: TcpStream,
    owner: LockOwner,
}

impl LeaseClient {
    /// Asks the lease server at `server` (`ADDR:PORT`) for a lease; every
    /// step is bounded by `timeout`.
    pub fn acquire(server: &str, token: &str, timeout: Duration) -> Result<Self, LeaseError> {
        if token.len() > MAX_TOKEN {
            return Err(LeaseError::Refused(format!(
                "token longer than {MAX_TOKEN} bytes"
            )));
        }
        let addrs: Vec<SocketAddr> = server
            .to_socket_addrs()
            .map_err(io_err(format!("resolving {server}")))?
            .collect();
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some(mut stream) = stream else {
            return Err(LeaseError::Io {
                what: format!("connecting to the lease port {server}"),
                source: last.unwrap_or_else(|| io::Error::other("no address")),
            });
        };
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|_| stream.set_write_timeout(Some(timeout)))
            .map_err(io_err("setting socket timeouts"))?;
        let mut req = MAGIC.to_vec();
        req.extend_from_slice(&(token.len() as u16).to_le_bytes());
        req.extend_from_slice(token.as_bytes());
        stream
            .write_all(&req)
            .map_err(io_err(format!("sending the lease request to {server}")))?;
        let what = format!("reading the lease reply from {server}");
        let mut status = [0u8; REPLY_HEAD];
        stream
            .read_exact(&mut status)
            .map_err(io_err(what.clone()))?;
        match reply(&status)? {
            Reply::Granted(owner) => {
                let _ = stream.set_read_timeout(None);
                Ok(LeaseClient {
                    _stream: stream,
                    owner,
                })
            }
            Reply::Refused { len } => {
                let mut msg = vec![0u8; len];
                stream.read_exact(&mut msg).map_err(io_err(what))?;
                Err(LeaseError::Refused(
                    String::from_utf8_lossy(&msg).into_owned(),
                ))
            }
        }
    }

    /// The id this lease grants: the owner of this node's chain locks.
    pub fn owner(&self) -> LockOwner {
        self.owner
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn a_dead_address_fails_within_the_bound() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let e = LeaseClient::acquire(&addr, "t", Duration::from_secs(2)).unwrap_err();
        assert!(e.to_string().contains("connecting"), "{e}");
        // A server that accepts and never answers: bounded by the timeout.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let e = LeaseClient::acquire(&addr, "t", Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("reading the lease reply"), "{e}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any bytes from a peer decode to an answer, never a panic, and
        /// only well-formed headers are accepted.
        #[test]
        fn headers_from_peers_decode_or_are_refused(
            req in proptest::array::uniform10(proptest::num::u8::ANY),
            rep in proptest::array::uniform3(proptest::num::u8::ANY),
            magic: bool,
        ) {
            let mut req = req;
            if magic {
                req[..8].copy_from_slice(MAGIC);
            }
            let announced = u16::from_le_bytes([req[8], req[9]]) as usize;
            match request_token_len(&req) {
                Ok(len) => {
                    proptest::prop_assert_eq!(&req[..8], MAGIC);
                    proptest::prop_assert_eq!(len, announced);
                    proptest::prop_assert!(len <= MAX_TOKEN);
                }
                Err(_) => proptest::prop_assert!(&req[..8] != MAGIC || announced > MAX_TOKEN),
            }
            let word = LockOwner(u16::from_le_bytes([rep[1], rep[2]]));
            match reply(&rep) {
                Ok(Reply::Granted(o)) => {
                    proptest::prop_assert!(rep[0] == 0 && o == word && o.is_leased())
                }
                Ok(Reply::Refused { len }) => {
                    proptest::prop_assert!(rep[0] == 1 && len <= MAX_MSG)
                }
                Err(_) => proptest::prop_assert!(rep[0] > 1 || !word.is_leased()),
            }
        }
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
