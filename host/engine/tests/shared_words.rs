//! The host's own atomics on shared words (design §5.8): on either route
//! they agree with peers' NIC atomics on the same word, and the hook
//! refuses what it cannot serve.

mod common;

use common::{bounded, engine, region, vflag, wait};
use rolex_engine::{Access, AtomicProfile, AtomicRoute, TransferError};

#[test]
fn loopback_atomics_are_the_cpus_own() {
    let e = engine(2);
    assert_eq!(e.atomic_profile(), AtomicProfile::CPU_COHERENT);
    let (mr, _) = region(&e, 64);
    assert_eq!(e.shared_words(&mr).unwrap().route(), AtomicRoute::Cpu);
}

#[test]
fn both_routes_agree_with_peers_nic_atomics() {
    bounded(|| {
        let host = engine(2);
        let (mr, desc) = region(&host, 64);
        for (off, route) in [(0u64, AtomicRoute::Cpu), (8, AtomicRoute::Nic)] {
            let words = host.shared_words_via(&mr, route).unwrap();
            assert_eq!(words.route(), route);
            let peers: Vec<_> = (0..2)
                .map(|_| {
                    let desc = desc.clone();
                    std::thread::spawn(move || {
                        let p = engine(1);
                        for _ in 0..100 {
                            let (f, d) = vflag();
                            p.submit_faa((&desc, off), 1, d).unwrap();
                            wait(&f).unwrap();
                        }
                    })
                })
                .collect();
            for _ in 0..100 {
                words.faa(off, 1).unwrap();
            }
            for h in peers {
                h.join().unwrap();
            }
            assert_eq!(words.load(off).unwrap(), 300, "{route:?}");
            // CAS and the CAS-loop store.
            assert_eq!(words.cas(off, 300, 7).unwrap(), 300);
            assert_eq!(words.cas(off, 300, 9).unwrap(), 7);
            assert_eq!(words.swap(off, 42).unwrap(), 7);
            assert_eq!(mr.load_u64(off).unwrap(), 42);
        }
        // The NIC route counts round trips like any operation.
        assert!(host.counters().total.rtts >= 100);
    });
}

#[test]
fn the_hook_refuses_what_it_cannot_serve() {
    bounded(|| {
        let a = engine(1);
        let b = engine(1);
        let (mr, _) = region(&a, 64);
        assert_eq!(
            b.shared_words(&mr).unwrap_err(),
            TransferError::ForeignRegion
        );
        let words = a.shared_words_via(&mr, AtomicRoute::Nic).unwrap();
        // Misaligned and out of bounds, on both routes.
        assert!(matches!(
            words.faa(4, 1),
            Err(TransferError::Protection { .. })
        ));
        assert!(matches!(
            words.faa(64, 1),
            Err(TransferError::Protection { .. })
        ));
        let cpu = a.shared_words_via(&mr, AtomicRoute::Cpu).unwrap();
        assert!(cpu.faa(4, 1).is_err());
        assert!(cpu.faa(64, 1).is_err());
        // A region without remote atomics cannot take the NIC route.
        let (ro, _) = a.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let w = a.shared_words_via(&ro, AtomicRoute::Nic).unwrap();
        assert!(matches!(
            w.cas(0, 0, 1),
            Err(TransferError::Protection { .. })
        ));
        a.dereg_mr(&mr).unwrap();
        assert_eq!(
            a.shared_words(&mr).unwrap_err(),
            TransferError::RegionDeregistered
        );
    });
}
