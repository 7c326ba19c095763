//! Engine lifetime and faults: dropping an engine with work in flight
//! neither hangs nor leaks and fires every notification once; failed and
//! unknown peers answer with errors; injected latency and bandwidth delay
//! without losing anything.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use common::*;
use rolex_engine::*;

fn slow_engine(latency_ms: u64, nics: usize) -> TransferEngine {
    TransferEngine::new(EngineConfig {
        nics_per_group: nics,
        fabric: Fabric::Loopback(LoopbackConfig {
            latency: Duration::from_millis(latency_ms),
            ..LoopbackConfig::default()
        }),
        ..EngineConfig::default()
    })
    .unwrap()
}

#[test]
fn dropping_an_engine_with_work_in_flight_fires_everything_once() {
    bounded(|| {
        let a = slow_engine(200, 2);
        let b = engine(1);
        let (src, _) = region(&a, 4096);
        let (_dst, dd) = region(&b, 4096);
        let fired = Arc::new(AtomicUsize::new(0));
        // A token whose reference count shows whether callbacks leaked.
        let token = Arc::new(());
        let n = 200;
        for i in 0..n {
            let fired = fired.clone();
            let token = token.clone();
            a.submit_single_write(
                8,
                Some(3),
                (&src, 8 * i),
                (&dd, 8 * i),
                OnDone::callback(move |_| {
                    let _keep = token;
                    fired.fetch_add(1, SeqCst);
                }),
            )
            .unwrap();
        }
        let (f, v) = vflag();
        a.submit_faa((&dd, 0), 1, v).unwrap();
        // Expectations on the dropped engine fire with an error too.
        let (fe, d) = flag();
        a.expect_imm_count(9, 1, d).unwrap();
        let w = a.alloc_uvm_watcher(|_, _| {}).unwrap();
        drop(a);
        assert_eq!(fired.load(SeqCst), n as usize);
        assert_eq!(Arc::strong_count(&token), 1, "no callback leaked");
        assert!(f.is_done());
        assert_eq!(fe.result(), Some(Err(TransferError::EngineShutDown)));
        // Handles outlive the engine safely.
        assert_eq!(
            src.read(0, &mut [0; 8]),
            Err(TransferError::RegionDeregistered)
        );
        w.store(3);
        drop(w);
    });
}

#[test]
fn dropping_the_target_engine_fails_operations_to_it() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let (src, _) = region(&a, 64);
        let (dst, dd) = region(&b, 64);
        let addr = b.main_address();
        drop(b);
        let (f, d) = flag();
        a.submit_single_write(8, None, (&src, 0), (&dd, 0), d)
            .unwrap();
        assert_eq!(wait(&f), Err(TransferError::UnknownPeer { peer: addr }));
        let (f, d) = flag();
        a.submit_send(&addr, b"x", d).unwrap();
        assert_eq!(wait(&f), Err(TransferError::UnknownPeer { peer: addr }));
        // The dropped engine's memory was never written.
        assert_eq!(
            dst.read(0, &mut [0; 8]),
            Err(TransferError::RegionDeregistered)
        );
    });
}

#[test]
fn drop_from_inside_a_callback_does_not_deadlock() {
    bounded(|| {
        let a = Arc::new(engine(1));
        let b = engine(1);
        let (src, _) = region(&a, 64);
        let (_dst, dd) = region(&b, 64);
        let (tx, rx) = mpsc::channel();
        let holder = Arc::new(std::sync::Mutex::new(Some(a.clone())));
        let h2 = holder.clone();
        a.submit_single_write(
            8,
            None,
            (&src, 0),
            (&dd, 0),
            OnDone::callback(move |r| {
                r.unwrap();
                // The last handle goes away on the callback thread.
                h2.lock().unwrap().take();
                tx.send(()).unwrap();
            }),
        )
        .unwrap();
        drop(a);
        rx.recv_timeout(HANG).unwrap();
        assert!(holder.lock().unwrap().is_none());
    });
}

#[test]
fn failed_peer_answers_with_errors_until_restored() {
    bounded(|| {
        let a = engine(1);
        let b = engine(2);
        let (src, _) = region(&a, 64);
        let (dst, dd) = region(&b, 64);
        assert!(b.set_failed(true));
        let (f, d) = flag();
        a.submit_single_write(8, Some(1), (&src, 0), (&dd, 0), d)
            .unwrap();
        assert!(matches!(wait(&f), Err(TransferError::PeerFailed { .. })));
        let (f, v) = vflag();
        a.submit_cas((&dd, 0), 0, 1, v).unwrap();
        assert!(matches!(wait(&f), Err(TransferError::PeerFailed { .. })));
        assert_eq!(dst.load_u64(0).unwrap(), 0);
        assert_eq!(b.imm_count(1), 0);
        assert!(b.set_failed(false));
        let (f, v) = vflag();
        a.submit_cas((&dd, 0), 0, 1, v).unwrap();
        assert_eq!(wait(&f), Ok(0));
        assert!(a.counters().total.errors >= 2);
    });
}

#[test]
fn injected_latency_and_bandwidth_delay_but_deliver() {
    bounded(|| {
        let a = TransferEngine::new(EngineConfig {
            nics_per_group: 2,
            fabric: Fabric::Loopback(LoopbackConfig {
                latency: Duration::from_millis(2),
                bandwidth_gbps: Some(10.0),
                ..LoopbackConfig::default()
            }),
            ..EngineConfig::default()
        })
        .unwrap();
        let b = engine(2);
        let (src, _) = region(&a, 1 << 20);
        src.write(0, &pattern(1 << 20, 6)).unwrap();
        let (dst, dd) = region(&b, 1 << 20);
        let start = std::time::Instant::now();
        let (f, d) = flag();
        a.submit_single_write(1 << 20, None, (&src, 0), (&dd, 0), d)
            .unwrap();
        wait(&f).unwrap();
        // Modelled time is a lower bound (2 ms + 0.5 MiB at 10 Gbit/s per NIC).
        assert!(start.elapsed() >= Duration::from_millis(2));
        assert_eq!(dst.to_vec(0, 1 << 20).unwrap(), pattern(1 << 20, 6));
        let mut ch = a.channel().unwrap();
        let mut res = Vec::new();
        ch.run(
            &[BatchOp::Faa {
                dst: &dd,
                offset: 0,
                add: 1,
            }],
            &mut res,
        )
        .unwrap();
        assert!(res[0].is_ok());
    });
}

#[test]
fn operations_after_drop_of_target_region_fail_cleanly() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let (src, _) = region(&a, 64);
        let (dst, dd) = region(&b, 64);
        b.dereg_mr(&dst).unwrap();
        let (f, d) = flag();
        a.submit_single_write(8, None, (&src, 0), (&dd, 0), d)
            .unwrap();
        assert!(matches!(
            wait(&f),
            Err(TransferError::Protection {
                check: ProtectionCheck::UnknownKey,
                ..
            })
        ));
        assert_eq!(b.dereg_mr(&src), Err(TransferError::ForeignRegion));
    });
}
