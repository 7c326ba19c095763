//! Hostile peers against the running services: raw TCP clients send a
//! `rolex memnode --fabric libfabric:tcp` (its bootstrap port and its
//! lease port) and a `rolex te-bench --serve` garbage, truncated
//! requests, oversized length prefixes, requests of the older protocol,
//! nothing at all (held open), a byte at a time, or hundreds of
//! connections at once; a raw lease holder stops renewing, then renews a
//! lease that has ended. After each: the process is alive, a
//! well-behaved `rolex bench` (or `te-bench --peer`) run beside the
//! hostile connections is served and verified, and the process's thread
//! count (`/proc/PID/task`) stays within the servers' bounds (one thread
//! per bootstrap client and per lease request being read, at most
//! `MAX_CLIENTS` and `MAX_HANDSHAKES` of them) and falls back once the
//! hostile connections are given up on.
//!
//! Every child runs under a deadline and is killed on every path; waits
//! are hang guards, never timing assertions.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output};
use std::time::Duration;

mod common;

use common::{free_port, spawn_with_banner, start_memnode, wait_for, Guard, Lines, BIN};
use rolex_host::domain::fabric::bootstrap::MAX_CLIENTS;
use rolex_host::domain::fabric::probe;
use rolex_host::memnode::lease_server::MAX_HANDSHAKES;

const TOKEN: &str = "s3cret";
/// Bound on one child or wait; far above what a run takes.
const LIMIT: Duration = Duration::from_secs(120);

/// A memory node holding `-n 3000` uniform keys: its guard, bootstrap
/// address, lease address and stderr.
struct Node {
    guard: Guard,
    addr: String,
    lease: String,
    stderr: Lines,
}

/// Starts a memory node, or `None` (test skipped) where libfabric `tcp`
/// is not usable.
fn memnode() -> Option<Node> {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return None;
    }
    let (guard, addr, stderr) = start_memnode(TOKEN, &["--dist", "uniform", "-n", "3000"], LIMIT);
    let (_, meta) = rolex_host::domain::fabric::bootstrap::Bootstrap::new(TOKEN)
        .fetch_with_meta(&addr, rolex_core::layout::LAYOUT_VERSION)
        .expect("bootstrap");
    let meta = String::from_utf8(meta).expect("text");
    let port = meta
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lease="))
        .expect("a lease port");
    Some(Node {
        guard,
        addr,
        lease: format!("127.0.0.1:{port}"),
        stderr,
    })
}

impl Node {
    fn pid(&self) -> u32 {
        self.guard.0.id()
    }

    /// Panics if the process exited (a panic or a crash).
    fn assert_alive(&mut self) {
        if let Ok(Some(s)) = self.guard.0.try_wait() {
            panic!("the memory node exited ({s}): {}", self.stderr.text());
        }
        let text = self.stderr.text();
        assert!(!text.contains("panicked"), "{text}");
    }

    /// A `rolex bench` ycsb-a run against it, verified.
    fn assert_serves(&mut self) {
        let out = bench(&self.addr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "bench failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("\"verified\":true"), "{stdout}");
        self.assert_alive();
    }
}

fn bench(addr: &str) -> Output {
    Command::new(BIN)
        .args(["bench", "--workload", "ycsb-a", "--ops", "400"])
        .args([
            "--threads",
            "1",
            "--json",
            "--dist",
            "uniform",
            "-n",
            "3000",
        ])
        .args(["--fabric", "libfabric:tcp", "--memnode", addr])
        .args(["--token", TOKEN, "--busy-poll-us", "0"])
        .output()
        .expect("run rolex bench")
}

/// Threads of process `pid` now.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Waits until process `pid` runs at most `n` threads (hang guard).
fn threads_fall_to(pid: u32, n: usize) -> usize {
    wait_for(Duration::from_secs(30), || {
        let t = threads(pid);
        (t <= n).then_some(t)
    })
    .unwrap_or_else(|| panic!("{} threads, not back to {n}", threads(pid)))
}

/// Sends `bytes` on a fresh connection to `addr`, shuts down its write
/// side, and returns what came back before the server closed (empty on
/// a reset).
fn exchange(addr: &str, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    got
}

/// A refusal's message, if `reply` is one (status 1, u16 length).
fn refusal(reply: &[u8]) -> Option<String> {
    match reply {
        [1, a, b, rest @ ..] => {
            let n = u16::from_le_bytes([*a, *b]) as usize;
            Some(String::from_utf8_lossy(&rest[..n.min(rest.len())]).into_owned())
        }
        _ => None,
    }
}

/// Hostile bytes for a server whose request starts with `magic` and a
/// u16 token length (a lease request ends with its token: a bootstrap
/// request without what follows is cut short).
fn hostile_requests(magic: &[u8; 8]) -> Vec<(&'static str, Vec<u8>)> {
    let with = |tail: &[u8]| [&magic[..], tail].concat();
    let mut v = vec![
        ("empty", Vec::new()),
        ("garbage", (0..=255u8).cycle().take(5000).collect()),
        ("http", b"GET / HTTP/1.0\r\n\r\n".to_vec()),
        ("half a magic", magic[..4].to_vec()),
        ("a magic alone", magic.to_vec()),
        ("token length 65535", with(&u16::MAX.to_le_bytes())),
        ("token length 1025", with(&1025u16.to_le_bytes())),
        ("token cut short", with(&[100, 0, b'x', b'y'])),
        ("old magic", b"RLXBOOT1\x01\x00t\x03\x00\x00\x00".to_vec()),
        (
            "wrong token",
            with(&[5, 0, b'g', b'u', b'e', b's', b's', 0, 0, 0, 0, 0, 0, 0, 0]),
        ),
        (
            "a 4 GiB length",
            [&u32::MAX.to_le_bytes()[..], &[0xff; 64]].concat(),
        ),
    ];
    if magic == b"RLXBOOT2" {
        v.push((
            "right token, no tail",
            with(&[6, 0, b's', b'3', b'c', b'r', b'e', b't']),
        ));
    }
    v
}

#[test]
fn malformed_requests_on_both_ports_are_refused_and_the_node_serves_on() {
    let Some(mut node) = memnode() else { return };
    let base = threads(node.pid());
    let ports = [
        (node.addr.clone(), b"RLXBOOT2"),
        (node.lease.clone(), b"RLXLEAS2"),
    ];
    for (port, magic) in &ports {
        for (what, bytes) in hostile_requests(magic) {
            let reply = exchange(port, &bytes);
            // Either a refusal saying why, or a close: never an offer or a
            // lease, never a crash.
            if let Some(why) = refusal(&reply) {
                assert!(!why.is_empty(), "{what} on {port}: an empty refusal");
                eprintln!("injected: {what} on {port}; found: refused: {why}");
            } else {
                assert!(reply.is_empty(), "{what} on {port}: answered {reply:?}");
                eprintln!("injected: {what} on {port}; found: closed");
            }
            node.assert_alive();
        }
    }
    // Each server says on stderr that it refused peers, naming the last.
    for what in ["bootstrap server: refused", "lease server: refused"] {
        let said = wait_for(LIMIT, || {
            let text = node.stderr.text();
            text.lines()
                .find(|l| l.contains(what) && l.contains("127.0.0.1:"))
                .map(str::to_string)
        });
        let said = said.unwrap_or_else(|| panic!("no {what:?} line: {}", node.stderr.text()));
        eprintln!("found: {said}");
    }
    // A right lease request, then garbage in place of renewals: the lease
    // ends (connection closed) and the node releases what it held.
    let mut s = TcpStream::connect(&node.lease).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(&rolex_host::kv::lease::wire::request(TOKEN.as_bytes()))
        .unwrap();
    let mut head = [0u8; 3];
    s.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0, "granted");
    let _ = s.write_all(&[0xAB; 8 * 1000 + 3]);
    drop(s);
    node.assert_serves();
    let t = threads_fall_to(node.pid(), base + 2);
    eprintln!("found: {base} threads before, {t} after; a verified bench run served");
}

/// Regression: the bootstrap server answered one client at a time, each
/// read bounded by 5 s: three connections that sent nothing made `rolex
/// bench --memnode` fail ("bootstrap connection failed while reading the
/// reply"). The lease port likewise, while compute nodes connect.
#[test]
fn silent_connections_do_not_keep_a_bench_run_from_being_served() {
    let Some(mut node) = memnode() else { return };
    let silent: Vec<TcpStream> = (0..3)
        .flat_map(|_| [&node.addr, &node.lease])
        .map(|a| TcpStream::connect(a).expect("connect"))
        .collect();
    // And one trickling a byte of a right bootstrap request at a time.
    let mut slow = TcpStream::connect(&node.addr).unwrap();
    let _ = slow.write_all(b"RLX");
    node.assert_serves();
    let _ = slow.write_all(b"B");
    eprintln!("found: a bench run verified beside 6 silent connections and a trickling one");
    drop((silent, slow));
}

#[test]
fn hundreds_of_connections_at_once_keep_threads_bounded() {
    let Some(mut node) = memnode() else { return };
    let pid = node.pid();
    let base = threads(pid);
    let flood: Vec<TcpStream> = (0..200)
        .flat_map(|_| [&node.addr, &node.lease])
        .filter_map(|a| TcpStream::connect(a).ok())
        .collect();
    let opened = flood.len();
    // Every connection accepted is answered at once (refused) or read on a
    // thread of its own, within the bounds.
    std::thread::sleep(Duration::from_millis(500));
    let peak = threads(pid);
    eprintln!(
        "injected: {opened} silent connections; found: {base} threads before, {peak} with them"
    );
    assert!(
        peak <= base + MAX_CLIENTS + MAX_HANDSHAKES,
        "{peak} threads for {opened} connections (base {base})"
    );
    node.assert_alive();
    // They are given up on (the servers close them) while still open here;
    // then compute nodes are served again.
    let t = threads_fall_to(pid, base + 2);
    node.assert_serves();
    eprintln!("found: back to {t} threads with the {opened} still open; a bench run verified");
    drop(flood);
}

/// A raw lease holder that never renews: the node ends its lease (closes
/// the connection, says so on stderr); a renewal sent afterwards gets no
/// echo; the node serves on.
#[test]
fn a_lease_that_ended_is_not_renewed() {
    let Some(mut node) = memnode() else { return };
    let mut s = TcpStream::connect(&node.lease).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&rolex_host::kv::lease::wire::request(TOKEN.as_bytes()))
        .unwrap();
    let mut g = [0u8; 9];
    s.read_exact(&mut g).unwrap();
    assert_eq!(g[0], 0, "granted");
    let id = u16::from_le_bytes([g[1], g[2]]);
    // The key to the pool granted with it.
    let mut desc = vec![0u8; u16::from_le_bytes([g[7], g[8]]) as usize];
    s.read_exact(&mut desc).unwrap();
    // One renewal, echoed.
    s.write_all(&7u64.to_le_bytes()).unwrap();
    let mut ack = [0u8; 8];
    s.read_exact(&mut ack).unwrap();
    assert_eq!(u64::from_le_bytes(ack), 7);
    // No more: the lease ends and the connection is closed.
    let mut rest = [0u8; 8];
    let n = s.read(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "the node closed the lease");
    let _ = s.write_all(&8u64.to_le_bytes());
    assert_eq!(s.read(&mut rest).unwrap_or(0), 0, "no echo after the end");
    let left = format!("compute node {id} left (lease ended)");
    wait_for(LIMIT, || node.stderr.text().contains(&left).then_some(()))
        .unwrap_or_else(|| panic!("no {left:?}: {}", node.stderr.text()));
    node.assert_serves();
}

/// `rolex te-bench --serve` against the same bytes and silent
/// connections: it refuses or closes, and a `te-bench --peer` beside them
/// is served.
#[test]
fn te_bench_server_survives_hostile_peers() {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    let addr = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(BIN);
    cmd.args(["te-bench", "--serve", "--listen", &addr])
        .args(["--fabric", "libfabric:tcp", "--region", "1048576"])
        .args(["--token", TOKEN, "--busy-poll-us", "0"]);
    let (mut guard, stderr, line) = spawn_with_banner(cmd, "te-bench", LIMIT);
    assert!(line.contains("serving"), "{line:?}: {}", stderr.text());
    for (what, bytes) in hostile_requests(b"RLXBOOT2") {
        let reply = exchange(&addr, &bytes);
        assert!(
            refusal(&reply).is_some() || reply.is_empty(),
            "{what}: answered {reply:?}"
        );
    }
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(&addr).expect("connect"))
        .collect();
    let out = Command::new(BIN)
        .args([
            "te-bench", "--op", "write", "--size", "4096", "--count", "200",
        ])
        .args([
            "--peer",
            &addr,
            "--fabric",
            "libfabric:tcp",
            "--token",
            TOKEN,
        ])
        .args(["--busy-poll-us", "0", "--json"])
        .output()
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"errors\":0"), "{stdout}");
    assert!(
        guard.0.try_wait().ok().flatten().is_none(),
        "the server exited"
    );
    assert!(!stderr.text().contains("panicked"), "{}", stderr.text());
    wait_for(LIMIT, || stderr.text().contains("refused").then_some(()))
        .unwrap_or_else(|| panic!("no refusal reported: {}", stderr.text()));
    drop(silent);
}
