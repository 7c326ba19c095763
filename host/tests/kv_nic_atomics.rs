//! The memory node's own atomics through its NIC (design §5.8: on a
//! ConnectX, NIC atomics are atomic only among NIC operations, so the
//! agent's freeze, the reaper and the CirQ must not use CPU atomics on
//! words compute nodes CAS). On loopback the CPU route would do; forcing
//! the NIC route here runs that path end to end: histories checked
//! linearizable while the agent retrains through it, and a dead owner's
//! locks released through it.

mod common;

use rand::Rng;
use rolex_core::entry::LockOwner;
use rolex_host::kv::{KvClient, KvClientConfig};
use rolex_host::memnode::{AtomicsRoute, HostPool, MemoryNode, MemoryNodeConfig};

fn node(pairs: &[(u64, u64)], retraining_thread: bool) -> MemoryNode {
    MemoryNode::start(
        MemoryNodeConfig {
            atomics: AtomicsRoute::Nic,
            retraining_thread,
            ..common::churning_config()
        },
        pairs,
    )
    .unwrap()
}

#[test]
fn histories_stay_linearizable_with_the_agents_atomics_through_the_nic() {
    let pairs: Vec<(u64, u64)> = (0..12u64).map(|i| (i * 2000, i)).collect();
    let node = node(&pairs, true);
    let clients = [
        KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap(),
        KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap(),
    ];
    let (checked, retrains) =
        common::run_history(&node, &clients, &pairs, (4, 200, 5), |s, rec, rng, t, i| {
            let key = rng.gen_range(0..24u64) * 1000;
            let value = (t as u64) << 32 | i;
            common::random_op(s, rec, rng, (key, value), [3, 3, 1, 1, 1, 1]);
        });
    assert!(checked.single_ops > 0);
    assert!(retrains > 0, "the agent retrained through the NIC route");
}

#[test]
fn a_dead_owners_locks_are_released_through_the_nic() {
    // No retraining meanwhile: a freeze would take the planted locks'
    // place (planting is the test's stand-in for a compute node).
    let pairs: Vec<(u64, u64)> = (0..100u64).map(|i| (i * 10, i)).collect();
    let node = node(&pairs, false);
    let pool =
        HostPool::with_route(node.pool_handle().clone(), node.engine(), AtomicsRoute::Nic).unwrap();
    assert!(pool.atomics_via_nic());
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    assert_eq!(s.insert(5, 1).unwrap(), None);
    // A split's unlock is posted, not awaited.
    s.flush().unwrap();
    // Compute node 7 holds every chain lock, and dies: the reaper's
    // releases go through the NIC too.
    let owner = LockOwner(7);
    let planted = common::plant_locks(&pool, owner);
    assert!(planted > 0);
    assert_eq!(node.release_locks_of(owner).unwrap(), planted);
    assert_eq!(s.insert(5, 2).unwrap(), Some(1), "writers get through");
    assert_eq!(s.get(5).unwrap(), Some(2));
}
