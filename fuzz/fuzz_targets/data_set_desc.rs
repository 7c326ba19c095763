//! Fuzzes `DataSetDesc::parse` (the `rolex` tool's) with arbitrary text.
//!
//! A compute node (`rolex bench --memnode`) parses the description a
//! memory node attaches to its bootstrap offer, and `rolex memnode
//! --resume` the one stored beside its pool file: the parser must never
//! panic, and a description it accepts survives a round trip through its
//! text form. The tool is a binary crate: its two small modules are
//! included by path (they compile on their own).
#![no_main]

#[allow(dead_code)]
#[path = "../../tools/src/values.rs"]
mod values;

#[allow(dead_code)]
#[path = "../../tools/src/data_set_desc.rs"]
mod data_set_desc;

use data_set_desc::DataSetDesc;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(desc) = DataSetDesc::parse(text) {
        // Compared as text: a `fill` of NaN is never equal to itself.
        let encoded = desc.encode();
        let again = DataSetDesc::parse(&encoded).expect("an encoded description parses");
        assert_eq!(again.encode(), encoded);
    }
});
