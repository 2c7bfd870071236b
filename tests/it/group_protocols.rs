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
