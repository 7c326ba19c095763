//! Growth: a model that grows past twice `max_model_leaves` leaves is cut
//! by its retraining into several, each in a new directory slot, and the
//! topology (which model serves which key range) changes by shadow
//! redirection. Keys appended far beyond the loaded range, or a store
//! started empty, thus make new models; compute nodes whose cached
//! topology is stale find every key all the same, and histories stay
//! linearizable while models are cut under them.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rolex_host::kv::{KvClient, KvClientConfig, KvOp};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

/// Leaves of 4 slots loaded half full, models of at most 4 leaves (cut
/// past 8), retrained by hand.
fn node(pairs: &[(u64, u64)]) -> MemoryNode {
    MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 4,
            retrain_trigger: 1000,
            retraining_thread: false,
            spare_leaf_factor: 100.0,
            // Retrained by hand thousands of times a second: records in
            // their grace period would fill the default region.
            model_region_spare: Some(64 << 20),
            ..MemoryNodeConfig::default()
        },
        pairs,
    )
    .unwrap()
}

fn retrain_all(node: &MemoryNode) {
    for m in 0..node.model_count() {
        node.retrain_now(m)
            .unwrap_or_else(|e| panic!("retraining model {m}: {e}"));
    }
}

#[test]
fn appends_beyond_the_loaded_range_make_new_models_that_stale_clients_find() {
    let pairs: Vec<(u64, u64)> = (0..40u64).map(|i| (i * 100, i)).collect();
    let node = node(&pairs);
    let models_at_load = node.model_count();
    // Connected before any growth; it never refreshes by age.
    let stale = KvClient::connect(
        KvClientConfig {
            model_max_age: Duration::from_secs(3600),
            ..KvClientConfig::default()
        },
        &node.pool(),
    )
    .unwrap();
    let mut r = stale.session().unwrap();
    assert_eq!(r.get(3900).unwrap(), Some(39));
    let w = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = w.session().unwrap();
    let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
    for i in 0..3000u64 {
        let k = 1_000_000 + i * 7;
        assert_eq!(s.insert(k, i).unwrap(), None);
        model.insert(k, i);
        if i % 50 == 49 {
            retrain_all(&node);
        }
    }
    retrain_all(&node);
    let st = node.stats();
    println!(
        "appended 3000 keys: models {models_at_load} -> {} ({} cuts, {} refused)",
        st.models, st.agent.models_cut, st.agent.cuts_refused
    );
    assert!(st.models > 10 * models_at_load, "{st:?}");
    // The stale client's topology names none of the new models.
    for (&k, &v) in &model {
        assert_eq!(r.get(k).unwrap(), Some(v), "stale client, key {k}");
    }
    let all: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
    assert_eq!(
        r.range(0, u64::MAX).unwrap(),
        all,
        "a scan across every model"
    );
    assert_eq!(r.scan(1_000_000 + 7 * 1000, 3).unwrap().len(), 3);
    assert_eq!(
        stale.model_count(),
        st.models,
        "the stale client read the topology again"
    );
    // Once warm, a get is one round trip whatever model it lands in.
    let before = stale.stats().op(KvOp::Get);
    for &k in model.keys().step_by(13) {
        r.get(k).unwrap();
    }
    let after = stale.stats().op(KvOp::Get);
    let per = (after.rtts - before.rtts) as f64 / (after.ops - before.ops) as f64;
    println!("warm gets: {per:.3} round trips each");
    assert_eq!(per, 1.0);
}

#[test]
fn an_empty_store_grows_into_many_models() {
    let node = node(&[]);
    assert_eq!(node.model_count(), 1);
    let c = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
    let mut s = c.session().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut model = BTreeMap::new();
    for i in 0..1500u64 {
        let k: u64 = rng.gen();
        assert_eq!(s.insert(k, i).unwrap(), model.insert(k, i));
        if i % 100 == 99 {
            retrain_all(&node);
        }
    }
    retrain_all(&node);
    println!(
        "1500 keys into an empty store: {} models",
        node.model_count()
    );
    assert!(node.model_count() > 20);
    for (&k, &v) in &model {
        assert_eq!(s.get(k).unwrap(), Some(v), "key {k}");
    }
    let all: Vec<(u64, u64)> = model.iter().map(|(&k, &v)| (k, v)).collect();
    assert_eq!(s.range(0, u64::MAX).unwrap(), all);
}

/// Four threads on two compute nodes insert, read, delete and scan over a
/// key space that fills from 12 keys to hundreds, while a retrainer cuts
/// the growing models again and again; the history is checked.
fn run(unordered: bool, seed: u64) {
    let pairs: Vec<(u64, u64)> = (0..12u64).map(|i| (i * 40 * 1000, i)).collect();
    let mut engine = rolex_host::EngineConfig::default();
    if unordered {
        engine.fabric = rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
            unordered: Some(rolex_host::Unordered {
                seed,
                window: 8,
                writes_in_order: false,
            }),
            ..rolex_host::LoopbackConfig::default()
        });
    }
    let node = MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 2,
            fill: 0.5,
            epsilon: 1,
            max_model_leaves: 2,
            retrain_trigger: 2,
            record_grace: Duration::from_millis(20),
            model_region_spare: Some(64 << 20),
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap();
    let cfg = KvClientConfig {
        engine,
        model_max_age: Duration::from_millis(5),
        ..KvClientConfig::default()
    };
    let clients = [
        KvClient::connect(cfg.clone(), &node.pool()).unwrap(),
        KvClient::connect(cfg, &node.pool()).unwrap(),
    ];
    // Four threads run 300 operations each over a key space that fills
    // from 12 keys to hundreds (half of them inserts), while the
    // retrainer cuts the growing models again and again.
    common::run_history(
        &node,
        &clients,
        &pairs,
        (4, 300, seed * 17),
        |s, rec, rng, t, i| {
            let key = rng.gen_range(0..480u64) * 1000;
            let value = (t as u64) << 32 | i;
            common::random_op(s, rec, rng, (key, value), [2, 5, 0, 1, 2, 0]);
        },
    );
    let st = node.stats();
    eprintln!(
        "models {} ({} cuts), retrains {}",
        st.models, st.agent.models_cut, st.agent.retrains
    );
    assert!(st.agent.models_cut > 0, "no model was cut during the run");
    assert!(node.last_agent_error().is_none());
}

#[test]
fn histories_are_linearizable_while_models_are_cut_ordered() {
    for seed in 1..=2 {
        run(false, seed);
    }
}

#[test]
fn histories_are_linearizable_while_models_are_cut_unordered() {
    for seed in 1..=2 {
        run(true, seed);
    }
}
