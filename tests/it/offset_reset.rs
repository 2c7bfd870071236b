//! Records deleted by retention before the group processed them: the service cannot bring them
//! back, but says so — one ERROR with the numbers and two counters — while a group's first
//! start from the earliest record stays silent. On the embedded broker,
//! whose partitions keep at most 5 MiB (older records are deleted, like retention).

use std::time::{Duration, Instant};

use history_devkit::group::GroupInspector;
use history_devkit::probe::sample;
use history_devkit::workload::{PlannedRecord, RecordKind};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::common::scrape;
use crate::common::{
    Child, TOPIC, TestDb, free_port, produce, service_env, topic_ends, wait_committed,
};

const GROUP: &str = "history-reset";

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

/// Commits `offset` for the group on partition 0, as an earlier run of the service would have.
fn commit(brokers: &str, offset: i64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(TOPIC, 0, Offset::Offset(offset))
        .unwrap();
    consumer.commit(&tpl, CommitMode::Sync).unwrap();
}

#[actix_rt::test]
async fn records_deleted_before_they_were_processed_are_reported_with_where_and_how_many() {
    let db = TestDb::migrated().await;
    let broker = history_devkit::broker::EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 2).unwrap();
    let brokers = broker.bootstrap_servers();

    // Partition 0: the group processed 5 records of 20, then about 6 MiB more arrived while it
    // was away: the broker deleted the oldest, past the committed offset.
    produce(&brokers, &events(0, 0..20, 200)).await;
    {
        let brokers = brokers.clone();
        tokio::task::spawn_blocking(move || commit(&brokers, 5))
            .await
            .unwrap();
    }
    produce(&brokers, &events(0, 20..120, 60_000)).await;
    // Partition 1: never committed; the group starts at its first record, and that is no loss.
    produce(&brokers, &events(1, 0..15, 200)).await;
    let inspector = GroupInspector::new(&brokers, GROUP).unwrap();
    let timeout = Duration::from_secs(5);
    let (log_start, end_0) = inspector.watermarks(TOPIC, 0, timeout).unwrap();
    assert!(
        log_start > 5,
        "retention did not pass the committed offset: {log_start}"
    );
    assert_eq!(end_0, 120);
    assert_eq!(
        inspector.committed(TOPIC, 2, timeout).unwrap(),
        vec![Some(5), None]
    );

    let http_port = free_port();
    let mut env = service_env(&db.url(), &brokers, GROUP, TOPIC);
    env.push(("HISTORY__HTTP__ENABLED".into(), "true".into()));
    env.push((
        "HISTORY__HTTP__LISTEN".into(),
        format!("127.0.0.1:{http_port}"),
    ));
    let mut service = Child::spawn(&["run"], &env);
    wait_committed(&brokers, GROUP, &[end_0, 15], Duration::from_secs(60)).await;

    // Every record still retained is processed.
    let retained = end_0 - log_start;
    assert_eq!(db.count("history_events").await, retained + 15);
    assert_eq!(db.count("dead_letters").await, 0);

    // The reset is reported, with its numbers, once the check has run.
    let skipped = log_start - 5;
    let series = |family: &str, partition: i32| {
        format!("{family}{{topic=\"{TOPIC}\",partition=\"{partition}\"}}")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let metrics = scrape(http_port).await;
        if sample(&metrics, &series("history_offset_resets_total", 0)) == Some(1.0) {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "no reset counted:\n{metrics}\n{}",
            service.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        sample(
            &metrics,
            &series("history_offset_reset_skipped_records_total", 0)
        ),
        Some(skipped as f64),
        "{metrics}"
    );
    // Partition 1 lost nothing, and its counters exist at 0 for `increase()`.
    assert_eq!(
        sample(&metrics, &series("history_offset_resets_total", 1)),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            &series("history_offset_reset_skipped_records_total", 1)
        ),
        Some(0.0),
        "{metrics}"
    );

    service.signal(libc::SIGTERM);
    assert_eq!(service.wait(Duration::from_secs(30)), Some(0));
    let log = service.logs();
    let resets: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("offset reset:"))
        .collect();
    assert_eq!(resets.len(), 1, "one reset, one line:\n{log}");
    let line = resets[0];
    for field in [
        " ERROR ".to_owned(),
        format!("topic={TOPIC}"),
        "partition=0".to_owned(),
        "committed=5".to_owned(),
        format!("resumed={log_start}"),
        format!("skipped={skipped}"),
    ] {
        assert!(line.contains(&field), "{field} missing in: {line}");
    }
}

/// Scrapes until `series` has `value`.
async fn wait_sample(port: u16, series: &str, value: f64, service: &Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = scrape(port).await;
        if sample(&metrics, series).is_some_and(|found| found >= value) {
            return metrics;
        }
        assert!(
            Instant::now() < deadline,
            "{series} never reached {value}:\n{metrics}\n{}",
            service.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
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
    let db = TestDb::migrated().await;
    let broker = history_devkit::broker::EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 1).unwrap();
    let brokers = broker.bootstrap_servers();
    let group = "history-reset-behind";
    let http_port = free_port();
    let mut env = service_env(&db.url(), &brokers, group, TOPIC);
    env.push(("HISTORY__HTTP__ENABLED".into(), "true".into()));
    env.push((
        "HISTORY__HTTP__LISTEN".into(),
        format!("127.0.0.1:{http_port}"),
    ));
    env.push((
        "HISTORY__PIPELINE__MAX_IN_FLIGHT_PER_PARTITION".into(),
        "5".into(),
    ));
    let mut service = Child::spawn(&["run"], &env);
    produce(&brokers, &events(0, 0..20, 200)).await;
    wait_committed(&brokers, group, &[20], Duration::from_secs(60)).await;

    // The database stalls (writes wait for a lock): the window fills and the partition is
    // paused, its position a few records further. Meanwhile 6 MiB arrive and the broker
    // deletes the oldest records, past that position.
    let lock = db.client().await;
    lock.batch_execute("BEGIN; LOCK TABLE inbox IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    produce(&brokers, &events(0, 20..30, 200)).await;
    wait_sample(http_port, "history_partition_pauses_total", 1.0, &service).await;
    produce(&brokers, &events(0, 30..130, 60_000)).await;
    let inspector = GroupInspector::new(&brokers, group).unwrap();
    let (log_start, end) = inspector
        .watermarks(TOPIC, 0, Duration::from_secs(5))
        .unwrap();
    assert!(
        log_start > 30,
        "retention did not pass the position: {log_start}"
    );
    lock.batch_execute("ROLLBACK").await.unwrap();

    assert_eq!(topic_ends(&brokers, 1).await, vec![end]);
    wait_committed(&brokers, group, &[end], Duration::from_secs(60)).await;
    let series = |family: &str| format!("{family}{{topic=\"{TOPIC}\",partition=\"0\"}}");
    let metrics = wait_sample(
        http_port,
        &series("history_offset_resets_total"),
        1.0,
        &service,
    )
    .await;
    let skipped = sample(
        &metrics,
        &series("history_offset_reset_skipped_records_total"),
    )
    .unwrap() as i64;
    service.signal(libc::SIGTERM);
    assert_eq!(service.wait(Duration::from_secs(30)), Some(0));

    let log = service.logs();
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
        db.count("history_events").await + skipped,
        end,
        "all events are distinct: {line}"
    );
}
