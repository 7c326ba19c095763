//! `rolex plr` as a user runs it: good input gives the promised JSON line,
//! bad input gives one clear error line and a non-zero exit, never a panic.

mod common;

use common::{assert_fails, rolex, sosd, tmp};
use std::process::Output;

#[test]
fn json_line_has_every_promised_field_and_error_within_epsilon() {
    let out = rolex(&[
        "plr",
        "--dist",
        "lognormal",
        "--n",
        "20000",
        "--epsilon",
        "8",
        "--runs",
        "1",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["keys"], 20000);
    assert_eq!(v["epsilon"], 8);
    let levels = v["levels"].as_array().unwrap();
    assert_eq!(levels.first().unwrap(), &v["segments"]);
    assert_eq!(levels.last().unwrap(), 1);
    // ε and `max_error` are in leaves. The models bound |predict − leaf| by
    // ε at the fences they are trained on; a key between two fences may be
    // predicted up to one leaf further (the δ = 1 window of
    // `rolex_core::model`), so ε + 1 is what the help promises.
    assert!(v["max_error"].as_u64().unwrap() <= 8 + 1);
    assert!(v["model_bytes"].as_u64().unwrap() > 0);
    assert!(v["train_ns_per_key"].as_f64().unwrap() > 0.0);
}

#[test]
fn written_keys_train_like_generated_ones() {
    let path = tmp("written.sosd");
    let p = path.to_str().unwrap();
    let out = rolex(&[
        "plr",
        "--dist",
        "normal",
        "--n",
        "5000",
        "--seed",
        "9",
        "--write-keys",
        p,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 + 5000 * 8);
    let from_file = rolex(&["plr", "--keys", p, "--json", "--runs", "1"]);
    let generated = rolex(&[
        "plr", "--dist", "normal", "--n", "5000", "--seed", "9", "--json", "--runs", "1",
    ]);
    let seg = |o: &Output| {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (v["segments"].clone(), v["max_error"].clone())
    };
    assert_eq!(seg(&from_file), seg(&generated));
    std::fs::remove_file(path).unwrap();
}

#[test]
fn bad_files_are_refused_with_the_reason() {
    let path = tmp("bad.sosd");
    let p = path.to_str().unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![1, 2, 3], "truncated"),
        (sosd(&[1, 2, 3])[..20].to_vec(), "truncated"),
        ([sosd(&[1, 2]), vec![0]].concat(), "oversized"),
        (sosd(&[5, 4]), "unsorted"),
        (sosd(&[5, 5]), "duplicate"),
        (sosd(&[]), "no keys"),
    ];
    for (bytes, what) in cases {
        std::fs::write(&path, bytes).unwrap();
        assert_fails(&rolex(&["plr", "--keys", p]), what);
    }
    std::fs::remove_file(&path).unwrap();
    assert_fails(
        &rolex(&["plr", "--keys", "/nonexistent/keys.sosd"]),
        "No such file",
    );
}

#[test]
fn bad_arguments_are_refused() {
    assert_fails(&rolex(&["plr"]), "--keys");
    assert_fails(&rolex(&["plr", "--dist", "zipf", "--n", "10"]), "zipf");
    assert_fails(&rolex(&["plr", "--dist", "uniform"]), "--n");
    assert_fails(
        &rolex(&["plr", "--dist", "uniform", "--n", "0"]),
        "at least one key",
    );
    assert_fails(
        &rolex(&["plr", "--dist", "uniform", "--n", "10", "--epsilon=-1"]),
        "epsilon",
    );
    assert_fails(
        &rolex(&[
            "plr",
            "--dist",
            "uniform",
            "--n",
            "10",
            "--epsilon",
            "18446744073709551615",
        ]),
        "exceeds the maximum",
    );
}
