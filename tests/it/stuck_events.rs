//! End to end: one event the database rejects holds back only its own partition, at its
//! offset, visibly; the others reach their ends. Fixing the database lets it through.

use std::time::Duration;

use history_devkit::probe::Metrics;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{PlannedRecord, RecordKind, event_payload};

const PARTITIONS: i32 = 4;
const PER_PARTITION: i64 = 60;
/// Where the poison-for-the-database event goes.
const STUCK_PARTITION: i32 = 2;

pub(crate) fn planned(event_id: &str, ticket_id: &str, partition: i32) -> PlannedRecord {
    PlannedRecord {
        key: ticket_id.as_bytes().to_vec(),
        payload: Some(event_payload(
            event_id,
            ticket_id,
            "open",
            "closed",
            chrono::Utc::now(),
        )),
        partition: Some(partition),
        kind: RecordKind::Event {
            event_id: event_id.to_owned(),
        },
    }
}

/// Makes the database reject (or, `false`, accept again) every event of `ticket-poison`: a
/// constraint the event breaks, as a rejecting database would.
pub(crate) async fn reject_ticket_poison(app: &TestApp, reject: bool) {
    let statement = if reject {
        "ALTER TABLE history_events ADD CONSTRAINT no_poison CHECK (ticket_id <> 'ticket-poison')"
    } else {
        "ALTER TABLE history_events DROP CONSTRAINT no_poison"
    };
    app.db
        .client()
        .await
        .batch_execute(statement)
        .await
        .unwrap();
}

/// The `history_stuck_event` series naming this event, and its value.
fn stuck_series(metrics: &Metrics, event_id: &str) -> Vec<(String, f64)> {
    metrics
        .select("history_stuck_event", &[("event_id", event_id)])
        .map(|sample| (sample.series.clone(), sample.value))
        .collect()
}

#[actix_rt::test]
async fn an_event_the_database_rejects_holds_only_its_partition_at_its_offset() {
    let mut app = TestApp::prepare(|o| {
        o.partitions = PARTITIONS;
        // Bigger batches than a partition's share, so the poison shares batches with the others.
        o.env("HISTORY__PIPELINE__BATCH_LINGER_MS", "20");
    })
    .await;
    reject_ticket_poison(&app, true).await;
    let mut records = Vec::new();
    for n in 0..PER_PARTITION {
        for partition in 0..PARTITIONS {
            records.push(planned(
                &format!("good-{partition}-{n}"),
                &format!("ticket-{n}"),
                partition,
            ));
            if partition == STUCK_PARTITION && n == PER_PARTITION / 2 {
                records.push(planned("the-poison", "ticket-poison", partition));
            }
        }
    }
    let delivered = app.produce(&records).await;
    let poison = delivered
        .iter()
        .zip(&records)
        .find(
            |(_, r)| matches!(&r.kind, RecordKind::Event { event_id } if event_id == "the-poison"),
        )
        .map(|(d, _)| *d)
        .unwrap();
    assert_eq!(poison.partition, STUCK_PARTITION);
    let ends: Vec<i64> = (0..PARTITIONS)
        .map(|p| {
            delivered
                .iter()
                .filter(|d| d.partition == p)
                .map(|d| d.offset + 1)
                .max()
                .unwrap()
        })
        .collect();
    let mut held = ends.clone();
    held[STUCK_PARTITION as usize] = poison.offset;
    app.start();

    // Every other partition reaches its end; the stuck one stops exactly at the poison.
    app.wait_committed_to(&held, Duration::from_secs(30)).await;
    let good = PARTITIONS as i64 * PER_PARTITION;
    assert_eq!(
        app.db.count("history_events").await,
        good,
        "every good event written"
    );

    let metrics = app.metrics().await;
    let series: Vec<_> = metrics
        .select("history_stuck_event", &[("event_id", "the-poison")])
        .collect();
    assert_eq!(series.len(), 1, "{metrics}");
    let stuck = series[0].clone();
    assert_eq!(stuck.value, 1.0);
    for (label, value) in [
        ("topic", app.topic.clone()),
        ("partition", STUCK_PARTITION.to_string()),
        ("offset", poison.offset.to_string()),
        ("sqlstate", "23514".to_owned()),
    ] {
        assert_eq!(
            stuck.label(label),
            Some(value.as_str()),
            "{label} in {}",
            stuck.series
        );
    }
    let logs = app.logs();
    let named: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("the database rejects this event"))
        .collect();
    assert_eq!(named.len(), 1, "one line names it:\n{logs}");
    for part in [
        format!("partition={}[{STUCK_PARTITION}]", app.topic),
        format!("offset={}", poison.offset),
        "event_id=the-poison".to_owned(),
        "sqlstate=23514".to_owned(),
        "no_poison".to_owned(),
    ] {
        assert!(named[0].contains(&part), "{part} in {}", named[0]);
    }

    // Still held after two more attempts failed: the outcome stays unknown, never resolved by
    // giving up.
    let retried = app
        .metrics()
        .await
        .get("history_retries_total")
        .expect("history_retries_total is exported from the start");
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        m.get("history_retries_total") >= Some(retried + 2.0)
    })
    .await;
    assert_eq!(
        app.wait_committed_to(&held, Duration::from_secs(5)).await,
        held.iter().map(|&o| Some(o)).collect::<Vec<_>>()
    );

    reject_ticket_poison(&app, false).await;
    app.wait_committed_to(&ends, Duration::from_secs(30)).await;
    assert_eq!(app.db.count("history_events").await, good + 1);
    // The gauge is cleared.
    app.wait_for_metrics(Duration::from_secs(10), |m| {
        stuck_series(m, "the-poison") == [(stuck.series.clone(), 0.0)]
    })
    .await;
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

mod pipeline_level {
    use std::time::{Duration, Instant};

    use history_devkit::workload::event_payload;
    use history_service::actors::Pipeline;
    use history_service::actors::messages::{Record, TopicPartition};
    use history_service::metrics::Stats;

    use history_service::actors::messages::Revoke;

    use crate::common::{TestDb, test_settings};
    use crate::mock_kafka::{Harness, RevokePartition};

    fn records(offsets: std::ops::Range<i64>) -> Vec<Record> {
        offsets
            .map(|n| Record {
                offset: n,
                key: Some(b"k".to_vec()),
                payload: Some(event_payload(
                    &format!("evt-{n}"),
                    "ticket-1",
                    "open",
                    "closed",
                    chrono::Utc::now(),
                )),
                timestamp_ms: None,
            })
            .collect()
    }

    async fn wait_position(harness: &Harness, position: i64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let windows = harness.windows().await;
            if windows.first().and_then(|w| w.position) == Some(position) {
                return;
            }
            assert!(Instant::now() < deadline, "{windows:?}");
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A pipeline over partition `t`/0 (epoch 1) whose event at offset 3 the database rejects
    /// by itself, parked, with the nine others written.
    struct Stuck {
        db: TestDb,
        settings: history_service::config::PipelineSettings,
        stats: std::sync::Arc<Stats>,
        harness: Harness,
        tp: TopicPartition,
    }

    async fn stuck_at_offset_3() -> Stuck {
        let db = TestDb::migrated().await;
        db.client()
            .await
            .batch_execute(
                "ALTER TABLE history_events ADD CONSTRAINT stuck CHECK (event_id <> 'evt-3')",
            )
            .await
            .unwrap();
        let mut settings =
            test_settings("postgres://unused@127.0.0.1/unused", "x:9092", "g", "t").pipeline;
        settings.commit_interval_ms = 3_600_000;
        let stats = Stats::new();
        let harness = Harness::start(Pipeline::start(&settings, db.pool(8), stats.clone()));
        let tp = TopicPartition::new("t", 0);
        harness.assign(&tp, 1).await;
        harness.inject(&tp, records(0..10)).await;
        wait_position(&harness, 3).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while db.count("history_events").await < 9 {
            assert!(Instant::now() < deadline, "the good events are not written");
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        Stuck {
            db,
            settings,
            stats,
            harness,
            tp,
        }
    }

    #[actix_rt::test]
    async fn a_stuck_event_of_a_revoked_partition_is_left_to_its_next_owner() {
        let Stuck {
            db,
            settings,
            stats,
            harness,
            tp,
        } = stuck_at_offset_3().await;

        // A retry under way when the revoke comes is waited for (its write fails: the
        // constraint is still there); the deadline only bounds that wait.
        let positions = harness
            .kafka
            .send(RevokePartition(tp.clone(), Duration::from_secs(10)))
            .await
            .unwrap();
        assert_eq!(positions[0].offset, 3, "handed over at the stuck offset");
        db.client()
            .await
            .batch_execute("ALTER TABLE history_events DROP CONSTRAINT stuck")
            .await
            .unwrap();
        // At its next retry the parked event sees its partition was revoked and stops: writing
        // it is the next owner's work. (Retried regardless, it would be written now.)
        let deadline = Instant::now() + settings.retry_max() * 3 + Duration::from_secs(10);
        while stats
            .stuck_handed_over
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
        {
            assert!(
                Instant::now() < deadline,
                "the parked event never stopped; rows: {}",
                db.count("history_events").await
            );
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(db.count("history_events").await, 9);
        harness.stop();
    }

    /// A retry of a parked event that is writing it when its partition is revoked is a write
    /// under way: the revoke waits for it, and hands the partition over behind the event it
    /// wrote — not at the event's offset while the old owner still writes it.
    #[actix_rt::test]
    async fn a_retry_writing_when_its_partition_is_revoked_is_waited_for() {
        let Stuck {
            db,
            settings,
            stats: _,
            harness,
            tp,
        } = stuck_at_offset_3().await;

        // Hold the table so that the next retry stops inside its write.
        let mut holder = db.client().await;
        let hold = holder.transaction().await.unwrap();
        hold.batch_execute("LOCK TABLE history_events IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        let watcher = db.client().await;
        let deadline = Instant::now() + settings.retry_max() * 3 + Duration::from_secs(10);
        loop {
            let blocked: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock' \
                       AND query ILIKE '%history_events%'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if blocked > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no retry came to write the event"
            );
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }

        let (early_tx, early) = std::sync::mpsc::sync_channel(1);
        let revoke = harness.pipeline.committer().send(Revoke {
            partitions: vec![(tp.clone(), 1)],
            deadline: Duration::from_secs(20),
            early: Some(early_tx),
            reply: None,
        });
        let revoke = actix_rt::spawn(revoke);
        let deadline = Instant::now() + Duration::from_secs(10);
        let handed_early = loop {
            if let Ok(positions) = early.try_recv() {
                break positions;
            }
            assert!(Instant::now() < deadline, "the revoke never began");
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(handed_early[0].offset, 3, "resolved before the revoke");

        // The revoke has begun while the retry writes; now the write goes through.
        hold.batch_execute("ALTER TABLE history_events DROP CONSTRAINT stuck")
            .await
            .unwrap();
        hold.commit().await.unwrap();
        let positions = revoke.await.unwrap().unwrap();
        assert_eq!(
            positions[0].offset, 10,
            "handed over behind the event its retry wrote during the revoke (and the rest, \
             written before)"
        );
        assert_eq!(db.count("history_events").await, 10);
        harness.stop();
    }
}
