//! Round trips per operation, as counted by the sessions and cross-checked
//! with the engine: get = 1 with a fresh cache; update and insert (no
//! split) = 2 on an ordered fabric, 3 dependent (+ 1 posted unlock) on an
//! unordered one — tcp's order (writes in order, atomics not) included;
//! an insert that splits = 3 + 1 posted unlock on an ordered fabric, 5 +
//! 1 on an unordered one (the new leaf is written and confirmed before
//! the shrunk leaf that links to it).

mod common;

use common::{half_full_node, Delivery};
use rolex_host::kv::{KvClient, KvOp};
use rolex_host::memnode::MemoryNode;

fn client(node: &MemoryNode, unordered: bool) -> KvClient {
    common::steady_client(node, unordered.then_some((3, std::time::Duration::ZERO)))
}

#[test]
fn round_trips_per_operation() {
    let (node, pairs) = half_full_node();
    for order in [
        Delivery::Ordered,
        Delivery::Unordered,
        Delivery::WritesInOrder,
    ] {
        let unordered = order != Delivery::Ordered;
        let c = common::steady_client_in(&node, order, 3, std::time::Duration::ZERO);
        assert_eq!(c.ordered(), !unordered);
        let mut s = c.session().unwrap();
        let e0 = c.stats().engine.rtts;
        for &(k, v) in &pairs {
            assert_eq!(s.get(k).unwrap(), Some(v));
        }
        for &(k, v) in &pairs {
            assert_eq!(s.update(k, v + 1).unwrap(), Some(v));
        }
        // One new key per leaf: no leaf is full at fill 0.5, so no split.
        for &(k, v) in pairs.iter().step_by(8) {
            assert_eq!(s.insert(k + 1, v).unwrap(), None);
        }
        s.flush().unwrap();
        let st = c.stats();
        let get = st.op(KvOp::Get);
        let upd = st.op(KvOp::Update);
        let ins = st.op(KvOp::Insert);
        assert_eq!(get.rtt_per_op(), 1.0);
        assert_eq!(get.leaves_per_op(), 1.0);
        let writes = if unordered { 3.0 } else { 2.0 };
        assert_eq!(upd.rtt_per_op(), writes);
        assert_eq!(ins.rtt_per_op(), writes);
        assert_eq!(upd.posted, if unordered { upd.ops } else { 0 });
        // Every lock word is changed by atomics only, released by a `CAS`
        // even where writes keep their order (tcp): a WRITE of the word
        // may be stored twice by the target, undoing a lock taken between
        // (`KvSession::write_and_unlock`).
        assert_eq!(
            upd.atomics,
            2 * upd.ops,
            "{order:?}: a lock and an unlock CAS per update"
        );
        assert_eq!(
            ins.atomics,
            2 * ins.ops,
            "{order:?}: a lock and an unlock CAS per insert"
        );
        // The engine counted the same batches (plus the posted unlocks).
        let posted = upd.posted + ins.posted;
        assert_eq!(st.engine.rtts - e0, get.rtts + upd.rtts + ins.rtts + posted);
        for &(k, v) in &pairs {
            assert_eq!(s.get(k).unwrap(), Some(v + 1));
            // Restore for the next fabric.
            s.update(k, v).unwrap();
        }
        for &(k, _) in pairs.iter().step_by(8) {
            s.delete(k + 1).unwrap();
        }
        s.flush().unwrap();
    }
}

#[test]
fn round_trips_per_split() {
    let (node, _) = half_full_node();
    for unordered in [false, true] {
        let c = client(&node, unordered);
        let mut s = c.session().unwrap();
        // Fill leaves until they split: 9 new keys between each pair of
        // loaded ones, over 20 of them (a 16-slot leaf loaded half full).
        let (split, plain) = if unordered { (5.0, 3.0) } else { (3.0, 2.0) };
        let base = if unordered { 6000 } else { 5000 };
        let mut splits = 0;
        for k in (base..base + 200).filter(|k| k % 10 != 0) {
            let before = c.stats();
            assert_eq!(s.insert(k, k).unwrap(), None);
            let after = c.stats();
            let ins = after.op(KvOp::Insert);
            let was = before.op(KvOp::Insert);
            let rtts = (ins.rtts - was.rtts) as f64;
            let posted = ins.posted - was.posted;
            if after.synonym_leaves > before.synonym_leaves {
                splits += 1;
                assert_eq!((rtts, posted), (split, 1), "insert {k} split");
            } else {
                assert_eq!(rtts, plain, "insert {k}");
            }
        }
        assert!(splits > 0, "some inserts split their leaf");
        for k in (base..base + 200).filter(|k| k % 10 != 0) {
            assert_eq!(s.get(k).unwrap(), Some(k));
        }
        s.flush().unwrap();
    }
}

#[test]
fn get_reads_name_what_a_get_reads() {
    // `get_reads` (what `rolex bench`'s raw baseline replays) lists the
    // model's directory word and the key's chain: as many bytes as a get
    // of that key then reads, in as many READs as the get posts.
    let (node, pairs) = half_full_node();
    for unordered in [false, true] {
        let c = client(&node, unordered);
        let mut s = c.session().unwrap();
        for &(k, v) in pairs.iter().step_by(97) {
            let reads = s.get_reads(k).unwrap();
            assert!(reads.len() >= 2, "key {k}: {reads:?}");
            assert_eq!(reads[0].1, 8, "key {k}: the directory word first");
            let bytes: u64 = reads.iter().map(|r| r.1).sum();
            let before = c.stats().op(KvOp::Get);
            let e0 = c.stats().engine.reads;
            assert_eq!(s.get(k).unwrap(), Some(v));
            let get = c.stats().op(KvOp::Get);
            assert_eq!(get.bytes_read - before.bytes_read, bytes, "key {k}");
            assert_eq!(c.stats().engine.reads - e0, reads.len() as u64, "key {k}");
        }
    }
}
