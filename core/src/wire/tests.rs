//! Properties every wire type keeps: round trips, canonical encoding, and
//! decoders that turn any damaged or arbitrary input into an error naming
//! the field instead of a panic.

use core::fmt::Debug;
use std::vec;
use std::vec::Vec;

use proptest::prelude::*;

use super::*;

fn net_addr() -> impl Strategy<Value = NetAddr> {
    proptest::collection::vec(any::<u8>(), 1..=NetAddr::MAX_LEN)
        .prop_map(|b| NetAddr::new(&b).expect("1..=64 bytes"))
}

fn access() -> impl Strategy<Value = Access> {
    (0u8..16).prop_map(Access::from_bits_truncate)
}

fn mr_desc() -> impl Strategy<Value = MrDesc> {
    (
        any::<u64>(),
        any::<u64>(),
        access(),
        proptest::collection::vec((net_addr(), any::<u64>()), 1..=MAX_NICS),
    )
        .prop_map(|(ptr, len, access, nics)| {
            // Keep ptr + len in range rather than rejecting most cases.
            let len = len.min(u64::MAX - ptr);
            MrDesc::new(ptr, len, access, &nics).expect("valid by construction")
        })
}

fn scatter_dst() -> impl Strategy<Value = ScatterDst> {
    (any::<u64>(), any::<u64>(), mr_desc(), any::<u64>()).prop_map(|(len, src, dst, dst_offset)| {
        ScatterDst {
            len,
            src,
            dst,
            dst_offset,
        }
    })
}

#[cfg(feature = "alloc")]
fn pages() -> impl Strategy<Value = Pages> {
    (
        proptest::collection::vec(any::<u32>(), 0..40),
        any::<u64>(),
        any::<u64>(),
    )
        .prop_map(|(indices, stride, offset)| Pages {
            indices,
            stride,
            offset,
        })
}

fn encode_to_vec<T: Wire>(v: &T) -> Vec<u8> {
    let mut out = vec![0; v.encoded_len()];
    let n = v.encode(&mut out).expect("valid values encode");
    assert_eq!(n, out.len(), "encoded_len is exact");
    out
}

/// Round trip, exact length, short buffers, prefix decoding.
fn round_trip<T: Wire + PartialEq + Debug>(v: &T) {
    let bytes = encode_to_vec(v);
    assert_eq!(T::decode(&bytes).as_ref(), Ok(v));
    #[cfg(feature = "alloc")]
    assert_eq!(v.to_vec().as_ref(), Ok(&bytes));
    let mut short = vec![0; bytes.len() - 1];
    assert_eq!(
        v.encode(&mut short),
        Err(WireError::BufferTooSmall {
            need: bytes.len(),
            have: bytes.len() - 1
        })
    );
    let mut more = bytes.clone();
    more.extend_from_slice(&[0xee, 0xff]);
    let (again, rest) = T::decode_prefix(&more).expect("prefix decodes");
    assert_eq!((&again, rest), (v, &[0xee, 0xff][..]));
    assert_eq!(
        T::decode(&more),
        Err(WireError::TrailingBytes {
            what: T::NAME,
            extra: 2
        })
    );
    assert_eq!(peek_tag(&bytes), Ok(T::TAG));
}

/// Every proper prefix is `Truncated`, never a panic or a value.
fn truncations<T: Wire + Debug>(bytes: &[u8]) {
    for cut in 0..bytes.len() {
        match T::decode(&bytes[..cut]) {
            Err(WireError::Truncated { need, have, .. }) => assert!(have < need),
            other => panic!("prefix of {cut} bytes decoded to {other:?}"),
        }
    }
}

/// If `bytes` decode, the value re-encodes to exactly `bytes`.
fn canonical<T: Wire + PartialEq + Debug>(bytes: &[u8]) -> bool {
    match T::decode(bytes) {
        Ok(v) => {
            assert_eq!(encode_to_vec(&v), bytes, "decoded {v:?}");
            true
        }
        Err(_) => false,
    }
}

/// Every byte replaced by every value: an error or a canonical value.
fn corruptions<T: Wire + PartialEq + Debug>(bytes: &[u8]) {
    let mut b = bytes.to_vec();
    for i in 0..b.len() {
        let keep = b[i];
        for x in 0..=255u8 {
            b[i] = x;
            canonical::<T>(&b);
        }
        b[i] = keep;
    }
}

#[test]
fn header_is_checked() {
    let a = NetAddr::new(&[1]).unwrap();
    let mut b = encode_to_vec(&a);
    b[0] = 2;
    assert_eq!(NetAddr::decode(&b), Err(WireError::BadVersion { found: 2 }));
    assert_eq!(peek_tag(&b), Err(WireError::BadVersion { found: 2 }));
    b[0] = WIRE_VERSION;
    b[1] = 9;
    assert_eq!(
        NetAddr::decode(&b),
        Err(WireError::BadTag {
            what: "NetAddr",
            found: 9
        })
    );
    assert!(matches!(peek_tag(&[1]), Err(WireError::Truncated { .. })));
}

#[test]
fn tags_are_distinct() {
    let mut tags = [NetAddr::TAG, MrDesc::TAG, PagesRef::TAG, ScatterDst::TAG];
    tags.sort_unstable();
    assert!(tags.windows(2).all(|w| w[0] != w[1]));
}

#[test]
fn errors_say_what_was_wrong() {
    let e = WireError::Truncated {
        what: "MrDesc rkey",
        need: 8,
        have: 3,
    };
    assert_eq!(
        std::format!("{e}"),
        "truncated MrDesc rkey: needs 8 bytes, 3 left"
    );
    let e = WireError::UnknownBits {
        what: "MrDesc access",
        bits: 0x30,
    };
    assert_eq!(std::format!("{e}"), "MrDesc access has unknown bits 0x30");
    let _: &dyn core::error::Error = &e;
}

#[test]
fn messages_follow_each_other() {
    let a = NetAddr::new(&[1, 2, 3]).unwrap();
    let d = MrDesc::new(0, 64, Access::REMOTE_WRITE, &[(a, 5)]).unwrap();
    let mut bytes = encode_to_vec(&a);
    bytes.extend(encode_to_vec(&d));
    let (a2, rest) = NetAddr::decode_prefix(&bytes).unwrap();
    assert_eq!(peek_tag(rest), Ok(MrDesc::TAG));
    assert_eq!((a2, MrDesc::decode(rest)), (a, Ok(d)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn net_addr_round_trips(v in net_addr()) {
        round_trip(&v);
        truncations::<NetAddr>(&encode_to_vec(&v));
    }

    #[test]
    fn mr_desc_round_trips(v in mr_desc()) {
        round_trip(&v);
        truncations::<MrDesc>(&encode_to_vec(&v));
    }

    #[test]
    fn scatter_dst_round_trips(v in scatter_dst()) {
        round_trip(&v);
        truncations::<ScatterDst>(&encode_to_vec(&v));
    }

    #[test]
    fn pages_ref_round_trips(
        indices in proptest::collection::vec(any::<u32>(), 0..40),
        stride in any::<u64>(),
        offset in any::<u64>(),
    ) {
        let mut bytes = vec![0; pages_encoded_len(indices.len()).unwrap()];
        let n = encode_pages(&indices, stride, offset, &mut bytes).unwrap();
        prop_assert_eq!(n, bytes.len());
        let p = PagesRef::decode(&bytes).unwrap();
        prop_assert_eq!((p.stride(), p.offset()), (stride, offset));
        prop_assert_eq!(p.iter().collect::<Vec<_>>(), indices.clone());
        prop_assert_eq!(p.iter().len(), indices.len());
        for cut in 0..bytes.len() {
            let truncated = matches!(
                PagesRef::decode(&bytes[..cut]),
                Err(WireError::Truncated { .. })
            );
            prop_assert!(truncated, "prefix of {} bytes", cut);
        }
    }
}

#[cfg(feature = "alloc")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn pages_round_trip(v in pages()) {
        round_trip(&v);
        let bytes = encode_to_vec(&v);
        truncations::<Pages>(&bytes);
        prop_assert_eq!(PagesRef::decode(&bytes).unwrap().to_pages(), v);
    }
}

proptest! {
    // Each case decodes ~256 × (message length) corrupted copies.
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn corrupted_net_addr_never_panics(v in net_addr()) {
        corruptions::<NetAddr>(&encode_to_vec(&v));
    }

    #[test]
    fn corrupted_mr_desc_never_panics(v in mr_desc()) {
        corruptions::<MrDesc>(&encode_to_vec(&v));
    }

    #[test]
    fn corrupted_scatter_dst_never_panics(v in scatter_dst()) {
        corruptions::<ScatterDst>(&encode_to_vec(&v));
    }
}

#[cfg(feature = "alloc")]
proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn corrupted_pages_never_panic(v in pages()) {
        let bytes = encode_to_vec(&v);
        corruptions::<Pages>(&bytes);
        // The borrowed decoder agrees with the owned one on every copy.
        let mut b = bytes.clone();
        for i in 0..b.len() {
            let keep = b[i];
            for x in [0, 1, 3, 0x7f, 0x80, 0xff] {
                b[i] = x;
                prop_assert_eq!(
                    Pages::decode(&b),
                    PagesRef::decode(&b).map(|p| p.to_pages())
                );
            }
            b[i] = keep;
        }
    }
}

/// Arbitrary bytes, most starting with a valid header so the bodies get
/// exercised.
fn arbitrary_message() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..160),
        (1u8..=4, proptest::collection::vec(any::<u8>(), 0..160)).prop_map(|(tag, body)| {
            let mut b = vec![WIRE_VERSION, tag];
            b.extend(body);
            b
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_decode_canonically_or_fail(bytes in arbitrary_message()) {
        canonical::<NetAddr>(&bytes);
        canonical::<MrDesc>(&bytes);
        canonical::<ScatterDst>(&bytes);
        let view = PagesRef::decode(&bytes);
        #[cfg(feature = "alloc")]
        {
            canonical::<Pages>(&bytes);
            prop_assert_eq!(Pages::decode(&bytes), view.map(|p| p.to_pages()));
        }
        #[cfg(not(feature = "alloc"))]
        let _ = view;
    }
}
