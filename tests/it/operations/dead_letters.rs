//! Poison records: each kind dead-lettered once, in the table and on the dead-letter topic,
//! while the partitions keep flowing; a second group stores and publishes nothing twice; the
//! operator lists and replays them.

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use super::spec;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, RecordKind, WorkloadSpec, distinct_events};
use history_service::kafka::dead_letter_topic as dlq;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const DLQ: &str = "history.dlq";

/// Every record of a topic, from the beginning, with its headers as strings.
fn read_topic(
    brokers: &str,
    topic: &str,
    expected: usize,
) -> Vec<(Vec<u8>, HashMap<String, String>)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "reader")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                let mut headers = HashMap::new();
                if let Some(h) = message.headers() {
                    for header in h.iter() {
                        let value = header
                            .value
                            .map(|v| String::from_utf8_lossy(v).into_owned());
                        headers.insert(header.key.to_owned(), value.unwrap_or_default());
                    }
                }
                out.push((message.payload().unwrap_or_default().to_vec(), headers));
            }
            Some(Err(err)) => panic!("{err}"),
            None if out.len() >= expected => {
                // Nothing more within the poll interval: the topic is read.
                std::thread::sleep(Duration::from_millis(300));
                if consumer.poll(Duration::from_millis(300)).is_none() {
                    break;
                }
            }
            None => {}
        }
    }
    out
}

fn cli(app: &TestApp, args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .args(args)
        .env("HISTORY__DATABASE__URL", app.db.url())
        .env("HISTORY__KAFKA__BROKERS", &app.brokers)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

/// An app publishing dead letters to [`DLQ`], with 800 records (5% poison of every kind)
/// produced; the poison records' coordinates with their reason codes.
async fn poisoned(prefix: &str) -> (TestApp, Vec<PlannedRecord>, HashMap<(i32, i64), String>) {
    let app = TestApp::prepare(|o| {
        o.partitions = 3;
        o.env("HISTORY__DEAD_LETTER__TOPIC", DLQ);
    })
    .await;
    app.broker().create_topic(DLQ, 1).unwrap();
    let records = workload::generate(&spec(800, 0.05, prefix, 3));
    let kinds: HashSet<&str> = records
        .iter()
        .filter_map(|r| match r.kind {
            RecordKind::Poison { reason } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds.len(),
        workload::POISON_KINDS.len(),
        "every kind of poison is produced"
    );
    let delivered = app.produce(&records).await;
    let poison_partitions: HashSet<i32> = records
        .iter()
        .zip(&delivered)
        .filter(|(r, _)| matches!(r.kind, RecordKind::Poison { .. }))
        .map(|(_, d)| d.partition)
        .collect();
    assert!(poison_partitions.len() > 1, "poison on several partitions");
    let expected: HashMap<(i32, i64), String> = records
        .iter()
        .zip(&delivered)
        .filter_map(|(r, d)| match r.kind {
            RecordKind::Poison { reason } => Some(((d.partition, d.offset), reason.to_owned())),
            _ => None,
        })
        .collect();
    (app, records, expected)
}

/// Runs `app`'s service in process until its group has committed the whole topic.
async fn run_to_the_end(app: &TestApp) -> history_service::app::RunReport {
    app.run_in_process(async {
        app.wait_committed(Duration::from_secs(60)).await;
    })
    .await
    .unwrap()
}

/// The dead-letter topic's records, read in a thread of their own.
async fn published(
    app: &TestApp,
    topic: &'static str,
    expected: usize,
) -> Vec<(Vec<u8>, HashMap<String, String>)> {
    let brokers = app.brokers.clone();
    tokio::task::spawn_blocking(move || read_topic(&brokers, topic, expected))
        .await
        .unwrap()
}

#[actix_rt::test]
async fn poison_of_every_kind_is_dead_lettered_once_and_the_partitions_keep_flowing() {
    let (app, first, expected) = poisoned("poison-a").await;
    let second = workload::generate(&WorkloadSpec {
        poison: 0.0,
        ..spec(200, 0.0, "poison-b", 4)
    });
    let report = app
        .run_in_process(async {
            app.wait_committed(Duration::from_secs(60)).await;
            // Still consuming after the poison: more records are recorded and committed.
            app.produce(&second).await;
            app.wait_committed(Duration::from_secs(60)).await;
        })
        .await
        .unwrap();

    let expected_rows = distinct_events(&first) + distinct_events(&second);
    assert_eq!(app.db.count("history_events").await, expected_rows as i64);
    let client = app.db.client().await;
    let stored: HashMap<(i32, i64), String> = client
        .query(
            "SELECT partition, \"offset\", reason_code FROM dead_letters WHERE topic = $1",
            &[&app.topic],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| ((row.get(0), row.get(1)), row.get(2)))
        .collect();
    assert_eq!(
        stored, expected,
        "one dead letter per poison record, with its reason"
    );
    assert_eq!(report.stats.dead_lettered as usize, expected.len());

    // The dead-letter topic got each one, with headers naming where it came from.
    let published = published(&app, DLQ, expected.len()).await;
    assert_eq!(published.len(), expected.len());
    for (_, headers) in &published {
        let coordinates = (
            headers[dlq::HEADER_PARTITION].parse::<i32>().unwrap(),
            headers[dlq::HEADER_OFFSET].parse::<i64>().unwrap(),
        );
        assert_eq!(headers[dlq::HEADER_TOPIC], app.topic);
        assert_eq!(headers[dlq::HEADER_REASON_CODE], expected[&coordinates]);
        assert!(!headers[dlq::HEADER_REASON].is_empty());
    }
}

#[actix_rt::test]
async fn a_second_group_reading_everything_again_stores_and_publishes_no_letter_twice() {
    let (app, first, expected) = poisoned("poison-again").await;
    run_to_the_end(&app).await;
    let expected_rows = distinct_events(&first);
    assert_eq!(app.db.count("history_events").await, expected_rows as i64);

    let again = TestApp::prepare(|o| {
        o.share(&app);
        o.group = "history-poison-again".into();
    })
    .await;
    let report = run_to_the_end(&again).await;
    assert_eq!(report.stats.applied, 0);
    assert_eq!(report.stats.dead_lettered as usize, expected.len());
    assert_eq!(app.db.count("dead_letters").await, expected.len() as i64);
    assert_eq!(app.db.count("history_events").await, expected_rows as i64);
    let republished = published(&app, DLQ, expected.len()).await;
    assert_eq!(
        republished.len(),
        expected.len(),
        "no dead letter published twice"
    );
}

#[actix_rt::test]
async fn an_operator_lists_the_dead_letters_and_replays_the_not_json_ones_to_another_topic() {
    let (app, _, expected) = poisoned("poison-replay").await;
    run_to_the_end(&app).await;

    app.broker().create_topic("replayed", 1).unwrap();
    let (code, listing) = cli(&app, &["dead-letters", "list", "--limit", "1000"]);
    assert_eq!(code, 0, "{listing}");
    assert!(
        listing.contains(&format!("{} shown", expected.len())),
        "{listing}"
    );
    assert!(listing.contains("not_json="), "{listing}");
    let not_json = expected.values().filter(|r| *r == "not_json").count();
    let (code, replay) = cli(
        &app,
        &[
            "dead-letters",
            "replay",
            "--reason",
            "not_json",
            "--to-topic",
            "replayed",
        ],
    );
    assert_eq!(code, 0, "{replay}");
    assert!(
        replay.contains(&format!("replayed {not_json} dead letters")),
        "{replay}"
    );
    let replayed = published(&app, "replayed", not_json).await;
    assert_eq!(replayed.len(), not_json);
    assert!(
        replayed
            .iter()
            .all(|(payload, _)| std::str::from_utf8(payload).is_ok())
    );
    let (_, after) = cli(&app, &["dead-letters", "list", "--reason", "not_json"]);
    assert!(
        after.contains("0 shown"),
        "replayed letters are not listed again:\n{after}"
    );
    let (code, refused) = cli(&app, &["dead-letters", "replay"]);
    assert_ne!(code, 0, "replaying everything needs --all: {refused}");
}
