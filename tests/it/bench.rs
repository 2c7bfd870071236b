//! A small run of `history-dev bench` as a smoke test: it runs every phase and prints its
//! RESULT line. No timing is asserted here; the numbers live in docs/benchmarks.md.

use std::collections::HashMap;
use std::process::Command;

use crate::common::TestDb;

#[test]
fn a_small_benchmark_runs_every_phase_and_prints_its_result_line() {
    let runtime = actix_rt::System::new();
    let db = runtime.block_on(TestDb::create());
    let output = Command::new(history_devkit::workspace_binary("history-dev"))
        .args([
            "bench",
            "--events",
            "20000",
            "--partitions",
            "4",
            "--naive-events",
            "100",
            "--latency-rate",
            "500",
            "--latency-seconds",
            "2",
        ])
        .env("HISTORY__DATABASE__URL", db.url())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("database verified: yes"), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("RESULT "), "{stdout}");
    let fields: HashMap<&str, f64> = last
        .split_whitespace()
        .skip(1)
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            Some((key, value.parse().ok()?))
        })
        .collect();
    for key in [
        "events",
        "service_eps",
        "ceiling_eps",
        "naive_eps",
        "ceiling_ratio",
        "naive_ratio",
        "peak_rss_mb",
        "p99_ms",
        "server_ceiling_eps",
        "server_ratio",
        "pg_us_per_event",
        "service_us_per_event",
        "server_pg_us_per_event",
        "consume_us_per_event",
        "decode_us_per_event",
    ] {
        assert!(fields.get(key).is_some_and(|v| *v > 0.0), "{key} in {last}");
    }
    assert_eq!(fields["events"], 20000.0);
}
