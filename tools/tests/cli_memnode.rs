//! `rolex memnode`'s measuring run as a user starts it: the agent's pacing
//! flags are accepted at 0 (look and walk at every poll) and at long
//! periods (1 s, 60 s: longer than the run), and the run still checks
//! every inserted key; values outside their ranges or not numbers are
//! refused naming the flag, never with a panic. That the
//! agent then paces itself by them is not observable from here: the flags
//! go into `MemoryNodeConfig` field for field, and `rolex-memnode`'s unit
//! test `the_agent_gets_every_knob_of_the_nodes_config` checks that the
//! config reaches the agent.

mod common;

use common::{assert_fails, rolex};

#[test]
fn the_agents_pacing_flags_run_at_their_extremes_and_every_key_reads_back() {
    for (scan, sweep) in [("0", "0"), ("1000000", "60000")] {
        let out = rolex(&[
            "memnode",
            "--dist",
            "lognormal",
            "--n",
            "20000",
            "--duration",
            "0.3",
            "--rounds",
            "1",
            "--slt-scan-every-us",
            scan,
            "--sweep-every-ms",
            sweep,
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "--slt-scan-every-us {scan} --sweep-every-ms {sweep}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("checked: every inserted key reads back"),
            "{stdout}"
        );
    }
}

#[test]
fn bad_pacing_values_are_refused_naming_the_flag() {
    for (flag, value) in [
        ("--slt-scan-every-us", "-1"),
        ("--slt-scan-every-us", "60000001"),
        ("--sweep-every-ms", "soon"),
        ("--sweep-every-ms", "3600001"),
    ] {
        let out = rolex(&["memnode", "--n", "1000", flag, value]);
        assert_fails(&out, flag);
    }
}
