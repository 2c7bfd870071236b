//! End to end: a dead-letter topic that refuses every letter never blocks a partition. The
//! letters are stored (the table is the source of truth), their offsets commit, the failure is
//! recorded and counted, and the relay publishes them once the topic accepts them.

use std::time::{Duration, Instant};

use history_service::dev::broker::EmbeddedBroker;
use history_service::dev::group::GroupInspector;
use history_service::dev::probe::sample;
use history_service::dev::workload::{PlannedRecord, RecordKind, event_payload};
use rdkafka::types::RDKafkaRespErr;

use crate::common::{Child, TOPIC, TestDb, free_port, produce, service_env, wait_committed};
use crate::redelivery::scrape;

const DLQ: &str = "history.dlq";

fn record(n: usize) -> PlannedRecord {
    if n % 10 == 3 {
        PlannedRecord {
            key: b"k".to_vec(),
            payload: Some(format!("not json {n}").into_bytes()),
            partition: Some((n % 2) as i32),
            kind: RecordKind::Poison { reason: "not_json" },
        }
    } else {
        let id = format!("dlq-event-{n}");
        PlannedRecord {
            key: b"k".to_vec(),
            payload: Some(event_payload(
                &id,
                "ticket-1",
                "open",
                "closed",
                chrono::Utc::now(),
            )),
            partition: Some((n % 2) as i32),
            kind: RecordKind::Event { event_id: id },
        }
    }
}

/// (published, pending with an error, attempts) over all dead letters.
async fn publish_state(db: &TestDb) -> (i64, i64, i64) {
    let row = db
        .client()
        .await
        .query_one(
            "SELECT count(published_at), \
                    count(*) FILTER (WHERE published_at IS NULL AND publish_error IS NOT NULL), \
                    coalesce(sum(publish_attempts), 0) \
             FROM dead_letters WHERE publish_to = $1",
            &[&DLQ],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[actix_rt::test]
async fn a_dead_letter_topic_that_refuses_letters_blocks_nothing_and_is_caught_up_later() {
    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 2).unwrap();
    broker.create_topic(DLQ, 1).unwrap();
    // Every produce to the dead-letter topic is refused, as with a missing ACL.
    broker
        .cluster()
        .topic_error(
            DLQ,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let brokers = broker.bootstrap_servers();
    let records: Vec<PlannedRecord> = (0..60).map(record).collect();
    let poison = records
        .iter()
        .filter(|r| matches!(r.kind, RecordKind::Poison { .. }))
        .count() as i64;
    let delivered = produce(&brokers, &records).await;
    let ends: Vec<i64> = (0..2)
        .map(|p| {
            delivered
                .iter()
                .filter(|d| d.partition == p)
                .map(|d| d.offset + 1)
                .max()
                .unwrap()
        })
        .collect();

    let port = free_port();
    let mut env = service_env(&db.url(), &brokers, "history-dlq-topic", TOPIC);
    env.push(("HISTORY__DEAD_LETTER__TOPIC".into(), DLQ.into()));
    env.push(("HISTORY__HTTP__ENABLED".into(), "true".into()));
    env.push(("HISTORY__HTTP__LISTEN".into(), format!("127.0.0.1:{port}")));
    let mut service = Child::spawn(&["run"], &env);

    // The partitions commit to their ends although no letter could be published.
    wait_committed(
        &brokers,
        "history-dlq-topic",
        &ends,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(db.count("dead_letters").await, poison);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (published, failing, attempts) = publish_state(&db).await;
        assert_eq!(published, 0, "the topic refuses everything");
        if failing == poison && attempts >= 2 * poison {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "failures not recorded and retried: {failing} failing, {attempts} attempts\n{}",
            service.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let error: String = db
        .client()
        .await
        .query_one("SELECT publish_error FROM dead_letters LIMIT 1", &[])
        .await
        .unwrap()
        .get(0);
    assert!(error.contains("authoriz"), "{error}");
    let failures = sample(
        &scrape(port).await,
        "history_dead_letter_publish_failures_total",
    );
    assert!(failures >= Some(poison as f64), "{failures:?}");

    // The topic accepts letters again: the relay publishes every one of them, once.
    broker
        .cluster()
        .topic_error(DLQ, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while publish_state(&db).await.0 < poison {
        assert!(
            Instant::now() < deadline,
            "not published:\n{}",
            service.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        publish_state(&db).await.1,
        0,
        "errors cleared once published"
    );
    let inspector = GroupInspector::new(&brokers, "inspector").unwrap();
    let published = tokio::task::spawn_blocking(move || {
        inspector.ends(DLQ, 1, Duration::from_secs(5)).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(published, vec![poison]);
    service.signal(libc::SIGTERM);
    assert_eq!(
        service.wait(Duration::from_secs(30)),
        Some(0),
        "{}",
        service.logs()
    );
}
