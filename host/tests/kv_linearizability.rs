//! Linearizability under concurrency: four threads on two compute nodes run
//! random operations on a small key space while the memory node retrains;
//! the recorded history is checked against a sequential `BTreeMap` model
//! (`rolex_checker`).

mod common;

use rand::Rng;
use rolex_host::kv::{KvClient, KvClientConfig};

fn run(order: common::Delivery, seed: u64) {
    let pairs: Vec<(u64, u64)> = (0..12u64).map(|i| (i * 2 * 1000, i)).collect();
    let mut engine = rolex_host::EngineConfig::default();
    if order != common::Delivery::Ordered {
        engine.fabric = rolex_host::Fabric::Loopback(rolex_host::LoopbackConfig {
            unordered: order.loopback(seed),
            ..rolex_host::LoopbackConfig::default()
        });
    }
    // Records and freed leaves are reused within the run (a grace period
    // of 20 ms, clients refresh views older than 5 ms), so histories cover
    // splits into leaves retraining freed.
    let node = common::churning_node_with_grace(&pairs, std::time::Duration::from_millis(20));
    let cfg = KvClientConfig {
        engine,
        model_max_age: std::time::Duration::from_millis(5),
        ..KvClientConfig::default()
    };
    let clients = [
        KvClient::connect(cfg.clone(), &node.pool()).unwrap(),
        KvClient::connect(cfg, &node.pool()).unwrap(),
    ];
    // Besides the agent's own thread, a retrainer retrains every model
    // again and again while four threads run 300 random operations each
    // over 24 keys.
    let (checked, retrains) = common::run_history(
        &node,
        &clients,
        &pairs,
        (4, 300, seed),
        |s, rec, rng, t, i| {
            let key = rng.gen_range(0..24u64) * 1000;
            let value = (t as u64) << 32 | i;
            common::random_op(s, rec, rng, (key, value), [3, 2, 2, 3, 1, 1]);
        },
    );
    assert!(retrains > 0);
    assert_eq!(checked.single_ops + checked.scans, 1200);
    let st = node.stats();
    let refreshes: u64 = clients.iter().map(|c| c.stats().total().refreshes).sum();
    let stash: u64 = clients.iter().map(|c| c.stats().stash_leaves).sum();
    eprintln!(
        "retrains {} refreshes {refreshes}; leaves freed {}, splits into freed leaves {stash}; models {} ({} cut)",
        st.agent.retrains, st.agent.leaves_freed, st.models, st.agent.models_cut
    );
    assert!(st.agent.retrains > 0, "retraining ran during the test");
    assert!(refreshes > 0, "clients met retrained models");
    assert!(node.last_agent_error().is_none());
}

#[test]
fn histories_are_linearizable_on_an_ordered_fabric() {
    for seed in 1..=3 {
        run(common::Delivery::Ordered, seed);
    }
}

#[test]
fn histories_are_linearizable_on_an_unordered_fabric() {
    for seed in 1..=3 {
        run(common::Delivery::Unordered, seed);
    }
}

#[test]
fn histories_are_linearizable_on_tcps_order() {
    for seed in 1..=3 {
        run(common::Delivery::WritesInOrder, seed);
    }
}
