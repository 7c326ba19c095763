//! `rolex te-bench`: bandwidth, operation rate and latency of the transfer
//! engine, with `memcpy` of the same size measured in the same run so the
//! ratio is honest on a noisy machine.
//!
//! Two phases per run: a throughput phase (each thread keeps `--depth`
//! operations in flight) gives `gbps` and `mops`; a latency phase (one
//! operation at a time) gives `p50_us` and `p99_us`. For `write-imm` the
//! latency is until the receiver's ImmCounter expectation fires, and the
//! throughput phase ends when the receiver has counted every piece.
//! Bandwidths are in Gbit/s. `read`, `cas` and `faa` go through the
//! engine's worker like the writes; `--channel` runs them (and `write`) as
//! client doorbell batches of `--depth` operations instead.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rolex_host::{
    single_write_pieces, Access, BatchOp, CompletionFlag, EngineConfig, Fabric, LoopbackConfig,
    MrDesc, MrHandle, OnDone, OnValue, Pages, ScatterDst, TransferEngine, TransferError,
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

/// The fabric to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FabricArg {
    /// The in-process loopback NIC.
    Loopback,
}

/// Arguments of `rolex te-bench`.
#[derive(Debug, Args)]
pub struct TeBenchArgs {
    /// Operation to measure.
    #[arg(long, value_enum)]
    op: Op,
    /// Bytes per operation (per page for `paged`, per peer for `scatter`;
    /// ignored by `cas`/`faa`, which move 8 bytes).
    #[arg(long)]
    size: u64,
    /// Operations in the throughput phase (default: about 256 MiB worth,
    /// between 100 and 100000).
    #[arg(long)]
    count: Option<u64>,
    /// Pages per paged write, or peers of a scatter.
    #[arg(long, default_value_t = 16)]
    pages: u64,
    /// NICs per engine (1 to 4).
    #[arg(long, default_value_t = 1)]
    nics: usize,
    /// Submitting threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Operations each thread keeps in flight in the throughput phase.
    #[arg(long, default_value_t = 32)]
    depth: usize,
    /// Run read/write/cas/faa as client-channel doorbell batches.
    #[arg(long)]
    channel: bool,
    /// The fabric.
    #[arg(long, value_enum, default_value_t = FabricArg::Loopback)]
    fabric: FabricArg,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
}

const IMM: u32 = 0x7e_0000;
const MAX_REGION: u64 = 4 << 30;

struct Ctx {
    op: Op,
    size: u64,
    a: TransferEngine,
    b: TransferEngine,
    peers: Vec<(TransferEngine, MrHandle, MrDesc)>,
    srcs: Vec<MrHandle>,
    /// The target region (kept for its owner; peers use `dst`).
    _dst_handle: MrHandle,
    dst: MrDesc,
    /// Per thread: source and destination page lists.
    pages: Vec<(Pages, Pages)>,
    scatter: Vec<Vec<ScatterDst>>,
    /// Bytes one operation moves.
    bytes: u64,
    /// Immediate pieces one write-imm delivers.
    pieces: u32,
}

type BenchError = Box<dyn std::error::Error>;

fn validate(args: &TeBenchArgs) -> Result<(), BenchError> {
    if args.size == 0 {
        return Err("--size must be at least 1 byte".into());
    }
    if !(1..=4).contains(&args.nics) {
        return Err(format!("--nics must be 1 to 4, not {}", args.nics).into());
    }
    if args.threads == 0 || args.depth == 0 || args.pages == 0 {
        return Err("--threads, --depth and --pages must be at least 1".into());
    }
    if args.count == Some(0) {
        return Err("--count must be at least 1".into());
    }
    if args.channel && !matches!(args.op, Op::Write | Op::Read | Op::Cas | Op::Faa) {
        return Err("--channel applies to write, read, cas and faa only".into());
    }
    if args.size > 1 << 30 {
        return Err(format!(
            "--size {} exceeds the engine's 1 GiB transfer limit",
            args.size
        )
        .into());
    }
    Ok(())
}

fn engine(nics: usize) -> Result<TransferEngine, TransferError> {
    TransferEngine::new(EngineConfig {
        nics_per_group: nics,
        fabric: Fabric::Loopback(LoopbackConfig::default()),
        ..EngineConfig::default()
    })
}

fn setup(args: &TeBenchArgs) -> Result<Ctx, BenchError> {
    let size = match args.op {
        Op::Cas | Op::Faa => 8,
        _ => args.size,
    };
    let per_thread = match args.op {
        Op::Paged => size
            .checked_mul(args.pages)
            .ok_or("--size × --pages overflows")?,
        _ => size,
    };
    let region = per_thread
        .checked_mul(args.threads as u64)
        .filter(|r| *r <= MAX_REGION)
        .ok_or("the benchmark's regions would exceed 4 GiB: lower --size, --pages or --threads")?;
    let a = engine(args.nics)?;
    let b = engine(args.nics)?;
    let (dst_handle, dst) = b.alloc_mr(region, Access::all())?;
    let mut srcs = Vec::new();
    for _ in 0..args.threads {
        let (h, _) = a.alloc_mr(per_thread, Access::all())?;
        h.fill(0x5a)?;
        srcs.push(h);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let mut pages = Vec::new();
    for t in 0..args.threads {
        let n = if args.op == Op::Paged {
            args.pages as u32
        } else {
            1
        };
        let mut si: Vec<u32> = (0..n).collect();
        let mut di: Vec<u32> = (0..n).collect();
        si.shuffle(&mut rng);
        di.shuffle(&mut rng);
        pages.push((
            Pages {
                indices: si,
                stride: size,
                offset: 0,
            },
            Pages {
                indices: di,
                stride: size,
                offset: t as u64 * per_thread,
            },
        ));
    }
    let mut peers = Vec::new();
    let mut scatter = Vec::new();
    if args.op == Op::Scatter {
        for _ in 0..args.pages {
            let e = engine(args.nics)?;
            let (h, d) = e.alloc_mr(region, Access::all())?;
            peers.push((e, h, d));
        }
        for t in 0..args.threads {
            scatter.push(
                peers
                    .iter()
                    .map(|p| ScatterDst {
                        len: size,
                        src: 0,
                        dst: p.2.clone(),
                        dst_offset: t as u64 * size,
                    })
                    .collect(),
            );
        }
    }
    let bytes = match args.op {
        Op::Paged | Op::Scatter => size * args.pages,
        _ => size,
    };
    let pieces = single_write_pieces(size, args.nics, args.nics);
    Ok(Ctx {
        op: args.op,
        size,
        a,
        b,
        peers,
        srcs,
        _dst_handle: dst_handle,
        dst,
        pages,
        scatter,
        bytes,
        pieces,
    })
}

/// Waits for a flag: spins briefly, then yields (the worker needs the CPU
/// on a small machine); gives up after a generous hang guard.
fn wait(f: &CompletionFlag) -> Result<u64, BenchError> {
    let start = Instant::now();
    let mut i = 0u64;
    loop {
        if let Some(r) = f.result() {
            return Ok(r?);
        }
        i += 1;
        if i < 100 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
            if i & 4095 == 0 && start.elapsed() > Duration::from_secs(120) {
                return Err("an operation did not complete within 120 s".into());
            }
        }
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
    for i in 0..n as usize {
        let f = &flags[i % depth];
        if i >= depth {
            wait(f)?;
            bar.inc(1);
        }
        f.reset();
        submit(ctx, t, imm, f)?;
    }
    for i in n.saturating_sub(depth as u64) as usize..n as usize {
        wait(&flags[i % depth])?;
        bar.inc(1);
    }
    Ok(())
}

/// Latency phase of one thread: `n` operations one at a time.
fn latency(ctx: &Ctx, t: usize, n: u64, channel: bool) -> Result<Vec<Duration>, BenchError> {
    let mut lat = Vec::with_capacity(n as usize);
    let f = CompletionFlag::new();
    let rf = CompletionFlag::new();
    let mut ch = if channel {
        Some(ctx.a.channel()?)
    } else {
        None
    };
    let op = [batch_op(ctx, t)];
    let mut res = Vec::new();
    let imm = IMM + 1 + t as u32;
    for _ in 0..n {
        f.reset();
        rf.reset();
        let start = Instant::now();
        if let Some(ch) = &mut ch {
            ch.run(&op, &mut res)?;
            if let Some(Err(e)) = res.first() {
                return Err(e.clone().into());
            }
        } else if ctx.op == Op::WriteImm {
            ctx.b.expect_imm_count(imm, ctx.pieces, OnDone::flag(&rf))?;
            submit(ctx, t, Some(imm), &f)?;
            wait(&rf)?;
        } else {
            submit(ctx, t, None, &f)?;
            wait(&f)?;
        }
        lat.push(start.elapsed());
        if ctx.op == Op::WriteImm && ch.is_none() {
            wait(&f)?;
        }
    }
    Ok(lat)
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

/// Runs the transfer-engine benchmark.
pub fn run(args: TeBenchArgs) -> Result<(), BenchError> {
    validate(&args)?;
    let FabricArg::Loopback = args.fabric;
    let ctx = setup(&args)?;
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
        b.set_message(format!("te-bench {:?}", args.op));
        b
    };

    let memcpy_before = memcpy_gbps(ctx.bytes, (total_ops * ctx.bytes).min(1 << 30));
    let recv_flag = CompletionFlag::new();
    if ctx.op == Op::WriteImm {
        let target = u32::try_from(total_ops * u64::from(ctx.pieces))
            .map_err(|_| "--count too large for one immediate's counter")?;
        ctx.b
            .expect_imm_count(IMM, target, OnDone::flag(&recv_flag))?;
    }
    let start = Instant::now();
    std::thread::scope(|s| -> Result<(), BenchError> {
        let hs: Vec<_> = (0..args.threads)
            .map(|t| {
                let (ctx, bar) = (&ctx, &bar);
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
    if ctx.op == Op::WriteImm {
        wait(&recv_flag)?;
    }
    let secs = start.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let lat_n = per_thread.min(2000);
    let mut lats: Vec<Duration> = std::thread::scope(|s| -> Result<Vec<Duration>, BenchError> {
        let hs: Vec<_> = (0..args.threads)
            .map(|t| {
                let ctx = &ctx;
                s.spawn(move || latency(ctx, t, lat_n, args.channel).map_err(|e| e.to_string()))
            })
            .collect();
        let mut all = Vec::new();
        for h in hs {
            all.extend(h.join().map_err(|_| "benchmark thread panicked")??);
        }
        Ok(all)
    })?;
    lats.sort_unstable();
    let memcpy_after = memcpy_gbps(ctx.bytes, (total_ops * ctx.bytes).min(1 << 30));
    let memcpy = memcpy_before.max(memcpy_after);
    let gbps = (total_ops * ctx.bytes) as f64 * 8.0 / secs / 1e9;
    let mops = total_ops as f64 / secs / 1e6;
    let (p50, p99) = (percentile(&lats, 0.5), percentile(&lats, 0.99));
    let c = ctx.a.counters().total;
    let op_name = args
        .op
        .to_possible_value()
        .map(|v| v.get_name().to_owned())
        .unwrap_or_default();
    if args.json {
        let v = serde_json::json!({
            "op": op_name, "size": ctx.size, "gbps": gbps, "mops": mops,
            "p50_us": p50, "p99_us": p99, "memcpy_gbps": memcpy,
            "ratio": gbps / memcpy, "count": total_ops, "nics": args.nics,
            "threads": args.threads, "depth": args.depth, "channel": args.channel,
            "fabric": "loopback", "doorbells": c.doorbells, "rtts": c.rtts,
            "bytes_written": c.bytes_written, "bytes_read": c.bytes_read,
            "atomics": c.atomics, "errors": c.errors,
        });
        println!("{v}");
    } else {
        println!(
            "te-bench {op_name}: size {} B × {total_ops} ops, {} NIC(s), {} thread(s), depth {}{}",
            ctx.size,
            args.nics,
            args.threads,
            args.depth,
            if args.channel { ", channel" } else { "" }
        );
        println!("  throughput   {gbps:10.2} Gbit/s   {mops:10.4} Mops/s");
        println!(
            "  memcpy       {memcpy:10.2} Gbit/s   (ratio {:.2})",
            gbps / memcpy
        );
        println!(
            "  latency      p50 {p50:.2} µs   p99 {p99:.2} µs   ({} samples)",
            lats.len()
        );
        println!("  counters     {c:?}");
    }
    drop(ctx.peers);
    Ok(())
}
