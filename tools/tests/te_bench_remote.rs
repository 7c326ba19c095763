//! Two processes over libfabric `tcp`: `rolex te-bench --serve` offers a
//! region through the bootstrap connection, a second `rolex te-bench
//! --peer` measures writes, write-with-immediate and atomics against it
//! and prints the same JSON keys as on loopback (without `memcpy_gbps`),
//! for one size or for a `--sweep` of sizes.
//! Also: a wrong token and a dead address give a clear error, not a hang;
//! and the server, idle after its clients left, uses (almost) no CPU: its
//! NIC's waiter blocks on the provider's wait object instead of polling.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{free_port, Guard as Server, BIN};

fn serve() -> (Server, String) {
    serve_region("1048576")
}

/// A server offering `region` bytes.
fn serve_region(region: &str) -> (Server, String) {
    serve_with(region, &[])
}

/// A server offering `region` bytes, with more flags. A port
/// `free_port` found free may be taken before the server binds it (by
/// another test's server, or a provider's own listener): then it tries
/// another.
fn serve_with(region: &str, extra: &[&str]) -> (Server, String) {
    let mut last = String::new();
    for _ in 0..5 {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut child = Command::new(BIN)
            .args(["te-bench", "--serve", "--listen", &addr])
            .args(["--fabric", "libfabric:tcp", "--region", region])
            .args(["--token", "s3cret", "--busy-poll-us", "0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the server");
        let out = child.stdout.take().expect("server stdout");
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .expect("server banner");
        let server = Server(child);
        if line.contains("serving") {
            return (server, addr);
        }
        last = line;
    }
    panic!("no server started; last banner: {last:?}");
}

fn client(addr: &str, token: &str, op: &str) -> std::process::Output {
    Command::new(BIN)
        .args(["te-bench", "--op", op, "--size", "4096", "--count", "200"])
        .args([
            "--peer",
            addr,
            "--fabric",
            "libfabric:tcp",
            "--token",
            token,
        ])
        .args(["--busy-poll-us", "0", "--json"])
        .output()
        .expect("run the client")
}

#[test]
fn te_bench_across_two_processes_on_tcp() {
    let (_server, addr) = serve();
    for op in ["write", "write-imm", "read", "cas", "faa"] {
        let out = client(&addr, "s3cret", op);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{op}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
        for key in [
            "op", "size", "gbps", "mops", "p50_us", "p99_us", "rtts", "errors",
        ] {
            assert!(v.get(key).is_some(), "{op}: key {key} missing in {v}");
        }
        assert_eq!(v["fabric"], "libfabric:tcp");
        assert_eq!(v["errors"], 0, "{op}: {v}");
        // Every post of a write asks for at most one acknowledgement.
        let acks = v["delivery_acks"].as_u64().expect("delivery_acks");
        let doorbells = v["doorbells"].as_u64().expect("doorbells");
        if op == "write" {
            assert!(acks > 0 && acks <= doorbells, "{op}: {v}");
        }
    }
    // Without the plug every write is its own post (and, one at a time
    // from one thread, asks for its own acknowledgement).
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
            "s3cret",
        ])
        .args(["--busy-poll-us", "0", "--no-plug", "--json"])
        .output()
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(v["errors"], 0, "{v}");
}

#[test]
fn te_bench_sweep_across_two_processes_on_tcp() {
    // 4 MiB, the sweep's largest write, fits.
    let (_server, addr) = serve_region("4194304");
    let out = Command::new(BIN)
        .args(["te-bench", "--sweep", "--count", "10", "--json"])
        .args(["--peer", &addr, "--fabric", "libfabric:tcp"])
        .args(["--token", "s3cret", "--busy-poll-us", "0"])
        .output()
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sizes: Vec<u64> = stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON object per size");
            assert_eq!(v["fabric"], "libfabric:tcp");
            assert_eq!(v["errors"], 0, "{v}");
            // No memcpy reference across processes.
            assert!(v.get("memcpy_gbps").is_none(), "{v}");
            v["size"].as_u64().expect("size")
        })
        .collect();
    assert_eq!(sizes.first(), Some(&64));
    assert_eq!(sizes.last(), Some(&(4 << 20)));
    assert_eq!(sizes.len(), 9);
}

/// CPU time of every thread of process `pid` so far (`schedstat`: time
/// on a CPU, in ns).
fn process_cpu(pid: u32) -> Duration {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads");
    let ns: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    Duration::from_nanos(ns)
}

#[test]
fn an_idle_server_uses_under_one_percent_of_a_core() {
    let (server, addr) = serve();
    // Connections up, some traffic, then the client is gone.
    for op in ["write", "write-imm"] {
        let out = client(&addr, "s3cret", op);
        assert!(out.status.success(), "{op}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let pid = server.0.id();
    let (cpu0, t0) = (process_cpu(pid), Instant::now());
    std::thread::sleep(Duration::from_millis(2000));
    let share = (process_cpu(pid) - cpu0).as_secs_f64() / t0.elapsed().as_secs_f64();
    eprintln!("idle server: {:.4}% of a core", share * 100.0);
    assert!(
        share < 0.01,
        "the idle server used {:.3}% of a core",
        share * 100.0
    );
}

/// A paged run of 16 pages of 1 KiB against `addr`.
fn paged_client(addr: &str) -> std::process::Output {
    Command::new(BIN)
        .args([
            "te-bench", "--op", "paged", "--size", "1024", "--pages", "16",
        ])
        .args(["--count", "50", "--peer", addr, "--fabric", "libfabric:tcp"])
        .args(["--token", "s3cret", "--busy-poll-us", "0", "--json"])
        .output()
        .expect("run the client")
}

#[test]
fn ends_whose_rxm_buffer_sizes_differ_are_refused_at_bootstrap_naming_both() {
    // Both at te-bench's default (32 KiB): 16 pages of 1 KiB travel as one
    // message each and land.
    let (_server, addr) = serve_with("33554432", &[]);
    let out = paged_client(&addr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(v["errors"], 0, "{v}");
    assert!(v["paged_by_message"].as_u64() > Some(0), "{v}");
    // A server at the provider's 16 KiB: `tcp;ofi_rxm` processes whose
    // sizes differ never connect (every post is refused, one-sided
    // writes too, until the operation timeout). The bootstrap refuses
    // the client at once, naming the variable and both sizes.
    let (_default, addr) = serve_with("33554432", &["--rxm-buffer-size", "0"]);
    let out = paged_client(&addr);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused")
            && err.contains("FI_OFI_RXM_BUFFER_SIZE differs")
            && err.contains("16384")
            && err.contains("32768"),
        "{err}"
    );
}

#[test]
fn wrong_token_and_dead_address_fail_clearly_and_quickly() {
    let (_server, addr) = serve();
    let start = Instant::now();
    let out = client(&addr, "guess", "write");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wrong token"), "{err}");
    let dead = format!("127.0.0.1:{}", free_port());
    let out = client(&dead, "s3cret", "write");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot reach"), "{err}");
    // A hang guard, not a timing assertion: both are bounded by the
    // bootstrap timeouts (5 s each).
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn verbs_runs_where_a_device_is_or_says_why_not() {
    let out = common::rolex(&[
        "te-bench", "--op", "write", "--size", "64", "--count", "10", "--fabric", "verbs",
    ]);
    let devices = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if cfg!(feature = "verbs") && devices {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else if cfg!(feature = "verbs") {
        // The device list is empty: the libibverbs call that found none is
        // named.
        common::assert_fails(&out, "ibv_");
    } else {
        common::assert_fails(&out, "--features verbs");
    }
    // The store over verbs: a memory node and a compute node say the same.
    let node = common::rolex(&[
        "memnode",
        "--dist",
        "uniform",
        "-n",
        "100",
        "--fabric",
        "verbs",
        "--listen",
        "127.0.0.1:0",
    ]);
    let dead = format!("127.0.0.1:{}", free_port());
    let bench = common::rolex(&[
        "bench",
        "--workload",
        "ycsb-c",
        "--ops",
        "10",
        "--threads",
        "1",
        "--fabric",
        "verbs",
        "--memnode",
        &dead,
    ]);
    if !cfg!(feature = "verbs") {
        common::assert_fails(&node, "--features verbs");
        common::assert_fails(&bench, "--features verbs");
    } else if !devices {
        common::assert_fails(&node, "ibv_");
        common::assert_fails(&bench, "cannot reach");
    }
}

/// A client whose server stops answering mid-run (`SIGSTOP`: alive, its
/// connection open, nothing progressed) fails its operations after the
/// operation timeout and exits. It used to hang for ever in its engine's
/// drop: the writes still in flight held pins on the client's region,
/// and the endpoint whose closing cancels them closed only after the
/// engine had waited for those pins to go.
#[test]
fn a_client_whose_server_stops_answering_fails_and_exits() {
    use std::io::Read;
    let (server, addr) = serve_region("16777216");
    let mut c = Command::new(BIN)
        .args([
            "te-bench", "--op", "write", "--size", "65536", "--depth", "8",
        ])
        .args(["--count", "1000000000", "--peer", &addr])
        .args(["--fabric", "libfabric:tcp", "--token", "s3cret"])
        .args(["--busy-poll-us", "0", "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the client");
    // Writes flow, then the server stops.
    std::thread::sleep(Duration::from_millis(1500));
    let stopped = Command::new("kill")
        .args(["-STOP", &server.0.id().to_string()])
        .status()
        .expect("run kill");
    assert!(stopped.success());
    // A hang guard, not a timing assertion: the operation timeout is 10 s
    // and the drain at shutdown 2 s.
    let start = Instant::now();
    let status = loop {
        if let Some(s) = c.try_wait().expect("poll the client") {
            break Some(s);
        }
        if start.elapsed() > Duration::from_secs(120) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let Some(status) = status else {
        let _ = c.kill();
        let _ = c.wait();
        panic!("the client did not exit within 120 s of its server stopping");
    };
    let mut err = String::new();
    let _ = c.stderr.take().expect("stderr").read_to_string(&mut err);
    assert!(!status.success(), "{err}");
    assert!(err.contains("did not complete"), "{err}");
}
