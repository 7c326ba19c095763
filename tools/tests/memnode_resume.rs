//! A memory node killed mid-run and resumed: `rolex memnode --fabric
//! libfabric:tcp --pool-file F` serves a pool kept in `F`; a compute node
//! (this test process, over libfabric `tcp`, holding a lease) inserts
//! fresh keys and records each insert acknowledged to it; the memory node
//! is killed with `SIGKILL` while inserts are in flight (and, with a low
//! retraining trigger, often mid-retraining); `rolex memnode … --pool-file
//! F --resume` must then serve every acknowledged insert, accept writes
//! again — the chain the interrupted insert had locked included — and
//! offer the same data-set description, so that `rolex bench` given the
//! original data-set arguments runs against it and verifies every loaded
//! key. Also: `--resume` without `--pool-file`, on a missing file, on a
//! file that is not a pool and on a pool of another layout version fails
//! with a clear error, before anything is served.
//!
//! Every child runs under a deadline and is killed on every path.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::{assert_fails, free_port, rolex, sosd, tmp, wait_for, Guard, Lines, BIN};
use rolex_host::domain::fabric::probe;
use rolex_host::kv::lease::LeaseClient;
use rolex_host::kv::{KvClient, KvClientConfig};

const TOKEN: &str = "s3cret";
/// Bound on one child or wait; far above what a run takes.
const LIMIT: Duration = Duration::from_secs(120);
/// Keys loaded: `STRIDE · i` for `i` in `1..=LOADED` (fresh keys lie
/// between them).
const LOADED: u64 = 3000;
const STRIDE: u64 = 1000;
/// Acknowledged inserts before the kill.
const BEFORE_KILL: usize = 1500;

/// A memory node process: its guard, bootstrap address and stderr.
struct Node {
    guard: Guard,
    addr: String,
    stderr: Lines,
}

impl Node {
    /// `rolex memnode --fabric libfabric:tcp` with `args`, once its banner
    /// (first stdout line) is out.
    fn start(args: &[&str]) -> Node {
        let (guard, listen, stderr) = common::start_memnode(TOKEN, args, LIMIT);
        Node {
            guard,
            addr: listen,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.text()
    }
}

/// A compute node in this process: its client, lease and the data-set
/// description the memory node offered (its `lease=` word removed).
struct Compute {
    client: KvClient,
    _lease: LeaseClient,
    desc: String,
}

fn connect(addr: &str) -> Compute {
    let (pool, lease, desc) = common::bootstrap_leased(addr, TOKEN, LIMIT);
    let cfg = KvClientConfig {
        engine: common::tcp_engine(),
        lock_owner: lease.owner(),
        ..KvClientConfig::default()
    };
    let client = KvClient::connect(cfg, &pool).expect("connect");
    Compute {
        client,
        _lease: lease,
        desc,
    }
}

/// The `i`-th fresh key: between two loaded keys, never a loaded one,
/// all distinct for `i < 27 · (LOADED − 1)`; consecutive ones fall in
/// gaps spread over the key range (1009 is prime to the 2999 gaps).
fn fresh_key(i: u64) -> u64 {
    let gaps = LOADED - 1;
    let (j, round) = (i % gaps, i / gaps);
    let gap = 1 + (j * 1009) % gaps;
    STRIDE * gap + 1 + round * 37
}

fn value_of(key: u64) -> u64 {
    key.rotate_left(17) ^ 0x5eed
}

#[test]
fn a_memory_node_killed_mid_run_resumes_with_every_acknowledged_write() {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    let pool = tmp("resume.pool");
    let keys_file = tmp("resume.keys");
    let loaded: Vec<u64> = (1..=LOADED).map(|i| i * STRIDE).collect();
    std::fs::write(&keys_file, sosd(&loaded)).expect("write the key file");
    let keys_arg = keys_file.to_str().expect("a UTF-8 path");
    let pool_arg = pool.to_str().expect("a UTF-8 path");
    // A low trigger: the agent retrains every few splits, so the kill may
    // land inside a retraining.
    let mut node = Node::start(&[
        "--keys",
        keys_arg,
        "--pool-file",
        pool_arg,
        "--trigger",
        "8",
    ]);

    // Inserts until the first error (the kill), each recorded once
    // acknowledged; the one that failed is kept apart.
    let before = connect(&node.addr);
    let acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let failed = Arc::new(Mutex::new(None::<(u64, String)>));
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let writer = {
        let (acked, failed) = (acked.clone(), failed.clone());
        std::thread::spawn(move || {
            let mut s = before.client.session().expect("session");
            for i in 0.. {
                let k = fresh_key(i);
                match s.insert(k, value_of(k)) {
                    Ok(None) => acked.lock().unwrap().push(k),
                    Ok(Some(old)) => panic!("fresh key {k} held {old}"),
                    Err(e) => {
                        *failed.lock().unwrap() = Some((k, e.to_string()));
                        break;
                    }
                }
            }
            drop(s);
            let _ = done_tx.send(());
            // The client and lease of a dead node: dropped here, off the
            // test's path.
            drop(before);
        })
    };
    let t0 = Instant::now();
    while acked.lock().unwrap().len() < BEFORE_KILL && t0.elapsed() < LIMIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let at_kill = acked.lock().unwrap().len();
    assert!(
        at_kill >= BEFORE_KILL,
        "only {at_kill} inserts in {LIMIT:?}"
    );
    node.guard.0.kill().expect("SIGKILL the memory node");
    let _ = node.guard.0.wait();
    let log = node.stderr();
    let retrains = log
        .lines()
        .rfind(|l| l.starts_with("retrained "))
        .unwrap_or("no retraining reported");
    eprintln!(
        "injected: SIGKILL of the memory node after {at_kill} acknowledged inserts \
         ({:.1} s into the run; its last report: {retrains})",
        t0.elapsed().as_secs_f64()
    );
    let ended = done_rx.recv_timeout(LIMIT).is_ok();
    let acked: Vec<u64> = acked.lock().unwrap().clone();
    let failed = failed.lock().unwrap().clone();
    match (&failed, ended) {
        (Some((k, e)), _) => {
            eprintln!(
                "injected: {} inserts acknowledged in all; insert of {k} in flight, failed: {e}",
                acked.len()
            )
        }
        (None, _) => eprintln!(
            "injected: {} inserts acknowledged; the writer did not return within {LIMIT:?}",
            acked.len()
        ),
    }
    if ended {
        let _ = writer.join();
    }
    let first_desc = {
        // The description the first node offered, as stored next to the pool.
        let stored = std::fs::read_to_string(format!("{pool_arg}.dataset")).expect("stored");
        stored.trim().to_string()
    };

    // Resumed: no data-set arguments, a different port.
    let node = Node::start(&["--pool-file", pool_arg, "--resume", "--trigger", "8"]);
    // The report precedes the banner, but comes through another pipe.
    let report = wait_for(LIMIT, || {
        node.stderr()
            .lines()
            .find(|l| l.starts_with("resumed pool file"))
            .map(str::to_string)
    })
    .unwrap_or_else(|| panic!("no recovery report: {}", node.stderr()));
    eprintln!("found: {report}");
    let after = connect(&node.addr);
    assert_eq!(after.desc, first_desc, "the offered description");
    let mut s = after.client.session().expect("session");
    let mut missing = Vec::new();
    for &k in &acked {
        match s.get(k) {
            Ok(Some(v)) if v == value_of(k) => {}
            other => missing.push((k, format!("{other:?}"))),
        }
    }
    // Every loaded key is there too.
    let mut loaded_missing = 0;
    for &k in &loaded {
        if !matches!(s.get(k), Ok(Some(_))) {
            loaded_missing += 1;
        }
    }
    eprintln!(
        "found: {} of {} acknowledged inserts, {} of {} loaded keys",
        acked.len() - missing.len(),
        acked.len(),
        loaded.len() - loaded_missing,
        loaded.len()
    );
    assert!(
        missing.is_empty(),
        "lost acknowledged inserts: {:?}",
        &missing[..missing.len().min(10)]
    );
    assert_eq!(loaded_missing, 0);
    // Writes go on, the interrupted insert's chain included (its lock, if
    // it held one, was released), and read back.
    let mut again: Vec<u64> = failed.iter().map(|(k, _)| *k).collect();
    again.extend((0..300).map(|i| fresh_key(acked.len() as u64 + 1 + i)));
    for &k in &again {
        s.insert(k, value_of(k))
            .unwrap_or_else(|e| panic!("insert {k} after the resume: {e}"));
    }
    for &k in acked.iter().chain(&again) {
        assert_eq!(s.get(k).expect("get"), Some(value_of(k)), "key {k}");
    }
    eprintln!(
        "found: {} inserts after the resume (the interrupted one included) read back",
        again.len()
    );
    drop(s);

    // A compute process given the original data-set arguments is accepted
    // and verifies every loaded key it reads.
    let out = Command::new(BIN)
        .args([
            "bench",
            "--workload",
            "ycsb-c",
            "--ops",
            "3000",
            "--threads",
            "1",
        ])
        .args(["--keys", keys_arg, "--fabric", "libfabric:tcp", "--memnode"])
        .args([
            node.addr.as_str(),
            "--token",
            TOKEN,
            "--busy-poll-us",
            "0",
            "--json",
        ])
        .output()
        .expect("run rolex bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"verified\":true"), "{stdout}");
    eprintln!("found: rolex bench ycsb-c against the resumed node verified");
    drop(after);
    drop(node);
    let _ = std::fs::remove_file(&pool);
    let _ = std::fs::remove_file(format!("{pool_arg}.dataset"));
    let _ = std::fs::remove_file(&keys_file);
}

/// `rolex memnode --fabric libfabric:tcp --listen … ARGS`, run to its
/// (expected) failure.
fn memnode_fails(args: &[&str]) -> std::process::Output {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut a = vec!["memnode", "--fabric", "libfabric:tcp", "--listen", &listen];
    a.extend_from_slice(args);
    rolex(&a)
}

/// The word at byte `at` of the file at `path`.
fn word_at(path: &Path, at: usize) -> u64 {
    let b = std::fs::read(path).expect("read");
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn resuming_what_is_not_a_resumable_pool_fails_clearly() {
    let out = memnode_fails(&["--resume"]);
    assert_fails(&out, "--resume needs --pool-file");
    let out = rolex(&["memnode", "--resume", "--pool-file", "/nonexistent"]);
    assert_fails(&out, "--resume serves the pool: give --fabric");

    let missing = tmp("no-such.pool");
    let _ = std::fs::remove_file(&missing);
    let out = memnode_fails(&["--resume", "--pool-file", missing.to_str().unwrap()]);
    assert_fails(&out, "no such file");
    assert_fails(&out, missing.to_str().unwrap());

    let junk = tmp("junk.pool");
    std::fs::write(&junk, vec![7u8; 10_000]).unwrap();
    let out = memnode_fails(&["--resume", "--pool-file", junk.to_str().unwrap()]);
    assert_fails(&out, "not a pool file");
    std::fs::write(&junk, b"short").unwrap();
    let out = memnode_fails(&["--resume", "--pool-file", junk.to_str().unwrap()]);
    assert_fails(&out, "not a pool file");
    let _ = std::fs::remove_file(&junk);

    // A real pool file (laid out by the in-process measurement, on
    // loopback), its layout version changed.
    let pool = tmp("old.pool");
    let p = pool.to_str().unwrap();
    let made = rolex(&[
        "memnode",
        "--dist",
        "uniform",
        "-n",
        "2000",
        "--pool-file",
        p,
        "--rounds",
        "0",
        "--clients",
        "0",
        "--duration",
        "0",
    ]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // The pool starts at the first page past the agent area's ring.
    let ring = word_at(&pool, 96);
    let at = ((128 + ring + 4095) & !4095) as usize;
    let mut bytes = std::fs::read(&pool).unwrap();
    assert_eq!(&bytes[at..at + 8], b"RLXPOOL\0");
    let version = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
    bytes[at + 8..at + 12].copy_from_slice(&(version + 1).to_le_bytes());
    std::fs::write(&pool, &bytes).unwrap();
    let out = memnode_fails(&["--resume", "--pool-file", p]);
    assert_fails(
        &out,
        &format!(
            "layout version {}; this build reads version {version}",
            version + 1
        ),
    );
    eprintln!("found: {}", String::from_utf8_lossy(&out.stderr).trim_end());
    let _ = std::fs::remove_file(&pool);
}
