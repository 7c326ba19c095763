//! Retraining and shadow redirection seen from compute nodes: retraining
//! forced many times under a workload, stale readers and writers across a
//! retraining, and the memory node's counters.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rolex_host::kv::{KvClient, KvClientConfig, KvOp};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

fn node(pairs: &[(u64, u64)], trigger: u64, thread: bool) -> MemoryNode {
    MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 4,
            retrain_trigger: trigger,
            retraining_thread: thread,
            ..MemoryNodeConfig::default()
        },
        pairs,
    )
    .unwrap()
}

#[test]
fn retraining_many_times_keeps_every_key() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let pairs: Vec<(u64, u64)> = (0..64u64).map(|i| (i * 1000, i)).collect();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let node = node(&pairs, 2, false);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    for i in 0..5000u64 {
        let k = rng.gen_range(0..70_000);
        match rng.gen_range(0..8) {
            0..=3 => assert_eq!(s.insert(k, i).unwrap(), model.insert(k, i)),
            4 => assert_eq!(s.delete(k).unwrap(), model.remove(&k)),
            5 => {
                let want = model.get_mut(&k).map(|v| std::mem::replace(v, i));
                assert_eq!(s.update(k, i).unwrap(), want);
            }
            6 => {
                let want: Vec<(u64, u64)> =
                    model.range(k..).take(10).map(|(&a, &b)| (a, b)).collect();
                assert_eq!(s.scan(k, 10).unwrap(), want);
            }
            _ => assert_eq!(s.get(k).unwrap(), model.get(&k).copied()),
        }
        if i % 7 == 0 {
            while node.poll_once().unwrap().is_some() {}
        }
    }
    for (&k, &v) in &model {
        assert_eq!(s.get(k).unwrap(), Some(v));
    }
    let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(s.range(0, u64::MAX).unwrap(), want);
    let st = node.stats();
    assert!(
        st.agent.retrains >= 20,
        "retrained {} times",
        st.agent.retrains
    );
    assert!(st.agent.synonyms_absorbed > 0);
    assert!(client.stats().op(KvOp::Insert).refreshes > 0);
}

#[test]
fn stale_readers_and_writers_across_a_retraining() {
    let pairs: Vec<(u64, u64)> = (0..200u64).map(|i| (i * 100, i)).collect();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let node = node(&pairs, 1000, false);
    // The stale client fetches its cache now.
    let stale = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut old = stale.session().unwrap();
    // Another compute node splits leaves of every model.
    let other = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut w = other.session().unwrap();
    for i in 0..200u64 {
        for d in 1..4 {
            let k = i * 100 + d * 10;
            w.insert(k, k).unwrap();
            model.insert(k, k);
        }
    }
    assert!(other.stats().synonym_leaves > 0);
    // Retrain every model: each synonym becomes a training leaf.
    for m in 0..node.model_count() {
        node.retrain_now(m).unwrap();
    }
    // The stale reader still finds every key and every gap.
    for (&k, &v) in &model {
        assert_eq!(old.get(k).unwrap(), Some(v), "stale get {k}");
        assert_eq!(old.get(k + 1).unwrap(), model.get(&(k + 1)).copied());
    }
    let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(old.range(0, u64::MAX).unwrap(), want);
    // The stale writer meets retired models and refreshes.
    let before = stale.stats();
    for (&k, v) in model.iter_mut() {
        assert_eq!(old.update(k, *v + 1).unwrap(), Some(*v));
        *v += 1;
    }
    let after = stale.stats();
    assert!(after.op(KvOp::Update).refreshes + before.total().refreshes > 0);
    for (&k, &v) in &model {
        assert_eq!(w.get(k).unwrap(), Some(v));
    }
    // Retrain again and write through the other (now stale) client.
    for m in 0..node.model_count() {
        node.retrain_now(m).unwrap();
    }
    // `w` writes first, before any read: its lock CASes meet retired
    // records and it refreshes.
    for (&k, &v) in &model {
        assert_eq!(w.delete(k).unwrap(), Some(v));
    }
    assert!(other.stats().op(KvOp::Delete).refreshes > 0);
    assert_eq!(old.range(0, u64::MAX).unwrap(), vec![]);
}

#[test]
fn the_cirq_and_a_full_slt() {
    // One model; the agent only acts when polled, and only on its queue.
    let pairs: Vec<(u64, u64)> = (0..4u64).map(|i| (i << 32, i)).collect();
    let node = node(&pairs, 10_000, false);
    let cfg = KvClientConfig {
        slt_full_wait: std::time::Duration::from_millis(30),
        ..KvClientConfig::default()
    };
    let client = KvClient::connect(cfg, &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let mut k = 1u64;
    let err = loop {
        match s.insert(k, k) {
            Ok(_) => {
                model.insert(k, k);
                k += 1;
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(err, rolex_host::kv::KvError::SltFull { .. }),
        "{err}"
    );
    assert_eq!(client.stats().retrain_requests, 1, "enqueued at slot 128");
    assert_eq!(client.stats().slt_full_waits, 1);
    // The failed insert changed nothing.
    assert_eq!(s.get(k).unwrap(), None);
    let r = node
        .poll_once()
        .unwrap()
        .expect("the queued model is retrained");
    assert!(r.synonyms_absorbed >= 255);
    assert_eq!(node.stats().agent.cirq_pops, 1);
    assert_eq!(s.insert(k, k).unwrap(), None);
    model.insert(k, k);
    let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(s.range(0, u64::MAX).unwrap(), want);
}

#[test]
fn the_retraining_thread_retrains_on_its_own() {
    let pairs: Vec<(u64, u64)> = (0..32u64).map(|i| (i << 20, i)).collect();
    let node = node(&pairs, 4, true);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    let mut i = 0u64;
    // Insert until the thread has retrained a few times, at most 100
    // inserts ahead of it: a starved thread (a loaded machine) must not let
    // the inserts use up the leaf region before it catches up.
    let pace = std::time::Instant::now();
    while node.stats().agent.retrains < 5 {
        while i >= (node.stats().agent.retrains + 1) * 100 {
            assert!(
                pace.elapsed() < std::time::Duration::from_secs(120),
                "the retraining thread never caught up ({} retrains)",
                node.stats().agent.retrains
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let k = (i * 2_654_435_761) % (32 << 20);
        s.insert(k, i).unwrap();
        model.insert(k, i);
        i += 1;
    }
    assert!(node.stats().agent.retrains >= 5);
    for (&k, &v) in &model {
        assert_eq!(s.get(k).unwrap(), Some(v));
    }
    assert!(node.last_agent_error().is_none());
}

#[test]
fn inserts_never_wait_for_training() {
    let pairs: Vec<(u64, u64)> = (0..16u64).map(|i| (i * 1000, i)).collect();
    let node = node(&pairs, 10_000, false);
    let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = client.session().unwrap();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    // Step 1 of retraining model 0: walk and fit. Nothing is locked.
    let prepared = node.prepare(0).unwrap();
    let before = client.stats();
    // Inserts into model 0's range go on meanwhile, splitting leaves.
    for k in 1..200u64 {
        assert_eq!(s.insert(k, k).unwrap(), None);
        model.insert(k, k);
    }
    let during = client.stats();
    assert!(during.synonym_leaves > before.synonym_leaves);
    let ins = during.op(KvOp::Insert);
    assert_eq!(ins.retries, 0, "no insert waited");
    assert_eq!(ins.refreshes, 0);
    // Install: the leaves created since step 1 are carried over.
    let r = node.install(prepared).unwrap();
    assert!(r.synonyms_absorbed > 0);
    assert_eq!(node.stats().agent.refits, 1);
    let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
    assert_eq!(s.range(0, u64::MAX).unwrap(), want);
    for (&k, &v) in &model {
        assert_eq!(s.get(k).unwrap(), Some(v));
    }
}
