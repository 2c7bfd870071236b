//! The per-event transaction on the real PostgreSQL repository.

use futures::future::join_all;
use history_service::domain::{
    HistoryEvent, HistoryRepository, HistoryTransaction, Outcome, Resolution,
    process_history_batch, process_history_once, write_history_batch,
};
use history_service::store::{PgHistoryRepository, StoreError};
use tokio_postgres::error::SqlState;

use crate::common::{TestDb, event, seed_900, seed_901};

fn kind<E>(outcome: &Outcome<E>) -> &'static str {
    match outcome {
        Outcome::Applied => "applied",
        Outcome::AlreadyApplied => "already_applied",
        Outcome::Unknown(_) => "unknown",
    }
}

#[actix_rt::test]
async fn the_seed_scenario_leaves_two_markers_and_two_history_rows() {
    let db = TestDb::migrated().await;
    let repo = PgHistoryRepository::new(db.pool(4));

    let first = process_history_once(&repo, &seed_900()).await;
    let again = process_history_once(&repo, &seed_900()).await;
    let next = process_history_once(&repo, &seed_901()).await;

    assert_eq!(
        [kind(&first), kind(&again), kind(&next)],
        ["applied", "already_applied", "applied"]
    );
    assert_eq!(db.count("inbox").await, 2);
    assert_eq!(db.count("history_events").await, 2);
    let rows = db
        .client()
        .await
        .query(
            "SELECT event_id, ticket_id, from_status, to_status, changed_at::text \
             FROM history_events ORDER BY event_id",
            &[],
        )
        .await
        .unwrap();
    let stored: Vec<(String, String, String, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    assert_eq!(stored[0].0, "event-ticket-900");
    assert_eq!(stored[0].1, "ticket-42");
    assert_eq!(
        (stored[0].2.as_str(), stored[0].3.as_str()),
        ("open", "resolved")
    );
    assert_eq!(stored[1].0, "event-ticket-901");
    assert_eq!(
        (stored[1].2.as_str(), stored[1].3.as_str()),
        ("resolved", "closed")
    );
    assert_eq!(stored[1].1, "ticket-42", "one ticket, two events");
}

#[actix_rt::test]
async fn sixteen_concurrent_deliveries_of_one_new_event_apply_it_exactly_once() {
    let db = TestDb::migrated().await;
    let repo = PgHistoryRepository::new(db.pool(16));
    let event = seed_900();
    // Open all sixteen connections first so the deliveries truly race at the unique index.
    let warm: Vec<_> = join_all((0..16).map(|_| repo.pool().get())).await;
    drop(warm);

    let outcomes = join_all((0..16).map(|_| process_history_once(&repo, &event))).await;

    let applied = outcomes.iter().filter(|o| kind(o) == "applied").count();
    let duplicates = outcomes
        .iter()
        .filter(|o| kind(o) == "already_applied")
        .count();
    assert_eq!((applied, duplicates), (1, 15), "{outcomes:?}");
    assert_eq!(db.count("inbox").await, 1);
    assert_eq!(db.count("history_events").await, 1);
}

/// Wraps the real repository and breaks the transaction right after TryInbox.
struct KillAfterTryInbox<'a> {
    inner: PgHistoryRepository,
    db: &'a TestDb,
}

struct KillingTx<'a> {
    inner: history_service::store::PgTransaction,
    db: &'a TestDb,
}

impl<'a> HistoryRepository for KillAfterTryInbox<'a> {
    type Error = StoreError;
    type Tx = KillingTx<'a>;

    async fn begin(&self) -> Result<KillingTx<'a>, StoreError> {
        Ok(KillingTx {
            inner: self.inner.begin().await?,
            db: self.db,
        })
    }
}

impl HistoryTransaction for KillingTx<'_> {
    type Error = StoreError;

    async fn try_inbox(&mut self, event_id: &str) -> Result<bool, StoreError> {
        let claimed = self.inner.try_inbox(event_id).await?;
        assert!(self.db.terminate_backends().await >= 1);
        Ok(claimed)
    }

    async fn try_inbox_batch(&mut self, ids: &[&str]) -> Result<Vec<bool>, StoreError> {
        let claimed = self.inner.try_inbox_batch(ids).await?;
        assert!(self.db.terminate_backends().await >= 1);
        Ok(claimed)
    }

    async fn save_history(&mut self, event: &HistoryEvent) -> Result<(), StoreError> {
        self.inner.save_history(event).await
    }

    async fn save_history_batch(&mut self, events: &[&HistoryEvent]) -> Result<(), StoreError> {
        self.inner.save_history_batch(events).await
    }

    async fn commit(&mut self) -> Result<(), StoreError> {
        self.inner.commit().await
    }

    async fn rollback(&mut self) -> Result<(), StoreError> {
        self.inner.rollback().await
    }
}

#[actix_rt::test]
async fn a_connection_killed_after_try_inbox_leaves_neither_marker_nor_row() {
    let db = TestDb::migrated().await;
    let pool = db.pool(2);
    let repo = KillAfterTryInbox {
        inner: PgHistoryRepository::new(pool.clone()),
        db: &db,
    };
    let outcome = process_history_once(&repo, &seed_900()).await;
    assert!(
        matches!(outcome, Outcome::Unknown(StoreError::Db(_))),
        "{outcome:?}"
    );
    assert_eq!(db.count("inbox").await, 0);
    assert_eq!(db.count("history_events").await, 0);

    let (a, b) = (seed_900(), seed_901());
    let batch = process_history_batch(&repo, &[&a, &b]).await;
    assert!(batch.is_err(), "{batch:?}");
    assert_eq!(db.count("inbox").await, 0);

    // The redelivery, on a healthy connection, applies the event.
    let healthy = PgHistoryRepository::new(pool);
    assert_eq!(
        kind(&process_history_once(&healthy, &seed_900()).await),
        "applied"
    );
    assert_eq!(db.count("history_events").await, 1);
}

#[actix_rt::test]
async fn a_rejected_save_history_rolls_the_marker_back() {
    let db = TestDb::migrated().await;
    db.client()
        .await
        .batch_execute(
            "ALTER TABLE history_events ADD CONSTRAINT test_reject \
             CHECK (to_status <> 'rejected-by-test')",
        )
        .await
        .unwrap();
    let repo = PgHistoryRepository::new(db.pool(2));
    let doomed = event(
        "event-doomed",
        "open",
        "rejected-by-test",
        "2026-10-03T08:00:00Z",
    );

    let outcome = process_history_once(&repo, &doomed).await;
    match outcome {
        Outcome::Unknown(StoreError::Db(err)) => {
            assert_eq!(err.code(), Some(&SqlState::CHECK_VIOLATION))
        }
        other => panic!("expected Unknown with the check violation, got {other:?}"),
    }
    assert_eq!(db.count("inbox").await, 0, "no marker without its row");

    // The connection went back to the pool clean: the next transaction works on it.
    assert_eq!(
        kind(&process_history_once(&repo, &seed_900()).await),
        "applied"
    );
    let (a, b) = (seed_901(), doomed);
    assert!(process_history_batch(&repo, &[&a, &b]).await.is_err());
    assert_eq!(db.count("inbox").await, 1);
}

#[actix_rt::test]
async fn the_foreign_key_rejects_a_history_row_without_a_marker() {
    let db = TestDb::migrated().await;
    let err = db
        .client()
        .await
        .execute(
            "INSERT INTO history_events VALUES ('orphan', 't', 'a', 'b', now())",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::FOREIGN_KEY_VIOLATION));
}

#[actix_rt::test]
async fn a_batch_resolves_every_event_as_it_would_alone() {
    let db = TestDb::migrated().await;
    let repo = PgHistoryRepository::new(db.pool(2));
    assert_eq!(
        kind(&process_history_once(&repo, &seed_900()).await),
        "applied"
    );

    let new_a = event("event-a", "open", "pending", "2026-10-03T09:00:00+02:00");
    let new_b = event("event-b", "pending", "closed", "2026-10-03T09:05:00Z");
    let old = seed_900();
    let batch = [&new_a, &old, &new_b, &new_a, &old];
    let resolutions = process_history_batch(&repo, &batch).await.unwrap();
    assert_eq!(
        resolutions,
        vec![
            Resolution::Applied,
            Resolution::AlreadyApplied,
            Resolution::Applied,
            Resolution::AlreadyApplied,
            Resolution::AlreadyApplied,
        ]
    );
    assert_eq!(db.count("inbox").await, 3);
    assert_eq!(db.count("history_events").await, 3);
    let stored: String = db
        .client()
        .await
        .query_one(
            "SELECT to_char(changed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI') \
             FROM history_events WHERE event_id = 'event-a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stored, "2026-10-03 07:00", "the offset is honoured");

    let all_old = process_history_batch(&repo, &[&new_a, &new_b])
        .await
        .unwrap();
    assert_eq!(all_old, vec![Resolution::AlreadyApplied; 2]);
}

/// The batch statement answers each duplicate with its stored row, so that a conflicting
/// duplicate is told without a round trip of its own.
#[actix_rt::test]
async fn a_batch_answers_the_stored_row_of_each_duplicate_in_its_one_statement() {
    let db = TestDb::migrated().await;
    let repo = PgHistoryRepository::new(db.pool(2));
    let stored = event("event-s", "open", "pending", "2026-10-03T09:00:00+02:00");
    process_history_batch(&repo, &[&stored]).await.unwrap();

    let mut other = stored.clone();
    other.to_status = "closed".into();
    let new = event("event-n", "pending", "closed", "2026-10-03T09:05:00Z");
    let written = write_history_batch(&repo, &[&other, &new, &stored])
        .await
        .unwrap();
    assert_eq!(
        written.resolutions,
        vec![
            Resolution::AlreadyApplied,
            Resolution::Applied,
            Resolution::AlreadyApplied,
        ]
    );
    assert_eq!(
        written.stored,
        vec![Some(stored.clone()), None, Some(stored.clone())],
        "the stored row, as written first, for both deliveries of event-s"
    );
    assert_ne!(written.stored[0].as_ref(), Some(&other));
}

#[actix_rt::test]
async fn a_database_that_does_not_answer_makes_begin_fail_with_unavailable() {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(1)
        .user("postgres")
        .dbname("nothing");
    let pool =
        history_service::store::connect_pool(config, 2, std::time::Duration::from_millis(300));
    let repo = PgHistoryRepository::new(pool);
    let outcome = process_history_once(&repo, &seed_900()).await;
    assert!(
        matches!(outcome, Outcome::Unknown(StoreError::Unavailable(_))),
        "{outcome:?}"
    );
}

#[actix_rt::test]
async fn a_batch_whose_commit_fails_is_unknown_for_every_event_and_leaves_nothing() {
    let db = TestDb::migrated().await;
    // Checked only at COMMIT: one history row per ticket.
    db.client()
        .await
        .batch_execute(
            "ALTER TABLE history_events ADD CONSTRAINT one_row_per_ticket UNIQUE (ticket_id) \
             DEFERRABLE INITIALLY DEFERRED",
        )
        .await
        .unwrap();
    let repo = PgHistoryRepository::new(db.pool(2));
    let (a, b) = (seed_900(), seed_901()); // both on ticket-42
    let outcome = process_history_batch(&repo, &[&a, &b]).await;
    match outcome {
        Err(StoreError::Db(err)) => assert_eq!(err.code(), Some(&SqlState::UNIQUE_VIOLATION)),
        other => panic!("expected every event Unknown with the commit's error, got {other:?}"),
    }
    assert_eq!(db.count("inbox").await, 0, "nothing of the batch is kept");
    assert_eq!(db.count("history_events").await, 0);
    // Each alone commits fine: the retry of the same events resolves them.
    assert_eq!(
        process_history_batch(&repo, &[&a]).await.unwrap(),
        vec![Resolution::Applied]
    );
}

#[actix_rt::test]
async fn a_batch_reuses_cached_plans_inside_its_transaction_and_the_session_keeps_planning_afresh()
{
    let db = TestDb::migrated().await;
    // What the foreign-key checks of the batch run under, seen from a trigger on its rows.
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE seen_setting (value text);
             CREATE FUNCTION record_setting() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN INSERT INTO seen_setting VALUES (current_setting('plan_cache_mode'));
             RETURN NULL; END $$;
             CREATE TRIGGER record_setting AFTER INSERT ON history_events
             FOR EACH STATEMENT EXECUTE FUNCTION record_setting();",
        )
        .await
        .unwrap();
    let pool = db.pool(1);
    let repo = PgHistoryRepository::new(pool.clone());
    let (a, b) = (seed_900(), seed_901());
    assert_eq!(
        process_history_batch(&repo, &[&a, &b]).await.unwrap(),
        vec![Resolution::Applied, Resolution::Applied]
    );
    let seen: Vec<String> = db
        .client()
        .await
        .query("SELECT value FROM seen_setting", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(seen, ["auto"]);
    // The same (only) connection afterwards: the setting ended with the transaction.
    let conn = pool.get().await.unwrap();
    let row = conn
        .client
        .query_one("SHOW plan_cache_mode", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, &str>(0), "force_custom_plan");
}
