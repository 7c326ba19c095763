//! Release-mode timing of the streaming PLR fit (a benchmark, not a test).
//!
//! `cargo run --release -p rolex-core --example plr_speed [-- N EPS]` fits N
//! (default 10,000,000) lognormal keys (μ = 0, σ = 2, scaled by 1e12,
//! deduplicated, sorted) at ε = EPS (default 32) and prints ns/key, then the
//! segment counts for 1,000,000 keys of four distributions at ε ∈ {8, 16, 32,
//! 64}. Keys come from a small inline PRNG so the crate needs no `rand`.

#![cfg_attr(not(feature = "alloc"), allow(dead_code, unused_imports))]

#[cfg(feature = "alloc")]
use rolex_core::plr::{fit, PlrFitter};
use std::time::Instant;

/// xorshift64* — plenty for benchmark keys.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Standard normal by Box-Muller.
    fn normal(&mut self) -> f64 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// Nanoseconds this thread has run on a CPU (Linux schedstat), so the
/// figure is not inflated when other processes share the cores.
fn cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn finish(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v.dedup();
    v
}

fn keys(dist: &str, n: usize, seed: u64) -> Vec<u64> {
    let mut r = Rng(seed | 1);
    match dist {
        "uniform" => finish((0..n).map(|_| r.next_u64()).collect()),
        "lognormal" => finish(
            (0..n)
                .map(|_| ((2.0 * r.normal()).exp() * 1e12) as u64)
                .collect(),
        ),
        // Centred in the key space; f64→u64 saturates at both ends.
        "normal" => finish(
            (0..n)
                .map(|_| ((1u64 << 63) as f64 + r.normal() * 1e17) as u64)
                .collect(),
        ),
        _ => (0..n as u64).collect(),
    }
}

#[cfg(not(feature = "alloc"))]
fn main() {
    eprintln!("plr_speed needs the `alloc` feature of rolex-core");
}

#[cfg(feature = "alloc")]
fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let eps: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(32);

    let ks = keys("lognormal", n, 42);
    let mut best = f64::INFINITY;
    let mut best_cpu = f64::INFINITY;
    let mut segments = 0;
    for _ in 0..5 {
        let mut fitter = PlrFitter::new(eps).expect("epsilon in range");
        let cpu = cpu_ns();
        let t = Instant::now();
        let mut count = 0u64;
        for &k in &ks {
            count += fitter.push(k).expect("sorted unique keys").is_some() as u64;
        }
        count += fitter.finish().is_some() as u64;
        let ns = t.elapsed().as_nanos() as f64 / ks.len() as f64;
        if let (Some(a), Some(b)) = (cpu, cpu_ns()) {
            best_cpu = best_cpu.min((b - a) as f64 / ks.len() as f64);
        }
        best = best.min(ns);
        segments = count;
    }
    println!(
        "lognormal keys={} eps={eps} segments={segments} best_ns_per_key={best:.2} \
         best_cpu_ns_per_key={best_cpu:.2}",
        ks.len()
    );

    for dist in ["uniform", "lognormal", "normal", "sequential"] {
        let ks = keys(dist, 1_000_000, 7);
        let counts: Vec<String> = [8u64, 16, 32, 64]
            .iter()
            .map(|&e| format!("eps{e}={}", fit(&ks, e).expect("sorted unique keys").len()))
            .collect();
        println!("{dist} keys={} {}", ks.len(), counts.join(" "));
    }
}
