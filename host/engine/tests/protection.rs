//! Every protection violation fails with an error completion naming the
//! check, and the target memory is unchanged afterwards — whether the
//! descriptor is honest (caught before posting) or forged (caught by the
//! target NIC).

mod common;

use common::*;
use rolex_engine::*;

struct Setup {
    a: TransferEngine,
    b: TransferEngine,
    src: MrHandle,
    dst: MrHandle,
}

fn setup(access: Access) -> (Setup, MrDesc) {
    let a = engine(1);
    let b = engine(1);
    let (src, _) = region(&a, 4096);
    src.fill(0xaa).unwrap();
    let (dst, dd) = b.alloc_mr(1024, access).unwrap();
    dst.fill(0x11).unwrap();
    (Setup { a, b, src, dst }, dd)
}

fn unchanged(s: &Setup) {
    assert!(
        s.dst.to_vec(0, 1024).unwrap().iter().all(|b| *b == 0x11),
        "target memory changed"
    );
}

fn expect_check(r: Result<u64, TransferError>, want: fn(&ProtectionCheck) -> bool) {
    match r {
        Err(TransferError::Protection { check, .. }) if want(&check) => {}
        other => panic!("expected a protection error, got {other:?}"),
    }
}

/// Runs write, read, cas and faa against `desc` at `offset`; each must
/// fail the check and change nothing.
fn all_ops_fail(s: &Setup, desc: &MrDesc, offset: u64, want: fn(&ProtectionCheck) -> bool) {
    let (f, d) = flag();
    s.a.submit_single_write(16, Some(1), (&s.src, 0), (desc, offset), d)
        .unwrap();
    expect_check(wait(&f), want);
    let (f, d) = flag();
    s.a.submit_read(16, (&s.src, 0), (desc, offset), d).unwrap();
    expect_check(wait(&f), want);
    let (f, v) = vflag();
    s.a.submit_cas((desc, offset), 0x1111_1111_1111_1111, 5, v)
        .unwrap();
    expect_check(wait(&f), want);
    let (f, v) = vflag();
    s.a.submit_faa((desc, offset), 1, v).unwrap();
    expect_check(wait(&f), want);
    unchanged(s);
    assert!(
        s.src.to_vec(0, 16).unwrap().iter().all(|b| *b == 0xaa),
        "read changed local memory"
    );
    assert_eq!(s.b.imm_count(1), 0, "no immediate delivered");
}

#[test]
fn wrong_key() {
    bounded(|| {
        let (s, mut dd) = setup(Access::all());
        dd.nics[0].1 ^= 0x5555;
        all_ops_fail(&s, &dd, 0, |c| *c == ProtectionCheck::UnknownKey);
    });
}

#[test]
fn out_of_bounds_honest_and_forged() {
    bounded(|| {
        let (s, dd) = setup(Access::all());
        all_ops_fail(&s, &dd, 1020, |c| {
            matches!(c, ProtectionCheck::OutOfBounds { .. })
        });
        all_ops_fail(&s, &dd, u64::MAX - 4, |c| {
            matches!(c, ProtectionCheck::OutOfBounds { .. })
        });
        // A descriptor that claims a longer region: the target NIC refuses.
        let mut forged = dd.clone();
        forged.len = 1 << 20;
        all_ops_fail(&s, &forged, 1024, |c| {
            matches!(c, ProtectionCheck::OutOfBounds { .. })
        });
        // One that claims an earlier start.
        let mut forged = dd.clone();
        forged.ptr -= 64;
        all_ops_fail(&s, &forged, 0, |c| {
            matches!(c, ProtectionCheck::OutOfBounds { .. })
        });
    });
}

#[test]
fn missing_rights_honest_and_forged() {
    bounded(|| {
        // No remote rights at all.
        let (s, dd) = setup(Access::LOCAL_WRITE);
        all_ops_fail(&s, &dd, 0, |c| {
            matches!(c, ProtectionCheck::MissingRight(_))
        });
        let mut forged = dd.clone();
        forged.access = Access::all();
        all_ops_fail(&s, &forged, 0, |c| {
            matches!(c, ProtectionCheck::MissingRight(_))
        });
        // Read-only region: writes and atomics refused, reads fine.
        let (s, dd) = setup(Access::REMOTE_READ);
        let (f, d) = flag();
        s.a.submit_single_write(8, None, (&s.src, 0), (&dd, 0), d)
            .unwrap();
        expect_check(wait(&f), |c| {
            *c == ProtectionCheck::MissingRight(Access::REMOTE_WRITE)
        });
        let (f, v) = vflag();
        s.a.submit_faa((&dd, 0), 1, v).unwrap();
        expect_check(wait(&f), |c| {
            *c == ProtectionCheck::MissingRight(Access::REMOTE_ATOMIC)
        });
        let (f, d) = flag();
        s.a.submit_read(8, (&s.src, 0), (&dd, 0), d).unwrap();
        wait(&f).unwrap();
        unchanged(&s);
    });
}

#[test]
fn misaligned_atomics() {
    bounded(|| {
        let (s, dd) = setup(Access::all());
        for off in [1, 4, 7, 1001] {
            let (f, v) = vflag();
            s.a.submit_cas((&dd, off), 0x1111_1111_1111_1111, 0, v)
                .unwrap();
            expect_check(wait(&f), |c| {
                matches!(c, ProtectionCheck::Misaligned { .. })
            });
            let (f, v) = vflag();
            s.a.submit_faa((&dd, off), 1, v).unwrap();
            expect_check(wait(&f), |c| {
                matches!(c, ProtectionCheck::Misaligned { .. })
            });
        }
        unchanged(&s);
    });
}

#[test]
fn a_failed_check_in_a_paged_or_scatter_transfer_changes_nothing() {
    bounded(|| {
        let (s, dd) = setup(Access::all());
        let sp = Pages {
            indices: vec![0, 1, 2],
            stride: 64,
            offset: 0,
        };
        let dp = Pages {
            indices: vec![0, 1, 200],
            stride: 64,
            offset: 0,
        };
        let (f, d) = flag();
        s.a.submit_paged_writes(64, None, (&s.src, &sp), (&dd, &dp), d)
            .unwrap();
        expect_check(wait(&f), |c| {
            matches!(c, ProtectionCheck::OutOfBounds { .. })
        });
        let dst = [
            ScatterDst {
                len: 8,
                src: 0,
                dst: dd.clone(),
                dst_offset: 0,
            },
            ScatterDst {
                len: 8,
                src: 0,
                dst: dd.clone(),
                dst_offset: 1020,
            },
        ];
        let (f, d) = flag();
        s.a.submit_scatter(None, d, None, &s.src, &dst).unwrap();
        expect_check(wait(&f), |c| {
            matches!(c, ProtectionCheck::OutOfBounds { .. })
        });
        unchanged(&s);
        assert!(s.a.counters().total.errors >= 2);
    });
}

#[test]
fn local_range_errors_are_returned_at_once() {
    let (s, dd) = setup(Access::all());
    assert_eq!(
        s.a.submit_single_write(8, None, (&s.src, 4090), (&dd, 0), OnDone::callback(|_| {})),
        Err(TransferError::LocalOutOfBounds {
            offset: 4090,
            len: 8,
            region_len: 4096
        })
    );
    // A handle of another engine is not a local region.
    assert_eq!(
        s.a.submit_single_write(8, None, (&s.dst, 0), (&dd, 0), OnDone::callback(|_| {})),
        Err(TransferError::ForeignRegion)
    );
    unchanged(&s);
}

/// A queue pair remembers the last region it hit (the loopback NIC's
/// region cache): once the target deregisters it, the same channel's next
/// read is refused with an unknown key, and a region registered after it
/// is reached.
#[test]
fn a_channel_never_reaches_a_region_deregistered_after_its_last_read() {
    bounded(|| {
        let (s, dd) = setup(Access::all());
        let mut ch = s.a.channel().unwrap();
        let read = |ch: &mut batch::Channel, desc: &MrDesc| {
            let mut results = Vec::new();
            ch.run(
                &[batch::BatchOp::Read {
                    dst: &s.src,
                    dst_offset: 0,
                    src: desc,
                    src_offset: 0,
                    len: 16,
                }],
                &mut results,
            )
            .unwrap();
            results.remove(0)
        };
        assert_eq!(read(&mut ch, &dd), Ok(0));
        assert_eq!(s.src.to_vec(0, 16).unwrap(), vec![0x11; 16]);
        s.b.dereg_mr(&s.dst).unwrap();
        expect_check(read(&mut ch, &dd), |c| *c == ProtectionCheck::UnknownKey);
        let (other, od) = s.b.alloc_mr(64, Access::all()).unwrap();
        other.fill(0x22).unwrap();
        assert_eq!(read(&mut ch, &od), Ok(0));
        assert_eq!(s.src.to_vec(0, 16).unwrap(), vec![0x22; 16]);
    });
}
