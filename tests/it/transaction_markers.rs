//! Topics written by transactional producers: each transaction ends with a marker, a control
//! record at an offset of its own that no consumer is handed. The embedded broker has no
//! transaction coordinator that writes markers, so they are written onto the wire as Kafka's
//! coordinator writes them (`raw_batch::transaction_marker`); the service's librdkafka reads
//! and skips them as it would on a real cluster.

use std::time::Duration;

use history_devkit::raw_batch;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, RecordKind};

fn events(partition: i32, from: usize, to: usize) -> Vec<PlannedRecord> {
    (from..to)
        .map(|n| {
            let id = format!("txn-{partition}-{n}");
            PlannedRecord {
                key: format!("ticket-{partition}").into_bytes(),
                payload: Some(workload::event_payload(
                    &id,
                    &format!("ticket-{partition}"),
                    "open",
                    "closed",
                    chrono::Utc::now(),
                )),
                partition: Some(partition),
                kind: RecordKind::Event { event_id: id },
            }
        })
        .collect()
}

/// Two transactions on partition 0, each ended by its commit marker, the second one the log's
/// last record; on partition 1 records of no transaction. The group's committed position
/// reaches each log's end — past the last marker — so the lag is 0, not 1 for good. (Without
/// the client's position taken past the markers, partition 0 stays committed at 32, the log's end 33 and
/// this fails at its wait.)
#[actix_rt::test]
async fn the_committed_position_reaches_the_log_end_past_a_transactions_marker() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env("HISTORY__KAFKA__STATISTICS_INTERVAL_MS", "500");
    })
    .await;
    let producer = (4242, 0);
    app.produce(&events(0, 0, 20)).await;
    let first = raw_batch::produce(
        &app.brokers,
        &app.topic,
        0,
        &raw_batch::transaction_marker(producer, true),
    )
    .unwrap();
    app.produce(&events(0, 20, 31)).await;
    let last = raw_batch::produce(
        &app.brokers,
        &app.topic,
        0,
        &raw_batch::transaction_marker(producer, true),
    )
    .unwrap();
    assert_eq!((first, last), (20, 32));
    app.produce(&events(1, 0, 10)).await;
    assert_eq!(app.ends().await, vec![33, 10]);

    app.start();
    app.wait_committed_to(&[33, 10], Duration::from_secs(30))
        .await;
    assert_eq!(app.db.count("history_events").await, 41);
    assert_eq!(
        app.db.count("dead_letters").await,
        0,
        "a marker is no record"
    );
    let topic = app.topic.clone();
    let labels = [("topic", topic.as_str()), ("partition", "0")];
    app.wait_for_metrics(Duration::from_secs(30), |metrics| {
        metrics.value("history_consumer_lag", &labels) == Some(0.0)
    })
    .await;
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}
