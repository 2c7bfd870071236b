//! Kafka client errors are logged without flooding: the real binary against a broker address
//! where nothing listens.

use std::time::{Duration, Instant};

use history_devkit::broker::EmbeddedBroker;
use history_devkit::probe::sample;
use history_devkit::workload;

use crate::common::scrape;
use crate::common::{Child, TOPIC, TestDb, free_port, produce, service_env};

/// Lines at WARN or ERROR in a log.
fn complaints(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect()
}

const ALL_BROKERS_DOWN: &str = "history_kafka_client_errors_total{error=\"AllBrokersDown\"}";

/// Scrapes until the count of AllBrokersDown reports reaches `reports`; returns it.
async fn wait_reports(port: u16, reports: f64, service: &Child) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let reported = sample(&scrape(port).await, ALL_BROKERS_DOWN).unwrap_or(0.0);
        if reported >= reports {
            return reported;
        }
        assert!(
            Instant::now() < deadline,
            "only {reported} reports:\n{}",
            service.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
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
    let db = TestDb::migrated().await;
    // Nothing listens there: the port was free a moment ago.
    let brokers = format!("127.0.0.1:{}", free_port());
    let http_port = free_port();
    let mut env = service_env(&db.url(), &brokers, "history-unreachable", TOPIC);
    env.push(("HISTORY__HTTP__ENABLED".into(), "true".into()));
    env.push((
        "HISTORY__HTTP__LISTEN".into(),
        format!("127.0.0.1:{http_port}"),
    ));
    let mut service = Child::spawn(&["run"], &env);

    // librdkafka reports the brokers down about 20 times a second, to the error callback and
    // again on the consumer stream; run until the metric counted 200 reports (about 5 s).
    const REPORTS: f64 = 200.0;
    wait_reports(http_port, REPORTS, &service).await;
    service.signal(libc::SIGTERM);
    assert_eq!(service.wait(Duration::from_secs(30)), Some(0));

    let log = service.logs();
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
    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 1).unwrap();
    let brokers = broker.bootstrap_servers();
    broker.cluster().broker_down(1).unwrap();
    let http_port = free_port();
    let mut env = service_env(&db.url(), &brokers, "history-outage", TOPIC);
    env.push(("HISTORY__HTTP__ENABLED".into(), "true".into()));
    env.push((
        "HISTORY__HTTP__LISTEN".into(),
        format!("127.0.0.1:{http_port}"),
    ));
    env.push((
        "HISTORY__KAFKA__ERROR_LOG_INTERVAL_MS".into(),
        "1000".into(),
    ));
    let mut service = Child::spawn(&["run"], &env);
    wait_reports(http_port, 20.0, &service).await;

    // The outage ends: the service consumes, and no error follows.
    broker.cluster().broker_up(1).unwrap();
    produce(&brokers, &workload::seed_records()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.count("history_events").await < 2 {
        assert!(Instant::now() < deadline, "stalled:\n{}", service.logs());
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let reported = sample(&scrape(http_port).await, ALL_BROKERS_DOWN).unwrap() as u64;

    // While it still runs, the log accounts for every report: the repeats were summarised once
    // their interval was over, not held back for a next error. (The metric may miss the first
    // reports, made before its recorder was installed.)
    let deadline = Instant::now() + Duration::from_secs(15);
    while logged_occurrences(&service.logs()) < reported {
        assert!(
            Instant::now() < deadline,
            "{reported} reported, {} logged:\n{}",
            logged_occurrences(&service.logs()),
            service.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    service.signal(libc::SIGTERM);
    assert_eq!(service.wait(Duration::from_secs(30)), Some(0));
}
