//! The actor pipeline with a mock Kafka supervisor and a real PostgreSQL.

use std::time::Duration;

use history_service::actors::Pipeline;
use history_service::actors::messages::{FlowControl, Record, TopicPartition};
use history_service::config::PipelineSettings;
use history_service::dev::workload::{event_payload, seed_records};
use history_service::metrics::Stats;

use crate::common::{TestDb, test_settings};
use crate::mock_kafka::Harness;

const WAIT: Duration = Duration::from_secs(20);

fn pipeline_settings(tweak: impl FnOnce(&mut PipelineSettings)) -> PipelineSettings {
    let mut settings = test_settings(
        "postgres://unused@127.0.0.1/unused",
        "unused:9092",
        "g",
        "t",
    )
    .pipeline;
    tweak(&mut settings);
    settings
}

fn start(db: &TestDb, settings: &PipelineSettings) -> Harness {
    Harness::start(Pipeline::start(settings, db.pool(8), Stats::new()))
}

fn record(offset: i64, payload: Vec<u8>) -> Record {
    Record {
        offset,
        key: Some(b"ticket".to_vec()),
        payload: Some(payload),
        timestamp_ms: None,
    }
}

/// A valid event payload whose id is `evt-{n}`.
fn event(n: i64) -> Vec<u8> {
    event_payload(
        &format!("evt-{n}"),
        &format!("ticket-{}", n % 7),
        "open",
        "closed",
        chrono::Utc::now(),
    )
}

fn events(offsets: std::ops::Range<i64>) -> Vec<Record> {
    offsets.map(|n| record(n, event(n))).collect()
}

/// Offsets 0..5 resolve; then 5..10 are fetched while another session holds `evt-5`'s inbox
/// marker uncommitted, so offset 5 blocks in the database and some of 6..9 resolve behind it.
/// The returned session keeps the lock until it runs `ROLLBACK`.
async fn resolve_5_then_block_at_5(
    db: &TestDb,
    harness: &Harness,
    tp: &TopicPartition,
) -> tokio_postgres::Client {
    let blocker = db.client().await;
    blocker
        .batch_execute("BEGIN; INSERT INTO inbox VALUES ('evt-5')")
        .await
        .unwrap();
    harness.inject(tp, events(0..5)).await;
    let deadline = std::time::Instant::now() + WAIT;
    while harness.windows().await[0].position != Some(5) {
        assert!(std::time::Instant::now() < deadline);
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    harness.inject(tp, events(5..10)).await;
    actix_rt::time::sleep(Duration::from_millis(200)).await;
    blocker
}

#[actix_rt::test]
async fn the_seed_scenario_at_offsets_0_1_2_commits_3_and_writes_two_rows() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("tickets.status.v1", 0);
    harness.assign(&tp, 1).await;
    let records = seed_records()
        .into_iter()
        .enumerate()
        .map(|(offset, planned)| record(offset as i64, planned.payload.unwrap()))
        .collect();
    harness.inject(&tp, records).await;

    harness.wait_committed(&tp, 3, WAIT).await;
    assert_eq!(db.count("inbox").await, 2);
    assert_eq!(db.count("history_events").await, 2);
    let stats = harness.pipeline.stats().snapshot();
    assert_eq!((stats.applied, stats.already_applied), (2, 1));
    harness.stop();
}

#[actix_rt::test]
async fn a_record_blocked_in_the_database_holds_the_commit_while_later_ones_resolve() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|p| p.writers = 4));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;

    // Another session holds evt-0's inbox marker uncommitted: the writer of offset 0 waits.
    let mut blocker = db.client().await;
    let lock = blocker.transaction().await.unwrap();
    lock.execute("INSERT INTO inbox VALUES ('evt-0')", &[])
        .await
        .unwrap();

    harness.inject(&tp, events(0..40)).await;
    // Later records resolve out of order, on the other writers...
    let deadline = std::time::Instant::now() + WAIT;
    while db.count("history_events").await == 0 {
        assert!(std::time::Instant::now() < deadline, "nothing resolved");
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    // ...but nothing is committed past the unresolved offset 0.
    assert_eq!(harness.committed(&tp), None);
    let window = &harness.windows().await[0];
    assert_eq!(window.position, None);
    assert!(window.unresolved < 40, "{window:?}");

    lock.rollback().await.unwrap();
    harness.wait_committed(&tp, 40, WAIT).await;
    assert_eq!(db.count("history_events").await, 40);
    harness.stop();
}

#[actix_rt::test]
async fn an_unknown_outcome_blocks_the_commit_until_the_database_recovers() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|p| p.writers = 4));
    let tp = TopicPartition::new("t", 3);
    harness.assign(&tp, 7).await;

    harness.inject(&tp, events(0..5)).await;
    harness.wait_committed(&tp, 5, WAIT).await;
    // The database rejects offset 5's event until the constraint is dropped: its writer's
    // batches fail (Unknown) and are retried with backoff.
    let admin = db.client().await;
    admin
        .batch_execute(
            "ALTER TABLE history_events ADD CONSTRAINT outage CHECK (event_id <> 'evt-5')",
        )
        .await
        .unwrap();
    harness.inject(&tp, events(5..30)).await;

    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let stats = harness.pipeline.stats().snapshot();
        if stats.retries >= 2 && harness.committed(&tp) == Some(5) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{stats:?} committed {:?}",
            harness.committed(&tp)
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    actix_rt::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        harness.committed(&tp),
        Some(5),
        "never past the unknown offset 5"
    );
    let window = &harness.windows().await[0];
    assert!(window.unresolved >= 1, "{window:?}");
    assert!(
        db.count("history_events").await > 5,
        "records after offset 5 are resolved meanwhile"
    );

    admin
        .batch_execute("ALTER TABLE history_events DROP CONSTRAINT outage")
        .await
        .unwrap();
    harness.wait_committed(&tp, 30, WAIT).await;
    assert_eq!(db.count("history_events").await, 30);
    assert!(harness.pipeline.stats().snapshot().unknown > 0);
    harness.stop();
}

#[actix_rt::test]
async fn the_window_cap_pauses_the_partition_and_resumes_it_when_drained() {
    let db = TestDb::migrated().await;
    let cap = 50;
    let harness = start(
        &db,
        &pipeline_settings(|p| {
            p.max_in_flight_per_partition = cap;
            p.batch_max_events = 7;
        }),
    );
    let tp = TopicPartition::new("t", 1);
    harness.assign(&tp, 1).await;

    let mut blocker = db.client().await;
    let lock = blocker.transaction().await.unwrap();
    lock.execute("INSERT INTO inbox VALUES ('evt-0')", &[])
        .await
        .unwrap();

    // A backlog twenty times the cap, delivered in several fetches.
    for chunk in 0..10 {
        harness
            .inject(&tp, events(chunk * 100..chunk * 100 + 100))
            .await;
    }
    let mut max_seen = 0;
    for _ in 0..50 {
        for window in harness.windows().await {
            max_seen = max_seen.max(window.len);
        }
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(max_seen, cap, "the window fills to the cap and no further");
    assert!(
        harness
            .log
            .lock()
            .unwrap()
            .flow
            .contains(&FlowControl::Pause {
                tp: tp.clone(),
                epoch: 1
            }),
        "a full window pauses the partition"
    );

    lock.rollback().await.unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while harness.committed(&tp) != Some(1000) {
        for window in harness.windows().await {
            max_seen = max_seen.max(window.len);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            harness.windows().await
        );
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(max_seen <= cap, "window grew to {max_seen}");
    assert!(
        harness
            .log
            .lock()
            .unwrap()
            .flow
            .contains(&FlowControl::Resume {
                tp: tp.clone(),
                epoch: 1
            }),
        "a drained window resumes the partition"
    );
    assert_eq!(db.count("history_events").await, 1000);
    harness.stop();
}

#[actix_rt::test]
async fn gaps_duplicates_and_several_partitions_are_handled() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let a = TopicPartition::new("t", 0);
    let b = TopicPartition::new("t", 1);
    harness.assign(&a, 1).await;
    harness.assign(&b, 2).await;
    // Partition a: gaps (compacted offsets) and a redelivered offset; b: the same events again
    // at other offsets (duplicates across partitions).
    harness
        .inject(
            &a,
            vec![
                record(10, event(1)),
                record(13, event(2)),
                record(20, event(3)),
                record(20, event(3)),
                record(21, event(4)),
            ],
        )
        .await;
    harness
        .inject(
            &b,
            vec![
                record(0, event(1)),
                record(1, event(2)),
                record(2, event(5)),
            ],
        )
        .await;
    harness.wait_committed(&a, 22, WAIT).await;
    harness.wait_committed(&b, 3, WAIT).await;
    assert_eq!(db.count("history_events").await, 5);
    let stats = harness.pipeline.stats().snapshot();
    assert_eq!(stats.applied, 5);
    assert_eq!(stats.already_applied, 2);
    harness.stop();
}

#[actix_rt::test]
async fn poison_records_are_dead_lettered_and_resolve_their_offsets() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    let mut records = events(0..3);
    records.push(record(3, b"not json".to_vec()));
    records.push(Record {
        offset: 4,
        key: None,
        payload: None,
        timestamp_ms: Some(1_700_000_000_000),
    });
    records.extend(events(5..7));
    harness.inject(&tp, records).await;
    harness.wait_committed(&tp, 7, WAIT).await;
    assert_eq!(db.count("history_events").await, 5);
    assert_eq!(db.count("dead_letters").await, 2);
    harness.stop();
}

#[actix_rt::test]
async fn a_revoked_partition_hands_over_its_position_and_later_outcomes_are_discarded() {
    let db = TestDb::migrated().await;
    let harness = start(
        &db,
        &pipeline_settings(|p| p.commit_interval_ms = 3_600_000),
    );
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;

    let blocker = resolve_5_then_block_at_5(&db, &harness, &tp).await;

    let positions = harness
        .kafka
        .send(crate::mock_kafka::RevokePartition(tp.clone()))
        .await
        .unwrap();
    assert_eq!(positions.len(), 1);
    assert_eq!((positions[0].offset, positions[0].epoch), (5, 1));

    // The blocked write completes after the revoke: its outcome belongs to a dead epoch.
    blocker.batch_execute("ROLLBACK").await.unwrap();
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    assert!(
        harness.windows().await.is_empty(),
        "the revoked window is gone"
    );
    assert!(harness.log.lock().unwrap().commits.is_empty());

    // A new assignment starts clean, from wherever the group's position is.
    harness.assign(&tp, 2).await;
    harness.inject(&tp, events(5..12)).await;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let windows = harness.windows().await;
        if windows.first().and_then(|w| w.position) == Some(12) {
            assert_eq!(windows[0].epoch, 2);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{windows:?}");
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(db.count("history_events").await, 12);
    harness.stop();
}

#[actix_rt::test]
async fn a_lost_assignment_commits_nothing_and_discards_later_outcomes() {
    let db = TestDb::migrated().await;
    let harness = start(
        &db,
        &pipeline_settings(|p| p.commit_interval_ms = 3_600_000),
    );
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;

    let blocker = resolve_5_then_block_at_5(&db, &harness, &tp).await;

    // Resolved offsets 0..5 are not committed: another member may own the partition already,
    // and a commit from a fenced member could move the group's position under the new owner.
    harness
        .kafka
        .send(crate::mock_kafka::LosePartition(tp.clone()))
        .await
        .unwrap();
    assert!(
        harness.windows().await.is_empty(),
        "the lost window is gone"
    );

    blocker.batch_execute("ROLLBACK").await.unwrap();
    actix_rt::time::sleep(Duration::from_millis(500)).await;
    assert!(
        harness.windows().await.is_empty(),
        "an outcome of the lost epoch does not bring its window back"
    );
    let positions = harness.pipeline.drain(WAIT).await;
    assert!(
        positions.is_empty(),
        "shutdown commits nothing: {positions:?}"
    );
    assert!(harness.log.lock().unwrap().commits.is_empty());
    // The rows themselves are safe: the next owner re-reads 0.. and finds them applied.
    let deadline = std::time::Instant::now() + WAIT;
    while db.count("history_events").await != 10 {
        assert!(std::time::Instant::now() < deadline);
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    harness.stop();
}

#[actix_rt::test]
async fn drain_waits_for_in_flight_records_and_returns_the_final_positions() {
    let db = TestDb::migrated().await;
    let harness = start(
        &db,
        &pipeline_settings(|p| {
            p.commit_interval_ms = 3_600_000;
            p.batch_linger_ms = 200;
        }),
    );
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    harness.inject(&tp, events(0..500)).await;
    // Ask right away: the writers are still lingering or writing.
    let positions = harness.pipeline.drain(WAIT).await;
    assert_eq!(positions.len(), 1);
    assert_eq!(positions[0].offset, 500);
    assert_eq!(db.count("history_events").await, 500);
    harness.stop();
}
