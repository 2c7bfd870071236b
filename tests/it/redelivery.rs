//! End to end: a byte-identical redelivery is never a conflicting duplicate, whatever the
//! precision of its timestamp; a real conflict counts, and its version is kept as a dead
//! letter an operator can list.

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
    let conflicting_bytes = conflicting.payload.clone().unwrap();
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

    // The stored row is the first version; the other is kept, as it came, at its coordinates.
    let client = app.db.client().await;
    let stored: String = client
        .query_one(
            "SELECT to_status FROM history_events WHERE event_id = 'redeliver-conflict'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, "resolved");
    let letters = client
        .query(
            "SELECT \"offset\", payload, reason_code, reason FROM dead_letters ORDER BY \"offset\"",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(letters.len(), 1, "only the conflict is a dead letter");
    let letter = &letters[0];
    let payload: Vec<u8> = letter.get(1);
    assert_eq!(
        (letter.get::<_, i64>(0), payload, letter.get::<_, String>(2)),
        (
            7,
            conflicting_bytes.clone(),
            "conflicting_duplicate".to_owned()
        )
    );
    let reason: String = letter.get(3);
    assert!(
        reason.contains("to_status differ") && reason.contains("to_status=resolved"),
        "{reason}"
    );

    // An operator lists it by its reason.
    let (code, listed) = crate::common::run_service_command(
        &app,
        &["dead-letters", "list", "--reason", "conflicting_duplicate"],
    );
    assert_eq!(code, Some(0), "{listed}");
    assert!(
        listed.contains("conflicting_duplicate") && listed.contains("redeliver-conflict"),
        "{listed}"
    );
}
