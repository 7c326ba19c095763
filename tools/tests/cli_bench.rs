//! `rolex bench` as a user runs it: every workload runs end to end on a
//! small key set and verifies what it wrote; bad input gives one clear
//! error line and a non-zero exit, never a panic. Figures are checked only
//! where they are exact (round trips of a fresh cache), never timings.

mod common;

use common::{assert_fails, rolex, sosd, tmp};

/// Runs a small bench and returns its JSON line, parsed, after checking
/// that the line has exactly the promised fields in the promised order.
fn bench_json(extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["bench", "--threads", "2", "--json"];
    args.extend_from_slice(extra);
    let out = rolex(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    let obj = j.as_object().expect("an object");
    assert_eq!(obj.len(), FIELDS.len(), "{stdout}");
    let at: Vec<usize> = FIELDS
        .iter()
        .map(|f| stdout.find(&format!("\"{f}\":")).expect(f))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "field order: {stdout}");
    j
}

const FIELDS: [&str; 30] = [
    "workload",
    "keys",
    "ops",
    "threads",
    "mops",
    "p50_us",
    "p99_us",
    "rtt_per_op",
    "bytes_per_op",
    "value_bytes_per_op",
    "leaves_per_get",
    "retries_per_op",
    "retrains",
    "synonym_leaves",
    "model_bytes",
    "raw_read_mops",
    "failed_ops",
    "redo_logged",
    "redo_unlogged",
    "locks_held_end",
    "pool_bytes_start",
    "pool_bytes_end",
    "leaves_live",
    "leaves_free",
    "memnodes",
    "per_memnode_keys",
    "per_memnode_ops",
    "nodes_lost",
    "keys_unverified",
    "verified",
];

#[test]
fn every_workload_runs_and_verifies() {
    for w in [
        "ycsb-a",
        "ycsb-b",
        "ycsb-c",
        "ycsb-d",
        "ycsb-e",
        "ycsb-f",
        "insert-only",
        "update-only",
    ] {
        let j = bench_json(&[
            "--workload",
            w,
            "--dist",
            "lognormal",
            "-n",
            "3000",
            "--ops",
            "2000",
        ]);
        assert_eq!(j["workload"], w);
        assert_eq!(j["keys"], 3000);
        assert_eq!(j["ops"], 2000);
        assert_eq!(j["verified"], true, "{w}");
        for kind in ["get", "insert", "update", "delete", "scan"] {
            assert!(j["rtt_per_op"][kind].is_number(), "{w}: rtt_per_op.{kind}");
            assert!(
                j["bytes_per_op"][kind].is_number(),
                "{w}: bytes_per_op.{kind}"
            );
        }
        assert!(j["raw_read_mops"].as_f64().unwrap() > 0.0);
        assert!(j["model_bytes"].as_u64().unwrap() > 0);
        assert_eq!(j["failed_ops"], 0, "{w}: nothing injected");
        assert_eq!(j["locks_held_end"], 0, "{w}");
        space(&j, w);
    }
}

#[test]
fn every_workload_runs_and_verifies_with_values_out_of_line() {
    for (w, n) in [
        ("ycsb-a", "2000"),
        ("ycsb-e", "2000"),
        ("ycsb-f", "2000"),
        ("insert-only", "2000"),
        ("churn", "2000"),
        ("delete-only", "2000"),
    ] {
        let j = bench_json(&[
            "--workload",
            w,
            "--dist",
            "lognormal",
            "-n",
            n,
            "--ops",
            "1500",
            "--value-size",
            "9..3000",
        ]);
        assert_eq!(j["verified"], true, "{w}: {j}");
        let total: f64 = ["get", "insert", "update", "delete", "scan"]
            .iter()
            .map(|k| j["value_bytes_per_op"][k].as_f64().unwrap())
            .sum();
        if w != "delete-only" {
            assert!(total > 9.0, "{w}: values moved: {j}");
        }
        assert_eq!(j["locks_held_end"], 0, "{w}");
    }
    // Updates of large values reuse the blocks they free.
    let j = bench_json(&[
        "--workload",
        "update-only",
        "--dist",
        "lognormal",
        "-n",
        "2000",
        "--ops",
        "20000",
        "--value-size",
        "4096",
    ]);
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["value_bytes_per_op"]["update"], 4096.0, "{j}");
    let (start, end) = (
        j["pool_bytes_start"].as_f64().unwrap(),
        j["pool_bytes_end"].as_f64().unwrap(),
    );
    // 20,000 updates of 4 KiB wrote 80 MB; the pool holds 2,000 values.
    assert!(end <= start + 40e6, "space grew {start} -> {end}: {j}");
}

#[test]
fn operations_in_flight_together_verify_and_share_round_trips() {
    for (w, extra) in [
        ("ycsb-c", vec![]),
        ("ycsb-a", vec![]),
        ("ycsb-b", vec!["--value-size", "9..2000"]),
        ("ycsb-a", vec!["--value-size", "64"]),
        ("ycsb-e", vec![]),
        ("ycsb-e", vec!["--value-size", "9..200", "--memnodes", "3"]),
        ("ycsb-f", vec![]),
        ("ycsb-f", vec!["--value-size", "9..200", "--unordered"]),
    ] {
        let mut a = vec![
            "--workload",
            w,
            "--dist",
            "lognormal",
            "-n",
            "3000",
            "--ops",
            "3000",
            "--depth",
            "8",
        ];
        a.extend(extra.iter().copied());
        let j = bench_json(&a);
        assert_eq!(j["verified"], true, "{w}: {j}");
        if w == "ycsb-e" {
            // Scans share rounds (`scan_many`), as gets share batches.
            let scan = j["rtt_per_op"]["scan"].as_f64().unwrap();
            assert!(scan < 1.0, "{w} {extra:?}: scans share rounds: {j}");
            continue;
        }
        // Alone, a get takes one round (u64 values) or two (an out-of-line
        // value: the leaf, then the block). Shared, a call's gets take
        // fewer — though every round of the call counts, the chunk claims
        // and free-stack pops of its writes' value space included (more of
        // them since a client's chunks grow only with what it claims:
        // 0.92-1.05 per get for ycsb-f's values on an unordered fabric).
        let get = j["rtt_per_op"]["get"].as_f64().unwrap();
        let bound = if extra.contains(&"--value-size") {
            1.5
        } else {
            1.0
        };
        assert!(get < bound, "{w} {extra:?}: gets share batches: {j}");
        if w == "ycsb-a" || w == "ycsb-f" {
            // Updates are pipelined with the gets (u64 values, and long
            // ones: `run_many_values`; a read-modify-write's get and
            // update too).
            let update = j["rtt_per_op"]["update"].as_f64().unwrap();
            assert!(update < 2.0, "{w}: updates share batches: {j}");
        }
    }
}

/// The space figures of a local run: bytes in use before and after, live
/// leaves (at least the one an empty store has), free leaves.
fn space(j: &serde_json::Value, what: &str) {
    for key in ["pool_bytes_start", "pool_bytes_end", "leaves_live"] {
        assert!(j[key].as_u64().is_some_and(|v| v > 0), "{what}: {key}: {j}");
    }
    assert!(j["leaves_free"].is_u64(), "{what}: {j}");
}

#[test]
fn append_churn_and_delete_only_run_and_verify() {
    for (w, ops) in [
        ("append", "6000"),
        ("churn", "6000"),
        ("delete-only", "3000"),
    ] {
        let j = bench_json(&[
            "--workload",
            w,
            "--dist",
            "lognormal",
            "-n",
            "3000",
            "--ops",
            ops,
        ]);
        assert_eq!(j["workload"], w);
        assert_eq!(
            j["keys"], 3000,
            "{w}: everything loaded (churn's inserts held out)"
        );
        assert_eq!(j["verified"], true, "{w}: {j}");
        assert_eq!(j["locks_held_end"], 0, "{w}");
        space(&j, w);
        let rtt = &j["rtt_per_op"];
        match w {
            "append" => assert!(rtt["insert"].as_f64().unwrap() >= 1.0, "{j}"),
            "churn" => {
                assert!(rtt["insert"].as_f64().unwrap() >= 1.0, "{j}");
                assert!(rtt["delete"].as_f64().unwrap() >= 1.0, "{j}");
            }
            _ => {
                assert!(rtt["delete"].as_f64().unwrap() >= 1.0, "{j}");
                assert_eq!(rtt["insert"], 0.0, "{j}");
            }
        }
    }
    // Deleting every loaded key; one more is refused.
    let j = bench_json(&[
        "--workload",
        "delete-only",
        "--dist",
        "uniform",
        "-n",
        "2000",
        "--ops",
        "2000",
    ]);
    assert_eq!(j["verified"], true, "{j}");
    let out = rolex(&[
        "bench",
        "--workload",
        "delete-only",
        "--dist",
        "uniform",
        "-n",
        "2000",
        "--ops",
        "2001",
        "--threads",
        "2",
    ]);
    assert_fails(&out, "deletes 2001 loaded keys but only 2000");
}

#[test]
fn an_empty_store_grows_by_insert_only_and_append() {
    for w in ["insert-only", "append"] {
        let j = bench_json(&[
            "--workload",
            w,
            "--dist",
            "uniform",
            "-n",
            "0",
            "--ops",
            "4000",
        ]);
        assert_eq!(j["keys"], 0, "{w}");
        assert_eq!(j["verified"], true, "{w}: {j}");
        space(&j, w);
        assert!(
            j["pool_bytes_end"].as_u64() > j["pool_bytes_start"].as_u64(),
            "{w}: the store grew: {j}"
        );
    }
    // The workloads that need loaded keys refuse an empty store.
    for w in ["ycsb-a", "ycsb-d", "churn", "delete-only"] {
        let out = rolex(&[
            "bench",
            "--workload",
            w,
            "--dist",
            "uniform",
            "-n",
            "0",
            "--ops",
            "10",
            "--threads",
            "1",
        ]);
        assert_fails(&out, "-n 0 starts an empty store");
    }
}

#[test]
fn a_store_grown_ten_times_by_appends_still_gets_in_one_round_trip() {
    let j = bench_json(&[
        "--workload",
        "ycsb-c",
        "--dist",
        "lognormal",
        "-n",
        "2000",
        "--grow",
        "20000",
        "--ops",
        "20000",
    ]);
    assert_eq!(j["keys"], 22000, "{j}");
    assert_eq!(j["verified"], true, "{j}");
    let rtt = j["rtt_per_op"]["get"].as_f64().unwrap();
    // A view read again after growth costs a round trip, once per model.
    assert!((1.0..1.05).contains(&rtt), "{j}");
    let out = rolex(&[
        "bench",
        "--workload",
        "append",
        "--dist",
        "uniform",
        "-n",
        "100",
        "--grow",
        "10",
        "--ops",
        "10",
        "--threads",
        "1",
    ]);
    assert_fails(&out, "--grow appends above the loaded range");
}

#[test]
fn churn_and_delete_only_with_injected_failures_still_verify() {
    for w in ["churn", "delete-only"] {
        let j = bench_json(&[
            "--workload",
            w,
            "--dist",
            "lognormal",
            "-n",
            "3000",
            "--ops",
            "3000",
            "--inject-failures",
            "0.005",
        ]);
        assert_eq!(j["verified"], true, "{w}: {j}");
        assert!(j["failed_ops"].as_u64().unwrap() > 0, "{w}: {j}");
    }
}

/// Writes torn by a broken link (`--inject-torn`), alone and beside
/// other faults, on both fabrics: every written key verifies (a torn leaf
/// left behind would fail its gets and the final check) and no chain is
/// left locked.
#[test]
fn torn_writes_still_verify_and_leave_no_lock() {
    for extra in [
        &["--inject-torn", "0.02"][..],
        &["--inject-torn", "0.01", "--inject-failures", "0.005"][..],
        &["--inject-torn", "0.02", "--unordered"][..],
    ] {
        let mut a = vec![
            "--workload",
            "ycsb-a",
            "--dist",
            "lognormal",
            "-n",
            "3000",
            "--ops",
            "3000",
            "--leaf-slots",
            "4",
        ];
        a.extend_from_slice(extra);
        let j = bench_json(&a);
        assert_eq!(j["verified"], true, "{extra:?}: {j}");
        // A write torn and written again at once succeeds: only the other
        // faults surely fail operations.
        if extra.contains(&"--inject-failures") {
            assert!(j["failed_ops"].as_u64().unwrap() > 0, "{extra:?}: {j}");
        }
        assert_eq!(j["locks_held_end"], 0, "{extra:?}: {j}");
        // Ordered: leaf writes go out behind their redo copies.
        let copied = j["redo_logged"].as_u64().unwrap();
        assert_eq!(
            copied > 0,
            !extra.contains(&"--unordered"),
            "{extra:?}: {j}"
        );
    }
}

/// `--redo-blocks 0` runs the store without a redo log: no leaf write is
/// copied, an update moves fewer bytes, and the run verifies.
#[test]
fn the_redo_log_can_be_turned_off() {
    let run = |blocks: &str| {
        bench_json(&[
            "--workload",
            "ycsb-a",
            "--dist",
            "uniform",
            "-n",
            "3000",
            "--ops",
            "2000",
            "--redo-blocks",
            blocks,
        ])
    };
    let (on, off) = (run("64"), run("0"));
    assert!(on["redo_logged"].as_u64().unwrap() > 0, "{on}");
    assert_eq!(off["redo_logged"], 0, "{off}");
    assert_eq!(off["redo_unlogged"], 0, "{off}");
    let bytes = |j: &serde_json::Value| j["bytes_per_op"]["update"].as_f64().unwrap();
    assert!(bytes(&off) < bytes(&on), "{on} {off}");
    assert_eq!(off["verified"], true);
}

/// Connecting reads every model record; a store of many models under
/// injected faults connects anyway: a try that met a fault is made again
/// with faults drawn from another seed. (Each try used to draw the same
/// faults from the same seed and meet the same one: these two seeds
/// could not connect at all.)
#[test]
fn a_store_of_many_models_connects_under_injected_failures() {
    for seed in ["1", "2"] {
        let j = bench_json(&[
            "--workload",
            "ycsb-c",
            "--dist",
            "lognormal",
            "-n",
            "50000",
            "--ops",
            "1000",
            "--inject-failures",
            "0.01",
            "--seed",
            seed,
        ]);
        assert_eq!(j["verified"], true, "seed {seed}: {j}");
    }
}

/// `--grow` under injected faults: a grow insert that failed, even after
/// it may have taken effect, is made again (it sets the key to its load
/// value, so a second try changes nothing); the run then verifies over
/// every grown key. (A grow used to stop at its first write fault.)
#[test]
fn a_store_grows_under_injected_failures() {
    let j = bench_json(&[
        "--workload",
        "ycsb-a",
        "--dist",
        "lognormal",
        "-n",
        "2000",
        "--grow",
        "20000",
        "--ops",
        "2000",
        "--inject-failures",
        "0.01",
    ]);
    assert_eq!(j["verified"], true, "{j}");
    assert_eq!(j["keys"], 22000, "{j}");
}

/// The small fault-injected run the tests below make: ycsb-a, each
/// operation the compute nodes post failing with probability 0.005, on
/// the ordered loopback fabric or with `extra`.
fn injected_run(extra: &[&str]) -> serde_json::Value {
    let p = "0.005";
    let mut args = vec![
        "--workload",
        "ycsb-a",
        "--dist",
        "lognormal",
        "-n",
        "2000",
        "--ops",
        "5000",
        "--inject-failures",
        p,
    ];
    args.extend_from_slice(extra);
    let j = bench_json(&args);
    println!(
        "injected: p = {p} per posted operation (ycsb-a, 2000 keys, 5000 ops, 2 threads, \
         {extra:?}); found: {} failed operations, {} chains locked at the end, verified {}",
        j["failed_ops"], j["locks_held_end"], j["verified"]
    );
    j
}

#[test]
fn injected_failures_are_counted_and_the_run_still_verifies() {
    for extra in [
        &[][..],
        &["--unordered"],
        &["--depth", "8"],
        &["--unordered", "--depth", "8"],
    ] {
        let j = injected_run(extra);
        assert_eq!(j["verified"], true, "{extra:?}");
        assert!(j["failed_ops"].as_u64().unwrap() > 0, "{extra:?}: {j}");
        assert!(j["locks_held_end"].is_u64(), "{extra:?}: {j}");
    }
}

/// Scans read together (`--depth 8`, ycsb-e), on one memory node and
/// across two, and read-modify-writes in flight together (ycsb-f), under
/// injected faults: failed calls are counted, every answer that came back
/// verifies, no chain stays locked.
#[test]
fn scans_and_read_modify_writes_in_flight_under_injected_failures_verify() {
    for (w, extra) in [
        ("ycsb-e", &[][..]),
        ("ycsb-e", &["--memnodes", "2"]),
        ("ycsb-f", &[]),
        ("ycsb-f", &["--unordered"]),
    ] {
        let mut args = vec![
            "--workload",
            w,
            "--dist",
            "lognormal",
            "-n",
            "2000",
            "--ops",
            "3000",
            "--depth",
            "8",
            "--inject-failures",
            "0.005",
        ];
        args.extend_from_slice(extra);
        let j = bench_json(&args);
        assert_eq!(j["verified"], true, "{w} {extra:?}: {j}");
        assert!(j["failed_ops"].as_u64().unwrap() > 0, "{w} {extra:?}: {j}");
        assert_eq!(j["locks_held_end"], 0, "{w} {extra:?}: {j}");
    }
}

#[test]
fn injected_failures_leave_no_chain_locked() {
    for extra in [
        &[][..],
        &["--unordered"],
        &["--depth", "8"],
        &["--unordered", "--depth", "8"],
    ] {
        let j = injected_run(extra);
        assert_eq!(j["locks_held_end"], 0, "{extra:?}: {j}");
    }
}

/// Several memory nodes in one process: every workload kind routes by
/// key and verifies (ycsb-e's scans cross the nodes' boundaries), the
/// nodes hold equal shares of the keys, and a get is still one round trip.
#[test]
fn several_memory_nodes_route_by_key_and_verify() {
    let one = bench_json(&[
        "--workload",
        "ycsb-c",
        "--dist",
        "uniform",
        "-n",
        "3000",
        "--ops",
        "500",
    ]);
    assert_eq!(one["memnodes"], 1);
    assert_eq!(one["per_memnode_keys"], serde_json::json!([3000]));
    assert_eq!(one["per_memnode_ops"], serde_json::json!([500]));
    for (w, values) in [
        ("ycsb-e", "8"),
        ("ycsb-a", "8"),
        ("ycsb-e", "8..300"),
        ("churn", "8"),
    ] {
        let j = bench_json(&[
            "--workload",
            w,
            "--dist",
            "lognormal",
            "-n",
            "3000",
            "--ops",
            "3000",
            "--memnodes",
            "3",
            "--value-size",
            values,
        ]);
        assert_eq!(j["verified"], true, "{w} {values}");
        assert_eq!(j["memnodes"], 3);
        let keys: Vec<u64> = j["per_memnode_keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_u64().unwrap())
            .collect();
        assert_eq!(keys, vec![1000, 1000, 1000], "{w}: quantile ranges");
        let ops = j["per_memnode_ops"].as_array().unwrap();
        assert_eq!(ops.len(), 3);
        assert!(
            ops.iter().all(|o| o.as_u64().unwrap() > 0),
            "{w}: every node served: {j}"
        );
        if w == "ycsb-a" {
            // One round trip, but for the rare get whose leaf read raced
            // with another thread's update of it (torn: read again alone),
            // which a loaded machine makes likelier (1.001 seen once in
            // `./tools/test`).
            let rtt = j["rtt_per_op"]["get"].as_f64().unwrap();
            assert!((1.0..=1.01).contains(&rtt), "{w}: get rtt {rtt}");
        }
        assert_eq!(j["locks_held_end"], 0, "{w}");
        space(&j, w);
    }
}

#[test]
fn read_only_gets_take_one_round_trip() {
    let j = bench_json(&[
        "--workload",
        "ycsb-c",
        "--dist",
        "uniform",
        "-n",
        "5000",
        "--ops",
        "3000",
        "--clients",
        "2",
    ]);
    assert_eq!(j["rtt_per_op"]["get"], 1.0);
    assert_eq!(j["retrains"], 0);
}

#[test]
fn keys_file_and_unordered_fabric() {
    let path = tmp("keys.sosd");
    let keys: Vec<u64> = (0..4000u64).map(|i| i * 1000 + 7).collect();
    std::fs::write(&path, sosd(&keys)).unwrap();
    let p = path.to_str().unwrap();
    // Inserts are held out of the file: 4000 − 1000 keys are loaded.
    let j = bench_json(&[
        "--workload",
        "insert-only",
        "--keys",
        p,
        "--ops",
        "1000",
        "--unordered",
        "--leaf-slots",
        "8",
        "--fill",
        "1.0",
    ]);
    assert_eq!(j["keys"], 3000);
    assert_eq!(j["verified"], true);
    // Too many inserts for the file.
    let out = rolex(&[
        "bench",
        "--workload",
        "insert-only",
        "--keys",
        p,
        "--ops",
        "4000",
        "--threads",
        "1",
    ]);
    assert_fails(&out, "inserts");
    std::fs::remove_file(&path).ok();
}

#[test]
fn bad_arguments_are_refused() {
    let base = |extra: &[&str]| {
        let mut a = vec!["bench", "--dist", "uniform", "-n", "100"];
        a.extend_from_slice(extra);
        rolex(&a)
    };
    let w = ["--workload", "ycsb-a"];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--ops", "0", "--threads", "1"], "--ops"),
        (vec!["--ops", "10", "--threads", "0"], "--threads"),
        (
            vec!["--ops", "10", "--threads", "1", "--fill", "0"],
            "--fill",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--fill", "1.5"],
            "--fill",
        ),
        (vec!["--ops", "10", "--threads", "1", "--zipf", "1"], "θ"),
        (
            vec!["--ops", "10", "--threads", "1", "--value-size", "4"],
            "below 8 bytes",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--depth", "0"],
            "--depth",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--value-size", "100..10"],
            "empty",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--value-size", "1k"],
            "byte count",
        ),
        (vec!["--ops", "10", "--threads", "1", "--zipf", "0"], "θ"),
        (vec!["--ops", "10", "--threads", "1", "--zipf", "-0.5"], "θ"),
        (
            vec!["--ops", "10", "--threads", "1", "--clients", "2"],
            "--clients",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--rtt-us", "-1"],
            "--rtt-us",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--leaf-slots", "1"],
            "--leaf-slots",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--inject-failures", "1.5"],
            "--inject-failures",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--inject-failures", "-0.1"],
            "--inject-failures",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--inject-torn", "2"],
            "--inject-torn",
        ),
        (
            vec![
                "--ops",
                "10",
                "--threads",
                "1",
                "--inject-torn",
                "0.6",
                "--inject-failures",
                "0.6",
            ],
            "add up to more than 1",
        ),
        (
            vec!["--ops", "10", "--threads", "1", "--memnodes", "0"],
            "--memnodes",
        ),
        (
            vec![
                "--ops",
                "10",
                "--fabric",
                "libfabric:tcp",
                "--memnode",
                "127.0.0.1:1",
                "--redo-blocks",
                "0",
            ],
            "--redo-blocks",
        ),
        (
            vec![
                "--ops",
                "10",
                "--threads",
                "1",
                "--memnodes",
                "2",
                "--fabric",
                "libfabric:tcp",
                "--memnode",
                "127.0.0.1:1",
            ],
            "--memnode A,B,C",
        ),
        (
            vec![
                "--ops",
                "10",
                "--threads",
                "1",
                "--inject-failures",
                "0.1",
                "--fabric",
                "libfabric:tcp",
                "--memnode",
                "127.0.0.1:1",
            ],
            "--inject-failures",
        ),
    ];
    for (extra, what) in cases {
        let mut a = w.to_vec();
        a.extend(extra);
        assert_fails(&base(&a), what);
    }
    assert_fails(
        &base(&["--workload", "ycsb-z", "--ops", "1", "--threads", "1"]),
        "ycsb-z",
    );
    assert_fails(
        &rolex(&[
            "bench",
            "--workload",
            "ycsb-c",
            "--ops",
            "1",
            "--threads",
            "1",
        ]),
        "--keys",
    );
}
