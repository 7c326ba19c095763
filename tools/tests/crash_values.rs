//! Crash safety of a store with byte values, red-teamed over libfabric
//! `tcp` on 127.0.0.1: `rolex memnode --fabric libfabric:tcp --pool-file F`
//! serves a pool with loaded values of 8..300 bytes (8-slot leaves, a
//! low retraining trigger, so inserts split leaves and models retrain);
//! writers put, overwrite and remove values of 8..300 bytes (inline and
//! out of line) on fresh keys, one operation at a time or 8 in flight
//! (`run_many_values`), journalling each operation as tried, acknowledged
//! or failed (and whether it may have applied). Then something is killed
//! with `SIGKILL` (or stopped):
//!
//! - [`a_memory_node_killed_again_and_again_loses_no_acknowledged_value`]:
//!   the memory node, in several rounds at different moments (some
//!   mid-retraining), and resumes too — at their start, inside their
//!   recovery, inside its value reclaim (step 6: the free-stack head
//!   watched in the file), once recovered; each resume must serve every
//!   acknowledged value byte for byte, and the writes that follow — on
//!   the space the resume gave back — must never hand one block to two
//!   keys;
//! - [`a_memory_node_stopped_past_the_leases_loses_nothing_acknowledged`]:
//!   the memory node stopped (`SIGSTOP`) for twice the lease, operations
//!   in flight, then continued: its lease server ends the writers'
//!   leases and releases their locks; a write that failed saying it did
//!   not apply must not have, every acknowledged one must be there;
//! - [`compute_processes_killed_with_values_in_flight_lose_nothing`]:
//!   compute processes (this binary run again as a child), one after
//!   another, the memory node still running; then a verifying compute
//!   node finds every acknowledged value, no chain locked once the
//!   leases ended, and writes far more values without one block serving
//!   two keys; and again after the memory node is killed and resumed,
//!   and after two more writers are killed on the resumed node.
//!
//! A key's value after the kills must be one of its *candidates*: the
//! last acknowledged one, or one written after it whose outcome is not
//! known (tried, or failed saying it may have applied). Every value names
//! its key and version in its bytes, so a value found under the wrong key
//! (one block handed to two writers) is named as such.
//!
//! Every child runs under a deadline and is killed on every path.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use common::{sosd, tmp, wait_for, Guard, Lines, BIN};
use rolex_core::layout::{AgentArea, Superblock, ValueRegionHeader};
use rolex_host::domain::fabric::probe;
use rolex_host::kv::lease::LeaseClient;
use rolex_host::kv::{KvClient, KvClientConfig, KvError, Reply, ValueRequest};

const TOKEN: &str = "cr4sh";
/// Bound on one child or wait; far above what a run takes.
const LIMIT: Duration = Duration::from_secs(60);
/// Keys loaded: `STRIDE · i` for `i` in `1..=LOADED`.
const LOADED: u64 = 2000;
const STRIDE: u64 = 1000;
/// Fresh keys the writers use (indices `0..KEYS`).
const KEYS: u64 = 3000;
/// The environment variable that makes this binary a writer child (its
/// value: `ADDR ID DEPTH`).
const CHILD: &str = "ROLEX_TEST_CRASH_VALUES_CHILD";

// ---- values and the journal ----

/// splitmix64: a deterministic mix.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `i`-th fresh key: between two loaded keys, never a loaded one;
/// consecutive ones in gaps spread over the range (1009 is prime to the
/// 1999 gaps), several per gap so that leaves split.
fn fresh_key(i: u64) -> u64 {
    let gaps = LOADED - 1;
    let (j, round) = (i % gaps, i / gaps);
    STRIDE * (1 + (j * 1009) % gaps) + 1 + round * 7
}

/// Version `ver` (never 0) of the value of `key`: 8..=300 bytes, its key
/// and version in its first 16 when it has them.
fn value(key: u64, ver: u64) -> Vec<u8> {
    let len = 8 + (mix(key ^ ver.rotate_left(29)) % 293) as usize;
    let mut v: Vec<u8> = (0..len as u64)
        .map(|i| mix(key ^ ver.wrapping_mul(31) ^ (i << 48)) as u8)
        .collect();
    if len >= 16 {
        v[..8].copy_from_slice(&key.to_le_bytes());
        v[8..16].copy_from_slice(&ver.to_le_bytes());
    }
    v
}

/// One journalled step of a writer: version 0 is a remove.
#[derive(Clone, Copy, Debug)]
enum Ev {
    /// About to be posted.
    Tried { key: u64, ver: u64 },
    /// Acknowledged; `present`: the key was there before.
    Acked { key: u64, ver: u64, present: bool },
    /// Failed; `maybe`: it may have applied.
    Failed { key: u64, ver: u64, maybe: bool },
}

impl Ev {
    fn line(self) -> String {
        match self {
            Ev::Tried { key, ver } => format!("T {key} {ver}"),
            Ev::Acked { key, ver, present } => format!("A {key} {ver} {}", present as u8),
            Ev::Failed { key, ver, maybe } => format!("F {key} {ver} {}", maybe as u8),
        }
    }

    fn parse(line: &str) -> Option<Ev> {
        let w: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| w.get(i).and_then(|x| x.parse::<u64>().ok());
        Some(match *w.first()? {
            "T" => Ev::Tried {
                key: n(1)?,
                ver: n(2)?,
            },
            "A" => Ev::Acked {
                key: n(1)?,
                ver: n(2)?,
                present: n(3)? == 1,
            },
            "F" => Ev::Failed {
                key: n(1)?,
                ver: n(2)?,
                maybe: n(3)? == 1,
            },
            _ => return None,
        })
    }
}

/// What each key may hold: its candidates (versions, 0 = absent), from
/// journals of writers that never wrote one key at the same time.
#[derive(Default)]
struct Model {
    cands: HashMap<u64, Vec<u64>>,
    pending: HashMap<u64, Vec<u64>>,
    /// Acknowledged operations.
    acked: usize,
    /// Acknowledgements whose `present` contradicts every candidate.
    wrong_present: Vec<String>,
}

impl Model {
    fn apply(&mut self, e: Ev) {
        match e {
            Ev::Tried { key, ver } => self.pending.entry(key).or_default().push(ver),
            Ev::Acked { key, ver, present } => {
                self.acked += 1;
                self.pending.entry(key).or_default().retain(|&v| v != ver);
                let c = self.cands.entry(key).or_insert_with(|| vec![0]);
                // Pending versions of a dead writer may have landed too.
                let pend = self.pending.remove(&key).unwrap_or_default();
                let could: Vec<u64> = c.iter().chain(&pend).copied().collect();
                if !could.iter().any(|&v| (v != 0) == present) {
                    self.wrong_present.push(format!(
                        "key {key} ver {ver}: present={present}, candidates {could:?}"
                    ));
                }
                *c = vec![ver];
            }
            Ev::Failed { key, ver, maybe } => {
                self.pending.entry(key).or_default().retain(|&v| v != ver);
                if maybe {
                    self.cands.entry(key).or_insert_with(|| vec![0]).push(ver);
                }
            }
        }
    }

    /// Every version still tried and unanswered (its writer died) becomes
    /// a candidate.
    fn settle(&mut self) {
        for (key, pend) in self.pending.drain() {
            self.cands
                .entry(key)
                .or_insert_with(|| vec![0])
                .extend(pend);
        }
    }

    /// Keys whose value is not one of their candidates (looked up through
    /// `get`), described.
    fn wrong(&self, mut get: impl FnMut(u64) -> Result<Option<Vec<u8>>, KvError>) -> Vec<String> {
        let mut keys: Vec<u64> = self.cands.keys().copied().collect();
        keys.sort_unstable();
        let mut bad = Vec::new();
        for key in keys {
            let c = &self.cands[&key];
            let ok = |v: &Option<Vec<u8>>| {
                c.iter().any(|&ver| match (ver, v) {
                    (0, None) => true,
                    (ver, Some(b)) if ver != 0 => *b == value(key, ver),
                    _ => false,
                })
            };
            match get(key) {
                Ok(v) if ok(&v) => {}
                Ok(None) => bad.push(format!("key {key}: absent, candidates {c:?}")),
                Ok(Some(b)) => bad.push(format!(
                    "key {key}: {} B {}, candidates {c:?}",
                    b.len(),
                    describe(&b)
                )),
                Err(e) => bad.push(format!("key {key}: get failed: {e}, candidates {c:?}")),
            }
        }
        bad
    }
}

/// What a value found under some key is (another key's, a stale one).
fn describe(b: &[u8]) -> String {
    if b.len() < 16 {
        return "(short, unnamed)".to_string();
    }
    let k = u64::from_le_bytes(b[..8].try_into().unwrap());
    let v = u64::from_le_bytes(b[8..16].try_into().unwrap());
    if value(k, v) == b {
        format!("naming key {k} version {v}")
    } else {
        format!("naming key {k} version {v}, corrupt")
    }
}

/// A writer's journal: events as they happen (kept in memory, or
/// printed on stdout by a child).
trait Journal {
    fn note(&mut self, e: Ev);
}

impl Journal for Vec<Ev> {
    fn note(&mut self, e: Ev) {
        self.push(e);
    }
}

/// The journal of a child: one line per event, each out before the next
/// operation is posted (stdout is line-buffered).
struct Printed(std::io::StdoutLock<'static>);

impl Journal for Printed {
    fn note(&mut self, e: Ev) {
        let _ = writeln!(self.0, "{}", e.line());
        let _ = self.0.flush();
    }
}

/// A shared in-memory journal, appended to by a writer thread.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<Ev>>>);

impl Journal for Shared {
    fn note(&mut self, e: Ev) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(e);
    }
}

impl Shared {
    fn acked(&self) -> usize {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.iter().filter(|e| matches!(e, Ev::Acked { .. })).count()
    }

    fn take(&self) -> Vec<Ev> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The writer loop: writer `id` (its versions `id << 40 | n`) on the keys
/// `fresh_key(i)` with `i ≡ lane (mod lanes)`, `depth` operations in
/// flight, until the first error, `stop`, or `max_ops`. Puts (inserts and
/// overwrites) three times as often as removes. Returns the error that
/// ended it, if any.
fn write_loop(
    client: &KvClient,
    id: u64,
    (lane, lanes): (u64, u64),
    depth: usize,
    max_ops: usize,
    stop: &AtomicBool,
    j: &mut dyn Journal,
) -> Option<String> {
    let mut s = match client.session() {
        Ok(s) => s,
        Err(e) => return Some(format!("session: {e}")),
    };
    let mut rng = mix(id ^ 0xc0ffee);
    let mut n = 0u64;
    let per = KEYS / lanes;
    while (n as usize) < max_ops && !stop.load(Ordering::Relaxed) {
        // `depth` distinct keys of this lane.
        let mut ops: Vec<(u64, u64)> = Vec::with_capacity(depth);
        while ops.len() < depth {
            rng = mix(rng);
            let key = fresh_key(lane + lanes * (rng % per));
            if ops.iter().any(|&(k, _)| k == key) {
                continue;
            }
            n += 1;
            let ver = if (rng >> 20) % 4 == 0 {
                0
            } else {
                (id << 40) | n
            };
            ops.push((key, ver));
        }
        for &(key, ver) in &ops {
            j.note(Ev::Tried { key, ver });
        }
        let vals: Vec<Vec<u8>> = ops
            .iter()
            .map(|&(k, v)| if v == 0 { Vec::new() } else { value(k, v) })
            .collect();
        let answers: Vec<Result<bool, KvError>> = if depth == 1 {
            let (key, ver) = ops[0];
            vec![if ver == 0 {
                s.remove(key)
            } else {
                s.put(key, &vals[0])
            }]
        } else {
            let reqs: Vec<ValueRequest<'_>> = ops
                .iter()
                .zip(&vals)
                .map(|(&(k, v), b)| {
                    if v == 0 {
                        ValueRequest::Remove(k)
                    } else {
                        ValueRequest::Put(k, b)
                    }
                })
                .collect();
            match s.run_many_values(&reqs) {
                Ok(a) => a
                    .into_iter()
                    .map(|r| match r {
                        Ok(Reply::Present(p)) => Ok(p),
                        Ok(other) => panic!("a write answered {other:?}"),
                        Err(e) => Err(e),
                    })
                    .collect(),
                Err(e) => {
                    // Nothing ran.
                    for &(key, ver) in &ops {
                        j.note(Ev::Failed {
                            key,
                            ver,
                            maybe: false,
                        });
                    }
                    return Some(format!("run_many_values: {e}"));
                }
            }
        };
        let mut first_err = None;
        for (&(key, ver), a) in ops.iter().zip(answers) {
            match a {
                Ok(present) => j.note(Ev::Acked { key, ver, present }),
                Err(e) => {
                    j.note(Ev::Failed {
                        key,
                        ver,
                        maybe: e.may_have_applied(),
                    });
                    first_err.get_or_insert_with(|| format!("key {key} ver {ver}: {e}"));
                }
            }
        }
        if first_err.is_some() {
            return first_err;
        }
    }
    None
}

// ---- processes ----

/// A memory node process: guard, bootstrap address, stderr.
struct Node {
    guard: Guard,
    addr: String,
    stderr: Lines,
}

/// Scratch files of one test: the key file and the pool file.
struct Files {
    keys: PathBuf,
    pool: PathBuf,
}

impl Files {
    fn new(name: &str) -> Files {
        let keys = tmp(&format!("{name}.keys"));
        let loaded: Vec<u64> = (1..=LOADED).map(|i| i * STRIDE).collect();
        std::fs::write(&keys, sosd(&loaded)).expect("write the key file");
        Files {
            keys,
            pool: tmp(&format!("{name}.pool")),
        }
    }

    fn keys(&self) -> &str {
        self.keys.to_str().expect("a UTF-8 path")
    }

    fn pool(&self) -> &str {
        self.pool.to_str().expect("a UTF-8 path")
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for a post-mortem: {}", self.pool());
            return;
        }
        let _ = std::fs::remove_file(&self.keys);
        let _ = std::fs::remove_file(&self.pool);
        let _ = std::fs::remove_file(format!("{}.dataset", self.pool()));
    }
}

/// Agent and value arguments every node of these tests gets.
const AGENT: [&str; 2] = ["--trigger", "8"];

impl Node {
    /// A fresh node loading the key file, values of 8..300 bytes and
    /// `spare_mib` MiB of value region for writes.
    fn fresh(f: &Files, spare_mib: &str) -> Node {
        let mut args = vec!["--keys", f.keys(), "--pool-file", f.pool()];
        args.extend(["--leaf-slots", "8", "--value-size", "8..300"]);
        args.extend(["--value-spare", spare_mib]);
        args.extend(AGENT);
        Node::start(&args)
    }

    /// A node resumed on the pool file, once its recovery report is out
    /// (returned too).
    fn resumed(f: &Files) -> (Node, String) {
        let mut args = vec!["--pool-file", f.pool(), "--resume"];
        args.extend(AGENT);
        let node = Node::start(&args);
        let report = wait_for(LIMIT, || {
            node.stderr
                .all()
                .into_iter()
                .find(|l| l.starts_with("resumed pool file"))
        })
        .unwrap_or_else(|| panic!("no recovery report: {}", node.stderr.text()));
        (node, report)
    }

    fn start(args: &[&str]) -> Node {
        let (guard, addr, stderr) = common::start_memnode(TOKEN, args, LIMIT);
        Node {
            guard,
            addr,
            stderr,
        }
    }

    fn kill(&mut self) {
        self.guard.0.kill().expect("SIGKILL the memory node");
        let _ = self.guard.0.wait();
    }
}

/// A resume killed `when` (the pool file is left as that death left
/// it); its last stderr line.
fn resume_killed(f: &Files, when: KilledResume) -> String {
    let listen = format!("127.0.0.1:{}", common::free_port());
    let mut child = Guard(
        Command::new(BIN)
            .args(["memnode", "--fabric", "libfabric:tcp", "--listen", &listen])
            .args(["--token", TOKEN, "--busy-poll-us", "0"])
            .args(["--pool-file", f.pool(), "--resume"])
            .args(AGENT)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("start a resume"),
    );
    let err = Lines::default();
    err.follow(child.0.stderr.take().expect("stderr"), None);
    match when {
        KilledResume::After(ms) => std::thread::sleep(Duration::from_millis(ms)),
        KilledResume::InReclaim => {
            let word = free_word_reader(&f.pool);
            let before = word();
            let seen = wait_for_fast(LIMIT, || (word() != before).then_some(()));
            assert!(
                seen.is_some(),
                "the free stack never changed: {}",
                err.text()
            );
        }
        KilledResume::AtReport => {
            let seen = wait_for(LIMIT, || (err.count("resumed pool file") > 0).then_some(()));
            assert!(seen.is_some(), "no recovery report: {}", err.text());
        }
    }
    child.0.kill().expect("SIGKILL the resuming node");
    let _ = child.0.wait();
    std::thread::sleep(Duration::from_millis(50));
    err.all().pop().unwrap_or_else(|| "nothing".into())
}

/// The value region of the pool file at `path`: (capacity, `alloc`
/// word: bytes handed out, past the capacity after a claim that did not
/// fit).
fn value_region(path: &std::path::Path) -> (u64, u64) {
    let (capacity, alloc, _) = value_region_free(path);
    (capacity, alloc)
}

/// A reader of the value region's free-stack head word in the pool file
/// at `path`, 8 bytes a read (the file is shared with a running node).
fn free_word_reader(path: &std::path::Path) -> impl Fn() -> u64 {
    use std::os::unix::fs::FileExt;
    let bytes = std::fs::read(path).expect("read the pool file");
    let area = AgentArea::read(&bytes).expect("an agent area");
    let at = area.pool_offset().expect("a pool offset");
    let sb = Superblock::read(&bytes[at as usize..]).expect("a superblock");
    let word_at = at + sb.value_region_offset() + ValueRegionHeader::FREE_OFFSET;
    let file = std::fs::File::open(path).expect("open the pool file");
    move || {
        let mut w = [0u8; 8];
        file.read_exact_at(&mut w, word_at)
            .expect("read the free word");
        u64::from_le_bytes(w)
    }
}

/// `f()` once it is `Some`, trying without pause (yielding) for at most
/// `limit`: to act within microseconds of a change in a file.
fn wait_for_fast<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if let Some(v) = f() {
            return Some(v);
        }
        std::thread::yield_now();
    }
    None
}

/// [`value_region`] and its free stack's head word.
fn value_region_free(path: &std::path::Path) -> (u64, u64, u64) {
    let bytes = std::fs::read(path).expect("read the pool file");
    let area = AgentArea::read(&bytes).expect("an agent area");
    let at = area.pool_offset().expect("a pool offset") as usize;
    let sb = Superblock::read(&bytes[at..]).expect("a superblock");
    let v = at + sb.value_region_offset() as usize;
    let h = ValueRegionHeader::read(&bytes[v..]).expect("a value region");
    (h.capacity(), h.alloc(), h.free())
}

/// A compute node in this process: client and lease.
fn connect(addr: &str) -> (KvClient, LeaseClient) {
    let (pool, lease, _) = common::bootstrap_leased(addr, TOKEN, LIMIT);
    let cfg = KvClientConfig {
        engine: common::tcp_engine(),
        ..KvClientConfig::default()
    }
    .with_lease(&lease);
    (KvClient::connect(cfg, &pool).expect("connect"), lease)
}

/// Chains locked in the pool file now, as `rolex inspect` reports them.
fn locks(f: &Files) -> String {
    let out = Command::new(BIN)
        .args(["inspect", "--models", f.pool()])
        .output()
        .expect("run rolex inspect");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "inspect failed: {text}");
    text.lines()
        .filter(|l| l.contains("chains locked"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Writes `ops` more operations on every key: `rounds` times two compute
/// nodes at once (each its own client and lease, one writing one
/// operation at a time, one 8 in flight, on alternate keys), each closed
/// after its share — its free blocks given back to the pool's free stack,
/// which the next ones pop while others push. Every failure is an error
/// of the test; returns their journal.
fn write_more(addr: &str, id: u64, rounds: u64, ops: usize) -> Vec<Ev> {
    let mut j = Vec::new();
    for r in 0..rounds {
        let writers: Vec<_> = [(0u64, 1usize), (1, 8)]
            .into_iter()
            .map(|(lane, depth)| {
                let addr = addr.to_string();
                std::thread::spawn(move || {
                    let (client, _lease) = connect(&addr);
                    let id = id + 2 * r + lane;
                    let share = ops / (2 * rounds as usize);
                    let mut mine = Vec::new();
                    let stop = AtomicBool::new(false);
                    let err = write_loop(&client, id, (lane, 2), depth, share, &stop, &mut mine);
                    assert!(err.is_none(), "writer {id} failed: {err:?}");
                    client.close().expect("close: give the free blocks back");
                    mine
                })
            })
            .collect();
        for w in writers {
            j.extend(w.join().expect("a writer failed"));
        }
    }
    j
}

/// Asserts that every key holds one of its candidates, through a session
/// of `client`; says what it checked.
fn assert_all_there(m: &Model, client: &KvClient, when: &str) {
    let mut s = client.session().expect("session");
    let bad = m.wrong(|k| s.get_value(k));
    eprintln!(
        "found ({when}): {} of {} keys hold a candidate ({} acknowledged operations so far)",
        m.cands.len() - bad.len(),
        m.cands.len(),
        m.acked
    );
    assert!(
        m.wrong_present.is_empty(),
        "acknowledgements that contradict the journal ({when}): {:?}",
        &m.wrong_present[..m.wrong_present.len().min(10)]
    );
    assert!(
        bad.is_empty(),
        "{} keys wrong ({when}): {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
}

/// `rolex bench ycsb-c` against `node` with the original key file: every
/// loaded key (and its loaded value) read back and verified.
fn assert_loaded_verified(node: &Node, f: &Files) {
    let out = Command::new(BIN)
        .args(["bench", "--workload", "ycsb-c", "--ops", "2000"])
        .args(["--threads", "1", "--keys", f.keys()])
        .args(["--fabric", "libfabric:tcp", "--memnode", &node.addr])
        .args(["--token", TOKEN, "--busy-poll-us", "0", "--json"])
        .output()
        .expect("run rolex bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("\"verified\":true"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---- the memory node killed ----

/// When a resume that is killed before the one that serves dies.
#[derive(Clone, Copy, Debug)]
enum KilledResume {
    /// This long after its start (a recovery takes a few hundred ms here,
    /// most of it before its first step).
    After(u64),
    /// As soon as its recovery report is out: recovered, about to serve.
    AtReport,
    /// As soon as the value region's free-stack head changes in the file
    /// (step 6, the reclaim of value space, has begun: it empties the
    /// stack first, writes the bundles, sets the head last).
    InReclaim,
}

/// Rounds of the memory-node test: acknowledged operations before each
/// kill, and the resumes killed, one after another, before the one that
/// serves (a resume takes about 0.35 s here: the later delays land in
/// its recovery steps).
const NODE_ROUNDS: [(usize, &[KilledResume]); 5] = [
    (700, &[]),
    (450, &[KilledResume::After(0)]),
    (900, &[KilledResume::After(300)]),
    (300, &[KilledResume::InReclaim, KilledResume::AtReport]),
    (
        600,
        &[
            KilledResume::After(270),
            KilledResume::After(300),
            KilledResume::After(330),
            KilledResume::After(360),
            KilledResume::InReclaim,
        ],
    ),
];

#[test]
fn a_memory_node_killed_again_and_again_loses_no_acknowledged_value() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    let f = Files::new("crash-node");
    let mut node = Node::fresh(&f, "2");
    let mut model = Model::default();
    for (round, &(before_kill, killed_resume)) in NODE_ROUNDS.iter().enumerate() {
        let round = round as u64;
        // Two compute nodes: one writing one operation at a time, one 8
        // in flight, on alternate keys.
        let journals: Vec<Shared> = (0..2).map(|_| Shared::default()).collect();
        let writers: Vec<_> = [(0u64, 1usize), (1, 8)]
            .into_iter()
            .map(|(lane, depth)| {
                let (client, lease) = connect(&node.addr);
                let mut j = journals[lane as usize].clone();
                std::thread::spawn(move || {
                    let id = (round + 1) * 16 + lane;
                    let stop = AtomicBool::new(false);
                    let end = write_loop(&client, id, (lane, 2), depth, usize::MAX, &stop, &mut j);
                    // The client of a dead node: dropped off the test's
                    // path.
                    client.abandon_values();
                    std::thread::spawn(move || drop((client, lease)));
                    end
                })
            })
            .collect();
        let acked = || journals.iter().map(Shared::acked).sum::<usize>();
        let reached = wait_for(LIMIT, || (acked() >= before_kill).then_some(()));
        assert!(
            reached.is_some(),
            "only {} acknowledged in {LIMIT:?}",
            acked()
        );
        node.kill();
        let at_kill = acked();
        // A writer whose operation the death left without an answer waits
        // out the engine's timeout (10 s): it is left to end on its own,
        // its journal read as it stands (what it has not answered yet
        // counts as unknown; nothing more can land: the node is dead).
        let _ = wait_for(Duration::from_secs(1), || {
            writers.iter().all(|w| w.is_finished()).then_some(())
        });
        let ends: Vec<String> = writers
            .into_iter()
            .map(|w| {
                if w.is_finished() {
                    format!("{:?}", w.join().expect("a writer panicked"))
                } else {
                    "(still waiting on its operation)".to_string()
                }
            })
            .collect();
        let log = node
            .stderr
            .all()
            .into_iter()
            .rfind(|l| l.starts_with("retrained "))
            .unwrap_or_else(|| "no retraining reported".into());
        eprintln!(
            "injected: round {round}: SIGKILL of the memory node after {at_kill} acknowledged \
             operations (its last report: {log}); the writers ended with {ends:?}"
        );
        for j in &journals {
            j.take().into_iter().for_each(|e| model.apply(e));
        }
        model.settle();
        for &when in killed_resume {
            let before = value_region_free(&f.pool).2;
            let said = resume_killed(&f, when);
            let after = value_region_free(&f.pool).2;
            eprintln!(
                "injected: a resume killed ({when:?}); it said: {said}; free stack head \
                 {before:#x} before, {after:#x} after"
            );
        }
        let (resumed, report) = Node::resumed(&f);
        node = resumed;
        eprintln!("found: {report}");
        let (client, _lease) = connect(&node.addr);
        assert_all_there(&model, &client, &format!("after resume {round}"));
    }
    // Far more writes on the resumed pool, by compute nodes that close
    // and give their space back while others pop it: the value region
    // (2 MiB spare) is refilled from the space the resumes gave back; no
    // block may serve two keys.
    for e in write_more(&node.addr, 1 << 12, 3, 6000) {
        model.apply(e);
    }
    let (client, _lease) = connect(&node.addr);
    assert_all_there(&model, &client, "after 6000 more writes");
    assert_loaded_verified(&node, &f);
    drop(client);
    let held = locks(&f);
    assert!(held.is_empty(), "chains locked at the end: {held}");
}

// ---- the memory node stopped ----

/// `signal` to the memory node's process.
fn signal(node: &Node, signal: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    let r = unsafe { libc::kill(node.guard.0.id() as libc::pid_t, signal) };
    assert_eq!(r, 0, "signal {signal} to the memory node");
}

#[test]
fn a_memory_node_stopped_past_the_leases_loses_nothing_acknowledged() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    let f = Files::new("crash-stop");
    let node = Node::fresh(&f, "2");
    let mut model = Model::default();
    let journals: Vec<Shared> = (0..2).map(|_| Shared::default()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = [(0u64, 1usize), (1, 8)]
        .into_iter()
        .map(|(lane, depth)| {
            let (client, lease) = connect(&node.addr);
            let mut j = journals[lane as usize].clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let end = write_loop(
                    &client,
                    300 + lane,
                    (lane, 2),
                    depth,
                    usize::MAX,
                    &stop,
                    &mut j,
                );
                drop((client, lease));
                end
            })
        })
        .collect();
    let acked = || journals.iter().map(Shared::acked).sum::<usize>();
    let reached = wait_for(LIMIT, || (acked() >= 600).then_some(()));
    assert!(reached.is_some(), "only {} acknowledged", acked());
    // Stopped past the leases (2 s) and the grace before the node ends
    // them, operations in flight; then continued.
    signal(&node, libc::SIGSTOP);
    let at_stop = acked();
    std::thread::sleep(Duration::from_secs(4));
    signal(&node, libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let ends: Vec<Option<String>> = writers
        .into_iter()
        .map(|w| w.join().expect("a writer panicked"))
        .collect();
    eprintln!(
        "injected: SIGSTOP of the memory node for 4 s after {at_stop} acknowledged operations; \
         {} acknowledged in all; the writers ended with {ends:?}",
        acked()
    );
    for j in &journals {
        j.take().into_iter().for_each(|e| model.apply(e));
    }
    model.settle();
    // The stopped writers' locks released once their leases ended; what
    // failed saying it did not apply did not.
    let clear = wait_for(LIMIT, || locks(&f).is_empty().then_some(()));
    assert!(clear.is_some(), "chains locked: {}", locks(&f));
    let (client, _lease) = connect(&node.addr);
    assert_all_there(&model, &client, "after the stop");
    for e in write_more(&node.addr, 1 << 14, 2, 3000) {
        model.apply(e);
    }
    assert_all_there(&model, &client, "after 3000 more writes");
}

// ---- compute processes killed ----

/// Not a test of its own: a writer process's body when this binary runs
/// as a child ([`CHILD`] = `ADDR ID DEPTH`); passes at once otherwise.
#[test]
fn writer_child() {
    let Ok(arg) = std::env::var(CHILD) else {
        return;
    };
    let w: Vec<&str> = arg.split_whitespace().collect();
    let (addr, id, depth) = (w[0], w[1].parse().unwrap(), w[2].parse().unwrap());
    let (client, _lease) = connect(addr);
    let stop = AtomicBool::new(false);
    let mut j = Printed(std::io::stdout().lock());
    // Every child writes every key (lane 0 of 1): one writer at a time.
    let err = write_loop(&client, id, (0, 1), depth, usize::MAX, &stop, &mut j);
    drop(j);
    println!("ended: {err:?}");
    std::thread::sleep(LIMIT);
}

/// Starts writer child `id` on the node at `addr`; its journal lines.
fn spawn_writer(addr: &str, id: u64, depth: usize) -> (Guard, Lines) {
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "writer_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(CHILD, format!("{addr} {id} {depth}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .expect("start a writer process");
    let (out, err) = (Lines::default(), Lines::default());
    out.follow(child.stdout.take().expect("stdout"), None);
    err.follow(child.stderr.take().expect("stderr"), Some("writer"));
    (Guard(child), out)
}

/// Starts writer process `id` with `depth` operations in flight, kills
/// it (`SIGKILL`) once it acknowledged `before_kill`, and adds its
/// journal to `model`.
fn kill_a_writer(
    node: &Node,
    f: &Files,
    model: &mut Model,
    id: u64,
    before_kill: usize,
    depth: usize,
) {
    let (mut child, out) = spawn_writer(&node.addr, id, depth);
    let acked = || out.count("A ");
    let reached = wait_for(LIMIT, || (acked() >= before_kill).then_some(()));
    assert!(
        reached.is_some(),
        "writer {id}: only {} acknowledged: {}",
        acked(),
        out.text()
    );
    child.0.kill().expect("SIGKILL the writer");
    let _ = child.0.wait();
    // Its pipe drained (a line may end half-written: not parsed).
    std::thread::sleep(Duration::from_millis(100));
    let lines = out.all();
    let answered = |l: &&String| l.starts_with("A ") || l.starts_with("F ");
    let pending = lines.iter().filter(|l| l.starts_with("T ")).count() as isize
        - lines.iter().filter(answered).count() as isize;
    eprintln!(
        "injected: writer {id} ({depth} in flight) killed after {} acknowledged operations, \
         {pending} in flight; value region (capacity, alloc) {:?}",
        acked(),
        value_region(&f.pool)
    );
    for e in lines.iter().filter_map(|l| Ev::parse(l)) {
        model.apply(e);
    }
    model.settle();
    assert!(
        !lines.iter().any(|l| l.starts_with("F ")),
        "a writer failed with the node up: {:?}",
        lines.iter().find(|l| l.starts_with("F "))
    );
}

/// Writer processes killed, one after another: acknowledged operations
/// before each kill, operations in flight.
const CHILD_ROUNDS: [(usize, usize); 5] = [(400, 1), (650, 8), (333, 1), (900, 8), (517, 8)];

#[test]
fn compute_processes_killed_with_values_in_flight_lose_nothing() {
    if std::env::var(CHILD).is_ok() {
        return;
    }
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    let f = Files::new("crash-compute");
    let mut node = Node::fresh(&f, "2");
    let mut model = Model::default();
    for (round, &(before_kill, depth)) in CHILD_ROUNDS.iter().enumerate() {
        kill_a_writer(
            &node,
            &f,
            &mut model,
            100 + round as u64,
            before_kill,
            depth,
        );
    }
    // Once the leases ended, no chain is locked; every value is there.
    let clear = wait_for(LIMIT, || locks(&f).is_empty().then_some(()));
    assert!(clear.is_some(), "chains locked: {}", locks(&f));
    let (client, lease) = connect(&node.addr);
    assert_all_there(&model, &client, "after the writers were killed");
    for e in write_more(&node.addr, 1 << 12, 2, 6000) {
        model.apply(e);
    }
    assert_all_there(&model, &client, "after 6000 more writes");
    drop(lease);
    drop(client);
    // The memory node too: its resume takes back what the dead writers
    // held.
    node.kill();
    let (node, report) = Node::resumed(&f);
    eprintln!("found: {report}");
    let (client, _lease) = connect(&node.addr);
    assert_all_there(&model, &client, "after the resume");
    // Writers killed on the resumed node: what they held was popped from
    // the free stack the resume rebuilt, and carved.
    kill_a_writer(&node, &f, &mut model, 200, 700, 8);
    kill_a_writer(&node, &f, &mut model, 201, 450, 1);
    let clear = wait_for(LIMIT, || locks(&f).is_empty().then_some(()));
    assert!(clear.is_some(), "chains locked: {}", locks(&f));
    assert_all_there(&model, &client, "after two more writers were killed");
    for e in write_more(&node.addr, 1 << 13, 3, 6000) {
        model.apply(e);
    }
    assert_all_there(
        &model,
        &client,
        "after 6000 more writes on the resumed node",
    );
    assert_loaded_verified(&node, &f);
}

/// The journal's own check: a model of a known history.
#[test]
fn the_model_keeps_every_outcome_an_unanswered_write_allows() {
    let mut m = Model::default();
    let t = |key, ver| Ev::Tried { key, ver };
    let a = |key, ver, present| Ev::Acked { key, ver, present };
    for e in [t(1, 5), a(1, 5, false), t(1, 6), t(2, 7)] {
        m.apply(e);
    }
    m.settle();
    assert_eq!(m.cands[&1], vec![5, 6]);
    assert_eq!(m.cands[&2], vec![0, 7]);
    m.apply(t(1, 0));
    m.apply(a(1, 0, true));
    assert_eq!(m.cands[&1], vec![0]);
    assert!(m.wrong_present.is_empty());
    m.apply(a(2, 9, false));
    m.apply(a(2, 10, false));
    assert_eq!(m.wrong_present.len(), 1, "{:?}", m.wrong_present);
}
