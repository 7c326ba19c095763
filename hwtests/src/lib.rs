//! The fabric conformance suite: one set of cases, run against every
//! fabric the machine has.
//!
//! [`fabrics`] lists the candidate fabrics and, for each, either a way to
//! build engines on it or the reason it is skipped (not present on this
//! machine, or not built in: verbs devices run with the `verbs` feature). [`run_all`] runs every
//! [`CASES`] entry on every available fabric and returns a [`Report`] that
//! names which fabrics ran, which were skipped and why, and every failure.
//! The cases check only what design §3 promises on all fabrics: reliable,
//! unordered delivery; protection (nothing changes on a violation);
//! 8-byte atomics atomic against each other and, through
//! `shared_words`, against the host's own; immediates after data.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rolex_engine::domain::fabric::{list_nics, probe, BounceConfig, LibfabricConfig};
use rolex_engine::topology::{self, ListedNic};
use rolex_engine::{
    Access, BatchOp, CompletionFlag, EngineConfig, Fabric, LoopbackConfig, MrDesc, MrHandle,
    NicChoice, NicSelect, OnDone, OnValue, Pages, ProtectionCheck, ScatterDst, TransferEngine,
    TransferError, Unordered,
};

/// Bound on any single wait: a hang guard, not a timing assertion.
pub const HANG: Duration = Duration::from_secs(60);

/// Builds engines on one fabric.
pub trait FabricUnderTest: Send + Sync {
    /// Name printed in the report.
    fn name(&self) -> String;
    /// A new engine (a new host) with `nics` NICs in one group.
    fn engine(&self, nics: usize) -> Result<TransferEngine, TransferError>;
    /// Whether a send to a peer that posted no receive fails. Loopback
    /// promises it; libfabric providers buffer such messages as
    /// unexpected and complete the send (design §3 does not promise it).
    fn rejects_unmatched_send(&self) -> bool {
        true
    }
    /// Whether the target NIC enforces protection itself, so that even a
    /// forged descriptor (a length the region does not have) is refused.
    /// The software libfabric providers `tcp;ofi_rxm` and `shm` do not
    /// (design §7): there only the initiator's checks against the
    /// descriptor stand, which every fabric must pass.
    fn enforces_at_target(&self) -> bool {
        true
    }
    /// The devices the fabric lists, placed by sysfs (the loopback
    /// fabric: one NIC, named `loopback`).
    fn devices(&self) -> Result<Vec<ListedNic>, TransferError> {
        Ok(vec![ListedNic {
            name: "loopback".into(),
            placement: None,
        }])
    }
    /// A new engine whose `nics` NICs all open `device` (one of
    /// [`FabricUnderTest::devices`]).
    fn engine_on(&self, _device: &str, nics: usize) -> Result<TransferEngine, TransferError> {
        self.engine(nics)
    }
    /// A new engine whose NICs open the devices the default choice takes
    /// ([`NicSelect::default`]: every listed device, in turn).
    fn engine_listed(&self, nics: usize) -> Result<TransferEngine, TransferError> {
        self.engine(nics)
    }
}

/// A libfabric provider, two engines per pair in this process on
/// 127.0.0.1.
pub struct Libfabric {
    /// The provider as `LibfabricConfig::provider` names it.
    pub provider: &'static str,
    /// The node to open endpoints on.
    pub node: Option<&'static str>,
    /// Which of the domain's paths it takes.
    pub path: Path,
}

/// Paths of the libfabric domain that hardware takes, forced on a
/// software provider so the suite covers them without the hardware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// What the provider grants.
    Default,
    /// Local descriptors (`FI_MR_LOCAL`: EFA's device path,
    /// `verbs;ofi_rxm`): regions' descriptors and small bounce pools (16
    /// slots each, so operations wait for slots) for atomics, sends and
    /// receives.
    LocalMr,
    /// A wait object without a descriptor (`FI_WAIT_UNSPEC`, EFA with its
    /// shared-memory peer on): the NIC's waiter blocks in `fi_cq_sread`.
    Sread,
    /// No wait object (`FI_WAIT_NONE`, EFA before libfabric 2.5): the
    /// queue is read on the domain's schedule.
    NoWait,
}

impl Path {
    /// Suffix of the fabric's name in the report.
    fn suffix(self) -> &'static str {
        match self {
            Path::Default => "",
            Path::LocalMr => "+local_mr",
            Path::Sread => "+sread",
            Path::NoWait => "+no_wait",
        }
    }
}

impl Libfabric {
    /// The domain options the suite uses for this provider.
    pub fn config(&self) -> LibfabricConfig {
        LibfabricConfig {
            op_timeout: Duration::from_secs(20),
            local_mr: self.path == Path::LocalMr,
            wait_sread: self.path == Path::Sread,
            wait_fd: self.path != Path::NoWait,
            bounce: if self.path == Path::LocalMr {
                BounceConfig {
                    words: 16,
                    sends: 16,
                    recvs: 16,
                    msg_size: 4096,
                }
            } else {
                BounceConfig::default()
            },
            ..LibfabricConfig::new(self.provider, self.node)
        }
    }
}

impl FabricUnderTest for Libfabric {
    fn name(&self) -> String {
        format!("libfabric:{}{}", self.provider, self.path.suffix())
    }

    fn engine(&self, nics: usize) -> Result<TransferEngine, TransferError> {
        TransferEngine::new(EngineConfig {
            nics_per_group: nics,
            fabric: Fabric::Libfabric(self.config()),
            ..EngineConfig::default()
        })
    }

    fn devices(&self) -> Result<Vec<ListedNic>, TransferError> {
        list_nics(&self.config())
    }

    fn engine_on(&self, device: &str, nics: usize) -> Result<TransferEngine, TransferError> {
        TransferEngine::new(EngineConfig {
            nics_per_group: nics,
            fabric: Fabric::Libfabric(LibfabricConfig {
                nics: NicSelect::new(NicChoice::Named(vec![device.to_string()])),
                ..self.config()
            }),
            ..EngineConfig::default()
        })
    }

    fn rejects_unmatched_send(&self) -> bool {
        false
    }

    fn enforces_at_target(&self) -> bool {
        !matches!(self.provider, "tcp" | "shm")
    }
}

/// The libfabric providers the suite knows, with the node each opens on.
pub const PROVIDERS: &[(&str, Option<&str>)] = &[
    ("tcp", Some("127.0.0.1")),
    ("shm", None),
    ("sockets", Some("127.0.0.1")),
    ("efa", None),
    ("verbs", None),
];

/// An RDMA device through the verbs domain (RC), two engines per pair in
/// this process on the same port (the NIC loops the traffic back).
#[cfg(feature = "verbs")]
pub struct Verbs {
    /// The device (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Its port (`ROLEX_HWTESTS_VERBS_PORT`, default 1).
    pub port: u8,
    /// The GID index (`ROLEX_HWTESTS_VERBS_GID_INDEX`, default 0; RoCE v2
    /// is usually 1 or 3).
    pub gid_index: u8,
}

#[cfg(feature = "verbs")]
impl Verbs {
    /// The domain options the suite uses for this device.
    pub fn config(&self) -> rolex_engine::domain::verbs::VerbsConfig {
        rolex_engine::domain::verbs::VerbsConfig {
            device: Some(self.device.clone()),
            port: self.port,
            gid_index: self.gid_index,
            op_timeout: Duration::from_secs(20),
            ..rolex_engine::domain::verbs::VerbsConfig::default()
        }
    }
}

#[cfg(feature = "verbs")]
impl FabricUnderTest for Verbs {
    fn name(&self) -> String {
        format!("verbs {}", self.device)
    }

    fn engine(&self, nics: usize) -> Result<TransferEngine, TransferError> {
        TransferEngine::new(EngineConfig {
            nics_per_group: nics,
            fabric: Fabric::Verbs(self.config()),
            ..EngineConfig::default()
        })
    }

    fn devices(&self) -> Result<Vec<ListedNic>, TransferError> {
        rolex_engine::domain::verbs::list_nics(&self.config())
    }

    fn engine_on(&self, device: &str, nics: usize) -> Result<TransferEngine, TransferError> {
        TransferEngine::new(EngineConfig {
            nics_per_group: nics,
            fabric: Fabric::Verbs(rolex_engine::domain::verbs::VerbsConfig {
                device: Some(device.to_string()),
                ..self.config()
            }),
            ..EngineConfig::default()
        })
    }

    fn engine_listed(&self, nics: usize) -> Result<TransferEngine, TransferError> {
        TransferEngine::new(EngineConfig {
            nics_per_group: nics,
            fabric: Fabric::Verbs(rolex_engine::domain::verbs::VerbsConfig {
                device: None,
                ..self.config()
            }),
            ..EngineConfig::default()
        })
    }

    fn rejects_unmatched_send(&self) -> bool {
        // RC holds a send with receiver-not-ready retries (infinite by
        // default) until the peer posts a receive.
        false
    }
}

/// The loopback NIC, ordered or unordered.
pub struct Loopback {
    /// SRD-like shuffling.
    pub unordered: Option<Unordered>,
}

impl FabricUnderTest for Loopback {
    fn name(&self) -> String {
        match self.unordered {
            None => "loopback".into(),
            Some(u) => format!("loopback-unordered(seed {})", u.seed),
        }
    }

    fn engine(&self, nics: usize) -> Result<TransferEngine, TransferError> {
        TransferEngine::new(EngineConfig {
            nics_per_group: nics,
            fabric: Fabric::Loopback(LoopbackConfig {
                unordered: self.unordered,
                recv_wait: Duration::from_millis(50),
                ..LoopbackConfig::default()
            }),
            ..EngineConfig::default()
        })
    }
}

/// A fabric the suite knows about: available, or skipped with a reason.
pub enum Candidate {
    /// Runs.
    Available(Box<dyn FabricUnderTest>),
    /// Skipped.
    Skipped {
        /// The fabric.
        name: String,
        /// Why.
        reason: String,
    },
}

fn rdma_devices() -> Vec<String> {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The verbs entries of the report: one per RDMA device present (SoftRoCE
/// included). With the `verbs` feature each device is opened through the
/// verbs domain and, if it opens, the suite runs on it; otherwise the
/// entry is a skip saying why.
fn verbs_candidates(mut devs: Vec<String>) -> Vec<Candidate> {
    if devs.is_empty() {
        return vec![Candidate::Skipped {
            name: "verbs".into(),
            reason: "no RDMA device in /sys/class/infiniband".into(),
        }];
    }
    devs.sort();
    devs.into_iter().map(verbs_candidate).collect()
}

#[cfg(feature = "verbs")]
fn verbs_candidate(dev: String) -> Candidate {
    use rolex_engine::domain::verbs::VerbsDomain;
    let (port, gid_index) = match (
        env_u8("ROLEX_HWTESTS_VERBS_PORT", 1),
        env_u8("ROLEX_HWTESTS_VERBS_GID_INDEX", 0),
    ) {
        (Ok(p), Ok(g)) => (p, g),
        (Err(why), _) | (_, Err(why)) => {
            return Candidate::Skipped {
                name: format!("verbs {dev}"),
                reason: why,
            }
        }
    };
    let f = Verbs {
        device: dev,
        port,
        gid_index,
    };
    // Opening one domain proves the device, port and GID index work; it
    // closes again before the cases open their own.
    match VerbsDomain::open(&f.config()) {
        Ok(_) => Candidate::Available(Box::new(f)),
        Err(e) => Candidate::Skipped {
            name: f.name(),
            reason: format!("device {} does not open: {e}", f.device),
        },
    }
}

/// The environment variable `name` as a `u8`, or `default` when unset.
#[cfg(feature = "verbs")]
fn env_u8(name: &str, default: u8) -> Result<u8, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not a number from 0 to 255")),
    }
}

#[cfg(not(feature = "verbs"))]
fn verbs_candidate(dev: String) -> Candidate {
    Candidate::Skipped {
        name: format!("verbs {dev}"),
        reason: format!(
            "device {dev} present; build rolex-hwtests with --features verbs to run the suite on it"
        ),
    }
}

/// Every fabric the suite knows, in report order.
pub fn fabrics() -> Vec<Candidate> {
    let mut v = vec![
        Candidate::Available(Box::new(Loopback { unordered: None })),
        Candidate::Available(Box::new(Loopback {
            unordered: Some(Unordered {
                seed: 7,
                window: 32,
                writes_in_order: false,
            }),
        })),
    ];
    for &(provider, node) in PROVIDERS {
        let f = Libfabric {
            provider,
            node,
            path: Path::Default,
        };
        match probe(provider, node) {
            // The library is loaded at run time; without it every provider
            // is skipped with the loader's advice.
            Err(TransferError::LibfabricLoad(e)) => v.push(Candidate::Skipped {
                name: f.name(),
                reason: e.to_string(),
            }),
            // `sockets` runs like the others: its initiator's completion
            // of a write with an immediate carries FI_REMOTE_CQ_DATA too,
            // which the domain tells from a peer's immediate by the
            // context and FI_REMOTE_WRITE (`fabric::ffi::entry_kind`).
            Ok(()) => {
                v.push(Candidate::Available(Box::new(f)));
                // The paths hardware takes, on tcp, where no device
                // provides them.
                if provider == "tcp" {
                    for path in [Path::LocalMr, Path::Sread, Path::NoWait] {
                        v.push(Candidate::Available(Box::new(Libfabric {
                            provider,
                            node,
                            path,
                        })));
                    }
                }
            }
            Err(e) => v.push(Candidate::Skipped {
                name: f.name(),
                reason: format!("provider not usable here: {e}"),
            }),
        }
    }
    v.extend(verbs_candidates(rdma_devices()));
    v
}

/// Why a case failed.
#[derive(Debug)]
pub struct Failure(pub String);

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<TransferError> for Failure {
    fn from(e: TransferError) -> Self {
        Failure(format!("engine error: {e}"))
    }
}

type CaseResult = Result<(), Failure>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Failure(format!($($msg)+)));
        }
    };
}

/// One conformance case.
pub struct Case {
    /// Its name.
    pub name: &'static str,
    /// Its body.
    pub run: fn(&dyn FabricUnderTest) -> CaseResult,
}

fn wait(f: &CompletionFlag) -> Result<Result<u64, TransferError>, Failure> {
    f.wait(HANG)
        .ok_or_else(|| Failure("operation did not complete (hang guard)".into()))
}

fn flag() -> (Arc<CompletionFlag>, OnDone) {
    let f = CompletionFlag::new();
    let d = OnDone::flag(&f);
    (f, d)
}

fn vflag() -> (Arc<CompletionFlag>, OnValue) {
    let f = CompletionFlag::new();
    let d = OnValue::flag(&f);
    (f, d)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

fn pair(
    f: &dyn FabricUnderTest,
    nics: usize,
    len: u64,
) -> Result<(TransferEngine, TransferEngine, MrHandle, MrHandle, MrDesc), Failure> {
    let a = f.engine(nics)?;
    let b = f.engine(nics)?;
    let (src, _) = a.alloc_mr(len, Access::all())?;
    let (dst, dd) = b.alloc_mr(len, Access::all())?;
    Ok((a, b, src, dst, dd))
}

fn write_read_round_trip(f: &dyn FabricUnderTest) -> CaseResult {
    let (a, _b, src, dst, dd) = pair(f, 1, 8192)?;
    src.write(0, &pattern(8192, 1))?;
    let (fl, d) = flag();
    a.submit_single_write(4000, None, (&src, 100), (&dd, 50), d)?;
    wait(&fl)??;
    ensure!(
        dst.to_vec(50, 4000)? == pattern(8192, 1)[100..4100],
        "written bytes differ"
    );
    // A completion means the data is visible at the target (§3), every
    // time: small writes (inlined by some providers) checked at once.
    for round in 0..32u8 {
        src.write(0, &pattern(64, round))?;
        let (fl, d) = flag();
        let at = 4096 + 64 * u64::from(round);
        a.submit_single_write(64, None, (&src, 0), (&dd, at), d)?;
        wait(&fl)??;
        ensure!(
            dst.to_vec(at, 64)? == pattern(64, round),
            "written bytes not visible at completion (round {round})"
        );
    }
    src.fill(0)?;
    let (fl, d) = flag();
    a.submit_read(4000, (&src, 0), (&dd, 50), d)?;
    wait(&fl)??;
    ensure!(
        src.to_vec(0, 4000)? == pattern(8192, 1)[100..4100],
        "read bytes differ"
    );
    Ok(())
}

fn imm_counts_whatever_the_order(f: &dyn FabricUnderTest) -> CaseResult {
    let (a, b, src, dst, dd) = pair(f, 2, 64 * 64)?;
    src.write(0, &pattern(64 * 64, 2))?;
    let (early, d) = flag();
    b.expect_imm_count(1, 32, d)?;
    let mut flags = Vec::new();
    for i in 0..64u64 {
        let (fl, d) = flag();
        a.submit_single_write(
            64,
            Some(1 + (i % 2) as u32),
            (&src, 64 * i),
            (&dd, 64 * i),
            d,
        )?;
        flags.push(fl);
    }
    for fl in &flags {
        wait(fl)??;
    }
    wait(&early)??;
    let (late, d) = flag();
    b.expect_imm_count(2, 32, d)?;
    wait(&late)??;
    ensure!(
        dst.to_vec(0, 64 * 64)? == pattern(64 * 64, 2),
        "data incomplete when immediates fired"
    );
    ensure!(
        b.imm_count(1) == 0 && b.imm_count(2) == 0,
        "surplus arrivals"
    );
    // The sender's own completions are no arrivals.
    ensure!(
        a.imm_count(1) == 0 && a.imm_count(2) == 0,
        "the sender counted {} and {} of its own immediates",
        a.imm_count(1),
        a.imm_count(2)
    );
    Ok(())
}

/// Whether a protection error names the expected check.
type CheckFn = fn(&ProtectionCheck) -> bool;

fn protection_changes_nothing(f: &dyn FabricUnderTest) -> CaseResult {
    let (a, _b, src, dst, dd) = pair(f, 1, 1024)?;
    src.fill(0xaa)?;
    dst.fill(0x11)?;
    let mut bad_key = dd.clone();
    bad_key.nics[0].1 ^= 1;
    let mut long = dd.clone();
    long.len *= 2;
    let mut no_rights = dd.clone();
    no_rights.access = Access::empty();
    let cases: [(&str, &MrDesc, u64, CheckFn); 5] = [
        ("wrong key", &bad_key, 0, |c| {
            *c == ProtectionCheck::UnknownKey
        }),
        ("out of bounds", &dd, 1024 - 8, |c| {
            matches!(c, ProtectionCheck::OutOfBounds { .. })
        }),
        ("out of bounds (forged length)", &long, 1024, |c| {
            matches!(c, ProtectionCheck::OutOfBounds { .. })
        }),
        ("missing right", &no_rights, 0, |c| {
            matches!(c, ProtectionCheck::MissingRight(_))
        }),
        ("misaligned atomic", &dd, 4, |c| {
            matches!(c, ProtectionCheck::Misaligned { .. })
        }),
    ];
    for (what, desc, off, want) in cases {
        let (fl, d) = flag();
        if what == "misaligned atomic" {
            let (vf, v) = vflag();
            a.submit_faa((desc, off), 1, v)?;
            match wait(&vf)? {
                Err(TransferError::Protection { check, .. }) if want(&check) => {}
                other => return Err(Failure(format!("{what}: got {other:?}"))),
            }
            continue;
        }
        let forged = what.contains("forged");
        if forged && !f.enforces_at_target() {
            continue;
        }
        a.submit_single_write(16, None, (&src, 0), (desc, off), d)?;
        match wait(&fl)? {
            Err(TransferError::Protection { check, .. }) if want(&check) => {}
            // A target NIC that refuses says so in its own words, and
            // cannot say which check failed (verbs: IBV_WC_REM_ACCESS_ERR).
            Err(TransferError::FabricCompletion { errno: 13, .. })
                if forged || (what == "wrong key" && f.enforces_at_target()) => {}
            other => return Err(Failure(format!("{what}: got {other:?}"))),
        }
    }
    ensure!(
        dst.to_vec(0, 1024)?.iter().all(|b| *b == 0x11),
        "target memory changed"
    );
    Ok(())
}

fn atomics_are_atomic(f: &dyn FabricUnderTest) -> CaseResult {
    let target = f.engine(1)?;
    let (word, wd) = target.alloc_mr(64, Access::all())?;
    let threads = 3;
    let per = 200u64;
    let errors = Arc::new(Mutex::new(Vec::new()));
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let e = f.engine(1);
            let wd = wd.clone();
            let errors = errors.clone();
            std::thread::spawn(move || {
                let run = || -> Result<(), TransferError> {
                    let e = e?;
                    let mut ch = e.channel()?;
                    let mut res = Vec::new();
                    for _ in 0..per / 4 {
                        ch.run(
                            &[BatchOp::Faa {
                                dst: &wd,
                                offset: 8,
                                add: 1,
                            }; 4],
                            &mut res,
                        )?;
                        if let Some(Err(x)) = res.iter().find(|r| r.is_err()) {
                            return Err(x.clone());
                        }
                    }
                    Ok(())
                };
                if let Err(x) = run() {
                    errors.lock().unwrap_or_else(|p| p.into_inner()).push(x);
                }
            })
        })
        .collect();
    for h in hs {
        h.join()
            .map_err(|_| Failure("client thread panicked".into()))?;
    }
    let errs = errors.lock().unwrap_or_else(|p| p.into_inner());
    ensure!(errs.is_empty(), "faa errors: {errs:?}");
    ensure!(
        word.load_u64(8)? == threads as u64 * per,
        "faa lost updates: {}",
        word.load_u64(8)?
    );
    let a = f.engine(1)?;
    let (vf, v) = vflag();
    a.submit_cas((&wd, 8), threads as u64 * per, 1, v)?;
    ensure!(wait(&vf)?? == threads as u64 * per, "cas old value");
    ensure!(word.load_u64(8)? == 1, "cas did not swap");
    Ok(())
}

/// One atomic from `e` on `dst`'s word at `off`, waited for.
fn nic_atomic(e: &TransferEngine, dst: &MrDesc, off: u64, op: Atomic) -> Result<u64, Failure> {
    let (vf, v) = vflag();
    match op {
        Atomic::Faa(add) => e.submit_faa((dst, off), add, v)?,
        Atomic::Cas(expected, new) => e.submit_cas((dst, off), expected, new, v)?,
    }
    Ok(wait(&vf)??)
}

#[derive(Clone, Copy)]
enum Atomic {
    Faa(u64),
    Cas(u64, u64),
}

/// Design §5.8: a word the host updates itself while peers update it
/// through the NIC. Checks the fetched value's byte order (a value the CPU
/// stored comes back the same through FAA and CAS), then mixes the host's
/// own increments, through [`TransferEngine::shared_words`] on the route
/// the engine chose and on the NIC route, with peers' NIC increments on
/// one word: no update may be lost.
fn cpu_and_nic_atomics_agree(f: &dyn FabricUnderTest) -> CaseResult {
    let host = f.engine(1)?;
    let (word, wd) = host.alloc_mr(64, Access::all())?;
    let peer = f.engine(1)?;
    let v = 0x0102_0304_0506_0708u64;
    word.store_u64(0, v)?;
    let got = nic_atomic(&peer, &wd, 0, Atomic::Faa(0))?;
    ensure!(
        got == v,
        "FAA fetched {got:#018x} for {v:#018x}{} (engine reply order: {:?})",
        if got == v.swap_bytes() {
            ": byte-swapped, the device replies big-endian"
        } else {
            ""
        },
        peer.atomic_profile().reply
    );
    let w = 0x1112_1314_1516_1718u64;
    let got = nic_atomic(&peer, &wd, 0, Atomic::Cas(v, w))?;
    ensure!(got == v, "CAS fetched {got:#018x}, expected {v:#018x}");
    ensure!(
        word.load_u64(0)? == w,
        "CAS did not swap: the word holds {:#018x}",
        word.load_u64(0)?
    );

    let profile = host.atomic_profile();
    eprintln!(
        "conformance: {}: atomics {:?}, the host's own go by {:?}",
        f.name(),
        profile,
        profile.route()
    );
    let per = 64u64;
    let mut routes = vec![
        (8u64, profile.route()),
        (16, rolex_engine::AtomicRoute::Nic),
    ];
    // The experiment that answers "are this NIC's atomics atomic with the
    // CPU's?" where the device says they are not (hwtests/README.md).
    if std::env::var_os("ROLEX_HWTESTS_CPU_ATOMICS").is_some() {
        routes.push((24, rolex_engine::AtomicRoute::Cpu));
    }
    for (off, route) in routes {
        let words = host.shared_words_via(&word, route)?;
        let peers: Vec<_> = (0..2)
            .map(|_| {
                let e = f.engine(1);
                let wd = wd.clone();
                std::thread::spawn(move || -> Result<(), Failure> {
                    let e = e?;
                    for i in 0..per {
                        // Half increments, half CAS loops as lock words see.
                        if i % 2 == 0 {
                            nic_atomic(&e, &wd, off, Atomic::Faa(1))?;
                        } else {
                            let mut seen = 0;
                            loop {
                                let old = nic_atomic(&e, &wd, off, Atomic::Cas(seen, seen + 1))?;
                                if old == seen {
                                    break;
                                }
                                seen = old;
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        for i in 0..per {
            if i % 2 == 0 {
                words.faa(off, 1)?;
            } else {
                let mut seen = words.load(off)?;
                loop {
                    let old = words.cas(off, seen, seen + 1)?;
                    if old == seen {
                        break;
                    }
                    seen = old;
                }
            }
        }
        for h in peers {
            h.join()
                .map_err(|_| Failure("peer thread panicked".into()))??;
        }
        let total = word.load_u64(off)?;
        ensure!(
            total == 3 * per,
            "{route:?} route: {total} of {} updates survived",
            3 * per
        );
    }
    Ok(())
}

fn send_recv(f: &dyn FabricUnderTest) -> CaseResult {
    let a = f.engine(1)?;
    let b = f.engine(1)?;
    let got = Arc::new(AtomicUsize::new(0));
    let g = got.clone();
    b.submit_recvs(128, 4, move |m| {
        if m == b"ping" {
            g.fetch_add(1, SeqCst);
        }
    })?;
    for _ in 0..8 {
        let (fl, d) = flag();
        a.submit_send(&b.main_address(), b"ping", d)?;
        wait(&fl)??;
    }
    let start = std::time::Instant::now();
    while got.load(SeqCst) < 8 && start.elapsed() < HANG {
        std::thread::sleep(Duration::from_millis(1));
    }
    ensure!(got.load(SeqCst) == 8, "received {} of 8", got.load(SeqCst));
    if !f.rejects_unmatched_send() {
        return Ok(());
    }
    let c = f.engine(1)?;
    let (fl, d) = flag();
    a.submit_send(&c.main_address(), b"nobody listens", d)?;
    ensure!(
        matches!(wait(&fl)?, Err(TransferError::NoReceiveBuffer { .. })),
        "send without receive must fail"
    );
    Ok(())
}

fn paged_scatter_barrier(f: &dyn FabricUnderTest) -> CaseResult {
    let a = f.engine(2)?;
    let peers: Vec<_> = (0..4)
        .map(|_| -> Result<_, Failure> {
            let e = f.engine(2)?;
            let (h, d) = e.alloc_mr(4096, Access::all())?;
            Ok((e, h, d))
        })
        .collect::<Result<_, _>>()?;
    let (src, _) = a.alloc_mr(4096, Access::all())?;
    src.write(0, &pattern(4096, 3))?;
    let group = a.add_peer_group(peers.iter().map(|p| p.0.main_address()).collect())?;
    let mut fired = Vec::new();
    for p in &peers {
        let (fl, d) = flag();
        // 3 pages + 1 scatter slice + 1 barrier.
        p.0.expect_imm_count(9, 5, d)?;
        fired.push(fl);
    }
    for p in &peers {
        let sp = Pages {
            indices: vec![5, 1, 3],
            stride: 256,
            offset: 8,
        };
        let dp = Pages {
            indices: vec![0, 7, 2],
            stride: 300,
            offset: 0,
        };
        let (fl, d) = flag();
        a.submit_paged_writes(100, Some(9), (&src, &sp), (&p.2, &dp), d)?;
        wait(&fl)??;
    }
    let dst: Vec<_> = peers
        .iter()
        .map(|p| ScatterDst {
            len: 16,
            src: 0,
            dst: p.2.clone(),
            dst_offset: 4000,
        })
        .collect();
    let (fl, d) = flag();
    a.submit_scatter(Some(group), d, Some(9), &src, &dst)?;
    wait(&fl)??;
    let descs: Vec<_> = peers.iter().map(|p| p.2.clone()).collect();
    let (fl, d) = flag();
    a.submit_barrier(Some(group), d, 9, &descs)?;
    wait(&fl)??;
    for fl in &fired {
        wait(fl)??;
    }
    let all = pattern(4096, 3);
    for p in &peers {
        ensure!(
            p.1.to_vec(300 * 7, 100)? == all[8 + 256..8 + 256 + 100],
            "page 1 misplaced"
        );
        ensure!(
            p.1.to_vec(4000, 16)? == all[..16],
            "scatter slice misplaced"
        );
    }
    Ok(())
}

fn split_over_four_nics(f: &dyn FabricUnderTest) -> CaseResult {
    let len = 1u64 << 20;
    let (a, b, src, dst, dd) = pair(f, 4, len)?;
    src.write(0, &pattern(len as usize, 4))?;
    let (fl, d) = flag();
    b.expect_imm_count(3, rolex_engine::single_write_pieces(len, dd.nics.len()), d)?;
    a.submit_single_write(len, Some(3), (&src, 0), (&dd, 0), OnDone::callback(|_| {}))?;
    wait(&fl)??;
    ensure!(
        dst.to_vec(0, len as usize)? == pattern(len as usize, 4),
        "split write incomplete"
    );
    Ok(())
}

/// Several NICs per engine (design §4, multi-NIC): small writes, reads
/// and atomics spread over every NIC of the sender's group, each lands
/// right, and a receiver with another NIC count completes a sharded write
/// knowing only its own count and the sender's.
fn small_ops_spread_over_nics(f: &dyn FabricUnderTest) -> CaseResult {
    let (a, b, src, dst, dd) = pair(f, 2, 4096)?;
    src.write(0, &pattern(4096, 5))?;
    let rounds = 8u64;
    for i in 0..rounds {
        let at = 64 * i;
        let (fl, d) = flag();
        a.submit_single_write(64, None, (&src, at), (&dd, at), d)?;
        wait(&fl)??;
        let (fl, d) = flag();
        a.submit_read(64, (&src, 2048 + at), (&dd, at), d)?;
        wait(&fl)??;
        nic_atomic(&a, &dd, 1024 + 8 * (i % 4), Atomic::Faa(1))?;
    }
    ensure!(
        dst.to_vec(0, 512)? == pattern(4096, 5)[..512],
        "small writes misplaced"
    );
    ensure!(
        src.to_vec(2048, 512)? == pattern(4096, 5)[..512],
        "small reads misplaced"
    );
    for w in 0..4 {
        ensure!(dst.load_u64(1024 + 8 * w)? == rounds / 4, "atomics lost");
    }
    let c = a.counters();
    for d in &c.domains {
        let k = &d.counters;
        ensure!(
            k.writes > 0 && k.reads > 0 && k.atomics > 0,
            "NIC {} of 2 carried writes/reads/atomics {}/{}/{}",
            d.addr,
            k.writes,
            k.reads,
            k.atomics
        );
    }
    // A 4-NIC sender to this 2-NIC receiver.
    let wide = f.engine(4)?;
    let len = 256 * 1024u64;
    let (big, _) = wide.alloc_mr(len, Access::all())?;
    let (bdst, bd) = b.alloc_mr(len, Access::all())?;
    big.write(0, &pattern(len as usize, 6))?;
    let (landed, d) = flag();
    b.expect_imm_count(11, rolex_engine::single_write_pieces(len, bd.nics.len()), d)?;
    let (fl, d) = flag();
    wide.submit_single_write(len, Some(11), (&big, 0), (&bd, 0), d)?;
    wait(&fl)??;
    wait(&landed)??;
    ensure!(
        bdst.to_vec(0, len as usize)? == pattern(len as usize, 6),
        "sharded write incomplete"
    );
    Ok(())
}

/// Most devices the multi-device case exercises one by one (a p5 has 32).
pub const MAX_DEVICES: usize = 32;

/// One write with an immediate, one read and one fetch-and-add between
/// two engines; `what` names them in failures.
fn one_of_each(a: &TransferEngine, b: &TransferEngine, what: &str) -> CaseResult {
    let (src, _) = a.alloc_mr(8192, Access::all())?;
    let (dst, dd) = b.alloc_mr(8192, Access::all())?;
    src.write(0, &pattern(4096, 8))?;
    let (landed, d) = flag();
    b.expect_imm_count(21, 1, d)?;
    let (fl, d) = flag();
    a.submit_single_write(4096, Some(21), (&src, 0), (&dd, 0), d)?;
    wait(&fl)??;
    wait(&landed)??;
    ensure!(
        dst.to_vec(0, 4096)? == pattern(4096, 8),
        "{what}: write misplaced"
    );
    let (fl, d) = flag();
    a.submit_read(4096, (&src, 4096), (&dd, 0), d)?;
    wait(&fl)??;
    ensure!(
        src.to_vec(4096, 4096)? == pattern(4096, 8),
        "{what}: read misplaced"
    );
    let old = nic_atomic(a, &dd, 6000, Atomic::Faa(5))?;
    ensure!(
        old == 0 && dst.load_u64(6000)? == 5,
        "{what}: fetch-and-add returned {old}"
    );
    Ok(())
}

/// Real multi-NIC (design §4): the fabric lists its devices (printed with
/// their PCIe/NUMA placement), each device opens and carries a write with
/// an immediate, a read and an atomic, and an engine with as many NICs as
/// the default choice takes (up to 4) opens them in that order, each once,
/// and completes a write sharded over all of them.
fn multi_device(f: &dyn FabricUnderTest) -> CaseResult {
    let listed = f.devices()?;
    ensure!(!listed.is_empty(), "the fabric lists no device");
    for l in &listed {
        eprintln!("  {}: device {l}", f.name());
    }
    for l in listed.iter().take(MAX_DEVICES) {
        let a = f.engine_on(&l.name, 1)?;
        let b = f.engine_on(&l.name, 1)?;
        let on = a.devices(0)?;
        ensure!(
            on == [l.name.clone()],
            "asked for device {}, the engine opened {on:?}",
            l.name
        );
        one_of_each(&a, &b, &l.name)?;
    }
    let names: Vec<String> = listed.iter().map(|l| l.name.clone()).collect();
    let chosen = topology::choose(&NicSelect::default(), &f.name(), &names)
        .map_err(|e| Failure(format!("default choice: {e}")))?;
    let k = chosen.len().min(4);
    let a = f.engine_listed(k)?;
    let b = f.engine_listed(k)?;
    let want: Vec<String> = chosen[..k].iter().map(|&i| names[i].clone()).collect();
    let got = a.devices(0)?;
    ensure!(
        got == want,
        "the default choice opened {got:?}, expected {want:?}"
    );
    let len = k as u64 * rolex_engine::SPLIT_MIN;
    let (src, _) = a.alloc_mr(len, Access::all())?;
    let (dst, dd) = b.alloc_mr(len, Access::all())?;
    src.write(0, &pattern(len as usize, 9))?;
    let (landed, d) = flag();
    b.expect_imm_count(22, rolex_engine::single_write_pieces(len, b.nics()), d)?;
    let (fl, d) = flag();
    a.submit_single_write(len, Some(22), (&src, 0), (&dd, 0), d)?;
    wait(&fl)??;
    wait(&landed)??;
    ensure!(
        dst.to_vec(0, len as usize)? == pattern(len as usize, 9),
        "write sharded over {want:?} incomplete"
    );
    Ok(())
}

/// Every case, in run order.
pub const CASES: &[Case] = &[
    Case {
        name: "write_read_round_trip",
        run: write_read_round_trip,
    },
    Case {
        name: "imm_counts_whatever_the_order",
        run: imm_counts_whatever_the_order,
    },
    Case {
        name: "protection_changes_nothing",
        run: protection_changes_nothing,
    },
    Case {
        name: "atomics_are_atomic",
        run: atomics_are_atomic,
    },
    Case {
        name: "cpu_and_nic_atomics_agree",
        run: cpu_and_nic_atomics_agree,
    },
    Case {
        name: "send_recv",
        run: send_recv,
    },
    Case {
        name: "paged_scatter_barrier",
        run: paged_scatter_barrier,
    },
    Case {
        name: "split_over_four_nics",
        run: split_over_four_nics,
    },
    Case {
        name: "small_ops_spread_over_nics",
        run: small_ops_spread_over_nics,
    },
    Case {
        name: "multi_device",
        run: multi_device,
    },
];

/// What a run of the suite did.
#[derive(Debug, Default)]
pub struct Report {
    /// Fabrics run, with the cases passed and the cases run (those
    /// `ROLEX_HWTESTS_CASE` selected).
    pub ran: Vec<(String, usize, usize)>,
    /// Fabrics skipped, with the reason.
    pub skipped: Vec<(String, String)>,
    /// `(fabric, case, why)` for every failure.
    pub failures: Vec<(String, &'static str, String)>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, passed, run) in &self.ran {
            write!(f, "ran     {name}: {passed}/{run} cases passed")?;
            if *run < CASES.len() {
                write!(f, " ({} of {} selected)", run, CASES.len())?;
            }
            writeln!(f)?;
        }
        for (name, why) in &self.skipped {
            writeln!(f, "skipped {name}: {why}")?;
        }
        for (fab, case, why) in &self.failures {
            writeln!(f, "FAILED  {fab} / {case}: {why}")?;
        }
        Ok(())
    }
}

/// Runs every case on every available fabric. `ROLEX_HWTESTS_ONLY`
/// (a substring of fabric names) and `ROLEX_HWTESTS_CASE` (a substring of
/// case names) narrow the run; each case is announced on stderr.
pub fn run_all() -> Report {
    let only = std::env::var("ROLEX_HWTESTS_ONLY").unwrap_or_default();
    let case_only = std::env::var("ROLEX_HWTESTS_CASE").unwrap_or_default();
    let mut report = Report::default();
    for c in fabrics() {
        match c {
            Candidate::Skipped { name, reason } => report.skipped.push((name, reason)),
            Candidate::Available(fab) if !fab.name().contains(&only) => report
                .skipped
                .push((fab.name(), "not selected by ROLEX_HWTESTS_ONLY".into())),
            Candidate::Available(fab) => {
                let (mut passed, mut run) = (0, 0);
                for case in CASES.iter().filter(|c| c.name.contains(&case_only)) {
                    run += 1;
                    eprintln!("conformance: {} / {}", fab.name(), case.name);
                    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        (case.run)(&*fab)
                    })) {
                        Ok(Ok(())) => passed += 1,
                        Ok(Err(e)) => report.failures.push((fab.name(), case.name, e.0)),
                        Err(_) => report
                            .failures
                            .push((fab.name(), case.name, "panicked".into())),
                    }
                }
                report.ran.push((fab.name(), passed, run));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skips(c: Vec<Candidate>) -> Vec<(String, String)> {
        c.into_iter()
            .map(|c| match c {
                Candidate::Skipped { name, reason } => (name, reason),
                Candidate::Available(f) => panic!("{} should be skipped", f.name()),
            })
            .collect()
    }

    #[test]
    fn verbs_without_devices_is_one_skip_with_the_reason() {
        assert_eq!(
            skips(verbs_candidates(Vec::new())),
            [(
                "verbs".to_string(),
                "no RDMA device in /sys/class/infiniband".to_string()
            )]
        );
    }

    #[test]
    fn verbs_lists_every_device_sorted() {
        // Names no machine has, so the probe reports them as not opening
        // (with the feature) or asks for the feature (without).
        let s = skips(verbs_candidates(vec![
            "zz-rolex-absent1".into(),
            "aa-rolex-absent0".into(),
        ]));
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].0, "verbs aa-rolex-absent0");
        assert_eq!(s[1].0, "verbs zz-rolex-absent1");
        assert!(s[0].1.contains("aa-rolex-absent0"), "{}", s[0].1);
    }
}
