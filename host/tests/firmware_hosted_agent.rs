//! The hosted agent on a corrupted pool (the same cases the firmware image
//! is tested with in `tools/tests/firmware_image.rs`): a bad magic or a
//! wrong layout version stops every step with an error naming it, and a
//! CirQ entry naming no model is consumed and reported as a notice; in no
//! case does the agent change the pool's data.

use std::time::{Duration, Instant};

use rolex_core::layout::{CirqHeader, Superblock};
use rolex_host::memnode::{AgentError, MemoryNode, MemoryNodeConfig, MemoryNodeError};

fn node(thread: bool) -> MemoryNode {
    let pairs: Vec<(u64, u64)> = (0..64u64).map(|i| (i * 10, i)).collect();
    MemoryNode::start(
        MemoryNodeConfig {
            leaf_slots: 4,
            fill: 0.5,
            epsilon: 2,
            max_model_leaves: 4,
            retrain_trigger: 1,
            retraining_thread: thread,
            ..MemoryNodeConfig::default()
        },
        &pairs,
    )
    .unwrap()
}

fn sb(node: &MemoryNode) -> Superblock {
    Superblock::read(
        &node
            .pool_handle()
            .to_vec(0, Superblock::SIZE as usize)
            .unwrap(),
    )
    .unwrap()
}

fn snapshot(node: &MemoryNode) -> Vec<u8> {
    let mh = node.pool_handle();
    mh.to_vec(0, mh.len() as usize).unwrap()
}

#[test]
fn a_bad_magic_or_version_stops_the_agent_without_touching_data() {
    for (word, value, says) in [(0u64, 0xdead_beefu64, "magic"), (8, 99, "version 99")] {
        let node = node(false);
        let mh = node.pool_handle();
        let v = if word == 8 {
            (mh.load_u64(8).unwrap() & !0xffff_ffff) | value
        } else {
            value
        };
        mh.store_u64(word, v).unwrap();
        let before = snapshot(&node);
        for _ in 0..3 {
            let e = node.poll_once().unwrap_err();
            assert!(
                matches!(e, MemoryNodeError::Agent(AgentError::Layout(_))),
                "{e:?}"
            );
            assert!(e.to_string().contains(says), "{e}");
            assert!(
                node.retrain_now(0).is_err(),
                "a forced retraining is refused too"
            );
        }
        assert_eq!(snapshot(&node), before);
    }
}

#[test]
fn the_retraining_thread_reports_a_pool_gone_bad() {
    let node = node(true);
    node.pool_handle().store_u64(0, 1).unwrap();
    let before = snapshot(&node);
    let t = Instant::now();
    while node.last_agent_error().is_none() && t.elapsed() < Duration::from_secs(20) {
        node.wake();
        std::thread::sleep(Duration::from_millis(2));
    }
    let e = node
        .last_agent_error()
        .expect("the thread met the bad pool");
    assert!(e.to_string().contains("magic"), "{e}");
    assert_eq!(snapshot(&node), before);
    assert!(node.stats().agent_errors >= 1);
}

#[test]
fn a_cirq_entry_naming_no_model_is_skipped_with_a_notice() {
    let node = node(false);
    let models = node.model_count();
    let sb = sb(&node);
    let mh = node.pool_handle();
    let base = sb.cirq_offset();
    let cap = mh.load_u64(base + CirqHeader::CAPACITY_OFFSET).unwrap();
    let t = mh.load_u64(base + CirqHeader::TAIL_OFFSET).unwrap();
    mh.store_u64(base + CirqHeader::TAIL_OFFSET, t + 1).unwrap();
    mh.store_u64(
        base + CirqHeader::slot_offset(t, cap).unwrap(),
        CirqHeader::encode_slot(t, models + 3).unwrap(),
    )
    .unwrap();
    let mut before = snapshot(&node);
    assert_eq!(node.poll_once().unwrap(), None);
    let notices = node.take_notices();
    assert_eq!(notices.len(), 1);
    let text = notices[0].to_string();
    assert!(
        text.contains(&format!("names model {}", models + 3)) && text.contains("skipped"),
        "{text}"
    );
    let st = node.stats().agent;
    assert_eq!((st.cirq_pops, st.cirq_unknown, st.retrains), (1, 1, 0));
    // Only the CirQ changed: its head advanced and the slot was cleared.
    let mut after = snapshot(&node);
    let (a, n) = (base as usize, sb.cirq_len() as usize);
    before[a..a + n].fill(0);
    after[a..a + n].fill(0);
    assert_eq!(after, before);
}
