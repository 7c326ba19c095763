//! The learned key-value store end to end in one process: a memory node
//! and a compute node on the in-process loopback fabric.
//!
//! 1. The **memory node** lays out a pool, registers it, bulk-loads 10,000
//!    pairs into its leaves and trains the learned models over them; its
//!    retraining agent runs on a thread of its own.
//! 2. A **compute node** ([`KvClient::connect`]) reads the models into its
//!    cache with one-sided reads; from then on it needs no CPU of the
//!    memory node's.
//! 3. A **session** (one per thread) runs `get`, `insert`, `update`,
//!    `scan` and `delete` with one-sided RDMA only (READ, WRITE, CAS), then
//!    several of them in flight together (`run_many`, `scan_many`: a call
//!    costs the round trips of one operation). The answers are printed
//!    and asserted, and the client's counters show the round trips each
//!    kind took (a get is one).
//!
//! Run it with `cargo run --example kv_store -p rolex-host`. Between
//! processes the memory node is `rolex memnode --fabric … --listen …` and
//! the client gets its [`PoolInfo`](rolex_host::kv::PoolInfo) over the
//! bootstrap connection instead of from [`MemoryNode::pool`].

use std::error::Error;

use rolex_host::kv::{KvClient, KvClientConfig, KvOp, Request};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

fn main() -> Result<(), Box<dyn Error>> {
    // Keys 0, 10, 20, … with value key / 10; strictly increasing, as a bulk
    // load needs.
    let pairs: Vec<(u64, u64)> = (0..10_000u64).map(|i| (i * 10, i)).collect();
    let node = MemoryNode::start(MemoryNodeConfig::default(), &pairs)?;
    println!(
        "memory node: {} keys in {} learned models",
        pairs.len(),
        node.model_count()
    );

    let client = KvClient::connect(KvClientConfig::default(), &node.pool())?;
    let mut s = client.session()?;
    println!(
        "compute node: {} bytes of models and tables cached",
        client.model_bytes().total
    );

    let got = s.get(420)?;
    println!("get 420                -> {got:?}");
    assert_eq!(got, Some(42));
    let got = s.get(421)?;
    println!("get 421                -> {got:?}");
    assert_eq!(got, None, "421 was never loaded");

    let prior = s.insert(421, 4210)?;
    println!("insert 421 = 4210      -> previous {prior:?}");
    assert_eq!(prior, None);
    assert_eq!(s.get(421)?, Some(4210));

    let prior = s.update(420, 7)?;
    println!("update 420 = 7         -> previous {prior:?}");
    assert_eq!(prior, Some(42));
    let prior = s.update(5, 1)?;
    println!("update 5 = 1           -> previous {prior:?} (absent: nothing written)");
    assert_eq!(prior, None);
    assert_eq!(s.get(5)?, None);

    let scan = s.scan(400, 5)?;
    println!("scan 5 from 400        -> {scan:?}");
    assert_eq!(
        scan,
        [(400, 40), (410, 41), (420, 7), (421, 4210), (430, 43)]
    );

    let prior = s.delete(421)?;
    println!("delete 421             -> previous {prior:?}");
    assert_eq!(prior, Some(4210));
    assert_eq!(s.get(421)?, None);

    // Operations in flight together: one call, each answer as its single
    // method's, in order (on this ordered fabric the writes' locks and the
    // gets' reads share one round trip, the leaf writes a second).
    let answers = s.run_many(&[
        Request::Get(500),
        Request::Update(510, 5),
        Request::Insert(515, 5150),
        Request::Get(9990),
    ])?;
    let answers: Vec<Option<u64>> = answers.into_iter().collect::<Result<_, _>>()?;
    println!("run_many               -> {answers:?}");
    assert_eq!(answers, [Some(50), Some(51), None, Some(999)]);
    let scans = s.scan_many(&[(500, 3), (99_980, 5)])?;
    println!("scan_many              -> {scans:?}");
    assert_eq!(
        scans,
        [
            vec![(500, 50), (510, 5), (515, 5150)],
            vec![(99_980, 9998), (99_990, 9999)],
        ]
    );

    let stats = client.stats();
    println!("round trips per operation (network, one-sided):");
    for kind in KvOp::ALL {
        let op = stats.op(kind);
        if op.ops > 0 {
            println!(
                "  {:<7} {:>2} ops  {:.1} round trips each",
                kind.name(),
                op.ops,
                op.rtt_per_op()
            );
        }
    }
    Ok(())
}
