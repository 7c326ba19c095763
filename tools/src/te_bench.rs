//! `rolex te-bench`: bandwidth, operation rate and latency of the transfer
//! engine, with `memcpy` of the same size measured in the same run so the
//! ratio is honest on a noisy machine.
//!
//! Two phases per run: a throughput phase (each thread keeps `--depth`
//! operations in flight) gives `gbps` and `mops`; a latency phase (one
//! operation at a time) gives `p50_us` and `p99_us`. For `write-imm` the
//! latency is until the receiver's ImmCounter expectation fires, and the
//! throughput phase ends when the receiver has counted every piece. In
//! the throughput phase a thread waiting for its oldest operation uses
//! `CompletionFlag::wait`: it polls the completion itself for `--spin-us`
//! and then parks (the peer may need the CPU); so does the latency phase.
//! Bandwidths are in Gbit/s. Operations are submitted as the API offers
//! them (posted by the submitting thread when the engine's group is free,
//! else by its worker), under `TransferEngine::plug` in the throughput
//! phase: the resubmissions that follow completions read together go out
//! in one post call (`--no-plug`: one each); `--channel` runs `read`,
//! `write`, `cas` and `faa` as client doorbell batches of `--depth`
//! operations instead, in both phases: its latency is a whole batch's
//! (on `tcp`, consecutive reads of a batch travel as one request and one
//! response: `--channel --op read --depth 2` against `--depth 1` shows
//! what a second read in a batch costs).
//!
//! On a libfabric fabric a plain TCP stream over 127.0.0.1 with writes of
//! the same size (`std::net`, one sender and one receiver thread, like
//! `iperf3 -l SIZE`) is measured before and after each size too, and the
//! better of the two is the `tcp_gbps` reference (`tcp_ratio` = engine /
//! stream): the bound a single tcp connection sets on this machine.
//!
//! Across processes (`--serve` / `--peer`, libfabric) there is no memcpy
//! reference; the provider's own `fi_pingpong` is the yardstick, and the
//! figures mean different things. `fi_pingpong`'s MB/s is 2 × size ×
//! iterations over the time of as many round trips, one message in flight
//! at a time (size over the one-way time), and its usec/xfer is half a
//! round trip. Here `gbps` is size × count over the time of the writes,
//! `--depth` of them in flight from one side, each complete only once its
//! data is visible at the target (delivery completion: data one way, an
//! acknowledgement back; `delivery_acks` counts the posts that asked for
//! one: the writes of one post to one peer share the last one's; paged
//! writes over `tcp` go instead as messages the target places and
//! acknowledges, `paged_by_message` counting them, `--paged-by-message
//! off` to compare). So `--depth 1` is the like-for-like bandwidth
//! (one transfer in flight; it pays the acknowledgement that a ping-pong
//! does not), a deeper run shows streaming, and `p50_us` of a remote
//! `write-imm` is a round trip: compare it with twice `fi_pingpong`'s
//! usec/xfer. So is every 8-byte `write`, `read`, `cas` and `faa` at
//! `--depth 1`, whose mean time (1 / `mops`) is comparable with twice
//! `fi_pingpong`'s usec/xfer too (a mean, after a warm-up of a few
//! operations that sets up the connection, as `fi_pingpong`'s is). The
//! server reads its queue without pause while it is being used
//! (`--busy-poll-us`, 10 ms after each operation by default, as
//! `fi_pingpong` polls) and prints the CPU that costs every 5 s.
//!
//! `--sweep` runs the measurement for every size from 64 B to 4 MiB
//! (powers of 4) on the same engines and regions, one line per size (with
//! `--json`, one object per size with the keys of a single run; counters
//! are the size's own), and `--plot FILE.svg` draws bandwidth and latency
//! against size with memcpy beside them (`crate::plot`). It works against
//! `--peer` too, without memcpy; the server's `--region` must then hold
//! 4 MiB per thread (`--pages` times that for `paged`).

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rolex_host::domain::fabric::bootstrap::{Bootstrap, BootstrapServer, Offer};
use rolex_host::domain::fabric::{LibfabricConfig, PagedMode};

use crate::cpu::{process_cpu, share, CpuWindow};
use crate::fabric::{parse_fabric, serving_node, verbs_fabric, FabricArg, VerbsArgs, NO_VERBS};
use crate::plot::{self, SweepPoint};
use rolex_host::{
    single_write_pieces, Access, BatchOp, CompletionFlag, CounterSnapshot, EngineConfig, Fabric,
    LoopbackConfig, MrDesc, MrHandle, OnDone, OnValue, Pages, ScatterDst, TransferEngine,
    TransferError,
};

/// The operation measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Op {
    /// Single one-sided write.
    Write,
    /// One-sided read.
    Read,
    /// Write with immediate, counted by the receiver.
    WriteImm,
    /// Paged writes of `--pages` pages of `--size` bytes.
    Paged,
    /// Scatter of `--size` bytes to each of `--pages` peers.
    Scatter,
    /// 8-byte compare-and-swap.
    Cas,
    /// 8-byte fetch-and-add.
    Faa,
}

/// The layout version `te-bench --serve` offers (one plain region).
const TE_BENCH_LAYOUT: u32 = 1;

/// Arguments of `rolex te-bench`.
#[derive(Debug, Args)]
pub struct TeBenchArgs {
    /// Operation to measure (not with `--serve`; `--sweep` defaults to
    /// `write`).
    #[arg(long, value_enum, required_unless_present_any = ["serve", "sweep"])]
    op: Option<Op>,
    /// Bytes per operation (per page for `paged`, per peer for `scatter`;
    /// ignored by `cas`/`faa`, which move 8 bytes).
    #[arg(long, required_unless_present_any = ["serve", "sweep"])]
    size: Option<u64>,
    /// Measure every size from 64 B to 4 MiB (powers of 4) instead of
    /// `--size`: one line per size (size, Gbit/s, Mops/s, p50 and p99
    /// latency, memcpy of that size in the same run, and on libfabric a
    /// plain TCP stream of that write size and the ratio to it).
    /// Loopback, or `--peer` (no memcpy there; the server's `--region`
    /// must hold 4 MiB per thread). Not for `cas`/`faa`.
    #[arg(long, conflicts_with_all = ["size", "serve"])]
    sweep: bool,
    /// With `--sweep`: draw bandwidth and latency against size, memcpy
    /// beside them, into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Operations in the throughput phase (default: about 256 MiB worth,
    /// between 100 and 100000; per size with `--sweep`).
    #[arg(long)]
    count: Option<u64>,
    /// Pages per paged write, or peers of a scatter.
    #[arg(long, default_value_t = 16)]
    pages: u64,
    /// NICs per engine (1 to 4).
    #[arg(long, default_value_t = 1)]
    nics: usize,
    /// Which devices the NICs open (libfabric, verbs): `listed` (every
    /// device in the provider's order), `near:0000:53:00.0` (nearest that
    /// PCI device, e.g. a GPU), `numa:1`, or device names `mlx5_0,mlx5_1`.
    #[arg(long, value_name = "CHOICE")]
    nic_choice: Option<rolex_host::NicChoice>,
    /// Submitting threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Domain groups of the submitting engine (each its own worker and
    /// NICs; `EngineConfig::groups`). Thread `t` posts from a region of
    /// group `t mod groups`, so threads in different groups share no
    /// endpoint lock. Default: one per thread (at most 16).
    #[arg(long)]
    groups: Option<usize>,
    /// Operations each thread keeps in flight in the throughput phase
    /// (1 to 65536; with `--channel`, the operations of each batch).
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Run read/write/cas/faa as client-channel doorbell batches of
    /// `--depth` operations, in the latency phase too (its samples are
    /// then whole batches).
    #[arg(long)]
    channel: bool,
    /// Post every submission of the throughput phase on its own instead
    /// of under the engine's `plug` (which posts a thread's submissions
    /// to a busy group together).
    #[arg(long)]
    no_plug: bool,
    /// libfabric: whether paged writes travel packed into messages that
    /// the target's domain places (`LibfabricConfig::paged_by_message`;
    /// `auto`: where the provider's RMA runs in the target's CPU anyway
    /// and its progress is manual, i.e. `tcp`; `on` also on `sockets`).
    /// JSON `paged_by_message` counts the messages.
    #[arg(long, value_enum, default_value_t = PagedArg::Auto)]
    paged_by_message: PagedArg,
    /// libfabric `tcp;ofi_rxm`: the largest message the provider sends
    /// eagerly (`FI_OFI_RXM_BUFFER_SIZE`, 16 KiB by the provider's
    /// default), set before the provider starts when the environment does
    /// not set it; 0 leaves the provider's default. A paged transfer of 16
    /// pages of 1 KiB then travels as one message, not two (see the
    /// README's bandwidth section); each receive buffer grows with it (a
    /// te-bench server's memory: about +80 MB at 32 KiB). Both ends must
    /// use the same size: `ofi_rxm` processes whose sizes differ never
    /// connect, so a server refuses a client of another size at the
    /// bootstrap, naming both; a te-bench server and client agree by
    /// default. A program
    /// that links the engine sets the variable itself, before it starts
    /// threads.
    #[arg(long, default_value_t = 32768)]
    rxm_buffer_size: u64,
    /// The fabric: `loopback`, `libfabric:PROVIDER`, or `verbs[:DEVICE]`
    /// (ConnectX RC through libibverbs; a build with `--features verbs`).
    #[arg(long, default_value = "loopback", value_parser = parse_fabric)]
    fabric: FabricArg,
    #[command(flatten)]
    verbs: VerbsArgs,
    /// Serve a target region to a client in another process (libfabric),
    /// until stopped.
    #[arg(long, requires = "listen")]
    serve: bool,
    /// Bootstrap address to listen on with `--serve` (`ADDR:PORT`).
    #[arg(long)]
    listen: Option<String>,
    /// Bootstrap address of a `--serve` process to measure against.
    #[arg(long, conflicts_with = "serve")]
    peer: Option<String>,
    /// Shared token of the bootstrap connection.
    #[arg(long, default_value = "rolex")]
    token: String,
    /// Node (IP address) libfabric endpoints open on (default: the
    /// `--listen` address, else 127.0.0.1; unused by `shm`).
    #[arg(long)]
    node: Option<String>,
    /// Bytes of the region `--serve` offers.
    #[arg(long, default_value_t = 64 << 20)]
    region: u64,
    /// libfabric: the worker reads the queue without pause (yielding the
    /// CPU between reads) for this many µs after the last activity before
    /// it sleeps on the wait object (latency vs CPU). Default: 1000 for a
    /// client, whose worker then reads completions and acknowledgements
    /// while its submitting threads post (an idle client still sleeps; 0
    /// leaves every read to the waiting threads and the wait object, which
    /// on `tcp` costs a wake-up of two threads per few transfers: about
    /// half the rate of paged writes at `--depth 32`); 10000 with
    /// `--serve`, which then serves a benchmark's operations as fast as
    /// the provider allows (as `fi_pingpong` does) and prints the CPU that
    /// costs. A client's CPU is in `cpus` and `cpu_us_per_op`.
    #[arg(long)]
    busy_poll_us: Option<u64>,
    /// How long a thread waiting for its operation polls the completion
    /// itself before it sleeps (the engine's `EngineConfig::spin`).
    #[arg(long, default_value_t = rolex_host::DEFAULT_SPIN.as_micros() as u64)]
    spin_us: u64,
    /// libfabric: queue-read interval in µs once idle (default: the
    /// domain's own, `LibfabricConfig::idle_poll`).
    #[arg(long)]
    idle_poll_us: Option<u64>,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
}

const IMM: u32 = 0x7e_0000;
/// Operations run against a peer before measuring (connection set-up).
const WARM_UP: u64 = 10;
/// `--busy-poll-us` of `--serve` by default.
const SERVE_BUSY_POLL_US: u64 = 10_000;
/// `--busy-poll-us` of a client by default: measured on a 2-core VM over
/// `tcp` (paged 16 x 1 KiB at depth 32, the same minutes), the worker
/// asleep between reads woke with the submitting thread about once per
/// two transfers (11 µs of CPU per transfer, 11 Gbit/s); polling while
/// the run is active, 6.2 µs and 20 Gbit/s. Short gaps (a preempted
/// submitter) do not put it to sleep; a finished run does.
const CLIENT_BUSY_POLL_US: u64 = 1_000;
/// How often `--serve` reports the CPU it used, when it used any.
const SERVE_REPORT: Duration = Duration::from_secs(5);
const MAX_REGION: u64 = 4 << 30;
/// Largest `--depth`: each operation in flight holds a flag (or, with
/// `--channel`, a place in the batch); far beyond what any NIC keeps in
/// flight per thread.
const MAX_DEPTH: usize = 1 << 16;
/// Operations a throughput thread completes between two progress updates.
const PROGRESS_STEP: u64 = 1024;
/// Most domain groups of a submitting engine (`--groups`).
const MAX_GROUPS: usize = 16;

struct Ctx {
    op: Op,
    /// Bytes per operation now (see [`Ctx::set_size`]).
    size: u64,
    a: TransferEngine,
    /// The target engine (`None` when it is another process).
    b: Option<TransferEngine>,
    peers: Vec<(TransferEngine, MrHandle, MrDesc)>,
    srcs: Vec<MrHandle>,
    /// The target region (kept for its owner; peers use `dst`).
    _dst_handle: Option<MrHandle>,
    dst: MrDesc,
    /// Per thread: the shuffled source and destination page indices.
    page_order: Vec<(Vec<u32>, Vec<u32>)>,
    /// Per thread: source and destination page lists at `size`.
    pages: Vec<(Pages, Pages)>,
    scatter: Vec<Vec<ScatterDst>>,
    /// Bytes one operation moves.
    bytes: u64,
    /// Immediate pieces one write-imm delivers.
    pieces: u32,
    nics: usize,
    /// The throughput phase submits under `TransferEngine::plug`.
    plug: bool,
}

impl Ctx {
    /// Makes every operation `size` bytes (at most the size the regions
    /// were allocated for): page lists, scatter slices, bytes and pieces.
    fn set_size(&mut self, size: u64) {
        self.size = size;
        let n_pages = self.page_order.first().map_or(1, |p| p.0.len()) as u64;
        self.pages = self
            .page_order
            .iter()
            .enumerate()
            .map(|(t, (si, di))| {
                (
                    Pages {
                        indices: si.clone(),
                        stride: size,
                        offset: 0,
                    },
                    Pages {
                        indices: di.clone(),
                        stride: size,
                        offset: t as u64 * size * n_pages,
                    },
                )
            })
            .collect();
        self.scatter = (0..self.srcs.len())
            .map(|t| {
                self.peers
                    .iter()
                    .map(|p| ScatterDst {
                        len: size,
                        src: 0,
                        dst: p.2.clone(),
                        dst_offset: t as u64 * size,
                    })
                    .collect()
            })
            .collect();
        self.bytes = match self.op {
            Op::Paged => size * n_pages,
            Op::Scatter => size * self.peers.len() as u64,
            _ => size,
        };
        self.pieces = single_write_pieces(size, self.nics);
    }
}

type BenchError = Box<dyn std::error::Error>;

impl TeBenchArgs {
    fn op(&self) -> Op {
        self.op.unwrap_or(Op::Write)
    }
    /// The largest size of the run (`--size`, or the sweep's last).
    fn size(&self) -> u64 {
        if self.sweep {
            sweep_sizes().last().unwrap_or(0)
        } else {
            self.size.unwrap_or(0)
        }
    }
}

/// The sizes of `--sweep`: 64 B to 4 MiB, powers of 4.
fn sweep_sizes() -> impl Iterator<Item = u64> {
    (0..9).map(|i| 64u64 << (2 * i))
}

fn validate(args: &TeBenchArgs) -> Result<(), BenchError> {
    // Checked here: clap's `requires` counts the flag's default as given.
    if args.plot.is_some() && !args.sweep {
        return Err("--plot draws a sweep: add --sweep".into());
    }
    if args.sweep {
        if matches!(args.op(), Op::Cas | Op::Faa) {
            return Err("--sweep varies the size: not with cas or faa (always 8 bytes)".into());
        }
    } else if args.op.is_none() || args.size.is_none() {
        return Err("--op and --size are required (except with --serve or --sweep)".into());
    }
    if args.size() == 0 {
        return Err("--size must be at least 1 byte".into());
    }
    if !(1..=4).contains(&args.nics) {
        return Err(format!("--nics must be 1 to 4, not {}", args.nics).into());
    }
    if args.threads == 0 || args.depth == 0 || args.pages == 0 {
        return Err("--threads, --depth and --pages must be at least 1".into());
    }
    if args.depth > MAX_DEPTH {
        return Err(format!(
            "--depth must be between 1 and {MAX_DEPTH} (a flag, or with --channel an \
             operation of the batch, per operation in flight), not {}",
            args.depth
        )
        .into());
    }
    if args.count == Some(0) {
        return Err("--count must be at least 1".into());
    }
    if args.peer.is_some() && args.op() == Op::Scatter {
        return Err("--op scatter needs several targets: not with --peer".into());
    }
    if (args.peer.is_some() || args.serve) && args.fabric == FabricArg::Loopback {
        return Err("--peer and --serve need --fabric libfabric:PROVIDER or verbs".into());
    }
    if matches!(args.fabric, FabricArg::Verbs(_)) && !cfg!(feature = "verbs") {
        return Err(format!("--fabric verbs: {NO_VERBS}").into());
    }
    if args.channel && !matches!(args.op(), Op::Write | Op::Read | Op::Cas | Op::Faa) {
        return Err("--channel applies to write, read, cas and faa only".into());
    }
    if args.size() > 1 << 30 {
        return Err(format!(
            "--size {} exceeds the engine's 1 GiB transfer limit",
            args.size()
        )
        .into());
    }
    if let Some(path) = &args.plot {
        plot::create(path)?;
    }
    Ok(())
}

/// `--paged-by-message`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum PagedArg {
    Auto,
    On,
    Off,
}

fn engine(args: &TeBenchArgs, groups: usize) -> Result<TransferEngine, BenchError> {
    let fabric = match &args.fabric {
        FabricArg::Loopback => Fabric::Loopback(LoopbackConfig::default()),
        FabricArg::Libfabric(p) => {
            let node = serving_node(p, args.node.as_deref(), args.listen.as_deref());
            let mut cfg = LibfabricConfig {
                busy_poll: Duration::from_micros(args.busy_poll_us.unwrap_or(if args.serve {
                    SERVE_BUSY_POLL_US
                } else {
                    CLIENT_BUSY_POLL_US
                })),
                ..LibfabricConfig::new(p, node.as_deref())
            };
            if let Some(us) = args.idle_poll_us {
                cfg.idle_poll = Duration::from_micros(us);
            }
            cfg.paged_by_message = match args.paged_by_message {
                PagedArg::Auto => PagedMode::Auto,
                PagedArg::On => PagedMode::On,
                PagedArg::Off => PagedMode::Off,
            };
            Fabric::Libfabric(cfg)
        }
        // Bulk transfers: relaxed ordering, as the source does.
        FabricArg::Verbs(device) => verbs_fabric(device.clone(), &args.verbs, true)?,
    };
    let mut fabric = fabric;
    if let Some(choice) = &args.nic_choice {
        match &mut fabric {
            Fabric::Libfabric(c) => c.nics.choice = choice.clone(),
            #[cfg(feature = "verbs")]
            Fabric::Verbs(c) => c.nics.choice = choice.clone(),
            _ => {}
        }
    }
    let e = TransferEngine::new(EngineConfig {
        groups,
        nics_per_group: args.nics,
        fabric,
        // Pinning picks CPUs round-robin within one process: the two
        // processes of a libfabric run on one machine would both put
        // their worker on the first CPU.
        pin_workers: args.fabric == FabricArg::Loopback,
        spin: Duration::from_micros(args.spin_us),
        ..EngineConfig::default()
    })?;
    // Once per process (a local run opens several engines), on stderr:
    // stdout carries the banner or the (JSON) result.
    static SHOWN: std::sync::Once = std::sync::Once::new();
    if let Some(n) = e.libfabric() {
        SHOWN.call_once(|| eprintln!("te-bench: {n}"));
    }
    Ok(e)
}

/// `--serve`: offers one region to clients until the process is stopped.
fn serve(args: &TeBenchArgs) -> Result<(), BenchError> {
    let listen = args
        .listen
        .as_deref()
        .ok_or("--serve needs --listen ADDR:PORT")?;
    if args.fabric == FabricArg::Loopback {
        return Err("--serve needs --fabric libfabric:PROVIDER or verbs".into());
    }
    let region = args.region.clamp(4096, MAX_REGION);
    let e = engine(args, 1)?;
    let (h, desc) = e.alloc_mr(region, Access::all())?;
    // Fault the region in now, as registering it with an RDMA NIC would
    // (pinning): a software provider's first writes to a page would
    // otherwise pay the page fault, and the first run after a start
    // measured 20-40% slower than the next.
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < region {
        let n = (region - at).min(zeros.len() as u64);
        h.write(at, &zeros[..n as usize])?;
        at += n;
    }
    let offer = Offer {
        addr: e.main_address(),
        descs: vec![desc],
        layout_version: TE_BENCH_LAYOUT,
    };
    let boot = Bootstrap::new(&args.token).with_rxm_buffer(args.fabric.rxm_buffer());
    let srv = BootstrapServer::start(listen, boot, offer)?;
    println!(
        "te-bench serving {region} bytes on {} ({}), bootstrap on {}",
        args.fabric.name(),
        e.main_address(),
        srv.local_addr()
    );
    use std::io::Write as _;
    std::io::stdout().flush()?;
    // The target of one-sided operations over a software provider is its
    // CPU: say what serving costs, whenever it cost anything.
    let mut window = CpuWindow::start();
    let mut report = true;
    let mut refused = 0;
    loop {
        std::thread::sleep(SERVE_REPORT);
        // The peers the bootstrap server refused meanwhile: a count and
        // the last one (a flood of connections is not a flood of lines).
        let n = srv.refusals().count();
        if n > refused {
            eprintln!(
                "te-bench serve: refused {} bootstrap peer(s) (last: {})",
                n - refused,
                srv.refusals().last().unwrap_or_default()
            );
            refused = n;
        }
        let (cpu, wall) = window.take();
        if report && cpu >= Duration::from_millis(1) {
            let mut out = std::io::stdout().lock();
            // A reader that went away (a closed pipe) ends the reports,
            // not the service.
            report = writeln!(
                out,
                "te-bench serve: {:.3} s of CPU in the last {:.1} s ({:.0}% of a core; busy poll {} µs)",
                cpu.as_secs_f64(),
                wall.as_secs_f64(),
                share(cpu, wall),
                args.busy_poll_us.unwrap_or(SERVE_BUSY_POLL_US)
            )
            .and_then(|()| out.flush())
            .is_ok();
        }
    }
}

fn setup(args: &TeBenchArgs) -> Result<Ctx, BenchError> {
    let size = match args.op() {
        Op::Cas | Op::Faa => 8,
        _ => args.size(),
    };
    let per_thread = match args.op() {
        Op::Paged => size
            .checked_mul(args.pages)
            .ok_or("--size × --pages overflows")?,
        _ => size,
    };
    let region = per_thread
        .checked_mul(args.threads as u64)
        .filter(|r| *r <= MAX_REGION)
        .ok_or("the benchmark's regions would exceed 4 GiB: lower --size, --pages or --threads")?;
    let groups = match args.groups {
        Some(g) if !(1..=MAX_GROUPS).contains(&g) => {
            return Err(format!("--groups {g}: between 1 and {MAX_GROUPS}").into())
        }
        Some(g) => g,
        None => args.threads.clamp(1, MAX_GROUPS),
    };
    let a = engine(args, groups)?;
    let (b, dst_handle, dst) = match &args.peer {
        Some(peer) => {
            let offer = Bootstrap::new(&args.token)
                .with_rxm_buffer(args.fabric.rxm_buffer())
                .fetch(peer, TE_BENCH_LAYOUT)?;
            let dst = offer
                .descs
                .into_iter()
                .next()
                .ok_or("the server offered no region")?;
            if dst.len < region {
                return Err(format!(
                    "the server's region has {} bytes, this run needs {region}: start it with --region {region}",
                    dst.len
                )
                .into());
            }
            (None, None, dst)
        }
        None => {
            let b = engine(args, 1)?;
            let (h, d) = b.alloc_mr(region, Access::all())?;
            (Some(b), Some(h), d)
        }
    };
    let mut srcs = Vec::new();
    for t in 0..args.threads {
        let (h, _) = a.alloc_mr_in(t % groups, per_thread, Access::all())?;
        h.fill(0x5a)?;
        srcs.push(h);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let n = if args.op() == Op::Paged {
        args.pages as u32
    } else {
        1
    };
    let page_order = (0..args.threads)
        .map(|_| {
            let mut si: Vec<u32> = (0..n).collect();
            let mut di: Vec<u32> = (0..n).collect();
            si.shuffle(&mut rng);
            di.shuffle(&mut rng);
            (si, di)
        })
        .collect();
    let mut peers = Vec::new();
    if args.op() == Op::Scatter {
        for _ in 0..args.pages {
            let e = engine(args, 1)?;
            let (h, d) = e.alloc_mr(region, Access::all())?;
            peers.push((e, h, d));
        }
    }
    let mut ctx = Ctx {
        op: args.op(),
        size,
        a,
        b,
        peers,
        srcs,
        _dst_handle: dst_handle,
        dst,
        page_order,
        pages: Vec::new(),
        scatter: Vec::new(),
        bytes: 0,
        pieces: 0,
        nics: args.nics,
        plug: !args.no_plug,
    };
    ctx.set_size(size);
    Ok(ctx)
}

/// Waits for a flag as a user of the engine does
/// (`CompletionFlag::wait`: polls the completion itself for `--spin-us`,
/// then parks until the completing thread unparks it); gives up after a
/// generous hang guard.
fn wait(f: &CompletionFlag) -> Result<u64, BenchError> {
    match f.wait(Duration::from_secs(120)) {
        Some(r) => Ok(r?),
        None => Err("an operation did not complete within 120 s".into()),
    }
}

fn submit(
    ctx: &Ctx,
    t: usize,
    imm: Option<u32>,
    f: &Arc<CompletionFlag>,
) -> Result<(), TransferError> {
    let src = &ctx.srcs[t];
    let off = t as u64 * ctx.size;
    match ctx.op {
        Op::Write | Op::WriteImm => {
            ctx.a
                .submit_single_write(ctx.size, imm, (src, 0), (&ctx.dst, off), OnDone::flag(f))
        }
        Op::Read => ctx
            .a
            .submit_read(ctx.size, (src, 0), (&ctx.dst, off), OnDone::flag(f)),
        Op::Paged => {
            let (sp, dp) = &ctx.pages[t];
            ctx.a
                .submit_paged_writes(ctx.size, imm, (src, sp), (&ctx.dst, dp), OnDone::flag(f))
        }
        Op::Scatter => ctx
            .a
            .submit_scatter(None, OnDone::flag(f), imm, src, &ctx.scatter[t]),
        Op::Cas => ctx.a.submit_cas((&ctx.dst, off), 0, 0, OnValue::flag(f)),
        Op::Faa => ctx.a.submit_faa((&ctx.dst, off), 1, OnValue::flag(f)),
    }
}

fn batch_op<'a>(ctx: &'a Ctx, t: usize) -> BatchOp<'a> {
    let off = t as u64 * ctx.size;
    let src = &ctx.srcs[t];
    match ctx.op {
        Op::Read => BatchOp::Read {
            dst: src,
            dst_offset: 0,
            src: &ctx.dst,
            src_offset: off,
            len: ctx.size,
        },
        Op::Cas => BatchOp::Cas {
            dst: &ctx.dst,
            offset: off,
            expected: 0,
            new: 0,
        },
        Op::Faa => BatchOp::Faa {
            dst: &ctx.dst,
            offset: off,
            add: 1,
        },
        _ => BatchOp::Write {
            src,
            src_offset: 0,
            dst: &ctx.dst,
            dst_offset: off,
            len: ctx.size,
            imm: None,
        },
    }
}

/// Throughput phase of one thread: `n` operations, `depth` in flight.
fn throughput(
    ctx: &Ctx,
    t: usize,
    n: u64,
    depth: usize,
    channel: bool,
    bar: &ProgressBar,
) -> Result<(), BenchError> {
    if channel {
        let mut ch = ctx.a.channel()?;
        let ops = vec![batch_op(ctx, t); depth];
        let mut res = Vec::new();
        let mut done = 0;
        while done < n {
            let k = (n - done).min(depth as u64) as usize;
            ch.run(&ops[..k], &mut res)?;
            if let Some(Err(e)) = res.iter().find(|r| r.is_err()) {
                return Err(e.clone().into());
            }
            done += k as u64;
            bar.inc(k as u64);
        }
        return Ok(());
    }
    let imm = (ctx.op == Op::WriteImm).then_some(IMM);
    let flags: Vec<_> = (0..depth).map(|_| CompletionFlag::new()).collect();
    // The bar is shared by the threads: an update per operation was a
    // tenth of a loopback 4 KiB write's CPU, and its cache line bounced
    // between two submitting threads.
    let mut unshown = 0u64;
    let mut done = |k: u64| {
        unshown += k;
        if unshown >= PROGRESS_STEP {
            bar.inc(std::mem::take(&mut unshown));
        }
    };
    // Resubmissions after completions that came together go out together.
    let _plug = ctx.plug.then(|| ctx.a.plug());
    for i in 0..n as usize {
        let f = &flags[i % depth];
        if i >= depth {
            wait(f)?;
            done(1);
        }
        f.reset();
        submit(ctx, t, imm, f)?;
    }
    for i in n.saturating_sub(depth as u64) as usize..n as usize {
        wait(&flags[i % depth])?;
        done(1);
    }
    bar.inc(unshown);
    Ok(())
}

/// Latency phase of one thread: `n` operations one at a time.
/// With `channel`, each sample is one doorbell batch of `batch` operations.
fn latency(
    ctx: &Ctx,
    t: usize,
    n: u64,
    channel: bool,
    batch: usize,
) -> Result<Vec<Duration>, BenchError> {
    let mut lat = Vec::with_capacity(n as usize);
    let f = CompletionFlag::new();
    let rf = CompletionFlag::new();
    let mut ch = if channel {
        Some(ctx.a.channel()?)
    } else {
        None
    };
    let op = vec![batch_op(ctx, t); if channel { batch.max(1) } else { 1 }];
    let mut res = Vec::new();
    let imm = IMM + 1 + t as u32;
    for _ in 0..n {
        f.reset();
        rf.reset();
        let start = Instant::now();
        if let Some(ch) = &mut ch {
            ch.run(&op, &mut res)?;
            if let Some(Err(e)) = res.iter().find(|r| r.is_err()) {
                return Err(e.clone().into());
            }
        } else if let (Op::WriteImm, Some(b)) = (ctx.op, &ctx.b) {
            b.expect_imm_count(imm, ctx.pieces, OnDone::flag(&rf))?;
            submit(ctx, t, Some(imm), &f)?;
            wait(&rf)?;
        } else if ctx.op == Op::WriteImm {
            // The receiver is another process: until the write completes.
            submit(ctx, t, Some(imm), &f)?;
            wait(&f)?;
        } else {
            submit(ctx, t, None, &f)?;
            wait(&f)?;
        }
        lat.push(start.elapsed());
        if ctx.op == Op::WriteImm && ch.is_none() && ctx.b.is_some() {
            wait(&f)?;
        }
    }
    Ok(lat)
}

/// How long each plain-TCP reference run streams (see [`tcp_stream_gbps`]).
const TCP_REF: Duration = Duration::from_millis(200);

/// Bandwidth (Gbit/s) of a plain TCP stream over 127.0.0.1 with writes of
/// `size` bytes: one `std::net` sender thread writing `size`-byte buffers
/// back to back, one receiver reading `size` bytes at a time (as `iperf3
/// -l SIZE` does), for `dur` after a short warm-up; bytes received over
/// the time. The yardstick of the `libfabric:tcp` runs, measured in the
/// same run on the same machine.
fn tcp_stream_gbps(size: u64, dur: Duration) -> std::io::Result<f64> {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    let len = size.clamp(1, 64 << 20) as usize;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| -> std::io::Result<f64> {
        let sender = s.spawn(|| -> std::io::Result<()> {
            let mut out = TcpStream::connect(addr)?;
            let buf = vec![0x5au8; len];
            while !stop.load(Ordering::Relaxed) {
                out.write_all(&buf)?;
            }
            Ok(())
        });
        let (mut inp, _) = listener.accept()?;
        let mut buf = vec![0u8; len];
        let mut read = |until: Instant| -> std::io::Result<u64> {
            let mut got = 0u64;
            while Instant::now() < until {
                // Check the clock every 64 reads at most.
                for _ in 0..64 {
                    let n = inp.read(&mut buf)?;
                    if n == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    got += n as u64;
                }
            }
            Ok(got)
        };
        read(Instant::now() + dur / 10)?;
        let start = Instant::now();
        let got = read(start + dur)?;
        let secs = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        // Drain until the sender sees the flag and closes.
        while inp.read(&mut buf)? > 0 {}
        sender
            .join()
            .map_err(|_| std::io::Error::other("tcp sender panicked"))??;
        Ok(got as f64 * 8.0 / secs / 1e9)
    })
}

/// memcpy bandwidth (Gbit/s) of `bytes`-sized copies, about `total` bytes.
fn memcpy_gbps(bytes: u64, total: u64) -> f64 {
    let len = bytes.min(1 << 30) as usize;
    let src = vec![0x5au8; len];
    let mut dst = vec![0u8; len];
    dst.copy_from_slice(&src);
    let reps = (total / bytes.max(1)).clamp(10, 1_000_000);
    let start = Instant::now();
    for _ in 0..reps {
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
    }
    let secs = start.elapsed().as_secs_f64();
    (len as f64 * reps as f64 * 8.0) / secs / 1e9
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

/// What one measurement (one size) found.
struct Measured {
    total_ops: u64,
    gbps: f64,
    mops: f64,
    p50_us: f64,
    p99_us: f64,
    /// Latency samples taken.
    samples: usize,
    /// memcpy of the same size, Gbit/s (`None` across processes).
    memcpy_gbps: Option<f64>,
    /// A plain TCP stream with writes of the operation's size (per page
    /// for `paged`), Gbit/s, on libfabric fabrics ([`tcp_stream_gbps`]).
    tcp_gbps: Option<f64>,
    /// CPU time this process used during the throughput phase, all
    /// threads (both engines on a local run), per operation, in µs.
    cpu_us_per_op: f64,
    /// The same as CPUs busy on average (1.0 = one core).
    cpus: f64,
    /// Context switches of this process's threads per operation in the
    /// throughput phase (each one a thread going to sleep or preempted).
    switches_per_op: f64,
    /// What the client engine counted during the measurement.
    counters: CounterSnapshot,
}

/// Runs the throughput and latency phases at `ctx`'s current size, with
/// memcpy of that size before and after (the better one counts).
fn measure(args: &TeBenchArgs, ctx: &Ctx) -> Result<Measured, BenchError> {
    let remote = ctx.b.is_none();
    let count = args
        .count
        .unwrap_or_else(|| ((256u64 << 20) / ctx.bytes.max(1)).clamp(100, 100_000));
    let per_thread = count.div_ceil(args.threads as u64);
    let total_ops = per_thread * args.threads as u64;
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total_ops);
        if let Ok(style) = ProgressStyle::with_template("{msg} {bar:30} {pos}/{len} ops") {
            b.set_style(style);
        }
        b.set_message(format!("te-bench {:?} {} B", ctx.op, ctx.size));
        b
    };
    let memcpy_ref =
        || (!remote).then(|| memcpy_gbps(ctx.bytes, (total_ops * ctx.bytes).min(1 << 30)));
    let tcp_ref = || -> Result<Option<f64>, BenchError> {
        Ok(match args.fabric {
            FabricArg::Libfabric(_) => Some(tcp_stream_gbps(ctx.size, TCP_REF)?),
            _ => None,
        })
    };
    let memcpy_before = memcpy_ref();
    let tcp_before = tcp_ref()?;
    let counters_before = ctx.a.counters().total;
    let recv_flag = CompletionFlag::new();
    if let (Op::WriteImm, Some(b)) = (ctx.op, &ctx.b) {
        let target = u32::try_from(total_ops * u64::from(ctx.pieces))
            .map_err(|_| "--count too large for one immediate's counter")?;
        b.expect_imm_count(IMM, target, OnDone::flag(&recv_flag))?;
    }
    let cpu_before = process_cpu();
    let start = Instant::now();
    std::thread::scope(|s| -> Result<(), BenchError> {
        let hs: Vec<_> = (0..args.threads)
            .map(|t| {
                let bar = &bar;
                s.spawn(move || {
                    throughput(ctx, t, per_thread, args.depth, args.channel, bar)
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| "benchmark thread panicked")??;
        }
        Ok(())
    })?;
    if ctx.op == Op::WriteImm && !remote {
        wait(&recv_flag)?;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu_after = process_cpu();
    let cpu = (cpu_after.0 - cpu_before.0).as_secs_f64();
    let switches = cpu_after.1 - cpu_before.1;
    bar.finish_and_clear();
    let lat_n = per_thread.min(2000);
    let mut lats: Vec<Duration> = std::thread::scope(|s| -> Result<Vec<Duration>, BenchError> {
        let hs: Vec<_> = (0..args.threads)
            .map(|t| {
                s.spawn(move || {
                    latency(ctx, t, lat_n, args.channel, args.depth).map_err(|e| e.to_string())
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in hs {
            all.extend(h.join().map_err(|_| "benchmark thread panicked")??);
        }
        Ok(all)
    })?;
    lats.sort_unstable();
    let counters = ctx.a.counters().total.since(&counters_before);
    let memcpy_after = memcpy_ref();
    let tcp_after = tcp_ref()?;
    Ok(Measured {
        total_ops,
        gbps: (total_ops * ctx.bytes) as f64 * 8.0 / secs / 1e9,
        mops: total_ops as f64 / secs / 1e6,
        p50_us: percentile(&lats, 0.5),
        p99_us: percentile(&lats, 0.99),
        cpu_us_per_op: cpu * 1e6 / total_ops as f64,
        cpus: cpu / secs,
        switches_per_op: switches as f64 / total_ops as f64,
        samples: lats.len(),
        memcpy_gbps: memcpy_before.zip(memcpy_after).map(|(a, b)| a.max(b)),
        // The better of the two: the ratio errs against the engine.
        tcp_gbps: tcp_before.zip(tcp_after).map(|(a, b)| a.max(b)),
        counters,
    })
}

/// The operation's name, as `--op` spells it.
fn op_name(op: Op) -> String {
    op.to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default()
}

/// One measurement as the JSON object of `te-bench --json`.
fn json_line(args: &TeBenchArgs, ctx: &Ctx, m: &Measured) -> serde_json::Value {
    let c = &m.counters;
    let mut v = serde_json::json!({
        "op": op_name(ctx.op), "size": ctx.size, "gbps": m.gbps, "mops": m.mops,
        "p50_us": m.p50_us, "p99_us": m.p99_us, "memcpy_gbps": m.memcpy_gbps,
        "ratio": m.memcpy_gbps.map(|r| m.gbps / r), "count": m.total_ops, "nics": args.nics,
        "threads": args.threads, "groups": ctx.a.groups(), "depth": args.depth,
        "channel": args.channel,
        "fabric": args.fabric.name(), "doorbells": c.doorbells, "rtts": c.rtts,
        "direct_posts": c.direct_posts, "handoffs": c.handoffs,
        "delivery_acks": c.delivery_acks, "paged_by_message": c.paged_by_message,
        "worker_wakes": c.worker_wakes,
        "bytes_written": c.bytes_written, "bytes_read": c.bytes_read,
        "atomics": c.atomics, "errors": c.errors,
        "cpu_us_per_op": m.cpu_us_per_op, "cpus": m.cpus,
        "switches_per_op": m.switches_per_op,
    });
    if let (Some(tcp), Some(o)) = (m.tcp_gbps, v.as_object_mut()) {
        o.insert("tcp_gbps".into(), tcp.into());
        o.insert("tcp_ratio".into(), (m.gbps / tcp).into());
    }
    if m.memcpy_gbps.is_none() {
        // No memcpy reference across processes.
        if let Some(o) = v.as_object_mut() {
            o.remove("memcpy_gbps");
            o.remove("ratio");
        }
    }
    v
}

/// Runs the transfer-engine benchmark.
/// `--rxm-buffer-size` into the environment, where the provider reads it
/// when it starts, unless the environment already says. Called first thing,
/// while the process has one thread (setting the environment while other
/// threads may read it is not sound).
fn set_rxm_buffer_size(args: &TeBenchArgs) {
    const VAR: &str = "FI_OFI_RXM_BUFFER_SIZE";
    let libfabric = matches!(args.fabric, FabricArg::Libfabric(_));
    if libfabric && args.rxm_buffer_size > 0 && std::env::var_os(VAR).is_none() {
        std::env::set_var(VAR, args.rxm_buffer_size.to_string());
    }
}

pub fn run(args: TeBenchArgs) -> Result<(), BenchError> {
    set_rxm_buffer_size(&args);
    if args.serve {
        return serve(&args);
    }
    validate(&args)?;
    let mut ctx = setup(&args)?;
    if args.sweep {
        return sweep(&args, &mut ctx);
    }
    // As `--sweep` does: the first operations to a peer set up its
    // connection, which is no operation's latency nor rate.
    if ctx.b.is_none() {
        latency(&ctx, 0, WARM_UP, args.channel, args.depth)?;
    }
    let m = measure(&args, &ctx)?;
    if args.json {
        println!("{}", json_line(&args, &ctx, &m));
    } else {
        println!(
            "te-bench {}: size {} B × {} ops, {} NIC(s), {} thread(s), depth {}{}",
            op_name(ctx.op),
            ctx.size,
            m.total_ops,
            args.nics,
            args.threads,
            args.depth,
            if args.channel { ", channel" } else { "" }
        );
        println!(
            "  throughput   {:10.2} Gbit/s   {:10.4} Mops/s",
            m.gbps, m.mops
        );
        if let Some(memcpy) = m.memcpy_gbps {
            println!(
                "  memcpy       {memcpy:10.2} Gbit/s   (ratio {:.2})",
                m.gbps / memcpy
            );
        }
        if let Some(tcp) = m.tcp_gbps {
            println!(
                "  tcp stream   {tcp:10.2} Gbit/s   (ratio {:.2}; {} B writes, 127.0.0.1)",
                m.gbps / tcp,
                ctx.size
            );
        }
        println!(
            "  cpu          {:10.2} µs/op      {:10.2} CPUs   {:.2} switches/op (this process{})",
            m.cpu_us_per_op,
            m.cpus,
            m.switches_per_op,
            if ctx.b.is_some() {
                ", both engines"
            } else {
                ""
            }
        );
        println!(
            "  latency      p50 {:.2} µs   p99 {:.2} µs   ({} samples)",
            m.p50_us, m.p99_us, m.samples
        );
        println!("  counters     {:?}", m.counters);
    }
    drop(ctx.peers);
    Ok(())
}

/// `--sweep`: every size of [`sweep_sizes`] on the same engines, one line
/// each, then the plot.
fn sweep(args: &TeBenchArgs, ctx: &mut Ctx) -> Result<(), BenchError> {
    let name = op_name(ctx.op);
    if !args.json {
        println!(
            "te-bench {name} sweep: {} NIC(s), {} thread(s), depth {}{}, fabric {}",
            args.nics,
            args.threads,
            args.depth,
            if args.channel { ", channel" } else { "" },
            args.fabric.name()
        );
        println!(
            "  {:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {:>13}  {:>10}  {:>6}",
            "size", "Gbit/s", "Mops/s", "p50 µs", "p99 µs", "memcpy Gbit/s", "tcp Gbit/s", "× tcp"
        );
    }
    // A few operations first: the first ones to a peer set up its
    // connection, which would otherwise count against the smallest size.
    ctx.set_size(sweep_sizes().next().unwrap_or(64));
    latency(ctx, 0, WARM_UP, args.channel, args.depth)?;
    let mut points = Vec::new();
    for size in sweep_sizes() {
        ctx.set_size(size);
        let m = measure(args, ctx)?;
        if args.json {
            println!("{}", json_line(args, ctx, &m));
        } else {
            let opt = |g: Option<f64>, f: &dyn Fn(f64) -> String| g.map_or("-".into(), f);
            println!(
                "  {:>9}  {:>9.3}  {:>9.4}  {:>9.2}  {:>9.2}  {:>13}  {:>10}  {:>6}",
                plot::bytes(size),
                m.gbps,
                m.mops,
                m.p50_us,
                m.p99_us,
                opt(m.memcpy_gbps, &|g| format!("{g:.2}")),
                opt(m.tcp_gbps, &|g| format!("{g:.2}")),
                opt(m.tcp_gbps, &|g| format!("{:.2}", m.gbps / g)),
            );
        }
        points.push(SweepPoint {
            size,
            gbps: m.gbps,
            p50_us: m.p50_us,
            memcpy_gbps: m.memcpy_gbps,
        });
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "rolex te-bench {name} sweep on {} ({} NIC(s), {} thread(s), depth {})",
            args.fabric.name(),
            args.nics,
            args.threads,
            args.depth
        );
        plot::sweep(path, &title, &name, &points)?;
        if !args.json {
            println!("  plot         {}", path.display());
        }
    }
    Ok(())
}
