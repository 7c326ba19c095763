//! The charts as a user asks for them: `rolex bench --plot` and `rolex
//! te-bench --sweep --plot` write an SVG with a series for every kind or
//! line that ran (and none for what did not), titled panels and labelled
//! axes; the sweep prints one line (or JSON object) per size with the
//! keys of a single run; a bad `--plot` fails before measuring. The
//! figures themselves are never checked: timing is not behaviour.

mod common;

use common::{assert_fails, rolex, tmp};

/// The SVG at `path`, after checking it is one.
fn svg(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).expect("the plot was written");
    assert!(text.trim_start().starts_with("<svg"), "not an SVG");
    assert!(text.trim_end().ends_with("</svg>"), "truncated SVG");
    text
}

/// Every `<text>` element's content, trimmed.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = &t[t.find('>')? + 1..];
            Some(body[..body.find("</text>")?].trim().to_string())
        })
        .collect()
}

/// The number of points of every `<polyline>` drawn in the series colour
/// `rgb` (`plotters` writes `#RRGGBB`, upper case): a series, or its
/// legend mark (2 points).
fn lines_in(svg: &str, rgb: &str) -> Vec<usize> {
    let stroke = format!("stroke=\"{rgb}\"");
    svg.split("<polyline")
        .skip(1)
        .map(|l| &l[..l.find("/>").unwrap_or(l.len())])
        .filter(|l| l.contains(&stroke))
        .map(|l| {
            let at = l.find("points=\"").expect("points") + "points=\"".len();
            let end = at + l[at..].find('"').expect("closing quote");
            l[at..end].split_whitespace().count()
        })
        .collect()
}

/// The first two series colours of `tools/src/plot.rs`.
const FIRST: &str = "#1F77B4";
const SECOND: &str = "#FF7F0E";

/// Asserts that `t` holds every one of `want`.
fn assert_texts(t: &[String], want: &[&str]) {
    for w in want {
        assert!(t.iter().any(|t| t == w), "the chart lacks {w:?}: {t:?}");
    }
}

#[test]
fn bench_plot_has_a_cdf_per_kind_that_ran_and_the_throughput() {
    let path = tmp("bench.svg");
    let out = rolex(&[
        "bench",
        "--workload",
        "ycsb-a",
        "--dist",
        "uniform",
        "-n",
        "3000",
        "--ops",
        "2000",
        "--threads",
        "2",
        "--json",
        "--plot",
        path.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // --plot leaves the JSON line as it was: one line, the same 30 keys.
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let j: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(j.as_object().unwrap().len(), 30);
    assert_eq!(j["verified"], true);

    let s = svg(&path);
    let t = texts(&s);
    assert_texts(
        &t,
        &[
            "latency CDF per operation kind",
            "latency (µs, log scale)",
            "fraction of operations ≤ latency",
            "throughput over the run",
            "time since the run began (s)",
            "operations per second",
        ],
    );
    assert!(t
        .iter()
        .any(|t| t.starts_with("all operations (2000), per ")));
    // YCSB A is gets and updates: a curve each, none for other kinds.
    let ops = |kind: &str| -> u64 {
        let label = t
            .iter()
            .find_map(|t| t.strip_prefix(&format!("{kind} (")))
            .unwrap_or_else(|| panic!("no {kind} series: {t:?}"));
        label.trim_end_matches(" ops)").parse().unwrap()
    };
    assert_eq!(ops("get") + ops("update"), 2000);
    for absent in ["insert (", "scan (", "read-modify-write ("] {
        assert!(!t.iter().any(|t| t.starts_with(absent)), "{absent}");
    }
    // In the first colour the get CDF and the throughput, in the second
    // the update CDF, each with its legend mark (a short run may have one
    // throughput interval: 2 points, like a mark).
    assert_eq!(lines_in(&s, FIRST).len(), 4);
    assert_eq!(lines_in(&s, SECOND).len(), 2);
    std::fs::remove_file(&path).ok();
}

#[test]
fn te_bench_sweep_prints_every_size_and_plots_bandwidth_and_latency() {
    let path = tmp("sweep.svg");
    let out = rolex(&[
        "te-bench",
        "--sweep",
        "--count",
        "20",
        "--json",
        "--plot",
        path.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON object per line"))
        .collect();
    let sizes: Vec<u64> = lines.iter().map(|j| j["size"].as_u64().unwrap()).collect();
    assert_eq!(
        sizes,
        [64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304]
    );
    for j in &lines {
        assert_eq!(j["op"], "write");
        assert_eq!(j["count"], 20);
        assert_eq!(j["errors"], 0);
        for key in ["gbps", "mops", "p50_us", "p99_us", "memcpy_gbps"] {
            assert!(j[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {j}");
        }
        // Counters are each size's own: 20 writes of that size, and the
        // latency phase's 20 more.
        assert_eq!(j["bytes_written"], 40 * j["size"].as_u64().unwrap());
    }

    let s = svg(&path);
    assert_texts(
        &texts(&s),
        &[
            "bandwidth against size",
            "bandwidth (Gbit/s, log scale)",
            "latency against size",
            "p50 latency (µs, log scale)",
            "bytes per operation (log scale)",
            "te-bench write",
            "te-bench write, one at a time",
            "memcpy, same sizes",
            "64 B",
            "4 MiB",
        ],
    );
    // Bandwidth and latency in the first colour, memcpy in the second: a
    // point per size each.
    let first = lines_in(&s, FIRST);
    assert_eq!(first.iter().filter(|&&n| n == 9).count(), 2, "{first:?}");
    assert!(lines_in(&s, SECOND).contains(&9));
    std::fs::remove_file(&path).ok();

    // The table: a header, then a row per size.
    let out = rolex(&["te-bench", "--sweep", "--op", "read", "--count", "5"]);
    assert!(out.status.success());
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("te-bench read sweep"), "{stdout}");
    for size in ["64 B", "256 B", "1 KiB", "64 KiB", "1 MiB", "4 MiB"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(size)),
            "no row for {size}: {stdout}"
        );
    }
}

#[test]
fn bad_plot_arguments_fail_before_measuring() {
    let unwritable = "/nonexistent-rolex-dir/x.svg";
    assert_fails(
        &rolex(&["te-bench", "--sweep", "--plot", unwritable]),
        unwritable,
    );
    let out = rolex(&[
        "bench",
        "--workload",
        "ycsb-c",
        "--dist",
        "uniform",
        "-n",
        "100",
        "--ops",
        "10",
        "--threads",
        "1",
        "--plot",
        unwritable,
    ]);
    assert_fails(&out, unwritable);
    assert!(out.stdout.is_empty(), "it ran before failing");
    let single = ["te-bench", "--op", "write", "--size", "64"];
    assert_fails(
        &rolex(&[&single[..], &["--plot", "x.svg"]].concat()),
        "--sweep",
    );
    assert_fails(&rolex(&["te-bench", "--sweep", "--op", "faa"]), "--sweep");
    assert_fails(&rolex(&["te-bench", "--sweep", "--size", "64"]), "--size");
}
