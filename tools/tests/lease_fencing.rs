//! Lease fencing between processes, over libfabric `tcp` (skipped, saying
//! why, where it is not usable): a `rolex memnode` serves the pool, and
//! compute nodes are *processes* — this test binary run again in a child
//! role (`ROLEX_FENCE_ROLE`), each holding a lease and printing every
//! operation's outcome with `CLOCK_MONOTONIC` timestamps, which are
//! comparable across processes of one machine.
//!
//! - [`a_compute_process_stopped_past_its_lease_writes_nothing_harmful`]:
//!   writer A is stopped (`SIGSTOP`) past its lease while writer B updates
//!   the same keys, then resumed (`SIGCONT`). B goes on once A's locks are
//!   released; A's resumed writes are refused (`LeaseExpired`); the final
//!   values are those of the last acknowledged updates, and every
//!   acknowledged update was seen by its successor.
//! - [`compute_processes_killed_mid_split_lose_no_acknowledged_insert`]:
//!   inserters on 4-slot leaves (a split every few inserts) are killed
//!   (`SIGKILL`) one after another while this process reads back what
//!   they had acknowledged; every acknowledged insert is found, and no
//!   chain stays locked once their leases are released.
//! - [`compute_processes_killed_mid_pipeline_lose_no_acknowledged_insert`]:
//!   the same with inserters that keep 8 inserts in flight (`run_many`;
//!   `tcp` is unordered to the store: 3 rounds per call, each unlock
//!   posted and not waited for), killed with locks and posted unlocks in
//!   flight.
//!
//! Every child runs under a deadline and is killed on every path.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, sosd, spawn_with_banner, tmp, wait_for, Guard, Lines, BIN};
use rolex_host::domain::fabric::probe;
use rolex_host::kv::lease::LeaseClient;
use rolex_host::kv::{Answer, KvClient, KvClientConfig, KvError, Request};

const TOKEN: &str = "f3nce";
/// Bound on one child or wait; far above what a run takes.
const LIMIT: Duration = Duration::from_secs(60);
/// Keys loaded: `STRIDE · i` for `i` in `1..=LOADED`.
const LOADED: u64 = 2000;
const STRIDE: u64 = 1000;
/// Keys both writers of the stop test update (neighbours: a few leaves).
const HOT: u64 = 48;

fn mono_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    assert_eq!(r, 0, "signal {sig} to {}", child.id());
}

/// A memory node process with its pool in a file.
struct Node {
    _guard: Guard,
    addr: String,
    pool: std::path::PathBuf,
    stderr: Lines,
}

impl Node {
    fn start(name: &str, args: &[&str]) -> Node {
        let keys = tmp(&format!("{name}.keys"));
        let loaded: Vec<u64> = (1..=LOADED).map(|i| i * STRIDE).collect();
        std::fs::write(&keys, sosd(&loaded)).expect("write the key file");
        let pool = tmp(&format!("{name}.pool"));
        let listen = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new(BIN);
        cmd.args(["memnode", "--fabric", "libfabric:tcp", "--listen", &listen])
            .args(["--token", TOKEN, "--busy-poll-us", "0"])
            .args(["--keys", keys.to_str().expect("UTF-8")])
            .args(["--pool-file", pool.to_str().expect("UTF-8")])
            .args(args);
        let (guard, stderr, line) = spawn_with_banner(cmd, "memnode", LIMIT);
        assert!(
            line.starts_with("memory node listening on "),
            "no banner: {line:?}; stderr: {:?}",
            stderr.all()
        );
        Node {
            _guard: guard,
            addr: listen,
            pool,
            stderr,
        }
    }

    /// Chains locked in the pool now, as `rolex inspect` reports them.
    fn locks(&self) -> String {
        let out = Command::new(BIN)
            .args(["inspect", "--models", self.pool.to_str().expect("UTF-8")])
            .output()
            .expect("run rolex inspect");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "inspect failed: {text}");
        text.lines()
            .filter(|l| l.contains("chains locked"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Release passes the memory node reported for ended leases (two per
    /// lease), and locks they released.
    fn ended(&self) -> (usize, u64) {
        self.ended_of("")
    }

    /// [`Node::ended`] for the lease whose id is `id` (any: "").
    fn ended_of(&self, id: &str) -> (usize, u64) {
        let mut n = (0, 0);
        let who = format!("compute node {id}");
        for l in self.stderr.all().iter().filter(|l| l.contains(&who)) {
            if let Some(rest) = l.split("(lease ended): released ").nth(1) {
                n.0 += 1;
                n.1 += rest
                    .split_whitespace()
                    .next()
                    .and_then(|w| w.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        n
    }
}

/// A compute node: client and lease (its writes fenced by the lease).
fn connect(addr: &str) -> (KvClient, LeaseClient) {
    let (pool, lease, _) = common::bootstrap_leased(addr, TOKEN, LIMIT);
    let cfg = KvClientConfig {
        engine: common::tcp_engine(),
        ..KvClientConfig::default()
    }
    .with_lease(&lease);
    (KvClient::connect(cfg, &pool).expect("connect"), lease)
}

// ---- the child role ----

/// Runs this test binary again as a compute process in `role`.
fn spawn_child(role: &str, id: u64, addr: &str, stop: &Path) -> (Guard, Lines) {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .args([
            "--exact",
            "child_role",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("ROLEX_FENCE_ROLE", role)
        .env("ROLEX_FENCE_ID", id.to_string())
        .env("ROLEX_FENCE_ADDR", addr)
        .env("ROLEX_FENCE_STOP", stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("start a compute process");
    let lines = Lines::default();
    lines.follow(child.stdout.take().expect("stdout"), None);
    lines.follow(child.stderr.take().expect("stderr"), None);
    (Guard(child), lines)
}

/// The value writer `id` writes in its `i`-th update (unique).
fn tagged(id: u64, i: u64) -> u64 {
    (id << 48) | (i + 1)
}

/// The `i`-th key inserter `id` inserts: 16 gaps between loaded keys,
/// filled from their start (so leaves there split again and again),
/// distinct for every `(id, i)` with `id < 8` and `i < 1984`.
fn insert_key(id: u64, i: u64) -> u64 {
    let gap = 1 + ((i % 16) * 101 + id * 13) % (LOADED - 1);
    STRIDE * gap + 1 + (i / 16) * 8 + id
}

/// Not a test of its own: the compute process's body when this binary
/// runs as a child (see [`spawn_child`]); passes at once otherwise.
#[test]
fn child_role() {
    let Ok(role) = std::env::var("ROLEX_FENCE_ROLE") else {
        return;
    };
    let id: u64 = std::env::var("ROLEX_FENCE_ID")
        .expect("id")
        .parse()
        .expect("id");
    let addr = std::env::var("ROLEX_FENCE_ADDR").expect("addr");
    let stop = std::path::PathBuf::from(std::env::var("ROLEX_FENCE_STOP").expect("stop"));
    let (client, lease) = connect(&addr);
    let mut s = client.session().expect("session");
    println!("ready lease={}", lease.owner().0);
    let deadline = Instant::now() + LIMIT;
    let (mut expired_in_a_row, mut failed_in_a_row) = (0, 0);
    if role == "insert-many" {
        insert_many(&mut s, id, &stop, deadline);
        drop(s);
        println!("done lease_valid={}", lease.valid());
        return;
    }
    for i in 0.. {
        if stop.exists() || Instant::now() > deadline {
            break;
        }
        let t0 = mono_ns();
        let (key, value, r) = if role == "update" {
            let key = STRIDE * (1 + i % HOT);
            let value = tagged(id, i);
            (key, value, s.update(key, value))
        } else {
            let key = insert_key(id, i);
            let value = key ^ 0x5eed;
            (key, value, s.insert(key, value))
        };
        let t1 = mono_ns();
        match r {
            Ok(old) => {
                (expired_in_a_row, failed_in_a_row) = (0, 0);
                let old = old.map_or("none".to_string(), |o| o.to_string());
                println!("ack {key} {value} {t0} {t1} {old}");
            }
            Err(e) => {
                let expired = matches!(e, KvError::LeaseExpired { .. });
                expired_in_a_row = if expired { expired_in_a_row + 1 } else { 0 };
                println!(
                    "err {key} {value} {t0} {t1} may={} expired={expired} {e}",
                    e.may_have_applied()
                );
                failed_in_a_row += 1;
                if expired_in_a_row == 20 {
                    println!("fenced");
                    break;
                }
                if failed_in_a_row == 1000 {
                    println!("failing");
                    break;
                }
            }
        }
    }
    drop(s);
    println!("done lease_valid={}", lease.valid());
}

/// The child role `insert-many`: inserts of `insert_key(id, ·)`, 8 per
/// pipelined call, each answer printed as the `insert` role prints it.
fn insert_many(s: &mut rolex_host::kv::KvSession, id: u64, stop: &Path, deadline: Instant) {
    let mut failed_in_a_row = 0;
    for call in 0u64.. {
        if stop.exists() || Instant::now() > deadline || failed_in_a_row >= 1000 {
            break;
        }
        let reqs: Vec<Request> = (0..8)
            .map(|j| {
                let key = insert_key(id, call * 8 + j);
                Request::Insert(key, key ^ 0x5eed)
            })
            .collect();
        let t0 = mono_ns();
        let answers: Vec<Answer> = s
            .run_many(&reqs)
            .unwrap_or_else(|e| reqs.iter().map(|_| Err(e.clone())).collect());
        let t1 = mono_ns();
        for (r, a) in reqs.iter().zip(answers) {
            let Request::Insert(key, value) = *r else {
                continue;
            };
            match a {
                Ok(old) => {
                    failed_in_a_row = 0;
                    let old = old.map_or("none".to_string(), |o| o.to_string());
                    println!("ack {key} {value} {t0} {t1} {old}");
                }
                Err(e) => {
                    failed_in_a_row += 1;
                    println!(
                        "err {key} {value} {t0} {t1} may={} expired={} {e}",
                        e.may_have_applied(),
                        matches!(e, KvError::LeaseExpired { .. })
                    );
                }
            }
        }
    }
}

// ---- the stop test ----

/// Writers stopped, one after another.
const STOPS: u64 = 3;

/// One update as a writer reported it.
#[derive(Clone, Debug)]
struct Update {
    writer: u64,
    key: u64,
    value: u64,
    t0: u64,
    t1: u64,
    /// `Some(old)`: acknowledged, with the value it replaced (`None`:
    /// the key was absent); `None`: failed.
    acked: Option<Option<u64>>,
    /// A failure that may have taken effect.
    maybe: bool,
    expired: bool,
    text: String,
}

fn parse(writer: u64, lines: &[String]) -> Vec<Update> {
    let mut out = Vec::new();
    for l in lines {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() < 6 || (w[0] != "ack" && w[0] != "err") {
            continue;
        }
        let n = |i: usize| w[i].parse::<u64>().expect("a number");
        let acked = (w[0] == "ack").then(|| w[5].parse::<u64>().ok());
        out.push(Update {
            writer,
            key: n(1),
            value: n(2),
            t0: n(3),
            t1: n(4),
            acked,
            maybe: w[0] == "err" && w[5] == "may=true",
            expired: w[0] == "err" && w.get(6) == Some(&"expired=true"),
            text: l.clone(),
        });
    }
    out
}

#[test]
fn a_compute_process_stopped_past_its_lease_writes_nothing_harmful() {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    let node = Node::start("stop", &[]);
    let stop = tmp("stop.stop");
    let _ = std::fs::remove_file(&stop);
    // B (id 9) writes throughout; A, a new process each round, is stopped.
    let (mut b, b_out) = spawn_child("update", 9, &node.addr, &stop);
    let mut ua = Vec::new();
    for round in 1..=STOPS {
        let (mut a, a_out) = spawn_child("update", round, &node.addr, &stop);
        let going = wait_for(LIMIT, || {
            (a_out.count("ack ") >= 200 + 50 * round as usize && b_out.count("ack ") >= 300)
                .then_some(())
        });
        assert!(
            going.is_some(),
            "writers did not get going: A {:?} B {:?}",
            a_out.all().last(),
            b_out.all().last()
        );
        let id = a_out
            .all()
            .iter()
            // libtest's "test child_role ... " may precede it on its line.
            .find_map(|l| l.split("ready lease=").nth(1).map(|i| format!("{i} left")))
            .expect("A's lease id");
        // Stop A wherever it is: holding a chain lock, with writes or an
        // unlock posted and not completed, or between operations.
        signal(&a.0, libc::SIGSTOP);
        let stopped_at = mono_ns();
        let b_at_stop = b_out.count("ack ");
        let at_stop = node.locks();
        let ended = wait_for(LIMIT, || (node.ended_of(&id).0 >= 1).then_some(()));
        assert!(ended.is_some(), "the stopped writer's lease never ended");
        let lease_end = mono_ns();
        // B goes on over every hot key (A's locks released).
        let b_after = b_out.count("ack ");
        let progressed = wait_for(LIMIT, || {
            (b_out.count("ack ") >= b_after + 2 * HOT as usize).then_some(())
        });
        assert!(progressed.is_some(), "B is blocked after A's lease ended");
        eprintln!(
            "injected: SIGSTOP of writer A{round} after {} of its updates; its lease ended {:.2} s later \
             (the memory node released {} chain lock(s); locked just after the stop: {}); \
             writer B acknowledged {} updates meanwhile",
            a_out.count("ack "),
            (lease_end - stopped_at) as f64 / 1e9,
            node.ended_of(&id).1,
            if at_stop.is_empty() { "none" } else { at_stop.trim() },
            b_out.count("ack ") - b_at_stop
        );
        // Taken before the signal: the child runs only after it.
        let resumed_at = mono_ns();
        signal(&a.0, libc::SIGCONT);
        let fenced = wait_for(LIMIT, || (a_out.count("done") >= 1).then_some(()));
        assert!(
            fenced.is_some(),
            "A did not stop writing: {:?}",
            a_out.all().last()
        );
        let _ = a.0.wait();
        let mine = parse(round, &a_out.all());
        // A's updates in flight at the stop, and those after the resume.
        for u in mine
            .iter()
            .filter(|u| u.t0 < stopped_at && u.t1 > stopped_at)
        {
            eprintln!("found: A{round}'s update in flight at the stop: {}", u.text);
        }
        if let Some(first) = mine.iter().find(|u| u.text.contains("expired")) {
            eprintln!(
                "found: A{round}'s first refusal began {:+.3} s from the stop (the stop lasted {:.2} s)",
                (first.t0 as f64 - stopped_at as f64) / 1e9,
                (resumed_at - stopped_at) as f64 / 1e9
            );
        }
        let after: Vec<&Update> = mine.iter().filter(|u| u.t0 > resumed_at).collect();
        let refused = after.iter().filter(|u| u.expired).count();
        let done = a_out.all().into_iter().find(|l| l.starts_with("done"));
        eprintln!(
            "found: A{round} after the resume: {} updates tried, {refused} refused with LeaseExpired, {} acknowledged; {done:?}",
            after.len(),
            after.iter().filter(|u| u.acked.is_some()).count(),
        );
        // Refused, or failed on what the stop left (the settling of an
        // unlock posted before it): never acknowledged, never maybe
        // applied.
        assert!(refused > 0, "A was never refused");
        assert!(
            after.iter().all(|u| u.acked.is_none() && !u.maybe),
            "A wrote after its lease lapsed: {:?}",
            after
                .iter()
                .find(|u| u.acked.is_some() || u.maybe)
                .map(|u| &u.text)
        );
        ua.extend(mine);
    }
    // B's updates after every one of A's has returned.
    let b_now = b_out.count("ack ");
    let later = wait_for(LIMIT, || {
        (b_out.count("ack ") >= b_now + 3 * HOT as usize).then_some(())
    });
    assert!(later.is_some(), "B stopped after A resumed");
    std::fs::write(&stop, b"stop").expect("write the stop file");
    let bdone = wait_for(LIMIT, || (b_out.count("done") >= 1).then_some(()));
    assert!(bdone.is_some(), "B did not stop");
    let _ = b.0.wait();
    let ub = parse(9, &b_out.all());

    // Final values and the chain of acknowledged updates, per key.
    let (client, _lease) = connect(&node.addr);
    let mut s = client.session().expect("session");
    let mut by_key: HashMap<u64, Vec<&Update>> = HashMap::new();
    for u in ua.iter().chain(&ub) {
        by_key.entry(u.key).or_default().push(u);
    }
    let (mut stale, mut lost, mut acked_total) = (Vec::new(), Vec::new(), 0usize);
    for j in 0..HOT {
        let key = STRIDE * (1 + j);
        let ups = by_key.get(&key).cloned().unwrap_or_default();
        let fin = s.get(key).expect("get").expect("a hot key is present");
        // The final value's writer, and no acknowledged update invoked
        // after it returned.
        match ups.iter().find(|u| u.value == fin) {
            Some(w) => {
                if let Some(a) = ups.iter().find(|a| a.acked.is_some() && a.t0 > w.t1) {
                    stale.push(format!(
                        "key {key}: final {fin} (writer {}), but {} was acknowledged after",
                        w.writer, a.text
                    ));
                }
            }
            None => stale.push(format!("key {key}: final {fin} written by nobody")),
        }
        // Every acknowledged value is the final one or was replaced by an
        // update that says so (or by one whose outcome is unknown).
        let olds: std::collections::HashSet<u64> =
            ups.iter().filter_map(|u| u.acked.flatten()).collect();
        for u in ups.iter().filter(|u| u.acked.is_some()) {
            acked_total += 1;
            let unknown_after = ups
                .iter()
                .any(|x| x.acked.is_none() && x.maybe && x.t1 > u.t0);
            if u.value != fin && !olds.contains(&u.value) && !unknown_after {
                lost.push(u.text.clone());
            }
        }
    }
    eprintln!(
        "found: {HOT} keys, {acked_total} acknowledged updates (the stopped writers {}, B {}): {} stale final values, {} acknowledged updates lost",
        ua.iter().filter(|u| u.acked.is_some()).count(),
        ub.iter().filter(|u| u.acked.is_some()).count(),
        stale.len(),
        lost.len()
    );
    assert!(stale.is_empty(), "{stale:?}");
    assert!(lost.is_empty(), "{:?}", &lost[..lost.len().min(10)]);
    drop(s);
    drop(client);
    assert_no_chain_locked(&node);
}

/// Waits (bounded) until the memory node reports no chain locked, saying
/// what it found; fails the test if locks remain.
fn assert_no_chain_locked(node: &Node) {
    let clear = wait_for(LIMIT, || node.locks().is_empty().then_some(()));
    let found = if clear.is_some() {
        "none".to_string()
    } else {
        node.locks()
    };
    eprintln!("found: chains locked at the end: {found}");
    assert!(clear.is_some(), "chains locked at the end: {found}");
}

// ---- the kill test ----

/// Inserters killed, one after another.
const ROUNDS: u64 = 6;

#[test]
fn compute_processes_killed_mid_split_lose_no_acknowledged_insert() {
    killed_inserters_lose_no_acknowledged_insert("insert");
}

#[test]
fn compute_processes_killed_mid_pipeline_lose_no_acknowledged_insert() {
    killed_inserters_lose_no_acknowledged_insert("insert-many");
}

/// Inserters in `role` killed one after another mid-run (see the module
/// docs).
fn killed_inserters_lose_no_acknowledged_insert(role: &str) {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    let node = Node::start(
        &format!("kill-{role}"),
        &["--leaf-slots", "4", "--trigger", "8", "--spare-leaves", "8"],
    );
    let stop = tmp(&format!("kill-{role}.stop"));
    let _ = std::fs::remove_file(&stop);
    let (client, _lease) = connect(&node.addr);
    let mut s = client.session().expect("session");
    let mut acked: Vec<(u64, u64)> = Vec::new();
    let mut checked = 0usize;
    let mut missing = Vec::new();
    for round in 0..ROUNDS {
        let (mut child, out) = spawn_child(role, round, &node.addr, &stop);
        // Kill after a different count each round: somewhere in a split
        // (4-slot leaves split every two or three inserts).
        let target = 200 + 37 * round as usize;
        let mut seen = 0;
        let got = wait_for(LIMIT, || {
            if out.count("ack ") >= target {
                return Some(());
            }
            // Verify some of what it acknowledged so far, while it inserts.
            let lines = out.all();
            let upto = lines.len().min(seen + 32);
            for l in &lines[seen..upto] {
                let w: Vec<&str> = l.split_whitespace().collect();
                if w.first() == Some(&"ack") {
                    let (k, v) = (w[1].parse().unwrap(), w[2].parse().unwrap());
                    if s.get(k).expect("get") != Some(v) {
                        missing.push((k, "during the run"));
                    }
                    checked += 1;
                }
            }
            seen = upto;
            None
        });
        assert!(
            got.is_some(),
            "inserter {round} did not get going: {:?}",
            out.all().last()
        );
        child.0.kill().expect("SIGKILL the inserter");
        let _ = child.0.wait();
        // What it had acknowledged before it died.
        std::thread::sleep(Duration::from_millis(50));
        let mine: Vec<(u64, u64)> = out
            .all()
            .iter()
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.first() == Some(&"ack")).then(|| (w[1].parse().unwrap(), w[2].parse().unwrap()))
            })
            .collect();
        let last = out.all().last().cloned().unwrap_or_default();
        eprintln!(
            "injected: SIGKILL of {role} inserter {round} after {} acknowledged inserts (last line: {last:?})",
            mine.len()
        );
        acked.extend(mine);
    }
    // Every lease ended and its locks released (twice, after the linger).
    let ended = wait_for(LIMIT, || {
        (node.ended().0 >= 2 * ROUNDS as usize).then_some(())
    });
    assert!(ended.is_some(), "leases ended: {:?}", node.ended());
    for &(k, v) in &acked {
        match s.get(k) {
            Ok(Some(x)) if x == v => {}
            other => missing.push((
                k,
                if other.is_ok() {
                    "at the end"
                } else {
                    "get failed"
                },
            )),
        }
    }
    // Writes go on where the killed ones split, and read back.
    for i in 0..200u64 {
        let k = insert_key(7, i);
        s.insert(k, k ^ 0x5eed)
            .unwrap_or_else(|e| panic!("insert {k} after the kills: {e}"));
        assert_eq!(s.get(k).expect("get"), Some(k ^ 0x5eed));
    }
    drop(s);
    let splits = node
        .stderr
        .all()
        .iter()
        .rfind(|l| l.contains("synonym leaves created"))
        .cloned()
        .unwrap_or_else(|| "no report".into());
    let (leases, released) = node.ended();
    eprintln!(
        "found: {} of {} acknowledged inserts ({checked} also read back during the run); \
         {leases} lease releases ran, {released} lock(s) released; memory node: {splits}",
        acked.len() - missing.len(),
        acked.len()
    );
    assert!(
        missing.is_empty(),
        "lost: {:?}",
        &missing[..missing.len().min(10)]
    );
    drop(client);
    assert_no_chain_locked(&node);
}
