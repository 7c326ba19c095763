//! The retraining queue under faults, seen from compute nodes: a queue
//! wedged by producers that took tickets and never wrote them makes an
//! enqueuer fail with `CirqFull` after a bounded wait (its insert applied),
//! and the memory node skips the abandoned tickets and goes on.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use rolex_core::layout::{CirqHeader, Superblock};
use rolex_host::kv::{KvClient, KvClientConfig, KvError};
use rolex_host::memnode::{MemoryNode, MemoryNodeConfig};

#[test]
fn a_wedged_queue_is_back_pressure_and_the_agent_skips_abandoned_tickets() {
    common::bounded(|| {
        // One model; the agent acts only when polled, and gives up on an
        // unwritten ticket at once (no live producer is racing it here).
        let pairs: Vec<(u64, u64)> = (0..4u64).map(|i| (i << 32, i)).collect();
        let node = MemoryNode::start(
            MemoryNodeConfig {
                leaf_slots: 4,
                fill: 0.5,
                epsilon: 2,
                max_model_leaves: 4,
                // A queue as small as the loaded models (no growth): the
                // test fills it.
                directory_spare: Some(0),
                retraining_thread: false,
                cirq_abandon_after: Duration::ZERO,
                ..MemoryNodeConfig::default()
            },
            &pairs,
        )
        .unwrap();
        let mh = node.pool_handle();
        let sb = Superblock::read(&mh.to_vec(0, Superblock::SIZE as usize).unwrap()).unwrap();
        let base = sb.cirq_offset();
        let cap = mh.load_u64(base + CirqHeader::CAPACITY_OFFSET).unwrap();
        // `cap` producers took tickets and died before writing them.
        mh.store_u64(base + CirqHeader::TAIL_OFFSET, cap).unwrap();
        eprintln!("injected: {cap} tickets taken and never written (a full queue)");

        let client = KvClient::connect(KvClientConfig::default(), &node.pool()).unwrap();
        let mut s = client.session().unwrap();
        let mut model: BTreeMap<u64, u64> = pairs.iter().copied().collect();
        let mut k = 1u64;
        let err = loop {
            let r = s.insert(k, k);
            model.insert(k, k);
            match r {
                Ok(_) => k += 1,
                Err(e) => break e,
            }
        };
        eprintln!("found: insert of key {k} returned: {err}");
        // The insert was applied before the queue was found full, so the
        // error says the operation may have taken effect.
        assert!(err.may_have_applied(), "{err}");
        assert!(
            matches!(&err, KvError::Indeterminate(e)
                if matches!(**e, KvError::CirqFull { ticket, .. } if ticket == cap)),
            "{err}"
        );
        assert_eq!(client.stats().retrain_requests, 0);
        assert_eq!(s.get(k).unwrap(), Some(k), "the insert was applied");

        // The agent skips every abandoned ticket (the enqueuer's own
        // included) and retrains the model by watching its SLT.
        let r = node.poll_once().unwrap().expect("the model is retrained");
        let st = node.stats().agent;
        eprintln!(
            "found: agent skipped {} tickets, popped {}, retrained model {} ({} synonyms absorbed)",
            st.cirq_abandoned, st.cirq_pops, r.model_id, r.synonyms_absorbed
        );
        assert_eq!((st.cirq_abandoned, st.cirq_pops), (cap + 1, 0));
        let notices = node.take_notices();
        assert_eq!(notices.len() as u64, cap + 1);
        assert!(
            notices[0].to_string().contains("abandoned"),
            "{}",
            notices[0]
        );
        assert_eq!(
            mh.load_u64(base + CirqHeader::HEAD_OFFSET).unwrap(),
            cap + 1
        );

        // The queue goes on: the next enqueue is written and consumed.
        while client.stats().retrain_requests == 0 {
            k += 1;
            s.insert(k, k).unwrap();
            model.insert(k, k);
        }
        node.poll_once()
            .unwrap()
            .expect("the queued model is retrained");
        let st = node.stats().agent;
        eprintln!(
            "found: inserting up to key {k}, the next enqueue was delivered ({} pop)",
            st.cirq_pops
        );
        assert_eq!(
            (st.cirq_pops, st.cirq_abandoned, st.retrains),
            (1, cap + 1, 2)
        );
        let want: Vec<(u64, u64)> = model.iter().map(|(&a, &b)| (a, b)).collect();
        assert_eq!(s.range(0, u64::MAX).unwrap(), want);
    });
}
