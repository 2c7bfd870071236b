//! Both consumer group protocols end to end: Kafka's `classic` one and KIP-848's `consumer`
//! (which librdkafka's mock cluster speaks through `ConsumerGroupHeartbeat`), static
//! membership, refused commits of a stale member epoch, and topics that appear after start-up.

use std::time::{Duration, Instant};

use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, WorkloadSpec, distinct_events};

/// Good events with 10% duplicates over `partitions` partitions.
fn events(records: usize, prefix: &str, partitions: i32, seed: u64) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records,
        duplicates: 0.1,
        poison: 0.0,
        partitions,
        id_prefix: prefix.into(),
        tickets: 97,
        max_payload_bytes: 65536,
        seed,
    })
}

#[actix_rt::test]
async fn a_backlog_is_drained_and_committed_exactly_under_the_classic_protocol() {
    drain("classic").await;
}

#[actix_rt::test]
async fn a_backlog_is_drained_and_committed_exactly_under_the_consumer_protocol() {
    drain("consumer").await;
}

/// One member drains a backlog over three partitions: every event recorded once, the group
/// committed to the end of every partition, and `/metrics` says which protocol ran.
async fn drain(protocol: &str) {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 3;
        o.protocol(protocol);
    })
    .await;
    let records = events(3000, &format!("drain-{protocol}"), 3, 21);
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    let started = Instant::now();
    app.start();
    let committed = app.wait_committed(Duration::from_secs(60)).await;
    let took = started.elapsed();
    assert_eq!(
        committed,
        app.ends().await.into_iter().map(Some).collect::<Vec<_>>()
    );
    assert_eq!(app.db.count("history_events").await, distinct);
    assert_eq!(app.db.count("inbox").await, distinct);
    let metrics = app.metrics().await;
    assert_eq!(
        metrics.value(
            "history_group_protocol_info",
            &[("protocol", protocol), ("membership", "dynamic")]
        ),
        Some(1.0),
        "{metrics}"
    );
    assert!(
        metrics
            .value("history_rebalances_total", &[("kind", "assign")])
            .unwrap_or(0.0)
            >= 1.0,
        "{metrics}"
    );
    assert_eq!(
        metrics.value("history_rebalances_total", &[("kind", "lost")]),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        metrics.get("history_events_total{outcome=\"applied\"}"),
        Some(distinct as f64),
        "every event applied once: {metrics}"
    );
    let line = app
        .wait_for_log(&["history-service starting"], Duration::from_secs(1))
        .await;
    assert!(
        line.contains(&format!("group_protocol=\"{protocol}\""))
            || line.contains(&format!("group_protocol={protocol}")),
        "{line}"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
    eprintln!("{protocol}: {distinct} events drained and committed in {took:?}");
}

/// librdkafka does not retry a manual commit refused with `STALE_MEMBER_EPOCH`: the service
/// does, while the partitions are still its own. The only commit of this run is the final one
/// (the periodic one is an hour away); the broker refuses it three times, and it still lands:
/// a clean stop, the group's position at the rows written.
#[actix_rt::test]
async fn a_final_commit_refused_for_a_stale_member_epoch_is_retried_and_lands() {
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.protocol("consumer");
        o.env("HISTORY__PIPELINE__COMMIT_INTERVAL_MS", "3600000");
    })
    .await;
    let records = events(400, "stale", 2, 8);
    let distinct = distinct_events(&records) as i64;
    app.produce(&records).await;
    app.start();
    app.wait_rows(distinct, Duration::from_secs(30)).await;
    let metrics = app
        .wait_for_metrics(Duration::from_secs(30), |m| {
            m.get("history_events_total{outcome=\"applied\"}")
                .zip(m.get("history_events_total{outcome=\"already_applied\"}"))
                .is_some_and(|(a, b)| a + b == records.len() as f64)
        })
        .await;
    assert_eq!(
        app.committed().await,
        vec![None, None],
        "nothing committed before the stop: {metrics}"
    );
    app.broker().cluster().request_errors(
        RDKafkaApiKey::OffsetCommit,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_STALE_MEMBER_EPOCH; 3],
    );
    let code = app.stop();
    let logs = app.logs();
    assert_eq!(code, Some(0), "the final commit did not land\n{logs}");
    assert_eq!(
        app.committed().await,
        app.ends().await.into_iter().map(Some).collect::<Vec<_>>(),
        "{logs}"
    );
    assert_eq!(
        logs.matches("this member's epoch is behind the group's")
            .count(),
        3,
        "three refusals, each tried again\n{logs}"
    );
}
