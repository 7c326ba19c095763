//! A compute node that dies holding chain locks: its lease ends, the memory
//! node releases exactly its locks, and the writers waiting on them go on
//! (the retraining agent's freeze never waits for them: it thaws at its
//! deadline and succeeds once they are released). The "dead" node's locks are
//! planted directly in the pool — a `CAS` to `locked_by(owner)` on every
//! leaf-table entry, as a node killed between its lock and its unlock
//! leaves them — and its death is the drop of its lease.

mod common;

use std::sync::Arc;
use std::time::Duration;

use rolex_core::entry::LockOwner;
use rolex_host::kv::lease::LeaseClient;
use rolex_host::kv::{KvClient, KvClientConfig, KvError};
use rolex_host::memnode::{AgentError, HostPool, MemoryNode, MemoryNodeError};
use rolex_host::memnode::{LeaseConfig, LeaseServer};

fn lease_server(node: &MemoryNode) -> LeaseServer {
    LeaseServer::start(
        "127.0.0.1:0",
        LeaseConfig {
            grace: Duration::from_millis(5),
            linger: Duration::from_millis(50),
            ..LeaseConfig::new("tok")
        },
        node.lock_releaser(),
    )
    .unwrap()
}

#[test]
fn writers_blocked_by_a_dead_nodes_locks_go_on_once_its_lease_ends() {
    let pairs: Vec<(u64, u64)> = (0..400u64).map(|i| (i * 10, i)).collect();
    let node = common::small_kv_node(&pairs);
    let srv = lease_server(&node);
    let addr = srv.local_addr().to_string();
    let dead = LeaseClient::acquire(&addr, "tok", Duration::from_secs(5)).unwrap();
    let alive = LeaseClient::acquire(&addr, "tok", Duration::from_secs(5)).unwrap();
    let planted = common::plant_locks(&HostPool::new(node.pool_handle().clone()), dead.owner());

    let client = Arc::new(
        KvClient::connect(
            KvClientConfig {
                lock_owner: alive.owner(),
                ..KvClientConfig::default()
            },
            &node.pool(),
        )
        .unwrap(),
    );
    let c = client.clone();
    let writer = std::thread::spawn(move || {
        let mut s = c.session().unwrap();
        let old = s.update(1000, 7).unwrap();
        s.insert(1005, 8).unwrap();
        (old, s.get(1000).unwrap(), s.get(1005).unwrap())
    });
    // Every chain is locked by the "dead" node: the writer cannot finish.
    std::thread::sleep(Duration::from_millis(100));
    assert!(!writer.is_finished(), "a write went through a held lock");
    drop(dead);
    let (old, now, inserted) = common::bounded(move || writer.join().unwrap());
    assert_eq!(old, Some(100));
    assert_eq!(now, Some(7));
    assert_eq!(inserted, Some(8));
    // Both passes ran; the first released every planted lock.
    while srv.active() != 1 {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(srv.released(), planted);
    // The living node's lease is untouched and every key still reads back.
    let mut s = client.session().unwrap();
    for &(k, v) in &pairs {
        let want = if k == 1000 { 7 } else { v };
        assert_eq!(s.get(k).unwrap(), Some(want), "key {k}");
    }
    drop(alive);
}

#[test]
fn a_freeze_over_a_dead_nodes_lock_thaws_and_succeeds_once_released() {
    let pairs: Vec<(u64, u64)> = (0..400u64).map(|i| (i * 10, i)).collect();
    let node = Arc::new(common::small_kv_node(&pairs));
    let srv = lease_server(&node);
    let dead =
        LeaseClient::acquire(&srv.local_addr().to_string(), "tok", Duration::from_secs(5)).unwrap();
    let planted = common::plant_locks(&HostPool::new(node.pool_handle().clone()), dead.owner());
    eprintln!(
        "injected: {planted} locks of lease {:?}, held",
        dead.owner()
    );
    // The freeze gives up at its deadline and thaws the model: it never
    // waits for a dead holder.
    let err = node.retrain_now(0).unwrap_err();
    eprintln!("found: {err}");
    assert!(
        matches!(
            err,
            MemoryNodeError::Agent(AgentError::FreezeDeadline { model_id: 0, holder, .. })
                if holder == dead.owner()
        ),
        "{err}"
    );
    drop(dead);
    // Once the lease ends and its locks are released, a retraining goes
    // through.
    let n = node.clone();
    let (keys, tries) = common::bounded(move || {
        let mut tries = 1u64;
        loop {
            match n.retrain_now(0) {
                Ok(r) => break (r.keys, tries),
                Err(MemoryNodeError::Agent(AgentError::FreezeDeadline { .. })) => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
    });
    eprintln!("found: retrained after the lease ended, at try {tries}: {keys} keys");
    assert!(keys > 0);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    for &(k, v) in &pairs {
        assert_eq!(s.get(k).unwrap(), Some(v), "key {k}");
    }
    drop(srv);
}

#[test]
fn a_sweep_releases_locks_whose_holder_has_no_lease() {
    let pairs: Vec<(u64, u64)> = (0..200u64).map(|i| (i * 10, i)).collect();
    let node = common::small_kv_node(&pairs);
    let srv = lease_server(&node);
    let live =
        LeaseClient::acquire(&srv.local_addr().to_string(), "tok", Duration::from_secs(5)).unwrap();
    // Locks of an id that holds no lease (its holder died long ago), and
    // of the live lease: only the first are orphans.
    let orphan = LockOwner(if live.owner().0 == 9 { 10 } else { 9 });
    let planted = common::plant_locks(&HostPool::new(node.pool_handle().clone()), orphan);
    assert_eq!(
        node.release_locks_where(|o| !srv.holds(o)).unwrap(),
        planted
    );
    let held = common::plant_locks(&HostPool::new(node.pool_handle().clone()), live.owner());
    assert_eq!(node.release_locks_where(|o| !srv.holds(o)).unwrap(), 0);
    assert_eq!(node.release_locks_of(live.owner()).unwrap(), held);
}

/// A client whose lease lapsed (here: dropped, which fences at once) posts
/// no write: every write fails with `LeaseExpired`, determinate, reads go
/// on, and a configuration whose fence names another lease is refused.
#[test]
fn a_client_whose_lease_lapsed_posts_no_write() {
    let pairs: Vec<(u64, u64)> = (0..400u64).map(|i| (i * 10, i)).collect();
    let node = common::small_kv_node(&pairs);
    let srv = lease_server(&node);
    let addr = srv.local_addr().to_string();
    let lease = LeaseClient::acquire(&addr, "tok", Duration::from_secs(5)).unwrap();
    let other = LeaseClient::acquire(&addr, "tok", Duration::from_secs(5)).unwrap();
    let mismatched = KvClientConfig {
        lock_owner: other.owner(),
        ..KvClientConfig::default().with_lease(&lease)
    };
    assert!(matches!(
        KvClient::connect(mismatched, &node.pool()),
        Err(KvError::BadConfig { field: "lease", .. })
    ));
    let fence = lease.fence();
    let client =
        KvClient::connect(KvClientConfig::default().with_lease(&lease), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    assert_eq!(s.update(1000, 7).unwrap(), Some(100));
    assert!(fence.valid() && fence.remaining() > Duration::ZERO);
    drop(lease);
    eprintln!("injected: the client's lease dropped (fenced at once)");
    assert!(!fence.valid());
    let refused = [
        s.update(1000, 8).unwrap_err(),
        s.insert(1005, 9).unwrap_err(),
        s.delete(1010).unwrap_err(),
    ];
    for e in &refused {
        assert!(
            matches!(e, KvError::LeaseExpired { .. }) && !e.may_have_applied(),
            "{e}"
        );
    }
    eprintln!("found: update, insert and delete refused: {}", refused[0]);
    assert_eq!(s.get(1000).unwrap(), Some(7));
    assert_eq!(s.get(1005).unwrap(), None);
    assert_eq!(s.get(1010).unwrap(), Some(101));
    drop(other);
}
