//! Without libfabric the project still runs; only asking for a libfabric
//! fabric fails, with an error (not a panic) that says how to install the
//! library or where to point `ROLEX_LIBFABRIC`.
//!
//! libfabric is loaded once per process, so the test runs itself again in
//! a child process whose `ROLEX_LIBFABRIC` names a file that does not
//! exist, and checks there what the engine and the domain answer.
#![cfg(feature = "libfabric")]

use std::process::Command;

use rolex_engine::domain::fabric::{probe, LibfabricConfig, LibfabricDomain};
use rolex_engine::{EngineConfig, Fabric, TransferEngine, TransferError};

/// Set in the child process.
const CHILD: &str = "ROLEX_TEST_LIBFABRIC_MISSING_CHILD";
const MISSING: &str = "/nonexistent/libfabric.so.1";

fn check_in_child() {
    let cfg = LibfabricConfig::new("tcp", Some("127.0.0.1"));
    let err = match TransferEngine::new(EngineConfig {
        fabric: Fabric::Libfabric(cfg.clone()),
        ..EngineConfig::default()
    }) {
        Ok(_) => panic!("an engine opened without libfabric"),
        Err(e) => e,
    };
    assert!(matches!(err, TransferError::LibfabricLoad(_)), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("libfabric could not be loaded ({MISSING}: ")),
        "{text}"
    );
    assert!(
        text.contains("install it (Debian: apt-get install libfabric1) or set ROLEX_LIBFABRIC"),
        "{text}"
    );
    // The domain's constructor and the probe say the same.
    assert_eq!(LibfabricDomain::open(&cfg).unwrap_err(), err);
    assert_eq!(probe("tcp", Some("127.0.0.1")).unwrap_err(), err);
    // Other fabrics are unaffected.
    TransferEngine::loopback(1).unwrap();
    println!("child: {text}");
}

#[test]
fn a_missing_library_is_a_clear_error_from_the_engine() {
    if std::env::var_os(CHILD).is_some() {
        check_in_child();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_missing_library_is_a_clear_error_from_the_engine",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .env("ROLEX_LIBFABRIC", MISSING)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{stderr}"
    );
    // libtest prints the child's line after the test's name.
    if let Some(i) = stdout.find("child: ") {
        println!("{}", stdout[i..].lines().next().unwrap_or_default());
    }
}
