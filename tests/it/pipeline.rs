//! The actor pipeline with a mock Kafka supervisor and a real PostgreSQL.

use std::time::Duration;

use history_devkit::workload::{event_payload, seed_records};
use history_service::actors::Pipeline;
use history_service::actors::messages::{CommitReason, Record, TopicPartition, WindowSnapshot};
use history_service::config::PipelineSettings;
use history_service::metrics::Stats;

use crate::common::{TestDb, test_settings};
use crate::mock_kafka::{Flow, Harness};

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
    let blocker = hold(db, "evt-5").await;
    harness.inject(tp, events(0..5)).await;
    let deadline = std::time::Instant::now() + WAIT;
    while harness.windows().await[0].position != Some(5) {
        assert!(std::time::Instant::now() < deadline);
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    harness.inject(tp, events(5..10)).await;
    wait_caught_up(db, harness, 5).await;
    blocker
}

/// Waits until at least `rows` history rows are written and the committer has heard of every
/// row written (one row per offset: unique events), so what is unresolved now is held up.
async fn wait_caught_up(db: &TestDb, harness: &Harness, rows: i64) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let written = db.count("history_events").await;
        let windows = harness.windows().await;
        let resolved = windows
            .first()
            .map(|w| w.position.unwrap_or(0) + (w.len - w.unresolved) as i64);
        if written >= rows && resolved == Some(written) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{written} rows, {windows:?}"
        );
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the (only) window satisfies `condition`.
async fn wait_window(harness: &Harness, condition: impl Fn(&WindowSnapshot) -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let windows = harness.windows().await;
        if windows.first().is_some_and(&condition) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{windows:?}");
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Holds `event_id`'s inbox marker in an open transaction: its write waits until `ROLLBACK`.
async fn hold(db: &TestDb, event_id: &str) -> tokio_postgres::Client {
    let blocker = db.client().await;
    blocker
        .batch_execute(&format!("BEGIN; INSERT INTO inbox VALUES ('{event_id}')"))
        .await
        .unwrap();
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
    wait_caught_up(&db, &harness, 1).await;
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
    // Records after offset 5 resolve, and still nothing is committed past it.
    wait_caught_up(&db, &harness, 6).await;
    assert_eq!(
        harness.committed(&tp),
        Some(5),
        "never past the unknown offset 5"
    );
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
    // Everything handed over either fills the window to the cap or waits outside it: without
    // the cap the window would take all 1,000 and nothing would wait.
    let (window, queued) = harness
        .wait_until(
            "the window at its cap and the rest queued outside it",
            WAIT,
            async |h| {
                let window = h.windows().await.first().map_or(0, |w| w.len);
                (window, h.queued(&tp).await)
            },
            |&(window, queued)| window == cap && queued == 1000 - cap,
        )
        .await;
    assert_eq!((window, queued), (cap, 1000 - cap));
    assert!(
        harness
            .log
            .lock()
            .unwrap()
            .flow
            .contains(&Flow::Paused(tp.clone(), 1)),
        "a full window pauses the partition"
    );
    let mut max_seen = window;

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
            .contains(&Flow::Resumed(tp.clone(), 1)),
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
    // Partition a: gaps (compacted offsets) and an offset delivered again (within one
    // assignment, the log moved back to it: the record is processed again, as new); b: the same
    // events again at other offsets (duplicates across partitions).
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
    assert_eq!(stats.already_applied, 3);
    harness.stop();
}

/// Waits until at least `rows` history rows are written.
async fn wait_caught_up_to(db: &TestDb, harness: &Harness, rows: i64) {
    harness
        .wait_until(
            "rows written",
            WAIT,
            async |_| db.count("history_events").await,
            |written| *written >= rows,
        )
        .await;
}

/// An event of its own id at `offset`: the record a log that moved back has there now.
fn other_record(offset: i64, id: &str) -> Record {
    record(
        offset,
        event_payload(id, "ticket-9", "open", "closed", chrono::Utc::now()),
    )
}

/// The log moves back within the assignment (a topic deleted and created again under the
/// same name): records 0..10 were written and committed; then offsets 0..5 come again, other
/// events now, the one at 3 held up in the database. They are tracked as new: the
/// committed position goes back to the rewind and never passes the held-up record until it
/// is written; then it reaches the new end. (Dispatched untracked, as before, the position
/// stayed at 10 while the new records were written, and one rejected at 3 was lost.)
#[actix_rt::test]
async fn a_log_that_moves_back_is_tracked_anew_and_nothing_passes_its_unresolved_records() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    harness.inject(&tp, events(0..10)).await;
    harness.wait_committed(&tp, 10, WAIT).await;

    let again: Vec<Record> = (0..5)
        .map(|n| other_record(n, &format!("created-again-{n}")))
        .collect();
    // 0..3 written: the group's position goes back to 3 — the new log's truth.
    harness.inject(&tp, again[..3].to_vec()).await;
    harness.wait_last_committed(&tp, 3, WAIT).await;
    let blocker = hold(&db, "created-again-3").await;
    harness.inject(&tp, again[3..].to_vec()).await;
    wait_window(&harness, |w| {
        w.position == Some(3) && w.unresolved >= 1 && w.len == 2
    })
    .await;
    wait_caught_up_to(&db, &harness, 10 + 3).await;
    let commits = harness.commits_of(&tp);
    let rewound_at = commits.iter().position(|&offset| offset < 10).unwrap();
    assert!(
        commits[rewound_at..].iter().all(|&offset| offset <= 3),
        "committed past the held-up record: {commits:?}"
    );
    blocker.batch_execute("ROLLBACK").await.unwrap();
    harness.wait_last_committed(&tp, 5, WAIT).await;
    assert_eq!(db.count("history_events").await, 15);
    assert_eq!(harness.pipeline.stats().snapshot().applied, 15);
    harness.stop();
}

/// The log moves back to 7 while offset 5 is held up and 6..10 are in flight or written (a
/// log truncated after an unclean leader election): what was tracked from 7 on is forgotten
/// — the late outcomes of those records resolve nothing — the records below 7 still count, and
/// the new records at 7..10 are written and resolve the position to the end.
#[actix_rt::test]
async fn a_log_truncated_under_in_flight_records_forgets_them_and_keeps_what_is_below() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    let blocker = resolve_5_then_block_at_5(&db, &harness, &tp).await;
    // The new records at 7..10, the one at 8 held up as well, so that it is unresolved for
    // certain when the old 8's outcome has long arrived.
    let second = hold(&db, "truncated-8").await;
    let after: Vec<Record> = (7..10)
        .map(|n| other_record(n, &format!("truncated-{n}")))
        .collect();
    harness.inject(&tp, after).await;
    wait_window(&harness, |w| w.position == Some(5)).await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    // 5 and 6 (below the truncation) count; the new 7 resolves; the new 8 holds the position.
    wait_window(&harness, |w| w.position == Some(8) && w.unresolved >= 1).await;
    assert!(harness.committed(&tp) <= Some(8));
    second.batch_execute("ROLLBACK").await.unwrap();
    harness.wait_last_committed(&tp, 10, WAIT).await;
    assert_eq!(db.count("history_events").await, 10 + 3);
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

/// A record whose offset is `offset` but whose event is `evt-{event}`: what a recreated topic
/// (or a test) can put at an offset another assignment already read.
fn other_event_at(offset: i64, event: i64) -> Record {
    record(offset, self::event(event))
}

/// Waits until the committer discarded `count` outcomes of ended assignments, or until the
/// window moved past `offset` (which a stale outcome must never cause).
async fn wait_stale_or_moved(harness: &Harness, count: u64, offset: i64) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let windows = harness.windows().await;
        let moved = windows.first().and_then(|w| w.position) > Some(offset);
        if moved || harness.stale_outcomes().await >= count {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{windows:?}");
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until a session of the test's database waits for a lock: a write that reached the
/// database is held there by a [`hold`].
async fn wait_lock_waiter(db: &TestDb) {
    let deadline = std::time::Instant::now() + WAIT;
    while db.lock_waiters().await == 0 {
        assert!(std::time::Instant::now() < deadline, "no write waits");
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A revoke leaves the work no writer has started to the partition's next owner: with the
/// writers still lingering, none of the 200 admitted records is written, the revoke answers at
/// once with no position, and the next owner (a new epoch) writes all 200 — each once: had the
/// revoked epoch written any, the next owner would find it `AlreadyApplied`.
#[actix_rt::test]
async fn a_revoke_leaves_the_work_no_writer_started_to_the_next_owner() {
    let db = TestDb::migrated().await;
    let stats = Stats::new();
    let settings = pipeline_settings(|p| {
        p.commit_interval_ms = 3_600_000;
        // The writers are still lingering when the revoke arrives.
        p.batch_linger_ms = 300;
    });
    let harness = Harness::start(Pipeline::start(&settings, db.pool(8), stats.clone()));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    harness.inject(&tp, events(0..200)).await;
    wait_window(&harness, |w| w.len == 200).await;

    let positions = harness
        .kafka
        .send(crate::mock_kafka::RevokePartition(tp.clone(), WAIT))
        .await
        .unwrap();
    assert_eq!(
        positions,
        Vec::new(),
        "nothing written, nothing to hand over"
    );
    assert!(harness.windows().await.is_empty());

    harness.assign(&tp, 2).await;
    harness.inject(&tp, events(0..200)).await;
    wait_window(&harness, |w| w.epoch == 2 && w.position == Some(200)).await;
    assert_eq!(db.count("history_events").await, 200);
    let applied_twice = stats
        .already_applied
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(applied_twice, 0, "the revoked epoch wrote withdrawn work");
    harness.stop();
}

/// A revoke waits for the transaction under way and hands over everything it wrote; the
/// unstarted work behind it is left to the next owner, and nothing is written past the position
/// handed over (which the next owner would do again). One writer, batches of 20: the batch
/// 140..160 waits in the database (`evt-150` held), 160..200 wait in the writer's buffer.
#[actix_rt::test]
async fn a_revoke_hands_over_what_is_being_written_and_nothing_is_written_past_it() {
    let db = TestDb::migrated().await;
    let harness = start(
        &db,
        &pipeline_settings(|p| {
            p.commit_interval_ms = 3_600_000;
            p.writers = 1;
            p.batch_max_events = 20;
        }),
    );
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    let blocker = hold(&db, "evt-150").await;
    harness.inject(&tp, events(0..200)).await;
    wait_lock_waiter(&db).await;

    let revoke = actix_rt::spawn(
        harness
            .kafka
            .send(crate::mock_kafka::RevokePartition(tp.clone(), WAIT)),
    );
    // The revoke waits for the held batch; the committer answers this after it took the
    // unstarted jobs back.
    harness.windows().await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let positions = revoke.await.unwrap().unwrap();
    assert_eq!(
        positions.iter().map(|p| p.offset).collect::<Vec<_>>(),
        vec![160],
        "what was written is handed over, up to the end of the batch under way"
    );
    assert_eq!(db.count("history_events").await, 160);
    harness.stop();
}

#[actix_rt::test]
async fn a_revoked_partition_admits_nothing_new_while_it_drains() {
    let db = TestDb::migrated().await;
    let harness = start(
        &db,
        &pipeline_settings(|p| {
            p.commit_interval_ms = 3_600_000;
            p.max_in_flight_per_partition = 5;
            // One writer: 0..5 make one transaction, which evt-0 holds up in the database.
            p.writers = 1;
        }),
    );
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    // evt-0 waits in the database; the window fills with 0..5 and 5..20 wait in the actor.
    let blocker = hold(&db, "evt-0").await;
    harness.inject(&tp, events(0..20)).await;
    wait_window(&harness, |w| w.len == 5).await;
    wait_lock_waiter(&db).await;

    let revoke = harness
        .kafka
        .send(crate::mock_kafka::RevokePartition(tp.clone(), WAIT));
    let revoke = actix_rt::spawn(revoke);
    // The revoke has begun when the window stops accepting: then let offset 0 resolve. The
    // partition actor, told the window drained, asks to admit 5..10 — which must be refused.
    harness
        .kafka
        .send(crate::mock_kafka::Barrier)
        .await
        .unwrap();
    // The mock has asked the committer to revoke; this inspection queues behind that request.
    harness.windows().await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    let positions = revoke.await.unwrap().unwrap();
    assert_eq!(
        positions.iter().map(|p| p.offset).collect::<Vec<_>>(),
        vec![5],
        "only what was admitted before the revoke is handed over"
    );
    assert_eq!(db.count("history_events").await, 5);
    harness.stop();
}

#[actix_rt::test]
async fn a_revoke_deadline_hands_over_the_contiguous_position_and_stale_outcomes_are_discarded() {
    let db = TestDb::migrated().await;
    // One event per transaction: a held-up event holds up no other.
    let harness = start(
        &db,
        &pipeline_settings(|p| {
            p.commit_interval_ms = 50;
            p.batch_max_events = 1;
        }),
    );
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    let blocker = resolve_5_then_block_at_5(&db, &harness, &tp).await;

    // Offset 5 stays blocked past the deadline: 6..9 are written but not covered.
    let positions = harness
        .kafka
        .send(crate::mock_kafka::RevokePartition(
            tp.clone(),
            Duration::from_millis(200),
        ))
        .await
        .unwrap();
    assert!(positions.iter().all(|p| p.offset == 5), "{positions:?}");
    assert_eq!(harness.committed(&tp), Some(5));

    // The next assignment finds another event at offset 5 (a recreated topic), itself held
    // up in the database. Epoch 1's write of evt-5 then completes: its outcome must not
    // resolve epoch 2's offset 5, whose event is not written.
    harness.assign(&tp, 2).await;
    let second = hold(&db, "evt-105").await;
    harness
        .inject(&tp, vec![other_event_at(5, 105), other_event_at(6, 106)])
        .await;
    wait_window(&harness, |w| w.epoch == 2 && w.len == 2).await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    wait_stale_or_moved(&harness, 1, 4).await;
    let window = &harness.windows().await[0];
    assert_eq!(
        (window.epoch, window.position),
        (2, None),
        "an outcome of the revoked epoch resolved the new epoch's offset 5: {window:?}"
    );

    second.batch_execute("ROLLBACK").await.unwrap();
    harness.wait_committed(&tp, 7, WAIT).await;
    {
        let log = harness.log.lock().unwrap();
        assert!(
            log.commits.iter().all(|c| c.epoch == 2 || c.offset <= 5),
            "{:?}",
            log.commits
        );
    }
    harness.stop();
}

#[actix_rt::test]
async fn a_lost_assignment_commits_nothing_and_discards_later_outcomes() {
    let db = TestDb::migrated().await;
    let harness = start(
        &db,
        &pipeline_settings(|p| {
            p.commit_interval_ms = 3_600_000;
            p.batch_max_events = 1;
        }),
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

    // Rejoined: the group's position is still 0 and offset 5 now holds another event.
    harness.assign(&tp, 2).await;
    let second = hold(&db, "evt-105").await;
    let mut again = events(0..5);
    again.push(other_event_at(5, 105));
    harness.inject(&tp, again).await;
    wait_window(&harness, |w| {
        w.epoch == 2 && w.len + w.position.unwrap_or(0) as usize == 6
    })
    .await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    wait_stale_or_moved(&harness, 1, 5).await;
    // Epoch 2's own 0..5 resolve as AlreadyApplied; its offset 5 (evt-105) stays held up.
    wait_window(&harness, |w| w.position == Some(5)).await;
    assert_eq!(
        harness.windows().await[0].position,
        Some(5),
        "an outcome of the lost epoch moved the new epoch's position"
    );
    let report = harness.pipeline.drain(Duration::from_millis(100)).await;
    assert_eq!(
        report
            .positions
            .iter()
            .map(|p| (p.epoch, p.offset))
            .collect::<Vec<_>>(),
        vec![(2, 5)],
        "only the new assignment's position is handed over"
    );
    assert!(harness.log.lock().unwrap().commits.is_empty());
    second.batch_execute("ROLLBACK").await.unwrap();
    harness.stop();
}

#[actix_rt::test]
async fn a_refused_commit_is_retried_until_the_broker_confirms_it() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|p| p.commit_interval_ms = 20));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    harness.refuse_commits(3);
    harness.inject(&tp, events(0..10)).await;
    // The partition goes idle after this: only a retry of the refused position commits it.
    harness.wait_committed(&tp, 10, WAIT).await;
    {
        let log = harness.log.lock().unwrap();
        assert_eq!(log.refuse_next, 0);
        assert!(log.refused.len() >= 3, "{:?}", log.refused);
    }
    wait_window(&harness, |w| w.confirmed == Some(10)).await;
    harness.stop();
}

/// The confirmed position of an idle partition is committed again every tenth tick: were the
/// group's position lowered by another member meanwhile (a broker's double assignment), it
/// would otherwise stay lowered for as long as the partition stays idle.
#[actix_rt::test]
async fn an_idle_partitions_confirmed_position_is_reasserted_now_and_then() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|p| p.commit_interval_ms = 20));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    harness.inject(&tp, events(0..10)).await;
    harness.wait_committed(&tp, 10, WAIT).await;
    let deadline = std::time::Instant::now() + WAIT;
    let commits_of_10 = || {
        let log = harness.log.lock().unwrap();
        log.commits.iter().filter(|p| p.offset == 10).count()
    };
    while commits_of_10() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "position 10 committed {} times, not re-asserted",
            commits_of_10()
        );
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        harness
            .log
            .lock()
            .unwrap()
            .commits
            .iter()
            .all(|p| p.offset <= 10),
        "nothing beyond what was written"
    );
    harness.stop();
}

#[actix_rt::test]
async fn drain_returns_a_position_whose_periodic_commit_was_refused() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|p| p.commit_interval_ms = 20));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    harness.refuse_commits(usize::MAX);
    harness.inject(&tp, events(0..10)).await;
    wait_window(&harness, |w| w.position == Some(10)).await;
    let deadline = std::time::Instant::now() + WAIT;
    // The periodic commit asked for 10, and the broker refused it.
    while !harness
        .log
        .lock()
        .unwrap()
        .refused
        .iter()
        .any(|p| p.offset == 10)
    {
        assert!(std::time::Instant::now() < deadline);
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    let report = harness.pipeline.drain(WAIT).await;
    assert_eq!(
        report
            .positions
            .iter()
            .map(|p| p.offset)
            .collect::<Vec<_>>(),
        vec![10],
        "a refused commit is not a commit: shutdown must commit it again"
    );
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
    wait_window(&harness, |w| {
        w.len + w.position.unwrap_or(0) as usize == 500
    })
    .await;
    // Stop the partition actor first, as shutdown does: what it admitted still completes.
    harness
        .kafka
        .send(crate::mock_kafka::StopAll)
        .await
        .unwrap();
    // Ask right away: the writers are still lingering or writing. A drain that ran out its
    // deadline would report records still unresolved.
    let report = harness.pipeline.drain(WAIT).await;
    assert_eq!((report.unresolved, report.resolved_behind), (0, 0));
    assert_eq!(report.positions.len(), 1);
    assert_eq!(report.positions[0].offset, 500);
    assert_eq!(db.count("history_events").await, 500);
    harness.stop();
}

#[actix_rt::test]
async fn drain_at_its_deadline_reports_what_is_left() {
    let db = TestDb::migrated().await;
    let harness = start(
        &db,
        &pipeline_settings(|p| p.commit_interval_ms = 3_600_000),
    );
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    let blocker = resolve_5_then_block_at_5(&db, &harness, &tp).await;
    let report = harness.pipeline.drain(Duration::from_millis(100)).await;
    assert_eq!(
        report
            .positions
            .iter()
            .map(|p| p.offset)
            .collect::<Vec<_>>(),
        vec![5]
    );
    assert!(report.unresolved >= 1, "{report:?}");
    assert_eq!(report.unresolved + report.resolved_behind, 5, "{report:?}");
    blocker.batch_execute("ROLLBACK").await.unwrap();
    harness.stop();
}

/// What the partition's previous owner listed as done above `position`, as the Kafka side hands
/// it to the committer when the partition is assigned.
fn inherit(harness: &Harness, tp: &TopicPartition, position: i64, runs: &[(i64, i64)]) {
    use history_service::actors::messages::{Inherit, InheritedDone};
    use history_service::offsets::{DoneOffsets, Run};
    harness
        .pipeline
        .committer()
        .do_send(Inherit(vec![InheritedDone {
            tp: tp.clone(),
            epoch: 1,
            position,
            done: DoneOffsets::from_runs(runs.iter().map(|&(first, last)| Run { first, last })),
        }]));
}

/// The event ids written, in offset order of their records (`evt-{n}` or another id).
async fn written_ids(db: &TestDb) -> Vec<String> {
    db.client()
        .await
        .query("SELECT event_id FROM history_events ORDER BY event_id", &[])
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.get(0))
        .collect()
}

#[actix_rt::test]
async fn records_the_previous_owner_listed_as_done_are_skipped_and_the_rest_written() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    inherit(&harness, &tp, 10, &[(12, 15), (18, 18)]);
    harness.inject(&tp, events(10..20)).await;
    harness.wait_last_committed(&tp, 20, WAIT).await;
    let mut expected: Vec<String> = [10, 11, 16, 17, 19]
        .iter()
        .map(|n| format!("evt-{n}"))
        .collect();
    expected.sort();
    assert_eq!(written_ids(&db).await, expected);
    assert_eq!(harness.pipeline.stats().snapshot().applied, 5);
    harness.stop();
}

#[actix_rt::test]
async fn a_list_is_not_used_when_the_records_come_from_below_its_position() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    // The group's position was moved back below the listed one (an operator's reset): the
    // records from there on are read again, all of them.
    inherit(&harness, &tp, 10, &[(11, 19)]);
    harness.inject(&tp, events(5..20)).await;
    harness.wait_last_committed(&tp, 20, WAIT).await;
    assert_eq!(db.count("history_events").await, 15);
    harness.stop();
}

#[actix_rt::test]
async fn a_list_is_dropped_when_the_log_moves_back() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    inherit(&harness, &tp, 10, &[(12, 19)]);
    harness.inject(&tp, events(10..12)).await;
    harness.wait_last_committed(&tp, 12, WAIT).await;
    // The log moved back to 11 (truncated, re-created): 11..15 are new records, none of them
    // the ones the previous owner wrote.
    let again: Vec<Record> = (11..15)
        .map(|n| other_record(n, &format!("moved-back-{n}")))
        .collect();
    harness.inject(&tp, again).await;
    harness.wait_last_committed(&tp, 15, WAIT).await;
    assert_eq!(db.count("history_events").await, 2 + 4);
    harness.stop();
}

/// A position held back by one record is committed again as what is written behind it grows,
/// each commit listing it: the next owner's list is never older than a commit interval.
#[actix_rt::test]
async fn a_held_position_is_committed_again_listing_what_resolved_behind_it() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    let blocker = resolve_5_then_block_at_5(&db, &harness, &tp).await;
    // Events go to the writers by a hash of their id with a seed of the process's: evt-6..9
    // all share the writer blocked behind evt-5 in one run of sixteen, and then nothing
    // resolves behind it. Twenty more make that one in a million.
    harness.inject(&tp, events(10..30)).await;
    let listing = |harness: &Harness| {
        harness
            .positions_of(&tp)
            .into_iter()
            .find(|(position, _)| position.offset == 5 && !position.done.is_empty())
    };
    let deadline = std::time::Instant::now() + WAIT;
    let listed = loop {
        if let Some((position, reason)) = listing(&harness) {
            // Not the re-assertion ten ticks on: the tick after the list grew.
            assert_eq!(reason, CommitReason::Periodic);
            break position.done;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no commit at 5 lists what resolved behind it: {:?}",
            harness.positions_of(&tp)
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    };
    // Everything listed is written; the held record is not listed.
    let written = written_ids(&db).await;
    assert!(!listed.contains(5));
    for run in listed.runs() {
        for offset in run.first..=run.last {
            assert!(
                written.contains(&format!("evt-{offset}")),
                "{offset} listed, not written"
            );
        }
    }
    blocker.batch_execute("ROLLBACK").await.unwrap();
    harness.wait_last_committed(&tp, 30, WAIT).await;
    harness.stop();
}

/// A new owner whose first record is held (the record the previous owner was held at) still
/// commits what it does behind it, at the previous owner's position: otherwise every owner
/// after the first would do its work again — a rolling restart under the `consumer` protocol
/// re-did 625 records so. Only at that position, and only once the list holds more than the
/// previous owner's.
#[actix_rt::test]
async fn a_new_owner_held_at_its_first_record_commits_what_it_does_behind_it() {
    let db = TestDb::migrated().await;
    let harness = start(&db, &pipeline_settings(|_| {}));
    let tp = TopicPartition::new("t", 0);
    harness.assign(&tp, 1).await;
    // The previous owner committed 5, listing 6 and 7 as done.
    inherit(&harness, &tp, 5, &[(6, 7)]);
    let blocker = hold(&db, "evt-5").await;
    harness.inject(&tp, events(5..6)).await;
    let deadline = std::time::Instant::now() + WAIT;
    while db.lock_waiters().await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "evt-5 waits for nothing"
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    // The events route to the two writers by a hash of their ids: of 32, some go to the writer
    // not held by evt-5's transaction.
    harness.inject(&tp, events(6..40)).await;
    // 6 and 7 skipped, some of 8..40 written.
    let listed = loop {
        if let Some((position, _)) = harness
            .positions_of(&tp)
            .into_iter()
            .find(|(position, _)| position.offset == 5 && position.done.count() > 2)
        {
            break position.done;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "nothing committed at 5 while records were written behind it: {:?}",
            harness.positions_of(&tp)
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(!listed.contains(5));
    assert!(listed.contains(6) && listed.contains(7));
    let written = written_ids(&db).await;
    for run in listed.runs() {
        for offset in (run.first..=run.last).filter(|offset| *offset > 7) {
            assert!(
                written.contains(&format!("evt-{offset}")),
                "{offset} listed, not written"
            );
        }
    }
    assert!(
        !written.iter().any(|id| id == "evt-6" || id == "evt-7"),
        "what the previous owner listed is skipped"
    );
    // Nothing was committed below the previous owner's position.
    assert!(
        harness
            .positions_of(&tp)
            .iter()
            .all(|(position, _)| position.offset >= 5)
    );
    blocker.batch_execute("ROLLBACK").await.unwrap();
    harness.wait_last_committed(&tp, 40, WAIT).await;
    harness.stop();
}

/// With the database behind, a writer's batches hold the partitions side by side: the jobs of
/// two partitions queued behind a blocked transaction are written half and half, batch after
/// batch, not one partition's run and then the other's (the writer's `FairQueue`).
#[actix_rt::test]
async fn queued_partitions_share_each_batch() {
    let db = TestDb::migrated().await;
    let harness = start(
        &db,
        &pipeline_settings(|p| {
            p.writers = 1;
            p.batch_max_events = 10;
        }),
    );
    let (first, second) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
    harness.assign(&first, 1).await;
    harness.assign(&second, 1).await;
    let blocker = hold(&db, "blocking").await;
    harness
        .inject(&first, vec![other_record(0, "blocking")])
        .await;
    let deadline = std::time::Instant::now() + WAIT;
    while db.lock_waiters().await == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing waits for the blocker"
        );
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
    let run = |prefix: &str| -> Vec<Record> {
        (1..=40)
            .map(|n| other_record(n, &format!("{prefix}-{n}")))
            .collect()
    };
    harness.inject(&first, run("first")).await;
    harness.inject(&second, run("second")).await;
    // Both runs are queued at the writer before the blocked batch ends.
    wait_window_count(&harness, 2, 40).await;
    blocker.batch_execute("ROLLBACK").await.unwrap();
    harness.wait_last_committed(&second, 41, WAIT).await;
    // Each transaction's rows share its xmin: the batches, in the order they were written.
    let rows = db
        .client()
        .await
        .query(
            "SELECT xmin::text::bigint AS batch, event_id FROM history_events \
             WHERE event_id <> 'blocking' ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    let mut batches: Vec<(i64, usize, usize)> = Vec::new();
    for row in rows {
        let (batch, id): (i64, String) = (row.get(0), row.get(1));
        if batches.last().is_none_or(|(last, _, _)| *last != batch) {
            batches.push((batch, 0, 0));
        }
        let entry = batches.last_mut().unwrap();
        if id.starts_with("first") {
            entry.1 += 1;
        } else {
            entry.2 += 1;
        }
    }
    assert_eq!(batches.len(), 8, "{batches:?}");
    assert!(
        batches.iter().all(|(_, first, second)| first == second),
        "batches of (first, second) rows: {batches:?}"
    );
    harness.stop();
}

/// Waits until `partitions` windows each hold at least `records` unresolved records.
async fn wait_window_count(harness: &Harness, partitions: usize, records: usize) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let windows = harness.windows().await;
        if windows.iter().filter(|w| w.unresolved >= records).count() >= partitions {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{windows:?}");
        actix_rt::time::sleep(Duration::from_millis(10)).await;
    }
}
