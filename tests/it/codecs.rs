//! Every compression codec a Kafka producer may use, produced as a user's producer produces
//! them: by an external client (the confluent-kafka Python client, on Debian's own librdkafka
//! build) with `compression.type` set, onto a cluster of three brokers whose partitions are led
//! by all three. The embedded broker keeps the batches as they came, so the service reads them
//! compressed. Without zstd in the build (rdkafka's `zstd` feature), the zstd records are never
//! read and this test fails at its drain. (The client runs on Debian's librdkafka: `cargo test`'s
//! `LD_LIBRARY_PATH` would give it this build's, which the test checks it does not.)

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use history_devkit::external_producer::{self, CODECS};
use history_devkit::test_app::TestApp;
use history_devkit::workload::{self, PlannedRecord, RecordKind, WorkloadSpec};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

/// The leaders of the topic's partitions, as the cluster's metadata names them.
fn leaders(brokers: &str, topic: &str) -> BTreeSet<i32> {
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("a metadata client");
    let metadata = client
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("the topic's metadata");
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|partition| partition.leader())
        .collect()
}

fn count(records: &[PlannedRecord], kind: fn(&RecordKind) -> bool) -> usize {
    records.iter().filter(|record| kind(&record.kind)).count()
}

#[actix_rt::test]
async fn records_of_every_codec_from_an_external_producer_are_drained_exactly_on_three_brokers() {
    let mut app = TestApp::prepare(|o| {
        o.brokers = 3;
        o.partitions = 6;
    })
    .await;
    // The producer is a client of its own, on Debian's librdkafka, not this build's.
    let theirs = external_producer::client_librdkafka_version().unwrap();
    assert_ne!(
        theirs,
        history_service::kafka::features::librdkafka_version()
    );
    assert_eq!(
        leaders(&app.brokers, &app.topic),
        BTreeSet::from([1, 2, 3]),
        "every broker leads partitions of the topic"
    );
    let mut all = Vec::new();
    for (n, codec) in CODECS.iter().enumerate() {
        let records = workload::generate(&WorkloadSpec {
            records: 600,
            duplicates: 0.1,
            poison: 0.03,
            partitions: 6,
            id_prefix: format!("codec-{codec}"),
            tickets: 40,
            max_payload_bytes: 65536,
            seed: 100 + n as u64,
        });
        // Batches of many records, as a busy producer makes them: compression is per batch.
        app.produce_externally(
            &records,
            &[("compression.type", codec), ("linger.ms", "20")],
        )
        .await;
        all.extend(records);
    }
    let events = count(&all, |kind| matches!(kind, RecordKind::Event { .. }));
    let duplicates = count(&all, |kind| matches!(kind, RecordKind::Duplicate { .. }));
    let poison = count(&all, |kind| matches!(kind, RecordKind::Poison { .. }));
    assert!(
        duplicates > 100 && poison > 40,
        "{duplicates} duplicates, {poison} poison"
    );

    app.start();
    app.wait_committed(Duration::from_secs(120)).await;
    assert_eq!(app.db.count("history_events").await, events as i64);
    assert_eq!(app.db.count("inbox").await, events as i64);
    assert_eq!(app.db.count("dead_letters").await, poison as i64);
    let metrics = app.metrics().await;
    let outcome = |name: &str| {
        metrics
            .get(&format!("history_events_total{{outcome=\"{name}\"}}"))
            .unwrap_or_else(|| panic!("no {name} outcomes counted:\n{metrics}"))
    };
    assert_eq!(outcome("applied"), events as f64);
    assert_eq!(outcome("already_applied"), duplicates as f64);
    assert_eq!(outcome("dead_letter"), poison as f64);
    let verified = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .arg("verify")
        .env("HISTORY__DATABASE__URL", app.db.url())
        .env_remove("HISTORY_CONFIG")
        .output()
        .expect("verify runs");
    assert_eq!(verified.status.code(), Some(0), "{verified:?}");
    let logs = app.logs();
    assert!(!logs.contains("Decompression"), "{logs}");
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}
