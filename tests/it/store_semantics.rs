//! What the store keeps, exactly: the session settings of pooled connections, and timestamps
//! round-tripped through PostgreSQL equal to what the decoder produced.

use history_service::domain::{HistoryEvent, Resolution, process_history_batch};
use history_service::store::PgHistoryRepository;
use history_service::store::repository::load_events;

use crate::common::{TestDb, seed_900};

#[actix_rt::test]
async fn a_first_batch_of_only_duplicates_keeps_the_plan_setting_of_its_connection() {
    let db = TestDb::migrated().await;
    let writer = PgHistoryRepository::new(db.pool(1));
    assert_eq!(
        process_history_batch(&writer, &[&seed_900()])
            .await
            .unwrap(),
        vec![Resolution::Applied]
    );

    // A fresh pool, as after a restart: its only connection's first transaction finds the
    // event already applied and is rolled back.
    let restarted = PgHistoryRepository::new(db.pool(1));
    assert_eq!(
        process_history_batch(&restarted, &[&seed_900()])
            .await
            .unwrap(),
        vec![Resolution::AlreadyApplied]
    );
    let conn = restarted.pool().get().await.unwrap();
    let mode: String = conn
        .client
        .query_one("SHOW plan_cache_mode", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(mode, "force_custom_plan");
}

fn decoded(changed_at: &str) -> HistoryEvent {
    let payload = format!(
        r#"{{"event_id":"e-{changed_at}","ticket_id":"t","from_status":"a","to_status":"b","changed_at":"{changed_at}"}}"#
    );
    HistoryEvent::decode(Some(payload.as_bytes()), 4096).unwrap()
}

#[actix_rt::test]
async fn a_decoded_timestamp_reads_back_from_postgresql_as_the_same_instant() {
    let db = TestDb::migrated().await;
    let repo = PgHistoryRepository::new(db.pool(2));
    let events: Vec<HistoryEvent> = [
        "2026-10-03T08:00:00.123456789Z",
        "2026-10-03T08:00:00.999999999+02:00",
        "2026-12-31T23:59:60Z",
        "2026-12-31T23:59:60.5-05:00",
        "1969-07-20T20:17:40.0000005Z",
        "1999-12-31T23:59:59.9999999Z",
        "0001-01-01T00:00:00.000000001Z",
        "9999-12-31T23:59:59.999999999Z",
    ]
    .into_iter()
    .map(decoded)
    .collect();
    let refs: Vec<&HistoryEvent> = events.iter().collect();
    process_history_batch(&repo, &refs).await.unwrap();

    let ids: Vec<&str> = events.iter().map(|e| e.event_id.as_str()).collect();
    let stored = load_events(repo.pool(), &ids).await.unwrap();
    for event in &events {
        assert_eq!(
            stored.get(&event.event_id),
            Some(event),
            "{}",
            event.event_id
        );
    }
}
