//! Bad files given to the `rolex` commands that read them: pool files
//! truncated, emptied, replaced by a directory, or with bytes changed in
//! the agent area, the superblock, the model directory, the topology's
//! length word; data-set descriptions (`F.dataset`) missing, emptied,
//! garbled or a whole file of one word; data-set arguments that do not
//! match the pool. `rolex memnode --resume` must refuse each with a
//! non-zero exit and an error naming the problem — never a panic — and
//! leave the file byte for byte as it was; or, where the damage is one
//! it repairs (a topology length word that does not match its blob),
//! serve the pool so that a `rolex bench` run verifies every answer —
//! also where the repair matters most: allocation words (the leaf
//! region's `alloc_num`, the value region's `alloc`) set below what the
//! pool holds, which made new leaves and value blocks be claimed over
//! live ones.
//! `rolex inspect` on the same files: an answer or an error, never a
//! panic or a hang.
//!
//! Every child runs under a deadline and is killed on every path.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;

use common::{free_port, start_memnode, tmp, Guard, BIN};
use rolex_host::domain::fabric::probe;

const TOKEN: &str = "s3cret";
/// Bound on one child; far above what a run takes.
const LIMIT: Duration = Duration::from_secs(120);
/// Keys of the served pools.
const N: &str = "2000";

/// Byte offsets of superblock words (`rolex_core::layout::Superblock`).
const SB_VERSION: usize = 8;
const SB_POOL_SIZE: usize = 16;
const SB_DIRECTORY: usize = 24;
const SB_UPPER_LEN: usize = 104;
const SB_LEAF_SLOTS: usize = 120;

/// Whether libfabric `tcp` can serve here (else the test is skipped).
fn tcp() -> bool {
    match probe("tcp", Some("127.0.0.1")) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("skipped: libfabric tcp not usable here: {e}");
            false
        }
    }
}

/// A pool file (and its `.dataset`) a served memory node of `-n 2000`
/// uniform keys left when it was killed, at `tmp(name)`.
fn served_pool(name: &str) -> PathBuf {
    served_pool_of(name, "8")
}

/// [`served_pool`] with values of `values` bytes.
fn served_pool_of(name: &str, values: &str) -> PathBuf {
    let pool = tmp(name);
    let p = pool.to_str().expect("a UTF-8 path");
    let (guard, _, _) = start_memnode(
        TOKEN,
        &[
            "--dist",
            "uniform",
            "-n",
            N,
            "--pool-file",
            p,
            "--value-size",
            values,
        ],
        LIMIT,
    );
    drop(guard);
    assert!(Path::new(&format!("{p}.dataset")).exists());
    pool
}

/// Where the pool starts in a pool file: the first page past the agent
/// area's ring (whose size is the agent area's word at byte 96).
fn pool_at(bytes: &[u8]) -> usize {
    let ring = u64::from_le_bytes(bytes[96..104].try_into().unwrap());
    ((128 + ring + 4095) & !4095) as usize
}

/// Runs a child to its end, killing it at [`LIMIT`] (a hang guard).
fn run(mut cmd: Command) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("start rolex");
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(LIMIT) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &id.to_string()]).status();
            panic!("rolex did not finish within {LIMIT:?}: {cmd:?}");
        }
    }
}

/// `rolex memnode --fabric libfabric:tcp --resume --pool-file POOL ARGS`,
/// expected to fail at once: its output.
fn resume_fails(pool: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["memnode", "--fabric", "libfabric:tcp", "--listen"])
        .arg(format!("127.0.0.1:{}", free_port()))
        .args([
            "--token",
            TOKEN,
            "--busy-poll-us",
            "0",
            "--resume",
            "--pool-file",
        ])
        .arg(pool)
        .args(args);
    run(cmd)
}

/// A clear refusal: non-zero exit, no panic, one line on stderr that
/// names `what` (and is not a whole file's worth of bytes).
fn assert_refused(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "served: {stderr}");
    assert_ne!(out.status.code(), Some(101), "panic: {stderr}");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(stderr.contains(what), "stderr lacks {what:?}: {stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(line.len() < 1000, "an error line of {} bytes", line.len());
}

/// `rolex inspect POOL --models`: an answer or an error, no panic, no
/// hang.
fn inspect_copes(pool: &Path, case: &str) {
    let mut cmd = Command::new(BIN);
    cmd.arg("inspect").arg(pool).arg("--models");
    let out = run(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        out.status.code(),
        Some(101),
        "{case}: inspect panicked: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{case}: {stderr}");
}

/// A `rolex bench` run of `workload` against the node at `addr` (whose
/// data set has values of `values` bytes).
fn bench(addr: &str, workload: &str, values: &str) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["bench", "--workload", workload, "--ops", "1000"])
        .args(["--threads", "1", "--json", "--dist", "uniform", "-n", N])
        .args(["--value-size", values])
        .args(["--fabric", "libfabric:tcp", "--memnode", addr])
        .args(["--token", TOKEN, "--busy-poll-us", "0"]);
    run(cmd)
}

fn put(bytes: &mut [u8], at: usize, v: &[u8]) {
    bytes[at..at + v.len()].copy_from_slice(v);
}

#[test]
fn damaged_pool_files_are_refused_clearly_and_left_as_they_were() {
    if !tcp() {
        return;
    }
    let pool = served_pool("damaged.pool");
    let good = std::fs::read(&pool).unwrap();
    let at = pool_at(&good);
    let dir_word = u64::from_le_bytes(good[at + 160..at + 168].try_into().unwrap());
    let version = u32::from_le_bytes(
        good[at + SB_VERSION..at + SB_VERSION + 4]
            .try_into()
            .unwrap(),
    );
    type Damage = Box<dyn Fn(&mut Vec<u8>)>;
    let cases: Vec<(&str, Damage, String)> = vec![
        ("empty", Box::new(|b| b.clear()), "not a pool file".into()),
        (
            "cut inside the agent area",
            Box::new(|b| b.truncate(100)),
            "not a pool file".into(),
        ),
        (
            "cut before the superblock",
            Box::new(move |b| b.truncate(at + 100)),
            "not a pool file".into(),
        ),
        (
            "cut by a byte",
            Box::new(|b| {
                b.pop();
            }),
            "not a pool file".into(),
        ),
        (
            "agent area magic",
            Box::new(|b| b[0] ^= 0xff),
            "agent area magic".into(),
        ),
        (
            "pool magic",
            Box::new(move |b| b[at] ^= 0xff),
            "not a pool file".into(),
        ),
        (
            "layout version",
            Box::new(move |b| put(b, at + SB_VERSION, &(version + 1).to_le_bytes())),
            format!("layout version {}", version + 1),
        ),
        (
            "pool size 0",
            Box::new(move |b| put(b, at + SB_POOL_SIZE, &0u64.to_le_bytes())),
            "invalid pool size".into(),
        ),
        (
            "pool size past the file",
            Box::new(move |b| put(b, at + SB_POOL_SIZE, &u64::MAX.to_le_bytes())),
            "not a pool file".into(),
        ),
        (
            "directory over the superblock",
            Box::new(move |b| put(b, at + SB_DIRECTORY, &0u64.to_le_bytes())),
            "overlaps".into(),
        ),
        (
            "leaf slots 0",
            Box::new(move |b| put(b, at + SB_LEAF_SLOTS, &0u32.to_le_bytes())),
            "leaf slots".into(),
        ),
        (
            "directory word past the pool",
            Box::new(move |b| put(b, at + 160, &(1u64 << 40).to_le_bytes())),
            "out of bounds".into(),
        ),
        (
            "directory word off by one",
            Box::new(move |b| put(b, at + 160, &(dir_word + 1).to_le_bytes())),
            "error".into(),
        ),
    ];
    let case_file = tmp("damaged-case.pool");
    std::fs::copy(
        format!("{}.dataset", pool.display()),
        format!("{}.dataset", case_file.display()),
    )
    .unwrap();
    for (name, damage, what) in &cases {
        let mut bytes = good.clone();
        damage(&mut bytes);
        std::fs::write(&case_file, &bytes).unwrap();
        let out = resume_fails(&case_file, &[]);
        assert_refused(&out, what);
        assert!(
            std::fs::read(&case_file).unwrap() == bytes,
            "{name}: the refused resume changed the file"
        );
        eprintln!(
            "injected: {name}; found: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .find(|l| l.starts_with("error"))
                .unwrap_or("")
        );
        inspect_copes(&case_file, name);
    }
    // A directory where the pool file should be.
    let dir = tmp("a-directory.pool");
    std::fs::create_dir_all(&dir).unwrap();
    assert_refused(&resume_fails(&dir, &[]), &dir.display().to_string());
    inspect_copes(&dir, "a directory");
    let _ = std::fs::remove_dir(&dir);
    for f in [&pool, &case_file] {
        let _ = std::fs::remove_file(f);
        let _ = std::fs::remove_file(format!("{}.dataset", f.display()));
    }
}

/// Regression: `--resume` recovered the pool (writing to it) before it
/// read the data-set description and compared the data-set arguments, so
/// a resume refused for those reasons had already changed the file.
#[test]
fn a_resume_refused_for_its_description_or_arguments_leaves_the_file_as_it_was() {
    if !tcp() {
        return;
    }
    let pool = served_pool("refused.pool");
    let desc = PathBuf::from(format!("{}.dataset", pool.display()));
    let stored = std::fs::read(&desc).unwrap();
    let before = std::fs::read(&pool).unwrap();
    let unchanged = |case: &str| {
        assert!(
            std::fs::read(&pool).unwrap() == before,
            "{case}: the refused resume changed the pool file"
        );
    };
    // Arguments naming another data set.
    let out = resume_fails(&pool, &["--dist", "uniform", "-n", "2001"]);
    assert_refused(&out, "holds another data set");
    unchanged("other arguments");
    for (case, text, what) in [
        ("missing", None, "data-set description"),
        ("empty", Some(Vec::new()), "lacks source"),
        (
            "garbled",
            Some(b"\xff\xfe not text".to_vec()),
            "cannot be read",
        ),
        (
            "one huge word",
            Some(vec![b'x'; 1 << 20]),
            "is not key=value",
        ),
    ] {
        match text {
            None => std::fs::remove_file(&desc).unwrap(),
            Some(t) => std::fs::write(&desc, t).unwrap(),
        }
        let out = resume_fails(&pool, &[]);
        assert_refused(&out, what);
        unchanged(case);
        eprintln!(
            "injected: description {case}; found: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    let _ = std::fs::remove_file(&pool);
    let _ = std::fs::remove_file(&desc);
    drop(stored);
}

/// Regression: a topology length word (`upper_len`) that does not match
/// the blob it names passed the resume's checks (the agent reads the blob
/// by its own count) and the node served a pool that no compute node
/// could connect to ("the topology blob … does not decode"). The resume
/// now publishes the topology again; a bench run verifies.
#[test]
fn a_damaged_topology_length_is_published_again_and_served() {
    if !tcp() {
        return;
    }
    let pool = served_pool("upper-len.pool");
    let mut bytes = std::fs::read(&pool).unwrap();
    let at = pool_at(&bytes);
    let len = u64::from_le_bytes(
        bytes[at + SB_UPPER_LEN..at + SB_UPPER_LEN + 8]
            .try_into()
            .unwrap(),
    );
    put(&mut bytes, at + SB_UPPER_LEN, &(len + 8).to_le_bytes());
    std::fs::write(&pool, &bytes).unwrap();
    let p = pool.to_str().unwrap();
    let (mut guard, addr, stderr): (Guard, _, _) =
        start_memnode(TOKEN, &["--pool-file", p, "--resume"], LIMIT);
    for workload in ["ycsb-c", "ycsb-d"] {
        let out = bench(&addr, workload, "8");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("\"verified\":true"),
            "{workload}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    eprintln!(
        "found: upper_len {} (the blob's {len}) resumed; ycsb-c and ycsb-d verified",
        len + 8
    );
    assert!(
        guard.0.try_wait().ok().flatten().is_none(),
        "the node exited: {}",
        stderr.text()
    );
    drop(guard);
    let _ = std::fs::remove_file(&pool);
    let _ = std::fs::remove_file(format!("{p}.dataset"));
}

/// Regression: allocation words below what the pool holds — the leaf
/// region's `alloc_num` (pool offset of the leaf region) and the value
/// region's `alloc` — passed the resume, and compute nodes then claimed
/// live leaves and value blocks anew: an insert-only run failed ("a
/// locked chain does not cover its key") and a ycsb-a run's gets spun
/// through a million retries (minutes) on values another key's update
/// had overwritten. The resume now raises both past what the models hold
/// and says so; the same runs verify.
#[test]
fn allocation_words_set_below_the_live_data_are_raised_and_nothing_is_overwritten() {
    if !tcp() {
        return;
    }
    // Superblock words: leaf region and value region offsets.
    const SB_LEAF_REGION: usize = 80;
    const SB_VALUE_REGION: usize = 128;
    let pool = served_pool_of("allocs.pool", "100");
    let mut bytes = std::fs::read(&pool).unwrap();
    let at = pool_at(&bytes);
    let word = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let leaves = at + word(&bytes, at + SB_LEAF_REGION) as usize;
    let values = at + word(&bytes, at + SB_VALUE_REGION) as usize;
    let (alloc_num, alloc) = (word(&bytes, leaves), word(&bytes, values));
    assert!(alloc_num > 0 && alloc > 0, "a loaded pool");
    put(&mut bytes, leaves, &0u64.to_le_bytes());
    put(&mut bytes, values, &(alloc / 2).to_le_bytes());
    std::fs::write(&pool, &bytes).unwrap();
    let p = pool.to_str().unwrap();
    let (guard, addr, stderr): (Guard, _, _) =
        start_memnode(TOKEN, &["--pool-file", p, "--resume"], LIMIT);
    let said = common::wait_for(LIMIT, || {
        stderr
            .text()
            .lines()
            .find(|l| l.contains("allocation words"))
            .map(str::to_string)
    })
    .unwrap_or_else(|| panic!("no word of the raise: {}", stderr.text()));
    assert!(
        said.contains(&format!("raised by {alloc_num} leaves"))
            && said.contains(&format!("alloc by {} bytes", alloc - alloc / 2)),
        "{said}"
    );
    eprintln!("found: {said}");
    // (insert-only verifies the keys it inserts, beside ycsb-a's updates.)
    for workload in ["ycsb-a", "insert-only"] {
        let out = bench(&addr, workload, "100");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("\"verified\":true"),
            "{workload}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop(guard);
    let _ = std::fs::remove_file(&pool);
    let _ = std::fs::remove_file(format!("{p}.dataset"));
}
