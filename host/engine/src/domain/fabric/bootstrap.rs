//! Bootstrap: the only traffic that is not RDMA. A server (a memory node,
//! a `te-bench --serve`) listens on a small TCP control port and hands its
//! fabric address, memory descriptors and pool layout version to clients
//! that present the shared token and the layout version they expect.
//!
//! Invariants: every socket operation has a bound (connect, read and
//! write timeouts), so a wrong address, a silent server or a dead one
//! gives an error within [`Bootstrap::timeout`], never a hang; a wrong
//! token or layout version is refused with a message saying which; every
//! length read from the peer is bounded before anything is allocated.
//! The server answers each client on a thread of its own (at most
//! [`MAX_CLIENTS`] at once) and gives a whole exchange one
//! [`Bootstrap::timeout`], not each read: a client that sends nothing, or
//! a byte at a time, neither delays the others nor holds a thread longer.
//!
//! Ends that could never talk are refused here, at once, rather than
//! left to time out on their first operation: over a `*;ofi_rxm`
//! provider, processes whose `FI_OFI_RXM_BUFFER_SIZE` differ never
//! connect (measured on `tcp;ofi_rxm`: every post is refused with
//! `-FI_EAGAIN` until the operation timeout), so each end states its size
//! ([`Bootstrap::rxm_buffer`]) and the server refuses a client whose size
//! is not its own, naming both.
//!
//! Wire format (all integers little-endian):
//!
//! ```text
//! request:  "RLXBOOT2" | token_len u16 | token | layout u32 | rxm_buffer u32 (0: none)
//! reply ok: 0u8 | layout u32 | addr_len u8 | addr | n u16 | n × (len u16 | MrDesc bytes)
//!           | meta_len u32 | meta
//! refused:  1u8 | msg_len u16 | msg (UTF-8)
//! ```
//!
//! `meta` is an opaque description the server attaches to its offer (a
//! memory node names its data set there); [`Bootstrap::fetch`] ignores it,
//! [`Bootstrap::fetch_with_meta`] returns it.
//!
//! Each message is read by one function generic over [`Read`]: the
//! server and the client run it on their socket, and [`decode_request`]
//! and [`decode_offer`] run the same code on bytes (the fuzz targets
//! `bootstrap_request` and `bootstrap_offer`).

use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rolex_core::wire::{MrDesc, NetAddr, Wire};

use crate::{DeadlineReader, Refusals};

const MAGIC: &[u8; 8] = b"RLXBOOT2";
/// The request's magic before the rxm buffer size was sent.
const MAGIC_V1: &[u8; 8] = b"RLXBOOT1";
const MAX_TOKEN: usize = 1024;
const MAX_DESCS: usize = 1024;
const MAX_DESC_LEN: usize = 4096;
const MAX_META: usize = 64 << 10;
/// Clients a server answers at once; one more is refused at once.
pub const MAX_CLIENTS: usize = 64;

/// What a server offers its clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// The server's fabric address (its engine's main address).
    pub addr: NetAddr,
    /// Its registered regions.
    pub descs: Vec<MrDesc>,
    /// The pool layout version it serves.
    pub layout_version: u32,
}

/// Why bootstrapping failed.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BootstrapError {
    /// The address did not resolve or no connection could be made in time.
    Connect {
        /// The address as given.
        addr: String,
        /// The OS's reason.
        reason: String,
    },
    /// The connection failed or timed out mid-exchange.
    Io {
        /// The step.
        step: &'static str,
        /// The OS's reason.
        reason: String,
    },
    /// The server refused the client.
    Refused {
        /// The server's message.
        reason: String,
    },
    /// The peer sent bytes that do not follow the protocol.
    Malformed {
        /// What was wrong.
        what: &'static str,
    },
    /// The server could not listen.
    Listen {
        /// The address as given.
        addr: String,
        /// The OS's reason.
        reason: String,
    },
}

impl fmt::Display for BootstrapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BootstrapError::Connect { addr, reason } => {
                write!(f, "cannot reach the bootstrap server at {addr}: {reason}")
            }
            BootstrapError::Io { step, reason } => {
                write!(f, "bootstrap connection failed while {step}: {reason}")
            }
            BootstrapError::Refused { reason } => {
                write!(f, "the bootstrap server refused this client: {reason}")
            }
            BootstrapError::Malformed { what } => {
                write!(f, "malformed bootstrap message: {what}")
            }
            BootstrapError::Listen { addr, reason } => {
                write!(f, "cannot listen for bootstrap clients on {addr}: {reason}")
            }
        }
    }
}

impl std::error::Error for BootstrapError {}

fn io(step: &'static str) -> impl Fn(std::io::Error) -> BootstrapError {
    move |e| BootstrapError::Io {
        step,
        reason: e.to_string(),
    }
}

/// Client and server settings.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    /// The shared secret clients must present.
    pub token: String,
    /// Bound on connecting and on each read or write.
    pub timeout: Duration,
    /// This end's `FI_OFI_RXM_BUFFER_SIZE` where its provider is a
    /// `*;ofi_rxm` one ([`super::LibfabricConfig::rxm_buffer`]), `None`
    /// otherwise: a server refuses a client whose size differs from its
    /// own (both `Some`).
    pub rxm_buffer: Option<u32>,
}

impl Bootstrap {
    /// Settings with `token`, a 5 s bound and no rxm buffer size.
    pub fn new(token: &str) -> Self {
        Bootstrap {
            token: token.to_string(),
            timeout: Duration::from_secs(5),
            rxm_buffer: None,
        }
    }

    /// These settings with [`Bootstrap::rxm_buffer`] set to `size`.
    pub fn with_rxm_buffer(mut self, size: Option<u32>) -> Self {
        self.rxm_buffer = size;
        self
    }

    /// Fetches the offer of the server at `server` for `layout_version`.
    pub fn fetch(&self, server: &str, layout_version: u32) -> Result<Offer, BootstrapError> {
        self.exchange(server, layout_version, false).map(|(o, _)| o)
    }

    /// Fetches the offer and the server's description attached to it
    /// (empty if it attached none).
    pub fn fetch_with_meta(
        &self,
        server: &str,
        layout_version: u32,
    ) -> Result<(Offer, Vec<u8>), BootstrapError> {
        self.exchange(server, layout_version, true)
    }

    fn exchange(
        &self,
        server: &str,
        layout_version: u32,
        want_meta: bool,
    ) -> Result<(Offer, Vec<u8>), BootstrapError> {
        let conn = |reason: String| BootstrapError::Connect {
            addr: server.to_string(),
            reason,
        };
        let addrs: Vec<SocketAddr> = server
            .to_socket_addrs()
            .map_err(|e| conn(e.to_string()))?
            .collect();
        let mut last = conn("the address resolves to nothing".into());
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, self.timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = conn(e.to_string()),
            }
        }
        let mut s = stream.ok_or(last)?;
        s.set_read_timeout(Some(self.timeout))
            .map_err(io("setting timeouts"))?;
        s.set_write_timeout(Some(self.timeout))
            .map_err(io("setting timeouts"))?;
        let req = Request {
            token: self.token.as_bytes().to_vec(),
            layout_version,
            rxm_buffer: self.rxm_buffer.unwrap_or(0),
        }
        .encode()?;
        s.write_all(&req).map_err(io("sending the request"))?;
        read_offer(&mut s, want_meta)
    }
}

/// A client's request, as the server reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The token the client presents (at most 1024 bytes).
    pub token: Vec<u8>,
    /// The pool layout version the client expects.
    pub layout_version: u32,
    /// The client's rxm buffer size ([`Bootstrap::rxm_buffer`]; 0: none).
    pub rxm_buffer: u32,
}

impl Request {
    /// The request's bytes; errors if the token is longer than 1024 bytes.
    pub fn encode(&self) -> Result<Vec<u8>, BootstrapError> {
        let token = &self.token;
        if token.len() > MAX_TOKEN {
            return Err(BootstrapError::Malformed {
                what: "token longer than 1024 bytes",
            });
        }
        let mut req = Vec::with_capacity(18 + token.len());
        req.extend_from_slice(MAGIC);
        req.extend_from_slice(&(token.len() as u16).to_le_bytes());
        req.extend_from_slice(token);
        req.extend_from_slice(&self.layout_version.to_le_bytes());
        req.extend_from_slice(&self.rxm_buffer.to_le_bytes());
        Ok(req)
    }
}

/// Why the server refuses a client of the first protocol.
const OLDER_PROTOCOL: &str = "the client speaks an older bootstrap protocol (1, this server 2): \
                              run the same rolex version on both ends";

/// Reads a request from `r`. A request the server must refuse is a
/// [`BootstrapError::Malformed`] whose `what` is the refusal's message;
/// anything else is the connection's failure.
fn read_request(r: &mut impl Read) -> Result<Request, BootstrapError> {
    let refuse = |what| Err(BootstrapError::Malformed { what });
    let magic = read_vec(r, 8, "reading the request")?;
    if magic == MAGIC_V1 {
        // Read the rest of its request first (token and layout): closing
        // with unread bytes would reset the connection, and the client
        // would not see why.
        let n = read_u16(r, "reading the request")? as usize;
        if n <= MAX_TOKEN {
            read_vec(r, n + 4, "reading the request")?;
        }
        return refuse(OLDER_PROTOCOL);
    }
    if magic != MAGIC {
        return refuse("not a rolex bootstrap request");
    }
    let n = read_u16(r, "reading the request")? as usize;
    if n > MAX_TOKEN {
        return refuse("token too long");
    }
    Ok(Request {
        token: read_vec(r, n, "reading the request")?,
        layout_version: read_u32(r, "reading the request")?,
        rxm_buffer: read_u32(r, "reading the request")?,
    })
}

/// Reads the server's reply from `r`: its offer, and the description
/// attached if `want_meta` (else the reply is read no further than the
/// descriptors).
fn read_offer(r: &mut impl Read, want_meta: bool) -> Result<(Offer, Vec<u8>), BootstrapError> {
    let status = read_u8(r, "reading the reply")?;
    if status != 0 {
        let n = read_u16(r, "reading the refusal")? as usize;
        let msg = read_vec(r, n, "reading the refusal")?;
        return Err(BootstrapError::Refused {
            reason: String::from_utf8_lossy(&msg).into_owned(),
        });
    }
    let layout = read_u32(r, "reading the offer")?;
    let n = read_u8(r, "reading the offer")? as usize;
    let addr = NetAddr::new(&read_vec(r, n, "reading the offer")?).map_err(|_| {
        BootstrapError::Malformed {
            what: "server address",
        }
    })?;
    let count = read_u16(r, "reading the offer")? as usize;
    if count > MAX_DESCS {
        return Err(BootstrapError::Malformed {
            what: "too many descriptors",
        });
    }
    let mut descs = Vec::with_capacity(count);
    for _ in 0..count {
        let n = read_u16(r, "reading a descriptor")? as usize;
        if n > MAX_DESC_LEN {
            return Err(BootstrapError::Malformed {
                what: "descriptor too long",
            });
        }
        let b = read_vec(r, n, "reading a descriptor")?;
        descs.push(MrDesc::decode(&b).map_err(|_| BootstrapError::Malformed {
            what: "memory descriptor",
        })?);
    }
    let meta = if want_meta {
        let n = read_u32(r, "reading the offer's description")? as usize;
        if n > MAX_META {
            return Err(BootstrapError::Malformed {
                what: "description longer than 64 KiB",
            });
        }
        read_vec(r, n, "reading the offer's description")?
    } else {
        Vec::new()
    };
    Ok((
        Offer {
            addr,
            descs,
            layout_version: layout,
        },
        meta,
    ))
}

/// Decodes a whole request as the server reads it off its socket; a
/// request it would refuse is a [`BootstrapError::Malformed`] naming why.
pub fn decode_request(bytes: &[u8]) -> Result<Request, BootstrapError> {
    decode_whole(bytes, true, |r| read_request(r))
}

/// Decodes a whole reply as [`Bootstrap::fetch_with_meta`] (`want_meta`)
/// or [`Bootstrap::fetch`] reads it off its socket: the offer and its
/// description, or the server's refusal ([`BootstrapError::Refused`]).
/// Without `want_meta` the bytes after the descriptors are not looked at.
pub fn decode_offer(bytes: &[u8], want_meta: bool) -> Result<(Offer, Vec<u8>), BootstrapError> {
    decode_whole(bytes, want_meta, |r| read_offer(r, want_meta))
}

/// Runs `read` on `bytes`: running out of them is a message cut short,
/// and bytes left over (if `whole`) are trailing garbage.
fn decode_whole<T>(
    mut bytes: &[u8],
    whole: bool,
    read: impl FnOnce(&mut &[u8]) -> Result<T, BootstrapError>,
) -> Result<T, BootstrapError> {
    let v = read(&mut bytes).map_err(|e| match e {
        BootstrapError::Io { .. } => BootstrapError::Malformed {
            what: "message cut short",
        },
        e => e,
    })?;
    if whole && !bytes.is_empty() {
        return Err(BootstrapError::Malformed {
            what: "bytes after the message",
        });
    }
    Ok(v)
}

/// Reads `n` bytes; callers bound `n` before calling.
fn read_vec(s: &mut impl Read, n: usize, step: &'static str) -> Result<Vec<u8>, BootstrapError> {
    let mut v = vec![0; n];
    s.read_exact(&mut v).map_err(io(step))?;
    Ok(v)
}

fn read_array<const N: usize>(
    s: &mut impl Read,
    step: &'static str,
) -> Result<[u8; N], BootstrapError> {
    let mut b = [0; N];
    s.read_exact(&mut b).map_err(io(step))?;
    Ok(b)
}

fn read_u8(s: &mut impl Read, step: &'static str) -> Result<u8, BootstrapError> {
    Ok(u8::from_le_bytes(read_array(s, step)?))
}

fn read_u16(s: &mut impl Read, step: &'static str) -> Result<u16, BootstrapError> {
    Ok(u16::from_le_bytes(read_array(s, step)?))
}

fn read_u32(s: &mut impl Read, step: &'static str) -> Result<u32, BootstrapError> {
    Ok(u32::from_le_bytes(read_array(s, step)?))
}

/// Longest the server's thread blocks waiting for a client before it
/// looks at its stop flag again (dropping the server wakes it at once by
/// connecting; this bounds the drop should that connection fail).
const ACCEPT_WAIT: Duration = Duration::from_secs(1);

/// Blocks until `l` has a connection to accept or `timeout` passed; an
/// error only shortens the wait (the caller retries `accept`).
fn wait_readable(l: &TcpListener, timeout: Duration) {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: l.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid `pollfd` for the listener, which outlives the call.
    let rc = unsafe { libc::poll(&mut fd, 1, ms) };
    if rc < 0 {
        // Never spin on a failing poll.
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A listening bootstrap server; stops when dropped.
pub struct BootstrapServer {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    refusals: Arc<Refusals>,
    thread: Option<JoinHandle<()>>,
}

impl BootstrapServer {
    /// Listens on `listen` (e.g. `127.0.0.1:0`) and serves `offer` to
    /// clients presenting `cfg.token` and `offer.layout_version`.
    pub fn start(listen: &str, cfg: Bootstrap, offer: Offer) -> Result<Self, BootstrapError> {
        Self::start_with_meta(listen, cfg, offer, Vec::new())
    }

    /// As [`BootstrapServer::start`], attaching `meta` (at most 64 KiB) to
    /// the offer for [`Bootstrap::fetch_with_meta`].
    pub fn start_with_meta(
        listen: &str,
        cfg: Bootstrap,
        offer: Offer,
        meta: Vec<u8>,
    ) -> Result<Self, BootstrapError> {
        let fail = |e: std::io::Error| BootstrapError::Listen {
            addr: listen.to_string(),
            reason: e.to_string(),
        };
        let l = TcpListener::bind(listen).map_err(fail)?;
        l.set_nonblocking(true).map_err(fail)?;
        let local = l.local_addr().map_err(fail)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let reply: Arc<[u8]> = encode_offer(&offer, &meta)?.into();
        let cfg = Arc::new(cfg);
        let layout = offer.layout_version;
        let busy = Arc::new(AtomicUsize::new(0));
        let refusals = Arc::new(Refusals::default());
        let noted = refusals.clone();
        let thread = std::thread::Builder::new()
            .name("rolex-bootstrap".into())
            .spawn(move || {
                while !stop2.load(SeqCst) {
                    match l.accept() {
                        Ok((s, _)) => {
                            if stop2.load(SeqCst) {
                                break;
                            }
                            answer(s, &cfg, layout, &reply, &busy, &noted);
                        }
                        // Nothing pending: block until a client knocks
                        // (dropping the server knocks too).
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            wait_readable(&l, ACCEPT_WAIT)
                        }
                        // A failing accept (out of descriptors) would
                        // keep the listener readable: back off instead.
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
            .map_err(fail)?;
        Ok(BootstrapServer {
            local,
            stop,
            refusals,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The clients it refused (a malformed request, a wrong token or
    /// layout version, too many at once, a request that did not arrive
    /// whole in time), for its operator.
    pub fn refusals(&self) -> &Refusals {
        &self.refusals
    }
}

impl Drop for BootstrapServer {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        // Knock once so the thread, blocked waiting for a client, sees
        // `stop` now rather than after `ACCEPT_WAIT`.
        let mut knock = self.local;
        if knock.ip().is_unspecified() {
            knock.set_ip(match knock {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&knock, Duration::from_millis(200));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The reply offering `offer` with the description `meta` attached (at
/// most 64 KiB), as the server sends it.
pub fn encode_offer(offer: &Offer, meta: &[u8]) -> Result<Vec<u8>, BootstrapError> {
    if meta.len() > MAX_META {
        return Err(BootstrapError::Malformed {
            what: "description to offer longer than 64 KiB",
        });
    }
    let mut r = vec![0u8];
    r.extend_from_slice(&offer.layout_version.to_le_bytes());
    let a = offer.addr.as_bytes();
    r.push(a.len() as u8);
    r.extend_from_slice(a);
    if offer.descs.len() > MAX_DESCS {
        return Err(BootstrapError::Malformed {
            what: "too many descriptors to offer",
        });
    }
    r.extend_from_slice(&(offer.descs.len() as u16).to_le_bytes());
    for d in &offer.descs {
        let mut b = vec![0; d.encoded_len()];
        let n = d.encode(&mut b).map_err(|_| BootstrapError::Malformed {
            what: "descriptor to offer",
        })?;
        r.extend_from_slice(&(n as u16).to_le_bytes());
        r.extend_from_slice(&b[..n]);
    }
    r.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    r.extend_from_slice(meta);
    Ok(r)
}

/// Answers the client on `s` from a thread of its own, or refuses it at
/// once if [`MAX_CLIENTS`] are being answered (`busy`) or no thread can
/// be started; every refusal is counted in `refusals`.
fn answer(
    mut s: TcpStream,
    cfg: &Arc<Bootstrap>,
    layout: u32,
    reply: &Arc<[u8]>,
    busy: &Arc<AtomicUsize>,
    refusals: &Arc<Refusals>,
) {
    const BUSY: &str = "too many bootstrap clients at once: try again";
    let peer = s.peer_addr().ok();
    if busy.fetch_add(1, SeqCst) >= MAX_CLIENTS {
        busy.fetch_sub(1, SeqCst);
        let _ = s.set_nonblocking(false);
        let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
        let _ = refuse(&mut s, BUSY);
        refusals.note(peer, BUSY);
        return;
    }
    let (cfg, reply, done, noted) = (cfg.clone(), reply.clone(), busy.clone(), refusals.clone());
    let spawned = std::thread::Builder::new()
        .name("rolex-bootstrap-client".into())
        .spawn(move || {
            if let Err(e) = serve(s, &cfg, layout, &reply, &|why| noted.note(peer, why)) {
                noted.note(peer, &e.to_string());
            }
            done.fetch_sub(1, SeqCst);
        });
    if let Err(e) = spawned {
        busy.fetch_sub(1, SeqCst);
        refusals.note(peer, &format!("no thread to answer it: {e}"));
    }
}

/// Serves the client on `s`: sends it the offer, or a refusal saying why
/// (told to `refused` first).
fn serve(
    mut s: TcpStream,
    cfg: &Bootstrap,
    layout: u32,
    reply: &[u8],
    refused: &dyn Fn(&str),
) -> Result<(), BootstrapError> {
    s.set_nonblocking(false).map_err(io("accepting"))?;
    s.set_write_timeout(Some(cfg.timeout))
        .map_err(io("setting timeouts"))?;
    let why = match read_request(&mut DeadlineReader::new(&s, cfg.timeout)) {
        Ok(req) => match refusal(&req, cfg, layout) {
            None => return s.write_all(reply).map_err(io("sending the offer")),
            Some(why) => why,
        },
        Err(BootstrapError::Malformed { what }) => what.to_string(),
        Err(e) => return Err(e),
    };
    refused(&why);
    refuse(&mut s, &why)
}

/// Why a well-formed request `req` is refused by a server of `cfg`
/// offering `layout`, if it is.
fn refusal(req: &Request, cfg: &Bootstrap, layout: u32) -> Option<String> {
    if req.token != cfg.token.as_bytes() {
        return Some("wrong token".into());
    }
    let want = req.layout_version;
    if want != layout {
        return Some(format!(
            "pool layout version mismatch: the server has {layout}, the client expects {want}"
        ));
    }
    rxm_mismatch(cfg.rxm_buffer, req.rxm_buffer)
}

/// Why a client whose rxm buffer size is `client` (0: none) cannot talk
/// to a server whose size is `server`, if it cannot.
fn rxm_mismatch(server: Option<u32>, client: u32) -> Option<String> {
    match server {
        Some(server) if client != 0 && client != server => Some(format!(
            "FI_OFI_RXM_BUFFER_SIZE differs: the server's *;ofi_rxm runs with {server}, \
             the client's with {client}, and processes whose sizes differ never connect: \
             set the same value on both ends"
        )),
        _ => None,
    }
}

fn refuse(s: &mut TcpStream, msg: &str) -> Result<(), BootstrapError> {
    let m = msg.as_bytes();
    let mut r = vec![1u8];
    r.extend_from_slice(&(m.len().min(u16::MAX as usize) as u16).to_le_bytes());
    r.extend_from_slice(&m[..m.len().min(u16::MAX as usize)]);
    s.write_all(&r).map_err(io("sending a refusal"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rolex_core::wire::Access;

    fn offer() -> Offer {
        let addr = NetAddr::new(b"server").unwrap();
        Offer {
            addr,
            descs: vec![MrDesc::new(0x1000, 4096, Access::all(), &[(addr, 7)]).unwrap()],
            layout_version: 3,
        }
    }

    #[test]
    fn right_token_gets_the_offer() {
        let srv = BootstrapServer::start("127.0.0.1:0", Bootstrap::new("t"), offer()).unwrap();
        let got = Bootstrap::new("t")
            .fetch(&srv.local_addr().to_string(), 3)
            .unwrap();
        assert_eq!(got, offer());
    }

    #[test]
    fn the_description_travels_with_the_offer() {
        let srv = BootstrapServer::start_with_meta(
            "127.0.0.1:0",
            Bootstrap::new("t"),
            offer(),
            b"dist=uniform n=10".to_vec(),
        )
        .unwrap();
        let a = srv.local_addr().to_string();
        let (got, meta) = Bootstrap::new("t").fetch_with_meta(&a, 3).unwrap();
        assert_eq!(got, offer());
        assert_eq!(meta, b"dist=uniform n=10");
        // The plain fetch still works against a server with a description.
        assert_eq!(Bootstrap::new("t").fetch(&a, 3).unwrap(), offer());
        let plain = BootstrapServer::start("127.0.0.1:0", Bootstrap::new("t"), offer()).unwrap();
        let (_, meta) = Bootstrap::new("t")
            .fetch_with_meta(&plain.local_addr().to_string(), 3)
            .unwrap();
        assert!(meta.is_empty());
        assert!(BootstrapServer::start_with_meta(
            "127.0.0.1:0",
            Bootstrap::new("t"),
            offer(),
            vec![0; MAX_META + 1]
        )
        .is_err());
    }

    #[test]
    fn wrong_token_or_layout_is_refused_with_a_reason() {
        let srv = BootstrapServer::start("127.0.0.1:0", Bootstrap::new("t"), offer()).unwrap();
        let a = srv.local_addr().to_string();
        match Bootstrap::new("x").fetch(&a, 3) {
            Err(BootstrapError::Refused { reason }) => assert!(reason.contains("token")),
            other => panic!("{other:?}"),
        }
        match Bootstrap::new("t").fetch(&a, 4) {
            Err(BootstrapError::Refused { reason }) => assert!(reason.contains("layout")),
            other => panic!("{other:?}"),
        }
        // Counted for the operator, with the last one's peer and reason.
        assert_eq!(srv.refusals().count(), 2);
        let last = srv.refusals().last().unwrap();
        assert!(
            last.starts_with("127.0.0.1:") && last.contains("layout"),
            "{last}"
        );
    }

    #[test]
    fn ends_whose_rxm_buffer_sizes_differ_are_refused_naming_both() {
        let with = |size| Bootstrap::new("t").with_rxm_buffer(size);
        let srv = BootstrapServer::start("127.0.0.1:0", with(Some(16384)), offer()).unwrap();
        let a = srv.local_addr().to_string();
        match with(Some(32768)).fetch(&a, 3) {
            Err(BootstrapError::Refused { reason }) => assert!(
                reason.contains("FI_OFI_RXM_BUFFER_SIZE")
                    && reason.contains("16384")
                    && reason.contains("32768"),
                "{reason}"
            ),
            other => panic!("{other:?}"),
        }
        // The same size, or a client that states none, gets the offer.
        assert_eq!(with(Some(16384)).fetch(&a, 3).unwrap(), offer());
        assert_eq!(with(None).fetch(&a, 3).unwrap(), offer());
        // A server that states none serves any client.
        let any = BootstrapServer::start("127.0.0.1:0", with(None), offer()).unwrap();
        let a = any.local_addr().to_string();
        assert_eq!(with(Some(32768)).fetch(&a, 3).unwrap(), offer());
    }

    #[test]
    fn a_client_of_the_older_protocol_is_refused_with_a_reason() {
        let srv = BootstrapServer::start("127.0.0.1:0", Bootstrap::new("t"), offer()).unwrap();
        let mut s = TcpStream::connect(srv.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut req = MAGIC_V1.to_vec();
        req.extend_from_slice(&1u16.to_le_bytes());
        req.extend_from_slice(b"t");
        req.extend_from_slice(&3u32.to_le_bytes());
        s.write_all(&req).unwrap();
        let mut reply = Vec::new();
        s.read_to_end(&mut reply).unwrap();
        assert_eq!(reply[0], 1, "refused");
        let msg = String::from_utf8_lossy(&reply[3..]);
        assert!(msg.contains("same rolex version"), "{msg}");
    }

    #[test]
    fn the_decoders_read_what_the_ends_send_and_name_what_is_wrong() {
        let req = Request {
            token: b"t".to_vec(),
            layout_version: 3,
            rxm_buffer: 16384,
        };
        let bytes = req.encode().unwrap();
        assert_eq!(decode_request(&bytes), Ok(req));
        let malformed = |r: Result<Request, BootstrapError>| match r {
            Err(BootstrapError::Malformed { what }) => what,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            malformed(decode_request(&bytes[..bytes.len() - 1])),
            "message cut short"
        );
        assert_eq!(
            malformed(decode_request(&[&bytes[..], &[0]].concat())),
            "bytes after the message"
        );
        let mut v1 = MAGIC_V1.to_vec();
        v1.extend_from_slice(&1u16.to_le_bytes());
        v1.extend_from_slice(b"t\x03\0\0\0");
        assert_eq!(malformed(decode_request(&v1)), OLDER_PROTOCOL);
        let mut long = MAGIC.to_vec();
        long.extend_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(malformed(decode_request(&long)), "token too long");

        let reply = encode_offer(&offer(), b"meta").unwrap();
        assert_eq!(decode_offer(&reply, true), Ok((offer(), b"meta".to_vec())));
        // `fetch` stops after the descriptors.
        let cut = &reply[..reply.len() - 8];
        assert_eq!(decode_offer(cut, false), Ok((offer(), Vec::new())));
        assert!(matches!(
            decode_offer(cut, true),
            Err(BootstrapError::Malformed { .. })
        ));
        // A declared count above the bound is refused before anything is
        // read or allocated for it.
        let mut many = reply[..reply.len() - 8].to_vec();
        let at = 1 + 4 + 1 + offer().addr.as_bytes().len();
        many[at..at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        assert_eq!(
            decode_offer(&many, false),
            Err(BootstrapError::Malformed {
                what: "too many descriptors"
            })
        );
        assert_eq!(
            decode_offer(b"\x01\x02\0no", true),
            Err(BootstrapError::Refused {
                reason: "no".into()
            })
        );
    }

    /// Regression: the server answered clients one after the other, each
    /// read bounded by the timeout, so a few connections that sent nothing
    /// made every client behind them time out (`rolex bench --memnode`
    /// failed while three silent connections were open).
    #[test]
    fn silent_clients_do_not_delay_the_others() {
        let srv = BootstrapServer::start("127.0.0.1:0", Bootstrap::new("t"), offer()).unwrap();
        let silent: Vec<TcpStream> = (0..3)
            .map(|_| TcpStream::connect(srv.local_addr()).unwrap())
            .collect();
        // Half the server's bound: served only if nobody waits behind them.
        let mut b = Bootstrap::new("t");
        b.timeout = Duration::from_millis(2500);
        assert_eq!(b.fetch(&srv.local_addr().to_string(), 3).unwrap(), offer());
        drop(silent);
    }

    /// Regression: each read had its own bound, so a client sending a
    /// byte at a time held the server for as long as it liked.
    #[test]
    fn a_trickling_client_is_cut_off_at_the_exchange_bound() {
        let mut cfg = Bootstrap::new("t");
        cfg.timeout = Duration::from_millis(300);
        let srv = BootstrapServer::start("127.0.0.1:0", cfg, offer()).unwrap();
        let mut s = TcpStream::connect(srv.local_addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
        let req = Request {
            token: b"t".to_vec(),
            layout_version: 3,
            rxm_buffer: 0,
        }
        .encode()
        .unwrap();
        // 100 ms a byte: the whole request would take 1.9 s; the server
        // gives up on it within its 300 ms and closes the connection.
        let mut closed = false;
        for &b in &req {
            if s.write_all(&[b]).is_err() {
                closed = true;
                break;
            }
            let mut got = [0u8; 1];
            match s.read(&mut got) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(_) => panic!("the server answered a trickled request"),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => {
                    closed = true;
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(90));
        }
        assert!(closed, "the server waited out a request trickled for 1.9 s");
    }

    #[test]
    fn clients_beyond_the_bound_are_refused_with_a_reason() {
        let srv = BootstrapServer::start("127.0.0.1:0", Bootstrap::new("t"), offer()).unwrap();
        let silent: Vec<TcpStream> = (0..MAX_CLIENTS)
            .map(|_| TcpStream::connect(srv.local_addr()).unwrap())
            .collect();
        let mut b = Bootstrap::new("t");
        b.timeout = Duration::from_millis(2500);
        match b.fetch(&srv.local_addr().to_string(), 3) {
            Err(BootstrapError::Refused { reason }) => {
                assert!(reason.contains("too many"), "{reason}")
            }
            // The refusal may be cut by the reset of the unread request.
            Err(BootstrapError::Io { .. }) => {}
            other => panic!("{other:?}"),
        }
        drop(silent);
        // Once they are gone, clients are answered again.
        // (Their threads see the close at once; a hang guard, not a timing
        // bound.)
        let ok = (0..100).find_map(|_| {
            let got = b.fetch(&srv.local_addr().to_string(), 3).ok();
            if got.is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            got
        });
        assert_eq!(ok, Some(offer()));
    }

    #[test]
    fn nobody_listening_or_silent_server_is_an_error_not_a_hang() {
        // A port that was just free: connection refused.
        let free = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut b = Bootstrap::new("t");
        b.timeout = Duration::from_millis(300);
        assert!(matches!(
            b.fetch(&free.to_string(), 1),
            Err(BootstrapError::Connect { .. })
        ));
        // A listener that never answers: the read times out.
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        assert!(matches!(
            b.fetch(&silent.local_addr().unwrap().to_string(), 1),
            Err(BootstrapError::Io { .. })
        ));
        assert!(matches!(
            b.fetch("no-such-host.invalid:1", 1),
            Err(BootstrapError::Connect { .. })
        ));
    }
}
