//! `rolex te-bench` on the in-process loopback NIC: submitting threads in
//! domain groups of their own (`--groups`, one per thread by default), and
//! a group count out of range refused before anything runs; `--channel`
//! latency samples as whole doorbell batches of `--depth` operations.

use std::process::Command;

mod common;

use common::BIN;

fn te_bench(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args([
            "te-bench", "--op", "write", "--size", "4096", "--count", "2000",
        ])
        .args(args)
        .args(["--json"])
        .output()
        .expect("run te-bench")
}

fn json(out: &std::process::Output) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).expect("one JSON line")
}

#[test]
fn each_thread_gets_a_group_of_its_own_unless_told_otherwise() {
    let v = json(&te_bench(&["--threads", "2"]));
    assert_eq!(
        (v["threads"].as_u64(), v["groups"].as_u64()),
        (Some(2), Some(2)),
        "{v}"
    );
    assert_eq!(v["errors"], 0, "{v}");
    assert_eq!(v["count"], 2000, "{v}");
    // Three threads over two groups: thread 2 shares group 0.
    let v = json(&te_bench(&["--threads", "3", "--groups", "2"]));
    assert_eq!(
        (v["threads"].as_u64(), v["groups"].as_u64()),
        (Some(3), Some(2)),
        "{v}"
    );
    assert_eq!(v["errors"], 0, "{v}");
    let v = json(&te_bench(&["--threads", "2", "--groups", "1"]));
    assert_eq!(v["groups"], 1, "{v}");
}

#[test]
fn a_group_count_out_of_range_is_refused() {
    for bad in ["0", "17"] {
        let out = te_bench(&["--groups", bad]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--groups") && err.contains("between 1 and 16"),
            "{err}"
        );
    }
}

#[test]
fn a_channel_times_whole_batches_of_depth_operations() {
    let out = Command::new(BIN)
        .args([
            "te-bench",
            "--op",
            "read",
            "--size",
            "64",
            "--count",
            "999",
            "--depth",
            "3",
            "--channel",
            "--json",
        ])
        .output()
        .expect("run te-bench");
    let v = json(&out);
    assert_eq!(v["errors"], 0, "{v}");
    // The throughput phase: 333 batches of 3 reads; every latency sample
    // after it a batch of 3 reads too (one round trip each).
    let rtts = v["rtts"].as_u64().unwrap();
    let latency_batches = rtts - 333;
    assert!(latency_batches > 0, "{v}");
    assert_eq!(
        v["bytes_read"].as_u64(),
        Some(64 * (999 + 3 * latency_batches)),
        "{v}"
    );
}

#[test]
fn a_depth_out_of_range_is_refused_before_anything_runs() {
    for bad in ["0", "65537", "100000000000"] {
        let out = te_bench(&["--depth", bad, "--channel"]);
        assert!(!out.status.success(), "--depth {bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--depth"), "--depth {bad}: {err}");
        assert!(!err.contains("panicked"), "--depth {bad}: {err}");
    }
}
