//! Migrations: the exact schema, idempotence, and replicas migrating at once.

use futures::future::join_all;
use history_service::store::migrate::run_migrations;

use crate::common::TestDb;

#[actix_rt::test]
async fn a_fresh_database_gets_exactly_the_specified_schema() {
    let db = TestDb::create().await;
    let mut client = db.client().await;
    let report = run_migrations(&mut client).await.unwrap();
    assert_eq!(report.applied.len(), report.known);
    assert!(report.applied[0].starts_with("V1__"));

    let columns: Vec<(String, String, String, String)> = client
        .query(
            "SELECT table_name::text, column_name::text, data_type::text, is_nullable::text \
             FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name IN ('inbox', 'history_events') \
             ORDER BY table_name, ordinal_position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    let expected = [
        ("history_events", "event_id", "text", "NO"),
        ("history_events", "ticket_id", "text", "NO"),
        ("history_events", "from_status", "text", "NO"),
        ("history_events", "to_status", "text", "NO"),
        (
            "history_events",
            "changed_at",
            "timestamp with time zone",
            "NO",
        ),
        ("inbox", "event_id", "text", "NO"),
    ];
    let columns: Vec<(&str, &str, &str, &str)> = columns
        .iter()
        .map(|(a, b, c, d)| (a.as_str(), b.as_str(), c.as_str(), d.as_str()))
        .collect();
    assert_eq!(columns, expected);

    let constraints: Vec<(String, String)> = client
        .query(
            "SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conrelid IN ('inbox'::regclass, 'history_events'::regclass) ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        constraints,
        vec![
            (
                "history_events".to_owned(),
                "FOREIGN KEY (event_id) REFERENCES inbox(event_id)".to_owned()
            ),
            (
                "history_events".to_owned(),
                "PRIMARY KEY (event_id)".to_owned()
            ),
            ("inbox".to_owned(), "PRIMARY KEY (event_id)".to_owned()),
        ]
    );
}

#[actix_rt::test]
async fn migrating_twice_changes_nothing() {
    let db = TestDb::create().await;
    let mut client = db.client().await;
    let first = run_migrations(&mut client).await.unwrap();
    let second = run_migrations(&mut client).await.unwrap();
    assert!(!first.applied.is_empty());
    assert!(second.applied.is_empty());
}

#[actix_rt::test]
async fn replicas_migrating_at_once_apply_each_migration_exactly_once() {
    let db = TestDb::create().await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(db.client().await);
    }
    let reports = join_all(clients.iter_mut().map(run_migrations)).await;
    let mut applied = Vec::new();
    for report in reports {
        applied.extend(report.expect("every replica's migration succeeds").applied);
    }
    applied.sort();
    let mut unique = applied.clone();
    unique.dedup();
    assert_eq!(applied, unique, "no migration applied twice");
    let known = run_migrations(&mut db.client().await).await.unwrap().known;
    assert_eq!(applied.len(), known);
}
