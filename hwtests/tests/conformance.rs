//! Runs the conformance suite on every fabric present and prints which
//! fabrics ran and which were skipped, and why.

#[test]
fn conformance_on_every_fabric_present() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(rolex_hwtests::run_all());
    });
    let report = rx
        .recv_timeout(std::time::Duration::from_secs(300))
        .expect("conformance suite hung");
    println!("{report}");
    assert!(!report.ran.is_empty(), "no fabric ran");
    assert!(
        report.failures.is_empty(),
        "conformance failures:\n{report}"
    );
}
