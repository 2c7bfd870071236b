//! End to end: a dead-letter topic that refuses every letter never blocks a partition. The
//! letters are stored (the table is the source of truth), their offsets commit, the failure is
//! recorded and counted, and the relay publishes them once the topic accepts them.

use std::time::{Duration, Instant};

use history_devkit::broker::EmbeddedBroker;
use history_devkit::group::GroupInspector;
use history_devkit::test_app::TestApp;
use history_devkit::workload::{PlannedRecord, RecordKind, event_payload};
use rdkafka::types::RDKafkaRespErr;

use crate::common::TestDb;

const DLQ: &str = "history.dlq";

/// The source topic of the dead letters that the tests without a service insert themselves.
const TOPIC: &str = "tickets.status.v1";

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
    let mut app = TestApp::prepare(|o| {
        o.partitions = 2;
        o.env("HISTORY__DEAD_LETTER__TOPIC", DLQ);
    })
    .await;
    let broker = app.broker();
    broker.create_topic(DLQ, 1).unwrap();
    // Every produce to the dead-letter topic is refused, as with a missing ACL.
    broker
        .cluster()
        .topic_error(
            DLQ,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let records: Vec<PlannedRecord> = (0..60).map(record).collect();
    let poison = records
        .iter()
        .filter(|r| matches!(r.kind, RecordKind::Poison { .. }))
        .count() as i64;
    app.produce(&records).await;
    app.start();

    // The partitions commit to their ends although no letter could be published.
    app.wait_committed(Duration::from_secs(30)).await;
    let db: &TestDb = &app.db;
    assert_eq!(db.count("dead_letters").await, poison);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (published, failing, attempts) = publish_state(db).await;
        assert_eq!(published, 0, "the topic refuses everything");
        if failing == poison && attempts >= 2 * poison {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "failures not recorded and retried: {failing} failing, {attempts} attempts\n{}",
            app.logs()
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
    let failures = app
        .metrics()
        .await
        .get("history_dead_letter_publish_failures_total");
    assert!(failures >= Some(poison as f64), "{failures:?}");

    // The topic accepts letters again: the relay publishes every one of them, once.
    app.broker()
        .cluster()
        .topic_error(DLQ, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while publish_state(db).await.0 < poison {
        assert!(Instant::now() < deadline, "not published:\n{}", app.logs());
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        publish_state(db).await.1,
        0,
        "errors cleared once published"
    );
    let inspector = GroupInspector::new(&app.brokers, "inspector").unwrap();
    let published = tokio::task::spawn_blocking(move || {
        inspector.ends(DLQ, 1, Duration::from_secs(5)).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(published, vec![poison]);
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

fn operator(db: &TestDb, brokers: &str, args: &[&str]) -> (Option<i32>, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_history-service"))
        .args(args)
        .env("HISTORY__DATABASE__URL", db.url())
        .env("HISTORY__KAFKA__BROKERS", brokers)
        .env("HISTORY__DEAD_LETTER__TOPIC", DLQ)
        .env_remove("HISTORY_CONFIG")
        .output()
        .expect("the binary runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[actix_rt::test]
async fn an_operator_sees_the_publish_state_and_resends_what_is_pending() {
    use history_service::domain::DecodeError;
    use history_service::store::dead_letters::{self, DeadLetter, DeadLetterRow};

    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(DLQ, 1).unwrap();
    broker
        .cluster()
        .topic_error(
            DLQ,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let brokers = broker.bootstrap_servers();
    let letter = DeadLetter::new(&DecodeError::NullPayload, Some(b"k".to_vec()), None, None);
    let rows: Vec<DeadLetterRow<'_>> = (0..3)
        .map(|offset| DeadLetterRow {
            topic: TOPIC,
            partition: 0,
            offset,
            letter: &letter,
        })
        .collect();
    let pool = db.pool(1);
    dead_letters::insert(&pool, &rows).await.unwrap();
    dead_letters::request_publication(&pool, &rows, DLQ)
        .await
        .unwrap();

    let (code, out) = operator(&db, &brokers, &["dead-letters", "publish"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("published 0 dead letters to history.dlq; 3 failed"),
        "{out}"
    );
    let (code, out) = operator(&db, &brokers, &["dead-letters", "list"]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out.matches("not yet published to history.dlq: 1 failed attempts, last error:")
            .count(),
        3,
        "{out}"
    );

    broker
        .cluster()
        .topic_error(DLQ, RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();
    let (code, out) = operator(&db, &brokers, &["dead-letters", "publish"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("published 3 dead letters to history.dlq; 0 failed"),
        "{out}"
    );
    let (_, out) = operator(&db, &brokers, &["dead-letters", "list"]);
    assert_eq!(
        out.matches("published to history.dlq at").count(),
        3,
        "{out}"
    );
    // Nothing is pending any more: a second run publishes nothing again.
    let (code, out) = operator(&db, &brokers, &["dead-letters", "publish"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("published 0 dead letters"), "{out}");
}

#[actix_rt::test]
async fn letters_the_topic_keeps_refusing_do_not_hold_back_newer_ones() {
    use history_service::domain::DecodeError;
    use history_service::store::dead_letters::{self, DeadLetter, DeadLetterRow};

    let db = TestDb::migrated().await;
    let letter = DeadLetter::new(&DecodeError::NullPayload, None, None, None);
    let rows: Vec<DeadLetterRow<'_>> = (0..4)
        .map(|offset| DeadLetterRow {
            topic: TOPIC,
            partition: 0,
            offset,
            letter: &letter,
        })
        .collect();
    let pool = db.pool(1);
    dead_letters::insert(&pool, &rows).await.unwrap();
    dead_letters::request_publication(&pool, &rows, DLQ)
        .await
        .unwrap();
    // Offsets 0 and 1 are refused for good (too large for the topic, say).
    let refuse = |letters: Vec<dead_letters::PendingLetter>| async move {
        letters
            .iter()
            .map(|l| {
                if l.offset < 2 {
                    Err("Message size too large".to_owned())
                } else {
                    Ok(())
                }
            })
            .collect()
    };
    let policy = dead_letters::PublishPolicy {
        lease: Duration::from_secs(60),
        retry_initial: Duration::from_secs(60),
        retry_max: Duration::from_secs(60),
        ignore_backoff: false,
    };
    let first = dead_letters::publish_pending(&pool, DLQ, 2, policy, refuse)
        .await
        .unwrap();
    assert_eq!((first.published, first.failed), (0, 2));
    let second = dead_letters::publish_pending(&pool, DLQ, 2, policy, refuse)
        .await
        .unwrap();
    assert_eq!(
        (second.published, second.failed),
        (2, 0),
        "the newer letters go before the ones that failed"
    );
    let (published, failing, attempts) = publish_state(&db).await;
    assert_eq!((published, failing, attempts), (2, 2, 2));
    // Refused together, the two are not retried together: each wait is drawn under the
    // ceiling (full jitter).
    let due: Vec<f64> = db
        .client()
        .await
        .query(
            "SELECT extract(epoch FROM publish_next_at - now())::float8 FROM dead_letters \
             WHERE publish_error IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(due.len(), 2);
    assert!(due.iter().all(|wait| *wait <= 60.0), "{due:?}");
    assert!((due[0] - due[1]).abs() > 0.001, "retried in step: {due:?}");
    // The two refused letters wait out their backoff: a round takes none of them meanwhile,
    // unless an operator asks now.
    let third = dead_letters::publish_pending(&pool, DLQ, 2, policy, refuse)
        .await
        .unwrap();
    assert_eq!(third, dead_letters::PublishRound::default());
    let now = dead_letters::PublishPolicy {
        ignore_backoff: true,
        ..policy
    };
    let fourth = dead_letters::publish_pending(&pool, DLQ, 2, now, refuse)
        .await
        .unwrap();
    assert_eq!((fourth.pending, fourth.failed), (2, 2));
}

/// A poison record for the app's topic (not JSON), on partition 0.
fn poison(n: usize) -> PlannedRecord {
    PlannedRecord {
        key: b"k".to_vec(),
        payload: Some(format!("not json, later {n}").into_bytes()),
        partition: Some(0),
        kind: RecordKind::Poison { reason: "not_json" },
    }
}

#[actix_rt::test]
async fn a_letter_that_always_fails_is_set_aside_with_its_reason_and_holds_back_no_other() {
    use history_service::domain::DecodeError;
    use history_service::store::dead_letters::{self, DeadLetter, DeadLetterRow};

    // Backoff from 400 ms up to 10 s: by the fifth failure a relay that backs off as a whole
    // sleeps 6.4 s.
    let mut app = TestApp::prepare(|o| {
        o.env("HISTORY__DEAD_LETTER__TOPIC", DLQ)
            .env("HISTORY__PIPELINE__RETRY_INITIAL_MS", "400")
            .env("HISTORY__PIPELINE__RETRY_MAX_MS", "10000");
    })
    .await;
    app.broker().create_topic(DLQ, 1).unwrap();
    // Over the producer's message.max.bytes (1,000,000): refused every time.
    let big = DeadLetter::new(&DecodeError::NullPayload, Some(b"big".to_vec()), None, None);
    let big = DeadLetter {
        payload: Some(vec![b'x'; 2_000_000]),
        ..big
    };
    let row = DeadLetterRow {
        topic: TOPIC,
        partition: 0,
        offset: 0,
        letter: &big,
    };
    let pool = app.db.pool(1);
    dead_letters::insert(&pool, std::slice::from_ref(&row))
        .await
        .unwrap();
    dead_letters::request_publication(&pool, std::slice::from_ref(&row), DLQ)
        .await
        .unwrap();
    app.start();

    let attempts = || async {
        let row = app
            .db
            .client()
            .await
            .query_one(
                "SELECT publish_attempts, publish_error, publish_next_at > now() \
                 FROM dead_letters WHERE topic = $1",
                &[&TOPIC],
            )
            .await
            .unwrap();
        (
            row.get::<_, i32>(0),
            row.get::<_, Option<String>>(1),
            row.get::<_, Option<bool>>(2),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while attempts().await.0 < 5 {
        assert!(
            Instant::now() < deadline,
            "{:?}\n{}",
            attempts().await,
            app.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, reason, waiting) = attempts().await;
    let reason = reason.expect("the reason is kept");
    assert!(reason.contains("MessageSizeTooLarge"), "{reason}");
    assert_eq!(waiting, Some(true), "set aside until its backoff is over");

    // New letters are published at once, although the big one fails every time.
    let records: Vec<PlannedRecord> = (0..3).map(poison).collect();
    app.produce(&records).await;
    let produced = Instant::now();
    let published = || async {
        let row = app
            .db
            .client()
            .await
            .query_one(
                "SELECT count(published_at) FROM dead_letters WHERE topic = $1",
                &[&app.topic],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    while published().await < 3 {
        assert!(
            produced.elapsed() < Duration::from_secs(3),
            "the new letters wait for the one that fails:\n{}",
            app.logs()
        );
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    let took = produced.elapsed();
    eprintln!(
        "new letters published {took:?} after they were produced, beside a letter that failed 5 times"
    );
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

#[actix_rt::test]
async fn the_relay_holds_no_transaction_while_it_waits_on_the_broker() {
    use history_service::domain::DecodeError;
    use history_service::store::dead_letters::{self, DeadLetter, DeadLetterRow};

    let mut app = TestApp::prepare(|o| {
        o.env("HISTORY__DEAD_LETTER__TOPIC", DLQ);
    })
    .await;
    app.broker().create_topic(DLQ, 1).unwrap();
    let letter = DeadLetter::new(&DecodeError::NullPayload, Some(b"k".to_vec()), None, None);
    let rows: Vec<DeadLetterRow<'_>> = (0..3)
        .map(|offset| DeadLetterRow {
            topic: TOPIC,
            partition: 0,
            offset,
            letter: &letter,
        })
        .collect();
    let pool = app.db.pool(1);
    dead_letters::insert(&pool, &rows).await.unwrap();
    dead_letters::request_publication(&pool, &rows, DLQ)
        .await
        .unwrap();
    // The broker is down: the relay's deliveries wait (up to message.timeout.ms, 30 s).
    app.broker().cluster().broker_down(1).unwrap();
    app.start();

    let client = app.db.client().await;
    let state = || async {
        let row = client
            .query_one(
                "SELECT (SELECT count(*) FROM dead_letters \
                         WHERE publish_claimed_until > now() AND published_at IS NULL), \
                        (SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                         AND state LIKE 'idle in transaction%')",
                &[&app.db.name],
            )
            .await
            .unwrap();
        (row.get::<_, i64>(0), row.get::<_, i64>(1))
    };
    // The claim is committed (visible from here) before the relay waits on the broker.
    let deadline = Instant::now() + Duration::from_secs(20);
    while state().await.0 < 3 {
        assert!(Instant::now() < deadline, "not claimed:\n{}", app.logs());
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
    // While the deliveries wait, no session of the service sits inside a transaction.
    let watched = Instant::now();
    let mut samples = 0;
    while watched.elapsed() < Duration::from_secs(2) {
        let (claimed, in_transaction) = state().await;
        assert_eq!(
            claimed, 3,
            "the deliveries ended while watched: nothing was tested"
        );
        assert_eq!(
            in_transaction, 0,
            "a transaction is open across the broker call"
        );
        samples += 1;
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("{samples} samples of pg_stat_activity while the relay waited on the broker");

    // The broker is back: the waiting deliveries complete and are recorded.
    app.broker().cluster().broker_up(1).unwrap();
    let deadline = Instant::now() + Duration::from_secs(40);
    while publish_state(&app.db).await.0 < 3 {
        assert!(Instant::now() < deadline, "not published:\n{}", app.logs());
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(app.stop(), Some(0), "{}", app.logs());
}

/// Seconds of a replay's `--timeout` in the test of a broker that is down.
const REPLAY_TIMEOUT_S: u64 = 3;

#[actix_rt::test]
async fn a_replay_with_the_broker_down_ends_by_its_timeout_marks_nothing_and_says_so_in_a_few_lines()
 {
    use history_service::domain::DecodeError;
    use history_service::store::dead_letters::{self, DeadLetter, DeadLetterRow};

    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 1).unwrap();
    let brokers = broker.bootstrap_servers();
    let letter = DeadLetter::new(&DecodeError::NullPayload, Some(b"k".to_vec()), None, None);
    let rows: Vec<DeadLetterRow<'_>> = (0..5)
        .map(|offset| DeadLetterRow {
            topic: TOPIC,
            partition: 0,
            offset,
            letter: &letter,
        })
        .collect();
    dead_letters::insert(&db.pool(1), &rows).await.unwrap();
    let replayed = || async {
        let row = db
            .client()
            .await
            .query_one("SELECT count(replayed_at) FROM dead_letters", &[])
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };

    broker.cluster().broker_down(1).unwrap();
    let timeout = REPLAY_TIMEOUT_S.to_string();
    let args = ["dead-letters", "replay", "--all", "--timeout", &timeout];
    let started = Instant::now();
    let (code, out) = operator(&db, &brokers, &args);
    let took = started.elapsed();
    let errors = out.lines().filter(|line| line.contains(" ERROR ")).count();
    let warnings = out.lines().filter(|line| line.contains(" WARN ")).count();
    eprintln!(
        "replay with the broker down: exit {code:?} after {took:?}, {errors} ERROR and {warnings} WARN lines"
    );
    assert_eq!(code, Some(2), "{out}");
    assert!(
        took < Duration::from_secs(REPLAY_TIMEOUT_S + 2),
        "took {took:?}:\n{out}"
    );
    assert!(
        out.contains("5 of 5 dead letters not replayed")
            && out.contains("within the replay's timeout"),
        "{out}"
    );
    // librdkafka's reports of the broker it cannot reach (about 10 a second, each once to the
    // error callback and again to its log) go through the rate-limited log: each kind's first
    // line and one summary.
    assert!(errors + warnings <= 10, "{out}");
    assert!(
        out.contains("kafka client error AllBrokersDown repeated"),
        "the repeats are summarised:\n{out}"
    );
    assert_eq!(
        replayed().await,
        0,
        "nothing was delivered, so nothing is marked"
    );

    // With the broker back, the same command replays and marks every one.
    broker.cluster().broker_up(1).unwrap();
    let (code, out) = operator(&db, &brokers, &["dead-letters", "replay", "--all"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("replayed 5 dead letters"), "{out}");
    assert_eq!(replayed().await, 5);
}
