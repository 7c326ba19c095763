//! A receiver completes a sharded single write knowing only its own NIC
//! count (design §4, multi-NIC): senders with 1, 2 and 4 NICs write to
//! receivers with 1, 2 and 3, on loopback and over libfabric `tcp` (where
//! usable); the receiver arms `single_write_pieces(len, its own NICs)`
//! arrivals, every byte lands, and each of its NICs that a piece was due
//! at counts one arrival.

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
