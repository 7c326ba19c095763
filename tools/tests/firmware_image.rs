//! The freestanding firmware image in CI: it is built (`tools/firmware`),
//! is a static executable with no dynamic section and no libc, and serves a
//! real pool. The pool is laid out and bulk-loaded by the hosted memory
//! node in a file in `/dev/shm` (agent area, then pool), registered with a
//! loopback engine, so host-side compute nodes (`KvClient`) insert through
//! the loopback NIC while the image — another process, mapping the same
//! file — drains the CirQ their SLT claims fill and retrains. The checks
//! are the hosted agent's: every model retrained and redirected (old
//! record retired with a forward pointer), no key lost (gets and a full
//! range scan against a `BTreeMap`). Corrupted pools (bad magic, wrong
//! layout version, a CirQ entry naming no model) are refused or skipped
//! with a logged error and no change to the data; the log is decoded with
//! `rolex inspect --log`.
//!
//! Set `ROLEX_FIRMWARE_IMAGE` to a built image to skip the build.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rolex_core::layout::{AgentArea, AgentState, CirqHeader, ModelRecord, ModelState, Superblock};
use rolex_host::kv::{KvClient, KvClientConfig};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

/// The image, built once per test process.
fn image() -> &'static Path {
    static IMAGE: OnceLock<PathBuf> = OnceLock::new();
    IMAGE.get_or_init(|| {
        if let Some(p) = std::env::var_os("ROLEX_FIRMWARE_IMAGE") {
            return PathBuf::from(p);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("firmware");
        let out = Command::new("bash")
            .arg(&script)
            .arg("host")
            .output()
            .expect("run tools/firmware");
        assert!(
            out.status.success(),
            "tools/firmware failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let last = stdout
            .lines()
            .last()
            .expect("tools/firmware printed a path");
        PathBuf::from(last.trim())
    })
}

/// A pool file in /dev/shm (or the temp dir), removed on drop.
struct PoolFile(PathBuf);

impl PoolFile {
    fn new(name: &str) -> Self {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        Self(dir.join(format!("rolex-fw-{}-{name}", std::process::id())))
    }
}

impl Drop for PoolFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn node(pairs: &[(u64, u64)], file: &PoolFile, trigger: u64) -> MemoryNode {
    MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 8,
            retrain_trigger: trigger,
            retraining_thread: false,
            spare_leaf_factor: 64.0,
            pool_file: Some(file.0.clone()),
            log_capacity: 1 << 20,
            ..MemoryNodeConfig::default()
        },
        pairs,
    )
    .unwrap()
}

fn area(node: &MemoryNode) -> AgentArea {
    node.agent_area().expect("file-backed pool").1
}

/// Waits (bounded) until `f` holds; false if it never did.
fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// Waits for the image to exit (bounded; killed and failed otherwise).
fn exit_code(mut child: Child) -> i32 {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code().expect("the image exited, not killed by a signal");
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the image did not exit");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn spawn(file: &PoolFile) -> Child {
    Command::new(image())
        .arg(&file.0)
        .spawn()
        .expect("start the image")
}

/// The image's log, decoded by `rolex inspect --log`.
fn log(file: &PoolFile) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rolex"))
        .arg("inspect")
        .arg(&file.0)
        .arg("--log")
        .arg("--elf")
        .arg(image())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rolex inspect failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn superblock(node: &MemoryNode) -> Superblock {
    let head = node
        .pool_handle()
        .to_vec(0, Superblock::SIZE as usize)
        .unwrap();
    Superblock::read(&head).unwrap()
}

fn directory(node: &MemoryNode) -> Vec<u64> {
    let sb = superblock(node);
    (0..sb.model_count())
        .map(|m| {
            node.pool_handle()
                .load_u64(sb.directory_entry_offset(m).unwrap())
                .unwrap()
        })
        .collect()
}

#[test]
fn the_image_is_static_and_has_no_libc() {
    let img = image();
    let d = Command::new("readelf")
        .arg("-d")
        .arg(img)
        .output()
        .expect("readelf (binutils)");
    let d = String::from_utf8_lossy(&d.stdout);
    assert!(
        d.contains("There is no dynamic section"),
        "readelf -d:\n{d}"
    );
    let h = Command::new("readelf")
        .arg("-lh")
        .arg(img)
        .output()
        .unwrap();
    let h = String::from_utf8_lossy(&h.stdout);
    assert!(
        h.contains("EXEC (Executable file)"),
        "not a fixed-address executable:\n{h}"
    );
    assert!(!h.contains("INTERP"), "asks for a dynamic loader:\n{h}");
    let nm = Command::new("nm").arg(img).output().expect("nm (binutils)");
    assert!(nm.status.success());
    let nm = String::from_utf8_lossy(&nm.stdout);
    for line in nm.lines() {
        let kind = line.split_whitespace().rev().nth(1).unwrap_or("");
        assert!(
            kind != "U" && kind != "w" && kind != "v",
            "undefined symbol: {line}"
        );
        for libc in ["GLIBC", "__libc_", "_IO_", "malloc", "printf", "pthread"] {
            assert!(!line.contains(libc), "libc symbol: {line}");
        }
    }
    assert!(nm.contains(" T _start"), "no _start entry point");
}

#[test]
fn the_image_retrains_every_model_while_clients_insert() {
    let file = PoolFile::new("serve");
    let pairs: Vec<(u64, u64)> = (0..256u64).map(|i| (i * 1000, i)).collect();
    // A trigger above 128: the image retrains only what compute nodes
    // queue through the CirQ (at SLT slot 128).
    let node = node(&pairs, &file, 10_000);
    let models = node.model_count();
    assert!(models >= 8, "{models} models");
    let before = directory(&node);
    let child = spawn(&file);
    assert!(
        wait_for(Duration::from_secs(20), || area(&node).state()
            == AgentState::Running),
        "the image did not start: {:?}",
        area(&node).state()
    );

    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let done = AtomicBool::new(false);
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let written: Vec<Vec<(u64, u64)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2u64)
            .map(|c| {
                let (client, done) = (&client, &done);
                s.spawn(move || {
                    let mut sess = client.session().unwrap();
                    let mut rng = rand::rngs::StdRng::seed_from_u64(c + 7);
                    let mut mine = Vec::new();
                    // Bounded: enough to fill every model's SLT many times.
                    for i in 0..400_000u64 {
                        if done.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = rng.gen_range(0..256_000u64) * 2 + c;
                        sess.insert(k, i).unwrap();
                        mine.push((k, i));
                    }
                    mine
                })
            })
            .collect();
        let all = wait_for(Duration::from_secs(120), || {
            directory(&node)
                .iter()
                .zip(&before)
                .all(|(now, then)| now != then)
        });
        done.store(true, Ordering::Relaxed);
        let w = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert!(all, "not every model was retrained: {:?}", area(&node));
        w
    });
    node.stop_external_agent().unwrap();
    assert_eq!(exit_code(child), 0);
    for (k, v) in written.into_iter().flatten() {
        model.insert(k, v);
    }

    // Every model was retrained and redirected: the directory names a new
    // record, the old one is retired and forwards to a live record.
    let sb = superblock(&node);
    let after = directory(&node);
    for (m, (&old, &new)) in before.iter().zip(&after).enumerate() {
        assert_ne!(old, new, "model {m} was not retrained");
        let st = ModelState::from_raw(node.pool_handle().load_u64(old).unwrap());
        assert!(
            st.is_retired() && st.forward().is_some(),
            "model {m}: {st:?}"
        );
        let rb = node
            .pool_handle()
            .to_vec(new, ModelRecord::SIZE as usize)
            .unwrap();
        let r = ModelRecord::read(&rb).unwrap();
        r.check(new, &sb).unwrap();
        assert!(r.state().generation() >= 1 && !r.state().is_frozen());
    }
    // No key was lost.
    let mut sess = client.session().unwrap();
    for (&k, &v) in &model {
        assert_eq!(sess.get(k).unwrap(), Some(v), "key {k}");
    }
    let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(sess.range(0, u64::MAX).unwrap(), want);
    // The image's own account, and the requests that reached it.
    let a = area(&node);
    assert_eq!(a.state(), AgentState::Stopped);
    assert!(a.retrains() >= models, "{a:?}");
    assert_eq!((a.failures(), a.skipped()), (0, 0));
    assert!(client.stats().retrain_requests >= models);
    let text = log(&file);
    assert!(text.contains("attached:"), "{text}");
    assert!(
        text.matches("retrained: record").count() as u64 >= models,
        "{text}"
    );
    assert!(text.contains("INFO  stopped:"), "{text}");
}

/// A snapshot of the pool without the CirQ (which the agent consumes).
fn data(node: &MemoryNode) -> Vec<u8> {
    let sb = superblock(node);
    let mut all = node
        .pool_handle()
        .to_vec(0, node.pool_handle().len() as usize)
        .unwrap();
    let at = sb.cirq_offset() as usize;
    all[at..at + sb.cirq_len() as usize].fill(0);
    all
}

#[test]
fn a_pool_with_a_bad_magic_or_version_is_refused_untouched() {
    let pairs: Vec<(u64, u64)> = (0..64u64).map(|i| (i * 10, i)).collect();
    for (name, word, value, says) in [
        ("magic", 0u64, 0x0bad_0bad_0bad_0badu64, "magic"),
        ("version", 8, 99, "version 99"),
    ] {
        let file = PoolFile::new(name);
        let node = node(&pairs, &file, 1);
        let mh = node.pool_handle();
        let old = mh.load_u64(word).unwrap();
        let value = if word == 8 {
            (old & !0xffff_ffff) | value
        } else {
            value
        };
        mh.store_u64(word, value).unwrap();
        let snapshot = mh.to_vec(0, mh.len() as usize).unwrap();
        assert_eq!(exit_code(spawn(&file)), 3, "{name}");
        assert_eq!(
            mh.to_vec(0, mh.len() as usize).unwrap(),
            snapshot,
            "{name}: pool changed"
        );
        assert_eq!(area(&node).state(), AgentState::Failed);
        let text = log(&file);
        assert!(
            text.contains("ERROR pool refused, nothing touched"),
            "{text}"
        );
        assert!(text.contains(says), "{name}: {text}");
    }
}

#[test]
fn a_cirq_entry_naming_no_model_is_skipped_and_a_pool_going_bad_stops_the_image() {
    let file = PoolFile::new("cirq");
    let pairs: Vec<(u64, u64)> = (0..64u64).map(|i| (i * 10, i)).collect();
    let node = node(&pairs, &file, 10_000);
    let models = node.model_count();
    let sb = superblock(&node);
    let mh = node.pool_handle();
    // Queue model `models + 7` the way a compute node queues one.
    let base = sb.cirq_offset();
    let cap = mh.load_u64(base + CirqHeader::CAPACITY_OFFSET).unwrap();
    let t = mh.load_u64(base + CirqHeader::TAIL_OFFSET).unwrap();
    mh.store_u64(base + CirqHeader::TAIL_OFFSET, t + 1).unwrap();
    mh.store_u64(
        base + CirqHeader::slot_offset(t, cap).unwrap(),
        CirqHeader::encode_slot(t, models + 7).unwrap(),
    )
    .unwrap();
    let snapshot = data(&node);
    let child = spawn(&file);
    assert!(wait_for(Duration::from_secs(20), || area(&node).skipped() == 1));
    assert_eq!(data(&node), snapshot, "the data changed");
    // Now the pool goes bad under the running image: it stops, untouched.
    mh.store_u64(0, 7).unwrap();
    assert_eq!(exit_code(child), 4);
    let a = area(&node);
    assert_eq!((a.state(), a.retrains()), (AgentState::Failed, 0));
    let text = log(&file);
    assert!(
        text.contains(&format!(
            "names model {}, but the directory has {models} models: skipped",
            models + 7
        )),
        "{text}"
    );
    assert!(
        text.contains("ERROR pool corrupted, stopping without touching it"),
        "{text}"
    );
}

#[test]
fn the_probe_s_atomics_and_the_host_s_agree_on_the_mapped_file() {
    use rolex_core::layout::AtomicsProbe as P;
    use std::sync::atomic::AtomicU64;
    let file = PoolFile::new("probe");
    std::fs::write(&file.0, vec![0u8; 4096]).unwrap();
    let map = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file.0)
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: a fresh shared mapping of the 4 KiB file, unmapped below
    // after its last use; every access to it is atomic.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            map.as_raw_fd(),
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED);
    // SAFETY: each word lies in the page-aligned mapping, which outlives
    // the uses below.
    let word = |at: u64| unsafe { &*base.cast::<u8>().add(at as usize).cast::<AtomicU64>() };
    let child = Command::new(image())
        .arg(&file.0)
        .arg("probe-atomics")
        .spawn()
        .unwrap();
    assert!(wait_for(Duration::from_secs(20), || word(P::READY_OFFSET)
        .load(Ordering::SeqCst)
        == P::READY));
    word(P::GO_OFFSET).store(50_000, Ordering::SeqCst);
    let mut host = 0u64;
    while word(P::DONE_OFFSET).load(Ordering::SeqCst) == 0 {
        word(P::FAA_OFFSET).fetch_add(1, Ordering::SeqCst);
        let cas = word(P::CAS_OFFSET);
        let mut seen = cas.load(Ordering::SeqCst);
        while let Err(now) =
            cas.compare_exchange(seen, seen + 1, Ordering::SeqCst, Ordering::SeqCst)
        {
            seen = now;
        }
        host += 1;
    }
    assert_eq!(exit_code(child), 0);
    assert_eq!(word(P::AGENT_ROUNDS_OFFSET).load(Ordering::SeqCst), 50_000);
    assert_eq!(word(P::FAA_OFFSET).load(Ordering::SeqCst), 50_000 + host);
    assert_eq!(word(P::CAS_OFFSET).load(Ordering::SeqCst), 50_000 + host);
    assert_eq!(word(P::CAS_REFUSED_OFFSET).load(Ordering::SeqCst), 50_000);
    // SAFETY: the mapping made above; no word reference is used after.
    unsafe { libc::munmap(base, 4096) };
}
