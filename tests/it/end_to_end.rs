//! End to end: the real service against librdkafka's mock cluster (a Kafka-protocol broker over
//! TCP), real producers, and PostgreSQL. Positions are read by a separate client.

use std::io::{BufRead, BufReader, Write};
use std::time::Duration;

use history_devkit::process::{Process, Signal};
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, WorkloadSpec, distinct_events};

use crate::common::TestDb;

/// Good events with 10% duplicates (some on the other partition) over two partitions.
fn events_with_duplicates(
    records: usize,
    prefix: &str,
    tickets: u32,
    seed: u64,
) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records,
        duplicates: 0.1,
        poison: 0.0,
        partitions: 2,
        id_prefix: prefix.into(),
        tickets,
        max_payload_bytes: 65536,
        seed,
    })
}

#[actix_rt::test]
async fn the_service_records_the_seed_scenario_and_commits_the_group_to_the_end() {
    let app = TestApp::prepare(|o| o.partitions = 3).await;
    let delivered = app.produce(&workload::seed_records()).await;
    assert!(
        delivered
            .iter()
            .all(|d| d.partition == delivered[0].partition),
        "one key, one partition"
    );

    let report = app
        .run_in_process(async {
            app.wait_committed(Duration::from_secs(30)).await;
        })
        .await
        .unwrap();

    assert_eq!(app.db.count("inbox").await, 2);
    assert_eq!(app.db.count("history_events").await, 2);
    assert_eq!((report.stats.applied, report.stats.already_applied), (2, 1));
    let committed = app.wait_committed(Duration::from_secs(5)).await;
    assert_eq!(committed[delivered[0].partition as usize], Some(3));
}

#[actix_rt::test]
async fn a_crash_before_the_offset_commit_rereads_the_records_and_writes_no_duplicate() {
    // First run: commits nothing (the periodic commit is an hour away), and is killed once the
    // rows are in the database: a crash after the DB commit, before the offset commit.
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "3600000");
    })
    .await;
    let records = events_with_duplicates(300, "crash", 20, 11);
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    app.wait_rows(distinct, Duration::from_secs(30)).await;
    assert_eq!(app.stop_with(Signal::SIGKILL), None, "killed by the signal");
    assert_eq!(
        app.committed().await,
        vec![None, None],
        "nothing committed before the crash"
    );

    // Second run: re-reads everything, finds every event already applied.
    app.set_env("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "100");
    app.start();
    app.wait_committed(Duration::from_secs(60)).await;
    let metrics = app.metrics().await;
    assert_eq!(app.db.count("history_events").await, distinct);
    assert_eq!(app.db.count("inbox").await, distinct);
    assert_eq!(
        metrics.get("history_events_total{outcome=\"applied\"}"),
        Some(0.0),
        "nothing newly applied (the counter starts at 0): {metrics}"
    );
    assert_eq!(
        metrics.get("history_events_total{outcome=\"already_applied\"}"),
        Some(records.len() as f64)
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn run_against_dev_kafka_consumes_what_kcat_produced_and_stops_cleanly_on_sigterm() {
    let mut kafka = Process::command(history_devkit::workspace_binary("history-dev"))
        .args(["dev-kafka", "--partitions", "2"])
        .stdout_piped()
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(kafka.take_stdout().unwrap());
    let mut first_line = String::new();
    stdout.read_line(&mut first_line).unwrap();
    let brokers = first_line
        .trim()
        .strip_prefix("bootstrap.servers=")
        .unwrap_or_else(|| panic!("first line was {first_line:?}"))
        .to_owned();
    let mut app = TestApp::prepare(|o| {
        o.external_brokers = Some(brokers.clone());
        // dev-kafka's default topic.
        o.topic = "tickets.status.v1".into();
        o.partitions = 2;
    })
    .await;

    let payloads: Vec<String> = workload::seed_records()
        .into_iter()
        .map(|r| String::from_utf8(r.payload.unwrap()).unwrap())
        .chain((0..50).map(|n| {
            String::from_utf8(workload::event_payload(
                &format!("kcat-{n}"),
                &format!("ticket-{}", n % 5),
                "open",
                "closed",
                chrono::Utc::now(),
            ))
            .unwrap()
        }))
        .collect();
    // On Debian's librdkafka: `cargo test`'s LD_LIBRARY_PATH would give kcat this build's.
    let mut kcat = std::process::Command::new("kcat")
        .env_remove("LD_LIBRARY_PATH")
        .args(["-P", "-b", &brokers, "-t", &app.topic, "-K", "|"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("kcat is installed (scripts/test.sh installs it: scripts/test-tools.sh)");
    {
        let stdin = kcat.stdin.as_mut().unwrap();
        for payload in &payloads {
            let key = if payload.contains("ticket-42") {
                "ticket-42"
            } else {
                "k"
            };
            writeln!(stdin, "{key}|{payload}").unwrap();
        }
    }
    assert!(kcat.wait().unwrap().success());

    let ends = app.ends().await;
    assert_eq!(ends.iter().sum::<i64>(), payloads.len() as i64);

    app.start();
    app.wait_committed_to(&ends, Duration::from_secs(60)).await;
    assert_eq!(
        app.db.count("history_events").await,
        52,
        "900, 901 and fifty more"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
    assert!(
        app.logs().contains("history-service stopped"),
        "{}",
        app.logs()
    );

    let status = kafka.stop(Duration::from_secs(10)).unwrap();
    assert_eq!(status.code(), Some(0));
}

/// The demo on a fresh database, then again on the same one: each run's own poison records are
/// all stored as dead letters of that run, although the embedded broker starts anew (its offsets
/// from 0 again) and the database keeps the earlier run's letters. With a fifth of the records
/// poison, two runs on one topic name would surely put letters on the same coordinates (once,
/// about one run in twenty reported FAILED so).
#[test]
fn the_demo_runs_on_a_fresh_database_and_again_on_the_same_one_and_reports_success() {
    let runtime = actix_rt::System::new();
    let db = runtime.block_on(TestDb::create());
    for run in ["first", "second"] {
        let output = std::process::Command::new(history_devkit::workspace_binary("history-dev"))
            .args([
                "demo",
                "--events",
                "3000",
                "--partitions",
                "2",
                "--poison",
                "0.2",
            ])
            .env("HISTORY__DATABASE__URL", db.url())
            .env("HISTORY__HTTP__LISTEN", "127.0.0.1:0")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{run} run: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            stdout.contains("OK: every event recorded once"),
            "{run} run: {stdout}"
        );
        assert!(stdout.contains("applied"), "{stdout}");
        assert!(stdout.contains("committed"), "{stdout}");
    }
}

#[test]
fn the_demo_starts_a_throwaway_postgres_when_none_answers() {
    let output = std::process::Command::new(history_devkit::workspace_binary("history-dev"))
        .args(["demo", "--events", "500", "--partitions", "1"])
        .env(
            "HISTORY__DATABASE__URL",
            "postgres://postgres@127.0.0.1:1/history",
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("throwaway cluster"), "{stderr}");
    assert!(stdout.contains("OK: every event recorded once"), "{stdout}");
}

#[actix_rt::test]
async fn a_backlog_far_larger_than_the_window_is_paused_resumed_and_fully_recorded() {
    let app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env("HISTORY__PIPELINE__MAX_IN_FLIGHT_PER_PARTITION", "25")
            .env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "10");
    })
    .await;
    let records = events_with_duplicates(3000, "backpressure", 50, 5);
    let distinct = distinct_events(&records);
    app.produce(&records).await;

    let report = app
        .run_in_process(async {
            app.wait_committed(Duration::from_secs(90)).await;
        })
        .await
        .unwrap();
    // librdkafka drops what it prefetched for a paused partition and fetches it again on
    // resume: nothing may be skipped or processed out of its window.
    assert!(
        report.stats.pauses > 0,
        "the window never filled: {:?}",
        report.stats
    );
    assert_eq!(app.db.count("history_events").await, distinct as i64);
    assert_eq!(
        (report.stats.applied + report.stats.already_applied) as usize,
        3000,
        "every record resolved exactly once: {:?}",
        report.stats
    );
}

/// Drains a 3,000-record backlog over two partitions with writes slower than fetching (a
/// millisecond per row, batches of 20) under the given limits; answers the most records the
/// service held at once (`history_held_records_peak`) and the pauses counted by then (`history_partition_pauses_total`, `history_instance_pauses_total`).
async fn most_held_while_draining(per_partition: &str, in_all: &str) -> (f64, f64, f64) {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env(
            "HISTORY__PIPELINE__MAX_IN_FLIGHT_PER_PARTITION",
            per_partition,
        )
        .env("HISTORY__PIPELINE__MAX_IN_FLIGHT", in_all)
        .env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "20");
    })
    .await;
    app.db.slow_history_rows(0.001).await;
    let records = events_with_duplicates(3000, "intake", 50, 11);
    let distinct = distinct_events(&records);
    app.produce(&records).await;
    app.start();

    app.wait_committed(Duration::from_secs(120)).await;
    // Every record leaves the count once its outcome is known.
    let metrics = app
        .wait_for_metrics(Duration::from_secs(10), |m| {
            m.get("history_held_records") == Some(0.0)
        })
        .await;
    assert_eq!(app.db.count("history_events").await, distinct as i64);
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
    // Every family is exported from the start: a missing one is a failure, not a zero.
    let required = |name: &str| {
        metrics
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
    };
    // The peak of every level the budget passed through, not a sample of it.
    let most_held = required("history_held_records_peak");
    let pauses = required;
    (
        most_held,
        pauses("history_partition_pauses_total"),
        pauses("history_instance_pauses_total"),
    )
}

#[actix_rt::test]
async fn a_backlog_is_taken_from_kafka_no_faster_than_it_is_written() {
    // No partition limit to speak of: only pipeline.max_in_flight holds the backlog back, in
    // the Kafka client's queue.
    let (most_held, partition_pauses, instance_pauses) =
        most_held_while_draining("100000", "200").await;
    assert!(
        most_held >= 150.0,
        "the writers never fell behind: at most {most_held} held"
    );
    // The intake takes no record while the budget is full: the bound is hard.
    assert!(
        most_held <= 200.0,
        "{most_held} records held, beyond pipeline.max_in_flight = 200"
    );
    // The brake of a healthy backlog pauses nothing (a pause drops what the client prefetched).
    assert_eq!((partition_pauses, instance_pauses), (0.0, 0.0));
}

#[actix_rt::test]
async fn a_partition_is_paused_as_soon_as_what_was_handed_over_fills_its_window() {
    let (most_held, partition_pauses, _) = most_held_while_draining("100", "100000").await;
    assert!(partition_pauses > 0.0, "no window ever filled");
    // Two partitions of 100, and what was fetched with the record that filled one: the rest of
    // a chunk the consumer stream took at once (at most 1,024 records).
    assert!(
        most_held <= 2.0 * (100.0 + 1024.0),
        "{most_held} records held with windows of 100"
    );
}

#[actix_rt::test]
async fn a_lost_assignment_commits_nothing_and_the_rejoined_member_rereads_without_duplicates() {
    lost_assignment(None, "classic").await;
}

#[actix_rt::test]
async fn a_lost_assignment_under_the_eager_protocol_commits_nothing_either() {
    lost_assignment(
        Some((
            "HISTORY__KAFKA__PROPERTIES__PARTITION_ASSIGNMENT_STRATEGY",
            "range",
        )),
        "classic",
    )
    .await;
}

#[actix_rt::test]
async fn a_lost_assignment_under_the_consumer_protocol_commits_nothing_either() {
    lost_assignment(None, "consumer").await;
}

/// The heartbeat refusal that fences this member, under each protocol.
fn fencing(protocol: &str) -> &'static str {
    match protocol {
        "consumer" => "request-errors consumer-group-heartbeat 1 fenced-member-epoch",
        _ => "request-errors heartbeat 1 unknown-member",
    }
}

async fn lost_assignment(property: Option<(&str, &str)>, protocol: &str) {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.protocol(protocol);
        if let Some((key, value)) = property {
            o.env(key, value);
        }
        // Only a revoke or the shutdown commits: a commit at the loss would show.
        o.env("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "3600000");
    })
    .await;
    let records = events_with_duplicates(300, "lost", 20, 17);
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    app.wait_rows(distinct, Duration::from_secs(30)).await;

    // The coordinator fences the member: its next heartbeat is refused (UNKNOWN_MEMBER_ID, or
    // FENCED_MEMBER_EPOCH under KIP-848), and librdkafka declares the assignment lost (no clean
    // revoke), then rejoins.
    fencing(protocol)
        .parse::<history_devkit::faults::Fault>()
        .unwrap()
        .apply(app.broker())
        .unwrap();
    // The first pass finds the duplicates applied; after the loss, every record is read a
    // second time from the group's (empty) position and found applied.
    let duplicates = records.len() as f64 - distinct as f64;
    app.wait_for_metrics(Duration::from_secs(60), |m| {
        let lost = m.get("history_rebalances_total{kind=\"lost\"}");
        let again = m
            .get("history_events_total{outcome=\"already_applied\"}")
            .unwrap_or(0.0);
        lost >= Some(1.0) && again >= duplicates + records.len() as f64
    })
    .await;
    assert_eq!(
        app.committed().await,
        vec![None, None],
        "nothing was committed for the lost assignment"
    );
    assert!(app.logs().contains("assignment lost"));

    assert_eq!(app.stop(), Some(0), "{}", app.logs());
    app.wait_committed(Duration::from_secs(5)).await;
    assert_eq!(app.db.count("history_events").await, distinct);
    assert_eq!(app.db.count("inbox").await, distinct);
}

/// The epochs a log line lists in its `epochs=[…]` field.
fn epochs_in(line: &str) -> Vec<u64> {
    let Some(list) = line.split("epochs=[").nth(1) else {
        return Vec::new();
    };
    list.split(']')
        .next()
        .unwrap_or_default()
        .split(',')
        .filter_map(|epoch| epoch.trim().parse().ok())
        .collect()
}

/// The lost-assignment test with the test's 100 ms periodic commit and writes slowed, so that
/// positions of the assignment are being confirmed right up to its loss: none of them is
/// confirmed after it (each commit line names its assignment's epoch), the rejoined member
/// re-reads from the last confirmed position, and the backlog ends exact.
#[actix_rt::test]
async fn a_lost_assignment_under_periodic_commits_confirms_nothing_of_its_epoch_after_the_loss() {
    lost_under_periodic_commits("classic").await;
}

#[actix_rt::test]
async fn a_lost_assignment_under_consumer_and_periodic_commits_confirms_nothing_after_it() {
    lost_under_periodic_commits("consumer").await;
}

async fn lost_under_periodic_commits(protocol: &str) {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.protocol(protocol);
        o.env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "100");
        o.env(
            "HISTORY__LOG__FILTER",
            "info,history_service::commits=debug",
        );
    })
    .await;
    // About 4,000 events/s: commits all along the drain, and work in flight at the loss.
    app.db.slow_each_write(0.05).await;
    let records = events_with_duplicates(16_000, "lost-periodic", 200, 18);
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    app.wait_rows(2_000, Duration::from_secs(60)).await;
    fencing(protocol)
        .parse::<history_devkit::faults::Fault>()
        .unwrap()
        .apply(app.broker())
        .unwrap();
    app.wait_for_metrics(Duration::from_secs(60), |m| {
        m.get("history_rebalances_total{kind=\"lost\"}") >= Some(1.0)
    })
    .await;
    app.wait_committed(Duration::from_secs(120)).await;
    assert_eq!(app.db.count("history_events").await, distinct);
    assert_eq!(app.db.count("inbox").await, distinct);

    let logs = app.logs();
    let lines: Vec<&str> = logs.lines().collect();
    let loss = lines
        .iter()
        .position(|line| line.contains("assignment lost"))
        .expect("the loss is logged");
    let lost = epochs_in(lines[loss]);
    assert_eq!(lost.len(), 2, "{}", lines[loss]);
    let confirmed = |range: &[&str]| -> Vec<u64> {
        range
            .iter()
            .filter(|line| line.contains("offset committed"))
            .filter_map(|line| crate::common::logged_number(line, "epoch"))
            .collect()
    };
    let before = confirmed(&lines[..loss]);
    assert!(
        before.iter().any(|epoch| lost.contains(epoch)),
        "no position of the lost assignment was confirmed before its loss: nothing to show\n{logs}"
    );
    let after = confirmed(&lines[loss..]);
    assert!(
        !after.iter().any(|epoch| lost.contains(epoch)),
        "a position of the lost assignment {lost:?} confirmed after the loss\n{logs}"
    );
    let metrics = app.metrics().await;
    let redone = metrics
        .get("history_events_total{outcome=\"already_applied\"}")
        .expect("history_events_total{outcome=\"already_applied\"} is served")
        - (records.len() as f64 - distinct as f64);
    eprintln!(
        "{protocol}: lost assignment {lost:?} under 100 ms periodic commits: {} commits before the loss, \
         {} after (new epochs), {redone} records read again",
        before.len(),
        after.len()
    );
    assert!(
        redone < distinct as f64,
        "everything was read again: nothing was committed"
    );
    assert_eq!(app.stop(), Some(0), "{logs}");
}
