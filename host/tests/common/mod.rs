//! Helpers shared by the integration tests: engines, waits bounded by a
//! generous hang guard (never a timing assertion).
#![allow(dead_code)]

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rolex_host::{
    Access, CompletionFlag, MrDesc, MrHandle, OnDone, OnValue, TransferEngine, TransferError,
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

/// A memory node with small leaves (4 slots, 3 keys each at load), ε = 4
/// and at most 8 leaves per model, so a few hundred keys make many models
/// and inserts split early; no retraining thread (tests retrain by hand).
pub fn small_kv_node(pairs: &[(u64, u64)]) -> rolex_host::memnode::MemoryNode {
    rolex_host::memnode::MemoryNode::start(
        rolex_host::memnode::MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.75,
            epsilon: 4,
            max_model_leaves: 8,
            retraining_thread: false,
            ..rolex_host::memnode::MemoryNodeConfig::default()
        },
        pairs,
    )
    .expect("small memory node")
}

/// Retrains model `m` while compute nodes run: `true` if it was retrained,
/// `false` if the freeze met a lock held past its deadline (the designed
/// outcome under contention: the agent thaws and retries later). Any other
/// error fails the test.
pub fn retrain_unless_busy(node: &rolex_host::memnode::MemoryNode, m: u64) -> bool {
    match node.retrain_now(m) {
        Ok(_) => true,
        Err(rolex_host::memnode::MemoryNodeError::Agent(
            rolex_host::memnode::AgentError::FreezeDeadline { .. },
        )) => false,
        Err(e) => panic!("retraining model {m}: {e}"),
    }
}
