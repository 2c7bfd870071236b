//! A database restored from a backup, or emptied, while the group's offsets stayed: the
//! records resolved since the backup are gone from it, and the group, committed past them,
//! would never read them again. At each assignment the service checks the newest records below
//! the committed position against the database and says so loudly; `verify` says so too; and
//! the operator's fix — the group moved back — brings every record back, exactly.

use std::sync::Arc;
use std::time::Duration;

use history_devkit::group::{self, GroupInspector};
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, WorkloadSpec, distinct_events};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const PARTITIONS: i32 = 2;

fn records(prefix: &str, seed: u64) -> Vec<PlannedRecord> {
    workload::generate(&WorkloadSpec {
        records: 400,
        duplicates: 0.1,
        poison: 0.05,
        partitions: PARTITIONS,
        id_prefix: prefix.into(),
        tickets: 40,
        max_payload_bytes: 65536,
        seed,
    })
}

/// `history-service verify` against the app's database and group.
fn verify(app: &TestApp) -> (Option<i32>, String) {
    crate::common::run_service_command(app, &["verify"])
}

/// Commits `offsets` for `group` from outside, as `kafka-consumer-groups --reset-offsets` does
/// with every replica stopped.
fn move_group(app: &TestApp, group: &str, offsets: &[Option<i64>]) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &app.brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for (partition, offset) in offsets.iter().enumerate() {
        tpl.add_partition_offset(
            &app.topic,
            partition as i32,
            Offset::Offset(offset.unwrap_or(0)),
        )
        .unwrap();
    }
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
}

#[actix_rt::test]
async fn a_database_restored_from_a_backup_is_named_at_assignment_and_by_verify_and_moving_the_group_back_restores_every_record()
 {
    let mut app = TestApp::prepare(|o| o.partitions = PARTITIONS).await;
    let seed = rand::random();
    let before = records("restored-before", seed);
    let after = records("restored-after", seed ^ 1);
    app.produce(&before).await;
    app.start();
    let at_backup = app.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(app.stop(), Some(0), "{}", app.logs());

    // The backup.
    let db = app.db.client().await;
    db.batch_execute(
        "CREATE TABLE backup_inbox AS SELECT * FROM inbox;
         CREATE TABLE backup_history AS SELECT * FROM history_events;
         CREATE TABLE backup_letters AS SELECT * FROM dead_letters;",
    )
    .await
    .unwrap();

    app.produce(&after).await;
    app.start();
    app.wait_committed(Duration::from_secs(60)).await;
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
    let mut all = before.clone();
    all.extend(after.iter().cloned());
    let distinct = distinct_events(&all) as i64;
    assert_eq!(app.db.count("history_events").await, distinct);
    let letters = app.db.count("dead_letters").await;
    assert!(letters > 0, "no poison among the records");
    let (code, text) = verify(&app);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("OK: the database holds the newest records"),
        "{text}"
    );

    // The restore: the database as it was at the backup; the group's offsets stay.
    db.batch_execute(
        "TRUNCATE history_events, inbox, dead_letters;
         INSERT INTO inbox SELECT * FROM backup_inbox;
         INSERT INTO history_events SELECT * FROM backup_history;
         INSERT INTO dead_letters SELECT * FROM backup_letters;",
    )
    .await
    .unwrap();
    assert!(app.db.count("history_events").await < distinct);

    app.start();
    for partition in 0..PARTITIONS {
        app.wait_for_log(
            &[
                "ERROR",
                "the database lacks records the group committed past",
                &format!("partition={partition}"),
                "--reset-offsets",
            ],
            Duration::from_secs(60),
        )
        .await;
    }
    let topic = app.topic.clone();
    let series = |partition: i32| {
        format!("history_database_behind{{topic=\"{topic}\",partition=\"{partition}\"}}")
    };
    let metrics = app
        .wait_for_metrics(Duration::from_secs(30), |m| {
            (0..PARTITIONS).all(|p| m.get(&series(p)).is_some_and(|v| v > 0.0))
        })
        .await;
    for partition in 0..PARTITIONS {
        // Every record checked came after the backup: all of them are missing.
        assert_eq!(metrics.get(&series(partition)), Some(64.0), "{metrics}");
    }
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("the database lacks records the group committed past"),
        "{body}"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
    let (code, text) = verify(&app);
    assert_eq!(code, Some(1), "{text}");
    for partition in 0..PARTITIONS {
        assert!(
            text.contains(&format!(
                "VIOLATION: the database lacks records the group committed past: {}[{partition}]",
                app.topic
            )),
            "{text}"
        );
    }

    // The operator's fix: the group moved back to where the backup stood. Everything after it
    // is read again; nothing is written twice.
    // (The embedded broker refuses a commit from outside a classic group it has seen, where
    // Kafka takes one for an empty group: the group moved back is given a new name here.)
    let moved = format!("{}-moved-back", app.group);
    move_group(&app, &moved, &at_backup);
    app.set_env("HISTORY__KAFKA__GROUP_ID", &moved);
    app.start();
    let inspector = Arc::new(GroupInspector::new(&app.brokers, &moved).unwrap());
    group::wait_committed(
        inspector,
        &app.topic,
        &app.ends().await,
        Duration::from_secs(60),
        || {},
    )
    .await
    .unwrap_or_else(|err| panic!("{err}\n{}", app.logs()));
    assert_eq!(app.db.count("history_events").await, distinct);
    assert_eq!(app.db.count("inbox").await, distinct);
    app.wait_for_metrics(Duration::from_secs(30), |m| {
        (0..PARTITIONS).all(|p| m.get(&series(p)) == Some(0.0))
    })
    .await;
    assert_eq!(app.db.count("dead_letters").await, letters);
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
    let (code, text) = verify(&app);
    assert_eq!(code, Some(0), "{text}");
}
