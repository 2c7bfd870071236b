//! What an operator watches: the metrics count every outcome and report each partition caught
//! up; readiness follows a database outage, and the held records are written once it is over.

use std::time::Duration;

use super::spec;
use history_devkit::probe::Metrics;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, RecordKind, WorkloadSpec, distinct_events};

/// A service (statistics every 200 ms, a short database connect timeout) that has committed
/// 600 records with some poison; the records and the ends it committed.
async fn caught_up(prefix: &str) -> (TestApp, Vec<PlannedRecord>, Vec<i64>) {
    let app = TestApp::spawn(|o| {
        o.partitions = 3;
        o.env("HISTORY__KAFKA__STATISTICS_INTERVAL_MS", "200")
            .env("HISTORY__DATABASE__CONNECT_TIMEOUT_MS", "500");
    })
    .await;
    let records = workload::generate(&spec(600, 0.02, prefix, 9));
    app.produce(&records).await;
    let ends = app.ends().await;
    app.wait_committed_to(&ends, Duration::from_secs(60)).await;
    (app, records, ends)
}

fn count(records: &[PlannedRecord], kind: fn(&RecordKind) -> bool) -> f64 {
    records.iter().filter(|r| kind(&r.kind)).count() as f64
}

fn partition_series(family: &str, topic: &str, partition: usize) -> String {
    format!("{family}{{topic=\"{topic}\",partition=\"{partition}\"}}")
}

#[actix_rt::test]
async fn the_metrics_count_every_outcome_and_report_each_partition_caught_up() {
    let (mut app, records, ends) = caught_up("metrics").await;
    app.wait_for_answer("/healthz", Duration::from_secs(5), |status, _| {
        status == 200
    })
    .await;
    app.wait_for_answer("/readyz", Duration::from_secs(5), |status, _| status == 200)
        .await;
    // The lag comes from librdkafka's statistics, every statistics interval: wait for the one
    // that reports every partition caught up.
    let topic = app.topic.clone();
    let m: Metrics = app
        .wait_for_metrics(Duration::from_secs(10), |m| {
            (0..3).all(|partition| {
                m.get(&partition_series("history_consumer_lag", &topic, partition)) == Some(0.0)
            })
        })
        .await;
    let events = count(&records, |k| matches!(k, RecordKind::Event { .. }));
    let duplicates = count(&records, |k| matches!(k, RecordKind::Duplicate { .. }));
    let poison = count(&records, |k| matches!(k, RecordKind::Poison { .. }));
    assert_eq!(
        m.get("history_events_total{outcome=\"applied\"}"),
        Some(events),
        "{m}"
    );
    assert_eq!(
        m.get("history_events_total{outcome=\"already_applied\"}"),
        Some(duplicates)
    );
    assert_eq!(
        m.get("history_events_total{outcome=\"dead_letter\"}"),
        Some(poison)
    );
    assert_eq!(m.sum("history_dead_letters_total"), poison);
    for (partition, end) in ends.iter().enumerate() {
        let series = partition_series("history_committed_offset", &topic, partition);
        assert_eq!(m.get(&series), Some(*end as f64), "{series} in\n{m}");
        let lag = partition_series("history_consumer_lag", &topic, partition);
        assert_eq!(m.get(&lag), Some(0.0), "{lag} in\n{m}");
        let in_flight = partition_series("history_in_flight", &topic, partition);
        assert_eq!(m.get(&in_flight), Some(0.0), "{in_flight} in\n{m}");
    }
    assert!(m.get("history_transaction_seconds_count") > Some(0.0));
    assert!(m.get("history_rebalances_total{kind=\"assign\"}") >= Some(1.0));
    assert_eq!(m.get("history_assigned_partitions"), Some(3.0));
    // Only what an operator needs is served.
    assert_eq!(app.get("/").await.0, 404);
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn readiness_fails_through_a_database_outage_and_the_held_records_are_written_after_it() {
    let (mut app, records, first_ends) = caught_up("outage").await;
    app.wait_for_answer("/readyz", Duration::from_secs(5), |status, _| status == 200)
        .await;
    let events = count(&records, |k| matches!(k, RecordKind::Event { .. }));

    // The database goes away: readiness fails, writes are retried, nothing is committed.
    let admin = crate::common::admin_client().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS false",
            app.db.name
        ))
        .await
        .unwrap();
    app.db.terminate_backends().await;
    app.wait_for_answer("/readyz", Duration::from_secs(15), |status, _| {
        status == 503
    })
    .await;
    let more = workload::generate(&WorkloadSpec {
        poison: 0.0,
        ..spec(100, 0.0, "outage-later", 10)
    });
    app.produce(&more).await;
    let later_ends = app.ends().await;
    let m = app
        .wait_for_metrics(Duration::from_secs(15), |m| {
            m.get("history_retries_total") >= Some(1.0)
                && m.get("history_events_total{outcome=\"unknown\"}") >= Some(1.0)
        })
        .await;
    assert!(m.get("history_retries_total") >= Some(1.0), "{m}");
    assert!(m.get("history_events_total{outcome=\"unknown\"}") >= Some(1.0));
    assert_eq!(
        m.sum("history_committed_offset"),
        first_ends.iter().sum::<i64>() as f64,
        "nothing committed during the outage"
    );
    assert_eq!(
        app.process().exit_status(),
        None,
        "the outage does not crash it"
    );

    // It comes back: ready again, and the held records are written and committed.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS true",
            app.db.name
        ))
        .await
        .unwrap();
    app.wait_for_answer("/readyz", Duration::from_secs(20), |status, _| {
        status == 200
    })
    .await;
    app.wait_committed_to(&later_ends, Duration::from_secs(60))
        .await;
    assert_eq!(
        app.db.count("history_events").await,
        (events + distinct_events(&more) as f64) as i64
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}
