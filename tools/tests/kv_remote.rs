//! The store across processes over libfabric `tcp` on 127.0.0.1: a
//! `rolex memnode --fabric libfabric:tcp` process serves the pool, and
//! `rolex bench --memnode` compute-node processes run against it — two at
//! once on a shared plan, each verifying every answer and its final state;
//! a single one reports the same round trips and bytes per operation as
//! the loopback run of the same parameters. A compute node given a wrong
//! address, a wrong token, another data set, or whose memory node dies,
//! fails with a clear error in bounded time.
//!
//! Every child runs under a deadline and is killed on every path (the
//! memory node by its guard's `Drop`).

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, Guard, BIN};

/// Bound on one child; far above what a run takes, it only stops a hang.
const LIMIT: Duration = Duration::from_secs(180);

/// Starts a memory node on `tcp` holding `-n 3000` uniform keys; returns
/// its guard and bootstrap address (read from its first stdout line).
fn memnode() -> (Guard, String) {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(BIN)
        .args(["memnode", "--fabric", "libfabric:tcp", "--listen", &listen])
        .args(["--dist", "uniform", "-n", "3000", "--token", "s3cret"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .stdin(Stdio::null())
        .spawn()
        .expect("start the memory node");
    let out = child.stdout.take().expect("memory node stdout");
    let guard = Guard(child);
    // The first line comes after the load; bounded by the reader thread.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        // Keep draining so the node never blocks on a full pipe.
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let line = rx.recv_timeout(LIMIT).expect("memory node banner in time");
    assert!(
        line.starts_with("memory node listening on "),
        "unexpected banner: {line}"
    );
    let addr = line
        .split_whitespace()
        .nth(4)
        .expect("address in the banner")
        .to_string();
    assert_eq!(addr, listen);
    (guard, addr)
}

/// A started child whose output is collected; killed at the deadline.
struct Running {
    guard: Guard,
    out: std::thread::JoinHandle<Vec<u8>>,
    err: std::thread::JoinHandle<Vec<u8>>,
    start: Instant,
}

fn spawn(args: &[&str]) -> Running {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("start rolex");
    let mut o = child.stdout.take().expect("stdout");
    let mut e = child.stderr.take().expect("stderr");
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = o.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = e.read_to_end(&mut v);
        v
    });
    Running {
        guard: Guard(child),
        out,
        err,
        start: Instant::now(),
    }
}

impl Running {
    /// Waits for the child (killing it at [`LIMIT`]); panics on a hang.
    fn finish(mut self) -> Output {
        let status = loop {
            if let Some(s) = self.guard.0.try_wait().expect("wait") {
                break s;
            }
            if self.start.elapsed() > LIMIT {
                let _ = self.guard.0.kill();
                panic!("rolex did not finish within {LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            status,
            stdout: self.out.join().unwrap_or_default(),
            stderr: self.err.join().unwrap_or_default(),
        }
    }
}

fn bench_args<'a>(workload: &'a str, ops: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "bench",
        "--workload",
        workload,
        "--ops",
        ops,
        "--threads",
        "1",
        "--json",
    ];
    v.extend_from_slice(extra);
    v
}

fn remote<'a>(addr: &'a str, token: &'a str) -> Vec<&'a str> {
    vec![
        "--fabric",
        "libfabric:tcp",
        "--memnode",
        addr,
        "--token",
        token,
        "--busy-poll-us",
        "0",
    ]
}

fn json(out: &Output, what: &str) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(v["verified"], true, "{what}: {v}");
    v
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn two_compute_processes_share_a_memory_node_and_match_loopback_figures() {
    // One process alone: the same round trips and bytes per operation as
    // the loopback run of the same parameters — including the fabric's
    // ordering, which the provider grants or not (the text report names
    // it); an unordered fabric's writes take a round trip more.
    let (node, addr) = memnode();
    let mut a: Vec<&str> = bench_args("ycsb-c", "100", &[]);
    a.retain(|&x| x != "--json");
    a.extend(remote(&addr, "s3cret"));
    let text = spawn(&a).finish();
    assert!(text.status.success(), "{}", stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    let fabric = text
        .lines()
        .find(|l| l.starts_with("fabric "))
        .unwrap_or_else(|| panic!("no fabric line in {text}"));
    assert!(fabric.contains("libfabric:tcp"), "{fabric}");
    let unordered = fabric.trim_end().ends_with("unordered");
    for workload in ["ycsb-c", "ycsb-a"] {
        let mut a = bench_args(workload, "800", &[]);
        a.extend(remote(&addr, "s3cret"));
        let far = json(&spawn(&a).finish(), workload);
        let mut local = vec!["--dist", "uniform", "-n", "3000"];
        if unordered {
            local.push("--unordered");
        }
        let near = json(
            &spawn(&bench_args(workload, "800", &local)).finish(),
            workload,
        );
        assert!(far["retrains"].is_null(), "{far}");
        for key in ["rtt_per_op", "bytes_per_op", "leaves_per_get", "keys"] {
            assert_eq!(far[key], near[key], "{workload} {key}: {far} vs {near}");
        }
    }
    // A fresh node (the values a run checks against are its own plan's):
    // two compute processes at once, threads 0 and 1 of one ycsb-a plan,
    // updating shared keys, each verifying its answers and final state.
    drop(node);
    let (_node, addr) = memnode();
    let runs: Vec<Running> = (0..2)
        .map(|i| {
            let idx = i.to_string();
            let mut a = bench_args("ycsb-a", "1500", &[]);
            a.extend(remote(&addr, "s3cret"));
            a.extend(["--compute-count", "2", "--compute-index", &idx]);
            spawn(&a)
        })
        .collect();
    for (i, r) in runs.into_iter().enumerate() {
        let v = json(&r.finish(), &format!("compute process {i}"));
        assert_eq!(v["keys"], 3000);
        assert_eq!(v["ops"], 1500);
    }
}

#[test]
fn wrong_address_token_or_data_set_fail_clearly() {
    let (_node, addr) = memnode();
    let mut a = bench_args("ycsb-c", "100", &[]);
    a.extend(remote(&addr, "guess"));
    let out = spawn(&a).finish();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("wrong token"), "{}", stderr(&out));

    let dead = format!("127.0.0.1:{}", free_port());
    let mut a = bench_args("ycsb-c", "100", &[]);
    a.extend(remote(&dead, "s3cret"));
    let out = spawn(&a).finish();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("cannot reach"), "{}", stderr(&out));

    let mut a = bench_args("ycsb-c", "100", &["--dist", "normal", "-n", "3000"]);
    a.extend(remote(&addr, "s3cret"));
    let out = spawn(&a).finish();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("different data set") && stderr(&out).contains("--dist"),
        "{}",
        stderr(&out)
    );

    let mut a = bench_args("ycsb-d", "100", &[]);
    a.extend(remote(&addr, "s3cret"));
    let out = spawn(&a).finish();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("inserts keys"), "{}", stderr(&out));
}

#[test]
fn a_memory_node_that_dies_mid_run_is_an_error_not_a_hang() {
    let (mut node, addr) = memnode();
    let mut a = bench_args("ycsb-c", "300000", &[]);
    a.extend(remote(&addr, "s3cret"));
    let run = spawn(&a);
    // Whenever the node dies (before or after the client connected), the
    // client must fail with an error, within the deadline `finish` keeps.
    std::thread::sleep(Duration::from_secs(3));
    let _ = node.0.kill();
    let _ = node.0.wait();
    let out = run.finish();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("error:"), "{}", stderr(&out));
}
