//! Helpers shared by the tests that run the `rolex` binary: running it,
//! scratch files, SOSD bytes, failure checks, and child processes that are
//! killed on every path.
// Each test binary uses a different subset of these.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output};

/// The `rolex` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_rolex");

/// Runs `rolex ARGS` to completion.
pub fn rolex(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run rolex")
}

/// A scratch path unique to this test process.
pub fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rolex-test-{}-{name}", std::process::id()))
}

/// `keys` as a SOSD file's bytes.
pub fn sosd(keys: &[u64]) -> Vec<u8> {
    let mut b = (keys.len() as u64).to_le_bytes().to_vec();
    keys.iter().for_each(|k| b.extend(k.to_le_bytes()));
    b
}

/// Asserts a failure whose stderr names `what`, without a panic.
pub fn assert_fails(out: &Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success");
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(stderr.contains(what), "stderr lacks {what:?}: {stderr}");
}

/// Kills the child when dropped, pass or fail.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
