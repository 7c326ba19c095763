//! `rolex bluefield-emu`: the memory-node agent's aarch64 firmware image on
//! emulated Cortex-A72 cores, serving a pool shared with host compute
//! nodes — the BlueField path run without a BlueField.
//!
//! The image (`./tools/firmware virt`: the QEMU `virt` board of
//! `dpu-firmware/image`) boots in `qemu-system-aarch64 -M virt -cpu
//! cortex-a72 -smp 2 -semihosting`. Its memory is a file in `/dev/shm`
//! that QEMU maps shared (`-object memory-backend-file,…,share=on`) and
//! shows the guest as an `ivshmem-plain` PCI device's memory, as a
//! BlueField's DRAM is shared with its host over PCIe; this process lays
//! the pool out in the same file (`MemoryNode` with `pool_file`, agent area
//! first) and its compute nodes (loopback clients on that pool) insert
//! until every model was queued through the CirQ, retrained by the
//! emulated agent and redirected. Then it stops the agent, checks every
//! model's redirection and reads every key back against a `BTreeMap`,
//! decodes the agent's defmt log with the image's ELF (the decoder of
//! `rolex inspect --log --elf IMAGE`, which reads a `--pool-file` kept
//! afterwards), and prints one JSON line last:
//! `{"arch","cpu","models_retrained","keys_verified","verified",
//! "agent_log_lines"}`. Any mismatch is an error (non-zero exit).
//!
//! With `--probe-atomics` it instead checks the premise: the guest's
//! `CAS`/`FAA` (the agent's `SharedBytes` atomics, exclusive load/store
//! pairs that multi-threaded TCG runs as host atomics) and this process's
//! `AtomicU64` on the same file agree under contention
//! (`rolex_core::layout::AtomicsProbe`).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use rand::{Rng, SeedableRng};
use rolex_core::layout::{
    AgentArea, AgentState, AtomicsProbe, ModelRecord, ModelState, Superblock,
};
use rolex_host::kv::{KvClient, KvClientConfig};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

use crate::inspect::{decode_log, Table};

/// Arguments of `rolex bluefield-emu`.
#[derive(Debug, Args)]
pub struct BluefieldEmuArgs {
    /// The aarch64 image for QEMU's `virt` machine (`./tools/firmware virt`
    /// prints its path).
    #[arg(long, value_name = "ELF")]
    image: PathBuf,
    /// The QEMU system emulator to run.
    #[arg(long, default_value = "qemu-system-aarch64")]
    qemu: PathBuf,
    /// The emulated CPU model (BlueField-2's Arm cores are Cortex-A72).
    #[arg(long, default_value = "cortex-a72")]
    cpu: String,
    /// Emulated cores (the agent runs on core 0, the others stay off).
    #[arg(long, default_value_t = 2)]
    smp: u32,
    /// Keys bulk-loaded into the pool (1000 apart).
    #[arg(long, default_value_t = 256)]
    keys: u64,
    /// Compute-node threads inserting while the agent retrains.
    #[arg(long, default_value_t = 2)]
    clients: u64,
    /// Longest wait, in seconds, for every model to be retrained.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// The shared file (kept afterwards, for `rolex inspect`); without
    /// it a scratch file in /dev/shm, removed at the end.
    #[arg(long, value_name = "PATH")]
    pool_file: Option<PathBuf>,
    /// Run the atomics probe instead of the agent.
    #[arg(long)]
    probe_atomics: bool,
    /// Rounds of the guest's side of the probe.
    #[arg(long, default_value_t = 100_000)]
    probe_rounds: u64,
}

/// What the emulation found wrong.
#[derive(Debug)]
pub enum EmuError {
    /// The image is not an aarch64 ELF.
    NotAarch64 {
        /// The image.
        path: PathBuf,
        /// What its header said.
        why: &'static str,
    },
    /// The shared file's path has a character QEMU's option syntax splits on.
    BadPath(PathBuf),
    /// The pool does not fit the agent window of the `virt` board.
    TooLarge {
        /// Bytes the shared file would need (a power of two).
        needed: u64,
    },
    /// A file or process operation failed.
    Io {
        /// What was being done.
        during: &'static str,
        /// The error.
        error: std::io::Error,
    },
    /// QEMU or the guest did not do something in time.
    Timeout(&'static str),
    /// The guest exited with an unexpected status.
    GuestExit {
        /// Expected exit code.
        expected: i32,
        /// What it ended with (`None`: killed by a signal).
        found: Option<i32>,
    },
}

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAarch64 { path, why } => {
                write!(f, "{}: not an aarch64 image: {why}", path.display())
            }
            Self::BadPath(p) => write!(f, "{}: QEMU cannot take a path with ','", p.display()),
            Self::TooLarge { needed } => write!(
                f,
                "the shared memory would need {needed} bytes; the virt board's agent window holds {MAX_WINDOW}"
            ),
            Self::Io { during, error } => write!(f, "{during}: {error}"),
            Self::Timeout(what) => write!(f, "timed out: {what}"),
            Self::GuestExit { expected, found } => match found {
                Some(c) => write!(f, "the emulated agent exited with {c}, not {expected}"),
                None => write!(f, "the emulator was killed by a signal"),
            },
        }
    }
}

impl std::error::Error for EmuError {}

fn io(during: &'static str) -> impl Fn(std::io::Error) -> EmuError {
    move |error| EmuError::Io { during, error }
}

/// The `virt` board's agent window (`linker/qemu-virt-aarch64.ld`).
const MAX_WINDOW: u64 = 256 << 20;
/// The smallest shared file (a page of probe block or agent area).
const MIN_WINDOW: u64 = 1 << 20;
/// ELF `e_machine` of AArch64.
const EM_AARCH64: u16 = 183;
/// Longest wait for the guest to start or to stop.
const GUEST_LIMIT: Duration = Duration::from_secs(120);

/// Runs `rolex bluefield-emu`.
pub fn run(args: BluefieldEmuArgs) -> Result<(), Box<dyn std::error::Error>> {
    let elf = std::fs::read(&args.image).map_err(io("reading the image"))?;
    check_aarch64(&args.image, &elf)?;
    let scratch = args.pool_file.is_none();
    let path = args.pool_file.clone().unwrap_or_else(|| {
        PathBuf::from(format!(
            "/dev/shm/rolex-bluefield-emu-{}",
            std::process::id()
        ))
    });
    if path.to_string_lossy().contains(',') {
        return Err(EmuError::BadPath(path).into());
    }
    let _remove = scratch.then(|| RemoveOnDrop(path.clone()));
    if args.probe_atomics {
        probe(&args, &path)
    } else {
        serve(&args, &path, &elf)
    }
}

/// Checks the ELF header: 64-bit, little-endian, AArch64.
fn check_aarch64(path: &Path, elf: &[u8]) -> Result<(), EmuError> {
    let bad = |why| EmuError::NotAarch64 {
        path: path.to_path_buf(),
        why,
    };
    if elf.get(..4) != Some(b"\x7fELF") {
        return Err(bad("no ELF magic"));
    }
    if elf.get(4..6) != Some(&[2, 1]) {
        return Err(bad("not a little-endian 64-bit ELF"));
    }
    match elf.get(18..20) {
        Some(&[a, b]) if u16::from_le_bytes([a, b]) == EM_AARCH64 => Ok(()),
        _ => Err(bad("e_machine is not AArch64")),
    }
}

/// Removes a scratch file when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The emulator; killed when dropped before it exited.
struct Guest(Child);

impl Guest {
    fn start(
        args: &BluefieldEmuArgs,
        file: &Path,
        size: u64,
        append: Option<&str>,
    ) -> Result<Self, EmuError> {
        let mut c = Command::new(&args.qemu);
        c.args(["-M", "virt,highmem=off,gic-version=2", "-cpu", &args.cpu])
            .args(["-smp", &args.smp.to_string(), "-m", "128M"])
            .args(["-nographic", "-semihosting", "-kernel"])
            .arg(&args.image)
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=pool,mem-path={},size={size},share=on",
                file.display()
            ))
            .args(["-device", "ivshmem-plain,memdev=pool"]);
        if let Some(a) = append {
            c.args(["-append", a]);
        }
        // Stdout stays this command's (the JSON line); the guest's console
        // goes to stderr.
        c.stdin(Stdio::null()).stdout(std::io::stderr());
        eprintln!("bluefield-emu: {c:?}");
        c.spawn().map(Self).map_err(io("starting the emulator"))
    }

    /// The exit code, if the emulator has exited.
    fn exited(&mut self) -> Result<Option<Option<i32>>, EmuError> {
        Ok(self
            .0
            .try_wait()
            .map_err(io("waiting for the emulator"))?
            .map(|st| st.code()))
    }

    /// Waits (bounded) for the emulator to exit with `expected`.
    fn finish(mut self, expected: i32) -> Result<(), EmuError> {
        let code = wait_for(GUEST_LIMIT, || self.exited())?
            .ok_or(EmuError::Timeout("the emulated agent did not exit"))?;
        if code == Some(expected) {
            Ok(())
        } else {
            Err(EmuError::GuestExit {
                expected,
                found: code,
            })
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Polls `f` every 2 ms (sleeping between) until it gives `Some`, for at
/// most `limit`.
fn wait_for<T>(
    limit: Duration,
    mut f: impl FnMut() -> Result<Option<T>, EmuError>,
) -> Result<Option<T>, EmuError> {
    let t = Instant::now();
    loop {
        if let Some(v) = f()? {
            return Ok(Some(v));
        }
        if t.elapsed() > limit {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A file mapped shared and read-write, whole; unmapped on drop.
struct SharedFile {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is shared memory accessed only through `AtomicU64`
// words (`word`); which thread holds the owner changes nothing.
unsafe impl Send for SharedFile {}
// SAFETY: as for `Send`: `&SharedFile` gives atomic access only.
unsafe impl Sync for SharedFile {}

impl SharedFile {
    /// Creates (or empties) the file at `path`, sized `len`, and maps it.
    fn create(path: &Path, len: u64) -> Result<Self, EmuError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(io("creating the shared file"))?;
        file.set_len(len).map_err(io("sizing the shared file"))?;
        let n = usize::try_from(len).map_err(|_| EmuError::TooLarge { needed: len })?;
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of our own open file at an address
        // the kernel picks; it aliases no Rust object.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                n,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(EmuError::Io {
                during: "mapping the shared file",
                error: std::io::Error::last_os_error(),
            });
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(EmuError::Io {
            during: "mapping the shared file",
            error: std::io::ErrorKind::OutOfMemory.into(),
        })?;
        Ok(Self { ptr, len: n })
    }

    /// The word at `offset` (8-byte aligned, inside the mapping).
    fn word(&self, offset: u64) -> &AtomicU64 {
        let o = offset as usize;
        assert!(
            o % 8 == 0 && o + 8 <= self.len,
            "probe word inside the mapping"
        );
        // SAFETY: the word lies in the mapping (checked above), which lives
        // as long as `self`; the mapping is page aligned so the word is
        // 8-byte aligned; every access to it, here and in the guest, is
        // atomic.
        unsafe { &*self.ptr.as_ptr().add(o).cast::<AtomicU64>() }
    }
}

impl Drop for SharedFile {
    fn drop(&mut self) {
        // SAFETY: exactly what mmap returned; no reference from `word`
        // outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The atomics probe: the guest's `CAS`/`FAA` against this process's.
fn probe(args: &BluefieldEmuArgs, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    type P = AtomicsProbe;
    let mem = SharedFile::create(path, MIN_WINDOW)?;
    let guest = Guest::start(args, path, MIN_WINDOW, Some("probe-atomics"))?;
    let mut guest = guest;
    let ready = wait_for(GUEST_LIMIT, || {
        if let Some(code) = guest.exited()? {
            return Err(EmuError::GuestExit {
                expected: 0,
                found: code,
            });
        }
        Ok((mem.word(P::READY_OFFSET).load(Ordering::SeqCst) == P::READY).then_some(()))
    })?;
    ready.ok_or(EmuError::Timeout("the probe did not start"))?;
    let (faa, cas, done) = (
        mem.word(P::FAA_OFFSET),
        mem.word(P::CAS_OFFSET),
        mem.word(P::DONE_OFFSET),
    );
    mem.word(P::GO_OFFSET)
        .store(args.probe_rounds, Ordering::SeqCst);
    // Hammer the same words until the guest is done (a busy loop on
    // purpose, for the probe's second or so: the point is to race the
    // guest's core).
    let started = Instant::now();
    let (mut host_rounds, mut host_cas_retries) = (0u64, 0u64);
    while done.load(Ordering::SeqCst) == 0 {
        faa.fetch_add(1, Ordering::SeqCst);
        let mut seen = cas.load(Ordering::SeqCst);
        while let Err(now) = cas.compare_exchange(
            seen,
            seen.wrapping_add(1),
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            // The guest changed the word between this load and this CAS:
            // the two sides really interleaved.
            host_cas_retries += 1;
            seen = now;
        }
        host_rounds += 1;
        if host_rounds % 4096 == 0 {
            if started.elapsed() > GUEST_LIMIT {
                return Err(EmuError::Timeout("the probe did not finish").into());
            }
            if guest.exited()?.is_some() && done.load(Ordering::SeqCst) == 0 {
                return Err(EmuError::Timeout("the probe exited without finishing").into());
            }
        }
    }
    guest.finish(0)?;
    let agent_rounds = mem.word(P::AGENT_ROUNDS_OFFSET).load(Ordering::SeqCst);
    let refused = mem.word(P::CAS_REFUSED_OFFSET).load(Ordering::SeqCst);
    let (f, c) = (faa.load(Ordering::SeqCst), cas.load(Ordering::SeqCst));
    let want = agent_rounds + host_rounds;
    let verified =
        agent_rounds == args.probe_rounds && f == want && c == want && refused == agent_rounds;
    println!(
        "{}",
        serde_json::json!({
            "arch": "aarch64",
            "cpu": args.cpu,
            "probe": "atomics",
            "agent_rounds": agent_rounds,
            "host_rounds": host_rounds,
            "host_cas_retries": host_cas_retries,
            "faa_count": f,
            "cas_count": c,
            "cas_refused": refused,
            "verified": verified,
        })
    );
    if !verified {
        return Err(format!(
            "guest and host atomics disagree: {agent_rounds} guest + {host_rounds} host rounds, FAA word {f}, CAS word {c}, {refused} refused CASes"
        )
        .into());
    }
    Ok(())
}

/// Where the model directory points, per model.
fn directory(node: &MemoryNode) -> Result<Vec<u64>, Box<dyn std::error::Error>> {
    let sb = superblock(node)?;
    let mh = node.pool_handle();
    (0..sb.model_count())
        .map(|m| Ok(mh.load_u64(sb.directory_entry_offset(m)?)?))
        .collect()
}

fn superblock(node: &MemoryNode) -> Result<Superblock, Box<dyn std::error::Error>> {
    let head = node.pool_handle().to_vec(0, Superblock::SIZE as usize)?;
    Ok(Superblock::read(&head)?)
}

fn area(node: &MemoryNode) -> Result<AgentArea, Box<dyn std::error::Error>> {
    Ok(node.agent_area().ok_or("the pool has no agent area")?.1)
}

/// The emulated agent serving a pool that host compute nodes write.
fn serve(
    args: &BluefieldEmuArgs,
    path: &Path,
    elf: &[u8],
) -> Result<(), Box<dyn std::error::Error>> {
    let table = Table::from_elf(elf)?;
    let pairs: Vec<(u64, u64)> = (0..args.keys).map(|i| (i * 1000, i)).collect();
    let node = MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 8,
            // Above 128: the agent retrains only what compute nodes queue
            // through the CirQ (at SLT slot 128).
            retrain_trigger: 10_000,
            retraining_thread: false,
            spare_leaf_factor: 64.0,
            pool_file: Some(path.to_path_buf()),
            log_capacity: 1 << 20,
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )?;
    // The ivshmem BAR is a power of two: the file grows to one (zeros past
    // the pool, which the agent never reads: the superblock bounds it).
    let len = std::fs::metadata(path)
        .map_err(io("sizing the pool file"))?
        .len();
    let size = len.next_power_of_two().max(MIN_WINDOW);
    if size > MAX_WINDOW {
        return Err(EmuError::TooLarge { needed: size }.into());
    }
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_len(size))
        .map_err(io("growing the pool file"))?;
    let models = node.model_count();
    let before = directory(&node)?;
    let mut guest = Guest::start(args, path, size, None)?;
    let running = wait_for(GUEST_LIMIT, || {
        if let Some(code) = guest.exited()? {
            return Err(EmuError::GuestExit {
                expected: 0,
                found: code,
            });
        }
        let st = area(&node)
            .map(|a| a.state())
            .unwrap_or(AgentState::NotStarted);
        Ok((st == AgentState::Running).then_some(()))
    })?;
    running.ok_or(EmuError::Timeout("the emulated agent did not start"))?;
    eprintln!(
        "bluefield-emu: the emulated agent runs; {models} models, {} keys",
        args.keys
    );

    let client = KvClient::connect(KvClientConfig::default(), &node.pool())?;
    let done = AtomicBool::new(false);
    let limit = Duration::from_secs(args.timeout);
    let (all_retrained, written) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..args.clients)
            .map(|c| {
                let (client, done) = (&client, &done);
                let span = args.keys.max(1) * 1000;
                s.spawn(move || -> Result<Vec<(u64, u64)>, String> {
                    let mut sess = client.session().map_err(|e| e.to_string())?;
                    let mut rng = rand::rngs::StdRng::seed_from_u64(c + 7);
                    let mut mine = Vec::new();
                    // Bounded: enough to fill every model's SLT many times.
                    for i in 0..400_000u64 {
                        if done.load(Ordering::Relaxed) {
                            break;
                        }
                        let k = rng.gen_range(0..span) * args.clients + c;
                        sess.insert(k, i).map_err(|e| format!("insert {k}: {e}"))?;
                        mine.push((k, i));
                    }
                    Ok(mine)
                })
            })
            .collect();
        let all = wait_for(limit, || {
            let now = directory(&node).map_err(|_| EmuError::Timeout("reading the directory"))?;
            let retrained = now.iter().zip(&before).all(|(n, b)| n != b);
            let stuck = hs.iter().all(|h| h.is_finished());
            Ok((retrained || stuck).then_some(retrained))
        });
        done.store(true, Ordering::Relaxed);
        let written: Result<Vec<_>, String> = hs
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| "a client thread panicked".to_string())?
            })
            .collect();
        (all, written)
    });
    let all_retrained = all_retrained?.unwrap_or(false);
    let written = written?;
    node.stop_external_agent()?;
    guest.finish(0)?;

    let mut problems = Vec::new();
    if !all_retrained {
        problems.push(format!(
            "not every model was retrained within {} s",
            args.timeout
        ));
    }
    // Every model retrained is redirected: the directory names a new
    // record, the old one is retired and forwards.
    let sb = superblock(&node)?;
    let after = directory(&node)?;
    for (m, (&old, &new)) in before.iter().zip(&after).enumerate() {
        if old == new {
            continue;
        }
        let st = ModelState::from_raw(node.pool_handle().load_u64(old)?);
        if !(st.is_retired() && st.forward().is_some()) {
            problems.push(format!("model {m}: old record {old} is {st:?}"));
        }
        let rb = node.pool_handle().to_vec(new, ModelRecord::SIZE as usize)?;
        if let Err(e) = ModelRecord::read(&rb).and_then(|r| r.check(new, &sb)) {
            problems.push(format!("model {m}: new record {new}: {e}"));
        }
    }
    // Every key, read back.
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    for (k, v) in written.into_iter().flatten() {
        model.insert(k, v);
    }
    let mut sess = client.session()?;
    let mut keys_verified = 0u64;
    for (&k, &v) in &model {
        match sess.get(k)? {
            Some(got) if got == v => keys_verified += 1,
            other => problems.push(format!("key {k}: read {other:?}, wrote {v}")),
        }
    }
    let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
    if sess.range(0, u64::MAX)? != want {
        problems.push("a full range scan differs from the keys written".into());
    }
    // The agent's own account and its log.
    let a = area(&node)?;
    if a.state() != AgentState::Stopped || a.failures() != 0 || a.skipped() != 0 {
        problems.push(format!(
            "agent ended {} with {} failures, {} CirQ entries skipped",
            a.state(),
            a.failures(),
            a.skipped()
        ));
    }
    let ring = node
        .agent_area_bytes()
        .ok_or("the pool has no agent area")?;
    let lines = decode_log(
        &a,
        ring.get(AgentArea::SIZE as usize..).unwrap_or(&[]),
        Some(&table),
    )?;
    let logged = lines
        .iter()
        .filter(|l| l.contains("retrained: record"))
        .count() as u64;
    if logged < a.retrains() {
        problems.push(format!("{} retrainings, {logged} logged", a.retrains()));
    }
    let verified = problems.is_empty() && keys_verified == model.len() as u64;
    println!(
        "{}",
        serde_json::json!({
            "arch": "aarch64",
            "cpu": args.cpu,
            "models_retrained": a.retrains(),
            "keys_verified": keys_verified,
            "verified": verified,
            "agent_log_lines": lines.len(),
        })
    );
    if !verified {
        return Err(problems.join("; ").into());
    }
    Ok(())
}
