//! Records deleted by retention before the group processed them: the service cannot bring them
//! back, but says so — one ERROR with the numbers and two counters — while a group's first
//! start from the earliest record stays silent. On the embedded broker,
//! whose partitions keep at most 5 MiB (older records are deleted, like retention).

use std::time::Duration;

use history_devkit::group::GroupInspector;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{PlannedRecord, RecordKind};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// A valid event, padded with a field the decoder ignores to about `size` bytes.
fn event(id: &str, size: usize) -> Vec<u8> {
    format!(
        r#"{{"event_id":"{id}","ticket_id":"ticket-{id}","from_status":"open","to_status":"closed","changed_at":"2026-10-03T08:00:00Z","padding":"{}"}}"#,
        "x".repeat(size.saturating_sub(150))
    )
    .into_bytes()
}

fn events(partition: i32, ids: std::ops::Range<usize>, size: usize) -> Vec<PlannedRecord> {
    ids.map(|i| {
        let id = format!("reset-p{partition}-{i}");
        PlannedRecord {
            key: id.clone().into_bytes(),
            payload: Some(event(&id, size)),
            partition: Some(partition),
            kind: RecordKind::Event { event_id: id },
        }
    })
    .collect()
}

/// Commits `offset` for the app's group on partition 0, as an earlier run of the service would
/// have.
async fn commit(app: &TestApp, offset: i64) {
    let (brokers, group, topic) = (app.brokers.clone(), app.group.clone(), app.topic.clone());
    tokio::task::spawn_blocking(move || commit_blocking(&brokers, &group, &topic, offset))
        .await
        .unwrap();
}

fn commit_blocking(brokers: &str, group: &str, topic: &str, offset: i64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
}

#[actix_rt::test]
async fn records_deleted_before_they_were_processed_are_reported_with_where_and_how_many() {
    let mut app = TestApp::prepare(|o| o.partitions = 2).await;

    // Partition 0: the group processed 5 records of 20, then about 6 MiB more arrived while it
    // was away: the broker deleted the oldest, past the committed offset.
    app.produce(&events(0, 0..20, 200)).await;
    commit(&app, 5).await;
    app.produce(&events(0, 20..120, 60_000)).await;
    // Partition 1: never committed; the group starts at its first record, and that is no loss.
    app.produce(&events(1, 0..15, 200)).await;
    let inspector = GroupInspector::new(&app.brokers, &app.group).unwrap();
    let timeout = Duration::from_secs(5);
    let (log_start, end_0) = inspector.watermarks(&app.topic, 0, timeout).unwrap();
    assert!(
        log_start > 5,
        "retention did not pass the committed offset: {log_start}"
    );
    assert_eq!(end_0, 120);
    assert_eq!(app.committed().await, vec![Some(5), None]);

    app.start();
    app.wait_committed_to(&[end_0, 15], Duration::from_secs(60))
        .await;

    // Every record still retained is processed.
    let retained = end_0 - log_start;
    assert_eq!(app.db.count("history_events").await, retained + 15);
    assert_eq!(app.db.count("dead_letters").await, 0);

    // The reset is reported, with its numbers, once the check has run.
    let skipped = log_start - 5;
    let topic = app.topic.clone();
    let series = |family: &str, partition: i32| {
        format!("{family}{{topic=\"{topic}\",partition=\"{partition}\"}}")
    };
    let metrics = app
        .wait_for_metrics(Duration::from_secs(30), |m| {
            m.get(&series("history_offset_resets_total", 0)) == Some(1.0)
        })
        .await;
    assert_eq!(
        metrics.get(&series("history_offset_reset_skipped_records_total", 0)),
        Some(skipped as f64),
        "{metrics}"
    );
    // Partition 1 lost nothing, and its counters exist at 0 for `increase()`.
    assert_eq!(
        metrics.get(&series("history_offset_resets_total", 1)),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        metrics.get(&series("history_offset_reset_skipped_records_total", 1)),
        Some(0.0),
        "{metrics}"
    );

    assert_eq!(app.stop(), Some(0));
    let log = app.logs();
    let resets: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("offset reset:"))
        .collect();
    assert_eq!(resets.len(), 1, "one reset, one line:\n{log}");
    let line = resets[0];
    for field in [
        " ERROR ".to_owned(),
        format!("topic={topic}"),
        "partition=0".to_owned(),
        "committed=5".to_owned(),
        format!("resumed={log_start}"),
        format!("skipped={skipped}"),
    ] {
        assert!(line.contains(&field), "{field} missing in: {line}");
    }
}

/// A field's value in a log line (`name=value`).
fn field(line: &str, name: &str) -> i64 {
    let start = line
        .find(&format!(" {name}="))
        .unwrap_or_else(|| panic!("{name} missing in: {line}"))
        + name.len()
        + 2;
    let value: String = line[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    value.parse().unwrap()
}

#[actix_rt::test]
async fn a_consumer_that_falls_behind_retention_reports_the_records_it_never_saw() {
    let mut app = TestApp::spawn(|o| {
        o.env("HISTORY__PIPELINE__MAX_IN_FLIGHT_PER_PARTITION", "5");
    })
    .await;
    app.produce(&events(0, 0..20, 200)).await;
    app.wait_committed_to(&[20], Duration::from_secs(60)).await;

    // The database stalls (writes wait for a lock): the window fills and the partition is
    // paused, its position a few records further. Meanwhile 6 MiB arrive and the broker
    // deletes the oldest records, past that position.
    let lock = app.db.client().await;
    lock.batch_execute("BEGIN; LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    app.produce(&events(0, 20..30, 200)).await;
    let reached = |series: String, value: f64| {
        move |m: &history_devkit::probe::Metrics| m.get(&series).is_some_and(|found| found >= value)
    };
    app.wait_for_metrics(
        Duration::from_secs(60),
        reached("history_partition_pauses_total".into(), 1.0),
    )
    .await;
    app.produce(&events(0, 30..130, 60_000)).await;
    let inspector = GroupInspector::new(&app.brokers, &app.group).unwrap();
    let (log_start, end) = inspector
        .watermarks(&app.topic, 0, Duration::from_secs(5))
        .unwrap();
    assert!(
        log_start > 30,
        "retention did not pass the position: {log_start}"
    );
    lock.batch_execute("ROLLBACK").await.unwrap();

    assert_eq!(app.ends().await, vec![end]);
    app.wait_committed_to(&[end], Duration::from_secs(60)).await;
    let series = |family: &str| format!("{family}{{topic=\"{}\",partition=\"0\"}}", app.topic);
    let metrics = app
        .wait_for_metrics(
            Duration::from_secs(60),
            reached(series("history_offset_resets_total"), 1.0),
        )
        .await;
    let skipped = metrics
        .get(&series("history_offset_reset_skipped_records_total"))
        .unwrap() as i64;
    assert_eq!(app.stop(), Some(0));

    let log = app.logs();
    let resets: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("offset reset:"))
        .collect();
    assert_eq!(resets.len(), 1, "one reset, one line:\n{log}");
    let line = resets[0];
    assert!(line.contains(" ERROR "), "{line}");
    let (position, resumed) = (field(line, "position"), field(line, "resumed"));
    assert_eq!(field(line, "skipped"), skipped, "{line}");
    assert_eq!(
        position + skipped,
        resumed.min(field(line, "log_start")),
        "{line}"
    );
    assert!(
        (25..=30).contains(&position),
        "fetched up to the pause: {line}"
    );
    // Every record was either processed or counted as skipped, none both.
    assert_eq!(
        app.db.count("history_events").await + skipped,
        end,
        "all events are distinct: {line}"
    );
}

/// librdkafka moves a partition's position back within the assignment — here a fetch answered
/// OFFSET_OUT_OF_RANGE, after which it starts again at the earliest offset, as it does for a
/// topic deleted and created again (the embedded broker cannot delete a topic, nor truncate a
/// log: the records it hands again are the same ones, and come out AlreadyApplied). The service
/// sees its log move back: an ERROR naming the partition and where it went, the counter, the
/// group's position committed back and then to the end again, and nothing lost or doubled.
#[actix_rt::test]
async fn a_position_moved_back_by_the_client_is_told_and_the_records_are_processed_again() {
    let mut app = TestApp::spawn(|o| o.partitions = 1).await;
    let records = events(0, 0..100, 300);
    app.produce(&records).await;
    app.wait_committed(Duration::from_secs(30)).await;

    // The next fetch is refused as out of range: librdkafka resets to the earliest offset.
    app.broker().push_request_errors(
        1,
        &[rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE],
    );
    let line = app
        .wait_for_log(&["log moved back", "to=0"], Duration::from_secs(30))
        .await;
    assert!(line.contains("ERROR") && line.contains("[0]"), "{line}");
    let topic = app.topic.clone();
    let metrics = app
        .wait_for_metrics(Duration::from_secs(30), |m| {
            m.get("history_events_total{outcome=\"already_applied\"}") == Some(100.0)
        })
        .await;
    let labels = [("topic", topic.as_str()), ("partition", "0")];
    assert_eq!(
        metrics.value("history_offset_rewinds_total", &labels),
        Some(1.0),
        "{metrics}"
    );
    app.wait_committed(Duration::from_secs(30)).await;
    assert_eq!(app.db.count("history_events").await, 100);
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}
