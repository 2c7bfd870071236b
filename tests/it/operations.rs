//! Running it in production: poison records, the dead-letter table and topic, metrics,
//! readiness across a database outage, Kafka security settings and secrets.

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::{Duration, Instant};

use history_devkit::broker::EmbeddedBroker;
use history_devkit::workload::{self, RecordKind, WorkloadSpec, distinct_events};
use history_service::kafka::dead_letter_topic as dlq;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::common::{
    Child, TOPIC, TestDb, free_port, produce, service_env, test_settings, topic_ends as ends,
    wait_committed,
};
use history_devkit::probe::get as http_get;

fn spec(records: usize, poison: f64, prefix: &str, seed: u64) -> WorkloadSpec {
    WorkloadSpec {
        records,
        duplicates: 0.1,
        poison,
        partitions: 3,
        id_prefix: prefix.into(),
        tickets: 40,
        max_payload_bytes: 65536,
        seed,
    }
}

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

fn cli(db: &TestDb, brokers: &str, args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .args(args)
        .env("HISTORY__DATABASE__URL", db.url())
        .env("HISTORY__KAFKA__BROKERS", brokers)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code().unwrap_or(-1), text)
}

#[actix_rt::test]
async fn poison_of_every_kind_is_dead_lettered_once_and_the_partitions_keep_flowing() {
    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 3).unwrap();
    broker.create_topic("history.dlq", 1).unwrap();
    let brokers = broker.bootstrap_servers();

    let first = workload::generate(&spec(800, 0.05, "poison-a", 3));
    let kinds: HashSet<&str> = first
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
    let delivered = produce(&brokers, &first).await;
    let ends_first = ends(&brokers, 3).await;
    let poison_partitions: HashSet<i32> = first
        .iter()
        .zip(&delivered)
        .filter(|(r, _)| matches!(r.kind, RecordKind::Poison { .. }))
        .map(|(_, d)| d.partition)
        .collect();
    assert!(poison_partitions.len() > 1, "poison on several partitions");

    let second = workload::generate(&WorkloadSpec {
        poison: 0.0,
        ..spec(200, 0.0, "poison-b", 4)
    });
    let mut settings = test_settings(&db.url(), &brokers, "history-poison", TOPIC);
    settings.dead_letter.topic = "history.dlq".into();
    let shutdown = {
        let (brokers, second) = (brokers.clone(), second.clone());
        let ends_first = ends_first.clone();
        async move {
            wait_committed(
                &brokers,
                "history-poison",
                &ends_first,
                Duration::from_secs(60),
            )
            .await;
            // Still consuming after the poison: more records are recorded and committed.
            produce(&brokers, &second).await;
            let ends_second = ends(&brokers, 3).await;
            wait_committed(
                &brokers,
                "history-poison",
                &ends_second,
                Duration::from_secs(60),
            )
            .await;
        }
    };
    let report = history_service::app::run(&settings, shutdown)
        .await
        .unwrap();

    let expected_rows = distinct_events(&first) + distinct_events(&second);
    assert_eq!(db.count("history_events").await, expected_rows as i64);
    let client = db.client().await;
    let stored: HashMap<(i32, i64), String> = client
        .query(
            "SELECT partition, \"offset\", reason_code FROM dead_letters WHERE topic = $1",
            &[&TOPIC],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| ((row.get(0), row.get(1)), row.get(2)))
        .collect();
    let expected: HashMap<(i32, i64), String> = first
        .iter()
        .zip(&delivered)
        .filter_map(|(r, d)| match r.kind {
            RecordKind::Poison { reason } => Some(((d.partition, d.offset), reason.to_owned())),
            _ => None,
        })
        .collect();
    assert_eq!(
        stored, expected,
        "one dead letter per poison record, with its reason"
    );
    assert_eq!(report.stats.dead_lettered as usize, expected.len());

    // The dead-letter topic got each one, with headers naming where it came from.
    let published = tokio::task::spawn_blocking({
        let brokers = brokers.clone();
        let n = expected.len();
        move || read_topic(&brokers, "history.dlq", n)
    })
    .await
    .unwrap();
    assert_eq!(published.len(), expected.len());
    for (_, headers) in &published {
        let coordinates = (
            headers[dlq::HEADER_PARTITION].parse::<i32>().unwrap(),
            headers[dlq::HEADER_OFFSET].parse::<i64>().unwrap(),
        );
        assert_eq!(headers[dlq::HEADER_TOPIC], TOPIC);
        assert_eq!(headers[dlq::HEADER_REASON_CODE], expected[&coordinates]);
        assert!(!headers[dlq::HEADER_REASON].is_empty());
    }

    // A second group reads everything again: nothing new is stored or published.
    let rerun = test_settings(&db.url(), &brokers, "history-poison-again", TOPIC);
    let mut rerun = rerun;
    rerun.dead_letter.topic = "history.dlq".into();
    let all_ends = ends(&brokers, 3).await;
    let shutdown = {
        let brokers = brokers.clone();
        async move {
            wait_committed(
                &brokers,
                "history-poison-again",
                &all_ends,
                Duration::from_secs(60),
            )
            .await;
        }
    };
    let again = history_service::app::run(&rerun, shutdown).await.unwrap();
    assert_eq!(again.stats.applied, 0);
    assert_eq!(again.stats.dead_lettered as usize, expected.len());
    assert_eq!(db.count("dead_letters").await, expected.len() as i64);
    assert_eq!(db.count("history_events").await, expected_rows as i64);
    let republished = tokio::task::spawn_blocking({
        let brokers = brokers.clone();
        let n = expected.len();
        move || read_topic(&brokers, "history.dlq", n)
    })
    .await
    .unwrap();
    assert_eq!(
        republished.len(),
        expected.len(),
        "no dead letter published twice"
    );

    // The operator's view: list, then replay the not-JSON ones to another topic.
    broker.create_topic("replayed", 1).unwrap();
    let (code, listing) = cli(&db, &brokers, &["dead-letters", "list", "--limit", "1000"]);
    assert_eq!(code, 0, "{listing}");
    assert!(
        listing.contains(&format!("{} shown", expected.len())),
        "{listing}"
    );
    assert!(listing.contains("not_json="), "{listing}");
    let not_json = expected.values().filter(|r| *r == "not_json").count();
    let (code, replay) = cli(
        &db,
        &brokers,
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
    let replayed = tokio::task::spawn_blocking({
        let brokers = brokers.clone();
        move || read_topic(&brokers, "replayed", not_json)
    })
    .await
    .unwrap();
    assert_eq!(replayed.len(), not_json);
    assert!(
        replayed
            .iter()
            .all(|(payload, _)| std::str::from_utf8(payload).is_ok())
    );
    let (_, after) = cli(
        &db,
        &brokers,
        &["dead-letters", "list", "--reason", "not_json"],
    );
    assert!(
        after.contains("0 shown"),
        "replayed letters are not listed again:\n{after}"
    );
    let (code, refused) = cli(&db, &brokers, &["dead-letters", "replay"]);
    assert_ne!(code, 0, "replaying everything needs --all: {refused}");
}

/// Parses a Prometheus text exposition into `series -> value`.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

fn sum_of(samples: &HashMap<String, f64>, family: &str) -> f64 {
    samples
        .iter()
        .filter(|(series, _)| series.starts_with(&format!("{family}{{")) || *series == family)
        .map(|(_, v)| v)
        .sum()
}

async fn get(port: u16, path: &'static str) -> (u16, String) {
    tokio::task::spawn_blocking(move || http_get(port, path).unwrap_or((0, String::new())))
        .await
        .unwrap()
}

/// Scrapes `/metrics` until `done` holds for its samples; returns that scrape's text.
async fn wait_for_metrics(
    port: u16,
    timeout: Duration,
    done: impl Fn(&HashMap<String, f64>) -> bool,
) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let (_, text) = get(port, "/metrics").await;
        if done(&samples(&text)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "the metrics never got there:\n{text}"
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for_status(port: u16, path: &'static str, status: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let (got, body) = get(port, path).await;
        if got == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path}: {got} {body}, want {status}"
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
}

#[actix_rt::test]
async fn metrics_count_the_outcomes_and_readiness_follows_a_database_outage() {
    let db = TestDb::migrated().await;
    let broker = EmbeddedBroker::start(1).unwrap();
    broker.create_topic(TOPIC, 3).unwrap();
    let brokers = broker.bootstrap_servers();
    let records = workload::generate(&spec(600, 0.02, "metrics", 9));
    produce(&brokers, &records).await;
    let first_ends = ends(&brokers, 3).await;

    let port = free_port();
    let mut env = service_env(&db.url(), &brokers, "history-metrics", TOPIC);
    env.extend(
        [
            ("HISTORY__HTTP__ENABLED", "true".to_owned()),
            ("HISTORY__HTTP__LISTEN", format!("127.0.0.1:{port}")),
            ("HISTORY__KAFKA__STATISTICS_INTERVAL_MS", "200".to_owned()),
            ("HISTORY__DATABASE__CONNECT_TIMEOUT_MS", "500".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let mut service = Child::spawn(&["run"], &env);
    wait_committed(
        &brokers,
        "history-metrics",
        &first_ends,
        Duration::from_secs(60),
    )
    .await;
    wait_for_status(port, "/healthz", 200, Duration::from_secs(5)).await;
    wait_for_status(port, "/readyz", 200, Duration::from_secs(5)).await;
    // The lag comes from librdkafka's statistics, every statistics interval: wait for the one
    // that reports every partition caught up.
    let text = wait_for_metrics(port, Duration::from_secs(10), |m| {
        (0..3).all(|partition| {
            m.get(&format!(
                "history_consumer_lag{{topic=\"{TOPIC}\",partition=\"{partition}\"}}"
            )) == Some(&0.0)
        })
    })
    .await;
    let m = samples(&text);
    let count =
        |kind: fn(&RecordKind) -> bool| records.iter().filter(|r| kind(&r.kind)).count() as f64;
    let events = count(|k| matches!(k, RecordKind::Event { .. }));
    let duplicates = count(|k| matches!(k, RecordKind::Duplicate { .. }));
    let poison = count(|k| matches!(k, RecordKind::Poison { .. }));
    assert_eq!(
        m["history_events_total{outcome=\"applied\"}"], events,
        "{text}"
    );
    assert_eq!(
        m["history_events_total{outcome=\"already_applied\"}"],
        duplicates
    );
    assert_eq!(m["history_events_total{outcome=\"dead_letter\"}"], poison);
    assert_eq!(sum_of(&m, "history_dead_letters_total"), poison);
    for (partition, end) in first_ends.iter().enumerate() {
        let series =
            format!("history_committed_offset{{topic=\"{TOPIC}\",partition=\"{partition}\"}}");
        assert_eq!(m.get(&series), Some(&(*end as f64)), "{series} in\n{text}");
        let lag = format!("history_consumer_lag{{topic=\"{TOPIC}\",partition=\"{partition}\"}}");
        assert_eq!(m.get(&lag), Some(&0.0), "{lag} in\n{text}");
        let in_flight = format!("history_in_flight{{topic=\"{TOPIC}\",partition=\"{partition}\"}}");
        assert_eq!(m.get(&in_flight), Some(&0.0), "{in_flight} in\n{text}");
    }
    assert!(m["history_transaction_seconds_count"] > 0.0);
    assert!(m["history_rebalances_total{kind=\"assign\"}"] >= 1.0);
    assert_eq!(m.get("history_assigned_partitions"), Some(&3.0));

    // The database goes away: readiness fails, writes are retried, nothing is committed.
    let admin = crate::common::admin_client().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS false",
            db.name
        ))
        .await
        .unwrap();
    db.terminate_backends().await;
    wait_for_status(port, "/readyz", 503, Duration::from_secs(15)).await;
    let more = workload::generate(&WorkloadSpec {
        poison: 0.0,
        ..spec(100, 0.0, "metrics-later", 10)
    });
    produce(&brokers, &more).await;
    let later_ends = ends(&brokers, 3).await;
    let text = wait_for_metrics(port, Duration::from_secs(15), |m| {
        m.get("history_retries_total") >= Some(&1.0)
            && m.get("history_events_total{outcome=\"unknown\"}") >= Some(&1.0)
    })
    .await;
    let m = samples(&text);
    assert!(m["history_retries_total"] >= 1.0, "{text}");
    assert!(m["history_events_total{outcome=\"unknown\"}"] >= 1.0);
    assert_eq!(
        sum_of(&m, "history_committed_offset"),
        first_ends.iter().sum::<i64>() as f64,
        "nothing committed during the outage"
    );
    assert_eq!(
        service.process.try_wait().unwrap(),
        None,
        "the outage does not crash it"
    );

    // It comes back: ready again, and the held records are written and committed.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS true",
            db.name
        ))
        .await
        .unwrap();
    wait_for_status(port, "/readyz", 200, Duration::from_secs(20)).await;
    wait_committed(
        &brokers,
        "history-metrics",
        &later_ends,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(
        db.count("history_events").await,
        (events + distinct_events(&more) as f64) as i64
    );
    // Only what an operator needs is served.
    assert_eq!(get(port, "/").await.0, 404);
    service.signal(libc::SIGTERM);
    assert_eq!(
        service.wait(Duration::from_secs(30)),
        Some(0),
        "{}",
        service.logs()
    );
}

#[test]
fn an_unknown_librdkafka_property_fails_at_start_up_naming_it() {
    let output = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .arg("run")
        .env("HISTORY__DATABASE__MIGRATE_ON_START", "false")
        .env("HISTORY__HTTP__ENABLED", "false")
        .env("HISTORY__KAFKA__PROPERTIES__BOGUS_SETTING", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("bogus.setting"), "{stderr}");
}

#[test]
fn an_unreadable_secret_file_fails_at_start_up_naming_its_key() {
    let output = Command::new(env!("CARGO_BIN_EXE_history-service"))
        .arg("run")
        .env(
            "HISTORY__KAFKA__PROPERTY_FILES__SASL_PASSWORD",
            "/nonexistent/secret",
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("kafka.property_files"), "{stderr}");
}

#[actix_rt::test]
async fn security_settings_pass_through_and_secrets_never_reach_the_logs() {
    let db = TestDb::migrated().await;
    let secret_dir =
        std::env::temp_dir().join(format!("history-secrets-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&secret_dir).unwrap();
    std::fs::write(secret_dir.join("kafka"), "k4fk4-s3cr3t\n").unwrap();
    std::fs::write(secret_dir.join("db"), "").unwrap();
    let mut env = service_env(&db.url(), "127.0.0.1:1", "history-sasl", TOPIC);
    env.extend(
        [
            ("RUST_LOG", "debug".to_owned()),
            (
                "HISTORY__KAFKA__PROPERTIES__SECURITY_PROTOCOL",
                "SASL_SSL".to_owned(),
            ),
            (
                "HISTORY__KAFKA__PROPERTIES__SASL_MECHANISMS",
                "SCRAM-SHA-512".to_owned(),
            ),
            (
                "HISTORY__KAFKA__PROPERTIES__SASL_USERNAME",
                "history".to_owned(),
            ),
            (
                "HISTORY__KAFKA__PROPERTY_FILES__SASL_PASSWORD",
                secret_dir.join("kafka").display().to_string(),
            ),
            ("HISTORY__DATABASE__PASSWORD", "pg-s3cr3t".to_owned()),
        ]
        .map(|(k, v)| (k.to_owned(), v)),
    );
    let mut service = Child::spawn(&["run"], &env);
    // The consumer accepts the settings (SASL over TLS is built in) and keeps trying to reach
    // the broker: its first failed attempt is logged; it does not exit with a configuration
    // error.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !service.logs().contains("kafka client error") {
        assert_eq!(
            service.process.try_wait().unwrap(),
            None,
            "{}",
            service.logs()
        );
        assert!(Instant::now() < deadline, "{}", service.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        service.process.try_wait().unwrap(),
        None,
        "{}",
        service.logs()
    );
    service.signal(libc::SIGTERM);
    service.wait(Duration::from_secs(30));
    let logs = service.logs();
    assert!(logs.contains("history-service starting"), "{logs}");
    assert!(
        !logs.contains("k4fk4-s3cr3t"),
        "the Kafka password leaked:\n{logs}"
    );
    assert!(
        !logs.contains("pg-s3cr3t"),
        "the database password leaked:\n{logs}"
    );
    let _ = std::fs::remove_dir_all(&secret_dir);
}

#[actix_rt::test]
async fn tls_is_used_when_the_url_requires_it_and_verified_against_a_ca_file() {
    use history_service::config::DatabaseSettings;
    use history_service::store::Database;
    use secrecy::SecretString;

    let db = TestDb::create().await;
    let admin = crate::common::admin_client().await;
    let ssl: String = admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
    assert_eq!(
        ssl, "on",
        "this test needs the local PostgreSQL to offer TLS (Debian's default)"
    );
    let cert: String = admin
        .query_one("SHOW ssl_cert_file", &[])
        .await
        .unwrap()
        .get(0);
    let settings = |host: &str, ca: &str| DatabaseSettings {
        url: SecretString::from(format!(
            "postgres://postgres@{host}:5432/{}?sslmode=require",
            db.name
        )),
        password: SecretString::from(String::new()),
        password_file: String::new(),
        tls_ca_file: ca.to_owned(),
        pool_size: 2,
        connect_timeout_ms: 3000,
        migrate_on_start: true,
    };
    let uses_tls = |client: tokio_postgres::Client| async move {
        let row = client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, bool>(0)
    };

    // sslmode=require: encrypted.
    let database = Database::from_settings(&settings("127.0.0.1", "")).unwrap();
    assert!(uses_tls(database.connect().await.unwrap()).await);
    // With the CA file, the certificate and the host name are checked: the server's
    // certificate names localhost, so 127.0.0.1 is refused and localhost accepted.
    let wrong_host = Database::from_settings(&settings("127.0.0.1", &cert)).unwrap();
    assert!(
        wrong_host.connect().await.is_err(),
        "verification must reject a host mismatch"
    );
    let verified = Database::from_settings(&settings("localhost", &cert)).unwrap();
    assert!(uses_tls(verified.connect().await.unwrap()).await);
    // The pool uses it too.
    let pool = verified.pool(2, Duration::from_secs(3));
    let conn = pool.get().await.unwrap();
    let row = conn
        .client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    drop(conn);
    // A CA file that cannot be read is a configuration error naming its key.
    let err = Database::from_settings(&settings("localhost", "/nonexistent/ca.pem"))
        .err()
        .expect("an unreadable CA file is refused");
    assert!(err.to_string().contains("database.tls_ca_file"), "{err}");
}
