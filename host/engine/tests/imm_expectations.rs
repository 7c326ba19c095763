//! Expectations a receiver never waits on forever (issue 18, point 5):
//! cancelled, past a deadline, or failed by the sender's abort notice
//! when its transfer fails part-way. Outcomes are asserted, never timing.

mod common;

use std::time::{Duration, Instant};

use common::{bounded, engine, flag, region, wait};
use rolex_engine::{
    imm_wait::ABORT_BIT, EngineConfig, MrDesc, ScatterDst, TransferEngine, TransferError,
};

fn with_notices() -> TransferEngine {
    TransferEngine::new(EngineConfig {
        abort_notices: true,
        ..EngineConfig::default()
    })
    .unwrap()
}

/// Two destinations on the receiver, the second with a key its NIC does
/// not know: the first piece lands, the second fails at the target.
fn half_bad(dd: &MrDesc) -> Vec<ScatterDst> {
    let mut bad = dd.clone();
    bad.nics[0].1 ^= 0x5a5a;
    vec![
        ScatterDst {
            len: 64,
            src: 0,
            dst: dd.clone(),
            dst_offset: 0,
        },
        ScatterDst {
            len: 64,
            src: 64,
            dst: bad,
            dst_offset: 64,
        },
    ]
}

#[test]
fn cancelled_expectation_fires_once_and_keeps_arrivals() {
    bounded(|| {
        let (a, b) = (engine(1), engine(1));
        let (src, _) = region(&a, 64);
        let (_dst, dd) = region(&b, 64);
        let (fl, d) = flag();
        b.expect_imm_count(3, 2, d).unwrap();
        let (w, d) = flag();
        a.submit_single_write(8, Some(3), (&src, 0), (&dd, 0), d)
            .unwrap();
        wait(&w).unwrap();
        while b.imm_count(3) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(b.cancel_imm_count(3));
        assert_eq!(wait(&fl), Err(TransferError::ImmCancelled { imm: 3 }));
        assert!(!b.cancel_imm_count(3));
        // The arrival stays for the next expectation.
        assert_eq!(b.imm_count(3), 1);
        let (fl, d) = flag();
        b.expect_imm_count(3, 1, d).unwrap();
        assert_eq!(wait(&fl), Ok(0));
    });
}

#[test]
fn deadline_names_what_arrived() {
    bounded(|| {
        let (a, b) = (engine(1), engine(1));
        let (src, _) = region(&a, 128);
        let (_dst, dd) = region(&b, 128);
        // Without abort notices a part-way failure is only seen at the
        // deadline.
        let (fl, d) = flag();
        b.expect_imm_count_until(4, 2, Instant::now() + Duration::from_millis(200), d)
            .unwrap();
        let (w, d) = flag();
        a.submit_scatter(None, d, Some(4), &src, &half_bad(&dd))
            .unwrap();
        assert!(wait(&w).is_err());
        assert_eq!(
            wait(&fl),
            Err(TransferError::ImmDeadline {
                imm: 4,
                arrived: 1,
                expected: 2
            })
        );
        assert_eq!(b.imm_count(4), 1);
        // A deadline already past fires at once; one that is met does not
        // fire later.
        let (fl, d) = flag();
        b.expect_imm_count_until(9, 1, Instant::now(), d).unwrap();
        assert!(matches!(wait(&fl), Err(TransferError::ImmDeadline { .. })));
        let (fl, d) = flag();
        b.expect_imm_count_until(4, 1, Instant::now() + Duration::from_millis(50), d)
            .unwrap();
        assert_eq!(wait(&fl), Ok(0));
    });
}

#[test]
fn a_sender_failing_part_way_is_surfaced_to_the_receiver() {
    bounded(|| {
        let (a, b) = (with_notices(), with_notices());
        let (src, _) = region(&a, 128);
        let (_dst, dd) = region(&b, 128);
        let (fl, d) = flag();
        b.expect_imm_count(5, 2, d).unwrap();
        let (w, d) = flag();
        a.submit_scatter(None, d, Some(5), &src, &half_bad(&dd))
            .unwrap();
        assert!(wait(&w).is_err());
        assert_eq!(wait(&fl), Err(TransferError::SenderAborted { imm: 5 }));
        // Armed after the sender learnt of its failure: the notice either
        // fails it on arrival or, if it came first, was kept for it.
        let (w, d) = flag();
        a.submit_scatter(None, d, Some(6), &src, &half_bad(&dd))
            .unwrap();
        assert!(wait(&w).is_err());
        let (fl, d) = flag();
        b.expect_imm_count_until(6, 2, Instant::now() + common::HANG, d)
            .unwrap();
        assert_eq!(wait(&fl), Err(TransferError::SenderAborted { imm: 6 }));
        // Successful transfers send no notice.
        let (fl, d) = flag();
        b.expect_imm_count(7, 1, d).unwrap();
        let (w, d) = flag();
        a.submit_single_write(8, Some(7), (&src, 0), (&dd, 0), d)
            .unwrap();
        wait(&w).unwrap();
        assert_eq!(wait(&fl), Ok(0));
        // The abort bit is the engine's.
        let (_, d) = flag();
        assert_eq!(
            a.submit_single_write(8, Some(ABORT_BIT | 7), (&src, 0), (&dd, 0), d),
            Err(TransferError::ImmReserved { imm: ABORT_BIT | 7 })
        );
        let (_, d) = flag();
        assert!(b.expect_imm_count(ABORT_BIT, 1, d).is_err());
    });
}
