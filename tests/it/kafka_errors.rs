//! Kafka client errors are logged without flooding: the real binary against a broker address
//! where nothing listens.

use std::time::{Duration, Instant};

use history_devkit::raw_batch;
use history_devkit::test_app::TestApp;
use history_devkit::workload;

use crate::common::events_in_each;

/// Lines at WARN or ERROR in a log.
fn complaints(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect()
}

const ALL_BROKERS_DOWN: &str = "history_kafka_client_errors_total{error=\"AllBrokersDown\"}";

/// Reads the metrics until the count of AllBrokersDown reports reaches `reports`; returns it.
async fn wait_reports(app: &TestApp, reports: f64) -> f64 {
    app.wait_for_metrics(Duration::from_secs(60), |m| {
        m.get(ALL_BROKERS_DOWN).unwrap_or(0.0) >= reports
    })
    .await
    .get(ALL_BROKERS_DOWN)
    .unwrap_or(0.0)
}

/// The AllBrokersDown occurrences the log accounts for: one per full line, plus the repeats
/// each summary counts.
fn logged_occurrences(log: &str) -> u64 {
    log.lines()
        .filter(|line| line.contains("AllBrokersDown"))
        .map(|line| match line.split_once(" repeats=") {
            Some((_, rest)) => rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap(),
            None => 1,
        })
        .sum()
}

#[actix_rt::test]
async fn an_unreachable_broker_is_named_in_a_few_lines_while_every_error_is_counted() {
    // Nothing listens there (port 1, as in the other tests of an unreachable server).
    let mut app = TestApp::spawn(|o| o.external_brokers = Some("127.0.0.1:1".into())).await;

    // librdkafka reports the brokers down about 20 times a second, to the error callback and
    // again on the consumer stream; run until the metric counted 200 reports (about 5 s).
    const REPORTS: f64 = 200.0;
    wait_reports(&app, REPORTS).await;
    assert_eq!(app.stop(), Some(0));

    let log = app.logs();
    let complaints = complaints(&log);
    // Seven here: the start-up's word on the cluster's size, the first line of each of three
    // errors, and their three summaries. Every client the service makes of the cluster (the
    // metadata client, the start-up's checking clients) logs through the one summarised log:
    // with a log of their own each, a CI run counted 11 and this machine 12.
    assert!(
        complaints.len() <= 8,
        "{} lines for {REPORTS} reports:\n{log}",
        complaints.len()
    );
    assert!(
        complaints
            .iter()
            .any(|line| line.contains("AllBrokersDown") && line.contains("kafka client error")),
        "the error is named:\n{log}"
    );
    // The repeats are not hidden: stopping says how many there were.
    assert!(
        complaints
            .iter()
            .any(|line| line.contains("kafka client error AllBrokersDown repeated")),
        "the repeats are summarised:\n{log}"
    );
}

#[actix_rt::test]
async fn the_repeats_of_an_error_that_stopped_are_summarised_after_the_interval() {
    let mut app = TestApp::prepare(|o| {
        o.env("HISTORY__KAFKA__ERROR_LOG_INTERVAL_MS", "1000");
    })
    .await;
    app.broker().cluster().broker_down(1).unwrap();
    app.start();
    wait_reports(&app, 20.0).await;

    // The outage ends: the service consumes, and no error follows.
    app.broker().cluster().broker_up(1).unwrap();
    app.produce(&workload::seed_records()).await;
    app.wait_rows(2, Duration::from_secs(60)).await;
    let reported = app.metrics().await.get(ALL_BROKERS_DOWN).unwrap() as u64;

    // While it still runs, the log accounts for every report: the repeats were summarised once
    // their interval was over, not held back for a next error. (The metric may miss the first
    // reports, made before its recorder was installed.)
    let deadline = Instant::now() + Duration::from_secs(15);
    while logged_occurrences(&app.logs()) < reported {
        assert!(
            Instant::now() < deadline,
            "{reported} reported, {} logged:\n{}",
            logged_occurrences(&app.logs()),
            app.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.stop(), Some(0));
}

/// Record batches no client can read, at offset 40 and 41 of two of three partitions: one of a
/// codec no Kafka has yet (id 5), one that says zstd but is not. librdkafka re-fetches each forever
/// and names no partition; the service names both — an ERROR line with topic, partition,
/// offset and what to do, `/readyz` and `history_undecodable_batch` — and neither partition's
/// position moves past its batch, while the third partition drains to its end.
#[actix_rt::test]
async fn batches_the_client_cannot_decompress_are_named_and_their_partitions_stand_still() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 3;
        o.env("HISTORY__KAFKA__STATISTICS_INTERVAL_MS", "1000");
    })
    .await;
    app.produce(&events_in_each(3, 0, 40, "before")).await;
    app.produce(&events_in_each(3, 40, 41, "before").split_off(2))
        .await;
    let unknown = raw_batch::produce(
        &app.brokers,
        &app.topic,
        1,
        &raw_batch::record_batch(5, 3, b"a codec of a later Kafka"),
    )
    .unwrap();
    let corrupt = raw_batch::produce(
        &app.brokers,
        &app.topic,
        2,
        &raw_batch::record_batch(4, 3, b"\x28\xb5\x2f\xfd but not zstd after all"),
    )
    .unwrap();
    assert_eq!((unknown, corrupt), (40, 41));
    app.produce(&events_in_each(3, 41, 80, "after")).await;
    assert_eq!(app.ends().await, vec![79, 82, 83]);

    app.start();
    app.wait_committed_to(&[79, 40, 41], Duration::from_secs(60))
        .await;
    app.wait_for_log(
        &[
            "cannot be decompressed",
            "[1]",
            "offset=40",
            "does not have",
        ],
        Duration::from_secs(30),
    )
    .await;
    app.wait_for_log(
        &[
            "cannot be decompressed",
            "[2]",
            "offset=41",
            "codec=zstd",
            "corrupt",
        ],
        Duration::from_secs(30),
    )
    .await;
    let (_, reason) = app
        .wait_for_answer("/readyz", Duration::from_secs(30), |status, body| {
            status == 503 && body.contains("[1] at offset 40") && body.contains("[2] at offset 41")
        })
        .await;
    assert!(reason.contains("cannot decompress"), "{reason}");
    let metrics = app.metrics().await;
    let topic = app.topic.clone();
    for (partition, offset, codec) in [("1", "40", "unknown"), ("2", "41", "zstd")] {
        let labels = [
            ("topic", topic.as_str()),
            ("partition", partition),
            ("offset", offset),
            ("codec", codec),
        ];
        assert_eq!(
            metrics.value("history_undecodable_batch", &labels),
            Some(1.0),
            "{metrics}"
        );
    }
    // Nothing behind the batches was written, and their positions stay where they are.
    assert_eq!(app.db.count("history_events").await, 79 + 40 + 41);
    assert_eq!(app.committed().await, vec![Some(79), Some(40), Some(41)]);
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}
