//! Input from peers and callers that is wrong: malformed descriptor and
//! address bytes, unknown peers, zero-length and oversized transfers — all
//! clear errors, never a panic.

mod common;

use common::*;
use proptest::prelude::*;
use rolex_core::wire::Wire;
use rolex_engine::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = mr_desc_from_bytes(&bytes);
        let _ = net_addr_from_bytes(&bytes);
    }

    #[test]
    fn corrupted_descriptors_are_rejected_or_harmless(flip in 0usize..64, bit in 0u8..8) {
        let e = engine(1);
        let (_h, d) = region(&e, 64);
        let mut bytes = d.to_vec().unwrap();
        let i = flip % bytes.len();
        bytes[i] ^= 1 << bit;
        match mr_desc_from_bytes(&bytes) {
            Err(TransferError::Malformed { what: "MrDesc", .. }) => {}
            Err(other) => prop_assert!(false, "unexpected error {other:?}"),
            // Decodes to another (valid) descriptor: using it is checked.
            Ok(_) => {}
        }
    }
}

#[test]
fn malformed_bytes_name_what_failed() {
    let e = engine(1);
    let (_h, d) = region(&e, 64);
    let bytes = d.to_vec().unwrap();
    for cut in 0..bytes.len() {
        match mr_desc_from_bytes(&bytes[..cut]) {
            Err(TransferError::Malformed { what: "MrDesc", .. }) => {}
            other => panic!("truncated at {cut}: {other:?}"),
        }
    }
    let err = mr_desc_from_bytes(&[]).unwrap_err();
    assert!(err.to_string().contains("MrDesc"), "{err}");
    assert!(matches!(
        net_addr_from_bytes(&[1, 1, 0]),
        Err(TransferError::Malformed {
            what: "NetAddr",
            ..
        })
    ));
}

#[test]
fn descriptor_of_an_unknown_peer() {
    bounded(|| {
        let a = engine(1);
        let (src, _) = region(&a, 64);
        let ghost = NetAddr::new(b"loopback/nowhere/9").unwrap();
        let desc = MrDesc::new(0x1000, 64, Access::all(), &[(ghost, 1)]).unwrap();
        let (f, d) = flag();
        a.submit_single_write(8, None, (&src, 0), (&desc, 0), d)
            .unwrap();
        assert_eq!(wait(&f), Err(TransferError::UnknownPeer { peer: ghost }));
        let (f, v) = vflag();
        a.submit_faa((&desc, 0), 1, v).unwrap();
        assert_eq!(wait(&f), Err(TransferError::UnknownPeer { peer: ghost }));
        // A hand-built descriptor with no NIC.
        let mut empty = desc.clone();
        empty.nics.clear();
        let (f, d) = flag();
        a.submit_single_write(8, None, (&src, 0), (&empty, 0), d)
            .unwrap();
        assert_eq!(wait(&f), Err(TransferError::NoNics));
        let mut ch = a.channel().unwrap();
        let mut res = Vec::new();
        ch.run(
            &[BatchOp::Faa {
                dst: &desc,
                offset: 0,
                add: 1,
            }],
            &mut res,
        )
        .unwrap();
        assert_eq!(res[0], Err(TransferError::UnknownPeer { peer: ghost }));
    });
}

#[test]
fn zero_length_and_oversized_transfers() {
    let a = TransferEngine::new(EngineConfig {
        max_transfer: 1024,
        ..EngineConfig::default()
    })
    .unwrap();
    let b = engine(1);
    let (src, _) = region(&a, 4096);
    let (_d, dd) = region(&b, 4096);
    let cb = || OnDone::callback(|_| {});
    assert_eq!(
        a.submit_single_write(0, None, (&src, 0), (&dd, 0), cb()),
        Err(TransferError::ZeroLength { op: OpKind::Write })
    );
    assert_eq!(
        a.submit_single_write(2048, None, (&src, 0), (&dd, 0), cb()),
        Err(TransferError::TooLarge {
            op: OpKind::Write,
            len: 2048,
            max: 1024
        })
    );
    assert_eq!(
        a.submit_read(0, (&src, 0), (&dd, 0), cb()),
        Err(TransferError::ZeroLength { op: OpKind::Read })
    );
    assert_eq!(
        a.submit_send(&b.main_address(), &[], cb()),
        Err(TransferError::ZeroLength { op: OpKind::Send })
    );
    assert!(matches!(
        a.submit_send(&b.main_address(), &[0; 2000], cb()),
        Err(TransferError::TooLarge { .. })
    ));
    assert!(matches!(
        a.submit_recvs(0, 1, |_| {}),
        Err(TransferError::ZeroLength { .. })
    ));
    assert!(matches!(
        a.submit_recvs(8, 0, |_| {}),
        Err(TransferError::ZeroLength { .. })
    ));
    let p = Pages {
        indices: vec![],
        stride: 8,
        offset: 0,
    };
    assert_eq!(
        a.submit_paged_writes(8, None, (&src, &p), (&dd, &p), cb()),
        Err(TransferError::ZeroLength {
            op: OpKind::PagedWrite
        })
    );
    assert!(matches!(
        a.alloc_mr(0, Access::all()),
        Err(TransferError::ZeroLength {
            op: OpKind::Register
        })
    ));
    assert!(matches!(
        a.alloc_mr(u64::MAX, Access::all()),
        Err(TransferError::TooLarge { .. })
    ));
    let mut ch = a.channel().unwrap();
    let mut res = Vec::new();
    ch.run(
        &[BatchOp::Read {
            dst: &src,
            dst_offset: 0,
            src: &dd,
            src_offset: 0,
            len: 0,
        }],
        &mut res,
    )
    .unwrap();
    assert_eq!(res[0], Err(TransferError::ZeroLength { op: OpKind::Read }));
    // Every error has a readable message.
    for e in res.iter().filter_map(|r| r.as_ref().err()) {
        assert!(!e.to_string().is_empty());
    }
}
