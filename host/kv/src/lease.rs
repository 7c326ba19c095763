//! Leases, the compute node's side and the wire format: how a memory node
//! learns that a compute node died or stalled, so the chain locks it held
//! can be released — and how the compute node stops writing before that.
//!
//! A compute node in another process opens one TCP connection to its
//! memory node's lease port, presents the shared token and gets a
//! [`LockOwner`] id and the lease's duration `d`; every chain lock it
//! takes carries that id (`KvClientConfig::leased`). A parked thread of
//! the client renews the lease every `d / 4`: it sends a sequence number
//! and the server echoes it.
//!
//! **Timing** (clocks of both hosts assumed to run at the same rate, not
//! to agree):
//! - The server ends a lease `d` after the last renewal it *received*
//!   (or at once when the connection closes: the process died, or dropped
//!   its lease after fencing itself), then releases the holder's locks
//!   after a grace period, and again after a linger.
//! - The client holds its lease valid until `S + d − m`, where `S` is the
//!   time it *sent* the last renewal the server acknowledged and `m` the
//!   margin ([`LeaseClient::margin`], `d / 4`). `S` is taken before the
//!   send, so `S ≤` the server's receipt, and the client stops strictly
//!   before (by at least `m`) the server can release anything.
//! - The session checks validity right before it posts anything that
//!   writes (lock `CAS`, data WRITE, unlock, FAA) and refuses with
//!   `KvError::LeaseExpired` (nothing posted). Once the client has seen
//!   its lease lapse it never counts it valid again (a stalled renewer
//!   that wakes up does not revive it): every later write of the process
//!   fails until it acquires a new lease and connects a new client.
//! - The margin covers the time between the check and the post reaching
//!   the wire. It does not cover a process stopped *between* the check
//!   and the provider putting the request on the wire (or a request the
//!   provider queued and sends only when the process runs again). For
//!   those, a memory node may grant each lease a key to the pool of its
//!   own ([`LeaseFence::pool`]; the client connects with it) and close it
//!   the moment the lease ends, so that they are refused there. See
//!   `rolex-memnode`'s `lease_server` for what is fenced and what is not.
//!
//! Lease ids are a generation: the server hands them out round-robin over
//! the whole 16-bit space and never reuses one before the space wraps
//! *and* an hour has passed since its release, so a fenced holder's late
//! unlock `CAS` (expecting `locked_by(old id)`) fails against any newer
//! holder's word.
//!
//! Wire format (integers little-endian), every read bounded in time and
//! length; [`wire`] encodes and decodes it for both sides (each message
//! read by one function generic over [`Read`], run on the socket and, by
//! [`wire::decode_request`] and [`wire::decode_reply`], on bytes: the fuzz
//! targets `lease_request` and `lease_reply`):
//!
//! ```text
//! request:  "RLXLEAS2" | token_len u16 | token
//! granted:  0u8 | owner u16 | duration_ms u32 | desc_len u16 | desc
//! refused:  1u8 | msg_len u16 | msg (UTF-8)
//! then, client → server: renewal seq u64; server → client: the same seq
//! ```

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rolex_core::entry::LockOwner;
use rolex_core::wire::MrDesc;

use wire::{Grant, MAX_TOKEN};

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

/// Wraps a socket error with what was being done.
pub fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> LeaseError {
    let what = what.into();
    move |source| LeaseError::Io { what, source }
}

/// The lease protocol's bytes, shared by the client here and the memory
/// node's server. Decoders of peer bytes never panic.
pub mod wire {
    use std::io::{self, Read};
    use std::time::Duration;

    use rolex_core::entry::LockOwner;
    use rolex_core::wire::{MrDesc, Wire};

    use super::LeaseError;

    /// The request's first bytes.
    pub const MAGIC: &[u8; 8] = b"RLXLEAS2";
    /// Longest token accepted.
    pub const MAX_TOKEN: usize = 1024;
    /// Longest refusal message read.
    pub const MAX_MSG: usize = 4096;
    /// Bytes of a request before its token: magic and token length.
    pub const REQUEST_HEAD: usize = 10;
    /// Bytes of a reply before a refusal's message: status and owner/length.
    pub const REPLY_HEAD: usize = 3;
    /// Bytes after a grant's head: the duration in milliseconds and the
    /// length of the pool descriptor that follows (0: none).
    pub const GRANT_TAIL: usize = 6;
    /// Longest pool descriptor a grant carries.
    pub const MAX_DESC: usize = 1024;
    /// Bytes of a renewal and of its acknowledgement: a sequence number.
    pub const RENEWAL: usize = 8;
    /// Shortest and longest lease durations a client accepts.
    pub const DURATION_MS: core::ops::RangeInclusive<u32> = 40..=3_600_000;

    /// The token length a request header announces, if it is a lease
    /// request with an acceptable token length.
    pub fn request_token_len(head: &[u8; REQUEST_HEAD]) -> Result<usize, &'static str> {
        if &head[..8] != MAGIC {
            return Err("not a lease request");
        }
        let len = u16::from_le_bytes([head[8], head[9]]) as usize;
        if len > MAX_TOKEN {
            return Err("token too long");
        }
        Ok(len)
    }

    /// A request carrying `token` (at most [`MAX_TOKEN`] bytes).
    pub fn request(token: &[u8]) -> Vec<u8> {
        let mut req = MAGIC.to_vec();
        req.extend_from_slice(&(token.len() as u16).to_le_bytes());
        req.extend_from_slice(token);
        req
    }

    /// The reply granting lease `id` for `duration_ms` between renewals,
    /// with the encoded descriptor of a key to the pool for this lease
    /// alone (empty: none; at most [`MAX_DESC`] bytes).
    pub fn granted(id: u16, duration_ms: u32, desc: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&duration_ms.to_le_bytes());
        out.extend_from_slice(&(desc.len() as u16).to_le_bytes());
        out.extend_from_slice(desc);
        out
    }

    /// The lease duration and descriptor length a grant's tail carries,
    /// if acceptable.
    pub fn grant_tail(tail: &[u8; GRANT_TAIL]) -> Result<(Duration, usize), LeaseError> {
        let ms = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        let desc = usize::from(u16::from_le_bytes([tail[4], tail[5]]));
        if !DURATION_MS.contains(&ms) {
            return Err(LeaseError::Protocol(
                "granted a lease duration outside 40 ms ..= 1 hour",
            ));
        }
        if desc > MAX_DESC {
            return Err(LeaseError::Protocol("granted a pool descriptor too long"));
        }
        Ok((Duration::from_millis(u64::from(ms)), desc))
    }

    /// The reply refusing a lease, saying why (cut to [`MAX_MSG`] bytes).
    pub fn refused(why: &str) -> Vec<u8> {
        let msg = &why.as_bytes()[..why.len().min(MAX_MSG)];
        let mut out = vec![1u8];
        out.extend_from_slice(&(msg.len() as u16).to_le_bytes());
        out.extend_from_slice(msg);
        out
    }

    /// What a reply header says.
    #[derive(Debug, PartialEq, Eq)]
    pub enum Reply {
        /// The lease is granted with this id; [`GRANT_TAIL`] bytes follow.
        Granted(LockOwner),
        /// Refused; a message of `len` bytes follows.
        Refused {
            /// Message bytes to read (bounded).
            len: usize,
        },
    }

    /// Decodes a reply header.
    pub fn reply(head: &[u8; REPLY_HEAD]) -> Result<Reply, LeaseError> {
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

    /// Reads a request from `r`: the token it presents, or why the
    /// server refuses it (the refusal's message).
    pub fn read_request(r: &mut impl Read) -> Result<Vec<u8>, &'static str> {
        let mut head = [0u8; REQUEST_HEAD];
        r.read_exact(&mut head).map_err(|_| "not a lease request")?;
        let mut token = vec![0u8; request_token_len(&head)?];
        r.read_exact(&mut token).map_err(|_| "request cut short")?;
        Ok(token)
    }

    /// Decodes a whole request as the server reads it off its socket.
    pub fn decode_request(mut bytes: &[u8]) -> Result<Vec<u8>, &'static str> {
        let token = read_request(&mut bytes)?;
        if !bytes.is_empty() {
            return Err("bytes after the request");
        }
        Ok(token)
    }

    /// A lease as the client reads its grant.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Grant {
        /// The lease's id, which the holder's chain locks carry.
        pub owner: LockOwner,
        /// The server ends the lease this long after the last renewal.
        pub duration: Duration,
        /// A key to the pool for this lease alone, if the memory node
        /// grants one.
        pub pool: Option<MrDesc>,
    }

    /// Reads the server's reply from `r`: the grant, or its refusal
    /// ([`LeaseError::Refused`]); a failing read is a [`LeaseError::Io`]
    /// saying it happened while `what`.
    pub fn read_reply(r: &mut impl Read, what: &str) -> Result<Grant, LeaseError> {
        let mut read = |buf: &mut [u8]| {
            r.read_exact(buf).map_err(|source| LeaseError::Io {
                what: what.to_string(),
                source,
            })
        };
        let mut head = [0u8; REPLY_HEAD];
        read(&mut head)?;
        match reply(&head)? {
            Reply::Granted(owner) => {
                let mut tail = [0u8; GRANT_TAIL];
                read(&mut tail)?;
                let (duration, desc_len) = grant_tail(&tail)?;
                let pool = if desc_len == 0 {
                    None
                } else {
                    let mut desc = vec![0u8; desc_len];
                    read(&mut desc)?;
                    Some(MrDesc::decode(&desc).map_err(|_| {
                        LeaseError::Protocol("granted a pool descriptor that does not decode")
                    })?)
                };
                Ok(Grant {
                    owner,
                    duration,
                    pool,
                })
            }
            Reply::Refused { len } => {
                let mut msg = vec![0u8; len];
                read(&mut msg)?;
                Err(LeaseError::Refused(
                    String::from_utf8_lossy(&msg).into_owned(),
                ))
            }
        }
    }

    /// Decodes a whole reply as the client reads it off its socket.
    pub fn decode_reply(mut bytes: &[u8]) -> Result<Grant, LeaseError> {
        let grant = read_reply(&mut bytes, "decoding a lease reply").map_err(|e| match e {
            LeaseError::Io { source, .. } if source.kind() == io::ErrorKind::UnexpectedEof => {
                LeaseError::Protocol("reply cut short")
            }
            e => e,
        })?;
        if !bytes.is_empty() {
            return Err(LeaseError::Protocol("bytes after the reply"));
        }
        Ok(grant)
    }
}

/// Nanoseconds on this process's monotonic clock (from its first call).
fn now_ns() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    ORIGIN.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// What a client's sessions check before they post a write: whether the
/// lease their locks name is still valid here (see the module docs for the
/// timing). Cheap to clone; every clone sees the same lease.
#[derive(Clone)]
pub struct LeaseFence {
    state: Arc<FenceState>,
}

struct FenceState {
    owner: LockOwner,
    /// A key to the pool for this lease alone, which the memory node
    /// closes when the lease ends (see `rolex-memnode`'s `lease_keys`).
    pool: Option<MrDesc>,
    /// Valid while [`now_ns`] is below this (`S + d − m`).
    valid_until_ns: AtomicU64,
    /// Set once the lease was seen lapsed, lost or dropped: never valid
    /// again.
    lapsed: AtomicBool,
}

impl LeaseFence {
    /// Whether writes may be posted now. Sticky: once `false`, `false`
    /// forever.
    pub fn valid(&self) -> bool {
        let s = &self.state;
        if s.lapsed.load(Ordering::Acquire) {
            return false;
        }
        if now_ns() < s.valid_until_ns.load(Ordering::Acquire) {
            return true;
        }
        s.lapsed.store(true, Ordering::Release);
        false
    }

    /// The lease id the fenced locks carry.
    pub fn owner(&self) -> LockOwner {
        self.state.owner
    }

    /// The descriptor of the pool key this lease was granted, if the
    /// memory node grants one per lease: a client that uses it has every
    /// operation it posted refused at the memory node once the lease
    /// ended there, however late it arrives.
    pub fn pool(&self) -> Option<&MrDesc> {
        self.state.pool.as_ref()
    }

    /// How long the lease stays valid from now if no renewal is
    /// acknowledged meanwhile (zero once it lapsed).
    pub fn remaining(&self) -> Duration {
        if !self.valid() {
            return Duration::ZERO;
        }
        Duration::from_nanos(
            self.state
                .valid_until_ns
                .load(Ordering::Acquire)
                .saturating_sub(now_ns()),
        )
    }

    fn lapse(&self) {
        self.state.lapsed.store(true, Ordering::Release);
    }

    /// Extends validity to `sent + d − m` for a renewal sent at `sent`
    /// that the server acknowledged — unless the lease lapsed first.
    fn renewed(&self, until_ns: u64) -> bool {
        if !self.valid() {
            return false;
        }
        self.state
            .valid_until_ns
            .fetch_max(until_ns, Ordering::AcqRel);
        true
    }
}

impl fmt::Debug for LeaseFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseFence")
            .field("owner", &self.state.owner)
            .field("valid", &self.valid())
            .finish()
    }
}

/// Two fences are equal when they fence the same lease.
impl PartialEq for LeaseFence {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

/// The compute node's side: holds its lease (and so its [`LockOwner`] id)
/// and renews it from a parked thread until dropped or the process ends.
pub struct LeaseClient {
    fence: LeaseFence,
    duration: Duration,
    stream: TcpStream,
    stop: Arc<(Mutex<bool>, Condvar)>,
    renewer: Option<JoinHandle<()>>,
}

impl fmt::Debug for LeaseClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseClient")
            .field("owner", &self.fence.owner())
            .field("duration", &self.duration)
            .field("valid", &self.fence.valid())
            .finish()
    }
}

impl LeaseClient {
    /// Asks the lease server at `server` (`ADDR:PORT`) for a lease; every
    /// step is bounded by `timeout`. The lease is valid from the moment
    /// the request was sent, for the duration the server grants minus the
    /// margin, and renewed from then on.
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
            .and_then(|_| stream.set_nodelay(true))
            .map_err(io_err("setting socket options"))?;
        let req = wire::request(token.as_bytes());
        let sent = now_ns();
        stream
            .write_all(&req)
            .map_err(io_err(format!("sending the lease request to {server}")))?;
        let what = format!("reading the lease reply from {server}");
        let grant = wire::read_reply(&mut stream, &what)?;
        Self::start(stream, grant, sent)
    }

    fn start(stream: TcpStream, g: Grant, sent: u64) -> Result<Self, LeaseError> {
        let Grant {
            owner,
            duration,
            pool,
        } = g;
        let margin = margin_of(duration);
        let fence = LeaseFence {
            state: Arc::new(FenceState {
                owner,
                pool,
                valid_until_ns: AtomicU64::new(sent + (duration - margin).as_nanos() as u64),
                lapsed: AtomicBool::new(false),
            }),
        };
        // An acknowledgement later than `d` cannot extend anything the
        // fence still holds; until then a slow one (a starved thread at
        // either end) costs nothing: validity runs out by time alone.
        stream
            .set_read_timeout(Some(duration))
            .map_err(io_err("setting the renewal timeout"))?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let renewer = {
            let stream = stream
                .try_clone()
                .map_err(io_err("cloning the lease socket"))?;
            let (fence, stop) = (fence.clone(), stop.clone());
            std::thread::Builder::new()
                .name("rolex-lease-renew".into())
                .spawn(move || renew(stream, &fence, duration, &stop))
                .map_err(io_err("starting the lease renewal thread"))?
        };
        Ok(LeaseClient {
            fence,
            duration,
            stream,
            stop,
            renewer: Some(renewer),
        })
    }

    /// The id this lease grants: the owner of this node's chain locks.
    pub fn owner(&self) -> LockOwner {
        self.fence.owner()
    }

    /// What sessions check before each write (see the module docs).
    pub fn fence(&self) -> LeaseFence {
        self.fence.clone()
    }

    /// The duration the server granted: it ends the lease this long after
    /// the last renewal it received.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// How much earlier than the server this client counts its lease over.
    pub fn margin(&self) -> Duration {
        margin_of(self.duration)
    }

    /// Whether the lease is valid now (sticky once not).
    pub fn valid(&self) -> bool {
        self.fence.valid()
    }
}

/// The client's margin for a lease of `duration`: a quarter of it.
fn margin_of(duration: Duration) -> Duration {
    duration / 4
}

impl Drop for LeaseClient {
    fn drop(&mut self) {
        // Fenced before the server can learn of the end (the close).
        self.fence.lapse();
        {
            let (m, cv) = &*self.stop;
            *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cv.notify_all();
        }
        let _ = self.stream.shutdown(Shutdown::Both);
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
    }
}

/// The renewal thread: every `d / 4`, sends the next sequence number and
/// waits (bounded by `d`) for its echo; each echo extends the fence
/// to `sent + d − m`. Any failure lapses the fence and ends the thread:
/// the lease is lost (the server ends it at the latest `d` after the last
/// renewal it received).
fn renew(mut stream: TcpStream, fence: &LeaseFence, d: Duration, stop: &(Mutex<bool>, Condvar)) {
    let keep = (d - margin_of(d)).as_nanos() as u64;
    let mut seq = 0u64;
    loop {
        {
            let (m, cv) = stop;
            let g = m.lock().unwrap_or_else(|e| e.into_inner());
            let (g, _) = cv
                .wait_timeout_while(g, d / 4, |stopped| !*stopped)
                .unwrap_or_else(|e| e.into_inner());
            if *g {
                return;
            }
        }
        seq += 1;
        let sent = now_ns();
        let mut ack = [0u8; wire::RENEWAL];
        let ok = stream.write_all(&seq.to_le_bytes()).is_ok()
            && stream.read_exact(&mut ack).is_ok()
            && u64::from_le_bytes(ack) == seq;
        if !ok || !fence.renewed(sent + keep) {
            fence.lapse();
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rolex_core::wire::Wire;
    use std::net::TcpListener;
    use wire::{reply, Reply, GRANT_TAIL, MAGIC, REPLY_HEAD};

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Any bytes from a peer decode to an answer, never a panic, and
        /// only well-formed headers are accepted.
        #[test]
        fn headers_from_peers_decode_or_are_refused(
            req in proptest::array::uniform10(proptest::num::u8::ANY),
            rep in proptest::array::uniform3(proptest::num::u8::ANY),
            tail in proptest::array::uniform6(proptest::num::u8::ANY),
            magic: bool,
        ) {
            let ms = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
            let len = usize::from(u16::from_le_bytes([tail[4], tail[5]]));
            match wire::grant_tail(&tail) {
                Ok((d, l)) => proptest::prop_assert!(
                    d.as_millis() == u128::from(ms) && l == len && len <= wire::MAX_DESC
                ),
                Err(_) => proptest::prop_assert!(
                    !wire::DURATION_MS.contains(&ms) || len > wire::MAX_DESC
                ),
            }
            let mut req = req;
            if magic {
                req[..8].copy_from_slice(MAGIC);
            }
            let announced = u16::from_le_bytes([req[8], req[9]]) as usize;
            match wire::request_token_len(&req) {
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
                    proptest::prop_assert!(rep[0] == 1 && len <= wire::MAX_MSG)
                }
                Err(_) => proptest::prop_assert!(rep[0] > 1 || !word.is_leased()),
            }
        }
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

    #[test]
    fn whole_messages_decode_to_what_was_sent_or_name_what_is_wrong() {
        assert_eq!(
            wire::decode_request(&wire::request(b"tok")),
            Ok(b"tok".to_vec())
        );
        assert_eq!(
            wire::decode_request(&wire::request(b"tok")[..12]),
            Err("request cut short")
        );
        assert_eq!(wire::decode_request(b"RLXLEAS"), Err("not a lease request"));
        assert_eq!(
            wire::decode_request(&[&wire::request(b"")[..], b"x"].concat()),
            Err("bytes after the request")
        );
        let desc = MrDesc::new(
            0x1000,
            4096,
            rolex_core::wire::Access::all(),
            &[(rolex_core::wire::NetAddr::new(b"n").unwrap(), 7)],
        )
        .unwrap();
        let bytes = wire::granted(7, 2500, &desc.to_vec().unwrap());
        assert_eq!(
            wire::decode_reply(&bytes).unwrap(),
            Grant {
                owner: LockOwner(7),
                duration: Duration::from_millis(2500),
                pool: Some(desc),
            }
        );
        let protocol = |r: Result<Grant, LeaseError>| match r {
            Err(LeaseError::Protocol(why)) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            protocol(wire::decode_reply(&bytes[..bytes.len() - 1])),
            "reply cut short"
        );
        assert_eq!(
            protocol(wire::decode_reply(&[&bytes[..], b"x"].concat())),
            "bytes after the reply"
        );
        match wire::decode_reply(&wire::refused("no")) {
            Err(LeaseError::Refused(why)) => assert_eq!(why, "no"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn encoded_replies_decode_to_what_was_sent() {
        let g = wire::granted(7, 2500, b"");
        assert_eq!(
            reply(&[g[0], g[1], g[2]]).unwrap(),
            Reply::Granted(LockOwner(7))
        );
        let tail = |g: &[u8]| -> [u8; GRANT_TAIL] {
            g[REPLY_HEAD..REPLY_HEAD + GRANT_TAIL].try_into().unwrap()
        };
        assert_eq!(
            wire::grant_tail(&tail(&g)).unwrap(),
            (Duration::from_millis(2500), 0)
        );
        let with = wire::granted(7, 2500, b"desc");
        assert_eq!(wire::grant_tail(&tail(&with)).unwrap().1, 4);
        assert_eq!(&with[REPLY_HEAD + GRANT_TAIL..], b"desc");
        assert!(wire::grant_tail(&[0, 0, 0, 0, 0, 0]).is_err());
        assert!(wire::grant_tail(&[0xff, 0xff, 0xff, 0xff, 0, 0]).is_err());
        assert!(wire::grant_tail(&[0xc4, 0x09, 0, 0, 0xff, 0xff]).is_err());
        let r = wire::refused("no");
        assert_eq!(r.len(), REPLY_HEAD + 2);
        assert_eq!(
            reply(&[r[0], r[1], r[2]]).unwrap(),
            Reply::Refused { len: 2 }
        );
        let q = wire::request(b"tok");
        let mut head = [0u8; wire::REQUEST_HEAD];
        head.copy_from_slice(&q[..wire::REQUEST_HEAD]);
        assert_eq!(wire::request_token_len(&head), Ok(3));
    }
}
