//! The budget for fetched records, end to end: the real service, the embedded broker and a real
//! PostgreSQL. Big records while the database is away are held up to the budget in bytes —
//! the gauge says so and the process's memory shows it — and the backlog drains exactly once
//! the database returns, every partition of it.

use std::time::Duration;

use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, RecordKind, event_payload};

use crate::common::events_in_each;
use crate::stuck_events::{planned, reject_ticket_poison};

/// Payload bytes of each record: far above the ≈ 0.5 KB of a ticket event.
const RECORD_BYTES: usize = 256 * 1024;
/// Records per partition: the embedded broker keeps 5 MiB of each.
const PER_PARTITION: usize = 13;
/// The instance's budget in bytes: the service holds at most half of it.
const BUDGET_BYTES: usize = 16 << 20;

/// A valid event padded with white space to `bytes`, or (every third record) a record over
/// `pipeline.max_payload_bytes`, bound for the dead-letter table with its raw bytes.
fn big_records(partitions: i32, prefix: &str) -> Vec<PlannedRecord> {
    let mut records = Vec::new();
    for partition in 0..partitions {
        for n in 0..PER_PARTITION {
            let id = format!("{prefix}-{partition}-{n}");
            let mut payload = event_payload(
                &id,
                &format!("ticket-{partition}"),
                "open",
                "closed",
                chrono::Utc::now(),
            );
            let (size, kind) = if n % 3 == 2 {
                (
                    RECORD_BYTES + 1024,
                    RecordKind::Poison {
                        reason: "oversized",
                    },
                )
            } else {
                (RECORD_BYTES, RecordKind::Event { event_id: id })
            };
            payload.resize(size, b' ');
            records.push(PlannedRecord {
                key: format!("ticket-{partition}").into_bytes(),
                payload: Some(payload),
                partition: Some(partition),
                kind,
            });
        }
    }
    records
}

/// With the service's database refusing connections, a backlog of 256 KB records on
/// `partitions` partitions fills the budget in bytes and stays there: `history_held_bytes`
/// never passes its limit by more than one record, and the process's peak memory stays within
/// its idle size plus the whole budget (the client's half included). Then the database comes
/// back and everything drains exactly: every valid event recorded once, every oversized record
/// dead-lettered once, every partition committed to its end.
async fn big_records_wait_within_the_budget_while_the_database_is_away(partitions: i32) {
    let mut app = prepare_for_big_records(partitions).await;
    app.start();
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_assigned_partitions") == Some(partitions as f64)
    })
    .await;
    // Up to 69 partitions under this budget take turns, each with a queue of its own (4 KiB
    // of fetch each at least); a batch of these records is too large for the turns of more
    // than 3 (the producer's batches of a megabyte), and the first one fetched ends them.
    let in_turn = if partitions <= 64 {
        "partitions take turns"
    } else {
        "not in turn"
    };
    app.wait_for_log(&[in_turn], Duration::from_secs(5)).await;
    let idle_rss_mb = app.process().rss_mb();
    let records = big_records(partitions, &format!("big{partitions}"));
    held_within_the_budget_while_the_database_is_away(&mut app, &records, idle_rss_mb).await;
    let ended = app.logs().contains("partitions no longer take turns");
    assert_eq!(
        ended,
        (4..=64).contains(&partitions),
        "whether the turns ended:\n{}",
        app.logs()
    );
    drained_when_the_database_is_back(app, &records).await;
}

/// The service of `partitions` partitions with the budget of these tests, not started.
async fn prepare_for_big_records(partitions: i32) -> TestApp {
    TestApp::prepare(|o| {
        o.partitions = partitions;
        o.env(
            "HISTORY__PIPELINE__MAX_IN_FLIGHT_BYTES",
            BUDGET_BYTES.to_string(),
        )
        .env(
            "HISTORY__PIPELINE__MAX_PAYLOAD_BYTES",
            (RECORD_BYTES + 512).to_string(),
        )
        .env("HISTORY__PIPELINE__RETRY_MAX_MS", "500");
    })
    .await
}

/// With the service's database refusing connections, `records` are produced: the budget fills
/// and stays full, every partition paused, and the peak memory stays within `idle_rss_mb` plus
/// the budget and a half.
async fn held_within_the_budget_while_the_database_is_away(
    app: &mut TestApp,
    records: &[PlannedRecord],
    idle_rss_mb: f64,
) {
    let partitions = app.partitions;
    let admin = history_devkit::test_db::admin_client().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS false",
            app.db.name
        ))
        .await
        .unwrap();
    app.db.terminate_backends().await;
    app.produce(records).await;

    // The budget fills, stays full past the intake's wait, and every partition is paused.
    let limit = BUDGET_BYTES as f64 / 2.0;
    let over = limit + (RECORD_BYTES + 2048) as f64;
    let metrics = app
        .wait_for_metrics(Duration::from_secs(60), |m| {
            let held = m.get("history_held_bytes").unwrap_or(0.0);
            // Past the bound, the assertion below says so at once.
            held >= over
                || (held >= limit - RECORD_BYTES as f64
                    && m.get("history_instance_pauses_total").unwrap_or(0.0) >= 1.0)
        })
        .await;
    assert_eq!(metrics.get("history_held_bytes_limit"), Some(limit));
    let held = metrics.get("history_held_bytes").unwrap();
    assert!(
        held < over,
        "{held} bytes held, over the limit {limit} by more than one record"
    );
    // Paused, the client hands out nothing more: through several more failed attempts to
    // write, what is held does not change.
    let retries = metrics.get("history_retries_total").unwrap_or(0.0);
    let later = app
        .wait_for_metrics(Duration::from_secs(30), |m| {
            m.get("history_retries_total").unwrap_or(0.0) >= retries + 4.0
        })
        .await
        .get("history_held_bytes")
        .unwrap();
    assert_eq!(
        later, held,
        "what is held changed while the database was away"
    );
    let peak_mb = app.process().peak_rss_mb();
    let budget_mb = BUDGET_BYTES as f64 / (1 << 20) as f64;
    assert!(
        peak_mb <= idle_rss_mb + budget_mb * 1.5,
        "peak RSS {peak_mb:.1} MB with {partitions} partitions: idle {idle_rss_mb:.1} MB + budget \
         {budget_mb} MB"
    );
    eprintln!(
        "{partitions} partitions: held {held} bytes, idle RSS {idle_rss_mb:.1} MB, peak \
         {peak_mb:.1} MB (budget {budget_mb} MB)"
    );
}

/// The database accepts connections again: every valid event of the `records` produced is
/// recorded once, every oversized one dead-lettered once, every partition committed to its end,
/// and nothing is held afterwards.
async fn drained_when_the_database_is_back(mut app: TestApp, records: &[PlannedRecord]) {
    let valid = records
        .iter()
        .filter(|r| matches!(r.kind, RecordKind::Event { .. }))
        .count() as i64;
    let oversized = records.len() as i64 - valid;
    let admin = history_devkit::test_db::admin_client().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} ALLOW_CONNECTIONS true",
            app.db.name
        ))
        .await
        .unwrap();
    app.wait_committed(Duration::from_secs(120)).await;
    assert_eq!(app.db.count("history_events").await, valid);
    assert_eq!(app.db.count("dead_letters").await, oversized);
    app.wait_for_metrics(Duration::from_secs(10), |m| {
        m.get("history_held_bytes") == Some(0.0) && m.get("history_held_records") == Some(0.0)
    })
    .await;
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// Three partitions under this budget take turns, each with a queue of its own (the client's
/// half holds two batches of each): the bound holds there too.
#[actix_rt::test]
async fn big_records_on_3_partitions_in_turn_wait_within_the_budget_while_the_database_is_away() {
    big_records_wait_within_the_budget_while_the_database_is_away(3).await;
}

#[actix_rt::test]
async fn big_records_on_48_partitions_wait_within_the_budget_while_the_database_is_away() {
    big_records_wait_within_the_budget_while_the_database_is_away(48).await;
}

#[actix_rt::test]
async fn big_records_on_96_partitions_wait_within_the_budget_while_the_database_is_away() {
    big_records_wait_within_the_budget_while_the_database_is_away(96).await;
}

/// The turns end on one partition's megabyte batch while the other 47 logs are still empty:
/// those are caught up, in fetch order. Then the backlog arrives, in megabyte batches, while
/// the database is away. The bound holds because no more of those partitions keep queues of
/// their own than the seats the budget holds: the rest are fetched into the one consumer queue,
/// whose limits hold, until the instance pauses. (The earlier design took the caught-up
/// partitions back into queues of their own at the end of the turns, each of which was then
/// sent a batch before it was looked at: 65.6 MB against the bound of 51.9 with all 47 taken
/// back.)
#[actix_rt::test]
async fn a_backlog_arriving_after_the_turns_ended_waits_within_the_budget_while_the_database_is_away()
 {
    const PARTITIONS: i32 = 48;
    let mut app = prepare_for_big_records(PARTITIONS).await;
    app.start();
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_assigned_partitions") == Some(PARTITIONS as f64)
    })
    .await;
    app.wait_for_log(&["partitions take turns"], Duration::from_secs(5))
        .await;
    let idle_rss_mb = app.process().rss_mb();
    let first: Vec<PlannedRecord> = big_records(1, "first");
    let first_valid = first
        .iter()
        .filter(|r| matches!(r.kind, RecordKind::Event { .. }))
        .count() as i64;
    app.produce(&first).await;
    app.wait_for_log(
        &["partitions no longer take turns"],
        Duration::from_secs(60),
    )
    .await;
    // Partition 0 written out and committed; every partition caught up, in fetch order but for
    // the few quiet ones that keep queues of their own (as many as the seats the budget holds,
    // so that the backlog arriving on all of them at once stays within it).
    app.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(app.db.count("history_events").await, first_valid);
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_partitions_in_turn") == Some(0.0)
            && m.get("history_partitions_in_fetch_order") >= Some((PARTITIONS - 8) as f64)
    })
    .await;

    let records = big_records(PARTITIONS, "big-again");
    held_within_the_budget_while_the_database_is_away(&mut app, &records, idle_rss_mb).await;
    let all: Vec<PlannedRecord> = first.into_iter().chain(records).collect();
    drained_when_the_database_is_back(app, &all).await;
}

/// One event the database keeps rejecting, early in partition 2 of 4, with a budget of 1,000
/// records and windows of 1,000: the stuck partition's window fills and pauses it alone, so
/// its records beyond the window wait in the broker, not in the budget — the other partitions
/// drain their 3,000 records each to the end with the budget to themselves. (Were the stuck
/// partition not paused, its later records would queue in the service until they filled the
/// budget, and every partition would stop.) Once the database takes the event, it drains too.
#[actix_rt::test]
async fn a_stuck_partition_is_paused_alone_and_the_others_drain_with_the_budget() {
    const PER_PARTITION: usize = 3000;
    let mut app = TestApp::prepare(|o| {
        o.partitions = 4;
        o.env("HISTORY__PIPELINE__MAX_IN_FLIGHT", "1000")
            .env("HISTORY__PIPELINE__MAX_IN_FLIGHT_PER_PARTITION", "1000")
            .env("HISTORY__PIPELINE__RETRY_MAX_MS", "200");
    })
    .await;
    reject_ticket_poison(&app, true).await;
    let mut records = Vec::new();
    for n in 0..PER_PARTITION {
        for partition in 0..4 {
            records.push(planned(
                &format!("e-{partition}-{n}"),
                &format!("ticket-{n}"),
                partition,
            ));
        }
        if n == 100 {
            records.push(planned("the-poison", "ticket-poison", 2));
        }
    }
    let delivered = app.produce(&records).await;
    let poison = delivered
        .iter()
        .zip(&records)
        .find(|(_, r)| r.key == b"ticket-poison")
        .map(|(d, _)| d.offset)
        .unwrap();
    let ends = app.ends().await;
    let mut held_back = ends.clone();
    held_back[2] = poison;
    app.start();

    app.wait_committed_to(&held_back, Duration::from_secs(60))
        .await;
    let metrics = app.metrics().await;
    assert!(
        metrics.get("history_partition_pauses_total").unwrap_or(0.0) >= 1.0,
        "the stuck partition's window never filled:\n{metrics}"
    );
    assert!(
        app.db.count("history_events").await < (4 * PER_PARTITION) as i64,
        "the stuck partition's records beyond its window waited in the broker"
    );

    reject_ticket_poison(&app, false).await;
    app.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(
        app.db.count("history_events").await,
        (4 * PER_PARTITION + 1) as i64
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// With the database away the budget fills and every partition is paused. A second member
/// joins and takes one of the two partitions, then leaves (its stop cannot drain: the
/// database is away), and the partition comes back to the first member while it is still
/// paused. When the database returns, the first member drains both partitions to their ends:
/// a partition paused, revoked and assigned again fetches again.
#[actix_rt::test]
async fn a_paused_partition_revoked_and_assigned_again_flows_again() {
    let mut first = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env("HISTORY__PIPELINE__MAX_IN_FLIGHT", "200")
            .env("HISTORY__PIPELINE__RETRY_MAX_MS", "200")
            .env("HISTORY__PIPELINE__SHUTDOWN_TIMEOUT_MS", "1000")
            .env("HISTORY__KAFKA__SESSION_TIMEOUT_MS", "6000");
    })
    .await;
    let records: Vec<PlannedRecord> = (0..3000)
        .map(|n| planned(&format!("r-{n}"), &format!("ticket-{n}"), n % 2))
        .collect();
    first.start();
    first
        .wait_for_metrics(Duration::from_secs(30), |m| {
            m.get("history_assigned_partitions") == Some(2.0)
        })
        .await;
    let admin = history_devkit::test_db::admin_client().await;
    let allow = |allow: bool| format!("ALTER DATABASE {} ALLOW_CONNECTIONS {allow}", first.db.name);
    admin.batch_execute(&allow(false)).await.unwrap();
    first.db.terminate_backends().await;
    first.produce(&records).await;
    first
        .wait_for_metrics(Duration::from_secs(30), |m| {
            m.get("history_instance_pauses_total").unwrap_or(0.0) >= 1.0
        })
        .await;

    let mut second = TestApp::spawn(|o| {
        // The schema is there; the database is away, so it must not wait to migrate.
        o.share(&first)
            .env("HISTORY__DATABASE__MIGRATE_ON_START", "false");
    })
    .await;
    second
        .wait_for_metrics(Duration::from_secs(60), |m| {
            m.get("history_assigned_partitions") == Some(1.0)
                && m.get("history_records_fetched_total").unwrap_or(0.0) > 0.0
        })
        .await;
    // Its stop leaves what it took behind its final commit (exit 3): re-read by the first.
    assert_eq!(second.stop(), Some(3), "{}", second.logs());
    first
        .wait_for_metrics(Duration::from_secs(60), |m| {
            m.get("history_assigned_partitions") == Some(2.0)
                && m.get("history_rebalances_total{kind=\"assign\"}")
                    .unwrap_or(0.0)
                    >= 2.0
        })
        .await;

    admin.batch_execute(&allow(true)).await.unwrap();
    first.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(first.db.count("history_events").await, 3000);
    assert_eq!(first.stop(), Some(0), "{}", first.logs());
}

/// Times every partition was paused because the budget stayed full: a hard requirement, the
/// service exports the counter from its start.
async fn instance_pauses(app: &TestApp) -> f64 {
    app.metrics()
        .await
        .get("history_instance_pauses_total")
        .expect("history_instance_pauses_total is exported")
}

/// Holds every write of `app`'s service on a lock this session takes on `inbox`, until the
/// transaction is rolled back.
async fn hang_writes(client: &mut tokio_postgres::Client) -> tokio_postgres::Transaction<'_> {
    let lock = client.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    lock
}

/// A database slower than the intake's least wait for room, but writing: one writer, whose
/// every batch takes 0.7 s. The instance pauses while it learns that pace (its first wait), not
/// at every batch after — each pause throws away what the client prefetched, fetches it again,
/// and cuts the partitions' turns short, for no rebalance at all. Then the database hangs, after
/// a hang of eight seconds it just came back from: the instance pauses all the same, within the
/// most the intake waits (two seconds) although its last wait for room lasted eight.
#[actix_rt::test]
async fn a_slow_database_pauses_the_instance_while_its_pace_is_learned_and_a_hung_one_within_the_most_wait()
 {
    const PARTITIONS: i32 = 3;
    const EACH: usize = 300;
    let mut app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        o.env("HISTORY__PIPELINE__WRITERS", "1")
            .env("HISTORY__PIPELINE__BATCH_MAX_EVENTS", "50")
            .env("HISTORY__PIPELINE__MAX_IN_FLIGHT", "200")
            .env("HISTORY__DATABASE__STATEMENT_TIMEOUT_MS", "30000");
    })
    .await;
    app.produce(&events_in_each(PARTITIONS, 0, EACH, "paced"))
        .await;
    app.db.slow_each_write(0.7).await;
    app.start();

    // Its first wait for room is a batch long, longer than the least wait: one pause, which
    // says the database was slower than that.
    app.wait_rows(150, Duration::from_secs(60)).await;
    let learned = instance_pauses(&app).await;
    assert!(
        learned >= 1.0,
        "the first wait for room outlasted half a second: {learned} pauses"
    );
    app.wait_rows(400, Duration::from_secs(60)).await;
    assert_eq!(
        instance_pauses(&app).await,
        learned,
        "a database writing a batch every 0.7 s paused the instance again after its pace was \
         learned:\n{}",
        app.logs()
    );

    // Hung for eight seconds: paused (the wait outlasts the pace), then room comes.
    let mut locker = app.db.client().await;
    let lock = hang_writes(&mut locker).await;
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_instance_pauses_total") > Some(learned)
    })
    .await;
    let hung_at = std::time::Instant::now();
    while hung_at.elapsed() < Duration::from_secs(8) {
        assert!(
            app.db.lock_waiters().await >= 1,
            "the writer waits on the lock"
        );
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    let written = app.db.count("history_events").await;
    lock.rollback().await.unwrap();
    // Fetching resumes once half of the budget (100 records) is free: two batches.
    app.wait_rows(written + 150, Duration::from_secs(30)).await;

    // Hung again right away: the last wait lasted eight seconds, and three times that would
    // leave the budget full and the client unpolled for half a minute.
    let paused = instance_pauses(&app).await;
    let lock = hang_writes(&mut locker).await;
    app.wait_for_metrics(Duration::from_secs(8), |m| {
        m.get("history_instance_pauses_total") > Some(paused)
    })
    .await;
    lock.rollback().await.unwrap();
    app.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(
        app.db.count("history_events").await,
        PARTITIONS as i64 * EACH as i64
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// Payload bytes of each compressible record: a ticket event with a long note.
const NOTED_BYTES: usize = 20 * 1024;
/// Records per partition of the compressed backlog (24 partitions: 7,200 in all, ~144 MB).
const NOTED_PER_PARTITION: usize = 300;

/// Three brokers leading 24 partitions, a backlog of 7,200 events of 20 KB produced
/// `codec`-compressed by an external client (the confluent-kafka Python client), and the
/// database hung — every write waits on a lock another session holds — for longer than the
/// budget takes to fill. The
/// Kafka client fetches from the three brokers at once and decompresses each response whole,
/// so what it holds depends on the brokers and the codec; its fetches are sized for both: the
/// process's peak memory stays within its idle size plus the whole budget, and
/// `history_held_bytes` within its limit plus one record. Then the lock goes and everything
/// drains exactly. (Sized as before — `fetch.max.bytes` a quarter of the budget, whatever the
/// brokers and the codec — the peak is several times the budget.)
async fn compressed_records_from_three_brokers_wait_within_the_budget(codec: &str) {
    const PARTITIONS: i32 = 24;
    let mut app = TestApp::prepare(|o| {
        o.brokers = 3;
        o.partitions = PARTITIONS;
        o.env(
            "HISTORY__PIPELINE__MAX_IN_FLIGHT_BYTES",
            BUDGET_BYTES.to_string(),
        )
        // The lock is held for longer than one write may wait: attempts end at their deadline
        // and are retried, as they would be on a hung server.
        .env("HISTORY__DATABASE__STATEMENT_TIMEOUT_MS", "3000")
        .env("HISTORY__PIPELINE__RETRY_MAX_MS", "500")
        .env("HISTORY__KAFKA__STATISTICS_INTERVAL_MS", "1000");
    })
    .await;
    let records: Vec<PlannedRecord> = (0..PARTITIONS)
        .flat_map(|partition| {
            (0..NOTED_PER_PARTITION).map(move |n| {
                let id = format!("noted-{partition}-{n}");
                let ticket = format!("ticket-{partition}");
                PlannedRecord {
                    payload: Some(workload::noted_event_payload(
                        &id,
                        &ticket,
                        NOTED_BYTES,
                        (partition as u64) << 32 | n as u64,
                    )),
                    key: ticket.into_bytes(),
                    partition: Some(partition),
                    kind: RecordKind::Event { event_id: id },
                }
            })
        })
        .collect();

    // Its idle size: started on the empty topic, assigned, and stopped again.
    app.start();
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_assigned_partitions") == Some(PARTITIONS as f64)
    })
    .await;
    let idle_rss_mb = app.process().rss_mb();
    assert_eq!(app.stop(), Some(0), "{}", app.logs());

    // The whole backlog waits in the brokers, so that every fetch is as large as its sizing
    // lets it be; and the database hangs: every write waits on a lock this session holds.
    app.produce_externally(
        &records,
        &[("compression.type", codec), ("linger.ms", "50")],
    )
    .await;
    let mut locker = app.db.client().await;
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    app.start();
    let sized = app
        .wait_for_log(
            &["fetch requests sized", "brokers=3"],
            Duration::from_secs(30),
        )
        .await;

    // The budget fills and stays full past the intake's wait: every partition is paused.
    let limit = BUDGET_BYTES as f64 / 2.0;
    let over = limit + (NOTED_BYTES + 2048) as f64;
    let metrics = app
        .wait_for_metrics(Duration::from_secs(90), |m| {
            let held = m.get("history_held_bytes").unwrap_or(0.0);
            held >= over
                || (held >= limit - NOTED_BYTES as f64
                    && m.get("history_instance_pauses_total").unwrap_or(0.0) >= 1.0)
        })
        .await;
    assert!(
        app.db.lock_waiters().await >= 1,
        "the writes wait on the lock"
    );
    let held = metrics
        .get("history_held_bytes")
        .expect("history_held_bytes is exported");
    assert!(
        held < over,
        "{held} bytes held, over the limit {limit} by more than one record"
    );
    // What the client fetched before the pause is in its queue and its last responses: the
    // peak is reached once the budget is full.
    let peak_mb = app.process().peak_rss_mb();
    let budget_mb = BUDGET_BYTES as f64 / (1 << 20) as f64;
    eprintln!("{codec}: peak RSS {peak_mb:.1} MB, idle {idle_rss_mb:.1} MB, budget {budget_mb} MB");
    assert!(
        peak_mb <= idle_rss_mb + budget_mb,
        "{codec}: peak RSS {peak_mb:.1} MB over idle {idle_rss_mb:.1} MB + budget {budget_mb} MB \
         ({sized})"
    );

    lock.rollback().await.unwrap();
    app.wait_committed(Duration::from_secs(180)).await;
    assert_eq!(app.db.count("history_events").await, records.len() as i64);
    assert_eq!(app.db.count("dead_letters").await, 0);
    let metrics = app.metrics().await;
    assert_eq!(
        metrics.get("history_events_total{outcome=\"applied\"}"),
        Some(records.len() as f64)
    );
    // The batches really were compressed: the client decompressed more than it received.
    let ratio = app
        .wait_for_metrics(Duration::from_secs(30), |m| {
            m.get("history_fetch_compression_ratio").is_some()
        })
        .await
        .get("history_fetch_compression_ratio")
        .unwrap();
    assert!(ratio > 1.5, "{codec}: compression ratio {ratio}");
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn zstd_records_from_three_brokers_wait_within_the_budget_while_the_database_hangs() {
    compressed_records_from_three_brokers_wait_within_the_budget("zstd").await;
}

#[actix_rt::test]
async fn lz4_records_from_three_brokers_wait_within_the_budget_while_the_database_hangs() {
    compressed_records_from_three_brokers_wait_within_the_budget("lz4").await;
}
