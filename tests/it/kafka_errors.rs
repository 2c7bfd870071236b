//! Kafka client errors are logged without flooding: the real binary against a broker address
//! where nothing listens.

use std::time::{Duration, Instant};

use history_service::dev::probe::sample;

use crate::common::{Child, TOPIC, TestDb, free_port, service_env};
use crate::end_to_end::scrape;

/// Lines at WARN or ERROR in a log.
fn complaints(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .collect()
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
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = scrape(http_port).await;
        let reported = sample(
            &metrics,
            "history_kafka_client_errors_total{error=\"AllBrokersDown\"}",
        )
        .unwrap_or(0.0);
        if reported >= REPORTS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {reported} reports:\n{}",
            service.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
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
