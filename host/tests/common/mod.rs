//! Helpers shared by the store's end-to-end tests: the engine tests' own
//! helpers (waits bounded by a generous hang guard, never a timing
//! assertion; engines; regions), and small memory nodes.
#![allow(dead_code)]

#[path = "../../engine/tests/common/mod.rs"]
mod engine;
// Each test file uses a different part of these helpers, or none.
#[allow(unused_imports)]
pub use engine::*;

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

/// A tiny memory node whose models split and retrain all the time: leaves
/// of 2 slots loaded half full, models of at most 3 leaves, ε = 1, and a
/// retraining request at the second SLT slot.
pub fn churning_node(pairs: &[(u64, u64)]) -> rolex_host::memnode::MemoryNode {
    churning_node_with_grace(
        pairs,
        rolex_host::memnode::MemoryNodeConfig::default().record_grace,
    )
}

/// [`churning_node`] whose retired records and freed leaves are reused
/// after `grace` (its clients must refresh cached models well within it:
/// `KvClientConfig::model_max_age`).
pub fn churning_node_with_grace(
    pairs: &[(u64, u64)],
    grace: std::time::Duration,
) -> rolex_host::memnode::MemoryNode {
    rolex_host::memnode::MemoryNode::start(
        rolex_host::memnode::MemoryNodeConfig {
            leaf_slots: 2,
            fill: 0.5,
            epsilon: 1,
            max_model_leaves: 3,
            retrain_trigger: 2,
            record_grace: grace,
            ..rolex_host::memnode::MemoryNodeConfig::default()
        },
        pairs,
    )
    .expect("starting a small memory node")
}
