//! End to end: a byte-identical redelivery is never a conflicting duplicate, whatever the
//! precision of its timestamp; a real conflict still counts.

use std::time::Duration;

use history_devkit::test_app::TestApp;
use history_devkit::workload::{PlannedRecord, RecordKind};

fn raw_event(event_id: &str, to_status: &str, changed_at: &str) -> PlannedRecord {
    let payload = format!(
        r#"{{"event_id":"{event_id}","ticket_id":"ticket-7","from_status":"open","to_status":"{to_status}","changed_at":"{changed_at}"}}"#
    );
    PlannedRecord {
        key: b"ticket-7".to_vec(),
        payload: Some(payload.into_bytes()),
        partition: None,
        kind: RecordKind::Event {
            event_id: event_id.to_owned(),
        },
    }
}

#[actix_rt::test]
async fn identical_redeliveries_with_nanoseconds_or_a_leap_second_are_no_conflict() {
    let mut app = TestApp::spawn(|_| {}).await;
    let nano = raw_event(
        "redeliver-nano",
        "resolved",
        "2026-10-03T08:00:00.123456789Z",
    );
    let leap = raw_event("redeliver-leap", "resolved", "2026-12-31T23:59:60Z");
    let leap_offset = raw_event(
        "redeliver-leap-tz",
        "resolved",
        "2026-12-31T20:59:60.5-03:00",
    );
    let conflict = raw_event("redeliver-conflict", "resolved", "2026-10-03T08:00:00Z");
    let conflicting = raw_event("redeliver-conflict", "closed", "2026-10-03T08:00:00Z");
    let records = [
        nano.clone(),
        leap.clone(),
        leap_offset.clone(),
        conflict,
        nano,
        leap,
        leap_offset,
        conflicting,
    ];
    app.produce(&records).await;
    app.wait_committed(Duration::from_secs(30)).await;

    let metrics = app.metrics().await;
    assert_eq!(app.db.count("history_events").await, 4);
    assert_eq!(
        metrics.get("history_events_total{outcome=\"already_applied\"}"),
        Some(4.0),
        "{metrics}"
    );
    assert_eq!(
        metrics.get("history_conflicting_duplicates_total"),
        Some(1.0),
        "only the real conflict counts: {metrics}\n{}",
        app.logs()
    );
    assert_eq!(app.stop(), Some(0));
    let logs = app.logs();
    // Other warnings (the broker's, at shutdown) are not this test's business; these are.
    let warnings: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("redeliver-"))
        .collect();
    assert_eq!(warnings.len(), 1, "{logs}");
    assert!(
        warnings[0].contains("conflicting duplicate") && warnings[0].contains("redeliver-conflict"),
        "{logs}"
    );
}
