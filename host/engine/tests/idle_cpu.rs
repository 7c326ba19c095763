//! An idle engine costs (almost) no CPU: its worker and callback threads
//! park. Alone in its own test binary so that no other test's threads
//! share the process whose CPU time is measured.

use std::time::{Duration, Instant};

use rolex_engine::{Access, TransferEngine};

/// CPU time (user + system) of this whole process.
fn process_cpu() -> Duration {
    // SAFETY: `rusage` is plain data, all-zero is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable `rusage`; RUSAGE_SELF is valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn an_idle_engine_uses_under_one_percent_of_a_core() {
    let a = TransferEngine::loopback(4).unwrap();
    let b = TransferEngine::loopback(4).unwrap();
    // Some activity first, then idle.
    let (src, _) = a.alloc_mr(4096, Access::all()).unwrap();
    let (_dst, dd) = b.alloc_mr(4096, Access::all()).unwrap();
    let f = rolex_engine::CompletionFlag::new();
    a.submit_single_write(
        4096,
        Some(1),
        (&src, 0),
        (&dd, 0),
        rolex_engine::OnDone::flag(&f),
    )
    .unwrap();
    f.wait(Duration::from_secs(60)).unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let cpu0 = process_cpu();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let cpu = process_cpu() - cpu0;
    let wall = t0.elapsed();
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    eprintln!("idle share of a core: {:.4}%", share * 100.0);
    // Two engines (two workers, two callback threads) and a watcher.
    assert!(
        share < 0.01,
        "idle engines used {:.3}% of a core",
        share * 100.0
    );
    drop((a, b));
}
