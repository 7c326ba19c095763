//! What the TCP control servers share — the bootstrap server
//! (`domain::fabric::bootstrap`) and the memory node's lease server: a
//! request read under one deadline ([`DeadlineReader`]), and the peers
//! they refused, counted for their operator ([`Refusals`]).
//!
//! These servers carry only control (addresses, descriptors, leases);
//! their peers are untrusted until they present the token, so every
//! request has one bound however its sender spaces its bytes, and every
//! refusal is counted with the last one's peer and reason — a process
//! serving them prints the count now and then rather than a line per
//! refused peer, which a flood of connections would turn into a flood
//! of lines.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A TCP stream whose reads share one deadline: each read may block only
/// for what is left of it, so a whole message has one bound however its
/// sender spaces the bytes (one a second would otherwise hold a reader
/// bounded per read for as long as it liked). A read past the deadline
/// fails with [`std::io::ErrorKind::TimedOut`]. It sets the stream's read
/// timeout on each read.
pub struct DeadlineReader<'a> {
    s: &'a TcpStream,
    at: Instant,
}

impl<'a> DeadlineReader<'a> {
    /// Reads of `s` that must all end within `within` from now.
    pub fn new(s: &'a TcpStream, within: Duration) -> Self {
        Self {
            s,
            at: Instant::now() + within,
        }
    }
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.s.set_read_timeout(Some(left))?;
        (&mut &*self.s).read(buf)
    }
}

/// The peers a control server refused (a malformed or wrong request, too
/// many at once, one that did not arrive whole in time): how many, and
/// the last one's address and reason.
#[derive(Debug, Default)]
pub struct Refusals {
    count: AtomicU64,
    last: Mutex<Option<(Option<SocketAddr>, String)>>,
}

impl Refusals {
    /// Counts a refusal of `peer` (if its address is known) for `why`.
    pub fn note(&self, peer: Option<SocketAddr>, why: &str) {
        self.count.fetch_add(1, Relaxed);
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((peer, why.to_string()));
    }

    /// Refusals so far.
    pub fn count(&self) -> u64 {
        self.count.load(Relaxed)
    }

    /// The last refusal as one line: `ADDR: reason` (`None`: none yet).
    pub fn last(&self) -> Option<String> {
        let g = self.last.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map(|(peer, why)| match peer {
            Some(p) => format!("{p}: {why}"),
            None => format!("a peer: {why}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_count_and_keep_the_last() {
        let r = Refusals::default();
        assert_eq!((r.count(), r.last()), (0, None));
        r.note(Some("127.0.0.1:7".parse().unwrap()), "wrong token");
        r.note(None, "timed out");
        assert_eq!(r.count(), 2);
        assert_eq!(r.last().as_deref(), Some("a peer: timed out"));
    }
}
