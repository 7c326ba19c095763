//! Value space a killed compute process held comes back when the memory
//! node resumes its pool file: `rolex memnode --fabric libfabric:tcp
//! --pool-file F` with a small value region; a compute process (this test
//! binary run again as a child) fills the region with 64 KiB values,
//! deletes half of them — its freed blocks, the tails of its chunks, stay
//! in its memory — and is killed with `SIGKILL` without closing. The
//! memory node is killed too and resumed (`--resume`): its report names
//! what it reclaimed (as does `rolex inspect` on the file), and a new
//! compute node writes far more than the
//! space the region had left before the resume (none on the free stack,
//! less than a chunk unclaimed), without `ValueSpaceFull`, and every value
//! — its own and those the killed process kept — reads back.
//!
//! Every child runs under a deadline and is killed on every path.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;

use common::{sosd, tmp, wait_for, Guard, Lines};
use rolex_core::layout::{block_class, AgentArea, FreeHead, Superblock, ValueRegionHeader};
use rolex_host::domain::fabric::probe;
use rolex_host::kv::lease::LeaseClient;
use rolex_host::kv::{KvClient, KvClientConfig, KvError};

const TOKEN: &str = "s3cret";
/// Bound on one child or wait; far above what a run takes.
const LIMIT: Duration = Duration::from_secs(120);
/// The environment variable that makes this binary the killed client
/// (its value: the memory node's address).
const CHILD: &str = "ROLEX_TEST_VALUE_RECLAIM_CHILD";
/// Bytes of the killed client's values.
const BIG: usize = 64 << 10;
/// Keys the killed client writes: `FIRST + i`.
const FIRST: u64 = 1 << 40;

/// A memory node process, once its banner is out.
fn start_node(args: &[&str]) -> (Guard, String, Lines) {
    common::start_memnode(TOKEN, args, LIMIT)
}

fn connect(addr: &str) -> (KvClient, LeaseClient) {
    let (pool, lease, _) = common::bootstrap_leased(addr, TOKEN, LIMIT);
    let cfg = KvClientConfig {
        engine: common::tcp_engine(),
        lock_owner: lease.owner(),
        ..KvClientConfig::default()
    };
    (KvClient::connect(cfg, &pool).expect("connect"), lease)
}

/// The value of `key` written by write `id`: `len` bytes naming both.
fn value(key: u64, id: u64, len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len as u64)
        .map(|i| (key ^ id.rotate_left(7) ^ i.wrapping_mul(31)) as u8)
        .collect();
    v[..8].copy_from_slice(&key.to_le_bytes());
    v[8..16].copy_from_slice(&id.to_le_bytes());
    v
}

/// The value region of the pool file at `path`: (capacity, `alloc`,
/// `free` word).
fn value_region(path: &Path) -> (u64, u64, u64) {
    let bytes = std::fs::read(path).expect("read the pool file");
    let area = AgentArea::read(&bytes).expect("an agent area");
    let at = area.pool_offset().expect("a pool offset") as usize;
    let sb = Superblock::read(&bytes[at..]).expect("a superblock");
    let v = at + sb.value_region_offset() as usize;
    let h = ValueRegionHeader::read(&bytes[v..]).expect("a value region");
    (h.capacity(), h.alloc(), h.free())
}

/// The killed client (run as a child of the test below; a no-op when
/// this binary runs as tests do): fills the value region, deletes every
/// other value, says so on stdout and waits to be killed.
#[test]
fn killed_client_child() {
    let Ok(addr) = std::env::var(CHILD) else {
        return;
    };
    let (client, _lease) = connect(&addr);
    let mut s = client.session().expect("session");
    let mut n = 0u64;
    loop {
        let k = FIRST + n;
        match s.put(k, &value(k, 1, BIG)) {
            Ok(_) => n += 1,
            Err(KvError::ValueSpaceFull { .. }) => break,
            Err(e) => panic!("put {k}: {e}"),
        }
    }
    for i in (0..n).step_by(2) {
        assert!(s.remove(FIRST + i).expect("remove"));
    }
    let (claimed, free) = client.stats().value_space;
    println!("CHILD HOLDS {n} {claimed} {free}");
    let _ = std::io::stdout().flush();
    std::thread::sleep(LIMIT);
    panic!("not killed within {LIMIT:?}");
}

#[test]
fn a_killed_clients_value_space_comes_back_when_the_node_resumes() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    let pool = tmp("vreclaim.pool");
    let keys_file = tmp("vreclaim.keys");
    let loaded: Vec<u64> = (1..=500u64).map(|i| i * 1000).collect();
    std::fs::write(&keys_file, sosd(&loaded)).expect("write the key file");
    let pool_arg = pool.to_str().expect("a UTF-8 path");
    let keys_arg = keys_file.to_str().expect("a UTF-8 path");
    let (mut node, addr, _) = start_node(&[
        "--keys",
        keys_arg,
        "--pool-file",
        pool_arg,
        "--value-spare",
        "8",
    ]);

    // The client process: fills, deletes half, is killed holding it.
    let mut child = Guard(
        Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--exact", "killed_client_child", "--nocapture"])
            .env(CHILD, &addr)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the client process"),
    );
    let (out, err) = (Lines::default(), Lines::default());
    out.follow(child.0.stdout.take().expect("stdout"), None);
    err.follow(child.0.stderr.take().expect("stderr"), Some("client"));
    let holds = wait_for(LIMIT, || {
        out.all()
            .into_iter()
            .find(|l| l.starts_with("CHILD HOLDS "))
    })
    .unwrap_or_else(|| panic!("the client never filled the region: {}", err.text()));
    let words: Vec<u64> = holds
        .split_whitespace()
        .skip(2)
        .map(|w| w.parse().expect("a number"))
        .collect();
    let (written, claimed, held) = (words[0], words[1], words[2]);
    child.0.kill().expect("SIGKILL the client");
    let _ = child.0.wait();
    node.0.kill().expect("SIGKILL the memory node");
    let _ = node.0.wait();
    let (capacity, alloc, free) = value_region(&pool);
    let free_before = capacity.saturating_sub(alloc);
    eprintln!(
        "injected: a client that wrote {written} values of {BIG} B, deleted half and held \
         {held} of its {claimed} claimed bytes free, killed; then the memory node killed \
         (value region {capacity} B, {alloc} handed out, free stack head {free:#x})"
    );
    assert!(
        FreeHead::from_word(free).is_empty(),
        "nothing was given back"
    );
    assert!(held >= (written / 2) * block_class(BIG).unwrap());

    let (node, addr, stderr) = start_node(&["--pool-file", pool_arg, "--resume"]);
    let report = wait_for(LIMIT, || {
        stderr
            .all()
            .into_iter()
            .find(|l| l.starts_with("resumed pool file"))
    })
    .unwrap_or_else(|| panic!("no recovery report: {}", stderr.text()));
    eprintln!("found: {report}");
    assert!(report.contains("reclaimed onto the free stack"), "{report}");
    // `rolex inspect` shows the rebuilt stack (the file is the pool).
    let inspect = common::rolex(&["inspect", pool_arg]);
    let shown = String::from_utf8_lossy(&inspect.stdout);
    let line = shown
        .lines()
        .find(|l| l.starts_with("values: ") && l.contains("given back"))
        .unwrap_or_else(|| panic!("no values line: {shown}"));
    eprintln!("found: rolex inspect: {line}");
    let reclaimed = report
        .split("KiB named by slots, ")
        .nth(1)
        .and_then(|r| r.split(" KiB").next())
        .and_then(|n| n.parse::<u64>().ok())
        .expect("the reclaimed KiB in the report");
    assert!(
        line.starts_with(&format!("values: {} bytes given back", reclaimed << 10)),
        "{line} / {report}"
    );

    // A new client writes values of several sizes, far more than the
    // region had left.
    let (client, _lease) = connect(&addr);
    let mut s = client.session().expect("session");
    let lens = [BIG, 100, 5000, 20_000, 1000];
    let mut bytes = 0u64;
    let mut mine = Vec::new();
    let target = free_before + held * 3 / 4;
    while bytes < target {
        let i = mine.len() as u64;
        let (k, len) = (FIRST + 1_000_000 + i, lens[(i % 5) as usize]);
        s.put(k, &value(k, 2, len))
            .unwrap_or_else(|e| panic!("put {i} ({bytes} of {target} B) after the resume: {e}"));
        bytes += block_class(len).unwrap();
        mine.push((k, len));
    }
    for &(k, len) in &mine {
        assert_eq!(
            s.get_value(k).expect("get"),
            Some(value(k, 2, len)),
            "key {k}"
        );
    }
    for i in 0..written {
        let k = FIRST + i;
        let want = (i % 2 == 1).then(|| value(k, 1, BIG));
        assert_eq!(
            s.get_value(k).expect("get"),
            want,
            "the killed client's key {k}"
        );
    }
    eprintln!(
        "found: {} values ({bytes} B of blocks) written after the resume, where {free_before} B \
         were left before it, and read back with the killed client's {} kept ones",
        mine.len(),
        written / 2
    );
    drop(s);
    drop(client);
    drop(node);
    let _ = std::fs::remove_file(&pool);
    let _ = std::fs::remove_file(format!("{pool_arg}.dataset"));
    let _ = std::fs::remove_file(&keys_file);
}
