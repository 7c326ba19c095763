//! Leases, the compute node's side and the wire format: how a memory node
//! learns that a compute node died, so the chain locks it held can be
//! released.
//!
//! A compute node in another process opens one TCP connection to its
//! memory node's lease port, presents the shared token and gets a
//! [`LockOwner`] id; every chain lock it takes carries that id
//! (`KvClientConfig::lock_owner`). It then keeps the connection open and
//! silent for its whole life. The kernel closes it when the process ends —
//! `SIGKILL` included — and the memory node, blocked in a read on it, sees
//! the end at once; TCP keepalive (a few seconds) covers a machine that
//! vanished without a word. The memory node (`rolex-memnode`'s lease
//! server) then releases the dead node's locks twice: after a grace
//! period, and again after a linger, because the dead node's last
//! operations may still be in flight on the fabric (a lock `CAS` landing
//! after the first pass). Its id is reused only after the second pass.
//!
//! What this does not cover: a compute node that is alive but cut off from
//! the lease port while still reaching the pool would have its locks
//! released under it. Leases assume the control network fails with the
//! fabric (they share the hosts), as the bootstrap does.
//!
//! Wire format (integers little-endian), every read bounded in time and
//! length; [`wire`] encodes and decodes it for both sides:
//!
//! ```text
//! request:  "RLXLEAS1" | token_len u16 | token
//! granted:  0u8 | owner u16
//! refused:  1u8 | msg_len u16 | msg (UTF-8)
//! ```

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use rolex_core::entry::LockOwner;

use wire::{reply, Reply, MAX_TOKEN, REPLY_HEAD};

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
    use rolex_core::entry::LockOwner;

    use super::LeaseError;

    /// The request's first bytes.
    pub const MAGIC: &[u8; 8] = b"RLXLEAS1";
    /// Longest token accepted.
    pub const MAX_TOKEN: usize = 1024;
    /// Longest refusal message read.
    pub const MAX_MSG: usize = 4096;
    /// Bytes of a request before its token: magic and token length.
    pub const REQUEST_HEAD: usize = 10;
    /// Bytes of a reply before a refusal's message: status and owner/length.
    pub const REPLY_HEAD: usize = 3;

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

    /// The reply granting lease `id`.
    pub fn granted(id: u16) -> [u8; REPLY_HEAD] {
        let [a, b] = id.to_le_bytes();
        [0, a, b]
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
        /// The lease is granted with this id.
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
        let req = wire::request(token.as_bytes());
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
    use std::net::TcpListener;
    use wire::MAGIC;

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
    fn encoded_replies_decode_to_what_was_sent() {
        assert_eq!(
            reply(&wire::granted(7)).unwrap(),
            Reply::Granted(LockOwner(7))
        );
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
