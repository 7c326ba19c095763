//! A receiver completes a sharded single write knowing only its own NIC
//! count (design §4, multi-NIC): senders with 1, 2 and 4 NICs write to
//! receivers with 1, 2 and 3, on loopback and over libfabric `tcp` (where
//! usable); the receiver arms `single_write_pieces(len, its own NICs)`
//! arrivals, every byte lands, and each of its NICs that a piece was due
//! at counts one arrival. Also: transfers of one page or destination
//! take the sender's NICs in turn (they all went through NIC 0).

mod common;

use common::*;
use rolex_engine::domain::fabric::{probe, LibfabricConfig};
use rolex_engine::*;

fn tcp_engine(nics: usize) -> TransferEngine {
    TransferEngine::new(EngineConfig {
        nics_per_group: nics,
        fabric: Fabric::Libfabric(LibfabricConfig::new("tcp", Some("127.0.0.1"))),
        pin_workers: false,
        ..EngineConfig::default()
    })
    .expect("tcp engine")
}

/// Writes `len` bytes (at odd offsets) from `a` to `b` with an immediate
/// and checks what `b` sees, knowing nothing of `a`.
fn sharded(a: &TransferEngine, b: &TransferEngine, len: u64, imm: u32) {
    let (src, _) = region(a, len + 64);
    let (dst, dd) = region(b, len + 64);
    let data = pattern(len as usize + 64, imm as u8);
    src.write(0, &data).unwrap();
    let before: Vec<u64> = b
        .counters()
        .domains
        .iter()
        .map(|d| d.counters.imm_arrivals)
        .collect();
    let pieces = single_write_pieces(len, b.nics());
    let (landed, d) = flag();
    b.expect_imm_count(imm, pieces, d).unwrap();
    let (written, d) = flag();
    a.submit_single_write(len, Some(imm), (&src, 3), (&dd, 5), d)
        .unwrap();
    wait(&written).unwrap();
    wait(&landed).unwrap();
    assert_eq!(
        dst.to_vec(5, len as usize).unwrap(),
        data[3..3 + len as usize],
        "{} -> {} NICs, {len} bytes",
        a.nics(),
        b.nics()
    );
    // Nothing more arrives for it: the expectation took every piece.
    assert_eq!(b.imm_count(imm), 0);
    let after = b.counters();
    for (i, d) in after.domains.iter().enumerate() {
        let got = d.counters.imm_arrivals - before[i];
        let due = u64::from((i as u32) < pieces);
        assert_eq!(got, due, "receiver NIC {i} of {}: arrivals", b.nics());
    }
}

const LENS: [u64; 3] = [SPLIT_MIN / 2, 2 * SPLIT_MIN + 1000, 5 * SPLIT_MIN - 8];

#[test]
fn loopback_receivers_need_not_know_the_senders_nic_count() {
    bounded(|| {
        let receivers: Vec<TransferEngine> = [1, 2, 3].into_iter().map(engine).collect();
        for senders in [1, 2, 4] {
            let a = engine(senders);
            for (k, b) in receivers.iter().enumerate() {
                for (j, &len) in LENS.iter().enumerate() {
                    sharded(&a, b, len, (100 * senders + 10 * k + j) as u32);
                }
            }
        }
        // The rule itself: the receiver's NICs bound the pieces.
        assert_eq!(single_write_pieces(10 * SPLIT_MIN, 3), 3);
        assert_eq!(single_write_pieces(2 * SPLIT_MIN + 1, 3), 2);
        assert_eq!(single_write_pieces(1, 3), 1);
        assert_eq!(single_write_pieces(10 * SPLIT_MIN, 0), 1);
    });
}

#[test]
fn tcp_receivers_need_not_know_the_senders_nic_count() {
    if let Err(e) = probe("tcp", Some("127.0.0.1")) {
        eprintln!("skipped: libfabric tcp not usable here: {e}");
        return;
    }
    bounded(|| {
        let receivers: Vec<TransferEngine> = [1, 3].into_iter().map(tcp_engine).collect();
        for senders in [1, 4] {
            let a = tcp_engine(senders);
            for (k, b) in receivers.iter().enumerate() {
                sharded(&a, b, LENS[2], (200 + 10 * senders + k) as u32);
            }
        }
    });
}

#[test]
fn one_page_transfers_take_the_nics_in_turn() {
    bounded(|| {
        let a = engine(2);
        let b = engine(2);
        let (src, _) = region(&a, 4096);
        let (_dst, dd) = region(&b, 4096);
        let one = Pages {
            indices: vec![0],
            stride: 64,
            offset: 0,
        };
        for _ in 0..4 {
            let (f, d) = flag();
            a.submit_paged_writes(64, Some(1), (&src, &one), (&dd, &one), d)
                .unwrap();
            wait(&f).unwrap();
            let (f, d) = flag();
            let to = ScatterDst {
                len: 64,
                src: 0,
                dst: dd.clone(),
                dst_offset: 128,
            };
            a.submit_scatter(None, d, Some(2), &src, &[to]).unwrap();
            wait(&f).unwrap();
            let (f, d) = flag();
            a.submit_barrier(None, d, 3, std::slice::from_ref(&dd))
                .unwrap();
            wait(&f).unwrap();
        }
        for d in a.counters().domains {
            // 12 one-destination calls over 2 NICs: each NIC carries some.
            assert!(d.counters.write_imms >= 1, "NIC {} idle", d.addr);
        }
        assert_eq!(b.imm_count(1) + b.imm_count(2) + b.imm_count(3), 12);
    });
}
