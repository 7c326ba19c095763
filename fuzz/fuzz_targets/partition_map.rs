//! Fuzzes `PartitionMap::decode` with arbitrary text.
//!
//! A memory node of a cluster sends its partition map in its bootstrap
//! offer's description, and a compute node routes every key by it: the
//! decoder must never panic, and a map it accepts routes every key to one
//! of its nodes (node 0 starting at key 0, ranges increasing) and
//! survives a round trip through its text form (the text itself is not
//! canonical: `+1` and `01` read as 1).
#![no_main]

use libfuzzer_sys::fuzz_target;
use rolex_kv::PartitionMap;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(map) = PartitionMap::decode(text) else {
        return;
    };
    assert_eq!(PartitionMap::decode(&map.encode()), Ok(map.clone()));
    assert_eq!(map.range(0).map(|(lo, _)| lo), Some(0));
    for key in [0, 1, u64::MAX / 2, u64::MAX] {
        let node = map.route(key);
        let (lo, hi) = map.range(node).expect("routed to a node of the map");
        assert!(lo <= key && key <= hi);
    }
    assert_eq!(map.range(map.nodes()), None);
});
