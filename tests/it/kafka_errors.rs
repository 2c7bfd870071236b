//! Kafka client errors are logged without flooding: the real binary against a broker address
//! where nothing listens.

use std::time::{Duration, Instant};

use history_devkit::test_app::TestApp;
use history_devkit::workload;

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
    assert!(
        complaints.len() <= 10,
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
