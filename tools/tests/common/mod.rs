//! Helpers shared by the tests that run the `rolex` binary: running it,
//! scratch files, SOSD bytes, failure checks, and child processes that are
//! killed on every path.
// Each test binary uses a different subset of these.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output};

/// The `rolex` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_rolex");

/// Runs `rolex ARGS` to completion.
pub fn rolex(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run rolex")
}

/// A scratch path unique to this test process.
pub fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rolex-test-{}-{name}", std::process::id()))
}

/// `keys` as a SOSD file's bytes.
pub fn sosd(keys: &[u64]) -> Vec<u8> {
    let mut b = (keys.len() as u64).to_le_bytes().to_vec();
    keys.iter().for_each(|k| b.extend(k.to_le_bytes()));
    b
}

/// Asserts a failure whose stderr names `what`, without a panic.
pub fn assert_fails(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(stderr.contains(what), "stderr lacks {what:?}: {stderr}");
}

/// Kills the child when dropped, pass or fail.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago, for a child to
/// listen on. Taken below Linux's ephemeral range (32768 and up by
/// default), where the kernel does not hand ports out on its own: a port
/// the kernel picked (`bind` to port 0) and that was let go could be
/// given to another test's outgoing connection — libfabric's `tcp`
/// makes several per engine — before the child binds it ("Address
/// already in use", seen in `bad_files`). Drawn at random per process,
/// checked free by binding it.
pub fn free_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let port = rng.gen_range(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000 on 127.0.0.1")
}

/// Lines a child process printed, kept as they come.
#[derive(Clone, Default)]
pub struct Lines(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Lines {
    /// Keeps every line `r` yields, from a thread of its own (echoed to
    /// this process's stderr as `who: line` when `echo` names one).
    pub fn follow(&self, r: impl std::io::Read + Send + 'static, echo: Option<&'static str>) {
        use std::io::BufRead;
        let keep = self.0.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
                if let Some(who) = echo {
                    eprintln!("{who}: {line}");
                }
                keep.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
    }

    /// The lines so far.
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The lines so far, as one text.
    pub fn text(&self) -> String {
        self.all().join("\n")
    }

    /// Lines so far that start with `prefix`.
    pub fn count(&self, prefix: &str) -> usize {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().filter(|l| l.starts_with(prefix)).count()
    }
}

/// Starts `cmd` with its output piped: stderr followed into the returned
/// [`Lines`] (echoed as `who: line`), the first stdout line returned (empty
/// if none came within `limit`: a hang guard), the rest of stdout drained
/// so the child never blocks on a full pipe.
pub fn spawn_with_banner(
    mut cmd: Command,
    who: &'static str,
    limit: std::time::Duration,
) -> (Guard, Lines, String) {
    use std::io::BufRead;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("start a child process");
    let out = child.stdout.take().expect("stdout");
    let stderr = Lines::default();
    stderr.follow(child.stderr.take().expect("stderr"), Some(who));
    let guard = Guard(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(out);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let line = rx.recv_timeout(limit).unwrap_or_default();
    (guard, stderr, line)
}

/// `rolex memnode --fabric libfabric:tcp` on a free 127.0.0.1 port with
/// `token`, no busy polling, and `args`, once its banner is out: the
/// child, its address and its stderr.
pub fn start_memnode(
    token: &str,
    args: &[&str],
    limit: std::time::Duration,
) -> (Guard, String, Lines) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cmd = Command::new(BIN);
    cmd.args(["memnode", "--fabric", "libfabric:tcp", "--listen", &listen])
        .args(["--token", token, "--busy-poll-us", "0"])
        .args(args);
    let (guard, stderr, line) = spawn_with_banner(cmd, "memnode", limit);
    assert!(
        line.starts_with("memory node listening on "),
        "no banner: {line:?}; stderr: {}",
        stderr.text()
    );
    (guard, listen, stderr)
}

/// What a compute process gets from a `rolex memnode --fabric libfabric:tcp`
/// on 127.0.0.1 at `addr`: the pool, a lease from the node's lease server
/// (its port is in the offered description), and the description without
/// the lease port.
pub fn bootstrap_leased(
    addr: &str,
    token: &str,
    limit: std::time::Duration,
) -> (
    rolex_host::kv::PoolInfo,
    rolex_host::kv::lease::LeaseClient,
    String,
) {
    let (offer, meta) = rolex_host::domain::fabric::bootstrap::Bootstrap::new(token)
        .fetch_with_meta(addr, rolex_core::layout::LAYOUT_VERSION)
        .expect("bootstrap");
    let pool = rolex_host::kv::PoolInfo::from_offer(&offer).expect("a pool in the offer");
    let meta = String::from_utf8(meta).expect("a text description");
    let port: u16 = meta
        .split_whitespace()
        .find_map(|w| w.strip_prefix("lease="))
        .expect("a lease port")
        .parse()
        .expect("a port");
    let lease =
        rolex_host::kv::lease::LeaseClient::acquire(&format!("127.0.0.1:{port}"), token, limit)
            .expect("lease");
    let desc = meta
        .split_whitespace()
        .filter(|w| !w.starts_with("lease="))
        .collect::<Vec<_>>()
        .join(" ");
    (pool, lease, desc)
}

/// The engine of a compute node on `libfabric:tcp` over 127.0.0.1
/// (workers not pinned: tests share two cores).
pub fn tcp_engine() -> rolex_host::EngineConfig {
    rolex_host::EngineConfig {
        fabric: rolex_host::Fabric::Libfabric(rolex_host::domain::fabric::LibfabricConfig::new(
            "tcp",
            Some("127.0.0.1"),
        )),
        pin_workers: false,
        ..rolex_host::EngineConfig::default()
    }
}

/// `f()` once it is `Some`, trying every 20 ms for at most `limit` (a
/// hang guard, not a timing assertion).
pub fn wait_for<T>(limit: std::time::Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if t.elapsed() > limit {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
