//! Helpers shared by the integration tests: engines, waits bounded by a
//! generous hang guard (never a timing assertion).
#![allow(dead_code)]

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rolex_engine::domain::fabric::{probe, LibfabricConfig};
use rolex_engine::{
    Access, CompletionFlag, EngineConfig, Fabric, LoopbackConfig, MrDesc, MrHandle, OnDone,
    OnValue, TransferEngine, TransferError,
};

/// Generous bound for anything that should finish "at once".
pub const HANG: Duration = Duration::from_secs(60);

/// Runs `f` on its own thread and fails the test if it does not finish
/// within `HANG`.
pub fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let h = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(HANG) {
        Ok(v) => {
            h.join().unwrap();
            v
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: surface its panic.
            match h.join() {
                Err(p) => std::panic::resume_unwind(p),
                Ok(()) => panic!("test body ended without a result"),
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test body hung for {HANG:?}"),
    }
}

pub fn engine(nics: usize) -> TransferEngine {
    TransferEngine::loopback(nics).expect("loopback engine")
}

pub fn region(e: &TransferEngine, len: u64) -> (MrHandle, MrDesc) {
    e.alloc_mr(len, Access::all()).expect("alloc_mr")
}

/// Waits for a flag (bounded).
pub fn wait(flag: &Arc<CompletionFlag>) -> Result<u64, TransferError> {
    flag.wait(HANG).expect("operation did not complete")
}

pub fn flag() -> (Arc<CompletionFlag>, OnDone) {
    let f = CompletionFlag::new();
    let d = OnDone::flag(&f);
    (f, d)
}

pub fn vflag() -> (Arc<CompletionFlag>, OnValue) {
    let f = CompletionFlag::new();
    let d = OnValue::flag(&f);
    (f, d)
}

/// A deterministic byte pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// The fabrics to run on: loopback, and tcp when libfabric serves it.
pub fn fabrics() -> Vec<Fabric> {
    let mut v = vec![Fabric::Loopback(LoopbackConfig::default())];
    match probe("tcp", Some("127.0.0.1")) {
        Ok(()) => v.push(Fabric::Libfabric(LibfabricConfig::new(
            "tcp",
            Some("127.0.0.1"),
        ))),
        Err(e) => eprintln!("libfabric tcp skipped: {e}"),
    }
    v
}

/// An engine on `fabric`, workers unpinned (tests share the machine).
pub fn engine_on(fabric: &Fabric) -> TransferEngine {
    TransferEngine::new(EngineConfig {
        fabric: fabric.clone(),
        pin_workers: false,
        ..EngineConfig::default()
    })
    .expect("engine")
}
