//! The memory node's own CPU atomics and a software provider's remote
//! atomics on the same words stay atomic with respect to each other.
//!
//! On `tcp;ofi_rxm` a remote CAS or FAA is executed by the target's
//! progress thread in software, while the retraining agent (and the lease
//! reaper) lock and unlock leaf-table entries with `AtomicU64` operations
//! of their own ([`HostPool`]). If the provider's software atomics were
//! plain loads and stores, increments would be lost here. Both sides hammer
//! one FAA word and one CAS-increment word at once; the final values must
//! equal the number of increments each side was told succeeded.
#![cfg(feature = "libfabric")]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rolex_dpu::PoolMemory;
use rolex_host::domain::fabric::{probe, LibfabricConfig};
use rolex_host::memnode::HostPool;
use rolex_host::{Access, EngineConfig, Fabric, TransferEngine};

const REMOTE_OPS: u64 = 400;

fn tcp_engine() -> TransferEngine {
    TransferEngine::new(EngineConfig {
        fabric: Fabric::Libfabric(LibfabricConfig::new("tcp", Some("127.0.0.1"))),
        pin_workers: false,
        ..EngineConfig::default()
    })
    .expect("tcp engine")
}

#[test]
fn remote_software_atomics_and_local_cpu_atomics_do_not_lose_updates() {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    common::bounded(|| {
        let node = tcp_engine();
        let client = tcp_engine();
        let (mr, desc) = node.alloc_mr(64, Access::all()).expect("register");
        let local = HostPool::new(mr.clone());
        let done = Arc::new(AtomicBool::new(false));
        // The node's CPU: FAA word 0, CAS-increment word 8, until the
        // remote side is done; counts what it added.
        let d = done.clone();
        let cpu = std::thread::spawn(move || {
            let (mut faas, mut cases) = (0u64, 0u64);
            while !d.load(Ordering::Acquire) {
                local.faa(0, 1).unwrap();
                faas += 1;
                let old = local.load(8).unwrap();
                if local.cas(8, old, old + 1).unwrap() == old {
                    cases += 1;
                }
                std::thread::yield_now();
            }
            (faas, cases)
        });
        // CAS-increment from a guess: a failed CAS returns the current
        // value, the next guess.
        let (mut remote_cases, mut guess) = (0, 0);
        for _ in 0..REMOTE_OPS {
            let (f, v) = common::vflag();
            client.submit_faa((&desc, 0), 1, v).unwrap();
            common::wait(&f).expect("remote FAA");
            let (f, v) = common::vflag();
            client.submit_cas((&desc, 8), guess, guess + 1, v).unwrap();
            let old = common::wait(&f).expect("remote CAS");
            if old == guess {
                remote_cases += 1;
                guess += 1;
            } else {
                guess = old;
            }
        }
        done.store(true, Ordering::Release);
        let (faas, cases) = cpu.join().unwrap();
        assert!(faas > 0, "the CPU side never ran");
        assert_eq!(mr.load_u64(0).unwrap(), REMOTE_OPS + faas, "FAA lost");
        assert_eq!(mr.load_u64(8).unwrap(), remote_cases + cases, "CAS lost");
    });
}
